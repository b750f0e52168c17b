//! gRPC-Web (binary and text, over HTTP/1.1 and HTTP/2) on the gRPC port, and one
//! table-driven test: every RPC of auth.v1, successes and errors, called over gRPC,
//! gRPC-Web and JSON gives the same answers (the same fields, flags and counts; the
//! tokens and ids are each call's own) and the same errors (code, message and the
//! types of their details).
//!
//! [`call`] makes one unary call in any of the protocols from the same typed request:
//! gRPC with tonic's client, gRPC-Web framed here, JSON through the message's proto3
//! JSON form (prost-reflect over the service's descriptor set).

use crate::{
    helpers::{TestApp, TestDb, metric_of},
    http_json::{Reply, Version, metrics_text, send},
    totp::{K1, PASSWORD, app_on, base32_decode, code_at, now},
};
use authd::{ManualClock, pb};
use base64::Engine as _;
use bytes::{Buf as _, BufMut as _, Bytes, BytesMut};
use http::{HeaderMap, HeaderName, HeaderValue, Request};
use http_body_util::Full;
use prost::Message;
use prost_reflect::{DescriptorPool, DynamicMessage};
use serde_json::{Value, json};
use std::{sync::Arc, time::Duration};
use tonic::{Code, Status};

/// The protocols a call can be made in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wire {
    Grpc,
    GrpcWeb,
    GrpcWebText,
    Json,
}

/// What an error says, in any protocol: the code, the message, the details' types.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    pub code: Code,
    pub message: String,
    pub details: Vec<String>,
}

impl Refusal {
    fn of(status: &Status) -> Self {
        let details = tonic_types::pb::Status::decode(status.details())
            .map(|s| {
                s.details
                    .into_iter()
                    .map(|d| type_name(&d.type_url))
                    .collect()
            })
            .unwrap_or_default();
        Self {
            code: status.code(),
            message: status.message().to_owned(),
            details,
        }
    }
}

fn type_name(url: &str) -> String {
    url.rsplit('/').next().unwrap().to_owned()
}

/// Calls `method` of AuthService on `addr` with `request` in `wire`.
pub async fn call<Req, Resp>(
    addr: std::net::SocketAddr,
    wire: Wire,
    method: &str,
    request: Req,
) -> Result<Resp, Refusal>
where
    Req: Message + Send + Sync + 'static,
    Resp: Message + Default + Send + Sync + 'static,
{
    call_with(addr, wire, method, request, HeaderMap::new()).await
}

/// [`call`] with extra request headers (metadata).
pub async fn call_with<Req, Resp>(
    addr: std::net::SocketAddr,
    wire: Wire,
    method: &str,
    request: Req,
    headers: HeaderMap,
) -> Result<Resp, Refusal>
where
    Req: Message + Send + Sync + 'static,
    Resp: Message + Default + Send + Sync + 'static,
{
    let path = format!("/auth.v1.AuthService/{method}");
    match wire {
        Wire::Grpc => {
            let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
                .unwrap()
                .connect()
                .await
                .unwrap();
            let mut grpc = tonic::client::Grpc::new(channel);
            grpc.ready().await.unwrap();
            let mut request = tonic::Request::new(request);
            *request.metadata_mut() = tonic::metadata::MetadataMap::from_headers(headers);
            grpc.unary(
                request,
                path.parse().unwrap(),
                tonic_prost::ProstCodec::<Req, Resp>::default(),
            )
            .await
            .map(tonic::Response::into_inner)
            .map_err(|status| Refusal::of(&status))
        }
        Wire::GrpcWeb | Wire::GrpcWebText => {
            let text = wire == Wire::GrpcWebText;
            let reply = grpc_web(
                addr,
                Version::H1,
                &path,
                &request.encode_to_vec(),
                text,
                headers,
            )
            .await;
            match reply {
                (Some(message), status) if status.code() == Code::Ok => {
                    Ok(Resp::decode(message).unwrap())
                }
                (_, status) => Err(Refusal::of(&status)),
            }
        }
        Wire::Json => {
            let pool = DescriptorPool::decode(pb::FILE_DESCRIPTOR_SET).unwrap();
            let service = pool.get_service_by_name("auth.v1.AuthService").unwrap();
            let rpc = service.methods().find(|m| m.name() == method).unwrap();
            let input =
                DynamicMessage::decode(rpc.input(), request.encode_to_vec().as_slice()).unwrap();
            let mut builder = Request::post(format!("http://localhost{path}"))
                .header("content-type", "application/json");
            for (name, value) in &headers {
                builder = builder.header(name, value);
            }
            let body = serde_json::to_vec(&input).unwrap();
            let reply = send(
                addr,
                Version::H1,
                builder.body(Full::new(body.into())).unwrap(),
            )
            .await;
            if reply.status == 200 {
                let mut de = serde_json::Deserializer::from_slice(&reply.body);
                let output = DynamicMessage::deserialize(rpc.output(), &mut de).unwrap();
                return Ok(Resp::decode(output.encode_to_vec().as_slice()).unwrap());
            }
            Err(json_refusal(&reply))
        }
    }
}

