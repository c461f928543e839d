//! hookd's HTTP API: the front door of the outbox.
//!
//! `POST /events` validates an event, matches it against the cached fan-out
//! index, and hands the event and its deliveries to the group committer,
//! which accepts concurrent events together in one transaction
//! ([`Store::accept_events`]); it answers `202` only after that commit, then
//! wakes the dispatcher. The other routes manage subscriptions and read events and
//! deliveries.
//!
//! # Layout
//! - [`router`] and [`serve`]: the routes, and running them until shutdown.
//! - [`AppState`], [`ApiConfig`]: what every handler shares.
//! - [`ApiError`]: every failure, rendered once as
//!   `{"error":{"code","message"}}` with a stable `code`.
//! - `auth`: bearer tokens (SHA-256, admin hash, store lookup, short cache)
//!   and the customer scoping rule: another customer's record is `404`.
//! - `extract`: JSON, query and path extractors that fail only with
//!   [`ApiError`], naming the field or parameter at fault.
//! - `fanout`: the in-memory fan-out index, rebuilt when the store's
//!   subscription generation moves.
//! - `subscriptions`, `events`, `deliveries`, `health`: the handlers and
//!   their JSON shapes.
//! - `rotation`: signing-secret rotation with a grace window (at most two
//!   live secrets); `tokens`: admin-made customer tokens, stored hashed.
//! - [`limits`]: every input limit, its value and its answer.
//! - `jobs`: bulk replay jobs; `stats`: the daily rollup.
//! - `openapi`: the OpenAPI document served at `/openapi.json`, generated
//!   from the handlers' annotations; its route list is the router's.
//! - `portal`: the customer portal at `/ui` (embedded static files) and
//!   `POST /customers/{id}/portal-link`.
//! - `committer`: the group committer behind `POST /events`.
//! - `signals`: the subscription monitor (shedding, disabling,
//!   dead-lettering, configuration errors) and the `hookd.subscription.*`
//!   system events that announce them.
//!
//! # What this crate must not do
//! Name a storage backend (it sees only `Arc<dyn Store>`), write SQL, send
//! webhooks, or answer `202` for an event before the store has committed it.
//! It never panics on input: every malformed request is a 4xx.
#![warn(missing_docs)]

mod auth;
mod committer;
mod deliveries;
mod error;
mod events;
mod extract;
mod fanout;
mod health;
mod jobs;
pub mod limits;
pub mod metrics;
mod openapi;
mod portal;
mod rotation;
mod signals;
mod stats;
mod subscriptions;
mod tokens;

use std::sync::Arc;

use axum::Router;
use hookd_domain::destination::DestinationPolicy;
use hookd_store::Store;
use tokio::net::TcpListener;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

pub use auth::{AuthFailureLimit, hash_token};
pub use committer::IngestHandoff;
pub use error::ApiError;
pub use health::{DestinationState, DestinationView};
pub use openapi::document as openapi_document;
pub use rotation::{DEFAULT_GRACE_SECS, MAX_GRACE_SECS};
pub use signals::MonitorConfig;
pub use tokens::{create_customer_token, generate_token};

/// The largest event payload accepted by default (256 KiB).
pub const DEFAULT_MAX_PAYLOAD_BYTES: usize = limits::MAX_PAYLOAD_BYTES;
/// The largest request body accepted by default (1 MiB).
pub const DEFAULT_MAX_BODY_BYTES: usize = limits::MAX_BODY_BYTES;

/// The API's own settings, handed over by the binary.
#[derive(Debug, Clone)]
pub struct ApiConfig {
    /// Whether subscription URLs may point at private addresses.
    pub destination_policy: DestinationPolicy,
    /// SHA-256 of the admin token given in configuration, if any. Tokens
    /// stored in the store are honoured as well.
    pub admin_token_hash: Option<[u8; 32]>,
    /// The largest event payload, in bytes (its JSON text as sent).
    pub max_payload_bytes: usize,
    /// The largest request body, in bytes.
    pub max_body_bytes: usize,
    /// Failed authentications allowed per client address; `None` turns the
    /// limit off. See the `auth` module for what happens past it.
    pub auth_failures: Option<AuthFailureLimit>,
}

impl ApiConfig {
    /// A config with the documented limits (256 KiB payloads, 1 MiB bodies,
    /// 10 failed authentications per address then one a second) and no
    /// configured admin token.
    pub fn new(destination_policy: DestinationPolicy) -> Self {
        Self {
            destination_policy,
            admin_token_hash: None,
            max_payload_bytes: DEFAULT_MAX_PAYLOAD_BYTES,
            max_body_bytes: DEFAULT_MAX_BODY_BYTES,
            auth_failures: Some(AuthFailureLimit::default()),
        }
    }
}

/// What every handler shares. Cheap to clone.
#[derive(Debug, Clone)]
pub struct AppState {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    store: Arc<dyn Store>,
    config: ApiConfig,
    fanout: fanout::FanoutCache,
    tokens: auth::TokenCache,
    /// Failed authentications per client address.
    auth_failures: Option<auth::FailureLimiter>,
    /// Notified after each accepted event so the dispatcher wakes at once
    /// instead of at its next poll.
    wake: Arc<Notify>,
    /// Renders `/metrics`, once the binary has installed a recorder.
    metrics: metrics::MetricsSlot,
    /// Reads a destination's live isolation state for `/health`, once the
    /// binary has installed the lookup.
    destination_state: health::DestinationStateSlot,
    signals: signals::Signals,
    /// Groups concurrent ingests into one store transaction.
    committer: committer::Committer,
}

