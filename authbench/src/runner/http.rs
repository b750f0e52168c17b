//! HTTP/1.1 (`--protocol http`, `json`, `grpc-web`): the connections that load the
//! report's service or authd's HTTP forms, and the wait until the report's service's
//! `GET /health` answers.
//!
//! HTTP/1.1 carries one request at a time on a connection, so a closed loop of N
//! requests in flight holds N keep-alive connections: each worker owns a
//! [`Connection`] and opens it again when the server has closed it, or when a
//! request on it failed or was given up on (its answer may still be on the way, so
//! the socket is closed, as a client with a timeout does). Thousands of connections
//! need as many open files: [`open_connections`] raises the soft limit first.
//!
//! It sends and reads; what an answer's status means is `status`'s, and recording
//! it is `request`'s.

use super::{plan::Plan, setup::PASSWORD};
use anyhow::{Context as _, anyhow, bail};
use bytes::Bytes;
use http::{HeaderName, HeaderValue, Method, Request, StatusCode, header};
use http_body_util::{BodyExt as _, Full};
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
use serde::Serialize;
use std::{
    net::{IpAddr, SocketAddr},
    sync::Arc,
    time::{Duration, Instant},
};
use tokio::{
    net::TcpSocket,
    task::{AbortHandle, JoinSet},
};

/// Connections opened at once before a run: enough to open thousands in a second or
/// two, few enough not to overflow the accept backlog of a server that accepts slowly.
const OPENING_AT_ONCE: usize = 128;

/// Where every connection goes: resolved once.
pub(super) struct Target {
    /// `http://host:port`, for messages.
    url: String,
    /// The `Host` header: the target's `host:port`.
    host: String,
    addr: SocketAddr,
    bind: Option<IpAddr>,
    connect_timeout: Duration,
}

impl Target {
    /// The plan's target.
    pub(super) async fn resolve(plan: &Plan) -> anyhow::Result<Arc<Self>> {
        Self::resolve_url(plan, &plan.target).await
    }

    /// `url` (`http://host:port`), connected to as the plan says.
    pub(super) async fn resolve_url(plan: &Plan, url: &str) -> anyhow::Result<Arc<Self>> {
        let uri: http::Uri = url
            .parse()
            .map_err(|e| anyhow!("{url:?} is not a valid target URL: {e}"))?;
        let authority = uri
            .authority()
            .ok_or_else(|| anyhow!("{url:?} has no host"))?;
        let port = authority.port_u16().unwrap_or(80);
        let addr = tokio::net::lookup_host(format!("{}:{port}", authority.host()))
            .await
            .with_context(|| format!("cannot resolve {url}"))?
            .next()
            .ok_or_else(|| anyhow!("cannot resolve {url}: no address"))?;
        Ok(Arc::new(Self {
            url: url.to_owned(),
            host: authority.as_str().to_string(),
            addr,
            bind: plan.bind,
            connect_timeout: plan.connect_timeout,
        }))
    }

    /// TCP (from `bind`, without Nagle's delay) and an HTTP/1.1 client on it, whose
    /// connection is driven by a task of its own.
    async fn open(&self) -> anyhow::Result<Open> {
        let socket = if self.addr.is_ipv4() {
            TcpSocket::new_v4()
        } else {
            TcpSocket::new_v6()
        }
        .context("cannot create a socket")?;
        if let Some(ip) = self.bind {
            socket
                .bind(SocketAddr::new(ip, 0))
                .with_context(|| format!("cannot bind to {ip}"))?;
        }
        let stream = tokio::time::timeout(self.connect_timeout, socket.connect(self.addr))
            .await
            .map_err(|_| anyhow!("no answer within {:?}", self.connect_timeout))??;
        stream.set_nodelay(true)?;
        let (sender, connection) =
            hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
        let driver = tokio::spawn(async move {
            // Its errors reach the request that was in flight.
            let _ = connection.await;
        })
        .abort_handle();
        Ok(Open { sender, driver })
    }
}

/// An open connection; dropping it closes the socket.
struct Open {
    sender: SendRequest<Full<Bytes>>,
    driver: AbortHandle,
}

impl Drop for Open {
    fn drop(&mut self) {
        self.driver.abort();
    }
}

