//! The hash queue: which requests get a place (queued or running) on the hashing
//! threads, and in which order the threads take them.
//!
//! Whether a request may have a place is decided by three rules, checked in one
//! step under one lock, before the request does any work for it (a database
//! lookup: [`FairQueue::check`]); the place itself is taken once that work is done
//! ([`FairQueue::admit`]), by the same rules but the first, so that work done for a
//! request the check let through is never thrown away by a queue that moved in
//! the meantime (the count bound still holds):
//! - **Time.** The queue admits while the expected wait stays under a target
//!   (`AUTHD_HASH_QUEUE_WAIT`): the places it allows are the target times the service
//!   rate measured on the threads (jobs per second, from the time each batch took),
//!   never fewer than keep every thread busy with two full batches, never more than
//!   the count bound (`AUTHD_HASH_QUEUE` plus the threads). Before any batch has run
//!   there is no rate and the count bound alone applies.
//! - **Fairness, work-conserving.** Below that bound anyone may take a place, so one
//!   busy client alone may use all of it. At the bound, a client that holds fewer
//!   places than its fair share (the bound divided by the clients holding places)
//!   still gets one, up to twice the bound in all, and the others are refused: a
//!   client that arrives beside a busy one is never refused for the busy one's sake.
//! - **Deadlines.** A request whose deadline would pass before a thread reaches it
//!   (the places ahead of it over the service rate) is refused now, not dropped
//!   after waiting.
//!
//! Threads take work round robin between clients, one job each in turn, so each
//! client holding places is served at the same rate whatever its queue's length.
//!
//! It knows nothing of hashing: the queued items are opaque. Every map here is keyed
//! by a client that holds a place, so it is bounded by the places.

use crate::metrics::HASH_REFUSAL_CAUSES;
use std::{
    collections::{HashMap, VecDeque},
    net::IpAddr,
    sync::{
        Condvar, Mutex, MutexGuard,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

/// The queue's wait target when none is configured.
pub const DEFAULT_WAIT: Duration = Duration::from_millis(150);

/// Why a request got no place: in the order of the metric's causes
/// (`metrics::HASH_REFUSAL_CAUSES`, which the discriminant indexes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// Every place the count bound allows is taken.
    Full = 0,
    /// More places would wait longer than the target.
    Wait = 1,
    /// The queue is at its bound and this client holds its fair share of it.
    Share = 2,
    /// The request's deadline would pass before a thread reaches it.
    Deadline = 3,
}

impl Refusal {
    /// Every value, one per metric cause.
    pub const ALL: [Refusal; HASH_REFUSAL_CAUSES.len()] = [
        Refusal::Full,
        Refusal::Wait,
        Refusal::Share,
        Refusal::Deadline,
    ];

    /// The `cause` label of `authd_hash_refused_total`.
    pub fn label(self) -> &'static str {
        HASH_REFUSAL_CAUSES[self as usize]
    }
}

/// One client's places and its queued work.
struct Client<T> {
    places: usize,
    queue: VecDeque<T>,
}

struct State<T> {
    /// Clients holding at least one place.
    clients: HashMap<IpAddr, Client<T>>,
    /// Clients with queued work, in the order their turn comes.
    turns: VecDeque<IpAddr>,
    /// Places held in all: granted and not yet released (queued, running, or about
    /// to be queued).
    places: usize,
    queued: usize,
    closed: bool,
}

/// The queue in front of `threads` threads.
pub(super) struct FairQueue<T> {
    state: Mutex<State<T>>,
    ready: Condvar,
    threads: usize,
    /// The count bound: queued and running places.
    capacity: usize,
    /// The fewest places the time rule allows: two full batches per thread.
    floor: usize,
    target_wait_nanos: AtomicU64,
    /// The time one job takes on one thread, as a batch of them runs (a weighted
    /// mean, in nanoseconds; 0 until a batch has run).
    job_nanos: AtomicU64,
}

