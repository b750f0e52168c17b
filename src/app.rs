//! Wiring: [`Application::build`] creates the metrics registry, opens the store,
//! starts the hash pool, binds the gRPC and metrics listeners (port 0 works) and
//! assembles the tonic server; [`Application::run_until_stopped`] serves until the
//! shutdown future resolves, then drains and flushes.
//!
//! `main.rs` and every integration test start authd through this same code.

use crate::{
    accounts::Accounts,
    admin::{AdminApi, AdminSettings},
    audit::Audit,
    blocklist::Blocklist,
    config::Config,
    extauthz::{self, AuthorizationApi, Authorizer},
    grpc::{AuthApi, MAX_MESSAGE_BYTES},
    health,
    layers::{
        access,
        admission::{self, Admission},
        pushback::{self, Pushback},
        trace,
    },
    metrics::{self, Metrics},
    otel::Traces,
    password::PoolSnapshot,
    pb::{self, auth_service_server::AuthServiceServer},
    ratelimit::{self, RateLimitStats, RateLimiter},
    redis::SharedRedis,
    rpc::TrustedCallers,
    store::{Store, WriterSnapshot},
    throttle::Throttle,
    token::{self, LiveKeyRing, keyfile::KeyFile},
    transport::{self, Limits, Protocol, tls::ServerTls},
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

/// A built, bound, not yet serving authd.
pub struct Application {
    listener: TcpListener,
    local_addr: SocketAddr,
    accounts: Arc<Accounts>,
    admission: Arc<Admission>,
    pushback: Arc<Pushback>,
    rate_limiter: Arc<RateLimiter>,
    rate_limit_rules: Option<Arc<ratelimit::LiveRules>>,
    blocklist: Arc<Blocklist>,
    metrics: Arc<Metrics>,
    key_ring: LiveKeyRing,
    key_file: Option<Arc<KeyFile>>,
    traces: Option<Arc<Traces>>,
    metrics_listener: Option<TcpListener>,
    metrics_addr: Option<SocketAddr>,
    health_listener: Option<std::net::TcpListener>,
    health_addr: Option<SocketAddr>,
    /// The admin API's port and settings, when AUTHD_ADMIN_LISTEN is set.
    admin: Option<(TcpListener, AdminSettings)>,
    admin_addr: Option<SocketAddr>,
    /// The HTTP forward-auth port, when AUTHD_FORWARD_AUTH_LISTEN is set.
    forward_auth_listener: Option<TcpListener>,
    forward_auth_addr: Option<SocketAddr>,
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
    rate_limit_rules: Option<Arc<ratelimit::LiveRules>>,
    metrics: Arc<Metrics>,
    key_file: Option<Arc<KeyFile>>,
    metrics_addr: Option<SocketAddr>,
    health_addr: Option<SocketAddr>,
    admin_addr: Option<SocketAddr>,
    forward_auth_addr: Option<SocketAddr>,
}

impl AppHandle {
    /// Where `/forward-auth` answers (`None` while `AUTHD_FORWARD_AUTH_LISTEN` is off).
    pub fn forward_auth_addr(&self) -> Option<SocketAddr> {
        self.forward_auth_addr
    }

    /// Where the admin API answers (`None` while `AUTHD_ADMIN_LISTEN` is off).
    pub fn admin_addr(&self) -> Option<SocketAddr> {
        self.admin_addr
    }

    /// Re-reads `AUTHD_TOKEN_KEYS_FILE` now, as the periodic reload does: `Ok(true)` when
    /// a new ring is in use, `Ok(false)` when the file is unchanged (or no file is
    /// configured), the reason when the file was refused and the old ring kept.
    pub async fn reload_token_keys(&self) -> Result<bool, String> {
        match self.key_file.clone() {
            Some(file) => file.check_now().await,
            None => Ok(false),
        }
    }

    /// Re-reads `AUTHD_RATE_LIMIT_RULES_FILE` now, as the periodic reload does:
    /// `Ok(true)` when new rules are in force, `Ok(false)` when the file is unchanged
    /// (or none is configured), the reason when it was refused and the rules kept.
    pub async fn reload_rate_limit_rules(&self) -> Result<bool, String> {
        match self.rate_limit_rules.clone() {
            Some(rules) => rules.check_now().await,
            None => Ok(false),
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
    Store::migrate(&config.store.settings()).await
}

/// The configured database's schema, read without changing it: `authd migrate
/// --status`.
pub async fn schema(config: &Config) -> anyhow::Result<crate::store::SchemaState> {
    Store::schema(&config.store.settings()).await
}

/// Whether a release can run on the configured database's schema, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RollbackVerdict {
    pub safe: bool,
    pub reason: String,
}

/// Whether authd `version` can run on the configured database's schema: `authd
/// migrate --check-rollback VERSION`. An unknown version is an error naming the
/// known ones.
pub async fn check_rollback(config: &Config, version: &str) -> anyhow::Result<RollbackVerdict> {
    use crate::store::RELEASES;
    let Some(release) = RELEASES.iter().find(|r| r.version == version).copied() else {
        let known: Vec<_> = RELEASES.iter().map(|r| r.version).collect();
        anyhow::bail!(
            "authd {version} is not a release this binary knows (it knows {})",
            known.join(", ")
        );
    };
    let state = schema(config).await?;
    Ok(match state.runs(release) {
        Ok(()) => RollbackVerdict {
            safe: true,
            reason: format!(
                "safe: authd {version} (schema level {}) runs on this schema (it requires \
                 level {}); it ignores the newer compatible migrations",
                release.level, state.requires_level
            ),
        },
        Err(why) => RollbackVerdict {
            safe: false,
            reason: format!("unsafe: {why}"),
        },
    })
}

impl Application {
    pub async fn build(config: Config) -> anyhow::Result<Self> {
        let keys = config.tokens.keys()?;
        // One registry per application, never the process-wide default: tests run
        // several applications in one process and count each one's requests.
        let metrics = Arc::new(Metrics::new());
        // The one clock of every component that reads the time.
        let clock = config.clock();
        // Before anything is opened: a bad certificate or key stops the start with
        // one line naming the option.
        let tls = config
            .tls
            .files()?
            .map(|files| ServerTls::load(files, metrics.tls.clone()))
            .transpose()?;
        // This application's traces (none without OTEL_EXPORTER_OTLP_ENDPOINT).
        let traces = Traces::start(&config.telemetry.trace_settings(), &metrics)?.map(Arc::new);
        // Before the store: a bad list file stops the start before anything is opened.
        let blocklist = Arc::new(config.passwords.blocklist(&metrics)?);
        let store = Store::open(config.store.settings(), &metrics, clock.clone()).await?;
        let hasher = config.passwords.hasher(&metrics)?;
        let tokens = config
            .tokens
            .tokens(keys.ring.clone(), &metrics, clock.clone());
        let key_ring = tokens.key_ring().clone();
        let key_file = keys.file.map(|(path, digest)| {
            Arc::new(KeyFile::for_ring(path, digest, key_ring.clone(), &metrics))
        });
        // Names accounts in the throttle's Redis keys and in audit events.
        let digest = config.tokens.account_digest(&keys.ring);
        // One Redis connection for the rate limiter and the login throttle.
        let redis = config
            .limits
            .redis_url
            .as_ref()
            .map(SharedRedis::open)
            .transpose()?;
        if let Some(redis) = &redis {
            // Which master Sentinel named, read at scrape (nothing for other URLs).
            let (redis, master) = (Arc::downgrade(redis), metrics.sentinel.master.clone());
            metrics.on_scrape(move || {
                master.reset();
                if let Some(node) = redis.upgrade().and_then(|r| r.node()) {
                    master.with_label_values(&[node.as_str()]).set(1);
                }
            });
        }
        let throttle = Throttle::new(
            config.limits.throttle(redis.clone())?,
            digest.clone(),
            metrics.throttle.clone(),
            clock.clone(),
        )?;
        throttle.connect().await;
        let accounts = Arc::new(
            Accounts::new(
                Arc::new(store),
                hasher,
                tokens,
                throttle,
                Audit::new(digest),
                config.tokens.sessions(),
                &metrics,
            )
            .with_second_factor(config.second_factor.settings()),
        );
        // Failed logins cost as much as the most expensive stored hash from the first.
        accounts
            .refresh_hash_cost()
            .await
            .map_err(|e| anyhow::anyhow!("reading the highest stored password hash cost: {e}"))?;
        // What was revoked before this start is refused from the first request on.
        accounts
            .load_revocations()
            .await
            .map_err(|e| anyhow::anyhow!("reading the revoked sessions and accounts: {e}"))?;
        let listen = config.server.listen;
        let listener = TcpListener::bind(listen)
            .await
            .with_context(|| format!("cannot listen on {listen}"))?;
        let local_addr = listener.local_addr()?;
        let metrics_listener = match config.telemetry.metrics_listen.addr() {
            Some(addr) => Some(transport::bind(addr, "metrics").await?),
            None => None,
        };
        let metrics_addr = match &metrics_listener {
            Some(listener) => Some(listener.local_addr()?),
            None => None,
        };
        // A std listener: it is served by a runtime of its own, on its own thread.
        let health_listener = match config.server.health_listen.addr() {
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
        let admin = match (
            config.admin.admin_listen.addr(),
            config.admin.settings(config.tls.tls_client_ca.is_some())?,
        ) {
            (Some(addr), Some(settings)) => Some((transport::bind(addr, "admin").await?, settings)),
            _ => None,
        };
        let admin_addr = match &admin {
            Some((listener, _)) => Some(listener.local_addr()?),
            None => None,
        };
        let forward_auth_listener = match config.authz.forward_auth_listen.addr() {
            Some(addr) => Some(transport::bind(addr, "forward-auth").await?),
            None => None,
        };
        let forward_auth_addr = match &forward_auth_listener {
            Some(listener) => Some(listener.local_addr()?),
            None => None,
        };
        // The connection cap is fitted under the open-file limit, raised to its hard
        // limit first.
        let limits = config.server.connection_limits(transport::raise_fd_limit());
        // Envoy's rate limit rules: a file that does not parse stops the start.
        let rate_limit_rules = (config.limits.rate_limit_rules_file.clone())
            .map(|path| ratelimit::LiveRules::load(path, metrics.clone()).map(Arc::new))
            .transpose()?;
        let file_rules = (rate_limit_rules.as_ref()).and_then(|r| r.current().file.authd.clone());
        // Never fails on a Redis outage: the limiter starts degraded and keeps trying.
        let rate_limiter = RateLimiter::start(
            config
                .limits
                .rate_limiter(redis, file_rules.as_ref(), clock)?,
            &metrics,
        )
        .await?;
        if let Some(rules) = &rate_limit_rules {
            // A reload that changes the file's authd: section changes authd's own rules.
            let (limiter, limits) = (rate_limiter.clone(), config.limits.clone());
            rules.on_authd_rules(move |file_rules| {
                limiter.replace_rules(limits.authd_rules(file_rules)?);
                Ok(())
            });
        }
        let admission = Admission::new(
            config.overload.admission(
                MAX_MESSAGE_BYTES + GRPC_FRAME_HEADER,
                accounts.hasher().pool().parallelism(),
            ),
            metrics.overload.clone(),
        );
        let pushback = Pushback::new(config.overload.pushback(), metrics.overload.clone());
        Ok(Self {
            listener,
            local_addr,
            accounts,
            admission,
            pushback,
            rate_limiter,
            rate_limit_rules,
            blocklist,
            metrics,
            key_ring,
            key_file,
            traces,
            metrics_listener,
            metrics_addr,
            health_listener,
            health_addr,
            admin,
            admin_addr,
            forward_auth_listener,
            forward_auth_addr,
            limits,
            tls,
            config,
        })
    }

    /// Where the admin API answers (`None` while `AUTHD_ADMIN_LISTEN` is off).
    pub fn admin_addr(&self) -> Option<SocketAddr> {
        self.admin_addr
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

    /// A handle on the application's internals that stays valid once it runs
    /// (`run_until_stopped` takes the application itself).
    pub fn handle(&self) -> AppHandle {
        AppHandle {
            accounts: self.accounts.clone(),
            admission: self.admission.clone(),
            pushback: self.pushback.clone(),
            rate_limiter: self.rate_limiter.clone(),
            rate_limit_rules: self.rate_limit_rules.clone(),
            metrics: self.metrics.clone(),
            key_file: self.key_file.clone(),
            metrics_addr: self.metrics_addr,
            health_addr: self.health_addr,
            admin_addr: self.admin_addr,
            forward_auth_addr: self.forward_auth_addr,
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
            rate_limit_rules,
            blocklist,
            metrics,
            key_ring,
            key_file,
            traces,
            metrics_listener,
            metrics_addr,
            health_listener,
            health_addr,
            admin,
            admin_addr,
            forward_auth_listener,
            forward_auth_addr,
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
        // Who may name the client of its requests, on every port alike.
        let callers = config.limits.trusted_callers();
        let trusted_callers = callers.to_string();
        let metrics_server = metrics_listener.map(|listener| {
            tokio::spawn(transport::serve(
                "metrics",
                listener,
                Protocol::Http1,
                None,
                auxiliary.clone(),
                callers.clone(),
                metrics.listener("metrics"),
                metrics::router(metrics.clone()).merge(token::jwks_router(key_ring.clone())),
                auxiliary_stopped.clone(),
            ))
        });
        let key_file_watcher = key_file
            .map(|file| file.spawn(config.tokens.token_keys_reload, auxiliary_stopped.clone()));
        let rules_watcher = (rate_limit_rules.clone()).map(|rules| {
            rules.spawn(
                config.limits.rate_limit_rules_reload,
                auxiliary_stopped.clone(),
            )
        });

        let (reporter, health_service) = tonic_health::server::health_reporter();
        health::report_alive(&reporter).await;
        let first = health::probe(&accounts).await;
        if let Err(why) = &first {
            tracing::error!(error = %why, "the database does not answer: NOT_SERVING");
        }
        health::report(&reporter, first.is_ok(), &metrics.serving).await;
        // Revocations from every replica, and the purge of old sessions.
        let upkeep = tokio::spawn(accounts.clone().upkeep(config.tokens.revocation_delay / 2));
        let checker = health::spawn_checker(
            reporter.clone(),
            accounts.clone(),
            config.server.health_interval,
            first.is_ok(),
            metrics.serving.clone(),
        );
        let health_server = match health_listener {
            Some(listener) => Some(spawn_health_server(
                listener,
                auxiliary,
                callers.clone(),
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
                .register_encoded_file_descriptor_set(pb::envoy_auth::FILE_DESCRIPTOR_SET)
                // google.rpc error details, so clients can decode BadRequest and RetryInfo.
                .register_encoded_file_descriptor_set(tonic_types::pb::FILE_DESCRIPTOR_SET)
        };
        let reflection = || match &rate_limit_rules {
            Some(_) => {
                reflection().register_encoded_file_descriptor_set(pb::envoy::FILE_DESCRIPTOR_SET)
            }
            None => reflection(),
        };
        // grpcurl 1.8 speaks only v1alpha; newer clients use v1.
        let reflection_v1 = reflection().build_v1()?;
        let reflection_v1alpha = reflection().build_v1alpha()?;
        let auth = AuthServiceServer::new(AuthApi::new(accounts.clone(), blocklist.clone()))
            .max_decoding_message_size(MAX_MESSAGE_BYTES);
        // External authorization: Envoy's Check here, forward-auth on its own port.
        let authorizer = Authorizer::new(
            accounts.clone(),
            config.authz.settings(),
            metrics.authz.clone(),
        );
        let routes = Routes::new(health_service.clone())
            .add_service(reflection_v1)
            .add_service(reflection_v1alpha)
            .add_service(auth)
            .add_service(AuthorizationApi::server(authorizer.clone()));
        // Envoy's rate limit service, when it has a rules file.
        let routes = match rate_limit_rules {
            Some(rules) => routes.add_service(ratelimit::RateLimitServer::new(
                Arc::new(ratelimit::DescriptorLimits::new(
                    rate_limiter.clone(),
                    rules,
                    config.limits.rate_limit_shadow,
                    &config.limits.rate_limit_prefix,
                    &metrics,
                )),
                MAX_MESSAGE_BYTES,
            )),
            None => routes,
        };
        // Plain HTTP/1.1 within the main port's bounds; stops when the gRPC port does.
        let forward_auth_server = forward_auth_listener.map(|listener| {
            tokio::spawn(transport::serve(
                "forward-auth",
                listener,
                Protocol::Http1,
                None,
                limits.clone(),
                callers.clone(),
                metrics.listener("forward-auth"),
                extauthz::router(authorizer),
                serving_stopped.clone(),
            ))
        });
        let grpc = tower::ServiceBuilder::new()
            .map_request(|request: http::Request<hyper::body::Incoming>| {
                request.map(tonic::body::Body::new)
            })
            // Outermost: every request, refused or not, gets an id, a log line and metrics.
            .layer(trace::layer(metrics.clone(), traces.clone()))
            // A refusal with a retry hint, from any layer below, is held before its answer.
            .layer(pushback::layer(pushback.clone()))
            // Mutual TLS: an identity not allowed for the method costs nothing further.
            .layer(access::layer(config.tls.allow_list()))
            // Then: a request refused by a rate limit never takes an admission slot.
            .layer(ratelimit::layer(rate_limiter))
            .layer(admission::layer(admission.clone()))
            .service(routes);
        // The admin API: its own port, its own routes; stops when the gRPC port does.
        let admin_server = match admin {
            Some((listener, settings)) => {
                let admin_reflection = || {
                    tonic_reflection::server::Builder::configure()
                        .register_encoded_file_descriptor_set(pb::admin::FILE_DESCRIPTOR_SET)
                        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
                        .register_encoded_file_descriptor_set(tonic_types::pb::FILE_DESCRIPTOR_SET)
                };
                let api = AdminApi::new(
                    accounts.clone(),
                    blocklist.clone(),
                    settings,
                    accounts.audit().clone(),
                    metrics.admin.clone(),
                );
                let routes = Routes::new(health_service.clone())
                    .add_service(admin_reflection().build_v1()?)
                    .add_service(admin_reflection().build_v1alpha()?)
                    .add_service(api.server());
                let service = tower::ServiceBuilder::new()
                    .map_request(|request: http::Request<hyper::body::Incoming>| {
                        request.map(tonic::body::Body::new)
                    })
                    .layer(trace::layer(metrics.clone(), traces.clone()))
                    .service(routes);
                Some(tokio::spawn(transport::serve(
                    "admin",
                    listener,
                    Protocol::Http2,
                    tls.clone(),
                    Limits::auxiliary(&limits),
                    callers.clone(),
                    metrics.listener("admin"),
                    service,
                    serving_stopped.clone(),
                )))
            }
            None => None,
        };
        // Stops when the gRPC port does.
        let reloader = tls
            .as_ref()
            .map(|tls| tls.spawn_reloader(config.tls.tls_reload, serving_stopped.clone()));
        let mut server = tokio::spawn(transport::serve(
            "grpc",
            listener,
            Protocol::Http2,
            tls.clone(),
            limits.clone(),
            callers,
            metrics.listener("grpc"),
            grpc,
            serving_stopped,
        ));
        tracing::info!(
            listen = %local_addr,
            health = %health_addr.map_or_else(|| "off".to_owned(), |a| a.to_string()),
            admin = %admin_addr.map_or_else(|| "off".to_owned(), |a| a.to_string()),
            forward_auth = %forward_auth_addr.map_or_else(|| "off".to_owned(), |a| a.to_string()),
            metrics = %metrics_addr.map_or_else(|| "off".to_owned(), |a| a.to_string()),
            database = %config.store.database_url,
            pbkdf2_iterations = config.passwords.pbkdf2_iterations,
            hash_threads = config.passwords.hash_threads(),
            hash_backend = accounts.hasher().pool().engine().backend().name(),
            hash_lanes = accounts.hasher().pool().engine().lanes(),
            hash_kernels = %accounts.hasher().pool().engine().plan(),
            max_in_flight = config.overload.max_in_flight,
            max_wait = ?config.overload.max_wait,
            max_connections = limits.max_connections,
            trusted_callers = %trusted_callers,
            tls = match (&tls, &config.tls.tls_client_ca) {
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
            if let Some(admin) = &admin_server {
                admin.abort();
            }
            if let Some(forward_auth) = &forward_auth_server {
                forward_auth.abort();
            }
            store.close().await;
            stop_auxiliary_servers(stop_auxiliary, metrics_server, health_server).await;
            if let Some(watcher) = key_file_watcher {
                watcher.abort();
            }
            if let Some(watcher) = rules_watcher {
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
        if !admission.drain(config.server.drain_timeout).await {
            tracing::warn!(
                in_flight = admission.in_flight(),
                drain_timeout = ?config.server.drain_timeout,
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
        // Stopped with the gRPC port; their calls are short.
        for mut server in admin_server.into_iter().chain(forward_auth_server) {
            if tokio::time::timeout(CLOSE_TIMEOUT, &mut server)
                .await
                .is_err()
            {
                server.abort();
            }
        }
        store.close().await;
        stop_auxiliary_servers(stop_auxiliary, metrics_server, health_server).await;
        if let Some(watcher) = key_file_watcher {
            watcher.abort();
        }
        if let Some(watcher) = rules_watcher {
            watcher.abort();
        }
        tracing::info!("authd stopped");
        Ok(())
    }
}

/// Serves `service` (health only) on `listener` from a thread of its own with a
/// single-threaded runtime: however busy the main runtime's workers are with
/// AuthService requests, probes are answered by a thread that does nothing else.
fn spawn_health_server<S, B>(
    listener: std::net::TcpListener,
    limits: Limits,
    callers: Arc<TrustedCallers>,
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
                            callers,
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
