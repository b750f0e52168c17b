//! The login throttle: failed logins counted per account, so that guessing a
//! password is slow however many addresses the guesses come from, while the owner
//! of the account is never locked out.
//!
//! Two counts per username (never per *known* username: an unknown one is counted
//! and refused exactly the same way, so the throttle says nothing about which
//! usernames exist):
//! - **per client** (username and the rate limiter's `peer`, the client address):
//!   after `failures` consecutive failures, that client's next attempts for that
//!   username are refused for `delay`, doubling with each further failure up to
//!   `delay_max`. A success resets it.
//! - **per account** (username, all clients): only the first `failures` failures of
//!   each client count here (a client past its own threshold is slowed by its own
//!   count already), so one address alone can never trip it. After
//!   `account_failures` of them, attempts from every client are refused for `delay`,
//!   doubling up to the short `account_delay_max`: a distributed attack is slowed to
//!   about one guess per `account_delay_max`, and the owner, told when to retry, gets
//!   in. A client that logged in successfully for that username within
//!   [`KNOWN_CLIENT_FOR`] is not held by the account count at all (only by its own),
//!   so an attack from elsewhere never keeps the owner out of an account from the
//!   addresses they use.
//!
//! A throttled attempt is refused before any hashing or database work, whatever its
//! password. Nothing is ever locked for good: every count is forgotten
//! `delay_max` after its last failure has stopped delaying.
//!
//! The counts live in Redis when `AUTHD_REDIS_URL` is set (shared by every replica,
//! under the rate limiter's key prefix, each key expiring), else in process
//! ([`local`], bounded by `max_entries`). Redis failures follow the rate limiter's
//! rule: fail open (to the in-process counts) or closed (UNAVAILABLE).
//! Usernames never appear in keys: they are keyed digests ([`UsernameDigest`]).

mod local;
mod redis;

use crate::{
    credentials::Username, error::Error, metrics::ThrottleMetrics, ratelimit::FailureMode,
    shared_redis::SharedRedis,
};
use hmac::{KeyInit, Mac};
use std::{
    net::IpAddr,
    sync::Arc,
    time::{Duration, SystemTime, UNIX_EPOCH},
};

/// How long a client that logged in successfully stays exempt from the account
/// count for that username.
pub const KNOWN_CLIENT_FOR: Duration = Duration::from_secs(30 * 24 * 3600);

/// Everything the throttle needs from the configuration.
#[derive(Debug, Clone)]
pub struct Settings {
    /// Consecutive failures of one client before it is delayed; 0 turns the throttle off.
    pub failures: u32,
    /// The first delay; each further failure doubles it.
    pub delay: Duration,
    /// The longest delay of one client.
    pub delay_max: Duration,
    /// Counted failures across all clients before every client (but known ones) is delayed.
    pub account_failures: u32,
    /// The longest delay of the account count.
    pub account_delay_max: Duration,
    /// Most entries the in-process counts keep.
    pub max_entries: usize,
    /// The Redis that holds the counts of every replica; `None`: per replica only.
    pub redis: Option<Arc<SharedRedis>>,
    pub prefix: String,
    pub redis_timeout: Duration,
    pub failure: FailureMode,
}

impl Settings {
    pub fn enabled(&self) -> bool {
        self.failures > 0
    }

    /// The delay owed after `count` failures against `threshold`: none below it, then
    /// `delay`, doubling per failure, at most `max`.
    fn delay_after(&self, count: u32, threshold: u32, max: Duration) -> Option<Duration> {
        let beyond = count.checked_sub(threshold)?;
        let factor = 1u32.checked_shl(beyond.min(31)).unwrap_or(u32::MAX);
        Some(self.delay.saturating_mul(factor).min(max))
    }

    /// How long a count is kept after its last failure: past any delay it can
    /// impose, plus `delay_max` of memory; never shorter than the account count's
    /// (`account_delay_max` is at most `delay_max`), so a lone client cannot feed
    /// the account count again after its own count expired.
    fn pair_ttl(&self) -> Duration {
        self.delay_max.saturating_mul(2)
    }

    fn account_ttl(&self) -> Duration {
        self.account_delay_max.saturating_add(self.delay_max)
    }
}

