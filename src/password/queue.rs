//! The hash queue: the work waiting for a hashing thread, first in, first out.
//!
//! It refuses nothing and decides nothing about load: whether a request may start
//! is admission control's decision (`layers::admission`), made once, before any work
//! is done for it, from the request's deadline and the rate requests are answered
//! at; and the requests it admits are bounded in number by the in-flight cap, which
//! bounds this queue too. What the queue owes that decision is its order: a request
//! admitted because it could be answered before its deadline is never overtaken by
//! a later one, so the wait predicted when it was admitted still holds whatever
//! arrives after it. (Earliest deadline first would let a later request with a
//! shorter deadline pass it, and then every admission would have to check that no
//! request already waiting misses its deadline for it; with one deadline per kind of
//! caller, the usual case, the two orders are the same.)
//!
//! It knows nothing of hashing: the queued items are opaque.

use std::{
    collections::VecDeque,
    sync::{Condvar, Mutex, MutexGuard},
};

struct State<T> {
    items: VecDeque<T>,
    closed: bool,
}

/// The queue in front of the hashing threads.
pub(super) struct HashQueue<T> {
    state: Mutex<State<T>>,
    ready: Condvar,
}

impl<T> HashQueue<T> {
    pub fn new() -> Self {
        Self {
            state: Mutex::new(State {
                items: VecDeque::new(),
                closed: false,
            }),
            ready: Condvar::new(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State<T>> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Queues `item` behind everything queued before it. Gives it back when the
    /// queue is closed.
    pub fn push(&self, item: T) -> Result<(), T> {
        let mut state = self.lock();
        if state.closed {
            return Err(item);
        }
        state.items.push_back(item);
        drop(state);
        self.ready.notify_one();
        Ok(())
    }

    /// Waits for work and takes up to `max` items, oldest first, into `out`, and
    /// none after one that `alone` says a thread runs on its own (a task): the
    /// items behind it are left to the other threads, not held while it runs.
    /// Returns false once the queue is closed and empty.
    pub fn take(&self, max: usize, out: &mut Vec<T>, alone: impl Fn(&T) -> bool) -> bool {
        let mut state = self.lock();
        while state.items.is_empty() {
            if state.closed {
                return false;
            }
            state = self.ready.wait(state).unwrap_or_else(|p| p.into_inner());
        }
        Self::take_from(&mut state, max, out, alone);
        true
    }

    /// Takes up to `max` items that wait now, oldest first, into `out` (none after
    /// one that runs `alone`), without waiting for any.
    pub fn take_ready(&self, max: usize, out: &mut Vec<T>, alone: impl Fn(&T) -> bool) {
        Self::take_from(&mut self.lock(), max, out, alone);
    }

    fn take_from(state: &mut State<T>, max: usize, out: &mut Vec<T>, alone: impl Fn(&T) -> bool) {
        for _ in 0..max.max(1) {
            let Some(item) = state.items.pop_front() else {
                return;
            };
            let last = alone(&item);
            out.push(item);
            if last {
                return;
            }
        }
    }

    /// Items waiting for a thread.
    pub fn queued(&self) -> usize {
        self.lock().items.len()
    }

    /// No more work is accepted; the threads finish what is queued, then stop.
    pub fn close(&self) {
        self.lock().closed = true;
        self.ready.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn work_is_taken_in_the_order_it_came_whoever_sent_it() {
        let q = HashQueue::new();
        for i in 0..6 {
            q.push(i).unwrap();
        }
        let mut batch = Vec::new();
        let none = |_: &i32| false;
        assert!(q.take(4, &mut batch, none));
        assert_eq!(batch, [0, 1, 2, 3]);
        batch.clear();
        q.push(6).unwrap();
        q.take_ready(4, &mut batch, none);
        assert_eq!(batch, [4, 5, 6]);
        batch.clear();
        q.take_ready(4, &mut batch, none);
        assert!(batch.is_empty(), "nothing waits");
        assert_eq!(q.queued(), 0);
    }

    #[test]
    fn a_closed_queue_takes_nothing_more_and_is_emptied_first() {
        let q = HashQueue::new();
        q.push(1).unwrap();
        q.close();
        assert_eq!(q.push(2), Err(2));
        let mut batch = Vec::new();
        assert!(
            q.take(4, &mut batch, |_| false),
            "what was queued is still taken"
        );
        assert_eq!(batch, [1]);
        assert!(!q.take(4, &mut batch, |_| false), "closed and empty");
    }

    #[test]
    fn nothing_is_taken_behind_work_that_runs_alone() {
        let q = HashQueue::new();
        for i in 0..6 {
            q.push(i).unwrap();
        }
        // 2 runs alone: what waits behind it goes to another thread.
        let alone = |i: &i32| *i == 2 || *i == 3;
        let mut batch = Vec::new();
        assert!(q.take(4, &mut batch, alone));
        assert_eq!(batch, [0, 1, 2]);
        batch.clear();
        q.take_ready(4, &mut batch, alone);
        assert_eq!(batch, [3]);
        batch.clear();
        q.take_ready(4, &mut batch, alone);
        assert_eq!(batch, [4, 5]);
    }
}
