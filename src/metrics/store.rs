//! The store metrics: the time and failures of each operation, the connection
//! pools (read at scrape time) and the SQLite writer's group commits.
//!
//! The store resolves its `backend` and `operation` labels itself when it is
//! built; this file only registers the families and must not import the store.

use super::{Families, WAIT_BUCKETS};
use prometheus::{Histogram, HistogramVec, IntCounterVec, IntGaugeVec};

/// Writes in one SQLite transaction: 1 to `AUTHD_SQLITE_MAX_BATCH` (at most 10,000).
const BATCH_BUCKETS: &[f64] = &[
    1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 4096.0, 10000.0,
];

/// The store; components resolve their `backend` and `operation` labels when built.
pub(crate) struct StoreMetrics {
    pub operation_duration: HistogramVec,
    pub operation_errors: IntCounterVec,
    pub pool_acquire: HistogramVec,
    pub pool_connections: IntGaugeVec,
    pub pool_max: IntGaugeVec,
    pub sqlite_batch_size: Histogram,
    pub sqlite_commit: Histogram,
}

impl StoreMetrics {
    pub(super) fn new(f: &Families) -> Self {
        Self {
            operation_duration: f.histogram_vec(
                "authd_store_operation_duration_seconds",
                "Time of one store operation, waiting for a connection or the SQLite writer \
                 included, by backend and operation.",
                WAIT_BUCKETS,
                &["backend", "operation"],
            ),
            operation_errors: f.counter_vec(
                "authd_store_errors_total",
                "Store operations that failed, by backend, operation and kind (unavailable: the \
                 database could not be reached; other: unexpected).",
                &["backend", "operation", "kind"],
            ),
            pool_acquire: f.histogram_vec(
                "authd_store_pool_acquire_duration_seconds",
                "Time waiting for a connection from the pool (PostgreSQL; SQLite readers), by \
                 backend.",
                WAIT_BUCKETS,
                &["backend"],
            ),
            pool_connections: f.gauge_vec(
                "authd_store_pool_connections",
                "Connections of the pool by state (in_use, idle), read at scrape time.",
                &["backend", "state"],
            ),
            pool_max: f.gauge_vec(
                "authd_store_pool_max_connections",
                "Most connections the pool opens (AUTHD_DB_MAX_CONNECTIONS).",
                &["backend"],
            ),
            sqlite_batch_size: f.histogram(
                "authd_sqlite_batch_size",
                "Writes committed by the SQLite writer in one transaction (group commit).",
                BATCH_BUCKETS,
            ),
            sqlite_commit: f.histogram(
                "authd_sqlite_commit_duration_seconds",
                "Time of one SQLite write transaction, BEGIN to the end of COMMIT's fsync.",
                WAIT_BUCKETS,
            ),
        }
    }
}
