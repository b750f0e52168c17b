//! Sleeping until an open loop's next send is due, on the runtime's own thread.
//!
//! tokio's timer has a millisecond grain: at thousands of sends a second it would
//! send them in bursts, and each burst's wait would show as the server's latency.
//! A thread of its own that sleeps until each send is due and hands it over keeps
//! the grain fine, but costs a wake-up of that thread and one of the runtime for
//! every send: at 20,000 sends a second that is most of the client's core, and the
//! client, not the server, sets the latency the report shows.
//!
//! On Linux a `timerfd`, registered with the runtime like a socket, wakes the
//! runtime itself when the next send is due, to the microsecond: no second thread,
//! no hand-over, and a runtime that is awake anyway (reading answers) finds the
//! timer ready at its next look at the driver, without a wake-up at all. Elsewhere
//! the runtime's own timer is used, with its millisecond grain.

use std::{io, time::Instant};

/// A one-shot timer the open loop re-arms for each send.
pub(super) struct Pacer {
    #[cfg(target_os = "linux")]
    timer: tokio::io::unix::AsyncFd<std::os::fd::OwnedFd>,
}

#[cfg(target_os = "linux")]
impl Pacer {
    /// A timer on the monotonic clock (the one `Instant` reads), registered with the
    /// current runtime. Fails outside a runtime, or when the kernel refuses a timer.
    pub(super) fn new() -> io::Result<Self> {
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
        Ok(Self { timer })
    }

    /// Returns at `at` or just after it; at once when `at` has passed.
    pub(super) async fn sleep_until(&mut self, at: Instant) -> io::Result<()> {
        use rustix::time::{Itimerspec, TimerfdTimerFlags, Timespec, timerfd_settime};
        let now = Instant::now();
        if at <= now {
            return Ok(());
        }
        let wait = at - now;
        let value = Timespec {
            // A wait longer than i64::MAX seconds cannot come from a run's schedule.
            tv_sec: i64::try_from(wait.as_secs()).unwrap_or(i64::MAX),
            tv_nsec: wait.subsec_nanos().into(),
        };
        let zero = Timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // A relative time: the few nanoseconds since `now` make it at most that late.
        timerfd_settime(
            self.timer.get_ref(),
            TimerfdTimerFlags::empty(),
            &Itimerspec {
                it_interval: zero,
                it_value: value,
            },
        )?;
        loop {
            let mut ready = self.timer.readable().await?;
            // Reading the expiry count re-arms readiness; before expiry the read
            // would block, which clears the runtime's readiness and waits again.
            let read = ready.try_io(|timer| {
                let mut expirations = [0u8; 8];
                rustix::io::read(timer.get_ref(), &mut expirations).map_err(io::Error::from)
            });
            match read {
                Ok(result) => {
                    // The one expiry is consumed: the timer cannot be ready again
                    // until it is re-armed, so the next wait starts from not ready.
                    ready.clear_ready();
                    return result.map(drop);
                }
                Err(_would_block) => continue,
            }
        }
    }
}

#[cfg(not(target_os = "linux"))]
impl Pacer {
    pub(super) fn new() -> io::Result<Self> {
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
    async fn it_never_returns_before_the_time_and_returns_at_once_after_it() {
        let mut pacer = Pacer::new().unwrap();
        for wait in [1u64, 50, 400, 2_000, 0] {
            let at = Instant::now() + Duration::from_micros(wait);
            pacer.sleep_until(at).await.unwrap();
            assert!(Instant::now() >= at, "woke before a {wait} µs wait ended");
        }
        // A time long past: no wait, and the timer is still usable after it.
        pacer
            .sleep_until(Instant::now() - Duration::from_secs(1))
            .await
            .unwrap();
        let at = Instant::now() + Duration::from_micros(100);
        pacer.sleep_until(at).await.unwrap();
        assert!(Instant::now() >= at);
    }
}
