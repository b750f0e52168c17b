//! `authd hash-bench`: how many PBKDF2 hashes per second this machine computes, with
//! the server's own hashing engine (`pbkdf2-lanes`, the backend the server would use
//! or the one `--hash-backend` forces).
//!
//! Every login verifies one hash and every registration computes one, at the
//! configured cost, on the server's hash threads; under load a thread hashes a full
//! batch (the engine's lanes) at a time, so `threads × hashes/s per thread` at the
//! engine's batch size is the **hash-bound limit**: no login or registration load can
//! be served faster. `--batch 1` gives the rate of requests that come one at a time
//! (an idle server's latency). The benchmark suite compares authbench's QPS with it.
//!
//! It also reports the effective cost of one SHA-256 compression (each PBKDF2 round
//! is two), and with `--compare` the pbkdf2 crate's rate (one hash at a time, what
//! authd used before the engine) measured in the same run, right after.
//!
//! With `--target`, it measures one hash at a time on one thread (an idle server's
//! login) and recommends the highest iteration count whose hash stays within the
//! target on this machine: the time of a hash grows in proportion to its rounds.
//!
//! Under the argon2id policy (`AUTHD_PASSWORD_HASH=argon2id`) it measures Argon2id
//! instead, at `--argon2-memory`, `--argon2-time`, `--argon2-parallelism`, with the
//! `argon2` crate the server hashes with: hashes/s on the threads, the time of one
//! hash, the memory of one hash and of one per thread (the memory budget every
//! thread hashing at once needs), and how many hashes the configured budget lets
//! run at once.
//!
//! The threads start together behind a barrier and each hashes until the duration
//! has passed; a thread's rate is its hashes over the time to its last completed
//! batch, so a batch cut off by the end of the window does not bias the rate.

use super::{Argon2Params, hash_now};
use crate::credentials::Password;
use anyhow::{Context as _, anyhow};
use pbkdf2_lanes::{Engine, Job};
use serde::Serialize;
use std::{
    fmt::Write as _,
    sync::{Arc, Barrier},
    thread,
    time::{Duration, Instant},
};

/// What to measure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Options {
    pub iterations: u32,
    pub threads: usize,
    /// How long each thread keeps hashing (it always completes at least one batch).
    pub duration: Duration,
    /// Hashes per engine call; `None` means the engine's lanes (a full batch).
    pub batch: Option<usize>,
    /// Also measure the pbkdf2 crate, in the same run.
    pub compare: bool,
    /// Recommend an iteration count whose single hash takes at most this long.
    pub target: Option<Duration>,
    /// Measure Argon2id at these parameters instead of PBKDF2.
    pub argon2: Option<Argon2Params>,
}

impl Options {
    /// With a target: one hash at a time on one thread, the latency of an idle
    /// server's login.
    pub fn with_target(self, target: Option<Duration>) -> Self {
        match target {
            Some(_) => Self {
                threads: 1,
                batch: Some(1),
                target,
                ..self
            },
            None => self,
        }
    }
}

/// The iteration count `--target` recommends.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Recommendation {
    pub target_ms: f64,
    /// The highest count within the target, rounded down (to 10,000 from 10,000 up,
    /// to 1,000 below), at least authd's lowest, 1,000.
    pub iterations: u32,
    /// What one hash of that count takes here, in milliseconds.
    pub hash_ms: f64,
}

/// The highest iteration count whose hash takes at most `target`, when a hash of
/// `iterations` rounds takes `ms_per_hash`.
pub fn recommend(ms_per_hash: f64, iterations: u32, target: Duration) -> Recommendation {
    let target_ms = target.as_secs_f64() * 1000.0;
    let ms_per_round = ms_per_hash / f64::from(iterations.max(1));
    let fits = if ms_per_round > 0.0 {
        (target_ms / ms_per_round).min(f64::from(u32::MAX))
    } else {
        f64::from(u32::MAX)
    } as u32;
    let step = if fits >= 10_000 { 10_000 } else { 1_000 };
    let iterations = (fits / step * step).max(1_000);
    Recommendation {
        target_ms,
        iterations,
        hash_ms: ms_per_round * f64::from(iterations),
    }
}

