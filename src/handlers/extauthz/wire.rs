//! Envoy's `CheckRequest` and `CheckResponse` as authd reads and writes them: the
//! same wire format as envoy-types' messages, holding only what a decision needs.
//!
//! Envoy sends far more than a decision reads: the peers' addresses and
//! certificates, the route's metadata, every header of the request. envoy-types'
//! `CheckRequest` decodes all of it into owned strings and hash maps, then drops it;
//! on the hot path of every proxied request that costs more than verifying the
//! token. These messages keep the headers and the route's `context_extensions`
//! only, as slices of the received buffer (no copy, no hash), and prost skips every
//! other field unread. A map on the wire is a repeated message of key (field 1) and
//! value (field 2), so the maps are read as lists of [`Entry`], in the order sent.
//! The answer is built the same way: envoy-types' shape, lists instead of hash
//! maps, nothing authd never sets, and its text as [`Bytes`] (a `string` and a
//! `bytes` field are the same on the wire), so that the identity header names,
//! made once, and the metadata keys, static, are shared rather than copied; what
//! authd puts there must be, and is, UTF-8 (a `string` that is not fails Envoy's
//! parser).
//!
//! `build.rs` generates the Authorization server on these two types; reflection
//! still serves Envoy's own descriptors, and clients use envoy-types' messages (the
//! tests check that both read each other).

use bytes::Bytes;

/// `envoy.service.auth.v3.CheckRequest`: its `attributes` only.
#[derive(Clone, PartialEq, prost::Message)]
pub struct CheckRequest {
    #[prost(message, optional, tag = "1")]
    pub attributes: Option<Attributes>,
}

/// `AttributeContext`: the request and the route's `context_extensions`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Attributes {
    #[prost(message, optional, tag = "4")]
    pub request: Option<Request>,
    #[prost(message, repeated, tag = "10")]
    pub context_extensions: Vec<Entry>,
}

/// `AttributeContext.Request`: its HTTP part.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Request {
    #[prost(message, optional, tag = "2")]
    pub http: Option<HttpRequest>,
}

/// `AttributeContext.HttpRequest`: the headers, as a map (`headers`) or, with
/// Envoy's `encode_raw_headers`, as a list (`header_map`).
#[derive(Clone, PartialEq, prost::Message)]
pub struct HttpRequest {
    #[prost(message, repeated, tag = "3")]
    pub headers: Vec<Entry>,
    #[prost(message, optional, tag = "13")]
    pub header_map: Option<HeaderMap>,
}

/// `config.core.v3.HeaderMap`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct HeaderMap {
    #[prost(message, repeated, tag = "1")]
    pub headers: Vec<RawHeader>,
}

/// `config.core.v3.HeaderValue` as Envoy sends it: the value in `value`, or (raw
/// headers) in `raw_value`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct RawHeader {
    #[prost(bytes = "bytes", tag = "1")]
    pub key: Bytes,
    #[prost(bytes = "bytes", tag = "2")]
    pub value: Bytes,
    #[prost(bytes = "bytes", tag = "3")]
    pub raw_value: Bytes,
}

/// One entry of a `map<string, string>`, unchecked bytes: whoever reads a value
/// checks it is text.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Entry {
    #[prost(bytes = "bytes", tag = "1")]
    pub key: Bytes,
    #[prost(bytes = "bytes", tag = "2")]
    pub value: Bytes,
}

impl CheckRequest {
    /// Every header sent, name and value, from the map and then the list.
    pub fn headers(&self) -> impl Iterator<Item = (&[u8], &[u8])> {
        let http = self
            .attributes
            .as_ref()
            .and_then(|a| a.request.as_ref())
            .and_then(|r| r.http.as_ref());
        let map = http.into_iter().flat_map(|h| h.headers.iter());
        let list = http
            .and_then(|h| h.header_map.as_ref())
            .into_iter()
            .flat_map(|m| m.headers.iter());
        map.map(|e| (&e.key[..], &e.value[..])).chain(list.map(|h| {
            let value = if h.raw_value.is_empty() {
                &h.value
            } else {
                &h.raw_value
            };
            (&h.key[..], &value[..])
        }))
    }

    /// The route's `context_extensions`, in the order sent.
    pub fn context_extensions(&self) -> &[Entry] {
        self.attributes
            .as_ref()
            .map_or(&[], |a| &a.context_extensions[..])
    }
}

/// `envoy.service.auth.v3.CheckResponse`, as authd answers.
#[derive(Clone, PartialEq, prost::Message)]
pub struct CheckResponse {
    #[prost(message, optional, tag = "1")]
    pub status: Option<RpcStatus>,
    #[prost(oneof = "HttpResponse", tags = "2, 3")]
    pub http_response: Option<HttpResponse>,
    #[prost(message, optional, tag = "4")]
    pub dynamic_metadata: Option<Struct>,
}

/// `google.rpc.Status`: the code only (why a request was refused stays in
/// authd's metrics and log).
#[derive(Clone, PartialEq, prost::Message)]
pub struct RpcStatus {
    #[prost(int32, tag = "1")]
    pub code: i32,
}

