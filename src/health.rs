//! Readiness: the `grpc.health.v1` status of `""` and `auth.v1.AuthService`.
//!
//! Both are SERVING while the store answers and NOT_SERVING while it does not,
//! checked every `AUTHD_HEALTH_INTERVAL`; a graceful shutdown turns them NOT_SERVING
//! first, so load balancers and Kubernetes stop sending work before the drain.

use crate::store::Store;
use std::{sync::Arc, time::Duration};
use tokio::task::JoinHandle;
use tonic_health::{ServingStatus, server::HealthReporter};

/// The service name reported besides the server-wide `""`.
pub const SERVICE_NAME: &str = "auth.v1.AuthService";

/// Sets the status of both names.
pub async fn report(reporter: &HealthReporter, serving: bool) {
    let status = if serving {
        ServingStatus::Serving
    } else {
        ServingStatus::NotServing
    };
    reporter.set_service_status("", status).await;
    reporter.set_service_status(SERVICE_NAME, status).await;
}

/// Whether the store answers within `timeout`.
pub async fn probe(store: &Store, timeout: Duration) -> Result<(), String> {
    match tokio::time::timeout(timeout, store.ping()).await {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => Err(e.to_string()),
        Err(_) => Err(format!("the database did not answer within {timeout:?}")),
    }
}

/// Probes the store every `interval` and reports changes (logged once each way).
pub fn spawn_checker(
    reporter: HealthReporter,
    store: Arc<Store>,
    interval: Duration,
    mut serving: bool,
) -> JoinHandle<()> {
    tokio::spawn(async move {
        let mut ticker = tokio::time::interval(interval);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        ticker.tick().await; // the first tick is immediate; the caller just probed
        loop {
            ticker.tick().await;
            let result = probe(&store, interval.min(Duration::from_secs(2))).await;
            match (&result, serving) {
                (Ok(()), false) => tracing::info!("the database answers again: SERVING"),
                (Err(why), true) => {
                    tracing::error!(error = %why, "the database does not answer: NOT_SERVING")
                }
                _ => {}
            }
            if result.is_ok() != serving {
                serving = result.is_ok();
                report(&reporter, serving).await;
            }
        }
    })
}
