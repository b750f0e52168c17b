//! The bottom floor of the request path: what every layer and the handlers need to
//! know about a request, in one place.
//!
//! - [`Rpc`]: which RPC a request path is, built on the service names the generated
//!   code declares; nothing else in authd spells a path. Health and reflection are
//!   [exempt](Rpc::is_exempt): never rate-limited, never refused for load. Envoy's
//!   external authorization `Check` is a method like AuthService's.
//! - The request extensions that travel down the stack: the [`RequestId`] (set by the
//!   trace layer), the [`Deadline`] (set by admission control), the
//!   [`ClientIdentity`] of a mutual-TLS client (set by the transport, per connection)
//!   and, on the way back up, the [`UserId`] a handler acted for and the
//!   [`AuthzDecision`] of an external authorization check.
//! - Who sent a request: [`peer_ip`] and [`client_ip`].
//!
//! It imports nothing of authd's: every other module may import it.

use http::HeaderValue;
use std::{
    net::IpAddr,
    time::{Duration, Instant},
};
use tonic::transport::server::TcpConnectInfo;

const AUTH: &str = crate::pb::auth_service_server::SERVICE_NAME;
const EXT_AUTHZ: &str = crate::pb::envoy_auth::authorization_server::SERVICE_NAME;
const HEALTH: &str = tonic_health::pb::health_server::SERVICE_NAME;
const REFLECTION_V1: &str = tonic_reflection::pb::v1::server_reflection_server::SERVICE_NAME;
const REFLECTION_V1ALPHA: &str =
    tonic_reflection::pb::v1alpha::server_reflection_server::SERVICE_NAME;
const RATE_LIMIT_SERVICE: &str =
    envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::SERVICE_NAME;

/// An RPC authd serves, or [`Rpc::Unknown`] for any other path.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Rpc {
    Register,
    Login,
    ValidateToken,
    Refresh,
    Logout,
    ChangePassword,
    GetSigningKeys,
    BeginTotpEnrollment,
    ConfirmTotpEnrollment,
    CompleteLogin,
    DisableTotp,
    RegenerateRecoveryCodes,
    /// `envoy.service.auth.v3.Authorization/Check`: Envoy's external authorization.
    ExtAuthzCheck,
    HealthCheck,
    HealthWatch,
    ReflectionV1,
    ReflectionV1Alpha,
    /// Envoy's `envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit`.
    ShouldRateLimit,
    /// A path that names none of the above (an unknown service or method).
    Unknown,
}

impl Rpc {
    /// Every value, in the order of [`Rpc::index`].
    pub(crate) const ALL: [Rpc; 19] = [
        Rpc::Register,
        Rpc::Login,
        Rpc::ValidateToken,
        Rpc::Refresh,
        Rpc::Logout,
        Rpc::ChangePassword,
        Rpc::GetSigningKeys,
        Rpc::BeginTotpEnrollment,
        Rpc::ConfirmTotpEnrollment,
        Rpc::CompleteLogin,
        Rpc::DisableTotp,
        Rpc::RegenerateRecoveryCodes,
        Rpc::ExtAuthzCheck,
        Rpc::HealthCheck,
        Rpc::HealthWatch,
        Rpc::ReflectionV1,
        Rpc::ReflectionV1Alpha,
        Rpc::ShouldRateLimit,
        Rpc::Unknown,
    ];

    /// The methods of `auth.v1.AuthService` (a unit test keeps them in step with the
    /// proto, and [`Rpc::NAMED_METHODS`] in step with them).
    #[cfg(test)]
    pub(crate) const AUTH_METHODS: [Rpc; 12] = [
        Rpc::Register,
        Rpc::Login,
        Rpc::ValidateToken,
        Rpc::Refresh,
        Rpc::Logout,
        Rpc::ChangePassword,
        Rpc::GetSigningKeys,
        Rpc::BeginTotpEnrollment,
        Rpc::ConfirmTotpEnrollment,
        Rpc::CompleteLogin,
        Rpc::DisableTotp,
        Rpc::RegenerateRecoveryCodes,
    ];

    /// The methods rate-limit rules and the mutual-TLS allow-list may name: those of
    /// AuthService, and `Check` (Envoy's external authorization).
    pub(crate) const NAMED_METHODS: [Rpc; 13] = [
        Rpc::Register,
        Rpc::Login,
        Rpc::ValidateToken,
        Rpc::Refresh,
        Rpc::Logout,
        Rpc::ChangePassword,
        Rpc::GetSigningKeys,
        Rpc::BeginTotpEnrollment,
        Rpc::ConfirmTotpEnrollment,
        Rpc::CompleteLogin,
        Rpc::DisableTotp,
        Rpc::RegenerateRecoveryCodes,
        Rpc::ExtAuthzCheck,
    ];