/// One thread's result.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct ThreadRate {
    pub hashes: u64,
    pub seconds: f64,
    pub hashes_per_second: f64,
}

/// The rates of one way of hashing.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Rates {
    pub per_thread: Vec<ThreadRate>,
    /// The mean of the threads' rates.
    pub hashes_per_second_per_thread: f64,
    /// The sum of the threads' rates.
    pub hashes_per_second: f64,
    /// The time of one batch (one request's hash under load), in milliseconds.
    pub ms_per_hash: f64,
    /// Thread time per SHA-256 compression (two per PBKDF2 round), in nanoseconds.
    pub ns_per_compression: f64,
}

/// What `authd hash-bench` reports.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct HashBenchReport {
    pub algorithm: &'static str,
    pub iterations: u32,
    pub threads: usize,
    /// The engine's backend: `avx512`, `sha-ni`, `avx2` or `portable`.
    pub backend: &'static str,
    /// Hashes the engine computes side by side.
    pub lanes: usize,
    /// Hashes per engine call in this run.
    pub batch: usize,
    /// The kernel for each number of hashes at hand (`1: sha-ni x1, …`), from
    /// the engine's calibration at start.
    pub plan: String,
    /// Each kernel the engine may run, measured in this run.
    pub kernels: Vec<KernelReport>,
    /// The engine's rates: with `batch` equal to `lanes`, the hash-bound limit.
    #[serde(flatten)]
    pub engine: Rates,
    /// The pbkdf2 crate's rates in the same run (`--compare`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pbkdf2_crate: Option<Rates>,
    /// The iteration count for `--target`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub recommendation: Option<Recommendation>,
}

/// One kernel's measured cost.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct KernelReport {
    /// `sha-ni x4`, `avx512 x32`, …
    pub kernel: String,
    /// Hashes it computes side by side.
    pub width: usize,
    /// Nanoseconds per SHA-256 compression per hash, with every lane in use.
    pub ns_per_compression: f64,
}

/// Runs `authd hash-bench` on `engine` (the one the server would use, or the one
/// `--hash-backend` forces) and prints the result on stdout.
pub fn run_command(engine: Engine, options: Options, json: bool) -> anyhow::Result<()> {
    if let Some(params) = options.argon2 {
        if options.compare || options.target.is_some() || options.batch.is_some() {
            anyhow::bail!(
                "--compare, --target and --batch measure PBKDF2: not with --password-hash argon2id"
            );
        }
        let report = measure_argon2(params, options.threads, options.duration)?;
        if json {
            println!(
                "{}",
                serde_json::to_string_pretty(&report).context("encoding the report")?
            );
        } else {
            print!("{}", render_argon2(&report));
        }
        return Ok(());
    }
    let report = measure(engine, options)?;
    if json {
        println!(
            "{}",
            serde_json::to_string_pretty(&report).context("encoding the report")?
        );
    } else {
        print!("{}", render_text(&report));
    }
    Ok(())
}

