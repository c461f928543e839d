//! hookd's embedded default store: the [`Store`] trait on SQLite.
//!
//! One file, no server: what a single hookd node needs to run on its own.
//! It implements the logical schema of `docs/schema-notes.md` with SQLite's
//! types (ids as 16-byte BLOBs, times as INTEGER unix milliseconds, bools as
//! INTEGER), and passes the shared conformance suite in `hookd-store`.
//!
//! # Main types
//! - [`SqliteStore`]: the store, built by [`SqliteStore::connect`] or
//!   [`SqliteStore::connect_url`] (sealing secrets with the key file beside
//!   the database), or their `_with_keyring` forms; schema changes happen
//!   only in [`Store::migrate`], from the migrations embedded from
//!   `migrations/`.
//! - [`key_file`]: the development key file, `<database>.key` (mode 0600).
//!
//! Subscription secrets are sealed at rest with the store's
//! [`Keyring`](hookd_store::crypto::Keyring): sealed on every write, opened on
//! every read (legacy plaintext rows too, until they are next written or
//! [`Store::reseal_secrets`] runs).
//!
//! # How it meets the contract
//! SQLite allows one writer at a time. Rather than let many connections
//! race for that lock and fail with `SQLITE_BUSY`, every write goes through
//! a pool of exactly one connection and runs as `BEGIN IMMEDIATE`, which
//! takes the write lock up front: writes in this process queue on the pool,
//! writes from other processes wait on the busy timeout. That makes claims
//! exclusive (the contract's "a write transaction") and makes
//! check-then-insert sequences, like idempotency-key dedup, race-free.
//! Reads use a separate pool of read-only connections; in WAL mode they
//! never block the writer nor wait for it.
//!
//! One process per file: a store holds an exclusive lock on
//! `<database file>.lock` for as long as it lives, so a second hookd process
//! on the same file is refused at startup ([`DatabaseInUse`]) instead of
//! running a second dispatcher with admission caps of its own. Stores within
//! one process share the lock (see `process_lock`).
//!
//! # How SQLite is compiled
//! sqlx links the SQLite that `libsqlite3-sys` bundles, and the workspace's
//! `.cargo/config.toml` sets `LIBSQLITE3_FLAGS` for its build:
//! - `-USQLITE_ENABLE_MEMORY_MANAGEMENT`: with it (`libsqlite3-sys`'s
//!   default) every connection's page cache is one group shared by all of
//!   them, and every page fetched or released takes that group's lock;
//! - `-DSQLITE_DEFAULT_MEMSTATUS=0`: with memory statistics on (SQLite's
//!   default) every allocation and free takes one global lock.
//!
//! Both locks were about a tenth of the writer thread's samples in the
//! `fanout` benchmark (docs/benchmarks.md, session 20); nothing here uses
//! `sqlite3_release_memory`, soft heap limits or memory statistics. A test
//! (`the_bundled_sqlite_takes_no_global_lock_per_page_or_allocation`)
//! checks that the flags reached the build.
//!
//! # Layout
//! - `subscriptions`, `ingest`, `fanout` (lazy fan-out jobs), `dispatch`,
//!   `reading`, `jobs` (bulk replay),
//!   `signals` (with backlogs and failing streaks), `retention` (with the
//!   daily rollup), `tokens`, `nodes` (heartbeats): the trait's operations,
//!   grouped as the trait groups them.
//! - `codec`: between SQLite values and domain types.
//! - `process_lock`: the one-process-per-file lock.
//! - `error`: sqlx failures as [`StoreError`].
//!
//! # What this crate must not do
//! Let a sqlx type out (callers see domain types and [`StoreError`] only),
//! make delivery decisions (the caller says what state comes next), or read
//! any clock but the system clock at statement time.
#![warn(missing_docs)]

