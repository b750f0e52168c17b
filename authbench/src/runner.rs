//! Runs a [`Plan`]: connect, prepare, load, report.
//!
//! 1. **Connect** `connections` HTTP/2 connections up front (with a short timeout, so
//!    an unreachable target fails in seconds with one clear error) and check that the
//!    server reports SERVING.
//! 2. **Prepare** what the mix needs: a pool of users for logins (registered now) and
//!    tokens for validations (from one login per user). Usernames carry a random run
//!    id, so runs against the same database never collide.
//! 3. **Load**: a closed loop of `concurrency` workers, each sending its next request
//!    as soon as the previous one is answered; or an open loop that sends the k-th
//!    request at `start + k / rate` whatever the answers, and measures its latency from
//!    that intended time.
//! 4. **Report**: requests sent during the warm-up are awaited but not recorded; every
//!    request sent after it is recorded exactly once, with its status code or
//!    client-side error.
//!
//! The client must never be the bottleneck (in the suite it has a single core): the
//! channels are built once and shared, requests are plain structs, operations come
//! from a precomputed wheel, and the only per-request synchronization is a handful of
//! relaxed atomics and one uncontended lock on a recorder shard.

use super::{
    progress::{Counters, Goal, Progress},
    report::{LoadInfo, Outcome, Recorder, Report, RunInfo},
    scenario::{Mix, Operation, Scenario},
    schedule,
};
use crate::pb::{
    LoginRequest, RefreshRequest, RegisterRequest, ValidateTokenRequest,
    auth_service_client::AuthServiceClient,
};
use anyhow::{Context as _, anyhow, bail};
use std::{
    sync::{
        Arc, Mutex,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};
use tokio::task::JoinSet;
use tonic::{
    Code, Request, Status,
    transport::{Channel, Endpoint},
};
use tonic_health::pb::{
    HealthCheckRequest, health_check_response::ServingStatus, health_client::HealthClient,
};
use tonic_types::StatusExt as _;

/// The password of every user authbench creates: long enough for authd's rules, and
/// the same for all, so a login request is built by cloning two short strings.
const PASSWORD: &str = "authbench-password-1";

/// Setup requests (registering the pool, logging in for tokens) in flight at once:
/// enough to keep a server's hash threads busy without filling its queue.
const SETUP_PARALLELISM: usize = 8;

/// How long setup keeps retrying a request the server refused for being full.
const SETUP_PATIENCE: Duration = Duration::from_secs(60);

/// The load shape.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Load {
    /// Keep `concurrency` requests in flight: each worker sends its next request as
    /// soon as its previous one is answered.
    Closed { concurrency: usize },
    /// Send `rate` requests per second on a fixed schedule, whatever the answers.
    Open { rate: f64 },
}

/// When the measured part of a run ends (the warm-up comes before it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stop {
    /// After this many measured requests have been sent.
    Requests(u64),
    /// When this much time has passed since the warm-up ended; requests in flight
    /// then are still awaited and recorded.
    Duration(Duration),
}

/// Everything a run needs to know. Build one with [`Plan::new`] and adjust fields.
#[derive(Debug, Clone)]
pub struct Plan {
    /// `http://host:port` or `https://host:port`.
    pub target: String,
    pub scenario: Scenario,
    /// The weights of the `mixed` scenario (ignored by the others).
    pub mix: Mix,
    pub load: Load,
    /// HTTP/2 connections the load is spread over.
    pub connections: usize,
    pub stop: Stop,
    /// Sent but not recorded, before the measured part.
    pub warmup: Duration,
    /// Per request, sent to the server as the gRPC deadline.
    pub timeout: Duration,
    /// Users registered first for logins and validations.
    pub users: usize,
    /// For each connection attempt and the first health check.
    pub connect_timeout: Duration,
    /// How long to keep trying to connect until the target is SERVING (0: try once).
    pub wait: Duration,
    /// Closed loop: wait out the server's RetryInfo after RESOURCE_EXHAUSTED.
    pub backoff: bool,
    /// The local address every connection is opened from.
    pub bind: Option<std::net::IpAddr>,
    /// Draw a progress bar on stderr.
    pub progress: bool,
    /// TLS, for an `https://` target.
    pub tls: Option<TlsOptions>,
}

