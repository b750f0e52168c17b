//! Passwords: the policy of new hashes (PBKDF2-SHA256 by default, or Argon2id),
//! computed on the bounded [`HashPool`].
//!
//! - `pool`: the [`HashPool`] in front of the hashing threads; it knows nothing of
//!   passwords.
//! - `work`: what is sent to those threads (a derivation or a task, its answer) and
//!   why it did not run (`PoolError`).
//! - `worker`: the hashing threads themselves (lanes refilled between kernel
//!   calls, deadlines, padding, priority).
//! - `queue`: the order the threads serve work in (first in, first out).
//! - `budget`: the memory budget of memory-hard work (Argon2): what it may hold at
//!   once, reserved before the work is queued.
//! - `policy`: what new hashes are (the algorithm and its cost), and Argon2id's
//!   parameters and PHC strings.
//! - `bench`: `authd hash-bench`, this machine's hashing rate with this code.
//! - `testing`: the setup the unit tests of `pool` and `worker` share.
//! - `foreign`: hashes made by other systems (PHC, bcrypt, Django, Werkzeug, passlib,
//!   raw columns), parsed within cost caps and verified as they are, never written.
//! - `stored`: which of a user's two hash columns a login verifies (the ext column,
//!   for hashes older releases cannot read, behind a marker they can).
//!
//! [`Hasher`] holds the policy, verifies unknown users against a dummy hash of the
//! policy (PBKDF2 at its cost, or Argon2id at its parameters), and says when a
//! stored hash is not what the policy makes (another algorithm, other parameters)
//! and should be replaced. An Argon2id hash is written to `password_hash_ext`, with
//! a marker at the PBKDF2 cost in `password_hash` (`stored`), since the releases
//! before this one cannot verify it; it runs on the pool within the memory budget,
//! under the same deadline and admission as PBKDF2.
//! A hash imported from another system is verified as it is, and replaced at the
//! first successful login.
//!
//! Timing must not reveal which usernames exist, even while stored hashes have
//! other costs than the current one (after the cost was raised or lowered, until
//! every user has logged in again). So every failed PBKDF2 verification costs the
//! same number of PBKDF2 rounds, T = max(current cost, highest stored cost): a wrong
//! password for a user whose hash has s < T rounds, and the dummy verification of
//! an unknown user, are followed by T − s rounds of PBKDF2 on throwaway input, on
//! the same hashing thread, in the verification's lane as soon as it finishes and
//! before the answer: T rounds of sequential work, as a verification of a T-round hash. A
//! success is not padded (the caller learns nothing from its timing it does not
//! learn from the answer). The highest stored cost comes from the store
//! ([`Hasher::set_highest_stored`]). Argon2id verifications are not padded: under
//! the argon2id policy the dummy is an Argon2id hash at the policy's parameters, so
//! unknown users cost what users hashed at the policy cost; users whose hash is
//! still PBKDF2 (until their first login under the policy) fail at PBKDF2's cost,
//! which timing can tell apart (docs/operations.md).
//!
//! A foreign hash (another system's, behind a marker: `stored`) is verified against
//! the password as the client sent it. Its failure costs at least T too: a
//! PBKDF2-SHA256 one with a 32-byte output runs in the engine and is padded as
//! authd's own (max(its rounds, T)); any other runs in its crate and is followed by
//! T rounds of padding. What timing still tells about imported users is stated in
//! docs/migration.md ("The first login").
//!
//! PBKDF2 hashes are computed by the multi-lane engine (`pbkdf2-lanes`) as raw 32-byte
//! PBKDF2-HMAC-SHA256 outputs and written as the pbkdf2 crate's PHC strings
//! (`$pbkdf2-sha256$i=…,l=32$salt$hash`): hashes made before verify after, and
//! the other way round.

use crate::{
    credentials::{Password, PresentedPassword},
    error::Error,
};
use anyhow::Context as _;
use pbkdf2::{
    Algorithm, Params, Pbkdf2,
    password_hash::{
        PasswordHasher, PasswordVerifier,
        phc::{Output, PasswordHash, Salt},
    },
};
use std::{
    sync::atomic::{AtomicU32, Ordering},
    time::Instant,
};

pub mod bench;
mod budget;
pub mod foreign;
mod policy;
mod pool;
mod queue;
pub mod stored;
#[cfg(test)]
mod testing;
mod work;
mod worker;

pub use policy::{Argon2Params, Policy, PolicyAlgorithm};
pub use pool::{HashPool, PoolSnapshot};

use foreign::{Argon2Variant, Caps, ForeignHash, Scheme};
use stored::Effective;
use work::Derivation;

/// The outcome of checking a password against a stored hash.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Verification {
    pub matches: bool,
    /// The stored hash uses other parameters than the current ones, or is another
    /// system's: replace it.
    pub needs_rehash: bool,
    /// The hash verified was another system's (the ext column): a rehash replaces
    /// a foreign format, not only other parameters.
    pub foreign: bool,
}

/// A new hash as the store writes it: `password_hash`, and the hash the releases
/// before this one cannot verify (Argon2id) in `password_hash_ext`, with a marker in
/// `password_hash` (`stored`). `None` clears the ext column. Its `Debug` shows
/// neither hash.
#[derive(Clone, PartialEq, Eq)]
pub struct NewHash {
    pub password_hash: String,
    pub password_hash_ext: Option<String>,
}

