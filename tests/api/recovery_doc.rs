//! docs/recovery.md, run as written against the real server, on both backends:
//! the code blocks that follow the line `<!-- run by tests/api/recovery_doc.rs -->`
//! are, in order, the RequestPasswordReset call (a grpcurl transcript, run as
//! tests/api/readme.rs runs the README's), the event it writes (its fields matched
//! against what `authd admin events tail --json` prints), the CompletePasswordReset
//! call, and the subscriber that mails the link (Python, the standard library only,
//! run with the `authd` of this build on its PATH, mailing to a loopback SMTP server
//! of this test). The subscriber, started first, follows the stream from then on
//! and mails the link of the first request; it ends when authd stops, and once both
//! are started again resumes after the position it recorded: the next request's
//! link is mailed, the first's not again. The mailed
//! token then sets the new password as the guide shows.

use crate::{
    admin::{READ_KEY, admin_app},
    admin_cli::Cli,
    events::{PASSWORD, until, watch},
    grpcurl::grpcurl_or_skip,
    helpers::{TestApp, TestDb, expect_code, metric, skipped, wait_until},
    readme::{Block, Ports, Seen, Step, marked_blocks, run, shown_matches},
};
use authd::pb::admin::watch_events_request::Start;
use serde_json::Value;
use std::{
    ffi::OsString,
    net::SocketAddr,
    os::unix::process::CommandExt as _,
    path::{Path, PathBuf},
    process::{Child, Command, ExitStatus, Stdio},
    sync::{Arc, Mutex},
};
use tokio::{
    io::{AsyncBufReadExt as _, AsyncWriteExt as _, BufReader},
    net::{TcpListener, TcpStream},
};
use tonic::Code;

crate::backend_tests!(the_recovery_guide_runs_as_written);

const DOC: &str = "docs/recovery.md";
const MARKER: &str = "<!-- run by tests/api/recovery_doc.rs -->";
/// The link the program mails, by default.
const LINK: &str = "https://example.com/reset?token=";

/// One mail the sink took.
#[derive(Debug, Clone)]
struct Mail {
    from: String,
    to: Vec<String>,
    /// Headers and body, lines ending in `\n`.
    data: String,
}

impl Mail {
    fn header(&self, name: &str) -> Option<&str> {
        let head = self.data.split("\n\n").next().unwrap_or_default();
        head.lines().find_map(|line| {
            let (key, value) = line.split_once(':')?;
            key.eq_ignore_ascii_case(name).then(|| value.trim())
        })
    }

    /// The body, its transfer encoding undone.
    fn body(&self) -> String {
        let body = self.data.split_once("\n\n").map_or("", |(_, body)| body);
        match self.header("Content-Transfer-Encoding") {
            None | Some("7bit") => body.to_owned(),
            Some("quoted-printable") => quoted_printable(body),
            Some(other) => panic!("a mail in {other}: {self:?}"),
        }
    }

    /// The token of the link in the body.
    fn token(&self) -> String {
        let body = self.body();
        let at = body
            .find(LINK)
            .unwrap_or_else(|| panic!("no link in {body:?}"));
        body[at + LINK.len()..]
            .split_whitespace()
            .next()
            .unwrap_or_default()
            .to_owned()
    }
}

/// Quoted-printable (RFC 2045) decoded: soft line breaks joined, `=XX` bytes.
fn quoted_printable(text: &str) -> String {
    let text = text.replace("=\n", "");
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = (bytes[i] == b'=')
            .then(|| text.get(i + 1..i + 3))
            .flatten()
            .and_then(|hex| u8::from_str_radix(hex, 16).ok());
        match hex {
            Some(byte) => {
                out.push(byte);
                i += 3;
            }
            None => {
                out.push(bytes[i]);
                i += 1;
            }
        }
    }
    String::from_utf8(out).unwrap()
}

/// A loopback mail server: speaks as much SMTP as a client sending mail needs, and
/// keeps every message.
#[derive(Clone)]
struct MailSink {
    addr: SocketAddr,
    mails: Arc<Mutex<Vec<Mail>>>,
}

