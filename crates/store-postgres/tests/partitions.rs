//! Day partitions (migration 0006) and retention over them: what the
//! conformance suite cannot see because it cannot look at the catalog or
//! put rows in an old day.

mod common;

use std::time::Duration;

use chrono::{NaiveDate, Utc};
use common::ingest;
use hookd_domain::DeliveryId;
use hookd_store::conformance::{new_event, new_sub};
use hookd_store::{
    Attempt, AttemptRecord, ClaimOrder, ClaimRequest, ClaimedDelivery, NewDelivery, NextState,
    RecordOutcome, RetentionPolicy, Store, StoreError, Subscription,
};
use hookd_store_postgres::{PgOptions, PgStore, testing};
use sqlx::{Connection, PgConnection};

/// How far back the "old" day is.
const DAYS_AGO: i64 = 10;

struct Fixture {
    store: PgStore,
    /// A connection in the test's schema, for looking at (and aging) rows.
    conn: PgConnection,
    db: testing::TestDatabase,
}

async fn fixture() -> Option<Fixture> {
    let db = testing::fresh_schema().await?;
    let store = PgStore::connect(&db.url, PgOptions::default())
        .await
        .expect("connect");
    store.migrate().await.expect("migrate");
    let conn = PgConnection::connect(&db.url).await.expect("connect");
    Some(Fixture { store, conn, db })
}

impl Fixture {
    async fn finish(self) {
        let Fixture { store, conn, db } = self;
        store.close().await;
        let _ = conn.close().await;
        db.cleanup().await.unwrap();
    }

    async fn today(&mut self) -> NaiveDate {
        sqlx::query_scalar("SELECT (now() AT TIME ZONE 'UTC')::date")
            .fetch_one(&mut self.conn)
            .await
            .unwrap()
    }

    /// Whether a table of this name exists in the schema, and whether it is
    /// a partition of deliveries or attempts.
    async fn partition_exists(&mut self, name: &str) -> (bool, bool) {
        let in_class: bool = sqlx::query_scalar(
            "SELECT EXISTS (SELECT 1 FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace \
             WHERE n.nspname = current_schema() AND c.relname = $1)",
        )
        .bind(name)
        .fetch_one(&mut self.conn)
        .await
        .unwrap();
        let inherits: bool = sqlx::query_scalar(
            "SELECT EXISTS (SELECT 1 FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid \
             JOIN pg_namespace n ON n.oid = c.relnamespace \
             WHERE n.nspname = current_schema() AND c.relname = $1 \
               AND i.inhparent IN ('deliveries'::regclass, 'attempts'::regclass))",
        )
        .bind(name)
        .fetch_one(&mut self.conn)
        .await
        .unwrap();
        (in_class, inherits)
    }

    /// Creates the old day's partitions with the crate's own function and
    /// moves `ids` (with their attempts and events) into that day, as if
    /// they had been created then: `retain_from`, `created_at` and the
    /// attempts' `started_at` all go back `DAYS_AGO` days.
    async fn age(&mut self, ids: &[DeliveryId]) -> NaiveDate {
        let old = self.today().await - chrono::Duration::days(DAYS_AGO);
        let created: bool = sqlx::query_scalar("SELECT hookd_day_partition($1)")
            .bind(old)
            .fetch_one(&mut self.conn)
            .await
            .unwrap();
        assert!(created, "the old day had no partition yet");
        let ids: Vec<uuid::Uuid> = ids.iter().map(|d| *d.as_uuid()).collect();
        let back = format!("{DAYS_AGO} days");
        sqlx::query(
            "UPDATE deliveries SET retain_from = retain_from - $2::interval, \
             created_at = created_at - $2::interval WHERE delivery_id = ANY($1)",
        )
        .bind(&ids)
        .bind(&back)
        .execute(&mut self.conn)
        .await
        .unwrap();
        sqlx::query(
            "UPDATE attempts SET retain_from = retain_from - $2::interval, \
             started_at = started_at - $2::interval WHERE delivery_id = ANY($1)",
        )
        .bind(&ids)
        .bind(&back)
        .execute(&mut self.conn)
        .await
        .unwrap();
        sqlx::query(
            "UPDATE events SET created_at = created_at - $2::interval \
             WHERE event_id IN (SELECT event_id FROM deliveries WHERE delivery_id = ANY($1))",
        )
        .bind(&ids)
        .bind(&back)
        .execute(&mut self.conn)
        .await
        .unwrap();
        old
    }

