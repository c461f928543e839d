//! `/events`: ingest (the outbox's front door) and reading an event back.
//!
//! Ingest answers `202` only after [`Store::accept_events`] has committed the
//! event and all its deliveries in one transaction: the status is the
//! promise that the event will be delivered (design §3, §7). Concurrent
//! ingests share that transaction (the group committer, `committer.rs`);
//! each still gets its own result, as from [`Store::accept_event`].
//!
//! [`Store::accept_events`]: hookd_store::Store::accept_events
//! [`Store::accept_event`]: hookd_store::Store::accept_event

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use hookd_domain::event_type::EventType;
use hookd_domain::{CustomerId, DeliveryId, EventId, Timestamp};
use hookd_store::{DeliveryQuery, NewDelivery, NewEvent, StoreError};
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

use crate::AppState;
use crate::auth::Caller;
use crate::committer::Committed;
use crate::deliveries::DeliveryView;
use crate::error::ApiError;
use crate::extract::{IdPath, JsonBody};
use crate::fanout::BuiltIndex;
use crate::subscriptions::owner_for;

/// Event types under this prefix are hookd's own system events
/// (`hookd.subscription.disabled`, …): producers cannot post them.
const SYSTEM_PREFIX: &str = "hookd.";

use crate::limits::{
    MAX_EVENT_DELIVERIES, MAX_IDEMPOTENCY_KEY_CHARS, MAX_PAYLOAD_DEPTH, json_depth,
};

#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct CreateEvent {
    #[serde(rename = "type")]
    event_type: String,
    /// Kept as the producer's exact text, so what we deliver is byte-for-byte
    /// what was sent (signatures are over those bytes).
    #[schema(value_type = Value)]
    payload: Box<RawValue>,
    #[serde(default)]
    idempotency_key: Option<String>,
    #[serde(default)]
    customer_id: Option<String>,
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
struct AcceptedView {
    #[schema(value_type = String)]
    event_id: EventId,
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
pub(crate) struct EventView {
    #[schema(value_type = String)]
    event_id: EventId,
    #[serde(rename = "type")]
    #[schema(value_type = String)]
    event_type: EventType,
    #[schema(value_type = Value)]
    payload: Box<RawValue>,
    idempotency_key: Option<String>,
    #[schema(value_type = Option<String>)]
    customer_id: Option<CustomerId>,
    #[schema(value_type = String, format = DateTime)]
    created_at: Timestamp,
    deliveries: Vec<DeliveryView>,
}

/// `POST /events`.
#[utoipa::path(
    post,
    path = "/events",
    operation_id = "create_event",
    tag = "events",
    request_body = CreateEvent,
    responses(
        (status = 202, description = "Committed with all its deliveries: the event will be delivered. A repeated idempotency key answers the first event's id.", body = AcceptedView),
        (status = 400, description = "Malformed request: bad JSON, a wrong type, a missing or unknown field or query parameter.", body = crate::error::Body),
        crate::error::CommonErrors,
        (status = 413, description = "The body is over the limit.", body = crate::error::Body),
        (status = 415, description = "The body is not declared as JSON.", body = crate::error::Body),
        (status = 422, description = "A value is refused; the message names the field.", body = crate::error::Body),
        (status = 429, description = "Refused, nothing written: it would fan out to a subscription whose backlog is stuck over the shedding threshold.", body = crate::error::Body, headers(("Retry-After" = u32, description = "Seconds to wait before retrying."))),
    ),
    security(("bearer" = [])),
)]
pub(crate) async fn create(
    State(state): State<AppState>,
    caller: Caller,
    JsonBody(req): JsonBody<CreateEvent>,
) -> Result<(StatusCode, Json<impl Serialize>), ApiError> {
    let event_type = EventType::parse(&req.event_type).map_err(|e| ApiError::invalid("type", e))?;
    if event_type.as_str().starts_with(SYSTEM_PREFIX) {
        return Err(ApiError::invalid(
            "type",
            format!("`{SYSTEM_PREFIX}` event types are hookd's own and cannot be posted"),
        ));
    }
    let payload = req.payload.get();
    let limit = state.config().max_payload_bytes;
    if payload.len() > limit {
        return Err(ApiError::PayloadTooLarge(format!(
            "payload is larger than the limit of {limit} bytes"
        )));
    }
    if json_depth(payload.as_bytes()) > MAX_PAYLOAD_DEPTH {
        return Err(ApiError::invalid(
            "payload",
            format!("nests arrays and objects deeper than the limit of {MAX_PAYLOAD_DEPTH} levels"),
        ));
    }
    if let Some(key) = &req.idempotency_key {
        let n = key.chars().count();
        if n == 0 || n > MAX_IDEMPOTENCY_KEY_CHARS {
            return Err(ApiError::invalid(
                "idempotency_key",
                format!("must be 1 to {MAX_IDEMPOTENCY_KEY_CHARS} characters"),
            ));
        }
    }
    let customer_id = owner_for(&caller, req.customer_id.as_deref())?;

    // Match against the index as last built; the commit checks that no
    // subscription changed since it was built (`committer.rs`), so no read
    // of the generation comes before the commit, or beside it.
    let fanout_cache = &state.inner.fanout;
    let (built, mut matched_at) = match fanout_cache.last_built() {
        Some((built, built_from)) => (built, Some(built_from)),
        None => (fanout_cache.current(state.store()).await?, None),
    };
    let mut deliveries = match_deliveries(&state, &built, &event_type, customer_id.as_ref())?;
    let mut claimable = claimable_of(&state, &built, &deliveries);
    let mut event = NewEvent {
        id: EventId::new(),
        event_type,
        payload: payload.to_owned(),
        idempotency_key: req.idempotency_key,
        customer_id,
    };
    // With whatever other events are being posted: one transaction for all
    // of them, and this answer only after it committed.
    let (accepted, fanout, claimed) = loop {
        let fanout = deliveries.len();
        match state
            .inner
            .committer
            .accept(
                &state.inner.store,
                event,
                deliveries,
                matched_at.take(),
                std::mem::take(&mut claimable),
            )
            .await?
        {
            Committed::Accepted(accepted, claimed) => break (accepted, fanout, claimed),
            // A subscription changed since the index was built: nothing was
            // written. Match again against an index as of now.
            Committed::Stale(back) => {
                event = back;
                let built = fanout_cache.current(state.store()).await?;
                deliveries = match_deliveries(
                    &state,
                    &built,
                    &event.event_type,
                    event.customer_id.as_ref(),
                )?;
                claimable = claimable_of(&state, &built, &deliveries);
            }
        }
    };
    fail::fail_point!("ingest.after_commit");
    if accepted.duplicate {
        metrics::counter!("hookd_events_duplicate_total").increment(1);
        tracing::debug!(event_id = %accepted.event_id, "repeated idempotency key; event already accepted");
    } else {
        metrics::counter!("hookd_events_accepted_total").increment(1);
        metrics::counter!("hookd_deliveries_created_total").increment(fanout as u64);
        tracing::debug!(event_id = %accepted.event_id, deliveries = fanout, "event accepted");
        // Deliveries claimed at ingest are the dispatcher's already; the
        // rest wait in the store for its next pass.
        if fanout > claimed {
            state.wake().notify_one();
        }
    }
    Ok((
        StatusCode::ACCEPTED,
        Json(AcceptedView {
            event_id: accepted.event_id,
        }),
    ))
}

