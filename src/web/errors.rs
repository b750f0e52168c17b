//! The Connect protocol's error form: one HTTP status and one JSON body for a gRPC
//! status, `{"code":"resource_exhausted","message":"…","details":[…]}`.
//!
//! The HTTP status of every gRPC code is [`connect_code`], the one table (Connect's
//! own, so generated Connect clients read the code back from either). A detail is
//! `{"type":"google.rpc.RetryInfo","value":"<base64 of its bytes>","debug":{…}}`: the
//! value is what clients decode, `debug` its proto3 JSON form for people and curl.
//! A RetryInfo detail is also sent as `Retry-After`, in whole seconds rounded up.
//! Nothing here adds to what the gRPC status says: its message is already the one
//! gRPC clients get (generic for internal errors, see `crate::error`).

use base64::Engine as _;
use http::{HeaderValue, StatusCode, header};
use prost::Message as _;
use prost_reflect::{DescriptorPool, DynamicMessage};
use serde_json::{Map, Value, json};
use tonic::{Code, Status};
use tonic_types::StatusExt as _;

/// The media type of every JSON answer.
pub(super) const JSON: &str = "application/json";

/// Connect's name of a gRPC code and the HTTP status it is sent with.
pub(crate) fn connect_code(code: Code) -> (&'static str, StatusCode) {
    match code {
        Code::Ok => ("ok", StatusCode::OK),
        // Connect's own status for a call the client cancelled (nginx's 499).
        Code::Cancelled => (
            "canceled",
            StatusCode::from_u16(499).expect("499 is a valid status"),
        ),
        Code::Unknown => ("unknown", StatusCode::INTERNAL_SERVER_ERROR),
        Code::InvalidArgument => ("invalid_argument", StatusCode::BAD_REQUEST),
        Code::DeadlineExceeded => ("deadline_exceeded", StatusCode::GATEWAY_TIMEOUT),
        Code::NotFound => ("not_found", StatusCode::NOT_FOUND),
        Code::AlreadyExists => ("already_exists", StatusCode::CONFLICT),
        Code::PermissionDenied => ("permission_denied", StatusCode::FORBIDDEN),
        Code::ResourceExhausted => ("resource_exhausted", StatusCode::TOO_MANY_REQUESTS),
        Code::FailedPrecondition => ("failed_precondition", StatusCode::BAD_REQUEST),
        Code::Aborted => ("aborted", StatusCode::CONFLICT),
        Code::OutOfRange => ("out_of_range", StatusCode::BAD_REQUEST),
        Code::Unimplemented => ("unimplemented", StatusCode::NOT_IMPLEMENTED),
        Code::Internal => ("internal", StatusCode::INTERNAL_SERVER_ERROR),
        Code::Unavailable => ("unavailable", StatusCode::SERVICE_UNAVAILABLE),
        Code::DataLoss => ("data_loss", StatusCode::INTERNAL_SERVER_ERROR),
        Code::Unauthenticated => ("unauthenticated", StatusCode::UNAUTHORIZED),
    }
}

/// The answer to a call that ended with `status`: its HTTP status, the JSON body, and
/// `Retry-After` when the status carries a RetryInfo. `details` decodes the detail
/// types (google.rpc's) for their `debug` form.
pub(super) fn response(status: &Status, details: &DescriptorPool) -> http::Response<Vec<u8>> {
    let (code, http_status) = connect_code(status.code());
    let mut body = Map::new();
    body.insert("code".into(), code.into());
    if !status.message().is_empty() {
        body.insert("message".into(), status.message().into());
    }
    let details = detail_list(status, details);
    if !details.is_empty() {
        body.insert("details".into(), Value::Array(details));
    }
    let mut response = json_response(http_status, &Value::Object(body));
    if let Some(delay) = status.get_details_retry_info().and_then(|r| r.retry_delay) {
        // Whole seconds, rounded up: a client that waits less is refused again.
        let seconds = delay.as_secs() + u64::from(delay.subsec_nanos() > 0);
        response
            .headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from(seconds.max(1)));
    }
    response
}

/// An answer that is not a call's: an unknown path, a wrong method or media type.
pub(super) fn plain(http_status: StatusCode, code: Code, message: &str) -> http::Response<Vec<u8>> {
    let body = json!({ "code": connect_code(code).0, "message": message });
    json_response(http_status, &body)
}

fn json_response(status: StatusCode, body: &Value) -> http::Response<Vec<u8>> {
    let mut response = http::Response::new(serde_json::to_vec(body).expect("JSON values encode"));
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(JSON));
    response
}

