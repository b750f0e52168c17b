//! The one configuration of authd: every option is a flag and an `AUTHD_*`
//! environment variable, with its default shown by `authd --help`. The exception:
//! the trace exporter's settings are OpenTelemetry's standard `OTEL_*` variables
//! (`OTEL_EXPORTER_OTLP_ENDPOINT`, `OTEL_SERVICE_NAME`, `OTEL_TRACES_SAMPLER`,
//! `OTEL_TRACES_SAMPLER_ARG`), which collectors' docs and operators expect.
//!
//! Values are parsed and checked here, so a bad value stops the start with one
//! clear line. Secrets (the database and Redis URLs, the token keys, the account
//! digest key) are never printed: `--help` hides their environment values, a bad
//! value's error names the option but not the value (`secret::parser`), `Display`
//! and `Debug` redact them, and each can be read from a file (`*_FILE`) so that it
//! shows in neither `ps` nor the environment. [`secrets_on_command_line`] finds those given as flags anyway.

use crate::access::AllowList;
use crate::otel::{SamplerKind, TraceSettings};
use crate::ratelimit::{FailureMode, RateLimits, RegisterLimit};
use crate::secret::{self, DigestKey, RedisUrl, SecretUrl};
use crate::token::{self, KeyRing};
use anyhow::Context as _;
use clap::{ArgMatches, Parser, Subcommand, ValueEnum, parser::ValueSource};
use std::{
    fmt,
    net::SocketAddr,
    path::{Path, PathBuf},
    str::FromStr,
    time::Duration,
};

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
        /// Hashes per batch [default: the engine's lanes, as under load; 1 is the rate
        /// of requests that come one at a time].
        #[arg(long, value_parser = clap::value_parser!(u32).range(1..=64))]
        batch: Option<u32>,
        /// Also measure the pbkdf2 crate (one hash at a time), in the same run.
        #[arg(long)]
        compare: bool,
        /// Print the result as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Ask a running authd for its grpc.health.v1 status, then exit: 0 when SERVING,
    /// 1 with one line saying why otherwise (NOT_SERVING, SERVICE_UNKNOWN, unreachable,
    /// timeout). For container healthchecks and exec probes.
    Health {
        /// The server, HOST:PORT [default: loopback on the port of --health-listen, or of
        /// --listen when the health port is off].
        #[arg(long)]
        addr: Option<String>,
        /// The service to ask about: empty (the whole server) or auth.v1.AuthService
        /// for readiness (NOT_SERVING while the database does not answer); liveness
        /// for liveness (SERVING as long as the process serves, whatever the database).
        #[arg(long, default_value = "")]
        service: String,
        /// Longest the check may take, connecting included.
        #[arg(long, default_value = "2s", value_parser = positive_duration)]
        timeout: Duration,
        /// Speak TLS, trusting the CAs of this PEM bundle (the gRPC port with
        /// AUTHD_TLS_CERT; the health-only port is always plaintext) [default with
        /// an https:// address: the Mozilla roots].
        #[arg(long = "tls-ca")]
        tls_ca: Option<PathBuf>,
        /// PEM certificate to present to a server with mutual TLS (AUTHD_TLS_CLIENT_CA).
        #[arg(long = "tls-cert", id = "health_tls_cert", requires = "health_tls_key")]
        tls_cert: Option<PathBuf>,
        /// PEM private key of --tls-cert.
        #[arg(long = "tls-key", id = "health_tls_key", requires = "health_tls_cert")]
        tls_key: Option<PathBuf>,
        /// The name the server's certificate must carry [default: the host of --addr].
        #[arg(long = "tls-server-name")]
        tls_server_name: Option<String>,
    },
    /// Print a new token key on stdout as one AUTHD_TOKEN_KEYS entry (KID:ALG:BASE64),
    /// then exit: append it to the key file (second, to roll it out; first, to sign
    /// with it). The output is a private key: keep it out of logs and terminals' history.
    Keygen {
        /// ed25519: tokens anyone can verify from the JWKS document, only authd can sign
        /// (choose it whenever other services verify tokens); hs256: a shared secret
        /// that verifies and signs alike.
        #[arg(long, value_enum, default_value = "ed25519")]
        alg: KeyAlgorithm,
        /// The key's id, 1 to 64 characters of A-Z a-z 0-9 . _ - [default: the date
        /// and 8 random hex digits, e.g. 20260301-1a2b3c4d].
        #[arg(long)]
        kid: Option<String>,
    },
}

/// The algorithm of a new key (`authd keygen --alg`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum KeyAlgorithm {
    /// Ed25519 (JWT alg EdDSA).
    Ed25519,
    /// HMAC-SHA256 (JWT alg HS256).
    Hs256,
}

