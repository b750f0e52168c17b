//! One request of the load: built from the fixtures, sent with its deadline over
//! gRPC or HTTP/1.1 (a worker's [`Client`]), its outcome classified, and recorded in
//! a shard of the recorder ([`Shared`]).
//!
//! It decides nothing about when a request goes out, or whether it is warm-up or
//! measured: that is the loops' (`loops`).

use super::{
    check::CheckClient,
    forwarded::stamp,
    http::{self, Connection, Form},
    setup::{Fixtures, PASSWORD},
    status::{Failure, classify, http_code},
};
use crate::{
    Protocol,
    pb::{
        LoginRequest, RefreshRequest, RegisterRequest, ValidateTokenRequest,
        auth_service_client::AuthServiceClient,
    },
    progress::Counters,
    report::{Outcome, Recorder},
    scenario::{Descriptors, Operation},
};
use bytes::Bytes;
use envoy_types::pb::envoy::{
    extensions::common::ratelimit::v3::{RateLimitDescriptor, rate_limit_descriptor::Entry},
    service::ratelimit::v3::{
        RateLimitRequest, rate_limit_response::Code as RateLimitCode,
        rate_limit_service_client::RateLimitServiceClient,
    },
};
use std::{
    sync::{Arc, Mutex, atomic::Ordering},
    time::{Duration, Instant},
};
use tonic::{
    Code, Request, Status,
    metadata::{Ascii, MetadataValue},
    transport::Channel,
};
use tonic_health::pb::{HealthCheckRequest, health_client::HealthClient};
use tonic_types::StatusExt as _;

/// What one request came to.
pub(super) struct Performed {
    /// The outcome, and what lay behind a client-side error.
    pub(super) result: (Outcome, Option<Failure>),
    /// The server's RetryInfo delay (over HTTP: its Retry-After), when it refused
    /// for being full.
    pub(super) retry_after: Option<Duration>,
}

/// The gRPC clients of one connection; a clone shares the connection.
#[derive(Clone)]
pub(super) struct GrpcClients {
    pub(super) auth: AuthServiceClient<Channel>,
    pub(super) health: HealthClient<Channel>,
    pub(super) rate_limit: RateLimitServiceClient<Channel>,
    /// Envoy's external authorization, served by authd beside AuthService.
    pub(super) authz: CheckClient,
}

impl GrpcClients {
    pub(super) fn new(channel: Channel) -> Self {
        Self {
            auth: AuthServiceClient::new(channel.clone()),
            health: HealthClient::new(channel.clone()),
            rate_limit: RateLimitServiceClient::new(channel.clone()),
            authz: CheckClient::new(channel),
        }
    }
}

/// How one worker sends its requests.
// One per worker, moved once into its task: the size of the gRPC variant costs nothing.
#[allow(clippy::large_enum_variant)]
pub(super) enum Client {
    /// Over a gRPC connection that many workers share (HTTP/2 multiplexes).
    Grpc(GrpcClients),
    /// Over an HTTP/1.1 connection of its own: it carries one request at a time.
    Http(Connection),
}

/// The state every request of a run shares.
pub(super) struct Shared {
    /// gRPC: the clients of each connection (none over HTTP/1.1, where each worker
    /// owns its connection).
    pub(super) grpc: Vec<GrpcClients>,
    pub(super) wheel: Vec<Operation>,
    pub(super) fixtures: Fixtures,
    pub(super) timeout: Duration,
    pub(super) give_up: Duration,
    pub(super) recorders: Vec<Mutex<Recorder>>,
    pub(super) counters: Arc<Counters>,
    pub(super) backoff: bool,
    /// Over HTTP/1.1: the report's service, or which of authd's HTTP forms.
    pub(super) protocol: Protocol,
    /// What ratelimit requests ask, and over how many keys.
    pub(super) descriptors: Descriptors,
    pub(super) keys: usize,
    /// `--introspect`: checks are introspections, with this `authorization` header.
    pub(super) introspection: Option<::http::HeaderValue>,
}