    /// The partition a delivery's row, and each of its attempts' rows, is in.
    async fn partitions_of(&mut self, id: &DeliveryId) -> (String, Vec<String>) {
        let delivery: String = sqlx::query_scalar(
            "SELECT tableoid::regclass::text FROM deliveries WHERE delivery_id = $1",
        )
        .bind(id.as_uuid())
        .fetch_one(&mut self.conn)
        .await
        .unwrap();
        let attempts: Vec<String> = sqlx::query_scalar(
            "SELECT tableoid::regclass::text FROM attempts WHERE delivery_id = $1 ORDER BY attempt_id",
        )
        .bind(id.as_uuid())
        .fetch_all(&mut self.conn)
        .await
        .unwrap();
        (delivery, attempts)
    }
}

fn suffix(day: NaiveDate) -> String {
    day.format("%Y%m%d").to_string()
}

/// A claim of up to 10 of `sub`'s due deliveries, oldest first.
fn request(sub: &Subscription) -> ClaimRequest {
    ClaimRequest {
        worker_id: "w".into(),
        destination: sub.url.host().to_owned(),
        subscription: Some(sub.id),
        order: ClaimOrder::OldestFirst,
        limit: 10,
        lease: Duration::from_secs(60),
    }
}

async fn claim(store: &PgStore, sub: &Subscription) -> Vec<ClaimedDelivery> {
    store.claim_due(&request(sub)).await.unwrap()
}

async fn record(store: &PgStore, c: &ClaimedDelivery, status: u16, ms: u64, next: NextState) {
    let outcome = store
        .record_attempt(AttemptRecord {
            lease: c.lease,
            attempt: Attempt {
                number: c.delivery.attempt + 1,
                started_at: Utc::now(),
                duration: Duration::from_millis(ms),
                status: Some(status),
                error_class: None,
                response_snippet: None,
            },
            next,
            last_error: None,
        })
        .await
        .unwrap();
    assert_eq!(outcome, RecordOutcome::Recorded);
}

fn policy() -> RetentionPolicy {
    let day_ago = Utc::now() - chrono::Duration::days(1);
    RetentionPolicy {
        deliveries_before: day_ago,
        events_before: day_ago,
        batch: 100,
    }
}

#[tokio::test]
async fn migrate_creates_partitions_for_today_and_the_next_three_days() {
    let Some(mut f) = fixture().await else { return };
    let today = f.today().await;
    for i in 0..4 {
        let day = suffix(today + chrono::Duration::days(i));
        for table in ["deliveries", "attempts"] {
            assert_eq!(
                f.partition_exists(&format!("{table}_p{day}")).await,
                (true, true),
                "{table} {day}"
            );
        }
    }
    // Migrating again (another process, a restart) changes nothing.
    f.store.migrate().await.unwrap();
    f.finish().await;
}

