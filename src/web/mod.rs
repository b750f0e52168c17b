//! One port, three protocols: the front of the gRPC and admin ports, which tells
//! each request's protocol by its content type and hands it, as gRPC, to the port's
//! layered gRPC service, so every layer (trace, pushback, access, rate limit,
//! admission) and the handler serve it unchanged.
//!
//! - `content-type: application/grpc…`: gRPC, passed on as it is;
//! - `application/grpc-web…` (binary or `-text`): gRPC-Web, translated by tonic-web;
//! - `POST /<package.Service>/<Method>` with `application/json` (or
//!   `application/proto`): a Connect unary call, translated by [`connect`] against the
//!   port's descriptor set; a wrong method on such a path is 405, another media type
//!   415;
//! - a CORS preflight: answered by [`cors`], never by the service;
//! - anything else: the port's fallback service (plain HTTP routes; 404 in JSON for
//!   a path it does not know).
//!
//! The protocol goes in the request's extensions (`rpc::Protocol`) for the trace
//! layer's metrics and logs. Errors in the JSON form are [`errors`]'s. This module
//! knows the wire forms only: what a call does and who may make it stay with the
//! layers and handlers below.

mod connect;
mod cors;
mod errors;

pub(crate) use cors::{Cors, parse_origins};

use crate::{middleware::BoxFuture, rpc::Protocol};
use bytes::Bytes;
use http::{HeaderValue, Method, StatusCode, header};
use http_body_util::Full;
use prost_reflect::{DescriptorPool, MethodDescriptor};
use std::{
    collections::HashMap,
    convert::Infallible,
    sync::Arc,
    task::{Context, Poll},
    time::Duration,
};
use tonic::{Code, body::Body};
use tower::{BoxError, Layer as _, Service, ServiceExt as _, util::BoxCloneSyncService};

/// Connect's JSON may spell a message out at length (names, base64): a body may be
/// this many times the largest protobuf message before it is refused unread.
const JSON_EXPANSION: usize = 4;

/// The plain-HTTP routes of a port (everything that is not an RPC).
pub(crate) type Fallback =
    BoxCloneSyncService<http::Request<Body>, http::Response<Body>, Infallible>;

/// The plain-HTTP routes of a port as its fallback: `router`'s routes, and 404 with
/// a JSON error for any path it does not know.
pub(crate) fn routes(router: axum::Router) -> Fallback {
    let router = router.fallback(|| async {
        answer(errors::plain(
            StatusCode::NOT_FOUND,
            Code::NotFound,
            "no such path",
        ))
    });
    let service = tower::ServiceExt::<http::Request<Body>>::map_response(
        router,
        |response: http::Response<axum::body::Body>| response.map(Body::new),
    );
    BoxCloneSyncService::new(service)
}

/// A fallback that knows no route: 404 with a JSON error for every path.
pub(crate) fn not_found() -> Fallback {
    routes(axum::Router::new())
}

/// What the translation of one port knows: its RPCs by path, the error details'
/// types, and the bounds of a request body.
pub(crate) struct Api {
    /// Unary RPCs by path (`/auth.v1.AuthService/Login`).
    methods: HashMap<String, MethodDescriptor>,
    /// google.rpc's detail types, for the `debug` form of error details.
    details: DescriptorPool,
    /// The largest Connect request body read.
    max_body_bytes: usize,
    /// How long a request body may take to arrive (admission's receive timeout).
    receive_timeout: Duration,
}

impl Api {
    /// The unary RPCs of the services in `descriptor_set` (encoded), whose protobuf
    /// messages are at most `max_message_bytes`; bodies arrive within `receive_timeout`.
    pub(crate) fn new(
        descriptor_set: &[u8],
        max_message_bytes: usize,
        receive_timeout: Duration,
    ) -> anyhow::Result<Self> {
        let pool = DescriptorPool::decode(descriptor_set)?;
        let methods = pool
            .services()
            .flat_map(|service| service.methods().collect::<Vec<_>>())
            .filter(|method| !method.is_client_streaming() && !method.is_server_streaming())
            .map(|method| {
                let path = format!("/{}/{}", method.parent_service().full_name(), method.name());
                (path, method)
            })
            .collect();
        Ok(Self {
            methods,
            details: DescriptorPool::decode(tonic_types::pb::FILE_DESCRIPTOR_SET)?,
            max_body_bytes: max_message_bytes * JSON_EXPANSION,
            receive_timeout,
        })
    }
}

