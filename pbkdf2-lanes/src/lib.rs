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
//!
//! A job with 0 rounds is refused with [`Error::ZeroRounds`] (PBKDF2 requires
//! c ≥ 1) before anything is computed; nothing here panics on any input.
//!
//! # Backends
//!
//! Chosen at run time by [`Engine::detect`] with `is_x86_feature_detected!`,
//! or forced with [`Engine::with_backend`] (which returns `None` when the CPU
//! lacks the instructions). Figures: AMD EPYC (Zen 3, about 3.1 GHz), one
//! core, full batch, 600,000 rounds, nanoseconds (cycles) per SHA-256
//! compression per job; OpenSSL's single-stream SHA-256 on large buffers
//! costs 42.6 to 43.6 ns per block on the same machine.
//!
//! | backend | jobs in flight | ns | what bounds it |
//! |---|---|---|---|
//! | [`Backend::ShaNi`] | 4 ([`SHA_NI_STREAMS`]) | 20.5 (63) | `sha256rnds2` throughput, 1 per 2 cycles |
//! | SHA-NI, 1 stream (batch of one) | 1 | 42.0 (130) | `sha256rnds2` latency, 4 cycles |
//! | [`Backend::Avx2`] | 8 | 39.9 (123) | vector ALU throughput (about 3,300 operations per 8-lane compression, 1,180 of them shifts) |
//! | [`Backend::Portable`] | 1 | 50.2 (155) | `sha2`'s own single-block code (SHA-NI on this CPU) |
//! | the `pbkdf2` crate, for comparison | 1 | 69.8 (216) | HMAC buffering and padding every round |
//!
//! - **SHA-NI** exists because one compression is a chain of 32 dependent
//!   `sha256rnds2`: a single stream waits on the instruction's latency and
//!   leaves the SHA unit idle half the time. Interleaving independent jobs,
//!   quad of rounds by quad of rounds, fills it: 130 cycles per compression
//!   with 1 stream (32 × the 4-cycle latency, plus the hand-over between
//!   blocks), 75 with 2, 65 with 3, 63 with 4, where 64 is 32 × the 2-cycle
//!   throughput. Four measured fastest, so it is the default; more streams
//!   cannot help, as four already run at the throughput bound. Smaller
//!   batches lose nothing to the width: with fewer jobs the kernel narrows,
//!   and a batch of one runs the 1-stream kernel.
//! - **AVX2** is the path for x86-64 servers without SHA-NI: eight jobs, one
//!   per 32-bit lane, the message schedule computed in vectors. AVX2 has no
//!   rotate (each is two shifts and an OR), so it is bound by the vector
//!   ALUs: about 1,000 cycles for the 3,280 instructions of one 8-lane
//!   compression (3.3 per cycle, on four vector pipes of which two shift).
//!   With one job it costs 1.3 times `sha2`'s software compression (measured
//!   here with `sha2_backend="soft"`), with two already 0.66 times; idle
//!   lanes are therefore not handed to a scalar path.
//! - **Portable** builds and works on every target: one job at a time on
//!   `sha2`'s compression function, which picks the best single-block code
//!   `sha2` has for the CPU (software, or SHA extensions where it has them).
//!
//! Only x86-64 has fast kernels here: there are no AVX-512 or aarch64 kernels,
//! since no machine this crate is tested on could run them.
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
/// [`Engine::with_backend`] use: two vectors of sixteen lanes, interleaved
/// (see the crate docs for the measurements).
pub const AVX512_LANES: usize = 32;

/// The fewest resident jobs [`Engine::detect`]'s AVX-512 engine runs on
/// AVX-512 when the CPU also has SHA-NI: a batch smaller than this, and the
/// last jobs of a larger one once nothing is left to refill their lanes with,
/// run on SHA-NI instead (see the crate docs for the measurements).
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
