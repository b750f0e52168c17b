//! The rules file of Envoy's rate limit service (`AUTHD_RATE_LIMIT_RULES_FILE`): a
//! compatible subset of envoyproxy/ratelimit's YAML, parsed once into a tree per
//! domain, and the match of a request's descriptor in that tree.
//!
//! A file holds one or more YAML documents (`---` between them). A document is a
//! domain (`domain`, nested `descriptors` with `key`, optional `value`,
//! `rate_limit` with `unit` and `requests_per_unit` or `unlimited`, `shadow_mode`),
//! or authd's own RPC rules (`authd: "Login:peer=20/1s,…"`, the syntax of
//! `AUTHD_RATE_LIMITS`), or both. Whatever envoyproxy/ratelimit accepts and authd
//! does not (wildcard values, `replaces`, `week` and other units) is refused with
//! an error naming the entry, never silently ignored.
//!
//! A descriptor matches as in envoyproxy/ratelimit: its entries walk the tree in
//! order, each taking the child with its key and value if there is one, else the
//! child with its key only; the rule of the node the last entry reaches applies.
//! An entry that finds no child, or a last node without a rule, means no limit.
//!
//! It knows nothing of counting (`limiter`) nor of the wire (`service`).

use super::RateLimits;
use serde::Deserialize;
use std::{collections::HashMap, fmt, time::Duration};

/// The highest `requests_per_unit`: a window's log holds up to that many entries
/// per key (in process or in Redis).
pub(crate) const MAX_REQUESTS_PER_UNIT: u32 = 1_000_000;

/// The deepest nesting of `descriptors`; a request has at most as many entries.
pub(crate) const MAX_DEPTH: usize = 16;

/// A rule's window, as Envoy names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum Unit {
    #[serde(alias = "SECOND", alias = "Second")]
    Second,
    #[serde(alias = "MINUTE", alias = "Minute")]
    Minute,
    #[serde(alias = "HOUR", alias = "Hour")]
    Hour,
    #[serde(alias = "DAY", alias = "Day")]
    Day,
}

impl Unit {
    pub(crate) fn window(self) -> Duration {
        Duration::from_secs(match self {
            Unit::Second => 1,
            Unit::Minute => 60,
            Unit::Hour => 3600,
            Unit::Day => 86_400,
        })
    }

    /// The value of `RateLimitResponse.RateLimit.Unit` on the wire.
    pub(crate) fn proto(self) -> i32 {
        match self {
            Unit::Second => 1,
            Unit::Minute => 2,
            Unit::Hour => 3,
            Unit::Day => 4,
        }
    }
}

/// One rule of the file: a node of the tree with a `rate_limit`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct DescriptorRule {
    pub domain: String,
    /// Where it is in the tree: `key=value/key2` (`key` alone for a key-only entry).
    pub path: String,
    /// `rate_limit.name` when given, else the path: the metrics' `rule` label and
    /// the name of its `RateLimit-Policy`.
    pub name: String,
    /// `None`: `unlimited: true`, never counted.
    pub limit: Option<(u32, Unit)>,
    pub shadow: bool,
}

/// The node a descriptor reached.
#[derive(Debug, Default)]
struct Node {
    /// Index in [`RulesFile::rules`].
    rule: Option<usize>,
    children: HashMap<String, Children>,
}

/// The children of one key: by value, and the key-only one.
#[derive(Debug, Default)]
struct Children {
    by_value: HashMap<String, Node>,
    any: Option<Box<Node>>,
}

/// A parsed rules file.
#[derive(Debug, Default)]
pub(crate) struct RulesFile {
    domains: HashMap<String, Node>,
    rules: Vec<DescriptorRule>,
    /// authd's own RPC rules (`authd:`), when the file gives them.
    pub authd: Option<RateLimits>,
}

impl RulesFile {
    pub(crate) fn rules(&self) -> &[DescriptorRule] {
        &self.rules
    }

