//! The rules of `AUTHD_RATE_LIMITS`: their syntax (`METHOD:KEY=LIMIT/WINDOW`), parsed
//! once at the edge so that a bad rule stops the start with a line naming it.
//!
//! A rule names an AuthService method (or `*`), a key kind, a limit and a window. It
//! knows nothing of how requests are counted (`limiter`) or keyed (`keys`).

use crate::rpc::Rpc;
use std::{fmt, str::FromStr, time::Duration};

/// The longest window a rule may have: the log of a window is kept in memory (or
/// in Redis) for that long.
const MAX_WINDOW: Duration = Duration::from_secs(24 * 3600);

/// What a rule counts requests by.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum KeyKind {
    /// The client's IP address (`rpc::client_ip`: the end user a trusted caller names
    /// in `x-forwarded-for`, else the connection's peer).
    Peer,
    /// Every request the rule matches, from anyone, on every replica sharing Redis.
    Global,
    /// The value of a request header, e.g. `x-client-id`; requests without the
    /// header are not counted by the rule.
    Header(http::HeaderName),
    /// The identity of the client's certificate under mutual TLS (`client-cert`);
    /// requests without one (plaintext, or TLS without a client CA) are not counted
    /// by the rule.
    ClientCert,
    /// The client id a service account's grant names (`client-id`): the
    /// `client_id` of IssueServiceToken, or of `POST /oauth2/token` (HTTP Basic or
    /// the form), as it was sent: counted before the secret is checked, as the
    /// throttle counts it. Only the grants name one ([`GRANT_METHODS`]); a grant by
    /// certificate or client assertion names none and is not counted by the rule.
    ClientId,
}

/// The methods whose requests name a service account's client id: the grants, over
/// gRPC and over HTTP. A `client-id` rule may name only these (or `*`).
pub(crate) const GRANT_METHODS: [&str; 2] = ["IssueServiceToken", "Token"];

/// One rule: at most `limit` requests of `method` per `window` for each key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rule {
    /// The RPC name, or `None` for `*` (every method).
    pub(crate) method: Option<&'static str>,
    pub(crate) key: KeyKind,
    pub(crate) limit: u32,
    pub(crate) window: Duration,
}

impl Rule {
    pub fn limit(&self) -> u32 {
        self.limit
    }

    pub fn window(&self) -> Duration {
        self.window
    }

    pub(crate) fn matches(&self, method: &str) -> bool {
        self.method.is_none_or(|m| m == method)
    }

    /// A sentence for `google.rpc.QuotaFailure`.
    pub(crate) fn describe(&self) -> String {
        let what = match self.method {
            Some(m) => format!("{m} requests"),
            None => "requests".to_owned(),
        };
        let per = match &self.key {
            KeyKind::Peer => " per client address".to_owned(),
            KeyKind::Global => " in total".to_owned(),
            KeyKind::Header(name) => format!(" per {name} value"),
            KeyKind::ClientCert => " per client certificate".to_owned(),
            KeyKind::ClientId => " per client id".to_owned(),
        };
        format!(
            "at most {} {what} per {}{per}",
            self.limit,
            humantime::format_duration(self.window)
        )
    }

    /// The key part naming the rule: `Login:peer:1000`. The limit is left out so
    /// that raising or lowering it keeps the log already counted.
    pub(crate) fn key_stem(&self) -> String {
        let method = self.method.unwrap_or("*");
        let window_ms = self.window.as_millis();
        match &self.key {
            KeyKind::Peer => format!("{method}:peer:{window_ms}"),
            KeyKind::Global => format!("{method}:global:{window_ms}"),
            KeyKind::Header(name) => format!("{method}:header:{name}:{window_ms}"),
            KeyKind::ClientCert => format!("{method}:client-cert:{window_ms}"),
            KeyKind::ClientId => format!("{method}:client-id:{window_ms}"),
        }
    }
}

