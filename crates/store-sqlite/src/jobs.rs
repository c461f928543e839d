//! Bulk replay jobs: a job fixes its items (delivery ids) at creation and
//! is moved on by `step`, a window at a time. Items live in
//! `replay_job_items` only while they are `queued` or `requeued`; settling
//! one deletes its row and counts it on the job, so the table holds only
//! the work still to do.

use hookd_domain::delivery::DeliveryState;
use hookd_domain::event_type::EventType;
use hookd_domain::{JobId, SubscriptionId};
use hookd_store::{JobState, JobStep, NewReplayJob, ReplayJob, Result, StoreError};
use sqlx::sqlite::SqliteRow;
use sqlx::{QueryBuilder, Row, Sqlite, SqliteConnection};
use uuid::Uuid;

use crate::SqliteStore;
use crate::codec::{from_ms, now_ms, to_ms};
use crate::dispatch::requeue;
use crate::error::{corrupt, from_sqlx};
use crate::subscriptions;

/// Queued items examined per statement while filling a window.
const ITEMS_PER_PAGE: i64 = 256;

/// The columns [`job`] reads, from `replay_jobs`.
macro_rules! job_columns {
    () => {
        "job_id, sub_id, since, until, event_types, states, state, total, \
         done, failed, skipped, requeued, created_at, finished_at"
    };
}

fn get<'r, T>(row: &'r SqliteRow, column: &str) -> Result<T>
where
    T: sqlx::Decode<'r, Sqlite> + sqlx::Type<Sqlite>,
{
    row.try_get(column).map_err(from_sqlx)
}

fn count(row: &SqliteRow, column: &str) -> Result<u64> {
    let n: i64 = get(row, column)?;
    u64::try_from(n).map_err(|_| corrupt(column, n))
}

fn job(row: &SqliteRow) -> Result<ReplayJob> {
    let types: Vec<String> = serde_json::from_str(&get::<String>(row, "event_types")?)
        .map_err(|e| corrupt("event_types", e))?;
    let states: Vec<String> =
        serde_json::from_str(&get::<String>(row, "states")?).map_err(|e| corrupt("states", e))?;
    let state: String = get(row, "state")?;
    Ok(ReplayJob {
        id: JobId::from_uuid(get(row, "job_id")?),
        sub_id: SubscriptionId::from_uuid(get(row, "sub_id")?),
        since: from_ms(get(row, "since")?, "since")?,
        until: from_ms(get(row, "until")?, "until")?,
        event_types: types
            .iter()
            .map(|t| EventType::parse(t).map_err(|e| corrupt("event_types", e)))
            .collect::<Result<_>>()?,
        states: states
            .iter()
            .map(|s| DeliveryState::parse(s).ok_or_else(|| corrupt("states", s)))
            .collect::<Result<_>>()?,
        state: JobState::parse(&state).ok_or_else(|| corrupt("state", &state))?,
        total: count(row, "total")?,
        done: count(row, "done")?,
        failed: count(row, "failed")?,
        skipped: count(row, "skipped")?,
        requeued: count(row, "requeued")?,
        created_at: from_ms(get(row, "created_at")?, "created_at")?,
        finished_at: get::<Option<i64>>(row, "finished_at")?
            .map(|t| from_ms(t, "finished_at"))
            .transpose()?,
    })
}

async fn fetch(conn: &mut SqliteConnection, id: &JobId) -> Result<ReplayJob> {
    let row = sqlx::query(concat!(
        "SELECT ",
        job_columns!(),
        " FROM replay_jobs WHERE job_id = ?"
    ))
    .bind(id.as_uuid())
    .fetch_optional(conn)
    .await
    .map_err(from_sqlx)?
    .ok_or(StoreError::NotFound)?;
    job(&row)
}

fn json(value: &[&str]) -> Result<String> {
    serde_json::to_string(value).map_err(|e| StoreError::Backend(Box::new(e)))
}

