//! The errors a request can end with, as the domain sees them.
//!
//! Every layer and use case returns [`Error`], and an error maps itself to the gRPC
//! `Status` the client sees ([`Error::to_status`]): the one table of the service. The
//! variants separate the caller's fault (bad input, wrong credentials) from the
//! server's state (full, unavailable) and from the unexpected, whose cause is logged
//! and never sent to the client.
//!
//! A refusal of external authorization ([`Denial`]) is an answer, not an error of
//! the call: it maps itself here too, to the HTTP status and the `WWW-Authenticate`
//! challenge the proxy returns to its client, and to the `google.rpc` code of
//! Envoy's CheckResponse.

use std::time::Duration;
use tonic::{Code, Status, metadata::MetadataValue};
use tonic_types::{ErrorDetails, StatusExt};

/// What the client is told about any refused token, whatever the reason: the reason
/// (unknown kid, bad signature, …) would let anyone probe for key names. It goes to
/// `authd_tokens_validated_total{outcome}` and to the log instead.
pub const INVALID_TOKEN: &str = "invalid token";

/// Why a token was refused: a metric label and a log field. The client is told only
/// that the token is invalid, so that nobody can probe for key names or algorithms.
///
/// Named here, on the bottom floor, so that the error table stands on nothing above
/// it; `token` decides which kind applies and re-exports it as `token::TokenError`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum TokenError {
    #[error("malformed token")]
    Malformed,
    #[error("unsupported signing algorithm (only HS256 and EdDSA are accepted)")]
    UnsupportedAlgorithm,
    #[error("token signed by an unknown key")]
    UnknownKey,
    #[error("bad signature")]
    BadSignature,
    #[error("token expired")]
    Expired,
    #[error("token issued by someone else")]
    WrongIssuer,
    /// The `alg` of the header is not the algorithm of the key its `kid` names.
    #[error("the token's algorithm is not its key's")]
    AlgorithmMismatch,
    /// `nbf` or `iat` lies in the future, beyond the clock skew allowed.
    #[error("token not valid yet")]
    NotYetValid,
    /// The token is not meant for the audience the caller asked about.
    #[error("token meant for another audience")]
    WrongAudience,
    /// Valid, but its session has ended (Logout, reuse, password change).
    #[error("the token's session has ended")]
    Revoked,
}

impl TokenError {
    /// Every kind, in the order of [`TokenError::index`].
    pub(crate) const ALL: [TokenError; 10] = [
        TokenError::Malformed,
        TokenError::UnsupportedAlgorithm,
        TokenError::UnknownKey,
        TokenError::BadSignature,
        TokenError::Expired,
        TokenError::WrongIssuer,
        TokenError::AlgorithmMismatch,
        TokenError::NotYetValid,
        TokenError::WrongAudience,
        TokenError::Revoked,
    ];

    /// A metric label: `authd_tokens_validated_total{outcome=…}`.
    pub fn label(self) -> &'static str {
        match self {
            TokenError::Malformed => "malformed",
            TokenError::UnsupportedAlgorithm => "unsupported_algorithm",
            TokenError::UnknownKey => "unknown_key",
            TokenError::BadSignature => "bad_signature",
            TokenError::Expired => "expired",
            TokenError::WrongIssuer => "wrong_issuer",
            TokenError::AlgorithmMismatch => "algorithm_mismatch",
            TokenError::NotYetValid => "not_yet_valid",
            TokenError::WrongAudience => "wrong_audience",
            TokenError::Revoked => "revoked",
        }
    }

    /// The position in [`TokenError::ALL`]: an index into per-kind counters.
    pub(crate) fn index(self) -> usize {
        self as usize
    }
}

/// A wait as whole seconds, rounded up, for `retry-after` and `ratelimit-reset`:
/// a client that waits that long finds what it waits for.
pub(crate) fn whole_seconds(wait: Duration) -> u64 {
    wait.as_secs()
        .saturating_add(u64::from(wait.subsec_nanos() > 0))
}

