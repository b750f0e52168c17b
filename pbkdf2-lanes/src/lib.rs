//! Multi-lane PBKDF2-HMAC-SHA256 (RFC 8018, section 5.2) with 32-byte outputs.
//!
//! A batch of independent jobs (password, salt, rounds) is computed together,
//! several jobs at a time on one core. The output is always 32 bytes: the
//! first PBKDF2 block T1, which is the whole key when dkLen = 32 (authd's
//! `l=32`). Longer keys are not offered: each further 32 bytes would be
//! another complete run of the rounds.
//!
//! ```
//! use pbkdf2_lanes::{Engine, Job};
//!
//! let engine = Engine::detect();
//! let jobs = [Job::new(b"password", b"salt", 2), Job::new(b"other", b"pepper", 3)];
//! let keys = engine.derive_vec(&jobs)?;
//! assert_eq!(keys[0][..4], [0xae, 0x4d, 0x0c, 0x95]);
//! assert_eq!(pbkdf2_lanes::pbkdf2_sha256(b"other", b"pepper", 3)?, keys[1]);
//! # Ok::<(), pbkdf2_lanes::Error>(())
//! ```
//!
//! # Layout of the work
//!
//! Once per job, on the generic path (`sha2::block_api::compress256`):
//! the HMAC key rule (a password longer than the 64-byte block is replaced by
//! its SHA-256), the two pad mid-states (the SHA-256 state after the block
//! `K ^ ipad`, and after `K ^ opad`), and U1 = HMAC(P, salt || INT(1)), whose
//! inner hash streams the salt through as many blocks as it needs.
//!
//! Every later round is then exactly two compressions,
//! `U = H(outer, H(inner, U || pad) || pad)`, of a block with a fixed layout:
//! words 0..8 are the previous digest, word 8 is `0x80000000`, words 9..15 are
//! zero and word 15 is the length, (64 + 32) × 8 = 768 bits. Digests never
//! leave word form inside the loop (no padding, buffering or byte swapping),
//! and the constant words are folded into the kernels: `W + K` of rounds 8..16
//! and the schedule terms that only involve words 8..16 are compile-time
//! constants. T1 is the XOR of all U.
//!
//! # Batches and mixed round counts
//!
//! Jobs in a batch may have different passwords, salts and round counts;
//! each result is exactly its own job's. A kernel call runs as many rounds as
//! the resident job with the fewest left needs, then finished jobs are
//! written out and their slots refilled from the rest of the batch:
//! - SHA-NI narrows when nothing is left to refill with (4, 3, 2, then 1
//!   stream), so no work is spent on finished jobs;
//! - AVX2 keeps all eight lanes running; idle lanes compute on stale data,
//!   which is harmless and free (the vector is the unit of work), and their
//!   results are ignored. A batch of one therefore costs what eight cost.
//! - AVX-512 keeps the resident jobs in its first lanes and runs one vector
//!   (16 lanes) while at most 16 are resident, two (32 lanes) beyond; idle
//!   lanes of a running vector compute on stale data as AVX2's do. Forced
//!   ([`Engine::with_backend`]), it keeps every job: a batch of one costs
//!   what sixteen cost. [`Engine::detect`]'s AVX-512 engine narrows to SHA-NI
//!   instead, where the CPU has it: a batch of fewer than [`AVX512_MIN_JOBS`]
//!   (9) jobs runs on SHA-NI, and so do the last jobs of a larger batch once
//!   fewer than 9 are resident and none is left to refill with; and it runs
//!   the second vector only for at least 3 jobs past the first 16 (one or two
//!   more wait for lanes of the first vector, then finish on SHA-NI).
//!
//! A job with 0 rounds is refused with [`Error::ZeroRounds`] (PBKDF2 requires
//! c ≥ 1) before anything is computed; nothing here panics on any input.
//!
//! # Backends
//!
//! Chosen at run time by [`Engine::detect`] with `is_x86_feature_detected!`,
//! or forced with [`Engine::with_backend`] (which returns `None` when the CPU
//! lacks the instructions). Figures: AMD EPYC (Zen 5, about 3.9 GHz), one
//! core, 600,000 rounds, nanoseconds (cycles) per SHA-256 compression per job,
//! from the crate's benchmark; OpenSSL's single-stream SHA-256 on large
//! buffers (`openssl speed -evp sha256`, SHA-NI) costs 33.7 ns per block on
//! the same machine.
//!
//! | backend | jobs in flight | ns | what bounds it |
//! |---|---|---|---|
//! | [`Backend::Avx512`], two vectors interleaved (default) | 32 ([`AVX512_LANES`]) | 7.6 (30) | vector ALU throughput: about 3,100 operations per pair of 16-lane compressions, 3.3 per cycle of 4 |
//! | AVX-512, one vector ([`Engine::with_avx512_lanes`]`(16)`; batches of 9 to 18) | 16 | 11.4 (45) | the rounds' dependency chain: a rotation, a ternary-logic operation and an addition from one `e` to the next, about 7 cycles |
//! | AVX-512 forced, batch of one | 1 of 16 | 181 (709) | as one vector, for a single job |
//! | [`Backend::ShaNi`] | 4 ([`SHA_NI_STREAMS`]) | 20.4 (80) | `sha256rnds2` throughput |
//! | SHA-NI, 1 stream (batch of one; also [`Engine::detect`]'s AVX-512 engine's) | 1 | 35.3 (138) | `sha256rnds2` latency |
//! | [`Backend::Avx2`] | 8 | 33.5 (131) | vector ALU throughput (about 3,300 operations per 8-lane compression, 1,180 of them shifts) |
//! | [`Backend::Portable`] | 1 | 43.2 (169) | `sha2`'s own single-block code (SHA-NI on this CPU) |
//! | the `pbkdf2` crate, for comparison | 1 | 81.7 (319) | HMAC buffering and padding every round |
//!
//! - **AVX-512** is the fastest where the CPU has AVX-512F: sixteen jobs per
//!   vector, one per 32-bit lane. `vprord` rotates in one instruction and
//!   `vpternlogd` computes Ch, Maj or a three-way XOR in one: about 1,560
//!   vector operations per 16-lane compression, where AVX2 needs about 3,300
//!   for 8 lanes. One vector leaves the core waiting on the chain of the 64
//!   rounds (about 700 cycles per compression where the chain alone needs
//!   470, the vector units some 60 % busy); two vectors interleaved round by
//!   round give it a second, independent chain: 0.23 times OpenSSL's
//!   single-stream cost per compression and 0.37 times SHA-NI's four streams
//!   (one vector: 0.34 and 0.56). The kernel is in `avx512.rs`.
//! - **The crossovers** of [`Engine::detect`]'s AVX-512 engine are measured
//!   constants (`cargo bench --bench throughput -- --batches ...`): one
//!   vector costs the same for 1 to 16 jobs (7.6 ms at 20,000 rounds), four
//!   SHA-NI streams 6.8 ms for 8 jobs and 8.4 ms for 9, hence
//!   [`AVX512_MIN_JOBS`] = 9; the second vector adds about what three jobs
//!   cost on SHA-NI (73 ms against 75 at 600,000 rounds), hence two vectors
//!   from 19 jobs.
//! - **SHA-NI** exists because one compression is a chain of 32 dependent
//!   `sha256rnds2`: a single stream waits on the instruction's latency and
//!   leaves the SHA unit idle half the time. Interleaving independent jobs,
//!   quad of rounds by quad of rounds, fills it: on Zen 3, 130 cycles per
//!   compression with 1 stream (32 × the 4-cycle latency, plus the hand-over
//!   between blocks), 75 with 2, 65 with 3, 63 with 4, where 64 is 32 × the
//!   2-cycle throughput (Zen 5: 138, 95, 81, 80). Four measured fastest, so
//!   it is the default; more streams cannot help, as four already run at the
//!   throughput bound. Smaller batches lose nothing to the width: with fewer
//!   jobs the kernel narrows, and a batch of one runs the 1-stream kernel.
//! - **AVX2** is the path for x86-64 servers without SHA-NI or AVX-512: eight
//!   jobs, one per 32-bit lane, the message schedule computed in vectors.
//!   AVX2 has no rotate (each is two shifts and an OR), so it is bound by the
//!   vector ALUs: on Zen 3, about 1,000 cycles for the 3,280 instructions of
//!   one 8-lane compression (3.3 per cycle, on four vector pipes of which two
//!   shift). With one job it costs 1.3 times `sha2`'s software compression
//!   (measured with `sha2_backend="soft"`), with two already 0.66 times; idle
//!   lanes are therefore not handed to a scalar path.
//! - **Portable** builds and works on every target: one job at a time on
//!   `sha2`'s compression function, which picks the best single-block code
//!   `sha2` has for the CPU (software, or SHA extensions where it has them).
//!
//! The order [`Engine::detect`] tries them in (AVX-512, SHA-NI, AVX2,
//! portable) comes from these measurements. Only x86-64 has fast kernels
//! here: there are no aarch64 kernels, since no machine this crate is tested
//! on could run them. The README has the figures of an AMD EPYC Zen 3 (SHA-NI
//! and AVX2, no AVX-512) as well.
//!
//! # Other limits
//!
//! - The work runs on the calling thread; spreading batches over cores is the
//!   caller's business (the figures above are per core).
//! - The round loop's timing depends only on the round counts; the
//!   per-job preparation's only on the password and salt lengths.
//! - Key material (pad mid-states, U, T) is not zeroized after use.
//! - Unoptimised, the AVX2 kernel is about 50 times slower: the workspace
//!   should build this package with `opt-level = 3` in the dev profile.
//! - The AVX-512 kernel's timing is that of Zen 5's vector units; other
//!   AVX-512 CPUs may rank it differently against SHA-NI (it is not measured
//!   on any other here).
//!
//! All `unsafe` of the crate is in its kernel modules and at the dispatch:
//! the kernels are `#[target_feature]` functions, called only through an
//! [`Engine`], which can only be made after the features were detected.
#![deny(unsafe_op_in_unsafe_fn)]
#![warn(missing_docs)]

