//! `authd hash-bench`: how many PBKDF2 hashes per second this machine computes, with
//! the server's own hashing code ([`crate::password::hash_now`]).
//!
//! Every login verifies one hash and every registration computes one, at the
//! configured cost, on the server's hash threads; so `threads × hashes/s per thread`
//! is the **hash-bound limit**: no login or registration load can be served faster.
//! The benchmark suite compares authbench's QPS with it.
//!
//! The threads start together behind a barrier and each hashes until the duration
//! has passed; a thread's rate is its hashes over the time to its last completed one,
//! so a hash cut off by the end of the window does not bias the rate.

use crate::{config::Config, credentials::Password, password::hash_now};
use anyhow::{Context as _, anyhow};
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
    /// How long each thread keeps hashing (it always completes at least one hash).
    pub duration: Duration,
}

/// One thread's result.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct ThreadRate {
    pub hashes: u64,
    pub seconds: f64,
    pub hashes_per_second: f64,
}

/// What `authd hash-bench` reports.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct HashBenchReport {
    pub algorithm: &'static str,
    pub iterations: u32,
    pub threads: usize,
    pub per_thread: Vec<ThreadRate>,
    /// The mean of the threads' rates.
    pub hashes_per_second_per_thread: f64,
    /// The sum of the threads' rates: the hash-bound limit in requests per second.
    pub hashes_per_second: f64,
    /// The mean time of one hash, in milliseconds.
    pub ms_per_hash: f64,
}

/// Runs `authd hash-bench` with the options given on its command line, falling back
/// to the server's configuration (`--pbkdf2-iterations`, `--hash-threads`), and
/// prints the result on stdout.
pub fn run_command(
    config: &Config,
    iterations: Option<u32>,
    threads: Option<u32>,
    duration: Duration,
    json: bool,
) -> anyhow::Result<()> {
    let options = Options {
        iterations: iterations.unwrap_or(config.pbkdf2_iterations),
        threads: threads.map_or_else(|| config.hash_threads(), |t| t as usize),
        duration,
    };
    let report = measure(options)?;
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

/// Hashes on `options.threads` threads for `options.duration` and reports the rates.
pub fn measure(options: Options) -> anyhow::Result<HashBenchReport> {
    let params = pbkdf2::Params::new(options.iterations)
        .map_err(|e| anyhow!("invalid PBKDF2 iteration count {}: {e}", options.iterations))?;
    let threads = options.threads.max(1);
    let password = Password::parse("hash-bench password").expect("a valid password");
    // Check once, before starting threads, that hashing works at all.
    hash_now(&password, params)?;

    let barrier = Arc::new(Barrier::new(threads));
    let workers: Vec<_> = (0..threads)
        .map(|i| {
            let barrier = barrier.clone();
            let password = password.clone();
            thread::Builder::new()
                .name(format!("hash-bench-{i}"))
                .spawn(move || -> anyhow::Result<ThreadRate> {
                    barrier.wait();
                    let start = Instant::now();
                    let mut hashes = 0u64;
                    let mut last = start;
                    while hashes == 0 || last.duration_since(start) < options.duration {
                        // The result is discarded; keep it observable so the work stays.
                        std::hint::black_box(hash_now(&password, params)?);
                        hashes += 1;
                        last = Instant::now();
                    }
                    Ok(thread_rate(hashes, last.duration_since(start)))
                })
                .context("starting a hash-bench thread")
        })
        .collect::<anyhow::Result<_>>()?;
    let per_thread = workers
        .into_iter()
        .map(|w| {
            w.join()
                .map_err(|_| anyhow!("a hash-bench thread panicked"))?
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    Ok(summarize(options.iterations, per_thread))
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

/// Totals the threads' rates: the limit is their sum.
pub fn summarize(iterations: u32, per_thread: Vec<ThreadRate>) -> HashBenchReport {
    let total: f64 = per_thread.iter().map(|t| t.hashes_per_second).sum();
    let threads = per_thread.len();
    let mean = if threads > 0 {
        total / threads as f64
    } else {
        0.0
    };
    HashBenchReport {
        algorithm: "pbkdf2-sha256",
        iterations,
        threads,
        per_thread,
        hashes_per_second_per_thread: mean,
        hashes_per_second: total,
        ms_per_hash: if mean > 0.0 { 1000.0 / mean } else { 0.0 },
    }
}

pub fn render_text(report: &HashBenchReport) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "PBKDF2-SHA256 at {} iterations on {} thread{}",
        report.iterations,
        report.threads,
        if report.threads == 1 { "" } else { "s" }
    );
    for (i, t) in report.per_thread.iter().enumerate() {
        let _ = writeln!(
            out,
            "  thread {i}: {:>10.2} hashes/s ({} hashes in {:.2} s)",
            t.hashes_per_second, t.hashes, t.seconds
        );
    }
    let _ = writeln!(
        out,
        "per thread:  {:.2} hashes/s ({:.2} ms per hash)",
        report.hashes_per_second_per_thread, report.ms_per_hash
    );
    let _ = writeln!(
        out,
        "total:       {:.2} hashes/s: the hash-bound limit of logins and registrations \
         with {} hash thread{}",
        report.hashes_per_second,
        report.threads,
        if report.threads == 1 { "" } else { "s" }
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_add_up_across_threads() {
        let report = summarize(
            10_000,
            vec![
                thread_rate(100, Duration::from_secs(2)),
                thread_rate(150, Duration::from_secs(3)),
            ],
        );
        assert_eq!(report.per_thread[0].hashes_per_second, 50.0);
        assert_eq!(report.hashes_per_second, 100.0);
        assert_eq!(report.hashes_per_second_per_thread, 50.0);
        assert_eq!(report.ms_per_hash, 20.0);
        let text = render_text(&report);
        assert!(text.contains("100.00 hashes/s"), "{text}");
    }

    #[test]
    fn a_short_measurement_hashes_at_least_once_per_thread() {
        let report = measure(Options {
            iterations: 1000,
            threads: 2,
            duration: Duration::ZERO,
        })
        .unwrap();
        assert_eq!(report.threads, 2);
        assert!(report.per_thread.iter().all(|t| t.hashes >= 1));
        assert!(report.hashes_per_second > 0.0);
        let json: serde_json::Value = serde_json::to_value(&report).unwrap();
        assert_eq!(json["iterations"], 1000);
    }

    #[test]
    fn bad_iteration_counts_are_refused() {
        let err = measure(Options {
            iterations: 10,
            threads: 1,
            duration: Duration::ZERO,
        })
        .unwrap_err();
        assert!(err.to_string().contains("10"), "{err}");
    }
}
