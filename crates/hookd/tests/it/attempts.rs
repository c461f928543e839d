//! What one attempt does with what a destination answers: bounded reads
//! under one deadline, and the classification of statuses, end to end.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::http::StatusCode;
use axum::response::Response;
use serde_json::{Value, json};

use crate::helpers::*;

crate::on_both_backends!(
    an_endless_2xx_body_is_cut_off_and_still_a_success,
    a_trickling_2xx_body_cannot_hold_the_attempt_past_its_deadline,
    a_destination_that_never_answers_times_out_and_is_retried,
    a_410_fails_the_delivery_and_disables_the_subscription,
    a_400_is_tried_once_and_a_redirect_is_not_followed,
    a_nul_in_an_answer_or_a_request_is_never_a_server_error,
);

/// A destination on `ip` whose every answer is built by `respond`.
async fn destination<F>(ip: &str, respond: F) -> SocketAddr
where
    F: Fn() -> Response + Clone + Send + Sync + 'static,
{
    let listener = tokio::net::TcpListener::bind((ip, 0)).await.unwrap();
    let addr = listener.local_addr().unwrap();
    let app = axum::Router::new().fallback(move || {
        let respond = respond.clone();
        async move { respond() }
    });
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    addr
}

fn endless(chunk: &'static [u8], every: Duration) -> Body {
    let stream = futures::stream::unfold((), move |()| async move {
        tokio::time::sleep(every).await;
        Some((Ok::<_, Infallible>(Bytes::from_static(chunk)), ()))
    });
    Body::from_stream(stream)
}

/// Subscribes to `addr`, posts one event, and waits for its delivery to
/// reach a state other than pending/inflight — or, with `until_attempts`,
/// until that many attempts are recorded.
async fn deliver_one(
    app: &TestApp,
    addr: SocketAddr,
    until: impl Fn(&Value) -> bool,
) -> (Value, Value) {
    let sub = app
        .subscribe_with(json!({ "url": format!("http://{addr}/hook"), "event_types": ["*"], "retry_policy": { "base_delay_secs": 60 } }))
        .await;
    let sub_id = sub["sub_id"].as_str().unwrap().to_owned();
    app.send_event("t.x", json!({})).await;
    let d = eventually("the delivery to reach the expected state", || async {
        let page = app
            .get_json(&format!("/subscriptions/{sub_id}/deliveries"))
            .await;
        let d = page["data"][0].clone();
        until(&d).then_some(d)
    })
    .await;
    (sub, d)
}

fn is_final(d: &Value) -> bool {
    matches!(d["state"].as_str(), Some("delivered" | "failed" | "dead"))
}

async fn an_endless_2xx_body_is_cut_off_and_still_a_success(backend: Backend) {
    let Some(app) = spawn_app_with(backend, |c| c.attempt_timeout = Duration::from_secs(5)).await
    else {
        return;
    };
    let addr = destination("127.0.0.10", || {
        Response::new(endless(&[b'x'; 8192], Duration::ZERO))
    })
    .await;
    let (_, d) = deliver_one(&app, addr, is_final).await;
    assert_eq!(d["state"], "delivered");
    let snippet = d["attempts"][0]["response_snippet"].as_str().unwrap();
    assert!(
        snippet.len() <= 1024 && !snippet.is_empty(),
        "{} bytes kept",
        snippet.len()
    );
    app.stop().await;
}

async fn a_trickling_2xx_body_cannot_hold_the_attempt_past_its_deadline(backend: Backend) {
    let Some(app) =
        spawn_app_with(backend, |c| c.attempt_timeout = Duration::from_millis(800)).await
    else {
        return;
    };
    let addr = destination("127.0.0.11", || {
        Response::new(endless(b"x", Duration::from_millis(50)))
    })
    .await;
    let (_, d) = deliver_one(&app, addr, is_final).await;
    assert_eq!(
        d["state"], "delivered",
        "the 2xx stands though the body never ended"
    );
    assert_eq!(d["attempts"].as_array().unwrap().len(), 1);
    app.stop().await;
}

async fn a_destination_that_never_answers_times_out_and_is_retried(backend: Backend) {
    let Some(app) =
        spawn_app_with(backend, |c| c.attempt_timeout = Duration::from_millis(500)).await
    else {
        return;
    };
    // Accepts connections and never answers.
    let listener = tokio::net::TcpListener::bind(("127.0.0.12", 0))
        .await
        .unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((sock, _)) = listener.accept().await {
            held.push(sock);
        }
    });
    let (_, d) = deliver_one(&app, addr, |d| {
        d["attempts"].as_array().is_some_and(|a| !a.is_empty())
    })
    .await;
    assert_eq!(d["attempts"][0]["error_class"], "timeout");
    assert_eq!(d["attempts"][0]["status"], Value::Null);
    assert_eq!(d["state"], "pending", "a timeout is retried");
    assert_eq!(d["last_error"], "timeout");
    app.stop().await;
}

