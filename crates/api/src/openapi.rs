//! The OpenAPI 3 document, generated from the handlers' `#[utoipa::path]`
//! annotations and served at `GET /openapi.json`.
//!
//! [`routes`] is the one list of the API's routes: [`crate::router`] builds
//! the axum router from it and [`document`] builds the document from it, so a
//! route cannot be served without being documented. The tests below check
//! the document against an explicit list and against the real router.
//!
//! Types from `hookd-domain` and `hookd-store` know nothing of OpenAPI; the
//! API's types point at the mirrors here with `#[schema(value_type = …)]`,
//! and the tests check each mirror against the real type's serde form.

use std::sync::LazyLock;

use axum::Json;
use utoipa::openapi::security::{Http, HttpAuthScheme, SecurityScheme};
use utoipa::{Modify, OpenApi, ToSchema};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::{
    AppState, deliveries, events, health, jobs, metrics, portal, rotation, stats, subscriptions,
    tokens,
};

/// The security scheme every route but `/healthz`, `/readyz` and `/openapi.json` needs.
pub(crate) const BEARER: &str = "bearer";

#[derive(OpenApi)]
#[openapi(
    info(
        title = "hookd",
        description = "hookd's HTTP API: ingest events, manage subscriptions, read and replay deliveries. \
            Every failure answers `{\"error\":{\"code\",\"message\"}}` with a stable `code`; an unknown \
            path is `404` and a known path with another method `405`, both with that body.",
    ),
    modifiers(&BearerAuth),
)]
struct ApiDoc;

/// Declares the bearer-token scheme that operations name in `security`.
struct BearerAuth;

impl Modify for BearerAuth {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        let mut http = Http::new(HttpAuthScheme::Bearer);
        http.description = Some(
            "An admin token (configured, or stored) or a customer token made with `POST /tokens`. \
             A customer token sees only its customer's records: anything else is `404`."
                .to_owned(),
        );
        components.add_security_scheme(BEARER, SecurityScheme::Http(http));
    }
}

/// Every route of the API with its documentation: the one list that both
/// the router and the document are built from.
pub(crate) fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::with_openapi(ApiDoc::openapi())
        .routes(routes!(crate::healthz))
        .routes(routes!(crate::readyz))
        .routes(routes!(openapi_json))
        .routes(routes!(metrics::metrics))
        .routes(routes!(subscriptions::list, subscriptions::create))
        .routes(routes!(
            subscriptions::get,
            subscriptions::update,
            subscriptions::delete
        ))
        .routes(routes!(health::get))
        .routes(routes!(stats::get))
        .routes(routes!(jobs::create))
        .routes(routes!(jobs::get, jobs::cancel))
        .routes(routes!(deliveries::list_for_subscription))
        .routes(routes!(rotation::rotate_secret))
        .routes(routes!(tokens::create))
        .routes(routes!(events::create))
        .routes(routes!(events::get))
        .routes(routes!(deliveries::get))
        .routes(routes!(deliveries::replay))
        .routes(routes!(portal::index))
        .routes(routes!(portal::script))
        .routes(routes!(portal::style))
        .routes(routes!(portal::create_link))
}

/// The API's OpenAPI document.
pub fn document() -> utoipa::openapi::OpenApi {
    routes().into_openapi()
}

static DOCUMENT: LazyLock<utoipa::openapi::OpenApi> = LazyLock::new(document);

/// `GET /openapi.json`: this document. Needs no token.
#[utoipa::path(
    get,
    path = "/openapi.json",
    tag = "meta",
    responses(
        (status = 200, description = "The OpenAPI 3 document of this API.", body = Object, content_type = "application/json"),
    ),
)]
pub(crate) async fn openapi_json() -> Json<&'static utoipa::openapi::OpenApi> {
    Json(&DOCUMENT)
}

// --- the error body ----------------------------------------------------------

