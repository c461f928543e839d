//! `POST /subscriptions/{id}/secret/rotate`: a new signing secret, with the
//! old one kept signing for a grace window so receivers can switch over.
//!
//! A subscription has at most two live secrets: the current one and the
//! previous one while its grace window lasts. Rotating while a previous
//! secret is still in its window drops that one at once and retires the
//! current secret in its place. The dispatcher signs with every secret live
//! at the attempt ([`SigningKeys::live`]), so during the window each delivery
//! carries two signatures and verifies with either secret.
//!
//! Rotation reads the subscription and writes its keys back. Within one
//! process rotations take turns, so two concurrent calls give two
//! consecutive rotations (the second's `previous` is the first's new
//! secret). Two PostgreSQL nodes rotating one subscription at the same
//! moment are still last-writer-wins, and the losing call's secret never
//! signs (its caller should rotate again); a compare-and-set in the store
//! would close that, and is left for the scale-out work.

use axum::Json;
use axum::extract::{FromRequest, Request, State};
use chrono::SubsecRound as _;
use hookd_domain::signing::SigningSecret;
use hookd_domain::subscription::SigningKeys;
use hookd_domain::{SubscriptionId, Timestamp};
use hookd_store::SubscriptionPatch;
use serde::{Deserialize, Serialize};

use crate::AppState;
use crate::auth::Caller;
use crate::error::ApiError;
use crate::extract::{IdPath, check_json_content_type, parse_json, read_body};
use crate::subscriptions::visible;

/// The grace window when the request names none: 24 hours.
pub const DEFAULT_GRACE_SECS: u64 = 86_400;
/// The longest grace window: 7 days.
pub const MAX_GRACE_SECS: u64 = 7 * 86_400;

/// The optional body of a rotation.
#[derive(Debug, Default, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct RotateSecret {
    /// Any JSON number, so that `-1` or `2.5` is a 422 naming the field,
    /// like other values out of bounds; a non-number is a 400.
    #[serde(default)]
    #[schema(value_type = Option<u64>)]
    grace_secs: Option<serde_json::Number>,
}

/// A JSON body that may be left out: no bytes at all is `T::default()`;
/// any bytes must be declared JSON and parse as `T`.
#[derive(Debug)]
pub(crate) struct OptionalJsonBody<T>(T);

impl<T: serde::de::DeserializeOwned + Default> FromRequest<AppState> for OptionalJsonBody<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &AppState) -> Result<Self, ApiError> {
        let (parts, body) = req.into_parts();
        let bytes = read_body(body, state.config().max_body_bytes).await?;
        if bytes.is_empty() {
            return Ok(Self(T::default()));
        }
        check_json_content_type(&parts.headers)?;
        parse_json(&bytes).map(Self)
    }
}

/// The rotation's answer: the new secret, shown this once.
#[derive(Debug, Serialize, utoipa::ToSchema)]
struct Rotated {
    #[schema(value_type = String)]
    sub_id: SubscriptionId,
    secret: String,
    /// When the previous secret stops signing.
    #[schema(value_type = String, format = DateTime)]
    previous_expires_at: Timestamp,
}

/// The grace window asked for, in seconds, within `0..=MAX_GRACE_SECS`.
fn check_grace(n: Option<serde_json::Number>) -> Result<u64, ApiError> {
    let Some(n) = n else {
        return Ok(DEFAULT_GRACE_SECS);
    };
    n.as_u64().filter(|s| *s <= MAX_GRACE_SECS).ok_or_else(|| {
        ApiError::invalid(
            "grace_secs",
            format!("must be an integer from 0 to {MAX_GRACE_SECS}"),
        )
    })
}

/// The keys after rotating to `new` at `now`: the current secret retires
/// until `now + grace`; any previous secret is dropped.
fn rotate(keys: SigningKeys, new: SigningSecret, until: Timestamp) -> SigningKeys {
    SigningKeys {
        current: new,
        previous: Some((keys.current, until)),
    }
}

