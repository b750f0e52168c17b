//! The standard endpoints' options: the public issuer URL (the `iss` of new tokens
//! and the base of the discovery document's URLs) and who may introspect tokens.
//!
//! [`OidcConfig::settings`] reads the introspection keys file; an allow-list of
//! certificate identities without mutual TLS is refused at start.
//! [`OidcConfig::issuers`] reads the external issuers' CA bundle.

use crate::oidc::{IntrospectionClients, OidcSettings, parse_issuer};
use clap::Args;
use std::path::PathBuf;

/// The issuer URL and the introspection clients.
#[derive(Debug, Clone, Args)]
pub struct OidcConfig {
    /// The public URL of this issuer (https://auth.example.com): the `iss` of new
    /// tokens (tokens whose `iss` is "authd" stay valid), and the base of every URL of
    /// the discovery document (/.well-known/openid-configuration, which answers 404
    /// without it). Set it only once every replica runs a release that knows it
    /// (docs/upgrades.md) [default: none; tokens' `iss` is "authd"].
    #[arg(long, env = "AUTHD_ISSUER", value_parser = parse_issuer, global = true,
          display_order = 121)]
    pub issuer: Option<String>,

    /// File of the clients allowed to introspect tokens (POST /oauth2/introspect with
    /// HTTP Basic CLIENT_ID:SECRET), one `CLIENT_ID introspect SHA256-HEX` a line (the
    /// SHA-256 of the secret, never the secret itself; the admin keys file's format)
    /// [default: none].
    #[arg(
        long,
        env = "AUTHD_INTROSPECTION_KEYS_FILE",
        global = true,
        display_order = 122
    )]
    pub introspection_keys_file: Option<PathBuf>,

    /// Client certificate identities allowed to introspect tokens under mutual TLS
    /// (needs AUTHD_TLS_CLIENT_CA), IDENTITY,…; e.g. spiffe://corp/ns/edge/sa/gateway
    /// [default: none].
    #[arg(
        long,
        env = "AUTHD_INTROSPECTION_ALLOW",
        value_delimiter = ',',
        global = true,
        display_order = 123
    )]
    pub introspection_allow: Vec<String>,

    /// External JWT issuers whose tokens prove service accounts
    /// (docs/service-accounts.md), ISSUER_URL=AUDIENCE,…: the tokens' `iss`, and the
    /// audience they must name, e.g. the URL of a Kubernetes API server and the
    /// audience of its projected tokens. The keys come from the issuer's discovery
    /// document [default: none].
    #[arg(long, env = "AUTHD_JWT_ISSUERS", value_delimiter = ',',
          value_parser = jwt_issuer, global = true, display_order = 126)]
    pub jwt_issuers: Vec<(String, String)>,

    /// PEM bundle of the CAs an https external issuer's certificate must chain to
    /// (in Kubernetes, the service account's ca.crt) [default: the Mozilla roots].
    #[arg(long, env = "AUTHD_JWT_ISSUER_CA", global = true, display_order = 127)]
    pub jwt_issuer_ca: Option<PathBuf>,

    /// The least time between two fetches of one issuer's keys: a token naming a key
    /// not held fetches them again, at most this often.
    #[arg(long, env = "AUTHD_JWT_ISSUER_REFRESH", default_value = "30s",
          value_parser = super::parse::positive_duration, global = true, display_order = 128)]
    pub jwt_issuer_refresh: std::time::Duration,
}

/// `ISSUER_URL=AUDIENCE`: an http(s) URL without a trailing slash, and an audience.
fn jwt_issuer(text: &str) -> Result<(String, String), String> {
    let (url, audience) = text
        .rsplit_once('=')
        .ok_or("expected ISSUER_URL=AUDIENCE")?;
    if !(url.starts_with("https://") || url.starts_with("http://")) || url.ends_with('/') {
        return Err("the issuer is an http(s) URL without a trailing slash".into());
    }
    if audience.is_empty() || audience.len() > 256 {
        return Err("the audience is 1 to 256 bytes".into());
    }
    Ok((url.to_owned(), audience.to_owned()))
}

impl OidcConfig {
    /// The external issuers and how their keys are fetched. The CA bundle is read
    /// when an https issuer needs it: a file that cannot be read or holds no
    /// certificate stops the start.
    pub(crate) fn issuers(
        &self,
        clock_skew: std::time::Duration,
    ) -> anyhow::Result<crate::issuers::IssuerSettings> {
        let https = (self.jwt_issuers.iter()).any(|(url, _)| url.starts_with("https://"));
        let ca = match &self.jwt_issuer_ca {
            Some(path) if https => Some(super::parse::read_ca_bundle(
                "--jwt-issuer-ca (AUTHD_JWT_ISSUER_CA)",
                path,
            )?),
            _ => None,
        };
        Ok(crate::issuers::IssuerSettings {
            issuers: self.jwt_issuers.clone(),
            ca,
            min_refresh: self.jwt_issuer_refresh,
            clock_skew,
        })
    }

    /// The endpoints' settings, with the introspection keys read.
    pub fn settings(&self, mutual_tls: bool) -> anyhow::Result<OidcSettings> {
        let allow: Vec<String> = (self.introspection_allow.iter())
            .map(|identity| identity.trim().to_owned())
            .filter(|identity| !identity.is_empty())
            .collect();
        if !allow.is_empty() && !mutual_tls {
            anyhow::bail!(
                "AUTHD_INTROSPECTION_ALLOW (--introspection-allow) needs mutual TLS \
                 (AUTHD_TLS_CLIENT_CA): without it no client presents a certificate"
            );
        }
        let clients = IntrospectionClients::new(self.introspection_keys_file.as_deref(), allow)
            .map_err(|why| anyhow::anyhow!("AUTHD_INTROSPECTION_KEYS_FILE: {why}"))?;
        Ok(OidcSettings {
            issuer: self.issuer.clone(),
            clients,
        })
    }
}
