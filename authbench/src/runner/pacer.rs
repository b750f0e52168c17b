//! Sleeping until an open loop's next send is due, on the runtime's own thread.
//!
//! tokio's timer has a millisecond grain: at thousands of sends a second it would
//! send them in bursts, and each burst's wait would show as the server's latency.
//! A thread of its own that sleeps until each send is due and hands it over keeps
//! the grain fine, but costs a wake-up of that thread and one of the runtime for
//! every send: at 15,000 sends a second about a third of the client's core, and
//! near 25,000 the client, not the server, set the latency the report showed.
//!
//! On Linux a `timerfd`, registered with the runtime like a socket, wakes the
//! runtime itself when sends are due, to the microsecond: no second thread, no
//! hand-over, and a runtime that is awake anyway (reading answers) finds the timer
//! ready at its next look at the driver, without a wake-up at all. The timer ticks
//! once per send interval, armed once rather than for every send: arming it for
//! every send took 7 to 8 % of the client's core at 20,000 to 30,000 sends a
//! second (in a virtual machine, arming a timer traps to the host). The interval is
//! rounded up to the nanosecond, so a tick never comes before its send; the timer
//! is re-armed at an exact send time every [`RESYNC`] intervals, so the rounding
//! never adds up to more than a microsecond. Elsewhere the runtime's own timer is
//! used, with its millisecond grain.

#[cfg(target_os = "linux")]
use std::time::Duration;
use std::{io, time::Instant};

/// Intervals between re-arms of the periodic timer at an exact send time: each
/// interval is at most a nanosecond longer than the exact one, so ticks run at most
/// this many nanoseconds late.
#[cfg(target_os = "linux")]
const RESYNC: u32 = 1024;

/// The timer of an open loop of one rate.
pub(super) struct Pacer {
    #[cfg(target_os = "linux")]
    timer: tokio::io::unix::AsyncFd<std::os::fd::OwnedFd>,
    /// The send interval, rounded up to the nanosecond.
    #[cfg(target_os = "linux")]
    period: Duration,
    /// When the timer was last armed to fire first (None: not yet armed).
    #[cfg(target_os = "linux")]
    armed_at: Option<Instant>,
}

/// `1 / rate`, rounded up to the nanosecond, at least one.
#[cfg(target_os = "linux")]
fn period(rate: f64) -> Duration {
    let nanos = (1e9 / rate).ceil();
    if nanos.is_finite() && nanos >= 1.0 {
        // A rate below one send in 584 years saturates: no run lasts that long.
        Duration::from_nanos(nanos.min(u64::MAX as f64) as u64)
    } else {
        Duration::from_nanos(1)
    }
}

#[cfg(target_os = "linux")]
impl Pacer {
    /// A timer for sends `rate` a second, on the monotonic clock (the one `Instant`
    /// reads), registered with the current runtime. Fails outside a runtime, or
    /// when the kernel refuses a timer.
    pub(super) fn new(rate: f64) -> io::Result<Self> {
        use rustix::time::{TimerfdClockId, TimerfdFlags, timerfd_create};
        let fd = timerfd_create(
            TimerfdClockId::Monotonic,
            TimerfdFlags::NONBLOCK | TimerfdFlags::CLOEXEC,
        )?;
        // SAFETY: `register_with_interest` asks that the descriptor stay open, and the
        // same, for as long as the `AsyncFd` holds it. An `OwnedFd` is closed only
        // when dropped, which the `AsyncFd` that owns it does last, and its raw
        // descriptor never changes.
        #[allow(unsafe_code)]
        let timer = unsafe {
            tokio::io::unix::AsyncFd::register_with_interest(fd, tokio::io::Interest::READABLE)
        }
        .map_err(|refused| refused.into_parts().1)?;
        Ok(Self {
            timer,
            period: period(rate),
            armed_at: None,
        })
    }

