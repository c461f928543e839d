//! hookd's domain: the types every other crate speaks, and the decisions that
//! do not need I/O.
//!
//! # Layout
//! - [`id`]: typed, prefixed identifiers (`sub_…`, `evt_…`, `dlv_…`).
//! - [`clock`]: the [`Clock`](clock::Clock) seam, with a fake for tests.
//! - [`event_type`]: event type names and subscription patterns (`invoice.*`, `*`).
//! - [`matching`]: the in-memory fan-out index from event type to subscriptions.
//! - [`destination`]: parsing a subscription URL into a trusted destination.
//! - [`subscription`], [`delivery`]: the records and their states.
//! - [`retry`]: the retry schedule (full jitter, capped, bounded by age and count).
//! - [`classify`]: what an HTTP response or transport error means for a delivery.
//! - [`health`]: the "likely configuration error" judgement shown on
//!   `/health` (R6).
//! - [`signing`]: Standard Webhooks signatures and the stable idempotency key.
//! - [`isolation`]: per-destination admission: concurrency cap, circuit
//!   breaker, adaptive token bucket, recovery ramp, fair share, backlog floor.
//! - [`replay`]: how much of a bulk replay job waits in a destination's queue.
//! - [`shedding`]: when a stuck backlog makes ingest refuse a subscription's
//!   events (R4's escape valve).
//! - [`stats`]: latency percentiles of the daily rollup.
//!
//! # What this crate must not do
//! No tokio, no sqlx, no axum, no reqwest, no reading the wall clock except
//! through [`clock::SystemClock`]. Every decision is a plain function of its
//! inputs, so it can be tested with a fake clock and fixed randomness.
#![warn(missing_docs)]

pub mod classify;
pub mod clock;
pub mod delivery;
pub mod destination;
pub mod event_type;
pub mod health;
pub mod id;
pub mod isolation;
pub mod matching;
pub mod placement;
pub mod replay;
pub mod retry;
pub mod shedding;
pub mod signing;
pub mod stats;
pub mod subscription;

pub use clock::{Clock, FakeClock, SystemClock};
pub use id::{CustomerId, DeliveryId, EventId, JobId, SubscriptionId};

/// A point in time, always UTC.
pub type Timestamp = chrono::DateTime<chrono::Utc>;
