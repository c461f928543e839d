//! Circuit gossip's transport (`LISTEN/NOTIFY`) against a real server: an
//! opening reaches the listener, channels are per schema, and a listener
//! whose connection is killed comes back by itself.

use std::time::Duration;

use hookd_store_postgres::gossip::CircuitOpened;
use hookd_store_postgres::{PgOptions, PgStore, testing};
use sqlx::Connection;

fn opened(host: &str) -> CircuitOpened {
    CircuitOpened {
        host: host.to_owned(),
        node: "node-a".to_owned(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_opening_reaches_listeners_of_its_schema_even_after_a_dropped_connection() {
    let Some(db) = testing::fresh_schema().await else {
        return;
    };
    let Some(other) = testing::fresh_schema().await else {
        return;
    };
    let store = PgStore::connect(&db.url, PgOptions::default())
        .await
        .unwrap();
    let elsewhere = PgStore::connect(&other.url, PgOptions::default())
        .await
        .unwrap();
    let channel = store.circuit_channel().await.unwrap();
    assert_eq!(channel, format!("hookd_circuit_{}", db.schema));
    let other_channel = elsewhere.circuit_channel().await.unwrap();
    assert_ne!(channel, other_channel, "one channel per schema");

    let mut listener = store.listen_circuits(&channel).await.unwrap();
    let mut other_listener = elsewhere.listen_circuits(&other_channel).await.unwrap();
    store
        .notify_circuit_open(&channel, &opened("a.example"))
        .await
        .unwrap();
    let got = tokio::time::timeout(Duration::from_secs(5), listener.recv())
        .await
        .expect("the opening arrives")
        .unwrap();
    assert_eq!(got, opened("a.example"));
    assert!(
        tokio::time::timeout(Duration::from_millis(300), other_listener.recv())
            .await
            .is_err(),
        "another schema's listener hears nothing"
    );

    // Kill the listener's connection, as a failover or a network cut would.
    let base = std::env::var(testing::DATABASE_URL_VAR).unwrap();
    let mut admin = sqlx::postgres::PgConnection::connect(&base).await.unwrap();
    let killed: Vec<bool> = sqlx::query_scalar(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
         WHERE query LIKE 'LISTEN %' AND position($1 in query) > 0",
    )
    .bind(format!("\"{channel}\""))
    .fetch_all(&mut admin)
    .await
    .unwrap();
    assert_eq!(killed, [true], "the listener's connection was found");
    let _ = admin.close().await;

    // What is published while it is away is lost to it; once it has
    // reconnected (and listens again), openings arrive again.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the listener never came back"
        );
        store
            .notify_circuit_open(&channel, &opened("b.example"))
            .await
            .unwrap();
        match tokio::time::timeout(Duration::from_millis(500), listener.recv()).await {
            Ok(Ok(got)) if got == opened("b.example") => break,
            // A reconnect that failed: the next call tries again.
            Ok(Err(_)) | Ok(Ok(_)) | Err(_) => {}
        }
    }
    store.close().await;
    elsewhere.close().await;
}
