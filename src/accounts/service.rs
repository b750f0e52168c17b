//! Service accounts (docs/service-accounts.md): identities for machines, what an
//! administrator does to them, and the tokens they get.
//!
//! - **Credentials.** A client secret is 256 random bits, shown once and stored as
//!   its SHA-256 digest: a secret of that entropy needs no stretching, so checking
//!   one costs a digest, never a hash of the password policy. An account holds at
//!   most [`MAX_SECRETS`] at once, so a new one is rolled out before the old one is
//!   removed. A certificate identity (mutual TLS) or an external issuer's subject
//!   binds an account to what a verified peer or token says.
//! - **Client credentials** (RFC 6749 §4.4): the credential is checked, the grant
//!   throttled per client id (and client) like a login, and a token issued: `sub`
//!   the account's id, `client_id` its name, the audiences and scopes asked for if
//!   the account may have them, no refresh token. Its `iat` is when the account was
//!   read, so a disable or a credential removed after that refuses it. The account
//!   comes from the replica's copy (`service_cache`) while no cutoff of it or of the
//!   credential may have changed it, else from the database.
//! - **Token exchange** (RFC 8693): a user's token for one audience the account may
//!   have, `sub` the user, `act` the account (and the actors before it, at most
//!   [`ServiceSettings::max_actors`]), the user's session kept, so the user's
//!   logout or password change ends it; it never outlives its source.
//! - **Revocation.** Disabling or deleting an account writes a cutoff under its id,
//!   removing a credential one under the credential's id (`user_cutoffs`): every
//!   replica's poller reads them as it reads users' cutoffs, within
//!   `AUTHD_REVOCATION_DELAY`.

use super::{Accounts, service_cache::Lookup, uuid_v7};
use crate::issuers::{Issuers, Refusal};
use crate::{
    audit::Caller,
    error::{Error, FieldViolation},
    metrics::GrantOutcome,
    store::{
        Added, Change, CredentialKind, ServiceAccount, ServiceAnswer, ServiceCredential,
        ServiceKey, ServiceWrite, StoreError,
    },
    token::{Actor, IssuedToken, ServiceGrant, VerifiedToken},
};
use base64::Engine as _;
use sha2::{Digest as _, Sha256};
use std::{
    sync::Arc,
    time::{Duration, Instant},
};
use subtle::ConstantTimeEq as _;

/// The most secrets an account holds at once.
pub const MAX_SECRETS: i64 = 2;
/// What every secret starts with (so that secret scanners can find one).
pub const SECRET_PREFIX: &str = "authd_sa_";
/// The most audiences, scopes and credentials an account may be created with.
pub const MAX_AUDIENCES: usize = 32;
pub const MAX_SCOPES: usize = 64;
pub const MAX_CREDENTIALS: usize = 16;
/// The longest audience, scope and identity, in bytes.
pub const MAX_ITEM_BYTES: usize = 256;
/// The longest service account name, in characters.
pub const MAX_NAME_CHARS: usize = 64;

/// Why a grant is refused for what it asks (`Error::NotAllowed`): an audience or a
/// scope the account may not have (OAuth's `invalid_target`, `invalid_scope`);
/// every other refusal of an exchange is about its subject token (`invalid_grant`).
pub const AUDIENCE_NOT_ALLOWED: &str = "the account may not have this audience";
pub const SCOPE_NOT_ALLOWED: &str = "the account may not have this scope";

/// The grants, as the metrics index them.
const CLIENT_CREDENTIALS: usize = 0;
const TOKEN_EXCHANGE: usize = 1;

/// How service tokens live.
#[derive(Debug, Clone, Copy)]
pub struct ServiceSettings {
    /// The lifetime of a service token and of an exchanged one
    /// (`AUTHD_SERVICE_TOKEN_TTL`): at most the users' token lifetime, which is how
    /// long every replica keeps a cutoff.
    pub token_ttl: Duration,
    /// The most actors an exchanged token may carry (`AUTHD_TOKEN_EXCHANGE_MAX_DEPTH`).
    pub max_actors: usize,
}

impl Default for ServiceSettings {
    fn default() -> Self {
        Self {
            token_ttl: Duration::from_secs(300),
            max_actors: 2,
        }
    }
}

/// What a service presents to prove which account it is.
pub enum ClientProof {
    /// `client_id` (the account's name) and a client secret.
    Secret { client_id: String, secret: String },
    /// The caller's client certificate identity (mutual TLS).
    Certificate { identity: String },
    /// A JWT of a configured external issuer (RFC 7523's `client_assertion`).
    Assertion { jwt: String },
}

