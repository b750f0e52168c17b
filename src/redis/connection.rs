//! The process's one Redis connection, shared by the rate limiter and the login
//! throttle, and the calls made on it: one multiplexed connection (the redis crate's
//! `ConnectionManager`, which reconnects by itself once it has connected) per
//! replica, one place that connects, and one [`Health`] flag.
//!
//! Connecting never makes a request wait: a call while there is no connection fails
//! at once, and connections are made only at start ([`SharedRedis::start`]) and by
//! the prober (`super::health`), each within its own timeout.

use super::{
    RedisFailure,
    health::{Health, spawn_prober},
    within,
};
use crate::secret::RedisUrl;
use redis::{Client, FromRedisValue, Script, ScriptInvocation, aio::ConnectionManager};
use std::{
    fmt,
    sync::{
        Arc, Mutex, OnceLock,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

/// The shortest time a connection attempt (or a probe) is given.
const MIN_CONNECT_TIMEOUT: Duration = Duration::from_millis(500);

/// A Redis server, and the connection to it once made.
pub struct SharedRedis {
    url: RedisUrl,
    client: Client,
    /// Set by the first connection that succeeds; kept for good (it reconnects).
    connection: OnceLock<ConnectionManager>,
    /// Whether Redis answers: shared by every user (`Arc`: the metrics read it).
    health: Arc<Health>,
    /// The users' scripts, loaded by every probe.
    scripts: Mutex<Vec<Script>>,
    /// The prober runs (it is started once).
    probing: AtomicBool,
}

impl fmt::Debug for SharedRedis {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SharedRedis")
            .field("url", &self.url.to_string())
            .field("connected", &self.connection.get().is_some())
            .field("up", &self.health.is_up())
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
            health: Arc::default(),
            scripts: Mutex::default(),
            probing: AtomicBool::new(false),
        }))
    }

    /// The URL, for log lines (its password redacted when shown).
    pub fn url(&self) -> &RedisUrl {
        &self.url
    }

    /// The connection, once one was made.
    fn get(&self) -> Option<ConnectionManager> {
        self.connection.get().cloned()
    }

    /// Whether Redis answers, as every user of the connection sees it.
    pub(crate) fn health(&self) -> &Arc<Health> {
        &self.health
    }

    /// Has every probe load `script` too, so that it is in Redis' cache before the
    /// first call after Redis restarts.
    pub(crate) fn load_on_probe(&self, script: &Script) {
        (self.scripts.lock().unwrap_or_else(|e| e.into_inner())).push(script.clone());
    }

    /// At start: connects and probes (waiting at most `timeout`, at least half a
    /// second), marks the connection up if Redis answered, and starts the prober
    /// that brings it back whenever it is down. Called by each user; only the first
    /// starts the prober, and a connection found up is not probed again.
    pub(crate) async fn start(self: &Arc<Self>, timeout: Duration) -> Result<(), RedisFailure> {
        let probed = if self.health.is_up() {
            Ok(())
        } else {
            self.probe(timeout).await
        };
        if probed.is_ok() {
            self.health.started();
        }
        if !self.probing.swap(true, Ordering::SeqCst) {
            spawn_prober(Arc::downgrade(self));
        }
        probed
    }

    /// Connects if not yet connected, then loads the users' scripts (or, with none,
    /// pings): proves the whole path works, within `timeout` (at least half a
    /// second).
    pub(super) async fn probe(&self, timeout: Duration) -> Result<(), RedisFailure> {
        let timeout = timeout.max(MIN_CONNECT_TIMEOUT);
        let scripts = (self.scripts.lock().unwrap_or_else(|e| e.into_inner())).clone();
        let work = async {
            let mut connection = self.connect(timeout).await?;
            if scripts.is_empty() {
                redis::cmd("PING")
                    .query_async::<()>(&mut connection)
                    .await?;
            }
            for script in &scripts {
                script.load_async(&mut connection).await?;
            }
            Ok::<(), RedisFailure>(())
        };
        within(timeout, work).await
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
    /// there is no connection, or while it is marked down: an outage costs the
    /// callers one timeout, not one per call.
    pub(crate) async fn invoke<T: FromRedisValue>(
        &self,
        invocation: &ScriptInvocation<'_>,
        timeout: Duration,
    ) -> Result<T, RedisFailure> {
        let connection = self.get().ok_or(RedisFailure::NotConnected)?;
        if !self.health.is_up() {
            return Err(RedisFailure::Down);
        }
        Self::call(connection, invocation, timeout).await
    }

    /// As [`invoke`](Self::invoke), even while the connection is marked down: for a
    /// caller that read the health itself, or a call no request waits for.
    pub(crate) async fn invoke_anyway<T: FromRedisValue>(
        &self,
        invocation: &ScriptInvocation<'_>,
        timeout: Duration,
    ) -> Result<T, RedisFailure> {
        let connection = self.get().ok_or(RedisFailure::NotConnected)?;
        Self::call(connection, invocation, timeout).await
    }

    async fn call<T: FromRedisValue>(
        mut connection: ConnectionManager,
        invocation: &ScriptInvocation<'_>,
        timeout: Duration,
    ) -> Result<T, RedisFailure> {
        within(timeout, invocation.invoke_async(&mut connection)).await
    }
}
