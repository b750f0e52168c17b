//! The options of the limits shared through Redis: the Redis server (or the file
//! holding its URL) and how a request fares while it fails, the rate-limit rules and
//! the Register limit, the login throttle, and who the client they count is (the
//! trusted callers, whose `x-forwarded-for` names it).
//!
//! [`LimitsConfig::rate_limiter`] and [`LimitsConfig::throttle`] build the two
//! components' settings; the throttle's refuses thresholds that do not go together.
//! Connecting to Redis is `crate::redis`'s job, not this file's.

use super::parse::{positive_duration, read_secret_file};
use crate::{
    ratelimit::{FailureMode, RateLimits, RegisterLimit, Settings as RateLimitSettings},
    redis::SharedRedis,
    rpc::TrustedCallers,
    secret::{self, RedisUrl},
    throttle::Settings as ThrottleSettings,
};
use clap::Args;
use std::{path::PathBuf, sync::Arc, time::Duration};

/// Redis, the rate limits and the login throttle.
#[derive(Debug, Clone, Args)]
pub struct LimitsConfig {
    /// Redis for rate limits shared by every replica: redis://[:PASSWORD@]HOST:PORT[/DB],
    /// a Redis Cluster redis+cluster://[:PASSWORD@]HOST:PORT,HOST:PORT,… or a master found
    /// through Sentinel redis+sentinel://[:PASSWORD@]HOST:PORT,HOST:PORT,…/MASTERNAME[/DB]
    /// [default: none; the rules are enforced per replica, in process].
    #[arg(long, env = "AUTHD_REDIS_URL", hide_env_values = true,
          value_parser = secret::parser::<RedisUrl>(), global = true, display_order = 50)]
    pub redis_url: Option<RedisUrl>,

    /// File holding the Redis URL (surrounding whitespace ignored), instead of
    /// --redis-url: keeps its password out of `ps` and the environment. Read at start.
    #[arg(
        long,
        env = "AUTHD_REDIS_URL_FILE",
        conflicts_with = "redis_url",
        global = true,
        display_order = 51
    )]
    pub redis_url_file: Option<PathBuf>,

    /// Rate-limit rules, METHOD:KEY=LIMIT/WINDOW,… where METHOD is an RPC name or *, and
    /// KEY is peer, global, client-cert (the mutual-TLS identity), client-id (the
    /// client id a service account's grant names) or header:NAME; e.g.
    /// Login:peer=20/1s,*:global=2000/1s
    /// [default: none; only --register-limit applies].
    #[arg(long, env = "AUTHD_RATE_LIMITS", global = true, display_order = 52)]
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
        global = true,
        display_order = 53
    )]
    pub register_limit: RegisterLimit,

    /// Prefix of every Redis key of the rate limiter (replicas sharing limits use the same).
    #[arg(
        long,
        env = "AUTHD_RATE_LIMIT_PREFIX",
        default_value = "authd:rl",
        global = true,
        display_order = 54
    )]
    pub rate_limit_prefix: String,

    /// Longest a request waits for Redis (a rate-limit decision, a login throttle
    /// count) before falling back as AUTHD_RATE_LIMIT_FAILURE says.
    #[arg(long, env = "AUTHD_REDIS_TIMEOUT", default_value = "50ms",
          value_parser = positive_duration, global = true, display_order = 55)]
    pub redis_timeout: Duration,

    /// While Redis fails: open enforces the rules per replica in process; closed refuses
    /// rate-limited requests with UNAVAILABLE.
    #[arg(
        long,
        env = "AUTHD_RATE_LIMIT_FAILURE",
        default_value = "open",
        value_enum,
        global = true,
        display_order = 56
    )]
    pub rate_limit_failure: FailureMode,

    /// Callers that may name their end user's address in x-forwarded-for, as CIDRs,
    /// addresses or mutual-TLS client identities, e.g.
    /// 10.0.0.0/8,fd00::/8,spiffe://cluster.local/ns/signup/sa/signup: a request from
    /// one counts for the rightmost x-forwarded-for address that is not itself in a
    /// trusted network (or for the caller, when it forwards none) in every
    /// per-client limit (peer rules, the Register limit, the login throttle, fair
    /// shares) and in the audit trail. At most 256 entries [default: none; every
    /// client is its connection's address].
    #[arg(long, env = "AUTHD_TRUSTED_CALLERS", global = true, display_order = 57)]
    pub trusted_callers: Option<TrustedCallers>,

    /// Superseded by --trusted-callers: true trusts every caller's x-forwarded-for
    /// (as --trusted-callers=0.0.0.0/0,::/0 would, so the client is the first hop);
    /// only behind a proxy that sets that header, since clients can forge it.
    /// Kept for existing configurations; with --trusted-callers, both apply.
    #[arg(long, env = "AUTHD_TRUST_FORWARDED_FOR", default_value_t = false,
          num_args = 0..=1, require_equals = true, default_missing_value = "true",
          action = clap::ArgAction::Set, value_parser = clap::builder::BoolishValueParser::new(),
          global = true, display_order = 97)]
    pub trust_forwarded_for: bool,

    /// Most keys the in-process rate limiter tracks; beyond it, requests with keys not
    /// yet tracked share one overflow count per rule (memory stays bounded whatever
    /// clients send).
    #[arg(long, env = "AUTHD_RATE_LIMIT_MAX_KEYS", default_value_t = 100_000,
          value_parser = clap::value_parser!(u32).range(1..=100_000_000), global = true,
          display_order = 58)]
    pub rate_limit_max_keys: u32,

    /// Consecutive failed logins of one client (its address, as the rate limiter's peer
    /// key sees it) for one username before that client's next attempts for it are
    /// refused for --login-delay, doubling per further failure; a success resets the
    /// count. Unknown usernames are counted alike. 0 turns the login throttle off.
    #[arg(long, env = "AUTHD_LOGIN_FAILURES", default_value_t = 5,
          value_parser = clap::value_parser!(u32).range(0..=1000), global = true,
          display_order = 61)]
    pub login_failures: u32,

    /// The first delay of a throttled client; it doubles with each further failure.
    #[arg(long, env = "AUTHD_LOGIN_DELAY", default_value = "1s",
          value_parser = positive_duration, global = true, display_order = 62)]
    pub login_delay: Duration,

    /// The longest delay of one client for one username.
    #[arg(long, env = "AUTHD_LOGIN_DELAY_MAX", default_value = "15m",
          value_parser = positive_duration, global = true, display_order = 63)]
    pub login_delay_max: Duration,

    /// Failed logins for one username across all clients (each client's first
    /// --login-failures count, so one address alone never reaches it; once it is
    /// reached, every failure counts) before every client that has not logged in to
    /// it before is delayed too. Must be greater than --login-failures.
    #[arg(long, env = "AUTHD_LOGIN_ACCOUNT_FAILURES", default_value_t = 20,
          value_parser = clap::value_parser!(u32).range(1..=100_000), global = true,
          display_order = 64)]
    pub login_account_failures: u32,

    /// The longest delay of the across-clients count: short, so that the owner, told
    /// when to retry, gets in while a distributed attack makes a guess or so per delay
    /// (at most --login-delay-max).
    #[arg(long, env = "AUTHD_LOGIN_ACCOUNT_DELAY_MAX", default_value = "1m",
          value_parser = positive_duration, global = true, display_order = 65)]
    pub login_account_delay_max: Duration,

    /// Most entries of the in-process login throttle (used without Redis, or while it
    /// fails): about 300 bytes each, so the default bounds it near 30 MB.
    #[arg(long, env = "AUTHD_LOGIN_THROTTLE_MAX_ENTRIES", default_value_t = 100_000,
          value_parser = clap::value_parser!(u32).range(1..=100_000_000), global = true,
          display_order = 68)]
    pub login_throttle_max_entries: u32,

    /// Rules of Envoy's rate limit service (envoy.service.ratelimit.v3, served on the
    /// gRPC port): a YAML file in envoyproxy/ratelimit's format (domain, nested
    /// descriptors with key, value, rate_limit, shadow_mode), one domain per
    /// document; a document `authd: "METHOD:KEY=LIMIT/WINDOW,…"` may give authd's own
    /// RPC rules instead of --rate-limits. Re-read every --rate-limit-rules-reload
    /// [default: none; ShouldRateLimit is not served].
    #[arg(
        long,
        env = "AUTHD_RATE_LIMIT_RULES_FILE",
        global = true,
        display_order = 92
    )]
    pub rate_limit_rules_file: Option<PathBuf>,

    /// How often --rate-limit-rules-file is re-read; a new content that parses is in
    /// force at once, one that does not is refused and the rules in force stay.
    #[arg(long, env = "AUTHD_RATE_LIMIT_RULES_RELOAD", default_value = "10s",
          value_parser = positive_duration, global = true, display_order = 93)]
    pub rate_limit_rules_reload: Duration,

    /// Every rule of --rate-limit-rules-file in shadow mode: decided and counted as if
    /// enforced, never OVER_LIMIT; the metrics and the log name the rule that would
    /// have refused.
    #[arg(long, env = "AUTHD_RATE_LIMIT_SHADOW", default_value_t = false,
          num_args = 0..=1, require_equals = true, default_missing_value = "true",
          action = clap::ArgAction::Set, value_parser = clap::builder::BoolishValueParser::new(),
          global = true, display_order = 94)]
    pub rate_limit_shadow: bool,
}

