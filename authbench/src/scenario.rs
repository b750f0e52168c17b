//! What a benchmark asks authd to do: the [`Operation`]s, the named [`Scenario`]s and
//! the weighted [`Mix`] that decides which operation each request performs.
//!
//! The mix is expanded once into a short, evenly interleaved wheel, so choosing the
//! next operation costs an index, not a random number, and a run is reproducible.

use serde::Serialize;
use std::{fmt, str::FromStr};

/// One kind of request authbench sends.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Operation {
    /// `grpc.health.v1.Health/Check` for the whole server: no hashing, no database.
    Health,
    /// `Register` with a username never used before: one hash and one insert.
    Register,
    /// `Login` of a user registered during setup: one read and one hash verification.
    Login,
    /// `ValidateToken` with a token obtained during setup: no hashing, no database.
    Validate,
    /// `Refresh` of a session started during setup: one rotation (a write), no
    /// hashing. Each session's refresh token is used by one request at a time.
    Refresh,
    /// Envoy's `ShouldRateLimit` with the descriptors of `--descriptors`: one decision
    /// of the rate limit tier (a Redis script, or the in-process windows). An
    /// OVER_LIMIT answer is recorded as RESOURCE_EXHAUSTED.
    #[serde(rename = "ratelimit")]
    RateLimit,
    /// Envoy's external authorization, `envoy.service.auth.v3.Authorization/Check`,
    /// of a request bearing a token obtained during setup: what a proxy asks of
    /// authd for every request it passes on. No hashing, no database.
    Check,
    /// `IssueServiceToken` with the client secret of a service account created
    /// during setup (client credentials): one digest, one read and the grant's
    /// audit event, no password hash.
    Grant,
    /// `IssueServiceToken` exchanging a user's token from setup for the bench
    /// audience, as a service account created during setup (RFC 8693).
    Exchange,
    /// One account event received by the events scenario's subscriber (WatchEvents
    /// on the admin port). Not a request: it is counted as one, its latency the
    /// wait since the event before it, and it is never part of a mix.
    Event,
}

impl Operation {
    pub const ALL: [Operation; 10] = [
        Operation::Health,
        Operation::Register,
        Operation::Login,
        Operation::Validate,
        Operation::Refresh,
        Operation::RateLimit,
        Operation::Check,
        Operation::Grant,
        Operation::Exchange,
        Operation::Event,
    ];

    /// A dense index, for per-operation arrays.
    pub fn index(self) -> usize {
        self as usize
    }

    pub fn name(self) -> &'static str {
        match self {
            Operation::Health => "health",
            Operation::Register => "register",
            Operation::Login => "login",
            Operation::Validate => "validate",
            Operation::Refresh => "refresh",
            Operation::RateLimit => "ratelimit",
            Operation::Check => "check",
            Operation::Grant => "grant",
            Operation::Exchange => "exchange",
            Operation::Event => "event",
        }
    }

    /// The operation a mix names: a request (an event is streamed, never asked for).
    fn from_name(name: &str) -> Option<Self> {
        (Operation::ALL.into_iter())
            .filter(|op| *op != Operation::Event)
            .find(|op| op.name() == name)
    }
}

impl fmt::Display for Operation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The named workloads of `authbench SCENARIO`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Scenario {
    /// Health checks only: the cost of the transport and the server's plumbing.
    Health,
    /// Registrations of fresh, unique usernames.
    Register,
    /// Logins against a pool of users registered first (see --users).
    Login,
    /// Token validations, with tokens from logins done first.
    Validate,
    /// Token validations, with service tokens granted first to service accounts
    /// created through the admin API (see --admin).
    #[serde(rename = "validate-service")]
    ValidateService,
    /// Refresh-token rotations, of sessions from logins done first.
    Refresh,
    /// Envoy's ShouldRateLimit decisions (see --descriptors).
    Ratelimit,
    /// Envoy's external authorization checks, with tokens from logins done first.
    Check,
    /// Client-credential grants (IssueServiceToken) of service accounts created
    /// first through the admin API (see --admin, --accounts).
    Grant,
    /// Token exchanges of users' tokens from logins done first, by service accounts
    /// created first through the admin API (see --admin, --accounts).
    Exchange,
    /// The account events already written, streamed to one subscriber: WatchEvents
    /// on the admin port (see --admin) from the first event, each event counted as
    /// a request (-n: how many to receive), its latency the wait since the one
    /// before it.
    Events,
    /// A weighted mix of the above (see --mix).
    Mixed,
}

