//! [`ApiError`]: every way a request can fail, and its one HTTP rendering.

use std::error::Error as StdError;
use std::fmt::Write as _;

use axum::Json;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use hookd_store::StoreError;
use serde::Serialize;

/// Why a request failed. Client mistakes carry a message naming what was
/// wrong; server-side failures keep their source chain for the log and show
/// the client only an opaque message.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// Malformed JSON, a wrong type, a missing or unknown field, a bad query
    /// parameter. The message names the field or parameter.
    #[error("{0}")]
    BadRequest(String),
    /// No bearer token, or one we do not know.
    #[error("missing or unknown bearer token")]
    Unauthorized,
    /// The resource does not exist or is not visible to the caller (never
    /// 403: a customer token must not learn what exists elsewhere).
    #[error("{0}")]
    NotFound(String),
    /// The path exists but not with this method.
    #[error("method not allowed for this path")]
    MethodNotAllowed,
    /// The body (or the event payload) is larger than the limit.
    #[error("{0}")]
    PayloadTooLarge(String),
    /// The body is not declared as JSON.
    #[error("{0}")]
    UnsupportedMediaType(String),
    /// Well-formed JSON with a value we refuse; the message names the field.
    #[error("{0}")]
    Validation(String),
    /// A uniqueness rule was broken.
    #[error("{0}")]
    Conflict(String),
    /// The event would fan out to subscriptions whose backlog is stuck over
    /// the shedding threshold (R4's escape valve): refused, nothing written.
    #[error(
        "refused: the backlog of subscription(s) {} is over the shedding threshold and not shrinking; retry later",
        .0.iter().map(ToString::to_string).collect::<Vec<_>>().join(", ")
    )]
    Shedding(Vec<hookd_domain::SubscriptionId>),
    /// Too many failed authentications from the caller's address: refused
    /// without looking at the token until the duration has passed.
    #[error(
        "too many failed authentication attempts from this address; retry in {} s",
        retry_after_secs(*.0)
    )]
    TooManyAuthFailures(std::time::Duration),
    /// The store could not be reached; retrying shortly may succeed.
    #[error("the store is unavailable")]
    Unavailable(#[source] StoreError),
    /// `/readyz`: the store does not answer, or its schema is not this
    /// build's. The message says which (no secrets: the check is public).
    #[error("not ready: {0}")]
    NotReady(String),
    /// Anything else: a bug or an unexpected backend failure.
    #[error("internal error")]
    Internal(#[source] Box<dyn StdError + Send + Sync>),
}

impl ApiError {
    /// A 404 naming what was not found (`"subscription"`, …).
    pub(crate) fn not_found(what: &str) -> Self {
        Self::NotFound(format!("{what} not found"))
    }

    /// A 422 for `field`, prefixing the detail with the field's name unless
    /// the detail already starts with it.
    pub(crate) fn invalid(field: &str, detail: impl std::fmt::Display) -> Self {
        let detail = detail.to_string();
        if detail.starts_with(field) {
            Self::Validation(detail)
        } else {
            Self::Validation(format!("{field}: {detail}"))
        }
    }

    fn status_and_code(&self) -> (StatusCode, &'static str) {
        match self {
            Self::BadRequest(_) => (StatusCode::BAD_REQUEST, "bad_request"),
            Self::Unauthorized => (StatusCode::UNAUTHORIZED, "unauthorized"),
            Self::NotFound(_) => (StatusCode::NOT_FOUND, "not_found"),
            Self::MethodNotAllowed => (StatusCode::METHOD_NOT_ALLOWED, "method_not_allowed"),
            Self::PayloadTooLarge(_) => (StatusCode::PAYLOAD_TOO_LARGE, "payload_too_large"),
            Self::UnsupportedMediaType(_) => {
                (StatusCode::UNSUPPORTED_MEDIA_TYPE, "unsupported_media_type")
            }
            Self::Validation(_) => (StatusCode::UNPROCESSABLE_ENTITY, "validation_failed"),
            Self::Conflict(_) => (StatusCode::CONFLICT, "conflict"),
            Self::Shedding(_) => (StatusCode::TOO_MANY_REQUESTS, "shedding"),
            Self::TooManyAuthFailures(_) => {
                (StatusCode::TOO_MANY_REQUESTS, "too_many_auth_failures")
            }
            Self::Unavailable(_) | Self::NotReady(_) => {
                (StatusCode::SERVICE_UNAVAILABLE, "unavailable")
            }
            Self::Internal(_) => (StatusCode::INTERNAL_SERVER_ERROR, "internal"),
        }
    }
}

impl From<StoreError> for ApiError {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::NotFound => Self::NotFound("not found".into()),
            StoreError::Conflict(m) => Self::Conflict(m),
            e @ StoreError::Unavailable(_) => Self::Unavailable(e),
            e @ (StoreError::Corrupt(_) | StoreError::Backend(_)) => Self::Internal(Box::new(e)),
        }
    }
}

