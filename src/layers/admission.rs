//! Admission control: the tower layer in front of `auth.v1.AuthService`.
//!
//! It refuses at once rather than queueing, and holds no place for a request that
//! has not fully arrived:
//! - it receives the whole request first, within `AUTHD_RECEIVE_TIMEOUT` (and the
//!   client's deadline) and at most the message size limit: a client that sends
//!   headers and never the body gets DEADLINE_EXCEEDED when that time is up, and
//!   meanwhile holds no in-flight place;
//! - it bounds what one client (its IP address, or the trusted `x-forwarded-for`
//!   client) may have open at once, from headers to answer, so one client cannot
//!   take the capacity away from the others, without refusing a busy client while
//!   the capacity is idle: past its share (`AUTHD_MAX_IN_FLIGHT_PER_CLIENT`) a client
//!   may still open requests as long as one share of the in-flight cap stays free
//!   for whoever comes next;
//! - it caps the requests in flight (RESOURCE_EXHAUSTED with a retry hint beyond it);
//! - it bounds them by time (`AUTHD_IN_FLIGHT_WAIT`): requests are admitted while
//!   those in flight, at the rate the server is measured to answer them
//!   ([`super::pace`]), would be answered within the target, never fewer than the
//!   floor (what keeps the hashing threads busy); at that bound a client holding less
//!   than its fair share of it (the bound over the clients with requests in flight)
//!   is still admitted, up to twice the bound in all, so a busy client alone may use
//!   all of it and a client arriving beside it is not refused for its sake;
//! - it turns the client's `grpc-timeout` into a [`Deadline`] the handlers pass down
//!   (the hash pool drops work whose deadline passed), and answers DEADLINE_EXCEEDED
//!   when it passes;
//! - during a graceful shutdown, it refuses new work with UNAVAILABLE while the work
//!   already admitted finishes ([`Admission::drain`]).
//!
//! Health and reflection are never limited: probes must answer when the service is full.

