//! The live progress bar on stderr, drawn only when stderr is a terminal.
//!
//! It reads the runner's atomic counters a few times a second from a task of its
//! own, so the request path never touches the terminal or a lock for it. Anywhere
//! else (a pipe, a file, CI, the tests) it is hidden and costs nothing, leaving
//! stdout and stderr clean for the report and for errors.

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use std::{
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};
use tokio::task::JoinHandle;

/// Counters the workers bump and the bar reads.
#[derive(Debug, Default)]
pub(crate) struct Counters {
    /// Measured requests answered (or given up on).
    pub done: AtomicU64,
    /// Measured requests that did not end OK.
    pub failed: AtomicU64,
    /// Warm-up requests answered.
    pub warmup: AtomicU64,
}

/// What the run is bounded by, for the bar's length.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Goal {
    Requests(u64),
    Duration(Duration),
}

pub(crate) struct Progress {
    bar: Option<ProgressBar>,
    ticker: Option<JoinHandle<()>>,
}

impl Progress {
    /// A bar on stderr when `enabled`, else nothing at all.
    pub fn new(enabled: bool) -> Self {
        let bar = enabled.then(|| {
            let bar = ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr());
            bar.set_style(
                ProgressStyle::with_template("{spinner} {msg}").expect("a valid template"),
            );
            bar.enable_steady_tick(Duration::from_millis(120));
            bar
        });
        Self { bar, ticker: None }
    }

    /// Shows what the runner is doing before the measured run (connecting, setup).
    pub fn phase(&self, message: impl Into<String>) {
        if let Some(bar) = &self.bar {
            bar.set_message(message.into());
        }
    }

    /// Turns the spinner into a bar that follows `counters` until [`Progress::finish`].
    pub fn track(&mut self, counters: Arc<Counters>, warm_end: Instant, goal: Goal) {
        let Some(bar) = self.bar.clone() else { return };
        bar.disable_steady_tick();
        let (length, template) = match goal {
            Goal::Requests(n) => (n, "[{wide_bar}] {pos}/{len} {msg}"),
            Goal::Duration(d) => (
                u64::try_from(d.as_millis()).unwrap_or(u64::MAX).max(1),
                "[{wide_bar}] {msg}",
            ),
        };
        bar.set_length(length);
        bar.set_position(0);
        bar.set_style(
            ProgressStyle::with_template(template)
                .expect("a valid template")
                .progress_chars("=> "),
        );
        self.ticker = Some(tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_millis(200));
            let mut last = (Instant::now(), 0u64);
            loop {
                tick.tick().await;
                let now = Instant::now();
                let done = counters.done.load(Ordering::Relaxed);
                let failed = counters.failed.load(Ordering::Relaxed);
                if now < warm_end {
                    let left = warm_end - now;
                    bar.set_message(format!(
                        "warming up: {} requests, {:.1} s left",
                        counters.warmup.load(Ordering::Relaxed),
                        left.as_secs_f64()
                    ));
                    continue;
                }
                let seconds = now.duration_since(last.0).as_secs_f64();
                let rate = if seconds > 0.0 {
                    done.saturating_sub(last.1) as f64 / seconds
                } else {
                    0.0
                };
                last = (now, done);
                let elapsed = now.duration_since(warm_end);
                match goal {
                    Goal::Requests(_) => {
                        bar.set_position(done);
                        bar.set_message(format!("{rate:.0} req/s, {failed} not OK"));
                    }
                    Goal::Duration(d) => {
                        bar.set_position(u64::try_from(elapsed.as_millis()).unwrap_or(u64::MAX));
                        bar.set_message(format!(
                            "{:.1}/{:.0} s, {done} requests, {rate:.0} req/s, {failed} not OK",
                            elapsed.as_secs_f64().min(d.as_secs_f64()),
                            d.as_secs_f64()
                        ));
                    }
                }
            }
        }));
    }

    /// Removes the bar, leaving the terminal as it was (dropping does the same).
    pub fn finish(self) {}
}

impl Drop for Progress {
    fn drop(&mut self) {
        // On an error path the bar must not linger over the error line.
        if let Some(ticker) = self.ticker.take() {
            ticker.abort();
        }
        if let Some(bar) = self.bar.take() {
            bar.finish_and_clear();
        }
    }
}
