//! `authd admin users import FILE|-`: users with the password hashes they already
//! have, from JSON Lines (docs/migration.md), streamed to ImportUsers.
//!
//! The input is read on a thread of its own, a line at a time, never whole: a line
//! longer than [`MAX_LINE`] is refused by its number and skipped without being
//! kept. Each line is parsed here (JSON, the fields and their types); a line that
//! does not parse is refused here, one that does goes to the server, which checks
//! the rest (the username rules, the hash's format and caps, conflicts). At most
//! [`IN_FLIGHT`] lines are between the reader and their answer, so memory stays
//! bounded whatever the input's size, and the server's pace sets the reader's.
//!
//! Every refused line is printed with its number and reason, in line order, on
//! stdout (a JSON object a line with `--json`), then a summary. Progress (records a
//! second, done of the total for a file, the time left) is shown on stderr while it
//! is a terminal, and only then.

use super::{Admin, Failure, failure};
use crate::{
    config::OnConflictArg,
    pb::admin::{ImportUsersRequest, OnConflict, import_users_response::Outcome},
};
use std::{
    collections::VecDeque,
    fs::File,
    io::{BufRead, BufReader, IsTerminal as _, Read, Write as _},
    path::Path,
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, Instant, UNIX_EPOCH},
};
use tokio::sync::mpsc;

/// The longest line read, in bytes.
pub(super) const MAX_LINE: usize = 64 * 1024;
/// The longest hash the server reads (a structured form's JSON text included).
const MAX_HASH: usize = 4096;
/// The largest record sent: the admin port refuses a message over 8 KiB, which
/// would end the whole import, so a larger record is refused here, by its line.
const MAX_RECORD: usize = 8 * 1024 - 64;
/// The most lines between the reader and their answer.
const IN_FLIGHT: usize = 2048;

/// Where the lines come from, opened before connecting (so a missing file costs no
/// connection), with its size when it is a file.
pub(super) struct Input {
    reader: Box<dyn Read + Send>,
    size: Option<u64>,
}

impl Input {
    pub(super) fn open(path: &Path) -> Result<Self, String> {
        if path == Path::new("-") {
            return Ok(Self {
                reader: Box::new(std::io::stdin()),
                size: None,
            });
        }
        let file = File::open(path)
            .map_err(|e| format!("{}: cannot read the file: {e}", path.display()))?;
        let size = (file.metadata().ok())
            .filter(|m| m.is_file())
            .map(|m| m.len());
        Ok(Self {
            reader: Box::new(file),
            size,
        })
    }
}

/// What the reader makes of a line.
enum Line {
    Record(Box<ImportUsersRequest>),
    Refused(u64, String),
}

/// The lines of a run by outcome.
#[derive(Default)]
struct Tally {
    created: u64,
    unchanged: u64,
    skipped: u64,
    refused: u64,
}

impl Tally {
    fn done(&self) -> u64 {
        self.created + self.unchanged + self.skipped + self.refused
    }
}

