//! hookd's PostgreSQL store: the scale backend of [`hookd_store::Store`].
//!
//! Several hookd processes may share one database: claims use
//! `FOR UPDATE SKIP LOCKED` so concurrent workers never receive the same
//! delivery, every lease and due time is computed from the database's `now()`
//! (never a node's clock), and completions are fenced by a lease token.
//!
//! # Main types
//! - [`PgStore`]: the [`Store`](hookd_store::Store) implementation over a
//!   connection pool; built with [`PgStore::connect`].
//! - [`PgOptions`]: pool size, timeouts, the schema to use, and the
//!   [`Keyring`] that seals subscription secrets at rest (sealed on every
//!   write, opened on every read; legacy plaintext rows are read too).
//! - `testing` (feature `testing`): `testing::fresh_schema()`
//!   gives each test its own schema in `HOOKD_TEST_DATABASE_URL`.
//!
//! # Layout
//! - `migrations/` (embedded): the schema of `docs/schema-notes.md` in
//!   PostgreSQL types; deliveries and attempts in day partitions (0006).
//! - `store`: one SQL statement (or one transaction) per trait method.
//! - `jobs`: bulk replay jobs (creation with fixed items, and the step).
//! - `fanout`: lazy fan-out jobs (written at ingest, materialised in
//!   batches).
//! - `retention`: day partitions (carry forward, fold into `daily_stats`,
//!   drop), events retention, and the daily rollup read.
//! - `rows`: the column lists and row decoders the queries share.
//! - `nodes`: heartbeats (who shares the database, on its clock).
//! - [`gossip`]: circuit openings over `LISTEN/NOTIFY` (R1), the transport
//!   the binary's gossip drives.
//! - `error`: sqlx errors mapped onto [`StoreError`].
//!
//! # What this crate must not do
//! Let a sqlx type cross the [`Store`](hookd_store::Store) seam, read the
//! node's clock for anything the database compares, or write outside the
//! transaction that a trait method's contract names.
#![warn(missing_docs)]

mod error;
mod fanout;
mod freshness;
pub mod gossip;
mod jobs;
mod nodes;
mod retention;
mod rows;
pub mod sharded;
mod store;
#[cfg(feature = "testing")]
pub mod testing;

use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use hookd_store::crypto::Keyring;

use hookd_store::StoreError;
use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};

/// How to connect. Every field has a default suited to a service that must
/// fail fast when its database is unreachable rather than queue requests.
#[derive(Debug, Clone)]
pub struct PgOptions {
    /// Most open connections. Claims, ingest and API reads all share them.
    pub max_connections: u32,
    /// How long a call waits for a free (or new) connection before failing
    /// with `Unavailable`.
    pub acquire_timeout: Duration,
    /// Server-side `statement_timeout` for every connection, so a stuck lock
    /// or an overloaded server fails a call in seconds instead of hanging it.
    pub statement_timeout: Duration,
    /// Client-side bound on each whole call, connection wait included; a
    /// missed deadline is `Unavailable`. The server's statement_timeout
    /// cannot fire while the server is frozen (or the network silently drops
    /// packets), so this is what bounds a call caught mid-statement then.
    /// Keep it above `acquire_timeout`.
    pub call_timeout: Duration,
    /// A schema to put first on `search_path` for every connection (tables and
    /// migrations live there). `None` keeps the URL's or server's setting;
    /// the URL form is `?options=-c%20search_path%3DSCHEMA`.
    pub schema: Option<String>,
    /// Seals subscription secrets on write and opens them on read. The
    /// default is [`Keyring::ephemeral`]: a random key known only to this
    /// value and its clones, fine for tests but unreadable after a restart,
    /// so a deployment always sets its own (hookd: `HOOKD_ENCRYPTION_KEY`).
    pub keyring: Keyring,
    /// When ingest writes a fan-out job instead of an event's deliveries
    /// (see [`Store::accept_event`](hookd_store::Store::accept_event)).
    pub lazy_fanout: hookd_store::LazyFanout,
}

