//! What a run is asked to do: the [`Plan`] (target, protocol, scenario, load shape,
//! stop, timeouts, TLS) and its check, with the reason naming the option it refuses.
//!
//! It only describes a run: connecting is `connect`'s, sending `loops`'. Its
//! defaults are the command line's (`cli`), which builds a plan from the flags.

use super::forwarded::MAX_FORWARDED_FOR;
use crate::{
    protocol::Protocol,
    scenario::{Mix, Scenario},
    schedule,
};
use anyhow::{Context as _, bail};
use std::time::Duration;

/// The load shape.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Load {
    /// Keep `concurrency` requests in flight: each worker sends its next request as
    /// soon as its previous one is answered.
    Closed { concurrency: usize },
    /// Send `rate` requests per second on a fixed schedule, whatever the answers.
    Open { rate: f64 },
}

/// When the measured part of a run ends (the warm-up comes before it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stop {
    /// After this many measured requests have been sent.
    Requests(u64),
    /// When this much time has passed since the warm-up ended; requests in flight
    /// then are still awaited and recorded.
    Duration(Duration),
}

/// Everything a run needs to know. Build one with [`Plan::new`] and adjust fields.
#[derive(Debug, Clone)]
pub struct Plan {
    /// `http://host:port` or `https://host:port`.
    pub target: String,
    /// gRPC (authd) or HTTP/1.1 JSON (the report's service).
    pub protocol: Protocol,
    pub scenario: Scenario,
    /// The weights of the `mixed` scenario (ignored by the others).
    pub mix: Mix,
    pub load: Load,
    /// HTTP/2 connections the load is spread over. Over HTTP/1.1 every request in
    /// flight has a connection of its own, whatever this says.
    pub connections: usize,
    pub stop: Stop,
    /// Sent but not recorded, before the measured part.
    pub warmup: Duration,
    /// Per request, sent to the server as the gRPC deadline (over HTTP/1.1 the
    /// client gives up at it).
    pub timeout: Duration,
    /// Users registered first for logins and validations.
    pub users: usize,
    /// What each ratelimit request asks (`--descriptors`).
    pub descriptors: crate::scenario::Descriptors,
    /// How many values `{n}` in the descriptors takes (`--keys`).
    pub keys: usize,
    /// For each connection attempt and the first health check.
    pub connect_timeout: Duration,
    /// How long to keep trying to connect until the target is SERVING (over HTTP:
    /// until `GET /health` answers 2xx) (0: try once).
    pub wait: Duration,
    /// Closed loop: wait out the server's RetryInfo after RESOURCE_EXHAUSTED (over
    /// HTTP: its Retry-After after a 429 or 503).
    pub backoff: bool,
    /// The local address every connection is opened from.
    pub bind: Option<std::net::IpAddr>,
    /// Pass an end user's address in `x-forwarded-for` with every request, one of
    /// this many of 198.18.0.0/15 (`--forwarded-for`; `runner::forwarded`).
    pub forwarded_for: Option<usize>,
    /// Draw a progress bar on stderr.
    pub progress: bool,
    /// TLS, for an `https://` target.
    pub tls: Option<TlsOptions>,
    /// The check scenario over HTTP/1.1: authd's forward-auth port
    /// (`http://host:port`), tokens prepared over gRPC at `target`.
    pub forward_auth: Option<String>,
    /// The check scenario as token introspections (RFC 7662, `POST
    /// /oauth2/introspect`) on this authd port (`http://host:port`, the gRPC port's
    /// plain HTTP), tokens prepared over gRPC at `target`.
    pub introspect: Option<String>,
    /// The introspection client, `CLIENT_ID:SECRET` (sent with HTTP Basic).
    pub introspection_client: Option<String>,
    /// authd's admin port (`http://host:port`), where setup creates the service
    /// accounts of the grant, exchange and validate-service scenarios.
    pub admin: Option<String>,
    /// The admin key for it (sent as `authorization: Bearer`).
    pub admin_key: Option<String>,
    /// Service accounts created for those scenarios, each with one client secret;
    /// requests take them in turn.
    pub accounts: usize,
}