/// Hashes on `options.threads` threads for `options.duration` on `engine` (and then
/// with the pbkdf2 crate, when asked) and reports the rates.
pub fn measure(engine: Engine, options: Options) -> anyhow::Result<HashBenchReport> {
    let params = pbkdf2::Params::new(options.iterations)
        .map_err(|e| anyhow!("invalid PBKDF2 iteration count {}: {e}", options.iterations))?;
    let threads = options.threads.max(1);
    let batch = options.batch.unwrap_or(engine.lanes()).max(1);
    // Distinct passwords, as a server's batch would have.
    let passwords: Arc<Vec<Vec<u8>>> = Arc::new(
        (0..batch)
            .map(|i| format!("hash-bench password {i}").into_bytes())
            .collect(),
    );
    let salt = b"hash-bench salt!".to_vec();
    // Check once, before starting threads, that hashing works at all.
    engine
        .derive_vec(&[Job::new(&passwords[0], &salt, 1)])
        .map_err(|e| anyhow!("the hashing engine failed: {e}"))?;

    let iterations = options.iterations;
    let per_thread = on_threads(threads, options.duration, move || {
        let jobs: Vec<Job<'_>> = passwords
            .iter()
            .map(|p| Job::new(p, &salt, iterations))
            .collect();
        // The result is discarded; keep it observable so the work stays.
        std::hint::black_box(engine.derive_vec(&jobs).map_err(|e| anyhow!("{e}"))?);
        Ok(jobs.len() as u64)
    })?;
    let engine_rates = rates(per_thread, iterations, batch);
    let kernels = engine
        .measure(pbkdf2_lanes::CALIBRATION_ROUNDS)
        .into_iter()
        .map(|c| KernelReport {
            kernel: c.kernel.to_string(),
            width: c.kernel.width(),
            ns_per_compression: c.ns_per_compression(),
        })
        .collect();

    let pbkdf2_crate = if options.compare {
        let password = Password::parse("hash-bench password").expect("a valid password");
        hash_now(&password, params)?;
        let per_thread = on_threads(threads, options.duration, move || {
            std::hint::black_box(hash_now(&password, params)?);
            Ok(1)
        })?;
        Some(rates(per_thread, iterations, 1))
    } else {
        None
    };
    let recommendation = options
        .target
        .map(|target| recommend(engine_rates.ms_per_hash, iterations, target));
    Ok(HashBenchReport {
        algorithm: "pbkdf2-sha256",
        iterations,
        threads,
        backend: engine.backend().name(),
        lanes: engine.lanes(),
        batch,
        plan: engine.plan().to_string(),
        kernels,
        engine: engine_rates,
        pbkdf2_crate,
        recommendation,
    })
}

/// What `authd hash-bench` reports for Argon2id.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Argon2BenchReport {
    pub algorithm: &'static str,
    pub memory_kib: u32,
    pub time: u32,
    pub parallelism: u32,
    pub threads: usize,
    pub per_thread: Vec<ThreadRate>,
    /// The mean of the threads' rates.
    pub hashes_per_second_per_thread: f64,
    /// The sum of the threads' rates: the hash-bound limit of logins and
    /// registrations with this many hash threads.
    pub hashes_per_second: f64,
    /// The time of one hash, in milliseconds.
    pub ms_per_hash: f64,
    /// The memory one hash holds, in MiB (what it reserves in the memory budget).
    pub mib_per_hash: f64,
    /// The memory of one hash on every thread at once, in MiB: the memory budget
    /// that lets every hashing thread compute Argon2id at once.
    pub mib_for_threads: f64,
}

/// Hashes with Argon2id at `params` on `threads` threads for `duration`.
pub fn measure_argon2(
    params: Argon2Params,
    threads: usize,
    duration: Duration,
) -> anyhow::Result<Argon2BenchReport> {
    let threads = threads.max(1);
    // Check once, before starting threads, that hashing works at all.
    params.hash(b"hash-bench password")?;
    let per_thread = on_threads(threads, duration, move || {
        std::hint::black_box(params.hash(b"hash-bench password")?);
        Ok(1)
    })?;
    let rates = rates(per_thread, 1, 1);
    let mib_per_hash = f64::from(params.memory_kib()) / 1024.0;
    Ok(Argon2BenchReport {
        algorithm: "argon2id",
        memory_kib: params.memory_kib(),
        time: params.time(),
        parallelism: params.parallelism(),
        threads,
        per_thread: rates.per_thread,
        hashes_per_second_per_thread: rates.hashes_per_second_per_thread,
        hashes_per_second: rates.hashes_per_second,
        ms_per_hash: rates.ms_per_hash,
        mib_per_hash,
        mib_for_threads: mib_per_hash * threads as f64,
    })
}