pub(crate) async fn create(store: &SqliteStore, new: NewReplayJob) -> Result<ReplayJob> {
    let types: Vec<&str> = new.event_types.iter().map(|t| t.as_str()).collect();
    let states: Vec<&str> = new.states.iter().map(|s| s.as_str()).collect();
    let mut tx = store.write().await?;
    let now = now_ms();
    subscriptions::fetch(&mut *tx, &store.keyring, &new.sub_id)
        .await?
        .ok_or(StoreError::NotFound)?;
    sqlx::query(
        "INSERT INTO replay_jobs (job_id, sub_id, since, until, event_types, states, state, total, created_at) \
         VALUES (?, ?, ?, ?, ?, ?, 'running', 0, ?)",
    )
    .bind(new.id.as_uuid())
    .bind(new.sub_id.as_uuid())
    .bind(to_ms(new.since))
    .bind(to_ms(new.until))
    .bind(json(&types)?)
    .bind(json(&states)?)
    .bind(now)
    .execute(&mut *tx)
    .await
    .map_err(from_sqlx)?;

    // The items, fixed now: `deliveries_sub` gives the subscription's rows.
    let mut total = 0;
    if !states.is_empty() {
        let mut q = QueryBuilder::<Sqlite>::new(
            "INSERT INTO replay_job_items (job_id, delivery_id, state) SELECT ",
        );
        q.push_bind(*new.id.as_uuid())
            .push(", delivery_id, 'queued' FROM deliveries WHERE sub_id = ")
            .push_bind(*new.sub_id.as_uuid())
            .push(" AND created_at >= ")
            .push_bind(to_ms(new.since))
            .push(" AND created_at < ")
            .push_bind(to_ms(new.until))
            .push(" AND state IN (");
        let mut list = q.separated(", ");
        for s in &states {
            list.push_bind(*s);
        }
        q.push(")");
        if !types.is_empty() {
            q.push(" AND event_type IN (");
            let mut list = q.separated(", ");
            for t in &types {
                list.push_bind(t.to_string());
            }
            q.push(")");
        }
        total = q
            .build()
            .execute(&mut *tx)
            .await
            .map_err(from_sqlx)?
            .rows_affected();
    }
    sqlx::query("UPDATE replay_jobs SET total = ? WHERE job_id = ?")
        .bind(i64::try_from(total).unwrap_or(i64::MAX))
        .bind(new.id.as_uuid())
        .execute(&mut *tx)
        .await
        .map_err(from_sqlx)?;
    let job = fetch(&mut tx, &new.id).await?;
    tx.commit().await.map_err(from_sqlx)?;
    Ok(job)
}

pub(crate) async fn get_job(store: &SqliteStore, id: &JobId) -> Result<ReplayJob> {
    let mut conn = store.reader.acquire().await.map_err(from_sqlx)?;
    fetch(&mut conn, id).await
}

/// Ends a job: its state and `finished_at`, and its remaining items go.
async fn end(conn: &mut SqliteConnection, id: &JobId, state: JobState, now: i64) -> Result<()> {
    sqlx::query("UPDATE replay_jobs SET state = ?, finished_at = ? WHERE job_id = ?")
        .bind(state.as_str())
        .bind(now)
        .bind(id.as_uuid())
        .execute(&mut *conn)
        .await
        .map_err(from_sqlx)?;
    sqlx::query("DELETE FROM replay_job_items WHERE job_id = ?")
        .bind(id.as_uuid())
        .execute(&mut *conn)
        .await
        .map_err(from_sqlx)?;
    Ok(())
}

pub(crate) async fn cancel(store: &SqliteStore, id: &JobId) -> Result<ReplayJob> {
    let mut tx = store.write().await?;
    let now = now_ms();
    let job = fetch(&mut tx, id).await?;
    if job.state != JobState::Running {
        return Ok(job);
    }
    end(&mut tx, id, JobState::Cancelled, now).await?;
    let job = fetch(&mut tx, id).await?;
    tx.commit().await.map_err(from_sqlx)?;
    Ok(job)
}

pub(crate) async fn running(store: &SqliteStore, limit: u32) -> Result<Vec<ReplayJob>> {
    let rows = sqlx::query(concat!(
        "SELECT ",
        job_columns!(),
        " FROM replay_jobs WHERE state = 'running' ORDER BY created_at, job_id LIMIT ?"
    ))
    .bind(i64::from(limit))
    .fetch_all(&store.reader)
    .await
    .map_err(from_sqlx)?;
    rows.iter().map(job).collect()
}

/// Deletes a settled item.
async fn settle(conn: &mut SqliteConnection, job: &JobId, delivery: &Uuid) -> Result<()> {
    sqlx::query("DELETE FROM replay_job_items WHERE job_id = ? AND delivery_id = ?")
        .bind(job.as_uuid())
        .bind(delivery)
        .execute(conn)
        .await
        .map_err(from_sqlx)?;
    Ok(())
}

/// An item with its delivery's state and its subscription's state (both
/// NULL when the delivery is gone).
type ItemRow = (Uuid, Option<String>, Option<String>);

