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
pub mod crypto;
mod error;
pub mod fanout;
pub mod types;

use std::time::Duration;

use async_trait::async_trait;
use hookd_domain::{DeliveryId, EventId, JobId, SubscriptionId, Timestamp};

pub use error::StoreError;
pub use fanout::{FanoutBacklog, FanoutStep, LazyFanout};
pub use types::*;

/// Shorthand for store results.
pub type Result<T, E = StoreError> = std::result::Result<T, E>;

/// What [`Store::accept_events_at`] did with a batch.
#[derive(Debug)]
pub enum BatchOutcome {
    /// Accepted as [`Store::accept_events`] would: each event's result, in
    /// input order.
    Accepted(Vec<Result<Accepted>>),
    /// Nothing written: the subscription generation is no longer the one
    /// asked for. The batch, back.
    GenerationMoved(Vec<(NewEvent, Vec<NewDelivery>)>),
}

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

    /// How the database's schema compares with the migrations this build
    /// carries, in one cheap read of the migrations table (a readiness probe
    /// may call it every second). A database never migrated, or restored
    /// from before a migration, is `Behind`; one a newer build migrated is
    /// `Ahead`. Fails as [`ping`](Store::ping) does when the store does not
    /// answer.
    async fn schema_status(&self) -> Result<SchemaStatus>;

    /// How many deliveries of active subscriptions are `pending` and due now
    /// (`next_attempt_at <= now`), and how overdue the oldest of them is
    /// (zero when none), on the store's clock. Its cost grows with the
    /// number of pending deliveries (a range of the pending index), so it is
    /// for a periodic monitor, not for every request.
    async fn due_work(&self) -> Result<DueWork>;

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
    /// Bumps the subscription generation. Setting a `disabled`
    /// subscription's state to `active` also lowers its
    /// [`Disabled`](SignalKind::Disabled) signal and ends its failing streak,
    /// in the same transaction: a later automatic disable is announced
    /// again, and its period counts from the re-enabling.
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

    /// Seals every subscription's signing secrets (`secret` and
    /// `previous_secret`, deleted subscriptions' included) under the current
    /// key of the store's [`Keyring`](crypto::Keyring): those sealed under an
    /// older key of the ring, and legacy plaintext. Returns how many rows it
    /// rewrote; rows already sealed under the current key are left alone, so
    /// a second call returns 0. Each row is read and rewritten in one
    /// transaction (in batches), so a concurrent secret rotation is never
    /// overwritten. The secrets themselves do not change, nor does
    /// `updated_at` or the subscription generation. A row sealed under a key
    /// the ring does not hold fails the call (`Corrupt`), after the batches
    /// before it were committed.
    async fn reseal_secrets(&self) -> Result<u64>;

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
    ///
    /// **Lazy fan-out** (design §9.2): an event with more deliveries than
    /// the store's [`LazyFanout::threshold`] commits, in the same
    /// transaction, the event row and a *fan-out job* holding its planned
    /// deliveries (their ids, made by the caller, included) instead of their
    /// rows, except those of ordered subscriptions, which are written at
    /// once so that no later event's delivery can overtake them. The
    /// promise is the same: the job commits with the event, and
    /// [`materialize_fanout`](Store::materialize_fanout) creates each planned
    /// delivery exactly once, with the id planned here. Until then the
    /// event's deliveries are not all listed.
    async fn accept_event(&self, event: NewEvent, deliveries: Vec<NewDelivery>)
    -> Result<Accepted>;

    /// Accepts many events, each with its deliveries, in ONE transaction
    /// (group commit: one commit, one WAL flush, for the whole batch), and
    /// returns one result per event, in input order.
    ///
    /// Each event is accepted exactly as [`accept_event`](Store::accept_event)
    /// would accept it, the events taken in input order: an event whose
    /// idempotency key is already taken writes nothing and gets the existing
    /// event's id with `duplicate: true`; of two events of the batch with one
    /// key, the first creates and the second is its duplicate. This holds
    /// under concurrency, against other batches and single ingests: of any
    /// number of simultaneous calls naming one key, exactly one event is
    /// created.
    ///
    /// An event that fails as `accept_event` would fail for it (a delivery
    /// naming an unknown subscription, a repeated (event, subscription) pair,
    /// a reused id) gets that error as its result and writes nothing (not its
    /// event row, not any of its deliveries), and only it: the others commit.
    /// If it held an idempotency key, the key stays free, so a later event of
    /// the same batch with that key creates.
    ///
    /// A failure of the store itself (the connection is gone, the commit is
    /// refused, a deadline passes) fails the whole call with `Err`, and
    /// nothing of the batch is written; the caller may retry it whole. `Ok`
    /// means every `Ok(Accepted)` in it is committed (durable as
    /// `accept_event`'s). An empty batch writes nothing and returns nothing.
    async fn accept_events(
        &self,
        batch: Vec<(NewEvent, Vec<NewDelivery>)>,
    ) -> Result<Vec<Result<Accepted>>>;

    /// [`accept_events`](Store::accept_events), but only if the
    /// [subscription generation](Store::subscription_generation), read
    /// after this call began, is still `generation`: the one the batch's
    /// deliveries were matched against. Otherwise nothing is written and
    /// the batch comes back ([`BatchOutcome::GenerationMoved`]), for the
    /// caller to match again. A backend may read the generation in the same
    /// round trip as the writes; by default it is read first.
    async fn accept_events_at(
        &self,
        generation: i64,
        batch: Vec<(NewEvent, Vec<NewDelivery>)>,
    ) -> Result<BatchOutcome> {
        if self.subscription_generation().await? != generation {
            return Ok(BatchOutcome::GenerationMoved(batch));
        }
        self.accept_events(batch).await.map(BatchOutcome::Accepted)
    }

    /// [`accept_events_at`](Store::accept_events_at) (or, with no
    /// `generation`, [`accept_events`](Store::accept_events)), creating the
    /// deliveries named in `claim` already claimed, so a dispatcher on this
    /// node can send them without a claim's round trip (§9.1's in-memory
    /// queue, fed from ingest). Such a delivery is created `inflight`, owned
    /// by `claim.worker_id`, with `lease_expires = now + claim.lease` and a
    /// lease token, exactly as if [`claim_due`](Store::claim_due) had
    /// claimed it the moment it was written; everything else is as
    /// `accept_events_at` writes it (`attempt = 0`, due now). Its lease
    /// behaves as a claim's: record, renew and release take it, and
    /// [`reclaim_expired`](Store::reclaim_expired) returns the delivery to
    /// `pending` once it expires, so a node that dies holding it loses
    /// nothing.
    ///
    /// Returns the outcome and the lease of every delivery created claimed.
    /// A backend may create any of the named deliveries unclaimed
    /// (`pending`, as usual) instead, and the default creates them all so:
    /// only what comes back is claimed. Nothing of a duplicate event, an
    /// event that failed, or a batch whose generation moved is claimed.
    async fn accept_events_claiming(
        &self,
        generation: Option<i64>,
        batch: Vec<(NewEvent, Vec<NewDelivery>)>,
        claim: &IngestClaim,
    ) -> Result<(BatchOutcome, Vec<Lease>)> {
        let _ = claim;
        let outcome = match generation {
            Some(generation) => self.accept_events_at(generation, batch).await?,
            None => BatchOutcome::Accepted(self.accept_events(batch).await?),
        };
        Ok((outcome, Vec::new()))
    }

    /// One event. `NotFound` if absent.
    async fn get_event(&self, id: &EventId) -> Result<Event>;

    /// Moves one unfinished fan-out job on by one batch, in ONE transaction:
    /// creates the batch's planned deliveries (each `pending`, due now,
    /// `attempt = 0`, with the id planned at ingest), advances the job's
    /// cursor, and finishes the job after its last batch. So a crash
    /// between batches resumes at the cursor, and one inside a batch rolls
    /// the whole batch back: no planned delivery is lost or created twice
    /// (a delivery that exists already, by id or by (event, subscription),
    /// is left as it is and not counted in `created`).
    ///
    /// A planned delivery whose subscription has been deleted meanwhile is
    /// created `failed` with last_error "subscription deleted", as
    /// [`delete_subscription`](Store::delete_subscription) would have left
    /// it had it been written at ingest; one of a disabled subscription is
    /// created `pending` and waits, as any of its deliveries does.
    ///
    /// Jobs are taken oldest first. Concurrent callers (in this or another
    /// process) never move one job at once: on PostgreSQL a job in progress
    /// is skipped (`FOR UPDATE SKIP LOCKED`), so callers share the jobs
    /// without waiting; on SQLite each call is a write transaction.
    /// `None` when no job was free to move on.
    async fn materialize_fanout(&self) -> Result<Option<FanoutStep>>;

    /// How many fan-out jobs are unfinished, and how many planned
    /// deliveries they have yet to create. Cheap (an index of unfinished
    /// jobs only), for a gauge.
    async fn fanout_backlog(&self) -> Result<FanoutBacklog>;

    // --- dispatch ---------------------------------------------------------

    /// Destination hosts that have claimable work now, most overdue first, at
    /// most `limit` hosts, each with the subscriptions that have claimable
    /// work there (with the `next_attempt_at` of their oldest and newest
    /// claimable delivery), most overdue first. A subscription is listed when
    /// [`claim_due`](Store::claim_due) for it would return something, i.e.
    /// it is active and has a `pending` delivery with `next_attempt_at <= now`
    /// that is not blocked behind the head of an ordered subscription.
    /// Listing work that is blocked would send the dispatcher to claim
    /// nothing, again and again, for as long as the head waits. A
    /// subscription is listed once, at the host of its oldest claimable
    /// delivery: after a URL change, its deliveries still bound for the old
    /// host go first, then the new host's are listed.
    ///
    /// This runs on every dispatcher pass, so its cost must follow the
    /// number of subscriptions, never the size of the backlog.
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

    /// Claims for many requests at once, each exactly as
    /// [`claim_due`](Store::claim_due) would, and returns what each claimed,
    /// in the order of `reqs`. A delivery is claimed at most once per call
    /// even if two requests could take it (the first does). This is how one
    /// dispatcher pass claims for every destination it admitted: a backend
    /// may do it in one transaction or concurrently, instead of one round
    /// trip per request. On error nothing is claimed, or what was claimed
    /// stays leased and comes back when its lease expires — the same as a
    /// claimer that crashed. The default claims one request after another.
    async fn claim_many(&self, reqs: &[ClaimRequest]) -> Result<Vec<Vec<ClaimedDelivery>>> {
        let mut out = Vec::with_capacity(reqs.len());
        for req in reqs {
            out.push(self.claim_due(req).await?);
        }
        Ok(out)
    }

    /// Records one attempt (an `attempts` row) and moves the delivery to its
    /// next state, in one transaction, only if `record.lease` is still the
    /// delivery's current lease. If the lease was lost (expired and
    /// re-claimed, or released) the attempt row is still written — it
    /// happened — but the delivery is left untouched and `LeaseLost` is
    /// returned: a late result never overwrites a newer claim.
    ///
    /// The attempt row keeps the outcome it caused (`record.next`, or none
    /// when the lease was lost), which the [daily
    /// rollup](Store::daily_stats) counts. The subscription's failing streak
    /// (see [`failing_subscriptions`](Store::failing_subscriptions)) follows
    /// every attempt, recorded or not: a `Delivered` outcome ends it, any
    /// other starts it at `record.attempt.started_at` unless it has begun.
    /// Only a change writes the subscription row, so a steady stream of
    /// successes (or of failures) costs no extra write.
    async fn record_attempt(&self, record: AttemptRecord) -> Result<RecordOutcome>;

    /// Records many attempts in ONE transaction, each exactly as
    /// [`record_attempt`](Store::record_attempt) would, applied in the order
    /// given, and returns their outcomes in that order. Each record is fenced
    /// by its own lease: one whose lease was lost still writes its attempt
    /// row and gets `LeaseLost`, and only it. The failing streak follows the
    /// records in order (a subscription's failure then delivery ends its
    /// streak; a delivery then failure starts one), written at most once per
    /// subscription per call, and only when it changes.
    ///
    /// All or nothing: if any record fails as `record_attempt` would fail
    /// for it, or the store does, nothing is written and the error is
    /// returned, so the caller may retry the whole batch (or record its
    /// attempts one by one to find the one at fault). An empty batch writes
    /// nothing and returns nothing.
    async fn record_attempts(&self, records: Vec<AttemptRecord>) -> Result<Vec<RecordOutcome>>;

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

    // --- bulk replay jobs ---------------------------------------------------

    /// Creates a running replay job and, in the same transaction, fixes its
    /// items: the subscription's deliveries created in `[since, until)`, of
    /// one of `event_types` (all when empty), in one of `states` now. `total`
    /// is their count (0 is allowed: such a job completes on its first
    /// step). `NotFound` if the subscription is absent or deleted.
    async fn create_replay_job(&self, new: NewReplayJob) -> Result<ReplayJob>;

    /// One job. `NotFound` if absent.
    async fn get_replay_job(&self, id: &JobId) -> Result<ReplayJob>;

    /// Cancels a running job: it becomes `cancelled` with `finished_at` set;
    /// items not re-queued yet never will be, and its counts stop moving.
    /// Deliveries already re-queued go on as any delivery does. A job that
    /// has ended is returned unchanged. `NotFound` if absent.
    async fn cancel_replay_job(&self, id: &JobId) -> Result<ReplayJob>;

    /// Running jobs, oldest first, at most `limit`.
    async fn running_replay_jobs(&self, limit: u32) -> Result<Vec<ReplayJob>>;

    /// Moves a running job on, atomically; a job that is not running is
    /// returned as it is.
    ///
    /// 1. **Settle**: each re-queued item whose delivery has finished counts
    ///    as `done` (delivered) or `failed` (`failed`, `dead`); one whose
    ///    delivery is gone counts as `skipped`.
    /// 2. **Re-queue**: while fewer than `window` items are re-queued and
    ///    unsettled, take the next items in delivery id order. A delivery in
    ///    one of the job's `states` is replayed exactly as
    ///    [`replay_delivery`](Store::replay_delivery) does; one that is
    ///    `pending` or `inflight` already (a retry, another job) is left
    ///    alone and the item waits for it — so two jobs never put one
    ///    delivery in flight twice; one in another finished state, or gone,
    ///    or whose subscription is deleted, is `skipped`. `window` 0 only
    ///    settles (the caller's way to hold a job while its destination's
    ///    circuit is open).
    /// 3. **Complete**: with no item left queued or re-queued, the job is
    ///    `completed`.
    async fn step_replay_job(&self, id: &JobId, window: u32) -> Result<JobStep>;

    // --- signals ------------------------------------------------------------

    /// Raises a signal for a subscription unless it is raised already with
    /// the same `detail`: records it (replacing the detail of one raised
    /// with another) and accepts `notice` — the system event announcing it
    /// and its deliveries, exactly as [`accept_event`](Store::accept_event)
    /// would, idempotency key included — in the same transaction. So the
    /// announcement is neither lost nor sent twice, however many nodes
    /// raise the same signal. Raising [`Disabled`](SignalKind::Disabled)
    /// also disables an active subscription (bumping the generation).
    /// Returns whether this call raised it. `NotFound` if the subscription
    /// is absent or deleted.
    async fn raise_signal(
        &self,
        sub_id: &SubscriptionId,
        kind: SignalKind,
        detail: &str,
        notice: Option<Notice>,
    ) -> Result<bool>;

    /// Lowers a signal. Returns whether it was raised.
    async fn lower_signal(&self, sub_id: &SubscriptionId, kind: SignalKind) -> Result<bool>;

    /// Raised signals of subscriptions that are not deleted, of one kind
    /// when given, ordered by subscription then kind.
    async fn raised_signals(&self, kind: Option<SignalKind>) -> Result<Vec<RaisedSignal>>;

    /// Subscriptions (not deleted) with unfinished (`pending` or `inflight`)
    /// deliveries, with how many.
    async fn backlogs(&self) -> Result<Vec<Backlog>>;

    /// Active subscriptions whose every attempt since `started_at_or_before`
    /// (a time on the callers' clock, as attempts' `started_at` is) or
    /// earlier has failed: their failing streak began then or before, and no
    /// attempt has delivered since.
    async fn failing_subscriptions(
        &self,
        started_at_or_before: Timestamp,
    ) -> Result<Vec<SubscriptionId>>;

    // --- retention and the rollup ---------------------------------------------

    /// Removes what `policy` says has expired, folding every attempt it
    /// removes into the daily rollup in the same transaction, so
    /// [`daily_stats`](Store::daily_stats) reads the same before and after.
    /// Unfinished deliveries are never removed, whatever their age. On
    /// PostgreSQL, deliveries and attempts live in day partitions, and a
    /// day whose deliveries are all finished and expired is dropped whole
    /// (§9.3); the unfinished deliveries of an expired day are first moved
    /// to today's partition with their attempts. On SQLite, rows are
    /// deleted, at most `policy.batch` per table per call.
    async fn enforce_retention(&self, policy: &RetentionPolicy) -> Result<RetentionReport>;

    /// A subscription's daily rollup from `since_day` (UTC) on, oldest day
    /// first, days without attempts left out. Kept forever, also for a
    /// deleted subscription.
    async fn daily_stats(
        &self,
        sub_id: &SubscriptionId,
        since_day: chrono::NaiveDate,
    ) -> Result<Vec<DailyStats>>;

    // --- tokens -------------------------------------------------------------

    /// Stores an API token's hash and scope. `Conflict` if the hash exists.
    async fn create_token(&self, token: NewToken) -> Result<()>;

    /// The token with this hash, if any: its scope and expiry. A token
    /// whose `expires_at` has passed (store clock) is as if absent.
    async fn find_token(&self, token_hash: &[u8]) -> Result<Option<FoundToken>>;

    /// Whether an admin token (one with no customer) is stored.
    async fn has_admin_token(&self) -> Result<bool>;

    // --- nodes (several hookd processes on one database) --------------------

    /// Records that `node` is alive: inserts or updates its row (role,
    /// `started_at`, `open_circuits` — replacing the last heartbeat's whole —
    /// and `last_seen` = now on the store's clock), forgets
    /// (deletes) every node not seen for [`NODE_FORGET_FACTOR`] ×
    /// `live_within`, and returns how many nodes that deliver
    /// ([`NodeRole::delivers`]) were seen within `live_within` — this one
    /// included if it delivers. One transaction; called every few seconds by
    /// every node.
    async fn heartbeat(&self, node: &NodeHeartbeat, live_within: Duration) -> Result<u32>;

    /// Forgets one node at once (a graceful shutdown), so the others' share
    /// of each destination grows without waiting for it to go stale. Whether
    /// it was remembered.
    async fn forget_node(&self, node_id: &str) -> Result<bool>;

    /// Every node the store remembers, live or not, by node id, each with
    /// the `open_circuits` of its last heartbeat.
    async fn nodes(&self) -> Result<Vec<NodeInfo>>;
}

/// A node not seen for this many live windows is forgotten by the next
/// [`Store::heartbeat`] (process ids change on every restart, so node ids
/// would otherwise pile up).
pub const NODE_FORGET_FACTOR: u32 = 10;
