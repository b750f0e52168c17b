//! Throughput of every backend against the `pbkdf2` crate, single-threaded.
//!
//! A plain `harness = false` program (`Instant` and `black_box`) rather than
//! criterion: the figures wanted are derived ones (hashes/s, ns per SHA-256
//! compression, ratios to the crate *in the same run*), one measurement at
//! 600,000 rounds takes tens to hundreds of milliseconds so only a handful of
//! samples are affordable, and criterion would add a large dependency tree to
//! the workspace for none of that.
//!
//! Time is the thread's CPU time (`CLOCK_THREAD_CPUTIME_ID`; wall time on
//! other systems): the machine is shared, and time spent descheduled is not
//! the engine's. `openssl speed` likewise divides by CPU time by default.
//!
//! Every configuration is measured once per repetition, configurations
//! interleaved, so that load on the shared machine hits them alike; the
//! medians over the repetitions are reported. Each configuration's keys are
//! checked against the `pbkdf2` crate's before timing starts.
//!
//! `cargo bench --bench throughput -- [--reps N] [--rounds 10000,600000] [--min-ms MS] [--only SUBSTRING]... [--batches 1,8,9,16]`
//! (`--only` keeps the subjects whose label contains one of the substrings;
//! the crate's row is always kept, as the reference; `--batches` measures,
//! instead of the usual subjects, SHA-NI, both AVX-512 widths and the
//! detected engine at each of those batch sizes: the crossovers between them).

use std::hint::black_box;
use std::time::Duration;
#[cfg(not(target_os = "linux"))]
use std::time::Instant;

use pbkdf2_lanes::{Backend, Engine, Job};

struct Args {
    reps: usize,
    rounds: Vec<u32>,
    min: Duration,
    only: Vec<String>,
    batches: Vec<usize>,
}

fn args() -> Args {
    let mut a = Args {
        reps: 7,
        rounds: vec![10_000, 600_000],
        min: Duration::from_millis(60),
        only: Vec::new(),
        batches: Vec::new(),
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        match arg.as_str() {
            "--reps" => a.reps = it.next().and_then(|v| v.parse().ok()).expect("--reps N"),
            "--rounds" => {
                a.rounds = it
                    .next()
                    .map(|v| {
                        v.split(',')
                            .map(|r| r.parse().expect("--rounds a,b"))
                            .collect()
                    })
                    .expect("--rounds a,b")
            }
            "--min-ms" => {
                a.min = Duration::from_millis(
                    it.next().and_then(|v| v.parse().ok()).expect("--min-ms MS"),
                )
            }
            "--only" => a.only.push(it.next().expect("--only SUBSTRING")),
            "--batches" => {
                a.batches = it
                    .next()
                    .map(|v| {
                        v.split(',')
                            .map(|n| n.parse().expect("--batches 1,8,16"))
                            .collect()
                    })
                    .expect("--batches 1,8,16")
            }
            _ => {} // `--bench` passed by cargo
        }
    }
    a
}

/// Something to time: an engine and a batch size (a forced one, or the one
/// `Engine::detect` makes), or the `pbkdf2` crate.
#[derive(Clone, Copy)]
enum Subject {
    Lanes { engine: Engine, batch: usize },
    Detected { batch: usize },
    Crate,
}

impl Subject {
    fn label(&self) -> String {
        match self {
            Subject::Lanes { engine, batch } => match engine.backend() {
                Backend::ShaNi => format!("sha-ni x{} batch {batch}", engine.lanes()),
                Backend::Avx512 => format!("avx512 x{} batch {batch}", engine.lanes()),
                b => format!("{} batch {batch}", b.name()),
            },
            Subject::Detected { batch } => format!("detected batch {batch}"),
            Subject::Crate => "pbkdf2 crate batch 1".to_string(),
        }
    }

    fn jobs(&self) -> usize {
        match self {
            Subject::Lanes { batch, .. } | Subject::Detected { batch } => *batch,
            Subject::Crate => 1,
        }
    }
}

fn inputs(n: usize) -> Vec<(Vec<u8>, Vec<u8>)> {
    (0..n)
        .map(|i| {
            (
                format!("correct horse {i}").into_bytes(),
                format!("salt-{i:012}").into_bytes(),
            )
        })
        .collect()
}

