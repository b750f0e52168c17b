//! The service accounts' admin calls (docs/service-accounts.md): proto in, the
//! use cases of `accounts` through, each call admitted, audited (the account's id
//! as its target) and counted as the user calls are. A client secret leaves only
//! in the answer of the call that made it.

use super::{AdminApi, MAX_REASON_CHARS, Needs, invalid, page::Keyset, timestamp};
use crate::{
    accounts::{
        MAX_AUDIENCES, MAX_CREDENTIALS, MAX_SCOPES, NewCredential, parse_identity, parse_items,
        parse_name,
    },
    error::Error,
    pb::admin::{
        AddServiceCredentialRequest, AddServiceCredentialResponse, ClientSecret,
        CreateServiceAccountRequest, CreateServiceAccountResponse, DeleteServiceAccountRequest,
        DeleteServiceAccountResponse, DisableServiceAccountRequest, DisableServiceAccountResponse,
        GetServiceAccountRequest, GetServiceAccountResponse, JwtBinding,
        ListServiceAccountsRequest, ListServiceAccountsResponse, RemoveServiceCredentialRequest,
        RemoveServiceCredentialResponse, ServiceAccount, ServiceAccountSelector, ServiceCredential,
        add_service_credential_request, service_account_selector::Selector, service_credential,
    },
    store::{self, CredentialKind, ServiceKey},
};
use tonic::{Request, Response, Status};

/// The account a selector names, checked.
fn selected(account: Option<ServiceAccountSelector>) -> Result<ServiceKey, Error> {
    match account.and_then(|a| a.selector) {
        Some(Selector::Id(id)) if !id.is_empty() && id.len() <= 64 => Ok(ServiceKey::Id(id)),
        Some(Selector::Id(_)) => Err(invalid("account.id", "must be 1 to 64 characters")),
        Some(Selector::Name(name)) => parse_name(&name, "account.name").map(ServiceKey::Name),
        None => Err(invalid("account", "name the account by id or name")),
    }
}

fn jwt_binding(binding: &JwtBinding, field: &'static str) -> Result<NewCredential, Error> {
    let issuer = parse_identity(&binding.issuer, field)?;
    if !(issuer.starts_with("https://") || issuer.starts_with("http://")) {
        return Err(invalid(field, "the issuer is its URL"));
    }
    Ok(NewCredential::Jwt {
        issuer,
        subject: parse_identity(&binding.subject, field)?,
    })
}

fn credential(c: store::ServiceCredential) -> ServiceCredential {
    let kind = match c.kind {
        CredentialKind::Secret { .. } => service_credential::Kind::Secret(ClientSecret {}),
        CredentialKind::Mtls { identity } => service_credential::Kind::MtlsIdentity(identity),
        CredentialKind::Jwt { issuer, subject } => {
            service_credential::Kind::Jwt(JwtBinding { issuer, subject })
        }
    };
    ServiceCredential {
        id: c.id,
        created_at: Some(timestamp(c.created_at)),
        kind: Some(kind),
    }
}

fn account(a: store::ServiceAccount) -> ServiceAccount {
    let (disabled_at, disabled_reason) = match a.disabled {
        Some((at, reason)) => (Some(timestamp(at)), reason),
        None => (None, String::new()),
    };
    ServiceAccount {
        id: a.id,
        name: a.name,
        audiences: a.audiences,
        scopes: a.scopes,
        disabled: disabled_at.is_some(),
        disabled_at,
        disabled_reason,
        created_at: Some(timestamp(a.created_at)),
        updated_at: Some(timestamp(a.updated_at)),
        credentials: a.credentials.into_iter().map(credential).collect(),
    }
}

/// ListServiceAccounts' pages, by name.
const ACCOUNTS: Keyset = Keyset {
    tag: "s",
    rpc: "ListServiceAccounts",
};

/// The error of a call on `key`, with the account id when the key is one.
fn on(key: &ServiceKey) -> impl Fn(Error) -> (Error, Option<String>) + '_ {
    move |e| {
        let id = match key {
            ServiceKey::Id(id) => Some(id.clone()),
            ServiceKey::Name(_) => None,
        };
        (e, id)
    }
}

impl AdminApi {
    pub(super) async fn create_service_account_call(
        &self,
        request: Request<CreateServiceAccountRequest>,
    ) -> Result<Response<CreateServiceAccountResponse>, Status> {
        self.call(
            "CreateServiceAccount",
            Needs::Change,
            request,
            |r| async move {
                let parsed = (|| {
                    let name = parse_name(&r.name, "name")?;
                    let audiences = parse_items(&r.audiences, "audiences", MAX_AUDIENCES)?;
                    let scopes = parse_items(&r.scopes, "scopes", MAX_SCOPES)?;
                    let mut credentials = Vec::new();
                    if r.with_secret {
                        credentials.push(NewCredential::Secret);
                    }
                    for identity in &r.mtls_identities {
                        credentials.push(NewCredential::Mtls {
                            identity: parse_identity(identity, "mtls_identities")?,
                        });
                    }
                    for binding in &r.jwt_bindings {
                        credentials.push(jwt_binding(binding, "jwt_bindings")?);
                    }
                    if credentials.len() > MAX_CREDENTIALS {
                        let why = format!("at most {MAX_CREDENTIALS} credentials");
                        return Err(invalid("jwt_bindings", why));
                    }
                    Ok((name, audiences, scopes, credentials))
                })();
                let (name, audiences, scopes, credentials) = parsed.map_err(|e| (e, None))?;
                let made = (self.accounts)
                    .create_service_account(name, audiences, scopes, &credentials)
                    .await
                    .map_err(|e| (e, None))?;
                self.metrics.service_accounts_created.inc();
                let id = made.value.id.clone();
                Ok((
                    CreateServiceAccountResponse {
                        account: Some(account(made.value)),
                        client_secret: made.secret.unwrap_or_default(),
                    },
                    Some(id),
                ))
            },
        )
        .await
    }

