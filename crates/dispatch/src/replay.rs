//! The bulk replay runner: moves running replay jobs on, one window at a
//! time (R3: "rate-limited, as a job, with progress").
//!
//! A job sends nothing itself. Each step settles the deliveries it re-queued
//! that have finished and re-queues more while fewer than its window are
//! outstanding; the dispatcher then sends them under the destination's own
//! admission — cap, circuit, rate, ramp — like any delivery. The window
//! comes from the destination's live state here
//! ([`replay_window`](hookd_domain::replay::replay_window)): nothing is
//! re-queued while its circuit is open, one at a time while it is
//! half-open, about a second of admitted work while it is closed.

use hookd_domain::replay::replay_window;
use hookd_store::{ReplayJob, StoreError};
use tokio_util::sync::CancellationToken;

use crate::Dispatcher;
use crate::claim::error_chain;

/// Most jobs moved on per round.
const JOBS_PER_ROUND: u32 = 256;

impl Dispatcher {
    /// Moves running replay jobs on every
    /// [`replay_every`](crate::DispatchConfig::replay_every) until
    /// `shutdown`. Errors are logged and retried next round: a job's state
    /// is in the store, so nothing is lost by trying again.
    pub async fn run_replay_jobs(&self, shutdown: CancellationToken) {
        let every = self.config().replay_every;
        while !shutdown.is_cancelled() {
            if let Err(e) = self.replay_round().await {
                tracing::warn!(error = %error_chain(&e), "moving replay jobs on failed");
            }
            tokio::select! {
                _ = shutdown.cancelled() => {}
                _ = tokio::time::sleep(every) => {}
            }
        }
    }

    /// One round over the running jobs; returns how many deliveries were
    /// re-queued. For tests, which drive rounds themselves.
    pub async fn replay_round(&self) -> Result<u32, StoreError> {
        let jobs = self.store().running_replay_jobs(JOBS_PER_ROUND).await?;
        let mut requeued = 0;
        for job in jobs {
            requeued += self.step(&job).await?;
        }
        if requeued > 0 {
            self.wake().notify_one();
        }
        Ok(requeued)
    }

    async fn step(&self, job: &ReplayJob) -> Result<u32, StoreError> {
        let window = match self.store().get_subscription(&job.sub_id).await {
            Ok(sub) => replay_window(
                self.admission().snapshot(sub.url.host()).as_ref(),
                self.config().admission.concurrency,
            ),
            // Deleted: the step skips what is left and completes the job.
            Err(StoreError::NotFound) => 1,
            Err(e) => return Err(e),
        };
        let step = self.store().step_replay_job(&job.id, window).await?;
        if step.job.state != job.state {
            tracing::info!(
                job_id = %job.id,
                state = step.job.state.as_str(),
                total = step.job.total,
                done = step.job.done,
                failed = step.job.failed,
                skipped = step.job.skipped,
                "replay job ended"
            );
        }
        metrics::counter!("hookd_replay_requeued_total").increment(u64::from(step.requeued));
        Ok(step.requeued)
    }
}
