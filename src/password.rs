//! Password hashing: PBKDF2-SHA256 PHC strings computed on a bounded thread pool.
//!
//! Hashing is the most expensive thing authd does (hundreds of milliseconds at the
//! OWASP cost), so it never runs on the async workers: [`HashPool`] owns a fixed set
//! of OS threads behind a bounded queue. A full queue refuses at once (the caller
//! gets RESOURCE_EXHAUSTED with a retry hint) instead of letting latency grow, and a
//! job whose deadline passed, or whose caller went away, is dropped before it runs.
//!
//! [`Hasher`] holds the current parameters, verifies unknown users against a dummy
//! hash of the same cost (so timing does not reveal which usernames exist), and says
//! when a stored hash was made with other parameters and should be replaced.

use crate::{
    credentials::Password,
    error::Error,
    metrics::{HashMetrics, Metrics},
};
use anyhow::Context as _;
use pbkdf2::{
    Algorithm, Params, Pbkdf2,
    password_hash::{
        PasswordHasher, PasswordVerifier,
        phc::{Output, PasswordHash, Salt},
    },
};
use std::{
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    thread,
    time::{Duration, Instant},
};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, oneshot};

/// Counters of what the pool did, for tests and operators.
#[derive(Debug, Default)]
pub struct PoolStats {
    completed: AtomicU64,
    rejected_full: AtomicU64,
    dropped_expired: AtomicU64,
    dropped_cancelled: AtomicU64,
    running: AtomicU64,
    /// Exponentially weighted mean of a job's run time, in nanoseconds.
    mean_run_nanos: AtomicU64,
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

/// A point-in-time copy of [`PoolStats`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolSnapshot {
    /// Jobs that ran.
    pub completed: u64,
    /// Jobs refused because the queue was full.
    pub rejected_full: u64,
    /// Jobs dropped unrun because their deadline had passed when a thread took them.
    pub dropped_expired: u64,
    /// Jobs dropped unrun because their caller had gone away.
    pub dropped_cancelled: u64,
    /// Jobs running on a thread right now.
    pub running: u64,
}

impl PoolStats {
    pub fn snapshot(&self) -> PoolSnapshot {
        PoolSnapshot {
            completed: self.completed.load(Ordering::Relaxed),
            rejected_full: self.rejected_full.load(Ordering::Relaxed),
            dropped_expired: self.dropped_expired.load(Ordering::Relaxed),
            dropped_cancelled: self.dropped_cancelled.load(Ordering::Relaxed),
            running: self.running.load(Ordering::Relaxed),
        }
    }

    fn record_run(&self, took: Duration) {
        self.completed.fetch_add(1, Ordering::Relaxed);
        let nanos = u64::try_from(took.as_nanos()).unwrap_or(u64::MAX);
        let old = self.mean_run_nanos.load(Ordering::Relaxed);
        // A racy read-modify-write is fine: this is an estimate for retry hints.
        let new = if old == 0 {
            nanos
        } else {
            old - old / 8 + nanos / 8
        };
        self.mean_run_nanos.store(new, Ordering::Relaxed);
    }
}

/// Why a job did not run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum PoolError {
    #[error("the hashing queue is full")]
    Full { retry_after: Duration },
    #[error("the deadline passed while the job was queued")]
    Expired,
    #[error("the hashing pool has shut down")]
    Closed,
}

impl From<PoolError> for Error {
    fn from(err: PoolError) -> Self {
        match err {
            PoolError::Full { retry_after } => Error::Overloaded {
                what: "the password hashing queue is full",
                retry_after,
            },
            PoolError::Expired => Error::DeadlineExceeded,
            PoolError::Closed => Error::Unavailable("the server is shutting down".into()),
        }
    }
}

/// A queued job's body: runs the work, or (with `true`) reports that the deadline passed.
type Task = Box<dyn FnOnce(bool, &PoolStats, &HashMetrics) + Send>;

struct Job {
    deadline: Option<Instant>,
    /// When the job was queued, for the queue wait metric.
    queued_at: Instant,
    /// Counts what it did in the stats before answering, so a caller sees its own
    /// job counted.
    task: Task,
    /// Freed when the job is done (or dropped), making room for another.
    _slot: HashSlot,
}

/// A place in the pool (running or queued), taken before any other work is done
/// for a request, so that a request the pool cannot take is refused cheaply.
pub struct HashSlot {
    _permit: OwnedSemaphorePermit,
}

/// A fixed set of threads behind a bounded queue. Cloning shares the pool; the
/// threads finish the queued jobs and exit when the last clone is dropped.
#[derive(Clone)]
pub struct HashPool {
    queue: crossbeam_channel::Sender<Job>,
    /// `capacity` queued plus `threads` running: the bound of the queue.
    slots: Arc<Semaphore>,
    threads: usize,
    capacity: usize,
    stats: Arc<PoolStats>,
    metrics: HashMetrics,
}

