//! The bottom floor of the request path: what every layer and the handlers need to
//! know about a request, in one place.
//!
//! - [`Rpc`]: which RPC a request path is, built on the service names the generated
//!   code declares; nothing else in authd spells a path. Health and reflection are
//!   [exempt](Rpc::is_exempt): never rate-limited, never refused for load. Envoy's
//!   external authorization `Check` is a method like AuthService's.
//! - The request extensions that travel down the stack: the [`RequestId`] (set by the
//!   trace layer), the [`Deadline`] (set by admission control), the
//!   [`ClientIdentity`] of a mutual-TLS client (set by the transport, per connection),
//!   the [`Client`] a request is counted for (set by the transport, per request)
//!   and, on the way back up, the [`UserId`] a handler acted for and the
//!   [`AuthzDecision`] of an external authorization check.
//! - Who sent a request: [`peer_ip`], and [`client_ip`], the client every
//!   per-client bound counts: the peer, or the end user a trusted caller names in
//!   `x-forwarded-for` ([`TrustedCallers`], the one place that decides it).
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
    IssueServiceToken,
    RequestPasswordReset,
    CompletePasswordReset,
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
    pub(crate) const ALL: [Rpc; 22] = [
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
        Rpc::IssueServiceToken,
        Rpc::RequestPasswordReset,
        Rpc::CompletePasswordReset,
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
    pub(crate) const AUTH_METHODS: [Rpc; 15] = [
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
        Rpc::IssueServiceToken,
        Rpc::RequestPasswordReset,
        Rpc::CompletePasswordReset,
    ];

    /// The methods rate-limit rules and the mutual-TLS allow-list may name: those of
    /// AuthService, and `Check` (Envoy's external authorization).
    pub(crate) const NAMED_METHODS: [Rpc; 16] = [
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
        Rpc::IssueServiceToken,
        Rpc::RequestPasswordReset,
        Rpc::CompletePasswordReset,
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
            | Rpc::RegenerateRecoveryCodes
            | Rpc::IssueServiceToken
            | Rpc::RequestPasswordReset
            | Rpc::CompletePasswordReset => AUTH,
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
            Rpc::IssueServiceToken => "IssueServiceToken",
            Rpc::RequestPasswordReset => "RequestPasswordReset",
            Rpc::CompletePasswordReset => "CompletePasswordReset",
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
        matches!(
            self,
            Rpc::Register | Rpc::Login | Rpc::ChangePassword | Rpc::CompletePasswordReset
        )
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

/// The standard HTTP endpoints rate-limit rules may name beside the RPCs
/// (`Introspect:peer=…`): token introspection, token revocation and the token
/// endpoint of service accounts (`oidc`).
pub(crate) const STANDARD_METHODS: [&str; 3] = ["Introspect", "Revoke", "Token"];

/// The method a rate-limit rule names `name` (case-insensitively): one of
/// [`Rpc::NAMED_METHODS`] or of [`STANDARD_METHODS`], as they spell it.
pub(crate) fn rule_method(name: &str) -> Option<&'static str> {
    Rpc::auth_method(name).map(Rpc::method).or_else(|| {
        STANDARD_METHODS
            .into_iter()
            .find(|m| m.eq_ignore_ascii_case(name))
    })
}

/// Requests larger than this are refused by the decoder (a login is well under 2 KiB),
/// on the gRPC and the admin ports alike.
pub(crate) const MAX_MESSAGE_BYTES: usize = 4 * 1024;

/// Requests larger than this are refused on the admin port: an ImportUsers record
/// carries a hash of up to 4 KiB beside its other fields.
pub(crate) const MAX_ADMIN_MESSAGE_BYTES: usize = 8 * 1024;

/// The largest `Check` request (a gRPC frame's payload) authd reads: it carries
/// every header of the proxied request (Envoy's own default bound on headers is
/// 60 KiB), far more than authd's own messages.
pub(crate) const MAX_CHECK_REQUEST_BYTES: usize = 96 * 1024;

/// The service name health reports besides the server-wide `""`.
pub(crate) const AUTH_SERVICE: &str = AUTH;

/// The id of the request being handled, in the request's extensions.
#[derive(Debug, Clone)]
pub struct RequestId(pub(crate) HeaderValue);

/// The metadata key of the request id, in requests and responses.
pub const REQUEST_ID_HEADER: &str = "x-request-id";
/// Longer ids sent by a client are replaced: an id is for finding lines in logs.
const MAX_REQUEST_ID_LEN: usize = 128;

impl RequestId {
    /// The id of a request with `headers`: its client's (`x-request-id`) when it is
    /// a sane one, else a new UUIDv7.
    pub fn of(headers: &http::HeaderMap) -> Self {
        if let Some(value) = headers.get(REQUEST_ID_HEADER) {
            let bytes = value.as_bytes();
            if (1..=MAX_REQUEST_ID_LEN).contains(&bytes.len())
                && bytes.iter().all(|b| b.is_ascii_graphic())
            {
                return Self(value.clone());
            }
        }
        let mut buf = [0u8; uuid::fmt::Hyphenated::LENGTH];
        let id = uuid::Uuid::now_v7().hyphenated().encode_lower(&mut buf);
        Self(HeaderValue::from_str(id).expect("a UUID is a valid header value"))
    }

    pub fn as_str(&self) -> &str {
        // Only ever built from visible ASCII (checked, or a UUID).
        self.0.to_str().unwrap_or_default()
    }
}

/// The protocol a request arrived in on the gRPC or admin port: gRPC itself, gRPC-Web
/// (binary or text) or Connect's unary JSON (or binary) form. The web front
/// (`crate::web`) puts it in the extensions of every request it hands to the layers,
/// translated to gRPC; the trace layer labels the request metrics with it. A request
/// without one is gRPC.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) enum Protocol {
    #[default]
    Grpc,
    GrpcWeb,
    Json,
}

