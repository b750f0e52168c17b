//! The load generator behind the `authbench` binary, and `authd hash-bench`.
//!
//! This module owns everything that *measures* authd from the outside; nothing in
//! the server depends on it. It is a library module (not only a binary) so that the
//! integration tests drive the same runner the binary does, against an app on port 0.
//!
//! - [`cli`]: the `authbench` command line, checked and turned into a [`Plan`].
//! - [`scenario`]: the operations (health, register, login, validate) and the weighted
//!   mix that decides which one each request is.
//! - [`schedule`]: the open-loop send schedule and the default connection count.
//! - [`runner`]: connects, prepares users and tokens, drives the closed or open loop
//!   and records every outcome.
//! - [`report`]: the histogram-backed [`Recorder`](report::Recorder), the arithmetic
//!   (QPS, percentiles, success rate) and the table / JSON renderings.
//! - [`hashbench`]: `authd hash-bench`, the machine's PBKDF2 rate with the server's own
//!   hashing code: the hash-bound limit no login or registration can beat.
//!
//! What it must not do: hide queueing. Closed-loop latency is measured from the
//! moment a request is sent; open-loop latency from the moment it was *meant* to be
//! sent, so a stalled server cannot make its own queue invisible (no coordinated
//! omission).

pub mod cli;
pub mod hashbench;
mod progress;
pub mod report;
pub mod runner;
pub mod scenario;
pub mod schedule;

pub use report::Report;
pub use runner::{Load, Plan, Stop, run};
pub use scenario::{Mix, Operation, Scenario};
