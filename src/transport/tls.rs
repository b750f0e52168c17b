//! TLS on the gRPC port: the rustls configuration in force, read from PEM files and
//! read again whenever they change.
//!
//! - `AUTHD_TLS_CERT` (the certificate, then its chain) and `AUTHD_TLS_KEY`, and with
//!   `AUTHD_TLS_CLIENT_CA` mutual TLS: a client must present a certificate that chains
//!   to one of those CAs, or its handshake fails.
//! - TLS 1.2 and 1.3 (rustls on ring, no OpenSSL), ALPN `h2`, then `http/1.1` (the gRPC and admin ports speak both).
//! - Every `AUTHD_TLS_RELOAD` the files' modification times (and sizes) are compared
//!   with those last read; when one changed, all are read again and a new
//!   configuration is built. New handshakes use it; open connections keep theirs.
//!   A file that does not parse, or a key that does not match its certificate, is
//!   refused with one error line naming the option (never what the file holds) and
//!   the configuration in force stays. At start the same error stops the start.
//! - A client's identity, for the layers: its certificate's first URI SAN (a SPIFFE
//!   id), else its first DNS SAN, else its subject CN ([`identity`]).

use crate::{metrics::TlsMetrics, rpc::ClientIdentity};
use arc_swap::ArcSwap;
use std::{
    fmt,
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
    time::{Duration, SystemTime},
};
use tokio_rustls::{
    TlsAcceptor,
    rustls::{
        self, RootCertStore, ServerConfig,
        crypto::CryptoProvider,
        pki_types::{CertificateDer, PrivateKeyDer, pem::PemObject as _},
        server::WebPkiClientVerifier,
        sign::{CertifiedKey, SingleCertAndKey},
    },
};
use tokio_util::sync::CancellationToken;

/// PEM files larger than this are refused: certificates, keys and CA bundles are a
/// few kilobytes (a large public CA bundle is a few hundred).
const MAX_PEM_BYTES: u64 = 4 * 1024 * 1024;

/// Longest client identity kept; a longer one (or one with control characters) is
/// no identity at all: the connection is served, but without one.
pub(crate) const MAX_IDENTITY_BYTES: usize = 512;

/// The files of the TLS configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct TlsFiles {
    /// `AUTHD_TLS_CERT`: the server's certificate, then its intermediates.
    pub cert: PathBuf,
    /// `AUTHD_TLS_KEY`: its private key (PKCS#8, PKCS#1 or SEC1).
    pub key: PathBuf,
    /// `AUTHD_TLS_CLIENT_CA`: the CAs client certificates must chain to (mutual TLS).
    pub client_ca: Option<PathBuf>,
}

/// Which file a problem is in: the option that names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Which {
    Cert,
    Key,
    ClientCa,
}

impl Which {
    fn option(self) -> &'static str {
        match self {
            Which::Cert => "--tls-cert (AUTHD_TLS_CERT)",
            Which::Key => "--tls-key (AUTHD_TLS_KEY)",
            Which::ClientCa => "--tls-client-ca (AUTHD_TLS_CLIENT_CA)",
        }
    }
}

/// Why the files make no configuration: the option, the file, and what is wrong in
/// words of our own (never a parser's text, never a byte of the file).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct LoadError {
    which: Which,
    path: PathBuf,
    why: &'static str,
}

impl fmt::Display for LoadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} {}: {}",
            self.which.option(),
            self.path.display(),
            self.why
        )
    }
}

impl std::error::Error for LoadError {}

/// A configuration built from the files, and what the metrics show of it.
struct Loaded {
    config: Arc<ServerConfig>,
    /// `notAfter` of the server's certificate, in Unix seconds.
    cert_expiry: i64,
    /// The earliest `notAfter` of the client CAs.
    client_ca_expiry: Option<i64>,
}

/// What a file looked like when it was last read: a change of either is a change.
type Stamp = Option<(SystemTime, u64)>;

/// The TLS configuration of the gRPC port, swapped whole when the files change.
pub(crate) struct ServerTls {
    current: ArcSwap<ServerConfig>,
    files: TlsFiles,
    /// What the files looked like just before they were last read.
    last: Mutex<Vec<Stamp>>,
    metrics: TlsMetrics,
}

