//! `authd health`: a `grpc.health.v1` client for container healthchecks and for
//! Kubernetes versions without native gRPC probes.
//!
//! It asks one server about one service name, once, within a timeout, and turns the
//! answer into an exit status: `Ok` only for SERVING; otherwise an [`Unhealthy`] whose
//! one-line message says why (NOT_SERVING, SERVICE_UNKNOWN, unreachable, timeout).
//! The names authd reports: `""` and `auth.v1.AuthService` for readiness (they follow
//! the database), `liveness` for liveness (SERVING while the process serves).
//! It owns nothing of the server: it is a client. It talks plain-text HTTP/2 (to the
//! health-only port, on loopback or a pod address), or TLS to an `https://` address
//! or when given [`ClientTls`] options (`--tls-ca`, and `--tls-cert`/`--tls-key` for
//! a server that asks for a client certificate); the connection itself is made as
//! `client` makes it for every command that calls authd.

use crate::{
    client::{self, BadEndpoint, ClientTls, local_addr},
    config::Config,
};
use std::{fmt, time::Duration};
use tonic::Code;
use tonic_health::pb::{
    HealthCheckRequest, health_check_response::ServingStatus, health_client::HealthClient,
};

/// Why a server is not healthy; `Display` is the one line `authd health` prints.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Unhealthy {
    /// The server answered NOT_SERVING (for readiness: database down, or draining for
    /// shutdown).
    NotServing { target: String },
    /// The server does not know the service name asked about.
    ServiceUnknown { target: String },
    /// The server answered a status this client does not expect (UNKNOWN, or a
    /// value added to the protocol later).
    OtherStatus { target: String, status: i32 },
    /// No connection could be made, or the call failed with a gRPC error.
    Unreachable { target: String, cause: String },
    /// No answer within the timeout.
    Timeout { target: String, after: Duration },
    /// The address given is not usable.
    BadAddress { addr: String, cause: String },
    /// A TLS option is not usable (a file that cannot be read).
    BadTls { cause: String },
}

impl fmt::Display for Unhealthy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Unhealthy::NotServing { target } => write!(f, "{target}: NOT_SERVING"),
            Unhealthy::ServiceUnknown { target } => write!(f, "{target}: SERVICE_UNKNOWN"),
            Unhealthy::OtherStatus { target, status } => {
                let name = ServingStatus::try_from(*status)
                    .map(|s| s.as_str_name().to_owned())
                    .unwrap_or_else(|_| format!("status {status}"));
                write!(f, "{target}: {name}")
            }
            Unhealthy::Unreachable { target, cause } => write!(f, "{target}: unreachable: {cause}"),
            Unhealthy::Timeout { target, after } => write!(
                f,
                "{target}: timeout: no answer within {}",
                humantime::format_duration(*after)
            ),
            Unhealthy::BadAddress { addr, cause } => write!(f, "--addr {addr:?}: {cause}"),
            Unhealthy::BadTls { cause } => f.write_str(cause),
        }
    }
}

impl std::error::Error for Unhealthy {}

/// `authd health`: checks `service` at `addr` (by default the loopback address on the
/// port of `--listen`), prints `… SERVING` on stdout when healthy, and returns the
/// reason otherwise (which `main` prints as one line, exiting non-zero).
pub async fn run(
    config: &Config,
    addr: Option<&str>,
    service: &str,
    timeout: Duration,
    tls: &ClientTls,
) -> anyhow::Result<()> {
    let addr = match addr {
        Some(addr) => addr.to_owned(),
        // The health-only port when there is one: it answers however busy the
        // gRPC port is. Otherwise the gRPC port, which serves health too.
        None => local_addr(
            config
                .server
                .health_listen
                .addr()
                .unwrap_or(config.server.listen),
        )
        .to_string(),
    };
    check(&addr, service, timeout, tls).await?;
    println!("{}: SERVING", describe(&addr, service));
    Ok(())
}

