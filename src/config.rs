//! The one configuration of authd: every option is a flag and an `AUTHD_*`
//! environment variable, with its default shown by `authd --help`.
//!
//! Values are parsed and checked here, so a bad value stops the start with one
//! clear line. Secrets (token keys) are never printed: `--help` hides their
//! environment values and their `Debug` is redacted.

use crate::ratelimit::{FailureMode, RateLimits, RedisUrl};
use crate::token::KeyRing;
use clap::{Parser, Subcommand, ValueEnum};
use std::{fmt, net::SocketAddr, path::PathBuf, str::FromStr, time::Duration};

/// authd: a gRPC authentication service (Register, Login, ValidateToken).
///
/// Serves auth.v1.AuthService, grpc.health.v1.Health and server reflection on one
/// port. Every option can also be set with the environment variable shown.
#[derive(Debug, Clone, Parser)]
#[command(name = "authd", version, about, long_about, max_term_width = 100)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Option<Command>,

    #[command(flatten)]
    pub config: Config,
}

#[derive(Debug, Clone, Subcommand)]
pub enum Command {
    /// Serve gRPC until SIGTERM or SIGINT (the default when no command is given).
    Serve,
    /// Create or upgrade the database schema, then exit.
    Migrate,
    /// Measure this machine's PBKDF2 rate with the server's hashing code, then exit:
    /// hashes/s per thread and in total, the hash-bound limit of logins and registrations.
    HashBench {
        /// PBKDF2 iterations per hash [default: --pbkdf2-iterations].
        #[arg(long, value_parser = clap::value_parser!(u32).range(1000..))]
        iterations: Option<u32>,
        /// Threads hashing at once [default: --hash-threads].
        #[arg(long, value_parser = clap::value_parser!(u32).range(1..=1024))]
        threads: Option<u32>,
        /// How long each thread hashes (e.g. 3s, 10s).
        #[arg(long, default_value = "3s", value_parser = positive_duration)]
        duration: Duration,
        /// Print the result as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Ask a running authd for its grpc.health.v1 status, then exit: 0 when SERVING,
    /// 1 with one line saying why otherwise (NOT_SERVING, SERVICE_UNKNOWN, unreachable,
    /// timeout). For container healthchecks and exec probes.
    Health {
        /// The server, HOST:PORT [default: loopback on the port of --listen].
        #[arg(long)]
        addr: Option<String>,
        /// The service to ask about; empty means the whole server.
        #[arg(long, default_value = "")]
        service: String,
        /// Longest the check may take, connecting included.
        #[arg(long, default_value = "2s", value_parser = positive_duration)]
        timeout: Duration,
    },
}

#[derive(Debug, Clone, Parser)]
pub struct Config {
    /// Address the gRPC server listens on.
    #[arg(
        long,
        env = "AUTHD_LISTEN",
        default_value = "0.0.0.0:50051",
        global = true
    )]
    pub listen: SocketAddr,

    /// Database URL: sqlite://PATH (created if missing) or
    /// postgres://USER:PASSWORD@HOST:PORT/DB[?sslmode=require] (shared by replicas).
    #[arg(
        long,
        env = "AUTHD_DATABASE_URL",
        default_value = "sqlite://authd.db",
        global = true
    )]
    pub database_url: DatabaseUrl,

    /// Connections in the database read pool.
    #[arg(long, env = "AUTHD_DB_MAX_CONNECTIONS", default_value_t = 8,
          value_parser = clap::value_parser!(u32).range(1..=1024), global = true)]
    pub db_max_connections: u32,

    /// How long a query waits for a free connection before failing with UNAVAILABLE.
    #[arg(long, env = "AUTHD_DB_ACQUIRE_TIMEOUT", default_value = "5s",
          value_parser = positive_duration, global = true)]
    pub db_acquire_timeout: Duration,

    /// Most registrations the SQLite writer commits in one transaction.
    #[arg(long, env = "AUTHD_SQLITE_MAX_BATCH", default_value_t = 256,
          value_parser = clap::value_parser!(u32).range(1..=10_000), global = true)]
    pub sqlite_max_batch: u32,

    /// PBKDF2-SHA256 iterations for new password hashes (at least 1000; OWASP: 600000).
    #[arg(long, env = "AUTHD_PBKDF2_ITERATIONS", default_value_t = 600_000,
          value_parser = clap::value_parser!(u32).range(1000..), global = true)]
    pub pbkdf2_iterations: u32,

    /// Threads that hash passwords [default: the number of cores].
    #[arg(long, env = "AUTHD_HASH_THREADS",
          value_parser = clap::value_parser!(u32).range(1..=1024), global = true)]
    pub hash_threads: Option<u32>,

    /// Hash jobs that may wait for a thread; beyond it requests get RESOURCE_EXHAUSTED
    /// [default: 64 per hash thread].
    #[arg(long, env = "AUTHD_HASH_QUEUE",
          value_parser = clap::value_parser!(u32).range(1..=1_000_000), global = true)]
    pub hash_queue: Option<u32>,

    /// AuthService requests in flight at once; beyond it requests get RESOURCE_EXHAUSTED.
    #[arg(long, env = "AUTHD_MAX_IN_FLIGHT", default_value_t = 4096,
          value_parser = clap::value_parser!(u32).range(1..=1_000_000), global = true)]
    pub max_in_flight: u32,

    /// Token keys, KID:BASE64KEY,… (each key at least 32 bytes); the first signs, all
    /// verify [default: a random key, with a warning].
    #[arg(
        long,
        env = "AUTHD_TOKEN_KEYS",
        hide_env_values = true,
        conflicts_with = "token_keys_file",
        global = true
    )]
    pub token_keys: Option<KeyRing>,

    /// File holding the token keys in the AUTHD_TOKEN_KEYS format.
    #[arg(long, env = "AUTHD_TOKEN_KEYS_FILE", global = true)]
    pub token_keys_file: Option<PathBuf>,

    /// Lifetime of issued tokens (e.g. 15m, 1h, 1d).
    #[arg(long, env = "AUTHD_TOKEN_TTL", default_value = "1h",
          value_parser = positive_duration, global = true)]
    pub token_ttl: Duration,

    /// How often health checks the database.
    #[arg(long, env = "AUTHD_HEALTH_INTERVAL", default_value = "5s",
          value_parser = positive_duration, global = true)]
    pub health_interval: Duration,

    /// On SIGTERM/SIGINT, how long requests in flight may take to finish.
    #[arg(long, env = "AUTHD_DRAIN_TIMEOUT", default_value = "20s",
          value_parser = positive_duration, global = true)]
    pub drain_timeout: Duration,

    /// Redis for rate limits shared by every replica: redis://[:PASSWORD@]HOST:PORT[/DB]
    /// [default: none; the rules are enforced per replica, in process].
    #[arg(long, env = "AUTHD_REDIS_URL", hide_env_values = true,
          value_parser = RedisUrl::value_parser(), global = true)]
    pub redis_url: Option<RedisUrl>,

    /// Rate-limit rules, METHOD:KEY=LIMIT/WINDOW,… where METHOD is an RPC name or *, and
    /// KEY is peer, global or header:NAME; e.g. Login:peer=20/1s,*:global=2000/1s
    /// [default: none; nothing is limited].
    #[arg(long, env = "AUTHD_RATE_LIMITS", global = true)]
    pub rate_limits: Option<RateLimits>,

    /// Prefix of every Redis key of the rate limiter (replicas sharing limits use the same).
    #[arg(
        long,
        env = "AUTHD_RATE_LIMIT_PREFIX",
        default_value = "authd:rl",
        global = true
    )]
    pub rate_limit_prefix: String,

    /// Longest a request waits for Redis before the limiter falls back.
    #[arg(long, env = "AUTHD_REDIS_TIMEOUT", default_value = "50ms",
          value_parser = positive_duration, global = true)]
    pub redis_timeout: Duration,

    /// While Redis fails: open enforces the rules per replica in process; closed refuses
    /// rate-limited requests with UNAVAILABLE.
    #[arg(
        long,
        env = "AUTHD_RATE_LIMIT_FAILURE",
        default_value = "open",
        value_enum,
        global = true
    )]
    pub rate_limit_failure: FailureMode,

    /// Count `peer` rules by the first x-forwarded-for hop instead of the connection's
    /// address: only behind a proxy that sets that header (clients can forge it).
    #[arg(long, env = "AUTHD_TRUST_FORWARDED_FOR", default_value_t = false,
          num_args = 0..=1, require_equals = true, default_missing_value = "true",
          action = clap::ArgAction::Set, value_parser = clap::builder::BoolishValueParser::new(),
          global = true)]
    pub trust_forwarded_for: bool,

    /// Address of the Prometheus endpoint (GET /metrics, plain HTTP); empty or "off"
    /// turns it off.
    #[arg(
        long,
        env = "AUTHD_METRICS_LISTEN",
        default_value = "0.0.0.0:9090",
        global = true
    )]
    pub metrics_listen: MetricsListen,

    /// Log filter, in tracing's EnvFilter syntax (e.g. info, authd=debug).
    #[arg(long, env = "AUTHD_LOG", default_value = "info",
          value_parser = log_filter, global = true)]
    pub log: String,

    /// Log format.
    #[arg(
        long,
        env = "AUTHD_LOG_FORMAT",
        default_value = "text",
        value_enum,
        global = true
    )]
    pub log_format: LogFormat,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

