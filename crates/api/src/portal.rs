//! The customer portal: a static single-page app served at `/ui`, and
//! `POST /customers/{id}/portal-link`, which hands a platform a sign-in URL
//! for one customer.
//!
//! The page, its script and its style sheet are files under `crates/api/ui/`
//! embedded at compile time: no build step, no CDN, nothing fetched from
//! elsewhere. They need no token; the page asks for one and keeps it in
//! `sessionStorage`, then talks to the JSON API like any client. Every string
//! the API returns is put on the page as text (`textContent`), never as
//! markup, and the content security policy allows no inline script, so a
//! receiver that answers `<script>` shows text.
//!
//! A portal link carries its token in the URL *fragment* (`/ui#token=…`),
//! which a browser never sends to a server, so it reaches no access log.
//! Its token is a customer token that expires after
//! [`PORTAL_LINK_LIFETIME`] (one hour), and the session with it.

use axum::Json;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use hookd_domain::CustomerId;
use serde::Serialize;

use crate::AppState;
use crate::auth::Caller;
use crate::error::ApiError;
use crate::tokens::create_expiring_customer_token;

const INDEX_HTML: &str = include_str!("../ui/index.html");
const APP_JS: &str = include_str!("../ui/app.js");
const APP_CSS: &str = include_str!("../ui/app.css");

/// Scripts and styles from this origin only, no inline script, no plugins,
/// requests only to this origin.
const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; \
     connect-src 'self'; form-action 'self'; base-uri 'none'";

/// The label of tokens made for portal links.
pub(crate) const PORTAL_LINK_LABEL: &str = "portal link";

/// How long a portal link, and a portal session opened with it, works: long
/// enough to open it from an email and look around, short enough that a
/// leaked link soon goes stale. The platform asks for a fresh one each time
/// it shows the link.
pub(crate) const PORTAL_LINK_LIFETIME: chrono::Duration = chrono::Duration::hours(1);

fn asset(content_type: &'static str, body: &'static str) -> Response {
    let mut resp = body.into_response();
    let h = resp.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CSP),
    );
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    resp
}

/// `GET /ui`: the portal's page. Needs no token.
#[utoipa::path(
    get,
    path = "/ui",
    operation_id = "portal_page",
    tag = "portal",
    responses(
        (status = 200, description = "The customer portal (a single page; it asks for a token and uses this API).", body = String, content_type = "text/html"),
    ),
)]
pub(crate) async fn index() -> Response {
    asset("text/html; charset=utf-8", INDEX_HTML)
}

/// `GET /ui/app.js`: the portal's script. Needs no token.
#[utoipa::path(
    get,
    path = "/ui/app.js",
    operation_id = "portal_script",
    tag = "portal",
    responses(
        (status = 200, description = "The portal's script.", body = String, content_type = "text/javascript"),
    ),
)]
pub(crate) async fn script() -> Response {
    asset("text/javascript; charset=utf-8", APP_JS)
}

/// `GET /ui/app.css`: the portal's style sheet. Needs no token.
#[utoipa::path(
    get,
    path = "/ui/app.css",
    operation_id = "portal_style",
    tag = "portal",
    responses(
        (status = 200, description = "The portal's style sheet.", body = String, content_type = "text/css"),
    ),
)]
pub(crate) async fn style() -> Response {
    asset("text/css; charset=utf-8", APP_CSS)
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
struct PortalLink {
    /// `<origin>/ui#token=hookd_…`: opens the portal signed in as the customer.
    url: String,
    /// When the link — and a portal session opened with it — stops working.
    expires_at: chrono::DateTime<chrono::Utc>,
}

/// The origin the caller reached us at, from `Host` (and
/// `X-Forwarded-Proto` behind a proxy).
fn origin(headers: &HeaderMap) -> String {
    let host = headers
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .filter(|h| {
            !h.is_empty()
                && h.chars()
                    .all(|c| c.is_ascii_alphanumeric() || "-.:[]".contains(c))
        })
        .unwrap_or("localhost");
    let proto = match headers
        .get("x-forwarded-proto")
        .and_then(|h| h.to_str().ok())
    {
        Some("https") => "https",
        _ => "http",
    };
    format!("{proto}://{host}")
}

/// `POST /customers/{id}/portal-link` (admin only).
#[utoipa::path(
    post,
    path = "/customers/{id}/portal-link",
    operation_id = "create_portal_link",
    tag = "portal",
    params(
        ("id" = String, Path, description = "The customer's id."),
    ),
    responses(
        (status = 201, description = "A URL that opens the portal signed in as this customer (its token is in the fragment, shown this once).", body = PortalLink),
        crate::error::CommonErrors,
        (status = 404, description = "The caller is a customer token: only an admin makes portal links.", body = crate::error::Body),
        (status = 422, description = "The customer id is refused.", body = crate::error::Body),
    ),
    security(("bearer" = [])),
)]
pub(crate) async fn create_link(
    State(state): State<AppState>,
    caller: Caller,
    headers: HeaderMap,
    Path(customer): Path<String>,
) -> Result<Response, ApiError> {
    if caller.customer().is_some() {
        return Err(ApiError::NotFound("no such route".into()));
    }
    let customer_id =
        CustomerId::parse(&customer).map_err(|e| ApiError::invalid("customer_id", e))?;
    let expires_at = chrono::Utc::now() + PORTAL_LINK_LIFETIME;
    let token = create_expiring_customer_token(
        state.store(),
        customer_id.clone(),
        Some(PORTAL_LINK_LABEL.to_owned()),
        Some(expires_at),
    )
    .await?;
    tracing::info!(customer_id = %customer_id, %expires_at, "portal link created");
    let link = PortalLink {
        url: format!("{}/ui#token={token}", origin(&headers)),
        expires_at,
    };
    Ok((StatusCode::CREATED, Json(link)).into_response())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_page_loads_only_its_own_files() {
        assert!(INDEX_HTML.contains(r#"src="/ui/app.js""#));
        assert!(INDEX_HTML.contains(r#"href="/ui/app.css""#));
        for text in [INDEX_HTML, APP_JS, APP_CSS] {
            // The SVG namespace is a name, not a fetch.
            let text = text.replace("'http://www.w3.org/2000/svg'", "");
            assert!(!text.contains("http://") && !text.contains("https://"));
            assert!(!text.contains("@import"));
        }
        // No inline script: the policy would block it anyway.
        assert_eq!(INDEX_HTML.matches("<script").count(), 1);
    }

    #[test]
    fn the_script_never_writes_markup() {
        for needle in [
            "innerHTML",
            "outerHTML",
            "insertAdjacentHTML",
            "document.write",
            "eval(",
            "new Function",
        ] {
            assert!(!APP_JS.contains(needle), "app.js uses {needle}");
        }
    }

    #[test]
    fn the_origin_comes_from_host_and_refuses_odd_characters() {
        let mut h = HeaderMap::new();
        h.insert(header::HOST, HeaderValue::from_static("hookd.example:8080"));
        assert_eq!(origin(&h), "http://hookd.example:8080");
        h.insert("x-forwarded-proto", HeaderValue::from_static("https"));
        assert_eq!(origin(&h), "https://hookd.example:8080");
        h.insert(header::HOST, HeaderValue::from_static("evil/\"x"));
        assert_eq!(origin(&h), "https://localhost");
    }
}
