//! Ingest, the outbox: an event and its deliveries commit together.

use std::collections::HashMap;

use hookd_domain::EventId;
use hookd_store::{
    Accepted, Event, IngestClaim, LazyFanout, Lease, NewDelivery, NewEvent, Result, StoreError,
};
use sqlx::error::ErrorKind;
use sqlx::{QueryBuilder, Sqlite, SqliteConnection};
use uuid::Uuid;

use crate::codec::{self, event_columns, now_ms};
use crate::error::from_sqlx;
use crate::{SqliteStore, keep_prepared};

/// Delivery rows per INSERT statement. Each row binds 9 values, so this
/// stays far below SQLite's limit of 32,766 bound values per statement,
/// while a typical fan-out still goes in a single statement.
const DELIVERIES_PER_INSERT: usize = 500;

/// Event rows per INSERT statement of a batch: 6 bound values each.
const EVENTS_PER_INSERT: usize = 500;

/// Idempotency keys per `IN (…)` lookup of a batch: one bound value each.
const KEYS_PER_LOOKUP: usize = 1000;

pub(crate) async fn accept_event(
    store: &SqliteStore,
    event: NewEvent,
    deliveries: Vec<NewDelivery>,
) -> Result<Accepted> {
    // Everything below runs under the write lock, so "is the key taken?"
    // and "take it" cannot interleave with another ingest: of N concurrent
    // calls with one key, the first creates and the rest see its event.
    let mut tx = store.write().await?;
    let accepted = accept_in(&mut tx, now_ms(), &event, &deliveries, store.fanout).await?;
    if accepted.duplicate {
        // Dropping the transaction rolls it back: nothing was written.
        return Ok(accepted);
    }
    tx.commit().await.map_err(from_sqlx)?;
    Ok(accepted)
}

/// Accepts an event and its deliveries inside the caller's write
/// transaction (`accept_event`'s body; a raised signal's notice goes through
/// it too). With a taken idempotency key it writes nothing and returns the
/// existing event with `duplicate: true`. Over `fanout`'s threshold the
/// deliveries go into a fan-out job ([`crate::fanout::write_job`]). An
/// error leaves partial writes in the transaction: the caller must drop it.
pub(crate) async fn accept_in(
    conn: &mut SqliteConnection,
    now: i64,
    event: &NewEvent,
    deliveries: &[NewDelivery],
    fanout: LazyFanout,
) -> Result<Accepted> {
    if let Some(key) = &event.idempotency_key {
        let existing: Option<Uuid> =
            sqlx::query_scalar("SELECT event_id FROM events WHERE idempotency_key = ?")
                .bind(key)
                .fetch_optional(&mut *conn)
                .await
                .map_err(from_sqlx)?;
        if let Some(id) = existing {
            return Ok(Accepted {
                event_id: EventId::from_uuid(id),
                duplicate: true,
            });
        }
    }
    sqlx::query(
        "INSERT INTO events (event_id, type, payload, idempotency_key, customer_id, created_at) \
         VALUES (?, ?, ?, ?, ?, ?)",
    )
    .bind(event.id.as_uuid())
    .bind(event.event_type.as_str())
    .bind(&event.payload)
    .bind(event.idempotency_key.as_deref())
    .bind(event.customer_id.as_ref().map(|c| c.as_str()))
    .bind(now)
    .execute(&mut *conn)
    .await
    .map_err(from_sqlx)?;

    // A failure here (an unknown subscription, a repeated (event,
    // subscription) pair) makes the caller drop its transaction, rolling
    // back the event row too.
    if fanout.is_lazy(deliveries.len()) {
        crate::fanout::write_job(conn, now, event, deliveries, fanout).await?;
    } else {
        let rows: Vec<_> = deliveries.iter().map(|d| (event, d)).collect();
        insert_deliveries(conn, now, &rows).await?;
    }
    Ok(Accepted {
        event_id: event.id,
        duplicate: false,
    })
}

/// Writes delivery rows, each with its event, in multi-row INSERTs of at
/// most [`DELIVERIES_PER_INSERT`] rows.
pub(crate) async fn insert_deliveries(
    conn: &mut SqliteConnection,
    now: i64,
    rows: &[(&NewEvent, &NewDelivery)],
) -> Result<()> {
    insert_claiming(conn, now, rows, None).await.map(drop)
}