/// What a new account or credential is made with, parsed.
#[derive(Debug, Clone)]
pub enum NewCredential {
    /// A new random secret.
    Secret,
    Mtls {
        identity: String,
    },
    Jwt {
        issuer: String,
        subject: String,
    },
}

/// A new account or credential, and the secret made for it (shown once).
pub struct WithSecret<T> {
    pub value: T,
    pub secret: Option<String>,
}

/// A token a service was granted.
pub struct ServiceToken {
    pub token: IssuedToken,
    pub audiences: Vec<String>,
    pub scopes: Vec<String>,
}

fn invalid(field: &'static str, description: impl Into<String>) -> Error {
    Error::InvalidArgument(vec![FieldViolation {
        field,
        description: description.into(),
    }])
}

/// A service account's name, checked: 1 to 64 characters of `a-z 0-9 . _ -`
/// (lowercased), the `client_id` of its grants.
pub fn parse_name(name: &str, field: &'static str) -> Result<String, Error> {
    let name = name.to_ascii_lowercase();
    if name.is_empty()
        || name.len() > MAX_NAME_CHARS
        || !name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
    {
        return Err(invalid(
            field,
            format!("1 to {MAX_NAME_CHARS} characters of a-z, 0-9, '.', '_', '-'"),
        ));
    }
    Ok(name)
}

/// Audiences or scopes, checked: each 1 to 256 bytes of visible ASCII without a
/// space or a quote or backslash (RFC 6749's scope-token), at most `max`, no
/// duplicates (kept in order).
pub fn parse_items(
    items: &[String],
    field: &'static str,
    max: usize,
) -> Result<Vec<String>, Error> {
    if items.len() > max {
        return Err(invalid(field, format!("at most {max}")));
    }
    let mut out: Vec<String> = Vec::with_capacity(items.len());
    for item in items {
        let ok = !item.is_empty()
            && item.len() <= MAX_ITEM_BYTES
            && item
                .bytes()
                .all(|b| (b'!'..=b'~').contains(&b) && b != b'"' && b != b'\\');
        if !ok {
            return Err(invalid(
                field,
                format!(
                    "each 1 to {MAX_ITEM_BYTES} visible ASCII characters, no space, '\"' or '\\'"
                ),
            ));
        }
        if !out.contains(item) {
            out.push(item.clone());
        }
    }
    Ok(out)
}

/// An identity (a SPIFFE URI, a DNS name, an external subject or issuer URL),
/// checked: 1 to 256 bytes of visible ASCII.
pub fn parse_identity(identity: &str, field: &'static str) -> Result<String, Error> {
    if identity.is_empty()
        || identity.len() > MAX_ITEM_BYTES
        || !identity.bytes().all(|b| (b'!'..=b'~').contains(&b))
    {
        return Err(invalid(
            field,
            format!("1 to {MAX_ITEM_BYTES} visible ASCII characters"),
        ));
    }
    Ok(identity.to_owned())
}

/// A new secret: the prefix and 256 random bits (base64url).
fn new_secret() -> String {
    let bytes: [u8; 32] = rand::random();
    format!(
        "{SECRET_PREFIX}{}",
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
    )
}

/// The digest a secret is stored as.
fn secret_digest(secret: &str) -> String {
    hex::encode(Sha256::digest(secret.as_bytes()))
}

/// What the account may be given of what was asked for: the audiences and scopes
/// asked (all it may have when none is asked), or why not.
fn granted(
    account: &ServiceAccount,
    audience: Option<&str>,
    scopes: &[String],
) -> Result<(Vec<String>, Vec<String>), Error> {
    let audiences = match audience {
        None => account.audiences.clone(),
        Some(a) if account.audiences.iter().any(|x| x == a) => vec![a.to_owned()],
        Some(_) => return Err(Error::NotAllowed(AUDIENCE_NOT_ALLOWED)),
    };
    let scopes = if scopes.is_empty() {
        account.scopes.clone()
    } else if scopes.iter().all(|s| account.scopes.contains(s)) {
        scopes.to_vec()
    } else {
        return Err(Error::NotAllowed(SCOPE_NOT_ALLOWED));
    };
    Ok((audiences, scopes))
}