/// `Retry-After` on a shed event: the monitor looks again about this often,
/// so sooner would only be refused again.
const SHEDDING_RETRY_AFTER_SECS: &str = "30";

/// Whole seconds to wait, rounded up, at least 1.
fn retry_after_secs(wait: std::time::Duration) -> u64 {
    let secs = wait.as_secs() + u64::from(wait.subsec_nanos() > 0);
    secs.max(1)
}

/// The failures every route that needs a token can answer, documented once
/// for all of them (`responses(crate::error::CommonErrors, …)`).
#[derive(utoipa::IntoResponses)]
#[allow(dead_code)] // Describes responses in the OpenAPI document; never built.
pub(crate) enum CommonErrors {
    /// No bearer token, or an unknown one (`WWW-Authenticate: Bearer`).
    #[response(status = 401)]
    Unauthorized(Body<'static>),
    /// Internal error.
    #[response(status = 500)]
    Internal(Body<'static>),
    /// The store is unavailable; retry shortly (`Retry-After`).
    #[response(status = 503)]
    Unavailable(Body<'static>),
}

/// The body of every error answer.
#[derive(Serialize, utoipa::ToSchema)]
#[schema(as = ErrorBody)]
pub(crate) struct Body<'a> {
    error: Detail<'a>,
}

#[derive(Serialize, utoipa::ToSchema)]
#[schema(as = ErrorDetail)]
struct Detail<'a> {
    /// Stable, for programs; the HTTP status follows from it.
    #[schema(value_type = crate::openapi::ErrorCode)]
    code: &'a str,
    /// For people: names the field or parameter at fault, when there is one.
    message: &'a str,
}

/// The error and every cause under it, `outer: inner: innermost`.
pub(crate) fn chain(e: &dyn StdError) -> String {
    let mut out = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        let _ = write!(out, ": {c}");
        cur = c.source();
    }
    out
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let (status, code) = self.status_and_code();
        match &self {
            Self::Internal(_) => tracing::error!(error = %chain(&self), "request failed"),
            Self::Unavailable(_) => tracing::warn!(error = %chain(&self), "store unavailable"),
            _ => {}
        }
        let message = match &self {
            // Opaque on purpose: the chain is in the log, not for clients.
            Self::Internal(_) => "internal error".to_owned(),
            Self::Unavailable(_) => {
                "the service is temporarily unavailable; retry shortly".to_owned()
            }
            other => other.to_string(),
        };
        let mut resp = (
            status,
            Json(Body {
                error: Detail {
                    code,
                    message: &message,
                },
            }),
        )
            .into_response();
        let headers = resp.headers_mut();
        match self {
            Self::Unavailable(_) | Self::NotReady(_) => {
                headers.insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
            }
            Self::Shedding(_) => {
                headers.insert(
                    header::RETRY_AFTER,
                    HeaderValue::from_static(SHEDDING_RETRY_AFTER_SECS),
                );
            }
            Self::TooManyAuthFailures(wait) => {
                headers.insert(
                    header::RETRY_AFTER,
                    HeaderValue::from(retry_after_secs(wait)),
                );
            }
            Self::Unauthorized => {
                headers.insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
            }
            _ => {}
        }
        resp
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unavailable_store_is_503_with_retry_after() {
        let e = ApiError::from(StoreError::Unavailable("pool timed out".into()));
        let resp = e.into_response();
        assert_eq!(resp.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(resp.headers()[header::RETRY_AFTER], "1");
    }

    #[test]
    fn store_failures_map_to_their_statuses() {
        let cases = [
            (StoreError::NotFound, StatusCode::NOT_FOUND, "not_found"),
            (
                StoreError::Conflict("dup".into()),
                StatusCode::CONFLICT,
                "conflict",
            ),
            (
                StoreError::Corrupt("bad row".into()),
                StatusCode::INTERNAL_SERVER_ERROR,
                "internal",
            ),
            (
                StoreError::Backend("boom".into()),
                StatusCode::INTERNAL_SERVER_ERROR,
                "internal",
            ),
        ];
        for (e, status, code) in cases {
            assert_eq!(ApiError::from(e).status_and_code(), (status, code));
        }
    }

    #[test]
    fn the_chain_names_every_cause() {
        let e = ApiError::from(StoreError::Backend("disk full".into()));
        assert_eq!(chain(&e), "internal error: store failure: disk full");
    }
}
