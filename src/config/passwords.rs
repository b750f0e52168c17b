//! The password options: the policy of new hashes (PBKDF2-SHA256 and its cost, or
//! Argon2id and its parameters, and the memory budget of Argon2 work), the engine
//! and the threads that compute them, and the blocklist of common passwords.
//!
//! [`PasswordConfig::hasher`] starts the hashing pool and builds the [`Hasher`];
//! [`PasswordConfig::blocklist`] reads the lists; `authd hash-bench` takes its
//! options from [`PasswordConfig::bench_options`]. The hashing itself is
//! `crate::password`'s job, not this file's.

use super::parse::positive_duration;
use crate::{
    blocklist::Blocklist,
    metrics::Metrics,
    password::{Argon2Params, HashPool, Hasher, Policy, bench},
};
use anyhow::Context as _;
use clap::{Args, ValueEnum};
use std::{path::PathBuf, time::Duration};

/// Password hashing and the password policy.
#[derive(Debug, Clone, Args)]
pub struct PasswordConfig {
    /// PBKDF2-SHA256 iterations for new password hashes (at least 1000; OWASP: 600000).
    #[arg(long, env = "AUTHD_PBKDF2_ITERATIONS", default_value_t = 600_000,
          value_parser = clap::value_parser!(u32).range(1000..), global = true, display_order = 12)]
    pub pbkdf2_iterations: u32,

    /// Threads that hash passwords [default: the number of cores].
    #[arg(long, env = "AUTHD_HASH_THREADS",
          value_parser = clap::value_parser!(u32).range(1..=1024), global = true,
          display_order = 13)]
    pub hash_threads: Option<u32>,

    /// Deprecated, no effect (accepted so that existing configurations still start; a
    /// warning names it). The hash queue has no bound of its own any more: a request is
    /// admitted when it can be answered before its deadline (--max-wait without one),
    /// and --max-in-flight bounds memory.
    #[arg(long, env = "AUTHD_HASH_QUEUE",
          value_parser = clap::value_parser!(u32).range(1..=1_000_000), global = true,
          display_order = 14)]
    pub hash_queue: Option<u32>,

    /// Deprecated, no effect (see --hash-queue).
    #[arg(long, env = "AUTHD_HASH_QUEUE_WAIT", value_parser = positive_duration,
          global = true, display_order = 15)]
    pub hash_queue_wait: Option<Duration>,

    /// PBKDF2 engine: auto runs every kernel family this CPU has (avx512, sha-ni, avx2,
    /// portable), each for the number of hashes at hand it runs best (see
    /// --hash-kernels); naming one forces that family alone, and the start fails if the
    /// CPU lacks it.
    #[arg(
        long,
        env = "AUTHD_HASH_BACKEND",
        default_value = "auto",
        value_enum,
        global = true,
        display_order = 37
    )]
    pub hash_backend: HashBackend,

    /// Which kernel hashes how many passwords at once: builtin takes a fixed plan, made
    /// on an AMD EPYC Zen 5 (SHA-NI streams for up to 8 hashes at hand, AVX-512 vectors
    /// beyond, where the CPU has them); measure times each
    /// kernel of the engine at start (0.2 to 1.3 s of one core, by CPU) and takes, for
    /// each number of hashes at hand (1 to 32), the cheapest per hash; or a plan as `authd
    /// hash-bench` prints it ("1: sha-ni x1, 2-13: sha-ni x2, 14-32: avx512 x32"), so
    /// that a fleet runs the plan measured once on its machine type.
    #[arg(long, env = "AUTHD_HASH_KERNELS", default_value = "builtin",
          value_parser = parse_hash_kernels, global = true, display_order = 95)]
    pub hash_kernels: HashKernels,

    /// Nice value of the hashing threads (0 to 19): above 0, the threads that answer
    /// requests and probes run first when the cores are busy hashing.
    #[arg(long, env = "AUTHD_HASH_THREAD_NICE", default_value_t = 10,
          value_parser = clap::value_parser!(u8).range(0..=19), global = true, display_order = 39)]
    pub hash_thread_nice: u8,

    /// The bundled list of the 100,000 most common passwords (SecLists): on refuses them at
    /// Register, compared after NFKC and case-insensitively; off turns the list off (the
    /// --password-blocklist-file list and the rule that a password must not be the
    /// username still apply).
    #[arg(
        long,
        env = "AUTHD_PASSWORD_BLOCKLIST",
        default_value = "on",
        value_enum,
        global = true,
        display_order = 59
    )]
    pub password_blocklist: Switch,

    /// A file of more passwords to refuse, one per line (UTF-8, at most 64 MiB; empty lines
    /// and a trailing \r ignored), compared like the bundled list. Read at start.
    #[arg(
        long,
        env = "AUTHD_PASSWORD_BLOCKLIST_FILE",
        global = true,
        display_order = 60
    )]
    pub password_blocklist_file: Option<PathBuf>,

    /// The algorithm of new password hashes: pbkdf2-sha256 (FIPS-friendly, authd's
    /// fastest, on the lanes engine) or argon2id (OWASP's first choice; written where
    /// authd 0.1 cannot read it, see docs/upgrades.md). A user whose hash is not of
    /// the policy is rehashed at their next successful login.
    #[arg(
        long,
        env = "AUTHD_PASSWORD_HASH",
        default_value = "pbkdf2-sha256",
        value_enum,
        global = true,
        display_order = 99
    )]
    pub password_hash: HashAlgorithm,

    /// Argon2id memory per hash, in KiB (8 to 4194304, at least 8 per lane; OWASP:
    /// 19456, 19 MiB).
    #[arg(long, env = "AUTHD_ARGON2_MEMORY", default_value_t = 19_456,
          value_parser = clap::value_parser!(u32).range(8..=4_194_304), global = true,
          display_order = 100)]
    pub argon2_memory: u32,

    /// Argon2id passes over its memory (1 to 100; OWASP: 2).
    #[arg(long, env = "AUTHD_ARGON2_TIME", default_value_t = 2,
          value_parser = clap::value_parser!(u32).range(1..=100), global = true,
          display_order = 101)]
    pub argon2_time: u32,

    /// Argon2id lanes (1 to 64; OWASP: 1). They change the hash, not its speed: authd
    /// computes the lanes of one hash one after another (the hashing threads are its
    /// parallelism).
    #[arg(long, env = "AUTHD_ARGON2_PARALLELISM", default_value_t = 1,
          value_parser = clap::value_parser!(u32).range(1..=64), global = true,
          display_order = 102)]
    pub argon2_parallelism: u32,

    /// The memory Argon2 hashing may hold at once, in MiB (1 to 1048576): a hash waits
    /// (without holding a thread, until its deadline) while the hashes running would
    /// not leave it room. At least one hash's memory (--argon2-memory), or the start
    /// fails.
    #[arg(long, env = "AUTHD_ARGON2_MEMORY_BUDGET", default_value_t = 256,
          value_parser = clap::value_parser!(u32).range(1..=1_048_576), global = true,
          display_order = 103)]
    pub argon2_memory_budget: u32,
}