impl MailSink {
    async fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let sink = Self {
            addr: listener.local_addr().unwrap(),
            mails: Arc::default(),
        };
        let mails = sink.mails.clone();
        tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                tokio::spawn(session(tcp, mails.clone()));
            }
        });
        sink
    }

    fn mails(&self) -> Vec<Mail> {
        self.mails.lock().unwrap().clone()
    }
}

/// The address of `MAIL FROM:<…>` or `RCPT TO:<…>`.
fn address(line: &str) -> String {
    let start = line.find('<').map_or(0, |at| at + 1);
    let end = line.rfind('>').unwrap_or(line.len());
    line.get(start..end).unwrap_or_default().to_owned()
}

async fn session(tcp: TcpStream, mails: Arc<Mutex<Vec<Mail>>>) -> std::io::Result<()> {
    let (read, mut write) = tcp.into_split();
    let mut lines = BufReader::new(read).lines();
    write.write_all(b"220 mail.test ESMTP\r\n").await?;
    let (mut from, mut to) = (String::new(), Vec::new());
    while let Some(line) = lines.next_line().await? {
        let verb = line
            .split(' ')
            .next()
            .unwrap_or_default()
            .to_ascii_uppercase();
        let answer: &[u8] = match verb.as_str() {
            "EHLO" | "HELO" => b"250 mail.test\r\n",
            "MAIL" => {
                from = address(&line);
                b"250 OK\r\n"
            }
            "RCPT" => {
                to.push(address(&line));
                b"250 OK\r\n"
            }
            "DATA" => {
                write
                    .write_all(b"354 end with a line of one dot\r\n")
                    .await?;
                let mut data = String::new();
                while let Some(line) = lines.next_line().await? {
                    if line == "." {
                        break;
                    }
                    // A line that began with a dot was sent with one more.
                    data.push_str(line.strip_prefix('.').unwrap_or(&line));
                    data.push('\n');
                }
                mails.lock().unwrap().push(Mail {
                    from: std::mem::take(&mut from),
                    to: std::mem::take(&mut to),
                    data,
                });
                b"250 queued\r\n"
            }
            "RSET" => {
                from.clear();
                to.clear();
                b"250 OK\r\n"
            }
            "NOOP" => b"250 OK\r\n",
            "QUIT" => {
                write.write_all(b"221 bye\r\n").await?;
                return Ok(());
            }
            _ => b"502 not implemented\r\n",
        };
        write.write_all(answer).await?;
    }
    Ok(())
}

/// The guide's program, running; killed (with the `authd admin` it started) if the
/// test ends before it does.
struct Mailer {
    child: Option<Child>,
    log: PathBuf,
}

impl Mailer {
    fn start(python: &OsString, dir: &Path, mail: SocketAddr, admin: SocketAddr) -> Self {
        let authd = Path::new(env!("CARGO_BIN_EXE_authd"));
        let mut path = OsString::from(authd.parent().unwrap());
        if let Some(rest) = std::env::var_os("PATH") {
            path.push(":");
            path.push(rest);
        }
        let log = dir.join("mailer.log");
        let mut command = Command::new(python);
        for (key, _) in std::env::vars_os() {
            let key_text = key.to_string_lossy();
            if key_text.starts_with("AUTHD_") || key_text.starts_with("OTEL_") {
                command.env_remove(key);
            }
        }
        command
            .arg(dir.join("reset-mailer"))
            .env("PATH", path)
            .env("MAILER_STATE", dir.join("position"))
            .env("SMTP_HOST", mail.to_string())
            .env("AUTHD_ADMIN_LISTEN", admin.to_string())
            .env("AUTHD_ADMIN_KEY", READ_KEY)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            // A group of its own: the program and its `authd admin`, killed together.
            .process_group(0);
        Self {
            child: Some(command.spawn().unwrap()),
            log,
        }
    }

    /// Waits until the program ends; its status and what it wrote on stderr.
    async fn ended(mut self) -> (ExitStatus, String) {
        let mut child = self.child.take().unwrap();
        let status = crate::helpers::wait_for("the program ends", || {
            std::future::ready(child.try_wait().unwrap())
        })
        .await;
        (status, std::fs::read_to_string(&self.log).unwrap())
    }
}