/// The front of a port: dispatches every request to `grpc` (the layered gRPC
/// service), gRPC-Web's translation of it, the Connect translation or `fallback`.
pub(crate) fn front<S>(grpc: S, fallback: Fallback, api: Api, cors: Cors) -> Front<S>
where
    S: Service<http::Request<Body>, Response = http::Response<Body>, Error = Infallible> + Clone,
{
    Front {
        grpc_web: tonic_web::GrpcWebLayer::new().layer(grpc.clone()),
        grpc,
        fallback,
        api: Arc::new(api),
        cors: Arc::new(cors),
    }
}

/// The service in front of a port's layered gRPC service (see the module's doc).
#[derive(Clone)]
pub(crate) struct Front<S> {
    grpc: S,
    grpc_web: tonic_web::GrpcWebService<S>,
    fallback: Fallback,
    api: Arc<Api>,
    cors: Arc<Cors>,
}

/// What a request is, by its content type, method and path.
enum Kind {
    Grpc,
    GrpcWeb,
    Connect(MethodDescriptor, connect::Codec),
    /// A known RPC's path with another method than POST, or another media type.
    Refused(StatusCode),
    Other,
}

impl<S> Front<S> {
    fn kind<B>(&self, request: &http::Request<B>) -> Kind {
        let content_type = request
            .headers()
            .get(header::CONTENT_TYPE)
            .map(HeaderValue::as_bytes)
            .unwrap_or_default();
        if content_type.starts_with(b"application/grpc-web") {
            return Kind::GrpcWeb;
        }
        if content_type.starts_with(b"application/grpc")
            && matches!(content_type.get(16), None | Some(b'+' | b';'))
        {
            return Kind::Grpc;
        }
        let Some(method) = self.api.methods.get(request.uri().path()) else {
            return Kind::Other;
        };
        if request.method() != Method::POST {
            return Kind::Refused(StatusCode::METHOD_NOT_ALLOWED);
        }
        match connect::Codec::of(request.headers()) {
            Some(codec) => Kind::Connect(method.clone(), codec),
            None => Kind::Refused(StatusCode::UNSUPPORTED_MEDIA_TYPE),
        }
    }
}

impl<S, B> Service<http::Request<B>> for Front<S>
where
    S: Service<http::Request<Body>, Response = http::Response<Body>, Error = Infallible>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError> + std::fmt::Display,
{
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = BoxFuture<Result<http::Response<Body>, Infallible>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        // Each request is served by a clone, driven to readiness in its own future.
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, mut request: http::Request<B>) -> Self::Future {
        let origin = self.cors.allowed(request.headers());
        if Cors::is_preflight(&request) {
            let response = answer(Cors::preflight(origin));
            return Box::pin(async move { Ok(response) });
        }
        let pending: BoxFuture<http::Response<Body>> = match self.kind(&request) {
            Kind::Grpc => {
                let grpc = self.grpc.clone();
                Box::pin(async move {
                    let Ok(response) = grpc.oneshot(request.map(Body::new)).await;
                    response
                })
            }
            Kind::GrpcWeb => {
                request.extensions_mut().insert(Protocol::GrpcWeb);
                let grpc_web = self.grpc_web.clone();
                Box::pin(async move {
                    let Ok(response) = grpc_web.oneshot(request).await;
                    response
                })
            }
            Kind::Connect(method, codec) => {
                let (api, grpc) = (self.api.clone(), self.grpc.clone());
                Box::pin(async move { connect::call(&api, method, codec, grpc, request).await })
            }
            Kind::Refused(status) => {
                let (message, allow, accepted) = match status {
                    StatusCode::METHOD_NOT_ALLOWED => {
                        ("an RPC is called with POST", header::ALLOW, "POST")
                    }
                    _ => (
                        "an RPC's body is application/json or application/proto",
                        header::HeaderName::from_static("accept-post"),
                        "application/json, application/proto",
                    ),
                };
                let mut response = answer(errors::plain(status, Code::Unimplemented, message));
                response
                    .headers_mut()
                    .insert(allow, HeaderValue::from_static(accepted));
                Box::pin(async move { response })
            }
            Kind::Other => {
                let fallback = self.fallback.clone();
                Box::pin(async move {
                    let Ok(response) = fallback.oneshot(request.map(Body::new)).await;
                    response
                })
            }
        };
        Box::pin(async move {
            let mut response = pending.await;
            if let Some(origin) = origin {
                Cors::decorate(&mut response, origin);
            }
            Ok(response)
        })
    }
}

/// A whole answer as a response with tonic's body.
fn answer(response: http::Response<Vec<u8>>) -> http::Response<Body> {
    response.map(|body| Body::new(Full::new(Bytes::from(body))))
}
