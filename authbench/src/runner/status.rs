//! How a request's failure is told: a status the server sent versus one the
//! client made up, an HTTP status as the gRPC code it stands for, and errors
//! written on one line with their causes.
//!
//! It classifies and describes; it sends nothing and records nothing.

use crate::report::{self, Outcome};
use http::StatusCode;
use tonic::{Code, Status};

/// Why a request got no answer from the server, kept to describe the first one.
pub(super) enum Failure {
    /// A status tonic made up (its transport failed) or the client's own timeout.
    Grpc(Status),
    /// The HTTP/1.1 connection failed, or no answer came by the deadline.
    Http(anyhow::Error),
}

impl Failure {
    pub(super) fn describe(&self) -> String {
        match self {
            Failure::Grpc(status) => describe_status(status),
            Failure::Http(error) => format!("{error:#}"),
        }
    }
}

/// A status the server sent, or one the client made up because it got none.
///
/// tonic builds the statuses it reads from the server's trailers without a source
/// error; the ones it makes from a transport failure (connection refused or reset,
/// stream reset, protocol error) carry the failure as their source.
pub(super) fn classify(status: &Status) -> Outcome {
    if std::error::Error::source(status).is_some() {
        Outcome::Connection
    } else {
        Outcome::Status(status.code())
    }
}

/// The gRPC code an HTTP answer's status stands for, so that the report of a run
/// over HTTP reads like one over gRPC (a refusal for load is RESOURCE_EXHAUSTED or
/// UNAVAILABLE in both).
///
/// | HTTP | outcome |
/// |---|---|
/// | 2xx | OK |
/// | 400, 422 | INVALID_ARGUMENT |
/// | 401 | UNAUTHENTICATED |
/// | 403 | PERMISSION_DENIED |
/// | 404 | NOT_FOUND |
/// | 408, 504 | DEADLINE_EXCEEDED |
/// | 409 | ALREADY_EXISTS |
/// | 429 | RESOURCE_EXHAUSTED |
/// | 501 | UNIMPLEMENTED |
/// | 503 | UNAVAILABLE |
/// | other 5xx | INTERNAL |
/// | anything else (1xx, 3xx, other 4xx) | UNKNOWN |
pub(super) fn http_code(status: StatusCode) -> Code {
    match status.as_u16() {
        200..=299 => Code::Ok,
        400 | 422 => Code::InvalidArgument,
        401 => Code::Unauthenticated,
        403 => Code::PermissionDenied,
        404 => Code::NotFound,
        408 | 504 => Code::DeadlineExceeded,
        409 => Code::AlreadyExists,
        429 => Code::ResourceExhausted,
        501 => Code::Unimplemented,
        503 => Code::Unavailable,
        500..=599 => Code::Internal,
        _ => Code::Unknown,
    }
}

/// `CODE: message`, plus the chain of causes of a client-side error.
pub(super) fn describe_status(status: &Status) -> String {
    let head = format!("{}: {}", report::code_name(status.code()), status.message());
    append_causes(head, std::error::Error::source(status))
}

/// An error and its causes on one line, `a: b: c`.
pub(super) fn error_chain(error: &(dyn std::error::Error + 'static)) -> String {
    append_causes(error.to_string(), error.source())
}

/// Appends each cause, skipping those whose text is already there: hyper and tonic
/// often repeat their source's message in their own.
fn append_causes(
    mut text: String,
    mut source: Option<&(dyn std::error::Error + 'static)>,
) -> String {
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !text.contains(&cause_text) {
            text.push_str(": ");
            text.push_str(&cause_text);
        }
        source = cause.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn statuses_from_the_server_are_codes_and_the_rest_client_errors() {
        assert_eq!(
            classify(&Status::resource_exhausted("full")),
            Outcome::Status(Code::ResourceExhausted)
        );
        let io = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "refused");
        let mut made_up = Status::unavailable("transport error");
        made_up.set_source(Arc::new(io));
        assert_eq!(classify(&made_up), Outcome::Connection);
        assert_eq!(
            describe_status(&made_up),
            "UNAVAILABLE: transport error: refused"
        );
    }

    #[test]
    fn http_statuses_stand_for_grpc_codes() {
        let code_of = |status: u16| http_code(StatusCode::from_u16(status).unwrap());
        for (status, code) in [
            (200, Code::Ok),
            (201, Code::Ok),
            (204, Code::Ok),
            (400, Code::InvalidArgument),
            (401, Code::Unauthenticated),
            (403, Code::PermissionDenied),
            (404, Code::NotFound),
            (408, Code::DeadlineExceeded),
            (409, Code::AlreadyExists),
            (422, Code::InvalidArgument),
            (429, Code::ResourceExhausted),
            (500, Code::Internal),
            (501, Code::Unimplemented),
            (502, Code::Internal),
            (503, Code::Unavailable),
            (504, Code::DeadlineExceeded),
            (101, Code::Unknown),
            (302, Code::Unknown),
            (418, Code::Unknown),
        ] {
            assert_eq!(code_of(status), code, "HTTP {status}");
        }
    }

    #[test]
    fn an_http_failure_is_described_with_its_causes() {
        let io = std::io::Error::new(std::io::ErrorKind::ConnectionReset, "reset by peer");
        let failure = Failure::Http(anyhow::Error::new(io).context("POST /login"));
        assert_eq!(failure.describe(), "POST /login: reset by peer");
    }
}
