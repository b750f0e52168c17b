//! The admin API through the real admin listener, on both backends: credentials
//! and roles, GetUser, ListUsers while users are added, DisableUser and
//! EnableUser against logins, refreshes and tokens (also in flight, and across two
//! replicas on PostgreSQL), DeleteUser and registering the name again.

use crate::helpers::{Backend, TestApp, TestDb, expect_code, spawn_app_on, spawn_app_with};
use authd::pb::{
    ChangePasswordRequest, RefreshRequest,
    admin::{
        DeleteUserRequest, DisableUserRequest, DisabledFilter, EnableUserRequest,
        EndSessionsRequest, GetUserRequest, ListSessionsRequest, ListUsersRequest, Session,
        SetPasswordRequest, User, UserSelector, admin_service_client::AdminServiceClient,
        user_selector::Selector,
    },
};
use futures::future::join_all;
use sha2::{Digest as _, Sha256};
use std::{collections::HashMap, io::Write as _, time::Duration};
use tonic::{Code, Request, Status, transport::Channel};

pub(crate) const PASSWORD: &str = "a fine password";
pub(crate) const ADMIN_KEY: &str = "admin-key-for-tests-0123456789abcdef-0123456789";
pub(crate) const READ_KEY: &str = "read-key-for-tests-0123456789abcdef-0123456789ab";

crate::backend_tests!(
    disabling_refuses_the_password_and_every_token_and_enabling_restores_the_password,
    a_disable_wins_against_logins_in_flight,
    a_deleted_user_is_gone_and_its_name_can_be_registered_again,
    list_users_visits_every_user_once_while_users_are_added,
    sessions_are_listed_and_ended_by_name_or_all,
    an_administrators_password_reset_follows_the_rules_and_ends_the_sessions,
    a_restarted_server_still_refuses_what_was_revoked_before,
);

fn digest(key: &str) -> String {
    hex::encode(Sha256::digest(key.as_bytes()))
}

/// A keys file with an admin key ("oncall") and a read key ("auditor").
pub(crate) fn keys_file() -> tempfile::NamedTempFile {
    let mut file = tempfile::NamedTempFile::new().unwrap();
    writeln!(file, "# test keys").unwrap();
    writeln!(file, "oncall  admin {}", digest(ADMIN_KEY)).unwrap();
    writeln!(file, "auditor read  {}", digest(READ_KEY)).unwrap();
    file
}

/// An app with the admin listener on, and its admin client.
pub(crate) struct Admin {
    pub(crate) app: TestApp,
    pub(crate) client: AdminServiceClient<Channel>,
    _keys: tempfile::NamedTempFile,
}

pub(crate) async fn admin_app(
    db: &TestDb,
    adjust: impl FnOnce(&mut authd::config::Config),
) -> Admin {
    let keys = keys_file();
    let path = keys.path().to_owned();
    let app = spawn_app_on(db, |c| {
        c.admin.admin_listen = "127.0.0.1:0".parse().unwrap();
        c.admin.admin_keys_file = Some(path);
        adjust(c);
    })
    .await;
    let addr = app.handle.admin_addr().expect("the admin listener is on");
    let channel = Channel::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .expect("connect to the admin port");
    Admin {
        app,
        client: AdminServiceClient::new(channel),
        _keys: keys,
    }
}