/// The gRPC code of Connect's code name (the tests' own table).
fn code_of_name(name: &str) -> Code {
    let names = [
        "ok",
        "canceled",
        "unknown",
        "invalid_argument",
        "deadline_exceeded",
        "not_found",
        "already_exists",
        "permission_denied",
        "resource_exhausted",
        "failed_precondition",
        "aborted",
        "out_of_range",
        "unimplemented",
        "internal",
        "unavailable",
        "data_loss",
        "unauthenticated",
    ];
    let n = names
        .iter()
        .position(|n| *n == name)
        .unwrap_or_else(|| panic!("{name}"));
    Code::from_i32(n as i32)
}

/// The error of a JSON answer.
pub fn json_refusal(reply: &Reply) -> Refusal {
    let body = reply.json();
    Refusal {
        code: code_of_name(body["code"].as_str().unwrap()),
        message: body["message"].as_str().unwrap_or_default().to_owned(),
        details: body["details"]
            .as_array()
            .map(|list| {
                list.iter()
                    .map(|d| d["type"].as_str().unwrap().to_owned())
                    .collect()
            })
            .unwrap_or_default(),
    }
}

/// One gRPC-Web call: the message of the answer (if any) and its status (from the
/// headers when trailers-only, else from the trailer frame).
pub async fn grpc_web(
    addr: std::net::SocketAddr,
    version: Version,
    path: &str,
    message: &[u8],
    text: bool,
    headers: HeaderMap,
) -> (Option<Bytes>, Status) {
    let mut framed = BytesMut::new();
    framed.put_u8(0);
    framed.put_u32(message.len() as u32);
    framed.put_slice(message);
    let (content_type, body) = match text {
        false => ("application/grpc-web+proto", framed.freeze()),
        true => (
            "application/grpc-web-text",
            Bytes::from(base64::engine::general_purpose::STANDARD.encode(&framed)),
        ),
    };
    let mut builder = Request::post(format!("http://localhost{path}"))
        .header("content-type", content_type)
        .header("accept", content_type)
        .header("x-grpc-web", "1");
    for (name, value) in &headers {
        builder = builder.header(name, value);
    }
    let reply = send(addr, version, builder.body(Full::new(body)).unwrap()).await;
    assert_eq!(reply.status, 200, "{reply:?}");
    let answered = reply.header("content-type").unwrap_or_default();
    assert!(
        answered.starts_with(content_type.split('+').next().unwrap()),
        "{reply:?}"
    );
    let mut body = if text {
        // Each piece the server sent is base64 of its own, padded: decode by quanta.
        let mut out = Vec::new();
        for quantum in reply.body.chunks(4) {
            out.extend(
                base64::engine::general_purpose::STANDARD
                    .decode(quantum)
                    .unwrap(),
            );
        }
        Bytes::from(out)
    } else {
        reply.body.clone()
    };
    let mut message = None;
    let mut trailers = reply.headers.clone();
    while body.remaining() >= 5 {
        let flag = body.get_u8();
        let len = body.get_u32() as usize;
        let payload = body.split_to(len);
        if flag & 0x80 == 0 {
            message = Some(payload);
        } else {
            for line in std::str::from_utf8(&payload).unwrap().split("\r\n") {
                if let Some((name, value)) = line.split_once(':') {
                    trailers.insert(
                        HeaderName::from_bytes(name.trim().as_bytes()).unwrap(),
                        HeaderValue::from_str(value.trim()).unwrap(),
                    );
                }
            }
        }
    }
    let status = Status::from_header_map(&trailers).expect("a grpc-status");
    (message, status)
}

