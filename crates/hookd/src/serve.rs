//! Wiring: open the store, migrate, make sure an admin token exists, build
//! the API and the dispatcher, run both, and stop both together.
//!
//! What runs depends on the node's role (`--role`, issue 8):
//!
//! | task                                   | `all` | `api` | `worker` |
//! |----------------------------------------|-------|-------|----------|
//! | HTTP API (every route)                 | yes   | yes   | —        |
//! | `/healthz`, `/readyz`, `/metrics` only | —     | —     | yes      |
//! | dispatcher, replay runner, retention   | yes   | —     | yes      |
//! | fan-out runner (lazy fan-out)          | yes   | —     | yes      |
//! | circuit gossip (PostgreSQL)            | yes   | —     | yes      |
//! | subscription monitor                   | yes   | yes   | yes      |
//! | heartbeat                              | yes   | yes   | yes      |
//!
//! The monitor runs on every role: ingest (api) refuses events for the
//! shedding subscriptions it loads, and the dead-lettering/configuration
//! judgement needs the subscriptions its own dispatcher (worker) touched;
//! its writes are compare-and-set, so any number of nodes may run it.
//! Roles other than `all` need PostgreSQL: one process owns a SQLite file,
//! so an `api` node there would accept events nobody delivers.

use std::net::SocketAddr;
use std::sync::{Arc, OnceLock};

use anyhow::Context as _;
use hookd_api::MonitorConfig;
use hookd_dispatch::{DispatchConfig, Dispatcher, Observer};
use hookd_domain::destination::DestinationPolicy;
use hookd_domain::isolation::CircuitState;
use hookd_domain::{SubscriptionId, SystemClock};
use hookd_store::{
    LazyFanout, NewToken, NodeHeartbeat, NodeRole, SignalKind, Store, StoreError, Subscription,
};

use crate::cluster::{NodesConfig, PgGossipDriver};
use crate::maintenance::RetentionConfig;
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use sha2::{Digest, Sha256};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// What `hookd serve` needs, already validated.
#[derive(Debug, Clone)]
pub struct AppConfig {
    /// `sqlite:PATH` or `postgres://…` (on a sharded deployment, the
    /// control database).
    pub database: String,
    /// PostgreSQL databases holding the deliveries, placed by destination
    /// host (`--shard`); empty: the one database holds everything, unless
    /// it stores a shard map.
    pub shards: Vec<String>,
    /// Most connections this node opens to each PostgreSQL database (the
    /// control database and every shard): `--database-max-connections`.
    pub database_max_connections: u32,
    /// Allow loopback and private destinations.
    pub allow_private_destinations: bool,
    /// Addresses allowed although private (`--allow-destination-cidr`).
    pub allow_destination_cidrs: Vec<hookd_domain::destination::IpNet>,
    /// The admin token, if the operator set one (`HOOKD_ADMIN_TOKEN`).
    pub admin_token: Option<String>,
    /// The dispatcher's settings.
    pub dispatch: DispatchConfig,
    /// The subscription monitor's settings (shedding, disabling).
    pub monitor: MonitorConfig,
    /// How long history is kept.
    pub retention: RetentionConfig,
    /// Seals subscription secrets at rest. `None`: from the environment or
    /// the SQLite key file ([`crate::keys::keyring_for`]).
    pub keyring: Option<hookd_store::crypto::Keyring>,
    /// When ingest writes a fan-out job instead of an event's deliveries
    /// (`--lazy-fanout-threshold`).
    pub lazy_fanout: LazyFanout,
    /// What this node runs (`--role`): API, dispatcher, or both.
    pub role: NodeRole,
    /// Heartbeats: how often, and how long a node counts as live.
    pub nodes: NodesConfig,
    /// Whether ingest creates the deliveries this node's dispatcher can send
    /// at once already claimed by it (`--no-ingest-claims` turns it off);
    /// only with `--role all`.
    pub ingest_claims: bool,
}

impl AppConfig {
    /// The defaults for everything but the database and the dispatcher.
    pub fn new(database: String, dispatch: DispatchConfig) -> Self {
        Self {
            database,
            shards: Vec::new(),
            database_max_connections: hookd_store_postgres::PgOptions::default().max_connections,
            allow_private_destinations: false,
            allow_destination_cidrs: Vec::new(),
            admin_token: None,
            dispatch,
            monitor: MonitorConfig::default(),
            retention: RetentionConfig::default(),
            keyring: None,
            lazy_fanout: LazyFanout::DEFAULT,
            role: NodeRole::All,
            nodes: NodesConfig::default(),
            ingest_claims: true,
        }
    }
}