use core::fmt;

#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx512;
mod portable;
mod prep;
#[cfg(target_arch = "x86_64")]
mod shani;

/// The number of interleaved SHA-NI streams [`Engine::detect`] and
/// [`Engine::with_backend`] use (see the crate docs for the measurements).
pub const SHA_NI_STREAMS: usize = 4;

/// The jobs in flight of the AVX-512 backend that [`Engine::detect`] and
/// [`Engine::with_backend`] use: two vectors of sixteen lanes, interleaved,
/// which cost 7.6 ns per compression per job on Zen 5 where one vector costs
/// 11.4 (see the crate docs).
pub const AVX512_LANES: usize = 32;

#[cfg(target_arch = "x86_64")]
const _: () = assert!(AVX512_LANES == avx512::MAX_LANES);

/// The fewest resident jobs [`Engine::detect`]'s AVX-512 engine runs on
/// AVX-512 when the CPU also has SHA-NI: a batch smaller than this, and the
/// last jobs of a larger one once nothing is left to refill their lanes with,
/// run on SHA-NI instead. Measured on Zen 5 at 20,000 rounds: one AVX-512
/// vector takes 7.6 ms for any batch up to 16, four SHA-NI streams 6.8 ms
/// for 8 jobs and 8.4 ms for 9 (see the crate docs).
pub const AVX512_MIN_JOBS: usize = 9;