impl<T> FairQueue<T> {
    /// A queue for `threads` threads that hash up to `lanes` jobs at once, with
    /// `capacity` places beside the running ones.
    pub fn new(threads: usize, lanes: usize, capacity: usize) -> Self {
        let threads = threads.max(1);
        let capacity = capacity.max(1) + threads;
        Self {
            state: Mutex::new(State {
                clients: HashMap::new(),
                turns: VecDeque::new(),
                places: 0,
                queued: 0,
                closed: false,
            }),
            ready: Condvar::new(),
            threads,
            capacity,
            floor: (2 * threads * lanes.max(1)).min(capacity),
            target_wait_nanos: AtomicU64::new(nanos(DEFAULT_WAIT)),
            job_nanos: AtomicU64::new(0),
        }
    }

    /// The fewest places the time rule allows: what keeps every thread busy with
    /// two full batches.
    pub fn floor(&self) -> usize {
        self.floor
    }

    pub fn set_target_wait(&self, wait: Duration) {
        self.target_wait_nanos.store(nanos(wait), Ordering::Relaxed);
    }

    fn lock(&self) -> MutexGuard<'_, State<T>> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Jobs per second the threads complete, once a batch has run.
    pub fn rate(&self) -> Option<f64> {
        match self.job_nanos.load(Ordering::Relaxed) {
            0 => None,
            job => Some(self.threads as f64 * 1e9 / job as f64),
        }
    }

    /// The places the time and count rules allow now.
    pub fn limit(&self) -> usize {
        let Some(rate) = self.rate() else {
            return self.capacity;
        };
        let target = self.target_wait_nanos.load(Ordering::Relaxed) as f64 / 1e9;
        let allowed = (rate * target).ceil();
        if allowed >= self.capacity as f64 {
            return self.capacity;
        }
        (allowed as usize).max(self.floor)
    }

    /// Records that one thread answered `jobs` in `took` of its time: the service
    /// rate the expected wait is computed from.
    pub fn record_service(&self, took: Duration, jobs: usize) {
        let job = nanos(took) / jobs.max(1) as u64;
        let old = self.job_nanos.load(Ordering::Relaxed);
        // A racy read-modify-write is fine: this is an estimate.
        let new = if old == 0 {
            job
        } else {
            old - old / 8 + job / 8
        };
        self.job_nanos.store(new.max(1), Ordering::Relaxed);
    }

    /// Grants `client` a place, or says why not: the count, fairness and deadline
    /// rules (the time rule was [`FairQueue::check`]ed before).
    pub fn admit(
        &self,
        client: IpAddr,
        now: Instant,
        deadline: Option<Instant>,
    ) -> Result<(), Refusal> {
        let mut state = self.lock();
        self.decide(&state, self.capacity, client, now, deadline)?;
        state.places += 1;
        let entry = state.clients.entry(client).or_insert_with(|| Client {
            places: 0,
            queue: VecDeque::new(),
        });
        entry.places += 1;
        Ok(())
    }

    /// Whether `client` may have a place now, by every rule, without taking one.
    pub fn check(
        &self,
        client: IpAddr,
        now: Instant,
        deadline: Option<Instant>,
    ) -> Result<(), Refusal> {
        self.decide(&self.lock(), self.limit(), client, now, deadline)
    }

    /// The rules, with `limit` places as the bound.
    fn decide(
        &self,
        state: &State<T>,
        limit: usize,
        client: IpAddr,
        now: Instant,
        deadline: Option<Instant>,
    ) -> Result<(), Refusal> {
        let mine = state.clients.get(&client).map_or(0, |c| c.places);
        let active = state.clients.len() + usize::from(mine == 0);
        if state.places >= limit {
            let fair = limit.div_ceil(active);
            if mine >= fair || state.places >= 2 * limit {
                return Err(if active > 1 && mine >= fair {
                    Refusal::Share
                } else if limit < self.capacity {
                    Refusal::Wait
                } else {
                    Refusal::Full
                });
            }
        }
        if let (Some(deadline), Some(rate)) = (deadline, self.rate()) {
            // Served round robin: the places ahead are at most everyone's, and at
            // most this client's own times the clients served in turn.
            let ahead = state
                .places
                .min((mine + 1) * active)
                .saturating_sub(self.threads);
            let wait = Duration::from_secs_f64(ahead as f64 / rate);
            if now + wait >= deadline {
                return Err(Refusal::Deadline);
            }
        }
        Ok(())
    }

