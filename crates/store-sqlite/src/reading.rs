//! Reading deliveries with their attempts (the delivery log), and a
//! subscription's delivery health.

use std::collections::HashMap;

use hookd_domain::delivery::ErrorClass;
use hookd_domain::{DeliveryId, SubscriptionId, Timestamp};
use hookd_store::{
    Attempt, AttemptCount, DeliveryDetail, DeliveryQuery, Result, StoreError, SubscriptionHealth,
};
use sqlx::{QueryBuilder, Sqlite, SqliteConnection};
use uuid::Uuid;

use crate::codec::{self, attempt_columns, delivery_columns, from_ms, to_ms};
use crate::error::{corrupt, from_sqlx};
use crate::{SqliteStore, keep_prepared};

/// Ids per `IN (…)` list, far below SQLite's limit on bound values; a page
/// of the delivery log fits in one statement.
const IDS_PER_QUERY: usize = 1000;

/// The attempts of `ids`, oldest first, by delivery: one query for a page,
/// not one per delivery.
async fn attempts_of(
    conn: &mut SqliteConnection,
    ids: &[Uuid],
) -> Result<HashMap<Uuid, Vec<Attempt>>> {
    let mut by_delivery: HashMap<Uuid, Vec<Attempt>> = HashMap::new();
    for chunk in ids.chunks(IDS_PER_QUERY) {
        let mut q = QueryBuilder::<Sqlite>::new(concat!(
            "SELECT ",
            attempt_columns!(),
            " FROM attempts a WHERE a.delivery_id IN ("
        ));
        let mut list = q.separated(", ");
        for id in chunk {
            list.push_bind(*id);
        }
        q.push(") ORDER BY a.attempt_id");
        let q = q
            .build()
            .persistent(keep_prepared(chunk.len(), IDS_PER_QUERY));
        for row in q.fetch_all(&mut *conn).await.map_err(from_sqlx)? {
            let (delivery_id, attempt) = codec::attempt(&row)?;
            by_delivery.entry(delivery_id).or_default().push(attempt);
        }
    }
    Ok(by_delivery)
}

pub(crate) async fn get_delivery(store: &SqliteStore, id: &DeliveryId) -> Result<DeliveryDetail> {
    let mut tx = store.read().await?;
    let row = sqlx::query(concat!(
        "SELECT ",
        delivery_columns!(),
        " FROM deliveries d WHERE d.delivery_id = ?"
    ))
    .bind(id.as_uuid())
    .fetch_optional(&mut *tx)
    .await
    .map_err(from_sqlx)?
    .ok_or(StoreError::NotFound)?;
    let (delivery, _) = codec::delivery(&row)?;
    let attempts = attempts_of(&mut tx, &[*id.as_uuid()])
        .await?
        .remove(id.as_uuid())
        .unwrap_or_default();
    tx.commit().await.map_err(from_sqlx)?;
    Ok(DeliveryDetail { delivery, attempts })
}

pub(crate) async fn list_deliveries(
    store: &SqliteStore,
    query: &DeliveryQuery,
) -> Result<Vec<DeliveryDetail>> {
    let mut q = QueryBuilder::<Sqlite>::new(concat!(
        "SELECT ",
        delivery_columns!(),
        " FROM deliveries d WHERE 1 = 1"
    ));
    if let Some(sub_id) = &query.sub_id {
        q.push(" AND d.sub_id = ").push_bind(*sub_id.as_uuid());
    }
    if let Some(event_id) = &query.event_id {
        q.push(" AND d.event_id = ").push_bind(*event_id.as_uuid());
    }
    if let Some(state) = query.state {
        q.push(" AND d.state = ").push_bind(state.as_str());
    }
    if let Some(since) = query.since {
        q.push(" AND d.created_at >= ").push_bind(to_ms(since));
    }
    if let Some(until) = query.until {
        q.push(" AND d.created_at < ").push_bind(to_ms(until));
    }
    if let Some(event_type) = &query.event_type {
        q.push(" AND d.event_type = ")
            .push_bind(event_type.as_str().to_owned());
    }
    if let Some(cursor) = &query.cursor {
        q.push(" AND d.delivery_id < ").push_bind(*cursor.as_uuid());
    }
    // Ids are UUIDv7, so newest first by id is newest first by creation,
    // and the last id of a page is the next page's cursor.
    q.push(" ORDER BY d.delivery_id DESC LIMIT ")
        .push_bind(i64::from(query.limit));

    let mut tx = store.read().await?;
    let mut page = Vec::new();
    for row in q.build().fetch_all(&mut *tx).await.map_err(from_sqlx)? {
        page.push(codec::delivery(&row)?.0);
    }
    let ids: Vec<Uuid> = page.iter().map(|d| *d.id.as_uuid()).collect();
    let mut attempts = attempts_of(&mut tx, &ids).await?;
    tx.commit().await.map_err(from_sqlx)?;
    Ok(page
        .into_iter()
        .map(|delivery| {
            let attempts = attempts.remove(delivery.id.as_uuid()).unwrap_or_default();
            DeliveryDetail { delivery, attempts }
        })
        .collect())
}

