//! Lazy fan-out: an event over the threshold is written with a fan-out job
//! (`write_job`, inside ingest's transaction), whose deliveries
//! `materialize` writes one batch per transaction, taking the job
//! `FOR UPDATE SKIP LOCKED` so that any number of nodes share the jobs
//! without waiting for each other, and never move one job at once.

use std::collections::HashSet;

use hookd_domain::EventId;
use hookd_store::fanout::{decode_batch, encode_batch};
use hookd_store::{
    FanoutBacklog, FanoutStep, LazyFanout, NewDelivery, NewEvent, Result, StoreError,
};
use sqlx::{Postgres, Transaction};
use uuid::Uuid;

use crate::PgStore;
use crate::error::map;
use crate::store::{DELETED, begin, commit, insert_deliveries, with_partitions};

/// Refuses one event's planned deliveries as writing their rows would: one
/// naming a subscription not in `known`, or two naming one subscription.
pub(crate) fn check_deliveries(known: &HashSet<Uuid>, deliveries: &[NewDelivery]) -> Result<()> {
    let mut seen = HashSet::with_capacity(deliveries.len());
    for d in deliveries {
        if !known.contains(d.sub_id.as_uuid()) {
            return Err(StoreError::Conflict(format!(
                "a delivery names {}, which does not exist",
                d.sub_id
            )));
        }
        if !seen.insert(d.sub_id) {
            return Err(StoreError::Conflict(format!(
                "two deliveries of one event name {}",
                d.sub_id
            )));
        }
    }
    Ok(())
}

/// Writes `event`'s deliveries as a fan-out job, inside the caller's
/// transaction (the event row is written already): the deliveries of
/// ordered subscriptions at once (a later event's delivery must not
/// overtake them), the rest as batches of `fanout.batch`, in the order
/// given. An error leaves the transaction aborted: the caller must drop it.
pub(crate) async fn write_job(
    tx: &mut Transaction<'_, Postgres>,
    event: &NewEvent,
    deliveries: &[NewDelivery],
    fanout: LazyFanout,
) -> Result<()> {
    let subs: Vec<Uuid> = deliveries.iter().map(|d| *d.sub_id.as_uuid()).collect();
    let rows: Vec<(Uuid, bool)> =
        sqlx::query_as("SELECT sub_id, ordered FROM subscriptions WHERE sub_id = ANY($1)")
            .bind(&subs)
            .fetch_all(&mut **tx)
            .await
            .map_err(map)?;
    // Refused, as writing the rows would be: a job must never hold a
    // delivery it cannot write.
    let known: HashSet<Uuid> = rows.iter().map(|(id, _)| *id).collect();
    check_deliveries(&known, deliveries)?;
    let ordered: HashSet<Uuid> = rows
        .into_iter()
        .filter_map(|(id, ordered)| ordered.then_some(id))
        .collect();
    let (now_rows, planned): (Vec<&NewDelivery>, Vec<&NewDelivery>) = deliveries
        .iter()
        .partition(|d| ordered.contains(d.sub_id.as_uuid()));
    insert_deliveries(tx, event, &now_rows).await?;
    if planned.is_empty() {
        return Ok(());
    }
    let planned: Vec<NewDelivery> = planned.into_iter().cloned().collect();
    let batches: Vec<Vec<u8>> = planned
        .chunks(fanout.batch_size())
        .map(encode_batch)
        .collect();
    let count = |n: usize, what: &str| {
        i32::try_from(n).map_err(|_| StoreError::Backend(format!("{what} {n} does not fit").into()))
    };
    sqlx::query("INSERT INTO fanout_jobs (event_id, total, batches) VALUES ($1, $2, $3)")
        .bind(event.id.as_uuid())
        .bind(i64::from(count(planned.len(), "planned deliveries")?))
        .bind(count(batches.len(), "fan-out batches")?)
        .execute(&mut **tx)
        .await
        .map_err(map)?;
    let seqs: Vec<i32> = (0..count(batches.len(), "fan-out batches")?).collect();
    sqlx::query(
        "INSERT INTO fanout_batches (event_id, seq, planned) \
         SELECT $1, u.seq, u.planned FROM unnest($2::integer[], $3::bytea[]) AS u(seq, planned)",
    )
    .bind(event.id.as_uuid())
    .bind(seqs)
    .bind(batches)
    .execute(&mut **tx)
    .await
    .map_err(map)?;
    Ok(())
}

/// `Store::materialize_fanout`.
pub(crate) async fn materialize(store: &PgStore) -> Result<Option<FanoutStep>> {
    // The rows go into today's day partition; `with_partitions` creates it
    // if upkeep has not (and runs the step again: nothing was committed).
    store
        .bounded(with_partitions(store, || materialize_once(store)))
        .await
}

