//! The store's options: the database URL (or the file holding it), the pools'
//! size, the timeouts, and the SQLite writer's batch.
//!
//! [`DatabaseUrl`] parses and checks the URL (a PostgreSQL URL's parameters
//! included) without ever quoting it, since it may hold a password;
//! [`StoreConfig::settings`] builds the [`StoreSettings`] of the backend it names.
//! Opening the database is the store's job, not this file's.

use super::parse::{positive_duration, read_secret_file};
use crate::{
    secret::{self, SecretUrl},
    store::{PostgresSettings, SqliteSettings, StoreSettings},
};
use clap::Args;
use std::{fmt, path::PathBuf, str::FromStr, time::Duration};

/// Where users are stored, and the pools and timeouts of the connections.
#[derive(Debug, Clone, Args)]
pub struct StoreConfig {
    /// Database URL: sqlite://PATH (created if missing) or
    /// postgres://USER:PASSWORD@HOST:PORT/DB[?sslmode=require] (shared by replicas).
    #[arg(long, env = "AUTHD_DATABASE_URL", default_value = "sqlite://authd.db",
          hide_env_values = true, value_parser = secret::parser::<DatabaseUrl>(), global = true,
          display_order = 6)]
    pub database_url: DatabaseUrl,

    /// File holding the database URL (surrounding whitespace ignored), instead of
    /// --database-url: keeps its password out of `ps` and the environment. Read at start.
    #[arg(
        long,
        env = "AUTHD_DATABASE_URL_FILE",
        conflicts_with = "database_url",
        global = true,
        display_order = 7
    )]
    pub database_url_file: Option<PathBuf>,

    /// Connections in the database read pool.
    #[arg(long, env = "AUTHD_DB_MAX_CONNECTIONS", default_value_t = 8,
          value_parser = clap::value_parser!(u32).range(1..=1024), global = true,
          display_order = 8)]
    pub db_max_connections: u32,

    /// How long a query waits for a free connection before failing with UNAVAILABLE.
    #[arg(long, env = "AUTHD_DB_ACQUIRE_TIMEOUT", default_value = "5s",
          value_parser = positive_duration, global = true, display_order = 9)]
    pub db_acquire_timeout: Duration,

    /// Longest one database statement may run once it has a connection, then the
    /// request fails with UNAVAILABLE (PostgreSQL's statement_timeout; authd also gives
    /// up on its own shortly after, for a database that stopped answering). A store
    /// operation takes at most AUTHD_DB_ACQUIRE_TIMEOUT plus about twice this.
    #[arg(long, env = "AUTHD_DB_STATEMENT_TIMEOUT", default_value = "2s",
          value_parser = positive_duration, global = true, display_order = 10)]
    pub db_statement_timeout: Duration,

    /// Most registrations the SQLite writer commits in one transaction.
    #[arg(long, env = "AUTHD_SQLITE_MAX_BATCH", default_value_t = 256,
          value_parser = clap::value_parser!(u32).range(1..=10_000), global = true,
          display_order = 11)]
    pub sqlite_max_batch: u32,
}

impl StoreConfig {
    /// What the store needs to open the configured database.
    pub(crate) fn settings(&self) -> StoreSettings {
        match &self.database_url {
            DatabaseUrl::Sqlite(path) => StoreSettings::Sqlite(SqliteSettings {
                path: path.clone(),
                readers: self.db_max_connections,
                acquire_timeout: self.db_acquire_timeout,
                max_batch: self.sqlite_max_batch as usize,
                statement_timeout: self.db_statement_timeout,
            }),
            DatabaseUrl::Postgres(url) => StoreSettings::Postgres(PostgresSettings {
                url: url.expose().to_owned(),
                max_connections: self.db_max_connections,
                acquire_timeout: self.db_acquire_timeout,
                statement_timeout: self.db_statement_timeout,
            }),
        }
    }

    /// Reads the URL named by `--database-url-file`, if any, into `database_url`.
    pub(super) fn read_secret_file(&mut self) -> anyhow::Result<()> {
        if let Some(path) = &self.database_url_file {
            self.database_url = read_secret_file("--database-url-file", path)?;
        }
        Ok(())
    }
}

/// Where users are stored.
#[derive(Clone, PartialEq, Eq)]
pub enum DatabaseUrl {
    Sqlite(PathBuf),
    /// A `postgres://` URL, kept whole for sqlx (which reads `sslmode` and the
    /// other parameters from it); printed with its password hidden.
    Postgres(SecretUrl),
}

impl DatabaseUrl {
    /// Whether printing the URL hides anything (a PostgreSQL password).
    pub fn has_secret(&self) -> bool {
        match self {
            DatabaseUrl::Sqlite(_) => false,
            DatabaseUrl::Postgres(url) => url.has_secret(),
        }
    }
}

/// Connection parameters sqlx reads from a PostgreSQL URL; it logs any other one
/// with its value, at warn, when it connects.
const SQLX_POSTGRES_PARAMETERS: [&str; 17] = [
    "sslmode",
    "ssl-mode",
    "sslrootcert",
    "ssl-root-cert",
    "ssl-ca",
    "sslcert",
    "ssl-cert",
    "sslkey",
    "ssl-key",
    "statement-cache-capacity",
    "host",
    "hostaddr",
    "port",
    "dbname",
    "user",
    "password",
    "application_name",
];