impl fmt::Display for Rule {
    /// The rule in the syntax it was written in, normalized: `Login:peer=20/1s`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let method = self.method.unwrap_or("*");
        let window = humantime::format_duration(self.window).to_string();
        let window = window.replace(' ', "");
        match &self.key {
            KeyKind::Peer => write!(f, "{method}:peer={}/{window}", self.limit),
            KeyKind::Global => write!(f, "{method}:global={}/{window}", self.limit),
            KeyKind::Header(name) => write!(f, "{method}:header:{name}={}/{window}", self.limit),
            KeyKind::ClientCert => write!(f, "{method}:client-cert={}/{window}", self.limit),
            KeyKind::ClientId => write!(f, "{method}:client-id={}/{window}", self.limit),
        }
    }
}

impl FromStr for Rule {
    type Err = String;

    /// Parses `METHOD:KEY=LIMIT/WINDOW`; the error says what is wrong, not where
    /// (the caller names the rule).
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        const SHAPE: &str = "expected METHOD:KEY=LIMIT/WINDOW, e.g. Login:peer=20/1s";
        let (lhs, rhs) = text.split_once('=').ok_or(SHAPE)?;
        let (method, key) = lhs.split_once(':').ok_or(SHAPE)?;
        let (limit, window) = rhs.split_once('/').ok_or(SHAPE)?;
        let (method, key, limit, window) = (method.trim(), key.trim(), limit.trim(), window.trim());

        let method = if method == "*" {
            None
        } else {
            let known = crate::rpc::rule_method(method);
            Some(known.ok_or_else(|| {
                let names: Vec<_> = (Rpc::NAMED_METHODS.iter().map(|r| r.method()))
                    .chain(crate::rpc::STANDARD_METHODS)
                    .collect();
                format!(
                    "unknown method {method:?} (expected one of {} or *)",
                    names.join(", ")
                )
            })?)
        };

        let key = match key {
            "peer" => KeyKind::Peer,
            "global" => KeyKind::Global,
            "client-cert" => KeyKind::ClientCert,
            "client-id" => match method {
                Some(m) if !GRANT_METHODS.contains(&m) => {
                    return Err(format!(
                        "client-id counts the grants only: {}, {} or *, not {m}",
                        GRANT_METHODS[0], GRANT_METHODS[1]
                    ));
                }
                _ => KeyKind::ClientId,
            },
            _ => match key.strip_prefix("header:") {
                Some("") => {
                    return Err("header: needs a header name, e.g. header:x-client-id".into());
                }
                Some(name) => KeyKind::Header(
                    http::HeaderName::from_bytes(name.as_bytes())
                        .map_err(|_| format!("{name:?} is not a valid header name"))?,
                ),
                None => {
                    return Err(format!(
                        "unknown key {key:?} (expected peer, global, client-cert, client-id or \
                         header:NAME)"
                    ));
                }
            },
        };

        let limit: u32 = limit
            .parse()
            .map_err(|_| format!("limit {limit:?} is not a whole number"))?;
        if limit == 0 {
            return Err("the limit must be at least 1".into());
        }

        let window = humantime::parse_duration(window)
            .map_err(|e| format!("window {window:?}: {e} (examples: 1s, 500ms, 1m)"))?;
        if window < Duration::from_millis(1) || window.subsec_nanos() % 1_000_000 != 0 {
            return Err("the window must be a whole number of milliseconds, at least 1ms".into());
        }
        if window > MAX_WINDOW {
            return Err("the window must be at most 1day".into());
        }

        Ok(Rule {
            method,
            key,
            limit,
            window,
        })
    }
}

/// The rules of `AUTHD_RATE_LIMITS`: comma separated, all that match a request
/// must allow it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RateLimits(Vec<Rule>);