impl Scenario {
    pub fn name(self) -> &'static str {
        match self {
            Scenario::Health => "health",
            Scenario::Register => "register",
            Scenario::Login => "login",
            Scenario::Validate => "validate",
            Scenario::ValidateService => "validate-service",
            Scenario::Refresh => "refresh",
            Scenario::Ratelimit => "ratelimit",
            Scenario::Check => "check",
            Scenario::Grant => "grant",
            Scenario::Exchange => "exchange",
            Scenario::Events => "events",
            Scenario::Mixed => "mixed",
        }
    }

    /// The mix this scenario runs: a single operation, or `mixed`'s own weights.
    pub fn mix(self, mixed: &Mix) -> Mix {
        match self {
            Scenario::Health => Mix::only(Operation::Health),
            Scenario::Register => Mix::only(Operation::Register),
            Scenario::Login => Mix::only(Operation::Login),
            Scenario::Validate | Scenario::ValidateService => Mix::only(Operation::Validate),
            Scenario::Refresh => Mix::only(Operation::Refresh),
            Scenario::Ratelimit => Mix::only(Operation::RateLimit),
            Scenario::Check => Mix::only(Operation::Check),
            Scenario::Grant => Mix::only(Operation::Grant),
            Scenario::Exchange => Mix::only(Operation::Exchange),
            Scenario::Events => Mix::only(Operation::Event),
            Scenario::Mixed => mixed.clone(),
        }
    }

    /// What the scenario counts, and its rate's unit: requests, or for events the
    /// events received.
    pub fn counts(self) -> (&'static str, &'static str) {
        match self {
            Scenario::Events => ("events", "events/s"),
            _ => ("requests", "req/s"),
        }
    }
}

impl fmt::Display for Scenario {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// How many operations there are.
const OPS: usize = Operation::ALL.len();

/// Relative weights of the operations, e.g. `login=8,register=1,validate=1,refresh=1`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mix {
    weights: [u32; OPS],
}

impl Mix {
    /// The default of the `mixed` scenario.
    pub const DEFAULT: &'static str = "login=8,register=1,validate=1,refresh=1";

    pub fn only(op: Operation) -> Self {
        let mut weights = [0; OPS];
        weights[op.index()] = 1;
        Self { weights }
    }

    pub fn weight(&self, op: Operation) -> u32 {
        self.weights[op.index()]
    }

    /// Whether any request of this mix needs service accounts (created in setup).
    pub fn uses_service_accounts(&self) -> bool {
        self.uses(Operation::Grant) || self.uses(Operation::Exchange)
    }

    /// Whether any request of this mix performs `op`.
    pub fn uses(&self, op: Operation) -> bool {
        self.weight(op) > 0
    }

    /// The operations this mix performs, in [`Operation::ALL`] order.
    pub fn operations(&self) -> impl Iterator<Item = Operation> + '_ {
        Operation::ALL.into_iter().filter(|op| self.uses(*op))
    }

    /// One period of the mix as a sequence in which each operation appears as often as
    /// its weight (weights reduced by their common divisor) and is spread as evenly as
    /// possible: smooth weighted round-robin. Workers walk it cyclically, each from
    /// its own offset, so every short stretch of requests already has the right mix.
    pub fn wheel(&self) -> Vec<Operation> {
        let divisor = self.weights.iter().copied().fold(0, gcd).max(1);
        let weights = self.weights.map(|w| i64::from(w / divisor));
        let total: i64 = weights.iter().sum();
        let mut current = [0i64; OPS];
        let mut wheel = Vec::with_capacity(usize::try_from(total).unwrap_or(0));
        for _ in 0..total {
            for (c, w) in current.iter_mut().zip(weights) {
                *c += w;
            }
            // The first maximum wins ties, so the wheel is deterministic.
            let best = (0..OPS)
                .filter(|&i| weights[i] > 0)
                .max_by(|&a, &b| current[a].cmp(&current[b]).then(b.cmp(&a)))
                .expect("a mix has at least one positive weight");
            current[best] -= total;
            wheel.push(Operation::ALL[best]);
        }
        wheel
    }
}