impl Shared {
    /// Sends one request of `op` (using `pick` to choose a user or token) and waits
    /// for its outcome. Returns the client-side error, if any, for the report.
    pub(super) async fn perform(
        &self,
        op: Operation,
        pick: usize,
        client: &mut Client,
    ) -> Performed {
        match client {
            Client::Grpc(clients) => self.perform_grpc(op, pick, clients).await,
            Client::Http(connection) => match self.protocol {
                // A grant in JSON is the token endpoint's (a form in, JSON out).
                Protocol::Json if op == Operation::Grant => {
                    self.perform_http(op, pick, connection).await
                }
                Protocol::Json => self.perform_form(Form::Connect, op, pick, connection).await,
                Protocol::GrpcWeb => self.perform_form(Form::GrpcWeb, op, pick, connection).await,
                _ => self.perform_http(op, pick, connection).await,
            },
        }
    }

    async fn perform_grpc(
        &self,
        op: Operation,
        pick: usize,
        clients: &mut GrpcClients,
    ) -> Performed {
        let GrpcClients {
            auth,
            health,
            rate_limit,
            authz,
        } = clients;
        let fixtures = &self.fixtures;
        // With --forwarded-for, the address of the user, the registration or the pick.
        let timeout = self.timeout;
        let forwarded = |k| fixtures.forwarded.grpc(k);
        let call = async {
            match op {
                Operation::Health => {
                    let message = HealthCheckRequest {
                        service: String::new(),
                    };
                    health
                        .check(request(message, timeout, forwarded(pick)))
                        .await
                        .map(drop)
                }
                Operation::Register => {
                    let (username, n) = fixtures.new_username();
                    let message = RegisterRequest {
                        username,
                        password: PASSWORD.into(),
                    };
                    auth.register(request(message, timeout, forwarded(n)))
                        .await
                        .map(drop)
                }
                Operation::Login => {
                    let user = pick % fixtures.users.len();
                    let message = LoginRequest {
                        username: fixtures.users[user].clone(),
                        password: PASSWORD.into(),
                    };
                    auth.login(request(message, timeout, forwarded(user)))
                        .await
                        .map(drop)
                }
                Operation::Validate => {
                    let user = pick % fixtures.tokens.len();
                    let message = ValidateTokenRequest {
                        access_token: fixtures.tokens[user].clone(),
                        ..Default::default()
                    };
                    auth.validate_token(request(message, timeout, forwarded(user)))
                        .await
                        .map(drop)
                }
                Operation::Check => {
                    let user = pick % fixtures.checks.len();
                    let prepared = fixtures.checks[user].clone();
                    let answer = authz
                        .check(request(prepared, timeout, forwarded(user)))
                        .await?
                        .into_inner();
                    // The call is OK whatever the decision: a refusal is the decision's code.
                    match answer.code() {
                        0 => Ok(()),
                        code => Err(Status::new(Code::from(code), "refused by the check")),
                    }
                }
                Operation::Refresh => {
                    let user = pick % fixtures.refresh_tokens.len();
                    let mut refresh_token = fixtures.refresh_tokens[user].lock().await;
                    let message = RefreshRequest {
                        refresh_token: refresh_token.clone(),
                    };
                    auth.refresh(request(message, timeout, forwarded(user)))
                        .await
                        .map(|r| *refresh_token = r.into_inner().refresh_token)
                }
                Operation::Grant => {
                    let client = &fixtures.clients[pick % fixtures.clients.len()];
                    auth.issue_service_token(request(client.grant(None), timeout, forwarded(pick)))
                        .await
                        .map(drop)
                }
                Operation::Exchange => {
                    let user = pick % fixtures.tokens.len();
                    let client = &fixtures.clients[pick % fixtures.clients.len()];
                    let message = client.grant(Some(&fixtures.tokens[user]));
                    auth.issue_service_token(request(message, timeout, forwarded(user)))
                        .await
                        .map(drop)
                }
                Operation::RateLimit => {
                    let message = self.rate_limit_request(pick);
                    let answer = rate_limit
                        .should_rate_limit(request(message, timeout, forwarded(pick)))
                        .await?
                        .into_inner();
                    if answer.overall_code == RateLimitCode::OverLimit as i32 {
                        Err(Status::resource_exhausted("OVER_LIMIT"))
                    } else {
                        Ok(())
                    }
                }
                Operation::Event => {
                    unreachable!("the events scenario streams; it sends no requests")
                }
            }
        };
        let mut retry_after = None;
        let result = match tokio::time::timeout(self.give_up, call).await {
            Ok(Ok(())) => (Outcome::Status(Code::Ok), None),
            Ok(Err(status)) => match classify(&status) {
                outcome @ Outcome::Status(code) => {
                    if code == Code::ResourceExhausted {
                        retry_after = status
                            .get_error_details()
                            .retry_info()
                            .and_then(|info| info.retry_delay);
                    }
                    (outcome, None)
                }
                outcome => (outcome, Some(Failure::Grpc(status))),
            },
            Err(_) => (
                Outcome::Timeout,
                Some(Failure::Grpc(Status::deadline_exceeded(format!(
                    "no answer within {:?} (deadline {:?})",
                    self.give_up, self.timeout
                )))),
            ),
        };
        Performed {
            result,
            retry_after,
        }
    }

