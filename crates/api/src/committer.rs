//! The group committer: concurrent ingests share one store transaction.
//!
//! Each `POST /events` hands its event and deliveries to one committer task
//! and awaits its own result; the task takes the first that arrives and
//! every one already queued (up to [`MAX_EVENTS`] events, [`MAX_DELIVERIES`]
//! deliveries and [`MAX_PAYLOAD_BYTES`] of payload), accepts them with one
//! [`Store::accept_events`] call — one transaction, one commit — and
//! answers each. There is no linger: while one batch commits, the next one
//! gathers in the queue (classic group commit), so a lone request pays no
//! wait and a busy node commits many events per flush. A request's `202`
//! still follows its own event's commit, which is the ingest promise.
//!
//! An event matched against the fan-out index as last built carries the
//! generation that index was built from, and its batch goes in with
//! [`Store::accept_events_at`]: the store checks, after every event of the
//! batch arrived, that no subscription changed since, and writes nothing
//! otherwise (PostgreSQL in the same round trip as the writes). Those
//! events come back [`Committed::Stale`], to be matched again.
//!
//! The task is started on the first ingest (so building an
//! [`AppState`](crate::AppState) needs no runtime), holds only the store,
//! and ends when every sender is gone, i.e. with the last `AppState`. If it
//! dies (a panic in a store call), waiting requests get an error, never a
//! hang, and the next ingest starts a new task.

use std::sync::{Arc, Mutex};

use hookd_store::{Accepted, BatchOutcome, NewDelivery, NewEvent, Store, StoreError};
use tokio::sync::{mpsc, oneshot};

/// Most events in one transaction.
pub(crate) const MAX_EVENTS: usize = 256;

/// Most deliveries in one transaction (an event over it goes alone).
pub(crate) const MAX_DELIVERIES: usize = 10_000;

/// Most payload bytes in one transaction (an event over it goes alone), so
/// a batch of large payloads does not make one huge transaction.
pub(crate) const MAX_PAYLOAD_BYTES: usize = 8 << 20;

/// An event waiting for its batch, and where its result goes.
struct Pending {
    event: NewEvent,
    deliveries: Vec<NewDelivery>,
    /// The generation of the fan-out index the deliveries were matched
    /// against, to be checked at the commit; `None`: that index was built
    /// after the request arrived, so the match is current already.
    matched_at: Option<i64>,
    reply: oneshot::Sender<Result<Committed, StoreError>>,
}

/// What became of an event handed to the committer.
#[derive(Debug)]
pub(crate) enum Committed {
    /// Committed (or found under its idempotency key).
    Accepted(Accepted),
    /// Not written: a subscription changed after the index its deliveries
    /// were matched against was built. Match again and resubmit.
    Stale(NewEvent),
}

/// The handle ingest goes through. One per [`AppState`](crate::AppState).
#[derive(Debug, Default)]
pub(crate) struct Committer {
    /// The running task's queue; `None` until the first ingest.
    queue: Mutex<Option<mpsc::UnboundedSender<Pending>>>,
}

/// The committer task stopped before answering (it panicked): whether the
/// event was committed is unknown, as after a lost connection.
#[derive(Debug, thiserror::Error)]
#[error("the ingest committer stopped before answering")]
struct CommitterGone;

/// A store error that failed a whole batch, shared by every event of it.
#[derive(Debug, thiserror::Error)]
#[error("the batch of {events} events failed")]
struct BatchFailed {
    events: usize,
    #[source]
    source: Arc<StoreError>,
}

impl Committer {
    /// Accepts `event` and its deliveries with the next batch: the result
    /// [`Store::accept_event`] would give, once that batch has committed.
    /// With `matched_at`, only if the subscription generation is still that
    /// when the batch commits; otherwise nothing is written and the event
    /// comes back ([`Committed::Stale`]).
    pub(crate) async fn accept(
        &self,
        store: &Arc<dyn Store>,
        event: NewEvent,
        deliveries: Vec<NewDelivery>,
        matched_at: Option<i64>,
    ) -> Result<Committed, StoreError> {
        let (reply, answer) = oneshot::channel();
        let gone = || StoreError::Backend(Box::new(CommitterGone));
        self.sender(store)
            .send(Pending {
                event,
                deliveries,
                matched_at,
                reply,
            })
            .map_err(|_| gone())?;
        answer.await.map_err(|_| gone())?
    }

    /// The running task's queue, starting the task if there is none (first
    /// use) or it has died.
    fn sender(&self, store: &Arc<dyn Store>) -> mpsc::UnboundedSender<Pending> {
        let mut queue = self
            .queue
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        match &*queue {
            Some(tx) if !tx.is_closed() => tx.clone(),
            _ => {
                let (tx, rx) = mpsc::unbounded_channel();
                tokio::spawn(run(store.clone(), rx));
                *queue = Some(tx.clone());
                tx
            }
        }
    }
}

