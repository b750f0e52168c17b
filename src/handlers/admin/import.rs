//! ImportUsers: users brought in with the password hashes they already have
//! (docs/migration.md), one record a request message, one answer a record, in order.
//!
//! The stream is read into batches: at most [`MAX_BATCH`] records, or what has
//! arrived when the stream pauses. Each record is checked at the edge (the username
//! rules, the hash's format and its cost against the import caps, the id), a record
//! that names the same username or id as one before it in the batch is refused (the
//! first wins), and the rest are written in one transaction (`store::import`); then
//! the batch's answers go out. Answers wait in a channel of one batch: while the
//! client does not read them, no more records are read, so memory stays bounded by
//! a batch whatever the input's size, and the client is slowed by HTTP/2's flow
//! control. Nothing is hashed (parsing a hash is cheap), so an import never takes
//! the hash pool from logins; small batches keep SQLite's writer free for them, and
//! while logins are hashing the import pauses after each batch (`give_way`), so it
//! takes at most a fifth of the time from them.
//!
//! A reason names the problem (the format error, the username rule, the cap that a
//! cost is over) and never quotes the hash or its salt.

use super::{AdminApi, Needs, label};
use crate::{
    accounts::Accounts,
    audit::{Audit, Caller},
    credentials::Username,
    metrics::AdminMetrics,
    password::{
        foreign::{Caps, ForeignHash},
        stored,
    },
    pb::admin::{
        ImportUsersRequest, ImportUsersResponse, OnConflict, import_users_response::Outcome,
    },
    store::{ImportRecord, Imported},
};
use futures_util::FutureExt as _;
use std::{collections::HashMap, pin::Pin, sync::Arc};
use tokio::sync::mpsc;
use tonic::{Request, Response, Status, Streaming};

/// The most records written in one transaction.
pub const MAX_BATCH: usize = 500;
/// The longest user id kept.
pub const MAX_USER_ID: usize = 64;
/// The longest reason of a disabled import, in characters.
const MAX_REASON_CHARS: usize = 512;
/// The reason of an account imported disabled without one.
const DEFAULT_REASON: &str = "imported disabled";

/// The answers of ImportUsers, as tonic sends them.
pub type ImportStream =
    Pin<Box<dyn futures_util::Stream<Item = Result<ImportUsersResponse, Status>> + Send>>;

impl AdminApi {
    /// ImportUsers: admitted once for the stream (an `admin` key), then run on a task
    /// of its own that answers through a channel.
    pub(super) async fn import(
        &self,
        request: Request<Streaming<ImportUsersRequest>>,
    ) -> Result<Response<ImportStream>, Status> {
        let caller = self.caller(&request);
        let actor = match self.admit(&request, Needs::Change) {
            Ok(actor) => actor,
            Err(e) => {
                (self.audit).admin(&caller, None, RPC, None, label(&e));
                let status = e.to_status();
                self.metrics.request(RPC, status.code());
                return Err(status);
            }
        };
        let importer = Importer {
            accounts: self.accounts.clone(),
            caps: self.import_caps,
            metrics: self.metrics.clone(),
            audit: self.audit.clone(),
            caller,
            actor: actor.name,
        };
        let (answers, stream) = mpsc::channel(MAX_BATCH);
        tokio::spawn(importer.run(request.into_inner(), answers));
        Ok(Response::new(Box::pin(
            tokio_stream::wrappers::ReceiverStream::new(stream),
        )))
    }
}

const RPC: &str = "ImportUsers";

/// While logins hash, an import pauses this many times a batch's time after it.
const GIVE_WAY: u32 = 4;
/// The longest pause after a batch.
const MAX_PAUSE: std::time::Duration = std::time::Duration::from_millis(250);

/// What one import needs, owned by its task.
struct Importer {
    accounts: Arc<Accounts>,
    caps: Caps,
    metrics: AdminMetrics,
    audit: Audit,
    caller: Caller,
    actor: String,
}

