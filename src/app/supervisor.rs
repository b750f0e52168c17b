//! The one owner of every task an application runs: each listener and background
//! task registers here under the [`Stage`] it stops with, and is given that stage's
//! cancellation token. A stage stops by cancelling its token, then waiting (at most
//! [`CLOSE_TIMEOUT`]) for its tasks to end; one that does not end in time is aborted.
//! A task that ends while its stage still runs is a failure: [`Supervisor::failed`]
//! names it, and the application stops with an error.

use futures_util::FutureExt as _;
use std::{future::Future, panic::AssertUnwindSafe, time::Duration};
use tokio::{sync::mpsc, task::AbortHandle};
use tokio_util::{sync::CancellationToken, task::TaskTracker};

/// How long, once its token is cancelled, a stage's tasks may take to end: a
/// listener closes its connections within its own grace, which is as long.
pub(super) const CLOSE_TIMEOUT: Duration = Duration::from_secs(5);

/// When a task stops, in the order of the teardown.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Stage {
    /// The readiness checker: stopped first, so it cannot report SERVING again
    /// during the drain.
    Readiness,
    /// The ports that take requests and what keeps them right (the gRPC, admin and
    /// forward-auth ports, the TLS reload, the session upkeep): stopped after the
    /// drain, before the store closes.
    Serving,
    /// The ports operators and probes use (health, metrics) and the files re-read
    /// while serving: they answer until the very end, the drain included.
    Auxiliary,
}

const STAGES: [Stage; 3] = [Stage::Readiness, Stage::Serving, Stage::Auxiliary];

/// The tasks of one stage: its token, its tracker, and how to abort them.
struct Tasks {
    stop: CancellationToken,
    tracker: TaskTracker,
    aborts: Vec<AbortHandle>,
}

/// Every task of an application, by stage.
pub(super) struct Supervisor {
    stages: [Tasks; 3],
    failures: mpsc::UnboundedSender<String>,
    failed: mpsc::UnboundedReceiver<String>,
}

impl Supervisor {
    pub(super) fn new() -> Self {
        let (failures, failed) = mpsc::unbounded_channel();
        Self {
            stages: STAGES.map(|_| Tasks {
                stop: CancellationToken::new(),
                tracker: TaskTracker::new(),
                aborts: Vec::new(),
            }),
            failures,
            failed,
        }
    }

    fn tasks(&mut self, stage: Stage) -> &mut Tasks {
        &mut self.stages[stage as usize]
    }

    /// Runs `task` on this runtime until it ends; it is given its stage's token and
    /// must end soon after the token is cancelled (a listener closes gracefully).
    pub(super) fn spawn<F>(
        &mut self,
        stage: Stage,
        name: &'static str,
        task: impl FnOnce(CancellationToken) -> F,
    ) where
        F: Future<Output = ()> + Send + 'static,
    {
        let tracked = self.tracked(stage, name, task);
        let handle = tokio::spawn(tracked);
        self.tasks(stage).aborts.push(handle.abort_handle());
    }

    /// Runs `task` until its stage stops: for tasks that have nothing to finish
    /// (a poll loop), dropped where they wait.
    pub(super) fn spawn_until_stopped<F>(&mut self, stage: Stage, name: &'static str, task: F)
    where
        F: Future<Output = ()> + Send + 'static,
    {
        self.spawn(stage, name, |stop| async move {
            stop.run_until_cancelled(task).await;
        });
    }

    /// `task`, given its stage's token, tracked with its stage and reported if it
    /// ends (or panics) before the stage stops, to be run wherever the caller runs
    /// it (the health port runs on a thread of its own).
    pub(super) fn tracked<F>(
        &mut self,
        stage: Stage,
        name: &'static str,
        task: impl FnOnce(CancellationToken) -> F,
    ) -> impl Future<Output = ()> + Send + 'static
    where
        F: Future<Output = ()> + Send + 'static,
    {
        let failures = self.failures.clone();
        let tasks = self.tasks(stage);
        let stop = tasks.stop.clone();
        let task = tasks.tracker.track_future(task(stop.clone()));
        async move {
            let ended = AssertUnwindSafe(task).catch_unwind().await;
            if !stop.is_cancelled() {
                let how = if ended.is_ok() { "stopped" } else { "panicked" };
                let _ = failures.send(format!("the {name} task {how} unexpectedly"));
            }
        }
    }

    /// Resolves with the first task that ended before its stage stopped.
    pub(super) async fn failed(&mut self) -> String {
        match self.failed.recv().await {
            Some(why) => why,
            // Never: the supervisor holds a sender.
            None => std::future::pending().await,
        }
    }

    /// Stops `stage`: cancels its token and waits for its tasks, aborting those
    /// still running after [`CLOSE_TIMEOUT`].
    pub(super) async fn stop(&mut self, stage: Stage) {
        let tasks = self.tasks(stage);
        tasks.stop.cancel();
        tasks.tracker.close();
        if tokio::time::timeout(CLOSE_TIMEOUT, tasks.tracker.wait())
            .await
            .is_err()
        {
            tracing::warn!(
                ?stage,
                open = tasks.tracker.len(),
                "tasks did not stop in time; aborting them"
            );
            tasks.aborts.drain(..).for_each(|task| task.abort());
        }
    }
}

/// An application dropped while it runs (a test that ends without stopping it)
/// stops every task that outlives its runtime: the health port's thread, which
/// holds the metrics and through them the store's pools.
impl Drop for Supervisor {
    fn drop(&mut self) {
        for tasks in &self.stages {
            tasks.stop.cancel();
        }
    }
}
