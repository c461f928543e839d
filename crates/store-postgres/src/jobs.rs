//! Bulk replay jobs: items fixed at creation, then moved on a window at a
//! time by `step`, each step one transaction.

use hookd_domain::JobId;
use hookd_store::{JobState, JobStep, NewReplayJob, ReplayJob, Result, StoreError};
use sqlx::Row;
use uuid::Uuid;

use crate::PgStore;
use crate::error::map;
use crate::rows::{self, job_cols};
use crate::store::{begin, commit};

/// How many queued items a step reads at once at least.
const LOOK_AHEAD: i64 = 64;

pub(crate) async fn create(store: &PgStore, new: NewReplayJob) -> Result<ReplayJob> {
    let mut tx = begin(store).await?;
    // Share-locked so a concurrent delete commits first (and is seen) or
    // waits for the job's items to be fixed.
    sqlx::query("SELECT 1 FROM subscriptions WHERE sub_id = $1 AND state <> 'deleted' FOR SHARE")
        .bind(new.sub_id.as_uuid())
        .fetch_optional(&mut *tx)
        .await
        .map_err(map)?
        .ok_or(StoreError::NotFound)?;
    let types: Vec<String> = new
        .event_types
        .iter()
        .map(|t| t.as_str().to_owned())
        .collect();
    let states: Vec<String> = new.states.iter().map(|s| s.as_str().to_owned()).collect();
    sqlx::query(
        "INSERT INTO replay_jobs (job_id, sub_id, since, until, event_types, states, state) \
         VALUES ($1, $2, $3, $4, $5, $6, 'running')",
    )
    .bind(new.id.as_uuid())
    .bind(new.sub_id.as_uuid())
    .bind(new.since)
    .bind(new.until)
    .bind(&types)
    .bind(&states)
    .execute(&mut *tx)
    .await
    .map_err(map)?;
    // The items, fixed now: one statement, the subscription's slice of
    // `deliveries_sub`.
    let total = sqlx::query(
        "INSERT INTO replay_job_items (job_id, delivery_id) \
         SELECT $1, d.delivery_id FROM deliveries d \
         WHERE d.sub_id = $2 AND d.created_at >= $3 AND d.created_at < $4 \
           AND (cardinality($5::text[]) = 0 OR d.event_type = ANY($5::text[])) \
           AND d.state = ANY($6::text[]) \
         ON CONFLICT DO NOTHING",
    )
    .bind(new.id.as_uuid())
    .bind(new.sub_id.as_uuid())
    .bind(new.since)
    .bind(new.until)
    .bind(&types)
    .bind(&states)
    .execute(&mut *tx)
    .await
    .map_err(map)?
    .rows_affected();
    let row = sqlx::query(concat!(
        "UPDATE replay_jobs AS j SET total = $2 WHERE j.job_id = $1 RETURNING ",
        job_cols!()
    ))
    .bind(new.id.as_uuid())
    .bind(i64::try_from(total).unwrap_or(i64::MAX))
    .fetch_one(&mut *tx)
    .await
    .map_err(map)?;
    let job = rows::replay_job(&row)?;
    commit(tx).await?;
    Ok(job)
}

