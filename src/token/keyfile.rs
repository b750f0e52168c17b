//! The token key file (`AUTHD_TOKEN_KEYS_FILE`): read at start, then re-read every
//! `AUTHD_TOKEN_KEYS_RELOAD` while serving, so that keys rotate by editing the file
//! (a Kubernetes Secret) with no restart.
//!
//! The file is a `watched` file: judged by its content, not its timestamp, and a
//! refused content reported once. What is particular to keys is here: a new content
//! that parses replaces the ring in use at once; one that does not (or a file that
//! cannot be read) is refused with one error in the log, naming the key at fault but
//! never quoting it, and the ring in use stays.

use crate::{
    metrics::Metrics,
    token::keys::{KeyRing, LiveKeyRing},
    watched::{self, Content, Digest, Watched},
};
use std::path::{Path, PathBuf};

/// Reads and parses a key file, with the digest of what it read. The error names the
/// file and the key at fault, never what the file holds.
pub(crate) fn load(path: &Path) -> anyhow::Result<(KeyRing, Digest)> {
    watched::load::<KeysInUse>(path)
}

/// The ring a key file's content is put in force in.
pub(crate) struct KeysInUse(LiveKeyRing);

impl Content for KeysInUse {
    type Parsed = KeyRing;
    const NAME: &'static str = "token keys file";
    const REFUSED: &'static str = "token keys file refused; the keys in use stay in use";

    fn parse(text: &str) -> Result<KeyRing, String> {
        KeyRing::from_file_text(text)
    }

    fn apply(&self, path: &Path, ring: KeyRing, _: &Digest) -> anyhow::Result<()> {
        let kids: Vec<&str> = ring.kids().collect();
        tracing::info!(
            file = %path.display(),
            kids = kids.join(","),
            signing_kid = ring.signing_kid(),
            alg = ring.signing_algorithm().jose_name(),
            "token keys reloaded"
        );
        self.0.replace(ring);
        Ok(())
    }
}

/// One key file, watched: a new content replaces the live ring.
pub(crate) type KeyFile = Watched<KeysInUse>;

impl KeyFile {
    /// A watcher of `path`, whose content `applied` is the one `ring` holds now.
    pub(crate) fn for_ring(
        path: PathBuf,
        applied: Digest,
        ring: LiveKeyRing,
        metrics: &Metrics,
    ) -> Self {
        Watched::new(path, applied, KeysInUse(ring), &metrics.tokens.key_reloads)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::watched::Reload;
    use std::time::Duration;

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
        let file = KeyFile::for_ring(path.clone(), digest, live.clone(), &metrics);
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
