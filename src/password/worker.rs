//! The hashing threads: each keeps lanes of derivations in flight and refills them
//! from the queue between kernel calls.
//!
//! A thread holds up to the engine's lanes of derivations at once (`pbkdf2-lanes`'
//! [`Lanes`]) and advances them a kernel call of at most [`STEP_ROUNDS`] rounds at a
//! time. Between calls it takes what is waiting into the free lanes, so a request
//! that arrives while others hash joins them at the next call (well under a
//! millisecond later) rather than waiting for a whole batch to end. Each call runs
//! the kernel the engine's plan chooses for the number of derivations at hand: one
//! alone runs on the fastest single-stream path, so an idle server's latency does
//! not grow; many run on the widest vectors. Work whose deadline passed, or whose
//! caller went away, is dropped before it runs; a derivation whose caller goes away
//! while it runs leaves its lane at the next call. The threads run at a lower OS
//! priority than those that answer requests, so hashing never delays a probe.
//!
//! A verification that fails may owe padding (see the parent module): the padding
//! takes the lane of the verification as soon as it finishes, and the answer comes
//! when the padding does, so a failed verification costs its rounds plus its
//! padding, exactly as a verification of that many rounds would, whatever else
//! shares the lanes.
//!
//! Other work (a task: Argon2, a stored hash the engine cannot check) runs on the
//! thread between two kernel calls, on its own; a thread takes nothing from the
//! queue behind a task, so tasks queued together run on as many threads.
//!
//! It only runs what the queue hands it, in the queue's order (`queue`).

use super::{
    queue::HashQueue,
    work::{Answer, Derivation, PoolError, Queued, Reply, TaskOutcome, Work, padding},
};
use crate::{metrics::HashMetrics, otel};
use pbkdf2_lanes::{Engine, Job, Lanes};
use std::{
    sync::Arc,
    thread,
    time::{Duration, Instant},
};
use subtle::ConstantTimeEq as _;

/// The most rounds of one kernel call: how long, at most, a request that arrives
/// while the lanes are busy waits to join them. About 0.5 ms with 32 AVX-512
/// lanes, 0.07 ms for one SHA-NI stream, on the machines of `pbkdf2-lanes`' docs.
pub(super) const STEP_ROUNDS: u32 = 1024;

/// One hashing thread.
pub(super) struct Worker {
    pub(super) queue: Arc<HashQueue<Queued>>,
    pub(super) engine: Engine,
    pub(super) metrics: HashMetrics,
}

/// A derivation in a lane: whom to answer.
struct Resident {
    answer: Resolve,
    /// When it took its lane.
    start: Instant,
    trace: otel::Carried,
}

/// What a finished derivation in a lane answers.
enum Resolve {
    /// A request's own derivation.
    Request(Answer),
    /// The padding a failed verification owes: then it answers `false`.
    Padding(Reply<bool>),
}

impl Resolve {
    /// Whether no one waits for the answer any more.
    fn abandoned(&self) -> bool {
        match self {
            Resolve::Request(answer) => answer.is_closed(),
            Resolve::Padding(reply) => reply.is_closed(),
        }
    }

    /// Answers with `err`.
    fn fail(self, err: PoolError) {
        match self {
            Resolve::Request(answer) => answer.fail(err),
            Resolve::Padding(reply) => {
                let _ = reply.send(Err(err));
            }
        }
    }
}

impl Worker {
    /// Starts this worker as hashing thread number `i`, at OS priority `nice`.
    pub(super) fn spawn(self, i: usize, nice: u8) -> std::io::Result<()> {
        thread::Builder::new()
            .name(format!("authd-hash-{i}"))
            .spawn(move || {
                // Answering requests and probes comes first when every core is busy.
                crate::priority::lower(nice, "hashing");
                self.run();
            })?;
        Ok(())
    }

