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
//! # Lanes, plans and mixed round counts
//!
//! [`Lanes`] hold up to [`Engine::lanes`] jobs in flight and advance them one
//! kernel call at a time ([`Lanes::step`], at most the rounds it is given);
//! jobs pushed between calls join at the next one, and finished jobs are
//! handed back in the order they arrived. Each call runs the kernel the
//! engine's [`Plan`] names for the number of resident jobs, on the oldest of
//! them (as many as the kernel is wide); the others wait for a lane.
//! [`Engine::derive`] is a batch on lanes: as many jobs resident as fit, each
//! call running as many rounds as the running job with the fewest left needs,
//! a finished job's lane refilled from the rest of the batch. Jobs may have
//! different passwords, salts and round counts; each result is exactly its own
//! job's.
//!
//! A [`Kernel`] is one compiled loop: SHA-NI with 1 to 8 interleaved streams
//! (built for exactly that many jobs), AVX2's eight lanes, one or two AVX-512
//! vectors (idle lanes of a running vector compute on zeros, which is free:
//! the vector is the unit of work, and are ignored), or the portable path.
//! A plan comes from:
//! - **the built-in rule** ([`Engine::detect`]), from the Zen 5 figures below:
//!   with AVX-512 and SHA-NI, fewer than [`AVX512_MIN_JOBS`] (9) jobs on SHA-NI
//!   (up to [`SHA_NI_STREAMS`] streams), up to 18 on one AVX-512 vector (the
//!   17th and 18th wait for its lanes), from [`AVX512_PAIR_MIN_JOBS`] (19) on
//!   two; with AVX2 or AVX-512 and no SHA-NI, a job alone on the portable path;
//!   a forced backend ([`Engine::with_backend`]) runs its own kernels only,
//!   even for one job (a batch of one on forced AVX-512 costs what sixteen
//!   cost);
//! - **measurement** ([`Engine::calibrated`]: each of the engine's
//!   [`kernels`](Engine::kernels) timed on this CPU, [`Plan::from_costs`]
//!   taking for each number of jobs the cheapest per job, the kernel that runs
//!   more of them on a near tie): the crossovers and the SHA-NI stream count of
//!   the machine at hand;
//! - **a plan read back** from its printed form ([`Engine::with_plan`]), so a
//!   fleet runs the plan measured once on its machine type.
//!
//! Measured on an AMD EPYC Zen 4 (family 25 model 17; AVX-512 on 256-bit
//! units, two vCPUs of a shared host), a calibration gives SHA-NI one stream
//! 36 ns per compression, two 22, three to eight 17 to 25 (they swing with the
//! host's load, and by a quarter from one measurement to the next), one
//! AVX-512 vector 19, two 15 to 17. So the plans it makes run one job on one
//! stream, 2 to about 13 on two to eight streams, and a full 32 on two vectors;
//! where the crossovers fall between varies from one start to the next by the
//! noise. Sustained (`authd hash-bench`, 100,000 rounds, 64 jobs), the same
//! CPU does 15.3 to 17.8 ns on two vectors, 18.8 to 19.4 on one, 20.4 to 22 on
//! four to six SHA-NI streams. In a quieter run the calibration gave SHA-NI
//! 35.7, 21.2, 18.1 and 17.3 ns for one to four streams and 16.5 to 16.9 for
//! five to eight, one vector 18.5 and two 15.1, against 35.8 ns per block for
//! OpenSSL's single stream (`openssl speed -evp sha256 -bytes 16384`): two
//! vectors at 0.43 times OpenSSL's cost, 1.14 times four SHA-NI streams'
//! throughput. Both run on the same vector pipes here (a 512-bit operation
//! takes a 256-bit unit twice, and `sha256rnds2` issues on those units too).
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
//!   2-cycle throughput (Zen 5: 138, 95, 81, 80). Four is the built-in
//!   plans' width; kernels of 1 to 8 streams are compiled, and a measured plan
//!   takes the count this CPU runs best (up to eight streams give the
//!   out-of-order core more independent work where four do not reach the
//!   bound). Fewer jobs lose nothing to the width: each count of jobs has a
//!   kernel of its own, and one job runs the 1-stream kernel. Not every CPU
//!   peaks at four: a Zen 1 EPYC (family 23 model 1, 2.0 GHz, a shared host)
//!   calibrates at 53 ns per compression with 1 stream, 33 with 2, 34 with 3,
//!   39 with 4 and 44 with 8, so a measured plan runs it on two streams, and
//!   sustained at 100,000 rounds that plan hashed 1.12 to 1.39 times as fast
//!   as the built-in one in three alternated pairs.
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
mod lanes;
mod plan;
mod portable;
mod prep;
#[cfg(target_arch = "x86_64")]
mod shani;