impl HashPool {
    /// Starts `threads` worker threads sharing a queue of at most `capacity` jobs,
    /// recording into `metrics`.
    pub fn new(threads: usize, capacity: usize, metrics: &Metrics) -> std::io::Result<Self> {
        let threads = threads.max(1);
        let metrics = metrics.hash.clone();
        metrics.threads.set(threads as i64);
        metrics.queue_capacity.set(capacity as i64);
        // Unbounded here because the slots bound it.
        let (tx, rx) = crossbeam_channel::unbounded::<Job>();
        let stats = Arc::new(PoolStats::default());
        for i in 0..threads {
            let rx = rx.clone();
            let stats = stats.clone();
            let metrics = metrics.clone();
            thread::Builder::new()
                .name(format!("authd-hash-{i}"))
                .spawn(move || {
                    for job in rx {
                        let now = Instant::now();
                        metrics.queue_depth.dec();
                        metrics
                            .queue_wait
                            .observe((now - job.queued_at).as_secs_f64());
                        let expired = job.deadline.is_some_and(|d| now >= d);
                        (job.task)(expired, &stats, &metrics);
                    }
                })?;
        }
        Ok(Self {
            queue: tx,
            slots: Arc::new(Semaphore::new(capacity + threads)),
            threads,
            capacity,
            stats,
            metrics,
        })
    }

    pub fn stats(&self) -> PoolSnapshot {
        self.stats.snapshot()
    }

    /// Jobs waiting for a thread.
    pub fn queued(&self) -> usize {
        self.queue.len()
    }

    /// Takes a place in the pool, or refuses at once when it is full.
    pub fn reserve(&self) -> Result<HashSlot, PoolError> {
        match self.slots.clone().try_acquire_owned() {
            Ok(permit) => {
                self.stats.pressure.note(false);
                Ok(HashSlot { _permit: permit })
            }
            Err(_) => {
                self.stats.pressure.note(true);
                self.stats.rejected_full.fetch_add(1, Ordering::Relaxed);
                self.metrics.refused.inc();
                Err(PoolError::Full {
                    retry_after: self.retry_hint(),
                })
            }
        }
    }

    /// Reserves a place and runs `work` there: [`HashPool::run_in`].
    pub async fn run<T, F>(&self, deadline: Option<Instant>, work: F) -> Result<T, PoolError>
    where
        T: Send + 'static,
        F: FnOnce() -> T + Send + 'static,
    {
        let slot = self.reserve()?;
        self.run_in(slot, deadline, work).await
    }

    /// Runs `work` on a pool thread, in a place reserved before, and waits for its
    /// result without blocking the async runtime.
    pub async fn run_in<T, F>(
        &self,
        slot: HashSlot,
        deadline: Option<Instant>,
        work: F,
    ) -> Result<T, PoolError>
    where
        T: Send + 'static,
        F: FnOnce() -> T + Send + 'static,
    {
        let (reply, result) = oneshot::channel();
        let task = Box::new(
            move |expired: bool, stats: &PoolStats, metrics: &HashMetrics| {
                // The caller's future was dropped (client cancelled, server deadline): skip.
                if reply.is_closed() {
                    stats.dropped_cancelled.fetch_add(1, Ordering::Relaxed);
                    metrics.dropped_cancelled.inc();
                    return;
                }
                if expired {
                    stats.dropped_expired.fetch_add(1, Ordering::Relaxed);
                    metrics.dropped_deadline.inc();
                    let _ = reply.send(Err(PoolError::Expired));
                    return;
                }
                stats.running.fetch_add(1, Ordering::Relaxed);
                metrics.running.inc();
                let start = Instant::now();
                let value = work();
                let took = start.elapsed();
                stats.record_run(took);
                metrics.duration.observe(took.as_secs_f64());
                metrics.running.dec();
                stats.running.fetch_sub(1, Ordering::Relaxed);
                let _ = reply.send(Ok(value));
            },
        );
        let job = Job {
            deadline,
            queued_at: Instant::now(),
            task,
            _slot: slot,
        };
        self.metrics.queue_depth.inc();
        if self.queue.send(job).is_err() {
            self.metrics.queue_depth.dec();
            return Err(PoolError::Closed);
        }
        result.await.unwrap_or(Err(PoolError::Closed))
    }

    /// Roughly how long until the queue has room again: the time to work through it.
    ///
    /// The time to work through a full queue, stretched by how many requests are
    /// being refused per one admitted: when a crowd is waiting, each of its members
    /// is told to come back later, so that refused clients that honour the hint do
    /// not return all at once and spend the CPU the hashing needs on more refusals.
    fn retry_hint(&self) -> Duration {
        let mean = Duration::from_nanos(self.stats.mean_run_nanos.load(Ordering::Relaxed));
        let backlog = u32::try_from(self.capacity.div_ceil(self.threads)).unwrap_or(u32::MAX);
        let crowd = (1.0 + self.stats.pressure.ratio()).min(20.0);
        (mean * backlog)
            .mul_f64(crowd)
            .clamp(Duration::from_millis(50), Duration::from_secs(30))
    }
}

