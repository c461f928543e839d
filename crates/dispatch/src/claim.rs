//! The claim loop: find destinations with due work, claim what admission
//! allows, and run each attempt as a tracked task.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use hookd_domain::Clock;
use hookd_domain::subscription::SubscriptionState;
use hookd_store::{
    ClaimRequest, ClaimedDelivery, Lease, RecordOutcome, Store, StoreError, SubscriptionPatch,
};
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::DispatchConfig;
use crate::admission::{Admission, HostPermit};
use crate::record::decide;
use crate::send::Sender;

/// Most destinations looked at in one pass.
const DESTINATIONS_PER_PASS: u32 = 512;

/// The dispatcher. Cheap to clone; clones share state.
#[derive(Debug, Clone)]
pub struct Dispatcher {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    store: Arc<dyn Store>,
    sender: Sender,
    admission: Arc<Admission>,
    config: DispatchConfig,
    clock: Arc<dyn Clock>,
    /// Bounds attempts in flight in this process.
    global: Arc<Semaphore>,
    /// Nudged by ingest after a commit, so new work starts without waiting
    /// for the poll interval.
    wake: Arc<Notify>,
    /// Nudged whenever an attempt ends and frees capacity.
    slot_freed: Notify,
}

/// Why the dispatcher could not be built.
#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    /// The configuration breaks an invariant.
    #[error("invalid dispatcher configuration: {0}")]
    Config(String),
    /// The HTTP client could not be built.
    #[error("could not build the HTTP client")]
    Http(#[source] reqwest::Error),
}

/// Work handed to one attempt task.
struct Job {
    claimed: ClaimedDelivery,
    _host: HostPermit,
    _global: OwnedSemaphorePermit,
}

impl Dispatcher {
    /// Builds a dispatcher over `store`. `wake` is shared with ingest.
    pub fn new(
        store: Arc<dyn Store>,
        config: DispatchConfig,
        clock: Arc<dyn Clock>,
        wake: Arc<Notify>,
    ) -> Result<Self, BuildError> {
        config.validate().map_err(BuildError::Config)?;
        let sender = Sender::new(config.attempt_timeout, config.max_response_bytes)
            .map_err(BuildError::Http)?;
        Ok(Self {
            inner: Arc::new(Inner {
                store,
                sender,
                admission: Admission::new(config.host_concurrency),
                global: Arc::new(Semaphore::new(config.max_in_flight)),
                config,
                clock,
                wake,
                slot_freed: Notify::new(),
            }),
        })
    }

    /// Per-destination admission state (for health and metrics).
    pub fn admission(&self) -> &Arc<Admission> {
        &self.inner.admission
    }

    /// Runs until `shutdown` is cancelled: then stops claiming at once, lets
    /// in-flight attempts finish within the grace period, cuts off the rest
    /// and releases their deliveries (their leases would expire anyway; this
    /// only makes them claimable sooner).
    pub async fn run(self, shutdown: CancellationToken) -> Result<(), StoreError> {
        let tracker = TaskTracker::new();
        let hard_stop = CancellationToken::new();
        let unfinished = Arc::new(Mutex::new(Vec::new()));
        let cfg = &self.inner.config;
        let mut next_reclaim = tokio::time::Instant::now();
        let mut backoff = Duration::ZERO;
        tracing::info!(worker_id = %cfg.worker_id, "dispatcher started");

        while !shutdown.is_cancelled() {
            if tokio::time::Instant::now() >= next_reclaim {
                match self.inner.store.reclaim_expired().await {
                    Ok(0) => {}
                    Ok(n) => tracing::info!(count = n, "reclaimed deliveries whose lease expired"),
                    Err(e) => {
                        tracing::warn!(error = %error_chain(&e), "reclaiming expired leases failed")
                    }
                }
                next_reclaim = tokio::time::Instant::now() + cfg.reclaim_every;
            }
            match self.claim_pass(&tracker, &hard_stop, &unfinished).await {
                Ok(0) => {
                    backoff = Duration::ZERO;
                    tokio::select! {
                        _ = shutdown.cancelled() => {}
                        _ = self.inner.wake.notified() => {}
                        _ = self.inner.slot_freed.notified() => {}
                        _ = tokio::time::sleep(cfg.poll_interval) => {}
                    }
                }
                Ok(_) => backoff = Duration::ZERO,
                Err(e) => {
                    // The store is away: back off (with a ceiling) instead of
                    // spinning, and try again by ourselves.
                    backoff =
                        (backoff * 2).clamp(Duration::from_millis(100), Duration::from_secs(2));
                    tracing::warn!(error = %error_chain(&e), retry_in = ?backoff, "claiming failed");
                    tokio::select! {
                        _ = shutdown.cancelled() => {}
                        _ = tokio::time::sleep(backoff) => {}
                    }
                }
            }
        }

        tracker.close();
        tracing::info!(
            in_flight = tracker.len(),
            "dispatcher stopping: no new claims"
        );
        if tokio::time::timeout(cfg.shutdown_grace, tracker.wait())
            .await
            .is_err()
        {
            tracing::warn!(
                in_flight = tracker.len(),
                "shutdown grace over: cutting off attempts"
            );
            hard_stop.cancel();
            tracker.wait().await;
        }
        let leases = std::mem::take(&mut *unfinished.lock().unwrap());
        if !leases.is_empty() {
            let n = self.inner.store.release(&leases).await?;
            tracing::info!(count = n, "released unfinished deliveries");
        }
        tracing::info!("dispatcher stopped");
        Ok(())
    }

