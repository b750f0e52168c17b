//! The use cases: register, log in, validate a token, and the session lifecycle
//! (refresh, logout, change the password; docs/sessions.md).
//!
//! [`Accounts`] owns the store, the hasher and the token issuer, and knows nothing
//! of gRPC or of which database it talks to. Inputs arrive parsed ([`Username`],
//! [`Password`]); every failure is an [`Error`] for the gRPC layer to map.
//!
//! A request holds a place in the hashing pool only while hashing is what it waits
//! for: Register and Login refuse at once when the pool is full now (a check that
//! takes nothing), look the user up, and only then take the place (which may still
//! be refused). So a database that is slow or gone makes requests fail with
//! UNAVAILABLE, never fill the pool and have others told it is full.
//!
//! Sessions: every Login stores one (a write); Refresh, Logout and ChangePassword
//! change it in one store operation each, whose outcome the database decides.
//! Sessions ended here go into this replica's [`Revocations`] at once; those ended
//! on other replicas arrive through [`Accounts::upkeep`], which polls the store for
//! sessions ended since its last look and purges the ones no token needs any more.
//! ValidateToken reads only the in-memory set.
//!
//! # Layout
//!
//! - this file: the use cases of the users' own calls.
//! - `upkeep`: the revocation set read at start and polled from every replica, and
//!   the purge of old sessions and cutoffs.
//! - `admin`: what an administrator does to accounts (the admin API), and the
//!   per-user token cutoffs the upkeep reads.
//! - `recovery`: RequestPasswordReset and CompletePasswordReset (docs/recovery.md).
//! - `second_factor`: TOTP enrollment, Login's challenge and CompleteLogin,
//!   turning the factor off, recovery codes.
//! - `service`: service accounts (what an administrator does to them), their
//!   client credentials and token exchange grants.
//! - `service_cache`: the service accounts grants read lately, used while no cutoff
//!   may have changed them.

mod admin;
mod recovery;
mod second_factor;
mod service;
mod service_cache;
mod upkeep;

pub use admin::{Changed, MAX_SESSIONS, new_user_id};
pub use second_factor::SecondFactorSettings;
pub use service::{
    AUDIENCE_NOT_ALLOWED, ClientProof, MAX_AUDIENCES, MAX_CREDENTIALS, MAX_SCOPES, NewCredential,
    SCOPE_NOT_ALLOWED, ServiceSettings, is_service_token, parse_identity, parse_items, parse_name,
};

use crate::{
    audit::{Audit, Caller, LoginFailure as Failure},
    clock::Clock,
    credentials::{Password, PresentedPassword, Username},
    error::Error,
    metrics::{LoginOutcome, Metrics, SecondFactorMetrics},
    password::{Hasher, Verification, stored},
    refresh::{RefreshToken, RotationKey},
    revocation::Revocations,
    store::{
        EndReason, LiveSession, LoggedOut, NewSession, NewUser, Refreshed, Rehash, Rotation, Store,
    },
    throttle::{Attempt, Begun, Throttle},
    token::{Jwks, TokenError, Tokens, VerifiedToken},
};
use prometheus::{Gauge, IntCounter, IntCounterVec};
use std::{
    collections::HashSet,
    sync::{Arc, Mutex},
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

/// How long after a rotation the refresh token it replaced still gets the same
/// answer (a retry whose answer was lost, or two requests at once).
pub const RETRY_GRACE: Duration = Duration::from_secs(10);
/// The most revoked sessions one replica holds (see `revocation`): about 100 MB.
pub const MAX_REVOKED_SESSIONS: usize = 1_000_000;
/// The most users one replica rehashes at once: the others of their concurrent
/// logins skip the rehash instead of computing one more the store would refuse.
/// Beyond it a login rehashes anyway (the store keeps one).
pub const MAX_REHASHING: usize = 4096;
/// The most per-user cutoffs one replica holds (disabled and deleted accounts whose
/// tokens may still be valid): about 20 MB.
pub const MAX_USER_CUTOFFS: usize = 100_000;

/// A successful login or refresh: an access token and the session it belongs to.
#[derive(Clone)]
pub struct Session {
    pub user_id: String,
    /// A bearer token: redacted in `Debug`.
    pub access_token: String,
    pub expires_at: SystemTime,
    /// Redacted in `Debug`.
    pub refresh_token: RefreshToken,
    pub refresh_expires_at: SystemTime,
    pub session_id: String,
}

/// What a right password came to: a session, or (a second factor is on) a
/// challenge for CompleteLogin and when it expires.
pub enum LoginAnswer {
    Session(Session),
    /// Secret: the challenge is shown only in the answer.
    Challenge {
        challenge: String,
        expires_at: SystemTime,
    },
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session")
            .field("user_id", &self.user_id)
            .field("access_token", &"***")
            .field("expires_at", &self.expires_at)
            .field("refresh_token", &self.refresh_token)
            .field("refresh_expires_at", &self.refresh_expires_at)
            .field("session_id", &self.session_id)
            .finish()
    }
}

