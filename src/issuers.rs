//! External JWT issuers (docs/service-accounts.md): tokens another issuer signed,
//! such as a Kubernetes API server's projected service-account tokens, accepted as a
//! service account's credential (RFC 7523's `client_assertion`).
//!
//! Each configured issuer has its URL (the tokens' `iss`) and the audience its
//! tokens must name. Its keys come from its discovery document
//! (`ISSUER/.well-known/openid-configuration`, whose `jwks_uri` names the JWKS, as
//! Kubernetes publishes `/openid/v1/jwks`), fetched when first needed and again when
//! a token names a key id not held, never more often than once per `min_refresh`
//! per issuer (a flood of tokens with made-up key ids costs one fetch a period). A
//! fetch is bounded in time and in size, and one at a time per issuer; the keys in
//! use stay while a fetch fails.
//!
//! Only asymmetric algorithms are accepted (RS256…, ES256, ES384, EdDSA), each fixed
//! by the key: a token whose `alg` is not its key's is refused, so no key is ever
//! used as an HMAC secret. `exp` (required) and `nbf` are checked against the
//! accounts' clock with the configured skew. What a refused token lacked goes to the
//! log at debug level, never to the caller.

use crate::clock::Clock;
use bytes::Bytes;
use http_body_util::{BodyExt as _, Empty, Limited};
use jsonwebtoken::{Algorithm, DecodingKey, Validation, jwk::JwkSet};
use prometheus::IntCounterVec;
use serde::Deserialize;
use std::{
    collections::HashMap,
    sync::{Arc, RwLock},
    time::{Duration, Instant},
};

/// The largest discovery document or JWKS read.
pub const MAX_DOCUMENT_BYTES: usize = 64 * 1024;
/// How long one fetch (connect, TLS, request, body) may take.
pub const FETCH_TIMEOUT: Duration = Duration::from_secs(5);
/// The most issuers that may be configured, and keys held per issuer.
pub const MAX_ISSUERS: usize = 32;
pub const MAX_KEYS: usize = 64;
/// The longest token read, in bytes.
pub const MAX_TOKEN_BYTES: usize = 8 * 1024;

/// What the configuration gives.
#[derive(Debug, Clone, Default)]
pub struct IssuerSettings {
    /// Each issuer's URL and the audience its tokens must name.
    pub issuers: Vec<(String, String)>,
    /// The CAs an `https` issuer's certificate must chain to (default: the Mozilla
    /// roots).
    pub ca: Option<tokio_rustls::rustls::RootCertStore>,
    /// The least time between two fetches of one issuer's keys.
    pub min_refresh: Duration,
    /// Leeway on `exp` and `nbf`.
    pub clock_skew: Duration,
}

/// Why an external token was refused (for the log).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    Malformed,
    UnknownIssuer,
    UnknownKey,
    BadSignature,
    WrongAudience,
    Expired,
    /// The issuer's keys could not be fetched, and none are held.
    Unreachable,
}

/// One key of an issuer.
struct Key {
    kid: Option<String>,
    algorithm: Algorithm,
    key: DecodingKey,
}

struct Issuer {
    url: String,
    audience: String,
    keys: RwLock<Arc<Vec<Key>>>,
    /// When the keys were last fetched (or tried); one fetch at a time.
    fetched: tokio::sync::Mutex<Option<Instant>>,
}

/// The configured external issuers.
pub struct Issuers {
    issuers: HashMap<String, Arc<Issuer>>,
    tls: Option<Arc<tokio_rustls::rustls::ClientConfig>>,
    min_refresh: Duration,
    clock_skew: Duration,
    clock: Arc<dyn Clock>,
    fetches: IntCounterVec,
}

#[derive(Deserialize)]
struct Discovery {
    jwks_uri: String,
}

#[derive(Deserialize)]
struct Peek {
    iss: Option<String>,
}

#[derive(Deserialize)]
struct Claims {
    sub: String,
    exp: u64,
    #[serde(default)]
    nbf: Option<u64>,
}