impl std::fmt::Debug for NewHash {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NewHash")
            .field("password_hash_ext", &self.password_hash_ext.is_some())
            .finish_non_exhaustive()
    }
}

/// Hashes and verifies passwords by the policy, on a [`HashPool`].
pub struct Hasher {
    pool: HashPool,
    policy: Policy,
    /// PBKDF2 at the policy's cost: its hashes, and the markers beside Argon2id ones.
    params: Params,
    /// A PBKDF2 hash of nothing, at the current cost, for users that do not exist.
    dummy: String,
    /// Under the argon2id policy, an Argon2id hash of nothing at its parameters:
    /// unknown users are verified against it instead.
    dummy_argon2: Option<String>,
    /// The highest iteration count of any stored hash, as last read from the store.
    highest_stored: AtomicU32,
    /// The highest cost a foreign hash may have, at import and at login alike.
    caps: foreign::Caps,
}

impl Hasher {
    pub fn new(policy: Policy, pool: HashPool) -> anyhow::Result<Self> {
        let iterations = policy.pbkdf2_iterations;
        let params = Params::new(iterations)
            .map_err(|e| anyhow::anyhow!("invalid PBKDF2 iteration count {iterations}: {e}"))?;
        let dummy_argon2 =
            (policy.algorithm == PolicyAlgorithm::Argon2id).then(|| policy.argon2.dummy());
        Ok(Self {
            dummy: dummy_hash(params)?,
            dummy_argon2,
            pool,
            policy,
            params,
            highest_stored: AtomicU32::new(0),
            caps: foreign::Caps::default(),
        })
    }

    /// Bounds every foreign verification by `caps` (the import's, so that a hash
    /// imported under them also verifies under them).
    pub fn with_caps(mut self, caps: foreign::Caps) -> Self {
        self.caps = caps;
        self
    }

    /// What new hashes are.
    pub fn policy(&self) -> Policy {
        self.policy
    }

    pub fn iterations(&self) -> u32 {
        self.params.rounds()
    }

    pub fn pool(&self) -> &HashPool {
        &self.pool
    }

    /// Records the highest iteration count of any stored hash (the store's
    /// `MAX(hash_iterations)`), which raises the cost of a failed login to it.
    pub fn set_highest_stored(&self, iterations: u32) {
        self.highest_stored.store(iterations, Ordering::Relaxed);
    }

    /// The rounds every failed verification costs: the current cost, or the
    /// highest stored one when that is higher.
    pub fn failure_cost(&self) -> u32 {
        self.params
            .rounds()
            .max(self.highest_stored.load(Ordering::Relaxed))
    }

    /// Hashes a password by the policy, with a fresh random salt: a PBKDF2 PHC
    /// string, or an Argon2id one (in the ext column, a marker beside it).
    pub async fn hash(
        &self,
        password: Password,
        deadline: Option<Instant>,
    ) -> Result<NewHash, Error> {
        match self.policy.algorithm {
            PolicyAlgorithm::Pbkdf2Sha256 => Ok(NewHash {
                password_hash: self.hash_pbkdf2(password, deadline).await?,
                password_hash_ext: None,
            }),
            PolicyAlgorithm::Argon2id => {
                let argon2 = self.policy.argon2;
                let counter = self.pool.metrics.argon2.clone();
                let ext = self
                    .pool
                    .run_in_memory(argon2.memory_kib(), deadline, move || {
                        counter.inc();
                        argon2.hash(password.as_bytes())
                    })
                    .await??;
                Ok(NewHash {
                    password_hash: stored::own_marker(self.params.rounds())?,
                    password_hash_ext: Some(ext),
                })
            }
        }
    }

    /// A PBKDF2 PHC string at the policy's cost, computed by the engine.
    async fn hash_pbkdf2(
        &self,
        password: Password,
        deadline: Option<Instant>,
    ) -> Result<String, Error> {
        let mut salt = vec![0u8; SALT_BYTES];
        rand::fill(salt.as_mut_slice());
        let job = Derivation {
            password: password.as_bytes().to_vec(),
            salt: salt.clone(),
            rounds: self.params.rounds(),
        };
        let output = self.pool.derive(deadline, job).await?;
        Ok(phc_string(self.params, &salt, &output)?)
    }

    /// Verifies a presented password against a user's effective hash
    /// ([`stored::effective`]), or against the policy's dummy hash when there is no
    /// user. authd's own hashes (and the dummy) are verified against the password's
    /// NFKC form, a foreign hash (another system's) against the bytes as sent. A
    /// failed PBKDF2 or foreign verification costs at least [`Hasher::failure_cost`]
    /// rounds: the verification, then padding, on the same thread before the
    /// answer. An Argon2id hash of authd's is verified on the pool within the memory
    /// budget. A match asks for a rehash unless the hash is what the policy makes
    /// ([`Hasher::is_current`]).
    pub async fn verify(
        &self,
        password: &PresentedPassword,
        stored: Option<Effective<'_>>,
        deadline: Option<Instant>,
    ) -> Result<Verification, Error> {
        let exists = stored.is_some();
        let stored = stored.unwrap_or(match &self.dummy_argon2 {
            Some(dummy) => Effective::Own(dummy),
            None => Effective::Phc(&self.dummy),
        });
        let matches = match stored {
            Effective::Phc(phc) => {
                (self.verify_pbkdf2(password.normalized(), phc, deadline)).await?
            }
            Effective::Own(ext) => (self.verify_own(password.normalized(), ext, deadline)).await?,
            Effective::Ext(ext) => self.verify_foreign(password, ext, deadline).await?,
        };
        let matches = exists && matches;
        Ok(Verification {
            matches,
            needs_rehash: matches && !self.is_current(stored),
            foreign: matches && matches!(stored, Effective::Ext(_)),
        })
    }

