//! What the admin API costs, measured in one run against one database, by
//! `bench/admin.sh`:
//!
//! 1. ListUsers with a page of 100 over `--users` accounts (inserted straight into
//!    the database, as a large deployment would have them): the first page, a page
//!    in the middle (by its page token), and a username prefix; the median and the
//!    slowest of `--reps` calls each.
//! 2. ValidateToken calls a second, `--concurrency` in flight for `--duration`,
//!    before and after `--disabled` accounts are disabled through DisableUser (so
//!    the revocation set holds that many per-user cutoffs).
//!
//! authd runs in this process on 127.0.0.1 (port 0) with its admin listener on, so
//! the figures are the service's and the client's together: compare the rows of one
//! run, not runs of different machines.
//!
//! ```sh
//! cargo run --release --example admin_bench -- --database-url sqlite:///tmp/admin-bench.db
//! ```

use anyhow::{Context as _, ensure};
use authd::{
    app::Application,
    config::Config,
    pb::{
        LoginRequest, RegisterRequest, ValidateTokenRequest,
        admin::{
            DisableUserRequest, ListUsersRequest, UserSelector,
            admin_service_client::AdminServiceClient, user_selector::Selector,
        },
        auth_service_client::AuthServiceClient,
    },
};
use clap::Parser;
use sha2::{Digest as _, Sha256};
use std::{
    io::Write as _,
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};
use tonic::{Request, transport::Channel};

const KEY: &str = "admin-bench-key-0123456789abcdef-0123456789abcdef";
const PASSWORD: &str = "a fine password for the bench";

#[derive(Debug, Parser)]
#[command(name = "admin_bench")]
struct Args {
    /// The database: sqlite:///path (a new file) or a PostgreSQL URL (an empty schema).
    #[arg(long)]
    database_url: String,
    /// Accounts inserted for ListUsers.
    #[arg(long, default_value_t = 1_000_000)]
    users: u64,
    /// Accounts disabled before the second ValidateToken run.
    #[arg(long, default_value_t = 10_000)]
    disabled: u64,
    /// ListUsers calls per kind of page.
    #[arg(long, default_value_t = 50)]
    reps: usize,
    /// ValidateToken calls in flight.
    #[arg(long, default_value_t = 32)]
    concurrency: usize,
    /// How long each ValidateToken run lasts.
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    duration: Duration,
}

fn with_key<T>(message: T) -> Request<T> {
    let mut request = Request::new(message);
    let value = format!("Bearer {KEY}").parse().expect("ASCII");
    request.metadata_mut().insert("authorization", value);
    request
}

/// Inserts `n` accounts named `user-0000000`… in batches, straight into the table.
async fn insert_users(url: &str, n: u64) -> anyhow::Result<()> {
    const BATCH: u64 = 5_000;
    let hash = "$pbkdf2-sha256$i=1000,l=32$c2FsdHNhbHRzYWx0c2FsdA$\
                aGFzaGhhc2hoYXNoaGFzaGhhc2hoYXNoaGFzaGhhc2g";
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)?
        .as_millis() as i64;
    let statement = |from: u64, to: u64| {
        let rows: Vec<String> = (from..to)
            .map(|i| format!("('bench-{i}', 'user-{i:07}', '{hash}', {now}, {now})"))
            .collect();
        format!(
            "INSERT INTO users (id, username, password_hash, created_at, updated_at) VALUES {}",
            rows.join(",")
        )
    };
    if url.starts_with("sqlite:") {
        use sqlx::Connection as _;
        let mut conn = sqlx::SqliteConnection::connect(url).await?;
        let mut tx = conn.begin().await?;
        for from in (0..n).step_by(BATCH as usize) {
            sqlx::raw_sql(sqlx::AssertSqlSafe(statement(from, (from + BATCH).min(n))))
                .execute(&mut *tx)
                .await?;
        }
        tx.commit().await?;
    } else {
        use sqlx::Connection as _;
        let mut conn = sqlx::PgConnection::connect(url).await?;
        for from in (0..n).step_by(BATCH as usize) {
            sqlx::raw_sql(sqlx::AssertSqlSafe(statement(from, (from + BATCH).min(n))))
                .execute(&mut conn)
                .await?;
        }
        sqlx::raw_sql("ANALYZE users").execute(&mut conn).await?;
    }
    Ok(())
}

/// The median and the slowest of `times`, in milliseconds.
fn summary(mut times: Vec<Duration>) -> (f64, f64) {
    times.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    (ms(times[times.len() / 2]), ms(times[times.len() - 1]))
}

async fn list_pages(
    admin: &mut AdminServiceClient<Channel>,
    args: &Args,
) -> anyhow::Result<Vec<(String, f64, f64)>> {
    // The token a client holds in the middle: walked to, a page of 1000 at a time.
    let mut token = String::new();
    for _ in 0..args.users / 2 / 1000 {
        let request = ListUsersRequest {
            page_size: 1000,
            page_token: token.clone(),
            ..Default::default()
        };
        let page = admin.list_users(with_key(request)).await?.into_inner();
        ensure!(
            !page.next_page_token.is_empty(),
            "fewer accounts than --users"
        );
        token = page.next_page_token;
    }
    let kinds = [
        ("first page", String::new(), String::new()),
        ("a page in the middle", token, String::new()),
        ("prefix user-00012", String::new(), "user-00012".to_owned()),
    ];
    let mut rows = Vec::new();
    for (name, page_token, prefix) in kinds {
        let mut times = Vec::with_capacity(args.reps);
        for _ in 0..args.reps {
            let request = ListUsersRequest {
                page_size: 100,
                page_token: page_token.clone(),
                username_prefix: prefix.clone(),
                ..Default::default()
            };
            let started = Instant::now();
            let page = admin.list_users(with_key(request)).await?.into_inner();
            times.push(started.elapsed());
            ensure!(
                page.users.len() == 100,
                "{name}: {} users",
                page.users.len()
            );
        }
        let (median, max) = summary(times);
        rows.push((name.to_owned(), median, max));
    }
    Ok(rows)
}

