//! The second factor in the store: TOTP factors (the sealed secret, whether it is
//! on, the last step accepted), recovery codes (digests) and Login's challenges.
//!
//! Every guarantee is decided by one conditional statement, so it holds across
//! requests at once and across replicas sharing one database:
//! - a code is accepted by the update that raises `last_step` to its step, only
//!   from below (`last_step < step`): of two uses of one code, one affects the row;
//! - a recovery code is used by deleting its row: one delete affects it;
//! - a challenge's attempts are taken one by one by an update bounded by the limit,
//!   and it is used by the update that sets `used_at`, only while unset.
//!
//! A proof (a code or a recovery code) and what it is for (completing a challenge,
//! turning the factor off, replacing the recovery codes) are one transaction
//! ([`FactorWrite::Prove`]): nothing is done on a proof refused, and a proof is not
//! used up for a challenge that is gone. The reads ([`factor`], [`live_challenge`])
//! run on either backend's [`Conns`]; the writes ([`factor_write`]) on a [`Conn`]
//! inside the transaction each backend holds.

use super::{
    db::{Conn, Conns, Statement},
    error::StoreError,
};

pub(super) mod sql {
    pub const FACTOR: &str =
        "SELECT secret, enabled_at, last_step FROM totp_factors WHERE user_id = $1";
    /// A new pending enrollment, or a new secret for the one pending; nothing while
    /// the factor is on (or the user is gone).
    pub const BEGIN: &str = "INSERT INTO totp_factors \
         (user_id, secret, enabled_at, last_step, created_at) \
         SELECT id, $2, NULL, 0, $3 FROM users WHERE id = $1 \
         ON CONFLICT (user_id) DO UPDATE SET secret = excluded.secret, \
         created_at = excluded.created_at, last_step = 0 \
         WHERE totp_factors.enabled_at IS NULL";
    /// Turns on the pending factor whose secret the code was checked against.
    pub const CONFIRM: &str = "UPDATE totp_factors SET enabled_at = $1, last_step = $2 \
         WHERE user_id = $3 AND secret = $4 AND enabled_at IS NULL AND last_step < $2";
    pub const USE_STEP: &str = "UPDATE totp_factors SET last_step = $1 \
         WHERE user_id = $2 AND enabled_at IS NOT NULL AND last_step < $1";
    pub const USE_RECOVERY: &str = "DELETE FROM recovery_codes WHERE user_id = $1 AND digest = $2 \
         AND EXISTS (SELECT 1 FROM totp_factors f WHERE f.user_id = $1 \
                     AND f.enabled_at IS NOT NULL)";
    pub const DELETE_RECOVERY: &str = "DELETE FROM recovery_codes WHERE user_id = $1";
    pub const INSERT_RECOVERY: &str =
        "INSERT INTO recovery_codes (user_id, digest) VALUES ($1, $2) ON CONFLICT DO NOTHING";
    pub const DELETE_FACTOR: &str = "DELETE FROM totp_factors WHERE user_id = $1";
    pub const DELETE_CHALLENGES: &str = "DELETE FROM login_challenges WHERE user_id = $1";
    /// A user's challenges that expired: cleared as a new one is stored.
    pub const PURGE_CHALLENGES: &str =
        "DELETE FROM login_challenges WHERE user_id = $1 AND expires_at <= $2";
    /// Anyone's, by the upkeep, a batch at a time (through the index on the end).
    pub const PURGE_EXPIRED_CHALLENGES: &str = "DELETE FROM login_challenges WHERE digest IN \
         (SELECT digest FROM login_challenges WHERE expires_at <= $1 LIMIT $2)";
    pub const INSERT_CHALLENGE: &str = "INSERT INTO login_challenges \
         (digest, user_id, password_version, created_at, expires_at, attempts) \
         VALUES ($1, $2, $3, $4, $5, 0)";
    pub const LIVE_CHALLENGE: &str = "SELECT user_id, password_version FROM login_challenges \
         WHERE digest = $1 AND used_at IS NULL AND expires_at > $2 AND attempts < $3";
    /// Takes one attempt of a live challenge, within its limit.
    pub const ATTEMPT: &str = "UPDATE login_challenges SET attempts = attempts + 1 \
         WHERE digest = $1 AND used_at IS NULL AND expires_at > $2 AND attempts < $3 \
         RETURNING user_id";
    pub const USE_CHALLENGE: &str = "UPDATE login_challenges SET used_at = $1 \
         WHERE digest = $2 AND user_id = $3 AND used_at IS NULL AND expires_at > $1";
    pub const UNUSE_CHALLENGE: &str =
        "UPDATE login_challenges SET used_at = NULL WHERE digest = $1";
}