impl Protocol {
    /// Its name in metrics and logs.
    pub(crate) fn label(self) -> &'static str {
        match self {
            Protocol::Grpc => "grpc",
            Protocol::GrpcWeb => "grpc-web",
            Protocol::Json => "json",
        }
    }

    /// Its position in declaration order (gRPC first), for tables indexed by protocol.
    pub(crate) fn index(self) -> usize {
        self as usize
    }

    /// The protocol a request arrived in (gRPC when nothing says otherwise).
    pub(crate) fn of(extensions: &http::Extensions) -> Protocol {
        extensions.get::<Protocol>().copied().unwrap_or_default()
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

/// The client a request is counted for: the address of the end user, which every
/// per-client bound (`peer` rate-limit rules, the Register limit, the login
/// throttle's per-client counts, the fair shares of admission and pushback) and the
/// audit trail use. The transport puts it in the extensions of every request,
/// resolved once by [`TrustedCallers`]: the connection's peer, or the address a
/// trusted caller forwarded in `x-forwarded-for`. IPv4-mapped IPv6 addresses are
/// the IPv4 client they stand for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Client(pub(crate) IpAddr);

/// The client of a request: its [`Client`], else (a request that did not come
/// through the transport) the connection's peer; `None` when neither is known.
pub(crate) fn client_ip(extensions: &http::Extensions) -> Option<IpAddr> {
    match extensions.get::<Client>() {
        Some(client) => Some(client.0),
        None => peer_ip(extensions).map(|ip| ip.to_canonical()),
    }
}

/// The client a request is counted for in the layers' per-client bounds: as
/// [`client_ip`], or [`UNKNOWN_CLIENT`].
pub(crate) fn request_client(request: &http::Request<impl Sized>) -> IpAddr {
    client_ip(request.extensions()).unwrap_or(UNKNOWN_CLIENT)
}

/// The header a calling service names its end user in.
const FORWARDED_FOR: &str = "x-forwarded-for";

/// Entries of `x-forwarded-for` looked at (empty ones included), from the right: a
/// chain of trusted proxies longer than this ends the walk where it stops (see
/// [`TrustedCallers::forwarded_client`]). The header's size is the transport's
/// bound on header lists.
const MAX_FORWARDED_HOPS: usize = 32;

/// The longest identity an entry may name (as the transport keeps them, see
/// [`ClientIdentity`]).
const MAX_IDENTITY_BYTES: usize = 512;

/// Who may name the client of its requests (`AUTHD_TRUSTED_CALLERS`): callers
/// whose connection comes from one of these networks, or whose mutual-TLS identity
/// is one of these, as nginx's `set_real_ip_from`. Empty: nobody; every request's
/// client is its connection's peer.
///
/// Parsed from `ENTRY,…`, each a CIDR (`10.0.0.0/8`, `fd00::/8`), a bare address
/// (`/32` or `/128`) or a client certificate identity as [`ClientIdentity`] has it
/// (a SPIFFE id, a DNS name, a CN), compared exactly. An entry that looks like an
/// address (digits, dots and slashes; or hex digits, colons, dots and slashes with
/// a colon) must be one.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TrustedCallers {
    /// Networks, their host bits cleared; IPv4-mapped IPv6 networks as IPv4 ones
    /// (the addresses they are matched against are canonical).
    nets: Vec<ipnet::IpNet>,
    identities: Vec<Box<str>>,
}