/// Which count refused an attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    /// This client's failures for this username.
    Client,
    /// The username's failures across clients.
    Account,
}

impl Scope {
    pub fn label(self) -> &'static str {
        match self {
            Scope::Client => "client",
            Scope::Account => "account",
        }
    }

    /// The `QuotaFailure` subject a client is shown.
    pub fn subject(self) -> &'static str {
        match self {
            Scope::Client => "login-throttle:client",
            Scope::Account => "login-throttle:account",
        }
    }
}

/// A keyed digest of a username: what keys and audit events carry instead of it
/// (people type their password into the username field).
#[derive(Clone)]
pub struct UsernameDigest {
    key: [u8; 32],
}

impl UsernameDigest {
    /// What the digest key is derived for (from the signing key, or from
    /// `--account-digest-key`).
    pub const LABEL: &str = "authd username digest v1";

    pub fn new(key: [u8; 32]) -> Self {
        Self { key }
    }

    /// The digest under a key of its own (`--account-digest-key`), the same on every
    /// replica given it, whatever their token keys.
    pub fn from_key(key: &crate::secret::DigestKey) -> Self {
        let mut mac = <hmac::Hmac<sha2::Sha256> as KeyInit>::new_from_slice(key.expose())
            .expect("HMAC takes any key length");
        mac.update(Self::LABEL.as_bytes());
        Self::new(mac.finalize().into_bytes().into())
    }

    /// 128 bits of HMAC-SHA256, as hex.
    pub fn of(&self, username: &Username) -> String {
        let mut mac = <hmac::Hmac<sha2::Sha256> as KeyInit>::new_from_slice(&self.key)
            .expect("HMAC takes any key length");
        mac.update(username.as_str().as_bytes());
        let out = mac.finalize().into_bytes();
        out[..16].iter().map(|b| format!("{b:02x}")).collect()
    }
}

/// The state of one count, as both backends store it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Count {
    pub failures: u32,
    /// When the last failure was counted, in ms since the epoch.
    pub last_ms: u64,
}

/// What a backend read for one attempt.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Snapshot {
    pub pair: Count,
    pub account: Count,
    /// The client logged in for this username within [`KNOWN_CLIENT_FOR`].
    pub known: bool,
}

/// The keys of one attempt (the same strings in both backends, under the prefix in Redis).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Keys {
    pub pair: String,
    pub account: String,
    pub known: String,
}

impl Keys {
    fn new(digest: &str, client: Option<IpAddr>) -> Self {
        let client = client.map_or_else(|| "unknown".to_owned(), |ip| ip.to_string());
        Keys {
            pair: format!("login:c:{digest}:{client}"),
            account: format!("login:a:{digest}"),
            known: format!("login:k:{digest}:{client}"),
        }
    }
}

/// The clock of the counts: ms since the epoch (the replica's clock; replicas
/// sharing Redis should run NTP, as delays are seconds to minutes).
pub(crate) trait Clock: Send + Sync {
    fn now_ms(&self) -> u64;
}

struct SystemClock;

impl Clock for SystemClock {
    fn now_ms(&self) -> u64 {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
    }
}

/// One login attempt, between its check and its outcome.
pub struct Attempt {
    keys: Keys,
    /// The check read the in-process counts (no Redis, or Redis failed): the
    /// outcome is recorded there too.
    local: bool,
}

pub struct Throttle {
    settings: Settings,
    digest: UsernameDigest,
    local: local::LocalCounts,
    redis: Option<redis::RedisCounts>,
    clock: Arc<dyn Clock>,
    metrics: ThrottleMetrics,
}

impl Throttle {
    pub(crate) fn new(
        settings: Settings,
        digest: UsernameDigest,
        metrics: ThrottleMetrics,
    ) -> anyhow::Result<Arc<Self>> {
        Self::with_clock(settings, digest, metrics, Arc::new(SystemClock))
    }

