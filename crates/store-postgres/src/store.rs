//! The [`Store`] implementation: one SQL statement per method where the
//! contract allows, one transaction where it names one.

use std::collections::HashMap;
use std::time::Duration;

use async_trait::async_trait;
use chrono::NaiveDate;
use hookd_domain::CustomerId;
use hookd_domain::subscription::SubscriptionState;
use hookd_domain::{DeliveryId, EventId, JobId, SubscriptionId, Timestamp};
use hookd_store::{
    Accepted, Attempt, AttemptRecord, Backlog, BatchOutcome, ClaimOrder, ClaimParts, ClaimRequest,
    ClaimedDelivery, DailyStats, Delivery, DeliveryDetail, DeliveryQuery, DueDestination,
    DueSubscription, Event, IngestClaim, JobStep, Lease, NewDelivery, NewEvent, NewReplayJob,
    NewSubscription, NewToken, NextState, Notice, RaisedSignal, RecordOutcome, ReplayJob, Result,
    RetentionPolicy, RetentionReport, SignalKind, Store, StoreError, StreakChange, Subscription,
    SubscriptionHealth, SubscriptionPatch, SubscriptionQuery, TokenScope,
};
use sqlx::postgres::PgRow;
use sqlx::{Postgres, Row, Transaction};
use uuid::Uuid;

use crate::error::{map, map_migrate};
use crate::rows::{self, delivery_cols, event_cols, job_cols, subscription_cols};
use crate::{PgStore, Writes};
use crate::{jobs, retention};

static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("./migrations");

/// The condition, on a pending due row `d` joined to its subscription `s`,
/// under which `d` may be claimed now as far as ordering goes: its
/// subscription is not ordered, or no delivery of it with a smaller id is
/// still unfinished and none of it is in flight (the trait's ordering rule).
/// One probe of the subscription's slice of `delivery_queue`, which holds
/// exactly the unfinished deliveries.
///
/// Under `FOR UPDATE SKIP LOCKED` this is also what keeps two claimers apart:
/// a claimer that skips a head another claimer has locked still sees that
/// head `pending` in its snapshot, so the rows behind it fail this check
/// instead of being taken next. A macro so it can be `concat!`ed into both
/// queries that must agree on it: claiming, and listing hosts with
/// claimable work.
macro_rules! not_blocked_by_order {
    () => {
        "(NOT s.ordered OR NOT EXISTS ( \
             SELECT 1 FROM delivery_queue x WHERE x.sub_id = d.sub_id \
               AND (x.delivery_id < d.delivery_id OR x.state = 'inflight')))"
    };
}

/// Pending due rows `d` (of `delivery_queue`) of active subscriptions `s`
/// that may be claimed now: what both `due_destinations` and `claim_due`
/// select from.
macro_rules! claimable {
    () => {
        concat!(
            "d.state = 'pending' AND d.next_attempt_at <= now() AND s.state = 'active' AND ",
            not_blocked_by_order!()
        )
    };
}

/// The claim statement for one filter and one order (`$order` names
/// columns of `d`, which is the `delivery_queue` row in the pick and the
/// claimed `deliveries` rows when they are read back, so one order serves
/// both). Parameters: $1 host, $2 limit, $3 lease in
/// microseconds, $4 worker, $5 subscription (only the variants that filter
/// on it use it).
///
/// One statement: pick (skipping rows another claimer holds), mark inflight
/// with a fresh token, and read back all the worker needs. The ordering
/// check reads the statement's snapshot, so within one batch the rows behind
/// an ordered head see it `pending`.
///
/// The pick reads and locks `delivery_queue` rows (`d`), in claim order by
/// `delivery_queue_due`, and stops at its limit; the `UPDATE` then takes the
/// delivery rows, and the trigger the queue rows. So a claim locks a
/// pending delivery's queue row before its row, and so do the other writers
/// of pending deliveries (`delete_subscription`, retention's
/// carry-forward). A delivery that is not pending (in flight, finished) is
/// taken row first, queue row after (records, renewals, releases, reclaims,
/// replays), and no claim takes its queue row (a pending queue row's
/// delivery is pending: the two are written in one transaction).
macro_rules! claim_sql {
    ($filter:literal, $order:literal) => {
        concat!(
            "WITH due AS ( \
                 SELECT d.delivery_id, d.retain_from FROM delivery_queue d \
                 JOIN subscriptions s ON s.sub_id = d.sub_id \
                 WHERE d.destination_host = $1 ",
            $filter,
            " AND ",
            claimable!(),
            " ORDER BY ",
            $order,
            " LIMIT $2 FOR UPDATE OF d SKIP LOCKED \
             ), claimed AS ( \
                 UPDATE deliveries u SET state = 'inflight', lease_token = u.lease_token + 1, \
                   lease_expires = now() + $3 * interval '1 microsecond', worker_id = $4, updated_at = now() \
                 FROM due WHERE u.delivery_id = due.delivery_id AND u.retain_from = due.retain_from \
                   AND u.state = 'pending' \
                 RETURNING u.* \
             ) SELECT ",
            delivery_cols!(),
            ", d.retain_from AS d_retain_from FROM claimed d ORDER BY ",
            $order
        )
    };
}

/// [`claim_sql!`] for many requests in one statement, one request per
/// destination host (so no two requests can pick one row): `$1` hosts,
/// `$2` subscriptions (the filtering variants only), `$3` limits, `$4`
/// lease in microseconds, `$5` worker. Each request's pick is a `LATERAL`
/// subquery, so it reads only its own slice of the due indexes and stops at
/// its limit; the rows come back with the request's position (`r_idx`, 1
/// for the first). One statement and one commit for what was a statement
/// and a commit per host.
macro_rules! claim_batch_sql {
    ($filter:literal, $order:literal) => {
        concat!(
            "WITH r AS ( \
                 SELECT * FROM unnest($1::text[], $2::uuid[], $3::bigint[]) WITH ORDINALITY \
                   AS r(host, sub, lim, idx) \
             ), due AS ( \
                 SELECT p.delivery_id, p.retain_from, r.idx FROM r CROSS JOIN LATERAL ( \
                     SELECT d.delivery_id, d.retain_from FROM delivery_queue d \
                     JOIN subscriptions s ON s.sub_id = d.sub_id \
                     WHERE d.destination_host = r.host ",
            $filter,
            " AND ",
            claimable!(),
            " ORDER BY ",
            $order,
            " LIMIT r.lim FOR UPDATE OF d SKIP LOCKED) p \
             ), claimed AS ( \
                 UPDATE deliveries u SET state = 'inflight', lease_token = u.lease_token + 1, \
                   lease_expires = now() + $4 * interval '1 microsecond', worker_id = $5, updated_at = now() \
                 FROM due WHERE u.delivery_id = due.delivery_id AND u.retain_from = due.retain_from \
                   AND u.state = 'pending' \
                 RETURNING u.*, due.idx AS r_idx \
             ) SELECT d.r_idx, ",
            delivery_cols!(),
            ", d.retain_from AS d_retain_from FROM claimed d ORDER BY d.r_idx, ",
            $order
        )
    };
}

/// `last_error` of deliveries failed by a subscription delete, and the
/// conflict a replay of such a subscription's delivery reports.
pub(crate) const DELETED: &str = "subscription deleted";

/// Rows per [`Store::reseal_secrets`] transaction.
const RESEAL_BATCH: i64 = 500;

/// Durations travel to SQL as whole microseconds (`$n * interval '1 microsecond'`),
/// PostgreSQL's own resolution, so no float rounding moves a due time.
fn micros(d: Duration) -> i64 {
    i64::try_from(d.as_micros()).unwrap_or(i64::MAX)
}

pub(crate) fn to_i32(what: &str, n: u32) -> Result<i32> {
    i32::try_from(n)
        .map_err(|_| StoreError::Backend(format!("{what} {n} does not fit the column").into()))
}

fn uuids<'a, T: 'a>(items: impl IntoIterator<Item = &'a T>, f: impl Fn(&T) -> Uuid) -> Vec<Uuid> {
    items.into_iter().map(f).collect()
}

/// Whether `err` is an insert that found no day partition for its row:
/// partition upkeep (migrate, enforce_retention) has not run for days.
fn is_missing_partition(err: &StoreError) -> bool {
    let StoreError::Backend(source) = err else {
        return false;
    };
    matches!(source.downcast_ref::<sqlx::Error>(), Some(sqlx::Error::Database(db))
        if db.code().as_deref() == Some("23514") && db.message().starts_with("no partition"))
}

/// Runs `call` (one whole transaction) and, if it found no day partition
/// for a row it inserted, creates today's and the next days' partitions and
/// runs it once more: ingest keeps working even when retention, which
/// normally creates them ahead, has not run for days.
pub(crate) async fn with_partitions<T, F, Fut>(store: &PgStore, call: F) -> Result<T>
where
    F: Fn() -> Fut,
    Fut: Future<Output = Result<T>>,
{
    match call().await {
        Err(e) if is_missing_partition(&e) => {
            retention::ensure_partitions(store).await?;
            call().await
        }
        res => res,
    }
}

/// Lowers a signal inside `tx`; whether it was raised.
async fn lower(
    tx: &mut Transaction<'_, Postgres>,
    sub_id: &SubscriptionId,
    kind: SignalKind,
) -> Result<bool> {
    let res = sqlx::query("DELETE FROM subscription_signals WHERE sub_id = $1 AND kind = $2")
        .bind(sub_id.as_uuid())
        .bind(kind.as_str())
        .execute(&mut **tx)
        .await
        .map_err(map)?;
    Ok(res.rows_affected() == 1)
}

/// Bumps the subscription generation inside a subscription write.
async fn bump_generation(tx: &mut Transaction<'_, Postgres>) -> Result<()> {
    sqlx::query("UPDATE meta SET value = value + 1 WHERE name = 'subscription_generation'")
        .execute(&mut **tx)
        .await
        .map_err(map)?;
    Ok(())
}

pub(crate) async fn begin(store: &PgStore) -> Result<Transaction<'static, Postgres>> {
    store.pool.begin().await.map_err(map)
}

/// A read-only transaction with one snapshot, so a delivery and its attempts
/// are read as of one moment: a concurrent `record_attempt` is seen whole or
/// not at all.
async fn begin_snapshot(store: &PgStore) -> Result<Transaction<'static, Postgres>> {
    store
        .pool
        .begin_with("BEGIN ISOLATION LEVEL REPEATABLE READ, READ ONLY")
        .await
        .map_err(map)
}

pub(crate) async fn commit(tx: Transaction<'_, Postgres>) -> Result<()> {
    tx.commit().await.map_err(map)
}

/// Attempts of `ids`, oldest first per delivery, in one query.
async fn attempts_of<'e>(
    exec: impl sqlx::PgExecutor<'e>,
    ids: &[Uuid],
) -> Result<HashMap<Uuid, Vec<Attempt>>> {
    let rows = sqlx::query(
        "SELECT delivery_id, number, started_at, duration_ms, status, error_class, response_snippet \
         FROM attempts WHERE delivery_id = ANY($1) ORDER BY delivery_id, attempt_id",
    )
    .bind(ids)
    .fetch_all(exec)
    .await
    .map_err(map)?;
    let mut by_delivery: HashMap<Uuid, Vec<Attempt>> = HashMap::new();
    for row in &rows {
        let (id, attempt) = rows::attempt(row)?;
        by_delivery.entry(id).or_default().push(attempt);
    }
    Ok(by_delivery)
}

fn details(
    rows: &[PgRow],
    mut attempts: HashMap<Uuid, Vec<Attempt>>,
) -> Result<Vec<DeliveryDetail>> {
    rows.iter()
        .map(|row| {
            let delivery = rows::delivery(row)?;
            let attempts = attempts.remove(delivery.id.as_uuid()).unwrap_or_default();
            Ok(DeliveryDetail { delivery, attempts })
        })
        .collect()
}

fn json(value: &impl serde::Serialize) -> Result<String> {
    serde_json::to_string(value).map_err(|e| StoreError::Backend(Box::new(e)))
}

