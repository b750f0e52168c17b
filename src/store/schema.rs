//! The schema and its migrations, under the compatibility contract: a release and
//! the one before it run side by side on one database, and the one before can come
//! back after the newer one migrated it.
//!
//! Two ledgers, applied in this order:
//! - **the base** (`migrations/<backend>/*.sql`, recorded in sqlx's
//!   `_sqlx_migrations`): the migrations of the releases before the contract. It is
//!   frozen ([`BASE_VERSIONS`]): those releases refuse to start on a database whose
//!   ledger records a migration they do not know, so no migration is ever added to it.
//! - **the compatible migrations** (`migrations/<backend>/compatible/NNNN_*.sql`,
//!   recorded in `authd_migrations`): numbered 1, 2, 3… in the order they apply. A
//!   binary knows the ones up to its [`SCHEMA_LEVEL`] and ignores any newer one it
//!   finds applied, so a release keeps starting on a schema the next release
//!   migrated.
//!
//! What lets it ignore them is a promise the migrations keep: an expand migration
//! (a new table, a nullable column, an index) leaves every statement of the releases
//! before it working. A migration that breaks that promise (a contract step: dropping
//! or renaming what an older release still reads or writes) raises the schema's
//! required level (`authd_schema.requires_level`, in its own transaction) to the
//! first level whose binaries run without what it removes. A binary whose level is
//! below the required one refuses to start, saying which release it needs, before it
//! applies anything; the releases of the base know no levels, and run on every schema
//! whose required level is 0.
//!
//! [`RELEASES`] names each release and the level it knows, so `authd migrate` can
//! say whether rolling back to one is safe.

use anyhow::Context as _;
use sqlx::{
    PgConnection, SqliteConnection,
    migrate::{Migrate as _, Migrator},
};
use std::fmt;

/// The compatible migrations this binary knows: the highest version it carries.
pub const SCHEMA_LEVEL: i64 = 4;

/// The level whose releases read `users.password_hash_ext`: below it a user whose
/// hash is there (behind a marker) cannot log in.
pub const EXT_HASH_LEVEL: i64 = 2;

/// The table of the compatible migrations' ledger.
const LEDGER: &str = "authd_migrations";

/// The versions of the base ledger, frozen: the releases before the contract know
/// these and refuse a database that records any other.
pub const BASE_VERSIONS: [i64; 7] = [
    20261130000000,
    20261202000000,
    20261210000000,
    20261220000000,
    20261230000000,
    20270101000000,
    20270201000000,
];

/// A release and the schema level it knows (0: before the contract; it ignores the
/// compatible ledger and runs on any schema whose required level is 0).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Release {
    pub version: &'static str,
    pub level: i64,
}

/// Every release since the contract began, oldest first; a release adds itself here.
pub const RELEASES: [Release; 2] = [
    Release {
        version: "0.1.0",
        level: 0,
    },
    Release {
        version: env!("CARGO_PKG_VERSION"),
        level: SCHEMA_LEVEL,
    },
];

/// What a database's schema is, as read from its ledgers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SchemaState {
    /// Base migrations applied.
    pub base: Vec<i64>,
    /// Compatible migrations applied, by version.
    pub compatible: Vec<i64>,
    /// The lowest level a binary must know to run on this schema.
    pub requires_level: i64,
}

impl SchemaState {
    /// The highest compatible migration applied (0: none).
    pub fn level(&self) -> i64 {
        self.compatible.iter().copied().max().unwrap_or(0)
    }

    /// Whether `release` runs on this schema, and if not, why.
    pub fn runs(&self, release: Release) -> Result<(), String> {
        if release.level >= self.requires_level {
            return Ok(());
        }
        Err(format!(
            "the schema requires level {} (a contract migration removed what releases \
             below it read or write); authd {} knows level {}",
            self.requires_level, release.version, release.level
        ))
    }
}