/// The `retry-after` of a refusal: whole seconds, rounded up, at least 1.
fn retry_after(wait: Duration) -> MetadataValue<tonic::metadata::Ascii> {
    MetadataValue::from(retry_after_seconds(wait))
}

/// The seconds [`retry_after`] says.
fn retry_after_seconds(wait: Duration) -> u64 {
    whole_seconds(wait).max(1)
}

/// What `grpc-message` percent-encodes: tonic's set (private to it), besides every
/// byte past ASCII.
const GRPC_MESSAGE_ENCODED: &percent_encoding::AsciiSet = &percent_encoding::CONTROLS
    .add(b' ')
    .add(b'"')
    .add(b'#')
    .add(b'%')
    .add(b'<')
    .add(b'>')
    .add(b'`')
    .add(b'?')
    .add(b'{')
    .add(b'}');

/// One field of a request that failed to parse.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldViolation {
    /// The proto field name, e.g. `username`.
    pub field: &'static str,
    /// What is wrong with it, safe to show to the client (never echoes a password).
    pub description: String,
}

/// One rate-limit rule that refused a request (a `google.rpc.QuotaFailure` violation).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QuotaViolation {
    /// The rule as configured, e.g. `Login:peer=20/1s`.
    pub subject: String,
    /// What it allows, in words.
    pub description: String,
}

/// Which count of the login throttle refused an attempt: named here, with what the
/// client is shown of it, because a refusal carries it up to `Error::to_status`;
/// the throttle (`crate::throttle`) decides which.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ThrottleScope {
    /// This client's failures for this username.
    Client,
    /// The username's failures across clients.
    Account,
}

impl ThrottleScope {
    /// The scope as audit events name it.
    pub fn label(self) -> &'static str {
        match self {
            ThrottleScope::Client => "client",
            ThrottleScope::Account => "account",
        }
    }

    /// The `QuotaFailure` subject a client is shown.
    pub fn subject(self) -> &'static str {
        match self {
            ThrottleScope::Client => "login-throttle:client",
            ThrottleScope::Account => "login-throttle:account",
        }
    }

    /// The `QuotaFailure` subject of a refusal of second-factor codes.
    pub fn code_subject(self) -> &'static str {
        match self {
            ThrottleScope::Client => "second-factor-throttle:client",
            ThrottleScope::Account => "second-factor-throttle:account",
        }
    }

    fn code_description(self) -> &'static str {
        match self {
            ThrottleScope::Client => "wrong second-factor codes for this account from this client",
            ThrottleScope::Account => "wrong second-factor codes for this account",
        }
    }
}

/// What the login throttle counted when it refused an attempt: the refusal's
/// message and `QuotaFailure` description name it (its subject stays the login
/// throttle's, `login-throttle:…`, which clients may match on). Every kind is
/// counted alike for names that exist and names that do not, so naming it tells
/// nothing about which accounts exist.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Counted {
    /// Failed logins of a username (Login).
    Logins,
    /// Failed authentications of a service account: a wrong secret, a certificate
    /// or an external token that proves no account (the grants).
    ClientAuthentications,
    /// Password reset requests for a username, each counted (RequestPasswordReset).
    ResetRequests,
    /// Wrong reset tokens from one client (CompletePasswordReset).
    ResetTokens,
}