impl KeyAlgorithm {
    pub fn algorithm(self) -> token::Algorithm {
        match self {
            KeyAlgorithm::Ed25519 => token::Algorithm::EdDsa,
            KeyAlgorithm::Hs256 => token::Algorithm::Hs256,
        }
    }
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
    #[arg(long, env = "AUTHD_DATABASE_URL", default_value = "sqlite://authd.db",
          hide_env_values = true, value_parser = secret::parser::<DatabaseUrl>(), global = true)]
    pub database_url: DatabaseUrl,

    /// File holding the database URL (surrounding whitespace ignored), instead of
    /// --database-url: keeps its password out of `ps` and the environment. Read at start.
    #[arg(
        long,
        env = "AUTHD_DATABASE_URL_FILE",
        conflicts_with = "database_url",
        global = true
    )]
    pub database_url_file: Option<PathBuf>,

    /// Connections in the database read pool.
    #[arg(long, env = "AUTHD_DB_MAX_CONNECTIONS", default_value_t = 8,
          value_parser = clap::value_parser!(u32).range(1..=1024), global = true)]
    pub db_max_connections: u32,

    /// How long a query waits for a free connection before failing with UNAVAILABLE.
    #[arg(long, env = "AUTHD_DB_ACQUIRE_TIMEOUT", default_value = "5s",
          value_parser = positive_duration, global = true)]
    pub db_acquire_timeout: Duration,

    /// Longest one database statement may run once it has a connection, then the
    /// request fails with UNAVAILABLE (PostgreSQL's statement_timeout; authd also gives
    /// up on its own shortly after, for a database that stopped answering). A store
    /// operation takes at most AUTHD_DB_ACQUIRE_TIMEOUT plus about twice this.
    #[arg(long, env = "AUTHD_DB_STATEMENT_TIMEOUT", default_value = "2s",
          value_parser = positive_duration, global = true)]
    pub db_statement_timeout: Duration,

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

    /// Hash jobs that may wait for a thread (the count bound); beyond it requests get
    /// RESOURCE_EXHAUSTED, except a client below its fair share (up to twice the bound)
    /// [default: 64 per hash thread].
    #[arg(long, env = "AUTHD_HASH_QUEUE",
          value_parser = clap::value_parser!(u32).range(1..=1_000_000), global = true)]
    pub hash_queue: Option<u32>,

    /// Longest expected wait in the hash queue: places are granted while the queue
    /// ahead, at the hashing rate measured on the threads, would be worked through
    /// within it (never fewer than two full batches per thread, and within
    /// --hash-queue); beyond it RESOURCE_EXHAUSTED.
    #[arg(long, env = "AUTHD_HASH_QUEUE_WAIT", default_value = "150ms",
          value_parser = positive_duration, global = true)]
    pub hash_queue_wait: Duration,

    /// AuthService requests in flight at once; beyond it requests get RESOURCE_EXHAUSTED.
    #[arg(long, env = "AUTHD_MAX_IN_FLIGHT", default_value_t = 4096,
          value_parser = clap::value_parser!(u32).range(1..=1_000_000), global = true)]
    pub max_in_flight: u32,

    /// AuthService requests one client (IP address; the x-forwarded-for client with
    /// --trust-forwarded-for) may always have open at once, being received or in flight;
    /// past it a client may open more while more than this many places of
    /// --max-in-flight stay free, beyond that RESOURCE_EXHAUSTED [default: a quarter of
    /// --max-in-flight].
    #[arg(long, env = "AUTHD_MAX_IN_FLIGHT_PER_CLIENT",
          value_parser = clap::value_parser!(u32).range(1..=1_000_000), global = true)]
    pub max_in_flight_per_client: Option<u32>,

    /// Longest a refused request is held before its answer: a RESOURCE_EXHAUSTED answer
    /// with a retry hint (full hash queue, in-flight caps, rate limits, login throttle)
    /// is sent at its hint or its slot of --refusal-rate, whichever is later, at most
    /// this long after and before half the time left to the client's deadline, and its
    /// RetryInfo says what is left of the hint; 0s answers refusals at once (at most 1m).
    #[arg(long, env = "AUTHD_REFUSAL_HOLD", default_value = "10s",
          value_parser = refusal_hold, global = true)]
    pub refusal_hold: Duration,

    /// Refusals answered per second while refusals are held: each takes the next slot
    /// of this pace (or waits out its hint, if later), within --refusal-hold, so a
    /// crowd that re-asks at once costs the server at most about this many refusals
    /// a second.
    #[arg(long, env = "AUTHD_REFUSAL_RATE", default_value_t = 500,
          value_parser = clap::value_parser!(u32).range(1..=1_000_000), global = true)]
    pub refusal_rate: u32,

    /// Refused requests held at once, in all; beyond it a refusal is answered at once.
    #[arg(long, env = "AUTHD_REFUSAL_HOLD_MAX", default_value_t = 16_384,
          value_parser = clap::value_parser!(u32).range(1..=1_000_000), global = true)]
    pub refusal_hold_max: u32,

    /// Refused requests held at once for one client (IP address; the x-forwarded-for
    /// client with --trust-forwarded-for) [default: half of --refusal-hold-max].
    #[arg(long, env = "AUTHD_REFUSAL_HOLD_MAX_PER_CLIENT",
          value_parser = clap::value_parser!(u32).range(1..=1_000_000), global = true)]
    pub refusal_hold_max_per_client: Option<u32>,

    /// Longest a request may take to arrive, from its headers to the end of its body; a
    /// request not received by then gets DEADLINE_EXCEEDED. It holds no in-flight place
    /// until it has arrived.
    #[arg(long, env = "AUTHD_RECEIVE_TIMEOUT", default_value = "5s",
          value_parser = positive_duration, global = true)]
    pub receive_timeout: Duration,

    /// Connections the gRPC port keeps open at once; beyond it a new connection is closed
    /// at once (kept below the process's file-descriptor limit).
    #[arg(long, env = "AUTHD_MAX_CONNECTIONS", default_value_t = 10_000,
          value_parser = clap::value_parser!(u32).range(1..=1_000_000), global = true)]
    pub max_connections: u32,

    /// Connections one client IP address may keep open on the gRPC port [default: a tenth
    /// of --max-connections].
    #[arg(long, env = "AUTHD_MAX_CONNECTIONS_PER_CLIENT",
          value_parser = clap::value_parser!(u32).range(1..=1_000_000), global = true)]
    pub max_connections_per_client: Option<u32>,

    /// HTTP/2 streams (requests) one connection may have open at once (advertised to the
    /// client in SETTINGS_MAX_CONCURRENT_STREAMS).
    #[arg(long, env = "AUTHD_MAX_STREAMS_PER_CONNECTION", default_value_t = 100,
          value_parser = clap::value_parser!(u32).range(1..=100_000), global = true)]
    pub max_streams_per_connection: u32,

    /// Longest a new connection may take to send the HTTP/2 preface (on the metrics port:
    /// a request's whole headers); then it is closed.
    #[arg(long, env = "AUTHD_HANDSHAKE_TIMEOUT", default_value = "10s",
          value_parser = positive_duration, global = true)]
    pub handshake_timeout: Duration,

    /// A connection with no request open for this long is closed (gracefully: GOAWAY).
    #[arg(long, env = "AUTHD_IDLE_TIMEOUT", default_value = "5m",
          value_parser = positive_duration, global = true)]
    pub idle_timeout: Duration,

    /// How often an HTTP/2 connection is pinged; a peer that does not answer within
    /// --keepalive-timeout is closed (dead peers, half-open connections).
    #[arg(long, env = "AUTHD_KEEPALIVE_INTERVAL", default_value = "30s",
          value_parser = positive_duration, global = true)]
    pub keepalive_interval: Duration,

    /// How long an HTTP/2 keepalive ping may go unanswered.
    #[arg(long, env = "AUTHD_KEEPALIVE_TIMEOUT", default_value = "20s",
          value_parser = positive_duration, global = true)]
    pub keepalive_timeout: Duration,

    /// PEM file of the gRPC port's certificate, then its intermediates: with --tls-key the
    /// port speaks only TLS (HTTP/2 over TLS 1.2 or 1.3, ALPN h2) [default: none;
    /// plaintext]. Re-read when it changes (see --tls-reload). Given before any subcommand.
    #[arg(long, env = "AUTHD_TLS_CERT", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,

    /// PEM file of the private key of --tls-cert (PKCS#8, PKCS#1 or SEC1). Re-read when it
    /// changes.
    #[arg(long, env = "AUTHD_TLS_KEY", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,

    /// PEM bundle of the CAs client certificates must chain to: mutual TLS, a client
    /// without such a certificate fails the handshake [default: none; no client
    /// certificate asked]. Re-read when it changes.
    #[arg(long, env = "AUTHD_TLS_CLIENT_CA", requires = "tls_cert")]
    pub tls_client_ca: Option<PathBuf>,

    /// How often the TLS files are checked for changes (modification time and size);
    /// new connections use the new files, open ones keep theirs.
    #[arg(long, env = "AUTHD_TLS_RELOAD", default_value = "10s",
          value_parser = positive_duration)]
    pub tls_reload: Duration,

    /// Client identities allowed per AuthService method under mutual TLS,
    /// METHOD:IDENTITY,… with METHOD an RPC name or *; e.g.
    /// Register:spiffe://corp/ns/web/sa/signup. A method named here refuses other clients
    /// with PERMISSION_DENIED; others are open to every client certificate
    /// [default: none; every method open].
    #[arg(long, env = "AUTHD_TLS_ALLOW", requires = "tls_client_ca")]
    pub tls_allow: Option<AllowList>,

    /// Address of a plaintext port that serves only grpc.health.v1, on a thread of its own,
    /// so probes answer however busy the gRPC port is; empty or "off" turns it off.
    #[arg(
        long,
        env = "AUTHD_HEALTH_LISTEN",
        default_value = "0.0.0.0:50052",
        global = true
    )]
    pub health_listen: MetricsListen,

    /// PBKDF2 engine: auto picks the fastest this CPU runs (sha-ni, then avx2, then
    /// portable); naming one forces it, and the start fails if the CPU lacks it.
    #[arg(
        long,
        env = "AUTHD_HASH_BACKEND",
        default_value = "auto",
        value_enum,
        global = true
    )]
    pub hash_backend: HashBackend,

    /// Nice value of the threads that answer AuthService requests (0 to 19: the
    /// runtime's workers and the database threads they start): above 0, the thread
    /// of the health-only port answers probes first when the cores are busy.
    #[arg(long, env = "AUTHD_RUNTIME_THREAD_NICE", default_value_t = 5,
          value_parser = clap::value_parser!(u8).range(0..=19), global = true)]
    pub runtime_thread_nice: u8,

    /// Nice value of the hashing threads (0 to 19): above 0, the threads that answer
    /// requests and probes run first when the cores are busy hashing.
    #[arg(long, env = "AUTHD_HASH_THREAD_NICE", default_value_t = 10,
          value_parser = clap::value_parser!(u8).range(0..=19), global = true)]
    pub hash_thread_nice: u8,

    /// Token keys, comma-separated; the first signs, all verify. Each is KID:BASE64KEY or
    /// KID:hs256:BASE64KEY (HMAC, at least 32 bytes) or KID:ed25519:BASE64 (an Ed25519
    /// private key in PKCS#8 DER); `authd keygen` makes one [default: a random HMAC key,
    /// with a warning].
    #[arg(long, env = "AUTHD_TOKEN_KEYS", hide_env_values = true,
          conflicts_with = "token_keys_file", value_parser = secret::parser::<KeyRing>(),
          global = true)]
    pub token_keys: Option<KeyRing>,

    /// File holding the token keys in the AUTHD_TOKEN_KEYS format, one or more per line
    /// (blank lines and # comments ignored). Re-read while serving (see
    /// --token-keys-reload): a changed file that parses replaces the ring, one that
    /// does not is refused with an error in the log and the ring in use stays.
    #[arg(long, env = "AUTHD_TOKEN_KEYS_FILE", global = true)]
    pub token_keys_file: Option<PathBuf>,

    /// How often --token-keys-file is re-read; a new content takes effect at once.
    #[arg(long, env = "AUTHD_TOKEN_KEYS_RELOAD", default_value = "10s",
          value_parser = positive_duration, global = true)]
    pub token_keys_reload: Duration,

    /// Audience of every token issued (its aud claim), e.g. the name of the services
    /// meant to accept them; several, comma-separated, make aud an array. ValidateToken
    /// checks it only when the request names an audience [default: none; no aud claim].
    #[arg(long, env = "AUTHD_TOKEN_AUDIENCE", value_delimiter = ',',
          value_parser = token_audience, global = true)]
    pub token_audience: Vec<String>,

    /// Clock skew allowed between the clocks of authd replicas: ValidateToken accepts a
    /// token whose nbf or iat lies this far in the future, or whose exp lies this far in
    /// the past (0s for none, at most 5m).
    #[arg(long, env = "AUTHD_TOKEN_CLOCK_SKEW", default_value = "30s",
          value_parser = clock_skew, global = true)]
    pub token_clock_skew: Duration,

    /// Lifetime of access tokens (e.g. 5m, 15m, 1h), at most 7d; never past their
    /// session's end. Short, since Refresh issues new ones.
    #[arg(long, env = "AUTHD_TOKEN_TTL", default_value = "15m",
          value_parser = token_ttl, global = true)]
    pub token_ttl: Duration,

    /// Longest a session lives from its Login, however often it is refreshed (e.g. 12h,
    /// 30d), at most 365d; then the user logs in again.
    #[arg(long, env = "AUTHD_REFRESH_TTL", default_value = "30d",
          value_parser = refresh_ttl, global = true)]
    pub refresh_ttl: Duration,

    /// How soon every replica refuses the access tokens of a session ended on another
    /// (each polls the database for ended sessions every half of it); at once on the
    /// replica that ended it. At least 10ms.
    #[arg(long, env = "AUTHD_REVOCATION_DELAY", default_value = "1s",
          value_parser = revocation_delay, global = true)]
    pub revocation_delay: Duration,

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
          value_parser = secret::parser::<RedisUrl>(), global = true)]
    pub redis_url: Option<RedisUrl>,

    /// File holding the Redis URL (surrounding whitespace ignored), instead of
    /// --redis-url: keeps its password out of `ps` and the environment. Read at start.
    #[arg(
        long,
        env = "AUTHD_REDIS_URL_FILE",
        conflicts_with = "redis_url",
        global = true
    )]
    pub redis_url_file: Option<PathBuf>,

    /// Rate-limit rules, METHOD:KEY=LIMIT/WINDOW,… where METHOD is an RPC name or *, and
    /// KEY is peer, global, client-cert (the mutual-TLS identity) or header:NAME; e.g.
    /// Login:peer=20/1s,*:global=2000/1s
    /// [default: none; only --register-limit applies].
    #[arg(long, env = "AUTHD_RATE_LIMITS", global = true)]
    pub rate_limits: Option<RateLimits>,

    /// Register requests each client address may make, LIMIT/WINDOW (a rule
    /// Register:peer=LIMIT/WINDOW beside --rate-limits, shared through Redis like
    /// them), or off. Register tells a taken username from a free one, so this bounds
    /// how fast one client can test names. A Register:peer rule in --rate-limits
    /// replaces it. Turn it off for a registration benchmark from one load generator.
    #[arg(
        long,
        env = "AUTHD_REGISTER_LIMIT",
        default_value = "100/1m",
        global = true
    )]
    pub register_limit: RegisterLimit,

    /// Prefix of every Redis key of the rate limiter (replicas sharing limits use the same).
    #[arg(
        long,
        env = "AUTHD_RATE_LIMIT_PREFIX",
        default_value = "authd:rl",
        global = true
    )]
    pub rate_limit_prefix: String,

    /// Longest a request waits for Redis (a rate-limit decision, a login throttle
    /// count) before falling back as AUTHD_RATE_LIMIT_FAILURE says.
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

    /// Most keys the in-process rate limiter tracks; beyond it, requests with keys not
    /// yet tracked share one overflow count per rule (memory stays bounded whatever
    /// clients send).
    #[arg(long, env = "AUTHD_RATE_LIMIT_MAX_KEYS", default_value_t = 100_000,
          value_parser = clap::value_parser!(u32).range(1..=100_000_000), global = true)]
    pub rate_limit_max_keys: u32,

    /// The bundled list of the 100,000 most common passwords (SecLists): on refuses them at
    /// Register, compared after NFKC and case-insensitively; off turns the list off (the
    /// --password-blocklist-file list and the rule that a password must not be the
    /// username still apply).
    #[arg(
        long,
        env = "AUTHD_PASSWORD_BLOCKLIST",
        default_value = "on",
        value_enum,
        global = true
    )]
    pub password_blocklist: Switch,

    /// A file of more passwords to refuse, one per line (UTF-8, at most 64 MiB; empty lines
    /// and a trailing \r ignored), compared like the bundled list. Read at start.
    #[arg(long, env = "AUTHD_PASSWORD_BLOCKLIST_FILE", global = true)]
    pub password_blocklist_file: Option<PathBuf>,

    /// Consecutive failed logins of one client (its address, as the rate limiter's peer
    /// key sees it) for one username before that client's next attempts for it are
    /// refused for --login-delay, doubling per further failure; a success resets the
    /// count. Unknown usernames are counted alike. 0 turns the login throttle off.
    #[arg(long, env = "AUTHD_LOGIN_FAILURES", default_value_t = 5,
          value_parser = clap::value_parser!(u32).range(0..=1000), global = true)]
    pub login_failures: u32,

    /// The first delay of a throttled client; it doubles with each further failure.
    #[arg(long, env = "AUTHD_LOGIN_DELAY", default_value = "1s",
          value_parser = positive_duration, global = true)]
    pub login_delay: Duration,

    /// The longest delay of one client for one username.
    #[arg(long, env = "AUTHD_LOGIN_DELAY_MAX", default_value = "15m",
          value_parser = positive_duration, global = true)]
    pub login_delay_max: Duration,

    /// Failed logins for one username across all clients (each client's first
    /// --login-failures count, so one address alone never reaches it; once it is
    /// reached, every failure counts) before every client that has not logged in to
    /// it before is delayed too. Must be greater than --login-failures.
    #[arg(long, env = "AUTHD_LOGIN_ACCOUNT_FAILURES", default_value_t = 20,
          value_parser = clap::value_parser!(u32).range(1..=100_000), global = true)]
    pub login_account_failures: u32,

    /// The longest delay of the across-clients count: short, so that the owner, told
    /// when to retry, gets in while a distributed attack makes a guess or so per delay
    /// (at most --login-delay-max).
    #[arg(long, env = "AUTHD_LOGIN_ACCOUNT_DELAY_MAX", default_value = "1m",
          value_parser = positive_duration, global = true)]
    pub login_account_delay_max: Duration,

    /// Key of the keyed digest (HMAC-SHA256) that names an account in the login
    /// throttle's Redis keys and in audit events, base64, at least 32 bytes; the same
    /// on every replica. Set it to keep the counts and the audit trail's `account`
    /// stable across token key rotations [default: derived from the signing key].
    #[arg(long, env = "AUTHD_ACCOUNT_DIGEST_KEY", hide_env_values = true,
          conflicts_with = "account_digest_key_file",
          value_parser = secret::parser::<DigestKey>(), global = true)]
    pub account_digest_key: Option<DigestKey>,

    /// File holding the account digest key (surrounding whitespace ignored), instead
    /// of --account-digest-key: keeps it out of `ps` and the environment. Read at
    /// start.
    #[arg(long, env = "AUTHD_ACCOUNT_DIGEST_KEY_FILE", global = true)]
    pub account_digest_key_file: Option<PathBuf>,

    /// Most entries of the in-process login throttle (used without Redis, or while it
    /// fails): about 300 bytes each, so the default bounds it near 30 MB.
    #[arg(long, env = "AUTHD_LOGIN_THROTTLE_MAX_ENTRIES", default_value_t = 100_000,
          value_parser = clap::value_parser!(u32).range(1..=100_000_000), global = true)]
    pub login_throttle_max_entries: u32,

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

    /// Where to send traces: an OpenTelemetry collector's OTLP/gRPC address (e.g.
    /// http://otel-collector:4317). Unset: no traces. The standard OpenTelemetry
    /// variable, so collectors and operators find it where they expect.
    #[arg(long, env = "OTEL_EXPORTER_OTLP_ENDPOINT", value_parser = otlp_endpoint, global = true)]
    pub otlp_endpoint: Option<String>,

    /// The service.name of the traces.
    #[arg(
        long,
        env = "OTEL_SERVICE_NAME",
        default_value = "authd",
        global = true
    )]
    pub otel_service_name: String,

    /// Which traces are recorded; the parentbased_ samplers follow the caller's
    /// traceparent, and decide by themselves only for traces that start here.
    #[arg(
        long,
        env = "OTEL_TRACES_SAMPLER",
        default_value = "parentbased_always_on",
        value_enum,
        global = true
    )]
    pub otel_traces_sampler: SamplerKind,

    /// The fraction of traces the traceidratio samplers record, 0 to 1.
    #[arg(long, env = "OTEL_TRACES_SAMPLER_ARG", default_value = "1.0",
          value_parser = sampler_ratio, global = true)]
    pub otel_traces_sampler_arg: f64,

    /// Ended spans waiting for export at most; beyond, spans are dropped and counted
    /// (authd_trace_spans_dropped_total), never waited for.
    #[arg(long, env = "AUTHD_TRACE_QUEUE", default_value = "2048",
          value_parser = clap::value_parser!(u32).range(1..=1_000_000), global = true)]
    pub trace_queue: u32,
}