/// Every error's `code`; the status each goes with is fixed (see `ApiError`).
#[derive(ToSchema)]
#[schema(rename_all = "snake_case")]
#[allow(dead_code)] // Documentation only: `ApiError` renders the codes.
pub(crate) enum ErrorCode {
    /// 400: malformed JSON, a wrong type, a missing or unknown field or query parameter.
    BadRequest,
    /// 401: no bearer token, or an unknown one.
    Unauthorized,
    /// 404: no such resource, or not visible to the caller; also an unknown path.
    NotFound,
    /// 405: the path exists, but not with this method.
    MethodNotAllowed,
    /// 413: the body or the event payload is over the limit.
    PayloadTooLarge,
    /// 415: the body is not declared as JSON.
    UnsupportedMediaType,
    /// 422: well-formed JSON with a value refused; the message names the field.
    ValidationFailed,
    /// 409: a uniqueness rule or the record's state forbids it.
    Conflict,
    /// 429: the event would add to a backlog stuck over the shedding threshold.
    Shedding,
    /// 429: too many failed authentications from this address; see `Retry-After`.
    TooManyAuthFailures,
    /// 503: the store is unavailable, or (`/readyz`) not ready; retry shortly.
    Unavailable,
    /// 500: a bug or an unexpected backend failure.
    Internal,
}

// --- mirrors of hookd-domain / hookd-store types ------------------------------

/// Whether a subscription receives deliveries.
#[derive(ToSchema)]
#[schema(rename_all = "snake_case")]
#[allow(dead_code)] // Documentation only: mirrors `hookd_domain::subscription::SubscriptionState`.
pub(crate) enum SubscriptionState {
    /// Deliveries are made.
    Active,
    /// Deliveries are created and kept but not attempted until re-enabled.
    Disabled,
}

/// Where a delivery is in its life.
#[derive(ToSchema)]
#[schema(rename_all = "snake_case")]
#[allow(dead_code)] // Documentation only: mirrors `hookd_domain::delivery::DeliveryState`.
pub(crate) enum DeliveryState {
    /// Waiting for its `next_attempt_at`.
    Pending,
    /// Claimed by a worker; an attempt may be under way.
    Inflight,
    /// A 2xx was received.
    Delivered,
    /// A permanent failure (a non-retryable 4xx, a redirect): not retried.
    Failed,
    /// Retries exhausted. Kept and replayable.
    Dead,
}

/// Why an attempt got no usable HTTP status.
#[derive(ToSchema)]
#[schema(rename_all = "snake_case")]
#[allow(dead_code)] // Documentation only: mirrors `hookd_domain::delivery::ErrorClass`.
pub(crate) enum ErrorClass {
    /// No complete response within the attempt's deadline.
    Timeout,
    /// Connection refused, reset or closed.
    Connection,
    /// The host name did not resolve.
    Dns,
    /// TLS handshake or certificate failure.
    Tls,
    /// A 3xx: redirects are never followed.
    Redirect,
    /// The destination resolved to an address hookd refuses to call.
    ForbiddenDestination,
    /// Anything else on the way.
    Other,
}

/// The destination's circuit breaker.
#[derive(ToSchema)]
#[schema(rename_all = "snake_case")]
#[allow(dead_code)] // Documentation only: mirrors `hookd_domain::isolation::CircuitState`.
pub(crate) enum CircuitState {
    /// Attempts flow; failures are counted.
    Closed,
    /// No attempts until the backoff ends.
    Open,
    /// One probe may go.
    HalfOpen,
}

/// Where a replay job is in its life.
#[derive(ToSchema)]
#[schema(rename_all = "snake_case")]
#[allow(dead_code)] // Documentation only: mirrors `hookd_store::JobState`.
pub(crate) enum JobState {
    /// Re-queuing its deliveries, a window at a time.
    Running,
    /// Every item was re-sent and settled, or skipped.
    Completed,
    /// Cancelled: items not yet re-queued never will be.
    Cancelled,
}

/// A condition hookd has announced with a `hookd.subscription.<kind>` event.
#[derive(ToSchema)]
#[schema(rename_all = "snake_case")]
#[allow(dead_code)] // Documentation only: mirrors `hookd_store::SignalKind`.
pub(crate) enum SignalKind {
    /// hookd disabled it (410 Gone, or failing for the configured period).
    Disabled,
    /// Some of its deliveries are `dead`.
    DeadLettering,
    /// Most recent failures share one 4xx status.
    ConfigurationError,
    /// Ingest refuses events that would fan out to it.
    Shedding,
}

