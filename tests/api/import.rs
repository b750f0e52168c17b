//! `authd admin users import` (docs/migration.md), the binary itself against the
//! admin API, on both backends: every fixture format imported once and a re-run that
//! changes nothing; the rows as stored (a marker, the hash as given); refusals by
//! line (malformed JSON, a missing field, an unknown format, costs over the default
//! and a lowered cap, a username authd refuses, a duplicate in the file, a conflict
//! with a registered user under skip and fail, a line too long, a truncated file);
//! only an `admin` key may import; `migrate --check-rollback` counts imported users;
//! the report service's database through the documented recipe, and every imported
//! user logs in with the password it had; memory bounded
//! whatever the input's size.

use crate::{
    admin::{ADMIN_KEY, Admin, READ_KEY, admin_app, keys_file},
    admin_cli::{Cli, Run},
    helpers::{TEST_KEY, TEST_KID, TestDb, authd_command, key_spec},
};
use authd::config::DatabaseUrl;
use serde_json::{Value, json};
use sqlx::{Connection, PgConnection, Row as _, SqliteConnection, sqlite::SqliteConnectOptions};
use std::{
    io::{BufRead as _, Read as _, Write as _},
    path::{Path, PathBuf},
    process::{Child, Stdio},
};
use tonic::Code;

crate::backend_tests!(
    every_fixture_is_imported_once_and_a_rerun_changes_nothing,
    bad_lines_are_refused_by_their_number_and_nothing_else_is_lost,
    a_conflict_under_fail_stops_the_import_and_overwrites_nothing,
    only_an_admin_key_imports,
    the_report_services_database_imports_through_the_documented_recipe,
    imported_fixture_users_log_in_with_their_original_password,
    report_service_users_log_in_with_the_password_they_registered_with,
);

/// The salt of every marker, as its PHC string holds it.
const MARKER_SALT_B64: &str = "YXV0aGQ6aGFzaC1leHQ6MQ";
/// A well-formed bcrypt hash of cost 15 (over the default cap, 14).
const BCRYPT_15: &str = "$2b$15$abcdefghijklmnopqrstuu5jz8q7Jm3MYGc7b4QZwS1Y5.6k0nP3a";
/// The same at cost 12 (under the default cap).
const BCRYPT_12: &str = "$2b$12$abcdefghijklmnopqrstuu5jz8q7Jm3MYGc7b4QZwS1Y5.6k0nP3a";
const PBKDF2: &str =
    "$pbkdf2-sha256$i=1000,l=32$AKh4f+JN1Hz3qCVLeaF/SA$eHz5DaZ1OQ83rAhSufI9KXPNmC7a00/to0km3fxyPeA";

/// What an import's run printed (with --json).
trait Printed {
    fn summary(&self) -> Value;
    fn refusals(&self) -> Vec<(u64, String)>;
    fn counts(&self) -> [u64; 4];
}

impl Printed for Run {
    /// The JSON summary, the last line of stdout (with --json).
    #[track_caller]
    fn summary(&self) -> Value {
        let last = self.stdout.lines().last().unwrap_or_default();
        serde_json::from_str(last)
            .unwrap_or_else(|e| panic!("no summary ({e}):\n{}\n{}", self.stdout, self.stderr))
    }

    /// The refusals printed (with --json), line → reason.
    fn refusals(&self) -> Vec<(u64, String)> {
        (self.stdout.lines())
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .filter(|v| v["outcome"] == "refused")
            .map(|v| {
                (
                    v["line"].as_u64().unwrap(),
                    v["reason"].as_str().unwrap().to_owned(),
                )
            })
            .collect()
    }

    /// The summary's counts: created, unchanged, skipped, refused.
    fn counts(&self) -> [u64; 4] {
        let s = self.summary();
        ["created", "unchanged", "skipped", "refused"].map(|k| s[k].as_u64().unwrap())
    }
}

