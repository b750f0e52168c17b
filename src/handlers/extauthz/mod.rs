//! External authorization: the proxies in front of other services ask authd whether
//! a request may pass, and learn who sent it.
//!
//! One decision, two faces:
//! - `envoy`: `envoy.service.auth.v3.Authorization/Check` on the gRPC port (Envoy's
//!   and Istio's ext_authz), per-route policy from the CheckRequest's
//!   `context_extensions`;
//! - `http`: `/forward-auth` on its own HTTP port (nginx `auth_request`, Traefik
//!   ForwardAuth, Caddy `forward_auth`), per-route policy from the query string;
//! - `wire`: Envoy's CheckRequest and CheckResponse as authd reads and writes them
//!   (the headers and `context_extensions` only, as slices of the received buffer).
//!
//! This file owns what both share: the [`Policy`] of a route, and [`Authorizer`],
//! which reads `authorization: Bearer …`, verifies the token exactly as
//! ValidateToken does (`Accounts::validate`: signature, expiry, `nbf`, audience,
//! ended sessions and users, all in memory, no database query), applies the policy,
//! names the identity headers of an allowed request and counts every decision. A
//! refusal maps itself to its HTTP status and challenge in `error.rs` ([`Denial`]).
//! The token is never logged; the decision and its reason are.

mod envoy;
mod http;
pub(crate) mod wire;

pub(crate) use envoy::AuthorizationApi;
pub(crate) use http::router;

use crate::{
    accounts::Accounts,
    error::{Denial, TokenError},
    metrics::AuthzMetrics,
    token::{self, VerifiedToken},
};
use bytes::Bytes;
use std::{borrow::Cow, sync::Arc};

/// What Envoy's Check and the forward-auth endpoint share (`config::AuthzConfig`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuthzSettings {
    /// The identity headers' prefix, lowercase (`x-authd-`).
    pub header_prefix: String,
    /// Whether `authorization` is removed from an allowed request.
    pub strip_authorization: bool,
    /// The realm of the `WWW-Authenticate` challenge.
    pub realm: String,
}

/// What stands for an `authorization` header that cannot be read (not visible
/// ASCII, or sent twice): a bearer credential that is malformed.
const UNREADABLE: &str = "Bearer ,";

/// Longest bearer token read: far beyond any token authd issues.
const MAX_TOKEN_BYTES: usize = 8 * 1024;

/// What a route requires, from the proxy's configuration (never from the client).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Policy {
    /// The token must name this audience (`audience`).
    pub audience: Option<String>,
    /// The sign-in must have used a second factor (`require_second_factor`).
    pub second_factor: bool,
    /// A request without a token passes, without identity headers
    /// (`allow_anonymous`); a request with a bad token is still refused.
    pub anonymous: bool,
}

impl Policy {
    /// The policy of `settings` (key, value pairs). An unknown key, or a value that
    /// is not one of the key's, is a misconfigured route: the error names the key.
    pub(crate) fn parse<'a>(
        settings: impl IntoIterator<Item = (&'a str, &'a str)>,
    ) -> Result<Policy, String> {
        let mut policy = Policy::default();
        let flag = |key: &str, value: &str| match value {
            "true" => Ok(true),
            "false" => Ok(false),
            _ => Err(format!("{key}: expected true or false")),
        };
        for (key, value) in settings {
            match key {
                "audience" => {
                    let audience = token::requested_audience(value)
                        .map_err(|why| format!("audience: {why}"))?;
                    policy.audience = audience.map(str::to_owned);
                }
                "require_second_factor" => policy.second_factor = flag(key, value)?,
                "allow_anonymous" => policy.anonymous = flag(key, value)?,
                _ => {
                    let shown: String = key.chars().take(64).collect();
                    return Err(format!("unknown policy key {shown:?}"));
                }
            }
        }
        Ok(policy)
    }
}

/// What was decided.
#[derive(Debug)]
pub(crate) enum Decision {
    /// Let the request through: as the token's user, or anonymously (`None`).
    Allow(Option<Box<VerifiedToken>>),
    Deny(Denial),
}

impl Decision {
    /// `allow` or `deny`.
    pub(crate) fn outcome(&self) -> &'static str {
        match self {
            Decision::Allow(_) => "allow",
            Decision::Deny(_) => "deny",
        }
    }

    /// Why: `valid`, `anonymous`, or the denial's label.
    pub(crate) fn reason(&self) -> &'static str {
        match self {
            Decision::Allow(Some(_)) => "valid",
            Decision::Allow(None) => "anonymous",
            Decision::Deny(denial) => denial.label(),
        }
    }
}

/// Decides for both faces.
pub(crate) struct Authorizer {
    accounts: Arc<Accounts>,
    settings: AuthzSettings,
    /// [`identity_header_names`] under the settings' prefix, made once.
    header_names: [Bytes; IDENTITY_HEADERS],
    metrics: AuthzMetrics,
}

