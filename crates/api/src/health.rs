//! `GET /subscriptions/{id}/health`: what a customer needs to see that their
//! endpoint is failing, and why, without opening a support ticket (design
//! §3, R6).
//!
//! Two sources: the store's counts for the subscription (backlog, dead
//! deliveries, the last hour's attempts by status), and the live isolation
//! state of its destination host, which only the dispatcher of this process
//! knows. The binary installs a hook for the latter
//! ([`AppState::set_destination_state`](crate::AppState::set_destination_state)),
//! so this crate never depends on the dispatcher.

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::Json;
use axum::extract::State;
use hookd_domain::SubscriptionId;
use hookd_domain::health::{LikelyConfigurationError, likely_configuration_error};
use hookd_domain::isolation::CircuitState;
use hookd_domain::subscription::SubscriptionState;
use hookd_store::{SignalKind, StoreError, SubscriptionHealth};
use serde::Serialize;

use crate::AppState;
use crate::auth::Caller;
use crate::error::ApiError;
use crate::extract::IdPath;
use crate::subscriptions::visible;

/// How far back attempts count towards the success rate, the status counts
/// and the configuration-error judgement.
pub(crate) const WINDOW: chrono::Duration = chrono::Duration::hours(1);

/// A destination host's live isolation state, as the running dispatcher
/// sees it.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct DestinationView {
    /// The circuit breaker's state.
    pub circuit_state: CircuitState,
    /// Attempts in flight to the host now.
    pub in_flight: u32,
    /// The rate admitted now, in attempts per second.
    pub rate_per_sec: f64,
    /// The recovery ramp's level in `[0.1, 1]`; 1 when not ramping.
    pub ramp_level: f64,
}

/// Looks up a host's live state; `None` if this process has not seen it.
pub type DestinationState = Arc<dyn Fn(&str) -> Option<DestinationView> + Send + Sync>;

/// The response body.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub(crate) struct HealthView {
    #[schema(value_type = String)]
    sub_id: SubscriptionId,
    #[schema(value_type = crate::openapi::SubscriptionState)]
    state: SubscriptionState,
    destination_host: String,
    #[schema(value_type = crate::openapi::CircuitState)]
    circuit_state: CircuitState,
    in_flight: u32,
    /// `null` when this process has not sent to the host yet.
    rate_per_sec: Option<f64>,
    /// `null` when this process has not sent to the host yet.
    ramp_level: Option<f64>,
    /// Delivered ÷ finished attempts over the window; `null` with none.
    success_rate: Option<f64>,
    /// Age of the oldest unfinished delivery, in seconds; 0 with none.
    lag_secs: i64,
    pending_count: u64,
    dead_count: u64,
    oldest_dead_at: Option<chrono::DateTime<chrono::Utc>>,
    /// The window's attempts by status (`"200"`) or error class (`"timeout"`).
    last_status_counts: BTreeMap<String, u64>,
    /// Advisory (R6): most failures share one 4xx status.
    #[schema(value_type = Option<crate::openapi::LikelyConfigurationError>)]
    likely_configuration_error: Option<LikelyConfigurationError>,
    /// Ingest refuses events for it with 429 (R4's escape valve): its
    /// backlog is over the threshold and has not shrunk.
    shedding: bool,
    /// What hookd has announced about it (`hookd.subscription.*` events)
    /// and not withdrawn.
    signals: Vec<SignalView>,
}

/// A raised signal, as `/health` shows it.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub(crate) struct SignalView {
    #[schema(value_type = crate::openapi::SignalKind)]
    kind: SignalKind,
    detail: String,
    raised_at: chrono::DateTime<chrono::Utc>,
}

