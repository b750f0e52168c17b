//! Attacks below gRPC, played with raw HTTP/2 frames and connections from several
//! loopback addresses: one client must not be able to take the service away from
//! the others, and no connection may stay open for ever doing nothing.

use crate::h2raw::{
    self, END_HEADERS, END_STREAM, GOAWAY, HEADERS, MAX_CONCURRENT_STREAMS, PING, RST_STREAM,
    RawConnection, frame, grpc_request, h2_client_from, raw_unary,
};
use crate::helpers::{TestApp, metric, spawn_app_with, tcp_from, wait_until};
use authd::pb::{LoginRequest, auth_service_client::AuthServiceClient};
use prost::Message as _;
use std::{
    net::{Ipv4Addr, SocketAddr},
    time::Duration,
};
use tokio::io::AsyncWriteExt as _;
use tonic::{Code, transport::Channel};
use tonic_health::pb::{
    HealthCheckRequest, health_check_response::ServingStatus, health_client::HealthClient,
};

/// A tonic channel to `addr` whose connections come from the loopback address `from`.
async fn channel_from(from: &str, addr: SocketAddr) -> Channel {
    Channel::from_shared(format!("http://{addr}"))
        .unwrap()
        .local_address(Some(from.parse().unwrap()))
        .connect()
        .await
        .expect("connect")
}

/// A well-behaved client, from its own address: registers, logs in, validates.
async fn honest_client_is_served(from: &str, app: &TestApp, name: &str) {
    let mut client = AuthServiceClient::new(channel_from(from, app.addr).await);
    crate::helpers::register(&mut client, name, "a fine password")
        .await
        .expect("Register is served");
    let token = crate::helpers::login(&mut client, name, "a fine password")
        .await
        .expect("Login is served")
        .access_token;
    client
        .validate_token(authd::pb::ValidateTokenRequest {
            access_token: token,
            ..Default::default()
        })
        .await
        .expect("ValidateToken is served");
}

/// Opens `n` Login streams from `from` that send headers and never a body.
async fn header_only_streams(
    from: &str,
    addr: SocketAddr,
    n: usize,
) -> Vec<(h2::client::ResponseFuture, h2::SendStream<bytes::Bytes>)> {
    let mut send = h2_client_from(from, addr).await;
    let mut streams = Vec::new();
    for _ in 0..n {
        send = send.ready().await.expect("room for another stream");
        let (response, body) = send
            .send_request(grpc_request(addr, "/auth.v1.AuthService/Login"), false)
            .expect("a stream");
        streams.push((response, body));
    }
    streams
}

#[tokio::test]
async fn values_that_differ_in_every_answer_stay_out_of_the_hpack_tables() {
    let app = spawn_app_with(|c| {
        c.limits.rate_limits = Some("Login:peer=1/1h".parse().unwrap());
        c.overload.refusal_hold = Duration::ZERO;
    })
    .await;
    let mut raw = RawConnection::open(
        tcp_from(Ipv4Addr::new(127, 0, 0, 2), app.addr)
            .await
            .unwrap(),
    )
    .await;
    let health = HealthCheckRequest::default().encode_to_vec();
    let path = "/grpc.health.v1.Health/Check";
    let mut answers = Vec::new();
    for id in [1, 3, 5] {
        answers.push(raw_unary(&mut raw, id, path, &health).await);
    }
    // The request id, in each answer, as a literal never indexed…
    for answer in &answers {
        assert_eq!(answer.never_indexed, 1, "{answer:?}");
        assert_eq!(answer.without_indexing, 0, "{answer:?}");
    }
    // …so the first answer put in the table every field that repeats, and the
    // next send each of them as an index. The one field that may still be new is
    // HTTP's `date`, when a second has begun since the answer before: in two
    // answers sent a moment apart, at most one.
    assert!(answers[0].incremental > 0, "{answers:?}");
    assert!(
        answers[1].incremental + answers[2].incremental <= 1,
        "{answers:?}"
    );
    // A refusal adds its details (RetryInfo counts down in nanoseconds): never
    // indexed either. The first Login is let through (and fails: no such user).
    let login = LoginRequest {
        username: "nobody".into(),
        password: "not a password".into(),
    }
    .encode_to_vec();
    let path = "/auth.v1.AuthService/Login";
    let failed = raw_unary(&mut raw, 7, path, &login).await;
    assert_eq!(failed.never_indexed, 1, "{failed:?}");
    for id in [9, 11, 13] {
        let refused = raw_unary(&mut raw, id, path, &login).await;
        assert_eq!(refused.never_indexed, 2, "{refused:?}");
    }
    assert_eq!(
        metric(
            &app.handle.render_metrics(),
            r#"authd_ratelimit_requests_total{outcome="refused"}"#
        ),
        Some(3.0),
        "the last three were refused by the limit"
    );
}

