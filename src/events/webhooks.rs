//! Webhooks (docs/events.md): each account event delivered to the endpoints that
//! want its type, as an HTTP POST signed the Standard Webhooks way.
//!
//! Each endpoint has a task of its own that reads the outbox in position order (a
//! [`Reader`], as WatchEvents streams do) and delivers one event at a time, in
//! order: an event is retried (backoff doubling from 1s to `retry_max`, with
//! jitter) until the endpoint answers 2xx, and the next is not sent before. Where
//! an endpoint is, how far it got, is kept in the database
//! (`webhook_deliveries`), written after each delivery, so a restart resumes
//! there. One endpoint failing or slow holds only its own task.
//!
//! Delivery is at least once: a crash between the endpoint's answer and the
//! record of it sends that event again, with the same `webhook-id`
//! (`evt_<position>`), which receivers use to drop the repeat.
//!
//! Replicas sharing a database take a lease per endpoint (in the same row): one
//! replica delivers to an endpoint at a time, the others wait for the lease to
//! lapse ([`LEASE`]) and take over where it got.
//!
//! An https endpoint's certificate must chain to the Mozilla roots, or to the CAs of
//! `AUTHD_WEBHOOK_CA` when set, and name the URL's host (or IP address); a refused
//! handshake is a failed attempt like any other, retried.
//!
//! Headers: `webhook-id`, `webhook-timestamp` (Unix seconds of the attempt) and
//! `webhook-signature`: `v1,` and the base64 of HMAC-SHA256 under the secret of
//! `id.timestamp.body`. The secret is never logged.

use super::Reader;
use crate::{
    clock::Clock,
    metrics::EventMetrics,
    store::{Event, Store},
};
use base64::{Engine as _, engine::general_purpose::STANDARD};
use bytes::Bytes;
use hmac::{Hmac, KeyInit as _, Mac as _};
use http_body_util::{BodyExt as _, Full};
use hyper_util::rt::TokioIo;
use rand::Rng as _;
use sha2::Sha256;
use std::{fmt, str::FromStr, sync::Arc, time::Duration};
use tokio::net::TcpStream;
use tokio_rustls::{
    TlsConnector,
    rustls::{self, ClientConfig, RootCertStore, pki_types::ServerName},
};
use tokio_util::sync::CancellationToken;

/// How long an endpoint's lease lasts without renewal.
pub const LEASE: Duration = Duration::from_secs(30);
/// The first wait before a retry.
const FIRST_RETRY: Duration = Duration::from_secs(1);
/// Events read per query.
const BATCH: i64 = 64;

/// The Standard Webhooks signing secret: `whsec_` and base64 of its bytes.
#[derive(Clone)]
pub struct WebhookSecret(Arc<[u8]>);

impl FromStr for WebhookSecret {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let Some(encoded) = s.trim().strip_prefix("whsec_") else {
            return Err("expected whsec_ and base64".into());
        };
        let bytes = STANDARD
            .decode(encoded)
            .map_err(|_| "the part after whsec_ is not base64".to_owned())?;
        if !(24..=64).contains(&bytes.len()) {
            return Err("the secret must be 24 to 64 bytes".into());
        }
        Ok(Self(bytes.into()))
    }
}

impl fmt::Debug for WebhookSecret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("WebhookSecret(***)")
    }
}

impl WebhookSecret {
    /// The `webhook-signature` of a message.
    pub fn sign(&self, id: &str, timestamp: i64, body: &[u8]) -> String {
        let mut mac = <Hmac<Sha256>>::new_from_slice(&self.0).expect("HMAC takes any key");
        mac.update(id.as_bytes());
        mac.update(b".");
        mac.update(timestamp.to_string().as_bytes());
        mac.update(b".");
        mac.update(body);
        format!("v1,{}", STANDARD.encode(mac.finalize().into_bytes()))
    }
}

/// A webhook endpoint: its URL and the event types it wants (all when none).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoint {
    url: String,
    types: Vec<String>,
    tls: bool,
    host: String,
    port: u16,
    path: String,
}

impl Endpoint {
    pub fn url(&self) -> &str {
        &self.url
    }

    /// Whether the endpoint wants events of `kind`.
    pub fn wants(&self, kind: &str) -> bool {
        self.types.is_empty() || self.types.iter().any(|t| t == kind)
    }
}

