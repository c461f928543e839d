//! An event's path from POST to the receiver, on both backends.

use std::collections::HashMap;

use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use crate::helpers::*;

crate::on_both_backends!(
    an_event_reaches_its_subscriber_signed_and_enveloped,
    a_500_is_retried_and_the_log_shows_both_attempts,
    only_matching_subscriptions_receive_an_event,
    two_dispatchers_never_deliver_one_delivery_twice,
);

/// An answered attempt gives its global slot back before its record is in:
/// a store slow to record does not hold every other destination back. With
/// one global slot, the attempt to A is answered while the test holds A's
/// delivery row locked, so A's record waits on the lock; B's delivery must
/// still go out. Before, the attempt kept the only slot until its record
/// was in, and B waited for the lock. PostgreSQL only: a row lock is how a
/// test can hold one record back without holding back every claim (SQLite
/// has one write lock for all).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answered_attempt_frees_its_global_slot_before_its_record() {
    use sqlx::Connection;

    let Some(app) = spawn_app_with(Backend::Postgres, |c| c.max_in_flight = 1).await else {
        return;
    };
    let a = TestReceiver::start("127.0.0.2").await;
    let b = TestReceiver::start("127.0.0.3").await;
    let sub_a = app.subscribe(&a.url(), &["a.*"]).await;
    app.subscribe(&b.url(), &["b.*"]).await;
    a.hold();
    let event_a = app.send_event("a.happened", json!({})).await;
    eventually("the attempt to A to be under way", || async {
        let s = app.admission.snapshot("127.0.0.2")?;
        (s.in_flight == 1).then_some(())
    })
    .await;
    // A's row is claimed and committed; lock it so its record waits.
    let mut conn = sqlx::PgConnection::connect(&app.database).await.unwrap();
    let mut lock = conn.begin().await.unwrap();
    let locked: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM (SELECT 1 FROM deliveries WHERE sub_id = $1::uuid FOR UPDATE) l",
    )
    // The API's `sub_<hex>` is the row's UUID, prefixed.
    .bind(sub_a["sub_id"].as_str().unwrap().trim_start_matches("sub_"))
    .fetch_one(&mut *lock)
    .await
    .unwrap();
    assert_eq!(locked, 1);
    let event_b = app.send_event("b.happened", json!({})).await;
    a.release();
    a.wait_for(1).await;
    // Well inside the store's 10 s statement timeout, which would
    // otherwise fail A's record and let B through after it.
    eventually_within(
        "B's delivery while A's record waits on its row",
        std::time::Duration::from_secs(8),
        || async { (!b.received().is_empty()).then_some(()) },
    )
    .await;
    lock.rollback().await.unwrap();
    conn.close().await.unwrap();
    for event_id in [event_a, event_b] {
        eventually("each delivery recorded as delivered", || async {
            let ev = app.get_json(&format!("/events/{event_id}")).await;
            (ev["deliveries"][0]["state"] == "delivered").then_some(())
        })
        .await;
    }
    app.stop().await;
}