impl TrustedCallers {
    /// The most entries a list may have.
    pub(crate) const MAX_ENTRIES: usize = 256;

    /// Every caller (`0.0.0.0/0` and `::/0`): what `AUTHD_TRUST_FORWARDED_FOR=true`
    /// stands for.
    pub(crate) fn everyone() -> Self {
        Self {
            nets: vec![
                ipnet::IpNet::V4(ipnet::Ipv4Net::default()),
                ipnet::IpNet::V6(ipnet::Ipv6Net::default()),
            ],
            identities: Vec::new(),
        }
    }

    /// The callers trusted by `self` or by `other`.
    pub(crate) fn union(mut self, other: &TrustedCallers) -> Self {
        for net in &other.nets {
            if !self.nets.contains(net) {
                self.nets.push(*net);
            }
        }
        for identity in &other.identities {
            if !self.identities.contains(identity) {
                self.identities.push(identity.clone());
            }
        }
        self
    }

    /// Whether nobody is trusted.
    pub(crate) fn is_empty(&self) -> bool {
        self.nets.is_empty() && self.identities.is_empty()
    }

    /// Whether a caller connected from `peer`, with the client certificate
    /// `identity` if any, may name its end user in `x-forwarded-for`.
    pub(crate) fn trusts(&self, peer: IpAddr, identity: Option<&ClientIdentity>) -> bool {
        self.trusts_address(peer.to_canonical())
            || identity.is_some_and(|id| self.identities.iter().any(|i| **i == *id.as_str()))
    }

    /// Whether `ip` (canonical) is in a trusted network.
    fn trusts_address(&self, ip: IpAddr) -> bool {
        self.nets.iter().any(|net| net.contains(&ip))
    }

    /// The client of a request that a trusted caller connected from `peer` sent with
    /// `headers`: `x-forwarded-for` read from the right (every value of the header,
    /// in order, each a comma-separated list), each entry skipped while it is a
    /// trusted address (a chain of trusted proxies), so the first one that is not
    /// is the client; when every entry is trusted, the leftmost. Empty entries are
    /// skipped. An entry that is no address (`IP`, `IP:port`, `[IPv6]` or
    /// `[IPv6]:port`) ends the walk, as do more than [`MAX_FORWARDED_HOPS`] entries: the client is then the last address
    /// read, or `peer` when there is none (a caller that forwards nothing is its own
    /// client).
    pub(crate) fn forwarded_client(&self, headers: &http::HeaderMap, peer: IpAddr) -> IpAddr {
        let mut client = peer.to_canonical();
        let mut hops = 0;
        for value in headers.get_all(FORWARDED_FOR).iter().rev() {
            for entry in value.as_bytes().rsplit(|b| *b == b',') {
                hops += 1;
                if hops > MAX_FORWARDED_HOPS {
                    return client;
                }
                let entry = entry.trim_ascii();
                if entry.is_empty() {
                    continue;
                }
                let Some(ip) = forwarded_address(entry) else {
                    return client;
                };
                if !self.trusts_address(ip) {
                    return ip;
                }
                client = ip;
            }
        }
        client
    }
}

