//! The gRPC port (`AUTHD_LISTEN`): AuthService, Envoy's Check, Envoy's rate limit
//! service when it has a rules file, health and reflection, behind the request
//! path's layers, with gRPC-Web and AuthService's JSON form in front of them
//! (`crate::web`), and the standard HTTP endpoints (`oidc`) as the port's plain-HTTP
//! routes; stopped after the drain.

use super::{
    core::Core,
    supervisor::{Stage, Supervisor},
};
use crate::{
    config::Config,
    handlers::{extauthz::AuthorizationApi, grpc::AuthApi},
    layers::{access, admission, pushback, ratelimit as rate_limit},
    oidc,
    pb::{self, auth_service_server::AuthServiceServer},
    ratelimit,
    rpc::MAX_MESSAGE_BYTES,
    transport::{Listener, Protocol},
    web,
};
use anyhow::Context as _;
use std::{net::SocketAddr, sync::Arc};
use tokio::net::TcpListener;
use tonic::service::Routes;

/// The gRPC port, bound.
pub(super) struct GrpcPort {
    socket: TcpListener,
    addr: SocketAddr,
    /// The standard endpoints' settings, read (with the introspection keys file)
    /// before anything serves.
    standard: oidc::OidcSettings,
}

impl GrpcPort {
    pub(super) async fn bind(config: &Config) -> anyhow::Result<Self> {
        let standard = (config.oidc).settings(config.tls.tls_client_ca.is_some())?;
        let listen = config.server.listen;
        let socket = TcpListener::bind(listen)
            .await
            .with_context(|| format!("cannot listen on {listen}"))?;
        let addr = socket.local_addr()?;
        Ok(Self {
            socket,
            addr,
            standard,
        })
    }

    pub(super) fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Serves the port from `core` until the drain is over.
    pub(super) fn serve(
        self,
        core: &Core,
        config: &Config,
        health: super::health::HealthService,
        tasks: &mut Supervisor,
    ) -> anyhow::Result<()> {
        let routes = Routes::new(health)
            .add_service(reflection(core).build_v1()?)
            // grpcurl 1.8 speaks only v1alpha; newer clients use v1.
            .add_service(reflection(core).build_v1alpha()?)
            .add_service(
                AuthServiceServer::new(AuthApi::new(core.accounts.clone(), core.blocklist.clone()))
                    .max_decoding_message_size(MAX_MESSAGE_BYTES),
            )
            .add_service(AuthorizationApi::server(core.authorizer.clone()));
        // Envoy's rate limit service, when it has a rules file.
        let routes = match core.rate_limit_rules.clone() {
            Some(rules) => routes.add_service(ratelimit::RateLimitServer::new(
                Arc::new(ratelimit::DescriptorLimits::new(
                    core.rate_limiter.clone(),
                    rules,
                    config.limits.rate_limit_shadow,
                    &config.limits.rate_limit_prefix,
                    &core.metrics,
                )),
                MAX_MESSAGE_BYTES,
            )),
            None => routes,
        };
        let service = tower::ServiceBuilder::new()
            // Outermost: every request, refused or not, gets an id, a log line and metrics.
            .layer(core.trace_layer())
            // A refusal with a retry hint, from any layer below, is held before its answer.
            .layer(pushback::layer(core.pushback.clone()))
            // Mutual TLS: an identity not allowed for the method costs nothing further.
            .layer(access::layer(config.tls.allow_list()))
            // Then: a request refused by a rate limit never takes an admission slot.
            .layer(rate_limit::layer(core.rate_limiter.clone()))
            .layer(admission::layer(core.admission.clone()))
            .service(routes);
        // gRPC-Web and JSON calls are translated to gRPC in front of every layer;
        // every other request goes to the standard endpoints (404 in JSON elsewhere).
        let api = web::Api::new(
            pb::FILE_DESCRIPTOR_SET,
            MAX_MESSAGE_BYTES,
            config.overload.receive_timeout,
        )?;
        let standard = oidc::router(oidc::Endpoints {
            accounts: core.accounts.clone(),
            key_ring: core.key_ring.clone(),
            rate_limiter: core.rate_limiter.clone(),
            metrics: core.metrics.oidc.clone(),
            settings: self.standard,
            receive_timeout: config.overload.receive_timeout,
        });
        let service = web::front(service, web::routes(standard), api, config.server.cors());
        let listener = Listener {
            name: "grpc",
            socket: self.socket,
            protocol: Protocol::Auto,
            tls: core.tls.clone(),
            limits: core.limits.clone(),
            callers: core.callers.clone(),
            metrics: core.metrics.listener("grpc"),
        };
        tasks.spawn(Stage::Serving, "grpc", |stop| listener.serve(service, stop));
        Ok(())
    }
}

/// Reflection over every service the port serves, and the types their errors carry.
fn reflection(core: &Core) -> tonic_reflection::server::Builder<'static> {
    let builder = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(pb::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(pb::envoy_auth::FILE_DESCRIPTOR_SET)
        // google.rpc error details, so clients can decode BadRequest and RetryInfo.
        .register_encoded_file_descriptor_set(tonic_types::pb::FILE_DESCRIPTOR_SET);
    match &core.rate_limit_rules {
        Some(_) => builder.register_encoded_file_descriptor_set(pb::envoy::FILE_DESCRIPTOR_SET),
        None => builder,
    }
}