/// An OTLP/gRPC endpoint: an `http://` URL (TLS to the collector is not built in:
/// send to a collector on the same host or pod, which forwards over TLS).
fn otlp_endpoint(value: &str) -> Result<String, String> {
    let uri: http::Uri = value
        .parse()
        .map_err(|_| "not a URL (e.g. http://otel-collector:4317)".to_owned())?;
    match (uri.scheme_str(), uri.host()) {
        (Some("http"), Some(_)) => Ok(value.to_owned()),
        (Some("https"), _) => {
            Err("https is not supported: use an http:// collector address".into())
        }
        _ => Err("expected http://HOST:PORT (e.g. http://otel-collector:4317)".into()),
    }
}

/// A ratio from 0 to 1.
fn sampler_ratio(value: &str) -> Result<f64, String> {
    match value.parse::<f64>() {
        Ok(r) if (0.0..=1.0).contains(&r) => Ok(r),
        _ => Err("expected a number from 0 to 1".into()),
    }
}

/// Which PBKDF2 kernels hash passwords.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum HashBackend {
    /// The fastest this CPU runs.
    Auto,
    /// x86-64 SHA extensions, four chains interleaved per core.
    #[value(name = "sha-ni")]
    ShaNi,
    /// x86-64 AVX2, eight chains per core (for CPUs without SHA extensions).
    Avx2,
    /// One chain at a time on the sha2 crate's compression; runs everywhere.
    Portable,
}

