//! Account events through the real server, on both backends: every change writes
//! its event exactly once and a refused one none; WatchEvents resumes after a
//! position, missing nothing; retention and OUT_OF_RANGE; a slow subscriber holds
//! only its own stream; on PostgreSQL, a transaction held open holds the stream at
//! its position, and two replicas serve one stream.

use crate::{
    admin::{ADMIN_KEY, Admin, READ_KEY, admin_app},
    helpers::{Backend, TestDb, expect_code, metric, wait_for},
};
use authd::{
    ManualClock,
    pb::{
        ChangePasswordRequest, LogoutRequest, RefreshRequest,
        admin::{
            AccountEvent, AddServiceCredentialRequest, ClientSecret, CreateServiceAccountRequest,
            DeleteServiceAccountRequest, DeleteUserRequest, DisableServiceAccountRequest,
            DisableUserRequest, EnableUserRequest, EndSessionsRequest, RemoveSecondFactorsRequest,
            RemoveServiceCredentialRequest, ServiceAccountSelector, SetPasswordRequest,
            UserSelector, WatchEventsRequest, add_service_credential_request,
            admin_service_client::AdminServiceClient, service_account_selector,
            user_selector::Selector, watch_events_request::Start,
        },
    },
};
use futures::future::join_all;
use std::{sync::Arc, time::Duration};
use tonic::{Code, Request, Status, Streaming, transport::Channel};

pub(crate) const PASSWORD: &str = "a fine password";

crate::backend_tests!(
    every_change_writes_its_event_once_and_a_refused_one_none,
    a_subscriber_resumed_after_its_last_position_misses_nothing,
    retention_deletes_old_events_and_an_older_position_is_out_of_range,
    a_slow_subscriber_falls_behind_without_holding_registrations,
    service_account_changes_write_their_events_and_no_secret,
);

pub(crate) fn with_key<T>(message: T, key: &str) -> Request<T> {
    let mut request = Request::new(message);
    request
        .metadata_mut()
        .insert("authorization", format!("Bearer {key}").parse().unwrap());
    request
}

fn by_name(name: &str) -> Option<UserSelector> {
    Some(UserSelector {
        selector: Some(Selector::Username(name.into())),
    })
}

/// A WatchEvents stream of `client` from `start` (after `after` for
/// START_AFTER_POSITION).
pub(crate) async fn watch(
    client: &mut AdminServiceClient<Channel>,
    start: Start,
    after: u64,
) -> Result<Streaming<AccountEvent>, Status> {
    let request = WatchEventsRequest {
        start: start as i32,
        after_position: after,
    };
    Ok(client
        .watch_events(with_key(request, READ_KEY))
        .await?
        .into_inner())
}

/// The next `n` events of `stream`.
pub(crate) async fn take(stream: &mut Streaming<AccountEvent>, n: usize) -> Vec<AccountEvent> {
    let mut events = Vec::with_capacity(n);
    while events.len() < n {
        let event = tokio::time::timeout(Duration::from_secs(30), stream.message())
            .await
            .expect("the event arrives")
            .expect("the stream goes on")
            .expect("the stream goes on");
        events.push(event);
    }
    events
}

/// Events until one of type `kind` (included).
pub(crate) async fn until(stream: &mut Streaming<AccountEvent>, kind: &str) -> Vec<AccountEvent> {
    let mut events = Vec::new();
    loop {
        let event = take(stream, 1).await.remove(0);
        let done = event.r#type == kind;
        events.push(event);
        if done {
            return events;
        }
    }
}

fn data(event: &AccountEvent) -> serde_json::Value {
    serde_json::from_str(&event.data_json).unwrap()
}

/// The type of an event, and for ended sessions their reason.
fn shape(event: &AccountEvent) -> String {
    match event.r#type.as_str() {
        "user.sessions_ended" => format!(
            "user.sessions_ended:{}",
            data(event)["reason"].as_str().unwrap()
        ),
        kind => kind.to_owned(),
    }
}

async fn admin_with_clock(db: &TestDb, clock: &Arc<ManualClock>) -> Admin {
    let clock = clock.clone();
    admin_app(db, move |c| {
        c.clock = Some(clock);
        c.second_factor.data_keys = Some(crate::totp::K1.parse().unwrap());
    })
    .await
}