    /// The ShouldRateLimit request of pick `pick`: `{n}` is the pick modulo the keys.
    fn rate_limit_request(&self, pick: usize) -> RateLimitRequest {
        let n = pick % self.keys;
        RateLimitRequest {
            domain: self.descriptors.domain.clone(),
            descriptors: (self.descriptors.entries(n))
                .map(|entries| RateLimitDescriptor {
                    entries: entries
                        .map(|(key, value)| Entry {
                            key: key.to_owned(),
                            value,
                        })
                        .collect(),
                    ..Default::default()
                })
                .collect(),
            hits_addend: 0,
        }
    }

    /// `POST /register` or `POST /login` on the worker's own connection. No server
    /// deadline travels with an HTTP request: the client gives up at the timeout
    /// itself, and closes the connection, whose answer may still come.
    async fn perform_http(
        &self,
        op: Operation,
        pick: usize,
        connection: &mut Connection,
    ) -> Performed {
        let fixtures = &self.fixtures;
        // With --forwarded-for, the address of the user, or of the registration.
        let (path, body, k) = match op {
            Operation::Register => {
                let (username, n) = fixtures.new_username();
                ("/register", http::credentials(&username), n)
            }
            Operation::Login => {
                let user = pick % fixtures.users.len();
                ("/login", http::credentials(&fixtures.users[user]), user)
            }
            // authd's forward-auth port (--forward-auth): 200 allowed, 401/403 refused.
            // Or --introspect: 200 (active or not), 401 for a wrong client.
            Operation::Check if self.introspection.is_some() => (
                "/oauth2/introspect",
                Bytes::new(),
                pick % fixtures.tokens.len(),
            ),
            Operation::Check => ("/forward-auth", Bytes::new(), pick % fixtures.tokens.len()),
            // --protocol json: the token endpoint, client credentials with HTTP Basic.
            Operation::Grant => ("/oauth2/token", Bytes::new(), pick),
            _ => unreachable!("Plan::check refuses {op} over HTTP"),
        };
        let forwarded = fixtures.forwarded.http(k);
        let exchange = async {
            match op {
                Operation::Check => {
                    let token = &fixtures.tokens[k];
                    match &self.introspection {
                        Some(client) => {
                            let fields = [("token", token.as_str())];
                            (connection.post_form(path, &fields, client, forwarded)).await
                        }
                        None => connection.get_bearer(path, token, forwarded).await,
                    }
                }
                Operation::Grant => {
                    let client = &fixtures.clients[k % fixtures.clients.len()];
                    let fields = client.token_endpoint_form();
                    (connection.post_form(path, &fields, client.basic(), forwarded)).await
                }
                _ => connection.post(path, body, forwarded).await,
            }
        };
        let answered = tokio::time::timeout(self.timeout, exchange).await;
        let mut retry_after = None;
        let result = match answered {
            Ok(Ok(answer)) => {
                let code = http_code(answer.status);
                if matches!(code, Code::ResourceExhausted | Code::Unavailable) {
                    retry_after = answer.retry_after;
                }
                (Outcome::Status(code), None)
            }
            Ok(Err(error)) => (Outcome::Connection, Some(Failure::Http(error))),
            Err(_) => {
                connection.reset();
                (
                    Outcome::Timeout,
                    Some(Failure::Http(anyhow::anyhow!(
                        "{} {path}: no answer within {:?}",
                        if op == Operation::Check && self.introspection.is_none() {
                            "GET"
                        } else {
                            "POST"
                        },
                        self.timeout
                    ))),
                )
            }
        };
        Performed {
            result,
            retry_after,
        }
    }