impl HashBackend {
    /// The engine this names, or why this CPU cannot run it.
    pub fn engine(self) -> anyhow::Result<pbkdf2_lanes::Engine> {
        use pbkdf2_lanes::{Backend, Engine};
        let backend = match self {
            HashBackend::Auto => return Ok(Engine::detect()),
            HashBackend::ShaNi => Backend::ShaNi,
            HashBackend::Avx2 => Backend::Avx2,
            HashBackend::Portable => Backend::Portable,
        };
        Engine::with_backend(backend).ok_or_else(|| {
            anyhow::anyhow!(
                "--hash-backend {}: this CPU does not have the instructions it needs",
                backend.name()
            )
        })
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

/// A feature that is on or off.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Switch {
    On,
    Off,
}

impl Switch {
    pub fn is_on(self) -> bool {
        self == Switch::On
    }
}

impl Config {
    /// The defaults, as `authd` with no flags would use them (ignoring the environment).
    pub fn defaults() -> Self {
        let mut cli = Cli::command_for_defaults();
        cli.config.token_keys = None;
        cli.config
    }

    /// What tracing needs of the configuration.
    pub fn trace_settings(&self) -> TraceSettings {
        TraceSettings {
            endpoint: self.otlp_endpoint.clone(),
            service_name: self.otel_service_name.clone(),
            sampler: self.otel_traces_sampler,
            sampler_arg: self.otel_traces_sampler_arg,
            queue: self.trace_queue as usize,
        }
    }

