//! The token options: the keys (given, or in a file re-read while serving), the
//! lifetimes of access tokens and sessions, the audience, the clock skew allowed,
//! how soon a revocation reaches every replica, and the key that names accounts in
//! the login throttle and the audit trail.
//!
//! [`TokenConfig::keys`] loads the key ring (a random one, with a warning, when none
//! is configured); [`TokenConfig::tokens`], [`TokenConfig::sessions`] and
//! [`TokenConfig::account_digest`] build what the accounts take. The only file of
//! the configuration that knows `crate::token` (and its key file); signing and
//! verifying are theirs, not this file's.

use super::parse::{positive_duration, read_secret_file};
use crate::{
    accounts::{ServiceSettings, SessionSettings},
    metrics::Metrics,
    secret::{self, DigestKey},
    throttle::UsernameDigest,
    token::{self, KeyRing, Tokens, keyfile},
};
use clap::{Args, ValueEnum};
use std::{path::PathBuf, time::Duration};

/// Token keys, lifetimes and revocation.
#[derive(Debug, Clone, Args)]
pub struct TokenConfig {
    /// Token keys, comma-separated; the first signs, all verify. Each is KID:BASE64KEY or
    /// KID:hs256:BASE64KEY (HMAC, at least 32 bytes) or KID:ed25519:BASE64 (an Ed25519
    /// private key in PKCS#8 DER); `authd keygen` makes one [default: a random HMAC key,
    /// with a warning].
    #[arg(long, env = "AUTHD_TOKEN_KEYS", hide_env_values = true,
          conflicts_with = "token_keys_file", value_parser = secret::parser::<KeyRing>(),
          global = true, display_order = 40)]
    pub token_keys: Option<KeyRing>,

    /// File holding the token keys in the AUTHD_TOKEN_KEYS format, one or more per line
    /// (blank lines and # comments ignored). Re-read while serving (see
    /// --token-keys-reload): a changed file that parses replaces the ring, one that
    /// does not is refused with an error in the log and the ring in use stays.
    #[arg(long, env = "AUTHD_TOKEN_KEYS_FILE", global = true, display_order = 41)]
    pub token_keys_file: Option<PathBuf>,

    /// How often --token-keys-file is re-read; a new content takes effect at once.
    #[arg(long, env = "AUTHD_TOKEN_KEYS_RELOAD", default_value = "10s",
          value_parser = positive_duration, global = true, display_order = 42)]
    pub token_keys_reload: Duration,

    /// Audience of every token issued (its aud claim), e.g. the name of the services
    /// meant to accept them; several, comma-separated, make aud an array. ValidateToken
    /// checks it only when the request names an audience [default: none; no aud claim].
    #[arg(long, env = "AUTHD_TOKEN_AUDIENCE", value_delimiter = ',',
          value_parser = token_audience, global = true, display_order = 43)]
    pub token_audience: Vec<String>,

    /// Clock skew allowed between the clocks of authd replicas: ValidateToken accepts a
    /// token whose nbf or iat lies this far in the future, or whose exp lies this far in
    /// the past (0s for none, at most 5m).
    #[arg(long, env = "AUTHD_TOKEN_CLOCK_SKEW", default_value = "30s",
          value_parser = clock_skew, global = true, display_order = 44)]
    pub token_clock_skew: Duration,

    /// Lifetime of access tokens (e.g. 5m, 15m, 1h), at most 7d; never past their
    /// session's end. Short, since Refresh issues new ones.
    #[arg(long, env = "AUTHD_TOKEN_TTL", default_value = "15m",
          value_parser = token_ttl, global = true, display_order = 45)]
    pub token_ttl: Duration,

    /// Longest a session lives from its Login, however often it is refreshed (e.g. 12h,
    /// 30d), at most 365d; then the user logs in again.
    #[arg(long, env = "AUTHD_REFRESH_TTL", default_value = "30d",
          value_parser = refresh_ttl, global = true, display_order = 46)]
    pub refresh_ttl: Duration,

    /// How soon every replica refuses the access tokens of a session ended on another
    /// (each polls the database for ended sessions every half of it); at once on the
    /// replica that ended it. At least 10ms.
    #[arg(long, env = "AUTHD_REVOCATION_DELAY", default_value = "1s",
          value_parser = revocation_delay, global = true, display_order = 47)]
    pub revocation_delay: Duration,

    /// Lifetime of the tokens service accounts get (client credentials, token
    /// exchange; docs/service-accounts.md); never longer than --token-ttl (how long
    /// every replica keeps a revocation), a longer value is cut to it.
    #[arg(long, env = "AUTHD_SERVICE_TOKEN_TTL", default_value = "5m",
          value_parser = token_ttl, global = true, display_order = 124)]
    pub service_token_ttl: Duration,

    /// The most service accounts an exchanged token may name in its act claim: 1
    /// lets a service exchange a user's token, 2 lets the service it calls exchange
    /// that one again, and so on (1 to 8).
    #[arg(long, env = "AUTHD_TOKEN_EXCHANGE_MAX_DEPTH", default_value = "2",
          value_parser = clap::value_parser!(u8).range(1..=8), global = true,
          display_order = 125)]
    pub token_exchange_max_depth: u8,

    /// Key of the keyed digest (HMAC-SHA256) that names an account in the login
    /// throttle's Redis keys and in audit events, base64, at least 32 bytes; the same
    /// on every replica. Set it to keep the counts and the audit trail's `account`
    /// stable across token key rotations [default: derived from the signing key].
    #[arg(long, env = "AUTHD_ACCOUNT_DIGEST_KEY", hide_env_values = true,
          conflicts_with = "account_digest_key_file",
          value_parser = secret::parser::<DigestKey>(), global = true, display_order = 66)]
    pub account_digest_key: Option<DigestKey>,

    /// File holding the account digest key (surrounding whitespace ignored), instead
    /// of --account-digest-key: keeps it out of `ps` and the environment. Read at
    /// start.
    #[arg(
        long,
        env = "AUTHD_ACCOUNT_DIGEST_KEY_FILE",
        global = true,
        display_order = 67
    )]
    pub account_digest_key_file: Option<PathBuf>,
}