/// One PBKDF2-HMAC-SHA256 computation: `DK = T1 = F(password, salt, rounds, 1)`.
#[derive(Clone, Copy)]
pub struct Job<'a> {
    /// The password (the HMAC key; hashed first when longer than 64 bytes).
    pub password: &'a [u8],
    /// The salt, of any length.
    pub salt: &'a [u8],
    /// The iteration count `c`; must be at least 1.
    pub rounds: u32,
}

impl<'a> Job<'a> {
    /// A job from its three inputs.
    pub fn new(password: &'a [u8], salt: &'a [u8], rounds: u32) -> Self {
        Job {
            password,
            salt,
            rounds,
        }
    }
}

impl fmt::Debug for Job<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Job")
            .field("password", &format_args!("<{} bytes>", self.password.len()))
            .field("salt_len", &self.salt.len())
            .field("rounds", &self.rounds)
            .finish()
    }
}

/// Why a batch was refused. Nothing is computed and no output is written when
/// an error is returned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Error {
    /// PBKDF2 requires an iteration count of at least 1; job `job` has 0.
    ZeroRounds {
        /// Index of the offending job in the batch.
        job: usize,
    },
    /// The output slice does not have one entry per job.
    OutputLength {
        /// Number of jobs.
        jobs: usize,
        /// Number of outputs provided.
        outputs: usize,
    },
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::ZeroRounds { job } => {
                write!(f, "job {job}: PBKDF2 needs at least 1 round, got 0")
            }
            Error::OutputLength { jobs, outputs } => {
                write!(f, "{jobs} jobs but {outputs} output slots")
            }
        }
    }
}