    /// Hash threads, resolving the default.
    pub fn hash_threads(&self) -> usize {
        match self.hash_threads {
            Some(n) => n as usize,
            None => std::thread::available_parallelism().map_or(1, usize::from),
        }
    }

    /// In-flight requests per client, resolving the default.
    pub fn max_in_flight_per_client(&self) -> u32 {
        self.max_in_flight_per_client
            .unwrap_or((self.max_in_flight / 4).max(1))
    }

    /// Refusals held per client, resolving the default.
    pub fn refusal_hold_max_per_client(&self) -> u32 {
        self.refusal_hold_max_per_client
            .unwrap_or((self.refusal_hold_max / 2).max(1))
    }

    /// Connections per client, resolving the default.
    pub fn max_connections_per_client(&self) -> u32 {
        self.max_connections_per_client
            .unwrap_or((self.max_connections / 10).max(1))
    }

    /// Hash queue bound, resolving the default.
    pub fn hash_queue(&self) -> usize {
        match self.hash_queue {
            Some(n) => n as usize,
            None => 64 * self.hash_threads(),
        }
    }

    /// Reads the secrets named by `--database-url-file`, `--redis-url-file` and
    /// `--account-digest-key-file` into their options; `main` calls it before serving
    /// or migrating.
    /// An error names the option and the file, never what the file holds.
    pub fn read_secret_files(&mut self) -> anyhow::Result<()> {
        if let Some(path) = &self.database_url_file {
            self.database_url = read_secret_file("--database-url-file", path)?;
        }
        if let Some(path) = &self.redis_url_file {
            self.redis_url = Some(read_secret_file("--redis-url-file", path)?);
        }
        if let Some(path) = &self.account_digest_key_file {
            self.account_digest_key = Some(read_secret_file("--account-digest-key-file", path)?);
        }
        Ok(())
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
        crate::token::keyfile::load(path).map(|(ring, _)| Some(ring))
    }
}

/// Reads one secret from a file: the whole file, surrounding whitespace trimmed.
fn read_secret_file<T: FromStr<Err = String>>(option: &str, path: &Path) -> anyhow::Result<T> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("{option} {}: cannot read the file", path.display()))?;
    let text = text.trim();
    if text.is_empty() {
        anyhow::bail!("{option} {}: the file is empty", path.display());
    }
    text.parse()
        .map_err(|why| anyhow::anyhow!("{option} {}: {why}", path.display()))
}