#[tokio::test]
async fn a_dropped_day_takes_its_rows_with_it_and_the_rollup_keeps_the_counts() {
    let Some(mut f) = fixture().await else { return };
    let sub = f
        .store
        .create_subscription(new_sub("drop.example", None))
        .await
        .unwrap();
    // One delivered at the first try, one dead after a retry.
    let delivered = ingest(&f.store, &[&sub]).await[0];
    let dead = ingest(&f.store, &[&sub]).await[0];
    let claimed = claim(&f.store, &sub).await;
    assert_eq!(claimed.len(), 2);
    for c in &claimed {
        if c.delivery.id == delivered {
            record(&f.store, c, 200, 12, NextState::Delivered).await;
        } else {
            let retry = NextState::Retry {
                delay: Duration::ZERO,
            };
            record(&f.store, c, 503, 30, retry).await;
        }
    }
    let again = claim(&f.store, &sub).await;
    assert_eq!(again.len(), 1);
    record(&f.store, &again[0], 500, 12, NextState::Dead).await;
    let events: Vec<_> = {
        let mut e = Vec::new();
        for id in [delivered, dead] {
            e.push(f.store.get_delivery(&id).await.unwrap().delivery.event_id);
        }
        e
    };

    let old = f.age(&[delivered, dead]).await;
    let name = suffix(old);
    assert_eq!(
        f.partitions_of(&dead).await.0,
        format!("deliveries_p{name}")
    );
    let since = old - chrono::Duration::days(1);
    let before = f.store.daily_stats(&sub.id, since).await.unwrap();
    assert_eq!(before.len(), 1, "{before:?}");
    assert_eq!(before[0].day, old);
    assert_eq!(
        (
            before[0].attempts,
            before[0].delivered,
            before[0].failed,
            before[0].dead
        ),
        (3, 1, 0, 1)
    );
    assert_eq!(before[0].latency_ms, vec![(12, 2), (30, 1)]);

    let report = f.store.enforce_retention(&policy()).await.unwrap();
    assert_eq!(report.partitions_dropped, 1, "{report:?}");
    assert_eq!(
        (
            report.deliveries,
            report.attempts,
            report.events,
            report.more
        ),
        (2, 3, 2, false),
        "{report:?}"
    );

    // The partitions are gone from the catalog, and the rows with them.
    for table in ["deliveries", "attempts"] {
        assert_eq!(
            f.partition_exists(&format!("{table}_p{name}")).await,
            (false, false),
            "{table}_p{name}"
        );
    }
    for id in [delivered, dead] {
        assert!(matches!(
            f.store.get_delivery(&id).await,
            Err(StoreError::NotFound)
        ));
    }
    for id in &events {
        assert!(matches!(
            f.store.get_event(id).await,
            Err(StoreError::NotFound)
        ));
    }
    let orphans: i64 = sqlx::query_scalar("SELECT count(*) FROM attempts")
        .fetch_one(&mut f.conn)
        .await
        .unwrap();
    assert_eq!(orphans, 0);
    // The rollup reads the same, now from daily_stats alone.
    assert_eq!(f.store.daily_stats(&sub.id, since).await.unwrap(), before);
    let folded: i64 = sqlx::query_scalar("SELECT attempts FROM daily_stats WHERE sub_id = $1")
        .bind(sub.id.as_uuid())
        .fetch_one(&mut f.conn)
        .await
        .unwrap();
    assert_eq!(folded, 3);
    // Today's partitions are untouched, and a second pass has nothing to do.
    let today = suffix(f.today().await);
    assert_eq!(
        f.partition_exists(&format!("deliveries_p{today}")).await,
        (true, true)
    );
    let second = f.store.enforce_retention(&policy()).await.unwrap();
    assert_eq!(second, Default::default());
    assert_eq!(f.store.daily_stats(&sub.id, since).await.unwrap(), before);
    f.finish().await;
}

