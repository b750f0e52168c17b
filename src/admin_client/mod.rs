//! `authd admin`: the command-line client of the admin API,
//! `auth.admin.v1.AdminService` (docs/admin.md).
//!
//! A command reads what it needs first (the admin key, a new password), connects to
//! the admin port (`--addr`, by default loopback on the port of `AUTHD_ADMIN_LISTEN`;
//! TLS as `authd health` speaks it, through `client`), makes its call (or, for
//! `users list --all`, one call a page), prints the answer and ends with an exit
//! status scripts can rely on (`EXIT_STATUS` in config): 0 done, 1 refused by the
//! server, 2 a usage error, 3 no answer. A failure is one line on stderr.
//!
//! The admin key travels as `authorization: Bearer KEY`, marked sensitive (HTTP/2
//! never indexes it); it is printed nowhere: not in an answer, an error or a log.
//! This module is a client: it owns nothing of the server and imports none of it.
//!
//! # Layout
//!
//! - this file: the connection, the calls, the failures and their exit status.
//! - `events`: `events tail`, WatchEvents printed as events arrive.
//! - `import`: `users import`, JSON Lines streamed to ImportUsers.
//! - `input`: the new password of `set-password`, from standard input or a file.
//! - `service`: `service-accounts …`, the service accounts' calls and answers.
//! - `view`: what is printed: tables and lines for people, JSON for scripts.

mod events;
mod import;
mod input;
mod service;
mod view;

use crate::{
    client::{self, BadEndpoint, ClientTls},
    config::{
        AdminAction, AdminCommand, Config, EventsAction, ServiceAccountsAction, SessionsAction,
        UserArg, UsersAction,
    },
    pb::admin::{
        DeleteUserRequest, DisableUserRequest, DisabledFilter, EnableUserRequest,
        EndSessionsRequest, GetUserRequest, ListSessionsRequest, ListUsersRequest,
        RemoveSecondFactorsRequest, SetPasswordRequest, User, UserSelector,
        admin_service_client::AdminServiceClient, user_selector::Selector,
    },
};
use std::{fmt, future::Future, io::Write as _, process::ExitCode, time::Duration};
use tonic::{
    Code, Request, Response, Status,
    metadata::{AsciiMetadataValue, MetadataValue},
    transport::Channel,
};

/// The exit status of a call the server refused.
pub const REFUSED: u8 = 1;
/// The exit status of a usage error (clap's own are 2 as well).
pub const USAGE: u8 = 2;
/// The exit status when no answer came: no connection, a timeout, UNAVAILABLE, a
/// connection that failed during the call.
pub const NO_ANSWER: u8 = 3;

/// The pages `users list --all` asks for when no `--page-size` is given: the most the
/// server gives, for the fewest calls.
const ALL_PAGE_SIZE: u32 = 1000;

/// Why a command failed; `Display` is the one line printed on stderr.
#[derive(Debug)]
enum Failure {
    /// The server answered with an error status.
    Refused(Status),
    /// No answer: no connection, the timeout passed, UNAVAILABLE, or the connection
    /// failed during the call.
    NoAnswer(String),
    /// The command cannot be run as given.
    Usage(String),
    /// The answer could not be written on stdout.
    Output(std::io::Error),
    /// An import whose lines were answered, some refused: the summary goes on
    /// stdout, the count on stderr.
    LinesRefused { summary: String, refused: u64 },
    /// An import the server stopped (a conflict with --on-conflict fail, an error):
    /// the summary of what was answered, and why.
    Stopped {
        summary: String,
        cause: Box<Failure>,
    },
}