/// The secret-bearing options given as flags on this command line, which every local
/// user can read (`ps`, `/proc/PID/cmdline`), each with the forms that keep it out
/// of sight. A database URL counts only when it holds a password.
pub fn secrets_on_command_line(matches: &ArgMatches) -> Vec<(&'static str, &'static str)> {
    let on_command_line = |id: &str| matches.value_source(id) == Some(ValueSource::CommandLine);
    let mut found = Vec::new();
    if on_command_line("database_url")
        && matches
            .get_one::<DatabaseUrl>("database_url")
            .is_some_and(DatabaseUrl::has_secret)
    {
        found.push((
            "--database-url",
            "AUTHD_DATABASE_URL or --database-url-file",
        ));
    }
    if on_command_line("redis_url")
        && matches
            .get_one::<RedisUrl>("redis_url")
            .is_some_and(RedisUrl::has_secret)
    {
        found.push(("--redis-url", "AUTHD_REDIS_URL or --redis-url-file"));
    }
    if on_command_line("token_keys") {
        found.push(("--token-keys", "AUTHD_TOKEN_KEYS or --token-keys-file"));
    }
    if on_command_line("account_digest_key") {
        found.push((
            "--account-digest-key",
            "AUTHD_ACCOUNT_DIGEST_KEY or --account-digest-key-file",
        ));
    }
    found
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
    Postgres(SecretUrl),
}

impl DatabaseUrl {
    /// Whether printing the URL hides anything (a PostgreSQL password).
    pub fn has_secret(&self) -> bool {
        match self {
            DatabaseUrl::Sqlite(_) => false,
            DatabaseUrl::Postgres(url) => url.has_secret(),
        }
    }
}

/// Connection parameters sqlx reads from a PostgreSQL URL; it logs any other one
/// with its value, at warn, when it connects.
const SQLX_POSTGRES_PARAMETERS: [&str; 17] = [
    "sslmode",
    "ssl-mode",
    "sslrootcert",
    "ssl-root-cert",
    "ssl-ca",
    "sslcert",
    "ssl-cert",
    "sslkey",
    "ssl-key",
    "statement-cache-capacity",
    "host",
    "hostaddr",
    "port",
    "dbname",
    "user",
    "password",
    "application_name",
];

/// Refuses a parameter that looks like a secret but that sqlx does not know (say,
/// libpq's `sslpassword`): sqlx would ignore it and log its value.
fn check_postgres_parameters(url: &str) -> Result<(), String> {
    let Some((_, query)) = url.split_once('?') else {
        return Ok(());
    };
    let query = query.split_once('#').map_or(query, |(q, _)| q);
    for name in query
        .split('&')
        .map(|pair| pair.split('=').next().unwrap_or(pair))
    {
        // Decoded as sqlx decodes it (form encoding: `+` is a space).
        let decoded = name.replace('+', " ");
        let decoded = percent_encoding::percent_decode_str(&decoded).decode_utf8_lossy();
        let known = SQLX_POSTGRES_PARAMETERS.contains(&decoded.as_ref())
            || decoded == "options"
            || decoded.starts_with("options[");
        if !known && secret::is_secret_parameter(name) {
            return Err(format!(
                "the PostgreSQL URL parameter {decoded:?} is not supported (only \
                 \"password\" is; any other would be ignored and logged with its value)"
            ));
        }
    }
    Ok(())
}

/// A URL scheme as RFC 3986 spells one; anything else before a `:` may be a secret.
fn is_scheme(s: &str) -> bool {
    s.len() <= 32
        && s.starts_with(|c: char| c.is_ascii_alphabetic())
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'))
}

impl FromStr for DatabaseUrl {
    type Err = String;

    /// Parses a database URL. The error never quotes the URL: it may hold a password.
    fn from_str(url: &str) -> Result<Self, Self::Err> {
        const NOT_A_URL: &str = "not a URL (expected sqlite://PATH or postgres://…)";
        let (scheme, rest) = url.split_once(':').ok_or(NOT_A_URL)?;
        if !is_scheme(scheme) {
            return Err(NOT_A_URL.into());
        }
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
                // sqlx's errors name the part that is wrong, never the password.
                sqlx::postgres::PgConnectOptions::from_str(url)
                    .map_err(|e| format!("invalid PostgreSQL URL: {e}"))?;
                check_postgres_parameters(url)?;
                Ok(DatabaseUrl::Postgres(SecretUrl::new(url)))
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
            DatabaseUrl::Postgres(url) => fmt::Display::fmt(url, f),
        }
    }
}