async fn every_change_writes_its_event_once_and_a_refused_one_none(db: TestDb) {
    let clock = Arc::new(ManualClock::new());
    let mut admin = admin_with_clock(&db, &clock).await;
    let mut stream = watch(&mut admin.client, Start::AfterPosition, 0)
        .await
        .unwrap();
    let app = &mut admin.app;

    // Registered; a second registration of the name is refused and writes nothing.
    let alice = app.register("alice", PASSWORD).await.unwrap();
    expect_code(app.register("Alice", PASSWORD).await, Code::AlreadyExists);
    // Logout of one session.
    let session = app.login("alice", PASSWORD).await.unwrap();
    (app.client)
        .logout(LogoutRequest {
            refresh_token: session.refresh_token.clone(),
            ..Default::default()
        })
        .await
        .unwrap();
    // A refresh token presented again after its rotation: reuse.
    let session = app.login("alice", PASSWORD).await.unwrap();
    let refresh = |token: String| RefreshRequest {
        refresh_token: token,
    };
    (app.client)
        .refresh(refresh(session.refresh_token.clone()))
        .await
        .unwrap();
    clock.advance(Duration::from_secs(60));
    expect_code(
        app.client
            .refresh(refresh(session.refresh_token.clone()))
            .await,
        Code::Unauthenticated,
    );
    // A refused password change writes nothing; a change ends the live session.
    app.login("alice", PASSWORD).await.unwrap();
    let change = |current: &str| ChangePasswordRequest {
        username: "alice".into(),
        current_password: current.into(),
        new_password: "another fine password".into(),
    };
    expect_code(
        app.client.change_password(change("not the password")).await,
        Code::Unauthenticated,
    );
    app.client.change_password(change(PASSWORD)).await.unwrap();
    // The second factor on and off (by the user, by an administrator).
    let enrolled = crate::totp::enroll(app, &clock, "bob").await;
    let admin_client = &mut admin.client;
    admin_client
        .remove_second_factors(with_key(
            RemoveSecondFactorsRequest {
                user: by_name("bob"),
            },
            ADMIN_KEY,
        ))
        .await
        .unwrap();
    // Disable (twice: the second changes nothing), enable, an administrator's
    // password and sessions ended, deletion.
    admin
        .app
        .login("alice", "another fine password")
        .await
        .unwrap();
    let disable = || DisableUserRequest {
        user: by_name("alice"),
        reason: "test".into(),
    };
    admin_client
        .disable_user(with_key(disable(), ADMIN_KEY))
        .await
        .unwrap();
    admin_client
        .disable_user(with_key(disable(), ADMIN_KEY))
        .await
        .unwrap();
    admin_client
        .enable_user(with_key(
            EnableUserRequest {
                user: by_name("alice"),
            },
            ADMIN_KEY,
        ))
        .await
        .unwrap();
    admin
        .app
        .login("alice", "another fine password")
        .await
        .unwrap();
    admin_client
        .set_password(with_key(
            SetPasswordRequest {
                user: by_name("alice"),
                new_password: "a third fine password".into(),
                keep_sessions: false,
            },
            ADMIN_KEY,
        ))
        .await
        .unwrap();
    admin
        .app
        .login("alice", "a third fine password")
        .await
        .unwrap();
    admin_client
        .end_sessions(with_key(
            EndSessionsRequest {
                user: by_name("alice"),
                session_ids: vec![],
            },
            ADMIN_KEY,
        ))
        .await
        .unwrap();
    // Ending them again ends nothing and writes nothing.
    admin_client
        .end_sessions(with_key(
            EndSessionsRequest {
                user: by_name("alice"),
                session_ids: vec![],
            },
            ADMIN_KEY,
        ))
        .await
        .unwrap();
    admin_client
        .delete_user(with_key(
            DeleteUserRequest {
                user: by_name("alice"),
            },
            ADMIN_KEY,
        ))
        .await
        .unwrap();

    let events = until(&mut stream, "user.deleted").await;
    let shapes: Vec<String> = events.iter().map(shape).collect();
    assert_eq!(
        shapes,
        [
            "user.registered",
            "user.sessions_ended:logout",
            "user.sessions_ended:reuse",
            "user.password_changed",
            "user.sessions_ended:password_change",
            "user.registered",
            "user.second_factor_added",
            "user.second_factor_removed",
            "user.disabled",
            "user.sessions_ended:disabled",
            "user.enabled",
            "user.password_set",
            "user.sessions_ended:admin",
            "user.sessions_ended:admin",
            "user.deleted",
        ]
    );
    // Positions only grow; each event names its user; none holds a secret.
    assert!(events.windows(2).all(|w| w[0].position < w[1].position));
    for event in &events {
        let user = if event.position == events[5].position || event.r#type.contains("second_factor")
        {
            &enrolled.user_id
        } else {
            &alice
        };
        assert_eq!(&event.user_id, user, "{event:?}");
        for secret in [
            PASSWORD,
            "another fine password",
            "a third fine password",
            "$pbkdf2",
        ] {
            assert!(!event.data_json.contains(secret), "{event:?}");
        }
        assert!(
            !event.data_json.contains(&session.refresh_token),
            "{event:?}"
        );
    }
    assert_eq!(data(&events[0])["username"], "alice");
    assert_eq!(data(&events[8])["reason"], "test");
    admin.app.stop().await.unwrap();
}

