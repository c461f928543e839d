//! Lazy fan-out: an event over the threshold is committed with a fan-out
//! job, and `materialize_fanout` creates its deliveries in batches, each
//! exactly once. The stores under test have the default setting
//! ([`LazyFanout::DEFAULT`]: lazy above 1,000 deliveries, batches of 1,000).

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use futures::StreamExt as _;
use hookd_domain::delivery::DeliveryState;
use hookd_domain::subscription::SubscriptionState;
use hookd_domain::{DeliveryId, EventId, SubscriptionId};

use super::{
    accept_events_at_checks_the_generation, delivery_to, event_exists, expire_everything,
    new_event, new_sub, retain_all,
};
use crate::*;

/// Just over the default threshold: two batches (1,000 and 1).
const OVER: usize = LazyFanout::DEFAULT.threshold + 1;

/// `n` subscriptions to `host`, created a few at a time.
async fn many_subs(store: &Arc<dyn Store>, host: &str, n: usize) -> Vec<Subscription> {
    futures::stream::iter(0..n)
        .map(|_| store.create_subscription(new_sub(host, None)))
        .buffered(8)
        .map(|r| r.unwrap())
        .collect()
        .await
}

/// Accepts one event fanned out to `subs` (with `key`); returns its id and
/// its planned deliveries.
async fn accept(
    store: &Arc<dyn Store>,
    subs: &[Subscription],
    key: Option<&str>,
) -> (EventId, Vec<NewDelivery>) {
    let planned: Vec<NewDelivery> = subs.iter().map(delivery_to).collect();
    let acc = store
        .accept_event(new_event("fanout.wide", key), planned.clone())
        .await
        .unwrap();
    assert!(!acc.duplicate);
    (acc.event_id, planned)
}

/// Every delivery of one event.
async fn deliveries_of(store: &Arc<dyn Store>, event_id: &EventId) -> Vec<Delivery> {
    let query = DeliveryQuery {
        event_id: Some(*event_id),
        limit: 100_000,
        ..Default::default()
    };
    store
        .list_deliveries(&query)
        .await
        .unwrap()
        .into_iter()
        .map(|d| d.delivery)
        .collect()
}

/// Steps until no job is left; returns the steps.
async fn materialize_all(store: &Arc<dyn Store>) -> Vec<FanoutStep> {
    let mut steps = Vec::new();
    while let Some(step) = store.materialize_fanout().await.unwrap() {
        steps.push(step);
        assert!(steps.len() < 10_000, "materialising never ends");
    }
    steps
}

/// Asserts `event_id` has exactly the `planned` deliveries: one per
/// subscription, each with its planned id and host.
async fn has_exactly(store: &Arc<dyn Store>, event_id: &EventId, planned: &[NewDelivery]) {
    let got = deliveries_of(store, event_id).await;
    assert_eq!(
        got.len(),
        planned.len(),
        "one delivery per planned delivery"
    );
    let by_sub: HashMap<SubscriptionId, &Delivery> = got.iter().map(|d| (d.sub_id, d)).collect();
    assert_eq!(by_sub.len(), planned.len(), "one per subscription");
    for p in planned {
        let d = by_sub[&p.sub_id];
        assert_eq!(d.id, p.id, "the id planned at ingest");
        assert_eq!(d.destination_host, p.destination_host);
        assert_eq!(d.event_id, *event_id);
    }
}