pub(crate) async fn step(store: &PgStore, id: &JobId, window: u32) -> Result<JobStep> {
    let job_id = *id.as_uuid();
    let mut tx = begin(store).await?;
    // The job row serialises steps (and cancels) of one job.
    let row = sqlx::query(concat!(
        "SELECT ",
        job_cols!(),
        " FROM replay_jobs j WHERE j.job_id = $1 FOR UPDATE"
    ))
    .bind(job_id)
    .fetch_optional(&mut *tx)
    .await
    .map_err(map)?
    .ok_or(StoreError::NotFound)?;
    let job = rows::replay_job(&row)?;
    if job.state != JobState::Running {
        return Ok(JobStep { job, requeued: 0 });
    }

    // 1. Settle the re-queued items whose delivery finished (or is gone).
    let settled = sqlx::query(
        "WITH s AS ( \
             SELECT i.delivery_id, CASE WHEN d.state IS NULL THEN 'skipped' \
                 WHEN d.state = 'delivered' THEN 'done' \
                 WHEN d.state IN ('failed', 'dead') THEN 'failed' END AS to_state \
             FROM replay_job_items i LEFT JOIN deliveries d ON d.delivery_id = i.delivery_id \
             WHERE i.job_id = $1 AND i.state = 'requeued' \
         ) UPDATE replay_job_items i SET state = s.to_state FROM s \
         WHERE i.job_id = $1 AND i.delivery_id = s.delivery_id AND s.to_state IS NOT NULL \
         RETURNING i.state",
    )
    .bind(job_id)
    .fetch_all(&mut *tx)
    .await
    .map_err(map)?;
    let (mut done, mut failed, mut skipped) = (0i64, 0i64, 0i64);
    for row in &settled {
        match row.try_get::<String, _>("state").map_err(map)?.as_str() {
            "done" => done += 1,
            "failed" => failed += 1,
            _ => skipped += 1,
        }
    }
    let mut requeued = i64::try_from(job.requeued).unwrap_or(i64::MAX) - settled.len() as i64;
    let mut made_pending: u32 = 0;

    // 2. Re-queue the next items while the window has room.
    if i64::from(window) > requeued {
        // The subscription first (as replay_delivery, record_attempt and
        // delete_subscription take it before its deliveries): share-locked,
        // so a concurrent delete either commits first and is seen here, or
        // waits and then fails the deliveries made pending here.
        let sub = sqlx::query("SELECT state FROM subscriptions WHERE sub_id = $1 FOR SHARE")
            .bind(job.sub_id.as_uuid())
            .fetch_optional(&mut *tx)
            .await
            .map_err(map)?;
        let sub_deleted = match sub {
            Some(row) => row.try_get::<String, _>("state").map_err(map)? == "deleted",
            None => true,
        };
        let replayable: Vec<&str> = job
            .states
            .iter()
            .filter(|s| s.is_final())
            .map(|s| s.as_str())
            .collect();
        // Items this step has looked at are behind the cursor: one left
        // waiting stays queued for a later step, without holding up the rest.
        let mut after: Option<Uuid> = None;
        while i64::from(window) > requeued {
            let room = i64::from(window) - requeued;
            // At least a batch at a time, so a run of skipped items (which
            // take no room) costs few round trips; items past the room left
            // are only looked at, not judged.
            let items: Vec<Uuid> = sqlx::query_scalar(
                "SELECT delivery_id FROM replay_job_items WHERE job_id = $1 AND state = 'queued' \
                 AND ($3::uuid IS NULL OR delivery_id > $3) ORDER BY delivery_id LIMIT $2",
            )
            .bind(job_id)
            .bind(room.max(LOOK_AHEAD))
            .bind(after)
            .fetch_all(&mut *tx)
            .await
            .map_err(map)?;
            if items.is_empty() {
                break;
            }
            // Locked in id order (so two jobs' steps never deadlock): a
            // step of another job that re-queued one of these first has
            // committed by the time the lock is granted, and this one then
            // sees it pending and leaves it alone.
            let found = sqlx::query(
                "SELECT delivery_id, state FROM deliveries WHERE delivery_id = ANY($1) \
                 ORDER BY delivery_id FOR UPDATE",
            )
            .bind(&items)
            .fetch_all(&mut *tx)
            .await
            .map_err(map)?;
            let mut states = std::collections::HashMap::with_capacity(found.len());
            for row in &found {
                let id: Uuid = row.try_get("delivery_id").map_err(map)?;
                let state: String = row.try_get("state").map_err(map)?;
                states.insert(id, state);
            }
            let (mut replay, mut skip) = (Vec::new(), Vec::new());
            for item in items {
                if requeued + replay.len() as i64 >= i64::from(window) {
                    break;
                }
                after = Some(item);
                match states.get(&item).map(String::as_str) {
                    None => skip.push(item),
                    Some(_) if sub_deleted => skip.push(item),
                    // Queued or in flight already (a retry, a hand replay,
                    // another job): left alone; the item stays queued and is
                    // judged afresh at a later step.
                    Some("pending" | "inflight") => {}
                    Some(s) if replayable.contains(&s) => replay.push(item),
                    Some(_) => skip.push(item),
                }
            }
            if !replay.is_empty() {
                // Exactly what replay_delivery does to a finished delivery.
                sqlx::query(
                    "UPDATE deliveries SET state = 'pending', next_attempt_at = now(), \
                     window_start = now(), lease_expires = NULL, worker_id = NULL, updated_at = now() \
                     WHERE delivery_id = ANY($1)",
                )
                .bind(&replay)
                .execute(&mut *tx)
                .await
                .map_err(map)?;
            }
            let queued = replay;
            sqlx::query(
                "UPDATE replay_job_items SET state = CASE WHEN delivery_id = ANY($2) \
                 THEN 'requeued' ELSE 'skipped' END \
                 WHERE job_id = $1 AND (delivery_id = ANY($2) OR delivery_id = ANY($3))",
            )
            .bind(job_id)
            .bind(&queued)
            .bind(&skip)
            .execute(&mut *tx)
            .await
            .map_err(map)?;
            made_pending += u32::try_from(queued.len()).unwrap_or(u32::MAX);
            requeued += queued.len() as i64;
            skipped += skip.len() as i64;
        }
    }

    // 3. Complete when nothing is left queued or re-queued.
    let open: bool = sqlx::query_scalar(
        "SELECT EXISTS (SELECT 1 FROM replay_job_items WHERE job_id = $1 \
         AND state IN ('queued', 'requeued'))",
    )
    .bind(job_id)
    .fetch_one(&mut *tx)
    .await
    .map_err(map)?;
    let row = sqlx::query(concat!(
        "UPDATE replay_jobs AS j SET done = j.done + $2, failed = j.failed + $3, \
         skipped = j.skipped + $4, requeued = $5, \
         state = CASE WHEN $6 THEN 'completed' ELSE j.state END, \
         finished_at = CASE WHEN $6 THEN now() ELSE j.finished_at END \
         WHERE j.job_id = $1 RETURNING ",
        job_cols!()
    ))
    .bind(job_id)
    .bind(done)
    .bind(failed)
    .bind(skipped)
    .bind(requeued)
    .bind(!open)
    .fetch_one(&mut *tx)
    .await
    .map_err(map)?;
    let job = rows::replay_job(&row)?;
    commit(tx).await?;
    Ok(JobStep {
        job,
        requeued: made_pending,
    })
}