impl Failure {
    fn exit_status(&self) -> u8 {
        match self {
            Failure::Refused(_) | Failure::Output(_) | Failure::LinesRefused { .. } => REFUSED,
            Failure::Stopped { cause, .. } => cause.exit_status(),
            Failure::Usage(_) => USAGE,
            Failure::NoAnswer(_) => NO_ANSWER,
        }
    }
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Failure::Refused(status) => {
                let code = crate::metrics::CODE_NAMES
                    .get(status.code() as usize)
                    .copied()
                    .unwrap_or("UNKNOWN");
                let message = status.message().replace(['\r', '\n'], " ");
                if status.code() == Code::Unimplemented && message.is_empty() {
                    // What a port answers that does not serve the admin API at all.
                    return write!(
                        f,
                        "{code}: the server does not serve auth.admin.v1.AdminService there \
                         (is --addr the admin port, AUTHD_ADMIN_LISTEN?)"
                    );
                }
                write!(f, "{code}: {message}")?;
                if status.code() == Code::ResourceExhausted {
                    use tonic_types::StatusExt as _;
                    let details = status.get_error_details();
                    if let Some(delay) = details.retry_info().and_then(|r| r.retry_delay) {
                        write!(f, " (retry in {})", humantime::format_duration(delay))?;
                    }
                }
                Ok(())
            }
            Failure::NoAnswer(why) | Failure::Usage(why) => f.write_str(why),
            Failure::Output(e) => write!(f, "cannot write the answer on stdout: {e}"),
            Failure::LinesRefused { refused, .. } => {
                write!(f, "{refused} lines refused (each printed with its number)")
            }
            Failure::Stopped { cause, .. } => write!(f, "the import stopped: {cause}"),
        }
    }
}

/// `authd admin …`: runs the command, prints its answer on stdout or one line on
/// stderr, and returns its exit status.
pub async fn run(config: &Config, command: &AdminCommand) -> ExitCode {
    let done = match execute(config, command).await {
        Ok(answer) => {
            let mut stdout = std::io::stdout().lock();
            stdout
                .write_all(answer.as_bytes())
                .and_then(|()| stdout.flush())
                .map_err(Failure::Output)
        }
        Err(failure) => Err(failure),
    };
    match done {
        Ok(()) => ExitCode::SUCCESS,
        Err(failure) => {
            if let Failure::LinesRefused { summary, .. } | Failure::Stopped { summary, .. } =
                &failure
            {
                let mut stdout = std::io::stdout().lock();
                let _ = stdout
                    .write_all(summary.as_bytes())
                    .and_then(|()| stdout.flush());
            }
            eprintln!("authd: error: {failure}");
            ExitCode::from(failure.exit_status())
        }
    }
}