    /// Whether `stored` is what the policy makes now: a PBKDF2-SHA256 hash at its
    /// cost under the PBKDF2 policy, an Argon2id hash of authd's at its parameters
    /// (in the ext column) under the argon2id policy. Anything else (another
    /// system's hash included) is replaced at the next successful login.
    pub fn is_current(&self, stored: Effective<'_>) -> bool {
        match (self.policy.algorithm, stored) {
            (PolicyAlgorithm::Pbkdf2Sha256, Effective::Phc(phc)) => matches!(
                StoredHash::parse(phc),
                Ok(Some(hash)) if hash.rounds == self.params.rounds()
            ),
            (PolicyAlgorithm::Argon2id, Effective::Own(ext)) => {
                let a = self.policy.argon2;
                let prefix = format!(
                    "$argon2id$v=19$m={},t={},p={}$",
                    a.memory_kib(),
                    a.time(),
                    a.parallelism()
                );
                ext.starts_with(&prefix) && ForeignHash::parse_with(ext, &own_caps()).is_ok()
            }
            _ => false,
        }
    }

    /// A PBKDF2 PHC string: on the engine when it is PBKDF2-SHA256 with a 32-byte
    /// output, by the pbkdf2 crate otherwise; padded when it fails.
    async fn verify_pbkdf2(
        &self,
        password: Password,
        phc: &str,
        deadline: Option<Instant>,
    ) -> Result<bool, Error> {
        let Some(stored) = StoredHash::parse(phc)? else {
            // Not a PBKDF2-SHA256 hash with a 32-byte output (not one authd makes):
            // the pbkdf2 crate checks it, on its own, padded all the same.
            return self.verify_other(password, phc.to_owned(), deadline).await;
        };
        let pad = self.failure_cost().saturating_sub(stored.rounds);
        let job = Derivation {
            password: password.as_bytes().to_vec(),
            salt: stored.salt,
            rounds: stored.rounds,
        };
        Ok(self.pool.verify(deadline, job, stored.output, pad).await?)
    }

    /// An Argon2id hash of authd's (the ext column, behind its own marker),
    /// verified by [`ForeignHash`] on a thread of the pool once its memory fits the
    /// budget.
    async fn verify_own(
        &self,
        password: Password,
        ext: &str,
        deadline: Option<Instant>,
    ) -> Result<bool, Error> {
        let hash = ForeignHash::parse_with(ext, &own_caps())
            .map_err(|e| anyhow::anyhow!("a stored Argon2id hash does not parse: {e}"))?;
        let Scheme::Argon2 {
            variant: Argon2Variant::Argon2id,
            memory_kib,
            ..
        } = hash.scheme()
        else {
            return Err(Error::Internal(anyhow::anyhow!(
                "a stored ext hash is not an Argon2id hash"
            )));
        };
        let counter = self.pool.metrics.argon2.clone();
        Ok(self
            .pool
            .run_in_memory(memory_kib, deadline, move || {
                counter.inc();
                hash.verify(password.as_bytes())
            })
            .await?)
    }

    /// A hash made by another system (`foreign`), verified against the password as
    /// sent, on a thread of the pool. A PBKDF2-SHA256 hash of a 32-byte output (the
    /// hashlib digests, Django's, Werkzeug's, passlib's and PHC's) is what the
    /// engine computes: verified in its lanes and padded as authd's own, so a failure
    /// costs max(its rounds, [`Hasher::failure_cost`]). Any other is checked by its
    /// crate (Argon2 and scrypt once their memory fits the budget), and a failure is
    /// followed by the full [`Hasher::failure_cost`] rounds of padding: it never
    /// costs less than an unknown user's.
    async fn verify_foreign(
        &self,
        password: &PresentedPassword,
        ext: &str,
        deadline: Option<Instant>,
    ) -> Result<bool, Error> {
        // The reason names the format and what is wrong, never the hash.
        let hash = ForeignHash::parse_with(ext, &self.caps).map_err(|e| {
            Error::Internal(anyhow::anyhow!(
                "a stored foreign password hash does not parse: {e}"
            ))
        })?;
        let sent = password.as_sent().to_vec();
        if let Some((rounds, salt, output)) = hash.pbkdf2_sha256() {
            let pad = self.failure_cost().saturating_sub(rounds);
            let job = Derivation {
                password: sent,
                salt: salt.to_vec(),
                rounds,
            };
            return Ok(self.pool.verify(deadline, job, output, pad).await?);
        }
        let cost = self.failure_cost();
        let rounds = self.pool.metrics.rounds.clone();
        let memory_kib = match hash.scheme() {
            Scheme::Argon2 { memory_kib, .. } => memory_kib,
            // 128·N·r bytes.
            Scheme::Scrypt { log_n, r, .. } => {
                1u64.checked_shl(log_n.into()).map_or(u32::MAX, |n| {
                    u32::try_from(n.saturating_mul(r.into()) / 8).unwrap_or(u32::MAX)
                })
            }
            _ => 0,
        };
        let work = move || {
            let matches = hash.verify(&sent);
            if !matches {
                pad_now(cost);
                rounds.inc_by(u64::from(cost));
            }
            matches
        };
        Ok(if memory_kib > 0 {
            self.pool.run_in_memory(memory_kib, deadline, work).await?
        } else {
            self.pool.run(deadline, work).await?
        })
    }

