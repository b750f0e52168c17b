//! How authbench speaks to its target: gRPC (authd), or HTTP/1.1 with JSON bodies
//! (the report's service, the comparator kept in `bench/report-service/`).
//!
//! Only the choice lives here; the gRPC clients and the HTTP/1.1 connections are the
//! runner's (`runner/connect.rs`, `runner/http.rs`).

use serde::Serialize;
use std::fmt;

/// The wire protocol of the target.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Protocol {
    /// authd: auth.v1.AuthService and grpc.health.v1.Health over HTTP/2.
    #[default]
    Grpc,
    /// HTTP/1.1 with JSON bodies: POST /register and POST /login taking
    /// {"username", "password"}, GET /health (the report's service).
    Http,
}

impl Protocol {
    pub fn name(self) -> &'static str {
        match self {
            Protocol::Grpc => "grpc",
            Protocol::Http => "http",
        }
    }

    /// Whether this is gRPC (for serde's `skip_serializing_if`: the reports of gRPC
    /// runs are unchanged by the HTTP mode).
    pub fn is_grpc(&self) -> bool {
        *self == Protocol::Grpc
    }
}

impl fmt::Display for Protocol {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}