impl Drop for Mailer {
    fn drop(&mut self) {
        if let Some(child) = &mut self.child
            && child.try_wait().is_ok_and(|ended| ended.is_none())
        {
            let _ = Command::new("kill")
                .args(["-KILL", "--", &format!("-{}", child.id())])
                .status();
            let _ = child.wait();
        }
    }
}

/// The one command of a transcript, which must call `method`.
fn one_step(block: &Block, method: &str) -> Step {
    let mut steps = crate::readme::steps(&block.lines);
    assert_eq!(steps.len(), 1, "{DOC}: one command a block");
    let step = steps.remove(0);
    assert!(step.command.contains(method), "{DOC}: {}", step.command);
    step
}

/// Runs `step` as tests/api/readme.rs does (off the runtime, which serves `app`).
async fn run_step(step: &Step, grpcurl: &Path, app: &TestApp, seen: Seen) -> Seen {
    let (step, grpcurl) = (step.clone(), grpcurl.to_owned());
    let ports = Ports {
        grpc: app.addr,
        health: app.handle.health_addr().expect("a health-only port"),
    };
    tokio::task::spawn_blocking(move || {
        let mut seen = seen;
        let dir = tempfile::tempdir().unwrap();
        run(&step, &grpcurl, dir.path(), &ports, &mut seen);
        seen
    })
    .await
    .unwrap()
}

/// Whether `actual` has the fields of `shown`, each a value of the same form: a
/// number for a number, a time for a time, a UUID for a UUID, a string that begins
/// as shown for one abbreviated with `…`, anything else the same value.
fn same_form(path: &str, shown: &Value, actual: &Value) {
    match (shown, actual) {
        (Value::Object(shown), Value::Object(actual)) => {
            let mut keys: Vec<&String> = shown.keys().collect();
            let mut actual_keys: Vec<&String> = actual.keys().collect();
            keys.sort();
            actual_keys.sort();
            assert_eq!(
                keys, actual_keys,
                "the fields of {path} ({DOC}, then authd)"
            );
            for (key, value) in shown {
                same_form(&format!("{path}.{key}"), value, &actual[key]);
            }
        }
        (Value::Number(_), Value::Number(_)) => {}
        (Value::String(shown), Value::String(actual)) => {
            assert!(
                shown_matches(shown, actual),
                "{path}: {DOC} shows {shown:?}, authd prints {actual:?}"
            );
        }
        (shown, actual) => assert_eq!(shown, actual, "{path}"),
    }
}

/// The WatchEvents streams open: this test's and the program's.
fn watchers(app: &TestApp) -> f64 {
    metric(&app.handle.render_metrics(), "authd_events_watchers").unwrap_or(0.0)
}

/// The position the program recorded last.
fn recorded(dir: &Path) -> Option<u64> {
    std::fs::read_to_string(dir.join("position"))
        .ok()?
        .trim()
        .parse()
        .ok()
}

