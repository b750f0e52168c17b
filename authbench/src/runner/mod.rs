//! Runs a [`Plan`]: connect, prepare, load, report.
//!
//! 1. **Connect** `connections` HTTP/2 connections up front (with a short timeout, so
//!    an unreachable target fails in seconds with one clear error) and check that the
//!    server reports SERVING. Over HTTP/1.1 (`--protocol http`): wait until
//!    `GET /health` answers 2xx.
//! 2. **Prepare** what the mix needs: a pool of users for logins (registered now) and
//!    tokens for validations (from one login per user). Usernames carry a random run
//!    id, so runs against the same database never collide. Over HTTP/1.1, then open
//!    one keep-alive connection per request in flight (after the setup, so none of
//!    them sits idle long enough for the server to close it).
//! 3. **Load**: a closed loop of `concurrency` workers, each sending its next request
//!    as soon as the previous one is answered; or an open loop (gRPC only) that sends
//!    the k-th request at `start + k / rate` whatever the answers, and measures its
//!    latency from that intended time.
//! 4. **Report**: requests sent during the warm-up are awaited but not recorded; every
//!    request sent after it is recorded exactly once, with its status code or
//!    client-side error.
//!
//! The events scenario has no load: after step 1 it subscribes to the admin port's
//! WatchEvents and counts what the stream brings (`events`).
//!
//! The client must never be the bottleneck (in the suite it has a single core): the
//! channels are built once and shared, requests are plain structs, operations come
//! from a precomputed wheel, and the only per-request synchronization is a handful of
//! relaxed atomics and one uncontended lock on a recorder shard.
//!
//! One job per file:
//! - `plan`: the [`Plan`] (what a run is asked to do) and its check;
//! - `check`: Envoy's Check as the load sends it, prepared once and read lean;
//! - `connect`: the connections, and the wait until the target is SERVING;
//! - `events`: the events scenario, one subscriber of the admin port's
//!   WatchEvents instead of a loop of requests;
//! - `forwarded`: the end users' addresses of `--forwarded-for`, each header value
//!   built once;
//! - `http`: HTTP/1.1 connections, and the wait until `GET /health` answers;
//! - `setup`: the users and tokens the mix needs, prepared first;
//! - `request`: one request sent, classified and recorded;
//! - `loops`: the closed and the open loop (which counts how late it sent), and the
//!   closed loop's clock;
//! - `pacer`: the open loop's sleep until its next send, with microsecond grain;
//! - `status`: a failure told apart (server's status or client's) and described,
//!   and an HTTP status as the gRPC code it stands for.
//!
//! This file runs the steps in order and merges what the loops recorded; it sends
//! no request itself.

mod check;
mod connect;
mod events;
mod forwarded;
mod http;
mod loops;
mod pacer;
mod plan;
mod request;
mod setup;
mod status;

pub use forwarded::{MAX_FORWARDED_FOR, forwarded_address};
pub use plan::{Load, Plan, Stop, TlsOptions, default_connections};

use self::{
    connect::{connect, wait_until_serving},
    loops::{Clock, closed_loop, open_loop},
    request::{Client, GrpcClients, Shared, lock},
    setup::{Via, prepare},
};
use super::{
    progress::{Counters, Goal, Progress},
    protocol::Protocol,
    report::{LoadInfo, Recorder, Report, RunInfo},
    scenario::Scenario,
};
use anyhow::anyhow;
use std::{
    sync::{Arc, Mutex, atomic::Ordering},
    time::{Duration, Instant},
};