pub fn render_argon2(report: &Argon2BenchReport) -> String {
    let mut out = String::new();
    let plural = if report.threads == 1 { "" } else { "s" };
    let _ = writeln!(
        out,
        "Argon2id at m={} KiB, t={}, p={} on {} thread{plural}",
        report.memory_kib, report.time, report.parallelism, report.threads
    );
    render_threads(&mut out, &report.per_thread);
    let _ = writeln!(
        out,
        "per thread:  {:.2} hashes/s ({:.2} ms per hash)",
        report.hashes_per_second_per_thread, report.ms_per_hash
    );
    let _ = writeln!(
        out,
        "total:       {:.2} hashes/s: the hash-bound limit of logins and registrations \
         with {} hash thread{plural}",
        report.hashes_per_second, report.threads
    );
    let _ = writeln!(
        out,
        "memory:      {:.1} MiB per hash, {:.1} MiB with every thread hashing (an \
         AUTHD_ARGON2_MEMORY_BUDGET of at least {} MiB lets every thread hash at once)",
        report.mib_per_hash,
        report.mib_for_threads,
        report.mib_for_threads.ceil(),
    );
    out
}

/// Runs `work` (which hashes and returns how many hashes it did) in a loop on
/// `threads` threads, started together, each until `duration` has passed.
fn on_threads<W>(threads: usize, duration: Duration, work: W) -> anyhow::Result<Vec<ThreadRate>>
where
    W: Fn() -> anyhow::Result<u64> + Clone + Send + 'static,
{
    let barrier = Arc::new(Barrier::new(threads));
    let workers: Vec<_> = (0..threads)
        .map(|i| {
            let barrier = barrier.clone();
            let work = work.clone();
            thread::Builder::new()
                .name(format!("hash-bench-{i}"))
                .spawn(move || -> anyhow::Result<ThreadRate> {
                    barrier.wait();
                    // Real time: the hash benchmark measures elapsed time.
                    let start = Instant::now();
                    let mut hashes = 0u64;
                    let mut last = start;
                    while hashes == 0 || last.duration_since(start) < duration {
                        hashes += work()?;
                        // Real time: the hash benchmark measures elapsed time.
                        last = Instant::now();
                    }
                    Ok(thread_rate(hashes, last.duration_since(start)))
                })
                .context("starting a hash-bench thread")
        })
        .collect::<anyhow::Result<_>>()?;
    workers
        .into_iter()
        .map(|w| {
            w.join()
                .map_err(|_| anyhow!("a hash-bench thread panicked"))?
        })
        .collect()
}

/// A thread's rate: `hashes` completed over `elapsed` (until the last completion).
pub fn thread_rate(hashes: u64, elapsed: Duration) -> ThreadRate {
    let seconds = elapsed.as_secs_f64();
    ThreadRate {
        hashes,
        seconds,
        hashes_per_second: if seconds > 0.0 {
            hashes as f64 / seconds
        } else {
            0.0
        },
    }
}

/// Totals the threads' rates (the limit is their sum), for hashes of `iterations`
/// rounds done `batch` at a time.
pub fn rates(per_thread: Vec<ThreadRate>, iterations: u32, batch: usize) -> Rates {
    let total: f64 = per_thread.iter().map(|t| t.hashes_per_second).sum();
    let threads = per_thread.len();
    let mean = if threads > 0 {
        total / threads as f64
    } else {
        0.0
    };
    let compressions_per_second = mean * 2.0 * f64::from(iterations);
    Rates {
        per_thread,
        hashes_per_second_per_thread: mean,
        hashes_per_second: total,
        ms_per_hash: if mean > 0.0 {
            1000.0 * batch as f64 / mean
        } else {
            0.0
        },
        ns_per_compression: if compressions_per_second > 0.0 {
            1e9 / compressions_per_second
        } else {
            0.0
        },
    }
}