/// A token's `iss`, read without checking anything: which issuer's keys to try.
fn peek_issuer(token: &str) -> Option<String> {
    use base64::Engine as _;
    let payload = token.split('.').nth(1)?;
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(payload)
        .ok()?;
    serde_json::from_slice::<Peek>(&bytes).ok()?.iss
}

/// The algorithm a JWK verifies: its own `alg`, else its key type's usual one.
fn algorithm_of(jwk: &jsonwebtoken::jwk::Jwk) -> Option<Algorithm> {
    use jsonwebtoken::jwk::{AlgorithmParameters, EllipticCurve, KeyAlgorithm};
    let declared = jwk.common.key_algorithm.map(|a| match a {
        KeyAlgorithm::RS256 => Some(Algorithm::RS256),
        KeyAlgorithm::RS384 => Some(Algorithm::RS384),
        KeyAlgorithm::RS512 => Some(Algorithm::RS512),
        KeyAlgorithm::PS256 => Some(Algorithm::PS256),
        KeyAlgorithm::ES256 => Some(Algorithm::ES256),
        KeyAlgorithm::ES384 => Some(Algorithm::ES384),
        KeyAlgorithm::EdDSA => Some(Algorithm::EdDSA),
        // HMAC and anything else: never from a public document.
        _ => None,
    });
    match declared {
        Some(algorithm) => algorithm,
        None => match &jwk.algorithm {
            AlgorithmParameters::RSA(_) => Some(Algorithm::RS256),
            AlgorithmParameters::EllipticCurve(ec) => match ec.curve {
                EllipticCurve::P256 => Some(Algorithm::ES256),
                EllipticCurve::P384 => Some(Algorithm::ES384),
                _ => None,
            },
            AlgorithmParameters::OctetKeyPair(_) => Some(Algorithm::EdDSA),
            AlgorithmParameters::OctetKey(_) => None,
        },
    }
}

impl Issuers {
    pub fn new(
        settings: &IssuerSettings,
        clock: Arc<dyn Clock>,
        fetches: IntCounterVec,
    ) -> anyhow::Result<Self> {
        if settings.issuers.len() > MAX_ISSUERS {
            anyhow::bail!("at most {MAX_ISSUERS} external JWT issuers");
        }
        let https = settings
            .issuers
            .iter()
            .any(|(url, _)| url.starts_with("https://"));
        let tls = if https {
            Some(Arc::new(tls_config(settings.ca.as_ref())?))
        } else {
            None
        };
        let issuers = (settings.issuers.iter())
            .map(|(url, audience)| {
                let issuer = Issuer {
                    url: url.clone(),
                    audience: audience.clone(),
                    keys: RwLock::new(Arc::new(Vec::new())),
                    fetched: tokio::sync::Mutex::new(None),
                };
                (url.clone(), Arc::new(issuer))
            })
            .collect();
        Ok(Self {
            issuers,
            tls,
            min_refresh: settings.min_refresh,
            clock_skew: settings.clock_skew,
            clock,
            fetches,
        })
    }

    /// Whether any issuer is configured.
    pub fn is_empty(&self) -> bool {
        self.issuers.is_empty()
    }

