//! The records that cross the [`Store`](crate::Store) seam.

use std::time::Duration;

use hookd_domain::delivery::{DeliveryState, ErrorClass};
use hookd_domain::destination::DestinationUrl;
use hookd_domain::event_type::{EventType, EventTypePattern};
use hookd_domain::subscription::{RetryPolicy, SigningKeys, SubscriptionState};
use hookd_domain::{CustomerId, DeliveryId, EventId, JobId, SubscriptionId, Timestamp};

pub use hookd_domain::subscription::Subscription;

/// The most bytes of a response body kept in an attempt record.
pub const MAX_SNIPPET_BYTES: usize = 1024;

/// A subscription to create.
#[derive(Debug, Clone)]
pub struct NewSubscription {
    /// Its id (chosen by the caller).
    pub id: SubscriptionId,
    /// Its customer, if any.
    pub customer_id: Option<CustomerId>,
    /// Where deliveries go.
    pub url: DestinationUrl,
    /// What it listens to (at least one pattern).
    pub event_types: Vec<EventTypePattern>,
    /// Its signing secret(s).
    pub keys: SigningKeys,
    /// Deliver one at a time, in order.
    pub ordered: bool,
    /// Its retry settings.
    pub retry_policy: RetryPolicy,
    /// An explicit rate for its destination host, in attempts per second;
    /// `None` leaves the host's rate adaptive (see
    /// [`Subscription::rate_limit`]). The store keeps what it is given; the
    /// bounds are checked where the value enters (the API).
    pub rate_limit: Option<u32>,
    /// An explicit cap on attempts in flight at once to its destination
    /// host; `None` leaves the host at the server-wide `--host-concurrency`
    /// (see [`Subscription::max_concurrency`]). The store keeps what it is
    /// given; the bounds are checked where the value enters (the API).
    pub max_concurrency: Option<u32>,
    /// A free-form description.
    pub description: Option<String>,
}

/// Changes to a subscription; `None` leaves a field as it is.
#[derive(Debug, Clone, Default)]
pub struct SubscriptionPatch {
    /// A new URL (the destination host follows it for new deliveries).
    pub url: Option<DestinationUrl>,
    /// New patterns.
    pub event_types: Option<Vec<EventTypePattern>>,
    /// New signing keys.
    pub keys: Option<SigningKeys>,
    /// Ordered or not.
    pub ordered: Option<bool>,
    /// A new retry policy (replaces the old one whole).
    pub retry_policy: Option<RetryPolicy>,
    /// Enable or disable.
    pub state: Option<SubscriptionState>,
    /// A new explicit rate limit; `Some(None)` clears it (the host's rate
    /// becomes adaptive again, unless another subscription there sets one).
    pub rate_limit: Option<Option<u32>>,
    /// A new explicit concurrency cap; `Some(None)` clears it (the host's cap
    /// becomes the server-wide one again, unless another subscription there
    /// sets one).
    pub max_concurrency: Option<Option<u32>>,
    /// A new description; `Some(None)` clears it.
    pub description: Option<Option<String>>,
}

/// Which subscriptions to list.
#[derive(Debug, Clone, Default)]
pub struct SubscriptionQuery {
    /// Only this customer's.
    pub customer_id: Option<CustomerId>,
    /// Only those with an id after this one.
    pub cursor: Option<SubscriptionId>,
    /// At most this many.
    pub limit: u32,
}

/// An event to accept.
#[derive(Debug, Clone)]
pub struct NewEvent {
    /// Its id (chosen by the caller).
    pub id: EventId,
    /// Its type.
    pub event_type: EventType,
    /// The payload, as the producer sent it (valid JSON text).
    pub payload: String,
    /// The producer's idempotency key, unique across events.
    pub idempotency_key: Option<String>,
    /// The customer it concerns, if any.
    pub customer_id: Option<CustomerId>,
}

/// A delivery to create with its event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewDelivery {
    /// Its id (chosen by the caller).
    pub id: DeliveryId,
    /// The subscription it goes to.
    pub sub_id: SubscriptionId,
    /// The subscription's destination host, denormalised (the shard key).
    pub destination_host: String,
}