    /// Gives back a place of `client`.
    pub fn release(&self, client: IpAddr) {
        let mut state = self.lock();
        state.places = state.places.saturating_sub(1);
        if let Some(entry) = state.clients.get_mut(&client) {
            entry.places = entry.places.saturating_sub(1);
            if entry.places == 0 && entry.queue.is_empty() {
                state.clients.remove(&client);
            }
        }
    }

    /// Queues `item` of `client`, which holds a place for it. Gives it back when the
    /// queue is closed.
    pub fn push(&self, client: IpAddr, item: T) -> Result<(), T> {
        let mut state = self.lock();
        if state.closed {
            return Err(item);
        }
        let entry = state.clients.entry(client).or_insert_with(|| Client {
            places: 0,
            queue: VecDeque::new(),
        });
        entry.queue.push_back(item);
        if entry.queue.len() == 1 {
            state.turns.push_back(client);
        }
        state.queued += 1;
        drop(state);
        self.ready.notify_one();
        Ok(())
    }

    /// Waits for work and takes up to `max` items into `out`, one per client in
    /// turn. Returns false once the queue is closed and empty.
    pub fn take(&self, max: usize, out: &mut Vec<T>) -> bool {
        let mut state = self.lock();
        while state.queued == 0 {
            if state.closed {
                return false;
            }
            state = self.ready.wait(state).unwrap_or_else(|p| p.into_inner());
        }
        Self::take_from(&mut state, max, out);
        true
    }

    /// Takes up to `max` items that wait now into `out`, one per client in turn,
    /// without waiting for any.
    pub fn take_ready(&self, max: usize, out: &mut Vec<T>) {
        let mut state = self.lock();
        if state.queued > 0 {
            Self::take_from(&mut state, max, out);
        }
    }

    fn take_from(state: &mut State<T>, max: usize, out: &mut Vec<T>) {
        while out.len() < max.max(1) {
            let Some(client) = state.turns.pop_front() else {
                break;
            };
            let Some(entry) = state.clients.get_mut(&client) else {
                continue;
            };
            let Some(item) = entry.queue.pop_front() else {
                continue;
            };
            state.queued -= 1;
            out.push(item);
            if !entry.queue.is_empty() {
                state.turns.push_back(client);
            }
        }
    }

    /// Items waiting for a thread.
    pub fn queued(&self) -> usize {
        self.lock().queued
    }

    /// Places held by `client`.
    #[cfg(test)]
    pub fn places_of(&self, client: IpAddr) -> usize {
        self.lock().clients.get(&client).map_or(0, |c| c.places)
    }

    /// Clients holding places.
    #[cfg(test)]
    pub fn clients(&self) -> usize {
        self.lock().clients.len()
    }

    /// No more work is accepted; the threads finish what is queued, then stop.
    pub fn close(&self) {
        self.lock().closed = true;
        self.ready.notify_all();
    }
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_refusal_names_its_own_cause() {
        let labels = Refusal::ALL.map(Refusal::label);
        assert_eq!(labels, ["full", "wait", "share", "deadline"]);
        for (i, why) in Refusal::ALL.into_iter().enumerate() {
            assert_eq!(why as usize, i);
        }
    }

    fn ip(last: u8) -> IpAddr {
        IpAddr::from([127, 0, 0, last])
    }

    /// Checks and grants places to `client` until refused, as the pool does; returns
    /// how many and why it stopped.
    fn fill(q: &FairQueue<u32>, client: IpAddr, now: Instant) -> (usize, Refusal) {
        let mut granted = 0;
        loop {
            match q
                .check(client, now, None)
                .and_then(|()| q.admit(client, now, None))
            {
                Ok(()) => granted += 1,
                Err(why) => return (granted, why),
            }
        }
    }

    #[test]
    fn one_client_alone_may_take_every_place() {
        let q = FairQueue::<u32>::new(1, 4, 99);
        let (granted, why) = fill(&q, ip(1), Instant::now());
        assert_eq!((granted, why), (100, Refusal::Full));
        for _ in 0..100 {
            q.release(ip(1));
        }
        assert_eq!(q.clients(), 0, "a client holding nothing is forgotten");
    }

