//! Retention over day partitions (design §9.3), and the daily rollup.
//!
//! Deliveries and attempts are partitioned by `retain_from` into UTC days
//! (`deliveries_pYYYYMMDD`, `attempts_pYYYYMMDD`; migration 0006). A day
//! whose upper bound has passed `deliveries_before` goes in two moves:
//!
//! 1. its `pending` deliveries (and their attempts) are carried forward into
//!    today's partition by setting `retain_from = now()` (row movement),
//!    `SKIP LOCKED` so claimers are never blocked;
//! 2. if it holds no unfinished delivery any more (none `inflight`, and it is
//!    not today's), one transaction folds the day's attempts into
//!    `daily_stats` (before any table lock), locks both parent tables, checks
//!    the day is still as the fold saw it, drops both partitions and
//!    re-creates any missing partition of today .. today + 3.
//!
//! A day with an `inflight` delivery waits for a later pass.

use std::collections::BTreeMap;
use std::time::Duration;

use chrono::{NaiveDate, NaiveTime};
use hookd_domain::{SubscriptionId, Timestamp};
use hookd_store::{DailyStats, Result, RetentionPolicy, RetentionReport};
use sqlx::{Postgres, Row, Transaction};

use crate::PgStore;
use crate::error::map;
use crate::quote_ident;
use crate::store::{begin, commit};

/// How long the drop transaction waits for its table locks before giving up
/// for this pass (`more` is then set): a long transaction elsewhere must not
/// queue every other statement behind the drop's lock request.
const LOCK_TIMEOUT: &str = "SET LOCAL lock_timeout = '1s'";

/// How long the fold of one day may take (server side)…
const FOLD_STATEMENT_TIMEOUT: &str = "SET LOCAL statement_timeout = '10min'";
/// …and the whole drop transaction (client side).
const FOLD_DEADLINE: Duration = Duration::from_secs(11 * 60);

/// Midnight (UTC) starting `day`.
fn midnight(day: NaiveDate) -> Timestamp {
    day.and_time(NaiveTime::MIN).and_utc()
}

/// The day of a partition named by `hookd_day_partition`.
fn partition_day(name: &str) -> Option<NaiveDate> {
    let digits = name.strip_prefix("deliveries_p")?;
    NaiveDate::parse_from_str(digits, "%Y%m%d").ok()
}

fn suffix(day: NaiveDate) -> String {
    day.format("%Y%m%d").to_string()
}

/// Creates any missing partition of today .. today + 3, inside a
/// transaction that holds the parent tables' locks already (the drop).
pub(crate) async fn ensure_partitions_in(tx: &mut Transaction<'_, Postgres>) -> Result<()> {
    sqlx::query("SELECT hookd_ensure_partitions()")
        .execute(&mut **tx)
        .await
        .map_err(map)?;
    Ok(())
}

/// Creates any missing partition of today .. today + 3, on its own.
///
/// Creating a partition locks its parent exclusively, so while it waits for
/// that lock (behind a long fold or a long report, say) every other
/// statement on the table would queue behind it; with the short lock
/// timeout it gives up instead (`Ok(false)`) — the partitions are made days
/// ahead, so a later pass (or the insert that needs one) creates them.
pub(crate) async fn ensure_partitions(store: &PgStore) -> Result<bool> {
    let mut tx = begin(store).await?;
    sqlx::query(LOCK_TIMEOUT)
        .execute(&mut *tx)
        .await
        .map_err(map)?;
    match sqlx::query("SELECT hookd_ensure_partitions()")
        .execute(&mut *tx)
        .await
    {
        Ok(_) => {}
        Err(e) if is_lock_failure(&e) => return Ok(false),
        Err(e) => return Err(map(e)),
    }
    commit(tx).await?;
    Ok(true)
}

/// Today (UTC, database clock) and the days that have partitions, ascending.
async fn days(store: &PgStore) -> Result<(NaiveDate, Vec<NaiveDate>)> {
    let today: NaiveDate = sqlx::query_scalar("SELECT (now() AT TIME ZONE 'UTC')::date")
        .fetch_one(&store.pool)
        .await
        .map_err(map)?;
    let names: Vec<String> = sqlx::query_scalar(
        "SELECT c.relname::text FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid \
         WHERE i.inhparent = 'deliveries'::regclass",
    )
    .fetch_all(&store.pool)
    .await
    .map_err(map)?;
    let mut days: Vec<NaiveDate> = names.iter().filter_map(|n| partition_day(n)).collect();
    days.sort_unstable();
    Ok((today, days))
}

