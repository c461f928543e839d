//! Circuit gossip over `LISTEN`/`NOTIFY` (R1): how one node tells the others
//! that a destination's circuit opened, with no table and no polling.
//!
//! Only the transport lives here; what a node does with an opening (adopt
//! it, never a close) is the dispatcher's. Notifications are fire and forget:
//! one sent while a listener is reconnecting is lost to it, which costs only
//! what R1 accepts anyway (that node keeps trying until its own breaker
//! opens).
//!
//! The channel is scoped to the schema the store works in, so deployments
//! (or tests) sharing one database in different schemas do not hear each
//! other: `hookd_circuit` in `public`, `hookd_circuit_<schema>` elsewhere.

use serde::{Deserialize, Serialize};
use sqlx::postgres::{PgListener, PgPoolOptions};

use hookd_store::{Result, StoreError};

use crate::PgStore;
use crate::error::map;

/// The longest channel name PostgreSQL keeps (`NAMEDATALEN - 1`).
const MAX_CHANNEL: usize = 63;

/// "This host's circuit opened on this node."
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CircuitOpened {
    /// The destination host.
    pub host: String,
    /// The node whose circuit opened (its worker id), so it can ignore its own.
    pub node: String,
}

/// The notification channel for a schema.
fn channel_for(schema: &str) -> String {
    let mut name = if schema == "public" {
        "hookd_circuit".to_owned()
    } else {
        format!("hookd_circuit_{schema}")
    };
    while name.len() > MAX_CHANNEL {
        name.pop();
    }
    name
}

impl PgStore {
    /// The channel circuit openings are published on, for the schema this
    /// store works in.
    pub async fn circuit_channel(&self) -> Result<String> {
        self.bounded(async {
            let schema: Option<String> = sqlx::query_scalar("SELECT current_schema()")
                .fetch_one(&self.pool)
                .await
                .map_err(map)?;
            Ok(channel_for(schema.as_deref().unwrap_or("public")))
        })
        .await
    }

    /// Publishes `opened` on `channel` (one `pg_notify`, delivered to every
    /// listener, the publisher's own included, when it commits).
    pub async fn notify_circuit_open(&self, channel: &str, opened: &CircuitOpened) -> Result<()> {
        let payload =
            serde_json::to_string(opened).map_err(|e| StoreError::Backend(Box::new(e)))?;
        self.bounded(async {
            sqlx::query("SELECT pg_notify($1, $2)")
                .bind(channel)
                .bind(payload)
                .execute(&self.pool)
                .await
                .map_err(map)?;
            Ok(())
        })
        .await
    }

    /// Listens on `channel` over a connection of its own (outside the pool,
    /// which it would otherwise hold forever). Listening has begun when this
    /// returns.
    pub async fn listen_circuits(&self, channel: &str) -> Result<CircuitListener> {
        let options = (*self.pool.connect_options()).clone();
        let pool = PgPoolOptions::new()
            .max_connections(1)
            .max_lifetime(None)
            .idle_timeout(None)
            .acquire_timeout(std::time::Duration::from_secs(5))
            .connect_with(options)
            .await
            .map_err(map)?;
        let mut listener = PgListener::connect_with(&pool).await.map_err(map)?;
        listener.listen(channel).await.map_err(map)?;
        Ok(CircuitListener { listener })
    }
}

/// Circuit openings as they are published.
#[derive(Debug)]
pub struct CircuitListener {
    listener: PgListener,
}

impl CircuitListener {
    /// The next opening published on the channel, by any node (this one's
    /// own included: compare [`CircuitOpened::node`]). A lost connection is
    /// re-established (and the channel listened to again) transparently;
    /// an error means re-establishing it failed, and the next call tries
    /// again. A payload that is not an opening is skipped.
    pub async fn recv(&mut self) -> Result<CircuitOpened> {
        loop {
            let n = self.listener.recv().await.map_err(map)?;
            if let Ok(opened) = serde_json::from_str::<CircuitOpened>(n.payload()) {
                return Ok(opened);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn channels_are_scoped_to_the_schema_and_fit_postgresql() {
        assert_eq!(channel_for("public"), "hookd_circuit");
        assert_eq!(channel_for("t_0123"), "hookd_circuit_t_0123");
        assert_eq!(channel_for(&"x".repeat(63)).len(), MAX_CHANNEL);
    }
}
