//! The shared Store behaviour suite, run against PostgreSQL. Each test gets a
//! fresh schema in `HOOKD_TEST_DATABASE_URL` (skipped locally without it,
//! required in CI).

use std::sync::Arc;

use hookd_store::Store;
use hookd_store::conformance::TestStore;
use hookd_store_postgres::{PgOptions, PgStore, testing};

async fn make() -> Option<TestStore> {
    let db = testing::fresh_schema().await?;
    let store = PgStore::connect(&db.url, PgOptions::default())
        .await
        .expect("connect");
    store.migrate().await.expect("migrate");
    Some(TestStore {
        store: Arc::new(store),
        guard: Box::new(db),
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
