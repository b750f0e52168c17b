//! The one clock of every rule that depends on the time: tokens (`iat`, `exp`, their
//! checks), sessions and the store's timestamps, the login throttle's delays, the
//! rate limiter's in-process windows, the admin API's budget, the second factor's
//! codes and challenges. The application builds it once (`Config::clock`, the
//! machine's unless a test hands in a [`ManualClock`]) and gives it to every
//! component, so that tests move time by hand instead of sleeping: they compute
//! codes for the time the server reads and move it past a step, a delay, a window
//! or a token's end.
//!
//! It owns nothing but the time: it must not import anything of the crate. Code
//! that only measures how long something took (latency metrics, pacing of the
//! hashing threads, I/O timeouts, the transport's holds) reads `Instant` directly,
//! each such reading saying why.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// Where code whose rules depend on the time reads it.
pub(crate) trait Clock: Send + Sync + 'static {
    /// The monotonic time: for windows kept in this process only.
    fn now(&self) -> Instant;

    /// Milliseconds since the Unix epoch: for counts shared with other replicas
    /// through Redis (which then must run NTP: the delays so kept are seconds to
    /// minutes, far longer than their clocks drift apart).
    fn unix_ms(&self) -> u64;

    /// Milliseconds since the Unix epoch, as the store keeps them.
    fn millis(&self) -> i64 {
        i64::try_from(self.unix_ms()).unwrap_or(i64::MAX)
    }

    /// Whole seconds since the Unix epoch, as tokens carry them.
    fn unix_secs(&self) -> u64 {
        self.unix_ms() / 1000
    }

    /// The wall-clock time.
    fn system_time(&self) -> SystemTime {
        UNIX_EPOCH + Duration::from_millis(self.unix_ms())
    }
}

/// The machine's clocks.
pub(crate) struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Instant {
        Instant::now()
    }

    fn unix_ms(&self) -> u64 {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
    }
}

/// A clock that moves only when told to; both of its readings move together.
#[derive(Debug)]
pub struct ManualClock {
    start: Instant,
    start_ms: u64,
    elapsed: std::sync::Mutex<Duration>,
}

impl Default for ManualClock {
    fn default() -> Self {
        Self::new()
    }
}

impl ManualClock {
    /// Stopped at the machine's time now.
    pub fn new() -> Self {
        ManualClock {
            start: Instant::now(),
            start_ms: SystemClock.unix_ms(),
            elapsed: std::sync::Mutex::new(Duration::ZERO),
        }
    }

    /// Moves both readings `by` forward.
    pub fn advance(&self, by: Duration) {
        *self.elapsed.lock().unwrap_or_else(|e| e.into_inner()) += by;
    }

    /// Milliseconds since the Unix epoch, as the clock reads now.
    pub fn unix_millis(&self) -> u64 {
        Clock::unix_ms(self)
    }

    /// The wall-clock time, as the clock reads now.
    pub fn system_time(&self) -> SystemTime {
        Clock::system_time(self)
    }

    fn elapsed(&self) -> Duration {
        *self.elapsed.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Instant {
        self.start + self.elapsed()
    }

    fn unix_ms(&self) -> u64 {
        let elapsed = u64::try_from(self.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.start_ms.saturating_add(elapsed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_manual_clock_moves_both_readings_only_when_told() {
        let clock = ManualClock::new();
        let (now, ms) = (clock.now(), clock.unix_ms());
        assert_eq!((clock.now(), clock.unix_ms()), (now, ms));
        clock.advance(Duration::from_millis(1500));
        assert_eq!(clock.now() - now, Duration::from_millis(1500));
        assert_eq!(clock.unix_ms() - ms, 1500);
    }
}
