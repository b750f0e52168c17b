//! The work sent to the hashing threads, and how it is answered.
//!
//! A request becomes a [`Queued`] item: a derivation (password, salt, rounds) whose
//! 32-byte output comes back or is compared with an expected one, or a task run on
//! its own; the channel that answers it; its deadline and trace. [`PoolError`] is
//! why an item did not run, and its one mapping to the domain error.
//!
//! It owns the shapes only: admitting and sending work is the pool's (`pool`),
//! running it the threads' (`worker`). It knows nothing of PHC strings or users.

use crate::{error::Error, otel};
use std::{
    fmt,
    time::{Duration, Instant},
};
use tokio::sync::oneshot;

/// One PBKDF2-HMAC-SHA256 computation with a 32-byte output.
pub(crate) struct Derivation {
    pub password: Vec<u8>,
    pub salt: Vec<u8>,
    /// At least 1.
    pub rounds: u32,
}

impl fmt::Debug for Derivation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Derivation")
            .field("password", &"<redacted>")
            .field("salt_len", &self.salt.len())
            .field("rounds", &self.rounds)
            .finish()
    }
}

/// Why a job did not run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum PoolError {
    #[error("the deadline passed while the job was queued")]
    Expired,
    #[error("the hashing pool has shut down")]
    Closed,
    #[error("the hashing engine refused a batch: {0}")]
    Engine(pbkdf2_lanes::Error),
}

impl From<PoolError> for Error {
    fn from(err: PoolError) -> Self {
        match err {
            PoolError::Expired => Error::DeadlineExceeded,
            PoolError::Closed => Error::Unavailable("the server is shutting down".into()),
            PoolError::Engine(e) => Error::Internal(anyhow::anyhow!("hashing failed: {e}")),
        }
    }
}

pub(super) type Reply<T> = oneshot::Sender<Result<T, PoolError>>;

/// What a thread is asked to do.
pub(super) enum Work {
    /// A derivation hashed in a batch with whatever else is waiting.
    Derive { job: Derivation, answer: Answer },
    /// Any other work (a stored hash the engine cannot check), run on its own.
    Task(Task),
}

/// What the caller of a derivation wants back.
pub(super) enum Answer {
    /// The output (a new hash).
    Output(Reply<[u8; 32]>),
    /// Whether the output is `expected` (a verification); when it is not, `pad`
    /// more rounds are computed on throwaway input before the answer.
    Matches {
        expected: [u8; 32],
        pad: u32,
        reply: Reply<bool>,
    },
}

impl Answer {
    pub(super) fn is_closed(&self) -> bool {
        match self {
            Answer::Output(reply) => reply.is_closed(),
            Answer::Matches { reply, .. } => reply.is_closed(),
        }
    }

    pub(super) fn fail(self, err: PoolError) {
        match self {
            Answer::Output(reply) => {
                let _ = reply.send(Err(err));
            }
            Answer::Matches { reply, .. } => {
                let _ = reply.send(Err(err));
            }
        }
    }
}

/// A task's body; it is given the function that records its run time.
pub(super) type Task = Box<dyn FnOnce(&dyn Fn(Duration)) -> TaskOutcome + Send>;

/// What became of a task: it checks its own deadline and caller when it starts.
pub(super) enum TaskOutcome {
    Ran,
    Expired,
    Cancelled,
}

/// A request in the queue, until a thread has answered or dropped it.
pub(super) struct Queued {
    pub(super) deadline: Option<Instant>,
    /// When the work was queued, for the queue wait metric.
    pub(super) queued_at: Instant,
    pub(super) work: Work,
    /// The request's trace, for the spans of the queue wait and the hash.
    pub(super) trace: otel::Carried,
}

impl Queued {
    /// Whether a thread runs it on its own (a task, not a derivation of the lanes):
    /// the queue hands a thread nothing behind it.
    pub(super) fn alone(&self) -> bool {
        matches!(self.work, Work::Task(_))
    }

    /// Whether nobody waits for the answer any more.
    pub(super) fn abandoned(&self) -> bool {
        match &self.work {
            Work::Derive { answer, .. } => answer.is_closed(),
            Work::Task(_) => false,
        }
    }
}

/// Padding: rounds of PBKDF2 on throwaway input, the same work per round as a
/// verification (one 32-byte block).
pub(crate) fn padding(rounds: u32) -> Derivation {
    Derivation {
        password: b"authd: padding of a verification".to_vec(),
        salt: b"throwaway salt".to_vec(),
        rounds,
    }
}
