//! Timing does not tell known usernames from unknown ones, even while stored hashes
//! have another cost than the current one: every failed login computes the same
//! number of PBKDF2 rounds (counted by `authd_hash_rounds_total`), and a classifier
//! on the latencies of failed logins does no better than chance.

use crate::helpers::{TestApp, TestDb, expect_code, spawn_app_on};
use std::time::{Duration, Instant};
use tonic::Code;

const LOW: u32 = 1000;
const HIGH: u32 = 20_000;

/// PBKDF2 rounds the app has computed so far (`authd_hash_rounds_total`).
pub(crate) fn rounds(app: &TestApp) -> u64 {
    let text = app.handle.render_metrics();
    let line = text
        .lines()
        .find(|l| l.starts_with("authd_hash_rounds_total "))
        .unwrap_or_else(|| panic!("authd_hash_rounds_total is exported:\n{text}"));
    line.rsplit(' ').next().unwrap().parse().expect("a count")
}

/// The rounds one failed login of `username` (with a wrong password) computed.
pub(crate) async fn rounds_of_a_failed_login(app: &mut TestApp, username: &str) -> u64 {
    let before = rounds(app);
    expect_code(
        app.login(username, "not the password").await,
        Code::Unauthenticated,
    );
    // Counted on the hashing thread before the answer was sent.
    rounds(app) - before
}

/// An app at `iterations`, on `db` where "known" was registered at `stored`.
async fn app_after_a_cost_change(db: &TestDb, stored: u32, iterations: u32) -> TestApp {
    let mut before = spawn_app_on(db, |c| c.passwords.pbkdf2_iterations = stored).await;
    before.register("known", "a fine password").await.unwrap();
    before.stop().await.unwrap();
    spawn_app_on(db, |c| {
        c.passwords.pbkdf2_iterations = iterations;
        // Hundreds of failed logins of two usernames: the login throttle would
        // (rightly) refuse most of them before any hash.
        c.limits.login_failures = 0;
    })
    .await
}

async fn failed_logins_cost_the_same_after_the_cost_is_raised(db: TestDb) {
    let mut app = app_after_a_cost_change(&db, LOW, HIGH).await;
    let known = rounds_of_a_failed_login(&mut app, "known").await;
    let unknown = rounds_of_a_failed_login(&mut app, "nobody").await;
    assert_eq!(
        known, unknown,
        "a known user's failure costs what an unknown's does"
    );
    assert_eq!(known, u64::from(HIGH));
    // The stored hash is still the old one: the failures did not rehash it.
    let stored = db.stored_hash("known").await.unwrap();
    assert!(stored.starts_with("$pbkdf2-sha256$i=1000,"), "{stored}");
}

async fn failed_logins_cost_the_same_after_the_cost_is_lowered(db: TestDb) {
    let mut app = app_after_a_cost_change(&db, HIGH, LOW).await;
    let known = rounds_of_a_failed_login(&mut app, "known").await;
    let unknown = rounds_of_a_failed_login(&mut app, "nobody").await;
    assert_eq!(
        known, unknown,
        "a known user's failure costs what an unknown's does"
    );
    assert_eq!(known, u64::from(HIGH), "as much as the dearest stored hash");

    // A success is not padded: it verifies the old hash, then rehashes at the new cost.
    let before = rounds(&app);
    app.login("known", "a fine password").await.unwrap();
    assert_eq!(rounds(&app) - before, u64::from(HIGH + LOW));
    // That was the last hash at the old cost: failures now cost the current one.
    assert_eq!(
        rounds_of_a_failed_login(&mut app, "known").await,
        u64::from(LOW)
    );
    assert_eq!(
        rounds_of_a_failed_login(&mut app, "nobody").await,
        u64::from(LOW)
    );
}

