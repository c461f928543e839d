//! The delivery guarantee's edges: dead-letter is not deletion (it is kept
//! and replayable), and ordered subscriptions keep event order through
//! failures.

use serde_json::{Value, json};

use crate::helpers::*;

crate::on_both_backends!(
    a_dead_delivery_is_kept_listed_and_replayable_with_the_same_webhook_id,
    an_ordered_subscription_receives_events_in_order_through_a_failing_head,
);

async fn a_dead_delivery_is_kept_listed_and_replayable_with_the_same_webhook_id(backend: Backend) {
    let Some(app) = spawn_app(backend).await else {
        return;
    };
    let rx = TestReceiver::start("127.0.0.20").await;
    rx.script(&[500, 500]);
    let sub = app
        .subscribe_with(json!({
            "url": rx.url(), "event_types": ["*"],
            "retry_policy": { "max_attempts": 2, "base_delay_secs": 1 }
        }))
        .await;
    let sub_id = sub["sub_id"].as_str().unwrap();
    app.send_event("order.created", json!({"id": 1})).await;

    let dead = eventually("the delivery to be dead-lettered", || async {
        let page = app
            .get_json(&format!("/subscriptions/{sub_id}/deliveries?status=dead"))
            .await;
        page["data"].as_array().and_then(|d| d.first().cloned())
    })
    .await;
    assert_eq!(dead["attempt"], 2);
    assert_eq!(dead["last_error"], "HTTP 500");
    let delivery_id = dead["delivery_id"].as_str().unwrap();

    // Replay: back to pending with a fresh window; the receiver now answers 200.
    let r = app
        .post(&format!("/deliveries/{delivery_id}/replay"), &json!({}))
        .await;
    assert_eq!(r.status(), 202);
    let got = rx.wait_for(3).await;
    assert_eq!(
        got[2].header("webhook-id"),
        got[0].header("webhook-id"),
        "a replay keeps the webhook-id"
    );
    let done = eventually("the replayed delivery to be delivered", || async {
        let d = app.get_json(&format!("/deliveries/{delivery_id}")).await;
        (d["state"] == "delivered").then_some(d)
    })
    .await;
    let numbers: Vec<&Value> = done["attempts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| &a["number"])
        .collect();
    assert_eq!(
        numbers,
        [&json!(1), &json!(2), &json!(3)],
        "attempt numbers continue after a replay"
    );

    // Replaying an unknown delivery is a 404 with a JSON body.
    let r = app
        .post(
            "/deliveries/dlv_0193a1b2c3d4e5f60718293a4b5c6d7e/replay",
            &json!({}),
        )
        .await;
    assert_eq!(r.status(), 404);
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["error"]["code"], "not_found");
    app.stop().await;
}

async fn an_ordered_subscription_receives_events_in_order_through_a_failing_head(backend: Backend) {
    let Some(app) = spawn_app(backend).await else {
        return;
    };
    let rx = TestReceiver::start("127.0.0.21").await;
    // The first event fails three times before it gets through.
    rx.script(&[500, 500, 500]);
    app.subscribe_with(json!({
        "url": rx.url(), "event_types": ["*"], "ordered": true,
        "retry_policy": { "base_delay_secs": 1 }
    }))
    .await;
    let n = 8;
    for i in 0..n {
        app.send_event("ledger.entry", json!({ "seq": i })).await;
    }
    let got = rx.wait_for(n + 3).await;
    let seqs: Vec<i64> = got
        .iter()
        .map(|r| r.json()["data"]["seq"].as_i64().unwrap())
        .collect();
    let expected: Vec<i64> = [0, 0, 0].into_iter().chain(0..n as i64).collect();
    assert_eq!(
        seqs, expected,
        "the head is retried alone, then everything follows in order"
    );
    app.stop().await;
}