    /// The issuer and subject of a valid token of a configured issuer, or why not.
    pub async fn verify(&self, token: &str) -> Result<(String, String), Refusal> {
        if token.len() > MAX_TOKEN_BYTES {
            return Err(Refusal::Malformed);
        }
        let iss = peek_issuer(token).ok_or(Refusal::Malformed)?;
        let issuer = self.issuers.get(&iss).ok_or(Refusal::UnknownIssuer)?;
        let header = jsonwebtoken::decode_header(token).map_err(|_| Refusal::Malformed)?;
        let claims = {
            let keys = self.keys_for(issuer, header.kid.as_deref()).await?;
            let key = (keys.iter())
                .find(|k| header.kid.is_none() || k.kid == header.kid)
                .ok_or(Refusal::UnknownKey)?;
            // The key fixes the algorithm, never the token.
            if header.alg != key.algorithm {
                return Err(Refusal::BadSignature);
            }
            let mut validation = Validation::new(key.algorithm);
            validation.set_issuer(&[issuer.url.as_str()]);
            validation.set_audience(&[issuer.audience.as_str()]);
            // Times are checked below, by the accounts' clock.
            validation.validate_exp = false;
            validation.validate_nbf = false;
            validation.set_required_spec_claims(&["iss", "aud", "sub", "exp"]);
            jsonwebtoken::decode::<Claims>(token, &key.key, &validation)
                .map_err(|e| {
                    use jsonwebtoken::errors::ErrorKind;
                    match e.kind() {
                        ErrorKind::InvalidAudience => Refusal::WrongAudience,
                        ErrorKind::InvalidIssuer => Refusal::UnknownIssuer,
                        ErrorKind::InvalidSignature => Refusal::BadSignature,
                        _ => Refusal::Malformed,
                    }
                })?
                .claims
        };
        let now = self.clock.unix_secs();
        let skew = self.clock_skew.as_secs();
        if claims.exp.saturating_add(skew) <= now {
            return Err(Refusal::Expired);
        }
        if claims.nbf.is_some_and(|nbf| nbf > now.saturating_add(skew)) {
            return Err(Refusal::Expired);
        }
        Ok((issuer.url.clone(), claims.sub))
    }

    /// The keys of `issuer`, fetched first when none is held or `kid` is not among
    /// them (at most once per `min_refresh`).
    async fn keys_for(&self, issuer: &Issuer, kid: Option<&str>) -> Result<Arc<Vec<Key>>, Refusal> {
        let held = issuer
            .keys
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        let known = |keys: &[Key]| {
            !keys.is_empty()
                && keys
                    .iter()
                    .any(|k| kid.is_none() || k.kid.as_deref() == kid)
        };
        if known(&held) {
            return Ok(held);
        }
        let mut fetched = issuer.fetched.lock().await;
        // Another request may have fetched while this one waited.
        let held = issuer
            .keys
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        if known(&held) {
            return Ok(held);
        }
        // Real time: how often to ask the issuer, not a rule of any token.
        if fetched.is_some_and(|at| at.elapsed() < self.min_refresh) {
            return if held.is_empty() {
                Err(Refusal::Unreachable)
            } else {
                Err(Refusal::UnknownKey)
            };
        }
        *fetched = Some(Instant::now());
        match self.fetch_keys(&issuer.url).await {
            Ok(keys) => {
                self.fetches.with_label_values(&["ok"]).inc();
                let keys = Arc::new(keys);
                *issuer.keys.write().unwrap_or_else(|e| e.into_inner()) = keys.clone();
                if known(&keys) {
                    Ok(keys)
                } else {
                    Err(Refusal::UnknownKey)
                }
            }
            Err(why) => {
                self.fetches.with_label_values(&["error"]).inc();
                tracing::warn!(
                    issuer = issuer.url,
                    error = why,
                    "fetching an external issuer's keys failed"
                );
                if held.is_empty() {
                    Err(Refusal::Unreachable)
                } else {
                    Err(Refusal::UnknownKey)
                }
            }
        }
    }

    async fn fetch_keys(&self, issuer: &str) -> Result<Vec<Key>, String> {
        let discovery_url = format!("{issuer}/.well-known/openid-configuration");
        let discovery: Discovery = serde_json::from_slice(&self.get(&discovery_url).await?)
            .map_err(|e| format!("the discovery document is not JSON with a jwks_uri: {e}"))?;
        let jwks: JwkSet = serde_json::from_slice(&self.get(&discovery.jwks_uri).await?)
            .map_err(|e| format!("the JWKS is not a JWK set: {e}"))?;
        let keys: Vec<Key> = (jwks.keys.iter())
            .filter_map(|jwk| {
                let algorithm = algorithm_of(jwk)?;
                let key = DecodingKey::from_jwk(jwk).ok()?;
                Some(Key {
                    kid: jwk.common.key_id.clone(),
                    algorithm,
                    key,
                })
            })
            .take(MAX_KEYS)
            .collect();
        if keys.is_empty() {
            return Err("the JWKS holds no key authd can verify with".into());
        }
        Ok(keys)
    }

