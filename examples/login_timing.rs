//! Whether the latency of a failed login tells a known username from an unknown
//! one, run by `bench/login-timing.sh`: for the stored hashes' cost raised (known
//! user stored at `--low` rounds, server at `--high`) and lowered (the other way
//! round), `--samples` failed logins of each, interleaved, and the accuracy of the
//! best single-threshold classifier on their latencies. Equal cost gives about 0.5
//! (chance); on two samples of 100 from one distribution the best threshold's
//! accuracy is (1 + D) / 2, D the two-sample Kolmogorov-Smirnov statistic, which
//! exceeds 0.64 about once in a thousand runs and 0.70 about once in four million.
//! A server that hashed less for one of them would show near 1.0.
//!
//! The integration tests check the mechanism itself (`tests/api/equal_cost.rs`:
//! every failed login computes the same counted rounds); this measures its effect
//! on a real machine, where timing is noisy, so it is a benchmark, not a test.
//!
//! ```sh
//! cargo run --release --example login_timing -- --samples 100
//! ```

use anyhow::Context as _;
use authd::{
    app::Application,
    config::Config,
    pb::{LoginRequest, RegisterRequest, auth_service_client::AuthServiceClient},
};
use clap::Parser;
use std::time::{Duration, Instant};
use tonic::{Code, transport::Channel};

const PASSWORD: &str = "a fine password for the bench";

#[derive(Debug, Parser)]
#[command(name = "login_timing")]
struct Args {
    /// Failed logins timed for each of the known and the unknown username.
    #[arg(long, default_value_t = 100)]
    samples: usize,
    /// The cheaper PBKDF2 cost.
    #[arg(long, default_value_t = 1000)]
    low: u32,
    /// The dearer PBKDF2 cost.
    #[arg(long, default_value_t = 20_000)]
    high: u32,
    /// The accuracy above which the run fails (exit status 1).
    #[arg(long, default_value_t = 0.70)]
    max_accuracy: f64,
}

/// The accuracy of the best single-threshold classifier telling `a` from `b`:
/// "at most t is a, above is b", or the other way round, for the best t.
fn best_threshold_accuracy(a: &[Duration], b: &[Duration]) -> f64 {
    let mut all: Vec<(Duration, bool)> = (a.iter().map(|d| (*d, true)))
        .chain(b.iter().map(|d| (*d, false)))
        .collect();
    all.sort();
    let total = all.len() as f64;
    let (mut a_below, mut b_below) = (0usize, 0usize);
    let mut best = 0.5f64;
    for (i, (at, is_a)) in all.iter().enumerate() {
        if *is_a {
            a_below += 1;
        } else {
            b_below += 1;
        }
        // Only between distinct values is there a threshold.
        if all.get(i + 1).is_some_and(|(next, _)| next == at) {
            continue;
        }
        let accuracy = (a_below + (b.len() - b_below)) as f64 / total;
        best = best.max(accuracy).max(1.0 - accuracy);
    }
    best
}

fn config(db: &str, iterations: u32) -> anyhow::Result<Config> {
    let mut config = Config::defaults();
    config.server.listen = "127.0.0.1:0".parse()?;
    config.server.health_listen = "off".parse().map_err(anyhow::Error::msg)?;
    config.telemetry.metrics_listen = "off".parse().map_err(anyhow::Error::msg)?;
    config.store.database_url = db.parse().map_err(anyhow::Error::msg)?;
    config.passwords.pbkdf2_iterations = iterations;
    config.tokens.token_keys = Some(
        "bench:MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY="
            .parse()
            .map_err(anyhow::Error::msg)?,
    );
    config.limits.register_limit = authd::RegisterLimit::OFF;
    // Hundreds of failed logins of two usernames: the throttle would refuse them.
    config.limits.login_failures = 0;
    Ok(config)
}

/// Serves `config` until the returned sender is dropped; its client.
async fn serve(
    config: Config,
) -> anyhow::Result<(
    AuthServiceClient<Channel>,
    tokio::sync::oneshot::Sender<()>,
    tokio::task::JoinHandle<anyhow::Result<()>>,
)> {
    let app = Application::build(config).await?;
    let addr = app.local_addr();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(app.run_until_stopped(async {
        let _ = stopped.await;
    }));
    let channel = Channel::from_shared(format!("http://{addr}"))?
        .connect()
        .await?;
    Ok((AuthServiceClient::new(channel), stop, server))
}

/// One failed login's latency.
async fn failed_login(client: &mut AuthServiceClient<Channel>, username: &str) -> Duration {
    let started = Instant::now();
    let answer = client
        .login(LoginRequest {
            username: username.into(),
            password: "not the password".into(),
        })
        .await;
    let took = started.elapsed();
    assert_eq!(answer.map(drop).unwrap_err().code(), Code::Unauthenticated);
    took
}

/// "known" stored at `stored` rounds, the server at `iterations`: the best
/// threshold's accuracy and both medians.
async fn measure(
    args: &Args,
    stored: u32,
    iterations: u32,
) -> anyhow::Result<(f64, Duration, Duration)> {
    let dir = tempfile::tempdir()?;
    let db = format!("sqlite://{}", dir.path().join("timing.db").display());
    let (mut client, stop, server) = serve(config(&db, stored)?).await?;
    client
        .register(RegisterRequest {
            username: "known".into(),
            password: PASSWORD.into(),
        })
        .await
        .context("registering the known user")?;
    drop(stop);
    server.await??;
    let (mut client, stop, server) = serve(config(&db, iterations)?).await?;
    for _ in 0..10 {
        failed_login(&mut client, "known").await;
        failed_login(&mut client, "nobody").await;
    }
    let n = args.samples;
    let (mut known, mut unknown) = (Vec::with_capacity(n), Vec::with_capacity(n));
    for i in 0..n {
        // Alternate which goes first, so neither always follows the other.
        if i % 2 == 0 {
            known.push(failed_login(&mut client, "known").await);
            unknown.push(failed_login(&mut client, "nobody").await);
        } else {
            unknown.push(failed_login(&mut client, "nobody").await);
            known.push(failed_login(&mut client, "known").await);
        }
    }
    drop(stop);
    server.await??;
    let accuracy = best_threshold_accuracy(&known, &unknown);
    let median = |v: &mut Vec<Duration>| {
        v.sort();
        v[v.len() / 2]
    };
    Ok((accuracy, median(&mut known), median(&mut unknown)))
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let ms = Duration::from_millis;
    // The classifier itself tells two distributions apart when they differ.
    let fast: Vec<_> = (0..50).map(|i| ms(10 + i % 3)).collect();
    let slow: Vec<_> = (0..50).map(|i| ms(100 + i % 3)).collect();
    anyhow::ensure!(best_threshold_accuracy(&fast, &slow) == 1.0);

    println!(
        "| stored cost → server cost | best threshold accuracy | median known | median unknown |"
    );
    println!("|---|---:|---:|---:|");
    let mut worst: f64 = 0.0;
    for (stored, iterations) in [(args.low, args.high), (args.high, args.low)] {
        let (accuracy, known, unknown) = measure(&args, stored, iterations).await?;
        println!("| {stored} → {iterations} | {accuracy:.3} | {known:.2?} | {unknown:.2?} |");
        worst = worst.max(accuracy);
    }
    anyhow::ensure!(
        worst <= args.max_accuracy,
        "latency tells known from unknown users: accuracy {worst:.3} > {}",
        args.max_accuracy
    );
    Ok(())
}