impl Accounts {
    /// The service settings in force.
    pub fn with_services(mut self, settings: ServiceSettings) -> Self {
        self.services = settings;
        self
    }

    /// The external JWT issuers whose tokens prove accounts.
    pub fn with_issuers(mut self, issuers: Arc<Issuers>) -> Self {
        self.issuers = (!issuers.is_empty()).then_some(issuers);
        self
    }

    fn new_credential(&self, spec: &NewCredential, now: i64) -> WithSecret<ServiceCredential> {
        let (kind, secret) = match spec {
            NewCredential::Secret => {
                let secret = new_secret();
                let digest = secret_digest(&secret);
                (CredentialKind::Secret { digest }, Some(secret))
            }
            NewCredential::Mtls { identity } => (
                CredentialKind::Mtls {
                    identity: identity.clone(),
                },
                None,
            ),
            NewCredential::Jwt { issuer, subject } => (
                CredentialKind::Jwt {
                    issuer: issuer.clone(),
                    subject: subject.clone(),
                },
                None,
            ),
        };
        WithSecret {
            value: ServiceCredential {
                id: uuid_v7(now).to_string(),
                kind,
                created_at: now,
            },
            secret,
        }
    }

    /// Creates a service account with `credentials` (at most one secret); the
    /// secret made, if any, is in the answer and nowhere else.
    pub async fn create_service_account(
        &self,
        name: String,
        audiences: Vec<String>,
        scopes: Vec<String>,
        credentials: &[NewCredential],
    ) -> Result<WithSecret<ServiceAccount>, Error> {
        let now = self.clock.millis();
        let mut secret = None;
        let mut made = Vec::with_capacity(credentials.len());
        for spec in credentials {
            let credential = self.new_credential(spec, now);
            if credential.secret.is_some() {
                secret = credential.secret;
            }
            made.push(credential.value);
        }
        let account = ServiceAccount {
            id: uuid_v7(now).to_string(),
            name,
            audiences,
            scopes,
            disabled: None,
            created_at: now,
            updated_at: now,
            credentials: made,
        };
        let write = ServiceWrite::Create {
            account: account.clone(),
        };
        match self.store.service_write(write).await? {
            ServiceAnswer::Created(true) => Ok(WithSecret {
                value: account,
                secret,
            }),
            ServiceAnswer::Created(false) => Err(Error::ServiceAccountExists),
            _ => Err(Error::Internal(anyhow::anyhow!(
                "a create answered otherwise"
            ))),
        }
    }

    /// The service account `key` names.
    pub async fn service_account(&self, key: &ServiceKey) -> Result<ServiceAccount, Error> {
        (self.store.service_account(key).await?).ok_or(Error::NoSuchServiceAccount)
    }

    /// Service accounts in name order after `after`, at most `limit`.
    pub async fn service_accounts_page(
        &self,
        after: &str,
        limit: i64,
    ) -> Result<Vec<ServiceAccount>, Error> {
        Ok(self.store.service_accounts_page(after, limit).await?)
    }

    /// Disables an account: no grant succeeds for it, and its tokens (and the
    /// tokens exchanged by it) are refused on every replica within
    /// `AUTHD_REVOCATION_DELAY`. Whether it changed anything.
    pub async fn disable_service_account(
        &self,
        key: &ServiceKey,
        reason: &str,
    ) -> Result<(ServiceAccount, bool), Error> {
        let account = self.service_account(key).await?;
        let now = self.clock.millis();
        let write = ServiceWrite::Disable {
            id: account.id.clone(),
            reason: reason.to_owned(),
            now,
        };
        let changed = self.changed(write).await?;
        if changed {
            self.revocations.cut_off(&account.id, now, now);
        }
        Ok((
            self.service_account(&ServiceKey::Id(account.id)).await?,
            changed,
        ))
    }

    /// Deletes an account and its credentials; its tokens are refused as a
    /// disabled account's.
    pub async fn delete_service_account(&self, key: &ServiceKey) -> Result<ServiceAccount, Error> {
        let account = self.service_account(key).await?;
        let now = self.clock.millis();
        let write = ServiceWrite::Delete {
            id: account.id.clone(),
            now,
        };
        if !self.changed(write).await? {
            return Err(Error::NoSuchServiceAccount);
        }
        self.revocations.cut_off(&account.id, now, now);
        Ok(account)
    }

