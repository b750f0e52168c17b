//! The request path's tower layers, outermost first, each in a file of its own and
//! each built on the shell they share (`crate::middleware`): it refuses fast and
//! never queues.
//!
//! - `trace`: request id, one log event and the request metrics per request;
//!   `refusal_log` (not a layer) is its budget of refusal lines a second;
//! - `pushback`: refusals with a retry hint held on a timer before their answer;
//! - `access`: the mutual-TLS allow-list, identity per method (PERMISSION_DENIED);
//! - `ratelimit`: the rate limits of `AUTHD_RATE_LIMITS`, refused at once with
//!   RESOURCE_EXHAUSTED, decided by `crate::ratelimit`'s limiter;
//! - `admission`: whole request first, admitted when it can be answered before its
//!   deadline, memory bounds (in-flight cap, share per client), drain;
//! - `pace` (not a layer): the measured rate of answers of one kind of request and
//!   the time it predicts for the next, which `admission` keeps.
//!
//! Below them, `crate::codec` decodes the request for the handler.
//!
//! A layer imports the bottom floor (`rpc`, `error`, `middleware`, `metrics`,
//! `otel`), and the rate-limit layer its limiter (`crate::ratelimit`); none
//! imports the handler or another layer.

pub(crate) mod access;
pub(crate) mod admission;
pub(crate) mod pace;
pub(crate) mod pushback;
pub(crate) mod ratelimit;
pub(crate) mod refusal_log;
pub(crate) mod trace;