pub fn render_text(report: &HashBenchReport) -> String {
    let mut out = String::new();
    let plural = |n: usize| if n == 1 { "" } else { "s" };
    let _ = writeln!(
        out,
        "PBKDF2-SHA256 at {} iterations on {} thread{}: engine {} ({} lane{}), {} hash{} per batch",
        report.iterations,
        report.threads,
        plural(report.threads),
        report.backend,
        report.lanes,
        plural(report.lanes),
        report.batch,
        if report.batch == 1 { "" } else { "es" },
    );
    render_rates(&mut out, &report.engine);
    let _ = writeln!(out, "kernels by hashes at hand: {}", report.plan);
    let _ = writeln!(
        out,
        "  (to run this plan: AUTHD_HASH_KERNELS=\"{}\")",
        report.plan
    );
    for k in &report.kernels {
        let _ = writeln!(
            out,
            "  {:<12} {:>2} at once: {:.1} ns per compression per hash",
            k.kernel, k.width, k.ns_per_compression
        );
    }
    let _ = writeln!(
        out,
        "total:       {:.2} hashes/s: the hash-bound limit of logins and registrations \
         with {} hash thread{}",
        report.engine.hashes_per_second,
        report.threads,
        plural(report.threads)
    );
    if let Some(crate_rates) = &report.pbkdf2_crate {
        let _ = writeln!(out, "the pbkdf2 crate, one hash at a time, same run:");
        render_rates(&mut out, crate_rates);
        let ratio =
            report.engine.hashes_per_second / crate_rates.hashes_per_second.max(f64::MIN_POSITIVE);
        let _ = writeln!(out, "engine / crate: {ratio:.2}x");
    }
    if let Some(r) = &report.recommendation {
        let within = if r.hash_ms <= r.target_ms {
            "within"
        } else {
            "over (authd's lowest count)"
        };
        let _ = writeln!(
            out,
            "recommended: --pbkdf2-iterations {}: one idle login's hash takes about {:.1} ms \
             here, {within} the {:.0} ms target",
            r.iterations, r.hash_ms, r.target_ms
        );
    }
    out
}

/// One line per thread: its rate and what it did.
fn render_threads(out: &mut String, per_thread: &[ThreadRate]) {
    for (i, t) in per_thread.iter().enumerate() {
        let _ = writeln!(
            out,
            "  thread {i}: {:>10.2} hashes/s ({} hashes in {:.2} s)",
            t.hashes_per_second, t.hashes, t.seconds
        );
    }
}

