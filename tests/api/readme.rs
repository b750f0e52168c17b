//! The README's examples, run: every code block of README.md (then of docs/api.md)
//! that follows the line `<!-- run by tests/api/readme.rs -->` is a transcript (`$ command`, continued by
//! lines ending in `\`, then what it prints), and each of its commands runs against a
//! real server on 127.0.0.1, its output matched against the transcript's:
//! - `grpcurl …` (from AUTHD_TEST_GRPCURL or the PATH, as in `grpcurl.rs`; skipped
//!   without it) with `localhost:50051` and `localhost:50052` standing for the
//!   server's gRPC and health-only ports;
//! - `curl …` (authd's JSON form, on the gRPC port; from the PATH, skipped without
//!   it), its answer matched as grpcurl's is;
//! - `target/release/authd health …` (this build's binary), its health port the
//!   server's.
//!
//! An answer printed as JSON must have exactly the transcript's fields, each value of
//! the same form: a UUID for a UUID, a time for a time, `eyJhbGciOi…` a string that
//! begins so (`…` alone: any string), anything else the same value; and a UUID or a
//! time shown twice (a user id, an expiry) the same both times. Other output must
//! match line by line, where a line `…` stands for any number of lines and a `…`
//! within a line for any text. A failed command's transcript starts with grpcurl's
//! `ERROR:`. A request that quotes an earlier answer abbreviated (`"eyJhbGciOi…"`)
//! is sent the whole value (of the latest answer that gave one).
//!
//! A string shown as `<a name>` in an answer is any string, named: a request that
//! quotes `<a name>` is sent the value the latest answer showing it had. A request's
//! `"code": "<current code>"` is sent the current TOTP code of the latest `secret`
//! an answer gave, the server's clock (the test's) first moved on one step of 30 s,
//! as a user waits for the next code.

use crate::grpcurl::grpcurl_or_skip;
use crate::helpers::{authd_command, spawn_app_with};
use crate::totp::{base32_decode, code_at};
use authd::ManualClock;
use serde_json::Value;
use std::{
    collections::HashMap, net::SocketAddr, path::Path, process::Command, sync::Arc, time::Duration,
};

/// The files whose marked blocks are run, in order, against one server.
const FILES: [&str; 2] = ["README.md", "docs/api.md"];

/// The line that marks a block of README.md as run by this test.
const MARKER: &str = "<!-- run by tests/api/readme.rs -->";

/// One command of a transcript and what it printed.
#[derive(Debug, Clone)]
pub(crate) struct Step {
    pub(crate) command: String,
    output: Vec<String>,
}

/// A code block of a markdown file.
pub(crate) struct Block<'a> {
    /// What follows the opening fence (` ```console `: `console`).
    pub(crate) info: &'a str,
    /// Its lines, without the indentation of its fence (a block in a list item).
    pub(crate) lines: Vec<&'a str>,
}

/// Every code block of `text` that follows a line `marker`, in order.
pub(crate) fn marked_blocks<'a>(text: &'a str, marker: &str) -> Vec<Block<'a>> {
    let mut blocks = Vec::new();
    let mut lines = text.lines();
    while let Some(line) = lines.next() {
        if line.trim() != marker {
            continue;
        }
        let fence = lines.next().unwrap_or_default();
        let info = fence.trim_start();
        assert!(
            info.starts_with("```"),
            "{marker} must be followed by a code block, not {fence:?}"
        );
        let indent = &fence[..fence.len() - info.len()];
        let block: Vec<&str> = lines
            .by_ref()
            .take_while(|l| !l.trim_start().starts_with("```"))
            .map(|l| l.strip_prefix(indent).unwrap_or(l.trim_start()))
            .collect();
        blocks.push(Block {
            info: info.trim_start_matches('`').trim(),
            lines: block,
        });
    }
    blocks
}

/// The transcripts of every marked block of `readme`, in order.
fn transcripts(readme: &str) -> Vec<Vec<Step>> {
    (marked_blocks(readme, MARKER).iter())
        .map(|block| steps(&block.lines))
        .collect()
}