impl Counted {
    /// The message of the refusal.
    fn message(self) -> &'static str {
        match self {
            Counted::Logins => "too many failed logins for this account; retry later",
            Counted::ClientAuthentications => {
                "too many failed authentications for this service account; retry later"
            }
            Counted::ResetRequests => {
                "too many password reset requests for this account; retry later"
            }
            Counted::ResetTokens => "too many wrong reset tokens from this client; retry later",
        }
    }

    /// The `QuotaFailure` description of the count of `scope` that refused.
    fn description(self, scope: ThrottleScope) -> &'static str {
        match (self, scope) {
            (Counted::Logins, ThrottleScope::Client) => {
                "failed logins for this account from this client"
            }
            (Counted::Logins, ThrottleScope::Account) => "failed logins for this account",
            (Counted::ClientAuthentications, ThrottleScope::Client) => {
                "failed authentications for this service account from this client"
            }
            (Counted::ClientAuthentications, ThrottleScope::Account) => {
                "failed authentications for this service account"
            }
            (Counted::ResetRequests, ThrottleScope::Client) => {
                "password reset requests for this account from this client"
            }
            (Counted::ResetRequests, ThrottleScope::Account) => {
                "password reset requests for this account"
            }
            // The count's account is the client itself.
            (Counted::ResetTokens, _) => "wrong reset tokens from this client",
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The request is malformed; one entry per bad field.
    #[error("invalid request: {}", describe(.0))]
    InvalidArgument(Vec<FieldViolation>),
    #[error("username already taken")]
    AlreadyExists,
    /// Unknown user or wrong password: deliberately one variant, one message.
    #[error("invalid username or password")]
    InvalidCredentials,
    #[error("invalid token: {0}")]
    InvalidToken(#[from] TokenError),
    /// A refresh token that is malformed, unknown, of an ended or expired session,
    /// or reused; the reason goes to the log, the client sees [`INVALID_TOKEN`].
    #[error("invalid refresh token: {0}")]
    InvalidRefreshToken(&'static str),
    /// The server is full (hash queue or admission cap); retry after the hint.
    #[error("server overloaded: {what}")]
    Overloaded {
        what: &'static str,
        retry_after: Duration,
    },
    /// A rate-limit rule refused the request; retry after the hint.
    #[error("rate limit exceeded: {}", subjects(violations))]
    RateLimited {
        /// Every rule that refused (all must have room for a retry to pass).
        violations: Vec<QuotaViolation>,
        /// The limit of the rule that frees last.
        limit: u32,
        /// Until every refusing rule has a free slot.
        retry_after: Duration,
    },
    /// The login throttle refused the attempt (too many failed logins for this
    /// username, or what else `counted` says it counted); the same for every name,
    /// known or not.
    #[error("{}", .counted.message())]
    Throttled {
        scope: ThrottleScope,
        retry_after: Duration,
        counted: Counted,
    },
    /// Wrong second-factor codes for this account are over the throttle's limit:
    /// codes are refused before they are checked.
    #[error("too many wrong codes for this account; retry later")]
    CodesThrottled {
        scope: ThrottleScope,
        retry_after: Duration,
    },
    /// A second-factor code (or recovery code) that is wrong or was used already.
    #[error("invalid code")]
    InvalidCode,
    /// A Login challenge that is unknown, expired, used, or out of attempts.
    #[error("invalid or expired challenge")]
    InvalidChallenge,
    /// The server has no data key to seal or open TOTP secrets with.
    #[error("second factor is not configured on this server")]
    SecondFactorNotConfigured,
    /// The user's second factor is not in the state the call needs (what is wrong,
    /// in words safe to show: the caller proved who they are).
    #[error("{0}")]
    SecondFactorState(&'static str),
    /// ValidateToken with `require_second_factor`: the token is valid, but its user
    /// did not sign in with a second factor.
    #[error("a second factor is required")]
    SecondFactorRequired,
    /// Mutual TLS: the client's certificate identity is not on `AUTHD_TLS_ALLOW` for
    /// the method (or the client has none). The identity is not echoed.
    #[error("the client certificate is not allowed to call this method")]
    PermissionDenied,
    /// The admin API: a call without a valid admin credential (none, or a key that
    /// is no admin key). Which of the two is not said.
    #[error(
        "an admin credential is required: a client certificate on the admin allow-list, or an admin key"
    )]
    AdminUnauthenticated,
    /// The admin API: a known admin credential whose role may not call the method.
    #[error("this admin credential may not call this method")]
    AdminForbidden,
    /// A password reset token that is unknown, used, expired, superseded, or whose
    /// account changed since it was issued: one message for all.
    #[error("invalid or expired reset token")]
    InvalidResetToken,
    /// WatchEvents: events after the position asked for were deleted by retention;
    /// the stream may resume after `oldest_after`.
    #[error(
        "events after that position were deleted by retention; resume after position {oldest_after}"
    )]
    EventsPruned { oldest_after: i64 },
    /// The admin API: the account named does not exist.
    #[error("no such user")]
    NoSuchUser,
    /// A service account's credential that proves nothing (a wrong secret, an
    /// unknown client, a disabled account, an external token refused): one answer
    /// for every reason.
    #[error("invalid client credentials")]
    InvalidClient,
    #[error("no such service account or credential")]
    NoSuchServiceAccount,
    /// A service account's name, or a credential's identity, is taken.
    #[error("a service account of that name, or a credential of that identity, exists")]
    ServiceAccountExists,
    /// Adding a secret to an account that holds the most it may.
    #[error("the account holds two secrets already: remove one first")]
    TooManySecrets,
    /// An audience, a scope or an exchange the service account may not have.
    #[error("not allowed: {0}")]
    NotAllowed(&'static str),
    #[error("deadline exceeded before the work could be done")]
    DeadlineExceeded,
    /// The request's body did not arrive within the receive timeout.
    #[error("the request was not received in time")]
    ReceiveTimeout,
    /// The request is larger than any valid request.
    #[error("request larger than {limit} bytes")]
    TooLarge { limit: usize },
    /// The client went away (or broke the stream) before its request arrived.
    #[error("the request was cancelled by the client")]
    Cancelled,
    /// The database cannot be reached, or the server is shutting down.
    #[error("service unavailable: {0}")]
    Unavailable(String),
    #[error(transparent)]
    Internal(#[from] anyhow::Error),
}

/// RESOURCE_EXHAUSTED from the login throttle: when to retry (in the details and
/// the `retry-after` header) and the one quota that is spent.
fn throttled(
    message: String,
    wait: Duration,
    subject: &'static str,
    description: &'static str,
) -> Status {
    let mut details = ErrorDetails::with_retry_info(Some(wait));
    details.add_quota_failure_violation(subject, description);
    let mut status = Status::with_error_details(Code::ResourceExhausted, message, details);
    status
        .metadata_mut()
        .insert("retry-after", retry_after(wait));
    status
}

fn subjects(violations: &[QuotaViolation]) -> String {
    violations
        .iter()
        .map(|v| v.subject.as_str())
        .collect::<Vec<_>>()
        .join(", ")
}

fn describe(violations: &[FieldViolation]) -> String {
    violations
        .iter()
        .map(|v| format!("{}: {}", v.field, v.description))
        .collect::<Vec<_>>()
        .join("; ")
}

impl Error {
    /// The status the client sees. The single table of the service.
    pub fn to_status(&self) -> Status {
        match self {
            Error::InvalidArgument(violations) => {
                let mut details = ErrorDetails::new();
                for v in violations {
                    details.add_bad_request_violation(v.field, v.description.clone());
                }
                Status::with_error_details(Code::InvalidArgument, self.to_string(), details)
            }
            Error::AlreadyExists => Status::already_exists(self.to_string()),
            Error::InvalidCredentials => Status::unauthenticated(self.to_string()),
            Error::InvalidToken(_) | Error::InvalidRefreshToken(_) => {
                Status::unauthenticated(INVALID_TOKEN)
            }
            Error::Overloaded {
                retry_after: wait, ..
            } => {
                let mut status = Status::with_error_details(
                    Code::ResourceExhausted,
                    format!("{self}; retry later"),
                    ErrorDetails::with_retry_info(Some(*wait)),
                );
                status
                    .metadata_mut()
                    .insert("retry-after", retry_after(*wait));
                status
            }
            Error::RateLimited {
                violations,
                limit,
                retry_after: wait,
            } => {
                let mut details = ErrorDetails::with_retry_info(Some(*wait));
                for v in violations {
                    details.add_quota_failure_violation(v.subject.clone(), v.description.clone());
                }
                let mut status =
                    Status::with_error_details(Code::ResourceExhausted, self.to_string(), details);
                let metadata = status.metadata_mut();
                metadata.insert("retry-after", retry_after(*wait));
                metadata.insert("ratelimit-limit", MetadataValue::from(*limit));
                metadata.insert("ratelimit-remaining", MetadataValue::from(0u32));
                metadata.insert("ratelimit-reset", MetadataValue::from(whole_seconds(*wait)));
                status
            }
            Error::Throttled {
                scope,
                retry_after: wait,
                counted,
            } => throttled(
                self.to_string(),
                *wait,
                scope.subject(),
                counted.description(*scope),
            ),
            Error::CodesThrottled {
                scope,
                retry_after: wait,
            } => throttled(
                self.to_string(),
                *wait,
                scope.code_subject(),
                scope.code_description(),
            ),
            Error::InvalidCode | Error::InvalidChallenge => {
                Status::unauthenticated(self.to_string())
            }
            Error::SecondFactorNotConfigured | Error::SecondFactorState(_) => {
                Status::failed_precondition(self.to_string())
            }
            Error::PermissionDenied | Error::AdminForbidden | Error::SecondFactorRequired => {
                Status::permission_denied(self.to_string())
            }
            Error::NoSuchUser | Error::NoSuchServiceAccount => Status::not_found(self.to_string()),
            Error::InvalidClient => Status::unauthenticated(self.to_string()),
            Error::ServiceAccountExists => Status::already_exists(self.to_string()),
            Error::TooManySecrets => Status::failed_precondition(self.to_string()),
            Error::NotAllowed(_) => Status::permission_denied(self.to_string()),
            Error::AdminUnauthenticated | Error::InvalidResetToken => {
                Status::unauthenticated(self.to_string())
            }
            Error::EventsPruned { oldest_after } => {
                let metadata = std::collections::HashMap::from([(
                    "oldest_after".to_owned(),
                    oldest_after.to_string(),
                )]);
                let details = ErrorDetails::with_error_info("EVENTS_PRUNED", "authd", metadata);
                Status::with_error_details(Code::OutOfRange, self.to_string(), details)
            }
            Error::DeadlineExceeded | Error::ReceiveTimeout => {
                Status::deadline_exceeded(self.to_string())
            }
            Error::TooLarge { .. } => Status::out_of_range(self.to_string()),
            Error::Cancelled => Status::cancelled(self.to_string()),
            Error::Unavailable(_) => Status::unavailable(self.to_string()),
            Error::Internal(_) => Status::internal("internal error"),
        }
    }
}

/// A refusal for load or by a rate limit, answered by a layer below pushback and left
/// unencoded in its response's extensions: pushback, the layer above every layer that
/// makes one, holds it and encodes it once, with what is left of its hint (see
/// `layers::pushback`). Encoding a status is about a tenth of what refusing costs, and
/// a refusal held and answered with a shorter hint would otherwise be encoded twice.
#[derive(Debug, Clone)]
pub(crate) enum Unsent {
    /// [`Error::Overloaded`].
    Overloaded {
        what: &'static str,
        retry_after: Duration,
    },
    /// [`Error::RateLimited`].
    RateLimited {
        violations: Vec<QuotaViolation>,
        limit: u32,
        retry_after: Duration,
    },
}

impl Unsent {
    /// Its retry hint.
    pub(crate) fn hint(&self) -> Duration {
        match self {
            Unsent::Overloaded { retry_after, .. } | Unsent::RateLimited { retry_after, .. } => {
                *retry_after
            }
        }
    }

    /// The response to send, its hint replaced by `wait` when given, with `headers`
    /// (what the layers between added to the unsent response, e.g. the rate limit's
    /// quota fields) after the status's own.
    pub(crate) fn encode(
        self,
        wait: Option<Duration>,
        headers: http::HeaderMap,
    ) -> http::Response<tonic::body::Body> {
        let wait = wait.unwrap_or(self.hint());
        let mut response = match self {
            Unsent::Overloaded { what, .. } => overloaded_answer(what, wait),
            Unsent::RateLimited {
                violations, limit, ..
            } => Error::RateLimited {
                violations,
                limit,
                retry_after: wait,
            }
            .to_status()
            .into_http(),
        };
        response.headers_mut().extend(headers);
        response
    }
}

/// The answer of [`Error::Overloaded`] with the hint `wait`: the headers that its
/// [`Error::to_status`] makes through `Status::into_http` (a test holds them equal,
/// byte for byte), built directly. A refusal for load is the answer a crowd gets
/// most, and the way through a `Status` (its details, its metadata map, a header map
/// filled from both) costs about a sixth of what refusing does on the runtime.
fn overloaded_answer(what: &'static str, wait: Duration) -> http::Response<tonic::body::Body> {
    use base64::Engine as _;
    use prost::Message as _;
    use tonic_types::{RetryInfo, pb};
    let code = Code::ResourceExhausted;
    let message = format!(
        "{}; retry later",
        Error::Overloaded {
            what,
            retry_after: wait
        }
    );
    let retry_info = pb::RetryInfo::from(RetryInfo::new(Some(wait)));
    let details = pb::Status {
        code: code as i32,
        message,
        details: vec![prost_types::Any {
            type_url: RetryInfo::TYPE_URL.to_owned(),
            value: retry_info.encode_to_vec(),
        }],
    };
    let encoded = base64::engine::general_purpose::STANDARD_NO_PAD.encode(details.encode_to_vec());
    let mut response = http::Response::new(tonic::body::Body::empty());
    let headers = response.headers_mut();
    headers.reserve(5);
    headers.insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/grpc"),
    );
    headers.insert(
        "retry-after",
        http::HeaderValue::from(retry_after_seconds(wait)),
    );
    headers.insert("grpc-status", http::HeaderValue::from(code as i32));
    let message =
        percent_encoding::utf8_percent_encode(&details.message, GRPC_MESSAGE_ENCODED).to_string();
    for (name, value) in [
        ("grpc-message", message),
        ("grpc-status-details-bin", encoded),
    ] {
        // Percent-encoded and base64: visible ASCII, always a valid value.
        if let Ok(value) = http::HeaderValue::try_from(value) {
            headers.insert(name, value);
        }
    }
    response
}

