//! Logging: a `tracing` subscriber writing text or JSON lines to stderr.
//!
//! Nothing secret is ever recorded: handlers log methods, codes and latencies, never
//! passwords, keys or tokens.

use crate::config::LogFormat;
use tracing_subscriber::EnvFilter;

/// Installs the global subscriber. Fails if one is installed already.
pub fn init(filter: &str, format: LogFormat) -> anyhow::Result<()> {
    let filter = EnvFilter::try_new(filter)?;
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
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
