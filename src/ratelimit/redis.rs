//! The Redis tier: one Lua script decides for every rule a request matches, in one
//! round trip, atomically, so replicas sharing a Redis share exact limits.
//!
//! It uses the process's Redis connection (`crate::redis`, shared with the
//! login throttle) and owns the script and the members it adds. Each key is a sorted set: a
//! sliding-window log of the allowed requests, scored by Redis' own clock (`TIME`,
//! never this replica's, so clock skew between replicas does not matter).
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

pub(crate) struct RedisLimiter {
    redis: Arc<SharedRedis>,
    script: Script,
    /// Random per process, so members from different replicas never collide.
    replica: String,
    counter: AtomicU64,
    timeout: Duration,
}

impl RedisLimiter {
    pub(crate) fn new(redis: Arc<SharedRedis>, timeout: Duration) -> Self {
        let script = Script::new(SCRIPT);
        redis.load_on_probe(&script);
        RedisLimiter {
            redis,
            script,
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

    /// Runs the script for `checks` (not empty) within the timeout.
    pub(crate) async fn decide(&self, checks: &[Check]) -> Result<Outcome, RedisFailure> {
        let unique = self.counter.fetch_add(1, Ordering::Relaxed);
        let mut invocation = self.script.prepare_invoke();
        invocation.arg(format!("{}:{unique}", self.replica));
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
