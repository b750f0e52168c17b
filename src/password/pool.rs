//! The bounded pool of hashing threads, and the batches they hash.
//!
//! Hashing is the most expensive thing authd does (hundreds of milliseconds at the
//! OWASP cost), so it never runs on the async workers: [`HashPool`] owns a fixed set
//! of OS threads behind a bounded queue (`queue`: bounded by time and count, fair
//! between clients). A request the queue cannot take is refused at once (the caller
//! gets RESOURCE_EXHAUSTED with a retry hint that spreads a crowd out) instead of
//! letting latency grow, and work whose deadline passed, or whose caller went away,
//! is dropped before it runs. The threads run at a lower OS priority than those
//! that answer requests, so hashing never delays a probe.
//!
//! A thread takes what is waiting, up to the engine's lanes, and hashes it as one
//! batch on the multi-lane engine (`pbkdf2-lanes`): under load the batches fill,
//! and a core computes several PBKDF2 chains at once. It never waits for a batch to
//! fill: work alone in the queue runs alone, on the fastest single-stream path, so
//! an idle server's latency does not grow.
//!
//! A verification that fails may owe padding (see the parent module): the thread
//! computes it right after the batch, before taking new work, so a failed
//! verification costs its rounds plus its padding in sequential work, exactly as a
//! verification of that many rounds would, whatever else shared its batch.
//!
//! It knows nothing of PHC strings or users: work is a derivation (password, salt,
//! rounds) whose 32-byte output comes back, or is compared with an expected one.

use super::queue::{FairQueue, Refusal};
use crate::{
    error::Error,
    metrics::{HashMetrics, Metrics},
    otel,
    rpc::UNKNOWN_CLIENT,
};
use pbkdf2_lanes::{Backend, Engine, Job};
use std::{
    fmt,
    net::IpAddr,
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    thread,
    time::{Duration, Instant},
};
use subtle::ConstantTimeEq as _;
use tokio::sync::oneshot;

/// One PBKDF2-HMAC-SHA256 computation with a 32-byte output.
pub(crate) struct Derivation {
    pub password: Vec<u8>,
    pub salt: Vec<u8>,
    /// At least 1.
    pub rounds: u32,
}

impl fmt::Debug for Derivation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Derivation")
            .field("password", &"<redacted>")
            .field("salt_len", &self.salt.len())
            .field("rounds", &self.rounds)
            .finish()
    }
}

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
    pub rejected_full: u64,
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
            rejected_full: Refusal::ALL
                .iter()
                .map(|why| metrics.refused.with_label_values(&[why.label()]).get())
                .sum(),
            dropped_expired: metrics.dropped_deadline.get(),
            dropped_cancelled: metrics.dropped_cancelled.get(),
            running: u64::try_from(metrics.running.get()).unwrap_or(0),
        }
    }
}

/// Why a job did not run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum PoolError {
    #[error("the hashing queue is full")]
    Full { retry_after: Duration },
    #[error("the hashing queue would outlast the request's deadline")]
    TooLate { retry_after: Duration },
    #[error("the deadline passed while the job was queued")]
    Expired,
    #[error("the hashing pool has shut down")]
    Closed,
    #[error("the hashing engine refused a batch: {0}")]
    Engine(pbkdf2_lanes::Error),
}

impl From<PoolError> for Error {
    fn from(err: PoolError) -> Self {
        match err {
            PoolError::Full { retry_after } => Error::Overloaded {
                what: "the password hashing queue is full",
                retry_after,
            },
            PoolError::TooLate { retry_after } => Error::Overloaded {
                what: "the password hashing queue would outlast the request's deadline",
                retry_after,
            },
            PoolError::Expired => Error::DeadlineExceeded,
            PoolError::Closed => Error::Unavailable("the server is shutting down".into()),
            PoolError::Engine(e) => Error::Internal(anyhow::anyhow!("hashing failed: {e}")),
        }
    }
}

type Reply<T> = oneshot::Sender<Result<T, PoolError>>;

/// What a thread is asked to do.
enum Work {
    /// A derivation hashed in a batch with whatever else is waiting.
    Derive { job: Derivation, answer: Answer },
    /// Any other work (a stored hash the engine cannot check), run on its own.
    Task(Task),
}

/// What the caller of a derivation wants back.
enum Answer {
    /// The output (a new hash).
    Output(Reply<[u8; 32]>),
    /// Whether the output is `expected` (a verification); when it is not, `pad`
    /// more rounds are computed on throwaway input before the answer.
    Matches {
        expected: [u8; 32],
        pad: u32,
        reply: Reply<bool>,
    },
}

impl Answer {
    fn is_closed(&self) -> bool {
        match self {
            Answer::Output(reply) => reply.is_closed(),
            Answer::Matches { reply, .. } => reply.is_closed(),
        }
    }

