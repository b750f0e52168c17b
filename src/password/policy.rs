//! The policy of new hashes: PBKDF2-SHA256 on the lanes engine (the default:
//! FIPS-friendly, and authd's fastest) or Argon2id (RustCrypto's `argon2`), and
//! Argon2id's side of it: its parameters, the PHC strings it writes, and the
//! parameters read back from a stored one.
//!
//! An Argon2id hash is a PHC string, `$argon2id$v=19$m=M,t=T,p=P$salt$hash` (16
//! random bytes of salt, 32 of output, B64 without padding), as argon2-cffi and
//! the `argon2` crate write and read them. The releases before this one cannot
//! verify it, so it is stored in `password_hash_ext` behind a marker (`stored`).
//!
//! It computes on the calling thread: the hasher sends the work to the pool,
//! within the memory budget. It knows nothing of users or of the pool.

use anyhow::anyhow;
use base64::{Engine as _, engine::general_purpose::STANDARD_NO_PAD};

/// The algorithm of new hashes (`AUTHD_PASSWORD_HASH`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PolicyAlgorithm {
    Pbkdf2Sha256,
    Argon2id,
}

/// What new hashes are: the algorithm, and the cost of each algorithm. The PBKDF2
/// cost also sets the cost of the marker beside an Argon2id hash, so that a release
/// that reads only `password_hash` spends on it what it spends on any login.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Policy {
    pub algorithm: PolicyAlgorithm,
    pub pbkdf2_iterations: u32,
    pub argon2: Argon2Params,
}

impl Policy {
    /// PBKDF2-SHA256 at `iterations`, Argon2id's parameters at their defaults.
    pub fn pbkdf2(iterations: u32) -> Self {
        Self {
            algorithm: PolicyAlgorithm::Pbkdf2Sha256,
            pbkdf2_iterations: iterations,
            argon2: Argon2Params::OWASP,
        }
    }

    /// Argon2id at `argon2`; markers at `pbkdf2_iterations`.
    pub fn argon2id(argon2: Argon2Params, pbkdf2_iterations: u32) -> Self {
        Self {
            algorithm: PolicyAlgorithm::Argon2id,
            pbkdf2_iterations,
            argon2,
        }
    }
}

/// Bytes of an Argon2id hash's output and of its salt.
const OUTPUT_BYTES: usize = 32;
const SALT_BYTES: usize = 16;

/// Argon2id's cost: memory in KiB, passes over it, lanes. Lanes are computed one
/// after another on the hashing thread (the pool is the parallelism), so more lanes
/// change the hash, not its speed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Argon2Params {
    memory_kib: u32,
    time: u32,
    parallelism: u32,
}

impl Argon2Params {
    /// OWASP's recommendation (Password Storage Cheat Sheet): m = 19 MiB, t = 2, p = 1.
    pub const OWASP: Self = Self {
        memory_kib: 19 * 1024,
        time: 2,
        parallelism: 1,
    };

    /// Checked as the `argon2` crate checks them (memory at least 8 KiB per lane).
    pub fn new(memory_kib: u32, time: u32, parallelism: u32) -> anyhow::Result<Self> {
        let params = Self {
            memory_kib,
            time,
            parallelism,
        };
        params.crate_params().map_err(|e| {
            anyhow!(
                "invalid Argon2id parameters m={memory_kib} KiB, t={time}, p={parallelism} \
                 (memory must be at least 8 KiB per lane): {e}"
            )
        })?;
        Ok(params)
    }

    pub fn memory_kib(&self) -> u32 {
        self.memory_kib
    }

    pub fn time(&self) -> u32 {
        self.time
    }

    pub fn parallelism(&self) -> u32 {
        self.parallelism
    }

    fn crate_params(&self) -> Result<argon2::Params, argon2::Error> {
        argon2::Params::new(
            self.memory_kib,
            self.time,
            self.parallelism,
            Some(OUTPUT_BYTES),
        )
    }

    /// Hashes `password` with a fresh random salt into a PHC string, on the calling
    /// thread (the caller runs it on the pool).
    pub fn hash(&self, password: &[u8]) -> anyhow::Result<String> {
        let params = self.crate_params().map_err(|e| anyhow!("Argon2id: {e}"))?;
        let mut salt = [0u8; SALT_BYTES];
        rand::fill(&mut salt);
        let mut output = [0u8; OUTPUT_BYTES];
        argon2::Argon2::new(argon2::Algorithm::Argon2id, argon2::Version::V0x13, params)
            .hash_password_into(password, &salt, &mut output)
            .map_err(|e| anyhow!("Argon2id hashing failed: {e}"))?;
        Ok(self.phc(&salt, &output))
    }

    /// A well-formed hash at these parameters that no password matches (random salt,
    /// random output): verifying against it costs what a real verification costs.
    pub fn dummy(&self) -> String {
        let mut salt = [0u8; SALT_BYTES];
        let mut output = [0u8; OUTPUT_BYTES];
        rand::fill(&mut salt);
        rand::fill(&mut output);
        self.phc(&salt, &output)
    }

    fn phc(&self, salt: &[u8], output: &[u8]) -> String {
        format!(
            "$argon2id$v=19$m={},t={},p={}${}${}",
            self.memory_kib,
            self.time,
            self.parallelism,
            STANDARD_NO_PAD.encode(salt),
            STANDARD_NO_PAD.encode(output)
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_defaults_are_owasps_and_bad_parameters_are_refused_with_their_values() {
        assert_eq!(
            (
                Argon2Params::OWASP.memory_kib(),
                Argon2Params::OWASP.time(),
                Argon2Params::OWASP.parallelism()
            ),
            (19_456, 2, 1)
        );
        assert_eq!(
            Argon2Params::new(19_456, 2, 1).unwrap(),
            Argon2Params::OWASP
        );
        let err = Argon2Params::new(16, 1, 4).unwrap_err().to_string();
        assert!(err.contains("m=16 KiB, t=1, p=4"), "{err}");
        assert!(Argon2Params::new(64, 0, 1).is_err());
        assert!(Argon2Params::new(64, 1, 0).is_err());
    }

    #[test]
    fn a_hash_is_a_phc_string_at_the_parameters_and_the_dummy_has_the_same_shape() {
        let params = Argon2Params::new(64, 1, 2).unwrap();
        let hash = params.hash(b"correct horse").unwrap();
        assert!(hash.starts_with("$argon2id$v=19$m=64,t=1,p=2$"), "{hash}");
        let dummy = params.dummy();
        assert!(dummy.starts_with("$argon2id$v=19$m=64,t=1,p=2$"), "{dummy}");
        assert_eq!(hash.len(), dummy.len());
        assert_ne!(hash, params.hash(b"correct horse").unwrap(), "salted");
    }
}
