//! Service accounts in the store (docs/service-accounts.md): the accounts, their
//! credentials, and the writes that change them.
//!
//! The reads ([`account`], [`page`], [`by_identity`]) run on either backend's
//! [`Conns`]; the writes ([`service_write`]) on a [`Conn`] inside the transaction
//! each backend holds. Each write decides its race in the database:
//! - creating an account inserts it and its credentials with `ON CONFLICT DO
//!   NOTHING`, so a taken name (or a certificate identity or external subject
//!   bound to another account) answers a conflict, never an error that would fail
//!   SQLite's whole batch;
//! - adding a secret first touches the account's row (PostgreSQL locks it for the
//!   transaction), then counts the secrets: two writers never both see one secret
//!   and each add a second and a third;
//! - disabling, deleting, and removing a credential write a cutoff into
//!   `user_cutoffs` (keyed by the account's id, or by the credential's id) in the
//!   same transaction: every replica's revocation poller reads it, and refuses the
//!   tokens issued before it.

use super::{
    admin::Change,
    db::{Conn, Conns, Row, Statement},
    error::StoreError,
    events::{NewEvent, kind},
};
use serde_json::json;

pub(super) mod sql {
    pub const CREDENTIALS_OF: &str = "SELECT id, kind, secret_digest, identity, issuer, \
         created_at FROM service_credentials WHERE account_id = $1 ORDER BY created_at, id";
    pub const INSERT_ACCOUNT: &str = "INSERT INTO service_accounts \
         (id, name, audiences, scopes, disabled_at, disabled_reason, created_at, updated_at) \
         VALUES ($1, $2, $3, $4, NULL, NULL, $5, $5) ON CONFLICT DO NOTHING";
    pub const INSERT_CREDENTIAL: &str = "INSERT INTO service_credentials \
         (id, account_id, kind, secret_digest, identity, issuer, created_at) \
         VALUES ($1, $2, $3, $4, $5, $6, $7) ON CONFLICT DO NOTHING";
    /// Touches the account (PostgreSQL: locks its row until the transaction ends).
    pub const TOUCH: &str = "UPDATE service_accounts SET updated_at = $1 WHERE id = $2";
    pub const COUNT_SECRETS: &str = "SELECT COUNT(*) FROM service_credentials \
         WHERE account_id = $1 AND kind = 'secret'";
    pub const DISABLE: &str = "UPDATE service_accounts SET disabled_at = $1, \
         disabled_reason = $2, updated_at = $1 WHERE id = $3 AND disabled_at IS NULL";
    pub const DELETE_CREDENTIALS: &str = "DELETE FROM service_credentials WHERE account_id = $1";
    pub const DELETE_ACCOUNT: &str = "DELETE FROM service_accounts WHERE id = $1";
    pub const REMOVE_CREDENTIAL: &str =
        "DELETE FROM service_credentials WHERE id = $1 AND account_id = $2";
    pub const BY_MTLS: &str =
        "SELECT account_id FROM service_credentials WHERE kind = 'mtls' AND identity = $1";
    pub const BY_JWT: &str = "SELECT account_id FROM service_credentials \
         WHERE kind = 'jwt' AND issuer = $1 AND identity = $2";
}

/// Which service account: by id or by name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ServiceKey {
    Id(String),
    Name(String),
}

/// What a credential is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CredentialKind {
    /// A client secret, kept as the hex SHA-256 of its bytes.
    Secret { digest: String },
    /// A client certificate's SPIFFE URI or DNS name, under mutual TLS.
    Mtls { identity: String },
    /// An external issuer's JWT whose `iss` is `issuer` and `sub` is `subject`.
    Jwt { issuer: String, subject: String },
}

impl CredentialKind {
    fn label(&self) -> &'static str {
        match self {
            CredentialKind::Secret { .. } => "secret",
            CredentialKind::Mtls { .. } => "mtls",
            CredentialKind::Jwt { .. } => "jwt",
        }
    }
}

/// One credential of an account.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServiceCredential {
    pub id: String,
    pub kind: CredentialKind,
    pub created_at: i64,
}

