//! hookd's storage seam.
//!
//! [`Store`] is the one trait every backend implements (SQLite for the
//! embedded default, PostgreSQL for scale). It speaks domain types only: no
//! SQL type crosses it, and SQL lives only in the backend crates.
//!
//! # Main types
//! - [`Store`]: the domain operations, each with its contract.
//! - [`StoreError`]: what can go wrong, for callers to match on.
//! - The record types in [`types`].
//! - `conformance` (feature `conformance`): the behaviour suite every backend
//!   runs, one test per contract clause.
//!
//! # What this crate must not do
//! Name a backend, or hold any I/O of its own.
#![warn(missing_docs)]

#[cfg(feature = "conformance")]
pub mod conformance;
mod error;
pub mod types;

use std::time::Duration;

use async_trait::async_trait;
use hookd_domain::{DeliveryId, EventId, SubscriptionId, Timestamp};

pub use error::StoreError;
pub use types::*;

/// Shorthand for store results.
pub type Result<T, E = StoreError> = std::result::Result<T, E>;

/// The storage operations hookd needs, in domain terms.
///
/// Every method is atomic: it either takes full effect or none. Times that
/// bound leases and due-ness are read from the store's own clock (the
/// database's `now()`), never the caller's, so nodes with skewed clocks agree.
#[async_trait]
pub trait Store: Send + Sync + std::fmt::Debug + 'static {
    /// Applies pending schema migrations. Idempotent; safe to run from several
    /// processes at once.
    async fn migrate(&self) -> Result<()>;

    /// Whether the store answers (used by readiness checks).
    async fn ping(&self) -> Result<()>;

    // --- subscriptions ---------------------------------------------------

    /// Stores a new subscription. `Conflict` if its id exists.
    /// Bumps the [subscription generation](Store::subscription_generation).
    async fn create_subscription(&self, new: NewSubscription) -> Result<Subscription>;

    /// One subscription. Deleted subscriptions are `NotFound`.
    async fn get_subscription(&self, id: &SubscriptionId) -> Result<Subscription>;

    /// Subscriptions ordered by id (oldest first), after `query.cursor`,
    /// at most `query.limit`, only `query.customer_id`'s when set.
    async fn list_subscriptions(&self, query: &SubscriptionQuery) -> Result<Vec<Subscription>>;

    /// Every subscription that is not deleted, for building the fan-out index.
    async fn all_subscriptions(&self) -> Result<Vec<Subscription>>;

    /// Changes the fields set in `patch`. `NotFound` if absent or deleted.
    /// Bumps the subscription generation.
    async fn update_subscription(
        &self,
        id: &SubscriptionId,
        patch: SubscriptionPatch,
    ) -> Result<Subscription>;

    /// Deletes a subscription: it stops matching events, and its deliveries
    /// that are still `pending` or `inflight` become `failed` with last_error
    /// "subscription deleted", in the same transaction. An in-flight worker's
    /// later result then gets `LeaseLost`, so nothing can return such a row
    /// to `pending` where no claim would ever take it. Its history stays.
    /// `NotFound` if absent or already deleted. Bumps the generation.
    async fn delete_subscription(&self, id: &SubscriptionId) -> Result<()>;

    /// A number that changes whenever any subscription is created, updated or
    /// deleted. Ingest compares it with the generation its fan-out index was
    /// built from, so a node never matches events against a stale index.
    async fn subscription_generation(&self) -> Result<i64>;

    // --- ingest (the outbox) --------------------------------------------

    /// Accepts an event and its deliveries in ONE transaction: the event row
    /// and every delivery row commit together, or nothing does. This is the
    /// durability boundary (design §7): once this returns `Ok`, the event
    /// will be delivered.
    ///
    /// If `event.idempotency_key` is already taken, nothing is written and the
    /// existing event's id is returned with `duplicate: true`. This holds under
    /// concurrency: of N simultaneous calls with one key, exactly one creates.
    ///
    /// Deliveries are unique per (event, subscription). New deliveries are
    /// `pending`, due at once, with `attempt = 0`.
    async fn accept_event(&self, event: NewEvent, deliveries: Vec<NewDelivery>)
    -> Result<Accepted>;

    /// One event. `NotFound` if absent.
    async fn get_event(&self, id: &EventId) -> Result<Event>;

    // --- dispatch ---------------------------------------------------------

    /// Destination hosts that have claimable work now, most overdue first, at
    /// most `limit` hosts, each with the subscriptions that have claimable
    /// work there (with the `next_attempt_at` of their oldest and newest
    /// claimable delivery), most overdue first. A subscription is listed when
    /// [`claim_due`](Store::claim_due) for it would return something, i.e.
    /// it is active and has a `pending` delivery with `next_attempt_at <= now`
    /// that is not blocked behind the head of an ordered subscription.
    /// Listing work that is blocked would send the dispatcher to claim
    /// nothing, again and again, for as long as the head waits.
    ///
    /// The per-subscription split is what lets the dispatcher give each
    /// subscription with due work a fair share of its host's cap (R2), and
    /// the oldest/newest times tell it whether a backlog exists beside new
    /// work (R4). Each listed subscription carries its current explicit
    /// `rate_limit`, from which the dispatcher sets the host's rate (the
    /// smallest set there; adaptive when none is), and its explicit
    /// `max_concurrency`, from which it sets the host's cap (the smallest
    /// set there; the server-wide one when none is), without another read.
    async fn due_destinations(&self, limit: u32) -> Result<Vec<DueDestination>>;

    /// Claims up to `req.limit` due deliveries of one destination — of one
    /// subscription only when `req.subscription` is set — for active
    /// subscriptions only, in `req.order`: `OldestFirst` takes the smallest
    /// `next_attempt_at` first (the backlog floor, and the usual order),
    /// `NewestFirst` the largest (new work, while a backlog drains beside
    /// it). Each claimed row becomes `inflight`, owned by `req.worker_id`,
    /// with a fresh lease token and `lease_expires = now + req.lease`.
    ///
    /// Two concurrent claimers (in this or another process) never receive the
    /// same delivery while its lease is live: on PostgreSQL this is
    /// `FOR UPDATE SKIP LOCKED`, on SQLite a write transaction.
    ///
    /// **Ordered subscriptions** (`Subscription::ordered`) get their
    /// deliveries one at a time, in event order (delivery id order: ids are
    /// UUIDv7, made at ingest in event order). A delivery of an ordered
    /// subscription is claimable only if, besides being due, no delivery of
    /// the same subscription with a smaller id is `pending` or `inflight`, and
    /// none of that subscription's deliveries is `inflight`. So a head that
    /// fails and waits for its retry blocks everything behind it, even work
    /// that is due, until it is delivered or becomes final (`failed`,
    /// `dead`); and a replayed old delivery goes first again. The check is by
    /// subscription, not by destination, so it holds across a URL change.
    /// This holds under concurrent claimers too: a claimer that skips a head
    /// another claimer is taking still sees the head `pending`, so it takes
    /// nothing of that subscription. Other subscriptions on the same host
    /// are not held up.
    async fn claim_due(&self, req: &ClaimRequest) -> Result<Vec<ClaimedDelivery>>;

    /// Records one attempt (an `attempts` row) and moves the delivery to its
    /// next state, in one transaction, only if `record.lease` is still the
    /// delivery's current lease. If the lease was lost (expired and
    /// re-claimed, or released) the attempt row is still written — it
    /// happened — but the delivery is left untouched and `LeaseLost` is
    /// returned: a late result never overwrites a newer claim.
    async fn record_attempt(&self, record: AttemptRecord) -> Result<RecordOutcome>;

    /// Extends a live lease to `now + lease`. `false` if the lease was lost.
    async fn renew_lease(&self, lease: &Lease, lease_for: Duration) -> Result<bool>;

    /// Gives claimed deliveries back without an attempt (shutdown, or
    /// admission said no after the claim): `inflight` → `pending`, keeping
    /// `next_attempt_at` and `attempt`. Leases that were lost are skipped.
    async fn release(&self, leases: &[Lease]) -> Result<u64>;

    /// Makes deliveries whose lease expired claimable again (`inflight` →
    /// `pending`). Returns how many. Run periodically by every worker.
    async fn reclaim_expired(&self) -> Result<u64>;

    /// Queues a delivery that has finished (`delivered`, `failed`, `dead`) to
    /// be sent again: it becomes `pending`, due now, with a fresh retry
    /// window (`window_start = now`), so the retry policy's age limit counts
    /// from the replay rather than from ingest. `attempt`, the attempt
    /// history and `last_status`/`last_error` are kept, so the next attempt
    /// is numbered `attempt + 1` and the log reads as one story. Returns the
    /// delivery as it is after the call.
    ///
    /// A delivery that is already `pending` or `inflight` is returned
    /// unchanged: it is queued or being sent already, so a replay has nothing
    /// to add, and treating it as an error would make a retried or
    /// double-clicked replay fail. In particular a live lease is not
    /// disturbed.
    ///
    /// `NotFound` if the delivery does not exist; `Conflict("subscription
    /// deleted")` if its subscription is deleted (nothing would ever claim
    /// it).
    async fn replay_delivery(&self, id: &DeliveryId) -> Result<Delivery>;

    // --- reading ----------------------------------------------------------

    /// One delivery with its attempts (oldest first). `NotFound` if absent.
    async fn get_delivery(&self, id: &DeliveryId) -> Result<DeliveryDetail>;

    /// Deliveries matching `query`, newest first (by id), after `query.cursor`,
    /// at most `query.limit`, each with its attempts (oldest first).
    async fn list_deliveries(&self, query: &DeliveryQuery) -> Result<Vec<DeliveryDetail>>;

    /// One subscription's delivery health: how many of its deliveries are
    /// unfinished (`pending` or `inflight`) and since when, how many are
    /// `dead` and since when, and its attempts that started at or after
    /// `since` (a time on the caller's clock, as attempts' `started_at` is)
    /// counted by status or, without one, by error class. Every attempt of
    /// its deliveries counts, including one whose lease was lost. Read as
    /// one snapshot where the backend offers one. `NotFound` if the
    /// subscription is absent or deleted.
    async fn subscription_health(
        &self,
        sub_id: &SubscriptionId,
        since: Timestamp,
    ) -> Result<SubscriptionHealth>;

    // --- tokens -------------------------------------------------------------

    /// Stores an API token's hash and scope. `Conflict` if the hash exists.
    async fn create_token(&self, token: NewToken) -> Result<()>;

    /// The scope of the token with this hash, if any.
    async fn find_token(&self, token_hash: &[u8]) -> Result<Option<TokenScope>>;

    /// Whether an admin token (one with no customer) is stored.
    async fn has_admin_token(&self) -> Result<bool>;
}
