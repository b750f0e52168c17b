//! What `authd admin` prints on stdout: for people, a table or a few lines; with
//! `--json`, one JSON document (pretty-printed) whose fields are named as in
//! admin.proto, with times in RFC 3339 (UTC, always three digits of milliseconds)
//! and `null` for what is not set.
//!
//! Text from the server that a person reads (a disable reason, a client address) is
//! printed with control characters escaped, so an answer cannot drive the terminal.

use crate::pb::admin::{Session, User};
use prost_types::Timestamp;
use serde::Serialize;

/// A user as JSON.
#[derive(Serialize)]
struct UserJson<'a> {
    id: &'a str,
    username: &'a str,
    created_at: Option<String>,
    updated_at: Option<String>,
    disabled: bool,
    disabled_at: Option<String>,
    disabled_reason: Option<&'a str>,
    live_sessions: u32,
    last_login_at: Option<String>,
}

impl<'a> From<&'a User> for UserJson<'a> {
    fn from(user: &'a User) -> Self {
        Self {
            id: &user.id,
            username: &user.username,
            created_at: rfc3339(user.created_at.as_ref()),
            updated_at: rfc3339(user.updated_at.as_ref()),
            disabled: user.disabled,
            disabled_at: rfc3339(user.disabled_at.as_ref()),
            disabled_reason: non_empty(&user.disabled_reason),
            live_sessions: user.live_sessions,
            last_login_at: rfc3339(user.last_login_at.as_ref()),
        }
    }
}

/// A session as JSON.
#[derive(Serialize)]
struct SessionJson<'a> {
    id: &'a str,
    started_at: Option<String>,
    refreshed_at: Option<String>,
    expires_at: Option<String>,
    client_address: Option<&'a str>,
}

impl<'a> From<&'a Session> for SessionJson<'a> {
    fn from(session: &'a Session) -> Self {
        Self {
            id: &session.id,
            started_at: rfc3339(session.started_at.as_ref()),
            refreshed_at: rfc3339(session.refreshed_at.as_ref()),
            expires_at: rfc3339(session.expires_at.as_ref()),
            client_address: non_empty(&session.client_address),
        }
    }
}

fn non_empty(text: &str) -> Option<&str> {
    (!text.is_empty()).then_some(text)
}

/// One JSON document and a line end.
fn json(value: &impl Serialize) -> String {
    let mut text = serde_json::to_string_pretty(value).expect("plain data encodes");
    text.push('\n');
    text
}

/// A time for JSON: RFC 3339 in UTC, always with three digits of milliseconds
/// (what the server stores), so that times of one width sort as text.
pub(super) fn rfc3339(at: Option<&Timestamp>) -> Option<String> {
    let mut at = *at?;
    at.normalize();
    let millis = at.nanos / 1_000_000;
    at.nanos = 0;
    // `…T09:12:44Z`: the seconds, then the milliseconds before the `Z`.
    let seconds = at.to_string();
    let seconds = seconds.strip_suffix('Z').unwrap_or(&seconds);
    Some(format!("{seconds}.{millis:03}Z"))
}

/// A time for people: RFC 3339 in UTC, to the second; `-` when not set.
fn when(at: Option<&Timestamp>) -> String {
    match at {
        Some(at) => {
            let mut at = *at;
            at.normalize();
            at.nanos = 0;
            at.to_string()
        }
        None => "-".into(),
    }
}

/// `text` with control characters escaped (`\n`, `\u{1b}`), for a terminal.
fn printable(text: &str) -> String {
    text.chars()
        .map(|c| {
            if c.is_control() {
                c.escape_default().to_string()
            } else {
                c.to_string()
            }
        })
        .collect()
}

/// `1 session`, `2 sessions`.
fn sessions(n: u32) -> String {
    if n == 1 {
        "1 session".into()
    } else {
        format!("{n} sessions")
    }
}

