//! The `authbench` command line: clap parses it, [`Args::plan`] checks what clap
//! cannot (combinations, the target URL) and turns it into a [`Plan`].
//!
//! Every mistake is reported as one line naming the option, before anything is
//! sent; `src/main.rs` prints it and exits non-zero.

use super::{
    protocol::Protocol,
    runner::{Load, Plan, Stop, TlsOptions, default_connections},
    scenario::{Mix, Scenario},
};
use clap::Parser;
use std::{path::PathBuf, time::Duration};

/// authbench: a gRPC load generator for authd.
///
/// Sends health checks, registrations, logins, token validations or a weighted mix
/// of them to an authd server, and reports throughput, latency percentiles (from an
/// HdrHistogram) and the count of every gRPC status code and client-side error.
/// With --protocol http it loads an HTTP/1.1 JSON service instead (the report's
/// service that authd replaces, bench/report-service), reported the same way. The
/// events scenario subscribes instead: it counts the account events WatchEvents
/// streams to one subscriber, from the first one written.
///
/// Closed loop (--concurrency): that many requests are always in flight. Open loop
/// (--rate): requests go out on a fixed schedule whatever the answers, and latency
/// is measured from each request's intended send time, so a stalled server cannot
/// hide its queue; on Linux a kernel timer (timerfd) wakes the client when requests
/// are due, to the microsecond, so the client's timer does not count as latency
/// (elsewhere the runtime's timer, with its millisecond grain). Its report adds how
/// late the client started each request (`sent late`, part of every latency): a
/// tail there is the client's, or its host's, not the server's.
/// Requests sent during --warmup are left out of the report.
#[derive(Debug, Clone, Parser)]
#[command(name = "authbench", version, max_term_width = 100)]
pub struct Args {
    /// What to send.
    #[arg(value_enum)]
    pub scenario: Scenario,

    /// The server: http://HOST:PORT or https://HOST:PORT (the scheme may be left out:
    /// https with a --tls-* option, else http).
    #[arg(long, visible_alias = "addr", default_value = "http://127.0.0.1:50051")]
    pub target: String,

    /// The server's protocol: grpc (authd); json or grpc-web (authd's HTTP forms on
    /// its gRPC port, over HTTP/1.1: the Connect protocol's unary JSON, gRPC-Web; set
    /// up over gRPC; login, register and validate, and with json grant, as POST
    /// /oauth2/token with HTTP Basic); or http (the report's service,
    /// bench/report-service; login and register). Over HTTP/1.1: closed loop only,
    /// plaintext; each request in flight has a keep-alive connection of its own
    /// (HTTP/1.1 carries one request at a time), opened after the setup (-c 5000
    /// needs some 5,300 open files: the soft limit is raised up to the hard one, see
    /// ulimit -n). gRPC-Web answers carry their gRPC code; other HTTP answers count
    /// as the gRPC codes their statuses stand for: 2xx OK,
    /// 400 and 422 INVALID_ARGUMENT, 401 UNAUTHENTICATED, 403 PERMISSION_DENIED, 404
    /// NOT_FOUND, 408 and 504 DEADLINE_EXCEEDED, 409 ALREADY_EXISTS, 429
    /// RESOURCE_EXHAUSTED, 501 UNIMPLEMENTED, 503 UNAVAILABLE, other 5xx INTERNAL,
    /// anything else UNKNOWN.
    #[arg(long, value_enum, default_value_t = Protocol::Grpc)]
    pub protocol: Protocol,

    /// TLS: trust the CAs of this PEM bundle [default with an https:// target: the
    /// Mozilla roots].
    #[arg(long)]
    pub tls_ca: Option<PathBuf>,

    /// TLS: the PEM certificate to present to a server with mutual TLS.
    #[arg(long, requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,

    /// TLS: the PEM private key of --tls-cert.
    #[arg(long, requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,

    /// TLS: the name the server's certificate must carry [default: the target's host].
    #[arg(long)]
    pub tls_server_name: Option<String>,

    /// Closed loop: keep this many requests in flight [default: 50; events: its one
    /// subscriber].
    #[arg(short, long, conflicts_with = "rate")]
    pub concurrency: Option<usize>,

    /// Open loop: send this many requests per second on a fixed schedule.
    #[arg(short, long, allow_negative_numbers = true)]
    pub rate: Option<f64>,

    /// HTTP/2 connections to spread the load over [default: one per 100 requests
    /// in flight, or per 200 req/s of --rate, at most 64]. Not with --protocol http,
    /// which opens one per request in flight.
    #[arg(long)]
    pub connections: Option<usize>,