mod codec;
mod dispatch;
mod error;
mod fanout;
mod ingest;
mod jobs;
pub mod key_file;
mod nodes;
mod process_lock;
mod reading;
mod retention;
mod signals;
mod subscriptions;
mod tokens;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use hookd_domain::{DeliveryId, EventId, JobId, SubscriptionId, Timestamp};
use hookd_store::crypto::Keyring;
use hookd_store::{
    Accepted, AttemptRecord, Backlog, BatchOutcome, ClaimRequest, ClaimedDelivery, DailyStats,
    Delivery, DeliveryDetail, DeliveryQuery, DueDestination, Event, FoundToken, IngestClaim,
    JobStep, Lease, NewDelivery, NewEvent, NewReplayJob, NewSubscription, NewToken, Notice,
    RaisedSignal, RecordOutcome, ReplayJob, Result, RetentionPolicy, RetentionReport, SignalKind,
    Store, StoreError, Subscription, SubscriptionHealth, SubscriptionPatch, SubscriptionQuery,
};
use sqlx::migrate::{AppliedMigration, Migrate, MigrateError, Migrator};
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteSynchronous,
};
use sqlx::{Sqlite, SqliteConnection, Transaction};

use crate::error::from_sqlx;
pub use crate::process_lock::DatabaseInUse;
use crate::process_lock::ProcessLock;

/// The schema, compiled into the binary so a deployment is one file.
static MIGRATOR: Migrator = sqlx::migrate!("./migrations");

/// How long a write waits for another process's write lock before giving up
/// with [`StoreError::Unavailable`]. Writes are short, so waiting this long
/// means something is wrong, not merely busy.
const BUSY_TIMEOUT: Duration = Duration::from_secs(5);

/// Read connections. Reads in WAL mode run in parallel with each other and
/// with the writer; a few cover the API's listings and the dispatcher's
/// lookups on a small machine.
const READ_CONNECTIONS: u32 = 4;

/// Rows a connection's thread may run ahead of the task reading them.
/// sqlx's default, 50, made the writer's thread stop and wait for the async
/// side every 50 rows of a claim's load (a thread wake-up each way) while
/// the write lock was held.
const ROW_BUFFER: usize = 4096;

/// Whether a statement built for `rows` rows (or ids, or terms), where a
/// full statement holds `full`, stays prepared in its connection's
/// statement cache. sqlx keeps up to 100 prepared statements a connection,
/// and a statement built for a batch has one shape per size. Kept, every
/// size seen (an ingest's 1 to 500 rows, a record batch's, a claim's id
/// list) stayed prepared, each a compiled program as large as its
/// parameter list: the SQLite `backlog` benchmark peaked at 228 MiB, and
/// at 173 MiB with this rule (docs/benchmarks.md, session 15). Batches of
/// up to [`KEEP_PREPARED_UP_TO`] rows and full chunks recur, so they stay;
/// any other size is prepared, run and finalised.
pub(crate) fn keep_prepared(rows: usize, full: usize) -> bool {
    rows <= KEEP_PREPARED_UP_TO || rows == full
}

/// The batch sizes [`keep_prepared`] always keeps: those of a service
/// under its usual concurrency. With 8, `single` (batches of up to 64
/// ingests) re-prepared most of its inserts and ran 3–11 % slower.
const KEEP_PREPARED_UP_TO: usize = 64;

/// The SQLite store.
///
/// Cheap to share behind an `Arc`; both pools are internally synchronized.
#[derive(Debug, Clone)]
pub struct SqliteStore {
    /// Exactly one connection: every write transaction queues here, so writes
    /// from this process never contend for SQLite's single write lock.
    writer: SqlitePool,
    /// Read-only connections, so a read can never take the write lock by
    /// accident and stall the writer.
    reader: SqlitePool,
    /// One connection that only checkpoints the WAL into the file, in the
    /// background ([`checkpoint_in_background`]), so the writer never does.
    checkpointer: SqlitePool,
    /// This process's hold on the database file, shared by clones; taken
    /// out by [`close`](Self::close) so a closed store stops keeping other
    /// processes out.
    lock: Arc<Mutex<Option<Arc<ProcessLock>>>>,
    /// Seals subscription secrets on write, opens them on read.
    keyring: Arc<Keyring>,
    /// When ingest writes a fan-out job instead of an event's deliveries
    /// ([`with_lazy_fanout`](Self::with_lazy_fanout)).
    fanout: hookd_store::LazyFanout,
    /// The subscription generation, cached for this file in this process
    /// (see `process_lock::GenerationCache`).
    generation: Arc<process_lock::GenerationCache>,
}

/// A `--database` URL this store cannot serve.
#[derive(Debug, thiserror::Error)]
#[error("`{url}` is not a SQLite database URL: {reason}")]
struct InvalidUrl {
    url: String,
    reason: &'static str,
}