/// Runs `plan` to completion and reports what it measured.
///
/// Fails (before sending any load) when the target cannot be reached, is not
/// SERVING, or refuses the setup; once the load runs, every failure is a measurement.
pub async fn run(plan: &Plan) -> anyhow::Result<Report> {
    plan.check().map_err(|e| anyhow!(e))?;
    let mix = plan.scenario.mix(&plan.mix);
    let mut progress = Progress::new(plan.progress);

    progress.phase(format!("connecting to {}", plan.target));
    if plan.scenario == Scenario::Events {
        // No load: the target is checked, then the admin port's stream watched.
        let channels = connect(plan).await?;
        wait_until_serving(plan, &channels[0]).await?;
        let report = events::watch(plan, &mut progress).await?;
        progress.finish();
        return Ok(report);
    }
    // gRPC: the shared connections; HTTP/1.1: a connection per worker, opened after
    // the setup.
    let (grpc, fixtures, http_connections) = match plan.protocol {
        Protocol::Grpc => {
            let channels = connect(plan).await?;
            wait_until_serving(plan, &channels[0]).await?;
            let fixtures = prepare(plan, &mix, Via::Grpc(&channels), &progress).await?;
            let grpc: Vec<GrpcClients> = channels.into_iter().map(GrpcClients::new).collect();
            // The checks over HTTP/1.1: a connection per worker to the forward-auth port.
            let forward_auth = match (plan.check_url(), plan.load) {
                (Some(url), Load::Closed { concurrency }) => {
                    let target = http::Target::resolve_url(plan, url).await?;
                    progress.phase(format!("opening {concurrency} HTTP/1.1 connections"));
                    http::open_connections(&target, concurrency).await?
                }
                _ => Vec::new(),
            };
            (grpc, fixtures, forward_auth)
        }
        // authd's HTTP forms: waited for and set up over gRPC, loaded over HTTP/1.1.
        Protocol::Json | Protocol::GrpcWeb => {
            let Load::Closed { concurrency } = plan.load else {
                unreachable!("Plan::check refuses an open loop over HTTP");
            };
            let channels = connect(plan).await?;
            wait_until_serving(plan, &channels[0]).await?;
            let fixtures = prepare(plan, &mix, Via::Grpc(&channels), &progress).await?;
            let target = http::Target::resolve(plan).await?;
            progress.phase(format!("opening {concurrency} HTTP/1.1 connections"));
            let connections = http::open_connections(&target, concurrency).await?;
            (Vec::new(), fixtures, connections)
        }
        Protocol::Http => {
            let Load::Closed { concurrency } = plan.load else {
                unreachable!("Plan::check refuses an open loop over HTTP");
            };
            let target = http::Target::resolve(plan).await?;
            http::wait_until_healthy(plan, &target).await?;
            let fixtures = prepare(plan, &mix, Via::Http(&target), &progress).await?;
            progress.phase(format!("opening {concurrency} HTTP/1.1 connections"));
            let connections = http::open_connections(&target, concurrency).await?;
            (Vec::new(), fixtures, connections)
        }
    };

    // A few recorder shards per runtime thread: uncontended locks, bounded memory.
    let shards = tokio::runtime::Handle::current()
        .metrics()
        .num_workers()
        .max(1)
        * 2;
    let highest = (plan.timeout * 4).max(Duration::from_secs(60));
    let shared = Arc::new(Shared {
        grpc,
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
        protocol: plan.protocol,
        descriptors: plan.descriptors.clone(),
        keys: plan.keys,
        introspection: plan
            .introspection_client
            .as_deref()
            .filter(|_| plan.introspect.is_some())
            .map(http::basic)
            .transpose()?,
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
    let mut send_late = None;
    match plan.load {
        Load::Closed { concurrency } => {
            let clients: Vec<Client> = match plan.protocol {
                // Worker i shares connection i mod n.
                Protocol::Grpc if plan.check_url().is_some() => {
                    http_connections.into_iter().map(Client::Http).collect()
                }
                Protocol::Grpc => (0..concurrency)
                    .map(|i| Client::Grpc(shared.grpc[i % shared.grpc.len()].clone()))
                    .collect(),
                Protocol::Http | Protocol::Json | Protocol::GrpcWeb => {
                    http_connections.into_iter().map(Client::Http).collect()
                }
            };
            let clock = Arc::new(Clock::new(warm_end, plan.stop, clients.len()));
            closed_loop(&shared, &clock, clients).await?;
        }
        Load::Open { rate } => {
            send_late = Some(open_loop(&shared, start, plan, rate, highest).await?)
        }
    }
    progress.finish();

    let mut recorder = Recorder::new(&mix, highest);
    for shard in &shared.recorders {
        recorder.merge(&lock(shard));
    }
    if let Some(late) = send_late {
        recorder.note_send_lateness(late);
    }
    let info = RunInfo {
        scenario: plan.scenario,
        mix,
        target: plan.target.clone(),
        load: match plan.load {
            Load::Closed { concurrency } => LoadInfo::Closed { concurrency },
            Load::Open { rate } => LoadInfo::Open { rate },
        },
        protocol: plan.protocol,
        connections: match (plan.protocol, plan.load) {
            (protocol, Load::Closed { concurrency }) if protocol.over_http1() => concurrency,
            (_, Load::Closed { concurrency }) if plan.check_url().is_some() => concurrency,
            _ => plan.connections,
        },
        warmup: plan.warmup,
        warmup_requests: shared.counters.warmup.load(Ordering::Relaxed),
        forwarded_for: plan.forwarded_for,
    };
    Ok(Report::new(&info, &recorder))
}