    /// Stop after this many measured requests (after the warm-up). In a closed loop each
    /// client's first measured request is one of them: -c N -n N sends N requests at
    /// once, one per client, and no more. events: after this many events received.
    #[arg(short = 'n', long, conflicts_with = "duration")]
    pub requests: Option<u64>,

    /// Stop after this long, not counting the warm-up (e.g. 30s, 2m) [default: 10s].
    #[arg(short, long, value_parser = humantime::parse_duration)]
    pub duration: Option<Duration>,

    /// Send load this long first without recording it (e.g. 5s).
    #[arg(long, default_value = "0s", value_parser = humantime::parse_duration)]
    pub warmup: Duration,

    /// Per-request deadline, sent to the server as the gRPC timeout (over http the
    /// client gives up at it and closes that connection). events: the longest wait
    /// for the next event; the run ends there, recorded as a timeout (the backlog was
    /// shorter than -n asked).
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    pub timeout: Duration,

    /// Users registered before the run, for login, validate and refresh (one session each).
    #[arg(long, default_value_t = 100)]
    pub users: usize,

    /// Weights of the mixed scenario: OPERATION=WEIGHT,… with operations health,
    /// register, login, validate, refresh, check, grant and exchange.
    #[arg(long)]
    pub mix: Option<Mix>,

    /// What each ratelimit request asks Envoy's rate limit service:
    /// DOMAIN:KEY=VALUE,…;KEY=VALUE,… (descriptors separated by ;, entries by ,);
    /// {n} in a value becomes a number below --keys, different request after request.
    #[arg(long, default_value = crate::scenario::Descriptors::DEFAULT)]
    pub descriptors: crate::scenario::Descriptors,

    /// How many values {n} in --descriptors takes: the distinct keys a ratelimit run
    /// spreads over (1: every request counts against one key).
    #[arg(long, default_value_t = 1000)]
    pub keys: usize,
    /// The check scenario over HTTP: GET /forward-auth on this authd forward-auth
    /// port (http://HOST:PORT, AUTHD_FORWARD_AUTH_LISTEN), one HTTP/1.1 connection per
    /// request in flight, with tokens from logins done first over gRPC at --target.
    #[arg(long, value_name = "URL")]
    pub forward_auth: Option<String>,
    /// The check scenario as token introspections: POST /oauth2/introspect on this
    /// authd port (http://HOST:PORT, the gRPC port, which answers plain HTTP too), one
    /// HTTP/1.1 connection per request in flight, as the client whose CLIENT_ID:SECRET
    /// is in the environment variable AUTHBENCH_INTROSPECTION_CLIENT (never on the
    /// command line); tokens from logins done first over gRPC at --target.
    #[arg(long, value_name = "URL")]
    pub introspect: Option<String>,

    /// authd's admin port (http://HOST:PORT, AUTHD_ADMIN_LISTEN), where the grant,
    /// exchange and validate-service scenarios first create their service accounts
    /// (audience and scope authbench, one client secret each), and where events
    /// watches the account events (a read key is enough), with the admin key in the
    /// environment variable AUTHBENCH_ADMIN_KEY (never on the command line).
    #[arg(long, value_name = "URL")]
    pub admin: Option<String>,

    /// Service accounts created for grant, exchange and validate-service; requests
    /// take them in turn.
    #[arg(long, default_value_t = 8)]
    pub accounts: usize,

    /// Threads of the client's runtime; 1 runs everything on one thread, the
    /// cheapest way to drive a server from a single core.
    #[arg(long, default_value_t = 1)]
    pub threads: usize,

    /// Timeout of each connection attempt and of the first health check.
    #[arg(long, default_value = "3s", value_parser = humantime::parse_duration)]
    pub connect_timeout: Duration,

    /// Keep trying to connect until the server is SERVING (over http: until GET
    /// /health answers 2xx), for at most this long (for scripts that have just
    /// started it).
    #[arg(long, default_value = "0s", value_parser = humantime::parse_duration)]
    pub wait: Duration,

    /// Closed loop: after a RESOURCE_EXHAUSTED that carries a RetryInfo, a client
    /// waits the hinted delay (jittered between half and one and a half times it)
    /// before its next request, as a well-behaved gRPC client does (over http: the
    /// Retry-After seconds of a 429 or 503). Without it, a refused client asks again
    /// at once.
    #[arg(long, conflicts_with = "rate")]
    pub backoff: bool,

    /// Open every connection from this local address (e.g. 127.0.0.2: on loopback
    /// the server sees another client, with its own shares and limits)
    /// [default: the system's choice].
    #[arg(long, value_name = "ADDRESS")]
    pub bind: Option<std::net::IpAddr>,