    #[test]
    fn a_newcomer_gets_its_fair_share_beside_a_busy_client() {
        let q = FairQueue::<u32>::new(1, 4, 99);
        let now = Instant::now();
        assert_eq!(fill(&q, ip(1), now).0, 100);
        // The busy client holds everything; a second client still gets half.
        let (granted, why) = fill(&q, ip(2), now);
        assert_eq!((granted, why), (50, Refusal::Share));
        assert_eq!(q.admit(ip(1), now, None), Err(Refusal::Share));
        // A third gets a third, and the total stays under twice the bound.
        assert_eq!(fill(&q, ip(3), now).0, 34);
        assert_eq!(q.places_of(ip(2)), 50);
        // When the busy client's places go, anyone may take them up to the bound,
        // and past it only a client under its share.
        for _ in 0..100 {
            q.release(ip(1));
        }
        assert_eq!(q.clients(), 2);
        assert_eq!(fill(&q, ip(2), now), (16, Refusal::Share));
        assert_eq!(q.admit(ip(1), now, None), Ok(()));
    }

    #[test]
    fn the_threads_take_work_round_robin_between_clients() {
        let q = FairQueue::<u32>::new(1, 4, 99);
        let now = Instant::now();
        for i in 0..6 {
            q.admit(ip(1), now, None).unwrap();
            q.push(ip(1), 100 + i).unwrap();
        }
        for i in 0..2 {
            q.admit(ip(2), now, None).unwrap();
            q.push(ip(2), 200 + i).unwrap();
        }
        let mut batch = Vec::new();
        assert!(q.take(4, &mut batch));
        assert_eq!(batch, [100, 200, 101, 201]);
        batch.clear();
        assert!(q.take(4, &mut batch));
        assert_eq!(batch, [102, 103, 104, 105]);
        assert_eq!(q.queued(), 0);
        q.close();
        assert!(!q.take(4, &mut batch), "closed and empty");
    }

    #[test]
    fn the_places_follow_the_measured_rate_and_the_wait_target() {
        let q = FairQueue::<u32>::new(1, 4, 999);
        assert_eq!(q.limit(), 1000, "no rate yet: the count bound");
        // A batch of 4 in 4 ms: 1,000 jobs/s; 150 ms of waiting is 150 places.
        q.record_service(Duration::from_millis(4), 4);
        assert_eq!(q.rate(), Some(1000.0));
        assert_eq!(q.limit(), 150);
        q.set_target_wait(Duration::from_millis(100));
        assert_eq!(q.limit(), 100);
        let now = Instant::now();
        let (granted, why) = fill(&q, ip(1), now);
        assert_eq!((granted, why), (100, Refusal::Wait));
        // A request the check let through keeps its place up to the count bound,
        // whatever the queue did in the meantime.
        assert_eq!(q.admit(ip(1), now, None), Ok(()));
        assert_eq!(q.places_of(ip(1)), 101);
        // Never fewer than two full batches per thread.
        q.set_target_wait(Duration::from_micros(1));
        assert_eq!(q.limit(), 8);
    }

    #[test]
    fn a_deadline_that_would_pass_in_the_queue_is_refused_now() {
        let q = FairQueue::<u32>::new(1, 4, 999);
        q.record_service(Duration::from_millis(4), 4); // 1,000 jobs/s
        let now = Instant::now();
        for _ in 0..101 {
            q.admit(ip(1), now, None).unwrap();
        }
        // 100 ahead (one running): 100 ms until a thread reaches the next.
        let soon = now + Duration::from_millis(99);
        assert_eq!(q.admit(ip(1), now, Some(soon)), Err(Refusal::Deadline));
        assert_eq!(q.check(ip(1), now, Some(soon)), Err(Refusal::Deadline));
        let later = now + Duration::from_millis(101);
        assert_eq!(q.check(ip(1), now, Some(later)), Ok(()));
        // Another client is served in turn: one ahead of it, not a hundred.
        assert_eq!(q.admit(ip(2), now, Some(soon)), Ok(()));
    }
}
