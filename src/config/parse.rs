//! What several groups share: the parser of positive durations, the reading of a
//! secret from a file and of a PEM bundle of CAs, and [`MetricsListen`], an address
//! to listen on or none.
//!
//! Nothing here knows a component or an option of its own; the groups name their
//! options in the errors they build from these.

use anyhow::Context as _;
use std::{fmt, net::SocketAddr, path::Path, str::FromStr, time::Duration};
use tokio_rustls::rustls::{
    RootCertStore,
    pki_types::{CertificateDer, pem::PemObject as _},
};

/// The most a PEM bundle of CAs may weigh (the TLS files' bound).
const MAX_CA_BUNDLE_BYTES: u64 = 4 << 20;

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

/// Reads a PEM bundle of CA certificates, the trust anchors of a TLS client. A file
/// that cannot be read, is not PEM, or holds no certificate is refused. An error names
/// the option and the file, never what the file holds (a key put there by mistake
/// stays out of the log).
pub(super) fn read_ca_bundle(option: &str, path: &Path) -> anyhow::Result<RootCertStore> {
    let refused = |why: &str| anyhow::anyhow!("{option} {}: {why}", path.display());
    let meta =
        std::fs::metadata(path).map_err(|e| refused(&format!("cannot read the file: {e}")))?;
    if meta.len() > MAX_CA_BUNDLE_BYTES {
        return Err(refused("the file is larger than 4 MiB"));
    }
    let pem = std::fs::read(path).map_err(|e| refused(&format!("cannot read the file: {e}")))?;
    // The parser's errors quote the lines they stumbled on: never shown.
    let certs = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|_| refused("not a valid PEM file"))?;
    if certs.is_empty() {
        return Err(refused("no PEM certificate in the file"));
    }
    let mut roots = RootCertStore::empty();
    for cert in certs {
        roots
            .add(cert)
            .map_err(|_| refused("a certificate of the file is not a valid X.509 certificate"))?;
    }
    Ok(roots)
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
