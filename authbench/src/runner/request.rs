//! One request of the load: built from the fixtures, sent with its deadline,
//! its outcome classified, and recorded in a shard of the recorder ([`Shared`]).
//!
//! It decides nothing about when a request goes out, or whether it is warm-up or
//! measured: that is the loops' (`loops`).

use super::{
    setup::{Fixtures, PASSWORD},
    status::{classify, describe_status},
};
use crate::{
    pb::{
        LoginRequest, RefreshRequest, RegisterRequest, ValidateTokenRequest,
        auth_service_client::AuthServiceClient,
    },
    progress::Counters,
    report::{Outcome, Recorder},
    scenario::Operation,
};
use std::{
    sync::{Arc, Mutex, atomic::Ordering},
    time::{Duration, Instant},
};
use tonic::{Code, Request, Status, transport::Channel};
use tonic_health::pb::{HealthCheckRequest, health_client::HealthClient};
use tonic_types::StatusExt as _;

/// What one request came to.
pub(super) struct Performed {
    /// The outcome, and the status behind a client-side error.
    pub(super) result: (Outcome, Option<Status>),
    /// The server's RetryInfo delay, when it refused for being full.
    pub(super) retry_after: Option<Duration>,
}

/// The state every request of a run shares.
pub(super) struct Shared {
    /// One client per connection; cloning one is cheap and shares its connection.
    pub(super) auth: Vec<AuthServiceClient<Channel>>,
    pub(super) health: Vec<HealthClient<Channel>>,
    pub(super) wheel: Vec<Operation>,
    pub(super) fixtures: Fixtures,
    pub(super) timeout: Duration,
    pub(super) give_up: Duration,
    pub(super) recorders: Vec<Mutex<Recorder>>,
    pub(super) counters: Arc<Counters>,
    pub(super) backoff: bool,
}

impl Shared {
    /// Sends one request of `op` (using `pick` to choose a user or token) and waits
    /// for its outcome. Returns the client-side error, if any, for the report.
    pub(super) async fn perform(
        &self,
        op: Operation,
        pick: usize,
        auth: &mut AuthServiceClient<Channel>,
        health: &mut HealthClient<Channel>,
    ) -> Performed {
        let fixtures = &self.fixtures;
        let timeout = self.timeout;
        let call = async {
            match op {
                Operation::Health => {
                    let request = deadline(
                        HealthCheckRequest {
                            service: String::new(),
                        },
                        timeout,
                    );
                    health.check(request).await.map(drop)
                }
                Operation::Register => {
                    let request = deadline(
                        RegisterRequest {
                            username: fixtures.new_username(),
                            password: PASSWORD.into(),
                        },
                        timeout,
                    );
                    auth.register(request).await.map(drop)
                }
                Operation::Login => {
                    let username = fixtures.users[pick % fixtures.users.len()].clone();
                    let request = deadline(
                        LoginRequest {
                            username,
                            password: PASSWORD.into(),
                        },
                        timeout,
                    );
                    auth.login(request).await.map(drop)
                }
                Operation::Validate => {
                    let access_token = fixtures.tokens[pick % fixtures.tokens.len()].clone();
                    let request = deadline(
                        ValidateTokenRequest {
                            access_token,
                            ..Default::default()
                        },
                        timeout,
                    );
                    auth.validate_token(request).await.map(drop)
                }
                Operation::Refresh => {
                    let slot = &fixtures.refresh_tokens[pick % fixtures.refresh_tokens.len()];
                    let mut refresh_token = slot.lock().await;
                    let request = deadline(
                        RefreshRequest {
                            refresh_token: refresh_token.clone(),
                        },
                        timeout,
                    );
                    auth.refresh(request)
                        .await
                        .map(|r| *refresh_token = r.into_inner().refresh_token)
                }
            }
        };
        let mut retry_after = None;
        let result = match tokio::time::timeout(self.give_up, call).await {
            Ok(Ok(())) => (Outcome::Status(Code::Ok), None),
            Ok(Err(status)) => match classify(&status) {
                outcome @ Outcome::Status(code) => {
                    if code == Code::ResourceExhausted {
                        retry_after = status
                            .get_error_details()
                            .retry_info()
                            .and_then(|info| info.retry_delay);
                    }
                    (outcome, None)
                }
                outcome => (outcome, Some(status)),
            },
            Err(_) => (
                Outcome::Timeout,
                Some(Status::deadline_exceeded(format!(
                    "no answer within {:?} (deadline {:?})",
                    self.give_up, self.timeout
                ))),
            ),
        };
        Performed {
            result,
            retry_after,
        }
    }

    /// Records one measured request in shard `shard`.
    pub(super) fn record(
        &self,
        shard: usize,
        op: Operation,
        (outcome, error): (Outcome, Option<Status>),
        sent: Instant,
        done: Instant,
    ) {
        if outcome != Outcome::Status(Code::Ok) {
            self.counters.failed.fetch_add(1, Ordering::Relaxed);
        }
        let mut recorder = lock(&self.recorders[shard % self.recorders.len()]);
        recorder.record(op, outcome, sent, done);
        if let Some(error) = error {
            recorder.note_client_error(|| describe_status(&error));
        }
        drop(recorder);
        // Counted last, so a progress reading never runs ahead of the recorders.
        self.counters.done.fetch_add(1, Ordering::Relaxed);
    }
}

fn deadline<T>(message: T, timeout: Duration) -> Request<T> {
    let mut request = Request::new(message);
    request.set_timeout(timeout);
    request
}

/// Locks a recorder shard. A panic while holding it can only come from a bug in the
/// recorder; the counts are still the best data there is, so go on with them.
pub(super) fn lock(shard: &Mutex<Recorder>) -> std::sync::MutexGuard<'_, Recorder> {
    shard
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}