async fn materialize_once(store: &PgStore) -> Result<Option<FanoutStep>> {
    let mut tx = begin(store).await?;
    // A job another node is moving on is skipped, not waited for.
    let job: Option<(Uuid, i32, i32, String)> = sqlx::query_as(
        "SELECT j.event_id, j.next_batch, j.batches, e.type FROM fanout_jobs j \
         JOIN events e ON e.event_id = j.event_id \
         WHERE j.finished_at IS NULL ORDER BY j.created_at, j.event_id LIMIT 1 \
         FOR UPDATE OF j SKIP LOCKED",
    )
    .fetch_optional(&mut *tx)
    .await
    .map_err(map)?;
    let Some((event_id, seq, batches, event_type)) = job else {
        return Ok(None);
    };
    let planned: Vec<u8> =
        sqlx::query_scalar("SELECT planned FROM fanout_batches WHERE event_id = $1 AND seq = $2")
            .bind(event_id)
            .bind(seq)
            .fetch_optional(&mut *tx)
            .await
            .map_err(map)?
            .ok_or_else(|| {
                StoreError::Corrupt(format!("fan-out job {event_id}: batch {seq} is missing"))
            })?;
    let planned = decode_batch(&planned)?;
    let subs: Vec<Uuid> = planned.iter().map(|d| *d.sub_id.as_uuid()).collect();
    // Read under KEY SHARE, which a subscription delete's FOR UPDATE
    // excludes: either the delete committed first and its state is seen
    // here (the delivery is created failed), or it waits for this commit
    // and then fails the rows written here with the rest.
    let deleted: HashSet<Uuid> = sqlx::query_as::<_, (Uuid, bool)>(
        "SELECT sub_id, state = 'deleted' FROM subscriptions WHERE sub_id = ANY($1) \
         FOR KEY SHARE",
    )
    .bind(&subs)
    .fetch_all(&mut *tx)
    .await
    .map_err(map)?
    .into_iter()
    .filter_map(|(id, deleted)| deleted.then_some(id))
    .collect();
    let gone = |d: &NewDelivery| deleted.contains(d.sub_id.as_uuid());
    // The NOT EXISTS looks in every day partition: the unique index
    // (event_id, sub_id, retain_from) only answers within one, and a
    // job's batches may be written on different days.
    let created = sqlx::query(
        "INSERT INTO deliveries (delivery_id, event_id, sub_id, event_type, destination_host, \
         state, attempt, next_attempt_at, created_at, window_start, updated_at, retain_from, last_error) \
         SELECT u.delivery_id, $1, u.sub_id, $2, u.host, u.state, 0, now(), now(), now(), now(), now(), \
                u.last_error \
         FROM unnest($3::uuid[], $4::uuid[], $5::text[], $6::text[], $7::text[]) \
           AS u(delivery_id, sub_id, host, state, last_error) \
         WHERE NOT EXISTS (SELECT 1 FROM deliveries x WHERE x.event_id = $1 AND x.sub_id = u.sub_id) \
         ON CONFLICT DO NOTHING",
    )
    .bind(event_id)
    .bind(&event_type)
    .bind(planned.iter().map(|d| *d.id.as_uuid()).collect::<Vec<_>>())
    .bind(&subs)
    .bind(
        planned
            .iter()
            .map(|d| d.destination_host.as_str())
            .collect::<Vec<_>>(),
    )
    .bind(
        planned
            .iter()
            .map(|d| if gone(d) { "failed" } else { "pending" })
            .collect::<Vec<_>>(),
    )
    .bind(
        planned
            .iter()
            .map(|d| gone(d).then_some(DELETED))
            .collect::<Vec<_>>(),
    )
    .execute(&mut *tx)
    .await
    .map_err(map)?
    .rows_affected();
    sqlx::query("DELETE FROM fanout_batches WHERE event_id = $1 AND seq = $2")
        .bind(event_id)
        .bind(seq)
        .execute(&mut *tx)
        .await
        .map_err(map)?;
    let finished = seq + 1 >= batches;
    sqlx::query(
        "UPDATE fanout_jobs SET next_batch = next_batch + 1, materialized = materialized + $2, \
         finished_at = CASE WHEN $3 THEN now() END WHERE event_id = $1",
    )
    .bind(event_id)
    .bind(i64::try_from(planned.len()).unwrap_or(i64::MAX))
    .bind(finished)
    .execute(&mut *tx)
    .await
    .map_err(map)?;
    commit(tx).await?;
    Ok(Some(FanoutStep {
        event_id: EventId::from_uuid(event_id),
        materialized: planned.len() as u64,
        created,
        finished,
    }))
}

/// `Store::fanout_backlog`.
pub(crate) async fn backlog(store: &PgStore) -> Result<FanoutBacklog> {
    store
        .bounded(async {
            let (jobs, left): (i64, i64) = sqlx::query_as(
                "SELECT count(*), COALESCE(sum(total - materialized), 0)::bigint \
                 FROM fanout_jobs WHERE finished_at IS NULL",
            )
            .fetch_one(&store.pool)
            .await
            .map_err(map)?;
            Ok(FanoutBacklog {
                jobs: u64::try_from(jobs).unwrap_or(0),
                deliveries: u64::try_from(left).unwrap_or(0),
            })
        })
        .await
}