/// Runs the command: its answer, as printed.
async fn execute(config: &Config, command: &AdminCommand) -> Result<String, Failure> {
    let connection = &command.connection;
    let as_json = connection.json;
    // What the command needs from here first: a usage error costs no connection.
    let key = connection.key().map_err(Failure::Usage)?;
    let new_password = match &command.action {
        AdminAction::SetPassword { password_file, .. } => {
            Some(input::new_password(password_file.as_deref()).map_err(Failure::Usage)?)
        }
        _ => None,
    };
    let input = match &command.action {
        AdminAction::Users(UsersAction::Import { file, .. }) => {
            Some(import::Input::open(file).map_err(Failure::Usage)?)
        }
        _ => None,
    };
    if let AdminAction::ServiceAccounts(ServiceAccountsAction::Delete { yes: false, .. }) =
        &command.action
    {
        return Err(Failure::Usage(
            "`service-accounts delete` erases the account and its credentials for good: \
             add --yes to do it"
                .into(),
        ));
    }
    if let AdminAction::ServiceAccounts(ServiceAccountsAction::Create { jwt, .. }) = &command.action
    {
        for binding in jwt {
            service::jwt_binding(binding).map_err(Failure::Usage)?;
        }
    }
    if let AdminAction::Users(UsersAction::Delete { yes: false, .. }) = &command.action {
        return Err(Failure::Usage(
            "`users delete` erases the account and its sessions for good: \
             add --yes to do it"
                .into(),
        ));
    }
    let addr = match &connection.addr {
        Some(addr) => addr.clone(),
        None => match config.admin.admin_listen.addr() {
            Some(listen) => client::local_addr(listen).to_string(),
            None => {
                return Err(Failure::Usage(
                    "no --addr, and AUTHD_ADMIN_LISTEN (--admin-listen) is off: \
                     give --addr HOST:PORT of the admin port"
                        .into(),
                ));
            }
        },
    };
    let tls = ClientTls {
        ca: connection.tls_ca.clone(),
        cert: connection.tls_cert.clone(),
        key: connection.tls_key.clone(),
        server_name: connection.tls_server_name.clone(),
    };
    let admin = Admin::connect(&addr, connection.timeout, &tls, key.expose()).await?;

    match &command.action {
        AdminAction::ServiceAccounts(action) => service::run(&admin, action, as_json).await,
        AdminAction::Users(UsersAction::List {
            prefix,
            disabled,
            enabled,
            page_size,
            page_token,
            all,
        }) => {
            let filter = match (disabled, enabled) {
                (true, _) => DisabledFilter::Disabled,
                (_, true) => DisabledFilter::Enabled,
                _ => DisabledFilter::Any,
            };
            let page_size = page_size.unwrap_or(if *all { ALL_PAGE_SIZE } else { 0 });
            let mut users = Vec::new();
            let mut token = page_token.clone().unwrap_or_default();
            loop {
                let request = ListUsersRequest {
                    page_size,
                    page_token: token.clone(),
                    username_prefix: prefix.clone().unwrap_or_default(),
                    disabled: filter as i32,
                };
                let page = admin
                    .answer(admin.client().list_users(admin.request(request)))
                    .await?;
                users.extend(page.users);
                if !page.next_page_token.is_empty() && page.next_page_token == token {
                    // A server that gives the same page again would keep this loop going.
                    return Err(Failure::Refused(Status::internal(
                        "the server gave the same page token again",
                    )));
                }
                token = page.next_page_token;
                if !*all || token.is_empty() {
                    break;
                }
            }
            if !token.is_empty() && !as_json {
                // For people, who see no token in the table: how to see the rest.
                eprintln!(
                    "authd: more users than this page: --all lists every page, \
                     --page-token {token} the next one"
                );
            }
            Ok(view::users(&users, &token, as_json))
        }
        AdminAction::Users(UsersAction::Get { user }) => {
            let request = GetUserRequest {
                user: selector(user),
            };
            let answer = admin
                .answer(admin.client().get_user(admin.request(request)))
                .await?;
            Ok(view::user(&present(answer.user)?, as_json))
        }
        AdminAction::Users(UsersAction::Disable { user, reason }) => {
            let request = DisableUserRequest {
                user: selector(user),
                reason: reason.clone(),
            };
            let answer = admin
                .answer(admin.client().disable_user(admin.request(request)))
                .await?;
            let user = present(answer.user)?;
            Ok(view::disabled(
                &user,
                answer.changed,
                answer.sessions_ended,
                as_json,
            ))
        }
        AdminAction::Users(UsersAction::Enable { user }) => {
            let request = EnableUserRequest {
                user: selector(user),
            };
            let answer = admin
                .answer(admin.client().enable_user(admin.request(request)))
                .await?;
            Ok(view::enabled(
                &present(answer.user)?,
                answer.changed,
                as_json,
            ))
        }
        AdminAction::Users(UsersAction::RemoveSecondFactors { user }) => {
            let request = RemoveSecondFactorsRequest {
                user: selector(user),
            };
            let answer = admin
                .answer(admin.client().remove_second_factors(admin.request(request)))
                .await?;
            Ok(view::second_factors_removed(
                &present(answer.user)?,
                answer.changed,
                as_json,
            ))
        }
        AdminAction::Events(EventsAction::Tail {
            from,
            oldest,
            count,
        }) => events::tail(&admin, *from, *oldest, *count, as_json).await,
        AdminAction::Users(UsersAction::Import { on_conflict, .. }) => {
            let Some(input) = input else {
                return Err(Failure::Usage("no input".into()));
            };
            import::run(&admin, input, *on_conflict, as_json).await
        }
        AdminAction::Users(UsersAction::Delete { user, .. }) => {
            let request = DeleteUserRequest {
                user: selector(user),
            };
            let answer = admin
                .answer(admin.client().delete_user(admin.request(request)))
                .await?;
            let user = present(answer.user)?;
            Ok(view::deleted(&user, answer.sessions_ended, as_json))
        }
        AdminAction::Sessions(SessionsAction::List { user }) => {
            let request = ListSessionsRequest {
                user: selector(user),
            };
            let answer = admin
                .answer(admin.client().list_sessions(admin.request(request)))
                .await?;
            Ok(view::session_list(&answer.sessions, as_json))
        }
        AdminAction::Sessions(SessionsAction::End { user, sessions }) => {
            let request = EndSessionsRequest {
                user: selector(user),
                session_ids: sessions.clone(),
            };
            let answer = admin
                .answer(admin.client().end_sessions(admin.request(request)))
                .await?;
            Ok(view::sessions_ended(
                &target(user),
                answer.sessions_ended,
                as_json,
            ))
        }
        AdminAction::SetPassword {
            user,
            keep_sessions,
            ..
        } => {
            let request = SetPasswordRequest {
                user: selector(user),
                new_password: new_password.unwrap_or_default(),
                keep_sessions: *keep_sessions,
            };
            let answer = admin
                .answer(admin.client().set_password(admin.request(request)))
                .await?;
            Ok(view::password_set(
                &target(user),
                answer.sessions_ended,
                *keep_sessions,
                as_json,
            ))
        }
    }
}

