//! [`TimedStore`]: a [`Store`] decorator that times every store operation.
//!
//! Each call records its duration in the `hookd_store_seconds{op}`
//! histogram and each failure in `hookd_store_errors_total{op, kind}`. The
//! cost is one `Instant::now` pair per call and a lock-free histogram record
//! through a handle registered on the operation's first call; the error path
//! (rare) looks its counter up by name.
//!
//! Every method of [`Store`] is delegated explicitly: the trait has no default
//! methods, so one added to it fails to compile here until it is timed too.

use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use hookd_domain::{DeliveryId, EventId, JobId, SubscriptionId, Timestamp};
use hookd_store::{
    Accepted, AttemptRecord, Backlog, BatchOutcome, ClaimRequest, ClaimedDelivery, DailyStats,
    Delivery, DeliveryDetail, DeliveryQuery, DueDestination, DueWork, Event, FoundToken,
    IngestClaim, JobStep, Lease, NewDelivery, NewEvent, NewReplayJob, NewSubscription, NewToken,
    Notice, RaisedSignal, RecordOutcome, ReplayJob, Result, RetentionPolicy, RetentionReport,
    SchemaStatus, SignalKind, Store, StoreError, Subscription, SubscriptionHealth,
    SubscriptionPatch, SubscriptionQuery,
};

/// The store operations, one per [`Store`] method, in trait order.
#[derive(Debug, Clone, Copy)]
enum Op {
    Migrate,
    Ping,
    SchemaStatus,
    DueWork,
    CreateSubscription,
    GetSubscription,
    ListSubscriptions,
    AllSubscriptions,
    UpdateSubscription,
    DeleteSubscription,
    SubscriptionGeneration,
    ResealSecrets,
    AcceptEvent,
    AcceptEvents,
    GetEvent,
    MaterializeFanout,
    FanoutBacklog,
    DueDestinations,
    ClaimDue,
    RecordAttempt,
    RecordAttempts,
    RenewLease,
    Release,
    ReclaimExpired,
    ReplayDelivery,
    GetDelivery,
    ListDeliveries,
    SubscriptionHealth,
    CreateReplayJob,
    GetReplayJob,
    CancelReplayJob,
    RunningReplayJobs,
    StepReplayJob,
    RaiseSignal,
    LowerSignal,
    RaisedSignals,
    Backlogs,
    FailingSubscriptions,
    EnforceRetention,
    DailyStats,
    CreateToken,
    FindToken,
    HasAdminToken,
    ClaimMany,
    Heartbeat,
    ForgetNode,
    Nodes,
}

/// Each [`Op`]'s label, by its discriminant.
const OP_NAMES: &[&str] = &[
    "migrate",
    "ping",
    "schema_status",
    "due_work",
    "create_subscription",
    "get_subscription",
    "list_subscriptions",
    "all_subscriptions",
    "update_subscription",
    "delete_subscription",
    "subscription_generation",
    "reseal_secrets",
    "accept_event",
    "accept_events",
    "get_event",
    "materialize_fanout",
    "fanout_backlog",
    "due_destinations",
    "claim_due",
    "record_attempt",
    "record_attempts",
    "renew_lease",
    "release",
    "reclaim_expired",
    "replay_delivery",
    "get_delivery",
    "list_deliveries",
    "subscription_health",
    "create_replay_job",
    "get_replay_job",
    "cancel_replay_job",
    "running_replay_jobs",
    "step_replay_job",
    "raise_signal",
    "lower_signal",
    "raised_signals",
    "backlogs",
    "failing_subscriptions",
    "enforce_retention",
    "daily_stats",
    "create_token",
    "find_token",
    "has_admin_token",
    "claim_many",
    "heartbeat",
    "forget_node",
    "nodes",
];

/// A [`Store`] that times every call to the one it wraps.
pub struct TimedStore {
    inner: Arc<dyn Store>,
    seconds: [OnceLock<metrics::Histogram>; OP_NAMES.len()],
}

