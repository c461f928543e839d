//! Several `hookd serve` nodes on one PostgreSQL database (issue 8):
//! heartbeats, each worker node's share of every destination's cap, and
//! circuit gossip (R1) over `LISTEN/NOTIFY`.
//!
//! - **Heartbeats**: every node records one every `--heartbeat-every` (2 s)
//!   in the store's `nodes` table, on the database's clock. The answer is
//!   the number of worker nodes seen within `--node-live-within` (10 s);
//!   a worker node divides each host's cap by it
//!   ([`hookd_domain::isolation::node_share`]) and exports it as
//!   `hookd_live_worker_nodes`. A node that stops heartbeating drops out of
//!   the count within the live window (its claims come back when their
//!   leases expire: `reclaim_expired`); one that shuts down gracefully
//!   removes its row at once. Each heartbeat also reports the hosts whose
//!   circuit is not closed on that node (an api node: none), so that a
//!   hot-shard split can be refused while any live node sees a failure
//!   ([`hookd_domain::isolation::split_refusal`], R5).
//! - **Gossip**: a circuit that opens on a worker node is published with
//!   `pg_notify` on the schema's channel (`hookd_circuit…`) as
//!   `{host, node}`; every other worker node's listener adopts it
//!   ([`hookd_dispatch::gossip`]). Its own publications come back to it and
//!   are ignored (so node ids — `--worker-id`, by default host name and
//!   process id — must be unique). The listener reconnects by itself
//!   (`PgListener`), and after a failed reconnect tries again every second;
//!   openings published meanwhile are missed (that node's own breaker still
//!   protects the destination). On SQLite there is one process, so no gossip
//!   ([`hookd_dispatch::gossip::NoGossip`]).

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use hookd_dispatch::admission::Admission;
use hookd_dispatch::gossip::CircuitGossip;
use hookd_domain::isolation::CircuitState;
use hookd_store::{NodeHeartbeat, Store};
use hookd_store_postgres::PgStore;
use hookd_store_postgres::gossip::{CircuitListener, CircuitOpened};
use tokio::sync::{broadcast, mpsc};
use tokio_util::sync::CancellationToken;

/// How often nodes say they are alive, and for how long one counts as alive.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodesConfig {
    /// How often this node records a heartbeat.
    pub heartbeat_every: Duration,
    /// A node not seen for this long no longer counts (nor takes a share).
    pub live_within: Duration,
}

impl Default for NodesConfig {
    /// A heartbeat every 2 s; alive if seen in the last 10 s (five missed
    /// heartbeats, so a slow database round does not make a node vanish).
    fn default() -> Self {
        Self {
            heartbeat_every: Duration::from_secs(2),
            live_within: Duration::from_secs(10),
        }
    }
}

impl NodesConfig {
    /// Checks that a live node cannot drop out between two heartbeats.
    pub fn validate(&self) -> Result<(), String> {
        if self.heartbeat_every.is_zero() {
            return Err("--heartbeat-every must be more than 0".into());
        }
        if self.live_within < self.heartbeat_every * 2 {
            return Err(
                "--node-live-within must be at least twice --heartbeat-every, or a live node would drop out between heartbeats".into(),
            );
        }
        Ok(())
    }
}

/// The hosts whose circuit is not closed (open or half-open) in
/// `admission`, sorted: what a worker node's heartbeat reports.
pub fn open_circuits(admission: &Admission) -> Vec<String> {
    // `snapshots` is sorted by host already; sort anyway, it is the contract.
    let mut hosts: Vec<String> = admission
        .snapshots()
        .into_iter()
        .filter(|(_, s)| s.circuit_state != CircuitState::Closed)
        .map(|(host, _)| host)
        .collect();
    hosts.sort();
    hosts
}

