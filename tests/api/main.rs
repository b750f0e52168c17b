//! Integration tests: authd on 127.0.0.1:0, a real SQLite file, a real tonic client.

mod bench;
mod cli;
mod errors;
mod helpers;
mod lifecycle;
mod load;
mod metrics;
mod ratelimit;
mod reflection;
mod register;
mod replicas;
mod tokens;