impl Config {
    /// The defaults, as `authd` with no flags would use them (ignoring the environment).
    pub fn defaults() -> Self {
        let mut cli = Cli::command_for_defaults();
        cli.config.token_keys = None;
        cli.config
    }

    /// Hash threads, resolving the default.
    pub fn hash_threads(&self) -> usize {
        match self.hash_threads {
            Some(n) => n as usize,
            None => std::thread::available_parallelism().map_or(1, usize::from),
        }
    }

    /// Hash queue bound, resolving the default.
    pub fn hash_queue(&self) -> usize {
        match self.hash_queue {
            Some(n) => n as usize,
            None => 64 * self.hash_threads(),
        }
    }

    /// The configured key ring, read from the file if one is named; `None` when no
    /// key is configured.
    pub fn key_ring(&self) -> anyhow::Result<Option<KeyRing>> {
        if let Some(ring) = &self.token_keys {
            return Ok(Some(ring.clone()));
        }
        let Some(path) = &self.token_keys_file else {
            return Ok(None);
        };
        let text = std::fs::read_to_string(path)
            .map_err(|e| anyhow::anyhow!("cannot read token keys file {}: {e}", path.display()))?;
        let ring = text
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty() && !l.starts_with('#'))
            .collect::<Vec<_>>()
            .join(",")
            .parse::<KeyRing>()
            .map_err(|e| anyhow::anyhow!("token keys file {}: {e}", path.display()))?;
        Ok(Some(ring))
    }
}

