//! What hookd does and says, unasked, about a subscription in trouble:
//! shedding at ingest (R4's escape valve), disabling after a failing period,
//! and the `hookd.subscription.*` system events that announce every such
//! state through hookd's own pipeline.

use std::time::Duration;

use hookd_domain::shedding::SheddingConfig;
use serde_json::{Value, json};

use crate::helpers::*;

crate::on_both_backends!(
    shedding_starts_when_a_backlog_is_stuck_and_stops_when_it_shrinks,
    a_subscription_failing_for_the_period_is_disabled_keeps_its_deliveries_and_flows_when_reenabled,
    troubles_are_announced_once_as_system_events_to_the_right_subscriptions,
);

/// The system events `rx` received: `(subscription_id, signal, detail)`,
/// each checked to be of the type that matches its signal.
fn announcements(rx: &TestReceiver) -> Vec<(String, String, String)> {
    rx.received()
        .iter()
        .map(|r| {
            let v = r.json();
            let data = &v["data"];
            let signal = data["signal"].as_str().unwrap_or_default().to_owned();
            assert_eq!(v["type"], format!("hookd.subscription.{signal}"), "{v}");
            (
                data["subscription_id"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned(),
                signal,
                data["detail"].as_str().unwrap_or_default().to_owned(),
            )
        })
        .collect()
}

async fn wait_for_announcement(rx: &TestReceiver, sub_id: &str, signal: &str) -> String {
    eventually(
        &format!("{signal} to be announced for {sub_id}"),
        || async {
            announcements(rx)
                .into_iter()
                .find(|(s, k, _)| s == sub_id && k == signal)
                .map(|(_, _, detail)| detail)
        },
    )
    .await
}

async fn shedding_starts_when_a_backlog_is_stuck_and_stops_when_it_shrinks(backend: Backend) {
    let Some(app) = spawn_app_tuned(backend, |c| {
        c.monitor.every = Duration::from_millis(50);
        // The window is long enough that posting the 25 events below
        // cannot outlast it on a loaded machine (it did once with 500 ms:
        // the 22nd post was already shed).
        c.monitor.shedding = SheddingConfig {
            threshold: 20,
            window: chrono::Duration::seconds(3),
        };
    })
    .await
    else {
        return;
    };
    let platform = TestReceiver::start("127.0.0.80").await;
    app.subscribe(&platform.url(), &["hookd.subscription.*"])
        .await;
    let rx = TestReceiver::start("127.0.0.81").await;
    rx.hold();
    let sub = app
        .subscribe_with(json!({
            "url": rx.url(),
            "event_types": ["order.*"],
            "max_concurrency": 1,
        }))
        .await;
    let sub_id = sub["sub_id"].as_str().unwrap().to_owned();
    for n in 0..25 {
        app.send_event("order.created", json!({ "n": n })).await;
    }

    // The destination answers nothing: the backlog stays at 25, over the
    // threshold, for a window — and then ingest refuses.
    let order = json!({ "type": "order.created", "payload": { "late": true } });
    let refused = eventually("ingest to shed the stuck subscription", || async {
        let r = app.post("/events", &order).await;
        (r.status() == 429).then_some(r)
    })
    .await;
    let retry_after = refused.headers()["retry-after"]
        .to_str()
        .unwrap()
        .to_owned();
    assert!(retry_after.parse::<u64>().unwrap() > 0);
    let body: Value = refused.json().await.unwrap();
    assert_eq!(body["error"]["code"], "shedding");
    assert!(
        body["error"]["message"].as_str().unwrap().contains(&sub_id),
        "the refusal names the subscription: {body}"
    );
    let h = app
        .get_json(&format!("/subscriptions/{sub_id}/health"))
        .await;
    assert_eq!(h["shedding"], true, "{h}");
    assert!(
        h["pending_count"].as_u64().unwrap() >= 25,
        "nothing accepted was dropped: {h}"
    );
    // Events that would not reach it are still accepted.
    app.send_event("user.created", json!({})).await;
    wait_for_announcement(&platform, &sub_id, "shedding").await;

    // The destination drains: the backlog shrinks and ingest resumes.
    rx.release();
    eventually("ingest to accept again", || async {
        let r = app.post("/events", &order).await;
        (r.status() == 202).then_some(())
    })
    .await;
    let h = eventually("health to stop showing shedding", || async {
        let h = app
            .get_json(&format!("/subscriptions/{sub_id}/health"))
            .await;
        (h["shedding"] == false).then_some(h)
    })
    .await;
    assert!(
        h["signals"]
            .as_array()
            .unwrap()
            .iter()
            .all(|s| s["kind"] != "shedding"),
        "{h}"
    );
    // Every accepted event is delivered: 25 before, at least one after.
    rx.wait_for(26).await;
    app.stop().await;
}

async fn a_subscription_failing_for_the_period_is_disabled_keeps_its_deliveries_and_flows_when_reenabled(
    backend: Backend,
) {
    let Some(app) = spawn_app_tuned(backend, |c| {
        c.monitor.disable_after = chrono::Duration::seconds(1);
    })
    .await
    else {
        return;
    };
    let platform = TestReceiver::start("127.0.0.82").await;
    app.subscribe(&platform.url(), &["hookd.subscription.disabled"])
        .await;
    let rx = TestReceiver::start("127.0.0.83").await;
    rx.set_status(500);
    let sub = app
        .subscribe_with(json!({
            "url": rx.url(),
            "event_types": ["order.*"],
            "retry_policy": { "max_attempts": 3, "base_delay_secs": 1 },
        }))
        .await;
    let sub_id = sub["sub_id"].as_str().unwrap().to_owned();
    app.send_event("order.created", json!({ "n": "first" }))
        .await;
    rx.wait_for(1).await;

    let detail = wait_for_announcement(&platform, &sub_id, "disabled").await;
    assert!(detail.contains("every attempt failed"), "{detail}");
    let s = app.get_json(&format!("/subscriptions/{sub_id}")).await;
    assert_eq!(s["state"], "disabled");
    let h = app
        .get_json(&format!("/subscriptions/{sub_id}/health"))
        .await;
    assert!(
        h["signals"]
            .as_array()
            .unwrap()
            .iter()
            .any(|s| s["kind"] == "disabled"),
        "{h}"
    );

    // New events are accepted and kept for it, not sent.
    for n in 0..3 {
        app.send_event("order.created", json!({ "n": n })).await;
    }
    let held = app
        .get_json(&format!(
            "/subscriptions/{sub_id}/deliveries?status=pending"
        ))
        .await;
    assert!(held["data"].as_array().unwrap().len() >= 3, "{held}");

    // Fixed and re-enabled: everything kept flows.
    rx.set_status(200);
    let r = app
        .client
        .patch(app.url(&format!("/subscriptions/{sub_id}")))
        .bearer_auth(&app.token)
        .json(&json!({ "state": "active" }))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    eventually("the kept deliveries to arrive", || async {
        let ns: Vec<Value> = rx
            .received()
            .iter()
            .filter(|r| r.json()["data"]["n"].is_number())
            .map(|r| r.json()["data"]["n"].clone())
            .collect();
        (0..3).all(|n| ns.contains(&json!(n))).then_some(())
    })
    .await;
    let s = app.get_json(&format!("/subscriptions/{sub_id}")).await;
    assert_eq!(s["state"], "active", "a delivery ended the failing streak");
    app.stop().await;
}

async fn troubles_are_announced_once_as_system_events_to_the_right_subscriptions(backend: Backend) {
    let Some(app) = spawn_app(backend).await else {
        return;
    };
    // Who listens: the platform, acme for its own endpoints, globex, and a
    // platform subscription to everything (`*` does not include hookd's own
    // events: they are opt-in).
    let platform = TestReceiver::start("127.0.0.84").await;
    app.subscribe(&platform.url(), &["hookd.subscription.*"])
        .await;
    let acme_ops = TestReceiver::start("127.0.0.85").await;
    app.subscribe_with(
        json!({ "url": acme_ops.url(), "event_types": ["hookd.*"], "customer_id": "acme" }),
    )
    .await;
    let globex_ops = TestReceiver::start("127.0.0.86").await;
    app.subscribe_with(
        json!({ "url": globex_ops.url(), "event_types": ["hookd.*"], "customer_id": "globex" }),
    )
    .await;
    let everything = TestReceiver::start("127.0.0.87").await;
    app.subscribe(&everything.url(), &["*"]).await;

    // acme's three troubled endpoints.
    let gone = TestReceiver::start("127.0.0.88").await;
    gone.set_status(410);
    let rejects = TestReceiver::start("127.0.0.89").await;
    rejects.set_status(401);
    let broken = TestReceiver::start("127.0.0.90").await;
    broken.set_status(500);
    let mut subs = Vec::new();
    for (rx, types) in [
        (&gone, "gone.*"),
        (&rejects, "auth.*"),
        (&broken, "broken.*"),
    ] {
        let s = app
            .subscribe_with(json!({
                "url": rx.url(),
                "event_types": [types],
                "customer_id": "acme",
                "retry_policy": { "max_attempts": 1 },
            }))
            .await;
        subs.push(s["sub_id"].as_str().unwrap().to_owned());
    }
    let post = |ty: &'static str| {
        let app = &app;
        async move {
            let r = app
                .post(
                    "/events",
                    &json!({ "type": ty, "payload": {}, "customer_id": "acme" }),
                )
                .await;
            assert_eq!(r.status(), 202);
        }
    };
    post("gone.away").await;
    for _ in 0..12 {
        post("auth.checked").await;
    }
    post("broken.thing").await;

    let disabled = wait_for_announcement(&platform, &subs[0], "disabled").await;
    assert!(disabled.contains("410"), "{disabled}");
    let code = wait_for_announcement(&platform, &subs[1], "configuration_error").await;
    assert_eq!(code, "401");
    wait_for_announcement(&platform, &subs[2], "dead_lettering").await;
    let s = app.get_json(&format!("/subscriptions/{}", subs[0])).await;
    assert_eq!(s["state"], "disabled");

    // acme's own listener hears the same three; nobody else does.
    for signal in ["disabled", "configuration_error", "dead_lettering"] {
        let i = ["disabled", "configuration_error", "dead_lettering"]
            .iter()
            .position(|s| *s == signal)
            .unwrap();
        wait_for_announcement(&acme_ops, &subs[i], signal).await;
    }
    assert!(
        announcements(&globex_ops).is_empty(),
        "another customer hears nothing"
    );
    assert!(
        everything.received().is_empty(),
        "`*` does not include hookd's own events"
    );
    // Each trouble was announced once, not once per monitor round or per
    // failed attempt.
    let heard = announcements(&platform);
    for (sub, signal) in [
        (&subs[0], "disabled"),
        (&subs[1], "configuration_error"),
        (&subs[2], "dead_lettering"),
    ] {
        let n = heard
            .iter()
            .filter(|(s, k, _)| s == sub && k == signal)
            .count();
        assert_eq!(n, 1, "{signal} for {sub}: {heard:?}");
    }
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn producers_cannot_post_hookds_own_event_types() {
    let app = spawn_app(Backend::Sqlite).await.unwrap();
    let r = app
        .post(
            "/events",
            &json!({ "type": "hookd.subscription.disabled", "payload": {} }),
        )
        .await;
    assert_eq!(r.status(), 422);
    let v: Value = r.json().await.unwrap();
    assert!(
        v["error"]["message"].as_str().unwrap().contains("type"),
        "{v}"
    );
    app.stop().await;
}