/// The client side of TLS: whom to trust, what to present, which name to expect.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TlsOptions {
    /// PEM bundle of the CAs to trust [default: the Mozilla roots].
    pub ca: Option<std::path::PathBuf>,
    /// PEM certificate to present (mutual TLS), with `key`.
    pub cert: Option<std::path::PathBuf>,
    pub key: Option<std::path::PathBuf>,
    /// The name the server's certificate must carry [default: the target's host].
    pub server_name: Option<String>,
}

impl TlsOptions {
    /// Whether any option is set.
    pub fn is_set(&self) -> bool {
        *self != TlsOptions::default()
    }

    /// tonic's TLS configuration; an error names the option and the file.
    fn config(&self) -> anyhow::Result<tonic::transport::ClientTlsConfig> {
        use tonic::transport::{Certificate, ClientTlsConfig, Identity};
        let read = |option: &str, path: &std::path::PathBuf| {
            std::fs::read(path).with_context(|| format!("{option} {}", path.display()))
        };
        let mut config = ClientTlsConfig::new();
        config = match &self.ca {
            Some(path) => config.ca_certificate(Certificate::from_pem(read("--tls-ca", path)?)),
            None => config.with_webpki_roots(),
        };
        match (&self.cert, &self.key) {
            (Some(cert), Some(key)) => {
                let identity =
                    Identity::from_pem(read("--tls-cert", cert)?, read("--tls-key", key)?);
                config = config.identity(identity);
            }
            (None, None) => {}
            _ => bail!("--tls-cert and --tls-key go together"),
        }
        if let Some(name) = &self.server_name {
            config = config.domain_name(name.clone());
        }
        Ok(config)
    }
}

impl Plan {
    /// A plan with the defaults of the command line, and the default connection count
    /// for `load`.
    pub fn new(target: impl Into<String>, scenario: Scenario, load: Load, stop: Stop) -> Self {
        Self {
            target: target.into(),
            scenario,
            mix: Mix::DEFAULT.parse().expect("the default mix parses"),
            load,
            connections: default_connections(load),
            stop,
            warmup: Duration::ZERO,
            timeout: Duration::from_secs(10),
            users: 100,
            connect_timeout: Duration::from_secs(3),
            wait: Duration::ZERO,
            backoff: false,
            bind: None,
            progress: false,
            tls: None,
        }
    }

    /// Refuses plans that cannot run, with a reason naming the option.
    pub fn check(&self) -> Result<(), String> {
        match self.load {
            Load::Closed { concurrency: 0 } => {
                return Err("--concurrency must be at least 1".into());
            }
            Load::Open { rate } if !(rate.is_finite() && rate > 0.0) => {
                return Err("--rate must be a positive number of requests per second".into());
            }
            _ => {}
        }
        match self.stop {
            Stop::Requests(0) => return Err("--requests must be at least 1".into()),
            Stop::Duration(d) if d.is_zero() => {
                return Err("--duration must be greater than zero".into());
            }
            _ => {}
        }
        if self.connections == 0 {
            return Err("--connections must be at least 1".into());
        }
        if self.users == 0 {
            return Err("--users must be at least 1".into());
        }
        if self.timeout.is_zero() {
            return Err("--timeout must be greater than zero".into());
        }
        if self.connect_timeout.is_zero() {
            return Err("--connect-timeout must be greater than zero".into());
        }
        Ok(())
    }
}

/// The default connection count for a load shape.
pub fn default_connections(load: Load) -> usize {
    match load {
        Load::Closed { concurrency } => schedule::default_connections_closed(concurrency),
        Load::Open { rate } => schedule::default_connections_open(rate),
    }
}

