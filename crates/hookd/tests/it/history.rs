//! History end to end (design §9.3, R3): the daily rollup at
//! `GET /subscriptions/{id}/stats` counts each day's attempts and what they
//! caused, and keeps those counts when retention removes the deliveries
//! behind them — on PostgreSQL by dropping the day's partition whole.

use hookd_store::RetentionPolicy;
use serde_json::{Value, json};

use crate::helpers::*;

crate::on_both_backends!(stats_count_a_days_outcomes_and_survive_retention);

async fn stats_count_a_days_outcomes_and_survive_retention(backend: Backend) {
    let Some(app) = spawn_app(backend).await else {
        return;
    };
    let rx = TestReceiver::start("127.0.0.95").await;
    // One attempt each: three delivered, one refused (failed), one broken
    // with no retries left (dead).
    rx.script(&[200, 200, 200, 400, 500]);
    let sub = app
        .subscribe_with(json!({
            "url": rx.url(),
            "event_types": ["order.*"],
            "retry_policy": { "max_attempts": 1 },
            "max_concurrency": 1,
        }))
        .await;
    let sub_id = sub["sub_id"].as_str().unwrap().to_owned();
    let mut events = Vec::new();
    for n in 0..5 {
        events.push(app.send_event("order.created", json!({ "n": n })).await);
    }
    eventually("every delivery to finish", || async {
        let h = app
            .get_json(&format!("/subscriptions/{sub_id}/health"))
            .await;
        (h["pending_count"] == 0 && rx.count() == 5).then_some(())
    })
    .await;

    let stats = app
        .get_json(&format!("/subscriptions/{sub_id}/stats?days=3"))
        .await;
    let days = stats["data"].as_array().unwrap();
    assert_eq!(days.len(), 3, "{stats}");
    let today = &days[2];
    assert_eq!(
        today["day"],
        chrono::Utc::now().date_naive().to_string(),
        "{stats}"
    );
    assert_eq!(today["attempts"], 5, "{stats}");
    assert_eq!(today["delivered"], 3);
    assert_eq!(today["failed"], 1);
    assert_eq!(today["dead"], 1);
    let latency = &today["latency_ms"];
    for p in ["p50", "p90", "p99", "max"] {
        assert!(latency[p].is_u64(), "{latency}");
    }
    assert!(latency["p50"].as_u64() <= latency["max"].as_u64());
    assert_eq!(days[0]["attempts"], 0);
    assert_eq!(days[0]["latency_ms"], Value::Null);

    // Everything expires (cutoffs past the end of today, so even today's
    // PostgreSQL partition qualifies).
    let store = open_store(&app.database).await;
    let later = chrono::Utc::now() + chrono::Duration::days(2);
    let policy = RetentionPolicy {
        deliveries_before: later,
        events_before: later,
        batch: 2,
    };
    let (mut deliveries, mut partitions) = (0, 0);
    loop {
        let r = store.enforce_retention(&policy).await.unwrap();
        deliveries += r.deliveries;
        partitions += r.partitions_dropped;
        if !r.more {
            break;
        }
    }
    assert_eq!(deliveries, 5);
    if backend == Backend::Postgres {
        assert!(
            partitions >= 1,
            "PostgreSQL drops partitions, never deletes"
        );
    }
    // The rows are gone…
    let list = app
        .get_json(&format!("/subscriptions/{sub_id}/deliveries"))
        .await;
    assert_eq!(list["data"], json!([]), "{list}");
    let r = app.get(&format!("/events/{}", events[0])).await;
    assert_eq!(r.status(), 404);
    // …and the rollup keeps their counts.
    let after = app
        .get_json(&format!("/subscriptions/{sub_id}/stats?days=3"))
        .await;
    assert_eq!(after, stats);
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stats_refuse_a_bad_day_count() {
    let app = spawn_app(Backend::Sqlite).await.unwrap();
    let sub = app.subscribe("http://127.0.0.96:9/in", &["a.b"]).await;
    let sub_id = sub["sub_id"].as_str().unwrap();
    for q in ["days=0", "days=100000", "days=x", "weeks=1"] {
        let r = app.get(&format!("/subscriptions/{sub_id}/stats?{q}")).await;
        assert_eq!(r.status(), 400, "{q}");
        let v: Value = r.json().await.unwrap();
        assert_eq!(v["error"]["code"], "bad_request", "{q}: {v}");
    }
    app.stop().await;
}