/// The client side of TLS: whom to trust, what to present, which name to expect.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TlsOptions {
    /// PEM bundle of the CAs to trust [default: the Mozilla roots].
    pub ca: Option<std::path::PathBuf>,
    /// PEM certificate to present (mutual TLS), with `key`.
    pub cert: Option<std::path::PathBuf>,
    pub key: Option<std::path::PathBuf>,
    /// The name the server's certificate must carry [default: the target's host].
    pub server_name: Option<String>,
}

impl TlsOptions {
    /// Whether any option is set.
    pub fn is_set(&self) -> bool {
        *self != TlsOptions::default()
    }

    /// tonic's TLS configuration; an error names the option and the file.
    ///
    /// `authd health` builds its client TLS the same way (`src/health/check.rs`): a
    /// deliberate copy, since authbench is a client of authd's wire protocol and never
    /// depends on the authd library.
    pub(super) fn config(&self) -> anyhow::Result<tonic::transport::ClientTlsConfig> {
        use tonic::transport::{Certificate, ClientTlsConfig, Identity};
        let read = |option: &str, path: &std::path::PathBuf| {
            std::fs::read(path).with_context(|| format!("{option} {}", path.display()))
        };
        let mut config = ClientTlsConfig::new();
        config = match &self.ca {
            Some(path) => config.ca_certificate(Certificate::from_pem(read("--tls-ca", path)?)),
            None => config.with_webpki_roots(),
        };
        match (&self.cert, &self.key) {
            (Some(cert), Some(key)) => {
                let identity =
                    Identity::from_pem(read("--tls-cert", cert)?, read("--tls-key", key)?);
                config = config.identity(identity);
            }
            (None, None) => {}
            _ => bail!("--tls-cert and --tls-key go together"),
        }
        if let Some(name) = &self.server_name {
            config = config.domain_name(name.clone());
        }
        Ok(config)
    }
}

impl Plan {
    /// A plan with the defaults of the command line, and the default connection count
    /// for `load`.
    pub fn new(target: impl Into<String>, scenario: Scenario, load: Load, stop: Stop) -> Self {
        Self {
            target: target.into(),
            protocol: Protocol::Grpc,
            scenario,
            mix: Mix::DEFAULT.parse().expect("the default mix parses"),
            load,
            connections: default_connections(load),
            stop,
            warmup: Duration::ZERO,
            timeout: Duration::from_secs(10),
            users: 100,
            descriptors: (crate::scenario::Descriptors::DEFAULT.parse())
                .expect("the default descriptors parse"),
            keys: 1000,
            connect_timeout: Duration::from_secs(3),
            wait: Duration::ZERO,
            backoff: false,
            bind: None,
            forwarded_for: None,
            progress: false,
            tls: None,
            forward_auth: None,
            introspect: None,
            introspection_client: None,
            admin: None,
            admin_key: None,
            accounts: 8,
        }
    }

    /// Whether setup creates service accounts: for grants, exchanges, or the service
    /// tokens of validate-service.
    pub fn needs_service_accounts(&self) -> bool {
        self.scenario == Scenario::ValidateService
            || self.scenario.mix(&self.mix).uses_service_accounts()
    }

    /// Refuses plans that cannot run, with a reason naming the option.
    pub fn check(&self) -> Result<(), String> {
        match self.load {
            Load::Closed { concurrency: 0 } => {
                return Err("--concurrency must be at least 1".into());
            }
            Load::Open { rate } if !(rate.is_finite() && rate > 0.0) => {
                return Err("--rate must be a positive number of requests per second".into());
            }
            _ => {}
        }
        match self.stop {
            Stop::Requests(0) => return Err("--requests must be at least 1".into()),
            Stop::Duration(d) if d.is_zero() => {
                return Err("--duration must be greater than zero".into());
            }
            _ => {}
        }
        if self.connections == 0 {
            return Err("--connections must be at least 1".into());
        }
        if self.users == 0 {
            return Err("--users must be at least 1".into());
        }
        if self.keys == 0 {
            return Err("--keys must be at least 1".into());
        }
        if let Some(n) = self.forwarded_for
            && !(1..=MAX_FORWARDED_FOR).contains(&n)
        {
            return Err(format!(
                "--forwarded-for must be from 1 to {MAX_FORWARDED_FOR} (the addresses of \
                 198.18.0.0/15), not {n}"
            ));
        }
        if self.timeout.is_zero() {
            return Err("--timeout must be greater than zero".into());
        }
        if self.connect_timeout.is_zero() {
            return Err("--connect-timeout must be greater than zero".into());
        }
        if self.protocol.over_http1() {
            self.check_http()?;
        }
        if self.needs_service_accounts() {
            self.check_admin(&format!("{} creates service accounts first", self.scenario))?;
        }
        if self.scenario == Scenario::Events {
            self.check_events()?;
        }
        if self.forward_auth.is_some() && self.introspect.is_some() {
            return Err("--forward-auth and --introspect: one way of checking at a time".into());
        }
        if let Some(url) = &self.forward_auth {
            self.check_forward_auth(url)?;
        }
        if let Some(url) = &self.introspect {
            self.check_forward_auth(url)
                .map_err(|e| e.replace("--forward-auth", "--introspect"))?;
            if self.introspection_client.is_none() {
                return Err("--introspect needs the client's CLIENT_ID:SECRET in \
                            AUTHBENCH_INTROSPECTION_CLIENT"
                    .into());
            }
        }
        Ok(())
    }

