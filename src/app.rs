//! Wiring: [`Application::build`] creates the metrics registry, opens the store,
//! starts the hash pool, binds the gRPC and metrics listeners (port 0 works) and
//! assembles the tonic server; [`Application::run_until_stopped`] serves until the
//! shutdown future resolves, then drains and flushes.
//!
//! `main.rs` and every integration test start authd through this same code.

use crate::{
    accounts::Accounts,
    admission::{Admission, AdmissionLayer},
    config::{Config, DatabaseUrl},
    grpc::{AuthApi, MAX_MESSAGE_BYTES},
    health,
    metrics::{self, Metrics},
    password::{HashPool, Hasher, PoolSnapshot},
    pb::{self, auth_service_server::AuthServiceServer},
    ratelimit::{RateLimitLayer, RateLimitStats, RateLimiter, Settings as RateLimitSettings},
    store::{PostgresSettings, SqliteSettings, Store, StoreSettings, WriterSnapshot},
    token::{KeyRing, Tokens},
    trace::TraceLayer,
};
use anyhow::Context as _;
use std::{future::Future, net::SocketAddr, sync::Arc, time::Duration};
use tokio::net::TcpListener;
use tonic::transport::{Server, server::TcpIncoming};

/// How long, after the drain, the server may take to close its connections.
const CLOSE_TIMEOUT: Duration = Duration::from_secs(5);

/// A built, bound, not yet serving authd.
pub struct Application {
    listener: TcpListener,
    local_addr: SocketAddr,
    accounts: Arc<Accounts>,
    admission: Arc<Admission>,
    rate_limiter: Arc<RateLimiter>,
    metrics: Arc<Metrics>,
    metrics_listener: Option<TcpListener>,
    metrics_addr: Option<SocketAddr>,
    config: Config,
}

/// A cheap handle on a running application's internals, for tests and tools.
#[derive(Clone)]
pub struct AppHandle {
    accounts: Arc<Accounts>,
    admission: Arc<Admission>,
    rate_limiter: Arc<RateLimiter>,
    metrics: Arc<Metrics>,
    metrics_addr: Option<SocketAddr>,
}

impl AppHandle {
    /// Where `GET /metrics` answers (`None` when the endpoint is off).
    pub fn metrics_addr(&self) -> Option<SocketAddr> {
        self.metrics_addr
    }

    /// The application's metrics, as the endpoint would show them now.
    pub fn render_metrics(&self) -> String {
        self.metrics.render()
    }

    /// Counters of the password hashing pool.
    pub fn hash_stats(&self) -> PoolSnapshot {
        self.accounts.hasher().pool().stats()
    }

    /// Counters of the SQLite writer (`None` on other backends).
    pub fn writer_stats(&self) -> Option<WriterSnapshot> {
        self.accounts.store().writer_stats()
    }

    /// AuthService requests admitted and not yet answered.
    pub fn in_flight(&self) -> usize {
        self.admission.in_flight()
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
        }),
        DatabaseUrl::Postgres(url) => StoreSettings::Postgres(PostgresSettings {
            url: url.clone(),
            max_connections: config.db_max_connections,
            acquire_timeout: config.db_acquire_timeout,
        }),
    }
}

