//! The handlers: where a decoded request becomes a use case of `crate::accounts`
//! and its outcome an answer, one module per service a client calls.
//!
//! - `grpc`: `auth.v1.AuthService` on the gRPC port: proto <-> domain;
//! - `extauthz`: external authorization for the proxies in front of other services:
//!   Envoy's `Check` on the gRPC port and HTTP forward-auth on its own port, verified
//!   as ValidateToken, with identity headers;
//! - `admin`: `auth.admin.v1.AdminService` on its own listener: admin keys and
//!   roles, its rate limit, proto <-> domain, audited.
//!
//! They stand below the layers (`crate::layers`) and the decoder (`crate::codec`),
//! above `crate::accounts`; none imports another.

pub(crate) mod admin;
pub(crate) mod extauthz;
pub(crate) mod grpc;