    /// What the scenarios of the admin port need (`why` they do): the port and its
    /// key, and for service accounts at least one.
    fn check_admin(&self, why: &str) -> Result<(), String> {
        let Some(url) = &self.admin else {
            return Err(format!(
                "{why}: --admin http://HOST:PORT (authd's AUTHD_ADMIN_LISTEN) is needed"
            ));
        };
        if !url.starts_with("http://") {
            return Err(format!(
                "--admin {url} must be http://HOST:PORT (the admin port in plaintext)"
            ));
        }
        if self.admin_key.is_none() {
            return Err(format!(
                "{why}: the admin key is needed in AUTHBENCH_ADMIN_KEY"
            ));
        }
        if self.accounts == 0 && self.needs_service_accounts() {
            return Err("--accounts must be at least 1".into());
        }
        Ok(())
    }

    /// What the events scenario runs: one subscriber, on the admin port.
    fn check_events(&self) -> Result<(), String> {
        if self.load != (Load::Closed { concurrency: 1 }) {
            return Err(
                "events has one subscriber: --concurrency 1 (its default), not more and not \
                 --rate"
                    .into(),
            );
        }
        self.check_admin("events watches the account events on the admin port")
    }

    /// Where the check scenario's HTTP/1.1 requests go: the forward-auth port or the
    /// introspection endpoint's; `None` for Check over gRPC.
    pub(super) fn check_url(&self) -> Option<&String> {
        self.forward_auth.as_ref().or(self.introspect.as_ref())
    }

    /// What `--forward-auth` runs: checks only, in a closed loop, in plaintext,
    /// with the tokens prepared over gRPC.
    fn check_forward_auth(&self, url: &str) -> Result<(), String> {
        if self.scenario != Scenario::Check || self.protocol != Protocol::Grpc {
            return Err("--forward-auth runs only the check scenario, with gRPC at --target                         for the logins that get its tokens"
                .into());
        }
        if let Load::Open { .. } = self.load {
            return Err(
                "--forward-auth runs only a closed loop (--concurrency), not --rate".into(),
            );
        }
        if !url.starts_with("http://") {
            return Err(format!(
                "--forward-auth {url} must be http://HOST:PORT (the port is plain HTTP/1.1)"
            ));
        }
        Ok(())
    }

    /// What HTTP/1.1 can run: the two requests the report's service has (authd's
    /// HTTP forms: token validations too), in a closed loop (one keep-alive
    /// connection per request in flight), in plaintext.
    fn check_http(&self) -> Result<(), String> {
        let protocol = self.protocol;
        let runs = match protocol {
            Protocol::Http => matches!(self.scenario, Scenario::Login | Scenario::Register),
            // Client credentials on the token endpoint, the JSON answer of RFC 6749.
            Protocol::Json if self.scenario == Scenario::Grant => true,
            _ => matches!(
                self.scenario,
                Scenario::Login | Scenario::Register | Scenario::Validate
            ),
        };
        if !runs {
            let scenarios = match protocol {
                Protocol::Http => "login and register",
                Protocol::Json => "login, register, validate and grant",
                _ => "login, register and validate",
            };
            return Err(format!(
                "--protocol {protocol} runs only the {scenarios} scenarios, not {}",
                self.scenario
            ));
        }
        if let Load::Open { .. } = self.load {
            return Err(format!(
                "--protocol {protocol} runs only a closed loop (--concurrency), not --rate"
            ));
        }
        if !self.target.starts_with("http://") || self.tls.is_some() {
            return Err(format!(
                "--protocol {protocol} speaks plaintext HTTP/1.1: --target {} must be http:// \
                 and no --tls-* option given",
                self.target
            ));
        }
        Ok(())
    }
}