/// `authd admin --addr ADDR users import --json ARGS…` with `key`.
async fn import(addr: &str, key: &str, args: &[&str], stdin: Option<Vec<u8>>) -> Run {
    let cli = Cli::at(addr, key);
    let cli = match stdin {
        Some(bytes) => cli.stdin_bytes(bytes),
        None => cli,
    };
    let args: Vec<&str> = ["users", "import", "--json"]
        .into_iter()
        .chain(args.iter().copied())
        .collect();
    cli.run(&args).await
}

fn addr(admin: &Admin) -> String {
    admin.app.handle.admin_addr().unwrap().to_string()
}

/// The fixtures: (format, password, wrong password, hash as a JSON value: a string,
/// or the structured form's object).
fn fixtures() -> Vec<(String, String, String, Value)> {
    crate::foreign_login::records()
        .into_iter()
        .map(|r| {
            let hash = serde_json::from_str(&r.hash).unwrap_or(Value::String(r.hash));
            (r.format, r.password, r.wrong, hash)
        })
        .collect()
}

/// The username of fixture `i`.
fn fixture_user(i: usize, format: &str) -> String {
    format!("{format}-{i}")
}

/// The import file of every fixture: one user each; every third keeps an id of its
/// own, every fifth a creation time, every seventh is disabled.
fn fixtures_file(dir: &Path) -> PathBuf {
    let mut text = String::new();
    for (i, (format, _, _, hash)) in fixtures().iter().enumerate() {
        let mut line = json!({"username": fixture_user(i, format), "password_hash": hash});
        if i % 3 == 0 {
            line["user_id"] = json!(fixture_id(i));
        }
        if i % 5 == 0 {
            line["created_at"] = json!("2024-01-02T03:04:05Z");
        }
        if i % 7 == 0 {
            line["disabled"] = json!(true);
        }
        text.push_str(&line.to_string());
        text.push('\n');
    }
    let path = dir.join("users.jsonl");
    std::fs::write(&path, text).unwrap();
    path
}

fn fixture_id(i: usize) -> String {
    format!("0190a5b2-7c3e-7000-8000-{i:012}")
}

/// The stored row of `username`: password_hash, password_hash_ext, created_at,
/// disabled_at, id.
async fn row(db: &TestDb, username: &str) -> (String, Option<String>, i64, Option<i64>, String) {
    const SELECT: &str = "SELECT password_hash, password_hash_ext, created_at, disabled_at, id \
                          FROM users WHERE username = $1";
    macro_rules! read {
        ($conn:expr) => {{
            let mut conn = $conn;
            let row = sqlx::query(SELECT)
                .bind(username)
                .fetch_one(&mut conn)
                .await
                .unwrap_or_else(|e| panic!("{username}: {e}"));
            let got = (row.get(0), row.get(1), row.get(2), row.get(3), row.get(4));
            conn.close().await.ok();
            got
        }};
    }
    match &db.url {
        DatabaseUrl::Sqlite(path) => read!(
            SqliteConnection::connect_with(
                &SqliteConnectOptions::new().filename(path).read_only(true)
            )
            .await
            .unwrap()
        ),
        DatabaseUrl::Postgres(url) => read!(PgConnection::connect(url.expose()).await.unwrap()),
    }
}

fn db_url(db: &TestDb) -> String {
    match &db.url {
        DatabaseUrl::Sqlite(path) => format!("sqlite://{}", path.display()),
        DatabaseUrl::Postgres(url) => url.expose().to_owned(),
    }
}

