//! Subscriptions: create, read, update, delete (a tombstone), and the
//! generation counter that tells ingest its fan-out index is stale.

use hookd_domain::SubscriptionId;
use hookd_domain::subscription::SubscriptionState;
use hookd_store::crypto::Keyring;
use hookd_store::{
    NewSubscription, Result, SignalKind, StoreError, Subscription, SubscriptionPatch,
    SubscriptionQuery,
};
use sqlx::{QueryBuilder, Sqlite, SqliteConnection, SqliteExecutor};

use crate::SqliteStore;
use crate::codec::{self, encode_patterns, now_ms, seal, subscription_columns, to_ms};
use crate::error::from_sqlx;
use crate::process_lock::InvalidateOnDrop;

/// The last error of pending deliveries failed by a delete, and the conflict
/// a replay of a deleted subscription's delivery reports (the trait's words).
pub(crate) const DELETED: &str = "subscription deleted";

/// One subscription that is not deleted.
pub(crate) async fn fetch<'e>(
    ex: impl SqliteExecutor<'e>,
    keyring: &Keyring,
    id: &SubscriptionId,
) -> Result<Option<Subscription>> {
    let row = sqlx::query(concat!(
        "SELECT ",
        subscription_columns!(),
        " FROM subscriptions s WHERE s.sub_id = ? AND s.state <> 'deleted'"
    ))
    .bind(id.as_uuid())
    .fetch_optional(ex)
    .await
    .map_err(from_sqlx)?;
    row.as_ref()
        .map(|row| codec::subscription(row, keyring))
        .transpose()
}

/// Bumped inside every subscription write transaction, so the change and the
/// new generation become visible together. `_ended` is the caller's
/// `store.generation.invalidate_on_drop()`, taken before the transaction:
/// asking for it here means no write can bump the generation without the
/// cached value being forgotten once its transaction has ended.
pub(crate) async fn bump_generation(
    conn: &mut SqliteConnection,
    _ended: &InvalidateOnDrop,
) -> Result<()> {
    sqlx::query("UPDATE meta SET value = value + 1 WHERE key = 'subscription_generation'")
        .execute(conn)
        .await
        .map_err(from_sqlx)?;
    Ok(())
}

fn retry_policy_json(policy: &hookd_domain::subscription::RetryPolicy) -> Result<String> {
    serde_json::to_string(policy).map_err(|e| StoreError::Backend(Box::new(e)))
}

pub(crate) async fn create(store: &SqliteStore, new: NewSubscription) -> Result<Subscription> {
    let policy = retry_policy_json(&new.retry_policy)?;
    let (previous, previous_until) = match &new.keys.previous {
        Some((secret, until)) => (
            Some(seal(&store.keyring, &new.id, secret)),
            Some(to_ms(*until)),
        ),
        None => (None, None),
    };
    // Subscriptions (and so the generation) change: see `GenerationCache`.
    let ended = store.generation.invalidate_on_drop();
    let mut tx = store.write().await?;
    let now = now_ms();
    sqlx::query(
        "INSERT INTO subscriptions (sub_id, customer_id, url, host, event_types, secret, previous_secret, \
         previous_secret_expires_at, ordered, retry_policy, state, rate_limit, max_concurrency, \
         description, created_at, updated_at) \
         VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 'active', ?, ?, ?, ?, ?)",
    )
    .bind(new.id.as_uuid())
    .bind(new.customer_id.as_ref().map(|c| c.as_str()))
    .bind(new.url.as_str())
    .bind(new.url.host())
    .bind(encode_patterns(&new.event_types))
    .bind(seal(&store.keyring, &new.id, &new.keys.current))
    .bind(previous)
    .bind(previous_until)
    .bind(new.ordered)
    .bind(policy)
    .bind(new.rate_limit.map(i64::from))
    .bind(new.max_concurrency.map(i64::from))
    .bind(new.description.as_deref())
    .bind(now)
    .bind(now)
    .execute(&mut *tx)
    .await
    .map_err(from_sqlx)?;
    bump_generation(&mut tx, &ended).await?;
    // Read back rather than echo `new`, so the caller sees exactly what a
    // later read will (times at the store's millisecond precision).
    let created = fetch(&mut *tx, &store.keyring, &new.id)
        .await?
        .ok_or(StoreError::NotFound)?;
    tx.commit().await.map_err(from_sqlx)?;
    Ok(created)
}

pub(crate) async fn get(store: &SqliteStore, id: &SubscriptionId) -> Result<Subscription> {
    fetch(&store.reader, &store.keyring, id)
        .await?
        .ok_or(StoreError::NotFound)
}