/// The outcome of checking a password against a stored hash.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Verification {
    pub matches: bool,
    /// The stored hash uses other parameters than the current ones: replace it.
    pub needs_rehash: bool,
}

/// Hashes and verifies passwords with the configured PBKDF2 cost on a [`HashPool`].
pub struct Hasher {
    pool: HashPool,
    params: Params,
    /// A hash of nothing, at the current cost, for users that do not exist.
    dummy: String,
}

impl Hasher {
    pub fn new(iterations: u32, pool: HashPool) -> anyhow::Result<Self> {
        let params = Params::new(iterations)
            .map_err(|e| anyhow::anyhow!("invalid PBKDF2 iteration count {iterations}: {e}"))?;
        Ok(Self {
            dummy: dummy_hash(params)?,
            pool,
            params,
        })
    }

    pub fn iterations(&self) -> u32 {
        self.params.rounds()
    }

    pub fn pool(&self) -> &HashPool {
        &self.pool
    }

    /// Takes a place in the hashing pool for one hash or verification, or refuses
    /// at once (RESOURCE_EXHAUSTED) when the pool is full. Take it before any other
    /// work for the request, so that refusing costs next to nothing.
    pub fn reserve(&self) -> Result<HashSlot, Error> {
        Ok(self.pool.reserve()?)
    }

    /// Hashes a password into a PHC string with a fresh random salt.
    pub async fn hash(
        &self,
        slot: HashSlot,
        password: Password,
        deadline: Option<Instant>,
    ) -> Result<String, Error> {
        let params = self.params;
        self.pool
            .run_in(slot, deadline, move || hash_now(&password, params))
            .await?
            .map_err(Error::Internal)
    }

    /// Verifies a password against a stored PHC string, or against the dummy hash
    /// when there is none, so that both cases cost the same.
    pub async fn verify(
        &self,
        slot: HashSlot,
        password: Password,
        stored: Option<String>,
        deadline: Option<Instant>,
    ) -> Result<Verification, Error> {
        let exists = stored.is_some();
        let phc = stored.unwrap_or_else(|| self.dummy.clone());
        let params = self.params;
        let outcome = self
            .pool
            .run_in(slot, deadline, move || verify_now(&password, &phc, params))
            .await??;
        Ok(Verification {
            matches: exists && outcome.matches,
            needs_rehash: exists && outcome.matches && outcome.needs_rehash,
        })
    }
}

/// Hashes on the calling thread: for the pool's workers and for `hash-bench`.
pub fn hash_now(password: &Password, params: Params) -> anyhow::Result<String> {
    let hash = Pbkdf2::new(Algorithm::Pbkdf2Sha256, params)
        .hash_password(password.as_bytes())
        .map_err(|e| anyhow::anyhow!("hashing a password failed: {e}"))?;
    Ok(hash.to_string())
}

fn verify_now(password: &Password, phc: &str, current: Params) -> Result<Verification, Error> {
    let hash: PasswordHash = phc
        .parse()
        .map_err(|e| anyhow::anyhow!("a stored password hash does not parse: {e}"))?;
    let stored_params = Params::try_from(&hash)
        .map_err(|e| anyhow::anyhow!("a stored password hash has invalid parameters: {e}"))?;
    let same_algorithm = hash.algorithm.as_str() == Algorithm::PBKDF2_SHA256_ID;
    let matches = match Pbkdf2::SHA256.verify_password(password.as_bytes(), &hash) {
        Ok(()) => true,
        Err(pbkdf2::password_hash::Error::PasswordInvalid) => false,
        Err(e) => {
            return Err(Error::Internal(anyhow::anyhow!(
                "verifying against a stored password hash failed: {e}"
            )));
        }
    };
    Ok(Verification {
        matches,
        needs_rehash: !same_algorithm || stored_params != current,
    })
}

