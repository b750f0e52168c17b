//! The pace of the work in flight: how fast the server answers the requests of one
//! kind it admitted, measured, and how long a request admitted now should take.
//!
//! By Little's law the time a request spends in flight is, on average, the requests
//! in flight over the rate they are answered at; a request admitted behind `n`
//! others is answered, served in order, once they and it are: after `(n + 1) /
//! rate`. The rate is measured as answers per busy second (wall time with at least
//! one request in flight), so an idle server does not look slow and a server
//! answering one request at a time does not look fast: under load it is the
//! throughput. Samples are taken over windows of at least [`WINDOW`] and
//! [`WINDOW_ANSWERS`] answers and smoothed, so one slow batch of hashes moves the
//! rate a quarter of the way.
//!
//! Time is passed in, never read here: the tests drive it.

use std::time::Duration;
use tokio::time::Instant;

/// The shortest window a rate sample is taken over.
pub const WINDOW: Duration = Duration::from_millis(100);
/// The fewest answers a rate sample is taken from (a window lasts until it has them).
pub const WINDOW_ANSWERS: u32 = 16;

/// The measured pace of one kind of request.
#[derive(Debug)]
pub struct Pace {
    /// Answers per busy second, once a window has been measured.
    rate: Option<f64>,
    window: Window,
}

/// The window being measured.
#[derive(Debug)]
struct Window {
    started: Instant,
    answers: u32,
    /// Busy time in the window before `busy_since`.
    busy: Duration,
    /// Since when requests have been in flight without a pause, if they are.
    busy_since: Option<Instant>,
}

impl Pace {
    /// A pace with no measurement yet.
    pub fn new(now: Instant) -> Self {
        Self {
            rate: None,
            window: Window {
                started: now,
                answers: 0,
                busy: Duration::ZERO,
                busy_since: None,
            },
        }
    }

    /// The measured answers per busy second, if a window has been measured.
    pub fn rate(&self) -> Option<f64> {
        self.rate
    }

    /// How long a request admitted now behind `ahead` requests in flight should
    /// take, once a rate has been measured.
    pub fn predicted(&self, ahead: u32) -> Option<Duration> {
        let rate = self.rate?;
        Some(Duration::try_from_secs_f64((f64::from(ahead) + 1.0) / rate).unwrap_or(Duration::MAX))
    }

    /// A request was admitted, `in_flight` of them before it.
    pub fn admitted(&mut self, now: Instant, in_flight: u32) {
        if in_flight == 0 && self.window.busy_since.is_none() {
            self.window.busy_since = Some(now);
        }
    }

    /// An admitted request was answered (or given up), `in_flight` of them left.
    /// Returns whether a new sample moved the rate.
    pub fn answered(&mut self, now: Instant, in_flight: u32) -> bool {
        let w = &mut self.window;
        w.answers = w.answers.saturating_add(1);
        if in_flight == 0
            && let Some(since) = w.busy_since.take()
        {
            w.busy += now.saturating_duration_since(since);
        }
        if now.saturating_duration_since(w.started) < WINDOW || w.answers < WINDOW_ANSWERS {
            return false;
        }
        let mut busy = w.busy;
        if let Some(since) = w.busy_since {
            busy += now.saturating_duration_since(since);
            w.busy_since = Some(now);
        }
        let answers = w.answers;
        w.started = now;
        w.answers = 0;
        w.busy = Duration::ZERO;
        if busy.is_zero() {
            return false;
        }
        let sample = f64::from(answers) / busy.as_secs_f64();
        self.rate = Some(match self.rate {
            Some(old) => old + (sample - old) / 4.0,
            None => sample,
        });
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    /// `n` requests answered one after another, each taking `each`, from `at`.
    fn serial(pace: &mut Pace, at: &mut Instant, n: u32, each: Duration) {
        for _ in 0..n {
            pace.admitted(*at, 0);
            *at += each;
            pace.answered(*at, 0);
        }
    }

    #[test]
    fn nothing_is_predicted_before_a_window_is_measured() {
        let now = Instant::now();
        let mut pace = Pace::new(now);
        assert_eq!(pace.predicted(0), None);
        let mut at = now;
        serial(&mut pace, &mut at, 20, 10 * MS);
        // 100 a second: behind 49 others, half a second.
        assert_eq!(pace.predicted(49), Some(Duration::from_millis(500)));
    }

    #[test]
    fn the_rate_counts_busy_time_only() {
        let start = Instant::now();
        let mut pace = Pace::new(start);
        let mut at = start;
        // 2 ms each, with 8 ms idle between: 500 a busy second, 100 a wall second.
        for _ in 0..40 {
            pace.admitted(at, 0);
            at += 2 * MS;
            pace.answered(at, 0);
            at += 8 * MS;
        }
        let rate = pace.rate().expect("two windows measured");
        assert!((rate - 500.0).abs() < 1.0, "{rate}");
        // 500 a second: behind 24 others, 50 ms.
        assert_eq!(pace.predicted(24), Some(Duration::from_millis(50)));
    }

    #[test]
    fn overlapping_requests_are_answered_at_the_throughput() {
        let start = Instant::now();
        let mut pace = Pace::new(start);
        // Always 10 in flight, one answered every millisecond: 1000 a second.
        let mut in_flight = 0;
        let mut at = start;
        for _ in 0..10 {
            pace.admitted(at, in_flight);
            in_flight += 1;
        }
        for _ in 0..1000 {
            at += MS;
            in_flight -= 1;
            pace.answered(at, in_flight);
            pace.admitted(at, in_flight);
            in_flight += 1;
        }
        let rate = pace.rate().unwrap();
        assert!((rate - 1000.0).abs() < 1.0, "{rate}");
        assert_eq!(pace.predicted(99), Some(Duration::from_millis(100)));
    }

    #[test]
    fn a_window_waits_for_enough_answers_and_samples_are_smoothed() {
        let start = Instant::now();
        let mut pace = Pace::new(start);
        let mut at = start;
        // Slow answers: 15 in 150 ms is not enough for a sample...
        serial(&mut pace, &mut at, 15, 10 * MS);
        assert_eq!(pace.rate(), None);
        // ...the 16th is: 100 a second.
        serial(&mut pace, &mut at, 1, 10 * MS);
        assert!((pace.rate().unwrap() - 100.0).abs() < 1e-6);
        // Then a window at 1000 a second moves it a quarter of the way.
        serial(&mut pace, &mut at, 100, MS);
        assert!((pace.rate().unwrap() - 325.0).abs() < 1e-6);
    }
}
