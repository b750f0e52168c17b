//! The second factor's options: the data keys that seal TOTP secrets at rest (given,
//! or read from a file at start), the issuer the authenticator apps show, and how
//! long a Login's challenge lives.
//!
//! [`SecondFactorConfig::settings`] builds what the accounts take. Without a data key
//! authd stores no TOTP secret at all (never one in the clear): the TOTP calls
//! answer FAILED_PRECONDITION, and a user who has a factor still needs it to sign
//! in (recovery codes, which need no key, still work).

use super::parse::positive_duration;
use crate::{accounts::SecondFactorSettings, second_factor::DataKeys, secret};
use anyhow::Context as _;
use clap::Args;
use std::{path::PathBuf, time::Duration};

/// The longest a Login's challenge may live.
pub const MAX_CHALLENGE_TTL: Duration = Duration::from_secs(5 * 60);

/// The second factor (docs/second-factor.md).
#[derive(Debug, Clone, Args)]
pub struct SecondFactorConfig {
    /// Data keys that seal TOTP secrets in the database (XChaCha20-Poly1305),
    /// comma-separated KID:BASE64KEY of 32 bytes each; the first seals, all open, so a
    /// new key goes first and old ones stay while secrets sealed with them remain
    /// [default: none: TOTP enrollment is refused (FAILED_PRECONDITION), nothing is
    /// ever stored in the clear, and users with a factor still need it to sign in].
    #[arg(long, env = "AUTHD_DATA_KEYS", hide_env_values = true,
          conflicts_with = "data_keys_file", value_parser = secret::parser::<DataKeys>(),
          global = true, display_order = 82)]
    pub data_keys: Option<DataKeys>,

    /// File holding the data keys in the AUTHD_DATA_KEYS format, commas or one per line
    /// (blank lines and # comments ignored), instead of --data-keys: keeps them out of
    /// `ps` and the environment. Read at start.
    #[arg(long, env = "AUTHD_DATA_KEYS_FILE", global = true, display_order = 83)]
    pub data_keys_file: Option<PathBuf>,

    /// The issuer an authenticator app shows beside the username (the otpauth URI's
    /// issuer and label prefix); no colon.
    #[arg(long, env = "AUTHD_TOTP_ISSUER", default_value = "authd",
          value_parser = issuer, global = true, display_order = 84)]
    pub totp_issuer: String,

    /// How long the challenge of a Login that asks for the second factor stays valid
    /// for CompleteLogin, at most 5m.
    #[arg(long, env = "AUTHD_LOGIN_CHALLENGE_TTL", default_value = "5m",
          value_parser = challenge_ttl, global = true, display_order = 85)]
    pub login_challenge_ttl: Duration,
}

impl SecondFactorConfig {
    /// What the accounts take.
    pub(crate) fn settings(&self) -> SecondFactorSettings {
        SecondFactorSettings {
            data_keys: self.data_keys.clone(),
            issuer: self.totp_issuer.clone(),
            challenge_ttl: self.login_challenge_ttl,
        }
    }

    /// Reads the keys named by `--data-keys-file`, if any, into `data_keys`. An error
    /// names the option and the file, never what the file holds.
    pub(super) fn read_secret_file(&mut self) -> anyhow::Result<()> {
        let Some(path) = &self.data_keys_file else {
            return Ok(());
        };
        let text = std::fs::read_to_string(path).with_context(|| {
            format!("--data-keys-file {}: cannot read the file", path.display())
        })?;
        let entries: Vec<&str> = (text.lines())
            .map(str::trim)
            .filter(|l| !l.is_empty() && !l.starts_with('#'))
            .collect();
        if entries.is_empty() {
            anyhow::bail!("--data-keys-file {}: the file is empty", path.display());
        }
        let keys = (entries.join(","))
            .parse()
            .map_err(|why| anyhow::anyhow!("--data-keys-file {}: {why}", path.display()))?;
        self.data_keys = Some(keys);
        Ok(())
    }
}

fn issuer(s: &str) -> Result<String, String> {
    let s = s.trim();
    if s.is_empty() || s.len() > 64 || s.contains(':') || s.chars().any(char::is_control) {
        return Err("an issuer is 1 to 64 bytes, without a colon".into());
    }
    Ok(s.to_owned())
}

fn challenge_ttl(s: &str) -> Result<Duration, String> {
    let ttl = positive_duration(s)?;
    if ttl > MAX_CHALLENGE_TTL {
        return Err("must be at most 5m".into());
    }
    Ok(ttl)
}

#[cfg(test)]
mod tests {
    use crate::config::{Cli, matches};

    const KEY: &str = "k1:MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY=";

    #[test]
    fn the_options_parse_and_refuse_bad_values() {
        let cli = Cli::parse_for_test(&["--data-keys", KEY]).unwrap();
        let keys = cli.config.second_factor.data_keys.as_ref().unwrap();
        assert_eq!(keys.kids(), ["k1"]);
        let defaults = Cli::parse_for_test(&[]).unwrap().config.second_factor;
        assert!(defaults.data_keys.is_none());
        assert_eq!(defaults.totp_issuer, "authd");
        assert_eq!(defaults.login_challenge_ttl.as_secs(), 300);
        let err = matches(&["--login-challenge-ttl", "6m"]).unwrap_err();
        assert!(err.contains("at most 5m"), "{err}");
        let err = matches(&["--totp-issuer", "a:b"]).unwrap_err();
        assert!(err.contains("without a colon"), "{err}");
        let err = matches(&["--data-keys", "k1:c2VjcmV0LWJ1dC1zaG9ydA=="]).unwrap_err();
        assert!(!err.contains("c2VjcmV0"), "{err}");
    }

    #[test]
    fn the_keys_file_is_read_at_start() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("keys");
        std::fs::write(
            &path,
            format!("# new first\n{KEY}\n\nk0:ZmVkY2JhOTg3NjU0MzIxMGZlZGNiYTk4NzY1NDMyMTA=\n"),
        )
        .unwrap();
        let mut config = Cli::parse_for_test(&["--data-keys-file", path.to_str().unwrap()])
            .unwrap()
            .config;
        config.read_secret_files().unwrap();
        let keys = config.second_factor.data_keys.as_ref().unwrap();
        assert_eq!(keys.kids(), ["k1", "k0"]);
        std::fs::write(&path, "k1:bm90LWEta2V5\n").unwrap();
        let mut config = Cli::parse_for_test(&["--data-keys-file", path.to_str().unwrap()])
            .unwrap()
            .config;
        let err = format!("{:#}", config.read_secret_files().unwrap_err());
        assert!(
            err.starts_with("--data-keys-file ") && !err.contains("bm90"),
            "{err}"
        );
    }
}
