//! CORS for browser origins on the gRPC and admin ports: an allow-list of exact
//! origins (`AUTHD_CORS_ORIGINS`), nothing allowed when it is empty.
//!
//! - A request from a listed origin gets `Access-Control-Allow-Origin: <origin>`,
//!   `Vary: Origin`, `Access-Control-Allow-Credentials: true` and the gRPC and retry
//!   headers exposed, so browser clients read statuses and hints.
//! - A preflight (`OPTIONS` with `Access-Control-Request-Method`) is answered here,
//!   never by the service: 204 with the allowed methods and headers for a listed
//!   origin, 403 without any CORS header for any other.
//! - A request from an unlisted origin is served as one without an origin would be
//!   (the browser keeps its answer from the page); it gets no CORS header at all.
//!
//! tower-http's CORS layer answers a refused preflight with 200 and no headers, and
//! knows nothing of the credentials-only-for-listed-origins rule as one setting;
//! the whole policy is these few headers, kept here.

use http::{HeaderMap, HeaderValue, Method, StatusCode, header};

/// Methods a browser may use: Connect's unary calls are POST (GET for idempotent
/// calls), gRPC-Web's POST.
const ALLOW_METHODS: &str = "POST, GET";
/// Request headers browser clients of Connect and gRPC-Web send.
const ALLOW_HEADERS: &str = "content-type, connect-protocol-version, connect-timeout-ms, \
                             grpc-timeout, x-grpc-web, x-user-agent, authorization";
/// Response headers a page may read.
const EXPOSE_HEADERS: &str = "grpc-status, grpc-message, grpc-status-details-bin, retry-after";
/// How long a browser may keep a preflight's answer (seconds).
const MAX_AGE: &str = "7200";

/// The allowed origins.
#[derive(Debug, Clone, Default)]
pub(crate) struct Cors {
    origins: Vec<HeaderValue>,
}

impl Cors {
    /// The policy allowing exactly `origins` (as `scheme://host[:port]`, checked by
    /// the configuration).
    pub(crate) fn new(origins: Vec<HeaderValue>) -> Self {
        Self { origins }
    }

    /// The request's origin, when it is listed.
    pub(super) fn allowed(&self, headers: &HeaderMap) -> Option<HeaderValue> {
        let origin = headers.get(header::ORIGIN)?;
        self.origins
            .iter()
            .find(|allowed| allowed.as_bytes().eq_ignore_ascii_case(origin.as_bytes()))
            .map(|_| origin.clone())
    }

    /// Whether `request` is a CORS preflight.
    pub(super) fn is_preflight<B>(request: &http::Request<B>) -> bool {
        request.method() == Method::OPTIONS
            && request.headers().contains_key(header::ORIGIN)
            && request
                .headers()
                .contains_key(header::ACCESS_CONTROL_REQUEST_METHOD)
    }

    /// The answer to a preflight from `origin` (listed, or `None`).
    pub(super) fn preflight(origin: Option<HeaderValue>) -> http::Response<Vec<u8>> {
        let mut response = http::Response::new(Vec::new());
        let Some(origin) = origin else {
            *response.status_mut() = StatusCode::FORBIDDEN;
            return response;
        };
        *response.status_mut() = StatusCode::NO_CONTENT;
        let headers = response.headers_mut();
        allow(headers, origin);
        headers.insert(
            header::ACCESS_CONTROL_ALLOW_METHODS,
            HeaderValue::from_static(ALLOW_METHODS),
        );
        headers.insert(
            header::ACCESS_CONTROL_ALLOW_HEADERS,
            HeaderValue::from_static(ALLOW_HEADERS),
        );
        headers.insert(
            header::ACCESS_CONTROL_MAX_AGE,
            HeaderValue::from_static(MAX_AGE),
        );
        response
    }

    /// Adds the CORS headers of a listed origin to an answer.
    pub(super) fn decorate<B>(response: &mut http::Response<B>, origin: HeaderValue) {
        let headers = response.headers_mut();
        allow(headers, origin);
        headers.insert(
            header::ACCESS_CONTROL_EXPOSE_HEADERS,
            HeaderValue::from_static(EXPOSE_HEADERS),
        );
    }
}

fn allow(headers: &mut HeaderMap, origin: HeaderValue) {
    headers.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, origin);
    headers.insert(
        header::ACCESS_CONTROL_ALLOW_CREDENTIALS,
        HeaderValue::from_static("true"),
    );
    headers.append(header::VARY, HeaderValue::from_static("origin"));
}

/// Parses `AUTHD_CORS_ORIGINS`: comma-separated exact origins, `scheme://host[:port]`
/// (no path, no wildcard); empty allows none.
pub(crate) fn parse_origins(value: &str) -> Result<Vec<HeaderValue>, String> {
    value
        .split(',')
        .map(str::trim)
        .filter(|origin| !origin.is_empty())
        .map(|origin| {
            let (scheme, rest) = origin
                .split_once("://")
                .ok_or_else(|| format!("{origin:?} is not an origin (scheme://host[:port])"))?;
            let valid = matches!(scheme, "http" | "https")
                && !rest.is_empty()
                && !rest.contains(['/', '*', '?', '#', '@', ' '])
                && rest.parse::<http::uri::Authority>().is_ok();
            if !valid {
                return Err(format!(
                    "{origin:?} is not an origin (http or https://host[:port], nothing after)"
                ));
            }
            HeaderValue::from_str(origin).map_err(|e| format!("{origin:?}: {e}"))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn origins_are_exact_and_checked() {
        assert!(parse_origins("").unwrap().is_empty());
        let parsed = parse_origins("https://app.example, http://localhost:3000").unwrap();
        assert_eq!(parsed, ["https://app.example", "http://localhost:3000"]);
        for bad in [
            "*",
            "app.example",
            "https://app.example/",
            "ftp://x",
            "https://*.x",
        ] {
            assert!(parse_origins(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn only_a_listed_origin_is_allowed() {
        let cors = Cors::new(parse_origins("https://app.example").unwrap());
        let mut headers = HeaderMap::new();
        assert_eq!(cors.allowed(&headers), None);
        headers.insert(
            header::ORIGIN,
            HeaderValue::from_static("https://evil.example"),
        );
        assert_eq!(cors.allowed(&headers), None);
        headers.insert(
            header::ORIGIN,
            HeaderValue::from_static("https://app.example"),
        );
        assert_eq!(cors.allowed(&headers).unwrap(), "https://app.example");
        assert_eq!(Cors::preflight(None).status(), 403);
        assert!(Cors::preflight(None).headers().is_empty());
    }
}
