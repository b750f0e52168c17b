//! The use cases: register, log in, validate a token.
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

use crate::{
    audit::{Audit, Caller},
    credentials::{Password, Username},
    error::Error,
    metrics::LoginOutcome,
    password::Hasher,
    store::{NewUser, Store},
    throttle::{Attempt, Throttle},
    token::{Tokens, VerifiedToken},
};
use std::{
    sync::Arc,
    time::{Instant, SystemTime},
};

/// A successful login.
#[derive(Debug, Clone)]
pub struct Session {
    pub user_id: String,
    pub access_token: String,
    pub expires_at: SystemTime,
}

pub struct Accounts {
    store: Arc<Store>,
    hasher: Hasher,
    tokens: Tokens,
    throttle: Arc<Throttle>,
    audit: Audit,
}

impl Accounts {
    pub fn new(
        store: Arc<Store>,
        hasher: Hasher,
        tokens: Tokens,
        throttle: Arc<Throttle>,
        audit: Audit,
    ) -> Self {
        Self {
            store,
            hasher,
            tokens,
            throttle,
            audit,
        }
    }

    pub fn store(&self) -> &Arc<Store> {
        &self.store
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
        // When the pool is full, the request is refused before it costs a query.
        self.hasher.check_room()?;
        // A taken name is refused before paying for a hash; the insert still decides
        // races between concurrent registrations of one name.
        if self.store.find_user(&username).await?.is_some() {
            return Err(Error::AlreadyExists);
        }
        let slot = self.hasher.reserve()?;
        let password_hash = self.hasher.hash(slot, password, deadline).await?;
        let id = uuid::Uuid::now_v7().to_string();
        self.store
            .insert_user(NewUser {
                id: id.clone(),
                username,
                password_hash,
            })
            .await?;
        self.audit.registered(caller, &id);
        Ok(id)
    }

    /// Checks the credentials and issues a token. An unknown user and a wrong
    /// password fail the same way, after the same amount of hashing, and count alike
    /// for the login throttle, which refuses before any of that.
    pub async fn login(
        &self,
        username: Username,
        password: Password,
        deadline: Option<Instant>,
        caller: &Caller,
    ) -> Result<Session, Error> {
        let attempt = self.throttled(&username, caller).await?;
        let user = match self.check_password(&username, password, deadline).await {
            Ok(user) => user,
            Err(CheckFailure::Wrong(user_id)) => {
                self.login_failed(attempt.as_ref(), caller, &username, user_id.as_deref())
                    .await;
                return Err(Error::InvalidCredentials);
            }
            Err(CheckFailure::Error(e)) => return Err(e),
        };
        if let Some(attempt) = &attempt {
            self.throttle.succeeded(attempt).await;
        }
        self.throttle.count_login(LoginOutcome::Ok);
        self.audit.login_succeeded(caller, &user.id);
        let issued = self.tokens.issue(&user.id, &user.username)?;
        Ok(Session {
            user_id: user.id,
            access_token: issued.token,
            expires_at: issued.expires_at,
        })
    }

    /// Asks the login throttle whether an attempt for `username` may go on; a refusal
    /// is counted and audited here, before any store or hashing work.
    async fn throttled(
        &self,
        username: &Username,
        caller: &Caller,
    ) -> Result<Option<Attempt>, Error> {
        match self.throttle.check(username, caller.client).await {
            Err(Error::Throttled { scope, retry_after }) => {
                self.throttle.count_login(LoginOutcome::Throttled);
                self.audit
                    .login_throttled(caller, username, scope.label(), retry_after);
                Err(Error::Throttled { scope, retry_after })
            }
            other => other,
        }
    }

    /// A wrong password or an unknown username: counted, audited.
    async fn login_failed(
        &self,
        attempt: Option<&Attempt>,
        caller: &Caller,
        username: &Username,
        user_id: Option<&str>,
    ) {
        if let Some(attempt) = attempt {
            self.throttle.failed(attempt).await;
        }
        self.throttle.count_login(LoginOutcome::Failed);
        self.audit.login_failed(caller, username, user_id);
    }

    /// Verifies a password against the stored hash of `username` (against a dummy
    /// hash of the same cost when there is none) and rehashes it when its parameters
    /// are not the current ones.
    async fn check_password(
        &self,
        username: &Username,
        password: Password,
        deadline: Option<Instant>,
    ) -> Result<crate::store::User, CheckFailure> {
        self.hasher.check_room()?;
        let user = self.store.find_user(username).await?;
        let slot = self.hasher.reserve()?;
        let stored = user.as_ref().map(|u| u.password_hash.clone());
        let verification = self
            .hasher
            .verify(slot, password.clone(), stored, deadline)
            .await?;
        let user = match user {
            Some(user) if verification.matches => user,
            other => return Err(CheckFailure::Wrong(other.map(|u| u.id))),
        };
        if verification.needs_rehash {
            self.rehash(&user.id, password, deadline).await;
        }
        Ok(user)
    }

    /// Replaces a hash made with other parameters. Best effort: the login has
    /// already succeeded, so a full queue or a failed write only postpones it.
    async fn rehash(&self, user_id: &str, password: Password, deadline: Option<Instant>) {
        let result = async {
            let slot = self.hasher.reserve()?;
            let hash = self.hasher.hash(slot, password, deadline).await?;
            self.store.update_password_hash(user_id, hash).await?;
            Ok::<_, Error>(())
        }
        .await;
        match result {
            Ok(()) => tracing::info!(
                user_id,
                iterations = self.hasher.iterations(),
                "password rehashed with the current parameters"
            ),
            Err(e) => {
                tracing::warn!(user_id, error = %e, "rehashing a password failed; will retry at the next login");
                return;
            }
        }
        // The hash replaced may have been the most expensive one stored; if this
        // read fails, readiness's next probe reads it.
        if let Err(e) = self.refresh_hash_cost().await {
            tracing::warn!(error = %e, "reading the highest stored hash cost failed");
        }
    }

    pub fn validate(&self, token: &str) -> Result<VerifiedToken, Error> {
        Ok(self.tokens.verify(token)?)
    }
}

/// Why a password check did not yield the user.
enum CheckFailure {
    /// A wrong password (the user's id) or an unknown username (`None`).
    Wrong(Option<String>),
    /// Anything else: full, unavailable, past its deadline.
    Error(Error),
}

impl<E: Into<Error>> From<E> for CheckFailure {
    fn from(e: E) -> Self {
        CheckFailure::Error(e.into())
    }
}
