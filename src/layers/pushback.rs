//! Pushback: a request refused for load or by a limit is answered when asking again
//! can help, not at once.
//!
//! A refusal costs the server about as much as a health check. A client that asks
//! again the moment it is refused (a closed-loop load tool, a naive retry loop)
//! turns that into a storm that owns the cores the accepted work needs. So a
//! RESOURCE_EXHAUSTED answer that carries a retry hint (a full hash queue, the
//! in-flight cap, a rate limit, the login throttle) is held on a timer before it is
//! sent, and refusals are answered at a budgeted pace:
//! - each refusal takes the next answer slot of a schedule that gives
//!   `AUTHD_REFUSAL_RATE` slots a second, and is answered at its slot or at the end
//!   of its hint, whichever is later, rounded up to a 20 ms grid;
//! - never later than `AUTHD_REFUSAL_HOLD` after it was refused, nor than nine
//!   tenths of the client's time ([`HOLD_SHARE`]); a call with no deadline at most
//!   [`UNTIMED_HOLD`], since its client may keep a timer the server cannot see.
//!   That longest hold is rounded down to the same grid, and a refusal it leaves no
//!   step of the grid to wait is answered at once.
//!
//! Every held answer is thus sent on a step of the grid, and a crowd's answers go
//! out together: one wake-up of the runtime, one write per connection for all the
//! answers it carries, rather than one each. A crowd refused for its deadlines
//! (each held until a tenth of its time is left) is answered that way too.
//!
//! Held that long, a client that re-asks at once costs one refusal per nine tenths of
//! its deadline; held any shorter, one a fraction of its deadline sooner.
//!
//! A client that re-asks at once is then answered no faster than the budget, so
//! the refusals it can cost the server are bounded, whatever its concurrency: it is
//! slowed, not served. The answer's RetryInfo (and `retry-after`) says what is left
//! of the hint once held, so a client that honours it waits no longer in all than
//! it was told, unless the budget is spent.
//!
//! A refusal made by a layer below (admission, the rate limit) arrives unsent
//! (`error::Unsent`) and is encoded here, once, with what is left of its hint; a
//! handler's (the login throttle's) arrives encoded, and is encoded again when held.
//!
//! A held answer costs a timer and the stream it is the answer of, nothing else: it
//! holds no in-flight place, no hash slot, no client share. Held answers are
//! bounded per client (`AUTHD_REFUSAL_HOLD_MAX_PER_CLIENT`) and in all
//! (`AUTHD_REFUSAL_HOLD_MAX`); beyond either, a refusal is answered at once. A
//! graceful shutdown answers every held refusal at once.
//!
//! Health and reflection pass untouched: they are never refused.

use crate::{
    error,
    metrics::OverloadMetrics,
    middleware::{BoxFuture, Middleware, MiddlewareLayer, Request, Response},
    rpc::{self, Rpc},
};
use std::{
    collections::HashMap,
    net::IpAddr,
    pin::pin,
    sync::{Arc, Mutex},
    time::Duration,
};
use tokio::{sync::watch, time::Instant};
use tower::Service;

/// A held refusal is answered before this share of the client's time (its
/// `grpc-timeout`, from the request's arrival) has passed (numerator, denominator).
/// The rest is the client's margin: its timer started before ours, a client with
/// thousands of calls open is late to send them and to read their answers, and a
/// client that times out by itself sees no status and no hint. 5,000 authbench
/// clients with 1 s deadlines on one core (bench/refusal-cost.sh) timed out on
/// 0.2 to 5 % of the refusals held to 20 ms before their deadline (an admitted
/// request's margin), and on none held a tenth of their time before it.
const HOLD_SHARE: (u32, u32) = (9, 10);

/// The longest a refusal of a call with no deadline (no `grpc-timeout`) is held. Its
/// client may still keep a timer of its own that the server cannot see (tonic's
/// `Endpoint::timeout`, a script's socket timeout), and a client that times out by
/// itself sees no status and no hint; a second is shorter than such timers are set,
/// and still bounds what an eager client of that kind costs (one refusal a second
/// per call it keeps open).
const UNTIMED_HOLD: Duration = Duration::from_secs(1);

