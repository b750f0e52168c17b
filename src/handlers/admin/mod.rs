//! The admin API, `auth.admin.v1.AdminService` (docs/admin.md): served only on
//! its own listener (`AUTHD_ADMIN_LISTEN`), never on the gRPC port.
//!
//! Each call is, in this order: counted against the admin rate limit
//! (`AUTHD_ADMIN_RATE`, one budget for the listener), authenticated by its admin
//! key (`authorization: Bearer …`, see `keys`) or, without one, by its client
//! certificate's identity on the allow-list (`AUTHD_ADMIN_ALLOW`, under mutual
//! TLS), authorized by the role, validated, run (`accounts::admin`), audited and
//! counted by RPC and code.
//!
//! # Layout
//!
//! - this file: the service, its credentials check and its rate limit.
//! - `events`: WatchEvents, the account events as a stream.
//! - `import`: ImportUsers, a stream of users with the hashes they have, written
//!   in batches.
//! - `keys`: the admin keys file and the constant-time check of a key.
//! - `service`: the service accounts' calls (docs/service-accounts.md).

mod events;
mod import;
mod keys;
mod page;
mod service;

pub use keys::{Actor, AdminKeys, Role};
use page::Keyset;

use crate::{
    accounts::{Accounts, Changed, MAX_SESSIONS},
    audit::{Audit, Caller},
    blocklist::Blocklist,
    credentials::{Password, Username},
    error::{Error, FieldViolation, QuotaViolation},
    metrics::AdminMetrics,
    pb::admin::{
        DeleteUserRequest, DeleteUserResponse, DisableUserRequest, DisableUserResponse,
        DisabledFilter, EnableUserRequest, EnableUserResponse, EndSessionsRequest,
        EndSessionsResponse, GetUserRequest, GetUserResponse, ListSessionsRequest,
        ListSessionsResponse, ListUsersRequest, ListUsersResponse, RemoveSecondFactorsRequest,
        RemoveSecondFactorsResponse, Session, SetPasswordRequest, SetPasswordResponse, User,
        UserSelector, admin_service_server, user_selector::Selector,
    },
    rpc,
    store::{Account, AccountKey, PageQuery, SessionInfo},
};
use std::{
    future::Future,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};
use tonic::{Request, Response, Status};

/// The longest reason DisableUser keeps, in characters.
pub const MAX_REASON_CHARS: usize = 512;

/// What the admin listener is configured with.
pub struct AdminSettings {
    /// The admin keys, when a keys file is given.
    pub keys: Option<AdminKeys>,
    /// Client certificate identities allowed, with their roles.
    pub allow: Vec<(Role, String)>,
    /// Calls a second, and as many at once (the bucket's size).
    pub rate: u32,
}

/// One budget of calls for the whole listener: a token bucket of `rate` a second.
struct Budget {
    rate: f64,
    tokens: f64,
    at: Instant,
}

impl Budget {
    fn new(rate: u32, now: Instant) -> Self {
        let rate = f64::from(rate.max(1));
        Self {
            rate,
            tokens: rate,
            at: now,
        }
    }

    /// Takes one call, or says how long until one is free.
    fn take(&mut self, now: Instant) -> Result<(), Duration> {
        let elapsed = now.saturating_duration_since(self.at).as_secs_f64();
        self.tokens = (self.tokens + elapsed * self.rate).min(self.rate);
        self.at = now;
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            Ok(())
        } else {
            Err(Duration::from_secs_f64((1.0 - self.tokens) / self.rate))
        }
    }
}

/// The admin service.
pub struct AdminApi {
    accounts: Arc<Accounts>,
    blocklist: Arc<Blocklist>,
    keys: Option<AdminKeys>,
    allow: Vec<(Role, String)>,
    budget: Mutex<Budget>,
    rate: u32,
    audit: Audit,
    metrics: AdminMetrics,
    /// The caps ImportUsers checks foreign hashes against.
    import_caps: crate::password::foreign::Caps,
    /// The account events WatchEvents streams.
    events: Option<Arc<crate::events::Events>>,
    /// Ends the open streams when the port stops.
    stop: tokio_util::sync::CancellationToken,
}

