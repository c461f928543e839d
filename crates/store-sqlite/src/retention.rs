//! Retention (deleting what has expired, a batch at a time) and the daily
//! rollup it folds removed attempts into, so the rollup reads the same
//! before and after.

use std::collections::BTreeMap;

use chrono::NaiveDate;
use hookd_domain::SubscriptionId;
use hookd_store::{DailyStats, Result, RetentionPolicy, RetentionReport};
use sqlx::SqliteConnection;
use uuid::Uuid;

use crate::SqliteStore;
use crate::codec::to_ms;
use crate::error::{corrupt, from_sqlx};

/// The expired finished deliveries one call works on: the oldest `?2`
/// created before `?1`. Repeated word for word in each statement of one
/// transaction, so each sees the same rows.
macro_rules! chosen_deliveries {
    () => {
        "SELECT delivery_id FROM deliveries WHERE created_at < ?1 \
         AND state IN ('delivered', 'failed', 'dead') ORDER BY created_at, delivery_id LIMIT ?2"
    };
}

/// The attempts one call folds and removes: at most `?2`, of the chosen
/// deliveries.
macro_rules! chosen_attempts {
    () => {
        concat!(
            "SELECT a.attempt_id FROM attempts a WHERE a.delivery_id IN (",
            chosen_deliveries!(),
            ") ORDER BY a.delivery_id, a.attempt_id LIMIT ?2"
        )
    };
}

/// An attempt's UTC day, as the rollup keys it (`YYYY-MM-DD`).
macro_rules! attempt_day {
    () => {
        "date(a.started_at / 1000, 'unixepoch')"
    };
}

/// One subscription-day of the rollup, being added up.
#[derive(Default)]
struct Day {
    attempts: u64,
    delivered: u64,
    failed: u64,
    dead: u64,
    latency: BTreeMap<u64, u64>,
}

impl Day {
    fn add(&mut self, other: &Day) {
        self.attempts += other.attempts;
        self.delivered += other.delivered;
        self.failed += other.failed;
        self.dead += other.dead;
        for (ms, n) in &other.latency {
            *self.latency.entry(*ms).or_default() += n;
        }
    }

    fn latency_json(&self) -> String {
        let pairs: Vec<(u64, u64)> = self.latency.iter().map(|(m, n)| (*m, *n)).collect();
        serde_json::to_string(&pairs).expect("pairs of integers serialize")
    }
}

fn unsigned(n: i64, what: &str) -> Result<u64> {
    u64::try_from(n).map_err(|_| corrupt(what, n))
}

fn parse_day(day: &str) -> Result<NaiveDate> {
    NaiveDate::parse_from_str(day, "%Y-%m-%d").map_err(|e| corrupt("day", e))
}

/// A folded row as stored.
type FoldedRow = (String, i64, i64, i64, i64, String);

fn folded(row: FoldedRow) -> Result<(String, Day)> {
    let (day, attempts, delivered, failed, dead, latency) = row;
    let pairs: Vec<(u64, u64)> =
        serde_json::from_str(&latency).map_err(|e| corrupt("latency", e))?;
    Ok((
        day,
        Day {
            attempts: unsigned(attempts, "attempts")?,
            delivered: unsigned(delivered, "delivered")?,
            failed: unsigned(failed, "failed")?,
            dead: unsigned(dead, "dead")?,
            latency: pairs.into_iter().collect(),
        },
    ))
}

/// Live attempts grouped by day and duration, as stored.
type LiveRow = (String, i64, i64, i64, i64, i64);

/// Adds live rows `(day, duration, count, delivered, failed, dead)` into
/// `days`.
fn add_live<K: Ord>(
    days: &mut BTreeMap<K, Day>,
    key: impl Fn(&str) -> Result<K>,
    rows: Vec<LiveRow>,
) -> Result<()> {
    for (day, ms, n, delivered, failed, dead) in rows {
        let n = unsigned(n, "attempts")?;
        let d = days.entry(key(&day)?).or_default();
        d.attempts += n;
        d.delivered += unsigned(delivered, "delivered")?;
        d.failed += unsigned(failed, "failed")?;
        d.dead += unsigned(dead, "dead")?;
        *d.latency.entry(unsigned(ms, "duration_ms")?).or_default() += n;
    }
    Ok(())
}