/// The headers of a request beside `Host`.
#[derive(Default)]
struct Headers<'a> {
    /// `application/json` when there is a body and no other type is given.
    content_type: Option<&'static str>,
    authorization: Option<HeaderValue>,
    /// `--forwarded-for`: the end user's address, prepared before the load.
    forwarded: Option<&'a HeaderValue>,
    /// The protocol's own: its version, the deadline.
    extra: Vec<(HeaderName, HeaderValue)>,
}

/// How a request to authd's HTTP forms is sent: its content type and the headers
/// that carry its deadline.
#[derive(Debug, Clone, Copy)]
pub(super) enum Form {
    /// The Connect protocol's unary JSON.
    Connect,
    /// gRPC-Web, binary.
    GrpcWeb,
}

impl Form {
    /// A request's body: the JSON (Connect), or the protobuf message in a gRPC-Web
    /// frame; only the one the form sends is built.
    pub(super) fn body<M: prost::Message>(
        self,
        json: impl FnOnce() -> Bytes,
        message: impl FnOnce() -> M,
    ) -> Bytes {
        match self {
            Form::Connect => json(),
            Form::GrpcWeb => grpc_frame(&message()),
        }
    }

    fn headers(self, timeout: Duration) -> (&'static str, Vec<(HeaderName, HeaderValue)>) {
        let millis = timeout.as_millis().max(1);
        match self {
            Form::Connect => (
                "application/json",
                vec![
                    (
                        HeaderName::from_static("connect-protocol-version"),
                        HeaderValue::from_static("1"),
                    ),
                    (
                        HeaderName::from_static("connect-timeout-ms"),
                        HeaderValue::from(u64::try_from(millis).unwrap_or(u64::MAX)),
                    ),
                ],
            ),
            Form::GrpcWeb => (
                "application/grpc-web+proto",
                vec![
                    (
                        HeaderName::from_static("x-grpc-web"),
                        HeaderValue::from_static("1"),
                    ),
                    (
                        HeaderName::from_static("grpc-timeout"),
                        HeaderValue::try_from(format!("{}m", millis.min(99_999_999)))
                            .expect("digits and a unit"),
                    ),
                ],
            ),
        }
    }
}

/// `X-Forwarded-For` (the header's name is case-insensitive: sent lowercase, as
/// HTTP/1.1 clients built on the http crate send every name).
const X_FORWARDED_FOR: HeaderName = HeaderName::from_static(super::forwarded::HEADER);

/// What the server answered.
#[derive(Debug)]
pub(super) struct Answer {
    pub(super) status: StatusCode,
    /// `Retry-After` in seconds, when it has that form.
    pub(super) retry_after: Option<Duration>,
    /// A gRPC-Web answer's gRPC code: from its headers (an answer with no message)
    /// or from the trailers frame at the end of its body.
    pub(super) grpc_status: Option<tonic::Code>,
}

/// One keep-alive connection, opened again whenever it is needed and closed.
pub(super) struct Connection {
    target: Arc<Target>,
    open: Option<Open>,
}

impl Connection {
    /// A connection not opened yet.
    pub(super) fn new(target: Arc<Target>) -> Self {
        Self { target, open: None }
    }

    /// Opens it now, rather than at its first request.
    pub(super) async fn connect(&mut self) -> anyhow::Result<()> {
        self.open = Some(self.target.open().await?);
        Ok(())
    }

    /// `POST path` with a JSON body, and `X-Forwarded-For: forwarded` when given.
    pub(super) async fn post(
        &mut self,
        path: &'static str,
        body: Bytes,
        forwarded: Option<&HeaderValue>,
    ) -> anyhow::Result<Answer> {
        let headers = Headers {
            forwarded,
            ..Headers::default()
        };
        self.send(Method::POST, path, body, headers).await
    }

    /// `POST path` in authd's HTTP form `form`, with its deadline `timeout`.
    pub(super) async fn post_as(
        &mut self,
        form: Form,
        path: &'static str,
        body: Bytes,
        timeout: Duration,
        forwarded: Option<&HeaderValue>,
    ) -> anyhow::Result<Answer> {
        let (content_type, extra) = form.headers(timeout);
        let headers = Headers {
            content_type: Some(content_type),
            forwarded,
            extra,
            ..Headers::default()
        };
        self.send(Method::POST, path, body, headers).await
    }

    /// `GET path` with `authorization: Bearer token` (authd's forward-auth), and
    /// `X-Forwarded-For: forwarded` when given.
    pub(super) async fn get_bearer(
        &mut self,
        path: &'static str,
        token: &str,
        forwarded: Option<&HeaderValue>,
    ) -> anyhow::Result<Answer> {
        let authorization = HeaderValue::try_from(format!("Bearer {token}"))?;
        let headers = Headers {
            authorization: Some(authorization),
            forwarded,
            ..Headers::default()
        };
        self.send(Method::GET, path, Bytes::new(), headers).await
    }

