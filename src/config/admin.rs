//! The admin API's options: its listener (off by default), the admin keys file and
//! the admin calls' rate limit.
//!
//! [`AdminConfig::settings`] reads the keys file and builds the admin service's
//! settings; a listener without a keys file is refused at start.

use super::parse::MetricsListen;
use crate::admin::{AdminKeys, AdminSettings};
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
        display_order = 76
    )]
    pub admin_listen: MetricsListen,

    /// File of admin keys, one `NAME ROLE SHA256-HEX` a line (role admin or read; the
    /// SHA-256 of the key, never the key itself); required with AUTHD_ADMIN_LISTEN.
    #[arg(long, env = "AUTHD_ADMIN_KEYS_FILE", global = true, display_order = 77)]
    pub admin_keys_file: Option<PathBuf>,

    /// Admin calls a second, for the whole admin port (also the burst); beyond it
    /// RESOURCE_EXHAUSTED with a retry hint.
    #[arg(long, env = "AUTHD_ADMIN_RATE", default_value_t = 20,
          value_parser = clap::value_parser!(u32).range(1..=100_000), global = true,
          display_order = 78)]
    pub admin_rate: u32,
}

impl AdminConfig {
    /// The admin service's settings, with the keys read; `None` while the admin
    /// listener is off.
    pub fn settings(&self, trust_forwarded_for: bool) -> anyhow::Result<Option<AdminSettings>> {
        if self.admin_listen.addr().is_none() {
            return Ok(None);
        }
        let Some(path) = &self.admin_keys_file else {
            anyhow::bail!(
                "AUTHD_ADMIN_LISTEN needs AUTHD_ADMIN_KEYS_FILE (--admin-keys-file): \
                 the admin API refuses every call without a key"
            );
        };
        let keys =
            AdminKeys::read(path).map_err(|why| anyhow::anyhow!("AUTHD_ADMIN_KEYS_FILE: {why}"))?;
        Ok(Some(AdminSettings {
            keys,
            rate: self.admin_rate,
            trust_forwarded_for,
        }))
    }
}
