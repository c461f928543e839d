//! The shared Store behaviour suite, run against a sharded deployment: a
//! control database and two shards (three fresh schemas in
//! `HOOKD_TEST_DATABASE_URL`), behind one `ShardedStore`. Every contract
//! that holds on one database holds across shards.

use std::sync::Arc;

use hookd_store::conformance::TestStore;
use hookd_store_postgres::sharded::ShardedStore;
use hookd_store_postgres::{PgOptions, testing};

async fn make() -> Option<TestStore> {
    let control = testing::fresh_schema().await?;
    let a = testing::fresh_schema().await?;
    let b = testing::fresh_schema().await?;
    let store = ShardedStore::open(
        &control.url,
        &[a.url.clone(), b.url.clone()],
        PgOptions::default(),
    )
    .await
    .expect("open the shards");
    Some(TestStore {
        store: Arc::new(store),
        guard: Box::new((control, a, b)),
    })
}

hookd_store::conformance_tests!(make);
