//! Ingest, the outbox: an event and its deliveries commit together.

use hookd_domain::EventId;
use hookd_store::{Accepted, Event, NewDelivery, NewEvent, Result, StoreError};
use sqlx::{QueryBuilder, Sqlite, SqliteConnection};
use uuid::Uuid;

use crate::SqliteStore;
use crate::codec::{self, event_columns, now_ms};
use crate::error::from_sqlx;

/// Delivery rows per INSERT statement. Each row binds 9 values, so this
/// stays far below SQLite's limit of 32,766 bound values per statement,
/// while a typical fan-out still goes in a single statement.
const DELIVERIES_PER_INSERT: usize = 500;

pub(crate) async fn accept_event(
    store: &SqliteStore,
    event: NewEvent,
    deliveries: Vec<NewDelivery>,
) -> Result<Accepted> {
    // Everything below runs under the write lock, so "is the key taken?"
    // and "take it" cannot interleave with another ingest: of N concurrent
    // calls with one key, the first creates and the rest see its event.
    let mut tx = store.write().await?;
    let accepted = accept_in(&mut tx, now_ms(), &event, &deliveries).await?;
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
/// existing event with `duplicate: true`. An error leaves partial writes
/// in the transaction: the caller must drop it.
pub(crate) async fn accept_in(
    conn: &mut SqliteConnection,
    now: i64,
    event: &NewEvent,
    deliveries: &[NewDelivery],
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

    for chunk in deliveries.chunks(DELIVERIES_PER_INSERT) {
        let mut q = QueryBuilder::<Sqlite>::new(
            "INSERT INTO deliveries (delivery_id, event_id, sub_id, event_type, destination_host, state, \
             attempt, next_attempt_at, lease_token, created_at, window_start, updated_at) ",
        );
        q.push_values(chunk, |mut row, d| {
            row.push_bind(*d.id.as_uuid())
                .push_bind(*event.id.as_uuid())
                .push_bind(*d.sub_id.as_uuid())
                .push_bind(event.event_type.as_str().to_owned())
                .push_bind(d.destination_host.clone())
                // New deliveries are pending and due at once.
                .push("'pending'")
                .push("0")
                .push_bind(now)
                .push("0")
                .push_bind(now)
                .push_bind(now)
                .push_bind(now);
        });
        // A failure here (an unknown subscription, a repeated (event,
        // subscription) pair) makes the caller drop its transaction,
        // rolling back the event row too.
        q.build().execute(&mut *conn).await.map_err(from_sqlx)?;
    }
    Ok(Accepted {
        event_id: event.id,
        duplicate: false,
    })
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
