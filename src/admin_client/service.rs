//! `authd admin service-accounts …` (docs/service-accounts.md): the calls and what
//! they print. A client secret is printed once, by the command that made it (on
//! stdout, the last line for people, `client_secret` in JSON), never by another.

use super::{Admin, Failure, view};
use crate::{
    config::{ServiceAccountArg, ServiceAccountsAction},
    pb::admin::{
        AddServiceCredentialRequest, ClientSecret, CreateServiceAccountRequest,
        DeleteServiceAccountRequest, DisableServiceAccountRequest, GetServiceAccountRequest,
        JwtBinding, ListServiceAccountsRequest, RemoveServiceCredentialRequest, ServiceAccount,
        ServiceAccountSelector, ServiceCredential, add_service_credential_request,
        service_account_selector::Selector, service_credential,
    },
};
use serde::Serialize;
use tonic::Status;

/// The pages `list` asks for.
const PAGE_SIZE: u32 = 1000;

/// The selector of the account a command names.
fn selector(account: &ServiceAccountArg) -> Option<ServiceAccountSelector> {
    let selector = match (&account.id, &account.name) {
        (Some(id), _) => Selector::Id(id.clone()),
        (None, Some(name)) => Selector::Name(name.clone()),
        (None, None) => return None,
    };
    Some(ServiceAccountSelector {
        selector: Some(selector),
    })
}

/// `ISSUER_URL=SUBJECT`, split at the first `=` after the URL's scheme.
pub(super) fn jwt_binding(text: &str) -> Result<JwtBinding, String> {
    let (issuer, subject) = text
        .split_once('=')
        .filter(|(i, s)| !i.is_empty() && !s.is_empty())
        .ok_or_else(|| format!("--jwt {text:?}: expected ISSUER_URL=SUBJECT"))?;
    Ok(JwtBinding {
        issuer: issuer.to_owned(),
        subject: subject.to_owned(),
    })
}

fn present(account: Option<ServiceAccount>) -> Result<ServiceAccount, Failure> {
    account.ok_or_else(|| Failure::Refused(Status::internal("the answer names no account")))
}

#[derive(Serialize)]
struct CredentialJson<'a> {
    id: &'a str,
    kind: &'static str,
    created_at: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    mtls_identity: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    issuer: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    subject: Option<&'a str>,
}

impl<'a> From<&'a ServiceCredential> for CredentialJson<'a> {
    fn from(c: &'a ServiceCredential) -> Self {
        let (kind, mtls_identity, issuer, subject) = match &c.kind {
            Some(service_credential::Kind::Secret(_)) | None => ("secret", None, None, None),
            Some(service_credential::Kind::MtlsIdentity(id)) => {
                ("mtls", Some(id.as_str()), None, None)
            }
            Some(service_credential::Kind::Jwt(b)) => (
                "jwt",
                None,
                Some(b.issuer.as_str()),
                Some(b.subject.as_str()),
            ),
        };
        Self {
            id: &c.id,
            kind,
            created_at: view::rfc3339(c.created_at.as_ref()),
            mtls_identity,
            issuer,
            subject,
        }
    }
}

#[derive(Serialize)]
struct AccountJson<'a> {
    id: &'a str,
    name: &'a str,
    audiences: &'a [String],
    scopes: &'a [String],
    disabled: bool,
    disabled_at: Option<String>,
    disabled_reason: Option<&'a str>,
    created_at: Option<String>,
    updated_at: Option<String>,
    credentials: Vec<CredentialJson<'a>>,
}

impl<'a> From<&'a ServiceAccount> for AccountJson<'a> {
    fn from(a: &'a ServiceAccount) -> Self {
        Self {
            id: &a.id,
            name: &a.name,
            audiences: &a.audiences,
            scopes: &a.scopes,
            disabled: a.disabled,
            disabled_at: view::rfc3339(a.disabled_at.as_ref()),
            disabled_reason: (!a.disabled_reason.is_empty()).then_some(a.disabled_reason.as_str()),
            created_at: view::rfc3339(a.created_at.as_ref()),
            updated_at: view::rfc3339(a.updated_at.as_ref()),
            credentials: a.credentials.iter().map(CredentialJson::from).collect(),
        }
    }
}

