//! Who may introspect tokens: clients named in `AUTHD_INTROSPECTION_KEYS_FILE`
//! (the admin keys file's format, `crate::named_keys`, with the role
//! `introspect`), presenting `client_id:secret` with HTTP Basic
//! (`client_secret_basic`, RFC 6749 §2.3.1), and, under mutual TLS, the client
//! certificate identities of `AUTHD_INTROSPECTION_ALLOW` (`tls_client_auth`,
//! RFC 8705).
//!
//! A request that carries an `Authorization` header is decided by it alone; one
//! without is decided by its certificate's identity. A refusal never says which
//! part was wrong. Secrets are compared as digests in constant time.

use crate::{named_keys::NamedKeys, rpc};
use axum::http::{HeaderMap, header};
use base64::{Engine as _, engine::general_purpose::STANDARD};
use std::path::Path;

/// The only role of the introspection keys file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Introspect;

/// The clients allowed to introspect.
#[derive(Debug, Default)]
pub struct IntrospectionClients {
    keys: Option<NamedKeys<Introspect>>,
    allow: Vec<String>,
}

impl IntrospectionClients {
    /// The clients of the keys file at `path` (if any) and the identities of
    /// `allow`.
    pub fn new(path: Option<&Path>, allow: Vec<String>) -> Result<Self, String> {
        let keys = path
            .map(|path| NamedKeys::read(path, "introspection", role))
            .transpose()?;
        Ok(Self { keys, allow })
    }

    /// The clients of a keys file's text (tests).
    #[cfg(test)]
    fn parse(text: &str) -> Result<Self, String> {
        Ok(Self {
            keys: Some(NamedKeys::parse(text, "introspection", role)?),
            allow: Vec::new(),
        })
    }

    /// The `introspection_endpoint_auth_methods_supported` of the discovery
    /// document; empty when no client may introspect.
    pub(super) fn auth_methods(&self) -> Vec<&'static str> {
        let mut methods = Vec::new();
        if self.keys.is_some() {
            methods.push("client_secret_basic");
        }
        if !self.allow.is_empty() {
            methods.push("tls_client_auth");
        }
        methods
    }

    /// The name of the client that sent a request with these headers and
    /// extensions, or `None`: no credential, or a wrong one.
    pub(super) fn authenticate(
        &self,
        headers: &HeaderMap,
        extensions: &http::Extensions,
    ) -> Option<String> {
        let mut values = headers.get_all(header::AUTHORIZATION).iter();
        match (values.next(), values.next()) {
            (Some(value), None) => {
                let (id, secret) = basic(value.to_str().ok()?)?;
                self.by_secret(&id, &secret)
            }
            (None, _) => {
                let identity = rpc::client_identity(extensions)?;
                (self.allow.iter())
                    .find(|allowed| allowed.as_str() == identity.as_str())
                    .cloned()
            }
            // Two Authorization headers: which one would decide is ambiguous.
            (Some(_), Some(_)) => None,
        }
    }

    /// The client `id` when `secret` is its key.
    fn by_secret(&self, id: &str, secret: &str) -> Option<String> {
        let keys = self.keys.as_ref()?;
        let name = match keys.identify(secret.as_bytes()) {
            Some((name, Introspect)) => name,
            // RFC 6749 §2.3.1 form-encodes both parts before base64; most clients
            // send secrets that need no encoding, some encode anyway.
            None => {
                let decoded = form_decoded(secret)?;
                keys.identify(decoded.as_bytes())?.0
            }
        };
        let id = form_decoded(id).unwrap_or_else(|| id.to_owned());
        (name == id).then_some(id)
    }
}

/// The role column of the introspection keys file.
fn role(text: &str) -> Result<Introspect, String> {
    match text {
        "introspect" => Ok(Introspect),
        other => Err(format!("unknown role {other:?} (expected introspect)")),
    }
}

/// `Basic base64(id:secret)` → the id and the secret.
pub(super) fn basic(value: &str) -> Option<(String, String)> {
    let (scheme, encoded) = value.trim().split_once(' ')?;
    if !scheme.eq_ignore_ascii_case("basic") {
        return None;
    }
    let decoded = String::from_utf8(STANDARD.decode(encoded.trim()).ok()?).ok()?;
    let (id, secret) = decoded.split_once(':')?;
    Some((id.to_owned(), secret.to_owned()))
}

/// `text` form-decoded, when decoding changes it.
fn form_decoded(text: &str) -> Option<String> {
    if !text.contains(['%', '+']) {
        return None;
    }
    let decoded: String = form_urlencoded::parse(format!("x={text}").as_bytes())
        .next()
        .map(|(_, v)| v.into_owned())?;
    (decoded != text).then_some(decoded)
}

#[cfg(test)]
mod tests {
    use super::*;
    use sha2::{Digest as _, Sha256};

    const SECRET: &str = "a secret of thirty-two bytes or more +/";

    fn clients() -> IntrospectionClients {
        let digest = hex::encode(Sha256::digest(SECRET.as_bytes()));
        IntrospectionClients::parse(&format!("gateway introspect {digest}\n")).unwrap()
    }

    fn headers(value: &str) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert(header::AUTHORIZATION, value.parse().unwrap());
        headers
    }

    fn basic_of(id: &str, secret: &str) -> HeaderMap {
        headers(&format!(
            "Basic {}",
            STANDARD.encode(format!("{id}:{secret}"))
        ))
    }

    #[test]
    fn a_client_is_its_id_and_secret() {
        let c = clients();
        let none = http::Extensions::new();
        assert_eq!(
            c.authenticate(&basic_of("gateway", SECRET), &none)
                .as_deref(),
            Some("gateway")
        );
        // Form-encoded first, as RFC 6749 asks.
        let encoded: String = form_urlencoded::byte_serialize(SECRET.as_bytes()).collect();
        assert_eq!(
            c.authenticate(&basic_of("gateway", &encoded), &none)
                .as_deref(),
            Some("gateway")
        );
        for refused in [
            basic_of("other", SECRET),
            basic_of("gateway", "a wrong secret of thirty-two bytes!!"),
            headers("Bearer abc"),
            headers("Basic !!!"),
            HeaderMap::new(),
        ] {
            assert_eq!(c.authenticate(&refused, &none), None, "{refused:?}");
        }
        assert_eq!(c.auth_methods(), ["client_secret_basic"]);
        let err = IntrospectionClients::parse("gateway admin 00").unwrap_err();
        assert!(err.contains("expected introspect"), "{err}");
    }
}