fn compute(s: Subject, inputs: &[(Vec<u8>, Vec<u8>)], rounds: u32) -> Vec<[u8; 32]> {
    match s {
        Subject::Detected { batch } => compute(
            Subject::Lanes {
                engine: Engine::detect(),
                batch,
            },
            inputs,
            rounds,
        ),
        Subject::Lanes { engine, .. } => {
            let jobs: Vec<Job> = inputs
                .iter()
                .map(|(p, s)| Job::new(black_box(p), black_box(s), rounds))
                .collect();
            engine.derive_vec(&jobs).expect("valid jobs")
        }
        Subject::Crate => inputs
            .iter()
            .map(|(p, s)| {
                let mut out = [0u8; 32];
                pbkdf2::pbkdf2_hmac::<sha2::Sha256>(black_box(p), black_box(s), rounds, &mut out);
                out
            })
            .collect(),
    }
}

/// Seconds of this thread's CPU time since an arbitrary origin.
#[cfg(target_os = "linux")]
fn cpu_seconds() -> f64 {
    #[repr(C)]
    struct Timespec {
        tv_sec: i64,
        tv_nsec: i64,
    }
    unsafe extern "C" {
        fn clock_gettime(clock: i32, ts: *mut Timespec) -> i32;
    }
    const CLOCK_THREAD_CPUTIME_ID: i32 = 3;
    let mut ts = Timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `clock_gettime` (from the C library std links on Linux) writes
    // one `struct timespec` (two 64-bit fields on x86-64 and aarch64 Linux)
    // through the valid pointer it is given, and nothing else.
    let rc = unsafe { clock_gettime(CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    assert_eq!(rc, 0, "clock_gettime(CLOCK_THREAD_CPUTIME_ID)");
    ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9
}

#[cfg(not(target_os = "linux"))]
fn cpu_seconds() -> f64 {
    use std::sync::OnceLock;
    static START: OnceLock<Instant> = OnceLock::new();
    START.get_or_init(Instant::now).elapsed().as_secs_f64()
}

/// The core clock in GHz, from a chain of dependent 1-cycle `add`s timed in
/// CPU time (hardware counters are often unavailable in virtual machines);
/// used to express the results in cycles. Median of five. Each `add` takes its
/// operand from a register: some Intel cores fold an immediate into the next
/// `add` when renaming, and ran a chain of `add x, 1` several per cycle.
#[cfg(target_arch = "x86_64")]
fn clock_ghz() -> Option<f64> {
    let mut v: Vec<f64> = (0..5)
        .map(|_| {
            let n: u64 = 50_000_000;
            let t = cpu_seconds();
            let mut x: u64 = 0;
            // SAFETY: the loop only reads and writes the three registers given
            // to it; it touches no memory and leaves the flags clobbered,
            // which `asm!` assumes by default.
            unsafe {
                std::arch::asm!(
                    "2:",
                    "add {x}, {y}", "add {x}, {y}", "add {x}, {y}", "add {x}, {y}", "add {x}, {y}",
                    "add {x}, {y}", "add {x}, {y}", "add {x}, {y}", "add {x}, {y}", "add {x}, {y}",
                    "dec {n}",
                    "jnz 2b",
                    x = inout(reg) x,
                    y = in(reg) black_box(1u64),
                    n = inout(reg) n => _,
                    options(nomem, nostack),
                );
            }
            black_box(x);
            (n as f64 * 10.0) / (cpu_seconds() - t) / 1e9
        })
        .collect();
    Some(median(&mut v))
}

#[cfg(not(target_arch = "x86_64"))]
fn clock_ghz() -> Option<f64> {
    None
}

/// CPU seconds per batch: `iters` batches timed together.
fn time(s: Subject, inputs: &[(Vec<u8>, Vec<u8>)], rounds: u32, iters: u32) -> f64 {
    let t = cpu_seconds();
    for _ in 0..iters {
        black_box(compute(s, inputs, black_box(rounds)));
    }
    (cpu_seconds() - t) / f64::from(iters)
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// The usual subjects: every backend and width at full and small batches.
fn subjects() -> Vec<Subject> {
    let mut subjects = Vec::new();
    for lanes in [32, 16] {
        if let Some(engine) = Engine::with_avx512_lanes(lanes) {
            subjects.push(Subject::Lanes {
                engine,
                batch: lanes,
            });
        }
    }
    if let Some(engine) = Engine::with_avx512_lanes(16) {
        subjects.push(Subject::Lanes { engine, batch: 1 });
    }
    if Backend::Avx512.is_supported() {
        for batch in [1, 32] {
            subjects.push(Subject::Detected { batch });
        }
    }
    for streams in 1..=4 {
        if let Some(engine) = Engine::with_sha_ni_streams(streams) {
            subjects.push(Subject::Lanes {
                engine,
                batch: streams,
            });
        }
    }
    if let Some(engine) = Engine::with_backend(Backend::ShaNi) {
        subjects.push(Subject::Lanes { engine, batch: 1 });
        subjects.push(Subject::Lanes { engine, batch: 16 });
    }
    if let Some(engine) = Engine::with_backend(Backend::Avx2) {
        subjects.push(Subject::Lanes { engine, batch: 8 });
        subjects.push(Subject::Lanes { engine, batch: 1 });
        subjects.push(Subject::Lanes { engine, batch: 16 });
    }
    let portable = Engine::with_backend(Backend::Portable).expect("portable always runs");
    subjects.push(Subject::Lanes {
        engine: portable,
        batch: 1,
    });
    subjects
}

/// SHA-NI, both AVX-512 widths and the detected engine at each batch size.
fn sweep(batches: &[usize]) -> Vec<Subject> {
    let mut subjects = Vec::new();
    for &batch in batches {
        let engines = [
            Engine::with_backend(Backend::ShaNi),
            Engine::with_avx512_lanes(16),
            Engine::with_avx512_lanes(32),
        ];
        for engine in engines.into_iter().flatten() {
            subjects.push(Subject::Lanes { engine, batch });
        }
        subjects.push(Subject::Detected { batch });
    }
    subjects
}

fn main() {
    let a = args();
    let mut subjects = if a.batches.is_empty() {
        subjects()
    } else {
        sweep(&a.batches)
    };
    if !a.only.is_empty() {
        subjects.retain(|s| a.only.iter().any(|o| s.label().contains(o.as_str())));
    }
    subjects.push(Subject::Crate);
    let crate_index = subjects.len() - 1;

    println!(
        "detected: {:?}; {} repetitions, medians",
        Engine::detect(),
        a.reps
    );
    let ghz = clock_ghz();
    if let Some(g) = ghz {
        println!("core clock about {g:.2} GHz (dependent-add chain)");
    }
    for &rounds in &a.rounds {
        // Check every subject against the crate, and size each measurement.
        let mut plan = Vec::new();
        for &s in &subjects {
            let inp = inputs(s.jobs());
            let want = compute(Subject::Crate, &inp, rounds);
            let t = cpu_seconds();
            let got = compute(s, &inp, rounds);
            assert_eq!(
                got,
                want,
                "{} differs from the pbkdf2 crate at {rounds} rounds",
                s.label()
            );
            let once = cpu_seconds() - t;
            let iters = (a.min.as_secs_f64() / once).ceil().max(1.0) as u32;
            plan.push((s, inp, iters, Vec::with_capacity(a.reps)));
        }
        for _ in 0..a.reps {
            for (s, inp, iters, samples) in plan.iter_mut() {
                samples.push(time(*s, inp, rounds, *iters));
            }
        }
        let medians: Vec<f64> = plan.iter_mut().map(|p| median(&mut p.3)).collect();
        let crate_rate = 1.0 / medians[crate_index];
        println!();
        println!("rounds = {rounds} (keys checked against the pbkdf2 crate)");
        println!(
            "{:<24} {:>12} {:>12} {:>10} {:>9} {:>9} {:>8}",
            "subject", "ms/batch", "hashes/s", "ns/compr", "cyc/compr", "vs crate", "min/max"
        );
        for ((s, _, _, samples), med) in plan.iter().zip(&medians) {
            let jobs = s.jobs() as f64;
            let rate = jobs / med;
            let ns = med * 1e9 / (2.0 * f64::from(rounds) * jobs);
            let spread = samples.last().unwrap() / samples.first().unwrap();
            let cycles = ghz.map_or("-".to_string(), |g| format!("{:.0}", ns * g));
            println!(
                "{:<24} {:>12.3} {:>12.2} {:>10.2} {:>9} {:>8.2}x {:>8.2}",
                s.label(),
                med * 1e3,
                rate,
                ns,
                cycles,
                rate / crate_rate,
                spread
            );
        }
    }
}
