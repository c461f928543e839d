//! Bulk replay jobs (design §3, R3): `POST /subscriptions/{id}/replay`
//! starts one, `GET /jobs/{id}` shows its progress, `DELETE /jobs/{id}`
//! cancels it.
//!
//! A job is not a synchronous call: it fixes the deliveries it covers when
//! it is created (so `total` is exact) and the dispatcher's replay runner
//! re-queues them a window at a time under the destination's admission —
//! circuit, rate and ramp — as `hookd_domain::replay` explains.

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use hookd_domain::delivery::DeliveryState;
use hookd_domain::event_type::EventType;
use hookd_domain::{JobId, SubscriptionId, Timestamp};
use hookd_store::{JobState, NewReplayJob, ReplayJob, StoreError};
use serde::{Deserialize, Serialize};

use crate::AppState;
use crate::auth::Caller;
use crate::error::ApiError;
use crate::extract::{IdPath, JsonBody};
use crate::subscriptions::visible;

use crate::limits::MAX_REPLAY_TYPES as MAX_TYPES;

/// The request body.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct CreateJob {
    /// Deliveries created at or after this time (RFC 3339).
    #[schema(value_type = String, format = DateTime)]
    since: Timestamp,
    /// Deliveries created before this time; now when absent.
    #[serde(default)]
    #[schema(value_type = Option<String>, format = DateTime)]
    until: Option<Timestamp>,
    /// Only these event types (exact names); all when absent or empty.
    #[serde(default)]
    types: Vec<String>,
    /// Only deliveries in these states: `failed`, `dead`, `delivered`.
    /// `["failed", "dead"]` when absent: what a recovered endpoint missed.
    #[serde(default)]
    #[schema(value_type = Option<Vec<crate::openapi::DeliveryState>>)]
    statuses: Option<Vec<String>>,
}

/// A job, as the API shows it.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub(crate) struct JobView {
    #[schema(value_type = String)]
    job_id: JobId,
    #[schema(value_type = String)]
    sub_id: SubscriptionId,
    #[schema(value_type = crate::openapi::JobState)]
    state: JobState,
    total: u64,
    done: u64,
    failed: u64,
    skipped: u64,
    /// Re-queued and not finished yet.
    in_progress: u64,
    #[schema(value_type = String, format = DateTime)]
    since: Timestamp,
    #[schema(value_type = String, format = DateTime)]
    until: Timestamp,
    #[schema(value_type = Vec<String>)]
    types: Vec<EventType>,
    #[schema(value_type = Vec<crate::openapi::DeliveryState>)]
    statuses: Vec<DeliveryState>,
    #[schema(value_type = String, format = DateTime)]
    created_at: Timestamp,
    #[schema(value_type = Option<String>, format = DateTime)]
    finished_at: Option<Timestamp>,
}

impl From<ReplayJob> for JobView {
    fn from(j: ReplayJob) -> Self {
        Self {
            job_id: j.id,
            sub_id: j.sub_id,
            state: j.state,
            total: j.total,
            done: j.done,
            failed: j.failed,
            skipped: j.skipped,
            in_progress: j.requeued,
            since: j.since,
            until: j.until,
            types: j.event_types,
            statuses: j.states,
            created_at: j.created_at,
            finished_at: j.finished_at,
        }
    }
}

fn parse_statuses(statuses: Option<Vec<String>>) -> Result<Vec<DeliveryState>, ApiError> {
    let Some(names) = statuses else {
        return Ok(vec![DeliveryState::Failed, DeliveryState::Dead]);
    };
    if names.is_empty() {
        return Err(ApiError::invalid(
            "statuses",
            "must name at least one of failed, dead, delivered (or be left out)",
        ));
    }
    let mut out = Vec::new();
    for name in names {
        match DeliveryState::parse(&name) {
            Some(s) if s.is_final() => {
                if !out.contains(&s) {
                    out.push(s);
                }
            }
            _ => {
                return Err(ApiError::invalid(
                    "statuses",
                    format!(
                        "`{name}` is not one of failed, dead, delivered (pending and in-flight deliveries are on their way already)"
                    ),
                ));
            }
        }
    }
    Ok(out)
}

