//! The `authd` binary: parse the configuration, start logging, run the command.

use authd::{
    app::{self, Application},
    config::{self, Cli, Command},
};
use clap::{CommandFactory, FromArgMatches};
use std::process::ExitCode;

/// mimalloc instead of the C library's allocator: a Login allocates and frees some
/// 80 to 90 small buffers on the runtime's thread (frames, headers, tokens, rows),
/// which mimalloc's per-thread free lists serve for less than glibc's allocator
/// (docs/benchmarks.md).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    // Parsed in two steps to keep the matches: they tell where each value came from.
    let matches = Cli::command().get_matches();
    let cli = Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    if let Err(e) = authd::init_logging(&cli.config.telemetry.log, cli.config.telemetry.log_format)
    {
        eprintln!("authd: error: {e:#}");
        return ExitCode::FAILURE;
    }
    let exposed = config::secrets_on_command_line(&matches);
    if !exposed.is_empty() {
        let options: Vec<&str> = exposed.iter().map(|(flag, _)| *flag).collect();
        let instead: Vec<&str> = exposed.iter().map(|(_, instead)| *instead).collect();
        tracing::warn!(
            options = options.join(", "),
            instead = instead.join("; "),
            "secrets given on the command line are visible to every local user (ps, \
             /proc/PID/cmdline): set them through the environment or a file instead"
        );
    }
    let deprecated = cli.config.deprecated_options();
    if !deprecated.is_empty() {
        tracing::warn!(
            options = deprecated.join(", "),
            "these options no longer have any effect and will be removed: requests are \
             admitted when they can be answered before their deadline (AUTHD_MAX_WAIT \
             without one), and AUTHD_MAX_IN_FLIGHT bounds memory (see docs/operations.md)"
        );
    }
    // The workers answer AuthService requests below the priority of the thread that
    // answers probes (the health-only port's, started from this one), above hashing,
    // under the policy configured.
    let nice = cli.config.server.runtime_thread_nice;
    let policy = cli.config.server.runtime_thread_policy;
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .on_thread_start(move || authd::lower_with_policy(nice, policy, "runtime"))
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("authd: error: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(cli)) {
        Ok(code) => code,
        Err(e) => {
            // One line, with the chain of causes: "opening …: permission denied".
            eprintln!("authd: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

async fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    let mut config = cli.config;
    let done = match cli.command.unwrap_or(Command::Serve) {
        // Its own exit statuses (refused, usage, no answer) and its own error line.
        Command::Admin(command) => return Ok(authd::admin_command(&config, &command).await),
        Command::Migrate {
            status,
            check_rollback,
        } => {
            config.read_secret_files()?;
            if let Some(version) = check_rollback {
                let verdict = app::check_rollback(&config, &version).await?;
                println!("{}", verdict.reason);
                return Ok(if verdict.safe {
                    ExitCode::SUCCESS
                } else {
                    ExitCode::FAILURE
                });
            }
            if status {
                print!("{}", app::schema(&config).await?);
                return Ok(ExitCode::SUCCESS);
            }
            app::migrate(&config).await?;
            tracing::info!(database = %config.store.database_url, "migrations applied");
            Ok(())
        }
        Command::HashBench {
            iterations,
            threads,
            duration,
            batch,
            compare,
            target,
            json,
        } => {
            use authd::hash_bench as bench;
            let batch = batch.map(|b| b as usize);
            let options = config
                .passwords
                .bench_options(iterations, threads, duration, batch, compare)?
                .with_target(target);
            bench::run_command(config.passwords.engine()?, options, json)
        }
        Command::Health {
            addr,
            service,
            timeout,
            tls_ca,
            tls_cert,
            tls_key,
            tls_server_name,
        } => {
            let tls = authd::ClientTls {
                ca: tls_ca,
                cert: tls_cert,
                key: tls_key,
                server_name: tls_server_name,
            };
            authd::health_check::run(&config, addr.as_deref(), &service, timeout, &tls).await
        }
        Command::Keygen { alg, kid } => {
            let kid = kid.unwrap_or_else(new_kid);
            let entry = authd::generate_key_entry(alg.algorithm(), &kid)?;
            // stdout only: the entry is a private key, and never goes to the log.
            println!("{entry}");
            Ok(())
        }
        Command::Serve => {
            config.read_secret_files()?;
            // The handlers are in place before anything is served: a SIGTERM that
            // comes while the app starts (a pod stopped early) ends it gracefully
            // once started, instead of killing it by the signal's default action.
            let stop = shutdown_signal();
            let app = Application::build(config).await?;
            app.run_until_stopped(stop).await
        }
    };
    done.map(|()| ExitCode::SUCCESS)
}

/// A kid for a new key: today's date and 8 random hex digits (`20260301-1a2b3c4d`),
/// so that kids sort by age and never collide.
fn new_kid() -> String {
    // Real time: the date in a new key's name, for the operator.
    let today = humantime::format_rfc3339(std::time::SystemTime::now()).to_string();
    format!(
        "{}-{:08x}",
        today[..10].replace('-', ""),
        rand::random::<u32>()
    )
}

/// Installs the handlers now, and resolves on SIGTERM or SIGINT. Kubernetes stops a
/// pod with SIGTERM; a person at a terminal presses Ctrl-C: both start the same
/// graceful shutdown.
fn shutdown_signal() -> impl std::future::Future<Output = ()> {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        let handlers = (
            signal(SignalKind::terminate()),
            signal(SignalKind::interrupt()),
        );
        async move {
            match handlers {
                (Ok(mut term), Ok(mut int)) => {
                    tokio::select! {
                        _ = term.recv() => tracing::info!("SIGTERM received"),
                        _ = int.recv() => tracing::info!("SIGINT received"),
                    }
                }
                _ => {
                    tracing::warn!("cannot install signal handlers; stopping only on Ctrl-C");
                    let _ = tokio::signal::ctrl_c().await;
                }
            }
        }
    }
    #[cfg(not(unix))]
    {
        async {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}
