//! The behaviour suite every [`Store`] backend must pass.
//!
//! Each backend's `tests/conformance.rs` stamps out one test per behaviour
//! with [`conformance_tests!`](crate::conformance_tests), giving it a
//! function that makes a fresh, migrated store (or `None` to skip, which only
//! a backend whose server is not configured may do outside CI).
//! When a behaviour changes, this suite changes first.
#![allow(missing_docs)]

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use hookd_domain::delivery::{DeliveryState, ErrorClass};
use hookd_domain::destination::DestinationUrl;
use hookd_domain::event_type::{EventType, EventTypePattern};
use hookd_domain::signing::SigningSecret;
use hookd_domain::subscription::{RetryPolicy, SigningKeys, SubscriptionState};
use hookd_domain::{CustomerId, DeliveryId, EventId, JobId, SubscriptionId, Timestamp};

use crate::*;

mod fanout;
pub use fanout::*;

/// A fresh store for one test, and whatever keeps its database alive.
pub struct TestStore {
    /// The store under test.
    pub store: Arc<dyn Store>,
    /// Dropped at the end of the test (temp dir, schema, …).
    pub guard: Box<dyn std::any::Any + Send>,
}

impl std::fmt::Debug for TestStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TestStore")
            .field("store", &self.store)
            .finish()
    }
}

/// Stamps out the suite. `$make` is an `async fn() -> Option<TestStore>`.
#[macro_export]
macro_rules! conformance_tests {
    ($make:path) => {
        $crate::conformance_tests!(@each $make;
            subscriptions_round_trip,
            rate_limit_round_trips_through_create_get_and_update,
            max_concurrency_round_trips_through_create_get_and_update,
            deleted_subscriptions_are_not_found_and_fail_their_pending_deliveries,
            subscriptions_page_by_cursor_and_filter_by_customer,
            subscription_generation_changes_on_every_write,
            resealing_secrets_keeps_them_and_is_idempotent,
            accept_event_writes_the_event_and_its_deliveries,
            accept_event_is_all_or_nothing,
            a_repeated_idempotency_key_returns_the_same_event_and_writes_nothing,
            concurrent_duplicate_ingests_create_exactly_one_event,
            accept_events_commits_every_event_and_delivery_of_a_batch,
            accept_events_treats_a_key_taken_before_or_earlier_in_the_batch_as_a_duplicate,
            accept_events_fails_only_the_event_at_fault,
            accept_events_answers_in_input_order,
            concurrent_batches_with_one_key_create_exactly_one_event,
            accept_events_at_writes_nothing_once_the_generation_moved,
            accept_events_claiming_creates_only_what_it_returns_claimed,
            deliveries_claimed_at_ingest_expire_and_fence_as_claims_do,
            claims_take_due_deliveries_of_one_destination_oldest_first,
            claim_many_claims_for_every_request_in_order_and_nothing_twice,
            claim_many_claims_for_many_hosts_at_once,
            claimed_deliveries_are_not_claimed_again_while_leased,
            concurrent_claimers_never_share_a_delivery,
            expired_lease_is_claimable_again,
            a_late_result_after_a_lost_lease_does_not_overwrite_the_new_claim,
            record_attempt_moves_the_delivery_and_keeps_attempt_history,
            a_retry_is_not_due_before_its_delay,
            release_returns_claims_without_an_attempt,
            renew_extends_only_a_live_lease,
            disabled_subscriptions_keep_their_deliveries_unclaimed,
            due_destinations_lists_hosts_with_due_work,
            due_destinations_lists_each_hosts_claimable_subscriptions_with_their_due_times,
            due_destinations_limit_counts_hosts_not_subscriptions,
            due_destinations_reports_each_subscriptions_rate_limit,
            due_destinations_reports_each_subscriptions_max_concurrency,
            a_subscription_claim_takes_only_that_subscriptions_deliveries,
            newest_first_claims_take_the_newest_due_and_oldest_first_the_oldest,
            an_ordered_subscription_gives_only_its_head_in_either_order,
            ordered_deliveries_are_claimed_one_at_a_time_in_order,
            an_ordered_head_waiting_to_retry_blocks_the_deliveries_behind_it,
            an_ordered_head_that_is_delivered_or_final_unblocks_the_next,
            concurrent_claimers_never_hold_two_deliveries_of_one_ordered_subscription,
            ordered_subscriptions_do_not_block_others_on_the_same_host,
            replaying_a_final_delivery_queues_it_again_with_a_fresh_window,
            a_replayed_dead_delivery_is_claimable_and_its_attempts_continue,
            replaying_a_queued_delivery_changes_nothing,
            replaying_a_delivery_of_a_deleted_subscription_conflicts,
            deliveries_filter_and_page,
            subscription_health_counts_unfinished_dead_and_recent_attempts,
            subscription_health_of_a_quiet_subscription_is_empty,
            subscription_health_of_a_missing_or_deleted_subscription_is_not_found,
            tokens_are_found_by_hash,
            an_expired_token_is_not_found,
            missing_records_are_not_found,
            a_replay_job_fixes_its_items_and_exact_total,
            a_replay_job_with_no_items_completes_on_its_first_step,
            stepping_a_replay_job_requeues_a_window_in_delivery_order_and_settles_as_deliveries_finish,
            a_window_of_zero_only_settles,
            a_replay_job_waits_for_a_delivery_already_queued_and_skips_one_that_left_its_states,
            overlapping_replay_jobs_never_requeue_one_delivery_twice,
            a_cancelled_replay_job_stops_requeuing_and_freezes_its_counts,
            replay_job_items_of_a_deleted_subscription_are_skipped_or_settled,
            replay_jobs_of_missing_jobs_or_subscriptions_are_not_found,
            running_replay_jobs_lists_running_jobs_oldest_first,
            a_signal_is_raised_once_per_detail_with_its_notice,
            concurrent_raises_of_one_signal_raise_it_once_and_accept_one_notice,
            raising_disabled_disables_the_subscription_and_reenabling_lowers_it,
            lowering_a_signal_says_whether_it_was_raised,
            raised_signals_filter_by_kind_and_omit_deleted_subscriptions,
            raising_a_signal_for_a_missing_or_deleted_subscription_is_not_found,
            backlogs_count_unfinished_deliveries_of_live_subscriptions,
            due_work_counts_due_pending_deliveries_of_active_subscriptions,
            a_migrated_schema_is_current,
            a_failing_streak_starts_at_the_first_failure_and_ends_at_a_delivery,
            failing_streaks_count_attempts_whose_lease_was_lost,
            record_attempts_fences_each_record_by_its_own_lease,
            a_lease_recorded_twice_in_one_batch_moves_its_delivery_once,
            record_attempts_equals_recording_one_by_one,
            an_empty_batch_of_attempts_records_nothing,
            a_batch_moves_the_failing_streak_in_record_order,
            daily_stats_count_attempts_by_day_and_the_outcome_they_caused,
            retention_removes_finished_deliveries_and_folds_their_attempts_into_the_rollup,
            retention_never_removes_unfinished_deliveries_or_the_events_they_need,
            retention_in_small_batches_says_when_more_is_due,
            retention_removes_deliveries_and_their_attempts_before_the_events_outlive_them,
            an_event_over_the_lazy_fanout_threshold_commits_a_job_instead_of_its_deliveries,
            materializing_a_fanout_job_creates_each_planned_delivery_once_in_batches,
            concurrent_materializers_never_create_a_delivery_twice,
            a_lazy_fanout_writes_ordered_deliveries_at_once_and_follows_subscription_changes,
            retention_keeps_the_event_of_an_unfinished_fanout_job,
            a_batch_of_events_fans_out_lazily_only_the_ones_over_the_threshold,
            accept_events_at_refuses_a_lazy_fanout_once_the_generation_moved,
            heartbeats_count_the_live_nodes_that_deliver,
            heartbeats_forget_nodes_that_stopped,
            a_heartbeats_open_circuits_are_reported_until_the_next_replaces_them,
        );
    };
    (@each $make:path; $($name:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $name() {
                let Some(t) = $make().await else { return };
                $crate::conformance::$name(t.store.clone()).await;
                drop(t);
            }
        )*
    };
}

// --- fixtures ------------------------------------------------------------

fn url(host: &str) -> DestinationUrl {
    DestinationUrl::parse(
        &format!("http://{host}:9/hook"),
        hookd_domain::destination::DestinationPolicy::AllowPrivate,
    )
    .unwrap()
}

/// A subscription to `*` at `http://{host}:9/hook` (private addresses allowed).
pub fn new_sub(host: &str, customer: Option<&str>) -> NewSubscription {
    NewSubscription {
        id: SubscriptionId::new(),
        customer_id: customer.map(|c| CustomerId::parse(c).unwrap()),
        url: url(host),
        event_types: vec![EventTypePattern::parse("*").unwrap()],
        keys: SigningKeys {
            current: SigningSecret::generate(),
            previous: None,
        },
        ordered: false,
        retry_policy: RetryPolicy::default(),
        rate_limit: None,
        max_concurrency: None,
        description: None,
    }
}

/// An event of type `ty` with a small payload.
pub fn new_event(ty: &str, key: Option<&str>) -> NewEvent {
    NewEvent {
        id: EventId::new(),
        event_type: EventType::parse(ty).unwrap(),
        payload: r#"{"n":1}"#.to_owned(),
        idempotency_key: key.map(str::to_owned),
        customer_id: None,
    }
}

fn delivery_to(sub: &Subscription) -> NewDelivery {
    NewDelivery {
        id: DeliveryId::new(),
        sub_id: sub.id,
        destination_host: sub.url.host().to_owned(),
    }
}

/// Accepts one event fanned out to `subs`; returns its id and delivery ids.
async fn ingest(store: &Arc<dyn Store>, subs: &[&Subscription]) -> (EventId, Vec<DeliveryId>) {
    let deliveries: Vec<NewDelivery> = subs.iter().map(|s| delivery_to(s)).collect();
    let ids = deliveries.iter().map(|d| d.id).collect();
    let acc = store
        .accept_event(new_event("order.created", None), deliveries)
        .await
        .unwrap();
    (acc.event_id, ids)
}

/// An ordered subscription to `host`.
async fn ordered_sub(store: &Arc<dyn Store>, host: &str) -> Subscription {
    let mut n = new_sub(host, None);
    n.ordered = true;
    store.create_subscription(n).await.unwrap()
}

/// Claims what `host` has and returns the claimed delivery ids, in order.
async fn claim_ids(store: &Arc<dyn Store>, host: &str) -> Vec<DeliveryId> {
    store
        .claim_due(&claim_req(host, 10, LONG))
        .await
        .unwrap()
        .into_iter()
        .map(|c| c.delivery.id)
        .collect()
}

/// Claims exactly one delivery of `host` and returns it.
async fn claim_one(store: &Arc<dyn Store>, host: &str) -> ClaimedDelivery {
    let mut got = store.claim_due(&claim_req(host, 10, LONG)).await.unwrap();
    assert_eq!(
        got.len(),
        1,
        "{:?}",
        got.iter().map(|c| c.delivery.id).collect::<Vec<_>>()
    );
    got.remove(0)
}

/// Records attempt `attempt + 1` of a claimed delivery, ending in `next`.
async fn finish(store: &Arc<dyn Store>, c: &ClaimedDelivery, status: u16, next: NextState) {
    let r = AttemptRecord {
        lease: c.lease,
        attempt: attempt(c.delivery.attempt + 1, Some(status)),
        next,
        last_error: (status >= 300).then(|| format!("HTTP {status}")),
    };
    assert_eq!(
        store.record_attempt(r).await.unwrap(),
        RecordOutcome::Recorded
    );
}

fn claim_req(host: &str, limit: u32, lease: Duration) -> ClaimRequest {
    ClaimRequest {
        worker_id: "w1".into(),
        destination: host.into(),
        subscription: None,
        order: ClaimOrder::OldestFirst,
        limit,
        lease,
    }
}

/// A claim of `sub`'s deliveries only, in `order`.
fn sub_claim_req(sub: &Subscription, order: ClaimOrder, limit: u32) -> ClaimRequest {
    ClaimRequest {
        subscription: Some(sub.id),
        order,
        ..claim_req(sub.url.host(), limit, LONG)
    }
}

/// Claims `sub`'s deliveries in `order` and returns their ids, in the order
/// returned.
async fn claim_sub_ids(
    store: &Arc<dyn Store>,
    sub: &Subscription,
    order: ClaimOrder,
    limit: u32,
) -> Vec<DeliveryId> {
    store
        .claim_due(&sub_claim_req(sub, order, limit))
        .await
        .unwrap()
        .into_iter()
        .map(|c| c.delivery.id)
        .collect()
}

/// The hosts [`Store::due_destinations`] lists, in its order.
async fn due_hosts(store: &Arc<dyn Store>, limit: u32) -> Vec<String> {
    store
        .due_destinations(limit)
        .await
        .unwrap()
        .into_iter()
        .map(|d| d.host)
        .collect()
}

/// `next_attempt_at` of a delivery, as stored.
async fn due_at(store: &Arc<dyn Store>, id: &DeliveryId) -> Timestamp {
    store
        .get_delivery(id)
        .await
        .unwrap()
        .delivery
        .next_attempt_at
}

const LONG: Duration = Duration::from_secs(300);

fn attempt(number: u32, status: Option<u16>) -> Attempt {
    Attempt {
        number,
        started_at: chrono::Utc::now(),
        duration: Duration::from_millis(12),
        status,
        error_class: if status.is_none() {
            Some(ErrorClass::Timeout)
        } else {
            None
        },
        response_snippet: status.map(|s| format!("status {s}")),
    }
}