/// Which deliveries of an ingest batch to create already claimed, and for
/// whom ([`Store::accept_events_claiming`](crate::Store::accept_events_claiming)).
#[derive(Debug, Clone)]
pub struct IngestClaim {
    /// Who claims (recorded as `worker_id`).
    pub worker_id: String,
    /// How long the lease lasts.
    pub lease: Duration,
    /// The deliveries to create claimed.
    pub deliveries: std::collections::HashSet<DeliveryId>,
}

/// The result of [`Store::accept_event`](crate::Store::accept_event).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Accepted {
    /// The event's id: the new one, or the existing one for a repeated key.
    pub event_id: EventId,
    /// Whether the idempotency key was already taken (nothing was written).
    pub duplicate: bool,
}

/// An accepted event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    /// Its id.
    pub id: EventId,
    /// Its type.
    pub event_type: EventType,
    /// The payload as sent.
    pub payload: String,
    /// The producer's idempotency key.
    pub idempotency_key: Option<String>,
    /// The customer it concerns.
    pub customer_id: Option<CustomerId>,
    /// When it was accepted (store clock).
    pub created_at: Timestamp,
}

/// One delivery: one event to one subscription.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Delivery {
    /// Its id.
    pub id: DeliveryId,
    /// The event.
    pub event_id: EventId,
    /// The subscription.
    pub sub_id: SubscriptionId,
    /// The event's type (denormalised for filtering).
    pub event_type: EventType,
    /// The destination host.
    pub destination_host: String,
    /// Where it is in its life.
    pub state: DeliveryState,
    /// Attempts made so far.
    pub attempt: u32,
    /// When it is next due (meaningful while `pending`).
    pub next_attempt_at: Timestamp,
    /// The last attempt's HTTP status, if it got one.
    pub last_status: Option<u16>,
    /// The last attempt's error, in words.
    pub last_error: Option<String>,
    /// When it was created.
    pub created_at: Timestamp,
    /// When its retry window opened (creation, or its last replay).
    pub window_start: Timestamp,
    /// When it last changed.
    pub updated_at: Timestamp,
}

/// One HTTP attempt of a delivery.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attempt {
    /// 1 for the first attempt, 2 for the second, …
    pub number: u32,
    /// When the request started.
    pub started_at: Timestamp,
    /// How long the exchange took.
    pub duration: Duration,
    /// The HTTP status, if a response came.
    pub status: Option<u16>,
    /// Why no usable response came.
    pub error_class: Option<ErrorClass>,
    /// At most [`MAX_SNIPPET_BYTES`] of the response body (untrusted text).
    pub response_snippet: Option<String>,
}

/// A delivery with its attempts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeliveryDetail {
    /// The delivery.
    pub delivery: Delivery,
    /// Its attempts, oldest first.
    pub attempts: Vec<Attempt>,
}

/// Which deliveries to list.
#[derive(Debug, Clone, Default)]
pub struct DeliveryQuery {
    /// Only this subscription's.
    pub sub_id: Option<SubscriptionId>,
    /// Only this event's.
    pub event_id: Option<EventId>,
    /// Only in this state.
    pub state: Option<DeliveryState>,
    /// Only created at or after this time.
    pub since: Option<Timestamp>,
    /// Only created before this time.
    pub until: Option<Timestamp>,
    /// Only of this event type.
    pub event_type: Option<EventType>,
    /// Only with an id before this one (pages go newest to oldest).
    pub cursor: Option<DeliveryId>,
    /// At most this many.
    pub limit: u32,
}

/// A destination host with claimable work, and who has work there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DueDestination {
    /// The destination host.
    pub host: String,
    /// The subscriptions with claimable work at this host, most overdue first.
    pub subscriptions: Vec<DueSubscription>,
}

