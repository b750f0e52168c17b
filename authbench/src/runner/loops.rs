//! The load itself: a closed loop of workers, each sending its next request when
//! the previous one is answered, or an open loop sending on a fixed schedule; and
//! the [`Clock`] that tells a closed loop's warm-up, measured requests and end.
//!
//! It decides when each request goes out and whether it is measured; how one is
//! sent and recorded is `request`'s. An open loop's latency runs from the moment a
//! request was meant to be sent, so a stalled server cannot hide its queue.

use super::{
    pacer::Pacer,
    plan::{Plan, Stop},
    request::{Client, Shared},
};
use crate::{report, schedule};
use anyhow::Context as _;
use hdrhistogram::Histogram;
use std::{
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};
use tokio::task::JoinSet;

/// Decides, for a closed loop, whether a request about to be sent is warm-up,
/// measured, or one too many.
///
/// A run of `--requests N` measures exactly N requests, and each of the first N
/// workers' first measured request is one of them, whenever it comes: a worker
/// answered quickly cannot take a slot from a worker not yet started. So with as
/// many workers as requests (`-c 300 -n 300`, 300 users at once), each sends
/// exactly one request, whatever order the runtime starts them in; with more
/// requests than workers, the rest go to whoever asks first.
pub(super) struct Clock {
    warm_end: Instant,
    stop: ClockStop,
}