pub async fn an_event_over_the_lazy_fanout_threshold_commits_a_job_instead_of_its_deliveries(
    store: Arc<dyn Store>,
) {
    let subs = many_subs(&store, "lazy-accept.example", OVER).await;

    // At the threshold: written whole, with the event.
    let (at, planned) = accept(&store, &subs[..OVER - 1], None).await;
    has_exactly(&store, &at, &planned).await;
    assert_eq!(
        store.fanout_backlog().await.unwrap(),
        FanoutBacklog::default()
    );

    // Over it: the event and a job, no delivery yet.
    let (over, _) = accept(&store, &subs, Some("wide-1")).await;
    assert!(event_exists(&store, &over).await);
    assert!(deliveries_of(&store, &over).await.is_empty());
    assert_eq!(
        store.fanout_backlog().await.unwrap(),
        FanoutBacklog {
            jobs: 1,
            deliveries: OVER as u64
        }
    );

    // Its key is taken like any event's: a repeat writes nothing.
    let again = store
        .accept_event(
            new_event("fanout.wide", Some("wide-1")),
            subs.iter().map(delivery_to).collect(),
        )
        .await
        .unwrap();
    assert_eq!(
        again,
        Accepted {
            event_id: over,
            duplicate: true
        }
    );
    assert_eq!(store.fanout_backlog().await.unwrap().jobs, 1);

    // All or nothing, as when the rows are written at once: a delivery to
    // a subscription that does not exist, or two to one, fail the event.
    let mut ghost: Vec<NewDelivery> = subs.iter().map(delivery_to).collect();
    ghost.push(NewDelivery {
        id: DeliveryId::new(),
        sub_id: SubscriptionId::new(),
        destination_host: "nowhere.example".into(),
    });
    let mut twice: Vec<NewDelivery> = subs.iter().map(delivery_to).collect();
    twice.push(delivery_to(&subs[0]));
    for deliveries in [ghost, twice] {
        let event = new_event("fanout.wide", Some("refused"));
        let id = event.id;
        assert!(store.accept_event(event, deliveries).await.is_err());
        assert!(!event_exists(&store, &id).await, "nothing written");
    }
    assert_eq!(store.fanout_backlog().await.unwrap().jobs, 1);
}

pub async fn materializing_a_fanout_job_creates_each_planned_delivery_once_in_batches(
    store: Arc<dyn Store>,
) {
    let host = "lazy-batches.example";
    let subs = many_subs(&store, host, OVER).await;
    let (event_id, planned) = accept(&store, &subs, None).await;

    let first = store.materialize_fanout().await.unwrap().unwrap();
    assert_eq!(
        first,
        FanoutStep {
            event_id,
            materialized: 1000,
            created: 1000,
            finished: false
        }
    );
    // A batch is whole: exactly the first 1,000 planned, in order.
    let got: HashSet<DeliveryId> = deliveries_of(&store, &event_id)
        .await
        .iter()
        .map(|d| d.id)
        .collect();
    let first_batch: HashSet<DeliveryId> = planned[..1000].iter().map(|d| d.id).collect();
    assert_eq!(got, first_batch);
    assert_eq!(
        store.fanout_backlog().await.unwrap(),
        FanoutBacklog {
            jobs: 1,
            deliveries: 1
        }
    );

    let last = store.materialize_fanout().await.unwrap().unwrap();
    assert_eq!(
        last,
        FanoutStep {
            event_id,
            materialized: 1,
            created: 1,
            finished: true
        }
    );
    has_exactly(&store, &event_id, &planned).await;
    for d in deliveries_of(&store, &event_id).await {
        assert_eq!(d.state, DeliveryState::Pending);
        assert_eq!(d.attempt, 0);
    }
    assert_eq!(
        store.due_destinations(10).await.unwrap()[0].host,
        host,
        "due at once"
    );

    // Nothing is left to do, and doing it again creates nothing.
    assert_eq!(store.materialize_fanout().await.unwrap(), None);
    assert_eq!(
        store.fanout_backlog().await.unwrap(),
        FanoutBacklog::default()
    );
    has_exactly(&store, &event_id, &planned).await;
}

pub async fn concurrent_materializers_never_create_a_delivery_twice(store: Arc<dyn Store>) {
    let subs = many_subs(&store, "lazy-race.example", OVER).await;
    let mut events = Vec::new();
    for _ in 0..3 {
        events.push(accept(&store, &subs, None).await);
    }
    let racers: Vec<_> = (0..4)
        .map(|_| {
            let store = store.clone();
            tokio::spawn(async move { materialize_all(&store).await })
        })
        .collect();
    let mut steps = Vec::new();
    for r in racers {
        steps.extend(r.await.unwrap());
    }
    // A caller that found every job taken stops early: finish the rest.
    steps.extend(materialize_all(&store).await);

    let created: u64 = steps.iter().map(|s| s.created).sum();
    assert_eq!(created, 3 * OVER as u64, "each delivery created once");
    let batches: HashSet<(EventId, u64)> =
        steps.iter().map(|s| (s.event_id, s.materialized)).collect();
    assert_eq!(steps.len(), 6, "two batches per job, each taken once");
    assert_eq!(batches.len(), 6);
    assert_eq!(steps.iter().filter(|s| s.finished).count(), 3);
    for (event_id, planned) in &events {
        has_exactly(&store, event_id, planned).await;
    }
    assert_eq!(
        store.fanout_backlog().await.unwrap(),
        FanoutBacklog::default()
    );
}