impl SqliteStore {
    /// Opens (creating if missing) the database file at `path`.
    ///
    /// Does not change the schema: call [`Store::migrate`] for that, so that
    /// a node never migrates by surprise.
    ///
    /// [`StoreError::Unavailable`] with a [`DatabaseInUse`] source if another
    /// process still has the file open through a store after a wait of up
    /// to two seconds for it to let go (see the crate docs); another store
    /// in this process is fine.
    ///
    /// Secrets are sealed with the key in the [key file](key_file) beside
    /// the database, created if missing; see
    /// [`connect_with_keyring`](Self::connect_with_keyring) to give the key.
    pub async fn connect(path: &Path) -> Result<Self> {
        Self::connect_with(SqliteConnectOptions::new().filename(path), None).await
    }

    /// [`connect`](Self::connect), sealing secrets with `keyring`.
    pub async fn connect_with_keyring(path: &Path, keyring: Keyring) -> Result<Self> {
        Self::connect_with(SqliteConnectOptions::new().filename(path), Some(keyring)).await
    }

    /// Opens (creating if missing) the database named by a `sqlite:path` or
    /// `sqlite://path` URL, as passed to `--database`.
    ///
    /// In-memory databases are refused: the two pools would not share one,
    /// and a webhook outbox that forgets on restart breaks the durability
    /// promise of [`Store::accept_event`].
    ///
    /// Secrets are sealed with the key in the [key file](key_file) beside
    /// the database, created if missing.
    pub async fn connect_url(url: &str) -> Result<Self> {
        Self::connect_with(Self::url_options(url)?, None).await
    }

    /// [`connect_url`](Self::connect_url), sealing secrets with `keyring`.
    pub async fn connect_url_with_keyring(url: &str, keyring: Keyring) -> Result<Self> {
        Self::connect_with(Self::url_options(url)?, Some(keyring)).await
    }

    /// The database file a `sqlite:` URL names (for finding its key file).
    pub fn database_file(url: &str) -> Result<PathBuf> {
        Ok(Self::url_options(url)?.get_filename().to_owned())
    }

    fn url_options(url: &str) -> Result<SqliteConnectOptions> {
        let invalid = |reason| {
            StoreError::Backend(Box::new(InvalidUrl {
                url: url.to_owned(),
                reason,
            }))
        };
        if !url.starts_with("sqlite:") {
            return Err(invalid("expected a `sqlite:` scheme"));
        }
        if url.contains(":memory:") || url.contains("mode=memory") {
            return Err(invalid("in-memory databases are not durable"));
        }
        SqliteConnectOptions::from_str(url).map_err(from_sqlx)
    }