async fn a_subscriber_resumed_after_its_last_position_misses_nothing(db: TestDb) {
    let mut admin = admin_app(&db, |_| {}).await;
    let mut first = watch(&mut admin.client, Start::Oldest, 0).await.unwrap();
    let registered = crate::helpers::spawn_registrations(&admin.app.client, "resume", 60, PASSWORD);
    // The subscriber reads 20 events and dies; its last recorded position is the
    // 20th's.
    let seen = take(&mut first, 20).await;
    drop(first);
    let last = seen.last().unwrap().position;
    let ids: Vec<String> = join_all(registered)
        .await
        .into_iter()
        .map(|r| r.unwrap().unwrap())
        .collect();
    let mut resumed = watch(&mut admin.client, Start::AfterPosition, last)
        .await
        .unwrap();
    let rest = take(&mut resumed, 40).await;
    assert_eq!(rest[0].position, last + 1);
    let mut streamed: Vec<String> = seen
        .iter()
        .chain(&rest)
        .map(|e| e.user_id.clone())
        .collect();
    let mut expected = ids.clone();
    streamed.sort();
    expected.sort();
    assert_eq!(streamed, expected, "every registration once");
    admin.app.stop().await.unwrap();
}

async fn retention_deletes_old_events_and_an_older_position_is_out_of_range(db: TestDb) {
    let clock = Arc::new(ManualClock::new());
    let clock_for_app = clock.clone();
    let mut admin = admin_app(&db, move |c| {
        c.clock = Some(clock_for_app);
        c.events.events_retention = Duration::from_secs(3600);
        c.events.events_prune_interval = Duration::from_millis(20);
    })
    .await;
    for i in 0..3 {
        admin
            .app
            .register(&format!("old{i}"), PASSWORD)
            .await
            .unwrap();
    }
    let old = take(
        &mut watch(&mut admin.client, Start::Oldest, 0).await.unwrap(),
        3,
    )
    .await;
    clock.advance(Duration::from_secs(2 * 3600));
    let oldest_after = wait_for("retention deleted the old events", || {
        let mut client = admin.client.clone();
        async move {
            match watch(&mut client, Start::AfterPosition, 0).await {
                Err(status) if status.code() == Code::OutOfRange => Some(status),
                _ => None,
            }
        }
    })
    .await;
    use tonic_types::StatusExt as _;
    let info = oldest_after.get_details_error_info().expect("an ErrorInfo");
    assert_eq!(info.reason, "EVENTS_PRUNED");
    let resume: u64 = info.metadata["oldest_after"].parse().unwrap();
    assert_eq!(resume, old[2].position);
    // After the position it names, and from the oldest, the stream goes on.
    let new = admin.app.register("new", PASSWORD).await.unwrap();
    let after = take(
        &mut watch(&mut admin.client, Start::AfterPosition, resume)
            .await
            .unwrap(),
        1,
    )
    .await;
    let oldest = take(
        &mut watch(&mut admin.client, Start::Oldest, 0).await.unwrap(),
        1,
    )
    .await;
    assert_eq!(
        (after[0].user_id.as_str(), oldest[0].user_id.as_str()),
        (new.as_str(), new.as_str())
    );
    let text = admin.app.handle.render_metrics();
    assert_eq!(metric(&text, "authd_events_pruned_total"), Some(3.0));
    admin.app.stop().await.unwrap();
}