/// How sessions live.
#[derive(Debug, Clone, Copy)]
pub struct SessionSettings {
    /// A session's longest life, from its login (`AUTHD_REFRESH_TTL`).
    pub refresh_ttl: Duration,
    /// The access tokens' lifetime (`AUTHD_TOKEN_TTL`): how long an end matters.
    pub token_ttl: Duration,
}

struct SessionCounters {
    started: IntCounter,
    refreshed: IntCounter,
    /// By [`EndReason`], in the order of [`EndReason::ALL`].
    ended: [IntCounter; EndReason::ALL.len()],
    poll_errors: IntCounter,
}

impl SessionCounters {
    fn ended(&self, reason: EndReason, n: usize) {
        let i = EndReason::ALL
            .iter()
            .position(|r| *r == reason)
            .unwrap_or(0);
        self.ended[i].inc_by(n as u64);
    }
}

pub struct Accounts {
    store: Arc<Store>,
    hasher: Hasher,
    tokens: Tokens,
    throttle: Arc<Throttle>,
    audit: Audit,
    settings: SessionSettings,
    revocations: Revocations,
    counters: SessionCounters,
    /// When the poller last read every replica's ends.
    synced: Arc<Mutex<Instant>>,
    /// The time of sessions, revocations, challenges and codes.
    clock: Arc<dyn Clock>,
    factors: SecondFactorSettings,
    metrics_sf: SecondFactorMetrics,
    /// Users this replica is rehashing now.
    rehashing: InFlight,
    /// `authd_password_rehashes_total`.
    rehashes: IntCounterVec,
    /// Service tokens' lifetime and the exchange's depth.
    services: ServiceSettings,
    service_metrics: crate::metrics::ServiceMetrics,
    /// External JWT issuers (none unless configured).
    issuers: Option<Arc<crate::issuers::Issuers>>,
    /// The service accounts grants read lately.
    service_cache: service_cache::ServiceCache,
    /// How long a password reset token lives.
    reset_ttl: Duration,
}

/// The users some work is in flight for, at most `max` of them: a second piece of
/// work for the same user is told to skip.
struct InFlight {
    set: Mutex<HashSet<String>>,
    max: usize,
}

/// A user's place in an [`InFlight`] set, given back when dropped.
struct Held<'a> {
    set: &'a Mutex<HashSet<String>>,
    user_id: Option<String>,
}

impl InFlight {
    fn new(max: usize) -> Self {
        Self {
            set: Mutex::new(HashSet::new()),
            max,
        }
    }

    /// A place for `user_id`; `None` when another holds it. With `max` users in
    /// the set, a place outside it (the work goes ahead untracked).
    fn hold(&self, user_id: &str) -> Option<Held<'_>> {
        let mut set = self.set.lock().unwrap_or_else(|e| e.into_inner());
        if set.contains(user_id) {
            return None;
        }
        let held = set.len() < self.max && set.insert(user_id.to_owned());
        Some(Held {
            set: &self.set,
            user_id: held.then(|| user_id.to_owned()),
        })
    }
}

impl Drop for Held<'_> {
    fn drop(&mut self) {
        if let Some(id) = self.user_id.take() {
            self.set
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .remove(&id);
        }
    }
}

fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

fn system_time(unix_ms: i64) -> SystemTime {
    UNIX_EPOCH + Duration::from_millis(u64::try_from(unix_ms).unwrap_or(0))
}

/// A UUIDv7 of `unix_ms` (its other bits random): ids that sort by the time they
/// were made at, by the accounts' clock.
fn uuid_v7(unix_ms: i64) -> uuid::Uuid {
    let at = u64::try_from(unix_ms).unwrap_or(0);
    let timestamp = uuid::Timestamp::from_unix(
        uuid::NoContext,
        at / 1000,
        u32::try_from(at % 1000).unwrap_or(0) * 1_000_000,
    );
    uuid::Uuid::new_v7(timestamp)
}

impl Accounts {
    pub fn new(
        store: Arc<Store>,
        hasher: Hasher,
        tokens: Tokens,
        throttle: Arc<Throttle>,
        audit: Audit,
        settings: SessionSettings,
        metrics: &Metrics,
    ) -> Self {
        // The tokens' clock: sessions, revocations and tokens keep one time.
        let clock = tokens.clock().clone();
        let m = &metrics.sessions;
        let revocations = Revocations::new(
            settings.token_ttl,
            MAX_REVOKED_SESSIONS,
            MAX_USER_CUTOFFS,
            m.revoked.clone(),
            m.revocations_evicted.clone(),
        );
        let counters = SessionCounters {
            started: m.started.clone(),
            refreshed: m.refreshed.clone(),
            ended: EndReason::ALL.map(|r| m.ended.with_label_values(&[r.label()])),
            poll_errors: m.poll_errors.clone(),
        };
        let synced = Arc::new(Mutex::new(clock.now()));
        let (age, since, now): (Gauge, _, _) = (m.sync_age.clone(), synced.clone(), clock.clone());
        metrics.on_scrape(move || {
            let at = *since.lock().unwrap_or_else(|e| e.into_inner());
            age.set(now.now().saturating_duration_since(at).as_secs_f64());
        });
        Self {
            store,
            hasher,
            tokens,
            throttle,
            audit,
            settings,
            revocations,
            counters,
            synced,
            clock,
            factors: SecondFactorSettings::default(),
            metrics_sf: metrics.second_factor.clone(),
            rehashing: InFlight::new(MAX_REHASHING),
            rehashes: metrics.rehash.rehashes.clone(),
            services: ServiceSettings::default(),
            service_metrics: metrics.service.clone(),
            issuers: None,
            service_cache: service_cache::ServiceCache::default(),
            reset_ttl: Duration::from_secs(30 * 60),
        }
    }

    /// The second factor's data keys, issuer, challenge lifetime and clock.
    pub fn with_second_factor(mut self, factors: SecondFactorSettings) -> Self {
        self.factors = factors;
        self
    }

    /// How long a password reset token lives (AUTHD_PASSWORD_RESET_TTL).
    pub fn with_reset_ttl(mut self, ttl: Duration) -> Self {
        self.reset_ttl = ttl;
        self
    }

    /// The clock every rule of the accounts reads, for the API that fronts them.
    pub(crate) fn clock(&self) -> &Arc<dyn Clock> {
        &self.clock
    }

    pub fn store(&self) -> &Arc<Store> {
        &self.store
    }

    /// The audit trail this replica writes.
    pub fn audit(&self) -> &Audit {
        &self.audit
    }

    pub fn hasher(&self) -> &Hasher {
        &self.hasher
    }

    /// Reads the highest stored hash cost into the hasher, so that failed logins
    /// cost as much as the most expensive stored hash: at start, after a rehash.
    pub async fn refresh_hash_cost(&self) -> Result<(), Error> {
        let highest = self.store.max_hash_iterations().await?;
        self.hasher.set_highest_stored(highest);
        Ok(())
    }

    /// Readiness: checks that the store answers a real query the way requests run
    /// theirs ([`Store::probe`]), and takes the highest stored hash cost it reads
    /// (other replicas may write hashes of other costs).
    pub async fn probe_store(&self) -> Result<(), Error> {
        let highest = self.store.probe().await?;
        self.hasher.set_highest_stored(highest);
        Ok(())
    }

