//! A crash at each point where an event or a delivery changes hands, on
//! both backends: the real `hookd serve` binary runs with one failpoint armed
//! (`HOOKD_FAILPOINTS`, action `exit`: the process exits on the spot), is
//! driven until it dies there, then restarts on the same database without
//! it. The end state must keep the guarantee: every accepted event reaches
//! every matching subscription at least once, with a stable `webhook-id`,
//! or is dead-lettered.
//!
//! These tests also prove that the binary `cargo test` builds has
//! failpoints compiled in: each asserts the process exited with
//! [`FAILPOINT_EXIT_CODE`], which only an armed failpoint produces.

use hookd::cli::FAILPOINT_EXIT_CODE;
use serde_json::{Value, json};

use crate::helpers::*;

crate::on_both_backends!(
    a_crash_after_the_ingest_commit_before_the_202_keeps_one_event,
    a_crash_after_the_claim_before_the_send_delivers_once_after_the_lease,
    a_crash_after_a_2xx_before_recording_it_delivers_twice_with_one_webhook_id,
    a_crash_while_scheduling_a_retry_ends_delivered,
    a_crash_while_dead_lettering_ends_dead_once,
);

/// The one event's deliveries, from `GET /events/{id}`.
async fn deliveries(p: &ServeProcess, event_id: &str) -> Vec<Value> {
    p.get_json(&format!("/events/{event_id}")).await["deliveries"]
        .as_array()
        .unwrap()
        .clone()
}

/// Waits until the event's only delivery is in `state`; returns it.
async fn settles_in(p: &ServeProcess, event_id: &str, state: &str) -> Value {
    eventually(&format!("the delivery to be {state}"), || async {
        let ds = deliveries(p, event_id).await;
        assert_eq!(
            ds.len(),
            1,
            "one delivery per (event, subscription): {ds:?}"
        );
        (ds[0]["state"] == state).then(|| ds[0].clone())
    })
    .await
}

/// Posts one event; `Ok(event_id)` on 202, `Err` if the connection failed.
async fn post_event(p: &ServeProcess, key: &str) -> Result<String, reqwest::Error> {
    let body = json!({"type": "order.created", "payload": {"key": key}, "idempotency_key": key});
    let r = p
        .client
        .post(p.url("/events"))
        .bearer_auth(PROCESS_TOKEN)
        .json(&body)
        .send()
        .await?;
    let status = r.status();
    let v: Value = r.json().await?;
    assert_eq!(status, 202, "{v}");
    Ok(v["event_id"].as_str().unwrap().to_owned())
}

/// Waits for the armed failpoint to end the process.
async fn crashes_at(p: &mut ServeProcess, failpoint: &str) {
    let code = p.wait_for_exit().await;
    assert_eq!(
        code,
        Some(FAILPOINT_EXIT_CODE),
        "hookd serve should have exited at failpoint {failpoint} (is the binary built with the `failpoints` feature?):\n{}",
        p.log_text()
    );
}

/// Everything a scenario starts from: a database, a receiver, the process
/// with `failpoint` armed, and one subscription (`sub` adds to its body).
async fn scenario(
    backend: Backend,
    failpoint: &str,
    sub: Value,
) -> Option<(
    ServeProcess,
    TestReceiver,
    Box<dyn std::any::Any + Send>,
    String,
)> {
    let (database, guard) = fresh_database(backend).await?;
    let rx = TestReceiver::start("127.0.0.2").await;
    let p = ServeProcess::start(&database, Some(&format!("{failpoint}=exit"))).await;
    let mut body = json!({"url": rx.url(), "event_types": ["order.*"]});
    body.as_object_mut()
        .unwrap()
        .extend(sub.as_object().unwrap().clone());
    p.subscribe_with(body).await;
    Some((p, rx, guard, database))
}

fn webhook_ids(rx: &TestReceiver) -> Vec<String> {
    rx.received()
        .iter()
        .map(|r| r.header("webhook-id").to_owned())
        .collect()
}

async fn a_crash_after_the_ingest_commit_before_the_202_keeps_one_event(backend: Backend) {
    let Some((mut p, rx, _db, database)) =
        scenario(backend, "ingest.after_commit", json!({})).await
    else {
        return;
    };
    let lost = post_event(&p, "order-1").await;
    assert!(
        lost.is_err(),
        "the client sees a connection error, not an answer: {lost:?}"
    );
    crashes_at(&mut p, "ingest.after_commit").await;

    // The producer retries with the same key once hookd is back.
    let p = ServeProcess::start(&database, None).await;
    let event_id = post_event(&p, "order-1").await.unwrap();
    let again = post_event(&p, "order-1").await.unwrap();
    assert_eq!(again, event_id, "the key names one event");
    let d = settles_in(&p, &event_id, "delivered").await;
    assert_eq!(d["attempts"].as_array().unwrap().len(), 1, "{d}");
    let got = rx.received();
    assert_eq!(got.len(), 1, "exactly one webhook for the event");
    assert_eq!(got[0].json()["event_id"], event_id.as_str());
}