pub use lanes::{Lanes, Step};
pub use plan::{Kernel, KernelCost, MAX_JOBS, MAX_SHA_NI_STREAMS, NEAR_TIE, ParsePlanError, Plan};

/// The number of interleaved SHA-NI streams of [`Engine::with_backend`]'s
/// SHA-NI engine, and of [`Engine::detect`]'s before it is
/// [`calibrated`](Engine::calibrated) (see the crate docs for the
/// measurements).
pub const SHA_NI_STREAMS: usize = 4;

/// The jobs in flight of the AVX-512 backend that [`Engine::detect`] and
/// [`Engine::with_backend`] use: two vectors of sixteen lanes, interleaved,
/// which cost 7.6 ns per compression per job on Zen 5 where one vector costs
/// 11.4 (see the crate docs).
pub const AVX512_LANES: usize = 32;

#[cfg(target_arch = "x86_64")]
const _: () = assert!(AVX512_LANES == avx512::MAX_LANES && AVX512_LANES == MAX_JOBS);
#[cfg(target_arch = "x86_64")]
const _: () = assert!(MAX_SHA_NI_STREAMS == shani::MAX_STREAMS);

/// The fewest resident jobs [`Engine::detect`]'s AVX-512 engine runs on
/// AVX-512 when the CPU also has SHA-NI, before it is
/// [`calibrated`](Engine::calibrated): fewer run on SHA-NI. Measured on Zen 5
/// at 20,000 rounds: one AVX-512 vector takes 7.6 ms for any batch up to 16,
/// four SHA-NI streams 6.8 ms for 8 jobs and 8.4 ms for 9 (see the crate
/// docs).
pub const AVX512_MIN_JOBS: usize = 9;

/// The fewest resident jobs [`Engine::detect`]'s AVX-512 engine runs on two
/// vectors when the CPU also has SHA-NI, before it is calibrated: with 17 or
/// 18, the last ones wait for lanes of the first vector. Measured on Zen 5 at
/// 600,000 rounds: a batch of 32 on two vectors takes 292 ms and one of 16 on
/// one vector 219, so the second vector adds 73 ms; SHA-NI takes 58 ms for
/// two jobs, 75 for three.
pub const AVX512_PAIR_MIN_JOBS: usize = 19;

/// The rounds each kernel runs when [`Engine::calibrated`] measures it (seven
/// times): long enough for a kernel's sustained speed, not a burst's.
pub const CALIBRATION_ROUNDS: u32 = 10_000;

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
    /// [`Lanes::push`]: every lane holds a job already.
    LanesFull {
        /// The lanes.
        lanes: usize,
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
            Error::LanesFull { lanes } => write!(f, "all {lanes} lanes hold a job"),
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

/// A chosen backend, and the [`Plan`] that picks one of its kernels for each
/// number of resident jobs. Cheap to copy; holding one proves the CPU supports
/// every kernel its plan uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Engine {
    plan: Plan,
    /// The kernels a measured plan chooses from.
    choice: Choice,
}

/// The kernels an engine may run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Choice {
    /// Every kernel the CPU has ([`Engine::detect`]).
    Any,
    /// The portable path alone.
    Portable,
    /// SHA-NI with 1 to `streams` streams.
    ShaNi { streams: u8 },
    /// AVX2 alone.
    Avx2,
    /// AVX-512 with 1 to `vectors` vectors.
    Avx512 { vectors: u8 },
}