/// A service account as stored, with its credentials (oldest first).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServiceAccount {
    pub id: String,
    pub name: String,
    pub audiences: Vec<String>,
    pub scopes: Vec<String>,
    /// When and why it was disabled; `None` while in use.
    pub disabled: Option<(i64, String)>,
    pub created_at: i64,
    pub updated_at: i64,
    pub credentials: Vec<ServiceCredential>,
}

/// A write of service accounts.
#[derive(Debug)]
pub enum ServiceWrite {
    Create {
        account: ServiceAccount,
    },
    Disable {
        id: String,
        reason: String,
        now: i64,
    },
    Delete {
        id: String,
        now: i64,
    },
    AddCredential {
        account_id: String,
        credential: ServiceCredential,
        /// The most secrets the account may hold after this one is added.
        max_secrets: i64,
        now: i64,
    },
    RemoveCredential {
        account_id: String,
        credential_id: String,
        now: i64,
    },
}

/// What a [`ServiceWrite`] came to.
#[derive(Debug, PartialEq, Eq)]
pub enum ServiceAnswer {
    /// Create: stored, or its name or a credential's identity is taken.
    Created(bool),
    /// Disable, Delete, RemoveCredential.
    Changed(Change<()>),
    Added(Added),
}

/// What adding a credential came to.
#[derive(Debug, PartialEq, Eq)]
pub enum Added {
    Done,
    NoSuchAccount,
    /// The account holds the most secrets it may.
    TooManySecrets,
    /// The identity is bound to an account already.
    Taken,
}

fn words(text: &str) -> Vec<String> {
    text.split_whitespace().map(str::to_owned).collect()
}

async fn with_credentials(conns: Conns<'_>, row: &Row) -> Result<ServiceAccount, StoreError> {
    let id: String = row.get("id")?;
    let rows = conns
        .fetch_all(Statement::new(sql::CREDENTIALS_OF).bind(id.as_str()))
        .await?;
    let credentials = rows
        .iter()
        .map(credential_from_row)
        .collect::<Result<_, StoreError>>()?;
    let disabled_at: Option<i64> = row.get("disabled_at")?;
    let reason: Option<String> = row.get("disabled_reason")?;
    Ok(ServiceAccount {
        id,
        name: row.get("name")?,
        audiences: words(&row.get::<String>("audiences")?),
        scopes: words(&row.get::<String>("scopes")?),
        disabled: disabled_at.map(|at| (at, reason.unwrap_or_default())),
        created_at: row.get("created_at")?,
        updated_at: row.get("updated_at")?,
        credentials,
    })
}

fn credential_from_row(row: &Row) -> Result<ServiceCredential, StoreError> {
    let kind: String = row.get("kind")?;
    let text = |column: &str| -> Result<String, StoreError> {
        Ok(row.get::<Option<String>>(column)?.unwrap_or_default())
    };
    let kind = match kind.as_str() {
        "secret" => CredentialKind::Secret {
            digest: text("secret_digest")?,
        },
        "mtls" => CredentialKind::Mtls {
            identity: text("identity")?,
        },
        "jwt" => CredentialKind::Jwt {
            issuer: text("issuer")?,
            subject: text("identity")?,
        },
        other => {
            return Err(StoreError::Other(anyhow::anyhow!(
                "a service credential of unknown kind {other:?}"
            )));
        }
    };
    Ok(ServiceCredential {
        id: row.get("id")?,
        kind,
        created_at: row.get("created_at")?,
    })
}

/// The account `key` names, with its credentials.
pub(super) async fn account(
    conns: Conns<'_>,
    key: &ServiceKey,
) -> Result<Option<ServiceAccount>, StoreError> {
    let (column, value) = match key {
        ServiceKey::Id(id) => ("id", id.as_str()),
        ServiceKey::Name(name) => ("name", name.as_str()),
    };
    let text = match column {
        "id" => {
            "SELECT id, name, audiences, scopes, disabled_at, disabled_reason, \
                 created_at, updated_at FROM service_accounts WHERE id = $1"
        }
        _ => {
            "SELECT id, name, audiences, scopes, disabled_at, disabled_reason, \
              created_at, updated_at FROM service_accounts WHERE name = $1"
        }
    };
    let row = conns
        .fetch_optional(Statement::new(text).bind(value))
        .await?;
    match row {
        Some(row) => Ok(Some(with_credentials(conns, &row).await?)),
        None => Ok(None),
    }
}

