//! Test isolation: a fresh PostgreSQL schema per test.
//!
//! Tests (this crate's conformance suite, and end-to-end tests elsewhere)
//! call [`fresh_schema`] and connect to [`TestDatabase::url`]. The URL carries
//! the schema in libpq's `options` parameter, so anything that takes a
//! database URL (including `hookd --database`) lands in that schema:
//!
//! ```text
//! postgres://postgres@127.0.0.1:5432/test?options=-c+search_path%3Dt_0196…
//! ```
//!
//! Without `HOOKD_TEST_DATABASE_URL`, local runs skip with a notice on
//! stderr; with `CI=true` a missing URL fails the test instead, so CI can
//! never pass by silently skipping the PostgreSQL tests.

use sqlx::Connection;
use sqlx::postgres::PgConnection;

use crate::quote_ident;

/// The environment variable naming the server tests may create schemas in.
pub const DATABASE_URL_VAR: &str = "HOOKD_TEST_DATABASE_URL";

/// A schema made for one test. Dropping it drops the schema (best effort);
/// [`TestDatabase::cleanup`] does the same from async code and reports errors.
/// Either way, stop whatever still uses the schema first (close the store,
/// shut the app down): the drop waits for locks held by open transactions.
#[derive(Debug)]
pub struct TestDatabase {
    /// A URL whose connections use [`schema`](Self::schema) (see the module docs).
    pub url: String,
    /// The schema's name (`t_` and 32 hex digits).
    pub schema: String,
    /// The URL without the schema, for dropping it.
    base_url: String,
    /// Set once the schema is gone, so `Drop` does nothing.
    dropped: bool,
}

/// `HOOKD_TEST_DATABASE_URL`, the server tests may use; `None` (with a
/// one-line notice on stderr) when it is unset, unless `CI=true`, which
/// panics: CI can never pass by skipping the PostgreSQL tests.
pub fn server_url() -> Option<String> {
    let Ok(url) = std::env::var(DATABASE_URL_VAR) else {
        if std::env::var("CI").is_ok_and(|v| v == "true") {
            panic!(
                "CI=true but {DATABASE_URL_VAR} is not set: the PostgreSQL tests must run in CI"
            );
        }
        eprintln!("skipping PostgreSQL test: {DATABASE_URL_VAR} is not set");
        return None;
    };
    Some(url)
}

/// Creates a uniquely named, empty schema in `HOOKD_TEST_DATABASE_URL`.
///
/// `None` (with a one-line notice on stderr) when the variable is unset,
/// unless `CI=true`, which panics. Panics if the variable is set but the
/// server cannot be reached: a configured database that fails is a failure,
/// never a skip.
pub async fn fresh_schema() -> Option<TestDatabase> {
    let base_url = server_url()?;
    let schema = format!("t_{}", uuid::Uuid::now_v7().simple());
    let mut conn = PgConnection::connect(&base_url).await.unwrap_or_else(|e| {
        panic!("{DATABASE_URL_VAR} is set but the database cannot be reached: {e}")
    });
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "CREATE SCHEMA {}",
        quote_ident(&schema)
    )))
    .execute(&mut conn)
    .await
    .unwrap_or_else(|e| panic!("cannot create test schema {schema}: {e}"));
    let _ = conn.close().await;
    let mut url = url::Url::parse(&base_url)
        .unwrap_or_else(|e| panic!("{DATABASE_URL_VAR} is not a URL: {e}"));
    url.query_pairs_mut()
        .append_pair("options", &format!("-c search_path={schema}"));
    Some(TestDatabase {
        url: url.into(),
        schema,
        base_url,
        dropped: false,
    })
}

impl TestDatabase {
    /// Drops the schema and everything in it. Connections still using it
    /// must be closed first, or the drop waits for their locks.
    pub async fn cleanup(mut self) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
        self.dropped = true;
        Ok(drop_schema(&self.base_url, &self.schema).await?)
    }
}

async fn drop_schema(base_url: &str, schema: &str) -> Result<(), sqlx::Error> {
    let mut conn = PgConnection::connect(base_url).await?;
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "DROP SCHEMA IF EXISTS {} CASCADE",
        quote_ident(schema)
    )))
    .execute(&mut conn)
    .await?;
    conn.close().await
}

impl Drop for TestDatabase {
    fn drop(&mut self) {
        if self.dropped {
            return;
        }
        // Drop cannot await, and may run inside a runtime that forbids
        // blocking it; a short-lived thread with its own runtime can.
        let (base_url, schema) = (self.base_url.clone(), self.schema.clone());
        let cleaned = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .ok()?;
            rt.block_on(drop_schema(&base_url, &schema)).ok()
        })
        .join();
        if !matches!(cleaned, Ok(Some(()))) {
            eprintln!("could not drop test schema {} (left behind)", self.schema);
        }
    }
}