/// The answer of a layer below pushback (admission, the rate limit): a refusal with a
/// retry hint left [`Unsent`], for pushback to encode; any other error encoded.
pub(crate) fn layer_answer(err: Error) -> http::Response<tonic::body::Body> {
    let unsent = match err {
        Error::Overloaded { what, retry_after } => Unsent::Overloaded { what, retry_after },
        Error::RateLimited {
            violations,
            limit,
            retry_after,
        } => Unsent::RateLimited {
            violations,
            limit,
            retry_after,
        },
        other => return other.to_status().into_http(),
    };
    let mut response = http::Response::new(tonic::body::Body::empty());
    response.extensions_mut().insert(unsent);
    response
}

/// The retry hint of a refusal for load or for a limit (RESOURCE_EXHAUSTED with a
/// RetryInfo detail), if `status` is one.
pub(crate) fn retry_hint(status: &Status) -> Option<Duration> {
    if status.code() != Code::ResourceExhausted {
        return None;
    }
    status.get_details_retry_info()?.retry_delay
}

/// The refusal `status` with its retry hint replaced by `wait` (what is left of it
/// once the answer was held back): the RetryInfo detail, `retry-after` and
/// `ratelimit-reset` change, the code, message and every other detail stay.
pub(crate) fn with_retry_hint(status: &Status, wait: Duration) -> Status {
    let mut details = status.get_error_details();
    details.set_retry_info(Some(wait));
    let mut metadata = status.metadata().clone();
    let seconds = whole_seconds(wait);
    metadata.insert("retry-after", MetadataValue::from(seconds));
    if metadata.contains_key("ratelimit-reset") {
        metadata.insert("ratelimit-reset", MetadataValue::from(seconds));
    }
    Status::with_error_details_and_metadata(status.code(), status.message(), details, metadata)
}