impl PgStore {
    /// The events and subscriptions of claimed `deliveries`, each read once
    /// ([`ClaimParts`]). Both reads run at once, after the claim's commit:
    /// the rows' foreign keys keep their event and subscription from being
    /// removed, and a subscription is "as it is now" either way. If a read
    /// fails, the call fails and its rows stay leased until the lease
    /// expires and `reclaim_expired` returns them, as after a claim whose
    /// worker went away.
    async fn read_back<'a>(
        &self,
        deliveries: impl IntoIterator<Item = &'a Delivery>,
    ) -> Result<ClaimParts> {
        let (event_ids, sub_ids) = ClaimParts::ids(deliveries);
        if event_ids.is_empty() {
            return Ok(ClaimParts::default());
        }
        let event_ids: Vec<Uuid> = event_ids.iter().map(|id| *id.as_uuid()).collect();
        let sub_ids: Vec<Uuid> = sub_ids.iter().map(|id| *id.as_uuid()).collect();
        let events = sqlx::query(concat!(
            "SELECT ",
            event_cols!(),
            " FROM events e WHERE e.event_id = ANY($1)"
        ))
        .bind(&event_ids)
        .fetch_all(&self.pool);
        let subs = sqlx::query(concat!(
            "SELECT ",
            subscription_cols!(),
            " FROM subscriptions s WHERE s.sub_id = ANY($1)"
        ))
        .bind(&sub_ids)
        .fetch_all(&self.pool);
        let (events, subs) = futures::future::try_join(events, subs).await.map_err(map)?;
        Ok(ClaimParts {
            events: events
                .iter()
                .map(|row| rows::event(row).map(|e| (e.id, e)))
                .collect::<Result<_>>()?,
            subscriptions: subs
                .iter()
                .map(|row| rows::subscription(row, &self.keyring).map(|s| (s.id, s)))
                .collect::<Result<_>>()?,
        })
    }

    /// Claims for `members` of `reqs` (one variant: all filter by
    /// subscription or none, all in one order, with one lease and worker;
    /// every host distinct) in one statement. A lone request goes through [`Store::claim_due`]'s
    /// simpler statement. Returns each member's claims.
    async fn claim_batch(
        &self,
        reqs: &[ClaimRequest],
        members: Vec<usize>,
    ) -> Result<Vec<(usize, Vec<ClaimedDelivery>)>> {
        if let [only] = members[..] {
            return Ok(vec![(only, self.claim_due(&reqs[only]).await?)]);
        }
        let first = &reqs[members[0]];
        let sql = match (first.subscription.is_some(), first.order) {
            (false, ClaimOrder::OldestFirst) => {
                claim_batch_sql!("", "d.next_attempt_at, d.delivery_id")
            }
            (false, ClaimOrder::NewestFirst) => {
                claim_batch_sql!("", "d.next_attempt_at DESC, d.delivery_id DESC")
            }
            (true, ClaimOrder::OldestFirst) => {
                claim_batch_sql!("AND d.sub_id = r.sub", "d.next_attempt_at, d.delivery_id")
            }
            (true, ClaimOrder::NewestFirst) => claim_batch_sql!(
                "AND d.sub_id = r.sub",
                "d.next_attempt_at DESC, d.delivery_id DESC"
            ),
        };
        let hosts: Vec<&str> = members
            .iter()
            .map(|&i| reqs[i].destination.as_str())
            .collect();
        let subs: Vec<Option<Uuid>> = members
            .iter()
            .map(|&i| reqs[i].subscription.map(|s| *s.as_uuid()))
            .collect();
        let limits: Vec<i64> = members.iter().map(|&i| i64::from(reqs[i].limit)).collect();
        let lease = first.lease;
        self.bounded(async {
            // A generic plan, made once per connection. Left to choose,
            // PostgreSQL planned this statement afresh on every call (1,050
            // plans in 1,018 calls of `steady`, 1.35 ms each: 8 % of the
            // server's statement time), as its estimate of the generic plan
            // was never below a custom one's. Only here, and only for this
            // transaction: statements with optional filters
            // (`$1 IS NULL OR …`) need their custom plans.
            let mut tx = self
                .pool
                .begin_with("BEGIN; SET LOCAL plan_cache_mode = force_generic_plan")
                .await
                .map_err(map)?;
            let rows = sqlx::query(sql)
                .bind(&hosts)
                .bind(&subs)
                .bind(&limits)
                .bind(micros(lease))
                .bind(&first.worker_id)
                .fetch_all(&mut *tx)
                .await
                .map_err(map)?;
            commit(tx).await?;
            let claimed = rows
                .iter()
                .map(|row| {
                    let idx: i64 = row.try_get("r_idx").map_err(map)?;
                    Ok((
                        idx,
                        rows::delivery(row)?,
                        rows::lease_token(row)?,
                        rows::partition(row)?,
                    ))
                })
                .collect::<Result<Vec<_>>>()?;
            let parts = self.read_back(claimed.iter().map(|(_, d, _, _)| d)).await?;
            let mut out: Vec<(usize, Vec<ClaimedDelivery>)> =
                members.iter().map(|&i| (i, Vec::new())).collect();
            for (idx, delivery, token, partition) in claimed {
                let slot = usize::try_from(idx - 1)
                    .ok()
                    .and_then(|k| out.get_mut(k))
                    .ok_or_else(|| StoreError::Corrupt(format!("claim row for request {idx}")))?;
                slot.1
                    .push(parts.claimed(delivery, token, Some(partition))?);
            }
            Ok(out)
        })
        .await
    }
}

impl PgStore {
    /// [`Store::accept_events`] on a borrowed batch (a sharded deployment
    /// still needs the batch after the control database took it); with a
    /// `generation`, [`Store::accept_events_at`]: `None` when it moved.
    pub(crate) async fn accept_batch(
        &self,
        batch: &[(NewEvent, Vec<NewDelivery>)],
        generation: Option<i64>,
        claim: Option<&IngestClaim>,
    ) -> Result<Option<(Vec<Result<Accepted>>, Vec<Lease>)>> {
        if batch.is_empty() {
            return Ok(Some((Vec::new(), Vec::new())));
        }
        let results = self
            .bounded(with_partitions(self, || async move {
                let writes = self.writes();
                // Every event written here as rows: the one-call path, the
                // only one that creates deliveries claimed.
                let fast = if matches!(writes, Writes::Here(_))
                    && !batch.iter().any(|(_, ds)| writes.is_lazy(ds.len()))
                {
                    accept_in_one_call(self, batch, generation, claim).await
                } else {
                    let mut tx = begin(self).await?;
                    if generation_moved(&mut tx, generation).await? {
                        return Ok(None);
                    }
                    match insert_events(&mut tx, batch, writes).await {
                        Ok(results) => commit(tx).await.map(|()| Some((results, Vec::new()))),
                        Err(e) => Err(e),
                    }
                };
                match fast {
                    Ok(results) => return Ok(results),
                    // One event is at fault, and PostgreSQL does not say which:
                    // start over, one event at a time (rare: a bug, not load).
                    Err(e) if is_event_error(&e) => {}
                    Err(e) => return Err(e),
                }
                let mut tx = begin(self).await?;
                if generation_moved(&mut tx, generation).await? {
                    return Ok(None);
                }
                let results = insert_events_one_by_one(&mut tx, batch, self.writes()).await?;
                commit(tx).await?;
                Ok(Some((results, Vec::new())))
            }))
            .await?;
        let Some((results, leases)) = results else {
            return Ok(None);
        };
        let written: usize = batch
            .iter()
            .zip(&results)
            .filter(|(_, r)| matches!(r, Ok(a) if !a.duplicate))
            .map(|((_, ds), _)| self.rows_now(ds.len()))
            .sum();
        self.wrote_deliveries(written);
        Ok(Some((results, leases)))
    }
}

/// Whether the subscription generation, read in `tx`, is no longer
/// `expected` (never, when nothing is expected).
async fn generation_moved(
    tx: &mut Transaction<'_, Postgres>,
    expected: Option<i64>,
) -> Result<bool> {
    let Some(expected) = expected else {
        return Ok(false);
    };
    let now: i64 =
        sqlx::query_scalar("SELECT value FROM meta WHERE name = 'subscription_generation'")
            .fetch_one(&mut **tx)
            .await
            .map_err(map)?;
    Ok(now != expected)
}

/// The SQLSTATE `hookd_accept_batch` raises when the subscription
/// generation is not the one the batch was matched against.
const GENERATION_MOVED: &str = "HKD01";

// Lookups by id. The primary key is (delivery_id, retain_from), one index
// per day partition, so a row found by its id alone is looked for in every
// day's index: with the default 7 days kept, eleven partitions (today's
// three ahead included). A claim's pick reads the row's retain_from and
// names it in its UPDATE, and hands it out in the lease
// (`Lease::partition`; at ingest, the transaction's now(), which the rows
// were written with); a record and a renewal name it too, so PostgreSQL
// prunes the other partitions at run time: recording 500 attempts against
// seven days of 300,000 rows took 25-33 ms by id alone,
// 6-8 ms with the partition named (docs/benchmarks.md, session 15).

/// Writes an event and its deliveries in `tx` (the outbox), or finds the
/// event holding its idempotency key (`duplicate`, nothing written): all of
/// [`Store::accept_event`] but the commit, shared with `raise_signal`'s
/// notice. Over `fanout`'s threshold the deliveries go into a fan-out job
/// ([`crate::fanout::write_job`]).
pub(crate) async fn insert_event(
    tx: &mut Transaction<'_, Postgres>,
    event: &NewEvent,
    deliveries: &[NewDelivery],
    writes: Writes,
) -> Result<Accepted> {
    // ON CONFLICT waits for a concurrent inserter of the same key to
    // commit or roll back, so of N simultaneous duplicates exactly one
    // inserts and the rest see its row.
    let inserted = sqlx::query(
        "INSERT INTO events (event_id, type, payload, idempotency_key, customer_id) \
         VALUES ($1, $2, $3, $4, $5) ON CONFLICT (idempotency_key) DO NOTHING RETURNING event_id",
    )
    .bind(event.id.as_uuid())
    .bind(event.event_type.as_str())
    .bind(&event.payload)
    .bind(event.idempotency_key.as_deref())
    .bind(event.customer_id.as_ref().map(CustomerId::as_str))
    .fetch_optional(&mut **tx)
    .await
    .map_err(map)?;
    if inserted.is_none() {
        let existing = sqlx::query("SELECT event_id FROM events WHERE idempotency_key = $1")
            .bind(event.idempotency_key.as_deref())
            .fetch_optional(&mut **tx)
            .await
            .map_err(map)?
            // Only possible if the holder of the key was deleted
            // between the two statements.
            .ok_or_else(|| StoreError::Conflict("idempotency key is being reused".into()))?;
        let id: Uuid = existing.try_get("event_id").map_err(map)?;
        return Ok(Accepted {
            event_id: EventId::from_uuid(id),
            duplicate: true,
        });
    }
    match writes {
        Writes::Outbox => crate::sharded::outbox::write(tx, &[(event, deliveries)]).await?,
        Writes::Here(fanout) if fanout.is_lazy(deliveries.len()) => {
            crate::fanout::write_job(tx, event, deliveries, fanout).await?;
        }
        Writes::Here(_) => insert_deliveries(tx, event, deliveries).await?,
    }
    Ok(Accepted {
        event_id: event.id,
        duplicate: false,
    })
}

/// Writes `event`'s `deliveries` (its row is written already), pending and
/// due at once. One statement for the whole fan-out, however wide. One
/// now() for all of it: the deliveries share one retain_from, so one day
/// partition, which is what keeps (event_id, sub_id) unique.
pub(crate) async fn insert_deliveries<D: std::borrow::Borrow<NewDelivery> + Sync>(
    tx: &mut Transaction<'_, Postgres>,
    event: &NewEvent,
    deliveries: &[D],
) -> Result<()> {
    if deliveries.is_empty() {
        return Ok(());
    }
    let all = || deliveries.iter().map(std::borrow::Borrow::borrow);
    sqlx::query(
        "INSERT INTO deliveries (delivery_id, event_id, sub_id, event_type, destination_host, \
         state, attempt, next_attempt_at, created_at, window_start, updated_at, retain_from) \
         SELECT u.delivery_id, $1, u.sub_id, $2, u.host, 'pending', 0, now(), now(), now(), now(), now() \
         FROM unnest($3::uuid[], $4::uuid[], $5::text[]) AS u(delivery_id, sub_id, host)",
    )
    .bind(event.id.as_uuid())
    .bind(event.event_type.as_str())
    .bind(all().map(|d: &NewDelivery| *d.id.as_uuid()).collect::<Vec<_>>())
    .bind(all().map(|d: &NewDelivery| *d.sub_id.as_uuid()).collect::<Vec<_>>())
    .bind(
        all()
            .map(|d: &NewDelivery| d.destination_host.as_str())
            .collect::<Vec<_>>(),
    )
    .execute(&mut **tx)
    .await
    .map_err(map)?;
    Ok(())
}

