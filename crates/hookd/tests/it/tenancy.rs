//! A customer token can read or change nothing of another customer's,
//! checked route by route from the OpenAPI document: every documented
//! (method, path) is classified below, and a route the test does not know
//! fails it, so a new route cannot escape the check.

use reqwest::Method;
use serde_json::{Value, json};

use crate::helpers::{Backend, TestApp, TestReceiver, eventually, spawn_app};

crate::on_both_backends!(a_customer_token_reaches_nothing_of_another_customers);

/// How a documented route is checked.
enum Check {
    /// Needs no token; nothing to scope.
    Public,
    /// Admin only: a customer token is told 404.
    AdminOnly(Option<Value>),
    /// Takes the id of another customer's record: 404 `not_found`, with a
    /// body that would be accepted for the caller's own record.
    OthersRecord(Option<Value>),
    /// `GET /subscriptions`: only the caller's own.
    ListSubscriptions,
    /// `POST /subscriptions`: cannot create for another customer.
    CreateSubscription,
    /// `POST /events`: cannot post as another customer, nor reach its
    /// subscriptions.
    CreateEvent,
}

fn an_hour_ago() -> String {
    (chrono::Utc::now() - chrono::Duration::hours(1)).to_rfc3339()
}

/// Every documented route, classified. Panics on one it does not know.
fn classify(method: &str, path: &str) -> Check {
    match (method, path) {
        ("GET", "/healthz" | "/readyz" | "/openapi.json") => Check::Public,
        // The portal's static page and files: no data, the page asks for a token.
        ("GET", "/ui" | "/ui/app.js" | "/ui/app.css") => Check::Public,
        ("POST", "/customers/{id}/portal-link") => Check::AdminOnly(None),
        ("GET", "/metrics") => Check::AdminOnly(None),
        ("POST", "/tokens") => Check::AdminOnly(Some(json!({ "customer_id": "acme" }))),
        ("GET", "/subscriptions") => Check::ListSubscriptions,
        ("POST", "/subscriptions") => Check::CreateSubscription,
        ("POST", "/events") => Check::CreateEvent,
        (
            "GET",
            "/subscriptions/{id}"
            | "/subscriptions/{id}/health"
            | "/subscriptions/{id}/stats"
            | "/subscriptions/{id}/deliveries"
            | "/events/{id}"
            | "/deliveries/{id}"
            | "/jobs/{id}",
        ) => Check::OthersRecord(None),
        ("DELETE", "/subscriptions/{id}" | "/jobs/{id}") => Check::OthersRecord(None),
        ("PATCH", "/subscriptions/{id}") => Check::OthersRecord(Some(json!({
            "description": "changed by another customer",
            "state": "disabled",
        }))),
        ("POST", "/subscriptions/{id}/replay") => {
            Check::OthersRecord(Some(json!({ "since": an_hour_ago() })))
        }
        ("POST", "/subscriptions/{id}/secret/rotate") => {
            Check::OthersRecord(Some(json!({ "grace_secs": 0 })))
        }
        ("POST", "/deliveries/{id}/replay") => Check::OthersRecord(None),
        _ => panic!(
            "{method} {path} is documented but not classified in tenancy.rs: \
             say how a customer token is kept from other customers' records there"
        ),
    }
}

async fn token_for(app: &TestApp, customer: &str) -> String {
    let r = app
        .post("/tokens", &json!({ "customer_id": customer }))
        .await;
    assert_eq!(r.status(), 201);
    let v: Value = r.json().await.unwrap();
    v["token"].as_str().unwrap().to_owned()
}

async fn call(
    app: &TestApp,
    method: Method,
    path: &str,
    token: &str,
    body: Option<&Value>,
) -> (u16, Value) {
    let mut req = app.client.request(method, app.url(path)).bearer_auth(token);
    if let Some(b) = body {
        req = req.json(b);
    }
    let r = req.send().await.unwrap();
    let status = r.status().as_u16();
    let bytes = r.bytes().await.unwrap();
    (
        status,
        serde_json::from_slice(&bytes).unwrap_or(Value::Null),
    )
}

