//! The bounded pool of hashing threads: who gets a place, and the refusals.
//!
//! Hashing is the most expensive thing authd does (hundreds of milliseconds at the
//! OWASP cost), so it never runs on the async workers: [`HashPool`] owns a fixed set
//! of OS threads (`worker`) behind a bounded queue (`queue`: bounded by time and
//! count, fair between clients). A request the queue cannot take is refused at once
//! (the caller gets RESOURCE_EXHAUSTED with a retry hint that spreads a crowd out)
//! instead of letting latency grow. A place is taken before the work is sent
//! ([`HashSlot`]); the work and its answer are described in `work`.
//!
//! It never hashes on the caller's thread, and it knows nothing of PHC strings or
//! users: work is a derivation (password, salt, rounds) whose 32-byte output comes
//! back, or is compared with an expected one.

use super::{
    queue::{FairQueue, Refusal},
    work::{Answer, Derivation, HashSlot, PoolError, Queued, TaskOutcome, Work},
    worker::Worker,
};
use crate::{
    metrics::{HashMetrics, Metrics},
    otel,
    rpc::UNKNOWN_CLIENT,
};
use pbkdf2_lanes::Engine;
use std::{
    net::IpAddr,
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};
use tokio::sync::oneshot;

/// What the retry hint needs to know beside the queue's rate (everything else the
/// pool counts is in its Prometheus metrics, [`HashMetrics`]).
#[derive(Debug, Default)]
struct HintStats {
    pressure: Pressure,
}

/// Places granted and refused over the last second or two: how crowded the pool is.
#[derive(Debug)]
struct Pressure {
    origin: Instant,
    /// The second (since `origin`) that the slot `second % 2` counts.
    second: AtomicU64,
    granted: [AtomicU64; 2],
    refused: [AtomicU64; 2],
}

impl Default for Pressure {
    fn default() -> Self {
        Self {
            origin: Instant::now(),
            second: AtomicU64::new(0),
            granted: Default::default(),
            refused: Default::default(),
        }
    }
}

impl Pressure {
    fn note(&self, refused: bool) {
        let now = self.origin.elapsed().as_secs();
        let seen = self.second.load(Ordering::Relaxed);
        if now != seen
            && self
                .second
                .compare_exchange(seen, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            // A new second: its slot starts from zero; after a gap, both do.
            for slot in [now % 2, (now + 1) % 2]
                .into_iter()
                .take(if now == seen + 1 { 1 } else { 2 })
            {
                self.granted[slot as usize].store(0, Ordering::Relaxed);
                self.refused[slot as usize].store(0, Ordering::Relaxed);
            }
        }
        let counter = if refused {
            &self.refused
        } else {
            &self.granted
        };
        counter[(now % 2) as usize].fetch_add(1, Ordering::Relaxed);
    }

    /// Refusals per granted place, recently.
    fn ratio(&self) -> f64 {
        let sum = |c: &[AtomicU64; 2]| c.iter().map(|a| a.load(Ordering::Relaxed)).sum::<u64>();
        sum(&self.refused) as f64 / sum(&self.granted).max(1) as f64
    }
}

/// What the pool did so far, read from its metrics: for tests and tools.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolSnapshot {
    /// Jobs that ran.
    pub completed: u64,
    /// Jobs refused a place in the queue (for any cause).
    pub rejected: u64,
    /// Jobs dropped unrun because their deadline had passed when a thread took them.
    pub dropped_expired: u64,
    /// Jobs dropped unrun because their caller had gone away.
    pub dropped_cancelled: u64,
    /// Jobs running on a thread right now.
    pub running: u64,
}

impl PoolSnapshot {
    fn of(metrics: &HashMetrics) -> Self {
        PoolSnapshot {
            completed: metrics.duration.get_sample_count(),
            rejected: Refusal::ALL
                .iter()
                .map(|why| metrics.refused.with_label_values(&[why.label()]).get())
                .sum(),
            dropped_expired: metrics.dropped_deadline.get(),
            dropped_cancelled: metrics.dropped_cancelled.get(),
            running: u64::try_from(metrics.running.get()).unwrap_or(0),
        }
    }
}

/// Closes the queue when the last clone of the pool is dropped.
struct Closer(Arc<FairQueue<Queued>>);

impl Drop for Closer {
    fn drop(&mut self) {
        self.0.close();
    }
}

/// A fixed set of threads behind a bounded queue. Cloning shares the pool; the
/// threads finish the queued work and exit when the last clone is dropped.
#[derive(Clone)]
pub struct HashPool {
    queue: Arc<FairQueue<Queued>>,
    _closer: Arc<Closer>,
    engine: Engine,
    stats: Arc<HintStats>,
    pub(super) metrics: HashMetrics,
}