/// Connects the dispatcher to the API's monitor: every finished attempt
/// marks its subscription for re-judging, and a 410 disables the
/// subscription with a `hookd.subscription.disabled` event.
#[derive(Debug)]
struct MonitorObserver {
    state: hookd_api::AppState,
}

#[async_trait::async_trait]
impl Observer for MonitorObserver {
    fn attempt_finished(&self, sub_id: &SubscriptionId, delivered: bool) {
        // Only a failure can start dead-lettering or a configuration error;
        // a subscription with either raised is re-judged every round anyway
        // (that is how they are lowered). So a delivery costs the monitor
        // nothing: under load, re-reading every busy subscription's health
        // each round was a fifth of the database's work.
        if !delivered {
            self.state.touch(sub_id);
        }
    }

    async fn destination_gone(&self, sub: &Subscription) -> Result<(), StoreError> {
        self.state
            .announce(sub, SignalKind::Disabled, hookd_dispatch::GONE_DETAIL)
            .await
            .map(|_| ())
    }
}

/// A built application, ready to run.
#[derive(Debug)]
pub struct App {
    store: Arc<dyn Store>,
    listener: TcpListener,
    local_addr: SocketAddr,
    router: axum::Router,
    dispatcher: Dispatcher,
    state: hookd_api::AppState,
    monitor: MonitorConfig,
    retention: RetentionConfig,
    shutdown: CancellationToken,
    generated_admin_token: Option<String>,
    database: String,
    role: NodeRole,
    nodes: NodesConfig,
    /// This node's heartbeat (its id is the dispatcher's worker id).
    node: NodeHeartbeat,
    /// The circuit gossip's I/O, on a worker node on PostgreSQL.
    gossip: Option<PgGossipDriver>,
}

/// Opens the store the URL names: `sqlite:…` or `postgres://…`, sealing
/// subscription secrets with the key from the environment or the SQLite key
/// file ([`crate::keys::keyring_for`]).
pub async fn open_store(url: &str) -> anyhow::Result<Arc<dyn Store>> {
    check_url(url)?;
    open_store_with(url, crate::keys::keyring_for(url)?).await
}

/// [`open_store`] with the keyring given.
pub async fn open_store_with(
    url: &str,
    keyring: hookd_store::crypto::Keyring,
) -> anyhow::Result<Arc<dyn Store>> {
    open_store_tuned(url, keyring, LazyFanout::DEFAULT).await
}

/// [`open_store_with`], fanning out lazily the events with more deliveries
/// than `lazy_fanout.threshold` (`--lazy-fanout-threshold`). This is the
/// only place that names a backend.
pub async fn open_store_tuned(
    url: &str,
    keyring: hookd_store::crypto::Keyring,
    lazy_fanout: LazyFanout,
) -> anyhow::Result<Arc<dyn Store>> {
    open_store_sharded(url, &[], keyring, lazy_fanout, None).await
}

/// [`open_store_tuned`] for a deployment whose deliveries may live on
/// `shards` (`--shard`): PostgreSQL databases beside the control database
/// at `url`. With shards given, or a shard map stored in the database at
/// `url`, the store is a [`ShardedStore`](hookd_store_postgres::sharded::ShardedStore)
/// (which migrates the control database and every shard); otherwise one
/// database.
pub async fn open_store_sharded(
    url: &str,
    shards: &[String],
    keyring: hookd_store::crypto::Keyring,
    lazy_fanout: LazyFanout,
    max_connections: Option<u32>,
) -> anyhow::Result<Arc<dyn Store>> {
    anyhow::ensure!(
        shards.is_empty() || is_postgres(url),
        "--shard needs PostgreSQL: the control database (--database) must be postgres://…"
    );
    if let Some(shard) = shards.iter().find(|s| !is_postgres(s)) {
        anyhow::bail!(
            "--shard {}: a shard must be a postgres://… URL",
            crate::cli::redact_url(shard)
        );
    }
    if is_postgres(url) {
        let defaults = hookd_store_postgres::PgOptions::default();
        let options = hookd_store_postgres::PgOptions {
            keyring,
            lazy_fanout,
            max_connections: max_connections.unwrap_or(defaults.max_connections),
            ..defaults
        };
        let store = hookd_store_postgres::PgStore::connect(url, options.clone())
            .await
            .context("connecting to PostgreSQL")?;
        let sharded = !shards.is_empty()
            || store
                .stored_shard_map()
                .await
                .context("reading the shard map")?
                .is_some();
        if sharded {
            let store =
                hookd_store_postgres::sharded::ShardedStore::open_with(store, url, shards, options)
                    .await
                    .context("opening the shards")?;
            return Ok(Arc::new(store));
        }
        Ok(Arc::new(store))
    } else if url.starts_with("sqlite:") {
        let store = hookd_store_sqlite::SqliteStore::connect_url_with_keyring(url, keyring)
            .await
            .context("opening the SQLite database")?
            .with_lazy_fanout(lazy_fanout);
        Ok(Arc::new(store))
    } else {
        Err(unsupported(url))
    }
}

