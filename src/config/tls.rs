//! The gRPC port's TLS options: its certificate and key, the client CAs of mutual
//! TLS, how often the files are re-read, and which client identities may call which
//! method.
//!
//! [`TlsConfig::files`] checks that the options go together and names the files for
//! the transport to load; reading and watching them is the transport's job, not this
//! file's. The health-only port is always plaintext.

use super::parse::positive_duration;
use crate::{layers::access::AllowList, transport::tls::TlsFiles};
use clap::Args;
use std::{path::PathBuf, time::Duration};

/// TLS and mutual TLS on the gRPC port.
#[derive(Debug, Clone, Args)]
pub struct TlsConfig {
    /// PEM file of the gRPC port's certificate, then its intermediates: with --tls-key the
    /// port speaks only TLS (TLS 1.2 or 1.3; ALPN h2, then http/1.1) [default: none;
    /// plaintext]. Re-read when it changes (see --tls-reload). Given before any subcommand.
    #[arg(long, env = "AUTHD_TLS_CERT", requires = "tls_key", display_order = 31)]
    pub tls_cert: Option<PathBuf>,

    /// PEM file of the private key of --tls-cert (PKCS#8, PKCS#1 or SEC1). Re-read when it
    /// changes.
    #[arg(long, env = "AUTHD_TLS_KEY", requires = "tls_cert", display_order = 32)]
    pub tls_key: Option<PathBuf>,

    /// PEM bundle of the CAs client certificates must chain to: mutual TLS, a client
    /// without such a certificate fails the handshake [default: none; no client
    /// certificate asked]. Re-read when it changes.
    #[arg(
        long,
        env = "AUTHD_TLS_CLIENT_CA",
        requires = "tls_cert",
        display_order = 33
    )]
    pub tls_client_ca: Option<PathBuf>,

    /// How often the TLS files are checked for changes (modification time and size);
    /// new connections use the new files, open ones keep theirs.
    #[arg(long, env = "AUTHD_TLS_RELOAD", default_value = "10s",
          value_parser = positive_duration, display_order = 34)]
    pub tls_reload: Duration,

    /// Client identities allowed per AuthService method (or Check, Envoy's external
    /// authorization) under mutual TLS, METHOD:IDENTITY,… with METHOD an RPC name or *; e.g.
    /// Register:spiffe://corp/ns/web/sa/signup. A method named here refuses other clients
    /// with PERMISSION_DENIED; others are open to every client certificate
    /// [default: none; every method open].
    #[arg(
        long,
        env = "AUTHD_TLS_ALLOW",
        requires = "tls_client_ca",
        display_order = 35
    )]
    pub tls_allow: Option<AllowList>,
}

impl TlsConfig {
    /// The files of the gRPC port's TLS (`None`: plaintext), or an error naming the
    /// options that do not go together.
    pub(crate) fn files(&self) -> anyhow::Result<Option<TlsFiles>> {
        let files = match (&self.tls_cert, &self.tls_key) {
            (Some(cert), Some(key)) => Some(TlsFiles {
                cert: cert.clone(),
                key: key.clone(),
                client_ca: self.tls_client_ca.clone(),
            }),
            (None, None) => None,
            _ => anyhow::bail!(
                "--tls-cert (AUTHD_TLS_CERT) and --tls-key (AUTHD_TLS_KEY) go together"
            ),
        };
        if files.is_none() && (self.tls_client_ca.is_some() || self.tls_allow.is_some()) {
            anyhow::bail!(
                "--tls-client-ca (AUTHD_TLS_CLIENT_CA) and --tls-allow (AUTHD_TLS_ALLOW) need \
                 --tls-cert and --tls-key"
            );
        }
        if self.tls_allow.is_some() && self.tls_client_ca.is_none() {
            anyhow::bail!(
                "--tls-allow (AUTHD_TLS_ALLOW) needs --tls-client-ca (AUTHD_TLS_CLIENT_CA)"
            );
        }
        Ok(files)
    }

    /// Which client identities may call which method; empty (every method open to
    /// every client certificate) when none is configured.
    pub(crate) fn allow_list(&self) -> AllowList {
        self.tls_allow.clone().unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use crate::config::Config;

    #[test]
    fn options_that_do_not_go_together_are_named() {
        let defaults = Config::defaults().tls;
        assert!(defaults.files().unwrap().is_none());
        let mut c = defaults.clone();
        c.tls_cert = Some("cert.pem".into());
        let err = c.files().unwrap_err().to_string();
        assert!(
            err.contains("--tls-cert (AUTHD_TLS_CERT) and --tls-key"),
            "{err}"
        );
        c.tls_key = Some("key.pem".into());
        let files = c.files().unwrap().unwrap();
        assert_eq!(files.client_ca, None);
        c.tls_allow = Some("Login:spiffe://corp/a".parse().unwrap());
        let err = c.files().unwrap_err().to_string();
        assert!(err.contains("needs --tls-client-ca"), "{err}");
        let mut c = defaults;
        c.tls_client_ca = Some("ca.pem".into());
        let err = c.files().unwrap_err().to_string();
        assert!(err.contains("need --tls-cert and --tls-key"), "{err}");
    }
}