    pub(crate) fn with_clock(
        settings: Settings,
        digest: UsernameDigest,
        metrics: ThrottleMetrics,
        clock: Arc<dyn Clock>,
    ) -> anyhow::Result<Arc<Self>> {
        let redis = match (&settings.redis, settings.enabled()) {
            (Some(shared), true) => Some(redis::RedisCounts::new(
                shared.clone(),
                &settings.prefix,
                settings.redis_timeout,
            )),
            _ => None,
        };
        Ok(Arc::new(Throttle {
            local: local::LocalCounts::new(settings.max_entries),
            settings,
            digest,
            redis,
            clock,
            metrics,
        }))
    }

    /// Connects to Redis, when configured, waiting at most its timeout (at start;
    /// afterwards the connection is retried in the background).
    pub async fn connect(&self) {
        if let Some(redis) = &self.redis {
            redis.connect().await;
        }
    }

    /// Counts a login attempt by outcome (`authd_logins_total`).
    pub(crate) fn count_login(&self, outcome: crate::metrics::LoginOutcome) {
        self.metrics.logins[outcome as usize].inc();
    }

    pub fn settings(&self) -> &Settings {
        &self.settings
    }

    pub fn digest(&self) -> &UsernameDigest {
        &self.digest
    }

    /// Decides whether an attempt for `username` from `client` may go on to hashing.
    /// `Ok(None)` when the throttle is off; `Err(Error::Throttled)` when refused.
    pub async fn check(
        &self,
        username: &Username,
        client: Option<IpAddr>,
    ) -> Result<Option<Attempt>, Error> {
        if !self.settings.enabled() {
            return Ok(None);
        }
        let keys = Keys::new(&self.digest.of(username), client);
        let (snapshot, local) = self.read(&keys).await?;
        let now = self.clock.now_ms();
        if let Some((scope, wait)) = self.refusal(&snapshot, now) {
            self.metrics.refusals[scope as usize].inc();
            return Err(Error::Throttled {
                scope,
                retry_after: wait,
            });
        }
        Ok(Some(Attempt { keys, local }))
    }

    /// Records a wrong password (or an unknown username) for an attempt that was checked.
    pub async fn failed(&self, attempt: &Attempt) {
        let now = self.clock.now_ms();
        let threshold = self.settings.failures;
        if !attempt.local
            && let Some(redis) = &self.redis
        {
            match redis
                .record_failure(&attempt.keys, now, threshold, &self.settings)
                .await
            {
                Ok(()) => return,
                Err(e) => self.redis_failed(&e),
            }
        }
        self.local
            .record_failure(&attempt.keys, now, threshold, &self.settings);
        self.metrics.local_entries.set(self.local.len() as i64);
    }

    /// Records a successful login: the client's count is reset and it becomes known.
    pub async fn succeeded(&self, attempt: &Attempt) {
        let now = self.clock.now_ms();
        if !attempt.local
            && let Some(redis) = &self.redis
        {
            match redis.record_success(&attempt.keys).await {
                Ok(()) => return,
                Err(e) => self.redis_failed(&e),
            }
        }
        self.local.record_success(&attempt.keys, now);
        self.metrics.local_entries.set(self.local.len() as i64);
    }

    /// Reads the counts of an attempt: from Redis when configured and answering, else
    /// in process (fail open) or not at all (fail closed). The flag says which.
    async fn read(&self, keys: &Keys) -> Result<(Snapshot, bool), Error> {
        if let Some(redis) = &self.redis {
            match redis.read(keys, self.clock.now_ms()).await {
                Ok(snapshot) => {
                    self.metrics.fallback_active.set(0);
                    return Ok((snapshot, false));
                }
                Err(e) => {
                    self.redis_failed(&e);
                    if self.settings.failure == FailureMode::Closed {
                        return Err(Error::Unavailable(
                            "login attempts cannot be counted while Redis does not answer".into(),
                        ));
                    }
                    self.metrics.fallback_active.set(1);
                }
            }
        }
        Ok((self.local.read(keys, self.clock.now_ms()), true))
    }

    fn redis_failed(&self, why: &redis::RedisCountsError) {
        self.metrics.redis_errors.inc();
        tracing::warn!(error = %why, "the login throttle's Redis call failed");
    }

