//! HTTP forward-auth: `/forward-auth` on its own port, asked directly, and through a
//! real nginx (`auth_request`, Debian's nginx-light) in front of an upstream this
//! test runs, which echoes the headers it receives. A valid token reaches the
//! upstream with the identity headers (the client's forged ones replaced); a bad,
//! expired, ended or missing token gets 401 with its `WWW-Authenticate` and never
//! reaches the upstream; a route that needs a second factor answers 403.
//!
//! nginx runs as the current user on a free 127.0.0.1 port, with its pid, logs and
//! temporary files in a directory of its own, in the foreground, killed at the end.
//! Without nginx the test is skipped (one line), unless AUTHD_TEST_REQUIRE_SERVICES=1.

use crate::extauthz::{assert_decisions, signed_token};
use crate::helpers::{TestApp, http_get, metric, skipped, spawn_app_with};
use authd::pb::LogoutRequest;
use std::{
    net::SocketAddr,
    path::Path,
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
};

const PASSWORD: &str = "a fine password";

async fn app() -> (TestApp, SocketAddr) {
    let app = spawn_app_with(|c| {
        c.authz.forward_auth_listen = "127.0.0.1:0".parse().unwrap();
    })
    .await;
    let addr = app.handle.forward_auth_addr().expect("forward-auth is on");
    (app, addr)
}

/// The value of header `name` (lowercase) in a response head.
fn header<'a>(head: &'a str, name: &str) -> Option<&'a str> {
    head.lines().skip(1).find_map(|line| {
        let (n, v) = line.split_once(':')?;
        n.eq_ignore_ascii_case(name).then(|| v.trim())
    })
}

fn status(head: &str) -> u16 {
    head.split_whitespace().nth(1).unwrap().parse().unwrap()
}