/// What a method needs of its caller's key.
#[derive(Clone, Copy)]
enum Needs {
    Read,
    Change,
}

impl AdminApi {
    pub fn new(
        accounts: Arc<Accounts>,
        blocklist: Arc<Blocklist>,
        settings: AdminSettings,
        audit: Audit,
        metrics: AdminMetrics,
    ) -> Self {
        let budget = Budget::new(settings.rate, accounts.clock().now());
        Self {
            accounts,
            blocklist,
            keys: settings.keys,
            allow: settings.allow,
            budget: Mutex::new(budget),
            rate: settings.rate,
            audit,
            metrics,
            import_caps: crate::password::foreign::Caps::default(),
            events: None,
            stop: tokio_util::sync::CancellationToken::new(),
        }
    }

    /// The account events WatchEvents streams, whose streams end when `stop` is
    /// cancelled.
    pub fn with_events(
        mut self,
        events: Arc<crate::events::Events>,
        stop: tokio_util::sync::CancellationToken,
    ) -> Self {
        self.events = Some(events);
        self.stop = stop;
        self
    }

    /// The caps ImportUsers checks foreign hashes against (AUTHD_IMPORT_MAX_*).
    pub fn with_import_caps(mut self, caps: crate::password::foreign::Caps) -> Self {
        self.import_caps = caps;
        self
    }

    pub fn server(self) -> admin_service_server::AdminServiceServer<Self> {
        admin_service_server::AdminServiceServer::new(self)
            .max_decoding_message_size(crate::rpc::MAX_ADMIN_MESSAGE_BYTES)
    }

    fn caller<T>(&self, request: &Request<T>) -> Caller {
        Caller {
            request_id: (request.extensions().get::<rpc::RequestId>())
                .map(|id| id.as_str().to_owned()),
            client: rpc::client_ip(request.extensions()),
            identity: rpc::client_identity(request.extensions()).map(|i| i.as_str().to_owned()),
            trace_id: crate::otel::current_trace_id(),
        }
    }

    /// The rate limit, then the key and its role.
    fn admit<T>(&self, request: &Request<T>, needs: Needs) -> Result<Actor, Error> {
        let refused = {
            let mut budget = self.budget.lock().unwrap_or_else(|e| e.into_inner());
            budget.take(self.accounts.clock().now()).err()
        };
        if let Some(retry_after) = refused {
            return Err(Error::RateLimited {
                violations: vec![QuotaViolation {
                    subject: "admin".into(),
                    description: format!(
                        "at most {} admin calls a second (AUTHD_ADMIN_RATE)",
                        self.rate
                    ),
                }],
                limit: self.rate,
                retry_after,
            });
        }
        let presented = (request.metadata().get("authorization"))
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "));
        let actor = match (presented, rpc::client_identity(request.extensions())) {
            // A key decides, when one is given.
            (Some(key), _) => (self.keys.as_ref())
                .and_then(|keys| keys.identify(key.trim()))
                .ok_or(Error::AdminUnauthenticated)?,
            // A client certificate: known (on the allow-list) or not.
            (None, Some(identity)) => {
                let role = (self.allow.iter())
                    .find(|(_, allowed)| allowed == identity.as_str())
                    .map(|(role, _)| *role)
                    .ok_or(Error::AdminForbidden)?;
                Actor {
                    name: identity.as_str().to_owned(),
                    role,
                }
            }
            (None, None) => return Err(Error::AdminUnauthenticated),
        };
        match (needs, actor.role) {
            (Needs::Change, Role::Read) => Err(Error::AdminForbidden),
            _ => Ok(actor),
        }
    }