    /// A stored hash the engine does not compute (another algorithm or output
    /// length), checked by the pbkdf2 crate on a thread of the pool.
    async fn verify_other(
        &self,
        password: Password,
        phc: String,
        deadline: Option<Instant>,
    ) -> Result<bool, Error> {
        let cost = self.failure_cost();
        let rounds = self.pool.metrics.rounds.clone();
        let matches = self
            .pool
            .run(deadline, move || {
                let (matches, spent) = verify_with_crate(&password, &phc)?;
                rounds.inc_by(u64::from(spent));
                if spent < cost {
                    pad_now(cost - spent);
                    rounds.inc_by(u64::from(cost - spent));
                }
                Ok::<_, Error>(matches)
            })
            .await??;
        Ok(matches)
    }
}

/// The caps of the ext hashes authd wrote itself: none. They are trusted, and the
/// memory budget bounds what they cost; a policy's parameters may be above the caps
/// of imported hashes.
fn own_caps() -> Caps {
    Caps {
        argon2_memory_kib: u32::MAX,
        argon2_time: u32::MAX,
        argon2_lanes: u32::MAX,
        ..Caps::default()
    }
}

/// Random bytes of a new hash's salt (the pbkdf2 crate's default, 16).
const SALT_BYTES: usize = 16;

/// The same padding, computed on the calling thread.
fn pad_now(rounds: u32) {
    let job = work::padding(rounds);
    let engine = pbkdf2_lanes::Engine::with_backend(pbkdf2_lanes::Backend::Portable);
    if let Some(engine) = engine {
        let _ = std::hint::black_box(engine.derive_vec(&[pbkdf2_lanes::Job::new(
            &job.password,
            &job.salt,
            job.rounds,
        )]));
    }
}

/// A PBKDF2-SHA256 PHC string with a 32-byte output, taken apart.
struct StoredHash {
    rounds: u32,
    salt: Vec<u8>,
    output: [u8; 32],
}

impl StoredHash {
    /// `None` for a well-formed hash of another algorithm or output length; an
    /// error for one that does not parse.
    fn parse(phc: &str) -> Result<Option<Self>, Error> {
        let hash: PasswordHash = phc
            .parse()
            .map_err(|e| anyhow::anyhow!("a stored password hash does not parse: {e}"))?;
        let params = Params::try_from(&hash)
            .map_err(|e| anyhow::anyhow!("a stored password hash has invalid parameters: {e}"))?;
        let (Some(salt), Some(output)) = (hash.salt, hash.hash) else {
            return Err(Error::Internal(anyhow::anyhow!(
                "a stored password hash has no salt or no output"
            )));
        };
        if hash.algorithm.as_str() != Algorithm::PBKDF2_SHA256_ID || params.output_len() != 32 {
            return Ok(None);
        }
        let Ok(output) = <[u8; 32]>::try_from(output.as_bytes()) else {
            return Ok(None);
        };
        Ok(Some(StoredHash {
            rounds: params.rounds(),
            salt: salt.as_ref().to_vec(),
            output,
        }))
    }
}

/// The PHC string of a 32-byte PBKDF2-SHA256 output: the format the pbkdf2 crate
/// writes and reads, so hashes made here and there verify on either side.
fn phc_string(params: Params, salt: &[u8], output: &[u8; 32]) -> anyhow::Result<String> {
    let hash = PasswordHash {
        algorithm: Algorithm::Pbkdf2Sha256.into(),
        version: None,
        params: params
            .try_into()
            .map_err(|e| anyhow::anyhow!("encoding PBKDF2 parameters: {e}"))?,
        salt: Some(Salt::new(salt).map_err(|e| anyhow::anyhow!("salt: {e}"))?),
        hash: Some(Output::new(output).map_err(|e| anyhow::anyhow!("output: {e}"))?),
    };
    Ok(hash.to_string())
}

/// Hashes with the pbkdf2 crate on the calling thread (for `hash-bench`'s
/// comparison and for tests that need a hash made by the crate).
pub fn hash_now(password: &Password, params: Params) -> anyhow::Result<String> {
    let hash = Pbkdf2::new(Algorithm::Pbkdf2Sha256, params)
        .hash_password(password.as_bytes())
        .map_err(|e| anyhow::anyhow!("hashing a password failed: {e}"))?;
    Ok(hash.to_string())
}

/// Verifies with the pbkdf2 crate on the calling thread; also returns the rounds it cost.
fn verify_with_crate(password: &Password, phc: &str) -> Result<(bool, u32), Error> {
    let hash: PasswordHash = phc
        .parse()
        .map_err(|e| anyhow::anyhow!("a stored password hash does not parse: {e}"))?;
    let params = Params::try_from(&hash)
        .map_err(|e| anyhow::anyhow!("a stored password hash has invalid parameters: {e}"))?;
    let matches = match Pbkdf2::SHA256.verify_password(password.as_bytes(), &hash) {
        Ok(()) => true,
        Err(pbkdf2::password_hash::Error::PasswordInvalid) => false,
        Err(e) => {
            return Err(Error::Internal(anyhow::anyhow!(
                "verifying against a stored password hash failed: {e}"
            )));
        }
    };
    Ok((matches, params.rounds()))
}

