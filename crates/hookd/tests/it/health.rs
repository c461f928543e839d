//! `GET /subscriptions/{id}/health` end to end: what a customer sees of a
//! misconfigured, a healthy and a dead-lettering endpoint.

use std::time::Duration;

use serde_json::{Value, json};

use crate::helpers::*;

crate::on_both_backends!(
    an_endpoint_rejecting_everything_with_401_is_a_likely_configuration_error,
    a_healthy_endpoint_shows_full_success_and_no_backlog,
    a_dead_delivery_shows_in_the_dead_count,
    a_failing_destination_shows_an_open_circuit_and_its_waiting_backlog_until_it_recovers,
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

async fn a_failing_destination_shows_an_open_circuit_and_its_waiting_backlog_until_it_recovers(
    backend: Backend,
) {
    const EVENTS: u64 = 10;
    let Some(app) = spawn_app_with(backend, |c| {
        // The circuit opens after a handful of failures, and its open
        // periods are short, so the test sees it open and then recover;
        // the design's 20 attempts and 30 s are the defaults elsewhere.
        c.admission.breaker.min_volume = 5;
        c.admission.breaker.base_backoff = Duration::from_millis(500);
        c.admission.breaker.max_backoff = Duration::from_secs(1);
        c.admission.rate_override = Some(10_000.0);
    })
    .await
    else {
        return;
    };
    let receiver = TestReceiver::start("127.0.0.63").await;
    receiver.set_status(500);
    let sub = app
        .subscribe_with(json!({
            "url": receiver.url(),
            "event_types": ["*"],
            "retry_policy": { "base_delay_secs": 1, "max_delay_secs": 1 },
        }))
        .await;
    let sub_id = sub["sub_id"].as_str().unwrap().to_owned();
    let path = format!("/subscriptions/{sub_id}/health");
    let health = || app.get_json(&path);
    for n in 0..EVENTS {
        app.send_event("order.created", json!({ "n": n })).await;
    }

    let h = eventually("the failing destination's circuit to open", || async {
        let h = health().await;
        (h["circuit_state"] == "open").then_some(h)
    })
    .await;
    assert_eq!(h["destination_host"], "127.0.0.63");
    assert_eq!(
        h["pending_count"], EVENTS,
        "nothing finishes while every answer is 500: {h}"
    );
    assert_eq!(h["dead_count"], 0, "{h}");
    assert!(h["last_status_counts"]["500"].as_u64().unwrap() > 0, "{h}");
    assert_eq!(h["last_status_counts"].get("200"), None, "{h}");
    assert_eq!(h["success_rate"], 0.0, "{h}");

    // The deliveries wait behind the circuit, and their age shows as lag.
    let h = eventually("the waiting deliveries to show a lag", || async {
        let h = health().await;
        (h["lag_secs"].as_i64().unwrap() > 0).then_some(h)
    })
    .await;
    assert_eq!(h["pending_count"], EVENTS, "{h}");
    assert_ne!(
        h["circuit_state"], "closed",
        "only a successful probe closes it: {h}"
    );

    // The destination recovers: a probe gets through and closes the
    // circuit, and the backlog drains.
    receiver.set_status(200);
    let h = eventually("the circuit to leave open", || async {
        let h = health().await;
        (h["circuit_state"] != "open").then_some(h)
    })
    .await;
    assert!(
        h["circuit_state"] == "half_open" || h["circuit_state"] == "closed",
        "{h}"
    );
    let h = eventually("every delivery to be delivered", || async {
        let h = health().await;
        (h["pending_count"] == 0).then_some(h)
    })
    .await;
    assert_eq!(h["circuit_state"], "closed", "{h}");
    assert_eq!(h["lag_secs"], 0, "{h}");
    assert_eq!(h["dead_count"], 0, "{h}");
    assert_eq!(h["last_status_counts"]["200"], EVENTS, "{h}");
    let delivered = app
        .get_json(&format!(
            "/subscriptions/{sub_id}/deliveries?status=delivered"
        ))
        .await;
    assert_eq!(
        delivered["data"].as_array().unwrap().len() as u64,
        EVENTS,
        "{delivered}"
    );
    app.stop().await;
}
