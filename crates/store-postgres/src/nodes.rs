//! Node heartbeats: who shares this database, on the database's clock.

use std::time::Duration;

use hookd_domain::Timestamp;
use hookd_store::{NODE_FORGET_FACTOR, NodeHeartbeat, NodeInfo, NodeRole, Result, StoreError};
use sqlx::Row;

use crate::PgStore;
use crate::error::map;

fn micros(d: Duration) -> i64 {
    i64::try_from(d.as_micros()).unwrap_or(i64::MAX)
}

pub(crate) async fn heartbeat(
    store: &PgStore,
    node: &NodeHeartbeat,
    live_within: Duration,
) -> Result<u32> {
    let forget = live_within.saturating_mul(NODE_FORGET_FACTOR);
    let mut tx = store.pool.begin().await.map_err(map)?;
    sqlx::query(
        "INSERT INTO nodes (node_id, role, started_at, last_seen, open_circuits) \
         VALUES ($1, $2, $3, now(), $4) \
         ON CONFLICT (node_id) DO UPDATE SET role = excluded.role, \
           started_at = excluded.started_at, last_seen = excluded.last_seen, \
           open_circuits = excluded.open_circuits",
    )
    .bind(&node.node_id)
    .bind(node.role.as_str())
    .bind(node.started_at)
    .bind(&node.open_circuits)
    .execute(&mut *tx)
    .await
    .map_err(map)?;
    sqlx::query("DELETE FROM nodes WHERE last_seen < now() - $1 * interval '1 microsecond'")
        .bind(micros(forget))
        .execute(&mut *tx)
        .await
        .map_err(map)?;
    let live: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM nodes WHERE role IN ('worker', 'all') \
           AND last_seen >= now() - $1 * interval '1 microsecond'",
    )
    .bind(micros(live_within))
    .fetch_one(&mut *tx)
    .await
    .map_err(map)?;
    tx.commit().await.map_err(map)?;
    Ok(u32::try_from(live).unwrap_or(u32::MAX))
}

pub(crate) async fn forget(store: &PgStore, node_id: &str) -> Result<bool> {
    let res = sqlx::query("DELETE FROM nodes WHERE node_id = $1")
        .bind(node_id)
        .execute(&store.pool)
        .await
        .map_err(map)?;
    Ok(res.rows_affected() == 1)
}

pub(crate) async fn list(store: &PgStore) -> Result<Vec<NodeInfo>> {
    let rows = sqlx::query(
        "SELECT node_id, role, started_at, last_seen, open_circuits FROM nodes ORDER BY node_id",
    )
    .fetch_all(&store.pool)
    .await
    .map_err(map)?;
    rows.iter()
        .map(|row| {
            let role: String = row.try_get("role").map_err(map)?;
            Ok(NodeInfo {
                node_id: row.try_get("node_id").map_err(map)?,
                role: NodeRole::parse(&role).ok_or_else(|| {
                    StoreError::Corrupt(format!("nodes.role: unknown role `{role}`"))
                })?,
                started_at: row.try_get::<Timestamp, _>("started_at").map_err(map)?,
                last_seen: row.try_get::<Timestamp, _>("last_seen").map_err(map)?,
                open_circuits: row.try_get("open_circuits").map_err(map)?,
            })
        })
        .collect()
}