async fn a_410_fails_the_delivery_and_disables_the_subscription(backend: Backend) {
    let Some(app) = spawn_app(backend).await else {
        return;
    };
    let addr = destination("127.0.0.13", || {
        let mut r = Response::new(Body::empty());
        *r.status_mut() = StatusCode::GONE;
        r
    })
    .await;
    let (sub, d) = deliver_one(&app, addr, is_final).await;
    assert_eq!(d["state"], "failed");
    assert_eq!(d["attempts"].as_array().unwrap().len(), 1);
    let sub_id = sub["sub_id"].as_str().unwrap();
    let disabled = eventually("the subscription to be disabled", || async {
        let s = app.get_json(&format!("/subscriptions/{sub_id}")).await;
        (s["state"] == "disabled").then_some(s)
    })
    .await;
    assert_eq!(disabled["state"], "disabled");
    // Its new deliveries are kept, not attempted.
    app.send_event("t.y", json!({})).await;
    let page = app
        .get_json(&format!(
            "/subscriptions/{sub_id}/deliveries?status=pending"
        ))
        .await;
    assert_eq!(
        page["data"].as_array().unwrap().len(),
        1,
        "kept pending while disabled"
    );
    app.stop().await;
}

async fn a_400_is_tried_once_and_a_redirect_is_not_followed(backend: Backend) {
    let Some(app) = spawn_app(backend).await else {
        return;
    };
    let bad = destination("127.0.0.14", || {
        let mut r = Response::new(Body::from("missing field"));
        *r.status_mut() = StatusCode::BAD_REQUEST;
        r
    })
    .await;
    let (_, d) = deliver_one(&app, bad, is_final).await;
    assert_eq!(d["state"], "failed");
    assert_eq!(d["attempts"].as_array().unwrap().len(), 1);
    assert_eq!(d["attempts"][0]["status"], 400);
    assert_eq!(d["attempts"][0]["response_snippet"], "missing field");

    let redirected = TestReceiver::start("127.0.0.15").await;
    let target = redirected.url();
    let redirect = destination("127.0.0.16", move || {
        let mut r = Response::new(Body::empty());
        *r.status_mut() = StatusCode::FOUND;
        r.headers_mut().insert("location", target.parse().unwrap());
        r
    })
    .await;
    let (_, d) = deliver_one(&app, redirect, is_final).await;
    assert_eq!(d["state"], "failed");
    assert_eq!(d["attempts"][0]["status"], 302);
    assert!(
        redirected.received().is_empty(),
        "the redirect was not followed"
    );
    app.stop().await;
}

/// U+0000 cannot be stored in PostgreSQL's `text`: an answer holding it is
/// still recorded (the snippet shows U+FFFD), and a request holding it in a
/// stored string is refused with a 422 naming the field, writing nothing.
/// An event's payload is kept as sent, escape and all.
async fn a_nul_in_an_answer_or_a_request_is_never_a_server_error(backend: Backend) {
    let Some(app) = spawn_app(backend).await else {
        return;
    };
    let addr = destination("127.0.0.13", || Response::new(Body::from("ok\0nul"))).await;
    let (sub, d) = deliver_one(&app, addr, is_final).await;
    assert_eq!(d["state"], "delivered", "{d}");
    assert_eq!(d["attempts"][0]["response_snippet"], "ok\u{FFFD}nul", "{d}");
    let sub_id = sub["sub_id"].as_str().unwrap();

    let refused = [
        (
            "/subscriptions",
            json!({ "url": format!("http://{addr}/"), "event_types": ["*"], "description": "a\u{0}b" }),
            "description",
        ),
        (
            "/events",
            json!({ "type": "t.x", "payload": {}, "idempotency_key": "k\u{0}" }),
            "idempotency_key",
        ),
        (
            "/tokens",
            json!({ "customer_id": "acme", "label": "l\u{0}" }),
            "label",
        ),
    ];
    for (path, body, field) in refused {
        let resp = app.post(path, &body).await;
        assert_eq!(resp.status(), 422, "{path}");
        let err: Value = resp.json().await.unwrap();
        let message = err["error"]["message"].as_str().unwrap_or_default();
        assert!(message.starts_with(field), "{path}: {err}");
    }
    let resp = app
        .get(&format!("/subscriptions/{sub_id}/deliveries?cursor=a%00b"))
        .await;
    assert_eq!(resp.status(), 400);
    // Nothing of the refused requests was written: one subscription, one event.
    let subs = app.get_json("/subscriptions").await;
    assert_eq!(subs["data"].as_array().unwrap().len(), 1, "{subs}");
    let page = app
        .get_json(&format!("/subscriptions/{sub_id}/deliveries"))
        .await;
    assert_eq!(page["data"].as_array().unwrap().len(), 1, "{page}");

    // A payload's `\u0000` is the producer's JSON text, kept and delivered.
    let resp = app
        .post(
            "/events",
            &json!({ "type": "t.x", "payload": { "s": "a\u{0}b" } }),
        )
        .await;
    assert_eq!(resp.status(), 202);
    eventually("the payload with an escaped NUL is delivered", || async {
        let page = app
            .get_json(&format!(
                "/subscriptions/{sub_id}/deliveries?status=delivered"
            ))
            .await;
        (page["data"].as_array().unwrap().len() == 2).then_some(())
    })
    .await;
    app.stop().await;
}
