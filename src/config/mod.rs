//! The one configuration of authd: every option is a flag and an `AUTHD_*`
//! environment variable, with its default shown by `authd --help`. The exception:
//! the trace exporter's settings are OpenTelemetry's standard `OTEL_*` variables
//! (`OTEL_EXPORTER_OTLP_ENDPOINT`, `OTEL_SERVICE_NAME`, `OTEL_TRACES_SAMPLER`,
//! `OTEL_TRACES_SAMPLER_ARG`), which collectors' docs and operators expect.
//!
//! This file owns the command line ([`Cli`], its subcommands) and [`Config`], made of
//! one group of options per component, each in a file of its own that declares the
//! options, parses and checks them, and builds the settings its component takes
//! (`config.store.settings()`, `config.passwords.hasher(…)`, `config.tls.files()`):
//! the wiring in `app/` never translates a field, and an option is added in one
//! group file (and in docs/configuration.md).
//!
//! - `server`: the listeners (gRPC, health), the bounds of every connection, the
//!   drain, the runtime's priority.
//! - `tls`: the gRPC port's certificate, mutual TLS and its allow-list.
//! - `store`: the database URL ([`DatabaseUrl`]), its pools and timeouts.
//! - `passwords`: the hash policy (PBKDF2 cost, or Argon2id and its memory budget),
//!   the hashing threads and their queue, the blocklist.
//! - `overload`: the in-flight caps and the pushback of refused requests.
//! - `tokens`: the token keys, lifetimes, audience and revocation, the account
//!   digest key.
//! - `limits`: Redis, the rate limits and the login throttle.
//! - `telemetry`: logs, metrics and traces.
//! - `admin`: the admin API's listener, its keys file and its rate limit.
//! - `authz`: external authorization: the forward-auth listener, the identity
//!   headers' prefix, the `authorization` header, the challenge's realm.
//! - `second_factor`: the data keys that seal TOTP secrets, the TOTP issuer, the
//!   lifetime of Login's challenges.
//! - `import`: the caps on the cost of imported password hashes.
//! - `events`: account events' retention and streams, webhooks and their secret, the
//!   password reset token's lifetime.
//! - `oidc`: the public issuer URL and the introspection clients of the standard
//!   endpoints.
//! - `admin_command`: the command line of `authd admin`, the admin API's client: its
//!   subcommands, its connection's options, the admin key it reads from `--key-file`
//!   or `AUTHD_ADMIN_KEY` (never from an argument).
//! - `parse`: the value parsers and the secret-file reading the groups share.
//!
//! Values are parsed and checked here, so a bad value stops the start with one
//! clear line. Secrets (the database and Redis URLs, the token keys, the account
//! digest key) are never printed: `--help` hides their environment values, a bad
//! value's error names the option but not the value (`secret::parser`), `Display`
//! and `Debug` redact them, and each can be read from a file (`*_FILE`) so that it
//! shows in neither `ps` nor the environment. [`secrets_on_command_line`] finds those given as flags anyway.
//!
//! Every option carries an explicit `display_order`: `--help` lists the options of
//! every group as one list, in the order it always had, and a subcommand's help
//! interleaves its own options with these by that number, so the numbers themselves
//! are part of the output. A new option takes the next free number.
//!
//! Only the modules around the request path (`app`, `main.rs`, `health::check`,
//! `admin_client`, `telemetry`) import this one; a component takes its built
//! settings, never a group or the `Config`.

mod admin;
mod admin_command;
mod authz;
mod events;
mod import;
mod limits;
mod oidc;
mod overload;
mod parse;
mod passwords;
mod second_factor;
mod server;
mod store;
mod telemetry;
mod tls;
mod tokens;