    /// The rule (by index) that applies to a descriptor of `domain` with `entries`
    /// (key, value), or `None` for no limit.
    pub(crate) fn matching<'a>(
        &self,
        domain: &str,
        entries: impl IntoIterator<Item = (&'a str, &'a str)>,
    ) -> Option<usize> {
        let mut node = self.domains.get(domain)?;
        let mut any = false;
        for (key, value) in entries {
            let children = node.children.get(key)?;
            node = children.by_value.get(value).or(children.any.as_deref())?;
            any = true;
        }
        if any { node.rule } else { None }
    }

    /// Parses a file's text; the error names the document and entry at fault.
    pub(crate) fn parse(text: &str) -> Result<Self, String> {
        let documents: Vec<Option<Document>> =
            serde_saphyr::from_multiple(text).map_err(|e| e.to_string())?;
        let mut file = RulesFile::default();
        for document in documents.into_iter().flatten() {
            if let Some(authd) = document.authd {
                if file.authd.is_some() {
                    return Err("authd's rules are given twice; keep one `authd:`".into());
                }
                let text = match authd {
                    AuthdRules::One(text) => text,
                    AuthdRules::Many(rules) => rules.join(","),
                };
                file.authd = Some(text.parse().map_err(|e| format!("authd: {e}"))?);
            }
            let Some(domain) = document.domain else {
                if !document.descriptors.is_empty() {
                    return Err("descriptors without a domain".into());
                }
                continue;
            };
            if domain.is_empty() {
                return Err("a domain must not be empty".into());
            }
            if file.domains.contains_key(&domain) {
                return Err(format!("domain {domain:?} is given twice"));
            }
            let mut root = Node::default();
            for entry in document.descriptors {
                file.add(&domain, "", &mut root, entry, 1)?;
            }
            file.domains.insert(domain, root);
        }
        Ok(file)
    }

    fn add(
        &mut self,
        domain: &str,
        parent: &str,
        node: &mut Node,
        entry: Entry,
        depth: usize,
    ) -> Result<(), String> {
        let path = match &entry.value {
            Some(value) => format!("{parent}{}={value}", entry.key),
            None => format!("{parent}{}", entry.key),
        };
        let at = |why: String| format!("domain {domain:?}, descriptor {path:?}: {why}");
        if entry.key.is_empty() {
            return Err(at("a key must not be empty".into()));
        }
        if depth > MAX_DEPTH {
            return Err(at(format!("nested deeper than {MAX_DEPTH}")));
        }
        let mut child = Node::default();
        let limit = match entry.rate_limit {
            None if entry.shadow_mode => {
                return Err(at("shadow_mode needs a rate_limit".into()));
            }
            None => None,
            Some(rate) => Some(match (rate.unlimited, rate.unit, rate.requests_per_unit) {
                (true, None, None) => None,
                (true, _, _) => {
                    return Err(at("unlimited takes no unit nor requests_per_unit".into()));
                }
                (false, Some(unit), Some(n)) if n <= MAX_REQUESTS_PER_UNIT => Some((n, unit)),
                (false, Some(_), Some(_)) => {
                    return Err(at(format!(
                        "requests_per_unit is at most {MAX_REQUESTS_PER_UNIT}"
                    )));
                }
                (false, _, _) => {
                    return Err(at(
                        "a rate_limit needs unit and requests_per_unit (or unlimited: true)".into(),
                    ));
                }
            })
            .map(|limit| (limit, rate.name)),
        };
        if let Some((limit, name)) = limit {
            child.rule = Some(self.rules.len());
            self.rules.push(DescriptorRule {
                domain: domain.to_owned(),
                name: name.unwrap_or_else(|| path.clone()),
                path: path.clone(),
                limit,
                shadow: entry.shadow_mode,
            });
        }
        let nested = format!("{path}/");
        for grandchild in entry.descriptors {
            self.add(domain, &nested, &mut child, grandchild, depth + 1)?;
        }
        let children = node.children.entry(entry.key).or_default();
        let taken = match entry.value {
            Some(value) => children.by_value.insert(value, child).is_some(),
            None => children.any.replace(Box::new(child)).is_some(),
        };
        if taken {
            return Err(at("given twice at the same place".into()));
        }
        Ok(())
    }
}

