//! Self-service password recovery (docs/recovery.md): a reset asked for by
//! username, whose token travels only in the `user.password_reset_requested`
//! account event (for the calling service to deliver), and the new password set
//! with it.
//!
//! RequestPasswordReset answers the same, at the same cost, for every username:
//! the throttle is asked under the username's digest (known or not), the user is
//! looked up, a token is made and its digest written in one store write (for an
//! unknown or disabled user, a write that matches no user and changes nothing).
//! Every request counts against the throttle, so a username (and a client) gets a
//! few requests before it is slowed, whatever exists.

use super::{Accounts, millis};
use crate::{
    audit::Caller,
    credentials::{Password, Username},
    error::Error,
    store::{EndReason, ResetAnswer, ResetWrite},
};
use base64::{Engine as _, engine::general_purpose::URL_SAFE_NO_PAD};
use rand::RngCore as _;
use sha2::{Digest as _, Sha256};
use std::time::Instant;

/// The prefix of reset tokens, so that one found in a mailbox or a log is known
/// for what it is.
const PREFIX: &str = "rst_";

/// A new reset token: the prefix and 32 random bytes, base64url.
fn new_token() -> String {
    let mut bytes = [0u8; 32];
    rand::rng().fill_bytes(&mut bytes);
    format!("{PREFIX}{}", URL_SAFE_NO_PAD.encode(bytes))
}

/// What the store keeps of a token: its SHA-256, in hex.
fn digest(token: &str) -> String {
    hex::encode(Sha256::digest(token.as_bytes()))
}

impl Accounts {
    /// RequestPasswordReset: the same answer for every username.
    pub async fn request_password_reset(
        &self,
        username: Username,
        deadline: Option<Instant>,
        caller: &Caller,
    ) -> Result<(), Error> {
        let attempt = self
            .throttle
            .begin_reset(&username, caller.client, deadline)
            .await?;
        let user = self.store.find_user(&username).await?;
        let token = new_token();
        let now = self.clock.millis();
        let expires_at = now.saturating_add(millis(self.reset_ttl));
        // An unknown (or disabled) user: the same write, for an id no user has, so
        // it changes nothing and costs what a real one does.
        let (user_id, version) = match &user {
            Some(user) if !user.disabled => (user.id.clone(), user.password_version),
            _ => (super::new_user_id(now), 0),
        };
        let write = ResetWrite::Request {
            user_id,
            username: username.as_str().to_owned(),
            password_version: version,
            digest: digest(&token),
            token,
            expires_at,
        };
        let answer = self.store.reset_write(write).await;
        // Every request counts, whatever it came to.
        if let Some(attempt) = attempt {
            attempt.failed().await;
        }
        if let (Ok(ResetAnswer::Requested(true)), Some(user)) = (&answer, &user) {
            self.audit.password_reset(caller, &user.id, "requested");
        }
        answer?;
        Ok(())
    }

    /// CompletePasswordReset: the new password (already held to the rules by
    /// `check`, given the user's name) set with a live reset token; the number of
    /// sessions ended.
    pub async fn complete_password_reset(
        &self,
        token: &str,
        new: Password,
        check: impl FnOnce(&Username, &Password) -> Result<(), Error>,
        deadline: Option<Instant>,
        caller: &Caller,
    ) -> Result<u32, Error> {
        let attempt = self
            .throttle
            .begin_reset_token(caller.client, deadline)
            .await?;
        let digest = digest(token);
        let now = self.clock.millis();
        // Looked up before hashing: a wrong token costs no hash.
        let user = match self.store.live_reset(&digest, now).await? {
            Some(user_id) => self.store.find_user_by_id(&user_id).await?,
            None => None,
        };
        let Some(user) = user else {
            if let Some(attempt) = attempt {
                attempt.failed().await;
            }
            return Err(Error::InvalidResetToken);
        };
        check(&user.username, &new)?;
        let hash = self.hasher.hash(new, deadline).await?;
        let write = ResetWrite::Complete {
            digest,
            hash: hash.password_hash,
            ext: hash.password_hash_ext,
        };
        // Consumed here: of requests at once with one token, one wins.
        match self.store.reset_write(write).await? {
            ResetAnswer::Completed { user_id, sessions } => {
                if let Some(attempt) = attempt {
                    attempt.succeeded().await;
                }
                let now = self.clock.millis();
                for id in &sessions {
                    self.revocations.insert(id, now, now);
                }
                self.counters
                    .ended(EndReason::PasswordChange, sessions.len());
                self.audit.password_reset(caller, &user_id, "completed");
                if let Err(e) = self.refresh_hash_cost().await {
                    tracing::warn!(error = %e, "reading the highest stored hash cost failed");
                }
                Ok(u32::try_from(sessions.len()).unwrap_or(u32::MAX))
            }
            _ => {
                if let Some(attempt) = attempt {
                    attempt.failed().await;
                }
                Err(Error::InvalidResetToken)
            }
        }
    }

    /// Deletes up to `limit` reset tokens expired at `now`.
    pub(super) async fn purge_resets(&self, now: i64, limit: i64) -> Result<u64, Error> {
        match self
            .store
            .reset_write(ResetWrite::Purge { now, limit })
            .await?
        {
            ResetAnswer::Count(n) => Ok(n),
            _ => Ok(0),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_random_and_kept_only_as_digests() {
        let (a, b) = (new_token(), new_token());
        assert_ne!(a, b);
        assert!(a.starts_with(PREFIX) && a.len() == PREFIX.len() + 43);
        assert_eq!(digest(&a).len(), 64);
        assert!(!digest(&a).contains(&a[PREFIX.len()..]));
    }
}