/// Where ingest writes an accepted event's deliveries.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Writes {
    /// Here, as rows (or a fan-out job over the threshold).
    Here(hookd_store::LazyFanout),
    /// Into the shard outbox: this is a sharded deployment's control
    /// database, and [`sharded::ShardedStore`] writes them on the shards.
    Outbox,
}

impl Writes {
    /// Whether an event with `n` deliveries gets a fan-out job here.
    pub(crate) fn is_lazy(self, n: usize) -> bool {
        matches!(self, Writes::Here(f) if f.is_lazy(n))
    }
}

impl Default for PgOptions {
    fn default() -> Self {
        Self {
            max_connections: 16,
            acquire_timeout: Duration::from_secs(5),
            statement_timeout: Duration::from_secs(10),
            // A few seconds past the connection wait, so ingest answers 503
            // within seconds when the database hangs. On a healthy server the
            // statement timeout still ends an abandoned statement server-side.
            call_timeout: Duration::from_secs(8),
            schema: None,
            keyring: Keyring::ephemeral(),
            lazy_fanout: hookd_store::LazyFanout::DEFAULT,
        }
    }
}

/// The PostgreSQL [`Store`](hookd_store::Store). Cheap to clone: clones share
/// one pool.
#[derive(Debug, Clone)]
pub struct PgStore {
    pool: PgPool,
    /// A client-side bound on each call ([`PgOptions::call_timeout`]). The
    /// server's statement_timeout cannot fire if the server is frozen or the
    /// network silently drops packets, so without it a call could hang on an
    /// established connection.
    deadline: Duration,
    /// Seals and opens subscription secrets ([`PgOptions::keyring`]).
    keyring: Arc<Keyring>,
    /// [`PgOptions::lazy_fanout`].
    fanout: hookd_store::LazyFanout,
    /// Whether this is a sharded deployment's control database: accepted
    /// events' deliveries go to the shard outbox ([`Writes::Outbox`]).
    outbox: bool,
    /// When to analyze today's partitions ([`freshness`]).
    freshness: Arc<freshness::Freshness>,
}

impl PgStore {
    /// Builds a pool for `url` (`postgres://user:pass@host:port/db?…`) and
    /// opens its first connection, so a wrong URL or an unreachable database
    /// fails here (`Unavailable` within `acquire_timeout`), at startup, rather
    /// than on the first request.
    pub async fn connect(url: &str, opts: PgOptions) -> Result<PgStore, StoreError> {
        let mut connect =
            PgConnectOptions::from_str(url).map_err(|e| StoreError::Backend(Box::new(e)))?;
        // Startup options cost no round trip, and apply to every connection
        // the pool ever opens, including ones replacing broken ones.
        connect = connect.options([(
            "statement_timeout",
            format!("{}ms", opts.statement_timeout.as_millis()),
        )]);
        // No JIT compilation: hookd's statements are short and run often,
        // and a plan whose estimated cost is large (a claim's estimate at a
        // 1,000,000-row backlog) spent ~380 ms compiling a statement that
        // runs in 5 ms. A `jit` in the URL's `options` comes first and loses.
        connect = connect.options([("jit", "off")]);
        if let Some(schema) = &opts.schema {
            // Sent after any `options` in the URL, so it wins over them.
            connect = connect.options([("search_path", quote_ident(schema))]);
        }
        let pool = PgPoolOptions::new()
            .max_connections(opts.max_connections)
            .acquire_timeout(opts.acquire_timeout)
            .connect_with(connect)
            .await
            .map_err(error::map)?;
        Ok(PgStore {
            pool,
            deadline: opts.call_timeout,
            keyring: Arc::new(opts.keyring),
            fanout: opts.lazy_fanout,
            outbox: false,
            freshness: Arc::default(),
        })
    }

