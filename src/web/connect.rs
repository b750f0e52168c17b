//! Connect's unary calls (`POST /<package.Service>/<Method>`, a JSON or protobuf
//! body) translated to a gRPC request for the port's layered gRPC service, and its
//! answer translated back.
//!
//! The request: its body is read whole, within the receive timeout (and its
//! deadline) and at most [`Api::max_body_bytes`](super::Api) (refused otherwise with
//! the codes gRPC gets for the same, before the layers: a debug line is their only
//! record), decoded from proto3 JSON
//! against the method's input descriptor (unknown fields ignored, as Connect's own
//! servers do, so newer clients keep working), re-encoded as protobuf and framed as
//! gRPC. A body that does not decode goes on as a protobuf message that does not
//! decode either, so it is refused, counted, logged and limited exactly as a
//! malformed gRPC request (INVALID_ARGUMENT, one generic message, never the input).
//! `Connect-Timeout-Ms` becomes `grpc-timeout`; the other headers go on as metadata
//! (`authorization`, `x-request-id`, …), the request's extensions (its connection,
//! client, identity) unchanged.
//!
//! The answer: status OK is 200 and the message in proto3 JSON (lowerCamelCase
//! names, defaults omitted), or protobuf for a protobuf request; any other status is
//! Connect's error form (`super::errors`). Response metadata goes out as headers,
//! trailing metadata as `trailer-` headers, as Connect's unary calls carry them.

use super::{Api, errors};
use crate::{codec::MALFORMED_REQUEST, error::Error, rpc::Protocol};
use bytes::{BufMut as _, Bytes, BytesMut};
use http::{HeaderMap, HeaderName, HeaderValue, StatusCode, header};
use http_body_util::{BodyExt as _, Full, Limited};
use prost::Message as _;
use prost_reflect::{DeserializeOptions, DynamicMessage, MethodDescriptor};
use std::{convert::Infallible, time::Duration};
use tonic::{Status, body::Body};
use tower::{Service, ServiceExt as _};

/// The body's encoding, from its `content-type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Codec {
    Json,
    Proto,
}

impl Codec {
    /// The codec of a `content-type`, if it is one Connect's unary calls use.
    pub(super) fn of(headers: &HeaderMap) -> Option<Codec> {
        let value = headers.get(header::CONTENT_TYPE)?.to_str().ok()?;
        let media = value.split(';').next()?.trim();
        if media.eq_ignore_ascii_case("application/json") {
            Some(Codec::Json)
        } else if media.eq_ignore_ascii_case("application/proto") {
            Some(Codec::Proto)
        } else {
            None
        }
    }

    fn content_type(self) -> HeaderValue {
        match self {
            Codec::Json => HeaderValue::from_static(errors::JSON),
            Codec::Proto => HeaderValue::from_static("application/proto"),
        }
    }
}

/// The header of a gRPC message: a flag byte (uncompressed) and a 4-byte length.
const FRAME_HEADER: usize = 5;

/// A protobuf message that never decodes: field 1 with wire type 7, which does not
/// exist. It stands for a JSON body that did not decode.
const UNDECODABLE: &[u8] = &[0x0f];

/// Headers of the Connect request that are not metadata for the gRPC call.
const NOT_METADATA: [&str; 7] = [
    "connect-protocol-version",
    "connect-timeout-ms",
    "content-length",
    "accept-encoding",
    "grpc-encoding",
    "grpc-accept-encoding",
    "transfer-encoding",
];

