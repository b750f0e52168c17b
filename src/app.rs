//! Wiring: [`Application::build`] creates the metrics registry, opens the store,
//! starts the hash pool, binds the gRPC and metrics listeners (port 0 works) and
//! assembles the tonic server; [`Application::run_until_stopped`] serves until the
//! shutdown future resolves, then drains and flushes.
//!
//! `main.rs` and every integration test start authd through this same code.

use crate::{
    access,
    accounts::{Accounts, SessionSettings},
    admission::{self, Admission, AdmissionSettings},
    audit::Audit,
    blocklist::Blocklist,
    config::{Config, DatabaseUrl},
    grpc::{AuthApi, MAX_MESSAGE_BYTES},
    health,
    metrics::{self, Metrics},
    otel::Traces,
    password::{HashPool, Hasher, PoolSnapshot},
    pb::{self, auth_service_server::AuthServiceServer},
    pushback::{self, Pushback, PushbackSettings},
    ratelimit::{self, RateLimitStats, RateLimiter, Settings as RateLimitSettings},
    shared_redis::SharedRedis,
    store::{PostgresSettings, SqliteSettings, Store, StoreSettings, WriterSnapshot},
    throttle::{Settings as ThrottleSettings, Throttle, UsernameDigest},
    token::{
        self, KeyRing, LiveKeyRing, Tokens,
        keyfile::{self, KeyFile},
    },
    trace,
    transport::{
        self, Limits, Protocol,
        tls::{ServerTls, TlsFiles},
    },
};
use anyhow::Context as _;
use std::{future::Future, net::SocketAddr, sync::Arc, time::Duration};
use tokio::{net::TcpListener, sync::watch};
use tonic::service::Routes;
use tower::Layer as _;

/// How long, after the drain, the server may take to close its connections.
const CLOSE_TIMEOUT: Duration = Duration::from_secs(5);

/// The gRPC framing of a message: a flag byte and a 4-byte length.
const GRPC_FRAME_HEADER: usize = 5;

/// File descriptors kept free for the database, Redis, the other listeners and logs
/// when the connection cap is fitted under the process's limit.
const RESERVED_FDS: u64 = 256;

/// A built, bound, not yet serving authd.
pub struct Application {
    listener: TcpListener,
    local_addr: SocketAddr,
    accounts: Arc<Accounts>,
    admission: Arc<Admission>,
    pushback: Arc<Pushback>,
    rate_limiter: Arc<RateLimiter>,
    blocklist: Arc<Blocklist>,
    metrics: Arc<Metrics>,
    key_ring: LiveKeyRing,
    key_file: Option<Arc<KeyFile>>,
    traces: Option<Arc<Traces>>,
    metrics_listener: Option<TcpListener>,
    metrics_addr: Option<SocketAddr>,
    health_listener: Option<std::net::TcpListener>,
    health_addr: Option<SocketAddr>,
    limits: Limits,
    tls: Option<Arc<ServerTls>>,
    config: Config,
}

/// A cheap handle on a running application's internals, for tests and tools.
#[derive(Clone)]
pub struct AppHandle {
    accounts: Arc<Accounts>,
    admission: Arc<Admission>,
    pushback: Arc<Pushback>,
    rate_limiter: Arc<RateLimiter>,
    metrics: Arc<Metrics>,
    key_file: Option<Arc<KeyFile>>,
    metrics_addr: Option<SocketAddr>,
    health_addr: Option<SocketAddr>,
}

impl AppHandle {
    /// Re-reads `AUTHD_TOKEN_KEYS_FILE` now, as the periodic reload does: `Ok(true)` when
    /// a new ring is in use, `Ok(false)` when the file is unchanged (or no file is
    /// configured), the reason when the file was refused and the old ring kept.
    pub async fn reload_token_keys(&self) -> Result<bool, String> {
        let Some(file) = self.key_file.clone() else {
            return Ok(false);
        };
        match tokio::task::spawn_blocking(move || file.check()).await {
            Ok(keyfile::Reload::Reloaded) => Ok(true),
            Ok(keyfile::Reload::Unchanged) => Ok(false),
            Ok(keyfile::Reload::Refused(why)) => Err(why),
            Err(e) => Err(format!("the reload task failed: {e}")),
        }
    }

