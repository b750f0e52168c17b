//! The caps of `authd admin users import` (docs/migration.md): the highest cost a
//! foreign password hash may have to be imported, one option per parameter. A
//! record whose hash is over any of them is refused with its line and the reason,
//! so an imported hash never becomes a CPU or memory bomb at its first login.
//!
//! [`ImportConfig::caps`] builds the caps the admin service checks records against;
//! the defaults are `foreign::Caps::default()`.

use crate::password::foreign::Caps;
use clap::Args;

/// The import's caps on foreign hashes' parameters.
#[derive(Debug, Clone, Args)]
pub struct ImportConfig {
    /// Highest bcrypt cost (log2 of its rounds) an imported hash may have; each step
    /// doubles the time of a login.
    #[arg(long, env = "AUTHD_IMPORT_MAX_BCRYPT_COST", default_value_t = Caps::default().bcrypt_cost,
          value_parser = clap::value_parser!(u32).range(4..=31), global = true,
          display_order = 104)]
    pub import_max_bcrypt_cost: u32,

    /// Highest scrypt N·r an imported hash may have (its memory is 128·N·r bytes; the
    /// default, 2^20, is 128 MiB).
    #[arg(long, env = "AUTHD_IMPORT_MAX_SCRYPT_MEMORY",
          default_value_t = Caps::default().scrypt_memory,
          value_parser = clap::value_parser!(u64).range(1..), global = true,
          display_order = 105)]
    pub import_max_scrypt_memory: u64,

    /// Highest scrypt p (parallelism; its time grows with p) an imported hash may have.
    #[arg(long, env = "AUTHD_IMPORT_MAX_SCRYPT_PARALLELISM",
          default_value_t = Caps::default().scrypt_parallelism,
          value_parser = clap::value_parser!(u32).range(1..), global = true,
          display_order = 106)]
    pub import_max_scrypt_parallelism: u32,

    /// Highest Argon2 memory, in KiB, an imported hash may have (the default is 128 MiB).
    #[arg(long, env = "AUTHD_IMPORT_MAX_ARGON2_MEMORY_KIB",
          default_value_t = Caps::default().argon2_memory_kib,
          value_parser = clap::value_parser!(u32).range(8..), global = true,
          display_order = 107)]
    pub import_max_argon2_memory_kib: u32,

    /// Highest Argon2 time cost (passes over its memory) an imported hash may have.
    #[arg(long, env = "AUTHD_IMPORT_MAX_ARGON2_TIME",
          default_value_t = Caps::default().argon2_time,
          value_parser = clap::value_parser!(u32).range(1..), global = true,
          display_order = 108)]
    pub import_max_argon2_time: u32,

    /// Highest Argon2 parallelism (lanes, computed one after another) an imported hash
    /// may have.
    #[arg(long, env = "AUTHD_IMPORT_MAX_ARGON2_LANES",
          default_value_t = Caps::default().argon2_lanes,
          value_parser = clap::value_parser!(u32).range(1..), global = true,
          display_order = 109)]
    pub import_max_argon2_lanes: u32,

    /// Highest PBKDF2 iteration count an imported hash may have (times the blocks of
    /// its output when it is longer than one digest).
    #[arg(long, env = "AUTHD_IMPORT_MAX_PBKDF2_ITERATIONS",
          default_value_t = Caps::default().pbkdf2_iterations,
          value_parser = clap::value_parser!(u32).range(1..), global = true,
          display_order = 110)]
    pub import_max_pbkdf2_iterations: u32,
}

impl ImportConfig {
    /// The caps the admin service checks imported hashes against.
    pub(crate) fn caps(&self) -> Caps {
        Caps {
            bcrypt_cost: self.import_max_bcrypt_cost,
            scrypt_memory: self.import_max_scrypt_memory,
            scrypt_parallelism: self.import_max_scrypt_parallelism,
            argon2_memory_kib: self.import_max_argon2_memory_kib,
            argon2_time: self.import_max_argon2_time,
            argon2_lanes: self.import_max_argon2_lanes,
            pbkdf2_iterations: self.import_max_pbkdf2_iterations,
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::{config::Cli, password::foreign::Caps};

    #[test]
    fn the_default_caps_are_the_foreign_hashes_defaults_and_each_is_its_own_option() {
        let cli = Cli::parse_for_test(&[]).unwrap();
        assert_eq!(cli.config.import.caps(), Caps::default());
        let cli = Cli::parse_for_test(&[
            "--import-max-bcrypt-cost",
            "12",
            "--import-max-pbkdf2-iterations",
            "700000",
        ])
        .unwrap();
        let caps = cli.config.import.caps();
        assert_eq!((caps.bcrypt_cost, caps.pbkdf2_iterations), (12, 700_000));
        assert_eq!(caps.scrypt_memory, Caps::default().scrypt_memory);
        assert!(Cli::parse_for_test(&["--import-max-bcrypt-cost", "40"]).is_err());
    }
}