impl FromStr for Endpoint {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let s = s.trim();
        let (types, url) = match s.split_once('=') {
            Some((types, url)) if !types.contains(['/', ':']) => (types, url),
            _ => ("", s),
        };
        let types: Vec<String> = (types.split('|'))
            .map(str::trim)
            .filter(|t| !t.is_empty() && *t != "*")
            .map(str::to_owned)
            .collect();
        for t in &types {
            if !crate::store::event_kind::ALL.contains(&t.as_str()) {
                return Err(format!("unknown event type {t:?}"));
            }
        }
        let uri: http::Uri = url.parse().map_err(|_| "not a URL".to_owned())?;
        let tls = match uri.scheme_str() {
            Some("https") => true,
            Some("http") => false,
            _ => return Err("the URL must start with http:// or https://".into()),
        };
        let host = (uri.host())
            .ok_or("the URL has no host")?
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_owned();
        let port = uri.port_u16().unwrap_or(if tls { 443 } else { 80 });
        let path = (uri.path_and_query())
            .map_or("/", |p| p.as_str())
            .to_owned();
        Ok(Self {
            url: url.to_owned(),
            types,
            tls,
            host,
            port,
            path,
        })
    }
}

/// The webhooks' settings.
#[derive(Debug, Clone)]
pub struct WebhookSettings {
    pub endpoints: Vec<Endpoint>,
    pub secret: WebhookSecret,
    /// The CAs an https endpoint's certificate must chain to; `None`: the Mozilla
    /// roots.
    pub ca: Option<RootCertStore>,
    /// How long one attempt may take.
    pub timeout: Duration,
    /// The longest wait between retries.
    pub retry_max: Duration,
    /// How often an idle endpoint looks for events other replicas wrote.
    pub poll: Duration,
}

/// The delivery of every endpoint.
pub struct Webhooks {
    store: Arc<Store>,
    clock: Arc<dyn Clock>,
    settings: WebhookSettings,
    metrics: EventMetrics,
    tls: TlsConnector,
    /// This process's name in the endpoints' leases.
    owner: String,
}

impl Webhooks {
    pub fn new(
        store: Arc<Store>,
        clock: Arc<dyn Clock>,
        settings: WebhookSettings,
        metrics: EventMetrics,
    ) -> Self {
        let roots = settings.ca.clone().unwrap_or_else(|| RootCertStore {
            roots: webpki_roots::TLS_SERVER_ROOTS.to_vec(),
        });
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let config = ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .expect("ring supports the default versions")
            .with_root_certificates(roots)
            .with_no_client_auth();
        Self {
            store,
            clock,
            settings,
            metrics,
            tls: TlsConnector::from(Arc::new(config)),
            owner: uuid::Uuid::now_v7().to_string(),
        }
    }

    /// Records where each endpoint configured for the first time starts: after the
    /// events committed now. Called before the server takes requests, so an
    /// endpoint misses nothing this replica is asked to change after its start.
    pub async fn prepare(&self) -> anyhow::Result<()> {
        let start = Reader::new(self.store.clone()).advance().await?;
        let now = self.clock.millis();
        for endpoint in &self.settings.endpoints {
            // A lease that lapses at once: it only creates the row when missing.
            (self.store)
                .lease_webhook(endpoint.url(), &self.owner, start, now, now)
                .await?;
        }
        Ok(())
    }

    /// Delivers to every endpoint until `stop` is cancelled; gives the leases back
    /// then.
    pub async fn run(self: Arc<Self>, stop: CancellationToken) {
        let tasks: Vec<_> = (0..self.settings.endpoints.len())
            .map(|i| {
                let (this, stop) = (self.clone(), stop.clone());
                tokio::spawn(async move { this.endpoint(i, stop).await })
            })
            .collect();
        for task in tasks {
            let _ = task.await;
        }
    }

    async fn endpoint(&self, i: usize, stop: CancellationToken) {
        let endpoint = &self.settings.endpoints[i];
        let mut writes = self.store.writes();
        let mut reader = Reader::new(self.store.clone());
        let mut connection: Option<Connection> = None;
        let mut attempts: u32 = 0;
        loop {
            if stop.is_cancelled() {
                break;
            }
            writes.borrow_and_update();
            // A delivery in flight is given up at shutdown (it is sent again after
            // the restart: at least once).
            let step = self.step(endpoint, &mut reader, &mut connection, &mut attempts, &stop);
            let Some(step) = stop.run_until_cancelled(step).await else {
                break;
            };
            let idle = matches!(step, Ok(Step::Idle));
            let wait = match step {
                Ok(Step::More) => continue,
                Ok(Step::Idle) => self.settings.poll,
                Ok(Step::Retry) => backoff(attempts, self.settings.retry_max),
                Err(e) => {
                    tracing::warn!(endpoint = %endpoint.url(), error = %e, "webhook delivery paused");
                    self.settings.poll.max(FIRST_RETRY)
                }
            };
            tokio::select! {
                _ = stop.cancelled() => break,
                _ = writes.changed(), if idle => {}
                _ = tokio::time::sleep(wait) => {}
            }
        }
        if let Err(e) = self
            .store
            .release_webhook(endpoint.url(), &self.owner)
            .await
        {
            tracing::debug!(error = %e, "giving back a webhook lease failed");
        }
    }