fn credential_line(c: &ServiceCredential) -> String {
    let what = match &c.kind {
        Some(service_credential::Kind::Secret(_)) | None => "secret".to_owned(),
        Some(service_credential::Kind::MtlsIdentity(id)) => format!("mtls {}", view::printable(id)),
        Some(service_credential::Kind::Jwt(b)) => format!(
            "jwt {} sub {}",
            view::printable(&b.issuer),
            view::printable(&b.subject)
        ),
    };
    format!(
        "{}  {}  {what}",
        view::printable(&c.id),
        view::when(c.created_at.as_ref())
    )
}

/// One account for people.
fn account_text(a: &ServiceAccount) -> String {
    let mut out = format!(
        "name        {}\nid          {}\naudiences   {}\nscopes      {}\ncreated     {}\nupdated     {}\ndisabled    {}\n",
        view::printable(&a.name),
        view::printable(&a.id),
        view::printable(&a.audiences.join(" ")),
        view::printable(&a.scopes.join(" ")),
        view::when(a.created_at.as_ref()),
        view::when(a.updated_at.as_ref()),
        if a.disabled { "yes" } else { "no" },
    );
    if a.disabled {
        out.push_str(&format!(
            "disabled at {}\nreason      {}\n",
            view::when(a.disabled_at.as_ref()),
            view::printable(&a.disabled_reason)
        ));
    }
    out.push_str("credentials\n");
    for c in &a.credentials {
        out.push_str("  ");
        out.push_str(&credential_line(c));
        out.push('\n');
    }
    out
}

/// An account and, when made, its secret.
fn with_secret(a: &ServiceAccount, secret: &str, as_json: bool) -> String {
    if as_json {
        #[derive(Serialize)]
        struct Answer<'a> {
            account: AccountJson<'a>,
            #[serde(skip_serializing_if = "Option::is_none")]
            client_secret: Option<&'a str>,
        }
        return view::json(&Answer {
            account: a.into(),
            client_secret: (!secret.is_empty()).then_some(secret),
        });
    }
    let mut out = account_text(a);
    if !secret.is_empty() {
        out.push_str("client secret (shown this once; keep it):\n");
        out.push_str(secret);
        out.push('\n');
    }
    out
}