/// One subscription's claimable work at a host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DueSubscription {
    /// The subscription.
    pub sub_id: SubscriptionId,
    /// `next_attempt_at` of its oldest claimable delivery.
    pub oldest_due_at: Timestamp,
    /// `next_attempt_at` of its newest claimable delivery.
    pub newest_due_at: Timestamp,
    /// The subscription's explicit [rate limit](Subscription::rate_limit),
    /// as it is now, so the dispatcher learns it without another read. The
    /// host's rate is the smallest of those set among its subscriptions;
    /// `None` from all of them means adaptive.
    pub rate_limit: Option<u32>,
    /// The subscription's explicit [concurrency
    /// cap](Subscription::max_concurrency), as it is now, so the dispatcher
    /// learns it without another read. The host's cap is the smallest of
    /// those set among its subscriptions; `None` from all of them means the
    /// server-wide `--host-concurrency`.
    pub max_concurrency: Option<u32>,
}

/// Which due deliveries a claim takes first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ClaimOrder {
    /// Smallest `next_attempt_at` first: the usual order, and the backlog's
    /// guaranteed floor (R4).
    #[default]
    OldestFirst,
    /// Largest `next_attempt_at` first: new work, while the backlog drains in
    /// its own share.
    NewestFirst,
}

/// A request to claim due deliveries of one destination.
#[derive(Debug, Clone)]
pub struct ClaimRequest {
    /// Who claims (recorded as `worker_id`).
    pub worker_id: String,
    /// The destination host.
    pub destination: String,
    /// Only this subscription's deliveries, when set.
    pub subscription: Option<SubscriptionId>,
    /// Which due deliveries to take first.
    pub order: ClaimOrder,
    /// At most this many.
    pub limit: u32,
    /// How long the lease lasts.
    pub lease: Duration,
}

/// Proof of a claim: the delivery and the lease token it was claimed with.
/// Completion and renewal are conditional on it (fencing inside our store).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Lease {
    /// The delivery.
    pub delivery_id: DeliveryId,
    /// The token written by the claim; a later claim writes a new one.
    pub token: i64,
    /// Where the store keeps the row, if it keeps deliveries in parts:
    /// PostgreSQL's day partition (`retain_from`), which does not change
    /// while the delivery is in flight. A statement given it reads that one
    /// partition's index; `None` (SQLite) finds the row by its id alone.
    pub partition: Option<Timestamp>,
    /// The delivery's subscription, which never changes: PostgreSQL's
    /// batch of records folds the failing streaks from it without reading
    /// the delivery rows.
    pub subscription: SubscriptionId,
}

/// Everything a worker needs to make an attempt.
#[derive(Debug, Clone)]
pub struct ClaimedDelivery {
    /// The lease held.
    pub lease: Lease,
    /// The delivery as claimed (state `inflight`).
    pub delivery: Delivery,
    /// Its event.
    pub event: Event,
    /// Its subscription, as it is now.
    pub subscription: Subscription,
}

/// The events and subscriptions of a claim's rows, each read once: a pass
/// claims an event's fan-out (a row per destination) and many rows of one
/// subscription, so reading them with every row sent and decoded an event's
/// payload once per destination. A backend reads the rows' delivery columns,
/// then [`ClaimParts::ids`], then those events and subscriptions, and puts
/// each claimed delivery together with [`ClaimParts::claimed`].
#[derive(Debug, Default)]
pub struct ClaimParts {
    /// By id.
    pub events: std::collections::HashMap<EventId, Event>,
    /// By id, decoded (secrets opened) once each.
    pub subscriptions: std::collections::HashMap<SubscriptionId, Subscription>,
}

