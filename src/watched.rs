//! A file read at start and re-read while serving, so that what it holds changes by
//! editing it (a Kubernetes Secret or ConfigMap) with no restart: the token key file
//! and the rate limit rules file.
//!
//! A change is judged by the file's content (its SHA-256), not by its timestamp: a
//! Secret volume swaps a symlink and the modification time says little. A new
//! content that parses and is put in force counts as an `ok` reload; one that does
//! not (or a file that cannot be read) is refused with one error in the log and one
//! `error` reload, and what is in force stays. A refused content is reported once,
//! not at every poll. Reading the file never blocks the async workers.
//!
//! What differs from one file to the next (how a content parses and is put in
//! force, what the log calls it) is its [`Content`], written beside the code that
//! uses it. This module imports nothing of the crate.

use prometheus::{IntCounter, IntCounterVec};
use sha2::{Digest as _, Sha256};
use std::{
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
    time::Duration,
};
use tokio_util::sync::CancellationToken;

/// The SHA-256 of a file's content.
pub(crate) type Digest = [u8; 32];

/// What a watched file holds, and how a new content is put in force.
pub(crate) trait Content: Send + Sync + 'static {
    /// What a content parses into.
    type Parsed;
    /// The file, as messages name it (`token keys file`).
    const NAME: &'static str;
    /// The log line of a refused content, saying what stays in force.
    const REFUSED: &'static str;

    /// Parses a content. The error names the entry at fault, never a secret.
    fn parse(text: &str) -> Result<Self::Parsed, String>;

    /// Puts a new content of `path` in force, and says so in the log. An error
    /// refuses the content, and what is in force stays.
    fn apply(&self, path: &Path, parsed: Self::Parsed, digest: &Digest) -> anyhow::Result<()>;

    /// Called at every refusal, the ones reported and the ones already reported.
    fn refused(&self) {}
}

/// Reads and parses `path`, with the digest of what it read. The error names the
/// file and what is wrong, never what the file holds.
pub(crate) fn load<C: Content>(path: &Path) -> anyhow::Result<(C::Parsed, Digest)> {
    let bytes = std::fs::read(path)
        .map_err(|e| anyhow::anyhow!("cannot read {} {}: {e}", C::NAME, path.display()))?;
    let digest: Digest = Sha256::digest(&bytes).into();
    let text = std::str::from_utf8(&bytes)
        .map_err(|_| anyhow::anyhow!("{} {}: not valid UTF-8", C::NAME, path.display()))?;
    let parsed =
        C::parse(text).map_err(|e| anyhow::anyhow!("{} {}: {e}", C::NAME, path.display()))?;
    Ok((parsed, digest))
}

/// What one look at the file found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Reload {
    /// The content is the one in force, or one already refused.
    Unchanged,
    /// A new content, now in force.
    Reloaded,
    /// A new content (or a read failure), refused; what is in force stays. The
    /// reason, which never quotes the file.
    Refused(String),
}

/// What the last look found, to report each change once.
enum Seen {
    /// The digest of the content in force.
    Applied(Digest),
    /// A content refused after the one in force, or a read error.
    Refused { digest: Option<Digest>, why: String },
}

/// One file, re-read on demand ([`Watched::check`]) or periodically
/// ([`Watched::spawn`]), and what its content is put in force with.
pub(crate) struct Watched<C> {
    path: PathBuf,
    content: C,
    seen: Mutex<Seen>,
    ok: IntCounter,
    refused: IntCounter,
}

impl<C: Content> Watched<C> {
    /// A watcher of `path`, whose content of digest `applied` is the one in force
    /// in `content`; reloads are counted in `reloads` by outcome (`ok`, `error`).
    pub(crate) fn new(path: PathBuf, applied: Digest, content: C, reloads: &IntCounterVec) -> Self {
        Self {
            path,
            content,
            seen: Mutex::new(Seen::Applied(applied)),
            ok: reloads.with_label_values(&["ok"]),
            refused: reloads.with_label_values(&["error"]),
        }
    }

    /// What the file's content is put in force with.
    pub(crate) fn content(&self) -> &C {
        &self.content
    }