/// A well-formed hash at the current cost that no password matches: random salt and
/// random output. Verifying against it costs exactly what a real verification costs.
fn dummy_hash(params: Params) -> anyhow::Result<String> {
    let mut salt = [0u8; 16];
    let mut output = vec![0u8; params.output_len()];
    rand::fill(&mut salt);
    rand::fill(output.as_mut_slice());
    let hash = PasswordHash {
        algorithm: Algorithm::Pbkdf2Sha256.into(),
        version: None,
        params: params
            .try_into()
            .map_err(|e| anyhow::anyhow!("encoding PBKDF2 parameters: {e}"))?,
        salt: Some(Salt::new(&salt).map_err(|e| anyhow::anyhow!("dummy salt: {e}"))?),
        hash: Some(Output::new(&output).map_err(|e| anyhow::anyhow!("dummy output: {e}"))?),
    };
    let phc = hash.to_string();
    // Make sure the verifier accepts it as a hash of the current cost.
    let parsed: PasswordHash = phc
        .parse()
        .map_err(|e| anyhow::anyhow!("dummy hash: {e}"))?;
    Params::try_from(&parsed)
        .map_err(|e| anyhow::anyhow!("dummy hash parameters: {e}"))
        .context("building the dummy hash")?;
    Ok(phc)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pw(s: &str) -> Password {
        Password::parse(s).unwrap()
    }

    #[tokio::test]
    async fn hashes_are_phc_strings_that_verify() {
        let hasher = Hasher::new(1000, HashPool::new(1, 4, &Metrics::new()).unwrap()).unwrap();
        let phc = hasher
            .hash(hasher.reserve().unwrap(), pw("correct horse"), None)
            .await
            .unwrap();
        assert!(phc.starts_with("$pbkdf2-sha256$i=1000,l=32$"), "{phc}");
        let ok = hasher
            .verify(
                hasher.reserve().unwrap(),
                pw("correct horse"),
                Some(phc.clone()),
                None,
            )
            .await
            .unwrap();
        assert_eq!(
            ok,
            Verification {
                matches: true,
                needs_rehash: false
            }
        );
        let bad = hasher
            .verify(
                hasher.reserve().unwrap(),
                pw("wrong horse"),
                Some(phc),
                None,
            )
            .await
            .unwrap();
        assert!(!bad.matches);
    }

    #[tokio::test]
    async fn unknown_users_never_match() {
        let hasher = Hasher::new(1000, HashPool::new(1, 4, &Metrics::new()).unwrap()).unwrap();
        assert!(hasher.dummy.starts_with("$pbkdf2-sha256$i=1000,l=32$"));
        let v = hasher
            .verify(hasher.reserve().unwrap(), pw("anything at all"), None, None)
            .await
            .unwrap();
        assert_eq!(
            v,
            Verification {
                matches: false,
                needs_rehash: false
            }
        );
    }

    #[tokio::test]
    async fn other_parameters_ask_for_a_rehash() {
        let old = Hasher::new(1000, HashPool::new(1, 4, &Metrics::new()).unwrap()).unwrap();
        let new = Hasher::new(2000, HashPool::new(1, 4, &Metrics::new()).unwrap()).unwrap();
        let phc = old
            .hash(old.reserve().unwrap(), pw("correct horse"), None)
            .await
            .unwrap();
        let v = new
            .verify(new.reserve().unwrap(), pw("correct horse"), Some(phc), None)
            .await
            .unwrap();
        assert_eq!(
            v,
            Verification {
                matches: true,
                needs_rehash: true
            }
        );
    }

    #[tokio::test]
    async fn expired_jobs_are_dropped_before_running() {
        let metrics = Metrics::new();
        let pool = HashPool::new(1, 4, &metrics).unwrap();
        let past = Instant::now() - Duration::from_millis(1);
        let err = pool.run(Some(past), || 42).await.unwrap_err();
        assert_eq!(err, PoolError::Expired);
        assert_eq!(pool.stats().dropped_expired, 1);
        assert_eq!(pool.stats().completed, 0);
        assert_eq!(metrics.hash.dropped_deadline.get(), 1);
        assert_eq!(metrics.hash.duration.get_sample_count(), 0);
        assert_eq!(pool.run(None, || 42).await.unwrap(), 42);
        assert_eq!(metrics.hash.duration.get_sample_count(), 1);
        // Both jobs waited in the queue, the dropped one too.
        assert_eq!(metrics.hash.queue_wait.get_sample_count(), 2);
        assert_eq!(metrics.hash.queue_depth.get(), 0);
    }

    #[tokio::test]
    async fn a_full_queue_refuses_at_once() {
        let metrics = Metrics::new();
        let pool = HashPool::new(1, 1, &metrics).unwrap();
        let (started_tx, started_rx) = std::sync::mpsc::channel();
        let (release_tx, release_rx) = std::sync::mpsc::channel::<()>();
        let busy = tokio::spawn({
            let pool = pool.clone();
            async move {
                pool.run(None, move || {
                    started_tx.send(()).unwrap();
                    release_rx.recv().unwrap();
                })
                .await
            }
        });
        tokio::task::spawn_blocking(move || started_rx.recv().unwrap())
            .await
            .unwrap();
        // The thread is busy; one job fits in the queue, the next is refused.
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
        assert_eq!(metrics.hash.refused.get(), 1);
        assert_eq!(metrics.hash.queue_depth.get(), 0);
    }
}
