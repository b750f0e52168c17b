//! What several groups share: the parser of positive durations, the reading of a
//! secret from a file, and [`MetricsListen`], an address to listen on or none.
//!
//! Nothing here knows a component or an option of its own; the groups name their
//! options in the errors they build from these.

use anyhow::Context as _;
use std::{fmt, net::SocketAddr, path::Path, str::FromStr, time::Duration};

pub(super) fn positive_duration(s: &str) -> Result<Duration, String> {
    let d = humantime::parse_duration(s).map_err(|e| format!("{e} (examples: 500ms, 15m, 1h)"))?;
    if d.is_zero() {
        return Err("must be greater than zero".into());
    }
    Ok(d)
}

/// Reads one secret from a file: the whole file, surrounding whitespace trimmed.
pub(super) fn read_secret_file<T: FromStr<Err = String>>(
    option: &str,
    path: &Path,
) -> anyhow::Result<T> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("{option} {}: cannot read the file", path.display()))?;
    let text = text.trim();
    if text.is_empty() {
        anyhow::bail!("{option} {}: the file is empty", path.display());
    }
    text.parse()
        .map_err(|why| anyhow::anyhow!("{option} {}: {why}", path.display()))
}

/// Where the metrics endpoint listens, if anywhere.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MetricsListen(pub Option<SocketAddr>);

impl MetricsListen {
    pub const OFF: MetricsListen = MetricsListen(None);

    pub fn addr(&self) -> Option<SocketAddr> {
        self.0
    }
}

impl FromStr for MetricsListen {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim() {
            "" | "off" => Ok(MetricsListen::OFF),
            addr => addr.parse().map(|a| MetricsListen(Some(a))).map_err(|_| {
                format!("{addr:?} is not an address (expected HOST:PORT, e.g. 0.0.0.0:9090, or empty for none)")
            }),
        }
    }
}

impl fmt::Display for MetricsListen {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Some(addr) => write!(f, "{addr}"),
            None => f.write_str("off"),
        }
    }
}