    /// Takes the lease, and delivers the next events until one fails or none is
    /// left.
    async fn step(
        &self,
        endpoint: &Endpoint,
        reader: &mut Reader,
        connection: &mut Option<Connection>,
        attempts: &mut u32,
        stop: &CancellationToken,
    ) -> Result<Step, anyhow::Error> {
        let lease_until = self.clock.millis() + LEASE.as_millis() as i64;
        // An endpoint's row exists from `prepare`; were it deleted meanwhile, it
        // starts again after the events committed now.
        let start = reader.advance().await?;
        let Some(mut after) = (self.store)
            .lease_webhook(
                endpoint.url(),
                &self.owner,
                start,
                self.clock.millis(),
                lease_until,
            )
            .await?
        else {
            return Ok(Step::Idle);
        };
        let batch = reader.read(after, BATCH).await?;
        if batch.is_empty() {
            return Ok(Step::Idle);
        }
        let mut skipped = 0;
        for event in batch {
            if stop.is_cancelled() {
                break;
            }
            if !endpoint.wants(&event.kind) {
                after = event.position;
                skipped += 1;
                continue;
            }
            if skipped > 0 {
                self.record(endpoint, after, 0).await?;
                self.metrics.webhook("skipped", skipped);
                skipped = 0;
            }
            match self.send(endpoint, connection, &event).await {
                Ok(()) => {
                    self.metrics.webhook("delivered", 1);
                    *attempts = 0;
                    after = event.position;
                    self.record(endpoint, after, 0).await?;
                }
                Err(e) => {
                    self.metrics.webhook("failed", 1);
                    *attempts = attempts.saturating_add(1);
                    *connection = None;
                    tracing::info!(endpoint = %endpoint.url(), position = event.position,
                        attempts = *attempts, error = %e, "webhook delivery failed; will retry");
                    self.record(endpoint, after, i64::from(*attempts)).await?;
                    return Ok(Step::Retry);
                }
            }
        }
        if skipped > 0 {
            self.record(endpoint, after, 0).await?;
            self.metrics.webhook("skipped", skipped);
        }
        Ok(Step::More)
    }

    async fn record(
        &self,
        endpoint: &Endpoint,
        position: i64,
        attempts: i64,
    ) -> anyhow::Result<()> {
        let now = self.clock.millis();
        let kept = (self.store)
            .record_webhook(
                endpoint.url(),
                &self.owner,
                position,
                attempts,
                now,
                now + LEASE.as_millis() as i64,
            )
            .await?;
        if !kept {
            anyhow::bail!("the endpoint's lease passed to another replica");
        }
        Ok(())
    }

    /// One attempt to deliver `event`: `Ok` when the endpoint answered 2xx.
    async fn send(
        &self,
        endpoint: &Endpoint,
        connection: &mut Option<Connection>,
        event: &Event,
    ) -> anyhow::Result<()> {
        let body = Bytes::from(payload(event).to_string());
        let id = format!("evt_{}", event.position);
        let timestamp = self.clock.millis() / 1000;
        let signature = self.settings.secret.sign(&id, timestamp, &body);
        let authority =
            if (endpoint.tls && endpoint.port == 443) || (!endpoint.tls && endpoint.port == 80) {
                endpoint.host.clone()
            } else if endpoint.host.contains(':') {
                format!("[{}]:{}", endpoint.host, endpoint.port)
            } else {
                format!("{}:{}", endpoint.host, endpoint.port)
            };
        let request = http::Request::post(endpoint.path.as_str())
            .header(http::header::HOST, authority)
            .header(http::header::CONTENT_TYPE, "application/json")
            .header(http::header::USER_AGENT, "authd-webhooks")
            .header("webhook-id", id)
            .header("webhook-timestamp", timestamp.to_string())
            .header("webhook-signature", signature)
            .body(Full::new(body))?;
        let attempt = async {
            let mut sender = match connection.take() {
                Some(c) if !c.sender.is_closed() => c,
                _ => self.connect(endpoint).await?,
            };
            sender.sender.ready().await?;
            let answer = sender.sender.send_request(request).await?;
            let status = answer.status();
            // Read the answer to its end, so the connection can carry the next.
            let _ = answer.into_body().collect().await;
            *connection = Some(sender);
            if status.is_success() {
                Ok(())
            } else {
                Err(anyhow::anyhow!("the endpoint answered {status}"))
            }
        };
        tokio::time::timeout(self.settings.timeout, attempt)
            .await
            .map_err(|_| anyhow::anyhow!("no answer within AUTHD_WEBHOOK_TIMEOUT"))?
    }

