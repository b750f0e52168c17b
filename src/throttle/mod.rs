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
//! - **per account** (username, all clients): until it reaches its threshold, only
//!   the first `failures` failures of each client count here (a client past its own
//!   threshold is slowed by its own count already), so one address alone can never
//!   trip it. After `account_failures` of them, attempts from every client are
//!   refused for `delay`, doubling with every further failure (each counts now) up
//!   to the short `account_delay_max`: a distributed attack is slowed to one guess at
//!   a time, about one per `account_delay_max`, and the owner, told when to retry,
//!   gets in. A client that logged in successfully for that username within
//!   [`KNOWN_CLIENT_FOR`] is not held by the account count at all (only by its own),
//!   so an attack from elsewhere never keeps the owner out of an account from the
//!   addresses they use.
//!
//! A throttled attempt is refused before any hashing, whatever its password (and,
//! when its settled failures refuse it, before any database work). Nothing is ever
//! locked for good: every count is forgotten `delay_max` after its last failure has
//! stopped delaying.
//!
//! **Attempts at once count one by one.** An attempt takes its place in both counts
//! before it hashes ([`Throttle::begin`]), in one step with the decision (one
//! Redis script, or one lock in process); an attempt in flight counts as a failure
//! until it settles ([`Attempt::failed`], [`Attempt::succeeded`], or dropped: its
//! place given back uncounted). Where the settled failures and those in flight
//! reach a threshold, a new attempt waits for the ones in flight (woken at once on
//! this replica, asking Redis again every few ms for the others): refused if they
//! failed, let on if they succeeded, so the owner's logins at once all succeed.
//!
//! The counts live in Redis when `AUTHD_REDIS_URL` is set (shared by every replica,
//! under the rate limiter's key prefix, each key expiring), else in process
//! ([`local`], bounded by `max_entries`). Redis failures follow the rate limiter's
//! rule: fail open (to the in-process counts) or closed (UNAVAILABLE).
//! Usernames never appear in keys: they are keyed digests ([`UsernameDigest`]).
//!
//! One job per file: `rule` (what the counts decide), `keys` (what they are kept
//! under), `digest` (the username's digest), `local` and `redis` (the backends);
//! here, the settings and an attempt's life (begin, wait, settle).

mod digest;
mod keys;
mod local;
mod redis;
mod rule;

use crate::{
    clock::Clock,
    credentials::Username,
    error::Error,
    metrics::ThrottleMetrics,
    redis::{FailureMode, RedisFailure, SharedRedis},
};
use std::{
    net::IpAddr,
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};
use tokio::sync::Notify;

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
}

/// What a refusal says was counted (defined with the error that carries it).
pub use crate::error::Counted;
/// Which count refused an attempt (defined with the error that carries it).
pub use crate::error::ThrottleScope as Scope;
pub use digest::UsernameDigest;
pub(crate) use keys::Keys;
#[cfg(test)]
pub(crate) use rule::test_settings;
pub(crate) use rule::{Count, Decision, View};

/// How an attempt ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// A wrong password or an unknown username: counted.
    Failed,
    /// The right password: the client's count is reset, the client becomes known.
    Succeeded,
    /// No verdict on the password (the hash queue was full, the database failed,
    /// the client went away): the place is given back, nothing is counted.
    Released,
}

/// How long a reservation in Redis holds if its replica never settles it (the
/// replica died mid-attempt): longer than any attempt takes (its hash queue wait,
/// its hash and its store write are each bounded by seconds).
pub(crate) const LEASE: Duration = Duration::from_secs(30);
/// The longest an attempt waits for attempts in flight before it is refused.
pub const MAX_WAIT: Duration = Duration::from_secs(10);
/// How often a waiting attempt asks again at first (settlements on this replica
/// wake it at once; those of other replicas are seen when it asks), doubling up
/// to [`LAST_POLL`].
const FIRST_POLL: Duration = Duration::from_millis(5);
const LAST_POLL: Duration = Duration::from_millis(100);
/// Waiters are woken by username digest, in this many groups.
const WAKER_SHARDS: usize = 64;

