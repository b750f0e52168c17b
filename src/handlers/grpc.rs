//! The gRPC face of [`Accounts`]: proto messages in, domain types through, domain
//! errors out (each [`Error`] maps itself to a `Status`, in `error.rs`).
//!
//! Handlers parse their request into domain types (reporting every bad field in a
//! `google.rpc.BadRequest`), check a new password against the blocklist (before any
//! store or hashing work), call the use case, and map the outcome. Internal causes
//! go to the log; the client only ever sees a generic message for them. So does the
//! reason a token was refused: one message for all, the reason in the log and metrics.

use crate::{
    accounts::{Accounts, LoginAnswer},
    audit::Caller,
    blocklist::Blocklist,
    credentials::{Password, PresentedPassword, Username},
    error::{Error, FieldViolation},
    pb::{
        BeginTotpEnrollmentRequest, BeginTotpEnrollmentResponse, ChangePasswordRequest,
        ChangePasswordResponse, CompleteLoginRequest, CompleteLoginResponse,
        CompletePasswordResetRequest, CompletePasswordResetResponse, ConfirmTotpEnrollmentRequest,
        ConfirmTotpEnrollmentResponse, DisableTotpRequest, DisableTotpResponse,
        GetSigningKeysRequest, GetSigningKeysResponse, IssueServiceTokenRequest,
        IssueServiceTokenResponse, LoginRequest, LoginResponse, LogoutRequest, LogoutResponse,
        PublicKey, RefreshRequest, RefreshResponse, RegenerateRecoveryCodesRequest,
        RegenerateRecoveryCodesResponse, RegisterRequest, RegisterResponse,
        RequestPasswordResetRequest, RequestPasswordResetResponse, ValidateTokenRequest,
        ValidateTokenResponse, auth_service_server::AuthService,
    },
    rpc::{self, Deadline, RequestId, UserId},
    second_factor::Code,
    token,
};
use std::{
    future::Future,
    sync::Arc,
    time::{Instant, SystemTime, UNIX_EPOCH},
};
use tonic::{Request, Response, Status};

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

    /// Who sent `request`: its id, and the client the rate limiter's `peer` key counts.
    fn caller<T>(&self, request: &Request<T>) -> Caller {
        Caller {
            request_id: request_id(request).map(|id| id.as_str().to_owned()),
            client: rpc::client_ip(request.extensions()),
            identity: rpc::client_identity(request.extensions()).map(|i| i.as_str().to_owned()),
            trace_id: crate::otel::current_trace_id(),
        }
    }
}

fn credentials(username: &str, password: &str) -> Result<(Username, Password), Error> {
    let mut fields = Fields::default();
    let username = fields.take("username", Username::parse(username));
    let password = fields.take("password", Password::parse(password));
    fields.done()?;
    Ok((username.expect("checked"), password.expect("checked")))
}

/// Login's fields: the password as presented, held to the byte bound only (the
/// rules are for new passwords; an imported one may be shorter).
fn login_credentials(
    username: &str,
    password: &str,
) -> Result<(Username, PresentedPassword), Error> {
    let mut fields = Fields::default();
    let username = fields.take("username", Username::parse(username));
    let password = fields.take("password", PresentedPassword::parse(password));
    fields.done()?;
    Ok((username.expect("checked"), password.expect("checked")))
}

/// The field violations of a request, gathered so that every bad field is
/// reported at once.
#[derive(Default)]
struct Fields(Vec<FieldViolation>);

impl Fields {
    /// The value of a parsed field, or `None` with its violation noted.
    fn take<T>(&mut self, field: &'static str, parsed: Result<T, String>) -> Option<T> {
        parsed
            .map_err(|description| self.0.push(FieldViolation { field, description }))
            .ok()
    }

    /// `INVALID_ARGUMENT` naming every bad field, if there is one.
    fn done(self) -> Result<(), Error> {
        if self.0.is_empty() {
            Ok(())
        } else {
            Err(Error::InvalidArgument(self.0))
        }
    }
}

/// Refuses an empty token field.
fn required(field: &'static str, value: &str) -> Result<(), Error> {
    if value.is_empty() {
        return Err(Error::InvalidArgument(vec![FieldViolation {
            field,
            description: "must not be empty".into(),
        }]));
    }
    Ok(())
}

