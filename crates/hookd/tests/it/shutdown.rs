//! Graceful shutdown: stop claiming, give in-flight attempts a bounded
//! grace, then cut them off and release their deliveries.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use serde_json::json;

use crate::helpers::*;

crate::on_both_backends!(an_attempt_cut_off_at_shutdown_is_released_not_lost);

/// A destination on `ip` that accepts connections and never answers, and
/// how many it has accepted (one per request: none ever finishes).
async fn never_answering(ip: &str) -> (std::net::SocketAddr, Arc<AtomicUsize>) {
    let listener = tokio::net::TcpListener::bind((ip, 0)).await.unwrap();
    let addr = listener.local_addr().unwrap();
    let connections = Arc::new(AtomicUsize::new(0));
    let seen = connections.clone();
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((sock, _)) = listener.accept().await {
            seen.fetch_add(1, Ordering::SeqCst);
            held.push(sock);
        }
    });
    (addr, connections)
}

async fn an_attempt_cut_off_at_shutdown_is_released_not_lost(backend: Backend) {
    let Some(app) = spawn_app_with(backend, |c| {
        c.attempt_timeout = Duration::from_secs(20);
        c.shutdown_grace = Duration::from_millis(300);
    })
    .await
    else {
        return;
    };
    // The attempt outlives the grace.
    let (addr, connections) = never_answering("127.0.0.30").await;
    let sub = app.subscribe(&format!("http://{addr}/hook"), &["*"]).await;
    let sub_id = sub["sub_id"].as_str().unwrap().to_owned();
    app.send_event("slow.thing", json!({})).await;
    eventually("the attempt to reach the destination", || async {
        (connections.load(Ordering::SeqCst) > 0).then_some(())
    })
    .await;

    let database = app.database.clone();
    let _database_kept = app.stop().await; // returns only after the grace and the release

    let store = open_store(&database).await;
    let page = store
        .list_deliveries(&hookd_store::DeliveryQuery {
            sub_id: Some(sub_id.parse().unwrap()),
            limit: 10,
            ..Default::default()
        })
        .await
        .unwrap();
    let d = &page[0].delivery;
    assert_eq!(
        d.state,
        hookd_domain::delivery::DeliveryState::Pending,
        "released for the next process, not left leased"
    );
    assert_eq!(d.attempt, 0, "a cut-off attempt is not counted");
}

crate::on_both_backends!(deliveries_claimed_ahead_wait_within_the_cap_and_go_back_at_shutdown);

/// A busy destination gets deliveries claimed ahead of a free slot (§9.1):
/// they wait in memory, so the destination still sees no more than its
/// cap, and at shutdown they go back to the store like cut-off attempts.
async fn deliveries_claimed_ahead_wait_within_the_cap_and_go_back_at_shutdown(backend: Backend) {
    const CAP: u32 = 2;
    const EVENTS: usize = 12;
    let Some(app) = spawn_app_with(backend, |c| {
        c.admission.concurrency = CAP;
        c.admission.rate_override = Some(10_000.0);
        c.attempt_timeout = Duration::from_secs(20);
        c.shutdown_grace = Duration::from_millis(300);
    })
    .await
    else {
        return;
    };
    // Every request holds its connection.
    let (addr, connections) = never_answering("127.0.0.31").await;
    let sub = app.subscribe(&format!("http://{addr}/hook"), &["*"]).await;
    let sub_id: hookd_domain::SubscriptionId = sub["sub_id"].as_str().unwrap().parse().unwrap();
    for i in 0..EVENTS {
        app.send_event("busy.thing", json!({ "i": i })).await;
    }
    let store = open_store(&app.database).await;
    let in_state = |state| {
        let store = store.clone();
        async move {
            store
                .list_deliveries(&hookd_store::DeliveryQuery {
                    sub_id: Some(sub_id),
                    state: Some(state),
                    limit: 100,
                    ..Default::default()
                })
                .await
                .unwrap()
                .len()
        }
    };
    use hookd_domain::delivery::DeliveryState::{Inflight, Pending};
    let claimed = eventually("deliveries claimed ahead of the full cap", || async {
        let n = in_state(Inflight).await;
        (n > CAP as usize).then_some(n)
    })
    .await;
    eventually("the cap's attempts at the destination", || async {
        (connections.load(Ordering::SeqCst) == CAP as usize).then_some(())
    })
    .await;

    let _database_kept = app.stop().await;
    assert_eq!(
        connections.load(Ordering::SeqCst),
        CAP as usize,
        "{claimed} were claimed, but only the cap's {CAP} reached the destination"
    );
    assert_eq!(in_state(Inflight).await, 0, "nothing is left leased");
    assert_eq!(
        in_state(Pending).await,
        EVENTS,
        "every delivery is pending again"
    );
}