impl ServerTls {
    /// Reads the files; an error (one line naming the option) stops the start.
    pub(crate) fn load(files: TlsFiles, metrics: TlsMetrics) -> Result<Arc<Self>, LoadError> {
        let stamps = stamps(&files);
        let loaded = load(&files)?;
        let tls = Self {
            current: ArcSwap::new(loaded.config.clone()),
            files,
            last: Mutex::new(stamps),
            metrics,
        };
        tls.show(&loaded);
        Ok(Arc::new(tls))
    }

    /// An acceptor with the configuration in force now.
    pub(crate) fn acceptor(&self) -> TlsAcceptor {
        TlsAcceptor::from(self.current.load_full())
    }

    /// Counts a handshake that failed (no certificate, an untrusted one, a bad
    /// record), which closes its connection.
    pub(crate) fn handshake_failed(&self) {
        self.metrics.handshake_errors.inc();
    }

    fn show(&self, loaded: &Loaded) {
        self.metrics.expiry("server").set(loaded.cert_expiry);
        if let Some(expiry) = loaded.client_ca_expiry {
            self.metrics.expiry("client_ca").set(expiry);
        }
    }

    /// Reads the files again if any changed since they were last read; what they
    /// look like now is remembered either way, so a bad file is reported once, not at
    /// every poll.
    fn reload_if_changed(&self) {
        let now = stamps(&self.files);
        {
            let mut last = self.last.lock().unwrap_or_else(|p| p.into_inner());
            if now == *last {
                return;
            }
            *last = now;
        }
        match load(&self.files) {
            Ok(loaded) => {
                self.current.store(loaded.config.clone());
                self.show(&loaded);
                self.metrics.reloads.with_label_values(&["ok"]).inc();
                tracing::info!(
                    cert = %self.files.cert.display(),
                    "TLS files changed: new connections use the new certificate"
                );
            }
            Err(e) => {
                self.metrics.reloads.with_label_values(&["error"]).inc();
                tracing::error!("{e}; keeping the TLS configuration in force");
            }
        }
    }

    /// Polls the files every `every` until `shutdown` is cancelled.
    pub(crate) async fn reload_every(
        self: Arc<Self>,
        every: Duration,
        shutdown: CancellationToken,
    ) {
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tick.tick().await;
        loop {
            tokio::select! {
                () = shutdown.cancelled() => return,
                _ = tick.tick() => {}
            }
            // Small files, read off the async workers; one read at a time.
            let t = self.clone();
            let _ = tokio::task::spawn_blocking(move || t.reload_if_changed()).await;
        }
    }
}

fn stamps(files: &TlsFiles) -> Vec<Stamp> {
    let mut paths = vec![&files.cert, &files.key];
    paths.extend(&files.client_ca);
    paths.into_iter().map(|p| stamp(p)).collect()
}

fn stamp(path: &Path) -> Stamp {
    let meta = std::fs::metadata(path).ok()?;
    Some((meta.modified().ok()?, meta.len()))
}

/// The crypto of every TLS connection: ring.
fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn read(which: Which, path: &Path) -> Result<Vec<u8>, LoadError> {
    let error = |why| LoadError {
        which,
        path: path.to_owned(),
        why,
    };
    let meta = std::fs::metadata(path).map_err(|_| error("cannot read the file"))?;
    if meta.len() > MAX_PEM_BYTES {
        return Err(error("the file is larger than 4 MiB"));
    }
    std::fs::read(path).map_err(|_| error("cannot read the file"))
}

fn certificates(which: Which, path: &Path) -> Result<Vec<CertificateDer<'static>>, LoadError> {
    let error = |why| LoadError {
        which,
        path: path.to_owned(),
        why,
    };
    let pem = read(which, path)?;
    let certs = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|_| error("not a valid PEM file"))?;
    if certs.is_empty() {
        return Err(error("no PEM certificate in the file"));
    }
    Ok(certs)
}

/// `notAfter` of a certificate, in Unix seconds.
fn not_after(der: &[u8]) -> Option<i64> {
    use x509_parser::prelude::FromDer as _;
    let (_, cert) = x509_parser::certificate::X509Certificate::from_der(der).ok()?;
    Some(cert.validity().not_after.timestamp())
}

