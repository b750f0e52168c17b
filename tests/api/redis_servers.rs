//! Redis servers a test starts for itself on free 127.0.0.1 ports, in a temporary
//! directory, and stops when dropped: a Redis Cluster of three primaries, and a
//! master with a replica watched by three sentinels (`redis-server --sentinel`, so
//! Debian's `redis-server` alone is enough). Without `redis-server` and `redis-cli`
//! the tests that need them print one line and pass, unless
//! `AUTHD_TEST_REQUIRE_SERVICES=1`, when they fail.
//!
//! The servers keep nothing on disk but a cluster node's `nodes.conf` and a
//! sentinel's configuration, and run at a low `hz`, so they cost the shared cores
//! little.

use crate::helpers::wait_until;
use std::{
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
};

/// Whether `redis-server` and `redis-cli` are installed; if not, says the test is
/// skipped (or fails it under `AUTHD_TEST_REQUIRE_SERVICES=1`).
pub fn servers_installed(test: &str) -> bool {
    let found = |name: &str| {
        Command::new(name)
            .arg("--version")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    };
    if found("redis-server") && found("redis-cli") {
        return true;
    }
    crate::helpers::skipped(test, "redis-server or redis-cli is not installed");
    false
}

/// A port nothing listens on now, on 127.0.0.1.
pub fn free_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap().port()
}

/// `redis-cli -p PORT ARGS…`: its output, or `None` if it could not run or failed.
pub fn cli(port: u16, args: &[&str]) -> Option<String> {
    let out = Command::new("redis-cli")
        .args(["-h", "127.0.0.1", "-p", &port.to_string()])
        .args(args)
        .stderr(Stdio::null())
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
}

/// One `redis-server` on 127.0.0.1, killed when dropped.
pub struct Server {
    pub port: u16,
    args: Vec<String>,
    dir: PathBuf,
    child: Option<Child>,
}

impl Server {
    /// Starts `redis-server` with `args` (after the config file `conf`, if any) in
    /// `dir`, and waits until it answers.
    pub async fn start(dir: &Path, port: u16, args: Vec<String>) -> Self {
        let mut server = Server {
            port,
            args,
            dir: dir.to_owned(),
            child: None,
        };
        server.restart().await;
        server
    }

    /// Starts it again, on the same port with the same files.
    pub async fn restart(&mut self) {
        assert!(self.child.is_none(), "already running");
        let log = std::fs::File::create(self.dir.join(format!("redis-{}.log", self.port))).unwrap();
        let child = Command::new("redis-server")
            .args(&self.args)
            .current_dir(&self.dir)
            .stdout(Stdio::from(log))
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server starts");
        self.child = Some(child);
        let port = self.port;
        let what = format!("redis-server on port {port} answers");
        wait_until(&what, || {
            cli(port, &["ping"]).is_some_and(|o| o.contains("PONG"))
        })
        .await;
    }

    /// Kills it (SIGKILL: no goodbye to its peers) and waits for it to end.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.kill();
    }
}