/// [`insert_deliveries`], creating those `claim` names already claimed
/// (`inflight`, leased to its worker, lease token 1: what their first claim
/// would have written), and returning their leases.
async fn insert_claiming(
    conn: &mut SqliteConnection,
    now: i64,
    rows: &[(&NewEvent, &NewDelivery)],
    claim: Option<&IngestClaim>,
) -> Result<Vec<Lease>> {
    let claim = claim.filter(|c| !c.deliveries.is_empty());
    let expires =
        claim.map(|c| now.saturating_add(i64::try_from(c.lease.as_millis()).unwrap_or(i64::MAX)));
    let mut leases = Vec::new();
    for chunk in rows.chunks(DELIVERIES_PER_INSERT) {
        let leases_before = leases.len();
        let mut q = QueryBuilder::<Sqlite>::new(
            "INSERT INTO deliveries (delivery_id, event_id, sub_id, event_type, destination_host, state, \
             attempt, next_attempt_at, lease_token, lease_expires, worker_id, created_at, window_start, \
             updated_at) ",
        );
        q.push_values(chunk, |mut row, (event, d)| {
            row.push_bind(*d.id.as_uuid())
                .push_bind(*event.id.as_uuid())
                .push_bind(*d.sub_id.as_uuid())
                .push_bind(event.event_type.as_str().to_owned())
                .push_bind(d.destination_host.clone());
            match claim.filter(|c| c.deliveries.contains(&d.id)) {
                Some(c) => {
                    leases.push(Lease {
                        delivery_id: d.id,
                        token: INGEST_CLAIM_TOKEN,
                        partition: None,
                        subscription: d.sub_id,
                    });
                    row.push("'inflight'")
                        .push("0")
                        .push_bind(now)
                        .push("1")
                        .push_bind(expires)
                        .push_bind(c.worker_id.clone());
                }
                // New deliveries are otherwise pending and due at once.
                None => {
                    row.push("'pending'")
                        .push("0")
                        .push_bind(now)
                        .push("0")
                        .push("NULL")
                        .push("NULL");
                }
            }
            row.push_bind(now).push_bind(now).push_bind(now);
        });
        // A row's claim columns are literals, so a chunk mixing claimed
        // (a lease each) and pending rows has a shape of its own: never
        // kept prepared.
        let claimed = leases.len() - leases_before;
        let keep = (claimed == 0 || claimed == chunk.len())
            && keep_prepared(chunk.len(), DELIVERIES_PER_INSERT);
        q.build()
            .persistent(keep)
            .execute(&mut *conn)
            .await
            .map_err(from_sqlx)?;
    }
    Ok(leases)
}

/// The lease token of a delivery created claimed: the one its first claim
/// would have written (claims add 1 to the initial 0).
const INGEST_CLAIM_TOKEN: i64 = 1;

/// `Store::accept_events`: many events in one write transaction.
///
/// The fast path writes the whole batch with one key lookup and a few
/// multi-row INSERTs. If one of those statements fails for a row (an
/// unknown subscription, a repeated (event, subscription) pair, a reused
/// id), there is no telling from SQLite's error which event it was, so the
/// transaction is rolled back and the batch is accepted again in a new one,
/// event by event, each in a savepoint: the event at fault gets its error
/// and the others commit. That slow path costs a few statements per event,
/// and only a batch holding a faulty event (a bug, not load) ever takes it.
pub(crate) async fn accept_events(
    store: &SqliteStore,
    batch: Vec<(NewEvent, Vec<NewDelivery>)>,
) -> Result<Vec<Result<Accepted>>> {
    accept_events_claiming(store, batch, None)
        .await
        .map(|(results, _)| results)
}

/// [`accept_events`], creating the deliveries `claim` names already claimed
/// (`Store::accept_events_claiming`). Only the fast path claims: a batch
/// that takes the slow path (an event at fault) writes every row pending.
pub(crate) async fn accept_events_claiming(
    store: &SqliteStore,
    batch: Vec<(NewEvent, Vec<NewDelivery>)>,
    claim: Option<&IngestClaim>,
) -> Result<(Vec<Result<Accepted>>, Vec<Lease>)> {
    if batch.is_empty() {
        return Ok((Vec::new(), Vec::new()));
    }
    let now = now_ms();
    // Under the write lock, as `accept_event`: no other ingest can take a
    // key between the lookup and the insert.
    let mut tx = store.write().await?;
    match accept_all_in(&mut tx, now, &batch, store.fanout, claim).await {
        Ok((accepted, leases)) => {
            tx.commit().await.map_err(from_sqlx)?;
            return Ok((accepted.into_iter().map(Ok).collect(), leases));
        }
        // One event is at fault: find it below.
        Err(e) if is_event_error(&e) => tx.rollback().await.map_err(from_sqlx)?,
        Err(e) => return Err(e),
    }
    let mut tx = store.write().await?;
    let mut results = Vec::with_capacity(batch.len());
    for (event, deliveries) in &batch {
        sqlx::query("SAVEPOINT accept_one")
            .execute(&mut *tx)
            .await
            .map_err(from_sqlx)?;
        let res = accept_in(&mut tx, now, event, deliveries, store.fanout).await;
        let undo = match res {
            Ok(accepted) => accepted.duplicate,
            Err(ref e) if is_event_error(e) => true,
            // The store failed, not the event: the whole call fails and
            // dropping the transaction rolls everything back.
            Err(e) => return Err(e),
        };
        if undo {
            sqlx::query("ROLLBACK TO accept_one")
                .execute(&mut *tx)
                .await
                .map_err(from_sqlx)?;
        }
        sqlx::query("RELEASE accept_one")
            .execute(&mut *tx)
            .await
            .map_err(from_sqlx)?;
        results.push(res);
    }
    tx.commit().await.map_err(from_sqlx)?;
    Ok((results, Vec::new()))
}