impl fmt::Display for SchemaState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "base migrations: {} of {} applied",
            self.base.len(),
            BASE_VERSIONS.len()
        )?;
        let unknown: Vec<_> = (self.compatible.iter())
            .filter(|v| **v > SCHEMA_LEVEL)
            .collect();
        writeln!(
            f,
            "compatible migrations: level {} ({} applied{})",
            self.level(),
            self.compatible.len(),
            if unknown.is_empty() {
                String::new()
            } else {
                format!(", newer than this binary knows: {unknown:?}")
            }
        )?;
        writeln!(f, "requires level: {}", self.requires_level)?;
        for release in RELEASES {
            match self.runs(release) {
                Ok(()) => writeln!(
                    f,
                    "authd {} (level {}): runs on it",
                    release.version, release.level
                )?,
                Err(why) => writeln!(
                    f,
                    "authd {} (level {}): cannot: {why}",
                    release.version, release.level
                )?,
            }
        }
        Ok(())
    }
}

/// The refusal of a binary whose level is below what the schema requires.
fn too_old(state: &SchemaState) -> anyhow::Error {
    let needed = RELEASES
        .iter()
        .find(|r| r.level >= state.requires_level)
        .map_or_else(
            || format!("a release of level {} or later", state.requires_level),
            |r| format!("authd {} or later", r.version),
        );
    anyhow::anyhow!(
        "this database's schema requires level {} and authd {} knows level {}: a newer \
         release migrated it with a step this one cannot run on; run {needed} (see \
         docs/upgrades.md)",
        state.requires_level,
        env!("CARGO_PKG_VERSION"),
        SCHEMA_LEVEL
    )
}

fn compatible(mut migrator: Migrator) -> Migrator {
    migrator.dangerous_set_table_name(LEDGER);
    // A newer release's migrations: known to keep this one working, unless the
    // required level says otherwise (checked before anything is applied).
    migrator.set_ignore_missing(true);
    migrator
}

/// Brings an SQLite database's schema up to date, or refuses a schema this binary
/// cannot run on.
pub(super) async fn migrate_sqlite(conn: &mut SqliteConnection) -> anyhow::Result<()> {
    let before = sqlite_state(conn).await?;
    if before.runs(this_release()).is_err() {
        return Err(too_old(&before));
    }
    sqlx::migrate!("migrations/sqlite")
        .run(&mut *conn)
        .await
        .context("applying the base migrations")?;
    compatible(sqlx::migrate!("migrations/sqlite/compatible"))
        .run(&mut *conn)
        .await
        .context("applying the compatible migrations")?;
    Ok(())
}

/// Brings a PostgreSQL database's schema up to date, or refuses a schema this
/// binary cannot run on.
pub(super) async fn migrate_postgres(conn: &mut PgConnection) -> anyhow::Result<()> {
    let before = postgres_state(conn).await?;
    if before.runs(this_release()).is_err() {
        return Err(too_old(&before));
    }
    // sqlx holds an advisory lock while it migrates, so replicas starting together
    // take turns instead of racing.
    sqlx::migrate!("migrations/postgres")
        .run(&mut *conn)
        .await
        .context("applying the base migrations")?;
    compatible(sqlx::migrate!("migrations/postgres/compatible"))
        .run(&mut *conn)
        .await
        .context("applying the compatible migrations")?;
    Ok(())
}

/// This binary as a release.
fn this_release() -> Release {
    RELEASES[RELEASES.len() - 1]
}

/// The schema of an SQLite database, read without changing it.
pub(super) async fn sqlite_state(conn: &mut SqliteConnection) -> anyhow::Result<SchemaState> {
    let exists = |table: &'static str| {
        sqlx::query_scalar::<_, i64>(
            "SELECT COUNT(*) FROM sqlite_master WHERE type = 'table' AND name = ?",
        )
        .bind(table)
    };
    let mut state = SchemaState {
        base: Vec::new(),
        compatible: Vec::new(),
        requires_level: 0,
    };
    if exists("_sqlx_migrations").fetch_one(&mut *conn).await? > 0 {
        state.base = applied(conn.list_applied_migrations("_sqlx_migrations").await?);
    }
    if exists(LEDGER).fetch_one(&mut *conn).await? > 0 {
        state.compatible = applied(conn.list_applied_migrations(LEDGER).await?);
    }
    if exists("authd_schema").fetch_one(&mut *conn).await? > 0 {
        state.requires_level = sqlx::query_scalar(REQUIRED).fetch_one(&mut *conn).await?;
    }
    Ok(state)
}