    /// Adds a credential to an account (a secret: refused when it holds
    /// [`MAX_SECRETS`] already).
    pub async fn add_service_credential(
        &self,
        key: &ServiceKey,
        spec: &NewCredential,
    ) -> Result<(ServiceAccount, WithSecret<ServiceCredential>), Error> {
        let account = self.service_account(key).await?;
        let now = self.clock.millis();
        let credential = self.new_credential(spec, now);
        let write = ServiceWrite::AddCredential {
            account_id: account.id.clone(),
            credential: credential.value.clone(),
            max_secrets: MAX_SECRETS,
            now,
        };
        match self.store.service_write(write).await? {
            ServiceAnswer::Added(Added::Done) => Ok((account, credential)),
            ServiceAnswer::Added(Added::NoSuchAccount) => Err(Error::NoSuchServiceAccount),
            ServiceAnswer::Added(Added::TooManySecrets) => Err(Error::TooManySecrets),
            ServiceAnswer::Added(Added::Taken) => Err(Error::ServiceAccountExists),
            _ => Err(Error::Internal(anyhow::anyhow!(
                "an add answered otherwise"
            ))),
        }
    }

    /// Removes a credential of an account: it proves nothing any more, and the
    /// tokens issued for it are refused on every replica within
    /// `AUTHD_REVOCATION_DELAY`.
    pub async fn remove_service_credential(
        &self,
        key: &ServiceKey,
        credential_id: &str,
    ) -> Result<ServiceAccount, Error> {
        let account = self.service_account(key).await?;
        let now = self.clock.millis();
        let write = ServiceWrite::RemoveCredential {
            account_id: account.id.clone(),
            credential_id: credential_id.to_owned(),
            now,
        };
        if !self.changed(write).await? {
            return Err(Error::NoSuchServiceAccount);
        }
        self.revocations.cut_off(credential_id, now, now);
        Ok(account)
    }

    /// Applies a write that answers a change: whether it changed something (a
    /// missing account is an error).
    async fn changed(&self, write: ServiceWrite) -> Result<bool, Error> {
        match self.store.service_write(write).await? {
            ServiceAnswer::Changed(Change::Done(())) => Ok(true),
            ServiceAnswer::Changed(Change::AlreadySo) => Ok(false),
            ServiceAnswer::Changed(Change::NoSuchUser) => Err(Error::NoSuchServiceAccount),
            _ => Err(Error::Internal(anyhow::anyhow!(
                "a change answered otherwise"
            ))),
        }
    }

    /// Counts and audits a grant's outcome.
    fn settle(
        &self,
        grant: usize,
        outcome: GrantOutcome,
        caller: &Caller,
        service_id: Option<&str>,
        user_id: Option<&str>,
    ) {
        self.service_metrics.grant(grant, outcome);
        let name = crate::metrics::GRANTS
            .get(grant)
            .copied()
            .unwrap_or("unknown");
        (self.audit).service_grant(caller, name, outcome.label(), service_id, user_id);
    }

    /// The account `lookup` finds, the id of its credential that `proves` accepts,
    /// and when it was read (Unix milliseconds): the replica's copy
    /// (`service_cache`) while nothing may have changed it since, else the
    /// database's, read after that moment was taken, so that a change committed
    /// after it refuses what is issued from it.
    async fn proved(
        &self,
        lookup: Lookup,
        proves: impl Fn(&CredentialKind) -> bool,
    ) -> Result<Option<(Arc<ServiceAccount>, String, u64)>, StoreError> {
        let credential = |account: &ServiceAccount| {
            (account.credentials.iter())
                .find(|c| proves(&c.kind))
                .map(|c| c.id.clone())
        };
        let now = self.clock.unix_ms();
        if let Some((account, read_at)) = self.service_cache.get(&lookup, now)
            && let Some(credential) = credential(&account)
            && !(self.revocations).cut_since(
                &[&account.id, &credential],
                i64::try_from(read_at).unwrap_or(i64::MAX),
            )
        {
            self.service_metrics.read(true);
            return Ok(Some((account, credential, read_at)));
        }
        self.service_metrics.read(false);
        let read_at = self.clock.unix_ms();
        let account = match &lookup {
            Lookup::Name(name) => {
                (self.store)
                    .service_account(&ServiceKey::Name(name.clone()))
                    .await?
            }
            Lookup::Identity { issuer, subject } => {
                (self.store)
                    .service_account_by_identity(issuer.as_deref(), subject)
                    .await?
            }
        };
        let Some(account) = account.map(Arc::new) else {
            self.service_cache.forget(&lookup);
            return Ok(None);
        };
        if account.disabled.is_none() {
            (self.service_cache).put(lookup, account.clone(), read_at, now);
        } else {
            self.service_cache.forget(&lookup);
        }
        Ok(credential(&account).map(|c| (account, c, read_at)))
    }