    fn run(self) {
        let mut lanes: Lanes<Resident> = Lanes::new(&self.engine);
        let mut taken: Vec<Queued> = Vec::with_capacity(lanes.capacity());
        let mut finished: Vec<(Resident, [u8; 32])> = Vec::with_capacity(lanes.capacity());
        loop {
            // Wait for work only with nothing in flight; otherwise take what waits,
            // oldest first, into the free lanes.
            if lanes.is_empty() {
                if !self.queue.take(lanes.capacity(), &mut taken, Queued::alone) {
                    return;
                }
            } else if lanes.free() > 0 {
                self.queue
                    .take_ready(lanes.free(), &mut taken, Queued::alone);
            }
            for queued in taken.drain(..) {
                self.take(queued, &mut lanes);
            }
            lanes.retain(|resident| {
                let gone = resident.answer.abandoned();
                if gone {
                    self.metrics.running.dec();
                    self.metrics.dropped_cancelled.inc();
                }
                !gone
            });
            let step = lanes.step(STEP_ROUNDS, |resident, key| finished.push((resident, key)));
            if let Some(step) = step {
                self.metrics.batch_size.observe(step.jobs as f64);
            }
            for (resident, key) in finished.drain(..) {
                self.finish(resident, key, &mut lanes);
            }
        }
    }

    /// Takes queued work off the queue: into a lane, run on its own (a task), or
    /// dropped unrun (its deadline passed, or its caller went away).
    fn take(&self, queued: Queued, lanes: &mut Lanes<Resident>) {
        // Real time: how long hashing takes (pacing, traces).
        let now = Instant::now();
        self.metrics.queue_depth.dec();
        self.metrics
            .queue_wait
            .observe((now - queued.queued_at).as_secs_f64());
        queued
            .trace
            .record("hash.queue_wait", queued.queued_at, now);
        if queued.abandoned() {
            self.metrics.dropped_cancelled.inc();
            return;
        }
        let Queued {
            deadline,
            work,
            trace,
            ..
        } = queued;
        match work {
            Work::Task(task) => {
                self.metrics.running.inc();
                let record = |took: Duration| self.metrics.duration.observe(took.as_secs_f64());
                match task(&record) {
                    // Real time: how long hashing takes (pacing, traces).
                    TaskOutcome::Ran => trace.record("hash", now, Instant::now()),
                    TaskOutcome::Expired => self.metrics.dropped_deadline.inc(),
                    TaskOutcome::Cancelled => self.metrics.dropped_cancelled.inc(),
                }
                self.metrics.running.dec();
            }
            Work::Derive { answer, .. } if deadline.is_some_and(|d| now >= d) => {
                self.metrics.dropped_deadline.inc();
                answer.fail(PoolError::Expired);
            }
            Work::Derive { job, answer } => {
                let resident = Resident {
                    answer: Resolve::Request(answer),
                    start: now,
                    trace,
                };
                self.push(&job, resident, lanes);
            }
        }
    }

    /// Puts a derivation in a free lane; counted as running from now.
    fn push(&self, job: &Derivation, resident: Resident, lanes: &mut Lanes<Resident>) {
        self.metrics.running.inc();
        self.metrics.rounds.inc_by(u64::from(job.rounds));
        if let Err((e, resident)) =
            lanes.push(Job::new(&job.password, &job.salt, job.rounds), resident)
        {
            self.metrics.running.dec();
            resident.answer.fail(PoolError::Engine(e));
        }
    }

    /// Answers a finished derivation, or puts the padding a failed verification
    /// owes in its lane.
    fn finish(&self, resident: Resident, output: [u8; 32], lanes: &mut Lanes<Resident>) {
        let Resident {
            answer,
            start,
            trace,
        } = resident;
        match answer {
            Resolve::Request(Answer::Output(reply)) => {
                self.finished(start, &trace);
                let _ = reply.send(Ok(output));
            }
            Resolve::Request(Answer::Matches {
                expected,
                pad,
                reply,
            }) => {
                let matches = bool::from(output[..].ct_eq(&expected[..]));
                if matches || pad == 0 {
                    self.finished(start, &trace);
                    let _ = reply.send(Ok(matches));
                } else {
                    // The answer waits for the padding, in the same lane.
                    self.metrics.running.dec();
                    let resident = Resident {
                        answer: Resolve::Padding(reply),
                        start,
                        trace,
                    };
                    self.push(&padding(pad), resident, lanes);
                }
            }
            Resolve::Padding(reply) => {
                self.finished(start, &trace);
                let _ = reply.send(Ok(false));
            }
        }
    }

