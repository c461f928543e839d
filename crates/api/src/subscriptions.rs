//! `/subscriptions`: create, list, read, change and delete subscriptions.
//!
//! Every write refreshes the fan-out index before answering, so this node's
//! next event already matches the new state.

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use hookd_domain::destination::DestinationUrl;
use hookd_domain::event_type::EventTypePattern;
use hookd_domain::signing::SigningSecret;
use hookd_domain::subscription::{
    InvalidMaxConcurrency, InvalidRateLimit, MAX_EVENT_TYPES, RetryPolicy, SigningKeys,
    Subscription, SubscriptionState, parse_max_concurrency, parse_rate_limit,
};
use hookd_domain::{CustomerId, SubscriptionId, Timestamp};
use hookd_store::{NewSubscription, SubscriptionPatch, SubscriptionQuery};
use serde::{Deserialize, Deserializer, Serialize};

use crate::AppState;
use crate::auth::Caller;
use crate::error::ApiError;
use crate::extract::{IdPath, JsonBody, QueryParams, from_str, take_limit};

use crate::limits::{
    DEFAULT_PAGE_SIZE as DEFAULT_LIMIT, MAX_DESCRIPTION_CHARS, MAX_PAGE_SIZE as MAX_LIMIT,
};

/// A subscription as the API shows it. The secret is never part of it.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub(crate) struct SubscriptionView {
    #[schema(value_type = String)]
    sub_id: SubscriptionId,
    url: String,
    #[schema(value_type = Vec<String>)]
    event_types: Vec<EventTypePattern>,
    #[schema(value_type = Option<String>)]
    customer_id: Option<CustomerId>,
    ordered: bool,
    #[schema(value_type = crate::openapi::RetryPolicy)]
    retry_policy: RetryPolicy,
    /// Attempts per second at the destination host; `null` is adaptive.
    rate_limit: Option<u32>,
    /// Attempts in flight at once to the destination host; `null` is the
    /// server-wide cap.
    max_concurrency: Option<u32>,
    #[schema(value_type = crate::openapi::SubscriptionState)]
    state: SubscriptionState,
    description: Option<String>,
    #[schema(value_type = String, format = DateTime)]
    created_at: Timestamp,
    #[schema(value_type = String, format = DateTime)]
    updated_at: Timestamp,
}

impl From<Subscription> for SubscriptionView {
    fn from(s: Subscription) -> Self {
        Self {
            sub_id: s.id,
            url: s.url.as_str().to_owned(),
            event_types: s.event_types,
            customer_id: s.customer_id,
            ordered: s.ordered,
            retry_policy: s.retry_policy,
            rate_limit: s.rate_limit,
            max_concurrency: s.max_concurrency,
            state: s.state,
            description: s.description,
            created_at: s.created_at,
            updated_at: s.updated_at,
        }
    }
}

/// The creation response: the subscription and, this once, its secret.
#[derive(Debug, Serialize, utoipa::ToSchema)]
struct CreatedView {
    #[serde(flatten)]
    subscription: SubscriptionView,
    secret: String,
}

#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct CreateSubscription {
    url: String,
    event_types: Vec<String>,
    #[serde(default)]
    secret: Option<String>,
    #[serde(default)]
    customer_id: Option<String>,
    #[serde(default)]
    ordered: Option<bool>,
    #[serde(default)]
    #[schema(value_type = Option<crate::openapi::RetryPolicy>)]
    retry_policy: Option<RetryPolicy>,
    /// Any JSON number, so that `0`, `-1` or `2.5` reach
    /// [`check_rate_limit`] and are refused with 422 like other values out
    /// of bounds; a string or other non-number is still a 400.
    #[serde(default)]
    #[schema(value_type = Option<u32>)]
    rate_limit: Option<serde_json::Number>,
    /// Any JSON number, for the same reason: out of bounds is 422 from
    /// [`check_max_concurrency`], a non-number 400.
    #[serde(default)]
    #[schema(value_type = Option<u32>)]
    max_concurrency: Option<serde_json::Number>,
    #[serde(default)]
    description: Option<String>,
}