    /// The account `proof` proves, with the credential it proved, and when it was
    /// read (Unix seconds); throttled per client id and client, counted.
    async fn authenticate_client(
        &self,
        proof: &ClientProof,
        caller: &Caller,
        deadline: Option<Instant>,
        grant: usize,
    ) -> Result<(Arc<ServiceAccount>, String, u64), Error> {
        let count = |outcome| self.settle(grant, outcome, caller, None, None);
        let throttle_key = match proof {
            ClientProof::Secret { client_id, .. } => client_id.to_ascii_lowercase(),
            ClientProof::Certificate { identity } => format!("mtls:{identity}"),
            // The whole token: a client's count is its own token's (the subject is
            // not known before the signature is checked).
            ClientProof::Assertion { jwt } => format!("jwt:{}", secret_digest(jwt)),
        };
        let attempt = match (self.throttle)
            .begin_client(&throttle_key, caller.client, deadline)
            .await
        {
            Ok(attempt) => attempt,
            Err(e) => {
                count(if matches!(e, Error::Throttled { .. }) {
                    GrantOutcome::Throttled
                } else {
                    GrantOutcome::Error
                });
                return Err(e);
            }
        };
        let found = match proof {
            ClientProof::Secret { client_id, secret } => {
                match parse_name(&client_id.to_ascii_lowercase(), "client_id") {
                    Ok(name) => {
                        let digest = secret_digest(secret);
                        self.proved(Lookup::Name(name), |kind| {
                            matches!(kind, CredentialKind::Secret { digest: stored }
                                if bool::from(stored.as_bytes().ct_eq(digest.as_bytes())))
                        })
                        .await
                    }
                    Err(_) => Ok(None),
                }
            }
            ClientProof::Assertion { jwt } => {
                let verified = match &self.issuers {
                    Some(issuers) => issuers.verify(jwt).await,
                    None => Err(Refusal::UnknownIssuer),
                };
                match verified {
                    Ok((issuer, subject)) => {
                        let lookup = Lookup::Identity {
                            issuer: Some(issuer.clone()),
                            subject: subject.clone(),
                        };
                        self.proved(lookup, |kind| {
                            matches!(kind, CredentialKind::Jwt { issuer: bound, subject: sub }
                                if *bound == issuer && *sub == subject)
                        })
                        .await
                    }
                    Err(Refusal::Unreachable) => {
                        count(GrantOutcome::Error);
                        return Err(Error::Unavailable(
                            "the external issuer's keys cannot be fetched".into(),
                        ));
                    }
                    Err(why) => {
                        tracing::debug!(reason = ?why, "an external token was refused");
                        Ok(None)
                    }
                }
            }
            ClientProof::Certificate { identity } => {
                let lookup = Lookup::Identity {
                    issuer: None,
                    subject: identity.clone(),
                };
                self.proved(lookup, |kind| {
                    matches!(kind, CredentialKind::Mtls { identity: bound } if bound == identity)
                })
                .await
            }
        };
        let found = match found {
            Ok(found) => found,
            Err(e) => {
                count(GrantOutcome::Error);
                return Err(e.into());
            }
        };
        match found {
            Some((account, credential, read_at)) if account.disabled.is_none() => {
                if let Some(attempt) = attempt {
                    attempt.succeeded().await;
                }
                Ok((account, credential, read_at / 1000))
            }
            _ => {
                if let Some(attempt) = attempt {
                    attempt.failed().await;
                }
                count(GrantOutcome::InvalidClient);
                Err(Error::InvalidClient)
            }
        }
    }