/// What [`Throttle::begin`] gave: a place, or a wait for one.
#[derive(Debug)]
pub enum Begun {
    Held(Attempt),
    Waiting(Waiting),
}

impl Begun {
    /// The attempt's place: at once, or once the attempts in flight it waits for
    /// have settled. If they failed, it is refused (as it would have been had it
    /// come after them); if they succeeded (the owner logging in several times at
    /// once), it goes on. A wait ends at the request's deadline, and at most after
    /// [`MAX_WAIT`].
    pub async fn place(self) -> Result<Attempt, Error> {
        match self {
            Begun::Held(attempt) => Ok(attempt),
            Begun::Waiting(waiting) => waiting.place().await,
        }
    }
}

/// An attempt waiting for a place.
pub struct Waiting {
    throttle: Arc<Throttle>,
    keys: Keys,
    /// What these keys count, for the refusal's words.
    counted: Counted,
    id: String,
    give_up: Instant,
    deadline: Option<Instant>,
}

impl std::fmt::Debug for Waiting {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Waiting")
            .field("id", &self.id)
            .finish_non_exhaustive()
    }
}

/// What one ask for a place came to, short of a refusal.
enum Asked {
    Placed(Attempt),
    /// Attempts in flight fill this count: wait for them.
    Wait(Waiting, Scope),
}

impl Waiting {
    /// Asks the counts once.
    async fn ask(self) -> Result<Asked, Error> {
        let (decision, held) = self.throttle.reserve(&self.keys, &self.id).await?;
        match decision {
            Decision::Reserved { account } => Ok(Asked::Placed(Attempt {
                throttle: self.throttle,
                keys: self.keys,
                id: self.id,
                held,
                account,
                settled: false,
            })),
            Decision::Refused(scope, wait) => {
                self.throttle.metrics.refusals[scope as usize].inc();
                Err(Error::Throttled {
                    scope,
                    retry_after: wait,
                    counted: self.counted,
                })
            }
            Decision::Wait(scope) => Ok(Asked::Wait(self, scope)),
        }
    }

    async fn place(mut self) -> Result<Attempt, Error> {
        let mut pause = FIRST_POLL;
        loop {
            // Listening before asking: a settlement between the two still wakes it.
            let throttle = self.throttle.clone();
            let settled = throttle.wakers[self.keys.shard].notified();
            tokio::pin!(settled);
            settled.as_mut().enable();
            let scope = match self.ask().await? {
                Asked::Placed(attempt) => return Ok(attempt),
                Asked::Wait(waiting, scope) => {
                    self = waiting;
                    scope
                }
            };
            // Real time, not the clock's: how long this request has been held waiting
            // for the attempts in flight (and its caller's deadline), not a delay.
            let now = Instant::now();
            if now >= self.give_up {
                if self.deadline.is_some_and(|d| now >= d) {
                    return Err(Error::DeadlineExceeded);
                }
                throttle.metrics.refusals[scope as usize].inc();
                return Err(Error::Throttled {
                    scope,
                    retry_after: throttle.settings.delay,
                    counted: self.counted,
                });
            }
            let _ = tokio::time::timeout(pause.min(self.give_up - now), settled).await;
            pause = (pause * 2).min(LAST_POLL);
        }
    }
}

/// Where an attempt's reservation lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Held {
    Local,
    Redis,
}

/// One login attempt, between its reservation and its outcome. It holds a place
/// in the counts from [`Throttle::begin`] until [`Attempt::failed`] or
/// [`Attempt::succeeded`]; dropped without either (the request failed for another
/// reason, or was cancelled), it gives the place back uncounted.
pub struct Attempt {
    throttle: Arc<Throttle>,
    keys: Keys,
    /// Unique across replicas: the member of the Redis reservation sets.
    id: String,
    held: Held,
    /// The attempt holds a place in the account's count too.
    account: bool,
    settled: bool,
}

impl std::fmt::Debug for Attempt {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Attempt")
            .field("id", &self.id)
            .field("held", &self.held)
            .field("account", &self.account)
            .finish_non_exhaustive()
    }
}

