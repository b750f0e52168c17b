//! Failed logins cost the same whether the username exists or not, even while
//! stored hashes have another cost than the current one: every failed login
//! computes the same number of PBKDF2 rounds, counted (`authd_hash_rounds_total`),
//! so their timing cannot tell known usernames from unknown ones. What that does to
//! latencies on a real machine is measured by `bench/login-timing.sh`, not here.

use crate::helpers::{TestApp, TestDb, expect_code, metric, spawn_app_on};
use tonic::Code;

const LOW: u32 = 1000;
const HIGH: u32 = 20_000;

/// PBKDF2 rounds the app has computed so far (`authd_hash_rounds_total`).
pub(crate) fn rounds(app: &TestApp) -> u64 {
    let text = app.handle.render_metrics();
    let rounds = metric(&text, "authd_hash_rounds_total");
    rounds.unwrap_or_else(|| panic!("authd_hash_rounds_total is exported:\n{text}")) as u64
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

crate::backend_tests!(
    failed_logins_cost_the_same_after_the_cost_is_raised,
    failed_logins_cost_the_same_after_the_cost_is_lowered,
);