impl FromStr for Mix {
    type Err = String;

    fn from_str(spec: &str) -> Result<Self, Self::Err> {
        let mut weights = [0u32; OPS];
        let mut seen = [false; OPS];
        for part in spec.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (name, weight) = part.split_once('=').ok_or_else(|| {
                format!("{part:?} is not OPERATION=WEIGHT (e.g. {})", Mix::DEFAULT)
            })?;
            let op = Operation::from_name(name.trim()).ok_or_else(|| {
                format!(
                    "unknown operation {:?} (expected health, register, login, validate, refresh, \
                     ratelimit, check, grant or exchange)",
                    name.trim()
                )
            })?;
            if std::mem::replace(&mut seen[op.index()], true) {
                return Err(format!("{op} is given twice"));
            }
            weights[op.index()] = weight
                .trim()
                .parse::<u32>()
                .ok()
                .filter(|w| *w <= 1_000_000)
                .ok_or_else(|| {
                    format!("the weight of {op} must be a whole number from 0 to 1000000")
                })?;
        }
        if weights.iter().all(|w| *w == 0) {
            return Err(format!(
                "the mix needs at least one positive weight (e.g. {})",
                Mix::DEFAULT
            ));
        }
        Ok(Self { weights })
    }
}

impl fmt::Display for Mix {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let parts: Vec<String> = self
            .operations()
            .map(|op| format!("{op}={}", self.weight(op)))
            .collect();
        f.write_str(&parts.join(","))
    }
}

fn gcd(a: u32, b: u32) -> u32 {
    if b == 0 { a } else { gcd(b, a % b) }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn count(wheel: &[Operation], op: Operation) -> usize {
        wheel.iter().filter(|o| **o == op).count()
    }

    #[test]
    fn the_default_mix_parses_and_prints_back() {
        let mix: Mix = Mix::DEFAULT.parse().unwrap();
        assert_eq!(mix.weight(Operation::Login), 8);
        assert_eq!(mix.weight(Operation::Register), 1);
        assert_eq!(mix.weight(Operation::Validate), 1);
        assert_eq!(mix.weight(Operation::Refresh), 1);
        assert_eq!(mix.weight(Operation::Health), 0);
        assert_eq!(mix.to_string(), "register=1,login=8,validate=1,refresh=1");
        assert_eq!(mix.to_string().parse::<Mix>().unwrap(), mix);
    }

    #[test]
    fn bad_mixes_are_refused_with_a_reason() {
        for (spec, why) in [
            ("", "at least one positive"),
            ("login=0", "at least one positive"),
            ("login", "OPERATION=WEIGHT"),
            ("logout=1", "unknown operation"),
            ("event=1", "unknown operation"),
            ("login=1,login=2", "twice"),
            ("login=-1", "whole number"),
            ("login=x", "whole number"),
        ] {
            let err = spec.parse::<Mix>().unwrap_err();
            assert!(err.contains(why), "{spec:?}: {err}");
        }
    }

    #[test]
    fn the_wheel_has_each_operation_as_often_as_its_weight() {
        let wheel = Mix::DEFAULT.parse::<Mix>().unwrap().wheel();
        assert_eq!(wheel.len(), 11);
        assert_eq!(count(&wheel, Operation::Login), 8);
        assert_eq!(count(&wheel, Operation::Refresh), 1);
        assert_eq!(count(&wheel, Operation::Register), 1);
        assert_eq!(count(&wheel, Operation::Validate), 1);
    }

    #[test]
    fn the_wheel_reduces_weights_and_interleaves() {
        let wheel = "login=4,validate=4".parse::<Mix>().unwrap().wheel();
        assert_eq!(wheel, [Operation::Login, Operation::Validate]);
        // 2:1 is spread out, never two rare operations next to each other.
        let wheel = "login=2,register=1,health=0"
            .parse::<Mix>()
            .unwrap()
            .wheel();
        assert_eq!(wheel.len(), 3);
        assert_eq!(count(&wheel, Operation::Login), 2);
        let wheel = "login=1,register=1,validate=1,health=1"
            .parse::<Mix>()
            .unwrap()
            .wheel();
        assert_eq!(wheel.len(), 4);
    }

    #[test]
    fn single_scenarios_use_one_operation() {
        let mixed: Mix = Mix::DEFAULT.parse().unwrap();
        assert_eq!(Scenario::Login.mix(&mixed).wheel(), [Operation::Login]);
        assert_eq!(Scenario::Health.mix(&mixed).wheel(), [Operation::Health]);
        assert_eq!(Scenario::Events.mix(&mixed).wheel(), [Operation::Event]);
        assert_eq!(Scenario::Events.counts(), ("events", "events/s"));
        assert_eq!(Scenario::Login.counts(), ("requests", "req/s"));
        assert_eq!(Scenario::Mixed.mix(&mixed), mixed);
    }
}

