//! Reading deliveries with their attempts: the delivery log.

use std::collections::HashMap;

use hookd_domain::DeliveryId;
use hookd_store::{Attempt, DeliveryDetail, DeliveryQuery, Result, StoreError};
use sqlx::{QueryBuilder, Sqlite, SqliteConnection};
use uuid::Uuid;

use crate::SqliteStore;
use crate::codec::{self, attempt_columns, delivery_columns, to_ms};
use crate::error::from_sqlx;

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
        for row in q.build().fetch_all(&mut *conn).await.map_err(from_sqlx)? {
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
