//! The `grpc.health.v1` statuses: readiness (`""` and `auth.v1.AuthService`) and
//! liveness (`liveness`).
//!
//! Readiness follows the database. It turns NOT_SERVING at once when a request's
//! store operation fails as unavailable (the store announces each such failure;
//! see `Store::unavailable_events`), or when a probe fails; while NOT_SERVING it
//! probes every [`RECOVERY_INTERVAL`] (at most every `AUTHD_HEALTH_INTERVAL`) and
//! turns SERVING again on the first probe that passes. While SERVING it probes every
//! `AUTHD_HEALTH_INTERVAL`. A probe is a real query run the way requests run theirs
//! (`Accounts::probe_store`), not a bare `SELECT 1`, so a table that requests wait
//! on does not look healthy. A graceful shutdown turns readiness NOT_SERVING first,
//! so load balancers and Kubernetes stop sending work before the drain.
//!
//! Liveness ([`LIVENESS`]) is SERVING from the start until the process stops,
//! whatever the database does: a liveness probe restarts a pod, and a restart cures
//! no database outage. This module reports statuses; it does not own the store.
//!
//! [`check`] is the other side: `authd health`, a client that asks a running authd.

pub mod check;

use crate::accounts::Accounts;
use prometheus::IntGauge;
use std::{future::Future, sync::Arc, time::Duration};
use tokio::time::Instant;
use tonic_health::{ServingStatus, server::HealthReporter};

/// The service name reported besides the server-wide `""`.
pub const SERVICE_NAME: &str = crate::rpc::AUTH_SERVICE;

/// The name liveness probes ask about: SERVING as long as the process serves.
pub const LIVENESS: &str = "liveness";

/// How often a server that is NOT_SERVING probes the database to recover.
pub const RECOVERY_INTERVAL: Duration = Duration::from_millis(250);

/// Longest one probe may take before it counts as failed.
const PROBE_TIMEOUT: Duration = Duration::from_secs(2);

/// Sets the readiness status: `""` and [`SERVICE_NAME`].
pub async fn report(reporter: &HealthReporter, serving: bool, gauge: &IntGauge) {
    // `authd_serving`: what a probe sees, for the alert on a replica not serving.
    gauge.set(i64::from(serving));
    let status = if serving {
        ServingStatus::Serving
    } else {
        ServingStatus::NotServing
    };
    reporter.set_service_status("", status).await;
    reporter.set_service_status(SERVICE_NAME, status).await;
}

/// Sets [`LIVENESS`] SERVING: once, when the server starts.
pub async fn report_alive(reporter: &HealthReporter) {
    reporter
        .set_service_status(LIVENESS, ServingStatus::Serving)
        .await;
}

/// Whether the store answers a real query within [`PROBE_TIMEOUT`].
pub async fn probe(accounts: &Accounts) -> Result<(), String> {
    match tokio::time::timeout(PROBE_TIMEOUT, accounts.probe_store()).await {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => Err(e.to_string()),
        Err(_) => Err(format!(
            "the database did not answer within {}",
            humantime::format_duration(PROBE_TIMEOUT)
        )),
    }
}

/// Drives readiness from the store's failures and from probes (see the module
/// docs); `serving` is the status reported when it starts. Changes are logged once
/// each way. The checker runs until its future is dropped.
pub fn checker(
    reporter: HealthReporter,
    accounts: Arc<Accounts>,
    interval: Duration,
    mut serving: bool,
    gauge: IntGauge,
) -> impl Future<Output = ()> + Send + 'static {
    // Subscribed before the first wait: a failure from now on is seen.
    let mut failures = accounts.store().unavailable_events();
    async move {
        let next_wait = |serving: bool| {
            if serving {
                interval
            } else {
                interval.min(RECOVERY_INTERVAL)
            }
        };
        // tokio's time: when to probe next (scheduling, not a rule).
        let mut next_probe = Instant::now() + next_wait(serving);
        loop {
            tokio::select! {
                () = tokio::time::sleep_until(next_probe) => {}
                changed = failures.changed() => {
                    if changed.is_err() {
                        return; // the store is gone: so is the server
                    }
                    failures.borrow_and_update();
                    if serving {
                        tracing::error!("a request could not reach the database: NOT_SERVING");
                        serving = false;
                        report(&reporter, false, &gauge).await;
                        // tokio's time: when to probe next (scheduling, not a rule).
                        next_probe = Instant::now() + next_wait(serving);
                    }
                    // More failures while NOT_SERVING do not postpone the next probe.
                    continue;
                }
            }
            let result = probe(&accounts).await;
            match (&result, serving) {
                (Ok(()), false) => tracing::info!("the database answers again: SERVING"),
                (Err(why), true) => {
                    tracing::error!(error = %why, "the database does not answer: NOT_SERVING")
                }
                _ => {}
            }
            if result.is_ok() != serving {
                serving = result.is_ok();
                report(&reporter, serving, &gauge).await;
            }
            // tokio's time: when to probe next (scheduling, not a rule).
            next_probe = Instant::now() + next_wait(serving);
        }
    }
}