#[tokio::test]
async fn an_unfinished_delivery_of_an_expired_day_is_carried_forward_with_its_attempts() {
    let Some(mut f) = fixture().await else { return };
    let sub = f
        .store
        .create_subscription(new_sub("carry.example", None))
        .await
        .unwrap();
    let busy = f
        .store
        .create_subscription(new_sub("carry-busy.example", None))
        .await
        .unwrap();
    let done = ingest(&f.store, &[&sub]).await[0];
    let c = claim(&f.store, &sub).await;
    record(&f.store, &c[0], 200, 5, NextState::Delivered).await;
    // Waiting to retry, with one attempt behind it.
    let waiting = ingest(&f.store, &[&sub]).await[0];
    let c = claim(&f.store, &sub).await;
    let retry = NextState::Retry {
        delay: Duration::from_secs(3600),
    };
    record(&f.store, &c[0], 503, 7, retry).await;

    let old = f.age(&[done, waiting]).await;
    let name = suffix(old);
    let before_move = f.store.get_delivery(&waiting).await.unwrap();
    assert_eq!(
        f.partitions_of(&waiting).await,
        (
            format!("deliveries_p{name}"),
            vec![format!("attempts_p{name}")]
        )
    );
    let since = old - chrono::Duration::days(1);
    let stats = f.store.daily_stats(&sub.id, since).await.unwrap();

    // A second old day holds a delivery in flight: it is not carried (its
    // worker holds it) and its day stays until it finishes.
    // Claimed after it moved to its old day, as a claim of an old day's row
    // is: the lease names the row's day, which does not change in flight.
    let inflight = ingest(&f.store, &[&busy]).await[0];
    let busy_day = {
        let day = f.today().await - chrono::Duration::days(DAYS_AGO + 1);
        sqlx::query("SELECT hookd_day_partition($1)")
            .bind(day)
            .execute(&mut f.conn)
            .await
            .unwrap();
        sqlx::query(
            "UPDATE deliveries SET retain_from = retain_from - interval '11 days' \
             WHERE delivery_id = $1",
        )
        .bind(inflight.as_uuid())
        .execute(&mut f.conn)
        .await
        .unwrap();
        day
    };
    let held = claim(&f.store, &busy).await;
    assert_eq!(held.len(), 1);

    let report = f.store.enforce_retention(&policy()).await.unwrap();
    assert_eq!(report.partitions_dropped, 1, "{report:?}");
    assert_eq!((report.deliveries, report.attempts), (1, 1), "{report:?}");

    // Carried into today's partitions, attempt and all, otherwise untouched.
    let today = suffix(f.today().await);
    assert_eq!(
        f.partitions_of(&waiting).await,
        (
            format!("deliveries_p{today}"),
            vec![format!("attempts_p{today}")]
        )
    );
    assert_eq!(f.store.get_delivery(&waiting).await.unwrap(), before_move);
    // Its queue row names its new day, where claims will look for it.
    let (queued, row): (chrono::DateTime<Utc>, chrono::DateTime<Utc>) = sqlx::query_as(
        "SELECT q.retain_from, d.retain_from FROM delivery_queue q \
         JOIN deliveries d USING (delivery_id) WHERE delivery_id = $1",
    )
    .bind(waiting.as_uuid())
    .fetch_one(&mut f.conn)
    .await
    .unwrap();
    assert_eq!(queued, row);
    assert_eq!(suffix(row.date_naive()), today);
    // The expired day is gone, with its finished delivery.
    for table in ["deliveries", "attempts"] {
        assert_eq!(
            f.partition_exists(&format!("{table}_p{name}")).await,
            (false, false)
        );
    }
    assert!(matches!(
        f.store.get_delivery(&done).await,
        Err(StoreError::NotFound)
    ));
    // The event the carried delivery needs is kept.
    assert!(
        f.store
            .get_event(&before_move.delivery.event_id)
            .await
            .is_ok()
    );
    // The rollup is unchanged: one attempt folded, one still live.
    assert_eq!(f.store.daily_stats(&sub.id, since).await.unwrap(), stats);
    // The day with a delivery in flight stays, and its delivery with it.
    assert_eq!(
        f.partition_exists(&format!("deliveries_p{}", suffix(busy_day)))
            .await,
        (true, true)
    );
    assert_eq!(
        f.partitions_of(&inflight).await.0,
        format!("deliveries_p{}", suffix(busy_day))
    );

    // Once it finishes, its day goes too.
    record(&f.store, &held[0], 200, 3, NextState::Delivered).await;
    let report = f.store.enforce_retention(&policy()).await.unwrap();
    assert_eq!(
        (
            report.partitions_dropped,
            report.deliveries,
            report.attempts
        ),
        (1, 1, 1),
        "{report:?}"
    );
    assert_eq!(
        f.partition_exists(&format!("deliveries_p{}", suffix(busy_day)))
            .await,
        (false, false)
    );
    f.finish().await;
}

