//! Lazy fan-out across a crash (issue 8): one event to 5,000 subscriptions
//! is committed with a fan-out job; the real `hookd serve` binary dies
//! between two of its batches (failpoint `fanout.after_batch`, after the
//! second batch's commit), restarts on the same database, and resumes at
//! the job's cursor. The event ends with exactly one delivery per
//! subscription: none lost, none created twice.

use std::collections::HashSet;
use std::time::Duration;

use futures::StreamExt as _;
use hookd::cli::FAILPOINT_EXIT_CODE;
use hookd_domain::destination::{DestinationPolicy, DestinationUrl};
use hookd_domain::event_type::EventTypePattern;
use hookd_domain::signing::SigningSecret;
use hookd_domain::subscription::{RetryPolicy, SigningKeys};
use hookd_domain::{EventId, SubscriptionId};
use hookd_store::{DeliveryQuery, FanoutBacklog, NewSubscription, Store};
use serde_json::json;

use crate::helpers::*;

crate::on_both_backends!(a_lazy_fanout_killed_mid_way_ends_with_exactly_one_delivery_each);

/// Subscriptions the event fans out to: five batches of 1,000 (the default
/// threshold and batch size).
const SUBSCRIPTIONS: usize = 5_000;

/// Bounds each wait (a hang), not a performance target: creating 5,000
/// subscriptions and delivering to them on a debug build takes a while.
const WAIT: Duration = Duration::from_secs(180);

/// Every delivery of the event, straight from the store (no process runs).
async fn deliveries_of(store: &dyn Store, event_id: &EventId) -> Vec<hookd_store::Delivery> {
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

/// Creates `n` subscriptions to `url` for `fanout.*`, straight through the
/// store before any process runs (the API would take minutes for 5,000).
async fn seed_subscriptions(database: &str, url: &str, n: usize) -> HashSet<SubscriptionId> {
    let store = open_store(database).await;
    store.migrate().await.unwrap();
    let url = DestinationUrl::parse(url, DestinationPolicy::AllowPrivate).unwrap();
    let new = || NewSubscription {
        id: SubscriptionId::new(),
        customer_id: None,
        url: url.clone(),
        event_types: vec![EventTypePattern::parse("fanout.*").unwrap()],
        keys: SigningKeys {
            current: SigningSecret::generate(),
            previous: None,
        },
        ordered: false,
        retry_policy: RetryPolicy::default(),
        rate_limit: None,
        max_concurrency: None,
        description: None,
    };
    let ids: HashSet<SubscriptionId> = futures::stream::iter(0..n)
        .map(|_| store.create_subscription(new()))
        .buffer_unordered(8)
        .map(|sub| sub.unwrap().id)
        .collect()
        .await;
    assert_eq!(ids.len(), n);
    ids
}

/// One metric's value in a `/metrics` scrape, if it is there.
fn sample(text: &str, name: &str) -> Option<f64> {
    text.lines()
        .filter_map(|l| l.split_once(' '))
        .find(|(series, _)| *series == name)
        .and_then(|(_, v)| v.trim().parse().ok())
}

async fn a_lazy_fanout_killed_mid_way_ends_with_exactly_one_delivery_each(backend: Backend) {
    let Some((database, _guard)) = fresh_database(backend).await else {
        return;
    };
    let rx = TestReceiver::start("127.0.0.2").await;
    let subs = seed_subscriptions(&database, &rx.url(), SUBSCRIPTIONS).await;
    // The first batch passes the failpoint; the second's exits the process.
    let mut p = ServeProcess::start(&database, Some("fanout.after_batch=1*off->exit")).await;

    let r = p
        .post(
            "/events",
            &json!({"type": "fanout.wide", "payload": {"n": 1}, "idempotency_key": "wide-1"}),
        )
        .await;
    assert_eq!(r.status(), 202, "committed with its fan-out job");
    let event_id: EventId = r.json::<serde_json::Value>().await.unwrap()["event_id"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();

    let code = p.wait_for_exit().await;
    assert_eq!(
        code,
        Some(FAILPOINT_EXIT_CODE),
        "hookd serve should have died after its second batch:\n{}",
        p.log_text()
    );

    // Mid-way: two batches committed, the job at its cursor.
    {
        let store = open_store(&database).await;
        let got = deliveries_of(store.as_ref(), &event_id).await;
        assert_eq!(got.len(), 2_000, "two whole batches, nothing of a third");
        assert_eq!(
            store.fanout_backlog().await.unwrap(),
            FanoutBacklog {
                jobs: 1,
                deliveries: (SUBSCRIPTIONS - 2_000) as u64
            }
        );
    }

    // A new process resumes the job where the old one left it.
    let mut p = ServeProcess::start(&database, None).await;
    let running = &p;
    eventually_within("the fan-out job to finish", WAIT, || async move {
        let p = running;
        let r = p
            .client
            .get(p.url("/metrics"))
            .bearer_auth(PROCESS_TOKEN)
            .send()
            .await
            .ok()?;
        let text = r.text().await.ok()?;
        (sample(&text, "hookd_fanout_jobs_pending") == Some(0.0)).then_some(())
    })
    .await;
    p.kill();

    let store = open_store(&database).await;
    let got = deliveries_of(store.as_ref(), &event_id).await;
    assert_eq!(
        got.len(),
        SUBSCRIPTIONS,
        "exactly one delivery per subscription"
    );
    let to: HashSet<SubscriptionId> = got.iter().map(|d| d.sub_id).collect();
    assert_eq!(to, subs, "every subscription, each once");
    let ids: HashSet<_> = got.iter().map(|d| d.id).collect();
    assert_eq!(ids.len(), SUBSCRIPTIONS);
    assert_eq!(
        store.fanout_backlog().await.unwrap(),
        FanoutBacklog::default()
    );
}