impl Authorizer {
    pub(crate) fn new(
        accounts: Arc<Accounts>,
        settings: AuthzSettings,
        metrics: AuthzMetrics,
    ) -> Arc<Self> {
        let header_names = identity_header_names(&settings.header_prefix).map(Bytes::from);
        Arc::new(Self {
            accounts,
            settings,
            header_names,
            metrics,
        })
    }

    pub(crate) fn settings(&self) -> &AuthzSettings {
        &self.settings
    }

    /// The identity headers' names, in the order of [`identity_values`].
    pub(crate) fn header_names(&self) -> &[Bytes; IDENTITY_HEADERS] {
        &self.header_names
    }

    /// Decides on a request whose `authorization` header is `authorization`, for a
    /// route whose policy is `policy` (an error: the route is misconfigured), and
    /// counts and logs the decision under `api` (`grpc` or `http`).
    pub(crate) fn decide(
        &self,
        api: &'static str,
        authorization: Option<&str>,
        policy: Result<Policy, String>,
    ) -> Decision {
        let decision = match policy {
            Ok(policy) => self.decide_for(authorization, &policy),
            Err(why) => {
                tracing::error!(api, error = %why, "external authorization: a misconfigured route policy; refused");
                Decision::Deny(Denial::BadPolicy)
            }
        };
        self.metrics
            .decision(api, decision.outcome(), decision.reason());
        decision
    }

    fn decide_for(&self, authorization: Option<&str>, policy: &Policy) -> Decision {
        let token = match bearer(authorization) {
            Bearer::None if policy.anonymous => return Decision::Allow(None),
            Bearer::None => return Decision::Deny(Denial::Missing),
            Bearer::Malformed => {
                return Decision::Deny(Denial::InvalidToken(TokenError::Malformed));
            }
            Bearer::Token(token) => token,
        };
        let verified = match self.accounts.validate(token, policy.audience.as_deref()) {
            Ok(verified) => verified,
            Err(crate::error::Error::InvalidToken(e)) => {
                return Decision::Deny(Denial::InvalidToken(e));
            }
            // `validate` fails only with a token error; anything else is no token.
            Err(_) => return Decision::Deny(Denial::InvalidToken(TokenError::Malformed)),
        };
        if policy.second_factor && !verified.second_factor() {
            return Decision::Deny(Denial::SecondFactorRequired);
        }
        // Every identity value must go into a header as it is; a validly signed token
        // whose claims cannot is refused rather than passed on half-named.
        if !identity_values_fit(&verified) {
            return Decision::Deny(Denial::InvalidToken(TokenError::Malformed));
        }
        Decision::Allow(Some(Box::new(verified)))
    }
}

/// What the `authorization` header holds.
enum Bearer<'a> {
    /// No header, or another scheme than Bearer.
    None,
    /// `Bearer` with no token, or with one that cannot be one.
    Malformed,
    Token(&'a str),
}

/// Reads `Bearer TOKEN` (the scheme case-insensitively, RFC 6750 section 2.1).
fn bearer(authorization: Option<&str>) -> Bearer<'_> {
    let Some(value) = authorization.map(str::trim) else {
        return Bearer::None;
    };
    let (scheme, token) = value.split_once(' ').unwrap_or((value, ""));
    if !scheme.eq_ignore_ascii_case("bearer") {
        return Bearer::None;
    }
    let token = token.trim();
    if token.is_empty()
        || token.len() > MAX_TOKEN_BYTES
        || memchr::memchr2(b' ', b',', token.as_bytes()).is_some()
    {
        return Bearer::Malformed;
    }
    Bearer::Token(token)
}

/// How many identity headers there are.
pub(crate) const IDENTITY_HEADERS: usize = 9;

/// The headers that name `token`'s user (or service) to the upstream, under
/// `prefix`: user id, username, session id (when the token has one), `amr` and
/// audience (comma separated, when there are any); for a service token the
/// service's name (`client-id`) and id (`service-id`) instead of the user's; for an
/// exchanged token the user's, the acting service's name (`client-id`) and the ids
/// of the services acting (`actor`, the latest first); the scopes (`scope`, space
/// separated) when there are any.
pub(crate) fn identity_headers(prefix: &str, token: &VerifiedToken) -> Vec<(String, String)> {
    identity_header_names(prefix)
        .into_iter()
        .zip(identity_values(token))
        .filter_map(|(name, value)| Some((name, value?.into_owned())))
        .collect()
}

/// The names of every identity header, set or not: what is removed from a request
/// before any is set, so that a client can forge none. In the order of
/// [`identity_values`].
pub(crate) fn identity_header_names(prefix: &str) -> [String; IDENTITY_HEADERS] {
    [
        "user-id",
        "username",
        "session-id",
        "amr",
        "audience",
        "client-id",
        "service-id",
        "scope",
        "actor",
    ]
    .map(|name| format!("{prefix}{name}"))
}