#[tokio::test]
async fn grpc_web_binary_and_text_over_http1_and_http2() {
    let app = crate::helpers::spawn_app().await;
    let register = pb::RegisterRequest {
        username: "webuser".into(),
        password: PASSWORD.into(),
    };
    let (message, status) = grpc_web(
        app.addr,
        Version::H2,
        "/auth.v1.AuthService/Register",
        &register.encode_to_vec(),
        false,
        HeaderMap::new(),
    )
    .await;
    assert_eq!(status.code(), Code::Ok, "{status:?}");
    let user_id = pb::RegisterResponse::decode(message.unwrap())
        .unwrap()
        .user_id;
    for (version, text) in [
        (Version::H1, false),
        (Version::H1, true),
        (Version::H2, true),
    ] {
        let login = pb::LoginRequest {
            username: "webuser".into(),
            password: PASSWORD.into(),
        };
        let (message, status) = grpc_web(
            app.addr,
            version,
            "/auth.v1.AuthService/Login",
            &login.encode_to_vec(),
            text,
            HeaderMap::new(),
        )
        .await;
        assert_eq!(status.code(), Code::Ok, "{version:?} {text}: {status:?}");
        let answer = pb::LoginResponse::decode(message.unwrap()).unwrap();
        assert_eq!(answer.user_id, user_id);
        assert!(!answer.access_token.is_empty());
    }
    // An error carries its details in the trailers, as over gRPC.
    let bad = pb::RegisterRequest {
        username: "x".into(),
        password: PASSWORD.into(),
    };
    let (message, status) = grpc_web(
        app.addr,
        Version::H1,
        "/auth.v1.AuthService/Register",
        &bad.encode_to_vec(),
        true,
        HeaderMap::new(),
    )
    .await;
    assert!(message.is_none());
    assert_eq!(status.code(), Code::InvalidArgument);
    assert_eq!(Refusal::of(&status).details, ["google.rpc.BadRequest"]);
    let text = metrics_text(&app).await;
    assert_eq!(
        metric_of(
            &text,
            r#"authd_grpc_requests_total{code="OK",method="Login",protocol="grpc-web",service="auth.v1.AuthService"}"#
        ),
        3.0
    );
    app.stop().await.unwrap();
}

/// An answer with what differs from one call to the next masked: every non-empty
/// string (tokens, ids, times) is `"<set>"`; flags, counts and list lengths stay.
fn shape<M: Message + Default>(pool: &DescriptorPool, name: &str, message: &M) -> Value {
    fn mask(value: Value) -> Value {
        match value {
            Value::String(s) if s.is_empty() => Value::String(s),
            Value::String(_) => json!("<set>"),
            Value::Array(items) => Value::Array(items.into_iter().map(mask).collect()),
            Value::Object(map) => {
                Value::Object(map.into_iter().map(|(k, v)| (k, mask(v))).collect())
            }
            other => other,
        }
    }
    let desc = pool.get_message_by_name(name).unwrap();
    let dynamic = DynamicMessage::decode(desc, message.encode_to_vec().as_slice()).unwrap();
    mask(serde_json::to_value(&dynamic).unwrap())
}