/// The role of an admin credential (`--admin-allow`, the admin keys file).
pub use crate::handlers::admin::Role as AdminRole;
pub use admin::AdminConfig;
pub use admin_command::{
    AdminAction, AdminCommand, AdminConnection, EventsAction, OnConflictArg, ServiceAccountArg,
    ServiceAccountsAction, SessionsAction, UserArg, UsersAction,
};
pub use authz::AuthzConfig;
pub use events::EventsConfig;
pub use import::ImportConfig;
pub use limits::LimitsConfig;
pub use oidc::OidcConfig;
pub use overload::OverloadConfig;
pub use parse::MetricsListen;
pub use passwords::{HashAlgorithm, HashBackend, HashKernels, PasswordConfig, Switch};
pub use second_factor::SecondFactorConfig;
pub use server::ServerConfig;
pub use store::{DatabaseUrl, StoreConfig};
pub use telemetry::{LogFormat, TelemetryConfig};
pub use tls::TlsConfig;
pub use tokens::{KeyAlgorithm, TokenConfig};

use crate::{
    clock::{Clock, ManualClock, SystemClock},
    secret::RedisUrl,
};
use clap::{ArgMatches, Args, Parser, Subcommand, parser::ValueSource};
use parse::positive_duration;
use std::{path::PathBuf, sync::Arc, time::Duration};

/// authd: a gRPC authentication service (Register, Login, ValidateToken).
///
/// Serves auth.v1.AuthService, grpc.health.v1.Health and server reflection on one
/// port. Every option can also be set with the environment variable shown.
#[derive(Debug, Clone, Parser)]
#[command(name = "authd", version, about, long_about, max_term_width = 100)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Option<Command>,

    #[command(flatten)]
    pub config: Config,
}

