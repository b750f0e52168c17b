//! The keys a request is counted under: one per matching rule, built from the rule
//! and the request (the client's address, a header's value, the certificate's
//! identity, the client id a grant names, or nothing for `global`). Keys come from what clients send, so their size and shape are
//! bounded here: odd or long header values are hashed.
//!
//! The subject is the key's Redis Cluster hash tag (`{10.0.0.7}`), so every rule of
//! one client counts in one slot and a request's keys span few shards; a `global`
//! key has the empty tag `{}`, which Redis ignores: each global rule has a slot of
//! its own (spread over the shards).

use super::{Check, KeyKind, RateLimits};
use crate::rpc::ClientIdentity;
use std::net::IpAddr;

/// Header values longer than this, or with other characters than `[A-Za-z0-9._-]`,
/// are hashed into the key, so a client cannot make keys of arbitrary size or shape.
const MAX_RAW_HEADER_KEY: usize = 64;

/// Builds the checks of a request against the configured rules.
pub(crate) struct Keys {
    /// Per rule, the start of its keys: `{prefix}:{method}:{kind}:{window_ms}:`,
    /// built once so a decision allocates only the key itself.
    starts: Vec<String>,
}

impl Keys {
    pub(crate) fn new(rules: &RateLimits, prefix: &str) -> Self {
        let starts = (rules.rules().iter())
            .map(|rule| format!("{prefix}:{}:", rule.key_stem()))
            .collect();
        Self { starts }
    }

    /// The checks a request must pass: one per matching rule that yields a key.
    /// Empty when no rule applies (the request is not counted at all). `client` is
    /// the request's (`rpc::client_ip`), which a `peer` rule counts; `client_id` the
    /// client id a grant names, which a `client-id` rule counts.
    pub(crate) fn plan(
        &self,
        rules: &RateLimits,
        method: &str,
        headers: &http::HeaderMap,
        client: Option<IpAddr>,
        identity: Option<&ClientIdentity>,
        client_id: Option<&str>,
    ) -> Vec<Check> {
        let mut checks = Vec::new();
        for (index, rule) in rules.rules().iter().enumerate() {
            if !rule.matches(method) {
                continue;
            }
            let start = &self.starts[index];
            let mut key = String::with_capacity(start.len() + 42);
            key.push_str(start);
            key.push('{');
            match &rule.key {
                KeyKind::Global => {}
                KeyKind::Peer => {
                    match client {
                        Some(ip) => {
                            use std::fmt::Write as _;
                            let _ = write!(key, "{ip}"); // writing to a String cannot fail
                        }
                        // Not over TCP (a test harness): all such requests share one key.
                        None => key.push_str("unknown"),
                    }
                }
                KeyKind::Header(name) => match headers.get(name) {
                    Some(value) => key.push_str(&header_key(value.as_bytes())),
                    // Without the header the rule does not apply: pair header rules
                    // with a peer rule for clients that omit it.
                    None => continue,
                },
                KeyKind::ClientCert => match identity {
                    Some(identity) => key.push_str(&identity_key(identity.as_str())),
                    // No certificate: the rule does not apply (pair it with a peer rule).
                    None => continue,
                },
                KeyKind::ClientId => match client_id {
                    Some(client_id) => key.push_str(&client_id_key(client_id)),
                    // Not a grant, or one by certificate or assertion: not counted.
                    None => continue,
                },
            }
            key.push('}');
            checks.push(Check {
                rule: index,
                key,
                limit: rule.limit,
                window: rule.window,
                hits: 1,
            });
        }
        checks
    }
}

/// Identities longer than this, or with other characters than those of URIs and DNS
/// names (`[A-Za-z0-9._~:/@+=%-]`), are hashed into the key.
const MAX_RAW_IDENTITY_KEY: usize = 128;

/// The key part for a client certificate's identity: the identity itself when
/// short and plain (a SPIFFE id, a DNS name), otherwise `#` and a hash of it (`#`
/// is in no plain identity, so the two never collide).
fn identity_key(identity: &str) -> String {
    let plain = identity.bytes().all(|b| {
        b.is_ascii_alphanumeric()
            || matches!(
                b,
                b'.' | b'_' | b'~' | b':' | b'/' | b'@' | b'+' | b'=' | b'%' | b'-'
            )
    });
    if plain && identity.len() <= MAX_RAW_IDENTITY_KEY {
        identity.to_owned()
    } else {
        use sha2::Digest as _;
        let digest = sha2::Sha256::digest(identity.as_bytes());
        format!("#sha256:{}", hex::encode(&digest[..16]))
    }
}

/// Client ids longer than this (a service account's name is at most 64
/// characters), or with other characters than a name's, are hashed into the key.
const MAX_RAW_CLIENT_ID_KEY: usize = 64;

/// The key part for the client id a grant names, lowercased as account names are
/// compared: the id itself when it could be an account's name (`[a-z0-9._-]`, at
/// most 64 characters), otherwise `#` and a hash of it (`#` is in no name, so the
/// two never collide).
fn client_id_key(client_id: &str) -> String {
    let client_id = client_id.to_ascii_lowercase();
    let plain = client_id
        .bytes()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'.' | b'_' | b'-'));
    if plain && !client_id.is_empty() && client_id.len() <= MAX_RAW_CLIENT_ID_KEY {
        client_id
    } else {
        use sha2::Digest as _;
        let digest = sha2::Sha256::digest(client_id.as_bytes());
        format!("#sha256:{}", hex::encode(&digest[..16]))
    }
}

