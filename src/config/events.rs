//! The account events' options (docs/events.md): retention, the WatchEvents
//! streams' bounds, webhook endpoints and their signing secret, and how long a
//! password reset token lives (docs/recovery.md).
//!
//! [`EventsConfig::settings`] and [`EventsConfig::webhooks`] build what the events
//! component takes; the latter reads the webhook CA bundle, if any. The webhook secret is never printed: `--help` hides its value,
//! errors name the option, and `Debug` shows `***`.

use super::parse::{positive_duration, read_ca_bundle, read_secret_file};
use crate::{
    events::{
        EventSettings,
        webhooks::{Endpoint, WebhookSecret, WebhookSettings},
    },
    secret,
};
use clap::Args;
use std::{path::PathBuf, time::Duration};

/// The longest a password reset token may live.
pub const MAX_RESET_TTL: Duration = Duration::from_secs(24 * 3600);

/// Account events and password recovery.
#[derive(Debug, Clone, Args)]
pub struct EventsConfig {
    /// How long account events are kept for WatchEvents and webhooks; older ones are
    /// deleted in the background (a subscriber asking for them gets OUT_OF_RANGE).
    #[arg(long, env = "AUTHD_EVENTS_RETENTION", default_value = "7d",
          value_parser = positive_duration, global = true, display_order = 131)]
    pub events_retention: Duration,

    /// The most account events kept: beyond it the oldest are deleted, whatever
    /// their age (a bound on the outbox's size).
    #[arg(long, env = "AUTHD_EVENTS_MAX", default_value_t = 10_000_000,
          value_parser = clap::value_parser!(u64).range(1..), global = true,
          display_order = 132)]
    pub events_max: u64,

    /// How often retention runs.
    #[arg(long, env = "AUTHD_EVENTS_PRUNE_INTERVAL", default_value = "1m",
          value_parser = positive_duration, global = true, display_order = 133)]
    pub events_prune_interval: Duration,

    /// How often a WatchEvents stream (and webhook delivery) with nothing to send looks
    /// for events other replicas wrote; this replica's own wake it at once.
    #[arg(long, env = "AUTHD_EVENTS_POLL", default_value = "500ms",
          value_parser = positive_duration, global = true, display_order = 134)]
    pub events_poll: Duration,

    /// The most WatchEvents streams open at once; more are refused with
    /// RESOURCE_EXHAUSTED.
    #[arg(long, env = "AUTHD_EVENTS_MAX_WATCHERS", default_value_t = 64,
          value_parser = clap::value_parser!(u32).range(1..=10_000), global = true,
          display_order = 135)]
    pub events_max_watchers: u32,

    /// Webhook endpoints, comma-separated: `URL` for every event type, or
    /// `TYPE|TYPE=URL` for some (e.g. `user.registered|user.deleted=https://crm/hook`).
    /// http:// or https:// URLs [default: none: no webhooks].
    #[arg(
        long,
        env = "AUTHD_WEBHOOKS",
        value_delimiter = ',',
        global = true,
        display_order = 136
    )]
    pub webhooks: Vec<Endpoint>,

    /// The Standard Webhooks signing secret, `whsec_` and base64 of 24 to 64 random
    /// bytes; required with AUTHD_WEBHOOKS.
    #[arg(long, env = "AUTHD_WEBHOOK_SECRET", hide_env_values = true,
          conflicts_with = "webhook_secret_file", value_parser = secret::parser::<WebhookSecret>(),
          global = true, display_order = 137)]
    pub webhook_secret: Option<WebhookSecret>,

    /// File holding the webhook signing secret, instead of --webhook-secret: keeps it
    /// out of `ps` and the environment. Read at start.
    #[arg(
        long,
        env = "AUTHD_WEBHOOK_SECRET_FILE",
        global = true,
        display_order = 138
    )]
    pub webhook_secret_file: Option<PathBuf>,

    /// How long one webhook delivery may take (connecting, sending, the answer).
    #[arg(long, env = "AUTHD_WEBHOOK_TIMEOUT", default_value = "10s",
          value_parser = positive_duration, global = true, display_order = 139)]
    pub webhook_timeout: Duration,

    /// The longest wait between retries of a failing webhook endpoint (the wait
    /// doubles from 1s, with jitter, up to this).
    #[arg(long, env = "AUTHD_WEBHOOK_RETRY_MAX", default_value = "5m",
          value_parser = positive_duration, global = true, display_order = 140)]
    pub webhook_retry_max: Duration,

    /// PEM bundle of the CAs an https webhook endpoint's certificate must chain to,
    /// instead of the Mozilla roots (e.g. an internal CA); read at start [default: the
    /// Mozilla roots].
    #[arg(long, env = "AUTHD_WEBHOOK_CA", global = true, display_order = 141)]
    pub webhook_ca: Option<PathBuf>,

    /// How long a password reset token (RequestPasswordReset) stays valid, at most 24h.
    #[arg(long, env = "AUTHD_PASSWORD_RESET_TTL", default_value = "30m",
          value_parser = reset_ttl, global = true, display_order = 142)]
    pub password_reset_ttl: Duration,
}

fn reset_ttl(s: &str) -> Result<Duration, String> {
    let ttl = positive_duration(s)?;
    if ttl > MAX_RESET_TTL {
        return Err("at most 24h".into());
    }
    Ok(ttl)
}

impl EventsConfig {
    /// What the events component takes.
    pub(crate) fn settings(&self) -> EventSettings {
        EventSettings {
            poll: self.events_poll,
            retention: self.events_retention,
            max_events: self.events_max,
            max_watchers: self.events_max_watchers as usize,
            prune_every: self.events_prune_interval,
        }
    }

    /// The webhooks' settings; `None` without endpoints. Endpoints without a secret
    /// stop the start, and so does a CA bundle that cannot be read or holds no
    /// certificate (whether endpoints are configured or not).
    pub(crate) fn webhooks(&self) -> anyhow::Result<Option<WebhookSettings>> {
        let ca = (self.webhook_ca.as_deref())
            .map(|path| read_ca_bundle("--webhook-ca (AUTHD_WEBHOOK_CA)", path))
            .transpose()?;
        if self.webhooks.is_empty() {
            return Ok(None);
        }
        let Some(secret) = self.webhook_secret.clone() else {
            anyhow::bail!(
                "--webhooks (AUTHD_WEBHOOKS) needs a signing secret: --webhook-secret-file \
                 or AUTHD_WEBHOOK_SECRET"
            );
        };
        let mut seen = std::collections::HashSet::new();
        for endpoint in &self.webhooks {
            if !seen.insert(endpoint.url()) {
                anyhow::bail!("--webhooks: the endpoint {} is given twice", endpoint.url());
            }
        }
        Ok(Some(WebhookSettings {
            endpoints: self.webhooks.clone(),
            secret,
            ca,
            timeout: self.webhook_timeout,
            retry_max: self.webhook_retry_max,
            poll: self.events_poll,
        }))
    }

    /// Reads the secret named by `--webhook-secret-file`, if any. An error names the
    /// option and the file, never what the file holds.
    pub(super) fn read_secret_file(&mut self) -> anyhow::Result<()> {
        if let Some(path) = &self.webhook_secret_file {
            self.webhook_secret = Some(read_secret_file("--webhook-secret-file", path)?);
        }
        Ok(())
    }
}
