//! Graceful shutdown: stop claiming, give in-flight attempts a bounded
//! grace, then cut them off and release their deliveries.

use std::time::Duration;

use serde_json::json;

use crate::helpers::*;

crate::on_both_backends!(an_attempt_cut_off_at_shutdown_is_released_not_lost);

async fn an_attempt_cut_off_at_shutdown_is_released_not_lost(backend: Backend) {
    let Some(app) = spawn_app_with(backend, |c| {
        c.attempt_timeout = Duration::from_secs(20);
        c.shutdown_grace = Duration::from_millis(300);
    })
    .await
    else {
        return;
    };
    // A destination that accepts and never answers: the attempt outlives the grace.
    let listener = tokio::net::TcpListener::bind(("127.0.0.30", 0))
        .await
        .unwrap();
    let addr = listener.local_addr().unwrap();
    let (seen_tx, mut seen_rx) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((sock, _)) = listener.accept().await {
            let _ = seen_tx.send(());
            held.push(sock);
        }
    });
    let sub = app.subscribe(&format!("http://{addr}/hook"), &["*"]).await;
    let sub_id = sub["sub_id"].as_str().unwrap().to_owned();
    app.send_event("slow.thing", json!({})).await;
    tokio::time::timeout(DEADLINE, seen_rx.recv())
        .await
        .expect("the attempt reached the destination");

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
    // Accepts and never answers: every request holds its connection.
    let listener = tokio::net::TcpListener::bind(("127.0.0.31", 0))
        .await
        .unwrap();
    let addr = listener.local_addr().unwrap();
    let connections = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let seen = connections.clone();
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((sock, _)) = listener.accept().await {
            seen.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            held.push(sock);
        }
    });
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
        (connections.load(std::sync::atomic::Ordering::SeqCst) == CAP as usize).then_some(())
    })
    .await;

    let _database_kept = app.stop().await;
    assert_eq!(
        connections.load(std::sync::atomic::Ordering::SeqCst),
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