/// An unsupported URL is refused before any key is looked for.
fn check_url(url: &str) -> anyhow::Result<()> {
    let known = ["postgres://", "postgresql://", "sqlite:"];
    match known.iter().any(|scheme| url.starts_with(scheme)) {
        true => Ok(()),
        false => Err(unsupported(url)),
    }
}

pub(crate) fn is_postgres(url: &str) -> bool {
    url.starts_with("postgres://") || url.starts_with("postgresql://")
}

/// A worker node's HTTP: `/healthz`, `/readyz` and `/metrics`, and 404 for
/// every other route (no events are accepted on a node that only delivers).
fn worker_only(router: axum::Router) -> axum::Router {
    use axum::response::IntoResponse as _;
    router.layer(axum::middleware::from_fn(
        |req: axum::extract::Request, next: axum::middleware::Next| async move {
            match req.uri().path() {
                "/healthz" | "/readyz" | "/metrics" => next.run(req).await,
                _ => hookd_api::ApiError::NotFound(
                    "no such route on a worker node (--role worker): use an api node".into(),
                )
                .into_response(),
            }
        },
    ))
}

fn unsupported(url: &str) -> anyhow::Error {
    anyhow::anyhow!("unsupported database URL `{url}`: use `sqlite:PATH` or `postgres://…`")
}

/// How often the recorder's histograms are drained into their buckets.
/// The exporter's own default, which `install_recorder` does not run.
const METRICS_UPKEEP_EVERY: std::time::Duration = std::time::Duration::from_secs(5);

/// The process's Prometheus recorder, installed on first use, with a thread
/// that runs its upkeep every [`METRICS_UPKEEP_EVERY`]. Installing is
/// global, so several apps in one process (tests) share it; `None` if some
/// other recorder was installed first.
///
/// Without upkeep, every histogram observation (one per attempt at least)
/// stays in the recorder as a raw 8-byte sample until a scrape of
/// `/metrics` drains it: a node nobody scrapes grows without bound, by
/// about 165 MiB an hour at 6,000 attempts a second.
fn prometheus() -> Option<PrometheusHandle> {
    static HANDLE: OnceLock<Option<PrometheusHandle>> = OnceLock::new();
    HANDLE
        .get_or_init(|| {
            let seconds = [
                0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
            ];
            let batch = [1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0];
            // Store calls are often well under a millisecond.
            let store = [
                0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0,
            ];
            PrometheusBuilder::new()
                .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), &seconds)
                .and_then(|b| {
                    b.set_buckets_for_metric(Matcher::Full("hookd_claim_batch_size".into()), &batch)
                })
                .and_then(|b| {
                    // A full name wins over the suffix.
                    b.set_buckets_for_metric(Matcher::Full("hookd_store_seconds".into()), &store)
                })
                .ok()?
                .install_recorder()
                .ok()
                .inspect(|handle| {
                    let handle = handle.clone();
                    // A thread, not a task: the recorder is the process's,
                    // not one runtime's.
                    let started = std::thread::Builder::new()
                        .name("metrics-upkeep".into())
                        .spawn(move || {
                            loop {
                                std::thread::sleep(METRICS_UPKEEP_EVERY);
                                handle.run_upkeep();
                            }
                        });
                    if let Err(e) = started {
                        tracing::warn!(error = %e, "could not start the metrics upkeep thread");
                    }
                })
        })
        .clone()
}