impl fmt::Debug for DatabaseUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

/// A refusal hold: zero (answer at once) up to a minute (past it a client's own
/// deadline or patience is the bound that matters).
fn refusal_hold(s: &str) -> Result<Duration, String> {
    let d = humantime::parse_duration(s).map_err(|e| format!("{e} (examples: 0s, 500ms, 2s)"))?;
    if d > Duration::from_secs(60) {
        return Err("must be at most 1m".into());
    }
    Ok(d)
}

fn positive_duration(s: &str) -> Result<Duration, String> {
    let d = humantime::parse_duration(s).map_err(|e| format!("{e} (examples: 500ms, 15m, 1h)"))?;
    if d.is_zero() {
        return Err("must be greater than zero".into());
    }
    Ok(d)
}

fn token_ttl(s: &str) -> Result<Duration, String> {
    let ttl = positive_duration(s)?;
    if ttl > crate::token::MAX_TTL {
        return Err(format!(
            "must be at most {} (a token outlives a stolen credential that long at worst)",
            humantime::format_duration(crate::token::MAX_TTL)
        ));
    }
    Ok(ttl)
}

fn refresh_ttl(s: &str) -> Result<Duration, String> {
    let ttl = positive_duration(s)?;
    if ttl > Duration::from_secs(365 * 24 * 3600) {
        return Err("must be at most 365d".into());
    }
    Ok(ttl)
}

fn revocation_delay(s: &str) -> Result<Duration, String> {
    let delay = positive_duration(s)?;
    if delay < Duration::from_millis(10) {
        return Err(
            "must be at least 10ms (each replica polls the database every half of it)".into(),
        );
    }
    Ok(delay)
}

fn clock_skew(s: &str) -> Result<Duration, String> {
    let skew = humantime::parse_duration(s).map_err(|e| format!("{e} (examples: 0s, 30s, 2m)"))?;
    if skew > token::MAX_CLOCK_SKEW {
        return Err(format!(
            "must be at most {}",
            humantime::format_duration(token::MAX_CLOCK_SKEW)
        ));
    }
    Ok(skew)
}