/// Moves up to `batch` pending deliveries of `[lo, hi)`, with their
/// attempts, into today's partition. Returns how many deliveries moved.
/// Found and locked through `delivery_queue`, queue row first, as a claim
/// takes them (store.rs, `claim_sql!`).
async fn carry_forward(store: &PgStore, lo: Timestamp, hi: Timestamp, batch: i64) -> Result<i64> {
    let mut tx = begin(store).await?;
    let moved: i64 = sqlx::query_scalar(
        "WITH picked AS ( \
             SELECT delivery_id, retain_from FROM delivery_queue \
             WHERE retain_from >= $1 AND retain_from < $2 AND state = 'pending' \
             LIMIT $3 FOR UPDATE SKIP LOCKED \
         ), moved AS ( \
             UPDATE deliveries d SET retain_from = now() FROM picked \
             WHERE d.delivery_id = picked.delivery_id AND d.retain_from = picked.retain_from \
               AND d.state = 'pending' \
             RETURNING d.delivery_id, picked.retain_from AS old \
         ), moved_attempts AS ( \
             UPDATE attempts a SET retain_from = now() FROM moved \
             WHERE a.delivery_id = moved.delivery_id AND a.retain_from = moved.old \
             RETURNING 1 \
         ) SELECT count(*) FROM moved",
    )
    .bind(lo)
    .bind(hi)
    .bind(batch)
    .fetch_one(&mut *tx)
    .await
    .map_err(map)?;
    commit(tx).await?;
    Ok(moved)
}

/// What became of one expired day.
enum DayFate {
    /// Dropped, with this many deliveries and attempts.
    Dropped(u64, u64),
    /// Still holds unfinished deliveries (or nothing worth dropping).
    Kept,
    /// The table locks were not granted in time; try again later.
    Busy,
}

/// Whether an error is a lock wait given up (our lock_timeout) or a deadlock
/// victim: the drop is then simply retried on a later pass.
fn is_lock_failure(err: &sqlx::Error) -> bool {
    matches!(err, sqlx::Error::Database(db)
        if matches!(db.code().as_deref(), Some("55P03" | "40P01")))
}

async fn unfinished_and_total<'e>(
    exec: impl sqlx::PgExecutor<'e>,
    lo: Timestamp,
    hi: Timestamp,
) -> Result<(i64, i64)> {
    let row = sqlx::query(
        "SELECT count(*) FILTER (WHERE state IN ('pending', 'inflight')) AS unfinished, \
         count(*) AS total FROM deliveries WHERE retain_from >= $1 AND retain_from < $2",
    )
    .bind(lo)
    .bind(hi)
    .fetch_one(exec)
    .await
    .map_err(map)?;
    Ok((
        row.try_get("unfinished").map_err(map)?,
        row.try_get("total").map_err(map)?,
    ))
}

/// The day's attempts folded into `daily_stats` (per subscription and UTC
/// day of `started_at`, merged into what earlier passes folded), and, from
/// the same snapshot, the day's fingerprint: its attempts' count and id sum,
/// and its deliveries' count.
const FOLD: &str = "WITH a AS ( \
         SELECT d.sub_id, (a.started_at AT TIME ZONE 'UTC')::date AS day, a.outcome, a.duration_ms \
         FROM deliveries d JOIN attempts a \
           ON a.delivery_id = d.delivery_id AND a.retain_from = d.retain_from \
         WHERE d.retain_from >= $1 AND d.retain_from < $2 \
           AND a.retain_from >= $1 AND a.retain_from < $2 \
     ), lat AS ( \
         SELECT sub_id, day, jsonb_agg(jsonb_build_array(duration_ms, n) ORDER BY duration_ms) AS latency \
         FROM (SELECT sub_id, day, duration_ms, count(*) AS n FROM a GROUP BY 1, 2, 3) x \
         GROUP BY 1, 2 \
     ), tot AS ( \
         SELECT sub_id, day, count(*) AS attempts, \
                count(*) FILTER (WHERE outcome = 'delivered') AS delivered, \
                count(*) FILTER (WHERE outcome = 'failed') AS failed, \
                count(*) FILTER (WHERE outcome = 'dead') AS dead \
         FROM a GROUP BY 1, 2 \
     ), folded AS ( \
         INSERT INTO daily_stats AS s (sub_id, day, attempts, delivered, failed, dead, latency) \
         SELECT tot.sub_id, tot.day, tot.attempts, tot.delivered, tot.failed, tot.dead, lat.latency \
         FROM tot JOIN lat USING (sub_id, day) \
         ON CONFLICT (sub_id, day) DO UPDATE SET attempts = s.attempts + EXCLUDED.attempts, \
             delivered = s.delivered + EXCLUDED.delivered, failed = s.failed + EXCLUDED.failed, \
             dead = s.dead + EXCLUDED.dead, latency = hookd_merge_latency(s.latency, EXCLUDED.latency) \
         RETURNING 1 \
     ) SELECT count(*) AS attempts, COALESCE(sum(attempt_id), 0)::text AS id_sum, \
         (SELECT count(*) FROM deliveries WHERE retain_from >= $1 AND retain_from < $2) AS deliveries \
       FROM attempts WHERE retain_from >= $1 AND retain_from < $2";