#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct PatchSubscription {
    #[serde(default)]
    url: Option<String>,
    #[serde(default)]
    event_types: Option<Vec<String>>,
    #[serde(default)]
    ordered: Option<bool>,
    #[serde(default)]
    #[schema(value_type = Option<crate::openapi::RetryPolicy>)]
    retry_policy: Option<RetryPolicy>,
    #[serde(default)]
    #[schema(value_type = Option<crate::openapi::SubscriptionState>)]
    state: Option<String>,
    /// Absent leaves it; `null` clears it (adaptive again).
    #[serde(default, deserialize_with = "present")]
    #[schema(value_type = Option<u32>)]
    rate_limit: Option<Option<serde_json::Number>>,
    /// Absent leaves it; `null` clears it (the server-wide cap again).
    #[serde(default, deserialize_with = "present")]
    #[schema(value_type = Option<u32>)]
    max_concurrency: Option<Option<serde_json::Number>>,
    /// Absent leaves it; `null` clears it.
    #[serde(default, deserialize_with = "present")]
    #[schema(value_type = Option<String>)]
    description: Option<Option<String>>,
}

/// Tells a field given as `null` (`Some(None)`) from an absent one (`None`).
fn present<'de, D: Deserializer<'de>, T: Deserialize<'de>>(
    d: D,
) -> Result<Option<Option<T>>, D::Error> {
    Option::<T>::deserialize(d).map(Some)
}

/// The response to `GET /subscriptions`.
#[derive(Debug, Serialize, utoipa::ToSchema)]
#[schema(as = SubscriptionPage)]
struct Page {
    data: Vec<SubscriptionView>,
    #[schema(value_type = Option<String>)]
    next_cursor: Option<SubscriptionId>,
}

fn parse_url(s: &str, state: &AppState) -> Result<DestinationUrl, ApiError> {
    DestinationUrl::parse(s, state.config().destination_policy)
        .map_err(|e| ApiError::invalid("url", e))
}

fn parse_event_types(raw: &[String]) -> Result<Vec<EventTypePattern>, ApiError> {
    if raw.is_empty() {
        return Err(ApiError::invalid(
            "event_types",
            "must list at least one pattern",
        ));
    }
    if raw.len() > MAX_EVENT_TYPES {
        return Err(ApiError::invalid(
            "event_types",
            format!("must list at most {MAX_EVENT_TYPES} patterns"),
        ));
    }
    let mut out = Vec::with_capacity(raw.len());
    for (i, p) in raw.iter().enumerate() {
        let p = EventTypePattern::parse(p)
            .map_err(|e| ApiError::invalid(&format!("event_types[{i}]"), e))?;
        if !out.contains(&p) {
            out.push(p);
        }
    }
    Ok(out)
}

fn check_retry_policy(p: RetryPolicy) -> Result<RetryPolicy, ApiError> {
    p.validate()
        .map_err(|e| ApiError::invalid("retry_policy", e))?;
    Ok(p)
}

/// An explicit rate limit: a whole number of attempts per second within the
/// domain's bounds. A fraction, a negative or a too-large number is a value
/// out of bounds (422), not a malformed body.
fn check_rate_limit(n: serde_json::Number) -> Result<u32, ApiError> {
    n.as_u64()
        .ok_or(InvalidRateLimit)
        .and_then(parse_rate_limit)
        .map_err(|e| ApiError::invalid("rate_limit", e))
}

/// An explicit concurrency cap: a whole number of attempts in flight within
/// the domain's bounds. A fraction, a negative or a too-large number is a
/// value out of bounds (422), not a malformed body.
fn check_max_concurrency(n: serde_json::Number) -> Result<u32, ApiError> {
    n.as_u64()
        .ok_or(InvalidMaxConcurrency)
        .and_then(parse_max_concurrency)
        .map_err(|e| ApiError::invalid("max_concurrency", e))
}

