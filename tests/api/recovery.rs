//! Self-service password recovery through the real server, on both backends: the
//! token delivered only in the event stream, the new password set with it (the
//! rules applied, the sessions ended, the second factor still asked for), reuse,
//! a second request and expiry refused, the same answer and cost for an unknown
//! username, and 50 completions at once with one token: exactly one wins.

use crate::{
    admin::{Admin, admin_app},
    events::{take, until, watch},
    helpers::{TestDb, expect_code, metric},
    totp::{K1, PASSWORD, enroll},
};
use authd::{
    ManualClock,
    pb::{
        ChangePasswordRequest, CompletePasswordResetRequest, CompletePasswordResetResponse,
        RequestPasswordResetRequest, admin::watch_events_request::Start,
        auth_service_client::AuthServiceClient,
    },
};
use futures::future::join_all;
use std::{sync::Arc, time::Duration};
use tonic::{Code, Status, Streaming, transport::Channel};

crate::backend_tests!(
    the_token_from_the_event_stream_sets_a_new_password_once,
    a_newer_request_an_expired_token_and_a_changed_password_void_a_token,
    an_unknown_username_is_answered_alike_at_the_same_cost,
    fifty_completions_with_one_token_exactly_one_wins,
);

async fn app(db: &TestDb, clock: &Arc<ManualClock>, throttle: bool) -> Admin {
    let clock = clock.clone();
    admin_app(db, move |c| {
        c.clock = Some(clock);
        c.second_factor.data_keys = Some(K1.parse().unwrap());
        if !throttle {
            c.limits.login_failures = 0;
        }
    })
    .await
}

async fn request(client: &mut AuthServiceClient<Channel>, username: &str) -> Result<(), Status> {
    let answer = client
        .request_password_reset(RequestPasswordResetRequest {
            username: username.into(),
        })
        .await?;
    assert_eq!(answer.into_inner(), Default::default());
    Ok(())
}

async fn complete(
    client: &mut AuthServiceClient<Channel>,
    token: &str,
    new_password: &str,
) -> Result<CompletePasswordResetResponse, Status> {
    client
        .complete_password_reset(CompletePasswordResetRequest {
            token: token.into(),
            new_password: new_password.into(),
        })
        .await
        .map(|r| r.into_inner())
}

/// The token of the next reset request in `stream`, for the user `user_id`.
async fn token_of(stream: &mut Streaming<authd::pb::admin::AccountEvent>, user_id: &str) -> String {
    let event = until(stream, "user.password_reset_requested")
        .await
        .pop()
        .unwrap();
    assert_eq!(event.user_id, user_id);
    let data: serde_json::Value = serde_json::from_str(&event.data_json).unwrap();
    data["token"].as_str().unwrap().to_owned()
}