/// A user's TOTP factor as stored.
#[derive(Clone)]
pub struct Factor {
    /// The sealed secret (`KID:BASE64`), never the secret.
    pub sealed: String,
    /// On (confirmed), or pending.
    pub enabled: bool,
    /// The step of the last code accepted.
    pub last_step: i64,
}

impl std::fmt::Debug for Factor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Factor")
            .field("enabled", &self.enabled)
            .field("last_step", &self.last_step)
            .finish_non_exhaustive()
    }
}

/// A live challenge: whose, and the password version its Login verified.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LiveChallenge {
    pub user_id: String,
    pub password_version: i64,
}

/// What proves the factor.
#[derive(Debug, Clone)]
pub enum Proof {
    /// A code of this step (checked against the secret by the caller).
    Step(i64),
    /// The digest of a recovery code.
    Recovery(String),
}

/// What a proof is for.
#[derive(Debug, Clone)]
pub enum Purpose {
    /// Completing the challenge of this digest.
    Challenge(String),
    /// Turning the factor off: it and its recovery codes are deleted.
    Disable,
    /// Replacing the recovery codes with these digests.
    Replace(Vec<String>),
}

/// A write of the second factor, one transaction.
#[derive(Debug, Clone)]
pub enum FactorWrite {
    Begin {
        user_id: String,
        sealed: String,
        now: i64,
    },
    Confirm {
        user_id: String,
        sealed: String,
        step: i64,
        recovery: Vec<String>,
        now: i64,
    },
    Prove {
        user_id: String,
        proof: Proof,
        purpose: Purpose,
        now: i64,
    },
    NewChallenge {
        digest: String,
        user_id: String,
        password_version: i64,
        now: i64,
        expires_at: i64,
    },
    Attempt {
        digest: String,
        now: i64,
        max: i64,
    },
    /// An administrator removes the factor (and the recovery codes, the challenges).
    Remove {
        user_id: String,
    },
    /// Deletes up to `limit` challenges that expired by `now`.
    PurgeChallenges {
        now: i64,
        limit: i64,
    },
}

/// What a proof came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Proved {
    Accepted,
    /// A code of a step accepted before (or a wrong step), a recovery code unknown
    /// or used, or no factor on: nothing changed.
    Refused,
    /// The challenge is used, expired or not the user's: nothing changed.
    ChallengeGone,
}

/// What a [`FactorWrite`] came to.
#[derive(Debug, Clone)]
pub enum FactorAnswer {
    /// Whether the conditional write wrote.
    Wrote(bool),
    Proved(Proved),
    /// The user of the challenge whose attempt was taken; `None`: no attempt left
    /// (or no such live challenge).
    Attempted(Option<String>),
    /// How many rows a purge deleted.
    Count(u64),
}

/// The factor of `user_id`, read on `conns`.
pub(super) async fn factor(conns: Conns<'_>, user_id: &str) -> Result<Option<Factor>, StoreError> {
    let query = Statement::new(sql::FACTOR).bind(user_id);
    let Some(row) = conns.fetch_optional(query).await? else {
        return Ok(None);
    };
    let enabled_at: Option<i64> = row.get("enabled_at").map_err(StoreError::from)?;
    Ok(Some(Factor {
        sealed: row.get("secret").map_err(StoreError::from)?,
        enabled: enabled_at.is_some(),
        last_step: row.get("last_step").map_err(StoreError::from)?,
    }))
}

/// The challenge of `digest` if it is live at `now` with attempts left (of `max`).
pub(super) async fn live_challenge(
    conns: Conns<'_>,
    digest: &str,
    now: i64,
    max: i64,
) -> Result<Option<LiveChallenge>, StoreError> {
    let query = (Statement::new(sql::LIVE_CHALLENGE))
        .bind(digest)
        .bind(now)
        .bind(max);
    let Some(row) = conns.fetch_optional(query).await? else {
        return Ok(None);
    };
    Ok(Some(LiveChallenge {
        user_id: row.get("user_id").map_err(StoreError::from)?,
        password_version: row.get("password_version").map_err(StoreError::from)?,
    }))
}

