//! The rules file in force (`AUTHD_RATE_LIMIT_RULES_FILE`), read at start and
//! re-read every `AUTHD_RATE_LIMIT_RULES_RELOAD` while serving, so that rules change
//! by editing the file (a ConfigMap) with no restart.
//!
//! As the token key file, it is a `watched` file: a change is judged by the file's
//! content (its SHA-256), not its timestamp, and a refused content is reported once.
//! A new content that parses replaces the rules at once, whole
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
use crate::{
    metrics::Metrics,
    watched::{self, Content, Digest, Watched},
};
use arc_swap::ArcSwap;
use prometheus::IntCounter;
use std::{
    path::{Path, PathBuf},
    sync::{Arc, OnceLock},
};

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

/// What puts a new `authd:` section in force for authd's own RPCs; an error
/// refuses the whole new content.
type OnAuthdRules = Box<dyn Fn(Option<&RateLimits>) -> anyhow::Result<()> + Send + Sync>;

/// The rules in force, which a new content of the file replaces.
pub(crate) struct RulesInForce {
    current: ArcSwap<Loaded>,
    on_authd: OnceLock<OnAuthdRules>,
    metrics: Arc<Metrics>,
}

impl RulesInForce {
    fn in_force(&self, digest: &Digest) {
        let m = &self.metrics.rate_limit;
        let mut top = [0u8; 8];
        top[2..].copy_from_slice(&digest[..6]);
        m.rules_digest.set(i64::from_be_bytes(top));
        // Real time: when the file was loaded, a metric for operators.
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH);
        m.rules_loaded_at
            .set(now.map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX)));
        m.rules_file_refused.set(0);
    }
}

impl Content for RulesInForce {
    type Parsed = RulesFile;
    const NAME: &'static str = "rate limit rules file";
    const REFUSED: &'static str = "rate limit rules file refused; the rules in force stay in force";

    fn parse(text: &str) -> Result<RulesFile, String> {
        RulesFile::parse(text)
    }

    fn apply(&self, path: &Path, file: RulesFile, digest: &Digest) -> anyhow::Result<()> {
        // authd's own rules first: if they cannot be put in force, nothing is.
        if file.authd != self.current.load().file.authd {
            match self.on_authd.get() {
                Some(apply) => apply(file.authd.as_ref())?,
                None => tracing::warn!(
                    file = %path.display(),
                    "the file's authd: rules changed, but nothing applies them"
                ),
            }
        }
        tracing::info!(
            file = %path.display(),
            rules = file.rules().len(),
            "rate limit rules reloaded"
        );
        self.current
            .store(Arc::new(Loaded::new(file, &self.metrics)));
        self.in_force(digest);
        Ok(())
    }

    fn refused(&self) {
        self.metrics.rate_limit.rules_file_refused.set(1);
    }
}

/// The rules in force and the file they come from.
pub(crate) type LiveRules = Watched<RulesInForce>;

impl LiveRules {
    /// Reads the file for the first time: an error stops the start.
    pub(crate) fn load(path: PathBuf, metrics: Arc<Metrics>) -> anyhow::Result<Self> {
        let (file, digest) = watched::load::<RulesInForce>(&path)?;
        let reloads = metrics.rate_limit.rules_reloads.clone();
        let rules = RulesInForce {
            current: ArcSwap::from_pointee(Loaded::new(file, &metrics)),
            on_authd: OnceLock::new(),
            metrics,
        };
        rules.in_force(&digest);
        Ok(Watched::new(path, digest, rules, &reloads))
    }

    /// Called with the file's `authd:` rules each time a new content changes them.
    pub(crate) fn on_authd_rules(
        &self,
        apply: impl Fn(Option<&RateLimits>) -> anyhow::Result<()> + Send + Sync + 'static,
    ) {
        let _ = self.content().on_authd.set(Box::new(apply));
    }

    /// The rules in force now.
    pub(crate) fn current(&self) -> Arc<Loaded> {
        self.content().current.load_full()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::watched::Reload;

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