/// The details of `status` (the `google.rpc.Status` in `grpc-status-details-bin`) in
/// Connect's form.
fn detail_list(status: &Status, pool: &DescriptorPool) -> Vec<Value> {
    if status.details().is_empty() {
        return Vec::new();
    }
    let Ok(decoded) = tonic_types::pb::Status::decode(status.details()) else {
        return Vec::new();
    };
    let base64 = base64::engine::general_purpose::STANDARD_NO_PAD;
    decoded
        .details
        .iter()
        .map(|any| {
            // `type.googleapis.com/google.rpc.RetryInfo` → `google.rpc.RetryInfo`.
            let name = any.type_url.rsplit('/').next().unwrap_or_default();
            let mut detail = Map::new();
            detail.insert("type".into(), name.into());
            detail.insert("value".into(), base64.encode(&any.value).into());
            let debug = pool
                .get_message_by_name(name)
                .and_then(|desc| DynamicMessage::decode(desc, any.value.as_slice()).ok())
                .and_then(|message| serde_json::to_value(&message).ok());
            if let Some(debug) = debug {
                detail.insert("debug".into(), debug);
            }
            Value::Object(detail)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;
    use tonic_types::ErrorDetails;

    fn details_pool() -> DescriptorPool {
        DescriptorPool::decode(tonic_types::pb::FILE_DESCRIPTOR_SET).unwrap()
    }

    fn body(response: &http::Response<Vec<u8>>) -> Value {
        serde_json::from_slice(response.body()).unwrap()
    }

    #[test]
    fn every_code_has_connects_name_and_status() {
        let table: Vec<(i32, &str, u16)> = (0..=16)
            .map(|n| {
                let (name, status) = connect_code(Code::from_i32(n));
                (n, name, status.as_u16())
            })
            .collect();
        assert_eq!(
            table,
            [
                (0, "ok", 200),
                (1, "canceled", 499),
                (2, "unknown", 500),
                (3, "invalid_argument", 400),
                (4, "deadline_exceeded", 504),
                (5, "not_found", 404),
                (6, "already_exists", 409),
                (7, "permission_denied", 403),
                (8, "resource_exhausted", 429),
                (9, "failed_precondition", 400),
                (10, "aborted", 409),
                (11, "out_of_range", 400),
                (12, "unimplemented", 501),
                (13, "internal", 500),
                (14, "unavailable", 503),
                (15, "data_loss", 500),
                (16, "unauthenticated", 401),
            ]
        );
    }

    #[test]
    fn a_retry_hint_is_a_detail_and_retry_after_rounded_up() {
        let status = Status::with_error_details(
            Code::ResourceExhausted,
            "rate limit exceeded",
            ErrorDetails::with_retry_info(Some(Duration::from_millis(1500))),
        );
        let response = response(&status, &details_pool());
        assert_eq!(response.status(), 429);
        assert_eq!(response.headers()[header::RETRY_AFTER], "2");
        assert_eq!(response.headers()[header::CONTENT_TYPE], JSON);
        let body = body(&response);
        assert_eq!(body["code"], "resource_exhausted");
        assert_eq!(body["message"], "rate limit exceeded");
        let detail = &body["details"][0];
        assert_eq!(detail["type"], "google.rpc.RetryInfo");
        assert_eq!(detail["debug"], json!({ "retryDelay": "1.500s" }));
        // The value is the detail's own bytes, which clients decode.
        let bytes = base64::engine::general_purpose::STANDARD_NO_PAD
            .decode(detail["value"].as_str().unwrap())
            .unwrap();
        let info = tonic_types::pb::RetryInfo::decode(bytes.as_slice()).unwrap();
        assert_eq!(info.retry_delay.unwrap().nanos, 500_000_000);
    }

    #[test]
    fn field_violations_are_a_bad_request_detail() {
        let status = Status::with_error_details(
            Code::InvalidArgument,
            "invalid username",
            ErrorDetails::with_bad_request_violation("username", "3 to 64 characters"),
        );
        let response = response(&status, &details_pool());
        assert_eq!(response.status(), 400);
        assert!(!response.headers().contains_key(header::RETRY_AFTER));
        let body = body(&response);
        assert_eq!(body["details"][0]["type"], "google.rpc.BadRequest");
        assert_eq!(
            body["details"][0]["debug"],
            json!({ "fieldViolations": [
                { "field": "username", "description": "3 to 64 characters" }
            ] })
        );
    }

    #[test]
    fn a_status_without_details_has_code_and_message_only() {
        let response = response(&Status::unauthenticated("invalid token"), &details_pool());
        assert_eq!(response.status(), 401);
        assert_eq!(
            body(&response),
            json!({ "code": "unauthenticated", "message": "invalid token" })
        );
    }
}
