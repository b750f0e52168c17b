//! The rules file in force (`AUTHD_RATE_LIMIT_RULES_FILE`), read at start and
//! re-read every `AUTHD_RATE_LIMIT_RULES_RELOAD` while serving, so that rules change
//! by editing the file (a ConfigMap) with no restart.
//!
//! As the token key file, a change is judged by the file's content (its SHA-256),
//! not its timestamp. A new content that parses replaces the rules at once, whole
//! (a request decided meanwhile uses the old rules or the new, never a mix); one
//! that does not, or a file that cannot be read, is refused with one error in the
//! log naming the entry at fault, the `error` reload counter and the refused gauge,
//! and the rules in force stay. Counts live in the limiter under keys built from a
//! rule's place in the tree and its window (`service`), never from the file's
//! version, so a rule that did not change keeps its counts across a reload (and so
//! does one whose limit alone changed). The file's `authd:` section, authd's own RPC
//! rules, is put in force the same way (`RateLimiter::replace_rules`, through the
//! hook the application sets); if it cannot be (it conflicts with
//! `AUTHD_RATE_LIMITS`), the whole content is refused. Reading the file never blocks
//! the async workers.

use super::{RateLimits, descriptors::RulesFile};
use crate::metrics::Metrics;
use arc_swap::ArcSwap;
use prometheus::IntCounter;
use sha2::{Digest as _, Sha256};
use std::{
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
    time::Duration,
};
use tokio::sync::watch;

type Digest = [u8; 32];

/// The decision counters of one rule of the file.
pub(crate) struct RuleCounters {
    pub ok: IntCounter,
    pub over_limit: IntCounter,
    pub shadow_over_limit: IntCounter,
    pub unavailable: IntCounter,
}

/// A rules file in force, with its rules' counters.
pub(crate) struct Loaded {
    pub file: RulesFile,
    /// One per rule, in the order of [`RulesFile::rules`].
    pub counters: Vec<RuleCounters>,
}

impl Loaded {
    fn new(file: RulesFile, metrics: &Metrics) -> Self {
        let family = &metrics.rate_limit.descriptor_decisions;
        let counters = (file.rules().iter())
            .map(|rule| {
                let counter = |outcome| {
                    family.with_label_values(&[rule.domain.as_str(), rule.name.as_str(), outcome])
                };
                RuleCounters {
                    ok: counter("ok"),
                    over_limit: counter("over_limit"),
                    shadow_over_limit: counter("shadow_over_limit"),
                    unavailable: counter("unavailable"),
                }
            })
            .collect();
        Loaded { file, counters }
    }
}

/// Reads and parses the rules file, with the digest of what it read.
pub(crate) fn load(path: &Path) -> anyhow::Result<(RulesFile, Digest)> {
    let bytes = std::fs::read(path).map_err(|e| {
        anyhow::anyhow!("cannot read rate limit rules file {}: {e}", path.display())
    })?;
    let digest: Digest = Sha256::digest(&bytes).into();
    let text = std::str::from_utf8(&bytes).map_err(|_| {
        anyhow::anyhow!("rate limit rules file {}: not valid UTF-8", path.display())
    })?;
    let file = RulesFile::parse(text)
        .map_err(|e| anyhow::anyhow!("rate limit rules file {}: {e}", path.display()))?;
    Ok((file, digest))
}

/// What one look at the file found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Reload {
    /// The content is the one in force, or one already refused.
    Unchanged,
    /// A new content, now in force.
    Reloaded,
    /// A new content (or a read failure), refused; the rules in force stay.
    Refused(String),
}

/// What the last look found, to report each change once.
enum Seen {
    Applied(Digest),
    Refused { digest: Option<Digest>, why: String },
}

/// What puts a new `authd:` section in force for authd's own RPCs; an error
/// refuses the whole new content.
type OnAuthdRules = Box<dyn Fn(Option<&RateLimits>) -> anyhow::Result<()> + Send + Sync>;

/// The rules in force and the file they come from.
pub(crate) struct LiveRules {
    path: PathBuf,
    on_authd: std::sync::OnceLock<OnAuthdRules>,
    current: ArcSwap<Loaded>,
    seen: Mutex<Seen>,
    metrics: Arc<Metrics>,
    ok: IntCounter,
    refused: IntCounter,
}

impl LiveRules {
    /// Reads the file for the first time: an error stops the start.
    pub(crate) fn load(path: PathBuf, metrics: Arc<Metrics>) -> anyhow::Result<Self> {
        let (file, digest) = load(&path)?;
        let reloads = &metrics.rate_limit.rules_reloads;
        let live = LiveRules {
            current: ArcSwap::from_pointee(Loaded::new(file, &metrics)),
            on_authd: std::sync::OnceLock::new(),
            seen: Mutex::new(Seen::Applied(digest)),
            ok: reloads.with_label_values(&["ok"]),
            refused: reloads.with_label_values(&["error"]),
            metrics,
            path,
        };
        live.in_force(&digest);
        Ok(live)
    }