    /// Runs one call: admits it, runs `work`, audits and counts the outcome.
    /// `work` returns the answer and the user it acted on.
    async fn call<T, R, F>(
        &self,
        rpc: &'static str,
        needs: Needs,
        request: Request<T>,
        work: impl FnOnce(T) -> F,
    ) -> Result<Response<R>, Status>
    where
        F: Future<Output = Result<(R, Option<String>), (Error, Option<String>)>>,
    {
        let caller = self.caller(&request);
        let outcome = match self.admit(&request, needs) {
            Ok(actor) => {
                let done = work(request.into_inner()).await;
                let (user_id, code) = match &done {
                    Ok((_, user)) => (user.clone(), "ok"),
                    Err((e, user)) => (user.clone(), label(e)),
                };
                (self.audit).admin(&caller, Some(&actor.name), rpc, user_id.as_deref(), code);
                done.map(|(answer, _)| answer).map_err(|(e, _)| e)
            }
            Err(e) => {
                (self.audit).admin(&caller, None, rpc, None, label(&e));
                Err(e)
            }
        };
        let status = outcome.map_err(|e| {
            if let Error::Internal(cause) = &e {
                tracing::error!(rpc, error = format!("{cause:#}"), "admin call failed");
            }
            e.to_status()
        });
        let code = match &status {
            Ok(_) => tonic::Code::Ok,
            Err(s) => s.code(),
        };
        self.metrics.request(rpc, code);
        status.map(Response::new)
    }
}

/// The audit trail's outcome of an error: its gRPC code's name.
fn label(e: &Error) -> &'static str {
    let code = e.to_status().code() as usize;
    crate::metrics::CODE_NAMES
        .get(code)
        .copied()
        .unwrap_or("UNKNOWN")
}

fn invalid(field: &'static str, description: impl Into<String>) -> Error {
    Error::InvalidArgument(vec![FieldViolation {
        field,
        description: description.into(),
    }])
}

/// The account a selector names, checked.
fn selected(user: Option<UserSelector>) -> Result<AccountKey, Error> {
    match user.and_then(|u| u.selector) {
        Some(Selector::UserId(id)) if !id.is_empty() && id.len() <= 64 => Ok(AccountKey::Id(id)),
        Some(Selector::UserId(_)) => Err(invalid("user.user_id", "must be 1 to 64 characters")),
        Some(Selector::Username(name)) => Username::parse(&name)
            .map(|u| AccountKey::Username(u.as_str().to_owned()))
            .map_err(|why| invalid("user.username", why)),
        None => Err(invalid("user", "name the user by user_id or username")),
    }
}

/// A `google.protobuf.Timestamp` of Unix milliseconds.
fn timestamp(ms: i64) -> prost_types::Timestamp {
    prost_types::Timestamp {
        seconds: ms.div_euclid(1000),
        nanos: i32::try_from(ms.rem_euclid(1000) * 1_000_000).unwrap_or(0),
    }
}

fn user(account: Account) -> User {
    let (disabled_at, disabled_reason) = match account.disabled {
        Some((at, reason)) => (Some(timestamp(at)), reason),
        None => (None, String::new()),
    };
    User {
        id: account.id,
        username: account.username,
        created_at: Some(timestamp(account.created_at)),
        updated_at: Some(timestamp(account.updated_at)),
        disabled: disabled_at.is_some(),
        disabled_at,
        disabled_reason,
        live_sessions: u32::try_from(account.live_sessions.max(0)).unwrap_or(u32::MAX),
        last_login_at: account.last_login_at.map(timestamp),
    }
}

fn session(info: SessionInfo) -> Session {
    Session {
        id: info.id,
        started_at: Some(timestamp(info.started_at)),
        refreshed_at: info.refreshed_at.map(timestamp),
        expires_at: Some(timestamp(info.expires_at)),
        client_address: info.client_addr.unwrap_or_default(),
    }
}

/// ListUsers' pages, by username.
const USERS: Keyset = Keyset {
    tag: "u",
    rpc: "ListUsers",
};

/// The error of a call that named `key`, with the user id when the key is one.
fn with_target(key: &AccountKey) -> impl Fn(Error) -> (Error, Option<String>) + '_ {
    move |e| {
        let id = match key {
            AccountKey::Id(id) => Some(id.clone()),
            AccountKey::Username(_) => None,
        };
        (e, id)
    }
}