/// Every step of the session of one user, in one protocol: each RPC of auth.v1,
/// its successes and its errors, as a list of (step, outcome).
async fn session(
    app: &TestApp,
    clock: &ManualClock,
    wire: Wire,
) -> Vec<(String, Result<Value, Refusal>)> {
    let pool = DescriptorPool::decode(pb::FILE_DESCRIPTOR_SET).unwrap();
    let addr = app.addr;
    let name = format!("same{}", format!("{wire:?}").to_lowercase());
    let mut steps = Vec::new();
    macro_rules! step {
        ($label:expr, $method:literal, $request:expr, $response:ty) => {{
            let result: Result<$response, Refusal> = call(addr, wire, $method, $request).await;
            let outcome = result
                .as_ref()
                .map(|r| shape(&pool, concat!("auth.v1.", stringify!($response)), r))
                .map_err(Clone::clone);
            steps.push(($label.to_string(), outcome));
            result
        }};
    }
    use pb::*;
    let login = || LoginRequest {
        username: name.clone(),
        password: PASSWORD.into(),
    };

    let _ = step!(
        "register: bad name",
        "Register",
        RegisterRequest {
            username: "x".into(),
            password: PASSWORD.into()
        },
        RegisterResponse
    );
    let _ = step!(
        "register: common password",
        "Register",
        RegisterRequest {
            username: name.clone(),
            password: "password".into()
        },
        RegisterResponse
    );
    step!(
        "register",
        "Register",
        RegisterRequest {
            username: name.clone(),
            password: PASSWORD.into()
        },
        RegisterResponse
    )
    .unwrap();
    let _ = step!(
        "register: taken",
        "Register",
        RegisterRequest {
            username: name.clone(),
            password: PASSWORD.into()
        },
        RegisterResponse
    );
    let _ = step!(
        "login: wrong password",
        "Login",
        LoginRequest {
            username: name.clone(),
            password: "not the password".into()
        },
        LoginResponse
    );
    let first = step!("login", "Login", login(), LoginResponse).unwrap();
    step!(
        "validate",
        "ValidateToken",
        ValidateTokenRequest {
            access_token: first.access_token.clone(),
            ..Default::default()
        },
        ValidateTokenResponse
    )
    .unwrap();
    let _ = step!(
        "validate: garbage",
        "ValidateToken",
        ValidateTokenRequest {
            access_token: "not.a.token".into(),
            ..Default::default()
        },
        ValidateTokenResponse
    );
    let _ = step!(
        "validate: empty",
        "ValidateToken",
        ValidateTokenRequest::default(),
        ValidateTokenResponse
    );
    let refreshed = step!(
        "refresh",
        "Refresh",
        RefreshRequest {
            refresh_token: first.refresh_token.clone()
        },
        RefreshResponse
    )
    .unwrap();
    // Past the retry grace (10 s), a rotated token's reuse ends its session.
    clock.advance(Duration::from_secs(11));
    let _ = step!(
        "refresh: reused",
        "Refresh",
        RefreshRequest {
            refresh_token: first.refresh_token.clone()
        },
        RefreshResponse
    );
    let _ = refreshed;
    step!(
        "signing keys",
        "GetSigningKeys",
        GetSigningKeysRequest::default(),
        GetSigningKeysResponse
    )
    .unwrap();

    let session = step!("login again", "Login", login(), LoginResponse).unwrap();
    let token = session.access_token.clone();
    let begun = step!(
        "begin enrollment",
        "BeginTotpEnrollment",
        BeginTotpEnrollmentRequest {
            access_token: token.clone()
        },
        BeginTotpEnrollmentResponse
    )
    .unwrap();
    let secret = base32_decode(&begun.secret);
    let _ = step!(
        "confirm: wrong code",
        "ConfirmTotpEnrollment",
        ConfirmTotpEnrollmentRequest {
            access_token: token.clone(),
            code: "000000x".into()
        },
        ConfirmTotpEnrollmentResponse
    );
    let confirmed = step!(
        "confirm",
        "ConfirmTotpEnrollment",
        ConfirmTotpEnrollmentRequest {
            access_token: token.clone(),
            code: code_at(&secret, now(clock))
        },
        ConfirmTotpEnrollmentResponse
    )
    .unwrap();
    let challenged = step!("login: challenge", "Login", login(), LoginResponse).unwrap();
    let _ = step!(
        "complete: wrong code",
        "CompleteLogin",
        CompleteLoginRequest {
            challenge: challenged.challenge.clone(),
            code: "123".into()
        },
        CompleteLoginResponse
    );
    let challenged = step!("login: challenge again", "Login", login(), LoginResponse).unwrap();
    let completed = step!(
        "complete",
        "CompleteLogin",
        CompleteLoginRequest {
            challenge: challenged.challenge.clone(),
            code: confirmed.recovery_codes[0].clone()
        },
        CompleteLoginResponse
    )
    .unwrap();
    // The enrollment's code is spent: the next step's.
    let code = code_at(&secret, now(clock) + 30);
    step!(
        "new recovery codes",
        "RegenerateRecoveryCodes",
        RegenerateRecoveryCodesRequest {
            access_token: completed.access_token.clone(),
            code: code.clone()
        },
        RegenerateRecoveryCodesResponse
    )
    .unwrap();
    let _ = step!(
        "disable: used code",
        "DisableTotp",
        DisableTotpRequest {
            access_token: completed.access_token.clone(),
            code
        },
        DisableTotpResponse
    );

    let _ = step!(
        "logout: empty",
        "Logout",
        LogoutRequest::default(),
        LogoutResponse
    );
    step!(
        "logout",
        "Logout",
        LogoutRequest {
            access_token: completed.access_token.clone(),
            all_sessions: true,
            ..Default::default()
        },
        LogoutResponse
    )
    .unwrap();
    let _ = step!(
        "change password: wrong",
        "ChangePassword",
        ChangePasswordRequest {
            username: name.clone(),
            current_password: "nope nope nope".into(),
            new_password: "another fine password".into()
        },
        ChangePasswordResponse
    );
    step!(
        "change password",
        "ChangePassword",
        ChangePasswordRequest {
            username: name.clone(),
            current_password: PASSWORD.into(),
            new_password: "another fine password".into()
        },
        ChangePasswordResponse
    )
    .unwrap();
    // The factor is still on: a challenge.
    step!(
        "login: new password",
        "Login",
        LoginRequest {
            username: name.clone(),
            password: "another fine password".into()
        },
        LoginResponse
    )
    .unwrap();
    steps
}