pub(crate) async fn list(
    store: &SqliteStore,
    query: &SubscriptionQuery,
) -> Result<Vec<Subscription>> {
    let mut q = QueryBuilder::<Sqlite>::new(concat!(
        "SELECT ",
        subscription_columns!(),
        " FROM subscriptions s WHERE s.state <> 'deleted'"
    ));
    if let Some(customer) = &query.customer_id {
        q.push(" AND s.customer_id = ")
            .push_bind(customer.as_str().to_owned());
    }
    if let Some(cursor) = &query.cursor {
        q.push(" AND s.sub_id > ").push_bind(*cursor.as_uuid());
    }
    q.push(" ORDER BY s.sub_id LIMIT ")
        .push_bind(i64::from(query.limit));
    let rows = q
        .build()
        .fetch_all(&store.reader)
        .await
        .map_err(from_sqlx)?;
    rows.iter()
        .map(|row| codec::subscription(row, &store.keyring))
        .collect()
}

pub(crate) async fn all(store: &SqliteStore) -> Result<Vec<Subscription>> {
    let rows = sqlx::query(concat!(
        "SELECT ",
        subscription_columns!(),
        " FROM subscriptions s WHERE s.state <> 'deleted' ORDER BY s.sub_id"
    ))
    .fetch_all(&store.reader)
    .await
    .map_err(from_sqlx)?;
    rows.iter()
        .map(|row| codec::subscription(row, &store.keyring))
        .collect()
}

pub(crate) async fn update(
    store: &SqliteStore,
    id: &SubscriptionId,
    patch: SubscriptionPatch,
) -> Result<Subscription> {
    // Subscriptions (and so the generation) change: see `GenerationCache`.
    let ended = store.generation.invalidate_on_drop();
    let mut tx = store.write().await?;
    let now = now_ms();
    // Read, patch in Rust, write back whole: under the write lock nothing
    // can change in between, and the patch logic stays in one readable place.
    let mut sub = fetch(&mut *tx, &store.keyring, id)
        .await?
        .ok_or(StoreError::NotFound)?;
    let SubscriptionPatch {
        url,
        event_types,
        keys,
        ordered,
        retry_policy,
        state,
        rate_limit,
        max_concurrency,
        description,
    } = patch;
    // Unset fields keep their value; set ones replace it.
    fn set<T>(slot: &mut T, value: Option<T>) {
        if let Some(v) = value {
            *slot = v;
        }
    }
    set(&mut sub.url, url);
    set(&mut sub.event_types, event_types);
    set(&mut sub.keys, keys);
    set(&mut sub.ordered, ordered);
    set(&mut sub.retry_policy, retry_policy);
    // Enabling a disabled subscription lowers its Disabled signal and ends
    // its failing streak in this transaction: a later automatic disable is
    // announced again, and counts its period from the re-enabling.
    let enabling =
        state == Some(SubscriptionState::Active) && sub.state == SubscriptionState::Disabled;
    set(&mut sub.state, state);
    set(&mut sub.rate_limit, rate_limit);
    set(&mut sub.max_concurrency, max_concurrency);
    set(&mut sub.description, description);
    let (previous, previous_until) = match &sub.keys.previous {
        Some((secret, until)) => (Some(seal(&store.keyring, id, secret)), Some(to_ms(*until))),
        None => (None, None),
    };
    sqlx::query(
        "UPDATE subscriptions SET url = ?, host = ?, event_types = ?, secret = ?, previous_secret = ?, \
         previous_secret_expires_at = ?, ordered = ?, retry_policy = ?, state = ?, rate_limit = ?, \
         max_concurrency = ?, description = ?, updated_at = ? WHERE sub_id = ?",
    )
    .bind(sub.url.as_str())
    .bind(sub.url.host())
    .bind(encode_patterns(&sub.event_types))
    .bind(seal(&store.keyring, id, &sub.keys.current))
    .bind(previous)
    .bind(previous_until)
    .bind(sub.ordered)
    .bind(retry_policy_json(&sub.retry_policy)?)
    .bind(sub.state.as_str())
    .bind(sub.rate_limit.map(i64::from))
    .bind(sub.max_concurrency.map(i64::from))
    .bind(sub.description.as_deref())
    .bind(now)
    .bind(id.as_uuid())
    .execute(&mut *tx)
    .await
    .map_err(from_sqlx)?;
    bump_generation(&mut tx, &ended).await?;
    if enabling {
        sqlx::query("DELETE FROM subscription_signals WHERE sub_id = ? AND kind = ?")
            .bind(id.as_uuid())
            .bind(SignalKind::Disabled.as_str())
            .execute(&mut *tx)
            .await
            .map_err(from_sqlx)?;
        sqlx::query("UPDATE subscriptions SET failing_since = NULL WHERE sub_id = ?")
            .bind(id.as_uuid())
            .execute(&mut *tx)
            .await
            .map_err(from_sqlx)?;
    }
    let updated = fetch(&mut *tx, &store.keyring, id)
        .await?
        .ok_or(StoreError::NotFound)?;
    tx.commit().await.map_err(from_sqlx)?;
    Ok(updated)
}