impl PasswordConfig {
    /// The engine of --hash-backend with the plan of --hash-kernels, or why this CPU
    /// cannot run it.
    pub fn engine(&self) -> anyhow::Result<pbkdf2_lanes::Engine> {
        let engine = self.hash_backend.engine()?;
        Ok(match &self.hash_kernels {
            HashKernels::Measure => engine.calibrated(),
            HashKernels::Builtin => engine,
            HashKernels::Plan(plan) => engine.with_plan(*plan).map_err(|kernel| {
                anyhow::anyhow!(
                    "--hash-kernels: the {} engine cannot run {kernel} on this CPU",
                    self.hash_backend.name()
                )
            })?,
        })
    }

    /// Hash threads, resolving the default.
    pub fn hash_threads(&self) -> usize {
        match self.hash_threads {
            Some(n) => n as usize,
            None => std::thread::available_parallelism().map_or(1, usize::from),
        }
    }

    /// Starts the hashing threads and builds the hasher of new and stored passwords;
    /// fails when the CPU lacks the engine named, or the threads cannot start.
    pub(crate) fn hasher(&self, metrics: &Metrics) -> anyhow::Result<Hasher> {
        let policy = self.policy()?;
        let engine = self.engine()?;
        let pool = HashPool::new(self.hash_threads(), self.hash_thread_nice, engine, metrics)
            .context("starting the password hashing threads")?
            .with_memory_budget(self.argon2_memory_budget.saturating_mul(1024));
        Hasher::new(policy, pool)
    }