/// The list as it is in force (networks with their host bits cleared), or `none`.
impl std::fmt::Display for TrustedCallers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.is_empty() {
            return f.write_str("none");
        }
        let nets = self.nets.iter().map(|net| net.to_string());
        let identities = self.identities.iter().map(|id| id.to_string());
        f.write_str(&nets.chain(identities).collect::<Vec<_>>().join(","))
    }
}

/// One entry of `x-forwarded-for`: `IP`, `IP:port`, `[IPv6]` or `[IPv6]:port`,
/// canonical.
fn forwarded_address(entry: &[u8]) -> Option<IpAddr> {
    let text = std::str::from_utf8(entry).ok()?;
    let ip = match text.parse::<IpAddr>() {
        Ok(ip) => ip,
        Err(_) => match text.strip_prefix('[').and_then(|t| t.strip_suffix(']')) {
            Some(v6) => IpAddr::V6(v6.parse().ok()?),
            None => text.parse::<std::net::SocketAddr>().ok()?.ip(),
        },
    };
    Some(ip.to_canonical())
}

impl std::str::FromStr for TrustedCallers {
    type Err = String;

    /// Parses `ENTRY,…` (empty entries skipped), naming the first bad entry.
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let mut callers = TrustedCallers::default();
        let entries = text.split(',').map(str::trim).filter(|e| !e.is_empty());
        for (n, entry) in entries.enumerate() {
            if n == Self::MAX_ENTRIES {
                return Err(format!(
                    "more than {} entries: name networks rather than addresses",
                    Self::MAX_ENTRIES
                ));
            }
            if looks_like_an_address(entry) {
                let net = trusted_network(entry).ok_or_else(|| {
                    format!(
                        "{entry:?} is neither an address nor a CIDR (e.g. 10.0.0.0/8, fd00::/8, \
                         10.1.2.3)"
                    )
                })?;
                if !callers.nets.contains(&net) {
                    callers.nets.push(net);
                }
            } else {
                if entry.len() > MAX_IDENTITY_BYTES || entry.chars().any(char::is_control) {
                    return Err(format!(
                        "{entry:?}: an identity must be at most {MAX_IDENTITY_BYTES} bytes \
                         without control characters"
                    ));
                }
                if !callers.identities.iter().any(|i| **i == *entry) {
                    callers.identities.push(entry.into());
                }
            }
        }
        Ok(callers)
    }
}

/// Whether an entry of the list is meant as an address or a network rather than
/// an identity: IPv4-like (digits, dots, a slash) or IPv6-like (hex digits, colons,
/// dots, slashes, brackets, and at least one colon). No SPIFFE id, DNS name or URI
/// is either; a typo in an address is reported rather than taken for an identity.
fn looks_like_an_address(entry: &str) -> bool {
    let v4 = entry.starts_with(|c: char| c.is_ascii_digit())
        && entry
            .chars()
            .all(|c| c.is_ascii_digit() || c == '.' || c == '/');
    let v6 = entry.contains(':')
        && entry
            .chars()
            .all(|c| c.is_ascii_hexdigit() || matches!(c, ':' | '.' | '/' | '[' | ']'));
    v4 || v6
}