impl ClaimParts {
    /// The distinct event and subscription ids of `deliveries`.
    pub fn ids<'a>(
        deliveries: impl IntoIterator<Item = &'a Delivery>,
    ) -> (Vec<EventId>, Vec<SubscriptionId>) {
        let mut events = std::collections::HashSet::new();
        let mut subscriptions = std::collections::HashSet::new();
        for d in deliveries {
            events.insert(d.event_id);
            subscriptions.insert(d.sub_id);
        }
        (
            events.into_iter().collect(),
            subscriptions.into_iter().collect(),
        )
    }

    /// `delivery`, claimed with `token` (its row in `partition`, see
    /// [`Lease::partition`]), with its event and subscription; `Corrupt` if
    /// either was not read (a row's foreign keys keep both).
    pub fn claimed(
        &self,
        delivery: Delivery,
        token: i64,
        partition: Option<Timestamp>,
    ) -> crate::Result<ClaimedDelivery> {
        let missing = |what: &str, id: &dyn std::fmt::Display| {
            crate::StoreError::Corrupt(format!(
                "claimed delivery {}: {what} {id} not found",
                delivery.id
            ))
        };
        let event = self
            .events
            .get(&delivery.event_id)
            .ok_or_else(|| missing("event", &delivery.event_id))?
            .clone();
        let subscription = self
            .subscriptions
            .get(&delivery.sub_id)
            .ok_or_else(|| missing("subscription", &delivery.sub_id))?
            .clone();
        Ok(ClaimedDelivery {
            lease: Lease {
                delivery_id: delivery.id,
                token,
                partition,
                subscription: delivery.sub_id,
            },
            delivery,
            event,
            subscription,
        })
    }
}

/// What an attempt ends in, for the delivery row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NextState {
    /// A 2xx arrived: `delivered`.
    Delivered,
    /// Retry: back to `pending`, due after `delay` (store clock).
    Retry {
        /// How long from now.
        delay: Duration,
    },
    /// Permanent failure: `failed`.
    Failed,
    /// Retries exhausted: `dead` (kept and replayable).
    Dead,
}

/// An attempt to record, with the delivery's next state.
#[derive(Debug, Clone)]
pub struct AttemptRecord {
    /// The lease the attempt was made under.
    pub lease: Lease,
    /// What happened.
    pub attempt: Attempt,
    /// The delivery's next state.
    pub next: NextState,
    /// `last_error` to store (`None` clears it).
    pub last_error: Option<String>,
}

impl AttemptRecord {
    /// For each of `records`, whether it is the first of its lease among
    /// them. Only that one may move its delivery in a batch, as recording
    /// them one by one has it: a later record of the same lease finds it
    /// spent (`LeaseLost`), though its attempt is still written.
    pub fn firsts_of_their_lease(records: &[AttemptRecord]) -> Vec<bool> {
        let mut seen = std::collections::HashSet::with_capacity(records.len());
        records
            .iter()
            .map(|r| seen.insert((r.lease.delivery_id, r.lease.token)))
            .collect()
    }
}

/// Whether a recorded attempt moved its delivery.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RecordOutcome {
    /// The delivery moved to its next state.
    Recorded,
    /// The lease was no longer current; only the attempt row was written.
    LeaseLost,
}

/// An API token to store.
#[derive(Debug, Clone)]
pub struct NewToken {
    /// SHA-256 of the token text. The token itself is never stored.
    pub token_hash: Vec<u8>,
    /// The customer it is scoped to; `None` for an admin token.
    pub customer_id: Option<CustomerId>,
    /// A label for people.
    pub label: Option<String>,
    /// When it stops working (portal links); `None`: until revoked.
    pub expires_at: Option<Timestamp>,
}

/// A stored token that is valid now: its scope, and when it stops being
/// valid (so a cache of it can stop trusting it then).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FoundToken {
    /// What it may see.
    pub scope: TokenScope,
    /// When it expires; `None`: never.
    pub expires_at: Option<Timestamp>,
}

/// What a token may see.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TokenScope {
    /// Everything.
    Admin,
    /// One customer's subscriptions, deliveries and jobs.
    Customer(CustomerId),
}

/// How many of a subscription's attempts ended one way: with one HTTP status,
/// or, with no status, in one error class.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AttemptCount {
    /// The HTTP status, if a response came.
    pub status: Option<u16>,
    /// Why no usable response came, when there is no status.
    pub error_class: Option<ErrorClass>,
    /// How many attempts ended this way.
    pub count: u64,
}