impl HashPool {
    /// Starts `threads` worker threads, at OS priority `nice`, sharing a queue of at
    /// most `capacity` requests (and at most [`HashPool::with_queue_wait`] of
    /// expected waiting) and hashing on `engine`; records into `metrics`.
    pub fn new(
        threads: usize,
        capacity: usize,
        nice: u8,
        engine: Engine,
        metrics: &Metrics,
    ) -> std::io::Result<Self> {
        let threads = threads.max(1);
        let metrics = metrics.hash.clone();
        metrics.threads.set(threads as i64);
        metrics.queue_capacity.set(capacity as i64);
        let queue = Arc::new(FairQueue::new(threads, engine.lanes(), capacity));
        metrics.queue_limit.set(queue.limit() as i64);
        let stats = Arc::new(HintStats::default());
        for i in 0..threads {
            Worker {
                queue: queue.clone(),
                engine,
                metrics: metrics.clone(),
            }
            .spawn(i, nice)?;
        }
        Ok(Self {
            _closer: Arc::new(Closer(queue.clone())),
            queue,
            engine,
            stats,
            metrics,
        })
    }

    /// Sets the queue's wait target: places are granted while the expected wait (at
    /// the measured service rate) stays under it.
    pub fn with_queue_wait(self, wait: Duration) -> Self {
        self.queue.set_target_wait(wait);
        self
    }

    /// The engine the threads hash on.
    pub fn engine(&self) -> Engine {
        self.engine
    }

    pub fn stats(&self) -> PoolSnapshot {
        PoolSnapshot::of(&self.metrics)
    }

    /// The fewest places the queue's time rule allows: two full batches for every
    /// thread, what keeps them all busy.
    pub fn busy_floor(&self) -> usize {
        self.queue.floor()
    }

    /// Requests waiting for a thread.
    pub fn queued(&self) -> usize {
        self.queue.queued()
    }

    /// Takes a place in the pool for `client` (`None`: a caller with no address),
    /// whose work must start before `deadline`, or refuses at once (see `queue`).
    pub fn reserve(
        &self,
        client: Option<IpAddr>,
        deadline: Option<Instant>,
    ) -> Result<HashSlot, PoolError> {
        let client = client.map_or(UNKNOWN_CLIENT, |ip| ip.to_canonical());
        match self.queue.admit(client, Instant::now(), deadline) {
            Ok(()) => {
                self.stats.pressure.note(false);
                Ok(HashSlot {
                    queue: self.queue.clone(),
                    client,
                })
            }
            Err(why) => Err(self.refuse(why)),
        }
    }

    /// Refuses at once when the pool would refuse `client` now, without taking a
    /// place: for work that comes before the hash (a database lookup) and must not
    /// hold a place while it waits. The place itself is taken later, with
    /// [`HashPool::reserve`].
    pub fn check_room(
        &self,
        client: Option<IpAddr>,
        deadline: Option<Instant>,
    ) -> Result<(), PoolError> {
        let client = client.map_or(UNKNOWN_CLIENT, |ip| ip.to_canonical());
        (self.queue.check(client, Instant::now(), deadline)).map_err(|why| self.refuse(why))
    }

    fn refuse(&self, why: Refusal) -> PoolError {
        self.stats.pressure.note(true);
        self.metrics.refused.with_label_values(&[why.label()]).inc();
        let retry_after = self.retry_hint();
        match why {
            Refusal::Deadline => PoolError::TooLate { retry_after },
            Refusal::Full | Refusal::Wait | Refusal::Share => PoolError::Full { retry_after },
        }
    }

    /// Hashes `job` (in the lanes of a hashing thread, beside what else runs) in a place reserved
    /// before, and returns its output, without blocking the async runtime.
    pub(crate) async fn derive(
        &self,
        slot: HashSlot,
        deadline: Option<Instant>,
        job: Derivation,
    ) -> Result<[u8; 32], PoolError> {
        let (reply, result) = oneshot::channel();
        let answer = Answer::Output(reply);
        self.send(slot, deadline, Work::Derive { job, answer })?;
        result.await.unwrap_or(Err(PoolError::Closed))
    }

