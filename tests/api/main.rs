//! Integration tests: authd on 127.0.0.1:0, a real SQLite file, a real tonic client.

mod blocklist;
mod cli;
mod concurrency;
mod errors;
mod h2raw;
mod helpers;
mod input;
mod jwks;
mod lifecycle;
mod load;
mod metrics;
mod outage;
mod overload;
mod ratelimit;
mod reflection;
mod register;
mod replicas;
mod secrets;
mod sessions;
mod storage;
mod throttle;
mod timing;
mod tls;
mod tokens;
mod tracing;
mod transport;