    /// Creates a user and returns its id.
    pub async fn register(
        &self,
        username: Username,
        password: Password,
        deadline: Option<Instant>,
        caller: &Caller,
    ) -> Result<String, Error> {
        // A read that proves the database answers before the hash is queued (a
        // database that is gone makes requests fail, never fill the hash queue).
        // Its answer is not used: a taken name costs the same hash and the same
        // insert as a free one, and answers only when the insert does, so neither
        // time nor a deadline tells the two apart (a deadline that passes in the
        // queue refuses both before the hash). The insert decides, also between
        // concurrent registrations of one name.
        self.store.find_user(&username).await?;
        // By the policy: under argon2id, an Argon2id hash in the ext column and a
        // marker beside it.
        let hash = self.hasher.hash(password, deadline).await?;
        let id = uuid_v7(self.clock.millis()).to_string();
        self.store
            .insert_user(NewUser {
                id: id.clone(),
                username,
                password_hash: hash.password_hash,
                password_hash_ext: hash.password_hash_ext,
            })
            .await?;
        self.audit.registered(caller, &id);
        Ok(id)
    }

    /// Checks the credentials and issues a token. An unknown user and a wrong
    /// password fail the same way, after the same amount of hashing, and count alike
    /// for the login throttle, which refuses (on its settled failures) before any
    /// of that.
    pub async fn login(
        &self,
        username: Username,
        password: PresentedPassword,
        deadline: Option<Instant>,
        caller: &Caller,
    ) -> Result<LoginAnswer, Error> {
        let (user, attempt) = self
            .authenticate(&username, password, deadline, caller)
            .await?;
        if user.has_factor {
            // The password was right: the client's count resets as for a login;
            // no token before the second factor (CompleteLogin).
            if let Some(attempt) = attempt {
                attempt.succeeded().await;
            }
            return self.challenge(&user, caller).await;
        }
        match self.start_session(&user, caller, "pwd").await {
            Ok(session) => {
                self.login_succeeded(attempt, caller, &user.id).await;
                Ok(LoginAnswer::Session(session))
            }
            // The password changed while this attempt was being checked: it was
            // verified against a password that is no longer the user's.
            Err(Error::InvalidCredentials) => {
                let why = Failure::Superseded;
                self.login_failed(attempt, caller, &username, Some(&user.id), why)
                    .await;
                Err(Error::InvalidCredentials)
            }
            // Dropping the attempt gives its place back, uncounted.
            Err(e) => Err(e),
        }
    }

    /// One login attempt, as Login and ChangePassword make it: reserves its place in
    /// the throttle, checks the password, and settles a wrong one. A right one is
    /// returned with its attempt, which the caller settles once what the password
    /// was checked for is done (a session stored, a new password stored): that
    /// step is conditional on the password being still the one checked.
    async fn authenticate(
        &self,
        username: &Username,
        password: PresentedPassword,
        deadline: Option<Instant>,
        caller: &Caller,
    ) -> Result<(crate::store::User, Option<Attempt>), Error> {
        let begun = self.throttled(username, caller, deadline).await?;
        match self
            .check_password(username, password, deadline, begun)
            .await
        {
            Ok(checked) => Ok(checked),
            Err(CheckFailure::Wrong(user_id, attempt, why)) => {
                self.login_failed(attempt, caller, username, user_id.as_deref(), why)
                    .await;
                Err(Error::InvalidCredentials)
            }
            Err(CheckFailure::Error(e)) => Err(self.refused(e, caller, username)),
        }
    }

    /// Asks the login throttle for a place for an attempt for `username`; a refusal
    /// is counted and audited here, before any store or hashing work.
    async fn throttled(
        &self,
        username: &Username,
        caller: &Caller,
        deadline: Option<Instant>,
    ) -> Result<Option<Begun>, Error> {
        (self.throttle.begin(username, caller.client, deadline).await)
            .map_err(|e| self.refused(e, caller, username))
    }