impl TimedStore {
    /// Wraps `inner`. Metrics go to the recorder installed when each
    /// operation is first called.
    pub fn new(inner: Arc<dyn Store>) -> Self {
        Self {
            inner,
            seconds: std::array::from_fn(|_| OnceLock::new()),
        }
    }

    async fn timed<T>(&self, op: Op, call: impl Future<Output = Result<T>>) -> Result<T> {
        let started = Instant::now();
        let res = call.await;
        let name = OP_NAMES[op as usize];
        self.seconds[op as usize]
            .get_or_init(|| metrics::histogram!("hookd_store_seconds", "op" => name))
            .record(started.elapsed().as_secs_f64());
        if let Err(e) = &res {
            metrics::counter!("hookd_store_errors_total", "op" => name, "kind" => error_kind(e))
                .increment(1);
        }
        res
    }
}

/// The `kind` label of a store error.
fn error_kind(e: &StoreError) -> &'static str {
    match e {
        StoreError::NotFound => "not_found",
        StoreError::Conflict(_) => "conflict",
        StoreError::Unavailable(_) => "unavailable",
        StoreError::Corrupt(_) => "corrupt",
        StoreError::Backend(_) => "backend",
    }
}

impl std::fmt::Debug for TimedStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("TimedStore").field(&self.inner).finish()
    }
}

#[async_trait]
impl Store for TimedStore {
    async fn migrate(&self) -> Result<()> {
        self.timed(Op::Migrate, self.inner.migrate()).await
    }

    async fn ping(&self) -> Result<()> {
        self.timed(Op::Ping, self.inner.ping()).await
    }

    async fn schema_status(&self) -> Result<SchemaStatus> {
        self.timed(Op::SchemaStatus, self.inner.schema_status())
            .await
    }

    async fn due_work(&self) -> Result<DueWork> {
        self.timed(Op::DueWork, self.inner.due_work()).await
    }

    async fn create_subscription(&self, new: NewSubscription) -> Result<Subscription> {
        self.timed(Op::CreateSubscription, self.inner.create_subscription(new))
            .await
    }

    async fn get_subscription(&self, id: &SubscriptionId) -> Result<Subscription> {
        self.timed(Op::GetSubscription, self.inner.get_subscription(id))
            .await
    }

    async fn list_subscriptions(&self, query: &SubscriptionQuery) -> Result<Vec<Subscription>> {
        self.timed(Op::ListSubscriptions, self.inner.list_subscriptions(query))
            .await
    }

    async fn all_subscriptions(&self) -> Result<Vec<Subscription>> {
        self.timed(Op::AllSubscriptions, self.inner.all_subscriptions())
            .await
    }

    async fn update_subscription(
        &self,
        id: &SubscriptionId,
        patch: SubscriptionPatch,
    ) -> Result<Subscription> {
        self.timed(
            Op::UpdateSubscription,
            self.inner.update_subscription(id, patch),
        )
        .await
    }

    async fn delete_subscription(&self, id: &SubscriptionId) -> Result<()> {
        self.timed(Op::DeleteSubscription, self.inner.delete_subscription(id))
            .await
    }

    async fn subscription_generation(&self) -> Result<i64> {
        self.timed(
            Op::SubscriptionGeneration,
            self.inner.subscription_generation(),
        )
        .await
    }

    async fn reseal_secrets(&self) -> Result<u64> {
        self.timed(Op::ResealSecrets, self.inner.reseal_secrets())
            .await
    }

    async fn accept_event(
        &self,
        event: NewEvent,
        deliveries: Vec<NewDelivery>,
    ) -> Result<Accepted> {
        self.timed(Op::AcceptEvent, self.inner.accept_event(event, deliveries))
            .await
    }

    async fn accept_events(
        &self,
        batch: Vec<(NewEvent, Vec<NewDelivery>)>,
    ) -> Result<Vec<Result<Accepted>>> {
        self.timed(Op::AcceptEvents, self.inner.accept_events(batch))
            .await
    }