/// Serves one Connect unary call of `method` through `grpc`.
pub(super) async fn call<S, B>(
    api: &Api,
    method: MethodDescriptor,
    codec: Codec,
    grpc: S,
    request: http::Request<B>,
) -> http::Response<Body>
where
    S: Service<http::Request<Body>, Response = http::Response<Body>, Error = Infallible>,
    B: http_body::Body<Data = Bytes>,
    B::Error: Into<tower::BoxError>,
{
    let (mut parts, body) = request.into_parts();
    if parts
        .headers
        .get(header::CONTENT_ENCODING)
        .is_some_and(|e| e != "identity")
    {
        return error(
            api,
            &Status::unimplemented("compressed requests are not supported"),
        );
    }
    let timeout = match connect_timeout(&parts.headers) {
        Ok(timeout) => timeout,
        Err(status) => return error(api, &status),
    };
    // tokio's time: the runtime's timers, paused and driven by tests.
    let arrived = tokio::time::Instant::now();
    let receive_by = arrived + timeout.map_or(api.receive_timeout, |t| t.min(api.receive_timeout));
    let limited = Limited::new(body, api.max_body_bytes);
    let refused = match tokio::time::timeout_at(receive_by, limited.collect()).await {
        Ok(Ok(collected)) => Ok(collected.to_bytes()),
        Err(_) if timeout.is_some_and(|t| arrived + t <= receive_by) => {
            Err(Error::DeadlineExceeded)
        }
        Err(_) => Err(Error::ReceiveTimeout),
        Ok(Err(e)) if e.is::<http_body_util::LengthLimitError>() => Err(Error::TooLarge {
            limit: api.max_body_bytes,
        }),
        Ok(Err(_)) => Err(Error::Cancelled),
    };
    let bytes = match refused {
        Ok(bytes) => bytes,
        Err(refusal) => {
            // Answered before the layers: this line is its only record.
            let path = parts.uri.path();
            tracing::debug!(path, error = %refusal, "JSON request refused before the call");
            return error(api, &refusal.to_status());
        }
    };
    let message = match codec {
        Codec::Proto => bytes,
        Codec::Json => match from_json(method.input(), &bytes) {
            Some(message) => message.encode_to_vec().into(),
            None => Bytes::from_static(UNDECODABLE),
        },
    };

    let headers = &mut parts.headers;
    for name in NOT_METADATA {
        headers.remove(name);
    }
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/grpc"),
    );
    headers.insert(header::TE, HeaderValue::from_static("trailers"));
    if let Some(timeout) = timeout {
        // Milliseconds, as sent (at most 10 digits: within grpc-timeout's 8 in seconds).
        let value = grpc_timeout(timeout);
        headers.insert("grpc-timeout", value);
    }
    parts.extensions.insert(Protocol::Json);
    let mut framed = BytesMut::with_capacity(FRAME_HEADER + message.len());
    framed.put_u8(0);
    framed.put_u32(u32::try_from(message.len()).unwrap_or(u32::MAX));
    framed.put_slice(&message);
    let request = http::Request::from_parts(parts, Body::new(Full::new(framed.freeze())));

    let Ok(response) = grpc.oneshot(request).await;
    let (parts, body) = response.into_parts();
    let Ok(collected) = body.collect().await else {
        return error(api, &Status::internal("internal error"));
    };
    let trailers = collected.trailers().cloned().unwrap_or_default();
    let data = collected.to_bytes();
    let status = Status::from_header_map(&parts.headers)
        .or_else(|| Status::from_header_map(&trailers))
        .unwrap_or_else(|| Status::internal("internal error"));
    if status.code() != tonic::Code::Ok {
        let mut answer = error(api, &status);
        copy_metadata(&parts.headers, answer.headers_mut(), "");
        return answer;
    }
    let Some(payload) = data.get(FRAME_HEADER..).filter(|_| data[0] == 0) else {
        return error(api, &Status::internal("internal error"));
    };
    let body = match codec {
        Codec::Proto => payload.to_vec(),
        Codec::Json => match to_json(method.output(), payload) {
            Some(json) => json,
            None => return error(api, &Status::internal("internal error")),
        },
    };
    let mut answer = http::Response::new(Body::new(Full::new(Bytes::from(body))));
    *answer.status_mut() = StatusCode::OK;
    answer
        .headers_mut()
        .insert(header::CONTENT_TYPE, codec.content_type());
    copy_metadata(&parts.headers, answer.headers_mut(), "");
    copy_metadata(&trailers, answer.headers_mut(), "trailer-");
    answer
}

/// A Connect error answer for `status`.
pub(super) fn error(api: &Api, status: &Status) -> http::Response<Body> {
    errors::response(status, &api.details).map(|body| Body::new(Full::new(Bytes::from(body))))
}

/// The call's timeout: `Connect-Timeout-Ms` (at most 10 digits, as Connect allows),
/// else a `grpc-timeout` sent as is, else none (the server's maximum wait applies).
fn connect_timeout(headers: &HeaderMap) -> Result<Option<Duration>, Status> {
    let Some(value) = headers.get("connect-timeout-ms") else {
        return Ok(crate::rpc::grpc_timeout(headers));
    };
    let text = value.to_str().unwrap_or_default();
    match text.parse::<u64>() {
        Ok(ms) if (1..=10).contains(&text.len()) => Ok(Some(Duration::from_millis(ms))),
        _ => Err(Status::invalid_argument("invalid connect-timeout-ms")),
    }
}