pub(crate) async fn subscription_health(
    store: &SqliteStore,
    sub_id: &SubscriptionId,
    since: Timestamp,
) -> Result<SubscriptionHealth> {
    let sub = *sub_id.as_uuid();
    let mut tx = store.read().await?;
    sqlx::query("SELECT 1 FROM subscriptions WHERE sub_id = ? AND state <> 'deleted'")
        .bind(sub)
        .fetch_optional(&mut *tx)
        .await
        .map_err(from_sqlx)?
        .ok_or(StoreError::NotFound)?;

    // The partial index `deliveries_unfinished` holds exactly these rows;
    // the WHERE repeats its predicate word for word so the planner uses it.
    let (pending, oldest_pending): (i64, Option<i64>) = sqlx::query_as(
        "SELECT COUNT(*), MIN(created_at) FROM deliveries \
         WHERE sub_id = ? AND state IN ('pending', 'inflight')",
    )
    .bind(sub)
    .fetch_one(&mut *tx)
    .await
    .map_err(from_sqlx)?;
    // `deliveries_sub`: the subscription's own rows only.
    let (dead, oldest_dead): (i64, Option<i64>) = sqlx::query_as(
        "SELECT COUNT(*), MIN(updated_at) FROM deliveries WHERE sub_id = ? AND state = 'dead'",
    )
    .bind(sub)
    .fetch_one(&mut *tx)
    .await
    .map_err(from_sqlx)?;
    // `deliveries_sub` for the subscription's deliveries, then
    // `attempts_delivery` for each one's attempts.
    let rows: Vec<(Option<i64>, Option<String>, i64)> = sqlx::query_as(
        "SELECT a.status, a.error_class, COUNT(*) FROM deliveries d \
         JOIN attempts a ON a.delivery_id = d.delivery_id \
         WHERE d.sub_id = ? AND a.started_at >= ? \
         GROUP BY a.status, a.error_class \
         ORDER BY a.status IS NULL, a.status, a.error_class",
    )
    .bind(sub)
    .bind(to_ms(since))
    .fetch_all(&mut *tx)
    .await
    .map_err(from_sqlx)?;
    let signals = crate::signals::of(&mut tx, &sub).await?;
    tx.commit().await.map_err(from_sqlx)?;

    let mut attempts = Vec::with_capacity(rows.len());
    for (status, class, n) in rows {
        attempts.push(AttemptCount {
            status: status
                .map(|s| u16::try_from(s).map_err(|_| corrupt("a_status", s)))
                .transpose()?,
            error_class: class
                .map(|c| ErrorClass::parse(&c).ok_or_else(|| corrupt("a_error_class", &c)))
                .transpose()?,
            count: count(n)?,
        });
    }
    Ok(SubscriptionHealth {
        pending_count: count(pending)?,
        oldest_pending_created_at: oldest_pending
            .map(|t| from_ms(t, "created_at"))
            .transpose()?,
        dead_count: count(dead)?,
        oldest_dead_at: oldest_dead.map(|t| from_ms(t, "updated_at")).transpose()?,
        attempts,
        signals,
    })
}

fn count(n: i64) -> Result<u64> {
    u64::try_from(n).map_err(|_| corrupt("count", n))
}
