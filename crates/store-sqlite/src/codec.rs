//! Between SQLite values and domain types: times, ids, and whole rows.
//!
//! Every query that returns a record selects it through one of the column
//! macros below, which alias each column with a table prefix (`s_`, `e_`,
//! `d_`, `a_`). That lets a join return a delivery, its event and its
//! subscription in one row without name clashes, and lets one decoder per
//! record serve every query.

use std::time::Duration;

use chrono::{DateTime, Utc};
use hookd_domain::delivery::{DeliveryState, ErrorClass};
use hookd_domain::destination::DestinationUrl;
use hookd_domain::event_type::{EventType, EventTypePattern};
use hookd_domain::signing::SigningSecret;
use hookd_domain::subscription::{SigningKeys, SubscriptionState};
use hookd_domain::{CustomerId, DeliveryId, EventId, SubscriptionId, Timestamp};
use hookd_store::crypto::Keyring;
use hookd_store::{Attempt, Delivery, Event, Result, Subscription};
use sqlx::Row;
use sqlx::sqlite::SqliteRow;
use uuid::Uuid;

use crate::error::{corrupt, from_sqlx};

// --- time --------------------------------------------------------------------

/// The store's clock, in the unit it stores: unix milliseconds, UTC. Read
/// once per statement (or transaction), never taken from the caller.
pub(crate) fn now_ms() -> i64 {
    Utc::now().timestamp_millis()
}

pub(crate) fn to_ms(t: Timestamp) -> i64 {
    t.timestamp_millis()
}

pub(crate) fn from_ms(ms: i64, column: &str) -> Result<Timestamp> {
    DateTime::from_timestamp_millis(ms)
        .ok_or_else(|| corrupt(column, format_args!("{ms} is not a time")))
}

/// A duration in milliseconds, saturating: a lease or delay too long to
/// count in milliseconds is, for our purposes, forever.
pub(crate) fn duration_ms(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

/// `now + d`, saturating.
pub(crate) fn after(now: i64, d: Duration) -> i64 {
    now.saturating_add(duration_ms(d))
}

// --- columns -----------------------------------------------------------------

/// The columns [`subscription`] reads, from `subscriptions s`.
macro_rules! subscription_columns {
    () => {
        "s.sub_id AS s_sub_id, s.customer_id AS s_customer_id, s.url AS s_url, \
         s.event_types AS s_event_types, s.secret AS s_secret, \
         s.previous_secret AS s_previous_secret, \
         s.previous_secret_expires_at AS s_previous_secret_expires_at, \
         s.ordered AS s_ordered, s.retry_policy AS s_retry_policy, s.state AS s_state, \
         s.rate_limit AS s_rate_limit, s.max_concurrency AS s_max_concurrency, \
         s.description AS s_description, \
         s.created_at AS s_created_at, s.updated_at AS s_updated_at"
    };
}
pub(crate) use subscription_columns;

/// The columns [`event`] reads, from `events e`.
macro_rules! event_columns {
    () => {
        "e.event_id AS e_event_id, e.type AS e_type, e.payload AS e_payload, \
         e.idempotency_key AS e_idempotency_key, e.customer_id AS e_customer_id, \
         e.created_at AS e_created_at"
    };
}
pub(crate) use event_columns;

/// The columns [`delivery`] reads, from `deliveries d`; with `("")`, from
/// the row an `UPDATE deliveries … RETURNING` wrote (RETURNING takes no
/// table alias). Each column is read as `d_` and its name.
macro_rules! delivery_columns {
    () => {
        $crate::codec::delivery_columns!("d.")
    };
    ($t:literal) => {
        $crate::codec::delivery_columns!(@ $t; delivery_id, event_id, sub_id, event_type,
            destination_host, state, attempt, next_attempt_at, lease_token, last_status,
            last_error, created_at, window_start, updated_at)
    };
    (@ $t:literal; $first:ident $(, $c:ident)*) => {
        concat!(
            $t, stringify!($first), " AS d_", stringify!($first)
            $(, ", ", $t, stringify!($c), " AS d_", stringify!($c))*
        )
    };
}
pub(crate) use delivery_columns;

/// The columns [`attempt`] reads, from `attempts a`.
macro_rules! attempt_columns {
    () => {
        "a.delivery_id AS a_delivery_id, a.number AS a_number, a.started_at AS a_started_at, \
         a.duration_ms AS a_duration_ms, a.status AS a_status, a.error_class AS a_error_class, \
         a.response_snippet AS a_response_snippet"
    };
}
pub(crate) use attempt_columns;

// --- rows --------------------------------------------------------------------

fn get<'r, T>(row: &'r SqliteRow, column: &str) -> Result<T>
where
    T: sqlx::Decode<'r, sqlx::Sqlite> + sqlx::Type<sqlx::Sqlite>,
{
    row.try_get(column).map_err(from_sqlx)
}

