//! The pool of hashing threads and the one way work reaches them.
//!
//! Hashing is the most expensive thing authd does (hundreds of milliseconds at the
//! OWASP cost), so it never runs on the async workers: [`HashPool`] owns a fixed set
//! of OS threads (`worker`) behind a queue served first in, first out (`queue`).
//! The pool refuses nothing: admission control (`layers::admission`) admits a request
//! only when it can be answered before its deadline, and bounds the requests in
//! flight, so what reaches the queue is bounded and expected to be served in time;
//! work whose deadline passes while it waits is dropped unrun. The work and its
//! answer are described in `work`. Memory-hard work (Argon2) also reserves its
//! memory in the pool's budget (`budget`) before it is queued.
//!
//! It never hashes on the caller's thread, and it knows nothing of PHC strings or
//! users: work is a derivation (password, salt, rounds) whose 32-byte output comes
//! back, or is compared with an expected one.

use super::{
    budget::MemoryBudget,
    queue::HashQueue,
    work::{Answer, Derivation, PoolError, Queued, TaskOutcome, Work},
    worker::Worker,
};
use crate::{
    metrics::{HashMetrics, Metrics},
    otel,
};
use pbkdf2_lanes::Engine;
use std::{
    sync::Arc,
    time::{Duration, Instant},
};
use tokio::sync::oneshot;

/// What the pool did so far, read from its metrics: for tests and tools.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolSnapshot {
    /// Jobs that ran.
    pub completed: u64,
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
            dropped_expired: metrics.dropped_deadline.get(),
            dropped_cancelled: metrics.dropped_cancelled.get(),
            running: u64::try_from(metrics.running.get()).unwrap_or(0),
        }
    }
}

/// Closes the queue when the last clone of the pool is dropped.
struct Closer(Arc<HashQueue<Queued>>);

impl Drop for Closer {
    fn drop(&mut self) {
        self.0.close();
    }
}

/// A fixed set of threads behind a queue. Cloning shares the pool; the threads
/// finish the queued work and exit when the last clone is dropped.
#[derive(Clone)]
pub struct HashPool {
    queue: Arc<HashQueue<Queued>>,
    threads: usize,
    _closer: Arc<Closer>,
    engine: Engine,
    /// The memory memory-hard work may hold at once (`budget`).
    budget: MemoryBudget,
    pub(super) metrics: HashMetrics,
}

/// The memory budget of a pool built without one: 256 MiB.
pub const DEFAULT_MEMORY_BUDGET_KIB: u32 = 256 * 1024;

impl HashPool {
    /// Starts `threads` worker threads, at OS priority `nice`, hashing on `engine`;
    /// records into `metrics`.
    pub fn new(
        threads: usize,
        nice: u8,
        engine: Engine,
        metrics: &Metrics,
    ) -> std::io::Result<Self> {
        let threads = threads.max(1);
        let metrics = metrics.hash.clone();
        metrics.threads.set(threads as i64);
        let queue = Arc::new(HashQueue::new());
        for i in 0..threads {
            Worker {
                queue: queue.clone(),
                engine,
                metrics: metrics.clone(),
            }
            .spawn(i, nice)?;
        }
        let budget = MemoryBudget::new(
            DEFAULT_MEMORY_BUDGET_KIB,
            metrics.memory_in_use.clone(),
            &metrics.memory_budget,
        );
        Ok(Self {
            _closer: Arc::new(Closer(queue.clone())),
            queue,
            threads,
            engine,
            budget,
            metrics,
        })
    }

    /// The same pool with a memory budget of `total_kib` for memory-hard work.
    pub fn with_memory_budget(mut self, total_kib: u32) -> Self {
        self.budget = MemoryBudget::new(
            total_kib,
            self.metrics.memory_in_use.clone(),
            &self.metrics.memory_budget,
        );
        self
    }

    /// The memory budget of memory-hard work ([`HashPool::run_in_memory`]).
    pub fn memory_budget(&self) -> &MemoryBudget {
        &self.budget
    }

    /// The engine the threads hash on.
    pub fn engine(&self) -> Engine {
        self.engine
    }

    /// Hashes the threads run side by side when busy: the threads times the
    /// engine's lanes.
    pub fn parallelism(&self) -> usize {
        self.threads * self.engine.lanes()
    }

