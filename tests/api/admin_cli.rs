//! `authd admin`, the binary itself, against an app served in process with the
//! admin listener on: accounts listed (a table, JSON, pages), shown, disabled
//! (then refused at Login), enabled and deleted; the exit statuses scripts rely on
//! (1 refused, 2 usage, 3 no answer) with one line on stderr; the admin key kept out
//! of every output, logs included; sessions listed and ended, and a password set
//! from standard input or a file.

use crate::{
    admin::{ADMIN_KEY, Admin, PASSWORD, READ_KEY, admin_app},
    helpers::{Backend, TestDb, expect_code},
};
use authd::{ManualClock, pb::RefreshRequest};
use serde_json::Value;
use std::{
    io::Write as _,
    process::Stdio,
    sync::Arc,
    time::{Duration, SystemTime},
};
use tonic::Code;

crate::backend_tests!(
    accounts_are_managed_from_the_command_line,
    service_accounts_are_managed_from_the_command_line,
);

/// One run of `authd admin`.
pub(crate) struct Run {
    pub(crate) code: Option<i32>,
    pub(crate) stdout: String,
    pub(crate) stderr: String,
}

impl Run {
    /// Its stdout as JSON, once it succeeded.
    #[track_caller]
    fn json(&self) -> Value {
        self.ok();
        serde_json::from_str(&self.stdout)
            .unwrap_or_else(|e| panic!("not one JSON document ({e}):\n{}", self.stdout))
    }

    /// Asserts exit status 0.
    #[track_caller]
    fn ok(&self) -> &Self {
        assert_eq!(
            self.code,
            Some(0),
            "stdout:\n{}\nstderr:\n{}",
            self.stdout,
            self.stderr
        );
        self
    }

    /// Asserts the exit status `code` with one line on stderr, nothing on stdout;
    /// returns that line.
    #[track_caller]
    fn failed(&self, code: i32) -> &str {
        assert_eq!(
            self.code,
            Some(code),
            "stdout:\n{}\nstderr:\n{}",
            self.stdout,
            self.stderr
        );
        assert_eq!(self.stdout, "", "nothing on stdout");
        assert_eq!(self.stderr.lines().count(), 1, "one line:\n{}", self.stderr);
        self.stderr.trim_end()
    }
}

/// How `authd admin` is run: the address, the key in `AUTHD_ADMIN_KEY`, more of
/// the environment, what it reads on stdin.
#[derive(Clone, Default)]
pub(crate) struct Cli {
    addr: String,
    key: Option<String>,
    envs: Vec<(String, String)>,
    stdin: Option<Vec<u8>>,
}

impl Cli {
    /// The admin port of `admin`, with the admin key.
    fn of(admin: &Admin) -> Self {
        Self::at(
            &admin.app.handle.admin_addr().unwrap().to_string(),
            ADMIN_KEY,
        )
    }

    pub(crate) fn at(addr: &str, key: &str) -> Self {
        Self {
            addr: addr.to_owned(),
            key: Some(key.to_owned()),
            ..Self::default()
        }
    }

    fn key(&self, key: Option<&str>) -> Self {
        Self {
            key: key.map(str::to_owned),
            ..self.clone()
        }
    }

    fn stdin(&self, text: &str) -> Self {
        self.stdin_bytes(text.as_bytes().to_vec())
    }

    pub(crate) fn stdin_bytes(&self, bytes: Vec<u8>) -> Self {
        Self {
            stdin: Some(bytes),
            ..self.clone()
        }
    }

    fn env(&self, name: &str, value: &str) -> Self {
        let mut cli = self.clone();
        cli.envs.push((name.to_owned(), value.to_owned()));
        cli
    }

