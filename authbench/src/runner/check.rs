//! Envoy's Check as the check scenario sends it over gRPC: each token's request
//! encoded once, before the load, and each answer read for its status alone.
//!
//! The client has one core, and a Check is among the cheapest calls authd serves.
//! Building Envoy's request (a map of headers) and decoding the whole answer
//! (identity headers, headers to remove, the claims as a `Struct`) for every call
//! weighed on it: decoding alone took 11 % of the client's core at 25,000 Checks a
//! second, where the client's own queue starts to set the latency it reports. Here
//! a call copies bytes prepared beforehand, and the answer's fields other than its
//! status are skipped unparsed.

use bytes::{BufMut as _, Bytes};
use envoy_types::pb::envoy::service::auth::v3::{
    AttributeContext, CheckRequest, attribute_context,
};
use prost::Message as _;
use tonic::{
    Request, Response, Status,
    codec::{Codec, EncodeBuf, Encoder},
    transport::Channel,
};
use tonic_prost::ProstDecoder;

/// `envoy.service.auth.v3.Authorization/Check`.
const PATH: &str = "/envoy.service.auth.v3.Authorization/Check";

/// What Envoy sends for a request bearing `token` (its headers, nothing more),
/// encoded.
pub(super) fn encoded_request(token: &str) -> Bytes {
    let headers = [
        ("authorization".to_owned(), format!("Bearer {token}")),
        (":path".to_owned(), "/".to_owned()),
        (":method".to_owned(), "GET".to_owned()),
    ];
    let request = CheckRequest {
        attributes: Some(AttributeContext {
            request: Some(attribute_context::Request {
                http: Some(attribute_context::HttpRequest {
                    method: "GET".into(),
                    path: "/".into(),
                    headers: headers.into_iter().collect(),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        }),
    };
    request.encode_to_vec().into()
}

/// A `CheckResponse` read for its decision: `status` (field 1, a `google.rpc.Status`)
/// and within it `code`; the other fields are skipped.
#[derive(Clone, PartialEq, prost::Message)]
pub(super) struct Decision {
    #[prost(message, optional, tag = "1")]
    pub(super) status: Option<DecisionStatus>,
}

/// `google.rpc.Status`, read for its code alone.
#[derive(Clone, PartialEq, prost::Message)]
pub(super) struct DecisionStatus {
    #[prost(int32, tag = "1")]
    pub(super) code: i32,
}

impl Decision {
    /// The decision's code: 0 (OK) when the answer carries no status.
    pub(super) fn code(&self) -> i32 {
        self.status.as_ref().map_or(0, |status| status.code)
    }
}

/// A client of Check on one connection; a clone shares it.
#[derive(Clone)]
pub(super) struct CheckClient {
    grpc: tonic::client::Grpc<Channel>,
}

impl CheckClient {
    pub(super) fn new(channel: Channel) -> Self {
        Self {
            grpc: tonic::client::Grpc::new(channel),
        }
    }

    /// Sends a request from [`encoded_request`] and reads its decision.
    pub(super) async fn check(
        &mut self,
        request: Request<Bytes>,
    ) -> Result<Response<Decision>, Status> {
        self.grpc
            .ready()
            .await
            .map_err(|e| Status::unavailable(format!("the connection is not ready: {e}")))?;
        let path = http::uri::PathAndQuery::from_static(PATH);
        self.grpc.unary(request, path, CheckCodec).await
    }
}

/// Writes a prepared request as it is; reads a [`Decision`] with prost's own decoder.
struct CheckCodec;

impl Codec for CheckCodec {
    type Encode = Bytes;
    type Decode = Decision;
    type Encoder = Prepared;
    type Decoder = ProstDecoder<Decision>;

    fn encoder(&mut self) -> Prepared {
        Prepared
    }

    fn decoder(&mut self) -> ProstDecoder<Decision> {
        ProstDecoder::default()
    }
}

struct Prepared;

impl Encoder for Prepared {
    type Item = Bytes;
    type Error = Status;

    fn encode(&mut self, item: Bytes, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
        dst.put(item);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use envoy_types::pb::{
        envoy::service::auth::v3::{CheckResponse, OkHttpResponse, check_response},
        google::{protobuf::Struct, rpc},
    };

    #[test]
    fn a_decision_reads_the_status_code_of_a_whole_check_response() {
        let refused = CheckResponse {
            status: Some(rpc::Status {
                code: 16,
                message: "invalid token".into(),
                details: vec![],
            }),
            ..Default::default()
        };
        let decision = Decision::decode(refused.encode_to_vec().as_slice()).unwrap();
        assert_eq!(decision.code(), 16);

        // An allowed answer with everything a real one carries: code 0.
        let allowed = CheckResponse {
            status: Some(rpc::Status::default()),
            http_response: Some(check_response::HttpResponse::OkResponse(OkHttpResponse {
                headers_to_remove: vec!["x-authd-user".into()],
                ..Default::default()
            })),
            dynamic_metadata: Some(Struct::default()),
        };
        let decision = Decision::decode(allowed.encode_to_vec().as_slice()).unwrap();
        assert_eq!(decision.code(), 0);
        // No status at all is OK too, as Envoy reads it.
        assert_eq!(Decision::decode(&[][..]).unwrap().code(), 0);
    }

    #[test]
    fn a_prepared_request_is_envoys_request_for_the_token() {
        let request = CheckRequest::decode(encoded_request("abc.def.ghi")).unwrap();
        let http = request.attributes.unwrap().request.unwrap().http.unwrap();
        assert_eq!(http.headers["authorization"], "Bearer abc.def.ghi");
        assert_eq!(http.method, "GET");
        assert_eq!(http.path, "/");
    }
}
