//! The overload options: how long a call without a deadline may wait, how many
//! AuthService requests may be in flight (in all and per client: the memory bound),
//! how long one may take to arrive, and how refused requests are held before their
//! answer (pushback).
//!
//! [`OverloadConfig::admission`] and [`OverloadConfig::pushback`] build the settings
//! of the two layers, the per-client defaults resolved. The rate limits belong to
//! `limits`.

use super::parse::positive_duration;
use crate::layers::{admission::AdmissionSettings, pushback::PushbackSettings};
use clap::Args;
use std::time::Duration;

/// Admission control and pushback.
#[derive(Debug, Clone, Args)]
pub struct OverloadConfig {
    /// AuthService requests in flight at once, whatever their deadlines: the bound on
    /// the memory requests hold (some 10 KiB each); beyond it RESOURCE_EXHAUSTED.
    #[arg(long, env = "AUTHD_MAX_IN_FLIGHT", default_value_t = 8192,
          value_parser = clap::value_parser!(u32).range(1..=1_000_000), global = true,
          display_order = 16)]
    pub max_in_flight: u32,

    /// AuthService requests one client (IP address; the x-forwarded-for client of a
    /// --trusted-callers caller) may always have open at once, being received or in flight;
    /// past it a client may open more while more than this many places of
    /// --max-in-flight stay free, beyond that RESOURCE_EXHAUSTED [default: a quarter of
    /// --max-in-flight].
    #[arg(long, env = "AUTHD_MAX_IN_FLIGHT_PER_CLIENT",
          value_parser = clap::value_parser!(u32).range(1..=1_000_000), global = true,
          display_order = 18)]
    pub max_in_flight_per_client: Option<u32>,

    /// Deprecated, no effect (accepted so that existing configurations still start; a
    /// warning names it): a request is admitted when it can be answered before its own
    /// deadline, or within --max-wait without one.
    #[arg(long, env = "AUTHD_IN_FLIGHT_WAIT", value_parser = up_to_a_minute, global = true,
          display_order = 17)]
    pub in_flight_wait: Option<Duration>,

    /// Longest a call without a deadline (no grpc-timeout) may take: it is admitted
    /// only when it is predicted to be answered within it, and answered
    /// DEADLINE_EXCEEDED when it is not answered by then. A call with a deadline is
    /// admitted when it is predicted to be answered before it (from the rate
    /// requests of its kind are answered at and the requests ahead of it); otherwise
    /// RESOURCE_EXHAUSTED at once, with the predicted wait as its retry hint.
    #[arg(long, env = "AUTHD_MAX_WAIT", default_value = "5s",
          value_parser = positive_up_to_an_hour, global = true, display_order = 98)]
    pub max_wait: Duration,

    /// Longest a refused request is held before its answer: a RESOURCE_EXHAUSTED answer
    /// with a retry hint (not answerable before its deadline, in-flight caps, rate
    /// limits, login throttle)
    /// is sent at its hint or its slot of --refusal-rate, whichever is later, at most
    /// this long after and before nine tenths of the client's time (a call with no
    /// deadline at most 1s), and its RetryInfo says what is left of the hint;
    /// 0s answers refusals at once (at most 1m).
    #[arg(long, env = "AUTHD_REFUSAL_HOLD", default_value = "10s",
          value_parser = up_to_a_minute, global = true, display_order = 19)]
    pub refusal_hold: Duration,

    /// Refusals answered per second while refusals are held: each takes the next slot
    /// of this pace (or waits out its hint, if later), within --refusal-hold, so a
    /// crowd that re-asks at once costs the server at most about this many refusals
    /// a second.
    #[arg(long, env = "AUTHD_REFUSAL_RATE", default_value_t = 500,
          value_parser = clap::value_parser!(u32).range(1..=1_000_000), global = true,
          display_order = 20)]
    pub refusal_rate: u32,

    /// Refused requests held at once, in all; beyond it a refusal is answered at once.
    #[arg(long, env = "AUTHD_REFUSAL_HOLD_MAX", default_value_t = 16_384,
          value_parser = clap::value_parser!(u32).range(1..=1_000_000), global = true,
          display_order = 21)]
    pub refusal_hold_max: u32,

    /// Refused requests held at once for one client (IP address; the x-forwarded-for
    /// client of a --trusted-callers caller) [default: half of --refusal-hold-max].
    #[arg(long, env = "AUTHD_REFUSAL_HOLD_MAX_PER_CLIENT",
          value_parser = clap::value_parser!(u32).range(1..=1_000_000), global = true,
          display_order = 22)]
    pub refusal_hold_max_per_client: Option<u32>,

    /// Longest a request may take to arrive, from its headers to the end of its body; a
    /// request not received by then gets DEADLINE_EXCEEDED. It holds no in-flight place
    /// until it has arrived.
    #[arg(long, env = "AUTHD_RECEIVE_TIMEOUT", default_value = "5s",
          value_parser = positive_duration, global = true, display_order = 23)]
    pub receive_timeout: Duration,
}