/// The commands of one transcript, each with the lines it printed (trailing blank
/// lines dropped).
pub(crate) fn steps(block: &[&str]) -> Vec<Step> {
    let mut steps: Vec<Step> = Vec::new();
    let mut lines = block.iter();
    while let Some(line) = lines.next() {
        if let Some(command) = line.strip_prefix("$ ") {
            let mut command = command.to_owned();
            while command.ends_with('\\') {
                command.pop();
                let next = lines.next().expect("a continued command goes on");
                command.push(' ');
                command.push_str(next.trim());
            }
            steps.push(Step {
                command,
                output: Vec::new(),
            });
        } else {
            let step = steps
                .last_mut()
                .expect("a transcript starts with a command");
            step.output.push(line.trim_end().to_owned());
        }
    }
    for step in &mut steps {
        while step.output.last().is_some_and(String::is_empty) {
            step.output.pop();
        }
    }
    steps
}

/// The words of a shell command: split at blanks outside quotes, `'…'` taken as it
/// is, `"…"` and the rest with backslash escapes.
fn words(command: &str) -> Vec<String> {
    let mut words = Vec::new();
    let mut word: Option<String> = None;
    let mut chars = command.chars();
    while let Some(c) = chars.next() {
        match c {
            c if c.is_whitespace() => words.extend(word.take()),
            '\'' => {
                let quoted: String = chars.by_ref().take_while(|&c| c != '\'').collect();
                word.get_or_insert_default().push_str(&quoted);
            }
            '"' => {
                let word = word.get_or_insert_default();
                while let Some(c) = chars.next() {
                    match c {
                        '"' => break,
                        '\\' => word.extend(chars.next()),
                        c => word.push(c),
                    }
                }
            }
            '\\' => word.get_or_insert_default().extend(chars.next()),
            c => word.get_or_insert_default().push(c),
        }
    }
    words.extend(word);
    words
}

/// Whether `line` matches `pattern`, in which each `…` stands for any text.
pub(crate) fn line_matches(pattern: &str, line: &str) -> bool {
    let parts: Vec<&str> = pattern.split('…').collect();
    if parts.len() == 1 {
        return pattern == line;
    }
    let (first, last) = (parts[0], parts[parts.len() - 1]);
    if !line.starts_with(first) || line.len() < first.len() + last.len() || !line.ends_with(last) {
        return false;
    }
    let mut rest = &line[first.len()..line.len() - last.len()];
    for part in &parts[1..parts.len() - 1] {
        match rest.find(part) {
            Some(at) => rest = &rest[at + part.len()..],
            None => return false,
        }
    }
    true
}

/// Whether `lines` match `pattern`, line by line, a line `…` standing for any number
/// of lines.
fn lines_match(pattern: &[String], lines: &[&str]) -> bool {
    match pattern.split_first() {
        None => lines.is_empty(),
        Some((first, rest)) if first.trim() == "…" => {
            (0..=lines.len()).any(|skip| lines_match(rest, &lines[skip..]))
        }
        Some((first, rest)) => lines
            .split_first()
            .is_some_and(|(line, others)| line_matches(first, line) && lines_match(rest, others)),
    }
}

/// What the answers printed so far showed: each value the transcript shows with the
/// value it stood for, and every string of the answers.
#[derive(Default)]
pub(crate) struct Seen {
    bound: HashMap<String, String>,
    /// `<a name>` placeholders and the value each stood for last.
    named: HashMap<String, String>,
    /// Every string of the answers (a value a request may abbreviate).
    pub(crate) strings: Vec<String>,
    /// The TOTP secret an answer gave last (base32).
    secret: Option<String>,
    /// The server's clock.
    clock: Option<Arc<ManualClock>>,
}

/// Whether a string the transcript shows is a named placeholder, `<a name>`.
fn is_placeholder(shown: &str) -> bool {
    shown.len() > 2 && shown.starts_with('<') && shown.ends_with('>')
}

