//! The gRPC face of [`Accounts`]: proto messages in, domain types through, and the
//! one place where an [`Error`] becomes a `Status` ([`status`]).
//!
//! Handlers parse their request into domain types (reporting every bad field in a
//! `google.rpc.BadRequest`), call the use case, and map the outcome. Internal causes
//! go to the log; the client only ever sees a generic message for them.

use crate::{
    accounts::Accounts,
    admission::Deadline,
    credentials::{Password, Username},
    error::{Error, FieldViolation},
    pb::{
        LoginRequest, LoginResponse, RegisterRequest, RegisterResponse, ValidateTokenRequest,
        ValidateTokenResponse, auth_service_server::AuthService,
    },
    trace::{RequestId, UserId},
};
use std::{future::Future, sync::Arc, time::Instant};
use tonic::{Code, Request, Response, Status, metadata::MetadataValue};
use tonic_types::{ErrorDetails, StatusExt};

/// Requests larger than this are refused by the decoder (a login is well under 2 KiB).
pub const MAX_MESSAGE_BYTES: usize = 4 * 1024;

/// Maps an error to the status the client sees. The single table of the service.
pub fn status(err: &Error) -> Status {
    match err {
        Error::InvalidArgument(violations) => {
            let mut details = ErrorDetails::new();
            for v in violations {
                details.add_bad_request_violation(v.field, v.description.clone());
            }
            Status::with_error_details(Code::InvalidArgument, err.to_string(), details)
        }
        Error::AlreadyExists => Status::already_exists(err.to_string()),
        Error::InvalidCredentials | Error::InvalidToken(_) => {
            Status::unauthenticated(err.to_string())
        }
        Error::Overloaded { retry_after, .. } => {
            let mut status = Status::with_error_details(
                Code::ResourceExhausted,
                format!("{err}; retry later"),
                ErrorDetails::with_retry_info(Some(*retry_after)),
            );
            let secs = retry_after.as_secs_f64().ceil().max(1.0) as u64;
            status
                .metadata_mut()
                .insert("retry-after", MetadataValue::from(secs));
            status
        }
        Error::RateLimited {
            violations,
            limit,
            retry_after,
        } => {
            let mut details = ErrorDetails::with_retry_info(Some(*retry_after));
            for v in violations {
                details.add_quota_failure_violation(v.subject.clone(), v.description.clone());
            }
            let mut status =
                Status::with_error_details(Code::ResourceExhausted, err.to_string(), details);
            // Whole seconds, rounded up: waiting that long finds a slot free.
            let secs = retry_after.as_secs() + u64::from(retry_after.subsec_nanos() > 0);
            let metadata = status.metadata_mut();
            metadata.insert("retry-after", MetadataValue::from(secs.max(1)));
            metadata.insert("ratelimit-limit", MetadataValue::from(*limit));
            metadata.insert("ratelimit-remaining", MetadataValue::from(0u32));
            metadata.insert("ratelimit-reset", MetadataValue::from(secs));
            status
        }
        Error::DeadlineExceeded => Status::deadline_exceeded(err.to_string()),
        Error::Unavailable(_) => Status::unavailable(err.to_string()),
        Error::Internal(_) => Status::internal("internal error"),
    }
}

/// `auth.v1.AuthService` backed by [`Accounts`].
pub struct AuthApi {
    accounts: Arc<Accounts>,
}

impl AuthApi {
    pub fn new(accounts: Arc<Accounts>) -> Self {
        Self { accounts }
    }
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
            match &err {
                Error::Internal(cause) => tracing::error!(
                    method,
                    request_id,
                    error = format!("{cause:#}"),
                    "request failed"
                ),
                Error::Unavailable(_) => {
                    tracing::warn!(method, request_id, error = %err, "request failed")
                }
                _ => {}
            }
            Err(status(&err))
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
                expires_at: Some(session.expires_at.into()),
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
                expires_at: Some(token.expires_at.into()),
            })
        };
        respond("ValidateToken", request_id, work, |r| &r.user_id).await
    }
}
