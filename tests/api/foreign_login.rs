//! Logging in with a hash another system made, and the rehash of the first login,
//! through the real server on both backends.
//!
//! An imported user is made as the import makes one: a user registered, then its
//! columns written behind authd's back in the same database, `password_hash` a
//! marker (a PBKDF2 hash no password matches) and `password_hash_ext` the foreign
//! hash as given (a structured form as its JSON text). The hashes are the records
//! of tests/fixtures/foreign-hashes, made by the reference implementations.
//!
//! - every record logs in with its password (as sent, whatever its length), is
//!   refused with the wrong one, and is stored as authd's own PBKDF2 hash after
//!   the first login, which the same password verifies again;
//! - the Login answer says when the password is below the rules;
//! - of 20 first logins at once, all succeed and one rehash is stored;
//! - a rehash whose write fails leaves the login successful and the old hash.

use crate::helpers::{
    FAST_ITERATIONS, TestApp, TestDb, connect_from, expect_code, metric, spawn_app_on, violations,
};
use authd::{
    Password,
    config::DatabaseUrl,
    pb::{ChangePasswordRequest, LoginRequest},
};
use sqlx::{Connection, PgConnection, SqliteConnection, sqlite::SqliteConnectOptions};
use tonic::Code;

/// A marker at the tests' cost: a PBKDF2-SHA256 hash of the marker salt
/// (`authd:hash-ext:1`) and an output no password gives.
pub(crate) fn marker() -> String {
    format!(
        "$pbkdf2-sha256$i={FAST_ITERATIONS},l=32$YXV0aGQ6aGFzaC1leHQ6MQ$BwgJCgsMDQ4PEBESExQVFhcYGRobHB0eHyAhIiMkJSY"
    )
}

/// One record of the fixtures.
pub(crate) struct Record {
    pub(crate) format: String,
    pub(crate) password: String,
    pub(crate) wrong: String,
    /// As stored in `password_hash_ext` (a structured form as its JSON text).
    pub(crate) hash: String,
}

pub(crate) fn records() -> Vec<Record> {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/foreign-hashes/foreign-hashes.jsonl");
    std::fs::read_to_string(path)
        .expect("the fixtures")
        .lines()
        .map(|line| {
            let record: serde_json::Value = serde_json::from_str(line).unwrap();
            let text = |key: &str| record[key].as_str().unwrap().to_owned();
            Record {
                format: text("format"),
                password: text("password"),
                wrong: text("wrong"),
                hash: match &record["hash"] {
                    serde_json::Value::String(hash) => hash.clone(),
                    object => object.to_string(),
                },
            }
        })
        .collect()
}

pub(crate) fn record(format: &str, password: &str) -> Record {
    records()
        .into_iter()
        .find(|r| r.format == format && r.password == password)
        .unwrap_or_else(|| panic!("no {format} fixture of {password:?}"))
}

/// Runs `statement` with text arguments (`None` is NULL) on the test's database,
/// behind authd's back; returns the rows it changed.
pub(crate) async fn run(db: &TestDb, statement: &str, args: &[Option<&str>]) -> u64 {
    macro_rules! on {
        ($conn:expr) => {{
            let mut conn = $conn;
            let mut query = sqlx::query(sqlx::AssertSqlSafe(statement.to_owned()));
            for arg in args {
                query = query.bind(*arg);
            }
            let changed = query.execute(&mut conn).await.expect("run the statement");
            conn.close().await.ok();
            changed.rows_affected()
        }};
    }
    match &db.url {
        DatabaseUrl::Sqlite(path) => {
            on!(
                SqliteConnection::connect_with(&SqliteConnectOptions::new().filename(path))
                    .await
                    .expect("open the database file")
            )
        }
        DatabaseUrl::Postgres(url) => {
            on!(PgConnection::connect(url.expose())
                .await
                .expect("connect to PostgreSQL"))
        }
    }
}

