//! Circuit gossip between nodes (R1): local circuit state, fast to open,
//! slow to close.
//!
//! Every node keeps its own breaker per destination host, in memory (no
//! store read per attempt: C1). When a node's breaker *opens*, it publishes
//! that through a [`CircuitGossip`]; every other node adopts it at once
//! ([`Admission::force_open`]: its own circuit for that host opens, for the
//! normal open period, and then probes on its own schedule). A *close* is
//! never gossiped: each node closes only on its own successful probe, so one
//! lucky probe cannot reopen the gates fleet-wide.
//!
//! The transport is the binary's business: PostgreSQL `LISTEN/NOTIFY` when
//! several nodes share a database, [`NoGossip`] on SQLite (one process).
//! This crate only publishes and adopts, so it stays free of any backend.

use std::sync::Arc;

use tokio::sync::broadcast;
use tokio_util::sync::CancellationToken;

use crate::admission::Admission;

/// How circuit openings travel between nodes.
pub trait CircuitGossip: Send + Sync + std::fmt::Debug {
    /// Tells the other nodes that `host`'s circuit opened here. Must not
    /// block (it is called where an attempt finishes): queue and return.
    fn publish_open(&self, host: &str);

    /// Hosts whose circuit opened on *another* node, as they arrive (this
    /// node's own publications are filtered out). A receiver that falls
    /// behind skips what it missed; one whose sender is gone ends.
    fn subscribe(&self) -> broadcast::Receiver<String>;
}

/// No other node to tell: SQLite, where one process owns the database.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoGossip;

impl CircuitGossip for NoGossip {
    fn publish_open(&self, _host: &str) {}

    fn subscribe(&self) -> broadcast::Receiver<String> {
        // Its sender is dropped at once: the receiver ends immediately.
        broadcast::channel(1).1
    }
}

/// Adopts every opening `gossip` delivers into `admission` until `shutdown`
/// (or until the gossip ends). Counts `hookd_circuit_gossip_received_total`
/// for each opening received and `hookd_circuit_gossip_adopted_total` for
/// those that opened a circuit here (the rest found it open already), and
/// logs the latter.
pub async fn adopt_openings(
    admission: Arc<Admission>,
    gossip: Arc<dyn CircuitGossip>,
    shutdown: CancellationToken,
) {
    let mut openings = gossip.subscribe();
    loop {
        let host = tokio::select! {
            _ = shutdown.cancelled() => return,
            received = openings.recv() => match received {
                Ok(host) => host,
                Err(broadcast::error::RecvError::Lagged(missed)) => {
                    tracing::warn!(missed, "circuit gossip fell behind; some openings were not adopted");
                    continue;
                }
                Err(broadcast::error::RecvError::Closed) => return,
            },
        };
        metrics::counter!("hookd_circuit_gossip_received_total").increment(1);
        if admission.force_open(&host) {
            metrics::counter!("hookd_circuit_gossip_adopted_total").increment(1);
            tracing::warn!(
                destination = %host,
                "circuit opened by gossip: another node's circuit for this destination opened; this node probes on its own schedule"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;
    use std::time::Duration;

    use hookd_domain::isolation::{AdmissionConfig, CircuitState};
    use hookd_domain::{Clock, FakeClock};

    use super::*;

    /// An in-process hub: what one node publishes, the others receive.
    #[derive(Debug)]
    struct Hub {
        tx: broadcast::Sender<String>,
        published: Mutex<Vec<String>>,
    }

    impl CircuitGossip for Hub {
        fn publish_open(&self, host: &str) {
            self.published.lock().unwrap().push(host.to_owned());
        }
        fn subscribe(&self) -> broadcast::Receiver<String> {
            self.tx.subscribe()
        }
    }

    fn admission() -> Arc<Admission> {
        let clock: Arc<dyn Clock> = Arc::new(FakeClock::new(
            chrono::DateTime::from_timestamp(1_700_000_000, 0).unwrap(),
        ));
        Admission::new(AdmissionConfig::default(), Duration::from_secs(30), clock)
    }

    #[tokio::test]
    async fn an_opening_from_another_node_is_adopted() {
        let a = admission();
        let hub = Arc::new(Hub {
            tx: broadcast::channel(16).0,
            published: Mutex::default(),
        });
        let shutdown = CancellationToken::new();
        let task = tokio::spawn(adopt_openings(a.clone(), hub.clone(), shutdown.clone()));
        // The task subscribes when it first runs.
        while hub.tx.receiver_count() == 0 {
            tokio::task::yield_now().await;
        }
        hub.tx.send("x.example".into()).unwrap();
        for _ in 0..1000 {
            if a.snapshot("x.example").is_some() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        assert_eq!(
            a.snapshot("x.example").unwrap().circuit_state,
            CircuitState::Open
        );
        assert!(
            hub.published.lock().unwrap().is_empty(),
            "an adopted opening is not published again"
        );
        shutdown.cancel();
        task.await.unwrap();
    }

    #[tokio::test]
    async fn no_gossip_ends_at_once() {
        adopt_openings(admission(), Arc::new(NoGossip), CancellationToken::new()).await;
    }
}
