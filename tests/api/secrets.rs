//! Secrets outside the log lines: `--help` with secret variables set, errors about
//! a malformed secret, the PostgreSQL and Redis URLs in the log (userinfo and query
//! passwords), the `*_FILE` forms end to end, and the warning for secrets given as
//! flags. Each runs the real binary.

use crate::{
    cli::spawn_authd,
    helpers::{
        PgSchema, TEST_KEY, TEST_KID, authd_command, key_spec, postgres_url, redis_url, unique_name,
    },
};
use std::process::Output;

/// A secret no output may contain.
const SECRET: &str = "s3cret-Zq9";
/// An account digest key (base64 of 39 bytes).
const DIGEST_KEY: &str = "ZGlnZXN0IGtleSBvZiBhdCBsZWFzdCB0aGlydHktdHdvIGJ5dGVz";

/// `url` with `user:SECRET@` as its userinfo (keeping the user if there is one).
fn with_password(url: &str, default_user: &str) -> String {
    let (scheme, rest) = url.split_once("://").expect("a URL");
    let (user, host) = match rest.split_once('@') {
        Some((userinfo, host)) => (userinfo.split(':').next().unwrap(), host),
        None => (default_user, rest),
    };
    format!("{scheme}://{user}:{SECRET}@{host}")
}

/// `url` with `name=value` added to its query.
fn with_parameter(url: &str, name: &str, value: &str) -> String {
    let separator = if url.contains('?') { '&' } else { '?' };
    format!("{url}{separator}{name}={value}")
}

/// Everything the process printed.
fn printed(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

#[test]
fn help_never_shows_the_values_of_secret_variables() {
    let key = key_spec(TEST_KID, TEST_KEY);
    let secrets = [
        (
            "AUTHD_DATABASE_URL",
            format!("postgres://authd:{SECRET}@db/authd"),
        ),
        ("AUTHD_REDIS_URL", format!("redis://:{SECRET}@cache:6379")),
        ("AUTHD_TOKEN_KEYS", key.clone()),
        ("AUTHD_ACCOUNT_DIGEST_KEY", DIGEST_KEY.to_owned()),
    ];
    for args in [&["--help"][..], &["migrate", "--help"], &["-h"]] {
        let out = authd_command()
            .args(args)
            .envs(secrets.iter().map(|(k, v)| (k, v)))
            .output()
            .unwrap();
        assert!(out.status.success(), "{args:?}");
        let help = printed(&out);
        for (var, _) in &secrets {
            assert!(help.contains(var), "{args:?}: {var} missing:\n{help}");
        }
        assert!(!help.contains(SECRET), "{args:?}:\n{help}");
        assert!(!help.contains(DIGEST_KEY), "{args:?}:\n{help}");
        assert!(
            !help.contains(&key[TEST_KID.len() + 1..]),
            "{args:?}:\n{help}"
        );
    }
    let help = printed(&authd_command().arg("--help").output().unwrap());
    for var in [
        "AUTHD_DATABASE_URL_FILE",
        "AUTHD_REDIS_URL_FILE",
        "AUTHD_TOKEN_KEYS_FILE",
        "AUTHD_ACCOUNT_DIGEST_KEY_FILE",
    ] {
        assert!(
            help.contains(&format!("env: {var}")),
            "{var} missing:\n{help}"
        );
    }
}

#[test]
fn a_malformed_secret_is_refused_in_one_line_that_does_not_show_it() {
    let dir = tempfile::tempdir().unwrap();
    let cases: [(&str, String, &str); 7] = [
        (
            "--database-url",
            format!("postgres://u:{SECRET}@127.0.0.1:notaport/x"),
            "invalid PostgreSQL URL",
        ),
        (
            "--database-url",
            format!("host=db password={SECRET}"),
            "not a URL",
        ),
        (
            "--database-url",
            format!("postgres://u@127.0.0.1/x?sslpassword={SECRET}"),
            "\"sslpassword\" is not supported",
        ),
        (
            "--redis-url",
            format!("http://:{SECRET}@cache"),
            "not a usable Redis URL",
        ),
        ("--token-keys", format!("k:{SECRET}!"), "not valid base64"),
        (
            "--account-digest-key",
            format!("{SECRET}!"),
            "not valid base64",
        ),
        (
            "--account-digest-key",
            "c2hvcnQ=".into(),
            "at least 32 bytes",
        ),
    ];
    for (option, value, why) in cases {
        let var = format!("AUTHD_{}", option[2..].replace('-', "_").to_uppercase());
        // As a flag and as its variable: the same refusal.
        for out in [
            authd_command()
                .args([option, &value])
                .current_dir(dir.path())
                .output(),
            authd_command()
                .env(&var, &value)
                .current_dir(dir.path())
                .output(),
        ] {
            let out = out.unwrap();
            assert_eq!(out.status.code(), Some(2), "{option} {value}");
            let all = printed(&out);
            let first = all.lines().next().unwrap_or_default();
            assert!(
                first.starts_with(&format!("error: invalid value for '{option}' ({var}): ")),
                "{first}"
            );
            assert!(first.contains(why), "{option}: {first}");
            assert!(!all.contains(SECRET), "{option} showed the secret:\n{all}");
        }
    }
}

#[tokio::test]
async fn migrate_logs_the_postgres_url_without_its_passwords_and_warns_about_the_flag() {
    let Some(base) = postgres_url("migrate_logs_the_postgres_url_without_its_passwords") else {
        return;
    };
    let schema = PgSchema::create(&base).await;
    // Trust authentication ignores the passwords, so this URL connects.
    let url = with_parameter(
        &with_parameter(&with_password(&base, "postgres"), "password", SECRET),
        "options[search_path]",
        &schema.name,
    );
    let out = authd_command()
        .args(["migrate", "--database-url", &url])
        .env("AUTHD_LOG_FORMAT", "json")
        .output()
        .unwrap();
    let all = printed(&out);
    assert!(out.status.success(), "{all}");
    assert!(!all.contains(SECRET), "a password was printed:\n{all}");
    let events: Vec<serde_json::Value> = all
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|_| panic!("not JSON: {l}")))
        .collect();
    let applied = events
        .iter()
        .find(|e| e["message"] == "migrations applied")
        .expect("migrate says it is done");
    let shown = applied["database"].as_str().unwrap();
    assert!(shown.contains(":***@"), "{shown}");
    assert!(shown.contains("password=***"), "{shown}");
    // The URL came as a flag, where `ps` shows it: one warning says so.
    let warnings: Vec<_> = events
        .iter()
        .filter(|e| e["level"] == "WARN" && e["options"] == "--database-url")
        .collect();
    assert_eq!(warnings.len(), 1, "{all}");
    assert!(
        warnings[0]["message"]
            .as_str()
            .unwrap()
            .contains("visible to every local user"),
        "{all}"
    );
    assert_users_table(&base, &schema.name).await;
}

