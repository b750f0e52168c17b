//! The token key file (`AUTHD_TOKEN_KEYS_FILE`): read at start, then re-read every
//! `AUTHD_TOKEN_KEYS_RELOAD` while serving, so that keys rotate by editing the file
//! (a Kubernetes Secret) with no restart.
//!
//! A change is judged by the file's content (its SHA-256), not by its timestamp: a
//! Secret volume swaps a symlink and the modification time says little. A new content
//! that parses replaces the ring in use at once; one that does not (or a file that
//! cannot be read) is refused with one error in the log, naming the key at fault but
//! never quoting it, and the ring in use stays. A refused content is reported once,
//! not at every poll. Reading the file never blocks the async workers.

use crate::{
    metrics::Metrics,
    token::keys::{KeyRing, LiveKeyRing},
};
use prometheus::IntCounter;
use sha2::{Digest as _, Sha256};
use std::{
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
    time::Duration,
};
use tokio::sync::watch;

type Digest = [u8; 32];

/// Reads and parses a key file, with the digest of what it read. The error names the
/// file and the key at fault, never what the file holds.
pub(crate) fn load(path: &Path) -> anyhow::Result<(KeyRing, Digest)> {
    let bytes = std::fs::read(path)
        .map_err(|e| anyhow::anyhow!("cannot read token keys file {}: {e}", path.display()))?;
    let digest: Digest = Sha256::digest(&bytes).into();
    let text = std::str::from_utf8(&bytes)
        .map_err(|_| anyhow::anyhow!("token keys file {}: not valid UTF-8", path.display()))?;
    let ring = KeyRing::from_file_text(text)
        .map_err(|e| anyhow::anyhow!("token keys file {}: {e}", path.display()))?;
    Ok((ring, digest))
}

/// What one look at the file found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Reload {
    /// The content is the one in use, or one already refused.
    Unchanged,
    /// A new content, now in use.
    Reloaded,
    /// A new content (or a read failure), refused; the ring in use stays. The reason,
    /// which never quotes a key.
    Refused(String),
}

/// What the last look found, to report each change once.
enum Seen {
    /// The digest of the content in use.
    Applied(Digest),
    /// A content refused after the one in use, or a read error.
    Refused { digest: Option<Digest>, why: String },
}

/// Watches one key file and replaces the live ring when it changes.
pub(crate) struct KeyFile {
    path: PathBuf,
    ring: LiveKeyRing,
    seen: Mutex<Seen>,
    ok: IntCounter,
    refused: IntCounter,
}

impl KeyFile {
    /// A watcher of `path`, whose content `applied` is the one `ring` holds now.
    pub(crate) fn new(
        path: PathBuf,
        applied: Digest,
        ring: LiveKeyRing,
        metrics: &Metrics,
    ) -> Self {
        let reloads = &metrics.tokens.key_reloads;
        Self {
            path,
            ring,
            seen: Mutex::new(Seen::Applied(applied)),
            ok: reloads.with_label_values(&["ok"]),
            refused: reloads.with_label_values(&["error"]),
        }
    }

    /// Reads the file once and applies a new content (blocking: call it off the
    /// async workers).
    pub(crate) fn check(&self) -> Reload {
        let mut seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
        let digest = std::fs::read(&self.path)
            .ok()
            .map(|bytes| -> Digest { Sha256::digest(&bytes).into() });
        match (&*seen, digest) {
            (Seen::Applied(applied), Some(d)) if *applied == d => return Reload::Unchanged,
            (
                Seen::Refused {
                    digest: Some(r), ..
                },
                Some(d),
            ) if *r == d => {
                return Reload::Unchanged;
            }
            _ => {}
        }
        match load(&self.path) {
            Ok((ring, digest)) => {
                let kids: Vec<&str> = ring.kids().collect();
                tracing::info!(
                    file = %self.path.display(),
                    kids = kids.join(","),
                    signing_kid = ring.signing_kid(),
                    alg = ring.signing_algorithm().jose_name(),
                    "token keys reloaded"
                );
                self.ring.replace(ring);
                self.ok.inc();
                *seen = Seen::Applied(digest);
                Reload::Reloaded
            }
            Err(e) => {
                let why = format!("{e:#}");
                let repeated = matches!(&*seen, Seen::Refused { why: w, .. } if *w == why);
                if !repeated {
                    tracing::error!(
                        error = %why,
                        "token keys file refused; the keys in use stay in use"
                    );
                    self.refused.inc();
                }
                *seen = Seen::Refused {
                    digest,
                    why: why.clone(),
                };
                Reload::Refused(why)
            }
        }
    }

    /// Re-reads the file every `interval` until `stopped` turns true.
    pub(crate) fn spawn(
        self: Arc<Self>,
        interval: Duration,
        mut stopped: watch::Receiver<bool>,
    ) -> tokio::task::JoinHandle<()> {
        tokio::spawn(async move {
            let mut ticks = tokio::time::interval(interval);
            ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            ticks.tick().await; // the first tick is now: the file was just read
            loop {
                tokio::select! {
                    _ = ticks.tick() => {}
                    _ = stopped.wait_for(|s| *s) => return,
                }
                let file = self.clone();
                if tokio::task::spawn_blocking(move || file.check())
                    .await
                    .is_err()
                {
                    tracing::error!("re-reading the token keys file failed");
                }
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HMAC: &str = "a:MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY=";
    const OTHER: &str = "b:MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY=";

    #[test]
    fn a_changed_file_replaces_the_ring_and_a_bad_one_is_refused_once() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("keys");
        std::fs::write(&path, format!("{HMAC}\n")).unwrap();
        let metrics = Metrics::new();
        let (ring, digest) = load(&path).unwrap();
        let tokens = crate::token::Tokens::new(ring, Duration::from_secs(60), &metrics);
        let live = tokens.key_ring().clone();
        let file = KeyFile::new(path.clone(), digest, live.clone(), &metrics);
        assert_eq!(file.check(), Reload::Unchanged);

        std::fs::write(&path, format!("# rotated\n{OTHER}\n{HMAC}\n")).unwrap();
        assert_eq!(file.check(), Reload::Reloaded);
        assert_eq!(live.current().signing_kid(), "b");
        assert_eq!(file.check(), Reload::Unchanged);

        // A secret-looking value that does not parse: refused, never quoted.
        std::fs::write(&path, "c:ed25519:c2VjcmV0LXNlY3JldC1zZWNyZXQ=\n").unwrap();
        let Reload::Refused(why) = file.check() else {
            panic!("a bad file is refused")
        };
        assert!(why.contains("\"c\""), "{why}");
        assert!(!why.contains("c2VjcmV0"), "{why}");
        assert_eq!(live.current().signing_kid(), "b");
        // Reported once: the same content again is no news.
        assert_eq!(file.check(), Reload::Unchanged);

        std::fs::remove_file(&path).unwrap();
        assert!(matches!(file.check(), Reload::Refused(_)));
        assert_eq!(live.current().signing_kid(), "b");

        std::fs::write(&path, format!("{HMAC}\n")).unwrap();
        assert_eq!(file.check(), Reload::Reloaded);
        assert_eq!(live.current().signing_kid(), "a");
        let text = metrics.render();
        for line in [
            r#"authd_token_keys_reloads_total{outcome="ok"} 2"#,
            r#"authd_token_keys_reloads_total{outcome="error"} 2"#,
            r#"authd_token_signing_key{alg="HS256",kid="a"} 1"#,
        ] {
            assert!(text.contains(line), "{line} missing in:\n{text}");
        }
        assert!(!text.contains(r#"kid="b""#), "{text}");
    }
}
