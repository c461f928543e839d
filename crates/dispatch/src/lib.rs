//! hookd's dispatcher: the loop that turns pending deliveries into attempts.
//!
//! One pass: ask the store which destinations have due work
//! ([`claim`]), ask [`admission`] how many attempts each may take now, claim
//! that many under a lease, then for each claimed delivery sign and send it
//! ([`send`]), decide its next state from the pure domain rules
//! ([`record`]), and record the attempt conditional on the lease.
//!
//! # What this crate must not do
//! Name a storage backend (it sees only `dyn Store`), hold per-destination
//! state in statics, or make a decision that belongs in `hookd-domain`.
#![warn(missing_docs)]

pub mod admission;
mod claim;
pub mod egress;
pub mod fanout;
pub mod gossip;
pub mod record;
mod recorder;
mod replay;
pub mod send;

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use hookd_domain::SubscriptionId;
use hookd_domain::isolation::AdmissionConfig;
use hookd_domain::retry::RetrySchedule;
use hookd_store::{SignalKind, Store, StoreError, Subscription};

pub use claim::{Dispatcher, IngestQueue, error_chain};

/// What the dispatcher tells the rest of the process about subscriptions.
/// The binary installs one that feeds the health monitor and announces
/// signals as system events; without it, [`StoreObserver`] does the store
/// part alone.
#[async_trait]
pub trait Observer: Send + Sync + std::fmt::Debug {
    /// An attempt of one of its deliveries finished, `delivered` or not
    /// (cheap: called once per attempt).
    fn attempt_finished(&self, sub_id: &SubscriptionId, delivered: bool);

    /// Its destination answered 410 Gone: disable it, and say so.
    async fn destination_gone(&self, sub: &Subscription) -> Result<(), StoreError>;
}

/// The observer used when none is installed: disables a subscription whose
/// destination is gone by raising its [`Disabled`](SignalKind::Disabled)
/// signal, without a system event.
#[derive(Debug)]
pub struct StoreObserver {
    store: Arc<dyn Store>,
}

impl StoreObserver {
    /// Over `store`.
    pub fn new(store: Arc<dyn Store>) -> Self {
        Self { store }
    }
}

/// The detail of the [`Disabled`](SignalKind::Disabled) signal a 410 raises.
pub const GONE_DETAIL: &str = "the destination answered 410 Gone";

#[async_trait]
impl Observer for StoreObserver {
    fn attempt_finished(&self, _sub_id: &SubscriptionId, _delivered: bool) {}

    async fn destination_gone(&self, sub: &Subscription) -> Result<(), StoreError> {
        self.store
            .raise_signal(&sub.id, SignalKind::Disabled, GONE_DETAIL, None)
            .await
            .map(|_| ())
    }
}

/// Everything the dispatcher needs to be told. Built by the binary from its
/// configuration; every field is explicit because none has an honest
/// default that fits every deployment.
#[derive(Debug, Clone)]
pub struct DispatchConfig {
    /// Recorded on claimed rows, so an operator can see who holds what.
    pub worker_id: String,
    /// How long a claim is owned before another worker may take it.
    /// Must exceed `attempt_timeout`, so a live attempt never loses its lease.
    pub lease: Duration,
    /// The one deadline for a whole exchange: connect, headers, body.
    pub attempt_timeout: Duration,
    /// How often a running attempt renews its lease.
    pub renew_every: Duration,
    /// Attempts in flight at once in this process, across all destinations.
    pub max_in_flight: usize,
    /// Per-destination isolation: the concurrency cap (design §6 layer 1),
    /// circuit breaker, adaptive rate and recovery ramp.
    pub admission: AdmissionConfig,
    /// A due delivery older than this counts as backlog, which keeps a
    /// guaranteed share of its destination's concurrency (R4).
    pub backlog_age: Duration,
    /// How long to wait for new work when a pass found none and nothing
    /// woke the dispatcher.
    pub poll_interval: Duration,
    /// How often this worker returns expired leases to `pending`.
    pub reclaim_every: Duration,
    /// On shutdown, how long in-flight attempts may take to finish before
    /// they are cut off and their deliveries released.
    pub shutdown_grace: Duration,
    /// The server-wide retry defaults; subscriptions override them.
    pub retry: RetrySchedule,
    /// Most response-body bytes read per attempt.
    pub max_response_bytes: usize,
    /// How often running bulk replay jobs are moved on.
    pub replay_every: Duration,
    /// Record batches committing at once (2): PostgreSQL commits them side
    /// by side on separate connections, so while one waits on its flush the
    /// next is already running (the `fanout` benchmark: 4,700 → 8,000
    /// deliveries/s with four, when an attempt held its global slot until
    /// its record was in). Now that answered attempts wait on record slots
    /// of their own, two make fewer, larger batches than four, and the
    /// server spends about 5 % less CPU on the same deliveries (session 32
    /// in docs/benchmarks.md); one lets records pile up (RSS +40 %). A
    /// store with one writer serialises them anyway, and is better served
    /// by 1 (the binary sets it for SQLite).
    pub record_flushes: usize,
    /// Where attempts may go (the connect-time SSRF check), how host names
    /// are resolved, and the outbound proxy.
    pub egress: egress::Egress,
}

impl DispatchConfig {
    /// The design's values (§6, §7): lease 90 s, timeout 30 s, renewal every
    /// 30 s, 20 in flight per host, breaker/rate/ramp as in
    /// `hookd_domain::isolation`; public destinations only, system
    /// resolver, no proxy.
    pub fn standard(worker_id: String) -> Self {
        Self {
            worker_id,
            lease: Duration::from_secs(90),
            attempt_timeout: Duration::from_secs(30),
            renew_every: Duration::from_secs(30),
            max_in_flight: 1024,
            admission: AdmissionConfig::default(),
            backlog_age: Duration::from_secs(30),
            poll_interval: Duration::from_millis(500),
            reclaim_every: Duration::from_secs(5),
            shutdown_grace: Duration::from_secs(10),
            retry: RetrySchedule::default(),
            max_response_bytes: 64 * 1024,
            replay_every: Duration::from_millis(250),
            record_flushes: 2,
            egress: egress::Egress::default(),
        }
    }

    /// Checks the invariants between values.
    pub fn validate(&self) -> Result<(), String> {
        if self.attempt_timeout >= self.lease {
            return Err(format!(
                "the attempt timeout ({:?}) must be shorter than the lease ({:?}), or a live attempt could lose its delivery to another worker",
                self.attempt_timeout, self.lease
            ));
        }
        if self.renew_every.is_zero() || self.renew_every >= self.lease {
            return Err("lease renewal must be more frequent than the lease".into());
        }
        if self.max_in_flight == 0 || self.admission.concurrency == 0 || self.record_flushes == 0 {
            return Err("concurrency limits must be at least 1".into());
        }
        Ok(())
    }
}