async fn a_slow_subscriber_falls_behind_without_holding_registrations(db: TestDb) {
    // Long names, so what the buffers between the stream and its subscriber hold
    // (the server's HTTP/2 send buffer, at most 400 KiB a stream, and the
    // subscriber's 64 KiB window) is fewer events than this.
    const USERS: usize = 3000;
    let prefix = "a-subscriber-that-sleeps-while-users-register-0123";
    let admin = admin_app(&db, |_| {}).await;
    let addr = admin.app.handle.admin_addr().unwrap();
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .unwrap()
        .initial_stream_window_size(65_535)
        .initial_connection_window_size(65_535)
        .connect()
        .await
        .unwrap();
    // Opened, then never read while the users register (in waves of 50 at once).
    let mut slow = watch(&mut AdminServiceClient::new(channel), Start::Now, 0)
        .await
        .unwrap();
    let mut ok = 0;
    for wave in 0..USERS / 50 {
        let registered = crate::helpers::spawn_registrations(
            &admin.app.client,
            &format!("{prefix}-{wave}"),
            50,
            PASSWORD,
        );
        ok += join_all(registered)
            .await
            .into_iter()
            .filter(|r| matches!(r, Ok(Ok(_))))
            .count();
    }
    assert_eq!(
        ok, USERS,
        "every registration answered while the subscriber slept"
    );
    // Its stream sent only what the buffers hold, then waited.
    let text = admin.app.handle.render_metrics();
    let streamed = metric(&text, "authd_events_streamed_total").unwrap_or(0.0);
    assert!(
        streamed < USERS as f64,
        "{streamed} of {USERS} sent ahead of the subscriber"
    );
    // Read now: everything, in order.
    let events = take(&mut slow, USERS).await;
    assert!(events.windows(2).all(|w| w[0].position < w[1].position));
    admin.app.stop().await.unwrap();
}

// PostgreSQL only: a held-open transaction, concurrent writers, two replicas.

