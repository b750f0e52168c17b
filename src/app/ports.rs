//! Every port of an application: each is bound at build from its configuration
//! group (port 0 works) and served from the core when the application runs. The
//! gRPC, admin and health ports are files of their own; the plain-HTTP ports
//! (metrics and JWKS, forward-auth) are small enough to live here. A port is added
//! here: its field, its bind, its serve.

use super::{
    admin::AdminPort,
    core::Core,
    grpc::GrpcPort,
    health::{HealthPort, Readiness},
    supervisor::{Stage, Supervisor},
};
use crate::{
    config::Config,
    handlers::extauthz,
    metrics, token,
    transport::{self, Limits, Listener, Protocol},
};
use std::net::SocketAddr;
use tokio::net::TcpListener;

/// The bound ports, not yet served.
pub(super) struct Ports {
    grpc: GrpcPort,
    metrics: Option<HttpPort>,
    health: Option<HealthPort>,
    admin: Option<AdminPort>,
    forward_auth: Option<HttpPort>,
}

/// Where each port answers (`None`: the port is off).
#[derive(Debug, Clone, Copy)]
pub(super) struct Addresses {
    pub grpc: SocketAddr,
    pub metrics: Option<SocketAddr>,
    pub health: Option<SocketAddr>,
    pub admin: Option<SocketAddr>,
    pub forward_auth: Option<SocketAddr>,
}

impl Ports {
    pub(super) async fn bind(config: &Config) -> anyhow::Result<Self> {
        Ok(Self {
            grpc: GrpcPort::bind(config).await?,
            metrics: HttpPort::bind(config.telemetry.metrics_listen.addr(), "metrics").await?,
            health: HealthPort::bind(config.server.health_listen.addr())?,
            admin: AdminPort::bind(config).await?,
            forward_auth: HttpPort::bind(config.authz.forward_auth_listen.addr(), "forward-auth")
                .await?,
        })
    }

    pub(super) fn addresses(&self) -> Addresses {
        Addresses {
            grpc: self.grpc.addr(),
            metrics: self.metrics.as_ref().map(|p| p.addr),
            health: self.health.as_ref().map(HealthPort::addr),
            admin: self.admin.as_ref().map(AdminPort::addr),
            forward_auth: self.forward_auth.as_ref().map(|p| p.addr),
        }
    }

    /// Serves every port, each task registered with `tasks`.
    pub(super) fn serve(
        self,
        core: &Core,
        config: &Config,
        readiness: &Readiness,
        tasks: &mut Supervisor,
    ) -> anyhow::Result<()> {
        if let Some(port) = self.metrics {
            // Plain HTTP/1.1: `GET /metrics` and the JWKS document, until the end.
            let router = metrics::router(core.metrics.clone())
                .merge(token::jwks_router(core.key_ring.clone()));
            let limits = Limits::auxiliary(&core.limits);
            port.serve("metrics", Stage::Auxiliary, limits, core, router, tasks);
        }
        if let Some(port) = self.health {
            port.serve(core, readiness, tasks)?;
        }
        if let Some(port) = self.forward_auth {
            // Plain HTTP/1.1 within the main port's bounds; stops when the gRPC port does.
            let router = extauthz::router(core.authorizer.clone());
            let limits = core.limits.clone();
            port.serve("forward-auth", Stage::Serving, limits, core, router, tasks);
        }
        if let Some(port) = self.admin {
            port.serve(core, config, readiness.service(), tasks)?;
        }
        self.grpc.serve(core, config, readiness.service(), tasks)
    }
}

/// A plain HTTP/1.1 port, bound.
struct HttpPort {
    socket: TcpListener,
    addr: SocketAddr,
}

impl HttpPort {
    async fn bind(addr: Option<SocketAddr>, what: &str) -> anyhow::Result<Option<Self>> {
        let Some(addr) = addr else { return Ok(None) };
        let socket = transport::bind(addr, what).await?;
        let addr = socket.local_addr()?;
        Ok(Some(Self { socket, addr }))
    }

    fn serve(
        self,
        name: &'static str,
        stage: Stage,
        limits: Limits,
        core: &Core,
        router: axum::Router,
        tasks: &mut Supervisor,
    ) {
        let listener = Listener {
            name,
            socket: self.socket,
            protocol: Protocol::Http1,
            tls: None,
            limits,
            callers: core.callers.clone(),
            metrics: core.metrics.listener(name),
        };
        tasks.spawn(stage, name, |stop| listener.serve(router, stop));
    }
}