// The second factor's writes. Each runs inside a transaction its caller holds.

async fn replace_recovery(
    conn: &mut Conn<'_>,
    user_id: &str,
    digests: &[String],
) -> Result<(), sqlx::Error> {
    conn.execute(Statement::new(sql::DELETE_RECOVERY).bind(user_id))
        .await?;
    for digest in digests {
        conn.execute(
            Statement::new(sql::INSERT_RECOVERY)
                .bind(user_id)
                .bind(digest.as_str()),
        )
        .await?;
    }
    Ok(())
}

async fn remove_factor(conn: &mut Conn<'_>, user_id: &str) -> Result<bool, sqlx::Error> {
    let removed = conn
        .execute(Statement::new(sql::DELETE_FACTOR).bind(user_id))
        .await?
        == 1;
    conn.execute(Statement::new(sql::DELETE_RECOVERY).bind(user_id))
        .await?;
    Ok(removed)
}

async fn prove(conn: &mut Conn<'_>, user_id: &str, proof: &Proof) -> Result<bool, sqlx::Error> {
    let done = match proof {
        Proof::Step(step) => {
            conn.execute(Statement::new(sql::USE_STEP).bind(*step).bind(user_id))
                .await?
        }
        Proof::Recovery(digest) => {
            conn.execute(
                Statement::new(sql::USE_RECOVERY)
                    .bind(user_id)
                    .bind(digest.as_str()),
            )
            .await?
        }
    };
    Ok(done == 1)
}