/// What the store knows about one subscription's delivery health, for
/// `GET /subscriptions/{id}/health`: counts only, no judgement.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SubscriptionHealth {
    /// Deliveries not yet finished: `pending` (waiting, or due) or
    /// `inflight` (being sent).
    pub pending_count: u64,
    /// `created_at` of the oldest of those, if any: how far behind it is.
    pub oldest_pending_created_at: Option<Timestamp>,
    /// Deliveries that ran out of retries (`dead`).
    pub dead_count: u64,
    /// When the earliest of those became dead (its `updated_at`), if any.
    pub oldest_dead_at: Option<Timestamp>,
    /// Attempts that started at or after the `since` asked for, by how they
    /// ended, ordered by status (statuses first) then error class name.
    pub attempts: Vec<AttemptCount>,
    /// Its raised signals, ordered by kind.
    pub signals: Vec<RaisedSignal>,
}

impl SubscriptionHealth {
    /// Attempts in the window that ended at all (every recorded attempt).
    pub fn finished_attempts(&self) -> u64 {
        self.attempts.iter().map(|a| a.count).sum()
    }

    /// Attempts in the window that got a 2xx (delivered).
    pub fn successful_attempts(&self) -> u64 {
        self.attempts
            .iter()
            .filter(|a| a.status.is_some_and(|s| (200..300).contains(&s)))
            .map(|a| a.count)
            .sum()
    }
}

// --- bulk replay jobs ------------------------------------------------------

/// A bulk replay job to create (`POST /subscriptions/{id}/replay`).
#[derive(Debug, Clone)]
pub struct NewReplayJob {
    /// Its id (chosen by the caller).
    pub id: JobId,
    /// The subscription whose deliveries it replays.
    pub sub_id: SubscriptionId,
    /// Only deliveries created at or after this time.
    pub since: Timestamp,
    /// Only deliveries created before this time.
    pub until: Timestamp,
    /// Only deliveries of these event types (exact types); empty means all.
    pub event_types: Vec<EventType>,
    /// Only deliveries in these states when the job is created, and still in
    /// one of them when the job comes to re-queue them. Only finished states
    /// (`delivered`, `failed`, `dead`) mean anything: unfinished deliveries
    /// are on their way already. The caller supplies the default.
    pub states: Vec<DeliveryState>,
}

/// Where a replay job is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum JobState {
    /// Re-queuing its deliveries, a window at a time.
    Running,
    /// Every item was re-sent and settled, or skipped.
    Completed,
    /// Cancelled: items not yet re-queued never will be; those already
    /// re-queued go on.
    Cancelled,
}

impl JobState {
    /// The name stored and shown (`running`, `completed`, `cancelled`).
    pub fn as_str(self) -> &'static str {
        match self {
            JobState::Running => "running",
            JobState::Completed => "completed",
            JobState::Cancelled => "cancelled",
        }
    }

    /// The state with this name.
    pub fn parse(s: &str) -> Option<JobState> {
        match s {
            "running" => Some(JobState::Running),
            "completed" => Some(JobState::Completed),
            "cancelled" => Some(JobState::Cancelled),
            _ => None,
        }
    }
}

/// A bulk replay job and its progress.
///
/// At creation the deliveries it covers are fixed as its items, so `total`
/// is exact and never moves. Each item ends in exactly one of `done`,
/// `failed` or `skipped`; `requeued` counts those re-queued and not settled
/// yet. So `done + failed + skipped + requeued + queued == total`, where
/// `queued` (not re-queued yet) is what remains.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplayJob {
    /// Its id.
    pub id: JobId,
    /// Its subscription.
    pub sub_id: SubscriptionId,
    /// As asked.
    pub since: Timestamp,
    /// As asked.
    pub until: Timestamp,
    /// As asked (empty: all types).
    pub event_types: Vec<EventType>,
    /// As asked.
    pub states: Vec<DeliveryState>,
    /// Where it is.
    pub state: JobState,
    /// How many deliveries it covers.
    pub total: u64,
    /// Re-sent and delivered.
    pub done: u64,
    /// Re-sent and finished without delivery (`failed` or `dead` again).
    pub failed: u64,
    /// Not re-sent: by the time its turn came the delivery had left the
    /// job's states (another job or replay delivered it), or was gone
    /// (retention, or the subscription was deleted).
    pub skipped: u64,
    /// Re-queued and not finished yet.
    pub requeued: u64,
    /// When it was created (store clock).
    pub created_at: Timestamp,
    /// When it completed or was cancelled.
    pub finished_at: Option<Timestamp>,
}