fn with_key<T>(message: T, key: &str) -> Request<T> {
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

fn by_id(id: &str) -> Option<UserSelector> {
    Some(UserSelector {
        selector: Some(Selector::UserId(id.into())),
    })
}

impl Admin {
    async fn get(&mut self, user: Option<UserSelector>) -> Result<User, Status> {
        let request = with_key(GetUserRequest { user }, ADMIN_KEY);
        let response = self.client.get_user(request).await?;
        Ok(response.into_inner().user.unwrap())
    }

    pub(crate) async fn disable(
        &mut self,
        name: &str,
        reason: &str,
    ) -> Result<(User, bool, u32), Status> {
        let request = DisableUserRequest {
            user: by_name(name),
            reason: reason.into(),
        };
        let r = self
            .client
            .disable_user(with_key(request, ADMIN_KEY))
            .await?
            .into_inner();
        Ok((r.user.unwrap(), r.changed, r.sessions_ended))
    }

    async fn enable(&mut self, name: &str) -> Result<bool, Status> {
        let request = EnableUserRequest {
            user: by_name(name),
        };
        let r = self
            .client
            .enable_user(with_key(request, ADMIN_KEY))
            .await?;
        Ok(r.into_inner().changed)
    }

    async fn delete(&mut self, user: Option<UserSelector>) -> Result<u32, Status> {
        let request = DeleteUserRequest { user };
        let r = self
            .client
            .delete_user(with_key(request, ADMIN_KEY))
            .await?;
        Ok(r.into_inner().sessions_ended)
    }

    async fn sessions(&mut self, name: &str) -> Result<Vec<Session>, Status> {
        let request = ListSessionsRequest {
            user: by_name(name),
        };
        let r = self
            .client
            .list_sessions(with_key(request, READ_KEY))
            .await?;
        Ok(r.into_inner().sessions)
    }

    async fn end_sessions(&mut self, name: &str, ids: &[&str]) -> Result<u32, Status> {
        let request = EndSessionsRequest {
            user: by_name(name),
            session_ids: ids.iter().map(|id| (*id).to_owned()).collect(),
        };
        let r = self
            .client
            .end_sessions(with_key(request, ADMIN_KEY))
            .await?;
        Ok(r.into_inner().sessions_ended)
    }

    async fn set_password(
        &mut self,
        name: &str,
        password: &str,
        keep_sessions: bool,
        key: &str,
    ) -> Result<u32, Status> {
        let request = SetPasswordRequest {
            user: by_name(name),
            new_password: password.into(),
            keep_sessions,
        };
        let r = self.client.set_password(with_key(request, key)).await?;
        Ok(r.into_inner().sessions_ended)
    }

    async fn page(
        &mut self,
        size: u32,
        token: &str,
        prefix: &str,
        disabled: DisabledFilter,
    ) -> Result<(Vec<User>, String), Status> {
        let request = ListUsersRequest {
            page_size: size,
            page_token: token.into(),
            username_prefix: prefix.into(),
            disabled: disabled as i32,
        };
        let r = self
            .client
            .list_users(with_key(request, READ_KEY))
            .await?
            .into_inner();
        Ok((r.users, r.next_page_token))
    }

    /// Every user, page by page.
    async fn all(&mut self, size: u32, prefix: &str, disabled: DisabledFilter) -> Vec<String> {
        let mut names = Vec::new();
        let mut token = String::new();
        loop {
            let (users, next) = self.page(size, &token, prefix, disabled).await.unwrap();
            assert!(users.len() <= size as usize);
            names.extend(users.into_iter().map(|u| u.username));
            if next.is_empty() {
                return names;
            }
            token = next;
        }
    }
}

/// Failed logins so far, as the login throttle counts them.
fn failed_logins(app: &TestApp) -> f64 {
    let text = app.handle.render_metrics();
    crate::helpers::metric(&text, "authd_logins_total{outcome=\"failed\"}").unwrap_or(0.0)
}

async fn change_password(app: &mut TestApp, name: &str, current: &str) -> Result<(), Status> {
    app.client
        .change_password(ChangePasswordRequest {
            username: name.into(),
            current_password: current.into(),
            new_password: "violet tractor at dawn".into(),
        })
        .await
        .map(drop)
}

async fn refresh(app: &mut TestApp, token: &str) -> Result<(), Status> {
    app.client
        .refresh(RefreshRequest {
            refresh_token: token.into(),
        })
        .await
        .map(drop)
}

#[tokio::test]
async fn the_admin_api_answers_only_on_its_port_and_only_to_a_key_with_the_right() {
    let db = TestDb::new(Backend::Sqlite, "").await.unwrap();
    let mut admin = admin_app(&db, |_| {}).await;
    admin.app.register("alice", PASSWORD).await.unwrap();

    // The gRPC port does not serve it at all.
    let mut on_grpc_port = AdminServiceClient::new(admin.app.channel().await);
    let request = with_key(
        GetUserRequest {
            user: by_name("alice"),
        },
        ADMIN_KEY,
    );
    expect_code(on_grpc_port.get_user(request).await, Code::Unimplemented);

    // No credential, a wrong key, a key that is too short, a digest for a key.
    let get = || GetUserRequest {
        user: by_name("alice"),
    };
    let status = expect_code(admin.client.get_user(get()).await, Code::Unauthenticated);
    for key in [
        "wrong-key-of-the-right-length-0123456789abcdef",
        "short",
        &digest(ADMIN_KEY),
    ] {
        let again = expect_code(
            admin.client.get_user(with_key(get(), key)).await,
            Code::Unauthenticated,
        );
        // Which of the two it was is not said.
        assert_eq!(again.message(), status.message());
    }
    let mut basic = Request::new(get());
    let basic_auth = format!("Basic {ADMIN_KEY}");
    basic
        .metadata_mut()
        .insert("authorization", basic_auth.parse().unwrap());
    expect_code(admin.client.get_user(basic).await, Code::Unauthenticated);

    // A read key reads, and may not change.
    let user = admin
        .client
        .get_user(with_key(get(), READ_KEY))
        .await
        .unwrap();
    assert_eq!(user.into_inner().user.unwrap().username, "alice");
    let disable = DisableUserRequest {
        user: by_name("alice"),
        reason: "test".into(),
    };
    expect_code(
        admin.client.disable_user(with_key(disable, READ_KEY)).await,
        Code::PermissionDenied,
    );
    assert!(!admin.get(by_name("alice")).await.unwrap().disabled);

    // Bad input: INVALID_ARGUMENT naming the field; an unknown user: NOT_FOUND.
    let status = expect_code(
        admin
            .client
            .get_user(with_key(GetUserRequest { user: None }, ADMIN_KEY))
            .await,
        Code::InvalidArgument,
    );
    assert_eq!(crate::helpers::violations(&status)[0].0, "user");
    expect_code(admin.get(by_name("nobody")).await, Code::NotFound);
    expect_code(admin.get(by_id("no-such-id")).await, Code::NotFound);
    let status = expect_code(admin.disable("alice", "   ").await, Code::InvalidArgument);
    assert_eq!(crate::helpers::violations(&status)[0].0, "reason");
    expect_code(
        admin.page(1001, "", "", DisabledFilter::Any).await,
        Code::InvalidArgument,
    );
    expect_code(
        admin.page(10, "not-a-token", "", DisabledFilter::Any).await,
        Code::InvalidArgument,
    );
    expect_code(
        admin.page(10, "", "al ice", DisabledFilter::Any).await,
        Code::InvalidArgument,
    );

    // The admin port serves health too.
    let mut health = tonic_health::pb::health_client::HealthClient::new(
        Channel::from_shared(format!("http://{}", admin.app.handle.admin_addr().unwrap()))
            .unwrap()
            .connect()
            .await
            .unwrap(),
    );
    let serving = health
        .check(tonic_health::pb::HealthCheckRequest::default())
        .await
        .unwrap();
    assert_eq!(serving.into_inner().status, 1);
}

#[tokio::test]
async fn the_admin_calls_have_their_own_rate_limit() {
    let db = TestDb::new(Backend::Sqlite, "").await.unwrap();
    let mut admin = admin_app(&db, |c| c.admin.admin_rate = 1).await;
    admin.app.register("alice", PASSWORD).await.unwrap();
    let mut refused = 0;
    for _ in 0..20 {
        match admin.get(by_name("alice")).await {
            Ok(_) => {}
            Err(status) if status.code() == Code::ResourceExhausted => {
                use tonic_types::StatusExt as _;
                let details = status.get_error_details();
                assert!(details.retry_info().is_some(), "{status:?}");
                refused += 1;
            }
            Err(other) => panic!("unexpected: {other:?}"),
        }
    }
    assert!(
        refused >= 1,
        "20 calls at once within a limit of 1 a second"
    );
    // The AuthService is not limited by it.
    admin.app.login("alice", PASSWORD).await.unwrap();
}

#[tokio::test]
async fn the_admin_listener_needs_a_keys_file() {
    let db = TestDb::new(Backend::Sqlite, "").await.unwrap();
    let mut config = crate::helpers::test_config(db.url.clone());
    config.admin.admin_listen = "127.0.0.1:0".parse().unwrap();
    let Err(e) = authd::app::Application::build(config.clone()).await else {
        panic!("an admin listener without keys must not start");
    };
    assert!(format!("{e:#}").contains("AUTHD_ADMIN_KEYS_FILE"), "{e:#}");
    // An allow-list of certificate identities needs mutual TLS.
    let mut plain = config.clone();
    plain.admin.admin_allow = vec![(authd::config::AdminRole::Admin, "spiffe://x/y".into())];
    let Err(e) = authd::app::Application::build(plain).await else {
        panic!("an admin allow-list without mutual TLS must not start");
    };
    assert!(format!("{e:#}").contains("AUTHD_TLS_CLIENT_CA"), "{e:#}");
    let mut bad = tempfile::NamedTempFile::new().unwrap();
    writeln!(bad, "oncall superuser {}", digest(ADMIN_KEY)).unwrap();
    config.admin.admin_keys_file = Some(bad.path().to_owned());
    let Err(e) = authd::app::Application::build(config).await else {
        panic!("a bad keys file must not start");
    };
    let shown = format!("{e:#}");
    assert!(shown.contains("unknown role"), "{shown}");
    assert!(!shown.contains(&digest(ADMIN_KEY)), "{shown}");
    // Off by default: no admin port.
    let app = spawn_app_with(|_| {}).await;
    assert_eq!(app.handle.admin_addr(), None);
}

async fn disabling_refuses_the_password_and_every_token_and_enabling_restores_the_password(
    db: TestDb,
) {
    let mut admin = admin_app(&db, |_| {}).await;
    let id = admin.app.register("dora", PASSWORD).await.unwrap();
    let first = admin.app.login("dora", PASSWORD).await.unwrap();
    let second = admin.app.login("dora", PASSWORD).await.unwrap();
    let user = admin.get(by_id(&id)).await.unwrap();
    assert_eq!((user.username.as_str(), user.live_sessions), ("dora", 2));
    assert!(!user.disabled && user.last_login_at.is_some());

    let (user, changed, ended) = admin.disable("Dora", "left the company").await.unwrap();
    assert!(changed && user.disabled);
    assert_eq!(ended, 2);
    assert_eq!(user.disabled_reason, "left the company");
    assert_eq!(user.live_sessions, 0);

    // Every token and refresh token of hers is refused.
    for session in [&first, &second] {
        expect_code(
            admin.app.validate(&session.access_token).await,
            Code::Unauthenticated,
        );
        expect_code(
            refresh(&mut admin.app, &session.refresh_token).await,
            Code::Unauthenticated,
        );
    }
    // Her right password answers exactly as a wrong one: same code and message,
    // the same hash work, and counted as a failed login.
    let failed_before = failed_logins(&admin.app);
    let wrong_rounds = crate::equal_cost::rounds_of_a_failed_login(&mut admin.app, "dora").await;
    let wrong = expect_code(
        admin.app.login("dora", "not her password").await,
        Code::Unauthenticated,
    );
    let before = crate::equal_cost::rounds(&admin.app);
    let right = expect_code(
        admin.app.login("dora", PASSWORD).await,
        Code::Unauthenticated,
    );
    assert_eq!(right.message(), wrong.message());
    assert_eq!(crate::equal_cost::rounds(&admin.app) - before, wrong_rounds);
    assert_eq!(failed_logins(&admin.app) - failed_before, 3.0);
    let changed = expect_code(
        change_password(&mut admin.app, "dora", PASSWORD).await,
        Code::Unauthenticated,
    );
    assert_eq!(changed.message(), wrong.message());

    // Disabling again changes nothing, the reason stays.
    let (user, changed, ended) = admin.disable("dora", "another reason").await.unwrap();
    assert!(!changed && user.disabled && ended == 0);
    assert_eq!(user.disabled_reason, "left the company");
    let disabled = admin.all(10, "", DisabledFilter::Disabled).await;
    assert_eq!(disabled, ["dora"]);

    // Enabled again: the password works, the new token is valid, the old stay refused.
    assert!(admin.enable("dora").await.unwrap());
    assert!(!admin.enable("dora").await.unwrap());
    let again = admin.app.login("dora", PASSWORD).await.unwrap();
    assert_eq!(
        admin
            .app
            .validate(&again.access_token)
            .await
            .unwrap()
            .user_id,
        id
    );
    expect_code(
        admin.app.validate(&first.access_token).await,
        Code::Unauthenticated,
    );
    let user = admin.get(by_name("dora")).await.unwrap();
    assert!(!user.disabled && user.disabled_reason.is_empty() && user.live_sessions == 1);
}

async fn a_disable_wins_against_logins_in_flight(db: TestDb) {
    let mut admin = admin_app(&db, |_| {}).await;
    admin.app.register("erin", PASSWORD).await.unwrap();
    let client = admin.app.client.clone();
    let logins = (0..40).map(|_| {
        let mut client = client.clone();
        async move { crate::helpers::login(&mut client, "erin", PASSWORD).await }
    });
    let disable = admin.disable("erin", "compromised");
    let (results, disabled) = futures::join!(join_all(logins), disable);
    disabled.unwrap();
    // Whatever came first, no token issued to her is valid once the disable answered.
    let mut issued = 0;
    for result in results {
        match result {
            Ok(session) => {
                issued += 1;
                expect_code(
                    admin.app.validate(&session.access_token).await,
                    Code::Unauthenticated,
                );
                expect_code(
                    refresh(&mut admin.app, &session.refresh_token).await,
                    Code::Unauthenticated,
                );
            }
            // Refused as a wrong password, and counted as one by the login throttle,
            // which may then refuse the rest for a while.
            Err(status) => assert!(
                matches!(
                    status.code(),
                    Code::Unauthenticated | Code::ResourceExhausted
                ),
                "{status:?}"
            ),
        }
    }
    assert_eq!(
        admin.get(by_name("erin")).await.unwrap().live_sessions,
        0,
        "{issued} issued"
    );
}

async fn a_deleted_user_is_gone_and_its_name_can_be_registered_again(db: TestDb) {
    let mut admin = admin_app(&db, |_| {}).await;
    let old_id = admin.app.register("finn", PASSWORD).await.unwrap();
    let old = admin.app.login("finn", PASSWORD).await.unwrap();
    assert_eq!(admin.delete(by_name("finn")).await.unwrap(), 1);
    expect_code(admin.get(by_id(&old_id)).await, Code::NotFound);
    expect_code(admin.delete(by_id(&old_id)).await, Code::NotFound);
    expect_code(
        admin.app.validate(&old.access_token).await,
        Code::Unauthenticated,
    );
    expect_code(
        refresh(&mut admin.app, &old.refresh_token).await,
        Code::Unauthenticated,
    );
    expect_code(
        admin.app.login("finn", PASSWORD).await,
        Code::Unauthenticated,
    );

    let new_id = admin
        .app
        .register("Finn", "another fine password")
        .await
        .unwrap();
    assert_ne!(new_id, old_id);
    let new = admin
        .app
        .login("finn", "another fine password")
        .await
        .unwrap();
    assert_eq!(
        admin.app.validate(&new.access_token).await.unwrap().user_id,
        new_id
    );
    expect_code(
        admin.app.validate(&old.access_token).await,
        Code::Unauthenticated,
    );
}

async fn list_users_visits_every_user_once_while_users_are_added(db: TestDb) {
    let mut admin = admin_app(&db, |_| {}).await;
    let before: Vec<String> = (0..60).map(|i| format!("user-{i:03}")).collect();
    for name in &before {
        admin.app.register(name, PASSWORD).await.unwrap();
    }
    // Pages of 7 while 40 more users are registered, some before and some after
    // the page being read.
    let mut client = admin.app.client.clone();
    let adding = async move {
        for i in 0..40 {
            let name = if i % 2 == 0 {
                format!("a-new-{i}")
            } else {
                format!("zz-new-{i}")
            };
            crate::helpers::register(&mut client, &name, PASSWORD)
                .await
                .unwrap();
            // Not time to pass: room for the pages' reads between the registrations.
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    };
    let (listed, ()) = futures::join!(admin.all(7, "", DisabledFilter::Any), adding);
    let mut seen: HashMap<&str, usize> = HashMap::new();
    for name in &listed {
        *seen.entry(name.as_str()).or_default() += 1;
    }
    assert!(
        seen.values().all(|&n| n == 1),
        "a user listed twice: {listed:?}"
    );
    for name in &before {
        assert_eq!(seen.get(name.as_str()), Some(&1), "{name} missing");
    }
    let mut sorted = listed.clone();
    sorted.sort();
    assert_eq!(listed, sorted, "in username order");

    // A prefix, and the filters.
    let prefixed = admin.all(4, "USER-01", DisabledFilter::Any).await;
    assert_eq!(
        prefixed,
        (10..20).map(|i| format!("user-{i:03}")).collect::<Vec<_>>()
    );
    admin.disable("user-013", "test").await.unwrap();
    assert_eq!(
        admin.all(100, "user-01", DisabledFilter::Disabled).await,
        ["user-013"]
    );
    assert_eq!(
        admin
            .all(100, "user-01", DisabledFilter::Enabled)
            .await
            .len(),
        9
    );
    assert_eq!(admin.all(1000, "", DisabledFilter::Any).await.len(), 100);
}

async fn sessions_are_listed_and_ended_by_name_or_all(db: TestDb) {
    let mut admin = admin_app(&db, |_| {}).await;
    admin.app.register("ivy", PASSWORD).await.unwrap();
    admin.app.register("jon", PASSWORD).await.unwrap();
    let mut logins = Vec::new();
    for source in [2, 3, 4] {
        let mut client = crate::helpers::connect_from(
            admin.app.addr,
            std::net::Ipv4Addr::new(127, 0, 0, source),
        )
        .await;
        logins.push(
            crate::helpers::login(&mut client, "ivy", PASSWORD)
                .await
                .unwrap(),
        );
    }
    let jon = admin.app.login("jon", PASSWORD).await.unwrap();

    let sessions = admin.sessions("ivy").await.unwrap();
    let addresses: Vec<&str> = sessions.iter().map(|s| s.client_address.as_str()).collect();
    assert_eq!(
        addresses,
        ["127.0.0.4", "127.0.0.3", "127.0.0.2"],
        "newest first"
    );
    assert!(
        sessions
            .iter()
            .all(|s| s.started_at.is_some() && s.expires_at.is_some())
    );
    assert!(sessions.iter().all(|s| s.refreshed_at.is_none()));
    refresh(&mut admin.app, &logins[0].refresh_token)
        .await
        .unwrap();
    let refreshed = admin.sessions("ivy").await.unwrap();
    assert!(refreshed[2].refreshed_at.is_some());

    // By name: only the live sessions of this user end.
    let first = refreshed[2].id.clone();
    let jons = admin.sessions("jon").await.unwrap()[0].id.clone();
    let ended = admin
        .end_sessions("ivy", &[&first, &jons, "no-such-session"])
        .await
        .unwrap();
    assert_eq!(ended, 1);
    assert_eq!(admin.end_sessions("ivy", &[&first]).await.unwrap(), 0);
    assert_eq!(admin.sessions("ivy").await.unwrap().len(), 2);
    admin.app.validate(&jon.access_token).await.unwrap();
    admin.app.validate(&logins[1].access_token).await.unwrap();

    // All of them.
    assert_eq!(admin.end_sessions("ivy", &[]).await.unwrap(), 2);
    for login in &logins {
        expect_code(
            admin.app.validate(&login.access_token).await,
            Code::Unauthenticated,
        );
    }
    expect_code(
        refresh(&mut admin.app, &logins[2].refresh_token).await,
        Code::Unauthenticated,
    );
    assert!(admin.sessions("ivy").await.unwrap().is_empty());
    admin.app.validate(&jon.access_token).await.unwrap();
    // Her password still works: ending sessions is not disabling.
    admin.app.login("ivy", PASSWORD).await.unwrap();
    expect_code(admin.sessions("nobody").await, Code::NotFound);
}

async fn an_administrators_password_reset_follows_the_rules_and_ends_the_sessions(db: TestDb) {
    let mut admin = admin_app(&db, |_| {}).await;
    admin.app.register("kimberly-k", PASSWORD).await.unwrap();
    let before = admin.app.login("kimberly-k", PASSWORD).await.unwrap();

    // The rules and the blocklist apply; a read key may not.
    for bad in ["short", "password123", "KIMBERLY-K"] {
        let status = expect_code(
            admin
                .set_password("kimberly-k", bad, false, ADMIN_KEY)
                .await,
            Code::InvalidArgument,
        );
        assert_eq!(
            crate::helpers::violations(&status)[0].0,
            "new_password",
            "{bad}"
        );
    }
    expect_code(
        admin
            .set_password("kimberly-k", "a brand new secret", false, READ_KEY)
            .await,
        Code::PermissionDenied,
    );
    expect_code(
        admin
            .set_password("nobody", "a brand new secret", false, ADMIN_KEY)
            .await,
        Code::NotFound,
    );
    admin.app.validate(&before.access_token).await.unwrap();

    assert_eq!(
        admin
            .set_password("kimberly-k", "a brand new secret", false, ADMIN_KEY)
            .await
            .unwrap(),
        1
    );
    expect_code(
        admin.app.validate(&before.access_token).await,
        Code::Unauthenticated,
    );
    expect_code(
        admin.app.login("kimberly-k", PASSWORD).await,
        Code::Unauthenticated,
    );
    let after = admin
        .app
        .login("kimberly-k", "a brand new secret")
        .await
        .unwrap();

    // Told to keep them, the sessions live on.
    assert_eq!(
        admin
            .set_password("kimberly-k", "yet another secret", true, ADMIN_KEY)
            .await
            .unwrap(),
        0
    );
    admin.app.validate(&after.access_token).await.unwrap();
    admin
        .app
        .login("kimberly-k", "yet another secret")
        .await
        .unwrap();
    expect_code(
        admin.app.login("kimberly-k", "a brand new secret").await,
        Code::Unauthenticated,
    );
}

async fn a_restarted_server_still_refuses_what_was_revoked_before(db: TestDb) {
    let mut admin = admin_app(&db, |_| {}).await;
    admin.app.register("max", PASSWORD).await.unwrap();
    admin.app.register("nia", PASSWORD).await.unwrap();
    let max = admin.app.login("max", PASSWORD).await.unwrap();
    let nia = admin.app.login("nia", PASSWORD).await.unwrap();
    let nia_kept = admin.app.login("nia", PASSWORD).await.unwrap();
    admin.disable("max", "test").await.unwrap();
    let nia_id = admin.sessions("nia").await.unwrap();
    let oldest = nia_id.last().unwrap().id.clone();
    assert_eq!(admin.end_sessions("nia", &[&oldest]).await.unwrap(), 1);
    let Admin { app, _keys, .. } = admin;
    app.stop().await.unwrap();

    // A new server on the same database: the revocations were made before it.
    let mut again = spawn_app_on(&db, |_| {}).await;
    expect_code(
        again.validate(&max.access_token).await,
        Code::Unauthenticated,
    );
    expect_code(
        again.validate(&nia.access_token).await,
        Code::Unauthenticated,
    );
    again.validate(&nia_kept.access_token).await.unwrap();
}

/// PostgreSQL: a user disabled on one replica is refused by the other within the
/// revocation delay (polled here with a generous timeout), and its Login there
/// answers as a wrong password.
#[tokio::test]
async fn a_disable_on_one_replica_is_honoured_by_another() {
    let Some(db) = TestDb::new(Backend::Postgres, "admin_across_replicas").await else {
        return;
    };
    let delay = Duration::from_millis(200);
    let mut a = admin_app(&db, |c| c.tokens.revocation_delay = delay).await;
    let mut b = spawn_app_on(&db, |c| c.tokens.revocation_delay = delay).await;
    b.register("gus", PASSWORD).await.unwrap();
    b.register("hal", PASSWORD).await.unwrap();
    let gus = b.login("gus", PASSWORD).await.unwrap();
    let hal = b.login("hal", PASSWORD).await.unwrap();
    b.validate(&gus.access_token).await.unwrap();

    a.disable("gus", "test").await.unwrap();
    // Replica b refuses the token of a user disabled on a.
    b.until_refused(&gus.access_token).await;
    let wrong = expect_code(
        b.login("gus", "not his password").await,
        Code::Unauthenticated,
    );
    let right = expect_code(b.login("gus", PASSWORD).await, Code::Unauthenticated);
    assert_eq!(right.message(), wrong.message());
    // Only his.
    b.validate(&hal.access_token).await.unwrap();

    // Deleted on a: refused on b too, by the cutoff alone (his sessions are gone).
    a.delete(by_name("hal")).await.unwrap();
    b.until_refused(&hal.access_token).await;
    // Enabled on a: b lets him log in again, and his new token works on both.
    assert!(a.enable("gus").await.unwrap());
    let again = b.login("gus", PASSWORD).await.unwrap();
    a.app.validate(&again.access_token).await.unwrap();
    b.validate(&again.access_token).await.unwrap();
}
