//! The Redis tier: one Lua script decides for every rule a request matches, in one
//! round trip, atomically, so replicas sharing a Redis share exact limits.
//!
//! It uses the process's Redis connection (`crate::redis`, shared with the
//! login throttle) and owns the script and the members it adds. Each key is a sorted set: a
//! sliding-window log of the allowed requests, scored by Redis' own clock (`TIME`,
//! never this replica's, so clock skew between replicas does not matter).
//!
//! On a Redis Cluster a script may touch the keys of one slot only. Keys carry their
//! subject as a hash tag (`super::keys`), so the rules of one client share a slot;
//! a request whose keys fall in several slots is decided in two steps, each shard
//! once, all at once: every slot's script checks *and adds* its keys (a
//! reservation), and if any refused, the reservations of the others are removed
//! ([`RELEASE`]) before the request is answered. A log therefore never holds more
//! entries than its limit (no window ever lets more than the limit through, races
//! included); what a race costs instead is a spurious refusal: a reservation about
//! to be removed may refuse another request during that one round trip. A removal
//! that fails leaves its entry until it leaves the window.
//!
//! It must not decide what happens when Redis fails: every error or timeout is
//! returned to the caller (`super::RateLimiter`), which falls back or refuses.
//! Every call is bounded by `AUTHD_REDIS_TIMEOUT`.

