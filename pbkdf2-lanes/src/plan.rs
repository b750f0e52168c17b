//! Kernels, and which one runs for how many resident jobs.
//!
//! A [`Kernel`] is one compiled loop: SHA-NI with 1 to 8 interleaved streams,
//! AVX2's eight lanes, one or two AVX-512 vectors, or the portable path. A
//! [`Plan`] says, for every number of resident jobs from 1 to [`MAX_JOBS`],
//! which kernel runs (and so how many of those jobs run in one call: the
//! kernel's width, or fewer). [`Plan::from_costs`] chooses, for each number of
//! jobs, the kernel with the lowest cost per job-round from measured
//! [`KernelCost`]s; [`measure`] measures them on this CPU.

use crate::Backend;
use crate::prep::Chain;
use core::fmt;
use std::time::Instant;

use crate::portable;
#[cfg(target_arch = "x86_64")]
use crate::{avx2, avx512, shani};

/// The most jobs any kernel runs in one call (two AVX-512 vectors), and so the
/// most a [`Plan`] covers.
pub const MAX_JOBS: usize = 32;

/// How much cheaper per job a kernel must be, in [`Plan::from_costs`], to be
/// chosen over one that runs more of the jobs at hand: 5 %.
pub const NEAR_TIE: f64 = 0.05;

/// Jobs per AVX-512 vector.
const AVX512_VECTOR: usize = 16;

/// The most SHA-NI streams a kernel interleaves.
pub const MAX_SHA_NI_STREAMS: usize = 8;

/// One compiled round loop.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Kernel {
    /// `sha2`'s compression function, one job.
    Portable,
    /// SHA-NI, `streams` (1 to 8) jobs interleaved.
    ShaNi {
        /// Jobs interleaved.
        streams: u8,
    },
    /// AVX2, eight lanes (one vector).
    Avx2,
    /// AVX-512, sixteen lanes per vector, `vectors` (1 or 2) interleaved.
    Avx512 {
        /// Vectors interleaved.
        vectors: u8,
    },
}

impl Kernel {
    /// The jobs one call runs at most.
    pub fn width(self) -> usize {
        match self {
            Kernel::Portable => 1,
            Kernel::ShaNi { streams } => usize::from(streams),
            Kernel::Avx2 => 8,
            Kernel::Avx512 { vectors } => AVX512_VECTOR * usize::from(vectors),
        }
    }

    /// The backend (kernel family) it belongs to.
    pub fn backend(self) -> Backend {
        match self {
            Kernel::Portable => Backend::Portable,
            Kernel::ShaNi { .. } => Backend::ShaNi,
            Kernel::Avx2 => Backend::Avx2,
            Kernel::Avx512 { .. } => Backend::Avx512,
        }
    }

    /// Whether a call costs the same whatever number of its lanes are in use
    /// (a vector), rather than being built for exactly that many jobs.
    fn is_vector(self) -> bool {
        matches!(self, Kernel::Avx2 | Kernel::Avx512 { .. })
    }

    /// Runs `iters` rounds on the first [`width`](Kernel::width) chains.
    ///
    /// # Safety
    /// The CPU must support the kernel's backend ([`Backend::is_supported`]).
    pub(crate) unsafe fn run(self, chains: &mut [Chain], iters: u32) {
        let n = chains.len().min(self.width());
        let chains = &mut chains[..n];
        match self {
            // SAFETY (all three): the caller guarantees the backend is supported,
            // which is what each kernel module's `available()` checks.
            #[cfg(target_arch = "x86_64")]
            Kernel::ShaNi { .. } => unsafe { shani::run_chains(chains, iters) },
            #[cfg(target_arch = "x86_64")]
            Kernel::Avx2 => unsafe { avx2::run_chains(chains, iters) },
            #[cfg(target_arch = "x86_64")]
            Kernel::Avx512 { vectors } => unsafe {
                avx512::run_chains(chains, iters, usize::from(vectors))
            },
            _ => {
                for c in chains {
                    portable::run_chain(c, iters);
                }
            }
        }
    }
}

impl fmt::Display for Kernel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Kernel::Portable => f.write_str("portable"),
            k => write!(f, "{} x{}", k.backend(), k.width()),
        }
    }
}

impl core::str::FromStr for Kernel {
    type Err = ParsePlanError;