    /// Where `GET /metrics` answers (`None` when the endpoint is off).
    pub fn metrics_addr(&self) -> Option<SocketAddr> {
        self.metrics_addr
    }

    /// Where the health-only port answers (`None` when it is off).
    pub fn health_addr(&self) -> Option<SocketAddr> {
        self.health_addr
    }

    /// The application's metrics, as the endpoint would show them now.
    pub fn render_metrics(&self) -> String {
        self.metrics.render()
    }

    /// Counters of the password hashing pool.
    pub fn hash_stats(&self) -> PoolSnapshot {
        self.accounts.hasher().pool().stats()
    }

    /// Hash jobs waiting for a hashing thread now.
    pub fn hash_queued(&self) -> usize {
        self.accounts.hasher().pool().queued()
    }

    /// Counters of the SQLite writer (`None` on other backends).
    pub fn writer_stats(&self) -> Option<WriterSnapshot> {
        self.accounts.store().writer_stats()
    }

    /// AuthService requests admitted and not yet answered.
    pub fn in_flight(&self) -> usize {
        self.admission.in_flight()
    }

    /// AuthService requests open (being received or in flight) for one client.
    pub fn open_for(&self, client: std::net::IpAddr) -> u32 {
        self.admission.open_for(client)
    }

    /// Refused requests held on a timer before their answer, now.
    pub fn refusals_held(&self) -> u32 {
        self.pushback.held()
    }

    /// Counters of the rate limiter, and which backend decides now.
    pub fn rate_limit_stats(&self) -> RateLimitStats {
        self.rate_limiter.stats()
    }
}

/// Opens the configured store (migrating it) without serving: `authd migrate`.
pub async fn migrate(config: &Config) -> anyhow::Result<()> {
    Store::migrate(&store_settings(config)).await
}

fn store_settings(config: &Config) -> StoreSettings {
    match &config.database_url {
        DatabaseUrl::Sqlite(path) => StoreSettings::Sqlite(SqliteSettings {
            path: path.clone(),
            readers: config.db_max_connections,
            acquire_timeout: config.db_acquire_timeout,
            max_batch: config.sqlite_max_batch as usize,
            statement_timeout: config.db_statement_timeout,
        }),
        DatabaseUrl::Postgres(url) => StoreSettings::Postgres(PostgresSettings {
            url: url.expose().to_owned(),
            max_connections: config.db_max_connections,
            acquire_timeout: config.db_acquire_timeout,
            statement_timeout: config.db_statement_timeout,
        }),
    }
}