/// A subscription's own retry settings; an unset field follows the server's
/// default.
#[derive(ToSchema)]
#[allow(dead_code)] // Documentation only: mirrors `hookd_domain::subscription::RetryPolicy`.
pub(crate) struct RetryPolicy {
    /// First backoff bound, in seconds (1 to 3,600).
    base_delay_secs: Option<u64>,
    /// Largest backoff bound, in seconds (1 to 86,400).
    max_delay_secs: Option<u64>,
    /// Dead-letter once a delivery is this old, in seconds (60 to 2,592,000).
    max_age_secs: Option<u64>,
    /// Dead-letter after this many attempts (1 to 1,000).
    max_attempts: Option<u32>,
    /// 4xx statuses to retry besides 408, 425 and 429.
    retryable_statuses: Option<Vec<u16>>,
}

/// Advisory: the 4xx status most recent failures share.
#[derive(ToSchema)]
#[allow(dead_code)] // Documentation only: mirrors `hookd_domain::health::LikelyConfigurationError`.
pub(crate) struct LikelyConfigurationError {
    /// The shared status.
    status: u16,
    /// Its share of the failed attempts, in `[0.95, 1]`.
    share: f64,
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;
    use std::sync::Arc;

    use axum::body::Body;
    use axum::http::{Method, Request, StatusCode};
    use axum::response::IntoResponse;
    use hookd_domain::destination::DestinationPolicy;
    use serde_json::Value;
    use tokio::sync::Notify;
    use tower::ServiceExt as _;
    use utoipa::PartialSchema;

    use super::*;
    use crate::{ApiConfig, ApiError, router};

    /// Every route, as `METHOD /path`. A route added to [`routes`] must be
    /// added here too, which puts it in front of a reviewer.
    const EXPECTED: &[&str] = &[
        "GET /healthz",
        "GET /readyz",
        "GET /openapi.json",
        "GET /metrics",
        "GET /subscriptions",
        "POST /subscriptions",
        "GET /subscriptions/{id}",
        "PATCH /subscriptions/{id}",
        "DELETE /subscriptions/{id}",
        "GET /subscriptions/{id}/health",
        "GET /subscriptions/{id}/stats",
        "POST /subscriptions/{id}/replay",
        "GET /subscriptions/{id}/deliveries",
        "POST /subscriptions/{id}/secret/rotate",
        "GET /jobs/{id}",
        "DELETE /jobs/{id}",
        "POST /tokens",
        "POST /events",
        "GET /events/{id}",
        "GET /deliveries/{id}",
        "POST /deliveries/{id}/replay",
        "GET /ui",
        "GET /ui/app.js",
        "GET /ui/app.css",
        "POST /customers/{id}/portal-link",
    ];

    /// The routes that need no token.
    const PUBLIC: &[&str] = &[
        "GET /healthz",
        "GET /readyz",
        "GET /openapi.json",
        "GET /ui",
        "GET /ui/app.js",
        "GET /ui/app.css",
    ];

    /// The methods a route could be registered under.
    const METHODS: [&str; 5] = ["GET", "POST", "PUT", "PATCH", "DELETE"];

    fn doc_json() -> Value {
        serde_json::to_value(document()).unwrap()
    }

    /// `(METHOD /path, operation)` for every operation in the document.
    fn operations(doc: &Value) -> Vec<(String, Value)> {
        let mut out = Vec::new();
        for (path, item) in doc["paths"].as_object().unwrap() {
            for (method, op) in item.as_object().unwrap() {
                out.push((format!("{} {path}", method.to_uppercase()), op.clone()));
            }
        }
        out
    }

    /// A router over a real (empty, migrated) store. No request below
    /// carries a token, so none reaches the store but `/readyz`'s check.
    async fn app() -> (axum::Router, tempfile::TempDir) {
        let dir = tempfile::tempdir().unwrap();
        let store = hookd_store_sqlite::SqliteStore::connect(&dir.path().join("hookd.db"))
            .await
            .unwrap();
        // Migrated, so `/readyz` is ready.
        hookd_store::Store::migrate(&store).await.unwrap();
        let state = AppState::new(
            Arc::new(store),
            ApiConfig::new(DestinationPolicy::PublicOnly),
            Arc::new(Notify::new()),
        );
        (router(state), dir)
    }