/// Whether `text` has the form `form` gives, character by character: `9` a digit,
/// `f` a hexadecimal digit, anything else itself.
pub(crate) fn has_form(text: &str, form: &str) -> bool {
    text.len() == form.len()
        && text.chars().zip(form.chars()).all(|(c, f)| match f {
            '9' => c.is_ascii_digit(),
            'f' => c.is_ascii_hexdigit(),
            f => c == f,
        })
}

/// Whether `actual` is what a document shows as `shown`: the same text, or a line
/// whose `…` stand for any text, or a UUID or a time where it shows one.
pub(crate) fn shown_matches(shown: &str, actual: &str) -> bool {
    if shown.contains('…') {
        line_matches(shown, actual)
    } else if has_form(shown, UUID) {
        has_form(actual, UUID)
    } else if is_time(shown) {
        is_time(actual)
    } else {
        shown == actual
    }
}

pub(crate) const UUID: &str = "ffffffff-ffff-ffff-ffff-ffffffffffff";

/// Whether `text` is a time in RFC 3339, in UTC, with or without fractions of a second.
pub(crate) fn is_time(text: &str) -> bool {
    (text.get(..19)).is_some_and(|start| has_form(start, "9999-99-99T99:99:99"))
        && text.ends_with('Z')
}

impl Seen {
    /// Checks that `actual` has the shape of `shown`, at `path`; remembers what it saw.
    fn check(&mut self, path: &str, shown: &Value, actual: &Value) {
        match (shown, actual) {
            (Value::Object(shown), Value::Object(actual)) => {
                let keys = |m: &serde_json::Map<String, Value>| {
                    let mut keys: Vec<String> = m.keys().cloned().collect();
                    keys.sort();
                    keys
                };
                assert_eq!(
                    keys(shown),
                    keys(actual),
                    "the fields of {path} (README, then the answer)"
                );
                for (key, value) in shown {
                    self.check(&format!("{path}.{key}"), value, &actual[key]);
                }
            }
            (Value::Array(shown), Value::Array(actual)) => {
                assert_eq!(shown.len(), actual.len(), "the length of {path}");
                for (i, (s, a)) in shown.iter().zip(actual).enumerate() {
                    self.check(&format!("{path}[{i}]"), s, a);
                }
            }
            (Value::String(shown), Value::String(actual)) => {
                self.strings.push(actual.clone());
                if path.ends_with(".secret") {
                    self.secret = Some(actual.clone());
                }
                let same_form = if is_placeholder(shown) {
                    self.named.insert(shown.clone(), actual.clone());
                    !actual.is_empty()
                } else {
                    shown_matches(shown, actual)
                };
                assert!(
                    same_form,
                    "{path}: the README shows {shown:?}, the answer has {actual:?}"
                );
                if has_form(shown, UUID) || is_time(shown) {
                    let before = self
                        .bound
                        .entry(shown.clone())
                        .or_insert_with(|| actual.clone());
                    assert_eq!(
                        before, actual,
                        "{path}: the README shows {shown:?} twice, the answers differ"
                    );
                }
            }
            (shown, actual) => assert_eq!(shown, actual, "{path}"),
        }
    }

    /// `data` (a request in JSON) with each string abbreviated with a trailing `…`
    /// completed from the answers seen so far.
    fn complete(&self, data: &str) -> String {
        fn walk(value: &mut Value, seen: &Seen) {
            match value {
                Value::String(s) if s == "<current code>" => *s = seen.current_code(),
                Value::String(s) if is_placeholder(s) => {
                    let whole = (seen.named.get(s.as_str()))
                        .unwrap_or_else(|| panic!("no answer before showed {s:?}"));
                    *s = whole.clone();
                }
                Value::String(s) if s.ends_with('…') => {
                    let prefix = s.trim_end_matches('…');
                    // The latest answer that gave such a value.
                    let whole = (seen.strings.iter().rev())
                        .find(|seen| seen.starts_with(prefix))
                        .unwrap_or_else(|| panic!("no answer before gave a value {s:?}"));
                    *s = whole.clone();
                }
                Value::Object(map) => map.values_mut().for_each(|v| walk(v, seen)),
                Value::Array(list) => list.iter_mut().for_each(|v| walk(v, seen)),
                _ => {}
            }
        }
        let mut value: Value = serde_json::from_str(data)
            .unwrap_or_else(|e| panic!("the README's request is not JSON ({e}): {data}"));
        walk(&mut value, self);
        value.to_string()
    }

