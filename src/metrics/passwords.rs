//! The password metrics: new passwords the blocklist refused before any hashing,
//! the hashing itself: the hash queue (its depth and waits, the work dropped
//! from it), the pool of hashing threads (hashes, rounds, batches, Argon2 work
//! and the memory it holds), and the rehashes of stored hashes at login.
//!
//! Only the families and their fixed labels live here; what a batch is stays with
//! `password` and `blocklist`, which this file must not import.

use super::{Families, WAIT_BUCKETS};
use prometheus::{Histogram, IntCounter, IntCounterVec, IntGauge};

/// One PBKDF2 hash: 1 ms (a low test cost) to 10 s (600,000 rounds on a slow core
/// is a few hundred milliseconds).
const HASH_BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.5, 5.0,
    10.0,
];

/// The password hashing pool.
#[derive(Clone)]
pub(crate) struct HashMetrics {
    pub queue_depth: IntGauge,
    pub running: IntGauge,
    pub threads: IntGauge,
    pub queue_wait: Histogram,
    pub duration: Histogram,
    pub rounds: IntCounter,
    pub batch_size: Histogram,
    pub dropped_deadline: IntCounter,
    pub dropped_cancelled: IntCounter,
    pub argon2: IntCounter,
    pub memory_in_use: IntGauge,
    pub memory_budget: IntGauge,
}

impl HashMetrics {
    pub(super) fn new(f: &Families) -> Self {
        let dropped = f.counter_vec(
            "authd_hash_dropped_total",
            "Hash jobs dropped unrun: their deadline passed while queued (deadline), or their \
             caller went away (cancelled).",
            &["reason"],
        );
        Self {
            queue_depth: f.gauge(
                "authd_hash_queue_depth",
                "Hash jobs waiting for a hashing thread.",
            ),
            running: f.gauge(
                "authd_hash_running",
                "Hash jobs running on a hashing thread now.",
            ),
            threads: f.gauge(
                "authd_hash_threads",
                "Hashing threads (AUTHD_HASH_THREADS).",
            ),
            queue_wait: f.histogram(
                "authd_hash_queue_wait_seconds",
                "Time a hash job waited in the queue before a thread took it.",
                WAIT_BUCKETS,
            ),
            duration: f.histogram(
                "authd_hash_duration_seconds",
                "Time to compute one PBKDF2 hash or verification on a hashing thread.",
                HASH_BUCKETS,
            ),
            batch_size: f.histogram(
                "authd_hash_batch_size",
                "Derivations a hashing thread ran side by side in one kernel call of the PBKDF2 \
                 engine (at most 1,024 rounds each: a derivation in flight takes part in \
                 several calls; a verification's padding is a derivation of its own).",
                &[1.0, 2.0, 3.0, 4.0, 6.0, 8.0, 12.0, 16.0, 24.0, 32.0],
            ),
            rounds: f.counter(
                "authd_hash_rounds_total",
                "PBKDF2 rounds computed: hashes, verifications, and the padding that makes \
                 every failed login cost as much as the most expensive stored hash.",
            ),
            dropped_deadline: dropped.with_label_values(&["deadline"]),
            dropped_cancelled: dropped.with_label_values(&["cancelled"]),
            argon2: f.counter(
                "authd_hash_argon2_total",
                "Argon2id hashes and verifications computed (new hashes, logins, and the \
                 dummy verification of unknown users under the argon2id policy).",
            ),
            memory_in_use: f.gauge(
                "authd_hash_memory_in_use_bytes",
                "Memory reserved by memory-hard hashing (Argon2) running or queued for a \
                 hashing thread, within AUTHD_ARGON2_MEMORY_BUDGET.",
            ),
            memory_budget: f.gauge(
                "authd_hash_memory_budget_bytes",
                "The memory budget of memory-hard hashing (AUTHD_ARGON2_MEMORY_BUDGET).",
            ),
        }
    }
}

/// New passwords the blocklist refused, by reason.
pub(crate) struct BlocklistMetrics {
    pub refusals: IntCounterVec,
}

impl BlocklistMetrics {
    pub(super) fn new(f: &Families) -> Self {
        Self {
            refusals: f.counter_vec(
                "authd_password_blocklist_refusals_total",
                "New passwords refused before hashing, by reason (common: on the bundled list or \
                 AUTHD_PASSWORD_BLOCKLIST_FILE; username: the username itself).",
                &["reason"],
            ),
        }
    }
}

/// Stored hashes replaced at a successful login, by why and by what came of it.
pub(crate) struct RehashMetrics {
    pub rehashes: IntCounterVec,
}

impl RehashMetrics {
    pub(super) fn new(f: &Families) -> Self {
        Self {
            rehashes: f.counter_vec(
                "authd_password_rehashes_total",
                "Rehashes of a password at a successful login, by reason (foreign_format: a \
                 hash imported from another system; parameters: authd's own hash of other \
                 parameters) and outcome (stored; superseded: the user's hash had changed \
                 meanwhile, another login's rehash or a new password, and nothing was written; \
                 failed: hashing or the write failed, the old hash stays for the next login).",
                &["reason", "outcome"],
            ),
        }
    }
}