/// Accounts in name order after `after`, at most `limit`.
pub(super) async fn page(
    conns: Conns<'_>,
    after: &str,
    limit: i64,
) -> Result<Vec<ServiceAccount>, StoreError> {
    let rows = conns
        .fetch_all(
            Statement::new(
                "SELECT id, name, audiences, scopes, disabled_at, disabled_reason, \
                 created_at, updated_at FROM service_accounts WHERE name > $1 \
                 ORDER BY name LIMIT $2",
            )
            .bind(after)
            .bind(limit),
        )
        .await?;
    let mut accounts = Vec::with_capacity(rows.len());
    for row in &rows {
        accounts.push(with_credentials(conns, row).await?);
    }
    Ok(accounts)
}

/// The account a certificate identity (`issuer` `None`) or an external issuer's
/// subject is bound to.
pub(super) async fn by_identity(
    conns: Conns<'_>,
    issuer: Option<&str>,
    identity: &str,
) -> Result<Option<ServiceAccount>, StoreError> {
    let statement = match issuer {
        None => Statement::new(sql::BY_MTLS).bind(identity),
        Some(issuer) => Statement::new(sql::BY_JWT).bind(issuer).bind(identity),
    };
    let Some(row) = conns.fetch_optional(statement).await? else {
        return Ok(None);
    };
    let id: String = row.first()?;
    account(conns, &ServiceKey::Id(id)).await
}

async fn insert_credential(
    conn: &mut Conn<'_>,
    account_id: &str,
    credential: &ServiceCredential,
) -> Result<bool, sqlx::Error> {
    let (digest, identity, issuer) = match &credential.kind {
        CredentialKind::Secret { digest } => (Some(digest.as_str()), None, None),
        CredentialKind::Mtls { identity } => (None, Some(identity.as_str()), None),
        CredentialKind::Jwt { issuer, subject } => {
            (None, Some(subject.as_str()), Some(issuer.as_str()))
        }
    };
    let done = conn
        .execute(
            Statement::new(sql::INSERT_CREDENTIAL)
                .bind(credential.id.as_str())
                .bind(account_id)
                .bind(credential.kind.label())
                .bind(digest)
                .bind(identity)
                .bind(issuer)
                .bind(credential.created_at),
        )
        .await?;
    Ok(done == 1)
}

async fn cutoff(conn: &mut Conn<'_>, key: &str, now: i64) -> Result<(), sqlx::Error> {
    let statement = Statement::new(super::admin::sql::CUTOFF)
        .bind(key)
        .bind(now);
    conn.execute(statement).await.map(drop)
}

async fn exists(conn: &mut Conn<'_>, id: &str) -> Result<bool, sqlx::Error> {
    let found: Option<String> = conn
        .fetch_optional(Statement::new("SELECT id FROM service_accounts WHERE id = $1").bind(id))
        .await?
        .map(|row| row.first())
        .transpose()?;
    Ok(found.is_some())
}