/// The columns of a live group: count and outcomes, by day and duration.
macro_rules! live_columns {
    () => {
        concat!(
            attempt_day!(),
            " AS day, a.duration_ms, COUNT(*), \
             SUM(CASE WHEN a.outcome = 'delivered' THEN 1 ELSE 0 END), \
             SUM(CASE WHEN a.outcome = 'failed' THEN 1 ELSE 0 END), \
             SUM(CASE WHEN a.outcome = 'dead' THEN 1 ELSE 0 END)"
        )
    };
}

pub(crate) async fn daily_stats(
    store: &SqliteStore,
    sub_id: &SubscriptionId,
    since_day: NaiveDate,
) -> Result<Vec<DailyStats>> {
    let sub = *sub_id.as_uuid();
    let since_ms = to_ms(since_day.and_time(chrono::NaiveTime::MIN).and_utc());
    // One snapshot: an attempt is either folded or live, never both.
    let mut tx = store.read().await?;
    let rows: Vec<FoldedRow> = sqlx::query_as(
        "SELECT day, attempts, delivered, failed, dead, latency FROM daily_stats \
         WHERE sub_id = ? AND day >= ?",
    )
    .bind(sub)
    .bind(since_day.format("%Y-%m-%d").to_string())
    .fetch_all(&mut *tx)
    .await
    .map_err(from_sqlx)?;
    // `deliveries_sub` for the subscription's deliveries, then
    // `attempts_delivery` for each one's attempts.
    let live: Vec<LiveRow> = sqlx::query_as(concat!(
        "SELECT ",
        live_columns!(),
        " FROM deliveries d JOIN attempts a ON a.delivery_id = d.delivery_id \
         WHERE d.sub_id = ? AND a.started_at >= ? GROUP BY day, a.duration_ms"
    ))
    .bind(sub)
    .bind(since_ms)
    .fetch_all(&mut *tx)
    .await
    .map_err(from_sqlx)?;
    tx.commit().await.map_err(from_sqlx)?;

    let mut days: BTreeMap<NaiveDate, Day> = BTreeMap::new();
    for row in rows {
        let (day, d) = folded(row)?;
        days.entry(parse_day(&day)?).or_default().add(&d);
    }
    add_live(&mut days, parse_day, live)?;
    Ok(days
        .into_iter()
        .filter(|(day, d)| *day >= since_day && d.attempts > 0)
        .map(|(day, d)| DailyStats {
            day,
            attempts: d.attempts,
            delivered: d.delivered,
            failed: d.failed,
            dead: d.dead,
            latency_ms: d.latency.into_iter().collect(),
        })
        .collect())
}