type Answers = mpsc::Sender<Result<ImportUsersResponse, Status>>;

/// The records of one import by outcome.
#[derive(Default)]
struct Counts {
    created: u64,
    unchanged: u64,
    skipped: u64,
    refused: u64,
}

impl Importer {
    /// Lower priority than logins: while the hash pool has work (logins, registrations
    /// in flight), the import pauses after each batch for [`GIVE_WAY`] times what the
    /// batch took (at most [`MAX_PAUSE`]), so it takes no more than a fifth of the
    /// time from them; an import alone runs at full speed.
    async fn give_way(&self, took: std::time::Duration) {
        let pool = self.accounts.hasher().pool();
        if pool.queued() == 0 && pool.stats().running == 0 {
            return;
        }
        self.metrics.import_paused.inc();
        tokio::time::sleep((took * GIVE_WAY).min(MAX_PAUSE)).await;
    }

    async fn run(self, mut inbound: Streaming<ImportUsersRequest>, answers: Answers) {
        let mut counts = Counts::default();
        let end = loop {
            let first = match inbound.message().await {
                Ok(Some(record)) => record,
                Ok(None) => break Ok(()),
                Err(status) => break Err(status),
            };
            let mut batch = vec![first];
            let mut ended = None;
            // What has arrived already joins the batch; a pause ends it. The
            // stream keeps its own state, so a message not ready is read next time.
            while batch.len() < MAX_BATCH {
                match inbound.message().now_or_never() {
                    Some(Ok(Some(record))) => batch.push(record),
                    Some(Ok(None)) => {
                        ended = Some(Ok(()));
                        break;
                    }
                    Some(Err(status)) => {
                        ended = Some(Err(status));
                        break;
                    }
                    None => break,
                }
            }
            // The wall clock: the pause below is a share of real time, not a rule.
            let started = std::time::Instant::now();
            let (done, stop) = match self.batch(batch).await {
                Ok(done) => done,
                Err(status) => break Err(status),
            };
            self.give_way(started.elapsed()).await;
            let mut gone = false;
            for answer in done {
                counts.add(answer.outcome());
                if answers.send(Ok(answer)).await.is_err() {
                    gone = true;
                    break;
                }
            }
            if gone {
                break Err(Status::cancelled("the client went away"));
            }
            if let Some(status) = stop {
                break Err(status);
            }
            if let Some(end) = ended {
                break end;
            }
        };
        let code = match &end {
            Ok(()) => tonic::Code::Ok,
            Err(status) => status.code(),
        };
        if let Err(status) = end {
            let _ = answers.send(Err(status)).await;
        }
        self.metrics.request(RPC, code);
        for (outcome, n) in [
            ("created", counts.created),
            ("unchanged", counts.unchanged),
            ("skipped", counts.skipped),
            ("refused", counts.refused),
        ] {
            self.metrics.imported(outcome, n);
        }
        let outcome = match code {
            tonic::Code::Ok => "ok",
            code => crate::metrics::CODE_NAMES
                .get(code as usize)
                .copied()
                .unwrap_or("UNKNOWN"),
        };
        (self.audit).admin(&self.caller, Some(&self.actor), RPC, None, outcome);
        tracing::info!(
            created = counts.created,
            unchanged = counts.unchanged,
            skipped = counts.skipped,
            refused = counts.refused,
            outcome,
            "import finished"
        );
    }

