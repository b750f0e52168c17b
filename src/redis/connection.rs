//! The process's one Redis connection, shared by the rate limiter and the login
//! throttle, and the calls made on it: one multiplexed connection per replica (the
//! redis crate's `ConnectionManager`, which reconnects by itself once it has
//! connected; on a Redis Cluster its cluster connection, one multiplexed connection
//! per node, following MOVED, ASK and topology changes), one place that connects,
//! and one [`Health`] flag. With Sentinel the master is asked of the sentinels at
//! every connection and every probe, so a failover is followed once the connection
//! has failed and the prober runs.
//!
//! Connecting never makes a request wait: a call while there is no connection fails
//! at once, and connections are made only at start ([`SharedRedis::start`]) and by
//! the prober (`super::health`), each within its own timeout.

use super::{
    RedisFailure,
    health::{Health, spawn_prober},
    within,
};
use crate::secret::{RedisTarget, RedisUrl};
use redis::{
    Client, Cmd, FromRedisValue, IntoConnectionInfo, Pipeline, RedisFuture, Script,
    ScriptInvocation, Value,
    aio::{ConnectionLike, ConnectionManager},
    cluster::ClusterClient,
    cluster_async::ClusterConnection,
    sentinel::{SentinelClient, SentinelNodeConnectionInfo, SentinelServerType},
};
use std::{
    fmt,
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

/// The shortest time a connection attempt (or a probe) is given.
const MIN_CONNECT_TIMEOUT: Duration = Duration::from_millis(500);

/// How a Redis URL is reached.
enum Target {
    /// One server.
    Single(Client),
    /// A Redis Cluster: the crate's cluster client follows MOVED and ASK, and learns
    /// the topology again when it changes.
    Cluster(ClusterClient),
    /// A master found through its sentinels, asked again after every failure (the
    /// crate resolves the master only when connecting, redis-rs#1438).
    Sentinel(tokio::sync::Mutex<SentinelClient>),
}

/// The connection every call is made on: cheap to clone (a handle on one
/// multiplexed connection per server).
#[derive(Clone)]
pub(crate) enum Link {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
}

impl ConnectionLike for Link {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Link::Single(c) => c.req_packed_command(cmd),
            Link::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Link::Single(c) => c.req_packed_commands(pipeline, offset, count),
            Link::Cluster(c) => c.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Link::Single(c) => c.get_db(),
            Link::Cluster(c) => c.get_db(),
        }
    }
}

/// A Redis server (or cluster, or Sentinel-watched master), and the connection to
/// it once made.
pub struct SharedRedis {
    url: RedisUrl,
    target: Target,
    /// Set by the first connection that succeeds and kept (it reconnects); replaced
    /// only when the sentinels name another master.
    connection: Mutex<Option<Link>>,
    /// The server the connection is to (`host:port`): the master Sentinel named.
    node: Mutex<Option<String>>,
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
            .field("connected", &self.get().is_some())
            .field("node", &self.node())
            .field("up", &self.health.is_up())
            .finish()
    }
}

impl SharedRedis {
    /// The server at `url`; nothing is connected yet.
    pub fn open(url: &RedisUrl) -> anyhow::Result<Arc<Self>> {
        // The error's kind only: its text may quote the URL, secret included.
        let unusable = |e: redis::RedisError| {
            anyhow::anyhow!("{url} is not a usable Redis URL ({:?})", e.kind())
        };
        let target = match url.target() {
            RedisTarget::Single(url) => Target::Single(Client::open(url).map_err(unusable)?),
            RedisTarget::Cluster(nodes) => Target::Cluster(
                ClusterClient::builder(nodes)
                    .connection_timeout(MIN_CONNECT_TIMEOUT)
                    // A request waits `AUTHD_REDIS_TIMEOUT` at most (`within`); the
                    // client's own retries (a node restarting, a slot moving) stay
                    // short within it.
                    .retries(3)
                    .min_retry_wait(5)
                    .max_retry_wait(100)
                    .build()
                    .map_err(unusable)?,
            ),
            RedisTarget::Sentinel {
                sentinels,
                master,
                settings,
            } => {
                let settings = settings.into_connection_info().map_err(unusable)?;
                let node = SentinelNodeConnectionInfo::default()
                    .set_redis_connection_info(settings.redis_settings().clone());
                let client = SentinelClient::build(
                    sentinels,
                    master,
                    Some(node),
                    SentinelServerType::Master,
                )
                .map_err(unusable)?;
                Target::Sentinel(tokio::sync::Mutex::new(client))
            }
        };
        Ok(Arc::new(SharedRedis {
            url: url.clone(),
            target,
            connection: Mutex::default(),
            node: Mutex::default(),
            health: Arc::default(),
            scripts: Mutex::default(),
            probing: AtomicBool::new(false),
        }))
    }

    /// The URL, for log lines (its password redacted when shown).
    pub fn url(&self) -> &RedisUrl {
        &self.url
    }

    /// Whether the URL names a Redis Cluster: a script call then touches keys of one
    /// slot only, and the users split a decision by slot.
    pub(crate) fn is_cluster(&self) -> bool {
        matches!(self.target, Target::Cluster(_))
    }

