//! Reading deliveries: one subscription's, filtered and paged, or one by id.
//!
//! A delivery belongs to its subscription's customer; a customer token sees
//! a delivery only through a subscription it can see.

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use hookd_domain::delivery::{DeliveryState, ErrorClass};
use hookd_domain::event_type::EventType;
use hookd_domain::{DeliveryId, EventId, SubscriptionId, Timestamp};
use hookd_store::{Attempt, DeliveryDetail, DeliveryQuery, StoreError};
use serde::Serialize;

use crate::AppState;
use crate::auth::Caller;
use crate::error::ApiError;
use crate::extract::{IdPath, QueryParams, from_str, take_limit};
use crate::subscriptions::visible;

use crate::limits::{DEFAULT_PAGE_SIZE as DEFAULT_LIMIT, MAX_PAGE_SIZE as MAX_LIMIT};

/// A delivery as the API shows it, with its attempts (oldest first).
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub(crate) struct DeliveryView {
    #[schema(value_type = String)]
    delivery_id: DeliveryId,
    #[schema(value_type = String)]
    event_id: EventId,
    #[schema(value_type = String)]
    sub_id: SubscriptionId,
    #[schema(value_type = String)]
    event_type: EventType,
    destination_host: String,
    #[schema(value_type = crate::openapi::DeliveryState)]
    state: DeliveryState,
    attempt: u32,
    /// `null` once the delivery is final: no attempt is scheduled.
    #[schema(value_type = Option<String>, format = DateTime)]
    next_attempt_at: Option<Timestamp>,
    last_status: Option<u16>,
    last_error: Option<String>,
    #[schema(value_type = String, format = DateTime)]
    created_at: Timestamp,
    #[schema(value_type = String, format = DateTime)]
    updated_at: Timestamp,
    attempts: Vec<AttemptView>,
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
struct AttemptView {
    number: u32,
    #[schema(value_type = String, format = DateTime)]
    started_at: Timestamp,
    duration_ms: u64,
    status: Option<u16>,
    #[schema(value_type = Option<crate::openapi::ErrorClass>)]
    error_class: Option<ErrorClass>,
    response_snippet: Option<String>,
}

impl From<Attempt> for AttemptView {
    fn from(a: Attempt) -> Self {
        Self {
            number: a.number,
            started_at: a.started_at,
            duration_ms: u64::try_from(a.duration.as_millis()).unwrap_or(u64::MAX),
            status: a.status,
            error_class: a.error_class,
            response_snippet: a.response_snippet,
        }
    }
}

impl From<DeliveryDetail> for DeliveryView {
    fn from(d: DeliveryDetail) -> Self {
        let DeliveryDetail {
            delivery: x,
            attempts,
        } = d;
        Self {
            delivery_id: x.id,
            event_id: x.event_id,
            sub_id: x.sub_id,
            event_type: x.event_type,
            destination_host: x.destination_host,
            state: x.state,
            attempt: x.attempt,
            next_attempt_at: (!x.state.is_final()).then_some(x.next_attempt_at),
            last_status: x.last_status,
            last_error: x.last_error,
            created_at: x.created_at,
            updated_at: x.updated_at,
            attempts: attempts.into_iter().map(AttemptView::from).collect(),
        }
    }
}

/// The response to a delivery listing.
#[derive(Debug, Serialize, utoipa::ToSchema)]
#[schema(as = DeliveryPage)]
struct Page {
    data: Vec<DeliveryView>,
    #[schema(value_type = Option<String>)]
    next_cursor: Option<DeliveryId>,
}

fn parse_time(s: &str) -> Result<Timestamp, String> {
    chrono::DateTime::parse_from_rfc3339(s)
        .map(|t| t.to_utc())
        .map_err(|e| format!("must be an RFC 3339 timestamp ({e})"))
}

/// `GET /subscriptions/{id}/deliveries`.
#[utoipa::path(
    get,
    path = "/subscriptions/{id}/deliveries",
    operation_id = "list_deliveries",
    tag = "deliveries",
    params(
        ("id" = String, Path, description = "The subscription's id (`sub_…`)."),
        ("status" = Option<crate::openapi::DeliveryState>, Query, description = "Only deliveries in this state."),
        ("since" = Option<String>, Query, format = DateTime, description = "Only deliveries created at or after this time (RFC 3339)."),
        ("until" = Option<String>, Query, format = DateTime, description = "Only deliveries created before this time (RFC 3339)."),
        ("event_type" = Option<String>, Query, description = "Only deliveries of this event type."),
        ("cursor" = Option<String>, Query, description = "The `next_cursor` of the previous page."),
        ("limit" = Option<u32>, Query, description = "Page size, 1 to 250; 50 when absent."),
    ),
    responses(
        (status = 200, description = "A page of the subscription's deliveries.", body = Page),
        (status = 400, description = "Malformed request: bad JSON, a wrong type, a missing or unknown field or query parameter.", body = crate::error::Body),
        crate::error::CommonErrors,
        (status = 404, description = "No such subscription, or not the caller's (also a malformed id).", body = crate::error::Body),
    ),
    security(("bearer" = [])),
)]
pub(crate) async fn list_for_subscription(
    State(state): State<AppState>,
    caller: Caller,
    IdPath(sub_id): IdPath<SubscriptionId>,
    mut q: QueryParams,
) -> Result<Json<impl Serialize>, ApiError> {
    let status = q.take_parsed("status", |s| {
        DeliveryState::parse(s)
            .ok_or_else(|| "must be one of pending, inflight, delivered, failed, dead".to_owned())
    })?;
    let since = q.take_parsed("since", parse_time)?;
    let until = q.take_parsed("until", parse_time)?;
    let event_type = q.take_parsed("event_type", |s| {
        EventType::parse(s).map_err(|e| e.to_string())
    })?;
    let cursor = q.take_parsed("cursor", from_str::<DeliveryId>)?;
    let limit = take_limit(&mut q, DEFAULT_LIMIT, MAX_LIMIT)?;
    q.finish()?;
    visible(&state, &caller, &sub_id).await?;
    let query = DeliveryQuery {
        sub_id: Some(sub_id),
        event_id: None,
        state: status,
        since,
        until,
        event_type,
        cursor,
        limit: limit + 1,
    };
    let mut found = state.store().list_deliveries(&query).await?;
    let next_cursor = if found.len() > limit as usize {
        found.truncate(limit as usize);
        found.last().map(|d| d.delivery.id)
    } else {
        None
    };
    Ok(Json(Page {
        data: found.into_iter().map(DeliveryView::from).collect(),
        next_cursor,
    }))
}