    /// The client credentials grant: a token for the account `proof` proves, for
    /// `audience` (all it may have when `None`) and `scopes` (likewise when empty).
    pub async fn client_credentials(
        &self,
        proof: &ClientProof,
        audience: Option<&str>,
        scopes: &[String],
        caller: &Caller,
        deadline: Option<Instant>,
    ) -> Result<ServiceToken, Error> {
        let (account, credential, verified_at) = self
            .authenticate_client(proof, caller, deadline, CLIENT_CREDENTIALS)
            .await?;
        let count = |outcome| {
            self.settle(CLIENT_CREDENTIALS, outcome, caller, Some(&account.id), None);
        };
        let (audiences, scopes) = granted(&account, audience, scopes).inspect_err(|_| {
            count(GrantOutcome::NotAllowed);
        })?;
        let token = self
            .tokens
            .issue_service(&ServiceGrant {
                account_id: &account.id,
                client_id: &account.name,
                audiences: &audiences,
                scopes: &scopes,
                credential_id: Some(&credential),
                verified_at,
                ttl: self.services.token_ttl,
            })
            .inspect_err(|_| count(GrantOutcome::Error))?;
        count(GrantOutcome::Ok);
        Ok(ServiceToken {
            token,
            audiences,
            scopes,
        })
    }

    /// Token exchange: `subject_token` (a user's token, or one exchanged from
    /// one) for `audience`, which the account `proof` proves may have, with the
    /// account acting.
    pub async fn exchange_token(
        &self,
        proof: &ClientProof,
        subject_token: &str,
        audience: &str,
        scopes: &[String],
        caller: &Caller,
        deadline: Option<Instant>,
    ) -> Result<ServiceToken, Error> {
        let (account, _, _) = self
            .authenticate_client(proof, caller, deadline, TOKEN_EXCHANGE)
            .await?;
        let count = |outcome| self.settle(TOKEN_EXCHANGE, outcome, caller, Some(&account.id), None);
        let source = match self.validate(subject_token, None) {
            Ok(source) => source,
            Err(Error::InvalidToken(_)) => {
                count(GrantOutcome::NotAllowed);
                return Err(Error::NotAllowed("the subject token is not valid"));
            }
            Err(e) => {
                count(GrantOutcome::Error);
                return Err(e);
            }
        };
        let refuse = |why| {
            count(GrantOutcome::NotAllowed);
            Err(Error::NotAllowed(why))
        };
        if is_service_token(&source) {
            return refuse("the subject token must be a user's");
        }
        let depth = source.actor.as_ref().map_or(0, Actor::depth);
        if depth >= self.services.max_actors {
            return refuse("the subject token has been exchanged as often as it may");
        }
        if !account.audiences.iter().any(|a| a == audience) {
            return refuse(AUDIENCE_NOT_ALLOWED);
        }
        if !scopes.iter().all(|s| account.scopes.contains(s))
            || (!source.scopes.is_empty() && !scopes.iter().all(|s| source.scopes.contains(s)))
        {
            return refuse(SCOPE_NOT_ALLOWED);
        }
        let actor = Actor {
            sub: account.id.clone(),
            client_id: Some(account.name.clone()),
            act: source.actor.clone().map(Box::new),
        };
        let token = self
            .tokens
            .issue_exchanged(&source, actor, audience, scopes, self.services.token_ttl)
            .inspect_err(|_| count(GrantOutcome::Error))?;
        self.settle(
            TOKEN_EXCHANGE,
            GrantOutcome::Ok,
            caller,
            Some(&account.id),
            Some(&source.user_id),
        );
        Ok(ServiceToken {
            token,
            audiences: vec![audience.to_owned()],
            scopes: scopes.to_vec(),
        })
    }
}

/// Whether `token` was issued to a service account (client credentials), not to
/// a user nor exchanged for one.
pub fn is_service_token(token: &VerifiedToken) -> bool {
    token.client_id.is_some() && token.actor.is_none()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_are_256_bits_and_stored_as_their_digest() {
        let a = new_secret();
        let b = new_secret();
        assert_ne!(a, b);
        assert!(a.starts_with(SECRET_PREFIX));
        assert_eq!(a.len(), SECRET_PREFIX.len() + 43);
        assert_eq!(secret_digest(&a).len(), 64);
        assert_ne!(secret_digest(&a), secret_digest(&b));
    }

    #[test]
    fn names_and_items_are_checked() {
        assert_eq!(parse_name("Billing-1", "name").unwrap(), "billing-1");
        for bad in ["", "a b", "x:y", &"a".repeat(65)] {
            assert!(parse_name(bad, "name").is_err(), "{bad}");
        }
        let items = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(
            parse_items(&items(&["a", "b", "a"]), "scopes", 4).unwrap(),
            items(&["a", "b"])
        );
        assert!(parse_items(&items(&["a b"]), "scopes", 4).is_err());
        assert!(parse_items(&items(&["a", "b", "c"]), "scopes", 2).is_err());
    }
}