use super::{Check, Outcome, RuleState};
use crate::redis::{RedisFailure, SharedRedis};
use redis::Script;
use std::{
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

/// KEYS: one sorted set per matching rule.
/// ARGV[1]: the member to add, unique to this decision (a random replica id and a
///   counter), so two requests in the same microsecond, on one replica or several,
///   never collide.
/// ARGV[3i-1], ARGV[3i], ARGV[3i+1]: limit, window (ms) and hits of the rule of
///   KEYS[i]. Hits are 1 for authd's own RPCs and Envoy's `hits_addend` for a
///   descriptor: the rule must have room for all of them, and they are added as that
///   many members (the unique member, then with `:2`, `:3`, ... appended).
/// Returns {allowed (1|0), remaining_1, reset_us_1, remaining_2, reset_us_2, ...},
/// where reset is 0 while the rule has room, else the time until its next slot frees.
///
/// First every log is trimmed and counted; only if all have room is the request
/// added to all of them (a refused request adds nothing, so a client hammering a
/// closed limit does not keep it closed). Scores are microseconds since the epoch:
/// below 2^53, exact in Lua's doubles, and formatted with %d so no precision is
/// lost on the way to Redis. Each `redis.call` costs about a microsecond of plumbing
/// on top of the command, so the common path (allowed, room left, one hit) makes
/// only the five that the algorithm needs: TIME, then ZREMRANGEBYSCORE, ZCARD, ZADD,
/// PEXPIRE.
const SCRIPT: &str = r#"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local now_score = string.format('%d', now)
local n = #KEYS
local counts = {}
local allowed = 1
for i = 1, n do
  local window = tonumber(ARGV[3 * i]) * 1000
  redis.call('ZREMRANGEBYSCORE', KEYS[i], '-inf', string.format('%d', now - window))
  counts[i] = redis.call('ZCARD', KEYS[i])
  if counts[i] + tonumber(ARGV[3 * i + 1]) > tonumber(ARGV[3 * i - 1]) then
    allowed = 0
  end
end
local out = {allowed}
for i = 1, n do
  local limit = tonumber(ARGV[3 * i - 1])
  local window_ms = tonumber(ARGV[3 * i])
  local hits = tonumber(ARGV[3 * i + 1])
  local count = counts[i]
  if allowed == 1 then
    redis.call('ZADD', KEYS[i], now_score, ARGV[1])
    for h = 2, hits do
      redis.call('ZADD', KEYS[i], now_score, ARGV[1] .. ':' .. h)
    end
    redis.call('PEXPIRE', KEYS[i], window_ms)
    count = count + hits
  end
  local reset = 0
  if count >= limit then
    -- The next slot frees when the entry keeping the log full leaves the window.
    local index = count - limit
    local entry = redis.call('ZRANGE', KEYS[i], index, index, 'WITHSCORES')
    reset = tonumber(entry[2]) + window_ms * 1000 - now
  end
  out[2 * i] = math.max(limit - count, 0)
  out[2 * i + 1] = reset
end
return out
"#;

/// KEYS: the logs of one slot a reservation was added to; ARGV[1]: its member;
/// ARGV[1 + i]: the hits added to KEYS[i] (the member, then with `:2`, `:3`, ...
/// appended, as [`SCRIPT`] adds them).
/// Takes the reservation back, every hit of it (a request another slot refused).
const RELEASE: &str = r#"
for i = 1, #KEYS do
  redis.call('ZREM', KEYS[i], ARGV[1])
  for h = 2, tonumber(ARGV[1 + i]) do
    redis.call('ZREM', KEYS[i], ARGV[1] .. ':' .. h)
  end
end
return 1
"#;

pub(crate) struct RedisLimiter {
    redis: Arc<SharedRedis>,
    script: Script,
    release: Script,
    /// Random per process, so members from different replicas never collide.
    replica: String,
    counter: AtomicU64,
    timeout: Duration,
}

impl RedisLimiter {
    pub(crate) fn new(redis: Arc<SharedRedis>, timeout: Duration) -> Self {
        let script = Script::new(SCRIPT);
        redis.load_on_probe(&script);
        let release = Script::new(RELEASE);
        redis.load_on_probe(&release);
        RedisLimiter {
            redis,
            script,
            release,
            replica: format!("{:016x}", rand::random::<u64>()),
            counter: AtomicU64::new(0),
            timeout,
        }
    }

    /// The connection, for its health and start.
    pub(crate) fn redis(&self) -> &Arc<SharedRedis> {
        &self.redis
    }

    /// The server's URL, for log lines (its password redacted when shown).
    pub(crate) fn url(&self) -> &crate::secret::RedisUrl {
        self.redis.url()
    }

    /// Runs the script for `checks` (not empty) within the timeout: once, or on a
    /// Redis Cluster once per slot their keys fall in, all at once.
    pub(crate) async fn decide(&self, checks: &[Check]) -> Result<Outcome, RedisFailure> {
        let unique = self.counter.fetch_add(1, Ordering::Relaxed);
        let member = format!("{}:{unique}", self.replica);
        let groups = if self.redis.is_cluster() {
            by_slot(checks)
        } else {
            vec![(0..checks.len()).collect()]
        };
        if groups.len() == 1 {
            return self.decide_in(&member, checks).await;
        }
        let parts: Vec<Vec<Check>> = (groups.iter())
            .map(|g| g.iter().map(|&i| checks[i].clone()).collect())
            .collect();
        let answers =
            futures_util::future::join_all(parts.iter().map(|p| self.decide_in(&member, p))).await;
        let refused = answers.iter().any(|a| matches!(a, Ok(o) if !o.allowed));
        let failed = answers.iter().any(Result::is_err);
        // The slots that added the request while another refused it (or failed): take
        // it back, so a refused request leaves no entry.
        let mut releases = Vec::new();
        if refused || failed {
            for (part, answer) in parts.iter().zip(&answers) {
                if matches!(answer, Ok(o) if o.allowed) {
                    releases.push(self.release_in(&member, part));
                }
            }
        }
        if failed {
            // Taken back before the request falls back, each bounded by the timeout.
            for release in releases {
                let _ = release.await;
            }
            let why = answers.into_iter().find_map(Result::err);
            return Err(why.expect("one answer failed"));
        }
        for result in futures_util::future::join_all(releases).await {
            if let Err(why) = result {
                tracing::debug!(error = %why, "a refused request's reservation stays until it leaves the window");
            }
        }
        let mut states = vec![None; checks.len()];
        for ((group, part), answer) in groups.iter().zip(&parts).zip(answers) {
            let outcome = answer.expect("no answer failed");
            for ((&index, check), mut state) in group.iter().zip(part).zip(outcome.states) {
                if refused && outcome.allowed {
                    // Its reservation was taken back: one more slot left.
                    state.remaining = (state.remaining + 1).min(check.limit);
                    state.reset = Duration::ZERO;
                }
                states[index] = Some(state);
            }
        }
        Ok(Outcome {
            allowed: !refused,
            states: states
                .into_iter()
                .map(|s| s.expect("every check is in one group"))
                .collect(),
        })
    }

    /// The script on `checks`, whose keys share one slot.
    async fn decide_in(&self, member: &str, checks: &[Check]) -> Result<Outcome, RedisFailure> {
        let mut invocation = self.script.prepare_invoke();
        invocation.arg(member);
        for check in checks {
            invocation
                .key(&check.key)
                .arg(check.limit)
                .arg(check.window.as_millis() as u64)
                .arg(check.hits);
        }
        // The limiter has read the connection's health itself to choose its backend.
        let reply: Vec<i64> = self.redis.invoke_anyway(&invocation, self.timeout).await?;
        parse_reply(&reply, checks.len())
    }

    /// Takes back the entry `member` added to the logs of `checks` (one slot).
    async fn release_in(&self, member: &str, checks: &[Check]) -> Result<(), RedisFailure> {
        let mut invocation = self.release.prepare_invoke();
        invocation.arg(member);
        for check in checks {
            invocation.key(&check.key);
            invocation.arg(check.hits);
        }
        let _: i64 = self.redis.invoke_anyway(&invocation, self.timeout).await?;
        Ok(())
    }
}

/// The checks' indexes grouped by the Redis Cluster slot of their keys, in the order
/// the slots first appear.
fn by_slot(checks: &[Check]) -> Vec<Vec<usize>> {
    let mut groups: Vec<(redis::cluster_routing::Slot, Vec<usize>)> = Vec::new();
    for (index, check) in checks.iter().enumerate() {
        let slot = redis::cluster_routing::Slot::for_key(&check.key);
        match groups.iter_mut().find(|(s, _)| *s == slot) {
            Some((_, group)) => group.push(index),
            None => groups.push((slot, vec![index])),
        }
    }
    groups.into_iter().map(|(_, group)| group).collect()
}

/// Checks the shape of the script's reply and reads it.
fn parse_reply(reply: &[i64], rules: usize) -> Result<Outcome, RedisFailure> {
    if reply.len() != 1 + 2 * rules || !matches!(reply[0], 0 | 1) {
        return Err(RedisFailure::BadReply(format!(
            "{} integers for {rules} rules",
            reply.len()
        )));
    }
    let states = reply[1..]
        .chunks_exact(2)
        .map(|pair| RuleState {
            remaining: u32::try_from(pair[0].max(0)).unwrap_or(u32::MAX),
            reset: Duration::from_micros(pair[1].max(0) as u64),
        })
        .collect();
    Ok(Outcome {
        allowed: reply[0] == 1,
        states,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(key: &str) -> Check {
        Check {
            rule: 0,
            key: key.to_owned(),
            limit: 1,
            window: Duration::from_secs(1),
            hits: 1,
        }
    }

    #[test]
    fn one_call_per_slot_the_keys_of_one_client_together() {
        let checks = [
            check("p:Login:peer:1000:{10.0.0.7}"),
            check("p:*:global:60000:{}"),
            check("p:*:peer:1000:{10.0.0.7}"),
            check("p:Login:global:1000:{}"),
        ];
        let groups = by_slot(&checks);
        // The client's two rules share its tag; each global rule hashes whole.
        assert_eq!(groups[0], [0, 2]);
        assert_eq!(groups.iter().map(Vec::len).sum::<usize>(), 4);
        assert!(groups.len() <= 3);
        let slot = |i: usize| redis::cluster_routing::Slot::for_key(&checks[i].key);
        for group in &groups {
            assert!(
                group.iter().all(|&i| slot(i) == slot(group[0])),
                "{group:?}"
            );
        }
    }
}
