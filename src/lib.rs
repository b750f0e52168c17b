//! authd: a gRPC authentication service.
//!
//! It serves `auth.v1.AuthService` (Register, Login, ValidateToken, and the session
//! lifecycle: Refresh, Logout, ChangePassword), the standard
//! `grpc.health.v1.Health` service and server reflection. Passwords are stored as
//! PBKDF2-SHA256 PHC strings; tokens are stateless JWTs signed with Ed25519 (their
//! public keys published as a JWKS document) or HMAC-SHA256.
//!
//! # Layout
//!
//! A request passes each box once, top to bottom; nothing calls back up the stack,
//! and the imports run the same way: every layer and the handler stand on the
//! bottom floor (`rpc`, `error`), never on each other.
//!
//! ```text
//! transport                     accept loop and per-connection bounds (hyper, HTTP/2), TLS
//!                               and mutual TLS (rustls, files reloaded live)
//!   layers::trace               request id, one log event and the request metrics per request
//!   layers::pushback            refusals with a retry hint held on a timer before their answer
//!   layers::access              mutual TLS allow-list: identity per method (PERMISSION_DENIED)
//!   ratelimit::layer            per-rule sliding windows, on Redis or in process (reject)
//!   layers::admission           whole request first, share per client, in-flight cap,
//!                               deadline, drain (reject, never queue)
//!   codec                       protobuf decoding; malformed -> INVALID_ARGUMENT, generic
//!   grpc                        proto <-> domain, for auth.v1.AuthService
//!   accounts                    the register / login / validate / session use cases
//!     revocation                ended sessions in memory, for ValidateToken
//!     store                     SQLite (reader pool + one batching writer) or PostgreSQL (pool)
//!     password                  the PBKDF2 policy, on a pool of hashing threads behind a
//!                               queue bounded by time and count, fair between clients
//!     token                     JWT EdDSA / HS256 with a key ring (kid -> key)
//! ```
//!
//! The bottom floor, which every module above may import:
//! - `rpc`: which RPC a path is, the exempt rule, the request extensions (request
//!   id, deadline, user id, client certificate identity), the `grpc-timeout` header
//!   and who sent a request.
//! - `error`: the domain error, and its one mapping to a gRPC `Status`.
//! - `middleware`: the Layer/Service shell the layers share.
//! - `metrics`: the Prometheus registry of one application, its metrics, and the
//!   router of the plain-HTTP port (`GET /metrics`).
//! - [`otel`]: the OpenTelemetry traces of one application: the server span the
//!   trace layer starts, and the child spans (rate limit, hash queue and hash,
//!   store operations, tokens) started from the request's context.
//! - `redis`: the process's one Redis connection, whether it answers (one flag for
//!   the rate limiter and the login throttle, and the prober that brings it back),
//!   the one failure of a call and its timeout, and the failure mode.
//! - `clock`: the time of the code that counts over time, faked in tests.
//!
//! Around the request path:
//! - [`app`]: [`app::Application`] binds, wires everything and runs until shut down;
//!   `main.rs`, the integration tests and authbench's tests start the service through it.
//! - [`config`]: the command line and the one `Config` (flags and `AUTHD_*` environment
//!   variables), one group of options per component, each building its component's settings.
//! - `secret`: secret-bearing settings: URLs printed with their passwords hidden, and
//!   the value parser whose errors never quote a secret.
//! - [`credentials`]: `Username` and `Password`, parsed and normalized at the edge.
//! - `refresh`: refresh tokens (random, rotated by a per-session key, stored as a digest).
//! - `blocklist`: the common-password list (bundled, plus an organization's file) and
//!   the rule that a new password is neither on it nor the username; checked before hashing.
//! - [`audit`]: the audit trail, one event per security outcome on `authd::audit`.
//! - `token::keyfile`: the token key file, re-read while serving; a bad file keeps the ring.
//! - `token::jwks`: `GET /.well-known/jwks.json` on the plain-HTTP port, the public keys.
//! - `health`: readiness from store probes and real request failures; liveness.
//! - [`health::check`]: `authd health`, the client side: one check, turned into an exit status.
//! - [`password`]: also `authd hash-bench` (`password::bench`), this machine's hashing rate.
//! - [`telemetry`]: the `tracing` subscriber (text or JSON lines).
//! - [`priority`]: the OS scheduling priority of the runtime's and the hashing threads.
//!
//! The load generator is a package of its own (`authbench/`), a gRPC client of authd
//! and nothing more.
#![forbid(unsafe_code)]

pub(crate) mod accounts;
pub mod app;
pub mod audit;
pub(crate) mod blocklist;
pub(crate) mod clock;
pub(crate) mod codec;
pub mod config;
pub mod credentials;
pub(crate) mod error;
pub(crate) mod grpc;
pub mod health;
pub(crate) mod layers;
pub(crate) mod metrics;
pub(crate) mod middleware;
pub mod otel;
pub mod password;
pub mod priority;
pub mod ratelimit;
pub(crate) mod redis;
pub(crate) mod refresh;
pub(crate) mod revocation;
pub(crate) mod rpc;
pub(crate) mod secret;
pub(crate) mod store;
pub mod telemetry;
pub mod throttle;
pub mod token;
pub(crate) mod transport;

/// Code generated from `proto/auth/v1/auth.proto`.
pub mod pb {
    #![allow(clippy::all, missing_docs)]
    tonic::include_proto!("auth.v1");
    // The client, generated apart on prost's own codec (see build.rs).
    include!(concat!(env!("OUT_DIR"), "/client/auth.v1.rs"));

    /// The encoded descriptor set of `auth.v1`, served by reflection.
    pub const FILE_DESCRIPTOR_SET: &[u8] = tonic::include_file_descriptor_set!("auth_descriptor");
}