    /// Act as a calling service (a signup service, say) on behalf of N end users
    /// (1 to 131072): every request, the setup's too, carries x-forwarded-for: ADDR
    /// (over http the X-Forwarded-For header), ADDR one of N addresses of
    /// 198.18.0.0/15 (RFC 2544's benchmarking network), address k being 198.18.0.0 + k.
    /// A request for user i (login, validate, refresh, check) carries address i mod N;
    /// registrations take the addresses in turn (health and ratelimit requests spread
    /// over them too). authd counts its per-address limits by it only for callers it
    /// trusts (AUTHD_TRUSTED_CALLERS), or for anyone with AUTHD_TRUST_FORWARDED_FOR=true;
    /// otherwise by the connection's address.
    #[arg(long, value_name = "N")]
    pub forwarded_for: Option<usize>,

    /// Print the report as JSON instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// Closed-loop concurrency when neither --concurrency nor --rate is given.
pub const DEFAULT_CONCURRENCY: usize = 50;
/// Measured duration when neither --requests nor --duration is given.
pub const DEFAULT_DURATION: Duration = Duration::from_secs(10);

impl Args {
    /// Checks the options together and builds the plan. `progress` says whether to
    /// draw a progress bar (the binary passes "stderr is a terminal").
    pub fn plan(&self, progress: bool) -> Result<Plan, String> {
        let tls = TlsOptions {
            ca: self.tls_ca.clone(),
            cert: self.tls_cert.clone(),
            key: self.tls_key.clone(),
            server_name: self.tls_server_name.clone(),
        };
        let target = normalize_target(&self.target, tls.is_set())?;
        // The events scenario has one subscriber.
        let default_concurrency = match self.scenario {
            Scenario::Events => 1,
            _ => DEFAULT_CONCURRENCY,
        };
        let load = match (self.rate, self.concurrency) {
            (Some(rate), _) => Load::Open { rate },
            (None, concurrency) => Load::Closed {
                concurrency: concurrency.unwrap_or(default_concurrency),
            },
        };
        let stop = match (self.requests, self.duration) {
            (Some(n), _) => Stop::Requests(n),
            (None, d) => Stop::Duration(d.unwrap_or(DEFAULT_DURATION)),
        };
        if self.mix.is_some() && self.scenario != Scenario::Mixed {
            return Err(format!(
                "--mix applies only to the mixed scenario, not to {}",
                self.scenario
            ));
        }
        if self.threads == 0 {
            return Err("--threads must be at least 1".into());
        }
        if self.protocol.over_http1() && self.connections.is_some() {
            return Err(format!(
                "--connections does not apply to --protocol {}: it opens one connection \
                 per request in flight",
                self.protocol
            ));
        }
        let mut plan = Plan::new(target, self.scenario, load, stop);
        plan.protocol = self.protocol;
        if let Some(mix) = &self.mix {
            plan.mix = mix.clone();
        }
        plan.connections = self
            .connections
            .unwrap_or_else(|| default_connections(load));
        plan.warmup = self.warmup;
        plan.timeout = self.timeout;
        plan.users = self.users;
        plan.descriptors = self.descriptors.clone();
        plan.keys = self.keys;
        plan.connect_timeout = self.connect_timeout;
        plan.wait = self.wait;
        plan.backoff = self.backoff;
        plan.bind = self.bind;
        plan.forwarded_for = self.forwarded_for;
        plan.forward_auth = self.forward_auth.clone();
        plan.introspect = self.introspect.clone();
        plan.introspection_client = std::env::var("AUTHBENCH_INTROSPECTION_CLIENT").ok();
        plan.admin = self.admin.clone();
        plan.admin_key = std::env::var("AUTHBENCH_ADMIN_KEY").ok();
        plan.accounts = self.accounts;
        plan.progress = progress;
        if plan.target.starts_with("https://") {
            plan.tls = Some(tls);
        }
        plan.check()?;
        Ok(plan)
    }
}

/// `host:port` becomes `http://host:port` (`https://` when `tls`); anything but an
/// `http://` or `https://` URL with a host and port-or-default is refused.
pub fn normalize_target(raw: &str, tls: bool) -> Result<String, String> {
    let raw = raw.trim();
    let url = if raw.contains("://") {
        raw.to_string()
    } else if tls {
        format!("https://{raw}")
    } else {
        format!("http://{raw}")
    };
    let uri: http::Uri = url
        .parse()
        .map_err(|e| format!("--target {raw:?} is not a URL: {e}"))?;
    match uri.scheme_str() {
        Some("http") if tls => {
            return Err(format!(
                "--target {raw:?}: --tls-* options given with an http:// target (use https://)"
            ));
        }
        Some("http" | "https") => {}
        other => {
            return Err(format!(
                "--target {raw:?}: unsupported scheme {:?} (expected http://HOST:PORT or \
                 https://HOST:PORT)",
                other.unwrap_or("")
            ));
        }
    }
    if uri.host().is_none_or(str::is_empty) {
        return Err(format!(
            "--target {raw:?} has no host (expected http://HOST:PORT)"
        ));
    }
    if uri
        .path_and_query()
        .is_some_and(|p| p.as_str() != "/" && !p.as_str().is_empty())
    {
        return Err(format!(
            "--target {raw:?} must not have a path (expected http://HOST:PORT)"
        ));
    }
    Ok(url.trim_end_matches('/').to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    fn parse(args: &[&str]) -> Result<Plan, String> {
        let args = Args::try_parse_from(std::iter::once("authbench").chain(args.iter().copied()))
            .map_err(|e| e.to_string())?;
        args.plan(false)
    }

    #[test]
    fn the_command_line_is_well_formed() {
        Args::command().debug_assert();
    }

    #[test]
    fn defaults() {
        let plan = parse(&["login"]).unwrap();
        assert_eq!(plan.target, "http://127.0.0.1:50051");
        assert_eq!(plan.scenario, Scenario::Login);
        assert_eq!(
            plan.load,
            Load::Closed {
                concurrency: DEFAULT_CONCURRENCY
            }
        );
        assert_eq!(plan.stop, Stop::Duration(DEFAULT_DURATION));
        assert_eq!(plan.connections, 1);
        assert_eq!(plan.warmup, Duration::ZERO);
        assert_eq!(plan.users, 100);
        assert_eq!(plan.protocol, Protocol::Grpc);
    }

    #[test]
    fn authds_http_forms_take_validate_too() {
        for (name, protocol) in [("json", Protocol::Json), ("grpc-web", Protocol::GrpcWeb)] {
            let plan = parse(&["validate", "--protocol", name, "-c", "64"]).unwrap();
            assert_eq!(plan.protocol, protocol);
            assert_eq!(protocol.name(), name);
        }
    }

    #[test]
    fn http_takes_login_and_register_in_a_closed_loop() {
        let plan = parse(&[
            "register",
            "--protocol",
            "http",
            "--target",
            "127.0.0.1:8000",
            "-c",
            "5000",
        ])
        .unwrap();
        assert_eq!(plan.protocol, Protocol::Http);
        assert_eq!(plan.target, "http://127.0.0.1:8000");
        assert_eq!(plan.load, Load::Closed { concurrency: 5000 });
        let plan = parse(&["login", "--protocol", "http", "--users", "20", "--backoff"]).unwrap();
        assert_eq!(plan.scenario, Scenario::Login);
        assert!(plan.backoff);
    }

    #[test]
    fn forwarded_for_takes_up_to_the_benchmarking_networks_addresses() {
        assert_eq!(parse(&["login"]).unwrap().forwarded_for, None);
        let plan = parse(&["register", "--forwarded-for", "1000"]).unwrap();
        assert_eq!(plan.forwarded_for, Some(1000));
        let plan = parse(&["login", "--forwarded-for", "131072", "--protocol", "http"]).unwrap();
        assert_eq!(plan.forwarded_for, Some(131_072));
    }

    #[test]
    fn load_shapes_and_limits() {
        let plan = parse(&["register", "-c", "3000", "-n", "500", "--warmup", "5s"]).unwrap();
        assert_eq!(plan.load, Load::Closed { concurrency: 3000 });
        assert_eq!(plan.connections, 30);
        assert_eq!(plan.stop, Stop::Requests(500));
        assert_eq!(plan.warmup, Duration::from_secs(5));
        let plan = parse(&[
            "health",
            "--rate",
            "1000",
            "--duration",
            "30s",
            "--connections",
            "3",
        ])
        .unwrap();
        assert_eq!(plan.load, Load::Open { rate: 1000.0 });
        assert_eq!(plan.connections, 3);
        assert_eq!(plan.stop, Stop::Duration(Duration::from_secs(30)));
        let plan = parse(&[
            "mixed",
            "--mix",
            "login=1,health=3",
            "--addr",
            "localhost:9",
        ])
        .unwrap();
        assert_eq!(plan.mix.to_string(), "health=3,login=1");
        assert_eq!(plan.target, "http://localhost:9");
    }

    #[test]
    fn bad_arguments_are_refused_with_a_reason() {
        for (args, why) in [
            (
                &["login", "-c", "10", "--rate", "5"][..],
                "cannot be used with",
            ),
            (
                &["login", "-n", "10", "-d", "5s"][..],
                "cannot be used with",
            ),
            (&["login", "-c", "0"][..], "--concurrency"),
            (&["login", "--rate", "0"][..], "--rate"),
            (&["login", "--rate", "-3"][..], "--rate"),
            (&["login", "-n", "0"][..], "--requests"),
            (&["login", "-d", "0s"][..], "--duration"),
            (&["login", "-d", "ten"][..], "ten"),
            (&["login", "--connections", "0"][..], "--connections"),
            (&["login", "--users", "0"][..], "--users"),
            (&["login", "--forwarded-for", "0"][..], "--forwarded-for"),
            (
                &["login", "--forwarded-for", "131073"][..],
                "--forwarded-for",
            ),
            (&["login", "--forwarded-for", "-1"][..], "-1"),
            (&["login", "--mix", "login=1"][..], "only to the mixed"),
            (&["mixed", "--mix", "logout=1"][..], "unknown operation"),
            (
                &["login", "--target", "http://x:1", "--tls-ca", "ca.pem"][..],
                "http:// target",
            ),
            (&["login", "--target", "ftp://x:1"][..], "scheme"),
            (&["login", "--target", "http://x:1/api"][..], "path"),
            (&["login", "--threads", "0"][..], "--threads"),
            (&["dance"][..], "dance"),
            (&["grant"][..], "--admin"),
            (&["events"][..], "--admin"),
            (
                &["events", "-c", "2", "--admin", "http://x:1"][..],
                "one subscriber",
            ),
            (
                &["events", "--rate", "5", "--admin", "http://x:1"][..],
                "one subscriber",
            ),
            (&["events", "--protocol", "json"][..], "not events"),
            (&["validate-service"][..], "--admin"),
            (&["exchange", "--admin", "https://x:1"][..], "plaintext"),
            (
                &["exchange", "--protocol", "json"][..],
                "only the login, register, validate and grant",
            ),
            (
                &["grant", "--protocol", "grpc-web"][..],
                "only the login, register and validate",
            ),
            (&["login", "--protocol", "smtp"][..], "smtp"),
            (
                &["validate", "--protocol", "http"][..],
                "only the login and register",
            ),
            (&["health", "--protocol", "http"][..], "not health"),
            (
                &["login", "--protocol", "http", "--rate", "5"][..],
                "--rate",
            ),
            (
                &["login", "--protocol", "http", "--connections", "4"][..],
                "--connections does not apply",
            ),
            (
                &["login", "--protocol", "http", "--target", "https://x:1"][..],
                "plaintext",
            ),
            (
                &["refresh", "--protocol", "json"][..],
                "only the login, register, validate and grant",
            ),
            (
                &["validate", "--protocol", "grpc-web", "--rate", "5"][..],
                "--rate",
            ),
            (
                &["login", "--protocol", "json", "--connections", "4"][..],
                "--connections does not apply to --protocol json",
            ),
        ] {
            let err = parse(args).unwrap_err();
            assert!(err.contains(why), "{args:?}: {err}");
        }
    }

    #[test]
    fn events_has_one_subscriber_by_default() {
        // Refused only for the key the environment lacks (AUTHBENCH_ADMIN_KEY): the
        // load, one subscriber, is not what is refused.
        let err = parse(&["events", "--admin", "http://127.0.0.1:9", "-n", "1000"]).unwrap_err();
        assert!(err.contains("AUTHBENCH_ADMIN_KEY"), "{err}");
        let err = parse(&["events", "--admin", "http://127.0.0.1:9", "-c", "1"]).unwrap_err();
        assert!(err.contains("AUTHBENCH_ADMIN_KEY"), "{err}");
    }

    #[test]
    fn targets_are_normalized() {
        assert_eq!(
            normalize_target("127.0.0.1:50051", false).unwrap(),
            "http://127.0.0.1:50051"
        );
        assert_eq!(
            normalize_target("http://[::1]:7/", false).unwrap(),
            "http://[::1]:7"
        );
        assert!(normalize_target("http://", false).is_err());
        assert_eq!(
            normalize_target("https://authd:50051", false).unwrap(),
            "https://authd:50051"
        );
        assert_eq!(
            normalize_target("authd:50051", true).unwrap(),
            "https://authd:50051"
        );
    }
}