impl RateLimits {
    pub fn rules(&self) -> &[Rule] {
        &self.0
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl FromStr for RateLimits {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let mut rules: Vec<Rule> = Vec::new();
        // Empty entries (a trailing comma, an empty variable) are no rule, not an error.
        for written in text.split(',').map(str::trim).filter(|r| !r.is_empty()) {
            let rule: Rule = written
                .parse()
                .map_err(|why| format!("rule {written:?}: {why}"))?;
            // Two rules on the same method, key and window would share one log and
            // the tighter would always win: almost certainly a mistake.
            if let Some(twin) = rules.iter().find(|r| r.key_stem() == rule.key_stem()) {
                return Err(format!(
                    "rule {written:?}: counts the same requests as {twin} (same method, key \
                     and window); keep one"
                ));
            }
            rules.push(rule);
        }
        Ok(RateLimits(rules))
    }
}

impl fmt::Display for RateLimits {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, rule) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            write!(f, "{rule}")?;
        }
        Ok(())
    }
}

impl RateLimits {
    /// These rules and the default limit on Register per client, unless it is off
    /// or these rules already limit Register per client (the operator's rule wins).
    pub fn with_register_limit(&self, default: &RegisterLimit) -> RateLimits {
        let mut rules = self.0.clone();
        let limited = |r: &Rule| r.method == Some("Register") && r.key == KeyKind::Peer;
        if let Some(rule) = &default.0
            && !rules.iter().any(limited)
        {
            rules.push(rule.clone());
        }
        RateLimits(rules)
    }
}

/// The default limit on Register per client address (`AUTHD_REGISTER_LIMIT`):
/// `LIMIT/WINDOW`, or `off`. Register answers differently for a taken name and a
/// free one, so without a limit any client could test names as fast as it hashes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RegisterLimit(Option<Rule>);

impl RegisterLimit {
    pub const OFF: RegisterLimit = RegisterLimit(None);

    pub fn rule(&self) -> Option<&Rule> {
        self.0.as_ref()
    }
}

impl FromStr for RegisterLimit {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let text = text.trim();
        if text.eq_ignore_ascii_case("off") {
            return Ok(RegisterLimit::OFF);
        }
        let rule: Rule = format!("Register:peer={text}")
            .parse()
            .map_err(|_| "expected LIMIT/WINDOW (e.g. 100/1m) or off".to_owned())?;
        Ok(RegisterLimit(Some(rule)))
    }
}