/// What one [`step_replay_job`](crate::Store::step_replay_job) did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobStep {
    /// The job after the step.
    pub job: ReplayJob,
    /// How many deliveries this step made `pending` (0 when it only
    /// settled, or found them queued already).
    pub requeued: u32,
}

// --- signals: what hookd tells the platform about a subscription -----------

/// A condition of a subscription that hookd announces with a system event
/// (`hookd.subscription.<kind>`) when it starts.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "snake_case")]
pub enum SignalKind {
    /// hookd disabled it: its destination answered 410 Gone, or every
    /// attempt failed for the configured period.
    Disabled,
    /// Some of its deliveries are `dead` (R3).
    DeadLettering,
    /// Most recent failures share one 4xx status (R6).
    ConfigurationError,
    /// Ingest refuses events that would fan out to it (R4).
    Shedding,
}

impl SignalKind {
    /// Every kind.
    pub const ALL: [SignalKind; 4] = [
        SignalKind::Disabled,
        SignalKind::DeadLettering,
        SignalKind::ConfigurationError,
        SignalKind::Shedding,
    ];

    /// The name stored (`disabled`, `dead_lettering`, …).
    pub fn as_str(self) -> &'static str {
        match self {
            SignalKind::Disabled => "disabled",
            SignalKind::DeadLettering => "dead_lettering",
            SignalKind::ConfigurationError => "configuration_error",
            SignalKind::Shedding => "shedding",
        }
    }

    /// The kind with this name.
    pub fn parse(s: &str) -> Option<SignalKind> {
        SignalKind::ALL.into_iter().find(|k| k.as_str() == s)
    }

    /// The type of the system event that announces it,
    /// `hookd.subscription.<kind>`.
    pub fn event_type(self) -> EventType {
        EventType::parse(&format!("hookd.subscription.{}", self.as_str()))
            .expect("system event types are valid event types")
    }
}

/// A raised signal.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RaisedSignal {
    /// Whose.
    pub sub_id: SubscriptionId,
    /// Which.
    pub kind: SignalKind,
    /// Why, in words (`"HTTP 410 Gone"`, `"401"`, `"12000 pending"`).
    pub detail: String,
    /// When it was raised (store clock).
    pub raised_at: Timestamp,
}

/// A system event announcing a signal, with its fan-out, accepted in the
/// same transaction that raises the signal.
#[derive(Debug, Clone)]
pub struct Notice {
    /// The event.
    pub event: NewEvent,
    /// Its deliveries.
    pub deliveries: Vec<NewDelivery>,
}

/// One subscription's unfinished deliveries, for the shedding monitor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backlog {
    /// The subscription.
    pub sub_id: SubscriptionId,
    /// Its `pending` and `inflight` deliveries.
    pub unfinished: u64,
}

/// What [`due_work`](crate::Store::due_work) finds: work that is due now.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct DueWork {
    /// `pending` deliveries of active subscriptions with
    /// `next_attempt_at <= now`.
    pub due: u64,
    /// `now - next_attempt_at` of the oldest of them; zero when none.
    pub oldest_overdue: Duration,
}

/// How a database's schema compares with the migrations this build carries
/// ([`schema_status`](crate::Store::schema_status)).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SchemaStatus {
    /// Every migration of this build is applied, and none newer.
    Current,
    /// This build's newest migration is not applied: never migrated
    /// (`applied` is `None`), or restored from before it.
    Behind {
        /// The newest version applied, if any.
        applied: Option<i64>,
        /// This build's newest version.
        expected: i64,
    },
    /// A newer build migrated the database past this build's schema.
    Ahead {
        /// The newest version applied.
        applied: i64,
        /// This build's newest version.
        expected: i64,
    },
}

impl SchemaStatus {
    /// Compares the newest applied version with this build's newest.
    pub fn compare(applied: Option<i64>, expected: i64) -> Self {
        match applied {
            Some(v) if v == expected => Self::Current,
            Some(v) if v > expected => Self::Ahead {
                applied: v,
                expected,
            },
            applied => Self::Behind { applied, expected },
        }
    }
}

