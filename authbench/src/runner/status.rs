//! How a request's failure is told: a status the server sent versus one the
//! client made up, and errors written on one line with their causes.
//!
//! It classifies and describes; it sends nothing and records nothing.

use crate::report::{self, Outcome};
use tonic::Status;

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
    use tonic::Code;

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
}