async fn the_recovery_guide_runs_as_written(db: TestDb) {
    const TEST: &str = "the_recovery_guide_runs_as_written";
    let text = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join(DOC)).unwrap();
    let blocks = marked_blocks(&text, MARKER);
    let kinds: Vec<&str> = blocks.iter().map(|b| b.info).collect();
    assert_eq!(
        kinds,
        ["console", "json", "console", "python"],
        "the blocks {DOC} marks with {MARKER}"
    );
    let request = one_step(&blocks[0], "auth.v1.AuthService/RequestPasswordReset");
    let shown_event: Value = serde_json::from_str(&blocks[1].lines.join("\n"))
        .unwrap_or_else(|e| panic!("{DOC}: the event is not JSON ({e})"));
    let complete = one_step(&blocks[2], "auth.v1.AuthService/CompletePasswordReset");
    let program = blocks[3].lines.join("\n") + "\n";
    let Some(grpcurl) = grpcurl_or_skip(TEST) else {
        return;
    };
    let python = std::env::var_os("AUTHD_TEST_PYTHON").unwrap_or_else(|| "python3".into());
    if Command::new(&python).arg("--version").output().is_err() {
        skipped(TEST, "no Python (AUTHD_TEST_PYTHON or python3)");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("reset-mailer"), program).unwrap();
    let mail = MailSink::start().await;

    let mut admin = admin_app(&db, |_| {}).await;
    let mut events = watch(&mut admin.client, Start::Oldest, 0).await.unwrap();
    let alice = admin.app.register("alice", PASSWORD).await.unwrap();
    // Two sessions, which the completion ends (the guide shows 2).
    for _ in 0..2 {
        admin.app.login("alice", PASSWORD).await.unwrap();
    }
    let admin_addr = admin.app.handle.admin_addr().unwrap();
    let mailer = Mailer::start(&python, dir.path(), mail.addr, admin_addr);
    // Its first run follows the stream from now on: the request waits for it.
    wait_until("the program follows the stream", || {
        watchers(&admin.app) == 2.0
    })
    .await;

    // 1. The request, as the guide shows it.
    run_step(&request, &grpcurl, &admin.app, Seen::default()).await;
    // 2. Its event, as the guide shows it, and the mail the program sent.
    let first = (until(&mut events, "user.password_reset_requested").await)
        .pop()
        .unwrap();
    assert_eq!(first.user_id, alice);
    let tail = Cli::at(&admin_addr.to_string(), READ_KEY)
        .run(&[
            "events",
            "tail",
            "--from",
            &(first.position - 1).to_string(),
            "--count",
            "1",
            "--json",
        ])
        .await;
    assert_eq!(tail.code, Some(0), "{}", tail.stderr);
    let printed: Value = serde_json::from_str(&tail.stdout).unwrap();
    same_form("the event", &shown_event, &printed);
    let first_token = printed["data"]["token"].as_str().unwrap().to_owned();
    wait_until("the program mailed the link and recorded the event", || {
        !mail.mails().is_empty() && recorded(dir.path()) == Some(first.position)
    })
    .await;
    let mails = mail.mails();
    assert_eq!(mails.len(), 1);
    let sent = &mails[0];
    assert_eq!(sent.from, "noreply@example.com");
    assert_eq!(sent.to, ["alice@example.com"]);
    assert_eq!(sent.header("To"), Some("alice@example.com"));
    assert_eq!(sent.header("Subject"), Some("Reset your password"));
    assert_eq!(sent.token(), first_token);
    assert!(sent.body().contains("The link works once, for 30 minutes."));

    // authd stops: the tail ends, and so does the program.
    admin.app.stop().await.unwrap();
    let (status, log) = mailer.ended().await;
    assert!(status.code().is_some(), "ended by itself: {status}");
    assert!(!log.contains("Traceback"), "{log}");

    // Both started again: the program resumes after the position it recorded, so
    // the next request's link is mailed, and the first's not again.
    let mut admin = admin_app(&db, |_| {}).await;
    let mut events = watch(&mut admin.client, Start::AfterPosition, first.position)
        .await
        .unwrap();
    let admin_addr = admin.app.handle.admin_addr().unwrap();
    let mailer = Mailer::start(&python, dir.path(), mail.addr, admin_addr);
    run_step(&request, &grpcurl, &admin.app, Seen::default()).await;
    let second = (until(&mut events, "user.password_reset_requested").await)
        .pop()
        .unwrap();
    wait_until("the program mailed the second link", || {
        recorded(dir.path()) == Some(second.position)
    })
    .await;
    let mails = mail.mails();
    assert_eq!(mails.len(), 2, "{mails:?}");
    let second_token = mails[1].token();
    assert_ne!(second_token, first_token);
    let data: Value = serde_json::from_str(&second.data_json).unwrap();
    assert_eq!(data["token"], second_token.as_str());

    // 3. The completion, as the guide shows it, with the mailed token.
    let mut seen = Seen::default();
    seen.strings.push(second_token);
    run_step(&complete, &grpcurl, &admin.app, seen).await;
    admin
        .app
        .login("alice", "a new long password")
        .await
        .unwrap();
    expect_code(
        admin.app.login("alice", PASSWORD).await,
        Code::Unauthenticated,
    );
    admin.app.stop().await.unwrap();
    let (status, log) = mailer.ended().await;
    assert!(status.code().is_some(), "ended by itself: {status}");
    assert!(!log.contains("Traceback"), "{log}");
}