fn check_description(d: String) -> Result<String, ApiError> {
    if d.chars().count() > MAX_DESCRIPTION_CHARS {
        return Err(ApiError::invalid(
            "description",
            format!("must be at most {MAX_DESCRIPTION_CHARS} characters"),
        ));
    }
    Ok(d)
}

fn parse_customer(s: &str) -> Result<CustomerId, ApiError> {
    CustomerId::parse(s).map_err(|e| ApiError::invalid("customer_id", e))
}

/// The customer a new record belongs to: a customer token's own (an explicit
/// different one is refused), or an admin's explicit choice.
pub(crate) fn owner_for(
    caller: &Caller,
    explicit: Option<&str>,
) -> Result<Option<CustomerId>, ApiError> {
    let explicit = explicit.map(parse_customer).transpose()?;
    match (caller.customer(), explicit) {
        (Some(own), Some(given)) if *own != given => Err(ApiError::invalid(
            "customer_id",
            "must be the token's own customer (or be left out)",
        )),
        (Some(own), _) => Ok(Some(own.clone())),
        (None, given) => Ok(given),
    }
}

/// The subscription with `id`, if the caller may see it; otherwise 404.
pub(crate) async fn visible(
    state: &AppState,
    caller: &Caller,
    id: &SubscriptionId,
) -> Result<Subscription, ApiError> {
    let not_found = || ApiError::not_found("subscription");
    let sub = state
        .store()
        .get_subscription(id)
        .await
        .map_err(|e| match e {
            hookd_store::StoreError::NotFound => not_found(),
            e => e.into(),
        })?;
    if caller.can_see(sub.customer_id.as_ref()) {
        Ok(sub)
    } else {
        Err(not_found())
    }
}

/// `POST /subscriptions`.
#[utoipa::path(
    post,
    path = "/subscriptions",
    operation_id = "create_subscription",
    tag = "subscriptions",
    request_body = CreateSubscription,
    responses(
        (status = 201, description = "Created; the signing secret is shown this once.", body = CreatedView),
        (status = 400, description = "Malformed request: bad JSON, a wrong type, a missing or unknown field or query parameter.", body = crate::error::Body),
        crate::error::CommonErrors,
        (status = 413, description = "The body is over the limit.", body = crate::error::Body),
        (status = 415, description = "The body is not declared as JSON.", body = crate::error::Body),
        (status = 422, description = "A value is refused; the message names the field.", body = crate::error::Body),
    ),
    security(("bearer" = [])),
)]
pub(crate) async fn create(
    State(state): State<AppState>,
    caller: Caller,
    JsonBody(req): JsonBody<CreateSubscription>,
) -> Result<Response, ApiError> {
    let url = parse_url(&req.url, &state)?;
    let event_types = parse_event_types(&req.event_types)?;
    let customer_id = owner_for(&caller, req.customer_id.as_deref())?;
    let secret = match &req.secret {
        Some(s) => SigningSecret::parse(s).map_err(|e| ApiError::invalid("secret", e))?,
        None => SigningSecret::generate(),
    };
    let retry_policy = check_retry_policy(req.retry_policy.unwrap_or_default())?;
    let rate_limit = req.rate_limit.map(check_rate_limit).transpose()?;
    let max_concurrency = req.max_concurrency.map(check_max_concurrency).transpose()?;
    let description = req.description.map(check_description).transpose()?;
    let exposed = secret.expose();
    let created = state
        .store()
        .create_subscription(NewSubscription {
            id: SubscriptionId::new(),
            customer_id,
            url,
            event_types,
            keys: SigningKeys {
                current: secret,
                previous: None,
            },
            ordered: req.ordered.unwrap_or(false),
            retry_policy,
            rate_limit,
            max_concurrency,
            description,
        })
        .await?;
    state.refresh_fanout().await;
    tracing::info!(sub_id = %created.id, host = created.url.host(), "subscription created");
    let body = CreatedView {
        subscription: created.into(),
        secret: exposed,
    };
    Ok((StatusCode::CREATED, Json(body)).into_response())
}

