//! Account events out of the store's outbox (docs/events.md): the WatchEvents
//! streams of the admin port, retention, and webhook delivery (`webhooks`).
//!
//! The store writes each event in the transaction of its change; this module only
//! reads them, in position order, through a [`Reader`], which never passes a
//! position while a lower one may still commit (the store's frontier, see
//! `store::events`). A stream is at-least-once: it starts after the position its
//! subscriber names and sends each event once, so a subscriber that resumes after
//! the last position it recorded sees again only what it had not recorded.
//!
//! Every stream is bounded: at most `max_watchers` at once (more are refused with
//! RESOURCE_EXHAUSTED), each with a buffer of [`STREAM_BUFFER`] events; a slow
//! subscriber's stream waits for it (its reader reads no further), so it falls
//! behind and costs nothing to writers. New events wake the streams of this
//! process at once; those written by other replicas are found by polling every
//! `poll` at most.

pub mod webhooks;

use crate::{
    clock::Clock,
    error::Error,
    metrics::EventMetrics,
    store::{Event, Store, StoreError},
};
use std::{collections::VecDeque, sync::Arc, time::Duration};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc};
use tokio_util::sync::CancellationToken;

/// Events a stream holds for its subscriber before its reader waits.
pub const STREAM_BUFFER: usize = 256;
/// Events read per query.
pub const READ_BATCH: i64 = 256;
/// Events retention deletes per statement.
const PRUNE_BATCH: i64 = 10_000;
/// The frontiers a reader keeps waiting for their transactions to end: a bound on
/// its memory while one transaction stays open.
const MAX_PENDING: usize = 64;

/// The account events' settings.
#[derive(Debug, Clone)]
pub struct EventSettings {
    /// How often a stream with nothing to send looks for events other replicas
    /// wrote.
    pub poll: Duration,
    /// How long events are kept.
    pub retention: Duration,
    /// The most events kept.
    pub max_events: u64,
    /// The most WatchEvents streams open at once.
    pub max_watchers: usize,
    /// How often retention runs.
    pub prune_every: Duration,
}

/// Where a stream starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Start {
    /// After this position.
    After(i64),
    /// At the oldest event retained.
    Oldest,
    /// After the last event committed now.
    Now,
}

/// Reads events in position order, never past a position a lower one of which
/// may still commit.
pub struct Reader {
    store: Arc<Store>,
    /// Every position up to this one is committed or gone for good.
    horizon: i64,
    /// Frontiers not settled yet, oldest first: (last position, snapshot).
    pending: VecDeque<(i64, String)>,
}

impl Reader {
    pub fn new(store: Arc<Store>) -> Self {
        Self {
            store,
            horizon: 0,
            pending: VecDeque::new(),
        }
    }

    /// Moves the horizon as far as the store allows now; returns it.
    pub async fn advance(&mut self) -> Result<i64, StoreError> {
        let frontier = self.store.event_frontier().await?;
        match frontier.pending {
            None if self.pending.is_empty() => self.horizon = self.horizon.max(frontier.last),
            None => {
                // Nothing in flight now, but earlier frontiers still wait on their
                // transactions: this one is settled, and so are they.
                self.pending.clear();
                self.horizon = self.horizon.max(frontier.last);
            }
            Some(snapshot) => {
                if self.pending.len() < MAX_PENDING
                    && self
                        .pending
                        .back()
                        .is_none_or(|(last, _)| *last < frontier.last)
                {
                    self.pending.push_back((frontier.last, snapshot));
                }
            }
        }
        while let Some((last, snapshot)) = self.pending.front() {
            if !self.store.events_settled(snapshot).await? {
                break;
            }
            self.horizon = self.horizon.max(*last);
            self.pending.pop_front();
        }
        Ok(self.horizon)
    }

    /// The events after `after` the horizon allows, at most `limit`; moves the
    /// horizon first when `after` has reached it.
    pub async fn read(&mut self, after: i64, limit: i64) -> Result<Vec<Event>, StoreError> {
        if after >= self.horizon {
            self.advance().await?;
        }
        if after >= self.horizon {
            return Ok(Vec::new());
        }
        self.store.events_after(after, self.horizon, limit).await
    }
}

/// The account events of one application: streams and retention.
pub struct Events {
    store: Arc<Store>,
    clock: Arc<dyn Clock>,
    settings: EventSettings,
    watchers: Arc<Semaphore>,
    metrics: EventMetrics,
}

impl Events {
    pub fn new(
        store: Arc<Store>,
        clock: Arc<dyn Clock>,
        settings: EventSettings,
        metrics: EventMetrics,
    ) -> Self {
        Self {
            watchers: Arc::new(Semaphore::new(settings.max_watchers)),
            store,
            clock,
            settings,
            metrics,
        }
    }