pub(crate) async fn delete(store: &SqliteStore, id: &SubscriptionId) -> Result<()> {
    // Subscriptions (and so the generation) change: see `GenerationCache`.
    let ended = store.generation.invalidate_on_drop();
    let mut tx = store.write().await?;
    let now = now_ms();
    // A tombstone, not a DELETE: the subscription's deliveries and attempts
    // are its history and keep pointing at it.
    let done = sqlx::query("UPDATE subscriptions SET state = 'deleted', updated_at = ? WHERE sub_id = ? AND state <> 'deleted'")
        .bind(now)
        .bind(id.as_uuid())
        .execute(&mut *tx)
        .await
        .map_err(from_sqlx)?;
    if done.rows_affected() == 0 {
        return Err(StoreError::NotFound);
    }
    sqlx::query(
        // In-flight rows too: their worker's result then finds the row no
        // longer in flight (LeaseLost), and no release or reclaim can bring
        // it back to a pending that nothing would ever claim.
        "UPDATE deliveries SET state = 'failed', last_error = ?, updated_at = ?, lease_expires = NULL, worker_id = NULL \
         WHERE sub_id = ? AND state IN ('pending', 'inflight')",
    )
    .bind(DELETED)
    .bind(now)
    .bind(id.as_uuid())
    .execute(&mut *tx)
    .await
    .map_err(from_sqlx)?;
    bump_generation(&mut tx, &ended).await?;
    tx.commit().await.map_err(from_sqlx)
}

pub(crate) async fn generation(store: &SqliteStore) -> Result<i64> {
    if let Some(generation) = store.generation.get() {
        return Ok(generation);
    }
    let epoch = store.generation.epoch();
    let generation: i64 =
        sqlx::query_scalar("SELECT value FROM meta WHERE key = 'subscription_generation'")
            .fetch_one(&store.reader)
            .await
            .map_err(from_sqlx)?;
    store.generation.put(epoch, generation);
    Ok(generation)
}

/// Rows per reseal transaction: short enough that the writer is never held
/// for long, so a reseal can run beside everything else.
const RESEAL_BATCH: i64 = 500;

pub(crate) async fn reseal(store: &SqliteStore) -> Result<u64> {
    let keyring = &store.keyring;
    let mut changed = 0;
    let mut after: Option<uuid::Uuid> = None;
    loop {
        // Read and rewrite a batch under one write lock, so a secret
        // rotated meanwhile is never overwritten with its old value.
        let mut tx = store.write().await?;
        let rows: Vec<(uuid::Uuid, String, Option<String>)> = sqlx::query_as(
            "SELECT sub_id, secret, previous_secret FROM subscriptions \
             WHERE ?1 IS NULL OR sub_id > ?1 ORDER BY sub_id LIMIT ?2",
        )
        .bind(after)
        .bind(RESEAL_BATCH)
        .fetch_all(&mut *tx)
        .await
        .map_err(from_sqlx)?;
        let Some((last, _, _)) = rows.last() else {
            break;
        };
        after = Some(*last);
        let full = rows.len() == RESEAL_BATCH as usize;
        for (uuid, secret, previous) in rows {
            let id = SubscriptionId::from_uuid(uuid);
            let corrupt = |column: &str, e| StoreError::Corrupt(format!("{column}: {e}"));
            let new_secret = keyring
                .reseal(&id, &secret)
                .map_err(|e| corrupt("secret", e))?;
            let new_previous = previous
                .as_deref()
                .map(|p| keyring.reseal(&id, p))
                .transpose()
                .map_err(|e| corrupt("previous_secret", e))?
                .flatten();
            if new_secret.is_none() && new_previous.is_none() {
                continue;
            }
            sqlx::query(
                "UPDATE subscriptions SET secret = COALESCE(?, secret), \
                 previous_secret = COALESCE(?, previous_secret) WHERE sub_id = ?",
            )
            .bind(new_secret)
            .bind(new_previous)
            .bind(uuid)
            .execute(&mut *tx)
            .await
            .map_err(from_sqlx)?;
            changed += 1;
        }
        tx.commit().await.map_err(from_sqlx)?;
        if !full {
            break;
        }
    }
    Ok(changed)
}
