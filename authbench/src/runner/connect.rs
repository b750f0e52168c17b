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
use std::time::{Duration, Instant};
use tokio::task::JoinSet;
use tonic::{
    Request,
    transport::{Channel, Endpoint},
};
use tonic_health::pb::{
    HealthCheckRequest, health_check_response::ServingStatus, health_client::HealthClient,
};

/// Opens the connections, retrying until `plan.wait` has passed.
pub(super) async fn connect(plan: &Plan) -> anyhow::Result<Vec<Channel>> {
    let mut endpoint = Endpoint::from_shared(plan.target.clone())
        .map_err(|e| anyhow!("{:?} is not a valid target URL: {e}", plan.target))?
        .connect_timeout(plan.connect_timeout)
        .tcp_nodelay(true)
        .local_address(plan.bind)
        // Requests waiting for the connection's dispatcher: an open loop may have many.
        .buffer_size(64 * 1024);
    if plan.target.starts_with("https://") {
        let tls = plan.tls.clone().unwrap_or_default().config()?;
        endpoint = endpoint
            .tls_config(tls)
            .map_err(|e| anyhow!("TLS options: {}", error_chain(&e)))?;
    }
    let give_up_at = Instant::now() + plan.wait;
    let first = loop {
        // connect_timeout covers TCP; the outer timeout covers a target that accepts
        // but never completes the HTTP/2 handshake.
        let attempt = tokio::time::timeout(plan.connect_timeout, endpoint.connect()).await;
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
        let endpoint = endpoint.clone();
        let limit = plan.connect_timeout;
        more.spawn(async move { tokio::time::timeout(limit, endpoint.connect()).await });
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
