//! Admission control: the tower layer in front of `auth.v1.AuthService`, and the one
//! place authd decides whether a request can be served in time.
//!
//! **The caller's deadline is the contract.** A request is admitted when the server
//! predicts it will be answered before its deadline, and refused at once
//! (RESOURCE_EXHAUSTED, its RetryInfo the predicted wait) only when it cannot be. A
//! call without a deadline is given one: `AUTHD_MAX_WAIT` from its arrival.
//!
//! - It receives the whole request first, within `AUTHD_RECEIVE_TIMEOUT` (and the
//!   deadline) and at most the message size limit: a client that sends headers and
//!   never the body gets DEADLINE_EXCEEDED when that time is up, and meanwhile holds
//!   no in-flight place.
//! - The prediction: requests are served in the order they come (the hash queue is
//!   first in, first out: `password::queue`), so one admitted now behind `n` others of
//!   its kind is answered after about `(n + 1) / rate`, the rate being how fast
//!   requests of that kind are answered, measured ([`super::pace`]). Requests that
//!   hash a password and the others are measured apart: a token validation is not
//!   predicted to wait for hundreds of logins. Before the first measurement every
//!   request is admitted (the in-flight cap still applies).
//! - The room it may use, work-conserving and fair between clients: a client that
//!   holds fewer requests of the kind in flight than the clients that hold some do on
//!   average (a newcomer holds none) may be predicted to take up to [`ROOM`] of the
//!   time to its deadline; a client holding its share or more, a client alone
//!   included, up to [`BUSY_ROOM`] of it. A busy client alone still keeps every
//!   hashing thread busy (three quarters of its deadline's worth of work is many
//!   batches), and a client arriving beside it always finds room: it is never
//!   refused for the busy one's sake. The margin below the whole time also absorbs
//!   the error of the prediction.
//! - Memory is bounded apart from time, by count: `AUTHD_MAX_IN_FLIGHT` requests in
//!   flight, and per client `AUTHD_MAX_IN_FLIGHT_PER_CLIENT` open (being received or in
//!   flight), past which a client may open more while more than that many places of
//!   the cap stay free for whoever comes next.
//! - It puts the [`Deadline`] in the request's extensions for the handlers (the hash
//!   pool drops work whose deadline passed) and answers DEADLINE_EXCEEDED when it
//!   passes.
//! - During a graceful shutdown it refuses new work with UNAVAILABLE while the work
//!   already admitted finishes ([`Admission::drain`]).
//!
//! Health and reflection are never limited: probes must answer when the service is full.

use super::pace::Pace;
use crate::{
    error::{self, Error},
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

/// The share of the time to its deadline a request of a client holding less than
/// its share of the requests in flight may be predicted to take.
pub const ROOM: f64 = 0.9;

/// The share of the time to its deadline a request of a client holding its share of
/// the requests in flight or more (a client alone too) may be predicted to take: the
/// rest is kept for clients that hold less.
pub const BUSY_ROOM: f64 = 0.75;

/// The longest deadline taken as one: a longer `grpc-timeout` is this long.
const LONGEST_DEADLINE: Duration = Duration::from_secs(24 * 3600);

/// The shortest and the longest retry hint of a refusal (the longest when almost
/// nothing is being answered).
const SHORTEST_HINT: Duration = Duration::from_millis(10);
const LONGEST_HINT: Duration = Duration::from_secs(60);

/// How admission control is configured.
#[derive(Debug, Clone)]
pub struct AdmissionSettings {
    /// Requests in flight at once (received, being worked on): the memory bound.
    pub max_in_flight: u32,
    /// Requests one client may have open at once, being received or in flight.
    pub max_per_client: u32,
    /// Longest a request may take to arrive, from its headers to the end of its body.
    pub receive_timeout: Duration,
    /// The largest request body (gRPC framing included) worth receiving.
    pub max_body_bytes: usize,
    /// The deadline of a call that brings none, from its arrival.
    pub max_wait: Duration,
    /// Requests that hash a password the server runs side by side (hashing threads
    /// times their lanes): with fewer than half of it in flight, the rate measured is
    /// no evidence of the capacity ([`super::pace`]).
    pub hash_parallelism: u32,
}

/// The kinds of requests whose pace is measured apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// Requests that hash a password ([`Rpc::hashes_a_password`]).
    Hash = 0,
    /// Every other request.
    Other = 1,
}