    /// Reads the file once and puts a new content in force (blocking: call it off
    /// the async workers).
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
        let applied = load::<C>(&self.path).and_then(|(parsed, digest)| {
            (self.content.apply(&self.path, parsed, &digest))
                .map_err(|e| anyhow::anyhow!("{} {}: {e:#}", C::NAME, self.path.display()))?;
            Ok(digest)
        });
        match applied {
            Ok(digest) => {
                self.ok.inc();
                *seen = Seen::Applied(digest);
                Reload::Reloaded
            }
            Err(e) => {
                let why = format!("{e:#}");
                let repeated = matches!(&*seen, Seen::Refused { why: w, .. } if *w == why);
                if !repeated {
                    tracing::error!(error = %why, "{}", C::REFUSED);
                    self.refused.inc();
                }
                self.content.refused();
                *seen = Seen::Refused {
                    digest,
                    why: why.clone(),
                };
                Reload::Refused(why)
            }
        }
    }

    /// Reads the file now, off the async workers, as the periodic re-read does:
    /// `Ok(true)` when a new content is in force, `Ok(false)` when the file is
    /// unchanged, the reason when it was refused and what is in force kept.
    pub(crate) async fn check_now(self: Arc<Self>) -> Result<bool, String> {
        match tokio::task::spawn_blocking(move || self.check()).await {
            Ok(Reload::Reloaded) => Ok(true),
            Ok(Reload::Unchanged) => Ok(false),
            Ok(Reload::Refused(why)) => Err(why),
            Err(e) => Err(format!("the reload task failed: {e}")),
        }
    }

    /// Re-reads the file every `interval` until `stopped` is cancelled.
    pub(crate) async fn reread_every(
        self: Arc<Self>,
        interval: Duration,
        stopped: CancellationToken,
    ) {
        let mut ticks = tokio::time::interval(interval);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        ticks.tick().await; // the first tick is now: the file was just read
        loop {
            tokio::select! {
                _ = ticks.tick() => {}
                () = stopped.cancelled() => return,
            }
            let file = self.clone();
            if tokio::task::spawn_blocking(move || file.check())
                .await
                .is_err()
            {
                tracing::error!("re-reading the {} failed", C::NAME);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// A file of lines, each a number; a line `no` is put in force but refused.
    #[derive(Default)]
    struct Numbers {
        in_force: Mutex<Vec<u32>>,
        refusals: AtomicUsize,
    }

    impl Content for Numbers {
        type Parsed = Vec<u32>;
        const NAME: &'static str = "numbers file";
        const REFUSED: &'static str = "numbers file refused; the numbers in force stay";

        fn parse(text: &str) -> Result<Vec<u32>, String> {
            (text.lines())
                .filter(|l| *l != "no")
                .map(|l| l.parse().map_err(|_| format!("{l:?} is not a number")))
                .collect()
        }

        fn apply(&self, _: &Path, parsed: Vec<u32>, _: &Digest) -> anyhow::Result<()> {
            anyhow::ensure!(!parsed.is_empty(), "no numbers");
            *self.in_force.lock().unwrap() = parsed;
            Ok(())
        }

        fn refused(&self) {
            self.refusals.fetch_add(1, Ordering::Relaxed);
        }
    }

    fn counters() -> IntCounterVec {
        IntCounterVec::new(prometheus::Opts::new("reloads", "reloads"), &["outcome"]).unwrap()
    }

    fn watch(path: &Path, reloads: &IntCounterVec) -> Watched<Numbers> {
        let (numbers, digest) = load::<Numbers>(path).unwrap();
        let content = Numbers::default();
        *content.in_force.lock().unwrap() = numbers;
        Watched::new(path.to_owned(), digest, content, reloads)
    }

    #[test]
    fn a_changed_content_is_put_in_force_and_a_bad_one_refused_once() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("numbers");
        std::fs::write(&path, "1\n").unwrap();
        let reloads = counters();
        let file = watch(&path, &reloads);
        let in_force = |file: &Watched<Numbers>| file.content().in_force.lock().unwrap().clone();
        assert_eq!(file.check(), Reload::Unchanged);

        std::fs::write(&path, "1\n2\n").unwrap();
        assert_eq!(file.check(), Reload::Reloaded);
        assert_eq!(in_force(&file), [1, 2]);
        assert_eq!(file.check(), Reload::Unchanged);

        // Refused by the parser: the file and the entry are named.
        std::fs::write(&path, "x\n").unwrap();
        let Reload::Refused(why) = file.check() else {
            panic!("a bad content is refused")
        };
        assert_eq!(
            why,
            format!("numbers file {}: \"x\" is not a number", path.display())
        );
        assert_eq!(in_force(&file), [1, 2]);
        // Reported once: the same content again is no news.
        assert_eq!(file.check(), Reload::Unchanged);

        // Refused when put in force: named as well.
        std::fs::write(&path, "no\n").unwrap();
        let Reload::Refused(why) = file.check() else {
            panic!("a content that cannot be put in force is refused")
        };
        assert_eq!(why, format!("numbers file {}: no numbers", path.display()));
        // Another content refused for the same reason is not reported again.
        std::fs::write(&path, "no\nno\n").unwrap();
        assert!(matches!(file.check(), Reload::Refused(_)));

        std::fs::remove_file(&path).unwrap();
        let Reload::Refused(why) = file.check() else {
            panic!("a missing file is refused")
        };
        assert!(why.starts_with("cannot read numbers file"), "{why}");
        assert_eq!(in_force(&file), [1, 2]);

        std::fs::write(&path, "3\n").unwrap();
        assert_eq!(file.check(), Reload::Reloaded);
        assert_eq!(in_force(&file), [3]);
        let count = |outcome| reloads.with_label_values(&[outcome]).get();
        assert_eq!((count("ok"), count("error")), (2, 3));
        assert_eq!(file.content().refusals.load(Ordering::Relaxed), 4);
    }

    #[test]
    fn a_file_that_is_not_utf8_is_refused_at_start() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("numbers");
        std::fs::write(&path, b"\xff\n").unwrap();
        let e = load::<Numbers>(&path).unwrap_err();
        assert_eq!(
            e.to_string(),
            format!("numbers file {}: not valid UTF-8", path.display())
        );
    }

    #[tokio::test(start_paused = true)]
    async fn the_periodic_reread_puts_a_change_in_force_and_stops_when_told() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("numbers");
        std::fs::write(&path, "1\n").unwrap();
        let reloads = counters();
        let file = Arc::new(watch(&path, &reloads));
        let stop = CancellationToken::new();
        let task = tokio::spawn(
            file.clone()
                .reread_every(Duration::from_secs(1), stop.clone()),
        );
        std::fs::write(&path, "2\n").unwrap();
        while reloads.with_label_values(&["ok"]).get() == 0 {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert_eq!(*file.content().in_force.lock().unwrap(), [2]);
        stop.cancel();
        task.await.unwrap();
    }
}
