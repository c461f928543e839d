//! Column lists and row decoding. Every query selects the same aliased
//! columns (`d_*` deliveries, `e_*` events, `s_*` subscriptions), so one
//! decoder per record serves plain reads and the claim's read-back alike.

use std::time::Duration;

use chrono::{DateTime, Utc};
use hookd_domain::delivery::{DeliveryState, ErrorClass};
use hookd_domain::destination::DestinationUrl;
use hookd_domain::event_type::{EventType, EventTypePattern};
use hookd_domain::signing::SigningSecret;
use hookd_domain::subscription::{RetryPolicy, SigningKeys, SubscriptionState};
use hookd_domain::{CustomerId, DeliveryId, EventId, JobId, SubscriptionId};
use hookd_store::crypto::Keyring;
use hookd_store::{
    Attempt, AttemptCount, Delivery, Event, JobState, RaisedSignal, ReplayJob, Result, SignalKind,
    StoreError, Subscription, SubscriptionHealth,
};
use sqlx::Row;
use sqlx::postgres::PgRow;
use uuid::Uuid;

use crate::error::map;

/// Delivery columns of a table aliased `d`. A macro, not a const, so it can
/// be `concat!`ed into `&'static str` queries.
macro_rules! delivery_cols {
    () => {
        "d.delivery_id AS d_delivery_id, d.event_id AS d_event_id, d.sub_id AS d_sub_id, \
         d.event_type AS d_event_type, d.destination_host AS d_destination_host, d.state AS d_state, \
         d.attempt AS d_attempt, d.next_attempt_at AS d_next_attempt_at, d.last_status AS d_last_status, \
         d.last_error AS d_last_error, d.created_at AS d_created_at, d.window_start AS d_window_start, \
         d.updated_at AS d_updated_at, d.lease_token AS d_lease_token"
    };
}

/// Event columns of a table aliased `e`.
macro_rules! event_cols {
    () => {
        "e.event_id AS e_event_id, e.type AS e_type, e.payload AS e_payload, \
         e.idempotency_key AS e_idempotency_key, e.customer_id AS e_customer_id, e.created_at AS e_created_at"
    };
}

/// Subscription columns of a table aliased `s`. The JSON columns are read as
/// text and parsed here, so a bad stored value is `Corrupt`, not a decode error.
macro_rules! subscription_cols {
    () => {
        "s.sub_id AS s_sub_id, s.customer_id AS s_customer_id, s.url AS s_url, \
         s.event_types::text AS s_event_types, s.secret AS s_secret, s.previous_secret AS s_previous_secret, \
         s.previous_secret_expires_at AS s_previous_secret_expires_at, s.ordered AS s_ordered, \
         s.retry_policy::text AS s_retry_policy, s.state AS s_state, s.rate_limit AS s_rate_limit, \
         s.max_concurrency AS s_max_concurrency, s.description AS s_description, s.created_at AS s_created_at, s.updated_at AS s_updated_at"
    };
}

/// Replay job columns of a table aliased `j`.
macro_rules! job_cols {
    () => {
        "j.job_id, j.sub_id, j.since, j.until, j.event_types, j.states, j.state, j.total, j.done, \
         j.failed, j.skipped, j.requeued, j.created_at, j.finished_at"
    };
}

pub(crate) use {delivery_cols, event_cols, job_cols, subscription_cols};

fn get<'r, T>(row: &'r PgRow, col: &str) -> Result<T>
where
    T: sqlx::Decode<'r, sqlx::Postgres> + sqlx::Type<sqlx::Postgres>,
{
    row.try_get(col).map_err(map)
}

fn corrupt(what: &str, err: impl std::fmt::Display) -> StoreError {
    StoreError::Corrupt(format!("{what}: {err}"))
}

fn customer(row: &PgRow, col: &str) -> Result<Option<CustomerId>> {
    get::<Option<String>>(row, col)?
        .map(|c| CustomerId::parse(&c).map_err(|e| corrupt(col, e)))
        .transpose()
}

fn status(row: &PgRow, col: &str) -> Result<Option<u16>> {
    get::<Option<i32>>(row, col)?
        .map(|s| u16::try_from(s).map_err(|e| corrupt(col, e)))
        .transpose()
}

/// A stored `rate_limit` (attempts per second; NULL for adaptive).
pub(crate) fn rate_limit(stored: Option<i32>) -> Result<Option<u32>> {
    stored
        .map(|n| u32::try_from(n).map_err(|e| corrupt("rate_limit", e)))
        .transpose()
}