/// `timeout` as a `grpc-timeout` value (milliseconds, or seconds when longer than
/// 8 digits of milliseconds).
fn grpc_timeout(timeout: Duration) -> HeaderValue {
    let ms = timeout.as_millis();
    let text = if ms < 100_000_000 {
        format!("{ms}m")
    } else {
        format!("{}S", timeout.as_secs().min(99_999_999))
    };
    HeaderValue::from_str(&text).expect("digits and a unit")
}

/// The request `message` decoded from proto3 JSON, or `None` (the reason at debug
/// level only: it may quote the input).
fn from_json(desc: prost_reflect::MessageDescriptor, json: &[u8]) -> Option<DynamicMessage> {
    let options = DeserializeOptions::new().deny_unknown_fields(false);
    let mut deserializer = serde_json::Deserializer::from_slice(json);
    let decoded = DynamicMessage::deserialize_with_options(desc, &mut deserializer, &options)
        .and_then(|message| deserializer.end().map(|()| message));
    match decoded {
        Ok(message) => Some(message),
        Err(e) => {
            tracing::debug!(error = %e, "{MALFORMED_REQUEST} (JSON)");
            None
        }
    }
}

/// A response message in proto3 JSON.
fn to_json(desc: prost_reflect::MessageDescriptor, payload: &[u8]) -> Option<Vec<u8>> {
    let message = DynamicMessage::decode(desc, payload).ok()?;
    serde_json::to_vec(&message).ok()
}

/// Copies the metadata of a gRPC answer (not its own protocol's headers) into the
/// Connect answer's headers, each name prefixed with `prefix`.
fn copy_metadata(from: &HeaderMap, to: &mut HeaderMap, prefix: &str) {
    for (name, value) in from {
        let name = name.as_str();
        if name.starts_with("grpc-")
            || name == "content-type"
            || name == "content-length"
            || name.ends_with("-bin")
        {
            continue;
        }
        let name = if prefix.is_empty() {
            HeaderName::from_bytes(name.as_bytes())
        } else {
            HeaderName::from_bytes(format!("{prefix}{name}").as_bytes())
        };
        if let Ok(name) = name {
            // An error's own Retry-After (from its RetryInfo) wins over metadata.
            if !to.contains_key(&name) {
                to.append(name, value.clone());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connect_timeouts_become_grpc_timeouts() {
        let mut headers = HeaderMap::new();
        assert_eq!(connect_timeout(&headers).unwrap(), None);
        headers.insert("grpc-timeout", HeaderValue::from_static("2S"));
        assert_eq!(
            connect_timeout(&headers).unwrap(),
            Some(Duration::from_secs(2))
        );
        headers.insert("connect-timeout-ms", HeaderValue::from_static("1500"));
        let timeout = connect_timeout(&headers).unwrap().unwrap();
        assert_eq!(timeout, Duration::from_millis(1500));
        assert_eq!(grpc_timeout(timeout), "1500m");
        assert_eq!(grpc_timeout(Duration::from_secs(200_000)), "200000S");
        for bad in ["", "-1", "12345678901", "1.5"] {
            headers.insert("connect-timeout-ms", HeaderValue::from_str(bad).unwrap());
            assert!(connect_timeout(&headers).is_err(), "{bad}");
        }
    }

    #[test]
    fn the_stand_in_for_bad_json_never_decodes() {
        let error = crate::pb::LoginRequest::decode(UNDECODABLE).unwrap_err();
        assert!(!error.to_string().is_empty());
    }

    #[test]
    fn media_types() {
        let mut headers = HeaderMap::new();
        assert_eq!(Codec::of(&headers), None);
        for (value, codec) in [
            ("application/json", Some(Codec::Json)),
            ("application/json; charset=utf-8", Some(Codec::Json)),
            ("application/proto", Some(Codec::Proto)),
            ("text/plain", None),
        ] {
            headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(value));
            assert_eq!(Codec::of(&headers), codec, "{value}");
        }
    }
}