/// The scalar `statement` reads, with text arguments.
async fn read<T>(db: &TestDb, statement: &str, args: &[&str]) -> T
where
    T: Send + Unpin,
    T: for<'r> sqlx::Decode<'r, sqlx::Sqlite> + sqlx::Type<sqlx::Sqlite>,
    T: for<'r> sqlx::Decode<'r, sqlx::Postgres> + sqlx::Type<sqlx::Postgres>,
{
    macro_rules! on {
        ($conn:expr) => {{
            let mut conn = $conn;
            let mut query = sqlx::query_scalar::<_, T>(sqlx::AssertSqlSafe(statement.to_owned()));
            for arg in args {
                query = query.bind(*arg);
            }
            let value = query.fetch_one(&mut conn).await.expect("read the database");
            conn.close().await.ok();
            value
        }};
    }
    match &db.url {
        DatabaseUrl::Sqlite(path) => {
            let options = SqliteConnectOptions::new().filename(path).read_only(true);
            on!(SqliteConnection::connect_with(&options)
                .await
                .expect("open the database file"))
        }
        DatabaseUrl::Postgres(url) => {
            on!(PgConnection::connect(url.expose())
                .await
                .expect("connect to PostgreSQL"))
        }
    }
}

/// `username`'s two hash columns, as stored.
async fn columns(db: &TestDb, username: &str) -> (String, Option<String>) {
    let hash: String = read(
        db,
        "SELECT password_hash FROM users WHERE username = $1",
        &[username],
    )
    .await;
    let ext: Option<String> = read(
        db,
        "SELECT password_hash_ext FROM users WHERE username = $1",
        &[username],
    )
    .await;
    (hash, ext)
}

/// Registers `username`, then gives it `hash` as the import does: the marker in
/// `password_hash`, the foreign hash in `password_hash_ext`.
async fn import(app: &mut TestApp, db: &TestDb, username: &str, hash: &str) {
    app.register(username, "a placeholder password")
        .await
        .unwrap();
    let marker = marker();
    let changed = run(
        db,
        "UPDATE users SET password_hash = $1, password_hash_ext = $2 WHERE username = $3",
        &[Some(&marker), Some(hash), Some(username)],
    )
    .await;
    assert_eq!(changed, 1);
}

/// Whether `password` meets the rules of a new password.
fn meets_rules(password: &str) -> bool {
    Password::parse(password).is_ok()
}

/// authd's own hash at the tests' cost (not a marker), with the ext column gone.
fn assert_rehashed(columns: &(String, Option<String>), what: &str) {
    let (hash, ext) = columns;
    let prefix = format!("$pbkdf2-sha256$i={FAST_ITERATIONS},l=32$");
    assert!(hash.starts_with(&prefix), "{what}: {hash}");
    assert_ne!(hash, &marker(), "{what}");
    assert!(
        !hash.contains("$YXV0aGQ6aGFzaC1leHQ6MQ$"),
        "{what}: still a marker"
    );
    assert_eq!(ext, &None, "{what}");
}

