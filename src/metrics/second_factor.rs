//! The second factor's metrics: enrollments and what became of them, codes by
//! outcome, recovery codes used.
//!
//! Labels come from fixed sets named here; nothing a client sends is a label.

use super::Families;
use prometheus::{IntCounter, IntCounterVec};

/// What happened to a user's factor (`authd_second_factor_changes_total{change}`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FactorChange {
    Begun = 0,
    Confirmed = 1,
    Disabled = 2,
    Removed = 3,
}

/// How a code was answered (`authd_second_factor_codes_total{outcome}`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CodeOutcome {
    Accepted = 0,
    /// Not the code of any step in the window, or not a recovery code of the user.
    Wrong = 1,
    /// Right, but its step was accepted before (or the recovery code was used).
    Reused = 2,
    /// Refused by the throttle before it was checked.
    Throttled = 3,
}

/// The second factor's handles.
#[derive(Clone)]
pub(crate) struct SecondFactorMetrics {
    changes: [IntCounter; 4],
    codes: [IntCounter; 4],
    pub recovery_used: IntCounter,
}

impl SecondFactorMetrics {
    pub(super) fn new(f: &Families) -> Self {
        let changes: IntCounterVec = f.counter_vec(
            "authd_second_factor_changes_total",
            "Changes of users' TOTP factors: begun (an enrollment started), confirmed (turned \
             on), disabled (turned off by its user), removed (by an administrator).",
            &["change"],
        );
        let codes: IntCounterVec = f.counter_vec(
            "authd_second_factor_codes_total",
            "Second-factor codes (TOTP and recovery) by outcome: accepted, wrong, reused (a \
             step accepted before, a recovery code used), throttled (refused before checking).",
            &["outcome"],
        );
        Self {
            changes: ["begun", "confirmed", "disabled", "removed"]
                .map(|c| changes.with_label_values(&[c])),
            codes: ["accepted", "wrong", "reused", "throttled"]
                .map(|o| codes.with_label_values(&[o])),
            recovery_used: f.counter(
                "authd_recovery_codes_used_total",
                "Recovery codes used (each works once).",
            ),
        }
    }

    pub fn change(&self, change: FactorChange) {
        self.changes[change as usize].inc();
    }

    pub fn code(&self, outcome: CodeOutcome) {
        self.codes[outcome as usize].inc();
    }
}