pub(crate) async fn step(store: &SqliteStore, id: &JobId, window: u32) -> Result<JobStep> {
    // One write transaction: the states read are the states when the
    // re-queue lands, so no claim, replay or other job comes in between.
    let mut tx = store.write().await?;
    let now = now_ms();
    let mut job = fetch(&mut tx, id).await?;
    if job.state != JobState::Running {
        return Ok(JobStep { job, requeued: 0 });
    }
    let states: Vec<&str> = job.states.iter().map(|s| s.as_str()).collect();

    // 1. Settle the re-queued items whose delivery has finished (at most a
    //    window of them exist).
    let out: Vec<ItemRow> = sqlx::query_as(
        "SELECT i.delivery_id, d.state, NULL FROM replay_job_items i \
         LEFT JOIN deliveries d ON d.delivery_id = i.delivery_id \
         WHERE i.job_id = ? AND i.state = 'requeued' ORDER BY i.delivery_id",
    )
    .bind(id.as_uuid())
    .fetch_all(&mut *tx)
    .await
    .map_err(from_sqlx)?;
    let mut open = 0_u64;
    for (delivery, state, _) in out {
        match state.as_deref() {
            None => job.skipped += 1,
            Some("delivered") => job.done += 1,
            Some("failed" | "dead") => job.failed += 1,
            Some(_) => {
                open += 1;
                continue;
            }
        }
        settle(&mut tx, id, &delivery).await?;
    }

    // 2. Re-queue the next items, in delivery id order, while the window
    //    has room. One already queued or in flight waits (stays queued, no
    //    slot taken); one out of the job's states, gone, or of a deleted
    //    subscription is skipped.
    let mut requeued = 0_u32;
    let mut cursor: Option<Uuid> = None;
    'fill: while open < u64::from(window) {
        let page: Vec<ItemRow> = sqlx::query_as(
            "SELECT i.delivery_id, d.state, s.state FROM replay_job_items i \
             LEFT JOIN deliveries d ON d.delivery_id = i.delivery_id \
             LEFT JOIN subscriptions s ON s.sub_id = d.sub_id \
             WHERE i.job_id = ?1 AND i.state = 'queued' AND (?2 IS NULL OR i.delivery_id > ?2) \
             ORDER BY i.delivery_id LIMIT ?3",
        )
        .bind(id.as_uuid())
        .bind(cursor)
        .bind(ITEMS_PER_PAGE)
        .fetch_all(&mut *tx)
        .await
        .map_err(from_sqlx)?;
        if page.is_empty() {
            break;
        }
        for (delivery, state, sub_state) in page {
            cursor = Some(delivery);
            match (state.as_deref(), sub_state.as_deref()) {
                (Some(_), Some("deleted")) | (None, _) => {}
                (Some("pending" | "inflight"), _) => continue,
                (Some(s), _) if states.contains(&s) => {
                    requeue(&mut tx, &delivery, now).await?;
                    sqlx::query(
                        "UPDATE replay_job_items SET state = 'requeued' \
                         WHERE job_id = ? AND delivery_id = ?",
                    )
                    .bind(id.as_uuid())
                    .bind(delivery)
                    .execute(&mut *tx)
                    .await
                    .map_err(from_sqlx)?;
                    open += 1;
                    requeued += 1;
                    if open >= u64::from(window) {
                        break 'fill;
                    }
                    continue;
                }
                (Some(_), _) => {}
            }
            job.skipped += 1;
            settle(&mut tx, id, &delivery).await?;
        }
    }
    job.requeued = open;

    sqlx::query(
        "UPDATE replay_jobs SET done = ?, failed = ?, skipped = ?, requeued = ? WHERE job_id = ?",
    )
    .bind(i64::try_from(job.done).unwrap_or(i64::MAX))
    .bind(i64::try_from(job.failed).unwrap_or(i64::MAX))
    .bind(i64::try_from(job.skipped).unwrap_or(i64::MAX))
    .bind(i64::try_from(job.requeued).unwrap_or(i64::MAX))
    .bind(id.as_uuid())
    .execute(&mut *tx)
    .await
    .map_err(from_sqlx)?;

    // 3. Complete once nothing is left queued or re-queued.
    let left: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM replay_job_items WHERE job_id = ?")
        .bind(id.as_uuid())
        .fetch_one(&mut *tx)
        .await
        .map_err(from_sqlx)?;
    if left == 0 {
        end(&mut tx, id, JobState::Completed, now).await?;
    }
    let job = fetch(&mut tx, id).await?;
    tx.commit().await.map_err(from_sqlx)?;
    Ok(JobStep { job, requeued })
}