impl AppState {
    /// Builds the state. `wake` is the dispatcher's: ingest calls
    /// `notify_one()` on it after each commit that created deliveries.
    pub fn new(store: Arc<dyn Store>, config: ApiConfig, wake: Arc<Notify>) -> Self {
        Self {
            inner: Arc::new(Inner {
                store,
                auth_failures: config.auth_failures.map(auth::FailureLimiter::new),
                config,
                fanout: fanout::FanoutCache::default(),
                tokens: auth::TokenCache::default(),
                wake,
                metrics: metrics::MetricsSlot::default(),
                destination_state: health::DestinationStateSlot::default(),
                signals: signals::Signals::default(),
                committer: committer::Committer::default(),
            }),
        }
    }

    /// The store.
    pub fn store(&self) -> &dyn Store {
        self.inner.store.as_ref()
    }

    /// The config.
    pub fn config(&self) -> &ApiConfig {
        &self.inner.config
    }

    /// Serves `GET /metrics` with `render` (admin only). Without it the
    /// route answers 404. Only the first call has an effect.
    pub fn set_metrics(&self, render: metrics::RenderMetrics) {
        self.inner.metrics.set(render);
    }

    fn metrics(&self) -> Option<metrics::RenderMetrics> {
        self.inner.metrics.get()
    }

    /// Lets `GET /subscriptions/{id}/health` show the live state of a
    /// destination host (circuit, in flight, rate, ramp) from `lookup`.
    /// Without it every host reads as unseen. Only the first call has an
    /// effect.
    pub fn set_destination_state(&self, lookup: DestinationState) {
        self.inner.destination_state.set(lookup);
    }

    /// Lets ingest create deliveries already claimed for this process's
    /// dispatcher and hand them to it after the commit
    /// ([`IngestHandoff`]). Without it every delivery is written pending for
    /// the claim loop. Only the first call has an effect; before the first
    /// ingest.
    pub fn set_ingest_handoff(&self, handoff: Arc<dyn IngestHandoff>) {
        self.inner.committer.set_handoff(handoff);
    }

    fn destination_state(&self, host: &str) -> Option<DestinationView> {
        self.inner.destination_state.get(host)
    }

    /// The dispatcher's wake-up signal.
    pub fn wake(&self) -> &Arc<Notify> {
        &self.inner.wake
    }

    /// Brings the fan-out index up to date after a subscription write. A
    /// failure is only logged: the write has committed, and ingest checks the
    /// generation again before it matches anything.
    async fn refresh_fanout(&self) {
        if let Err(e) = self.inner.fanout.rebuild(self.store()).await {
            tracing::warn!(error = %error::chain(&e), "could not refresh the fan-out index after a subscription write");
        }
    }
}

/// The API's routes. Every route except `/healthz`, `/readyz` and `/openapi.json` needs
/// a bearer token. The routes come from [`openapi::routes`], the one list
/// the OpenAPI document is built from too.
pub fn router(state: AppState) -> Router {
    let (routes, _document) = openapi::routes().split_for_parts();
    routes
        .fallback(|| async { ApiError::NotFound("no such route".into()) })
        .method_not_allowed_fallback(|| async { ApiError::MethodNotAllowed })
        .with_state(state)
}

/// `GET /healthz`: the process is up. Needs no token.
#[utoipa::path(
    get,
    path = "/healthz",
    tag = "meta",
    responses(
        (status = 200, description = "The process is up.", body = Object, example = json!({"status": "ok"})),
    ),
)]
async fn healthz() -> axum::Json<serde_json::Value> {
    axum::Json(serde_json::json!({ "status": "ok" }))
}

/// How long `/readyz` waits for the store before calling it not ready.
const READY_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(2);

/// `GET /readyz`: the store answers and its schema is the one this build
/// migrates to. Needs no token. One read of the (few-row) migrations table,
/// so a load balancer may poll it every second.
#[utoipa::path(
    get,
    path = "/readyz",
    tag = "meta",
    responses(
        (status = 200, description = "Ready: the store answers and its schema is current.", body = Object, example = json!({"status": "ready"})),
        (status = 503, description = "Not ready: the store does not answer, or its schema is behind or ahead of this build; the message says which (`Retry-After`).", body = crate::error::Body),
    ),
)]
async fn readyz(
    axum::extract::State(state): axum::extract::State<AppState>,
) -> Result<axum::Json<serde_json::Value>, ApiError> {
    match tokio::time::timeout(READY_TIMEOUT, state.store().schema_status()).await {
        Ok(Ok(hookd_store::SchemaStatus::Current)) => {
            Ok(axum::Json(serde_json::json!({ "status": "ready" })))
        }
        Ok(Ok(schema)) => Err(ApiError::NotReady(schema.to_string())),
        Ok(Err(e)) => {
            // Debug only: a balancer polls this every second, and the
            // dispatcher reports the same failure at warn.
            tracing::debug!(error = %error::chain(&e), "not ready: the store failed");
            Err(ApiError::NotReady("the store does not answer".into()))
        }
        Err(_) => Err(ApiError::NotReady(format!(
            "the store does not answer (no reply within {} s)",
            READY_TIMEOUT.as_secs()
        ))),
    }
}

/// Serves `router` on `listener` until `shutdown` is cancelled, then stops
/// accepting connections and lets requests in flight finish.
pub async fn serve(
    listener: TcpListener,
    router: Router,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    // The peer address is what failed authentications are counted by.
    axum::serve(
        listener,
        router.into_make_service_with_connect_info::<std::net::SocketAddr>(),
    )
    .with_graceful_shutdown(shutdown.cancelled_owned())
    .await
}