/// The committer task: one batch at a time, until every sender is gone.
async fn run(store: Arc<dyn Store>, mut rx: mpsc::UnboundedReceiver<Pending>) {
    // An event taken from the queue that did not fit the last batch.
    let mut next: Option<Pending> = None;
    loop {
        let first = match next.take() {
            Some(p) => p,
            None => match rx.recv().await {
                Some(p) => p,
                None => return,
            },
        };
        let mut batch = Batch::new(first);
        while batch.events.len() < MAX_EVENTS {
            let Ok(p) = rx.try_recv() else { break };
            if !batch.fits(&p) {
                next = Some(p);
                break;
            }
            batch.push(p);
        }
        // One store call per run of events matched at one generation:
        // almost always the whole batch.
        let mut events = batch.events.into_iter().peekable();
        while let Some(head) = events.next() {
            let matched_at = head.matched_at;
            let mut run = vec![head];
            while let Some(p) = events.next_if(|p| p.matched_at == matched_at) {
                run.push(p);
            }
            flush(store.as_ref(), run, matched_at).await;
        }
    }
}

/// A batch being gathered, with its running totals.
struct Batch {
    events: Vec<Pending>,
    deliveries: usize,
    payload_bytes: usize,
}

impl Batch {
    fn new(first: Pending) -> Self {
        let mut batch = Self {
            events: Vec::with_capacity(16),
            deliveries: 0,
            payload_bytes: 0,
        };
        batch.push(first);
        batch
    }

    fn fits(&self, p: &Pending) -> bool {
        self.deliveries + p.deliveries.len() <= MAX_DELIVERIES
            && self.payload_bytes + p.event.payload.len() <= MAX_PAYLOAD_BYTES
    }

    fn push(&mut self, p: Pending) {
        self.deliveries += p.deliveries.len();
        self.payload_bytes += p.event.payload.len();
        self.events.push(p);
    }
}

/// Accepts a batch in one store call and answers each of its events: at
/// `matched_at`, when given, see [`Pending::matched_at`].
async fn flush(store: &dyn Store, batch: Vec<Pending>, matched_at: Option<i64>) {
    let events = batch.len();
    metrics::histogram!("hookd_ingest_batch_size").record(events as f64);
    let (items, replies): (Vec<_>, Vec<_>) = batch
        .into_iter()
        .map(|p| ((p.event, p.deliveries), p.reply))
        .unzip();
    let outcome = match matched_at {
        Some(generation) => store.accept_events_at(generation, items).await,
        None => store.accept_events(items).await.map(BatchOutcome::Accepted),
    };
    match outcome {
        Ok(BatchOutcome::GenerationMoved(items)) => {
            for (reply, (event, _)) in replies.into_iter().zip(items) {
                let _ = reply.send(Ok(Committed::Stale(event)));
            }
        }
        Ok(BatchOutcome::Accepted(results)) if results.len() == events => {
            for (reply, result) in replies.into_iter().zip(results) {
                // The request may have gone away; its event is accepted all
                // the same.
                let _ = reply.send(result.map(Committed::Accepted));
            }
        }
        Ok(BatchOutcome::Accepted(results)) => {
            let e = StoreError::Backend(
                format!(
                    "accept_events answered {} results for {events} events",
                    results.len()
                )
                .into(),
            );
            answer_all(replies, e);
        }
        Err(e) => answer_all(replies, e),
    }
}

/// Answers every event of a batch with the error that failed it whole.
fn answer_all(replies: Vec<oneshot::Sender<Result<Committed, StoreError>>>, e: StoreError) {
    let events = replies.len();
    tracing::warn!(events, error = %crate::error::chain(&e), "accepting a batch of events failed");
    let source = Arc::new(e);
    let shared = || {
        Box::new(BatchFailed {
            events,
            source: source.clone(),
        })
    };
    for reply in replies {
        // The same variant for each, so each request answers as it would
        // have alone (503 for an unavailable store, 500 otherwise).
        let e = match source.as_ref() {
            StoreError::NotFound => StoreError::NotFound,
            StoreError::Conflict(m) => StoreError::Conflict(m.clone()),
            StoreError::Corrupt(m) => StoreError::Corrupt(m.clone()),
            StoreError::Unavailable(_) => StoreError::Unavailable(shared()),
            StoreError::Backend(_) => StoreError::Backend(shared()),
        };
        let _ = reply.send(Err(e));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_whole_batch_error_keeps_its_kind_for_every_event() {
        let (tx1, rx1) = oneshot::channel();
        let (tx2, rx2) = oneshot::channel();
        answer_all(
            vec![tx1, tx2],
            StoreError::Unavailable("pool timed out".into()),
        );
        for mut rx in [rx1, rx2] {
            let e = rx.try_recv().unwrap().unwrap_err();
            assert!(matches!(e, StoreError::Unavailable(_)), "{e:?}");
            let chain = crate::error::chain(&e);
            assert!(chain.contains("pool timed out"), "{chain}");
        }
    }
}