/// Migration 0006 run over a 0005 schema with rows in it: every row moves
/// into its day's partition intact, attempts keep their ids (and the
/// sequence continues after them), and the outcome is reconstructed.
#[tokio::test]
async fn migration_0006_moves_existing_rows_into_day_partitions_intact() {
    let Some(db) = testing::fresh_schema().await else {
        return;
    };
    let mut conn = PgConnection::connect(&db.url).await.unwrap();
    for sql in [
        include_str!("../migrations/0001_initial.sql"),
        include_str!("../migrations/0002_ordered_claims.sql"),
        include_str!("../migrations/0003_subscription_claims.sql"),
        include_str!("../migrations/0004_subscription_rate_limit.sql"),
        include_str!("../migrations/0005_subscription_max_concurrency.sql"),
    ] {
        sqlx::raw_sql(sqlx::AssertSqlSafe(sql))
            .execute(&mut conn)
            .await
            .unwrap();
    }
    sqlx::raw_sql(
        "INSERT INTO subscriptions (sub_id, url, host, event_types, secret, ordered, retry_policy, state) \
         VALUES ('00000000-0000-7000-8000-000000000001', 'https://m.example/', 'm.example', '[\"*\"]', \
                 'whsec_x', false, '{}', 'active'); \
         INSERT INTO events (event_id, type, payload, created_at) VALUES \
           ('00000000-0000-7000-8000-0000000000e1', 'a.b', '{}', now() - interval '5 days'), \
           ('00000000-0000-7000-8000-0000000000e2', 'a.b', '{}', now()); \
         INSERT INTO deliveries (delivery_id, event_id, sub_id, event_type, destination_host, state, \
                                 attempt, created_at, last_status) VALUES \
           ('00000000-0000-7000-8000-0000000000d1', '00000000-0000-7000-8000-0000000000e1', \
            '00000000-0000-7000-8000-000000000001', 'a.b', 'm.example', 'dead', 2, \
            now() - interval '5 days', 500), \
           ('00000000-0000-7000-8000-0000000000d2', '00000000-0000-7000-8000-0000000000e2', \
            '00000000-0000-7000-8000-000000000001', 'a.b', 'm.example', 'delivered', 1, now(), 200); \
         INSERT INTO attempts (delivery_id, number, started_at, duration_ms, status) VALUES \
           ('00000000-0000-7000-8000-0000000000d1', 1, now() - interval '5 days', 10, 503), \
           ('00000000-0000-7000-8000-0000000000d1', 2, now() - interval '4 days', 11, 500), \
           ('00000000-0000-7000-8000-0000000000d2', 1, now(), 12, 200);",
    )
    .execute(&mut conn)
    .await
    .unwrap();
    let snapshot = "SELECT d.delivery_id, d.event_id, d.sub_id, d.state, d.attempt, d.created_at, \
         d.last_status, a.attempt_id, a.number, a.started_at, a.duration_ms, a.status \
         FROM deliveries d JOIN attempts a ON a.delivery_id = d.delivery_id ORDER BY a.attempt_id";
    type Row = (
        uuid::Uuid,
        uuid::Uuid,
        uuid::Uuid,
        String,
        i32,
        chrono::DateTime<Utc>,
        Option<i32>,
        i64,
        i32,
        chrono::DateTime<Utc>,
        i64,
        Option<i32>,
    );
    let before: Vec<Row> = sqlx::query_as(snapshot).fetch_all(&mut conn).await.unwrap();
    assert_eq!(before.len(), 3);

    sqlx::raw_sql(sqlx::AssertSqlSafe(include_str!(
        "../migrations/0006_day_partitions.sql"
    )))
    .execute(&mut conn)
    .await
    .unwrap();

    let after: Vec<Row> = sqlx::query_as(snapshot).fetch_all(&mut conn).await.unwrap();
    assert_eq!(after, before);
    // Each in the partition of its creation day.
    let placed: Vec<(String, String)> = sqlx::query_as(
        "SELECT tableoid::regclass::text, \
         'deliveries_p' || to_char((created_at AT TIME ZONE 'UTC')::date, 'YYYYMMDD') \
         FROM deliveries ORDER BY delivery_id",
    )
    .fetch_all(&mut conn)
    .await
    .unwrap();
    assert_eq!(placed.len(), 2);
    for (actual, expected) in &placed {
        assert_eq!(actual, expected);
    }
    let outcomes: Vec<Option<String>> =
        sqlx::query_scalar("SELECT outcome FROM attempts ORDER BY attempt_id")
            .fetch_all(&mut conn)
            .await
            .unwrap();
    assert_eq!(
        outcomes,
        [Some("retry"), Some("dead"), Some("delivered")].map(|o| o.map(str::to_owned))
    );
    // New attempts are numbered after the old ones.
    let next: i64 = sqlx::query_scalar("SELECT nextval('attempt_ids')")
        .fetch_one(&mut conn)
        .await
        .unwrap();
    assert_eq!(next, before.iter().map(|r| r.7).max().unwrap() + 1);
    conn.close().await.unwrap();
    db.cleanup().await.unwrap();
}