impl Attempt {
    /// Records a wrong password (or an unknown username).
    pub async fn failed(mut self) {
        self.settled = true;
        self.throttle.settle(&self, Outcome::Failed).await;
    }

    /// Records a successful login: the client's count is reset and it becomes known.
    pub async fn succeeded(mut self) {
        self.settled = true;
        self.throttle.settle(&self, Outcome::Succeeded).await;
    }
}

impl Drop for Attempt {
    fn drop(&mut self) {
        if self.settled {
            return;
        }
        match self.held {
            Held::Local => self.throttle.settle_local(self, Outcome::Released),
            // Drop cannot wait for Redis: the release runs on its own (without a
            // runtime, the lease frees the place).
            Held::Redis => {
                if let Ok(runtime) = tokio::runtime::Handle::try_current() {
                    let release = Attempt {
                        throttle: self.throttle.clone(),
                        keys: self.keys.clone(),
                        id: std::mem::take(&mut self.id),
                        held: self.held,
                        account: self.account,
                        settled: true,
                    };
                    runtime.spawn(async move {
                        release.throttle.settle(&release, Outcome::Released).await;
                    });
                }
            }
        }
    }
}

pub struct Throttle {
    settings: Settings,
    digest: UsernameDigest,
    local: local::LocalCounts,
    redis: Option<redis::RedisCounts>,
    clock: Arc<dyn Clock>,
    metrics: ThrottleMetrics,
    /// Wakes the attempts waiting on a username's attempts in flight.
    wakers: Box<[Notify]>,
    /// Random per process: reservation ids never collide across replicas.
    replica: String,
    reservations: AtomicU64,
}

