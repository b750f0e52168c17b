//! Connecting: the HTTP/2 connections opened up front, and the wait until the
//! target reports SERVING.
//!
//! It fails with one clear error when the target cannot be reached or is not authd;
//! it sends no load and prepares no users.

use super::{
    plan::Plan,
    status::{describe_status, error_chain},
};
use anyhow::{Context as _, anyhow, bail};
use hyper_util::client::legacy::connect::HttpConnector;
use std::{
    io,
    pin::Pin,
    task::{Context, Poll},
    time::{Duration, Instant},
};
use tokio::task::JoinSet;
use tonic::{
    Request,
    transport::{Channel, Endpoint},
};
use tonic_health::pb::{
    HealthCheckRequest, health_check_response::ServingStatus, health_client::HealthClient,
};
use tower::ServiceExt as _;

/// Opens the connections, retrying until `plan.wait` has passed.
pub(super) async fn connect(plan: &Plan) -> anyhow::Result<Vec<Channel>> {
    let mut endpoint = Endpoint::from_shared(plan.target.clone())
        .map_err(|e| anyhow!("{:?} is not a valid target URL: {e}", plan.target))?
        .connect_timeout(plan.connect_timeout)
        // Requests waiting for the connection's dispatcher: an open loop may have many.
        .buffer_size(64 * 1024);
    if plan.target.starts_with("https://") {
        let tls = plan.tls.clone().unwrap_or_default().config()?;
        endpoint = endpoint
            .tls_config(tls)
            .map_err(|e| anyhow!("TLS options: {}", error_chain(&e)))?;
    }
    let give_up_at = Instant::now() + plan.wait;
    let connect = |endpoint: Endpoint| {
        let tcp = tcp_connector(plan);
        async move { endpoint.connect_with_connector(tcp).await }
    };
    let first = loop {
        // connect_timeout covers TCP; the outer timeout covers a target that accepts
        // but never completes the HTTP/2 handshake.
        let attempt = tokio::time::timeout(plan.connect_timeout, connect(endpoint.clone())).await;
        let error = match attempt {
            Ok(Ok(channel)) => break channel,
            Ok(Err(e)) => error_chain(&e),
            Err(_) => format!("no answer within {:?}", plan.connect_timeout),
        };
        if Instant::now() >= give_up_at {
            bail!("cannot connect to {}: {error}", plan.target);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let mut channels = vec![first];
    let mut more = JoinSet::new();
    for _ in 1..plan.connections {
        let attempt = connect(endpoint.clone());
        let limit = plan.connect_timeout;
        more.spawn(async move { tokio::time::timeout(limit, attempt).await });
    }
    while let Some(result) = more.join_next().await {
        let channel = match result.context("a connection task failed")? {
            Ok(Ok(channel)) => channel,
            Ok(Err(e)) => bail!(
                "cannot open connection {} of {} to {}: {}",
                channels.len() + 1,
                plan.connections,
                plan.target,
                error_chain(&e)
            ),
            Err(_) => bail!(
                "cannot open connection {} of {} to {}: no answer within {:?}",
                channels.len() + 1,
                plan.connections,
                plan.target,
                plan.connect_timeout
            ),
        };
        channels.push(channel);
    }
    Ok(channels)
}

/// The TCP connector tonic's `connect` would build (from `--bind`, with no Nagle
/// delay; tonic adds the connect timeout and TLS on top), its connections wrapped in
/// [`Unvectored`].
fn tcp_connector(
    plan: &Plan,
) -> impl tower::Service<
    http::Uri,
    Response = Unvectored<<HttpConnector as tower::Service<http::Uri>>::Response>,
    Error = <HttpConnector as tower::Service<http::Uri>>::Error,
    Future = impl Future + Send,
> + Clone
+ Send
+ 'static {
    let mut tcp = HttpConnector::new();
    // https:// targets too: tonic puts TLS over the TCP connection.
    tcp.enforce_http(false);
    tcp.set_nodelay(true);
    tcp.set_local_address(plan.bind);
    tcp.map_response(Unvectored)
}

/// A connection that tells HTTP/2 it does not write vectored. h2 then copies every
/// frame of up to 1,024 bytes into its write buffer (256 bytes when the connection
/// writes vectored), so a request's HEADERS and its DATA (a Check's carries a token
/// of a few hundred bytes) leave in one write instead of one each. Every write
/// crosses the loopback into the server's receive path and wakes it, on the
/// client's core: fewer writes per request is what lets one core keep an open loop
/// of tens of thousands of requests a second on time. authd's own connections do the
/// same (`transport::io`).
struct Unvectored<T>(T);

impl<T: hyper::rt::Read + Unpin> hyper::rt::Read for Unvectored<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: hyper::rt::ReadBufCursor<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_read(cx, buf)
    }
}

impl<T: hyper::rt::Write + Unpin> hyper::rt::Write for Unvectored<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.0).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_shutdown(cx)
    }

    fn is_write_vectored(&self) -> bool {
        false
    }
}

/// Checks that the server reports SERVING, waiting up to `plan.wait` for it. authd
/// always serves grpc.health.v1; a target without it is not authd (an HTTP server
/// that is not gRPC answers UNIMPLEMENTED), and is refused.
pub(super) async fn wait_until_serving(plan: &Plan, channel: &Channel) -> anyhow::Result<()> {
    let mut health = HealthClient::new(channel.clone());
    let give_up_at = Instant::now() + plan.wait;
    loop {
        let mut request = Request::new(HealthCheckRequest {
            service: String::new(),
        });
        request.set_timeout(plan.connect_timeout);
        let answer = tokio::time::timeout(plan.connect_timeout, health.check(request)).await;
        let problem = match answer {
            Ok(Ok(response)) => match ServingStatus::try_from(response.into_inner().status) {
                Ok(ServingStatus::Serving) => return Ok(()),
                Ok(status) => format!("its health is {}", status.as_str_name()),
                Err(_) => "its health status is unknown".to_string(),
            },
            Ok(Err(status)) => format!("the health check failed: {}", describe_status(&status)),
            Err(_) => format!(
                "the health check got no answer within {:?}",
                plan.connect_timeout
            ),
        };
        if Instant::now() >= give_up_at {
            let hint = if plan.wait.is_zero() {
                " (use --wait to wait for it)"
            } else {
                ""
            };
            bail!("{} is not serving: {problem}{hint}", plan.target);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Load, Scenario, Stop};
    use hyper::rt::Write as _;

    #[tokio::test]
    async fn connections_say_they_do_not_write_vectored() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let target = format!("http://{}", listener.local_addr().unwrap());
        let plan = Plan::new(
            &target,
            Scenario::Health,
            Load::Closed { concurrency: 1 },
            Stop::Requests(1),
        );
        let uri: http::Uri = target.parse().unwrap();
        let (connected, accepted) =
            tokio::join!(tcp_connector(&plan).oneshot(uri), listener.accept());
        let connection = connected.unwrap();
        accepted.unwrap();
        // A TCP stream writes vectored; wrapped, it says it does not.
        assert!(connection.0.is_write_vectored());
        assert!(!connection.is_write_vectored());
    }
}