    /// `authd admin --addr ADDR ARGS…`, on a thread of its own while this one serves.
    pub(crate) async fn run(&self, args: &[&str]) -> Run {
        let cli = self.clone();
        let args: Vec<String> = args.iter().map(|a| (*a).to_owned()).collect();
        let output = tokio::task::spawn_blocking(move || {
            let mut command = crate::helpers::authd_command();
            command
                .arg("admin")
                .args(["--addr", &cli.addr])
                .args(&args)
                .envs(cli.envs.iter().map(|(k, v)| (k, v)))
                .stdin(if cli.stdin.is_some() {
                    Stdio::piped()
                } else {
                    Stdio::null()
                })
                .stdout(Stdio::piped())
                .stderr(Stdio::piped());
            if let Some(key) = &cli.key {
                command.env("AUTHD_ADMIN_KEY", key);
            }
            let mut child = command.spawn().unwrap();
            // Written from a thread of its own: a CLI that answers as it reads (an
            // import) fills its stdout while its stdin is still being written.
            if let Some(bytes) = cli.stdin.clone() {
                let mut stdin = child.stdin.take().unwrap();
                std::thread::spawn(move || {
                    let _ = stdin.write_all(&bytes);
                });
            }
            child.wait_with_output().unwrap()
        })
        .await
        .unwrap();
        Run {
            code: output.status.code(),
            stdout: String::from_utf8(output.stdout).unwrap(),
            stderr: String::from_utf8(output.stderr).unwrap(),
        }
    }
}

fn usernames(users: &Value) -> Vec<&str> {
    (users.as_array().unwrap().iter())
        .map(|u| u["username"].as_str().unwrap())
        .collect()
}

/// A time of the JSON output: RFC 3339, in UTC, and recent.
#[track_caller]
fn recent(at: &Value) {
    let text = at.as_str().unwrap_or_else(|| panic!("a time: {at}"));
    assert!(text.ends_with('Z'), "{text}");
    let at = humantime::parse_rfc3339(text).unwrap();
    let age = SystemTime::now().duration_since(at).unwrap_or_default();
    assert!(age < Duration::from_secs(600), "{text}");
}

async fn refresh(admin: &mut Admin, token: &str) -> Result<String, tonic::Status> {
    (admin.app.client)
        .refresh(RefreshRequest {
            refresh_token: token.into(),
        })
        .await
        .map(|r| r.into_inner().refresh_token)
}