impl LimitsConfig {
    /// What the rate limiter needs; `redis` is the connection it shares with the
    /// login throttle (`None` without `--redis-url`).
    /// `file_rules` are authd's RPC rules given by the rules file (`authd:`), if any;
    /// `clock` (the application's) keeps the in-process windows.
    pub(crate) fn rate_limiter(
        &self,
        redis: Option<Arc<SharedRedis>>,
        file_rules: Option<&RateLimits>,
        clock: Arc<dyn crate::clock::Clock>,
    ) -> anyhow::Result<RateLimitSettings> {
        let rules = self.authd_rules(file_rules)?;
        Ok(RateLimitSettings {
            rules,
            redis,
            prefix: self.rate_limit_prefix.clone(),
            redis_timeout: self.redis_timeout,
            failure: self.rate_limit_failure,
            max_local_keys: self.rate_limit_max_keys as usize,
            descriptors: self.rate_limit_rules_file.is_some(),
            clock: Some(clock),
        })
    }

    /// Who may name the client of its requests in `x-forwarded-for`: the callers of
    /// --trusted-callers, and everyone with --trust-forwarded-for.
    pub(crate) fn trusted_callers(&self) -> Arc<TrustedCallers> {
        let listed = self.trusted_callers.clone().unwrap_or_default();
        Arc::new(match self.trust_forwarded_for {
            true => listed.union(&TrustedCallers::everyone()),
            false => listed,
        })
    }