/// A stored `max_concurrency` (attempts in flight at once; NULL for the
/// server-wide cap).
pub(crate) fn max_concurrency(stored: Option<i32>) -> Result<Option<u32>> {
    stored
        .map(|n| u32::try_from(n).map_err(|e| corrupt("max_concurrency", e)))
        .transpose()
}

/// A secret as stored: sealed under the keyring's current key, bound to its
/// subscription.
pub(crate) fn seal(keyring: &Keyring, sub_id: &SubscriptionId, secret: &SigningSecret) -> String {
    keyring.seal(sub_id, &secret.expose())
}

pub(crate) fn subscription(row: &PgRow, keyring: &Keyring) -> Result<Subscription> {
    let id = SubscriptionId::from_uuid(get(row, "s_sub_id")?);
    let url: String = get(row, "s_url")?;
    let patterns: Vec<String> = serde_json::from_str(&get::<String>(row, "s_event_types")?)
        .map_err(|e| corrupt("event_types", e))?;
    let event_types = patterns
        .iter()
        .map(|p| EventTypePattern::parse(p).map_err(|e| corrupt("event_types", e)))
        .collect::<Result<_>>()?;
    // Opened (sealed, or legacy plaintext) then parsed; an error never
    // echoes the stored text.
    let secret = |s: &str, column: &str| {
        let plain = keyring.open(&id, s).map_err(|e| corrupt(column, e))?;
        SigningSecret::parse(&plain).map_err(|e| corrupt(column, e))
    };
    let previous = match (
        get::<Option<String>>(row, "s_previous_secret")?,
        get::<Option<DateTime<Utc>>>(row, "s_previous_secret_expires_at")?,
    ) {
        (Some(s), Some(until)) => Some((secret(&s, "previous_secret")?, until)),
        (None, None) => None,
        _ => {
            return Err(StoreError::Corrupt(
                "previous_secret without its expiry, or the reverse".into(),
            ));
        }
    };
    let retry_policy: RetryPolicy = serde_json::from_str(&get::<String>(row, "s_retry_policy")?)
        .map_err(|e| corrupt("retry_policy", e))?;
    let state: String = get(row, "s_state")?;
    Ok(Subscription {
        id,
        customer_id: customer(row, "s_customer_id")?,
        url: DestinationUrl::from_stored(&url).map_err(|e| corrupt("url", e))?,
        event_types,
        keys: SigningKeys {
            current: secret(&get::<String>(row, "s_secret")?, "secret")?,
            previous,
        },
        ordered: get(row, "s_ordered")?,
        retry_policy,
        // A deleted row never reaches here: every read filters it out.
        state: SubscriptionState::parse(&state)
            .ok_or_else(|| corrupt("subscription state", &state))?,
        rate_limit: rate_limit(get(row, "s_rate_limit")?)?,
        max_concurrency: max_concurrency(get(row, "s_max_concurrency")?)?,
        description: get(row, "s_description")?,
        created_at: get(row, "s_created_at")?,
        updated_at: get(row, "s_updated_at")?,
    })
}

pub(crate) fn event(row: &PgRow) -> Result<Event> {
    let ty: String = get(row, "e_type")?;
    Ok(Event {
        id: EventId::from_uuid(get(row, "e_event_id")?),
        event_type: EventType::parse(&ty).map_err(|e| corrupt("event type", e))?,
        payload: get(row, "e_payload")?,
        idempotency_key: get(row, "e_idempotency_key")?,
        customer_id: customer(row, "e_customer_id")?,
        created_at: get(row, "e_created_at")?,
    })
}

pub(crate) fn delivery(row: &PgRow) -> Result<Delivery> {
    let ty: String = get(row, "d_event_type")?;
    let state: String = get(row, "d_state")?;
    let attempt: i32 = get(row, "d_attempt")?;
    Ok(Delivery {
        id: DeliveryId::from_uuid(get(row, "d_delivery_id")?),
        event_id: EventId::from_uuid(get(row, "d_event_id")?),
        sub_id: SubscriptionId::from_uuid(get(row, "d_sub_id")?),
        event_type: EventType::parse(&ty).map_err(|e| corrupt("event type", e))?,
        destination_host: get(row, "d_destination_host")?,
        state: DeliveryState::parse(&state).ok_or_else(|| corrupt("delivery state", &state))?,
        attempt: u32::try_from(attempt).map_err(|e| corrupt("attempt", e))?,
        next_attempt_at: get(row, "d_next_attempt_at")?,
        last_status: status(row, "d_last_status")?,
        last_error: get(row, "d_last_error")?,
        created_at: get(row, "d_created_at")?,
        window_start: get(row, "d_window_start")?,
        updated_at: get(row, "d_updated_at")?,
    })
}