/// The schema of a PostgreSQL database (in the connection's search path), read
/// without changing it.
pub(super) async fn postgres_state(conn: &mut PgConnection) -> anyhow::Result<SchemaState> {
    let exists = |table: &'static str| {
        sqlx::query_scalar::<_, bool>("SELECT to_regclass($1) IS NOT NULL").bind(table)
    };
    let mut state = SchemaState {
        base: Vec::new(),
        compatible: Vec::new(),
        requires_level: 0,
    };
    if exists("_sqlx_migrations").fetch_one(&mut *conn).await? {
        state.base = applied(conn.list_applied_migrations("_sqlx_migrations").await?);
    }
    if exists(LEDGER).fetch_one(&mut *conn).await? {
        state.compatible = applied(conn.list_applied_migrations(LEDGER).await?);
    }
    if exists("authd_schema").fetch_one(&mut *conn).await? {
        state.requires_level = sqlx::query_scalar(REQUIRED).fetch_one(&mut *conn).await?;
    }
    Ok(state)
}

/// What every marker holds after a `$`: the start of its salt in the PHC string's
/// B64, the 15 bytes both markers' salts share (`authd:hash-ext:`, 20 characters).
fn marker_needle() -> String {
    use base64::Engine as _;
    let salt = base64::engine::general_purpose::STANDARD_NO_PAD
        .encode(&crate::password::stored::MARKER_SALT[..15]);
    format!("${salt}")
}

/// Users whose password is in `password_hash_ext` (a marker in `password_hash`:
/// imported users who have not logged in since, and Argon2id users),
/// on SQLite; 0 when the schema has no such column yet.
pub(super) async fn sqlite_ext_users(conn: &mut SqliteConnection) -> anyhow::Result<i64> {
    let column: i64 = sqlx::query_scalar(
        "SELECT COUNT(*) FROM pragma_table_info('users') WHERE name = 'password_hash_ext'",
    )
    .fetch_one(&mut *conn)
    .await?;
    if column == 0 {
        return Ok(0);
    }
    Ok(sqlx::query_scalar(
        "SELECT COUNT(*) FROM users WHERE password_hash_ext IS NOT NULL \
         AND instr(password_hash, $1) > 0",
    )
    .bind(marker_needle())
    .fetch_one(&mut *conn)
    .await?)
}

/// [`sqlite_ext_users`] on PostgreSQL (in the connection's search path).
pub(super) async fn postgres_ext_users(conn: &mut PgConnection) -> anyhow::Result<i64> {
    let column: bool = sqlx::query_scalar(
        "SELECT EXISTS (SELECT 1 FROM information_schema.columns WHERE table_name = 'users' \
         AND column_name = 'password_hash_ext' AND table_schema = current_schema())",
    )
    .fetch_one(&mut *conn)
    .await?;
    if !column {
        return Ok(0);
    }
    Ok(sqlx::query_scalar(
        "SELECT COUNT(*) FROM users WHERE password_hash_ext IS NOT NULL \
         AND strpos(password_hash, $1) > 0",
    )
    .bind(marker_needle())
    .fetch_one(&mut *conn)
    .await?)
}

/// The required level, from the table the first compatible migration creates.
const REQUIRED: &str = "SELECT requires_level FROM authd_schema";

/// The versions of a ledger's applied migrations, in order.
fn applied(migrations: Vec<sqlx::migrate::AppliedMigration>) -> Vec<i64> {
    let mut versions: Vec<_> = migrations.into_iter().map(|m| m.version).collect();
    versions.sort_unstable();
    versions
}

#[cfg(test)]
mod tests {
    use super::*;

    fn versions(migrator: &Migrator) -> Vec<i64> {
        migrator.iter().map(|m| m.version).collect()
    }

    /// The names of a folder's migration files, sorted.
    fn files(dir: &str) -> Vec<String> {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(dir);
        let mut names: Vec<_> = std::fs::read_dir(&path)
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
            .map(|entry| entry.unwrap())
            .filter(|entry| entry.file_type().unwrap().is_file())
            .map(|entry| entry.file_name().into_string().unwrap())
            .collect();
        names.sort();
        names
    }