    /// The policy of new hashes; refuses Argon2id parameters the algorithm does not
    /// take, and a memory budget below one Argon2id hash (under either policy: a
    /// PBKDF2 policy still verifies the Argon2id hashes written before it).
    pub fn policy(&self) -> anyhow::Result<Policy> {
        let argon2 = self.argon2_params()?;
        let budget_kib = u64::from(self.argon2_memory_budget) * 1024;
        if budget_kib < u64::from(argon2.memory_kib()) {
            anyhow::bail!(
                "--argon2-memory-budget (AUTHD_ARGON2_MEMORY_BUDGET) of {} MiB is below the \
                 memory of one Argon2id hash (--argon2-memory {} KiB): raise the budget to at \
                 least {} MiB, or lower the memory",
                self.argon2_memory_budget,
                argon2.memory_kib(),
                argon2.memory_kib().div_ceil(1024)
            );
        }
        Ok(match self.password_hash {
            HashAlgorithm::Pbkdf2Sha256 => Policy {
                argon2,
                ..Policy::pbkdf2(self.pbkdf2_iterations)
            },
            HashAlgorithm::Argon2id => Policy::argon2id(argon2, self.pbkdf2_iterations),
        })
    }

    fn argon2_params(&self) -> anyhow::Result<Argon2Params> {
        Argon2Params::new(
            self.argon2_memory,
            self.argon2_time,
            self.argon2_parallelism,
        )
        .context("--argon2-memory, --argon2-time, --argon2-parallelism")
    }

    /// The passwords Register and ChangePassword refuse; a list file that cannot be
    /// read stops the start.
    pub(crate) fn blocklist(&self, metrics: &Metrics) -> anyhow::Result<Blocklist> {
        Blocklist::new(
            self.password_blocklist.is_on(),
            self.password_blocklist_file.as_deref(),
            metrics,
        )
    }

    /// The options of `authd hash-bench`: those given on its command line, the rest
    /// from this configuration (`--pbkdf2-iterations`, `--hash-threads`; under the
    /// argon2id policy, Argon2id at `--argon2-*`).
    pub fn bench_options(
        &self,
        iterations: Option<u32>,
        threads: Option<u32>,
        duration: Duration,
        batch: Option<usize>,
        compare: bool,
    ) -> anyhow::Result<bench::Options> {
        let argon2 = match self.password_hash {
            HashAlgorithm::Pbkdf2Sha256 => None,
            HashAlgorithm::Argon2id => Some(self.argon2_params()?),
        };
        Ok(bench::Options {
            iterations: iterations.unwrap_or(self.pbkdf2_iterations),
            threads: threads.map_or_else(|| self.hash_threads(), |t| t as usize),
            duration,
            batch,
            compare,
            target: None,
            argon2,
        })
    }
}

/// The algorithm of new password hashes (`--password-hash`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum HashAlgorithm {
    /// PBKDF2-HMAC-SHA256 at --pbkdf2-iterations, on the lanes engine.
    #[value(name = "pbkdf2-sha256")]
    Pbkdf2Sha256,
    /// Argon2id at --argon2-memory, --argon2-time, --argon2-parallelism.
    Argon2id,
}

/// Which PBKDF2 kernels hash passwords.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum HashBackend {
    /// The fastest this CPU runs.
    Auto,
    /// x86-64 AVX-512F, sixteen chains per vector, two vectors interleaved per core.
    Avx512,
    /// x86-64 SHA extensions, one to eight chains interleaved per core.
    #[value(name = "sha-ni")]
    ShaNi,
    /// x86-64 AVX2, eight chains per core (for CPUs without SHA extensions).
    Avx2,
    /// One chain at a time on the sha2 crate's compression; runs everywhere.
    Portable,
}

impl HashBackend {
    /// Its name on the command line (clap's, so the two cannot differ).
    pub fn name(self) -> String {
        self.to_possible_value()
            .map(|v| v.get_name().to_owned())
            .unwrap_or_default()
    }

    /// The engine this names, with its built-in plan, or why this CPU cannot run it.
    pub fn engine(self) -> anyhow::Result<pbkdf2_lanes::Engine> {
        use pbkdf2_lanes::{Backend, Engine};
        let backend = match self {
            HashBackend::Auto => return Ok(Engine::detect()),
            HashBackend::Avx512 => Backend::Avx512,
            HashBackend::ShaNi => Backend::ShaNi,
            HashBackend::Avx2 => Backend::Avx2,
            HashBackend::Portable => Backend::Portable,
        };
        Engine::with_backend(backend).ok_or_else(|| {
            anyhow::anyhow!(
                "--hash-backend {}: this CPU does not have the instructions it needs",
                backend.name()
            )
        })
    }
}

/// Where the engine's plan comes from (--hash-kernels).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HashKernels {
    /// Measured at start.
    Measure,
    /// The engine's built-in plan.
    Builtin,
    /// Given.
    Plan(pbkdf2_lanes::Plan),
}