/// The fingerprint of [`FOLD`] alone, read again under the table locks.
const FINGERPRINT: &str = "SELECT count(*) AS attempts, COALESCE(sum(attempt_id), 0)::text AS id_sum, \
         (SELECT count(*) FROM deliveries WHERE retain_from >= $1 AND retain_from < $2) AS deliveries \
       FROM attempts WHERE retain_from >= $1 AND retain_from < $2";

/// Attempts' count and id sum, deliveries' count.
type Fingerprint = (i64, String, i64);

async fn fingerprint<'e>(
    exec: impl sqlx::PgExecutor<'e>,
    sql: &'static str,
    lo: Timestamp,
    hi: Timestamp,
) -> Result<Fingerprint> {
    let row = sqlx::query(sql)
        .bind(lo)
        .bind(hi)
        .fetch_one(exec)
        .await
        .map_err(map)?;
    Ok((
        row.try_get("attempts").map_err(map)?,
        row.try_get("id_sum").map_err(map)?,
        row.try_get("deliveries").map_err(map)?,
    ))
}

/// Folds and drops one day if all its deliveries are finished.
///
/// One transaction: the fold runs first, before any table lock, so the
/// aggregation over a whole day never holds up ingest or claims; then both
/// parent tables are locked (as DROP would lock them anyway) and the day is
/// checked to be as the fold saw it — no unfinished delivery, the same
/// attempts (count and id sum: attempts are only ever added, or moved out
/// with a delivery carried forward) and deliveries — before both partitions
/// are dropped. A day that changed meanwhile (a late attempt, a replay) is
/// rolled back, fold and all, and tried again on a later pass.
async fn drop_day(store: &PgStore, day: NaiveDate, today: NaiveDate) -> Result<DayFate> {
    let (lo, hi) = (midnight(day), midnight(day.succ_opt().unwrap_or(day)));
    // A look without locks first, so a day that cannot go costs nothing.
    let (unfinished, total) = unfinished_and_total(&store.pool, lo, hi).await?;
    if unfinished > 0 || (total == 0 && day >= today) {
        return Ok(DayFate::Kept);
    }
    let mut tx = begin(store).await?;
    sqlx::query(FOLD_STATEMENT_TIMEOUT)
        .execute(&mut *tx)
        .await
        .map_err(map)?;
    let folded = fingerprint(&mut *tx, FOLD, lo, hi).await?;
    sqlx::query(LOCK_TIMEOUT)
        .execute(&mut *tx)
        .await
        .map_err(map)?;
    // Both parents, deliveries first (the order every statement touching
    // both takes them in): nothing is written into the day from here on.
    let locked = sqlx::query("LOCK TABLE ONLY deliveries, ONLY attempts IN ACCESS EXCLUSIVE MODE")
        .execute(&mut *tx)
        .await;
    match locked {
        Ok(_) => {}
        Err(e) if is_lock_failure(&e) => return Ok(DayFate::Busy),
        Err(e) => return Err(map(e)),
    }
    let sfx = suffix(day);
    let (deliveries_part, attempts_part) = (
        quote_ident(&format!("deliveries_p{sfx}")),
        quote_ident(&format!("attempts_p{sfx}")),
    );
    // Another node's pass may have dropped it while this one folded.
    let exists: bool = sqlx::query_scalar("SELECT to_regclass($1) IS NOT NULL")
        .bind(&deliveries_part)
        .fetch_one(&mut *tx)
        .await
        .map_err(map)?;
    if !exists {
        return Ok(DayFate::Kept);
    }
    let (unfinished, _) = unfinished_and_total(&mut *tx, lo, hi).await?;
    if unfinished > 0 {
        return Ok(DayFate::Kept);
    }
    if fingerprint(&mut *tx, FINGERPRINT, lo, hi).await? != folded {
        return Ok(DayFate::Busy);
    }
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "DROP TABLE IF EXISTS {attempts_part}; DROP TABLE IF EXISTS {deliveries_part}"
    )))
    .execute(&mut *tx)
    .await
    .map_err(map)?;
    // In the same transaction, so an insert never finds no partition (the
    // day dropped may have been today's).
    ensure_partitions_in(&mut tx).await?;
    commit(tx).await?;
    let (attempts, _, deliveries) = folded;
    Ok(DayFate::Dropped(
        u64::try_from(deliveries).unwrap_or(0),
        u64::try_from(attempts).unwrap_or(0),
    ))
}