    /// Register, Login or ValidateToken in one of authd's HTTP forms on the worker's
    /// own connection, its deadline in the request as over gRPC. A gRPC-Web answer
    /// carries its gRPC code; a JSON one's HTTP status stands for it (Connect's table
    /// is [`http_code`]'s).
    async fn perform_form(
        &self,
        form: Form,
        op: Operation,
        pick: usize,
        connection: &mut Connection,
    ) -> Performed {
        let fixtures = &self.fixtures;
        let (path, body, k) = match op {
            Operation::Register => {
                let (username, n) = fixtures.new_username();
                let body = form.body(
                    || http::credentials(&username),
                    || RegisterRequest {
                        username: username.clone(),
                        password: PASSWORD.into(),
                    },
                );
                ("/auth.v1.AuthService/Register", body, n)
            }
            Operation::Login => {
                let user = pick % fixtures.users.len();
                let username = &fixtures.users[user];
                let body = form.body(
                    || http::credentials(username),
                    || LoginRequest {
                        username: username.clone(),
                        password: PASSWORD.into(),
                    },
                );
                ("/auth.v1.AuthService/Login", body, user)
            }
            Operation::Validate => {
                let user = pick % fixtures.tokens.len();
                let token = &fixtures.tokens[user];
                let body = form.body(
                    || http::access_token(token),
                    || ValidateTokenRequest {
                        access_token: token.clone(),
                        ..Default::default()
                    },
                );
                ("/auth.v1.AuthService/ValidateToken", body, user)
            }
            _ => unreachable!("Plan::check refuses {op} over authd's HTTP forms"),
        };
        let forwarded = fixtures.forwarded.http(k);
        let exchange = connection.post_as(form, path, body, self.timeout, forwarded);
        let answered = tokio::time::timeout(self.give_up, exchange).await;
        let mut retry_after = None;
        let result = match answered {
            Ok(Ok(answer)) => {
                let code = answer
                    .grpc_status
                    .unwrap_or_else(|| http_code(answer.status));
                if matches!(code, Code::ResourceExhausted | Code::Unavailable) {
                    retry_after = answer.retry_after;
                }
                (Outcome::Status(code), None)
            }
            Ok(Err(error)) => (Outcome::Connection, Some(Failure::Http(error))),
            Err(_) => {
                connection.reset();
                (
                    Outcome::Timeout,
                    Some(Failure::Http(anyhow::anyhow!(
                        "POST {path}: no answer within {:?} (deadline {:?})",
                        self.give_up,
                        self.timeout
                    ))),
                )
            }
        };
        Performed {
            result,
            retry_after,
        }
    }

    /// Records one measured request in shard `shard`.
    pub(super) fn record(
        &self,
        shard: usize,
        op: Operation,
        (outcome, error): (Outcome, Option<Failure>),
        sent: Instant,
        done: Instant,
    ) {
        if outcome != Outcome::Status(Code::Ok) {
            self.counters.failed.fetch_add(1, Ordering::Relaxed);
        }
        let mut recorder = lock(&self.recorders[shard % self.recorders.len()]);
        recorder.record(op, outcome, sent, done);
        if let Some(error) = error {
            recorder.note_client_error(|| error.describe());
        }
        drop(recorder);
        // Counted last, so a progress reading never runs ahead of the recorders.
        self.counters.done.fetch_add(1, Ordering::Relaxed);
    }
}

/// A gRPC request with its deadline and, with `--forwarded-for`, its
/// `x-forwarded-for`.
fn request<T>(
    message: T,
    timeout: Duration,
    forwarded: Option<&MetadataValue<Ascii>>,
) -> Request<T> {
    let mut request = Request::new(message);
    request.set_timeout(timeout);
    stamp(&mut request, forwarded);
    request
}

/// Locks a recorder shard. A panic while holding it can only come from a bug in the
/// recorder; the counts are still the best data there is, so go on with them.
pub(super) fn lock(shard: &Mutex<Recorder>) -> std::sync::MutexGuard<'_, Recorder> {
    shard
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}
