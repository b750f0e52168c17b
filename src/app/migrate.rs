//! The commands that open the configured database without serving: `authd
//! migrate`, its `--status` and its `--check-rollback` (which also counts the users
//! an older release could not log in: those with an imported hash).

use crate::{config::Config, store::Store};

/// Opens the configured store (migrating it) without serving: `authd migrate`.
pub async fn migrate(config: &Config) -> anyhow::Result<()> {
    Store::migrate(&config.store.settings()).await
}

/// The configured database's schema, read without changing it: `authd migrate
/// --status`.
pub async fn schema(config: &Config) -> anyhow::Result<crate::store::SchemaState> {
    Store::schema(&config.store.settings()).await
}

/// Whether a release can run on the configured database's schema, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RollbackVerdict {
    pub safe: bool,
    pub reason: String,
}

/// Whether authd `version` can run on the configured database's schema: `authd
/// migrate --check-rollback VERSION`. An unknown version is an error naming the
/// known ones.
pub async fn check_rollback(config: &Config, version: &str) -> anyhow::Result<RollbackVerdict> {
    use crate::store::RELEASES;
    let Some(release) = RELEASES.iter().find(|r| r.version == version).copied() else {
        let known: Vec<_> = RELEASES.iter().map(|r| r.version).collect();
        anyhow::bail!(
            "authd {version} is not a release this binary knows (it knows {})",
            known.join(", ")
        );
    };
    let state = schema(config).await?;
    if let Err(why) = state.runs(release) {
        return Ok(RollbackVerdict {
            safe: false,
            reason: format!("unsafe: {why}"),
        });
    }
    if release.level < crate::store::EXT_HASH_LEVEL {
        let imported = Store::ext_hash_users(&config.store.settings()).await?;
        if imported > 0 {
            return Ok(RollbackVerdict {
                safe: false,
                reason: format!(
                    "unsafe: {imported} users have a password hash authd {version} (schema \
                     level {}) cannot verify (imported, in users.password_hash_ext; \
                     docs/migration.md): under it their logins fail as with a wrong password \
                     until this release runs again or their password is set anew",
                    release.level
                ),
            });
        }
    }
    Ok(match state.runs(release) {
        Ok(()) => RollbackVerdict {
            safe: true,
            reason: format!(
                "safe: authd {version} (schema level {}) runs on this schema (it requires \
                 level {}); it ignores the newer compatible migrations",
                release.level, state.requires_level
            ),
        },
        Err(why) => RollbackVerdict {
            safe: false,
            reason: format!("unsafe: {why}"),
        },
    })
}