    /// `/subscriptions/{id}` with a well-formed id of the right kind.
    fn concrete(path: &str) -> String {
        let id = match path.split('/').nth(1) {
            Some("subscriptions") => hookd_domain::SubscriptionId::new().to_string(),
            Some("events") => hookd_domain::EventId::new().to_string(),
            Some("deliveries") => hookd_domain::DeliveryId::new().to_string(),
            Some("jobs") => hookd_domain::JobId::new().to_string(),
            Some("customers") => "acme".to_owned(),
            other => panic!("no dummy id for {other:?}"),
        };
        path.replace("{id}", &id)
    }

    async fn send(app: &axum::Router, method: &str, path: &str) -> (StatusCode, Value) {
        let req = Request::builder()
            .method(Method::from_bytes(method.as_bytes()).unwrap())
            .uri(path)
            .body(Body::empty())
            .unwrap();
        let resp = app.clone().oneshot(req).await.unwrap();
        let status = resp.status();
        let bytes = axum::body::to_bytes(resp.into_body(), usize::MAX)
            .await
            .unwrap();
        (
            status,
            serde_json::from_slice(&bytes).unwrap_or(Value::Null),
        )
    }

    #[test]
    fn the_document_lists_exactly_the_expected_routes() {
        let documented: BTreeSet<String> = operations(&doc_json())
            .into_iter()
            .map(|(k, _)| k)
            .collect();
        let expected: BTreeSet<String> = EXPECTED.iter().map(|s| s.to_string()).collect();
        assert_eq!(documented, expected);
    }

    /// Each documented route is served by the real router: without a token
    /// it answers 401 (or 200 for the public ones), never the fallback's
    /// `404 no such route` nor 405. Every other method on a documented path
    /// is 405, so no handler is registered under a method the document
    /// does not show.
    #[tokio::test]
    async fn every_documented_route_is_served_and_nothing_else_on_its_path() {
        let (app, _dir) = app().await;
        let doc = doc_json();
        for (path, item) in doc["paths"].as_object().unwrap() {
            let url = if path.contains('{') {
                concrete(path)
            } else {
                path.clone()
            };
            for method in METHODS {
                let key = format!("{method} {path}");
                let (status, body) = send(&app, method, &url).await;
                if item.get(method.to_lowercase()).is_none() {
                    assert_eq!(status, StatusCode::METHOD_NOT_ALLOWED, "{key}: {body}");
                    continue;
                }
                if PUBLIC.contains(&key.as_str()) {
                    assert_eq!(status, StatusCode::OK, "{key}: {body}");
                } else {
                    assert_eq!(status, StatusCode::UNAUTHORIZED, "{key}: {body}");
                    assert_eq!(body["error"]["code"], "unauthorized", "{key}");
                }
            }
        }
        // The fallbacks still answer as before.
        let (status, body) = send(&app, "GET", "/nope").await;
        assert_eq!(status, StatusCode::NOT_FOUND);
        assert_eq!(body["error"]["message"], "no such route");
    }

    /// No route may reach the router except through [`routes`]: a plain
    /// `route` call (or a nested or merged router) anywhere in the crate's
    /// source would serve a path the document does not show. Only the
    /// fallbacks are added outside it, in [`crate::router`].
    #[test]
    fn no_route_is_registered_outside_the_documented_list() {
        let forbidden = [
            concat!(".", "route("),
            concat!(".", "route_service("),
            concat!(".", "nest("),
            concat!(".", "nest_service("),
            concat!(".", "merge("),
        ];
        let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        let mut stack = vec![src];
        let mut seen = 0;
        while let Some(dir) = stack.pop() {
            for entry in std::fs::read_dir(&dir).unwrap() {
                let path = entry.unwrap().path();
                if path.is_dir() {
                    stack.push(path);
                } else if path.extension().is_some_and(|e| e == "rs") {
                    seen += 1;
                    let text = std::fs::read_to_string(&path).unwrap();
                    for needle in forbidden {
                        assert!(
                            !text.contains(needle),
                            "{} calls `{needle}…)`: register routes with `.routes(routes!(…))` in openapi::routes",
                            path.display()
                        );
                    }
                }
            }
        }
        assert!(seen > 10, "found only {seen} source files");
    }