fn parse_hash_kernels(s: &str) -> Result<HashKernels, String> {
    match s.trim() {
        "measure" => Ok(HashKernels::Measure),
        "builtin" => Ok(HashKernels::Builtin),
        plan => plan.parse().map(HashKernels::Plan).map_err(|e| {
            format!("measure, builtin, or a plan such as \"1: sha-ni x1, 2-32: sha-ni x4\": {e}")
        }),
    }
}

/// A feature that is on or off.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Switch {
    On,
    Off,
}

impl Switch {
    pub fn is_on(self) -> bool {
        self == Switch::On
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{Cli, Config};

    #[test]
    fn the_password_blocklist_is_on_by_default_and_takes_on_or_off() {
        let c = Config::defaults().passwords;
        assert_eq!(c.password_blocklist, Switch::On);
        assert_eq!(c.password_blocklist_file, None);
        let parse = |args: &[&str]| Cli::parse_for_test(args).map(|cli| cli.config.passwords);
        let off = parse(&["--password-blocklist", "off"]).unwrap();
        assert_eq!(off.password_blocklist, Switch::Off);
        let err = parse(&["--password-blocklist", "maybe"]).unwrap_err();
        assert!(err.contains("[possible values: on, off]"), "{err}");
        let file = parse(&["--password-blocklist-file", "/etc/authd/blocked.txt"]).unwrap();
        assert_eq!(
            file.password_blocklist_file,
            Some(PathBuf::from("/etc/authd/blocked.txt"))
        );
    }

    #[test]
    fn hash_bench_takes_what_its_command_line_leaves_out_from_the_configuration() {
        let mut c = Config::defaults().passwords;
        c.pbkdf2_iterations = 1000;
        c.hash_threads = Some(3);
        let second = Duration::from_secs(1);
        let options = c.bench_options(None, None, second, None, false).unwrap();
        assert_eq!((options.iterations, options.threads), (1000, 3));
        assert_eq!(options.argon2, None);
        let options = c
            .bench_options(Some(2000), Some(1), second, Some(1), true)
            .unwrap();
        assert_eq!((options.iterations, options.threads), (2000, 1));
        assert_eq!((options.batch, options.compare), (Some(1), true));
        c.password_hash = HashAlgorithm::Argon2id;
        c.argon2_memory = 64;
        let options = c.bench_options(None, None, second, None, false).unwrap();
        assert_eq!(options.argon2, Some(Argon2Params::new(64, 2, 1).unwrap()));
    }

    #[test]
    fn the_hash_policy_defaults_to_pbkdf2_with_owasps_argon2id_beside_it() {
        let c = Config::defaults().passwords;
        assert_eq!(c.password_hash, HashAlgorithm::Pbkdf2Sha256);
        assert_eq!(
            (c.argon2_memory, c.argon2_time, c.argon2_parallelism),
            (19_456, 2, 1)
        );
        assert_eq!(c.argon2_memory_budget, 256);
        let policy = c.policy().unwrap();
        assert_eq!(policy, Policy::pbkdf2(600_000));
        let parse = |args: &[&str]| Cli::parse_for_test(args).map(|cli| cli.config.passwords);
        let argon2 = parse(&["--password-hash", "argon2id", "--argon2-memory", "65536"]).unwrap();
        assert_eq!(
            argon2.policy().unwrap(),
            Policy::argon2id(Argon2Params::new(65_536, 2, 1).unwrap(), 600_000)
        );
        for (args, expected) in [
            (
                &["--password-hash", "scrypt"][..],
                "possible values: pbkdf2-sha256, argon2id",
            ),
            (&["--argon2-memory", "4"], "4 is not in 8..=4194304"),
            (&["--argon2-time", "0"], "0 is not in 1..=100"),
            (&["--argon2-parallelism", "65"], "65 is not in 1..=64"),
            (&["--argon2-memory-budget", "0"], "0 is not in 1..=1048576"),
        ] {
            let err = parse(args).unwrap_err();
            assert!(err.contains(expected), "{args:?}: {err}");
        }
        // Checked together at start: memory per lane, and the budget.
        let lanes = parse(&["--argon2-memory", "16", "--argon2-parallelism", "4"]).unwrap();
        let err = format!("{:#}", lanes.policy().unwrap_err());
        assert!(err.contains("at least 8 KiB per lane"), "{err}");
        let budget = parse(&["--argon2-memory", "65536", "--argon2-memory-budget", "32"]).unwrap();
        let err = budget.policy().unwrap_err().to_string();
        assert!(
            err.contains("32 MiB is below the memory of one Argon2id hash")
                && err.contains("at least 64 MiB"),
            "{err}"
        );
    }
}