/// For each event of `batch`, the index of the first event of the batch with
/// its idempotency key (itself when it is the first, or has no key). An
/// event whose key an earlier event of the batch holds is that event's
/// duplicate, whatever becomes of the earlier one: it never reaches the
/// INSERT.
fn first_with_key(batch: &[(NewEvent, Vec<NewDelivery>)]) -> Vec<usize> {
    let mut first: HashMap<&str, usize> = HashMap::new();
    batch
        .iter()
        .enumerate()
        .map(|(i, (e, _))| match e.idempotency_key.as_deref() {
            Some(key) => *first.entry(key).or_insert(i),
            None => i,
        })
        .collect()
}

/// The events of `batch` that go to the INSERT: the first with each key.
fn candidates<'a>(
    batch: &'a [(NewEvent, Vec<NewDelivery>)],
    first: &[usize],
) -> impl Iterator<Item = &'a (NewEvent, Vec<NewDelivery>)> {
    batch
        .iter()
        .zip(first)
        .enumerate()
        .filter(|(i, (_, f))| i == *f)
        .map(|(_, (item, _))| item)
}

/// The events' columns, as arrays for `unnest`: id, type, payload,
/// idempotency key, customer.
type EventColumns<'a> = (
    Vec<Uuid>,
    Vec<&'a str>,
    Vec<&'a str>,
    Vec<Option<&'a str>>,
    Vec<Option<&'a str>>,
);

fn event_columns<'a>(events: &[&'a NewEvent]) -> EventColumns<'a> {
    (
        uuids(events.iter().copied(), |e| *e.id.as_uuid()),
        events.iter().map(|e| e.event_type.as_str()).collect(),
        events.iter().map(|e| e.payload.as_str()).collect(),
        events
            .iter()
            .map(|e| e.idempotency_key.as_deref())
            .collect(),
        events
            .iter()
            .map(|e| e.customer_id.as_ref().map(CustomerId::as_str))
            .collect(),
    )
}

/// Delivery rows' columns, as arrays for `unnest`: id, event, subscription,
/// event type, destination host.
type DeliveryColumns<'a> = (Vec<Uuid>, Vec<Uuid>, Vec<Uuid>, Vec<&'a str>, Vec<&'a str>);

fn delivery_columns<'a>(rows: &[(&'a NewEvent, &'a NewDelivery)]) -> DeliveryColumns<'a> {
    (
        rows.iter().map(|(_, d)| *d.id.as_uuid()).collect(),
        rows.iter().map(|(e, _)| *e.id.as_uuid()).collect(),
        rows.iter().map(|(_, d)| *d.sub_id.as_uuid()).collect(),
        rows.iter().map(|(e, _)| e.event_type.as_str()).collect(),
        rows.iter()
            .map(|(_, d)| d.destination_host.as_str())
            .collect(),
    )
}

/// What became of a batch once its events' INSERT has run: each event's
/// result, and where the deliveries of the inserted ones go.
#[derive(Default)]
struct Sorted<'a> {
    results: Vec<Result<Accepted>>,
    /// Delivery rows to write here.
    rows: Vec<(&'a NewEvent, &'a NewDelivery)>,
    /// Events over the lazy fan-out threshold: a fan-out job each.
    lazy: Vec<(&'a NewEvent, &'a [NewDelivery])>,
    /// In sharded mode (the control database) every event's deliveries go
    /// to the outbox, for the shards to write.
    outboxed: Vec<(&'a NewEvent, &'a [NewDelivery])>,
}

/// Sorts out `batch` given the ids the INSERT returned (`inserted`) and the
/// holders of the keys that were taken already.
fn sort_out<'a>(
    batch: &'a [(NewEvent, Vec<NewDelivery>)],
    first: &[usize],
    inserted: &std::collections::HashSet<Uuid>,
    holders: &HashMap<String, Uuid>,
    writes: Writes,
) -> Sorted<'a> {
    let mut out = Sorted {
        results: Vec::with_capacity(batch.len()),
        ..Sorted::default()
    };
    for (i, ((event, deliveries), &f)) in batch.iter().zip(first).enumerate() {
        let head = &batch[f].0;
        let fresh = Ok(Accepted {
            event_id: event.id,
            duplicate: false,
        });
        let result = if !inserted.contains(head.id.as_uuid()) {
            match head.idempotency_key.as_deref().and_then(|k| holders.get(k)) {
                Some(&id) => Ok(Accepted {
                    event_id: EventId::from_uuid(id),
                    duplicate: true,
                }),
                // Only possible if the holder of the key was deleted
                // between the two statements.
                None => Err(StoreError::Conflict(
                    "idempotency key is being reused".into(),
                )),
            }
        } else if i != f {
            Ok(Accepted {
                event_id: head.id,
                duplicate: true,
            })
        } else if matches!(writes, Writes::Outbox) {
            out.outboxed.push((event, deliveries));
            fresh
        } else if writes.is_lazy(deliveries.len()) {
            out.lazy.push((event, deliveries));
            fresh
        } else {
            out.rows.extend(deliveries.iter().map(|d| (event, d)));
            fresh
        };
        out.results.push(result);
    }
    out
}

/// The events among `candidates` whose keys were taken already (by an
/// earlier ingest, or a concurrent one that committed first), with their
/// holders: one lookup for all of them.
async fn holders_of<'e>(
    exec: impl sqlx::PgExecutor<'e>,
    candidates: &[&NewEvent],
    inserted: &std::collections::HashSet<Uuid>,
) -> Result<HashMap<String, Uuid>> {
    let taken_keys: Vec<&str> = candidates
        .iter()
        .filter(|e| !inserted.contains(e.id.as_uuid()))
        .filter_map(|e| e.idempotency_key.as_deref())
        .collect();
    if taken_keys.is_empty() {
        return Ok(HashMap::new());
    }
    let rows: Vec<(String, Uuid)> = sqlx::query_as(
        "SELECT idempotency_key, event_id FROM events WHERE idempotency_key = ANY($1)",
    )
    .bind(&taken_keys)
    .fetch_all(exec)
    .await
    .map_err(map)?;
    Ok(rows.into_iter().collect())
}

/// Accepts a batch whose every event is written here as rows (no fan-out
/// job, no outbox) in ONE self-committing call of `hookd_accept_batch`
/// (migration 0013): the events' INSERT, then the deliveries of those it
/// inserted. One round trip where a transaction takes four (BEGIN, two
/// INSERTs, COMMIT); on a busy machine each one waits for hookd's turn on
/// a core as much as for the server. Keys taken already are looked up after
/// the commit, only when there are some.
async fn accept_in_one_call(
    store: &PgStore,
    batch: &[(NewEvent, Vec<NewDelivery>)],
    generation: Option<i64>,
    claim: Option<&IngestClaim>,
) -> Result<Option<(Vec<Result<Accepted>>, Vec<Lease>)>> {
    let first = first_with_key(batch);
    let heads: Vec<&(NewEvent, Vec<NewDelivery>)> = candidates(batch, &first).collect();
    let events: Vec<&NewEvent> = heads.iter().map(|(e, _)| e).collect();
    let rows: Vec<(&NewEvent, &NewDelivery)> = heads
        .iter()
        .flat_map(|(e, ds)| ds.iter().map(move |d| (e, d)))
        .collect();
    let (ev_id, ev_type, ev_payload, ev_key, ev_customer) = event_columns(&events);
    let (d_id, d_event, d_sub, d_type, d_host) = delivery_columns(&rows);
    // Which rows to create claimed; none (NULL) without a claim.
    let d_claimed: Option<Vec<bool>> = claim.filter(|c| !c.deliveries.is_empty()).map(|c| {
        rows.iter()
            .map(|(_, d)| c.deliveries.contains(&d.id))
            .collect()
    });
    // now(): the transaction's time, which the function wrote as every new
    // row's retain_from (its day partition, for the leases).
    let inserted: Vec<(Uuid, Timestamp)> = match sqlx::query_as(
        "SELECT id, now() AS day FROM hookd_accept_batch($1::bigint, $2::uuid[], $3::text[], $4::text[], \
         $5::text[], $6::text[], $7::uuid[], $8::uuid[], $9::uuid[], $10::text[], $11::text[], \
         $12::boolean[], $13::text, make_interval(secs => $14::float8)) AS id",
    )
    .bind(generation)
    .bind(ev_id)
    .bind(ev_type)
    .bind(ev_payload)
    .bind(ev_key)
    .bind(ev_customer)
    .bind(d_id)
    .bind(d_event)
    .bind(d_sub)
    .bind(d_type)
    .bind(d_host)
    .bind(&d_claimed)
    .bind(claim.map(|c| c.worker_id.as_str()))
    .bind(claim.map_or(0.0, |c| c.lease.as_secs_f64()))
    .fetch_all(&store.pool)
    .await
    {
        Ok(inserted) => inserted,
        Err(sqlx::Error::Database(db)) if db.code().as_deref() == Some(GENERATION_MOVED) => {
            return Ok(None);
        }
        Err(e) => return Err(map(e)),
    };
    let day = inserted.first().map(|&(_, day)| day);
    let inserted: std::collections::HashSet<Uuid> =
        inserted.into_iter().map(|(id, _)| id).collect();
    // A claimed row was written exactly when its event was.
    let leases = match &d_claimed {
        Some(claimed) => rows
            .iter()
            .zip(claimed)
            .filter(|((e, _), c)| **c && inserted.contains(e.id.as_uuid()))
            .map(|((_, d), _)| Lease {
                delivery_id: d.id,
                token: INGEST_CLAIM_TOKEN,
                partition: day,
                subscription: d.sub_id,
            })
            .collect(),
        None => Vec::new(),
    };
    let holders = holders_of(&store.pool, &events, &inserted).await?;
    Ok(Some((
        sort_out(batch, &first, &inserted, &holders, store.writes()).results,
        leases,
    )))
}

/// The lease token of a delivery created claimed (migration 0014): the one
/// its first claim would have written (claims add 1 to the initial 0).
const INGEST_CLAIM_TOKEN: i64 = 1;

/// Accepts a batch in `tx`, all or nothing: the fast path of
/// [`Store::accept_events`] when some event is not written as rows here
/// (a fan-out job, or the shard outbox). Two statements whatever the
/// batch's size: one INSERT of every event (the idempotency check is its
/// `ON CONFLICT`) and one of every delivery, both from arrays (`unnest`),
/// so no bound-parameter limit applies; plus one lookup, only when some key
/// was taken already. An error leaves the transaction aborted: the caller
/// must drop it.
async fn insert_events(
    tx: &mut Transaction<'_, Postgres>,
    batch: &[(NewEvent, Vec<NewDelivery>)],
    writes: Writes,
) -> Result<Vec<Result<Accepted>>> {
    let first = first_with_key(batch);
    let events: Vec<&NewEvent> = candidates(batch, &first).map(|(e, _)| e).collect();
    let (ev_id, ev_type, ev_payload, ev_key, ev_customer) = event_columns(&events);
    // Rows go in in key order, so two batches that share keys take their
    // locks on them in one order and never deadlock: a later one waits
    // (ON CONFLICT waits for the holder of a key to commit or roll back),
    // then skips the key, exactly as `accept_event` does.
    let inserted: Vec<Uuid> = sqlx::query_scalar(
        "INSERT INTO events (event_id, type, payload, idempotency_key, customer_id) \
         SELECT u.event_id, u.type, u.payload, u.idempotency_key, u.customer_id \
         FROM unnest($1::uuid[], $2::text[], $3::text[], $4::text[], $5::text[]) \
           AS u(event_id, type, payload, idempotency_key, customer_id) \
         ORDER BY u.idempotency_key \
         ON CONFLICT (idempotency_key) DO NOTHING RETURNING event_id",
    )
    .bind(ev_id)
    .bind(ev_type)
    .bind(ev_payload)
    .bind(ev_key)
    .bind(ev_customer)
    .fetch_all(&mut **tx)
    .await
    .map_err(map)?;
    let inserted: std::collections::HashSet<Uuid> = inserted.into_iter().collect();
    let holders = holders_of(&mut **tx, &events, &inserted).await?;
    let sorted = sort_out(batch, &first, &inserted, &holders, writes);
    insert_delivery_rows(tx, &sorted.rows).await?;
    if let Writes::Here(fanout) = writes {
        for (event, deliveries) in sorted.lazy {
            crate::fanout::write_job(tx, event, deliveries, fanout).await?;
        }
    }
    crate::sharded::outbox::write(tx, &sorted.outboxed).await?;
    Ok(sorted.results)
}