    /// Whether `job`'s output is `expected` (compared in constant time). When it is
    /// not, `pad` more rounds are computed on the same thread, in its lane as soon as
    /// it finishes and before the answer, so that a failure costs `job.rounds + pad`
    /// rounds of sequential work whatever else shares the lanes.
    pub(crate) async fn verify(
        &self,
        slot: HashSlot,
        deadline: Option<Instant>,
        job: Derivation,
        expected: [u8; 32],
        pad: u32,
    ) -> Result<bool, PoolError> {
        let (reply, result) = oneshot::channel();
        let answer = Answer::Matches {
            expected,
            pad,
            reply,
        };
        self.send(slot, deadline, Work::Derive { job, answer })?;
        result.await.unwrap_or(Err(PoolError::Closed))
    }

    /// Runs `work` on a pool thread, on its own (not batched), in a place reserved
    /// before.
    pub(crate) async fn run_in<T, F>(
        &self,
        slot: HashSlot,
        deadline: Option<Instant>,
        work: F,
    ) -> Result<T, PoolError>
    where
        T: Send + 'static,
        F: FnOnce() -> T + Send + 'static,
    {
        let (reply, result) = oneshot::channel::<Result<T, PoolError>>();
        let task = Box::new(move |record: &dyn Fn(Duration)| {
            // The caller's future was dropped (client cancelled, server deadline): skip.
            if reply.is_closed() {
                return TaskOutcome::Cancelled;
            }
            if deadline.is_some_and(|d| Instant::now() >= d) {
                let _ = reply.send(Err(PoolError::Expired));
                return TaskOutcome::Expired;
            }
            let start = Instant::now();
            let value = work();
            // Counted before the answer, so a caller sees its own work counted.
            record(start.elapsed());
            let _ = reply.send(Ok(value));
            TaskOutcome::Ran
        });
        self.send(slot, deadline, Work::Task(task))?;
        result.await.unwrap_or(Err(PoolError::Closed))
    }

    /// Reserves a place and runs `work` there: [`HashPool::run_in`].
    #[cfg(test)]
    pub(crate) async fn run<T, F>(&self, deadline: Option<Instant>, work: F) -> Result<T, PoolError>
    where
        T: Send + 'static,
        F: FnOnce() -> T + Send + 'static,
    {
        let slot = self.reserve(None, None)?;
        self.run_in(slot, deadline, work).await
    }

    fn send(&self, slot: HashSlot, deadline: Option<Instant>, work: Work) -> Result<(), PoolError> {
        let client = slot.client;
        let queued = Queued {
            deadline,
            queued_at: Instant::now(),
            work,
            trace: otel::Carried::current(),
            _slot: slot,
        };
        self.metrics.queue_depth.inc();
        if self.queue.push(client, queued).is_err() {
            self.metrics.queue_depth.dec();
            return Err(PoolError::Closed);
        }
        Ok(())
    }

    /// Roughly how long until the queue has room again: the time to work through it.
    ///
    /// The time to work through a full queue (its places over the measured rate),
    /// stretched by how many requests are being refused per one admitted: when a
    /// crowd is waiting, each of its members is told to come back later, so that
    /// refused clients that honour the hint do not return all at once and spend the
    /// CPU the hashing needs on more refusals.
    fn retry_hint(&self) -> Duration {
        let through = match self.queue.rate() {
            Some(rate) => Duration::from_secs_f64(self.queue.limit() as f64 / rate),
            None => Duration::ZERO,
        };
        let crowd = (1.0 + self.stats.pressure.ratio()).min(20.0);
        through
            .mul_f64(crowd)
            .clamp(Duration::from_millis(50), Duration::from_secs(30))
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::{occupy_the_thread, pool};
    use super::*;

    #[tokio::test]
    async fn a_full_queue_refuses_at_once() {
        let metrics = Metrics::new();
        let pool = pool(1, 1, &metrics);
        let (busy, release_tx) = occupy_the_thread(&pool).await;
        // The thread is busy; one request fits in the queue, the next is refused.
        let queued = tokio::spawn({
            let pool = pool.clone();
            async move { pool.run(None, || 1).await }
        });
        while pool.queued() == 0 {
            tokio::task::yield_now().await;
        }
        assert_eq!(metrics.hash.queue_depth.get(), 1);
        assert_eq!(metrics.hash.running.get(), 1);
        let refused = pool.run(None, || 2).await;
        assert!(
            matches!(refused, Err(PoolError::Full { .. })),
            "{refused:?}"
        );
        release_tx.send(()).unwrap();
        busy.await.unwrap().unwrap();
        assert_eq!(queued.await.unwrap().unwrap(), 1);
        assert_eq!(pool.stats().rejected, 1);
        assert_eq!(metrics.hash.refused.with_label_values(&["full"]).get(), 1);
        assert_eq!(metrics.hash.queue_depth.get(), 0);
    }
}