    /// `GET url`: its body, at most [`MAX_DOCUMENT_BYTES`], within [`FETCH_TIMEOUT`].
    async fn get(&self, url: &str) -> Result<Bytes, String> {
        tokio::time::timeout(FETCH_TIMEOUT, self.get_unbounded(url))
            .await
            .map_err(|_| format!("{url}: no answer within {FETCH_TIMEOUT:?}"))?
    }

    async fn get_unbounded(&self, url: &str) -> Result<Bytes, String> {
        let uri: http::Uri = url.parse().map_err(|e| format!("{url}: {e}"))?;
        let https = match uri.scheme_str() {
            Some("https") => true,
            Some("http") => false,
            _ => return Err(format!("{url}: not an http(s) URL")),
        };
        let host = uri
            .host()
            .ok_or_else(|| format!("{url}: no host"))?
            .to_owned();
        let port = uri.port_u16().unwrap_or(if https { 443 } else { 80 });
        let bare = host
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_owned();
        let tcp = tokio::net::TcpStream::connect((bare.as_str(), port))
            .await
            .map_err(|e| format!("{url}: cannot connect: {e}"))?;
        let path = uri.path_and_query().map_or("/", |p| p.as_str()).to_owned();
        let authority = uri
            .authority()
            .map(|a| a.as_str().to_owned())
            .unwrap_or(host);
        if https {
            let config = self.tls.clone().ok_or("no TLS configuration")?;
            let name = tokio_rustls::rustls::pki_types::ServerName::try_from(bare)
                .map_err(|e| format!("{url}: {e}"))?;
            let stream = tokio_rustls::TlsConnector::from(config)
                .connect(name, tcp)
                .await
                .map_err(|e| format!("{url}: TLS: {e}"))?;
            request(stream, &authority, &path).await
        } else {
            request(tcp, &authority, &path).await
        }
        .map_err(|e| format!("{url}: {e}"))
    }
}

/// One HTTP/1.1 GET on `stream`.
async fn request<S>(stream: S, authority: &str, path: &str) -> Result<Bytes, String>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let io = hyper_util::rt::TokioIo::new(stream);
    let (mut sender, connection) = hyper::client::conn::http1::handshake(io)
        .await
        .map_err(|e| e.to_string())?;
    let driver = tokio::spawn(connection);
    let request = http::Request::get(path)
        .header(http::header::HOST, authority)
        .header(http::header::ACCEPT, "application/json")
        .body(Empty::<Bytes>::new())
        .map_err(|e| e.to_string())?;
    let response = sender
        .send_request(request)
        .await
        .map_err(|e| e.to_string())?;
    if !response.status().is_success() {
        driver.abort();
        return Err(format!("answered {}", response.status()));
    }
    let body = Limited::new(response.into_body(), MAX_DOCUMENT_BYTES)
        .collect()
        .await
        .map_err(|e| e.to_string())?
        .to_bytes();
    driver.abort();
    Ok(body)
}

fn tls_config(
    ca: Option<&tokio_rustls::rustls::RootCertStore>,
) -> anyhow::Result<tokio_rustls::rustls::ClientConfig> {
    use tokio_rustls::rustls::{ClientConfig, RootCertStore};
    let roots = ca.cloned().unwrap_or_else(|| RootCertStore {
        roots: webpki_roots::TLS_SERVER_ROOTS.to_vec(),
    });
    let provider = Arc::new(tokio_rustls::rustls::crypto::ring::default_provider());
    Ok(ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots)
        .with_no_client_auth())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_issuer_is_peeked_without_trusting_it() {
        use base64::Engine as _;
        let payload = base64::engine::general_purpose::URL_SAFE_NO_PAD
            .encode(br#"{"iss":"https://k8s.example","sub":"x"}"#);
        assert_eq!(
            peek_issuer(&format!("e30.{payload}.sig")).as_deref(),
            Some("https://k8s.example")
        );
        assert_eq!(peek_issuer("nonsense"), None);
        assert_eq!(peek_issuer("a.!!.c"), None);
    }
}