async fn validate_rate(
    auth: &AuthServiceClient<Channel>,
    token: &str,
    args: &Args,
) -> anyhow::Result<f64> {
    let done = Arc::new(AtomicU64::new(0));
    let until = Instant::now() + args.duration;
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..args.concurrency {
        let mut client = auth.clone();
        let token = token.to_owned();
        let done = done.clone();
        tasks.spawn(async move {
            while Instant::now() < until {
                let request = ValidateTokenRequest {
                    access_token: token.clone(),
                    ..Default::default()
                };
                client.validate_token(request).await?;
                done.fetch_add(1, Ordering::Relaxed);
            }
            Ok::<_, tonic::Status>(())
        });
    }
    while let Some(result) = tasks.join_next().await {
        result??;
    }
    Ok(done.load(Ordering::Relaxed) as f64 / args.duration.as_secs_f64())
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let mut keys = tempfile::NamedTempFile::new()?;
    let digest = hex::encode(Sha256::digest(KEY.as_bytes()));
    writeln!(keys, "bench admin {digest}")?;
    let mut config = Config::defaults();
    config.server.listen = "127.0.0.1:0".parse()?;
    config.server.health_listen = "off".parse().map_err(anyhow::Error::msg)?;
    config.telemetry.metrics_listen = "off".parse().map_err(anyhow::Error::msg)?;
    config.store.database_url = args.database_url.parse().map_err(anyhow::Error::msg)?;
    config.passwords.pbkdf2_iterations = 1000;
    config.tokens.token_keys = Some(
        "bench:MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY="
            .parse()
            .map_err(anyhow::Error::msg)?,
    );
    config.limits.register_limit = authd::RegisterLimit::OFF;
    config.admin.admin_listen = "127.0.0.1:0".parse().map_err(anyhow::Error::msg)?;
    config.admin.admin_keys_file = Some(keys.path().to_owned());
    config.admin.admin_rate = 100_000;

    // The schema first (migrations run at build), then the accounts behind its back.
    let app = Application::build(config.clone()).await?;
    drop(app);
    let started = Instant::now();
    insert_users(&args.database_url, args.users)
        .await
        .context("inserting the accounts")?;
    eprintln!(
        "inserted {} accounts in {:.1?}",
        args.users,
        started.elapsed()
    );

    let app = Application::build(config).await?;
    let (addr, admin_addr) = (app.local_addr(), app.admin_addr().context("admin port")?);
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(app.run_until_stopped(async {
        let _ = stopped.await;
    }));
    let channel = Channel::from_shared(format!("http://{addr}"))?
        .connect()
        .await?;
    let mut auth = AuthServiceClient::new(channel);
    let mut admin = AdminServiceClient::new(
        Channel::from_shared(format!("http://{admin_addr}"))?
            .connect()
            .await?,
    );

    println!("| measurement | median | slowest |");
    println!("|---|---:|---:|");
    for (name, median, max) in list_pages(&mut admin, &args).await? {
        println!(
            "| ListUsers, page of 100 of {} accounts: {name} | {median:.2} ms | {max:.2} ms |",
            args.users
        );
    }

    auth.register(RegisterRequest {
        username: "bench-validator".into(),
        password: PASSWORD.into(),
    })
    .await?;
    let token = auth
        .login(LoginRequest {
            username: "bench-validator".into(),
            password: PASSWORD.into(),
        })
        .await?
        .into_inner()
        .access_token;
    let none = validate_rate(&auth, &token, &args).await?;
    let started = Instant::now();
    let mut disabling = tokio::task::JoinSet::new();
    let per_task = args.disabled.div_ceil(16);
    for task in 0..16u64 {
        let mut admin = admin.clone();
        disabling.spawn(async move {
            for i in task * per_task..((task + 1) * per_task) {
                let request = DisableUserRequest {
                    user: Some(UserSelector {
                        selector: Some(Selector::UserId(format!("bench-{i}"))),
                    }),
                    reason: "bench".into(),
                };
                admin.disable_user(with_key(request)).await?;
            }
            Ok::<_, tonic::Status>(())
        });
        if (task + 1) * per_task >= args.disabled {
            break;
        }
    }
    while let Some(result) = disabling.join_next().await {
        result??;
    }
    eprintln!(
        "disabled {} accounts in {:.1?}",
        args.disabled,
        started.elapsed()
    );
    let with = validate_rate(&auth, &token, &args).await?;
    println!(
        "| ValidateToken, none disabled | {none:.0}/s | |\n\
         | ValidateToken, {} disabled (cutoffs in the revocation set) | {with:.0}/s ({:.2}× none) | |",
        args.disabled,
        with / none
    );
    let _ = stop.send(());
    server.await??;
    Ok(())
}
