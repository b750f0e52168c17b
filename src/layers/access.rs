//! The allow-list of mutual TLS (`AUTHD_TLS_ALLOW`): which client identities may call
//! which AuthService method. A tower layer inside the trace layer (its refusals are
//! logged and counted) and outside the rate limit (a refused request costs nothing).
//!
//! `METHOD:IDENTITY,…`, METHOD an AuthService method or `*` (every method), IDENTITY a
//! certificate identity as `rpc::ClientIdentity` has it (a SPIFFE id, a DNS name, a
//! CN), compared exactly. A method no entry names (and no `*` entry) is open to every
//! client the TLS handshake let in; a named method only to the identities listed for
//! it or for `*`. Anyone else, a request without an identity included, gets
//! PERMISSION_DENIED. Health and reflection are never restricted.

use crate::{
    error::Error,
    middleware::{BoxFuture, Middleware, MiddlewareLayer, Request, Response},
    rpc::{self, Rpc},
};
use std::{fmt, str::FromStr, sync::Arc};
use tower::Service;

/// The longest identity an entry may name (as `transport::tls` keeps them).
const MAX_IDENTITY_BYTES: usize = 512;

/// Which identities may call which methods; empty allows everyone.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AllowList {
    /// `(method, identity)`, `None` standing for `*`.
    entries: Vec<(Option<Rpc>, String)>,
}

impl AllowList {
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Whether `identity` may call `rpc`.
    pub(crate) fn allows(&self, rpc: Rpc, identity: Option<&str>) -> bool {
        if rpc.is_exempt() {
            return true;
        }
        let mut restricted = false;
        for (method, allowed) in &self.entries {
            if method.is_none_or(|m| m == rpc) {
                restricted = true;
                if identity == Some(allowed.as_str()) {
                    return true;
                }
            }
        }
        !restricted
    }
}

impl FromStr for AllowList {
    type Err = String;

    /// Parses `METHOD:IDENTITY,…` (an identity may hold `:`, as URIs do; the first
    /// `:` ends the method).
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let mut entries = Vec::new();
        for entry in text.split(',').map(str::trim).filter(|e| !e.is_empty()) {
            let (method, identity) = entry.split_once(':').ok_or_else(|| {
                format!(
                    "{entry:?}: expected METHOD:IDENTITY, e.g. Register:spiffe://corp/ns/web/sa/signup"
                )
            })?;
            let method = match method.trim() {
                "*" => None,
                name => Some(Rpc::auth_method(name).ok_or_else(|| {
                    let names: Vec<_> = Rpc::NAMED_METHODS.iter().map(|r| r.method()).collect();
                    format!(
                        "{entry:?}: unknown method {name:?} (expected one of {} or *)",
                        names.join(", ")
                    )
                })?),
            };
            let identity = identity.trim();
            if identity.is_empty()
                || identity.len() > MAX_IDENTITY_BYTES
                || identity.chars().any(char::is_control)
            {
                return Err(format!(
                    "{entry:?}: the identity must be 1 to {MAX_IDENTITY_BYTES} bytes without \
                     control characters"
                ));
            }
            entries.push((method, identity.to_owned()));
        }
        Ok(Self { entries })
    }
}

impl fmt::Display for AllowList {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, (method, identity)) in self.entries.iter().enumerate() {
            let sep = if i == 0 { "" } else { "," };
            let method = method.map_or("*", Rpc::method);
            write!(f, "{sep}{method}:{identity}")?;
        }
        Ok(())
    }
}

/// The allow-list layer's policy.
pub(crate) struct Access {
    allow: AllowList,
}

/// The allow-list layer; with an empty list it lets everything through.
pub(crate) fn layer(allow: AllowList) -> MiddlewareLayer<Access> {
    MiddlewareLayer::new(Arc::new(Access { allow }))
}