async fn accounts_are_managed_from_the_command_line(db: TestDb) {
    let mut admin = admin_app(&db, |_| {}).await;
    let cli = Cli::of(&admin);
    let alice = admin.app.register("alice", PASSWORD).await.unwrap();
    let bob = admin.app.register("bob", PASSWORD).await.unwrap();
    let first = admin.app.login("bob", PASSWORD).await.unwrap();
    admin.app.login("bob", PASSWORD).await.unwrap();

    // A table for people.
    let run = cli.run(&["users", "list"]).await;
    let lines: Vec<&str> = run.ok().stdout.lines().collect();
    assert_eq!(lines.len(), 3, "{}", run.stdout);
    let header = lines[0];
    assert!(header.starts_with("USERNAME  "), "{header}");
    for column in ["ID", "DISABLED", "LIVE SESSIONS", "CREATED", "LAST LOGIN"] {
        assert!(header.contains(column), "{header}");
    }
    assert!(
        lines[1].starts_with("alice ") && lines[1].contains(&alice),
        "{}",
        run.stdout
    );
    assert!(
        lines[2].starts_with("bob ") && lines[2].contains(&bob),
        "{}",
        run.stdout
    );
    let sessions = header.find("LIVE SESSIONS").unwrap();
    assert_eq!(&lines[2][sessions..sessions + 2], "2 ");
    assert!(
        lines[1].ends_with(" -"),
        "alice never logged in: {}",
        lines[1]
    );

    // JSON for scripts: every field, times in RFC 3339.
    let page = cli.run(&["users", "list", "--json"]).await.json();
    assert_eq!(usernames(&page["users"]), ["alice", "bob"]);
    assert!(page["next_page_token"].is_null());
    let b = &page["users"][1];
    assert_eq!(b["id"], bob.as_str());
    assert_eq!(b["live_sessions"], 2);
    assert_eq!(b["disabled"], false);
    recent(&b["created_at"]);
    recent(&b["updated_at"]);
    recent(&b["last_login_at"]);
    assert!(b["disabled_at"].is_null() && b["disabled_reason"].is_null());
    assert!(page["users"][0]["last_login_at"].is_null());

    // One page, the next by its token, or every page.
    let one = cli
        .run(&["users", "list", "--page-size", "1", "--json"])
        .await
        .json();
    assert_eq!(usernames(&one["users"]), ["alice"]);
    let token = one["next_page_token"].as_str().unwrap();
    let next = (cli.run(&[
        "users",
        "list",
        "--page-size",
        "1",
        "--page-token",
        token,
        "--json",
    ]))
    .await
    .json();
    assert_eq!(usernames(&next["users"]), ["bob"]);
    let all = (cli.run(&["users", "list", "--page-size", "1", "--all", "--json"]))
        .await
        .json();
    assert_eq!(usernames(&all["users"]), ["alice", "bob"]);
    assert!(all["next_page_token"].is_null());
    let run = cli.run(&["users", "list", "--page-size", "1"]).await;
    assert_eq!(run.ok().stdout.lines().count(), 2, "{}", run.stdout);
    let note = format!("--page-token {token} the next one");
    assert!(run.stderr.contains(&note), "{}", run.stderr);
    let run = cli.run(&["users", "list", "--prefix", "AL"]).await;
    assert_eq!(run.stderr, "", "no note after the last page");
    assert_eq!(run.ok().stdout.lines().count(), 2, "{}", run.stdout);

    // One user, by name or by id.
    let run = cli.run(&["users", "get", "Bob"]).await;
    let text = &run.ok().stdout;
    assert!(text.contains(&format!("id             {bob}\n")), "{text}");
    assert!(text.contains("live sessions  2\n"), "{text}");
    assert!(text.contains("disabled       no\n"), "{text}");
    let got = cli
        .run(&["users", "get", "--id", &bob, "--json"])
        .await
        .json();
    assert_eq!(got["user"]["username"], "bob");

    // Disabled: its sessions end, its password is refused like a wrong one.
    let run = cli
        .run(&["users", "disable", "bob", "--reason", "laptop stolen"])
        .await;
    assert_eq!(
        run.ok().stdout,
        format!("disabled bob ({bob}); 2 sessions ended\n")
    );
    expect_code(
        admin.app.login("bob", PASSWORD).await,
        Code::Unauthenticated,
    );
    expect_code(
        refresh(&mut admin, &first.refresh_token).await,
        Code::Unauthenticated,
    );
    let got = cli.run(&["users", "get", "bob", "--json"]).await.json();
    assert_eq!(got["user"]["disabled"], true);
    assert_eq!(got["user"]["disabled_reason"], "laptop stolen");
    recent(&got["user"]["disabled_at"]);
    let run = cli.run(&["users", "get", "bob"]).await;
    assert!(
        run.ok().stdout.contains("reason         laptop stolen\n"),
        "{}",
        run.stdout
    );
    let again = (cli.run(&["users", "disable", "bob", "--reason", "again", "--json"]))
        .await
        .json();
    assert_eq!(
        (&again["changed"], &again["sessions_ended"]),
        (&Value::Bool(false), &0.into())
    );
    let disabled = cli
        .run(&["users", "list", "--disabled", "--json"])
        .await
        .json();
    assert_eq!(usernames(&disabled["users"]), ["bob"]);
    let enabled = cli
        .run(&["users", "list", "--enabled", "--json"])
        .await
        .json();
    assert_eq!(usernames(&enabled["users"]), ["alice"]);

    // Enabled: the password works again.
    let run = cli.run(&["users", "enable", "bob"]).await;
    assert_eq!(run.ok().stdout, format!("enabled bob ({bob})\n"));
    admin.app.login("bob", PASSWORD).await.unwrap();
    let run = cli.run(&["users", "enable", "bob", "--json"]).await;
    assert_eq!(run.json()["changed"], false);
    // No second factor to remove (removing one: tests/api/totp.rs).
    let run = cli.run(&["users", "remove-second-factors", "bob"]).await;
    let expected = format!("bob ({bob}) had no second factor; nothing changed\n");
    assert_eq!(run.ok().stdout, expected);

    // Deleted, only with --yes.
    let refused = cli.run(&["users", "delete", "bob"]).await;
    assert!(refused.failed(2).contains("--yes"));
    cli.run(&["users", "get", "bob"]).await.ok();
    let deleted = cli
        .run(&["users", "delete", "--id", &bob, "--yes", "--json"])
        .await
        .json();
    assert_eq!(deleted["user"]["username"], "bob");
    // Its live session, and those stored ended, are deleted with it.
    assert!(
        deleted["sessions_ended"].as_u64().unwrap() >= 1,
        "{deleted}"
    );
    let gone = cli.run(&["users", "get", "bob"]).await;
    assert_eq!(gone.failed(1), "authd: error: NOT_FOUND: no such user");
    expect_code(
        admin.app.login("bob", PASSWORD).await,
        Code::Unauthenticated,
    );
    let page = cli.run(&["users", "list", "--json"]).await.json();
    assert_eq!(usernames(&page["users"]), ["alice"]);
}