/// `CheckResponse.http_response`.
#[derive(Clone, PartialEq, prost::Oneof)]
pub enum HttpResponse {
    #[prost(message, tag = "2")]
    DeniedResponse(DeniedHttpResponse),
    #[prost(message, tag = "3")]
    OkResponse(OkHttpResponse),
}

/// `DeniedHttpResponse`: the HTTP status (`type.v3.HttpStatus`, one field) and
/// headers; no body.
#[derive(Clone, PartialEq, prost::Message)]
pub struct DeniedHttpResponse {
    #[prost(message, optional, tag = "1")]
    pub status: Option<HttpStatus>,
    #[prost(message, repeated, tag = "2")]
    pub headers: Vec<HeaderValueOption>,
}

/// `type.v3.HttpStatus`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct HttpStatus {
    #[prost(int32, tag = "1")]
    pub code: i32,
}

/// `OkHttpResponse`: headers set, and headers removed, on the upstream request.
#[derive(Clone, PartialEq, prost::Message)]
pub struct OkHttpResponse {
    #[prost(message, repeated, tag = "2")]
    pub headers: Vec<HeaderValueOption>,
    #[prost(bytes = "bytes", repeated, tag = "5")]
    pub headers_to_remove: Vec<Bytes>,
}

/// `config.core.v3.HeaderValueOption`: a header and how to apply it.
#[derive(Clone, PartialEq, prost::Message)]
pub struct HeaderValueOption {
    #[prost(message, optional, tag = "1")]
    pub header: Option<HeaderValue>,
    /// `HeaderValueOption.HeaderAppendAction`.
    #[prost(int32, tag = "3")]
    pub append_action: i32,
}

/// `HeaderAppendAction.OVERWRITE_IF_EXISTS_OR_ADD`.
pub const OVERWRITE_IF_EXISTS_OR_ADD: i32 = 2;

impl HeaderValueOption {
    /// `key: value`, replacing any header of that name.
    pub fn overwrite(key: Bytes, value: Bytes) -> Self {
        Self {
            header: Some(HeaderValue { key, value }),
            append_action: OVERWRITE_IF_EXISTS_OR_ADD,
        }
    }
}

/// `config.core.v3.HeaderValue`, as text.
#[derive(Clone, PartialEq, prost::Message)]
pub struct HeaderValue {
    #[prost(bytes = "bytes", tag = "1")]
    pub key: Bytes,
    #[prost(bytes = "bytes", tag = "2")]
    pub value: Bytes,
}

/// `google.protobuf.Struct`, its map as a list of fields.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Struct {
    #[prost(message, repeated, tag = "1")]
    pub fields: Vec<Field>,
}

/// One field of a [`Struct`].
#[derive(Clone, PartialEq, prost::Message)]
pub struct Field {
    #[prost(bytes = "bytes", tag = "1")]
    pub key: Bytes,
    #[prost(message, optional, tag = "2")]
    pub value: Option<Value>,
}

/// `google.protobuf.Value`: the kinds authd sets.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Value {
    #[prost(oneof = "Kind", tags = "2, 3, 6")]
    pub kind: Option<Kind>,
}

/// `google.protobuf.Value.kind`.
#[derive(Clone, PartialEq, prost::Oneof)]
pub enum Kind {
    #[prost(double, tag = "2")]
    Number(f64),
    #[prost(bytes = "bytes", tag = "3")]
    String(Bytes),
    #[prost(message, tag = "6")]
    List(ListValue),
}

/// `google.protobuf.ListValue`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ListValue {
    #[prost(message, repeated, tag = "1")]
    pub values: Vec<Value>,
}