    /// The RPC a request path (`/package.Service/Method`) names.
    pub(crate) fn of_path(path: &str) -> Rpc {
        let Some((service, method)) = path.strip_prefix('/').and_then(|p| p.split_once('/')) else {
            return Rpc::Unknown;
        };
        Rpc::ALL[..Rpc::ALL.len() - 1]
            .iter()
            .copied()
            .find(|rpc| rpc.service() == service && rpc.method() == method)
            .unwrap_or(Rpc::Unknown)
    }

    /// The fully qualified service name (`unknown` for [`Rpc::Unknown`]).
    pub(crate) fn service(self) -> &'static str {
        match self {
            Rpc::Register
            | Rpc::Login
            | Rpc::ValidateToken
            | Rpc::Refresh
            | Rpc::Logout
            | Rpc::ChangePassword
            | Rpc::GetSigningKeys
            | Rpc::BeginTotpEnrollment
            | Rpc::ConfirmTotpEnrollment
            | Rpc::CompleteLogin
            | Rpc::DisableTotp
            | Rpc::RegenerateRecoveryCodes => AUTH,
            Rpc::ExtAuthzCheck => EXT_AUTHZ,
            Rpc::HealthCheck | Rpc::HealthWatch => HEALTH,
            Rpc::ReflectionV1 => REFLECTION_V1,
            Rpc::ReflectionV1Alpha => REFLECTION_V1ALPHA,
            Rpc::ShouldRateLimit => RATE_LIMIT_SERVICE,
            Rpc::Unknown => "unknown",
        }
    }

    /// The method name, as the proto spells it (`unknown` for [`Rpc::Unknown`]).
    pub(crate) fn method(self) -> &'static str {
        match self {
            Rpc::Register => "Register",
            Rpc::Login => "Login",
            Rpc::ValidateToken => "ValidateToken",
            Rpc::Refresh => "Refresh",
            Rpc::Logout => "Logout",
            Rpc::ChangePassword => "ChangePassword",
            Rpc::GetSigningKeys => "GetSigningKeys",
            Rpc::BeginTotpEnrollment => "BeginTotpEnrollment",
            Rpc::ConfirmTotpEnrollment => "ConfirmTotpEnrollment",
            Rpc::CompleteLogin => "CompleteLogin",
            Rpc::DisableTotp => "DisableTotp",
            Rpc::RegenerateRecoveryCodes => "RegenerateRecoveryCodes",
            Rpc::ExtAuthzCheck | Rpc::HealthCheck => "Check",
            Rpc::HealthWatch => "Watch",
            Rpc::ReflectionV1 | Rpc::ReflectionV1Alpha => "ServerReflectionInfo",
            Rpc::ShouldRateLimit => "ShouldRateLimit",
            Rpc::Unknown => "unknown",
        }
    }

    /// The position in [`Rpc::ALL`], for tables indexed by RPC.
    pub(crate) fn index(self) -> usize {
        self as usize
    }

    /// Health and reflection: probes and tooling must answer however busy the
    /// service is, so they are never rate-limited nor refused by admission control,
    /// and they are logged at debug level only (probes would fill the log).
    pub(crate) fn is_exempt(self) -> bool {
        matches!(
            self,
            Rpc::HealthCheck | Rpc::HealthWatch | Rpc::ReflectionV1 | Rpc::ReflectionV1Alpha
        )
    }

    /// Whether the RPC hashes a password (a PBKDF2 derivation of hundreds of
    /// milliseconds at the default cost): admission control measures how fast these
    /// are answered apart from the others, which take microseconds.
    pub(crate) fn hashes_a_password(self) -> bool {
        matches!(self, Rpc::Register | Rpc::Login | Rpc::ChangePassword)
    }

    /// The method called `name` (case-insensitively) among [`Rpc::NAMED_METHODS`],
    /// for rate-limit rules and the allow-list.
    pub(crate) fn auth_method(name: &str) -> Option<Rpc> {
        Rpc::NAMED_METHODS
            .iter()
            .copied()
            .find(|rpc| rpc.method().eq_ignore_ascii_case(name))
    }
}

/// The largest `Check` request (a gRPC frame's payload) authd reads: it carries
/// every header of the proxied request (Envoy's own default bound on headers is
/// 60 KiB), far more than authd's own messages.
pub(crate) const MAX_CHECK_REQUEST_BYTES: usize = 96 * 1024;