impl std::fmt::Display for SchemaStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Current => f.write_str("the database schema is current"),
            Self::Behind {
                applied: None,
                expected,
            } => write!(
                f,
                "the database is not migrated (this build needs schema version {expected}; run `hookd migrate`)"
            ),
            Self::Behind {
                applied: Some(applied),
                expected,
            } => write!(
                f,
                "the database schema is at version {applied}, behind this build's {expected} (run `hookd migrate`)"
            ),
            Self::Ahead { applied, expected } => write!(
                f,
                "the database schema is at version {applied}, newer than this build's {expected}: a newer hookd migrated it"
            ),
        }
    }
}

// --- retention and the daily rollup ----------------------------------------

/// What [`enforce_retention`](crate::Store::enforce_retention) removes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetentionPolicy {
    /// Finished deliveries created before this time go, with their attempts.
    /// Unfinished ones (`pending`, `inflight`) are never removed.
    pub deliveries_before: Timestamp,
    /// Events created before this time go, once no delivery refers to them.
    pub events_before: Timestamp,
    /// On backends that delete rows (SQLite), at most this many rows of each
    /// table per call, so the writer is never held long.
    pub batch: u32,
}

/// What one retention pass removed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RetentionReport {
    /// Deliveries removed.
    pub deliveries: u64,
    /// Attempts removed.
    pub attempts: u64,
    /// Events removed.
    pub events: u64,
    /// Day partitions dropped (PostgreSQL).
    pub partitions_dropped: u32,
    /// Whether more is due now (call again after a pause).
    pub more: bool,
}

/// One subscription's attempts on one UTC day, kept forever: what was
/// removed by retention (folded in before removal) plus what is still
/// stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DailyStats {
    /// The UTC day.
    pub day: chrono::NaiveDate,
    /// Attempts started that day.
    pub attempts: u64,
    /// Of those, the ones that delivered (2xx).
    pub delivered: u64,
    /// Of those, the ones that ended their delivery `failed`.
    pub failed: u64,
    /// Of those, the ones that ended their delivery `dead`.
    pub dead: u64,
    /// Those attempts' durations as `(milliseconds, count)`, ascending by
    /// milliseconds, one entry per distinct value.
    pub latency_ms: Vec<(u64, u64)>,
}

/// What a run of attempts, taken in order, does to one subscription's
/// failing streak: the fold backends use to write the subscription row at
/// most once per [`record_attempts`](crate::Store::record_attempts) call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StreakChange {
    /// No delivery among them; the first failure started at this time: the
    /// streak starts then unless it has begun.
    StartUnlessBegun(Timestamp),
    /// The last delivery ended the streak and no failure followed it.
    End,
    /// A delivery ended the streak and a failure started at this time began
    /// a new one: the streak is exactly this.
    Restart(Timestamp),
}

impl StreakChange {
    /// The change after one more attempt (`delivered` or not, started at
    /// `started_at`) following `prev` (`None`: the first attempt).
    pub fn then(prev: Option<Self>, delivered: bool, started_at: Timestamp) -> Self {
        match (prev, delivered) {
            (_, true) => Self::End,
            (None, false) => Self::StartUnlessBegun(started_at),
            (Some(Self::End), false) => Self::Restart(started_at),
            (Some(kept), false) => kept,
        }
    }

    /// The streak's start after this change, given its start before.
    pub fn apply(self, before: Option<Timestamp>) -> Option<Timestamp> {
        match self {
            Self::StartUnlessBegun(t) => before.or(Some(t)),
            Self::End => None,
            Self::Restart(t) => Some(t),
        }
    }
}

/// What a node of a deployment does (`hookd serve --role`). Several nodes
/// share one PostgreSQL database; the store remembers each by its
/// heartbeats ([`Store::heartbeat`](crate::Store::heartbeat)).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum NodeRole {
    /// The HTTP API only: accepts events, delivers nothing.
    Api,
    /// The dispatcher and the background workers; no API.
    Worker,
    /// Both (the default, and the only role on SQLite).
    All,
}