#[tokio::test]
async fn each_failure_has_its_exit_status_and_one_line() {
    let db = TestDb::new(Backend::Sqlite, "").await.unwrap();
    let mut admin = admin_app(&db, |_| {}).await;
    let cli = Cli::of(&admin);
    admin.app.register("alice", PASSWORD).await.unwrap();

    // 1: the server refused, with its code and message.
    let wrong = cli.key(Some("wrong-key-of-the-right-length-0123456789abcdef"));
    let run = wrong.run(&["users", "list"]).await;
    assert!(
        run.failed(1).starts_with("authd: error: UNAUTHENTICATED: "),
        "{}",
        run.stderr
    );
    let read = cli.key(Some(READ_KEY));
    read.run(&["users", "list"]).await.ok();
    let run = read
        .run(&["users", "disable", "alice", "--reason", "test"])
        .await;
    assert!(
        run.failed(1)
            .starts_with("authd: error: PERMISSION_DENIED: "),
        "{}",
        run.stderr
    );
    let run = cli.run(&["users", "get", "nobody"]).await;
    assert_eq!(run.failed(1), "authd: error: NOT_FOUND: no such user");
    let run = cli
        .run(&["users", "disable", "alice", "--reason", "  "])
        .await;
    let line = run.failed(1);
    assert!(
        line.starts_with("authd: error: INVALID_ARGUMENT: ") && line.contains("reason"),
        "{line}"
    );
    let run = cli.run(&["users", "list", "--prefix", "al ice"]).await;
    assert!(run.failed(1).contains("INVALID_ARGUMENT"), "{}", run.stderr);
    assert!(!(cli.run(&["users", "get", "alice"]).await.stdout).contains("disabled       yes"));
    // The gRPC port is not the admin port.
    let run = Cli::at(&admin.app.addr.to_string(), ADMIN_KEY)
        .run(&["users", "list"])
        .await;
    assert!(run.failed(1).contains("UNIMPLEMENTED") && run.stderr.contains("admin port"));

    // 2: usage, before anything is sent: clap's own, no key, unreadable files,
    // delete without --yes, no password to set.
    for args in [
        &["users", "frobnicate"][..],
        &["users", "list", "--page-size", "0"],
        &["users", "get"],
        &["users", "get", "alice", "--id", "x"],
        &["users", "disable", "alice"],
        &["users", "list", "--key", ADMIN_KEY],
    ] {
        let run = cli.run(args).await;
        assert_eq!(run.code, Some(2), "{args:?}: {}", run.stderr);
        assert_eq!(run.stdout, "", "{args:?}");
        assert!(!run.stderr.contains(ADMIN_KEY), "{}", run.stderr);
    }
    let run = cli.key(None).run(&["users", "list"]).await;
    assert!(run.failed(2).contains("AUTHD_ADMIN_KEY"), "{}", run.stderr);
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("missing").display().to_string();
    let run = cli
        .key(None)
        .run(&["users", "list", "--key-file", &missing])
        .await;
    assert!(run.failed(2).contains("--key-file"), "{}", run.stderr);
    let run = cli.run(&["set-password", "alice"]).await;
    assert!(run.failed(2).contains("no password"), "{}", run.stderr);
    let run = cli
        .run(&["set-password", "alice", "--password-file", &missing])
        .await;
    assert!(run.failed(2).contains("--password-file"), "{}", run.stderr);
    let run = cli.run(&["users", "delete", "alice"]).await;
    assert!(run.failed(2).contains("--yes"));
    cli.run(&["users", "get", "alice"]).await.ok();
    // The key from a file works as from the variable.
    let file = dir.path().join("key");
    std::fs::write(&file, format!("{ADMIN_KEY}\n")).unwrap();
    let from_file = cli.key(None);
    let run = from_file
        .run(&["users", "list", "--key-file", file.to_str().unwrap()])
        .await;
    assert_eq!(run.ok().stdout.lines().count(), 2);

    // 3: no answer: a closed port, a server that never answers.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = closed.local_addr().unwrap().to_string();
    drop(closed);
    let run = Cli::at(&addr, ADMIN_KEY).run(&["users", "list"]).await;
    assert!(run.failed(3).contains("cannot connect"), "{}", run.stderr);
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = silent.local_addr().unwrap().to_string();
    let run = (Cli::at(&addr, ADMIN_KEY))
        .run(&["users", "list", "--timeout", "300ms"])
        .await;
    assert!(run.failed(3).contains("timeout"), "{}", run.stderr);
    drop(silent);
}