/// What makes an event `e` unneeded here: no delivery refers to it, no
/// unfinished fan-out job will, and the shard outbox does not hold it.
macro_rules! EVENT_UNNEEDED {
    () => {
        "NOT EXISTS (SELECT 1 FROM deliveries d WHERE d.event_id = e.event_id) \
         AND NOT EXISTS (SELECT 1 FROM fanout_jobs j \
             WHERE j.event_id = e.event_id AND j.finished_at IS NULL) \
         AND NOT EXISTS (SELECT 1 FROM shard_outbox o WHERE o.event_id = e.event_id)"
    };
}

/// Deletes up to `batch` events older than `before` that no delivery
/// refers to and no unfinished fan-out job will (a finished job goes with
/// its event), nor, on a sharded deployment's control database, the shard
/// outbox (its shards have yet to write its deliveries). Returns how many.
async fn delete_events(store: &PgStore, before: Timestamp, batch: i64) -> Result<i64> {
    sqlx::query_scalar(concat!(
        "WITH gone AS ( \
             DELETE FROM events WHERE event_id IN ( \
                 SELECT e.event_id FROM events e WHERE e.created_at < $1 AND ",
        EVENT_UNNEEDED!(),
        " ORDER BY e.created_at LIMIT $2 FOR UPDATE SKIP LOCKED) \
             RETURNING 1 \
         ) SELECT count(*) FROM gone"
    ))
    .bind(before)
    .bind(batch)
    .fetch_one(&store.pool)
    .await
    .map_err(map)
}

/// A sharded deployment's control database: up to `batch` events older
/// than `before` that nothing here needs, oldest first. Whether a shard
/// still holds a copy is for the caller to ask.
pub(crate) async fn unneeded_events(
    store: &PgStore,
    before: Timestamp,
    batch: i64,
) -> Result<Vec<uuid::Uuid>> {
    store
        .bounded(async {
            sqlx::query_scalar(concat!(
                "SELECT e.event_id FROM events e WHERE e.created_at < $1 AND ",
                EVENT_UNNEEDED!(),
                " ORDER BY e.created_at LIMIT $2"
            ))
            .bind(before)
            .bind(batch)
            .fetch_all(&store.pool)
            .await
            .map_err(map)
        })
        .await
}

/// Which of `ids` this database holds an event row of.
pub(crate) async fn events_held(
    store: &PgStore,
    ids: &[uuid::Uuid],
) -> Result<std::collections::HashSet<uuid::Uuid>> {
    store
        .bounded(async {
            let held: Vec<uuid::Uuid> =
                sqlx::query_scalar("SELECT event_id FROM events WHERE event_id = ANY($1)")
                    .bind(ids)
                    .fetch_all(&store.pool)
                    .await
                    .map_err(map)?;
            Ok(held.into_iter().collect())
        })
        .await
}

/// Deletes those of `ids` that are still unneeded here. Returns how many.
pub(crate) async fn delete_events_in(store: &PgStore, ids: &[uuid::Uuid]) -> Result<u64> {
    store
        .bounded(async {
            let gone = sqlx::query(concat!(
                "DELETE FROM events e WHERE e.event_id = ANY($1) AND ",
                EVENT_UNNEEDED!()
            ))
            .bind(ids)
            .execute(&store.pool)
            .await
            .map_err(map)?;
            Ok(gone.rows_affected())
        })
        .await
}

pub(crate) async fn enforce(store: &PgStore, policy: &RetentionPolicy) -> Result<RetentionReport> {
    enforce_with(store, policy, true).await
}

