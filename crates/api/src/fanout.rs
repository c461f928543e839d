//! The cached fan-out index (design §9.4): event type → subscriptions, kept
//! in memory and rebuilt whenever the store's subscription generation moves.
//!
//! Ingest reads the generation (one cheap query) and compares it with the one
//! the cached index was built from, so a node never matches against a stale
//! index, even when another node changed a subscription. Rebuilds happen under
//! one async mutex, so a burst of events after a change loads the
//! subscriptions once, not once per request.

use std::sync::{Arc, RwLock};

use hookd_domain::matching::{FanoutTarget, SubscriptionIndex};
use hookd_store::Store;

use crate::error::ApiError;

/// An index and the generation it reflects.
#[derive(Debug, Default)]
pub(crate) struct BuiltIndex {
    /// The subscription generation read *before* the subscriptions were
    /// loaded: if a write lands in between, the next check sees a newer
    /// generation and rebuilds, so no change is ever missed.
    generation: Option<i64>,
    /// The index itself.
    pub(crate) index: SubscriptionIndex,
}

/// The current index, shared by every request of this node.
#[derive(Debug, Default)]
pub(crate) struct FanoutCache {
    // A std lock: it is held only to clone or swap an `Arc`, never across an
    // `.await`.
    current: RwLock<Arc<BuiltIndex>>,
    rebuild: tokio::sync::Mutex<()>,
}

impl FanoutCache {
    fn cached(&self) -> Arc<BuiltIndex> {
        self.current
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// The index, rebuilt first if the store's generation has moved.
    pub(crate) async fn current(&self, store: &dyn Store) -> Result<Arc<BuiltIndex>, ApiError> {
        let generation = store.subscription_generation().await?;
        let cached = self.cached();
        if cached.generation == Some(generation) {
            return Ok(cached);
        }
        self.rebuild(store).await
    }

    /// Rebuilds the index unless someone else brought it up to date while
    /// this call waited for the rebuild lock.
    pub(crate) async fn rebuild(&self, store: &dyn Store) -> Result<Arc<BuiltIndex>, ApiError> {
        let _guard = self.rebuild.lock().await;
        let generation = store.subscription_generation().await?;
        let cached = self.cached();
        if cached.generation == Some(generation) {
            return Ok(cached);
        }
        let subs = store.all_subscriptions().await?;
        let index = SubscriptionIndex::build(subs.iter().map(|s| {
            let target = FanoutTarget {
                sub_id: s.id,
                customer_id: s.customer_id.clone(),
                destination_host: Arc::from(s.url.host()),
            };
            (target, s.event_types.as_slice())
        }));
        tracing::debug!(
            generation,
            subscriptions = index.len(),
            "fan-out index rebuilt"
        );
        let built = Arc::new(BuiltIndex {
            generation: Some(generation),
            index,
        });
        *self.current.write().unwrap_or_else(|p| p.into_inner()) = built.clone();
        Ok(built)
    }
}