/// What the ratelimit operation asks: a domain and the descriptors of one
/// ShouldRateLimit request, `DOMAIN:KEY=VALUE,KEY=VALUE;KEY=VALUE…` (descriptors
/// separated by `;`, a descriptor's entries by `,`). `{n}` in a value becomes a
/// number from 0 to `keys - 1`, a different one request after request, so a run
/// spreads over that many keys (`--keys`) the way many clients would.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Descriptors {
    pub domain: String,
    pub descriptors: Vec<Vec<(String, String)>>,
}

impl Descriptors {
    /// The default of `--descriptors`: one per client address, as Envoy's
    /// `remote_address` action sends, over `--keys` addresses.
    pub const DEFAULT: &'static str = "edge:remote_address=10.0.0.{n}";

    /// The descriptors of one request, `{n}` replaced by `n`.
    pub fn entries(&self, n: usize) -> impl Iterator<Item = impl Iterator<Item = (&str, String)>> {
        self.descriptors.iter().map(move |entries| {
            entries
                .iter()
                .map(move |(key, value)| (key.as_str(), value.replace("{n}", &n.to_string())))
        })
    }
}

impl FromStr for Descriptors {
    type Err = String;

    fn from_str(spec: &str) -> Result<Self, Self::Err> {
        let shape = || {
            format!(
                "expected DOMAIN:KEY=VALUE,…;KEY=VALUE,… (e.g. {})",
                Self::DEFAULT
            )
        };
        let (domain, rest) = spec.split_once(':').ok_or_else(shape)?;
        let domain = domain.trim();
        if domain.is_empty() {
            return Err(shape());
        }
        let mut descriptors = Vec::new();
        for descriptor in rest.split(';').map(str::trim).filter(|d| !d.is_empty()) {
            let mut entries = Vec::new();
            for entry in descriptor.split(',').map(str::trim) {
                let (key, value) = entry.split_once('=').ok_or_else(shape)?;
                if key.trim().is_empty() {
                    return Err(shape());
                }
                entries.push((key.trim().to_owned(), value.trim().to_owned()));
            }
            descriptors.push(entries);
        }
        if descriptors.is_empty() {
            return Err(shape());
        }
        Ok(Descriptors {
            domain: domain.to_owned(),
            descriptors,
        })
    }
}

impl fmt::Display for Descriptors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:", self.domain)?;
        for (i, entries) in self.descriptors.iter().enumerate() {
            if i > 0 {
                f.write_str(";")?;
            }
            for (j, (key, value)) in entries.iter().enumerate() {
                if j > 0 {
                    f.write_str(",")?;
                }
                write!(f, "{key}={value}")?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod descriptor_tests {
    use super::*;

    #[test]
    fn descriptors_parse_print_and_number_their_keys() {
        let d: Descriptors = "edge: remote_address=10.0.{n} ; path=/login,remote_address=x"
            .parse()
            .unwrap();
        assert_eq!(
            d.to_string(),
            "edge:remote_address=10.0.{n};path=/login,remote_address=x"
        );
        let first: Vec<Vec<(&str, String)>> = d.entries(7).map(Iterator::collect).collect();
        assert_eq!(first[0], [("remote_address", "10.0.7".to_owned())]);
        assert_eq!(first[1].len(), 2);
        for bad in ["", "edge", "edge:", ":k=v", "edge:k", "edge:=v"] {
            assert!(bad.parse::<Descriptors>().is_err(), "{bad}");
        }
        assert_eq!(
            Descriptors::DEFAULT
                .parse::<Descriptors>()
                .unwrap()
                .descriptors
                .len(),
            1
        );
    }
}
