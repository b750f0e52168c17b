//! The hashing threads: each takes what is waiting and hashes it as one batch.
//!
//! A thread takes what is waiting, up to the engine's lanes, and hashes it as one
//! batch on the multi-lane engine (`pbkdf2-lanes`): under load the batches fill,
//! and a core computes several PBKDF2 chains at once. It never waits for a batch to
//! fill: work alone in the queue runs alone, on the fastest single-stream path, so
//! an idle server's latency does not grow. Work whose deadline passed, or whose
//! caller went away, is dropped before it runs. The threads run at a lower OS
//! priority than those that answer requests, so hashing never delays a probe.
//!
//! A verification that fails may owe padding (see the parent module): the thread
//! computes it right after the batch, before taking new work, so a failed
//! verification costs its rounds plus its padding in sequential work, exactly as a
//! verification of that many rounds would, whatever else shared its batch.
//!
//! It only runs what the queue hands it: who gets a place, and the refusals and
//! their retry hints, are the pool's (`pool`) and the queue's (`queue`).

use super::{
    queue::FairQueue,
    work::{Answer, Derivation, PoolError, Queued, TaskOutcome, Work, padding},
};
use crate::{metrics::HashMetrics, otel};
use pbkdf2_lanes::{Backend, Engine, Job};
use std::{
    sync::Arc,
    thread,
    time::{Duration, Instant},
};
use subtle::ConstantTimeEq as _;

/// One hashing thread.
pub(super) struct Worker {
    pub(super) queue: Arc<FairQueue<Queued>>,
    pub(super) engine: Engine,
    pub(super) metrics: HashMetrics,
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
        // A batch is as many derivations as the engine computes side by side: more
        // would only make every request of the batch wait for all of them.
        let lanes = self.engine.lanes().max(1);
        let mut taken: Vec<Queued> = Vec::with_capacity(lanes);
        let mut batch: Vec<Queued> = Vec::with_capacity(lanes);
        // What is waiting joins the batch, one per client in turn; nothing waits for
        // it to fill.
        while self.queue.take(lanes, &mut taken) {
            for queued in taken.drain(..) {
                self.take(queued, &mut batch);
            }
            if !batch.is_empty() {
                let (start, size) = (Instant::now(), batch.len());
                self.hash(&mut batch);
                self.queue.record_batch(start.elapsed(), size);
                self.metrics.queue_limit.set(self.queue.limit() as i64);
            }
        }
    }

    /// Takes queued work off the queue: into the batch, run on its own (a task),
    /// or dropped unrun (its deadline passed, or its caller went away).
    fn take(&self, queued: Queued, batch: &mut Vec<Queued>) {
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
        match queued.work {
            Work::Task(task) => {
                self.metrics.running.inc();
                let record = |took: Duration| {
                    self.queue.record_batch(took, 1);
                    self.metrics.duration.observe(took.as_secs_f64());
                };
                match task(&record) {
                    TaskOutcome::Ran => queued.trace.record("hash", now, Instant::now()),
                    TaskOutcome::Expired => self.metrics.dropped_deadline.inc(),
                    TaskOutcome::Cancelled => self.metrics.dropped_cancelled.inc(),
                }
                self.metrics.running.dec();
            }
            Work::Derive { answer, .. } if queued.deadline.is_some_and(|d| now >= d) => {
                self.metrics.dropped_deadline.inc();
                answer.fail(PoolError::Expired);
            }
            work @ Work::Derive { .. } => batch.push(Queued { work, ..queued }),
        }
    }

    /// Hashes every derivation of the batch in one engine call and answers each
    /// request; then the padding of the verifications that failed, as a second
    /// batch, before their answers.
    fn hash(&self, batch: &mut Vec<Queued>) {
        let size = batch.len();
        // Each job leaves `running` just before its answer (in `finished`, or as it
        // fails), so a caller never sees its own finished work still running.
        self.metrics.running.add(size as i64);
        let start = Instant::now();
        let outputs = self.derive(batch.iter().filter_map(|queued| match &queued.work {
            Work::Derive { job, .. } => Some(job),
            Work::Task(_) => None,
        }));
        self.metrics.batch_size.observe(size as f64);
        // Verifications that failed and owe padding: answered after it.
        let mut owed = Vec::new();
        for (queued, output) in batch.drain(..).zip(outputs.iter()) {
            let Work::Derive { answer, .. } = queued.work else {
                continue;
            };
            let trace = queued.trace;
            match (outputs_result(output), answer) {
                (Err(e), answer) => {
                    self.metrics.running.dec();
                    answer.fail(e);
                }
                (Ok(output), Answer::Output(reply)) => {
                    self.finished(start, &trace);
                    let _ = reply.send(Ok(*output));
                }
                (
                    Ok(output),
                    Answer::Matches {
                        expected,
                        pad,
                        reply,
                    },
                ) => {
                    let matches = bool::from(output[..].ct_eq(&expected[..]));
                    if matches || pad == 0 {
                        self.finished(start, &trace);
                        let _ = reply.send(Ok(matches));
                    } else {
                        owed.push((padding(pad), reply, trace));
                    }
                }
            }
        }
        if !owed.is_empty() {
            let padded = self.derive(owed.iter().map(|(job, _, _)| job));
            for ((_, reply, trace), result) in owed.into_iter().zip(padded.iter()) {
                self.finished(start, &trace);
                let _ = reply.send(outputs_result(result).map(|_| false));
            }
        }
    }

    /// One engine call for `jobs`, counted; an output per job, or the engine's
    /// refusal for each.
    fn derive<'a>(
        &self,
        jobs: impl Iterator<Item = &'a Derivation>,
    ) -> Vec<Result<[u8; 32], PoolError>> {
        let jobs: Vec<Job<'_>> = jobs
            .map(|d| Job::new(&d.password, &d.salt, d.rounds))
            .collect();
        let rounds: u64 = jobs.iter().map(|j| u64::from(j.rounds)).sum();
        let mut out = vec![[0u8; 32]; jobs.len()];
        let result = single_stream(self.engine, jobs.len()).derive(&jobs, &mut out);
        self.metrics.rounds.inc_by(rounds);
        match result {
            Ok(()) => out.into_iter().map(Ok).collect(),
            Err(e) => vec![Err(PoolError::Engine(e)); jobs.len()],
        }
    }

    /// Records a request's work, begun at `start`, as done and no longer running:
    /// before its answer, so a caller sees its own work counted.
    fn finished(&self, start: Instant, trace: &otel::Carried) {
        self.metrics.running.dec();
        let end = Instant::now();
        let took = end - start;
        self.metrics.duration.observe(took.as_secs_f64());
        trace.record("hash", start, end);
    }
}

