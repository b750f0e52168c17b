//! The client side of a connection to a running authd, shared by the commands that
//! call one (`authd health`, `authd admin`): an address given as `HOST:PORT` (or an
//! `http://` / `https://` URL) made into a tonic [`Endpoint`], plain-text or TLS
//! ([`ClientTls`]: `--tls-ca`, `--tls-cert`/`--tls-key`, `--tls-server-name`), the
//! loopback address of a local listener, a timeout told apart from other failures,
//! and errors written as one line.
//!
//! It owns nothing of the server and imports nothing of the crate: each command
//! turns these errors into its own words and exit status.

use std::{
    net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr},
    path::PathBuf,
    time::Duration,
};
use tonic::{
    Code, Status,
    transport::{Certificate, ClientTlsConfig, Endpoint, Identity},
};

/// The client side of TLS: whom to trust, what to present, which name to expect.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClientTls {
    /// PEM bundle of the CAs the server's certificate must chain to [default: the
    /// Mozilla roots of webpki-roots].
    pub ca: Option<PathBuf>,
    /// PEM certificate (and chain) to present, for a server with mutual TLS.
    pub cert: Option<PathBuf>,
    /// PEM private key of `cert`.
    pub key: Option<PathBuf>,
    /// The name the server's certificate must carry [default: the host of the address].
    pub server_name: Option<String>,
}

impl ClientTls {
    /// Whether any option is set (which means TLS, whatever the address's scheme).
    pub fn is_set(&self) -> bool {
        *self != ClientTls::default()
    }

    /// tonic's TLS configuration; an error names the option and the file, never what
    /// the file holds.
    pub fn config(&self) -> Result<ClientTlsConfig, String> {
        let read = |option: &str, path: &PathBuf| {
            std::fs::read(path)
                .map_err(|e| format!("{option} {}: cannot read the file: {e}", path.display()))
        };
        let mut config = ClientTlsConfig::new();
        config = match &self.ca {
            Some(path) => config.ca_certificate(Certificate::from_pem(read("--tls-ca", path)?)),
            None => config.with_webpki_roots(),
        };
        match (&self.cert, &self.key) {
            (Some(cert), Some(key)) => {
                let identity =
                    Identity::from_pem(read("--tls-cert", cert)?, read("--tls-key", key)?);
                config = config.identity(identity);
            }
            (None, None) => {}
            _ => return Err("--tls-cert and --tls-key go together".into()),
        }
        if let Some(name) = &self.server_name {
            config = config.domain_name(name.clone());
        }
        Ok(config)
    }
}

/// Why no endpoint could be made of the options given.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BadEndpoint {
    /// The address is not usable (the cause, without the address).
    Address(String),
    /// A TLS option is not usable (a file that cannot be read).
    Tls(String),
}

/// The endpoint of `addr` (`HOST:PORT`, `http://HOST:PORT` or `https://HOST:PORT`):
/// TLS for `https://` or when `tls` has an option set; connecting may take at most
/// `connect_timeout`.
pub fn endpoint(
    addr: &str,
    connect_timeout: Duration,
    tls: &ClientTls,
) -> Result<Endpoint, BadEndpoint> {
    let url = to_url(addr, tls.is_set()).map_err(BadEndpoint::Address)?;
    let mut endpoint = Endpoint::from_shared(url.clone())
        .map_err(|e| BadEndpoint::Address(error_chain(&e)))?
        .connect_timeout(connect_timeout);
    if url.starts_with("https://") {
        let config = tls.config().map_err(BadEndpoint::Tls)?;
        endpoint = endpoint
            .tls_config(config)
            .map_err(|e| BadEndpoint::Tls(format!("TLS options: {}", error_chain(&e))))?;
    }
    Ok(endpoint)
}

/// Whether a call's status says that its time ran out: the server gave up at the
/// request's `grpc-timeout` (DEADLINE_EXCEEDED), or tonic did on this side (which
/// it reports as CANCELLED "Timeout expired").
pub fn timed_out(status: &Status) -> bool {
    match status.code() {
        Code::DeadlineExceeded => true,
        Code::Cancelled => status.message() == tonic::TimeoutExpired(()).to_string(),
        _ => false,
    }
}