/// The value of each identity header for `token`, in the order of
/// [`identity_header_names`]; `None` for one not set (no session, no `amr`, no
/// audience, not a service's).
pub(crate) fn identity_values(token: &VerifiedToken) -> [Option<Cow<'_, str>>; IDENTITY_HEADERS] {
    fn list(items: &[String], by: &str) -> Option<Cow<'static, str>> {
        match items {
            [] => None,
            many => Some(Cow::Owned(many.join(by))),
        }
    }
    let service = crate::accounts::is_service_token(token);
    let mut actors = Vec::new();
    let mut actor = token.actor.as_ref();
    while let Some(a) = actor {
        actors.push(a.sub.clone());
        actor = a.act.as_deref();
    }
    [
        (!service).then_some(Cow::Borrowed(token.user_id.as_str())),
        (!service).then_some(Cow::Borrowed(token.username.as_str())),
        token.session_id.as_deref().map(Cow::Borrowed),
        if service { None } else { list(&token.amr, ",") },
        list(&token.audience, ","),
        token.client_id.as_deref().map(Cow::Borrowed),
        service.then_some(Cow::Borrowed(token.user_id.as_str())),
        list(&token.scopes, " "),
        list(&actors, ","),
    ]
}

/// Whether every identity value of `token` is a header value as it is.
fn identity_values_fit(token: &VerifiedToken) -> bool {
    identity_values(token)
        .iter()
        .flatten()
        .all(|value| is_header_value(value))
}

/// Visible ASCII and spaces, at most 4 KiB: what every proxy passes on unchanged.
fn is_header_value(value: &str) -> bool {
    // Every byte looked at, without a branch per byte: the loop vectorizes.
    value.len() <= 4096
        && !value
            .bytes()
            .fold(false, |bad, b| bad | !(b' '..=b'~').contains(&b))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_policy_takes_known_keys_and_refuses_anything_else() {
        assert_eq!(Policy::parse([]), Ok(Policy::default()));
        let policy = Policy::parse([
            ("audience", "orders"),
            ("require_second_factor", "true"),
            ("allow_anonymous", "false"),
        ])
        .unwrap();
        assert_eq!(policy.audience.as_deref(), Some("orders"));
        assert!(policy.second_factor && !policy.anonymous);
        assert_eq!(Policy::parse([("audience", "")]), Ok(Policy::default()));
        for bad in [
            vec![("require_second_factor", "yes")],
            vec![("allow_anonymous", "")],
            vec![("audiences", "orders")],
            vec![("audience", &*"a".repeat(300))],
        ] {
            assert!(Policy::parse(bad.clone()).is_err(), "{bad:?}");
        }
        let long = "k".repeat(10_000);
        let err = Policy::parse([(long.as_str(), "x")]).unwrap_err();
        assert!(err.len() < 100, "{err}");
    }

    #[test]
    fn only_a_bearer_token_is_read() {
        assert!(matches!(bearer(None), Bearer::None));
        assert!(matches!(bearer(Some("Basic dXNlcjpwdw==")), Bearer::None));
        assert!(matches!(bearer(Some("Bearer")), Bearer::Malformed));
        assert!(matches!(bearer(Some("Bearer a b")), Bearer::Malformed));
        assert!(matches!(bearer(Some("Bearer a,b")), Bearer::Malformed));
        assert!(matches!(bearer(Some("bearer abc")), Bearer::Token("abc")));
        assert!(matches!(
            bearer(Some(" BEARER  abc ")),
            Bearer::Token("abc")
        ));
        let huge = format!("Bearer {}", "a".repeat(MAX_TOKEN_BYTES + 1));
        assert!(matches!(bearer(Some(&huge)), Bearer::Malformed));
    }

    #[test]
    fn identity_headers_name_the_user_under_the_prefix() {
        let token = VerifiedToken {
            user_id: "u1".into(),
            username: "ada".into(),
            expires_at: std::time::SystemTime::UNIX_EPOCH,
            session_id: Some("s1".into()),
            issued_at: 0,
            amr: vec!["pwd".into(), "otp".into()],
            audience: vec![],
            issuer_url: false,
            not_before: None,
            token_id: None,
            client_id: None,
            scopes: vec![],
            credential_id: None,
            actor: None,
        };
        let headers = identity_headers("x-authd-", &token);
        let named: Vec<(&str, &str)> = headers
            .iter()
            .map(|(n, v)| (n.as_str(), v.as_str()))
            .collect();
        assert_eq!(
            named,
            [
                ("x-authd-user-id", "u1"),
                ("x-authd-username", "ada"),
                ("x-authd-session-id", "s1"),
                ("x-authd-amr", "pwd,otp"),
            ]
        );
        for (name, _) in &headers {
            assert!(identity_header_names("x-authd-").contains(name));
        }
        assert!(!is_header_value("a\r\nb") && is_header_value("pwd,otp"));
    }
}
