//! The `authd` binary itself: `--help`, refusing bad configuration with one line,
//! `authd migrate`, a SIGTERM that drains and exits 0 without logging secrets, and
//! the scheduling of its threads.

use crate::helpers::{TEST_KEY, TEST_KID, key_spec, login, register};
use authd::pb::auth_service_client::AuthServiceClient;
use std::{
    io::{BufRead, BufReader},
    process::{Command, Stdio},
    sync::mpsc,
    time::Duration,
};
use tonic::transport::Channel;

fn authd() -> Command {
    crate::helpers::authd_command()
}

#[test]
fn help_documents_every_option_with_its_variable_and_default() {
    let out = authd().arg("--help").output().unwrap();
    assert!(out.status.success());
    let help = String::from_utf8(out.stdout).unwrap();
    for var in [
        "AUTHD_LISTEN",
        "AUTHD_DATABASE_URL",
        "AUTHD_DB_MAX_CONNECTIONS",
        "AUTHD_DB_ACQUIRE_TIMEOUT",
        "AUTHD_SQLITE_MAX_BATCH",
        "AUTHD_PBKDF2_ITERATIONS",
        "AUTHD_HASH_THREADS",
        "AUTHD_HASH_QUEUE",
        "AUTHD_MAX_IN_FLIGHT",
        "AUTHD_TOKEN_KEYS",
        "AUTHD_TOKEN_KEYS_FILE",
        "AUTHD_TOKEN_TTL",
        "AUTHD_REFRESH_TTL",
        "AUTHD_REVOCATION_DELAY",
        "AUTHD_TOKEN_KEYS_RELOAD",
        "AUTHD_TOKEN_AUDIENCE",
        "AUTHD_TOKEN_CLOCK_SKEW",
        "AUTHD_HEALTH_INTERVAL",
        "AUTHD_DRAIN_TIMEOUT",
        "AUTHD_METRICS_LISTEN",
        "AUTHD_LOG",
        "AUTHD_LOG_FORMAT",
    ] {
        assert!(
            help.contains(&format!("env: {var}")),
            "--help lacks {var}:\n{help}"
        );
    }
    for default in [
        "0.0.0.0:50051",
        "sqlite://authd.db",
        "600000",
        "15m",
        "30d",
        "1s",
        "text",
        "0.0.0.0:9090",
    ] {
        assert!(
            help.contains(&format!("[default: {default}]")),
            "--help lacks default {default}"
        );
    }
    assert!(help.contains("migrate"));
    assert!(help.contains("keygen"));
}

#[test]
fn bad_configuration_stops_the_start_with_one_clear_line() {
    let dir = tempfile::tempdir().unwrap();
    let cases: [(&[&str], &str); 7] = [
        (&["--pbkdf2-iterations", "999"], "--pbkdf2-iterations"),
        (&["--token-keys", "k:c2hvcnQ="], "at least 32 bytes"),
        (&["--log-format", "xml"], "--log-format"),
        (
            &["--database-url", "ftp://somewhere"],
            "unsupported database URL scheme",
        ),
        (&["--token-ttl", "soon"], "--token-ttl"),
        // A lifetime no Login could add to the clock without overflowing.
        (
            &["--token-ttl", "9223372036854775807s"],
            "must be at most 7days",
        ),
        (&["--token-ttl", "8d"], "must be at most 7days"),
    ];
    for (args, expected) in cases {
        let out = authd().args(args).current_dir(dir.path()).output().unwrap();
        assert!(!out.status.success(), "{args:?} was accepted");
        let stderr = String::from_utf8(out.stderr).unwrap();
        let first = stderr.lines().next().unwrap_or_default();
        assert!(first.starts_with("error:"), "{args:?}: {stderr}");
        assert!(first.contains(expected), "{args:?}: {first}");
        assert!(!stderr.contains("panicked"), "{stderr}");
    }

    // A problem found at start, not by the parser: also one line, exit 1.
    let out = authd()
        .args([
            "--database-url",
            "sqlite:///nonexistent-dir/x/authd.db",
            "--listen",
            "127.0.0.1:0",
        ])
        .env("AUTHD_TOKEN_KEYS", key_spec(TEST_KID, TEST_KEY))
        .output()
        .unwrap();
    let (stderr, last) = refused_start(out);
    let last = last.as_str();
    assert!(
        last.starts_with("authd: error: opening SQLite database"),
        "{stderr}"
    );
    assert!(!stderr.contains("panicked"), "{stderr}");
}