/// The key ring to start with, and the file it came from (with the digest of the
/// content in use, for the watcher that re-reads it).
pub(crate) struct StartingKeys {
    pub ring: KeyRing,
    pub file: Option<(PathBuf, [u8; 32])>,
}

impl TokenConfig {
    /// The configured key ring, read from the file if one is named; `None` when no
    /// key is configured.
    pub fn key_ring(&self) -> anyhow::Result<Option<KeyRing>> {
        if let Some(ring) = &self.token_keys {
            return Ok(Some(ring.clone()));
        }
        let Some(path) = &self.token_keys_file else {
            return Ok(None);
        };
        keyfile::load(path).map(|(ring, _)| Some(ring))
    }

    /// The key ring to serve with: the configured one, or a random key (with a
    /// warning) when none is configured. The key file is read here rather than by
    /// [`Self::key_ring`]: its watcher needs the digest of the content in use.
    pub(crate) fn keys(&self) -> anyhow::Result<StartingKeys> {
        Ok(match (&self.token_keys, &self.token_keys_file) {
            (Some(keys), _) => StartingKeys {
                ring: keys.clone(),
                file: None,
            },
            (None, Some(path)) => {
                let (ring, digest) = keyfile::load(path)?;
                StartingKeys {
                    ring,
                    file: Some((path.clone(), digest)),
                }
            }
            (None, None) => {
                tracing::warn!(
                    "no token keys configured (AUTHD_TOKEN_KEYS): using a random key; tokens will \
                     not survive a restart and will not be accepted by other replicas"
                );
                StartingKeys {
                    ring: KeyRing::random(),
                    file: None,
                }
            }
        })
    }

