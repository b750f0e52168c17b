//! Admission control: the tower layer in front of `auth.v1.AuthService`.
//!
//! It does three things, each refusing at once rather than queueing:
//! - caps the requests in flight (RESOURCE_EXHAUSTED with a retry hint beyond it);
//! - turns the client's `grpc-timeout` into a [`Deadline`] the handlers pass down
//!   (the hash pool drops work whose deadline passed), and answers DEADLINE_EXCEEDED
//!   when it passes;
//! - during a graceful shutdown, refuses new work with UNAVAILABLE while the work
//!   already admitted finishes ([`Admission::drain`]).
//!
//! Health and reflection are never limited: probes must answer when the service is full.

use crate::{error::Error, grpc::status};
use std::{
    pin::Pin,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    task::{Context, Poll},
    time::{Duration, Instant},
};
use tokio::sync::Semaphore;
use tower::{Layer, Service};

/// The instant after which nobody waits for the answer any more.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Deadline(pub Instant);

/// Paths the layer governs; everything else (health, reflection) passes untouched.
const GOVERNED_PREFIX: &str = "/auth.v1.AuthService/";

/// Shared state of the admission layer.
pub struct Admission {
    permits: Arc<Semaphore>,
    max_in_flight: u32,
    draining: AtomicBool,
}

impl Admission {
    pub fn new(max_in_flight: u32) -> Arc<Self> {
        let max_in_flight = max_in_flight.clamp(1, Semaphore::MAX_PERMITS as u32);
        Arc::new(Self {
            permits: Arc::new(Semaphore::new(max_in_flight as usize)),
            max_in_flight,
            draining: AtomicBool::new(false),
        })
    }

    /// Requests currently admitted.
    pub fn in_flight(&self) -> usize {
        self.max_in_flight as usize - self.permits.available_permits()
    }

    /// Stops admitting new requests and waits until those admitted have finished,
    /// at most `timeout`. Returns whether everything finished in time.
    pub async fn drain(&self, timeout: Duration) -> bool {
        self.draining.store(true, Ordering::SeqCst);
        // Holding every permit means no request is in flight.
        let all = self.permits.acquire_many(self.max_in_flight);
        matches!(tokio::time::timeout(timeout, all).await, Ok(Ok(_)))
    }
}

/// The tower layer; cheap to clone.
#[derive(Clone)]
pub struct AdmissionLayer {
    state: Arc<Admission>,
}

impl AdmissionLayer {
    pub fn new(state: Arc<Admission>) -> Self {
        Self { state }
    }
}

impl<S> Layer<S> for AdmissionLayer {
    type Service = AdmissionService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        AdmissionService {
            inner,
            state: self.state.clone(),
        }
    }
}

#[derive(Clone)]
pub struct AdmissionService<S> {
    inner: S,
    state: Arc<Admission>,
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

impl<S, B, ResBody> Service<http::Request<B>> for AdmissionService<S>
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

    fn call(&mut self, mut req: http::Request<B>) -> Self::Future {
        let arrived = Instant::now();
        // The clone that was driven to readiness serves this request (tower's contract).
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        if !req.uri().path().starts_with(GOVERNED_PREFIX) {
            return Box::pin(inner.call(req));
        }
        let refuse = |err: Error| -> Self::Future {
            let response = status(&err).into_http::<ResBody>();
            Box::pin(async move { Ok(response) })
        };
        if self.state.draining.load(Ordering::SeqCst) {
            return refuse(Error::Unavailable("the server is shutting down".into()));
        }
        let Ok(permit) = self.state.permits.clone().try_acquire_owned() else {
            return refuse(Error::Overloaded {
                what: "too many requests in flight",
                retry_after: Duration::from_millis(100),
            });
        };
        let timeout = grpc_timeout(req.headers());
        if timeout.is_some_and(|t| t.is_zero()) {
            return refuse(Error::DeadlineExceeded);
        }
        let deadline = timeout.map(|timeout| {
            let deadline = arrived + timeout;
            req.extensions_mut().insert(Deadline(deadline));
            // Answer a little before the deadline: the client's own timer started
            // before ours (the request had to travel), and a client that times out by
            // itself reports a bare CANCELLED or DEADLINE_EXCEEDED with no server status.
            deadline - (timeout / 20).min(Duration::from_millis(20))
        });
        Box::pin(async move {
            let _permit = permit;
            let Some(answer_by) = deadline else {
                return inner.call(req).await;
            };
            match tokio::time::timeout_at(answer_by.into(), inner.call(req)).await {
                Ok(result) => result,
                Err(_) => Ok(status(&Error::DeadlineExceeded).into_http()),
            }
        })
    }
}

