//! [`RedisFailure`]: why a Redis call gave no answer, the one error of every Redis
//! user (the rate limiter, the login throttle), and [`within`], the one way a call
//! is bounded by a timeout.
//!
//! It says what went wrong and nothing more: whether a request then falls back or is
//! refused is the caller's decision (`super::FailureMode`).

use std::{fmt, future::Future, time::Duration};

/// Why a Redis call gave no answer.
#[derive(Debug)]
pub(crate) enum RedisFailure {
    /// Not connected yet (Redis was down at start and has not answered since).
    NotConnected,
    /// Not called: the connection is marked down (a call failed, and no probe has
    /// succeeded since).
    Down,
    /// No connection could be made within the timeout.
    ConnectTimeout(Duration),
    /// No answer within the timeout.
    Timeout(Duration),
    Redis(redis::RedisError),
    /// An answer of the wrong shape: a script from another version, say.
    BadReply(String),
}

impl fmt::Display for RedisFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RedisFailure::NotConnected => f.write_str("not connected"),
            RedisFailure::Down => f.write_str("not answering since a call failed"),
            RedisFailure::ConnectTimeout(t) => write!(f, "no connection within {t:?}"),
            RedisFailure::Timeout(t) => write!(f, "no answer within {t:?}"),
            // The crate's errors name the server's address, never its password.
            RedisFailure::Redis(e) => write!(f, "{e}"),
            RedisFailure::BadReply(why) => write!(f, "unexpected reply: {why}"),
        }
    }
}

impl From<redis::RedisError> for RedisFailure {
    fn from(e: redis::RedisError) -> Self {
        RedisFailure::Redis(e)
    }
}

/// The answer of `call`, or a failure once `timeout` has passed without one.
pub(crate) async fn within<T, E: Into<RedisFailure>>(
    timeout: Duration,
    call: impl Future<Output = Result<T, E>>,
) -> Result<T, RedisFailure> {
    match tokio::time::timeout(timeout, call).await {
        Ok(answer) => answer.map_err(Into::into),
        Err(_) => Err(RedisFailure::Timeout(timeout)),
    }
}