    /// Counts and audits a refusal of the login throttle; any error passes.
    fn refused(&self, e: Error, caller: &Caller, username: &Username) -> Error {
        if let Error::Throttled {
            scope, retry_after, ..
        } = &e
        {
            self.throttle.count_login(LoginOutcome::Throttled);
            (self.audit).login_throttled(caller, username, scope.label(), *retry_after);
        }
        e
    }

    /// A right password whose use succeeded: the throttle resets the client's count.
    async fn login_succeeded(&self, attempt: Option<Attempt>, caller: &Caller, user_id: &str) {
        if let Some(attempt) = attempt {
            attempt.succeeded().await;
        }
        self.throttle.count_login(LoginOutcome::Ok);
        self.audit.login_succeeded(caller, user_id);
    }

    /// A wrong password, an unknown username, a disabled account, or a password
    /// changed meanwhile: counted alike, audited with the reason.
    async fn login_failed(
        &self,
        attempt: Option<Attempt>,
        caller: &Caller,
        username: &Username,
        user_id: Option<&str>,
        why: Failure,
    ) {
        if let Some(attempt) = attempt {
            attempt.failed().await;
        }
        self.throttle.count_login(LoginOutcome::Failed);
        self.audit.login_failed(caller, username, user_id, why);
    }

    /// Verifies a password against the effective hash of `username` (its own, or
    /// the foreign one behind a marker; a dummy hash of the same cost when there is
    /// no user) and rehashes it when it is foreign or its parameters are not the
    /// current ones. The user is looked up while the attempt may still wait for its
    /// place in the throttle, and hashed only once it has one.
    async fn check_password(
        &self,
        username: &Username,
        password: PresentedPassword,
        deadline: Option<Instant>,
        begun: Option<Begun>,
    ) -> Result<(crate::store::User, Option<Attempt>), CheckFailure> {
        let user = self.store.find_user(username).await?;
        let attempt = match begun {
            Some(begun) => Some(begun.place().await?),
            None => None,
        };
        let stored = (user.as_ref())
            .map(|u| stored::effective(&u.password_hash, u.password_hash_ext.as_deref()));
        let verification = self.hasher.verify(&password, stored, deadline).await?;
        // A disabled account fails as a wrong password does, after the same hash
        // and counted alike: the caller learns nothing; the audit trail says why.
        let user = match user {
            Some(user) if verification.matches && !user.disabled => user,
            Some(user) => {
                let why = if verification.matches {
                    Failure::Disabled
                } else {
                    Failure::WrongPassword
                };
                return Err(CheckFailure::Wrong(Some(user.id), attempt, why));
            }
            None => return Err(CheckFailure::Wrong(None, attempt, Failure::UnknownUser)),
        };
        if verification.needs_rehash {
            self.rehash(&user, &password, verification, deadline).await;
        }
        Ok((user, attempt))
    }

    /// Stores a new session of the user signed in by `amr` (`pwd`, `pwd otp`) and
    /// issues its first tokens; refused with [`Error::InvalidCredentials`] when the
    /// user's password is no longer the one verified (a password change won the
    /// race, in the same statement).
    async fn start_session(
        &self,
        user: &crate::store::User,
        caller: &Caller,
        amr: &str,
    ) -> Result<Session, Error> {
        let now = self.clock.millis();
        let refresh_token = RefreshToken::issued_at(now);
        let session = LiveSession {
            id: admin::session_id_after(now, user.cutoff_at),
            user_id: user.id.clone(),
            username: user.username.as_str().to_owned(),
            expires_at: now.saturating_add(millis(self.settings.refresh_ttl)),
            amr: amr.to_owned(),
        };
        let stored = self
            .store
            .insert_session(NewSession {
                id: session.id.clone(),
                user_id: session.user_id.clone(),
                password_version: user.password_version,
                rotation_key: RotationKey::random(),
                refresh_digest: refresh_token.store_key(),
                created_at: now,
                expires_at: session.expires_at,
                client_addr: caller.client.map(|ip| ip.to_string()),
                amr: amr.to_owned(),
            })
            .await?;
        if !stored {
            return Err(Error::InvalidCredentials);
        }
        self.counters.started.inc();
        self.session_tokens(session, refresh_token)
    }

