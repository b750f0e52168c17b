//! The session upkeep of one replica: the revocation set filled from the store at
//! start and polled every `AUTHD_REVOCATION_DELAY / 2` for what other replicas
//! revoked (ended sessions, per-user cutoffs), and the purge of sessions and cutoffs
//! no token needs any more, and of Login challenges that expired.

use super::{Accounts, millis};
use crate::{error::Error, revocation::CLOCK_SKEW, store::EndReason};
use std::{sync::Arc, time::Duration};

/// Each revocation poll reads back this far before the latest end it has seen:
/// ends written with a clock a little behind, or committed a little late.
pub(super) const POLL_LOOKBACK_MS: i64 = 5_000;
/// Ended sessions (or cutoffs) read per query of a poll.
pub(super) const POLL_PAGE: i64 = 1_000;
/// How often ended and expired sessions are deleted, and how many per statement.
const PURGE_INTERVAL: Duration = Duration::from_secs(60);
const PURGE_BATCH: i64 = 1_000;

impl Accounts {
    /// How long an end matters: until the last access token it refuses expires.
    pub(super) fn keep_ms(&self) -> i64 {
        millis(self.settings.token_ttl + CLOCK_SKEW)
    }

    /// Reads every end and cutoff that still matters into the revocation set, before
    /// the server answers its first request: a restarted replica (and a SQLite one,
    /// whose poller reads nothing later) refuses what was revoked before it started.
    pub async fn load_revocations(&self) -> Result<usize, Error> {
        let start = self.clock.millis().saturating_sub(self.keep_ms());
        let (mut ended, mut cutoffs) = (start, start);
        Ok(
            self.poll_ended(&mut ended, true).await?
                + self.poll_cutoffs(&mut cutoffs, true).await?,
        )
    }

    /// Reads the sessions ended and the user cutoffs written (on any replica) since
    /// `cursor`, the latest of each seen, into the revocation set; forgets the
    /// entries no token needs.
    async fn poll_revocations(&self, cursor: &mut Cursors) -> Result<usize, Error> {
        // SQLite: one process, whose every end and cutoff goes into the set when it
        // is made, and those made before it started were read at start
        // (`load_revocations`).
        let read_store = self.store.is_shared();
        let read = self.poll_ended(&mut cursor.ended, read_store).await?
            + self.poll_cutoffs(&mut cursor.cutoffs, read_store).await?;
        self.revocations.forget_expired(self.clock.millis());
        *self.synced.lock().unwrap_or_else(|e| e.into_inner()) = self.clock.now();
        Ok(read)
    }

    /// Reads the sessions ended since `cursor`, the latest end seen.
    async fn poll_ended(&self, cursor: &mut i64, read_store: bool) -> Result<usize, Error> {
        let now = self.clock.millis();
        let mut after = (cursor.saturating_sub(POLL_LOOKBACK_MS), String::new());
        let mut read = 0;
        if !read_store {
            return Ok(0);
        }
        loop {
            let page = self
                .store
                .ended_since((after.0, &after.1), POLL_PAGE)
                .await?;
            for ended in &page {
                self.revocations.insert(&ended.id, ended.ended_at, now);
            }
            read += page.len();
            let Some(last) = page.last() else { break };
            *cursor = (*cursor).max(last.ended_at);
            after = (last.ended_at, last.id.clone());
            if (page.len() as i64) < POLL_PAGE {
                break;
            }
        }
        Ok(read)
    }

    /// Deletes sessions that expired, and sessions ended so long ago that no
    /// access token of theirs is valid (every poller has read them by then).
    async fn purge_sessions(&self) -> Result<(), Error> {
        let now = self.clock.millis();
        let ended_before = now
            .saturating_sub(self.keep_ms())
            .saturating_sub(POLL_LOOKBACK_MS);
        // A few batches per pass: the table shrinks steadily, no statement is long.
        for _ in 0..10 {
            let purged = self
                .store
                .purge_sessions(now, ended_before, PURGE_BATCH)
                .await?;
            self.counters
                .ended(EndReason::Expired, purged.expired as usize);
            if purged.expired < PURGE_BATCH as u64 && purged.ended < PURGE_BATCH as u64 {
                break;
            }
        }
        for _ in 0..10 {
            let purged = self.store.purge_cutoffs(ended_before, PURGE_BATCH).await?;
            if purged < PURGE_BATCH as u64 {
                break;
            }
        }
        // Login challenges that expired (by the second factor's clock).
        for _ in 0..10 {
            if self.purge_challenges(PURGE_BATCH).await? < PURGE_BATCH as u64 {
                break;
            }
        }
        // Password reset tokens that expired.
        for _ in 0..10 {
            if self.purge_resets(now, PURGE_BATCH).await? < PURGE_BATCH as u64 {
                break;
            }
        }
        Ok(())
    }

    /// The session upkeep of one replica, until the task is aborted: polls for
    /// ended sessions every `poll_every` (half of `AUTHD_REVOCATION_DELAY`) and
    /// purges every minute. While the database cannot be reached, ValidateToken
    /// keeps answering from the set it has (see docs/sessions.md); the failure is
    /// counted, logged once per outage, and `authd_revocation_sync_age_seconds` grows.
    pub async fn upkeep(self: Arc<Self>, poll_every: Duration) {
        // Everything ended or cut off recently enough to matter, on the first poll.
        let start = self.clock.millis().saturating_sub(self.keep_ms());
        let mut cursor = Cursors {
            ended: start,
            cutoffs: start,
        };
        let mut poll = tokio::time::interval(poll_every);
        poll.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        // The first purge a minute after the start, not at once. Both timers schedule
        // work in real time (how often to look); what is kept reads the clock.
        let mut purge =
            tokio::time::interval_at(tokio::time::Instant::now() + PURGE_INTERVAL, PURGE_INTERVAL);
        purge.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut failing = false;
        loop {
            tokio::select! {
                _ = poll.tick() => match self.poll_revocations(&mut cursor).await {
                    Ok(_) if failing => {
                        failing = false;
                        tracing::info!("reading ended sessions works again");
                    }
                    Ok(_) => {}
                    Err(e) => {
                        self.counters.poll_errors.inc();
                        if !failing {
                            failing = true;
                            tracing::warn!(
                                error = %e,
                                "cannot read the sessions ended on other replicas; \
                                 validating with the revocations known so far"
                            );
                        }
                    }
                },
                _ = purge.tick() => {
                    if let Err(e) = self.purge_sessions().await {
                        tracing::warn!(error = %e, "purging ended and expired sessions failed");
                    }
                }
            }
        }
    }
}

/// Where a revocation poll goes on from: the latest end and the latest cutoff seen.
struct Cursors {
    ended: i64,
    cutoffs: i64,
}