fn load(files: &TlsFiles) -> Result<Loaded, LoadError> {
    let provider = provider();
    let chain = certificates(Which::Cert, &files.cert)?;
    let cert_expiry = not_after(&chain[0]).ok_or_else(|| LoadError {
        which: Which::Cert,
        path: files.cert.clone(),
        why: "the first certificate is not a valid X.509 certificate",
    })?;
    let key_error = |why| LoadError {
        which: Which::Key,
        path: files.key.clone(),
        why,
    };
    let key_pem = read(Which::Key, &files.key)?;
    let key = PrivateKeyDer::from_pem_slice(&key_pem).map_err(|e| match e {
        rustls::pki_types::pem::Error::NoItemsFound => key_error("no PEM private key in the file"),
        _ => key_error("not a valid PEM file"),
    })?;
    drop(key_pem);
    let certified = CertifiedKey::from_der(chain, key, &provider).map_err(|e| match e {
        rustls::Error::InconsistentKeys(_) => {
            key_error("the key does not match the certificate of --tls-cert")
        }
        _ => key_error("not a private key this server can use (RSA, ECDSA P-256/P-384, Ed25519)"),
    })?;

    let builder = ServerConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
        .expect("ring supports TLS 1.2 and 1.3");
    let (builder, client_ca_expiry) = match &files.client_ca {
        None => (builder.with_no_client_auth(), None),
        Some(path) => {
            let ca_error = |why| LoadError {
                which: Which::ClientCa,
                path: path.clone(),
                why,
            };
            let cas = certificates(Which::ClientCa, path)?;
            let mut expiry = i64::MAX;
            let mut roots = RootCertStore::empty();
            for ca in cas {
                expiry = expiry
                    .min(not_after(&ca).ok_or_else(|| ca_error("not a valid X.509 certificate"))?);
                roots
                    .add(ca)
                    .map_err(|_| ca_error("a certificate cannot serve as a trust anchor"))?;
            }
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                .build()
                .map_err(|_| ca_error("the CAs make no client certificate verifier"))?;
            (builder.with_client_cert_verifier(verifier), Some(expiry))
        }
    };
    let mut config = builder.with_cert_resolver(Arc::new(SingleCertAndKey::from(certified)));
    // h2 first: gRPC clients ask for it; browsers and curl may ask for HTTP/1.1.
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(Loaded {
        config: Arc::new(config),
        cert_expiry,
        client_ca_expiry,
    })
}

