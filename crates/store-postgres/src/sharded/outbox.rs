//! The SQL of a sharded deployment: the control database's ingest outbox
//! and shard map, and each shard's idempotent write of an event's part.

use std::collections::HashSet;
use std::time::Duration;

use hookd_domain::{CustomerId, EventId, Timestamp};
use hookd_store::fanout::{decode_batch, encode_batch};
use hookd_store::{NewDelivery, NewEvent, Result};
use sqlx::{Postgres, Row, Transaction};
use uuid::Uuid;

use crate::error::map;
use crate::rows::{self, event_cols};
use crate::store::{begin, commit, insert_delivery_rows, with_partitions};
use crate::{PgStore, Writes};

/// An accepted event and the deliveries a shard (or the outbox) holds for
/// it.
pub type Part = (NewEvent, Vec<NewDelivery>);

/// Writes each event's planned deliveries into the control database's
/// outbox, inside ingest's transaction (the event rows are written
/// already). Refuses, as writing the rows would, a delivery naming an
/// unknown subscription or two deliveries of one event naming one
/// subscription: the outbox must never hold a delivery no shard can write.
/// An error leaves the transaction aborted: the caller must drop it.
pub(crate) async fn write(
    tx: &mut Transaction<'_, Postgres>,
    items: &[(&NewEvent, &[NewDelivery])],
) -> Result<()> {
    let items: Vec<_> = items.iter().filter(|(_, d)| !d.is_empty()).collect();
    if items.is_empty() {
        return Ok(());
    }
    let subs: Vec<Uuid> = items
        .iter()
        .flat_map(|(_, ds)| ds.iter().map(|d| *d.sub_id.as_uuid()))
        .collect::<HashSet<_>>()
        .into_iter()
        .collect();
    let known: HashSet<Uuid> =
        sqlx::query_scalar("SELECT sub_id FROM subscriptions WHERE sub_id = ANY($1)")
            .bind(&subs)
            .fetch_all(&mut **tx)
            .await
            .map_err(map)?
            .into_iter()
            .collect();
    for (_, deliveries) in &items {
        crate::fanout::check_deliveries(&known, deliveries)?;
    }
    sqlx::query(
        "INSERT INTO shard_outbox (event_id, deliveries) \
         SELECT * FROM unnest($1::uuid[], $2::bytea[])",
    )
    .bind(
        items
            .iter()
            .map(|(e, _)| *e.id.as_uuid())
            .collect::<Vec<_>>(),
    )
    .bind(
        items
            .iter()
            .map(|(_, d)| encode_batch(d))
            .collect::<Vec<_>>(),
    )
    .execute(&mut **tx)
    .await
    .map_err(map)?;
    Ok(())
}

/// Outbox entries on the control database: those of `ids` when given,
/// else those at least `older_than` old (database clock), oldest first, at
/// most `limit`. Each with its event as ingest accepted it.
pub(crate) async fn pending(
    control: &PgStore,
    ids: Option<&[EventId]>,
    older_than: Duration,
    limit: u32,
) -> Result<Vec<Part>> {
    control
        .bounded(async {
            let ids: Option<Vec<Uuid>> = ids.map(|ids| ids.iter().map(|i| *i.as_uuid()).collect());
            let rows = sqlx::query(concat!(
                "SELECT ",
                event_cols!(),
                ", o.deliveries AS o_deliveries FROM shard_outbox o \
                 JOIN events e ON e.event_id = o.event_id \
                 WHERE ($1::uuid[] IS NULL OR o.event_id = ANY($1)) \
                   AND o.created_at <= now() - make_interval(secs => $2) \
                 ORDER BY o.created_at LIMIT $3"
            ))
            .bind(ids)
            .bind(older_than.as_secs_f64())
            .bind(i64::from(limit))
            .fetch_all(&control.pool)
            .await
            .map_err(map)?;
            rows.iter()
                .map(|row| {
                    let event = rows::event(row)?;
                    let bytes: Vec<u8> = row.try_get("o_deliveries").map_err(map)?;
                    Ok((
                        NewEvent {
                            id: event.id,
                            event_type: event.event_type,
                            payload: event.payload,
                            idempotency_key: event.idempotency_key,
                            customer_id: event.customer_id,
                        },
                        decode_batch(&bytes)?,
                    ))
                })
                .collect()
        })
        .await
}

/// Removes finished entries from the control database's outbox.
pub(crate) async fn finish(control: &PgStore, ids: &[EventId]) -> Result<u64> {
    if ids.is_empty() {
        return Ok(0);
    }
    control
        .bounded(async {
            let done = sqlx::query("DELETE FROM shard_outbox WHERE event_id = ANY($1)")
                .bind(ids.iter().map(|i| *i.as_uuid()).collect::<Vec<_>>())
                .execute(&control.pool)
                .await
                .map_err(map)?;
            Ok(done.rows_affected())
        })
        .await
}