/// The key part for a header value: the value itself when short and plain,
/// otherwise a hash of it (which cannot collide with a plain value: those have no `:`).
fn header_key(value: &[u8]) -> String {
    let plain = value
        .iter()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
    if plain && value.len() <= MAX_RAW_HEADER_KEY {
        // Plain ASCII, checked just above.
        String::from_utf8_lossy(value).into_owned()
    } else {
        use sha2::Digest as _;
        let digest = sha2::Sha256::digest(value);
        format!("sha256:{}", hex::encode(&digest[..16]))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The keys of a request whose client is `client` (as `rpc::client_ip` has it).
    fn keys(rules: &str, method: &str, headers: &[(&str, &str)], client: &str) -> Vec<String> {
        let rules: RateLimits = rules.parse().unwrap();
        let planner = Keys::new(&rules, "p");
        let mut map = http::HeaderMap::new();
        for (k, v) in headers {
            map.append(
                http::HeaderName::from_bytes(k.as_bytes()).unwrap(),
                v.parse().unwrap(),
            );
        }
        planner
            .plan(
                &rules,
                method,
                &map,
                Some(client.parse().unwrap()),
                None,
                None,
            )
            .into_iter()
            .map(|c| c.key)
            .collect()
    }

    #[test]
    fn keys_name_the_rule_and_the_subject() {
        let l = "Login:peer=20/1s,*:global=1000/1m,*:header:x-client-id=5/1s,Register:peer=1/1s";
        assert_eq!(
            keys(l, "Login", &[("x-client-id", "app-1")], "10.0.0.7"),
            [
                "p:Login:peer:1000:{10.0.0.7}",
                "p:*:global:60000:{}",
                "p:*:header:x-client-id:1000:{app-1}",
            ]
        );
        // No header: the header rule does not apply.
        assert_eq!(
            keys(l, "ValidateToken", &[], "10.0.0.7"),
            ["p:*:global:60000:{}"]
        );
        // The client is the request's, whatever the header says (`rpc` resolves it).
        assert_eq!(
            keys(
                l,
                "Register",
                &[("x-forwarded-for", "203.0.113.9")],
                "2001:db8::1"
            )[1],
            "p:Register:peer:1000:{2001:db8::1}"
        );
        let rules: RateLimits = l.parse().unwrap();
        let no_client = Keys::new(&rules, "p").plan(
            &rules,
            "Register",
            &http::HeaderMap::new(),
            None,
            None,
            None,
        );
        assert_eq!(no_client[1].key, "p:Register:peer:1000:{unknown}");
        // Odd or long header values are hashed: fixed size, no separators.
        let odd = keys(l, "Login", &[("x-client-id", "a:b c")], "10.0.0.7");
        assert!(
            odd[2].starts_with("p:*:header:x-client-id:1000:{sha256:"),
            "{odd:?}"
        );
        let long = "x".repeat(200);
        let long = keys(l, "Login", &[("x-client-id", long.as_str())], "10.0.0.7");
        assert_eq!(
            long[2].len(),
            "p:*:header:x-client-id:1000:{sha256:".len() + 33
        );
    }

    #[test]
    fn client_cert_keys_count_each_identity_and_skip_requests_without_one() {
        let rules: RateLimits = "*:client-cert=5/1s".parse().unwrap();
        let planner = Keys::new(&rules, "p");
        let plan = |identity: Option<&str>| -> Vec<String> {
            let identity = identity.map(|i| ClientIdentity(i.into()));
            planner
                .plan(
                    &rules,
                    "Login",
                    &http::HeaderMap::new(),
                    None,
                    identity.as_ref(),
                    None,
                )
                .into_iter()
                .map(|c| c.key)
                .collect()
        };
        assert_eq!(
            plan(Some("spiffe://corp/ns/web/sa/signup")),
            ["p:*:client-cert:1000:{spiffe://corp/ns/web/sa/signup}"]
        );
        assert_eq!(plan(Some("web.corp")), ["p:*:client-cert:1000:{web.corp}"]);
        assert!(plan(None).is_empty());
        // Odd or long identities are hashed, never confused with a plain one.
        let odd = plan(Some("CN with spaces"));
        assert!(
            odd[0].starts_with("p:*:client-cert:1000:{#sha256:"),
            "{odd:?}"
        );
        let long = "a".repeat(300);
        assert_eq!(
            plan(Some(&long))[0].len(),
            "p:*:client-cert:1000:{#sha256:".len() + 33
        );
    }

    #[test]
    fn client_id_keys_count_each_grants_client_id_and_skip_everything_else() {
        let rules: RateLimits = "*:client-id=5/1s,IssueServiceToken:client-id=9/1m"
            .parse()
            .unwrap();
        let planner = Keys::new(&rules, "p");
        let plan = |method: &str, client_id: Option<&str>| -> Vec<String> {
            planner
                .plan(
                    &rules,
                    method,
                    &http::HeaderMap::new(),
                    None,
                    None,
                    client_id,
                )
                .into_iter()
                .map(|c| c.key)
                .collect()
        };
        assert_eq!(
            plan("IssueServiceToken", Some("orders")),
            [
                "p:*:client-id:1000:{orders}",
                "p:IssueServiceToken:client-id:60000:{orders}"
            ]
        );
        assert_eq!(
            plan("Token", Some("Orders")),
            ["p:*:client-id:1000:{orders}"]
        );
        // No client id named (a certificate, a client assertion, another method).
        assert!(plan("IssueServiceToken", None).is_empty());
        assert!(plan("Login", None).is_empty());
        // What no account could be named is hashed, case folded first.
        let odd = plan("Token", Some("Orders:x"));
        assert!(
            odd[0].starts_with("p:*:client-id:1000:{#sha256:"),
            "{odd:?}"
        );
        assert_eq!(odd, plan("Token", Some("orders:X")));
        let long = "a".repeat(65);
        assert_eq!(
            plan("Token", Some(&long))[0].len(),
            "p:*:client-id:1000:{#sha256:".len() + 33
        );
    }
}