/// The identity of a client certificate: its first URI SAN (e.g. a SPIFFE id), else
/// its first DNS SAN, else its subject CN. `None` when it has none of these, or when
/// the one it has is longer than [`MAX_IDENTITY_BYTES`] or holds control characters
/// (it goes into logs and rate-limit keys).
pub(crate) fn identity(der: &[u8]) -> Option<ClientIdentity> {
    use x509_parser::{extensions::GeneralName, prelude::FromDer as _};
    let (_, cert) = x509_parser::certificate::X509Certificate::from_der(der).ok()?;
    let names = cert
        .subject_alternative_name()
        .ok()
        .flatten()
        .map(|san| san.value.general_names.clone())
        .unwrap_or_default();
    let uri = names.iter().find_map(|n| match n {
        GeneralName::URI(uri) => Some(*uri),
        _ => None,
    });
    let dns = names.iter().find_map(|n| match n {
        GeneralName::DNSName(dns) => Some(*dns),
        _ => None,
    });
    let cn = || {
        cert.subject()
            .iter_common_name()
            .next()
            .and_then(|cn| cn.as_str().ok())
    };
    let name = uri.or(dns).or_else(cn)?;
    let sane =
        !name.is_empty() && name.len() <= MAX_IDENTITY_BYTES && !name.chars().any(char::is_control);
    sane.then(|| ClientIdentity(Arc::from(name)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cert_with(params: rcgen::CertificateParams) -> Vec<u8> {
        let key = rcgen::KeyPair::generate().unwrap();
        params.self_signed(&key).unwrap().der().to_vec()
    }

    fn named(sans: &[rcgen::SanType], cn: Option<&str>) -> Vec<u8> {
        let mut params = rcgen::CertificateParams::default();
        params.subject_alt_names = sans.to_vec();
        params.distinguished_name = rcgen::DistinguishedName::new();
        if let Some(cn) = cn {
            params
                .distinguished_name
                .push(rcgen::DnType::CommonName, cn);
        }
        cert_with(params)
    }

    fn id(der: &[u8]) -> Option<String> {
        identity(der).map(|i| i.as_str().to_owned())
    }

    #[test]
    fn identity_is_the_first_uri_then_dns_then_cn() {
        use rcgen::SanType;
        let spiffe = "spiffe://corp/ns/web/sa/signup";
        let both = named(
            &[
                SanType::DnsName("web.corp".try_into().unwrap()),
                SanType::URI(spiffe.try_into().unwrap()),
                SanType::URI("spiffe://corp/other".try_into().unwrap()),
            ],
            Some("cn-web"),
        );
        assert_eq!(id(&both).as_deref(), Some(spiffe));
        let dns = named(
            &[
                SanType::IpAddress("127.0.0.1".parse().unwrap()),
                SanType::DnsName("web.corp".try_into().unwrap()),
            ],
            Some("cn-web"),
        );
        assert_eq!(id(&dns).as_deref(), Some("web.corp"));
        assert_eq!(id(&named(&[], Some("cn-web"))).as_deref(), Some("cn-web"));
        assert_eq!(id(&named(&[], None)), None);
        assert_eq!(id(&named(&[], Some("evil\nline"))), None);
        let long = "x".repeat(MAX_IDENTITY_BYTES + 1);
        assert_eq!(id(&named(&[], Some(&long))), None);
        assert_eq!(id(b"not a certificate"), None);
    }

    fn write_pair(dir: &Path) -> TlsFiles {
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = rcgen::CertificateParams::new(vec!["localhost".into()])
            .unwrap()
            .self_signed(&key)
            .unwrap();
        let files = TlsFiles {
            cert: dir.join("cert.pem"),
            key: dir.join("key.pem"),
            client_ca: None,
        };
        std::fs::write(&files.cert, cert.pem()).unwrap();
        std::fs::write(&files.key, key.serialize_pem()).unwrap();
        files
    }

    #[test]
    fn bad_files_are_refused_naming_the_option_and_not_the_content() {
        let dir = tempfile::tempdir().unwrap();
        let files = write_pair(dir.path());
        assert!(load(&files).is_ok());

        let other = tempfile::tempdir().unwrap();
        let other_files = write_pair(other.path());
        let key_pem = std::fs::read_to_string(&other_files.key).unwrap();
        let mismatched = TlsFiles {
            key: other_files.key.clone(),
            ..files.clone()
        };
        let err = load(&mismatched).err().unwrap().to_string();
        assert!(err.starts_with("--tls-key (AUTHD_TLS_KEY) "), "{err}");
        assert!(err.contains("does not match the certificate"), "{err}");

        // A key in the certificate's place, a certificate in the key's.
        let swapped = TlsFiles {
            cert: files.key.clone(),
            key: files.cert.clone(),
            client_ca: None,
        };
        let err = load(&swapped).err().unwrap().to_string();
        assert!(err.starts_with("--tls-cert (AUTHD_TLS_CERT) "), "{err}");
        assert!(err.ends_with("no PEM certificate in the file"), "{err}");
        let body: String = key_pem.lines().nth(1).unwrap().to_owned();
        assert!(!err.contains(&body));

        let garbage = dir.path().join("garbage.pem");
        std::fs::write(
            &garbage,
            "-----BEGIN CERTIFICATE-----\nnot base64 %%%\n-----END CERTIFICATE-----\n",
        )
        .unwrap();
        let err = load(&TlsFiles {
            cert: garbage,
            ..files.clone()
        })
        .err()
        .unwrap()
        .to_string();
        assert!(err.starts_with("--tls-cert"), "{err}");

        let corrupt = dir.path().join("corrupt.pem");
        std::fs::write(
            &corrupt,
            "-----BEGIN CERTIFICATE-----\n%%%%\n-----END CERTIFICATE-----\n",
        )
        .unwrap();
        for (files, option) in [
            (
                TlsFiles {
                    cert: corrupt.clone(),
                    ..files.clone()
                },
                "--tls-cert",
            ),
            (
                TlsFiles {
                    client_ca: Some(corrupt.clone()),
                    ..files.clone()
                },
                "--tls-client-ca",
            ),
            (
                TlsFiles {
                    key: dir.path().join("missing"),
                    ..files.clone()
                },
                "--tls-key",
            ),
        ] {
            let err = load(&files).err().unwrap().to_string();
            assert!(err.starts_with(option), "{err}");
        }
    }
}
