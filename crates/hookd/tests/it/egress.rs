//! SSRF protection end to end: forbidden literals refused at creation, a
//! host name that resolves (or rebinds) to a forbidden address refused at
//! connect time and never retried, an allowlisted address delivered to —
//! at the address that was checked — and the headers a receiver gets.

use std::net::IpAddr;
use std::sync::Arc;

use hookd_dispatch::egress::StaticResolver;
use hookd_domain::destination::parse_cidr;
use serde_json::{Value, json};

use crate::helpers::*;

crate::on_both_backends!(
    forbidden_literals_are_refused_at_creation,
    a_name_rebinding_to_a_forbidden_address_fails_without_a_request,
    an_allowlisted_address_is_delivered_to_at_the_checked_address,
    a_receiver_gets_only_the_documented_headers,
);

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

/// The app with the default policy (public only, plus `allow`) and a
/// resolver that answers `answers`.
async fn public_only_app(
    backend: Backend,
    allow: &[&str],
    resolver: Arc<StaticResolver>,
) -> Option<TestApp> {
    let allow: Vec<_> = allow.iter().map(|c| parse_cidr(c).unwrap()).collect();
    spawn_app_tuned(backend, move |c| {
        c.allow_private_destinations = false;
        c.allow_destination_cidrs = allow;
        c.dispatch.egress.resolver = resolver;
    })
    .await
}

/// Waits for the only delivery of `sub_id` to be final.
async fn final_delivery(app: &TestApp, sub_id: &str) -> Value {
    eventually("the delivery to be final", || async {
        let page = app
            .get_json(&format!("/subscriptions/{sub_id}/deliveries"))
            .await;
        let d = page["data"][0].clone();
        matches!(d["state"].as_str(), Some("delivered" | "failed" | "dead")).then_some(d)
    })
    .await
}

async fn forbidden_literals_are_refused_at_creation(backend: Backend) {
    let Some(app) = public_only_app(backend, &[], Arc::new(StaticResolver::default())).await else {
        return;
    };
    for url in [
        "http://127.0.0.1:9/hook",
        "http://2130706433/",
        "http://0x7f.1/",
        "http://017700000001/",
        "http://127.1/",
        "http://169.254.169.254/latest/meta-data",
        "http://[::ffff:10.0.0.1]/",
        "http://[64:ff9b::7f00:1]/",
        "http://[fd00:ec2::254]/",
        "http://localhost/",
        "file:///etc/passwd",
        "https://user:pw@hooks.example.com/",
    ] {
        let r = app
            .post(
                "/subscriptions",
                &json!({ "url": url, "event_types": ["*"] }),
            )
            .await;
        assert_eq!(r.status(), 422, "{url}");
        let v: Value = r.json().await.unwrap();
        assert_eq!(v["error"]["code"], "validation_failed", "{url}: {v}");
        assert!(
            v["error"]["message"].as_str().unwrap().starts_with("url"),
            "names the field: {v}"
        );
    }
    // A public address is accepted.
    app.subscribe("http://93.184.216.34/hook", &["*"]).await;
    app.subscribe("http://[2606:4700::1]/hook", &["*"]).await;
}

async fn a_name_rebinding_to_a_forbidden_address_fails_without_a_request(backend: Backend) {
    let receiver = TestReceiver::start("127.0.0.1").await;
    // The name passes the creation check (it is not a literal); at connect
    // time it resolves to loopback, where a receiver is listening.
    let resolver = Arc::new(StaticResolver::new([(
        "rebind.test",
        vec![ip("93.184.216.34"), ip("127.0.0.1")],
    )]));
    let Some(app) = public_only_app(backend, &[], resolver.clone()).await else {
        return;
    };
    let port = receiver.addr.port();
    let sub = app
        .subscribe(&format!("http://rebind.test:{port}/hook"), &["*"])
        .await;
    let sub_id = sub["sub_id"].as_str().unwrap();
    app.send_event("t.x", json!({})).await;
    let d = final_delivery(&app, sub_id).await;
    assert_eq!(d["state"], "failed", "not retried: {d}");
    let attempts = d["attempts"].as_array().unwrap();
    assert_eq!(attempts.len(), 1, "{d}");
    assert_eq!(attempts[0]["error_class"], "forbidden_destination");
    assert_eq!(attempts[0]["status"], Value::Null);
    assert!(resolver.lookups() >= 1);
    assert!(
        receiver.received().is_empty(),
        "no request reached anything"
    );
    // Our refusal is not the destination's failure: well past the breaker's
    // minimum volume, all refused, its circuit stays closed.
    for n in 1..30 {
        app.send_event("t.x", json!({ "n": n })).await;
    }
    let h = eventually("30 refused attempts on /health", || async {
        let h = app
            .get_json(&format!("/subscriptions/{sub_id}/health"))
            .await;
        (h["last_status_counts"] == json!({ "forbidden_destination": 30 })
            && h["pending_count"] == 0)
            .then_some(h)
    })
    .await;
    assert_eq!(h["circuit_state"], "closed", "{h}");
    assert!(receiver.received().is_empty());
}

async fn an_allowlisted_address_is_delivered_to_at_the_checked_address(backend: Backend) {
    // The name exists only in this resolver, and only 127.0.0.2 is allowed:
    // the receiver being reached proves the connection went to the address
    // the resolver returned and the policy checked.
    let receiver = TestReceiver::start("127.0.0.2").await;
    let resolver = Arc::new(StaticResolver::new([(
        "allowed.test",
        vec![ip("127.0.0.2")],
    )]));
    let Some(app) = public_only_app(backend, &["127.0.0.2/32"], resolver.clone()).await else {
        return;
    };
    let port = receiver.addr.port();
    // The literal is allowed at creation too; its neighbour is not.
    app.subscribe(&format!("http://127.0.0.2:{port}/literal"), &["other.*"])
        .await;
    let r = app
        .post(
            "/subscriptions",
            &json!({ "url": format!("http://127.0.0.3:{port}/"), "event_types": ["*"] }),
        )
        .await;
    assert_eq!(r.status(), 422);
    let sub = app
        .subscribe(&format!("http://allowed.test:{port}/hook"), &["t.*"])
        .await;
    let sub_id = sub["sub_id"].as_str().unwrap();
    app.send_event("t.x", json!({"n": 1})).await;
    let d = final_delivery(&app, sub_id).await;
    assert_eq!(d["state"], "delivered", "{d}");
    let got = receiver.wait_for(1).await;
    assert_eq!(got[0].json()["data"]["n"], 1);
    assert!(resolver.lookups() >= 1);
}

async fn a_receiver_gets_only_the_documented_headers(backend: Backend) {
    let Some(app) = spawn_app(backend).await else {
        return;
    };
    let receiver = TestReceiver::start("127.0.0.1").await;
    app.subscribe(&receiver.url(), &["*"]).await;
    app.send_event("t.x", json!({})).await;
    let got = receiver.wait_for(1).await;
    let mut names: Vec<&str> = got[0].headers.keys().map(|k| k.as_str()).collect();
    names.sort_unstable();
    assert_eq!(
        names,
        [
            "accept",
            "content-length",
            "content-type",
            "host",
            "idempotency-key",
            "user-agent",
            "webhook-id",
            "webhook-signature",
            "webhook-timestamp",
        ]
    );
    assert_eq!(
        got[0].header("user-agent"),
        hookd_dispatch::send::USER_AGENT
    );
    assert_eq!(got[0].header("content-type"), "application/json");
}