fn render_rates(out: &mut String, rates: &Rates) {
    render_threads(out, &rates.per_thread);
    let _ = writeln!(
        out,
        "per thread:  {:.2} hashes/s ({:.2} ms per batch, {:.1} ns per SHA-256 compression)",
        rates.hashes_per_second_per_thread, rates.ms_per_hash, rates.ns_per_compression
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_add_up_across_threads() {
        let rates = rates(
            vec![
                thread_rate(100, Duration::from_secs(2)),
                thread_rate(150, Duration::from_secs(3)),
            ],
            10_000,
            4,
        );
        assert_eq!(rates.per_thread[0].hashes_per_second, 50.0);
        assert_eq!(rates.hashes_per_second, 100.0);
        assert_eq!(rates.hashes_per_second_per_thread, 50.0);
        // A batch of 4 at 50 hashes/s: 80 ms per batch.
        assert_eq!(rates.ms_per_hash, 80.0);
        // 50 hashes/s × 10,000 rounds × 2 compressions: 1 µs each.
        assert_eq!(rates.ns_per_compression, 1000.0);
    }

    #[test]
    fn a_short_measurement_hashes_at_least_once_per_thread() {
        let report = measure(
            Engine::detect(),
            Options {
                iterations: 1000,
                threads: 2,
                duration: Duration::ZERO,
                batch: None,
                compare: true,
                target: None,
                argon2: None,
            },
        )
        .unwrap();
        assert_eq!(report.threads, 2);
        assert_eq!(report.batch, Engine::detect().lanes());
        assert!(report.engine.per_thread.iter().all(|t| t.hashes >= 1));
        assert!(report.engine.hashes_per_second > 0.0);
        assert!(report.pbkdf2_crate.as_ref().unwrap().hashes_per_second > 0.0);
        let json: serde_json::Value = serde_json::to_value(&report).unwrap();
        assert_eq!(json["iterations"], 1000);
        assert_eq!(json["backend"], Engine::detect().backend().name());
        assert!(json["hashes_per_second"].as_f64().unwrap() > 0.0);
        assert!(json["pbkdf2_crate"]["ns_per_compression"].as_f64().unwrap() > 0.0);
        let text = render_text(&report);
        assert!(text.contains("engine / crate"), "{text}");
    }

    #[test]
    fn the_recommendation_is_the_highest_round_count_within_the_target() {
        // 100 ms for 600,000 rounds: 250 ms fits 1,500,000.
        let r = recommend(100.0, 600_000, Duration::from_millis(250));
        assert_eq!(r.iterations, 1_500_000);
        assert!((r.hash_ms - 250.0).abs() < 1e-9);
        // Rounded down, never up: 1,234,567 fits, 1,230,000 is recommended.
        let r = recommend(250.0, 1_234_567, Duration::from_millis(250));
        assert_eq!(r.iterations, 1_230_000);
        assert!(r.hash_ms <= r.target_ms);
        // Below 10,000 by thousands; never below authd's lowest, 1,000.
        assert_eq!(
            recommend(10.0, 1_000, Duration::from_millis(75)).iterations,
            7_000
        );
        let slow = recommend(10.0, 1_000, Duration::from_millis(1));
        assert_eq!(slow.iterations, 1_000);
        assert!(slow.hash_ms > slow.target_ms);
    }

    #[test]
    fn a_target_measures_one_hash_at_a_time_on_one_thread() {
        let options = Options {
            iterations: 1000,
            threads: 4,
            duration: Duration::ZERO,
            batch: None,
            compare: false,
            target: None,
            argon2: None,
        }
        .with_target(Some(Duration::from_millis(250)));
        assert_eq!((options.threads, options.batch), (1, Some(1)));
        let report = measure(Engine::detect(), options).unwrap();
        let r = report.recommendation.unwrap();
        assert!(
            r.iterations >= 1000 && r.iterations.is_multiple_of(1000),
            "{r:?}"
        );
        assert!(r.hash_ms <= 250.0 || r.iterations == 1000, "{r:?}");
        assert!(render_text(&report).contains("--pbkdf2-iterations"));
        let json = serde_json::to_value(&report).unwrap();
        assert_eq!(json["recommendation"]["iterations"], r.iterations);
    }

    #[test]
    fn argon2id_is_measured_at_its_parameters_with_the_memory_it_needs() {
        let params = Argon2Params::new(1024, 1, 1).unwrap();
        let report = measure_argon2(params, 2, Duration::ZERO).unwrap();
        assert_eq!(
            (report.memory_kib, report.time, report.parallelism),
            (1024, 1, 1)
        );
        assert!(report.per_thread.iter().all(|t| t.hashes >= 1));
        assert!(report.hashes_per_second > 0.0 && report.ms_per_hash > 0.0);
        assert_eq!((report.mib_per_hash, report.mib_for_threads), (1.0, 2.0));
        let text = render_argon2(&report);
        assert!(
            text.starts_with("Argon2id at m=1024 KiB, t=1, p=1 on 2 threads"),
            "{text}"
        );
        assert!(
            text.contains("1.0 MiB per hash, 2.0 MiB with every thread"),
            "{text}"
        );
        let json = serde_json::to_value(&report).unwrap();
        assert_eq!(json["algorithm"], "argon2id");
        assert_eq!(json["memory_kib"], 1024);
    }

    #[test]
    fn bad_iteration_counts_are_refused() {
        let err = measure(
            Engine::detect(),
            Options {
                iterations: 10,
                threads: 1,
                duration: Duration::ZERO,
                batch: Some(1),
                compare: false,
                target: None,
                argon2: None,
            },
        )
        .unwrap_err();
        assert!(err.to_string().contains("10"), "{err}");
    }
}