/// The selector of the account a command names.
fn selector(user: &UserArg) -> Option<UserSelector> {
    let selector = match (&user.id, &user.username) {
        (Some(id), _) => Selector::UserId(id.clone()),
        (None, Some(name)) => Selector::Username(name.clone()),
        // clap requires one of the two.
        (None, None) => return None,
    };
    Some(UserSelector {
        selector: Some(selector),
    })
}

/// The account a command names, as a person reads it: `alice`, or `id 0190…`.
fn target(user: &UserArg) -> String {
    match (&user.id, &user.username) {
        (Some(id), _) => format!("id {id}"),
        (None, Some(name)) => name.clone(),
        (None, None) => "the user".into(),
    }
}

/// The user an answer must hold.
fn present(user: Option<User>) -> Result<User, Failure> {
    user.ok_or_else(|| Failure::Refused(Status::internal("the server's answer holds no user")))
}

/// A connection to the admin port, and what every call carries.
struct Admin {
    client: AdminServiceClient<Channel>,
    /// `Bearer KEY`, marked sensitive.
    authorization: AsciiMetadataValue,
    addr: String,
    timeout: Duration,
}

impl Admin {
    /// Connects to `addr` within `timeout`.
    async fn connect(
        addr: &str,
        timeout: Duration,
        tls: &ClientTls,
        key: &str,
    ) -> Result<Self, Failure> {
        let mut authorization: AsciiMetadataValue =
            MetadataValue::try_from(format!("Bearer {key}"))
                // The key's characters were checked when it was read; the error quotes nothing.
                .map_err(|_| Failure::Usage("the admin key cannot be sent in a header".into()))?;
        authorization.set_sensitive(true);
        let endpoint = client::endpoint(addr, timeout, tls).map_err(|bad| match bad {
            BadEndpoint::Address(cause) => Failure::Usage(format!("--addr {addr:?}: {cause}")),
            BadEndpoint::Tls(cause) => Failure::Usage(cause),
        })?;
        let channel = match tokio::time::timeout(timeout, endpoint.connect()).await {
            Ok(Ok(channel)) => channel,
            Ok(Err(e)) => {
                return Err(Failure::NoAnswer(format!(
                    "{addr}: cannot connect: {}",
                    client::error_chain(&e)
                )));
            }
            Err(_) => return Err(Self::timeout(addr, timeout)),
        };
        let client = AdminServiceClient::new(channel);
        Ok(Self {
            client,
            authorization,
            addr: addr.to_owned(),
            timeout,
        })
    }

    fn timeout(addr: &str, after: Duration) -> Failure {
        Failure::NoAnswer(format!(
            "{addr}: timeout: no answer within {}",
            humantime::format_duration(after)
        ))
    }

    /// A client for one call (a handle on the one connection).
    fn client(&self) -> AdminServiceClient<Channel> {
        self.client.clone()
    }

    /// `message` with the key and the timeout (sent as `grpc-timeout`, so the server
    /// gives up when this client does).
    fn request<T>(&self, message: T) -> Request<T> {
        let mut request = Request::new(message);
        (request.metadata_mut()).insert("authorization", self.authorization.clone());
        request.set_timeout(self.timeout);
        request
    }

    /// The answer of a call, within the timeout.
    async fn answer<R>(
        &self,
        call: impl Future<Output = Result<Response<R>, Status>>,
    ) -> Result<R, Failure> {
        match tokio::time::timeout(self.timeout, call).await {
            Ok(Ok(response)) => Ok(response.into_inner()),
            Ok(Err(status)) => Err(failure(&self.addr, self.timeout, status)),
            Err(_) => Err(Self::timeout(&self.addr, self.timeout)),
        }
    }
}

