//! The rate-limit tower layer, outside admission control: it asks the
//! [`RateLimiter`] (`crate::ratelimit`: the rules, the keys and the decision, on
//! Redis or in process) about every request a rule matches and refuses at once with
//! RESOURCE_EXHAUSTED (the error maps itself to its status), or lets it through and
//! adds `ratelimit-limit` / `ratelimit-remaining` / `ratelimit-reset` to the
//! response headers.
//!
//! It owns reading the request (method from the path, client address, headers) and
//! writing the response metadata. A grant whose rules count the client id in its
//! body is decided by its handler instead (`ratelimit::Deferred`, put in the
//! request's extensions here); the answer's metadata is still written here. It must never queue a request (tower's own
//! `RateLimit` waits for a slot; this refuses), and never limit health or
//! reflection: probes and tooling must answer however busy the service is.

use crate::{
    error::{self, whole_seconds},
    middleware::{BoxFuture, Middleware, MiddlewareLayer, Request, Response},
    ratelimit::{Deferred, Quota, RateLimiter},
    rpc::{self, Rpc},
};
use http::HeaderValue;
use std::sync::Arc;
use tower::Service;

/// The rate-limit layer around `limiter`.
pub(crate) fn layer(limiter: Arc<RateLimiter>) -> MiddlewareLayer<RateLimiter> {
    MiddlewareLayer::new(limiter)
}

impl Middleware for RateLimiter {
    fn call<S>(self: Arc<Self>, mut inner: S, req: Request) -> BoxFuture<Result<Response, S::Error>>
    where
        S: Service<Request, Response = Response> + Send + 'static,
        S::Future: Send + 'static,
        S::Error: Send + 'static,
    {
        let path = req.uri().path();
        let rpc = Rpc::of_path(path);
        // Envoy's rate limit service is the limiter itself, its rules in its own file.
        if rpc.is_exempt() || rpc == Rpc::ShouldRateLimit {
            return Box::pin(inner.call(req));
        }
        // `/auth.v1.AuthService/Login` → `Login` (an unknown path counts for `*` rules).
        let method = path.rsplit('/').next().unwrap_or_default();
        let client = rpc::client_ip(req.extensions());
        let identity = rpc::client_identity(req.extensions());
        if self.defers(method) {
            let deferred = Deferred::new(self.clone(), method, req.headers(), client, identity);
            let mut req = req;
            req.extensions_mut().insert(deferred.clone());
            return Box::pin(async move {
                let mut response = inner.call(req).await?;
                if let Some(quota) = deferred.quota() {
                    add_quota_headers(response.headers_mut(), quota);
                }
                Ok(response)
            });
        }
        let checks = self.plan(method, req.headers(), client, identity);
        if checks.is_empty() {
            return Box::pin(inner.call(req));
        }
        Box::pin(async move {
            match self.decide(&checks).await {
                Ok(quota) => {
                    let mut response = inner.call(req).await?;
                    add_quota_headers(response.headers_mut(), quota);
                    Ok(response)
                }
                Err(err) => {
                    tracing::debug!(error = %err, "request refused by the rate limiter");
                    Ok(error::layer_answer(err))
                }
            }
        })
    }
}

/// The draft IETF RateLimit fields, as gRPC response metadata.
fn add_quota_headers(headers: &mut http::HeaderMap, quota: Quota) {
    headers.insert("ratelimit-limit", HeaderValue::from(quota.limit));
    headers.insert("ratelimit-remaining", HeaderValue::from(quota.remaining));
    let reset = match whole_seconds(quota.reset) {
        0 => HeaderValue::from_static("0"), // the common case, without an allocation
        n => HeaderValue::from(n),
    };
    headers.insert("ratelimit-reset", reset);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        middleware::testing::{Counting, counting_service, request, sent, served},
        ratelimit::{FailureMode, Settings},
    };
    use std::{
        sync::atomic::{AtomicUsize, Ordering},
        time::Duration,
    };
    use tower::{Layer as _, ServiceExt as _};

    async fn service(
        rules: &str,
    ) -> (
        crate::middleware::MiddlewareService<RateLimiter, Counting>,
        Arc<AtomicUsize>,
    ) {
        let settings = Settings {
            rules: rules.parse().unwrap(),
            redis: None,
            prefix: "test".into(),
            redis_timeout: Duration::from_millis(50),
            failure: FailureMode::Open,
            max_local_keys: 1000,
            descriptors: false,
            clock: None,
        };
        let limiter = RateLimiter::start(settings, &crate::metrics::Metrics::new())
            .await
            .unwrap();
        let (inner, calls) = counting_service();
        (layer(limiter).layer(inner), calls)
    }

    fn header<'a>(response: &'a Response, name: &str) -> Option<&'a str> {
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
            assert!(served(&ok));
            assert_eq!(header(&ok, "ratelimit-limit"), Some("2"));
            assert_eq!(header(&ok, "ratelimit-remaining"), Some(remaining));
            assert_eq!(header(&ok, "ratelimit-reset"), Some(reset));
        }
        let refused = svc
            .clone()
            .oneshot(request("/auth.v1.AuthService/Login"))
            .await
            .unwrap();
        let refused = sent(refused);
        assert_eq!(header(&refused, "grpc-status"), Some("8")); // RESOURCE_EXHAUSTED
        assert_eq!(header(&refused, "ratelimit-remaining"), Some("0"));
        assert_eq!(header(&refused, "retry-after"), Some("60"));
        assert_eq!(calls.load(Ordering::SeqCst), 2);
        // Another method is not limited by a Login rule, and gets no quota headers.
        let other = svc
            .oneshot(request("/auth.v1.AuthService/Register"))
            .await
            .unwrap();
        assert!(served(&other));
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
        assert!(served(&first));
        for path in [
            "/grpc.health.v1.Health/Check",
            "/grpc.health.v1.Health/Watch",
            "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo",
            "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
        ] {
            for _ in 0..3 {
                let r = svc.clone().oneshot(request(path)).await.unwrap();
                assert!(served(&r), "{path}");
            }
        }
        // An unknown path is counted by `*` rules like any other method.
        let unknown = sent(svc.oneshot(request("/some.Other/Thing")).await.unwrap());
        assert_eq!(header(&unknown, "grpc-status"), Some("8"));
        assert_eq!(calls.load(Ordering::SeqCst), 13);
    }
}