    pub fn stats(&self) -> PoolSnapshot {
        PoolSnapshot::of(&self.metrics)
    }

    /// Requests waiting for a thread.
    pub fn queued(&self) -> usize {
        self.queue.queued()
    }

    /// Hashes `job` (in the lanes of a hashing thread, beside what else runs) and
    /// returns its output, without blocking the async runtime.
    pub(crate) async fn derive(
        &self,
        deadline: Option<Instant>,
        job: Derivation,
    ) -> Result<[u8; 32], PoolError> {
        let (reply, result) = oneshot::channel();
        let answer = Answer::Output(reply);
        self.send(deadline, Work::Derive { job, answer })?;
        result.await.unwrap_or(Err(PoolError::Closed))
    }

    /// Whether `job`'s output is `expected` (compared in constant time). When it is
    /// not, `pad` more rounds are computed on the same thread, in its lane as soon as
    /// it finishes and before the answer, so that a failure costs `job.rounds + pad`
    /// rounds of sequential work whatever else shares the lanes.
    pub(crate) async fn verify(
        &self,
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
        self.send(deadline, Work::Derive { job, answer })?;
        result.await.unwrap_or(Err(PoolError::Closed))
    }

    /// Runs `work` on a pool thread, on its own (not batched).
    pub(crate) async fn run<T, F>(&self, deadline: Option<Instant>, work: F) -> Result<T, PoolError>
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
            // Real time: the caller's deadline and the time queued.
            if deadline.is_some_and(|d| Instant::now() >= d) {
                let _ = reply.send(Err(PoolError::Expired));
                return TaskOutcome::Expired;
            }
            // Real time: the caller's deadline and the time queued.
            let start = Instant::now();
            let value = work();
            // Counted before the answer, so a caller sees its own work counted.
            record(start.elapsed());
            let _ = reply.send(Ok(value));
            TaskOutcome::Ran
        });
        self.send(deadline, Work::Task(task))?;
        result.await.unwrap_or(Err(PoolError::Closed))
    }

    /// Runs `work`, which needs `memory_kib` KiB (Argon2, scrypt), on a pool thread
    /// once that memory fits in the budget: reserved before the work is queued,
    /// given back when it ends or is dropped unrun. Waiting for the budget holds no
    /// thread, and ends at the deadline.
    pub(crate) async fn run_in_memory<T, F>(
        &self,
        memory_kib: u32,
        deadline: Option<Instant>,
        work: F,
    ) -> Result<T, PoolError>
    where
        T: Send + 'static,
        F: FnOnce() -> T + Send + 'static,
    {
        let reserved = self.budget.reserve(memory_kib, deadline).await?;
        self.run(deadline, move || {
            let value = work();
            drop(reserved);
            value
        })
        .await
    }

    fn send(&self, deadline: Option<Instant>, work: Work) -> Result<(), PoolError> {
        let queued = Queued {
            deadline,
            // Real time: the caller's deadline and the time queued.
            queued_at: Instant::now(),
            work,
            trace: otel::Carried::current(),
        };
        self.metrics.queue_depth.inc();
        if self.queue.push(queued).is_err() {
            self.metrics.queue_depth.dec();
            return Err(PoolError::Closed);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::{occupy_the_thread, pool};
    use super::*;

    #[tokio::test]
    async fn work_waits_in_the_queue_and_none_is_refused() {
        let metrics = Metrics::new();
        let pool = pool(1, &metrics);
        let (busy, release_tx) = occupy_the_thread(&pool).await;
        // The thread is busy: whatever comes waits its turn, in order.
        let queued: Vec<_> = (0..100)
            .map(|i| {
                let pool = pool.clone();
                tokio::spawn(async move { pool.run(None, move || i).await })
            })
            .collect();
        while pool.queued() < 100 {
            tokio::task::yield_now().await;
        }
        assert_eq!(metrics.hash.queue_depth.get(), 100);
        assert_eq!(metrics.hash.running.get(), 1);
        release_tx.send(()).unwrap();
        busy.await.unwrap().unwrap();
        for (i, task) in queued.into_iter().enumerate() {
            assert_eq!(task.await.unwrap().unwrap(), i);
        }
        assert_eq!(metrics.hash.queue_depth.get(), 0);
        assert_eq!(pool.stats().completed, 101);
    }
}