#[tokio::test]
async fn migrate_creates_the_schema_and_exits() {
    use sqlx::{Connection, SqliteConnection, sqlite::SqliteConnectOptions};
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("m.db");
    let out = authd()
        .args([
            "migrate",
            "--database-url",
            &format!("sqlite://{}", db.display()),
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut conn = SqliteConnection::connect_with(&SqliteConnectOptions::new().filename(&db))
        .await
        .expect("migrate created the database file");
    let users: i64 = sqlx::query_scalar("SELECT count(*) FROM users")
        .fetch_one(&mut conn)
        .await
        .expect("the users table exists");
    assert_eq!(users, 0);
}

/// A running `authd` binary with its stderr lines.
/// A server process, killed when dropped: a test that fails before it stops its
/// server leaves none running.
struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

pub(crate) struct Running {
    child: KillOnDrop,
    lines: mpsc::Receiver<String>,
    /// Lines read so far.
    log: Vec<String>,
    pub(crate) addr: String,
    /// Where its metrics endpoint answers.
    pub(crate) metrics_addr: String,
    /// Where its admin port answers, when it is on (`AUTHD_ADMIN_LISTEN`).
    pub(crate) admin_addr: Option<String>,
}

/// The standard error of a start that was refused (exit status 1), and its last line.
#[test]
fn hash_bench_measures_and_prints_the_plan_that_hash_kernels_reads_back() {
    let bench = |envs: &[(&str, &str)]| {
        authd()
            .args(["hash-bench", "--iterations", "1000", "--threads", "1"])
            .args(["--duration", "10ms", "--json"])
            .envs(envs.iter().copied())
            .output()
            .unwrap()
    };
    // Measured at start: a plan over this CPU's kernels, each timed.
    let out = bench(&[("AUTHD_HASH_KERNELS", "measure")]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let plan = report["plan"].as_str().unwrap().to_owned();
    // It covers every count from one: its first range is "1: " or, when one kernel
    // wins for several counts (as measured, on a loaded machine too), "1-N: ".
    assert!(plan.starts_with("1: ") || plan.starts_with("1-"), "{plan}");
    let kernels = report["kernels"].as_array().unwrap();
    assert!(!kernels.is_empty());
    for k in kernels {
        assert!(k["ns_per_compression"].as_f64().unwrap() > 0.0, "{k}");
    }
    // The printed plan, given back, is the plan the engine runs.
    let out = bench(&[("AUTHD_HASH_KERNELS", &plan)]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let again: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(again["plan"], plan.as_str());
    // A plan of one kernel everywhere prints as one entry.
    let out = bench(&[
        ("AUTHD_HASH_BACKEND", "portable"),
        ("AUTHD_HASH_KERNELS", "1-32: portable"),
    ]);
    let portable: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(portable["plan"], "1: portable");
    assert_eq!(portable["lanes"], 1);

    // A plan that does not parse, or that names a kernel the engine cannot run,
    // stops the start with one line.
    let out = bench(&[("AUTHD_HASH_KERNELS", "2-32: sha-ni x4")]);
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert!(stderr.starts_with("error: invalid value"), "{stderr}");
    assert!(stderr.contains("expected 1 next"), "{stderr}");
    let out = bench(&[
        ("AUTHD_HASH_BACKEND", "portable"),
        ("AUTHD_HASH_KERNELS", "1: sha-ni x1"),
    ]);
    let (stderr, last) = refused_start(out);
    assert_eq!(
        last, "authd: error: --hash-kernels: the portable engine cannot run sha-ni x1 on this CPU",
        "{stderr}"
    );
}

pub(crate) fn refused_start(out: std::process::Output) -> (String, String) {
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8(out.stderr).unwrap();
    let last = stderr.lines().last().unwrap_or_default().to_owned();
    (stderr, last)
}

/// Starts the binary on 127.0.0.1:0 (metrics too) with JSON logs and waits until it
/// serves. The database is a SQLite file in `dir` unless `envs` names one.
pub(crate) fn spawn_authd(dir: &std::path::Path, envs: &[(&str, String)]) -> Running {
    spawn_authd_command(authd(), dir, envs)
}

/// Like [`spawn_authd`], with the binary started by `command` (e.g. under `prlimit`).
pub(crate) fn spawn_authd_command(
    mut command: Command,
    dir: &std::path::Path,
    envs: &[(&str, String)],
) -> Running {
    if !envs
        .iter()
        .any(|(k, _)| k.starts_with("AUTHD_DATABASE_URL"))
    {
        command.env(
            "AUTHD_DATABASE_URL",
            format!("sqlite://{}", dir.join("s.db").display()),
        );
    }
    let mut child = KillOnDrop(
        command
            .env("AUTHD_LISTEN", "127.0.0.1:0")
            .env("AUTHD_METRICS_LISTEN", "127.0.0.1:0")
            .env("AUTHD_HEALTH_LISTEN", "127.0.0.1:0")
            .env("AUTHD_PBKDF2_ITERATIONS", "1000")
            .env("AUTHD_LOG_FORMAT", "json")
            .envs(envs.iter().map(|(k, v)| (k, v)))
            .stderr(Stdio::piped())
            .stdout(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let (lines_tx, lines) = mpsc::channel::<String>();
    let stderr = child.0.stderr.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            let _ = lines_tx.send(line);
        }
    });
    let mut log = Vec::new();
    let (addr, metrics_addr, admin_addr) = loop {
        let line = lines
            .recv_timeout(Duration::from_secs(30))
            .expect("authd logs that it is serving");
        let event: serde_json::Value = serde_json::from_str(&line).expect("JSON log lines");
        log.push(line);
        if event["message"] == "authd is serving" {
            let field = |name: &str| event[name].as_str().unwrap().to_owned();
            let admin = Some(field("admin")).filter(|a| a != "off");
            break (field("listen"), field("metrics"), admin);
        }
    };
    Running {
        child,
        lines,
        log,
        addr,
        metrics_addr,
        admin_addr,
    }
}

impl Running {
    /// A client of its gRPC port.
    /// The next log event whose message starts with `message`, the lines before it
    /// kept; fails when none comes within 30 s.
    pub(crate) fn wait_for_log(&mut self, message: &str) -> serde_json::Value {
        loop {
            let line = (self.lines.recv_timeout(Duration::from_secs(30)))
                .unwrap_or_else(|_| panic!("authd logs {message:?}; it logged {:#?}", self.log));
            let event: serde_json::Value = serde_json::from_str(&line).expect("JSON log lines");
            self.log.push(line);
            if event["message"]
                .as_str()
                .is_some_and(|m| m.starts_with(message))
            {
                return event;
            }
        }
    }

    pub(crate) async fn client(&self) -> AuthServiceClient<Channel> {
        AuthServiceClient::connect(format!("http://{}", self.addr))
            .await
            .unwrap()
    }

    /// A client, and the access token of `username`, registered with `password` and
    /// then logged in.
    pub(crate) async fn signed_in(
        &self,
        username: &str,
        password: &str,
    ) -> (AuthServiceClient<Channel>, String) {
        let mut client = self.client().await;
        register(&mut client, username, password).await.unwrap();
        let token = login(&mut client, username, password).await.unwrap();
        (client, token.access_token)
    }

    /// Sends SIGTERM and waits for the exit; returns the whole log.
    pub(crate) async fn terminate(mut self) -> (std::process::ExitStatus, Vec<String>) {
        let killed = Command::new("kill")
            .args(["-TERM", &self.child.0.id().to_string()])
            .status()
            .unwrap();
        assert!(killed.success());
        let mut child = self.child;
        let status = tokio::task::spawn_blocking(move || child.0.wait())
            .await
            .unwrap()
            .unwrap();
        // The reader thread ends at EOF, after the exit.
        while let Ok(line) = self.lines.recv_timeout(Duration::from_secs(5)) {
            self.log.push(line);
        }
        (status, self.log)
    }
}

#[tokio::test]
async fn without_configured_keys_a_random_key_is_used_with_a_warning() {
    let dir = tempfile::tempdir().unwrap();
    let running = spawn_authd(dir.path(), &[]);
    let (_client, token) = running.signed_in("walter", "a fine password").await;
    let header = jsonwebtoken::decode_header(&token).unwrap();
    assert!(header.kid.unwrap().starts_with("ephemeral-"));
    let (status, log) = running.terminate().await;
    assert!(status.success());
    let warning = log
        .iter()
        .find(|l| l.contains("no token keys configured"))
        .expect("a warning about the random key");
    let event: serde_json::Value = serde_json::from_str(warning).unwrap();
    assert_eq!(event["level"], "WARN");
}

#[tokio::test]
async fn sigterm_drains_and_exits_zero_without_logging_secrets() {
    let dir = tempfile::tempdir().unwrap();
    let running = spawn_authd(
        dir.path(),
        &[
            ("AUTHD_TOKEN_KEYS", key_spec(TEST_KID, TEST_KEY)),
            ("AUTHD_LOG", "debug".into()),
        ],
    );
    let password = "sup3r-secret-passw0rd";
    let (mut client, token) = running.signed_in("oscar", password).await;
    assert!(
        login(&mut client, "oscar", "wrong-passw0rd-guess")
            .await
            .is_err()
    );

    let (status, log) = running.terminate().await;
    assert!(status.success(), "authd exited with {status}");
    let all = log.join("\n");
    for line in &log {
        serde_json::from_str::<serde_json::Value>(line).expect("every log line is JSON");
    }
    assert!(all.contains("SIGTERM received"), "{all}");
    assert!(all.contains("authd stopped"), "{all}");
    let key = key_spec(TEST_KID, TEST_KEY);
    for secret in [
        password,
        "wrong-passw0rd-guess",
        token.as_str(),
        &key[TEST_KID.len() + 1..],
    ] {
        assert!(!all.contains(secret), "a secret was logged:\n{all}");
    }
}

/// Each thread of a running process, from `/proc`: its name, nice value and
/// scheduling policy (0 `SCHED_OTHER`, 3 `SCHED_BATCH`).
#[cfg(target_os = "linux")]
fn threads_of(pid: u32) -> Vec<(String, i64, u32)> {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .filter_map(|task| std::fs::read_to_string(task.unwrap().path().join("stat")).ok())
        .map(|stat| {
            // "tid (name) state …": the fields after the name, numbered from 3.
            let (head, rest) = stat.rsplit_once(") ").unwrap();
            let name = head.split_once(" (").unwrap().1.to_owned();
            let fields: Vec<&str> = rest.split(' ').collect();
            (
                name,
                fields[19 - 3].parse().unwrap(),
                fields[41 - 3].parse().unwrap(),
            )
        })
        .collect()
}

#[cfg(target_os = "linux")]
#[tokio::test]
async fn the_runtime_threads_run_below_probes_above_hashing_and_as_a_batch_if_asked() {
    const SCHED_OTHER: u32 = 0;
    const SCHED_BATCH: u32 = 3;
    for (envs, policy) in [
        (vec![], SCHED_OTHER),
        (
            vec![("AUTHD_RUNTIME_THREAD_POLICY", "batch".to_owned())],
            SCHED_BATCH,
        ),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let running = spawn_authd(dir.path(), &envs);
        // A registration and a login: the runtime has hashed and used the database.
        running.signed_in("nadia", "a fine password").await;
        let threads = threads_of(running.child.0.id());
        let of = |prefix: &str| -> Vec<(i64, u32)> {
            let found: Vec<_> = threads
                .iter()
                .filter(|(name, ..)| name.starts_with(prefix))
                .map(|(_, nice, policy)| (*nice, *policy))
                .collect();
            assert!(!found.is_empty(), "no {prefix} thread in {threads:?}");
            found
        };
        assert!(
            of("tokio-").iter().all(|t| *t == (5, policy)),
            "{threads:?}"
        );
        assert!(
            of("authd-health").iter().all(|t| *t == (0, SCHED_OTHER)),
            "{threads:?}"
        );
        assert!(
            of("authd-hash-").iter().all(|t| *t == (10, SCHED_OTHER)),
            "{threads:?}"
        );
        let (status, _) = running.terminate().await;
        assert!(status.success());
    }
}