    async fn connect(&self, endpoint: &Endpoint) -> anyhow::Result<Connection> {
        let tcp = TcpStream::connect((endpoint.host.as_str(), endpoint.port)).await?;
        tcp.set_nodelay(true)?;
        let sender = if endpoint.tls {
            let name = ServerName::try_from(endpoint.host.clone())?;
            let tls = self.tls.connect(name, tcp).await?;
            handshake(TokioIo::new(tls)).await?
        } else {
            handshake(TokioIo::new(tcp)).await?
        };
        Ok(Connection { sender })
    }
}

/// An HTTP/1.1 connection to an endpoint, kept between deliveries.
struct Connection {
    sender: hyper::client::conn::http1::SendRequest<Full<Bytes>>,
}

async fn handshake<T>(io: T) -> anyhow::Result<hyper::client::conn::http1::SendRequest<Full<Bytes>>>
where
    T: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
{
    let (sender, connection) = hyper::client::conn::http1::handshake(io).await?;
    tokio::spawn(async move {
        let _ = connection.await;
    });
    Ok(sender)
}

/// What a step of an endpoint's delivery came to.
enum Step {
    /// Delivered a batch; there may be more.
    More,
    /// Nothing to deliver (or another replica holds the lease).
    Idle,
    /// An attempt failed: wait, then retry the same event.
    Retry,
}

/// The wait before retry number `attempts` (from 1): doubling from 1s, at most
/// `max`, a random half of it taken off (jitter, so endpoints that failed together
/// are not retried together).
fn backoff(attempts: u32, max: Duration) -> Duration {
    let full = FIRST_RETRY
        .saturating_mul(1u32 << attempts.saturating_sub(1).min(20))
        .min(max);
    let jitter = rand::rng().random_range(0.5..=1.0);
    full.mul_f64(jitter)
}

/// The body of an event's delivery: the Standard Webhooks form (`type`,
/// `timestamp`, `data`) with the event's position and user.
pub fn payload(event: &Event) -> serde_json::Value {
    let data: serde_json::Value =
        serde_json::from_str(&event.data).unwrap_or(serde_json::Value::Null);
    let timestamp = humantime::format_rfc3339_millis(
        std::time::UNIX_EPOCH + Duration::from_millis(u64::try_from(event.at).unwrap_or(0)),
    );
    serde_json::json!({
        "type": event.kind,
        "timestamp": timestamp.to_string(),
        "position": event.position,
        "user_id": event.user_id,
        "data": data,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_endpoint_names_its_types_or_takes_all() {
        let all: Endpoint = "http://127.0.0.1:8080/hook".parse().unwrap();
        assert!(all.wants("user.registered"));
        assert_eq!(
            (all.host.as_str(), all.port, all.path.as_str()),
            ("127.0.0.1", 8080, "/hook")
        );
        let some: Endpoint = "user.registered|user.deleted=https://crm.example/h?x=1"
            .parse()
            .unwrap();
        assert!(some.wants("user.deleted") && !some.wants("user.enabled"));
        assert_eq!((some.port, some.path.as_str()), (443, "/h?x=1"));
        assert!("user.nope=http://a/".parse::<Endpoint>().is_err());
        assert!("ftp://a/".parse::<Endpoint>().is_err());
    }

    #[test]
    fn the_secret_is_checked_and_never_shown() {
        let secret: WebhookSecret = format!("whsec_{}", STANDARD.encode([7u8; 32]))
            .parse()
            .unwrap();
        assert_eq!(format!("{secret:?}"), "WebhookSecret(***)");
        assert!("whsec_AAAA".parse::<WebhookSecret>().is_err());
        assert!("nope".parse::<WebhookSecret>().is_err());
    }

    // The example of the Standard Webhooks specification's test vectors.
    #[test]
    fn signatures_follow_standard_webhooks() {
        let secret: WebhookSecret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw".parse().unwrap();
        let body = br#"{"test": 2432232314}"#;
        assert_eq!(
            secret.sign("msg_p5jXN8AQM9LWM0D4loKWxJek", 1614265330, body),
            "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="
        );
    }

    #[test]
    fn retries_back_off_to_the_most_with_jitter() {
        let max = Duration::from_secs(60);
        for attempts in 1..30 {
            let wait = backoff(attempts, max);
            let full = FIRST_RETRY
                .saturating_mul(1 << (attempts - 1).min(20))
                .min(max);
            assert!(wait <= full && wait >= full / 2, "{attempts}: {wait:?}");
        }
    }
}
