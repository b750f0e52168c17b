//! The request lines of refusals, within a budget a second.
//!
//! The trace layer logs every request once. A crowd that asks again the moment it is
//! refused (a closed-loop load tool, a naive retry loop, a flood from many
//! addresses) would turn that into thousands of lines a second, each a sizeable part
//! of what refusing the request cost, filling the log for whoever sent the crowd. So the answers with RESOURCE_EXHAUSTED (a request refused
//! for load, by a rate limit or by the login throttle) are logged one by one up to
//! `AUTHD_LOG_REFUSALS` a second; past that, they are counted, and one line at the
//! end of the second (`refusals not logged one by one`) says how many were left out,
//! by method. Every other answer is logged as before, and the metrics count every
//! request whatever the log says.
//!
//! The budget runs in windows of a second from the first refusal after a quiet one,
//! and the summary of a window is logged by the first refusal after it ends, or by
//! [`RefusalLog::run`] (every second, and when the server stops), whichever comes
//! first, so the last second of a storm is not left unreported.
//!
//! State: one count a method (a fixed table), behind one lock.

use crate::rpc::Rpc;
use std::{fmt::Write as _, sync::Mutex, time::Duration};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// The length of one window of the budget.
const WINDOW: Duration = Duration::from_secs(1);

/// The refusal lines' budget, shared by every port's trace layer.
pub struct RefusalLog {
    per_second: u32,
    window: Mutex<Window>,
}

struct Window {
    /// When the current window ends; `None` before the first refusal.
    ends: Option<Instant>,
    /// Refusals logged one by one in the current window.
    logged: u32,
    /// Refusals of the current window left out, by [`Rpc::index`].
    unlogged: [u64; Rpc::ALL.len()],
}

impl RefusalLog {
    /// A budget of `per_second` refusal lines a second; zero logs none one by one,
    /// only the summaries.
    pub fn new(per_second: u32) -> Self {
        Self {
            per_second,
            window: Mutex::new(Window {
                ends: None,
                logged: 0,
                unlogged: [0; Rpc::ALL.len()],
            }),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Window> {
        self.window.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether a refusal of `rpc` answered at `now` is logged one by one. If not, it
    /// is counted in the summary of its window.
    pub fn admits(&self, rpc: Rpc, now: Instant) -> bool {
        let mut window = self.lock();
        if window.ends.is_none_or(|ends| now >= ends) {
            window.summarise();
            window.ends = Some(now + WINDOW);
            window.logged = 0;
        }
        if window.logged < self.per_second {
            window.logged += 1;
            return true;
        }
        window.unlogged[rpc.index()] += 1;
        false
    }

    /// Logs the summary of the window if it has ended by `now` (or, with `now` as
    /// `None`, at once: the server stops).
    fn flush(&self, now: Option<Instant>) {
        let mut window = self.lock();
        if now.is_none() || window.ends.is_some_and(|ends| Some(ends) <= now) {
            window.summarise();
        }
    }

    /// Logs each ended window's summary within a second of its end, and the last one
    /// when `stop` is cancelled.
    pub async fn run(self: std::sync::Arc<Self>, stop: CancellationToken) {
        let mut every = tokio::time::interval(WINDOW);
        every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = every.tick() => self.flush(Some(Instant::now())),
                () = stop.cancelled() => break,
            }
        }
        self.flush(None);
    }
}

impl Window {
    /// Logs how many refusals were left out, by method, and starts the count anew.
    fn summarise(&mut self) {
        let unlogged: u64 = self.unlogged.iter().sum();
        if unlogged == 0 {
            return;
        }
        let mut methods = String::new();
        for rpc in Rpc::ALL {
            let n = std::mem::take(&mut self.unlogged[rpc.index()]);
            if n > 0 {
                let comma = if methods.is_empty() { "" } else { ", " };
                let _ = write!(methods, "{comma}{} {n}", rpc.method());
            }
        }
        tracing::info!(
            target: "authd::trace",
            unlogged,
            methods = methods.as_str(),
            code = "RESOURCE_EXHAUSTED",
            "refusals not logged one by one"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Summaries logged, as (unlogged, methods).
    fn summaries(text: &str) -> Vec<(u64, String)> {
        text.lines()
            .filter(|l| l.contains("refusals not logged one by one"))
            .map(|l| {
                let n = l.split("unlogged=").nth(1).unwrap();
                let n = n.split_whitespace().next().unwrap().parse().unwrap();
                let methods = l.split("methods=\"").nth(1).unwrap();
                (n, methods.split('"').next().unwrap().to_owned())
            })
            .collect()
    }

    #[tokio::test(start_paused = true)]
    async fn refusals_past_the_budget_are_counted_and_summarised_once_a_window() {
        let (captured, _guard) = crate::layers::trace::tests::capture_logs();
        let log = RefusalLog::new(3);
        let start = Instant::now();
        // The first window: three logged, then five left out.
        let first: Vec<bool> = (0..8)
            .map(|i| {
                let rpc = if i % 2 == 0 {
                    Rpc::Login
                } else {
                    Rpc::Register
                };
                log.admits(rpc, start + Duration::from_millis(i * 10))
            })
            .collect();
        assert_eq!(first, [true, true, true, false, false, false, false, false]);
        assert!(summaries(&captured.text()).is_empty());
        // Still within the window: left out.
        assert!(!log.admits(Rpc::Login, start + Duration::from_millis(999)));
        // The next window logs the last one's summary and has a budget of its own.
        assert!(log.admits(Rpc::Login, start + WINDOW));
        assert_eq!(
            summaries(&captured.text()),
            [(6, "Register 3, Login 3".to_owned())]
        );
        // A flush before the window ends logs nothing; after it, what was left out.
        let later = start + WINDOW;
        assert!(log.admits(Rpc::Login, later) && log.admits(Rpc::Login, later));
        assert!(!log.admits(Rpc::Refresh, later));
        log.flush(Some(later + Duration::from_millis(500)));
        assert_eq!(summaries(&captured.text()).len(), 1);
        log.flush(Some(later + WINDOW));
        assert_eq!(summaries(&captured.text())[1], (1, "Refresh 1".to_owned()));
        // Nothing left out since: no empty summary.
        log.flush(Some(later + WINDOW * 3));
        log.flush(None);
        assert_eq!(summaries(&captured.text()).len(), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn a_zero_budget_logs_only_summaries_and_the_last_one_when_the_server_stops() {
        let (captured, _guard) = crate::layers::trace::tests::capture_logs();
        let log = std::sync::Arc::new(RefusalLog::new(0));
        let now = Instant::now();
        for _ in 0..4 {
            assert!(!log.admits(Rpc::Login, now));
        }
        let stop = CancellationToken::new();
        stop.cancel();
        log.clone().run(stop).await;
        assert_eq!(summaries(&captured.text()), [(4, "Login 4".to_owned())]);
    }
}