/// Runs `plan` to completion and reports what it measured.
///
/// Fails (before sending any load) when the target cannot be reached, is not
/// SERVING, or refuses the setup; once the load runs, every failure is a measurement.
pub async fn run(plan: &Plan) -> anyhow::Result<Report> {
    plan.check().map_err(|e| anyhow!(e))?;
    let mix = plan.scenario.mix(&plan.mix);
    let mut progress = Progress::new(plan.progress);

    progress.phase(format!("connecting to {}", plan.target));
    let channels = connect(plan).await?;
    wait_until_serving(plan, &channels[0]).await?;
    let fixtures = prepare(plan, &mix, &channels, &progress).await?;

    // A few recorder shards per runtime thread: uncontended locks, bounded memory.
    let shards = tokio::runtime::Handle::current()
        .metrics()
        .num_workers()
        .max(1)
        * 2;
    let highest = (plan.timeout * 4).max(Duration::from_secs(60));
    let shared = Arc::new(Shared {
        auth: channels
            .iter()
            .cloned()
            .map(AuthServiceClient::new)
            .collect(),
        health: channels.iter().cloned().map(HealthClient::new).collect(),
        wheel: mix.wheel(),
        fixtures,
        timeout: plan.timeout,
        // The server answers DEADLINE_EXCEEDED at the deadline; the client only gives
        // up on its own when no answer comes even a little after it.
        give_up: plan.timeout + plan.timeout / 10 + Duration::from_millis(100),
        recorders: (0..shards)
            .map(|_| Mutex::new(Recorder::new(&mix, highest)))
            .collect(),
        counters: Arc::new(Counters::default()),
        backoff: plan.backoff,
    });

    let start = Instant::now();
    let warm_end = start + plan.warmup;
    progress.track(
        shared.counters.clone(),
        warm_end,
        match plan.stop {
            Stop::Requests(n) => Goal::Requests(n),
            Stop::Duration(d) => Goal::Duration(d),
        },
    );
    match plan.load {
        Load::Closed { concurrency } => {
            let clock = Arc::new(Clock::new(warm_end, plan.stop));
            closed_loop(&shared, &clock, concurrency).await?;
        }
        Load::Open { rate } => open_loop(&shared, start, plan, rate).await?,
    }
    progress.finish();

    let mut recorder = Recorder::new(&mix, highest);
    for shard in &shared.recorders {
        recorder.merge(&lock(shard));
    }
    let info = RunInfo {
        scenario: plan.scenario,
        mix,
        target: plan.target.clone(),
        load: match plan.load {
            Load::Closed { concurrency } => LoadInfo::Closed { concurrency },
            Load::Open { rate } => LoadInfo::Open { rate },
        },
        connections: plan.connections,
        warmup: plan.warmup,
        warmup_requests: shared.counters.warmup.load(Ordering::Relaxed),
    };
    Ok(Report::new(&info, &recorder))
}