/// `GET /subscriptions/{id}/health`. Another customer's subscription is 404.
#[utoipa::path(
    get,
    path = "/subscriptions/{id}/health",
    operation_id = "get_subscription_health",
    tag = "subscriptions",
    params(
        ("id" = String, Path, description = "The subscription's id (`sub_…`)."),
    ),
    responses(
        (status = 200, description = "The subscription's health.", body = HealthView),
        crate::error::CommonErrors,
        (status = 404, description = "No such subscription, or not the caller's (also a malformed id).", body = crate::error::Body),
    ),
    security(("bearer" = [])),
)]
pub(crate) async fn get(
    State(state): State<AppState>,
    caller: Caller,
    IdPath(id): IdPath<SubscriptionId>,
) -> Result<Json<HealthView>, ApiError> {
    let sub = visible(&state, &caller, &id).await?;
    let now = chrono::Utc::now();
    let health = state
        .store()
        .subscription_health(&id, now - WINDOW)
        .await
        .map_err(|e| match e {
            // Deleted between the two reads.
            StoreError::NotFound => ApiError::not_found("subscription"),
            e => e.into(),
        })?;
    let host = sub.url.host().to_owned();
    let live = state.destination_state(&host);
    Ok(Json(view(sub.id, sub.state, host, live, &health, now)))
}

fn view(
    sub_id: SubscriptionId,
    state: SubscriptionState,
    destination_host: String,
    live: Option<DestinationView>,
    health: &SubscriptionHealth,
    now: chrono::DateTime<chrono::Utc>,
) -> HealthView {
    let finished = health.finished_attempts();
    let success_rate =
        (finished > 0).then(|| health.successful_attempts() as f64 / finished as f64);
    let last_status_counts = health
        .attempts
        .iter()
        .map(|a| {
            let key = match (a.status, a.error_class) {
                (Some(status), _) => status.to_string(),
                (None, Some(class)) => class.as_str().to_owned(),
                (None, None) => "unknown".to_owned(),
            };
            (key, a.count)
        })
        .fold(BTreeMap::new(), |mut m, (k, n)| {
            *m.entry(k).or_insert(0) += n;
            m
        });
    let shedding = health
        .signals
        .iter()
        .any(|s| s.kind == SignalKind::Shedding);
    let signals = health
        .signals
        .iter()
        .map(|s| SignalView {
            kind: s.kind,
            detail: s.detail.clone(),
            raised_at: s.raised_at,
        })
        .collect();
    HealthView {
        sub_id,
        state,
        destination_host,
        circuit_state: live.map_or(CircuitState::Closed, |l| l.circuit_state),
        in_flight: live.map_or(0, |l| l.in_flight),
        rate_per_sec: live.map(|l| l.rate_per_sec),
        ramp_level: live.map(|l| l.ramp_level),
        success_rate,
        lag_secs: health
            .oldest_pending_created_at
            .map_or(0, |t| (now - t).num_seconds().max(0)),
        pending_count: health.pending_count,
        dead_count: health.dead_count,
        oldest_dead_at: health.oldest_dead_at,
        last_status_counts,
        likely_configuration_error: configuration_error(health),
        shedding,
        signals,
    }
}

/// R6's judgement over the window's failed attempts (everything not 2xx).
pub(crate) fn configuration_error(health: &SubscriptionHealth) -> Option<LikelyConfigurationError> {
    let failures = health
        .attempts
        .iter()
        .filter(|a| !a.status.is_some_and(|s| (200..300).contains(&s)))
        .map(|a| (a.status, a.count));
    likely_configuration_error(failures)
}

/// Where the binary puts its lookup; empty until then (every host then
/// reads as unseen: circuit closed).
#[derive(Default)]
pub(crate) struct DestinationStateSlot(std::sync::OnceLock<DestinationState>);

impl DestinationStateSlot {
    pub(crate) fn set(&self, lookup: DestinationState) {
        let _ = self.0.set(lookup);
    }

    pub(crate) fn get(&self, host: &str) -> Option<DestinationView> {
        self.0.get().and_then(|lookup| lookup(host))
    }
}

impl std::fmt::Debug for DestinationStateSlot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.get().is_some() {
            "DestinationStateSlot(set)"
        } else {
            "DestinationStateSlot(empty)"
        })
    }
}