fn token_audience(s: &str) -> Result<String, String> {
    let audience = s.trim();
    if audience.is_empty() || audience.len() > token::MAX_AUDIENCE_BYTES {
        return Err(format!(
            "an audience must be 1 to {} bytes",
            token::MAX_AUDIENCE_BYTES
        ));
    }
    if audience.chars().any(char::is_control) {
        return Err("an audience must not hold control characters".into());
    }
    Ok(audience.to_owned())
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
        assert_eq!(c.token_ttl, Duration::from_secs(15 * 60));
        assert_eq!(c.refresh_ttl, Duration::from_secs(30 * 24 * 3600));
        assert_eq!(c.revocation_delay, Duration::from_secs(1));
        assert_eq!(c.log_format, LogFormat::Text);
        assert_eq!(c.hash_queue(), 64 * c.hash_threads());
        assert_eq!(c.db_statement_timeout, Duration::from_secs(2));
        assert_eq!(c.token_clock_skew, crate::token::DEFAULT_CLOCK_SKEW);
        assert_eq!(c.token_keys_reload, Duration::from_secs(10));
        assert!(c.token_audience.is_empty());
        assert_eq!(
            c.metrics_listen,
            MetricsListen(Some("0.0.0.0:9090".parse().unwrap()))
        );
    }

    #[test]
    fn traces_are_off_by_default_and_take_the_standard_variables() {
        let c = Config::defaults();
        assert_eq!(c.otlp_endpoint, None);
        assert_eq!(c.otel_service_name, "authd");
        assert_eq!(c.otel_traces_sampler, SamplerKind::ParentBasedAlwaysOn);
        let cli = Cli::try_parse_from([
            "authd",
            "--otlp-endpoint",
            "http://127.0.0.1:4317",
            "--otel-traces-sampler",
            "parentbased_traceidratio",
            "--otel-traces-sampler-arg",
            "0.25",
        ])
        .unwrap();
        let settings = cli.config.trace_settings();
        assert_eq!(settings.endpoint.as_deref(), Some("http://127.0.0.1:4317"));
        assert_eq!(settings.sampler, SamplerKind::ParentBasedTraceIdRatio);
        assert_eq!(settings.sampler_arg, 0.25);
        for (flag, bad) in [
            ("--otlp-endpoint", "127.0.0.1:4317"),
            ("--otlp-endpoint", "https://collector:4317"),
            ("--otlp-endpoint", "not a url"),
            ("--otel-traces-sampler-arg", "1.5"),
            ("--otel-traces-sampler-arg", "-0.1"),
            ("--otel-traces-sampler", "sometimes"),
        ] {
            assert!(
                Cli::try_parse_from(["authd", flag, bad]).is_err(),
                "{flag} {bad}"
            );
        }
    }

    #[test]
    fn the_password_blocklist_is_on_by_default_and_takes_on_or_off() {
        let c = Config::defaults();
        assert_eq!(c.password_blocklist, Switch::On);
        assert_eq!(c.password_blocklist_file, None);
        let parse = |args: &[&str]| {
            matches(args).map(|m| {
                <Cli as clap::FromArgMatches>::from_arg_matches(&m)
                    .unwrap()
                    .config
            })
        };
        let off = parse(&["--password-blocklist", "off"]).unwrap();
        assert_eq!(off.password_blocklist, Switch::Off);
        let err = parse(&["--password-blocklist", "maybe"]).unwrap_err();
        assert!(err.contains("[possible values: on, off]"), "{err}");
        let file = parse(&["--password-blocklist-file", "/etc/authd/blocked.txt"]).unwrap();
        assert_eq!(
            file.password_blocklist_file,
            Some(PathBuf::from("/etc/authd/blocked.txt"))
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
    fn database_url_errors_never_quote_the_url() {
        for bad in [
            "postgres://u:s3cret@db:notaport/x",
            "host=db password=s3cret",
            "s3cret",
            "user:s3cret@db/x",
            "postgres://u@db/x?sslpassword=s3cret",
            "postgres://u@db/x?Password=s3cret",
            "postgres://u@db/x?%73slpassword=s3cret",
        ] {
            let err = bad.parse::<DatabaseUrl>().unwrap_err();
            assert!(!err.contains("s3cret"), "{bad}: {err}");
        }
        // sqlx's own error quotes the sslmode value, which is not a secret: the URL's
        // password is not in it.
        let err = "postgres://u:hunter2@db/x?sslmode=maybe"
            .parse::<DatabaseUrl>()
            .unwrap_err();
        assert!(!err.contains("hunter2"), "{err}");
        let err = "postgres://u@db/x?sslpassword=s3cret"
            .parse::<DatabaseUrl>()
            .unwrap_err();
        assert!(
            err.contains(r#"parameter "sslpassword" is not supported"#),
            "{err}"
        );
        // The parameters sqlx reads are fine, the password among them.
        let url: DatabaseUrl = "postgres://u@db/x?password=s3cret&options[search_path]=a"
            .parse()
            .unwrap();
        assert!(url.has_secret());
        assert_eq!(
            url.to_string(),
            "postgres://u@db/x?password=***&options[search_path]=a"
        );
    }

    fn matches(args: &[&str]) -> Result<ArgMatches, String> {
        Cli::command()
            .mut_args(|a| a.env(None::<&str>))
            .try_get_matches_from(std::iter::once("authd").chain(args.iter().copied()))
            .map_err(|e| e.to_string())
    }

    #[test]
    fn secrets_given_as_flags_are_found_wherever_they_stand() {
        const KEY: &str = "k:MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY=";
        let found = |args: &[&str]| -> Vec<&'static str> {
            secrets_on_command_line(&matches(args).unwrap())
                .into_iter()
                .map(|(flag, _)| flag)
                .collect()
        };
        assert!(found(&[]).is_empty());
        assert!(found(&["--database-url", "sqlite://x.db"]).is_empty());
        assert!(found(&["--database-url", "postgres://u@db/x"]).is_empty());
        assert!(found(&["--redis-url", "redis://cache"]).is_empty());
        assert_eq!(
            found(&["--database-url", "postgres://u:p@db/x", "--token-keys", KEY]),
            ["--database-url", "--token-keys"]
        );
        // Global options after the subcommand count too.
        assert_eq!(
            found(&["migrate", "--database-url", "postgres://u@db/x?password=p"]),
            ["--database-url"]
        );
        assert_eq!(found(&["--redis-url", "redis://:p@cache"]), ["--redis-url"]);
    }

    #[test]
    fn secret_files_are_read_trimmed_and_conflict_with_the_direct_form() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("db");
        let redis = dir.path().join("redis");
        std::fs::write(&db, "\n  postgres://u:s3cret@db/x \n").unwrap();
        std::fs::write(&redis, "redis://:s3cret@cache\n").unwrap();
        let (db, redis) = (db.to_str().unwrap(), redis.to_str().unwrap());
        let cli = |args: &[&str]| {
            <Cli as clap::FromArgMatches>::from_arg_matches(&matches(args).unwrap()).unwrap()
        };
        let mut config = cli(&["--database-url-file", db, "--redis-url-file", redis]).config;
        config.read_secret_files().unwrap();
        assert_eq!(
            config.database_url,
            "postgres://u:s3cret@db/x".parse().unwrap()
        );
        assert_eq!(
            config.redis_url.as_ref().unwrap().expose(),
            "redis://:s3cret@cache"
        );

        for (option, other, value) in [
            ("--database-url-file", "--database-url", "sqlite://x.db"),
            ("--redis-url-file", "--redis-url", "redis://cache"),
        ] {
            let err = matches(&[option, db, other, value]).unwrap_err();
            assert!(err.contains("cannot be used with"), "{err}");
        }

        let missing = dir.path().join("missing");
        let mut config = cli(&["--database-url-file", missing.to_str().unwrap()]).config;
        let err = format!("{:#}", config.read_secret_files().unwrap_err());
        assert!(err.starts_with("--database-url-file "), "{err}");
        assert!(err.contains("missing: cannot read the file"), "{err}");

        std::fs::write(dir.path().join("bad"), "postgres://u:s3cret@db:port/x").unwrap();
        let bad = dir.path().join("bad");
        let mut config = cli(&["--database-url-file", bad.to_str().unwrap()]).config;
        let err = format!("{:#}", config.read_secret_files().unwrap_err());
        assert!(err.contains("invalid PostgreSQL URL"), "{err}");
        assert!(!err.contains("s3cret"), "{err}");

        std::fs::write(dir.path().join("empty"), " \n").unwrap();
        let empty = dir.path().join("empty");
        let mut config = cli(&["--redis-url-file", empty.to_str().unwrap()]).config;
        let err = format!("{:#}", config.read_secret_files().unwrap_err());
        assert!(err.ends_with("the file is empty"), "{err}");
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
        for absurd in ["8d", "9223372036854775807s", "1000years"] {
            let err = parse(&["--token-ttl", absurd]).unwrap_err();
            assert!(err.contains("must be at most 7days"), "{absurd}: {err}");
        }
        assert!(parse(&["--token-ttl", "7d"]).is_ok());
        assert!(parse(&["--token-clock-skew", "0s"]).is_ok());
        let err = parse(&["--token-clock-skew", "6m"]).unwrap_err();
        assert!(err.contains("must be at most 5m"), "{err}");
        assert!(parse(&["--token-audience", "orders,billing"]).is_ok());
        let err = parse(&["--token-audience", "orders,,billing"]).unwrap_err();
        assert!(err.contains("1 to 256 bytes"), "{err}");
        assert!(parse(&["--pbkdf2-iterations", "1000", "migrate"]).is_ok());
    }
}