impl Throttle {
    /// The throttle of `settings`, whose delays and counts' ages read `clock`.
    pub(crate) fn new(
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
            wakers: (0..WAKER_SHARDS).map(|_| Notify::new()).collect(),
            replica: format!("{:016x}", rand::random::<u64>()),
            reservations: AtomicU64::new(0),
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

    /// Asks for a place for an attempt for `username` from `client` before it may go
    /// on to hashing: `Ok(None)` when the throttle is off, `Err(Error::Throttled)`
    /// when its settled failures refuse it. Where attempts in flight fill what the
    /// counts allow, the answer is [`Begun::Waiting`]: the caller may do what needs
    /// no place (look the user up) and then waits for one ([`Begun::place`]).
    pub async fn begin(
        self: &Arc<Self>,
        username: &Username,
        client: Option<IpAddr>,
        deadline: Option<Instant>,
    ) -> Result<Option<Begun>, Error> {
        let keys = Keys::new("login", &self.digest.of(username), client);
        self.begin_keyed(keys, Counted::Logins, deadline).await
    }

    /// As [`Throttle::begin`], for a second-factor code of the user `user_id`: the
    /// same rule and settings, counts of their own (the `otp:` keys), so wrong codes
    /// and wrong passwords never add up. A refusal is [`Error::CodesThrottled`].
    pub async fn begin_codes(
        self: &Arc<Self>,
        user_id: &str,
        client: Option<IpAddr>,
        deadline: Option<Instant>,
    ) -> Result<Option<Attempt>, Error> {
        let keys = Keys::new("otp", &self.digest.of_text(user_id), client);
        let as_codes = |e| match e {
            Error::Throttled {
                scope, retry_after, ..
            } => Error::CodesThrottled { scope, retry_after },
            e => e,
        };
        match (self.begin_keyed(keys, Counted::Logins, deadline).await).map_err(as_codes)? {
            Some(begun) => Ok(Some(begun.place().await.map_err(as_codes)?)),
            None => Ok(None),
        }
    }

    /// As [`Throttle::begin`], for a service account's credential presented as
    /// `client_id` (docs/service-accounts.md): the same rule and settings, counts of
    /// their own (the `svc:` keys), per client id and client and per client id.
    pub async fn begin_client(
        self: &Arc<Self>,
        client_id: &str,
        client: Option<IpAddr>,
        deadline: Option<Instant>,
    ) -> Result<Option<Attempt>, Error> {
        let keys = Keys::new("svc", &self.digest.of_text(client_id), client);
        match (self.begin_keyed(keys, Counted::ClientAuthentications, deadline)).await? {
            Some(begun) => Ok(Some(begun.place().await?)),
            None => Ok(None),
        }
    }

    /// As [`Throttle::begin`], for RequestPasswordReset of `username` (known or
    /// not): the same rule and settings, counts of their own (the `reset:` keys).
    /// The caller counts every request as a failure, so the rule bounds requests
    /// per client and per account alike.
    pub async fn begin_reset(
        self: &Arc<Self>,
        username: &Username,
        client: Option<IpAddr>,
        deadline: Option<Instant>,
    ) -> Result<Option<Attempt>, Error> {
        let keys = Keys::new("reset", &self.digest.of(username), client);
        match (self.begin_keyed(keys, Counted::ResetRequests, deadline)).await? {
            Some(begun) => Ok(Some(begun.place().await?)),
            None => Ok(None),
        }
    }

    /// As [`Throttle::begin`], for CompletePasswordReset from `client`: wrong
    /// tokens counted per client (the `reset-token:` keys, whose account is the
    /// client too, so one client's guesses never slow another's reset).
    pub async fn begin_reset_token(
        self: &Arc<Self>,
        client: Option<IpAddr>,
        deadline: Option<Instant>,
    ) -> Result<Option<Attempt>, Error> {
        let name = client.map_or_else(|| "unknown".to_owned(), |ip| ip.to_string());
        let keys = Keys::new("reset-token", &self.digest.of_text(&name), client);
        match (self.begin_keyed(keys, Counted::ResetTokens, deadline)).await? {
            Some(begun) => Ok(Some(begun.place().await?)),
            None => Ok(None),
        }
    }

    async fn begin_keyed(
        self: &Arc<Self>,
        keys: Keys,
        counted: Counted,
        deadline: Option<Instant>,
    ) -> Result<Option<Begun>, Error> {
        if !self.settings.enabled() {
            return Ok(None);
        }
        let id = format!(
            "{}:{}",
            self.replica,
            self.reservations.fetch_add(1, Ordering::Relaxed)
        );
        // Real time: a bound on holding this request (see `place`).
        let give_up = Instant::now() + MAX_WAIT;
        let give_up = deadline.map_or(give_up, |d| d.min(give_up));
        let waiting = Waiting {
            throttle: self.clone(),
            keys,
            counted,
            id,
            give_up,
            deadline,
        };
        match waiting.ask().await? {
            Asked::Placed(attempt) => Ok(Some(Begun::Held(attempt))),
            Asked::Wait(waiting, _) => {
                self.metrics.waits.inc();
                Ok(Some(Begun::Waiting(waiting)))
            }
        }
    }

    /// Asks the counts for a place: in Redis when configured and answering, else in
    /// process (fail open) or not at all (fail closed).
    async fn reserve(self: &Arc<Self>, keys: &Keys, id: &str) -> Result<(Decision, Held), Error> {
        let now = self.clock.unix_ms();
        if let Some(redis) = &self.redis {
            match redis.reserve(keys, id, now, &self.settings).await {
                Ok(decision) => {
                    self.metrics.fallback_active.set(0);
                    return Ok((decision, Held::Redis));
                }
                Err(e) => {
                    self.redis_failed(&e);
                    // Only a call that was made may have taken a place.
                    if !matches!(e, RedisFailure::NotConnected | RedisFailure::Down) {
                        self.withdraw(keys, id);
                    }
                    if self.settings.failure == FailureMode::Closed {
                        return Err(Error::Unavailable(
                            "login attempts cannot be counted while Redis does not answer".into(),
                        ));
                    }
                    self.metrics.fallback_active.set(1);
                }
            }
        }
        let decision = self.local.reserve(keys, now, &self.settings);
        self.metrics.local_entries.set(self.local.len() as i64);
        Ok((decision, Held::Local))
    }

    /// A reservation whose answer was lost (a timeout) may still reach Redis when it
    /// answers again, and would hold a place until its lease ends: a release sent
    /// after it on the same connection takes it back as soon as both arrive.
    fn withdraw(self: &Arc<Self>, keys: &Keys, id: &str) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let release = Attempt {
            throttle: self.clone(),
            keys: keys.clone(),
            id: id.to_owned(),
            held: Held::Redis,
            account: true,
            settled: true,
        };
        runtime.spawn(async move {
            if let Some(redis) = &release.throttle.redis {
                let (now, s) = (release.throttle.clock.unix_ms(), &release.throttle.settings);
                let outcome = Outcome::Released;
                let _ = (redis.settle(&release.keys, &release.id, true, outcome, now, s)).await;
            }
        });
    }