/// What `/metrics` renders: the recorder's counters and histograms, plus
/// each destination's isolation state read at scrape time (so it is never
/// stale and costs nothing between scrapes).
fn render_metrics(
    handle: PrometheusHandle,
    dispatcher: &Dispatcher,
) -> hookd_api::metrics::RenderMetrics {
    let admission = dispatcher.admission().clone();
    Arc::new(move || {
        for (host, s) in admission.snapshots() {
            let state = match s.circuit_state {
                CircuitState::Closed => 0.0,
                CircuitState::HalfOpen => 1.0,
                CircuitState::Open => 2.0,
            };
            let gauge = |name: &'static str, value: f64| {
                metrics::gauge!(name, "destination" => host.clone()).set(value);
            };
            gauge("hookd_destination_circuit_state", state);
            gauge("hookd_destination_in_flight", f64::from(s.in_flight));
            gauge(
                "hookd_destination_concurrency_limit",
                f64::from(s.concurrency_limit),
            );
            gauge("hookd_destination_rate_per_second", s.rate_per_sec);
            gauge("hookd_destination_ramp_level", s.ramp_level);
        }
        handle.render()
    })
}

/// What `/subscriptions/{id}/health` shows of a destination host: the
/// dispatcher's admission state, read at request time.
fn destination_state(dispatcher: &Dispatcher) -> hookd_api::DestinationState {
    let admission = dispatcher.admission().clone();
    Arc::new(move |host| {
        admission
            .snapshot(host)
            .map(|s| hookd_api::DestinationView {
                circuit_state: s.circuit_state,
                in_flight: s.in_flight,
                rate_per_sec: s.rate_per_sec,
                ramp_level: s.ramp_level,
            })
    })
}

/// Ingest's deliveries claimed for this node's dispatcher (§9.1, fed from
/// ingest): the API's seam, the dispatcher's queues. Weak: the dispatcher
/// holds the API's state (its observer), so a strong handle here would be
/// a cycle that keeps both, and the store's connections, alive forever.
#[derive(Debug)]
struct DispatchHandoff {
    queue: hookd_dispatch::IngestQueue,
    worker_id: String,
    lease: std::time::Duration,
}

impl hookd_api::IngestHandoff for DispatchHandoff {
    fn worker_id(&self) -> &str {
        &self.worker_id
    }

    fn lease(&self) -> std::time::Duration {
        self.lease
    }

    fn reserve(&self, host: &str, n: u32) -> u32 {
        self.queue.reserve(host, n)
    }

    fn hand_over(&self, reserved: &[(String, u32)], claimed: Vec<hookd_store::ClaimedDelivery>) {
        self.queue.hand_over(reserved, claimed);
    }
}

fn sha256(token: &str) -> [u8; 32] {
    Sha256::digest(token.as_bytes()).into()
}

