//! The second factor under concurrency: one code (or one recovery code) sent on
//! many streams at once, each with a challenge of its own, has exactly one winner,
//! on both backends and across two replicas of one PostgreSQL database. Outcomes
//! are counted (answers, sessions), never timed.

use crate::{
    helpers::{Backend, TestApp, TestDb},
    totp::{K1, app_on, challenge, code_at, complete, enroll, now},
};
use authd::ManualClock;
use futures::future::join_all;
use std::sync::Arc;
use tonic::Code;

crate::backend_tests!(
    one_code_at_once_on_many_streams_has_one_winner,
    one_recovery_code_at_once_has_one_winner,
);

const RACERS: usize = 16;

/// `RACERS` challenges of `name`, taken one after the other on `apps` in turn.
async fn challenges(apps: &mut [&mut TestApp], name: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    for i in 0..RACERS {
        let n = i % apps.len();
        out.push((n, challenge(&mut apps[n].client, name).await));
    }
    out
}

/// Sends `code` with every challenge at once; returns (successes, refusals).
async fn race(apps: &[&mut TestApp], challenges: &[(usize, String)], code: &str) -> (usize, usize) {
    let attempts = challenges.iter().map(|(n, challenge)| {
        let mut client = apps[*n].client.clone();
        async move { complete(&mut client, challenge, code).await }
    });
    let answers = join_all(attempts).await;
    let ok = answers.iter().filter(|a| a.is_ok()).count();
    let refused = (answers.iter())
        .filter(|a| matches!(a, Err(s) if s.code() == Code::Unauthenticated))
        .count();
    assert_eq!(ok + refused, answers.len(), "{answers:?}");
    (ok, refused)
}

async fn one_code_at_once_on_many_streams_has_one_winner(db: TestDb) {
    let clock = Arc::new(ManualClock::new());
    // The throttle off: every attempt reaches the store, which decides.
    let mut app = app_on(&db, K1, &clock, |c| c.limits.login_failures = 0).await;
    let user = enroll(&mut app, &clock, "rasmus").await;
    let code = code_at(&user.secret, now(&clock));
    let mut apps = [&mut app];
    let challenges = challenges(&mut apps, "rasmus").await;
    assert_eq!(race(&apps, &challenges, &code).await, (1, RACERS - 1));
    // The losers' challenges live on: the next step's code has one winner too.
    let next = code_at(&user.secret, now(&clock) + 30);
    let (ok, _) = race(&apps, &challenges, &next).await;
    assert_eq!(ok, 1);
}

async fn one_recovery_code_at_once_has_one_winner(db: TestDb) {
    let clock = Arc::new(ManualClock::new());
    let mut app = app_on(&db, K1, &clock, |c| c.limits.login_failures = 0).await;
    let user = enroll(&mut app, &clock, "rita").await;
    let mut apps = [&mut app];
    let challenges = challenges(&mut apps, "rita").await;
    assert_eq!(
        race(&apps, &challenges, &user.recovery[3]).await,
        (1, RACERS - 1)
    );
    // The other recovery codes still work, each once.
    let (ok, _) = race(&apps, &challenges, &user.recovery[4]).await;
    assert_eq!(ok, 1);
}

#[tokio::test]
async fn two_replicas_of_one_database_accept_a_code_once() {
    let Some(db) = TestDb::new(Backend::Postgres, "totp_replicas").await else {
        return;
    };
    let clock = Arc::new(ManualClock::new());
    let mut a = app_on(&db, K1, &clock, |c| c.limits.login_failures = 0).await;
    let mut b = app_on(&db, K1, &clock, |c| c.limits.login_failures = 0).await;
    let user = enroll(&mut a, &clock, "ruth").await;
    // Used on one replica, refused on the other.
    let code = code_at(&user.secret, now(&clock));
    let on_a = challenge(&mut a.client, "ruth").await;
    complete(&mut a.client, &on_a, &code).await.unwrap();
    let on_b = challenge(&mut b.client, "ruth").await;
    let refused = complete(&mut b.client, &on_b, &code).await;
    assert_eq!(refused.unwrap_err().code(), Code::Unauthenticated);
    // At once on both replicas: one winner.
    let next = code_at(&user.secret, now(&clock) + 30);
    let mut apps = [&mut a, &mut b];
    let challenges = challenges(&mut apps, "ruth").await;
    assert_eq!(race(&apps, &challenges, &next).await, (1, RACERS - 1));
    let (ok, _) = race(&apps, &challenges, &user.recovery[0]).await;
    assert_eq!(ok, 1);
}
