//! Input at the edge of the wire: a request that is not a valid protobuf message,
//! and the username and password rules that normalization could slip past.

use crate::helpers::{TestDb, expect_code, spawn_app, spawn_app_on, violations};
use authd::pb::LoginResponse;
use tonic::{Code, Request, codegen::http::uri::PathAndQuery, transport::Channel};

/// A LoginRequest look-alike whose `password` (field 2) is raw bytes, so the test
/// can put invalid UTF-8 where the server expects a string.
#[derive(Clone, PartialEq, prost::Message)]
struct RawLogin {
    #[prost(string, tag = "1")]
    username: String,
    #[prost(bytes = "vec", tag = "2")]
    password: Vec<u8>,
}

/// Sends `message` to `path` with prost's codec, as any client would.
async fn send_raw(
    channel: Channel,
    path: &'static str,
    message: RawLogin,
) -> Result<LoginResponse, tonic::Status> {
    let mut grpc = tonic::client::Grpc::new(channel);
    grpc.ready().await.expect("the channel is ready");
    let codec = tonic_prost::ProstCodec::<RawLogin, LoginResponse>::default();
    grpc.unary(
        Request::new(message),
        PathAndQuery::from_static(path),
        codec,
    )
    .await
    .map(|r| r.into_inner())
}

#[tokio::test]
async fn a_malformed_message_is_an_invalid_argument_with_a_generic_message() {
    let mut app = spawn_app().await;
    let malformed = RawLogin {
        username: "mallory".into(),
        password: vec![0xff, 0xfe, b'x'],
    };
    for path in [
        "/auth.v1.AuthService/Login",
        "/auth.v1.AuthService/Register",
    ] {
        let status = expect_code(
            send_raw(app.channel().await, path, malformed.clone()).await,
            Code::InvalidArgument,
        );
        assert_eq!(status.message(), "malformed request message", "{path}");
        assert!(!status.message().contains("password"), "{status:?}");
    }
    let metrics = app.handle.render_metrics();
    for method in ["Login", "Register"] {
        let line = format!(
            r#"authd_grpc_requests_total{{code="INVALID_ARGUMENT",method="{method}",protocol="grpc",service="auth.v1.AuthService"}} 1"#
        );
        assert!(metrics.contains(&line), "{line} missing in:\n{metrics}");
    }
    // Every (method, code) series exists from the start: INTERNAL ones stay at 0.
    assert!(
        metrics
            .lines()
            .filter(
                |l| l.starts_with("authd_grpc_requests_total{") && l.contains(r#"code="INTERNAL""#)
            )
            .all(|l| l.ends_with(" 0")),
        "a malformed request counted as internal:\n{metrics}"
    );
    // The same bytes as valid UTF-8 are an ordinary request, and the server carries on.
    let wellformed = RawLogin {
        username: "mallory".into(),
        password: b"a fine password".to_vec(),
    };
    let status = expect_code(
        send_raw(
            app.channel().await,
            "/auth.v1.AuthService/Login",
            wellformed,
        )
        .await,
        Code::Unauthenticated,
    );
    assert_eq!(status.message(), "invalid username or password");
    app.register("mallory", "a fine password").await.unwrap();
}

async fn a_password_short_before_normalization_is_refused(db: TestDb) {
    let mut app = spawn_app_on(&db, |_| {}).await;
    // U+FDFA is one code point that NFKC expands to 18.
    let one_character = "\u{FDFA}";
    let status = expect_code(
        app.register("sallah", one_character).await,
        Code::InvalidArgument,
    );
    let found = violations(&status);
    assert_eq!(found.len(), 1, "{found:?}");
    assert_eq!(found[0].0, "password");
    assert!(found[0].1.contains("at least 8 characters"), "{found:?}");
    assert!(!status.message().contains(one_character), "{status:?}");
    // Eight of them are long enough both ways.
    app.register("sallah", &one_character.repeat(8))
        .await
        .unwrap();
}

async fn a_username_without_a_letter_or_digit_is_refused(db: TestDb) {
    let mut app = spawn_app_on(&db, |_| {}).await;
    for bad in ["...", "---", "___", "._-"] {
        let status = expect_code(
            app.register(bad, "a fine password").await,
            Code::InvalidArgument,
        );
        let found = violations(&status);
        assert_eq!(found.len(), 1, "{bad:?}: {found:?}");
        assert_eq!(found[0].0, "username");
        assert!(found[0].1.contains("letter A-Z or digit"), "{found:?}");
    }
    app.register("a.-_", "a fine password").await.unwrap();
    app.register("._7", "a fine password").await.unwrap();
}

crate::backend_tests!(
    a_password_short_before_normalization_is_refused,
    a_username_without_a_letter_or_digit_is_refused,
);

/// The longest `grpc-timeout` a client can send (8 digits of hours, some 11,000
/// years) is a deadline like any other: no overflow, the request is answered.
#[tokio::test]
async fn the_longest_deadline_a_client_can_send_is_answered() {
    let mut app = spawn_app().await;
    app.register("nina", "a fine password").await.unwrap();
    for timeout in ["99999999H", "99999999M", "99999999S"] {
        let mut request = Request::new(authd::pb::LoginRequest {
            username: "nina".into(),
            password: "a fine password".into(),
        });
        request
            .metadata_mut()
            .insert("grpc-timeout", timeout.parse().unwrap());
        let session = app.client.login(request).await;
        assert!(session.is_ok(), "grpc-timeout {timeout}: {session:?}");
    }
    app.register("nina2", "a fine password").await.unwrap();
}
