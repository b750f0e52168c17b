//! The counts in Redis, shared by every replica: a hash per count (`f` failures,
//! `l` time of the last one, ms since the epoch), a sorted set per count of the
//! reservations in flight (member: the attempt's id, score: when its lease ends), and
//! a plain key per known client, each with an expiry, under the rate limiter's
//! prefix. Two scripts, one round trip each: [`RESERVE`] decides an attempt and takes
//! its place in one step (so attempts at once on any number of replicas are counted
//! one after the other), [`SETTLE`] gives the place back and records the outcome.
//! The reserve script applies the rule of [`Settings::decide`] (the same rule, in
//! Lua; the two are tested against each other). Every call is bounded by
//! `AUTHD_REDIS_TIMEOUT`.
//!
//! A reservation whose replica never settles it (it died mid-attempt) lapses with
//! its lease ([`LEASE`]). All the keys of a username share one hash tag.
//!
//! The connection is the process's one (`crate::redis`, shared with the rate
//! limiter), and so is its health: while a call of either has failed and no probe
//! has succeeded since, the counts are not asked at all (the throttle falls back at
//! once), so a Redis that is down or hangs makes one login wait its timeout, not
//! every one. Releases are sent all the same: no login waits for them.

use super::{Decision, KNOWN_CLIENT_FOR, Keys, LEASE, Outcome, Scope, Settings, ms};
use crate::redis::{RedisFailure, SharedRedis};
use redis::Script;
use std::{sync::Arc, time::Duration};

/// KEYS: pair, account, known, pair reservations, account reservations.
/// ARGV: now, failures, account failures, delay, delay max, account delay max (ms),
/// lease (ms), the attempt's id.
/// Returns {0, account} reserved, {1, wait ms} refused by the client's count,
/// {2, wait ms} by the account's, {3, 0} / {4, 0} wait for the client's / the
/// account's attempts in flight.
const RESERVE: &str = r"
local now = tonumber(ARGV[1])
local failures, account_failures = tonumber(ARGV[2]), tonumber(ARGV[3])
local delay, delay_max, account_delay_max = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])
local lease, id = tonumber(ARGV[7]), ARGV[8]
local function count(key)
  local v = redis.call('HMGET', key, 'f', 'l')
  return tonumber(v[1]) or 0, tonumber(v[2]) or 0
end
local function wait(f, l, threshold, max)
  if f < threshold then return 0 end
  local d = math.min(delay * 2 ^ math.min(f - threshold, 31), max)
  return math.max(l + d - now, 0)
end
local function pending(key)
  redis.call('ZREMRANGEBYSCORE', key, '-inf', now)
  return redis.call('ZCARD', key)
end
local pf, pl = count(KEYS[1])
local w = wait(pf, pl, failures, delay_max)
if w > 0 then return {1, w} end
local pp = pending(KEYS[4])
if pp > 0 and pf + pp >= failures then return {3, 0} end
local af, al = count(KEYS[2])
local ap = pending(KEYS[5])
local account = pf + pp < failures or af + ap >= account_failures
if redis.call('EXISTS', KEYS[3]) == 0 then
  w = wait(af, al, account_failures, account_delay_max)
  if w > 0 then return {2, w} end
  if account and ap > 0 and af + ap >= account_failures then return {4, 0} end
end
redis.call('ZADD', KEYS[4], now + lease, id)
redis.call('PEXPIRE', KEYS[4], lease)
if account then
  redis.call('ZADD', KEYS[5], now + lease, id)
  redis.call('PEXPIRE', KEYS[5], lease)
  return {0, 1}
end
return {0, 0}
";

/// KEYS: as [`RESERVE`]. ARGV: now, outcome (failed, succeeded, released), whether
/// the attempt holds a place in the account's count ("1"), its id, the pair's and
/// the account's expiry and the known mark's (ms).
const SETTLE: &str = r"
local now, outcome, account, id = ARGV[1], ARGV[2], ARGV[3] == '1', ARGV[4]
redis.call('ZREM', KEYS[4], id)
if account then redis.call('ZREM', KEYS[5], id) end
if outcome == 'failed' then
  redis.call('HINCRBY', KEYS[1], 'f', 1)
  redis.call('HSET', KEYS[1], 'l', now)
  redis.call('PEXPIRE', KEYS[1], ARGV[5])
  if account then
    redis.call('HINCRBY', KEYS[2], 'f', 1)
    redis.call('HSET', KEYS[2], 'l', now)
    redis.call('PEXPIRE', KEYS[2], ARGV[6])
  end