impl std::error::Error for Error {}

/// A kernel family. Which ones a CPU can run is decided at run time.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Backend {
    /// x86-64 AVX-512F, sixteen jobs in the 32-bit lanes of a vector, two
    /// vectors interleaved.
    Avx512,
    /// x86-64 SHA extensions, several jobs interleaved on one core.
    ShaNi,
    /// x86-64 AVX2, eight jobs in the eight 32-bit lanes of a vector.
    Avx2,
    /// `sha2`'s compression function, one job at a time; runs everywhere.
    Portable,
}

impl Backend {
    /// Every backend, fastest first (the order [`Engine::detect`] tries them).
    pub const ALL: [Backend; 4] = [
        Backend::Avx512,
        Backend::ShaNi,
        Backend::Avx2,
        Backend::Portable,
    ];

    /// A short stable name: `"avx512"`, `"sha-ni"`, `"avx2"` or `"portable"`.
    pub fn name(self) -> &'static str {
        match self {
            Backend::Avx512 => "avx512",
            Backend::ShaNi => "sha-ni",
            Backend::Avx2 => "avx2",
            Backend::Portable => "portable",
        }
    }

    /// Whether this CPU can run the backend.
    pub fn is_supported(self) -> bool {
        match self {
            #[cfg(target_arch = "x86_64")]
            Backend::ShaNi => shani::available(),
            #[cfg(target_arch = "x86_64")]
            Backend::Avx2 => avx2::available(),
            #[cfg(target_arch = "x86_64")]
            Backend::Avx512 => avx512::available(),
            #[cfg(not(target_arch = "x86_64"))]
            Backend::ShaNi | Backend::Avx2 | Backend::Avx512 => false,
            Backend::Portable => true,
        }
    }
}

impl fmt::Display for Backend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A chosen backend. Cheap to copy; holding one proves the CPU supports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Engine {
    backend: Backend,
    /// Jobs in flight per kernel call (SHA-NI streams, AVX2 or AVX-512 lanes,
    /// or 1).
    lanes: usize,
    /// AVX-512 only: fewer resident jobs than this run on SHA-NI (0: never).
    /// Only ever nonzero when the CPU has SHA-NI.
    sha_ni_below: usize,
}

impl Engine {
    /// The fastest backend this CPU supports: AVX-512, else SHA-NI, else AVX2,
    /// else portable. An AVX-512 engine made here runs batches (and the tails
    /// of batches) of fewer than [`AVX512_MIN_JOBS`] jobs on SHA-NI when the
    /// CPU has it; see [`backend_for`](Engine::backend_for).
    pub fn detect() -> Engine {
        let engine = Backend::ALL
            .into_iter()
            .find_map(Engine::with_backend)
            .unwrap_or(Engine {
                backend: Backend::Portable,
                lanes: 1,
                sha_ni_below: 0,
            });
        if engine.backend == Backend::Avx512 && Backend::ShaNi.is_supported() {
            Engine {
                sha_ni_below: AVX512_MIN_JOBS,
                ..engine
            }
        } else {
            engine
        }
    }

    /// That backend, or `None` when this CPU lacks the instructions it needs.
    /// Every batch runs on that backend alone, whatever its size.
    pub fn with_backend(backend: Backend) -> Option<Engine> {
        if !backend.is_supported() {
            return None;
        }
        let lanes = match backend {
            Backend::ShaNi => SHA_NI_STREAMS,
            #[cfg(target_arch = "x86_64")]
            Backend::Avx2 => avx2::LANES,
            Backend::Avx512 => AVX512_LANES,
            #[cfg(not(target_arch = "x86_64"))]
            Backend::Avx2 => return None,
            Backend::Portable => 1,
        };
        Some(Engine {
            backend,
            lanes,
            sha_ni_below: 0,
        })
    }