impl fmt::Display for DescriptorRule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.domain, self.path)?;
        match self.limit {
            Some((n, unit)) => write!(f, "={n}/{unit:?}")?,
            None => f.write_str("=unlimited")?,
        }
        if self.shadow {
            f.write_str(" (shadow)")?;
        }
        Ok(())
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Document {
    domain: Option<String>,
    #[serde(default)]
    descriptors: Vec<Entry>,
    authd: Option<AuthdRules>,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum AuthdRules {
    One(String),
    Many(Vec<String>),
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Entry {
    key: String,
    value: Option<String>,
    rate_limit: Option<Rate>,
    #[serde(default)]
    shadow_mode: bool,
    #[serde(default)]
    descriptors: Vec<Entry>,
    /// envoyproxy/ratelimit's per-value statistics: authd's metrics are per rule
    /// whatever it says (values come from requests, so they never become labels).
    #[serde(default, rename = "detailed_metric")]
    _detailed_metric: bool,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Rate {
    unit: Option<Unit>,
    requests_per_unit: Option<u32>,
    #[serde(default)]
    unlimited: bool,
    name: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    const FILE: &str = r#"
domain: edge
descriptors:
  - key: remote_address
    rate_limit: {unit: second, requests_per_unit: 10}
  - key: path
    value: /login
    rate_limit: {unit: minute, requests_per_unit: 5, name: login}
  - key: path
    rate_limit: {unit: minute, requests_per_unit: 100}
  - key: tenant
    descriptors:
      - key: plan
        value: free
        shadow_mode: true
        rate_limit: {unit: hour, requests_per_unit: 1000}
      - key: plan
        value: internal
        rate_limit: {unlimited: true}
---
domain: other
descriptors:
  - key: k
    rate_limit: {unit: DAY, requests_per_unit: 1}
---
authd: "Login:peer=20/1s"
"#;

    fn rule<'a>(file: &'a RulesFile, domain: &str, entries: &[(&str, &str)]) -> Option<&'a str> {
        let index = file.matching(domain, entries.iter().copied())?;
        Some(file.rules()[index].name.as_str())
    }

    #[test]
    fn descriptors_match_as_envoys_rate_limit_service_does() {
        let file = RulesFile::parse(FILE).unwrap();
        assert_eq!(file.rules().len(), 6);
        assert_eq!(file.authd.as_ref().unwrap().to_string(), "Login:peer=20/1s");
        let f = &file;
        assert_eq!(
            rule(f, "edge", &[("remote_address", "10.0.0.1")]),
            Some("remote_address")
        );
        // The entry with the value wins over the key-only one.
        assert_eq!(rule(f, "edge", &[("path", "/login")]), Some("login"));
        assert_eq!(rule(f, "edge", &[("path", "/other")]), Some("path"));
        // Nested: the last entry's node; an intermediate node without a rule: none.
        assert_eq!(
            rule(f, "edge", &[("tenant", "a"), ("plan", "free")]),
            Some("tenant/plan=free")
        );
        assert_eq!(rule(f, "edge", &[("tenant", "a")]), None);
        assert_eq!(rule(f, "edge", &[("tenant", "a"), ("plan", "paid")]), None);
        let internal = file.matching("edge", [("tenant", "a"), ("plan", "internal")]);
        assert_eq!(file.rules()[internal.unwrap()].limit, None);
        // More entries than the tree is deep, unknown keys and domains: no limit.
        assert_eq!(
            rule(f, "edge", &[("remote_address", "x"), ("more", "y")]),
            None
        );
        assert_eq!(rule(f, "edge", &[("unknown", "x")]), None);
        assert_eq!(rule(f, "nowhere", &[("k", "x")]), None);
        assert_eq!(rule(f, "edge", &[]), None);
        let free = &file.rules()[file
            .matching("edge", [("tenant", "a"), ("plan", "free")])
            .unwrap()];
        assert!(free.shadow);
        assert_eq!(free.limit, Some((1000, Unit::Hour)));
        assert_eq!(rule(f, "other", &[("k", "v")]), Some("k"));
    }

    #[test]
    fn the_deployed_rules_parse() {
        let file = RulesFile::parse(include_str!("../../deploy/ratelimit-rules.yaml")).unwrap();
        let login = [
            ("path", "/auth.v1.AuthService/Login"),
            ("remote_address", "10.0.0.1"),
        ];
        assert_eq!(rule(&file, "edge", &login), Some("login-per-client"));
        let other = [
            ("path", "/auth.v1.AuthService/ValidateToken"),
            ("remote_address", "10.0.0.1"),
        ];
        assert_eq!(rule(&file, "edge", &other), Some("path/remote_address"));
    }

    #[test]
    fn bad_files_are_refused_naming_the_entry() {
        for (text, expected) in [
            (
                "domain: d\ndescriptors: [{key: k, rate_limit: {unit: week, requests_per_unit: 1}}]",
                "week",
            ),
            (
                "domain: d\ndescriptors: [{key: k, rate_limit: {unit: second}}]",
                r#"descriptor "k": a rate_limit needs"#,
            ),
            (
                "domain: d\ndescriptors: [{key: k, value: v, rate_limit: {unlimited: true, unit: second}}]",
                r#""k=v": unlimited"#,
            ),
            (
                "domain: d\ndescriptors: [{key: k}, {key: k}]",
                "given twice",
            ),
            (
                "domain: d\ndescriptors: [{key: '', rate_limit: {unit: second, requests_per_unit: 1}}]",
                "must not be empty",
            ),
            (
                "domain: d\ndescriptors: [{key: k, replaces: [x]}]",
                "replaces",
            ),
            (
                "domain: d\ndescriptors: [{key: k, shadow_mode: true}]",
                "shadow_mode needs",
            ),
            (
                "domain: d\ndescriptors: [{key: k, rate_limit: {unit: second, requests_per_unit: 2000000}}]",
                "at most 1000000",
            ),
            ("domain: d\n---\ndomain: d\n", "given twice"),
            ("authd: Logn:peer=1/1s", "authd: rule"),
            ("domain: [unclosed", ""),
            ("descriptors: [{key: k}]", "without a domain"),
        ] {
            let err = RulesFile::parse(text).expect_err(text);
            assert!(err.contains(expected), "{text:?}: {err}");
        }
        let deep =
            (0..=MAX_DEPTH).fold(String::from("domain: d\ndescriptors:\n"), |text, depth| {
                let pad = "  ".repeat(2 * depth);
                format!("{text}{pad}- key: k{depth}\n{pad}  descriptors:\n")
            });
        assert!(RulesFile::parse(&format!("{deep}{}[]", "  ".repeat(2 * MAX_DEPTH + 3))).is_err());
        assert!(RulesFile::parse("").unwrap().rules().is_empty());
    }
}