impl OverloadConfig {
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

    /// The admission layer's settings: `max_body_bytes` is the largest request worth
    /// receiving (the server's message limit, framing included), and
    /// `hash_parallelism` the hashes the server runs side by side.
    pub(crate) fn admission(
        &self,
        max_body_bytes: usize,
        hash_parallelism: usize,
    ) -> AdmissionSettings {
        AdmissionSettings {
            max_in_flight: self.max_in_flight,
            max_per_client: self.max_in_flight_per_client(),
            receive_timeout: self.receive_timeout,
            max_body_bytes,
            max_wait: self.max_wait,
            hash_parallelism: u32::try_from(hash_parallelism).unwrap_or(u32::MAX),
        }
    }

    /// The pushback layer's settings.
    pub(crate) fn pushback(&self) -> PushbackSettings {
        PushbackSettings {
            max_hold: self.refusal_hold,
            rate: self.refusal_rate,
            max_held: self.refusal_hold_max,
            max_held_per_client: self.refusal_hold_max_per_client(),
        }
    }
}

/// A refusal hold: zero (answer at once) up to a minute (past it a client's own
/// deadline or patience is the bound that matters).
fn up_to_a_minute(s: &str) -> Result<Duration, String> {
    let d = humantime::parse_duration(s).map_err(|e| format!("{e} (examples: 0s, 75ms, 2s)"))?;
    if d > Duration::from_secs(60) {
        return Err("must be at most 1m".into());
    }
    Ok(d)
}

/// The wait of a call without a deadline: more than zero, at most an hour.
fn positive_up_to_an_hour(s: &str) -> Result<Duration, String> {
    let d = positive_duration(s)?;
    if d > Duration::from_secs(3600) {
        return Err("must be at most 1h".into());
    }
    Ok(d)
}

#[cfg(test)]
mod tests {
    use crate::config::{Cli, Config};
    use std::time::Duration;

    #[test]
    fn per_client_caps_default_to_a_share_of_the_total() {
        let mut c = Config::defaults().overload;
        c.max_in_flight = 100;
        c.refusal_hold_max = 10;
        assert_eq!(c.admission(1024, 64).max_per_client, 25);
        assert_eq!(c.admission(1024, 64).max_wait, Duration::from_secs(5));
        assert_eq!(c.pushback().max_held_per_client, 5);
        c.max_in_flight = 1;
        c.refusal_hold_max = 1;
        assert_eq!(c.max_in_flight_per_client(), 1);
        assert_eq!(c.refusal_hold_max_per_client(), 1);
        c.max_in_flight_per_client = Some(7);
        assert_eq!(c.admission(1024, 64).max_per_client, 7);
    }

    #[test]
    fn the_wait_of_a_call_without_a_deadline_is_positive_and_at_most_an_hour() {
        let parse = |v: &str| Cli::parse_for_test(&["--max-wait", v]);
        assert_eq!(
            parse("30s").unwrap().config.overload.max_wait,
            Duration::from_secs(30)
        );
        assert!(parse("0s").unwrap_err().contains("greater than zero"));
        assert!(parse("2h").unwrap_err().contains("must be at most 1h"));
    }

    #[test]
    fn a_refusal_hold_is_at_most_a_minute() {
        assert!(Cli::parse_for_test(&["--refusal-hold", "0s"]).is_ok());
        let err = Cli::parse_for_test(&["--refusal-hold", "61s"]).unwrap_err();
        assert!(err.contains("must be at most 1m"), "{err}");
    }
}