    async fn connect_with(options: SqliteConnectOptions, keyring: Option<Keyring>) -> Result<Self> {
        // Before any connection: a refused second process must not so much
        // as create the WAL or touch the file.
        let lock =
            process_lock::acquire_patiently(options.get_filename(), process_lock::PATIENCE).await?;
        let keyring = match keyring {
            Some(keyring) => keyring,
            None => {
                let file = key_file::load_or_create(&key_file::path_for(options.get_filename()))
                    .map_err(|e| StoreError::Backend(Box::new(e)))?;
                Keyring::new(file.key)
            }
        };
        let options = options
            .foreign_keys(true)
            .busy_timeout(BUSY_TIMEOUT)
            // With WAL, NORMAL syncs at checkpoints rather than on every
            // commit: a power loss may drop the last commits but never
            // corrupts the file. The durability trade the design accepts for
            // an embedded store.
            .synchronous(SqliteSynchronous::Normal)
            .pragma("temp_store", "memory")
            .row_buffer_size(ROW_BUFFER);
        let writer = SqlitePoolOptions::new()
            .max_connections(1)
            // Keep the one connection open: closing the last connection
            // checkpoints and removes the WAL, which readers would then
            // have to recreate.
            .min_connections(1)
            .idle_timeout(None)
            .max_lifetime(None)
            // The writer opens first and sets WAL, which is persistent in the
            // file, so read-only connections find the database in WAL mode.
            .connect_with(
                options
                    .clone()
                    .create_if_missing(true)
                    .journal_mode(SqliteJournalMode::Wal)
                    // The writer's page cache holds the hot part of a large
                    // backlog's indexes (SQLite's default, 2 MiB, made the
                    // fanout benchmark spend 9 % of its CPU re-reading pages).
                    // Only the writer's: a reader's cache is dropped whenever
                    // the file changed since its last read, so a big one is
                    // only more to throw away (and a memory map, tried too,
                    // cost more in munmap than it saved and counted in RSS).
                    .pragma("cache_size", "-65536")
                    // Checkpoints are the checkpointer's (below), off the
                    // writer's path. The writer checkpoints itself only if
                    // the WAL still grows past this many pages (40 MiB),
                    // say while the checkpointer is held up.
                    .pragma("wal_autocheckpoint", WRITER_CHECKPOINT_PAGES),
            )
            .await
            .map_err(from_sqlx)?;
        let checkpointer = SqlitePoolOptions::new()
            .max_connections(1)
            .min_connections(1)
            .idle_timeout(None)
            .max_lifetime(None)
            .connect_with(options.clone())
            .await
            .map_err(from_sqlx)?;
        let reader = SqlitePoolOptions::new()
            .max_connections(READ_CONNECTIONS)
            .connect_with(options.read_only(true))
            .await
            .map_err(from_sqlx)?;
        let generation = lock.generation.clone();
        let lock = Arc::new(Mutex::new(Some(lock)));
        checkpoint_in_background(checkpointer.clone(), Arc::downgrade(&lock));
        Ok(Self {
            writer,
            reader,
            checkpointer,
            generation,
            lock,
            keyring: Arc::new(keyring),
            fanout: hookd_store::LazyFanout::DEFAULT,
        })
    }

    /// This store with events over `fanout.threshold` deliveries fanned out
    /// lazily (see [`Store::accept_event`]); the default is
    /// [`LazyFanout::DEFAULT`](hookd_store::LazyFanout::DEFAULT).
    pub fn with_lazy_fanout(mut self, fanout: hookd_store::LazyFanout) -> Self {
        self.fanout = fanout;
        self
    }

    /// Closes both pools, waiting for connections in use to come back. The
    /// last connection to close checkpoints the WAL into the main file.
    /// Then lets go of the file lock: once no other store of this process
    /// holds it, another process may open the file.
    pub async fn close(&self) {
        self.reader.close().await;
        self.checkpointer.close().await;
        self.writer.close().await;
        let hold = self
            .lock
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .take();
        drop(hold);
    }

    /// Begins a write transaction on the one writer connection.
    ///
    /// `BEGIN IMMEDIATE` takes SQLite's write lock at once instead of at the
    /// first write, so a transaction that reads before it writes (a claim, an
    /// idempotency check) can never be refused the upgrade half-way through.
    async fn write(&self) -> Result<Transaction<'static, Sqlite>> {
        self.writer
            .begin_with("BEGIN IMMEDIATE")
            .await
            .map_err(from_sqlx)
    }

    /// Begins a read transaction, so a record and its children (a delivery
    /// and its attempts) come from one snapshot.
    async fn read(&self) -> Result<Transaction<'static, Sqlite>> {
        self.reader.begin().await.map_err(from_sqlx)
    }
}

/// How often the checkpointer copies the WAL into the database file.
const CHECKPOINT_EVERY: Duration = Duration::from_millis(250);

/// The WAL's size (pages) at which the writer checkpoints by itself: only
/// if the checkpointer falls behind.
const WRITER_CHECKPOINT_PAGES: &str = "10000";

/// Copies the WAL into the database file every [`CHECKPOINT_EVERY`], on its
/// own connection, until the store is closed or every clone of it is gone
/// (`alive` no longer upgrades).
///
/// A checkpoint copies the pages written since the last one into the file
/// and, with `synchronous = NORMAL`, syncs the WAL and the file. Left to the
/// writer (`wal_autocheckpoint`), it runs on the commit that crosses the
/// threshold while every other write waits: at SQLite's 1,000 pages that
/// was 3.5 % of hookd's CPU in `fanout`, on the one writer thread, and at
/// 10,000 pages (session 18) each one held the writer long enough to put
/// `steady`'s p99 at 150–330 ms (docs/benchmarks.md, session 19). Here it
/// is `PASSIVE`: it copies what no reader still needs, waits for nobody,
/// and the writer goes on appending meanwhile. The WAL restarts from its
/// beginning once a checkpoint has caught up.
fn checkpoint_in_background(
    pool: SqlitePool,
    alive: std::sync::Weak<Mutex<Option<Arc<ProcessLock>>>>,
) {
    tokio::spawn(async move {
        let mut every = tokio::time::interval(CHECKPOINT_EVERY);
        every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            every.tick().await;
            if pool.is_closed() || alive.strong_count() == 0 {
                break;
            }
            if let Err(e) = sqlx::query("PRAGMA wal_checkpoint(PASSIVE)")
                .execute(&pool)
                .await
            {
                if pool.is_closed() {
                    break;
                }
                tracing::warn!(error = %e, "checkpointing the WAL failed");
            }
        }
        pool.close().await;
    });
}