elseif outcome == 'succeeded' then
  redis.call('DEL', KEYS[1])
  redis.call('SET', KEYS[3], 1, 'PX', ARGV[7])
end
return 1
";

pub(super) struct RedisCounts {
    redis: Arc<SharedRedis>,
    prefix: String,
    timeout: Duration,
    reserve: Script,
    settle: Script,
}

impl RedisCounts {
    pub(super) fn new(redis: Arc<SharedRedis>, prefix: &str, timeout: Duration) -> Self {
        let (reserve, settle) = (Script::new(RESERVE), Script::new(SETTLE));
        redis.load_on_probe(&reserve);
        redis.load_on_probe(&settle);
        RedisCounts {
            redis,
            prefix: prefix.to_owned(),
            timeout,
            reserve,
            settle,
        }
    }

    /// Connects now (at start) if not yet connected, waiting at most the timeout,
    /// and has the connection probed while it is down.
    pub(super) async fn connect(&self) {
        if let Err(e) = self.redis.start(self.timeout).await {
            tracing::debug!(error = %e, "the login throttle cannot reach Redis yet");
        }
    }

    fn invocation<'a>(&self, script: &'a Script, keys: &Keys) -> redis::ScriptInvocation<'a> {
        let mut invocation = script.prepare_invoke();
        for key in keys.all() {
            invocation.key(format!("{}{key}", self.prefix));
        }
        invocation
    }

    /// Decides an attempt and, when it may go on, reserves its place.
    pub(super) async fn reserve(
        &self,
        keys: &Keys,
        id: &str,
        now: u64,
        s: &Settings,
    ) -> Result<Decision, RedisFailure> {
        let mut invocation = self.invocation(&self.reserve, keys);
        invocation
            .arg(now)
            .arg(s.failures)
            .arg(s.account_failures)
            .arg(ms(s.delay))
            .arg(ms(s.delay_max))
            .arg(ms(s.account_delay_max))
            .arg(ms(LEASE))
            .arg(id);
        let (code, value): (i64, i64) = self.redis.invoke(&invocation, self.timeout).await?;
        let wait = Duration::from_millis(u64::try_from(value).unwrap_or(0));
        match code {
            0 => Ok(Decision::Reserved {
                account: value == 1,
            }),
            1 => Ok(Decision::Refused(Scope::Client, wait)),
            2 => Ok(Decision::Refused(Scope::Account, wait)),
            3 => Ok(Decision::Wait(Scope::Client)),
            4 => Ok(Decision::Wait(Scope::Account)),
            _ => Err(RedisFailure::BadReply(code.to_string())),
        }
    }

    /// Gives an attempt's place back and records its outcome.
    pub(super) async fn settle(
        &self,
        keys: &Keys,
        id: &str,
        account: bool,
        outcome: Outcome,
        now: u64,
        s: &Settings,
    ) -> Result<(), RedisFailure> {
        let outcome = match outcome {
            Outcome::Failed => "failed",
            Outcome::Succeeded => "succeeded",
            Outcome::Released => "released",
        };
        let mut invocation = self.invocation(&self.settle, keys);
        invocation
            .arg(now)
            .arg(outcome)
            .arg(if account { "1" } else { "0" })
            .arg(id)
            .arg(ms(s.pair_ttl()))
            .arg(ms(s.account_ttl()))
            .arg(ms(KNOWN_CLIENT_FOR));
        let _: i64 = if outcome == "released" {
            // A release runs on its own, after the request: sent even while the
            // connection is marked down, it frees the place as soon as Redis answers
            // (else the place is held until its lease ends).
            self.redis.invoke_anyway(&invocation, self.timeout).await?
        } else {
            self.redis.invoke(&invocation, self.timeout).await?
        };
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    //! The reserve script against [`Settings::decide`], the rule it must apply: for
    //! every state of a grid, stored in the Redis of `AUTHD_TEST_REDIS_URL` (skipped
    //! without it, unless `AUTHD_TEST_REQUIRE_SERVICES=1`).
    use super::*;
    use crate::throttle::{Count, View};

    fn settings() -> Settings {
        Settings {
            redis_timeout: Duration::from_secs(10),
            ..crate::throttle::test_settings()
        }
    }

    async fn store(
        c: &mut crate::redis::Link,
        counts: &RedisCounts,
        keys: &Keys,
        v: &View,
        now: u64,
    ) {
        let key = |k: &str| format!("{}{k}", counts.prefix);
        let mut pipe = redis::pipe();
        for k in keys.all() {
            pipe.cmd("DEL").arg(key(k)).ignore();
        }
        for (k, count) in [(&keys.pair, v.pair), (&keys.account, v.account)] {
            if count.failures > 0 {
                pipe.cmd("HSET")
                    .arg(key(k))
                    .arg("f")
                    .arg(count.failures)
                    .arg("l")
                    .arg(count.last_ms)
                    .ignore();
            }
        }
        for (k, n) in [
            (&keys.pair_pending, v.pair_pending),
            (&keys.account_pending, v.account_pending),
        ] {
            for i in 0..n {
                pipe.cmd("ZADD")
                    .arg(key(k))
                    .arg(now + 30_000)
                    .arg(format!("held-{i}"))
                    .ignore();
            }
            // A lapsed lease, which must not count.
            pipe.cmd("ZADD")
                .arg(key(k))
                .arg(now - 1)
                .arg("lapsed")
                .ignore();
        }
        if v.known {
            pipe.cmd("SET").arg(key(&keys.known)).arg(1).ignore();
        }
        let () = pipe.query_async(c).await.unwrap();
    }

    #[tokio::test]
    async fn the_reserve_script_decides_as_the_rule() {
        let Ok(url) = std::env::var("AUTHD_TEST_REDIS_URL") else {
            assert!(
                std::env::var("AUTHD_TEST_REQUIRE_SERVICES").as_deref() != Ok("1"),
                "AUTHD_TEST_REDIS_URL is required"
            );
            eprintln!("skipped: AUTHD_TEST_REDIS_URL is not set");
            return;
        };
        let shared = SharedRedis::open(&url.parse().unwrap()).unwrap();
        shared.start(Duration::from_secs(5)).await.unwrap();
        let mut connection = shared.connect(Duration::from_secs(5)).await.unwrap();
        let prefix = format!("authd-test-reserve-{:016x}:", rand::random::<u64>());
        let counts = RedisCounts::new(shared, &prefix, Duration::from_secs(10));
        let s = settings();
        let now: u64 = 1_800_000_000_000;
        let keys = Keys::new("login", "grid", "10.0.0.1".parse().ok());
        let mut checked = 0;
        for pair_failures in 0..6 {
            for pair_pending in 0..4 {
                for account_failures in [0, 5, 6, 7, 9] {
                    for account_pending in 0..3 {
                        for known in [false, true] {
                            for age_ms in [100, 5_000] {
                                let at = |failures| Count {
                                    failures,
                                    last_ms: now - age_ms,
                                };
                                let v = View {
                                    pair: at(pair_failures),
                                    pair_pending,
                                    account: at(account_failures),
                                    account_pending,
                                    known,
                                };
                                store(&mut connection, &counts, &keys, &v, now).await;
                                let id = format!("probe-{checked}");
                                let got = counts.reserve(&keys, &id, now, &s).await.unwrap();
                                assert_eq!(got, s.decide(&v, now), "{v:?}");
                                checked += 1;
                            }
                        }
                    }
                }
            }
        }
        assert_eq!(checked, 6 * 4 * 5 * 3 * 2 * 2);
        let mut pipe = redis::pipe();
        for k in keys.all() {
            pipe.cmd("DEL").arg(format!("{prefix}{k}")).ignore();
        }
        let () = pipe.query_async(&mut connection).await.unwrap();
    }
}