impl Kind {
    /// The kind of `rpc`; its discriminant indexes the metrics' `kind` labels
    /// (`metrics::ADMISSION_KINDS`).
    fn of(rpc: Rpc) -> Kind {
        if rpc.hashes_a_password() {
            Kind::Hash
        } else {
            Kind::Other
        }
    }
}

/// Shared state of the admission layer.
pub struct Admission {
    permits: Arc<Semaphore>,
    settings: AdmissionSettings,
    draining: AtomicBool,
    /// Open requests per client, and in all; the requests of each kind in flight.
    clients: Mutex<Open>,
    metrics: OverloadMetrics,
}

/// Requests open (being received or in flight) in all and per client, and those of
/// each kind in flight with the pace they are answered at; an entry lives while its
/// client has a request open, so the map is bounded by the requests open.
struct Open {
    total: u32,
    clients: HashMap<IpAddr, Counts>,
    kinds: [InFlight; 2],
}

/// The requests of one kind in flight.
struct InFlight {
    count: u32,
    /// Clients with a request of this kind in flight.
    busy_clients: u32,
    pace: Pace,
}

/// One client's requests: open, and of those in flight, by kind.
#[derive(Default)]
struct Counts {
    open: u32,
    in_flight: [u32; 2],
}

/// Why a request that has arrived is not admitted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Refusal {
    /// It would not be answered before its deadline.
    Deadline { predicted: Duration },
    /// It would be, but its client holds its share of the requests in flight, and
    /// the room left is kept for the clients that hold less.
    Share { predicted: Duration },
}