    /// Counts `n` deliveries just written, and when [`freshness`] says so,
    /// analyzes today's partitions and the delivery queue in the background
    /// (a failure is only logged: autovacuum gets there too, later).
    pub(crate) fn wrote_deliveries(&self, n: usize) {
        if n == 0
            || !self
                .freshness
                .note(chrono::Utc::now().date_naive(), n as u64)
        {
            return;
        }
        let store = self.clone();
        tokio::spawn(async move {
            // A sample of 6,000 rows (statistics target 20, for this
            // transaction only), not the default 30,000: these analyses only
            // have to tell the planner a new partition's size and shape, and
            // they come at every doubling of a day's rows, so on a first day
            // under load they were ~5 % of the server's statement time
            // (docs/benchmarks.md, session 17). A 200,000-row partition took
            // ~350 ms at the default target and ~55 ms at 20. Autovacuum's
            // own analyses, later, keep the default.
            let analyze = sqlx::query(
                "DO $$ DECLARE d text := to_char(now() AT TIME ZONE 'UTC', 'YYYYMMDD'); BEGIN \
                   PERFORM set_config('default_statistics_target', '20', true); \
                   EXECUTE format('ANALYZE %I, %I, delivery_queue', 'deliveries_p' || d, 'attempts_p' || d); END $$",
            )
            .execute(&store.pool);
            match tokio::time::timeout(Duration::from_secs(60), analyze).await {
                Ok(Ok(_)) => tracing::debug!("analyzed today's partitions"),
                Ok(Err(e)) => tracing::warn!(error = %e, "could not analyze today's partitions"),
                Err(_) => tracing::warn!("analyzing today's partitions took over 60 s"),
            }
            store.freshness.done();
        });
    }

    /// How many of an accepted event's `n` deliveries ingest writes as rows
    /// at once on this handle (none into the outbox or a fan-out job).
    pub(crate) fn rows_now(&self, n: usize) -> usize {
        match self.writes() {
            Writes::Here(f) if !f.is_lazy(n) => n,
            _ => 0,
        }
    }

    /// Where ingest writes deliveries on this handle.
    pub(crate) fn writes(&self) -> Writes {
        match self.outbox {
            true => Writes::Outbox,
            false => Writes::Here(self.fanout),
        }
    }

    /// The same database (one pool) as a sharded deployment's control
    /// database (`true`): ingest writes deliveries to the shard outbox for
    /// [`sharded::ShardedStore`] to place; or as an ordinary store or shard
    /// (`false`).
    pub(crate) fn as_control(&self, control: bool) -> PgStore {
        PgStore {
            outbox: control,
            ..self.clone()
        }
    }

    /// Closes the pool, waiting for connections in use to be returned.
    pub async fn close(&self) {
        self.pool.close().await;
    }

    /// Runs `call` under the client-side deadline; a missed deadline is
    /// `Unavailable` (the database did not answer).
    async fn bounded<T>(
        &self,
        call: impl Future<Output = hookd_store::Result<T>>,
    ) -> hookd_store::Result<T> {
        self.bounded_by(self.deadline, call).await
    }

    /// [`bounded`](Self::bounded) with a deadline of its own, for the few
    /// calls that may legitimately run longer than a request (retention's
    /// fold of a whole day).
    async fn bounded_by<T>(
        &self,
        deadline: Duration,
        call: impl Future<Output = hookd_store::Result<T>>,
    ) -> hookd_store::Result<T> {
        match tokio::time::timeout(deadline, call).await {
            Ok(res) => res,
            Err(_) => Err(StoreError::Unavailable(Box::new(error::DeadlineExceeded(
                deadline,
            )))),
        }
    }
}

/// Quotes an identifier for use in SQL (`search_path`, `CREATE SCHEMA`), so a
/// schema name is never interpreted as anything else.
fn quote_ident(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}
