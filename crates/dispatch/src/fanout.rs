//! The fan-out runner (design §9.2, lazy fan-out): materialises the
//! deliveries of events committed with a fan-out job, a batch at a time.
//!
//! Every node runs one; the store keeps them apart (a job is moved on by
//! one transaction at a time, `FOR UPDATE SKIP LOCKED` on PostgreSQL) and
//! holds all the state, so a node that dies between batches leaves the job
//! at its cursor for any node to resume, and one that dies inside a batch
//! leaves nothing of it. After each batch the claim loop is woken: the new
//! deliveries are due at once.

use std::time::Duration;

use hookd_store::StoreError;
use tokio_util::sync::CancellationToken;

use crate::Dispatcher;
use crate::claim::error_chain;

/// How long the runner waits, when it found no job, before looking again.
/// It is not woken by ingest: the ingest wake-up is the claim loop's
/// (`notify_one`), and a second listener would take it from the dispatcher.
/// The delay is the "second hop" the design accepts for lazy fan-out, and
/// only events above the threshold pay it.
pub const FANOUT_POLL: Duration = Duration::from_millis(250);

impl Dispatcher {
    /// Materialises fan-out jobs until `shutdown`: batch after batch while
    /// there are any, then looking again every [`FANOUT_POLL`]. Errors are
    /// logged and retried on the next look: a job's state is in the store,
    /// so nothing is lost by trying again.
    pub async fn run_fanout(&self, shutdown: CancellationToken) {
        while !shutdown.is_cancelled() {
            if let Err(e) = self.fanout_round(&shutdown).await {
                tracing::warn!(error = %error_chain(&e), "materialising fan-out jobs failed");
            }
            tokio::select! {
                _ = shutdown.cancelled() => {}
                _ = tokio::time::sleep(FANOUT_POLL) => {}
            }
        }
    }

    /// Materialises batches until no job is left for this node (or
    /// `shutdown`); returns how many deliveries it created. For tests,
    /// which drive rounds themselves.
    pub async fn fanout_round(&self, shutdown: &CancellationToken) -> Result<u64, StoreError> {
        let mut created = 0;
        while !shutdown.is_cancelled() {
            let Some(step) = self.store().materialize_fanout().await? else {
                break;
            };
            created += step.created;
            metrics::counter!("hookd_fanout_deliveries_created_total").increment(step.created);
            if step.created > 0 {
                self.wake().notify_one();
            }
            if step.finished {
                tracing::debug!(event_id = %step.event_id, "fan-out job finished");
            }
            // A crash between batches, for the end-to-end tests.
            fail::fail_point!("fanout.after_batch");
        }
        let backlog = self.store().fanout_backlog().await?;
        metrics::gauge!("hookd_fanout_jobs_pending").set(backlog.jobs as f64);
        metrics::gauge!("hookd_fanout_deliveries_pending").set(backlog.deliveries as f64);
        Ok(created)
    }
}