/// The arguments every test server shares: loopback only, nothing saved, quiet.
fn common(port: u16) -> Vec<String> {
    [
        "--port",
        &port.to_string(),
        "--bind",
        "127.0.0.1",
        "--save",
        "",
        "--appendonly",
        "no",
        "--daemonize",
        "no",
        "--hz",
        "5",
        "--loglevel",
        "warning",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

/// A Redis Cluster of three primaries (no replicas) on 127.0.0.1.
pub struct Cluster {
    pub nodes: Vec<Server>,
    _dir: tempfile::TempDir,
}

impl Cluster {
    /// Starts the nodes and creates the cluster; `None` (the test skipped) without
    /// the Redis programs.
    pub async fn start(test: &str) -> Option<Self> {
        if !servers_installed(test) {
            return None;
        }
        let dir = tempfile::tempdir().unwrap();
        let mut nodes = Vec::new();
        for _ in 0..3 {
            let port = free_port();
            let mut args = common(port);
            args.extend(
                [
                    "--cluster-enabled",
                    "yes",
                    "--cluster-config-file",
                    &format!("nodes-{port}.conf"),
                    // A stopped shard is failed soon, and forgiven soon once back.
                    "--cluster-node-timeout",
                    "1000",
                ]
                .iter()
                .map(|s| s.to_string()),
            );
            nodes.push(Server::start(dir.path(), port, args).await);
        }
        let addresses: Vec<String> = nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port))
            .collect();
        let created = Command::new("redis-cli")
            .args(["--cluster", "create"])
            .args(&addresses)
            .args(["--cluster-replicas", "0", "--cluster-yes"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .unwrap();
        assert!(created.success(), "redis-cli --cluster create failed");
        let cluster = Cluster { nodes, _dir: dir };
        cluster.wait_ok().await;
        Some(cluster)
    }

    /// Waits (at most 30 s) until every node says `cluster_state:ok`.
    pub async fn wait_ok(&self) {
        let ports: Vec<u16> = self.nodes.iter().map(|n| n.port).collect();
        wait_until("every node says cluster_state:ok", || {
            ports.iter().all(|&p| {
                cli(p, &["cluster", "info"]).is_some_and(|o| o.contains("cluster_state:ok"))
            })
        })
        .await;
    }

    /// authd's URL for it: every node, as an operator would list them.
    pub fn url(&self) -> String {
        let nodes: Vec<String> = self
            .nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port))
            .collect();
        format!("redis+cluster://{}", nodes.join(","))
    }

    /// The index of the node that holds `key`, and how many hold it (asked of each
    /// node directly: the others answer MOVED, never the key).
    pub fn holders(&self, key: &str) -> Vec<usize> {
        (self.nodes.iter().enumerate())
            .filter(|(_, n)| cli(n.port, &["exists", key]).is_some_and(|o| o.trim() == "1"))
            .map(|(i, _)| i)
            .collect()
    }

    /// Moves the slot of `key` (and the keys in it) from node `from` to node `to`,
    /// as `redis-cli --cluster reshard` does: IMPORTING, MIGRATING, MIGRATE, and the
    /// new owner told to every node.
    pub fn move_slot(&self, key: &str, from: usize, to: usize) {
        let slot = self.slot(key).to_string();
        let (src, dst) = (self.nodes[from].port, self.nodes[to].port);
        let id = |port| cli(port, &["cluster", "myid"]).unwrap().trim().to_owned();
        let (src_id, dst_id) = (id(src), id(dst));
        let ok = |out: Option<String>| assert!(out.is_some_and(|o| o.contains("OK")));
        ok(cli(
            dst,
            &["cluster", "setslot", &slot, "importing", &src_id],
        ));
        ok(cli(
            src,
            &["cluster", "setslot", &slot, "migrating", &dst_id],
        ));
        let keys = cli(src, &["cluster", "getkeysinslot", &slot, "1000"]).unwrap();
        let keys: Vec<&str> = keys.lines().filter(|k| !k.is_empty()).collect();
        if !keys.is_empty() {
            let port = dst.to_string();
            let mut args = vec!["migrate", "127.0.0.1", &port, "", "0", "5000", "KEYS"];
            args.extend(&keys);
            ok(cli(src, &args));
        }
        for node in &self.nodes {
            ok(cli(
                node.port,
                &["cluster", "setslot", &slot, "node", &dst_id],
            ));
        }
    }

    /// `CLUSTER KEYSLOT key`.
    pub fn slot(&self, key: &str) -> u16 {
        cli(self.nodes[0].port, &["cluster", "keyslot", key])
            .and_then(|o| o.trim().parse().ok())
            .expect("CLUSTER KEYSLOT answers")
    }

    /// `ZCARD key`, asked of the node that holds it (0 if none does).
    pub fn zcard(&self, key: &str) -> u64 {
        (self.nodes.iter())
            .find_map(|n| {
                cli(n.port, &["zcard", key])
                    .and_then(|o| o.trim().parse::<u64>().ok())
                    .filter(|&n| n > 0)
            })
            .unwrap_or(0)
    }
}

/// A master, its replica, and three sentinels (quorum 2) watching them as
/// `mymaster`, all on 127.0.0.1.
pub struct Sentinels {
    pub master: Server,
    pub replica: Server,
    pub sentinels: Vec<Server>,
    _dir: tempfile::TempDir,
}

impl Sentinels {
    /// Starts them and waits until the sentinels know the replica and each other.
    pub async fn start(test: &str) -> Option<Self> {
        if !servers_installed(test) {
            return None;
        }
        let dir = tempfile::tempdir().unwrap();
        let (master_port, replica_port) = (free_port(), free_port());
        let master = Server::start(dir.path(), master_port, common(master_port)).await;
        let mut args = common(replica_port);
        args.extend(["--replicaof", "127.0.0.1", &master_port.to_string()].map(String::from));
        let replica = Server::start(dir.path(), replica_port, args).await;
        let mut sentinels = Vec::new();
        for _ in 0..3 {
            let port = free_port();
            // A sentinel rewrites its own file: one each.
            let conf = dir.path().join(format!("sentinel-{port}.conf"));
            std::fs::write(
                &conf,
                format!(
                    "port {port}\nbind 127.0.0.1\ndaemonize no\nloglevel warning\n\
                     dir {dir}\n\
                     sentinel monitor mymaster 127.0.0.1 {master_port} 2\n\
                     sentinel down-after-milliseconds mymaster 1000\n\
                     sentinel failover-timeout mymaster 5000\n\
                     sentinel parallel-syncs mymaster 1\n",
                    dir = dir.path().display()
                ),
            )
            .unwrap();
            let args = vec![conf.to_string_lossy().into_owned(), "--sentinel".into()];
            sentinels.push(Server::start(dir.path(), port, args).await);
        }
        let set = Sentinels {
            master,
            replica,
            sentinels,
            _dir: dir,
        };
        let ports: Vec<u16> = set.sentinels.iter().map(|s| s.port).collect();
        wait_until("the sentinels agree on the master and its replica", || {
            cli(replica_port, &["info", "replication"])
                .is_some_and(|o| o.contains("master_link_status:up"))
                && ports.iter().all(|&p| {
                    cli(p, &["sentinel", "ckquorum", "mymaster"])
                        .is_some_and(|o| o.starts_with("OK"))
                        && cli(p, &["sentinel", "replicas", "mymaster"])
                            .is_some_and(|o| o.contains(&replica_port.to_string()))
                })
        })
        .await;
        Some(set)
    }

    /// authd's URL for them.
    pub fn url(&self) -> String {
        let sentinels: Vec<String> = self
            .sentinels
            .iter()
            .map(|s| format!("127.0.0.1:{}", s.port))
            .collect();
        format!("redis+sentinel://{}/mymaster", sentinels.join(","))
    }
}