/// Whether `e` is the failure of one event's rows (a constraint it breaks)
/// rather than of the store: the former fails only that event of a batch.
fn is_event_error(e: &StoreError) -> bool {
    match e {
        StoreError::Conflict(_) => true,
        StoreError::Backend(source) => matches!(
            source.downcast_ref::<sqlx::Error>(),
            Some(sqlx::Error::Database(db)) if !matches!(db.kind(), ErrorKind::Other)
        ),
        _ => false,
    }
}

/// The fast path of [`accept_events`]: the whole batch inside the caller's
/// write transaction, all or nothing. An error leaves partial writes: the
/// caller must roll back. An event over `fanout`'s threshold gets a fan-out
/// job instead of its rows, as in [`accept_in`].
async fn accept_all_in(
    conn: &mut SqliteConnection,
    now: i64,
    batch: &[(NewEvent, Vec<NewDelivery>)],
    fanout: LazyFanout,
    claim: Option<&IngestClaim>,
) -> Result<(Vec<Accepted>, Vec<Lease>)> {
    // One lookup (per KEYS_PER_LOOKUP keys) for the keys already taken.
    let mut keys: Vec<&str> = batch
        .iter()
        .filter_map(|(e, _)| e.idempotency_key.as_deref())
        .collect();
    keys.sort_unstable();
    keys.dedup();
    let mut taken: HashMap<&str, EventId> = HashMap::with_capacity(keys.len());
    for chunk in keys.chunks(KEYS_PER_LOOKUP) {
        let mut q = QueryBuilder::<Sqlite>::new(
            "SELECT idempotency_key, event_id FROM events WHERE idempotency_key IN (",
        );
        let mut list = q.separated(", ");
        for key in chunk {
            list.push_bind(*key);
        }
        q.push(")");
        let rows: Vec<(String, Uuid)> = q
            .build_query_as()
            .persistent(keep_prepared(chunk.len(), KEYS_PER_LOOKUP))
            .fetch_all(&mut *conn)
            .await
            .map_err(from_sqlx)?;
        for (key, id) in rows {
            // The map borrows the batch's keys, not the rows'.
            if let Ok(i) = chunk.binary_search(&key.as_str()) {
                taken.insert(chunk[i], EventId::from_uuid(id));
            }
        }
    }
    // In input order: a key taken before the batch, or by an earlier event
    // of it, makes the event a duplicate.
    let mut accepted = Vec::with_capacity(batch.len());
    let mut new_events: Vec<&NewEvent> = Vec::with_capacity(batch.len());
    let mut new_deliveries: Vec<(&NewEvent, &NewDelivery)> = Vec::new();
    let mut lazy: Vec<(&NewEvent, &[NewDelivery])> = Vec::new();
    for (event, deliveries) in batch {
        if let Some(key) = event.idempotency_key.as_deref() {
            if let Some(&id) = taken.get(key) {
                accepted.push(Accepted {
                    event_id: id,
                    duplicate: true,
                });
                continue;
            }
            taken.insert(key, event.id);
        }
        new_events.push(event);
        if fanout.is_lazy(deliveries.len()) {
            lazy.push((event, deliveries));
        } else {
            new_deliveries.extend(deliveries.iter().map(|d| (event, d)));
        }
        accepted.push(Accepted {
            event_id: event.id,
            duplicate: false,
        });
    }
    for chunk in new_events.chunks(EVENTS_PER_INSERT) {
        let mut q = QueryBuilder::<Sqlite>::new(
            "INSERT INTO events (event_id, type, payload, idempotency_key, customer_id, created_at) ",
        );
        q.push_values(chunk, |mut row, event| {
            row.push_bind(*event.id.as_uuid())
                .push_bind(event.event_type.as_str().to_owned())
                .push_bind(event.payload.as_str())
                .push_bind(event.idempotency_key.as_deref())
                .push_bind(event.customer_id.as_ref().map(|c| c.as_str()))
                .push_bind(now);
        });
        q.build()
            .persistent(keep_prepared(chunk.len(), EVENTS_PER_INSERT))
            .execute(&mut *conn)
            .await
            .map_err(from_sqlx)?;
    }
    let leases = insert_claiming(conn, now, &new_deliveries, claim).await?;
    for (event, deliveries) in lazy {
        crate::fanout::write_job(conn, now, event, deliveries, fanout).await?;
    }
    Ok((accepted, leases))
}

pub(crate) async fn get_event(store: &SqliteStore, id: &EventId) -> Result<Event> {
    let row = sqlx::query(concat!(
        "SELECT ",
        event_columns!(),
        " FROM events e WHERE e.event_id = ?"
    ))
    .bind(id.as_uuid())
    .fetch_optional(&store.reader)
    .await
    .map_err(from_sqlx)?
    .ok_or(StoreError::NotFound)?;
    codec::event(&row)
}