/// sqlx's own table of applied migrations, so `sqlx migrate info` works on
/// a hookd database.
const MIGRATIONS_TABLE: &str = "_sqlx_migrations";

/// Applies the embedded migrations that are not applied yet, on a connection
/// that is already inside the caller's transaction (each migration runs in a
/// savepoint of it).
///
/// This is `Migrator::run`'s loop, written out over the public [`Migrate`]
/// trait: `Migrator::run` takes a connection only through a higher-ranked
/// `Acquire` bound that the compiler cannot prove `Send` inside an
/// `async_trait` method, and the pool form would take a connection of its
/// own instead of running inside our `BEGIN IMMEDIATE`.
async fn apply_migrations(conn: &mut SqliteConnection) -> std::result::Result<(), MigrateError> {
    conn.ensure_migrations_table(MIGRATIONS_TABLE).await?;
    if let Some(version) = conn.dirty_version(MIGRATIONS_TABLE).await? {
        return Err(MigrateError::Dirty(version));
    }
    let applied: HashMap<i64, AppliedMigration> = conn
        .list_applied_migrations(MIGRATIONS_TABLE)
        .await?
        .into_iter()
        .map(|m| (m.version, m))
        .collect();
    // A database migrated by a newer hookd: refuse rather than guess.
    if let Some(&version) = applied
        .keys()
        .find(|v| !MIGRATOR.iter().any(|m| m.version == **v))
    {
        return Err(MigrateError::VersionMissing(version));
    }
    for migration in MIGRATOR
        .iter()
        .filter(|m| !m.migration_type.is_down_migration())
    {
        match applied.get(&migration.version) {
            Some(done) if done.checksum != migration.checksum => {
                return Err(MigrateError::VersionMismatch(migration.version));
            }
            Some(_) => {}
            None => {
                conn.apply(MIGRATIONS_TABLE, migration).await?;
            }
        }
    }
    Ok(())
}

fn migrate_error(e: MigrateError) -> StoreError {
    match e {
        MigrateError::Execute(e) => from_sqlx(e),
        MigrateError::ExecuteMigration(e, _) => from_sqlx(e),
        other => StoreError::Backend(Box::new(other)),
    }
}

#[async_trait]
impl Store for SqliteStore {
    async fn migrate(&self) -> Result<()> {
        // One IMMEDIATE transaction around the whole run serializes migrators
        // across processes (sqlx's SQLite migrator takes no lock of its own);
        // each migration then runs in a savepoint inside it, and a second
        // migrator finds everything applied.
        let mut tx = self.write().await?;
        apply_migrations(&mut tx).await.map_err(migrate_error)?;
        tx.commit().await.map_err(from_sqlx)
    }

    async fn ping(&self) -> Result<()> {
        sqlx::query("SELECT 1")
            .execute(&self.reader)
            .await
            .map_err(from_sqlx)?;
        Ok(())
    }

    async fn schema_status(&self) -> Result<hookd_store::SchemaStatus> {
        // One row per migration: as cheap as `SELECT 1`. The migrations
        // table exists once `migrate` has run.
        let exists: bool = sqlx::query_scalar(
            "SELECT EXISTS (SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?)",
        )
        .bind(MIGRATIONS_TABLE)
        .fetch_one(&self.reader)
        .await
        .map_err(from_sqlx)?;
        let applied: Option<i64> = if exists {
            sqlx::query_scalar("SELECT MAX(version) FROM _sqlx_migrations WHERE success")
                .fetch_one(&self.reader)
                .await
                .map_err(from_sqlx)?
        } else {
            None
        };
        let expected = MIGRATOR
            .iter()
            .filter(|m| !m.migration_type.is_down_migration())
            .map(|m| m.version)
            .max()
            .unwrap_or(0);
        Ok(hookd_store::SchemaStatus::compare(applied, expected))
    }

