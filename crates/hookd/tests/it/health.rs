//! `GET /subscriptions/{id}/health` end to end: what a customer sees of a
//! misconfigured, a healthy and a dead-lettering endpoint.

use serde_json::{Value, json};

use crate::helpers::*;

crate::on_both_backends!(
    an_endpoint_rejecting_everything_with_401_is_a_likely_configuration_error,
    a_healthy_endpoint_shows_full_success_and_no_backlog,
    a_dead_delivery_shows_in_the_dead_count,
);

/// Subscribes to `receiver` with one attempt per delivery.
async fn subscribe_once(app: &TestApp, receiver: &TestReceiver) -> String {
    let sub = app
        .subscribe_with(json!({
            "url": receiver.url(),
            "event_types": ["*"],
            "retry_policy": { "max_attempts": 1 },
        }))
        .await;
    sub["sub_id"].as_str().unwrap().to_owned()
}

/// Waits until `/health` shows `n` finished attempts and no backlog.
async fn health_after(app: &TestApp, sub_id: &str, n: u64) -> Value {
    eventually("the attempts to show on /health", || async {
        let h = app
            .get_json(&format!("/subscriptions/{sub_id}/health"))
            .await;
        let finished: u64 = h["last_status_counts"]
            .as_object()
            .unwrap()
            .values()
            .map(|v| v.as_u64().unwrap())
            .sum();
        (finished == n && h["pending_count"] == 0).then_some(h)
    })
    .await
}

async fn an_endpoint_rejecting_everything_with_401_is_a_likely_configuration_error(
    backend: Backend,
) {
    let Some(app) = spawn_app(backend).await else {
        return;
    };
    let receiver = TestReceiver::start("127.0.0.50").await;
    receiver.script(&[401; 12]);
    let sub_id = subscribe_once(&app, &receiver).await;
    for n in 0..12 {
        app.send_event("auth.checked", json!({ "n": n })).await;
    }

    let h = health_after(&app, &sub_id, 12).await;
    assert_eq!(h["sub_id"], sub_id.as_str());
    assert_eq!(h["state"], "active");
    assert_eq!(h["destination_host"], "127.0.0.50");
    assert_eq!(h["last_status_counts"], json!({ "401": 12 }));
    assert_eq!(h["success_rate"], 0.0);
    assert_eq!(
        h["likely_configuration_error"],
        json!({ "status": 401, "share": 1.0 }),
        "{h}"
    );
    assert_eq!(
        h["circuit_state"], "closed",
        "4xx does not trip the breaker"
    );
    assert_eq!(h["dead_count"], 0, "a 4xx fails, it does not dead-letter");
    app.stop().await;
}

async fn a_healthy_endpoint_shows_full_success_and_no_backlog(backend: Backend) {
    let Some(app) = spawn_app(backend).await else {
        return;
    };
    let receiver = TestReceiver::start("127.0.0.51").await;
    let sub_id = subscribe_once(&app, &receiver).await;
    for n in 0..3 {
        app.send_event("order.created", json!({ "n": n })).await;
    }

    let h = health_after(&app, &sub_id, 3).await;
    assert_eq!(h["success_rate"], 1.0, "{h}");
    assert_eq!(h["pending_count"], 0);
    assert_eq!(h["lag_secs"], 0);
    assert_eq!(h["dead_count"], 0);
    assert_eq!(h["oldest_dead_at"], Value::Null);
    assert_eq!(h["last_status_counts"], json!({ "200": 3 }));
    assert_eq!(h["likely_configuration_error"], Value::Null);
    assert_eq!(h["circuit_state"], "closed");
    assert!(h["in_flight"].is_u64());
    app.stop().await;
}

async fn a_dead_delivery_shows_in_the_dead_count(backend: Backend) {
    let Some(app) = spawn_app(backend).await else {
        return;
    };
    let receiver = TestReceiver::start("127.0.0.52").await;
    receiver.script(&[500]);
    let sub_id = subscribe_once(&app, &receiver).await;
    app.send_event("order.created", json!({})).await;

    let h = eventually("the delivery to dead-letter", || async {
        let h = app
            .get_json(&format!("/subscriptions/{sub_id}/health"))
            .await;
        (h["dead_count"] == 1).then_some(h)
    })
    .await;
    assert!(h["oldest_dead_at"].is_string(), "{h}");
    assert_eq!(h["pending_count"], 0);
    assert_eq!(h["last_status_counts"], json!({ "500": 1 }));
    assert_eq!(h["success_rate"], 0.0);
    assert_eq!(
        h["likely_configuration_error"],
        Value::Null,
        "a 5xx is never a configuration error"
    );

    // A subscription that does not exist is 404, like another customer's.
    let missing = app
        .get("/subscriptions/sub_00000000000000000000000000/health")
        .await;
    assert_eq!(missing.status(), 404);
    app.stop().await;
}
