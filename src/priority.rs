//! The OS scheduling priority of authd's threads.
//!
//! When every core is busy, the kernel shares them by nice value. authd uses three
//! levels: the health-only port's thread keeps the process's own priority, so that
//! probes are answered first; the threads that answer AuthService requests (the
//! runtime's workers, and the database threads they start, which inherit it) run at
//! `AUTHD_RUNTIME_THREAD_NICE`; the hashing threads at `AUTHD_HASH_THREAD_NICE`.
//!
//! It imports nothing of authd's.

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