    #[test]
    fn every_marker_holds_the_needle_and_no_other_hash_does() {
        let marker = crate::password::stored::marker(1000).unwrap();
        assert!(marker.contains(&marker_needle()), "{marker}");
        let own = crate::password::stored::own_marker(1000).unwrap();
        assert!(own.contains(&marker_needle()), "{own}");
        assert!(!"$pbkdf2-sha256$i=1000,l=32$AKh4f+JN1Hz3qCVLeaF/SA$eHz5DaZ1OQ83rAhSufI9KXPNmC7a00/to0km3fxyPeA".contains(&marker_needle()));
    }

    #[test]
    fn the_base_ledger_is_frozen() {
        // A migration added to it would make every release before the contract
        // refuse to start on the database.
        for migrator in [
            sqlx::migrate!("migrations/sqlite"),
            sqlx::migrate!("migrations/postgres"),
        ] {
            assert_eq!(versions(&migrator), BASE_VERSIONS);
        }
    }

    #[test]
    fn compatible_migrations_are_numbered_in_order_and_the_same_on_both_backends() {
        let sqlite = files("migrations/sqlite/compatible");
        assert_eq!(sqlite, files("migrations/postgres/compatible"));
        for (i, name) in sqlite.iter().enumerate() {
            let number = i + 1;
            assert!(
                name.starts_with(&format!("{number:04}_")) && name.ends_with(".sql"),
                "migration {number} is named {name}: compatible migrations are NNNN_name.sql, \
                 numbered from 0001 in the order they apply, each after every existing one"
            );
        }
        for migrator in [
            compatible(sqlx::migrate!("migrations/sqlite/compatible")),
            compatible(sqlx::migrate!("migrations/postgres/compatible")),
        ] {
            let expected: Vec<i64> = (1..=SCHEMA_LEVEL).collect();
            assert_eq!(
                versions(&migrator),
                expected,
                "SCHEMA_LEVEL is the last one"
            );
            assert!(migrator.ignore_missing && migrator.table_name == LEDGER);
        }
    }

    #[test]
    fn every_release_is_named_once_in_order_and_this_one_last() {
        assert_eq!(
            RELEASES[0],
            Release {
                version: "0.1.0",
                level: 0
            }
        );
        assert_eq!(this_release().version, env!("CARGO_PKG_VERSION"));
        assert_eq!(this_release().level, SCHEMA_LEVEL);
        for pair in RELEASES.windows(2) {
            assert!(pair[0].level <= pair[1].level, "{pair:?}");
            assert_ne!(pair[0].version, pair[1].version);
        }
    }

    #[test]
    fn a_release_runs_on_a_schema_that_requires_its_level_or_less() {
        let state = |requires_level| SchemaState {
            base: BASE_VERSIONS.to_vec(),
            compatible: (1..=SCHEMA_LEVEL + 2).collect(),
            requires_level,
        };
        let old = RELEASES[0];
        assert_eq!(state(0).runs(old), Ok(()));
        let why = state(1).runs(old).unwrap_err();
        assert!(
            why.contains("requires level 1") && why.contains("authd 0.1.0 knows level 0"),
            "{why}"
        );
        assert_eq!(state(SCHEMA_LEVEL).runs(this_release()), Ok(()));
        let refusal = too_old(&state(SCHEMA_LEVEL + 1)).to_string();
        assert!(
            refusal.contains(&format!("requires level {}", SCHEMA_LEVEL + 1)),
            "{refusal}"
        );
        assert!(refusal.contains("docs/upgrades.md"), "{refusal}");
        let shown = state(0).to_string();
        assert!(
            shown.contains(&format!(
                "newer than this binary knows: [{}, {}]",
                SCHEMA_LEVEL + 1,
                SCHEMA_LEVEL + 2
            )),
            "{shown}"
        );
        assert!(
            shown.contains("authd 0.1.0 (level 0): runs on it"),
            "{shown}"
        );
    }
}