/// Writes deliveries of several events (their rows are written already),
/// pending and due at once, in one statement. One now() for the whole
/// transaction: every delivery goes to one day partition, which is what
/// keeps (event_id, sub_id) unique.
pub(crate) async fn insert_delivery_rows(
    tx: &mut Transaction<'_, Postgres>,
    rows: &[(&NewEvent, &NewDelivery)],
) -> Result<()> {
    if rows.is_empty() {
        return Ok(());
    }
    let (d_id, d_event, d_sub, d_type, d_host) = delivery_columns(rows);
    sqlx::query(
        "INSERT INTO deliveries (delivery_id, event_id, sub_id, event_type, destination_host, \
         state, attempt, next_attempt_at, created_at, window_start, updated_at, retain_from) \
         SELECT u.delivery_id, u.event_id, u.sub_id, u.event_type, u.host, 'pending', 0, \
                now(), now(), now(), now(), now() \
         FROM unnest($1::uuid[], $2::uuid[], $3::uuid[], $4::text[], $5::text[]) \
           AS u(delivery_id, event_id, sub_id, event_type, host)",
    )
    .bind(d_id)
    .bind(d_event)
    .bind(d_sub)
    .bind(d_type)
    .bind(d_host)
    .execute(&mut **tx)
    .await
    .map_err(map)?;
    Ok(())
}

/// Whether `e` is the failure of one event's rows (a constraint it breaks:
/// an unknown subscription, a repeated (event, subscription) pair, a reused
/// id) rather than of the store. A missing day partition is the store's
/// (`with_partitions` creates it and runs the whole call again).
fn is_event_error(e: &StoreError) -> bool {
    match e {
        StoreError::Conflict(_) => true,
        StoreError::Backend(source) if !is_missing_partition(e) => matches!(
            source.downcast_ref::<sqlx::Error>(),
            Some(sqlx::Error::Database(db)) if !matches!(db.kind(), sqlx::error::ErrorKind::Other)
        ),
        _ => false,
    }
}

/// [`Store::accept_events`] after the fast path failed for one of the
/// events: each event in a savepoint of one transaction, in input order,
/// exactly as `accept_event`, so the event at fault gets its error and is
/// rolled back alone.
async fn insert_events_one_by_one(
    tx: &mut Transaction<'_, Postgres>,
    batch: &[(NewEvent, Vec<NewDelivery>)],
    writes: Writes,
) -> Result<Vec<Result<Accepted>>> {
    let mut results = Vec::with_capacity(batch.len());
    for (event, deliveries) in batch {
        sqlx::query("SAVEPOINT accept_one")
            .execute(&mut **tx)
            .await
            .map_err(map)?;
        let res = insert_event(tx, event, deliveries, writes).await;
        let undo = match res {
            Ok(accepted) => accepted.duplicate,
            Err(ref e) if is_event_error(e) => true,
            // The store failed: the whole call fails.
            Err(e) => return Err(e),
        };
        if undo {
            sqlx::query("ROLLBACK TO SAVEPOINT accept_one")
                .execute(&mut **tx)
                .await
                .map_err(map)?;
        }
        sqlx::query("RELEASE SAVEPOINT accept_one")
            .execute(&mut **tx)
            .await
            .map_err(map)?;
        results.push(res);
    }
    Ok(results)
}

#[async_trait]
impl Store for PgStore {
    async fn migrate(&self) -> Result<()> {
        // A dedicated connection without statement_timeout: waiting for
        // another process's migration (sqlx's advisory lock) or building an
        // index may legitimately take longer than a request should. It is
        // detached so the changed setting never returns to the pool.
        let mut conn = self.pool.acquire().await.map_err(map)?.detach();
        sqlx::query("SET statement_timeout = 0")
            .execute(&mut conn)
            .await
            .map_err(map)?;
        // `run_direct` is what `run` calls after acquiring; calling it
        // directly sidesteps `Acquire`'s lifetime trouble in async_trait.
        let mut res = MIGRATOR
            .run_direct(None, &mut conn, false)
            .await
            .map_err(map_migrate);
        if res.is_ok() {
            // Today's and the next days' partitions, so inserts find theirs
            // even if the last run was days ago.
            // (Short of the lock, it gives up: they exist days ahead, and
            // an insert that finds none creates its own.)
            res = retention::ensure_partitions(self).await.map(|_| ());
        }
        let _ = sqlx::Connection::close(conn).await;
        res
    }

    async fn ping(&self) -> Result<()> {
        self.bounded(async {
            sqlx::query("SELECT 1")
                .execute(&self.pool)
                .await
                .map_err(map)?;
            Ok(())
        })
        .await
    }

    async fn schema_status(&self) -> Result<hookd_store::SchemaStatus> {
        self.bounded(async {
            // One row per migration: as cheap as `SELECT 1`.
            let applied: std::result::Result<Option<i64>, sqlx::Error> =
                sqlx::query_scalar("SELECT max(version) FROM _sqlx_migrations WHERE success")
                    .fetch_one(&self.pool)
                    .await;
            let applied = match applied {
                Ok(v) => v,
                // undefined_table: never migrated.
                Err(sqlx::Error::Database(e)) if e.code().as_deref() == Some("42P01") => None,
                Err(e) => return Err(map(e)),
            };
            let expected = MIGRATOR
                .iter()
                .filter(|m| !m.migration_type.is_down_migration())
                .map(|m| m.version)
                .max()
                .unwrap_or(0);
            Ok(hookd_store::SchemaStatus::compare(applied, expected))
        })
        .await
    }

    async fn due_work(&self) -> Result<hookd_store::DueWork> {
        self.bounded(async {
            // The due rows counted per subscription first, then the active
            // subscriptions kept: one pass over the queue. Joined row by row,
            // PostgreSQL (guessing one active subscription, as a small table's
            // statistics say) read each subscription's due rows by index, one
            // heap page per row, as the rows of all subscriptions interleave
            // on the queue's pages: 613 ms against 65 ms for a 100-subscription
            // queue of 120,000 rows, every monitor round (docs/benchmarks.md,
            // session 17).
            let row = sqlx::query(
                "SELECT COALESCE(sum(q.due), 0)::bigint AS due, \
                 COALESCE(EXTRACT(EPOCH FROM now() - min(q.oldest)), 0)::float8 AS overdue \
                 FROM (SELECT sub_id, count(*) AS due, min(next_attempt_at) AS oldest \
                       FROM delivery_queue WHERE state = 'pending' AND next_attempt_at <= now() \
                       GROUP BY sub_id) q \
                 JOIN subscriptions s ON s.sub_id = q.sub_id WHERE s.state = 'active'",
            )
            .fetch_one(&self.pool)
            .await
            .map_err(map)?;
            let due: i64 = row.try_get("due").map_err(map)?;
            let overdue: f64 = row.try_get("overdue").map_err(map)?;
            Ok(hookd_store::DueWork {
                due: u64::try_from(due).unwrap_or(0),
                oldest_overdue: Duration::try_from_secs_f64(overdue.max(0.0)).unwrap_or_default(),
            })
        })
        .await
    }

    // --- subscriptions ---------------------------------------------------

    async fn create_subscription(&self, new: NewSubscription) -> Result<Subscription> {
        self.bounded(async {
            let mut tx = begin(self).await?;
            let (prev, prev_until) = new
                .keys
                .previous
                .as_ref()
                .map(|(s, t)| (rows::seal(&self.keyring, &new.id, s), *t))
                .unzip();
            let row = sqlx::query(concat!(
                "INSERT INTO subscriptions AS s (sub_id, customer_id, url, host, event_types, secret, \
                 previous_secret, previous_secret_expires_at, ordered, retry_policy, state, description, \
                 rate_limit, max_concurrency) \
                 VALUES ($1, $2, $3, $4, $5::jsonb, $6, $7, $8, $9, $10::jsonb, 'active', $11, $12, $13) \
                 RETURNING ",
                subscription_cols!()
            ))
            .bind(new.id.as_uuid())
            .bind(new.customer_id.as_ref().map(CustomerId::as_str))
            .bind(new.url.as_str())
            .bind(new.url.host())
            .bind(json(&new.event_types)?)
            .bind(rows::seal(&self.keyring, &new.id, &new.keys.current))
            .bind(prev)
            .bind(prev_until)
            .bind(new.ordered)
            .bind(json(&new.retry_policy)?)
            .bind(new.description.as_deref())
            .bind(new.rate_limit.map(|n| to_i32("rate_limit", n)).transpose()?)
            .bind(new.max_concurrency.map(|n| to_i32("max_concurrency", n)).transpose()?)
            .fetch_one(&mut *tx)
            .await
            .map_err(map)?;
            let sub = rows::subscription(&row, &self.keyring)?;
            bump_generation(&mut tx).await?;
            commit(tx).await?;
            Ok(sub)
        })
        .await
    }

    async fn get_subscription(&self, id: &SubscriptionId) -> Result<Subscription> {
        self.bounded(async {
            let row = sqlx::query(concat!(
                "SELECT ",
                subscription_cols!(),
                " FROM subscriptions s WHERE s.sub_id = $1 AND s.state <> 'deleted'"
            ))
            .bind(id.as_uuid())
            .fetch_optional(&self.pool)
            .await
            .map_err(map)?;
            rows::subscription(&row.ok_or(StoreError::NotFound)?, &self.keyring)
        })
        .await
    }

    async fn list_subscriptions(&self, query: &SubscriptionQuery) -> Result<Vec<Subscription>> {
        self.bounded(async {
            let rows = sqlx::query(concat!(
                "SELECT ",
                subscription_cols!(),
                " FROM subscriptions s WHERE s.state <> 'deleted' \
                 AND ($1::text IS NULL OR s.customer_id = $1) \
                 AND ($2::uuid IS NULL OR s.sub_id > $2) \
                 ORDER BY s.sub_id LIMIT $3"
            ))
            .bind(query.customer_id.as_ref().map(CustomerId::as_str))
            .bind(query.cursor.as_ref().map(SubscriptionId::as_uuid))
            .bind(i64::from(query.limit))
            .fetch_all(&self.pool)
            .await
            .map_err(map)?;
            rows.iter()
                .map(|row| rows::subscription(row, &self.keyring))
                .collect()
        })
        .await
    }

    async fn all_subscriptions(&self) -> Result<Vec<Subscription>> {
        self.bounded(async {
            let rows = sqlx::query(concat!(
                "SELECT ",
                subscription_cols!(),
                " FROM subscriptions s WHERE s.state <> 'deleted' ORDER BY s.sub_id"
            ))
            .fetch_all(&self.pool)
            .await
            .map_err(map)?;
            rows.iter()
                .map(|row| rows::subscription(row, &self.keyring))
                .collect()
        })
        .await
    }

    async fn update_subscription(
        &self,
        id: &SubscriptionId,
        patch: SubscriptionPatch,
    ) -> Result<Subscription> {
        self.bounded(async {
            let mut tx = begin(self).await?;
            // Re-enabling (disabled → active) has more to do; the row is
            // locked so the state it is read in is the one replaced.
            let reenabled = if patch.state == Some(SubscriptionState::Active) {
                let state: Option<String> = sqlx::query_scalar(
                    "SELECT state FROM subscriptions WHERE sub_id = $1 FOR NO KEY UPDATE",
                )
                .bind(id.as_uuid())
                .fetch_optional(&mut *tx)
                .await
                .map_err(map)?;
                state.as_deref() == Some("disabled")
            } else {
                false
            };
            let keys = patch.keys.as_ref();
            let (prev, prev_until) =
                keys.and_then(|k| k.previous.as_ref()).map(|(s, t)| (rows::seal(&self.keyring, id, s), *t)).unzip();
            // NULL means "leave as is"; the nullable columns (previous secret,
            // description, rate limit, concurrency cap) take a separate "set
            // it" flag so they can be cleared.
            let row = sqlx::query(concat!(
                "UPDATE subscriptions AS s SET \
                 url = COALESCE($2::text, s.url), \
                 host = COALESCE($3::text, s.host), \
                 event_types = COALESCE($4::jsonb, s.event_types), \
                 secret = COALESCE($5::text, s.secret), \
                 previous_secret = CASE WHEN $5::text IS NULL THEN s.previous_secret ELSE $6::text END, \
                 previous_secret_expires_at = CASE WHEN $5::text IS NULL THEN s.previous_secret_expires_at \
                     ELSE $7::timestamptz END, \
                 ordered = COALESCE($8::boolean, s.ordered), \
                 retry_policy = COALESCE($9::jsonb, s.retry_policy), \
                 state = COALESCE($10::text, s.state), \
                 description = CASE WHEN $11::boolean THEN $12::text ELSE s.description END, \
                 rate_limit = CASE WHEN $13::boolean THEN $14::integer ELSE s.rate_limit END, \
                 max_concurrency = CASE WHEN $15::boolean THEN $16::integer ELSE s.max_concurrency END, \
                 updated_at = now() \
                 WHERE s.sub_id = $1 AND s.state <> 'deleted' RETURNING ",
                subscription_cols!()
            ))
            .bind(id.as_uuid())
            .bind(patch.url.as_ref().map(|u| u.as_str()))
            .bind(patch.url.as_ref().map(|u| u.host()))
            .bind(patch.event_types.as_ref().map(json).transpose()?)
            .bind(keys.map(|k| rows::seal(&self.keyring, id, &k.current)))
            .bind(prev)
            .bind(prev_until)
            .bind(patch.ordered)
            .bind(patch.retry_policy.as_ref().map(json).transpose()?)
            .bind(patch.state.map(|s| s.as_str()))
            .bind(patch.description.is_some())
            .bind(patch.description.flatten())
            .bind(patch.rate_limit.is_some())
            .bind(
                patch
                    .rate_limit
                    .flatten()
                    .map(|n| to_i32("rate_limit", n))
                    .transpose()?,
            )
            .bind(patch.max_concurrency.is_some())
            .bind(
                patch
                    .max_concurrency
                    .flatten()
                    .map(|n| to_i32("max_concurrency", n))
                    .transpose()?,
            )
            .fetch_optional(&mut *tx)
            .await
            .map_err(map)?;
            let sub = rows::subscription(&row.ok_or(StoreError::NotFound)?, &self.keyring)?;
            if reenabled {
                // A later automatic disable is announced again, and its
                // failing period counts from here.
                lower(&mut tx, id, SignalKind::Disabled).await?;
                sqlx::query(
                    "UPDATE subscriptions SET failing_since = NULL \
                     WHERE sub_id = $1 AND failing_since IS NOT NULL",
                )
                .bind(id.as_uuid())
                .execute(&mut *tx)
                .await
                .map_err(map)?;
            }
            bump_generation(&mut tx).await?;
            commit(tx).await?;
            Ok(sub)
        })
        .await
    }