    /// The TOTP code of the latest secret, one step of the server's clock later.
    fn current_code(&self) -> String {
        let secret = (self.secret.as_deref()).expect("an answer gave a TOTP secret before");
        let clock = self
            .clock
            .as_ref()
            .expect("the server runs on the test's clock");
        clock.advance(Duration::from_secs(30));
        code_at(&base32_decode(secret), clock.unix_millis() / 1000)
    }
}

/// The server the transcripts run against.
pub(crate) struct Ports {
    pub(crate) grpc: SocketAddr,
    pub(crate) health: SocketAddr,
}

impl Ports {
    /// `text` with the README's addresses replaced by the server's.
    fn put(&self, text: &str) -> String {
        text.replace("localhost:50051", &self.grpc.to_string())
            .replace("localhost:50052", &self.health.to_string())
            .replace("127.0.0.1:50052", &self.health.to_string())
    }
}

/// Runs one step of a transcript and checks what it printed.
pub(crate) fn run(step: &Step, grpcurl: &Path, dir: &Path, ports: &Ports, seen: &mut Seen) {
    let words = words(&step.command);
    let (program, args) = words.split_first().expect("a command");
    let mut command = match program.as_str() {
        "grpcurl" => {
            let mut command = Command::new(grpcurl);
            command.args(["-max-time", "30"]);
            let mut args = args.iter();
            while let Some(arg) = args.next() {
                command.arg(ports.put(arg));
                if arg == "-d" {
                    let data = args.next().expect("-d takes the request");
                    command.arg(seen.complete(data));
                }
            }
            command
        }
        // authd's JSON form, over HTTP/1.1 on the gRPC port.
        "curl" => {
            let mut command = Command::new("curl");
            command.args(["--max-time", "30"]);
            let mut args = args.iter();
            while let Some(arg) = args.next() {
                command.arg(ports.put(arg));
                if arg == "-d" || arg == "--data" {
                    let data = args.next().expect("-d takes the request");
                    command.arg(seen.complete(data));
                }
            }
            command
        }
        "target/release/authd" | "authd" => {
            let mut command = authd_command();
            command
                .env("AUTHD_HEALTH_LISTEN", ports.health.to_string())
                .args(args);
            command
        }
        other => panic!(
            "the README's transcript runs {other:?}, which tests/api/readme.rs cannot run: \
             `{}`",
            step.command
        ),
    };
    let output = command.current_dir(dir).output().expect("the command runs");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    let shown: Vec<String> = step.output.iter().map(|l| ports.put(l)).collect();
    let context = format!("`{}`\nprinted:\n{stdout}{stderr}", step.command);
    let failed = shown.first().is_some_and(|l| l == "ERROR:");
    assert_eq!(!output.status.success(), failed, "{context}");
    if shown.first().is_some_and(|l| l.starts_with('{')) {
        let shown: Value = serde_json::from_str(&shown.join("\n"))
            .unwrap_or_else(|e| panic!("the README's answer is not JSON ({e}): {context}"));
        let actual: Value = serde_json::from_str(&stdout)
            .unwrap_or_else(|e| panic!("the answer is not JSON ({e}): {context}"));
        seen.check("the answer", &shown, &actual);
    } else {
        let printed = if failed { &stderr } else { &stdout };
        let lines: Vec<&str> = printed.trim_end().lines().map(str::trim_end).collect();
        assert!(
            lines_match(&shown, &lines),
            "the README shows:\n{}\n{context}",
            shown.join("\n")
        );
    }
}

