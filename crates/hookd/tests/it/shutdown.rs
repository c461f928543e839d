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