    /// Checks and writes one batch: its answers in order, and the status that ends
    /// the stream when a conflict met ON_CONFLICT_FAIL.
    async fn batch(
        &self,
        batch: Vec<ImportUsersRequest>,
    ) -> Result<(Vec<ImportUsersResponse>, Option<Status>), Status> {
        let now = self.accounts.clock().millis();
        let iterations = self.accounts.hasher().iterations();
        let mut answers: Vec<ImportUsersResponse> = Vec::with_capacity(batch.len());
        // Index in `answers` and record, of each record that goes to the store.
        let mut written: Vec<(usize, ImportRecord, bool)> = Vec::new();
        let mut names: HashMap<String, u64> = HashMap::new();
        let mut ids: HashMap<String, u64> = HashMap::new();
        for request in batch {
            let line = request.line;
            let skip = request.on_conflict == OnConflict::Skip as i32;
            let checked = check(&request, &self.caps, now).and_then(|record| {
                if let Some(first) = names.get(record.username.as_str()) {
                    return Err(format!(
                        "duplicate: the username of line {first} (the first wins)"
                    ));
                }
                if let Some(first) = record.id_given.then(|| ids.get(&record.id)).flatten() {
                    return Err(format!(
                        "duplicate: the user_id of line {first} (the first wins)"
                    ));
                }
                Ok(record)
            });
            match checked {
                Ok(mut record) => {
                    names.insert(record.username.as_str().to_owned(), line);
                    if record.id_given {
                        ids.insert(record.id.clone(), line);
                    }
                    record.password_hash = stored::marker(iterations).map_err(|e| {
                        tracing::error!(error = format!("{e:#}"), "making a marker failed");
                        Status::internal("internal error")
                    })?;
                    written.push((answers.len(), record, skip));
                    answers.push(answer(line, Outcome::Unspecified, String::new(), ""));
                }
                Err(why) => answers.push(answer(line, Outcome::Refused, String::new(), &why)),
            }
        }
        if written.is_empty() {
            return Ok((answers, None));
        }
        let (places, rest): (Vec<(usize, bool)>, Vec<ImportRecord>) = written
            .into_iter()
            .map(|(at, record, skip)| ((at, skip), record))
            .unzip();
        let ids: Vec<String> = rest.iter().map(|r| r.id.clone()).collect();
        let outcomes = self.accounts.import_users(rest).await.map_err(|e| {
            if let crate::error::Error::Internal(cause) = &e {
                tracing::error!(rpc = RPC, error = format!("{cause:#}"), "import failed");
            }
            e.to_status()
        })?;
        let mut stop = None;
        for (((at, skip), id), outcome) in places.into_iter().zip(ids).zip(outcomes) {
            let a = &mut answers[at];
            match outcome {
                Imported::Created => {
                    a.outcome = Outcome::Created as i32;
                    a.user_id = id;
                }
                Imported::Unchanged => {
                    a.outcome = Outcome::Unchanged as i32;
                    a.reason = "imported before, with the same hash".into();
                    a.user_id = id;
                }
                Imported::Conflict {
                    existing_id,
                    by_username,
                } => {
                    let what = if by_username { "username" } else { "user_id" };
                    a.user_id = existing_id;
                    if skip {
                        a.outcome = Outcome::Skipped as i32;
                        a.reason = format!("a different user has this {what}");
                    } else {
                        a.outcome = Outcome::Refused as i32;
                        a.reason = format!(
                            "conflict: a different user has this {what} (on conflict: fail)"
                        );
                        if stop.is_none() {
                            stop = Some(Status::already_exists(format!(
                                "line {}: a different user has this {what}; the import stops \
                                 after this batch (on conflict: fail)",
                                a.line
                            )));
                        }
                    }
                }
            }
        }
        Ok((answers, stop))
    }
}

impl Counts {
    fn add(&mut self, outcome: Outcome) {
        match outcome {
            Outcome::Created => self.created += 1,
            Outcome::Unchanged => self.unchanged += 1,
            Outcome::Skipped => self.skipped += 1,
            Outcome::Refused | Outcome::Unspecified => self.refused += 1,
        }
    }
}

fn answer(line: u64, outcome: Outcome, user_id: String, reason: &str) -> ImportUsersResponse {
    ImportUsersResponse {
        line,
        outcome: outcome as i32,
        reason: reason.to_owned(),
        user_id,
    }
}