    /// The answer of a Login or a Refresh: a new access token of the session.
    fn session_tokens(
        &self,
        session: LiveSession,
        refresh_token: RefreshToken,
    ) -> Result<Session, Error> {
        let refresh_expires_at = system_time(session.expires_at);
        let username = Username::from_store(session.username);
        let issued = self.tokens.issue_in_session(
            &session.user_id,
            &username,
            &session.id,
            refresh_expires_at,
            &session.amr,
        )?;
        Ok(Session {
            user_id: session.user_id,
            access_token: issued.token,
            expires_at: issued.expires_at,
            refresh_token,
            refresh_expires_at,
            session_id: session.id,
        })
    }

    /// Rotates a refresh token (see `store::session` for the rule).
    pub async fn refresh(&self, presented: &str, caller: &Caller) -> Result<Session, Error> {
        let presented = RefreshToken::parse(presented)
            .ok_or(Error::InvalidRefreshToken("malformed refresh token"))?;
        let now = self.clock.millis();
        let rotation = Rotation {
            presented,
            now,
            grace_ms: millis(RETRY_GRACE),
        };
        match self.store.rotate(rotation).await? {
            Refreshed::Rotated {
                session,
                refresh_token,
                replay,
            } => {
                if replay {
                    tracing::debug!(
                        session_id = session.id,
                        "a refresh token rotated moments ago was presented again: same answer"
                    );
                } else {
                    self.counters.refreshed.inc();
                }
                self.audit
                    .refreshed(caller, &session.user_id, &session.id, replay);
                self.session_tokens(session, refresh_token)
            }
            Refreshed::Reused {
                session_id,
                ended_now,
            } => Err(self.reused(&session_id, ended_now, now, caller)),
            Refreshed::Refused(why) => Err(Error::InvalidRefreshToken(why)),
        }
    }

    /// A rotated-out refresh token presented again (to Refresh or Logout): its
    /// session is ended by the reuse rule (by this request when `ended_now`),
    /// refused on this replica at once, and the request is refused.
    fn reused(&self, session_id: &str, ended_now: bool, now: i64, caller: &Caller) -> Error {
        self.revocations.insert(session_id, now, now);
        if ended_now {
            self.counters.ended(EndReason::Reuse, 1);
            (self.audit).session_ended(caller, session_id, EndReason::Reuse.label());
        }
        Error::InvalidRefreshToken("refresh token reused")
    }

    /// Ends the session named by either token (both: the sessions of both), or
    /// with `all`, every session of its user. Returns how many this call ended.
    ///
    /// Only live credentials act: an access token of an ended session, and a
    /// refresh token of an ended session, are refused (UNAUTHENTICATED) and end
    /// nothing; a refresh token rotated out ends its own session (the reuse rule,
    /// as Refresh applies it) and nothing else, and is refused.
    pub async fn logout(
        &self,
        refresh_token: Option<&str>,
        access_token: Option<&str>,
        all: bool,
        caller: &Caller,
    ) -> Result<u32, Error> {
        let now = self.clock.millis();
        // Both tokens are checked before anything ends: the access token in memory
        // (signature, expiry, and the sessions this replica knows to have ended),
        // and again in the store, which decides.
        let access = access_token
            .map(|token| {
                let verified = self.validate(token, None)?;
                match (&verified.session_id, all) {
                    (Some(_), _) | (None, true) => Ok(verified),
                    // A token from before sessions names no session to end.
                    (None, false) => Err(Error::InvalidToken(TokenError::Malformed)),
                }
            })
            .transpose()?;
        let refresh = refresh_token
            .map(|token| {
                RefreshToken::parse(token)
                    .ok_or(Error::InvalidRefreshToken("malformed refresh token"))
            })
            .transpose()?;
        let mut ended = Vec::new();
        let mut named = Vec::new();
        if let Some(token) = refresh {
            let key = token.store_key();
            match (self.store)
                .end_by_digest(&key, all, now, millis(RETRY_GRACE))
                .await?
            {
                LoggedOut::Ended(outcome) => {
                    ended.extend(outcome.ended_now);
                    named.extend(outcome.named);
                }
                LoggedOut::Reused {
                    session_id,
                    ended_now,
                } => return Err(self.reused(&session_id, ended_now, now, caller)),
                LoggedOut::Refused(why) => return Err(Error::InvalidRefreshToken(why)),
            }
        }
        if let Some(token) = access {
            let sid = token.session_id.unwrap_or_default();
            // Both tokens of one session (or the refresh token ended all of them):
            // the session is ended already, by this request.
            let done = !sid.is_empty() && (named.contains(&sid) || ended.contains(&sid));
            let outcome = if done {
                crate::store::Ended::default()
            } else {
                (self.store)
                    .end_by_id(&sid, &token.user_id, all, now)
                    .await?
                    .ok_or(Error::InvalidToken(TokenError::Revoked))?
            };
            ended.extend(outcome.ended_now);
            named.extend(outcome.named);
        }
        for id in ended.iter().chain(&named) {
            self.revocations.insert(id, now, now);
        }
        ended.sort();
        ended.dedup();
        self.counters.ended(EndReason::Logout, ended.len());
        for id in &ended {
            self.audit
                .session_ended(caller, id, EndReason::Logout.label());
        }
        Ok(u32::try_from(ended.len()).unwrap_or(u32::MAX))
    }