async fn a_customer_token_reaches_nothing_of_another_customers(backend: Backend) {
    let Some(app) = spawn_app(backend).await else {
        return;
    };
    let acme = token_for(&app, "acme").await;
    let globex = token_for(&app, "globex").await;

    // globex's records: a subscription with a delivered event, a job.
    let receiver = TestReceiver::start("127.0.0.91").await;
    let (status, theirs) = call(
        &app,
        Method::POST,
        "/subscriptions",
        &globex,
        Some(&json!({ "url": receiver.url(), "event_types": ["*"], "description": "globex's" })),
    )
    .await;
    assert_eq!(status, 201, "{theirs}");
    let their_sub = theirs["sub_id"].as_str().unwrap().to_owned();
    let their_secret = theirs["secret"].as_str().unwrap().to_owned();
    let (status, v) = call(
        &app,
        Method::POST,
        "/events",
        &globex,
        Some(&json!({ "type": "invoice.paid", "payload": { "n": 1 } })),
    )
    .await;
    assert_eq!(status, 202, "{v}");
    let their_event = v["event_id"].as_str().unwrap().to_owned();
    receiver.wait_for(1).await;
    let their_delivery = eventually("globex's delivery is delivered", || async {
        let e = app.get_json(&format!("/events/{their_event}")).await;
        let d = &e["deliveries"][0];
        (d["state"] == "delivered").then(|| d["delivery_id"].as_str().unwrap().to_owned())
    })
    .await;
    let (status, job) = call(
        &app,
        Method::POST,
        &format!("/subscriptions/{their_sub}/replay"),
        &globex,
        Some(&json!({ "since": an_hour_ago(), "statuses": ["failed"] })),
    )
    .await;
    assert_eq!(status, 202, "{job}");
    let their_job = job["job_id"].as_str().unwrap().to_owned();
    let before_delivery = app.get_json(&format!("/deliveries/{their_delivery}")).await;

    // acme's own subscription, on another receiver.
    let own_receiver = TestReceiver::start("127.0.0.92").await;
    let (status, mine) = call(
        &app,
        Method::POST,
        "/subscriptions",
        &acme,
        Some(&json!({ "url": own_receiver.url(), "event_types": ["*"] })),
    )
    .await;
    assert_eq!(status, 201, "{mine}");
    let my_sub = mine["sub_id"].as_str().unwrap().to_owned();

    let doc = serde_json::to_value(hookd_api::openapi_document()).unwrap();
    let mut checked = 0;
    for (path, item) in doc["paths"].as_object().unwrap() {
        for method in item.as_object().unwrap().keys() {
            let method = method.to_uppercase();
            let m = Method::from_bytes(method.as_bytes()).unwrap();
            let what = format!("{method} {path} as acme");
            checked += 1;
            match classify(&method, path) {
                Check::Public => {}
                Check::AdminOnly(body) => {
                    let (status, v) = call(&app, m, path, &acme, body.as_ref()).await;
                    assert_eq!(status, 404, "{what}: {v}");
                    assert_eq!(v["error"]["code"], "not_found", "{what}");
                }
                Check::OthersRecord(body) => {
                    let id = match path.split('/').nth(1) {
                        Some("subscriptions") => &their_sub,
                        Some("events") => &their_event,
                        Some("deliveries") => &their_delivery,
                        Some("jobs") => &their_job,
                        other => panic!("{what}: no record of kind {other:?}"),
                    };
                    let url = path.replace("{id}", id);
                    let (status, v) = call(&app, m, &url, &acme, body.as_ref()).await;
                    assert_eq!(status, 404, "{what}: {v}");
                    assert_eq!(v["error"]["code"], "not_found", "{what}");
                    // Nor does anything of globex's leak into the message.
                    assert!(!v.to_string().contains("globex"), "{what}: {v}");
                }
                Check::ListSubscriptions => {
                    for query in ["", "?customer_id=globex", "?limit=250"] {
                        let (status, v) =
                            call(&app, m.clone(), &format!("{path}{query}"), &acme, None).await;
                        assert_eq!(status, 200, "{what}{query}: {v}");
                        let ids: Vec<&str> = v["data"]
                            .as_array()
                            .unwrap()
                            .iter()
                            .map(|s| s["sub_id"].as_str().unwrap())
                            .collect();
                        let expected: &[&str] = if query.contains("globex") {
                            &[]
                        } else {
                            &[my_sub.as_str()]
                        };
                        assert_eq!(ids, expected, "{what}{query}");
                    }
                }
                Check::CreateSubscription => {
                    let body = json!({
                        "url": own_receiver.url(),
                        "event_types": ["*"],
                        "customer_id": "globex",
                    });
                    let (status, v) = call(&app, m, path, &acme, Some(&body)).await;
                    assert_eq!(status, 422, "{what}: {v}");
                    assert_eq!(v["error"]["code"], "validation_failed", "{what}");
                }
                Check::CreateEvent => {
                    let body = json!({
                        "type": "invoice.paid",
                        "payload": { "from": "acme" },
                        "customer_id": "globex",
                    });
                    let (status, v) = call(&app, m.clone(), path, &acme, Some(&body)).await;
                    assert_eq!(status, 422, "{what}: {v}");
                    assert_eq!(v["error"]["code"], "validation_failed", "{what}");
                    // Without a customer id it is acme's event: it reaches
                    // acme's subscription only.
                    let body = json!({ "type": "invoice.paid", "payload": { "from": "acme" } });
                    let (status, v) = call(&app, m, path, &acme, Some(&body)).await;
                    assert_eq!(status, 202, "{what}: {v}");
                    let event = app
                        .get_json(&format!("/events/{}", v["event_id"].as_str().unwrap()))
                        .await;
                    assert_eq!(event["customer_id"], "acme");
                    let subs: Vec<&str> = event["deliveries"]
                        .as_array()
                        .unwrap()
                        .iter()
                        .map(|d| d["sub_id"].as_str().unwrap())
                        .collect();
                    assert_eq!(subs, [my_sub.as_str()], "{what}");
                }
            }
        }
    }
    assert!(checked >= 20, "only {checked} routes in the document");

    // Nothing of globex's changed.
    let sub = app.get_json(&format!("/subscriptions/{their_sub}")).await;
    assert_eq!(sub["description"], "globex's");
    assert_eq!(sub["state"], "active");
    assert_eq!(sub["customer_id"], "globex");
    let job = app.get_json(&format!("/jobs/{their_job}")).await;
    assert_ne!(job["state"], "cancelled");
    let delivery = app.get_json(&format!("/deliveries/{their_delivery}")).await;
    assert_eq!(delivery["state"], before_delivery["state"]);
    assert_eq!(delivery["attempt"], before_delivery["attempt"]);
    // The secret was not rotated: the next delivery carries one signature,
    // by the original secret.
    let (status, v) = call(
        &app,
        Method::POST,
        "/events",
        &globex,
        Some(&json!({ "type": "invoice.paid", "payload": { "n": 2 } })),
    )
    .await;
    assert_eq!(status, 202, "{v}");
    let got = receiver.wait_for(2).await;
    let last = got.last().unwrap();
    assert!(last.signed_by(&their_secret));
    assert_eq!(last.header("webhook-signature").split(' ').count(), 1);
    // globex's receiver got only globex's events.
    assert!(
        got.iter().all(|r| r.json()["data"].get("from").is_none()),
        "acme's event reached globex"
    );
    app.stop().await;
}