/// Asks `addr` (`HOST:PORT`, `http://HOST:PORT` or `https://HOST:PORT`) whether
/// `service` is SERVING, over TLS for `https://` or when `tls` has an option set;
/// connecting and asking together take at most `timeout`.
pub async fn check(
    addr: &str,
    service: &str,
    timeout: Duration,
    tls: &ClientTls,
) -> Result<(), Unhealthy> {
    let endpoint = client::endpoint(addr, timeout, tls).map_err(|bad| match bad {
        BadEndpoint::Address(cause) => Unhealthy::BadAddress {
            addr: addr.to_owned(),
            cause,
        },
        BadEndpoint::Tls(cause) => Unhealthy::BadTls { cause },
    })?;
    let target = describe(addr, service);
    let ask = async {
        let channel = endpoint
            .connect()
            .await
            .map_err(|e| Unhealthy::Unreachable {
                target: target.clone(),
                cause: client::error_chain(&e),
            })?;
        let mut request = tonic::Request::new(HealthCheckRequest {
            service: service.to_owned(),
        });
        // Sent as grpc-timeout, so the server gives up when this client does.
        request.set_timeout(timeout);
        HealthClient::new(channel)
            .check(request)
            .await
            .map(|response| response.into_inner().status)
            .map_err(|status| match status.code() {
                // The health protocol answers NOT_FOUND for a name it does not know.
                Code::NotFound => Unhealthy::ServiceUnknown {
                    target: target.clone(),
                },
                // The server gave up at our grpc-timeout, or tonic did on our side.
                _ if client::timed_out(&status) => Unhealthy::Timeout {
                    target: target.clone(),
                    after: timeout,
                },
                Code::Unimplemented => Unhealthy::Unreachable {
                    target: target.clone(),
                    cause: "the server does not implement grpc.health.v1.Health".into(),
                },
                code => Unhealthy::Unreachable {
                    target: target.clone(),
                    cause: format!("{code:?}: {}", status.message()),
                },
            })
    };
    // The connect timeout and grpc-timeout each cover one part; this one bounds the
    // whole, so a healthcheck never outlives what it was given.
    let status = tokio::time::timeout(timeout, ask)
        .await
        .map_err(|_| Unhealthy::Timeout {
            target: target.clone(),
            after: timeout,
        })??;
    match ServingStatus::try_from(status) {
        Ok(ServingStatus::Serving) => Ok(()),
        Ok(ServingStatus::NotServing) => Err(Unhealthy::NotServing { target }),
        Ok(ServingStatus::ServiceUnknown) => Err(Unhealthy::ServiceUnknown { target }),
        _ => Err(Unhealthy::OtherStatus { target, status }),
    }
}

/// `127.0.0.1:50051 "auth.v1.AuthService"`, or `… (server)` for the empty name.
fn describe(addr: &str, service: &str) -> String {
    if service.is_empty() {
        format!("{addr} (server)")
    } else {
        format!("{addr} {service:?}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_reason_is_one_line() {
        let target = describe("127.0.0.1:1", "auth.v1.AuthService");
        let reasons = [
            Unhealthy::NotServing {
                target: target.clone(),
            },
            Unhealthy::ServiceUnknown {
                target: target.clone(),
            },
            Unhealthy::OtherStatus {
                target: target.clone(),
                status: 0,
            },
            Unhealthy::Timeout {
                target: target.clone(),
                after: Duration::from_secs(2),
            },
        ];
        let lines: Vec<String> = reasons.iter().map(ToString::to_string).collect();
        assert_eq!(
            lines,
            [
                "127.0.0.1:1 \"auth.v1.AuthService\": NOT_SERVING",
                "127.0.0.1:1 \"auth.v1.AuthService\": SERVICE_UNKNOWN",
                "127.0.0.1:1 \"auth.v1.AuthService\": UNKNOWN",
                "127.0.0.1:1 \"auth.v1.AuthService\": timeout: no answer within 2s",
            ]
        );
    }

    /// A real health server on port 0: "" SERVING, "auth.v1.AuthService" NOT_SERVING.
    async fn health_server() -> String {
        let (reporter, service) = tonic_health::server::health_reporter();
        reporter
            .set_service_status("", tonic_health::ServingStatus::Serving)
            .await;
        reporter
            .set_service_status(
                "auth.v1.AuthService",
                tonic_health::ServingStatus::NotServing,
            )
            .await;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        tokio::spawn(async move {
            let _keep = reporter;
            tonic::transport::Server::builder()
                .add_service(service)
                .serve_with_incoming(tonic::transport::server::TcpIncoming::from(listener))
                .await
        });
        addr
    }

    #[tokio::test]
    async fn each_answer_of_a_real_server_is_told_apart() {
        let addr = health_server().await;
        let t = Duration::from_secs(5);
        assert_eq!(check(&addr, "", t, &ClientTls::default()).await, Ok(()));
        assert!(matches!(
            check(&addr, "auth.v1.AuthService", t, &ClientTls::default()).await,
            Err(Unhealthy::NotServing { .. })
        ));
        assert!(matches!(
            check(&addr, "no.such.Service", t, &ClientTls::default()).await,
            Err(Unhealthy::ServiceUnknown { .. })
        ));
    }

    #[tokio::test]
    async fn a_server_that_never_answers_times_out() {
        // Accepts connections (the kernel does, from the backlog) but never speaks.
        let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = silent.local_addr().unwrap().to_string();
        // Real time: the probe's network timeout.
        let started = std::time::Instant::now();
        let err = check(&addr, "", Duration::from_millis(300), &ClientTls::default())
            .await
            .unwrap_err();
        assert!(matches!(err, Unhealthy::Timeout { .. }), "{err:?}");
        assert!(started.elapsed() < Duration::from_secs(3));
    }

    #[tokio::test]
    async fn a_closed_port_is_unreachable_at_once() {
        // Bind then drop: nothing listens there any more.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let addr = format!("127.0.0.1:{port}");
        let err = check(&addr, "", Duration::from_secs(2), &ClientTls::default())
            .await
            .unwrap_err();
        assert!(
            matches!(err, Unhealthy::Unreachable { .. }),
            "{err:?}: {err}"
        );
        assert!(!err.to_string().contains('\n'));
    }
}