#[tokio::test]
async fn the_admin_key_never_shows() {
    let db = TestDb::new(Backend::Sqlite, "").await.unwrap();
    let admin = admin_app(&db, |_| {}).await;
    // Every log line there is, to stderr.
    let cli = Cli::of(&admin).env("AUTHD_LOG", "trace");
    let mut app = admin.app;
    app.register("alice", PASSWORD).await.unwrap();
    let wrong = "wrong-key-of-the-right-length-0123456789abcdef";
    let dir = tempfile::tempdir().unwrap();
    let bad_file = dir.path().join("bad-key");
    std::fs::write(&bad_file, format!("{ADMIN_KEY} and more\n")).unwrap();
    let runs = [
        cli.run(&["users", "list"]).await,
        cli.run(&["users", "get", "alice", "--json"]).await,
        cli.run(&["users", "get", "nobody"]).await,
        cli.key(Some(READ_KEY))
            .run(&["users", "delete", "alice", "--yes"])
            .await,
        cli.key(Some(wrong)).run(&["users", "list"]).await,
        cli.key(Some(&format!("{ADMIN_KEY}\u{e9}")))
            .run(&["users", "list"])
            .await,
        (cli.key(None))
            .run(&["users", "list", "--key-file", bad_file.to_str().unwrap()])
            .await,
    ];
    let codes: Vec<_> = runs.iter().map(|r| r.code).collect();
    assert_eq!(
        codes,
        [
            Some(0),
            Some(0),
            Some(1),
            Some(1),
            Some(1),
            Some(2),
            Some(2)
        ]
    );
    assert!(
        runs[0].stderr.lines().count() > 5,
        "the log is on, or this test proves nothing:\n{}",
        runs[0].stderr
    );
    for run in &runs {
        for key in [ADMIN_KEY, READ_KEY, wrong] {
            assert!(!run.stdout.contains(key), "{}", run.stdout);
            assert!(!run.stderr.contains(key), "{}", run.stderr);
        }
    }
}