impl Engine {
    /// Every kernel of the fastest backend this CPU supports: AVX-512, else
    /// SHA-NI, else AVX2, else portable; and, where the CPU has them, the
    /// faster kernels of the others for fewer jobs. Before it is
    /// [`calibrated`](Engine::calibrated), the plan is the one measured on the
    /// machines of the crate docs: with AVX-512 and SHA-NI, fewer than
    /// [`AVX512_MIN_JOBS`] jobs run on SHA-NI streams (at most
    /// [`SHA_NI_STREAMS`]), up to 18 on one AVX-512 vector, more on two; with
    /// AVX2 or AVX-512 and no SHA-NI, a job alone runs on the portable path.
    pub fn detect() -> Engine {
        let sha_ni = Backend::ShaNi.is_supported();
        let streams = |n: usize| Kernel::ShaNi {
            streams: n.min(SHA_NI_STREAMS) as u8,
        };
        let plan = if Backend::Avx512.is_supported() {
            Plan::from_fn(|n| match n {
                n if sha_ni && n < AVX512_MIN_JOBS => streams(n),
                1 => Kernel::Portable,
                n if n < AVX512_PAIR_MIN_JOBS && sha_ni => Kernel::Avx512 { vectors: 1 },
                n if n <= 16 => Kernel::Avx512 { vectors: 1 },
                _ => Kernel::Avx512 { vectors: 2 },
            })
        } else if sha_ni {
            Plan::from_fn(streams)
        } else if Backend::Avx2.is_supported() {
            Plan::from_fn(|n| {
                if n == 1 {
                    Kernel::Portable
                } else {
                    Kernel::Avx2
                }
            })
        } else {
            Plan::from_fn(|_| Kernel::Portable)
        };
        Engine {
            plan,
            choice: Choice::Any,
        }
    }

    /// That backend alone, or `None` when this CPU lacks the instructions it
    /// needs. Every batch runs on that backend, whatever its size: a vector
    /// backend runs all its lanes even for one job; SHA-NI runs
    /// [`SHA_NI_STREAMS`] streams, fewer for fewer jobs, and may run up to
    /// [`MAX_SHA_NI_STREAMS`] once calibrated.
    pub fn with_backend(backend: Backend) -> Option<Engine> {
        if !backend.is_supported() {
            return None;
        }
        Some(match backend {
            Backend::ShaNi => Engine::sha_ni(SHA_NI_STREAMS, MAX_SHA_NI_STREAMS),
            Backend::Avx512 => Engine::avx512(2),
            Backend::Avx2 => Engine {
                plan: Plan::from_fn(|_| Kernel::Avx2),
                choice: Choice::Avx2,
            },
            Backend::Portable => Engine {
                plan: Plan::from_fn(|_| Kernel::Portable),
                choice: Choice::Portable,
            },
        })
    }

    fn sha_ni(streams: usize, most: usize) -> Engine {
        Engine {
            plan: Plan::from_fn(|n| Kernel::ShaNi {
                streams: n.min(streams) as u8,
            }),
            choice: Choice::ShaNi {
                streams: most as u8,
            },
        }
    }

    fn avx512(vectors: u8) -> Engine {
        Engine {
            plan: Plan::from_fn(|n| Kernel::Avx512 {
                vectors: if n > 16 { vectors } else { 1 },
            }),
            choice: Choice::Avx512 { vectors },
        }
    }

    /// The SHA-NI backend with `streams` (1 to [`MAX_SHA_NI_STREAMS`])
    /// interleaved jobs instead of the default [`SHA_NI_STREAMS`], fewer for
    /// fewer jobs; for measurements. `None` when `streams` is out of range or
    /// the CPU lacks SHA-NI.
    pub fn with_sha_ni_streams(streams: usize) -> Option<Engine> {
        if !(1..=MAX_SHA_NI_STREAMS).contains(&streams) || !Backend::ShaNi.is_supported() {
            return None;
        }
        Some(Engine::sha_ni(streams, streams))
    }

    /// The AVX-512 backend with `lanes` (16: one vector, or 32: two
    /// interleaved) jobs in flight instead of the default [`AVX512_LANES`],
    /// never handing jobs to SHA-NI; for measurements. `None` when `lanes` is
    /// neither or the CPU lacks AVX-512F.
    pub fn with_avx512_lanes(lanes: usize) -> Option<Engine> {
        if (lanes != 16 && lanes != 32) || !Backend::Avx512.is_supported() {
            return None;
        }
        Some(Engine::avx512((lanes / 16) as u8))
    }

    /// The kernels this engine may choose from when it is calibrated: those of
    /// its backend, or, for [`Engine::detect`]'s, every kernel this CPU has.
    pub fn kernels(&self) -> Vec<Kernel> {
        let sha_ni = |most: u8| (1..=most).map(|streams| Kernel::ShaNi { streams });
        let avx512 = |most: u8| (1..=most).map(|vectors| Kernel::Avx512 { vectors });
        match self.choice {
            Choice::Portable => vec![Kernel::Portable],
            Choice::ShaNi { streams } => sha_ni(streams).collect(),
            Choice::Avx2 => vec![Kernel::Avx2],
            Choice::Avx512 { vectors } => avx512(vectors).collect(),
            // A family that another one the CPU has always beats is left out: the
            // portable path where SHA-NI exists (its compression is SHA-NI's single
            // stream, plus buffering), AVX2 where AVX-512 does (the same lanes, with
            // a rotation and a three-input operation in one instruction each).
            Choice::Any => {
                let (sha, avx512f) = (
                    Backend::ShaNi.is_supported(),
                    Backend::Avx512.is_supported(),
                );
                let mut all = Vec::new();
                if !sha {
                    all.push(Kernel::Portable);
                }
                if sha {
                    all.extend(sha_ni(MAX_SHA_NI_STREAMS as u8));
                }
                if Backend::Avx2.is_supported() && !avx512f {
                    all.push(Kernel::Avx2);
                }
                if avx512f {
                    all.extend(avx512(2));
                }
                all
            }
        }
    }