fn time(row: &SqliteRow, column: &str) -> Result<Timestamp> {
    from_ms(get(row, column)?, column)
}

fn customer(row: &SqliteRow, column: &str) -> Result<Option<CustomerId>> {
    get::<Option<String>>(row, column)?
        .map(|c| CustomerId::parse(&c).map_err(|e| corrupt(column, e)))
        .transpose()
}

fn event_type(row: &SqliteRow, column: &str) -> Result<EventType> {
    EventType::parse(&get::<String>(row, column)?).map_err(|e| corrupt(column, e))
}

/// A stored secret: opened with the keyring (sealed, or legacy plaintext),
/// then parsed. Never echoes the stored text or the plaintext.
fn secret(
    keyring: &Keyring,
    sub_id: &SubscriptionId,
    stored: &str,
    column: &str,
) -> Result<SigningSecret> {
    let plain = keyring
        .open(sub_id, stored)
        .map_err(|e| corrupt(column, e))?;
    SigningSecret::parse(&plain).map_err(|_| corrupt(column, "not a whsec_ secret"))
}

/// A secret as stored: sealed under the keyring's current key, bound to
/// its subscription.
pub(crate) fn seal(keyring: &Keyring, sub_id: &SubscriptionId, secret: &SigningSecret) -> String {
    keyring.seal(sub_id, &secret.expose())
}

/// A stored `rate_limit` (attempts per second; NULL for adaptive).
pub(crate) fn rate_limit(stored: Option<i64>, column: &str) -> Result<Option<u32>> {
    stored
        .map(|n| u32::try_from(n).map_err(|_| corrupt(column, n)))
        .transpose()
}

/// A stored `max_concurrency` (attempts in flight at once; NULL for the
/// server-wide cap).
pub(crate) fn max_concurrency(stored: Option<i64>, column: &str) -> Result<Option<u32>> {
    stored
        .map(|n| u32::try_from(n).map_err(|_| corrupt(column, n)))
        .transpose()
}

/// A pattern list as stored: JSON text of pattern strings (`["invoice.*"]`),
/// readable by people and by both backends alike.
pub(crate) fn encode_patterns(patterns: &[EventTypePattern]) -> String {
    serde_json::to_string(patterns).expect("patterns serialize as strings")
}