    /// Settles an attempt where its reservation lives, and wakes the attempts
    /// waiting on that username.
    async fn settle(&self, attempt: &Attempt, outcome: Outcome) {
        if attempt.held == Held::Redis
            && let Some(redis) = &self.redis
        {
            let now = self.clock.unix_ms();
            match redis
                .settle(
                    &attempt.keys,
                    &attempt.id,
                    attempt.account,
                    outcome,
                    now,
                    &self.settings,
                )
                .await
            {
                Ok(()) => {
                    self.wakers[attempt.keys.shard].notify_waiters();
                    return;
                }
                // The reservation lapses with its lease; the outcome is kept in
                // process, where the counts go while Redis fails.
                Err(e) => self.redis_failed(&e),
            }
        }
        self.settle_local(attempt, outcome);
    }

    fn settle_local(&self, attempt: &Attempt, outcome: Outcome) {
        let now = self.clock.unix_ms();
        self.local.settle(
            &attempt.keys,
            attempt.held == Held::Local,
            attempt.account,
            outcome,
            now,
            &self.settings,
        );
        self.metrics.local_entries.set(self.local.len() as i64);
        self.wakers[attempt.keys.shard].notify_waiters();
    }

    /// A Redis call that failed marks the connection down for every user of it;
    /// one not made (the connection was already down) is no failure of its own.
    fn redis_failed(&self, why: &RedisFailure) {
        if matches!(why, RedisFailure::Down) {
            return;
        }
        self.metrics.redis_errors.inc();
        tracing::warn!(error = %why, "the login throttle's Redis call failed");
        if let Some(redis) = &self.settings.redis {
            redis.health().mark_down();
        }
    }
}

fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{clock::ManualClock, metrics::Metrics};

    fn settings() -> Settings {
        test_settings()
    }

    fn throttle(s: Settings) -> (Arc<Throttle>, Arc<ManualClock>) {
        let clock = Arc::new(ManualClock::new());
        let metrics = Metrics::new();
        let t = Throttle::new(
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
    async fn fail(t: &Arc<Throttle>, name: &str, client: &str) -> Result<(), (Scope, Duration)> {
        match place(t, name, client, None).await {
            Ok(Some(a)) => {
                a.failed().await;
                Ok(())
            }
            Ok(None) => Ok(()),
            Err(Error::Throttled {
                scope, retry_after, ..
            }) => Err((scope, retry_after)),
            Err(e) => panic!("{e}"),
        }
    }

    /// Begins an attempt and waits for its place.
    async fn place(
        t: &Arc<Throttle>,
        name: &str,
        client: &str,
        deadline: Option<Instant>,
    ) -> Result<Option<Attempt>, Error> {
        match t.begin(&user(name), ip(client), deadline).await? {
            Some(begun) => begun.place().await.map(Some),
            None => Ok(None),
        }
    }

    async fn begin(t: &Arc<Throttle>, name: &str, client: &str) -> Attempt {
        place(t, name, client, None).await.unwrap().unwrap()
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
        assert!(place(&t, "alice", "10.0.0.1", None).await.is_ok());
    }

    #[tokio::test]
    async fn a_success_resets_the_client_count() {
        let (t, _clock) = throttle(settings());
        fail(&t, "bob", "10.0.0.1").await.unwrap();
        fail(&t, "bob", "10.0.0.1").await.unwrap();
        begin(&t, "bob", "10.0.0.1").await.succeeded().await;
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
        assert!(place(&t, "carol", "10.0.0.2", None).await.is_ok());
    }

    #[tokio::test]
    async fn many_addresses_trip_the_account_count_but_not_for_a_known_client() {
        let (t, clock) = throttle(settings());
        // The owner logged in from .2 yesterday.
        begin(&t, "dave", "10.0.0.2").await.succeeded().await;
        clock.advance(Duration::from_secs(86_400));
        for i in 0..7 {
            fail(&t, "dave", &format!("10.1.0.{i}")).await.unwrap();
        }
        // A fresh address is held by the account count, for at most its short maximum.
        let (scope, wait) = fail(&t, "dave", "10.2.0.1").await.unwrap_err();
        assert_eq!((scope, wait), (Scope::Account, Duration::from_secs(1)));
        // The owner's address is not.
        assert!(place(&t, "dave", "10.0.0.2", None).await.is_ok());
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
        assert!(place(&t, "frank", "10.0.0.1", None).await.is_ok());
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
            t.begin(&user("gina"), ip("10.0.0.1"), None)
                .await
                .unwrap()
                .is_none()
        );
    }

    #[tokio::test]
    async fn attempts_at_once_reserve_their_places_before_any_outcome() {
        let (t, _clock) = throttle(settings());
        // Three guesses in flight from one client fill its count: a fourth waits,
        // and is refused once they fail.
        let held: Vec<_> =
            futures::future::join_all((0..3).map(|_| begin(&t, "ivan", "10.0.0.1"))).await;
        let fourth = tokio::spawn({
            let t = t.clone();
            async move {
                place(&t, "ivan", "10.0.0.1", None)
                    .await
                    .map(|a| a.is_some())
            }
        });
        tokio::task::yield_now().await;
        for a in held {
            a.failed().await;
        }
        match fourth.await.unwrap() {
            Err(Error::Throttled { scope, .. }) => assert_eq!(scope, Scope::Client),
            other => panic!("{other:?}"),
        }
    }

    #[tokio::test]
    async fn the_owner_logging_in_many_times_at_once_is_never_refused() {
        let (t, _clock) = throttle(settings());
        // Ten right passwords at once from one client, three places: each waiter
        // goes on as the ones before it succeed.
        let attempts = (0..10).map(|_| {
            let t = t.clone();
            tokio::spawn(async move {
                let a = place(&t, "judy", "10.0.0.1", None).await?.unwrap();
                tokio::task::yield_now().await;
                a.succeeded().await;
                Ok::<_, Error>(())
            })
        });
        for outcome in futures::future::join_all(attempts).await {
            outcome.unwrap().unwrap();
        }
        assert!(t.metrics.waits.get() > 0);
    }

    #[tokio::test]
    async fn a_dropped_attempt_gives_its_place_back_uncounted() {
        let (t, _clock) = throttle(settings());
        for _ in 0..10 {
            let held: Vec<_> =
                futures::future::join_all((0..3).map(|_| begin(&t, "kim", "10.0.0.1"))).await;
            drop(held);
        }
        let keys = Keys::new("login", &t.digest.of(&user("kim")), ip("10.0.0.1"));
        assert_eq!(t.local.view(&keys, t.clock.unix_ms()), View::default());
        fail(&t, "kim", "10.0.0.1").await.unwrap();
    }

    #[tokio::test]
    async fn a_waiter_gives_up_at_its_deadline() {
        let (t, _clock) = throttle(settings());
        let _held: Vec<_> =
            futures::future::join_all((0..3).map(|_| begin(&t, "lou", "10.0.0.1"))).await;
        // A caller's deadline is real time (a gRPC timeout), never the clock's.
        let deadline = Instant::now() + Duration::from_millis(20);
        let waited = place(&t, "lou", "10.0.0.1", Some(deadline)).await;
        assert!(matches!(waited, Err(Error::DeadlineExceeded)), "{waited:?}");
    }
}