    /// One pass, run to completion: claims what is due and admitted, makes
    /// every attempt, records them, and returns how many attempts were made.
    /// For tests, which drive passes themselves instead of sleeping.
    pub async fn dispatch_once(&self) -> Result<usize, StoreError> {
        let tracker = TaskTracker::new();
        let unfinished = Arc::new(Mutex::new(Vec::new()));
        let n = self
            .claim_pass(&tracker, &CancellationToken::new(), &unfinished)
            .await?;
        tracker.close();
        tracker.wait().await;
        Ok(n)
    }

    /// Claims what admission allows and spawns one task per claimed
    /// delivery. Returns how many were started.
    async fn claim_pass(
        &self,
        tracker: &TaskTracker,
        hard_stop: &CancellationToken,
        unfinished: &Arc<Mutex<Vec<Lease>>>,
    ) -> Result<usize, StoreError> {
        let inner = &self.inner;
        if inner.global.available_permits() == 0 {
            return Ok(0);
        }
        let hosts = inner.store.due_destinations(DESTINATIONS_PER_PASS).await?;
        let mut started = 0;
        for host in hosts {
            let free = inner.global.available_permits() as u32;
            if free == 0 {
                break;
            }
            let n = inner.admission.available(&host).min(free);
            if n == 0 {
                continue;
            }
            let req = ClaimRequest {
                worker_id: inner.config.worker_id.clone(),
                destination: host.clone(),
                limit: n,
                lease: inner.config.lease,
            };
            let claimed = inner.store.claim_due(&req).await?;
            let mut refused = Vec::new();
            for c in claimed {
                // This loop is the only claimer in the process, so capacity
                // checked above is still there; if not, give the row back.
                let permits = inner
                    .admission
                    .admit(&host)
                    .zip(inner.global.clone().try_acquire_owned().ok());
                let Some((host_permit, global_permit)) = permits else {
                    refused.push(c.lease);
                    continue;
                };
                let job = Job {
                    claimed: c,
                    _host: host_permit,
                    _global: global_permit,
                };
                tracker.spawn(attempt(
                    inner.clone(),
                    job,
                    hard_stop.clone(),
                    unfinished.clone(),
                ));
                started += 1;
            }
            if !refused.is_empty() {
                inner.store.release(&refused).await?;
            }
        }
        Ok(started)
    }
}

/// One attempt of one delivery, from send to record.
async fn attempt(
    inner: Arc<Inner>,
    job: Job,
    hard_stop: CancellationToken,
    unfinished: Arc<Mutex<Vec<Lease>>>,
) {
    let lease = job.claimed.lease;
    tokio::select! {
        _ = run_attempt(&inner, &job.claimed) => {}
        _ = hard_stop.cancelled() => unfinished.lock().unwrap().push(lease),
    }
    drop(job);
    inner.slot_freed.notify_one();
}

async fn run_attempt(inner: &Inner, claimed: &ClaimedDelivery) {
    let cfg = &inner.config;
    let number = claimed.delivery.attempt + 1;
    let sent = tokio::select! {
        sent = inner.sender.send(claimed, number, inner.clock.as_ref()) => sent,
        never = renew_while_running(inner, claimed.lease) => match never {},
    };
    let now = inner.clock.now();
    let decision = decide(
        claimed,
        claimed.lease,
        sent,
        &cfg.retry,
        now,
        rand::random::<f64>(),
    );
    tracing::debug!(
        delivery_id = %claimed.delivery.id,
        destination = %claimed.delivery.destination_host,
        attempt = number,
        status = ?decision.record.attempt.status,
        error_class = ?decision.record.attempt.error_class,
        next = ?decision.record.next,
        "attempt finished"
    );
    let disable = decision.disable_subscription;
    match record_with_retry(inner, decision.record).await {
        Some(RecordOutcome::Recorded) => {}
        Some(RecordOutcome::LeaseLost) => tracing::warn!(
            delivery_id = %claimed.delivery.id,
            "lease lost before the attempt was recorded; the newer claim owns the delivery"
        ),
        None => {}
    }
    if disable {
        let patch = SubscriptionPatch {
            state: Some(SubscriptionState::Disabled),
            ..Default::default()
        };
        match inner
            .store
            .update_subscription(&claimed.subscription.id, patch)
            .await
        {
            Ok(_) => {
                tracing::warn!(sub_id = %claimed.subscription.id, "destination answered 410 Gone: subscription disabled")
            }
            Err(e) => {
                tracing::error!(sub_id = %claimed.subscription.id, error = %error_chain(&e), "could not disable subscription after 410")
            }
        }
    }
}

/// Renews the lease every `renew_every` for as long as it is polled.
async fn renew_while_running(inner: &Inner, lease: Lease) -> std::convert::Infallible {
    let cfg = &inner.config;
    let mut lost = false;
    loop {
        tokio::time::sleep(cfg.renew_every).await;
        if lost {
            continue;
        }
        match inner.store.renew_lease(&lease, cfg.lease).await {
            Ok(true) => {}
            Ok(false) => {
                lost = true;
                tracing::warn!(delivery_id = %lease.delivery_id, "lease lost while the attempt was running");
            }
            Err(e) => {
                tracing::warn!(delivery_id = %lease.delivery_id, error = %error_chain(&e), "lease renewal failed")
            }
        }
    }
}

/// Records an attempt, retrying while the store is unavailable, for at most
/// the lease period: after that another worker owns the delivery anyway.
async fn record_with_retry(
    inner: &Inner,
    record: hookd_store::AttemptRecord,
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
                tokio::time::sleep(wait).await;
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

/// An error and all its causes, for logs.
pub(crate) fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut src = e.source();
    while let Some(cause) = src {
        s.push_str(": ");
        s.push_str(&cause.to_string());
        src = cause.source();
    }
    s
}