    async fn due_work(&self) -> Result<hookd_store::DueWork> {
        let now = codec::now_ms();
        let (due, oldest): (i64, Option<i64>) = sqlx::query_as(
            "SELECT COUNT(*), MIN(d.next_attempt_at) FROM deliveries d \
             JOIN subscriptions s ON s.sub_id = d.sub_id \
             WHERE d.state = 'pending' AND d.next_attempt_at <= ? AND s.state = 'active'",
        )
        .bind(now)
        .fetch_one(&self.reader)
        .await
        .map_err(from_sqlx)?;
        let overdue_ms = oldest.map_or(0, |t| now.saturating_sub(t).max(0));
        Ok(hookd_store::DueWork {
            due: u64::try_from(due).unwrap_or(0),
            oldest_overdue: Duration::from_millis(u64::try_from(overdue_ms).unwrap_or(0)),
        })
    }

    async fn create_subscription(&self, new: NewSubscription) -> Result<Subscription> {
        subscriptions::create(self, new).await
    }

    async fn get_subscription(&self, id: &SubscriptionId) -> Result<Subscription> {
        subscriptions::get(self, id).await
    }

    async fn list_subscriptions(&self, query: &SubscriptionQuery) -> Result<Vec<Subscription>> {
        subscriptions::list(self, query).await
    }

    async fn all_subscriptions(&self) -> Result<Vec<Subscription>> {
        subscriptions::all(self).await
    }

    async fn update_subscription(
        &self,
        id: &SubscriptionId,
        patch: SubscriptionPatch,
    ) -> Result<Subscription> {
        subscriptions::update(self, id, patch).await
    }

    async fn delete_subscription(&self, id: &SubscriptionId) -> Result<()> {
        subscriptions::delete(self, id).await
    }

    async fn subscription_generation(&self) -> Result<i64> {
        subscriptions::generation(self).await
    }

    async fn reseal_secrets(&self) -> Result<u64> {
        subscriptions::reseal(self).await
    }

    async fn accept_event(
        &self,
        event: NewEvent,
        deliveries: Vec<NewDelivery>,
    ) -> Result<Accepted> {
        ingest::accept_event(self, event, deliveries).await
    }

    async fn accept_events(
        &self,
        batch: Vec<(NewEvent, Vec<NewDelivery>)>,
    ) -> Result<Vec<Result<Accepted>>> {
        ingest::accept_events(self, batch).await
    }

    async fn accept_events_claiming(
        &self,
        generation: Option<i64>,
        batch: Vec<(NewEvent, Vec<NewDelivery>)>,
        claim: &IngestClaim,
    ) -> Result<(BatchOutcome, Vec<Lease>)> {
        // As the default `accept_events_at`: this process is the file's
        // only writer, and its generation is read from memory.
        if let Some(generation) = generation
            && self.subscription_generation().await? != generation
        {
            return Ok((BatchOutcome::GenerationMoved(batch), Vec::new()));
        }
        let (results, leases) = ingest::accept_events_claiming(self, batch, Some(claim)).await?;
        Ok((BatchOutcome::Accepted(results), leases))
    }

    async fn get_event(&self, id: &EventId) -> Result<Event> {
        ingest::get_event(self, id).await
    }

    async fn materialize_fanout(&self) -> Result<Option<hookd_store::FanoutStep>> {
        fanout::materialize(self).await
    }

    async fn fanout_backlog(&self) -> Result<hookd_store::FanoutBacklog> {
        fanout::backlog(self).await
    }

    async fn due_destinations(&self, limit: u32) -> Result<Vec<DueDestination>> {
        dispatch::due_destinations(self, limit).await
    }

    async fn claim_due(&self, req: &ClaimRequest) -> Result<Vec<ClaimedDelivery>> {
        dispatch::claim_due(self, req).await
    }

    async fn claim_many(&self, reqs: &[ClaimRequest]) -> Result<Vec<Vec<ClaimedDelivery>>> {
        dispatch::claim_many(self, reqs).await
    }