    /// Where a stream asked to start at `start` starts: the position it reads
    /// after. [`Error::EventsPruned`] when events after `start` were deleted.
    async fn start_after(&self, start: Start, reader: &mut Reader) -> Result<i64, Error> {
        let pruned = self.store.events_pruned().await?;
        match start {
            Start::After(after) if after < pruned => Err(Error::EventsPruned {
                oldest_after: pruned,
            }),
            Start::After(after) => Ok(after),
            Start::Oldest => Ok(pruned),
            Start::Now => Ok(reader.advance().await?),
        }
    }

    /// Opens a stream from `start`: the events in order, then each new one, until
    /// the receiver is dropped or `stop` is cancelled. Refused when
    /// `max_watchers` streams are open.
    pub async fn watch(
        self: &Arc<Self>,
        start: Start,
        stop: CancellationToken,
    ) -> Result<mpsc::Receiver<Result<Event, Error>>, Error> {
        let permit =
            (self.watchers.clone())
                .try_acquire_owned()
                .map_err(|_| Error::Overloaded {
                    what: "event watchers (AUTHD_EVENTS_MAX_WATCHERS)",
                    retry_after: self.settings.poll.max(Duration::from_secs(1)),
                })?;
        let mut reader = Reader::new(self.store.clone());
        let after = self.start_after(start, &mut reader).await?;
        let (sender, receiver) = mpsc::channel(STREAM_BUFFER);
        let events = self.clone();
        tokio::spawn(async move {
            let stream = events.stream(reader, after, sender, permit);
            stop.run_until_cancelled(stream).await;
        });
        Ok(receiver)
    }

    async fn stream(
        self: Arc<Self>,
        mut reader: Reader,
        mut after: i64,
        sender: mpsc::Sender<Result<Event, Error>>,
        _permit: OwnedSemaphorePermit,
    ) {
        self.metrics.watchers.inc();
        let _open = Gauged(&self.metrics.watchers);
        let mut writes = self.store.writes();
        loop {
            writes.borrow_and_update();
            let batch = match reader.read(after, READ_BATCH).await {
                Ok(batch) => batch,
                Err(e) => {
                    tracing::warn!(
                        error = format!("{e:#}"),
                        after,
                        "an event stream ended: reading the events failed"
                    );
                    let _ = sender.send(Err(Error::from(e))).await;
                    return;
                }
            };
            if batch.is_empty() {
                tokio::select! {
                    _ = writes.changed() => {}
                    _ = tokio::time::sleep(self.settings.poll) => {}
                    _ = sender.closed() => return,
                }
                continue;
            }
            // A gap before the first: retention may have deleted what this stream
            // had not sent yet (a subscriber that fell that far behind).
            if batch[0].position != after + 1 {
                match self.store.events_pruned().await {
                    Ok(pruned) if pruned > after => {
                        let error = Error::EventsPruned {
                            oldest_after: pruned,
                        };
                        let _ = sender.send(Err(error)).await;
                        return;
                    }
                    Ok(_) => {}
                    Err(e) => {
                        let _ = sender.send(Err(Error::from(e))).await;
                        return;
                    }
                }
            }
            for event in batch {
                after = event.position;
                // Waits while the subscriber's buffer is full: a slow subscriber
                // holds only its own stream.
                if sender.send(Ok(event)).await.is_err() {
                    return;
                }
                self.metrics.streamed.inc();
            }
        }
    }

    /// One retention pass: deletes the events older than the retention or beyond
    /// the most kept, in statements of [`PRUNE_BATCH`]; how many.
    pub async fn prune(&self) -> Result<u64, Error> {
        let before = self
            .clock
            .millis()
            .saturating_sub(i64::try_from(self.settings.retention.as_millis()).unwrap_or(i64::MAX));
        let keep = i64::try_from(self.settings.max_events).unwrap_or(i64::MAX);
        let mut deleted = 0;
        loop {
            let n = self.store.prune_events(before, keep, PRUNE_BATCH).await?;
            deleted += n;
            self.metrics.pruned.inc_by(n);
            if n < PRUNE_BATCH as u64 {
                return Ok(deleted);
            }
        }
    }

    /// Runs retention every `prune_every` until cancelled, the first time one
    /// interval after the start (a start writes nothing of its own).
    pub async fn prune_every(self: Arc<Self>, stop: CancellationToken) {
        loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep(self.settings.prune_every) => {}
            }
            if let Err(e) = self.prune().await {
                tracing::warn!(error = %e, "deleting old account events failed");
            }
        }
    }
}

/// Takes one off a gauge when dropped.
struct Gauged<'a>(&'a prometheus::IntGauge);

impl Drop for Gauged<'_> {
    fn drop(&mut self) {
        self.0.dec();
    }
}
