//! Integration tests: authd on 127.0.0.1:0, a real SQLite file, a real tonic client.

mod cli;
mod errors;
mod helpers;
mod lifecycle;
mod load;
mod reflection;
mod register;
mod tokens;