/// Columns padded to their widest cell, two spaces apart; the last one unpadded.
fn table(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    let header: Vec<String> = header.iter().map(|h| (*h).to_owned()).collect();
    for row in std::iter::once(&header).chain(rows) {
        let last = row.len().saturating_sub(1);
        for (i, cell) in row.iter().enumerate() {
            if i == last {
                out.push_str(cell);
            } else {
                let pad = widths[i] - cell.chars().count();
                out.push_str(cell);
                out.push_str(&" ".repeat(pad + 2));
            }
        }
        out.push('\n');
    }
    out
}

/// `alice (0190…)`.
fn named(user: &User) -> String {
    format!("{} ({})", printable(&user.username), printable(&user.id))
}

/// `users list`: the users of one page or of every page; `next_page_token` is empty
/// after the last page.
pub(super) fn users(users: &[User], next_page_token: &str, as_json: bool) -> String {
    if as_json {
        #[derive(Serialize)]
        struct Page<'a> {
            users: Vec<UserJson<'a>>,
            next_page_token: Option<&'a str>,
        }
        return json(&Page {
            users: users.iter().map(UserJson::from).collect(),
            next_page_token: non_empty(next_page_token),
        });
    }
    let rows: Vec<Vec<String>> = users
        .iter()
        .map(|u| {
            vec![
                printable(&u.username),
                printable(&u.id),
                if u.disabled { "yes" } else { "no" }.to_owned(),
                u.live_sessions.to_string(),
                when(u.created_at.as_ref()),
                when(u.last_login_at.as_ref()),
            ]
        })
        .collect();
    table(
        &[
            "USERNAME",
            "ID",
            "DISABLED",
            "LIVE SESSIONS",
            "CREATED",
            "LAST LOGIN",
        ],
        &rows,
    )
}

/// `users get`: one user, a field a line.
pub(super) fn user(user: &User, as_json: bool) -> String {
    if as_json {
        #[derive(Serialize)]
        struct Answer<'a> {
            user: UserJson<'a>,
        }
        return json(&Answer { user: user.into() });
    }
    let mut fields = vec![
        ("username", printable(&user.username)),
        ("id", printable(&user.id)),
        ("created", when(user.created_at.as_ref())),
        ("updated", when(user.updated_at.as_ref())),
        (
            "disabled",
            if user.disabled { "yes" } else { "no" }.to_owned(),
        ),
    ];
    if user.disabled {
        fields.push(("disabled at", when(user.disabled_at.as_ref())));
        fields.push(("reason", printable(&user.disabled_reason)));
    }
    fields.push(("live sessions", user.live_sessions.to_string()));
    fields.push(("last login", when(user.last_login_at.as_ref())));
    let width = fields.iter().map(|(name, _)| name.len()).max().unwrap_or(0);
    fields
        .iter()
        .map(|(name, value)| format!("{name:width$}  {value}\n"))
        .collect()
}

/// `users disable`.
pub(super) fn disabled(user: &User, changed: bool, sessions_ended: u32, as_json: bool) -> String {
    if as_json {
        #[derive(Serialize)]
        struct Answer<'a> {
            user: UserJson<'a>,
            changed: bool,
            sessions_ended: u32,
        }
        return json(&Answer {
            user: user.into(),
            changed,
            sessions_ended,
        });
    }
    if changed {
        format!(
            "disabled {}; {} ended\n",
            named(user),
            sessions(sessions_ended)
        )
    } else {
        format!(
            "{} was already disabled (at {}: {}); nothing changed\n",
            named(user),
            when(user.disabled_at.as_ref()),
            printable(&user.disabled_reason)
        )
    }
}

/// `users enable`.
pub(super) fn enabled(user: &User, changed: bool, as_json: bool) -> String {
    if as_json {
        #[derive(Serialize)]
        struct Answer<'a> {
            user: UserJson<'a>,
            changed: bool,
        }
        return json(&Answer {
            user: user.into(),
            changed,
        });
    }
    if changed {
        format!("enabled {}\n", named(user))
    } else {
        format!("{} was not disabled; nothing changed\n", named(user))
    }
}