#[tokio::test]
async fn a_transaction_held_open_holds_every_stream_at_its_position() {
    let Some(db) = TestDb::new(Backend::Postgres, "held_open").await else {
        return;
    };
    let mut admin = admin_app(&db, |c| c.events.events_poll = Duration::from_millis(20)).await;
    admin.app.register("before", PASSWORD).await.unwrap();
    let mut stream = watch(&mut admin.client, Start::Oldest, 0).await.unwrap();
    assert_eq!(take(&mut stream, 1).await[0].r#type, "user.registered");

    // A writer takes a position and stays open.
    let authd::config::DatabaseUrl::Postgres(url) = &db.url else {
        unreachable!()
    };
    use sqlx::Connection as _;
    let mut held = sqlx::PgConnection::connect(url.expose()).await.unwrap();
    sqlx::query("BEGIN").execute(&mut held).await.unwrap();
    sqlx::query(
        "INSERT INTO account_events (at, user_id, kind, data) \
         VALUES (0, 'held', 'user.enabled', '{}')",
    )
    .execute(&mut held)
    .await
    .unwrap();
    // Writers after it commit first.
    for i in 0..5 {
        admin
            .app
            .register(&format!("after{i}"), PASSWORD)
            .await
            .unwrap();
    }
    // The stream looks many times (counted), and sends none of them.
    let handle = admin.app.handle.clone();
    let reads = || {
        let text = handle.render_metrics();
        metric(
            &text,
            "authd_store_operation_duration_seconds_count{backend=\"postgres\",operation=\"read_events\"}",
        )
        .unwrap_or(0.0)
    };
    let before = reads();
    crate::helpers::wait_until("the stream polled 50 more times", || {
        reads() >= before + 50.0
    })
    .await;
    let nothing = tokio::time::timeout(Duration::from_millis(1), stream.message()).await;
    assert!(
        nothing.is_err(),
        "nothing passes the open transaction: {nothing:?}"
    );
    // Committed: the held event first, then the others, in position order.
    sqlx::query("COMMIT").execute(&mut held).await.unwrap();
    let events = take(&mut stream, 6).await;
    assert_eq!(events[0].user_id, "held");
    assert!(events.windows(2).all(|w| w[0].position < w[1].position));
    assert!(events[1..].iter().all(|e| e.r#type == "user.registered"));

    // Rolled back: its position is a gap the stream passes once the writer ends.
    sqlx::query("BEGIN").execute(&mut held).await.unwrap();
    sqlx::query(
        "INSERT INTO account_events (at, user_id, kind, data) \
         VALUES (0, 'gone', 'user.enabled', '{}')",
    )
    .execute(&mut held)
    .await
    .unwrap();
    admin.app.register("behind", PASSWORD).await.unwrap();
    let before = reads();
    crate::helpers::wait_until("the stream polled 50 more times", || {
        reads() >= before + 50.0
    })
    .await;
    assert!(
        tokio::time::timeout(Duration::from_millis(1), stream.message())
            .await
            .is_err()
    );
    sqlx::query("ROLLBACK").execute(&mut held).await.unwrap();
    let next = take(&mut stream, 1).await;
    assert_eq!(next[0].r#type, "user.registered");
    assert_eq!(
        next[0].position,
        events[5].position + 2,
        "one position rolled back"
    );
    held.close().await.unwrap();
    admin.app.stop().await.unwrap();
}

#[tokio::test]
async fn two_replicas_serve_one_stream_of_concurrent_writers() {
    let Some(db) = TestDb::new(Backend::Postgres, "two_replicas_events").await else {
        return;
    };
    let fast = |c: &mut authd::config::Config| c.events.events_poll = Duration::from_millis(20);
    let mut a = admin_app(&db, fast).await;
    let mut b = admin_app(&db, fast).await;
    let mut from_a = watch(&mut a.client, Start::Oldest, 0).await.unwrap();
    let mut from_b = watch(&mut b.client, Start::Oldest, 0).await.unwrap();
    // Eight writers on each replica at once.
    let mut registered = crate::helpers::spawn_registrations(&a.app.client, "ra", 100, PASSWORD);
    registered.extend(crate::helpers::spawn_registrations(
        &b.app.client,
        "rb",
        100,
        PASSWORD,
    ));
    let ids: Vec<String> = join_all(registered)
        .await
        .into_iter()
        .map(|r| r.unwrap().unwrap())
        .collect();
    let (seen_a, seen_b) = tokio::join!(take(&mut from_a, 200), take(&mut from_b, 200));
    let positions = |events: &[AccountEvent]| -> Vec<(u64, String)> {
        events
            .iter()
            .map(|e| (e.position, e.user_id.clone()))
            .collect()
    };
    assert_eq!(positions(&seen_a), positions(&seen_b), "one stream");
    assert!(seen_a.windows(2).all(|w| w[0].position < w[1].position));
    let mut streamed: Vec<String> = seen_a.iter().map(|e| e.user_id.clone()).collect();
    let mut expected = ids;
    streamed.sort();
    expected.sort();
    assert_eq!(streamed, expected);
    // A subscriber of A resumes on B from its last position.
    let last = seen_a[99].position;
    let resumed = take(
        &mut watch(&mut b.client, Start::AfterPosition, last)
            .await
            .unwrap(),
        100,
    )
    .await;
    assert_eq!(positions(&resumed), positions(&seen_a[100..]));
    a.app.stop().await.unwrap();
    b.app.stop().await.unwrap();
}

#[tokio::test]
async fn watchers_are_bounded_and_need_a_key() {
    let db = TestDb::new(Backend::Sqlite, "").await.unwrap();
    let mut admin = admin_app(&db, |c| c.events.events_max_watchers = 2).await;
    let _one = watch(&mut admin.client, Start::Now, 0).await.unwrap();
    let _two = watch(&mut admin.client, Start::Now, 0).await.unwrap();
    let refused = watch(&mut admin.client, Start::Now, 0).await.unwrap_err();
    assert_eq!(refused.code(), Code::ResourceExhausted);
    let request = Request::new(WatchEventsRequest::default());
    let status = admin.client.watch_events(request).await.unwrap_err();
    assert_eq!(status.code(), Code::Unauthenticated);
    drop((_one, _two));
    // A stream ended frees its place (counted by the gauge).
    crate::helpers::wait_until("the streams closed", || {
        metric(&admin.app.handle.render_metrics(), "authd_events_watchers") == Some(0.0)
    })
    .await;
    watch(&mut admin.client, Start::Now, 0).await.unwrap();
    admin.app.stop().await.unwrap();
}

/// Creating, changing and deleting a service account writes one event each, its
/// account's id as the user; a refused change (a name taken, a disable repeated)
/// none; no event holds a client secret or its digest.
async fn service_account_changes_write_their_events_and_no_secret(db: TestDb) {
    let mut admin = admin_app(&db, |_| {}).await;
    let mut stream = watch(&mut admin.client, Start::AfterPosition, 0)
        .await
        .unwrap();
    let client = &mut admin.client;
    let create = |name: &str| CreateServiceAccountRequest {
        name: name.into(),
        audiences: vec!["billing".into()],
        scopes: vec!["read".into()],
        with_secret: true,
        ..Default::default()
    };
    let created = (client.create_service_account(with_key(create("orders"), ADMIN_KEY)))
        .await
        .unwrap()
        .into_inner();
    expect_code(
        client
            .create_service_account(with_key(create("Orders"), ADMIN_KEY))
            .await,
        Code::AlreadyExists,
    );
    let account = created.account.unwrap();
    let selector = || {
        Some(ServiceAccountSelector {
            selector: Some(service_account_selector::Selector::Id(account.id.clone())),
        })
    };
    let added = client
        .add_service_credential(with_key(
            AddServiceCredentialRequest {
                account: selector(),
                kind: Some(add_service_credential_request::Kind::Secret(
                    ClientSecret::default(),
                )),
            },
            ADMIN_KEY,
        ))
        .await
        .unwrap()
        .into_inner();
    let first = account.credentials[0].id.clone();
    client
        .remove_service_credential(with_key(
            RemoveServiceCredentialRequest {
                account: selector(),
                credential_id: first.clone(),
            },
            ADMIN_KEY,
        ))
        .await
        .unwrap();
    for _ in 0..2 {
        let disable = DisableServiceAccountRequest {
            account: selector(),
            reason: "retired".into(),
        };
        client
            .disable_service_account(with_key(disable, ADMIN_KEY))
            .await
            .unwrap();
    }
    let delete = DeleteServiceAccountRequest {
        account: selector(),
    };
    client
        .delete_service_account(with_key(delete, ADMIN_KEY))
        .await
        .unwrap();

    let events = until(&mut stream, "service_account.deleted").await;
    let kinds: Vec<&str> = events.iter().map(|e| e.r#type.as_str()).collect();
    assert_eq!(
        kinds,
        [
            "service_account.created",
            "service_account.credential_added",
            "service_account.credential_removed",
            "service_account.disabled",
            "service_account.deleted",
        ]
    );
    assert!(events.iter().all(|e| e.user_id == account.id), "{events:?}");
    assert_eq!(data(&events[0])["name"], "orders");
    assert_eq!(data(&events[0])["audiences"][0], "billing");
    assert_eq!(data(&events[0])["credentials"][0]["id"], first.as_str());
    assert_eq!(data(&events[0])["credentials"][0]["kind"], "secret");
    let second = added.credential.unwrap().id;
    assert_eq!(data(&events[1])["credential"]["id"], second.as_str());
    assert_eq!(data(&events[2])["credential"]["id"], first.as_str());
    assert_eq!(data(&events[3])["reason"], "retired");
    for event in &events {
        for secret in [&created.client_secret, &added.client_secret] {
            assert!(!event.data_json.contains(secret.as_str()), "{event:?}");
        }
        assert!(!event.data_json.contains("digest"), "{event:?}");
    }
    admin.app.stop().await.unwrap();
}