async fn every_fixture_is_imported_once_and_a_rerun_changes_nothing(db: TestDb) {
    let admin = admin_app(&db, |_| ()).await;
    let dir = tempfile::tempdir().unwrap();
    let file = fixtures_file(dir.path());
    let file = file.to_str().unwrap();
    let fixtures = fixtures();
    let n = fixtures.len() as u64;

    let first = import(&addr(&admin), ADMIN_KEY, &[file], None).await;
    assert_eq!(first.code, Some(0), "{}\n{}", first.stdout, first.stderr);
    assert_eq!(first.counts(), [n, 0, 0, 0]);
    assert!(first.refusals().is_empty());

    // The same file again: every user is there already, with the same hash.
    let again = import(
        &addr(&admin),
        ADMIN_KEY,
        &[file, "--on-conflict", "fail"],
        None,
    )
    .await;
    assert_eq!(again.code, Some(0), "{}\n{}", again.stdout, again.stderr);
    assert_eq!(again.counts(), [0, n, 0, 0]);

    for (i, (format, _, _, hash)) in fixtures.iter().enumerate() {
        let (marker, ext, created_at, disabled_at, id) = row(&db, &fixture_user(i, format)).await;
        assert!(
            marker.starts_with(&format!("$pbkdf2-sha256$i=1000,l=32${MARKER_SALT_B64}$")),
            "{format}: {marker}"
        );
        let given = match hash {
            Value::String(s) => s.clone(),
            object => object.to_string(),
        };
        assert_eq!(ext.as_deref(), Some(given.as_str()), "{format}");
        if i % 3 == 0 {
            assert_eq!(id, fixture_id(i));
        }
        if i % 5 == 0 {
            assert_eq!(created_at, 1_704_164_645_000);
        }
        assert_eq!(disabled_at.is_some(), i % 7 == 0, "{format} {i}");
    }

    // A rollback to a release that cannot verify them would lock them out: said, with
    // their count, and refused.
    admin.app.stop().await.unwrap();
    let out = authd_command()
        .args(["migrate", "--check-rollback", "0.1.0"])
        .env("AUTHD_DATABASE_URL", db_url(&db))
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(
        text.starts_with(&format!("unsafe: {n} users have a password hash")),
        "{text}"
    );
    let status = authd_command()
        .args(["migrate", "--status"])
        .env("AUTHD_DATABASE_URL", db_url(&db))
        .output()
        .unwrap();
    assert!(status.status.success());
}