pub(super) async fn factor_write(
    conn: &mut Conn<'_>,
    write: &FactorWrite,
) -> Result<FactorAnswer, sqlx::Error> {
    Ok(match write {
        FactorWrite::Begin {
            user_id,
            sealed,
            now,
        } => {
            let done = conn
                .execute(
                    Statement::new(sql::BEGIN)
                        .bind(user_id.as_str())
                        .bind(sealed.as_str())
                        .bind(*now),
                )
                .await?;
            FactorAnswer::Wrote(done == 1)
        }
        FactorWrite::Confirm {
            user_id,
            sealed,
            step,
            recovery,
            now,
        } => {
            let on = conn
                .execute(
                    Statement::new(sql::CONFIRM)
                        .bind(*now)
                        .bind(*step)
                        .bind(user_id.as_str())
                        .bind(sealed.as_str()),
                )
                .await?
                == 1;
            if on {
                replace_recovery(conn, user_id, recovery).await?;
            }
            FactorAnswer::Wrote(on)
        }
        FactorWrite::Prove {
            user_id,
            proof,
            purpose,
            now,
        } => {
            // The challenge first: its row is taken (locked on PostgreSQL)
            // before the proof is used, and given back if the proof fails.
            if let Purpose::Challenge(digest) = purpose {
                let taken = conn
                    .execute(
                        Statement::new(sql::USE_CHALLENGE)
                            .bind(*now)
                            .bind(digest.as_str())
                            .bind(user_id.as_str()),
                    )
                    .await?
                    == 1;
                if !taken {
                    return Ok(FactorAnswer::Proved(Proved::ChallengeGone));
                }
            }
            if !prove(conn, user_id, proof).await? {
                if let Purpose::Challenge(digest) = purpose {
                    conn.execute(Statement::new(sql::UNUSE_CHALLENGE).bind(digest.as_str()))
                        .await?;
                }
                return Ok(FactorAnswer::Proved(Proved::Refused));
            }
            match purpose {
                Purpose::Challenge(_) => {}
                Purpose::Disable => {
                    remove_factor(conn, user_id).await?;
                }
                Purpose::Replace(digests) => {
                    replace_recovery(conn, user_id, digests).await?;
                }
            }
            FactorAnswer::Proved(Proved::Accepted)
        }
        FactorWrite::NewChallenge {
            digest,
            user_id,
            password_version,
            now,
            expires_at,
        } => {
            conn.execute(
                Statement::new(sql::PURGE_CHALLENGES)
                    .bind(user_id.as_str())
                    .bind(*now),
            )
            .await?;
            conn.execute(
                Statement::new(sql::INSERT_CHALLENGE)
                    .bind(digest.as_str())
                    .bind(user_id.as_str())
                    .bind(*password_version)
                    .bind(*now)
                    .bind(*expires_at),
            )
            .await?;
            FactorAnswer::Wrote(true)
        }
        FactorWrite::Attempt { digest, now, max } => {
            let user: Option<String> = conn
                .fetch_optional(
                    Statement::new(sql::ATTEMPT)
                        .bind(digest.as_str())
                        .bind(*now)
                        .bind(*max),
                )
                .await?
                .map(|row| row.first())
                .transpose()?;
            FactorAnswer::Attempted(user)
        }
        FactorWrite::PurgeChallenges { now, limit } => {
            let done = conn
                .execute(
                    Statement::new(sql::PURGE_EXPIRED_CHALLENGES)
                        .bind(*now)
                        .bind(*limit),
                )
                .await?;
            FactorAnswer::Count(done)
        }
        FactorWrite::Remove { user_id } => {
            conn.execute(Statement::new(sql::DELETE_CHALLENGES).bind(user_id.as_str()))
                .await?;
            FactorAnswer::Wrote(remove_factor(conn, user_id).await?)
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        credentials::Username,
        metrics::Metrics,
        store::{NewUser, SqliteSettings, Store, StoreSettings},
    };
    use std::time::Duration;

    async fn store(dir: &tempfile::TempDir) -> Store {
        let settings = StoreSettings::Sqlite(SqliteSettings {
            path: dir.path().join("t.db"),
            readers: 2,
            acquire_timeout: Duration::from_secs(5),
            max_batch: 64,
            statement_timeout: Duration::from_secs(5),
        });
        let clock = std::sync::Arc::new(crate::clock::SystemClock);
        let store = Store::open(settings, &Metrics::new(), clock).await.unwrap();
        let user = NewUser {
            id: "u1".into(),
            username: Username::parse("ulla").unwrap(),
            password_hash: "hash".into(),
            password_hash_ext: None,
        };
        store.insert_user(user).await.unwrap();
        store
    }

    fn challenge(digest: &str, expires_at: i64) -> FactorWrite {
        FactorWrite::NewChallenge {
            digest: digest.into(),
            user_id: "u1".into(),
            password_version: 0,
            now: 0,
            expires_at,
        }
    }

    #[tokio::test]
    async fn steps_only_rise_and_expired_challenges_are_purged_in_batches() {
        let dir = tempfile::tempdir().unwrap();
        let store = store(&dir).await;
        let begin = FactorWrite::Begin {
            user_id: "u1".into(),
            sealed: "k:sealed".into(),
            now: 0,
        };
        assert!(matches!(
            store.factor_write(begin).await.unwrap(),
            FactorAnswer::Wrote(true)
        ));
        let confirm = |step| FactorWrite::Confirm {
            user_id: "u1".into(),
            sealed: "k:sealed".into(),
            step,
            recovery: vec!["d1".into()],
            now: 0,
        };
        let wrote = |a| matches!(a, FactorAnswer::Wrote(true));
        assert!(wrote(store.factor_write(confirm(10)).await.unwrap()));
        assert!(
            !wrote(store.factor_write(confirm(11)).await.unwrap()),
            "on already"
        );
        let prove = |proof| FactorWrite::Prove {
            user_id: "u1".into(),
            proof,
            purpose: Purpose::Disable,
            now: 0,
        };
        for proof in [
            Proof::Step(10),
            Proof::Step(9),
            Proof::Recovery("d2".into()),
        ] {
            let answer = store.factor_write(prove(proof)).await.unwrap();
            assert!(
                matches!(answer, FactorAnswer::Proved(Proved::Refused)),
                "{answer:?}"
            );
        }
        let factor = store.factor("u1").await.unwrap().unwrap();
        assert!(factor.enabled && factor.last_step == 10);

        for (digest, end) in [("a", 10), ("b", 20), ("c", 1000)] {
            store.factor_write(challenge(digest, end)).await.unwrap();
        }
        let purge = || FactorWrite::PurgeChallenges { now: 500, limit: 1 };
        for expected in [1, 1, 0] {
            let answer = store.factor_write(purge()).await.unwrap();
            assert!(matches!(answer, FactorAnswer::Count(n) if n == expected));
        }
        assert!(store.live_challenge("c", 500, 5).await.unwrap().is_some());
        assert!(store.live_challenge("a", 5, 5).await.unwrap().is_none());
        store.close().await;
    }
}