    pub(super) async fn get_service_account_call(
        &self,
        request: Request<GetServiceAccountRequest>,
    ) -> Result<Response<GetServiceAccountResponse>, Status> {
        self.call("GetServiceAccount", Needs::Read, request, |r| async move {
            let key = selected(r.account).map_err(|e| (e, None))?;
            let found = (self.accounts.service_account(&key).await).map_err(on(&key))?;
            let id = found.id.clone();
            Ok((
                GetServiceAccountResponse {
                    account: Some(account(found)),
                },
                Some(id),
            ))
        })
        .await
    }

    pub(super) async fn list_service_accounts_call(
        &self,
        request: Request<ListServiceAccountsRequest>,
    ) -> Result<Response<ListServiceAccountsResponse>, Status> {
        self.call(
            "ListServiceAccounts",
            Needs::Read,
            request,
            |r| async move {
                let limit = Keyset::limit(r.page_size).map_err(|e| (e, None))?;
                let after = ACCOUNTS.after(&r.page_token, |name| {
                    parse_name(name, "page_token").is_ok_and(|parsed| parsed == name)
                });
                let after = after.map_err(|e| (e, None))?;
                // One more than the page: whether there is a next one.
                let page = (self.accounts)
                    .service_accounts_page(&after, i64::from(limit) + 1)
                    .await
                    .map_err(|e| (e, None))?;
                let (page, next_page_token) = ACCOUNTS.page(page, limit, |a| &a.name);
                Ok((
                    ListServiceAccountsResponse {
                        accounts: page.into_iter().map(account).collect(),
                        next_page_token,
                    },
                    None,
                ))
            },
        )
        .await
    }

    pub(super) async fn disable_service_account_call(
        &self,
        request: Request<DisableServiceAccountRequest>,
    ) -> Result<Response<DisableServiceAccountResponse>, Status> {
        self.call(
            "DisableServiceAccount",
            Needs::Change,
            request,
            |r| async move {
                let key = selected(r.account).map_err(|e| (e, None))?;
                let reason = r.reason.trim();
                if reason.is_empty() || reason.chars().count() > MAX_REASON_CHARS {
                    let why = format!("say why, in 1 to {MAX_REASON_CHARS} characters");
                    return Err((invalid("reason", why), None));
                }
                let (found, changed) = (self.accounts.disable_service_account(&key, reason).await)
                    .map_err(on(&key))?;
                if changed {
                    self.metrics.service_accounts_disabled.inc();
                }
                let id = found.id.clone();
                Ok((
                    DisableServiceAccountResponse {
                        account: Some(account(found)),
                        changed,
                    },
                    Some(id),
                ))
            },
        )
        .await
    }

    pub(super) async fn delete_service_account_call(
        &self,
        request: Request<DeleteServiceAccountRequest>,
    ) -> Result<Response<DeleteServiceAccountResponse>, Status> {
        self.call(
            "DeleteServiceAccount",
            Needs::Change,
            request,
            |r| async move {
                let key = selected(r.account).map_err(|e| (e, None))?;
                let deleted =
                    (self.accounts.delete_service_account(&key).await).map_err(on(&key))?;
                self.metrics.service_accounts_deleted.inc();
                let id = deleted.id.clone();
                Ok((
                    DeleteServiceAccountResponse {
                        account: Some(account(deleted)),
                    },
                    Some(id),
                ))
            },
        )
        .await
    }

    pub(super) async fn add_service_credential_call(
        &self,
        request: Request<AddServiceCredentialRequest>,
    ) -> Result<Response<AddServiceCredentialResponse>, Status> {
        self.call(
            "AddServiceCredential",
            Needs::Change,
            request,
            |r| async move {
                let key = selected(r.account).map_err(|e| (e, None))?;
                let spec = match r.kind {
                    Some(add_service_credential_request::Kind::Secret(_)) => {
                        Ok(NewCredential::Secret)
                    }
                    Some(add_service_credential_request::Kind::MtlsIdentity(identity)) => {
                        parse_identity(&identity, "mtls_identity")
                            .map(|identity| NewCredential::Mtls { identity })
                    }
                    Some(add_service_credential_request::Kind::Jwt(binding)) => {
                        jwt_binding(&binding, "jwt")
                    }
                    None => Err(invalid("kind", "name the credential to add")),
                }
                .map_err(|e| (e, None))?;
                let (found, made) =
                    (self.accounts.add_service_credential(&key, &spec).await).map_err(on(&key))?;
                Ok((
                    AddServiceCredentialResponse {
                        credential: Some(credential(made.value)),
                        client_secret: made.secret.unwrap_or_default(),
                    },
                    Some(found.id),
                ))
            },
        )
        .await
    }

    pub(super) async fn remove_service_credential_call(
        &self,
        request: Request<RemoveServiceCredentialRequest>,
    ) -> Result<Response<RemoveServiceCredentialResponse>, Status> {
        self.call(
            "RemoveServiceCredential",
            Needs::Change,
            request,
            |r| async move {
                let key = selected(r.account).map_err(|e| (e, None))?;
                if r.credential_id.is_empty() || r.credential_id.len() > 64 {
                    return Err((invalid("credential_id", "must be 1 to 64 characters"), None));
                }
                let found = (self
                    .accounts
                    .remove_service_credential(&key, &r.credential_id)
                    .await)
                    .map_err(on(&key))?;
                Ok((RemoveServiceCredentialResponse {}, Some(found.id)))
            },
        )
        .await
    }
}
