//! `GET /metrics`: Prometheus text exposition.
//!
//! Admin only: the per-destination series name customers' hosts. A customer
//! token gets 404, like any route it may not see. What is rendered is the
//! binary's business (it installs the recorder); this crate only serves it.

use std::sync::Arc;

use axum::extract::State;
use axum::http::header::CONTENT_TYPE;
use axum::response::{IntoResponse, Response};

use crate::AppState;
use crate::auth::Caller;
use crate::error::ApiError;

/// Renders the current metrics as Prometheus text.
pub type RenderMetrics = Arc<dyn Fn() -> String + Send + Sync>;

/// `GET /metrics`.
#[utoipa::path(
    get,
    path = "/metrics",
    tag = "meta",
    responses(
        (status = 200, description = "Prometheus text exposition.", body = String, content_type = "text/plain; version=0.0.4"),
        crate::error::CommonErrors,
        (status = 404, description = "The caller is a customer token, or this process records no metrics.", body = crate::error::Body),
    ),
    security(("bearer" = [])),
)]
pub(crate) async fn metrics(
    State(state): State<AppState>,
    caller: Caller,
) -> Result<Response, ApiError> {
    let render = match (caller.customer(), state.metrics()) {
        (None, Some(render)) => render,
        _ => return Err(ApiError::NotFound("no such route".into())),
    };
    Ok(([(CONTENT_TYPE, "text/plain; version=0.0.4")], render()).into_response())
}

/// Where the binary puts its renderer; empty until then.
#[derive(Default)]
pub(crate) struct MetricsSlot(std::sync::OnceLock<RenderMetrics>);

impl MetricsSlot {
    pub(crate) fn set(&self, render: RenderMetrics) {
        let _ = self.0.set(render);
    }

    pub(crate) fn get(&self) -> Option<RenderMetrics> {
        self.0.get().cloned()
    }
}

impl std::fmt::Debug for MetricsSlot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.get().is_some() {
            "MetricsSlot(set)"
        } else {
            "MetricsSlot(empty)"
        })
    }
}
