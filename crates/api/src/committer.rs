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

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use hookd_domain::delivery::DeliveryState;
use hookd_store::{
    Accepted, BatchOutcome, ClaimedDelivery, Delivery, Event, IngestClaim, Lease, NewDelivery,
    NewEvent, Store, StoreError, Subscription,
};
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
    /// Per delivery, its subscription when the delivery may be claimed at
    /// ingest (see [`IngestHandoff`]); empty when none may.
    claimable: Vec<Option<Arc<Subscription>>>,
    reply: oneshot::Sender<Result<Committed, StoreError>>,
}

/// Where deliveries claimed at ingest go: the dispatcher of this process
/// (§9.1's in-memory per-destination queue, fed from ingest as well as from
/// the claim loop). A delivery so claimed is written `inflight` with its
/// lease in the ingest transaction and handed over after the commit, so it
/// is sent without a claim's round trip and without its row being written
/// twice. The binary installs it when this process also dispatches.
pub trait IngestHandoff: Send + Sync + std::fmt::Debug {
    /// Who claims (the dispatcher's worker id).
    fn worker_id(&self) -> &str;
    /// How long a claim's lease lasts.
    fn lease(&self) -> Duration;
    /// Holds room for up to `n` new deliveries to `host` and returns for
    /// how many; each reservation comes back through
    /// [`hand_over`](Self::hand_over), whatever became of the batch.
    fn reserve(&self, host: &str, n: u32) -> u32;
    /// The deliveries created claimed, and the reservations they were
    /// claimed under (host, count), all given back.
    fn hand_over(&self, reserved: &[(String, u32)], claimed: Vec<ClaimedDelivery>);
}

/// What became of an event handed to the committer.
#[derive(Debug)]
pub(crate) enum Committed {
    /// Committed (or found under its idempotency key), with how many of its
    /// deliveries were created claimed and handed to the dispatcher (which
    /// needs no wake for them).
    Accepted(Accepted, usize),
    /// Not written: a subscription changed after the index its deliveries
    /// were matched against was built. Match again and resubmit.
    Stale(NewEvent),
}

/// The handle ingest goes through. One per [`AppState`](crate::AppState).
#[derive(Debug, Default)]
pub(crate) struct Committer {
    /// The running task's queue; `None` until the first ingest.
    queue: Mutex<Option<mpsc::UnboundedSender<Pending>>>,
    /// Set once, before the first ingest, when this process dispatches.
    handoff: OnceLock<Arc<dyn IngestHandoff>>,
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
        claimable: Vec<Option<Arc<Subscription>>>,
    ) -> Result<Committed, StoreError> {
        let (reply, answer) = oneshot::channel();
        let gone = || StoreError::Backend(Box::new(CommitterGone));
        self.sender(store)
            .send(Pending {
                event,
                deliveries,
                matched_at,
                claimable,
                reply,
            })
            .map_err(|_| gone())?;
        answer.await.map_err(|_| gone())?
    }

    /// Installs where deliveries claimed at ingest go (the first one set
    /// stays; before the first ingest).
    pub(crate) fn set_handoff(&self, handoff: Arc<dyn IngestHandoff>) {
        let _ = self.handoff.set(handoff);
    }

    /// Whether deliveries may be claimed at ingest at all.
    pub(crate) fn claims(&self) -> bool {
        self.handoff.get().is_some()
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
                tokio::spawn(run(store.clone(), self.handoff.get().cloned(), rx));
                *queue = Some(tx.clone());
                tx
            }
        }
    }
}