    async fn delete_subscription(&self, id: &SubscriptionId) -> Result<()> {
        self.bounded(async {
            let mut tx = begin(self).await?;
            // FOR UPDATE, stronger than the UPDATE's own lock: it waits for
            // a fan-out batch that holds the row KEY SHARE (and is writing
            // deliveries of it) to commit, so the UPDATE of deliveries below
            // sees that batch's rows; a batch after it sees `deleted`.
            sqlx::query("SELECT 1 FROM subscriptions WHERE sub_id = $1 FOR UPDATE")
                .bind(id.as_uuid())
                .execute(&mut *tx)
                .await
                .map_err(map)?;
            let deleted = sqlx::query(
                "UPDATE subscriptions SET state = 'deleted', updated_at = now() \
                 WHERE sub_id = $1 AND state <> 'deleted'",
            )
            .bind(id.as_uuid())
            .execute(&mut *tx)
            .await
            .map_err(map)?;
            if deleted.rows_affected() == 0 {
                return Err(StoreError::NotFound);
            }
            // In-flight rows too: their worker's result then finds the row no
            // longer in flight (LeaseLost), and no release or reclaim can bring
            // it back to a pending that nothing would ever claim.
            // Found through the queue, which holds exactly the unfinished
            // rows, each re-checked as it is now. The pending ones' queue
            // rows are locked first, as a claim locks them; in-flight ones
            // are taken delivery row first, as a record takes them (see
            // `claim_sql!`), so neither can deadlock with this.
            sqlx::query(
                "SELECT 1 FROM delivery_queue WHERE sub_id = $1 AND state = 'pending' \
                 ORDER BY delivery_id FOR UPDATE",
            )
                .bind(id.as_uuid())
                .execute(&mut *tx)
                .await
                .map_err(map)?;
            sqlx::query(
                "UPDATE deliveries d SET state = 'failed', last_error = $2, updated_at = now(), \
                 lease_expires = NULL, worker_id = NULL \
                 FROM delivery_queue q \
                 WHERE q.sub_id = $1 AND d.delivery_id = q.delivery_id AND d.retain_from = q.retain_from \
                   AND d.state IN ('pending', 'inflight')",
            )
            .bind(id.as_uuid())
            .bind(DELETED)
            .execute(&mut *tx)
            .await
            .map_err(map)?;
            bump_generation(&mut tx).await?;
            commit(tx).await
        })
        .await
    }

    async fn subscription_generation(&self) -> Result<i64> {
        self.bounded(async {
            let row = sqlx::query("SELECT value FROM meta WHERE name = 'subscription_generation'")
                .fetch_one(&self.pool)
                .await
                .map_err(map)?;
            row.try_get("value").map_err(map)
        })
        .await
    }

    async fn reseal_secrets(&self) -> Result<u64> {
        let mut changed = 0;
        let mut after: Option<Uuid> = None;
        loop {
            // One batch per transaction, each under the call deadline. The
            // rows are locked as they are read (NO KEY: deliveries may still
            // be inserted against them), so a secret rotated meanwhile is
            // never overwritten with its old value.
            let (batch_changed, last, full) = self
                .bounded(async {
                    let mut tx = begin(self).await?;
                    let rows: Vec<(Uuid, String, Option<String>)> = sqlx::query_as(
                        "SELECT sub_id, secret, previous_secret FROM subscriptions \
                         WHERE $1::uuid IS NULL OR sub_id > $1 \
                         ORDER BY sub_id LIMIT $2 FOR NO KEY UPDATE",
                    )
                    .bind(after)
                    .bind(RESEAL_BATCH)
                    .fetch_all(&mut *tx)
                    .await
                    .map_err(map)?;
                    let last = rows.last().map(|(id, _, _)| *id);
                    let full = rows.len() == RESEAL_BATCH as usize;
                    let (mut ids, mut secrets, mut previous) = (Vec::new(), Vec::new(), Vec::new());
                    for (uuid, secret, prev) in rows {
                        let id = SubscriptionId::from_uuid(uuid);
                        let corrupt =
                            |column: &str, e| StoreError::Corrupt(format!("{column}: {e}"));
                        let new_secret = self
                            .keyring
                            .reseal(&id, &secret)
                            .map_err(|e| corrupt("secret", e))?;
                        let new_previous = prev
                            .as_deref()
                            .map(|p| self.keyring.reseal(&id, p))
                            .transpose()
                            .map_err(|e| corrupt("previous_secret", e))?
                            .flatten();
                        if new_secret.is_none() && new_previous.is_none() {
                            continue;
                        }
                        ids.push(uuid);
                        secrets.push(new_secret);
                        previous.push(new_previous);
                    }
                    if !ids.is_empty() {
                        sqlx::query(
                            "UPDATE subscriptions AS s SET \
                             secret = COALESCE(n.secret, s.secret), \
                             previous_secret = COALESCE(n.previous_secret, s.previous_secret) \
                             FROM unnest($1::uuid[], $2::text[], $3::text[]) \
                                 AS n(sub_id, secret, previous_secret) \
                             WHERE s.sub_id = n.sub_id",
                        )
                        .bind(&ids)
                        .bind(&secrets)
                        .bind(&previous)
                        .execute(&mut *tx)
                        .await
                        .map_err(map)?;
                    }
                    commit(tx).await?;
                    Ok((ids.len() as u64, last, full))
                })
                .await?;
            changed += batch_changed;
            after = last;
            if !full {
                break;
            }
        }
        Ok(changed)
    }

    // --- ingest ----------------------------------------------------------------

    async fn accept_event(
        &self,
        event: NewEvent,
        deliveries: Vec<NewDelivery>,
    ) -> Result<Accepted> {
        let (event, deliveries) = (&event, &deliveries);
        let accepted = self
            .bounded(with_partitions(self, || async move {
                let mut tx = begin(self).await?;
                let accepted = insert_event(&mut tx, event, deliveries, self.writes()).await?;
                if !accepted.duplicate {
                    commit(tx).await?;
                }
                // A duplicate wrote nothing; the rollback on drop is a no-op.
                Ok(accepted)
            }))
            .await?;
        if !accepted.duplicate {
            self.wrote_deliveries(self.rows_now(deliveries.len()));
        }
        Ok(accepted)
    }

    async fn accept_events(
        &self,
        batch: Vec<(NewEvent, Vec<NewDelivery>)>,
    ) -> Result<Vec<Result<Accepted>>> {
        let results = self.accept_batch(&batch, None, None).await?;
        results
            .map(|(results, _)| results)
            .ok_or_else(|| StoreError::Corrupt("no generation was asked for".into()))
    }

    async fn accept_events_at(
        &self,
        generation: i64,
        batch: Vec<(NewEvent, Vec<NewDelivery>)>,
    ) -> Result<BatchOutcome> {
        Ok(
            match self.accept_batch(&batch, Some(generation), None).await? {
                Some((results, _)) => BatchOutcome::Accepted(results),
                None => BatchOutcome::GenerationMoved(batch),
            },
        )
    }

    async fn accept_events_claiming(
        &self,
        generation: Option<i64>,
        batch: Vec<(NewEvent, Vec<NewDelivery>)>,
        claim: &IngestClaim,
    ) -> Result<(BatchOutcome, Vec<Lease>)> {
        Ok(
            match self.accept_batch(&batch, generation, Some(claim)).await? {
                Some((results, leases)) => (BatchOutcome::Accepted(results), leases),
                None if generation.is_none() => {
                    return Err(StoreError::Corrupt("no generation was asked for".into()));
                }
                None => (BatchOutcome::GenerationMoved(batch), Vec::new()),
            },
        )
    }

    async fn get_event(&self, id: &EventId) -> Result<Event> {
        self.bounded(async {
            let row = sqlx::query(concat!(
                "SELECT ",
                event_cols!(),
                " FROM events e WHERE e.event_id = $1"
            ))
            .bind(id.as_uuid())
            .fetch_optional(&self.pool)
            .await
            .map_err(map)?;
            rows::event(&row.ok_or(StoreError::NotFound)?)
        })
        .await
    }

    async fn materialize_fanout(&self) -> Result<Option<hookd_store::FanoutStep>> {
        let step = crate::fanout::materialize(self).await?;
        if let Some(step) = &step {
            self.wrote_deliveries(step.created as usize);
        }
        Ok(step)
    }

    async fn fanout_backlog(&self) -> Result<hookd_store::FanoutBacklog> {
        crate::fanout::backlog(self).await
    }

    // --- dispatch ------------------------------------------------------------

    async fn due_destinations(&self, limit: u32) -> Result<Vec<DueDestination>> {
        self.bounded(async {
            // One row per active subscription with claimable work, found by
            // index seeks per subscription rather than by grouping every
            // pending row, so the cost follows the number of subscriptions,
            // not the backlog. Unordered subscriptions: their oldest and
            // newest due rows (`delivery_queue_due`), at the oldest one's
            // host. Ordered ones: only the head (smallest unfinished id, the
            // queue's primary key) can be claimable, and only when it is
            // pending and due and nothing of the subscription is in flight —
            // `not_blocked_by_order!`'s rule. Sorted and grouped here.
            let rows = sqlx::query(
                "SELECT f.destination_host AS host, s.sub_id, f.next_attempt_at AS oldest, \
                        n.next_attempt_at AS newest, s.rate_limit, s.max_concurrency, \
                        f.delivery_id AS first_id \
                 FROM subscriptions s \
                 CROSS JOIN LATERAL ( \
                     SELECT d.destination_host, d.next_attempt_at, d.delivery_id FROM delivery_queue d \
                     WHERE d.sub_id = s.sub_id AND d.state = 'pending' AND d.next_attempt_at <= now() \
                     ORDER BY d.next_attempt_at LIMIT 1) f \
                 CROSS JOIN LATERAL ( \
                     SELECT d.next_attempt_at FROM delivery_queue d \
                     WHERE d.sub_id = s.sub_id AND d.state = 'pending' AND d.next_attempt_at <= now() \
                     ORDER BY d.next_attempt_at DESC LIMIT 1) n \
                 WHERE s.state = 'active' AND NOT s.ordered \
                 UNION ALL \
                 SELECT h.destination_host, s.sub_id, h.next_attempt_at, h.next_attempt_at, \
                        s.rate_limit, s.max_concurrency, h.delivery_id \
                 FROM subscriptions s \
                 CROSS JOIN LATERAL ( \
                     SELECT x.destination_host, x.next_attempt_at, x.delivery_id, x.state FROM delivery_queue x \
                     WHERE x.sub_id = s.sub_id \
                     ORDER BY x.delivery_id LIMIT 1) h \
                 WHERE s.state = 'active' AND s.ordered AND h.state = 'pending' \
                   AND h.next_attempt_at <= now() \
                   AND NOT EXISTS (SELECT 1 FROM delivery_queue y WHERE y.sub_id = s.sub_id \
                                   AND y.state = 'inflight')",
            )
            .fetch_all(&self.pool)
            .await
            .map_err(map)?;
            let mut listed = Vec::with_capacity(rows.len());
            for row in &rows {
                let host: String = row.try_get("host").map_err(map)?;
                let first_id: Uuid = row.try_get("first_id").map_err(map)?;
                let sub = DueSubscription {
                    sub_id: SubscriptionId::from_uuid(row.try_get("sub_id").map_err(map)?),
                    oldest_due_at: row.try_get("oldest").map_err(map)?,
                    newest_due_at: row.try_get("newest").map_err(map)?,
                    rate_limit: rows::rate_limit(row.try_get("rate_limit").map_err(map)?)?,
                    max_concurrency: rows::max_concurrency(
                        row.try_get("max_concurrency").map_err(map)?,
                    )?,
                };
                listed.push((host, first_id, sub));
            }
            // Most overdue first; ties go to the oldest delivery's id
            // (UUIDv7: created first), so the order is stable.
            listed.sort_by_key(|l| (l.2.oldest_due_at, l.1));
            Ok(hookd_store::group_due_by_host(
                listed.into_iter().map(|(host, _, sub)| (host, sub)),
                limit,
            ))
        })
        .await
    }