/// A network of the list: a CIDR or a bare address, host bits cleared, an
/// IPv4-mapped IPv6 network as the IPv4 network it stands for.
fn trusted_network(entry: &str) -> Option<ipnet::IpNet> {
    let net = match entry.parse::<ipnet::IpNet>() {
        Ok(net) => net,
        Err(_) => ipnet::IpNet::from(entry.parse::<IpAddr>().ok()?),
    }
    .trunc();
    if let ipnet::IpNet::V6(v6) = net
        && let Some(v4) = v6.addr().to_ipv4_mapped()
        && v6.prefix_len() >= 96
    {
        return ipnet::Ipv4Net::new(v4, v6.prefix_len() - 96)
            .ok()
            .map(ipnet::IpNet::V4);
    }
    Some(net)
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
        assert_eq!(Rpc::NAMED_METHODS[..15], Rpc::AUTH_METHODS);
        assert_eq!(Rpc::NAMED_METHODS[15], Rpc::ExtAuthzCheck);
    }

    fn callers(list: &str) -> TrustedCallers {
        list.parse().unwrap()
    }

    fn ip(text: &str) -> IpAddr {
        text.parse().unwrap()
    }

    /// The client of a request from `peer` with `x-forwarded-for: forwarded`
    /// (several values when it holds `\n`), as the transport resolves it.
    fn client_of(callers: &TrustedCallers, peer: &str, forwarded: &str) -> IpAddr {
        let mut h = http::HeaderMap::new();
        for value in forwarded.split('\n').filter(|v| !v.is_empty()) {
            h.append(FORWARDED_FOR, value.parse().unwrap());
        }
        let peer = ip(peer);
        if callers.trusts(peer, None) {
            callers.forwarded_client(&h, peer)
        } else {
            peer.to_canonical()
        }
    }

    #[test]
    fn the_list_holds_networks_addresses_and_identities() {
        let c = callers(
            " 10.0.0.0/8, fd00::/8 ,192.0.2.7,2001:db8::1,,spiffe://cluster.local/ns/signup/sa/signup,\
             signup.corp, 10.1.2.3/16, ::ffff:198.51.100.0/120",
        );
        assert!(!c.is_empty());
        for trusted in [
            "10.200.0.1",
            "fd12::5",
            "192.0.2.7",
            "2001:db8::1",
            // A network with host bits set is the network.
            "10.1.99.99",
            // An IPv4-mapped network is the IPv4 one; mapped peers are canonical.
            "198.51.100.9",
            "::ffff:198.51.100.9",
            "::ffff:10.0.0.1",
        ] {
            assert!(c.trusts(ip(trusted), None), "{trusted}");
        }
        for untrusted in [
            "11.0.0.1",
            "192.0.2.8",
            "2001:db8::2",
            "fe80::1",
            "198.51.101.1",
        ] {
            assert!(!c.trusts(ip(untrusted), None), "{untrusted}");
        }
        let id = |s: &str| ClientIdentity(std::sync::Arc::from(s));
        let outside = ip("203.0.113.1");
        assert!(c.trusts(
            outside,
            Some(&id("spiffe://cluster.local/ns/signup/sa/signup"))
        ));
        assert!(c.trusts(outside, Some(&id("signup.corp"))));
        assert!(!c.trusts(
            outside,
            Some(&id("spiffe://cluster.local/ns/other/sa/other"))
        ));
        assert!(!c.trusts(outside, None));
        assert!("".parse::<TrustedCallers>().unwrap().is_empty());
        assert!(" , ".parse::<TrustedCallers>().unwrap().is_empty());
        assert!(!TrustedCallers::default().trusts(ip("127.0.0.1"), None));
        assert_eq!(
            callers("10.1.2.3/16, 192.0.2.7,spiffe://a, ::ffff:10.0.0.0/104").to_string(),
            "10.1.0.0/16,192.0.2.7/32,10.0.0.0/8,spiffe://a"
        );
        assert_eq!(TrustedCallers::default().to_string(), "none");
    }

    #[test]
    fn a_bad_entry_is_named() {
        for bad in [
            "10.0.0.0/33",
            "10.0.0.256",
            "10.0.0",
            "fd00::/129",
            "fd00::1::2",
            "[::1]",
            "10.0.0.1:80",
            "10.0.0.0/8/8",
        ] {
            let err = format!("10.0.0.0/8,{bad}")
                .parse::<TrustedCallers>()
                .unwrap_err();
            assert!(err.contains(&format!("{bad:?}")), "{bad}: {err}");
            assert!(!err.contains('\n'), "{err}");
        }
        let long = "x".repeat(MAX_IDENTITY_BYTES + 1);
        assert!(long.parse::<TrustedCallers>().is_err());
        assert!("spiffe://a/\u{7}b".parse::<TrustedCallers>().is_err());
        let many: Vec<String> = (0..=TrustedCallers::MAX_ENTRIES)
            .map(|n| format!("10.{}.{}.0/24", n / 256, n % 256))
            .collect();
        let err = many.join(",").parse::<TrustedCallers>().unwrap_err();
        assert!(err.contains("more than 256 entries"), "{err}");
        assert!(many[1..].join(",").parse::<TrustedCallers>().is_ok());
    }

    #[test]
    fn an_untrusted_caller_is_its_own_client_whatever_it_forwards() {
        let c = callers("10.0.0.0/8");
        assert_eq!(client_of(&c, "192.0.2.1", "203.0.113.9"), ip("192.0.2.1"));
        assert_eq!(
            client_of(&c, "::ffff:192.0.2.1", "203.0.113.9"),
            ip("192.0.2.1")
        );
        let nobody = TrustedCallers::default();
        assert_eq!(
            client_of(&nobody, "10.0.0.1", "203.0.113.9"),
            ip("10.0.0.1")
        );
    }

    #[test]
    fn the_walk_runs_from_the_right_past_trusted_proxies() {
        let c = callers("10.0.0.0/8,fd00::/8");
        let peer = "10.0.0.1";
        // A trusted caller that forwards nothing, or an empty header, is its own client.
        assert_eq!(client_of(&c, peer, ""), ip(peer));
        assert_eq!(client_of(&c, peer, " , "), ip(peer));
        assert_eq!(client_of(&c, peer, "203.0.113.9"), ip("203.0.113.9"));
        // A spoofed leftmost entry is ignored: the rightmost untrusted one counts.
        assert_eq!(
            client_of(&c, peer, "198.51.100.66, 203.0.113.9, 10.0.0.2, 10.0.0.3"),
            ip("203.0.113.9")
        );
        // Every value of the header, in order, as one list.
        assert_eq!(
            client_of(&c, peer, "198.51.100.66\n203.0.113.9, 10.0.0.2\n10.0.0.3"),
            ip("203.0.113.9")
        );
        assert_eq!(
            client_of(&c, peer, "198.51.100.66\n10.0.0.2"),
            ip("198.51.100.66")
        );
        // Every entry trusted: the leftmost.
        assert_eq!(client_of(&c, peer, "10.0.0.9, 10.0.0.2"), ip("10.0.0.9"));
        // Ports, brackets, IPv6 and mapped addresses.
        assert_eq!(client_of(&c, peer, "203.0.113.9:4711"), ip("203.0.113.9"));
        assert_eq!(
            client_of(&c, peer, "[2001:db8::1]:4711, [fd00::2]"),
            ip("2001:db8::1")
        );
        assert_eq!(client_of(&c, peer, "[2001:db8::1]"), ip("2001:db8::1"));
        assert_eq!(client_of(&c, peer, "2001:db8::1"), ip("2001:db8::1"));
        assert_eq!(client_of(&c, peer, "::ffff:203.0.113.9"), ip("203.0.113.9"));
        assert_eq!(
            client_of(&c, peer, "203.0.113.9, [::ffff:10.0.0.2]:80"),
            ip("203.0.113.9")
        );
        assert_eq!(client_of(&c, "fd00::7", "2001:db8::9"), ip("2001:db8::9"));
        assert_eq!(
            client_of(&c, "::ffff:10.0.0.1", "203.0.113.9"),
            ip("203.0.113.9")
        );
    }

    #[test]
    fn an_entry_that_is_no_address_ends_the_walk() {
        let c = callers("10.0.0.0/8");
        let peer = "10.0.0.1";
        assert_eq!(client_of(&c, peer, "unknown"), ip(peer));
        assert_eq!(client_of(&c, peer, "203.0.113.9, unknown"), ip(peer));
        // The last address read, a trusted one, when garbage stands before it.
        assert_eq!(
            client_of(&c, peer, "203.0.113.9, junk, 10.0.0.5"),
            ip("10.0.0.5")
        );
        assert_eq!(
            client_of(&c, peer, "203.0.113.9, junk, 192.0.2.5"),
            ip("192.0.2.5")
        );
        for junk in [
            "2001:db8:::1",
            "[2001:db8::1",
            "203.0.113.9:port",
            "fe80::1%eth0",
            "_hidden",
            "203.0.113.9 198.51.100.1",
        ] {
            assert_eq!(client_of(&c, peer, junk), ip(peer), "{junk}");
        }
        // Bytes that are no text.
        let mut h = http::HeaderMap::new();
        h.insert(
            FORWARDED_FOR,
            http::HeaderValue::from_bytes(b"203.0.113.9, \xff").unwrap(),
        );
        assert_eq!(c.forwarded_client(&h, ip(peer)), ip(peer));
    }

    #[test]
    fn the_walk_looks_at_a_bounded_number_of_entries() {
        let c = callers("10.0.0.0/8");
        let peer = "10.0.0.1";
        let proxies = |n: usize| -> Vec<String> {
            (0..n)
                .map(|i| format!("10.0.{}.{}", i / 250, i % 250 + 1))
                .collect()
        };
        // The client behind as many trusted proxies as the bound: found.
        let mut hops = proxies(MAX_FORWARDED_HOPS - 1);
        hops.insert(0, "203.0.113.9".into());
        assert_eq!(client_of(&c, peer, &hops.join(", ")), ip("203.0.113.9"));
        // Behind more: the walk ends at the last address it read.
        let mut hops = proxies(MAX_FORWARDED_HOPS);
        let last_read = ip(&hops[0]);
        hops.insert(0, "203.0.113.9".into());
        assert_eq!(client_of(&c, peer, &hops.join(", ")), last_read);
        // Thousands of entries (within the transport's header bound): the rightmost
        // untrusted one, found at once.
        let many = vec!["198.51.100.1"; 1500].join(",");
        assert_eq!(client_of(&c, peer, &many), ip("198.51.100.1"));
        // Empty entries count too: a few are skipped, a flood of them ends the walk.
        assert_eq!(client_of(&c, peer, "203.0.113.9,, ,"), ip("203.0.113.9"));
        let flood = format!("203.0.113.9{}", ",".repeat(5000));
        assert_eq!(client_of(&c, peer, &flood), ip(peer));
    }

    #[test]
    fn everyone_trusted_is_the_leftmost_hop() {
        let c = TrustedCallers::everyone();
        assert!(c.trusts(ip("192.0.2.1"), None) && c.trusts(ip("2001:db8::1"), None));
        assert_eq!(
            client_of(&c, "192.0.2.1", "203.0.113.9, 10.0.0.1"),
            ip("203.0.113.9")
        );
        assert_eq!(client_of(&c, "192.0.2.1", "unknown"), ip("192.0.2.1"));
        let both = callers("10.0.0.0/8,spiffe://a").union(&TrustedCallers::everyone());
        assert_eq!(both.nets.len(), 3);
        assert_eq!(
            both.union(&callers("10.0.0.0/8,spiffe://a"))
                .identities
                .len(),
            1
        );
    }

    #[test]
    fn the_client_is_the_transport_s_else_the_canonical_peer() {
        let mut request = http::Request::new(());
        assert_eq!(request_client(&request), UNKNOWN_CLIENT);
        request.extensions_mut().insert(TcpConnectInfo {
            local_addr: None,
            remote_addr: Some("[::ffff:10.0.0.7]:5000".parse().unwrap()),
        });
        assert_eq!(request_client(&request), ip("10.0.0.7"));
        request.extensions_mut().insert(Client(ip("203.0.113.9")));
        assert_eq!(client_ip(request.extensions()), Some(ip("203.0.113.9")));
    }
}