#[tonic::async_trait]
impl admin_service_server::AdminService for AdminApi {
    async fn get_user(
        &self,
        request: Request<GetUserRequest>,
    ) -> Result<Response<GetUserResponse>, Status> {
        self.call("GetUser", Needs::Read, request, |r| async move {
            let key = selected(r.user).map_err(|e| (e, None))?;
            let account = self
                .accounts
                .account(&key)
                .await
                .map_err(with_target(&key))?;
            let id = account.id.clone();
            Ok((
                GetUserResponse {
                    user: Some(user(account)),
                },
                Some(id),
            ))
        })
        .await
    }

    async fn list_users(
        &self,
        request: Request<ListUsersRequest>,
    ) -> Result<Response<ListUsersResponse>, Status> {
        self.call("ListUsers", Needs::Read, request, |r| async move {
            let limit = Keyset::limit(r.page_size).map_err(|e| (e, None))?;
            let prefix = r.username_prefix.to_ascii_lowercase();
            if prefix.len() > Username::MAX_CHARS
                || !prefix
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
            {
                let why = "only what a username may hold: letters A-Z, digits, '.', '_', '-'";
                return Err((invalid("username_prefix", why), None));
            }
            let disabled = match DisabledFilter::try_from(r.disabled) {
                Ok(DisabledFilter::Any) => None,
                Ok(DisabledFilter::Disabled) => Some(true),
                Ok(DisabledFilter::Enabled) => Some(false),
                Err(_) => return Err((invalid("disabled", "unknown filter"), None)),
            };
            let after = USERS.after(&r.page_token, |name| Username::parse(name).is_ok());
            let after = after.map_err(|e| (e, None))?;
            let query = PageQuery {
                after,
                prefix,
                disabled,
                // One more than the page: whether there is a next one.
                limit: i64::from(limit) + 1,
            };
            let page = (self.accounts.accounts_page(&query).await).map_err(|e| (e, None))?;
            let (page, next_page_token) = USERS.page(page, limit, |a| &a.username);
            Ok((
                ListUsersResponse {
                    users: page.into_iter().map(user).collect(),
                    next_page_token,
                },
                None,
            ))
        })
        .await
    }

    async fn disable_user(
        &self,
        request: Request<DisableUserRequest>,
    ) -> Result<Response<DisableUserResponse>, Status> {
        self.call("DisableUser", Needs::Change, request, |r| async move {
            let key = selected(r.user).map_err(|e| (e, None))?;
            let reason = r.reason.trim();
            if reason.is_empty() || reason.chars().count() > MAX_REASON_CHARS {
                let why = format!("say why, in 1 to {MAX_REASON_CHARS} characters");
                return Err((invalid("reason", why), None));
            }
            let changed =
                (self.accounts.disable_user(&key, reason).await).map_err(with_target(&key))?;
            if changed.changed {
                self.metrics.disabled.inc();
            }
            let Changed {
                account,
                changed,
                sessions_ended,
            } = changed;
            let id = account.id.clone();
            Ok((
                DisableUserResponse {
                    user: Some(user(account)),
                    changed,
                    sessions_ended: u32::try_from(sessions_ended).unwrap_or(u32::MAX),
                },
                Some(id),
            ))
        })
        .await
    }

    async fn enable_user(
        &self,
        request: Request<EnableUserRequest>,
    ) -> Result<Response<EnableUserResponse>, Status> {
        self.call("EnableUser", Needs::Change, request, |r| async move {
            let key = selected(r.user).map_err(|e| (e, None))?;
            let changed = (self.accounts.enable_user(&key).await).map_err(with_target(&key))?;
            let id = changed.account.id.clone();
            Ok((
                EnableUserResponse {
                    user: Some(user(changed.account)),
                    changed: changed.changed,
                },
                Some(id),
            ))
        })
        .await
    }

    async fn delete_user(
        &self,
        request: Request<DeleteUserRequest>,
    ) -> Result<Response<DeleteUserResponse>, Status> {
        self.call("DeleteUser", Needs::Change, request, |r| async move {
            let key = selected(r.user).map_err(|e| (e, None))?;
            let deleted = (self.accounts.delete_user(&key).await).map_err(with_target(&key))?;
            self.metrics.deleted.inc();
            let id = deleted.account.id.clone();
            Ok((
                DeleteUserResponse {
                    user: Some(user(deleted.account)),
                    sessions_ended: u32::try_from(deleted.sessions_ended).unwrap_or(u32::MAX),
                },
                Some(id),
            ))
        })
        .await
    }