impl NodeRole {
    /// How the role is stored and spelled on the command line.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Api => "api",
            Self::Worker => "worker",
            Self::All => "all",
        }
    }

    /// Parses [`as_str`](Self::as_str)'s spelling.
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "api" => Some(Self::Api),
            "worker" => Some(Self::Worker),
            "all" => Some(Self::All),
            _ => None,
        }
    }

    /// Whether the node delivers (runs a dispatcher): `worker` and `all`.
    /// These are the nodes a destination's concurrency cap is divided among.
    pub fn delivers(self) -> bool {
        matches!(self, Self::Worker | Self::All)
    }
}

/// One node's heartbeat.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeHeartbeat {
    /// The node's id: its dispatcher's `worker_id` (recorded on the
    /// deliveries it claims).
    pub node_id: String,
    /// What it does.
    pub role: NodeRole,
    /// When the node started (its own clock; for people).
    pub started_at: Timestamp,
    /// The destination hosts whose circuit is not closed (open or
    /// half-open) on this node now, sorted; empty on a node that does not
    /// deliver. Each heartbeat replaces the last one's.
    pub open_circuits: Vec<String>,
}

/// A node the store remembers ([`Store::nodes`](crate::Store::nodes)).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeInfo {
    /// The node's id.
    pub node_id: String,
    /// What it does.
    pub role: NodeRole,
    /// When it started.
    pub started_at: Timestamp,
    /// Its last heartbeat, on the store's clock.
    pub last_seen: Timestamp,
    /// The destination hosts whose circuit was not closed on it, as its last
    /// heartbeat reported them ([`NodeHeartbeat::open_circuits`]).
    pub open_circuits: Vec<String>,
}

/// Groups a due listing's subscriptions by host, for
/// [`Store::due_destinations`](crate::Store::due_destinations): `rows` come
/// most overdue first, so a host's first row places it and its
/// subscriptions follow in their own order; at most `limit` hosts.
pub fn group_due_by_host(
    rows: impl IntoIterator<Item = (String, DueSubscription)>,
    limit: u32,
) -> Vec<DueDestination> {
    let mut due: Vec<DueDestination> = Vec::new();
    let mut at: std::collections::HashMap<String, usize> = std::collections::HashMap::new();
    for (host, sub) in rows {
        match at.get(&host) {
            Some(&i) => due[i].subscriptions.push(sub),
            None if due.len() < limit as usize => {
                at.insert(host.clone(), due.len());
                due.push(DueDestination {
                    host,
                    subscriptions: vec![sub],
                });
            }
            None => {}
        }
    }
    due
}

#[cfg(test)]
mod claim_parts_tests {
    use super::*;

    fn delivery(event_id: EventId, sub_id: SubscriptionId) -> Delivery {
        let t = chrono::DateTime::UNIX_EPOCH;
        Delivery {
            id: DeliveryId::new(),
            event_id,
            sub_id,
            event_type: EventType::parse("order.paid").unwrap(),
            destination_host: "example.com".into(),
            state: DeliveryState::Inflight,
            attempt: 0,
            next_attempt_at: t,
            last_status: None,
            last_error: None,
            created_at: t,
            window_start: t,
            updated_at: t,
        }
    }

    #[test]
    fn each_event_and_subscription_is_asked_for_once() {
        let (e1, e2) = (EventId::new(), EventId::new());
        let (s1, s2) = (SubscriptionId::new(), SubscriptionId::new());
        let rows = [delivery(e1, s1), delivery(e1, s2), delivery(e2, s1)];
        let (mut events, mut subs) = ClaimParts::ids(&rows);
        events.sort();
        subs.sort();
        let (mut want_e, mut want_s) = (vec![e1, e2], vec![s1, s2]);
        want_e.sort();
        want_s.sort();
        assert_eq!(events, want_e);
        assert_eq!(subs, want_s);
    }

    #[test]
    fn a_claimed_row_whose_event_was_not_read_is_corrupt() {
        let d = delivery(EventId::new(), SubscriptionId::new());
        let err = ClaimParts::default().claimed(d, 1, None).unwrap_err();
        assert!(
            matches!(&err, crate::StoreError::Corrupt(m) if m.contains("event")),
            "{err:?}"
        );
    }
}
