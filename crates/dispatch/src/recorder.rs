//! The recorder: finished attempts are recorded in batches, one store
//! transaction ([`Store::record_attempts`]) per batch instead of one per
//! attempt.
//!
//! Each attempt task hands its record to the recorder and awaits its own
//! outcome, so everything after recording (observer, admission, metrics,
//! logs) happens in the same order as with a record of its own. The recorder
//! takes the first record that arrives and every record already queued, up
//! to [`BATCH`]; while other attempts of this process are still running it
//! lingers up to [`LINGER`] for theirs, and flushes at once when every
//! running attempt's record is in the batch. Records that arrive during a
//! flush form the next batch (group commit). With `record_flushes` above
//! one (PostgreSQL), a batch that reaches [`SIDE_BY_SIDE_MIN`] while
//! flushes are running commits beside them on its own connection; a smaller
//! one waits, so light load makes no more commits than with one flush.

use std::sync::Arc;
use std::time::Duration;

use hookd_store::{AttemptRecord, RecordOutcome, StoreError};
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::claim::{Inner, error_chain};

/// Most records in one transaction. With one flush at a time (SQLite) this
/// caps delivered/s at `BATCH` per flush: at 64, with a flush taking ~34 ms
/// behind the SQLite writer in the `fanout` benchmark, that was ~1,900/s —
/// the whole pipeline's rate. 1,024 lets a flush take all that finished
/// meanwhile at any rate the writer sustains (the attempts waiting on
/// records are bounded by the dispatcher's record slots, 4 per global slot).
pub(crate) const BATCH: usize = 1024;

/// The smallest batch that commits beside other flushes (when
/// `record_flushes` allows more than one); a smaller one waits for them.
pub(crate) const SIDE_BY_SIDE_MIN: usize = 64;

/// Longest a batch waits for more records while attempts are still running.
pub(crate) const LINGER: Duration = Duration::from_millis(2);

/// A record waiting for its batch, and where its outcome goes (`None`: it
/// could not be recorded; the lease will expire and the delivery be retried).
struct Pending {
    record: AttemptRecord,
    reply: oneshot::Sender<Option<RecordOutcome>>,
}

/// The handle attempt tasks record through. Cheap to clone; the recorder
/// task ends when every handle is dropped, after flushing what it holds.
#[derive(Debug, Clone)]
pub(crate) struct Recorder {
    tx: mpsc::UnboundedSender<Pending>,
}

impl std::fmt::Debug for Pending {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pending")
            .field("delivery_id", &self.record.lease.delivery_id)
            .finish()
    }
}

impl Recorder {
    /// Starts the recorder task. `hard_stop` abandons a flush that is
    /// waiting to retry (shutdown grace is over), as it abandons attempts.
    pub(crate) fn start(
        inner: Arc<Inner>,
        hard_stop: CancellationToken,
    ) -> (Self, tokio::task::JoinHandle<()>) {
        let (tx, rx) = mpsc::unbounded_channel();
        let task = tokio::spawn(run(inner, rx, hard_stop));
        (Self { tx }, task)
    }

    /// Records `record` with the next batch and returns its outcome, or
    /// `None` if it could not be recorded.
    pub(crate) async fn record(&self, record: AttemptRecord) -> Option<RecordOutcome> {
        let (reply, outcome) = oneshot::channel();
        self.tx.send(Pending { record, reply }).ok()?;
        outcome.await.ok().flatten()
    }
}

async fn run(
    inner: Arc<Inner>,
    mut rx: mpsc::UnboundedReceiver<Pending>,
    hard_stop: CancellationToken,
) {
    // Up to `record_flushes` batches commit side by side; the next one
    // gathers while they do, and waits for one to end before it is sent.
    let mut flushing = JoinSet::new();
    while let Some(first) = rx.recv().await {
        let mut batch = vec![first];
        take_queued(&mut rx, &mut batch);
        if batch.len() < BATCH {
            let deadline = tokio::time::Instant::now() + LINGER;
            // Attempts still running hold a slot of the global semaphore
            // until their record's outcome is back, those in this batch
            // included: more running than batched means more records may
            // come.
            while batch.len() < BATCH && running(&inner) > batch.len() {
                match tokio::time::timeout_at(deadline, rx.recv()).await {
                    Ok(Some(p)) => {
                        batch.push(p);
                        take_queued(&mut rx, &mut batch);
                    }
                    Ok(None) | Err(_) => break,
                }
            }
        }
        // A small batch while a flush is running waits for it, gathering
        // what arrives meanwhile, as with one flush: light load does not
        // pay for more commits (each a WAL flush) with latency. A batch
        // that grows to SIDE_BY_SIDE_MIN (records come faster than one
        // flush writes them) goes beside the running flushes.
        let mut open = true;
        while open && batch.len() < SIDE_BY_SIDE_MIN && !flushing.is_empty() {
            tokio::select! {
                _ = flushing.join_next() => {}
                got = rx.recv() => match got {
                    Some(p) => {
                        batch.push(p);
                        take_queued(&mut rx, &mut batch);
                    }
                    None => open = false,
                },
            }
        }
        while flushing.len() >= inner.config.record_flushes {
            flushing.join_next().await;
        }
        // Whatever queued while every flush was busy joins this batch.
        take_queued(&mut rx, &mut batch);
        let (inner, hard_stop) = (inner.clone(), hard_stop.clone());
        flushing.spawn(async move { flush(&inner, batch, &hard_stop).await });
    }
    while flushing.join_next().await.is_some() {}
}