/// Opens the connections, retrying until `plan.wait` has passed.
async fn connect(plan: &Plan) -> anyhow::Result<Vec<Channel>> {
    let mut endpoint = Endpoint::from_shared(plan.target.clone())
        .map_err(|e| anyhow!("{:?} is not a valid target URL: {e}", plan.target))?
        .connect_timeout(plan.connect_timeout)
        .tcp_nodelay(true)
        .local_address(plan.bind)
        // Requests waiting for the connection's dispatcher: an open loop may have many.
        .buffer_size(64 * 1024);
    if plan.target.starts_with("https://") {
        let tls = plan.tls.clone().unwrap_or_default().config()?;
        endpoint = endpoint
            .tls_config(tls)
            .map_err(|e| anyhow!("TLS options: {}", error_chain(&e)))?;
    }
    let give_up_at = Instant::now() + plan.wait;
    let first = loop {
        // connect_timeout covers TCP; the outer timeout covers a target that accepts
        // but never completes the HTTP/2 handshake.
        let attempt = tokio::time::timeout(plan.connect_timeout, endpoint.connect()).await;
        let error = match attempt {
            Ok(Ok(channel)) => break channel,
            Ok(Err(e)) => error_chain(&e),
            Err(_) => format!("no answer within {:?}", plan.connect_timeout),
        };
        if Instant::now() >= give_up_at {
            bail!("cannot connect to {}: {error}", plan.target);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let mut channels = vec![first];
    let mut more = JoinSet::new();
    for _ in 1..plan.connections {
        let endpoint = endpoint.clone();
        let limit = plan.connect_timeout;
        more.spawn(async move { tokio::time::timeout(limit, endpoint.connect()).await });
    }
    while let Some(result) = more.join_next().await {
        let channel = match result.context("a connection task failed")? {
            Ok(Ok(channel)) => channel,
            Ok(Err(e)) => bail!(
                "cannot open connection {} of {} to {}: {}",
                channels.len() + 1,
                plan.connections,
                plan.target,
                error_chain(&e)
            ),
            Err(_) => bail!(
                "cannot open connection {} of {} to {}: no answer within {:?}",
                channels.len() + 1,
                plan.connections,
                plan.target,
                plan.connect_timeout
            ),
        };
        channels.push(channel);
    }
    Ok(channels)
}

/// Checks that the server reports SERVING, waiting up to `plan.wait` for it. authd
/// always serves grpc.health.v1; a target without it is not authd (an HTTP server
/// that is not gRPC answers UNIMPLEMENTED), and is refused.
async fn wait_until_serving(plan: &Plan, channel: &Channel) -> anyhow::Result<()> {
    let mut health = HealthClient::new(channel.clone());
    let give_up_at = Instant::now() + plan.wait;
    loop {
        let mut request = Request::new(HealthCheckRequest {
            service: String::new(),
        });
        request.set_timeout(plan.connect_timeout);
        let answer = tokio::time::timeout(plan.connect_timeout, health.check(request)).await;
        let problem = match answer {
            Ok(Ok(response)) => match ServingStatus::try_from(response.into_inner().status) {
                Ok(ServingStatus::Serving) => return Ok(()),
                Ok(status) => format!("its health is {}", status.as_str_name()),
                Err(_) => "its health status is unknown".to_string(),
            },
            Ok(Err(status)) => format!("the health check failed: {}", describe_status(&status)),
            Err(_) => format!(
                "the health check got no answer within {:?}",
                plan.connect_timeout
            ),
        };
        if Instant::now() >= give_up_at {
            let hint = if plan.wait.is_zero() {
                " (use --wait to wait for it)"
            } else {
                ""
            };
            bail!("{} is not serving: {problem}{hint}", plan.target);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// What the requests of a run are built from.
struct Fixtures {
    /// Random, so names from different runs never collide.
    run_id: String,
    /// Numbers new usernames for registrations.
    registered: AtomicU64,
    /// Users for logins (all with [`PASSWORD`]).
    users: Vec<String>,
    /// Tokens for validations.
    tokens: Vec<String>,
    /// The refresh token of each session started during setup, for refreshes: held
    /// while one is in flight (a refresh token is used by one request at a time),
    /// replaced by the one its answer carries.
    refresh_tokens: Vec<tokio::sync::Mutex<String>>,
}

impl Fixtures {
    fn new_username(&self) -> String {
        let n = self.registered.fetch_add(1, Ordering::Relaxed);
        format!("{}-r{n}", self.run_id)
    }
}

/// Registers the login pool and collects tokens, as far as the mix needs them.
async fn prepare(
    plan: &Plan,
    mix: &Mix,
    channels: &[Channel],
    progress: &Progress,
) -> anyhow::Result<Fixtures> {
    let run_id = format!("ab{:08x}", rand::random::<u32>());
    let needs_sessions = mix.uses(Operation::Validate) || mix.uses(Operation::Refresh);
    let needs_users = mix.uses(Operation::Login) || needs_sessions;
    let users: Vec<String> = if needs_users {
        (0..plan.users).map(|i| format!("{run_id}-u{i}")).collect()
    } else {
        Vec::new()
    };
    let client = |i: usize| AuthServiceClient::new(channels[i % channels.len()].clone());

    if !users.is_empty() {
        progress.phase(format!("registering {} users for logins", users.len()));
        let jobs = users.iter().cloned().enumerate().map(|(i, username)| {
            let mut client = client(i);
            async move {
                let mut patience = Patience::new();
                loop {
                    let request = RegisterRequest {
                        username: username.clone(),
                        password: PASSWORD.into(),
                    };
                    match client.register(request).await {
                        Ok(_) => return Ok(()),
                        Err(status) if patience.wait_after(&status).await => {}
                        Err(status) => bail!(
                            "preparing the login pool: registering {username}: {}",
                            describe_status(&status)
                        ),
                    }
                }
            }
        });
        run_bounded(jobs).await?;
    }

    let mut sessions = Vec::new();
    if needs_sessions {
        progress.phase(format!("logging in {} users for tokens", users.len()));
        let jobs = users.iter().cloned().enumerate().map(|(i, username)| {
            let mut client = client(i);
            async move {
                let mut patience = Patience::new();
                loop {
                    let request = LoginRequest {
                        username: username.clone(),
                        password: PASSWORD.into(),
                    };
                    match client.login(request).await {
                        Ok(response) => {
                            let response = response.into_inner();
                            return Ok((response.access_token, response.refresh_token));
                        }
                        Err(status) if patience.wait_after(&status).await => {}
                        Err(status) => bail!(
                            "preparing tokens: logging in {username}: {}",
                            describe_status(&status)
                        ),
                    }
                }
            }
        });
        sessions = run_bounded(jobs).await?;
    }
    let (tokens, refresh_tokens): (Vec<String>, Vec<String>) = sessions.into_iter().unzip();

    Ok(Fixtures {
        run_id,
        registered: AtomicU64::new(0),
        users,
        tokens,
        refresh_tokens: refresh_tokens
            .into_iter()
            .map(tokio::sync::Mutex::new)
            .collect(),
    })
}

/// Runs setup futures, [`SETUP_PARALLELISM`] at a time, returning results in order.
async fn run_bounded<T, F>(jobs: impl Iterator<Item = F>) -> anyhow::Result<Vec<T>>
where
    T: Send + 'static,
    F: std::future::Future<Output = anyhow::Result<T>> + Send + 'static,
{
    let mut results: Vec<Option<T>> = Vec::new();
    let mut running = JoinSet::new();
    for (i, job) in jobs.enumerate() {
        results.push(None);
        if running.len() >= SETUP_PARALLELISM
            && let Some(done) = running.join_next().await
        {
            let (j, value) = done.context("a setup task failed")?;
            results[j] = Some(value?);
        }
        running.spawn(async move { (i, job.await) });
    }
    while let Some(done) = running.join_next().await {
        let (j, value) = done.context("a setup task failed")?;
        results[j] = Some(value?);
    }
    Ok(results
        .into_iter()
        .map(|r| r.expect("every job ran"))
        .collect())
}

/// Setup retries requests the server refused for being full or unavailable, with a
/// growing pause, for at most [`SETUP_PATIENCE`].
struct Patience {
    give_up_at: Instant,
    pause: Duration,
}

impl Patience {
    fn new() -> Self {
        Self {
            give_up_at: Instant::now() + SETUP_PATIENCE,
            pause: Duration::from_millis(20),
        }
    }

    /// Whether to try again after `status`; if so, first waits a little.
    async fn wait_after(&mut self, status: &Status) -> bool {
        let transient = matches!(status.code(), Code::ResourceExhausted | Code::Unavailable);
        if !transient || Instant::now() >= self.give_up_at {
            return false;
        }
        tokio::time::sleep(self.pause).await;
        self.pause = (self.pause * 2).min(Duration::from_secs(1));
        true
    }
}

/// What one request came to.
struct Performed {
    /// The outcome, and the status behind a client-side error.
    result: (Outcome, Option<Status>),
    /// The server's RetryInfo delay, when it refused for being full.
    retry_after: Option<Duration>,
}

/// The state every request of a run shares.
struct Shared {
    /// One client per connection; cloning one is cheap and shares its connection.
    auth: Vec<AuthServiceClient<Channel>>,
    health: Vec<HealthClient<Channel>>,
    wheel: Vec<Operation>,
    fixtures: Fixtures,
    timeout: Duration,
    give_up: Duration,
    recorders: Vec<Mutex<Recorder>>,
    counters: Arc<Counters>,
    backoff: bool,
}

impl Shared {
    /// Sends one request of `op` (using `pick` to choose a user or token) and waits
    /// for its outcome. Returns the client-side error, if any, for the report.
    async fn perform(
        &self,
        op: Operation,
        pick: usize,
        auth: &mut AuthServiceClient<Channel>,
        health: &mut HealthClient<Channel>,
    ) -> Performed {
        let fixtures = &self.fixtures;
        let timeout = self.timeout;
        let call = async {
            match op {
                Operation::Health => {
                    let request = deadline(
                        HealthCheckRequest {
                            service: String::new(),
                        },
                        timeout,
                    );
                    health.check(request).await.map(drop)
                }
                Operation::Register => {
                    let request = deadline(
                        RegisterRequest {
                            username: fixtures.new_username(),
                            password: PASSWORD.into(),
                        },
                        timeout,
                    );
                    auth.register(request).await.map(drop)
                }
                Operation::Login => {
                    let username = fixtures.users[pick % fixtures.users.len()].clone();
                    let request = deadline(
                        LoginRequest {
                            username,
                            password: PASSWORD.into(),
                        },
                        timeout,
                    );
                    auth.login(request).await.map(drop)
                }
                Operation::Validate => {
                    let access_token = fixtures.tokens[pick % fixtures.tokens.len()].clone();
                    let request = deadline(
                        ValidateTokenRequest {
                            access_token,
                            ..Default::default()
                        },
                        timeout,
                    );
                    auth.validate_token(request).await.map(drop)
                }
                Operation::Refresh => {
                    let slot = &fixtures.refresh_tokens[pick % fixtures.refresh_tokens.len()];
                    let mut refresh_token = slot.lock().await;
                    let request = deadline(
                        RefreshRequest {
                            refresh_token: refresh_token.clone(),
                        },
                        timeout,
                    );
                    auth.refresh(request)
                        .await
                        .map(|r| *refresh_token = r.into_inner().refresh_token)
                }
            }
        };
        let mut retry_after = None;
        let result = match tokio::time::timeout(self.give_up, call).await {
            Ok(Ok(())) => (Outcome::Status(Code::Ok), None),
            Ok(Err(status)) => match classify(&status) {
                outcome @ Outcome::Status(code) => {
                    if code == Code::ResourceExhausted {
                        retry_after = status
                            .get_error_details()
                            .retry_info()
                            .and_then(|info| info.retry_delay);
                    }
                    (outcome, None)
                }
                outcome => (outcome, Some(status)),
            },
            Err(_) => (
                Outcome::Timeout,
                Some(Status::deadline_exceeded(format!(
                    "no answer within {:?} (deadline {:?})",
                    self.give_up, self.timeout
                ))),
            ),
        };
        Performed {
            result,
            retry_after,
        }
    }

    /// Records one measured request in shard `shard`.
    fn record(
        &self,
        shard: usize,
        op: Operation,
        (outcome, error): (Outcome, Option<Status>),
        sent: Instant,
        done: Instant,
    ) {
        if outcome != Outcome::Status(Code::Ok) {
            self.counters.failed.fetch_add(1, Ordering::Relaxed);
        }
        let mut recorder = lock(&self.recorders[shard % self.recorders.len()]);
        recorder.record(op, outcome, sent, done);
        if let Some(error) = error {
            recorder.note_client_error(|| describe_status(&error));
        }
        drop(recorder);
        // Counted last, so a progress reading never runs ahead of the recorders.
        self.counters.done.fetch_add(1, Ordering::Relaxed);
    }
}

fn deadline<T>(message: T, timeout: Duration) -> Request<T> {
    let mut request = Request::new(message);
    request.set_timeout(timeout);
    request
}

/// A status the server sent, or one the client made up because it got none.
///
/// tonic builds the statuses it reads from the server's trailers without a source
/// error; the ones it makes from a transport failure (connection refused or reset,
/// stream reset, protocol error) carry the failure as their source.
fn classify(status: &Status) -> Outcome {
    if std::error::Error::source(status).is_some() {
        Outcome::Connection
    } else {
        Outcome::Status(status.code())
    }
}

/// `CODE: message`, plus the chain of causes of a client-side error.
fn describe_status(status: &Status) -> String {
    let head = format!(
        "{}: {}",
        super::report::code_name(status.code()),
        status.message()
    );
    append_causes(head, std::error::Error::source(status))
}

/// An error and its causes on one line, `a: b: c`.
fn error_chain(error: &(dyn std::error::Error + 'static)) -> String {
    append_causes(error.to_string(), error.source())
}

/// Appends each cause, skipping those whose text is already there: hyper and tonic
/// often repeat their source's message in their own.
fn append_causes(
    mut text: String,
    mut source: Option<&(dyn std::error::Error + 'static)>,
) -> String {
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !text.contains(&cause_text) {
            text.push_str(": ");
            text.push_str(&cause_text);
        }
        source = cause.source();
    }
    text
}

/// Locks a recorder shard. A panic while holding it can only come from a bug in the
/// recorder; the counts are still the best data there is, so go on with them.
fn lock(shard: &Mutex<Recorder>) -> std::sync::MutexGuard<'_, Recorder> {
    shard
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Decides, for a closed loop, whether a request about to be sent is warm-up,
/// measured, or one too many.
struct Clock {
    warm_end: Instant,
    stop: ClockStop,
}

enum ClockStop {
    At(Instant),
    After { limit: u64, issued: AtomicU64 },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Admit {
    Warmup,
    Measure,
    Stop,
}

impl Clock {
    fn new(warm_end: Instant, stop: Stop) -> Self {
        let stop = match stop {
            Stop::Duration(d) => ClockStop::At(warm_end + d),
            Stop::Requests(limit) => ClockStop::After {
                limit,
                issued: AtomicU64::new(0),
            },
        };
        Self { warm_end, stop }
    }

    fn admit(&self, now: Instant) -> Admit {
        if now < self.warm_end {
            return Admit::Warmup;
        }
        let more = match &self.stop {
            ClockStop::At(end) => now < *end,
            ClockStop::After { limit, issued } => issued.fetch_add(1, Ordering::Relaxed) < *limit,
        };
        if more { Admit::Measure } else { Admit::Stop }
    }
}

async fn closed_loop(
    shared: &Arc<Shared>,
    clock: &Arc<Clock>,
    concurrency: usize,
) -> anyhow::Result<()> {
    let mut workers = JoinSet::new();
    for id in 0..concurrency {
        workers.spawn(closed_worker(shared.clone(), clock.clone(), id));
    }
    while let Some(done) = workers.join_next().await {
        done.context("a load worker panicked")?;
    }
    Ok(())
}

/// One closed-loop worker: its next request goes out when the previous one is answered.
async fn closed_worker(shared: Arc<Shared>, clock: Arc<Clock>, id: usize) {
    let connection = id % shared.auth.len();
    let mut auth = shared.auth[connection].clone();
    let mut health = shared.health[connection].clone();
    // Each worker starts at its own place on the wheel and in the user pool, so the
    // workers together cover the mix and the users from the first request on.
    let mut turn = id;
    loop {
        let sent = Instant::now();
        let admit = clock.admit(sent);
        if admit == Admit::Stop {
            break;
        }
        let op = shared.wheel[turn % shared.wheel.len()];
        let performed = shared.perform(op, turn, &mut auth, &mut health).await;
        turn = turn.wrapping_add(1);
        if admit == Admit::Measure {
            shared.record(id, op, performed.result, sent, Instant::now());
        } else {
            shared.counters.warmup.fetch_add(1, Ordering::Relaxed);
        }
        if let (true, Some(delay)) = (shared.backoff, performed.retry_after) {
            // Think time, not latency: the next request's clock starts after it.
            tokio::time::sleep(delay.mul_f64(rand::random_range(0.5..1.5))).await;
        }
    }
}

/// Sends on the fixed schedule `start + k / rate` and awaits every answer.
async fn open_loop(
    shared: &Arc<Shared>,
    start: Instant,
    plan: &Plan,
    rate: f64,
) -> anyhow::Result<()> {
    let warmup_sends = schedule::sends_before(plan.warmup, rate);
    let total = match plan.stop {
        Stop::Requests(n) => warmup_sends + n,
        Stop::Duration(d) => schedule::sends_before(plan.warmup + d, rate),
    };
    let mut in_flight = JoinSet::new();
    for k in 0..total {
        let intended = schedule::intended_send_time(start, k, rate);
        if intended > Instant::now() {
            tokio::time::sleep_until(intended.into()).await;
        }
        // Reap answered requests so the set stays as small as what is in flight.
        while let Some(done) = in_flight.try_join_next() {
            done.context("a request task panicked")?;
        }
        let shared = shared.clone();
        let measured = k >= warmup_sends;
        in_flight.spawn(async move {
            let i = usize::try_from(k).unwrap_or(usize::MAX);
            let connection = i % shared.auth.len();
            let mut auth = shared.auth[connection].clone();
            let mut health = shared.health[connection].clone();
            let op = shared.wheel[i % shared.wheel.len()];
            let performed = shared.perform(op, i, &mut auth, &mut health).await;
            if measured {
                // Latency from when the request was *meant* to go out: if this client
                // or the server fell behind, the delay shows in the report.
                shared.record(i, op, performed.result, intended, Instant::now());
            } else {
                shared.counters.warmup.fetch_add(1, Ordering::Relaxed);
            }
        });
    }
    while let Some(done) = in_flight.join_next().await {
        done.context("a request task panicked")?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_closed_loop_clock_counts_measured_requests_exactly() {
        let now = Instant::now();
        let clock = Clock::new(now + Duration::from_secs(1), Stop::Requests(3));
        assert_eq!(clock.admit(now), Admit::Warmup);
        let after = now + Duration::from_secs(2);
        let admitted: Vec<Admit> = (0..5).map(|_| clock.admit(after)).collect();
        assert_eq!(
            admitted,
            [
                Admit::Measure,
                Admit::Measure,
                Admit::Measure,
                Admit::Stop,
                Admit::Stop
            ]
        );
    }

    #[test]
    fn a_closed_loop_clock_stops_after_the_duration() {
        let now = Instant::now();
        let clock = Clock::new(now, Stop::Duration(Duration::from_secs(10)));
        assert_eq!(clock.admit(now), Admit::Measure);
        assert_eq!(clock.admit(now + Duration::from_secs(9)), Admit::Measure);
        assert_eq!(clock.admit(now + Duration::from_secs(10)), Admit::Stop);
    }

    #[test]
    fn plans_are_checked() {
        let plan = |load, stop| Plan::new("http://127.0.0.1:1", Scenario::Health, load, stop);
        let ok = plan(Load::Closed { concurrency: 1 }, Stop::Requests(1));
        assert_eq!(ok.check(), Ok(()));
        assert_eq!(ok.connections, 1);
        assert!(
            plan(Load::Closed { concurrency: 0 }, Stop::Requests(1))
                .check()
                .is_err()
        );
        assert!(
            plan(Load::Open { rate: 0.0 }, Stop::Requests(1))
                .check()
                .is_err()
        );
        assert!(
            plan(Load::Open { rate: f64::NAN }, Stop::Requests(1))
                .check()
                .is_err()
        );
        assert!(
            plan(Load::Open { rate: 10.0 }, Stop::Requests(0))
                .check()
                .is_err()
        );
        assert!(
            plan(Load::Open { rate: 10.0 }, Stop::Duration(Duration::ZERO))
                .check()
                .is_err()
        );
        let mut no_users = ok.clone();
        no_users.users = 0;
        assert!(no_users.check().unwrap_err().contains("--users"));
    }

    #[test]
    fn statuses_from_the_server_are_codes_and_the_rest_client_errors() {
        assert_eq!(
            classify(&Status::resource_exhausted("full")),
            Outcome::Status(Code::ResourceExhausted)
        );
        let io = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "refused");
        let mut made_up = Status::unavailable("transport error");
        made_up.set_source(Arc::new(io));
        assert_eq!(classify(&made_up), Outcome::Connection);
        assert_eq!(
            describe_status(&made_up),
            "UNAVAILABLE: transport error: refused"
        );
    }
}
