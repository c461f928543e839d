//! Lazy fan-out: an event over the threshold is written with a fan-out job
//! (`write_job`, inside ingest's transaction), whose deliveries
//! `materialize` writes one batch per write transaction.

use std::collections::{HashMap, HashSet};

use hookd_domain::EventId;
use hookd_store::fanout::{decode_batch, encode_batch};
use hookd_store::{FanoutBacklog, FanoutStep, LazyFanout, NewDelivery, NewEvent, Result};
use sqlx::{QueryBuilder, Sqlite, SqliteConnection};
use uuid::Uuid;

use crate::codec::now_ms;
use crate::error::{corrupt, from_sqlx};
use crate::ingest::insert_deliveries;
use crate::subscriptions::DELETED;
use crate::{SqliteStore, keep_prepared};

/// Subscription ids per `IN (…)` lookup: one bound value each.
const IDS_PER_LOOKUP: usize = 1000;

/// Delivery rows per INSERT of a batch: 13 bound values each, far below
/// SQLite's 32,766.
const ROWS_PER_INSERT: usize = 500;

/// What a fan-out needs to know of a subscription.
struct SubFlags {
    ordered: bool,
    deleted: bool,
}

/// The flags of `deliveries`' subscriptions that exist, by id.
async fn flags_of(
    conn: &mut SqliteConnection,
    deliveries: &[NewDelivery],
) -> Result<HashMap<Uuid, SubFlags>> {
    let mut flags = HashMap::with_capacity(deliveries.len());
    for chunk in deliveries.chunks(IDS_PER_LOOKUP) {
        let mut q = QueryBuilder::<Sqlite>::new(
            "SELECT sub_id, ordered, state = 'deleted' FROM subscriptions WHERE sub_id IN (",
        );
        let mut list = q.separated(", ");
        for d in chunk {
            list.push_bind(*d.sub_id.as_uuid());
        }
        q.push(")");
        let rows: Vec<(Uuid, bool, bool)> = q
            .build_query_as()
            .persistent(keep_prepared(chunk.len(), IDS_PER_LOOKUP))
            .fetch_all(&mut *conn)
            .await
            .map_err(from_sqlx)?;
        flags.extend(
            rows.into_iter()
                .map(|(id, ordered, deleted)| (id, SubFlags { ordered, deleted })),
        );
    }
    Ok(flags)
}

/// What writing `deliveries` at once would refuse: a subscription not in
/// `known`, or one named twice.
fn check_planned(deliveries: &[NewDelivery], known: &HashMap<Uuid, SubFlags>) -> Result<()> {
    let mut seen = HashSet::with_capacity(deliveries.len());
    for d in deliveries {
        if !known.contains_key(d.sub_id.as_uuid()) {
            return Err(hookd_store::StoreError::Conflict(format!(
                "a delivery names {}, which does not exist",
                d.sub_id
            )));
        }
        if !seen.insert(d.sub_id) {
            return Err(hookd_store::StoreError::Conflict(format!(
                "two deliveries of one event name {}",
                d.sub_id
            )));
        }
    }
    Ok(())
}

/// Writes `event`'s deliveries as a fan-out job, inside the caller's write
/// transaction (the event row is written already): the deliveries of
/// ordered subscriptions at once (a later event's delivery must not
/// overtake them), the rest as batches of `fanout.batch`, in the order
/// given. An error leaves partial writes: the caller must roll back.
pub(crate) async fn write_job(
    conn: &mut SqliteConnection,
    now: i64,
    event: &NewEvent,
    deliveries: &[NewDelivery],
    fanout: LazyFanout,
) -> Result<()> {
    // Refused, as writing the rows would be: a job must never hold a
    // delivery it cannot write.
    let flags = flags_of(conn, deliveries).await?;
    check_planned(deliveries, &flags)?;
    let (now_rows, planned): (Vec<&NewDelivery>, Vec<&NewDelivery>) = deliveries
        .iter()
        .partition(|d| flags.get(d.sub_id.as_uuid()).is_some_and(|f| f.ordered));
    let rows: Vec<_> = now_rows.into_iter().map(|d| (event, d)).collect();
    insert_deliveries(conn, now, &rows).await?;
    if planned.is_empty() {
        return Ok(());
    }
    let planned: Vec<NewDelivery> = planned.into_iter().cloned().collect();
    let batches: Vec<&[NewDelivery]> = planned.chunks(fanout.batch_size()).collect();
    sqlx::query(
        "INSERT INTO fanout_jobs (event_id, total, batches, created_at) VALUES (?, ?, ?, ?)",
    )
    .bind(event.id.as_uuid())
    .bind(i64::try_from(planned.len()).unwrap_or(i64::MAX))
    .bind(i64::try_from(batches.len()).unwrap_or(i64::MAX))
    .bind(now)
    .execute(&mut *conn)
    .await
    .map_err(from_sqlx)?;
    for (seq, batch) in batches.into_iter().enumerate() {
        sqlx::query("INSERT INTO fanout_batches (event_id, seq, planned) VALUES (?, ?, ?)")
            .bind(event.id.as_uuid())
            .bind(i64::try_from(seq).unwrap_or(i64::MAX))
            .bind(encode_batch(batch))
            .execute(&mut *conn)
            .await
            .map_err(from_sqlx)?;
    }
    Ok(())
}

