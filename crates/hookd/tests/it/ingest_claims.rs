//! Deliveries claimed at ingest (§9.1's in-memory queue, fed from ingest):
//! a new delivery this node can send at once is written `inflight` in its
//! ingest transaction and handed to the dispatcher after the commit.

use serde_json::{Value, json};

use crate::helpers::*;

/// The delivery of `event_id` to `sub_id`, once it is in flight.
async fn in_flight(app: &TestApp, sub_id: &str, event_id: &str) -> Value {
    eventually("the delivery to be in flight", || async {
        let page = app
            .get_json(&format!(
                "/subscriptions/{sub_id}/deliveries?status=inflight"
            ))
            .await;
        page["data"]
            .as_array()?
            .iter()
            .find(|d| d["event_id"] == event_id)
            .cloned()
    })
    .await
}

/// Once the claim loop has seen a healthy destination, a new event's
/// delivery to it is created in flight: no claim rewrote its row, so its
/// `updated_at` is still the ingest transaction's time. With
/// `--no-ingest-claims` the same delivery is written pending and claimed
/// after the commit, which moves `updated_at`. PostgreSQL only: its clock
/// has microseconds, so a later transaction's time always differs
/// (SQLite's milliseconds could make a claim look like the ingest).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_delivery_to_a_healthy_destination_is_claimed_in_its_ingest_transaction() {
    for (claims, ip) in [(true, "127.0.0.120"), (false, "127.0.0.121")] {
        let Some(app) = spawn_app_tuned(Backend::Postgres, |c| c.ingest_claims = claims).await
        else {
            return;
        };
        let rx = TestReceiver::start(ip).await;
        let sub = app.subscribe(&rx.url(), &["*"]).await;
        let sub_id = sub["sub_id"].as_str().unwrap().to_owned();
        // The first delivery goes through the claim loop: admission has
        // not seen the destination yet.
        app.send_event("warm.up", json!({})).await;
        rx.wait_for(1).await;
        rx.hold();
        let event_id = app.send_event("order.created", json!({})).await;
        let d = in_flight(&app, &sub_id, &event_id).await;
        if claims {
            assert_eq!(
                d["updated_at"], d["created_at"],
                "created in flight, never rewritten by a claim: {d}"
            );
        } else {
            assert_ne!(
                d["updated_at"], d["created_at"],
                "claimed after its commit: {d}"
            );
        }
        rx.release();
        rx.wait_for(2).await;
        eventually("both delivered", || async {
            let page = app
                .get_json(&format!(
                    "/subscriptions/{sub_id}/deliveries?status=delivered"
                ))
                .await;
            (page["data"].as_array()?.len() == 2).then_some(())
        })
        .await;
        app.stop().await;
    }
}