/// `GET /subscriptions`.
#[utoipa::path(
    get,
    path = "/subscriptions",
    operation_id = "list_subscriptions",
    tag = "subscriptions",
    params(
        ("customer_id" = Option<String>, Query, description = "Only this customer's. A customer token asking for another customer gets an empty page."),
        ("cursor" = Option<String>, Query, description = "The `next_cursor` of the previous page."),
        ("limit" = Option<u32>, Query, description = "Page size, 1 to 250; 50 when absent."),
    ),
    responses(
        (status = 200, description = "A page of subscriptions, oldest first.", body = Page),
        (status = 400, description = "Malformed request: bad JSON, a wrong type, a missing or unknown field or query parameter.", body = crate::error::Body),
        crate::error::CommonErrors,
    ),
    security(("bearer" = [])),
)]
pub(crate) async fn list(
    State(state): State<AppState>,
    caller: Caller,
    mut q: QueryParams,
) -> Result<Json<impl Serialize>, ApiError> {
    let customer = q.take_parsed("customer_id", |s| {
        CustomerId::parse(s).map_err(|e| e.to_string())
    })?;
    let cursor = q.take_parsed("cursor", from_str::<SubscriptionId>)?;
    let limit = take_limit(&mut q, DEFAULT_LIMIT, MAX_LIMIT)?;
    q.finish()?;
    let customer_id = match (caller.customer(), customer) {
        // Another customer's list is simply empty for a customer token.
        (Some(own), Some(asked)) if *own != asked => {
            return Ok(Json(Page {
                data: Vec::new(),
                next_cursor: None,
            }));
        }
        (Some(own), _) => Some(own.clone()),
        (None, asked) => asked,
    };
    let query = SubscriptionQuery {
        customer_id,
        cursor,
        limit: limit + 1,
    };
    let mut subs = state.store().list_subscriptions(&query).await?;
    let next_cursor = if subs.len() > limit as usize {
        subs.truncate(limit as usize);
        subs.last().map(|s| s.id)
    } else {
        None
    };
    Ok(Json(Page {
        data: subs.into_iter().map(SubscriptionView::from).collect(),
        next_cursor,
    }))
}

/// `GET /subscriptions/{id}`.
#[utoipa::path(
    get,
    path = "/subscriptions/{id}",
    operation_id = "get_subscription",
    tag = "subscriptions",
    params(
        ("id" = String, Path, description = "The subscription's id (`sub_…`)."),
    ),
    responses(
        (status = 200, description = "The subscription.", body = SubscriptionView),
        crate::error::CommonErrors,
        (status = 404, description = "No such subscription, or not the caller's (also a malformed id).", body = crate::error::Body),
    ),
    security(("bearer" = [])),
)]
pub(crate) async fn get(
    State(state): State<AppState>,
    caller: Caller,
    IdPath(id): IdPath<SubscriptionId>,
) -> Result<Json<SubscriptionView>, ApiError> {
    Ok(Json(visible(&state, &caller, &id).await?.into()))
}