    /// Returns at `at` or just after it; at once when `at` has passed. `at` is a
    /// send time of the schedule, and never earlier than the last one asked for.
    pub(super) async fn sleep_until(&mut self, at: Instant) -> io::Result<()> {
        let now = Instant::now();
        if at <= now {
            return Ok(());
        }
        let resync = match self.armed_at {
            None => true,
            Some(armed) => (self.period.checked_mul(RESYNC))
                .and_then(|span| armed.checked_add(span))
                .is_some_and(|due| at >= due),
        };
        if resync {
            self.arm(at - now)?;
            self.armed_at = Some(at);
        }
        while Instant::now() < at {
            self.tick().await?;
        }
        Ok(())
    }

    /// Arms the timer to tick after `first` and every period after that.
    fn arm(&mut self, first: Duration) -> io::Result<()> {
        use rustix::time::{Itimerspec, TimerfdTimerFlags, timerfd_settime};
        // Relative: the few nanoseconds since `first` was measured make it that late.
        timerfd_settime(
            self.timer.get_ref(),
            TimerfdTimerFlags::empty(),
            &Itimerspec {
                it_interval: timespec(self.period),
                it_value: timespec(first),
            },
        )?;
        Ok(())
    }

    /// Waits for the timer's next tick, or returns at once when it has ticked since
    /// the last wait.
    async fn tick(&mut self) -> io::Result<()> {
        loop {
            let mut ready = self.timer.readable().await?;
            // Reading the count of ticks resets it; with none yet the read would
            // block, which clears the runtime's readiness and waits again.
            let read = ready.try_io(|timer| {
                let mut ticks = [0u8; 8];
                rustix::io::read(timer.get_ref(), &mut ticks).map_err(io::Error::from)
            });
            match read {
                Ok(result) => {
                    // No tick is left: the next wait starts from not ready (a tick
                    // that came since the read is seen again: tokio clears only
                    // the readiness it reported).
                    ready.clear_ready();
                    return result.map(drop);
                }
                Err(_would_block) => continue,
            }
        }
    }
}

#[cfg(target_os = "linux")]
fn timespec(duration: Duration) -> rustix::time::Timespec {
    rustix::time::Timespec {
        // A wait longer than i64::MAX seconds cannot come from a run's schedule.
        tv_sec: i64::try_from(duration.as_secs()).unwrap_or(i64::MAX),
        tv_nsec: duration.subsec_nanos().into(),
    }
}

#[cfg(not(target_os = "linux"))]
impl Pacer {
    pub(super) fn new(_rate: f64) -> io::Result<Self> {
        Ok(Self {})
    }

    pub(super) async fn sleep_until(&mut self, at: Instant) -> io::Result<()> {
        tokio::time::sleep_until(at.into()).await;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn it_never_returns_before_a_send_time_and_at_once_after_it() {
        let rate = 20_000.0;
        let mut pacer = Pacer::new(rate).unwrap();
        let start = Instant::now() + Duration::from_millis(1);
        // More sends than one resync interval, so the timer is re-armed on the way.
        let sends = u64::from(RESYNC) * 2 + 10;
        for k in 0..sends {
            let at = crate::schedule::intended_send_time(start, k, rate);
            pacer.sleep_until(at).await.unwrap();
            assert!(Instant::now() >= at, "send {k} came early");
        }
        // A time long past: no wait, and the timer still serves later times.
        pacer
            .sleep_until(Instant::now() - Duration::from_secs(1))
            .await
            .unwrap();
        let at = Instant::now() + Duration::from_millis(2);
        pacer.sleep_until(at).await.unwrap();
        assert!(Instant::now() >= at);
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn the_period_is_rounded_up_to_the_nanosecond() {
        assert_eq!(period(1.0), Duration::from_secs(1));
        assert_eq!(period(33_000.0), Duration::from_nanos(30_304));
        assert_eq!(period(3.0), Duration::from_nanos(333_333_334));
        assert_eq!(period(1e12), Duration::from_nanos(1));
        assert_eq!(period(f64::INFINITY), Duration::from_nanos(1));
    }
}