impl Cli {
    fn command_for_defaults() -> Self {
        use clap::{CommandFactory, FromArgMatches};
        // Parse an empty command line with environment lookups turned off.
        let mut command = Cli::command();
        command = command.mut_args(|a| a.env(None::<&str>));
        let matches = command
            .try_get_matches_from(["authd"])
            .expect("the defaults parse");
        Cli::from_arg_matches(&matches).expect("the defaults parse")
    }
}

/// Where the metrics endpoint listens, if anywhere.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MetricsListen(pub Option<SocketAddr>);

impl MetricsListen {
    pub const OFF: MetricsListen = MetricsListen(None);

    pub fn addr(&self) -> Option<SocketAddr> {
        self.0
    }
}

impl FromStr for MetricsListen {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim() {
            "" | "off" => Ok(MetricsListen::OFF),
            addr => addr.parse().map(|a| MetricsListen(Some(a))).map_err(|_| {
                format!("{addr:?} is not an address (expected HOST:PORT, e.g. 0.0.0.0:9090, or empty for none)")
            }),
        }
    }
}

impl fmt::Display for MetricsListen {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Some(addr) => write!(f, "{addr}"),
            None => f.write_str("off"),
        }
    }
}

/// Where users are stored.
#[derive(Clone, PartialEq, Eq)]
pub enum DatabaseUrl {
    Sqlite(PathBuf),
    /// A `postgres://` URL, kept whole for sqlx (which reads `sslmode` and the
    /// other parameters from it); printed with its password hidden.
    Postgres(String),
}

impl FromStr for DatabaseUrl {
    type Err = String;

    fn from_str(url: &str) -> Result<Self, Self::Err> {
        let (scheme, rest) = url
            .split_once(':')
            .ok_or_else(|| format!("{url:?} is not a URL (expected sqlite://PATH)"))?;
        match scheme {
            "sqlite" => {
                let path = rest.strip_prefix("//").unwrap_or(rest);
                if path.is_empty() {
                    return Err("sqlite:// needs a file path, e.g. sqlite://authd.db".into());
                }
                if path.contains('?') {
                    return Err("sqlite URLs take no query parameters: authd sets its own".into());
                }
                if path == ":memory:" || path.starts_with("file::memory:") {
                    return Err(
                        "in-memory SQLite is not supported: authd needs a file it can share \
                         between its writer and readers"
                            .into(),
                    );
                }
                Ok(DatabaseUrl::Sqlite(PathBuf::from(path)))
            }
            "postgres" | "postgresql" => {
                sqlx::postgres::PgConnectOptions::from_str(url)
                    .map_err(|e| format!("invalid PostgreSQL URL: {e}"))?;
                Ok(DatabaseUrl::Postgres(url.to_owned()))
            }
            other => Err(format!(
                "unsupported database URL scheme {other:?} (expected sqlite://PATH or postgres://…)"
            )),
        }
    }
}

impl fmt::Display for DatabaseUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DatabaseUrl::Sqlite(path) => write!(f, "sqlite://{}", path.display()),
            DatabaseUrl::Postgres(url) => f.write_str(&redact_password(url)),
        }
    }
}

impl fmt::Debug for DatabaseUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