/// Serialises rotations in this process.
static ROTATIONS: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// `POST /subscriptions/{id}/secret/rotate`.
#[utoipa::path(
    post,
    path = "/subscriptions/{id}/secret/rotate",
    tag = "subscriptions",
    params(
        ("id" = String, Path, description = "The subscription's id (`sub_…`)."),
    ),
    request_body(content = Option<RotateSecret>, description = "Optional: an empty body means the default grace window.", content_type = "application/json"),
    responses(
        (status = 200, description = "The new secret, shown this once; the previous one signs until `previous_expires_at`.", body = Rotated),
        (status = 400, description = "Malformed request: bad JSON, a wrong type, a missing or unknown field or query parameter.", body = crate::error::Body),
        crate::error::CommonErrors,
        (status = 404, description = "No such subscription, or not the caller's (also a malformed id).", body = crate::error::Body),
        (status = 413, description = "The body is over the limit.", body = crate::error::Body),
        (status = 415, description = "The body is not declared as JSON.", body = crate::error::Body),
        (status = 422, description = "A value is refused; the message names the field.", body = crate::error::Body),
    ),
    security(("bearer" = [])),
)]
pub(crate) async fn rotate_secret(
    State(state): State<AppState>,
    caller: Caller,
    IdPath(id): IdPath<SubscriptionId>,
    OptionalJsonBody(req): OptionalJsonBody<RotateSecret>,
) -> Result<Json<impl Serialize>, ApiError> {
    let grace = check_grace(req.grace_secs)?;
    // Read, rotate, write: two rotations of one subscription interleaving
    // here would both answer 200 while one's secret was overwritten. Held
    // across the whole read-modify-write, this makes concurrent rotations
    // on one node take turns (rotations are rare; one lock for all is
    // enough). Across PostgreSQL nodes the race remains: see the note in
    // the module docs.
    let _turn = ROTATIONS.lock().await;
    let sub = visible(&state, &caller, &id).await?;
    let new = SigningSecret::generate();
    let exposed = new.expose();
    let grace = chrono::Duration::seconds(i64::try_from(grace).unwrap_or(i64::MAX));
    // Whole milliseconds, as both stores keep them, so the answer is exactly
    // what is stored.
    let previous_expires_at = (chrono::Utc::now() + grace).trunc_subsecs(3);
    let patch = SubscriptionPatch {
        keys: Some(rotate(sub.keys, new, previous_expires_at)),
        ..SubscriptionPatch::default()
    };
    crate::subscriptions::write(&state, &id, patch).await?;
    tracing::info!(sub_id = %id, grace_secs = grace.num_seconds(), "signing secret rotated");
    Ok(Json(Rotated {
        sub_id: id,
        secret: exposed,
        previous_expires_at,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grace_defaults_to_a_day_and_is_bounded_to_a_week() {
        let n = |v: serde_json::Value| match v {
            serde_json::Value::Number(n) => Some(n),
            _ => None,
        };
        assert_eq!(check_grace(None).unwrap(), DEFAULT_GRACE_SECS);
        for ok in [0, 1, MAX_GRACE_SECS] {
            assert_eq!(check_grace(n(serde_json::json!(ok))).unwrap(), ok);
        }
        for bad in [
            serde_json::json!(-1),
            serde_json::json!(2.5),
            serde_json::json!(MAX_GRACE_SECS + 1),
        ] {
            let e = check_grace(n(bad.clone())).unwrap_err().to_string();
            assert!(e.starts_with("grace_secs"), "{bad}: {e}");
        }
    }

    #[test]
    fn rotating_keeps_at_most_two_secrets() {
        let t0 = chrono::DateTime::from_timestamp(1_000_000, 0).unwrap();
        let (a, b, c) = (
            SigningSecret::generate(),
            SigningSecret::generate(),
            SigningSecret::generate(),
        );
        let once = rotate(
            SigningKeys {
                current: a.clone(),
                previous: None,
            },
            b.clone(),
            t0,
        );
        assert_eq!(once.current, b);
        assert_eq!(once.previous, Some((a, t0)));
        let twice = rotate(once, c.clone(), t0);
        assert_eq!(twice.current, c);
        assert_eq!(twice.previous, Some((b, t0)), "the older secret is gone");
    }
}
