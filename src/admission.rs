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
        let deadline = match grpc_timeout(req.headers()) {
            Some(timeout) if timeout.is_zero() => return refuse(Error::DeadlineExceeded),
            Some(timeout) => {
                let deadline = arrived + timeout;
                req.extensions_mut().insert(Deadline(deadline));
                Some(deadline)
            }
            None => None,
        };
        Box::pin(async move {
            let _permit = permit;
            let Some(deadline) = deadline else {
                return inner.call(req).await;
            };
            // tonic also enforces grpc-timeout, outside this layer, but answers
            // CANCELLED; firing a millisecond earlier makes the client see the
            // standard DEADLINE_EXCEEDED.
            let at = deadline
                .checked_sub(Duration::from_millis(1))
                .unwrap_or(deadline);
            match tokio::time::timeout_at(at.into(), inner.call(req)).await {
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
mod tests {
    use super::*;

    fn parse(v: &str) -> Option<Duration> {
        let mut h = http::HeaderMap::new();
        h.insert("grpc-timeout", v.parse().unwrap());
        grpc_timeout(&h)
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
