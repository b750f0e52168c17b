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
    credentials::{Password, Username},
    error::Error,
    password::Hasher,
    store::{NewUser, Store},
    token::{Jwks, Tokens, VerifiedToken},
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
}

impl Accounts {
    pub fn new(store: Arc<Store>, hasher: Hasher, tokens: Tokens) -> Self {
        Self {
            store,
            hasher,
            tokens,
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
        Ok(id)
    }

    /// Checks the credentials and issues a token. An unknown user and a wrong
    /// password fail the same way, after the same amount of hashing.
    pub async fn login(
        &self,
        username: Username,
        password: Password,
        deadline: Option<Instant>,
    ) -> Result<Session, Error> {
        self.hasher.check_room()?;
        let user = self.store.find_user(&username).await?;
        let slot = self.hasher.reserve()?;
        let stored = user.as_ref().map(|u| u.password_hash.clone());
        let verification = self
            .hasher
            .verify(slot, password.clone(), stored, deadline)
            .await?;
        let user = match user {
            Some(user) if verification.matches => user,
            _ => return Err(Error::InvalidCredentials),
        };
        if verification.needs_rehash {
            self.rehash(&user.id, password, deadline).await;
        }
        let issued = self.tokens.issue(&user.id, &user.username)?;
        Ok(Session {
            user_id: user.id,
            access_token: issued.token,
            expires_at: issued.expires_at,
        })
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

    /// Checks a token; with an `audience`, also that the token is meant for it.
    pub fn validate(&self, token: &str, audience: Option<&str>) -> Result<VerifiedToken, Error> {
        Ok(self.tokens.verify_for(token, audience)?)
    }

    /// The public keys that verify tokens, as a JWKS document.
    pub fn signing_keys(&self) -> Jwks {
        self.tokens.key_ring().current().jwks().clone()
    }
}
