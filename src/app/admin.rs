//! The admin port (`AUTHD_ADMIN_LISTEN`, off by default): `auth.admin.v1`, health
//! and its own reflection, on its own routes, with gRPC-Web and the admin API's JSON
//! form in front of them (`crate::web`); stopped with the gRPC port.

use super::{
    core::Core,
    health::HealthService,
    supervisor::{Stage, Supervisor},
};
use crate::{
    config::Config,
    handlers::admin::{AdminApi, AdminSettings},
    pb,
    rpc::MAX_ADMIN_MESSAGE_BYTES,
    transport::{self, Limits, Listener, Protocol},
    web,
};
use std::net::SocketAddr;
use tokio::net::TcpListener;
use tonic::service::Routes;

/// The admin port, bound, with its settings.
pub(super) struct AdminPort {
    socket: TcpListener,
    addr: SocketAddr,
    settings: AdminSettings,
    import_caps: crate::password::foreign::Caps,
}

impl AdminPort {
    /// Bound when `AUTHD_ADMIN_LISTEN` is set; its settings are checked either way.
    pub(super) async fn bind(config: &Config) -> anyhow::Result<Option<Self>> {
        let settings = config.admin.settings(config.tls.tls_client_ca.is_some())?;
        let (Some(addr), Some(settings)) = (config.admin.admin_listen.addr(), settings) else {
            return Ok(None);
        };
        let socket = transport::bind(addr, "admin").await?;
        let addr = socket.local_addr()?;
        Ok(Some(Self {
            socket,
            addr,
            settings,
            import_caps: config.import.caps(),
        }))
    }

    pub(super) fn addr(&self) -> SocketAddr {
        self.addr
    }

    pub(super) fn serve(
        self,
        core: &Core,
        config: &Config,
        health: HealthService,
        tasks: &mut Supervisor,
    ) -> anyhow::Result<()> {
        let reflection = || {
            tonic_reflection::server::Builder::configure()
                .register_encoded_file_descriptor_set(pb::admin::FILE_DESCRIPTOR_SET)
                .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
                .register_encoded_file_descriptor_set(tonic_types::pb::FILE_DESCRIPTOR_SET)
        };
        // Ends the WatchEvents streams when the port stops, so the drain does not
        // wait for subscribers that never hang up.
        let streams = tokio_util::sync::CancellationToken::new();
        let api = AdminApi::new(
            core.accounts.clone(),
            core.blocklist.clone(),
            self.settings,
            core.accounts.audit().clone(),
            core.metrics.admin.clone(),
        )
        .with_import_caps(self.import_caps)
        .with_events(core.events.clone(), streams.clone());
        let routes = Routes::new(health)
            .add_service(reflection().build_v1()?)
            .add_service(reflection().build_v1alpha()?)
            .add_service(api.server());
        let service = tower::ServiceBuilder::new()
            .layer(core.trace_layer())
            .service(routes);
        // gRPC-Web and the admin API's JSON form, translated to gRPC in front of the
        // same layers and credentials.
        let api = web::Api::new(
            pb::admin::FILE_DESCRIPTOR_SET,
            MAX_ADMIN_MESSAGE_BYTES,
            config.overload.receive_timeout,
        )?;
        let service = web::front(service, web::not_found(), api, config.server.cors());
        let listener = Listener {
            name: "admin",
            socket: self.socket,
            protocol: Protocol::Auto,
            tls: core.tls.clone(),
            limits: Limits::auxiliary(&core.limits),
            callers: core.callers.clone(),
            metrics: core.metrics.listener("admin"),
        };
        tasks.spawn(Stage::Serving, "admin", |stop| {
            let ending = stop.clone();
            async move {
                let end_streams = async move {
                    ending.cancelled().await;
                    streams.cancel();
                };
                tokio::join!(listener.serve(service, stop), end_streams);
            }
        });
        Ok(())
    }
}