    /// The [`Display`](fmt::Display) form: `portable`, `sha-ni x1` to `sha-ni x8`,
    /// `avx2 x8`, `avx512 x16` or `avx512 x32`.
    fn from_str(s: &str) -> Result<Kernel, ParsePlanError> {
        let s = s.trim();
        let bad = || ParsePlanError(format!("unknown kernel {s:?}"));
        if s == "portable" {
            return Ok(Kernel::Portable);
        }
        let (family, width) = s.split_once(" x").ok_or_else(bad)?;
        let width: usize = width.trim().parse().map_err(|_| bad())?;
        let kernel = match (family.trim(), width) {
            ("sha-ni", 1..=MAX_SHA_NI_STREAMS) => Kernel::ShaNi {
                streams: width as u8,
            },
            ("avx2", 8) => Kernel::Avx2,
            ("avx512", 16) => Kernel::Avx512 { vectors: 1 },
            ("avx512", 32) => Kernel::Avx512 { vectors: 2 },
            _ => return Err(bad()),
        };
        Ok(kernel)
    }
}

/// Why a kernel or plan did not parse.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ParsePlanError(String);

impl fmt::Display for ParsePlanError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ParsePlanError {}

/// What one call of a kernel costs, measured: nanoseconds for one PBKDF2 round
/// (two compressions) of every lane it runs.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct KernelCost {
    /// The kernel.
    pub kernel: Kernel,
    /// Nanoseconds per round of one call, whatever number of its lanes hold jobs.
    pub ns_per_round: f64,
}

impl KernelCost {
    /// Nanoseconds per compression per job with every lane in use.
    pub fn ns_per_compression(&self) -> f64 {
        self.ns_per_round / 2.0 / self.kernel.width() as f64
    }
}

/// The kernel for each number of resident jobs, 1 to [`MAX_JOBS`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Plan {
    kernels: [Kernel; MAX_JOBS],
}

impl Plan {
    /// A plan from a rule.
    pub(crate) fn from_fn(rule: impl Fn(usize) -> Kernel) -> Plan {
        Plan {
            kernels: core::array::from_fn(|i| rule(i + 1)),
        }
    }

    /// For each number of jobs, the kernel with the lowest cost per job-round
    /// among `costs`: a vector kernel costs the same for any number of jobs up to
    /// its width, a SHA-NI or portable kernel is only considered for at least as
    /// many jobs as its width (fewer run on a narrower one). On a near tie (costs
    /// within [`NEAR_TIE`], 5 %, of each other: what a measurement's noise can
    /// swap) the kernel that runs more of the jobs at hand wins, so none of them
    /// waits for a lane when waiting buys nothing; between kernels that run as
    /// many, the one listed first. `None` when no kernel of `costs` can run one
    /// job (a plan must cover every number of jobs).
    pub fn from_costs(costs: &[KernelCost]) -> Option<Plan> {
        let best = |jobs: usize| {
            let mut fit: Vec<(Kernel, usize, f64)> = costs
                .iter()
                .filter(|c| c.kernel.is_vector() || c.kernel.width() <= jobs)
                .filter(|c| c.ns_per_round.is_finite() && c.ns_per_round > 0.0)
                .map(|c| {
                    let running = jobs.min(c.kernel.width());
                    (c.kernel, running, c.ns_per_round / running as f64)
                })
                .collect();
            // Most jobs running first (a stable sort keeps the listed order).
            fit.sort_by_key(|&(_, running, _)| core::cmp::Reverse(running));
            fit.into_iter()
                .fold(
                    None,
                    |best: Option<(Kernel, f64)>, (k, _, cost)| match best {
                        Some((_, b)) if cost >= b * (1.0 - NEAR_TIE) => best,
                        _ => Some((k, cost)),
                    },
                )
                .map(|(k, _)| k)
        };
        let mut kernels = [Kernel::Portable; MAX_JOBS];
        for (i, k) in kernels.iter_mut().enumerate() {
            *k = best(i + 1)?;
        }
        Some(Plan { kernels })
    }

    /// The kernel that runs when `jobs` jobs are resident (clamped to 1 ..=
    /// [`MAX_JOBS`]).
    pub fn kernel(&self, jobs: usize) -> Kernel {
        self.kernels[jobs.clamp(1, MAX_JOBS) - 1]
    }

    /// The most jobs the plan ever runs in one call: more resident jobs than this
    /// only wait.
    pub fn lanes(&self) -> usize {
        (1..=MAX_JOBS)
            .map(|n| n.min(self.kernel(n).width()))
            .max()
            .unwrap_or(1)
    }
}