    async fn list_sessions(
        &self,
        request: Request<ListSessionsRequest>,
    ) -> Result<Response<ListSessionsResponse>, Status> {
        self.call("ListSessions", Needs::Read, request, |r| async move {
            let key = selected(r.user).map_err(|e| (e, None))?;
            let account = self
                .accounts
                .account(&key)
                .await
                .map_err(with_target(&key))?;
            let target = Some(account.id.clone());
            let sessions =
                (self.accounts.sessions_of(&account.id).await).map_err(|e| (e, target.clone()))?;
            Ok((
                ListSessionsResponse {
                    sessions: sessions.into_iter().map(session).collect(),
                },
                Some(account.id),
            ))
        })
        .await
    }

    async fn end_sessions(
        &self,
        request: Request<EndSessionsRequest>,
    ) -> Result<Response<EndSessionsResponse>, Status> {
        self.call("EndSessions", Needs::Change, request, |r| async move {
            let key = selected(r.user).map_err(|e| (e, None))?;
            if r.session_ids.len() > MAX_SESSIONS as usize {
                let why = format!("at most {MAX_SESSIONS} at once");
                return Err((invalid("session_ids", why), None));
            }
            if r.session_ids
                .iter()
                .any(|id| id.is_empty() || id.len() > 64)
            {
                return Err((invalid("session_ids", "each 1 to 64 characters"), None));
            }
            let account = self
                .accounts
                .account(&key)
                .await
                .map_err(with_target(&key))?;
            let target = Some(account.id.clone());
            let ended = (self
                .accounts
                .end_sessions_of(&account.id, r.session_ids)
                .await)
                .map_err(|e| (e, target.clone()))?;
            Ok((
                EndSessionsResponse {
                    sessions_ended: u32::try_from(ended).unwrap_or(u32::MAX),
                },
                Some(account.id),
            ))
        })
        .await
    }

    async fn set_password(
        &self,
        request: Request<SetPasswordRequest>,
    ) -> Result<Response<SetPasswordResponse>, Status> {
        // The caller's deadline is real time (the hash queue drops what waited past it).
        let deadline = rpc::grpc_timeout(request.metadata().as_ref())
            .map(|timeout| std::time::Instant::now() + timeout);
        self.call("SetPassword", Needs::Change, request, |r| async move {
            let key = selected(r.user).map_err(|e| (e, None))?;
            let password = Password::parse(&r.new_password)
                .map_err(|why| (invalid("new_password", why), None))?;
            let account = self
                .accounts
                .account(&key)
                .await
                .map_err(with_target(&key))?;
            let target = Some(account.id.clone());
            let username = Username::from_store(account.username);
            (self.blocklist)
                .check_new_password("new_password", &username, &password)
                .map_err(|e| (e, target.clone()))?;
            let ended = self
                .accounts
                .set_password(&account.id, password, r.keep_sessions, deadline)
                .await
                .map_err(|e| (e, target.clone()))?;
            Ok((
                SetPasswordResponse {
                    sessions_ended: u32::try_from(ended).unwrap_or(u32::MAX),
                },
                target,
            ))
        })
        .await
    }

    type WatchEventsStream = events::EventStream;

    async fn watch_events(
        &self,
        request: Request<crate::pb::admin::WatchEventsRequest>,
    ) -> Result<Response<Self::WatchEventsStream>, Status> {
        self.watch(request).await
    }

    type ImportUsersStream = import::ImportStream;

    async fn import_users(
        &self,
        request: Request<tonic::Streaming<crate::pb::admin::ImportUsersRequest>>,
    ) -> Result<Response<Self::ImportUsersStream>, Status> {
        self.import(request).await
    }

    async fn create_service_account(
        &self,
        request: Request<crate::pb::admin::CreateServiceAccountRequest>,
    ) -> Result<Response<crate::pb::admin::CreateServiceAccountResponse>, Status> {
        self.create_service_account_call(request).await
    }

