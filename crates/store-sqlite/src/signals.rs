//! Signals (conditions of a subscription that hookd announces once), and
//! the reads the monitors that raise them need: backlogs and failing
//! streaks.

use hookd_domain::SubscriptionId;
use hookd_domain::Timestamp;
use hookd_domain::subscription::SubscriptionState;
use hookd_store::{Backlog, Notice, RaisedSignal, Result, SignalKind, StoreError};
use sqlx::SqliteConnection;
use uuid::Uuid;

use crate::SqliteStore;
use crate::codec::{from_ms, now_ms, to_ms};
use crate::error::{corrupt, from_sqlx};
use crate::{ingest, subscriptions};

pub(crate) async fn raise(
    store: &SqliteStore,
    sub_id: &SubscriptionId,
    kind: SignalKind,
    detail: &str,
    notice: Option<Notice>,
) -> Result<bool> {
    // Under the write lock, "is it raised with this detail?" and "raise it"
    // cannot interleave with another raise: of N concurrent raises, one
    // raises it (and accepts its notice), the rest find it raised.
    // Subscriptions (and so the generation) change: see `GenerationCache`.
    let ended = store.generation.invalidate_on_drop();
    let mut tx = store.write().await?;
    let now = now_ms();
    let sub = subscriptions::fetch(&mut *tx, &store.keyring, sub_id)
        .await?
        .ok_or(StoreError::NotFound)?;
    let current: Option<String> =
        sqlx::query_scalar("SELECT detail FROM subscription_signals WHERE sub_id = ? AND kind = ?")
            .bind(sub_id.as_uuid())
            .bind(kind.as_str())
            .fetch_optional(&mut *tx)
            .await
            .map_err(from_sqlx)?;
    if current.as_deref() == Some(detail) {
        return Ok(false);
    }
    sqlx::query(
        "INSERT INTO subscription_signals (sub_id, kind, detail, raised_at) VALUES (?, ?, ?, ?) \
         ON CONFLICT (sub_id, kind) DO UPDATE SET detail = excluded.detail, raised_at = excluded.raised_at",
    )
    .bind(sub_id.as_uuid())
    .bind(kind.as_str())
    .bind(detail)
    .bind(now)
    .execute(&mut *tx)
    .await
    .map_err(from_sqlx)?;
    if kind == SignalKind::Disabled && sub.state == SubscriptionState::Active {
        sqlx::query("UPDATE subscriptions SET state = 'disabled', updated_at = ? WHERE sub_id = ?")
            .bind(now)
            .bind(sub_id.as_uuid())
            .execute(&mut *tx)
            .await
            .map_err(from_sqlx)?;
        subscriptions::bump_generation(&mut tx, &ended).await?;
    }
    if let Some(notice) = notice {
        // Exactly as accept_event: a key already taken writes nothing, yet
        // the signal is raised.
        ingest::accept_in(
            &mut tx,
            now,
            &notice.event,
            &notice.deliveries,
            store.fanout,
        )
        .await?;
    }
    tx.commit().await.map_err(from_sqlx)?;
    Ok(true)
}

pub(crate) async fn lower(
    store: &SqliteStore,
    sub_id: &SubscriptionId,
    kind: SignalKind,
) -> Result<bool> {
    let mut tx = store.write().await?;
    let done = sqlx::query("DELETE FROM subscription_signals WHERE sub_id = ? AND kind = ?")
        .bind(sub_id.as_uuid())
        .bind(kind.as_str())
        .execute(&mut *tx)
        .await
        .map_err(from_sqlx)?;
    tx.commit().await.map_err(from_sqlx)?;
    Ok(done.rows_affected() == 1)
}

type SignalRow = (Uuid, String, String, i64);

fn decode(rows: Vec<SignalRow>) -> Result<Vec<RaisedSignal>> {
    let mut out = rows
        .into_iter()
        .map(|(sub, kind, detail, raised_at)| {
            Ok(RaisedSignal {
                sub_id: SubscriptionId::from_uuid(sub),
                kind: SignalKind::parse(&kind).ok_or_else(|| corrupt("kind", &kind))?,
                detail,
                raised_at: from_ms(raised_at, "raised_at")?,
            })
        })
        .collect::<Result<Vec<_>>>()?;
    // By subscription, then by kind in `SignalKind`'s own order (not the
    // names' alphabetical one).
    out.sort_by_key(|s| (s.sub_id, s.kind));
    Ok(out)
}

pub(crate) async fn raised(
    store: &SqliteStore,
    kind: Option<SignalKind>,
) -> Result<Vec<RaisedSignal>> {
    let rows: Vec<SignalRow> = sqlx::query_as(
        "SELECT g.sub_id, g.kind, g.detail, g.raised_at FROM subscription_signals g \
         JOIN subscriptions s ON s.sub_id = g.sub_id \
         WHERE s.state <> 'deleted' AND (?1 IS NULL OR g.kind = ?1)",
    )
    .bind(kind.map(SignalKind::as_str))
    .fetch_all(&store.reader)
    .await
    .map_err(from_sqlx)?;
    decode(rows)
}

/// One subscription's raised signals, by kind (for its health).
pub(crate) async fn of(conn: &mut SqliteConnection, sub: &Uuid) -> Result<Vec<RaisedSignal>> {
    let rows: Vec<SignalRow> = sqlx::query_as(
        "SELECT sub_id, kind, detail, raised_at FROM subscription_signals WHERE sub_id = ?",
    )
    .bind(sub)
    .fetch_all(conn)
    .await
    .map_err(from_sqlx)?;
    decode(rows)
}

pub(crate) async fn backlogs(store: &SqliteStore) -> Result<Vec<Backlog>> {
    // `deliveries_unfinished` holds exactly these rows; the WHERE repeats
    // its predicate so the planner uses it.
    let rows: Vec<(Uuid, i64)> = sqlx::query_as(
        "SELECT d.sub_id, COUNT(*) FROM deliveries d JOIN subscriptions s ON s.sub_id = d.sub_id \
         WHERE d.state IN ('pending', 'inflight') AND s.state <> 'deleted' \
         GROUP BY d.sub_id ORDER BY d.sub_id",
    )
    .fetch_all(&store.reader)
    .await
    .map_err(from_sqlx)?;
    rows.into_iter()
        .map(|(sub, n)| {
            Ok(Backlog {
                sub_id: SubscriptionId::from_uuid(sub),
                unfinished: u64::try_from(n).map_err(|_| corrupt("count", n))?,
            })
        })
        .collect()
}

pub(crate) async fn failing(
    store: &SqliteStore,
    started_at_or_before: Timestamp,
) -> Result<Vec<SubscriptionId>> {
    let rows: Vec<Uuid> = sqlx::query_scalar(
        "SELECT sub_id FROM subscriptions WHERE state = 'active' \
         AND failing_since IS NOT NULL AND failing_since <= ? ORDER BY sub_id",
    )
    .bind(to_ms(started_at_or_before))
    .fetch_all(&store.reader)
    .await
    .map_err(from_sqlx)?;
    Ok(rows.into_iter().map(SubscriptionId::from_uuid).collect())
}
