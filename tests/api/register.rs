//! Registration under concurrency: uniqueness, group commit, and the results.

use crate::helpers::{TestDb, login, ok_and_taken, register, spawn_app_on};
use futures::future::join_all;

async fn concurrent_registrations_of_one_name_have_exactly_one_winner(db: TestDb) {
    let app = spawn_app_on(&db, |_| ()).await;
    let attempts = (0..50).map(|i| {
        let mut client = app.client.clone();
        async move { register(&mut client, "Popular", &format!("password number {i}")).await }
    });
    let results = join_all(attempts).await;
    assert_eq!(ok_and_taken(&results), (1, 49), "{results:?}");
}

async fn many_concurrent_registrations_all_commit_in_fewer_transactions(db: TestDb) {
    let app = spawn_app_on(&db, |_| ()).await;
    let before = app.handle.writer_stats();
    let n = 500;
    let results = join_all((0..n).map(|i| {
        let mut client = app.client.clone();
        async move { register(&mut client, &format!("user-{i}"), "a fine password").await }
    }))
    .await;
    let ids: std::collections::HashSet<_> = results
        .into_iter()
        .map(|r| r.expect("every registration succeeds"))
        .collect();
    assert_eq!(ids.len(), n, "every user gets a distinct id");
    for id in &ids {
        let uuid = uuid::Uuid::parse_str(id).expect("a UUID");
        assert_eq!(uuid.get_version_num(), 7, "{id}");
    }

    // SQLite commits through one writer in batches: fewer transactions than writes.
    // (PostgreSQL has no such writer; its pool commits each registration.)
    if let (Some(before), Some(after)) = (before, app.handle.writer_stats()) {
        let writes = after.writes - before.writes;
        let transactions = after.transactions - before.transactions;
        assert_eq!(writes, n as u64);
        assert!(
            transactions < writes,
            "{writes} registrations took {transactions} transactions: no group commit"
        );
    }

    let logins = join_all((0..n).map(|i| {
        let mut client = app.client.clone();
        async move { login(&mut client, &format!("USER-{i}"), "a fine password").await }
    }))
    .await;
    for (i, result) in logins.into_iter().enumerate() {
        assert!(result.is_ok(), "user-{i} cannot log in: {result:?}");
    }
}

crate::backend_tests!(
    concurrent_registrations_of_one_name_have_exactly_one_winner,
    many_concurrent_registrations_all_commit_in_fewer_transactions,
);