#[derive(Debug, Clone, Subcommand)]
pub enum Command {
    /// Serve gRPC until SIGTERM or SIGINT (the default when no command is given).
    Serve,
    /// Create or upgrade the database schema, then exit. With --status or
    /// --check-rollback it reads the schema and changes nothing.
    Migrate {
        /// Print the schema's state: the migrations applied, the level a release must
        /// know to run on it, and which releases do.
        #[arg(long, conflicts_with = "check_rollback")]
        status: bool,
        /// Whether authd VERSION (e.g. 0.1.0) can run on this database's schema, for a
        /// rollback to it: prints the answer and its reason; exit status 1 when it
        /// cannot, or when users have imported hashes it cannot verify (their count).
        #[arg(long, value_name = "VERSION")]
        check_rollback: Option<String>,
    },
    /// Measure this machine's PBKDF2 rate with the server's hashing code, then exit:
    /// hashes/s per thread and in total, the hash-bound limit of logins and registrations.
    HashBench {
        /// PBKDF2 iterations per hash [default: --pbkdf2-iterations].
        #[arg(long, value_parser = clap::value_parser!(u32).range(1000..))]
        iterations: Option<u32>,
        /// Threads hashing at once [default: --hash-threads].
        #[arg(long, value_parser = clap::value_parser!(u32).range(1..=1024))]
        threads: Option<u32>,
        /// How long each thread hashes (e.g. 3s, 10s).
        #[arg(long, default_value = "3s", value_parser = positive_duration)]
        duration: Duration,
        /// Hashes per batch [default: the engine's lanes, as under load; 1 is the rate
        /// of requests that come one at a time].
        #[arg(long, value_parser = clap::value_parser!(u32).range(1..=64))]
        batch: Option<u32>,
        /// Also measure the pbkdf2 crate (one hash at a time), in the same run.
        #[arg(long)]
        compare: bool,
        /// Recommend the highest PBKDF2 iteration count whose hash, for one login on
        /// an idle server, takes at most this long here (e.g. 250ms): measured one
        /// hash at a time on one thread, at --iterations.
        #[arg(long, value_parser = positive_duration, conflicts_with_all = ["threads", "batch"])]
        target: Option<Duration>,
        /// Print the result as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Ask a running authd for its grpc.health.v1 status, then exit: 0 when SERVING,
    /// 1 with one line saying why otherwise (NOT_SERVING, SERVICE_UNKNOWN, unreachable,
    /// timeout). For container healthchecks and exec probes.
    Health {
        /// The server, HOST:PORT [default: loopback on the port of --health-listen, or of
        /// --listen when the health port is off].
        #[arg(long)]
        addr: Option<String>,
        /// The service to ask about: empty (the whole server) or auth.v1.AuthService
        /// for readiness (NOT_SERVING while the database does not answer); liveness
        /// for liveness (SERVING as long as the process serves, whatever the database).
        #[arg(long, default_value = "")]
        service: String,
        /// Longest the check may take, connecting included.
        #[arg(long, default_value = "2s", value_parser = positive_duration)]
        timeout: Duration,
        /// Speak TLS, trusting the CAs of this PEM bundle (the gRPC port with
        /// AUTHD_TLS_CERT; the health-only port is always plaintext) [default with
        /// an https:// address: the Mozilla roots].
        #[arg(long = "tls-ca")]
        tls_ca: Option<PathBuf>,
        /// PEM certificate to present to a server with mutual TLS (AUTHD_TLS_CLIENT_CA).
        #[arg(long = "tls-cert", id = "health_tls_cert", requires = "health_tls_key")]
        tls_cert: Option<PathBuf>,
        /// PEM private key of --tls-cert.
        #[arg(long = "tls-key", id = "health_tls_key", requires = "health_tls_cert")]
        tls_key: Option<PathBuf>,
        /// The name the server's certificate must carry [default: the host of --addr].
        #[arg(long = "tls-server-name")]
        tls_server_name: Option<String>,
    },
    /// Call the admin API of a running authd (AUTHD_ADMIN_LISTEN; docs/admin.md), then
    /// exit: list, show, disable, enable and delete users, list and end their sessions,
    /// set a password. The admin key comes from --key-file or AUTHD_ADMIN_KEY, never
    /// from an argument.
    Admin(AdminCommand),
    /// Print a new token key on stdout as one AUTHD_TOKEN_KEYS entry (KID:ALG:BASE64),
    /// then exit: append it to the key file (second, to roll it out; first, to sign
    /// with it). The output is a private key: keep it out of logs and terminals' history.
    Keygen {
        /// ed25519: tokens anyone can verify from the JWKS document, only authd can sign
        /// (choose it whenever other services verify tokens); hs256: a shared secret
        /// that verifies and signs alike.
        #[arg(long, value_enum, default_value = "ed25519")]
        alg: KeyAlgorithm,
        /// The key's id, 1 to 64 characters of A-Z a-z 0-9 . _ - [default: the date
        /// and 8 random hex digits, e.g. 20260301-1a2b3c4d].
        #[arg(long)]
        kid: Option<String>,
    },
}

/// Every option of authd, one group per component.
#[derive(Debug, Clone, Args)]
pub struct Config {
    #[command(flatten)]
    pub server: ServerConfig,
    #[command(flatten)]
    pub tls: TlsConfig,
    #[command(flatten)]
    pub store: StoreConfig,
    #[command(flatten)]
    pub passwords: PasswordConfig,
    #[command(flatten)]
    pub overload: OverloadConfig,
    #[command(flatten)]
    pub tokens: TokenConfig,
    #[command(flatten)]
    pub limits: LimitsConfig,
    #[command(flatten)]
    pub telemetry: TelemetryConfig,
    #[command(flatten)]
    pub admin: AdminConfig,
    #[command(flatten)]
    pub second_factor: SecondFactorConfig,
    #[command(flatten)]
    pub authz: AuthzConfig,
    #[command(flatten)]
    pub import: ImportConfig,
    #[command(flatten)]
    pub oidc: OidcConfig,
    #[command(flatten)]
    pub events: EventsConfig,

    /// Tests only: the one clock every component reads (none: the machine's).
    #[arg(skip)]
    pub clock: Option<Arc<ManualClock>>,
}

impl Config {
    /// The defaults, as `authd` with no flags would use them (ignoring the environment).
    /// The clock the application hands to every component that reads the time.
    pub(crate) fn clock(&self) -> Arc<dyn Clock> {
        match &self.clock {
            Some(clock) => clock.clone(),
            None => Arc::new(SystemClock),
        }
    }