impl App {
    /// Opens and migrates the store and builds every component. Nothing runs
    /// until [`App::run`].
    pub async fn build(config: AppConfig, listener: TcpListener) -> anyhow::Result<Self> {
        anyhow::ensure!(
            config.role == NodeRole::All || is_postgres(&config.database),
            "--role {} needs PostgreSQL: only one process can open a SQLite database, so it must \
             run both the API and the dispatcher (--role all)",
            config.role.as_str()
        );
        config
            .nodes
            .validate()
            .map_err(anyhow::Error::msg)
            .context("checking the heartbeat settings")?;
        // Installed first, so the store's timings have somewhere to go.
        let prometheus = prometheus();
        let keyring = match &config.keyring {
            Some(keyring) => keyring.clone(),
            None => {
                check_url(&config.database)?;
                crate::keys::keyring_for(&config.database)?
            }
        };
        let store = open_store_sharded(
            &config.database,
            &config.shards,
            keyring,
            config.lazy_fanout,
            Some(config.database_max_connections),
        )
        .await?;
        // Every component below sees the store through the timer.
        let store: Arc<dyn Store> = Arc::new(crate::TimedStore::new(store));
        store
            .migrate()
            .await
            .context("applying database migrations")?;

        let mut generated_admin_token = None;
        let admin_token_hash = match &config.admin_token {
            Some(token) => Some(sha256(token)),
            None => {
                if !store
                    .has_admin_token()
                    .await
                    .context("looking up the admin token")?
                {
                    let token = hookd_api::generate_token();
                    let new = NewToken {
                        token_hash: sha256(&token).to_vec(),
                        customer_id: None,
                        label: Some("generated at first start".into()),
                        expires_at: None,
                    };
                    store
                        .create_token(new)
                        .await
                        .context("storing the generated admin token")?;
                    generated_admin_token = Some(token);
                }
                None
            }
        };

        let wake = Arc::new(tokio::sync::Notify::new());
        let policy = if config.allow_private_destinations {
            DestinationPolicy::AllowPrivate
        } else {
            DestinationPolicy::public_only(config.allow_destination_cidrs.clone())
        };
        // The same policy at creation (API) and at connect time (dispatch).
        let mut dispatch_config = config.dispatch;
        dispatch_config.egress.policy = policy;
        if !is_postgres(&config.database) {
            // SQLite has one writer: a second record batch would only queue
            // on its lock, and make smaller batches.
            dispatch_config.record_flushes = 1;
        }
        let mut api_config = hookd_api::ApiConfig::new(policy);
        api_config.admin_token_hash = admin_token_hash;
        let state = hookd_api::AppState::new(store.clone(), api_config, wake.clone());
        let dispatcher =
            Dispatcher::new(store.clone(), dispatch_config, Arc::new(SystemClock), wake)
                .context("building the dispatcher")?;
        if let Some(handle) = prometheus {
            state.set_metrics(render_metrics(handle, &dispatcher));
        }
        state.set_destination_state(destination_state(&dispatcher));
        if config.ingest_claims && config.role == NodeRole::All {
            state.set_ingest_handoff(Arc::new(DispatchHandoff {
                queue: dispatcher.ingest_queue(),
                worker_id: dispatcher.config().worker_id.clone(),
                lease: dispatcher.config().lease,
            }));
        }
        dispatcher.set_observer(Arc::new(MonitorObserver {
            state: state.clone(),
        }));
        let node = NodeHeartbeat {
            node_id: dispatcher.config().worker_id.clone(),
            role: config.role,
            started_at: chrono::Utc::now(),
            // Filled in on each beat from the admission (`heartbeat_once`).
            open_circuits: Vec::new(),
        };
        // Circuit openings travel between the nodes that deliver (R1).
        let gossip = if config.role.delivers() && is_postgres(&config.database) {
            let (gossip, driver) =
                crate::cluster::pg_gossip(&config.database, &node.node_id).await?;
            dispatcher.admission().set_gossip(gossip);
            Some(driver)
        } else {
            dispatcher
                .admission()
                .set_gossip(Arc::new(hookd_dispatch::gossip::NoGossip));
            None
        };
        let router = match config.role {
            NodeRole::Worker => worker_only(hookd_api::router(state.clone())),
            NodeRole::Api | NodeRole::All => hookd_api::router(state.clone()),
        };
        let local_addr = listener
            .local_addr()
            .context("reading the listen address")?;
        Ok(Self {
            store,
            listener,
            local_addr,
            router,
            dispatcher,
            state,
            monitor: config.monitor,
            retention: config.retention,
            shutdown: CancellationToken::new(),
            generated_admin_token,
            database: config.database,
            role: config.role,
            nodes: config.nodes,
            node,
            gossip,
        })
    }

    /// What this node runs.
    pub fn role(&self) -> NodeRole {
        self.role
    }

    /// The address the API listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// The store.
    pub fn store(&self) -> &Arc<dyn Store> {
        &self.store
    }

    /// The database URL.
    pub fn database(&self) -> &str {
        &self.database
    }

    /// The dispatcher.
    pub fn dispatcher(&self) -> &Dispatcher {
        &self.dispatcher
    }

    /// The API's shared state (the monitor lives there).
    pub fn state(&self) -> &hookd_api::AppState {
        &self.state
    }

    /// The admin token generated at first start, if one was.
    pub fn generated_admin_token(&self) -> Option<&str> {
        self.generated_admin_token.as_deref()
    }

    /// Cancel it to stop the application gracefully.
    pub fn shutdown_token(&self) -> CancellationToken {
        self.shutdown.clone()
    }