    /// Checks the current password as Login does, stores a hash of the new one and
    /// ends every session of the user. Returns how many sessions it ended.
    pub async fn change_password(
        &self,
        username: Username,
        current: PresentedPassword,
        new: Password,
        deadline: Option<Instant>,
        caller: &Caller,
    ) -> Result<u32, Error> {
        // The current-password check is a login attempt: throttled and counted alike.
        let (user, attempt) = self
            .authenticate(&username, current, deadline, caller)
            .await?;
        let hash = self.hasher.hash(new, deadline).await?;
        let now = self.clock.millis();
        // Only if the password is still the one checked: of two changes at once
        // with the same current password, one wins.
        let Some(ended) = (self.store)
            .change_password(
                &user.id,
                hash.password_hash,
                hash.password_hash_ext,
                user.password_version,
                now,
            )
            .await?
        else {
            let why = Failure::Superseded;
            self.login_failed(attempt, caller, &username, Some(&user.id), why)
                .await;
            return Err(Error::InvalidCredentials);
        };
        if let Some(attempt) = attempt {
            attempt.succeeded().await;
        }
        for id in &ended {
            self.revocations.insert(id, now, now);
        }
        self.counters.ended(EndReason::PasswordChange, ended.len());
        self.audit.password_changed(caller, &user.id, ended.len());
        // The hash replaced may have been the most expensive one stored.
        if let Err(e) = self.refresh_hash_cost().await {
            tracing::warn!(error = %e, "reading the highest stored hash cost failed");
        }
        Ok(u32::try_from(ended.len()).unwrap_or(u32::MAX))
    }

    /// Replaces a hash another system made, or one made with other parameters,
    /// with a hash of the password's NFKC form at the policy in force. Best effort:
    /// the login has already succeeded, so a deadline that passes or a failed write
    /// only postpones it to the next login. The new hash is stored only if the
    /// user's hashes are still the ones verified (a rehash never undoes a password
    /// change, and of concurrent first logins on any replicas one is stored), and
    /// keeps its version: sessions verified against the old hash of the same
    /// password still start. Concurrent logins of one user on this replica hash it
    /// once: the others skip it.
    async fn rehash(
        &self,
        user: &crate::store::User,
        password: &PresentedPassword,
        verification: Verification,
        deadline: Option<Instant>,
    ) {
        let user_id = user.id.as_str();
        // Another login of this user on this replica is rehashing it.
        let Some(_held) = self.rehashing.hold(user_id) else {
            return;
        };
        let reason = if verification.foreign {
            "foreign_format"
        } else {
            "parameters"
        };
        let result = async {
            let hash = self.hasher.hash(password.normalized(), deadline).await?;
            let rehash = Rehash {
                user_id: user.id.clone(),
                hash: hash.password_hash,
                ext: hash.password_hash_ext,
                version: user.password_version,
                verified_hash: user.password_hash.clone(),
                verified_ext: user.password_hash_ext.clone(),
            };
            Ok::<_, Error>(self.store.update_password_hash(rehash).await?)
        }
        .await;
        let outcome = match result {
            Ok(true) => {
                tracing::info!(
                    user_id,
                    reason,
                    algorithm = ?self.hasher.policy().algorithm,
                    iterations = self.hasher.iterations(),
                    "password rehashed by the current policy"
                );
                "stored"
            }
            Ok(false) => {
                tracing::debug!(
                    user_id,
                    reason,
                    "rehash not stored: the password's hash changed meanwhile"
                );
                "superseded"
            }
            Err(e) => {
                tracing::warn!(user_id, reason, error = %e, "rehashing a password failed; will retry at the next login");
                "failed"
            }
        };
        self.rehashes.with_label_values(&[reason, outcome]).inc();
        if outcome != "stored" {
            return;
        }
        // The hash replaced may have been the most expensive one stored; if this
        // read fails, readiness's next probe reads it.
        if let Err(e) = self.refresh_hash_cost().await {
            tracing::warn!(error = %e, "reading the highest stored hash cost failed");
        }
    }