/// Why external authorization (Envoy's Check, the HTTP forward-auth endpoint)
/// refused a request. The proxy answers its client with [`Denial::http_status`] and
/// [`Denial::challenge`]; the reason goes to metrics and the log, never further.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Denial {
    /// No bearer token (RFC 6750 section 3.1: a challenge without an error code).
    Missing,
    /// A bearer token that does not verify, for whatever reason.
    InvalidToken(TokenError),
    /// A valid token of a sign-in without the second factor the route requires
    /// (RFC 9470 `insufficient_user_authentication`).
    SecondFactorRequired,
    /// The route's policy is not one authd understands: a misconfigured proxy. The
    /// request is refused (fail closed) with a server error, never let through.
    BadPolicy,
}

impl Denial {
    /// The HTTP status the proxy answers its client with.
    pub fn http_status(self) -> u16 {
        match self {
            Denial::Missing | Denial::InvalidToken(_) => 401,
            Denial::SecondFactorRequired => 403,
            Denial::BadPolicy => 500,
        }
    }

    /// The `google.rpc` code of Envoy's CheckResponse status.
    pub fn code(self) -> Code {
        match self {
            Denial::Missing | Denial::InvalidToken(_) => Code::Unauthenticated,
            Denial::SecondFactorRequired => Code::PermissionDenied,
            Denial::BadPolicy => Code::Internal,
        }
    }

