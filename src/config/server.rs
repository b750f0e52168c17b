//! The server's own options: where the gRPC and health ports listen, the bounds of
//! every connection of the gRPC port, how often health probes the store, the drain
//! on shutdown and the priority of the runtime's threads.
//!
//! [`ServerConfig::connection_limits`] builds the transport's [`Limits`], the per-client
//! default resolved and the connection cap fitted under the file-descriptor limit.
//! TLS has a group of its own (`tls`); the metrics port belongs to `telemetry`.

use super::parse::{MetricsListen, positive_duration};
use crate::{priority::Policy, transport::Limits};
use clap::Args;
use std::{net::SocketAddr, time::Duration};

/// File descriptors kept free for the database, Redis, the other listeners and logs
/// when the connection cap is fitted under the process's limit.
const RESERVED_FDS: u64 = 256;

/// The listeners, the connections' bounds, health and shutdown.
#[derive(Debug, Clone, Args)]
pub struct ServerConfig {
    /// Address the gRPC server listens on.
    #[arg(
        long,
        env = "AUTHD_LISTEN",
        default_value = "0.0.0.0:50051",
        global = true,
        display_order = 5
    )]
    pub listen: SocketAddr,

    /// Connections the gRPC port keeps open at once; beyond it a new connection is closed
    /// at once (kept below the process's file-descriptor limit).
    #[arg(long, env = "AUTHD_MAX_CONNECTIONS", default_value_t = 10_000,
          value_parser = clap::value_parser!(u32).range(1..=1_000_000), global = true,
          display_order = 24)]
    pub max_connections: u32,

    /// Connections one client IP address may keep open on the gRPC port [default: a tenth
    /// of --max-connections].
    #[arg(long, env = "AUTHD_MAX_CONNECTIONS_PER_CLIENT",
          value_parser = clap::value_parser!(u32).range(1..=1_000_000), global = true,
          display_order = 25)]
    pub max_connections_per_client: Option<u32>,

    /// HTTP/2 streams (requests) one connection may have open at once (advertised to the
    /// client in SETTINGS_MAX_CONCURRENT_STREAMS).
    #[arg(long, env = "AUTHD_MAX_STREAMS_PER_CONNECTION", default_value_t = 100,
          value_parser = clap::value_parser!(u32).range(1..=100_000), global = true,
          display_order = 26)]
    pub max_streams_per_connection: u32,

    /// Longest a new connection may take to send the HTTP/2 preface (on the metrics port:
    /// a request's whole headers); then it is closed.
    #[arg(long, env = "AUTHD_HANDSHAKE_TIMEOUT", default_value = "10s",
          value_parser = positive_duration, global = true, display_order = 27)]
    pub handshake_timeout: Duration,

    /// A connection with no request open for this long is closed (gracefully: GOAWAY).
    #[arg(long, env = "AUTHD_IDLE_TIMEOUT", default_value = "5m",
          value_parser = positive_duration, global = true, display_order = 28)]
    pub idle_timeout: Duration,

    /// How often an HTTP/2 connection is pinged; a peer that does not answer within
    /// --keepalive-timeout is closed (dead peers, half-open connections).
    #[arg(long, env = "AUTHD_KEEPALIVE_INTERVAL", default_value = "30s",
          value_parser = positive_duration, global = true, display_order = 29)]
    pub keepalive_interval: Duration,

    /// How long an HTTP/2 keepalive ping may go unanswered.
    #[arg(long, env = "AUTHD_KEEPALIVE_TIMEOUT", default_value = "20s",
          value_parser = positive_duration, global = true, display_order = 30)]
    pub keepalive_timeout: Duration,

    /// Address of a plaintext port that serves only grpc.health.v1, on a thread of its own,
    /// so probes answer however busy the gRPC port is; empty or "off" turns it off.
    #[arg(
        long,
        env = "AUTHD_HEALTH_LISTEN",
        default_value = "0.0.0.0:50052",
        global = true,
        display_order = 36
    )]
    pub health_listen: MetricsListen,

    /// Nice value of the threads that answer AuthService requests (0 to 19: the
    /// runtime's workers and the database threads they start): above 0, the thread
    /// of the health-only port answers probes first when the cores are busy.
    #[arg(long, env = "AUTHD_RUNTIME_THREAD_NICE", default_value_t = 5,
          value_parser = clap::value_parser!(u8).range(0..=19), global = true, display_order = 38)]
    pub runtime_thread_nice: u8,

    /// Scheduling policy of the threads that answer AuthService requests: normal, the
    /// default, right for every host; or batch (Linux's SCHED_BATCH): a woken thread
    /// lets the running one finish its turn, so a Login costs fewer context switches
    /// and a core kept busy by Logins answers more of them. Choose batch for such
    /// hosts on Linux 6.6 or later; on older kernels it can delay a request by up to
    /// a scheduler tick (1 to 10 ms) while the hashing threads are busy. Probes are
    /// not affected.
    #[arg(long, env = "AUTHD_RUNTIME_THREAD_POLICY", value_enum, default_value_t = Policy::Normal,
          global = true, display_order = 96)]
    pub runtime_thread_policy: Policy,

    /// How often health checks the database.
    #[arg(long, env = "AUTHD_HEALTH_INTERVAL", default_value = "5s",
          value_parser = positive_duration, global = true, display_order = 48)]
    pub health_interval: Duration,

    /// Browser origins (comma-separated, exact: https://app.example.com:8443) whose pages
    /// may call the gRPC and admin ports with gRPC-Web or JSON (CORS), with credentials;
    /// empty allows none and sends no CORS headers.
    #[arg(long, env = "AUTHD_CORS_ORIGINS", default_value = "", value_parser = cors_origins,
          global = true, display_order = 111)]
    pub cors_origins: CorsOrigins,

    /// On SIGTERM/SIGINT, how long requests in flight may take to finish.
    #[arg(long, env = "AUTHD_DRAIN_TIMEOUT", default_value = "20s",
          value_parser = positive_duration, global = true, display_order = 49)]
    pub drain_timeout: Duration,
}

