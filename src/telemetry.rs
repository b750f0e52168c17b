//! Logging: a `tracing` subscriber writing text or JSON lines to stderr.
//!
//! Nothing secret is ever recorded: the trace layer logs methods, codes, latencies
//! and user ids (one event per request), never passwords, keys or tokens.

use crate::config::LogFormat;
use std::io::IsTerminal as _;
use tracing_subscriber::EnvFilter;

/// Installs the global subscriber. Fails if one is installed already.
pub fn init(filter: &str, format: LogFormat) -> anyhow::Result<()> {
    let filter = EnvFilter::try_new(filter)?;
    // Colours only for a person at a terminal, never in files or log collectors.
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr);
    let result = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder
            .json()
            .flatten_event(true)
            .with_current_span(false)
            .try_init(),
    };
    result.map_err(|e| anyhow::anyhow!("installing the log subscriber: {e}"))
}