    async fn claim_due(&self, req: &ClaimRequest) -> Result<Vec<ClaimedDelivery>> {
        // Four fixed statements rather than one with `$5 IS NULL OR …`, so
        // the planner sees the subscription filter when there is one and can
        // use `deliveries_due_sub` for it.
        let sql = match (req.subscription.is_some(), req.order) {
            (false, ClaimOrder::OldestFirst) => claim_sql!("", "d.next_attempt_at, d.delivery_id"),
            (false, ClaimOrder::NewestFirst) => {
                claim_sql!("", "d.next_attempt_at DESC, d.delivery_id DESC")
            }
            (true, ClaimOrder::OldestFirst) => {
                claim_sql!("AND d.sub_id = $5", "d.next_attempt_at, d.delivery_id")
            }
            (true, ClaimOrder::NewestFirst) => {
                claim_sql!(
                    "AND d.sub_id = $5",
                    "d.next_attempt_at DESC, d.delivery_id DESC"
                )
            }
        };
        self.bounded(async {
            let mut claim = sqlx::query(sql)
                .bind(&req.destination)
                .bind(i64::from(req.limit))
                .bind(micros(req.lease))
                .bind(&req.worker_id);
            if let Some(sub) = &req.subscription {
                claim = claim.bind(sub.as_uuid());
            }
            let rows = claim.fetch_all(&self.pool).await.map_err(map)?;
            let claimed = rows
                .iter()
                .map(|row| {
                    Ok((
                        rows::delivery(row)?,
                        rows::lease_token(row)?,
                        rows::partition(row)?,
                    ))
                })
                .collect::<Result<Vec<_>>>()?;
            let parts = self.read_back(claimed.iter().map(|(d, _, _)| d)).await?;
            claimed
                .into_iter()
                .map(|(delivery, token, partition)| parts.claimed(delivery, token, Some(partition)))
                .collect()
        })
        .await
    }

    async fn claim_many(&self, reqs: &[ClaimRequest]) -> Result<Vec<Vec<ClaimedDelivery>>> {
        // Requests that could take the same rows (those of one host) go in
        // different rounds, in the order given, so the earlier one gets
        // first pick, as the contract says. Within a round every request
        // has its own host: one statement per (filter, order) claims for
        // all of them, and `SKIP LOCKED` keeps concurrent claimers apart.
        // Typically two rounds of one or two statements per pass, where
        // there was a statement (and a commit) per request.
        let mut rounds: Vec<Vec<usize>> = Vec::new();
        let mut taken: HashMap<&str, usize> = HashMap::new();
        for (i, req) in reqs.iter().enumerate() {
            let round = taken.entry(req.destination.as_str()).or_insert(0);
            if rounds.len() <= *round {
                rounds.push(Vec::new());
            }
            rounds[*round].push(i);
            *round += 1;
        }
        let mut out: Vec<Vec<ClaimedDelivery>> = vec![Vec::new(); reqs.len()];
        for round in rounds {
            // One statement per variant; the variants of a round touch
            // disjoint hosts, so they run at once.
            let mut variants: Vec<((bool, ClaimOrder, Duration, &str), Vec<usize>)> = Vec::new();
            for i in round {
                let r = &reqs[i];
                let key = (
                    r.subscription.is_some(),
                    r.order,
                    r.lease,
                    r.worker_id.as_str(),
                );
                match variants.iter_mut().find(|(k, _)| *k == key) {
                    Some((_, members)) => members.push(i),
                    None => variants.push((key, vec![i])),
                }
            }
            let groups: Vec<Vec<usize>> = variants.into_iter().map(|(_, m)| m).collect();
            let done = futures::future::try_join_all(
                groups
                    .into_iter()
                    .map(|members| self.claim_batch(reqs, members)),
            )
            .await?;
            for (i, claimed) in done.into_iter().flatten() {
                out[i] = claimed;
            }
        }
        Ok(out)
    }

    async fn record_attempt(&self, record: AttemptRecord) -> Result<RecordOutcome> {
        self.bounded(async {
            let a = &record.attempt;
            let id = record.lease.delivery_id.as_uuid();
            let mut tx = begin(self).await?;
            // Subscription row, then delivery row, then the attempt: the order
            // delete_subscription takes them in too, and deliveries before
            // attempts is the order retention locks the two tables in.
            // Its day partition too: the statements below name it, so each
            // reads one partition's index, not every day's (see "Lookups by
            // id" above).
            let mut find = sqlx::query(match record.lease.partition {
                Some(_) => {
                    "SELECT sub_id, retain_from FROM deliveries WHERE delivery_id = $1 AND retain_from = $2"
                }
                None => "SELECT sub_id, retain_from FROM deliveries WHERE delivery_id = $1",
            })
            .bind(id);
            if let Some(day) = record.lease.partition {
                find = find.bind(day);
            }
            let Some(row) = find
                .fetch_optional(&mut *tx)
                .await
                .map_err(map)?
            else {
                // The delivery is gone (its day dropped by retention): there
                // is nothing left to attach the attempt to, nor a newer claim.
                return Ok(RecordOutcome::LeaseLost);
            };
            let sub: Uuid = row.try_get("sub_id").map_err(map)?;
            let retain_from: Timestamp = row.try_get("retain_from").map_err(map)?;
            // The failing streak follows every attempt, recorded or not, and
            // writes the subscription row only when it changes.
            let streak = if matches!(record.next, NextState::Delivered) {
                sqlx::query(
                    "UPDATE subscriptions SET failing_since = NULL \
                     WHERE sub_id = $1 AND failing_since IS NOT NULL",
                )
                .bind(sub)
            } else {
                sqlx::query(
                    "UPDATE subscriptions SET failing_since = $2 \
                     WHERE sub_id = $1 AND failing_since IS NULL",
                )
                .bind(sub)
                .bind(a.started_at)
            };
            streak.execute(&mut *tx).await.map_err(map)?;
            let (state, outcome, delay) = match &record.next {
                NextState::Delivered => ("delivered", "delivered", None),
                NextState::Retry { delay } => ("pending", "retry", Some(micros(*delay))),
                NextState::Failed => ("failed", "failed", None),
                NextState::Dead => ("dead", "dead", None),
            };
            let moved = sqlx::query(
                "UPDATE deliveries SET attempt = attempt + 1, state = $3, last_status = $4, last_error = $5, \
                 next_attempt_at = CASE WHEN $6::bigint IS NULL THEN next_attempt_at \
                     ELSE now() + $6::bigint * interval '1 microsecond' END, \
                 lease_expires = NULL, worker_id = NULL, updated_at = now() \
                 WHERE delivery_id = $1 AND retain_from = $7 AND state = 'inflight' \
                     AND lease_token = $2",
            )
            .bind(id)
            .bind(record.lease.token)
            .bind(state)
            .bind(a.status.map(i32::from))
            .bind(record.last_error.as_deref())
            .bind(delay)
            .bind(retain_from)
            .execute(&mut *tx)
            .await
            .map_err(map)?
            .rows_affected()
                == 1;
            // The attempt happened whatever became of the lease, so it is
            // always written, in its delivery's partition, with the outcome
            // it caused (none when the lease was lost).
            sqlx::query(
                "INSERT INTO attempts (delivery_id, number, started_at, duration_ms, status, error_class, \
                 response_snippet, outcome, retain_from) \
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)",
            )
            .bind(id)
            .bind(to_i32("attempt number", a.number)?)
            .bind(a.started_at)
            .bind(i64::try_from(a.duration.as_millis()).unwrap_or(i64::MAX))
            .bind(a.status.map(i32::from))
            .bind(a.error_class.map(|c| c.as_str()))
            .bind(a.response_snippet.as_deref())
            .bind(moved.then_some(outcome))
            .bind(retain_from)
            .execute(&mut *tx)
            .await
            .map_err(map)?;
            commit(tx).await?;
            Ok(if moved { RecordOutcome::Recorded } else { RecordOutcome::LeaseLost })
        })
        .await
    }

