//! Redis, as every part of authd that uses it sees it: the process's one connection
//! ([`SharedRedis`]), whether it answers ([`Health`], one flag for every user, and
//! the prober that brings it back), why a call failed ([`RedisFailure`]) and the
//! bound on every call ([`within`]), and what a request meets while Redis fails
//! ([`FailureMode`]).
//! The rate limiter and the login throttle stand on it; it stands on nothing of
//! theirs.
//!
//! One job per file:
//! - `connection`: the shared connection (one server, a Redis Cluster, or a master
//!   found through Sentinel and found again after a failover), made once and kept,
//!   and its calls;
//! - `health`: the flag, and the prober;
//! - `error`: the one failure type and the timeout of a call.
//!
//! It must not decide for its users: what a key means, what a script does, and
//! whether a request falls back or is refused stay with them.

mod connection;
mod error;
mod health;

#[cfg(test)]
pub(crate) use connection::Link;
pub use connection::SharedRedis;
pub(crate) use error::RedisFailure;
use error::within;
pub(crate) use health::{CONNECT_TIMEOUT, Health};

/// What to do with a request a rule matches while Redis fails.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum FailureMode {
    /// Enforce the same rules per replica with the in-process limiter.
    Open,
    /// Refuse with UNAVAILABLE until Redis answers again.
    Closed,
}