/// Refuses a parameter that looks like a secret but that sqlx does not know (say,
/// libpq's `sslpassword`): sqlx would ignore it and log its value.
fn check_postgres_parameters(url: &str) -> Result<(), String> {
    let Some((_, query)) = url.split_once('?') else {
        return Ok(());
    };
    let query = query.split_once('#').map_or(query, |(q, _)| q);
    for name in query
        .split('&')
        .map(|pair| pair.split('=').next().unwrap_or(pair))
    {
        // Decoded as sqlx decodes it (form encoding: `+` is a space).
        let decoded = name.replace('+', " ");
        let decoded = percent_encoding::percent_decode_str(&decoded).decode_utf8_lossy();
        let known = SQLX_POSTGRES_PARAMETERS.contains(&decoded.as_ref())
            || decoded == "options"
            || decoded.starts_with("options[");
        if !known && secret::is_secret_parameter(name) {
            return Err(format!(
                "the PostgreSQL URL parameter {decoded:?} is not supported (only \
                 \"password\" is; any other would be ignored and logged with its value)"
            ));
        }
    }
    Ok(())
}

/// A URL scheme as RFC 3986 spells one; anything else before a `:` may be a secret.
fn is_scheme(s: &str) -> bool {
    s.len() <= 32
        && s.starts_with(|c: char| c.is_ascii_alphabetic())
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'))
}

impl FromStr for DatabaseUrl {
    type Err = String;

    /// Parses a database URL. The error never quotes the URL: it may hold a password.
    fn from_str(url: &str) -> Result<Self, Self::Err> {
        const NOT_A_URL: &str = "not a URL (expected sqlite://PATH or postgres://…)";
        let (scheme, rest) = url.split_once(':').ok_or(NOT_A_URL)?;
        if !is_scheme(scheme) {
            return Err(NOT_A_URL.into());
        }
        match scheme {
            "sqlite" => {
                let path = rest.strip_prefix("//").unwrap_or(rest);
                if path.is_empty() {
                    return Err("sqlite:// needs a file path, e.g. sqlite://authd.db".into());
                }
                if path.contains('?') {
                    return Err("sqlite URLs take no query parameters: authd sets its own".into());
                }
                if path == ":memory:" || path.starts_with("file::memory:") {
                    return Err(
                        "in-memory SQLite is not supported: authd needs a file it can share \
                         between its writer and readers"
                            .into(),
                    );
                }
                Ok(DatabaseUrl::Sqlite(PathBuf::from(path)))
            }
            "postgres" | "postgresql" => {
                // sqlx's errors name the part that is wrong, never the password.
                sqlx::postgres::PgConnectOptions::from_str(url)
                    .map_err(|e| format!("invalid PostgreSQL URL: {e}"))?;
                check_postgres_parameters(url)?;
                Ok(DatabaseUrl::Postgres(SecretUrl::new(url)))
            }
            other => Err(format!(
                "unsupported database URL scheme {other:?} (expected sqlite://PATH or postgres://…)"
            )),
        }
    }
}

impl fmt::Display for DatabaseUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DatabaseUrl::Sqlite(path) => write!(f, "sqlite://{}", path.display()),
            DatabaseUrl::Postgres(url) => fmt::Display::fmt(url, f),
        }
    }
}

impl fmt::Debug for DatabaseUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn database_urls() {
        assert_eq!(
            "sqlite:///var/lib/authd/users.db"
                .parse::<DatabaseUrl>()
                .unwrap(),
            DatabaseUrl::Sqlite("/var/lib/authd/users.db".into())
        );
        assert_eq!(
            "sqlite:data.db".parse::<DatabaseUrl>().unwrap(),
            DatabaseUrl::Sqlite("data.db".into())
        );
        let pg: DatabaseUrl = "postgres://authd:s3cret@db:5432/authd?sslmode=require"
            .parse()
            .unwrap();
        assert_eq!(
            pg.to_string(),
            "postgres://authd:***@db:5432/authd?sslmode=require"
        );
        assert!(!format!("{pg:?}").contains("s3cret"));
        let no_password: DatabaseUrl = "postgresql://authd@db/authd".parse().unwrap();
        assert_eq!(no_password.to_string(), "postgresql://authd@db/authd");
        assert!(
            "postgres://db/x?sslmode=sometimes"
                .parse::<DatabaseUrl>()
                .is_err()
        );
        for bad in [
            "authd.db",
            "sqlite://",
            "sqlite::memory:",
            "mysql://x/y",
            "sqlite://a.db?mode=ro",
        ] {
            assert!(bad.parse::<DatabaseUrl>().is_err(), "{bad:?}");
        }
    }

    #[test]
    fn database_url_errors_never_quote_the_url() {
        for bad in [
            "postgres://u:s3cret@db:notaport/x",
            "host=db password=s3cret",
            "s3cret",
            "user:s3cret@db/x",
            "postgres://u@db/x?sslpassword=s3cret",
            "postgres://u@db/x?Password=s3cret",
            "postgres://u@db/x?%73slpassword=s3cret",
        ] {
            let err = bad.parse::<DatabaseUrl>().unwrap_err();
            assert!(!err.contains("s3cret"), "{bad}: {err}");
        }
        // sqlx's own error quotes the sslmode value, which is not a secret: the URL's
        // password is not in it.
        let err = "postgres://u:hunter2@db/x?sslmode=maybe"
            .parse::<DatabaseUrl>()
            .unwrap_err();
        assert!(!err.contains("hunter2"), "{err}");
        let err = "postgres://u@db/x?sslpassword=s3cret"
            .parse::<DatabaseUrl>()
            .unwrap_err();
        assert!(
            err.contains(r#"parameter "sslpassword" is not supported"#),
            "{err}"
        );
        // The parameters sqlx reads are fine, the password among them.
        let url: DatabaseUrl = "postgres://u@db/x?password=s3cret&options[search_path]=a"
            .parse()
            .unwrap();
        assert!(url.has_secret());
        assert_eq!(
            url.to_string(),
            "postgres://u@db/x?password=***&options[search_path]=a"
        );
    }
}