    async fn get_service_account(
        &self,
        request: Request<crate::pb::admin::GetServiceAccountRequest>,
    ) -> Result<Response<crate::pb::admin::GetServiceAccountResponse>, Status> {
        self.get_service_account_call(request).await
    }

    async fn list_service_accounts(
        &self,
        request: Request<crate::pb::admin::ListServiceAccountsRequest>,
    ) -> Result<Response<crate::pb::admin::ListServiceAccountsResponse>, Status> {
        self.list_service_accounts_call(request).await
    }

    async fn disable_service_account(
        &self,
        request: Request<crate::pb::admin::DisableServiceAccountRequest>,
    ) -> Result<Response<crate::pb::admin::DisableServiceAccountResponse>, Status> {
        self.disable_service_account_call(request).await
    }

    async fn delete_service_account(
        &self,
        request: Request<crate::pb::admin::DeleteServiceAccountRequest>,
    ) -> Result<Response<crate::pb::admin::DeleteServiceAccountResponse>, Status> {
        self.delete_service_account_call(request).await
    }

    async fn add_service_credential(
        &self,
        request: Request<crate::pb::admin::AddServiceCredentialRequest>,
    ) -> Result<Response<crate::pb::admin::AddServiceCredentialResponse>, Status> {
        self.add_service_credential_call(request).await
    }

    async fn remove_service_credential(
        &self,
        request: Request<crate::pb::admin::RemoveServiceCredentialRequest>,
    ) -> Result<Response<crate::pb::admin::RemoveServiceCredentialResponse>, Status> {
        self.remove_service_credential_call(request).await
    }

    async fn remove_second_factors(
        &self,
        request: Request<RemoveSecondFactorsRequest>,
    ) -> Result<Response<RemoveSecondFactorsResponse>, Status> {
        let caller = self.caller(&request);
        self.call(
            "RemoveSecondFactors",
            Needs::Change,
            request,
            |r| async move {
                let key = selected(r.user).map_err(|e| (e, None))?;
                let (account, changed) = (self.accounts.remove_second_factors(&key, &caller).await)
                    .map_err(with_target(&key))?;
                let id = account.id.clone();
                Ok((
                    RemoveSecondFactorsResponse {
                        user: Some(user(account)),
                        changed,
                    },
                    Some(id),
                ))
            },
        )
        .await
    }
}

/// Unix milliseconds of `at`, for tests that compare timestamps.
#[cfg(test)]
fn millis_of(at: std::time::SystemTime) -> i64 {
    use std::time::UNIX_EPOCH;
    at.duration_since(UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_budget_refills_at_its_rate() {
        let start = crate::clock::Clock::now(&crate::clock::ManualClock::new());
        let mut budget = Budget::new(2, start);
        assert!(budget.take(start).is_ok());
        assert!(budget.take(start).is_ok());
        let wait = budget.take(start).unwrap_err();
        assert_eq!(wait, Duration::from_millis(500));
        assert!(budget.take(start + Duration::from_millis(500)).is_ok());
        assert!(budget.take(start + Duration::from_millis(500)).is_err());
    }

    #[test]
    fn timestamps_keep_milliseconds() {
        let now = std::time::UNIX_EPOCH + Duration::from_millis(1_765_000_000_123);
        let ms = millis_of(now);
        let t = timestamp(ms);
        assert_eq!(t.seconds * 1000 + i64::from(t.nanos / 1_000_000), ms);
        assert_eq!(timestamp(-1).seconds, -1);
        assert_eq!(timestamp(-1).nanos, 999_000_000);
    }

    #[test]
    fn a_selector_names_one_user() {
        assert_eq!(
            selected(Some(UserSelector {
                selector: Some(Selector::Username("Alice".into()))
            }))
            .unwrap(),
            AccountKey::Username("alice".into())
        );
        assert!(selected(None).is_err());
        assert!(
            selected(Some(UserSelector {
                selector: Some(Selector::UserId(String::new()))
            }))
            .is_err()
        );
    }
}