/// The committer task: one batch at a time, until every sender is gone.
async fn run(
    store: Arc<dyn Store>,
    handoff: Option<Arc<dyn IngestHandoff>>,
    mut rx: mpsc::UnboundedReceiver<Pending>,
) {
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
            flush(store.as_ref(), handoff.as_deref(), run, matched_at).await;
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
async fn flush(
    store: &dyn Store,
    handoff: Option<&dyn IngestHandoff>,
    batch: Vec<Pending>,
    matched_at: Option<i64>,
) {
    let events = batch.len();
    metrics::histogram!("hookd_ingest_batch_size").record(events as f64);
    let plan = handoff.map(|h| ClaimPlan::new(h, &batch));
    let (items, replies): (Vec<_>, Vec<_>) = batch
        .into_iter()
        .map(|p| ((p.event, p.deliveries), p.reply))
        .unzip();
    let (outcome, claimed) = match (&plan, matched_at) {
        (Some(plan), _) if !plan.claim.deliveries.is_empty() => {
            match store
                .accept_events_claiming(matched_at, items, &plan.claim)
                .await
            {
                Ok((outcome, leases)) => (Ok(outcome), leases),
                Err(e) => (Err(e), Vec::new()),
            }
        }
        (_, Some(generation)) => (store.accept_events_at(generation, items).await, Vec::new()),
        (_, None) => (
            store.accept_events(items).await.map(BatchOutcome::Accepted),
            Vec::new(),
        ),
    };
    // Every reservation goes back, with whatever was claimed under it.
    let mut per_event: HashMap<hookd_domain::EventId, usize> = HashMap::new();
    if let (Some(handoff), Some(mut plan)) = (handoff, plan) {
        let reserved = std::mem::take(&mut plan.reserved);
        let claimed = plan.claimed(claimed);
        for c in &claimed {
            *per_event.entry(c.event.id).or_default() += 1;
        }
        metrics::counter!("hookd_ingest_claimed_total").increment(claimed.len() as u64);
        handoff.hand_over(&reserved, claimed);
    }
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
                let _ = reply.send(result.map(|a| {
                    let claimed = if a.duplicate {
                        0
                    } else {
                        per_event.get(&a.event_id).copied().unwrap_or(0)
                    };
                    Committed::Accepted(a, claimed)
                }));
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

/// Which deliveries of a batch to create claimed, the room reserved for
/// them, and what the dispatcher needs to send each.
struct ClaimPlan {
    claim: IngestClaim,
    /// (host, count) reserved with the handoff.
    reserved: Vec<(String, u32)>,
    /// Per delivery named in `claim`: its event (a copy: the batch goes to
    /// the store) and subscription.
    parts: HashMap<hookd_domain::DeliveryId, (Arc<Event>, NewDelivery, Arc<Subscription>)>,
}

impl ClaimPlan {
    /// Reserves room per host for the batch's claimable deliveries, first
    /// come first served, and names as many as each host got.
    fn new(handoff: &dyn IngestHandoff, batch: &[Pending]) -> Self {
        // Per host, in the order hosts first appear: one map lookup per
        // delivery (a batch holds up to 10,000 deliveries to as many hosts).
        let mut wanted: Vec<(&str, u32)> = Vec::new();
        let mut slot: HashMap<&str, usize> = HashMap::new();
        for p in batch {
            for (d, sub) in p.deliveries.iter().zip(&p.claimable) {
                if sub.is_some() {
                    let host = d.destination_host.as_str();
                    let i = *slot.entry(host).or_insert_with(|| {
                        wanted.push((host, 0));
                        wanted.len() - 1
                    });
                    wanted[i].1 += 1;
                }
            }
        }
        let mut left: HashMap<&str, u32> = HashMap::new();
        let mut reserved = Vec::new();
        for (host, n) in wanted {
            let got = handoff.reserve(host, n);
            if got > 0 {
                left.insert(host, got);
                reserved.push((host.to_owned(), got));
            }
        }
        let now = chrono::Utc::now();
        let mut deliveries = HashSet::new();
        let mut parts = HashMap::new();
        for p in batch {
            let mut event: Option<Arc<Event>> = None;
            for (d, sub) in p.deliveries.iter().zip(&p.claimable) {
                let Some(sub) = sub else { continue };
                let Some(n) = left
                    .get_mut(d.destination_host.as_str())
                    .filter(|n| **n > 0)
                else {
                    continue;
                };
                *n -= 1;
                let event = event.get_or_insert_with(|| {
                    Arc::new(Event {
                        id: p.event.id,
                        event_type: p.event.event_type.clone(),
                        payload: p.event.payload.clone(),
                        idempotency_key: p.event.idempotency_key.clone(),
                        customer_id: p.event.customer_id.clone(),
                        created_at: now,
                    })
                });
                deliveries.insert(d.id);
                parts.insert(d.id, (event.clone(), d.clone(), sub.clone()));
            }
        }
        Self {
            claim: IngestClaim {
                worker_id: handoff.worker_id().to_owned(),
                lease: handoff.lease(),
                deliveries,
            },
            reserved,
            parts,
        }
    }

    /// What the dispatcher sends for each lease the store returned: the
    /// delivery as the store wrote it (`inflight`, attempt 0, due and
    /// created now), its event and its subscription as matched, which the
    /// commit's generation check says is the subscription as it is now.
    fn claimed(mut self, leases: Vec<Lease>) -> Vec<ClaimedDelivery> {
        let now = chrono::Utc::now();
        leases
            .into_iter()
            .filter_map(|lease| {
                let (event, d, sub) = self.parts.remove(&lease.delivery_id)?;
                Some(ClaimedDelivery {
                    lease,
                    delivery: Delivery {
                        id: d.id,
                        event_id: event.id,
                        sub_id: d.sub_id,
                        event_type: event.event_type.clone(),
                        destination_host: d.destination_host,
                        state: DeliveryState::Inflight,
                        attempt: 0,
                        next_attempt_at: event.created_at,
                        last_status: None,
                        last_error: None,
                        created_at: event.created_at,
                        window_start: event.created_at,
                        updated_at: now,
                    },
                    event: Event::clone(&event),
                    subscription: Subscription::clone(&sub),
                })
            })
            .collect()
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