/// `1: sha-ni x1, 2: sha-ni x2, …, 9-18: avx512 x16, 19-32: avx512 x32`, up to
/// the plan's lanes.
impl fmt::Display for Plan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let lanes = self.lanes();
        let mut from = 1;
        while from <= lanes {
            let kernel = self.kernel(from);
            let mut to = from;
            while to < lanes && self.kernel(to + 1) == kernel {
                to += 1;
            }
            if from > 1 {
                f.write_str(", ")?;
            }
            if from == to {
                write!(f, "{from}: {kernel}")?;
            } else {
                write!(f, "{from}-{to}: {kernel}")?;
            }
            from = to + 1;
        }
        Ok(())
    }
}

impl core::str::FromStr for Plan {
    type Err = ParsePlanError;

    /// The [`Display`](fmt::Display) form: comma-separated `N: kernel` or
    /// `FROM-TO: kernel` entries that cover 1, 2, … in order without a gap; the
    /// last entry's kernel also runs for more jobs than it names.
    fn from_str(s: &str) -> Result<Plan, ParsePlanError> {
        let err = |what: String| Err(ParsePlanError(what));
        let mut kernels = [Kernel::Portable; MAX_JOBS];
        let mut next = 1;
        for entry in s.split(',') {
            let Some((range, kernel)) = entry.split_once(':') else {
                return err(format!("{:?} is not `jobs: kernel`", entry.trim()));
            };
            let kernel: Kernel = kernel.parse()?;
            let number = |n: &str| n.trim().parse::<usize>().ok();
            let (from, to) = match range.split_once('-') {
                Some((from, to)) => (number(from), number(to)),
                None => (number(range), number(range)),
            };
            let (Some(from), Some(to)) = (from, to) else {
                return err(format!(
                    "{:?} is not a number of jobs or a range",
                    range.trim()
                ));
            };
            if from != next || to < from || to > MAX_JOBS {
                return err(format!(
                    "{from}-{to}: the entries must cover 1 to at most {MAX_JOBS} jobs in order, \
                     without a gap (expected {next} next)"
                ));
            }
            kernels[from - 1..to].fill(kernel);
            next = to + 1;
        }
        if next == 1 {
            return err("an empty plan".to_owned());
        }
        let last = kernels[next - 2];
        kernels[next - 1..].fill(last);
        Ok(Plan { kernels })
    }
}

/// Measures each kernel of `kernels` on this CPU: `rounds` rounds on as many
/// chains as its width, `repeats` times, interleaved between kernels. On a
/// shared host a kernel's speed swings with what runs beside it, by a quarter
/// from one millisecond to the next, while kernels measured one right after the
/// other swing together: so each kernel's cost is the median over the repeats
/// of its time against the first kernel's in the same repeat, times the median
/// time of the first kernel.
///
/// # Safety
/// The CPU must support every kernel's backend.
pub(crate) unsafe fn measure(kernels: &[Kernel], rounds: u32, repeats: usize) -> Vec<KernelCost> {
    let rounds = rounds.max(1);
    let repeats = repeats.max(1);
    let chain = Chain::start(b"calibration", b"of the kernels", rounds.saturating_add(1));
    let mut chains = [chain; MAX_JOBS];
    // runs[k][r]: kernel k's nanoseconds per round in repeat r.
    let mut runs = vec![Vec::with_capacity(repeats); kernels.len()];
    for _ in 0..repeats {
        for (k, runs) in kernels.iter().zip(runs.iter_mut()) {
            let start = Instant::now();
            // SAFETY: the caller guarantees the CPU supports every kernel.
            unsafe { k.run(&mut chains, rounds) };
            let ns = start.elapsed().as_nanos() as f64 / f64::from(rounds);
            runs.push(ns.max(f64::MIN_POSITIVE));
        }
    }
    let median = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v.get(v.len() / 2).copied().unwrap_or(f64::INFINITY)
    };
    let first = runs.first().cloned().unwrap_or_default();
    let base = median(first.clone());
    kernels
        .iter()
        .zip(&runs)
        .map(|(&kernel, runs)| KernelCost {
            kernel,
            ns_per_round: base * median(runs.iter().zip(&first).map(|(r, f)| r / f).collect()),
        })
        .collect()
}
