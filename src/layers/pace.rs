//! The pace of the work in flight: how fast the server answers the requests of one
//! kind it admitted, measured, and how long a request admitted now should take.
//!
//! By Little's law the time a request spends in flight is, on average, the requests
//! in flight over the rate they are answered at; a request admitted behind `n`
//! others is answered, served in order, once they and it are: after `(n + 1) /
//! rate`. The rate is measured as answers per busy second (wall time with at least
//! one request in flight), so an idle server does not look slow. Samples are taken
//! over windows of at least [`WINDOW`] and [`WINDOW_ANSWERS`] requests ended, and
//! smoothed, so one slow batch of hashes moves the rate a quarter of the way.
//!
//! Two things keep the rate the server's capacity rather than an accident of its
//! load:
//! - **Only work done counts as an answer.** A request that ended at its deadline
//!   unanswered (or whose client went away) ends the busy time it took, but is no
//!   answer: counting it would make a server that misses deadlines look fast, and
//!   admit more that miss theirs.
//! - **A server with room to spare shows no capacity.** Requests that run side by
//!   side (the hashing threads' lanes) are answered as fast with few in flight as
//!   with many, so a window whose requests in flight averaged fewer than half the
//!   server's parallelism only ever raises the rate, and until a window as loaded as
//!   that has been measured, nothing is predicted (and nothing refused for time).
//!
//! Time is passed in, never read here: the tests drive it.

use std::time::Duration;
use tokio::time::Instant;

/// The shortest window a rate sample is taken over.
pub const WINDOW: Duration = Duration::from_millis(100);
/// The fewest requests ended that a rate sample is taken from (a window lasts until
/// it has them).
pub const WINDOW_ANSWERS: u32 = 16;

/// The measured pace of one kind of request.
#[derive(Debug)]
pub struct Pace {
    /// Requests that run side by side when the server is busy: a window averaging at
    /// least half of it in flight measures the capacity.
    parallelism: u32,
    /// Answers per busy second, once a window has been measured.
    rate: Option<f64>,
    /// Whether a window as loaded as that has been measured: predictions need one.
    loaded: bool,
    window: Window,
}

/// The window being measured.
#[derive(Debug)]
struct Window {
    started: Instant,
    /// Requests answered, and requests that ended unanswered.
    answers: u32,
    unanswered: u32,
    /// Busy time in the window before `busy_since`.
    busy: Duration,
    /// Since when requests have been in flight without a pause, if they are.
    busy_since: Option<Instant>,
    /// The requests in flight integrated over time (request-seconds), and when the
    /// count last changed.
    load: f64,
    last: Instant,
}

impl Pace {
    /// A pace with no measurement yet, for work that runs up to `parallelism`
    /// requests side by side.
    pub fn new(now: Instant, parallelism: u32) -> Self {
        Self {
            parallelism: parallelism.max(1),
            rate: None,
            loaded: false,
            window: Window {
                started: now,
                answers: 0,
                unanswered: 0,
                busy: Duration::ZERO,
                busy_since: None,
                load: 0.0,
                last: now,
            },
        }
    }

    /// The measured answers per busy second, if a window has been measured.
    pub fn rate(&self) -> Option<f64> {
        self.rate
    }

    /// How long a request admitted now behind `ahead` requests in flight should
    /// take, once the capacity has been measured.
    pub fn predicted(&self, ahead: u32) -> Option<Duration> {
        let rate = self.rate.filter(|_| self.loaded)?;
        Some(Duration::try_from_secs_f64((f64::from(ahead) + 1.0) / rate).unwrap_or(Duration::MAX))
    }

    /// Counts `in_flight` requests in flight from the last change until `now`.
    fn integrate(&mut self, now: Instant, in_flight: u32) {
        let w = &mut self.window;
        let span = now.saturating_duration_since(w.last).as_secs_f64();
        w.load += f64::from(in_flight) * span;
        w.last = now;
    }

    /// A request was admitted, `in_flight` of them before it.
    pub fn admitted(&mut self, now: Instant, in_flight: u32) {
        self.integrate(now, in_flight);
        if in_flight == 0 && self.window.busy_since.is_none() {
            self.window.busy_since = Some(now);
        }
    }