    #[tokio::test]
    async fn readyz_is_ready_on_a_migrated_store_and_503_on_one_that_is_not() {
        let (app, _dir) = app().await;
        let (status, body) = send(&app, "GET", "/readyz").await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(body, serde_json::json!({ "status": "ready" }));

        // The binary serves only after migrating, but a database restored
        // from before a migration looks like this one.
        let dir = tempfile::tempdir().unwrap();
        let store = hookd_store_sqlite::SqliteStore::connect(&dir.path().join("hookd.db"))
            .await
            .unwrap();
        let app = router(AppState::new(
            Arc::new(store),
            ApiConfig::new(DestinationPolicy::PublicOnly),
            Arc::new(Notify::new()),
        ));
        let req = Request::builder()
            .uri("/readyz")
            .body(Body::empty())
            .unwrap();
        let resp = app.oneshot(req).await.unwrap();
        assert_eq!(resp.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(resp.headers()["retry-after"], "1");
        let bytes = axum::body::to_bytes(resp.into_body(), usize::MAX)
            .await
            .unwrap();
        let body: Value = serde_json::from_slice(&bytes).unwrap();
        assert_eq!(body["error"]["code"], "unavailable");
        let message = body["error"]["message"].as_str().unwrap();
        assert!(
            message.starts_with("not ready: the database is not migrated"),
            "{message}"
        );
    }

    #[tokio::test]
    async fn openapi_json_serves_the_document_without_a_token() {
        let (app, _dir) = app().await;
        let (status, body) = send(&app, "GET", "/openapi.json").await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(body, doc_json());
        assert!(body["openapi"].as_str().unwrap().starts_with("3."));
    }

    #[test]
    fn every_route_but_the_public_ones_needs_the_bearer_token() {
        let doc = doc_json();
        assert_eq!(
            doc["components"]["securitySchemes"][BEARER]["scheme"],
            "bearer"
        );
        for (key, op) in operations(&doc) {
            let security = op.get("security").cloned().unwrap_or(Value::Null);
            if PUBLIC.contains(&key.as_str()) {
                assert_eq!(security, Value::Null, "{key}");
            } else {
                assert_eq!(security, serde_json::json!([{ BEARER: [] }]), "{key}");
                for status in ["401", "500", "503"] {
                    assert!(
                        op["responses"].get(status).is_some(),
                        "{key} lacks {status}"
                    );
                }
            }
        }
    }

    #[test]
    fn operation_ids_are_unique() {
        let mut seen = BTreeSet::new();
        for (key, op) in operations(&doc_json()) {
            let id = op["operationId"]
                .as_str()
                .unwrap_or_else(|| panic!("{key}"))
                .to_owned();
            assert!(
                seen.insert(id.clone()),
                "{key}: operationId {id} is used twice"
            );
        }
    }

    /// Every `$ref` in the document names a schema it defines.
    #[test]
    fn every_reference_resolves() {
        fn refs(v: &Value, out: &mut Vec<String>) {
            match v {
                Value::Object(m) => {
                    if let Some(Value::String(r)) = m.get("$ref") {
                        out.push(r.clone());
                    }
                    m.values().for_each(|v| refs(v, out));
                }
                Value::Array(a) => a.iter().for_each(|v| refs(v, out)),
                _ => {}
            }
        }
        let doc = doc_json();
        let mut found = Vec::new();
        refs(&doc, &mut found);
        assert!(!found.is_empty());
        for r in found {
            let name = r
                .strip_prefix("#/components/schemas/")
                .unwrap_or_else(|| panic!("{r}"));
            assert!(
                doc["components"]["schemas"].get(name).is_some(),
                "{r} is not defined"
            );
        }
    }

    fn enum_values<T: PartialSchema>() -> BTreeSet<String> {
        let schema = serde_json::to_value(T::schema()).unwrap();
        schema["enum"]
            .as_array()
            .unwrap_or_else(|| panic!("not an enum: {schema}"))
            .iter()
            .map(|v| v.as_str().unwrap().to_owned())
            .collect()
    }

    fn serialized<T: serde::Serialize>(all: impl IntoIterator<Item = T>) -> BTreeSet<String> {
        all.into_iter()
            .map(|v| {
                serde_json::to_value(v)
                    .unwrap()
                    .as_str()
                    .unwrap()
                    .to_owned()
            })
            .collect()
    }

    #[test]
    fn every_error_code_is_documented() {
        let errors = [
            ApiError::BadRequest(String::new()),
            ApiError::Unauthorized,
            ApiError::NotFound(String::new()),
            ApiError::MethodNotAllowed,
            ApiError::PayloadTooLarge(String::new()),
            ApiError::UnsupportedMediaType(String::new()),
            ApiError::Validation(String::new()),
            ApiError::Conflict(String::new()),
            ApiError::Shedding(Vec::new()),
            ApiError::TooManyAuthFailures(std::time::Duration::from_secs(1)),
            ApiError::Unavailable(hookd_store::StoreError::Unavailable("x".into())),
            ApiError::NotReady(String::new()),
            ApiError::Internal("x".into()),
        ];
        // Fails to compile when a variant is added, so it is added above.
        for e in &errors {
            match e {
                ApiError::BadRequest(_)
                | ApiError::Unauthorized
                | ApiError::NotFound(_)
                | ApiError::MethodNotAllowed
                | ApiError::PayloadTooLarge(_)
                | ApiError::UnsupportedMediaType(_)
                | ApiError::Validation(_)
                | ApiError::Conflict(_)
                | ApiError::Shedding(_)
                | ApiError::TooManyAuthFailures(_)
                | ApiError::Unavailable(_)
                | ApiError::NotReady(_)
                | ApiError::Internal(_) => {}
            }
        }
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let codes: BTreeSet<String> = errors
            .into_iter()
            .map(|e| {
                let bytes = rt
                    .block_on(axum::body::to_bytes(
                        e.into_response().into_body(),
                        usize::MAX,
                    ))
                    .unwrap();
                let body: Value = serde_json::from_slice(&bytes).unwrap();
                body["error"]["code"].as_str().unwrap().to_owned()
            })
            .collect();
        assert_eq!(codes, enum_values::<ErrorCode>());
    }

    #[test]
    fn the_mirrored_enums_match_the_real_ones() {
        use hookd_domain::delivery as d;
        use hookd_domain::isolation::CircuitState as C;
        use hookd_domain::subscription::SubscriptionState as S;
        // Exhaustive, so a new variant fails to compile here.
        let subscription_states = [S::Active, S::Disabled].map(|s| match s {
            S::Active | S::Disabled => s,
        });
        let circuit_states = [C::Closed, C::Open, C::HalfOpen].map(|s| match s {
            C::Closed | C::Open | C::HalfOpen => s,
        });
        let job_states = [
            hookd_store::JobState::Running,
            hookd_store::JobState::Completed,
            hookd_store::JobState::Cancelled,
        ]
        .map(|s| match s {
            hookd_store::JobState::Running
            | hookd_store::JobState::Completed
            | hookd_store::JobState::Cancelled => s,
        });
        assert_eq!(
            serialized(subscription_states),
            enum_values::<SubscriptionState>()
        );
        assert_eq!(
            serialized(d::DeliveryState::ALL),
            enum_values::<DeliveryState>()
        );
        assert_eq!(serialized(d::ErrorClass::ALL), enum_values::<ErrorClass>());
        assert_eq!(serialized(circuit_states), enum_values::<CircuitState>());
        assert_eq!(serialized(job_states), enum_values::<JobState>());
        assert_eq!(
            serialized(hookd_store::SignalKind::ALL),
            enum_values::<SignalKind>()
        );
    }

    fn properties<T: PartialSchema>() -> BTreeSet<String> {
        let schema = serde_json::to_value(T::schema()).unwrap();
        schema["properties"]
            .as_object()
            .unwrap()
            .keys()
            .cloned()
            .collect()
    }

    fn keys(v: impl serde::Serialize) -> BTreeSet<String> {
        serde_json::to_value(v)
            .unwrap()
            .as_object()
            .unwrap()
            .keys()
            .cloned()
            .collect()
    }

    #[test]
    fn the_mirrored_structs_match_the_real_ones() {
        // Struct literals without `..`, so a new field fails to compile here.
        let policy = hookd_domain::subscription::RetryPolicy {
            base_delay_secs: Some(1),
            max_delay_secs: Some(1),
            max_age_secs: Some(60),
            max_attempts: Some(1),
            retryable_statuses: vec![409],
        };
        assert_eq!(keys(policy), properties::<RetryPolicy>());
        let advice = hookd_domain::health::LikelyConfigurationError {
            status: 401,
            share: 1.0,
        };
        assert_eq!(keys(advice), properties::<LikelyConfigurationError>());
    }
}