/// Parses the `grpc-timeout` header: up to 8 digits and a unit (H, M, S, m, u, n).
fn grpc_timeout(headers: &http::HeaderMap) -> Option<Duration> {
    let value = headers.get("grpc-timeout")?.to_str().ok()?;
    if value.len() < 2 || value.len() > 9 {
        return None;
    }
    let (digits, unit) = value.split_at(value.len() - 1);
    let n: u64 = digits.parse().ok()?;
    Some(match unit {
        "H" => Duration::from_secs(n.checked_mul(3600)?),
        "M" => Duration::from_secs(n.checked_mul(60)?),
        "S" => Duration::from_secs(n),
        "m" => Duration::from_millis(n),
        "u" => Duration::from_micros(n),
        "n" => Duration::from_nanos(n),
        _ => return None,
    })
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    fn parse(v: &str) -> Option<Duration> {
        let mut h = http::HeaderMap::new();
        h.insert("grpc-timeout", v.parse().unwrap());
        grpc_timeout(&h)
    }

    use std::{convert::Infallible, sync::atomic::AtomicUsize};

    pub(crate) type Counting =
        tower::util::BoxCloneService<http::Request<()>, http::Response<String>, Infallible>;

    /// An inner service for layer tests: answers "served" and counts its calls.
    pub(crate) fn counting_service() -> (Counting, Arc<AtomicUsize>) {
        let calls = Arc::new(AtomicUsize::new(0));
        let service = tower::service_fn({
            let calls = calls.clone();
            move |_req: http::Request<()>| {
                calls.fetch_add(1, Ordering::SeqCst);
                async { Ok::<_, Infallible>(http::Response::new(String::from("served"))) }
            }
        });
        (Counting::new(service), calls)
    }

    /// An admission service around an inner service that counts its calls.
    fn service(
        state: Arc<Admission>,
    ) -> (
        impl Service<http::Request<()>, Response = http::Response<String>, Error = Infallible> + Clone,
        Arc<AtomicUsize>,
    ) {
        let (inner, calls) = counting_service();
        (AdmissionLayer::new(state).layer(inner), calls)
    }

    fn request(path: &str, timeout: Option<&str>) -> http::Request<()> {
        let mut builder = http::Request::builder().uri(path);
        if let Some(t) = timeout {
            builder = builder.header("grpc-timeout", t);
        }
        builder.body(()).unwrap()
    }

    fn grpc_status(response: &http::Response<String>) -> Option<&str> {
        response
            .headers()
            .get("grpc-status")
            .map(|v| v.to_str().unwrap())
    }

    #[tokio::test]
    async fn a_deadline_already_passed_is_refused_without_calling_the_service() {
        use tower::ServiceExt as _;
        let (svc, calls) = service(Admission::new(10));
        let response = svc
            .oneshot(request("/auth.v1.AuthService/Login", Some("0n")))
            .await
            .unwrap();
        assert_eq!(grpc_status(&response), Some("4")); // DEADLINE_EXCEEDED
        assert_eq!(calls.load(Ordering::SeqCst), 0);
    }

    #[tokio::test]
    async fn draining_refuses_auth_calls_but_not_health() {
        use tower::ServiceExt as _;
        let state = Admission::new(10);
        assert!(
            state.drain(Duration::from_millis(10)).await,
            "nothing in flight"
        );
        let (svc, calls) = service(state);
        let refused = svc
            .clone()
            .oneshot(request("/auth.v1.AuthService/Register", None))
            .await
            .unwrap();
        assert_eq!(grpc_status(&refused), Some("14")); // UNAVAILABLE
        let health = svc
            .oneshot(request("/grpc.health.v1.Health/Check", None))
            .await
            .unwrap();
        assert_eq!(health.body(), "served");
        assert_eq!(calls.load(Ordering::SeqCst), 1);
    }

    #[test]
    fn grpc_timeout_units() {
        assert_eq!(parse("2H"), Some(Duration::from_secs(7200)));
        assert_eq!(parse("3M"), Some(Duration::from_secs(180)));
        assert_eq!(parse("5S"), Some(Duration::from_secs(5)));
        assert_eq!(parse("250m"), Some(Duration::from_millis(250)));
        assert_eq!(parse("7u"), Some(Duration::from_micros(7)));
        assert_eq!(parse("9n"), Some(Duration::from_nanos(9)));
        assert_eq!(parse("0m"), Some(Duration::ZERO));
        for bad in ["", "S", "5", "5x", "123456789S", "-1S", "1.5S"] {
            assert_eq!(parse(bad), None, "{bad:?}");
        }
    }
}
