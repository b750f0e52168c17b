//! The gRPC face of [`Accounts`]: proto messages in, domain types through, domain
//! errors out (each [`Error`] maps itself to a `Status`, in `error.rs`).
//!
//! Handlers parse their request into domain types (reporting every bad field in a
//! `google.rpc.BadRequest`), check a new password against the blocklist (before any
//! store or hashing work), call the use case, and map the outcome. Internal causes
//! go to the log; the client only ever sees a generic message for them. So does the
//! reason a token was refused: one message for all, the reason in the log and metrics.

use crate::{
    accounts::Accounts,
    blocklist::{Blocklist, Refusal},
    credentials::{Password, Username},
    error::{Error, FieldViolation},
    pb::{
        LoginRequest, LoginResponse, RegisterRequest, RegisterResponse, ValidateTokenRequest,
        ValidateTokenResponse, auth_service_server::AuthService,
    },
    rpc::{Deadline, RequestId, UserId},
};
use std::{
    future::Future,
    sync::Arc,
    time::{Instant, SystemTime, UNIX_EPOCH},
};
use tonic::{Request, Response, Status};

/// Requests larger than this are refused by the decoder (a login is well under 2 KiB).
pub const MAX_MESSAGE_BYTES: usize = 4 * 1024;

/// `auth.v1.AuthService` backed by [`Accounts`].
pub struct AuthApi {
    accounts: Arc<Accounts>,
    blocklist: Arc<Blocklist>,
}

impl AuthApi {
    pub(crate) fn new(accounts: Arc<Accounts>, blocklist: Arc<Blocklist>) -> Self {
        Self {
            accounts,
            blocklist,
        }
    }
}

/// Refuses a new password (in the request field `field`) that the blocklist refuses:
/// called by every RPC that sets one, before any store or hashing work.
fn check_new_password(
    blocklist: &Blocklist,
    field: &'static str,
    username: &Username,
    password: &Password,
) -> Result<(), Error> {
    blocklist
        .check(password, username)
        .map_err(|refusal: Refusal| {
            Error::InvalidArgument(vec![FieldViolation {
                field,
                description: refusal.description().into(),
            }])
        })
}

fn credentials(username: &str, password: &str) -> Result<(Username, Password), Error> {
    let username = Username::parse(username);
    let password = Password::parse(password);
    let mut violations = Vec::new();
    if let Err(description) = &username {
        violations.push(FieldViolation {
            field: "username",
            description: description.clone(),
        });
    }
    if let Err(description) = &password {
        violations.push(FieldViolation {
            field: "password",
            description: description.clone(),
        });
    }
    match (username, password) {
        (Ok(u), Ok(p)) => Ok((u, p)),
        _ => Err(Error::InvalidArgument(violations)),
    }
}

/// A `google.protobuf.Timestamp`, saturating where the platform's time could exceed
/// its range (tokens are bounded to year 9999 long before, see `token`).
fn timestamp(at: SystemTime) -> prost_types::Timestamp {
    let (seconds, nanos) = match at.duration_since(UNIX_EPOCH) {
        Ok(after) => (
            i64::try_from(after.as_secs()).unwrap_or(i64::MAX),
            after.subsec_nanos(),
        ),
        // Before 1970: no token of ours; the epoch is as good an answer as any.
        Err(_) => (0, 0),
    };
    prost_types::Timestamp {
        seconds,
        nanos: i32::try_from(nanos).unwrap_or(0),
    }
}

fn deadline<T>(request: &Request<T>) -> Option<Instant> {
    request.extensions().get::<Deadline>().map(|d| d.0)
}

fn request_id<T>(request: &Request<T>) -> Option<RequestId> {
    request.extensions().get::<RequestId>().cloned()
}

/// Runs a handler body and maps its outcome: a success carries the user it acted
/// for (a [`UserId`] in the response extensions, for the trace layer's log line),
/// an error becomes its status. The trace layer logs every request once; only the
/// causes it cannot see (internal errors, an unreachable database) are logged here.
async fn respond<T>(
    method: &'static str,
    request_id: Option<RequestId>,
    work: impl Future<Output = Result<T, Error>>,
    user_id: fn(&T) -> &str,
) -> Result<Response<T>, Status> {
    match work.await {
        Ok(body) => {
            let user = UserId(user_id(&body).to_owned());
            let mut response = Response::new(body);
            response.extensions_mut().insert(user);
            Ok(response)
        }
        Err(err) => {
            let request_id = request_id.as_ref().map(RequestId::as_str);
            // The request's trace, when it is traced (the context of its server span).
            let trace_id = crate::otel::current_trace_id();
            let trace_id = trace_id.as_deref();
            match &err {
                Error::Internal(cause) => tracing::error!(
                    method,
                    request_id,
                    trace_id,
                    error = format!("{cause:#}"),
                    "request failed"
                ),
                Error::Unavailable(_) => {
                    tracing::warn!(method, request_id, trace_id, error = %err, "request failed")
                }
                Error::InvalidToken(reason) => {
                    tracing::info!(
                        method,
                        request_id,
                        trace_id,
                        reason = reason.label(),
                        "token refused"
                    )
                }
                _ => {}
            }
            Err(err.to_status())
        }
    }
}

#[tonic::async_trait]
impl AuthService for AuthApi {
    async fn register(
        &self,
        request: Request<RegisterRequest>,
    ) -> Result<Response<RegisterResponse>, Status> {
        let (deadline, request_id) = (deadline(&request), request_id(&request));
        let req = request.into_inner();
        let work = async {
            let (username, password) = credentials(&req.username, &req.password)?;
            check_new_password(&self.blocklist, "password", &username, &password)?;
            let user_id = self.accounts.register(username, password, deadline).await?;
            Ok(RegisterResponse { user_id })
        };
        respond("Register", request_id, work, |r| &r.user_id).await
    }

    async fn login(
        &self,
        request: Request<LoginRequest>,
    ) -> Result<Response<LoginResponse>, Status> {
        let (deadline, request_id) = (deadline(&request), request_id(&request));
        let req = request.into_inner();
        let work = async {
            let (username, password) = credentials(&req.username, &req.password)?;
            let session = self.accounts.login(username, password, deadline).await?;
            Ok(LoginResponse {
                access_token: session.access_token,
                token_type: "Bearer".into(),
                expires_at: Some(timestamp(session.expires_at)),
                user_id: session.user_id,
            })
        };
        respond("Login", request_id, work, |r| &r.user_id).await
    }

    async fn validate_token(
        &self,
        request: Request<ValidateTokenRequest>,
    ) -> Result<Response<ValidateTokenResponse>, Status> {
        let request_id = request_id(&request);
        let req = request.into_inner();
        let work = async {
            if req.access_token.is_empty() {
                return Err(Error::InvalidArgument(vec![FieldViolation {
                    field: "access_token",
                    description: "must not be empty".into(),
                }]));
            }
            let token = self.accounts.validate(&req.access_token)?;
            Ok(ValidateTokenResponse {
                user_id: token.user_id,
                username: token.username,
                expires_at: Some(timestamp(token.expires_at)),
            })
        };
        respond("ValidateToken", request_id, work, |r| &r.user_id).await
    }
}