pub async fn a_lazy_fanout_writes_ordered_deliveries_at_once_and_follows_subscription_changes(
    store: Arc<dyn Store>,
) {
    let host = "lazy-subs.example";
    let mut subs = many_subs(&store, host, OVER - 1).await;
    let mut n = new_sub(host, None);
    n.ordered = true;
    let ordered = store.create_subscription(n).await.unwrap();
    subs.push(ordered.clone());
    let (event_id, planned) = accept(&store, &subs, None).await;

    // An ordered subscription's delivery is written with the event, so no
    // later event's delivery can be claimed before it.
    let now = deliveries_of(&store, &event_id).await;
    assert_eq!(now.len(), 1);
    assert_eq!(now[0].sub_id, ordered.id);
    assert_eq!(
        store.fanout_backlog().await.unwrap().deliveries,
        OVER as u64 - 1
    );

    // Changed before their deliveries are written: as if they had been
    // written at ingest and the change came after.
    let (deleted, disabled) = (&subs[0], &subs[1]);
    store.delete_subscription(&deleted.id).await.unwrap();
    let patch = SubscriptionPatch {
        state: Some(SubscriptionState::Disabled),
        ..Default::default()
    };
    store
        .update_subscription(&disabled.id, patch)
        .await
        .unwrap();

    let steps = materialize_all(&store).await;
    assert_eq!(
        steps.iter().map(|s| s.created).sum::<u64>(),
        OVER as u64 - 1
    );
    has_exactly(&store, &event_id, &planned).await;
    for d in deliveries_of(&store, &event_id).await {
        if d.sub_id == deleted.id {
            assert_eq!(
                d.state,
                DeliveryState::Failed,
                "its subscription is deleted"
            );
            assert_eq!(d.last_error.as_deref(), Some("subscription deleted"));
        } else {
            assert_eq!(d.state, DeliveryState::Pending, "{:?}", d.sub_id);
        }
    }
}

pub async fn retention_keeps_the_event_of_an_unfinished_fanout_job(store: Arc<dyn Store>) {
    let subs = many_subs(&store, "lazy-retain.example", OVER).await;
    let (event_id, planned) = accept(&store, &subs, None).await;
    retain_all(&store, &expire_everything(1000)).await;
    assert!(
        event_exists(&store, &event_id).await,
        "its deliveries are yet to come"
    );
    materialize_all(&store).await;
    has_exactly(&store, &event_id, &planned).await;
}

pub async fn a_batch_of_events_fans_out_lazily_only_the_ones_over_the_threshold(
    store: Arc<dyn Store>,
) {
    let subs = many_subs(&store, "lazy-batch.example", OVER).await;
    let narrow: Vec<NewDelivery> = subs[..2].iter().map(delivery_to).collect();
    let wide: Vec<NewDelivery> = subs.iter().map(delivery_to).collect();
    let (a, b) = (
        new_event("fanout.narrow", None),
        new_event("fanout.wide", None),
    );
    let (a_id, b_id) = (a.id, b.id);
    let results = store
        .accept_events(vec![(a, narrow.clone()), (b, wide.clone())])
        .await
        .unwrap();
    assert!(
        results
            .iter()
            .all(|r| r.as_ref().is_ok_and(|a| !a.duplicate))
    );

    has_exactly(&store, &a_id, &narrow).await;
    assert!(deliveries_of(&store, &b_id).await.is_empty());
    assert_eq!(
        store.fanout_backlog().await.unwrap(),
        FanoutBacklog {
            jobs: 1,
            deliveries: OVER as u64
        }
    );
    materialize_all(&store).await;
    has_exactly(&store, &b_id, &wide).await;
}

/// `accept_events_at` with events over the threshold (a fan-out job each,
/// which PostgreSQL writes in a transaction, not its one-call fast path).
pub async fn accept_events_at_refuses_a_lazy_fanout_once_the_generation_moved(
    store: Arc<dyn Store>,
) {
    let subs = many_subs(&store, "wide.example", OVER).await;
    accept_events_at_checks_the_generation(&store, &subs).await;
}