    async fn record_attempt(&self, record: AttemptRecord) -> Result<RecordOutcome> {
        dispatch::record_attempt(self, record).await
    }

    async fn record_attempts(&self, records: Vec<AttemptRecord>) -> Result<Vec<RecordOutcome>> {
        dispatch::record_attempts(self, records).await
    }

    async fn renew_lease(&self, lease: &Lease, lease_for: Duration) -> Result<bool> {
        dispatch::renew_lease(self, lease, lease_for).await
    }

    async fn release(&self, leases: &[Lease]) -> Result<u64> {
        dispatch::release(self, leases).await
    }

    async fn reclaim_expired(&self) -> Result<u64> {
        dispatch::reclaim_expired(self).await
    }

    async fn replay_delivery(&self, id: &DeliveryId) -> Result<Delivery> {
        dispatch::replay_delivery(self, id).await
    }

    async fn get_delivery(&self, id: &DeliveryId) -> Result<DeliveryDetail> {
        reading::get_delivery(self, id).await
    }

    async fn list_deliveries(&self, query: &DeliveryQuery) -> Result<Vec<DeliveryDetail>> {
        reading::list_deliveries(self, query).await
    }

    async fn subscription_health(
        &self,
        sub_id: &SubscriptionId,
        since: Timestamp,
    ) -> Result<SubscriptionHealth> {
        reading::subscription_health(self, sub_id, since).await
    }

    async fn create_replay_job(&self, new: NewReplayJob) -> Result<ReplayJob> {
        jobs::create(self, new).await
    }

    async fn get_replay_job(&self, id: &JobId) -> Result<ReplayJob> {
        jobs::get_job(self, id).await
    }

    async fn cancel_replay_job(&self, id: &JobId) -> Result<ReplayJob> {
        jobs::cancel(self, id).await
    }

    async fn running_replay_jobs(&self, limit: u32) -> Result<Vec<ReplayJob>> {
        jobs::running(self, limit).await
    }

    async fn step_replay_job(&self, id: &JobId, window: u32) -> Result<JobStep> {
        jobs::step(self, id, window).await
    }

    async fn raise_signal(
        &self,
        sub_id: &SubscriptionId,
        kind: SignalKind,
        detail: &str,
        notice: Option<Notice>,
    ) -> Result<bool> {
        signals::raise(self, sub_id, kind, detail, notice).await
    }

    async fn lower_signal(&self, sub_id: &SubscriptionId, kind: SignalKind) -> Result<bool> {
        signals::lower(self, sub_id, kind).await
    }

    async fn raised_signals(&self, kind: Option<SignalKind>) -> Result<Vec<RaisedSignal>> {
        signals::raised(self, kind).await
    }

    async fn backlogs(&self) -> Result<Vec<Backlog>> {
        signals::backlogs(self).await
    }

    async fn failing_subscriptions(
        &self,
        started_at_or_before: Timestamp,
    ) -> Result<Vec<SubscriptionId>> {
        signals::failing(self, started_at_or_before).await
    }

    async fn enforce_retention(&self, policy: &RetentionPolicy) -> Result<RetentionReport> {
        retention::enforce(self, policy).await
    }

    async fn daily_stats(
        &self,
        sub_id: &SubscriptionId,
        since_day: chrono::NaiveDate,
    ) -> Result<Vec<DailyStats>> {
        retention::daily_stats(self, sub_id, since_day).await
    }

    async fn create_token(&self, token: NewToken) -> Result<()> {
        tokens::create(self, token).await
    }

    async fn find_token(&self, token_hash: &[u8]) -> Result<Option<FoundToken>> {
        tokens::find(self, token_hash).await
    }

    async fn has_admin_token(&self) -> Result<bool> {
        tokens::has_admin(self).await
    }

    async fn heartbeat(
        &self,
        node: &hookd_store::NodeHeartbeat,
        live_within: Duration,
    ) -> Result<u32> {
        nodes::heartbeat(self, node, live_within).await
    }

    async fn forget_node(&self, node_id: &str) -> Result<bool> {
        nodes::forget(self, node_id).await
    }

    async fn nodes(&self) -> Result<Vec<hookd_store::NodeInfo>> {
        nodes::list(self).await
    }
}