impl Application {
    pub async fn build(config: Config) -> anyhow::Result<Self> {
        // The key file is read here rather than by `config.key_ring`: the watcher needs
        // the digest of the content in use.
        let mut key_file_digest = None;
        let keys = match (&config.token_keys, &config.token_keys_file) {
            (Some(keys), _) => keys.clone(),
            (None, Some(path)) => {
                let (keys, digest) = keyfile::load(path)?;
                key_file_digest = Some((path.clone(), digest));
                keys
            }
            (None, None) => {
                tracing::warn!(
                    "no token keys configured (AUTHD_TOKEN_KEYS): using a random key; tokens will \
                     not survive a restart and will not be accepted by other replicas"
                );
                KeyRing::random()
            }
        };
        // One registry per application, never the process-wide default: tests run
        // several applications in one process and count each one's requests.
        let metrics = Arc::new(Metrics::new());
        // Before anything is opened: a bad certificate or key stops the start with
        // one line naming the option.
        let tls = match (&config.tls_cert, &config.tls_key) {
            (Some(cert), Some(key)) => {
                let files = TlsFiles {
                    cert: cert.clone(),
                    key: key.clone(),
                    client_ca: config.tls_client_ca.clone(),
                };
                Some(ServerTls::load(files, metrics.tls.clone())?)
            }
            (None, None) => None,
            _ => anyhow::bail!(
                "--tls-cert (AUTHD_TLS_CERT) and --tls-key (AUTHD_TLS_KEY) go together"
            ),
        };
        if tls.is_none() && (config.tls_client_ca.is_some() || config.tls_allow.is_some()) {
            anyhow::bail!(
                "--tls-client-ca (AUTHD_TLS_CLIENT_CA) and --tls-allow (AUTHD_TLS_ALLOW) need \
                 --tls-cert and --tls-key"
            );
        }
        if config.tls_allow.is_some() && config.tls_client_ca.is_none() {
            anyhow::bail!(
                "--tls-allow (AUTHD_TLS_ALLOW) needs --tls-client-ca (AUTHD_TLS_CLIENT_CA)"
            );
        }
        // This application's traces (none without OTEL_EXPORTER_OTLP_ENDPOINT).
        let traces = Traces::start(&config.trace_settings(), &metrics)?.map(Arc::new);
        // Before the store: a bad list file stops the start before anything is opened.
        let blocklist = Arc::new(Blocklist::new(
            config.password_blocklist.is_on(),
            config.password_blocklist_file.as_deref(),
            &metrics,
        )?);
        let store = Store::open(store_settings(&config), &metrics).await?;
        let engine = config.hash_backend.engine()?;
        let pool = HashPool::new(
            config.hash_threads(),
            config.hash_queue(),
            config.hash_thread_nice,
            engine,
            &metrics,
        )
        .context("starting the password hashing threads")?
        .with_queue_wait(config.hash_queue_wait);
        let hasher = Hasher::new(config.pbkdf2_iterations, pool)?;
        let tokens = Tokens::new(keys.clone(), config.token_ttl, &metrics)
            .with_audience(&config.token_audience)
            .with_clock_skew(config.token_clock_skew);
        let key_ring = tokens.key_ring().clone();
        let key_file = key_file_digest
            .map(|(path, digest)| Arc::new(KeyFile::new(path, digest, key_ring.clone(), &metrics)));
        // Names accounts in the throttle's Redis keys and in audit events.
        let digest = match &config.account_digest_key {
            Some(key) => UsernameDigest::from_key(key),
            None => UsernameDigest::new(keys.derive_key(UsernameDigest::LABEL)),
        };
        // One Redis connection for the rate limiter and the login throttle.
        let redis = config
            .redis_url
            .as_ref()
            .map(SharedRedis::open)
            .transpose()?;
        let throttle = Throttle::new(
            throttle_settings(&config, redis.clone())?,
            digest.clone(),
            metrics.throttle.clone(),
        )?;
        throttle.connect().await;
        let sessions = SessionSettings {
            refresh_ttl: config.refresh_ttl,
            token_ttl: config.token_ttl,
        };
        let accounts = Arc::new(Accounts::new(
            Arc::new(store),
            hasher,
            tokens,
            throttle,
            Audit::new(digest),
            sessions,
            &metrics,
        ));
        // Failed logins cost as much as the most expensive stored hash from the first.
        accounts
            .refresh_hash_cost()
            .await
            .map_err(|e| anyhow::anyhow!("reading the highest stored password hash cost: {e}"))?;
        let listener = TcpListener::bind(config.listen)
            .await
            .with_context(|| format!("cannot listen on {}", config.listen))?;
        let local_addr = listener.local_addr()?;
        let metrics_listener = match config.metrics_listen.addr() {
            Some(addr) => Some(transport::bind(addr, "metrics").await?),
            None => None,
        };
        let metrics_addr = match &metrics_listener {
            Some(listener) => Some(listener.local_addr()?),
            None => None,
        };
        // A std listener: it is served by a runtime of its own, on its own thread.
        let health_listener = match config.health_listen.addr() {
            Some(addr) => Some(
                std::net::TcpListener::bind(addr)
                    .map_err(|e| anyhow::anyhow!("cannot listen for health on {addr}: {e}"))?,
            ),
            None => None,
        };
        let health_addr = match &health_listener {
            Some(listener) => Some(listener.local_addr()?),
            None => None,
        };
        let limits = connection_limits(&config);
        // Never fails on a Redis outage: the limiter starts degraded and keeps trying.
        let rate_limiter =
            RateLimiter::start(rate_limit_settings(&config, redis), &metrics).await?;
        let admission = Admission::new(
            AdmissionSettings {
                max_in_flight: config.max_in_flight,
                max_per_client: config.max_in_flight_per_client(),
                receive_timeout: config.receive_timeout,
                max_body_bytes: MAX_MESSAGE_BYTES + GRPC_FRAME_HEADER,
                trust_forwarded_for: config.trust_forwarded_for,
            },
            metrics.pushback.clone(),
        );
        let pushback = Pushback::new(
            PushbackSettings {
                max_hold: config.refusal_hold,
                rate: config.refusal_rate,
                max_held: config.refusal_hold_max,
                max_held_per_client: config.refusal_hold_max_per_client(),
                trust_forwarded_for: config.trust_forwarded_for,
            },
            metrics.pushback.clone(),
        );
        Ok(Self {
            listener,
            local_addr,
            accounts,
            admission,
            pushback,
            rate_limiter,
            blocklist,
            metrics,
            key_ring,
            key_file,
            traces,
            metrics_listener,
            metrics_addr,
            health_listener,
            health_addr,
            limits,
            tls,
            config,
        })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    pub fn port(&self) -> u16 {
        self.local_addr.port()
    }

    /// Where `GET /metrics` answers (`None` when `AUTHD_METRICS_LISTEN` is empty).
    pub fn metrics_addr(&self) -> Option<SocketAddr> {
        self.metrics_addr
    }

    /// Where the health-only port answers (`None` when `AUTHD_HEALTH_LISTEN` is empty).
    pub fn health_addr(&self) -> Option<SocketAddr> {
        self.health_addr
    }

    pub fn handle(&self) -> AppHandle {
        AppHandle {
            accounts: self.accounts.clone(),
            admission: self.admission.clone(),
            pushback: self.pushback.clone(),
            rate_limiter: self.rate_limiter.clone(),
            metrics: self.metrics.clone(),
            key_file: self.key_file.clone(),
            metrics_addr: self.metrics_addr,
            health_addr: self.health_addr,
        }
    }

    /// Serves until `shutdown` resolves, then: reports NOT_SERVING, refuses new work
    /// while the work in flight finishes (at most the drain timeout), closes the
    /// connections and commits everything the store has queued.
    pub async fn run_until_stopped(
        self,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> anyhow::Result<()> {
        let Self {
            listener,
            local_addr,
            accounts,
            admission,
            pushback,
            rate_limiter,
            blocklist,
            metrics,
            key_ring,
            key_file,
            traces,
            metrics_listener,
            metrics_addr,
            health_listener,
            health_addr,
            limits,
            tls,
            config,
        } = self;
        let store = accounts.store().clone();

        // The gRPC port stops after the drain; the health and metrics ports answer from
        // now until the very end, the drain included.
        let (stop_serving, serving_stopped) = watch::channel(false);
        let (stop_auxiliary, auxiliary_stopped) = watch::channel(false);
        let auxiliary = Limits::auxiliary(&limits);
        let metrics_server = metrics_listener.map(|listener| {
            tokio::spawn(transport::serve(
                "metrics",
                listener,
                Protocol::Http1,
                None,
                auxiliary.clone(),
                metrics.listener("metrics"),
                metrics::router(metrics.clone()).merge(token::jwks_router(key_ring.clone())),
                auxiliary_stopped.clone(),
            ))
        });
        let key_file_watcher =
            key_file.map(|file| file.spawn(config.token_keys_reload, auxiliary_stopped.clone()));

        let (reporter, health_service) = tonic_health::server::health_reporter();
        health::report_alive(&reporter).await;
        let first = health::probe(&accounts).await;
        if let Err(why) = &first {
            tracing::error!(error = %why, "the database does not answer: NOT_SERVING");
        }
        health::report(&reporter, first.is_ok(), &metrics.serving).await;
        // Revocations from every replica, and the purge of old sessions.
        let upkeep = tokio::spawn(accounts.clone().upkeep(config.revocation_delay / 2));
        let checker = health::spawn_checker(
            reporter.clone(),
            accounts.clone(),
            config.health_interval,
            first.is_ok(),
            metrics.serving.clone(),
        );
        let health_server = match health_listener {
            Some(listener) => Some(spawn_health_server(
                listener,
                auxiliary,
                trace::layer(metrics.clone(), traces.clone()).layer(health_service.clone()),
                metrics.listener("health"),
                auxiliary_stopped,
            )?),
            None => None,
        };

        let reflection = || {
            tonic_reflection::server::Builder::configure()
                .register_encoded_file_descriptor_set(pb::FILE_DESCRIPTOR_SET)
                .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
                // google.rpc error details, so clients can decode BadRequest and RetryInfo.
                .register_encoded_file_descriptor_set(tonic_types::pb::FILE_DESCRIPTOR_SET)
        };
        // grpcurl 1.8 speaks only v1alpha; newer clients use v1.
        let reflection_v1 = reflection().build_v1()?;
        let reflection_v1alpha = reflection().build_v1alpha()?;
        let auth = AuthServiceServer::new(AuthApi::new(
            accounts.clone(),
            blocklist,
            config.trust_forwarded_for,
        ))
        .max_decoding_message_size(MAX_MESSAGE_BYTES);
        let routes = Routes::new(health_service)
            .add_service(reflection_v1)
            .add_service(reflection_v1alpha)
            .add_service(auth);
        let grpc = tower::ServiceBuilder::new()
            .map_request(|request: http::Request<hyper::body::Incoming>| {
                request.map(tonic::body::Body::new)
            })
            // Outermost: every request, refused or not, gets an id, a log line and metrics.
            .layer(trace::layer(metrics.clone(), traces.clone()))
            // A refusal with a retry hint, from any layer below, is held before its answer.
            .layer(pushback::layer(pushback.clone()))
            // Mutual TLS: an identity not allowed for the method costs nothing further.
            .layer(access::layer(config.tls_allow.clone().unwrap_or_default()))
            // Then: a request refused by a rate limit never takes an admission slot.
            .layer(ratelimit::layer(rate_limiter))
            .layer(admission::layer(admission.clone()))
            .service(routes);
        // Stops when the gRPC port does.
        let reloader = tls
            .as_ref()
            .map(|tls| tls.spawn_reloader(config.tls_reload, serving_stopped.clone()));
        let mut server = tokio::spawn(transport::serve(
            "grpc",
            listener,
            Protocol::Http2,
            tls.clone(),
            limits.clone(),
            metrics.listener("grpc"),
            grpc,
            serving_stopped,
        ));
        tracing::info!(
            listen = %local_addr,
            health = %health_addr.map_or_else(|| "off".to_owned(), |a| a.to_string()),
            metrics = %metrics_addr.map_or_else(|| "off".to_owned(), |a| a.to_string()),
            database = %config.database_url,
            pbkdf2_iterations = config.pbkdf2_iterations,
            hash_threads = config.hash_threads(),
            hash_backend = accounts.hasher().pool().engine().backend().name(),
            hash_lanes = accounts.hasher().pool().engine().lanes(),
            hash_queue = config.hash_queue(),
            max_connections = limits.max_connections,
            tls = match (&tls, &config.tls_client_ca) {
                (None, _) => "off",
                (Some(_), None) => "on",
                (Some(_), Some(_)) => "mutual",
            },
            token_kid = key_ring.current().signing_kid(),
            token_alg = key_ring.current().signing_algorithm().jose_name(),
            "authd is serving"
        );

        let served = tokio::select! {
            () = shutdown => None,
            result = &mut server => Some(result),
        };
        if let Some(result) = served {
            // The server stopped on its own: that is an error, not a shutdown.
            checker.abort();
            if let Some(reloader) = reloader {
                reloader.abort();
            }
            upkeep.abort();
            store.close().await;
            stop_auxiliary_servers(stop_auxiliary, metrics_server, health_server).await;
            if let Some(watcher) = key_file_watcher {
                watcher.abort();
            }
            result.context("the gRPC server task failed")?;
            anyhow::bail!("the gRPC server stopped unexpectedly");
        }

        tracing::info!(
            in_flight = admission.in_flight(),
            "shutting down: draining requests in flight"
        );
        health::report(&reporter, false, &metrics.serving).await;
        checker.abort();
        pushback.release();
        if !admission.drain(config.drain_timeout).await {
            tracing::warn!(
                in_flight = admission.in_flight(),
                drain_timeout = ?config.drain_timeout,
                "the drain timed out; abandoning the requests still in flight"
            );
        }
        let _ = stop_serving.send(true);
        upkeep.abort();
        match tokio::time::timeout(CLOSE_TIMEOUT, &mut server).await {
            Ok(result) => result.context("the gRPC server task failed")?,
            Err(_) => {
                tracing::warn!("connections did not close in time; closing them");
                server.abort();
            }
        }
        store.close().await;
        stop_auxiliary_servers(stop_auxiliary, metrics_server, health_server).await;
        if let Some(watcher) = key_file_watcher {
            watcher.abort();
        }
        tracing::info!("authd stopped");
        Ok(())
    }
}

/// What the login throttle needs from the configuration; refuses an across-clients
/// threshold that one client could reach alone.
fn throttle_settings(
    c: &Config,
    redis: Option<Arc<SharedRedis>>,
) -> anyhow::Result<ThrottleSettings> {
    if c.login_failures > 0 && c.login_account_failures <= c.login_failures {
        anyhow::bail!(
            "--login-account-failures ({}) must be greater than --login-failures ({}), so that \
             one client alone cannot throttle an account for everyone",
            c.login_account_failures,
            c.login_failures
        );
    }
    if c.login_delay > c.login_delay_max {
        anyhow::bail!("--login-delay must not be longer than --login-delay-max");
    }
    // A client's count must outlive the account count it fed, or a lone client
    // whose count expired could feed the account again.
    if c.login_account_delay_max > c.login_delay_max {
        anyhow::bail!("--login-account-delay-max must not be longer than --login-delay-max");
    }
    Ok(ThrottleSettings {
        failures: c.login_failures,
        delay: c.login_delay,
        delay_max: c.login_delay_max,
        account_failures: c.login_account_failures,
        account_delay_max: c.login_account_delay_max,
        max_entries: c.login_throttle_max_entries as usize,
        redis,
        prefix: format!("{}:", c.rate_limit_prefix),
        redis_timeout: c.redis_timeout,
        failure: c.rate_limit_failure,
    })
}

/// What the rate limiter needs from the configuration.
fn rate_limit_settings(c: &Config, redis: Option<Arc<SharedRedis>>) -> RateLimitSettings {
    RateLimitSettings {
        rules: (c.rate_limits.clone().unwrap_or_default()).with_register_limit(&c.register_limit),
        redis,
        prefix: c.rate_limit_prefix.clone(),
        redis_timeout: c.redis_timeout,
        failure: c.rate_limit_failure,
        trust_forwarded_for: c.trust_forwarded_for,
        max_local_keys: c.rate_limit_max_keys as usize,
    }
}

/// The bounds of the gRPC port's connections, from the configuration, with the
/// connection cap fitted under the process's file-descriptor limit (raised to its
/// hard limit first): running out of descriptors would fail accepts, database
/// connections and log files alike.
fn connection_limits(config: &Config) -> Limits {
    let mut max_connections = u64::from(config.max_connections);
    if let Some(fds) = transport::raise_fd_limit() {
        let fits =
            fds.saturating_sub(RESERVED_FDS + transport::AUXILIARY_MAX_CONNECTIONS as u64 * 2);
        if max_connections > fits {
            tracing::warn!(
                max_connections,
                fd_limit = fds,
                "AUTHD_MAX_CONNECTIONS is above what the open-file limit allows; using {fits}"
            );
            max_connections = fits.max(1);
        }
    }
    let max_connections = max_connections as usize;
    Limits {
        max_connections,
        max_connections_per_client: (config.max_connections_per_client() as usize)
            .min(max_connections),
        handshake_timeout: config.handshake_timeout,
        idle_timeout: config.idle_timeout,
        keepalive_interval: Some(config.keepalive_interval),
        keepalive_timeout: config.keepalive_timeout,
        max_concurrent_streams: config.max_streams_per_connection,
    }
}

/// Serves `service` (health only) on `listener` from a thread of its own with a
/// single-threaded runtime: however busy the main runtime's workers are with
/// AuthService requests, probes are answered by a thread that does nothing else.
fn spawn_health_server<S, B>(
    listener: std::net::TcpListener,
    limits: Limits,
    service: S,
    metrics: metrics::ListenerMetrics,
    stopped: watch::Receiver<bool>,
) -> anyhow::Result<std::thread::JoinHandle<()>>
where
    S: tower::Service<
            http::Request<tonic::body::Body>,
            Response = http::Response<B>,
            Error = std::convert::Infallible,
        > + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
    B: http_body::Body<Data = bytes::Bytes> + Send + 'static,
    B::Error: Into<transport::BoxError>,
{
    listener.set_nonblocking(true)?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the health runtime")?;
    let service = tower::ServiceBuilder::new()
        .map_request(|request: http::Request<hyper::body::Incoming>| {
            request.map(tonic::body::Body::new)
        })
        .service(service);
    let thread = std::thread::Builder::new()
        .name("authd-health".into())
        .spawn(move || {
            runtime.block_on(async move {
                // Registered with this thread's runtime, so it is polled here.
                match TcpListener::from_std(listener) {
                    Ok(listener) => {
                        transport::serve(
                            "health",
                            listener,
                            Protocol::Http2,
                            // Always plaintext: for probes (the kubelet's speaks no TLS).
                            None,
                            limits,
                            metrics,
                            service,
                            stopped,
                        )
                        .await
                    }
                    Err(e) => tracing::error!(error = %e, "the health port cannot be served"),
                }
            })
        })
        .context("starting the health thread")?;
    Ok(thread)
}

/// Stops the health and metrics ports and waits (briefly) for them.
async fn stop_auxiliary_servers(
    stop: watch::Sender<bool>,
    metrics_server: Option<tokio::task::JoinHandle<()>>,
    health_server: Option<std::thread::JoinHandle<()>>,
) {
    let _ = stop.send(true);
    if let Some(mut server) = metrics_server
        && tokio::time::timeout(CLOSE_TIMEOUT, &mut server)
            .await
            .is_err()
    {
        server.abort();
    }
    if let Some(thread) = health_server {
        // `serve` returns within its close grace once stopped.
        let _ = tokio::task::spawn_blocking(move || thread.join()).await;
    }
}
