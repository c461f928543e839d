//! Node heartbeats. On SQLite only one process opens the file, so there is
//! one live node; the table keeps the contract the same as PostgreSQL's.

use std::time::Duration;

use hookd_store::{NODE_FORGET_FACTOR, NodeHeartbeat, NodeInfo, NodeRole, Result};
use sqlx::Row;

use crate::SqliteStore;
use crate::codec::{duration_ms, from_ms, now_ms, to_ms};
use crate::error::{corrupt, from_sqlx};

pub(crate) async fn heartbeat(
    store: &SqliteStore,
    node: &NodeHeartbeat,
    live_within: Duration,
) -> Result<u32> {
    let now = now_ms();
    let live = duration_ms(live_within);
    let forget = duration_ms(live_within.saturating_mul(NODE_FORGET_FACTOR));
    let mut tx = store.write().await?;
    sqlx::query(
        "INSERT INTO nodes (node_id, role, started_at, last_seen, open_circuits) \
         VALUES (?, ?, ?, ?, ?) \
         ON CONFLICT (node_id) DO UPDATE SET role = excluded.role, \
           started_at = excluded.started_at, last_seen = excluded.last_seen, \
           open_circuits = excluded.open_circuits",
    )
    .bind(&node.node_id)
    .bind(node.role.as_str())
    .bind(to_ms(node.started_at))
    .bind(now)
    .bind(serde_json::to_string(&node.open_circuits).expect("host names serialize as strings"))
    .execute(&mut *tx)
    .await
    .map_err(from_sqlx)?;
    sqlx::query("DELETE FROM nodes WHERE last_seen < ?")
        .bind(now.saturating_sub(forget))
        .execute(&mut *tx)
        .await
        .map_err(from_sqlx)?;
    let live: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM nodes WHERE role IN ('worker', 'all') AND last_seen >= ?",
    )
    .bind(now.saturating_sub(live))
    .fetch_one(&mut *tx)
    .await
    .map_err(from_sqlx)?;
    tx.commit().await.map_err(from_sqlx)?;
    Ok(u32::try_from(live).unwrap_or(u32::MAX))
}

pub(crate) async fn forget(store: &SqliteStore, node_id: &str) -> Result<bool> {
    let mut tx = store.write().await?;
    let res = sqlx::query("DELETE FROM nodes WHERE node_id = ?")
        .bind(node_id)
        .execute(&mut *tx)
        .await
        .map_err(from_sqlx)?;
    tx.commit().await.map_err(from_sqlx)?;
    Ok(res.rows_affected() == 1)
}

pub(crate) async fn list(store: &SqliteStore) -> Result<Vec<NodeInfo>> {
    let rows = sqlx::query(
        "SELECT node_id, role, started_at, last_seen, open_circuits FROM nodes ORDER BY node_id",
    )
    .fetch_all(&store.reader)
    .await
    .map_err(from_sqlx)?;
    rows.iter()
        .map(|row| {
            let role: String = row.try_get("role").map_err(from_sqlx)?;
            Ok(NodeInfo {
                node_id: row.try_get("node_id").map_err(from_sqlx)?,
                role: NodeRole::parse(&role)
                    .ok_or_else(|| corrupt("nodes.role", format_args!("`{role}`")))?,
                started_at: from_ms(
                    row.try_get("started_at").map_err(from_sqlx)?,
                    "nodes.started_at",
                )?,
                last_seen: from_ms(
                    row.try_get("last_seen").map_err(from_sqlx)?,
                    "nodes.last_seen",
                )?,
                open_circuits: serde_json::from_str(
                    &row.try_get::<String, _>("open_circuits")
                        .map_err(from_sqlx)?,
                )
                .map_err(|e| corrupt("nodes.open_circuits", e))?,
            })
        })
        .collect()
}