    /// Called with the file's `authd:` rules each time a new content changes them.
    pub(crate) fn on_authd_rules(
        &self,
        apply: impl Fn(Option<&RateLimits>) -> anyhow::Result<()> + Send + Sync + 'static,
    ) {
        let _ = self.on_authd.set(Box::new(apply));
    }

    /// The rules in force now.
    pub(crate) fn current(&self) -> Arc<Loaded> {
        self.current.load_full()
    }

    fn in_force(&self, digest: &Digest) {
        let m = &self.metrics.rate_limit;
        let mut top = [0u8; 8];
        top[2..].copy_from_slice(&digest[..6]);
        m.rules_digest.set(i64::from_be_bytes(top));
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH);
        m.rules_loaded_at
            .set(now.map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX)));
        m.rules_file_refused.set(0);
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
        let loaded = load(&self.path).and_then(|(file, digest)| {
            // authd's own rules first: if they cannot be put in force, nothing is.
            if file.authd != self.current().file.authd {
                match self.on_authd.get() {
                    Some(apply) => apply(file.authd.as_ref()).map_err(|e| {
                        anyhow::anyhow!("rate limit rules file {}: {e:#}", self.path.display())
                    })?,
                    None => tracing::warn!(
                        file = %self.path.display(),
                        "the file's authd: rules changed, but nothing applies them"
                    ),
                }
            }
            Ok((file, digest))
        });
        match loaded {
            Ok((file, digest)) => {
                tracing::info!(
                    file = %self.path.display(),
                    rules = file.rules().len(),
                    "rate limit rules reloaded"
                );
                self.current
                    .store(Arc::new(Loaded::new(file, &self.metrics)));
                self.ok.inc();
                self.in_force(&digest);
                *seen = Seen::Applied(digest);
                Reload::Reloaded
            }
            Err(e) => {
                let why = format!("{e:#}");
                let repeated = matches!(&*seen, Seen::Refused { why: w, .. } if *w == why);
                if !repeated {
                    tracing::error!(
                        error = %why,
                        "rate limit rules file refused; the rules in force stay in force"
                    );
                    self.refused.inc();
                }
                self.metrics.rate_limit.rules_file_refused.set(1);
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
                let rules = self.clone();
                if tokio::task::spawn_blocking(move || rules.check())
                    .await
                    .is_err()
                {
                    tracing::error!("re-reading the rate limit rules file failed");
                }
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ONE: &str =
        "domain: d\ndescriptors: [{key: k, rate_limit: {unit: second, requests_per_unit: 1}}]\n";
    const TWO: &str =
        "domain: d\ndescriptors: [{key: k, rate_limit: {unit: second, requests_per_unit: 2}}]\n";

    #[test]
    fn a_changed_file_replaces_the_rules_and_a_bad_one_is_refused_once() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("rules.yaml");
        std::fs::write(&path, ONE).unwrap();
        let metrics = Arc::new(Metrics::new());
        let live = LiveRules::load(path.clone(), metrics.clone()).unwrap();
        let limit = |live: &LiveRules| live.current().file.rules()[0].limit.unwrap().0;
        assert_eq!(live.check(), Reload::Unchanged);
        std::fs::write(&path, TWO).unwrap();
        assert_eq!(live.check(), Reload::Reloaded);
        assert_eq!(limit(&live), 2);
        std::fs::write(
            &path,
            "domain: d\ndescriptors: [{key: k, rate_limit: {unit: week}}]",
        )
        .unwrap();
        let Reload::Refused(why) = live.check() else {
            panic!("a bad file is refused")
        };
        assert!(why.contains("week"), "{why}");
        assert_eq!(limit(&live), 2);
        assert_eq!(live.check(), Reload::Unchanged, "reported once");
        let text = metrics.render();
        for line in [
            r#"authd_ratelimit_rules_reloads_total{outcome="ok"} 1"#,
            r#"authd_ratelimit_rules_reloads_total{outcome="error"} 1"#,
            "authd_ratelimit_rules_file_refused 1",
        ] {
            assert!(text.contains(line), "{line} missing in:\n{text}");
        }
        std::fs::write(&path, ONE).unwrap();
        assert_eq!(live.check(), Reload::Reloaded);
        assert_eq!(limit(&live), 1);
        assert!(
            metrics
                .render()
                .contains("authd_ratelimit_rules_file_refused 0")
        );
    }
}