pub(crate) fn subscription(row: &SqliteRow, keyring: &Keyring) -> Result<Subscription> {
    let id = SubscriptionId::from_uuid(get(row, "s_sub_id")?);
    let patterns: Vec<String> = serde_json::from_str(&get::<String>(row, "s_event_types")?)
        .map_err(|e| corrupt("s_event_types", e))?;
    let event_types = patterns
        .iter()
        .map(|p| EventTypePattern::parse(p).map_err(|e| corrupt("s_event_types", e)))
        .collect::<Result<_>>()?;
    let previous = match (
        get::<Option<String>>(row, "s_previous_secret")?,
        get::<Option<i64>>(row, "s_previous_secret_expires_at")?,
    ) {
        (Some(s), Some(until)) => Some((
            secret(keyring, &id, &s, "s_previous_secret")?,
            from_ms(until, "s_previous_secret_expires_at")?,
        )),
        (None, None) => None,
        _ => {
            return Err(corrupt(
                "s_previous_secret",
                "secret and expiry must be set together",
            ));
        }
    };
    let state: String = get(row, "s_state")?;
    Ok(Subscription {
        id,
        customer_id: customer(row, "s_customer_id")?,
        url: DestinationUrl::from_stored(&get::<String>(row, "s_url")?)
            .map_err(|e| corrupt("s_url", e))?,
        event_types,
        keys: SigningKeys {
            current: secret(keyring, &id, &get::<String>(row, "s_secret")?, "s_secret")?,
            previous,
        },
        ordered: get(row, "s_ordered")?,
        retry_policy: serde_json::from_str(&get::<String>(row, "s_retry_policy")?)
            .map_err(|e| corrupt("s_retry_policy", e))?,
        state: SubscriptionState::parse(&state).ok_or_else(|| corrupt("s_state", state))?,
        rate_limit: rate_limit(get(row, "s_rate_limit")?, "s_rate_limit")?,
        max_concurrency: max_concurrency(get(row, "s_max_concurrency")?, "s_max_concurrency")?,
        description: get(row, "s_description")?,
        created_at: time(row, "s_created_at")?,
        updated_at: time(row, "s_updated_at")?,
    })
}

pub(crate) fn event(row: &SqliteRow) -> Result<Event> {
    Ok(Event {
        id: EventId::from_uuid(get(row, "e_event_id")?),
        event_type: event_type(row, "e_type")?,
        payload: get(row, "e_payload")?,
        idempotency_key: get(row, "e_idempotency_key")?,
        customer_id: customer(row, "e_customer_id")?,
        created_at: time(row, "e_created_at")?,
    })
}

/// A delivery and its current lease token.
pub(crate) fn delivery(row: &SqliteRow) -> Result<(Delivery, i64)> {
    let state: String = get(row, "d_state")?;
    let attempt: i64 = get(row, "d_attempt")?;
    let last_status = get::<Option<i64>>(row, "d_last_status")?
        .map(|s| u16::try_from(s).map_err(|_| corrupt("d_last_status", s)))
        .transpose()?;
    let delivery = Delivery {
        id: DeliveryId::from_uuid(get(row, "d_delivery_id")?),
        event_id: EventId::from_uuid(get(row, "d_event_id")?),
        sub_id: SubscriptionId::from_uuid(get(row, "d_sub_id")?),
        event_type: event_type(row, "d_event_type")?,
        destination_host: get(row, "d_destination_host")?,
        state: DeliveryState::parse(&state).ok_or_else(|| corrupt("d_state", state))?,
        attempt: u32::try_from(attempt).map_err(|_| corrupt("d_attempt", attempt))?,
        next_attempt_at: time(row, "d_next_attempt_at")?,
        last_status,
        last_error: get(row, "d_last_error")?,
        created_at: time(row, "d_created_at")?,
        window_start: time(row, "d_window_start")?,
        updated_at: time(row, "d_updated_at")?,
    };
    Ok((delivery, get(row, "d_lease_token")?))
}

/// An attempt and the id of its delivery.
pub(crate) fn attempt(row: &SqliteRow) -> Result<(Uuid, Attempt)> {
    let number: i64 = get(row, "a_number")?;
    let duration: i64 = get(row, "a_duration_ms")?;
    let status = get::<Option<i64>>(row, "a_status")?
        .map(|s| u16::try_from(s).map_err(|_| corrupt("a_status", s)))
        .transpose()?;
    let error_class = get::<Option<String>>(row, "a_error_class")?
        .map(|c| ErrorClass::parse(&c).ok_or_else(|| corrupt("a_error_class", c)))
        .transpose()?;
    let attempt = Attempt {
        number: u32::try_from(number).map_err(|_| corrupt("a_number", number))?,
        started_at: time(row, "a_started_at")?,
        duration: Duration::from_millis(
            u64::try_from(duration).map_err(|_| corrupt("a_duration_ms", duration))?,
        ),
        status,
        error_class,
        response_snippet: get(row, "a_response_snippet")?,
    };
    Ok((get(row, "a_delivery_id")?, attempt))
}
