//! `POST /tokens`: an admin makes an API token for one customer.
//!
//! The token's text is answered once and never stored: the store keeps only
//! its SHA-256 ([`hash_token`]). A customer token asking is told `404`, as
//! for anything else it may not see.

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use hookd_domain::CustomerId;
use hookd_store::NewToken;
use rand::RngCore;
use serde::{Deserialize, Serialize};

use crate::AppState;
use crate::auth::{Caller, hash_token};
use crate::error::ApiError;
use crate::extract::JsonBody;

use crate::limits::MAX_LABEL_CHARS;

/// A new random API token: `hookd_` and 64 hex digits (32 random bytes).
pub fn generate_token() -> String {
    let mut bytes = [0u8; 32];
    rand::rng().fill_bytes(&mut bytes);
    format!("hookd_{}", hex::encode(bytes))
}

/// A customer token made and stored (hashed); returns its text, which exists
/// nowhere else from here on.
pub async fn create_customer_token(
    store: &dyn hookd_store::Store,
    customer_id: CustomerId,
    label: Option<String>,
) -> Result<String, hookd_store::StoreError> {
    create_expiring_customer_token(store, customer_id, label, None).await
}

/// Like [`create_customer_token`], working only until `expires_at` when set
/// (plus at most the API's 30 s token cache on a node that has seen it).
pub async fn create_expiring_customer_token(
    store: &dyn hookd_store::Store,
    customer_id: CustomerId,
    label: Option<String>,
    expires_at: Option<chrono::DateTime<chrono::Utc>>,
) -> Result<String, hookd_store::StoreError> {
    let token = generate_token();
    store
        .create_token(NewToken {
            token_hash: hash_token(&token).to_vec(),
            customer_id: Some(customer_id),
            label,
            expires_at,
        })
        .await?;
    Ok(token)
}

#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct CreateToken {
    customer_id: String,
    #[serde(default)]
    label: Option<String>,
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
#[schema(as = CreatedToken)]
struct Created {
    token: String,
    #[schema(value_type = String)]
    customer_id: CustomerId,
}

/// `POST /tokens` (admin only).
#[utoipa::path(
    post,
    path = "/tokens",
    operation_id = "create_token",
    tag = "tokens",
    request_body = CreateToken,
    responses(
        (status = 201, description = "The token, shown this once.", body = Created),
        (status = 400, description = "Malformed request: bad JSON, a wrong type, a missing or unknown field or query parameter.", body = crate::error::Body),
        crate::error::CommonErrors,
        (status = 404, description = "The caller is a customer token: only an admin makes tokens.", body = crate::error::Body),
        (status = 413, description = "The body is over the limit.", body = crate::error::Body),
        (status = 415, description = "The body is not declared as JSON.", body = crate::error::Body),
        (status = 422, description = "A value is refused; the message names the field.", body = crate::error::Body),
    ),
    security(("bearer" = [])),
)]
pub(crate) async fn create(
    State(state): State<AppState>,
    caller: Caller,
    JsonBody(req): JsonBody<CreateToken>,
) -> Result<Response, ApiError> {
    if caller.customer().is_some() {
        return Err(ApiError::NotFound("no such route".into()));
    }
    let customer_id =
        CustomerId::parse(&req.customer_id).map_err(|e| ApiError::invalid("customer_id", e))?;
    if let Some(l) = &req.label
        && l.chars().count() > MAX_LABEL_CHARS
    {
        return Err(ApiError::invalid(
            "label",
            format!("must be at most {MAX_LABEL_CHARS} characters"),
        ));
    }
    let token = create_customer_token(state.store(), customer_id.clone(), req.label).await?;
    tracing::info!(customer_id = %customer_id, "customer token created");
    Ok((StatusCode::CREATED, Json(Created { token, customer_id })).into_response())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_prefixed_random_and_distinct() {
        let (a, b) = (generate_token(), generate_token());
        assert!(a.starts_with("hookd_") && a.len() == 6 + 64, "{a}");
        assert_ne!(a, b);
    }
}