/// Records one heartbeat, reporting the circuits not closed in `admission`
/// now (a worker node's; an api node passes `None` and reports none); on
/// success tells `admission` and the gauge how many worker nodes are live.
/// Returns the count.
pub async fn heartbeat_once(
    store: &dyn Store,
    node: &NodeHeartbeat,
    config: &NodesConfig,
    admission: Option<&Admission>,
) -> Option<u32> {
    let node = NodeHeartbeat {
        open_circuits: admission.map(open_circuits).unwrap_or_default(),
        ..node.clone()
    };
    match store.heartbeat(&node, config.live_within).await {
        Ok(live) => {
            metrics::gauge!("hookd_live_worker_nodes").set(f64::from(live));
            if let Some(admission) = admission {
                if admission.live_nodes() != live.max(1) {
                    tracing::info!(
                        live_worker_nodes = live,
                        "worker nodes changed: each takes its share of every destination's cap"
                    );
                }
                admission.set_live_nodes(live);
            }
            Some(live)
        }
        Err(e) => {
            // Keep the last count: a database that is away does not change
            // how many nodes share it.
            tracing::warn!(error = %hookd_dispatch::error_chain(&e), "recording the heartbeat failed");
            None
        }
    }
}

/// How long a shutting-down node tries to remove its row.
const FORGET_WITHIN: Duration = Duration::from_secs(2);

/// Heartbeats every `config.heartbeat_every` until `shutdown`; then removes
/// this node's row, so the others' shares grow at once.
pub async fn run_heartbeats(
    store: Arc<dyn Store>,
    node: NodeHeartbeat,
    config: NodesConfig,
    admission: Option<Arc<Admission>>,
    shutdown: CancellationToken,
) {
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => break,
            _ = tokio::time::sleep(config.heartbeat_every) => {}
        }
        heartbeat_once(store.as_ref(), &node, &config, admission.as_deref()).await;
    }
    // Bounded: a database that is away must not hold up the shutdown (the
    // row then simply goes stale).
    match tokio::time::timeout(FORGET_WITHIN, store.forget_node(&node.node_id)).await {
        Ok(Ok(_)) => {}
        Ok(Err(e)) => {
            tracing::warn!(error = %hookd_dispatch::error_chain(&e), "could not remove this node's heartbeat row")
        }
        Err(_) => tracing::warn!("removing this node's heartbeat row timed out"),
    }
}

/// Circuit gossip over PostgreSQL `LISTEN/NOTIFY`: the
/// [`CircuitGossip`] a worker node on PostgreSQL installs. Publishing only
/// queues; [`PgGossipDriver::run`] does the I/O.
#[derive(Debug)]
pub struct PgGossip {
    outbox: mpsc::UnboundedSender<String>,
    inbox: broadcast::Sender<String>,
}

impl CircuitGossip for PgGossip {
    fn publish_open(&self, host: &str) {
        // Fails only once the driver has stopped (shutdown).
        let _ = self.outbox.send(host.to_owned());
    }

    fn subscribe(&self) -> broadcast::Receiver<String> {
        self.inbox.subscribe()
    }
}

/// The I/O behind a [`PgGossip`]: sends what it queued, listens for the
/// other nodes' openings.
#[derive(Debug)]
pub struct PgGossipDriver {
    store: PgStore,
    channel: String,
    node: String,
    listener: CircuitListener,
    outbox: mpsc::UnboundedReceiver<String>,
    inbox: broadcast::Sender<String>,
}

/// Connects the gossip of node `node` on the PostgreSQL database at `url`
/// (two connections of its own: one to publish, one to listen). Listening
/// has begun when it returns, so no opening published after that is missed.
pub async fn pg_gossip(url: &str, node: &str) -> anyhow::Result<(Arc<PgGossip>, PgGossipDriver)> {
    let options = hookd_store_postgres::PgOptions {
        max_connections: 1,
        ..hookd_store_postgres::PgOptions::default()
    };
    let store = PgStore::connect(url, options)
        .await
        .context("connecting the circuit gossip to PostgreSQL")?;
    let channel = store
        .circuit_channel()
        .await
        .context("naming the circuit gossip channel")?;
    let listener = store
        .listen_circuits(&channel)
        .await
        .context("listening for circuit gossip")?;
    let (outbox_tx, outbox) = mpsc::unbounded_channel();
    let inbox = broadcast::Sender::new(256);
    let gossip = Arc::new(PgGossip {
        outbox: outbox_tx,
        inbox: inbox.clone(),
    });
    let driver = PgGossipDriver {
        store,
        channel,
        node: node.to_owned(),
        listener,
        outbox,
        inbox,
    };
    Ok((gossip, driver))
}