    /// The SHA-NI backend with `streams` (1 to 4) interleaved jobs instead of
    /// the default [`SHA_NI_STREAMS`]; for measurements. `None` when `streams`
    /// is out of range or the CPU lacks SHA-NI.
    pub fn with_sha_ni_streams(streams: usize) -> Option<Engine> {
        if !(1..=4).contains(&streams) {
            return None;
        }
        Engine::with_backend(Backend::ShaNi).map(|e| Engine {
            lanes: streams,
            ..e
        })
    }

    /// The AVX-512 backend with `lanes` (16: one vector, or 32: two
    /// interleaved) jobs in flight instead of the default [`AVX512_LANES`],
    /// never handing jobs to SHA-NI; for measurements. `None` when `lanes` is
    /// neither or the CPU lacks AVX-512F.
    pub fn with_avx512_lanes(lanes: usize) -> Option<Engine> {
        if lanes != 16 && lanes != 32 {
            return None;
        }
        Engine::with_backend(Backend::Avx512).map(|e| Engine { lanes, ..e })
    }

    /// The backend this engine runs.
    pub fn backend(&self) -> Backend {
        self.backend
    }

    /// The backend a batch of `jobs` jobs runs on: [`backend`](Engine::backend),
    /// except for [`Engine::detect`]'s AVX-512 engine, which runs batches of
    /// fewer than [`AVX512_MIN_JOBS`] jobs on SHA-NI. (With mixed round
    /// counts, the last jobs of a larger batch may finish on SHA-NI too.)
    pub fn backend_for(&self, jobs: usize) -> Backend {
        if jobs < self.sha_ni_below {
            Backend::ShaNi
        } else {
            self.backend
        }
    }

    /// The batch size that fills the kernel: jobs computed side by side.
    /// Larger batches are fine (finished lanes are refilled); smaller ones
    /// leave AVX2 or AVX-512 lanes idle.
    pub fn lanes(&self) -> usize {
        self.lanes
    }

    /// Computes every job of the batch into `out` (one 32-byte key per job, in
    /// order). Jobs may have different round counts, passwords and salts.
    ///
    /// Fails, before computing anything, when a job has 0 rounds or `out` does
    /// not have exactly `jobs.len()` entries.
    pub fn derive(&self, jobs: &[Job<'_>], out: &mut [[u8; 32]]) -> Result<(), Error> {
        if jobs.len() != out.len() {
            return Err(Error::OutputLength {
                jobs: jobs.len(),
                outputs: out.len(),
            });
        }
        if let Some(job) = jobs.iter().position(|j| j.rounds == 0) {
            return Err(Error::ZeroRounds { job });
        }
        match self.backend {
            // SAFETY: an `Engine` with this backend is only built by
            // `with_backend`, after `is_supported()` (i.e. `shani::available()`)
            // returned true, and the engine cannot be changed afterwards.
            #[cfg(target_arch = "x86_64")]
            Backend::ShaNi => unsafe { shani::derive(jobs, out, self.lanes) },
            // SAFETY: as above, with `avx2::available()`.
            #[cfg(target_arch = "x86_64")]
            Backend::Avx2 => unsafe { avx2::derive(jobs, out) },
            // SAFETY: as above, with `avx512::available()`; `sha_ni_below` is
            // only nonzero when `detect` found `shani::available()` too.
            #[cfg(target_arch = "x86_64")]
            Backend::Avx512 => unsafe { avx512::derive(jobs, out, self.lanes, self.sha_ni_below) },
            _ => {
                for (job, out) in jobs.iter().zip(out.iter_mut()) {
                    let p = prep::prepare(job.password, job.salt);
                    *out = prep::to_bytes(&portable::run(&p, job.rounds));
                }
            }
        }
        Ok(())
    }

    /// [`derive`](Engine::derive) into a new vector.
    pub fn derive_vec(&self, jobs: &[Job<'_>]) -> Result<Vec<[u8; 32]>, Error> {
        let mut out = vec![[0u8; 32]; jobs.len()];
        self.derive(jobs, &mut out)?;
        Ok(out)
    }
}

/// PBKDF2-HMAC-SHA256 of one job with a 32-byte output, on the detected
/// backend (its single-stream path). Fails only when `rounds` is 0.
pub fn pbkdf2_sha256(password: &[u8], salt: &[u8], rounds: u32) -> Result<[u8; 32], Error> {
    let mut out = [[0u8; 32]];
    Engine::detect().derive(&[Job::new(password, salt, rounds)], &mut out)?;
    let [key] = out;
    Ok(key)
}
