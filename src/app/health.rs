//! Readiness and the health port: the statuses reported from the first probe on,
//! the checker that follows the store, and the health-only port
//! (`AUTHD_HEALTH_LISTEN`), served by a thread of its own until the very end.

use super::{
    core::Core,
    supervisor::{Stage, Supervisor},
};
use crate::{
    config::Config,
    health,
    transport::{Limits, Listener, Protocol},
};
use anyhow::Context as _;
use std::net::SocketAddr;
use tokio::net::TcpListener;
use tonic_health::{pb::health_server::HealthServer, server::HealthReporter};
use tower::Layer as _;

/// `grpc.health.v1.Health`, as every port serves it.
pub(super) type HealthService = HealthServer<tonic_health::server::HealthService>;

/// The statuses the health service reports.
pub(super) struct Readiness {
    reporter: HealthReporter,
}

impl Readiness {
    /// Reports liveness, then readiness from a first probe, and starts the checker.
    pub(super) async fn start(core: &Core, config: &Config, tasks: &mut Supervisor) -> Self {
        let reporter = HealthReporter::new();
        health::report_alive(&reporter).await;
        let first = health::probe(&core.accounts).await;
        if let Err(why) = &first {
            tracing::error!(error = %why, "the database does not answer: NOT_SERVING");
        }
        health::report(&reporter, first.is_ok(), &core.metrics.serving).await;
        let checker = health::checker(
            reporter.clone(),
            core.accounts.clone(),
            config.server.health_interval,
            first.is_ok(),
            core.metrics.serving.clone(),
        );
        tasks.spawn_until_stopped(Stage::Readiness, "readiness checker", checker);
        Self { reporter }
    }

    /// The health service over these statuses.
    pub(super) fn service(&self) -> HealthService {
        HealthServer::new(tonic_health::server::HealthService::from_health_reporter(
            self.reporter.clone(),
        ))
    }

    /// Reports NOT_SERVING: load balancers stop sending work before the drain.
    pub(super) async fn not_serving(&self, core: &Core) {
        health::report(&self.reporter, false, &core.metrics.serving).await;
    }
}

/// The health-only port, bound: a std listener, served by a runtime of its own.
pub(super) struct HealthPort {
    socket: std::net::TcpListener,
    addr: SocketAddr,
}

impl HealthPort {
    pub(super) fn bind(addr: Option<SocketAddr>) -> anyhow::Result<Option<Self>> {
        let Some(addr) = addr else { return Ok(None) };
        let socket = std::net::TcpListener::bind(addr)
            .map_err(|e| anyhow::anyhow!("cannot listen for health on {addr}: {e}"))?;
        let addr = socket.local_addr()?;
        Ok(Some(Self { socket, addr }))
    }

    pub(super) fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Serves health only from a thread of its own with a single-threaded runtime:
    /// however busy the main runtime's workers are with AuthService requests,
    /// probes are answered by a thread that does nothing else.
    pub(super) fn serve(
        self,
        core: &Core,
        readiness: &Readiness,
        tasks: &mut Supervisor,
    ) -> anyhow::Result<()> {
        self.socket.set_nonblocking(true)?;
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .context("starting the health runtime")?;
        let service = tower::ServiceBuilder::new()
            .map_request(|request: http::Request<hyper::body::Incoming>| {
                request.map(tonic::body::Body::new)
            })
            .service(core.trace_layer().layer(readiness.service()));
        let (socket, limits) = (self.socket, Limits::auxiliary(&core.limits));
        let (callers, metrics) = (core.callers.clone(), core.metrics.listener("health"));
        let served = tasks.tracked(Stage::Auxiliary, "health", |stop| async move {
            // Registered with this thread's runtime, so it is polled here.
            match TcpListener::from_std(socket) {
                Ok(socket) => {
                    let listener = Listener {
                        name: "health",
                        socket,
                        protocol: Protocol::Http2,
                        // Always plaintext: for probes (the kubelet's speaks no TLS).
                        tls: None,
                        limits,
                        callers,
                        metrics,
                    };
                    listener.serve(service, stop).await
                }
                Err(e) => tracing::error!(error = %e, "the health port cannot be served"),
            }
        });
        std::thread::Builder::new()
            .name("authd-health".into())
            .spawn(move || runtime.block_on(served))
            .context("starting the health thread")?;
        Ok(())
    }
}