impl Application {
    pub async fn build(config: Config) -> anyhow::Result<Self> {
        let keys = match config.key_ring()? {
            Some(keys) => keys,
            None => {
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
        let store = Store::open(store_settings(&config), &metrics).await?;
        let pool = HashPool::new(config.hash_threads(), config.hash_queue(), &metrics)
            .context("starting the password hashing threads")?;
        let hasher = Hasher::new(config.pbkdf2_iterations, pool)?;
        let tokens = Tokens::new(keys, config.token_ttl, &metrics);
        let accounts = Arc::new(Accounts::new(Arc::new(store), hasher, tokens));
        let listener = TcpListener::bind(config.listen)
            .await
            .with_context(|| format!("cannot listen on {}", config.listen))?;
        let local_addr = listener.local_addr()?;
        let metrics_listener = metrics::bind(config.metrics_listen.addr()).await?;
        let metrics_addr = match &metrics_listener {
            Some(listener) => Some(listener.local_addr()?),
            None => None,
        };
        // Never fails on a Redis outage: the limiter starts degraded and keeps trying.
        let rate_limiter = RateLimiter::start(RateLimitSettings::from(&config), &metrics).await?;
        Ok(Self {
            listener,
            local_addr,
            accounts,
            admission: Admission::new(config.max_in_flight),
            rate_limiter,
            metrics,
            metrics_listener,
            metrics_addr,
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

    pub fn handle(&self) -> AppHandle {
        AppHandle {
            accounts: self.accounts.clone(),
            admission: self.admission.clone(),
            rate_limiter: self.rate_limiter.clone(),
            metrics: self.metrics.clone(),
            metrics_addr: self.metrics_addr,
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
            rate_limiter,
            metrics,
            metrics_listener,
            metrics_addr,
            config,
        } = self;
        let store = accounts.store().clone();

        // The metrics endpoint answers from now until the very end, the drain included.
        let (stop_metrics, metrics_stopped) = tokio::sync::oneshot::channel::<()>();
        let metrics_server = metrics_listener.map(|listener| {
            tokio::spawn(metrics::serve(listener, metrics.clone(), async {
                let _ = metrics_stopped.await;
            }))
        });

        let (reporter, health_service) = tonic_health::server::health_reporter();
        let first = health::probe(&store, Duration::from_secs(2)).await;
        if let Err(why) = &first {
            tracing::error!(error = %why, "the database does not answer: NOT_SERVING");
        }
        health::report(&reporter, first.is_ok()).await;
        let checker = health::spawn_checker(
            reporter.clone(),
            store.clone(),
            config.health_interval,
            first.is_ok(),
        );

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
        let auth = AuthServiceServer::new(AuthApi::new(accounts.clone()))
            .max_decoding_message_size(MAX_MESSAGE_BYTES);

        let (stop_serving, serving_stopped) = tokio::sync::oneshot::channel::<()>();
        let incoming = TcpIncoming::from(listener).with_nodelay(Some(true));
        let server = Server::builder()
            // Outermost: every request, refused or not, gets an id, a log line and metrics.
            .layer(TraceLayer::new(metrics.clone()))
            // Then: a request refused by a rate limit never takes an admission slot.
            .layer(RateLimitLayer::new(rate_limiter))
            .layer(AdmissionLayer::new(admission.clone()))
            .add_service(health_service)
            .add_service(reflection_v1)
            .add_service(reflection_v1alpha)
            .add_service(auth)
            .serve_with_incoming_shutdown(incoming, async {
                let _ = serving_stopped.await;
            });
        let mut server = tokio::spawn(server);
        tracing::info!(
            listen = %local_addr,
            metrics = %metrics_addr.map_or_else(|| "off".to_owned(), |a| a.to_string()),
            database = %config.database_url,
            pbkdf2_iterations = config.pbkdf2_iterations,
            hash_threads = config.hash_threads(),
            hash_queue = config.hash_queue(),
            "authd is serving"
        );

        let served = tokio::select! {
            () = shutdown => None,
            result = &mut server => Some(result),
        };
        if let Some(result) = served {
            // The server stopped on its own: that is an error, not a shutdown.
            checker.abort();
            store.close().await;
            stop_metrics_server(stop_metrics, metrics_server).await;
            result.context("the gRPC server task failed")??;
            anyhow::bail!("the gRPC server stopped unexpectedly");
        }

        tracing::info!(
            in_flight = admission.in_flight(),
            "shutting down: draining requests in flight"
        );
        health::report(&reporter, false).await;
        checker.abort();
        if !admission.drain(config.drain_timeout).await {
            tracing::warn!(
                in_flight = admission.in_flight(),
                drain_timeout = ?config.drain_timeout,
                "the drain timed out; abandoning the requests still in flight"
            );
        }
        let _ = stop_serving.send(());
        match tokio::time::timeout(CLOSE_TIMEOUT, &mut server).await {
            Ok(result) => result.context("the gRPC server task failed")??,
            Err(_) => {
                tracing::warn!("connections did not close in time; closing them");
                server.abort();
            }
        }
        store.close().await;
        stop_metrics_server(stop_metrics, metrics_server).await;
        tracing::info!("authd stopped");
        Ok(())
    }
}

/// Stops the metrics endpoint and waits (briefly) for it; a failure is only logged:
/// the metrics must never decide how authd exits.
async fn stop_metrics_server(
    stop: tokio::sync::oneshot::Sender<()>,
    server: Option<tokio::task::JoinHandle<std::io::Result<()>>>,
) {
    let _ = stop.send(());
    let Some(mut server) = server else { return };
    match tokio::time::timeout(CLOSE_TIMEOUT, &mut server).await {
        Ok(Ok(Ok(()))) => {}
        Ok(Ok(Err(e))) => tracing::warn!(error = %e, "the metrics endpoint failed"),
        Ok(Err(e)) => tracing::warn!(error = %e, "the metrics endpoint task failed"),
        Err(_) => server.abort(),
    }
}