    pub fn defaults() -> Self {
        let mut cli = Cli::command_for_defaults();
        cli.config.tokens.token_keys = None;
        cli.config
    }

    /// Reads the secrets named by `--database-url-file`, `--redis-url-file`,
    /// `--data-keys-file` and `--account-digest-key-file` into their options; `main` calls it before serving
    /// or migrating.
    /// An error names the option and the file, never what the file holds.
    pub fn read_secret_files(&mut self) -> anyhow::Result<()> {
        self.store.read_secret_file()?;
        self.limits.read_secret_file()?;
        self.second_factor.read_secret_file()?;
        self.events.read_secret_file()?;
        self.tokens.read_secret_file()
    }

    /// The options given that no longer do anything, by flag: accepted so that a
    /// configuration written for an earlier release still starts; `main` warns of
    /// each.
    pub fn deprecated_options(&self) -> Vec<&'static str> {
        [
            ("--hash-queue", self.passwords.hash_queue.is_some()),
            (
                "--hash-queue-wait",
                self.passwords.hash_queue_wait.is_some(),
            ),
            ("--in-flight-wait", self.overload.in_flight_wait.is_some()),
        ]
        .into_iter()
        .filter_map(|(flag, given)| given.then_some(flag))
        .collect()
    }
}

/// The secret-bearing options given as flags on this command line, which every local
/// user can read (`ps`, `/proc/PID/cmdline`), each with the forms that keep it out
/// of sight. A database URL counts only when it holds a password.
pub fn secrets_on_command_line(matches: &ArgMatches) -> Vec<(&'static str, &'static str)> {
    let on_command_line = |id: &str| matches.value_source(id) == Some(ValueSource::CommandLine);
    let mut found = Vec::new();
    if on_command_line("database_url")
        && matches
            .get_one::<DatabaseUrl>("database_url")
            .is_some_and(DatabaseUrl::has_secret)
    {
        found.push((
            "--database-url",
            "AUTHD_DATABASE_URL or --database-url-file",
        ));
    }
    if on_command_line("redis_url")
        && matches
            .get_one::<RedisUrl>("redis_url")
            .is_some_and(RedisUrl::has_secret)
    {
        found.push(("--redis-url", "AUTHD_REDIS_URL or --redis-url-file"));
    }
    if on_command_line("token_keys") {
        found.push(("--token-keys", "AUTHD_TOKEN_KEYS or --token-keys-file"));
    }
    if on_command_line("data_keys") {
        found.push(("--data-keys", "AUTHD_DATA_KEYS or --data-keys-file"));
    }
    if on_command_line("webhook_secret") {
        found.push((
            "--webhook-secret",
            "AUTHD_WEBHOOK_SECRET or --webhook-secret-file",
        ));
    }
    if on_command_line("account_digest_key") {
        found.push((
            "--account-digest-key",
            "AUTHD_ACCOUNT_DIGEST_KEY or --account-digest-key-file",
        ));
    }
    found
}

impl Cli {
    fn command_for_defaults() -> Self {
        use clap::{CommandFactory, FromArgMatches};
        // Parse an empty command line with environment lookups turned off.
        let mut command = Cli::command();
        command = command.mut_args(|a| a.env(None::<&str>));
        let matches = command
            .try_get_matches_from(["authd"])
            .expect("the defaults parse");
        Cli::from_arg_matches(&matches).expect("the defaults parse")
    }

    /// The configuration `args` (after the program's name) give, with environment
    /// lookups turned off; the error is clap's message.
    #[cfg(test)]
    pub(crate) fn parse_for_test(args: &[&str]) -> Result<Self, String> {
        use clap::FromArgMatches;
        matches(args).map(|m| Cli::from_arg_matches(&m).expect("the matches parse"))
    }
}