    /// Records a request's work, begun at `start`, as done and no longer running:
    /// before its answer, so a caller sees its own work counted.
    fn finished(&self, start: Instant, trace: &otel::Carried) {
        self.metrics.running.dec();
        // Real time: how long hashing takes (pacing, traces).
        let end = Instant::now();
        let took = end - start;
        self.metrics.duration.observe(took.as_secs_f64());
        trace.record("hash", start, end);
    }
}

#[cfg(test)]
mod tests {
    use super::super::{
        HashPool,
        testing::{job, occupy_the_thread, pool, reference},
    };
    use super::*;
    use crate::metrics::Metrics;

    #[tokio::test]
    async fn derivations_match_the_reference() {
        let metrics = Metrics::new();
        let pool = pool(1, &metrics);
        for (password, rounds) in [(&b"password"[..], 1), (b"password", 2), (b"other", 1000)] {
            let out = pool.derive(None, job(password, rounds)).await.unwrap();
            assert_eq!(out, reference(password, rounds));
        }
        assert_eq!(metrics.hash.rounds.get(), 1003);
        // One kernel call each for the jobs of 2 and 1,000 rounds (999 ≤ STEP_ROUNDS
        // rounds after the preparation); one of a single round needs none.
        assert_eq!(metrics.hash.batch_size.get_sample_count(), 2);
        assert_eq!(metrics.hash.batch_size.get_sample_sum(), 2.0);
    }