/// Runs the import: prints every refusal as it is answered, and returns the summary
/// (or, when a line was refused, the failure that carries it).
pub(super) async fn run(
    admin: &Admin,
    input: Input,
    on_conflict: OnConflictArg,
    as_json: bool,
) -> Result<String, Failure> {
    let on_conflict = match on_conflict {
        OnConflictArg::Fail => OnConflict::Fail,
        OnConflictArg::Skip => OnConflict::Skip,
    };
    let total = input.size;
    let read = Arc::new(AtomicU64::new(0));
    let (lines_tx, mut lines) = mpsc::channel(IN_FLIGHT);
    let reader = {
        let read = read.clone();
        std::thread::spawn(move || read_lines(input.reader, on_conflict, &read, &lines_tx))
    };
    let (records_tx, records) = mpsc::channel(IN_FLIGHT);
    let mut request = tonic::Request::new(tokio_stream::wrappers::ReceiverStream::new(records));
    (request.metadata_mut()).insert("authorization", admin.authorization.clone());
    let started = Instant::now();
    let mut answers = match admin.client().import_users(request).await {
        Ok(response) => response.into_inner(),
        Err(status) => return Err(failure(&admin.addr, admin.timeout, status)),
    };
    let mut records_tx = Some(records_tx);
    let mut order: VecDeque<Option<(u64, String)>> = VecDeque::new();
    let mut tally = Tally::default();
    let mut out = std::io::stdout().lock();
    let progress = Progress::new(total);
    let mut tick = tokio::time::interval(Duration::from_millis(250));
    let mut reading = true;
    let mut stopped = None;
    loop {
        // The lines refused here, before the next answer's line.
        while let Some(Some(_)) = order.front() {
            if let Some(Some((line, why))) = order.pop_front() {
                tally.refused += 1;
                print_refusal(&mut out, line, &why, as_json)?;
            }
        }
        if !reading && order.is_empty() {
            records_tx = None;
        }
        tokio::select! {
            line = lines.recv(), if reading && order.len() < IN_FLIGHT => match line {
                Some(Line::Record(record)) => {
                    order.push_back(None);
                    let sent = match &records_tx {
                        Some(tx) => tx.send(*record).await.is_ok(),
                        None => false,
                    };
                    if !sent {
                        // The call ended: its status comes with the answers.
                        reading = false;
                    }
                }
                Some(Line::Refused(line, why)) => order.push_back(Some((line, why))),
                None => {
                    reading = false;
                    records_tx = None;
                }
            },
            answer = answers.message() => match answer {
                Ok(Some(answer)) => {
                    match order.pop_front() {
                        Some(None) => {}
                        _ => return Err(Failure::Refused(tonic::Status::internal(
                            "the server answered a line it was not sent",
                        ))),
                    }
                    match answer.outcome() {
                        Outcome::Created => tally.created += 1,
                        Outcome::Unchanged => tally.unchanged += 1,
                        Outcome::Skipped => tally.skipped += 1,
                        Outcome::Refused | Outcome::Unspecified => {
                            tally.refused += 1;
                            print_refusal(&mut out, answer.line, &answer.reason, as_json)?;
                        }
                    }
                }
                Ok(None) => break,
                Err(status) => {
                    stopped = Some(failure(&admin.addr, admin.timeout, status));
                    break;
                }
            },
            _ = tick.tick() => progress.show(tally.done(), read.load(Ordering::Relaxed), started),
        }
    }
    progress.clear();
    drop(lines);
    // The reader stops at its next line once nobody listens.
    if stopped.is_none() {
        let _ = reader.join();
    }
    let elapsed = started.elapsed().as_secs_f64().max(1e-9);
    let rate = tally.done() as f64 / elapsed;
    let summary = if as_json {
        serde_json::json!({
            "created": tally.created,
            "unchanged": tally.unchanged,
            "skipped": tally.skipped,
            "refused": tally.refused,
            "seconds": (elapsed * 1000.0).round() / 1000.0,
            "lines_per_second": rate.round(),
        })
        .to_string()
            + "\n"
    } else {
        format!(
            "created {}, unchanged {}, skipped {}, refused {} ({} lines in {:.1}s, {:.0} lines/s)\n",
            tally.created,
            tally.unchanged,
            tally.skipped,
            tally.refused,
            tally.done(),
            elapsed,
            rate
        )
    };
    if let Some(stop) = stopped {
        return Err(Failure::Stopped {
            summary,
            cause: Box::new(stop),
        });
    }
    if tally.refused > 0 {
        return Err(Failure::LinesRefused {
            summary,
            refused: tally.refused,
        });
    }
    Ok(summary)
}

fn print_refusal(
    out: &mut impl std::io::Write,
    line: u64,
    why: &str,
    as_json: bool,
) -> Result<(), Failure> {
    let why = why.replace(['\r', '\n'], " ");
    let text = if as_json {
        serde_json::json!({"line": line, "outcome": "refused", "reason": why}).to_string()
    } else {
        format!("line {line}: refused: {why}")
    };
    writeln!(out, "{text}").map_err(Failure::Output)
}

/// Progress on stderr, while it is a terminal.
struct Progress {
    on: bool,
    total: Option<u64>,
}

impl Progress {
    fn new(total: Option<u64>) -> Self {
        Self {
            on: std::io::stderr().is_terminal(),
            total,
        }
    }

    fn show(&self, done: u64, read: u64, started: Instant) {
        if !self.on {
            return;
        }
        let elapsed = started.elapsed().as_secs_f64().max(1e-9);
        let rate = done as f64 / elapsed;
        let mut text = format!("\r{done} records, {rate:.0}/s");
        if let Some(total) = self.total.filter(|t| *t > 0) {
            let share = (read as f64 / total as f64).min(1.0);
            text.push_str(&format!(", {:.1}% of {total} bytes", share * 100.0));
            if share > 0.0 {
                let left = elapsed * (1.0 - share) / share;
                text.push_str(&format!(", ETA {}s", left.round()));
            }
        }
        text.push_str("   ");
        let _ = std::io::stderr().write_all(text.as_bytes());
    }

    fn clear(&self) {
        if self.on {
            let _ = std::io::stderr().write_all(b"\r\x1b[K");
        }
    }
}