/// The matches of `args` (after the program's name), with environment lookups
/// turned off; the error is clap's message.
#[cfg(test)]
pub(crate) fn matches(args: &[&str]) -> Result<ArgMatches, String> {
    use clap::CommandFactory;
    Cli::command()
        .mut_args(|a| a.env(None::<&str>))
        .try_get_matches_from(std::iter::once("authd").chain(args.iter().copied()))
        .map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;
    use std::time::Duration;

    #[test]
    fn the_command_line_is_well_formed() {
        Cli::command().debug_assert();
    }

    #[test]
    fn every_option_has_a_place_of_its_own_in_the_help() {
        let command = Cli::command();
        let mut places: Vec<_> = command
            .get_arguments()
            .map(|a| (a.get_display_order(), a.get_id().as_str()))
            .collect();
        places.sort();
        for pair in places.windows(2) {
            assert_ne!(pair[0].0, pair[1].0, "{pair:?} share a display_order");
        }
        assert_eq!(places.first().map(|p| p.1), Some("listen"));
    }

    #[test]
    fn defaults_match_the_documentation() {
        let c = Config::defaults();
        assert_eq!(c.server.listen, "0.0.0.0:50051".parse().unwrap());
        assert_eq!(c.store.database_url, DatabaseUrl::Sqlite("authd.db".into()));
        assert_eq!(c.passwords.pbkdf2_iterations, 600_000);
        assert_eq!(c.tokens.token_ttl, Duration::from_secs(15 * 60));
        assert_eq!(c.tokens.refresh_ttl, Duration::from_secs(30 * 24 * 3600));
        assert_eq!(c.tokens.revocation_delay, Duration::from_secs(1));
        assert_eq!(c.telemetry.log_format, LogFormat::Text);
        assert_eq!(c.store.db_statement_timeout, Duration::from_secs(2));
        assert_eq!(c.overload.max_wait, Duration::from_secs(5));
        assert_eq!(c.overload.max_in_flight, 8192);
        assert!(c.deprecated_options().is_empty());
        assert_eq!(c.tokens.token_clock_skew, crate::token::DEFAULT_CLOCK_SKEW);
        assert_eq!(c.tokens.token_keys_reload, Duration::from_secs(10));
        assert!(c.tokens.token_audience.is_empty());
        assert_eq!(c.server.runtime_thread_nice, 5);
        assert_eq!(
            c.server.runtime_thread_policy,
            crate::priority::Policy::Normal
        );
        assert_eq!(
            c.telemetry.metrics_listen,
            MetricsListen(Some("0.0.0.0:9090".parse().unwrap()))
        );
    }

    #[test]
    fn options_that_no_longer_do_anything_are_accepted_and_named() {
        let cli =
            Cli::parse_for_test(&["--hash-queue", "300", "--in-flight-wait", "75ms"]).unwrap();
        assert_eq!(
            cli.config.deprecated_options(),
            ["--hash-queue", "--in-flight-wait"]
        );
    }

    #[test]
    fn secrets_given_as_flags_are_found_wherever_they_stand() {
        const KEY: &str = "k:MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY=";
        let found = |args: &[&str]| -> Vec<&'static str> {
            secrets_on_command_line(&matches(args).unwrap())
                .into_iter()
                .map(|(flag, _)| flag)
                .collect()
        };
        assert!(found(&[]).is_empty());
        assert!(found(&["--database-url", "sqlite://x.db"]).is_empty());
        assert!(found(&["--database-url", "postgres://u@db/x"]).is_empty());
        assert!(found(&["--redis-url", "redis://cache"]).is_empty());
        assert_eq!(
            found(&["--database-url", "postgres://u:p@db/x", "--token-keys", KEY]),
            ["--database-url", "--token-keys"]
        );
        // Global options after the subcommand count too.
        assert_eq!(
            found(&["migrate", "--database-url", "postgres://u@db/x?password=p"]),
            ["--database-url"]
        );
        assert_eq!(found(&["--redis-url", "redis://:p@cache"]), ["--redis-url"]);
    }

    #[test]
    fn secret_files_are_read_trimmed_and_conflict_with_the_direct_form() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("db");
        let redis = dir.path().join("redis");
        std::fs::write(&db, "\n  postgres://u:s3cret@db/x \n").unwrap();
        std::fs::write(&redis, "redis://:s3cret@cache\n").unwrap();
        let (db, redis) = (db.to_str().unwrap(), redis.to_str().unwrap());
        let cli = |args: &[&str]| {
            <Cli as clap::FromArgMatches>::from_arg_matches(&matches(args).unwrap()).unwrap()
        };
        let mut config = cli(&["--database-url-file", db, "--redis-url-file", redis]).config;
        config.read_secret_files().unwrap();
        assert_eq!(
            config.store.database_url,
            "postgres://u:s3cret@db/x".parse().unwrap()
        );
        assert_eq!(
            config.limits.redis_url.as_ref().unwrap().expose(),
            "redis://:s3cret@cache"
        );

        for (option, other, value) in [
            ("--database-url-file", "--database-url", "sqlite://x.db"),
            ("--redis-url-file", "--redis-url", "redis://cache"),
        ] {
            let err = matches(&[option, db, other, value]).unwrap_err();
            assert!(err.contains("cannot be used with"), "{err}");
        }

        let missing = dir.path().join("missing");
        let mut config = cli(&["--database-url-file", missing.to_str().unwrap()]).config;
        let err = format!("{:#}", config.read_secret_files().unwrap_err());
        assert!(err.starts_with("--database-url-file "), "{err}");
        assert!(err.contains("missing: cannot read the file"), "{err}");

        std::fs::write(dir.path().join("bad"), "postgres://u:s3cret@db:port/x").unwrap();
        let bad = dir.path().join("bad");
        let mut config = cli(&["--database-url-file", bad.to_str().unwrap()]).config;
        let err = format!("{:#}", config.read_secret_files().unwrap_err());
        assert!(err.contains("invalid PostgreSQL URL"), "{err}");
        assert!(!err.contains("s3cret"), "{err}");

        std::fs::write(dir.path().join("empty"), " \n").unwrap();
        let empty = dir.path().join("empty");
        let mut config = cli(&["--redis-url-file", empty.to_str().unwrap()]).config;
        let err = format!("{:#}", config.read_secret_files().unwrap_err());
        assert!(err.ends_with("the file is empty"), "{err}");
    }

    #[test]
    fn bad_values_are_refused_with_a_message() {
        let parse = |args: &[&str]| {
            Cli::command()
                .mut_args(|a| a.env(None::<&str>))
                .try_get_matches_from(std::iter::once("authd").chain(args.iter().copied()))
                .map(|_| ())
                .map_err(|e| e.to_string())
        };
        assert!(
            parse(&["--pbkdf2-iterations", "999"])
                .unwrap_err()
                .contains("999")
        );
        assert!(
            parse(&["--token-keys", "k:c2hvcnQ="])
                .unwrap_err()
                .contains("at least 32 bytes")
        );
        assert!(parse(&["--log-format", "xml"]).unwrap_err().contains("xml"));
        assert!(
            parse(&["--database-url", "ftp://x"])
                .unwrap_err()
                .contains("ftp")
        );
        assert!(
            parse(&["--token-ttl", "0s"])
                .unwrap_err()
                .contains("greater than zero")
        );
        assert!(parse(&["--listen", "nowhere"]).is_err());
        for absurd in ["8d", "9223372036854775807s", "1000years"] {
            let err = parse(&["--token-ttl", absurd]).unwrap_err();
            assert!(err.contains("must be at most 7days"), "{absurd}: {err}");
        }
        assert!(parse(&["--token-ttl", "7d"]).is_ok());
        assert!(parse(&["--token-clock-skew", "0s"]).is_ok());
        let err = parse(&["--token-clock-skew", "6m"]).unwrap_err();
        assert!(err.contains("must be at most 5m"), "{err}");
        assert!(parse(&["--token-audience", "orders,billing"]).is_ok());
        let err = parse(&["--token-audience", "orders,,billing"]).unwrap_err();
        assert!(err.contains("1 to 256 bytes"), "{err}");
        assert!(parse(&["--pbkdf2-iterations", "1000", "migrate"]).is_ok());
    }
}
