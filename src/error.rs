//! The errors a request can end with, as the domain sees them.
//!
//! Every layer and use case returns [`Error`]; `grpc::status` turns it into a gRPC
//! `Status` in one match. The variants separate the caller's fault (bad input, wrong
//! credentials) from the server's state (full, unavailable) and from the unexpected,
//! whose cause is logged and never sent to the client.

use std::time::Duration;

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
    InvalidToken(#[from] crate::token::TokenError),
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
    #[error("deadline exceeded before the work could be done")]
    DeadlineExceeded,
    /// The database cannot be reached, or the server is shutting down.
    #[error("service unavailable: {0}")]
    Unavailable(String),
    #[error(transparent)]
    Internal(#[from] anyhow::Error),
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