/// Reads `reader` a line at a time (never more than [`MAX_LINE`] bytes of one),
/// sends each line's record or refusal to `lines`, counts the bytes in `read`.
fn read_lines(
    reader: Box<dyn Read + Send>,
    on_conflict: OnConflict,
    read: &AtomicU64,
    lines: &mpsc::Sender<Line>,
) {
    let mut reader = BufReader::with_capacity(64 * 1024, reader);
    let mut buf = Vec::with_capacity(1024);
    let mut number = 0u64;
    loop {
        let next = match next_line(&mut reader, &mut buf, read) {
            Ok(Some(next)) => next,
            Ok(None) => return,
            Err(e) => {
                number += 1;
                let _ = lines.blocking_send(Line::Refused(number, format!("cannot read: {e}")));
                return;
            }
        };
        number += 1;
        let line = match next {
            Read_::TooLong => Line::Refused(number, format!("longer than {MAX_LINE} bytes")),
            Read_::Line => {
                let text = trim_end(&buf);
                if text.iter().all(u8::is_ascii_whitespace) {
                    continue;
                }
                match record(text, number, on_conflict) {
                    Ok(record) => Line::Record(Box::new(record)),
                    Err(why) => Line::Refused(number, why),
                }
            }
        };
        if lines.blocking_send(line).is_err() {
            return;
        }
    }
}

enum Read_ {
    Line,
    TooLong,
}

/// The next line of `reader` in `buf` (without its `\n`), or that it was too long
/// (then `buf` holds nothing of it); `None` at the end.
fn next_line(
    reader: &mut impl BufRead,
    buf: &mut Vec<u8>,
    read: &AtomicU64,
) -> std::io::Result<Option<Read_>> {
    buf.clear();
    let mut too_long = false;
    let mut any = false;
    loop {
        let available = reader.fill_buf()?;
        if available.is_empty() {
            return Ok(any.then_some(if too_long {
                Read_::TooLong
            } else {
                Read_::Line
            }));
        }
        any = true;
        let (take, end) = match memchr::memchr(b'\n', available) {
            Some(at) => (at, true),
            None => (available.len(), false),
        };
        if !too_long {
            if buf.len() + take > MAX_LINE {
                too_long = true;
                buf.clear();
            } else {
                buf.extend_from_slice(&available[..take]);
            }
        }
        let consumed = take + usize::from(end);
        reader.consume(consumed);
        read.fetch_add(consumed as u64, Ordering::Relaxed);
        if end {
            return Ok(Some(if too_long {
                Read_::TooLong
            } else {
                Read_::Line
            }));
        }
    }
}

fn trim_end(line: &[u8]) -> &[u8] {
    match line.last() {
        Some(b'\r') => &line[..line.len() - 1],
        _ => line,
    }
}

/// The record of one JSON line, or why it is refused (never quoting the hash).
fn record(text: &[u8], line: u64, on_conflict: OnConflict) -> Result<ImportUsersRequest, String> {
    let value: serde_json::Value = serde_json::from_slice(text).map_err(|e| {
        if e.is_eof() {
            "malformed JSON: the line ends before the object does (truncated?)".to_owned()
        } else {
            format!("malformed JSON at column {}", e.column())
        }
    })?;
    let serde_json::Value::Object(fields) = value else {
        return Err("not a JSON object".into());
    };
    let text_field = |name: &str, required: bool| -> Result<String, String> {
        match fields.get(name) {
            Some(serde_json::Value::String(s)) => Ok(s.clone()),
            None | Some(serde_json::Value::Null) if !required => Ok(String::new()),
            None | Some(serde_json::Value::Null) => Err(format!("missing field {name}")),
            Some(_) => Err(format!("{name}: not a string")),
        }
    };
    let username = text_field("username", true)?;
    let password_hash = match fields.get("password_hash") {
        Some(serde_json::Value::String(s)) => s.clone(),
        Some(object @ serde_json::Value::Object(_)) => object.to_string(),
        None | Some(serde_json::Value::Null) => return Err("missing field password_hash".into()),
        Some(_) => return Err("password_hash: not a string or an object".into()),
    };
    let user_id = text_field("user_id", false)?;
    let created_at = match text_field("created_at", false)? {
        text if text.is_empty() => None,
        text => Some(rfc3339(&text).ok_or("created_at: not an RFC 3339 time")?),
    };
    let disabled = match fields.get("disabled") {
        None | Some(serde_json::Value::Null) => false,
        Some(serde_json::Value::Bool(b)) => *b,
        Some(_) => return Err("disabled: not true or false".into()),
    };
    let disabled_reason = text_field("disabled_reason", false)?;
    if password_hash.len() > MAX_HASH {
        return Err(format!("password_hash: longer than {MAX_HASH} bytes"));
    }
    let record = ImportUsersRequest {
        line,
        username,
        password_hash,
        user_id,
        created_at,
        disabled,
        disabled_reason,
        on_conflict: on_conflict as i32,
    };
    if prost::Message::encoded_len(&record) > MAX_RECORD {
        return Err(format!(
            "the record is larger than {MAX_RECORD} bytes (a username is at most 64 \
             characters, a hash {MAX_HASH} bytes)"
        ));
    }
    Ok(record)
}