#[tokio::test]
async fn the_readme_transcripts_are_what_authd_prints() {
    let mut blocks = Vec::new();
    for file in FILES {
        let text = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join(file))
            .unwrap_or_else(|e| panic!("{file}: {e}"));
        blocks.extend(transcripts(&text));
    }
    // The quick tour's calls are among them: a README that lost its markers would
    // otherwise pass with nothing run.
    let commands: Vec<&str> = (blocks.iter().flatten())
        .map(|s| s.command.as_str())
        .collect();
    for call in [
        "list",
        "/Register",
        "/Login",
        "/ValidateToken",
        "Health/Check",
    ] {
        assert!(
            commands.iter().any(|c| c.contains(call)),
            "no marked transcript of README.md calls {call}: {commands:?}"
        );
    }
    let Some(grpcurl) = grpcurl_or_skip("the_readme_transcripts_are_what_authd_prints") else {
        return;
    };
    if Command::new("curl").arg("--version").output().is_err() {
        crate::helpers::skipped(
            "the_readme_transcripts_are_what_authd_prints",
            "curl is not installed",
        );
        return;
    }
    let clock = Arc::new(ManualClock::new());
    let server_clock = clock.clone();
    // With data keys, so that the second factor's RPCs run (docs/api.md).
    let app = spawn_app_with(move |c| {
        c.clock = Some(server_clock);
        c.second_factor.data_keys = Some(crate::totp::K1.parse().unwrap());
    })
    .await;
    let ports = Ports {
        grpc: app.addr,
        health: app.handle.health_addr().expect("a health-only port"),
    };
    let dir = tempfile::tempdir().unwrap();
    // Off the runtime: the server answers on it meanwhile.
    tokio::task::spawn_blocking(move || {
        let mut seen = Seen {
            clock: Some(clock),
            ..Seen::default()
        };
        for step in blocks.iter().flatten() {
            run(step, &grpcurl, dir.path(), &ports, &mut seen);
        }
    })
    .await
    .unwrap();
}

#[test]
fn a_transcript_reads_as_a_shell_shows_it() {
    let block = [
        "$ grpcurl -plaintext -d '{\"a\":\"b c\"}' \\",
        "    localhost:50051 x.Y/Z",
        "{",
        "  \"a\": 1",
        "}",
        "",
        "$ authd health --service \"a b\"",
        "…",
    ];
    let steps = steps(&block);
    assert_eq!(steps.len(), 2);
    assert_eq!(
        words(&steps[0].command),
        [
            "grpcurl",
            "-plaintext",
            "-d",
            r#"{"a":"b c"}"#,
            "localhost:50051",
            "x.Y/Z"
        ]
    );
    assert_eq!(steps[0].output, ["{", "  \"a\": 1", "}"]);
    assert_eq!(
        words(&steps[1].command),
        ["authd", "health", "--service", "a b"]
    );
    let pattern = |lines: &[&str]| lines.iter().map(|l| l.to_string()).collect::<Vec<_>>();
    assert!(lines_match(
        &pattern(&["a", "…", "d"]),
        &["a", "b", "c", "d"]
    ));
    assert!(lines_match(&pattern(&["a", "…", "b"]), &["a", "b"]));
    assert!(!lines_match(&pattern(&["a", "c"]), &["a", "b", "c"]));
    assert!(lines_match(&pattern(&["x: {…}"]), &["x: {\"y\":[1]}"]));
    assert!(!lines_match(&pattern(&["x: {…}"]), &["y: {}"]));
    assert!(is_time("2026-12-01T10:46:16Z") && is_time("2026-12-31T10:31:16.482Z"));
    assert!(!is_time("2026-12-01") && !is_time("alice"));
    assert!(has_form("01a230ff-6ecf-70ed-9772-be52d4c007f1", UUID));
}