/// What a call's error status means: the server's refusal, or no answer.
fn failure(addr: &str, timeout: Duration, status: Status) -> Failure {
    if client::timed_out(&status) {
        return Admin::timeout(addr, timeout);
    }
    // The connection broke, or the server cannot serve now (its database is
    // unreachable, it is stopping): no answer to the question asked.
    if status.code() == Code::Unavailable {
        return Failure::NoAnswer(format!("{addr}: UNAVAILABLE: {}", status.message()));
    }
    // A status made on this side from a transport failure (it has the error as its
    // source; a status the server sent has none): plaintext to a TLS port, a
    // connection reset. The server said nothing about the call.
    if let Some(cause) = std::error::Error::source(&status) {
        let cause = client::error_chain(cause);
        let message = status.message();
        // Transport errors nest the same text: say it once.
        let why = if cause.starts_with(message) {
            cause
        } else if message.contains(&cause) {
            message.to_owned()
        } else {
            format!("{message}: {cause}")
        };
        return Failure::NoAnswer(format!("{addr}: no answer: {why}"));
    }
    Failure::Refused(status)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_failure_is_one_line_naming_the_code() {
        let refused = Failure::Refused(Status::not_found("no such user"));
        assert_eq!(refused.to_string(), "NOT_FOUND: no such user");
        assert_eq!(refused.exit_status(), REFUSED);
        let odd = Failure::Refused(Status::permission_denied("two\nlines"));
        assert_eq!(odd.to_string(), "PERMISSION_DENIED: two lines");
        let elsewhere = Failure::Refused(Status::unimplemented(""));
        assert!(elsewhere.to_string().contains("admin port"), "{elsewhere}");
        assert_eq!(Failure::Usage("x".into()).exit_status(), USAGE);
        assert_eq!(Failure::NoAnswer("x".into()).exit_status(), NO_ANSWER);
        assert_eq!(
            Admin::timeout("127.0.0.1:1", Duration::from_secs(10)).to_string(),
            "127.0.0.1:1: timeout: no answer within 10s"
        );
    }

    #[test]
    fn a_status_made_here_is_no_answer_and_one_sent_by_the_server_a_refusal() {
        let addr = "127.0.0.1:1";
        let t = Duration::from_secs(1);
        let sent = failure(addr, t, Status::internal("internal error"));
        assert_eq!(sent.exit_status(), REFUSED);
        assert_eq!(sent.to_string(), "INTERNAL: internal error");
        let mut made = Status::internal("h2 protocol error");
        made.set_source(std::sync::Arc::new(std::io::Error::other(
            "h2 protocol error: broken pipe",
        )));
        let made = failure(addr, t, made);
        assert_eq!(made.exit_status(), NO_ANSWER);
        assert_eq!(
            made.to_string(),
            "127.0.0.1:1: no answer: h2 protocol error: broken pipe"
        );
        let down = failure(addr, t, Status::unavailable("database unreachable"));
        assert_eq!(down.exit_status(), NO_ANSWER);
        assert_eq!(
            down.to_string(),
            "127.0.0.1:1: UNAVAILABLE: database unreachable"
        );
        let late = failure(addr, t, Status::deadline_exceeded("late"));
        assert_eq!(
            late.to_string(),
            "127.0.0.1:1: timeout: no answer within 1s"
        );
    }

    #[test]
    fn a_retry_hint_is_shown() {
        use tonic_types::{ErrorDetails, StatusExt as _};
        let status = Status::with_error_details(
            Code::ResourceExhausted,
            "rate limit exceeded: admin",
            ErrorDetails::with_retry_info(Some(Duration::from_millis(500))),
        );
        assert_eq!(
            Failure::Refused(status).to_string(),
            "RESOURCE_EXHAUSTED: rate limit exceeded: admin (retry in 500ms)"
        );
    }

    #[test]
    fn a_user_is_selected_by_id_or_by_name() {
        let by_name = UserArg {
            username: Some("Alice".into()),
            id: None,
        };
        assert_eq!(
            selector(&by_name).unwrap().selector,
            Some(Selector::Username("Alice".into()))
        );
        assert_eq!(target(&by_name), "Alice");
        let by_id = UserArg {
            username: None,
            id: Some("0190".into()),
        };
        assert_eq!(
            selector(&by_id).unwrap().selector,
            Some(Selector::UserId("0190".into()))
        );
        assert_eq!(target(&by_id), "id 0190");
    }

    #[tokio::test]
    async fn a_closed_port_is_no_answer() {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let addr = format!("127.0.0.1:{port}");
        let failure = Admin::connect(&addr, Duration::from_secs(2), &ClientTls::default(), "k")
            .await
            .err()
            .unwrap();
        assert_eq!(failure.exit_status(), NO_ANSWER, "{failure}");
        assert!(
            failure
                .to_string()
                .starts_with(&format!("{addr}: cannot connect"))
        );
    }
}
