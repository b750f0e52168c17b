//! The password blocklist through the server: common passwords (bundled, or from an
//! organization's file) and the username are refused at Register with
//! INVALID_ARGUMENT, before any hashing; `--password-blocklist=off`; a bad list file
//! stops the start with one line.

use crate::helpers::{
    TEST_KEY, TEST_KID, TestDb, authd_command, expect_code, key_spec, metric, spawn_app,
    spawn_app_on, spawn_app_with, violations,
};
use authd::config::Switch;
use std::io::Write as _;
use tonic::{Code, Status};

/// Asserts that `result` is INVALID_ARGUMENT with one violation, on the password,
/// described as `description`, and that the message does not show the password.
#[track_caller]
fn assert_refused<T: std::fmt::Debug>(
    result: Result<T, Status>,
    password: &str,
    description: &str,
) {
    let status = expect_code(result, Code::InvalidArgument);
    assert_eq!(
        violations(&status),
        [("password".to_owned(), description.to_owned())],
        "{password:?}"
    );
    assert!(!status.message().contains(password), "{status:?}");
}

fn list_file(lines: &str) -> tempfile::NamedTempFile {
    let mut file = tempfile::NamedTempFile::new().unwrap();
    file.write_all(lines.as_bytes()).unwrap();
    file
}

const STRONG: &str = "violet tractor at dawn";

#[tokio::test]
async fn bundled_common_passwords_are_refused_as_too_common_in_any_case_or_width() {
    let mut app = spawn_app().await;
    for common in [
        "password123",
        "qwertyuiop",
        // Listed only in lower case.
        "PassWord123",
        "QWERTYuiop",
        // Full-width forms: common once NFKC-normalized.
        "ｐａｓｓｗｏｒｄ１２３",
        "ＱＷＥＲＴＹＵＩＯＰ",
    ] {
        assert_refused(app.register("alice", common).await, common, "is too common");
    }
    let metrics = app.handle.render_metrics();
    assert_eq!(
        metric(
            &metrics,
            "authd_password_blocklist_refusals_total{reason=\"common\"}"
        ),
        Some(6.0)
    );
    // None of them made the user: the name is free, and a strong password takes it.
    app.register("alice", STRONG).await.unwrap();
    app.login("alice", STRONG).await.unwrap();
}

#[tokio::test]
async fn a_password_equal_to_the_username_is_refused_in_any_case_or_width() {
    let mut app = spawn_app().await;
    for same in ["zanzibar-42x", "ZANZIBAR-42x", "ｚａｎｚｉｂａｒ－４２ｘ"] {
        assert_refused(
            app.register("Zanzibar-42x", same).await,
            same,
            "must not be the username",
        );
    }
    assert_eq!(
        metric(
            &app.handle.render_metrics(),
            "authd_password_blocklist_refusals_total{reason=\"username\"}"
        ),
        Some(3.0)
    );
    // Containing the username is fine; being it is not.
    app.register("Zanzibar-42x", "zanzibar-42x and more")
        .await
        .unwrap();
}

#[tokio::test]
async fn logins_are_not_checked_against_the_list() {
    let db = TestDb::new(crate::helpers::Backend::Sqlite, "")
        .await
        .unwrap();
    // An account made while the list was off keeps working once it is on.
    let mut off = spawn_app_on(&db, |c| c.passwords.password_blocklist = Switch::Off).await;
    off.register("legacy", "password123").await.unwrap();
    off.stop().await.unwrap();
    let mut on = spawn_app_on(&db, |_| {}).await;
    on.login("legacy", "password123").await.unwrap();
    assert_refused(
        on.register("newcomer", "password123").await,
        "password123",
        "is too common",
    );
}

#[tokio::test]
async fn the_bundled_list_can_be_turned_off_but_the_username_rule_stays() {
    let mut app = spawn_app_with(|c| c.passwords.password_blocklist = Switch::Off).await;
    app.register("alice", "password123").await.unwrap();
    app.register("bob", "QWERTYuiop").await.unwrap();
    assert_refused(
        app.register("carol-1234", "Carol-1234").await,
        "Carol-1234",
        "must not be the username",
    );
}

