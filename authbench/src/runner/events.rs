//! The events scenario: one subscriber of `WatchEvents` on the admin port, from
//! the first event written (after position 0), counting the events as they come.
//!
//! Each event is recorded as one successful request of [`Operation::Event`], its
//! latency the wait since the event before it (the first: since the stream was
//! asked for). The report's successful rate is then the events received per second
//! over the span of their arrivals, and its tail the stream's stalls. Events that
//! arrive during the warm-up are counted, not recorded. The run ends after
//! `--requests` events, after `--duration`, when the stream ends (a status that
//! ends it is recorded once), or when no event came for `--timeout`, recorded as a
//! timeout: a backlog shorter than asked for ends the run, it does not hang it.
//!
//! It writes nothing: the events are the ones the server already has, or writes
//! meanwhile.

use super::{
    plan::{Plan, Stop},
    setup::{admin_authorization, admin_channel},
    status::{classify, describe_status},
};
use crate::{
    admin_pb::{
        WatchEventsRequest, admin_service_client::AdminServiceClient, watch_events_request::Start,
    },
    progress::{Counters, Goal, Progress},
    protocol::Protocol,
    report::{LoadInfo, Outcome, Recorder, Report, RunInfo},
    scenario::{Mix, Operation},
};
use anyhow::{anyhow, bail};
use std::{
    sync::{Arc, atomic::Ordering},
    time::{Duration, Instant},
};
use tonic::{Code, Request};

/// Subscribes and counts events until the plan's stop; the report of what came.
pub(super) async fn watch(plan: &Plan, progress: &mut Progress) -> anyhow::Result<Report> {
    let (Some(url), Some(key)) = (&plan.admin, &plan.admin_key) else {
        bail!("the events are watched on the admin port: --admin and AUTHBENCH_ADMIN_KEY");
    };
    progress.phase(format!("subscribing to the account events at {url}"));
    let channel = admin_channel(plan, url).await?;
    let mut request = Request::new(WatchEventsRequest {
        start: Start::AfterPosition as i32,
        after_position: 0,
    });
    (request.metadata_mut()).insert("authorization", admin_authorization(key)?);
    let asked = Instant::now();
    let mut stream = AdminServiceClient::new(channel)
        .watch_events(request)
        .await
        .map_err(|status| anyhow!("WatchEvents at {url}: {}", describe_status(&status)))?
        .into_inner();

    let mix = Mix::only(Operation::Event);
    let highest = (plan.timeout * 4).max(Duration::from_secs(60));
    let mut recorder = Recorder::new(&mix, highest);
    let counters = Arc::new(Counters::default());
    let warm_end = asked + plan.warmup;
    let (end, goal) = match plan.stop {
        Stop::Requests(n) => (None, Goal::Requests(n)),
        Stop::Duration(d) => (Some(warm_end + d), Goal::Duration(d)),
    };
    progress.track(counters.clone(), warm_end, goal);
    let mut last = asked;
    let mut measured = 0u64;
    loop {
        // The wait for the next event: at most --timeout, and never past the end.
        let idle_limit = last + plan.timeout;
        let (until, idle) = match end {
            Some(end) if end < idle_limit => (end, false),
            _ => (idle_limit, true),
        };
        let next = tokio::time::timeout_at(until.into(), stream.message()).await;
        let now = Instant::now();
        let warm = now < warm_end;
        let outcome = match next {
            Ok(Ok(Some(_event))) => Outcome::Status(Code::Ok),
            // The server ended the stream (it is shutting down).
            Ok(Ok(None)) => {
                recorder.note_client_error(|| "the server ended the stream".into());
                break;
            }
            Ok(Err(status)) => {
                let outcome = classify(&status);
                // A status of the warm-up is not recorded: its message tells it.
                if matches!(outcome, Outcome::Connection) || warm {
                    recorder.note_client_error(|| describe_status(&status));
                }
                outcome
            }
            Err(_) if idle => {
                recorder.note_client_error(|| {
                    format!(
                        "no event within {:?} of the one before: the backlog is shorter than \
                         asked",
                        plan.timeout
                    )
                });
                Outcome::Timeout
            }
            Err(_) => break,
        };
        let ok = outcome == Outcome::Status(Code::Ok);
        if warm {
            counters.warmup.fetch_add(1, Ordering::Relaxed);
        } else {
            recorder.record(Operation::Event, outcome, last, now);
            measured += 1;
            counters.done.fetch_add(1, Ordering::Relaxed);
            if !ok {
                counters.failed.fetch_add(1, Ordering::Relaxed);
            }
        }
        last = now;
        // A status or a timeout ends the stream; -n ends the run.
        if !ok || matches!(plan.stop, Stop::Requests(n) if measured >= n) {
            break;
        }
    }

    let info = RunInfo {
        scenario: plan.scenario,
        mix,
        target: url.clone(),
        protocol: Protocol::Grpc,
        load: LoadInfo::Closed { concurrency: 1 },
        connections: 1,
        warmup: plan.warmup,
        warmup_requests: counters.warmup.load(Ordering::Relaxed),
        forwarded_for: None,
    };
    Ok(Report::new(&info, &recorder))
}