use super::pace::Pace;
use crate::{
    error::Error,
    metrics::OverloadMetrics,
    middleware::{BoxFuture, Middleware, MiddlewareLayer, Request, Response},
    rpc::{self, Deadline, Rpc},
};
use http_body_util::{BodyExt as _, Full, Limited};
use std::{
    collections::HashMap,
    net::IpAddr,
    sync::{
        Arc, Mutex, MutexGuard,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};
use tokio::{sync::Semaphore, time::Instant};
use tonic::body::Body;
use tower::Service;

/// The gRPC framing of a message: a flag byte and a 4-byte length.
const GRPC_FRAME_HEADER: usize = 5;

/// How admission control is configured.
#[derive(Debug, Clone)]
pub struct AdmissionSettings {
    /// Requests in flight at once (received, being worked on).
    pub max_in_flight: u32,
    /// Requests one client may have open at once, being received or in flight.
    pub max_per_client: u32,
    /// Longest a request may take to arrive, from its headers to the end of its body.
    pub receive_timeout: Duration,
    /// The largest request body (gRPC framing included) worth receiving.
    pub max_body_bytes: usize,
    /// The target time in flight, which bounds the requests in flight by the rate
    /// they are answered at; zero turns the bound off.
    pub wait_target: Duration,
    /// The fewest requests in flight that bound allows.
    pub wait_floor: u32,
}

/// Shared state of the admission layer.
pub struct Admission {
    permits: Arc<Semaphore>,
    settings: AdmissionSettings,
    draining: AtomicBool,
    /// Open requests per client, and in all.
    clients: Mutex<Open>,
    metrics: OverloadMetrics,
}

/// Requests open (being received or in flight) and in flight, in all and per
/// client, and the pace they are answered at; an entry lives while its client has a
/// request open, so the map is bounded by the requests open.
struct Open {
    total: u32,
    clients: HashMap<IpAddr, Counts>,
    in_flight: u32,
    /// Clients with a request in flight.
    busy_clients: u32,
    pace: Pace,
}

/// One client's requests: open, and of those in flight.
#[derive(Default)]
struct Counts {
    open: u32,
    in_flight: u32,
}

/// Why the bound by time refused a request.
enum Beyond {
    /// In flight at the bound, and this client alone (or everyone at twice it).
    Wait,
    /// In flight at the bound, and this client holds its fair share of it.
    Share,
}

impl Admission {
    pub fn new(mut settings: AdmissionSettings, metrics: OverloadMetrics) -> Arc<Self> {
        settings.max_in_flight = settings
            .max_in_flight
            .clamp(1, Semaphore::MAX_PERMITS as u32);
        settings.max_per_client = settings.max_per_client.max(1);
        let pace = Pace::new(
            settings.wait_target,
            settings.wait_floor,
            settings.max_in_flight,
            Instant::now(),
        );
        metrics.in_flight_limit.set(pace.limit().into());
        Arc::new(Self {
            permits: Arc::new(Semaphore::new(settings.max_in_flight as usize)),
            settings,
            draining: AtomicBool::new(false),
            clients: Mutex::new(Open {
                total: 0,
                clients: HashMap::new(),
                in_flight: 0,
                busy_clients: 0,
                pace,
            }),
            metrics,
        })
    }

    /// Requests currently admitted (received and not yet answered).
    pub fn in_flight(&self) -> usize {
        self.settings.max_in_flight as usize - self.permits.available_permits()
    }

    /// Requests open (being received or in flight) for `client`.
    pub fn open_for(&self, client: IpAddr) -> u32 {
        (self.lock().clients.get(&client.to_canonical())).map_or(0, |c| c.open)
    }

    /// The most requests that may be in flight now, by the bound by time.
    #[cfg(test)]
    pub fn in_flight_limit(&self) -> u32 {
        self.lock().pace.limit()
    }

    fn lock(&self) -> MutexGuard<'_, Open> {
        self.clients.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Stops admitting new requests and waits until those admitted have finished,
    /// at most `timeout`. Returns whether everything finished in time.
    pub async fn drain(&self, timeout: Duration) -> bool {
        self.draining.store(true, Ordering::SeqCst);
        // Holding every permit means no request is in flight.
        let all = self.permits.acquire_many(self.settings.max_in_flight);
        matches!(tokio::time::timeout(timeout, all).await, Ok(Ok(_)))
    }

    /// Counts a request open for `client`, unless the client has its share open and
    /// what is left of the in-flight cap is no more than one share.
    fn open(self: &Arc<Self>, client: IpAddr) -> Option<ClientShare> {
        let mut open = self.lock();
        let Open { total, clients, .. } = &mut *open;
        let share = self.settings.max_per_client;
        let room_beyond_a_share = total.saturating_add(share) < self.settings.max_in_flight;
        let mine = clients.entry(client).or_default();
        if mine.open >= share && !room_beyond_a_share {
            if mine.open == 0 {
                clients.remove(&client);
            }
            return None;
        }
        mine.open += 1;
        *total += 1;
        Some(ClientShare {
            admission: self.clone(),
            client,
            in_flight: false,
        })
    }

    /// Counts `share`'s request in flight, unless the bound by time refuses it.
    fn start(&self, share: &mut ClientShare) -> Result<(), Beyond> {
        let now = Instant::now();
        let mut open = self.lock();
        let Open {
            clients,
            in_flight,
            busy_clients,
            pace,
            ..
        } = &mut *open;
        let mine = clients.entry(share.client).or_default();
        let limit = pace.limit();
        if *in_flight >= limit {
            let active = *busy_clients + u32::from(mine.in_flight == 0);
            let fair = limit.div_ceil(active.max(1));
            if mine.in_flight >= fair || *in_flight >= limit.saturating_mul(2) {
                return Err(if active > 1 && mine.in_flight >= fair {
                    Beyond::Share
                } else {
                    Beyond::Wait
                });
            }
        }
        pace.admitted(now, *in_flight);
        *in_flight += 1;
        if mine.in_flight == 0 {
            *busy_clients += 1;
        }
        mine.in_flight += 1;
        share.in_flight = true;
        Ok(())
    }

    /// The retry hint of a refusal by the bound by time: about when the requests in
    /// flight have been answered.
    fn wait_hint(&self) -> Duration {
        self.settings.wait_target.max(Duration::from_millis(10))
    }
}

/// One request counted against its client's share (and, once started, in flight),
/// until dropped.
struct ClientShare {
    admission: Arc<Admission>,
    client: IpAddr,
    in_flight: bool,
}

impl Drop for ClientShare {
    fn drop(&mut self) {
        let now = Instant::now();
        let mut open = self.admission.lock();
        let Open {
            total,
            clients,
            in_flight,
            busy_clients,
            pace,
        } = &mut *open;
        let Some(mine) = clients.get_mut(&self.client) else {
            return;
        };
        if self.in_flight {
            mine.in_flight -= 1;
            *in_flight -= 1;
            if mine.in_flight == 0 {
                *busy_clients -= 1;
            }
            if pace.answered(now, *in_flight) {
                let metrics = &self.admission.metrics;
                metrics.in_flight_limit.set(pace.limit().into());
                metrics.answer_rate.set(pace.rate().unwrap_or(0.0));
            }
        }
        mine.open -= 1;
        *total -= 1;
        if mine.open == 0 {
            clients.remove(&self.client);
        }
    }
}

/// The admission layer around `state`.
pub(crate) fn layer(state: Arc<Admission>) -> MiddlewareLayer<Admission> {
    MiddlewareLayer::new(state)
}

impl Middleware for Admission {
    fn call<S>(self: Arc<Self>, mut inner: S, req: Request) -> BoxFuture<Result<Response, S::Error>>
    where
        S: Service<Request, Response = Response> + Send + 'static,
        S::Future: Send + 'static,
        S::Error: Send + 'static,
    {
        let arrived = Instant::now();
        let rpc = Rpc::of_path(req.uri().path());
        if rpc.is_exempt() {
            return Box::pin(inner.call(req));
        }
        // Envoy's Check carries the proxied request's headers: a larger bound of its own.
        let max_body_bytes = match rpc {
            Rpc::ExtAuthzCheck => rpc::MAX_CHECK_REQUEST_BYTES + GRPC_FRAME_HEADER,
            _ => self.settings.max_body_bytes,
        };
        let refuse = |err: Error| -> BoxFuture<Result<Response, S::Error>> {
            let response = err.to_status().into_http();
            Box::pin(async move { Ok(response) })
        };
        if self.draining.load(Ordering::SeqCst) {
            self.metrics.admission_draining.inc();
            return refuse(Error::Unavailable("the server is shutting down".into()));
        }
        let timeout = rpc::grpc_timeout(req.headers());
        if timeout.is_some_and(|t| t.is_zero()) {
            return refuse(Error::DeadlineExceeded);
        }
        let client = rpc::request_client(&req);
        // The share covers the request from its headers to its answer, receiving included.
        let Some(share) = self.open(client) else {
            self.metrics.admission_client.inc();
            return refuse(Error::Overloaded {
                what: "too many requests in flight from this client",
                retry_after: Duration::from_millis(100),
            });
        };
        // A deadline far in the future (or one that overflows) is no deadline.
        let deadline = timeout.and_then(|timeout| arrived.checked_add(timeout));
        let receive_by = arrived
            .checked_add(self.settings.receive_timeout)
            .map_or(deadline, |by| Some(deadline.map_or(by, |d| d.min(by))));
        Box::pin(async move {
            let mut share = share;
            let answer = |err: Error| Ok(err.to_status().into_http());
            let (mut parts, body) = req.into_parts();
            let limited = Limited::new(body, max_body_bytes);
            let received = match receive_by {
                Some(by) => tokio::time::timeout_at(by, limited.collect()).await,
                None => Ok(limited.collect().await),
            };
            let body = match received {
                Ok(Ok(collected)) => collected.to_bytes(),
                Err(_) if deadline.is_some_and(|d| Instant::now() >= d) => {
                    return answer(Error::DeadlineExceeded);
                }
                Err(_) => return answer(Error::ReceiveTimeout),
                Ok(Err(e)) if e.is::<http_body_util::LengthLimitError>() => {
                    return answer(Error::TooLarge {
                        limit: max_body_bytes,
                    });
                }
                Ok(Err(_)) => return answer(Error::Cancelled),
            };
            if self.draining.load(Ordering::SeqCst) {
                self.metrics.admission_draining.inc();
                return answer(Error::Unavailable("the server is shutting down".into()));
            }
            let Ok(_permit) = self.permits.clone().try_acquire_owned() else {
                self.metrics.admission_in_flight.inc();
                return answer(Error::Overloaded {
                    what: "too many requests in flight",
                    retry_after: Duration::from_millis(100),
                });
            };
            if let Err(beyond) = self.start(&mut share) {
                let what = match beyond {
                    Beyond::Wait => {
                        self.metrics.admission_wait.inc();
                        "the requests in flight would not be answered within the server's target"
                    }
                    Beyond::Share => {
                        self.metrics.admission_share.inc();
                        "this client holds its share of the requests in flight"
                    }
                };
                let retry_after = self.wait_hint();
                return answer(Error::Overloaded { what, retry_after });
            }
            let answer_by = deadline.map(|deadline| {
                parts.extensions.insert(Deadline(deadline.into_std()));
                let timeout = deadline - arrived;
                // Answer a little before the deadline: the client's own timer started
                // before ours (the request had to travel), and a client that times out by
                // itself reports a bare CANCELLED or DEADLINE_EXCEEDED with no server status.
                deadline - (timeout / 20).min(Duration::from_millis(20))
            });
            let req = http::Request::from_parts(parts, Body::new(Full::new(body)));
            let Some(answer_by) = answer_by else {
                return inner.call(req).await;
            };
            match tokio::time::timeout_at(answer_by, inner.call(req)).await {
                Ok(result) => result,
                Err(_) => answer(Error::DeadlineExceeded),
            }
        })
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::middleware::{
        MiddlewareService,
        testing::{Counting, SERVED, counting_service, grpc_status, served},
    };
    use bytes::Bytes;
    use std::{convert::Infallible, sync::atomic::AtomicUsize};
    use tonic::transport::server::TcpConnectInfo;
    use tower::{Layer as _, ServiceExt as _};

    fn settings(max_in_flight: u32, max_per_client: u32) -> AdmissionSettings {
        AdmissionSettings {
            max_in_flight,
            max_per_client,
            receive_timeout: Duration::from_secs(5),
            max_body_bytes: 64,
            wait_target: Duration::ZERO,
            wait_floor: 1,
        }
    }

    fn admission(settings: AdmissionSettings) -> Arc<Admission> {
        Admission::new(settings, crate::metrics::Metrics::new().overload.clone())
    }

    /// An admission service around an inner service that counts its calls.
    fn service(
        state: Arc<Admission>,
    ) -> (MiddlewareService<Admission, Counting>, Arc<AtomicUsize>) {
        let (inner, calls) = counting_service();
        (layer(state).layer(inner), calls)
    }

    fn request(path: &str, timeout: Option<&str>) -> http::Request<Body> {
        with_body(path, timeout, Body::empty())
    }

    fn with_body(path: &str, timeout: Option<&str>, body: Body) -> http::Request<Body> {
        let mut builder = http::Request::builder().uri(path);
        if let Some(t) = timeout {
            builder = builder.header("grpc-timeout", t);
        }
        let mut request = builder.body(body).unwrap();
        request.extensions_mut().insert(TcpConnectInfo {
            local_addr: None,
            remote_addr: Some("10.0.0.1:4000".parse().unwrap()),
        });
        request
    }

    /// A body whose bytes never come.
    fn never() -> Body {
        let frames = futures::stream::pending::<Result<http_body::Frame<Bytes>, Infallible>>();
        Body::new(http_body_util::StreamBody::new(frames))
    }

    #[tokio::test]
    async fn a_deadline_already_passed_is_refused_without_calling_the_service() {
        let (svc, calls) = service(admission(settings(10, 10)));
        let response = svc
            .oneshot(request("/auth.v1.AuthService/Login", Some("0n")))
            .await
            .unwrap();
        assert_eq!(grpc_status(&response), Some("4")); // DEADLINE_EXCEEDED
        assert_eq!(calls.load(Ordering::SeqCst), 0);
    }

    #[tokio::test]
    async fn draining_refuses_auth_calls_but_not_health() {
        let state = admission(settings(10, 10));
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
        assert!(served(&health));
        assert_eq!(calls.load(Ordering::SeqCst), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn a_request_whose_body_never_comes_holds_no_place_and_times_out() {
        let state = admission(settings(1, 10));
        let (svc, calls) = service(state.clone());
        let waiting = tokio::spawn(svc.clone().oneshot(with_body(
            "/auth.v1.AuthService/Login",
            None,
            never(),
        )));
        tokio::time::sleep(Duration::from_secs(1)).await;
        // Still receiving: counted for its client, but not in flight.
        assert_eq!(state.open_for("10.0.0.1".parse().unwrap()), 1);
        assert_eq!(state.in_flight(), 0);
        // So the one in-flight place is free for a complete request.
        let response = svc
            .clone()
            .oneshot(request("/auth.v1.AuthService/Login", None))
            .await
            .unwrap();
        assert!(served(&response));
        // At the receive timeout the incomplete request is answered and forgotten.
        let answered = waiting.await.unwrap().unwrap();
        assert_eq!(grpc_status(&answered), Some("4")); // DEADLINE_EXCEEDED
        assert_eq!(calls.load(Ordering::SeqCst), 1);
        assert_eq!(state.open_for("10.0.0.1".parse().unwrap()), 0);
        assert!(state.clients.lock().unwrap().clients.is_empty());
        // Nothing held: a drain finishes at once.
        assert!(state.drain(Duration::from_millis(1)).await);
    }

    #[tokio::test(start_paused = true)]
    async fn past_its_share_a_client_leaves_one_share_free_for_the_others() {
        // A cap of 8, shares of 2: one busy client may open 6 (leaving 2 free).
        let state = admission(settings(8, 2));
        let (svc, calls) = service(state.clone());
        let held: Vec<_> = (0..6)
            .map(|_| {
                tokio::spawn(svc.clone().oneshot(with_body(
                    "/auth.v1.AuthService/Login",
                    None,
                    never(),
                )))
            })
            .collect();
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert_eq!(state.open_for("10.0.0.1".parse().unwrap()), 6);
        let refused = svc
            .clone()
            .oneshot(request("/auth.v1.AuthService/Login", None))
            .await
            .unwrap();
        assert_eq!(grpc_status(&refused), Some("8")); // RESOURCE_EXHAUSTED
        // Another client gets its share at once.
        let other = |n: u8| {
            let mut other = request("/auth.v1.AuthService/Login", None);
            other.extensions_mut().insert(TcpConnectInfo {
                local_addr: None,
                remote_addr: Some(format!("10.0.0.{n}:4000").parse().unwrap()),
            });
            other
        };
        let second: Vec<_> = (0..2)
            .map(|_| {
                let mut request = other(2);
                *request.body_mut() = never();
                tokio::spawn(svc.clone().oneshot(request))
            })
            .collect();
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert_eq!(state.open_for("10.0.0.2".parse().unwrap()), 2);
        // Any client's share is there whatever the others hold.
        assert!(served(&svc.clone().oneshot(other(3)).await.unwrap()));
        // When the busy client's requests end, it may use the idle capacity again.
        for task in held {
            task.abort();
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
        let again = svc
            .clone()
            .oneshot(request("/auth.v1.AuthService/Login", None));
        assert!(served(&again.await.unwrap()));
        assert_eq!(calls.load(Ordering::SeqCst), 2);
        for task in second {
            task.abort();
        }
    }

    /// An inner service that takes 10 ms (of tokio's clock) to answer.
    fn slow_service(state: Arc<Admission>) -> MiddlewareService<Admission, Counting> {
        let slow = tower::service_fn(|_request: Request| async {
            tokio::time::sleep(Duration::from_millis(10)).await;
            let mut response = Response::new(Body::empty());
            let served = http::HeaderValue::from_static("1");
            response.headers_mut().insert(SERVED, served);
            Ok::<_, Infallible>(response)
        });
        layer(state).layer(Counting::new(slow))
    }

    fn login_from(n: u8) -> http::Request<Body> {
        let mut request = request("/auth.v1.AuthService/Login", None);
        request.extensions_mut().insert(TcpConnectInfo {
            local_addr: None,
            remote_addr: Some(format!("10.0.0.{n}:4000").parse().unwrap()),
        });
        request
    }

    #[tokio::test(start_paused = true)]
    async fn requests_in_flight_are_bounded_by_the_time_they_would_take_and_shared_fairly() {
        let mut config = settings(1000, 1000);
        config.wait_target = Duration::from_millis(50);
        config.wait_floor = 4;
        let metrics = crate::metrics::Metrics::new().overload.clone();
        let state = Admission::new(config, metrics.clone());
        let svc = slow_service(state.clone());
        // Before anything is measured the in-flight cap is the bound.
        assert_eq!(state.in_flight_limit(), 1000);
        assert_eq!(metrics.in_flight_limit.get(), 1000);
        // One at a time, 10 ms each: 100 answers a second, so 5 in flight for 50 ms.
        for _ in 0..40 {
            assert!(served(&svc.clone().oneshot(login_from(1)).await.unwrap()));
        }
        assert_eq!(state.in_flight_limit(), 5);
        assert_eq!(metrics.in_flight_limit.get(), 5);
        assert!((metrics.answer_rate.get() - 100.0).abs() < 1e-6);

        // Twenty at once from one client: five are admitted, the rest refused.
        let first: Vec<_> = (0..20)
            .map(|_| tokio::spawn(svc.clone().oneshot(login_from(1))))
            .collect();
        tokio::task::yield_now().await;
        // Five at once from another client, meanwhile: it holds less than its fair
        // share (5 over 2 clients: 3), so three get in beside the first client's five.
        let second: Vec<_> = (0..5)
            .map(|_| tokio::spawn(svc.clone().oneshot(login_from(2))))
            .collect();
        let codes = |tasks: Vec<tokio::task::JoinHandle<Result<Response, Infallible>>>| async {
            let mut served_count = 0;
            let mut refused = 0;
            for task in tasks {
                let response = task.await.unwrap().unwrap();
                if served(&response) {
                    served_count += 1;
                } else {
                    assert_eq!(grpc_status(&response), Some("8")); // RESOURCE_EXHAUSTED
                    refused += 1;
                }
            }
            (served_count, refused)
        };
        assert_eq!(codes(first).await, (5, 15));
        assert_eq!(codes(second).await, (3, 2));
        assert_eq!(metrics.admission_wait.get(), 15);
        assert_eq!(metrics.admission_share.get(), 2);
        assert_eq!(metrics.admission_in_flight.get(), 0);
        // Everything answered: nothing counted in flight, no client remembered.
        let open = state.lock();
        assert_eq!((open.in_flight, open.busy_clients, open.total), (0, 0, 0));
        assert!(open.clients.is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn with_no_target_only_the_cap_bounds_requests_in_flight() {
        let state = admission(settings(1000, 1000));
        let svc = slow_service(state.clone());
        for _ in 0..40 {
            assert!(served(&svc.clone().oneshot(login_from(1)).await.unwrap()));
        }
        let all: Vec<_> = (0..200)
            .map(|_| tokio::spawn(svc.clone().oneshot(login_from(1))))
            .collect();
        for task in all {
            assert!(served(&task.await.unwrap().unwrap()));
        }
        assert_eq!(state.in_flight_limit(), 1000);
    }

    #[tokio::test]
    async fn an_oversized_body_is_out_of_range_without_calling_the_service() {
        let (svc, calls) = service(admission(settings(10, 10)));
        let body = Body::new(Full::new(Bytes::from(vec![0u8; 65])));
        let response = svc
            .clone()
            .oneshot(with_body("/auth.v1.AuthService/Login", None, body))
            .await
            .unwrap();
        assert_eq!(grpc_status(&response), Some("11")); // OUT_OF_RANGE
        let body = Body::new(Full::new(Bytes::from(vec![0u8; 64])));
        let fits = svc
            .oneshot(with_body("/auth.v1.AuthService/Login", None, body))
            .await
            .unwrap();
        assert!(served(&fits));
        assert_eq!(calls.load(Ordering::SeqCst), 1);
    }
}
