//! authbench: the load generator for authd.
//!
//! This package owns everything that *measures* authd from the outside, and speaks
//! to it only through the gRPC clients generated from authd's protos (the admin
//! API's only to create service accounts before a run and to watch the account
//! events; and the standard health client, Envoy's rate limit client for the
//! ratelimit scenario and its external authorization client for the check
//! scenario, from the `envoy-types` crate); nothing in the server depends on it. It also loads the service
//! authd replaces, the report's FastAPI one kept in `bench/report-service/` as the
//! benchmark's comparator, over HTTP/1.1 with JSON (`--protocol http`), and reports
//! it in the same shape. It is a library (not only a binary) so that its tests drive
//! the same runner the binary does, against an authd started in-process on port 0.
//!
//! - [`cli`]: the `authbench` command line, checked and turned into a [`Plan`].
//! - [`protocol`]: gRPC (authd) or HTTP/1.1 JSON (the report's service).
//! - [`scenario`]: the operations (health, register, login, validate, refresh,
//!   ratelimit, check, grant, exchange; and the events the events scenario
//!   receives), the weighted mix that decides which one each request is, and the
//!   descriptors a ratelimit request asks.
//! - [`schedule`]: the open-loop send schedule and the default connection count.
//! - [`runner`]: connects, prepares users and tokens, drives the closed or open loop
//!   (or, for events, watches the admin port's stream) and records every outcome.
//! - [`report`]: the histogram-backed [`Recorder`](report::Recorder), the arithmetic
//!   (QPS, percentiles, success rate) and the table / JSON renderings.
//!
//! The hash-bound limit that the suite compares QPS with comes from `authd hash-bench`,
//! a subcommand of authd itself (it runs the server's hashing code).
//!
//! What it must not do: hide queueing. Closed-loop latency is measured from the
//! moment a request is sent; open-loop latency from the moment it was *meant* to be
//! sent, so a stalled server cannot make its own queue invisible (no coordinated
//! omission).
//!
//! The one `unsafe` block is the open loop's timer (`runner::pacer`): tokio asks its
//! caller to promise that a descriptor it watches stays open.

#![deny(unsafe_code)]

pub mod cli;
mod progress;
pub mod protocol;
pub mod report;
pub mod runner;
pub mod scenario;
pub mod schedule;

pub use protocol::Protocol;
pub use report::Report;
pub use runner::{Load, Plan, Stop, run};
pub use scenario::{Mix, Operation, Scenario};

/// The gRPC client generated from `proto/auth/v1/auth.proto`.
pub mod pb {
    #![allow(clippy::all, missing_docs)]
    tonic::include_proto!("auth.v1");
}

/// The admin client generated from `proto/auth/admin/v1/admin.proto`, for the
/// service accounts the grant, exchange and validate-service scenarios create.
pub mod admin_pb {
    #![allow(clippy::all, missing_docs)]
    tonic::include_proto!("auth.admin.v1");
}
