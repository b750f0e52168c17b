//! Setup: the users and tokens the mix needs, prepared before the load ([`Fixtures`]).
//!
//! Registers the login pool (over gRPC or HTTP/1.1) and logs each user in once for
//! tokens (gRPC only), a few requests at a time, waiting out a server that is full.
//! Usernames carry a random run id, so runs against the same database never
//! collide. With `--forwarded-for`, user i's setup requests carry its address
//! (k = i mod N), as its requests during the load do. Nothing here is measured: a
//! setup request that still fails stops the run before any load is sent.

use super::{
    check,
    forwarded::{Forwarded, stamp},
    http::{self, Connection},
    plan::Plan,
    status::{describe_status, http_code},
};
use crate::{
    admin_pb::{CreateServiceAccountRequest, admin_service_client::AdminServiceClient},
    pb::{
        IssueServiceTokenRequest, LoginRequest, RegisterRequest,
        auth_service_client::AuthServiceClient,
    },
    progress::Progress,
    scenario::{Mix, Operation, Scenario},
};
use anyhow::{Context as _, bail};
use bytes::Bytes;
use std::{
    sync::{
        Arc, Mutex,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};
use tokio::task::JoinSet;
use tonic::{
    Code, Request,
    metadata::{Ascii, MetadataValue},
    transport::Channel,
};

/// How setup reaches the target.
pub(super) enum Via<'a> {
    /// The run's gRPC connections.
    Grpc(&'a [Channel]),
    /// A few HTTP/1.1 connections of setup's own, closed when it is done.
    Http(&'a Arc<http::Target>),
}

/// The password of every user authbench creates: long enough for authd's rules, and
/// the same for all, so a login request is built by cloning two short strings.
pub(super) const PASSWORD: &str = "authbench-password-1";

/// The audience (and scope) of the service accounts authbench creates, and of the
/// tokens granted or exchanged for them.
pub(super) const AUDIENCE: &str = "authbench";

/// A service account created during setup: its name (`client_id`) and its client
/// secret. The secret stays in memory, is sent only in requests, and never printed.
pub(super) struct ServiceClient {
    pub(super) client_id: String,
    client_secret: String,
    /// The same as HTTP Basic, for the token endpoint (marked sensitive).
    basic: ::http::HeaderValue,
}

impl ServiceClient {
    fn new(client_id: String, client_secret: String) -> anyhow::Result<Self> {
        let basic = http::basic(&format!("{client_id}:{client_secret}"))?;
        Ok(Self {
            client_id,
            client_secret,
            basic,
        })
    }

    /// The `authorization` header of its grants on `POST /oauth2/token`.
    pub(super) fn basic(&self) -> &::http::HeaderValue {
        &self.basic
    }

    /// The form of its client-credential grant on `POST /oauth2/token`, for
    /// [`AUDIENCE`] (the credentials go in [`Self::basic`]).
    pub(super) fn token_endpoint_form(&self) -> [(&'static str, &'static str); 2] {
        [("grant_type", "client_credentials"), ("audience", AUDIENCE)]
    }

    /// Its `IssueServiceToken` for [`AUDIENCE`]: a client-credential grant, or with
    /// `subject_token` an exchange of that token.
    pub(super) fn grant(&self, subject_token: Option<&str>) -> IssueServiceTokenRequest {
        IssueServiceTokenRequest {
            client_id: self.client_id.clone(),
            client_secret: self.client_secret.clone(),
            audience: AUDIENCE.into(),
            subject_token: subject_token.unwrap_or_default().into(),
            ..Default::default()
        }
    }
}

/// Setup requests (registering the pool, logging in for tokens) in flight at once:
/// enough to keep a server's hash threads busy without filling its queue.
const SETUP_PARALLELISM: usize = 8;

/// How long setup keeps retrying a request the server refused for being full.
const SETUP_PATIENCE: Duration = Duration::from_secs(60);

/// What the requests of a run are built from.
pub(super) struct Fixtures {
    /// Random, so names from different runs never collide.
    run_id: String,
    /// Numbers new usernames for registrations.
    registered: AtomicU64,
    /// Users for logins (all with [`PASSWORD`]).
    pub(super) users: Vec<String>,
    /// Tokens for validations (validate-service: service tokens), checks and
    /// exchanges.
    pub(super) tokens: Vec<String>,
    /// The service accounts of grants and exchanges.
    pub(super) clients: Vec<ServiceClient>,
    /// Envoy's Check request for each token, encoded ([`check::encoded_request`]),
    /// when the mix has checks.
    pub(super) checks: Vec<Bytes>,
    /// The refresh token of each session started during setup, for refreshes: held
    /// while one is in flight (a refresh token is used by one request at a time),
    /// replaced by the one its answer carries.
    pub(super) refresh_tokens: Vec<tokio::sync::Mutex<String>>,
    /// The `x-forwarded-for` values of `--forwarded-for` (none without it). The
    /// tokens, checks and refresh tokens above are in the order of `users`, so the
    /// index of any of them is its user's.
    pub(super) forwarded: Forwarded,
}

impl Fixtures {
    /// A username never registered before, and its number: registration n of the
    /// run, on behalf of address n (mod N) with `--forwarded-for`.
    pub(super) fn new_username(&self) -> (String, usize) {
        let n = self.registered.fetch_add(1, Ordering::Relaxed);
        (
            format!("{}-r{n}", self.run_id),
            usize::try_from(n).unwrap_or(usize::MAX),
        )
    }
}

/// Registers the login pool and collects tokens, as far as the mix needs them.
pub(super) async fn prepare(
    plan: &Plan,
    mix: &Mix,
    via: Via<'_>,
    progress: &Progress,
) -> anyhow::Result<Fixtures> {
    let run_id = format!("ab{:08x}", rand::random::<u32>());
    // The values each protocol of the run needs: gRPC for authd (setup included),
    // HTTP/1.1 for --protocol http and the checks of --forward-auth.
    let forwarded = match plan.forwarded_for {
        Some(n) => Forwarded::new(
            n,
            plan.protocol.is_authd(),
            plan.protocol.over_http1() || plan.check_url().is_some(),
        ),
        None => Forwarded::default(),
    };
    // validate-service validates service tokens, granted below, not users'.
    let service_tokens = plan.scenario == Scenario::ValidateService;
    let needs_sessions = (mix.uses(Operation::Validate) && !service_tokens)
        || mix.uses(Operation::Refresh)
        || mix.uses(Operation::Check)
        || mix.uses(Operation::Exchange);
    let needs_users = mix.uses(Operation::Login) || needs_sessions;
    let users: Vec<String> = if needs_users {
        (0..plan.users).map(|i| format!("{run_id}-u{i}")).collect()
    } else {
        Vec::new()
    };
    if !users.is_empty() {
        progress.phase(format!("registering {} users for logins", users.len()));
        match via {
            Via::Grpc(channels) => register_over_grpc(channels, &users, &forwarded).await?,
            Via::Http(target) => register_over_http(target, &users, &forwarded).await?,
        }
    }

    let mut sessions = Vec::new();
    if needs_sessions {
        let Via::Grpc(channels) = via else {
            bail!("tokens for validations, checks and refreshes are prepared only over gRPC");
        };
        let client = |i: usize| AuthServiceClient::new(channels[i % channels.len()].clone());
        progress.phase(format!("logging in {} users for tokens", users.len()));
        let jobs = users.iter().cloned().enumerate().map(|(i, username)| {
            let mut client = client(i);
            let forwarded = forwarded.grpc(i).cloned();
            async move {
                let mut patience = Patience::new();
                loop {
                    let mut request = Request::new(LoginRequest {
                        username: username.clone(),
                        password: PASSWORD.into(),
                    });
                    stamp(&mut request, forwarded.as_ref());
                    match client.login(request).await {
                        Ok(response) => {
                            let response = response.into_inner();
                            return Ok((response.access_token, response.refresh_token));
                        }
                        Err(status) if patience.wait_after(status.code()).await => {}
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
    let (mut tokens, refresh_tokens): (Vec<String>, Vec<String>) = sessions.into_iter().unzip();

    let clients = if plan.needs_service_accounts() {
        create_service_accounts(plan, &run_id, progress).await?
    } else {
        Vec::new()
    };
    if service_tokens {
        let Via::Grpc(channels) = via else {
            bail!("service tokens for validations are granted only over gRPC");
        };
        tokens = grant_service_tokens(channels, &clients, plan.users, &forwarded, progress).await?;
    }

    let checks = if mix.uses(Operation::Check) {
        tokens
            .iter()
            .map(|token| check::encoded_request(token))
            .collect()
    } else {
        Vec::new()
    };
    Ok(Fixtures {
        run_id,
        registered: AtomicU64::new(0),
        users,
        tokens,
        clients,
        checks,
        refresh_tokens: refresh_tokens
            .into_iter()
            .map(tokio::sync::Mutex::new)
            .collect(),
        forwarded,
    })
}

/// Creates `plan.accounts` service accounts through the admin API, each allowed
/// [`AUDIENCE`] and with one client secret.
async fn create_service_accounts(
    plan: &Plan,
    run_id: &str,
    progress: &Progress,
) -> anyhow::Result<Vec<ServiceClient>> {
    let (Some(url), Some(key)) = (&plan.admin, &plan.admin_key) else {
        bail!(
            "service accounts are created through the admin API: --admin and AUTHBENCH_ADMIN_KEY"
        );
    };
    progress.phase(format!("creating {} service accounts", plan.accounts));
    let channel = admin_channel(plan, url).await?;
    let authorization = admin_authorization(key)?;
    let jobs = (0..plan.accounts).map(|i| {
        let mut admin = AdminServiceClient::new(channel.clone());
        let authorization = authorization.clone();
        let client_id = format!("{run_id}-s{i}");
        async move {
            let mut patience = Patience::new();
            loop {
                let mut request = Request::new(CreateServiceAccountRequest {
                    name: client_id.clone(),
                    audiences: vec![AUDIENCE.into()],
                    scopes: vec![AUDIENCE.into()],
                    with_secret: true,
                    ..Default::default()
                });
                request
                    .metadata_mut()
                    .insert("authorization", authorization.clone());
                match admin.create_service_account(request).await {
                    Ok(response) => {
                        let client_secret = response.into_inner().client_secret;
                        return ServiceClient::new(client_id, client_secret);
                    }
                    Err(status) if patience.wait_after(status.code()).await => {}
                    Err(status) => bail!(
                        "creating the service account {client_id}: {}",
                        describe_status(&status)
                    ),
                }
            }
        }
    });
    run_bounded(jobs).await
}

/// A connection to the admin port at `url` (`--admin`).
pub(super) async fn admin_channel(plan: &Plan, url: &str) -> anyhow::Result<Channel> {
    Channel::from_shared(url.to_owned())
        .with_context(|| format!("--admin {url}"))?
        .connect_timeout(plan.connect_timeout)
        .connect()
        .await
        .with_context(|| format!("connecting to the admin port {url}"))
}

/// The `authorization` metadata of the admin key (`AUTHBENCH_ADMIN_KEY`), marked
/// sensitive; an error never shows the key.
pub(super) fn admin_authorization(key: &str) -> anyhow::Result<MetadataValue<Ascii>> {
    let mut authorization: MetadataValue<Ascii> = format!("Bearer {key}")
        .parse()
        .map_err(|_| anyhow::anyhow!("AUTHBENCH_ADMIN_KEY is not a valid header value"))?;
    authorization.set_sensitive(true);
    Ok(authorization)
}

/// Grants `count` service tokens, the accounts taking turns, for validate-service.
async fn grant_service_tokens(
    channels: &[Channel],
    clients: &[ServiceClient],
    count: usize,
    forwarded: &Forwarded,
    progress: &Progress,
) -> anyhow::Result<Vec<String>> {
    progress.phase(format!("granting {count} service tokens"));
    let jobs = (0..count).map(|i| {
        let mut auth = AuthServiceClient::new(channels[i % channels.len()].clone());
        let client = &clients[i % clients.len()];
        let (client_id, message) = (client.client_id.clone(), client.grant(None));
        let forwarded = forwarded.grpc(i).cloned();
        async move {
            let mut patience = Patience::new();
            loop {
                let mut request = Request::new(message.clone());
                stamp(&mut request, forwarded.as_ref());
                match auth.issue_service_token(request).await {
                    Ok(response) => return Ok(response.into_inner().access_token),
                    Err(status) if patience.wait_after(status.code()).await => {}
                    Err(status) => bail!(
                        "preparing service tokens: granting one to {client_id}: {}",
                        describe_status(&status)
                    ),
                }
            }
        }
    });
    run_bounded(jobs).await
}

async fn register_over_grpc(
    channels: &[Channel],
    users: &[String],
    forwarded: &Forwarded,
) -> anyhow::Result<()> {
    let jobs = users.iter().cloned().enumerate().map(|(i, username)| {
        let mut client = AuthServiceClient::new(channels[i % channels.len()].clone());
        let forwarded = forwarded.grpc(i).cloned();
        async move {
            let mut patience = Patience::new();
            loop {
                let mut request = Request::new(RegisterRequest {
                    username: username.clone(),
                    password: PASSWORD.into(),
                });
                stamp(&mut request, forwarded.as_ref());
                match client.register(request).await {
                    Ok(_) => return Ok(()),
                    Err(status) if patience.wait_after(status.code()).await => {}
                    Err(status) => bail!(
                        "preparing the login pool: registering {username}: {}",
                        describe_status(&status)
                    ),
                }
            }
        }
    });
    run_bounded(jobs).await?;
    Ok(())
}

/// Registers `users` with `POST /register`, over at most [`SETUP_PARALLELISM`]
/// keep-alive connections: each job borrows one from a shared pool.
async fn register_over_http(
    target: &Arc<http::Target>,
    users: &[String],
    forwarded: &Forwarded,
) -> anyhow::Result<()> {
    let pool: Arc<Mutex<Vec<Connection>>> = Arc::default();
    let jobs = users.iter().cloned().enumerate().map(|(i, username)| {
        let pool = pool.clone();
        let target = target.clone();
        let forwarded = forwarded.http(i).cloned();
        async move {
            let taken = pool.lock().unwrap_or_else(|p| p.into_inner()).pop();
            let mut connection = taken.unwrap_or_else(|| Connection::new(target));
            let mut patience = Patience::new();
            let body = http::credentials(&username);
            loop {
                let answer = connection
                    .post("/register", body.clone(), forwarded.as_ref())
                    .await
                    .with_context(|| format!("preparing the login pool: registering {username}"))?;
                let code = http_code(answer.status);
                if code == Code::Ok {
                    break;
                }
                if !patience.wait_after(code).await {
                    bail!(
                        "preparing the login pool: registering {username}: POST /register \
                         answered {}",
                        answer.status
                    );
                }
            }
            pool.lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(connection);
            Ok(())
        }
    });
    run_bounded(jobs).await?;
    Ok(())
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

    /// Whether to try again after an answer of `code`; if so, first waits a little.
    async fn wait_after(&mut self, code: Code) -> bool {
        let transient = matches!(code, Code::ResourceExhausted | Code::Unavailable);
        if !transient || Instant::now() >= self.give_up_at {
            return false;
        }
        tokio::time::sleep(self.pause).await;
        self.pause = (self.pause * 2).min(Duration::from_secs(1));
        true
    }
}