async fn assert_users_table(base: &str, schema: &str) {
    use sqlx::Connection as _;
    let mut conn = sqlx::PgConnection::connect(base).await.unwrap();
    let users: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "SELECT count(*) FROM {schema}.users"
    )))
    .fetch_one(&mut conn)
    .await
    .expect("migrate created the users table in the schema");
    assert_eq!(users, 0);
}

#[tokio::test]
async fn the_file_forms_are_read_at_start_and_never_logged() {
    let (Some(pg), Some(redis)) = (
        postgres_url("the_file_forms_are_read_at_start_and_never_logged"),
        redis_url("the_file_forms_are_read_at_start_and_never_logged"),
    ) else {
        return;
    };
    let schema = PgSchema::create(&pg).await;
    let dir = tempfile::tempdir().unwrap();
    let database_url = with_parameter(
        &with_parameter(&with_password(&pg, "postgres"), "password", SECRET),
        "options[search_path]",
        &schema.name,
    );
    // Redis accepts any password for its `default` user when none is configured.
    let redis_url = with_password(&redis, "default");
    let db_file = dir.path().join("database-url");
    let redis_file = dir.path().join("redis-url");
    let keys_file = dir.path().join("token-keys");
    // Files as secret mounts write them: with a trailing newline, or more.
    std::fs::write(&db_file, format!("{database_url}\n")).unwrap();
    std::fs::write(&redis_file, format!("  {redis_url}\n\n")).unwrap();
    std::fs::write(&keys_file, key_spec(TEST_KID, TEST_KEY)).unwrap();

    let running = spawn_authd(
        dir.path(),
        &[
            ("AUTHD_DATABASE_URL_FILE", db_file.display().to_string()),
            ("AUTHD_REDIS_URL_FILE", redis_file.display().to_string()),
            ("AUTHD_TOKEN_KEYS_FILE", keys_file.display().to_string()),
            ("AUTHD_RATE_LIMITS", "*:global=1000/1s".into()),
            ("AUTHD_RATE_LIMIT_PREFIX", unique_name("authd_rl")),
            ("AUTHD_LOG", "debug".into()),
        ],
    );
    let (_client, token) = running.signed_in("olga", "a fine password").await;
    // Signed with the key from the file.
    assert_eq!(
        jsonwebtoken::decode_header(&token).unwrap().kid.as_deref(),
        Some(TEST_KID)
    );
    let (status, log) = running.terminate().await;
    assert!(status.success());
    let all = log.join("\n");
    assert!(!all.contains(SECRET), "a password was logged:\n{all}");
    let events: Vec<serde_json::Value> = log
        .iter()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let serving = events
        .iter()
        .find(|e| e["message"] == "authd is serving")
        .unwrap();
    let shown = serving["database"].as_str().unwrap();
    assert!(shown.starts_with("postgres://postgres:***@"), "{shown}");
    assert!(shown.contains("password=***"), "{shown}");
    let limiter = events
        .iter()
        .find(|e| e["message"] == "rate limits enforced globally through Redis")
        .unwrap_or_else(|| panic!("Redis from the file is used:\n{all}"));
    assert_eq!(limiter["redis"], redis_url.replace(SECRET, "***"));
    // Nothing came as a flag: no warning about one.
    assert!(!all.contains("visible to every local user"), "{all}");
    // The user went to the database of the file.
    use sqlx::Connection as _;
    let mut conn = sqlx::PgConnection::connect(&pg).await.unwrap();
    let users: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "SELECT count(*) FROM {}.users WHERE username = 'olga'",
        schema.name
    )))
    .fetch_one(&mut conn)
    .await
    .unwrap();
    assert_eq!(users, 1);
}