/// The default connection count for a load shape.
pub fn default_connections(load: Load) -> usize {
    match load {
        Load::Closed { concurrency } => schedule::default_connections_closed(concurrency),
        Load::Open { rate } => schedule::default_connections_open(rate),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plans_are_checked() {
        let plan = |load, stop| Plan::new("http://127.0.0.1:1", Scenario::Health, load, stop);
        let ok = plan(Load::Closed { concurrency: 1 }, Stop::Requests(1));
        assert_eq!(ok.check(), Ok(()));
        assert_eq!(ok.connections, 1);
        assert!(
            plan(Load::Closed { concurrency: 0 }, Stop::Requests(1))
                .check()
                .is_err()
        );
        assert!(
            plan(Load::Open { rate: 0.0 }, Stop::Requests(1))
                .check()
                .is_err()
        );
        assert!(
            plan(Load::Open { rate: f64::NAN }, Stop::Requests(1))
                .check()
                .is_err()
        );
        assert!(
            plan(Load::Open { rate: 10.0 }, Stop::Requests(0))
                .check()
                .is_err()
        );
        assert!(
            plan(Load::Open { rate: 10.0 }, Stop::Duration(Duration::ZERO))
                .check()
                .is_err()
        );
        let mut no_users = ok.clone();
        no_users.users = 0;
        assert!(no_users.check().unwrap_err().contains("--users"));
        let mut forwarded = ok.clone();
        for (n, fine) in [(0, false), (1, true), (131_072, true), (131_073, false)] {
            forwarded.forwarded_for = Some(n);
            assert_eq!(forwarded.check().is_ok(), fine, "--forwarded-for {n}");
        }
    }

    #[test]
    fn events_run_one_subscriber_on_the_admin_port_with_its_key() {
        let mut plan = Plan::new(
            "http://127.0.0.1:1",
            Scenario::Events,
            Load::Closed { concurrency: 1 },
            Stop::Requests(1000),
        );
        assert!(plan.check().unwrap_err().contains("--admin"));
        plan.admin = Some("https://127.0.0.1:2".into());
        assert!(plan.check().unwrap_err().contains("plaintext"));
        plan.admin = Some("http://127.0.0.1:2".into());
        assert!(plan.check().unwrap_err().contains("AUTHBENCH_ADMIN_KEY"));
        plan.admin_key = Some("key".into());
        // No service account is created: --accounts does not matter.
        plan.accounts = 0;
        assert_eq!(plan.check(), Ok(()));
        for load in [Load::Closed { concurrency: 2 }, Load::Open { rate: 10.0 }] {
            let mut more = plan.clone();
            more.load = load;
            assert!(
                more.check().unwrap_err().contains("one subscriber"),
                "{load:?}"
            );
        }
    }

    #[test]
    fn http_runs_only_login_and_register_in_a_closed_loop() {
        let plan = |scenario, load| {
            let mut plan = Plan::new("http://127.0.0.1:1", scenario, load, Stop::Requests(1));
            plan.protocol = Protocol::Http;
            plan
        };
        let closed = Load::Closed { concurrency: 5000 };
        assert_eq!(plan(Scenario::Login, closed).check(), Ok(()));
        assert_eq!(plan(Scenario::Register, closed).check(), Ok(()));
        for scenario in [
            Scenario::Health,
            Scenario::Validate,
            Scenario::Refresh,
            Scenario::Mixed,
        ] {
            let err = plan(scenario, closed).check().unwrap_err();
            assert!(err.contains("only the login and register"), "{err}");
        }
        let err = plan(Scenario::Login, Load::Open { rate: 10.0 })
            .check()
            .unwrap_err();
        assert!(err.contains("--rate"), "{err}");
        let mut tls = plan(Scenario::Login, closed);
        tls.target = "https://127.0.0.1:1".into();
        assert!(tls.check().unwrap_err().contains("plaintext"));
    }
}
