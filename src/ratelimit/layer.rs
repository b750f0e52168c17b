//! The rate-limit tower layer, outside admission control: it asks the
//! [`RateLimiter`] about every request a rule matches and refuses at once with
//! RESOURCE_EXHAUSTED (via `grpc::status`, the one place errors become a Status),
//! or lets it through and adds `ratelimit-limit` / `ratelimit-remaining` /
//! `ratelimit-reset` to the response headers.
//!
//! It owns reading the request (method from the path, peer address, headers) and
//! writing the response metadata. It must never queue a request (tower's own
//! `RateLimit` waits for a slot; this refuses), and never limit health or
//! reflection: probes and tooling must answer however busy the service is.

use super::{Quota, RateLimiter};
use crate::grpc::status;
use http::HeaderValue;
use std::{
    net::IpAddr,
    pin::Pin,
    sync::Arc,
    task::{Context, Poll},
};
use tonic::transport::server::TcpConnectInfo;
use tower::{Layer, Service};

/// Paths never limited.
const EXEMPT_PREFIXES: [&str; 2] = ["/grpc.health.v1.Health/", "/grpc.reflection."];

/// The tower layer; cheap to clone (one `Arc`).
#[derive(Clone)]
pub struct RateLimitLayer {
    limiter: Arc<RateLimiter>,
}

impl RateLimitLayer {
    pub fn new(limiter: Arc<RateLimiter>) -> Self {
        Self { limiter }
    }
}

impl<S> Layer<S> for RateLimitLayer {
    type Service = RateLimitService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        RateLimitService {
            inner,
            limiter: self.limiter.clone(),
        }
    }
}

#[derive(Clone)]
pub struct RateLimitService<S> {
    inner: S,
    limiter: Arc<RateLimiter>,
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

impl<S, B, ResBody> Service<http::Request<B>> for RateLimitService<S>
where
    S: Service<http::Request<B>, Response = http::Response<ResBody>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    B: Send + 'static,
    ResBody: Default + Send + 'static,
{
    type Response = http::Response<ResBody>;
    type Error = S::Error;
    type Future = BoxFuture<Result<Self::Response, Self::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        // The clone that was driven to readiness serves this request (tower's contract).
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let path = req.uri().path();
        if EXEMPT_PREFIXES.iter().any(|p| path.starts_with(p)) {
            return Box::pin(inner.call(req));
        }
        // `/auth.v1.AuthService/Login` → `Login`.
        let method = path.rsplit('/').next().unwrap_or_default();
        let peer: Option<IpAddr> = req
            .extensions()
            .get::<TcpConnectInfo>()
            .and_then(|info| info.remote_addr())
            .map(|addr| addr.ip());
        let checks = self.limiter.plan(method, req.headers(), peer);
        if checks.is_empty() {
            return Box::pin(inner.call(req));
        }
        let limiter = self.limiter.clone();
        Box::pin(async move {
            match limiter.decide(&checks).await {
                Ok(quota) => {
                    let mut response = inner.call(req).await?;
                    add_quota_headers(response.headers_mut(), quota);
                    Ok(response)
                }
                Err(err) => {
                    tracing::debug!(error = %err, "request refused by the rate limiter");
                    Ok(status(&err).into_http())
                }
            }
        })
    }
}

/// The draft IETF RateLimit fields, as gRPC response metadata.
fn add_quota_headers(headers: &mut http::HeaderMap, quota: Quota) {
    headers.insert("ratelimit-limit", HeaderValue::from(quota.limit));
    headers.insert("ratelimit-remaining", HeaderValue::from(quota.remaining));
    // Whole seconds, rounded up: a client waiting that long finds the slot free.
    let reset = quota.reset.as_secs() + u64::from(quota.reset.subsec_nanos() > 0);
    let reset = match reset {
        0 => HeaderValue::from_static("0"), // the common case, without an allocation
        n => HeaderValue::from(n),
    };
    headers.insert("ratelimit-reset", reset);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ratelimit::{FailureMode, Settings};
    use std::{
        convert::Infallible,
        sync::atomic::{AtomicUsize, Ordering},
        time::Duration,
    };
    use tower::ServiceExt as _;

    async fn service(
        rules: &str,
    ) -> (
        impl Service<http::Request<()>, Response = http::Response<String>, Error = Infallible> + Clone,
        Arc<AtomicUsize>,
    ) {
        let settings = Settings {
            rules: rules.parse().unwrap(),
            redis_url: None,
            prefix: "test".into(),
            redis_timeout: Duration::from_millis(50),
            failure: FailureMode::Open,
            trust_forwarded_for: false,
        };
        let limiter = RateLimiter::start(settings, &crate::metrics::Metrics::new())
            .await
            .unwrap();
        let (inner, calls) = crate::admission::tests::counting_service();
        (RateLimitLayer::new(limiter).layer(inner), calls)
    }

    fn request(path: &str) -> http::Request<()> {
        http::Request::builder().uri(path).body(()).unwrap()
    }

    fn header<'a>(response: &'a http::Response<String>, name: &str) -> Option<&'a str> {
        response.headers().get(name).map(|v| v.to_str().unwrap())
    }

    #[tokio::test]
    async fn refuses_beyond_the_limit_without_calling_the_service() {
        let (svc, calls) = service("Login:global=2/1m").await;
        for (remaining, reset) in [("1", "0"), ("0", "60")] {
            let ok = svc
                .clone()
                .oneshot(request("/auth.v1.AuthService/Login"))
                .await
                .unwrap();
            assert_eq!(ok.body(), "served");
            assert_eq!(header(&ok, "ratelimit-limit"), Some("2"));
            assert_eq!(header(&ok, "ratelimit-remaining"), Some(remaining));
            assert_eq!(header(&ok, "ratelimit-reset"), Some(reset));
        }
        let refused = svc
            .clone()
            .oneshot(request("/auth.v1.AuthService/Login"))
            .await
            .unwrap();
        assert_eq!(header(&refused, "grpc-status"), Some("8")); // RESOURCE_EXHAUSTED
        assert_eq!(header(&refused, "ratelimit-remaining"), Some("0"));
        assert_eq!(header(&refused, "retry-after"), Some("60"));
        assert_eq!(calls.load(Ordering::SeqCst), 2);
        // Another method is not limited by a Login rule, and gets no quota headers.
        let other = svc
            .oneshot(request("/auth.v1.AuthService/Register"))
            .await
            .unwrap();
        assert_eq!(other.body(), "served");
        assert_eq!(header(&other, "ratelimit-limit"), None);
    }

    #[tokio::test]
    async fn health_and_reflection_are_never_limited() {
        let (svc, calls) = service("*:global=1/1m").await;
        let first = svc
            .clone()
            .oneshot(request("/auth.v1.AuthService/Login"))
            .await
            .unwrap();
        assert_eq!(first.body(), "served");
        for path in [
            "/grpc.health.v1.Health/Check",
            "/grpc.health.v1.Health/Watch",
            "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo",
            "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
        ] {
            for _ in 0..3 {
                let r = svc.clone().oneshot(request(path)).await.unwrap();
                assert_eq!(r.body(), "served", "{path}");
            }
        }
        // An unknown path is counted by `*` rules like any other method.
        let unknown = svc.oneshot(request("/some.Other/Thing")).await.unwrap();
        assert_eq!(header(&unknown, "grpc-status"), Some("8"));
        assert_eq!(calls.load(Ordering::SeqCst), 13);
    }
}
