//! The shared store behaviour suite, run against SQLite: every test gets a
//! fresh, migrated database file in its own temporary directory.

use std::sync::Arc;

use hookd_store::Store;
use hookd_store::conformance::TestStore;
use hookd_store_sqlite::SqliteStore;

async fn make() -> Option<TestStore> {
    let dir = tempfile::tempdir().expect("a temp dir");
    let store = SqliteStore::connect(&dir.path().join("hookd.db"))
        .await
        .expect("connect");
    store.migrate().await.expect("migrate");
    // The directory outlives the store's connections: `guard` drops last.
    Some(TestStore {
        store: Arc::new(store),
        guard: Box::new(dir),
    })
}

hookd_store::conformance_tests!(make);

/// The default `accept_events_claiming` claims nothing; this backend claims
/// what it is asked to.
#[tokio::test]
async fn ingest_claims_every_named_delivery() {
    let Some(t) = make().await else { return };
    hookd_store::conformance::ingest_claims_every_named_delivery(t.store).await;
}