/// An RFC 3339 time (`2024-01-02T03:04:05Z`, `…05.123+02:00`) as a Timestamp.
fn rfc3339(text: &str) -> Option<prost_types::Timestamp> {
    let (local, offset_s) = if let Some(local) = text.strip_suffix(['Z', 'z']) {
        (local, 0i64)
    } else {
        let at = text.len().checked_sub(6)?;
        let (local, offset) = (text.get(..at)?, text.get(at..)?);
        let sign = match offset.as_bytes()[0] {
            b'+' => 1,
            b'-' => -1,
            _ => return None,
        };
        let (h, m) = offset[1..].split_once(':')?;
        let (h, m): (i64, i64) = (h.parse().ok()?, m.parse().ok()?);
        if h > 23 || m > 59 {
            return None;
        }
        (local, sign * (h * 3600 + m * 60))
    };
    if local.len() < 19 || !matches!(local.as_bytes()[10], b'T' | b't') {
        return None;
    }
    let at = humantime::parse_rfc3339_weak(local).ok()?;
    let since = at.duration_since(UNIX_EPOCH).ok()?;
    let seconds = i64::try_from(since.as_secs()).ok()? - offset_s;
    Some(prost_types::Timestamp {
        seconds,
        nanos: i32::try_from(since.subsec_nanos()).ok()?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_are_read_with_their_offset() {
        let t = rfc3339("2024-01-02T03:04:05Z").unwrap();
        assert_eq!((t.seconds, t.nanos), (1_704_164_645, 0));
        let t = rfc3339("2024-01-02T05:04:05.250+02:00").unwrap();
        assert_eq!((t.seconds, t.nanos), (1_704_164_645, 250_000_000));
        for bad in [
            "2024-01-02",
            "yesterday",
            "2024-01-02T03:04:05+2",
            "2024-01-02 03:04:05Z",
        ] {
            assert!(rfc3339(bad).is_none(), "{bad}");
        }
    }

    #[test]
    fn a_line_is_parsed_or_refused_with_why() {
        let r = record(
            br#"{"username": "Ann", "password_hash": {"algorithm": "pbkdf2-sha256"}, "disabled": true}"#,
            3,
            OnConflict::Skip,
        )
        .unwrap();
        assert_eq!(r.password_hash, r#"{"algorithm":"pbkdf2-sha256"}"#);
        assert!(r.disabled && r.line == 3 && r.on_conflict == OnConflict::Skip as i32);
        let why = |text: &[u8]| record(text, 1, OnConflict::Fail).unwrap_err();
        assert!(why(br#"{"username": "ann", "password_hash": "$2b$"#).contains("truncated"));
        assert_eq!(why(br#"{"password_hash": "x"}"#), "missing field username");
        assert_eq!(
            why(br#"{"username": "ann"}"#),
            "missing field password_hash"
        );
        assert_eq!(why(b"[1]"), "not a JSON object");
        assert!(why(b"{nope}").starts_with("malformed JSON"));
        let long_hash = format!(
            r#"{{"username": "ann", "password_hash": "{}"}}"#,
            "x".repeat(5000)
        );
        assert_eq!(
            why(long_hash.as_bytes()),
            "password_hash: longer than 4096 bytes"
        );
        let long_name = format!(
            r#"{{"username": "{}", "password_hash": "x"}}"#,
            "a".repeat(9000)
        );
        assert!(why(long_name.as_bytes()).starts_with("the record is larger than"));
    }

    #[test]
    fn a_long_line_is_skipped_without_being_kept() {
        let mut text = vec![b'x'; MAX_LINE * 3];
        text.extend_from_slice(b"\nshort\nlast");
        let mut reader = BufReader::with_capacity(1024, &text[..]);
        let (mut buf, read) = (Vec::new(), AtomicU64::new(0));
        assert!(matches!(
            next_line(&mut reader, &mut buf, &read),
            Ok(Some(Read_::TooLong))
        ));
        assert!(buf.capacity() <= MAX_LINE + 1024);
        assert!(matches!(
            next_line(&mut reader, &mut buf, &read),
            Ok(Some(Read_::Line))
        ));
        assert_eq!(buf, b"short");
        assert!(matches!(
            next_line(&mut reader, &mut buf, &read),
            Ok(Some(Read_::Line))
        ));
        assert_eq!(buf, b"last");
        assert!(matches!(next_line(&mut reader, &mut buf, &read), Ok(None)));
        assert_eq!(read.load(Ordering::Relaxed), text.len() as u64);
    }
}
