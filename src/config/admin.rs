//! The admin API's options: its listener (off by default), the admin keys file and
//! the admin calls' rate limit.
//!
//! [`AdminConfig::settings`] reads the keys file and builds the admin service's
//! settings; a listener with no credential at all (neither a keys file nor an
//! allow-list of client certificate identities) is refused at start.

use super::parse::MetricsListen;
use crate::handlers::admin::{AdminKeys, AdminSettings, Role};
use clap::Args;
use std::path::PathBuf;

/// The admin listener and its credentials.
#[derive(Debug, Clone, Args)]
pub struct AdminConfig {
    /// Address of the admin API's own port (auth.admin.v1.AdminService, with health and
    /// reflection; docs/admin.md), never served on the gRPC port; empty or "off" (the
    /// default) turns it off. Served with TLS when AUTHD_TLS_CERT is set.
    #[arg(
        long,
        env = "AUTHD_ADMIN_LISTEN",
        default_value = "off",
        global = true,
        display_order = 78
    )]
    pub admin_listen: MetricsListen,

    /// File of admin keys, one `NAME ROLE SHA256-HEX` a line (role admin or read; the
    /// SHA-256 of the key, never the key itself); AUTHD_ADMIN_LISTEN needs it or
    /// AUTHD_ADMIN_ALLOW.
    #[arg(long, env = "AUTHD_ADMIN_KEYS_FILE", global = true, display_order = 79)]
    pub admin_keys_file: Option<PathBuf>,

    /// Client certificate identities allowed on the admin port under mutual TLS
    /// (needs AUTHD_TLS_CLIENT_CA), ROLE:IDENTITY,… with ROLE admin or read; e.g.
    /// admin:spiffe://corp/ns/ops/sa/oncall. Another certificate, without an admin key,
    /// is refused with PERMISSION_DENIED [default: none].
    #[arg(
        long,
        env = "AUTHD_ADMIN_ALLOW",
        value_delimiter = ',',
        value_parser = admin_identity,
        global = true,
        display_order = 81
    )]
    pub admin_allow: Vec<(Role, String)>,

    /// Admin calls a second, for the whole admin port (also the burst); beyond it
    /// RESOURCE_EXHAUSTED with a retry hint.
    #[arg(long, env = "AUTHD_ADMIN_RATE", default_value_t = 20,
          value_parser = clap::value_parser!(u32).range(1..=100_000), global = true,
          display_order = 80)]
    pub admin_rate: u32,
}

impl AdminConfig {
    /// The admin service's settings, with the keys read; `None` while the admin
    /// listener is off.
    pub fn settings(&self, mutual_tls: bool) -> anyhow::Result<Option<AdminSettings>> {
        if self.admin_listen.addr().is_none() {
            return Ok(None);
        }
        if !self.admin_allow.is_empty() && !mutual_tls {
            anyhow::bail!(
                "AUTHD_ADMIN_ALLOW (--admin-allow) needs mutual TLS (AUTHD_TLS_CLIENT_CA): \
                 without it no client presents a certificate"
            );
        }
        if self.admin_keys_file.is_none() && self.admin_allow.is_empty() {
            anyhow::bail!(
                "AUTHD_ADMIN_LISTEN needs AUTHD_ADMIN_KEYS_FILE (--admin-keys-file) or \
                 AUTHD_ADMIN_ALLOW (--admin-allow): the admin API refuses every call \
                 without a credential"
            );
        }
        let keys = match &self.admin_keys_file {
            Some(path) => Some(
                AdminKeys::read(path)
                    .map_err(|why| anyhow::anyhow!("AUTHD_ADMIN_KEYS_FILE: {why}"))?,
            ),
            None => None,
        };
        Ok(Some(AdminSettings {
            keys,
            allow: self.admin_allow.clone(),
            rate: self.admin_rate,
        }))
    }
}

/// One entry of `--admin-allow`: `ROLE:IDENTITY`.
fn admin_identity(entry: &str) -> Result<(Role, String), String> {
    let (role, identity) = entry
        .split_once(':')
        .ok_or("expected ROLE:IDENTITY, e.g. admin:spiffe://corp/ns/ops/sa/oncall")?;
    let role = match role.trim() {
        "admin" => Role::Admin,
        "read" => Role::Read,
        other => return Err(format!("unknown role {other:?} (expected admin or read)")),
    };
    let identity = identity.trim();
    if identity.is_empty() {
        return Err("the identity is empty".into());
    }
    Ok((role, identity.to_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_allow_entry_is_a_role_and_an_identity() {
        assert_eq!(
            admin_identity("admin:spiffe://corp/ns/ops/sa/oncall").unwrap(),
            (Role::Admin, "spiffe://corp/ns/ops/sa/oncall".to_owned())
        );
        assert_eq!(
            admin_identity("read:auditor").unwrap(),
            (Role::Read, "auditor".to_owned())
        );
        assert!(
            admin_identity("root:x")
                .unwrap_err()
                .contains("unknown role")
        );
        assert!(admin_identity("admin:").is_err());
        assert!(admin_identity("oncall").is_err());
    }
}