    fn fail(self, err: PoolError) {
        match self {
            Answer::Output(reply) => {
                let _ = reply.send(Err(err));
            }
            Answer::Matches { reply, .. } => {
                let _ = reply.send(Err(err));
            }
        }
    }
}

/// A task's body; it is given the function that records its run time.
type Task = Box<dyn FnOnce(&dyn Fn(Duration)) -> TaskOutcome + Send>;

/// What became of a task: it checks its own deadline and caller when it starts.
enum TaskOutcome {
    Ran,
    Expired,
    Cancelled,
}

struct Queued {
    deadline: Option<Instant>,
    /// When the work was queued, for the queue wait metric.
    queued_at: Instant,
    work: Work,
    /// The request's trace, for the spans of the queue wait and the hash.
    trace: otel::Carried,
    /// Freed when the work is done (or dropped), making room for more.
    _slot: HashSlot,
}

impl Queued {
    /// Whether nobody waits for the answer any more.
    fn abandoned(&self) -> bool {
        match &self.work {
            Work::Derive { answer, .. } => answer.is_closed(),
            Work::Task(_) => false,
        }
    }
}

/// A place in the pool (running or queued) of one client, taken before the work is
/// sent, so that a request the pool cannot take is refused cheaply.
pub struct HashSlot {
    queue: Arc<FairQueue<Queued>>,
    client: IpAddr,
}

impl Drop for HashSlot {
    fn drop(&mut self) {
        self.queue.release(self.client);
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
            let worker = Worker {
                queue: queue.clone(),
                engine,
                metrics: metrics.clone(),
            };
            thread::Builder::new()
                .name(format!("authd-hash-{i}"))
                .spawn(move || {
                    // Answering requests and probes comes first when every core is busy.
                    crate::priority::lower(nice, "hashing");
                    worker.run();
                })?;
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

    /// Hashes `job` (in a batch with whatever else is waiting) in a place reserved
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
    /// not, `pad` more rounds are computed on the same thread, right after its batch
    /// and before the answer, so that a failure costs `job.rounds + pad` rounds of
    /// sequential work whatever else was in the batch.
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

/// One hashing thread.
struct Worker {
    queue: Arc<FairQueue<Queued>>,
    engine: Engine,
    metrics: HashMetrics,
}

impl Worker {
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

/// Padding: rounds of PBKDF2 on throwaway input, the same work per round as a
/// verification (one 32-byte block).
pub(crate) fn padding(rounds: u32) -> Derivation {
    Derivation {
        password: b"authd: padding of a verification".to_vec(),
        salt: b"throwaway salt".to_vec(),
        rounds,
    }
}

/// The engine for a batch of `jobs`: a single job runs on the fastest single-stream
/// path. (SHA-NI narrows to one stream by itself; AVX2 would compute eight lanes
/// for one job, slower than the portable path.)
fn single_stream(engine: Engine, jobs: usize) -> Engine {
    if jobs == 1 && engine.backend() == Backend::Avx2 {
        return Engine::with_backend(Backend::Portable).unwrap_or(engine);
    }
    engine
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pool(threads: usize, capacity: usize, metrics: &Metrics) -> HashPool {
        HashPool::new(threads, capacity, 0, Engine::detect(), metrics).unwrap()
    }

    fn job(password: &[u8], rounds: u32) -> Derivation {
        Derivation {
            password: password.to_vec(),
            salt: b"salt".to_vec(),
            rounds,
        }
    }

    fn reference(password: &[u8], rounds: u32) -> [u8; 32] {
        let mut expected = [0u8; 32];
        pbkdf2::pbkdf2_hmac::<pbkdf2::sha2::Sha256>(password, b"salt", rounds, &mut expected);
        expected
    }

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

    /// Holds `pool`'s only thread with a job that runs until the sender is used or
    /// dropped; returns once the job runs.
    async fn occupy_the_thread(
        pool: &HashPool,
    ) -> (
        tokio::task::JoinHandle<Result<(), PoolError>>,
        std::sync::mpsc::Sender<()>,
    ) {
        let (started_tx, started_rx) = std::sync::mpsc::channel();
        let (release_tx, release_rx) = std::sync::mpsc::channel::<()>();
        let busy = tokio::spawn({
            let pool = pool.clone();
            async move {
                pool.run(None, move || {
                    started_tx.send(()).unwrap();
                    let _ = release_rx.recv();
                })
                .await
            }
        });
        tokio::task::spawn_blocking(move || started_rx.recv().unwrap())
            .await
            .unwrap();
        (busy, release_tx)
    }

    #[tokio::test]
    async fn what_waits_is_hashed_together_and_nothing_waits_for_a_batch() {
        let metrics = Metrics::new();
        let pool = pool(1, 16, &metrics);
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
        assert_eq!(pool.stats().rejected_full, 1);
        assert_eq!(metrics.hash.refused.with_label_values(&["full"]).get(), 1);
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
