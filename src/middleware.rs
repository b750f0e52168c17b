//! The shell every tower layer of authd shares: a `Clone` Layer and Service that
//! hand each request, with the inner service ready to serve it, to a [`Middleware`].
//!
//! A layer is then only its policy, what to do with one request (see `trace`,
//! `layers::ratelimit`, `admission`); tower's contract is kept here, once: the inner
//! service that `poll_ready` drove to readiness is the one that serves the request,
//! and the layer keeps a fresh clone for the next. Every layer sees requests and
//! responses with tonic's body type, as the router below them does.

use std::{
    pin::Pin,
    sync::Arc,
    task::{Context, Poll},
};
use tower::{Layer, Service};

/// A request as the layers see it.
pub(crate) type Request = http::Request<tonic::body::Body>;
/// A response as the layers see it.
pub(crate) type Response = http::Response<tonic::body::Body>;
/// The future of a layer's answer.
pub(crate) type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

/// What a layer does with one request.
pub(crate) trait Middleware: Send + Sync + 'static {
    /// Handles `request`: answers it itself (a refusal), or passes it to `inner`,
    /// which is ready to take it, and returns (perhaps amended) its response.
    fn call<S>(
        self: Arc<Self>,
        inner: S,
        request: Request,
    ) -> BoxFuture<Result<Response, S::Error>>
    where
        S: Service<Request, Response = Response> + Send + 'static,
        S::Future: Send + 'static,
        S::Error: Send + 'static;
}

/// The tower layer of a [`Middleware`]; cheap to clone (one `Arc`).
pub(crate) struct MiddlewareLayer<M> {
    middleware: Arc<M>,
}

impl<M> MiddlewareLayer<M> {
    pub(crate) fn new(middleware: Arc<M>) -> Self {
        Self { middleware }
    }
}

impl<M> Clone for MiddlewareLayer<M> {
    fn clone(&self) -> Self {
        Self {
            middleware: self.middleware.clone(),
        }
    }
}

impl<M, S> Layer<S> for MiddlewareLayer<M> {
    type Service = MiddlewareService<M, S>;

    fn layer(&self, inner: S) -> Self::Service {
        MiddlewareService {
            middleware: self.middleware.clone(),
            inner,
        }
    }
}

/// The tower service of a [`Middleware`] around `S`.
pub(crate) struct MiddlewareService<M, S> {
    middleware: Arc<M>,
    inner: S,
}

impl<M, S: Clone> Clone for MiddlewareService<M, S> {
    fn clone(&self) -> Self {
        Self {
            middleware: self.middleware.clone(),
            inner: self.inner.clone(),
        }
    }
}

impl<M, S> Service<Request> for MiddlewareService<M, S>
where
    M: Middleware,
    S: Service<Request, Response = Response> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
{
    type Response = Response;
    type Error = S::Error;
    type Future = BoxFuture<Result<Response, S::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request) -> Self::Future {
        // The clone that was driven to readiness serves this request (tower's
        // contract); a fresh clone waits for the next `poll_ready`.
        let clone = self.inner.clone();
        let ready = std::mem::replace(&mut self.inner, clone);
        self.middleware.clone().call(ready, request)
    }
}

#[cfg(test)]
pub(crate) mod testing {
    //! An inner service for the layers' unit tests.

    use super::*;
    use std::{
        convert::Infallible,
        sync::atomic::{AtomicUsize, Ordering},
    };

    /// The header the counting service sets on the responses it produces.
    pub(crate) const SERVED: &str = "x-served";

    pub(crate) type Counting = tower::util::BoxCloneService<Request, Response, Infallible>;

    /// Answers every request with a response carrying [`SERVED`], counting its calls.
    pub(crate) fn counting_service() -> (Counting, Arc<AtomicUsize>) {
        let calls = Arc::new(AtomicUsize::new(0));
        let service = tower::service_fn({
            let calls = calls.clone();
            move |_request: Request| {
                calls.fetch_add(1, Ordering::SeqCst);
                let mut response = Response::new(tonic::body::Body::empty());
                response
                    .headers_mut()
                    .insert(SERVED, http::HeaderValue::from_static("1"));
                async { Ok::<_, Infallible>(response) }
            }
        });
        (Counting::new(service), calls)
    }

    /// Whether the counting service produced `response` (it was not refused).
    pub(crate) fn served(response: &Response) -> bool {
        response.headers().contains_key(SERVED)
    }

    /// A request for `path`, from `peer`.
    pub(crate) fn request(path: &str) -> Request {
        let mut request = http::Request::builder()
            .uri(path)
            .body(tonic::body::Body::empty())
            .unwrap();
        request
            .extensions_mut()
            .insert(tonic::transport::server::TcpConnectInfo {
                local_addr: None,
                remote_addr: Some("10.0.0.1:4000".parse().unwrap()),
            });
        request
    }

    /// `response` as sent when nothing holds it: a layer's unsent refusal encoded with
    /// its hint, as pushback does when it answers at once.
    pub(crate) fn sent(mut response: Response) -> Response {
        match response.extensions_mut().remove::<crate::error::Unsent>() {
            Some(unsent) => unsent.encode(None, response.into_parts().0.headers),
            None => response,
        }
    }

    /// The status a client reads from a trailers-only response (an error's), if it is one.
    pub(crate) fn status(response: &Response) -> Option<tonic::Status> {
        tonic::Status::from_header_map(response.headers())
    }

    /// The `grpc-status` of a response, if it has one.
    pub(crate) fn grpc_status(response: &Response) -> Option<&str> {
        response
            .headers()
            .get("grpc-status")
            .map(|v| v.to_str().unwrap())
    }

    #[tokio::test]
    async fn the_service_driven_to_readiness_serves_the_request() {
        use tower::ServiceExt as _;
        struct Pass;
        impl Middleware for Pass {
            fn call<S>(
                self: Arc<Self>,
                inner: S,
                request: Request,
            ) -> BoxFuture<Result<Response, S::Error>>
            where
                S: Service<Request, Response = Response> + Send + 'static,
                S::Future: Send + 'static,
                S::Error: Send + 'static,
            {
                Box::pin(inner.oneshot(request))
            }
        }
        let (inner, calls) = counting_service();
        let service = MiddlewareLayer::new(Arc::new(Pass)).layer(inner);
        for _ in 0..3 {
            let response = service.clone().oneshot(request("/x/y")).await.unwrap();
            assert!(served(&response));
        }
        assert_eq!(calls.load(Ordering::SeqCst), 3);
    }
}