/// Attempts running in this process (each holds a global permit).
fn running(inner: &Inner) -> usize {
    inner
        .config
        .max_in_flight
        .saturating_sub(inner.global.available_permits())
}

fn take_queued(rx: &mut mpsc::UnboundedReceiver<Pending>, batch: &mut Vec<Pending>) {
    while batch.len() < BATCH {
        match rx.try_recv() {
            Ok(p) => batch.push(p),
            Err(_) => break,
        }
    }
}

/// Records a batch in one transaction, retrying while the store is
/// unavailable for at most the lease period (after that another worker owns
/// the deliveries anyway). Any other error: the records are tried one by
/// one, so one record at fault costs only its own outcome.
async fn flush(inner: &Inner, batch: Vec<Pending>, hard_stop: &CancellationToken) {
    let (records, replies): (Vec<_>, Vec<_>) =
        batch.into_iter().map(|p| (p.record, p.reply)).unzip();
    let give_up = tokio::time::Instant::now() + inner.config.lease;
    let mut wait = Duration::from_millis(50);
    loop {
        match inner.store.record_attempts(records.clone()).await {
            Ok(outcomes) => {
                for (reply, outcome) in replies.into_iter().zip(outcomes) {
                    let _ = reply.send(Some(outcome));
                }
                return;
            }
            Err(e)
                if tokio::time::Instant::now() + wait < give_up
                    && matches!(e, StoreError::Unavailable(_)) =>
            {
                tracing::warn!(count = records.len(), error = %error_chain(&e), "recording attempts failed; retrying");
                tokio::select! {
                    _ = tokio::time::sleep(wait) => {}
                    _ = hard_stop.cancelled() => {
                        tracing::error!(count = records.len(), "shutdown: attempts left unrecorded; their leases will expire and the deliveries will be retried");
                        return;
                    }
                }
                wait = (wait * 2).min(Duration::from_secs(2));
            }
            Err(e) if records.len() > 1 && !matches!(e, StoreError::Unavailable(_)) => {
                tracing::warn!(count = records.len(), error = %error_chain(&e), "recording a batch of attempts failed; recording them one by one");
                for (record, reply) in records.into_iter().zip(replies) {
                    let _ = reply.send(record_one(inner, record, hard_stop).await);
                }
                return;
            }
            Err(e) => {
                for r in &records {
                    tracing::error!(
                        delivery_id = %r.lease.delivery_id,
                        error = %error_chain(&e),
                        "could not record the attempt; the lease will expire and the delivery will be retried"
                    );
                }
                return;
            }
        }
    }
}

/// Records one attempt on its own, retrying as [`flush`] does.
async fn record_one(
    inner: &Inner,
    record: AttemptRecord,
    hard_stop: &CancellationToken,
) -> Option<RecordOutcome> {
    let give_up = tokio::time::Instant::now() + inner.config.lease;
    let mut wait = Duration::from_millis(50);
    loop {
        match inner.store.record_attempt(record.clone()).await {
            Ok(outcome) => return Some(outcome),
            Err(e)
                if tokio::time::Instant::now() + wait < give_up
                    && matches!(e, StoreError::Unavailable(_)) =>
            {
                tracing::warn!(delivery_id = %record.lease.delivery_id, error = %error_chain(&e), "recording the attempt failed; retrying");
                tokio::select! {
                    _ = tokio::time::sleep(wait) => {}
                    _ = hard_stop.cancelled() => return None,
                }
                wait = (wait * 2).min(Duration::from_secs(2));
            }
            Err(e) => {
                tracing::error!(
                    delivery_id = %record.lease.delivery_id,
                    error = %error_chain(&e),
                    "could not record the attempt; the lease will expire and the delivery will be retried"
                );
                return None;
            }
        }
    }
}