    async fn record_attempts(&self, records: Vec<AttemptRecord>) -> Result<Vec<RecordOutcome>> {
        if records.is_empty() {
            return Ok(Vec::new());
        }
        self.bounded(async {
            let n = records.len();
            let mut tx = begin(self).await?;
            // Each delivery's day partition, which the statement below names
            // so that each of its lookups reads one partition's index, not
            // every day's (see "Lookups by id" above). A lease of this
            // store's claims names it (an in-flight row never changes day:
            // retention carries only pending rows forward); any other lease's
            // day is read by id. A delivery that is gone (its day dropped)
            // moves nothing and gets no attempt row: its record gets
            // LeaseLost (and, read by id, found no day, counts for no
            // streak either).
            let mut retains: Vec<Option<Timestamp>> =
                records.iter().map(|r| r.lease.partition).collect();
            let unknown: Vec<Uuid> = records
                .iter()
                .filter(|r| r.lease.partition.is_none())
                .map(|r| *r.lease.delivery_id.as_uuid())
                .collect();
            if !unknown.is_empty() {
                let found: HashMap<Uuid, Timestamp> = sqlx::query_as(
                    "SELECT delivery_id, retain_from FROM deliveries WHERE delivery_id = ANY($1)",
                )
                .bind(&unknown)
                .fetch_all(&mut *tx)
                .await
                .map_err(map)?
                .into_iter()
                .collect();
                for (r, day) in records.iter().zip(&mut retains) {
                    if day.is_none() {
                        *day = found.get(r.lease.delivery_id.as_uuid()).copied();
                    }
                }
            }
            // The same lock order as record_attempt: subscription rows (only
            // those whose streak changes), then deliveries, then attempts.
            // One statement for all streaks, each folded over the batch in
            // record order, the subscription taken from the lease (it never
            // changes), so no delivery row is read for it; subscriptions
            // sorted, so two batches lock them in one order. Every attempt
            // made counts, whatever became of its lease (as record_attempt).
            let mut streaks: HashMap<Uuid, StreakChange> = HashMap::new();
            for (r, day) in records.iter().zip(&retains) {
                if day.is_none() {
                    continue;
                }
                let sub = *r.lease.subscription.as_uuid();
                let delivered = matches!(r.next, NextState::Delivered);
                let prev = streaks.get(&sub).copied();
                streaks.insert(sub, StreakChange::then(prev, delivered, r.attempt.started_at));
            }
            let mut streaks: Vec<(Uuid, StreakChange)> = streaks.into_iter().collect();
            streaks.sort_by_key(|(sub, _)| *sub);
            if !streaks.is_empty() {
                let (mut sub_ids, mut kinds, mut times) = (Vec::new(), Vec::new(), Vec::new());
                for (sub, change) in &streaks {
                    let (kind, t) = match *change {
                        StreakChange::StartUnlessBegun(t) => ("start", t),
                        // The time is not used.
                        StreakChange::End => ("end", chrono::DateTime::UNIX_EPOCH),
                        StreakChange::Restart(t) => ("restart", t),
                    };
                    sub_ids.push(*sub);
                    kinds.push(kind);
                    times.push(t);
                }
                sqlx::query(
                    "UPDATE subscriptions s SET failing_since = CASE u.kind WHEN 'end' THEN NULL \
                         WHEN 'restart' THEN u.t ELSE COALESCE(s.failing_since, u.t) END \
                     FROM unnest($1::uuid[], $2::text[], $3::timestamptz[]) AS u(sub_id, kind, t) \
                     WHERE s.sub_id = u.sub_id AND s.failing_since IS DISTINCT FROM \
                         (CASE u.kind WHEN 'end' THEN NULL WHEN 'restart' THEN u.t \
                          ELSE COALESCE(s.failing_since, u.t) END)",
                )
                .bind(&sub_ids)
                .bind(&kinds)
                .bind(&times)
                .execute(&mut *tx)
                .await
                .map_err(map)?;
            }
            // Every delivery and every attempt in one statement. Each
            // delivery moves if its lease still holds, fenced by its own
            // token, and only by the first record of a lease in the batch
            // (as recording them one by one would); `moved` returns which
            // records moved theirs. Each attempt is written in its
            // delivery's partition, in record order, with the outcome it
            // caused (none when its lease was lost); the attempt of a lost
            // lease only if its delivery is still there.
            let mut ids = Vec::with_capacity(n);
            let mut tokens = Vec::with_capacity(n);
            let mut states = Vec::with_capacity(n);
            let mut statuses = Vec::with_capacity(n);
            let mut errors = Vec::with_capacity(n);
            let mut delays = Vec::with_capacity(n);
            let mut numbers = Vec::with_capacity(n);
            let mut started = Vec::with_capacity(n);
            let mut durations = Vec::with_capacity(n);
            let mut classes = Vec::with_capacity(n);
            let mut snippets = Vec::with_capacity(n);
            let mut causes = Vec::with_capacity(n);
            let firsts = AttemptRecord::firsts_of_their_lease(&records);
            for r in &records {
                let (state, cause, delay) = match &r.next {
                    NextState::Delivered => ("delivered", "delivered", None),
                    NextState::Retry { delay } => ("pending", "retry", Some(micros(*delay))),
                    NextState::Failed => ("failed", "failed", None),
                    NextState::Dead => ("dead", "dead", None),
                };
                let a = &r.attempt;
                ids.push(*r.lease.delivery_id.as_uuid());
                tokens.push(r.lease.token);
                states.push(state);
                statuses.push(a.status.map(i32::from));
                errors.push(r.last_error.as_deref());
                delays.push(delay);
                numbers.push(to_i32("attempt number", a.number)?);
                started.push(a.started_at);
                durations.push(i64::try_from(a.duration.as_millis()).unwrap_or(i64::MAX));
                classes.push(a.error_class.map(|c| c.as_str()));
                snippets.push(a.response_snippet.as_deref());
                causes.push(cause);
            }
            let moved: Vec<(i64,)> = sqlx::query_as(
                "WITH v AS MATERIALIZED ( \
                     SELECT * FROM unnest($1::uuid[], $2::bigint[], $3::boolean[], $4::text[], \
                         $5::integer[], $6::text[], $7::bigint[], $8::timestamptz[], $9::integer[], \
                         $10::timestamptz[], $11::bigint[], $12::text[], $13::text[], $14::text[]) \
                         WITH ORDINALITY AS v(delivery_id, token, first, state, status, last_error, \
                         delay, retain_from, number, started_at, duration_ms, error_class, snippet, \
                         cause, ord) \
                     WHERE retain_from IS NOT NULL), \
                 moved AS ( \
                     UPDATE deliveries d SET attempt = d.attempt + 1, state = v.state, \
                         last_status = v.status, last_error = v.last_error, \
                         next_attempt_at = CASE WHEN v.delay IS NULL THEN d.next_attempt_at \
                             ELSE now() + v.delay * interval '1 microsecond' END, \
                         lease_expires = NULL, worker_id = NULL, updated_at = now() \
                     FROM v \
                     WHERE v.first AND d.delivery_id = v.delivery_id AND d.retain_from = v.retain_from \
                         AND d.state = 'inflight' AND d.lease_token = v.token \
                     RETURNING v.ord), \
                 written AS ( \
                     INSERT INTO attempts (delivery_id, number, started_at, duration_ms, status, \
                         error_class, response_snippet, outcome, retain_from) \
                     SELECT v.delivery_id, v.number, v.started_at, v.duration_ms, v.status, \
                         v.error_class, v.snippet, CASE WHEN m.ord IS NULL THEN NULL ELSE v.cause END, \
                         v.retain_from \
                     FROM v LEFT JOIN moved m ON m.ord = v.ord \
                     WHERE m.ord IS NOT NULL OR EXISTS (SELECT 1 FROM deliveries d \
                         WHERE d.delivery_id = v.delivery_id AND d.retain_from = v.retain_from) \
                     ORDER BY v.ord) \
                 SELECT ord FROM moved",
            )
            .bind(&ids)
            .bind(&tokens)
            .bind(&firsts)
            .bind(&states)
            .bind(&statuses)
            .bind(&errors)
            .bind(&delays)
            .bind(&retains)
            .bind(&numbers)
            .bind(&started)
            .bind(&durations)
            .bind(&classes)
            .bind(&snippets)
            .bind(&causes)
            .fetch_all(&mut *tx)
            .await
            .map_err(map)?;
            let mut outcomes = vec![RecordOutcome::LeaseLost; n];
            for (ord,) in moved {
                // ORDINALITY counts from 1.
                if let Some(o) = usize::try_from(ord - 1).ok().and_then(|i| outcomes.get_mut(i)) {
                    *o = RecordOutcome::Recorded;
                }
            }
            commit(tx).await?;
            Ok(outcomes)
        })
        .await
    }

    async fn renew_lease(&self, lease: &Lease, lease_for: Duration) -> Result<bool> {
        self.bounded(async {
            // With the lease's day the statement reads that partition alone.
            let mut renew = sqlx::query(match lease.partition {
                Some(_) => {
                    "UPDATE deliveries SET lease_expires = now() + $3 * interval '1 microsecond', updated_at = now() \
                     WHERE delivery_id = $1 AND retain_from = $4 AND state = 'inflight' \
                         AND lease_token = $2"
                }
                None => {
                    "UPDATE deliveries SET lease_expires = now() + $3 * interval '1 microsecond', updated_at = now() \
                     WHERE delivery_id = $1 AND state = 'inflight' AND lease_token = $2"
                }
            })
            .bind(lease.delivery_id.as_uuid())
            .bind(lease.token)
            .bind(micros(lease_for));
            if let Some(day) = lease.partition {
                renew = renew.bind(day);
            }
            let res = renew
                .execute(&self.pool)
            .await
            .map_err(map)?;
            Ok(res.rows_affected() == 1)
        })
        .await
    }

    async fn release(&self, leases: &[Lease]) -> Result<u64> {
        if leases.is_empty() {
            return Ok(0);
        }
        self.bounded(async {
            // The token stays: the next claim bumps it, which is what fences
            // out the releasing worker.
            let res = sqlx::query(
                "UPDATE deliveries d SET state = 'pending', lease_expires = NULL, worker_id = NULL, \
                 updated_at = now() \
                 FROM unnest($1::uuid[], $2::bigint[]) AS l(delivery_id, token) \
                 WHERE d.delivery_id = l.delivery_id AND d.lease_token = l.token AND d.state = 'inflight'",
            )
            .bind(uuids(leases, |l| *l.delivery_id.as_uuid()))
            .bind(leases.iter().map(|l| l.token).collect::<Vec<i64>>())
            .execute(&self.pool)
            .await
            .map_err(map)?;
            Ok(res.rows_affected())
        })
        .await
    }

    async fn reclaim_expired(&self) -> Result<u64> {
        self.bounded(async {
            // Expired leases by `delivery_queue_lease`; each row re-checked
            // as it is now.
            let res = sqlx::query(
                "UPDATE deliveries d SET state = 'pending', lease_expires = NULL, worker_id = NULL, \
                 updated_at = now() FROM delivery_queue q \
                 WHERE q.state = 'inflight' AND q.lease_expires <= now() \
                   AND d.delivery_id = q.delivery_id AND d.retain_from = q.retain_from \
                   AND d.state = 'inflight' AND d.lease_expires <= now()",
            )
            .execute(&self.pool)
            .await
            .map_err(map)?;
            Ok(res.rows_affected())
        })
        .await
    }

    async fn replay_delivery(&self, id: &DeliveryId) -> Result<Delivery> {
        self.bounded(async {
            let mut tx = begin(self).await?;
            // The delivery row is locked so no claim or result lands between
            // the check and the update. The subscription row is share-locked
            // so a concurrent delete either commits first (and is seen here)
            // or waits for the replay (and then fails the replayed row as it
            // fails every pending one): a replay never leaves a pending
            // delivery of a deleted subscription behind.
            let row = sqlx::query(
                "SELECT d.state, s.state AS sub_state FROM deliveries d \
                 JOIN subscriptions s ON s.sub_id = d.sub_id \
                 WHERE d.delivery_id = $1 FOR UPDATE OF d FOR SHARE OF s",
            )
            .bind(id.as_uuid())
            .fetch_optional(&mut *tx)
            .await
            .map_err(map)?
            .ok_or(StoreError::NotFound)?;
            let state: String = row.try_get("state").map_err(map)?;
            let sub_state: String = row.try_get("sub_state").map_err(map)?;
            if sub_state == "deleted" {
                // Nothing claims deliveries of a deleted subscription.
                return Err(StoreError::Conflict(DELETED.to_owned()));
            }
            // Only finished deliveries move; one already queued or in flight
            // is returned as it is (and its lease with it).
            let row = if matches!(state.as_str(), "pending" | "inflight") {
                sqlx::query(concat!("SELECT ", delivery_cols!(), " FROM deliveries d WHERE d.delivery_id = $1"))
                    .bind(id.as_uuid())
                    .fetch_one(&mut *tx)
                    .await
                    .map_err(map)?
            } else {
                sqlx::query(concat!(
                    "UPDATE deliveries d SET state = 'pending', next_attempt_at = now(), window_start = now(), \
                     lease_expires = NULL, worker_id = NULL, updated_at = now() \
                     WHERE d.delivery_id = $1 RETURNING ",
                    delivery_cols!()
                ))
                .bind(id.as_uuid())
                .fetch_one(&mut *tx)
                .await
                .map_err(map)?
            };
            let delivery = rows::delivery(&row)?;
            commit(tx).await?;
            Ok(delivery)
        })
        .await
    }

    // --- reading -------------------------------------------------------------

    async fn get_delivery(&self, id: &DeliveryId) -> Result<DeliveryDetail> {
        self.bounded(async {
            let mut tx = begin_snapshot(self).await?;
            let row = sqlx::query(concat!(
                "SELECT ",
                delivery_cols!(),
                " FROM deliveries d WHERE d.delivery_id = $1"
            ))
            .bind(id.as_uuid())
            .fetch_optional(&mut *tx)
            .await
            .map_err(map)?
            .ok_or(StoreError::NotFound)?;
            let attempts = attempts_of(&mut *tx, &[*id.as_uuid()]).await?;
            commit(tx).await?;
            details(std::slice::from_ref(&row), attempts)?
                .pop()
                .ok_or(StoreError::NotFound)
        })
        .await
    }

    async fn list_deliveries(&self, query: &DeliveryQuery) -> Result<Vec<DeliveryDetail>> {
        self.bounded(async {
            let mut tx = begin_snapshot(self).await?;
            let rows = sqlx::query(concat!(
                "SELECT ",
                delivery_cols!(),
                " FROM deliveries d WHERE ($1::uuid IS NULL OR d.sub_id = $1) \
                 AND ($2::uuid IS NULL OR d.event_id = $2) \
                 AND ($3::text IS NULL OR d.state = $3) \
                 AND ($4::timestamptz IS NULL OR d.created_at >= $4) \
                 AND ($5::timestamptz IS NULL OR d.created_at < $5) \
                 AND ($6::text IS NULL OR d.event_type = $6) \
                 AND ($7::uuid IS NULL OR d.delivery_id < $7) \
                 ORDER BY d.delivery_id DESC LIMIT $8"
            ))
            .bind(query.sub_id.as_ref().map(SubscriptionId::as_uuid))
            .bind(query.event_id.as_ref().map(EventId::as_uuid))
            .bind(query.state.map(|s| s.as_str()))
            .bind(query.since)
            .bind(query.until)
            .bind(query.event_type.as_ref().map(|t| t.as_str()))
            .bind(query.cursor.as_ref().map(DeliveryId::as_uuid))
            .bind(i64::from(query.limit))
            .fetch_all(&mut *tx)
            .await
            .map_err(map)?;
            let ids: Vec<Uuid> = rows
                .iter()
                .map(|r| r.try_get::<Uuid, _>("d_delivery_id").map_err(map))
                .collect::<Result<_>>()?;
            let attempts = attempts_of(&mut *tx, &ids).await?;
            commit(tx).await?;
            details(&rows, attempts)
        })
        .await
    }

    // --- tokens ----------------------------------------------------------------