/// A record checked at the edge, with an empty marker (made by the caller); the
/// reason it is refused otherwise.
fn check(r: &ImportUsersRequest, caps: &Caps, now: i64) -> Result<ImportRecord, String> {
    let username = Username::parse(&r.username).map_err(|why| format!("username: {why}"))?;
    if r.password_hash.is_empty() {
        return Err("password_hash: missing".into());
    }
    ForeignHash::parse_with(&r.password_hash, caps).map_err(|e| format!("password_hash: {e}"))?;
    let (id, id_given) = if r.user_id.is_empty() {
        (crate::accounts::new_user_id(now), false)
    } else {
        if r.user_id.len() > MAX_USER_ID
            || !(r.user_id.bytes())
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-' | b':'))
        {
            return Err(format!(
                "user_id: 1 to {MAX_USER_ID} characters of A-Z a-z 0-9 . _ - :"
            ));
        }
        (r.user_id.clone(), true)
    };
    let created_at = match &r.created_at {
        None => now,
        Some(t) => {
            // From 1970 to the end of year 9999, whole milliseconds.
            if !(0..=253_402_300_799).contains(&t.seconds) || !(0..1_000_000_000).contains(&t.nanos)
            {
                return Err("created_at: not a time between 1970 and 9999".into());
            }
            t.seconds * 1000 + i64::from(t.nanos / 1_000_000)
        }
    };
    let disabled = if r.disabled {
        let reason = r.disabled_reason.trim();
        if reason.chars().count() > MAX_REASON_CHARS {
            return Err(format!(
                "disabled_reason: at most {MAX_REASON_CHARS} characters"
            ));
        }
        let reason = if reason.is_empty() {
            DEFAULT_REASON
        } else {
            reason
        };
        Some((now, reason.to_owned()))
    } else {
        None
    };
    Ok(ImportRecord {
        id,
        id_given,
        username,
        password_hash: String::new(),
        password_hash_ext: r.password_hash.clone(),
        created_at,
        disabled,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(username: &str, hash: &str) -> ImportUsersRequest {
        ImportUsersRequest {
            line: 7,
            username: username.into(),
            password_hash: hash.into(),
            ..Default::default()
        }
    }

    const BCRYPT_15: &str = "$2b$15$abcdefghijklmnopqrstuu5jz8q7Jm3MYGc7b4QZwS1Y5.6k0nP3a";

    #[test]
    fn a_record_is_refused_for_what_is_wrong_never_quoting_the_hash() {
        let caps = Caps::default();
        let why = check(&record("Alice", BCRYPT_15), &caps, 0).unwrap_err();
        assert!(
            why.starts_with("password_hash: bcrypt hash: bcrypt cost 15 is over the cap of 14"),
            "{why}"
        );
        assert!(!why.contains("abcdefghij"), "{why}");
        let why = check(&record("a", "$2b$04$x"), &caps, 0).unwrap_err();
        assert!(why.starts_with("username: "), "{why}");
        let why = check(&record("alice", "md5$x$y"), &caps, 0).unwrap_err();
        assert_eq!(
            why,
            "password_hash: not a password hash format authd can verify"
        );
        let why = check(&record("alice", ""), &caps, 0).unwrap_err();
        assert_eq!(why, "password_hash: missing");
        let mut bad_id = record(
            "alice",
            "$pbkdf2-sha256$i=1000,l=32$AKh4f+JN1Hz3qCVLeaF/SA$eHz5DaZ1OQ83rAhSufI9KXPNmC7a00/to0km3fxyPeA",
        );
        bad_id.user_id = "x y".into();
        assert!(
            check(&bad_id, &caps, 0)
                .unwrap_err()
                .starts_with("user_id: ")
        );
        bad_id.user_id = "0190a5b2-7c3e-7000-8000-000000000001".into();
        let ok = check(&bad_id, &caps, 5).unwrap();
        assert_eq!(
            (ok.username.as_str(), ok.id_given, ok.created_at),
            ("alice", true, 5)
        );
    }
}
