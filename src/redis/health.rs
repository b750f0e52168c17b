//! Whether the shared connection answers: one flag for every user of it, and the
//! prober that brings it back.
//!
//! A user whose call fails or times out marks the flag down ([`Health::mark_down`]);
//! while it is down, users do not call Redis at all (the rate limiter and the login
//! throttle fall back at once), so an outage costs one timeout, not one per request.
//! The prober, one per connection, tries Redis every [`PROBE_INTERVAL`] while the
//! flag is down (connecting if there is no connection yet, and loading the users'
//! scripts again, which a restarted Redis has forgotten) and marks it up once Redis
//! answers. With Sentinel it also asks the sentinels, once a second while the flag
//! is up, whether the master is still the one connected to (see
//! `SharedRedis::watch`).
//!
//! It must not decide what a request does while Redis is down: that stays with the
//! users (`super::FailureMode`).

use super::SharedRedis;
use std::{
    sync::{
        Mutex, Weak,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

/// How often, while Redis fails, the prober checks whether it answers again.
const PROBE_INTERVAL: Duration = Duration::from_millis(500);

/// How long connecting to Redis may take, at start and when probing. Off the
/// request path, so more generous than `AUTHD_REDIS_TIMEOUT`; a refused connection
/// fails at once, so only a black-holed Redis makes the start wait this long.
pub(crate) const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);

type Listener = Box<dyn Fn() + Send + Sync>;

/// The flag: down until a probe succeeds, down again from a failed call.
#[derive(Default)]
pub(crate) struct Health {
    up: AtomicBool,
    /// Told each time the flag turns up again.
    on_recovery: Mutex<Vec<Listener>>,
}

impl Health {
    /// Whether Redis answered the last call (or probe) made on it.
    pub(crate) fn is_up(&self) -> bool {
        self.up.load(Ordering::SeqCst)
    }

    /// After a failed call: true when this call turned the flag down, so that the
    /// switch is logged once, not once per request.
    pub(crate) fn mark_down(&self) -> bool {
        self.up.swap(false, Ordering::SeqCst)
    }

    /// After a probe Redis answered: true when it turned the flag up (and told the
    /// listeners).
    pub(super) fn mark_up(&self) -> bool {
        let turned = !self.up.swap(true, Ordering::SeqCst);
        if turned {
            for listener in self
                .on_recovery
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .iter()
            {
                listener();
            }
        }
        turned
    }

    /// At start, once Redis answered: up, with nothing to tell (nothing recovered).
    pub(super) fn started(&self) {
        self.up.store(true, Ordering::SeqCst);
    }

    /// Calls `listener` each time Redis answers again after an outage (not at start).
    pub(crate) fn on_recovery(&self, listener: impl Fn() + Send + Sync + 'static) {
        (self.on_recovery.lock().unwrap_or_else(|e| e.into_inner())).push(Box::new(listener));
    }
}

/// While the flag is down, probes Redis every [`PROBE_INTERVAL`] and marks it up
/// once it answers (while it is up, with Sentinel, checks the master once a
/// second); ends when the connection is dropped (the server stopped).
pub(super) fn spawn_prober(redis: Weak<SharedRedis>) {
    tokio::spawn(async move {
        let mut ticker = tokio::time::interval(PROBE_INTERVAL);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        // Every other tick while Redis answers: once a second.
        let mut watching = false;
        loop {
            ticker.tick().await;
            let Some(redis) = redis.upgrade() else {
                return;
            };
            if redis.health().is_up() {
                watching = !watching;
                if watching {
                    redis.watch(CONNECT_TIMEOUT).await;
                }
                continue;
            }
            match redis.probe(CONNECT_TIMEOUT).await {
                Ok(()) => {
                    redis.health().mark_up();
                }
                Err(why) => tracing::debug!(error = %why, "Redis still does not answer"),
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, atomic::AtomicUsize};

    #[test]
    fn each_switch_is_seen_once() {
        let health = Health::default();
        let told = Arc::new(AtomicUsize::new(0));
        health.on_recovery({
            let told = told.clone();
            move || {
                told.fetch_add(1, Ordering::SeqCst);
            }
        });
        assert!(!health.is_up());
        assert!(!health.mark_down(), "down from the start");
        assert!(health.mark_up());
        assert!(!health.mark_up());
        assert!(health.is_up());
        assert!(health.mark_down());
        assert!(!health.mark_down());
        assert!(health.mark_up());
        assert_eq!(told.load(Ordering::SeqCst), 2);
    }
}