    /// Runs the API and the dispatcher until the shutdown token is cancelled
    /// or either of them ends; then stops the other and waits for both.
    pub async fn run(self) -> anyhow::Result<()> {
        let tracker = TaskTracker::new();
        let shutdown = self.shutdown.clone();
        let (tx, mut rx) =
            tokio::sync::mpsc::unbounded_channel::<(&'static str, anyhow::Result<()>)>();

        let api_tx = tx.clone();
        let api_shutdown = shutdown.clone();
        let (listener, router) = (self.listener, self.router);
        tracker.spawn(async move {
            let res = hookd_api::serve(listener, router, api_shutdown.clone())
                .await
                .context("the API server failed");
            api_shutdown.cancel();
            let _ = api_tx.send(("api", res));
        });
        // The background helpers end with the shutdown token; they hold no
        // work of their own (their state is in the store), so they need no
        // grace period.
        let delivers = self.role.delivers();
        // This node counts (and takes its share) before it claims anything.
        let admission = delivers.then(|| self.dispatcher.admission().clone());
        crate::cluster::heartbeat_once(
            self.store.as_ref(),
            &self.node,
            &self.nodes,
            admission.as_deref(),
        )
        .await;
        tracker.spawn(crate::cluster::run_heartbeats(
            self.store.clone(),
            self.node.clone(),
            self.nodes.clone(),
            admission,
            shutdown.clone(),
        ));
        if let Some(driver) = self.gossip {
            tracker.spawn(driver.run(shutdown.clone()));
        }
        if delivers {
            let gossip = self
                .dispatcher
                .admission()
                .gossip()
                .unwrap_or_else(|| Arc::new(hookd_dispatch::gossip::NoGossip));
            tracker.spawn(hookd_dispatch::gossip::adopt_openings(
                self.dispatcher.admission().clone(),
                gossip,
                shutdown.clone(),
            ));
            let replay = self.dispatcher.clone();
            let replay_shutdown = shutdown.clone();
            tracker.spawn(async move { replay.run_replay_jobs(replay_shutdown).await });
            // Lazy fan-out: writes the deliveries of events committed with
            // a fan-out job, batch by batch, and wakes the claim loop.
            let fanout = self.dispatcher.clone();
            let fanout_shutdown = shutdown.clone();
            tracker.spawn(async move { fanout.run_fanout(fanout_shutdown).await });
        }
        let (state, monitor, monitor_shutdown) =
            (self.state.clone(), self.monitor.clone(), shutdown.clone());
        tracker.spawn(async move { state.run_monitor(monitor, monitor_shutdown).await });
        if delivers {
            let (store, retention, retention_shutdown) =
                (self.store.clone(), self.retention.clone(), shutdown.clone());
            tracker.spawn(crate::maintenance::run_retention(
                store,
                retention,
                retention_shutdown,
            ));

            let dispatch_shutdown = shutdown.clone();
            let dispatcher = self.dispatcher;
            tracker.spawn(async move {
                let res = dispatcher
                    .run(dispatch_shutdown.clone())
                    .await
                    .context("the dispatcher failed");
                dispatch_shutdown.cancel();
                let _ = tx.send(("dispatcher", res));
            });
        }
        tracker.close();
        tracker.wait().await;

        let mut first_error = None;
        while let Ok((task, res)) = rx.try_recv() {
            match res {
                Ok(()) => tracing::info!(task, "stopped"),
                Err(e) => {
                    tracing::error!(task, error = format!("{e:#}"), "stopped with an error");
                    first_error.get_or_insert(e);
                }
            }
        }
        first_error.map_or(Ok(()), Err)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The recorder comes with its upkeep: a thread of the process that
    /// drains the histograms, whether or not anyone scrapes `/metrics`.
    #[cfg(target_os = "linux")]
    #[test]
    fn installing_the_recorder_starts_its_upkeep() {
        assert!(prometheus().is_some(), "no other recorder in this process");
        let threads = || -> Vec<String> {
            std::fs::read_dir("/proc/self/task")
                .unwrap()
                .filter_map(|task| std::fs::read_to_string(task.ok()?.path().join("comm")).ok())
                .map(|comm| comm.trim().to_owned())
                .collect()
        };
        // The new thread names itself once it runs: poll, with a deadline.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while !threads().iter().any(|t| t == "metrics-upkeep") {
            assert!(
                std::time::Instant::now() < deadline,
                "threads: {:?}",
                threads()
            );
            std::thread::yield_now();
        }
    }
}