impl PgGossipDriver {
    /// Publishes and listens until `shutdown`. Counts
    /// `hookd_circuit_gossip_sent_total` for each opening published.
    pub async fn run(self, shutdown: CancellationToken) {
        let Self {
            store,
            channel,
            node,
            mut listener,
            mut outbox,
            inbox,
        } = self;
        tracing::info!(%channel, "circuit gossip listening");
        let publish = async {
            while let Some(host) = outbox.recv().await {
                let opened = CircuitOpened {
                    host,
                    node: node.clone(),
                };
                match store.notify_circuit_open(&channel, &opened).await {
                    Ok(()) => {
                        metrics::counter!("hookd_circuit_gossip_sent_total").increment(1);
                        tracing::info!(destination = %opened.host, "circuit opening published to the other nodes");
                    }
                    Err(e) => tracing::warn!(
                        destination = %opened.host,
                        error = %hookd_dispatch::error_chain(&e),
                        "could not publish a circuit opening"
                    ),
                }
            }
        };
        let listen = async {
            loop {
                match listener.recv().await {
                    // Our own, back from the database.
                    Ok(opened) if opened.node == node => {}
                    Ok(opened) => {
                        tracing::debug!(destination = %opened.host, from = %opened.node, "circuit opening received");
                        // No subscriber (yet): nothing to adopt it.
                        let _ = inbox.send(opened.host);
                    }
                    Err(e) => {
                        tracing::warn!(error = %hookd_dispatch::error_chain(&e), "circuit gossip listener lost its connection; retrying");
                        tokio::time::sleep(Duration::from_secs(1)).await;
                    }
                }
            }
        };
        tokio::select! {
            _ = shutdown.cancelled() => {}
            _ = publish => {}
            () = listen => {}
        }
        store.close().await;
    }
}

#[cfg(test)]
mod tests {
    use hookd_domain::SystemClock;
    use hookd_domain::isolation::AdmissionConfig;
    use hookd_store::{DueDestination, NodeRole};

    use super::*;

    #[tokio::test]
    async fn each_heartbeat_reports_the_circuits_not_closed_now() {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite:{}", dir.path().join("hookd.db").display());
        let store = crate::serve::open_store_with(&url, hookd_store::crypto::Keyring::ephemeral())
            .await
            .unwrap();
        store.migrate().await.unwrap();
        let admission = Admission::new(
            AdmissionConfig::default(),
            Duration::from_secs(60),
            Arc::new(SystemClock),
        );
        // A host admission knows with its circuit closed, and two open ones.
        admission.plan(
            &DueDestination {
                host: "up.example".into(),
                subscriptions: Vec::new(),
            },
            10,
        );
        admission.force_open("b.example");
        admission.force_open("a.example");
        let node = NodeHeartbeat {
            node_id: "w1".into(),
            role: NodeRole::All,
            started_at: chrono::Utc::now(),
            open_circuits: vec!["stale.example".into()],
        };
        let config = NodesConfig::default();
        let reported = |store: Arc<dyn Store>| async move {
            let nodes = store.nodes().await.unwrap();
            assert_eq!(nodes.len(), 1);
            nodes[0].open_circuits.clone()
        };

        assert_eq!(
            heartbeat_once(store.as_ref(), &node, &config, Some(&admission)).await,
            Some(1)
        );
        assert_eq!(
            reported(store.clone()).await,
            ["a.example", "b.example"],
            "the admission's, sorted, not the ones the node was built with"
        );

        // An api node (no admission) reports none.
        let api = NodeHeartbeat {
            role: NodeRole::Api,
            ..node.clone()
        };
        heartbeat_once(store.as_ref(), &api, &config, None).await;
        assert!(reported(store.clone()).await.is_empty());
    }
}