#[tokio::test]
async fn every_rpc_answers_the_same_over_grpc_grpc_web_and_json() {
    let db = TestDb::new(crate::helpers::Backend::Sqlite, "")
        .await
        .unwrap();
    let clock = Arc::new(ManualClock::new());
    let app = app_on(&db, K1, &clock, |_| {}).await;
    let grpc = session(&app, &clock, Wire::Grpc).await;
    // Every step answered as the proto says, the errors included.
    let failed: Vec<_> = grpc
        .iter()
        .filter(|(_, r)| r.is_err())
        .map(|(s, _)| s.as_str())
        .collect();
    assert_eq!(
        failed,
        [
            "register: bad name",
            "register: common password",
            "register: taken",
            "login: wrong password",
            "validate: garbage",
            "validate: empty",
            "refresh: reused",
            "confirm: wrong code",
            "complete: wrong code",
            "disable: used code",
            "logout: empty",
            "change password: wrong"
        ],
        "{grpc:#?}"
    );
    for wire in [Wire::GrpcWeb, Wire::GrpcWebText, Wire::Json] {
        clock.advance(Duration::from_secs(60));
        let other = session(&app, &clock, wire).await;
        assert_eq!(grpc.len(), other.len());
        for (a, b) in grpc.iter().zip(&other) {
            assert_eq!(a, b, "{wire:?}");
        }
    }
    app.stop().await.unwrap();
}