    /// The issuer and verifier of access tokens, signing with `ring`.
    pub(crate) fn tokens(
        &self,
        ring: KeyRing,
        metrics: &Metrics,
        clock: std::sync::Arc<dyn crate::clock::Clock>,
    ) -> Tokens {
        Tokens::new(ring, self.token_ttl, metrics)
            .with_audience(&self.token_audience)
            .with_clock_skew(self.token_clock_skew)
            .with_clock(clock)
    }

    /// The lifetimes of sessions and of their access tokens.
    pub(crate) fn sessions(&self) -> SessionSettings {
        SessionSettings {
            refresh_ttl: self.refresh_ttl,
            token_ttl: self.token_ttl,
        }
    }

    /// How service tokens live: never longer than users' tokens, which is how long
    /// every replica keeps a revocation.
    pub(crate) fn services(&self) -> ServiceSettings {
        ServiceSettings {
            token_ttl: self.service_token_ttl.min(self.token_ttl),
            max_actors: usize::from(self.token_exchange_max_depth),
        }
    }

    /// Names accounts in the throttle's Redis keys and in audit events: the account
    /// digest key when one is set, else a key derived from `ring`'s signing key.
    pub(crate) fn account_digest(&self, ring: &KeyRing) -> UsernameDigest {
        match &self.account_digest_key {
            Some(key) => UsernameDigest::from_key(key),
            None => UsernameDigest::new(ring.derive_key(UsernameDigest::LABEL)),
        }
    }

    /// Reads the key named by `--account-digest-key-file`, if any, into
    /// `account_digest_key`.
    pub(super) fn read_secret_file(&mut self) -> anyhow::Result<()> {
        if let Some(path) = &self.account_digest_key_file {
            self.account_digest_key = Some(read_secret_file("--account-digest-key-file", path)?);
        }
        Ok(())
    }
}

/// The algorithm of a new key (`authd keygen --alg`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum KeyAlgorithm {
    /// Ed25519 (JWT alg EdDSA).
    Ed25519,
    /// HMAC-SHA256 (JWT alg HS256).
    Hs256,
}

impl KeyAlgorithm {
    pub fn algorithm(self) -> token::Algorithm {
        match self {
            KeyAlgorithm::Ed25519 => token::Algorithm::EdDsa,
            KeyAlgorithm::Hs256 => token::Algorithm::Hs256,
        }
    }
}

fn token_ttl(s: &str) -> Result<Duration, String> {
    let ttl = positive_duration(s)?;
    if ttl > crate::token::MAX_TTL {
        return Err(format!(
            "must be at most {} (a token outlives a stolen credential that long at worst)",
            humantime::format_duration(crate::token::MAX_TTL)
        ));
    }
    Ok(ttl)
}

fn refresh_ttl(s: &str) -> Result<Duration, String> {
    let ttl = positive_duration(s)?;
    if ttl > Duration::from_secs(365 * 24 * 3600) {
        return Err("must be at most 365d".into());
    }
    Ok(ttl)
}

fn revocation_delay(s: &str) -> Result<Duration, String> {
    let delay = positive_duration(s)?;
    if delay < Duration::from_millis(10) {
        return Err(
            "must be at least 10ms (each replica polls the database every half of it)".into(),
        );
    }
    Ok(delay)
}

fn clock_skew(s: &str) -> Result<Duration, String> {
    let skew = humantime::parse_duration(s).map_err(|e| format!("{e} (examples: 0s, 30s, 2m)"))?;
    if skew > token::MAX_CLOCK_SKEW {
        return Err(format!(
            "must be at most {}",
            humantime::format_duration(token::MAX_CLOCK_SKEW)
        ));
    }
    Ok(skew)
}

fn token_audience(s: &str) -> Result<String, String> {
    let audience = s.trim();
    if audience.is_empty() || audience.len() > token::MAX_AUDIENCE_BYTES {
        return Err(format!(
            "an audience must be 1 to {} bytes",
            token::MAX_AUDIENCE_BYTES
        ));
    }
    if audience.chars().any(char::is_control) {
        return Err("an audience must not hold control characters".into());
    }
    Ok(audience.to_owned())
}
