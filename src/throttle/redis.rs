//! The counts in Redis, shared by every replica: a hash per count (`f` failures,
//! `l` time of the last one, ms since the epoch) and a plain key per known client,
//! each with an expiry, under the rate limiter's prefix. A read is one round trip
//! (a pipeline of three commands); a failure one or two (the client's count, then,
//! for a client's first failures, the account's), each a MULTI so its fields and
//! expiry change together. Every call is bounded by `AUTHD_REDIS_TIMEOUT`.
//!
//! The connection is the process's one (`crate::shared_redis`, shared with the rate
//! limiter). While it is missing an attempt starts in the background, at most once
//! a second, so a Redis that is down never makes a login wait.

use super::{Count, KNOWN_CLIENT_FOR, Keys, Settings, Snapshot, counts_for_account, ms};
use crate::shared_redis::SharedRedis;
use std::{fmt, sync::Arc, time::Duration};

#[derive(Debug)]
pub(crate) enum RedisCountsError {
    NotConnected,
    Timeout(Duration),
    Redis(redis::RedisError),
}

impl fmt::Display for RedisCountsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RedisCountsError::NotConnected => f.write_str("not connected"),
            RedisCountsError::Timeout(t) => write!(f, "no answer within {t:?}"),
            // The crate's errors name the server's address, never its password.
            RedisCountsError::Redis(e) => write!(f, "{e}"),
        }
    }
}

pub(super) struct RedisCounts {
    redis: Arc<SharedRedis>,
    prefix: String,
    timeout: Duration,
}

impl RedisCounts {
    pub(super) fn new(redis: Arc<SharedRedis>, prefix: &str, timeout: Duration) -> Self {
        RedisCounts {
            redis,
            prefix: prefix.to_owned(),
            timeout,
        }
    }

    /// Connects now (at start) if not yet connected, waiting at most the timeout.
    pub(super) async fn connect(&self) {
        if let Err(e) = self.redis.connect(self.timeout).await {
            tracing::debug!(error = %e, "the login throttle cannot reach Redis yet");
        }
    }

    fn key(&self, key: &str) -> String {
        format!("{}{key}", self.prefix)
    }

    async fn run<T: redis::FromRedisValue>(
        &self,
        pipe: &redis::Pipeline,
    ) -> Result<T, RedisCountsError> {
        let mut connection = (self.redis)
            .get_or_reconnect(self.timeout)
            .ok_or(RedisCountsError::NotConnected)?;
        tokio::time::timeout(self.timeout, pipe.query_async(&mut connection))
            .await
            .map_err(|_| RedisCountsError::Timeout(self.timeout))?
            .map_err(RedisCountsError::Redis)
    }

    pub(super) async fn read(&self, keys: &Keys, _now: u64) -> Result<Snapshot, RedisCountsError> {
        let mut pipe = redis::pipe();
        pipe.cmd("HMGET")
            .arg(self.key(&keys.pair))
            .arg("f")
            .arg("l")
            .cmd("HMGET")
            .arg(self.key(&keys.account))
            .arg("f")
            .arg("l")
            .cmd("EXISTS")
            .arg(self.key(&keys.known));
        type Pair = (Option<u32>, Option<u64>);
        let (pair, account, known): (Pair, Pair, u8) = self.run(&pipe).await?;
        let count = |(f, l): Pair| Count {
            failures: f.unwrap_or(0),
            last_ms: l.unwrap_or(0),
        };
        Ok(Snapshot {
            pair: count(pair),
            account: count(account),
            known: known > 0,
        })
    }

    /// Adds one failure under `key`, returns the new count.
    async fn bump(&self, key: &str, now: u64, ttl: Duration) -> Result<u32, RedisCountsError> {
        let key = self.key(key);
        let mut pipe = redis::pipe();
        pipe.atomic()
            .cmd("HINCRBY")
            .arg(&key)
            .arg("f")
            .arg(1)
            .cmd("HSET")
            .arg(&key)
            .arg("l")
            .arg(now)
            .ignore()
            .cmd("PEXPIRE")
            .arg(&key)
            .arg(ms(ttl))
            .ignore();
        let (failures,): (u32,) = self.run(&pipe).await?;
        Ok(failures)
    }

    pub(super) async fn record_failure(
        &self,
        keys: &Keys,
        now: u64,
        threshold: u32,
        s: &Settings,
    ) -> Result<(), RedisCountsError> {
        let pair = self.bump(&keys.pair, now, s.pair_ttl()).await?;
        if counts_for_account(pair, threshold) {
            self.bump(&keys.account, now, s.account_ttl()).await?;
        }
        Ok(())
    }

    pub(super) async fn record_success(&self, keys: &Keys) -> Result<(), RedisCountsError> {
        let mut pipe = redis::pipe();
        pipe.cmd("DEL")
            .arg(self.key(&keys.pair))
            .ignore()
            .cmd("SET")
            .arg(self.key(&keys.known))
            .arg(1)
            .arg("PX")
            .arg(ms(KNOWN_CLIENT_FOR))
            .ignore();
        let () = self.run(&pipe).await?;
        Ok(())
    }
}