/// Held answers are sent on a grid of this step (their time rounded up to it), so
/// that a crowd's answers go out together, in one wake-up of the runtime, rather
/// than one wake-up each.
const TICK: Duration = Duration::from_millis(20);

/// How pushback is configured.
#[derive(Debug, Clone)]
pub struct PushbackSettings {
    /// The longest a refusal is held; zero answers every refusal at once.
    pub max_hold: Duration,
    /// Refusals answered per second while they are held (the answer slots).
    pub rate: u32,
    /// Refusals held at once, in all.
    pub max_held: u32,
    /// Refusals held at once for one client.
    pub max_held_per_client: u32,
}

/// Shared state of the pushback layer.
pub struct Pushback {
    settings: PushbackSettings,
    /// Held refusals per client, and in all; an entry lives while its count is above
    /// zero, so the map is bounded by the refusals held.
    held: Mutex<Held>,
    /// Becomes true when the server shuts down: every held refusal is answered.
    released: watch::Sender<bool>,
    metrics: OverloadMetrics,
}

struct Held {
    total: u32,
    clients: HashMap<IpAddr, u32>,
    /// The next answer slot of the schedule.
    next_slot: Instant,
    /// The origin of the grid of [`TICK`]s.
    origin: Instant,
}

impl Pushback {
    pub fn new(mut settings: PushbackSettings, metrics: OverloadMetrics) -> Arc<Self> {
        settings.max_held_per_client = settings.max_held_per_client.min(settings.max_held);
        Arc::new(Self {
            settings,
            held: Mutex::new(Held {
                total: 0,
                clients: HashMap::new(),
                // tokio's time: the runtime's timers, paused and driven by tests (start_paused).
                next_slot: Instant::now(),
                origin: Instant::now(),
            }),
            released: watch::Sender::new(false),
            metrics,
        })
    }

    /// Refusals being held now.
    pub fn held(&self) -> u32 {
        self.lock().total
    }

