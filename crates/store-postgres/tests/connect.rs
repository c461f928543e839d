//! Connection behaviour the conformance suite cannot see: the schema in the
//! URL, and failing fast (as `Unavailable`) instead of hanging.

use std::time::{Duration, Instant};

use hookd_store::{Store, StoreError};
use hookd_store_postgres::{PgOptions, PgStore, testing};
use sqlx::Connection;

#[tokio::test]
async fn migrations_land_in_the_schema_named_by_the_url() {
    let Some(db) = testing::fresh_schema().await else {
        return;
    };
    let store = PgStore::connect(&db.url, PgOptions::default())
        .await
        .unwrap();
    store.migrate().await.unwrap();
    store.close().await;

    let base = std::env::var(testing::DATABASE_URL_VAR).unwrap();
    let mut conn = sqlx::PgConnection::connect(&base).await.unwrap();
    let (n,): (i64,) = sqlx::query_as(
        "SELECT count(*) FROM information_schema.tables WHERE table_schema = $1 \
         AND table_name IN ('subscriptions', 'events', 'deliveries', 'attempts', 'tokens', 'meta')",
    )
    .bind(&db.schema)
    .fetch_one(&mut conn)
    .await
    .unwrap();
    assert_eq!(n, 6);
    conn.close().await.unwrap();
    db.cleanup().await.unwrap();
}

#[tokio::test]
async fn a_blocked_statement_fails_as_unavailable_after_the_statement_timeout() {
    let Some(db) = testing::fresh_schema().await else {
        return;
    };
    let opts = PgOptions {
        statement_timeout: Duration::from_millis(300),
        ..PgOptions::default()
    };
    let store = PgStore::connect(&db.url, opts).await.unwrap();
    store.migrate().await.unwrap();

    // Another session holds a lock the store's read needs, as a stuck
    // transaction or a long migration would.
    let mut blocker = sqlx::PgConnection::connect(&db.url).await.unwrap();
    sqlx::raw_sql("BEGIN; LOCK TABLE meta IN ACCESS EXCLUSIVE MODE")
        .execute(&mut blocker)
        .await
        .unwrap();

    let started = Instant::now();
    let res = store.subscription_generation().await;
    assert!(matches!(res, Err(StoreError::Unavailable(_))), "{res:?}");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );

    sqlx::raw_sql("ROLLBACK")
        .execute(&mut blocker)
        .await
        .unwrap();
    blocker.close().await.unwrap();
    store.subscription_generation().await.unwrap();
    store.close().await;
    db.cleanup().await.unwrap();
}

#[tokio::test]
async fn connecting_to_an_unreachable_database_is_unavailable_within_the_acquire_timeout() {
    // Port 1 on loopback: nothing listens, so connecting is refused at once.
    let opts = PgOptions {
        acquire_timeout: Duration::from_millis(500),
        ..PgOptions::default()
    };
    let started = Instant::now();
    let res = PgStore::connect("postgres://postgres@127.0.0.1:1/test", opts).await;
    assert!(matches!(res, Err(StoreError::Unavailable(_))), "{res:?}");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
}

#[tokio::test]
async fn connecting_to_a_database_that_never_answers_is_unavailable_within_the_acquire_timeout() {
    // A listener that accepts and then says nothing, like a frozen server.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let (stop, mut stopped) = tokio::sync::oneshot::channel::<()>();
    let silent = tokio::spawn(async move {
        let mut held = Vec::new();
        loop {
            tokio::select! {
                conn = listener.accept() => held.push(conn.unwrap().0),
                _ = &mut stopped => break,
            }
        }
    });
    let opts = PgOptions {
        acquire_timeout: Duration::from_millis(500),
        ..PgOptions::default()
    };
    let started = Instant::now();
    let res = PgStore::connect(&format!("postgres://postgres@127.0.0.1:{port}/test"), opts).await;
    assert!(matches!(res, Err(StoreError::Unavailable(_))), "{res:?}");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    stop.send(()).unwrap();
    silent.await.unwrap();
}