async fn bad_lines_are_refused_by_their_number_and_nothing_else_is_lost(db: TestDb) {
    let mut admin = admin_app(&db, |_| ()).await;
    admin
        .app
        .register("taken", "a fine password")
        .await
        .unwrap();
    let long = format!(
        r#"{{"username": "long", "password_hash": "{}"}}"#,
        "x".repeat(70 * 1024)
    );
    let lines = [
        json!({"username": "first", "password_hash": PBKDF2}).to_string(), // 1
        "{nope}".to_owned(),                                               // 2
        json!({"username": "md5", "password_hash": "md5$abc$def"}).to_string(), // 3
        json!({"username": "costly", "password_hash": BCRYPT_15}).to_string(), // 4
        json!({"username": "a", "password_hash": PBKDF2}).to_string(),     // 5
        json!({"username": "FIRST", "password_hash": BCRYPT_12}).to_string(), // 6
        json!({"username": "taken", "password_hash": PBKDF2}).to_string(), // 7
        json!({"password_hash": PBKDF2}).to_string(),                      // 8
        long,                                                              // 9
        String::new(),                                                     // 10: blank
        json!({"username": "fine", "password_hash": BCRYPT_12}).to_string(), // 11
        r#"{"username": "cut", "password_hash": "$2b$1"#.to_owned(),       // 12: truncated
    ];
    let text = lines.join("\n"); // no newline after the last line
    let run = import(
        &addr(&admin),
        ADMIN_KEY,
        &["-", "--on-conflict", "skip"],
        Some(text.into_bytes()),
    )
    .await;
    assert_eq!(run.code, Some(1), "{}\n{}", run.stdout, run.stderr);
    let refusals = run.refusals();
    let lines: Vec<u64> = refusals.iter().map(|(l, _)| *l).collect();
    // Line 6 repeats line 1's name: refused as a duplicate when the server reads
    // both in one batch, else a conflict with the user line 1 created, skipped
    // (docs/migration.md). Either way the first wins.
    let duplicate_refused = lines.contains(&6);
    let expected: &[u64] = if duplicate_refused {
        &[2, 3, 4, 5, 6, 8, 9, 12]
    } else {
        &[2, 3, 4, 5, 8, 9, 12]
    };
    assert_eq!(lines, expected, "{refusals:?}");
    let why = |line: u64| refusals.iter().find(|(l, _)| *l == line).unwrap().1.clone();
    assert!(why(2).starts_with("malformed JSON"), "{}", why(2));
    assert_eq!(
        why(3),
        "password_hash: not a password hash format authd can verify"
    );
    assert_eq!(
        why(4),
        "password_hash: bcrypt hash: bcrypt cost 15 is over the cap of 14"
    );
    assert!(why(5).starts_with("username: "), "{}", why(5));
    if duplicate_refused {
        assert_eq!(why(6), "duplicate: the username of line 1 (the first wins)");
    }
    assert_eq!(why(8), "missing field username");
    assert_eq!(why(9), "longer than 65536 bytes");
    assert!(why(12).contains("truncated"), "{}", why(12));
    for (_, reason) in &refusals {
        assert!(
            !reason.contains("abcdefghij") && !reason.contains("AKh4f"),
            "{reason}"
        );
    }
    // Line 7 names a registered user: skipped, and untouched.
    let counts = if duplicate_refused {
        [2, 0, 1, 8]
    } else {
        [2, 0, 2, 7]
    };
    assert_eq!(run.counts(), counts);
    let (hash, ext, ..) = row(&db, "taken").await;
    assert!(ext.is_none() && !hash.contains(MARKER_SALT_B64));
    let (_, ext, ..) = row(&db, "first").await;
    assert_eq!(ext.as_deref(), Some(PBKDF2), "the first of two lines wins");

    // A lowered cap refuses what the default admits.
    let lowered = admin_app(&db, |c| c.import.import_max_bcrypt_cost = 10).await;
    let line = json!({"username": "costly12", "password_hash": BCRYPT_12}).to_string() + "\n";
    let run = import(&addr(&lowered), ADMIN_KEY, &["-"], Some(line.into_bytes())).await;
    assert_eq!(run.code, Some(1));
    assert_eq!(
        run.refusals(),
        [(
            1,
            "password_hash: bcrypt hash: bcrypt cost 12 is over the cap of 10".to_owned()
        )]
    );
}

async fn a_conflict_under_fail_stops_the_import_and_overwrites_nothing(db: TestDb) {
    let mut admin = admin_app(&db, |_| ()).await;
    admin
        .app
        .register("taken", "a fine password")
        .await
        .unwrap();
    let before = row(&db, "taken").await;
    let text = [
        json!({"username": "one", "password_hash": PBKDF2}).to_string(),
        json!({"username": "Taken", "password_hash": PBKDF2}).to_string(),
        json!({"username": "two", "password_hash": PBKDF2, "user_id": before.4}).to_string(),
    ]
    .join("\n")
        + "\n";
    let run = import(&addr(&admin), ADMIN_KEY, &["-"], Some(text.into_bytes())).await;
    assert_eq!(run.code, Some(1), "{}\n{}", run.stdout, run.stderr);
    assert!(
        run.stderr
            .contains("ALREADY_EXISTS: line 2: a different user has this username"),
        "{}",
        run.stderr
    );
    let refusals = run.refusals();
    assert_eq!(refusals[0].0, 2);
    assert!(
        refusals[0]
            .1
            .starts_with("conflict: a different user has this username")
    );
    assert_eq!(row(&db, "taken").await, before, "never overwritten");
    // Line 3 names the registered user's id: a conflict too, never a second row.
    assert!(
        refusals
            .iter()
            .any(|(l, why)| *l == 3 && why.contains("user_id")),
        "{refusals:?}"
    );
}