#[tokio::test]
async fn the_server_advertises_its_stream_limit() {
    let app = spawn_app_with(|c| c.server.max_streams_per_connection = 37).await;
    let mut raw = RawConnection::open(
        tcp_from(Ipv4Addr::new(127, 0, 0, 1), app.addr)
            .await
            .unwrap(),
    )
    .await;
    let settings = raw.server_settings().await;
    assert!(
        settings.contains(&(MAX_CONCURRENT_STREAMS, 37)),
        "{settings:?}"
    );
}

#[tokio::test]
async fn requests_whose_body_never_comes_take_no_place_from_other_clients() {
    let mut app = spawn_app_with(|c| {
        c.overload.max_in_flight = 4;
        c.overload.max_in_flight_per_client = Some(1000);
        c.overload.receive_timeout = Duration::from_secs(60);
        c.server.drain_timeout = Duration::from_secs(60);
    })
    .await;
    // One connection, 90 Login streams with headers and no body: far beyond the
    // in-flight cap of 4.
    let attacker = header_only_streams("127.0.0.2", app.addr, 90).await;
    let handle = app.handle.clone();
    let attacker_ip = "127.0.0.2".parse().unwrap();
    wait_until("the server sees every stream", || {
        handle.open_for(attacker_ip) == 90
    })
    .await;
    assert_eq!(handle.in_flight(), 0, "incomplete requests hold no place");
    honest_client_is_served("127.0.0.3", &app, "honest").await;
    assert_eq!(app.health_status("").await, ServingStatus::Serving);
    // And they do not hold up a shutdown: the drain finds nothing in flight, so the
    // stop does not wait for the 60 s drain timeout.
    let stopped = tokio::time::timeout(Duration::from_secs(20), app.stop()).await;
    stopped
        .expect("the stop does not wait for the drain timeout")
        .expect("a clean stop");
    drop(attacker);
}

#[tokio::test]
async fn one_client_leaves_a_share_of_the_capacity_to_the_others() {
    let app = spawn_app_with(|c| {
        c.overload.max_in_flight = 30;
        c.overload.max_in_flight_per_client = Some(10);
        c.overload.receive_timeout = Duration::from_secs(60);
    })
    .await;
    let mut streams = header_only_streams("127.0.0.2", app.addr, 30).await;
    // Past its share of ten, a client may open more while more than a share of the
    // cap of thirty stays free: twenty wait for their body, the ten beyond are
    // refused at once.
    let mut refused = 0;
    for (response, _) in streams.drain(20..) {
        let response = tokio::time::timeout(Duration::from_secs(10), response)
            .await
            .expect("an answer at once")
            .expect("a response");
        assert_eq!(h2raw::grpc_status(&response), Some(8)); // RESOURCE_EXHAUSTED
        refused += 1;
    }
    assert_eq!(refused, 10);
    assert_eq!(app.handle.open_for("127.0.0.2".parse().unwrap()), 20);
    honest_client_is_served("127.0.0.3", &app, "other").await;
    drop(streams);
}

#[tokio::test]
async fn a_request_not_received_in_time_gets_deadline_exceeded_and_frees_its_place() {
    let mut app = spawn_app_with(|c| c.overload.receive_timeout = Duration::from_millis(300)).await;
    let mut streams = header_only_streams("127.0.0.2", app.addr, 3).await;
    for (response, _body) in streams.drain(..) {
        let response = tokio::time::timeout(Duration::from_secs(10), response)
            .await
            .expect("answered once the receive timeout passes")
            .expect("a response");
        assert_eq!(h2raw::grpc_status(&response), Some(4)); // DEADLINE_EXCEEDED
    }
    wait_until("the places are freed", || {
        app.handle.open_for("127.0.0.2".parse().unwrap()) == 0
    })
    .await;
    app.register("patient", "a fine password").await.unwrap();
}

#[tokio::test]
async fn a_connection_that_never_sends_the_preface_is_closed() {
    let app = spawn_app_with(|c| c.server.handshake_timeout = Duration::from_millis(200)).await;
    let mut silent = tcp_from(Ipv4Addr::new(127, 0, 0, 2), app.addr)
        .await
        .unwrap();
    // Half a preface is no better than none.
    let mut trickle = tcp_from(Ipv4Addr::new(127, 0, 0, 2), app.addr)
        .await
        .unwrap();
    trickle.write_all(&h2raw::PREFACE[..10]).await.unwrap();
    h2raw::closed_within(&mut silent, Duration::from_secs(10)).await;
    h2raw::closed_within(&mut trickle, Duration::from_secs(10)).await;
    let text = app.handle.render_metrics();
    assert_eq!(
        metric(
            &text,
            r#"authd_connections_handshake_timeouts_total{listener="grpc"}"#
        ),
        Some(2.0)
    );
}