impl Admission {
    pub fn new(mut settings: AdmissionSettings, metrics: OverloadMetrics) -> Arc<Self> {
        settings.max_in_flight = settings
            .max_in_flight
            .clamp(1, Semaphore::MAX_PERMITS as u32);
        settings.max_per_client = settings.max_per_client.max(1);
        // tokio's time: the runtime's timers, paused and driven by tests (start_paused).
        let now = Instant::now();
        // The others run side by side on the runtime's threads, one a core.
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let hash_parallelism = settings.hash_parallelism;
        let in_flight = |parallelism: u32| InFlight {
            count: 0,
            busy_clients: 0,
            pace: Pace::new(now, parallelism),
        };
        Arc::new(Self {
            permits: Arc::new(Semaphore::new(settings.max_in_flight as usize)),
            settings,
            draining: AtomicBool::new(false),
            clients: Mutex::new(Open {
                total: 0,
                clients: HashMap::new(),
                kinds: [
                    in_flight(hash_parallelism),
                    in_flight(u32::try_from(cores).unwrap_or(u32::MAX)),
                ],
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
    fn open(self: &Arc<Self>, client: IpAddr, kind: Kind) -> Option<ClientShare> {
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
            kind,
            in_flight: false,
            answered: false,
        })
    }

    /// Counts `share`'s request in flight, unless it cannot be answered by
    /// `answer_by` in the room its client may use.
    fn start(
        &self,
        share: &mut ClientShare,
        now: Instant,
        answer_by: Instant,
    ) -> Result<(), Refusal> {
        let kind = share.kind as usize;
        let mut open = self.lock();
        let Open { clients, kinds, .. } = &mut *open;
        let mine = clients.entry(share.client).or_default();
        let of_kind = &mut kinds[kind];
        // With nothing of its kind in flight a request waits for nothing: it is
        // admitted whatever was measured, which also lets a rate measured low recover.
        let predicted = (of_kind.count > 0)
            .then(|| of_kind.pace.predicted(of_kind.count))
            .flatten();
        if let Some(predicted) = predicted {
            let time = answer_by.saturating_duration_since(now);
            let held = mine.in_flight[kind];
            let active = of_kind.busy_clients + u32::from(held == 0);
            // Less than the average of the clients holding some (a newcomer: none).
            let below_share = u64::from(held) * u64::from(active) < u64::from(of_kind.count);
            let room = if below_share { ROOM } else { BUSY_ROOM };
            if predicted > time.mul_f64(room) {
                let others_would_fit = active > 1 && predicted <= time.mul_f64(ROOM);
                return Err(if others_would_fit {
                    Refusal::Share { predicted }
                } else {
                    Refusal::Deadline { predicted }
                });
            }
        }
        of_kind.pace.admitted(now, of_kind.count);
        of_kind.count += 1;
        if mine.in_flight[kind] == 0 {
            of_kind.busy_clients += 1;
        }
        mine.in_flight[kind] += 1;
        share.in_flight = true;
        Ok(())
    }
}

/// One request counted against its client's share (and, once started, in flight),
/// until dropped.
struct ClientShare {
    admission: Arc<Admission>,
    client: IpAddr,
    kind: Kind,
    in_flight: bool,
    /// Whether its work was done: answered, neither at its deadline nor abandoned.
    answered: bool,
}

impl Drop for ClientShare {
    fn drop(&mut self) {
        // tokio's time: the runtime's timers, paused and driven by tests (start_paused).
        let now = Instant::now();
        let kind = self.kind as usize;
        let mut open = self.admission.lock();
        let Open {
            total,
            clients,
            kinds,
        } = &mut *open;
        let Some(mine) = clients.get_mut(&self.client) else {
            return;
        };
        if self.in_flight {
            let of_kind = &mut kinds[kind];
            mine.in_flight[kind] -= 1;
            of_kind.count -= 1;
            if mine.in_flight[kind] == 0 {
                of_kind.busy_clients -= 1;
            }
            if of_kind.pace.ended(now, of_kind.count, self.answered) {
                let metrics = &self.admission.metrics;
                let rate = of_kind.pace.rate().unwrap_or(0.0);
                metrics.answer_rate[kind].set(rate);
                let wait = of_kind.pace.predicted(of_kind.count).unwrap_or_default();
                metrics.predicted_wait[kind].set(wait.as_secs_f64());
            }
        }
        mine.open -= 1;
        *total -= 1;
        if mine.open == 0 {
            clients.remove(&self.client);
        }
    }
}

/// Whether a response says the work was not done: its deadline passed first, or it
/// was cancelled (a status the handler gives in the headers).
fn unanswered(response: &Response) -> bool {
    let status = response.headers().get("grpc-status");
    status.is_some_and(|code| code == "4" || code == "1")
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
        // tokio's time: the runtime's timers, paused and driven by tests (start_paused).
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
            let response = error::layer_answer(err);
            Box::pin(async move { Ok(response) })
        };
        if self.draining.load(Ordering::SeqCst) {
            self.metrics.admission_draining.inc();
            return refuse(Error::Unavailable("the server is shutting down".into()));
        }
        // A call without a deadline gets the longest wait; a deadline far in the future
        // is one day away.
        let timeout = match rpc::grpc_timeout(req.headers()) {
            Some(timeout) if timeout.is_zero() => return refuse(Error::DeadlineExceeded),
            Some(timeout) => timeout.min(LONGEST_DEADLINE),
            None => self.settings.max_wait,
        };
        let deadline = arrived + timeout;
        // Answer a little before the deadline: the client's own timer started before
        // ours (the request had to travel), and a client that times out by itself
        // reports a bare CANCELLED or DEADLINE_EXCEEDED with no server status.
        let answer_by = deadline - (timeout / 20).min(Duration::from_millis(20));
        let client = rpc::request_client(&req);
        // The share covers the request from its headers to its answer, receiving included.
        let Some(share) = self.open(client, Kind::of(rpc)) else {
            self.metrics.admission_client.inc();
            return refuse(Error::Overloaded {
                what: "too many requests in flight from this client",
                retry_after: Duration::from_millis(100),
            });
        };
        let receive_by = deadline.min(arrived + self.settings.receive_timeout);
        Box::pin(async move {
            let mut share = share;
            let answer = |err: Error| Ok(error::layer_answer(err));
            let (mut parts, body) = req.into_parts();
            let limited = Limited::new(body, max_body_bytes);
            let body = match tokio::time::timeout_at(receive_by, limited.collect()).await {
                Ok(Ok(collected)) => collected.to_bytes(),
                // tokio's time: the runtime's timers, paused and driven by tests (start_paused).
                Err(_) if Instant::now() >= deadline => return answer(Error::DeadlineExceeded),
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
            // tokio's time: the runtime's timers, paused and driven by tests (start_paused).
            if let Err(refusal) = self.start(&mut share, Instant::now(), answer_by) {
                let (what, predicted) = match refusal {
                    Refusal::Deadline { predicted } => {
                        self.metrics.admission_deadline.inc();
                        (
                            "the request would not be answered before its deadline",
                            predicted,
                        )
                    }
                    Refusal::Share { predicted } => {
                        self.metrics.admission_share.inc();
                        (
                            "this client holds its share of the requests in flight",
                            predicted,
                        )
                    }
                };
                return answer(Error::Overloaded {
                    what,
                    retry_after: predicted.clamp(SHORTEST_HINT, LONGEST_HINT),
                });
            }
            parts.extensions.insert(Deadline(deadline.into_std()));
            let req = http::Request::from_parts(parts, Body::new(Full::new(body)));
            match tokio::time::timeout_at(answer_by, inner.call(req)).await {
                Ok(result) => {
                    share.answered = result.as_ref().is_ok_and(|response| !unanswered(response));
                    result
                }
                Err(_) => answer(Error::DeadlineExceeded),
            }
        })
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::metrics::OverloadMetrics;
    use crate::middleware::{
        MiddlewareService,
        testing::{Counting, SERVED, counting_service, grpc_status, sent, served, status},
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
            max_wait: Duration::from_secs(60),
            hash_parallelism: 1,
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
        assert_eq!(grpc_status(&sent(refused)), Some("8")); // RESOURCE_EXHAUSTED
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

    /// An inner service that answers a request 10 ms (of tokio's clock) after it
    /// comes, or, with the header `x-hold`, once `gate` gives it a permit (never, in
    /// these tests: it stays in flight until its deadline).
    fn gated_service(
        state: Arc<Admission>,
        gate: Arc<Semaphore>,
    ) -> MiddlewareService<Admission, Counting> {
        let inner = tower::service_fn(move |request: Request| {
            let gate = gate.clone();
            async move {
                if request.headers().contains_key("x-hold") {
                    let _ = gate.acquire().await;
                } else {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
                let mut response = Response::new(Body::empty());
                let served = http::HeaderValue::from_static("1");
                response.headers_mut().insert(SERVED, served);
                Ok::<_, Infallible>(response)
            }
        });
        layer(state).layer(Counting::new(inner))
    }

    /// A call of `path` from 10.0.0.`n`, with a `grpc-timeout` if given, held in
    /// flight by the gated service if `hold`.
    fn call_from(n: u8, path: &str, timeout: Option<&str>, hold: bool) -> http::Request<Body> {
        let mut request = request(path, timeout);
        request.extensions_mut().insert(TcpConnectInfo {
            local_addr: None,
            remote_addr: Some(format!("10.0.0.{n}:4000").parse().unwrap()),
        });
        if hold {
            let held = http::HeaderValue::from_static("1");
            request.headers_mut().insert("x-hold", held);
        }
        request
    }

    const LOGIN: &str = "/auth.v1.AuthService/Login";

    /// The gated service after 40 logins one at a time, 10 ms each: 100 answered a
    /// second, measured.
    async fn measured_at_100_a_second(
        config: AdmissionSettings,
    ) -> (
        Arc<Admission>,
        MiddlewareService<Admission, Counting>,
        OverloadMetrics,
    ) {
        let metrics = crate::metrics::Metrics::new().overload.clone();
        let state = Admission::new(config, metrics.clone());
        let svc = gated_service(state.clone(), Arc::new(Semaphore::new(0)));
        for _ in 0..40 {
            let response = svc.clone().oneshot(call_from(1, LOGIN, None, false));
            assert!(served(&response.await.unwrap()));
        }
        assert!((metrics.answer_rate[Kind::Hash as usize].get() - 100.0).abs() < 1e-6);
        assert_eq!(metrics.answer_rate[Kind::Other as usize].get(), 0.0);
        (state, svc, metrics)
    }

    /// Starts `n` held calls (answered at their deadline) and returns once they are in
    /// flight.
    async fn hold(
        state: &Admission,
        svc: &MiddlewareService<Admission, Counting>,
        client: u8,
        n: usize,
        timeout: &str,
    ) -> Vec<tokio::task::JoinHandle<Result<Response, Infallible>>> {
        let before = state.in_flight();
        let calls = (0..n)
            .map(|_| {
                let call = call_from(client, LOGIN, Some(timeout), true);
                tokio::spawn(svc.clone().oneshot(call))
            })
            .collect();
        while state.in_flight() < before + n {
            tokio::task::yield_now().await;
        }
        calls
    }

    fn hint(response: &Response) -> Duration {
        let status = status(response).expect("a status");
        crate::error::retry_hint(&status).expect("a retry hint")
    }

    #[tokio::test(start_paused = true)]
    async fn a_request_that_fits_its_deadline_is_admitted_and_one_that_cannot_is_refused_at_once() {
        let (state, svc, metrics) = measured_at_100_a_second(settings(1000, 1000)).await;
        // Fifty logins with ten seconds each from client 1: the 50th is predicted to
        // take half a second, well within the room of a client alone (3/4 of 10 s).
        let held = hold(&state, &svc, 1, 50, "10S").await;
        let ask = |n: u8, timeout: &str| {
            let call = svc
                .clone()
                .oneshot(call_from(n, LOGIN, Some(timeout), false));
            async move { call.await.map(sent) }
        };

        // One more from client 1 would take 0.51 s; with 400 ms to its deadline it
        // cannot be answered in time: refused at once, told to come back after the
        // predicted wait at the earliest.
        let refused = ask(1, "400m").await.unwrap();
        assert_eq!(grpc_status(&refused), Some("8")); // RESOURCE_EXHAUSTED
        assert!(
            hint(&refused) >= Duration::from_millis(510),
            "{:?}",
            hint(&refused)
        );
        assert_eq!(metrics.admission_deadline.get(), 1);

        // Client 2 holds nothing: 0.51 s fits 9/10 of its 580 ms (600 ms less the
        // margin before the deadline), so it is admitted beside the busy client.
        let newcomer = hold(&state, &svc, 2, 1, "600m").await;
        // Client 3's 550 ms does not fit 0.52 s in 9/10 of it.
        let late = ask(3, "550m").await.unwrap();
        assert_eq!(grpc_status(&late), Some("8"));
        assert!(hint(&late) >= Duration::from_millis(520));
        assert_eq!(metrics.admission_deadline.get(), 2);

        // Client 1, with 700 ms, would be answered in time (0.52 s is within 9/10 of
        // 680 ms) but not within the room of a client holding its share: that is kept
        // for the clients that hold less.
        let busy = ask(1, "700m").await.unwrap();
        assert_eq!(grpc_status(&busy), Some("8"));
        assert_eq!(metrics.admission_share.get(), 1);
        // The same asked by client 4, which holds nothing, is admitted.
        let other = hold(&state, &svc, 4, 1, "700m").await;
        assert_eq!(state.in_flight(), 52);

        // Requests that hash nothing are measured apart: with no rate of their own
        // yet, a token validation with a short deadline is not predicted to wait for
        // the logins, and is answered.
        let validate = call_from(1, "/auth.v1.AuthService/ValidateToken", Some("50m"), false);
        assert!(served(&svc.clone().oneshot(validate).await.unwrap()));

        // The held calls are answered DEADLINE_EXCEEDED at their deadlines.
        for call in held.into_iter().chain(newcomer).chain(other) {
            assert_eq!(grpc_status(&call.await.unwrap().unwrap()), Some("4"));
        }
        assert_eq!(metrics.admission_in_flight.get(), 0);
        let open = state.lock();
        assert_eq!(open.total, 0);
        assert!(open.clients.is_empty());
        assert!(
            open.kinds
                .iter()
                .all(|k| k.count == 0 && k.busy_clients == 0)
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_call_without_a_deadline_is_given_the_longest_wait() {
        let mut config = settings(1000, 1000);
        config.max_wait = Duration::from_millis(500);
        let (state, svc, metrics) = measured_at_100_a_second(config).await;
        // Alone in flight, held: answered DEADLINE_EXCEEDED at the longest wait, not
        // before (the clock here is the test's).
        // tokio's time: the runtime's timers, paused and driven by tests (start_paused).
        let start = Instant::now();
        let untimed = tokio::spawn(svc.clone().oneshot(call_from(1, LOGIN, None, true)));
        tokio::time::sleep(Duration::from_millis(450)).await;
        assert!(!untimed.is_finished());
        let response = untimed.await.unwrap().unwrap();
        // tokio's time: the runtime's timers, paused and driven by tests (start_paused).
        assert_eq!(grpc_status(&response), Some("4")); // DEADLINE_EXCEEDED
        assert!(Instant::now() - start <= Duration::from_millis(500));

        // Behind fifty held logins (half a second's work), an untimed one cannot be
        // answered within the longest wait: refused at once.
        let held = hold(&state, &svc, 1, 50, "10S").await;
        let refused = svc.clone().oneshot(call_from(2, LOGIN, None, false));
        let refused = sent(refused.await.unwrap());
        assert_eq!(grpc_status(&refused), Some("8"));
        assert!(hint(&refused) >= Duration::from_millis(510));
        assert_eq!(metrics.admission_deadline.get(), 1);
        // One with a deadline of its own that fits is admitted.
        let fits = hold(&state, &svc, 2, 1, "2S").await;
        for call in held.into_iter().chain(fits) {
            assert_eq!(grpc_status(&call.await.unwrap().unwrap()), Some("4"));
        }
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