async fn only_an_admin_key_imports(db: TestDb) {
    let admin = admin_app(&db, |_| ()).await;
    let line = json!({"username": "someone", "password_hash": PBKDF2}).to_string() + "\n";
    let read = import(
        &addr(&admin),
        READ_KEY,
        &["-"],
        Some(line.clone().into_bytes()),
    )
    .await;
    assert_eq!(read.code, Some(1));
    assert!(read.stderr.contains("PERMISSION_DENIED"), "{}", read.stderr);
    let unknown = "unknown-key-0123456789abcdef-0123456789abcdef";
    let run = import(&addr(&admin), unknown, &["-"], Some(line.into_bytes())).await;
    assert_eq!(run.code, Some(1));
    assert!(run.stderr.contains("UNAUTHENTICATED"), "{}", run.stderr);
    // Through the API itself: no key at all.
    use authd::pb::admin::ImportUsersRequest;
    let mut client = admin.client.clone();
    let request = tonic::Request::new(tokio_stream::iter(vec![ImportUsersRequest::default()]));
    let status = client.import_users(request).await.unwrap_err();
    assert_eq!(status.code(), Code::Unauthenticated);
    // A message over the admin port's 8 KiB ends the stream: nothing of it is read.
    let big = ImportUsersRequest {
        line: 1,
        username: "big".into(),
        password_hash: "x".repeat(9000),
        ..Default::default()
    };
    let mut request = tonic::Request::new(tokio_stream::iter(vec![big]));
    let bearer = format!("Bearer {ADMIN_KEY}").parse().unwrap();
    request.metadata_mut().insert("authorization", bearer);
    let outcome = match client.import_users(request).await {
        Ok(answers) => answers.into_inner().message().await.map(|_| ()),
        Err(status) => Err(status),
    };
    assert_eq!(outcome.unwrap_err().code(), Code::OutOfRange);
}

async fn imported_fixture_users_log_in_with_their_original_password(db: TestDb) {
    let mut admin = admin_app(&db, |_| ()).await;
    let dir = tempfile::tempdir().unwrap();
    let file = fixtures_file(dir.path());
    let run = import(&addr(&admin), ADMIN_KEY, &[file.to_str().unwrap()], None).await;
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    for (i, (format, password, wrong, _)) in fixtures().iter().enumerate() {
        if i % 7 == 0 {
            continue; // imported disabled
        }
        let user = fixture_user(i, format);
        let wrong_answer = admin.app.login(&user, wrong).await.unwrap_err();
        assert_eq!(wrong_answer.code(), Code::Unauthenticated, "{format}");
        admin
            .app
            .login(&user, password)
            .await
            .unwrap_or_else(|e| panic!("{format}: {e}"));
    }
}

/// A database of the report service (bench/report-service): its table, and users
/// registered as its `hash_password` stores them (hashlib, 10,000 rounds).
fn report_service_db(path: &Path, users: &[(String, String)]) {
    let script = r#"
import base64, hashlib, json, secrets, sqlite3, sys
db = sqlite3.connect(sys.argv[1])
db.execute("""CREATE TABLE IF NOT EXISTS users (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    username TEXT NOT NULL UNIQUE,
    password_hash TEXT NOT NULL,
    created_at INTEGER NOT NULL
)""")
for username, password in json.load(sys.stdin):
    salt = secrets.token_bytes(16)
    digest = hashlib.pbkdf2_hmac("sha256", password.encode(), salt, 10000)
    stored = "pbkdf2_sha256${}${}${}".format(
        10000, base64.b64encode(salt).decode(), base64.b64encode(digest).decode())
    db.execute("INSERT INTO users (username, password_hash, created_at) VALUES (?, ?, ?)",
               (username.lower(), stored, 1704164645))
db.commit()
"#;
    let mut child = std::process::Command::new("python3")
        .args(["-c", script, path.to_str().unwrap()])
        .stdin(Stdio::piped())
        .spawn()
        .expect("python3");
    let mut stdin = child.stdin.take().unwrap();
    stdin
        .write_all(serde_json::to_string(users).unwrap().as_bytes())
        .unwrap();
    drop(stdin);
    assert!(child.wait().unwrap().success());
}