impl Middleware for Access {
    fn call<S>(self: Arc<Self>, mut inner: S, req: Request) -> BoxFuture<Result<Response, S::Error>>
    where
        S: Service<Request, Response = Response> + Send + 'static,
        S::Future: Send + 'static,
        S::Error: Send + 'static,
    {
        if self.allow.is_empty() {
            return Box::pin(inner.call(req));
        }
        let rpc = Rpc::of_path(req.uri().path());
        let identity = rpc::client_identity(req.extensions()).map(|i| i.as_str());
        if self.allow.allows(rpc, identity) {
            return Box::pin(inner.call(req));
        }
        let refusal = Error::PermissionDenied.to_status().into_http();
        Box::pin(async move { Ok(refusal) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        middleware::testing::{counting_service, grpc_status, request, served},
        rpc::ClientIdentity,
    };
    use tower::{Layer as _, ServiceExt as _};

    const SIGNUP: &str = "spiffe://corp/ns/web/sa/signup";

    #[test]
    fn named_methods_are_restricted_and_the_others_open() {
        let list: AllowList = format!("Register:{SIGNUP}, login:web.corp,Login:{SIGNUP}")
            .parse()
            .unwrap();
        assert_eq!(
            list.to_string(),
            format!("Register:{SIGNUP},Login:web.corp,Login:{SIGNUP}")
        );
        assert!(list.allows(Rpc::Register, Some(SIGNUP)));
        assert!(!list.allows(Rpc::Register, Some("web.corp")));
        assert!(!list.allows(Rpc::Register, None));
        assert!(list.allows(Rpc::Login, Some("web.corp")));
        assert!(list.allows(Rpc::ValidateToken, None));
        assert!(list.allows(Rpc::HealthCheck, None));
        let all: AllowList = "*:web.corp,Register:signup".parse().unwrap();
        assert!(all.allows(Rpc::ValidateToken, Some("web.corp")));
        assert!(!all.allows(Rpc::ValidateToken, Some("signup")));
        assert!(all.allows(Rpc::Register, Some("signup")));
        assert!(!all.allows(Rpc::Unknown, None));
        assert!(all.allows(Rpc::ReflectionV1, None));
        assert!(AllowList::default().allows(Rpc::Register, None));
    }

    #[test]
    fn bad_entries_are_refused_with_a_reason() {
        for (text, why) in [
            ("Register", "expected METHOD:IDENTITY"),
            ("Watch:x", "unknown method \"Watch\""),
            ("Login:", "the identity must be"),
            ("Login: \u{7}", "the identity must be"),
        ] {
            let err = text.parse::<AllowList>().unwrap_err();
            assert!(err.contains(why), "{text:?}: {err}");
        }
        assert!("".parse::<AllowList>().unwrap().is_empty());
        // Envoy's Check is a method like any: a proxy's identity may be required.
        let list: AllowList = "Check:envoy.corp".parse().unwrap();
        assert!(list.allows(Rpc::ExtAuthzCheck, Some("envoy.corp")));
        assert!(!list.allows(Rpc::ExtAuthzCheck, Some("web.corp")));
        assert!(list.allows(Rpc::ValidateToken, Some("web.corp")));
    }

    #[tokio::test]
    async fn a_refused_identity_gets_permission_denied_before_the_service() {
        let (inner, calls) = counting_service();
        let service = layer(format!("Register:{SIGNUP}").parse().unwrap()).layer(inner);
        let with = |identity: Option<&str>| {
            let mut req = request("/auth.v1.AuthService/Register");
            if let Some(identity) = identity {
                req.extensions_mut()
                    .insert(ClientIdentity(Arc::from(identity)));
            }
            req
        };
        let ok = service.clone().oneshot(with(Some(SIGNUP))).await.unwrap();
        assert!(served(&ok));
        for refused in [with(Some("spiffe://corp/other")), with(None)] {
            let response = service.clone().oneshot(refused).await.unwrap();
            assert!(!served(&response));
            assert_eq!(grpc_status(&response), Some("7"));
        }
        assert_eq!(calls.load(std::sync::atomic::Ordering::SeqCst), 1);
    }
}
