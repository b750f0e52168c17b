//! Runs a [`Plan`]: connect, prepare, load, report.
//!
//! 1. **Connect** `connections` HTTP/2 connections up front (with a short timeout, so
//!    an unreachable target fails in seconds with one clear error) and check that the
//!    server reports SERVING.
//! 2. **Prepare** what the mix needs: a pool of users for logins (registered now) and
//!    tokens for validations (from one login per user). Usernames carry a random run
//!    id, so runs against the same database never collide.
//! 3. **Load**: a closed loop of `concurrency` workers, each sending its next request
//!    as soon as the previous one is answered; or an open loop that sends the k-th
//!    request at `start + k / rate` whatever the answers, and measures its latency from
//!    that intended time.
//! 4. **Report**: requests sent during the warm-up are awaited but not recorded; every
//!    request sent after it is recorded exactly once, with its status code or
//!    client-side error.
//!
//! The client must never be the bottleneck (in the suite it has a single core): the
//! channels are built once and shared, requests are plain structs, operations come
//! from a precomputed wheel, and the only per-request synchronization is a handful of
//! relaxed atomics and one uncontended lock on a recorder shard.
//!
//! One job per file:
//! - `plan`: the [`Plan`] (what a run is asked to do) and its check;
//! - `connect`: the connections, and the wait until the target is SERVING;
//! - `setup`: the users and tokens the mix needs, prepared first;
//! - `request`: one request sent, classified and recorded;
//! - `loops`: the closed and the open loop, and the closed loop's clock;
//! - `status`: a failure told apart (server's status or client's) and described.
//!
//! This file runs the steps in order and merges what the loops recorded; it sends
//! no request itself.

mod connect;
mod loops;
mod plan;
mod request;
mod setup;
mod status;

pub use plan::{Load, Plan, Stop, TlsOptions, default_connections};

use self::{
    connect::{connect, wait_until_serving},
    loops::{Clock, closed_loop, open_loop},
    request::{Shared, lock},
    setup::prepare,
};
use super::{
    progress::{Counters, Goal, Progress},
    report::{LoadInfo, Recorder, Report, RunInfo},
};
use crate::pb::auth_service_client::AuthServiceClient;
use anyhow::anyhow;
use std::{
    sync::{Arc, Mutex, atomic::Ordering},
    time::{Duration, Instant},
};
use tonic_health::pb::health_client::HealthClient;

/// Runs `plan` to completion and reports what it measured.
///
/// Fails (before sending any load) when the target cannot be reached, is not
/// SERVING, or refuses the setup; once the load runs, every failure is a measurement.
pub async fn run(plan: &Plan) -> anyhow::Result<Report> {
    plan.check().map_err(|e| anyhow!(e))?;
    let mix = plan.scenario.mix(&plan.mix);
    let mut progress = Progress::new(plan.progress);

    progress.phase(format!("connecting to {}", plan.target));
    let channels = connect(plan).await?;
    wait_until_serving(plan, &channels[0]).await?;
    let fixtures = prepare(plan, &mix, &channels, &progress).await?;

    // A few recorder shards per runtime thread: uncontended locks, bounded memory.
    let shards = tokio::runtime::Handle::current()
        .metrics()
        .num_workers()
        .max(1)
        * 2;
    let highest = (plan.timeout * 4).max(Duration::from_secs(60));
    let shared = Arc::new(Shared {
        auth: channels
            .iter()
            .cloned()
            .map(AuthServiceClient::new)
            .collect(),
        health: channels.iter().cloned().map(HealthClient::new).collect(),
        wheel: mix.wheel(),
        fixtures,
        timeout: plan.timeout,
        // The server answers DEADLINE_EXCEEDED at the deadline; the client only gives
        // up on its own when no answer comes even a little after it.
        give_up: plan.timeout + plan.timeout / 10 + Duration::from_millis(100),
        recorders: (0..shards)
            .map(|_| Mutex::new(Recorder::new(&mix, highest)))
            .collect(),
        counters: Arc::new(Counters::default()),
        backoff: plan.backoff,
    });

    let start = Instant::now();
    let warm_end = start + plan.warmup;
    progress.track(
        shared.counters.clone(),
        warm_end,
        match plan.stop {
            Stop::Requests(n) => Goal::Requests(n),
            Stop::Duration(d) => Goal::Duration(d),
        },
    );
    match plan.load {
        Load::Closed { concurrency } => {
            let clock = Arc::new(Clock::new(warm_end, plan.stop));
            closed_loop(&shared, &clock, concurrency).await?;
        }
        Load::Open { rate } => open_loop(&shared, start, plan, rate).await?,
    }
    progress.finish();

    let mut recorder = Recorder::new(&mix, highest);
    for shard in &shared.recorders {
        recorder.merge(&lock(shard));
    }
    let info = RunInfo {
        scenario: plan.scenario,
        mix,
        target: plan.target.clone(),
        load: match plan.load {
            Load::Closed { concurrency } => LoadInfo::Closed { concurrency },
            Load::Open { rate } => LoadInfo::Open { rate },
        },
        connections: plan.connections,
        warmup: plan.warmup,
        warmup_requests: shared.counters.warmup.load(Ordering::Relaxed),
    };
    Ok(Report::new(&info, &recorder))
}