/// A well-formed hash at the current cost that no password matches: random salt and
/// random output. Verifying against it costs exactly what a real verification costs.
fn dummy_hash(params: Params) -> anyhow::Result<String> {
    let mut salt = [0u8; SALT_BYTES];
    let mut output = [0u8; 32];
    rand::fill(&mut salt);
    rand::fill(&mut output);
    phc_string(params, &salt, &output).context("building the dummy hash")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::Metrics;

    fn pw(s: &str) -> Password {
        Password::parse(s).unwrap()
    }

    /// A hasher of `rounds` on `engine`, one thread.
    fn hasher_on(rounds: u32, engine: pbkdf2_lanes::Engine, metrics: &Metrics) -> Hasher {
        let pool = HashPool::new(1, 0, engine, metrics).unwrap();
        Hasher::new(Policy::pbkdf2(rounds), pool).unwrap()
    }

    fn hasher(rounds: u32) -> Hasher {
        hasher_on(rounds, pbkdf2_lanes::Engine::detect(), &Metrics::new())
    }

    async fn hash(hasher: &Hasher, password: &str) -> String {
        let new = hasher.hash(pw(password), None).await.unwrap();
        assert_eq!(new.password_hash_ext, None, "PBKDF2 has no ext hash");
        new.password_hash
    }

    fn presented(s: &str) -> PresentedPassword {
        PresentedPassword::parse(s).unwrap()
    }

    async fn verify(hasher: &Hasher, password: &str, stored: Option<String>) -> Verification {
        let stored = stored.as_deref().map(Effective::Phc);
        hasher
            .verify(&presented(password), stored, None)
            .await
            .unwrap()
    }

    /// Verifies `password` against a user whose columns hold `password_hash` and
    /// `ext`, as a login does.
    async fn verify_columns(
        hasher: &Hasher,
        password: &str,
        password_hash: &str,
        ext: Option<&str>,
    ) -> Result<Verification, Error> {
        let effective = stored::effective(password_hash, ext);
        hasher
            .verify(&presented(password), Some(effective), None)
            .await
    }

    /// The (password, wrong password, hash) of the first fixture of `format` in
    /// tests/fixtures/foreign-hashes (a structured form as its JSON text).
    fn fixture(format: &str) -> (String, String, String) {
        let record = testing::fixtures()
            .into_iter()
            .find(|r| r["format"] == format)
            .unwrap_or_else(|| panic!("no fixture of {format}"));
        let field = |key: &str| record[key].as_str().unwrap().to_owned();
        let hash = match &record["hash"] {
            serde_json::Value::String(hash) => hash.clone(),
            object => object.to_string(),
        };
        (field("password"), field("wrong"), hash)
    }

    /// Small Argon2id parameters: a debug build computes them at once.
    fn small() -> Argon2Params {
        Argon2Params::new(64, 1, 1).unwrap()
    }

    /// A hasher of the argon2id policy at `argon2` (markers at 1,000 rounds) on
    /// `threads` threads.
    fn argon2_hasher(argon2: Argon2Params, threads: usize, metrics: &Metrics) -> Hasher {
        let pool = HashPool::new(threads, 0, pbkdf2_lanes::Engine::detect(), metrics).unwrap();
        Hasher::new(Policy::argon2id(argon2, 1000), pool).unwrap()
    }

    async fn verify_as_stored(hasher: &Hasher, password: &str, new: &NewHash) -> Verification {
        let stored = stored::effective(&new.password_hash, new.password_hash_ext.as_deref());
        hasher
            .verify(&presented(password), Some(stored), None)
            .await
            .unwrap()
    }

    #[tokio::test]
    async fn argon2id_hashes_go_to_the_ext_column_behind_a_marker_and_verify_everywhere() {
        let metrics = Metrics::new();
        let params = Argon2Params::new(256, 2, 2).unwrap();
        let hasher = argon2_hasher(params, 1, &metrics);
        let new = hasher.hash(pw("correct horse"), None).await.unwrap();
        assert!(stored::is_marker(&new.password_hash), "{new:?}");
        assert!(new.password_hash.starts_with("$pbkdf2-sha256$i=1000,l=32$"));
        let ext = new.password_hash_ext.clone().unwrap();
        assert!(ext.starts_with("$argon2id$v=19$m=256,t=2,p=2$"), "{ext}");
        assert_eq!(metrics.hash.argon2.get(), 1);
        assert_eq!(metrics.hash.rounds.get(), 0, "no PBKDF2 for the hash");

        // The argon2 crate's own verifier, and the foreign-hash verifier, agree.
        use argon2::PasswordVerifier as _;
        let crate_verifier = argon2::Argon2::default();
        assert!(
            crate_verifier
                .verify_password(b"correct horse", ext.as_str())
                .is_ok()
        );
        assert!(
            crate_verifier
                .verify_password(b"wrong horse", ext.as_str())
                .is_err()
        );
        let foreign = ForeignHash::parse(&ext).unwrap();
        assert!(foreign.verify(b"correct horse"));
        assert!(!foreign.verify(b"wrong horse"));
        assert!(matches!(
            foreign.scheme(),
            Scheme::Argon2 {
                variant: Argon2Variant::Argon2id,
                version: 0x13,
                memory_kib: 256,
                time: 2,
                lanes: 2,
            }
        ));

        // And the hasher, through the column that counts.
        let ok = verify_as_stored(&hasher, "correct horse", &new).await;
        assert_eq!(
            ok,
            Verification {
                matches: true,
                needs_rehash: false,
                foreign: false,
            }
        );
        assert!(!verify_as_stored(&hasher, "wrong horse", &new).await.matches);
        assert_eq!(metrics.hash.argon2.get(), 3);
        assert_eq!(hasher.pool().memory_budget().in_use_kib(), 0);
    }

    #[tokio::test]
    async fn an_unknown_user_is_verified_against_a_dummy_of_the_policy() {
        let metrics = Metrics::new();
        let hasher = argon2_hasher(small(), 1, &metrics);
        let dummy = hasher.dummy_argon2.clone().unwrap();
        assert!(dummy.starts_with("$argon2id$v=19$m=64,t=1,p=1$"), "{dummy}");
        let v = hasher
            .verify(&presented("anything at all"), None, None)
            .await
            .unwrap();
        assert_eq!(
            v,
            Verification {
                matches: false,
                needs_rehash: false,
                foreign: false,
            }
        );
        // The dummy path ran Argon2id, and no PBKDF2.
        assert_eq!(metrics.hash.argon2.get(), 1);
        assert_eq!(metrics.hash.rounds.get(), 0);
        // Under the PBKDF2 policy, it is PBKDF2 at the policy's cost.
        let metrics = Metrics::new();
        let pbkdf2 = hasher_on(1000, pbkdf2_lanes::Engine::detect(), &metrics);
        assert!(pbkdf2.dummy_argon2.is_none());
        pbkdf2
            .verify(&presented("anything at all"), None, None)
            .await
            .unwrap();
        assert_eq!(metrics.hash.argon2.get(), 0);
        assert_eq!(metrics.hash.rounds.get(), 1000);
    }

    #[tokio::test]
    async fn a_hash_not_of_the_policy_asks_for_a_rehash_either_way() {
        let metrics = Metrics::new();
        let argon2 = argon2_hasher(small(), 1, &metrics);
        let pbkdf2 = hasher_on(1000, pbkdf2_lanes::Engine::detect(), &metrics);
        let other = argon2_hasher(Argon2Params::new(128, 1, 1).unwrap(), 1, &metrics);
        let as_pbkdf2 = pbkdf2.hash(pw("correct horse"), None).await.unwrap();
        let as_argon2 = argon2.hash(pw("correct horse"), None).await.unwrap();
        let as_other = other.hash(pw("correct horse"), None).await.unwrap();
        let rehash = |v: Verification| (v.matches, v.needs_rehash);
        // A PBKDF2 user under the argon2id policy, and the other way round.
        let v = verify_as_stored(&argon2, "correct horse", &as_pbkdf2).await;
        assert_eq!(rehash(v), (true, true));
        let v = verify_as_stored(&pbkdf2, "correct horse", &as_argon2).await;
        assert_eq!(rehash(v), (true, true));
        // Argon2id at other parameters.
        let v = verify_as_stored(&argon2, "correct horse", &as_other).await;
        assert_eq!(rehash(v), (true, true));
        // At the policy: nothing to do; a wrong password asks for nothing.
        let v = verify_as_stored(&argon2, "correct horse", &as_argon2).await;
        assert_eq!(rehash(v), (true, false));
        let v = verify_as_stored(&argon2, "wrong horse", &as_pbkdf2).await;
        assert_eq!(rehash(v), (false, false));
        let ext = as_argon2.password_hash_ext.as_deref().unwrap();
        assert!(argon2.is_current(Effective::Own(ext)));
        assert!(
            !argon2.is_current(Effective::Ext(ext)),
            "another system's hash is replaced"
        );
        assert!(!argon2.is_current(Effective::Phc(&as_pbkdf2.password_hash)));
        assert!(pbkdf2.is_current(Effective::Phc(&as_pbkdf2.password_hash)));
        assert!(!pbkdf2.is_current(Effective::Own(ext)));
    }

    #[tokio::test]
    async fn concurrent_argon2_work_never_holds_more_memory_than_the_budget() {
        use std::sync::{
            Arc, Mutex,
            atomic::{AtomicU32, AtomicUsize},
        };
        let metrics = Metrics::new();
        // Four threads, a budget of two hashes' memory.
        let pool = HashPool::new(4, 0, pbkdf2_lanes::Engine::detect(), &metrics)
            .unwrap()
            .with_memory_budget(2 * 64);
        let budget = pool.memory_budget().clone();
        assert_eq!(metrics.hash.memory_budget.get(), 128 * 1024);
        let started = Arc::new(AtomicUsize::new(0));
        let peak = Arc::new(AtomicU32::new(0));
        let (release_tx, release_rx) = std::sync::mpsc::channel::<()>();
        let release_rx = Arc::new(Mutex::new(release_rx));
        let tasks: Vec<_> = (0..10)
            .map(|_| {
                let (pool, budget, started, peak, release_rx) = (
                    pool.clone(),
                    budget.clone(),
                    started.clone(),
                    peak.clone(),
                    release_rx.clone(),
                );
                tokio::spawn(async move {
                    pool.run_in_memory(64, None, move || {
                        started.fetch_add(1, Ordering::SeqCst);
                        peak.fetch_max(budget.in_use_kib(), Ordering::SeqCst);
                        let _ = release_rx.lock().unwrap().recv();
                        small().hash(b"correct horse").unwrap()
                    })
                    .await
                })
            })
            .collect();
        // Two start; the budget holds the other eight back, not the threads.
        while started.load(Ordering::SeqCst) < 2 {
            tokio::task::yield_now().await;
        }
        assert_eq!(budget.in_use_kib(), 128);
        assert_eq!(metrics.hash.memory_in_use.get(), 128 * 1024);
        assert_eq!(started.load(Ordering::SeqCst), 2);
        assert_eq!(
            pool.queued(),
            0,
            "the others wait for memory, not in the queue"
        );
        for _ in 0..10 {
            release_tx.send(()).unwrap();
        }
        for task in tasks {
            assert!(task.await.unwrap().unwrap().starts_with("$argon2id$"));
        }
        assert_eq!(started.load(Ordering::SeqCst), 10);
        assert_eq!(peak.load(Ordering::SeqCst), 128, "never above the budget");
        assert_eq!(budget.in_use_kib(), 0);
        assert_eq!(metrics.hash.memory_in_use.get(), 0);
    }

    #[tokio::test]
    async fn a_wait_for_the_budget_ends_at_the_deadline() {
        let metrics = Metrics::new();
        let pool = HashPool::new(1, 0, pbkdf2_lanes::Engine::detect(), &metrics)
            .unwrap()
            .with_memory_budget(64);
        let held = pool.memory_budget().reserve(64, None).await.unwrap();
        // Real time: the caller's deadline.
        let past = Instant::now() - std::time::Duration::from_millis(1);
        let err = pool.run_in_memory(64, Some(past), || ()).await.unwrap_err();
        assert_eq!(err, work::PoolError::Expired);
        drop(held);
        // A need above the whole budget takes all of it, and runs.
        pool.run_in_memory(1000, None, || ()).await.unwrap();
        assert_eq!(pool.memory_budget().in_use_kib(), 0);
    }

    #[tokio::test]
    async fn hashes_are_phc_strings_that_verify() {
        let hasher = hasher(1000);
        let phc = hash(&hasher, "correct horse").await;
        assert!(phc.starts_with("$pbkdf2-sha256$i=1000,l=32$"), "{phc}");
        let ok = verify(&hasher, "correct horse", Some(phc.clone())).await;
        assert_eq!(
            ok,
            Verification {
                matches: true,
                needs_rehash: false,
                foreign: false
            }
        );
        let bad = verify(&hasher, "wrong horse", Some(phc)).await;
        assert!(!bad.matches);
    }

    #[tokio::test]
    async fn unknown_users_never_match() {
        let hasher = hasher(1000);
        assert!(hasher.dummy.starts_with("$pbkdf2-sha256$i=1000,l=32$"));
        let v = verify(&hasher, "anything at all", None).await;
        assert_eq!(
            v,
            Verification {
                matches: false,
                needs_rehash: false,
                foreign: false
            }
        );
    }

    #[tokio::test]
    async fn other_parameters_ask_for_a_rehash() {
        let old = hasher(1000);
        let new = hasher(2000);
        let phc = hash(&old, "correct horse").await;
        let v = verify(&new, "correct horse", Some(phc)).await;
        assert_eq!(
            v,
            Verification {
                matches: true,
                needs_rehash: true,
                foreign: false
            }
        );
    }

    #[tokio::test]
    async fn every_failure_costs_the_dearest_stored_hash_and_a_success_is_not_padded() {
        let metrics = Metrics::new();
        let hasher = hasher_on(1000, pbkdf2_lanes::Engine::detect(), &metrics);
        let phc = hash(&hasher, "correct horse").await;
        hasher.set_highest_stored(5000);
        assert_eq!(hasher.failure_cost(), 5000);
        let rounds = || metrics.hash.rounds.get();
        let spent = |before: u64| rounds() - before;
        for (password, stored, expected) in [
            ("wrong horse", Some(phc.clone()), 5000),
            ("wrong horse", None, 5000),
            ("correct horse", None, 5000),
            ("correct horse", Some(phc.clone()), 1000),
        ] {
            let before = rounds();
            verify(&hasher, password, stored).await;
            assert_eq!(spent(before), expected, "{password}");
        }
        // A stored cost below the current one changes nothing.
        hasher.set_highest_stored(10);
        assert_eq!(hasher.failure_cost(), 1000);
    }

    #[tokio::test]
    async fn a_foreign_hash_behind_a_marker_is_verified_as_sent_and_asks_for_a_rehash() {
        let hasher = hasher(1000);
        let marker = stored::marker(1000).unwrap();
        // The first of each: "abc123", 6 characters, below the rules and verified
        // all the same.
        for format in [
            "phc-pbkdf2-sha256",
            "bcrypt-2b",
            "django-pbkdf2-sha256",
            "structured-report-service",
        ] {
            let (password, wrong, hash) = fixture(format);
            let v = verify_columns(&hasher, &password, &marker, Some(&hash)).await;
            let expected = Verification {
                matches: true,
                needs_rehash: true,
                foreign: true,
            };
            assert_eq!(v.unwrap(), expected, "{format}");
            let v = verify_columns(&hasher, &wrong, &marker, Some(&hash)).await;
            assert!(!v.unwrap().matches, "{format}");
        }
        // As sent, never normalized: "e" + U+0301 and the ligature U+FB01 are not
        // their NFKC form to the system that made the hash.
        let sent = "cafe\u{301} \u{FB01}ne";
        let ligature: serde_json::Value = testing::fixtures()
            .into_iter()
            .find(|r| r["password"] == sent && r["format"] == "phc-pbkdf2-sha256")
            .unwrap();
        let hash_of_ligature = ligature["hash"].as_str().unwrap();
        for (password, matches) in [(sent, true), ("caf\u{E9} fine", false)] {
            let v = verify_columns(&hasher, password, &marker, Some(hash_of_ligature)).await;
            assert_eq!(v.unwrap().matches, matches, "{password:?}");
        }
    }

    #[tokio::test]
    async fn the_previous_release_answers_an_imported_user_as_a_wrong_password() {
        let hasher = hasher(1000);
        let marker = stored::marker(1000).unwrap();
        let (password, _, imported) = fixture("bcrypt-2b");
        // This release: the ext column counts while password_hash is a marker.
        let v = verify_columns(&hasher, &password, &marker, Some(&imported)).await;
        assert!(v.unwrap().matches);
        // The previous release reads password_hash alone: the marker, which no
        // password matches, verified as any PBKDF2 hash (a wrong password).
        let v = verify(&hasher, &password, Some(marker.clone())).await;
        assert_eq!(
            v,
            Verification {
                matches: false,
                needs_rehash: false,
                foreign: false
            }
        );
        // A password set the usual way replaces the marker: the ext column is
        // ignored from then on, whatever it holds.
        let own = hash(&hasher, "a new password").await;
        let v = verify_columns(&hasher, &password, &own, Some(&imported)).await;
        assert!(!v.unwrap().matches);
        let v = verify_columns(&hasher, "a new password", &own, Some(&imported)).await;
        assert!(v.unwrap().matches);
    }

    #[tokio::test]
    async fn a_stored_foreign_hash_that_no_longer_parses_is_an_internal_error_that_quotes_nothing()
    {
        let hasher = hasher(1000);
        let marker = stored::marker(1000).unwrap();
        // bcrypt at cost 31: over the cap.
        let over = "$2b$31$abcdefghijklmnopqrstuuNcBwIFtVgBT/BrFsJ3Ugc5m4K2m0Yny";
        for ext in [over, "not a hash at all, secret-salt"] {
            let err = verify_columns(&hasher, "abc123", &marker, Some(ext))
                .await
                .unwrap_err();
            let Error::Internal(cause) = err else {
                panic!("{ext}: {err:?}");
            };
            let text = format!("{cause:#}");
            assert!(
                !text.contains("abcdefghijklmnop") && !text.contains("secret-salt"),
                "{text}"
            );
        }
    }

    #[tokio::test]
    async fn a_failed_foreign_verification_costs_at_least_an_unknown_users() {
        let metrics = Metrics::new();
        let hasher = hasher_on(1000, pbkdf2_lanes::Engine::detect(), &metrics);
        let marker = stored::marker(1000).unwrap();
        hasher.set_highest_stored(5000);
        let rounds = || metrics.hash.rounds.get();
        let (pbkdf2_right, pbkdf2_wrong, pbkdf2) = fixture("phc-pbkdf2-sha256");
        let (bcrypt_right, bcrypt_wrong, bcrypt) = fixture("bcrypt-2b");
        let (sha512_right, sha512_wrong, sha512) = fixture("phc-pbkdf2-sha512");
        // An unknown user: the dummy hash, at the failure cost.
        let before = rounds();
        verify(&hasher, "abc123", None).await;
        assert_eq!(rounds() - before, 5000);
        for (password, hash, expected) in [
            // PBKDF2-SHA256 of 1,000 rounds, in the engine's lanes: padded to 5,000
            // when wrong, as authd's own; its own rounds when right.
            (&pbkdf2_wrong, &pbkdf2, 5000),
            (&pbkdf2_right, &pbkdf2, 1000),
            // Any other scheme: its crate's work (not PBKDF2-SHA256 rounds), then
            // the whole failure cost when wrong; nothing more when right.
            (&bcrypt_wrong, &bcrypt, 5000),
            (&bcrypt_right, &bcrypt, 0),
            (&sha512_wrong, &sha512, 5000),
            (&sha512_right, &sha512, 0),
        ] {
            let before = rounds();
            verify_columns(&hasher, password, &marker, Some(hash))
                .await
                .unwrap();
            assert_eq!(rounds() - before, expected, "{password}: {hash}");
        }
    }

    #[tokio::test]
    async fn hashes_are_interchangeable_with_the_pbkdf2_crate_on_every_backend() {
        use pbkdf2_lanes::{Backend, Engine};
        for backend in Backend::ALL {
            let Some(engine) = Engine::with_backend(backend) else {
                continue;
            };
            let hasher = hasher_on(1000, engine, &Metrics::new());
            // Made by the engine, checked by the crate.
            let ours = hash(&hasher, "correct horse").await;
            assert!(ours.starts_with("$pbkdf2-sha256$i=1000,l=32$"), "{ours}");
            assert_eq!(
                verify_with_crate(&pw("correct horse"), &ours).unwrap(),
                (true, 1000),
                "{backend:?}"
            );
            assert!(!verify_with_crate(&pw("wrong horse"), &ours).unwrap().0);
            // Made by the crate (authd before the engine), checked by the engine.
            let theirs = hash_now(&pw("correct horse"), Params::new(1000).unwrap()).unwrap();
            for (password, expected) in [("correct horse", true), ("wrong horse", false)] {
                let v = verify(&hasher, password, Some(theirs.clone())).await;
                assert_eq!(v.matches, expected, "{backend:?} {password}");
            }
        }
    }
}
