//! authd: a gRPC authentication service.
//!
//! It serves `auth.v1.AuthService` (Register, Login, ValidateToken), the standard
//! `grpc.health.v1.Health` service and server reflection. Passwords are stored as
//! PBKDF2-SHA256 PHC strings; tokens are stateless JWTs signed with HMAC-SHA256.
//!
//! # Layout
//!
//! A request passes each box once, top to bottom; nothing calls back up the stack.
//!
//! ```text
//! tonic Server
//!   trace::TraceLayer           request id, one log event and the request metrics per request
//!   ratelimit::RateLimitLayer   per-rule sliding windows, on Redis or in process (reject)
//!   admission::AdmissionLayer   deadline, concurrency cap and drain (reject, never queue)
//!   grpc::AuthService           proto <-> domain; the one place errors become a Status
//!   accounts::Accounts          the register / login / validate use cases
//!     store::Store              SQLite (reader pool + one batching writer) or PostgreSQL (pool)
//!     password::Hasher          PBKDF2 on a bounded thread pool, off the async runtime
//!     token::Tokens             JWT HS256 with a key ring (kid -> key)
//! ```
//!
//! - [`config`]: the one `Config` (flags and `AUTHD_*` environment variables).
//! - [`app`]: [`app::Application`] binds, wires everything and runs until shut down;
//!   `main.rs` and the integration tests start the service through it.
//! - [`bench`]: the `authbench` load generator and `authd hash-bench`; measures the
//!   service from outside and is used by nothing in it.
//! - [`credentials`]: `Username` and `Password`, parsed and normalized at the edge.
//! - [`health`]: drives the `grpc.health.v1` status from periodic store checks.
//! - [`healthcheck`]: `authd health`, the client side: one check, turned into an exit status.
//! - [`metrics`]: the Prometheus registry of one application, its metrics, and the
//!   `GET /metrics` endpoint (`AUTHD_METRICS_LISTEN`).
//! - [`ratelimit`]: the rules of `AUTHD_RATE_LIMITS`, the Redis script and the local fallback.
//! - [`telemetry`]: the `tracing` subscriber (text or JSON lines).
//! - [`trace`]: the outermost layer: request ids, one log event per request, request metrics.
#![forbid(unsafe_code)]

pub mod accounts;
pub mod admission;
pub mod app;
pub mod bench;
pub mod config;
pub mod credentials;
pub mod error;
pub mod grpc;
pub mod health;
pub mod healthcheck;
pub mod metrics;
pub mod password;
pub mod ratelimit;
pub mod store;
pub mod telemetry;
pub mod token;
pub mod trace;

/// Code generated from `proto/auth/v1/auth.proto`.
pub mod pb {
    #![allow(clippy::all, missing_docs)]
    tonic::include_proto!("auth.v1");

    /// The encoded descriptor set of `auth.v1`, served by reflection.
    pub const FILE_DESCRIPTOR_SET: &[u8] = tonic::include_file_descriptor_set!("auth_descriptor");
}