    /// The `WWW-Authenticate` value (RFC 6750, RFC 9470), for the realm `realm` (a
    /// quoted-string's content, checked when configured); none for a bad policy.
    pub fn challenge(self, realm: &str) -> Option<String> {
        let error = match self {
            Denial::Missing => return Some(format!(r#"Bearer realm="{realm}""#)),
            Denial::InvalidToken(_) => "invalid_token",
            Denial::SecondFactorRequired => "insufficient_user_authentication",
            Denial::BadPolicy => return None,
        };
        Some(format!(r#"Bearer realm="{realm}", error="{error}""#))
    }

    /// The metric label and log field: the token error's label for a bad token.
    pub fn label(self) -> &'static str {
        match self {
            Denial::Missing => "missing_token",
            Denial::InvalidToken(e) => e.label(),
            Denial::SecondFactorRequired => "second_factor_required",
            Denial::BadPolicy => "bad_policy",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refusal_for_load_is_answered_as_its_status_would_be() {
        let whats = [
            "the request would not be answered before its deadline",
            "too many requests in flight",
            // Every byte tonic percent-encodes, and one past ASCII.
            "\"#%<>?`{} \u{7f}\t é",
        ];
        let waits =
            [0, 1, 10, 999, 1_000, 1_001, 2_500, 60_000, u64::MAX].map(Duration::from_millis);
        for what in whats {
            for wait in waits {
                let unsent = Unsent::Overloaded {
                    what,
                    retry_after: Duration::from_secs(1),
                };
                let direct = unsent.encode(Some(wait), http::HeaderMap::new());
                let err = Error::Overloaded {
                    what,
                    retry_after: wait,
                };
                let through_status: http::Response<tonic::body::Body> = err.to_status().into_http();
                assert_eq!(direct.status(), through_status.status());
                assert_eq!(
                    direct.headers(),
                    through_status.headers(),
                    "{what:?}, {wait:?}"
                );
                // And what the client reads of it.
                let read = Status::from_header_map(direct.headers()).unwrap();
                assert_eq!(read.code(), Code::ResourceExhausted);
                assert_eq!(
                    read.message(),
                    format!("server overloaded: {what}; retry later")
                );
                assert_eq!(
                    retry_hint(&read),
                    Some(wait.min(tonic_types::RetryInfo::MAX_RETRY_DELAY))
                );
            }
        }
    }

    #[test]
    fn a_held_refusal_keeps_everything_but_its_hint() {
        let status = Error::RateLimited {
            violations: vec![QuotaViolation {
                subject: "Login:peer=1/1m".into(),
                description: "1 per minute".into(),
            }],
            limit: 1,
            retry_after: Duration::from_secs(40),
        }
        .to_status();
        assert_eq!(retry_hint(&status), Some(Duration::from_secs(40)));
        let held = with_retry_hint(&status, Duration::from_millis(39_500));
        assert_eq!(held.code(), Code::ResourceExhausted);
        assert_eq!(held.message(), status.message());
        assert_eq!(retry_hint(&held), Some(Duration::from_millis(39_500)));
        let details = held.get_error_details();
        let quota = details.quota_failure().unwrap();
        assert_eq!(quota.violations[0].subject, "Login:peer=1/1m");
        let metadata = held.metadata();
        assert_eq!(metadata.get("retry-after").unwrap(), "40");
        assert_eq!(metadata.get("ratelimit-reset").unwrap(), "40");
        assert_eq!(metadata.get("ratelimit-limit").unwrap(), "1");
        // Nothing left to wait: the client may ask again at once.
        let now = with_retry_hint(&status, Duration::ZERO);
        assert_eq!(retry_hint(&now), Some(Duration::ZERO));
        assert_eq!(now.metadata().get("retry-after").unwrap(), "0");
        // Not a refusal with a hint: nothing to hold.
        assert_eq!(retry_hint(&Error::InvalidCredentials.to_status()), None);
        assert_eq!(retry_hint(&Error::DeadlineExceeded.to_status()), None);
    }

    #[test]
    fn a_throttle_refusal_names_what_was_counted_and_keeps_its_subject() {
        for (counted, message, description) in [
            (
                Counted::Logins,
                "too many failed logins for this account; retry later",
                "failed logins for this account",
            ),
            (
                Counted::ClientAuthentications,
                "too many failed authentications for this service account; retry later",
                "failed authentications for this service account",
            ),
            (
                Counted::ResetRequests,
                "too many password reset requests for this account; retry later",
                "password reset requests for this account",
            ),
            (
                Counted::ResetTokens,
                "too many wrong reset tokens from this client; retry later",
                "wrong reset tokens from this client",
            ),
        ] {
            let status = Error::Throttled {
                scope: ThrottleScope::Account,
                retry_after: Duration::from_millis(2500),
                counted,
            }
            .to_status();
            assert_eq!(status.code(), Code::ResourceExhausted);
            assert_eq!(status.message(), message);
            assert_eq!(retry_hint(&status), Some(Duration::from_millis(2500)));
            assert_eq!(status.metadata().get("retry-after").unwrap(), "3");
            let quota = status.get_details_quota_failure().unwrap();
            assert_eq!(quota.violations.len(), 1);
            assert_eq!(quota.violations[0].subject, "login-throttle:account");
            assert_eq!(quota.violations[0].description, description);
        }
    }

    #[test]
    fn waits_round_up_to_whole_seconds() {
        assert_eq!(whole_seconds(Duration::ZERO), 0);
        assert_eq!(whole_seconds(Duration::from_millis(1)), 1);
        assert_eq!(whole_seconds(Duration::from_secs(2)), 2);
        assert_eq!(whole_seconds(Duration::from_millis(2001)), 3);
        let status = Error::Overloaded {
            what: "full",
            retry_after: Duration::from_millis(100),
        }
        .to_status();
        assert_eq!(status.metadata().get("retry-after").unwrap(), "1");
    }
}