    /// Checks a token: signature, expiry, and whether its session has ended (in
    /// memory: no database query).
    /// A service token is refused when its account or the credential it was issued
    /// for was cut off; an exchanged one also when any account acting in it was.
    pub fn validate(&self, token: &str, audience: Option<&str>) -> Result<VerifiedToken, Error> {
        Ok(self.tokens.verify_unless(token, audience, |v| {
            let session = v.session_id.as_deref().unwrap_or_default();
            let revoked = |key: &str| self.revocations.is_revoked(session, key, v.issued_at);
            if revoked(&v.user_id) || v.credential_id.as_deref().is_some_and(revoked) {
                return true;
            }
            let mut actor = v.actor.as_ref();
            while let Some(a) = actor {
                if revoked(&a.sub) {
                    return true;
                }
                actor = a.act.as_deref();
            }
            false
        })?)
    }

    /// The public keys that verify tokens, as a JWKS document.
    pub fn signing_keys(&self) -> Jwks {
        self.tokens.key_ring().current().jwks().clone()
    }
}

/// Why a password check did not yield the user.
enum CheckFailure {
    /// A wrong password or a disabled account (the user's id) or an unknown
    /// username (`None`), the attempt to settle, and why, for the audit trail.
    Wrong(Option<String>, Option<Attempt>, Failure),
    /// Anything else: full, unavailable, past its deadline.
    Error(Error),
}

impl<E: Into<Error>> From<E> for CheckFailure {
    fn from(e: E) -> Self {
        CheckFailure::Error(e.into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn work_in_flight_for_a_user_is_held_once() {
        let in_flight = InFlight::new(2);
        let a = in_flight.hold("a").expect("free");
        assert!(in_flight.hold("a").is_none(), "held by the first");
        let b = in_flight.hold("b").expect("free");
        // Full: a third user goes ahead untracked, as often as it comes.
        let c = in_flight.hold("c").expect("untracked");
        assert!(in_flight.hold("c").is_some());
        drop(c);
        drop(a);
        let again = in_flight.hold("a").expect("given back");
        assert!(in_flight.hold("b").is_none());
        drop((again, b));
        assert!(in_flight.set.lock().unwrap().is_empty());
    }

    #[test]
    fn a_session_never_shows_its_tokens_in_debug() {
        let refresh = RefreshToken::issued_at(0);
        let session = Session {
            user_id: "u1".into(),
            access_token: "eyJhbGciOiJIUzI1NiJ9.secret.signature".into(),
            expires_at: SystemTime::UNIX_EPOCH,
            refresh_token: refresh.clone(),
            refresh_expires_at: SystemTime::UNIX_EPOCH,
            session_id: "s1".into(),
        };
        let shown = format!("{session:?}");
        assert!(!shown.contains("secret.signature"), "{shown}");
        assert!(!shown.contains(&refresh.expose()), "{shown}");
        assert!(shown.contains("u1") && shown.contains("s1"), "{shown}");
    }
}