/// A code field: six digits or a recovery code.
fn code(field: &'static str, value: &str) -> Result<Code, Error> {
    required(field, value)?;
    Code::parse(value)
        .map_err(|description| Error::InvalidArgument(vec![FieldViolation { field, description }]))
}

/// A code field where only six digits do.
fn totp_code(field: &'static str, value: &str) -> Result<String, Error> {
    required(field, value)?;
    Code::parse_totp(value)
        .map_err(|description| Error::InvalidArgument(vec![FieldViolation { field, description }]))
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

/// The answer of an RPC that issues a session's tokens (Login, Refresh,
/// CompleteLogin): their messages have the same fields.
macro_rules! session_response {
    ($message:ident, $session:expr $(, $rest:tt)?) => {{
        let session = $session;
        $message {
            access_token: session.access_token,
            token_type: "Bearer".into(),
            expires_at: Some(timestamp(session.expires_at)),
            user_id: session.user_id,
            refresh_token: session.refresh_token.expose(),
            refresh_expires_at: Some(timestamp(session.refresh_expires_at)),
            session_id: session.session_id,
            $(..$rest::default())?
        }
    }};
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
            // Logout and ChangePassword answer for no user id of their own.
            let user = Some(user_id(&body))
                .filter(|id| !id.is_empty())
                .map(|id| UserId(id.to_owned()));
            let mut response = Response::new(body);
            if let Some(user) = user {
                response.extensions_mut().insert(user);
            }
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
                Error::InvalidRefreshToken(reason) => {
                    tracing::info!(
                        method,
                        request_id,
                        trace_id,
                        reason,
                        "refresh token refused"
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
        let caller = self.caller(&request);
        let req = request.into_inner();
        let work = async {
            let (username, password) = credentials(&req.username, &req.password)?;
            self.blocklist
                .check_new_password("password", &username, &password)?;
            let user_id = self
                .accounts
                .register(username, password, deadline, &caller)
                .await?;
            Ok(RegisterResponse { user_id })
        };
        respond("Register", request_id, work, |r| &r.user_id).await
    }

    async fn login(
        &self,
        request: Request<LoginRequest>,
    ) -> Result<Response<LoginResponse>, Status> {
        let (deadline, request_id) = (deadline(&request), request_id(&request));
        let caller = self.caller(&request);
        let req = request.into_inner();
        let work = async {
            let (username, password) = login_credentials(&req.username, &req.password)?;
            // Known before the password is checked, told only when it is right.
            let password_change_recommended = !password.meets_rules();
            let answer = self
                .accounts
                .login(username, password, deadline, &caller)
                .await?;
            Ok(match answer {
                LoginAnswer::Session(session) => LoginResponse {
                    password_change_recommended,
                    ..session_response!(LoginResponse, session, LoginResponse)
                },
                LoginAnswer::Challenge {
                    challenge,
                    expires_at,
                } => LoginResponse {
                    second_factor_required: true,
                    challenge,
                    challenge_expires_at: Some(timestamp(expires_at)),
                    password_change_recommended,
                    ..LoginResponse::default()
                },
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
            let audience = token::requested_audience(&req.audience).map_err(|description| {
                Error::InvalidArgument(vec![FieldViolation {
                    field: "audience",
                    description,
                }])
            })?;
            let token = self.accounts.validate(&req.access_token, audience)?;
            if req.require_second_factor && !token.second_factor() {
                return Err(Error::SecondFactorRequired);
            }
            Ok(validate_response(token))
        };
        respond("ValidateToken", request_id, work, |r| &r.user_id).await
    }

    async fn refresh(
        &self,
        request: Request<RefreshRequest>,
    ) -> Result<Response<RefreshResponse>, Status> {
        let request_id = request_id(&request);
        let caller = self.caller(&request);
        let req = request.into_inner();
        let work = async {
            required("refresh_token", &req.refresh_token)?;
            let session = self.accounts.refresh(&req.refresh_token, &caller).await?;
            Ok(session_response!(RefreshResponse, session))
        };
        respond("Refresh", request_id, work, |r| &r.user_id).await
    }

    async fn logout(
        &self,
        request: Request<LogoutRequest>,
    ) -> Result<Response<LogoutResponse>, Status> {
        let request_id = request_id(&request);
        let caller = self.caller(&request);
        let req = request.into_inner();
        let work = async {
            if req.refresh_token.is_empty() && req.access_token.is_empty() {
                return Err(Error::InvalidArgument(vec![FieldViolation {
                    field: "refresh_token",
                    description: "give refresh_token or access_token (or both)".into(),
                }]));
            }
            let given = |t: &str| (!t.is_empty()).then_some(t.to_owned());
            let (refresh, access) = (given(&req.refresh_token), given(&req.access_token));
            let ended = self
                .accounts
                .logout(
                    refresh.as_deref(),
                    access.as_deref(),
                    req.all_sessions,
                    &caller,
                )
                .await?;
            Ok(LogoutResponse {
                sessions_ended: ended,
            })
        };
        respond("Logout", request_id, work, |_| "").await
    }

    async fn change_password(
        &self,
        request: Request<ChangePasswordRequest>,
    ) -> Result<Response<ChangePasswordResponse>, Status> {
        let (deadline, request_id) = (deadline(&request), request_id(&request));
        let caller = self.caller(&request);
        let req = request.into_inner();
        let work = async {
            // The current password is verified as Login's is; the new one is held
            // to the rules.
            let mut fields = Fields::default();
            let username = fields.take("username", Username::parse(&req.username));
            let current = fields.take(
                "current_password",
                PresentedPassword::parse(&req.current_password),
            );
            let new = fields.take("new_password", Password::parse(&req.new_password));
            fields.done()?;
            let (Some(username), Some(current), Some(new)) = (username, current, new) else {
                unreachable!("every field parsed");
            };
            self.blocklist
                .check_new_password("new_password", &username, &new)?;
            let ended = self
                .accounts
                .change_password(username, current, new, deadline, &caller)
                .await?;
            Ok(ChangePasswordResponse {
                sessions_ended: ended,
            })
        };
        respond("ChangePassword", request_id, work, |_| "").await
    }

    async fn request_password_reset(
        &self,
        request: Request<RequestPasswordResetRequest>,
    ) -> Result<Response<RequestPasswordResetResponse>, Status> {
        let (deadline, request_id) = (deadline(&request), request_id(&request));
        let caller = self.caller(&request);
        let req = request.into_inner();
        let work = async {
            let mut fields = Fields::default();
            let username = fields.take("username", Username::parse(&req.username));
            fields.done()?;
            let username = username.expect("checked");
            self.accounts
                .request_password_reset(username, deadline, &caller)
                .await?;
            Ok(RequestPasswordResetResponse {})
        };
        respond("RequestPasswordReset", request_id, work, |_| "").await
    }

    async fn complete_password_reset(
        &self,
        request: Request<CompletePasswordResetRequest>,
    ) -> Result<Response<CompletePasswordResetResponse>, Status> {
        let (deadline, request_id) = (deadline(&request), request_id(&request));
        let caller = self.caller(&request);
        let req = request.into_inner();
        let work = async {
            let mut fields = Fields::default();
            if req.token.is_empty() || req.token.len() > 256 {
                fields.0.push(FieldViolation {
                    field: "token",
                    description: "must be the token of a reset, 1 to 256 bytes".into(),
                });
            }
            let new = fields.take("new_password", Password::parse(&req.new_password));
            fields.done()?;
            let new = new.expect("checked");
            // The blocklist once the user is known (the password may not be the
            // username), before any hashing.
            let check = |username: &Username, new: &Password| {
                self.blocklist
                    .check_new_password("new_password", username, new)
            };
            let ended = self
                .accounts
                .complete_password_reset(&req.token, new, check, deadline, &caller)
                .await?;
            Ok(CompletePasswordResetResponse {
                sessions_ended: ended,
            })
        };
        respond("CompletePasswordReset", request_id, work, |_| "").await
    }

    async fn get_signing_keys(
        &self,
        request: Request<GetSigningKeysRequest>,
    ) -> Result<Response<GetSigningKeysResponse>, Status> {
        let request_id = request_id(&request);
        let work = async {
            let jwks = self.accounts.signing_keys();
            Ok(GetSigningKeysResponse {
                jwks_json: jwks.json.to_string(),
                keys: jwks
                    .keys
                    .iter()
                    .map(|k| PublicKey {
                        kid: k.kid.clone(),
                        kty: k.kty.into(),
                        crv: k.crv.into(),
                        alg: k.alg.into(),
                        r#use: k.use_.into(),
                        x: k.x.clone(),
                    })
                    .collect(),
            })
        };
        // No user: the keys are the same for everyone.
        respond("GetSigningKeys", request_id, work, |_| "").await
    }

    async fn begin_totp_enrollment(
        &self,
        request: Request<BeginTotpEnrollmentRequest>,
    ) -> Result<Response<BeginTotpEnrollmentResponse>, Status> {
        let request_id = request_id(&request);
        let caller = self.caller(&request);
        let req = request.into_inner();
        let work = async {
            required("access_token", &req.access_token)?;
            let enrollment = (self.accounts)
                .begin_totp_enrollment(&req.access_token, &caller)
                .await?;
            Ok(BeginTotpEnrollmentResponse {
                secret: enrollment.secret,
                otpauth_uri: enrollment.otpauth_uri,
            })
        };
        respond("BeginTotpEnrollment", request_id, work, |_| "").await
    }

    async fn confirm_totp_enrollment(
        &self,
        request: Request<ConfirmTotpEnrollmentRequest>,
    ) -> Result<Response<ConfirmTotpEnrollmentResponse>, Status> {
        let (deadline, request_id) = (deadline(&request), request_id(&request));
        let caller = self.caller(&request);
        let req = request.into_inner();
        let work = async {
            required("access_token", &req.access_token)?;
            let digits = totp_code("code", &req.code)?;
            let recovery_codes = (self.accounts)
                .confirm_totp_enrollment(&req.access_token, digits, deadline, &caller)
                .await?;
            Ok(ConfirmTotpEnrollmentResponse { recovery_codes })
        };
        respond("ConfirmTotpEnrollment", request_id, work, |_| "").await
    }

    async fn complete_login(
        &self,
        request: Request<CompleteLoginRequest>,
    ) -> Result<Response<CompleteLoginResponse>, Status> {
        let (deadline, request_id) = (deadline(&request), request_id(&request));
        let caller = self.caller(&request);
        let req = request.into_inner();
        let work = async {
            required("challenge", &req.challenge)?;
            let code = code("code", &req.code)?;
            let session = (self.accounts)
                .complete_login(&req.challenge, code, deadline, &caller)
                .await?;
            Ok(session_response!(CompleteLoginResponse, session))
        };
        respond("CompleteLogin", request_id, work, |r| &r.user_id).await
    }

    async fn disable_totp(
        &self,
        request: Request<DisableTotpRequest>,
    ) -> Result<Response<DisableTotpResponse>, Status> {
        let (deadline, request_id) = (deadline(&request), request_id(&request));
        let caller = self.caller(&request);
        let req = request.into_inner();
        let work = async {
            required("access_token", &req.access_token)?;
            let code = code("code", &req.code)?;
            (self.accounts)
                .disable_totp(&req.access_token, code, deadline, &caller)
                .await?;
            Ok(DisableTotpResponse {})
        };
        respond("DisableTotp", request_id, work, |_| "").await
    }

    async fn regenerate_recovery_codes(
        &self,
        request: Request<RegenerateRecoveryCodesRequest>,
    ) -> Result<Response<RegenerateRecoveryCodesResponse>, Status> {
        let (deadline, request_id) = (deadline(&request), request_id(&request));
        let caller = self.caller(&request);
        let req = request.into_inner();
        let work = async {
            required("access_token", &req.access_token)?;
            let digits = totp_code("code", &req.code)?;
            let recovery_codes = (self.accounts)
                .regenerate_recovery_codes(&req.access_token, digits, deadline, &caller)
                .await?;
            Ok(RegenerateRecoveryCodesResponse { recovery_codes })
        };
        respond("RegenerateRecoveryCodes", request_id, work, |_| "").await
    }

    async fn issue_service_token(
        &self,
        request: Request<IssueServiceTokenRequest>,
    ) -> Result<Response<IssueServiceTokenResponse>, Status> {
        let (deadline, request_id) = (deadline(&request), request_id(&request));
        let caller = self.caller(&request);
        let identity = rpc::client_identity(request.extensions()).map(|i| i.as_str().to_owned());
        // A rate-limit rule counts the client id this request names: decided here,
        // where the body is read, before anything else (`ratelimit::Deferred`).
        let deferred = (request.extensions())
            .get::<crate::ratelimit::Deferred>()
            .cloned();
        let req = request.into_inner();
        let work = async {
            if let Some(deferred) = &deferred {
                // The client id of a secret; a client assertion's is in the token.
                let named = (req.client_assertion.is_empty() && !req.client_id.is_empty())
                    .then_some(req.client_id.as_str());
                deferred.decide(named).await?;
            }
            let proof = if req.client_assertion.is_empty() {
                client_proof(&req.client_id, &req.client_secret, identity)?
            } else if req.client_secret.is_empty()
                && req.client_assertion.len() <= crate::issuers::MAX_TOKEN_BYTES
            {
                crate::accounts::ClientProof::Assertion {
                    jwt: req.client_assertion.clone(),
                }
            } else {
                return Err(Error::InvalidArgument(vec![FieldViolation {
                    field: "client_assertion",
                    description: "at most 8 KiB, and never with client_secret".into(),
                }]));
            };
            let audience = token::requested_audience(&req.audience).map_err(|description| {
                Error::InvalidArgument(vec![FieldViolation {
                    field: "audience",
                    description,
                }])
            })?;
            let scopes =
                crate::accounts::parse_items(&req.scopes, "scopes", crate::accounts::MAX_SCOPES)?;
            let granted = if req.subject_token.is_empty() {
                (self.accounts)
                    .client_credentials(&proof, audience, &scopes, &caller, deadline)
                    .await?
            } else {
                let Some(audience) = audience else {
                    return Err(Error::InvalidArgument(vec![FieldViolation {
                        field: "audience",
                        description: "an exchange names the audience it is for".into(),
                    }]));
                };
                (self.accounts)
                    .exchange_token(
                        &proof,
                        &req.subject_token,
                        audience,
                        &scopes,
                        &caller,
                        deadline,
                    )
                    .await?
            };
            Ok(IssueServiceTokenResponse {
                access_token: granted.token.token,
                token_type: "Bearer".into(),
                expires_at: Some(timestamp(granted.token.expires_at)),
                audiences: granted.audiences,
                scopes: granted.scopes,
            })
        };
        respond("IssueServiceToken", request_id, work, |_| "").await
    }
}

/// What a service presents: a client id and secret, or, with neither, its client
/// certificate's identity.
fn client_proof(
    client_id: &str,
    secret: &str,
    identity: Option<String>,
) -> Result<crate::accounts::ClientProof, Error> {
    use crate::accounts::ClientProof;
    let bad = |field, description: &str| {
        Error::InvalidArgument(vec![FieldViolation {
            field,
            description: description.into(),
        }])
    };
    match (client_id.is_empty(), secret.is_empty(), identity) {
        (true, true, Some(identity)) => Ok(ClientProof::Certificate { identity }),
        (true, true, None) => Err(bad(
            "client_id",
            "must not be empty (or call under mutual TLS with a bound certificate)",
        )),
        (false, false, _) if client_id.len() <= 256 && secret.len() <= 256 => {
            Ok(ClientProof::Secret {
                client_id: client_id.to_owned(),
                secret: secret.to_owned(),
            })
        }
        (false, false, _) => Err(bad(
            "client_secret",
            "client_id and client_secret are at most 256 bytes",
        )),
        (true, false, _) => Err(bad("client_id", "must not be empty")),
        (false, true, _) => Err(bad("client_secret", "must not be empty")),
    }
}

/// ValidateToken's answer for a valid token: a user's, a service's, or an
/// exchanged one.
fn validate_response(token: token::VerifiedToken) -> ValidateTokenResponse {
    let service = crate::accounts::is_service_token(&token);
    let mut actors = Vec::new();
    let mut actor = token.actor.as_ref();
    while let Some(a) = actor {
        actors.push(a.sub.clone());
        actor = a.act.as_deref();
    }
    ValidateTokenResponse {
        user_id: token.user_id,
        username: if service {
            String::new()
        } else {
            token.username
        },
        expires_at: Some(timestamp(token.expires_at)),
        session_id: token.session_id.unwrap_or_default(),
        amr: if service { Vec::new() } else { token.amr },
        client_id: token.client_id.unwrap_or_default(),
        scopes: token.scopes,
        service,
        actors,
        audiences: token.audience,
    }
}
