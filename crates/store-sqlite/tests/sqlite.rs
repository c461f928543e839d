//! Behaviours of the SQLite backend that the shared suite cannot see: how it
//! opens files, and that two stores on one file (as two processes would be)
//! still migrate and claim safely.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use hookd_domain::{DeliveryId, SubscriptionId};
use hookd_store::conformance::{new_event, new_sub};
use hookd_store::{
    Attempt, AttemptRecord, ClaimOrder, ClaimRequest, Lease, NewDelivery, NextState, Store,
    StoreError,
};
use hookd_store_sqlite::SqliteStore;

/// A migrated store on a fresh file, and the directory that holds it.
async fn fresh() -> (SqliteStore, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::connect(&dir.path().join("hookd.db"))
        .await
        .unwrap();
    store.migrate().await.unwrap();
    (store, dir)
}

#[tokio::test]
async fn urls_name_a_file_and_memory_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    for (i, scheme) in ["sqlite:", "sqlite://"].iter().enumerate() {
        let path = dir.path().join(format!("db{i}.db"));
        let store = SqliteStore::connect_url(&format!("{scheme}{}", path.display()))
            .await
            .unwrap();
        store.migrate().await.unwrap();
        assert!(path.exists(), "{scheme} creates the file");
    }
    for bad in [
        "postgres://localhost/hookd",
        "sqlite::memory:",
        "sqlite://?mode=memory",
    ] {
        let err = SqliteStore::connect_url(bad).await.unwrap_err();
        assert!(matches!(err, StoreError::Backend(_)), "{bad}: {err:?}");
    }
}