/// The service name health reports besides the server-wide `""`.
pub(crate) const AUTH_SERVICE: &str = AUTH;

/// The id of the request being handled, in the request's extensions.
#[derive(Debug, Clone)]
pub struct RequestId(pub(crate) HeaderValue);

impl RequestId {
    pub fn as_str(&self) -> &str {
        // Only ever built from visible ASCII (checked, or a UUID).
        self.0.to_str().unwrap_or_default()
    }
}

/// The instant after which nobody waits for the answer any more.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Deadline(pub Instant);

/// The user a request acted for: handlers put it in the response's extensions
/// (tonic carries them into the HTTP response), and the trace layer logs it.
#[derive(Debug, Clone)]
pub struct UserId(pub String);

/// What an external authorization check decided (`allow` or `deny`, and why): the
/// handler puts it in the response's extensions, and the trace layer logs it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AuthzDecision {
    pub outcome: &'static str,
    pub reason: &'static str,
}

/// Who a mutual-TLS client is: its certificate's first URI SAN (e.g. a SPIFFE id),
/// else its first DNS SAN, else its subject CN. The transport puts it in the
/// extensions of every request of a connection whose client presented a certificate
/// that chains to `AUTHD_TLS_CLIENT_CA`; requests without one have none.
/// At most 512 bytes, no control characters.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ClientIdentity(pub(crate) std::sync::Arc<str>);

impl ClientIdentity {
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// The identity of the client certificate a request came with, if any.
pub(crate) fn client_identity(extensions: &http::Extensions) -> Option<&ClientIdentity> {
    extensions.get::<ClientIdentity>()
}

/// The IP address of the connection a request came on, if it came over TCP.
pub(crate) fn peer_ip(extensions: &http::Extensions) -> Option<IpAddr> {
    extensions
        .get::<TcpConnectInfo>()
        .and_then(|info| info.remote_addr())
        .map(|addr| addr.ip())
}

/// The client of requests that name none (in-process callers, tests without TCP):
/// they share one place in every per-client bound.
pub(crate) const UNKNOWN_CLIENT: IpAddr = IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED);

/// The client a request is counted for in the layers' per-client bounds: as
/// [`client_ip`], or [`UNKNOWN_CLIENT`].
pub(crate) fn request_client(
    request: &http::Request<impl Sized>,
    trust_forwarded_for: bool,
) -> IpAddr {
    client_ip(
        request.headers(),
        peer_ip(request.extensions()),
        trust_forwarded_for,
    )
    .unwrap_or(UNKNOWN_CLIENT)
}

/// The client a request is counted for: the first `x-forwarded-for` hop when that
/// header is trusted (behind a proxy that sets it) and holds an address, else the
/// connection's peer; IPv4-mapped IPv6 addresses are the IPv4 client they stand for.
pub(crate) fn client_ip(
    headers: &http::HeaderMap,
    peer: Option<IpAddr>,
    trust_forwarded_for: bool,
) -> Option<IpAddr> {
    let forwarded = trust_forwarded_for
        .then(|| first_forwarded_hop(headers))
        .flatten();
    forwarded.or(peer).map(|ip| ip.to_canonical())
}

/// The first `x-forwarded-for` hop: the client as the first proxy saw it.
fn first_forwarded_hop(headers: &http::HeaderMap) -> Option<IpAddr> {
    let value = headers.get("x-forwarded-for")?.to_str().ok()?;
    let first = value.split(',').next()?.trim();
    first
        .parse::<IpAddr>()
        .ok()
        .or_else(|| first.parse::<std::net::SocketAddr>().ok().map(|a| a.ip()))
}