async fn an_event_reaches_its_subscriber_signed_and_enveloped(backend: Backend) {
    let Some(app) = spawn_app(backend).await else {
        return;
    };
    let rx = TestReceiver::start("127.0.0.2").await;
    let sub = app.subscribe(&rx.url(), &["invoice.*"]).await;
    let (sub_id, secret) = (
        sub["sub_id"].as_str().unwrap(),
        sub["secret"].as_str().unwrap(),
    );
    let event_id = app
        .send_event("invoice.paid", json!({"amount": 42, "currency": "EUR"}))
        .await;

    let got = rx.wait_for(1).await;
    let r = &got[0];
    let body = r.json();
    assert_eq!(body["event_id"], event_id.as_str());
    assert_eq!(body["type"], "invoice.paid");
    assert_eq!(body["data"], json!({"amount": 42, "currency": "EUR"}));
    let key = expected_webhook_id(&event_id, sub_id);
    assert_eq!(
        r.header("webhook-id"),
        key,
        "webhook-id is sha256(event_id|sub_id)"
    );
    assert_eq!(r.header("idempotency-key"), key);
    assert_eq!(body["id"], key.as_str());
    assert_eq!(r.header("content-type"), "application/json");
    let ts: i64 = r.header("webhook-timestamp").parse().unwrap();
    assert!((chrono::Utc::now().timestamp() - ts).abs() < 300);
    assert!(
        r.signed_by(secret),
        "signature must verify per the Standard Webhooks spec"
    );

    let delivered = eventually("the delivery to be recorded as delivered", || async {
        let ev = app.get_json(&format!("/events/{event_id}")).await;
        (ev["deliveries"][0]["state"] == "delivered").then_some(ev)
    })
    .await;
    assert_eq!(delivered["deliveries"].as_array().unwrap().len(), 1);
    assert_eq!(delivered["deliveries"][0]["attempts"][0]["status"], 200);

    // The attempt and the destination's isolation state show in /metrics,
    // which only the admin may read.
    let text = app.get("/metrics").await.text().await.unwrap();
    assert!(text.contains("hookd_events_accepted_total"), "{text}");
    assert!(
        text.contains(r#"hookd_attempts_total{result="delivered",class="2xx"}"#),
        "{text}"
    );
    assert!(
        text.contains(r#"hookd_destination_circuit_state{destination="127.0.0.2"} 0"#),
        "{text}"
    );
    let anonymous = app.client.get(app.url("/metrics")).send().await.unwrap();
    assert_eq!(anonymous.status(), 401);
    app.stop().await;
}

async fn a_500_is_retried_and_the_log_shows_both_attempts(backend: Backend) {
    let Some(app) = spawn_app(backend).await else {
        return;
    };
    let rx = TestReceiver::start("127.0.0.3").await;
    rx.script(&[500]);
    let sub = app
        .subscribe_with(json!({ "url": rx.url(), "event_types": ["order.created"], "retry_policy": { "base_delay_secs": 1 } }))
        .await;
    let sub_id = sub["sub_id"].as_str().unwrap();
    app.send_event("order.created", json!({"id": 7})).await;

    let got = rx.wait_for(2).await;
    assert_eq!(
        got[0].header("webhook-id"),
        got[1].header("webhook-id"),
        "a retry keeps its webhook-id"
    );
    assert_eq!(got[0].body, got[1].body);

    let log = eventually("the retried delivery to be delivered", || async {
        let page = app
            .get_json(&format!("/subscriptions/{sub_id}/deliveries"))
            .await;
        (page["data"][0]["state"] == "delivered").then_some(page)
    })
    .await;
    let d = &log["data"][0];
    assert_eq!(d["attempt"], 2);
    let statuses: Vec<&Value> = d["attempts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| &a["status"])
        .collect();
    assert_eq!(statuses, [&json!(500), &json!(200)]);
    assert_eq!(d["attempts"][0]["number"], 1);
    assert_eq!(d["attempts"][1]["number"], 2);
    // The log can be filtered by state.
    let failed_now = app
        .get_json(&format!(
            "/subscriptions/{sub_id}/deliveries?status=pending"
        ))
        .await;
    assert!(failed_now["data"].as_array().unwrap().is_empty());
    app.stop().await;
}

async fn only_matching_subscriptions_receive_an_event(backend: Backend) {
    let Some(app) = spawn_app(backend).await else {
        return;
    };
    let (a, b, c) = (
        TestReceiver::start("127.0.0.4").await,
        TestReceiver::start("127.0.0.5").await,
        TestReceiver::start("127.0.0.6").await,
    );
    app.subscribe(&a.url(), &["user.created"]).await;
    app.subscribe(&b.url(), &["invoice.*"]).await;
    app.subscribe_with(json!({ "url": c.url(), "event_types": ["*"], "customer_id": "acme" }))
        .await;

    // A customer's event goes only to that customer's subscriptions.
    let r = app
        .post(
            "/events",
            &json!({ "type": "invoice.paid", "payload": {}, "customer_id": "globex" }),
        )
        .await;
    assert_eq!(r.status(), 202);
    // An event without a customer goes to every matching subscription.
    app.send_event("invoice.paid", json!({"n": 2})).await;

    let got_b = b.wait_for(1).await;
    let got_c = c.wait_for(1).await;
    assert_eq!(got_b[0].json()["data"], json!({"n": 2}));
    assert_eq!(got_c[0].json()["data"], json!({"n": 2}));
    app.send_event("user.created", json!({"n": 3})).await;
    a.wait_for(1).await;
    let got_c = c.wait_for(2).await;
    // Everything posted has now been delivered where it was due: nothing
    // else is pending, so the counts below are final.
    assert_eq!(
        b.received().len(),
        1,
        "invoice.* does not match user.created"
    );
    let mut seen: Vec<Value> = got_c.iter().map(|r| r.json()["data"].clone()).collect();
    seen.sort_by_key(|v| v["n"].as_i64());
    assert_eq!(
        seen,
        [json!({"n": 2}), json!({"n": 3})],
        "acme's subscription never saw globex's event"
    );
    app.stop().await;
}

async fn two_dispatchers_never_deliver_one_delivery_twice(backend: Backend) {
    let Some(app) = spawn_app(backend).await else {
        return;
    };
    let receivers = [
        TestReceiver::start("127.0.0.7").await,
        TestReceiver::start("127.0.0.8").await,
        TestReceiver::start("127.0.0.9").await,
    ];
    let mut sub_ids = Vec::new();
    for r in &receivers {
        let sub = app.subscribe(&r.url(), &["*"]).await;
        sub_ids.push(sub["sub_id"].as_str().unwrap().to_owned());
    }
    // A second dispatcher, with its own connection pool, on the same database.
    let second_store = open_store(&app.database).await;
    let second = hookd_dispatch::Dispatcher::new(
        second_store,
        test_dispatch_config("second-worker"),
        std::sync::Arc::new(hookd_domain::SystemClock),
        std::sync::Arc::new(tokio::sync::Notify::new()),
    )
    .unwrap();
    let stop_second = CancellationToken::new();
    let second_run = tokio::spawn(second.run(stop_second.clone()));

    let events = 100;
    for i in 0..events {
        app.send_event("load.test", json!({ "i": i })).await;
    }
    let mut seen: HashMap<String, usize> = HashMap::new();
    for r in &receivers {
        for got in r.wait_for(events).await {
            *seen.entry(got.header("webhook-id").to_owned()).or_default() += 1;
        }
    }
    assert_eq!(seen.len(), 3 * events);
    // Every POST is recorded as an attempt, so a delivery two dispatchers
    // both held would show two. Once all are delivered, each has exactly one.
    for sub_id in &sub_ids {
        let log = eventually("every delivery to be recorded as delivered", || async {
            let page = app
                .get_json(&format!("/subscriptions/{sub_id}/deliveries?limit=250"))
                .await;
            let all = page["data"].as_array().unwrap().clone();
            (all.len() == events && all.iter().all(|d| d["state"] == "delivered")).then_some(all)
        })
        .await;
        for d in &log {
            assert_eq!(
                d["attempts"].as_array().unwrap().len(),
                1,
                "sent twice: {d}"
            );
        }
    }
    let total: usize = receivers.iter().map(|r| r.received().len()).sum();
    assert_eq!(total, 3 * events, "no delivery was sent twice");
    stop_second.cancel();
    second_run.await.unwrap().unwrap();
    app.stop().await;
}
