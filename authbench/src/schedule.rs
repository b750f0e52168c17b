//! When requests are meant to be sent, and over how many connections.
//!
//! Pure arithmetic, kept apart from the runner so it can be tested without a clock.
//! The open loop sends on a fixed schedule (the k-th request at `start + k / rate`)
//! whatever the server does; latency is then measured from that intended time, so
//! a server that stalls shows its queue in the report instead of slowing the sender.

use std::time::{Duration, Instant};

/// Most connections the defaults open: beyond this, more sockets cost the client and
/// the server more than they spread.
pub const MAX_DEFAULT_CONNECTIONS: usize = 64;

/// Requests per HTTP/2 connection the defaults aim for. hyper lets a server stream
/// at most 200 requests at once on one connection by default; staying well below it
/// keeps requests from queueing inside the client where no one would see it.
pub const STREAMS_PER_CONNECTION: usize = 100;

/// Offset of the `k`-th send (counting from 0) from the start of an open loop.
pub fn send_offset(k: u64, rate: f64) -> Duration {
    debug_assert!(rate.is_finite() && rate > 0.0);
    // f64 holds k exactly up to 2^53 requests, far beyond any run.
    Duration::from_secs_f64(k as f64 / rate)
}

/// The instant the `k`-th request is meant to be sent: `start + k / rate`.
pub fn intended_send_time(start: Instant, k: u64, rate: f64) -> Instant {
    start + send_offset(k, rate)
}

/// How many sends of an open loop fall before `offset` from its start: the index of
/// the first send at or after it, `ceil(offset * rate)`.
pub fn sends_before(offset: Duration, rate: f64) -> u64 {
    let exact = offset.as_secs_f64() * rate;
    // Guard against `0.1 * 30 = 3.0000000000000004`-style noise on exact boundaries.
    let rounded = exact.round();
    if (exact - rounded).abs() < 1e-9 {
        rounded as u64
    } else {
        exact.ceil() as u64
    }
}

/// The default connection count of a closed loop: one per
/// [`STREAMS_PER_CONNECTION`] requests in flight, at least 1.
pub fn default_connections_closed(concurrency: usize) -> usize {
    concurrency
        .div_ceil(STREAMS_PER_CONNECTION)
        .clamp(1, MAX_DEFAULT_CONNECTIONS)
}

/// The default connection count of an open loop, where the number in flight is not
/// known in advance: one connection per 200 requests per second, at least 1.
pub fn default_connections_open(rate: f64) -> usize {
    let wanted = (rate / 200.0).ceil();
    if wanted.is_finite() && wanted >= 1.0 {
        (wanted as usize).min(MAX_DEFAULT_CONNECTIONS)
    } else {
        1
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_kth_send_is_k_over_rate_after_the_start() {
        let start = Instant::now();
        assert_eq!(intended_send_time(start, 0, 100.0), start);
        assert_eq!(
            intended_send_time(start, 1, 100.0),
            start + Duration::from_millis(10)
        );
        assert_eq!(
            intended_send_time(start, 250, 100.0),
            start + Duration::from_millis(2500)
        );
        assert_eq!(send_offset(3, 4.0), Duration::from_millis(750));
        // Fractional rates: one request every 2.5 s.
        assert_eq!(send_offset(2, 0.4), Duration::from_secs(5));
    }

    #[test]
    fn the_schedule_does_not_drift() {
        // Each time is computed from the start, never by adding periods, so the
        // millionth send at 3 req/s is still within a nanosecond of exact.
        let offset = send_offset(1_000_000, 3.0);
        let exact = Duration::from_nanos(333_333_333_333_333);
        let error = offset.abs_diff(exact);
        assert!(error <= Duration::from_micros(1), "{error:?}");
    }

    #[test]
    fn sends_before_an_offset() {
        assert_eq!(sends_before(Duration::ZERO, 100.0), 0);
        assert_eq!(sends_before(Duration::from_secs(5), 100.0), 500);
        assert_eq!(sends_before(Duration::from_millis(3), 100.0), 1);
        assert_eq!(sends_before(Duration::from_millis(30), 100.0), 3);
        assert_eq!(sends_before(Duration::from_secs(30), 0.1), 3);
        // Consistent with the schedule: send k is at or after the offset iff k >= n.
        let n = sends_before(Duration::from_millis(1234), 7.0);
        assert!(send_offset(n, 7.0) >= Duration::from_millis(1234));
        assert!(send_offset(n - 1, 7.0) < Duration::from_millis(1234));
    }

    #[test]
    fn default_connections() {
        assert_eq!(default_connections_closed(1), 1);
        assert_eq!(default_connections_closed(100), 1);
        assert_eq!(default_connections_closed(101), 2);
        assert_eq!(default_connections_closed(3000), 30);
        assert_eq!(
            default_connections_closed(1_000_000),
            MAX_DEFAULT_CONNECTIONS
        );
        assert_eq!(default_connections_open(0.5), 1);
        assert_eq!(default_connections_open(1000.0), 5);
        assert_eq!(default_connections_open(1e9), MAX_DEFAULT_CONNECTIONS);
    }
}