fn outputs_result(result: &Result<[u8; 32], PoolError>) -> Result<&[u8; 32], PoolError> {
    result.as_ref().map_err(|e| *e)
}

/// The engine for a batch of `jobs`: a single job runs on the fastest single-stream
/// path. (SHA-NI narrows to one stream by itself, and the detected AVX-512 engine
/// hands small batches to SHA-NI; a forced AVX2 or AVX-512 engine would compute all
/// its lanes for one job, slower than the portable path.)
fn single_stream(engine: Engine, jobs: usize) -> Engine {
    if jobs == 1 && matches!(engine.backend_for(1), Backend::Avx2 | Backend::Avx512) {
        return Engine::with_backend(Backend::Portable).unwrap_or(engine);
    }
    engine
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
        let pool = pool(1, 4, &metrics);
        for (password, rounds) in [(&b"password"[..], 1), (b"password", 2), (b"other", 1000)] {
            let out = pool
                .derive(
                    pool.reserve(None, None).unwrap(),
                    None,
                    job(password, rounds),
                )
                .await
                .unwrap();
            assert_eq!(out, reference(password, rounds));
        }
        assert_eq!(metrics.hash.rounds.get(), 1003);
        assert_eq!(metrics.hash.batch_size.get_sample_sum(), 3.0);
    }

    #[tokio::test]
    async fn a_failed_verification_pays_its_padding_and_a_success_does_not() {
        let metrics = Metrics::new();
        let pool = pool(1, 4, &metrics);
        let right = reference(b"password", 50);
        let verify = |password: &'static [u8]| {
            let pool = pool.clone();
            async move {
                pool.verify(
                    pool.reserve(None, None).unwrap(),
                    None,
                    job(password, 50),
                    right,
                    700,
                )
                .await
                .unwrap()
            }
        };
        assert!(verify(b"password").await);
        assert_eq!(metrics.hash.rounds.get(), 50);
        assert!(!verify(b"wrong").await);
        assert_eq!(metrics.hash.rounds.get(), 50 + 50 + 700);
        // The padding is a batch of its own, after the verification's.
        assert_eq!(metrics.hash.batch_size.get_sample_count(), 2);
        assert_eq!(metrics.hash.duration.get_sample_count(), 2);
    }
    #[tokio::test]
    async fn what_waits_is_hashed_together_and_nothing_waits_for_a_batch() {
        let metrics = Metrics::new();
        // Room for a batch of the widest engine (32 lanes) beside the held job.
        let pool = pool(1, 64, &metrics);
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
                        .derive(
                            pool.reserve(None, None).unwrap(),
                            None,
                            job(password.as_bytes(), 3),
                        )
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
        pool.derive(pool.reserve(None, None).unwrap(), None, job(b"alone", 1))
            .await
            .unwrap();
        assert_eq!(metrics.hash.batch_size.get_sample_count(), 2);
        assert_eq!(metrics.hash.batch_size.get_sample_sum(), lanes as f64 + 1.0);
    }

    #[tokio::test]
    async fn expired_work_is_dropped_before_running() {
        let metrics = Metrics::new();
        let pool = pool(1, 4, &metrics);
        let past = Instant::now() - Duration::from_millis(1);
        let err = pool
            .derive(
                pool.reserve(None, None).unwrap(),
                Some(past),
                job(b"late", 1),
            )
            .await
            .unwrap_err();
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
        let pool = HashPool::new(2, 4, 7, Engine::detect(), &Metrics::new()).unwrap();
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