    async fn subscription_health(
        &self,
        sub_id: &SubscriptionId,
        since: Timestamp,
    ) -> Result<SubscriptionHealth> {
        self.bounded(async {
            let sub = *sub_id.as_uuid();
            // One snapshot, so the counts agree with each other.
            let mut tx = begin_snapshot(self).await?;
            sqlx::query("SELECT 1 FROM subscriptions WHERE sub_id = $1 AND state <> 'deleted'")
                .bind(sub)
                .fetch_optional(&mut *tx)
                .await
                .map_err(map)?
                .ok_or(StoreError::NotFound)?;
            // Unfinished rows: the subscription's slice of `delivery_queue`.
            // Dead rows: the subscription's slice of `deliveries_sub`.
            let counts = sqlx::query(
                "SELECT \
                   (SELECT count(*) FROM delivery_queue WHERE sub_id = $1) AS pending, \
                   (SELECT min(d.created_at) FROM delivery_queue q JOIN deliveries d \
                       ON d.delivery_id = q.delivery_id AND d.retain_from = q.retain_from \
                     WHERE q.sub_id = $1) AS oldest_pending, \
                   (SELECT count(*) FROM deliveries \
                     WHERE sub_id = $1 AND state = 'dead') AS dead, \
                   (SELECT min(updated_at) FROM deliveries \
                     WHERE sub_id = $1 AND state = 'dead') AS oldest_dead",
            )
            .bind(sub)
            .fetch_one(&mut *tx)
            .await
            .map_err(map)?;
            // The subscription's deliveries by `deliveries_sub`, each one's
            // attempts by `attempts_delivery`.
            let rows = sqlx::query(
                "SELECT a.status, a.error_class, count(*) AS n FROM deliveries d \
                 JOIN attempts a ON a.delivery_id = d.delivery_id \
                 WHERE d.sub_id = $1 AND a.started_at >= $2 \
                 GROUP BY a.status, a.error_class \
                 ORDER BY a.status IS NULL, a.status, a.error_class",
            )
            .bind(sub)
            .bind(since)
            .fetch_all(&mut *tx)
            .await
            .map_err(map)?;
            let signals = sqlx::query(
                "SELECT sub_id, kind, detail, raised_at FROM subscription_signals WHERE sub_id = $1",
            )
            .bind(sub)
            .fetch_all(&mut *tx)
            .await
            .map_err(map)?;
            commit(tx).await?;
            let mut signals = signals.iter().map(rows::raised_signal).collect::<Result<Vec<_>>>()?;
            signals.sort_by_key(|s| s.kind);
            rows::subscription_health(&counts, &rows, signals)
        })
        .await
    }

    // --- bulk replay jobs ------------------------------------------------------

    async fn create_replay_job(&self, new: NewReplayJob) -> Result<ReplayJob> {
        self.bounded(jobs::create(self, new)).await
    }

    async fn get_replay_job(&self, id: &JobId) -> Result<ReplayJob> {
        self.bounded(async {
            let row = sqlx::query(concat!(
                "SELECT ",
                job_cols!(),
                " FROM replay_jobs j WHERE j.job_id = $1"
            ))
            .bind(id.as_uuid())
            .fetch_optional(&self.pool)
            .await
            .map_err(map)?;
            rows::replay_job(&row.ok_or(StoreError::NotFound)?)
        })
        .await
    }

    async fn cancel_replay_job(&self, id: &JobId) -> Result<ReplayJob> {
        self.bounded(async {
            // Waits for a step in progress (which holds the row), so a
            // cancelled job's counts never move afterwards.
            let row = sqlx::query(concat!(
                "WITH c AS (UPDATE replay_jobs SET state = 'cancelled', finished_at = now() \
                 WHERE job_id = $1 AND state = 'running' RETURNING *) \
                 SELECT ",
                job_cols!(),
                " FROM c j \
                 UNION ALL SELECT ",
                job_cols!(),
                " FROM replay_jobs j \
                 WHERE j.job_id = $1 AND NOT EXISTS (SELECT 1 FROM c)"
            ))
            .bind(id.as_uuid())
            .fetch_optional(&self.pool)
            .await
            .map_err(map)?;
            rows::replay_job(&row.ok_or(StoreError::NotFound)?)
        })
        .await
    }

    async fn running_replay_jobs(&self, limit: u32) -> Result<Vec<ReplayJob>> {
        self.bounded(async {
            let rows = sqlx::query(concat!(
                "SELECT ",
                job_cols!(),
                " FROM replay_jobs j WHERE j.state = 'running' \
                 ORDER BY j.created_at, j.job_id LIMIT $1"
            ))
            .bind(i64::from(limit))
            .fetch_all(&self.pool)
            .await
            .map_err(map)?;
            rows.iter().map(rows::replay_job).collect()
        })
        .await
    }

    async fn step_replay_job(&self, id: &JobId, window: u32) -> Result<JobStep> {
        self.bounded(jobs::step(self, id, window)).await
    }

    // --- signals -----------------------------------------------------------------

    async fn raise_signal(
        &self,
        sub_id: &SubscriptionId,
        kind: SignalKind,
        detail: &str,
        notice: Option<Notice>,
    ) -> Result<bool> {
        let notice = &notice;
        self.bounded(with_partitions(self, || async move {
            let mut tx = begin(self).await?;
            // The subscription row is the compare-and-set's lock: of
            // concurrent raises, the first to take it raises, the others wait
            // and then find the signal raised (each statement reads anew).
            // NO KEY UPDATE, not UPDATE: ingest's foreign-key checks (KEY
            // SHARE) on the row go on, and two raises whose notices fan out
            // to each other's subscription cannot deadlock.
            let row = sqlx::query(
                "SELECT state FROM subscriptions WHERE sub_id = $1 AND state <> 'deleted' \
                 FOR NO KEY UPDATE",
            )
            .bind(sub_id.as_uuid())
            .fetch_optional(&mut *tx)
            .await
            .map_err(map)?
            .ok_or(StoreError::NotFound)?;
            let state: String = row.try_get("state").map_err(map)?;
            let raised = sqlx::query(
                "INSERT INTO subscription_signals AS g (sub_id, kind, detail, raised_at) \
                 VALUES ($1, $2, $3, now()) \
                 ON CONFLICT (sub_id, kind) DO UPDATE SET detail = EXCLUDED.detail, raised_at = now() \
                 WHERE g.detail IS DISTINCT FROM EXCLUDED.detail RETURNING 1",
            )
            .bind(sub_id.as_uuid())
            .bind(kind.as_str())
            .bind(detail)
            .fetch_optional(&mut *tx)
            .await
            .map_err(map)?
            .is_some();
            if !raised {
                return Ok(false);
            }
            if let Some(notice) = &notice {
                insert_event(&mut tx, &notice.event, &notice.deliveries, self.writes()).await?;
            }
            if kind == SignalKind::Disabled && state == "active" {
                sqlx::query("UPDATE subscriptions SET state = 'disabled', updated_at = now() WHERE sub_id = $1")
                    .bind(sub_id.as_uuid())
                    .execute(&mut *tx)
                    .await
                    .map_err(map)?;
                bump_generation(&mut tx).await?;
            }
            commit(tx).await?;
            Ok(true)
        }))
        .await
    }

    async fn lower_signal(&self, sub_id: &SubscriptionId, kind: SignalKind) -> Result<bool> {
        self.bounded(async {
            let mut tx = begin(self).await?;
            let lowered = lower(&mut tx, sub_id, kind).await?;
            commit(tx).await?;
            Ok(lowered)
        })
        .await
    }

    async fn raised_signals(&self, kind: Option<SignalKind>) -> Result<Vec<RaisedSignal>> {
        self.bounded(async {
            let rows = sqlx::query(
                "SELECT g.sub_id, g.kind, g.detail, g.raised_at FROM subscription_signals g \
                 JOIN subscriptions s ON s.sub_id = g.sub_id \
                 WHERE s.state <> 'deleted' AND ($1::text IS NULL OR g.kind = $1) ORDER BY g.sub_id",
            )
            .bind(kind.map(SignalKind::as_str))
            .fetch_all(&self.pool)
            .await
            .map_err(map)?;
            let mut signals = rows.iter().map(rows::raised_signal).collect::<Result<Vec<_>>>()?;
            // The kinds' own order (the enum's), not their names'.
            signals.sort_by(|a, b| a.sub_id.as_uuid().cmp(b.sub_id.as_uuid()).then(a.kind.cmp(&b.kind)));
            Ok(signals)
        })
        .await
    }

    async fn backlogs(&self) -> Result<Vec<Backlog>> {
        self.bounded(async {
            // `delivery_queue` holds exactly these rows.
            let rows = sqlx::query(
                "SELECT d.sub_id, count(*) AS n FROM delivery_queue d \
                 JOIN subscriptions s ON s.sub_id = d.sub_id \
                 WHERE s.state <> 'deleted' \
                 GROUP BY d.sub_id ORDER BY d.sub_id",
            )
            .fetch_all(&self.pool)
            .await
            .map_err(map)?;
            rows.iter()
                .map(|row| {
                    let n: i64 = row.try_get("n").map_err(map)?;
                    Ok(Backlog {
                        sub_id: SubscriptionId::from_uuid(row.try_get("sub_id").map_err(map)?),
                        unfinished: u64::try_from(n).unwrap_or(0),
                    })
                })
                .collect()
        })
        .await
    }

    async fn failing_subscriptions(
        &self,
        started_at_or_before: Timestamp,
    ) -> Result<Vec<SubscriptionId>> {
        self.bounded(async {
            let rows = sqlx::query(
                "SELECT sub_id FROM subscriptions WHERE state = 'active' \
                 AND failing_since IS NOT NULL AND failing_since <= $1 ORDER BY sub_id",
            )
            .bind(started_at_or_before)
            .fetch_all(&self.pool)
            .await
            .map_err(map)?;
            rows.iter()
                .map(|row| {
                    Ok(SubscriptionId::from_uuid(
                        row.try_get("sub_id").map_err(map)?,
                    ))
                })
                .collect()
        })
        .await
    }

    // --- retention and the rollup ---------------------------------------------------

    async fn enforce_retention(&self, policy: &RetentionPolicy) -> Result<RetentionReport> {
        // Not one deadline for the whole pass: each of its transactions is
        // bounded on its own, since a pass may drop several days.
        retention::enforce(self, policy).await
    }

    async fn daily_stats(
        &self,
        sub_id: &SubscriptionId,
        since_day: NaiveDate,
    ) -> Result<Vec<DailyStats>> {
        self.bounded(retention::daily_stats(self, sub_id, since_day))
            .await
    }

    async fn create_token(&self, token: NewToken) -> Result<()> {
        self.bounded(async {
            sqlx::query(
                "INSERT INTO tokens (token_hash, customer_id, label, expires_at) VALUES ($1, $2, $3, $4)",
            )
            .bind(&token.token_hash)
            .bind(token.customer_id.as_ref().map(CustomerId::as_str))
            .bind(token.label.as_deref())
            .bind(token.expires_at)
                .execute(&self.pool)
                .await
                .map_err(map)?;
            Ok(())
        })
        .await
    }

    async fn find_token(&self, token_hash: &[u8]) -> Result<Option<hookd_store::FoundToken>> {
        self.bounded(async {
            let row = sqlx::query(
                "SELECT customer_id, expires_at FROM tokens \
                 WHERE token_hash = $1 AND (expires_at IS NULL OR expires_at > now())",
            )
            .bind(token_hash)
            .fetch_optional(&self.pool)
            .await
            .map_err(map)?;
            let Some(row) = row else { return Ok(None) };
            let customer: Option<String> = row.try_get("customer_id").map_err(map)?;
            let expires_at: Option<Timestamp> = row.try_get("expires_at").map_err(map)?;
            let scope = match customer {
                None => TokenScope::Admin,
                Some(c) => TokenScope::Customer(
                    CustomerId::parse(&c)
                        .map_err(|e| StoreError::Corrupt(format!("token customer_id: {e}")))?,
                ),
            };
            Ok(Some(hookd_store::FoundToken { scope, expires_at }))
        })
        .await
    }

    async fn has_admin_token(&self) -> Result<bool> {
        self.bounded(async {
            let row = sqlx::query(
                "SELECT EXISTS (SELECT 1 FROM tokens WHERE customer_id IS NULL) AS found",
            )
            .fetch_one(&self.pool)
            .await
            .map_err(map)?;
            row.try_get("found").map_err(map)
        })
        .await
    }

    async fn heartbeat(
        &self,
        node: &hookd_store::NodeHeartbeat,
        live_within: Duration,
    ) -> Result<u32> {
        self.bounded(crate::nodes::heartbeat(self, node, live_within))
            .await
    }

    async fn forget_node(&self, node_id: &str) -> Result<bool> {
        self.bounded(crate::nodes::forget(self, node_id)).await
    }

    async fn nodes(&self) -> Result<Vec<hookd_store::NodeInfo>> {
        self.bounded(crate::nodes::list(self)).await
    }
}
