//! The delivery queue (migration 0015) and the per-statement reference
//! checks (0016): what the conformance suite cannot see, because it only
//! sees the `Store` trait. Every write of a delivery must leave its
//! `delivery_queue` row exactly matching it.

mod common;

use std::time::Duration;

use chrono::Utc;
use common::ingest;
use hookd_domain::SubscriptionId;
use hookd_store::conformance::new_sub;
use hookd_store::{
    Attempt, AttemptRecord, ClaimOrder, ClaimRequest, ClaimedDelivery, NextState, RecordOutcome,
    Store, Subscription,
};
use hookd_store_postgres::{PgOptions, PgStore, testing};
use sqlx::{Connection, PgConnection};

/// A delivery's queue columns: (sub, id, day, host, state, due, lease).
type QueueRow = (
    uuid::Uuid,
    uuid::Uuid,
    chrono::DateTime<Utc>,
    String,
    String,
    chrono::DateTime<Utc>,
    Option<chrono::DateTime<Utc>>,
);

macro_rules! queue_columns {
    () => {
        "sub_id, delivery_id, retain_from, destination_host, state, next_attempt_at, lease_expires"
    };
}

/// The unfinished deliveries as `deliveries` has them, and `delivery_queue`;
/// they must be equal.
async fn assert_in_sync(conn: &mut PgConnection, when: &str) -> usize {
    let wide: Vec<QueueRow> = sqlx::query_as(concat!(
        "SELECT ",
        queue_columns!(),
        " FROM deliveries WHERE state IN ('pending', 'inflight') ORDER BY delivery_id"
    ))
    .fetch_all(&mut *conn)
    .await
    .unwrap();
    let queue: Vec<QueueRow> = sqlx::query_as(concat!(
        "SELECT ",
        queue_columns!(),
        " FROM delivery_queue ORDER BY delivery_id"
    ))
    .fetch_all(&mut *conn)
    .await
    .unwrap();
    assert_eq!(queue, wide, "the queue after {when}");
    queue.len()
}

/// A migrated store in a fresh schema, and a connection to look at it.
async fn fixture() -> Option<(PgStore, PgConnection, testing::TestDatabase)> {
    let db = testing::fresh_schema().await?;
    let store = PgStore::connect(&db.url, PgOptions::default())
        .await
        .unwrap();
    store.migrate().await.unwrap();
    let conn = PgConnection::connect(&db.url).await.unwrap();
    Some((store, conn, db))
}

async fn finish(store: PgStore, conn: PgConnection, db: testing::TestDatabase) {
    store.close().await;
    let _ = conn.close().await;
    db.cleanup().await.unwrap();
}

async fn claim(store: &PgStore, sub: &Subscription, lease: Duration) -> Vec<ClaimedDelivery> {
    store
        .claim_due(&ClaimRequest {
            worker_id: "w".into(),
            destination: sub.url.host().to_owned(),
            subscription: Some(sub.id),
            order: ClaimOrder::OldestFirst,
            limit: 10,
            lease,
        })
        .await
        .unwrap()
}

fn record(c: &ClaimedDelivery, status: u16, next: NextState) -> AttemptRecord {
    AttemptRecord {
        lease: c.lease,
        attempt: Attempt {
            number: c.delivery.attempt + 1,
            started_at: Utc::now(),
            duration: Duration::from_millis(3),
            status: Some(status),
            error_class: None,
            response_snippet: None,
        },
        next,
        last_error: None,
    }
}

#[tokio::test]
async fn the_queue_holds_exactly_the_unfinished_deliveries_through_their_lives() {
    let Some((store, mut conn, db)) = fixture().await else {
        return;
    };
    let a = store
        .create_subscription(new_sub("a.example", None))
        .await
        .unwrap();
    let b = store
        .create_subscription(new_sub("b.example", None))
        .await
        .unwrap();

    for _ in 0..3 {
        ingest(&store, &[&a, &b]).await;
    }
    assert_eq!(assert_in_sync(&mut conn, "ingest").await, 6);

    let claimed = claim(&store, &a, Duration::from_secs(60)).await;
    assert_eq!(claimed.len(), 3);
    assert_in_sync(&mut conn, "a claim").await;

    // One delivered (leaves the queue), one to retry (pending again, due
    // later), one renewed and one still in flight.
    let outcomes = store
        .record_attempts(vec![
            record(&claimed[0], 200, NextState::Delivered),
            record(
                &claimed[1],
                503,
                NextState::Retry {
                    delay: Duration::from_secs(3600),
                },
            ),
        ])
        .await
        .unwrap();
    assert_eq!(outcomes, vec![RecordOutcome::Recorded; 2]);
    assert!(
        store
            .renew_lease(&claimed[2].lease, Duration::from_secs(120))
            .await
            .unwrap()
    );
    assert_eq!(assert_in_sync(&mut conn, "records and a renewal").await, 5);

    // Released, then claimed with a lease that has already run out and
    // reclaimed.
    assert_eq!(store.release(&[claimed[2].lease]).await.unwrap(), 1);
    assert_in_sync(&mut conn, "a release").await;
    assert_eq!(claim(&store, &a, Duration::ZERO).await.len(), 1);
    assert_eq!(store.reclaim_expired().await.unwrap(), 1);
    assert_in_sync(&mut conn, "a reclaim").await;

    // A replay puts the delivered one back.
    store
        .replay_delivery(&claimed[0].delivery.id)
        .await
        .unwrap();
    assert_eq!(assert_in_sync(&mut conn, "a replay").await, 6);

    // Deleting b fails its deliveries: they leave the queue.
    store.delete_subscription(&b.id).await.unwrap();
    assert_eq!(assert_in_sync(&mut conn, "a subscription delete").await, 3);

    finish(store, conn, db).await;
}

#[tokio::test]
async fn a_delivery_naming_a_missing_event_or_subscription_is_refused_whole() {
    let Some((store, mut conn, db)) = fixture().await else {
        return;
    };
    let a = store
        .create_subscription(new_sub("a.example", None))
        .await
        .unwrap();
    let event = ingest(&store, &[&a]).await[0];
    let event_id: uuid::Uuid =
        sqlx::query_scalar("SELECT event_id FROM deliveries WHERE delivery_id = $1")
            .bind(event.as_uuid())
            .fetch_one(&mut conn)
            .await
            .unwrap();
    let insert = "INSERT INTO deliveries (delivery_id, event_id, sub_id, event_type, destination_host) \
                  SELECT unnest($1::uuid[]), unnest($2::uuid[]), unnest($3::uuid[]), 'x', 'a.example'";
    let known_sub = *a.id.as_uuid();
    let cases = [
        ("an unknown event", uuid::Uuid::now_v7(), known_sub),
        (
            "an unknown subscription",
            event_id,
            *SubscriptionId::new().as_uuid(),
        ),
    ];
    for (what, bad_event, bad_sub) in cases {
        // Two rows, the first of them sound: neither is written.
        let err = sqlx::query(insert)
            .bind(vec![uuid::Uuid::now_v7(), uuid::Uuid::now_v7()])
            .bind(vec![event_id, bad_event])
            .bind(vec![known_sub, bad_sub])
            .execute(&mut conn)
            .await
            .expect_err(what);
        let code = err.as_database_error().and_then(|e| e.code());
        assert_eq!(code.as_deref(), Some("23503"), "{what}: {err}");
    }
    assert_eq!(assert_in_sync(&mut conn, "refused inserts").await, 1);

    finish(store, conn, db).await;
}