/// [`enforce`], deleting events or not (a sharded deployment's control
/// database deletes events only once no shard holds a copy: its caller
/// asks the shards first).
pub(crate) async fn enforce_with(
    store: &PgStore,
    policy: &RetentionPolicy,
    events: bool,
) -> Result<RetentionReport> {
    let mut report = RetentionReport::default();
    let batch = i64::from(policy.batch.max(1));
    store.bounded(ensure_partitions(store)).await?;
    let (today, days) = store.bounded(days(store)).await?;
    for day in days {
        let Some(next) = day.succ_opt() else { continue };
        if midnight(next) > policy.deliveries_before {
            break;
        }
        if day < today {
            let moved = store
                .bounded(carry_forward(store, midnight(day), midnight(next), batch))
                .await?;
            if moved >= batch {
                // More pending rows to carry first; the day waits.
                report.more = true;
                continue;
            }
        }
        // The fold may read a whole busy day: it holds no lock that stalls
        // anyone, so it gets longer than a request.
        match store
            .bounded_by(FOLD_DEADLINE, drop_day(store, day, today))
            .await?
        {
            DayFate::Dropped(deliveries, attempts) => {
                report.deliveries += deliveries;
                report.attempts += attempts;
                report.partitions_dropped += 1;
            }
            DayFate::Kept => {}
            DayFate::Busy => report.more = true,
        }
    }
    if events {
        let events = store
            .bounded(delete_events(store, policy.events_before, batch))
            .await?;
        report.events = u64::try_from(events).unwrap_or(0);
        if events >= batch {
            report.more = true;
        }
    }
    if !store.bounded(ensure_partitions(store)).await? {
        report.more = true;
    }
    Ok(report)
}

pub(crate) async fn daily_stats(
    store: &PgStore,
    sub_id: &SubscriptionId,
    since_day: NaiveDate,
) -> Result<Vec<DailyStats>> {
    // One statement, so one snapshot taken after its table locks: a
    // retention pass that folds and drops a day commits either wholly
    // before it (the fold is seen, the partition is gone) or after it.
    let rows = sqlx::query(
        "SELECT false AS folded, day, ms, n, delivered, failed, dead, NULL::text AS latency FROM ( \
             SELECT (a.started_at AT TIME ZONE 'UTC')::date AS day, a.duration_ms AS ms, \
                    count(*) AS n, \
                    count(*) FILTER (WHERE a.outcome = 'delivered') AS delivered, \
                    count(*) FILTER (WHERE a.outcome = 'failed') AS failed, \
                    count(*) FILTER (WHERE a.outcome = 'dead') AS dead \
             FROM deliveries d JOIN attempts a \
               ON a.delivery_id = d.delivery_id AND a.retain_from = d.retain_from \
             WHERE d.sub_id = $1 AND a.started_at >= $2 \
             GROUP BY 1, 2 \
         ) live \
         UNION ALL \
         SELECT true, day, NULL::bigint, attempts, delivered, failed, dead, latency::text \
         FROM daily_stats WHERE sub_id = $1 AND day >= $3",
    )
    .bind(sub_id.as_uuid())
    .bind(midnight(since_day))
    .bind(since_day)
    .fetch_all(&store.pool)
    .await
    .map_err(map)?;
    let mut by_day: BTreeMap<NaiveDate, DailyStats> = BTreeMap::new();
    let count = |row: &sqlx::postgres::PgRow, col: &str| -> Result<u64> {
        let n: i64 = row.try_get(col).map_err(map)?;
        Ok(u64::try_from(n).unwrap_or(0))
    };
    for row in &rows {
        let day: NaiveDate = row.try_get("day").map_err(map)?;
        let entry = by_day.entry(day).or_insert_with(|| DailyStats {
            day,
            attempts: 0,
            delivered: 0,
            failed: 0,
            dead: 0,
            latency_ms: Vec::new(),
        });
        let n = count(row, "n")?;
        entry.attempts += n;
        entry.delivered += count(row, "delivered")?;
        entry.failed += count(row, "failed")?;
        entry.dead += count(row, "dead")?;
        let folded: bool = row.try_get("folded").map_err(map)?;
        let pairs: Vec<(u64, u64)> = if folded {
            let text: String = row.try_get("latency").map_err(map)?;
            serde_json::from_str(&text).map_err(|e| {
                hookd_store::StoreError::Corrupt(format!("daily_stats latency: {e}"))
            })?
        } else {
            let ms: i64 = row.try_get("ms").map_err(map)?;
            vec![(u64::try_from(ms).unwrap_or(0), n)]
        };
        hookd_domain::stats::merge(&mut entry.latency_ms, &pairs);
    }
    Ok(by_day.into_values().filter(|d| d.attempts > 0).collect())
}