/// Writes events' parts on one shard, in ONE transaction, each at most
/// once ever: a part whose event this shard has recorded (`shard_parts`)
/// is skipped whole, so writing it again after a crash creates nothing
/// twice. For each new part: a copy of the event (without its idempotency
/// key: keys are the control database's business, and a copy must never
/// collide with a later event reusing an expired key), then its
/// deliveries, as rows or, over the shard's lazy fan-out threshold, as a
/// fan-out job. Returns how many parts were new.
pub(crate) async fn write_parts(shard: &PgStore, parts: &[Part]) -> Result<usize> {
    if parts.is_empty() {
        return Ok(0);
    }
    shard
        .bounded(with_partitions(shard, || async move {
            let mut tx = begin(shard).await?;
            let ids: Vec<Uuid> = parts.iter().map(|(e, _)| *e.id.as_uuid()).collect();
            let fresh: HashSet<Uuid> = sqlx::query_scalar(
                "INSERT INTO shard_parts (event_id) SELECT unnest($1::uuid[]) \
                 ON CONFLICT DO NOTHING RETURNING event_id",
            )
            .bind(&ids)
            .fetch_all(&mut *tx)
            .await
            .map_err(map)?
            .into_iter()
            .collect();
            let todo: Vec<&Part> = parts
                .iter()
                .filter(|(e, _)| fresh.contains(e.id.as_uuid()))
                .collect();
            if todo.is_empty() {
                return Ok(0);
            }
            // When the control database doubles as this shard the event row
            // is there already: skipped (no conflict target: any key).
            sqlx::query(
                "INSERT INTO events (event_id, type, payload, idempotency_key, customer_id) \
                 SELECT u.event_id, u.type, u.payload, NULL, u.customer_id \
                 FROM unnest($1::uuid[], $2::text[], $3::text[], $4::text[]) \
                   AS u(event_id, type, payload, customer_id) \
                 ON CONFLICT DO NOTHING",
            )
            .bind(
                todo.iter()
                    .map(|(e, _)| *e.id.as_uuid())
                    .collect::<Vec<_>>(),
            )
            .bind(
                todo.iter()
                    .map(|(e, _)| e.event_type.as_str())
                    .collect::<Vec<_>>(),
            )
            .bind(
                todo.iter()
                    .map(|(e, _)| e.payload.as_str())
                    .collect::<Vec<_>>(),
            )
            .bind(
                todo.iter()
                    .map(|(e, _)| e.customer_id.as_ref().map(CustomerId::as_str))
                    .collect::<Vec<_>>(),
            )
            .execute(&mut *tx)
            .await
            .map_err(map)?;
            let mut rows = Vec::new();
            for (event, deliveries) in &todo {
                match shard.writes() {
                    Writes::Here(fanout) if fanout.is_lazy(deliveries.len()) => {
                        crate::fanout::write_job(&mut tx, event, deliveries, fanout).await?;
                    }
                    _ => rows.extend(deliveries.iter().map(|d| (event, d))),
                }
            }
            insert_delivery_rows(&mut tx, &rows).await?;
            commit(tx).await?;
            shard.wrote_deliveries(rows.len());
            Ok(todo.len())
        }))
        .await
}

/// Forgets which parts a shard wrote before `before`: long after their
/// outbox entries went (retention).
pub(crate) async fn forget_parts(shard: &PgStore, before: Timestamp) -> Result<u64> {
    shard
        .bounded(async {
            let gone = sqlx::query("DELETE FROM shard_parts WHERE created_at < $1")
                .bind(before)
                .execute(&shard.pool)
                .await
                .map_err(map)?;
            Ok(gone.rows_affected())
        })
        .await
}

/// A destination host's attempts that started at or after `since` on one
/// shard: how many, and how many got no 2xx.
pub(crate) async fn host_attempts(
    shard: &PgStore,
    host: &str,
    since: Timestamp,
) -> Result<(u64, u64)> {
    shard
        .bounded(async {
            let (total, failed): (i64, i64) = sqlx::query_as(
                "SELECT count(*), count(*) FILTER (WHERE a.status IS NULL OR a.status NOT BETWEEN 200 AND 299) \
                 FROM attempts a JOIN deliveries d ON d.delivery_id = a.delivery_id \
                 WHERE d.destination_host = $1 AND a.started_at >= $2",
            )
            .bind(host)
            .bind(since)
            .fetch_one(&shard.pool)
            .await
            .map_err(map)?;
            Ok((
                u64::try_from(total).unwrap_or(0),
                u64::try_from(failed).unwrap_or(0),
            ))
        })
        .await
}

/// The shard map as the control database stores it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShardMap {
    /// Bumped by every change; every node reads the highest.
    pub version: i64,
    /// The shards' URLs; a shard's index in this list is its identity for
    /// placement, so the list only ever grows at the end.
    pub shards: Vec<String>,
    /// Hosts split by (host, subscription) (`hookd shards split`).
    pub split_hosts: Vec<String>,
}

/// The newest shard map, if one was ever stored.
pub(crate) async fn load_map(control: &PgStore) -> Result<Option<ShardMap>> {
    control
        .bounded(async {
            let row: Option<(i64, Vec<String>, Vec<String>)> = sqlx::query_as(
                "SELECT version, shards, split_hosts FROM shard_map ORDER BY version DESC LIMIT 1",
            )
            .fetch_optional(&control.pool)
            .await
            .map_err(map)?;
            Ok(row.map(|(version, shards, split_hosts)| ShardMap {
                version,
                shards,
                split_hosts,
            }))
        })
        .await
}

/// The newest map's version (cheap: for every node's periodic check).
pub(crate) async fn map_version(control: &PgStore) -> Result<Option<i64>> {
    control
        .bounded(async {
            sqlx::query_scalar("SELECT max(version) FROM shard_map")
                .fetch_one(&control.pool)
                .await
                .map_err(map)
        })
        .await
}

/// Stores `map` as the next version. `false` if another node stored that
/// version first (read the map again and decide anew).
pub(crate) async fn save_map(control: &PgStore, map_: &ShardMap) -> Result<bool> {
    control
        .bounded(async {
            let done = sqlx::query(
                "INSERT INTO shard_map (version, shards, split_hosts) VALUES ($1, $2, $3) \
                 ON CONFLICT (version) DO NOTHING",
            )
            .bind(map_.version)
            .bind(&map_.shards)
            .bind(&map_.split_hosts)
            .execute(&control.pool)
            .await
            .map_err(map)?;
            Ok(done.rows_affected() == 1)
        })
        .await
}
