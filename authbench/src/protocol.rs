//! How authbench speaks to its target: gRPC (authd), authd's HTTP forms on its gRPC
//! port (the Connect protocol's unary JSON, gRPC-Web), or HTTP/1.1 with JSON bodies
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
    /// authd's JSON form over HTTP/1.1 (the Connect protocol's unary JSON): POST
    /// /auth.v1.AuthService/Login and the like, the deadline in Connect-Timeout-Ms.
    Json,
    /// gRPC-Web over HTTP/1.1 (binary), the deadline in grpc-timeout.
    #[serde(rename = "grpc-web")]
    GrpcWeb,
}

impl Protocol {
    pub fn name(self) -> &'static str {
        match self {
            Protocol::Grpc => "grpc",
            Protocol::Http => "http",
            Protocol::Json => "json",
            Protocol::GrpcWeb => "grpc-web",
        }
    }

    /// Whether the load travels over HTTP/1.1, a keep-alive connection per request
    /// in flight.
    pub fn over_http1(self) -> bool {
        matches!(self, Protocol::Http | Protocol::Json | Protocol::GrpcWeb)
    }

    /// Whether the target is authd, waited for and set up over gRPC (whatever the
    /// load then speaks).
    pub fn is_authd(self) -> bool {
        matches!(self, Protocol::Grpc | Protocol::Json | Protocol::GrpcWeb)
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
