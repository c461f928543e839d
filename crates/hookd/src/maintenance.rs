//! Retention: the background task that removes expired history (design
//! §9.3, R3) without touching the hot path.
//!
//! Every `every`, it asks the store to remove finished deliveries (and their
//! attempts) older than `deliveries`, and events older than `events` that no
//! delivery refers to. The store folds every attempt it removes into the
//! daily rollup first, so `/stats` never changes. PostgreSQL drops whole day
//! partitions; SQLite deletes small batches, and this task pauses between
//! them so ingest and the dispatcher always get the writer in between.

use std::sync::Arc;
use std::time::Duration;

use hookd_store::{RetentionPolicy, RetentionReport, Store, StoreError};
use tokio_util::sync::CancellationToken;

/// How long history is kept, and how it is removed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RetentionConfig {
    /// Finished deliveries and their attempts (7 days: R3).
    pub deliveries: Duration,
    /// Events (30 days: R3's "we retain the event for 30 days").
    pub events: Duration,
    /// How often a pass runs.
    pub every: Duration,
    /// Rows per table per batch (SQLite).
    pub batch: u32,
    /// The pause between batches.
    pub pause: Duration,
}

impl Default for RetentionConfig {
    fn default() -> Self {
        Self {
            deliveries: Duration::from_secs(7 * 86_400),
            events: Duration::from_secs(30 * 86_400),
            every: Duration::from_secs(3600),
            batch: 500,
            pause: Duration::from_millis(50),
        }
    }
}

fn before(now: chrono::DateTime<chrono::Utc>, keep: Duration) -> chrono::DateTime<chrono::Utc> {
    chrono::Duration::from_std(keep)
        .ok()
        .and_then(|d| now.checked_sub_signed(d))
        .unwrap_or(chrono::DateTime::<chrono::Utc>::MIN_UTC)
}

/// One whole pass: batches until the store says nothing more is due.
pub async fn retention_pass(
    store: &dyn Store,
    config: &RetentionConfig,
    shutdown: &CancellationToken,
) -> Result<RetentionReport, StoreError> {
    let now = chrono::Utc::now();
    let policy = RetentionPolicy {
        deliveries_before: before(now, config.deliveries),
        events_before: before(now, config.events),
        batch: config.batch.max(1),
    };
    let mut total = RetentionReport::default();
    loop {
        let r = store.enforce_retention(&policy).await?;
        total.deliveries += r.deliveries;
        total.attempts += r.attempts;
        total.events += r.events;
        total.partitions_dropped += r.partitions_dropped;
        if !r.more || shutdown.is_cancelled() {
            return Ok(total);
        }
        tokio::select! {
            _ = shutdown.cancelled() => return Ok(total),
            _ = tokio::time::sleep(config.pause) => {}
        }
    }
}

/// Runs a pass at start and every `config.every` until `shutdown`.
pub async fn run_retention(
    store: Arc<dyn Store>,
    config: RetentionConfig,
    shutdown: CancellationToken,
) {
    while !shutdown.is_cancelled() {
        match retention_pass(store.as_ref(), &config, &shutdown).await {
            Ok(r) if r == RetentionReport::default() => {}
            Ok(r) => tracing::info!(
                deliveries = r.deliveries,
                attempts = r.attempts,
                events = r.events,
                partitions_dropped = r.partitions_dropped,
                "retention removed expired history"
            ),
            Err(e) => tracing::warn!(error = %e, "retention pass failed; retrying next time"),
        }
        tokio::select! {
            _ = shutdown.cancelled() => {}
            _ = tokio::time::sleep(config.every) => {}
        }
    }
}