/// Parses the `grpc-timeout` header: up to 8 digits and a unit (H, M, S, m, u, n).
pub(crate) fn grpc_timeout(headers: &http::HeaderMap) -> Option<Duration> {
    let value = headers.get("grpc-timeout")?.to_str().ok()?;
    if value.len() < 2 || value.len() > 9 {
        return None;
    }
    let (digits, unit) = value.split_at(value.len() - 1);
    let n: u64 = digits.parse().ok()?;
    Some(match unit {
        "H" => Duration::from_secs(n.checked_mul(3600)?),
        "M" => Duration::from_secs(n.checked_mul(60)?),
        "S" => Duration::from_secs(n),
        "m" => Duration::from_millis(n),
        "u" => Duration::from_micros(n),
        "n" => Duration::from_nanos(n),
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(v: &str) -> Option<Duration> {
        let mut h = http::HeaderMap::new();
        h.insert("grpc-timeout", v.parse().unwrap());
        grpc_timeout(&h)
    }

    #[test]
    fn grpc_timeout_units() {
        assert_eq!(parse("2H"), Some(Duration::from_secs(7200)));
        assert_eq!(parse("3M"), Some(Duration::from_secs(180)));
        assert_eq!(parse("5S"), Some(Duration::from_secs(5)));
        assert_eq!(parse("250m"), Some(Duration::from_millis(250)));
        assert_eq!(parse("7u"), Some(Duration::from_micros(7)));
        assert_eq!(parse("9n"), Some(Duration::from_nanos(9)));
        assert_eq!(parse("0m"), Some(Duration::ZERO));
        for bad in ["", "S", "5", "5x", "123456789S", "-1S", "1.5S"] {
            assert_eq!(parse(bad), None, "{bad:?}");
        }
    }

    fn headers(forwarded: &str) -> http::HeaderMap {
        let mut h = http::HeaderMap::new();
        h.insert("x-forwarded-for", forwarded.parse().unwrap());
        h
    }

    #[test]
    fn paths_name_their_rpc() {
        for rpc in Rpc::ALL {
            assert_eq!(Rpc::ALL[rpc.index()], rpc);
            if rpc != Rpc::Unknown {
                let path = format!("/{}/{}", rpc.service(), rpc.method());
                assert_eq!(Rpc::of_path(&path), rpc, "{path}");
            }
        }
        for other in [
            "",
            "/",
            "/auth.v1.AuthService/",
            "/auth.v1.AuthService/Nope",
            "/evil/x",
            "/grpc.health.v1.Health/List",
            "auth.v1.AuthService/Login",
        ] {
            assert_eq!(Rpc::of_path(other), Rpc::Unknown, "{other:?}");
        }
        assert!(Rpc::HealthCheck.is_exempt() && Rpc::ReflectionV1Alpha.is_exempt());
        assert!(!Rpc::Login.is_exempt() && !Rpc::Unknown.is_exempt());
        assert_eq!(Rpc::auth_method("login"), Some(Rpc::Login));
        assert_eq!(Rpc::auth_method("Refresh"), Some(Rpc::Refresh));
        assert_eq!(
            Rpc::auth_method("changepassword"),
            Some(Rpc::ChangePassword)
        );
        assert_eq!(Rpc::auth_method("Check"), Some(Rpc::ExtAuthzCheck));
        assert!(!Rpc::ExtAuthzCheck.is_exempt());
    }

    #[test]
    fn the_auth_methods_are_those_of_the_proto() {
        use prost::Message as _;
        let set = prost_types::FileDescriptorSet::decode(crate::pb::FILE_DESCRIPTOR_SET).unwrap();
        let mut methods: Vec<String> = set
            .file
            .iter()
            .flat_map(|f| {
                let package = f.package().to_owned();
                f.service
                    .iter()
                    .filter(move |s| format!("{package}.{}", s.name()) == AUTH)
            })
            .flat_map(|s| &s.method)
            .map(|m| m.name().to_owned())
            .collect();
        methods.sort();
        let mut known: Vec<String> = Rpc::AUTH_METHODS
            .iter()
            .map(|m| m.method().to_owned())
            .collect();
        known.sort();
        assert_eq!(methods, known);
        assert_eq!(Rpc::NAMED_METHODS[..12], Rpc::AUTH_METHODS);
        assert_eq!(Rpc::NAMED_METHODS[12], Rpc::ExtAuthzCheck);
    }

    #[test]
    fn the_forwarded_client_counts_only_when_trusted() {
        let peer: IpAddr = "10.0.0.1".parse().unwrap();
        let h = headers("203.0.113.9, 10.0.0.1");
        assert_eq!(client_ip(&h, Some(peer), false), Some(peer));
        assert_eq!(
            client_ip(&h, Some(peer), true),
            Some("203.0.113.9".parse().unwrap())
        );
        assert_eq!(client_ip(&headers("unknown"), Some(peer), true), Some(peer));
        assert_eq!(
            client_ip(&headers("[2001:db8::1]:4711"), Some(peer), true),
            Some("2001:db8::1".parse().unwrap())
        );
        let mapped: IpAddr = "::ffff:10.0.0.7".parse().unwrap();
        assert_eq!(
            client_ip(&http::HeaderMap::new(), Some(mapped), false),
            Some("10.0.0.7".parse().unwrap())
        );
    }
}