#[tokio::test]
async fn the_grpc_port_speaks_http1_beside_http2_and_closes_half_sent_http1_requests() {
    let app = spawn_app_with(|c| c.server.handshake_timeout = Duration::from_millis(200)).await;
    // An HTTP/1.1 request gets an HTTP/1.1 answer on the port gRPC is served on…
    let (head, _) = crate::helpers::http_get(app.addr, "/", "").await;
    assert!(head.starts_with("HTTP/1.1 "), "{head}");
    // …while gRPC over HTTP/2 is served beside it.
    honest_client_is_served("127.0.0.3", &app, "beside-http1").await;
    // Request headers never completed: closed by the handshake timeout, as on the
    // HTTP/1.1-only ports.
    let mut half = tcp_from(Ipv4Addr::new(127, 0, 0, 2), app.addr)
        .await
        .unwrap();
    half.write_all(b"POST /auth.v1.AuthService/Login HTTP/1.1\r\nHost: x\r\n")
        .await
        .unwrap();
    h2raw::closed_within(&mut half, Duration::from_secs(10)).await;
}

#[tokio::test]
async fn the_metrics_port_closes_half_sent_and_silent_connections() {
    let app = spawn_app_with(|c| c.server.handshake_timeout = Duration::from_millis(200)).await;
    let addr = app.handle.metrics_addr().unwrap();
    let mut silent = tcp_from(Ipv4Addr::new(127, 0, 0, 2), addr).await.unwrap();
    let mut half = tcp_from(Ipv4Addr::new(127, 0, 0, 2), addr).await.unwrap();
    half.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")
        .await
        .unwrap();
    h2raw::closed_within(&mut silent, Duration::from_secs(10)).await;
    h2raw::closed_within(&mut half, Duration::from_secs(10)).await;
}

#[tokio::test]
async fn an_idle_connection_is_closed_with_goaway() {
    let app = spawn_app_with(|c| c.server.idle_timeout = Duration::from_millis(300)).await;
    let tcp = tcp_from(Ipv4Addr::new(127, 0, 0, 2), app.addr)
        .await
        .unwrap();
    let (send, connection) = h2::client::handshake(tcp).await.unwrap();
    let mut connection = tokio::spawn(connection);
    // One request (a health check), then nothing.
    let mut send = send.ready().await.unwrap();
    let (response, mut body) = send
        .send_request(
            grpc_request(app.addr, "/grpc.health.v1.Health/Check"),
            false,
        )
        .unwrap();
    body.send_data(bytes::Bytes::from_static(&[0, 0, 0, 0, 0]), true)
        .unwrap();
    let response = response.await.unwrap();
    assert_eq!(response.status(), 200);
    let mut received = response.into_body();
    while let Some(chunk) = received.data().await {
        chunk.unwrap();
    }
    received.trailers().await.unwrap();
    // The server ends the idle connection gracefully: the client's connection ends
    // without an error.
    let ended = tokio::time::timeout(Duration::from_secs(10), &mut connection)
        .await
        .expect("the idle connection is closed");
    ended.unwrap().expect("a graceful close (GOAWAY)");
    // (The test's own idle client connection is closed the same way.)
    wait_until("the close is counted", || {
        metric(
            &app.handle.render_metrics(),
            r#"authd_connections_idle_closed_total{listener="grpc"}"#,
        )
        .is_some_and(|n| n >= 1.0)
    })
    .await;
}

#[tokio::test]
async fn a_peer_that_stops_answering_pings_is_closed() {
    let app = spawn_app_with(|c| {
        c.server.idle_timeout = Duration::from_secs(3600);
        c.server.keepalive_interval = Duration::from_millis(200);
        c.server.keepalive_timeout = Duration::from_millis(200);
    })
    .await;
    let mut raw = RawConnection::open(
        tcp_from(Ipv4Addr::new(127, 0, 0, 2), app.addr)
            .await
            .unwrap(),
    )
    .await;
    // A request in progress, so that the connection is not idle, and then silence:
    // no ACK for the server's SETTINGS, none for its PINGs.
    raw.send(&frame(
        HEADERS,
        END_HEADERS,
        1,
        &h2raw::grpc_request_headers("/grpc.health.v1.Health/Watch"),
    ))
    .await;
    let mut pinged = false;
    loop {
        match raw.next_frame_within(Duration::from_secs(10)).await {
            Some((PING, _, _, _)) => pinged = true,
            Some(_) => continue,
            None => break,
        }
    }
    assert!(pinged, "the server pinged before closing");
}