    /// authd's own RPC rules, with the Register limit: from --rate-limits, or from the
    /// rules file's `authd:` section (`file_rules`), never both.
    pub(crate) fn authd_rules(
        &self,
        file_rules: Option<&RateLimits>,
    ) -> anyhow::Result<RateLimits> {
        let rules = match (&self.rate_limits, file_rules) {
            (Some(_), Some(_)) => anyhow::bail!(
                "authd's own rate limits are given twice, by --rate-limits and by the authd: \
                 section of --rate-limit-rules-file; keep one"
            ),
            (Some(rules), None) | (None, Some(rules)) => rules.clone(),
            (None, None) => RateLimits::default(),
        };
        Ok(rules.with_register_limit(&self.register_limit))
    }

    /// What the login throttle needs; refuses an across-clients threshold that one
    /// client could reach alone, and delays that do not nest.
    pub(crate) fn throttle(
        &self,
        redis: Option<Arc<SharedRedis>>,
    ) -> anyhow::Result<ThrottleSettings> {
        if self.login_failures > 0 && self.login_account_failures <= self.login_failures {
            anyhow::bail!(
                "--login-account-failures ({}) must be greater than --login-failures ({}), so \
                 that one client alone cannot throttle an account for everyone",
                self.login_account_failures,
                self.login_failures
            );
        }
        if self.login_delay > self.login_delay_max {
            anyhow::bail!("--login-delay must not be longer than --login-delay-max");
        }
        // A client's count must outlive the account count it fed, or a lone client
        // whose count expired could feed the account again.
        if self.login_account_delay_max > self.login_delay_max {
            anyhow::bail!("--login-account-delay-max must not be longer than --login-delay-max");
        }
        Ok(ThrottleSettings {
            failures: self.login_failures,
            delay: self.login_delay,
            delay_max: self.login_delay_max,
            account_failures: self.login_account_failures,
            account_delay_max: self.login_account_delay_max,
            max_entries: self.login_throttle_max_entries as usize,
            redis,
            prefix: format!("{}:", self.rate_limit_prefix),
            redis_timeout: self.redis_timeout,
            failure: self.rate_limit_failure,
        })
    }

    /// Reads the URL named by `--redis-url-file`, if any, into `redis_url`.
    pub(super) fn read_secret_file(&mut self) -> anyhow::Result<()> {
        if let Some(path) = &self.redis_url_file {
            self.redis_url = Some(read_secret_file("--redis-url-file", path)?);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use crate::config::Config;
    use std::time::Duration;

    #[test]
    fn throttle_thresholds_that_do_not_go_together_are_refused() {
        let defaults = Config::defaults().limits;
        let settings = defaults.throttle(None).unwrap();
        assert_eq!(settings.prefix, "authd:rl:");
        let mut c = defaults.clone();
        c.login_account_failures = c.login_failures;
        let err = c.throttle(None).unwrap_err().to_string();
        assert!(
            err.contains("must be greater than --login-failures"),
            "{err}"
        );
        c.login_failures = 0;
        assert!(
            c.throttle(None).is_ok(),
            "a throttle that is off checks no threshold"
        );
        let mut c = defaults.clone();
        c.login_delay = c.login_delay_max + Duration::from_secs(1);
        assert!(c.throttle(None).is_err());
        let mut c = defaults;
        c.login_account_delay_max = c.login_delay_max + Duration::from_secs(1);
        assert!(c.throttle(None).is_err());
    }
}