/// The accuracy of the best single-threshold classifier telling `a` from `b`:
/// "at most t is a, above is b", or the other way round, for the best t.
fn best_threshold_accuracy(a: &[Duration], b: &[Duration]) -> f64 {
    let mut all: Vec<(Duration, bool)> = a
        .iter()
        .map(|d| (*d, true))
        .chain(b.iter().map(|d| (*d, false)))
        .collect();
    all.sort();
    let total = all.len() as f64;
    // Threshold below everything: every sample is called b.
    let (mut a_below, mut b_below) = (0usize, 0usize);
    let mut best = 0.5f64;
    for (i, (_, is_a)) in all.iter().enumerate() {
        if *is_a {
            a_below += 1;
        } else {
            b_below += 1;
        }
        // Only between distinct values is there a threshold.
        if all.get(i + 1).is_some_and(|(next, _)| *next == all[i].0) {
            continue;
        }
        let right = a_below + (b.len() - b_below);
        let accuracy = right as f64 / total;
        best = best.max(accuracy).max(1.0 - accuracy);
    }
    best
}

#[test]
fn the_classifier_finds_a_difference_when_there_is_one() {
    let ms = Duration::from_millis;
    let fast: Vec<_> = (0..50).map(|i| ms(10 + i % 3)).collect();
    let slow: Vec<_> = (0..50).map(|i| ms(100 + i % 3)).collect();
    assert_eq!(best_threshold_accuracy(&fast, &slow), 1.0);
    assert_eq!(best_threshold_accuracy(&slow, &fast), 1.0);
    let same: Vec<_> = (0..50).map(|i| ms(10 + i % 5)).collect();
    assert!(best_threshold_accuracy(&same, &same) <= 0.5 + 1e-9);
}

/// Interleaved failed logins of a known and an unknown user, "known" stored at
/// `stored` rounds and the app at `iterations`. Before the fix one of them took a
/// twentieth of the other's time and any threshold told them apart (accuracy near
/// 1.0); now the best threshold must do no better than chance allows. On two
/// samples of 100 from one distribution the best threshold's accuracy is
/// (1 + D) / 2, D the two-sample Kolmogorov-Smirnov statistic: it exceeds 0.64
/// about once in a thousand runs, and 0.70 about once in four million.
async fn assert_latency_tells_nothing(db: &TestDb, stored: u32, iterations: u32) {
    const N: usize = 100;
    let mut app = app_after_a_cost_change(db, stored, iterations).await;
    let mut timed = async |username: &str| {
        let started = Instant::now();
        expect_code(
            app.login(username, "not the password").await,
            Code::Unauthenticated,
        );
        started.elapsed()
    };
    for _ in 0..10 {
        timed("known").await;
        timed("nobody").await;
    }
    let (mut known, mut unknown) = (Vec::with_capacity(N), Vec::with_capacity(N));
    for i in 0..N {
        // Alternate which goes first, so neither always follows the other.
        if i % 2 == 0 {
            known.push(timed("known").await);
            unknown.push(timed("nobody").await);
        } else {
            unknown.push(timed("nobody").await);
            known.push(timed("known").await);
        }
    }
    let accuracy = best_threshold_accuracy(&known, &unknown);
    let median = |v: &mut Vec<Duration>| {
        v.sort();
        v[v.len() / 2]
    };
    let (mk, mu) = (median(&mut known), median(&mut unknown));
    eprintln!("best threshold accuracy {accuracy:.3}; median known {mk:?}, unknown {mu:?}");
    assert!(
        accuracy <= 0.70,
        "latency tells known from unknown users: accuracy {accuracy:.3} (median known {mk:?}, \
         unknown {mu:?})"
    );
}

async fn latency_does_not_tell_known_users_after_the_cost_is_raised(db: TestDb) {
    assert_latency_tells_nothing(&db, LOW, HIGH).await;
}

async fn latency_does_not_tell_known_users_after_the_cost_is_lowered(db: TestDb) {
    assert_latency_tells_nothing(&db, HIGH, LOW).await;
}

crate::backend_tests!(
    failed_logins_cost_the_same_after_the_cost_is_raised,
    failed_logins_cost_the_same_after_the_cost_is_lowered,
    latency_does_not_tell_known_users_after_the_cost_is_raised,
    latency_does_not_tell_known_users_after_the_cost_is_lowered,
);
