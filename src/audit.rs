//! The audit trail: one structured event per security-relevant outcome, on the log
//! target `authd::audit`, so operators can route it apart from the request log
//! (e.g. `AUTHD_LOG=info,authd::audit=info` and a JSON pipeline that splits on
//! `target`).
//!
//! Every event has `event` (what happened), `outcome`, `request_id`, `peer` (the
//! client address, as the rate limiter's `peer` key sees it), `client` (the client
//! certificate's identity, under mutual TLS), `trace_id` (when the request is
//! traced) and, when known, `user_id`; the log line carries the time. Never a
//! password or a token. A failed or throttled login names the account only by
//! `account`, a keyed digest of the username (people type their password into the
//! username field), the same digest the login throttle keys on, so events of one
//! account correlate across replicas that share its key (the token signing key's,
//! or `--account-digest-key`).

use crate::{credentials::Username, throttle::UsernameDigest};
use std::{net::IpAddr, time::Duration};

/// The log target of every audit event.
pub const TARGET: &str = "authd::audit";

/// Who made a request: what every audit event says about it.
#[derive(Debug, Clone, Default)]
pub struct Caller {
    pub request_id: Option<String>,
    pub client: Option<IpAddr>,
    /// The client certificate's identity, under mutual TLS.
    pub identity: Option<String>,
    /// The trace the request belongs to, when it is traced.
    pub trace_id: Option<String>,
}

impl Caller {
    fn peer(&self) -> String {
        self.client
            .map_or_else(|| "unknown".to_owned(), |ip| ip.to_string())
    }

    fn identity(&self) -> Option<&str> {
        self.identity.as_deref()
    }

    fn request_id(&self) -> &str {
        self.request_id.as_deref().unwrap_or("")
    }
}

/// One audit event of `$caller`: the fields every event has, then its own.
macro_rules! event {
    ($caller:expr, $event:literal, $outcome:expr, $message:literal; $($field:tt)*) => {
        tracing::info!(
            target: TARGET,
            event = $event,
            outcome = $outcome,
            request_id = $caller.request_id(),
            peer = %$caller.peer(),
            client = $caller.identity(),
            trace_id = $caller.trace_id.as_deref(),
            $($field)*
            $message
        )
    };
}

/// Why a login failed, as the audit trail says it (the caller is told only that
/// the credentials are wrong, whichever it is).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LoginFailure {
    UnknownUser,
    WrongPassword,
    /// The password was right; an administrator disabled the account.
    Disabled,
    /// The password was right, and changed (or the account was disabled) while the
    /// attempt was being checked.
    Superseded,
}

impl LoginFailure {
    pub fn label(self) -> &'static str {
        match self {
            LoginFailure::UnknownUser => "unknown_user",
            LoginFailure::WrongPassword => "wrong_password",
            LoginFailure::Disabled => "disabled",
            LoginFailure::Superseded => "superseded",
        }
    }
}

/// Writes the audit events.
#[derive(Clone)]
pub struct Audit {
    digest: UsernameDigest,
}

impl Audit {
    pub fn new(digest: UsernameDigest) -> Self {
        Self { digest }
    }

    pub fn registered(&self, caller: &Caller, user_id: &str) {
        event!(
            caller,
            "registered",
            "ok",
            "user registered";
            user_id,
        );
    }

    pub fn login_succeeded(&self, caller: &Caller, user_id: &str) {
        event!(
            caller,
            "login",
            "ok",
            "login succeeded";
            user_id,
        );
    }

    /// A failed login (or current-password check) and why: the caller was told
    /// only that the credentials are wrong.
    pub fn login_failed(
        &self,
        caller: &Caller,
        username: &Username,
        user_id: Option<&str>,
        why: LoginFailure,
    ) {
        event!(
            caller,
            "login",
            "failed",
            "login failed";
            user_id,
            account = %self.digest.of(username),
            reason = why.label(),
        );
    }

    pub fn login_throttled(
        &self,
        caller: &Caller,
        username: &Username,
        scope: &str,
        retry_after: Duration,
    ) {
        event!(
            caller,
            "login",
            "throttled",
            "login throttled";
            account = %self.digest.of(username),
            scope,
            retry_after_ms = u64::try_from(retry_after.as_millis()).unwrap_or(u64::MAX),
        );
    }

    /// A refresh token rotated (`replay`: a retry within the grace, answered alike).
    pub fn refreshed(&self, caller: &Caller, user_id: &str, session_id: &str, replay: bool) {
        event!(
            caller,
            "refresh",
            "ok",
            "session refreshed";
            user_id,
            session_id,
            replay,
        );
    }

    /// A session ended: `reason` is logout or reuse (password changes have their event).
    pub fn session_ended(&self, caller: &Caller, session_id: &str, reason: &str) {
        event!(
            caller,
            "session_ended",
            reason,
            "session ended";
            session_id,
            reason,
        );
    }

    pub fn password_changed(&self, caller: &Caller, user_id: &str, sessions_ended: usize) {
        event!(
            caller,
            "password_changed",
            "ok",
            "password changed; every session ended";
            user_id,
            sessions_ended,
        );
    }

    /// A password reset `step` (requested, completed) of a known user; the token is
    /// never written here.
    pub fn password_reset(&self, caller: &Caller, user_id: &str, step: &str) {
        event!(
            caller,
            "password_reset",
            step,
            "password reset";
            user_id,
            step,
        );
    }

    /// A change of the user's second factor: `change` is enrollment_begun,
    /// enrolled, disabled, recovery_codes_replaced or removed (by an administrator).
    pub fn second_factor_changed(&self, caller: &Caller, user_id: &str, change: &str) {
        event!(
            caller,
            "second_factor",
            change,
            "second factor changed";
            user_id,
            change,
        );
    }

    /// A second-factor code presented: `kind` totp or recovery, `purpose` login,
    /// confirm, disable or regenerate, `outcome` ok, wrong, reused or throttled.
    /// Never the code, never the secret.
    pub fn second_factor_code(
        &self,
        caller: &Caller,
        user_id: &str,
        kind: &str,
        purpose: &str,
        outcome: &str,
    ) {
        event!(
            caller,
            "second_factor_code",
            outcome,
            "second-factor code checked";
            user_id,
            kind,
            purpose,
        );
    }

    /// A right password of a user with a second factor: a challenge was issued.
    /// A service account's grant (docs/service-accounts.md): `grant` is
    /// `client_credentials` or `token_exchange`, `outcome` one of
    /// `authd_service_grants_total`'s; `service_id` the account when known,
    /// `user_id` the subject of an exchange.
    pub fn service_grant(
        &self,
        caller: &Caller,
        grant: &'static str,
        outcome: &'static str,
        service_id: Option<&str>,
        user_id: Option<&str>,
    ) {
        event!(
            caller,
            "service_grant",
            outcome,
            "service account grant";
            grant,
            service_id,
            user_id,
        );
    }

    pub fn login_challenged(&self, caller: &Caller, user_id: &str) {
        event!(
            caller,
            "login",
            "second_factor_required",
            "password right; second factor required";
            user_id,
        );
    }

    /// An admin API call: the key that made it (`None`: no valid key), the RPC, the
    /// user it acted on when known, and its outcome (a gRPC code's name).
    pub fn admin(
        &self,
        caller: &Caller,
        key: Option<&str>,
        rpc: &str,
        user_id: Option<&str>,
        outcome: &str,
    ) {
        event!(
            caller,
            "admin",
            outcome,
            "admin call";
            admin_key = key,
            rpc,
            user_id,
        );
    }
}