    /// `POST path` with the form `fields` as the client whose `authorization` header
    /// is `client`: an introspection (RFC 7662, `token=…`) or a grant on the token
    /// endpoint (RFC 6749), and `X-Forwarded-For: forwarded` when given.
    pub(super) async fn post_form(
        &mut self,
        path: &'static str,
        fields: &[(&str, &str)],
        client: &HeaderValue,
        forwarded: Option<&HeaderValue>,
    ) -> anyhow::Result<Answer> {
        let body: String = form_urlencoded::Serializer::new(String::new())
            .extend_pairs(fields)
            .finish();
        let headers = Headers {
            content_type: Some("application/x-www-form-urlencoded"),
            authorization: Some(client.clone()),
            forwarded,
            ..Headers::default()
        };
        self.send(Method::POST, path, Bytes::from(body), headers)
            .await
    }

    /// Sends one request and reads its whole answer, so that the connection can carry
    /// the next one. The connection is opened first if there is none or the server
    /// has closed it; after an error it is dropped.
    async fn send(
        &mut self,
        method: Method,
        path: &'static str,
        body: Bytes,
        headers: Headers<'_>,
    ) -> anyhow::Result<Answer> {
        let answer = self.exchange(method.clone(), path, body, headers).await;
        if answer.is_err() {
            self.open = None;
        }
        answer.with_context(|| format!("{method} {path}"))
    }

    async fn exchange(
        &mut self,
        method: Method,
        path: &'static str,
        body: Bytes,
        headers: Headers<'_>,
    ) -> anyhow::Result<Answer> {
        let reusable = match self.open.as_mut() {
            Some(open) => open.sender.ready().await.is_ok(),
            None => false,
        };
        if !reusable {
            self.open = None;
            self.connect().await.context("cannot connect")?;
        }
        let open = self.open.as_mut().expect("opened above");
        open.sender.ready().await?;
        let mut request = Request::builder()
            .method(method)
            .uri(path)
            .header(header::HOST, &self.target.host);
        if let Some(content_type) = headers.content_type {
            request = request.header(header::CONTENT_TYPE, content_type);
        } else if !body.is_empty() {
            request = request.header(header::CONTENT_TYPE, "application/json");
        }
        for (name, value) in headers.extra {
            request = request.header(name, value);
        }
        if let Some(authorization) = headers.authorization {
            request = request.header(header::AUTHORIZATION, authorization);
        }
        if let Some(forwarded) = headers.forwarded {
            request = request.header(X_FORWARDED_FOR, forwarded.clone());
        }
        let request = request.body(Full::new(body))?;
        let response = open.sender.send_request(request).await?;
        let status = response.status();
        let retry_after = response
            .headers()
            .get(header::RETRY_AFTER)
            .and_then(|value| value.to_str().ok())
            .and_then(|value| value.trim().parse::<u64>().ok())
            .map(Duration::from_secs);
        let grpc_web = response
            .headers()
            .get(header::CONTENT_TYPE)
            .is_some_and(|value| value.as_bytes().starts_with(b"application/grpc-web"));
        let in_headers = response.headers().get("grpc-status").map(grpc_code);
        let body = response.into_body().collect().await?.to_bytes();
        let grpc_status = match (grpc_web, in_headers) {
            (false, _) => None,
            (true, Some(code)) => Some(code),
            (true, None) => Some(trailers_status(&body).ok_or_else(|| {
                anyhow!("a gRPC-Web answer with no grpc-status in its headers or trailers")
            })?),
        };
        Ok(Answer {
            status,
            retry_after,
            grpc_status,
        })
    }

    /// Closes the socket: after a request given up on, whose answer may still come.
    pub(super) fn reset(&mut self) {
        self.open = None;
    }
}

/// The gRPC code of a `grpc-status` value (UNKNOWN when it is not one).
fn grpc_code(value: &HeaderValue) -> tonic::Code {
    value
        .to_str()
        .ok()
        .and_then(|v| v.trim().parse::<i32>().ok())
        .map_or(tonic::Code::Unknown, tonic::Code::from)
}