/// The origins of `AUTHD_CORS_ORIGINS`, checked.
#[derive(Debug, Clone, Default)]
pub struct CorsOrigins(pub(crate) Vec<http::HeaderValue>);

impl std::str::FromStr for CorsOrigins {
    type Err = String;

    fn from_str(value: &str) -> Result<Self, String> {
        crate::web::parse_origins(value).map(CorsOrigins)
    }
}

fn cors_origins(value: &str) -> Result<CorsOrigins, String> {
    value.parse()
}

impl ServerConfig {
    /// The CORS policy of the gRPC and admin ports.
    pub(crate) fn cors(&self) -> crate::web::Cors {
        crate::web::Cors::new(self.cors_origins.0.clone())
    }

    /// Connections per client, resolving the default.
    pub fn max_connections_per_client(&self) -> u32 {
        self.max_connections_per_client
            .unwrap_or((self.max_connections / 10).max(1))
    }

    /// The bounds of the gRPC port's connections, with the connection cap fitted
    /// under `fd_limit`, the process's file-descriptor limit (`None` when unknown):
    /// running out of descriptors would fail accepts, database connections and log
    /// files alike.
    pub(crate) fn connection_limits(&self, fd_limit: Option<u64>) -> Limits {
        let mut max_connections = u64::from(self.max_connections);
        if let Some(fds) = fd_limit {
            let fits = fds.saturating_sub(
                RESERVED_FDS + crate::transport::AUXILIARY_MAX_CONNECTIONS as u64 * 2,
            );
            if max_connections > fits {
                tracing::warn!(
                    max_connections,
                    fd_limit = fds,
                    "AUTHD_MAX_CONNECTIONS is above what the open-file limit allows; using {fits}"
                );
                max_connections = fits.max(1);
            }
        }
        let max_connections = max_connections as usize;
        Limits {
            max_connections,
            max_connections_per_client: (self.max_connections_per_client() as usize)
                .min(max_connections),
            handshake_timeout: self.handshake_timeout,
            idle_timeout: self.idle_timeout,
            keepalive_interval: Some(self.keepalive_interval),
            keepalive_timeout: self.keepalive_timeout,
            max_concurrent_streams: self.max_streams_per_connection,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;

    #[test]
    fn the_connection_cap_fits_under_the_file_descriptor_limit() {
        let mut c = Config::defaults().server;
        c.max_connections = 10_000;
        c.max_connections_per_client = None;
        let unbounded = c.connection_limits(None);
        assert_eq!(unbounded.max_connections, 10_000);
        assert_eq!(unbounded.max_connections_per_client, 1_000);
        let fitted = c.connection_limits(Some(2048));
        assert!(fitted.max_connections < 2048 - RESERVED_FDS as usize);
        assert!(fitted.max_connections_per_client <= fitted.max_connections);
        assert_eq!(c.connection_limits(Some(0)).max_connections, 1);
    }
}