/// Folds the attempts about to be removed into `daily_stats`.
async fn fold(conn: &mut SqliteConnection, before: i64, batch: i64) -> Result<()> {
    let rows: Vec<(Uuid, String, i64, i64, i64, i64, i64)> = sqlx::query_as(concat!(
        "SELECT d.sub_id, ",
        live_columns!(),
        " FROM attempts a JOIN deliveries d ON d.delivery_id = a.delivery_id \
         WHERE a.attempt_id IN (",
        chosen_attempts!(),
        ") GROUP BY d.sub_id, day, a.duration_ms"
    ))
    .bind(before)
    .bind(batch)
    .fetch_all(&mut *conn)
    .await
    .map_err(from_sqlx)?;
    let mut by_sub: BTreeMap<(Uuid, String), Day> = BTreeMap::new();
    for (sub, day, ms, n, delivered, failed, dead) in rows {
        add_live(
            &mut by_sub,
            |day| Ok((sub, day.to_owned())),
            vec![(day, ms, n, delivered, failed, dead)],
        )?;
    }
    for ((sub, day), add) in by_sub {
        let existing: Option<FoldedRow> = sqlx::query_as(
            "SELECT day, attempts, delivered, failed, dead, latency FROM daily_stats \
             WHERE sub_id = ? AND day = ?",
        )
        .bind(sub)
        .bind(&day)
        .fetch_optional(&mut *conn)
        .await
        .map_err(from_sqlx)?;
        let mut total = match existing {
            Some(row) => folded(row)?.1,
            None => Day::default(),
        };
        total.add(&add);
        let n = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
        sqlx::query(
            "INSERT INTO daily_stats (sub_id, day, attempts, delivered, failed, dead, latency) \
             VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (sub_id, day) DO UPDATE SET \
             attempts = excluded.attempts, delivered = excluded.delivered, \
             failed = excluded.failed, dead = excluded.dead, latency = excluded.latency",
        )
        .bind(sub)
        .bind(&day)
        .bind(n(total.attempts))
        .bind(n(total.delivered))
        .bind(n(total.failed))
        .bind(n(total.dead))
        .bind(total.latency_json())
        .execute(&mut *conn)
        .await
        .map_err(from_sqlx)?;
    }
    Ok(())
}

pub(crate) async fn enforce(
    store: &SqliteStore,
    policy: &RetentionPolicy,
) -> Result<RetentionReport> {
    if policy.batch == 0 {
        return Ok(RetentionReport::default());
    }
    let batch = i64::from(policy.batch);
    let before = to_ms(policy.deliveries_before);
    let mut tx = store.write().await?;

    let chosen: i64 =
        sqlx::query_scalar(concat!("SELECT COUNT(*) FROM (", chosen_deliveries!(), ")"))
            .bind(before)
            .bind(batch)
            .fetch_one(&mut *tx)
            .await
            .map_err(from_sqlx)?;
    // Attempts first, folded in the same transaction that removes them; a
    // delivery goes once none of its attempts is left (a delivery with more
    // attempts than a batch takes several calls).
    fold(&mut tx, before, batch).await?;
    let attempts = sqlx::query(concat!(
        "DELETE FROM attempts WHERE attempt_id IN (",
        chosen_attempts!(),
        ")"
    ))
    .bind(before)
    .bind(batch)
    .execute(&mut *tx)
    .await
    .map_err(from_sqlx)?
    .rows_affected();
    let deliveries = sqlx::query(concat!(
        "DELETE FROM deliveries WHERE delivery_id IN (",
        chosen_deliveries!(),
        ") AND NOT EXISTS (SELECT 1 FROM attempts a WHERE a.delivery_id = deliveries.delivery_id)"
    ))
    .bind(before)
    .bind(batch)
    .execute(&mut *tx)
    .await
    .map_err(from_sqlx)?
    .rows_affected();
    // Events no delivery refers to (the UNIQUE (event_id, sub_id) index
    // answers "does any?") and no unfinished fan-out job will (a finished
    // job goes with its event).
    let events = sqlx::query(
        "DELETE FROM events WHERE event_id IN ( \
             SELECT e.event_id FROM events e WHERE e.created_at < ?1 \
             AND NOT EXISTS (SELECT 1 FROM deliveries d WHERE d.event_id = e.event_id) \
             AND NOT EXISTS (SELECT 1 FROM fanout_jobs j \
                 WHERE j.event_id = e.event_id AND j.finished_at IS NULL) \
             ORDER BY e.created_at LIMIT ?2)",
    )
    .bind(to_ms(policy.events_before))
    .bind(batch)
    .execute(&mut *tx)
    .await
    .map_err(from_sqlx)?
    .rows_affected();
    tx.commit().await.map_err(from_sqlx)?;
    let full = |n: u64| n >= u64::from(policy.batch);
    Ok(RetentionReport {
        deliveries,
        attempts,
        events,
        partitions_dropped: 0,
        more: full(unsigned(chosen, "count")?) || full(attempts) || full(events),
    })
}