fn rehashes(app: &TestApp, reason: &str, outcome: &str) -> f64 {
    let series =
        format!(r#"authd_password_rehashes_total{{outcome="{outcome}",reason="{reason}"}}"#);
    metric(&app.handle.render_metrics(), &series).unwrap_or(0.0)
}

async fn every_fixture_logs_in_as_sent_and_is_rehashed_on_its_first_login(db: TestDb) {
    // Many wrong passwords from one client, on purpose: the throttle has tests of
    // its own.
    let mut app = spawn_app_on(&db, |c| c.limits.login_failures = 0).await;
    let records = records();
    for (i, r) in records.iter().enumerate() {
        let (username, what) = (
            format!("imported-{i}"),
            format!("{} {:?}", r.format, r.password),
        );
        import(&mut app, &db, &username, &r.hash).await;
        let status = expect_code(app.login(&username, &r.wrong).await, Code::Unauthenticated);
        assert_eq!(status.message(), "invalid username or password", "{what}");
        assert_eq!(
            columns(&db, &username).await,
            (marker(), Some(r.hash.clone()))
        );
        let first = app.login(&username, &r.password).await;
        let first = first.unwrap_or_else(|e| panic!("{what}: {e:?}"));
        assert!(!first.access_token.is_empty(), "{what}");
        assert_eq!(
            first.password_change_recommended,
            !meets_rules(&r.password),
            "{what}"
        );
        assert_rehashed(&columns(&db, &username).await, &what);
        // The same password again, now against authd's hash of its NFKC form.
        let again = app.login(&username, &r.password).await;
        let again = again.unwrap_or_else(|e| panic!("{what}, after the rehash: {e:?}"));
        assert_eq!(
            again.password_change_recommended,
            first.password_change_recommended
        );
        app.validate(&again.access_token).await.unwrap();
    }
    let n = records.len() as f64;
    assert_eq!(rehashes(&app, "foreign_format", "stored"), n);
    assert_eq!(rehashes(&app, "foreign_format", "failed"), 0.0);
}

async fn a_short_password_logs_in_and_is_told_to_change(db: TestDb) {
    let mut app = spawn_app_on(&db, |_| {}).await;
    // 6 characters, a bcrypt hash; and a password that meets the rules.
    let short = record("bcrypt-2b", "abc123");
    let long = record("bcrypt-2b", "correct horse battery staple");
    import(&mut app, &db, "shorty", &short.hash).await;
    import(&mut app, &db, "longer", &long.hash).await;
    for _ in 0..2 {
        let answer = app.login("shorty", "abc123").await.unwrap();
        assert!(answer.password_change_recommended);
        let answer = app.login("longer", &long.password).await.unwrap();
        assert!(!answer.password_change_recommended);
    }
    // A registered user with a rules-compliant password: never set.
    app.register("regular", "a fine password").await.unwrap();
    let answer = app.login("regular", "a fine password").await.unwrap();
    assert!(!answer.password_change_recommended);
    // A short password is a wrong password for a user it is not (verified, then
    // refused as any): not a malformed request.
    let status = expect_code(app.login("regular", "abc123").await, Code::Unauthenticated);
    assert_eq!(status.message(), "invalid username or password");
    // Empty and oversized are still malformed.
    for bad in [String::new(), "x".repeat(1025)] {
        let status = expect_code(app.login("regular", &bad).await, Code::InvalidArgument);
        let fields: Vec<String> = violations(&status).into_iter().map(|(f, _)| f).collect();
        assert_eq!(fields, ["password"], "{status:?}");
    }
    // The short password is the current password of ChangePassword too; the new one
    // keeps the rules.
    let change = |current: &str, new: &str| ChangePasswordRequest {
        username: "shorty".into(),
        current_password: current.into(),
        new_password: new.into(),
    };
    let status = expect_code(
        app.client.change_password(change("abc123", "abc12")).await,
        Code::InvalidArgument,
    );
    let fields: Vec<String> = violations(&status).into_iter().map(|(f, _)| f).collect();
    assert_eq!(
        fields,
        ["new_password"],
        "the current password is not held to the rules"
    );
    app.client
        .change_password(change("abc123", "a longer password now"))
        .await
        .unwrap();
    let answer = app.login("shorty", "a longer password now").await.unwrap();
    assert!(!answer.password_change_recommended);
    expect_code(app.login("shorty", "abc123").await, Code::Unauthenticated);
}

async fn a_non_ascii_password_is_verified_as_sent_then_as_normalized(db: TestDb) {
    let mut app = spawn_app_on(&db, |_| {}).await;
    // Made of "cafe" + U+0301 and the ligature U+FB01 by a system that does not
    // normalize.
    let (sent, nfkc) = ("cafe\u{301} \u{FB01}ne", "caf\u{E9} fine");
    let r = record("django-pbkdf2-sha256", sent);
    import(&mut app, &db, "ligature", &r.hash).await;
    // Before the rehash, its NFKC form is another password.
    expect_code(app.login("ligature", nfkc).await, Code::Unauthenticated);
    app.login("ligature", sent).await.unwrap();
    assert_rehashed(&columns(&db, "ligature").await, "ligature");
    // After it, authd's rules: the password and its NFKC form are one.
    app.login("ligature", sent).await.unwrap();
    app.login("ligature", nfkc).await.unwrap();
}

async fn twenty_first_logins_at_once_all_succeed_and_rehash_once(db: TestDb) {
    let mut app = spawn_app_on(&db, |_| {}).await;
    let r = record("django-pbkdf2-sha256", "abc123");
    import(&mut app, &db, "racer", &r.hash).await;
    count_hash_writes(&db).await;
    // 10 streams on one connection, and 10 connections from addresses of their own.
    let mut clients = vec![app.client.clone(); 10];
    for i in 2..12u8 {
        clients.push(connect_from(app.addr, std::net::Ipv4Addr::new(127, 0, 0, i)).await);
    }
    let logins: Vec<_> = clients
        .into_iter()
        .map(|mut client| {
            tokio::spawn(async move {
                client
                    .login(LoginRequest {
                        username: "racer".into(),
                        password: "abc123".into(),
                    })
                    .await
            })
        })
        .collect();
    for login in logins {
        let answer = login.await.unwrap().expect("every first login succeeds");
        assert!(answer.into_inner().password_change_recommended);
    }
    assert_eq!(rehashes(&app, "foreign_format", "stored"), 1.0);
    assert_eq!(rehashes(&app, "foreign_format", "failed"), 0.0);
    let writes: i64 = read(&db, "SELECT COUNT(*) FROM hash_writes", &[]).await;
    assert_eq!(writes, 1, "the row changed once");
    assert_rehashed(&columns(&db, "racer").await, "racer");
    app.login("racer", "abc123").await.unwrap();
}

/// Counts every write of `password_hash` in a table `hash_writes`.
async fn count_hash_writes(db: &TestDb) {
    run(db, "CREATE TABLE hash_writes (id TEXT)", &[]).await;
    match db.url {
        DatabaseUrl::Sqlite(_) => {
            run(
                db,
                "CREATE TRIGGER count_hash_writes AFTER UPDATE OF password_hash ON users \
                 BEGIN INSERT INTO hash_writes VALUES (NEW.id); END",
                &[],
            )
            .await;
        }
        DatabaseUrl::Postgres(_) => {
            run(
                db,
                "CREATE FUNCTION count_hash_write() RETURNS trigger LANGUAGE plpgsql AS \
                 $$ BEGIN INSERT INTO hash_writes VALUES (NEW.id); RETURN NEW; END $$",
                &[],
            )
            .await;
            run(
                db,
                "CREATE TRIGGER count_hash_writes AFTER UPDATE OF password_hash ON users \
                 FOR EACH ROW EXECUTE FUNCTION count_hash_write()",
                &[],
            )
            .await;
        }
    }
}

/// Makes every write of `username`'s `password_hash` fail, in the database itself.
async fn refuse_hash_writes(db: &TestDb, username: &'static str) {
    match db.url {
        DatabaseUrl::Sqlite(_) => {
            let trigger = format!(
                "CREATE TRIGGER refuse_hash_writes BEFORE UPDATE OF password_hash ON users \
                 WHEN OLD.username = '{username}' BEGIN SELECT RAISE(ABORT, 'refused'); END"
            );
            run(db, &trigger, &[]).await;
        }
        DatabaseUrl::Postgres(_) => {
            run(
                db,
                "CREATE FUNCTION refuse_hash_write() RETURNS trigger LANGUAGE plpgsql AS \
                 $$ BEGIN RAISE EXCEPTION 'refused'; END $$",
                &[],
            )
            .await;
            let trigger = format!(
                "CREATE TRIGGER refuse_hash_writes BEFORE UPDATE OF password_hash ON users \
                 FOR EACH ROW WHEN (OLD.username = '{username}') EXECUTE FUNCTION refuse_hash_write()"
            );
            run(db, &trigger, &[]).await;
        }
    }
}

async fn a_rehash_whose_write_fails_keeps_the_login_and_the_old_hash(db: TestDb) {
    let mut app = spawn_app_on(&db, |_| {}).await;
    let r = record("bcrypt-2y", "abc123");
    import(&mut app, &db, "stuck", &r.hash).await;
    refuse_hash_writes(&db, "stuck").await;
    for _ in 0..2 {
        let answer = app.login("stuck", "abc123").await.unwrap();
        app.validate(&answer.access_token).await.unwrap();
        assert_eq!(
            columns(&db, "stuck").await,
            (marker(), Some(r.hash.clone()))
        );
    }
    assert_eq!(rehashes(&app, "foreign_format", "failed"), 2.0);
    assert_eq!(rehashes(&app, "foreign_format", "stored"), 0.0);
    // Others' writes are untouched: a user registered and logged in meanwhile.
    app.register("bystander", "a fine password").await.unwrap();
    app.login("bystander", "a fine password").await.unwrap();
    // Once the write goes through, the next login rehashes.
    let drop = match db.url {
        DatabaseUrl::Sqlite(_) => "DROP TRIGGER refuse_hash_writes",
        DatabaseUrl::Postgres(_) => "DROP TRIGGER refuse_hash_writes ON users",
    };
    run(&db, drop, &[]).await;
    app.login("stuck", "abc123").await.unwrap();
    assert_eq!(rehashes(&app, "foreign_format", "stored"), 1.0);
    assert_rehashed(&columns(&db, "stuck").await, "stuck");
}

crate::backend_tests!(
    every_fixture_logs_in_as_sent_and_is_rehashed_on_its_first_login,
    a_short_password_logs_in_and_is_told_to_change,
    a_non_ascii_password_is_verified_as_sent_then_as_normalized,
    twenty_first_logins_at_once_all_succeed_and_rehash_once,
    a_rehash_whose_write_fails_keeps_the_login_and_the_old_hash,
);