impl Field {
    /// `key: value`.
    pub fn new(key: &'static str, kind: Kind) -> Self {
        Self {
            key: Bytes::from_static(key.as_bytes()),
            value: Some(Value { kind: Some(kind) }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use envoy_types::pb::{
        envoy::{
            config::core::v3::{self as core, Address, Metadata, SocketAddress, address},
            service::auth::v3 as envoy,
        },
        google::protobuf as pbuf,
    };
    use prost::Message as _;
    use std::collections::HashMap;

    /// What Envoy sends: every part of the request filled in, most of it unread.
    fn envoy_request() -> envoy::CheckRequest {
        let peer = |ip: &str| envoy::attribute_context::Peer {
            address: Some(Address {
                address: Some(address::Address::SocketAddress(SocketAddress {
                    address: ip.into(),
                    ..Default::default()
                })),
            }),
            principal: "spiffe://cluster.local/ns/a/sa/b".into(),
            labels: HashMap::from([("app".into(), "web".into())]),
            ..Default::default()
        };
        envoy::CheckRequest {
            attributes: Some(envoy::AttributeContext {
                source: Some(peer("10.0.0.1")),
                destination: Some(peer("10.0.0.2")),
                request: Some(envoy::attribute_context::Request {
                    time: Some(pbuf::Timestamp {
                        seconds: 1,
                        nanos: 2,
                    }),
                    http: Some(envoy::attribute_context::HttpRequest {
                        id: "1".into(),
                        method: "GET".into(),
                        path: "/orders".into(),
                        host: "shop".into(),
                        headers: HashMap::from([
                            ("authorization".into(), "Bearer abc".into()),
                            (":path".into(), "/orders".into()),
                        ]),
                        header_map: Some(core::HeaderMap {
                            headers: vec![
                                core::HeaderValue {
                                    key: "x-raw".into(),
                                    raw_value: b"raw".to_vec(),
                                    ..Default::default()
                                },
                                core::HeaderValue {
                                    key: "x-text".into(),
                                    value: "text".into(),
                                    ..Default::default()
                                },
                            ],
                        }),
                        body: "ignored".into(),
                        size: 7,
                        ..Default::default()
                    }),
                }),
                context_extensions: HashMap::from([("audience".into(), "orders".into())]),
                metadata_context: Some(Metadata::default()),
                tls_session: Some(envoy::attribute_context::TlsSession { sni: "shop".into() }),
                ..Default::default()
            }),
        }
    }

    #[test]
    fn envoys_request_reads_as_its_headers_and_context_extensions() {
        let bytes = envoy_request().encode_to_vec();
        let read = CheckRequest::decode(&bytes[..]).unwrap();
        let mut headers: Vec<(&[u8], &[u8])> = read.headers().collect();
        headers[..2].sort();
        assert_eq!(
            headers,
            [
                (&b":path"[..], &b"/orders"[..]),
                (b"authorization", b"Bearer abc"),
                (b"x-raw", b"raw"),
                (b"x-text", b"text"),
            ]
        );
        let extensions = read.context_extensions();
        assert_eq!(extensions.len(), 1);
        assert_eq!(
            (&extensions[0].key[..], &extensions[0].value[..]),
            (&b"audience"[..], &b"orders"[..])
        );
        assert_eq!(CheckRequest::decode(&[][..]).unwrap().headers().count(), 0);
    }

    #[test]
    fn authds_answers_read_as_envoys() {
        let allowed = CheckResponse {
            status: Some(RpcStatus { code: 0 }),
            http_response: Some(HttpResponse::OkResponse(OkHttpResponse {
                headers: vec![HeaderValueOption::overwrite(
                    Bytes::from_static(b"x-a"),
                    Bytes::from_static(b"1"),
                )],
                headers_to_remove: vec![Bytes::from_static(b"x-b")],
            })),
            dynamic_metadata: Some(Struct {
                fields: vec![
                    Field::new("s", Kind::String(Bytes::from_static(b"v"))),
                    Field::new("n", Kind::Number(2.5)),
                    Field::new(
                        "l",
                        Kind::List(ListValue {
                            values: vec![Value {
                                kind: Some(Kind::String(Bytes::from_static(b"pwd"))),
                            }],
                        }),
                    ),
                ],
            }),
        };
        let read = envoy::CheckResponse::decode(&allowed.encode_to_vec()[..]).unwrap();
        assert_eq!(read.status.unwrap().code, 0);
        let Some(envoy::check_response::HttpResponse::OkResponse(ok)) = read.http_response else {
            panic!("not an OkHttpResponse");
        };
        let header = ok.headers[0].clone();
        assert_eq!(
            header.append_action,
            core::header_value_option::HeaderAppendAction::OverwriteIfExistsOrAdd as i32
        );
        let header = header.header.unwrap();
        assert_eq!((&*header.key, &*header.value), ("x-a", "1"));
        assert_eq!(ok.headers_to_remove, ["x-b"]);
        let fields = read.dynamic_metadata.unwrap().fields;
        let kind = |k: &str| fields[k].kind.clone().unwrap();
        assert_eq!(kind("s"), pbuf::value::Kind::StringValue("v".into()));
        assert_eq!(kind("n"), pbuf::value::Kind::NumberValue(2.5));
        assert_eq!(
            kind("l"),
            pbuf::value::Kind::ListValue(pbuf::ListValue {
                values: vec![pbuf::Value {
                    kind: Some(pbuf::value::Kind::StringValue("pwd".into())),
                }],
            })
        );

        let denied = CheckResponse {
            status: Some(RpcStatus { code: 16 }),
            http_response: Some(HttpResponse::DeniedResponse(DeniedHttpResponse {
                status: Some(HttpStatus { code: 401 }),
                headers: vec![HeaderValueOption::overwrite(
                    Bytes::from_static(b"www-authenticate"),
                    Bytes::from_static(b"Bearer"),
                )],
            })),
            dynamic_metadata: None,
        };
        let read = envoy::CheckResponse::decode(&denied.encode_to_vec()[..]).unwrap();
        assert_eq!(read.status.unwrap().code, 16);
        let Some(envoy::check_response::HttpResponse::DeniedResponse(no)) = read.http_response
        else {
            panic!("not a DeniedHttpResponse");
        };
        assert_eq!(no.status.unwrap().code, 401);
        assert_eq!(
            no.headers[0].header.as_ref().unwrap().key,
            "www-authenticate"
        );
        assert!(no.body.is_empty() && read.dynamic_metadata.is_none());
    }
}