/// The report service's recipe of docs/migration.md: the SQL of its `sqlite3` command.
fn recipe() -> String {
    let doc =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/migration.md"))
            .unwrap();
    let start = doc
        .find("sqlite3 -readonly report.db \"")
        .expect("the recipe in docs/migration.md");
    let rest = &doc[start + "sqlite3 -readonly report.db \"".len()..];
    rest[..rest.find('"').unwrap()].to_owned()
}

/// The report service's users imported through the recipe: the admin app and the
/// users with their passwords.
async fn report_service_import(db: &TestDb) -> (Admin, Vec<(String, String)>) {
    let admin = admin_app(db, |_| ()).await;
    let users: Vec<(String, String)> = (0..20)
        .map(|i| (format!("Reporter{i}"), format!("report password {i} ü")))
        .collect();
    let dir = tempfile::tempdir().unwrap();
    let report = dir.path().join("report.db");
    report_service_db(&report, &users);
    let out = std::process::Command::new("sqlite3")
        .args(["-readonly", report.to_str().unwrap(), &recipe()])
        .output()
        .expect("sqlite3");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let jsonl = out.stdout;
    let first: Value =
        serde_json::from_slice(jsonl.split(|b| *b == b'\n').next().unwrap()).unwrap();
    assert_eq!(first["password_hash"]["salt_encoding"], "base64");
    assert_eq!(first["created_at"], "2024-01-02T03:04:05Z");
    let run = import(&addr(&admin), ADMIN_KEY, &["-"], Some(jsonl)).await;
    assert_eq!(run.code, Some(0), "{}\n{}", run.stdout, run.stderr);
    assert_eq!(run.counts(), [20, 0, 0, 0]);
    (admin, users)
}

async fn the_report_services_database_imports_through_the_documented_recipe(db: TestDb) {
    let (_admin, users) = report_service_import(&db).await;
    for (name, _) in &users {
        let (_, ext, created_at, ..) = row(&db, &name.to_lowercase()).await;
        let ext: Value = serde_json::from_str(&ext.unwrap()).unwrap();
        assert_eq!(ext["algorithm"], "pbkdf2-sha256");
        assert_eq!(ext["iterations"], 10000);
        assert_eq!(created_at, 1_704_164_645_000);
    }
}

async fn report_service_users_log_in_with_the_password_they_registered_with(db: TestDb) {
    let (mut admin, users) = report_service_import(&db).await;
    for (name, password) in &users {
        admin.app.login(name, password).await.unwrap();
        let wrong = admin.app.login(name, "not the password").await.unwrap_err();
        assert_eq!(wrong.code(), Code::Unauthenticated);
    }
}