async fn the_token_from_the_event_stream_sets_a_new_password_once(db: TestDb) {
    let clock = Arc::new(ManualClock::new());
    let mut admin = app(&db, &clock, true).await;
    // A user with a second factor, and a session.
    let carol = enroll(&mut admin.app, &clock, "carol").await;
    let mut stream = watch(&mut admin.client, Start::Now, 0).await.unwrap();
    let client = &mut admin.app.client.clone();
    request(client, "Carol").await.unwrap();
    let token = token_of(&mut stream, &carol.user_id).await;
    assert!(token.starts_with("rst_"));
    // The password rules apply, and a refusal for them keeps the token.
    let weak = expect_code(
        complete(client, &token, "short").await,
        Code::InvalidArgument,
    );
    assert_eq!(crate::helpers::violations(&weak)[0].0, "new_password");
    expect_code(
        complete(client, &token, "password123").await,
        Code::InvalidArgument,
    );
    let done = complete(client, &token, "a brand new password")
        .await
        .unwrap();
    assert_eq!(done.sessions_ended, 1);
    admin.app.until_refused(&carol.token).await;
    // Used: refused, with one message for every bad token.
    let used = expect_code(
        complete(client, &token, "another new password").await,
        Code::Unauthenticated,
    );
    let unknown = expect_code(
        complete(client, "rst_nope", "another new password").await,
        Code::Unauthenticated,
    );
    assert_eq!(used.message(), unknown.message());
    // The old password no longer works; the new one does, and asks for the code.
    expect_code(
        admin.app.login("carol", PASSWORD).await,
        Code::Unauthenticated,
    );
    let answer = admin
        .app
        .login("carol", "a brand new password")
        .await
        .unwrap();
    assert!(answer.second_factor_required);
    // The stream: the completion, and the session it ended.
    let events = until(&mut stream, "user.sessions_ended").await;
    let kinds: Vec<&str> = events.iter().map(|e| e.r#type.as_str()).collect();
    assert_eq!(
        kinds,
        ["user.password_reset_completed", "user.sessions_ended"]
    );
    assert!(events[1].data_json.contains("\"password_reset\""));
    assert!(events.iter().all(|e| !e.data_json.contains(&token)));
    admin.app.stop().await.unwrap();
}

async fn a_newer_request_an_expired_token_and_a_changed_password_void_a_token(db: TestDb) {
    let clock = Arc::new(ManualClock::new());
    let mut admin = app(&db, &clock, false).await;
    let dave = admin.app.register("dave", PASSWORD).await.unwrap();
    let mut stream = watch(&mut admin.client, Start::Now, 0).await.unwrap();
    let client = &mut admin.app.client.clone();
    // A second request replaces the first.
    request(client, "dave").await.unwrap();
    let first = token_of(&mut stream, &dave).await;
    request(client, "dave").await.unwrap();
    let second = token_of(&mut stream, &dave).await;
    expect_code(
        complete(client, &first, "a brand new password").await,
        Code::Unauthenticated,
    );
    // Expired (the default lifetime is 30 minutes).
    clock.advance(Duration::from_secs(31 * 60));
    expect_code(
        complete(client, &second, "a brand new password").await,
        Code::Unauthenticated,
    );
    // Issued before a password change: void.
    request(client, "dave").await.unwrap();
    let third = token_of(&mut stream, &dave).await;
    client
        .change_password(ChangePasswordRequest {
            username: "dave".into(),
            current_password: PASSWORD.into(),
            new_password: "a changed password".into(),
        })
        .await
        .unwrap();
    expect_code(
        complete(client, &third, "a brand new password").await,
        Code::Unauthenticated,
    );
    // A fresh one works.
    request(client, "dave").await.unwrap();
    let fourth = token_of(&mut stream, &dave).await;
    complete(client, &fourth, "a brand new password")
        .await
        .unwrap();
    admin
        .app
        .login("dave", "a brand new password")
        .await
        .unwrap();
    admin.app.stop().await.unwrap();
}

async fn an_unknown_username_is_answered_alike_at_the_same_cost(db: TestDb) {
    let clock = Arc::new(ManualClock::new());
    let mut admin = app(&db, &clock, true).await;
    admin.app.register("erin", PASSWORD).await.unwrap();
    let mut stream = watch(&mut admin.client, Start::Now, 0).await.unwrap();
    let backend = match db.url {
        authd::config::DatabaseUrl::Sqlite(_) => "sqlite",
        _ => "postgres",
    };
    let counts = |admin: &Admin| {
        let text = admin.app.handle.render_metrics();
        let op = |name: &str| {
            let series = format!(
                "authd_store_operation_duration_seconds_count{{backend=\"{backend}\",operation=\"{name}\"}}"
            );
            metric(&text, &series).unwrap_or(0.0)
        };
        [
            op("find_user"),
            op("write_reset"),
            op("find_user_by_id"),
            metric(&text, "authd_hash_rounds_total").unwrap_or(0.0),
        ]
    };
    let client = &mut admin.app.client.clone();
    let mut costs = Vec::new();
    for name in ["erin", "nobody-here"] {
        let before = counts(&admin);
        let answer = request(client, name).await;
        let after = counts(&admin);
        answer.unwrap();
        costs.push(
            before
                .iter()
                .zip(after)
                .map(|(b, a)| a - b)
                .collect::<Vec<_>>(),
        );
    }
    assert_eq!(costs[0], costs[1], "the same store operations and hashing");
    assert_eq!(costs[0][..2], [1.0, 1.0]);
    // Only the known user's request has an event.
    let events = take(&mut stream, 1).await;
    assert_eq!(events[0].r#type, "user.password_reset_requested");
    // Throttled alike: five requests a name from one client, then refused.
    for name in ["erin", "nobody-here"] {
        for _ in 0..4 {
            request(client, name).await.unwrap();
        }
        let refused = expect_code(request(client, name).await, Code::ResourceExhausted);
        assert!(refused.metadata().get("retry-after").is_some());
        // What was counted, in the same words for a name that has no account.
        assert_eq!(
            refused.message(),
            "too many password reset requests for this account; retry later"
        );
    }
    admin.app.stop().await.unwrap();
}

async fn fifty_completions_with_one_token_exactly_one_wins(db: TestDb) {
    let clock = Arc::new(ManualClock::new());
    let mut admin = app(&db, &clock, false).await;
    let frank = admin.app.register("frank", PASSWORD).await.unwrap();
    let mut stream = watch(&mut admin.client, Start::Now, 0).await.unwrap();
    request(&mut admin.app.client, "frank").await.unwrap();
    let token = token_of(&mut stream, &frank).await;
    let attempts = (0..50).map(|i| {
        let (mut client, token) = (admin.app.client.clone(), token.clone());
        tokio::spawn(async move {
            let password = format!("new password number {i}");
            (complete(&mut client, &token, &password).await, password)
        })
    });
    let outcomes: Vec<_> = join_all(attempts)
        .await
        .into_iter()
        .map(Result::unwrap)
        .collect();
    let won: Vec<&String> = outcomes
        .iter()
        .filter(|(r, _)| r.is_ok())
        .map(|(_, p)| p)
        .collect();
    assert_eq!(won.len(), 1, "{outcomes:?}");
    for (outcome, _) in &outcomes {
        if let Err(status) = outcome {
            assert_eq!(status.code(), Code::Unauthenticated);
        }
    }
    admin.app.login("frank", won[0]).await.unwrap();
    let completed = until(&mut stream, "user.password_reset_completed").await;
    assert_eq!(completed.len(), 1);
    admin.app.stop().await.unwrap();
}
