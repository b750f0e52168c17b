//! A small gRPC server of the tests' own, on 127.0.0.1:0: grpc.health.v1 (SERVING)
//! and AuthService's Register, Login, ValidateToken and Refresh, each answering OK and
//! recording what its request carried (its user and `x-forwarded-for`). A login's
//! tokens are its username, so a validation or a refresh names its user too.
//!
//! Logins may be held: none is answered before `hold_logins` have arrived (or a few
//! seconds have passed, when they are counted as answered early), so a test can tell
//! that requests were all sent before any answer came.

use authbench::pb::{
    LoginRequest, LoginResponse, RefreshRequest, RefreshResponse, RegisterRequest,
    RegisterResponse, ValidateTokenRequest, ValidateTokenResponse,
};
use std::{
    convert::Infallible,
    net::SocketAddr,
    sync::{
        Arc, Mutex,
        atomic::{AtomicUsize, Ordering},
    },
    task::{Context, Poll},
    time::Duration,
};
use tokio::{sync::watch, task::JoinHandle};
use tonic::{
    Request, Response, Status,
    body::Body,
    codegen::BoxFuture,
    server::{Grpc, NamedService},
    transport::{Server, server::TcpIncoming},
};

/// How long a held login waits for the others.
const HOLD: Duration = Duration::from_secs(5);

/// One request as the server received it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Seen {
    /// The RPC's name: "Register", "Login", "ValidateToken", "Refresh".
    pub method: &'static str,
    /// The username it registered or logged in, or whose token it presented.
    pub username: String,
    pub forwarded_for: Option<String>,
}

struct State {
    seen: Mutex<Vec<Seen>>,
    hold_logins: usize,
    logins: watch::Sender<usize>,
    answered_early: AtomicUsize,
}

impl State {
    fn note<T>(&self, method: &'static str, username: &str, request: &Request<T>) {
        let forwarded_for = request
            .metadata()
            .get("x-forwarded-for")
            .map(|value| value.to_str().unwrap().to_owned());
        self.seen.lock().unwrap().push(Seen {
            method,
            username: username.to_owned(),
            forwarded_for,
        });
    }
}

pub struct GrpcServer {
    pub addr: SocketAddr,
    state: Arc<State>,
    task: JoinHandle<()>,
}

impl GrpcServer {
    /// A server that holds every login until `hold_logins` have arrived (0: none held).
    pub async fn start(hold_logins: usize) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let state = Arc::new(State {
            seen: Mutex::default(),
            hold_logins,
            logins: watch::Sender::new(0),
            answered_early: AtomicUsize::new(0),
        });
        let (_, health) = tonic_health::server::health_reporter();
        let auth = Auth(state.clone());
        let task = tokio::spawn(async move {
            Server::builder()
                .add_service(health)
                .add_service(auth)
                .serve_with_incoming(TcpIncoming::from(listener))
                .await
                .unwrap();
        });
        Self { addr, state, task }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The requests of `method` received so far, in order of arrival.
    pub fn seen(&self, method: &str) -> Vec<Seen> {
        let seen = self.state.seen.lock().unwrap();
        seen.iter()
            .filter(|s| s.method == method)
            .cloned()
            .collect()
    }

    /// Forgets the requests received so far.
    pub fn forget(&self) {
        self.state.seen.lock().unwrap().clear();
    }

    /// Held logins answered because the others did not all arrive within [`HOLD`].
    pub fn answered_early(&self) -> usize {
        self.state.answered_early.load(Ordering::SeqCst)
    }
}

impl Drop for GrpcServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

#[derive(Clone)]
struct Auth(Arc<State>);

impl NamedService for Auth {
    const NAME: &'static str = "auth.v1.AuthService";
}

impl tower::Service<http::Request<Body>> for Auth {
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = BoxFuture<Self::Response, Self::Error>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<Body>) -> Self::Future {
        let state = self.0.clone();
        Box::pin(async move {
            let answer = match request.uri().path() {
                "/auth.v1.AuthService/Register" => {
                    let register = move |r: Request<RegisterRequest>| {
                        state.note("Register", &r.get_ref().username, &r);
                        async { Ok::<_, Status>(Response::new(RegisterResponse::default())) }
                    };
                    unary(tower::service_fn(register), request).await
                }
                "/auth.v1.AuthService/Login" => {
                    let login = move |r: Request<LoginRequest>| {
                        let state = state.clone();
                        async move {
                            let username = r.get_ref().username.clone();
                            state.note("Login", &username, &r);
                            state.logins.send_modify(|n| *n += 1);
                            let mut arrived = state.logins.subscribe();
                            let all = arrived.wait_for(|n| *n >= state.hold_logins);
                            if tokio::time::timeout(HOLD, all).await.is_err() {
                                state.answered_early.fetch_add(1, Ordering::SeqCst);
                            }
                            Ok::<_, Status>(Response::new(LoginResponse {
                                access_token: username.clone(),
                                refresh_token: username,
                                ..Default::default()
                            }))
                        }
                    };
                    unary(tower::service_fn(login), request).await
                }
                "/auth.v1.AuthService/ValidateToken" => {
                    let validate = move |r: Request<ValidateTokenRequest>| {
                        state.note("ValidateToken", &r.get_ref().access_token, &r);
                        async { Ok::<_, Status>(Response::new(ValidateTokenResponse::default())) }
                    };
                    unary(tower::service_fn(validate), request).await
                }
                "/auth.v1.AuthService/Refresh" => {
                    let refresh = move |r: Request<RefreshRequest>| {
                        let username = r.get_ref().refresh_token.clone();
                        state.note("Refresh", &username, &r);
                        async move {
                            Ok::<_, Status>(Response::new(RefreshResponse {
                                access_token: username.clone(),
                                refresh_token: username,
                                ..Default::default()
                            }))
                        }
                    };
                    unary(tower::service_fn(refresh), request).await
                }
                _ => Status::unimplemented("not in this test server").into_http(),
            };
            Ok(answer)
        })
    }
}

/// Serves one unary call with `service`, its messages in protobuf.
async fn unary<Q, A, S>(service: S, request: http::Request<Body>) -> http::Response<Body>
where
    Q: prost::Message + Default + Send + 'static,
    A: prost::Message + Send + 'static,
    S: tonic::server::UnaryService<Q, Response = A>,
{
    Grpc::new(tonic_prost::ProstCodec::<A, Q>::default())
        .unary(service, request)
        .await
}