/// The highest resident memory of process `pid` so far, in KiB (VmHWM); `None` once
/// it has exited.
fn peak_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// authd in a process of its own on SQLite, its admin port on `admin`.
fn serve(dir: &Path, keys: &Path, admin: u16) -> Child {
    let free = || {
        std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port()
    };
    authd_command()
        .env("AUTHD_LISTEN", format!("127.0.0.1:{}", free()))
        .env("AUTHD_ADMIN_LISTEN", format!("127.0.0.1:{admin}"))
        .env("AUTHD_ADMIN_KEYS_FILE", keys)
        .env("AUTHD_METRICS_LISTEN", "")
        .env(
            "AUTHD_DATABASE_URL",
            format!("sqlite://{}", dir.join("authd.db").display()),
        )
        .env("AUTHD_TOKEN_KEYS", key_spec(TEST_KID, TEST_KEY))
        .env("AUTHD_PBKDF2_ITERATIONS", "1000")
        .env("AUTHD_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("authd starts")
}

/// 200,000 records and 1 GiB of lines too long to keep, generated as they are
/// written to the CLI's stdin (no file): the server's and the CLI's peak memory stay
/// under a bound that does not depend on the input's size.
#[tokio::test]
async fn a_large_import_keeps_memory_bounded() {
    const RECORDS: u64 = 200_000;
    const LONG_LINES: u64 = 10 * 1024; // of 100 KiB each: 1 GiB
    const BOUND_KIB: u64 = 128 * 1024;
    let dir = tempfile::tempdir().unwrap();
    let keys = keys_file();
    let admin_port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut server = serve(dir.path(), keys.path(), admin_port);
    let addr = format!("127.0.0.1:{admin_port}");
    crate::helpers::wait_for("the admin port answers", || async {
        tokio::net::TcpStream::connect(&addr).await.ok()
    })
    .await;
    let addr2 = addr.clone();
    let run = tokio::task::spawn_blocking(move || {
        let mut cli = authd_command()
            .args(["admin", "--addr", &addr2, "users", "import", "--json", "-"])
            .env("AUTHD_ADMIN_KEY", ADMIN_KEY)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let pid = cli.id();
        let mut stdin = cli.stdin.take().unwrap();
        let writer = std::thread::spawn(move || {
            let long = vec![b'x'; 100 * 1024];
            let mut long_left = LONG_LINES;
            for i in 0..RECORDS {
                let line =
                    format!("{{\"username\": \"bulk{i}\", \"password_hash\": \"{PBKDF2}\"}}\n");
                stdin.write_all(line.as_bytes()).unwrap();
                // The long lines spread over the input.
                if i % (RECORDS / LONG_LINES) == 0 && long_left > 0 {
                    stdin.write_all(&long).unwrap();
                    stdin.write_all(b"\n").unwrap();
                    long_left -= 1;
                }
            }
            for _ in 0..long_left {
                stdin.write_all(&long).unwrap();
                stdin.write_all(b"\n").unwrap();
            }
        });
        // Read the output as it comes (it is as long as the refusals), keeping only
        // the last line; the CLI's peak is read just before it exits.
        let mut stdout = std::io::BufReader::new(cli.stdout.take().unwrap());
        let (mut last, mut line, mut refused) = (String::new(), String::new(), 0u64);
        let mut cli_peak = 0;
        while stdout.read_line(&mut line).unwrap() > 0 {
            if line.contains("\"refused\"") && line.contains("\"line\"") {
                refused += 1;
            }
            cli_peak = cli_peak.max(peak_kib(pid).unwrap_or(0));
            last = std::mem::take(&mut line);
        }
        writer.join().unwrap();
        let mut stderr = String::new();
        cli.stderr
            .take()
            .unwrap()
            .read_to_string(&mut stderr)
            .unwrap();
        let status = cli.wait().unwrap();
        (status.code(), last, refused, cli_peak, stderr)
    })
    .await
    .unwrap();
    let server_peak = peak_kib(server.id()).expect("the server still runs");
    let _ = server.kill();
    let _ = server.wait();
    let (code, last, refused, cli_peak, stderr) = run;
    assert_eq!(code, Some(1), "{stderr}");
    let summary: Value = serde_json::from_str(&last).unwrap();
    assert_eq!(summary["created"], RECORDS, "{summary}");
    assert_eq!(
        (summary["refused"].as_u64(), refused),
        (Some(LONG_LINES), LONG_LINES)
    );
    eprintln!("peak resident memory: the server {server_peak} KiB, the CLI {cli_peak} KiB");
    assert!(cli_peak > 0, "the CLI's memory was read while it ran");
    assert!(cli_peak < BOUND_KIB, "the CLI peaked at {cli_peak} KiB");
    assert!(
        server_peak < BOUND_KIB,
        "the server peaked at {server_peak} KiB"
    );
}