enum ClockStop {
    At(Instant),
    After {
        limit: u64,
        /// Workers below this number have their first measured request reserved:
        /// `min(limit, workers)`.
        reserved: u64,
        /// Counts the requests past the reserved ones, from `reserved`.
        issued: AtomicU64,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Admit {
    Warmup,
    Measure,
    Stop,
}

impl Clock {
    /// The clock of a run of `workers` workers.
    pub(super) fn new(warm_end: Instant, stop: Stop, workers: usize) -> Self {
        let stop = match stop {
            Stop::Duration(d) => ClockStop::At(warm_end + d),
            Stop::Requests(limit) => {
                let reserved = limit.min(u64::try_from(workers).unwrap_or(u64::MAX));
                ClockStop::After {
                    limit,
                    reserved,
                    issued: AtomicU64::new(reserved),
                }
            }
        };
        Self { warm_end, stop }
    }

    /// Whether `worker`'s request about to be sent at `now` is measured;
    /// `measured_yet` says whether one of its requests already was.
    fn admit(&self, now: Instant, worker: usize, measured_yet: bool) -> Admit {
        if now < self.warm_end {
            return Admit::Warmup;
        }
        let more = match &self.stop {
            ClockStop::At(end) => now < *end,
            ClockStop::After {
                limit,
                reserved,
                issued,
            } => {
                let worker = u64::try_from(worker).unwrap_or(u64::MAX);
                (!measured_yet && worker < *reserved)
                    || issued.fetch_add(1, Ordering::Relaxed) < *limit
            }
        };
        if more { Admit::Measure } else { Admit::Stop }
    }
}

/// Runs one worker per client: as many requests in flight as there are clients.
pub(super) async fn closed_loop(
    shared: &Arc<Shared>,
    clock: &Arc<Clock>,
    clients: Vec<Client>,
) -> anyhow::Result<()> {
    let mut workers = JoinSet::new();
    for (id, client) in clients.into_iter().enumerate() {
        workers.spawn(closed_worker(shared.clone(), clock.clone(), id, client));
    }
    while let Some(done) = workers.join_next().await {
        done.context("a load worker panicked")?;
    }
    Ok(())
}

/// One closed-loop worker: its next request goes out when the previous one is answered.
async fn closed_worker(shared: Arc<Shared>, clock: Arc<Clock>, id: usize, mut client: Client) {
    // Each worker starts at its own place on the wheel and in the user pool, so the
    // workers together cover the mix and the users from the first request on.
    let mut turn = id;
    let mut measured_yet = false;
    loop {
        let sent = Instant::now();
        let admit = clock.admit(sent, id, measured_yet);
        if admit == Admit::Stop {
            break;
        }
        measured_yet |= admit == Admit::Measure;
        let op = shared.wheel[turn % shared.wheel.len()];
        let performed = shared.perform(op, turn, &mut client).await;
        turn = turn.wrapping_add(1);
        if admit == Admit::Measure {
            shared.record(id, op, performed.result, sent, Instant::now());
        } else {
            shared.counters.warmup.fetch_add(1, Ordering::Relaxed);
        }
        if let (true, Some(delay)) = (shared.backoff, performed.retry_after) {
            // Think time, not latency: the next request's clock starts after it.
            tokio::time::sleep(delay.mul_f64(rand::random_range(0.5..1.5))).await;
        }
    }
}

/// Sends on the fixed schedule `start + k / rate` and awaits every answer (gRPC
/// only: the requests share its connections).
///
/// The runtime's own thread keeps the schedule: it sleeps on a [`Pacer`] until the
/// next send is due, then sends every request due by then, each counted from its
/// own due time. A runtime that falls behind (busy with answers) sends what it owes
/// as soon as it is back, so its lateness shows as latency, never as a lower rate.
///
/// Returns that lateness of the measured sends (microseconds, up to `highest`): how
/// long after its due time each was started (its task spawned), so a report can
/// tell the client's own delay (its core busy, or taken away by its host) from the
/// server's.
pub(super) async fn open_loop(
    shared: &Arc<Shared>,
    start: Instant,
    plan: &Plan,
    rate: f64,
    highest: Duration,
) -> anyhow::Result<Histogram<u64>> {
    let warmup_sends = schedule::sends_before(plan.warmup, rate);
    let total = match plan.stop {
        Stop::Requests(n) => warmup_sends + n,
        Stop::Duration(d) => schedule::sends_before(plan.warmup + d, rate),
    };
    let mut pacer = Pacer::new(rate).context("creating the open loop's timer")?;
    let mut late = report::micros_histogram(highest);
    let mut in_flight = JoinSet::new();
    let mut sent = 0;
    while sent < total {
        // Reap answered requests so the set stays as small as what is in flight.
        while let Some(done) = in_flight.try_join_next() {
            done.context("a request task panicked")?;
        }
        // Every send due by now goes out in this turn (so that h2 writes them
        // together), each counted from its own due time.
        let now = Instant::now();
        let due = schedule::sends_before(now.saturating_duration_since(start), rate).min(total);
        for k in sent..due {
            let intended = schedule::intended_send_time(start, k, rate);
            let measured = k >= warmup_sends;
            if measured {
                late.saturating_record(report::micros(now.saturating_duration_since(intended)));
            }
            in_flight.spawn(send(shared.clone(), k, intended, measured));
        }
        sent = sent.max(due);
        if sent == total {
            break;
        }
        let next = schedule::intended_send_time(start, sent, rate);
        if next > Instant::now() {
            (pacer.sleep_until(next).await).context("waiting for the next send")?;
        } else {
            // Due already (the runtime is late): let the requests just sent and the
            // answers run first, so a late runtime cannot starve them.
            tokio::task::yield_now().await;
        }
    }
    while let Some(done) = in_flight.join_next().await {
        done.context("a request task panicked")?;
    }
    Ok(late)
}

/// Send `k` of an open loop, due at `intended`: performed on its connection and
/// recorded (or counted as warm-up).
async fn send(shared: Arc<Shared>, k: u64, intended: Instant, measured: bool) {
    let i = usize::try_from(k).unwrap_or(usize::MAX);
    let mut client = Client::Grpc(shared.grpc[i % shared.grpc.len()].clone());
    let op = shared.wheel[i % shared.wheel.len()];
    let performed = shared.perform(op, i, &mut client).await;
    if measured {
        // Latency from when the request was *meant* to go out: if this client
        // or the server fell behind, the delay shows in the report.
        shared.record(i, op, performed.result, intended, Instant::now());
    } else {
        shared.counters.warmup.fetch_add(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_closed_loop_clock_counts_measured_requests_exactly() {
        let now = Instant::now();
        let clock = Clock::new(now + Duration::from_secs(1), Stop::Requests(5), 2);
        assert_eq!(clock.admit(now, 0, false), Admit::Warmup);
        let after = now + Duration::from_secs(2);
        // Worker 0 asks again and again: it gets its own first request and the three
        // not reserved; worker 1, asking last, still gets its first.
        let mut admitted = vec![clock.admit(after, 0, false)];
        admitted.extend((0..4).map(|_| clock.admit(after, 0, true)));
        admitted.push(clock.admit(after, 1, false));
        admitted.push(clock.admit(after, 1, true));
        assert_eq!(
            admitted,
            [
                Admit::Measure,
                Admit::Measure,
                Admit::Measure,
                Admit::Measure,
                Admit::Stop,
                Admit::Measure,
                Admit::Stop
            ]
        );
    }

    #[test]
    fn as_many_workers_as_requests_send_one_each() {
        let now = Instant::now();
        let clock = Clock::new(now, Stop::Requests(3), 4);
        // Worker 0 is answered before workers 1 and 2 have started: its next request
        // is not measured, theirs are; worker 3 has none to send.
        assert_eq!(clock.admit(now, 0, false), Admit::Measure);
        assert_eq!(clock.admit(now, 0, true), Admit::Stop);
        assert_eq!(clock.admit(now, 2, false), Admit::Measure);
        assert_eq!(clock.admit(now, 1, false), Admit::Measure);
        assert_eq!(clock.admit(now, 3, false), Admit::Stop);
        assert_eq!(clock.admit(now, 1, true), Admit::Stop);
    }

    #[test]
    fn a_closed_loop_clock_stops_after_the_duration() {
        let now = Instant::now();
        let clock = Clock::new(now, Stop::Duration(Duration::from_secs(10)), 1);
        assert_eq!(clock.admit(now, 0, false), Admit::Measure);
        let later = now + Duration::from_secs(9);
        assert_eq!(clock.admit(later, 0, true), Admit::Measure);
        let end = now + Duration::from_secs(10);
        assert_eq!(clock.admit(end, 0, true), Admit::Stop);
    }
}
