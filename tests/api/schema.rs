//! The schema under the compatibility contract, on both backends: migrations a newer
//! release applied are ignored, a schema that requires a newer release is refused
//! before anything is applied, and `authd migrate` says whether a rollback is safe.

use crate::helpers::{TestDb, authd_command, spawn_app_on, test_config};
use authd::config::DatabaseUrl;
use std::process::Output;

crate::backend_tests!(
    migrations_a_newer_release_applied_are_ignored,
    a_schema_that_requires_a_newer_release_is_refused_before_anything_is_applied,
    migrate_says_whether_a_rollback_is_safe_and_why,
);

fn url(db: &TestDb) -> String {
    match &db.url {
        DatabaseUrl::Sqlite(path) => format!("sqlite://{}", path.display()),
        DatabaseUrl::Postgres(url) => url.expose().to_owned(),
    }
}

/// `authd migrate ARGS…` on `db`.
fn migrate(db: &TestDb, args: &[&str]) -> Output {
    authd_command()
        .arg("migrate")
        .args(args)
        .env("AUTHD_DATABASE_URL", url(db))
        .output()
        .unwrap()
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// Records a compatible migration this release does not know, as a newer release
/// that applied one would have.
async fn newer_migration_applied(db: &TestDb) {
    db.execute(match db.url {
        DatabaseUrl::Sqlite(_) => {
            "INSERT INTO authd_migrations (version, description, success, checksum, \
             execution_time) VALUES (999, 'a newer release''s table', TRUE, X'00', 0)"
        }
        DatabaseUrl::Postgres(_) => {
            "INSERT INTO authd_migrations (version, description, success, checksum, \
             execution_time) VALUES (999, 'a newer release''s table', TRUE, '\\x00', 0)"
        }
    })
    .await;
}

async fn migrations_a_newer_release_applied_are_ignored(db: TestDb) {
    let mut app = spawn_app_on(&db, |_| ()).await;
    app.register("before", "a fine password").await.unwrap();
    app.stop().await.unwrap();
    newer_migration_applied(&db).await;
    // This release starts on it, and serves what it knows.
    let mut app = spawn_app_on(&db, |_| ()).await;
    app.login("before", "a fine password").await.unwrap();
    app.stop().await.unwrap();
    let status = migrate(&db, &["--status"]);
    assert!(status.status.success(), "{}", text(&status));
    let status = text(&status);
    assert!(
        status.contains("newer than this binary knows: [999]"),
        "{status}"
    );
    assert!(status.contains("requires level: 0"), "{status}");
}

async fn a_schema_that_requires_a_newer_release_is_refused_before_anything_is_applied(db: TestDb) {
    let app = spawn_app_on(&db, |_| ()).await;
    app.stop().await.unwrap();
    // A contract migration of a release far ahead: what this one reads is gone.
    db.execute("UPDATE authd_schema SET requires_level = 1000")
        .await;
    let err = authd::app::Application::build(test_config(db.url.clone()))
        .await
        .err()
        .expect("the start is refused");
    let err = format!("{err:#}");
    assert!(err.contains("requires level 1000"), "{err}");
    assert!(err.contains("docs/upgrades.md"), "{err}");
    // `authd migrate` refuses alike, and applies nothing: the level is as it was.
    let out = migrate(&db, &[]);
    assert!(!out.status.success());
    assert!(text(&out).contains("requires level 1000"), "{}", text(&out));
    let status = text(&migrate(&db, &["--status"]));
    assert!(status.contains("requires level: 1000"), "{status}");
}

async fn migrate_says_whether_a_rollback_is_safe_and_why(db: TestDb) {
    let app = spawn_app_on(&db, |_| ()).await;
    app.stop().await.unwrap();
    // Every release so far runs on what this one migrated.
    let out = migrate(&db, &["--check-rollback", "0.1.0"]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(
        text(&out).starts_with("safe: authd 0.1.0"),
        "{}",
        text(&out)
    );
    // Not once a step the previous release cannot run on is applied.
    db.execute("UPDATE authd_schema SET requires_level = 1")
        .await;
    let out = migrate(&db, &["--check-rollback", "0.1.0"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let answer = text(&out);
    assert!(
        answer.starts_with("unsafe: the schema requires level 1"),
        "{answer}"
    );
    assert!(answer.contains("authd 0.1.0 knows level 0"), "{answer}");
    // A release it does not know is named as such, with the ones it knows.
    let out = migrate(&db, &["--check-rollback", "0.0.7"]);
    assert!(!out.status.success());
    assert!(text(&out).contains("it knows 0.1.0, "), "{}", text(&out));
}