/// A statement that waited for a row that retention meanwhile moved into
/// another partition fails with SQLSTATE 40001; the store reports it as
/// `Unavailable` (retry later), and the retry finds the row where it is now.
#[tokio::test]
async fn a_row_moved_to_another_partition_under_a_waiting_statement_is_unavailable() {
    let Some(mut f) = fixture().await else { return };
    let sub = f
        .store
        .create_subscription(new_sub("moved.example", None))
        .await
        .unwrap();
    let id = ingest(&f.store, &[&sub]).await[0];
    let before = f.store.get_delivery(&id).await.unwrap().delivery;

    // A carry-forward in progress: the row moves (to tomorrow's partition,
    // which exists) and the mover has not committed yet.
    let mover_pid: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
        .fetch_one(&mut f.conn)
        .await
        .unwrap();
    sqlx::raw_sql("BEGIN").execute(&mut f.conn).await.unwrap();
    sqlx::query(
        "UPDATE deliveries SET retain_from = retain_from + interval '1 day' WHERE delivery_id = $1",
    )
    .bind(id.as_uuid())
    .execute(&mut f.conn)
    .await
    .unwrap();

    // A replay locks the row: it waits for the mover.
    let store = f.store.clone();
    let replay = tokio::spawn(async move { store.replay_delivery(&id).await });
    let mut watcher = PgConnection::connect(&f.db.url).await.unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let blocked: bool = sqlx::query_scalar(
            "SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE $1 = ANY(pg_blocking_pids(pid)))",
        )
        .bind(mover_pid)
        .fetch_one(&mut watcher)
        .await
        .unwrap();
        if blocked {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the replay never waited for the mover"
        );
    }
    sqlx::raw_sql("COMMIT").execute(&mut f.conn).await.unwrap();

    let res = replay.await.unwrap();
    let Err(StoreError::Unavailable(source)) = &res else {
        panic!("expected Unavailable, got {res:?}");
    };
    let sqlx::Error::Database(db) = source.downcast_ref::<sqlx::Error>().unwrap() else {
        panic!("{source:?}");
    };
    assert_eq!(db.code().as_deref(), Some("40001"), "{db:?}");
    // The retry finds it (pending already: returned as it is).
    assert_eq!(f.store.replay_delivery(&id).await.unwrap(), before);
    watcher.close().await.unwrap();
    f.finish().await;
}

/// If upkeep has not run for days and today's partition is missing, ingest
/// creates it and goes on rather than failing.
#[tokio::test]
async fn ingest_creates_a_missing_day_partition() {
    let Some(mut f) = fixture().await else { return };
    let sub = f
        .store
        .create_subscription(new_sub("missing.example", None))
        .await
        .unwrap();
    let today = suffix(f.today().await);
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "DROP TABLE attempts_p{today}; DROP TABLE deliveries_p{today}"
    )))
    .execute(&mut f.conn)
    .await
    .unwrap();
    assert_eq!(
        f.partition_exists(&format!("deliveries_p{today}")).await,
        (false, false)
    );
    let id = ingest(&f.store, &[&sub]).await[0];
    assert_eq!(f.partitions_of(&id).await.0, format!("deliveries_p{today}"));
    assert_eq!(
        f.partition_exists(&format!("attempts_p{today}")).await,
        (true, true)
    );
    f.finish().await;
}

/// The same for a batch ([`Store::accept_events`]): the partition is
/// created and the whole batch is accepted.
#[tokio::test]
async fn a_batch_ingest_creates_a_missing_day_partition() {
    let Some(mut f) = fixture().await else { return };
    let sub = f
        .store
        .create_subscription(new_sub("missing.example", None))
        .await
        .unwrap();
    let today = suffix(f.today().await);
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "DROP TABLE attempts_p{today}; DROP TABLE deliveries_p{today}"
    )))
    .execute(&mut f.conn)
    .await
    .unwrap();
    let batch: Vec<_> = (0..3)
        .map(|_| {
            let d = NewDelivery {
                id: DeliveryId::new(),
                sub_id: sub.id,
                destination_host: sub.url.host().to_owned(),
            };
            (new_event("order.created", None), vec![d])
        })
        .collect();
    let results = f.store.accept_events(batch.clone()).await.unwrap();
    for (res, (event, deliveries)) in results.into_iter().zip(&batch) {
        assert_eq!(res.unwrap().event_id, event.id);
        assert_eq!(
            f.partitions_of(&deliveries[0].id).await.0,
            format!("deliveries_p{today}")
        );
    }
    f.finish().await;
}