async fn a_crash_after_the_claim_before_the_send_delivers_once_after_the_lease(backend: Backend) {
    let Some((mut p, rx, _db, database)) =
        scenario(backend, "dispatch.after_claim", json!({})).await
    else {
        return;
    };
    let event_id = post_event(&p, "order-1").await.unwrap();
    crashes_at(&mut p, "dispatch.after_claim").await;
    assert_eq!(rx.count(), 0, "nothing was sent before the crash");

    let p = ServeProcess::start(&database, None).await;
    let d = settles_in(&p, &event_id, "delivered").await;
    assert_eq!(
        d["attempt"], 1,
        "one attempt, made after the lease expired: {d}"
    );
    assert_eq!(d["attempts"].as_array().unwrap().len(), 1, "{d}");
    let got = rx.received();
    assert_eq!(got.len(), 1, "delivered exactly once");
    assert_eq!(got[0].json()["event_id"], event_id.as_str());
}

async fn a_crash_after_a_2xx_before_recording_it_delivers_twice_with_one_webhook_id(
    backend: Backend,
) {
    let Some((mut p, rx, _db, database)) =
        scenario(backend, "dispatch.after_response", json!({})).await
    else {
        return;
    };
    let event_id = post_event(&p, "order-1").await.unwrap();
    crashes_at(&mut p, "dispatch.after_response").await;
    assert_eq!(rx.count(), 1, "the receiver answered 200 before the crash");

    let p = ServeProcess::start(&database, None).await;
    let d = settles_in(&p, &event_id, "delivered").await;
    assert_eq!(
        d["attempts"].as_array().unwrap().len(),
        1,
        "only the attempt after the restart was recorded: {d}"
    );
    let ids = webhook_ids(&rx);
    assert_eq!(ids.len(), 2, "delivered twice (at least once): {ids:?}");
    assert_eq!(ids[0], ids[1], "both carry the same webhook-id");
}

async fn a_crash_while_scheduling_a_retry_ends_delivered(backend: Backend) {
    let Some((mut p, rx, _db, database)) =
        scenario(backend, "dispatch.before_record_retry", json!({})).await
    else {
        return;
    };
    rx.script(&[500]);
    let event_id = post_event(&p, "order-1").await.unwrap();
    crashes_at(&mut p, "dispatch.before_record_retry").await;
    assert_eq!(rx.count(), 1, "the 500 arrived before the crash");

    let p = ServeProcess::start(&database, None).await;
    let d = settles_in(&p, &event_id, "delivered").await;
    let attempts = d["attempts"].as_array().unwrap();
    assert_eq!(attempts.last().unwrap()["status"], 200, "{d}");
    let ids = webhook_ids(&rx);
    assert_eq!(ids.len(), 2, "{ids:?}");
    assert_eq!(ids[0], ids[1], "the retry carries the same webhook-id");
}

async fn a_crash_while_dead_lettering_ends_dead_once(backend: Backend) {
    let Some((mut p, rx, _db, database)) = scenario(
        backend,
        "dispatch.before_record_dead",
        json!({"retry_policy": {"max_attempts": 1}}),
    )
    .await
    else {
        return;
    };
    rx.script(&[500, 500, 500]);
    let event_id = post_event(&p, "order-1").await.unwrap();
    crashes_at(&mut p, "dispatch.before_record_dead").await;
    assert_eq!(rx.count(), 1, "the 500 arrived before the crash");

    let p = ServeProcess::start(&database, None).await;
    let d = settles_in(&p, &event_id, "dead").await;
    let attempts = d["attempts"].as_array().unwrap();
    assert_eq!(
        attempts.len(),
        1,
        "exactly the attempt made after the restart is recorded: {d}"
    );
    assert_eq!(attempts[0]["status"], 500, "{d}");
    assert!(d["next_attempt_at"].is_null(), "dead is final: {d}");
    let ids = webhook_ids(&rx);
    assert_eq!(ids.len(), 2, "{ids:?}");
    assert_eq!(ids[0], ids[1]);
}