/// Needs the server side of ListSessions and EndSessions (placeholders answering
/// UNIMPLEMENTED in this branch).
#[tokio::test]
async fn sessions_are_listed_and_ended_from_the_command_line() {
    let db = TestDb::new(Backend::Sqlite, "").await.unwrap();
    let clock = Arc::new(ManualClock::new());
    let mut admin = admin_app(&db, |c| c.clock = Some(clock.clone())).await;
    let cli = Cli::of(&admin);
    let id = admin.app.register("carol", PASSWORD).await.unwrap();
    let older = admin.app.login("carol", PASSWORD).await.unwrap();
    // Apart in time: the list is newest first.
    clock.advance(Duration::from_secs(1));
    let newer = admin.app.login("carol", PASSWORD).await.unwrap();

    let listed = cli
        .run(&["sessions", "list", "carol", "--json"])
        .await
        .json();
    let sessions = listed["sessions"].as_array().unwrap();
    assert_eq!(sessions.len(), 2, "{listed}");
    for session in sessions {
        assert!(!session["id"].as_str().unwrap().is_empty());
        recent(&session["started_at"]);
        assert!(session["refreshed_at"].is_null(), "{session}");
        let expires = humantime::parse_rfc3339(session["expires_at"].as_str().unwrap()).unwrap();
        assert!(expires > SystemTime::now() + Duration::from_secs(3600));
    }
    let (newest, oldest) = (
        sessions[0]["id"].as_str().unwrap().to_owned(),
        sessions[1]["id"].as_str().unwrap().to_owned(),
    );
    assert_ne!(newest, oldest);
    let run = cli.run(&["sessions", "list", "--id", &id]).await;
    let lines: Vec<&str> = run.ok().stdout.lines().collect();
    assert_eq!(lines.len(), 3, "{}", run.stdout);
    for column in ["ID", "STARTED", "REFRESHED", "EXPIRES", "CLIENT"] {
        assert!(lines[0].contains(column), "{}", lines[0]);
    }
    assert!(lines[1].starts_with(&newest) && lines[2].starts_with(&oldest));

    // One session, named: only its refresh token stops working.
    let run = cli
        .run(&["sessions", "end", "carol", "--session", &newest])
        .await;
    assert_eq!(run.ok().stdout, "1 session of carol ended\n");
    expect_code(
        refresh(&mut admin, &newer.refresh_token).await,
        Code::Unauthenticated,
    );
    let rotated = refresh(&mut admin, &older.refresh_token).await.unwrap();
    let left = cli
        .run(&["sessions", "list", "carol", "--json"])
        .await
        .json();
    assert_eq!(left["sessions"].as_array().unwrap().len(), 1, "{left}");
    assert_eq!(left["sessions"][0]["id"], oldest.as_str());
    recent(&left["sessions"][0]["refreshed_at"]);
    // A session that is not hers, or not live, is not ended, and is no error.
    let run = (cli.run(&["sessions", "end", "carol", "--session", &newest, "--json"]))
        .await
        .json();
    assert_eq!(run["sessions_ended"], 0);

    // Every session: none named.
    let ended = cli
        .run(&["sessions", "end", "carol", "--json"])
        .await
        .json();
    assert_eq!(ended, serde_json::json!({"sessions_ended": 1}));
    expect_code(refresh(&mut admin, &rotated).await, Code::Unauthenticated);
    let run = cli.run(&["sessions", "list", "carol"]).await;
    assert_eq!(
        run.ok().stdout.lines().count(),
        1,
        "the header alone: {}",
        run.stdout
    );
    let run = cli.run(&["sessions", "list", "nobody"]).await;
    assert_eq!(run.failed(1), "authd: error: NOT_FOUND: no such user");
}