impl fmt::Display for RegisterLimit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.0 {
            Some(rule) => write!(
                f,
                "{}/{}",
                rule.limit,
                humantime::format_duration(rule.window)
            ),
            None => f.write_str("off"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<RateLimits, String> {
        text.parse()
    }

    #[test]
    fn the_register_limit_joins_the_rules_unless_off_or_already_there() {
        let default: RegisterLimit = "100/1m".parse().unwrap();
        assert_eq!(default.to_string(), "100/1m");
        let rules = parse("Login:peer=5/1s")
            .unwrap()
            .with_register_limit(&default);
        assert_eq!(rules.to_string(), "Login:peer=5/1s,Register:peer=100/1m");
        let own = parse("Register:peer=5/1h").unwrap();
        assert_eq!(own.with_register_limit(&default), own);
        let off: RegisterLimit = "off".parse().unwrap();
        assert!(RateLimits::default().with_register_limit(&off).is_empty());
        for bad in ["", "100", "0/1m", "100/1m,Login:peer=1/1s", "ten/1m"] {
            assert!(bad.parse::<RegisterLimit>().is_err(), "{bad}");
        }
    }

    #[test]
    fn the_design_example_parses() {
        let rules = parse("Login:peer=20/1s,Login:global=2000/1s,*:peer=200/1s").unwrap();
        let rules = rules.rules();
        assert_eq!(rules.len(), 3);
        assert_eq!(rules[0].method, Some("Login"));
        assert_eq!(rules[0].key, KeyKind::Peer);
        assert_eq!(rules[0].limit, 20);
        assert_eq!(rules[0].window, Duration::from_secs(1));
        assert_eq!(rules[1].key, KeyKind::Global);
        assert_eq!(rules[1].limit, 2000);
        assert_eq!(rules[2].method, None);
    }

    #[test]
    fn good_rules_parse_and_print_normalized() {
        for (text, shown) in [
            ("Login:peer=20/1s", "Login:peer=20/1s"),
            (" login : global = 5 / 500ms ", "Login:global=5/500ms"),
            ("*:header:X-Client-Id=100/1m", "*:header:x-client-id=100/1m"),
            ("ValidateToken:peer=1000/1h", "ValidateToken:peer=1000/1h"),
            ("*:client-cert=1000/1s", "*:client-cert=1000/1s"),
            (
                "IssueServiceToken:client-id=10/1m",
                "IssueServiceToken:client-id=10/1m",
            ),
            ("token:client-id=10/1s", "Token:client-id=10/1s"),
            ("*:client-id=100/1s", "*:client-id=100/1s"),
            ("Register:global=10/1m 30s", "Register:global=10/1m30s"),
            ("refresh:peer=10/1s", "Refresh:peer=10/1s"),
            ("Logout:global=100/1s", "Logout:global=100/1s"),
            ("changepassword:peer=3/1m", "ChangePassword:peer=3/1m"),
        ] {
            let rules = parse(text).unwrap_or_else(|e| panic!("{text:?}: {e}"));
            assert_eq!(rules.to_string(), shown, "{text:?}");
            // The printed form parses back to the same rule.
            assert_eq!(parse(shown).unwrap(), rules);
        }
        assert!(parse("").unwrap().is_empty());
        assert_eq!(parse("Login:peer=1/1s,").unwrap().rules().len(), 1);
        // Same method and key with different windows: a burst and a sustained limit.
        assert_eq!(
            parse("Login:peer=5/1s,Login:peer=100/1m")
                .unwrap()
                .rules()
                .len(),
            2
        );
    }

    #[test]
    fn bad_rules_are_refused_naming_the_rule_and_the_problem() {
        for (text, expected) in [
            (
                "Login:peer=20/1s,Logn:peer=5/1s",
                r#"rule "Logn:peer=5/1s": unknown method "Logn""#,
            ),
            ("Login", "expected METHOD:KEY=LIMIT/WINDOW"),
            ("Login:peer", "expected METHOD:KEY=LIMIT/WINDOW"),
            ("Login:peer=20", "expected METHOD:KEY=LIMIT/WINDOW"),
            ("peer=20/1s", "expected METHOD:KEY=LIMIT/WINDOW"),
            (
                "Login:ip=20/1s",
                r#"unknown key "ip" (expected peer, global, client-cert, client-id or header:NAME)"#,
            ),
            (
                "Login:client-id=5/1s",
                "client-id counts the grants only: IssueServiceToken, Token or *, not Login",
            ),
            ("Login:header:=20/1s", "needs a header name"),
            ("Login:header:bad header=20/1s", "not a valid header name"),
            ("Login:peer=0/1s", "at least 1"),
            ("Login:peer=-1/1s", r#"limit "-1" is not a whole number"#),
            ("Login:peer=many/1s", "not a whole number"),
            ("Login:peer=99999999999/1s", "not a whole number"),
            ("Login:peer=20/soon", r#"window "soon""#),
            ("Login:peer=20/0s", "at least 1ms"),
            ("Login:peer=20/1500us", "whole number of milliseconds"),
            ("Login:peer=20/2days", "at most 1day"),
            (
                "Login:peer=5/1s,Login:peer=9/1s",
                "counts the same requests as Login:peer=5/1s",
            ),
        ] {
            let err = parse(text).expect_err(text);
            assert!(err.contains(expected), "{text:?}: {err}");
            assert!(err.starts_with("rule \""), "{text:?}: {err}");
        }
    }
}