    /// Whether the counts refuse an attempt now, and for how long.
    fn refusal(&self, s: &Snapshot, now: u64) -> Option<(Scope, Duration)> {
        let s_ = &self.settings;
        let wait = |count: &Count, threshold: u32, max: Duration| {
            let delay = s_.delay_after(count.failures, threshold, max)?;
            let until = count
                .last_ms
                .saturating_add(u64::try_from(delay.as_millis()).unwrap_or(u64::MAX));
            (until > now).then(|| Duration::from_millis(until - now))
        };
        if let Some(w) = wait(&s.pair, s_.failures, s_.delay_max) {
            return Some((Scope::Client, w));
        }
        if !s.known
            && let Some(w) = wait(&s.account, s_.account_failures, s_.account_delay_max)
        {
            return Some((Scope::Account, w));
        }
        None
    }
}

/// Whether a failure with the client's new count counts for the account too: only
/// a client's first `threshold` consecutive failures do.
fn counts_for_account(pair_failures: u32, threshold: u32) -> bool {
    pair_failures <= threshold
}

fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::Metrics;
    use std::sync::atomic::{AtomicU64, Ordering};

    struct ManualClock(AtomicU64);

    impl Clock for ManualClock {
        fn now_ms(&self) -> u64 {
            self.0.load(Ordering::SeqCst)
        }
    }

    impl ManualClock {
        fn advance(&self, d: Duration) {
            self.0.fetch_add(ms(d), Ordering::SeqCst);
        }
    }

    fn settings() -> Settings {
        Settings {
            failures: 3,
            delay: Duration::from_secs(1),
            delay_max: Duration::from_secs(60),
            account_failures: 7,
            account_delay_max: Duration::from_secs(10),
            max_entries: 1000,
            redis: None,
            prefix: "t:".into(),
            redis_timeout: Duration::from_millis(100),
            failure: FailureMode::Open,
        }
    }

    fn throttle(s: Settings) -> (Arc<Throttle>, Arc<ManualClock>) {
        let clock = Arc::new(ManualClock(AtomicU64::new(1_800_000_000_000)));
        let metrics = Metrics::new();
        let t = Throttle::with_clock(
            s,
            UsernameDigest::new([7; 32]),
            metrics.throttle.clone(),
            clock.clone(),
        )
        .unwrap();
        (t, clock)
    }

    fn user(name: &str) -> Username {
        Username::parse(name).unwrap()
    }

    fn ip(s: &str) -> Option<IpAddr> {
        Some(s.parse().unwrap())
    }

    /// Fails once from `client`, or returns the refusal.
    async fn fail(t: &Throttle, name: &str, client: &str) -> Result<(), (Scope, Duration)> {
        match t.check(&user(name), ip(client)).await {
            Ok(Some(a)) => {
                t.failed(&a).await;
                Ok(())
            }
            Ok(None) => Ok(()),
            Err(Error::Throttled { scope, retry_after }) => Err((scope, retry_after)),
            Err(e) => panic!("{e}"),
        }
    }

    #[tokio::test]
    async fn a_client_is_delayed_after_its_threshold_and_the_delay_doubles() {
        let (t, clock) = throttle(settings());
        for _ in 0..3 {
            fail(&t, "alice", "10.0.0.1").await.unwrap();
        }
        let s = Duration::from_secs;
        assert_eq!(
            fail(&t, "alice", "10.0.0.1").await,
            Err((Scope::Client, s(1)))
        );
        clock.advance(s(1));
        fail(&t, "alice", "10.0.0.1").await.unwrap();
        assert_eq!(
            fail(&t, "alice", "10.0.0.1").await,
            Err((Scope::Client, s(2)))
        );
        clock.advance(s(2));
        fail(&t, "alice", "10.0.0.1").await.unwrap();
        assert_eq!(
            fail(&t, "alice", "10.0.0.1").await,
            Err((Scope::Client, s(4)))
        );
        // Up to the maximum, never beyond, and never for good.
        for _ in 0..10 {
            clock.advance(s(60));
            fail(&t, "alice", "10.0.0.1").await.unwrap();
        }
        assert_eq!(
            fail(&t, "alice", "10.0.0.1").await,
            Err((Scope::Client, s(60)))
        );
        clock.advance(s(60));
        assert!(t.check(&user("alice"), ip("10.0.0.1")).await.is_ok());
    }

    #[tokio::test]
    async fn a_success_resets_the_client_count() {
        let (t, _clock) = throttle(settings());
        fail(&t, "bob", "10.0.0.1").await.unwrap();
        fail(&t, "bob", "10.0.0.1").await.unwrap();
        let a = t
            .check(&user("bob"), ip("10.0.0.1"))
            .await
            .unwrap()
            .unwrap();
        t.succeeded(&a).await;
        for _ in 0..3 {
            fail(&t, "bob", "10.0.0.1").await.unwrap();
        }
        assert!(fail(&t, "bob", "10.0.0.1").await.is_err());
    }

    #[tokio::test]
    async fn one_address_never_trips_the_account_count() {
        let (t, clock) = throttle(settings());
        // Hours of one attacker: only its first three failures count for the account.
        for _ in 0..200 {
            let _ = fail(&t, "carol", "10.0.0.66").await;
            clock.advance(Duration::from_secs(30));
        }
        assert!(t.check(&user("carol"), ip("10.0.0.2")).await.is_ok());
    }

    #[tokio::test]
    async fn many_addresses_trip_the_account_count_but_not_for_a_known_client() {
        let (t, clock) = throttle(settings());
        // The owner logged in from .2 yesterday.
        let a = t
            .check(&user("dave"), ip("10.0.0.2"))
            .await
            .unwrap()
            .unwrap();
        t.succeeded(&a).await;
        clock.advance(Duration::from_secs(86_400));
        for i in 0..7 {
            fail(&t, "dave", &format!("10.1.0.{i}")).await.unwrap();
        }
        // A fresh address is held by the account count, for at most its short maximum.
        let (scope, wait) = fail(&t, "dave", "10.2.0.1").await.unwrap_err();
        assert_eq!((scope, wait), (Scope::Account, Duration::from_secs(1)));
        // The owner's address is not.
        assert!(t.check(&user("dave"), ip("10.0.0.2")).await.is_ok());
        // The account delay doubles but stays short.
        for i in 0..20 {
            clock.advance(Duration::from_secs(10));
            fail(&t, "dave", &format!("10.3.0.{i}")).await.unwrap();
        }
        let (scope, wait) = fail(&t, "dave", "10.4.0.1").await.unwrap_err();
        assert_eq!((scope, wait), (Scope::Account, Duration::from_secs(10)));
    }

    #[tokio::test]
    async fn usernames_are_counted_apart_and_unknown_ones_alike() {
        let (t, _clock) = throttle(settings());
        for _ in 0..3 {
            fail(&t, "erin", "10.0.0.1").await.unwrap();
        }
        assert!(fail(&t, "erin", "10.0.0.1").await.is_err());
        assert!(t.check(&user("frank"), ip("10.0.0.1")).await.is_ok());
        // The throttle never looks a username up: "erin" may or may not exist.
    }

    #[tokio::test]
    async fn zero_failures_turns_it_off() {
        let (t, _clock) = throttle(Settings {
            failures: 0,
            ..settings()
        });
        for _ in 0..50 {
            fail(&t, "gina", "10.0.0.1").await.unwrap();
        }
        assert!(
            t.check(&user("gina"), ip("10.0.0.1"))
                .await
                .unwrap()
                .is_none()
        );
    }

    #[test]
    fn delays_saturate() {
        let s = settings();
        assert_eq!(s.delay_after(2, 3, s.delay_max), None);
        assert_eq!(
            s.delay_after(3, 3, s.delay_max),
            Some(Duration::from_secs(1))
        );
        assert_eq!(s.delay_after(u32::MAX, 3, s.delay_max), Some(s.delay_max));
        assert!(counts_for_account(3, 3) && !counts_for_account(4, 3));
    }

    #[test]
    fn digests_are_keyed_and_hide_the_username() {
        let a = UsernameDigest::new([1; 32]).of(&user("hunter2isme"));
        let b = UsernameDigest::new([2; 32]).of(&user("hunter2isme"));
        assert_ne!(a, b);
        assert_eq!(a.len(), 32);
        assert!(!a.contains("hunter"));
    }
}