/// Polls `f` until it returns true, failing after a generous deadline.
async fn eventually<F, Fut>(what: &str, mut f: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !f().await {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for: {what}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

// --- subscriptions ---------------------------------------------------------

pub async fn subscriptions_round_trip(store: Arc<dyn Store>) {
    let mut n = new_sub("a.example", Some("acme"));
    n.ordered = true;
    n.retry_policy = RetryPolicy {
        max_attempts: Some(3),
        retryable_statuses: vec![403],
        ..Default::default()
    };
    n.description = Some("orders".into());
    n.event_types = vec![
        EventTypePattern::parse("invoice.*").unwrap(),
        EventTypePattern::parse("user.created").unwrap(),
    ];
    let created = store.create_subscription(n.clone()).await.unwrap();
    assert_eq!(created.id, n.id);
    assert_eq!(created.url, n.url);
    assert_eq!(created.event_types, n.event_types);
    assert_eq!(created.keys, n.keys);
    assert_eq!(created.retry_policy, n.retry_policy);
    assert!(created.ordered);
    assert_eq!(created.state, SubscriptionState::Active);
    assert_eq!(created.customer_id, n.customer_id);
    assert_eq!(created.description.as_deref(), Some("orders"));

    let got = store.get_subscription(&n.id).await.unwrap();
    assert_eq!(got, created);

    let dup = store.create_subscription(n.clone()).await;
    assert!(matches!(dup, Err(StoreError::Conflict(_))), "{dup:?}");

    let new_keys = SigningKeys {
        current: SigningSecret::generate(),
        previous: Some((
            n.keys.current.clone(),
            chrono::Utc::now() + chrono::Duration::hours(24),
        )),
    };
    let patched = store
        .update_subscription(
            &n.id,
            SubscriptionPatch {
                url: Some(url("b.example")),
                ordered: Some(false),
                state: Some(SubscriptionState::Disabled),
                keys: Some(new_keys.clone()),
                description: Some(None),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    assert_eq!(patched.url.host(), "b.example");
    assert!(!patched.ordered);
    assert_eq!(patched.state, SubscriptionState::Disabled);
    assert_eq!(patched.event_types, n.event_types, "unpatched fields stay");
    assert_eq!(patched.description, None);
    assert_eq!(patched.keys.current, new_keys.current);
    let (prev, until) = patched.keys.previous.clone().unwrap();
    assert_eq!(prev, n.keys.current);
    assert!(
        (until - new_keys.previous.unwrap().1)
            .num_milliseconds()
            .abs()
            < 1000
    );
    assert!(patched.updated_at >= created.updated_at);
    assert_eq!(store.get_subscription(&n.id).await.unwrap(), patched);
}

pub async fn rate_limit_round_trips_through_create_get_and_update(store: Arc<dyn Store>) {
    let unset = store
        .create_subscription(new_sub("r.example", None))
        .await
        .unwrap();
    assert_eq!(unset.rate_limit, None, "unset means adaptive");
    let mut n = new_sub("r.example", None);
    n.rate_limit = Some(25);
    let created = store.create_subscription(n.clone()).await.unwrap();
    assert_eq!(created.rate_limit, Some(25));
    assert_eq!(store.get_subscription(&n.id).await.unwrap(), created);
    let listed = |subs: Vec<Subscription>| {
        subs.into_iter()
            .map(|s| (s.id, s.rate_limit))
            .collect::<HashSet<_>>()
    };
    let want = HashSet::from([(unset.id, None), (n.id, Some(25))]);
    assert_eq!(listed(store.all_subscriptions().await.unwrap()), want);
    let q = SubscriptionQuery {
        limit: 10,
        ..Default::default()
    };
    assert_eq!(listed(store.list_subscriptions(&q).await.unwrap()), want);

    let patch = |rate_limit| SubscriptionPatch {
        rate_limit,
        ..Default::default()
    };
    let changed = store
        .update_subscription(&n.id, patch(Some(Some(10_000))))
        .await
        .unwrap();
    assert_eq!(changed.rate_limit, Some(10_000));
    assert_eq!(store.get_subscription(&n.id).await.unwrap(), changed);
    // A patch that does not name it leaves it.
    let other = store
        .update_subscription(
            &n.id,
            SubscriptionPatch {
                ordered: Some(true),
                description: Some(Some("x".into())),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    assert_eq!(other.rate_limit, Some(10_000), "unpatched fields stay");
    assert_eq!(
        store
            .update_subscription(&n.id, patch(None))
            .await
            .unwrap()
            .rate_limit,
        Some(10_000)
    );
    let cleared = store
        .update_subscription(&n.id, patch(Some(None)))
        .await
        .unwrap();
    assert_eq!(cleared.rate_limit, None, "Some(None) clears it");
    assert!(cleared.ordered, "clearing it changes nothing else");
    assert_eq!(store.get_subscription(&n.id).await.unwrap(), cleared);
    // And it can be set again, on a subscription created without one.
    let set = store
        .update_subscription(&unset.id, patch(Some(Some(1))))
        .await
        .unwrap();
    assert_eq!(set.rate_limit, Some(1));
    assert_eq!(store.get_subscription(&unset.id).await.unwrap(), set);
}

pub async fn max_concurrency_round_trips_through_create_get_and_update(store: Arc<dyn Store>) {
    let unset = store
        .create_subscription(new_sub("c.example", None))
        .await
        .unwrap();
    assert_eq!(
        unset.max_concurrency, None,
        "unset means the server-wide cap"
    );
    let mut n = new_sub("c.example", None);
    n.max_concurrency = Some(4);
    n.rate_limit = Some(30);
    let created = store.create_subscription(n.clone()).await.unwrap();
    assert_eq!(created.max_concurrency, Some(4));
    assert_eq!(created.rate_limit, Some(30), "a separate column");
    assert_eq!(store.get_subscription(&n.id).await.unwrap(), created);
    let listed = |subs: Vec<Subscription>| {
        subs.into_iter()
            .map(|s| (s.id, s.max_concurrency))
            .collect::<HashSet<_>>()
    };
    let want = HashSet::from([(unset.id, None), (n.id, Some(4))]);
    assert_eq!(listed(store.all_subscriptions().await.unwrap()), want);
    let q = SubscriptionQuery {
        limit: 10,
        ..Default::default()
    };
    assert_eq!(listed(store.list_subscriptions(&q).await.unwrap()), want);

    let patch = |max_concurrency| SubscriptionPatch {
        max_concurrency,
        ..Default::default()
    };
    let changed = store
        .update_subscription(&n.id, patch(Some(Some(1_000))))
        .await
        .unwrap();
    assert_eq!(changed.max_concurrency, Some(1_000));
    assert_eq!(changed.rate_limit, Some(30), "the rate limit stays");
    assert_eq!(store.get_subscription(&n.id).await.unwrap(), changed);
    // A patch that does not name it leaves it, even one naming the rate.
    let other = store
        .update_subscription(
            &n.id,
            SubscriptionPatch {
                ordered: Some(true),
                rate_limit: Some(None),
                description: Some(Some("x".into())),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    assert_eq!(other.max_concurrency, Some(1_000), "unpatched fields stay");
    assert_eq!(other.rate_limit, None);
    assert_eq!(
        store
            .update_subscription(&n.id, patch(None))
            .await
            .unwrap()
            .max_concurrency,
        Some(1_000)
    );
    let cleared = store
        .update_subscription(&n.id, patch(Some(None)))
        .await
        .unwrap();
    assert_eq!(cleared.max_concurrency, None, "Some(None) clears it");
    assert!(cleared.ordered, "clearing it changes nothing else");
    assert_eq!(cleared.description.as_deref(), Some("x"));
    assert_eq!(store.get_subscription(&n.id).await.unwrap(), cleared);
    // And it can be set again, on a subscription created without one.
    let set = store
        .update_subscription(&unset.id, patch(Some(Some(1))))
        .await
        .unwrap();
    assert_eq!(set.max_concurrency, Some(1));
    assert_eq!(set.rate_limit, None);
    assert_eq!(store.get_subscription(&unset.id).await.unwrap(), set);
}

pub async fn deleted_subscriptions_are_not_found_and_fail_their_pending_deliveries(
    store: Arc<dyn Store>,
) {
    let sub = store
        .create_subscription(new_sub("del.example", None))
        .await
        .unwrap();
    let (_, ids) = ingest(&store, &[&sub]).await;
    let (_, in_flight) = ingest(&store, &[&sub]).await;
    let claimed = store
        .claim_due(&claim_req("del.example", 1, LONG))
        .await
        .unwrap()
        .remove(0);
    // The oldest was claimed; the other stays pending.
    assert_eq!(claimed.delivery.id, ids[0]);
    let (ids, in_flight) = (in_flight, ids);
    store.delete_subscription(&sub.id).await.unwrap();
    // The in-flight worker's late result cannot revive the delivery.
    let late = AttemptRecord {
        lease: claimed.lease,
        attempt: attempt(1, Some(500)),
        next: NextState::Retry {
            delay: Duration::ZERO,
        },
        last_error: None,
    };
    assert_eq!(
        store.record_attempt(late).await.unwrap(),
        RecordOutcome::LeaseLost
    );
    assert_eq!(store.release(&[claimed.lease]).await.unwrap(), 0);
    assert_eq!(store.reclaim_expired().await.unwrap(), 0);
    let d = store.get_delivery(&in_flight[0]).await.unwrap();
    assert_eq!(d.delivery.state, DeliveryState::Failed);
    assert_eq!(
        d.delivery.last_error.as_deref(),
        Some("subscription deleted")
    );
    assert!(matches!(
        store.get_subscription(&sub.id).await,
        Err(StoreError::NotFound)
    ));
    assert!(matches!(
        store.delete_subscription(&sub.id).await,
        Err(StoreError::NotFound)
    ));
    assert!(matches!(
        store
            .update_subscription(&sub.id, SubscriptionPatch::default())
            .await,
        Err(StoreError::NotFound)
    ));
    assert!(
        store
            .all_subscriptions()
            .await
            .unwrap()
            .iter()
            .all(|s| s.id != sub.id)
    );
    let d = store.get_delivery(&ids[0]).await.unwrap();
    assert_eq!(d.delivery.state, DeliveryState::Failed);
    assert_eq!(
        d.delivery.last_error.as_deref(),
        Some("subscription deleted")
    );
    assert!(
        store
            .claim_due(&claim_req("del.example", 10, LONG))
            .await
            .unwrap()
            .is_empty()
    );
}

pub async fn subscriptions_page_by_cursor_and_filter_by_customer(store: Arc<dyn Store>) {
    let mut acme = Vec::new();
    for i in 0..5 {
        let customer = if i % 2 == 0 { "acme" } else { "globex" };
        let s = store
            .create_subscription(new_sub("p.example", Some(customer)))
            .await
            .unwrap();
        if customer == "acme" {
            acme.push(s.id);
        }
    }
    let all = store
        .list_subscriptions(&SubscriptionQuery {
            limit: 100,
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(all.len(), 5);
    assert!(all.windows(2).all(|w| w[0].id < w[1].id), "oldest first");

    let page1 = store
        .list_subscriptions(&SubscriptionQuery {
            limit: 2,
            ..Default::default()
        })
        .await
        .unwrap();
    let page2 = store
        .list_subscriptions(&SubscriptionQuery {
            limit: 2,
            cursor: Some(page1[1].id),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(page1.len(), 2);
    assert_eq!(page2.len(), 2);
    assert_eq!(page2[0].id, all[2].id);

    let only = store
        .list_subscriptions(&SubscriptionQuery {
            limit: 100,
            customer_id: Some(CustomerId::parse("acme").unwrap()),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(only.iter().map(|s| s.id).collect::<Vec<_>>(), acme);
}

pub async fn subscription_generation_changes_on_every_write(store: Arc<dyn Store>) {
    let g0 = store.subscription_generation().await.unwrap();
    let s = store
        .create_subscription(new_sub("g.example", None))
        .await
        .unwrap();
    let g1 = store.subscription_generation().await.unwrap();
    assert_ne!(g0, g1);
    store
        .update_subscription(
            &s.id,
            SubscriptionPatch {
                ordered: Some(true),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    let g2 = store.subscription_generation().await.unwrap();
    assert_ne!(g1, g2);
    store.delete_subscription(&s.id).await.unwrap();
    let g3 = store.subscription_generation().await.unwrap();
    assert_ne!(g2, g3);
    assert_eq!(
        g3,
        store.subscription_generation().await.unwrap(),
        "reads do not change it"
    );
}

/// Everything a store writes is sealed under its current key already, so
/// resealing finds nothing to do; the secrets read back unchanged.
pub async fn resealing_secrets_keeps_them_and_is_idempotent(store: Arc<dyn Store>) {
    let plain = store
        .create_subscription(new_sub("reseal-a.example", None))
        .await
        .unwrap();
    let mut rotating = new_sub("reseal-b.example", None);
    rotating.keys.previous = Some((
        SigningSecret::generate(),
        whole_second(chrono::Utc::now() + chrono::Duration::days(1)),
    ));
    let rotating = store.create_subscription(rotating).await.unwrap();
    let deleted = store
        .create_subscription(new_sub("reseal-c.example", None))
        .await
        .unwrap();
    store.delete_subscription(&deleted.id).await.unwrap();
    let generation = store.subscription_generation().await.unwrap();

    assert_eq!(store.reseal_secrets().await.unwrap(), 0);
    assert_eq!(store.reseal_secrets().await.unwrap(), 0, "idempotent");

    for before in [&plain, &rotating] {
        let after = store.get_subscription(&before.id).await.unwrap();
        assert_eq!(after.keys, before.keys);
        assert_eq!(after.updated_at, before.updated_at);
    }
    assert_eq!(
        store.subscription_generation().await.unwrap(),
        generation,
        "resealing changes no subscription"
    );
}

// --- ingest ------------------------------------------------------------------

pub async fn accept_event_writes_the_event_and_its_deliveries(store: Arc<dyn Store>) {
    let a = store
        .create_subscription(new_sub("a.example", None))
        .await
        .unwrap();
    let b = store
        .create_subscription(new_sub("b.example", None))
        .await
        .unwrap();
    let mut ev = new_event("invoice.paid", Some("key-1"));
    ev.customer_id = Some(CustomerId::parse("acme").unwrap());
    ev.payload = r#"{"amount": 12.5, "nested": {"a": [1, 2]}}"#.to_owned();
    let (da, db) = (delivery_to(&a), delivery_to(&b));
    let acc = store
        .accept_event(ev.clone(), vec![da.clone(), db.clone()])
        .await
        .unwrap();
    assert_eq!(
        acc,
        Accepted {
            event_id: ev.id,
            duplicate: false
        }
    );

    let got = store.get_event(&ev.id).await.unwrap();
    assert_eq!(got.event_type, ev.event_type);
    assert_eq!(got.payload, ev.payload, "payload is kept byte for byte");
    assert_eq!(got.idempotency_key.as_deref(), Some("key-1"));
    assert_eq!(got.customer_id, ev.customer_id);

    let listed = store
        .list_deliveries(&DeliveryQuery {
            event_id: Some(ev.id),
            limit: 10,
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(listed.len(), 2);
    for d in &listed {
        assert_eq!(d.delivery.state, DeliveryState::Pending);
        assert_eq!(d.delivery.attempt, 0);
        assert_eq!(d.delivery.event_type.as_str(), "invoice.paid");
        assert!(d.attempts.is_empty());
        assert!(d.delivery.next_attempt_at <= chrono::Utc::now() + chrono::Duration::seconds(1));
    }
    let hosts: HashSet<_> = listed
        .iter()
        .map(|d| d.delivery.destination_host.clone())
        .collect();
    assert_eq!(
        hosts,
        HashSet::from(["a.example".to_owned(), "b.example".to_owned()])
    );

    // An event nobody subscribes to is still accepted.
    let lonely = store
        .accept_event(new_event("nobody.cares", None), vec![])
        .await
        .unwrap();
    assert!(!lonely.duplicate);
    assert!(store.get_event(&lonely.event_id).await.is_ok());
}

pub async fn accept_event_is_all_or_nothing(store: Arc<dyn Store>) {
    let a = store
        .create_subscription(new_sub("a.example", None))
        .await
        .unwrap();
    let ev = new_event("order.created", Some("atomic-1"));
    // The second delivery names a subscription that does not exist: the
    // insert fails after the event row and the first delivery were written.
    let ghost = NewDelivery {
        id: DeliveryId::new(),
        sub_id: SubscriptionId::new(),
        destination_host: "x".into(),
    };
    let first = delivery_to(&a);
    let res = store
        .accept_event(ev.clone(), vec![first.clone(), ghost])
        .await;
    assert!(res.is_err(), "a failed delivery insert fails the ingest");
    assert!(
        matches!(store.get_event(&ev.id).await, Err(StoreError::NotFound)),
        "no event row"
    );
    assert!(
        matches!(
            store.get_delivery(&first.id).await,
            Err(StoreError::NotFound)
        ),
        "no delivery row"
    );
    // The key was not consumed: the producer's retry succeeds.
    let again = store
        .accept_event(ev.clone(), vec![delivery_to(&a)])
        .await
        .unwrap();
    assert_eq!(
        again,
        Accepted {
            event_id: ev.id,
            duplicate: false
        }
    );
}

pub async fn a_repeated_idempotency_key_returns_the_same_event_and_writes_nothing(
    store: Arc<dyn Store>,
) {
    let a = store
        .create_subscription(new_sub("a.example", None))
        .await
        .unwrap();
    let first = store
        .accept_event(new_event("x.y", Some("dup")), vec![delivery_to(&a)])
        .await
        .unwrap();
    let retry = new_event("x.y", Some("dup"));
    let retry_delivery = delivery_to(&a);
    let second = store
        .accept_event(retry.clone(), vec![retry_delivery.clone()])
        .await
        .unwrap();
    assert_eq!(
        second,
        Accepted {
            event_id: first.event_id,
            duplicate: true
        }
    );
    assert!(matches!(
        store.get_event(&retry.id).await,
        Err(StoreError::NotFound)
    ));
    assert!(matches!(
        store.get_delivery(&retry_delivery.id).await,
        Err(StoreError::NotFound)
    ));
    let all = store
        .list_deliveries(&DeliveryQuery {
            sub_id: Some(a.id),
            limit: 10,
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(all.len(), 1);
    // Events without a key are never deduplicated.
    let x = store
        .accept_event(new_event("x.y", None), vec![])
        .await
        .unwrap();
    let y = store
        .accept_event(new_event("x.y", None), vec![])
        .await
        .unwrap();
    assert_ne!(x.event_id, y.event_id);
}

pub async fn concurrent_duplicate_ingests_create_exactly_one_event(store: Arc<dyn Store>) {
    let a = store
        .create_subscription(new_sub("a.example", None))
        .await
        .unwrap();
    let tasks: Vec<_> = (0..24)
        .map(|_| {
            let store = store.clone();
            let d = delivery_to(&a);
            tokio::spawn(async move {
                store
                    .accept_event(new_event("x.y", Some("race")), vec![d])
                    .await
                    .unwrap()
            })
        })
        .collect();
    let results: Vec<Accepted> = futures::future::join_all(tasks)
        .await
        .into_iter()
        .map(|r| r.unwrap())
        .collect();
    let ids: HashSet<_> = results.iter().map(|r| r.event_id).collect();
    assert_eq!(ids.len(), 1, "every caller gets the same event id");
    assert_eq!(
        results.iter().filter(|r| !r.duplicate).count(),
        1,
        "exactly one created it"
    );
    let all = store
        .list_deliveries(&DeliveryQuery {
            sub_id: Some(a.id),
            limit: 100,
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(all.len(), 1, "exactly one delivery");
}

// --- ingest in batches (group commit) ------------------------------------------

/// An event and its deliveries, as `accept_events` takes them.
type Ingest = (NewEvent, Vec<NewDelivery>);

/// How many deliveries `sub` has.
async fn deliveries_of(store: &Arc<dyn Store>, sub: &SubscriptionId) -> usize {
    store
        .list_deliveries(&DeliveryQuery {
            sub_id: Some(*sub),
            limit: 1000,
            ..Default::default()
        })
        .await
        .unwrap()
        .len()
}

pub async fn accept_events_commits_every_event_and_delivery_of_a_batch(store: Arc<dyn Store>) {
    let a = store
        .create_subscription(new_sub("a.example", None))
        .await
        .unwrap();
    let b = store
        .create_subscription(new_sub("b.example", None))
        .await
        .unwrap();
    let mut keyed = new_event("invoice.paid", Some("batch-key"));
    keyed.customer_id = Some(CustomerId::parse("acme").unwrap());
    keyed.payload = r#"{"amount": 12.5}"#.to_owned();
    let batch: Vec<Ingest> = vec![
        (
            new_event("order.created", None),
            vec![delivery_to(&a), delivery_to(&b)],
        ),
        (new_event("nobody.cares", None), vec![]),
        (keyed.clone(), vec![delivery_to(&b)]),
    ];
    let results = store.accept_events(batch.clone()).await.unwrap();
    assert_eq!(results.len(), 3);
    for (res, (event, deliveries)) in results.iter().zip(&batch) {
        assert_eq!(
            res.as_ref().unwrap(),
            &Accepted {
                event_id: event.id,
                duplicate: false
            }
        );
        assert!(event_exists(&store, &event.id).await);
        for d in deliveries {
            let got = store.get_delivery(&d.id).await.unwrap().delivery;
            assert_eq!(got.event_id, event.id);
            assert_eq!(got.sub_id, d.sub_id);
            assert_eq!(got.state, DeliveryState::Pending);
            assert_eq!(got.attempt, 0);
            assert_eq!(got.event_type, event.event_type);
            assert_eq!(got.destination_host, d.destination_host);
        }
    }
    let got = store.get_event(&keyed.id).await.unwrap();
    assert_eq!(got.payload, keyed.payload, "payload is kept byte for byte");
    assert_eq!(got.idempotency_key.as_deref(), Some("batch-key"));
    assert_eq!(got.customer_id, keyed.customer_id);
    assert_eq!(deliveries_of(&store, &a.id).await, 1);
    assert_eq!(deliveries_of(&store, &b.id).await, 2);
    // Its deliveries are claimable at once, as accept_event's are.
    assert_eq!(claim_ids(&store, "b.example").await.len(), 2);

    // An empty batch writes nothing and answers nothing.
    assert!(store.accept_events(vec![]).await.unwrap().is_empty());
}

pub async fn accept_events_treats_a_key_taken_before_or_earlier_in_the_batch_as_a_duplicate(
    store: Arc<dyn Store>,
) {
    let a = store
        .create_subscription(new_sub("a.example", None))
        .await
        .unwrap();
    let before = store
        .accept_event(new_event("x.y", Some("taken")), vec![delivery_to(&a)])
        .await
        .unwrap();
    let batch: Vec<Ingest> = vec![
        (new_event("x.y", Some("taken")), vec![delivery_to(&a)]),
        (new_event("x.y", Some("fresh")), vec![delivery_to(&a)]),
        (new_event("x.y", Some("fresh")), vec![delivery_to(&a)]),
        (new_event("x.y", None), vec![delivery_to(&a)]),
        (new_event("x.y", Some("taken")), vec![delivery_to(&a)]),
    ];
    let results: Vec<Accepted> = store
        .accept_events(batch.clone())
        .await
        .unwrap()
        .into_iter()
        .map(Result::unwrap)
        .collect();
    let id = |i: usize| batch[i].0.id;
    assert_eq!(
        results,
        vec![
            Accepted {
                event_id: before.event_id,
                duplicate: true
            },
            Accepted {
                event_id: id(1),
                duplicate: false
            },
            Accepted {
                event_id: id(1),
                duplicate: true
            },
            Accepted {
                event_id: id(3),
                duplicate: false
            },
            Accepted {
                event_id: before.event_id,
                duplicate: true
            },
        ]
    );
    // A duplicate wrote nothing: neither its event nor its deliveries.
    for i in [0, 2, 4] {
        assert!(!event_exists(&store, &id(i)).await);
        assert!(!delivery_exists(&store, &batch[i].1[0].id).await);
    }
    for i in [1, 3] {
        assert!(event_exists(&store, &id(i)).await);
        assert!(delivery_exists(&store, &batch[i].1[0].id).await);
    }
    assert_eq!(deliveries_of(&store, &a.id).await, 3);
    // The key the batch took is taken for a single ingest too.
    let later = store
        .accept_event(new_event("x.y", Some("fresh")), vec![delivery_to(&a)])
        .await
        .unwrap();
    assert_eq!(
        later,
        Accepted {
            event_id: id(1),
            duplicate: true
        }
    );
}

pub async fn accept_events_fails_only_the_event_at_fault(store: Arc<dyn Store>) {
    let a = store
        .create_subscription(new_sub("a.example", None))
        .await
        .unwrap();
    let b = store
        .create_subscription(new_sub("b.example", None))
        .await
        .unwrap();
    let ghost = || NewDelivery {
        id: DeliveryId::new(),
        sub_id: SubscriptionId::new(),
        destination_host: "x".into(),
    };
    let repeated = delivery_to(&a);
    let repeated_again = NewDelivery {
        id: DeliveryId::new(),
        ..repeated.clone()
    };
    let batch: Vec<Ingest> = vec![
        (
            new_event("x.y", None),
            vec![delivery_to(&a), delivery_to(&b)],
        ),
        // A delivery to a subscription that does not exist.
        (new_event("x.y", None), vec![delivery_to(&a), ghost()]),
        // One subscription twice.
        (new_event("x.y", None), vec![repeated, repeated_again]),
        (new_event("x.y", Some("ok")), vec![delivery_to(&b)]),
        // At fault while holding a key: the key stays free...
        (
            new_event("x.y", Some("freed")),
            vec![delivery_to(&b), ghost()],
        ),
        // ...so the next event with it creates.
        (new_event("x.y", Some("freed")), vec![delivery_to(&a)]),
    ];
    let results = store.accept_events(batch.clone()).await.unwrap();
    assert_eq!(results.len(), batch.len());
    for (i, (res, (event, deliveries))) in results.iter().zip(&batch).enumerate() {
        let at_fault = [1, 2, 4].contains(&i);
        if at_fault {
            assert!(res.is_err(), "event {i} is at fault: {res:?}");
        } else {
            assert_eq!(
                res.as_ref().unwrap(),
                &Accepted {
                    event_id: event.id,
                    duplicate: false
                },
                "event {i} commits"
            );
        }
        assert_eq!(
            event_exists(&store, &event.id).await,
            !at_fault,
            "event {i}"
        );
        for d in deliveries {
            assert_eq!(
                delivery_exists(&store, &d.id).await,
                !at_fault,
                "a delivery of event {i}"
            );
        }
    }
    assert_eq!(deliveries_of(&store, &a.id).await, 2);
    assert_eq!(deliveries_of(&store, &b.id).await, 2);
}

pub async fn accept_events_answers_in_input_order(store: Arc<dyn Store>) {
    let subs = [
        store
            .create_subscription(new_sub("a.example", None))
            .await
            .unwrap(),
        store
            .create_subscription(new_sub("b.example", None))
            .await
            .unwrap(),
        store
            .create_subscription(new_sub("c.example", None))
            .await
            .unwrap(),
    ];
    // More events and deliveries than one INSERT statement takes, keys in
    // no particular order (7919 is prime to n, so `i * 7919 % n` is unique
    // per i), every fifth event repeating the key of the third before it.
    let n = 1200;
    let key_of = |i: usize| match i % 5 {
        1 => None,
        0 if i == 0 => None,
        0 => Some(format!("key-{:04}", (i - 3) * 7919 % n)),
        _ => Some(format!("key-{:04}", i * 7919 % n)),
    };
    let batch: Vec<Ingest> = (0..n)
        .map(|i: usize| {
            let deliveries = subs[..1 + i % 3].iter().map(delivery_to).collect();
            (new_event("order.created", key_of(i).as_deref()), deliveries)
        })
        .collect();
    let results: Vec<Accepted> = store
        .accept_events(batch.clone())
        .await
        .unwrap()
        .into_iter()
        .map(Result::unwrap)
        .collect();
    assert_eq!(results.len(), n);
    // The expected answer, worked out one event at a time.
    let mut holder: std::collections::HashMap<&str, EventId> = Default::default();
    let mut created = 0;
    for (i, ((event, deliveries), res)) in batch.iter().zip(&results).enumerate() {
        let expected = match event.idempotency_key.as_deref() {
            Some(key) if holder.contains_key(key) => Accepted {
                event_id: holder[key],
                duplicate: true,
            },
            key => {
                if let Some(key) = key {
                    holder.insert(key, event.id);
                }
                created += deliveries.len();
                Accepted {
                    event_id: event.id,
                    duplicate: false,
                }
            }
        };
        assert_eq!(*res, expected, "event {i}");
    }
    assert!(created > 1000, "the batch spans several INSERT statements");
    let total: u64 = store
        .backlogs()
        .await
        .unwrap()
        .iter()
        .map(|b| b.unfinished)
        .sum();
    assert_eq!(
        total, created as u64,
        "every new event's deliveries, no more"
    );
}

pub async fn accept_events_at_writes_nothing_once_the_generation_moved(store: Arc<dyn Store>) {
    let a = store
        .create_subscription(new_sub("a.example", None))
        .await
        .unwrap();
    accept_events_at_checks_the_generation(&store, &[a]).await;
}

/// An [`IngestClaim`] of `deliveries` for worker "w1".
fn ingest_claim(deliveries: &[DeliveryId], lease: Duration) -> IngestClaim {
    IngestClaim {
        worker_id: "w1".into(),
        lease,
        deliveries: deliveries.iter().copied().collect(),
    }
}

/// Accepts `batch` claiming `named`; returns each event's result and the
/// leases.
async fn accept_claiming(
    store: &Arc<dyn Store>,
    batch: Vec<(NewEvent, Vec<NewDelivery>)>,
    named: &[DeliveryId],
    lease: Duration,
) -> (Vec<Result<Accepted>>, Vec<Lease>) {
    let generation = store.subscription_generation().await.unwrap();
    match store
        .accept_events_claiming(Some(generation), batch, &ingest_claim(named, lease))
        .await
        .unwrap()
    {
        (BatchOutcome::Accepted(results), leases) => (results, leases),
        (BatchOutcome::GenerationMoved(_), _) => panic!("no subscription changed"),
    }
}

/// [`Store::accept_events_claiming`]: what comes back is `inflight`, not
/// claimable, and recorded with its lease like any claim; a named delivery
/// that did not come back, and every unnamed one, is `pending` and
/// claimable; a duplicate event and a refused batch claim nothing. (A
/// backend may claim none at all: the plain backends are also held to
/// claiming, by [`ingest_claims_every_named_delivery`].)
pub async fn accept_events_claiming_creates_only_what_it_returns_claimed(store: Arc<dyn Store>) {
    let a = store
        .create_subscription(new_sub("a.example", None))
        .await
        .unwrap();
    let b = store
        .create_subscription(new_sub("b.example", None))
        .await
        .unwrap();
    let (da, db) = (delivery_to(&a), delivery_to(&b));
    let named = [da.id];
    let (results, leases) = accept_claiming(
        &store,
        vec![(
            new_event("order.created", Some("k1")),
            vec![da.clone(), db.clone()],
        )],
        &named,
        LONG,
    )
    .await;
    assert!(
        matches!(&results[..], [Ok(acc)] if !acc.duplicate),
        "{results:?}"
    );
    assert!(
        leases.iter().all(|l| named.contains(&l.delivery_id)),
        "{leases:?}"
    );
    let claimed: HashSet<DeliveryId> = leases.iter().map(|l| l.delivery_id).collect();
    for id in [da.id, db.id] {
        let d = store.get_delivery(&id).await.unwrap().delivery;
        let want = if claimed.contains(&id) {
            DeliveryState::Inflight
        } else {
            DeliveryState::Pending
        };
        assert_eq!(d.state, want, "{id}");
        assert_eq!(d.attempt, 0);
    }
    // Only what was not claimed at ingest is claimable.
    let mut want_a: Vec<DeliveryId> = vec![da.id];
    want_a.retain(|id| !claimed.contains(id));
    assert_eq!(claim_ids(&store, "a.example").await, want_a);
    assert_eq!(claim_ids(&store, "b.example").await, vec![db.id]);
    for lease in &leases {
        let r = AttemptRecord {
            lease: *lease,
            attempt: attempt(1, Some(200)),
            next: NextState::Delivered,
            last_error: None,
        };
        assert_eq!(
            store.record_attempt(r).await.unwrap(),
            RecordOutcome::Recorded
        );
        let d = store.get_delivery(&lease.delivery_id).await.unwrap();
        assert_eq!(d.delivery.state, DeliveryState::Delivered);
        assert_eq!(d.attempts.len(), 1);
    }

    // A duplicate (its key taken) writes nothing, so claims nothing.
    let again = delivery_to(&a);
    let (results, leases) = accept_claiming(
        &store,
        vec![(new_event("order.created", Some("k1")), vec![again.clone()])],
        &[again.id],
        LONG,
    )
    .await;
    assert!(
        matches!(&results[..], [Ok(acc)] if acc.duplicate),
        "{results:?}"
    );
    assert!(leases.is_empty(), "{leases:?}");
    assert!(store.get_delivery(&again.id).await.is_err());

    // A batch matched at a generation that moved writes and claims nothing.
    let stale = store.subscription_generation().await.unwrap();
    store
        .create_subscription(new_sub("c.example", None))
        .await
        .unwrap();
    let late = delivery_to(&a);
    let (outcome, leases) = store
        .accept_events_claiming(
            Some(stale),
            vec![(new_event("order.created", None), vec![late.clone()])],
            &ingest_claim(&[late.id], LONG),
        )
        .await
        .unwrap();
    assert!(matches!(outcome, BatchOutcome::GenerationMoved(ref b) if b.len() == 1));
    assert!(leases.is_empty());
    assert!(store.get_delivery(&late.id).await.is_err());
}

/// A delivery claimed at ingest whose lease runs out goes back to `pending`
/// and is claimed again with a new token; the late result under the ingest
/// lease then moves nothing.
pub async fn deliveries_claimed_at_ingest_expire_and_fence_as_claims_do(store: Arc<dyn Store>) {
    let a = store
        .create_subscription(new_sub("a.example", None))
        .await
        .unwrap();
    let d = delivery_to(&a);
    let (_, leases) = accept_claiming(
        &store,
        vec![(new_event("order.created", None), vec![d.clone()])],
        &[d.id],
        Duration::ZERO,
    )
    .await;
    let Some(zombie) = leases.first().copied() else {
        // This backend claims nothing at ingest: an ordinary pending row.
        assert_eq!(claim_ids(&store, "a.example").await, vec![d.id]);
        return;
    };
    eventually("the ingest lease to expire and be reclaimed", || {
        let store = store.clone();
        async move { store.reclaim_expired().await.unwrap() == 1 }
    })
    .await;
    let fresh = store
        .claim_due(&claim_req("a.example", 1, LONG))
        .await
        .unwrap()
        .remove(0);
    assert_eq!(fresh.delivery.id, d.id);
    assert_ne!(
        fresh.lease.token, zombie.token,
        "a new claim gets a new token"
    );
    let late = AttemptRecord {
        lease: zombie,
        attempt: attempt(1, Some(200)),
        next: NextState::Delivered,
        last_error: None,
    };
    assert_eq!(
        store.record_attempt(late).await.unwrap(),
        RecordOutcome::LeaseLost
    );
    assert_eq!(
        store.get_delivery(&d.id).await.unwrap().delivery.state,
        DeliveryState::Inflight
    );
    assert!(store.renew_lease(&fresh.lease, LONG).await.unwrap());
}

/// The plain backends (not the sharded one, which keeps the default) claim
/// every named delivery of a batch of fresh events written as rows.
pub async fn ingest_claims_every_named_delivery(store: Arc<dyn Store>) {
    let a = store
        .create_subscription(new_sub("a.example", None))
        .await
        .unwrap();
    let ds: Vec<NewDelivery> = (0..3).map(|_| delivery_to(&a)).collect();
    let named: Vec<DeliveryId> = ds.iter().take(2).map(|d| d.id).collect();
    let batch = ds
        .iter()
        .map(|d| (new_event("order.created", None), vec![d.clone()]))
        .collect();
    let (_, leases) = accept_claiming(&store, batch, &named, LONG).await;
    let mut got: Vec<DeliveryId> = leases.iter().map(|l| l.delivery_id).collect();
    got.sort();
    let mut want = named.clone();
    want.sort();
    assert_eq!(got, want);
    assert_eq!(claim_ids(&store, "a.example").await, vec![ds[2].id]);
}

/// [`Store::accept_events_at`], each event fanned out to `subs`: a batch
/// matched at the current generation is written as `accept_events` writes
/// it; once a subscription write moved the generation, a batch matched at
/// the old one is refused whole, handed back as it went in, and nothing of
/// it is written; matched at the new one, it is written.
async fn accept_events_at_checks_the_generation(store: &Arc<dyn Store>, subs: &[Subscription]) {
    let to_all = || subs.iter().map(delivery_to).collect::<Vec<_>>();
    let matched_at = store.subscription_generation().await.unwrap();
    let first: Vec<Ingest> = vec![
        (new_event("x.y", Some("first")), to_all()),
        (new_event("x.y", None), to_all()),
    ];
    let BatchOutcome::Accepted(results) = store
        .accept_events_at(matched_at, first.clone())
        .await
        .unwrap()
    else {
        panic!("refused at the current generation");
    };
    let fresh = |e: &NewEvent| Accepted {
        event_id: e.id,
        duplicate: false,
    };
    let results: Vec<Accepted> = results.into_iter().map(Result::unwrap).collect();
    assert_eq!(results, vec![fresh(&first[0].0), fresh(&first[1].0)]);
    for (event, _) in &first {
        assert!(event_exists(store, &event.id).await);
    }

    store
        .create_subscription(new_sub("moved.example", None))
        .await
        .unwrap();
    let late: Vec<Ingest> = vec![
        (new_event("x.y", Some("late")), to_all()),
        (new_event("x.y", Some("first")), to_all()),
    ];
    let ids = |batch: &[Ingest]| -> Vec<(EventId, Vec<DeliveryId>)> {
        batch
            .iter()
            .map(|(e, ds)| (e.id, ds.iter().map(|d| d.id).collect()))
            .collect()
    };
    match store
        .accept_events_at(matched_at, late.clone())
        .await
        .unwrap()
    {
        BatchOutcome::GenerationMoved(back) => assert_eq!(ids(&back), ids(&late)),
        BatchOutcome::Accepted(r) => panic!("written at a generation that moved: {r:?}"),
    }
    assert!(!event_exists(store, &late[0].0.id).await);
    for d in &late[0].1 {
        assert!(!delivery_exists(store, &d.id).await);
    }

    let now = store.subscription_generation().await.unwrap();
    assert_ne!(now, matched_at);
    let BatchOutcome::Accepted(results) = store.accept_events_at(now, late.clone()).await.unwrap()
    else {
        panic!("refused at the current generation");
    };
    let results: Vec<Accepted> = results.into_iter().map(Result::unwrap).collect();
    assert_eq!(
        results,
        vec![
            fresh(&late[0].0),
            Accepted {
                event_id: first[0].0.id,
                duplicate: true
            }
        ]
    );
    assert!(event_exists(store, &late[0].0.id).await);
}

pub async fn concurrent_batches_with_one_key_create_exactly_one_event(store: Arc<dyn Store>) {
    let a = store
        .create_subscription(new_sub("a.example", None))
        .await
        .unwrap();
    // Every caller names "race"; the batches also share two more keys, in
    // opposite orders, and single ingests join in.
    let tasks: Vec<_> = (0..16)
        .map(|i| {
            let store = store.clone();
            let a = a.clone();
            tokio::spawn(async move {
                if i % 4 == 3 {
                    let acc = store
                        .accept_event(new_event("x.y", Some("race")), vec![delivery_to(&a)])
                        .await
                        .unwrap();
                    return vec![("race", acc)];
                }
                let mut keys = vec!["race", "shared-1", "shared-2"];
                if i % 2 == 1 {
                    keys.reverse();
                }
                let batch: Vec<Ingest> = keys
                    .iter()
                    .map(|k| (new_event("x.y", Some(k)), vec![delivery_to(&a)]))
                    .collect();
                let results = store.accept_events(batch).await.unwrap();
                keys.into_iter()
                    .zip(results.into_iter().map(Result::unwrap))
                    .collect()
            })
        })
        .collect();
    let results: Vec<(&str, Accepted)> = futures::future::join_all(tasks)
        .await
        .into_iter()
        .flat_map(|r| r.unwrap())
        .collect();
    for key in ["race", "shared-1", "shared-2"] {
        let of_key: Vec<&Accepted> = results
            .iter()
            .filter(|(k, _)| *k == key)
            .map(|(_, a)| a)
            .collect();
        let ids: HashSet<_> = of_key.iter().map(|a| a.event_id).collect();
        assert_eq!(ids.len(), 1, "every caller gets one event id for {key}");
        assert_eq!(
            of_key.iter().filter(|a| !a.duplicate).count(),
            1,
            "exactly one caller created {key}"
        );
    }
    assert_eq!(
        deliveries_of(&store, &a.id).await,
        3,
        "one delivery per key"
    );
}

// --- dispatch ------------------------------------------------------------------

pub async fn claims_take_due_deliveries_of_one_destination_oldest_first(store: Arc<dyn Store>) {
    let a = store
        .create_subscription(new_sub("a.example", None))
        .await
        .unwrap();
    let b = store
        .create_subscription(new_sub("b.example", None))
        .await
        .unwrap();
    let mut a_ids = Vec::new();
    for _ in 0..5 {
        let (_, ids) = ingest(&store, &[&a, &b]).await;
        a_ids.push(ids[0]);
    }
    let first = store
        .claim_due(&claim_req("a.example", 3, LONG))
        .await
        .unwrap();
    assert_eq!(first.len(), 3);
    assert!(
        first
            .iter()
            .all(|c| c.delivery.destination_host == "a.example")
    );
    assert_eq!(
        first.iter().map(|c| c.delivery.id).collect::<Vec<_>>(),
        a_ids[..3],
        "oldest first"
    );
    let c = &first[0];
    assert_eq!(c.delivery.state, DeliveryState::Inflight);
    assert_eq!(c.lease.delivery_id, c.delivery.id);
    assert_eq!(c.event.id, c.delivery.event_id);
    assert_eq!(c.event.payload, r#"{"n":1}"#);
    assert_eq!(c.subscription.id, a.id);
    assert_eq!(c.subscription.keys, a.keys);
    let rest = store
        .claim_due(&claim_req("a.example", 10, LONG))
        .await
        .unwrap();
    assert_eq!(rest.len(), 2);
    assert!(
        store
            .claim_due(&claim_req("a.example", 10, LONG))
            .await
            .unwrap()
            .is_empty()
    );
    assert_eq!(
        store
            .claim_due(&claim_req("b.example", 10, LONG))
            .await
            .unwrap()
            .len(),
        5
    );
}

/// Many hosts in one call, as a dispatcher pass asks: each request gets its
/// own host's deliveries in its order, up to its limit, whatever else the
/// call claims beside it (a backend may claim for them all in one
/// statement), and a host asked twice gets for the second what the first
/// left.
pub async fn claim_many_claims_for_many_hosts_at_once(store: Arc<dyn Store>) {
    let mut subs = Vec::new();
    for i in 0..4 {
        subs.push(
            store
                .create_subscription(new_sub(&format!("many-{i}.example"), None))
                .await
                .unwrap(),
        );
    }
    let refs: Vec<&Subscription> = subs.iter().collect();
    // ids[k][i]: the k-th event's delivery to subscription i (oldest first).
    let mut ids = Vec::new();
    for _ in 0..3 {
        ids.push(ingest(&store, &refs).await.1);
    }
    let of =
        |i: usize, ks: &[usize]| -> Vec<DeliveryId> { ks.iter().map(|&k| ids[k][i]).collect() };
    let got = store
        .claim_many(&[
            sub_claim_req(&subs[0], ClaimOrder::OldestFirst, 2),
            sub_claim_req(&subs[1], ClaimOrder::OldestFirst, 1),
            sub_claim_req(&subs[2], ClaimOrder::NewestFirst, 2),
            sub_claim_req(&subs[3], ClaimOrder::NewestFirst, 1),
            claim_req(subs[1].url.host(), 5, LONG),
            sub_claim_req(&subs[0], ClaimOrder::OldestFirst, 5),
        ])
        .await
        .unwrap();
    let got: Vec<Vec<DeliveryId>> = got
        .iter()
        .map(|list| list.iter().map(|c| c.delivery.id).collect())
        .collect();
    assert_eq!(got[0], of(0, &[0, 1]), "oldest two of host 0");
    assert_eq!(got[1], of(1, &[0]), "oldest of host 1");
    assert_eq!(got[2], of(2, &[2, 1]), "newest two of host 2");
    assert_eq!(got[3], of(3, &[2]), "newest of host 3");
    assert_eq!(got[4], of(1, &[1, 2]), "host 1 again: what the first left");
    assert_eq!(got[5], of(0, &[2]), "host 0 again: what the first left");
    // Everything but host 2's oldest and host 3's two oldest is claimed.
    let left = store
        .claim_many(&[
            claim_req(subs[2].url.host(), 10, LONG),
            claim_req(subs[3].url.host(), 10, LONG),
            claim_req(subs[0].url.host(), 10, LONG),
        ])
        .await
        .unwrap();
    let left: Vec<Vec<DeliveryId>> = left
        .iter()
        .map(|list| list.iter().map(|c| c.delivery.id).collect())
        .collect();
    assert_eq!(left, vec![of(2, &[0]), of(3, &[0, 1]), vec![]]);
}

pub async fn claim_many_claims_for_every_request_in_order_and_nothing_twice(store: Arc<dyn Store>) {
    let a = store
        .create_subscription(new_sub("a.example", None))
        .await
        .unwrap();
    let b = store
        .create_subscription(new_sub("b.example", None))
        .await
        .unwrap();
    let mut a_ids = Vec::new();
    let mut b_ids = Vec::new();
    for _ in 0..5 {
        let (_, ids) = ingest(&store, &[&a, &b]).await;
        a_ids.push(ids[0]);
        b_ids.push(ids[1]);
    }
    assert!(store.claim_many(&[]).await.unwrap().is_empty());
    // Three requests: b newest first, a oldest first, and a again, which
    // must get only what the first request for a left.
    let got = store
        .claim_many(&[
            sub_claim_req(&b, ClaimOrder::NewestFirst, 2),
            sub_claim_req(&a, ClaimOrder::OldestFirst, 3),
            sub_claim_req(&a, ClaimOrder::OldestFirst, 10),
        ])
        .await
        .unwrap();
    let ids = |cs: &Vec<ClaimedDelivery>| cs.iter().map(|c| c.delivery.id).collect::<Vec<_>>();
    assert_eq!(got.len(), 3, "one answer per request");
    assert_eq!(ids(&got[0]), vec![b_ids[4], b_ids[3]], "newest first");
    assert_eq!(ids(&got[1]), a_ids[..3], "oldest first");
    assert_eq!(ids(&got[2]), a_ids[3..], "the rest, none twice");
    for c in got.iter().flatten() {
        assert_eq!(c.delivery.state, DeliveryState::Inflight);
        assert_eq!(c.lease.delivery_id, c.delivery.id);
        assert_eq!(c.event.id, c.delivery.event_id);
        assert_eq!(c.subscription.id, c.delivery.sub_id);
        // Each row its own subscription whole, however many rows of each
        // the claim decoded.
        let own = if c.delivery.sub_id == a.id { &a } else { &b };
        assert_eq!(c.subscription.keys, own.keys);
        assert_eq!(c.subscription.url, own.url);
    }
    // What was claimed is leased: nothing of a is left, three of b are.
    assert!(
        store
            .claim_due(&claim_req("a.example", 10, LONG))
            .await
            .unwrap()
            .is_empty()
    );
    let rest = store
        .claim_many(&[claim_req("b.example", 10, LONG)])
        .await
        .unwrap();
    assert_eq!(ids(&rest[0]), b_ids[..3]);
}

pub async fn claimed_deliveries_are_not_claimed_again_while_leased(store: Arc<dyn Store>) {
    let a = store
        .create_subscription(new_sub("a.example", None))
        .await
        .unwrap();
    ingest(&store, &[&a]).await;
    assert_eq!(
        store
            .claim_due(&claim_req("a.example", 10, LONG))
            .await
            .unwrap()
            .len(),
        1
    );
    assert_eq!(
        store.reclaim_expired().await.unwrap(),
        0,
        "a live lease is not reclaimed"
    );
    assert!(
        store
            .claim_due(&claim_req("a.example", 10, LONG))
            .await
            .unwrap()
            .is_empty()
    );
}

pub async fn concurrent_claimers_never_share_a_delivery(store: Arc<dyn Store>) {
    let a = store
        .create_subscription(new_sub("a.example", None))
        .await
        .unwrap();
    let total = 300;
    for _ in 0..total {
        ingest(&store, &[&a]).await;
    }
    let claimers: Vec<_> = (0..4)
        .map(|w| {
            let store = store.clone();
            tokio::spawn(async move {
                let mut mine = Vec::new();
                loop {
                    let req = ClaimRequest {
                        worker_id: format!("w{w}"),
                        destination: "a.example".into(),
                        subscription: None,
                        order: ClaimOrder::OldestFirst,
                        limit: 7,
                        lease: LONG,
                    };
                    let got = store.claim_due(&req).await.unwrap();
                    if got.is_empty() {
                        break mine;
                    }
                    mine.extend(got.into_iter().map(|c| c.delivery.id));
                }
            })
        })
        .collect();
    let mut seen = HashSet::new();
    let mut count = 0;
    for c in futures::future::join_all(claimers).await {
        for id in c.unwrap() {
            count += 1;
            assert!(seen.insert(id), "{id} was claimed twice");
        }
    }
    assert_eq!(count, total);
}

pub async fn expired_lease_is_claimable_again(store: Arc<dyn Store>) {
    let a = store
        .create_subscription(new_sub("a.example", None))
        .await
        .unwrap();
    let (_, ids) = ingest(&store, &[&a]).await;
    let first = store
        .claim_due(&claim_req("a.example", 1, Duration::ZERO))
        .await
        .unwrap();
    assert_eq!(first.len(), 1);
    eventually("the zero lease to expire and be reclaimed", || {
        let store = store.clone();
        async move { store.reclaim_expired().await.unwrap() == 1 }
    })
    .await;
    let d = store.get_delivery(&ids[0]).await.unwrap();
    assert_eq!(d.delivery.state, DeliveryState::Pending);
    let second = store
        .claim_due(&claim_req("a.example", 1, LONG))
        .await
        .unwrap();
    assert_eq!(second.len(), 1);
    assert_ne!(
        second[0].lease.token, first[0].lease.token,
        "a new claim gets a new token"
    );
}

pub async fn a_late_result_after_a_lost_lease_does_not_overwrite_the_new_claim(
    store: Arc<dyn Store>,
) {
    let a = store
        .create_subscription(new_sub("a.example", None))
        .await
        .unwrap();
    let (_, ids) = ingest(&store, &[&a]).await;
    let zombie = store
        .claim_due(&claim_req("a.example", 1, Duration::ZERO))
        .await
        .unwrap()
        .remove(0);
    eventually("reclaim", || {
        let store = store.clone();
        async move { store.reclaim_expired().await.unwrap() == 1 }
    })
    .await;
    let fresh = store
        .claim_due(&claim_req("a.example", 1, LONG))
        .await
        .unwrap()
        .remove(0);

    let late = AttemptRecord {
        lease: zombie.lease,
        attempt: attempt(1, Some(200)),
        next: NextState::Delivered,
        last_error: None,
    };
    assert_eq!(
        store.record_attempt(late).await.unwrap(),
        RecordOutcome::LeaseLost
    );
    assert!(!store.renew_lease(&zombie.lease, LONG).await.unwrap());
    assert_eq!(store.release(&[zombie.lease]).await.unwrap(), 0);
    let d = store.get_delivery(&ids[0]).await.unwrap();
    assert_eq!(
        d.delivery.state,
        DeliveryState::Inflight,
        "the new claim still holds it"
    );
    assert_eq!(
        d.attempts.len(),
        1,
        "the zombie's attempt happened and is recorded"
    );

    let done = AttemptRecord {
        lease: fresh.lease,
        attempt: attempt(2, Some(200)),
        next: NextState::Delivered,
        last_error: None,
    };
    assert_eq!(
        store.record_attempt(done).await.unwrap(),
        RecordOutcome::Recorded
    );
    assert_eq!(
        store.get_delivery(&ids[0]).await.unwrap().delivery.state,
        DeliveryState::Delivered
    );
}

pub async fn record_attempt_moves_the_delivery_and_keeps_attempt_history(store: Arc<dyn Store>) {
    let a = store
        .create_subscription(new_sub("a.example", None))
        .await
        .unwrap();
    // Four deliveries, one per terminal path.
    let mut dl = Vec::new();
    for _ in 0..4 {
        dl.push(ingest(&store, &[&a]).await.1[0]);
    }
    let claimed = store
        .claim_due(&claim_req("a.example", 10, LONG))
        .await
        .unwrap();
    let lease = |id: DeliveryId| claimed.iter().find(|c| c.delivery.id == id).unwrap().lease;

    // 1: a 500, retried at once, then a 200.
    let r = AttemptRecord {
        lease: lease(dl[0]),
        attempt: attempt(1, Some(500)),
        next: NextState::Retry {
            delay: Duration::ZERO,
        },
        last_error: Some("HTTP 500".into()),
    };
    assert_eq!(
        store.record_attempt(r).await.unwrap(),
        RecordOutcome::Recorded
    );
    let d = store.get_delivery(&dl[0]).await.unwrap();
    assert_eq!(d.delivery.state, DeliveryState::Pending);
    assert_eq!(d.delivery.attempt, 1);
    assert_eq!(d.delivery.last_status, Some(500));
    assert_eq!(d.delivery.last_error.as_deref(), Some("HTTP 500"));
    let again = store
        .claim_due(&claim_req("a.example", 10, LONG))
        .await
        .unwrap();
    let again: Vec<_> = again
        .into_iter()
        .filter(|c| c.delivery.id == dl[0])
        .collect();
    assert_eq!(again.len(), 1, "a zero-delay retry is due at once");
    assert_eq!(again[0].delivery.attempt, 1);
    let ok = AttemptRecord {
        lease: again[0].lease,
        attempt: attempt(2, Some(200)),
        next: NextState::Delivered,
        last_error: None,
    };
    store.record_attempt(ok).await.unwrap();
    let d = store.get_delivery(&dl[0]).await.unwrap();
    assert_eq!(d.delivery.state, DeliveryState::Delivered);
    assert_eq!(d.delivery.attempt, 2);
    assert_eq!(d.delivery.last_status, Some(200));
    assert_eq!(d.delivery.last_error, None);
    assert_eq!(
        d.attempts
            .iter()
            .map(|a| (a.number, a.status))
            .collect::<Vec<_>>(),
        [(1, Some(500)), (2, Some(200))]
    );
    assert_eq!(
        d.attempts[0].response_snippet.as_deref(),
        Some("status 500")
    );
    assert_eq!(d.attempts[0].duration, Duration::from_millis(12));

    // 2: a permanent failure.
    let f = AttemptRecord {
        lease: lease(dl[1]),
        attempt: attempt(1, Some(400)),
        next: NextState::Failed,
        last_error: Some("HTTP 400".into()),
    };
    store.record_attempt(f).await.unwrap();
    assert_eq!(
        store.get_delivery(&dl[1]).await.unwrap().delivery.state,
        DeliveryState::Failed
    );

    // 3: a timeout that exhausts retries.
    let x = AttemptRecord {
        lease: lease(dl[2]),
        attempt: attempt(1, None),
        next: NextState::Dead,
        last_error: Some("timeout".into()),
    };
    store.record_attempt(x).await.unwrap();
    let d = store.get_delivery(&dl[2]).await.unwrap();
    assert_eq!(d.delivery.state, DeliveryState::Dead);
    assert_eq!(d.delivery.last_status, None);
    assert_eq!(d.attempts[0].error_class, Some(ErrorClass::Timeout));

    // Terminal deliveries are never claimed.
    assert!(
        store
            .claim_due(&claim_req("a.example", 10, LONG))
            .await
            .unwrap()
            .is_empty()
    );
    // The fourth is still in flight under its lease.
    assert_eq!(
        store.get_delivery(&dl[3]).await.unwrap().delivery.state,
        DeliveryState::Inflight
    );
}

pub async fn a_retry_is_not_due_before_its_delay(store: Arc<dyn Store>) {
    let a = store
        .create_subscription(new_sub("a.example", None))
        .await
        .unwrap();
    let (_, ids) = ingest(&store, &[&a]).await;
    let c = store
        .claim_due(&claim_req("a.example", 1, LONG))
        .await
        .unwrap()
        .remove(0);
    let r = AttemptRecord {
        lease: c.lease,
        attempt: attempt(1, Some(503)),
        next: NextState::Retry {
            delay: Duration::from_secs(3600),
        },
        last_error: Some("HTTP 503".into()),
    };
    store.record_attempt(r).await.unwrap();
    assert!(
        store
            .claim_due(&claim_req("a.example", 1, LONG))
            .await
            .unwrap()
            .is_empty()
    );
    assert!(store.due_destinations(10).await.unwrap().is_empty());
    let d = store.get_delivery(&ids[0]).await.unwrap().delivery;
    let wait = d.next_attempt_at - chrono::Utc::now();
    assert!(
        wait > chrono::Duration::minutes(59) && wait <= chrono::Duration::minutes(61),
        "{wait}"
    );
}

pub async fn release_returns_claims_without_an_attempt(store: Arc<dyn Store>) {
    let a = store
        .create_subscription(new_sub("a.example", None))
        .await
        .unwrap();
    ingest(&store, &[&a]).await;
    ingest(&store, &[&a]).await;
    let c = store
        .claim_due(&claim_req("a.example", 10, LONG))
        .await
        .unwrap();
    let leases: Vec<Lease> = c.iter().map(|c| c.lease).collect();
    assert_eq!(store.release(&leases).await.unwrap(), 2);
    let again = store
        .claim_due(&claim_req("a.example", 10, LONG))
        .await
        .unwrap();
    assert_eq!(again.len(), 2);
    assert!(again.iter().all(|c| c.delivery.attempt == 0));
    let d = store.get_delivery(&again[0].delivery.id).await.unwrap();
    assert!(d.attempts.is_empty());
}

pub async fn renew_extends_only_a_live_lease(store: Arc<dyn Store>) {
    let a = store
        .create_subscription(new_sub("a.example", None))
        .await
        .unwrap();
    ingest(&store, &[&a]).await;
    let c = store
        .claim_due(&claim_req("a.example", 1, Duration::from_millis(1)))
        .await
        .unwrap()
        .remove(0);
    assert!(store.renew_lease(&c.lease, LONG).await.unwrap());
    // Renewed: no longer expiring, so nothing to reclaim even after the original lease.
    tokio::time::sleep(Duration::from_millis(20)).await; // let the original 1 ms lease pass; not a wait for work
    assert_eq!(store.reclaim_expired().await.unwrap(), 0);
    let bogus = Lease {
        delivery_id: c.lease.delivery_id,
        token: c.lease.token + 1000,
        ..c.lease
    };
    assert!(!store.renew_lease(&bogus, LONG).await.unwrap());
}

pub async fn disabled_subscriptions_keep_their_deliveries_unclaimed(store: Arc<dyn Store>) {
    let a = store
        .create_subscription(new_sub("a.example", None))
        .await
        .unwrap();
    store
        .update_subscription(
            &a.id,
            SubscriptionPatch {
                state: Some(SubscriptionState::Disabled),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    let (_, ids) = ingest(&store, &[&a]).await;
    assert!(store.due_destinations(10).await.unwrap().is_empty());
    assert!(
        store
            .claim_due(&claim_req("a.example", 10, LONG))
            .await
            .unwrap()
            .is_empty()
    );
    assert_eq!(
        store.get_delivery(&ids[0]).await.unwrap().delivery.state,
        DeliveryState::Pending,
        "kept"
    );
    store
        .update_subscription(
            &a.id,
            SubscriptionPatch {
                state: Some(SubscriptionState::Active),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    assert_eq!(due_hosts(&store, 10).await, ["a.example"]);
    assert_eq!(
        store
            .claim_due(&claim_req("a.example", 10, LONG))
            .await
            .unwrap()
            .len(),
        1
    );
}

pub async fn due_destinations_lists_hosts_with_due_work(store: Arc<dyn Store>) {
    assert!(store.due_destinations(10).await.unwrap().is_empty());
    let a = store
        .create_subscription(new_sub("a.example", None))
        .await
        .unwrap();
    let b = store
        .create_subscription(new_sub("b.example", None))
        .await
        .unwrap();
    let c = store
        .create_subscription(new_sub("c.example", None))
        .await
        .unwrap();
    ingest(&store, &[&a]).await;
    ingest(&store, &[&b, &a]).await;
    let _ = c;
    let mut hosts = due_hosts(&store, 10).await;
    assert_eq!(hosts[0], "a.example", "most overdue first");
    hosts.sort();
    assert_eq!(hosts, ["a.example", "b.example"]);
    assert_eq!(store.due_destinations(1).await.unwrap().len(), 1);
    store
        .claim_due(&claim_req("a.example", 10, LONG))
        .await
        .unwrap();
    assert_eq!(due_hosts(&store, 10).await, ["b.example"]);
}

/// Waits until the store's clock has passed `t`, so that the next due time
/// it writes is later than `t`. Probes with events that fan out to nobody:
/// they change nothing a claim or `due_destinations` sees.
async fn until_store_clock_passes(store: &Arc<dyn Store>, t: Timestamp) {
    eventually("the store clock to pass a due time", || {
        let store = store.clone();
        async move {
            let probe = store
                .accept_event(new_event("clock.probe", None), vec![])
                .await
                .unwrap();
            store.get_event(&probe.event_id).await.unwrap().created_at > t
        }
    })
    .await;
}

/// `subs` sorted by id, to compare listings whose ties may fall either way.
fn by_sub_id(mut subs: Vec<DueSubscription>) -> Vec<DueSubscription> {
    subs.sort_by_key(|s| s.sub_id);
    subs
}

/// A subscription listed with `oldest`/`newest` due times.
async fn due_sub(
    store: &Arc<dyn Store>,
    sub: &Subscription,
    oldest: &DeliveryId,
    newest: &DeliveryId,
) -> DueSubscription {
    DueSubscription {
        sub_id: sub.id,
        oldest_due_at: due_at(store, oldest).await,
        newest_due_at: due_at(store, newest).await,
        rate_limit: sub.rate_limit,
        max_concurrency: sub.max_concurrency,
    }
}

pub async fn due_destinations_lists_each_hosts_claimable_subscriptions_with_their_due_times(
    store: Arc<dyn Store>,
) {
    let create = |host: &'static str| {
        let store = store.clone();
        async move {
            store
                .create_subscription(new_sub(host, None))
                .await
                .unwrap()
        }
    };
    let (a1, a2, later, disabled) = (
        create("a.example").await,
        create("a.example").await,
        create("a.example").await,
        create("a.example").await,
    );
    let blocked = ordered_sub(&store, "a.example").await;
    let b1 = create("b.example").await;
    let an_hour = NextState::Retry {
        delay: Duration::from_secs(3600),
    };

    // Not yet due: its only delivery waits an hour to be retried.
    ingest(&store, &[&later]).await;
    let c = store
        .claim_due(&sub_claim_req(&later, ClaimOrder::OldestFirst, 10))
        .await
        .unwrap()
        .remove(0);
    finish(&store, &c, 503, an_hour.clone()).await;
    // Blocked: the ordered head waits an hour, and the delivery behind it,
    // though due, is not claimable.
    ingest(&store, &[&blocked]).await;
    let c = store
        .claim_due(&sub_claim_req(&blocked, ClaimOrder::OldestFirst, 10))
        .await
        .unwrap()
        .remove(0);
    finish(&store, &c, 503, an_hour).await;
    ingest(&store, &[&blocked]).await;
    // Disabled: due work, but nothing may claim it.
    ingest(&store, &[&disabled]).await;
    store
        .update_subscription(
            &disabled.id,
            SubscriptionPatch {
                state: Some(SubscriptionState::Disabled),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    assert!(
        store.due_destinations(10).await.unwrap().is_empty(),
        "nothing claimable yet"
    );

    // Claimable: a1 has three deliveries, the newest of them in flight; a2
    // and b1 have one each.
    let a1_first = ingest(&store, &[&a1]).await.1[0];
    let b1_only = ingest(&store, &[&b1]).await.1[0];
    let a2_only = ingest(&store, &[&a2]).await.1[0];
    let a1_second = ingest(&store, &[&a1]).await.1[0];
    let a1_third = ingest(&store, &[&a1]).await.1[0];
    assert_eq!(
        claim_sub_ids(&store, &a1, ClaimOrder::NewestFirst, 1).await,
        [a1_third]
    );

    let listed = store.due_destinations(10).await.unwrap();
    assert_eq!(
        listed.iter().map(|d| d.host.as_str()).collect::<Vec<_>>(),
        ["a.example", "b.example"],
        "most overdue first"
    );
    for d in &listed {
        assert!(
            d.subscriptions
                .windows(2)
                .all(|w| w[0].oldest_due_at <= w[1].oldest_due_at),
            "{}: subscriptions most overdue first: {:?}",
            d.host,
            d.subscriptions
        );
    }
    assert_eq!(
        by_sub_id(listed[0].subscriptions.clone()),
        by_sub_id(vec![
            // The one in flight is not claimable: newest is the second.
            due_sub(&store, &a1, &a1_first, &a1_second).await,
            due_sub(&store, &a2, &a2_only, &a2_only).await,
        ]),
        "only a1 and a2 have claimable work at a.example"
    );
    assert_eq!(
        listed[1].subscriptions,
        [due_sub(&store, &b1, &b1_only, &b1_only).await]
    );
    assert!(
        listed[0].subscriptions[0].oldest_due_at <= listed[1].subscriptions[0].oldest_due_at,
        "hosts most overdue first"
    );

    // Claim a1's work: the host stays listed, for a2 alone.
    claim_sub_ids(&store, &a1, ClaimOrder::OldestFirst, 10).await;
    let listed = store.due_destinations(10).await.unwrap();
    let a = listed.iter().find(|d| d.host == "a.example").unwrap();
    assert_eq!(
        a.subscriptions,
        [due_sub(&store, &a2, &a2_only, &a2_only).await]
    );
}

pub async fn due_destinations_limit_counts_hosts_not_subscriptions(store: Arc<dyn Store>) {
    let mut crowded = Vec::new();
    for _ in 0..3 {
        crowded.push(
            store
                .create_subscription(new_sub("crowded.example", None))
                .await
                .unwrap(),
        );
    }
    let b = store
        .create_subscription(new_sub("b.example", None))
        .await
        .unwrap();
    let c = store
        .create_subscription(new_sub("c.example", None))
        .await
        .unwrap();
    // The crowded host is the most overdue: one event to all three of its
    // subscriptions, twice, then one each for the others.
    ingest(&store, &crowded.iter().collect::<Vec<_>>()).await;
    ingest(&store, &crowded.iter().collect::<Vec<_>>()).await;
    ingest(&store, &[&b]).await;
    ingest(&store, &[&c]).await;

    let all = store.due_destinations(10).await.unwrap();
    assert_eq!(
        all.iter().map(|d| d.host.as_str()).collect::<Vec<_>>(),
        ["crowded.example", "b.example", "c.example"]
    );
    assert_eq!(all[0].subscriptions.len(), 3);
    for limit in 1..=3 {
        assert_eq!(
            store.due_destinations(limit).await.unwrap(),
            all[..limit as usize],
            "limit {limit}: that many hosts, each with all its subscriptions"
        );
    }
    assert_eq!(store.due_destinations(4).await.unwrap(), all);
}

pub async fn due_destinations_reports_each_subscriptions_rate_limit(store: Arc<dyn Store>) {
    let create = |host: &'static str, rate_limit: Option<u32>| {
        let store = store.clone();
        async move {
            let mut n = new_sub(host, None);
            n.rate_limit = rate_limit;
            store.create_subscription(n).await.unwrap()
        }
    };
    let strict = create("shared.example", Some(5)).await;
    let loose = create("shared.example", Some(50)).await;
    let adaptive = create("shared.example", None).await;
    let elsewhere = create("other.example", Some(700)).await;
    ingest(&store, &[&strict, &loose, &adaptive, &elsewhere]).await;

    let limits = |listed: Vec<DueDestination>| {
        listed
            .into_iter()
            .flat_map(|d| {
                let host = d.host;
                d.subscriptions
                    .into_iter()
                    .map(move |s| (host.clone(), s.sub_id, s.rate_limit))
            })
            .collect::<HashSet<_>>()
    };
    let shared = |id: SubscriptionId, limit| ("shared.example".to_owned(), id, limit);
    assert_eq!(
        limits(store.due_destinations(10).await.unwrap()),
        HashSet::from([
            shared(strict.id, Some(5)),
            shared(loose.id, Some(50)),
            shared(adaptive.id, None),
            ("other.example".to_owned(), elsewhere.id, Some(700)),
        ]),
        "each subscription with its own limit, none merged into the host's"
    );

    // The listing reports each limit as it is now.
    for (sub, limit) in [(&strict, None), (&adaptive, Some(2))] {
        store
            .update_subscription(
                &sub.id,
                SubscriptionPatch {
                    rate_limit: Some(limit),
                    ..Default::default()
                },
            )
            .await
            .unwrap();
    }
    let now = limits(store.due_destinations(10).await.unwrap());
    assert!(now.contains(&shared(strict.id, None)), "{now:?}");
    assert!(now.contains(&shared(loose.id, Some(50))), "{now:?}");
    assert!(now.contains(&shared(adaptive.id, Some(2))), "{now:?}");
}

pub async fn due_destinations_reports_each_subscriptions_max_concurrency(store: Arc<dyn Store>) {
    let create = |host: &'static str, max_concurrency: Option<u32>, rate_limit: Option<u32>| {
        let store = store.clone();
        async move {
            let mut n = new_sub(host, None);
            n.max_concurrency = max_concurrency;
            n.rate_limit = rate_limit;
            store.create_subscription(n).await.unwrap()
        }
    };
    let strict = create("shared.example", Some(2), Some(100)).await;
    let loose = create("shared.example", Some(50), None).await;
    let default = create("shared.example", None, Some(9)).await;
    let elsewhere = create("other.example", Some(700), None).await;
    ingest(&store, &[&strict, &loose, &default, &elsewhere]).await;

    let caps = |listed: Vec<DueDestination>| {
        listed
            .into_iter()
            .flat_map(|d| {
                let host = d.host;
                d.subscriptions
                    .into_iter()
                    .map(move |s| (host.clone(), s.sub_id, s.max_concurrency, s.rate_limit))
            })
            .collect::<HashSet<_>>()
    };
    let shared = |id: SubscriptionId, cap, rate| ("shared.example".to_owned(), id, cap, rate);
    assert_eq!(
        caps(store.due_destinations(10).await.unwrap()),
        HashSet::from([
            shared(strict.id, Some(2), Some(100)),
            shared(loose.id, Some(50), None),
            shared(default.id, None, Some(9)),
            ("other.example".to_owned(), elsewhere.id, Some(700), None),
        ]),
        "each subscription with its own cap, none merged into the host's"
    );

    // The listing reports each cap as it is now.
    for (sub, cap) in [(&strict, None), (&default, Some(3))] {
        store
            .update_subscription(
                &sub.id,
                SubscriptionPatch {
                    max_concurrency: Some(cap),
                    ..Default::default()
                },
            )
            .await
            .unwrap();
    }
    let now = caps(store.due_destinations(10).await.unwrap());
    assert!(now.contains(&shared(strict.id, None, Some(100))), "{now:?}");
    assert!(now.contains(&shared(loose.id, Some(50), None)), "{now:?}");
    assert!(
        now.contains(&shared(default.id, Some(3), Some(9))),
        "{now:?}"
    );
}

pub async fn a_subscription_claim_takes_only_that_subscriptions_deliveries(store: Arc<dyn Store>) {
    let a = store
        .create_subscription(new_sub("shared.example", None))
        .await
        .unwrap();
    let b = store
        .create_subscription(new_sub("shared.example", None))
        .await
        .unwrap();
    let elsewhere = store
        .create_subscription(new_sub("other.example", None))
        .await
        .unwrap();
    let (mut a_ids, mut b_ids) = (Vec::new(), Vec::new());
    for _ in 0..3 {
        let (_, ids) = ingest(&store, &[&a, &b, &elsewhere]).await;
        a_ids.push(ids[0]);
        b_ids.push(ids[1]);
    }
    let claimed = store
        .claim_due(&sub_claim_req(&a, ClaimOrder::OldestFirst, 10))
        .await
        .unwrap();
    assert!(claimed.iter().all(|c| c.delivery.sub_id == a.id));
    assert!(claimed.iter().all(|c| c.subscription.id == a.id));
    assert_eq!(
        claimed.iter().map(|c| c.delivery.id).collect::<Vec<_>>(),
        a_ids,
        "all of a's, oldest first, and nothing of b's"
    );
    assert!(
        claim_sub_ids(&store, &a, ClaimOrder::OldestFirst, 10)
            .await
            .is_empty(),
        "a has nothing left, though b has due work on the same host"
    );
    let listed = store.due_destinations(10).await.unwrap();
    assert_eq!(
        listed
            .iter()
            .find(|d| d.host == "shared.example")
            .unwrap()
            .subscriptions
            .iter()
            .map(|s| s.sub_id)
            .collect::<Vec<_>>(),
        [b.id],
        "only b is listed at the shared host now"
    );
    assert_eq!(
        claim_sub_ids(&store, &b, ClaimOrder::OldestFirst, 2).await,
        b_ids[..2]
    );
    // A subscription's claim is still a claim of one destination: the
    // other subscription's deliveries live at another host.
    let mismatched = ClaimRequest {
        subscription: Some(elsewhere.id),
        ..claim_req("shared.example", 10, LONG)
    };
    assert!(store.claim_due(&mismatched).await.unwrap().is_empty());
    assert_eq!(claim_ids(&store, "shared.example").await, b_ids[2..]);
    assert_eq!(
        claim_sub_ids(&store, &elsewhere, ClaimOrder::OldestFirst, 10)
            .await
            .len(),
        3
    );
}

pub async fn newest_first_claims_take_the_newest_due_and_oldest_first_the_oldest(
    store: Arc<dyn Store>,
) {
    let a = store
        .create_subscription(new_sub("a.example", None))
        .await
        .unwrap();
    let mut ids = Vec::new();
    for _ in 0..4 {
        ids.push(ingest(&store, &[&a]).await.1[0]);
    }
    // Retry the first one at once, after the store clock has passed the
    // others' due times: it is now the newest due, though its id is the
    // smallest, so a claim that honoured ids rather than due times fails.
    let c = store
        .claim_due(&claim_req("a.example", 1, LONG))
        .await
        .unwrap()
        .remove(0);
    assert_eq!(c.delivery.id, ids[0]);
    until_store_clock_passes(&store, due_at(&store, &ids[3]).await).await;
    finish(
        &store,
        &c,
        503,
        NextState::Retry {
            delay: Duration::ZERO,
        },
    )
    .await;
    assert!(due_at(&store, &ids[0]).await > due_at(&store, &ids[3]).await);
    let by_due_time = [ids[1], ids[2], ids[3], ids[0]];

    let host_claim = |order, limit| ClaimRequest {
        order,
        ..claim_req("a.example", limit, LONG)
    };
    let newest = store
        .claim_due(&host_claim(ClaimOrder::NewestFirst, 2))
        .await
        .unwrap();
    assert_eq!(
        newest.iter().map(|c| c.delivery.id).collect::<Vec<_>>(),
        [ids[0], ids[3]],
        "the newest due first, returned in that order"
    );
    let oldest = store
        .claim_due(&host_claim(ClaimOrder::OldestFirst, 1))
        .await
        .unwrap();
    assert_eq!(oldest[0].delivery.id, ids[1], "the oldest due");
    assert_eq!(
        claim_sub_ids(&store, &a, ClaimOrder::NewestFirst, 10).await,
        [ids[2]]
    );

    // All back, then all at once: each order is kept across the batch.
    let leases: Vec<Lease> = newest.iter().chain(&oldest).map(|c| c.lease).collect();
    assert_eq!(store.release(&leases).await.unwrap(), 3);
    let got: Vec<_> = store
        .claim_due(&host_claim(ClaimOrder::NewestFirst, 10))
        .await
        .unwrap();
    let mut newest_first = by_due_time.to_vec();
    newest_first.retain(|id| *id != ids[2]);
    newest_first.reverse();
    assert_eq!(
        got.iter().map(|c| c.delivery.id).collect::<Vec<_>>(),
        newest_first
    );
    let leases: Vec<Lease> = got.iter().map(|c| c.lease).collect();
    assert_eq!(store.release(&leases).await.unwrap(), 3);
    let mut oldest_first = newest_first;
    oldest_first.reverse();
    assert_eq!(
        claim_sub_ids(&store, &a, ClaimOrder::OldestFirst, 10).await,
        oldest_first
    );
}

pub async fn an_ordered_subscription_gives_only_its_head_in_either_order(store: Arc<dyn Store>) {
    let o = ordered_sub(&store, "o.example").await;
    let mut ids = Vec::new();
    for _ in 0..3 {
        ids.push(ingest(&store, &[&o]).await.1[0]);
    }
    let newest_first = ClaimRequest {
        order: ClaimOrder::NewestFirst,
        ..claim_req("o.example", 10, LONG)
    };
    let c = store.claim_due(&newest_first).await.unwrap();
    assert_eq!(
        c.iter().map(|c| c.delivery.id).collect::<Vec<_>>(),
        [ids[0]],
        "the head, never the newest"
    );
    assert!(
        claim_sub_ids(&store, &o, ClaimOrder::NewestFirst, 10)
            .await
            .is_empty(),
        "nothing while the head is in flight"
    );
    finish(&store, &c[0], 200, NextState::Delivered).await;
    assert_eq!(
        claim_sub_ids(&store, &o, ClaimOrder::NewestFirst, 10).await,
        [ids[1]]
    );
}

// --- ordered subscriptions -------------------------------------------------------

pub async fn ordered_deliveries_are_claimed_one_at_a_time_in_order(store: Arc<dyn Store>) {
    let o = ordered_sub(&store, "o.example").await;
    let mut ids = Vec::new();
    for _ in 0..3 {
        ids.push(ingest(&store, &[&o]).await.1[0]);
    }
    for (i, id) in ids.iter().enumerate() {
        let c = claim_one(&store, "o.example").await;
        assert_eq!(c.delivery.id, *id, "delivery {i} goes in event order");
        assert!(
            claim_ids(&store, "o.example").await.is_empty(),
            "nothing else while delivery {i} is in flight"
        );
        assert!(
            store.due_destinations(10).await.unwrap().is_empty(),
            "the host has nothing claimable while delivery {i} is in flight"
        );
        finish(&store, &c, 200, NextState::Delivered).await;
    }
    assert!(claim_ids(&store, "o.example").await.is_empty());
}

pub async fn an_ordered_head_waiting_to_retry_blocks_the_deliveries_behind_it(
    store: Arc<dyn Store>,
) {
    let o = ordered_sub(&store, "o.example").await;
    let (_, head) = ingest(&store, &[&o]).await;
    let (_, next) = ingest(&store, &[&o]).await;
    let c = claim_one(&store, "o.example").await;
    assert_eq!(c.delivery.id, head[0]);
    finish(
        &store,
        &c,
        503,
        NextState::Retry {
            delay: Duration::from_secs(3600),
        },
    )
    .await;
    // The next one is due, but its head has not gone through yet.
    let behind = store.get_delivery(&next[0]).await.unwrap().delivery;
    assert_eq!(behind.state, DeliveryState::Pending);
    assert!(behind.next_attempt_at <= chrono::Utc::now() + chrono::Duration::seconds(1));
    assert!(claim_ids(&store, "o.example").await.is_empty());
    assert!(
        store.due_destinations(10).await.unwrap().is_empty(),
        "a host whose only due work is blocked is not listed"
    );
    // Even after the lease-expiry sweep, the order stands.
    store.reclaim_expired().await.unwrap();
    assert!(claim_ids(&store, "o.example").await.is_empty());
}

pub async fn an_ordered_head_that_is_delivered_or_final_unblocks_the_next(store: Arc<dyn Store>) {
    let o = ordered_sub(&store, "o.example").await;
    let mut ids = Vec::new();
    for _ in 0..4 {
        ids.push(ingest(&store, &[&o]).await.1[0]);
    }
    // Delivered: the next goes.
    let c = claim_one(&store, "o.example").await;
    assert_eq!(c.delivery.id, ids[0]);
    finish(&store, &c, 200, NextState::Delivered).await;
    // A head retried at once is claimed again itself, not the one behind it.
    let c = claim_one(&store, "o.example").await;
    assert_eq!(c.delivery.id, ids[1]);
    finish(
        &store,
        &c,
        500,
        NextState::Retry {
            delay: Duration::ZERO,
        },
    )
    .await;
    let c = claim_one(&store, "o.example").await;
    assert_eq!(c.delivery.id, ids[1], "the head is retried before the rest");
    assert_eq!(c.delivery.attempt, 1);
    // Dead: final, so the next goes.
    finish(&store, &c, 500, NextState::Dead).await;
    let c = claim_one(&store, "o.example").await;
    assert_eq!(c.delivery.id, ids[2]);
    // Failed: final too.
    finish(&store, &c, 400, NextState::Failed).await;
    let c = claim_one(&store, "o.example").await;
    assert_eq!(c.delivery.id, ids[3]);
    // A head whose claim is released goes back to the front.
    assert_eq!(store.release(&[c.lease]).await.unwrap(), 1);
    assert_eq!(claim_one(&store, "o.example").await.delivery.id, ids[3]);
}

pub async fn concurrent_claimers_never_hold_two_deliveries_of_one_ordered_subscription(
    store: Arc<dyn Store>,
) {
    let o = ordered_sub(&store, "o.example").await;
    let total = 40;
    let mut ids = Vec::new();
    for _ in 0..total {
        ids.push(ingest(&store, &[&o]).await.1[0]);
    }
    // What the claimers saw: the one delivery in flight, and the order in
    // which deliveries were claimed. A claimer empties the slot *before*
    // recording its result, so the slot is empty whenever the store could
    // legitimately hand out the next one: finding it full means the store
    // gave out two at once.
    #[derive(Default)]
    struct Seen {
        in_flight: Option<DeliveryId>,
        order: Vec<DeliveryId>,
    }
    let seen = Arc::new(std::sync::Mutex::new(Seen::default()));
    let claimers: Vec<_> = (0..4)
        .map(|w| {
            let (store, seen) = (store.clone(), seen.clone());
            tokio::spawn(async move {
                let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
                loop {
                    if seen.lock().unwrap().order.len() == total {
                        break;
                    }
                    assert!(tokio::time::Instant::now() < deadline, "claimers stalled");
                    let req = ClaimRequest {
                        worker_id: format!("w{w}"),
                        destination: "o.example".into(),
                        subscription: None,
                        order: ClaimOrder::OldestFirst,
                        limit: 5,
                        lease: LONG,
                    };
                    let got = store.claim_due(&req).await.unwrap();
                    assert!(got.len() <= 1, "one claim took {} deliveries", got.len());
                    let Some(c) = got.into_iter().next() else {
                        tokio::task::yield_now().await;
                        continue;
                    };
                    {
                        let mut seen = seen.lock().unwrap();
                        assert_eq!(
                            seen.in_flight, None,
                            "{} was claimed while another was in flight",
                            c.delivery.id
                        );
                        seen.in_flight = Some(c.delivery.id);
                        seen.order.push(c.delivery.id);
                    }
                    tokio::task::yield_now().await;
                    seen.lock().unwrap().in_flight = None;
                    finish(&store, &c, 200, NextState::Delivered).await;
                }
            })
        })
        .collect();
    for c in futures::future::join_all(claimers).await {
        c.unwrap();
    }
    assert_eq!(seen.lock().unwrap().order, ids, "claimed in event order");
}

pub async fn ordered_subscriptions_do_not_block_others_on_the_same_host(store: Arc<dyn Store>) {
    let o = ordered_sub(&store, "shared.example").await;
    let u = store
        .create_subscription(new_sub("shared.example", None))
        .await
        .unwrap();
    let (_, first) = ingest(&store, &[&o, &u]).await;
    let claimed = store
        .claim_due(&claim_req("shared.example", 10, LONG))
        .await
        .unwrap();
    assert_eq!(claimed.len(), 2, "the ordered head and the other one");
    for c in &claimed {
        if c.delivery.id == first[0] {
            let delay = Duration::from_secs(3600);
            finish(&store, c, 503, NextState::Retry { delay }).await;
        } else {
            finish(&store, c, 200, NextState::Delivered).await;
        }
    }
    // The ordered head waits an hour; the other subscription's work flows.
    let mut unordered = Vec::new();
    for _ in 0..3 {
        unordered.push(ingest(&store, &[&o, &u]).await.1[1]);
    }
    assert_eq!(due_hosts(&store, 10).await, ["shared.example"]);
    let mut got = claim_ids(&store, "shared.example").await;
    got.sort();
    assert_eq!(got, unordered);
    assert!(store.due_destinations(10).await.unwrap().is_empty());
}

// --- replay ------------------------------------------------------------------------

pub async fn replaying_a_final_delivery_queues_it_again_with_a_fresh_window(store: Arc<dyn Store>) {
    let a = store
        .create_subscription(new_sub("a.example", None))
        .await
        .unwrap();
    let endings = [
        (200, NextState::Delivered, DeliveryState::Delivered),
        (400, NextState::Failed, DeliveryState::Failed),
        (500, NextState::Dead, DeliveryState::Dead),
    ];
    for (status, next, state) in endings {
        let (_, ids) = ingest(&store, &[&a]).await;
        let c = claim_one(&store, "a.example").await;
        finish(&store, &c, status, next).await;
        let before = store.get_delivery(&ids[0]).await.unwrap();
        assert_eq!(before.delivery.state, state);

        let replayed = store.replay_delivery(&ids[0]).await.unwrap();
        let now = chrono::Utc::now();
        assert_eq!(replayed.state, DeliveryState::Pending, "{state:?}");
        assert_eq!(replayed.attempt, 1, "{state:?}: the count is kept");
        assert_eq!(replayed.last_status, Some(status), "{state:?}");
        assert_eq!(
            replayed.last_error, before.delivery.last_error,
            "{state:?}: the last error is kept"
        );
        assert!(replayed.next_attempt_at <= now + chrono::Duration::seconds(1));
        assert!(
            replayed.next_attempt_at >= before.delivery.updated_at - chrono::Duration::seconds(1)
        );
        assert!(
            replayed.window_start >= before.delivery.window_start,
            "{state:?}: the window restarts"
        );
        assert!(
            (now - replayed.window_start).num_seconds().abs() <= 1,
            "{state:?}"
        );
        assert_eq!(replayed.created_at, before.delivery.created_at);
        let after = store.get_delivery(&ids[0]).await.unwrap();
        assert_eq!(
            after.delivery, replayed,
            "the returned delivery is the stored one"
        );
        assert_eq!(after.attempts, before.attempts, "the history is kept");
        // Replaying it again while it is queued changes nothing.
        assert_eq!(store.replay_delivery(&ids[0]).await.unwrap(), replayed);
        // Due at once: the host is listed and the delivery claimable.
        assert_eq!(due_hosts(&store, 10).await, ["a.example"]);
        let c = claim_one(&store, "a.example").await;
        assert_eq!(c.delivery.id, ids[0]);
        finish(&store, &c, 200, NextState::Delivered).await;
    }
}

pub async fn a_replayed_dead_delivery_is_claimable_and_its_attempts_continue(
    store: Arc<dyn Store>,
) {
    let o = ordered_sub(&store, "o.example").await;
    let (_, dead) = ingest(&store, &[&o]).await;
    let (_, later) = ingest(&store, &[&o]).await;
    // Two attempts, the second exhausting retries.
    let c = claim_one(&store, "o.example").await;
    finish(
        &store,
        &c,
        500,
        NextState::Retry {
            delay: Duration::ZERO,
        },
    )
    .await;
    let c = claim_one(&store, "o.example").await;
    assert_eq!(c.delivery.id, dead[0]);
    finish(&store, &c, 500, NextState::Dead).await;
    // The next one went through meanwhile.
    let c = claim_one(&store, "o.example").await;
    assert_eq!(c.delivery.id, later[0]);
    finish(&store, &c, 200, NextState::Delivered).await;

    let replayed = store.replay_delivery(&dead[0]).await.unwrap();
    assert_eq!(replayed.state, DeliveryState::Pending);
    assert_eq!(replayed.attempt, 2);
    let c = claim_one(&store, "o.example").await;
    assert_eq!(
        c.delivery.id, dead[0],
        "a replayed delivery is claimable again"
    );
    assert_eq!(c.delivery.attempt, 2);
    finish(&store, &c, 200, NextState::Delivered).await;
    let d = store.get_delivery(&dead[0]).await.unwrap();
    assert_eq!(d.delivery.state, DeliveryState::Delivered);
    assert_eq!(d.delivery.attempt, 3);
    assert_eq!(d.delivery.last_error, None);
    assert_eq!(
        d.attempts
            .iter()
            .map(|a| (a.number, a.status))
            .collect::<Vec<_>>(),
        [(1, Some(500)), (2, Some(500)), (3, Some(200))],
        "the replay's attempt is number attempt + 1"
    );
}

pub async fn replaying_a_queued_delivery_changes_nothing(store: Arc<dyn Store>) {
    let a = store
        .create_subscription(new_sub("a.example", None))
        .await
        .unwrap();
    let (_, pending) = ingest(&store, &[&a]).await;
    let before = store.get_delivery(&pending[0]).await.unwrap().delivery;
    assert_eq!(store.replay_delivery(&pending[0]).await.unwrap(), before);
    assert_eq!(
        store.get_delivery(&pending[0]).await.unwrap().delivery,
        before
    );

    let c = claim_one(&store, "a.example").await;
    let inflight = store.get_delivery(&pending[0]).await.unwrap().delivery;
    assert_eq!(inflight.state, DeliveryState::Inflight);
    assert_eq!(store.replay_delivery(&pending[0]).await.unwrap(), inflight);
    assert_eq!(
        store.get_delivery(&pending[0]).await.unwrap().delivery,
        inflight
    );
    // The lease is undisturbed.
    assert!(store.renew_lease(&c.lease, LONG).await.unwrap());
    finish(&store, &c, 200, NextState::Delivered).await;
}

pub async fn replaying_a_delivery_of_a_deleted_subscription_conflicts(store: Arc<dyn Store>) {
    let a = store
        .create_subscription(new_sub("a.example", None))
        .await
        .unwrap();
    let (_, delivered) = ingest(&store, &[&a]).await;
    let c = claim_one(&store, "a.example").await;
    finish(&store, &c, 200, NextState::Delivered).await;
    // Failed by the delete itself.
    let (_, cut_off) = ingest(&store, &[&a]).await;
    store.delete_subscription(&a.id).await.unwrap();
    for id in [delivered[0], cut_off[0]] {
        let before = store.get_delivery(&id).await.unwrap();
        match store.replay_delivery(&id).await {
            Err(StoreError::Conflict(m)) => assert_eq!(m, "subscription deleted"),
            other => panic!("expected a conflict, got {other:?}"),
        }
        assert_eq!(
            store.get_delivery(&id).await.unwrap(),
            before,
            "nothing changed"
        );
    }
    assert!(claim_ids(&store, "a.example").await.is_empty());
}

pub async fn deliveries_filter_and_page(store: Arc<dyn Store>) {
    let a = store
        .create_subscription(new_sub("a.example", None))
        .await
        .unwrap();
    let b = store
        .create_subscription(new_sub("b.example", None))
        .await
        .unwrap();
    let mut a_ids = Vec::new();
    for i in 0..6 {
        let ty = if i % 2 == 0 {
            "invoice.paid"
        } else {
            "user.created"
        };
        let d = delivery_to(&a);
        a_ids.push(d.id);
        store
            .accept_event(new_event(ty, None), vec![d, delivery_to(&b)])
            .await
            .unwrap();
    }
    let q = |f: fn(&mut DeliveryQuery)| {
        let mut q = DeliveryQuery {
            sub_id: Some(a.id),
            limit: 100,
            ..Default::default()
        };
        f(&mut q);
        q
    };
    let all = store.list_deliveries(&q(|_| {})).await.unwrap();
    let mut newest_first = a_ids.clone();
    newest_first.reverse();
    assert_eq!(
        all.iter().map(|d| d.delivery.id).collect::<Vec<_>>(),
        newest_first
    );

    let invoices = store
        .list_deliveries(&q(|q| {
            q.event_type = Some(EventType::parse("invoice.paid").unwrap())
        }))
        .await
        .unwrap();
    assert_eq!(invoices.len(), 3);

    let page = store
        .list_deliveries(&DeliveryQuery {
            sub_id: Some(a.id),
            limit: 4,
            ..Default::default()
        })
        .await
        .unwrap();
    let next = store
        .list_deliveries(&DeliveryQuery {
            sub_id: Some(a.id),
            limit: 4,
            cursor: Some(page[3].delivery.id),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(page.len(), 4);
    assert_eq!(
        next.iter().map(|d| d.delivery.id).collect::<Vec<_>>(),
        newest_first[4..]
    );

    // State filter: deliver one.
    let c = store
        .claim_due(&claim_req("a.example", 1, LONG))
        .await
        .unwrap()
        .remove(0);
    store
        .record_attempt(AttemptRecord {
            lease: c.lease,
            attempt: attempt(1, Some(200)),
            next: NextState::Delivered,
            last_error: None,
        })
        .await
        .unwrap();
    let delivered = store
        .list_deliveries(&q(|q| q.state = Some(DeliveryState::Delivered)))
        .await
        .unwrap();
    assert_eq!(delivered.len(), 1);
    assert_eq!(delivered[0].delivery.id, c.delivery.id);
    assert_eq!(delivered[0].attempts.len(), 1);
    let pending = store
        .list_deliveries(&q(|q| q.state = Some(DeliveryState::Pending)))
        .await
        .unwrap();
    assert_eq!(pending.len(), 5);

    // Time window.
    let future = chrono::Utc::now() + chrono::Duration::hours(1);
    assert!(
        store
            .list_deliveries(&DeliveryQuery {
                sub_id: Some(a.id),
                since: Some(future),
                limit: 10,
                ..Default::default()
            })
            .await
            .unwrap()
            .is_empty()
    );
    assert_eq!(
        store
            .list_deliveries(&DeliveryQuery {
                sub_id: Some(a.id),
                until: Some(future),
                limit: 10,
                ..Default::default()
            })
            .await
            .unwrap()
            .len(),
        6
    );
}

// --- subscription health ---------------------------------------------------

/// The window every health test asks about: the last hour, caller's clock.
fn last_hour() -> Timestamp {
    chrono::Utc::now() - chrono::Duration::hours(1)
}

/// Records `attempt` on a claimed delivery, ending in `next`.
async fn record(store: &Arc<dyn Store>, c: &ClaimedDelivery, attempt: Attempt, next: NextState) {
    let r = AttemptRecord {
        lease: c.lease,
        attempt,
        next,
        last_error: Some("failed".into()),
    };
    assert_eq!(
        store.record_attempt(r).await.unwrap(),
        RecordOutcome::Recorded
    );
}

fn count(status: Option<u16>, error_class: Option<ErrorClass>, count: u64) -> AttemptCount {
    AttemptCount {
        status,
        error_class,
        count,
    }
}

pub async fn subscription_health_counts_unfinished_dead_and_recent_attempts(store: Arc<dyn Store>) {
    let a = store
        .create_subscription(new_sub("health-a.example", None))
        .await
        .unwrap();
    let b = store
        .create_subscription(new_sub("health-b.example", None))
        .await
        .unwrap();
    for _ in 0..5 {
        ingest(&store, &[&a]).await;
    }
    for _ in 0..2 {
        ingest(&store, &[&b]).await;
    }

    let claimed = store
        .claim_due(&claim_req("health-a.example", 10, LONG))
        .await
        .unwrap();
    assert_eq!(claimed.len(), 5);
    let [delivered, failed, dead, retrying, old] = &claimed[..] else {
        unreachable!()
    };
    finish(&store, delivered, 200, NextState::Delivered).await;
    finish(&store, failed, 401, NextState::Failed).await;
    finish(&store, dead, 500, NextState::Dead).await;
    // No status: counted by its error class (timeout).
    record(
        &store,
        retrying,
        attempt(1, None),
        NextState::Retry { delay: LONG },
    )
    .await;
    // An attempt that started before the window is not counted, though its
    // delivery, pending again, is.
    let mut before = attempt(1, Some(500));
    before.started_at = chrono::Utc::now() - chrono::Duration::hours(2);
    record(&store, old, before, NextState::Retry { delay: LONG }).await;

    // The other subscription: one delivered, one left in flight.
    let other = store
        .claim_due(&claim_req("health-b.example", 10, LONG))
        .await
        .unwrap();
    assert_eq!(other.len(), 2);
    finish(&store, &other[0], 200, NextState::Delivered).await;

    let health = store.subscription_health(&a.id, last_hour()).await.unwrap();
    assert_eq!(health.pending_count, 2, "{health:?}");
    let mut pending_created = Vec::new();
    for c in [retrying, old] {
        let d = store.get_delivery(&c.delivery.id).await.unwrap().delivery;
        pending_created.push(d.created_at);
    }
    assert_eq!(
        health.oldest_pending_created_at,
        pending_created.into_iter().min()
    );
    assert_eq!(health.dead_count, 1);
    let dead_row = store
        .get_delivery(&dead.delivery.id)
        .await
        .unwrap()
        .delivery;
    assert_eq!(health.oldest_dead_at, Some(dead_row.updated_at));
    assert_eq!(
        health.attempts,
        vec![
            count(Some(200), None, 1),
            count(Some(401), None, 1),
            count(Some(500), None, 1),
            count(None, Some(ErrorClass::Timeout), 1),
        ]
    );
    assert_eq!(health.finished_attempts(), 4);
    assert_eq!(health.successful_attempts(), 1);

    // In flight counts as unfinished; other subscriptions' work is not counted.
    let health = store.subscription_health(&b.id, last_hour()).await.unwrap();
    assert_eq!(health.pending_count, 1, "{health:?}");
    assert!(health.oldest_pending_created_at.is_some());
    assert_eq!(health.dead_count, 0);
    assert_eq!(health.oldest_dead_at, None);
    assert_eq!(health.attempts, vec![count(Some(200), None, 1)]);
}

pub async fn subscription_health_of_a_quiet_subscription_is_empty(store: Arc<dyn Store>) {
    let sub = store
        .create_subscription(new_sub("quiet.example", None))
        .await
        .unwrap();
    assert_eq!(
        store
            .subscription_health(&sub.id, last_hour())
            .await
            .unwrap(),
        SubscriptionHealth {
            pending_count: 0,
            oldest_pending_created_at: None,
            dead_count: 0,
            oldest_dead_at: None,
            attempts: vec![],
            signals: vec![],
        }
    );
}

pub async fn subscription_health_of_a_missing_or_deleted_subscription_is_not_found(
    store: Arc<dyn Store>,
) {
    assert!(matches!(
        store
            .subscription_health(&SubscriptionId::new(), last_hour())
            .await,
        Err(StoreError::NotFound)
    ));
    let sub = store
        .create_subscription(new_sub("gone.example", None))
        .await
        .unwrap();
    store.delete_subscription(&sub.id).await.unwrap();
    assert!(matches!(
        store.subscription_health(&sub.id, last_hour()).await,
        Err(StoreError::NotFound)
    ));
}

pub async fn tokens_are_found_by_hash(store: Arc<dyn Store>) {
    assert!(!store.has_admin_token().await.unwrap());
    let cust = NewToken {
        token_hash: vec![1; 32],
        customer_id: Some(CustomerId::parse("acme").unwrap()),
        label: None,
        expires_at: None,
    };
    store.create_token(cust.clone()).await.unwrap();
    assert!(
        !store.has_admin_token().await.unwrap(),
        "a customer token is not an admin token"
    );
    store
        .create_token(NewToken {
            token_hash: vec![2; 32],
            customer_id: None,
            label: Some("admin".into()),
            expires_at: None,
        })
        .await
        .unwrap();
    assert!(store.has_admin_token().await.unwrap());
    assert_eq!(
        store.find_token(&[1; 32]).await.unwrap().map(|t| t.scope),
        Some(TokenScope::Customer(CustomerId::parse("acme").unwrap()))
    );
    assert_eq!(
        store.find_token(&[2; 32]).await.unwrap(),
        Some(FoundToken {
            scope: TokenScope::Admin,
            expires_at: None
        })
    );
    assert_eq!(store.find_token(&[3; 32]).await.unwrap(), None);
    assert!(matches!(
        store.create_token(cust).await,
        Err(StoreError::Conflict(_))
    ));
}

pub async fn an_expired_token_is_not_found(store: Arc<dyn Store>) {
    let acme = || Some(CustomerId::parse("acme").unwrap());
    let token = |hash: u8, expires_at| NewToken {
        token_hash: vec![hash; 32],
        customer_id: acme(),
        label: Some("portal link".into()),
        expires_at: Some(expires_at),
    };
    let now = chrono::Utc::now();
    store
        .create_token(token(7, now + chrono::Duration::hours(1)))
        .await
        .unwrap();
    store
        .create_token(token(8, now - chrono::Duration::seconds(1)))
        .await
        .unwrap();
    let found = store.find_token(&[7; 32]).await.unwrap();
    assert_eq!(
        found.as_ref().map(|t| t.scope.clone()),
        acme().map(TokenScope::Customer),
        "works until it expires"
    );
    // The expiry comes back (to the store's precision), so a cache of the
    // token can stop trusting it then.
    let expires_at = found.unwrap().expires_at.expect("its expiry");
    let off = (expires_at - (now + chrono::Duration::hours(1))).num_milliseconds();
    assert!(off.abs() <= 1, "expires_at is off by {off} ms");
    assert_eq!(
        store.find_token(&[8; 32]).await.unwrap(),
        None,
        "an expired token is as if absent"
    );
}

pub async fn missing_records_are_not_found(store: Arc<dyn Store>) {
    assert!(matches!(
        store.get_event(&EventId::new()).await,
        Err(StoreError::NotFound)
    ));
    assert!(matches!(
        store.get_delivery(&DeliveryId::new()).await,
        Err(StoreError::NotFound)
    ));
    assert!(matches!(
        store.get_subscription(&SubscriptionId::new()).await,
        Err(StoreError::NotFound)
    ));
    assert!(matches!(
        store.replay_delivery(&DeliveryId::new()).await,
        Err(StoreError::NotFound)
    ));
    store.ping().await.unwrap();
    store.migrate().await.unwrap();
    store.migrate().await.unwrap();
}

// --- bulk replay jobs --------------------------------------------------------

/// Now, on the caller's clock, cut to whole seconds so it round-trips
/// through any backend's time precision.
fn whole_second(t: Timestamp) -> Timestamp {
    use chrono::SubsecRound;
    t.trunc_subsecs(0)
}

/// A job over all of `sub`'s deliveries of the last day (and the next), in
/// `states`.
fn job_for(sub: &Subscription, states: &[DeliveryState]) -> NewReplayJob {
    let now = whole_second(chrono::Utc::now());
    NewReplayJob {
        id: JobId::new(),
        sub_id: sub.id,
        since: now - chrono::Duration::days(1),
        until: now + chrono::Duration::days(1),
        event_types: vec![],
        states: states.to_vec(),
    }
}

/// Accepts one event of type `ty` fanned out to `sub` only.
async fn ingest_one(store: &Arc<dyn Store>, sub: &Subscription, ty: &str) -> DeliveryId {
    let d = delivery_to(sub);
    let id = d.id;
    store
        .accept_event(new_event(ty, None), vec![d])
        .await
        .unwrap();
    id
}

/// Claims `sub`'s due deliveries (all of them) and returns them by id.
async fn claim_all_of(store: &Arc<dyn Store>, sub: &Subscription) -> Vec<ClaimedDelivery> {
    let mut got = store
        .claim_due(&sub_claim_req(sub, ClaimOrder::OldestFirst, 100))
        .await
        .unwrap();
    got.sort_by_key(|c| c.delivery.id);
    got
}

/// Ingests one event of type `ty` to `sub` (which must have nothing else
/// due) and takes its delivery through one claim per ending in `endings`:
/// `(status, next)`, the last of which should finish it.
async fn delivery_ending(
    store: &Arc<dyn Store>,
    sub: &Subscription,
    ty: &str,
    endings: &[(u16, NextState)],
) -> DeliveryId {
    let id = ingest_one(store, sub, ty).await;
    for (status, next) in endings {
        let claimed = claim_all_of(store, sub).await;
        assert_eq!(
            claimed.iter().map(|c| c.delivery.id).collect::<Vec<_>>(),
            [id]
        );
        finish(store, &claimed[0], *status, next.clone()).await;
    }
    id
}

/// `n` dead deliveries of `sub`, in id order.
async fn dead_deliveries(store: &Arc<dyn Store>, sub: &Subscription, n: usize) -> Vec<DeliveryId> {
    let mut ids = Vec::new();
    for _ in 0..n {
        ids.push(delivery_ending(store, sub, "order.created", &[(500, NextState::Dead)]).await);
    }
    ids.sort();
    ids
}

async fn state_of(store: &Arc<dyn Store>, id: &DeliveryId) -> DeliveryState {
    store.get_delivery(id).await.unwrap().delivery.state
}

async fn states_of(store: &Arc<dyn Store>, ids: &[DeliveryId]) -> Vec<DeliveryState> {
    let mut out = Vec::new();
    for id in ids {
        out.push(state_of(store, id).await);
    }
    out
}

/// A job's `(done, failed, skipped, requeued)`, after checking that its
/// counts add up.
fn progress(job: &ReplayJob) -> (u64, u64, u64, u64) {
    let settled = job.done + job.failed + job.skipped + job.requeued;
    assert!(settled <= job.total, "counts exceed the total: {job:?}");
    (job.done, job.failed, job.skipped, job.requeued)
}

/// Steps `job` with `window` and returns what the step re-queued and the job.
async fn step(store: &Arc<dyn Store>, job: &JobId, window: u32) -> (u32, ReplayJob) {
    let s = store.step_replay_job(job, window).await.unwrap();
    assert_eq!(
        store.get_replay_job(job).await.unwrap(),
        s.job,
        "the step returns the stored job"
    );
    (s.requeued, s.job)
}

pub async fn a_replay_job_fixes_its_items_and_exact_total(store: Arc<dyn Store>) {
    use DeliveryState::{Dead, Delivered, Failed};
    let a = store
        .create_subscription(new_sub("job-a.example", None))
        .await
        .unwrap();
    let other = store
        .create_subscription(new_sub("job-other.example", None))
        .await
        .unwrap();
    // Another subscription's dead delivery is never an item.
    dead_deliveries(&store, &other, 1).await;
    let old = delivery_ending(&store, &a, "order.created", &[(500, NextState::Dead)]).await;
    let old_created = store.get_delivery(&old).await.unwrap().delivery.created_at;
    until_store_clock_passes(&store, old_created).await;
    let delivered =
        delivery_ending(&store, &a, "order.created", &[(200, NextState::Delivered)]).await;
    let failed = delivery_ending(&store, &a, "order.created", &[(400, NextState::Failed)]).await;
    let dead = delivery_ending(&store, &a, "invoice.paid", &[(500, NextState::Dead)]).await;
    // Unfinished (waiting to retry): never an item of a job over finished
    // states.
    let retry = NextState::Retry { delay: LONG };
    delivery_ending(&store, &a, "invoice.paid", &[(503, retry)]).await;
    let second_created = store
        .get_delivery(&delivered)
        .await
        .unwrap()
        .delivery
        .created_at;
    let finished = [Delivered, Failed, Dead];

    let new = job_for(&a, &finished);
    let job = store.create_replay_job(new.clone()).await.unwrap();
    assert_eq!(job.id, new.id);
    assert_eq!(job.sub_id, a.id);
    assert_eq!(job.since, new.since);
    assert_eq!(job.until, new.until);
    assert_eq!(job.event_types, Vec::<EventType>::new());
    assert_eq!(job.states, finished);
    assert_eq!(job.state, JobState::Running);
    assert_eq!(job.total, 4, "old, delivered, failed, dead: {job:?}");
    assert_eq!(progress(&job), (0, 0, 0, 0));
    assert_eq!(job.finished_at, None);
    assert_eq!(store.get_replay_job(&job.id).await.unwrap(), job);

    let total = |new: NewReplayJob| {
        let store = store.clone();
        async move { store.create_replay_job(new).await.unwrap().total }
    };
    // By state.
    let only_dead = job_for(&a, &[Dead]);
    assert_eq!(total(only_dead.clone()).await, 2, "old and dead");
    // By event type (exact types).
    let mut by_type = job_for(&a, &finished);
    by_type.event_types = vec![EventType::parse("invoice.paid").unwrap()];
    assert_eq!(total(by_type).await, 1, "only dead is an invoice.paid");
    let mut both_types = job_for(&a, &[Dead]);
    both_types.event_types = vec![
        EventType::parse("invoice.paid").unwrap(),
        EventType::parse("order.created").unwrap(),
    ];
    assert_eq!(total(both_types).await, 2);
    // `since` is inclusive…
    let mut since = job_for(&a, &finished);
    since.since = second_created;
    assert_eq!(total(since).await, 3, "delivered, failed, dead");
    // …and `until` exclusive.
    let mut until = job_for(&a, &finished);
    until.until = second_created;
    assert_eq!(total(until).await, 1, "old only");

    // The items were fixed at creation: a delivery that dies later is not
    // one of them.
    let late = delivery_ending(&store, &a, "order.created", &[(500, NextState::Dead)]).await;
    let (requeued, stepped) = step(&store, &only_dead.id, 10).await;
    assert_eq!(requeued, 2);
    assert_eq!(stepped.total, 2);
    assert_eq!(progress(&stepped), (0, 0, 0, 2));
    assert_eq!(state_of(&store, &old).await, DeliveryState::Pending);
    assert_eq!(state_of(&store, &dead).await, DeliveryState::Pending);
    assert_eq!(state_of(&store, &late).await, Dead, "not an item");
    assert_eq!(state_of(&store, &failed).await, Failed, "not in its states");
}

pub async fn a_replay_job_with_no_items_completes_on_its_first_step(store: Arc<dyn Store>) {
    let a = store
        .create_subscription(new_sub("job-empty.example", None))
        .await
        .unwrap();
    // Dead, but outside the job's window.
    let d = dead_deliveries(&store, &a, 1).await;
    let mut new = job_for(&a, &[DeliveryState::Dead]);
    new.until = new.since;
    new.since -= chrono::Duration::days(1);
    let job = store.create_replay_job(new).await.unwrap();
    assert_eq!(job.total, 0);
    assert_eq!(job.state, JobState::Running);
    let (requeued, job) = step(&store, &job.id, 10).await;
    assert_eq!(requeued, 0);
    assert_eq!(job.state, JobState::Completed);
    assert!(job.finished_at.is_some());
    assert_eq!(progress(&job), (0, 0, 0, 0));
    assert_eq!(state_of(&store, &d[0]).await, DeliveryState::Dead);
    // A job that is not running is returned as it is.
    let again = store.step_replay_job(&job.id, 10).await.unwrap();
    assert_eq!(again.job, job);
    assert_eq!(again.requeued, 0);
}

pub async fn stepping_a_replay_job_requeues_a_window_in_delivery_order_and_settles_as_deliveries_finish(
    store: Arc<dyn Store>,
) {
    use DeliveryState::{Dead, Delivered, Failed, Pending};
    let a = store
        .create_subscription(new_sub("job-step.example", None))
        .await
        .unwrap();
    let d = dead_deliveries(&store, &a, 5).await;
    let job = store
        .create_replay_job(job_for(&a, &[Dead, Failed]))
        .await
        .unwrap();
    assert_eq!(job.total, 5);

    // The first window, in delivery id order, replayed as replay_delivery
    // does: pending, due now, attempts and history kept.
    let before = store.get_delivery(&d[0]).await.unwrap();
    let (requeued, job) = step(&store, &job.id, 2).await;
    assert_eq!(requeued, 2);
    assert_eq!(progress(&job), (0, 0, 0, 2));
    assert_eq!(
        states_of(&store, &d).await,
        [Pending, Pending, Dead, Dead, Dead]
    );
    let after = store.get_delivery(&d[0]).await.unwrap();
    assert_eq!(after.delivery.attempt, before.delivery.attempt);
    assert_eq!(after.attempts, before.attempts);
    assert!(after.delivery.window_start >= before.delivery.window_start);

    // The window is full: nothing more until those settle.
    let (requeued, job) = step(&store, &job.id, 2).await;
    assert_eq!(requeued, 0);
    assert_eq!(progress(&job), (0, 0, 0, 2));

    let claimed = claim_all_of(&store, &a).await;
    assert_eq!(
        claimed.iter().map(|c| c.delivery.id).collect::<Vec<_>>(),
        d[..2]
    );
    assert_eq!(claimed[0].delivery.attempt, 1, "attempts continue");
    finish(&store, &claimed[0], 200, NextState::Delivered).await;
    finish(&store, &claimed[1], 500, NextState::Dead).await;
    // Settled: one done, one failed; the next window goes out.
    let (requeued, job) = step(&store, &job.id, 2).await;
    assert_eq!(requeued, 2);
    assert_eq!(progress(&job), (1, 1, 0, 2));
    assert_eq!(
        states_of(&store, &d).await,
        [Delivered, Dead, Pending, Pending, Dead]
    );

    // A retry is not finished: its item stays re-queued.
    let claimed = claim_all_of(&store, &a).await;
    assert_eq!(
        claimed.iter().map(|c| c.delivery.id).collect::<Vec<_>>(),
        d[2..4]
    );
    finish(&store, &claimed[0], 200, NextState::Delivered).await;
    finish(
        &store,
        &claimed[1],
        503,
        NextState::Retry {
            delay: Duration::ZERO,
        },
    )
    .await;
    let (requeued, job) = step(&store, &job.id, 2).await;
    assert_eq!(requeued, 1, "one slot freed");
    assert_eq!(progress(&job), (2, 1, 0, 2));
    assert_eq!(job.state, JobState::Running);

    assert_eq!(
        store.running_replay_jobs(10).await.unwrap(),
        std::slice::from_ref(&job)
    );

    // The last two finish (`failed` counts as failed); the job completes.
    let claimed = claim_all_of(&store, &a).await;
    assert_eq!(
        claimed.iter().map(|c| c.delivery.id).collect::<Vec<_>>(),
        d[3..]
    );
    finish(&store, &claimed[0], 200, NextState::Delivered).await;
    finish(&store, &claimed[1], 410, NextState::Failed).await;
    let (requeued, job) = step(&store, &job.id, 2).await;
    assert_eq!(requeued, 0);
    assert_eq!(progress(&job), (3, 2, 0, 0));
    assert_eq!(job.state, JobState::Completed);
    assert!(job.finished_at.is_some());
    assert!(store.running_replay_jobs(10).await.unwrap().is_empty());
    // Ended: stepping changes nothing.
    let again = store.step_replay_job(&job.id, 2).await.unwrap();
    assert_eq!((again.requeued, again.job), (0, job));
}

pub async fn a_window_of_zero_only_settles(store: Arc<dyn Store>) {
    use DeliveryState::{Dead, Delivered, Pending};
    let a = store
        .create_subscription(new_sub("job-hold.example", None))
        .await
        .unwrap();
    let d = dead_deliveries(&store, &a, 3).await;
    let job = store.create_replay_job(job_for(&a, &[Dead])).await.unwrap();
    let (requeued, job) = step(&store, &job.id, 0).await;
    assert_eq!(requeued, 0);
    assert_eq!(progress(&job), (0, 0, 0, 0));
    assert_eq!(states_of(&store, &d).await, [Dead, Dead, Dead]);

    let (requeued, job) = step(&store, &job.id, 1).await;
    assert_eq!(requeued, 1);
    let c = claim_one(&store, "job-hold.example").await;
    finish(&store, &c, 200, NextState::Delivered).await;
    // Held: the finished delivery is settled, nothing new goes out.
    let (requeued, job) = step(&store, &job.id, 0).await;
    assert_eq!(requeued, 0);
    assert_eq!(progress(&job), (1, 0, 0, 0));
    assert_eq!(job.state, JobState::Running);
    assert_eq!(states_of(&store, &d).await, [Delivered, Dead, Dead]);
    // Released: the rest go out.
    let (requeued, job) = step(&store, &job.id, 5).await;
    assert_eq!(requeued, 2);
    assert_eq!(progress(&job), (1, 0, 0, 2));
    assert_eq!(states_of(&store, &d).await, [Delivered, Pending, Pending]);
}

/// The contract's "left alone and the item waits": an item whose delivery
/// is `pending` or `inflight` already is not re-queued, holds no slot of
/// the window and does not hold up the items behind it; it stays queued,
/// and its turn comes again at a later step, when its delivery is judged
/// afresh (re-queued if it is in the job's states again, skipped if not).
pub async fn a_replay_job_waits_for_a_delivery_already_queued_and_skips_one_that_left_its_states(
    store: Arc<dyn Store>,
) {
    use DeliveryState::{Dead, Delivered, Pending};
    let a = store
        .create_subscription(new_sub("job-wait.example", None))
        .await
        .unwrap();
    let d = dead_deliveries(&store, &a, 3).await;
    let job = store.create_replay_job(job_for(&a, &[Dead])).await.unwrap();
    // Someone replays the first by hand.
    let queued = store.replay_delivery(&d[0]).await.unwrap();
    let (requeued, job) = step(&store, &job.id, 2).await;
    assert_eq!(requeued, 2, "the two behind it");
    assert_eq!(progress(&job), (0, 0, 0, 2));
    assert_eq!(
        store.get_delivery(&d[0]).await.unwrap().delivery,
        queued,
        "left alone"
    );
    assert_eq!(states_of(&store, &d).await, [Pending, Pending, Pending]);

    let claimed = claim_all_of(&store, &a).await;
    assert_eq!(claimed.len(), 3, "each delivery once");
    finish(&store, &claimed[0], 200, NextState::Delivered).await;
    finish(&store, &claimed[1], 200, NextState::Delivered).await;
    finish(&store, &claimed[2], 500, NextState::Dead).await;
    // The hand replay delivered the first: no longer dead, so skipped.
    let (requeued, job) = step(&store, &job.id, 2).await;
    assert_eq!(requeued, 0);
    assert_eq!(progress(&job), (1, 1, 1, 0));
    assert_eq!(job.state, JobState::Completed);
    assert_eq!(states_of(&store, &d).await, [Delivered, Delivered, Dead]);
}

pub async fn overlapping_replay_jobs_never_requeue_one_delivery_twice(store: Arc<dyn Store>) {
    use DeliveryState::{Dead, Inflight, Pending};
    let a = store
        .create_subscription(new_sub("job-overlap.example", None))
        .await
        .unwrap();
    let d = dead_deliveries(&store, &a, 3).await;
    let j1 = store.create_replay_job(job_for(&a, &[Dead])).await.unwrap();
    let j2 = store.create_replay_job(job_for(&a, &[Dead])).await.unwrap();
    assert_eq!((j1.total, j2.total), (3, 3));

    // Both step at once: between them each delivery is re-queued once.
    let steps: Vec<_> = [j1.id, j2.id]
        .into_iter()
        .map(|id| {
            let store = store.clone();
            tokio::spawn(async move { store.step_replay_job(&id, 3).await.unwrap() })
        })
        .collect();
    let steps: Vec<JobStep> = futures::future::join_all(steps)
        .await
        .into_iter()
        .map(|r| r.unwrap())
        .collect();
    assert_eq!(steps[0].requeued + steps[1].requeued, 3, "{steps:?}");
    assert_eq!(steps[0].job.requeued + steps[1].job.requeued, 3);
    assert_eq!(states_of(&store, &d).await, [Pending, Pending, Pending]);

    // In flight: still left alone by both.
    let claimed = claim_all_of(&store, &a).await;
    assert_eq!(claimed.len(), 3);
    for id in [j1.id, j2.id] {
        let (requeued, _) = step(&store, &id, 3).await;
        assert_eq!(requeued, 0);
    }
    assert_eq!(states_of(&store, &d).await, [Inflight, Inflight, Inflight]);
    for c in &claimed {
        assert!(
            store.renew_lease(&c.lease, LONG).await.unwrap(),
            "leases undisturbed"
        );
        finish(&store, c, 200, NextState::Delivered).await;
    }

    // Each job counts what it re-sent as done, and skips what the other
    // re-sent (delivered now, so out of its states).
    let (_, j1) = step(&store, &j1.id, 3).await;
    let (_, j2) = step(&store, &j2.id, 3).await;
    assert_eq!(j1.state, JobState::Completed);
    assert_eq!(j2.state, JobState::Completed);
    assert_eq!(j1.done + j2.done, 3);
    assert_eq!((j1.skipped, j2.skipped), (j2.done, j1.done));
    assert_eq!(
        (j1.failed, j2.failed, j1.requeued, j2.requeued),
        (0, 0, 0, 0)
    );
    for c in &claimed {
        assert_eq!(
            store
                .get_delivery(&c.delivery.id)
                .await
                .unwrap()
                .attempts
                .len(),
            2,
            "one attempt when it died, one replay"
        );
    }
}

pub async fn a_cancelled_replay_job_stops_requeuing_and_freezes_its_counts(store: Arc<dyn Store>) {
    use DeliveryState::{Dead, Delivered, Pending};
    let a = store
        .create_subscription(new_sub("job-cancel.example", None))
        .await
        .unwrap();
    let d = dead_deliveries(&store, &a, 3).await;
    let job = store.create_replay_job(job_for(&a, &[Dead])).await.unwrap();
    let (requeued, _) = step(&store, &job.id, 1).await;
    assert_eq!(requeued, 1);

    let cancelled = store.cancel_replay_job(&job.id).await.unwrap();
    assert_eq!(cancelled.state, JobState::Cancelled);
    assert!(cancelled.finished_at.is_some());
    assert_eq!(progress(&cancelled), (0, 0, 0, 1));
    assert_eq!(store.get_replay_job(&job.id).await.unwrap(), cancelled);
    assert!(store.running_replay_jobs(10).await.unwrap().is_empty());

    // Stepping it does nothing; the delivery already re-queued goes on.
    let s = store.step_replay_job(&job.id, 5).await.unwrap();
    assert_eq!((s.requeued, &s.job), (0, &cancelled));
    assert_eq!(states_of(&store, &d).await, [Pending, Dead, Dead]);
    let c = claim_one(&store, "job-cancel.example").await;
    finish(&store, &c, 200, NextState::Delivered).await;
    let s = store.step_replay_job(&job.id, 5).await.unwrap();
    assert_eq!(s.job, cancelled, "counts stop moving");
    assert_eq!(states_of(&store, &d).await, [Delivered, Dead, Dead]);
    // Cancelling an ended job returns it unchanged.
    assert_eq!(store.cancel_replay_job(&job.id).await.unwrap(), cancelled);

    let mut empty = job_for(&a, &[Dead]);
    empty.until = empty.since;
    let empty = store.create_replay_job(empty).await.unwrap();
    let (_, completed) = step(&store, &empty.id, 1).await;
    assert_eq!(completed.state, JobState::Completed);
    assert_eq!(store.cancel_replay_job(&empty.id).await.unwrap(), completed);
}

pub async fn replay_job_items_of_a_deleted_subscription_are_skipped_or_settled(
    store: Arc<dyn Store>,
) {
    use DeliveryState::{Dead, Failed};
    let a = store
        .create_subscription(new_sub("job-deleted.example", None))
        .await
        .unwrap();
    let d = dead_deliveries(&store, &a, 3).await;
    let job = store.create_replay_job(job_for(&a, &[Dead])).await.unwrap();
    let (requeued, _) = step(&store, &job.id, 1).await;
    assert_eq!(requeued, 1);
    // The delete fails the re-queued one; the rest are never sent.
    store.delete_subscription(&a.id).await.unwrap();
    let (requeued, job) = step(&store, &job.id, 5).await;
    assert_eq!(requeued, 0);
    assert_eq!(progress(&job), (0, 1, 2, 0));
    assert_eq!(job.state, JobState::Completed);
    assert_eq!(states_of(&store, &d).await, [Failed, Dead, Dead]);
}

pub async fn replay_jobs_of_missing_jobs_or_subscriptions_are_not_found(store: Arc<dyn Store>) {
    let missing = JobId::new();
    assert!(matches!(
        store.get_replay_job(&missing).await,
        Err(StoreError::NotFound)
    ));
    assert!(matches!(
        store.cancel_replay_job(&missing).await,
        Err(StoreError::NotFound)
    ));
    assert!(matches!(
        store.step_replay_job(&missing, 5).await,
        Err(StoreError::NotFound)
    ));
    let a = store
        .create_subscription(new_sub("job-missing.example", None))
        .await
        .unwrap();
    let absent = job_for(&store.get_subscription(&a.id).await.unwrap(), &[]);
    let absent = NewReplayJob {
        sub_id: SubscriptionId::new(),
        ..absent
    };
    assert!(matches!(
        store.create_replay_job(absent.clone()).await,
        Err(StoreError::NotFound)
    ));
    store.delete_subscription(&a.id).await.unwrap();
    let deleted = job_for(&a, &[DeliveryState::Dead]);
    assert!(matches!(
        store.create_replay_job(deleted.clone()).await,
        Err(StoreError::NotFound)
    ));
    for id in [absent.id, deleted.id] {
        assert!(matches!(
            store.get_replay_job(&id).await,
            Err(StoreError::NotFound)
        ));
    }
}

pub async fn running_replay_jobs_lists_running_jobs_oldest_first(store: Arc<dyn Store>) {
    let a = store
        .create_subscription(new_sub("job-list.example", None))
        .await
        .unwrap();
    dead_deliveries(&store, &a, 1).await;
    let mut jobs = Vec::new();
    for _ in 0..3 {
        jobs.push(
            store
                .create_replay_job(job_for(&a, &[DeliveryState::Dead]))
                .await
                .unwrap(),
        );
    }
    assert_eq!(store.running_replay_jobs(10).await.unwrap(), jobs);
    assert_eq!(store.running_replay_jobs(2).await.unwrap(), jobs[..2]);
    store.cancel_replay_job(&jobs[1].id).await.unwrap();
    let ids = |jobs: Vec<ReplayJob>| jobs.into_iter().map(|j| j.id).collect::<Vec<_>>();
    assert_eq!(
        ids(store.running_replay_jobs(10).await.unwrap()),
        [jobs[0].id, jobs[2].id]
    );
    assert_eq!(
        ids(store.running_replay_jobs(1).await.unwrap()),
        [jobs[0].id]
    );
}

// --- signals -------------------------------------------------------------------

/// The system event announcing `kind`, fanned out to `to`.
fn notice(kind: SignalKind, key: Option<&str>, to: &[&Subscription]) -> Notice {
    Notice {
        event: new_event(kind.event_type().as_str(), key),
        deliveries: to.iter().map(|s| delivery_to(s)).collect(),
    }
}

/// Whether an event exists.
async fn event_exists(store: &Arc<dyn Store>, id: &EventId) -> bool {
    match store.get_event(id).await {
        Ok(_) => true,
        Err(StoreError::NotFound) => false,
        Err(e) => panic!("{e:?}"),
    }
}

/// Whether a delivery exists.
async fn delivery_exists(store: &Arc<dyn Store>, id: &DeliveryId) -> bool {
    match store.get_delivery(id).await {
        Ok(_) => true,
        Err(StoreError::NotFound) => false,
        Err(e) => panic!("{e:?}"),
    }
}

/// Raised signals as `(subscription, kind, detail)`, in the order listed.
async fn raised(
    store: &Arc<dyn Store>,
    kind: Option<SignalKind>,
) -> Vec<(SubscriptionId, SignalKind, String)> {
    store
        .raised_signals(kind)
        .await
        .unwrap()
        .into_iter()
        .map(|s| (s.sub_id, s.kind, s.detail))
        .collect()
}

pub async fn a_signal_is_raised_once_per_detail_with_its_notice(store: Arc<dyn Store>) {
    let a = store
        .create_subscription(new_sub("signal-a.example", None))
        .await
        .unwrap();
    let ops = store
        .create_subscription(new_sub("signal-ops.example", None))
        .await
        .unwrap();
    let kind = SignalKind::DeadLettering;

    // Raised with its announcement, which is accepted as accept_event would
    // (the event and its deliveries, pending).
    let first = notice(kind, Some("sig-a-dead-3"), &[&ops]);
    assert!(
        store
            .raise_signal(&a.id, kind, "3 dead", Some(first.clone()))
            .await
            .unwrap()
    );
    let event = store.get_event(&first.event.id).await.unwrap();
    assert_eq!(event.event_type, kind.event_type());
    assert_eq!(event.idempotency_key.as_deref(), Some("sig-a-dead-3"));
    let d = store
        .get_delivery(&first.deliveries[0].id)
        .await
        .unwrap()
        .delivery;
    assert_eq!((d.event_id, d.sub_id), (first.event.id, ops.id));
    assert_eq!(d.state, DeliveryState::Pending);
    assert_eq!(raised(&store, None).await, [(a.id, kind, "3 dead".into())]);
    let raised_at = store.raised_signals(None).await.unwrap()[0].raised_at;

    // Raised already with that detail: nothing happens, its notice included.
    let again = notice(kind, Some("sig-a-dead-3"), &[&ops]);
    assert!(
        !store
            .raise_signal(&a.id, kind, "3 dead", Some(again.clone()))
            .await
            .unwrap()
    );
    assert!(!event_exists(&store, &again.event.id).await);
    assert!(!delivery_exists(&store, &again.deliveries[0].id).await);
    let other = notice(kind, Some("sig-a-dead-3-other"), &[&ops]);
    assert!(
        !store
            .raise_signal(&a.id, kind, "3 dead", Some(other.clone()))
            .await
            .unwrap()
    );
    assert!(!event_exists(&store, &other.event.id).await);
    let signals = store.raised_signals(None).await.unwrap();
    assert_eq!(signals.len(), 1);
    assert_eq!(signals[0].raised_at, raised_at, "untouched");

    // A new detail raises it again, with a new announcement…
    let worse = notice(kind, Some("sig-a-dead-9"), &[&ops]);
    assert!(
        store
            .raise_signal(&a.id, kind, "9 dead", Some(worse.clone()))
            .await
            .unwrap()
    );
    assert!(event_exists(&store, &worse.event.id).await);
    assert_eq!(raised(&store, None).await, [(a.id, kind, "9 dead".into())]);
    // …whose idempotency key is honoured: a key already taken writes no
    // second event, yet the signal is raised.
    let replayed_key = notice(kind, Some("sig-a-dead-3"), &[&ops]);
    assert!(
        store
            .raise_signal(&a.id, kind, "3 dead", Some(replayed_key.clone()))
            .await
            .unwrap()
    );
    assert!(!event_exists(&store, &replayed_key.event.id).await);
    assert!(!delivery_exists(&store, &replayed_key.deliveries[0].id).await);
    assert_eq!(raised(&store, None).await, [(a.id, kind, "3 dead".into())]);
    // Without a notice.
    assert!(
        store
            .raise_signal(&a.id, SignalKind::Shedding, "12000 pending", None)
            .await
            .unwrap()
    );
    let announced = store
        .list_deliveries(&DeliveryQuery {
            sub_id: Some(ops.id),
            limit: 100,
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(announced.len(), 2, "the first and the worse notice only");
}

pub async fn concurrent_raises_of_one_signal_raise_it_once_and_accept_one_notice(
    store: Arc<dyn Store>,
) {
    let a = store
        .create_subscription(new_sub("signal-race.example", None))
        .await
        .unwrap();
    let ops = store
        .create_subscription(new_sub("signal-race-ops.example", None))
        .await
        .unwrap();
    let kind = SignalKind::ConfigurationError;
    // No idempotency key: only the signal itself can keep the others out.
    let notices: Vec<Notice> = (0..12).map(|_| notice(kind, None, &[&ops])).collect();
    let tasks: Vec<_> = notices
        .iter()
        .cloned()
        .map(|n| {
            let store = store.clone();
            let sub = a.id;
            tokio::spawn(async move {
                store
                    .raise_signal(&sub, kind, "401", Some(n))
                    .await
                    .unwrap()
            })
        })
        .collect();
    let raised_by: Vec<bool> = futures::future::join_all(tasks)
        .await
        .into_iter()
        .map(|r| r.unwrap())
        .collect();
    assert_eq!(raised_by.iter().filter(|r| **r).count(), 1, "{raised_by:?}");
    let mut accepted = Vec::new();
    for (n, won) in notices.iter().zip(&raised_by) {
        let exists = event_exists(&store, &n.event.id).await;
        assert_eq!(exists, *won, "only the raiser's notice is accepted");
        if exists {
            accepted.push(n.event.id);
        }
    }
    assert_eq!(accepted.len(), 1);
    let announced = store
        .list_deliveries(&DeliveryQuery {
            sub_id: Some(ops.id),
            limit: 100,
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(announced.len(), 1, "announced exactly once");
}

pub async fn raising_disabled_disables_the_subscription_and_reenabling_lowers_it(
    store: Arc<dyn Store>,
) {
    let a = store
        .create_subscription(new_sub("signal-gone.example", None))
        .await
        .unwrap();
    let generation = store.subscription_generation().await.unwrap();
    assert!(
        store
            .raise_signal(&a.id, SignalKind::Disabled, "HTTP 410 Gone", None)
            .await
            .unwrap()
    );
    assert_eq!(
        store.get_subscription(&a.id).await.unwrap().state,
        SubscriptionState::Disabled
    );
    assert_ne!(
        store.subscription_generation().await.unwrap(),
        generation,
        "the fan-out index must learn of it"
    );
    assert!(
        !store
            .raise_signal(&a.id, SignalKind::Disabled, "HTTP 410 Gone", None)
            .await
            .unwrap()
    );
    assert_eq!(
        raised(&store, Some(SignalKind::Disabled)).await,
        [(a.id, SignalKind::Disabled, "HTTP 410 Gone".into())]
    );

    // Enabling it again lowers the signal, so a later disable is announced.
    let enabled = store
        .update_subscription(
            &a.id,
            SubscriptionPatch {
                state: Some(SubscriptionState::Active),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    assert_eq!(enabled.state, SubscriptionState::Active);
    assert!(raised(&store, Some(SignalKind::Disabled)).await.is_empty());
    assert!(
        !store
            .lower_signal(&a.id, SignalKind::Disabled)
            .await
            .unwrap()
    );
    assert!(
        store
            .raise_signal(&a.id, SignalKind::Disabled, "HTTP 410 Gone", None)
            .await
            .unwrap()
    );
    assert_eq!(
        store.get_subscription(&a.id).await.unwrap().state,
        SubscriptionState::Disabled
    );

    // Other patches leave it raised, and other signals are not lowered by
    // enabling.
    let b = store
        .create_subscription(new_sub("signal-gone-b.example", None))
        .await
        .unwrap();
    assert!(
        store
            .raise_signal(&b.id, SignalKind::Shedding, "9000 pending", None)
            .await
            .unwrap()
    );
    store
        .update_subscription(
            &a.id,
            SubscriptionPatch {
                description: Some(Some("gone".into())),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    store
        .update_subscription(
            &b.id,
            SubscriptionPatch {
                state: Some(SubscriptionState::Active),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    assert_eq!(
        raised(&store, None).await,
        [
            (a.id, SignalKind::Disabled, "HTTP 410 Gone".into()),
            (b.id, SignalKind::Shedding, "9000 pending".into()),
        ]
    );
}

pub async fn lowering_a_signal_says_whether_it_was_raised(store: Arc<dyn Store>) {
    let a = store
        .create_subscription(new_sub("signal-lower.example", None))
        .await
        .unwrap();
    let kind = SignalKind::DeadLettering;
    assert!(!store.lower_signal(&a.id, kind).await.unwrap());
    assert!(
        store
            .raise_signal(&a.id, kind, "1 dead", None)
            .await
            .unwrap()
    );
    assert!(store.lower_signal(&a.id, kind).await.unwrap());
    assert!(!store.lower_signal(&a.id, kind).await.unwrap());
    assert!(raised(&store, None).await.is_empty());
    // Lowered, the same detail raises it again.
    assert!(
        store
            .raise_signal(&a.id, kind, "1 dead", None)
            .await
            .unwrap()
    );
    assert!(
        !store
            .lower_signal(&a.id, SignalKind::Shedding)
            .await
            .unwrap()
    );
    assert_eq!(raised(&store, None).await, [(a.id, kind, "1 dead".into())]);
}

/// "Ordered by kind" is [`SignalKind`]'s own order (its `Ord`, the order
/// the variants are declared in), not the alphabetical order of the names.
pub async fn raised_signals_filter_by_kind_and_omit_deleted_subscriptions(store: Arc<dyn Store>) {
    use SignalKind::{ConfigurationError, DeadLettering, Disabled, Shedding};
    let a = store
        .create_subscription(new_sub("signal-list-a.example", None))
        .await
        .unwrap();
    let b = store
        .create_subscription(new_sub("signal-list-b.example", None))
        .await
        .unwrap();
    let c = store
        .create_subscription(new_sub("signal-list-c.example", None))
        .await
        .unwrap();
    for (sub, kind, detail) in [
        (&b, Shedding, "9000 pending"),
        (&a, Shedding, "12000 pending"),
        (&a, ConfigurationError, "401"),
        (&a, DeadLettering, "2 dead"),
        (&a, Disabled, "HTTP 410 Gone"),
        (&c, DeadLettering, "1 dead"),
    ] {
        assert!(
            store
                .raise_signal(&sub.id, kind, detail, None)
                .await
                .unwrap()
        );
    }
    let want_a = vec![
        (a.id, Disabled, "HTTP 410 Gone".to_owned()),
        (a.id, DeadLettering, "2 dead".to_owned()),
        (a.id, ConfigurationError, "401".to_owned()),
        (a.id, Shedding, "12000 pending".to_owned()),
    ];
    let mut want = want_a.clone();
    want.push((b.id, Shedding, "9000 pending".into()));
    want.push((c.id, DeadLettering, "1 dead".into()));
    assert_eq!(raised(&store, None).await, want);
    assert_eq!(
        raised(&store, Some(Shedding)).await,
        [
            (a.id, Shedding, "12000 pending".into()),
            (b.id, Shedding, "9000 pending".into()),
        ]
    );
    assert!(raised(&store, Some(Disabled)).await.len() == 1);

    // The health of a subscription shows its own, by kind.
    let health = store.subscription_health(&a.id, last_hour()).await.unwrap();
    assert_eq!(
        health
            .signals
            .iter()
            .map(|s| (s.sub_id, s.kind, s.detail.clone()))
            .collect::<Vec<_>>(),
        want_a
    );
    let health = store.subscription_health(&b.id, last_hour()).await.unwrap();
    assert_eq!(health.signals.len(), 1);
    assert_eq!(
        health.signals[0],
        store.raised_signals(Some(Shedding)).await.unwrap()[1]
    );

    store.delete_subscription(&c.id).await.unwrap();
    assert_eq!(raised(&store, None).await, want[..5]);
    assert!(raised(&store, Some(DeadLettering)).await.len() == 1);
}

pub async fn raising_a_signal_for_a_missing_or_deleted_subscription_is_not_found(
    store: Arc<dyn Store>,
) {
    let ops = store
        .create_subscription(new_sub("signal-missing-ops.example", None))
        .await
        .unwrap();
    let a = store
        .create_subscription(new_sub("signal-missing.example", None))
        .await
        .unwrap();
    store.delete_subscription(&a.id).await.unwrap();
    for sub in [SubscriptionId::new(), a.id] {
        let n = notice(SignalKind::Disabled, None, &[&ops]);
        assert!(matches!(
            store
                .raise_signal(&sub, SignalKind::Disabled, "HTTP 410 Gone", Some(n.clone()))
                .await,
            Err(StoreError::NotFound)
        ));
        assert!(!event_exists(&store, &n.event.id).await, "nothing accepted");
    }
    assert!(raised(&store, None).await.is_empty());
}

pub async fn backlogs_count_unfinished_deliveries_of_live_subscriptions(store: Arc<dyn Store>) {
    let a = store
        .create_subscription(new_sub("backlog-a.example", None))
        .await
        .unwrap();
    let b = store
        .create_subscription(new_sub("backlog-b.example", None))
        .await
        .unwrap();
    let disabled = store
        .create_subscription(new_sub("backlog-off.example", None))
        .await
        .unwrap();
    let deleted = store
        .create_subscription(new_sub("backlog-gone.example", None))
        .await
        .unwrap();
    assert!(store.backlogs().await.unwrap().is_empty());
    // a: one delivered, one in flight, two pending (one waiting to retry).
    delivery_ending(&store, &a, "order.created", &[(200, NextState::Delivered)]).await;
    delivery_ending(
        &store,
        &a,
        "order.created",
        &[(503, NextState::Retry { delay: LONG })],
    )
    .await;
    ingest_one(&store, &a, "order.created").await;
    claim_all_of(&store, &a).await;
    ingest_one(&store, &a, "order.created").await;
    // b: finished only.
    delivery_ending(&store, &b, "order.created", &[(500, NextState::Dead)]).await;
    // disabled: still a backlog. deleted: not listed.
    for s in [&disabled, &deleted] {
        ingest_one(&store, s, "order.created").await;
        ingest_one(&store, s, "order.created").await;
    }
    store
        .update_subscription(
            &disabled.id,
            SubscriptionPatch {
                state: Some(SubscriptionState::Disabled),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    store.delete_subscription(&deleted.id).await.unwrap();

    let mut got = store.backlogs().await.unwrap();
    got.sort_by_key(|b| b.sub_id);
    let mut want = vec![
        Backlog {
            sub_id: a.id,
            unfinished: 3,
        },
        Backlog {
            sub_id: disabled.id,
            unfinished: 2,
        },
    ];
    want.sort_by_key(|b| b.sub_id);
    assert_eq!(got, want);
}

pub async fn due_work_counts_due_pending_deliveries_of_active_subscriptions(store: Arc<dyn Store>) {
    assert_eq!(store.due_work().await.unwrap(), DueWork::default());
    let a = store
        .create_subscription(new_sub("due-a.example", None))
        .await
        .unwrap();
    let disabled = store
        .create_subscription(new_sub("due-off.example", None))
        .await
        .unwrap();
    // a: one delivered, one waiting to retry, one in flight: none due.
    delivery_ending(&store, &a, "order.created", &[(200, NextState::Delivered)]).await;
    delivery_ending(
        &store,
        &a,
        "order.created",
        &[(503, NextState::Retry { delay: LONG })],
    )
    .await;
    ingest_one(&store, &a, "order.created").await;
    claim_all_of(&store, &a).await;
    assert_eq!(store.due_work().await.unwrap(), DueWork::default());
    // Two pending and due now; a disabled subscription's are not due work.
    ingest_one(&store, &a, "order.created").await;
    ingest_one(&store, &a, "order.created").await;
    ingest_one(&store, &disabled, "order.created").await;
    store
        .update_subscription(
            &disabled.id,
            SubscriptionPatch {
                state: Some(SubscriptionState::Disabled),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    let got = store.due_work().await.unwrap();
    assert_eq!(got.due, 2, "{got:?}");
}

pub async fn a_migrated_schema_is_current(store: Arc<dyn Store>) {
    assert_eq!(store.schema_status().await.unwrap(), SchemaStatus::Current);
    store.migrate().await.unwrap();
    assert_eq!(store.schema_status().await.unwrap(), SchemaStatus::Current);
}

// --- failing streaks -----------------------------------------------------------

/// A time `minutes` before now, on the caller's clock.
fn minutes_ago(minutes: i64) -> Timestamp {
    chrono::Utc::now() - chrono::Duration::minutes(minutes)
}

/// Records an attempt started at `started_at` on a claimed delivery.
async fn record_at(
    store: &Arc<dyn Store>,
    c: &ClaimedDelivery,
    status: u16,
    started_at: Timestamp,
    next: NextState,
) -> RecordOutcome {
    let mut a = attempt(c.delivery.attempt + 1, Some(status));
    a.started_at = started_at;
    store
        .record_attempt(AttemptRecord {
            lease: c.lease,
            attempt: a,
            next,
            last_error: None,
        })
        .await
        .unwrap()
}

async fn failing(store: &Arc<dyn Store>, started_at_or_before: Timestamp) -> Vec<SubscriptionId> {
    let mut got = store
        .failing_subscriptions(started_at_or_before)
        .await
        .unwrap();
    got.sort();
    got
}

pub async fn a_failing_streak_starts_at_the_first_failure_and_ends_at_a_delivery(
    store: Arc<dyn Store>,
) {
    let retry = NextState::Retry {
        delay: Duration::ZERO,
    };
    let a = store
        .create_subscription(new_sub("streak-a.example", None))
        .await
        .unwrap();
    let healthy = store
        .create_subscription(new_sub("streak-ok.example", None))
        .await
        .unwrap();
    assert!(failing(&store, chrono::Utc::now()).await.is_empty());
    delivery_ending(
        &store,
        &healthy,
        "order.created",
        &[(200, NextState::Delivered)],
    )
    .await;

    // The streak begins with the first failure…
    let d = ingest_one(&store, &a, "order.created").await;
    let c = claim_one(&store, "streak-a.example").await;
    assert_eq!(c.delivery.id, d);
    let began = minutes_ago(30);
    record_at(&store, &c, 500, began, retry.clone()).await;
    assert_eq!(failing(&store, minutes_ago(10)).await, [a.id]);
    assert_eq!(failing(&store, began).await, [a.id], "at or before");
    assert!(failing(&store, minutes_ago(40)).await.is_empty(), "not yet");
    // …and later failures (of any kind) do not move it.
    let c = claim_one(&store, "streak-a.example").await;
    record_at(&store, &c, 500, minutes_ago(5), retry.clone()).await;
    let dead = ingest_one(&store, &a, "order.created").await;
    let c = claim_all_of(&store, &a).await;
    assert_eq!(c.len(), 2);
    for c in &c {
        let next = if c.delivery.id == dead {
            NextState::Dead
        } else {
            retry.clone()
        };
        record_at(&store, c, 400, minutes_ago(4), next).await;
    }
    assert_eq!(failing(&store, began).await, [a.id]);

    // A delivery ends it.
    let c = claim_one(&store, "streak-a.example").await;
    record_at(&store, &c, 200, minutes_ago(3), NextState::Delivered).await;
    assert!(failing(&store, chrono::Utc::now()).await.is_empty());

    // The next failure starts a new one.
    let again = minutes_ago(2);
    delivery_ending(&store, &a, "order.created", &[]).await;
    let c = claim_one(&store, "streak-a.example").await;
    record_at(&store, &c, 503, again, NextState::Failed).await;
    assert_eq!(failing(&store, chrono::Utc::now()).await, [a.id]);
    assert!(failing(&store, minutes_ago(10)).await.is_empty());

    // A disabled subscription is not listed.
    store
        .update_subscription(
            &a.id,
            SubscriptionPatch {
                state: Some(SubscriptionState::Disabled),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    assert!(failing(&store, chrono::Utc::now()).await.is_empty());

    // Re-enabled (the customer says it is fixed): the streak is over, and a
    // new one starts with the next failure, so an automatic disable counts
    // its period from here rather than at once.
    let enable = || SubscriptionPatch {
        state: Some(SubscriptionState::Active),
        ..Default::default()
    };
    store.update_subscription(&a.id, enable()).await.unwrap();
    assert!(failing(&store, chrono::Utc::now()).await.is_empty());
    delivery_ending(&store, &a, "order.created", &[]).await;
    let c = claim_one(&store, "streak-a.example").await;
    let next = minutes_ago(1);
    record_at(&store, &c, 500, next, NextState::Failed).await;
    assert_eq!(failing(&store, next).await, [a.id]);
    assert!(failing(&store, minutes_ago(2)).await.is_empty());
    // Setting an active subscription active again changes nothing.
    store.update_subscription(&a.id, enable()).await.unwrap();
    assert_eq!(failing(&store, next).await, [a.id]);
}

pub async fn failing_streaks_count_attempts_whose_lease_was_lost(store: Arc<dyn Store>) {
    let a = store
        .create_subscription(new_sub("streak-lost.example", None))
        .await
        .unwrap();
    ingest_one(&store, &a, "order.created").await;
    // Claimed, then released: the lease is lost, but the attempt happened.
    let zombie = claim_one(&store, "streak-lost.example").await;
    assert_eq!(store.release(&[zombie.lease]).await.unwrap(), 1);
    let began = minutes_ago(20);
    assert_eq!(
        record_at(&store, &zombie, 500, began, NextState::Dead).await,
        RecordOutcome::LeaseLost
    );
    assert_eq!(failing(&store, minutes_ago(10)).await, [a.id]);
    // A delivered attempt ends the streak, lease or not.
    let fresh = claim_one(&store, "streak-lost.example").await;
    assert_eq!(
        record_at(&store, &zombie, 200, minutes_ago(1), NextState::Delivered).await,
        RecordOutcome::LeaseLost
    );
    assert!(failing(&store, chrono::Utc::now()).await.is_empty());
    assert_eq!(
        record_at(&store, &fresh, 500, minutes_ago(1), NextState::Dead).await,
        RecordOutcome::Recorded
    );
    assert_eq!(failing(&store, chrono::Utc::now()).await, [a.id]);
}

// --- the daily rollup and retention --------------------------------------------

/// Midday (UTC) `days_ago` days before today, on the caller's clock.
fn midday(days_ago: u64) -> Timestamp {
    (chrono::Utc::now().date_naive() - chrono::Days::new(days_ago))
        .and_hms_opt(12, 0, 0)
        .unwrap()
        .and_utc()
}

/// Records an attempt with `status`, started at `started_at`, lasting `ms`.
async fn record_timed(
    store: &Arc<dyn Store>,
    c: &ClaimedDelivery,
    status: u16,
    started_at: Timestamp,
    ms: u64,
    next: NextState,
) -> RecordOutcome {
    let mut a = attempt(c.delivery.attempt + 1, Some(status));
    a.started_at = started_at;
    a.duration = Duration::from_millis(ms);
    store
        .record_attempt(AttemptRecord {
            lease: c.lease,
            attempt: a,
            next,
            last_error: None,
        })
        .await
        .unwrap()
}

fn day_stats(
    at: Timestamp,
    attempts: u64,
    (delivered, failed, dead): (u64, u64, u64),
    latency_ms: &[(u64, u64)],
) -> DailyStats {
    DailyStats {
        day: at.date_naive(),
        attempts,
        delivered,
        failed,
        dead,
        latency_ms: latency_ms.to_vec(),
    }
}

/// Four finished deliveries of `sub` (which must have nothing else due),
/// with attempts three and one days ago, and the rollup they make:
/// one retried then delivered, one failed, one dead, and one whose first
/// attempt's lease was lost (released before its result came) and whose
/// second delivered.
async fn finished_history(
    store: &Arc<dyn Store>,
    sub: &Subscription,
) -> (Vec<DeliveryId>, Vec<DailyStats>) {
    let host = sub.url.host().to_owned();
    let (day3, day1) = (midday(3), midday(1));
    let hour = chrono::Duration::hours(1);
    let mut ids = Vec::new();

    ids.push(ingest_one(store, sub, "order.created").await);
    let c = claim_one(store, &host).await;
    let retry = NextState::Retry {
        delay: Duration::ZERO,
    };
    record_timed(store, &c, 500, day3, 12, retry).await;
    let c = claim_one(store, &host).await;
    record_timed(store, &c, 200, day1, 40, NextState::Delivered).await;

    ids.push(ingest_one(store, sub, "order.created").await);
    let c = claim_one(store, &host).await;
    record_timed(store, &c, 400, day1 + hour, 12, NextState::Failed).await;

    ids.push(ingest_one(store, sub, "order.created").await);
    let c = claim_one(store, &host).await;
    record_timed(store, &c, 500, day1 + hour * 2, 7, NextState::Dead).await;

    ids.push(ingest_one(store, sub, "order.created").await);
    let zombie = claim_one(store, &host).await;
    assert_eq!(store.release(&[zombie.lease]).await.unwrap(), 1);
    let c = claim_one(store, &host).await;
    assert_eq!(
        record_timed(store, &zombie, 200, day3 + hour, 12, NextState::Delivered).await,
        RecordOutcome::LeaseLost
    );
    record_timed(store, &c, 200, day3 + hour * 2, 40, NextState::Delivered).await;

    // Day 3: the retried 500, the lost lease's 200 (an attempt, but it
    // caused no outcome, so it is in none of delivered/failed/dead), the
    // delivered 200. Day 1: delivered, failed, dead.
    let stats = vec![
        day_stats(day3, 3, (1, 0, 0), &[(12, 2), (40, 1)]),
        day_stats(day1, 3, (1, 1, 1), &[(7, 1), (12, 1), (40, 1)]),
    ];
    (ids, stats)
}

/// The daily rollup of `sub` from a week ago.
async fn week_of_stats(store: &Arc<dyn Store>, sub: &SubscriptionId) -> Vec<DailyStats> {
    let since = chrono::Utc::now().date_naive() - chrono::Days::new(7);
    store.daily_stats(sub, since).await.unwrap()
}

/// A policy under which everything stored now has expired.
fn expire_everything(batch: u32) -> RetentionPolicy {
    let later = chrono::Utc::now() + chrono::Duration::days(2);
    RetentionPolicy {
        deliveries_before: later,
        events_before: later,
        batch,
    }
}

/// Runs retention until it says nothing more is due; returns each call's
/// report.
async fn retain_all(store: &Arc<dyn Store>, policy: &RetentionPolicy) -> Vec<RetentionReport> {
    let mut reports = Vec::new();
    loop {
        let r = store.enforce_retention(policy).await.unwrap();
        reports.push(r);
        if !r.more {
            return reports;
        }
        assert!(reports.len() < 1000, "retention never finishes");
    }
}

/// The reports summed: `(deliveries, attempts, events)`.
fn removed(reports: &[RetentionReport]) -> (u64, u64, u64) {
    reports.iter().fold((0, 0, 0), |(d, a, e), r| {
        (d + r.deliveries, a + r.attempts, e + r.events)
    })
}

/// The rollup counts every attempt on the UTC day it started, with
/// `delivered`/`failed`/`dead` by the outcome the attempt caused: a retry
/// is in none of them, and so is an attempt whose lease was lost (its
/// result moved nothing), whatever its status.
pub async fn daily_stats_count_attempts_by_day_and_the_outcome_they_caused(store: Arc<dyn Store>) {
    let a = store
        .create_subscription(new_sub("stats-a.example", None))
        .await
        .unwrap();
    let b = store
        .create_subscription(new_sub("stats-b.example", None))
        .await
        .unwrap();
    let (_, mut want) = finished_history(&store, &a).await;
    // A retry that is still waiting counts as an attempt.
    ingest_one(&store, &a, "order.created").await;
    let c = claim_one(&store, "stats-a.example").await;
    let retry = NextState::Retry { delay: LONG };
    record_timed(
        &store,
        &c,
        503,
        midday(3) + chrono::Duration::hours(3),
        5,
        retry,
    )
    .await;
    want[0] = day_stats(midday(3), 4, (1, 0, 0), &[(5, 1), (12, 2), (40, 1)]);
    // Another subscription's attempts are its own.
    ingest_one(&store, &b, "order.created").await;
    let c = claim_one(&store, "stats-b.example").await;
    record_timed(&store, &c, 200, midday(1), 99, NextState::Delivered).await;

    assert_eq!(week_of_stats(&store, &a.id).await, want);
    assert_eq!(
        store
            .daily_stats(&a.id, midday(1).date_naive())
            .await
            .unwrap(),
        want[1..],
        "from since_day on"
    );
    assert_eq!(
        week_of_stats(&store, &b.id).await,
        [day_stats(midday(1), 1, (1, 0, 0), &[(99, 1)])]
    );
    assert!(
        week_of_stats(&store, &SubscriptionId::new())
            .await
            .is_empty()
    );
    // Kept for a deleted subscription (whose pending retry the delete
    // failed, without an attempt).
    store.delete_subscription(&a.id).await.unwrap();
    assert_eq!(week_of_stats(&store, &a.id).await, want);
}

pub async fn retention_removes_finished_deliveries_and_folds_their_attempts_into_the_rollup(
    store: Arc<dyn Store>,
) {
    let a = store
        .create_subscription(new_sub("retain-a.example", None))
        .await
        .unwrap();
    let b = store
        .create_subscription(new_sub("retain-b.example", None))
        .await
        .unwrap();
    let (mut ids, want) = finished_history(&store, &a).await;
    ids.push(delivery_ending(&store, &b, "order.created", &[(200, NextState::Delivered)]).await);
    let mut events = Vec::new();
    for id in &ids {
        events.push(store.get_delivery(id).await.unwrap().delivery.event_id);
    }
    let orphan = store
        .accept_event(new_event("nobody.listens", None), vec![])
        .await
        .unwrap()
        .event_id;
    assert_eq!(week_of_stats(&store, &a.id).await, want);
    let b_stats = week_of_stats(&store, &b.id).await;
    assert_eq!(b_stats.len(), 1);

    let reports = retain_all(&store, &expire_everything(1000)).await;
    assert_eq!(
        removed(&reports),
        (5, 7, 6),
        "every finished delivery, its attempts, and every event: {reports:?}"
    );
    for id in &ids {
        assert!(!delivery_exists(&store, id).await);
        assert!(matches!(
            store.replay_delivery(id).await,
            Err(StoreError::NotFound)
        ));
    }
    for id in events.iter().chain([&orphan]) {
        assert!(!event_exists(&store, id).await);
    }
    // The fold: the rollup reads the same.
    assert_eq!(week_of_stats(&store, &a.id).await, want);
    assert_eq!(week_of_stats(&store, &b.id).await, b_stats);
    // Nothing left to do.
    let r = store
        .enforce_retention(&expire_everything(1000))
        .await
        .unwrap();
    assert_eq!(
        (r.deliveries, r.attempts, r.events, r.more),
        (0, 0, 0, false)
    );
    // Kept forever, also once the subscription is deleted.
    store.delete_subscription(&a.id).await.unwrap();
    assert_eq!(week_of_stats(&store, &a.id).await, want);
    // New attempts add to the folded days.
    let c = {
        ingest_one(&store, &b, "order.created").await;
        claim_one(&store, "retain-b.example").await
    };
    record_timed(&store, &c, 200, midday(1), 99, NextState::Delivered).await;
    assert_eq!(
        week_of_stats(&store, &b.id).await,
        [
            day_stats(midday(1), 1, (1, 0, 0), &[(99, 1)]),
            b_stats[0].clone()
        ],
        "b's first attempt was today"
    );
}

/// What both backends guarantee about unfinished deliveries: they, their
/// attempts and their events stay, whatever their age, and stay usable
/// (a live lease still records). Finished deliveries stored beside them
/// may stay too (PostgreSQL drops whole day partitions only), so nothing
/// is asserted of them here but the rollup.
pub async fn retention_never_removes_unfinished_deliveries_or_the_events_they_need(
    store: Arc<dyn Store>,
) {
    let a = store
        .create_subscription(new_sub("retain-keep.example", None))
        .await
        .unwrap();
    let host = "retain-keep.example";
    let retrying = ingest_one(&store, &a, "order.created").await;
    let c = claim_one(&store, host).await;
    let retry = NextState::Retry { delay: LONG };
    record_timed(&store, &c, 503, midday(2), 30, retry).await;
    delivery_ending(&store, &a, "order.created", &[(200, NextState::Delivered)]).await;
    let inflight = ingest_one(&store, &a, "order.created").await;
    let held = claim_one(&store, host).await;
    assert_eq!(held.delivery.id, inflight);
    let pending = ingest_one(&store, &a, "order.created").await;
    let orphan = store
        .accept_event(new_event("nobody.listens", None), vec![])
        .await
        .unwrap()
        .event_id;
    let mut before = Vec::new();
    for id in [retrying, inflight, pending] {
        before.push(store.get_delivery(&id).await.unwrap());
    }
    let stats = week_of_stats(&store, &a.id).await;

    let reports = retain_all(&store, &expire_everything(1000)).await;
    assert!(removed(&reports).1 <= 1, "at most the delivered attempt");
    for d in &before {
        assert_eq!(
            &store.get_delivery(&d.delivery.id).await.unwrap(),
            d,
            "kept as it was, attempts included"
        );
        assert!(event_exists(&store, &d.delivery.event_id).await);
    }
    assert!(!event_exists(&store, &orphan).await, "no delivery needs it");
    assert_eq!(week_of_stats(&store, &a.id).await, stats);

    // Still usable: the live lease records, the pending one is claimed.
    assert_eq!(
        record_timed(&store, &held, 200, midday(0), 8, NextState::Delivered).await,
        RecordOutcome::Recorded
    );
    let c = claim_one(&store, host).await;
    assert_eq!(c.delivery.id, pending);
    finish(&store, &c, 200, NextState::Delivered).await;
    assert_eq!(
        store.get_delivery(&retrying).await.unwrap().delivery.state,
        DeliveryState::Pending
    );
}

/// A backend that deletes rows (reports no dropped partitions) removes at
/// most `batch` rows of each table per call and says when more is due.
pub async fn retention_in_small_batches_says_when_more_is_due(store: Arc<dyn Store>) {
    let a = store
        .create_subscription(new_sub("retain-batch.example", None))
        .await
        .unwrap();
    let mut ids = Vec::new();
    for _ in 0..3 {
        ids.push(
            delivery_ending(&store, &a, "order.created", &[(200, NextState::Delivered)]).await,
        );
    }
    store
        .accept_event(new_event("nobody.listens", None), vec![])
        .await
        .unwrap();
    let stats = week_of_stats(&store, &a.id).await;
    assert_eq!(stats.len(), 1);
    assert_eq!(stats[0].attempts, 3);

    let reports = retain_all(&store, &expire_everything(1)).await;
    for r in &reports {
        if r.partitions_dropped == 0 {
            assert!(
                r.deliveries <= 1 && r.attempts <= 1 && r.events <= 1,
                "{reports:?}"
            );
        }
    }
    assert!(!reports.last().unwrap().more);
    assert_eq!(removed(&reports), (3, 3, 4), "{reports:?}");
    for id in &ids {
        assert!(!delivery_exists(&store, id).await);
    }
    assert_eq!(week_of_stats(&store, &a.id).await, stats);
}

/// Deliveries (with their attempts) and events have their own cutoffs
/// (7 and 30 days by default): a pass whose delivery cutoff is past and
/// whose event cutoff is not removes every finished delivery and its
/// attempts and keeps every event, also those no delivery refers to any
/// more; a later pass past the event cutoff removes those events.
pub async fn retention_removes_deliveries_and_their_attempts_before_the_events_outlive_them(
    store: Arc<dyn Store>,
) {
    let a = store
        .create_subscription(new_sub("retain-split.example", None))
        .await
        .unwrap();
    let retried = [
        (
            500,
            NextState::Retry {
                delay: Duration::ZERO,
            },
        ),
        (200, NextState::Delivered),
    ];
    let ids = [
        delivery_ending(&store, &a, "order.created", &retried).await,
        delivery_ending(&store, &a, "order.created", &[(400, NextState::Failed)]).await,
        delivery_ending(&store, &a, "order.created", &[(500, NextState::Dead)]).await,
    ];
    let mut events = Vec::new();
    let mut attempts = 0;
    for id in &ids {
        let d = store.get_delivery(id).await.unwrap();
        attempts += d.attempts.len();
        events.push(d.delivery.event_id);
    }
    assert_eq!(attempts, 4);
    events.push(
        store
            .accept_event(new_event("nobody.listens", None), vec![])
            .await
            .unwrap()
            .event_id,
    );
    let stats = week_of_stats(&store, &a.id).await;
    assert_eq!(stats.len(), 1);
    assert_eq!(stats[0].attempts, 4);

    // Deliveries expired, events (all created just now) inside their window.
    let now = chrono::Utc::now();
    let deliveries_only = RetentionPolicy {
        deliveries_before: now + chrono::Duration::days(2),
        events_before: now - chrono::Duration::days(1),
        batch: 1000,
    };
    let reports = retain_all(&store, &deliveries_only).await;
    assert_eq!(
        removed(&reports),
        (3, 4, 0),
        "every finished delivery and its attempts, no event: {reports:?}"
    );
    for id in &ids {
        assert!(!delivery_exists(&store, id).await);
    }
    for id in &events {
        assert!(
            event_exists(&store, id).await,
            "an event outlives its deliveries"
        );
    }
    assert_eq!(week_of_stats(&store, &a.id).await, stats, "folded");
    // Nothing more is due under the same cutoffs.
    let r = store.enforce_retention(&deliveries_only).await.unwrap();
    assert_eq!(
        (r.deliveries, r.attempts, r.events, r.more),
        (0, 0, 0, false)
    );

    // Once the event cutoff passes them, the events go too.
    let reports = retain_all(&store, &expire_everything(1000)).await;
    assert_eq!(removed(&reports), (0, 0, 4), "{reports:?}");
    for id in &events {
        assert!(!event_exists(&store, id).await);
    }
    assert_eq!(week_of_stats(&store, &a.id).await, stats);
}

// --- batched attempt records ----------------------------------------------------

/// A record of an attempt with `status`, started at `started_at`, on `c`.
fn record_of(
    c: &ClaimedDelivery,
    status: u16,
    started_at: Timestamp,
    next: NextState,
) -> AttemptRecord {
    let mut a = attempt(c.delivery.attempt + 1, Some(status));
    a.started_at = started_at;
    AttemptRecord {
        lease: c.lease,
        attempt: a,
        last_error: (status >= 300).then(|| format!("HTTP {status}")),
        next,
    }
}

/// Four claimed deliveries of `sub` and a record for each, in delivery
/// order: a retry, a delivery, a permanent failure, and a dead end whose
/// lease was lost (released before the record), with fixed start times.
async fn batch_scenario(
    store: &Arc<dyn Store>,
    sub: &Subscription,
    base: Timestamp,
) -> (Vec<DeliveryId>, Vec<AttemptRecord>) {
    for _ in 0..4 {
        ingest_one(store, sub, "order.created").await;
    }
    let claimed = claim_all_of(store, sub).await;
    assert_eq!(claimed.len(), 4);
    assert_eq!(store.release(&[claimed[3].lease]).await.unwrap(), 1);
    let at = |m: i64| base - chrono::Duration::minutes(m);
    let records = vec![
        record_of(&claimed[0], 500, at(30), NextState::Retry { delay: LONG }),
        record_of(&claimed[1], 200, at(25), NextState::Delivered),
        record_of(&claimed[2], 400, at(20), NextState::Failed),
        record_of(&claimed[3], 503, at(15), NextState::Dead),
    ];
    (claimed.iter().map(|c| c.delivery.id).collect(), records)
}

pub async fn record_attempts_fences_each_record_by_its_own_lease(store: Arc<dyn Store>) {
    let a = store
        .create_subscription(new_sub("batch-a.example", None))
        .await
        .unwrap();
    let (ids, records) = batch_scenario(&store, &a, chrono::Utc::now()).await;
    let outcomes = store.record_attempts(records).await.unwrap();
    assert_eq!(
        outcomes,
        [
            RecordOutcome::Recorded,
            RecordOutcome::Recorded,
            RecordOutcome::Recorded,
            RecordOutcome::LeaseLost
        ],
        "outcomes in input order, the lost lease alone LeaseLost"
    );
    let states = [
        DeliveryState::Pending,
        DeliveryState::Delivered,
        DeliveryState::Failed,
        DeliveryState::Pending,
    ];
    for (id, want) in ids.iter().zip(states) {
        let d = store.get_delivery(id).await.unwrap();
        assert_eq!(d.delivery.state, want, "{id}");
        assert_eq!(
            d.attempts.len(),
            1,
            "every attempt is written, lease or not"
        );
    }
    let lost = store.get_delivery(&ids[3]).await.unwrap().delivery;
    assert_eq!(
        lost.attempt, 0,
        "a lost lease leaves the delivery untouched"
    );
    assert_eq!(lost.last_status, None);
    let failed = store.get_delivery(&ids[2]).await.unwrap().delivery;
    assert_eq!(failed.attempt, 1);
    assert_eq!(failed.last_status, Some(400));
    assert_eq!(failed.last_error.as_deref(), Some("HTTP 400"));
    // The lost lease's delivery is claimable again and records as usual.
    let c = claim_all_of(&store, &a).await;
    assert_eq!(
        c.iter().map(|c| c.delivery.id).collect::<Vec<_>>(),
        [ids[3]]
    );
    assert_eq!(
        store
            .record_attempts(vec![record_of(
                &c[0],
                200,
                chrono::Utc::now(),
                NextState::Delivered
            )])
            .await
            .unwrap(),
        [RecordOutcome::Recorded]
    );
    let d = store.get_delivery(&ids[3]).await.unwrap();
    assert_eq!(d.delivery.state, DeliveryState::Delivered);
    assert_eq!(d.attempts.len(), 2);
}

/// Two records of one lease in a batch (a worker's retry of its own record,
/// say) are what recording them one by one gives: the first moves the
/// delivery, the second is LeaseLost, and both attempts are written.
pub async fn a_lease_recorded_twice_in_one_batch_moves_its_delivery_once(store: Arc<dyn Store>) {
    let a = store
        .create_subscription(new_sub("batch-twice.example", None))
        .await
        .unwrap();
    let id = ingest_one(&store, &a, "order.created").await;
    let c = claim_one(&store, "batch-twice.example").await;
    let outcomes = store
        .record_attempts(vec![
            record_of(&c, 200, minutes_ago(2), NextState::Delivered),
            record_of(&c, 500, minutes_ago(1), NextState::Retry { delay: LONG }),
        ])
        .await
        .unwrap();
    assert_eq!(
        outcomes,
        [RecordOutcome::Recorded, RecordOutcome::LeaseLost]
    );
    let d = store.get_delivery(&id).await.unwrap();
    assert_eq!(
        d.delivery.state,
        DeliveryState::Delivered,
        "the first record's state"
    );
    assert_eq!(d.delivery.attempt, 1);
    assert_eq!(d.delivery.last_status, Some(200));
    assert_eq!(
        d.attempts.iter().map(|a| a.status).collect::<Vec<_>>(),
        [Some(200), Some(500)],
        "both attempts are written"
    );
}

pub async fn record_attempts_equals_recording_one_by_one(store: Arc<dyn Store>) {
    let one = store
        .create_subscription(new_sub("batch-one.example", None))
        .await
        .unwrap();
    let many = store
        .create_subscription(new_sub("batch-many.example", None))
        .await
        .unwrap();
    let base = midday(1);
    let (one_ids, one_records) = batch_scenario(&store, &one, base).await;
    let (many_ids, many_records) = batch_scenario(&store, &many, base).await;
    let mut one_outcomes = Vec::new();
    for r in one_records {
        one_outcomes.push(store.record_attempt(r).await.unwrap());
    }
    let many_outcomes = store.record_attempts(many_records).await.unwrap();
    assert_eq!(one_outcomes, many_outcomes);
    for (x, y) in one_ids.iter().zip(&many_ids) {
        let (x, y) = (
            store.get_delivery(x).await.unwrap(),
            store.get_delivery(y).await.unwrap(),
        );
        assert_eq!(x.delivery.state, y.delivery.state);
        assert_eq!(x.delivery.attempt, y.delivery.attempt);
        assert_eq!(x.delivery.last_status, y.delivery.last_status);
        assert_eq!(x.delivery.last_error, y.delivery.last_error);
        assert_eq!(x.attempts, y.attempts);
    }
    // Failure, delivery, failure: both streaks restarted at the last
    // failure (20 minutes before `base`).
    let both = {
        let mut v = vec![one.id, many.id];
        v.sort();
        v
    };
    assert_eq!(
        failing(&store, base - chrono::Duration::minutes(20)).await,
        both
    );
    assert!(
        failing(&store, base - chrono::Duration::minutes(21))
            .await
            .is_empty()
    );
    let (x, y) = (
        week_of_stats(&store, &one.id).await,
        week_of_stats(&store, &many.id).await,
    );
    assert_eq!(x.len(), 1);
    assert_eq!(x, y);
}

pub async fn an_empty_batch_of_attempts_records_nothing(store: Arc<dyn Store>) {
    let a = store
        .create_subscription(new_sub("batch-empty.example", None))
        .await
        .unwrap();
    let id = ingest_one(&store, &a, "order.created").await;
    let c = claim_one(&store, "batch-empty.example").await;
    assert!(store.record_attempts(Vec::new()).await.unwrap().is_empty());
    let d = store.get_delivery(&id).await.unwrap();
    assert_eq!(d.delivery.state, DeliveryState::Inflight);
    assert!(d.attempts.is_empty());
    assert!(failing(&store, chrono::Utc::now()).await.is_empty());
    assert!(store.renew_lease(&c.lease, LONG).await.unwrap());
}

pub async fn a_batch_moves_the_failing_streak_in_record_order(store: Arc<dyn Store>) {
    let a = store
        .create_subscription(new_sub("batch-order.example", None))
        .await
        .unwrap();
    let retry = NextState::Retry { delay: LONG };
    // A failure then a delivery, of two deliveries of one subscription: the
    // streak ends.
    ingest_one(&store, &a, "order.created").await;
    ingest_one(&store, &a, "order.created").await;
    let c = claim_all_of(&store, &a).await;
    assert_eq!(c.len(), 2);
    let outcomes = store
        .record_attempts(vec![
            record_of(&c[0], 500, minutes_ago(10), retry.clone()),
            record_of(&c[1], 200, minutes_ago(9), NextState::Delivered),
        ])
        .await
        .unwrap();
    assert_eq!(outcomes, [RecordOutcome::Recorded; 2]);
    assert!(failing(&store, chrono::Utc::now()).await.is_empty());

    // A delivery then a failure: a streak starts at the failure.
    ingest_one(&store, &a, "order.created").await;
    ingest_one(&store, &a, "order.created").await;
    let c = claim_all_of(&store, &a).await;
    assert_eq!(c.len(), 2, "the new ones; the retry is not due");
    let began = minutes_ago(5);
    store
        .record_attempts(vec![
            record_of(&c[1], 200, minutes_ago(6), NextState::Delivered),
            record_of(&c[0], 500, began, NextState::Failed),
        ])
        .await
        .unwrap();
    assert_eq!(failing(&store, began).await, [a.id]);
    assert!(failing(&store, minutes_ago(6)).await.is_empty());

    // Failures only: a streak that has begun keeps its start.
    ingest_one(&store, &a, "order.created").await;
    let c = claim_all_of(&store, &a).await;
    assert_eq!(c.len(), 1);
    store
        .record_attempts(vec![record_of(&c[0], 500, minutes_ago(1), NextState::Dead)])
        .await
        .unwrap();
    assert_eq!(failing(&store, began).await, [a.id]);
}

// --- nodes (heartbeats) ----------------------------------------------------------

fn heartbeat_of(node_id: &str, role: NodeRole) -> NodeHeartbeat {
    NodeHeartbeat {
        node_id: node_id.to_owned(),
        role,
        started_at: chrono::DateTime::from_timestamp(1_700_000_000, 0).unwrap(),
        open_circuits: Vec::new(),
    }
}

pub async fn heartbeats_count_the_live_nodes_that_deliver(store: Arc<dyn Store>) {
    let live = Duration::from_secs(60);
    let beat = |id: &'static str, role| {
        let store = store.clone();
        async move {
            store
                .heartbeat(&heartbeat_of(id, role), live)
                .await
                .unwrap()
        }
    };
    assert_eq!(beat("w1", NodeRole::Worker).await, 1, "itself");
    assert_eq!(
        beat("a1", NodeRole::Api).await,
        1,
        "an api node delivers nothing, so it does not count"
    );
    assert_eq!(beat("x1", NodeRole::All).await, 2, "an `all` node delivers");
    assert_eq!(
        beat("w1", NodeRole::Worker).await,
        2,
        "a node's next heartbeat is the same node"
    );
    assert_eq!(beat("w2", NodeRole::Worker).await, 3);
    let nodes = store.nodes().await.unwrap();
    let ids: Vec<_> = nodes.iter().map(|n| n.node_id.as_str()).collect();
    assert_eq!(ids, ["a1", "w1", "w2", "x1"], "by node id");
    assert_eq!(nodes[0].role, NodeRole::Api);
    assert_eq!(nodes[3].role, NodeRole::All);
    assert_eq!(
        nodes[1].started_at,
        heartbeat_of("w1", NodeRole::Worker).started_at
    );
    let now = chrono::Utc::now();
    for n in &nodes {
        assert!(
            (now - n.last_seen).abs() < chrono::Duration::seconds(30),
            "last_seen is the store's now: {n:?}"
        );
    }
    // A node may change its role between restarts under one id.
    assert_eq!(beat("w2", NodeRole::Api).await, 2);
}

pub async fn heartbeats_forget_nodes_that_stopped(store: Arc<dyn Store>) {
    let stopped = heartbeat_of("stopped", NodeRole::Worker);
    let running = heartbeat_of("running", NodeRole::Worker);
    assert_eq!(
        store
            .heartbeat(&stopped, Duration::from_secs(60))
            .await
            .unwrap(),
        1
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    // Judged with a live window of 100 ms, the node seen 300 ms ago is not
    // live, but is remembered: it is forgotten after 10 windows (1 s).
    let short = Duration::from_millis(100);
    assert_eq!(store.heartbeat(&running, short).await.unwrap(), 1);
    let ids = |nodes: Vec<NodeInfo>| nodes.into_iter().map(|n| n.node_id).collect::<Vec<_>>();
    assert_eq!(ids(store.nodes().await.unwrap()), ["running", "stopped"]);
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    assert_eq!(store.heartbeat(&running, short).await.unwrap(), 1);
    assert_eq!(
        ids(store.nodes().await.unwrap()),
        ["running"],
        "a node not seen for 10 live windows is forgotten"
    );
    assert!(store.forget_node("running").await.unwrap());
    assert!(
        !store.forget_node("running").await.unwrap(),
        "forgetting is idempotent"
    );
    assert!(store.nodes().await.unwrap().is_empty());
}

pub async fn a_heartbeats_open_circuits_are_reported_until_the_next_replaces_them(
    store: Arc<dyn Store>,
) {
    let live = Duration::from_secs(60);
    let circuits = |store: Arc<dyn Store>| async move {
        store
            .nodes()
            .await
            .unwrap()
            .into_iter()
            .map(|n| (n.node_id, n.open_circuits))
            .collect::<Vec<_>>()
    };
    let mut w1 = heartbeat_of("w1", NodeRole::Worker);
    w1.open_circuits = vec!["a.example".into(), "b.example".into()];
    store.heartbeat(&w1, live).await.unwrap();
    store
        .heartbeat(&heartbeat_of("w2", NodeRole::Worker), live)
        .await
        .unwrap();
    assert_eq!(
        circuits(store.clone()).await,
        [
            (
                "w1".to_owned(),
                vec!["a.example".to_owned(), "b.example".to_owned()]
            ),
            ("w2".to_owned(), vec![]),
        ],
        "each node's as it reported them, in its order"
    );

    w1.open_circuits = vec!["c.example".into()];
    store.heartbeat(&w1, live).await.unwrap();
    assert_eq!(
        circuits(store.clone()).await,
        [
            ("w1".to_owned(), vec!["c.example".to_owned()]),
            ("w2".to_owned(), vec![]),
        ],
        "a later heartbeat replaces them, not adds to them"
    );

    w1.open_circuits = Vec::new();
    store.heartbeat(&w1, live).await.unwrap();
    assert_eq!(
        circuits(store.clone()).await,
        [("w1".to_owned(), vec![]), ("w2".to_owned(), vec![])],
        "an empty list replaces them too: every circuit closed"
    );
}
