//! An end-to-end smoke test of several authd replicas sharing one database, one key
//! ring and one Redis, run by `scripts/smoke-replicas.sh`:
//!
//! 1. register a new user through the first replica,
//! 2. log in through the second,
//! 3. validate that token through the third,
//! 4. send more logins, round robin over every replica, and count how many each
//!    admitted and how many the rate limiter refused (RESOURCE_EXHAUSTED carrying a
//!    `google.rpc.QuotaFailure`). With `--expect-admitted LIMIT` the run fails unless
//!    the logins admitted over all replicas, step 2's included, add up to exactly
//!    LIMIT: a global rule is shared, not enforced per replica.
//!
//! ```sh
//! cargo run --release --example smoke -- \
//!     --replicas 127.0.0.1:50061,127.0.0.1:50062,127.0.0.1:50063 --logins 30 --expect-admitted 12
//! ```
//!
//! Any other outcome (an error, a refusal that is not the rate limiter's, a token
//! one replica issued and another refused) fails the run with one line on stderr.

use anyhow::{Context as _, bail, ensure};
use authd::pb::{
    LoginRequest, LoginResponse, RegisterRequest, ValidateTokenRequest,
    auth_service_client::AuthServiceClient,
};
use clap::Parser;
use std::{
    process::ExitCode,
    sync::Arc,
    time::{Duration, SystemTime, UNIX_EPOCH},
};
use tokio::sync::Semaphore;
use tonic::{Code, transport::Channel};
use tonic_types::StatusExt as _;

/// Register, log in and validate across replicas, then count rate-limited logins.
#[derive(Debug, Parser)]
#[command(name = "smoke")]
struct Args {
    /// The replicas, HOST:PORT,…; steps 1, 2 and 3 use the first, second and third
    /// (wrapping around when there are fewer).
    #[arg(long, value_delimiter = ',', required = true)]
    replicas: Vec<String>,

    /// Logins sent after step 3, round robin over the replicas.
    #[arg(long, default_value_t = 30)]
    logins: usize,

    /// Logins in flight at once during step 4.
    #[arg(long, default_value_t = 4)]
    concurrency: usize,

    /// Fail unless exactly this many logins (step 2's included) were admitted in all.
    #[arg(long)]
    expect_admitted: Option<usize>,

    /// Deadline of each request.
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    timeout: Duration,
}

const PASSWORD: &str = "smoke test password";

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let args = Args::parse();
    match run(&args).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("smoke: FAILED: {e:#}");
            ExitCode::FAILURE
        }
    }
}

async fn run(args: &Args) -> anyhow::Result<()> {
    ensure!(args.concurrency > 0, "--concurrency must be at least 1");
    let mut clients = Vec::with_capacity(args.replicas.len());
    for addr in &args.replicas {
        let url = if addr.contains("://") {
            addr.clone()
        } else {
            format!("http://{addr}")
        };
        let channel = Channel::from_shared(url)
            .with_context(|| format!("replica address {addr:?}"))?
            .connect_timeout(args.timeout)
            .timeout(args.timeout)
            .connect()
            .await
            .with_context(|| format!("connecting to {addr}"))?;
        clients.push(AuthServiceClient::new(channel));
    }
    let replica = |step: usize| step % clients.len();

    // A name no earlier run used: 3–64 of [A-Za-z0-9._-].
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_nanos();
    let username = format!("smoke-{}-{nanos}", std::process::id());

    let r = replica(0);
    let user_id = clients[r]
        .clone()
        .register(RegisterRequest {
            username: username.clone(),
            password: PASSWORD.into(),
        })
        .await
        .with_context(|| format!("Register through {}", args.replicas[r]))?
        .into_inner()
        .user_id;
    println!(
        "1. Register      via {:<22} user {username} id {user_id}",
        args.replicas[r]
    );

    let r = replica(1);
    let session = login(&mut clients[r].clone(), &username)
        .await
        .with_context(|| format!("Login through {}", args.replicas[r]))?;
    ensure!(
        session.user_id == user_id,
        "Login through {} answered user id {}, Register gave {user_id}",
        args.replicas[r],
        session.user_id
    );
    let expires = session
        .expires_at
        .map_or_else(|| "?".to_owned(), |t| t.to_string());
    println!(
        "2. Login         via {:<22} token expires {expires}",
        args.replicas[r]
    );

    let r = replica(2);
    let claims = clients[r]
        .clone()
        .validate_token(ValidateTokenRequest {
            access_token: session.access_token.clone(),
            ..Default::default()
        })
        .await
        .with_context(|| {
            format!(
                "ValidateToken through {} of a token issued by {}",
                args.replicas[r],
                args.replicas[replica(1)]
            )
        })?
        .into_inner();
    ensure!(
        claims.user_id == user_id && claims.username == username,
        "ValidateToken through {} answered {claims:?}",
        args.replicas[r]
    );
    println!(
        "3. ValidateToken via {:<22} token of replica {} accepted",
        args.replicas[r],
        replica(1) + 1
    );

    // Step 4: the replica that admitted step 2's login counts as one admission.
    let mut admitted = vec![0usize; clients.len()];
    admitted[replica(1)] += 1;
    let mut limited = vec![0usize; clients.len()];
    let permits = Arc::new(Semaphore::new(args.concurrency));
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..args.logins {
        let r = i % clients.len();
        let mut client = clients[r].clone();
        let username = username.clone();
        let permit = permits.clone().acquire_owned().await?;
        tasks.spawn(async move {
            let outcome = login(&mut client, &username).await;
            drop(permit);
            (r, outcome)
        });
    }
    while let Some(joined) = tasks.join_next().await {
        let (r, outcome) = joined?;
        match outcome {
            Ok(_) => admitted[r] += 1,
            Err(status) if is_rate_limited(&status) => limited[r] += 1,
            Err(status) => bail!(
                "Login through {}: {:?}: {} (only OK or a rate-limit refusal is expected)",
                args.replicas[r],
                status.code(),
                status.message()
            ),
        }
    }
    let total: usize = admitted.iter().sum();
    let per_replica = |counts: &[usize]| {
        counts
            .iter()
            .enumerate()
            .map(|(i, n)| format!("{}: {n}", args.replicas[i]))
            .collect::<Vec<_>>()
            .join(", ")
    };
    println!(
        "4. Login x{:<6} round robin: {total} admitted in all ({}), {} refused by the rate limiter ({})",
        args.logins + 1,
        per_replica(&admitted),
        limited.iter().sum::<usize>(),
        per_replica(&limited),
    );
    if let Some(expected) = args.expect_admitted {
        ensure!(
            total == expected,
            "{total} logins were admitted over {} replicas, the shared limit is {expected}: \
             the rule is not enforced globally",
            clients.len()
        );
        println!("ok: the replicas admitted {total} logins together, exactly the global limit");
    } else {
        println!("ok");
    }
    Ok(())
}

async fn login(
    client: &mut AuthServiceClient<Channel>,
    username: &str,
) -> Result<LoginResponse, tonic::Status> {
    client
        .login(LoginRequest {
            username: username.to_owned(),
            password: PASSWORD.into(),
        })
        .await
        .map(tonic::Response::into_inner)
}

/// The rate limiter's refusal: RESOURCE_EXHAUSTED with a QuotaFailure naming the
/// rule. A full hash queue is RESOURCE_EXHAUSTED too, but without one.
fn is_rate_limited(status: &tonic::Status) -> bool {
    status.code() == Code::ResourceExhausted
        && status
            .get_details_quota_failure()
            .is_some_and(|q| !q.violations.is_empty())
}