#[tokio::test]
async fn connections_beyond_the_caps_are_closed_at_once() {
    // The test's own client holds one connection (from 127.0.0.1).
    let app = spawn_app_with(|c| {
        c.server.max_connections = 4;
        c.server.max_connections_per_client = Some(2);
    })
    .await;
    // Two connections from 127.0.0.2 are served …
    let mut kept = Vec::new();
    for _ in 0..2 {
        let mut raw = RawConnection::open(
            tcp_from(Ipv4Addr::new(127, 0, 0, 2), app.addr)
                .await
                .unwrap(),
        )
        .await;
        raw.server_settings().await;
        kept.push(raw);
    }
    // … a third from the same address is closed at once …
    let mut third = tcp_from(Ipv4Addr::new(127, 0, 0, 2), app.addr)
        .await
        .unwrap();
    h2raw::closed_within(&mut third, Duration::from_secs(10)).await;
    // … while another client still gets the last place.
    let mut other = RawConnection::open(
        tcp_from(Ipv4Addr::new(127, 0, 0, 3), app.addr)
            .await
            .unwrap(),
    )
    .await;
    other.server_settings().await;
    // Now the listener is full for everyone.
    let mut fourth = tcp_from(Ipv4Addr::new(127, 0, 0, 4), app.addr)
        .await
        .unwrap();
    h2raw::closed_within(&mut fourth, Duration::from_secs(10)).await;
    let text = app.handle.render_metrics();
    assert_eq!(
        metric(&text, r#"authd_connections_refused_total{listener="grpc"}"#),
        Some(2.0)
    );
    assert_eq!(
        metric(&text, r#"authd_connections_open{listener="grpc"}"#),
        Some(4.0)
    );
    // Closing one frees its place.
    drop(kept.pop());
    wait_until("the place is free", || {
        metric(
            &app.handle.render_metrics(),
            r#"authd_connections_open{listener="grpc"}"#,
        ) == Some(3.0)
    })
    .await;
    let mut again = RawConnection::open(
        tcp_from(Ipv4Addr::new(127, 0, 0, 4), app.addr)
            .await
            .unwrap(),
    )
    .await;
    again.server_settings().await;
}

#[tokio::test]
async fn a_flood_of_malformed_requests_ends_in_goaway() {
    let app = spawn_app_with(|_| {}).await;
    let raw = RawConnection::open(
        tcp_from(Ipv4Addr::new(127, 0, 0, 2), app.addr)
            .await
            .unwrap(),
    )
    .await;
    // HEADERS with no :path or :scheme: each is a malformed request that the server
    // answers with RST_STREAM, until it has had enough and sends GOAWAY.
    let malformed = h2raw::header_block(&[(":method", "POST")]);
    let RawConnection {
        mut reader,
        mut writer,
    } = raw;
    let writing = tokio::spawn(async move {
        for i in 0..5000u32 {
            let id = 1 + 2 * i;
            let bytes = frame(HEADERS, END_HEADERS | END_STREAM, id, &malformed);
            if writer.write_all(&bytes).await.is_err() {
                break; // the server closed the connection
            }
        }
    });
    let mut resets = 0;
    let mut goaway = false;
    while let Some((kind, _, _, _)) = reader.next(Duration::from_secs(20)).await {
        match kind {
            RST_STREAM => resets += 1,
            GOAWAY => {
                goaway = true;
                break;
            }
            _ => {}
        }
    }
    writing.abort();
    assert!(goaway, "no GOAWAY after {resets} resets");
    // The bound is 1024 resets (some may still be queued behind the GOAWAY).
    assert!(
        (100..=1100).contains(&resets),
        "GOAWAY after {resets} resets"
    );
    // The server itself carries on.
    let mut client = AuthServiceClient::new(channel_from("127.0.0.3", app.addr).await);
    crate::helpers::register(&mut client, "still-here", "a fine password")
        .await
        .unwrap();
}

#[test]
fn the_health_port_answers_while_the_main_runtime_cannot() {
    // The app runs on this test's single-threaded runtime; blocking that thread stops
    // everything served by it, the gRPC port included. The health port has a thread
    // and a runtime of its own, so it answers all the same.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let mut app = runtime.block_on(spawn_app_with(|_| {}));
    // Serving on the gRPC port means the health thread has started (it starts first).
    assert_eq!(
        runtime.block_on(app.health_status("")),
        ServingStatus::Serving
    );
    let health_addr = app.handle.health_addr().expect("a health port");
    let (answered, answer) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let probe = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let result = probe.block_on(async {
            let channel = Channel::from_shared(format!("http://{health_addr}"))?
                .connect()
                .await?;
            let mut health = HealthClient::new(channel);
            let status = health
                .check(HealthCheckRequest {
                    service: String::new(),
                })
                .await?
                .into_inner()
                .status;
            // The health port serves health only.
            let channel = Channel::from_shared(format!("http://{health_addr}"))?
                .connect()
                .await?;
            let auth = AuthServiceClient::new(channel)
                .validate_token(authd::pb::ValidateTokenRequest {
                    access_token: "x".into(),
                    ..Default::default()
                })
                .await
                .map(|_| ())
                .unwrap_err()
                .code();
            Ok::<_, Box<dyn std::error::Error + Send + Sync>>((status, auth))
        });
        let _ = answered.send(result.map_err(|e| e.to_string()));
    });
    // This thread (the app's runtime) is blocked until the probe has its answer.
    let (status, auth) = answer
        .recv_timeout(Duration::from_secs(30))
        .expect("the health port answers while the main runtime is blocked")
        .expect("the health check succeeds");
    assert_eq!(status, ServingStatus::Serving as i32);
    assert_eq!(auth, Code::Unimplemented);
    // It runs on a thread of its own, named for what it does.
    let threads = std::fs::read_dir("/proc/self/task").unwrap();
    let names: Vec<String> = threads
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
        .collect();
    assert!(
        names.iter().any(|n| n.trim() == "authd-health"),
        "{names:?}"
    );
    runtime.block_on(app.stop()).unwrap();
}