    /// Measures each of [`kernels`](Engine::kernels) on this CPU, on the calling
    /// thread: `rounds` rounds on as many jobs as it is wide, seven times,
    /// interleaved, each against the first kernel in the same round of
    /// measurements. Takes about 0.2 s at
    /// [`CALIBRATION_ROUNDS`] for [`Engine::detect`]'s engine on a CPU with
    /// every backend.
    pub fn measure(&self, rounds: u32) -> Vec<KernelCost> {
        // SAFETY: `kernels()` lists only kernels of backends this CPU supports.
        unsafe { plan::measure(&self.kernels(), rounds, 7) }
    }

    /// This engine with the plan [`Plan::from_costs`] makes from `costs`, among
    /// its own [`kernels`](Engine::kernels) (costs of others are ignored); this
    /// engine unchanged when they cannot run one job.
    pub fn with_costs(&self, costs: &[KernelCost]) -> Engine {
        let mine = self.kernels();
        let costs: Vec<KernelCost> = costs
            .iter()
            .filter(|c| mine.contains(&c.kernel))
            .copied()
            .collect();
        match Plan::from_costs(&costs) {
            Some(plan) => Engine { plan, ..*self },
            None => *self,
        }
    }

    /// This engine with `plan`, or the first kernel of it this engine may not run
    /// (one of another backend, or one the CPU lacks).
    pub fn with_plan(&self, plan: Plan) -> Result<Engine, Kernel> {
        let mine = self.kernels();
        match (1..=MAX_JOBS)
            .map(|n| plan.kernel(n))
            .find(|k| !mine.contains(k))
        {
            Some(kernel) => Err(kernel),
            None => Ok(Engine { plan, ..*self }),
        }
    }

    /// This engine with the plan its kernels' costs, measured now on this CPU
    /// ([`measure`](Engine::measure) at [`CALIBRATION_ROUNDS`]), make: the
    /// crossovers and the SHA-NI stream count of this machine rather than those
    /// of the crate docs.
    pub fn calibrated(&self) -> Engine {
        self.with_costs(&self.measure(CALIBRATION_ROUNDS))
    }

    /// The kernel for each number of resident jobs.
    pub fn plan(&self) -> &Plan {
        &self.plan
    }

    /// The backend of this engine's widest kernel (the one that runs when its
    /// lanes are full).
    pub fn backend(&self) -> Backend {
        self.plan.kernel(MAX_JOBS).backend()
    }

    /// The backend a batch of `jobs` jobs runs on (while that many are
    /// resident; with mixed round counts, the last jobs of a batch run on the
    /// kernel for fewer).
    pub fn backend_for(&self, jobs: usize) -> Backend {
        self.plan.kernel(jobs.min(self.lanes())).backend()
    }

    /// The batch size that fills the kernels: the most jobs computed side by
    /// side. Larger batches are fine (finished lanes are refilled).
    pub fn lanes(&self) -> usize {
        self.plan.lanes()
    }

    /// Computes every job of the batch into `out` (one 32-byte key per job, in
    /// order), on [`Lanes`]: up to [`lanes`](Engine::lanes) jobs resident, a
    /// finished one replaced by the next. Jobs may have different round counts,
    /// passwords and salts.
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
        let mut lanes = Lanes::new(self);
        let mut waiting = jobs.iter().enumerate();
        loop {
            while lanes.free() > 0
                && let Some((i, job)) = waiting.next()
            {
                lanes.push(*job, i).map_err(|(e, _)| e)?;
            }
            let ran = lanes.step(u32::MAX, |i, key| {
                if let Some(out) = out.get_mut(i) {
                    *out = key;
                }
            });
            if ran.is_none() && lanes.is_empty() && waiting.len() == 0 {
                return Ok(());
            }
        }
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