#[test]
fn a_missing_or_conflicting_secret_file_stops_the_start_with_one_line() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("nowhere").join("secret");
    for (var, option) in [
        ("AUTHD_DATABASE_URL_FILE", "--database-url-file"),
        ("AUTHD_REDIS_URL_FILE", "--redis-url-file"),
    ] {
        for command in [&[][..], &["migrate"]] {
            let out = authd_command()
                .args(command)
                .env(var, &missing)
                .env("AUTHD_LISTEN", "127.0.0.1:0")
                .env("AUTHD_METRICS_LISTEN", "")
                .current_dir(dir.path())
                .output()
                .unwrap();
            assert_eq!(out.status.code(), Some(1), "{var} {command:?}");
            let stderr = String::from_utf8(out.stderr).unwrap();
            let expected = format!(
                "authd: error: {option} {}: cannot read the file: ",
                missing.display()
            );
            assert_eq!(stderr.lines().count(), 1, "{stderr}");
            assert!(stderr.starts_with(&expected), "{stderr}");
        }
    }
    // A file that holds a bad URL: named, its content not shown.
    let bad = dir.path().join("bad-url");
    std::fs::write(&bad, format!("postgres://u:{SECRET}@db:notaport/x")).unwrap();
    let out = authd_command()
        .arg("migrate")
        .env("AUTHD_DATABASE_URL_FILE", &bad)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(
        stderr.starts_with(&format!(
            "authd: error: --database-url-file {}: invalid PostgreSQL URL",
            bad.display()
        )),
        "{stderr}"
    );
    assert!(!stderr.contains(SECRET), "{stderr}");
    // The direct form and the file form at once: refused, whichever way each came.
    let out = authd_command()
        .env("AUTHD_DATABASE_URL", "sqlite://x.db")
        .env("AUTHD_DATABASE_URL_FILE", &bad)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert!(stderr.starts_with("error: the argument"), "{stderr}");
    assert!(stderr.contains("cannot be used with"), "{stderr}");
}

#[test]
fn token_keys_given_as_a_flag_are_warned_about() {
    let dir = tempfile::tempdir().unwrap();
    let db = format!("sqlite://{}", dir.path().join("w.db").display());
    let key = key_spec(TEST_KID, TEST_KEY);
    let run = |args: &[&str], envs: &[(&str, &str)]| {
        let out = authd_command()
            .args(args)
            .envs(envs.iter().copied())
            .env("AUTHD_LOG_FORMAT", "json")
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", printed(&out));
        let all = printed(&out);
        let warned: Vec<serde_json::Value> = all
            .lines()
            .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
            .filter(|e| e["level"] == "WARN" && e["options"].is_string())
            .collect();
        (warned, all)
    };
    let (warned, all) = run(
        &["migrate", "--database-url", &db, "--token-keys", &key],
        &[],
    );
    assert_eq!(warned.len(), 1, "{all}");
    assert_eq!(warned[0]["options"], "--token-keys");
    assert_eq!(
        warned[0]["instead"],
        "AUTHD_TOKEN_KEYS or --token-keys-file"
    );
    assert!(!all.contains(&key[TEST_KID.len() + 1..]), "{all}");
    // The same from the environment: no warning.
    let (warned, all) = run(
        &["migrate"],
        &[("AUTHD_DATABASE_URL", &db), ("AUTHD_TOKEN_KEYS", &key)],
    );
    assert!(warned.is_empty(), "{all}");
}

#[test]
fn an_account_digest_key_given_as_a_flag_is_warned_about_and_never_printed() {
    let dir = tempfile::tempdir().unwrap();
    let db = format!("sqlite://{}", dir.path().join("d.db").display());
    let digest_key = DIGEST_KEY;
    let out = authd_command()
        .args(["migrate", "--database-url", &db])
        .args(["--account-digest-key", digest_key])
        .env("AUTHD_LOG_FORMAT", "json")
        .output()
        .unwrap();
    let all = printed(&out);
    assert!(out.status.success(), "{all}");
    let warned: Vec<serde_json::Value> = all
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .filter(|e| e["level"] == "WARN" && e["options"].is_string())
        .collect();
    assert_eq!(warned.len(), 1, "{all}");
    assert_eq!(warned[0]["options"], "--account-digest-key");
    assert_eq!(
        warned[0]["instead"],
        "AUTHD_ACCOUNT_DIGEST_KEY or --account-digest-key-file"
    );
    assert!(!all.contains(digest_key), "{all}");
}