#[tokio::test]
async fn forward_auth_answers_with_the_identity_or_a_challenge() {
    let (mut app, addr) = app().await;
    let user_id = app.register("fay", PASSWORD).await.unwrap();
    let token = app.login("fay", PASSWORD).await.unwrap().access_token;
    let auth = format!("Authorization: Bearer {token}\r\n");

    let (head, body) = http_get(addr, "/forward-auth", &auth).await;
    assert_eq!(status(&head), 200, "{head}");
    assert_eq!(header(&head, "x-authd-user-id"), Some(user_id.as_str()));
    assert_eq!(header(&head, "x-authd-username"), Some("fay"));
    assert_eq!(header(&head, "x-authd-amr"), Some("pwd"));
    assert_eq!(header(&head, "cache-control"), Some("no-store"));
    assert!(body.is_empty());

    let (head, _) = http_get(addr, "/forward-auth", "").await;
    assert_eq!(status(&head), 401, "{head}");
    assert_eq!(
        header(&head, "www-authenticate"),
        Some(r#"Bearer realm="authd""#)
    );
    let (head, _) = http_get(addr, "/forward-auth?allow_anonymous=true", "").await;
    assert_eq!(status(&head), 200, "{head}");
    assert_eq!(header(&head, "x-authd-user-id"), None);
    let (head, _) = http_get(addr, "/forward-auth?require_second_factor=true", &auth).await;
    assert_eq!(status(&head), 403, "{head}");
    assert_eq!(
        header(&head, "www-authenticate"),
        Some(r#"Bearer realm="authd", error="insufficient_user_authentication""#)
    );
    // Two credentials: refused, whichever the upstream would have read.
    let twice = format!("{auth}Authorization: Bearer x\r\n");
    let (head, _) = http_get(addr, "/forward-auth", &twice).await;
    assert_eq!(status(&head), 401, "{head}");
    assert_eq!(
        header(&head, "www-authenticate"),
        Some(r#"Bearer realm="authd", error="invalid_token""#)
    );
    // A misconfigured route fails closed.
    let (head, _) = http_get(addr, "/forward-auth?allow_anonymous=yes", "").await;
    assert_eq!(status(&head), 500, "{head}");
    assert_eq!(header(&head, "www-authenticate"), None);
    // Under the prefix (Envoy's HTTP mode) the query is the client's: not read.
    let (head, _) = http_get(addr, "/forward-auth/orders?allow_anonymous=true", "").await;
    assert_eq!(status(&head), 401, "{head}");
    let (head, _) = http_get(addr, "/forward-auth/orders/1", &auth).await;
    assert_eq!(status(&head), 200, "{head}");
    // Nothing else is served there.
    let (head, _) = http_get(addr, "/metrics", "").await;
    assert_eq!(status(&head), 404, "{head}");

    let expected = [
        ("allow", "valid", 2.0),
        ("allow", "anonymous", 1.0),
        ("deny", "missing_token", 2.0),
        ("deny", "second_factor_required", 1.0),
        ("deny", "malformed", 1.0),
        ("deny", "bad_policy", 1.0),
    ];
    assert_decisions(&app, "http", &expected);
}

/// nginx, when installed: `/usr/sbin/nginx` or on the PATH.
fn nginx() -> Option<std::path::PathBuf> {
    let candidates = ["/usr/sbin/nginx", "/usr/local/sbin/nginx", "/usr/bin/nginx"];
    candidates
        .iter()
        .map(std::path::PathBuf::from)
        .find(|p| p.is_file())
}

/// A running nginx, killed on drop: one process (`master_process off`), so killing
/// it leaves no worker behind, still listening.
struct Nginx {
    child: std::process::Child,
    addr: SocketAddr,
    _dir: tempfile::TempDir,
}

impl Drop for Nginx {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The nginx configuration of the test, as deploy/nginx/authd.conf's: auth_request
/// against authd's forward-auth port, the identity headers passed on (replacing the
/// client's, deploy/nginx/authd-identity.conf), a route that needs a second factor,
/// the challenge of a 403 passed on too.
fn nginx_config(dir: &Path, listen: SocketAddr, authd: SocketAddr, upstream: SocketAddr) -> String {
    let dir = dir.display();
    format!(
        r#"daemon off;
master_process off;
pid {dir}/nginx.pid;
error_log {dir}/error.log info;
events {{ worker_connections 64; }}
http {{
    access_log {dir}/access.log;
    client_body_temp_path {dir}/body;
    proxy_temp_path {dir}/proxy;
    fastcgi_temp_path {dir}/fastcgi;
    uwsgi_temp_path {dir}/uwsgi;
    scgi_temp_path {dir}/scgi;
    server {{
        listen {listen};
        location = /_authd {{
            internal;
            proxy_pass http://{authd}/forward-auth;
            proxy_pass_request_body off;
            proxy_set_header Content-Length "";
        }}
        location = /_authd_otp {{
            internal;
            proxy_pass http://{authd}/forward-auth?require_second_factor=true;
            proxy_pass_request_body off;
            proxy_set_header Content-Length "";
        }}
        location / {{
            auth_request /_authd;
            include {dir}/identity.conf;
            proxy_pass http://{upstream};
        }}
        location /admin/ {{
            auth_request /_authd_otp;
            include {dir}/identity.conf;
            error_page 403 = @forbidden;
            proxy_pass http://{upstream};
        }}
        location @forbidden {{
            add_header WWW-Authenticate $authd_challenge always;
            return 403;
        }}
    }}
}}
"#
    )
}

async fn start_nginx(authd: SocketAddr, upstream: SocketAddr) -> Option<Nginx> {
    let Some(binary) = nginx() else {
        let what = "nginx is not installed (apt-get install nginx-light)";
        skipped("the nginx auth_request test", what);
        return None;
    };
    let dir = tempfile::tempdir().unwrap();
    // The workers may run as another user when the test runs as root.
    {
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    // A free port: bound, read, released (nginx binds it a moment later).
    let listen = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    // The identity headers exactly as shipped.
    let shipped = Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/nginx/authd-identity.conf");
    std::fs::copy(shipped, dir.path().join("identity.conf")).unwrap();
    let config = dir.path().join("nginx.conf");
    std::fs::write(&config, nginx_config(dir.path(), listen, authd, upstream)).unwrap();
    let child = std::process::Command::new(binary)
        .arg("-p")
        .arg(dir.path())
        .arg("-c")
        .arg(&config)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("nginx starts");
    let nginx = Nginx {
        child,
        addr: listen,
        _dir: dir,
    };
    // Ready when it accepts.
    let log = nginx._dir.path().join("error.log");
    let what = format!("nginx listens on {listen} (its log: {})", log.display());
    crate::helpers::wait_for(&what, || async {
        tokio::net::TcpStream::connect(listen).await.ok().map(drop)
    })
    .await;
    Some(nginx)
}

/// An upstream that answers every request with the headers it received, one
/// `name: value` a line, and counts the requests that reached it.
async fn echo_upstream() -> (SocketAddr, Arc<AtomicUsize>) {
    let reached = Arc::new(AtomicUsize::new(0));
    let counter = reached.clone();
    let router = axum::Router::new().fallback(move |headers: axum::http::HeaderMap| {
        let counter = counter.clone();
        async move {
            counter.fetch_add(1, Ordering::SeqCst);
            headers
                .iter()
                .map(|(n, v)| format!("{}: {}\n", n, v.to_str().unwrap_or("?")))
                .collect::<String>()
        }
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, router).await });
    (addr, reached)
}

#[tokio::test]
async fn nginx_auth_request_passes_the_identity_and_nothing_forged() {
    let (mut app, authd) = app().await;
    let (upstream, reached) = echo_upstream().await;
    let Some(nginx) = start_nginx(authd, upstream).await else {
        return;
    };
    let user_id = app.register("gus", PASSWORD).await.unwrap();
    let login = app.login("gus", PASSWORD).await.unwrap();

    // A valid token, with forged identity headers beside it.
    let forged = format!(
        "Authorization: Bearer {}\r\nX-Authd-User-Id: forged\r\nX-Authd-Username: root\r\nX-Authd-Amr: pwd,otp\r\n",
        login.access_token
    );
    let (head, body) = http_get(nginx.addr, "/orders/1", &forged).await;
    assert_eq!(status(&head), 200, "{head}\n{body}");
    let echoed = |name: &str| -> Vec<&str> {
        body.lines()
            .filter_map(|l| l.strip_prefix(&format!("{name}: ")))
            .collect()
    };
    assert_eq!(echoed("x-authd-user-id"), [user_id.as_str()], "{body}");
    assert_eq!(echoed("x-authd-username"), ["gus"], "{body}");
    assert_eq!(echoed("x-authd-session-id"), [login.session_id.as_str()]);
    assert_eq!(echoed("x-authd-amr"), ["pwd"], "{body}");
    assert!(!body.contains("forged") && !body.contains("root"), "{body}");
    assert_eq!(reached.load(Ordering::SeqCst), 1);

    // Refused: never reaches the upstream, the challenge reaches the client.
    let expired = signed_token(&user_id, "gus", -3600, &["pwd"]);
    let mut tampered = login.access_token.clone();
    tampered.truncate(tampered.len() - 4);
    tampered.push_str("AAAA");
    let invalid = r#"Bearer realm="authd", error="invalid_token""#;
    for (what, headers, challenge) in [
        ("missing", String::new(), r#"Bearer realm="authd""#),
        (
            "forged identity only",
            "X-Authd-User-Id: forged\r\n".to_owned(),
            r#"Bearer realm="authd""#,
        ),
        (
            "expired",
            format!("Authorization: Bearer {expired}\r\n"),
            invalid,
        ),
        (
            "tampered",
            format!("Authorization: Bearer {tampered}\r\n"),
            invalid,
        ),
    ] {
        let (head, _) = http_get(nginx.addr, "/orders/1", &headers).await;
        assert_eq!(status(&head), 401, "{what}: {head}");
        assert_eq!(
            header(&head, "www-authenticate"),
            Some(challenge),
            "{what}: {head}"
        );
    }
    // The route that needs a second factor: 403 with the RFC 9470 challenge.
    let auth = format!("Authorization: Bearer {}\r\n", login.access_token);
    let (head, _) = http_get(nginx.addr, "/admin/users", &auth).await;
    assert_eq!(status(&head), 403, "{head}");
    assert_eq!(
        header(&head, "www-authenticate"),
        Some(r#"Bearer realm="authd", error="insufficient_user_authentication""#),
        "{head}"
    );
    // An ended session: refused at once.
    app.client
        .logout(LogoutRequest {
            access_token: login.access_token.clone(),
            ..Default::default()
        })
        .await
        .unwrap();
    let (head, _) = http_get(nginx.addr, "/orders/1", &auth).await;
    assert_eq!(status(&head), 401, "{head}");
    assert_eq!(header(&head, "www-authenticate"), Some(invalid));
    assert_eq!(
        reached.load(Ordering::SeqCst),
        1,
        "only the allowed request"
    );

    let metrics = app.handle.render_metrics();
    let denied = r#"authd_authz_decisions_total{api="http",outcome="deny",reason="revoked"}"#;
    assert_eq!(metric(&metrics, denied), Some(1.0), "{metrics}");
    // Stopped, it leaves nothing behind still listening.
    let addr = nginx.addr;
    drop(nginx);
    assert!(
        std::net::TcpStream::connect(addr).is_err(),
        "nginx still listens on {addr} once stopped"
    );
}