/// `GET /deliveries/{id}`.
#[utoipa::path(
    get,
    path = "/deliveries/{id}",
    operation_id = "get_delivery",
    tag = "deliveries",
    params(
        ("id" = String, Path, description = "The delivery's id (`dlv_…`)."),
    ),
    responses(
        (status = 200, description = "The delivery and its attempts, oldest first.", body = DeliveryView),
        crate::error::CommonErrors,
        (status = 404, description = "No such delivery, or not the caller's (also a malformed id).", body = crate::error::Body),
    ),
    security(("bearer" = [])),
)]
pub(crate) async fn get(
    State(state): State<AppState>,
    caller: Caller,
    IdPath(id): IdPath<DeliveryId>,
) -> Result<Json<DeliveryView>, ApiError> {
    Ok(Json(visible_delivery(&state, &caller, &id).await?.into()))
}

/// `POST /deliveries/{id}/replay`: a delivered, failed or dead delivery goes
/// back to pending with a fresh retry window; its `webhook-id` does not
/// change, so a consumer that already processed it can recognise it. A
/// delivery that is already pending or in flight is left as it is.
#[utoipa::path(
    post,
    path = "/deliveries/{id}/replay",
    operation_id = "replay_delivery",
    tag = "deliveries",
    params(
        ("id" = String, Path, description = "The delivery's id (`dlv_…`)."),
    ),
    responses(
        (status = 202, description = "Queued again (or left as it was, if pending or in flight).", body = DeliveryView),
        crate::error::CommonErrors,
        (status = 404, description = "No such delivery, or not the caller's (also a malformed id).", body = crate::error::Body),
        (status = 409, description = "The record's state forbids it.", body = crate::error::Body),
    ),
    security(("bearer" = [])),
)]
pub(crate) async fn replay(
    State(state): State<AppState>,
    caller: Caller,
    IdPath(id): IdPath<DeliveryId>,
) -> Result<(StatusCode, Json<DeliveryView>), ApiError> {
    visible_delivery(&state, &caller, &id).await?;
    state
        .store()
        .replay_delivery(&id)
        .await
        .map_err(|e| match e {
            StoreError::NotFound => ApiError::not_found("delivery"),
            e => e.into(),
        })?;
    state.wake().notify_one();
    let detail = visible_delivery(&state, &caller, &id).await?;
    Ok((StatusCode::ACCEPTED, Json(detail.into())))
}

/// The delivery with its attempts, if the caller may see it: a delivery is
/// its subscription's customer's, and a deleted or foreign subscription
/// hides it (404, never 403).
async fn visible_delivery(
    state: &AppState,
    caller: &Caller,
    id: &DeliveryId,
) -> Result<DeliveryDetail, ApiError> {
    let not_found = || ApiError::not_found("delivery");
    let detail = state.store().get_delivery(id).await.map_err(|e| match e {
        StoreError::NotFound => not_found(),
        e => e.into(),
    })?;
    if caller.customer().is_some() {
        visible(state, caller, &detail.delivery.sub_id)
            .await
            .map_err(|e| match e {
                ApiError::NotFound(_) => not_found(),
                e => e,
            })?;
    }
    Ok(detail)
}