    /// The server the connection is to, when it is one server Sentinel named
    /// (`host:port`).
    pub(crate) fn node(&self) -> Option<String> {
        (self.node.lock().unwrap_or_else(|e| e.into_inner())).clone()
    }

    /// The connection, once one was made.
    fn get(&self) -> Option<Link> {
        (self.connection.lock().unwrap_or_else(|e| e.into_inner())).clone()
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

    /// Connects if not yet connected (with Sentinel: asks the sentinels for the
    /// master first, and connects again if they name another), then loads the
    /// users' scripts (or, with none, pings): proves the whole path works, within
    /// `timeout` (at least half a second). On a cluster both go to every node, so a
    /// probe succeeds only once every shard answers.
    pub(super) async fn probe(&self, timeout: Duration) -> Result<(), RedisFailure> {
        let timeout = timeout.max(MIN_CONNECT_TIMEOUT);
        let scripts = (self.scripts.lock().unwrap_or_else(|e| e.into_inner())).clone();
        let work = async {
            if let Target::Sentinel(sentinel) = &self.target {
                self.follow_master(sentinel, timeout).await?;
            }
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

    /// With Sentinel, while the connection is up: asks the sentinels whether the
    /// master is still the one connected to, and moves to the new one (its scripts
    /// loaded) if not. A failover that demotes the old master without stopping it
    /// (`SENTINEL FAILOVER`, a partition) leaves it accepting writes until the
    /// sentinels reconfigure it, seconds later; this notices within a second. A
    /// failure here is left for the calls to find.
    pub(super) async fn watch(&self, timeout: Duration) {
        if matches!(self.target, Target::Sentinel(_))
            && let Err(why) = self.probe(timeout).await
        {
            tracing::debug!(error = %why, "the sentinels could not be asked for the master");
        }
    }

    /// Asks the sentinels which server is the master now (the crate checks that it
    /// says so itself) and, when it is not the one connected to, connects to it in
    /// place of the old one: after a failover the old master is gone, or comes back
    /// as a replica that answers writes with READONLY.
    async fn follow_master(
        &self,
        sentinel: &tokio::sync::Mutex<SentinelClient>,
        timeout: Duration,
    ) -> Result<(), RedisFailure> {
        let client = sentinel.lock().await.async_get_client().await?;
        let node = client.get_connection_info().addr().to_string();
        let known = self.node();
        if known.as_deref() == Some(node.as_str()) && self.get().is_some() {
            return Ok(());
        }
        let manager = Self::manager(client, timeout).await?;
        *self.connection.lock().unwrap_or_else(|e| e.into_inner()) = Some(Link::Single(manager));
        *self.node.lock().unwrap_or_else(|e| e.into_inner()) = Some(node.clone());
        match known {
            None => tracing::info!(redis = %self.url, master = %node, "Sentinel names the master"),
            Some(old) => tracing::warn!(
                redis = %self.url,
                master = %node,
                previous = %old,
                "Sentinel names another master: connected to it"
            ),
        }
        Ok(())
    }

    /// A connection manager on one server, made within `timeout`.
    async fn manager(client: Client, timeout: Duration) -> Result<ConnectionManager, RedisFailure> {
        let config = redis::aio::ConnectionManagerConfig::new()
            .set_connection_timeout(Some(timeout))
            // The callers try again themselves; the manager's own retries would only
            // keep them waiting.
            .set_number_of_retries(0)
            .set_max_delay(Duration::from_millis(500));
        tokio::time::timeout(timeout, ConnectionManager::new_with_config(client, config))
            .await
            .map_err(|_| RedisFailure::ConnectTimeout(timeout))?
            .map_err(RedisFailure::Redis)
    }

    /// The connection, made now if there is none, waiting at most `timeout` (at
    /// least half a second).
    pub(crate) async fn connect(&self, timeout: Duration) -> Result<Link, RedisFailure> {
        if let Some(c) = self.get() {
            return Ok(c);
        }
        let timeout = timeout.max(MIN_CONNECT_TIMEOUT);
        let link = match &self.target {
            Target::Single(client) => Link::Single(Self::manager(client.clone(), timeout).await?),
            Target::Cluster(client) => Link::Cluster(
                tokio::time::timeout(timeout, client.get_async_connection())
                    .await
                    .map_err(|_| RedisFailure::ConnectTimeout(timeout))??,
            ),
            Target::Sentinel(sentinel) => {
                self.follow_master(sentinel, timeout).await?;
                return self.get().ok_or(RedisFailure::NotConnected);
            }
        };
        // Another attempt may have won the race: use whichever was stored.
        let mut stored = self.connection.lock().unwrap_or_else(|e| e.into_inner());
        Ok(stored.get_or_insert(link).clone())
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
        mut connection: Link,
        invocation: &ScriptInvocation<'_>,
        timeout: Duration,
    ) -> Result<T, RedisFailure> {
        within(timeout, invocation.invoke_async(&mut connection)).await
    }
}