/// The deliveries `built` gives an event of `event_type` (and
/// `customer_id`). Refused, before anything is written, when one would add
/// to a backlog stuck over the shedding threshold (R4's escape valve).
fn match_deliveries(
    state: &AppState,
    built: &BuiltIndex,
    event_type: &EventType,
    customer_id: Option<&CustomerId>,
) -> Result<Vec<NewDelivery>, ApiError> {
    let deliveries: Vec<NewDelivery> = built
        .index
        .matches(event_type, customer_id)
        .into_iter()
        .map(|t| NewDelivery {
            id: DeliveryId::new(),
            sub_id: t.sub_id,
            destination_host: t.destination_host.to_string(),
        })
        .collect();
    let shedding = state
        .inner
        .signals
        .shedding_among(deliveries.iter().map(|d| d.sub_id));
    if !shedding.is_empty() {
        metrics::counter!("hookd_events_shed_total").increment(1);
        return Err(ApiError::Shedding(shedding));
    }
    Ok(deliveries)
}

/// Per delivery, its subscription if the delivery may be claimed at ingest
/// (`committer::IngestHandoff`; the committer asks the dispatcher how many
/// of them it takes). Empty when this process does not dispatch, or for a
/// fan-out wider than the default lazy threshold: the store writes such an
/// event lazily (§9.2), and a lazy event's deliveries are never claimed.
fn claimable_of(
    state: &AppState,
    built: &BuiltIndex,
    deliveries: &[NewDelivery],
) -> Vec<Option<std::sync::Arc<hookd_store::Subscription>>> {
    if !state.inner.committer.claims()
        || deliveries.len() > hookd_store::LazyFanout::DEFAULT.threshold
    {
        return Vec::new();
    }
    deliveries
        .iter()
        .map(|d| built.claimable.get(&d.sub_id).cloned())
        .collect()
}

/// `GET /events/{id}`.
#[utoipa::path(
    get,
    path = "/events/{id}",
    operation_id = "get_event",
    tag = "events",
    params(
        ("id" = String, Path, description = "The event's id (`evt_…`)."),
    ),
    responses(
        (status = 200, description = "The event, its payload as sent, and its deliveries.", body = EventView),
        crate::error::CommonErrors,
        (status = 404, description = "No such event, or not the caller's (also a malformed id).", body = crate::error::Body),
    ),
    security(("bearer" = [])),
)]
pub(crate) async fn get(
    State(state): State<AppState>,
    caller: Caller,
    IdPath(id): IdPath<EventId>,
) -> Result<Json<EventView>, ApiError> {
    let not_found = || ApiError::not_found("event");
    let event = state.store().get_event(&id).await.map_err(|e| match e {
        StoreError::NotFound => not_found(),
        e => e.into(),
    })?;
    if !caller.can_see(event.customer_id.as_ref()) {
        return Err(not_found());
    }
    let query = DeliveryQuery {
        event_id: Some(id),
        limit: MAX_EVENT_DELIVERIES,
        ..Default::default()
    };
    let deliveries = state.store().list_deliveries(&query).await?;
    // A stored payload that is not JSON is a corrupt record, not the caller's
    // mistake; ApiError logs the chain.
    let payload =
        RawValue::from_string(event.payload).map_err(|e| ApiError::Internal(Box::new(e)))?;
    Ok(Json(EventView {
        event_id: event.id,
        event_type: event.event_type,
        payload,
        idempotency_key: event.idempotency_key,
        customer_id: event.customer_id,
        created_at: event.created_at,
        deliveries: deliveries.into_iter().map(DeliveryView::from).collect(),
    }))
}