/// `scheme://user:secret@host/…` → `scheme://user:***@host/…`.
fn redact_password(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let authority_end = rest.find(['/', '?']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(authority_end);
    match authority.rsplit_once('@') {
        Some((userinfo, host)) if userinfo.contains(':') => {
            let user = userinfo.split(':').next().unwrap_or_default();
            format!("{scheme}://{user}:***@{host}{tail}")
        }
        _ => url.to_owned(),
    }
}

fn positive_duration(s: &str) -> Result<Duration, String> {
    let d = humantime::parse_duration(s).map_err(|e| format!("{e} (examples: 500ms, 15m, 1h)"))?;
    if d.is_zero() {
        return Err("must be greater than zero".into());
    }
    Ok(d)
}

fn log_filter(s: &str) -> Result<String, String> {
    tracing_subscriber::EnvFilter::try_new(s)
        .map(|_| s.to_owned())
        .map_err(|e| format!("not a valid log filter: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn the_command_line_is_well_formed() {
        Cli::command().debug_assert();
    }

    #[test]
    fn defaults_match_the_documentation() {
        let c = Config::defaults();
        assert_eq!(c.listen, "0.0.0.0:50051".parse().unwrap());
        assert_eq!(c.database_url, DatabaseUrl::Sqlite("authd.db".into()));
        assert_eq!(c.pbkdf2_iterations, 600_000);
        assert_eq!(c.token_ttl, Duration::from_secs(3600));
        assert_eq!(c.log_format, LogFormat::Text);
        assert_eq!(c.hash_queue(), 64 * c.hash_threads());
        assert_eq!(
            c.metrics_listen,
            MetricsListen(Some("0.0.0.0:9090".parse().unwrap()))
        );
    }

    #[test]
    fn an_empty_metrics_address_turns_the_endpoint_off() {
        assert_eq!("".parse::<MetricsListen>().unwrap(), MetricsListen::OFF);
        assert_eq!("off".parse::<MetricsListen>().unwrap(), MetricsListen::OFF);
        assert_eq!(
            "127.0.0.1:0".parse::<MetricsListen>().unwrap().addr(),
            Some("127.0.0.1:0".parse().unwrap())
        );
        assert!("nowhere".parse::<MetricsListen>().is_err());
        let matches = Cli::command()
            .mut_args(|a| a.env(None::<&str>))
            .try_get_matches_from(["authd", "--metrics-listen", ""])
            .unwrap();
        let cli = <Cli as clap::FromArgMatches>::from_arg_matches(&matches).unwrap();
        assert_eq!(cli.config.metrics_listen, MetricsListen::OFF);
    }

    #[test]
    fn database_urls() {
        assert_eq!(
            "sqlite:///var/lib/authd/users.db"
                .parse::<DatabaseUrl>()
                .unwrap(),
            DatabaseUrl::Sqlite("/var/lib/authd/users.db".into())
        );
        assert_eq!(
            "sqlite:data.db".parse::<DatabaseUrl>().unwrap(),
            DatabaseUrl::Sqlite("data.db".into())
        );
        let pg: DatabaseUrl = "postgres://authd:s3cret@db:5432/authd?sslmode=require"
            .parse()
            .unwrap();
        assert_eq!(
            pg.to_string(),
            "postgres://authd:***@db:5432/authd?sslmode=require"
        );
        assert!(!format!("{pg:?}").contains("s3cret"));
        let no_password: DatabaseUrl = "postgresql://authd@db/authd".parse().unwrap();
        assert_eq!(no_password.to_string(), "postgresql://authd@db/authd");
        assert!(
            "postgres://db/x?sslmode=sometimes"
                .parse::<DatabaseUrl>()
                .is_err()
        );
        for bad in [
            "authd.db",
            "sqlite://",
            "sqlite::memory:",
            "mysql://x/y",
            "sqlite://a.db?mode=ro",
        ] {
            assert!(bad.parse::<DatabaseUrl>().is_err(), "{bad:?}");
        }
    }

    #[test]
    fn bad_values_are_refused_with_a_message() {
        let parse = |args: &[&str]| {
            Cli::command()
                .mut_args(|a| a.env(None::<&str>))
                .try_get_matches_from(std::iter::once("authd").chain(args.iter().copied()))
                .map(|_| ())
                .map_err(|e| e.to_string())
        };
        assert!(
            parse(&["--pbkdf2-iterations", "999"])
                .unwrap_err()
                .contains("999")
        );
        assert!(
            parse(&["--token-keys", "k:c2hvcnQ="])
                .unwrap_err()
                .contains("at least 32 bytes")
        );
        assert!(parse(&["--log-format", "xml"]).unwrap_err().contains("xml"));
        assert!(
            parse(&["--database-url", "ftp://x"])
                .unwrap_err()
                .contains("ftp")
        );
        assert!(
            parse(&["--token-ttl", "0s"])
                .unwrap_err()
                .contains("greater than zero")
        );
        assert!(parse(&["--listen", "nowhere"]).is_err());
        assert!(parse(&["--pbkdf2-iterations", "1000", "migrate"]).is_ok());
    }
}
