//! The OS scheduling priority of authd's threads.
//!
//! When every core is busy, the kernel shares them by nice value. authd uses three
//! levels: the health-only port's thread keeps the process's own priority, so that
//! probes are answered first; the runtime's workers run at
//! `AUTHD_RUNTIME_THREAD_NICE`, with the threads they start (tokio's blocking
//! threads, and SQLite's connection threads opened while serving, which inherit
//! it; those opened at the start keep the process's); the hashing threads at
//! `AUTHD_HASH_THREAD_NICE`.
//!
//! With `AUTHD_RUNTIME_THREAD_POLICY=batch` the runtime's workers run under
//! `SCHED_BATCH`: a worker woken (by a row from SQLite's thread, a finished hash, a
//! packet) does not preempt the thread that woke it but runs when that thread
//! blocks or its turn ends, so SQLite's thread sends all the rows of a statement
//! before the worker reads them instead of the core changing hands once a row. The
//! shares by nice value stay as they are. Not the default: on some kernels a woken
//! normal worker preempts a busy thread of lower priority, such as a hashing thread,
//! where a batch one waits up to a scheduler tick for it.
//!
//! It imports nothing of authd's.

/// How the runtime's workers are scheduled against the other threads of the host.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Policy {
    /// `SCHED_OTHER`: a woken worker may preempt the running thread at once.
    Normal,
    /// `SCHED_BATCH`: a woken worker waits for the running thread to block or end
    /// its turn.
    Batch,
}

/// Lowers the calling thread's scheduling priority to `nice` (0 leaves it alone);
/// `what` names the threads in the debug event of a failure. Best effort: a failure
/// (a sandbox that forbids it) only costs priority.
pub fn lower(nice: u8, what: &str) {
    if nice == 0 {
        return;
    }
    #[cfg(target_os = "linux")]
    {
        // On Linux a thread id names one thread for setpriority, not the process.
        let thread = rustix::thread::gettid();
        if let Err(e) = rustix::process::setpriority_process(Some(thread), i32::from(nice)) {
            tracing::debug!(error = %e, threads = what, "cannot lower the threads' priority");
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = what;
}

/// Lowers the calling thread's priority to `nice`, as [`lower`] does, and puts it
/// under `policy`. Best effort too: where the policy cannot be set (another OS, a
/// sandbox), the thread keeps the normal one at that nice value.
pub fn lower_with_policy(nice: u8, policy: Policy, what: &str) {
    lower(nice, what);
    #[cfg(target_os = "linux")]
    if policy == Policy::Batch
        && let Err(e) = batch()
    {
        tracing::debug!(error = %e, threads = what, "cannot schedule the threads as a batch");
    }
    #[cfg(not(target_os = "linux"))]
    let _ = policy;
}

/// Puts the calling thread under `SCHED_BATCH`, its nice value left as it is.
#[cfg(target_os = "linux")]
fn batch() -> Result<(), String> {
    use thread_priority::{
        NormalThreadSchedulePolicy, ThreadPriority, ThreadPriorityValue, ThreadSchedulePolicy,
        set_thread_priority_and_policy, thread_native_id,
    };
    let thread = rustix::thread::gettid();
    let nice = rustix::process::getpriority_process(Some(thread)).map_err(|e| e.to_string())?;
    let policy = ThreadSchedulePolicy::Normal(NormalThreadSchedulePolicy::Batch);
    // The crate sets a normal policy's nice value with it, mapped from a portable
    // priority (0 to 99): the priority it maps onto the thread's own nice value.
    let priority = (0..=u8::from(ThreadPriorityValue::MAX))
        .filter_map(|p| ThreadPriorityValue::try_from(p).ok())
        .map(ThreadPriority::Crossplatform)
        .find(|p| p.to_posix(policy).ok() == Some(nice))
        .ok_or_else(|| format!("no priority maps onto nice {nice}"))?;
    set_thread_priority_and_policy(thread_native_id(), priority, policy).map_err(|e| e.to_string())
}