/// The lease token a delivery row carries (meaningful while `inflight`).
pub(crate) fn lease_token(row: &PgRow) -> Result<i64> {
    get(row, "d_lease_token")
}

/// The day partition a claimed row is in (`d_retain_from`, which the claim
/// statements return beside the delivery's columns).
pub(crate) fn partition(row: &PgRow) -> Result<DateTime<Utc>> {
    get(row, "d_retain_from")
}

/// An attempt and the delivery it belongs to.
pub(crate) fn attempt(row: &PgRow) -> Result<(Uuid, Attempt)> {
    let number: i32 = get(row, "number")?;
    let duration_ms: i64 = get(row, "duration_ms")?;
    let class: Option<String> = get(row, "error_class")?;
    let attempt = Attempt {
        number: u32::try_from(number).map_err(|e| corrupt("attempt number", e))?,
        started_at: get(row, "started_at")?,
        duration: Duration::from_millis(
            u64::try_from(duration_ms).map_err(|e| corrupt("duration_ms", e))?,
        ),
        status: status(row, "status")?,
        error_class: class
            .map(|c| ErrorClass::parse(&c).ok_or_else(|| corrupt("error_class", &c)))
            .transpose()?,
        response_snippet: get(row, "response_snippet")?,
    };
    Ok((get(row, "delivery_id")?, attempt))
}

fn count(row: &PgRow, col: &str) -> Result<u64> {
    let n: i64 = get(row, col)?;
    u64::try_from(n).map_err(|e| corrupt(col, e))
}

/// A subscription's health from its counts row (`pending`, `oldest_pending`,
/// `dead`, `oldest_dead`) and its attempt rows (`status`, `error_class`, `n`).
pub(crate) fn subscription_health(
    counts: &PgRow,
    attempts: &[PgRow],
    signals: Vec<RaisedSignal>,
) -> Result<SubscriptionHealth> {
    let attempts = attempts
        .iter()
        .map(|row| {
            let class: Option<String> = get(row, "error_class")?;
            Ok(AttemptCount {
                status: status(row, "status")?,
                error_class: class
                    .map(|c| ErrorClass::parse(&c).ok_or_else(|| corrupt("error_class", &c)))
                    .transpose()?,
                count: count(row, "n")?,
            })
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(SubscriptionHealth {
        pending_count: count(counts, "pending")?,
        oldest_pending_created_at: get(counts, "oldest_pending")?,
        dead_count: count(counts, "dead")?,
        oldest_dead_at: get(counts, "oldest_dead")?,
        attempts,
        signals,
    })
}

/// A replay job from [`job_cols`].
pub(crate) fn replay_job(row: &PgRow) -> Result<ReplayJob> {
    let types: Vec<String> = get(row, "event_types")?;
    let states: Vec<String> = get(row, "states")?;
    let state: String = get(row, "state")?;
    Ok(ReplayJob {
        id: JobId::from_uuid(get(row, "job_id")?),
        sub_id: SubscriptionId::from_uuid(get(row, "sub_id")?),
        since: get(row, "since")?,
        until: get(row, "until")?,
        event_types: types
            .iter()
            .map(|t| EventType::parse(t).map_err(|e| corrupt("job event type", e)))
            .collect::<Result<_>>()?,
        states: states
            .iter()
            .map(|s| DeliveryState::parse(s).ok_or_else(|| corrupt("job delivery state", s)))
            .collect::<Result<_>>()?,
        state: JobState::parse(&state).ok_or_else(|| corrupt("job state", &state))?,
        total: count(row, "total")?,
        done: count(row, "done")?,
        failed: count(row, "failed")?,
        skipped: count(row, "skipped")?,
        requeued: count(row, "requeued")?,
        created_at: get(row, "created_at")?,
        finished_at: get(row, "finished_at")?,
    })
}

/// A raised signal from `sub_id`, `kind`, `detail`, `raised_at`.
pub(crate) fn raised_signal(row: &PgRow) -> Result<RaisedSignal> {
    let kind: String = get(row, "kind")?;
    Ok(RaisedSignal {
        sub_id: SubscriptionId::from_uuid(get(row, "sub_id")?),
        kind: SignalKind::parse(&kind).ok_or_else(|| corrupt("signal kind", &kind))?,
        detail: get(row, "detail")?,
        raised_at: get(row, "raised_at")?,
    })
}