/// The `grpc-status` of the trailers frame of a gRPC-Web body: frames are a flag
/// byte (0x80: trailers), a 4-byte length and that many bytes; trailers are
/// `name: value` lines.
fn trailers_status(mut body: &[u8]) -> Option<tonic::Code> {
    while body.len() >= 5 {
        let flag = body[0];
        let len = u32::from_be_bytes([body[1], body[2], body[3], body[4]]) as usize;
        let frame = body.get(5..5 + len)?;
        if flag & 0x80 != 0 {
            let text = std::str::from_utf8(frame).ok()?;
            return text.split("\r\n").find_map(|line| {
                let (name, value) = line.split_once(':')?;
                name.trim()
                    .eq_ignore_ascii_case("grpc-status")
                    .then(|| HeaderValue::from_str(value.trim()).ok())
                    .flatten()
                    .map(|v| grpc_code(&v))
            });
        }
        body = &body[5 + len..];
    }
    None
}

/// A protobuf message in a gRPC(-Web) frame: no compression flag, its length, it.
pub(super) fn grpc_frame(message: &impl prost::Message) -> Bytes {
    let len = message.encoded_len();
    let mut framed = Vec::with_capacity(5 + len);
    framed.push(0);
    framed.extend_from_slice(&u32::try_from(len).unwrap_or(u32::MAX).to_be_bytes());
    message.encode(&mut framed).expect("a Vec grows as needed");
    Bytes::from(framed)
}

/// The JSON body of a token validation (proto3's JSON names, as authd's JSON form
/// reads them).
pub(super) fn access_token(token: &str) -> Bytes {
    Bytes::from(serde_json::json!({ "accessToken": token }).to_string())
}

/// The JSON body of a registration or a login of `username`.
/// The `authorization` header of HTTP Basic for `CLIENT_ID:SECRET`.
pub(super) fn basic(client: &str) -> anyhow::Result<HeaderValue> {
    use base64::Engine as _;
    anyhow::ensure!(client.contains(':'), "a client must be CLIENT_ID:SECRET");
    let encoded = base64::engine::general_purpose::STANDARD.encode(client);
    let mut value = HeaderValue::try_from(format!("Basic {encoded}"))?;
    value.set_sensitive(true);
    Ok(value)
}

pub(super) fn credentials(username: &str) -> Bytes {
    #[derive(Serialize)]
    struct Credentials<'a> {
        username: &'a str,
        password: &'a str,
    }
    let body = Credentials {
        username,
        password: PASSWORD,
    };
    Bytes::from(serde_json::to_vec(&body).expect("two strings always serialize"))
}