    async fn accept_events_at(
        &self,
        generation: i64,
        batch: Vec<(NewEvent, Vec<NewDelivery>)>,
    ) -> Result<BatchOutcome> {
        self.timed(
            Op::AcceptEvents,
            self.inner.accept_events_at(generation, batch),
        )
        .await
    }

    async fn accept_events_claiming(
        &self,
        generation: Option<i64>,
        batch: Vec<(NewEvent, Vec<NewDelivery>)>,
        claim: &IngestClaim,
    ) -> Result<(BatchOutcome, Vec<Lease>)> {
        self.timed(
            Op::AcceptEvents,
            self.inner.accept_events_claiming(generation, batch, claim),
        )
        .await
    }

    async fn get_event(&self, id: &EventId) -> Result<Event> {
        self.timed(Op::GetEvent, self.inner.get_event(id)).await
    }

    async fn materialize_fanout(&self) -> Result<Option<hookd_store::FanoutStep>> {
        self.timed(Op::MaterializeFanout, self.inner.materialize_fanout())
            .await
    }

    async fn fanout_backlog(&self) -> Result<hookd_store::FanoutBacklog> {
        self.timed(Op::FanoutBacklog, self.inner.fanout_backlog())
            .await
    }

    async fn due_destinations(&self, limit: u32) -> Result<Vec<DueDestination>> {
        self.timed(Op::DueDestinations, self.inner.due_destinations(limit))
            .await
    }

    async fn claim_due(&self, req: &ClaimRequest) -> Result<Vec<ClaimedDelivery>> {
        self.timed(Op::ClaimDue, self.inner.claim_due(req)).await
    }

    async fn claim_many(&self, reqs: &[ClaimRequest]) -> Result<Vec<Vec<ClaimedDelivery>>> {
        self.timed(Op::ClaimMany, self.inner.claim_many(reqs)).await
    }

    async fn record_attempt(&self, record: AttemptRecord) -> Result<RecordOutcome> {
        self.timed(Op::RecordAttempt, self.inner.record_attempt(record))
            .await
    }

    async fn record_attempts(&self, records: Vec<AttemptRecord>) -> Result<Vec<RecordOutcome>> {
        self.timed(Op::RecordAttempts, self.inner.record_attempts(records))
            .await
    }

    async fn renew_lease(&self, lease: &Lease, lease_for: Duration) -> Result<bool> {
        self.timed(Op::RenewLease, self.inner.renew_lease(lease, lease_for))
            .await
    }

    async fn release(&self, leases: &[Lease]) -> Result<u64> {
        self.timed(Op::Release, self.inner.release(leases)).await
    }

    async fn reclaim_expired(&self) -> Result<u64> {
        self.timed(Op::ReclaimExpired, self.inner.reclaim_expired())
            .await
    }

    async fn replay_delivery(&self, id: &DeliveryId) -> Result<Delivery> {
        self.timed(Op::ReplayDelivery, self.inner.replay_delivery(id))
            .await
    }

    async fn get_delivery(&self, id: &DeliveryId) -> Result<DeliveryDetail> {
        self.timed(Op::GetDelivery, self.inner.get_delivery(id))
            .await
    }

    async fn list_deliveries(&self, query: &DeliveryQuery) -> Result<Vec<DeliveryDetail>> {
        self.timed(Op::ListDeliveries, self.inner.list_deliveries(query))
            .await
    }

    async fn subscription_health(
        &self,
        sub_id: &SubscriptionId,
        since: Timestamp,
    ) -> Result<SubscriptionHealth> {
        self.timed(
            Op::SubscriptionHealth,
            self.inner.subscription_health(sub_id, since),
        )
        .await
    }

    async fn create_replay_job(&self, new: NewReplayJob) -> Result<ReplayJob> {
        self.timed(Op::CreateReplayJob, self.inner.create_replay_job(new))
            .await
    }

    async fn get_replay_job(&self, id: &JobId) -> Result<ReplayJob> {
        self.timed(Op::GetReplayJob, self.inner.get_replay_job(id))
            .await
    }

