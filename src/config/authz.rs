//! External authorization's options: the HTTP forward-auth listener (off by
//! default), the prefix of the identity headers, whether `authorization` is taken
//! off the request that goes on, and the realm of the `WWW-Authenticate` challenge.
//!
//! [`AuthzConfig::settings`] builds what Envoy's Check and the forward-auth endpoint
//! share; the values are checked when parsed, so a bad one stops the start.

use super::{parse::MetricsListen, passwords::Switch};
use crate::handlers::extauthz::AuthzSettings;
use clap::Args;

/// External authorization (Envoy's Check on the gRPC port, HTTP forward-auth).
#[derive(Debug, Clone, Args)]
pub struct AuthzConfig {
    /// Address of the HTTP forward-auth port (GET /forward-auth, for nginx
    /// auth_request, Traefik ForwardAuth, Caddy forward_auth; docs/mesh.md);
    /// empty or "off" (the default) turns it off. Plain HTTP/1.1: keep it on a
    /// network only the proxies reach.
    #[arg(
        long,
        env = "AUTHD_FORWARD_AUTH_LISTEN",
        default_value = "off",
        global = true,
        display_order = 86
    )]
    pub forward_auth_listen: MetricsListen,

    /// Prefix of the identity headers external authorization sets for the upstream
    /// (PREFIX user-id, username, session-id, amr, audience); Envoy's Check also
    /// removes every other header of this prefix the client sent.
    #[arg(long, env = "AUTHD_AUTHZ_HEADER_PREFIX", default_value = "x-authd-",
          value_parser = header_prefix, global = true, display_order = 87)]
    pub authz_header_prefix: String,

    /// Whether an allowed request goes on to the upstream without its
    /// `authorization` header (on), or with it (off).
    #[arg(
        long,
        env = "AUTHD_AUTHZ_STRIP_AUTHORIZATION",
        value_enum,
        default_value = "off",
        global = true,
        display_order = 88
    )]
    pub authz_strip_authorization: Switch,

    /// The realm of the `WWW-Authenticate: Bearer` challenge of a refused request.
    #[arg(long, env = "AUTHD_AUTHZ_REALM", default_value = "authd",
          value_parser = realm, global = true, display_order = 89)]
    pub authz_realm: String,
}

impl AuthzConfig {
    /// What Envoy's Check and the forward-auth endpoint share.
    pub fn settings(&self) -> AuthzSettings {
        AuthzSettings {
            header_prefix: self.authz_header_prefix.clone(),
            strip_authorization: self.authz_strip_authorization.is_on(),
            realm: self.authz_realm.clone(),
        }
    }
}

/// 1 to 64 characters a header name may hold (lowercased; letters, digits, `-`, `_`).
fn header_prefix(s: &str) -> Result<String, String> {
    let prefix = s.trim().to_ascii_lowercase();
    let valid = (1..=64).contains(&prefix.len())
        && prefix
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
    if !valid {
        return Err("must be 1 to 64 letters, digits, - or _ (e.g. x-authd-)".into());
    }
    Ok(prefix)
}

/// 1 to 64 visible ASCII characters but `"` and `\` (the content of a quoted-string).
fn realm(s: &str) -> Result<String, String> {
    let valid = (1..=64).contains(&s.len())
        && s.bytes()
            .all(|b| (b' '..=b'~').contains(&b) && b != b'"' && b != b'\\');
    if !valid {
        return Err("must be 1 to 64 visible ASCII characters, without \" or \\".into());
    }
    Ok(s.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{Cli, Config};

    #[test]
    fn external_authorization_is_off_on_http_and_checked() {
        let c = Config::defaults().authz;
        assert_eq!(c.forward_auth_listen, MetricsListen::OFF);
        assert_eq!(c.authz_header_prefix, "x-authd-");
        assert_eq!(c.authz_strip_authorization, Switch::Off);
        assert_eq!(c.authz_realm, "authd");
        let parse = |args: &[&str]| Cli::parse_for_test(args).map(|cli| cli.config.authz);
        let c = parse(&["--authz-header-prefix", "X-User-"]).unwrap();
        assert_eq!(c.authz_header_prefix, "x-user-");
        for bad in ["", "x authd", "x:authd", &"x".repeat(65)] {
            assert!(parse(&["--authz-header-prefix", bad]).is_err(), "{bad:?}");
        }
        for bad in ["", "a\"b", "a\\b", "a\nb"] {
            assert!(parse(&["--authz-realm", bad]).is_err(), "{bad:?}");
        }
        let c = parse(&["--forward-auth-listen", "127.0.0.1:0"]).unwrap();
        assert!(c.forward_auth_listen.addr().is_some());
    }
}