    #[tokio::test]
    async fn a_failed_verification_pays_its_padding_and_a_success_does_not() {
        let metrics = Metrics::new();
        let pool = pool(1, &metrics);
        let right = reference(b"password", 50);
        let verify = |password: &'static [u8]| {
            let pool = pool.clone();
            async move {
                pool.verify(None, job(password, 50), right, 700)
                    .await
                    .unwrap()
            }
        };
        assert!(verify(b"password").await);
        assert_eq!(metrics.hash.rounds.get(), 50);
        assert!(!verify(b"wrong").await);
        assert_eq!(metrics.hash.rounds.get(), 50 + 50 + 700);
        // The padding is a derivation of its own, after the verification's: three
        // kernel calls in all, and two requests answered.
        assert_eq!(metrics.hash.batch_size.get_sample_count(), 3);
        assert_eq!(metrics.hash.batch_size.get_sample_sum(), 3.0);
        assert_eq!(metrics.hash.duration.get_sample_count(), 2);
    }
    #[tokio::test]
    async fn what_waits_is_hashed_together_and_nothing_waits_for_a_batch() {
        let metrics = Metrics::new();
        let pool = pool(1, &metrics);
        // Hold the only thread, queue several requests, then let it go: they come
        // off the queue as batches of up to the engine's lanes.
        let (busy, release_tx) = occupy_the_thread(&pool).await;
        let lanes = pool.engine().lanes();
        let waiting: Vec<_> = (0..lanes)
            .map(|i| {
                let pool = pool.clone();
                tokio::spawn(async move {
                    let password = format!("password-{i}");
                    let out = pool
                        .derive(None, job(password.as_bytes(), 3))
                        .await
                        .unwrap();
                    (password, out)
                })
            })
            .collect();
        while pool.queued() < lanes {
            tokio::task::yield_now().await;
        }
        release_tx.send(()).unwrap();
        busy.await.unwrap().unwrap();
        for task in waiting {
            let (password, out) = task.await.unwrap();
            let mut expected = [0u8; 32];
            pbkdf2::pbkdf2_hmac::<pbkdf2::sha2::Sha256>(
                password.as_bytes(),
                b"salt",
                3,
                &mut expected,
            );
            assert_eq!(out, expected);
        }
        // One batch of `lanes` derivations: one engine call for all of them.
        assert_eq!(metrics.hash.batch_size.get_sample_count(), 1);
        assert_eq!(metrics.hash.batch_size.get_sample_sum(), lanes as f64);
        // And a request alone in the queue is hashed at once, alone.
        pool.derive(None, job(b"alone", 3)).await.unwrap();
        assert_eq!(metrics.hash.batch_size.get_sample_count(), 2);
        assert_eq!(metrics.hash.batch_size.get_sample_sum(), lanes as f64 + 1.0);
    }

    #[tokio::test]
    async fn work_that_arrives_while_a_derivation_runs_joins_it_and_a_gone_caller_frees_its_lane() {
        let metrics = Metrics::new();
        let pool = pool(1, &metrics);
        // A derivation that would run for hours holds the only thread.
        let endless = tokio::spawn({
            let pool = pool.clone();
            async move { pool.derive(None, job(b"endless", u32::MAX)).await }
        });
        while metrics.hash.running.get() < 1 {
            tokio::task::yield_now().await;
        }
        // Work that arrives meanwhile is answered while it still runs: it took a
        // free lane at the next kernel call rather than waiting for the batch.
        // (The timeout only keeps a broken build from hanging the suite.)
        let joined = pool.derive(None, job(b"joins", 3));
        let out = tokio::time::timeout(Duration::from_secs(120), joined)
            .await
            .expect("work waited for the running batch to end")
            .unwrap();
        assert_eq!(out, reference(b"joins", 3));
        assert!(!endless.is_finished());
        assert!(metrics.hash.batch_size.get_sample_sum() >= 2.0);
        // Its caller goes away: the derivation leaves its lane at the next call, and
        // the thread is free again.
        endless.abort();
        assert!(endless.await.unwrap_err().is_cancelled());
        while metrics.hash.dropped_cancelled.get() < 1 || metrics.hash.running.get() > 0 {
            tokio::task::yield_now().await;
        }
        assert_eq!(
            pool.derive(None, job(b"next", 2)).await.unwrap(),
            reference(b"next", 2)
        );
        assert_eq!(metrics.hash.running.get(), 0);
    }

    #[tokio::test]
    async fn expired_work_is_dropped_before_running() {
        let metrics = Metrics::new();
        let pool = pool(1, &metrics);
        // Real time: the caller's deadline.
        let past = Instant::now() - Duration::from_millis(1);
        let err = pool.derive(Some(past), job(b"late", 1)).await.unwrap_err();
        assert_eq!(err, PoolError::Expired);
        assert_eq!(pool.stats().dropped_expired, 1);
        assert_eq!(pool.stats().completed, 0);
        assert_eq!(metrics.hash.dropped_deadline.get(), 1);
        assert_eq!(metrics.hash.duration.get_sample_count(), 0);
        assert_eq!(metrics.hash.rounds.get(), 0);
        assert_eq!(pool.run(None, || 42).await.unwrap(), 42);
        assert_eq!(metrics.hash.duration.get_sample_count(), 1);
        // Both waited in the queue, the dropped one too.
        assert_eq!(metrics.hash.queue_wait.get_sample_count(), 2);
        assert_eq!(metrics.hash.queue_depth.get(), 0);
    }

    #[tokio::test]
    async fn the_threads_run_at_a_lower_priority() {
        let pool = HashPool::new(2, 7, Engine::detect(), &Metrics::new()).unwrap();
        let nice = pool
            .run(None, || {
                rustix::process::getpriority_process(Some(rustix::thread::gettid()))
            })
            .await
            .unwrap()
            .unwrap();
        assert_eq!(nice, 7);
        // The calling thread is untouched.
        let here = rustix::process::getpriority_process(Some(rustix::thread::gettid())).unwrap();
        assert_ne!(here, 7);
    }
}