pub(super) async fn service_write(
    conn: &mut Conn<'_>,
    write: &ServiceWrite,
) -> Result<ServiceAnswer, sqlx::Error> {
    Ok(match write {
        ServiceWrite::Create { account } => {
            // A savepoint: a credential whose identity is taken undoes the account.
            conn.execute(Statement::new("SAVEPOINT service_create"))
                .await?;
            let mut stored = conn
                .execute(
                    Statement::new(sql::INSERT_ACCOUNT)
                        .bind(account.id.as_str())
                        .bind(account.name.as_str())
                        .bind(account.audiences.join(" "))
                        .bind(account.scopes.join(" "))
                        .bind(account.created_at),
                )
                .await?
                == 1;
            for credential in &account.credentials {
                if !stored {
                    break;
                }
                stored = insert_credential(conn, &account.id, credential).await?;
            }
            if !stored {
                conn.execute(Statement::new("ROLLBACK TO SAVEPOINT service_create"))
                    .await?;
            }
            conn.execute(Statement::new("RELEASE SAVEPOINT service_create"))
                .await?;
            ServiceAnswer::Created(stored)
        }
        ServiceWrite::Disable { id, reason, now } => {
            let marked = conn
                .execute(
                    Statement::new(sql::DISABLE)
                        .bind(*now)
                        .bind(reason.as_str())
                        .bind(id.as_str()),
                )
                .await?
                == 1;
            ServiceAnswer::Changed(if marked {
                cutoff(conn, id, *now).await?;
                Change::Done(())
            } else if exists(conn, id).await? {
                Change::AlreadySo
            } else {
                Change::NoSuchUser
            })
        }
        ServiceWrite::Delete { id, now } => {
            conn.execute(Statement::new(sql::DELETE_CREDENTIALS).bind(id.as_str()))
                .await?;
            let deleted = conn
                .execute(Statement::new(sql::DELETE_ACCOUNT).bind(id.as_str()))
                .await?
                == 1;
            ServiceAnswer::Changed(if deleted {
                cutoff(conn, id, *now).await?;
                Change::Done(())
            } else {
                Change::NoSuchUser
            })
        }
        ServiceWrite::AddCredential {
            account_id,
            credential,
            max_secrets,
            now,
        } => {
            let touched = conn
                .execute(
                    Statement::new(sql::TOUCH)
                        .bind(*now)
                        .bind(account_id.as_str()),
                )
                .await?;
            if touched != 1 {
                return Ok(ServiceAnswer::Added(Added::NoSuchAccount));
            }
            if matches!(credential.kind, CredentialKind::Secret { .. }) {
                let secrets: i64 = conn
                    .fetch_one(Statement::new(sql::COUNT_SECRETS).bind(account_id.as_str()))
                    .await?
                    .first()?;
                if secrets >= *max_secrets {
                    return Ok(ServiceAnswer::Added(Added::TooManySecrets));
                }
            }
            ServiceAnswer::Added(if insert_credential(conn, account_id, credential).await? {
                Added::Done
            } else {
                Added::Taken
            })
        }
        ServiceWrite::RemoveCredential {
            account_id,
            credential_id,
            now,
        } => {
            let removed = conn
                .execute(
                    Statement::new(sql::REMOVE_CREDENTIAL)
                        .bind(credential_id.as_str())
                        .bind(account_id.as_str()),
                )
                .await?
                == 1;
            ServiceAnswer::Changed(if removed {
                cutoff(conn, credential_id, *now).await?;
                Change::Done(())
            } else {
                Change::NoSuchUser
            })
        }
    })
}

/// The event of a service account's write that changed something (docs/events.md):
/// its account's id as the event's user, and what changed, never a secret's digest
/// nor a credential's identity (only its id and kind).
pub(super) fn event(write: &ServiceWrite, answer: &ServiceAnswer) -> Option<NewEvent> {
    let credential = |c: &ServiceCredential| json!({ "id": c.id, "kind": c.kind.label() });
    match (write, answer) {
        (ServiceWrite::Create { account }, ServiceAnswer::Created(true)) => Some(NewEvent::new(
            &account.id,
            kind::SERVICE_CREATED,
            json!({
                "name": account.name,
                "audiences": account.audiences,
                "scopes": account.scopes,
                "credentials": account.credentials.iter().map(credential).collect::<Vec<_>>(),
            }),
        )),
        (ServiceWrite::Disable { id, reason, .. }, ServiceAnswer::Changed(Change::Done(()))) => {
            Some(NewEvent::new(
                id,
                kind::SERVICE_DISABLED,
                json!({ "reason": reason }),
            ))
        }
        (ServiceWrite::Delete { id, .. }, ServiceAnswer::Changed(Change::Done(()))) => {
            Some(NewEvent::new(id, kind::SERVICE_DELETED, json!({})))
        }
        (
            ServiceWrite::AddCredential {
                account_id,
                credential: added,
                ..
            },
            ServiceAnswer::Added(Added::Done),
        ) => Some(NewEvent::new(
            account_id,
            kind::SERVICE_CREDENTIAL_ADDED,
            json!({ "credential": credential(added) }),
        )),
        (
            ServiceWrite::RemoveCredential {
                account_id,
                credential_id,
                ..
            },
            ServiceAnswer::Changed(Change::Done(())),
        ) => Some(NewEvent::new(
            account_id,
            kind::SERVICE_CREDENTIAL_REMOVED,
            json!({ "credential": { "id": credential_id } }),
        )),
        _ => None,
    }
}