/// Needs the server side of SetPassword (a placeholder answering UNIMPLEMENTED in
/// this branch).
#[tokio::test]
async fn a_password_is_set_from_standard_input_or_a_file() {
    let db = TestDb::new(Backend::Sqlite, "").await.unwrap();
    let mut admin = admin_app(&db, |_| {}).await;
    let cli = Cli::of(&admin);
    admin.app.register("dave", PASSWORD).await.unwrap();
    let before = admin.app.login("dave", PASSWORD).await.unwrap();

    // From standard input: its first line, without the line ending; sessions end.
    let new = "violet tractor at dawn";
    let run = cli
        .stdin(&format!("{new}\nignored\n"))
        .run(&["set-password", "dave"])
        .await;
    assert_eq!(run.ok().stdout, "password of dave set; 1 session ended\n");
    expect_code(
        admin.app.login("dave", PASSWORD).await,
        Code::Unauthenticated,
    );
    let after = admin.app.login("dave", new).await.unwrap();
    expect_code(
        refresh(&mut admin, &before.refresh_token).await,
        Code::Unauthenticated,
    );

    // From a file, keeping the sessions.
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("pw");
    let third = "copper kettle in the rain";
    std::fs::write(&file, format!("{third}\r\n")).unwrap();
    let run = (cli.run(&[
        "set-password",
        "dave",
        "--password-file",
        file.to_str().unwrap(),
        "--keep-sessions",
        "--json",
    ]))
    .await;
    assert_eq!(run.json(), serde_json::json!({"sessions_ended": 0}));
    refresh(&mut admin, &after.refresh_token).await.unwrap();
    expect_code(admin.app.login("dave", new).await, Code::Unauthenticated);
    admin.app.login("dave", third).await.unwrap();

    // The password rules apply; the password is never shown.
    for weak in ["tiny7", "password123"] {
        let run = cli
            .stdin(&format!("{weak}\n"))
            .run(&["set-password", "dave"])
            .await;
        let line = run.failed(1);
        assert!(
            line.contains("INVALID_ARGUMENT") && line.contains("new_password"),
            "{line}"
        );
        assert!(!line.contains(weak), "{line}");
    }
    admin.app.login("dave", third).await.unwrap();
    let run = cli
        .stdin(&format!("{new}\n"))
        .run(&["set-password", "nobody"])
        .await;
    assert_eq!(run.failed(1), "authd: error: NOT_FOUND: no such user");
}

/// `authd admin service-accounts …`: created with a secret printed once (the last
/// line for people, `client_secret` in JSON), shown and listed without it, a secret
/// rotated in and the old one removed, disabled, and deleted only with --yes.
async fn service_accounts_are_managed_from_the_command_line(db: TestDb) {
    use authd::pb::IssueServiceTokenRequest;
    let admin = admin_app(&db, |_| {}).await;
    let cli = Cli::of(&admin);
    let grant = |secret: String| {
        let mut client = admin.app.client.clone();
        async move {
            client
                .issue_service_token(IssueServiceTokenRequest {
                    client_id: "orders".into(),
                    client_secret: secret,
                    ..Default::default()
                })
                .await
        }
    };

    let run = cli
        .run(&[
            "service-accounts",
            "create",
            "orders",
            "--audience",
            "billing",
            "--scope",
            "read",
            "--secret",
        ])
        .await;
    let secret = run.ok().stdout.lines().last().unwrap().to_owned();
    assert!(secret.starts_with("authd_sa_"), "{}", run.stdout);
    assert!(
        run.stdout.contains("client secret (shown this once"),
        "{}",
        run.stdout
    );
    grant(secret.clone()).await.unwrap();

    let shown = cli
        .run(&["service-accounts", "show", "orders", "--json"])
        .await
        .json();
    assert_eq!(shown["account"]["name"], "orders");
    assert_eq!(shown["account"]["audiences"][0], "billing");
    assert!(shown.get("client_secret").is_none());
    let old_id = shown["account"]["credentials"][0]["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let listed = cli.run(&["service-accounts", "list"]).await;
    assert!(listed.ok().stdout.contains("orders"), "{}", listed.stdout);
    assert!(!listed.stdout.contains(&secret));

    // Rotation: a new secret, the old one removed; only the new one works.
    let rotated = cli
        .run(&[
            "service-accounts",
            "rotate-secret",
            "orders",
            "--revoke",
            &old_id,
            "--json",
        ])
        .await
        .json();
    let new_secret = rotated["client_secret"].as_str().unwrap().to_owned();
    assert_ne!(new_secret, secret);
    expect_code(grant(secret).await, Code::Unauthenticated);
    grant(new_secret.clone()).await.unwrap();

    cli.run(&[
        "service-accounts",
        "disable",
        "orders",
        "--reason",
        "retired",
    ])
    .await
    .ok();
    expect_code(grant(new_secret).await, Code::Unauthenticated);
    let refused = cli.run(&["service-accounts", "delete", "orders"]).await;
    assert!(refused.failed(2).contains("--yes"));
    cli.run(&["service-accounts", "delete", "orders", "--yes"])
        .await
        .ok();
    let gone = cli.run(&["service-accounts", "show", "orders"]).await;
    assert!(gone.failed(1).contains("NOT_FOUND"), "{}", gone.stderr);
}