#[tokio::test]
async fn accept_failures_back_off_instead_of_spinning() {
    // 128 descriptors in all: the gRPC port's cap is fitted below that, but the
    // metrics port (whose cap is 128) runs the process out of descriptors, and its
    // accept fails with EMFILE for as long as the connections stay open.
    let dir = tempfile::tempdir().unwrap();
    let mut prlimit = std::process::Command::new("prlimit");
    prlimit
        .args(["--nofile=128:128", "--"])
        .arg(env!("CARGO_BIN_EXE_authd"));
    for (key, _) in std::env::vars_os() {
        let key_text = key.to_string_lossy();
        if key_text.starts_with("AUTHD_") || key_text.starts_with("OTEL_") {
            prlimit.env_remove(key);
        }
    }
    let mut running = crate::cli::spawn_authd_command(prlimit, dir.path(), &[]);
    let metrics_addr: SocketAddr = running.metrics_addr.parse().unwrap();
    let mut held = Vec::new();
    for _ in 0..200 {
        match tokio::time::timeout(
            Duration::from_secs(2),
            tokio::net::TcpStream::connect(metrics_addr),
        )
        .await
        {
            Ok(Ok(stream)) => held.push(stream),
            _ => break,
        }
    }
    // Out of descriptors until the server says it backs off (how often it then
    // tries is the back-off's own unit test, counted rather than timed).
    let warned = running.wait_for_log("cannot accept connections");
    assert_eq!(warned["listener"], "metrics", "{warned}");
    drop(held);
    let (head, body) = http_get_retrying(metrics_addr).await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    let failures = metric(
        &body,
        r#"authd_connections_accept_errors_total{listener="metrics"}"#,
    )
    .expect("the accept error counter");
    assert!(failures >= 1.0, "the descriptors never ran out");
    // And the gRPC port, whose cap kept it within the limit, still serves.
    let mut client = running.client().await;
    crate::helpers::register(&mut client, "survivor", "a fine password")
        .await
        .unwrap();
    let (status, _) = running.terminate().await;
    assert!(status.success());
}

/// `GET /metrics`, retried while the server is still backing off.
async fn http_get_retrying(addr: SocketAddr) -> (String, String) {
    use tokio::io::AsyncReadExt as _;
    crate::helpers::wait_for("the metrics port answers again", || async {
        let mut stream = tokio::net::TcpStream::connect(addr).await.ok()?;
        let request = format!("GET /metrics HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
        stream.write_all(request.as_bytes()).await.ok()?;
        let mut raw = Vec::new();
        stream.read_to_end(&mut raw).await.ok()?;
        let text = String::from_utf8(raw).unwrap();
        let (head, body) = text.split_once("\r\n\r\n")?;
        Some((head.to_owned(), body.to_owned()))
    })
    .await
}