/// `users remove-second-factors`.
pub(super) fn second_factors_removed(user: &User, changed: bool, as_json: bool) -> String {
    if as_json {
        #[derive(Serialize)]
        struct Answer<'a> {
            user: UserJson<'a>,
            changed: bool,
        }
        return json(&Answer {
            user: user.into(),
            changed,
        });
    }
    if changed {
        format!(
            "removed the second factors of {}
",
            named(user)
        )
    } else {
        format!(
            "{} had no second factor; nothing changed
",
            named(user)
        )
    }
}

/// `users delete`.
pub(super) fn deleted(user: &User, sessions_ended: u32, as_json: bool) -> String {
    if as_json {
        #[derive(Serialize)]
        struct Answer<'a> {
            user: UserJson<'a>,
            sessions_ended: u32,
        }
        return json(&Answer {
            user: user.into(),
            sessions_ended,
        });
    }
    // The sessions stored for it, ended ones included, went with it.
    format!(
        "deleted {} with {}\n",
        named(user),
        sessions(sessions_ended)
    )
}

/// `sessions list`.
pub(super) fn session_list(list: &[Session], as_json: bool) -> String {
    if as_json {
        #[derive(Serialize)]
        struct Answer<'a> {
            sessions: Vec<SessionJson<'a>>,
        }
        return json(&Answer {
            sessions: list.iter().map(SessionJson::from).collect(),
        });
    }
    let rows: Vec<Vec<String>> = list
        .iter()
        .map(|s| {
            vec![
                printable(&s.id),
                when(s.started_at.as_ref()),
                when(s.refreshed_at.as_ref()),
                when(s.expires_at.as_ref()),
                non_empty(&s.client_address).map_or_else(|| "-".into(), printable),
            ]
        })
        .collect();
    table(&["ID", "STARTED", "REFRESHED", "EXPIRES", "CLIENT"], &rows)
}

/// The answer of `sessions end` and `set-password`: how many sessions ended.
#[derive(Serialize)]
struct Ended {
    sessions_ended: u32,
}

/// `sessions end`.
pub(super) fn sessions_ended(target: &str, sessions_ended: u32, as_json: bool) -> String {
    if as_json {
        return json(&Ended { sessions_ended });
    }
    format!(
        "{} of {} ended\n",
        sessions(sessions_ended),
        printable(target)
    )
}