    /// An admitted request ended, `in_flight` of them left: `answered` if its work was
    /// done, not if it ended at its deadline or its client went away. Returns whether
    /// a new sample moved the rate.
    pub fn ended(&mut self, now: Instant, in_flight: u32, answered: bool) -> bool {
        self.integrate(now, in_flight + 1);
        let w = &mut self.window;
        if answered {
            w.answers = w.answers.saturating_add(1);
        } else {
            w.unanswered = w.unanswered.saturating_add(1);
        }
        if in_flight == 0
            && let Some(since) = w.busy_since.take()
        {
            w.busy += now.saturating_duration_since(since);
        }
        if now.saturating_duration_since(w.started) < WINDOW
            || w.answers.saturating_add(w.unanswered) < WINDOW_ANSWERS
        {
            return false;
        }
        let mut busy = w.busy;
        if let Some(since) = w.busy_since {
            busy += now.saturating_duration_since(since);
            w.busy_since = Some(now);
        }
        let (answers, load) = (w.answers, w.load);
        w.started = now;
        w.answers = 0;
        w.unanswered = 0;
        w.busy = Duration::ZERO;
        w.load = 0.0;
        if busy.is_zero() {
            return false;
        }
        let busy = busy.as_secs_f64();
        let sample = f64::from(answers) / busy;
        if answers == 0 && self.rate.is_none() {
            // Nothing answered yet, only requests that ended unanswered: no rate.
            return false;
        }
        // The requests in flight, on average while busy: did they fill the server?
        let filled = load / busy >= f64::from(self.parallelism) / 2.0;
        self.rate = Some(match self.rate {
            Some(old) if filled && self.loaded => old + (sample - old) / 4.0,
            Some(old) if !filled => old.max(sample),
            _ => sample,
        });
        self.loaded |= filled;
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
            pace.ended(*at, 0, true);
        }
    }

    #[test]
    fn nothing_is_predicted_before_a_window_is_measured() {
        // tokio's time: the runtime's timers, paused and driven by tests (start_paused).
        let now = Instant::now();
        let mut pace = Pace::new(now, 1);
        assert_eq!(pace.predicted(0), None);
        let mut at = now;
        serial(&mut pace, &mut at, 20, 10 * MS);
        // 100 a second: behind 49 others, half a second.
        assert_eq!(pace.predicted(49), Some(Duration::from_millis(500)));
    }

    #[test]
    fn the_rate_counts_busy_time_only() {
        // tokio's time: the runtime's timers, paused and driven by tests (start_paused).
        let start = Instant::now();
        let mut pace = Pace::new(start, 1);
        let mut at = start;
        // 2 ms each, with 8 ms idle between: 500 a busy second, 100 a wall second.
        for _ in 0..40 {
            pace.admitted(at, 0);
            at += 2 * MS;
            pace.ended(at, 0, true);
            at += 8 * MS;
        }
        let rate = pace.rate().expect("two windows measured");
        assert!((rate - 500.0).abs() < 1.0, "{rate}");
        // 500 a second: behind 24 others, 50 ms.
        assert_eq!(pace.predicted(24), Some(Duration::from_millis(50)));
    }

    #[test]
    fn overlapping_requests_are_answered_at_the_throughput() {
        // tokio's time: the runtime's timers, paused and driven by tests (start_paused).
        let start = Instant::now();
        let mut pace = Pace::new(start, 1);
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
            pace.ended(at, in_flight, true);
            pace.admitted(at, in_flight);
            in_flight += 1;
        }
        let rate = pace.rate().unwrap();
        assert!((rate - 1000.0).abs() < 1.0, "{rate}");
        assert_eq!(pace.predicted(99), Some(Duration::from_millis(100)));
    }

    #[test]
    fn a_window_waits_for_enough_answers_and_samples_are_smoothed() {
        // tokio's time: the runtime's timers, paused and driven by tests (start_paused).
        let start = Instant::now();
        let mut pace = Pace::new(start, 1);
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

    #[test]
    fn requests_that_end_unanswered_are_no_answers() {
        // tokio's time: the runtime's timers, paused and driven by tests (start_paused).
        let start = Instant::now();
        let mut pace = Pace::new(start, 1);
        let mut at = start;
        serial(&mut pace, &mut at, 32, 10 * MS);
        assert!((pace.rate().unwrap() - 100.0).abs() < 1e-6);
        // Then half of them end at their deadlines: 50 answers a busy second.
        for i in 0..32 {
            pace.admitted(at, 0);
            at += 10 * MS;
            pace.ended(at, 0, i % 2 == 0);
        }
        let rate = pace.rate().unwrap();
        assert!(rate < 90.0, "{rate}");
    }

    #[test]
    fn a_server_with_room_to_spare_predicts_nothing_and_its_rate_only_rises() {
        // tokio's time: the runtime's timers, paused and driven by tests (start_paused).
        let start = Instant::now();
        let mut at = start;
        // Up to 64 side by side; one at a time, 100 a second, shows no capacity.
        let mut pace = Pace::new(start, 64);
        serial(&mut pace, &mut at, 40, 10 * MS);
        assert!((pace.rate().unwrap() - 100.0).abs() < 1e-6);
        assert_eq!(pace.predicted(10), None);
        // 40 in flight at once, one answered each millisecond: 1,000 a second, and a
        // window that filled the server: that is its capacity.
        let mut in_flight = 0;
        for _ in 0..40 {
            pace.admitted(at, in_flight);
            in_flight += 1;
        }
        for _ in 0..300 {
            at += MS;
            in_flight -= 1;
            pace.ended(at, in_flight, true);
            pace.admitted(at, in_flight);
            in_flight += 1;
        }
        let capacity = pace.predicted(99).expect("a filled window was measured");
        assert!(
            capacity.abs_diff(Duration::from_millis(100)) < 10 * MS,
            "{capacity:?}"
        );
        // Quiet again, one at a time: it does not lower what was measured.
        for _ in 0..40 {
            at += MS;
            in_flight -= 1;
            pace.ended(at, in_flight, true);
        }
        let measured = pace.rate().unwrap();
        serial(&mut pace, &mut at, 40, 10 * MS);
        assert_eq!(pace.rate(), Some(measured));
    }
}