#[tokio::test]
async fn accepted_events_survive_a_reopen() {
    let (store, dir) = fresh().await;
    let ev = new_event("order.created", None);
    store.accept_event(ev.clone(), vec![]).await.unwrap();
    store.close().await;
    let reopened = SqliteStore::connect(&dir.path().join("hookd.db"))
        .await
        .unwrap();
    reopened.migrate().await.unwrap();
    assert_eq!(
        reopened.get_event(&ev.id).await.unwrap().payload,
        ev.payload
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stores_sharing_a_file_migrate_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("hookd.db");
    let mut stores = Vec::new();
    for _ in 0..8 {
        stores.push(Arc::new(SqliteStore::connect(&path).await.unwrap()));
    }
    // Line them up so their migrations overlap rather than run in turn.
    let start = Arc::new(tokio::sync::Barrier::new(stores.len()));
    let runs = stores.iter().map(|s| {
        let (s, start) = (s.clone(), start.clone());
        tokio::spawn(async move {
            start.wait().await;
            s.migrate().await
        })
    });
    for r in futures::future::join_all(runs).await {
        r.unwrap().unwrap();
    }
    assert_eq!(
        stores[0].subscription_generation().await.unwrap(),
        0,
        "migrated exactly once"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stores_sharing_a_file_never_claim_the_same_delivery() {
    let (first, dir) = fresh().await;
    let sub = first
        .create_subscription(new_sub("a.example", None))
        .await
        .unwrap();
    let total = 120;
    for _ in 0..total {
        let d = NewDelivery {
            id: DeliveryId::new(),
            sub_id: sub.id,
            destination_host: "a.example".into(),
        };
        first
            .accept_event(new_event("order.created", None), vec![d])
            .await
            .unwrap();
    }
    // Each store has its own writer connection, as separate processes would:
    // only SQLite's file lock keeps their claims apart.
    let mut stores: Vec<Arc<SqliteStore>> = vec![Arc::new(first)];
    for _ in 0..2 {
        stores.push(Arc::new(
            SqliteStore::connect(&dir.path().join("hookd.db"))
                .await
                .unwrap(),
        ));
    }
    let tasks: Vec<_> = stores
        .iter()
        .enumerate()
        .map(|(w, store)| {
            let store = store.clone();
            tokio::spawn(async move {
                let mut mine = Vec::new();
                loop {
                    let req = ClaimRequest {
                        worker_id: format!("w{w}"),
                        destination: "a.example".into(),
                        subscription: None,
                        order: ClaimOrder::OldestFirst,
                        limit: 5,
                        lease: Duration::from_secs(300),
                    };
                    let got = store.claim_due(&req).await.unwrap();
                    if got.is_empty() {
                        break mine;
                    }
                    mine.extend(got.into_iter().map(|c| c.delivery.id));
                }
            })
        })
        .collect();
    let mut seen = HashSet::new();
    for t in tasks {
        for id in t.await.unwrap() {
            assert!(seen.insert(id), "{id} was claimed twice");
        }
    }
    assert_eq!(seen.len(), total);
}

#[tokio::test]
async fn an_attempt_for_an_unknown_delivery_is_not_found() {
    let (store, _dir) = fresh().await;
    let record = AttemptRecord {
        lease: Lease {
            delivery_id: DeliveryId::new(),
            token: 1,
            partition: None,
            subscription: SubscriptionId::new(),
        },
        attempt: Attempt {
            number: 1,
            started_at: chrono::Utc::now(),
            duration: Duration::from_millis(1),
            status: Some(200),
            error_class: None,
            response_snippet: None,
        },
        next: NextState::Delivered,
        last_error: None,
    };
    assert!(matches!(
        store.record_attempt(record).await,
        Err(StoreError::NotFound)
    ));
}

#[tokio::test]
async fn oversized_snippets_are_cut_on_a_character_boundary() {
    let (store, _dir) = fresh().await;
    let sub = store
        .create_subscription(new_sub("a.example", None))
        .await
        .unwrap();
    let id = DeliveryId::new();
    store
        .accept_event(
            new_event("order.created", None),
            vec![NewDelivery {
                id,
                sub_id: sub.id,
                destination_host: "a.example".into(),
            }],
        )
        .await
        .unwrap();
    let req = ClaimRequest {
        worker_id: "w".into(),
        destination: "a.example".into(),
        subscription: None,
        order: ClaimOrder::OldestFirst,
        limit: 1,
        lease: Duration::from_secs(60),
    };
    let claimed = store.claim_due(&req).await.unwrap().remove(0);
    // 'é' is two bytes, so 1024 bytes fall in the middle of one.
    let snippet = format!("x{}", "é".repeat(1000));
    let record = AttemptRecord {
        lease: claimed.lease,
        attempt: Attempt {
            number: 1,
            started_at: chrono::Utc::now(),
            duration: Duration::from_millis(1),
            status: Some(500),
            error_class: None,
            response_snippet: Some(snippet.clone()),
        },
        next: NextState::Failed,
        last_error: None,
    };
    store.record_attempt(record).await.unwrap();
    let kept = store
        .get_delivery(&id)
        .await
        .unwrap()
        .attempts
        .remove(0)
        .response_snippet
        .unwrap();
    assert_eq!(kept.len(), 1023);
    assert!(snippet.starts_with(&kept));
}

/// Row-level retention: each call removes at most `batch` rows of each
/// table, a delivery only once all its attempts are gone, and says `more`
/// while a batch came back full.
#[tokio::test]
async fn retention_deletes_at_most_a_batch_of_each_table_per_call() {
    let (store, _dir) = fresh().await;
    let sub = store
        .create_subscription(new_sub("retain.example", None))
        .await
        .unwrap();
    let mut ids = Vec::new();
    for _ in 0..3 {
        let d = NewDelivery {
            id: DeliveryId::new(),
            sub_id: sub.id,
            destination_host: "retain.example".into(),
        };
        ids.push(d.id);
        store
            .accept_event(new_event("order.created", None), vec![d])
            .await
            .unwrap();
        // Two attempts each: a retry, then delivered.
        for (number, next) in [
            (
                1,
                NextState::Retry {
                    delay: Duration::ZERO,
                },
            ),
            (2, NextState::Delivered),
        ] {
            let claimed = store
                .claim_due(&ClaimRequest {
                    worker_id: "w".into(),
                    destination: "retain.example".into(),
                    subscription: None,
                    order: ClaimOrder::OldestFirst,
                    limit: 1,
                    lease: Duration::from_secs(60),
                })
                .await
                .unwrap();
            let record = AttemptRecord {
                lease: claimed[0].lease,
                attempt: Attempt {
                    number,
                    started_at: chrono::Utc::now(),
                    duration: Duration::from_millis(u64::from(number) * 10),
                    status: Some(if number == 1 { 500 } else { 200 }),
                    error_class: None,
                    response_snippet: None,
                },
                next,
                last_error: None,
            };
            store.record_attempt(record).await.unwrap();
        }
    }
    let since = chrono::Utc::now().date_naive() - chrono::Days::new(1);
    let stats = store.daily_stats(&sub.id, since).await.unwrap();
    assert_eq!(stats.len(), 1);
    assert_eq!(
        (
            stats[0].attempts,
            stats[0].delivered,
            &stats[0].latency_ms[..]
        ),
        (6, 3, &[(10, 3), (20, 3)][..])
    );

    let later = chrono::Utc::now() + chrono::Duration::days(1);
    let policy = hookd_store::RetentionPolicy {
        deliveries_before: later,
        events_before: later,
        batch: 1,
    };
    let first = store.enforce_retention(&policy).await.unwrap();
    assert_eq!(
        (first.deliveries, first.attempts, first.events, first.more),
        (0, 1, 0, true),
        "one attempt; its delivery keeps another, and keeps its event"
    );
    let mut reports = vec![first];
    while reports.last().unwrap().more {
        let r = store.enforce_retention(&policy).await.unwrap();
        assert!(
            r.deliveries <= 1 && r.attempts <= 1 && r.events <= 1,
            "{r:?}"
        );
        reports.push(r);
        assert!(reports.len() < 50);
    }
    let sum = |f: fn(&hookd_store::RetentionReport) -> u64| reports.iter().map(f).sum::<u64>();
    assert_eq!(
        (
            sum(|r| r.deliveries),
            sum(|r| r.attempts),
            sum(|r| r.events)
        ),
        (3, 6, 3)
    );
    assert!(reports.len() >= 6, "{reports:?}");
    for id in &ids {
        assert!(matches!(
            store.get_delivery(id).await,
            Err(StoreError::NotFound)
        ));
    }
    assert_eq!(store.daily_stats(&sub.id, since).await.unwrap(), stats);
}

/// The WAL is copied into the database file in the background while the
/// store stays open: the writer's own checkpoint only comes at 10,000 pages
/// (40 MiB), far above what this writes, so only the checkpointer can make
/// the file grow.
#[tokio::test]
async fn the_wal_is_checkpointed_into_the_file_while_the_store_is_open() {
    let (store, dir) = fresh().await;
    let file = dir.path().join("hookd.db");
    let before = std::fs::metadata(&file).unwrap().len();
    // About 4 MiB of payloads: some 1,000 pages in the WAL.
    let payload = format!(r#"{{"pad":"{}"}}"#, "x".repeat(16 * 1024));
    for _ in 0..256 {
        let mut ev = new_event("order.created", None);
        ev.payload = payload.clone();
        store.accept_event(ev, vec![]).await.unwrap();
    }
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let now = std::fs::metadata(&file).unwrap().len();
        if now >= before + 4 * 1024 * 1024 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the file stayed at {now} bytes (was {before}): nothing was checkpointed"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    store.close().await;
}

/// The bundled SQLite is built as `.cargo/config.toml` asks (see "How SQLite
/// is compiled" in the crate's docs): without memory management, whose
/// page cache is one group shared by every connection under one lock, and
/// without memory statistics, which take a global lock on every
/// allocation. Both locks were a tenth of the writer thread's samples in
/// `fanout`; a build that missed the flags would bring them back silently.
#[tokio::test]
async fn the_bundled_sqlite_takes_no_global_lock_per_page_or_allocation() {
    use sqlx::{Connection, SqliteConnection};
    let mut conn = SqliteConnection::connect("sqlite::memory:").await.unwrap();
    let options: Vec<String> = sqlx::query_scalar("PRAGMA compile_options")
        .fetch_all(&mut conn)
        .await
        .unwrap();
    assert!(
        !options.iter().any(|o| o == "ENABLE_MEMORY_MANAGEMENT"),
        "{options:?}"
    );
    assert!(
        options.iter().any(|o| o == "DEFAULT_MEMSTATUS=0"),
        "{options:?}"
    );
}