/// `PATCH /subscriptions/{id}`.
#[utoipa::path(
    patch,
    path = "/subscriptions/{id}",
    operation_id = "update_subscription",
    tag = "subscriptions",
    params(
        ("id" = String, Path, description = "The subscription's id (`sub_…`)."),
    ),
    request_body = PatchSubscription,
    responses(
        (status = 200, description = "The subscription after the change (unchanged if the body changes nothing).", body = SubscriptionView),
        (status = 400, description = "Malformed request: bad JSON, a wrong type, a missing or unknown field or query parameter.", body = crate::error::Body),
        crate::error::CommonErrors,
        (status = 404, description = "No such subscription, or not the caller's (also a malformed id).", body = crate::error::Body),
        (status = 413, description = "The body is over the limit.", body = crate::error::Body),
        (status = 415, description = "The body is not declared as JSON.", body = crate::error::Body),
        (status = 422, description = "A value is refused; the message names the field.", body = crate::error::Body),
    ),
    security(("bearer" = [])),
)]
pub(crate) async fn update(
    State(state): State<AppState>,
    caller: Caller,
    IdPath(id): IdPath<SubscriptionId>,
    JsonBody(req): JsonBody<PatchSubscription>,
) -> Result<Json<SubscriptionView>, ApiError> {
    let patch = SubscriptionPatch {
        url: req
            .url
            .as_deref()
            .map(|u| parse_url(u, &state))
            .transpose()?,
        event_types: req
            .event_types
            .as_deref()
            .map(parse_event_types)
            .transpose()?,
        keys: None,
        ordered: req.ordered,
        retry_policy: req.retry_policy.map(check_retry_policy).transpose()?,
        state: req
            .state
            .as_deref()
            .map(|s| {
                SubscriptionState::parse(s)
                    .ok_or_else(|| ApiError::invalid("state", "must be \"active\" or \"disabled\""))
            })
            .transpose()?,
        rate_limit: req
            .rate_limit
            .map(|r| r.map(check_rate_limit).transpose())
            .transpose()?,
        max_concurrency: req
            .max_concurrency
            .map(|c| c.map(check_max_concurrency).transpose())
            .transpose()?,
        description: req
            .description
            .map(|d| d.map(check_description).transpose())
            .transpose()?,
    };
    let current = visible(&state, &caller, &id).await?;
    let unchanged = patch.url.is_none()
        && patch.event_types.is_none()
        && patch.ordered.is_none()
        && patch.retry_policy.is_none()
        && patch.state.is_none()
        && patch.rate_limit.is_none()
        && patch.max_concurrency.is_none()
        && patch.description.is_none();
    if unchanged {
        return Ok(Json(current.into()));
    }
    let updated = write(&state, &id, patch).await?;
    tracing::info!(sub_id = %id, "subscription updated");
    Ok(Json(updated.into()))
}

/// Applies `patch` and brings the fan-out index up to date: every route that
/// changes a subscription goes through here. A subscription that vanished
/// meanwhile is a 404.
pub(crate) async fn write(
    state: &AppState,
    id: &SubscriptionId,
    patch: SubscriptionPatch,
) -> Result<Subscription, ApiError> {
    let updated = state
        .store()
        .update_subscription(id, patch)
        .await
        .map_err(|e| match e {
            hookd_store::StoreError::NotFound => ApiError::not_found("subscription"),
            e => e.into(),
        })?;
    state.refresh_fanout().await;
    Ok(updated)
}

/// `DELETE /subscriptions/{id}`.
#[utoipa::path(
    delete,
    path = "/subscriptions/{id}",
    operation_id = "delete_subscription",
    tag = "subscriptions",
    params(
        ("id" = String, Path, description = "The subscription's id (`sub_…`)."),
    ),
    responses(
        (status = 204, description = "Deleted."),
        crate::error::CommonErrors,
        (status = 404, description = "No such subscription, or not the caller's (also a malformed id).", body = crate::error::Body),
    ),
    security(("bearer" = [])),
)]
pub(crate) async fn delete(
    State(state): State<AppState>,
    caller: Caller,
    IdPath(id): IdPath<SubscriptionId>,
) -> Result<StatusCode, ApiError> {
    visible(&state, &caller, &id).await?;
    state
        .store()
        .delete_subscription(&id)
        .await
        .map_err(|e| match e {
            hookd_store::StoreError::NotFound => ApiError::not_found("subscription"),
            e => e.into(),
        })?;
    state.refresh_fanout().await;
    tracing::info!(sub_id = %id, "subscription deleted");
    Ok(StatusCode::NO_CONTENT)
}