/// `POST /subscriptions/{id}/replay` → `202` with the job.
#[utoipa::path(
    post,
    path = "/subscriptions/{id}/replay",
    operation_id = "create_replay_job",
    tag = "jobs",
    params(
        ("id" = String, Path, description = "The subscription's id (`sub_…`)."),
    ),
    request_body = CreateJob,
    responses(
        (status = 202, description = "The job, started.", body = JobView),
        (status = 400, description = "Malformed request: bad JSON, a wrong type, a missing or unknown field or query parameter.", body = crate::error::Body),
        crate::error::CommonErrors,
        (status = 404, description = "No such subscription, or not the caller's (also a malformed id).", body = crate::error::Body),
        (status = 413, description = "The body is over the limit.", body = crate::error::Body),
        (status = 415, description = "The body is not declared as JSON.", body = crate::error::Body),
        (status = 422, description = "A value is refused; the message names the field.", body = crate::error::Body),
    ),
    security(("bearer" = [])),
)]
pub(crate) async fn create(
    State(state): State<AppState>,
    caller: Caller,
    IdPath(sub_id): IdPath<SubscriptionId>,
    JsonBody(req): JsonBody<CreateJob>,
) -> Result<(StatusCode, Json<JobView>), ApiError> {
    let until = req.until.unwrap_or_else(chrono::Utc::now);
    if req.since >= until {
        return Err(ApiError::invalid("since", "must be before until"));
    }
    if req.types.len() > MAX_TYPES {
        return Err(ApiError::invalid(
            "types",
            format!("at most {MAX_TYPES} event types"),
        ));
    }
    let event_types = req
        .types
        .iter()
        .map(|t| EventType::parse(t).map_err(|e| ApiError::invalid("types", e)))
        .collect::<Result<Vec<_>, _>>()?;
    let states = parse_statuses(req.statuses)?;
    visible(&state, &caller, &sub_id).await?;
    let job = state
        .store()
        .create_replay_job(NewReplayJob {
            id: JobId::new(),
            sub_id,
            since: req.since,
            until,
            event_types,
            states,
        })
        .await
        .map_err(|e| match e {
            StoreError::NotFound => ApiError::not_found("subscription"),
            e => e.into(),
        })?;
    tracing::info!(job_id = %job.id, sub_id = %sub_id, total = job.total, "replay job created");
    Ok((StatusCode::ACCEPTED, Json(job.into())))
}

/// The job, if the caller may see it: a customer sees the jobs of its own
/// subscriptions; anything else is 404, as if it did not exist.
async fn visible_job(state: &AppState, caller: &Caller, id: &JobId) -> Result<ReplayJob, ApiError> {
    let not_found = || ApiError::not_found("job");
    let job = state
        .store()
        .get_replay_job(id)
        .await
        .map_err(|e| match e {
            StoreError::NotFound => not_found(),
            e => e.into(),
        })?;
    let owner = match state.store().get_subscription(&job.sub_id).await {
        Ok(sub) => sub.customer_id,
        // A deleted subscription's jobs stay visible to the admin only.
        Err(StoreError::NotFound) => None,
        Err(e) => return Err(e.into()),
    };
    let deleted_owner_hidden = owner.is_none() && caller.customer().is_some();
    if deleted_owner_hidden || !caller.can_see(owner.as_ref()) {
        return Err(not_found());
    }
    Ok(job)
}

/// `GET /jobs/{id}`.
#[utoipa::path(
    get,
    path = "/jobs/{id}",
    operation_id = "get_replay_job",
    tag = "jobs",
    params(
        ("id" = String, Path, description = "The job's id (`job_…`)."),
    ),
    responses(
        (status = 200, description = "The job and its progress.", body = JobView),
        crate::error::CommonErrors,
        (status = 404, description = "No such job, or not the caller's (also a malformed id).", body = crate::error::Body),
    ),
    security(("bearer" = [])),
)]
pub(crate) async fn get(
    State(state): State<AppState>,
    caller: Caller,
    IdPath(id): IdPath<JobId>,
) -> Result<Json<JobView>, ApiError> {
    Ok(Json(visible_job(&state, &caller, &id).await?.into()))
}

/// `DELETE /jobs/{id}`: cancels; the job as it is after. Cancelling a job
/// that has ended changes nothing.
#[utoipa::path(
    delete,
    path = "/jobs/{id}",
    operation_id = "cancel_replay_job",
    tag = "jobs",
    params(
        ("id" = String, Path, description = "The job's id (`job_…`)."),
    ),
    responses(
        (status = 200, description = "The job after cancelling (unchanged if it had ended).", body = JobView),
        crate::error::CommonErrors,
        (status = 404, description = "No such job, or not the caller's (also a malformed id).", body = crate::error::Body),
    ),
    security(("bearer" = [])),
)]
pub(crate) async fn cancel(
    State(state): State<AppState>,
    caller: Caller,
    IdPath(id): IdPath<JobId>,
) -> Result<Json<JobView>, ApiError> {
    visible_job(&state, &caller, &id).await?;
    let job = state
        .store()
        .cancel_replay_job(&id)
        .await
        .map_err(|e| match e {
            StoreError::NotFound => ApiError::not_found("job"),
            e => e.into(),
        })?;
    Ok(Json(job.into()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_default_to_what_a_recovered_endpoint_missed() {
        assert_eq!(
            parse_statuses(None).unwrap(),
            vec![DeliveryState::Failed, DeliveryState::Dead]
        );
        assert_eq!(
            parse_statuses(Some(vec!["delivered".into(), "delivered".into()])).unwrap(),
            vec![DeliveryState::Delivered]
        );
        assert!(parse_statuses(Some(vec!["pending".into()])).is_err());
        assert!(parse_statuses(Some(vec![])).is_err());
    }
}