    /// Answers every held refusal now, and every later one at once: the server is
    /// shutting down.
    pub fn release(&self) {
        self.released.send_replace(true);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Held> {
        self.held.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Counts a refusal of `client` held, unless either bound is reached or `latest`
    /// leaves no step of the grid to wait for, and says until when: its answer slot
    /// or `hinted`, whichever is later, at the latest `latest` (which is at most the
    /// longest hold from `now`), on the grid.
    fn hold(
        self: &Arc<Self>,
        client: IpAddr,
        now: Instant,
        hinted: Instant,
        latest: Instant,
    ) -> Option<(HeldRefusal, Instant)> {
        let mut held = self.lock();
        let latest = grid_floor(held.origin, latest);
        if held.total >= self.settings.max_held || latest <= now {
            return None;
        }
        let mine = held.clients.entry(client).or_insert(0);
        if *mine >= self.settings.max_held_per_client {
            if *mine == 0 {
                held.clients.remove(&client);
            }
            return None;
        }
        *mine += 1;
        held.total += 1;
        let slot = held.next_slot.max(now);
        let spacing = Duration::from_secs(1) / self.settings.rate.max(1);
        // The schedule runs at most one longest hold ahead: past it, answers are due
        // at the longest hold anyway, and a burst must not delay the answers after it.
        held.next_slot = (slot + spacing).min(now + self.settings.max_hold);
        let due = on_grid(held.origin, slot.max(hinted)).min(latest);
        self.metrics.held.inc();
        let held = HeldRefusal {
            pushback: self.clone(),
            client,
        };
        Some((held, due))
    }
}

/// `at`, rounded up to the grid of [`TICK`]s from `origin`.
fn on_grid(origin: Instant, at: Instant) -> Instant {
    let ticks = at
        .saturating_duration_since(origin)
        .as_nanos()
        .div_ceil(TICK.as_nanos());
    origin + TICK * u32::try_from(ticks).unwrap_or(u32::MAX)
}

/// `at`, rounded down to the grid of [`TICK`]s from `origin` (at the earliest `origin`).
fn grid_floor(origin: Instant, at: Instant) -> Instant {
    let ticks = at.saturating_duration_since(origin).as_nanos() / TICK.as_nanos();
    origin + TICK * u32::try_from(ticks).unwrap_or(u32::MAX)
}

/// One refusal counted as held, until dropped (answered, or the stream gone).
struct HeldRefusal {
    pushback: Arc<Pushback>,
    client: IpAddr,
}

impl Drop for HeldRefusal {
    fn drop(&mut self) {
        let mut held = self.pushback.lock();
        held.total = held.total.saturating_sub(1);
        if let Some(mine) = held.clients.get_mut(&self.client) {
            *mine -= 1;
            if *mine == 0 {
                held.clients.remove(&self.client);
            }
        }
        self.pushback.metrics.held.dec();
    }
}

/// The pushback layer around `state`.
pub(crate) fn layer(state: Arc<Pushback>) -> MiddlewareLayer<Pushback> {
    MiddlewareLayer::new(state)
}

impl Middleware for Pushback {
    fn call<S>(self: Arc<Self>, mut inner: S, req: Request) -> BoxFuture<Result<Response, S::Error>>
    where
        S: Service<Request, Response = Response> + Send + 'static,
        S::Future: Send + 'static,
        S::Error: Send + 'static,
    {
        if Rpc::of_path(req.uri().path()).is_exempt() {
            return Box::pin(inner.call(req));
        }
        // tokio's time: the runtime's timers, paused and driven by tests (start_paused).
        let arrived = Instant::now();
        // Answered by HOLD_SHARE of the client's time: sooner than admission's
        // margin for an admitted request (a twentieth, at most 20 ms).
        let answer_by = rpc::grpc_timeout(req.headers())
            .and_then(|t| arrived.checked_add(t * HOLD_SHARE.0 / HOLD_SHARE.1));
        let client = rpc::request_client(&req);
        Box::pin(async move {
            // The time the layers below spend on the request, polled on this runtime:
            // for a refusal, what refusing it cost.
            let mut busy = Duration::ZERO;
            let mut answer = pin!(inner.call(req));
            let mut response = std::future::poll_fn(|cx| {
                // Real time: the work a refusal cost, a metric.
                let start = std::time::Instant::now();
                let poll = answer.as_mut().poll(cx);
                busy += start.elapsed();
                poll
            })
            .await?;
            // A layer's refusal comes unsent, to be encoded once, here; a handler's
            // comes encoded, its status beside.
            let unsent = response.extensions_mut().remove::<error::Unsent>();
            let hint = match &unsent {
                Some(unsent) => Some(unsent.hint()),
                None => (response.extensions().get::<tonic::Status>()).and_then(error::retry_hint),
            };
            let Some(hint) = hint else {
                return Ok(response);
            };
            // The answer, with `left` of its hint (None: as it was made).
            let answer = |response: Response, left: Option<Duration>| match unsent {
                Some(unsent) => unsent.encode(left, response.into_parts().0.headers),
                None => match (left, response.extensions().get::<tonic::Status>()) {
                    (Some(left), Some(status)) => error::with_retry_hint(status, left).into_http(),
                    _ => response,
                },
            };
            self.metrics.refusal_seconds.inc_by(busy.as_secs_f64());
            // tokio's time: the runtime's timers, paused and driven by tests (start_paused).
            let refused = Instant::now();
            let longest = match answer_by {
                Some(answer_by) => answer_by.saturating_duration_since(refused),
                None => UNTIMED_HOLD,
            };
            let latest = refused + self.settings.max_hold.min(longest);
            let mut released = self.released.subscribe();
            if latest <= refused || *released.borrow() {
                self.metrics.at_once.inc();
                return Ok(answer(response, None));
            }
            let hinted = refused.checked_add(hint).unwrap_or(latest);
            let Some((held, until)) = self.hold(client, refused, hinted, latest) else {
                self.metrics.at_once.inc();
                return Ok(answer(response, None));
            };
            self.metrics.held_total.inc();
            tokio::select! {
                () = tokio::time::sleep_until(until) => {}
                _ = released.changed() => {}
            }
            drop(held);
            let left = hint.saturating_sub(refused.elapsed());
            Ok(answer(response, Some(left)))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        error::Error,
        metrics::Metrics,
        middleware::testing::{grpc_status, served, status},
    };
    use std::{convert::Infallible, task::Poll};
    use tonic_types::StatusExt as _;
    use tower::{Layer as _, ServiceExt as _};

    /// Pushback with `settings`, and the metrics it counts in.
    fn pushback(settings: PushbackSettings) -> (Metrics, Arc<Pushback>) {
        let metrics = Metrics::new();
        let state = Pushback::new(settings, metrics.overload.clone());
        (metrics, state)
    }

    fn settings(max_hold: Duration, max_held: u32, per_client: u32) -> PushbackSettings {
        PushbackSettings {
            max_hold,
            rate: 1_000_000,
            max_held,
            max_held_per_client: per_client,
        }
    }

    /// A service that refuses every AuthService call with `error` and serves others.
    fn refusing(
        error: fn() -> Error,
    ) -> tower::util::BoxCloneService<Request, Response, Infallible> {
        tower::util::BoxCloneService::new(tower::service_fn(move |req: Request| async move {
            if Rpc::of_path(req.uri().path()).is_exempt() {
                let mut response = Response::new(tonic::body::Body::empty());
                response.headers_mut().insert(
                    crate::middleware::testing::SERVED,
                    http::HeaderValue::from_static("1"),
                );
                return Ok(response);
            }
            Ok::<_, Infallible>(error().to_status().into_http())
        }))
    }

    fn overloaded() -> Error {
        Error::Overloaded {
            what: "the password hashing queue is full",
            retry_after: Duration::from_secs(3),
        }
    }

    fn from(ip: &str, timeout: Option<&str>) -> Request {
        let mut builder = http::Request::builder().uri("/auth.v1.AuthService/Login");
        if let Some(t) = timeout {
            builder = builder.header("grpc-timeout", t);
        }
        let mut request = builder.body(tonic::body::Body::empty()).unwrap();
        request
            .extensions_mut()
            .insert(tonic::transport::server::TcpConnectInfo {
                local_addr: None,
                remote_addr: Some(format!("{ip}:4000").parse().unwrap()),
            });
        request
    }

    fn hint_of(response: &Response) -> Option<Duration> {
        error::retry_hint(&status(response)?)
    }

    /// Calls from one client at once, one per deadline, and the time each was
    /// answered after and the retry hint it was answered with, in the calls' order.
    async fn answers<S>(
        svc: &S,
        timeouts: impl IntoIterator<Item = &'static str>,
    ) -> Vec<(Duration, Duration)>
    where
        S: Service<Request, Response = Response, Error = Infallible> + Clone + Send + 'static,
        S::Future: Send,
    {
        // tokio's time: the runtime's timers, paused and driven by tests (start_paused).
        let start = Instant::now();
        let calls: Vec<_> = timeouts
            .into_iter()
            .map(|timeout| {
                let call = svc.clone().oneshot(from("10.0.0.1", Some(timeout)));
                tokio::spawn(async move {
                    let response = call.await.unwrap();
                    (start.elapsed(), hint_of(&response).unwrap())
                })
            })
            .collect();
        let mut answered = Vec::new();
        for call in calls {
            answered.push(call.await.unwrap());
        }
        answered
    }

    #[tokio::test(start_paused = true)]
    async fn a_refusal_is_held_for_its_hint_at_most_the_hold_and_says_what_is_left() {
        let (metrics, state) = pushback(settings(Duration::from_secs(1), 10, 10));
        let svc = layer(state.clone()).layer(refusing(overloaded));
        // tokio's time: the runtime's timers, paused and driven by tests (start_paused).
        let start = Instant::now();
        let response = svc.clone().oneshot(from("10.0.0.1", None)).await.unwrap();
        assert_eq!(start.elapsed(), Duration::from_secs(1));
        assert_eq!(grpc_status(&response), Some("8"));
        assert_eq!(hint_of(&response), Some(Duration::from_secs(2)));
        assert_eq!(response.headers().get("retry-after").unwrap(), "2");
        // Never past nine tenths of the client's time: 270 ms after it was sent, at
        // 1.27 s, on the grid 1.26 s.
        // tokio's time: the runtime's timers, paused and driven by tests (start_paused).
        let start = Instant::now();
        let response = svc
            .clone()
            .oneshot(from("10.0.0.1", Some("300m")))
            .await
            .unwrap();
        assert_eq!(start.elapsed(), Duration::from_millis(260));
        assert_eq!(hint_of(&response), Some(Duration::from_millis(2740)));
        assert_eq!(metrics.overload.held_total.get(), 2);
        assert_eq!(metrics.overload.at_once.get(), 0);
        assert_eq!(state.held(), 0);
        assert_eq!(metrics.overload.held.get(), 0);
        // A refusal with a hint shorter than the hold waits only its hint, rounded up
        // to the grid of answers (here refused 1.26 s from the start, its hint ends at
        // 1.31 s, answered at 1.32 s).
        let svc = layer(state.clone()).layer(refusing(|| Error::Overloaded {
            what: "full",
            retry_after: Duration::from_millis(50),
        }));
        // tokio's time: the runtime's timers, paused and driven by tests (start_paused).
        let start = Instant::now();
        let response = svc.oneshot(from("10.0.0.1", None)).await.unwrap();
        assert_eq!(start.elapsed(), Duration::from_millis(60));
        assert_eq!(hint_of(&response), Some(Duration::ZERO));
    }

    #[tokio::test(start_paused = true)]
    async fn a_layers_unsent_refusal_is_encoded_once_with_what_is_left_and_what_was_added() {
        let (metrics, state) = pushback(settings(Duration::from_secs(1), 10, 10));
        // A rate limit's refusal left unsent, and a header a layer between added.
        let below = tower::service_fn(|_req: Request| async {
            let mut response = error::layer_answer(Error::RateLimited {
                violations: vec![error::QuotaViolation {
                    subject: "client:10.0.0.1".into(),
                    description: "Login: 5 per 1m".into(),
                }],
                limit: 5,
                retry_after: Duration::from_secs(3),
            });
            assert!(response.headers().get("grpc-status").is_none());
            (response.headers_mut()).insert("x-between", http::HeaderValue::from_static("kept"));
            Ok::<_, Infallible>(response)
        });
        let svc = layer(state.clone()).layer(below);
        // Held a second, answered with the two seconds left, encoded once.
        // tokio's time: the runtime's timers, paused and driven by tests (start_paused).
        let start = Instant::now();
        let response = svc.clone().oneshot(from("10.0.0.1", None)).await.unwrap();
        assert_eq!(start.elapsed(), Duration::from_secs(1));
        assert_eq!(grpc_status(&response), Some("8"));
        assert_eq!(hint_of(&response), Some(Duration::from_secs(2)));
        let headers = response.headers();
        assert_eq!(headers["retry-after"], "2");
        assert_eq!(headers["ratelimit-limit"], "5");
        assert_eq!(headers["ratelimit-reset"], "2");
        assert_eq!(headers["x-between"], "kept");
        assert_eq!(headers.get_all("grpc-status").iter().count(), 1);
        assert!(response.extensions().get::<error::Unsent>().is_none());
        let quota = status(&response)
            .unwrap()
            .get_details_quota_failure()
            .unwrap();
        assert_eq!(quota.violations[0].subject, "client:10.0.0.1");
        // Past the bound on held refusals it is answered at once, encoded with its hint.
        let zero = Pushback::new(settings(Duration::ZERO, 10, 10), metrics.overload.clone());
        let svc = layer(zero).layer(below);
        let response = svc.oneshot(from("10.0.0.1", None)).await.unwrap();
        assert_eq!(hint_of(&response), Some(Duration::from_secs(3)));
        assert_eq!(response.headers()["x-between"], "kept");
    }

    #[tokio::test(start_paused = true)]
    async fn refusals_held_to_their_deadlines_are_answered_together_on_the_grid() {
        let (metrics, state) = pushback(settings(Duration::from_secs(10), 100, 100));
        let svc = layer(state.clone()).layer(refusing(overloaded));
        // Refused 7 ms past a step of the grid, their longest holds end 274.5, 283.5
        // and 292.5 ms later (nine tenths of 305, 315 and 325 ms): at 281.5, 290.5 and
        // 299.5 ms, rounded down to the grid: 280, 280 and 280.
        tokio::time::advance(Duration::from_millis(7)).await;
        let answered = answers(&svc, ["305m", "315m", "325m"]).await;
        let ms = |ms| Duration::from_millis(ms);
        assert_eq!(
            answered,
            [
                (ms(273), ms(3000 - 273)),
                (ms(273), ms(3000 - 273)),
                (ms(273), ms(3000 - 273)),
            ]
        );
        assert_eq!(metrics.overload.held_total.get(), 3);
        // A deadline that leaves no step of the grid to wait for: answered at once,
        // with its hint whole (refused at 280 ms on the grid, nine tenths of 15 ms
        // end at 293.5, before the next step).
        // tokio's time: the runtime's timers, paused and driven by tests (start_paused).
        let start = Instant::now();
        let response = svc.oneshot(from("10.0.0.1", Some("15m"))).await.unwrap();
        assert_eq!(start.elapsed(), Duration::ZERO);
        assert_eq!(hint_of(&response), Some(Duration::from_secs(3)));
        assert_eq!(metrics.overload.at_once.get(), 1);
        assert_eq!(state.held(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_call_without_a_deadline_is_held_at_most_the_untimed_hold() {
        let (metrics, state) = pushback(settings(Duration::from_secs(60), 10, 10));
        let svc = layer(state).layer(refusing(|| Error::Overloaded {
            what: "full",
            retry_after: Duration::from_secs(30),
        }));
        // tokio's time: the runtime's timers, paused and driven by tests (start_paused).
        let start = Instant::now();
        let response = svc.clone().oneshot(from("10.0.0.1", None)).await.unwrap();
        assert_eq!(start.elapsed(), UNTIMED_HOLD);
        assert_eq!(hint_of(&response), Some(Duration::from_secs(29)));
        // With a deadline, the hold may be longer: nine tenths of its time.
        // tokio's time: the runtime's timers, paused and driven by tests (start_paused).
        let start = Instant::now();
        svc.oneshot(from("10.0.0.1", Some("10S"))).await.unwrap();
        assert_eq!(start.elapsed(), Duration::from_secs(9));
        assert_eq!(metrics.overload.held_total.get(), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn refusals_are_answered_at_the_budgeted_pace_within_the_longest_hold() {
        let mut settings = settings(Duration::from_secs(2), 100, 100);
        settings.rate = 10; // one answer every 100 ms
        let (metrics, state) = pushback(settings);
        let svc = layer(state.clone()).layer(refusing(|| Error::Overloaded {
            what: "full",
            retry_after: Duration::from_millis(150),
        }));
        // Forty refusals at once: slots at 0, 100, 200, … ms; each waits for its slot
        // or its 150 ms hint, whichever is later, on the 20 ms grid, and none more
        // than 2 s (the calls' deadline, 10 s away, allows that).
        let mut answered = answers(&svc, ["10S"; 40]).await;
        answered.sort();
        let at: Vec<u64> = answered.iter().map(|(t, _)| t.as_millis() as u64).collect();
        assert_eq!(&at[..3], [160, 160, 200]);
        assert_eq!(at[10], 1000);
        // The schedule runs at most 2 s ahead: the last twenty are answered at 2 s.
        assert_eq!(at.iter().filter(|&&t| t == 2000).count(), 20);
        assert!(answered.iter().all(|(_, left)| left.is_zero()));
        assert_eq!(metrics.overload.held_total.get(), 40);
        // Once the crowd is gone, a refusal waits only for its hint again (on the grid).
        tokio::time::sleep(Duration::from_secs(3)).await;
        // tokio's time: the runtime's timers, paused and driven by tests (start_paused).
        let start = Instant::now();
        svc.oneshot(from("10.0.0.1", None)).await.unwrap();
        assert_eq!(start.elapsed(), Duration::from_millis(160));
    }

    #[tokio::test(start_paused = true)]
    async fn what_is_not_a_refusal_with_a_hint_is_answered_at_once() {
        let (metrics, state) = pushback(settings(Duration::from_secs(1), 10, 10));
        // tokio's time: the runtime's timers, paused and driven by tests (start_paused).
        let start = Instant::now();
        for error in [
            (|| Error::InvalidCredentials) as fn() -> Error,
            || Error::DeadlineExceeded,
            || Error::Unavailable("down".into()),
        ] {
            let svc = layer(state.clone()).layer(refusing(error));
            let response = svc.oneshot(from("10.0.0.1", None)).await.unwrap();
            assert_ne!(grpc_status(&response), Some("8"));
        }
        let svc = layer(state.clone()).layer(refusing(overloaded));
        let mut health = from("10.0.0.1", None);
        *health.uri_mut() = "/grpc.health.v1.Health/Check".parse().unwrap();
        assert!(served(&svc.oneshot(health).await.unwrap()));
        assert_eq!(start.elapsed(), Duration::ZERO);
        assert_eq!(metrics.overload.held_total.get(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn held_refusals_are_bounded_per_client_and_in_all() {
        let (metrics, state) = pushback(settings(Duration::from_secs(60), 5, 3));
        let svc = layer(state.clone()).layer(refusing(overloaded));
        let mut pending = Vec::new();
        let mut at_once = 0;
        // Client 1 sends 5: three are held, two answered at once.
        // Client 2 sends 5: two are held (5 in all), three answered at once.
        for ip in ["10.0.0.1", "10.0.0.2"] {
            for _ in 0..5 {
                let mut call = Box::pin(svc.clone().oneshot(from(ip, None)));
                match futures::poll!(call.as_mut()) {
                    Poll::Ready(response) => {
                        at_once += 1;
                        // Answered at once, with its hint whole.
                        let hint = hint_of(&response.unwrap());
                        assert_eq!(hint, Some(Duration::from_secs(3)));
                    }
                    Poll::Pending => pending.push(tokio::spawn(call)),
                }
            }
        }
        assert_eq!((pending.len(), at_once), (5, 5));
        assert_eq!(state.held(), 5);
        assert_eq!(metrics.overload.held.get(), 5);
        assert_eq!(metrics.overload.at_once.get(), 5);
        // A shutdown answers every held refusal at once.
        // tokio's time: the runtime's timers, paused and driven by tests (start_paused).
        let start = Instant::now();
        state.release();
        for call in pending {
            let response = call.await.unwrap().unwrap();
            assert_eq!(grpc_status(&response), Some("8"));
        }
        assert_eq!(start.elapsed(), Duration::ZERO);
        assert_eq!(state.held(), 0);
        assert!(state.lock().clients.is_empty());
        // And none is held after it.
        let response = svc.oneshot(from("10.0.0.3", None)).await.unwrap();
        assert_eq!(grpc_status(&response), Some("8"));
        assert_eq!(metrics.overload.at_once.get(), 6);
    }

    #[tokio::test(start_paused = true)]
    async fn a_client_that_goes_away_frees_its_held_place() {
        let (metrics, state) = pushback(settings(Duration::from_secs(60), 1, 1));
        let svc = layer(state.clone()).layer(refusing(overloaded));
        let held = tokio::spawn(svc.clone().oneshot(from("10.0.0.1", None)));
        tokio::task::yield_now().await;
        assert_eq!(state.held(), 1);
        held.abort();
        let _ = held.await;
        assert_eq!(state.held(), 0);
        assert_eq!(metrics.overload.held.get(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_zero_hold_answers_every_refusal_at_once() {
        let (metrics, state) = pushback(settings(Duration::ZERO, 10, 10));
        let svc = layer(state).layer(refusing(overloaded));
        // tokio's time: the runtime's timers, paused and driven by tests (start_paused).
        let start = Instant::now();
        let response = svc.oneshot(from("10.0.0.1", None)).await.unwrap();
        assert_eq!(start.elapsed(), Duration::ZERO);
        assert_eq!(hint_of(&response), Some(Duration::from_secs(3)));
        assert_eq!(metrics.overload.at_once.get(), 1);
    }
}