/// Waits until `GET /health` answers 2xx, for at most `plan.wait`, as the gRPC mode
/// waits for SERVING.
pub(super) async fn wait_until_healthy(plan: &Plan, target: &Arc<Target>) -> anyhow::Result<()> {
    let give_up_at = Instant::now() + plan.wait;
    let mut connection = Connection::new(target.clone());
    loop {
        let problem = match connection.connect().await {
            Err(e) => Err(format!("cannot connect to {}: {e:#}", target.url)),
            Ok(()) => {
                let check =
                    connection.send(Method::GET, "/health", Bytes::new(), Headers::default());
                match tokio::time::timeout(plan.connect_timeout, check).await {
                    Ok(Ok(answer)) if answer.status.is_success() => return Ok(()),
                    Ok(Ok(answer)) => Ok(format!("GET /health answered {}", answer.status)),
                    Ok(Err(e)) => Ok(format!("{e:#}")),
                    Err(_) => Ok(format!(
                        "GET /health got no answer within {:?}",
                        plan.connect_timeout
                    )),
                }
            }
        };
        if Instant::now() >= give_up_at {
            let hint = if plan.wait.is_zero() {
                " (use --wait to wait for it)"
            } else {
                ""
            };
            match problem {
                Err(cannot_connect) => bail!("{cannot_connect}"),
                Ok(problem) => bail!("{} is not serving: {problem}{hint}", target.url),
            }
        }
        connection.reset();
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Opens `count` connections, [`OPENING_AT_ONCE`] at a time; fails at the first that
/// cannot be opened.
pub(super) async fn open_connections(
    target: &Arc<Target>,
    count: usize,
) -> anyhow::Result<Vec<Connection>> {
    raise_open_files_limit(count)?;
    let mut connections = Vec::with_capacity(count);
    let mut opening = JoinSet::new();
    let mut started = 0;
    while connections.len() < count {
        while started < count && opening.len() < OPENING_AT_ONCE {
            let mut connection = Connection::new(target.clone());
            opening.spawn(async move { connection.connect().await.map(|()| connection) });
            started += 1;
        }
        let opened = opening
            .join_next()
            .await
            .expect("a connection is being opened")
            .context("a connection task failed")?;
        match opened {
            Ok(connection) => connections.push(connection),
            Err(e) => bail!(
                "cannot open connection {} of {count} to {}: {e:#}{}",
                connections.len() + 1,
                target.url,
                if out_of_files(&e) {
                    " (raise the open-files limit: ulimit -n)"
                } else {
                    ""
                }
            ),
        }
    }
    Ok(connections)
}

/// Open files a run of `connections` needs beyond them: the setup's connections, the
/// runtime's own descriptors, standard streams.
const OTHER_FILES: u64 = 256;

/// Raises the soft limit on open files to what `connections` need, up to the hard
/// limit; fails, naming both, when the hard limit is lower.
#[cfg(unix)]
fn raise_open_files_limit(connections: usize) -> anyhow::Result<()> {
    use rustix::process::{Resource, Rlimit, getrlimit, setrlimit};
    let needed = u64::try_from(connections).unwrap_or(u64::MAX) + OTHER_FILES;
    let limit = getrlimit(Resource::Nofile);
    if limit.current.is_none_or(|soft| soft >= needed) {
        return Ok(());
    }
    if let Some(hard) = limit.maximum
        && hard < needed
    {
        bail!(
            "{connections} connections need about {needed} open files, above this \
             process's hard limit of {hard}: raise it (ulimit -Hn) or lower --concurrency"
        );
    }
    setrlimit(
        Resource::Nofile,
        Rlimit {
            current: Some(needed),
            maximum: limit.maximum,
        },
    )
    .with_context(|| format!("cannot raise the open-files limit to {needed}"))
}

#[cfg(not(unix))]
fn raise_open_files_limit(_connections: usize) -> anyhow::Result<()> {
    Ok(())
}

/// Whether an error comes from running out of file descriptors.
fn out_of_files(error: &anyhow::Error) -> bool {
    #[cfg(unix)]
    let emfile = Some(rustix::io::Errno::MFILE.raw_os_error());
    #[cfg(not(unix))]
    let emfile = None;
    error.chain().any(|cause| {
        cause
            .downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.raw_os_error().is_some() && io.raw_os_error() == emfile)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_grpc_web_status_is_read_from_the_trailers_frame() {
        let mut body = grpc_frame(&prost_types::Duration::default()).to_vec();
        let trailers = b"grpc-status:16\r\ngrpc-message:nope\r\n";
        body.push(0x80);
        body.extend_from_slice(&(trailers.len() as u32).to_be_bytes());
        body.extend_from_slice(trailers);
        assert_eq!(trailers_status(&body), Some(tonic::Code::Unauthenticated));
        assert_eq!(trailers_status(&body[..3]), None);
        let ok = [&[0x80, 0, 0, 0, 14][..], b"grpc-status: 0"].concat();
        assert_eq!(trailers_status(&ok), Some(tonic::Code::Ok));
    }

    #[test]
    fn deadlines_travel_in_each_form() {
        let (json, headers) = Form::Connect.headers(Duration::from_secs(10));
        assert_eq!(json, "application/json");
        assert!(headers.contains(&(
            HeaderName::from_static("connect-timeout-ms"),
            HeaderValue::from_static("10000")
        )));
        let (web, headers) = Form::GrpcWeb.headers(Duration::from_millis(1500));
        assert_eq!(web, "application/grpc-web+proto");
        assert!(headers.contains(&(
            HeaderName::from_static("grpc-timeout"),
            HeaderValue::from_static("1500m")
        )));
    }

    #[test]
    fn credentials_are_json() {
        let body: serde_json::Value = serde_json::from_slice(&credentials("ab1-u7")).unwrap();
        assert_eq!(
            body,
            serde_json::json!({"username": "ab1-u7", "password": PASSWORD})
        );
    }

    #[cfg(unix)]
    #[test]
    fn running_out_of_files_is_recognized() {
        let emfile = std::io::Error::from_raw_os_error(rustix::io::Errno::MFILE.raw_os_error());
        assert!(out_of_files(
            &anyhow::Error::new(emfile).context("cannot connect")
        ));
        let refused = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
        assert!(!out_of_files(&anyhow::Error::new(refused)));
    }
}