/// `set-password`.
pub(super) fn password_set(target: &str, sessions_ended: u32, kept: bool, as_json: bool) -> String {
    if as_json {
        return json(&Ended { sessions_ended });
    }
    let target = printable(target);
    if kept {
        format!("password of {target} set; its sessions were kept\n")
    } else {
        format!(
            "password of {target} set; {} ended\n",
            sessions(sessions_ended)
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(seconds: i64, nanos: i32) -> Option<Timestamp> {
        Some(Timestamp { seconds, nanos })
    }

    fn alice() -> User {
        User {
            id: "0190a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b".into(),
            username: "alice".into(),
            created_at: at(1_772_323_200, 123_456_789),
            updated_at: at(1_772_323_260, 0),
            disabled: false,
            disabled_at: None,
            disabled_reason: String::new(),
            live_sessions: 2,
            last_login_at: None,
        }
    }

    #[test]
    fn times_are_rfc3339_in_utc() {
        let t = at(1_772_323_200, 123_456_789);
        assert_eq!(
            rfc3339(t.as_ref()).as_deref(),
            Some("2026-03-01T00:00:00.123Z")
        );
        assert_eq!(
            rfc3339(at(1_772_323_200, 0).as_ref()).as_deref(),
            Some("2026-03-01T00:00:00.000Z")
        );
        assert_eq!(
            rfc3339(at(1_772_323_200, 7_000_000).as_ref()).as_deref(),
            Some("2026-03-01T00:00:00.007Z")
        );
        assert_eq!(when(t.as_ref()), "2026-03-01T00:00:00Z");
        assert_eq!(rfc3339(None), None);
        assert_eq!(when(None), "-");
    }

    #[test]
    fn a_table_lines_up_its_columns() {
        let mut bob = alice();
        bob.username = "bob-the-builder".into();
        bob.disabled = true;
        bob.last_login_at = at(1_772_409_600, 0);
        let text = users(&[alice(), bob], "", false);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 3);
        assert!(lines[0].starts_with("USERNAME         ID  "), "{text}");
        assert!(lines[1].starts_with("alice            0190a1b2-"), "{text}");
        let column = lines[0].find("DISABLED").unwrap();
        assert_eq!(&lines[1][column..column + 3], "no ");
        assert_eq!(&lines[2][column..column + 3], "yes");
        assert!(lines[1].ends_with("2026-03-01T00:00:00Z  -"), "{text}");
        assert!(lines[2].ends_with("2026-03-02T00:00:00Z"), "{text}");
        assert_eq!(
            users(&[], "", false),
            "USERNAME  ID  DISABLED  LIVE SESSIONS  CREATED  LAST LOGIN\n"
        );
    }

    #[test]
    fn json_names_fields_as_the_proto_does_and_says_null_for_unset() {
        let page: serde_json::Value =
            serde_json::from_str(&users(&[alice()], "dG9r", true)).unwrap();
        assert_eq!(page["next_page_token"], "dG9r");
        let user = &page["users"][0];
        assert_eq!(user["username"], "alice");
        assert_eq!(user["created_at"], "2026-03-01T00:00:00.123Z");
        assert_eq!(user["live_sessions"], 2);
        assert_eq!(user["disabled"], false);
        assert!(user["disabled_reason"].is_null() && user["last_login_at"].is_null());
        let last: serde_json::Value = serde_json::from_str(&users(&[], "", true)).unwrap();
        assert!(last["next_page_token"].is_null());
        assert_eq!(last["users"], serde_json::json!([]));

        let answer: serde_json::Value =
            serde_json::from_str(&disabled(&alice(), true, 2, true)).unwrap();
        assert_eq!(answer["changed"], true);
        assert_eq!(answer["sessions_ended"], 2);
        assert_eq!(answer["user"]["id"], alice().id);
        let ended: serde_json::Value =
            serde_json::from_str(&sessions_ended("alice", 1, true)).unwrap();
        assert_eq!(ended, serde_json::json!({"sessions_ended": 1}));
    }

    #[test]
    fn text_from_the_server_cannot_drive_the_terminal() {
        let mut user = alice();
        user.disabled = true;
        user.disabled_reason = "stolen\n\u{1b}[2Jlaptop".into();
        let text = self::user(&user, false);
        assert!(!text.contains('\u{1b}'), "{text}");
        assert!(
            text.contains("reason         stolen\\n\\u{1b}[2Jlaptop\n"),
            "{text}"
        );
        let session = Session {
            id: "s1".into(),
            started_at: at(1_772_323_200, 0),
            refreshed_at: None,
            expires_at: at(1_774_915_200, 0),
            client_address: String::new(),
        };
        let list = session_list(&[session], false);
        assert_eq!(
            list.lines().nth(1).unwrap(),
            "s1  2026-03-01T00:00:00Z  -          2026-03-31T00:00:00Z  -"
        );
    }

    #[test]
    fn lines_for_people_say_what_happened() {
        assert_eq!(
            disabled(&alice(), true, 1, false),
            "disabled alice (0190a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b); 1 session ended\n"
        );
        assert!(enabled(&alice(), false, false).ends_with("was not disabled; nothing changed\n"));
        assert_eq!(
            password_set("alice", 3, false, false),
            "password of alice set; 3 sessions ended\n"
        );
        assert_eq!(
            sessions_ended("alice", 0, false),
            "0 sessions of alice ended\n"
        );
    }
}