/// `Store::materialize_fanout`: the oldest unfinished job's next batch, in
/// one write transaction (so never two at once in this process, and the
/// file lock keeps other processes out).
pub(crate) async fn materialize(store: &SqliteStore) -> Result<Option<FanoutStep>> {
    // The runner asks every 250 ms on every node; almost always there is no
    // job. Asking a reader first keeps those calls off the one write lock
    // that ingest, claims and records queue on. A job seen here is looked
    // up again under the lock, which alone decides.
    let any: Option<i64> =
        sqlx::query_scalar("SELECT 1 FROM fanout_jobs WHERE finished_at IS NULL LIMIT 1")
            .fetch_optional(&store.reader)
            .await
            .map_err(from_sqlx)?;
    if any.is_none() {
        return Ok(None);
    }
    let now = now_ms();
    let mut tx = store.write().await?;
    let job: Option<(Uuid, i64, i64, String)> = sqlx::query_as(
        "SELECT j.event_id, j.next_batch, j.batches, e.type FROM fanout_jobs j \
         JOIN events e ON e.event_id = j.event_id \
         WHERE j.finished_at IS NULL ORDER BY j.created_at, j.event_id LIMIT 1",
    )
    .fetch_optional(&mut *tx)
    .await
    .map_err(from_sqlx)?;
    let Some((event_id, seq, batches, event_type)) = job else {
        return Ok(None);
    };
    let planned: Vec<u8> =
        sqlx::query_scalar("SELECT planned FROM fanout_batches WHERE event_id = ? AND seq = ?")
            .bind(event_id)
            .bind(seq)
            .fetch_optional(&mut *tx)
            .await
            .map_err(from_sqlx)?
            .ok_or_else(|| corrupt("fanout_batches", format_args!("batch {seq} is missing")))?;
    let planned = decode_batch(&planned)?;

    // A subscription deleted since ingest: its delivery is created failed,
    // as `delete_subscription` would have left it.
    let flags = flags_of(&mut tx, &planned).await?;
    let deleted = |d: &NewDelivery| flags.get(d.sub_id.as_uuid()).is_some_and(|f| f.deleted);

    let mut created = 0;
    for chunk in planned.chunks(ROWS_PER_INSERT) {
        let mut q = QueryBuilder::<Sqlite>::new(
            "INSERT INTO deliveries (delivery_id, event_id, sub_id, event_type, destination_host, state, \
             attempt, next_attempt_at, lease_token, created_at, window_start, updated_at, last_error) ",
        );
        q.push_values(chunk, |mut row, d| {
            let gone = deleted(d);
            row.push_bind(*d.id.as_uuid())
                .push_bind(event_id)
                .push_bind(*d.sub_id.as_uuid())
                .push_bind(event_type.clone())
                .push_bind(d.destination_host.clone())
                .push_bind(if gone { "failed" } else { "pending" })
                .push("0")
                .push_bind(now)
                .push("0")
                .push_bind(now)
                .push_bind(now)
                .push_bind(now)
                .push_bind(gone.then_some(DELETED));
        });
        // A delivery that exists (by id, or by (event, subscription)) is
        // left alone: nothing is created twice.
        q.push(" ON CONFLICT DO NOTHING");
        created += q
            .build()
            .persistent(keep_prepared(chunk.len(), ROWS_PER_INSERT))
            .execute(&mut *tx)
            .await
            .map_err(from_sqlx)?
            .rows_affected();
    }

    sqlx::query("DELETE FROM fanout_batches WHERE event_id = ? AND seq = ?")
        .bind(event_id)
        .bind(seq)
        .execute(&mut *tx)
        .await
        .map_err(from_sqlx)?;
    let finished = seq + 1 >= batches;
    sqlx::query(
        "UPDATE fanout_jobs SET next_batch = next_batch + 1, materialized = materialized + ?, \
         finished_at = ? WHERE event_id = ?",
    )
    .bind(i64::try_from(planned.len()).unwrap_or(i64::MAX))
    .bind(finished.then_some(now))
    .bind(event_id)
    .execute(&mut *tx)
    .await
    .map_err(from_sqlx)?;
    tx.commit().await.map_err(from_sqlx)?;
    Ok(Some(FanoutStep {
        event_id: EventId::from_uuid(event_id),
        materialized: planned.len() as u64,
        created,
        finished,
    }))
}

/// `Store::fanout_backlog`.
pub(crate) async fn backlog(store: &SqliteStore) -> Result<FanoutBacklog> {
    let (jobs, left): (i64, Option<i64>) = sqlx::query_as(
        "SELECT COUNT(*), SUM(total - materialized) FROM fanout_jobs WHERE finished_at IS NULL",
    )
    .fetch_one(&store.reader)
    .await
    .map_err(from_sqlx)?;
    Ok(FanoutBacklog {
        jobs: u64::try_from(jobs).unwrap_or(0),
        deliveries: u64::try_from(left.unwrap_or(0)).unwrap_or(0),
    })
}