/// A long transaction reading deliveries holds the drop off: the pass gives
/// up waiting for its lock after a short lock_timeout (rather than queueing
/// every other statement behind it for long), rolls the fold back and says
/// more is due; the next pass, after that transaction ends, drops the day,
/// and the rollup is counted once.
#[tokio::test]
async fn a_drop_that_cannot_get_its_lock_is_left_for_a_later_pass() {
    let Some(mut f) = fixture().await else { return };
    let sub = f
        .store
        .create_subscription(new_sub("busy.example", None))
        .await
        .unwrap();
    let id = ingest(&f.store, &[&sub]).await[0];
    let c = claim(&f.store, &sub).await;
    record(&f.store, &c[0], 200, 9, NextState::Delivered).await;
    let old = f.age(&[id]).await;
    let since = old - chrono::Duration::days(1);
    let stats = f.store.daily_stats(&sub.id, since).await.unwrap();
    assert_eq!(stats.len(), 1);

    let mut reader = PgConnection::connect(&f.db.url).await.unwrap();
    sqlx::raw_sql("BEGIN; SELECT count(*) FROM deliveries;")
        .execute(&mut reader)
        .await
        .unwrap();
    let report = f.store.enforce_retention(&policy()).await.unwrap();
    assert_eq!(report.partitions_dropped, 0, "{report:?}");
    assert!(report.more, "{report:?}");
    assert_eq!(
        f.partition_exists(&format!("deliveries_p{}", suffix(old)))
            .await,
        (true, true)
    );
    assert_eq!(f.store.daily_stats(&sub.id, since).await.unwrap(), stats);
    let folded: i64 = sqlx::query_scalar("SELECT count(*) FROM daily_stats")
        .fetch_one(&mut f.conn)
        .await
        .unwrap();
    assert_eq!(folded, 0, "the fold was rolled back with the drop");

    sqlx::raw_sql("COMMIT").execute(&mut reader).await.unwrap();
    let report = f.store.enforce_retention(&policy()).await.unwrap();
    assert_eq!(
        (
            report.partitions_dropped,
            report.deliveries,
            report.attempts
        ),
        (1, 1, 1),
        "{report:?}"
    );
    assert_eq!(f.store.daily_stats(&sub.id, since).await.unwrap(), stats);
    reader.close().await.unwrap();
    f.finish().await;
}

/// Claims and records name the row's day partition (so PostgreSQL reads one
/// partition's index, not every day's): a delivery in an old day is still
/// claimed, recorded one at a time and in a batch, and its attempts land in
/// its own day, beside it.
#[tokio::test]
async fn deliveries_of_an_old_day_are_claimed_and_recorded_in_their_own_partition() {
    let Some(mut f) = fixture().await else { return };
    let sub = f
        .store
        .create_subscription(new_sub("old-day.example", None))
        .await
        .unwrap();
    let ids = [
        ingest(&f.store, &[&sub]).await[0],
        ingest(&f.store, &[&sub]).await[0],
    ];
    let old = f.age(&ids).await;
    let old_deliveries = format!("deliveries_p{}", suffix(old));
    let old_attempts = format!("attempts_p{}", suffix(old));

    // Claimed by the batch statement, as the dispatcher claims.
    let claimed = f
        .store
        .claim_many(&[request(&sub)])
        .await
        .unwrap()
        .remove(0);
    assert_eq!(claimed.len(), 2, "both old deliveries are claimed");
    for c in &claimed {
        let (delivery, _) = f.partitions_of(&c.delivery.id).await;
        assert_eq!(
            delivery, old_deliveries,
            "the claim left the row in its day"
        );
        let day = c.lease.partition.expect("a claim's lease names the day");
        assert_eq!(day.date_naive(), old, "the lease names the row's own day");
        // A renewal names the day too, and finds the row there.
        assert!(
            f.store
                .renew_lease(&c.lease, Duration::from_secs(60))
                .await
                .unwrap()
        );
    }

    // One recorded alone, one in a batch.
    record(&f.store, &claimed[0], 200, 3, NextState::Delivered).await;
    let outcomes = f
        .store
        .record_attempts(vec![AttemptRecord {
            lease: claimed[1].lease,
            attempt: Attempt {
                number: 1,
                started_at: Utc::now(),
                duration: Duration::from_millis(4),
                status: Some(200),
                error_class: None,
                response_snippet: None,
            },
            next: NextState::Delivered,
            last_error: None,
        }])
        .await
        .unwrap();
    assert_eq!(outcomes, vec![RecordOutcome::Recorded]);

    for c in &claimed {
        let detail = f.store.get_delivery(&c.delivery.id).await.unwrap();
        assert_eq!(
            detail.delivery.state,
            hookd_domain::delivery::DeliveryState::Delivered
        );
        assert_eq!(detail.attempts.len(), 1);
        let (delivery, attempts) = f.partitions_of(&c.delivery.id).await;
        assert_eq!(delivery, old_deliveries);
        assert_eq!(attempts, vec![old_attempts.clone()]);
    }
    f.finish().await;
}
