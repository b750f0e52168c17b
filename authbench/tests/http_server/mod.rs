//! A small HTTP/1.1 server of the tests' own, on 127.0.0.1:0: every request goes to
//! a handler that decides the answer (status, Retry-After, whether to close the
//! connection after it, how long to wait first), and every accepted connection is
//! counted. It lets the tests play what the report's service never does on its own.

use bytes::Bytes;
use http_body_util::{BodyExt as _, Full};
use hyper::{Request, Response, body::Incoming, service::service_fn};
use hyper_util::rt::TokioIo;
use std::{
    convert::Infallible,
    net::SocketAddr,
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};
use tokio::{net::TcpListener, task::JoinHandle};

/// What the server answers to one request.
#[derive(Debug, Clone, Copy)]
pub struct Reply {
    pub status: u16,
    pub retry_after: Option<u64>,
    /// Answer with `Connection: close`, and close.
    pub close: bool,
    /// Wait this long before answering.
    pub delay: Duration,
}

impl Reply {
    pub fn status(status: u16) -> Self {
        Self {
            status,
            retry_after: None,
            close: false,
            delay: Duration::ZERO,
        }
    }
}

/// A request as the handler sees it: method, path, the JSON body's username, the
/// X-Forwarded-For header.
pub struct Seen<'a> {
    pub method: &'a str,
    pub path: &'a str,
    pub username: Option<String>,
    pub forwarded_for: Option<String>,
}

type Handler = dyn Fn(&Seen<'_>) -> Reply + Send + Sync;

pub struct HttpServer {
    pub addr: SocketAddr,
    connections: Arc<AtomicUsize>,
    task: JoinHandle<()>,
}

impl HttpServer {
    pub async fn start(handler: impl Fn(&Seen<'_>) -> Reply + Send + Sync + 'static) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let connections = Arc::new(AtomicUsize::new(0));
        let handler: Arc<Handler> = Arc::new(handler);
        let counted = connections.clone();
        let task = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                counted.fetch_add(1, Ordering::SeqCst);
                let handler = handler.clone();
                tokio::spawn(async move {
                    let service = service_fn(move |request| answer(handler.clone(), request));
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        Self {
            addr,
            connections,
            task,
        }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Connections accepted so far.
    pub fn connections(&self) -> usize {
        self.connections.load(Ordering::SeqCst)
    }
}

impl Drop for HttpServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn answer(
    handler: Arc<Handler>,
    request: Request<Incoming>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let method = request.method().to_string();
    let path = request.uri().path().to_string();
    let forwarded_for = request
        .headers()
        .get("x-forwarded-for")
        .map(|value| value.to_str().unwrap().to_owned());
    let body = request
        .into_body()
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    let username = serde_json::from_slice::<serde_json::Value>(&body)
        .ok()
        .and_then(|v| v["username"].as_str().map(str::to_string));
    let reply = handler(&Seen {
        method: &method,
        path: &path,
        username,
        forwarded_for,
    });
    if !reply.delay.is_zero() {
        tokio::time::sleep(reply.delay).await;
    }
    let mut response = Response::builder()
        .status(reply.status)
        .header("content-type", "application/json");
    if let Some(seconds) = reply.retry_after {
        response = response.header("retry-after", seconds.to_string());
    }
    if reply.close {
        response = response.header("connection", "close");
    }
    Ok(response.body(Full::new(Bytes::from_static(b"{}"))).unwrap())
}