/// Where a server listening on `listen` answers locally: an unspecified address
/// (`0.0.0.0`, `[::]`) becomes loopback, so the default works inside a container.
pub fn local_addr(listen: SocketAddr) -> SocketAddr {
    let ip = match listen.ip() {
        IpAddr::V4(ip) if ip.is_unspecified() => IpAddr::V4(Ipv4Addr::LOCALHOST),
        IpAddr::V6(ip) if ip.is_unspecified() => IpAddr::V6(Ipv6Addr::LOCALHOST),
        ip => ip,
    };
    SocketAddr::new(ip, listen.port())
}

/// `HOST:PORT` → `http://HOST:PORT` (`https://` when `tls`); `http://` and `https://`
/// URLs are kept; other schemes and paths are refused.
fn to_url(addr: &str, tls: bool) -> Result<String, String> {
    let addr = addr.trim();
    let url = match addr.split_once("://") {
        None if tls => format!("https://{addr}"),
        None => format!("http://{addr}"),
        Some(("http", _)) if tls => {
            return Err(
                "TLS options given with an http:// address (use https:// or HOST:PORT)".into(),
            );
        }
        Some(("http" | "https", _)) => addr.to_owned(),
        Some((scheme, _)) => return Err(format!("unsupported scheme {scheme:?}")),
    };
    let uri: http::Uri = url.parse().map_err(|e| format!("not HOST:PORT ({e})"))?;
    if uri.host().is_none_or(str::is_empty) || uri.port_u16().is_none() {
        return Err("expected HOST:PORT, e.g. 127.0.0.1:50051".into());
    }
    if uri.path_and_query().is_some_and(|p| p.as_str() != "/") {
        return Err("expected HOST:PORT, without a path".into());
    }
    Ok(url.trim_end_matches('/').to_owned())
}

/// An error with its causes, deduplicated: transport errors nest the same text.
pub fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut parts: Vec<String> = Vec::new();
    let mut next = Some(e);
    while let Some(err) = next {
        let text = err.to_string();
        if !parts.iter().any(|p| p.contains(&text)) {
            parts.push(text);
        }
        next = err.source();
    }
    parts.join(": ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_become_urls() {
        let url = |a: &str| to_url(a, false);
        assert_eq!(url("127.0.0.1:50051").unwrap(), "http://127.0.0.1:50051");
        assert_eq!(url("http://authd:50051/").unwrap(), "http://authd:50051");
        assert_eq!(url("[::1]:50051").unwrap(), "http://[::1]:50051");
        assert_eq!(url("https://authd:50051").unwrap(), "https://authd:50051");
        assert!(url("authd").is_err(), "a port is required");
        assert!(url("authd:50051/x").is_err());
        assert!(url("ftp://authd:21").is_err());
        // With TLS options: https, whether said or not; http:// is a contradiction.
        assert_eq!(to_url("authd:1", true).unwrap(), "https://authd:1");
        assert_eq!(to_url("https://authd:1", true).unwrap(), "https://authd:1");
        assert!(to_url("http://authd:1", true).unwrap_err().contains("TLS"));
    }

    #[test]
    fn the_default_address_is_loopback_on_the_listen_port() {
        let local = |s: &str| local_addr(s.parse().unwrap()).to_string();
        assert_eq!(local("0.0.0.0:50051"), "127.0.0.1:50051");
        assert_eq!(local("[::]:7000"), "[::1]:7000");
        assert_eq!(local("10.1.2.3:50051"), "10.1.2.3:50051");
    }

    #[test]
    fn an_unreadable_tls_file_is_named_and_an_address_checked_first() {
        let tls = ClientTls {
            ca: Some("/nonexistent/ca.pem".into()),
            ..ClientTls::default()
        };
        let Err(BadEndpoint::Tls(why)) = endpoint("authd:1", Duration::from_secs(1), &tls) else {
            panic!("an unreadable CA file must be refused");
        };
        assert!(
            why.starts_with("--tls-ca /nonexistent/ca.pem: cannot read"),
            "{why}"
        );
        assert!(matches!(
            endpoint("authd", Duration::from_secs(1), &tls),
            Err(BadEndpoint::Address(_))
        ));
        assert!(endpoint("authd:1", Duration::from_secs(1), &ClientTls::default()).is_ok());
    }

    #[test]
    fn a_timeout_is_told_apart() {
        assert!(timed_out(&Status::deadline_exceeded("late")));
        assert!(timed_out(&Status::cancelled(
            tonic::TimeoutExpired(()).to_string()
        )));
        assert!(!timed_out(&Status::cancelled("the client went away")));
        assert!(!timed_out(&Status::unavailable("down")));
    }
}
