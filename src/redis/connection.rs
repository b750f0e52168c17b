//! The process's one Redis connection, shared by the rate limiter and the login
//! throttle, and the calls made on it: one multiplexed connection (the redis crate's `ConnectionManager`,
//! which reconnects by itself once it has connected) per replica, one place that
//! connects.
//!
//! Connecting never makes a request wait: a caller that finds no connection gets
//! `None` at once, and an attempt starts in the background (at most one a second);
//! only start-up and the rate limiter's health probe wait for one, within their own
//! timeout.

use super::{RedisFailure, within};
use crate::secret::RedisUrl;
use redis::{Client, FromRedisValue, ScriptInvocation, aio::ConnectionManager};
use std::{
    fmt,
    sync::{Arc, Mutex, OnceLock},
    time::{Duration, Instant},
};

/// How often, at most, a background connection attempt starts.
const RETRY_EVERY: Duration = Duration::from_secs(1);
/// The shortest time a connection attempt is given.
const MIN_CONNECT_TIMEOUT: Duration = Duration::from_millis(500);

/// A Redis server, and the connection to it once made.
pub struct SharedRedis {
    url: RedisUrl,
    client: Client,
    /// Set by the first connection that succeeds; kept for good (it reconnects).
    connection: OnceLock<ConnectionManager>,
    /// When the last background attempt started.
    last_attempt: Mutex<Option<Instant>>,
}

impl fmt::Debug for SharedRedis {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SharedRedis")
            .field("url", &self.url.to_string())
            .field("connected", &self.connection.get().is_some())
            .finish()
    }
}

impl SharedRedis {
    /// The server at `url`; nothing is connected yet.
    pub fn open(url: &RedisUrl) -> anyhow::Result<Arc<Self>> {
        let client = Client::open(url.expose())
            .map_err(|e| anyhow::anyhow!("{url} is not a usable Redis URL ({:?})", e.kind()))?;
        Ok(Arc::new(SharedRedis {
            url: url.clone(),
            client,
            connection: OnceLock::new(),
            last_attempt: Mutex::new(None),
        }))
    }

    /// The URL, for log lines (its password redacted when shown).
    pub fn url(&self) -> &RedisUrl {
        &self.url
    }

    /// The connection, once one was made.
    pub(crate) fn get(&self) -> Option<ConnectionManager> {
        self.connection.get().cloned()
    }

    /// The connection; else `None` now, and an attempt started in the background
    /// (at most one a second, each given `timeout`).
    pub(crate) fn get_or_reconnect(
        self: &Arc<Self>,
        timeout: Duration,
    ) -> Option<ConnectionManager> {
        if let Some(c) = self.get() {
            return Some(c);
        }
        let mut last = self.last_attempt.lock().unwrap_or_else(|e| e.into_inner());
        if last.is_none_or(|t| t.elapsed() >= RETRY_EVERY)
            && let Ok(runtime) = tokio::runtime::Handle::try_current()
        {
            *last = Some(Instant::now());
            let redis = self.clone();
            runtime.spawn(async move {
                if let Err(e) = redis.connect(timeout).await {
                    tracing::debug!(error = %e, "Redis does not answer yet");
                }
            });
        }
        None
    }

    /// The connection, made now if there is none, waiting at most `timeout` (at
    /// least half a second).
    pub(crate) async fn connect(
        &self,
        timeout: Duration,
    ) -> Result<ConnectionManager, RedisFailure> {
        if let Some(c) = self.get() {
            return Ok(c);
        }
        let timeout = timeout.max(MIN_CONNECT_TIMEOUT);
        let config = redis::aio::ConnectionManagerConfig::new()
            .set_connection_timeout(Some(timeout))
            // The callers try again themselves; the manager's own retries would only
            // keep them waiting.
            .set_number_of_retries(0)
            .set_max_delay(Duration::from_millis(500));
        let manager = tokio::time::timeout(
            timeout,
            ConnectionManager::new_with_config(self.client.clone(), config),
        )
        .await
        .map_err(|_| RedisFailure::ConnectTimeout(timeout))?
        .map_err(RedisFailure::Redis)?;
        // Another attempt may have won the race: use whichever was stored.
        Ok(self.connection.get_or_init(|| manager).clone())
    }

    /// Runs a script within `timeout`: the one shape of every script call
    /// (`EVALSHA`, and the script loaded again if Redis lost it). Fails at once while
    /// there is no connection.
    pub(crate) async fn invoke<T: FromRedisValue>(
        &self,
        invocation: &ScriptInvocation<'_>,
        timeout: Duration,
    ) -> Result<T, RedisFailure> {
        let mut connection = self.get().ok_or(RedisFailure::NotConnected)?;
        within(timeout, invocation.invoke_async(&mut connection)).await
    }
}