    async fn cancel_replay_job(&self, id: &JobId) -> Result<ReplayJob> {
        self.timed(Op::CancelReplayJob, self.inner.cancel_replay_job(id))
            .await
    }

    async fn running_replay_jobs(&self, limit: u32) -> Result<Vec<ReplayJob>> {
        self.timed(Op::RunningReplayJobs, self.inner.running_replay_jobs(limit))
            .await
    }

    async fn step_replay_job(&self, id: &JobId, window: u32) -> Result<JobStep> {
        self.timed(Op::StepReplayJob, self.inner.step_replay_job(id, window))
            .await
    }

    async fn raise_signal(
        &self,
        sub_id: &SubscriptionId,
        kind: SignalKind,
        detail: &str,
        notice: Option<Notice>,
    ) -> Result<bool> {
        self.timed(
            Op::RaiseSignal,
            self.inner.raise_signal(sub_id, kind, detail, notice),
        )
        .await
    }

    async fn lower_signal(&self, sub_id: &SubscriptionId, kind: SignalKind) -> Result<bool> {
        self.timed(Op::LowerSignal, self.inner.lower_signal(sub_id, kind))
            .await
    }

    async fn raised_signals(&self, kind: Option<SignalKind>) -> Result<Vec<RaisedSignal>> {
        self.timed(Op::RaisedSignals, self.inner.raised_signals(kind))
            .await
    }

    async fn backlogs(&self) -> Result<Vec<Backlog>> {
        self.timed(Op::Backlogs, self.inner.backlogs()).await
    }

    async fn failing_subscriptions(
        &self,
        started_at_or_before: Timestamp,
    ) -> Result<Vec<SubscriptionId>> {
        self.timed(
            Op::FailingSubscriptions,
            self.inner.failing_subscriptions(started_at_or_before),
        )
        .await
    }

    async fn enforce_retention(&self, policy: &RetentionPolicy) -> Result<RetentionReport> {
        self.timed(Op::EnforceRetention, self.inner.enforce_retention(policy))
            .await
    }

    async fn daily_stats(
        &self,
        sub_id: &SubscriptionId,
        since_day: chrono::NaiveDate,
    ) -> Result<Vec<DailyStats>> {
        self.timed(Op::DailyStats, self.inner.daily_stats(sub_id, since_day))
            .await
    }

    async fn create_token(&self, token: NewToken) -> Result<()> {
        self.timed(Op::CreateToken, self.inner.create_token(token))
            .await
    }

    async fn find_token(&self, token_hash: &[u8]) -> Result<Option<FoundToken>> {
        self.timed(Op::FindToken, self.inner.find_token(token_hash))
            .await
    }

    async fn has_admin_token(&self) -> Result<bool> {
        self.timed(Op::HasAdminToken, self.inner.has_admin_token())
            .await
    }

    async fn heartbeat(
        &self,
        node: &hookd_store::NodeHeartbeat,
        live_within: Duration,
    ) -> Result<u32> {
        self.timed(Op::Heartbeat, self.inner.heartbeat(node, live_within))
            .await
    }

    async fn forget_node(&self, node_id: &str) -> Result<bool> {
        self.timed(Op::ForgetNode, self.inner.forget_node(node_id))
            .await
    }

    async fn nodes(&self) -> Result<Vec<hookd_store::NodeInfo>> {
        self.timed(Op::Nodes, self.inner.nodes()).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_op_has_its_own_label() {
        let unique: std::collections::BTreeSet<_> = OP_NAMES.iter().collect();
        assert_eq!(unique.len(), OP_NAMES.len());
        assert_eq!(OP_NAMES[Op::ClaimDue as usize], "claim_due");
        assert_eq!(OP_NAMES[Op::AcceptEvents as usize], "accept_events");
        assert_eq!(OP_NAMES[Op::HasAdminToken as usize], "has_admin_token");
        assert_eq!(OP_NAMES[Op::ClaimMany as usize], "claim_many");
        assert_eq!(OP_NAMES[Op::Nodes as usize], "nodes");
    }
}