#[tokio::test]
async fn an_organization_file_adds_passwords_with_or_without_the_bundled_list() {
    let file = list_file("Acme-Spring-2024\r\n\nＡＣＭＥ ｗｉｎｔｅｒ\nacme rocks forever\n");
    for bundled in [Switch::On, Switch::Off] {
        let path = file.path().to_owned();
        let mut app = spawn_app_with(move |c| {
            c.passwords.password_blocklist = bundled;
            c.passwords.password_blocklist_file = Some(path);
        })
        .await;
        for listed in [
            "acme-spring-2024",
            "ACME-SPRING-2024",
            "acme winter",
            "Acme Rocks Forever",
        ] {
            assert_refused(app.register("alice", listed).await, listed, "is too common");
        }
        // The bundled list is as configured, beside the file.
        let bundled_common = app.register("bob", "password123").await;
        match bundled {
            Switch::On => assert_refused(bundled_common, "password123", "is too common"),
            Switch::Off => {
                bundled_common.unwrap();
            }
        }
        // Near misses of the file's entries are fine.
        app.register("carol", "acme-spring-2025").await.unwrap();
        app.register("dave", "acme winter!").await.unwrap();
    }
}

async fn a_refused_registration_costs_no_hash_and_creates_no_user(db: TestDb) {
    let file = list_file("our-own-2024!\n");
    let path = file.path().to_owned();
    let mut app = spawn_app_on(&db, move |c| {
        c.passwords.password_blocklist_file = Some(path)
    })
    .await;
    let hashes = |app: &crate::helpers::TestApp| {
        let text = app.handle.render_metrics();
        (
            app.handle.hash_stats().completed,
            metric(&text, "authd_hash_duration_seconds_count"),
        )
    };
    let before = hashes(&app);
    for (password, why) in [
        ("password123", "is too common"),
        ("Our-Own-2024!", "is too common"),
        ("Mallory-99", "must not be the username"),
    ] {
        assert_refused(app.register("mallory-99", password).await, password, why);
    }
    assert_eq!(hashes(&app), before, "a refused password was hashed");
    assert_eq!(db.stored_hash("mallory-99").await, None);
    // The name is still free, and taking it costs one hash.
    app.register("mallory-99", STRONG).await.unwrap();
    assert_eq!(hashes(&app).0, before.0 + 1);
    assert!(db.stored_hash("mallory-99").await.is_some());
}

crate::backend_tests!(a_refused_registration_costs_no_hash_and_creates_no_user);

/// `authd` with a list file that cannot be used: exit 1, one line naming the option
/// and the path, and nothing opened (no database file created).
#[test]
fn a_bad_list_file_stops_the_start_with_one_line() {
    let dir = tempfile::tempdir().unwrap();
    let invalid = dir.path().join("latin1.txt");
    std::fs::write(&invalid, b"fine\nsch\xf6n\n").unwrap();
    let huge = dir.path().join("huge.txt");
    // Sparse: refused by its length, never read.
    std::fs::File::create(&huge)
        .unwrap()
        .set_len(64 * 1024 * 1024 + 1)
        .unwrap();
    let missing = dir.path().join("missing.txt");
    for (path, why) in [
        (&missing, "cannot read the file: "),
        (&dir.path().to_owned(), "cannot read the file: "),
        (&invalid, "not valid UTF-8 (line 2)"),
        (&huge, "larger than 64 MiB"),
    ] {
        let out = authd_command()
            .env("AUTHD_PASSWORD_BLOCKLIST_FILE", path)
            .env("AUTHD_TOKEN_KEYS", key_spec(TEST_KID, TEST_KEY))
            .env("AUTHD_LISTEN", "127.0.0.1:0")
            .env("AUTHD_METRICS_LISTEN", "")
            .current_dir(dir.path())
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(1), "{path:?}");
        let stderr = String::from_utf8(out.stderr).unwrap();
        assert_eq!(stderr.lines().count(), 1, "{stderr}");
        let expected = format!(
            "authd: error: --password-blocklist-file {}: {why}",
            path.display()
        );
        assert!(stderr.starts_with(&expected), "{stderr}");
        assert!(!stderr.contains("panicked"), "{stderr}");
        assert!(!dir.path().join("authd.db").exists(), "{path:?}");
    }

    let out = authd_command()
        .args(["--password-blocklist", "maybe"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8(out.stderr).unwrap();
    let first = stderr.lines().next().unwrap_or_default();
    assert!(
        first.starts_with("error: invalid value 'maybe' for '--password-blocklist"),
        "{stderr}"
    );
}

#[test]
fn help_documents_the_blocklist_options() {
    let out = authd_command().arg("--help").output().unwrap();
    assert!(out.status.success());
    let help = String::from_utf8(out.stdout).unwrap();
    for expected in [
        "--password-blocklist <PASSWORD_BLOCKLIST>",
        "env: AUTHD_PASSWORD_BLOCKLIST=",
        "[default: on]",
        "[possible values: on, off]",
        "--password-blocklist-file <PASSWORD_BLOCKLIST_FILE>",
        "env: AUTHD_PASSWORD_BLOCKLIST_FILE",
    ] {
        assert!(
            help.contains(expected),
            "--help lacks {expected:?}:\n{help}"
        );
    }
}
