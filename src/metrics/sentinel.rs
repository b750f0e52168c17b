//! Which server answers for Redis when the sentinels name it: the master authd is
//! connected to, by address, so a failover shows on a dashboard as the moment the
//! label changes. Set at scrape by the code that owns the connection; this file
//! must not import `redis`.

use super::Families;
use prometheus::IntGaugeVec;

/// The Redis master found through Sentinel.
pub(crate) struct SentinelMetrics {
    /// 1 for the master connected to now (`address` = `host:port`); no series
    /// without Sentinel, or before a master was found.
    pub master: IntGaugeVec,
}

impl SentinelMetrics {
    pub(super) fn new(f: &Families) -> Self {
        Self {
            master: f.gauge_vec(
                "authd_redis_sentinel_master",
                "1 for the Redis master the sentinels named and authd is connected to, by \
                 address; absent without AUTHD_REDIS_URL=redis+sentinel://.",
                &["address"],
            ),
        }
    }
}