pub(super) async fn run(
    admin: &Admin,
    action: &ServiceAccountsAction,
    as_json: bool,
) -> Result<String, Failure> {
    let client = || admin.client();
    match action {
        ServiceAccountsAction::Create {
            name,
            audiences,
            scopes,
            secret,
            mtls_identities,
            jwt,
        } => {
            let jwt_bindings = (jwt.iter().map(|b| jwt_binding(b)))
                .collect::<Result<Vec<_>, _>>()
                .map_err(Failure::Usage)?;
            let request = CreateServiceAccountRequest {
                name: name.clone(),
                audiences: audiences.clone(),
                scopes: scopes.clone(),
                with_secret: *secret,
                mtls_identities: mtls_identities.clone(),
                jwt_bindings,
            };
            let answer = admin
                .answer(client().create_service_account(admin.request(request)))
                .await?;
            Ok(with_secret(
                &present(answer.account)?,
                &answer.client_secret,
                as_json,
            ))
        }
        ServiceAccountsAction::List => {
            let mut accounts = Vec::new();
            let mut token = String::new();
            loop {
                let request = ListServiceAccountsRequest {
                    page_size: PAGE_SIZE,
                    page_token: token.clone(),
                };
                let page = admin
                    .answer(client().list_service_accounts(admin.request(request)))
                    .await?;
                accounts.extend(page.accounts);
                if !page.next_page_token.is_empty() && page.next_page_token == token {
                    return Err(Failure::Refused(Status::internal(
                        "the server gave the same page token again",
                    )));
                }
                token = page.next_page_token;
                if token.is_empty() {
                    break;
                }
            }
            if as_json {
                #[derive(Serialize)]
                struct Page<'a> {
                    accounts: Vec<AccountJson<'a>>,
                }
                return Ok(view::json(&Page {
                    accounts: accounts.iter().map(AccountJson::from).collect(),
                }));
            }
            let rows: Vec<Vec<String>> = accounts
                .iter()
                .map(|a| {
                    vec![
                        view::printable(&a.name),
                        view::printable(&a.id),
                        if a.disabled { "yes" } else { "no" }.to_owned(),
                        a.credentials.len().to_string(),
                        view::printable(&a.audiences.join(",")),
                    ]
                })
                .collect();
            Ok(view::table(
                &["NAME", "ID", "DISABLED", "CREDENTIALS", "AUDIENCES"],
                &rows,
            ))
        }
        ServiceAccountsAction::Show { account } => {
            let request = GetServiceAccountRequest {
                account: selector(account),
            };
            let answer = admin
                .answer(client().get_service_account(admin.request(request)))
                .await?;
            Ok(with_secret(&present(answer.account)?, "", as_json))
        }
        ServiceAccountsAction::Disable { account, reason } => {
            let request = DisableServiceAccountRequest {
                account: selector(account),
                reason: reason.clone(),
            };
            let answer = admin
                .answer(client().disable_service_account(admin.request(request)))
                .await?;
            let found = present(answer.account)?;
            if as_json {
                return Ok(with_secret(&found, "", true));
            }
            Ok(if answer.changed {
                format!("disabled {} ({})\n", view::printable(&found.name), found.id)
            } else {
                format!(
                    "{} was already disabled; nothing changed\n",
                    view::printable(&found.name)
                )
            })
        }
        ServiceAccountsAction::Delete { account, .. } => {
            let request = DeleteServiceAccountRequest {
                account: selector(account),
            };
            let answer = admin
                .answer(client().delete_service_account(admin.request(request)))
                .await?;
            let found = present(answer.account)?;
            if as_json {
                return Ok(with_secret(&found, "", true));
            }
            Ok(format!(
                "deleted {} ({})\n",
                view::printable(&found.name),
                found.id
            ))
        }
        ServiceAccountsAction::RotateSecret { account, revoke } => {
            let request = AddServiceCredentialRequest {
                account: selector(account),
                kind: Some(add_service_credential_request::Kind::Secret(
                    ClientSecret {},
                )),
            };
            let answer = admin
                .answer(client().add_service_credential(admin.request(request)))
                .await?;
            let credential = answer.credential.unwrap_or_default();
            if let Some(old) = revoke {
                let request = RemoveServiceCredentialRequest {
                    account: selector(account),
                    credential_id: old.clone(),
                };
                admin
                    .answer(client().remove_service_credential(admin.request(request)))
                    .await?;
            }
            if as_json {
                #[derive(Serialize)]
                struct Answer<'a> {
                    credential: CredentialJson<'a>,
                    client_secret: &'a str,
                    revoked: Option<&'a str>,
                }
                return Ok(view::json(&Answer {
                    credential: (&credential).into(),
                    client_secret: &answer.client_secret,
                    revoked: revoke.as_deref(),
                }));
            }
            let mut out = format!("added secret {}\n", view::printable(&credential.id));
            if let Some(old) = revoke {
                out.push_str(&format!("removed credential {}\n", view::printable(old)));
            }
            out.push_str("client secret (shown this once; keep it):\n");
            out.push_str(&answer.client_secret);
            out.push('\n');
            Ok(out)
        }
        ServiceAccountsAction::RemoveCredential {
            account,
            credential,
        } => {
            let request = RemoveServiceCredentialRequest {
                account: selector(account),
                credential_id: credential.clone(),
            };
            admin
                .answer(client().remove_service_credential(admin.request(request)))
                .await?;
            if as_json {
                #[derive(Serialize)]
                struct Answer<'a> {
                    removed: &'a str,
                }
                return Ok(view::json(&Answer {
                    removed: credential,
                }));
            }
            Ok(format!(
                "removed credential {}\n",
                view::printable(credential)
            ))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_jwt_binding_is_the_issuer_then_the_subject() {
        let b = jwt_binding("https://k8s.example=system:serviceaccount:shop:orders").unwrap();
        assert_eq!(b.issuer, "https://k8s.example");
        assert_eq!(b.subject, "system:serviceaccount:shop:orders");
        assert!(jwt_binding("https://k8s.example").is_err());
        assert!(jwt_binding("=x").is_err());
    }
}
