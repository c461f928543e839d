//! The cached fan-out index (design §9.4): event type → subscriptions, kept
//! in memory and rebuilt whenever the store's subscription generation moves.
//!
//! Ingest matches against the index as last built
//! ([`FanoutCache::last_built`]), and its batch commits with
//! `Store::accept_events_at` that index's generation, which the store
//! checks after the request arrived (PostgreSQL in the same round trip as
//! the writes), so a node never writes a match made against a stale index,
//! even when another node changed a subscription. A mismatch writes nothing
//! and sends the request back to rebuild ([`FanoutCache::current`]) and
//! match again (`committer.rs`). Rebuilds happen under one async mutex, so a
//! burst of events after a change loads the subscriptions once, not once
//! per request.
//!
//! The generation reads that rebuilds start are shared
//! ([`GenerationReads`]): a request takes the value of a read that *began
//! after it arrived*, so a burst costs one read, and no request can see a
//! generation older than its own arrival.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use hookd_domain::SubscriptionId;
use hookd_domain::matching::{FanoutTarget, SubscriptionIndex};
use hookd_domain::subscription::SubscriptionState;
use hookd_store::{Store, Subscription};

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
    /// The subscriptions whose new deliveries may be claimed at ingest
    /// (`committer::IngestHandoff`), as loaded: active, unordered (their
    /// order is the claim's to keep), and with no explicit rate limit or
    /// concurrency cap (the dispatcher learns those from the claim loop's
    /// listing, so their destinations go through it).
    pub(crate) claimable: HashMap<SubscriptionId, Arc<Subscription>>,
}

/// The current index, shared by every request of this node.
#[derive(Debug, Default)]
pub(crate) struct FanoutCache {
    // A std lock: it is held only to clone or swap an `Arc`, never across an
    // `.await`.
    current: RwLock<Arc<BuiltIndex>>,
    rebuild: tokio::sync::Mutex<()>,
    generations: GenerationReads,
}

/// Store reads of the subscription generation, shared by the requests that
/// wait for one at the same time.
///
/// Reads run one at a time (a fair async mutex) and are numbered as they
/// begin. A request notes how many had begun when it arrived; once its turn
/// comes, a completed read numbered above that began after it arrived and
/// serves it; otherwise it reads itself. So while one read is in flight,
/// every request arriving meanwhile is served by the single next read.
#[derive(Debug, Default)]
struct GenerationReads {
    /// Reads begun.
    begun: AtomicU64,
    /// The latest completed read: its number and what it read.
    latest: Mutex<Option<(u64, i64)>>,
    one_at_a_time: tokio::sync::Mutex<()>,
}

impl GenerationReads {
    /// The generation, by a read (`fetch`) that began after this call.
    async fn read<F, Fut, E>(&self, fetch: F) -> Result<i64, E>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<i64, E>>,
    {
        let arrived = self.begun.load(Ordering::SeqCst);
        let _turn = self.one_at_a_time.lock().await;
        if let Some((n, generation)) = *self.latest.lock().unwrap_or_else(|p| p.into_inner())
            && n > arrived
        {
            return Ok(generation);
        }
        let n = self.begun.fetch_add(1, Ordering::SeqCst) + 1;
        let generation = fetch().await?;
        *self.latest.lock().unwrap_or_else(|p| p.into_inner()) = Some((n, generation));
        Ok(generation)
    }
}

impl FanoutCache {
    /// The index as last built, without asking the store, and the
    /// generation it was built from; `None` before the first build. A match
    /// against it holds only if the generation, read after the request
    /// arrived, is still this one (`Store::accept_events_at` checks).
    pub(crate) fn last_built(&self) -> Option<(Arc<BuiltIndex>, i64)> {
        let cached = self.cached();
        let generation = cached.generation?;
        Some((cached, generation))
    }

    /// The store's subscription generation, by a read that began after this
    /// call was first polled (shared with the requests around it).
    async fn read_generation(&self, store: &dyn Store) -> Result<i64, hookd_store::StoreError> {
        self.generations
            .read(|| store.subscription_generation())
            .await
    }

    fn cached(&self) -> Arc<BuiltIndex> {
        self.current
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// The index, rebuilt first if the store's generation has moved.
    pub(crate) async fn current(&self, store: &dyn Store) -> Result<Arc<BuiltIndex>, ApiError> {
        let generation = self.read_generation(store).await?;
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
        let claimable = subs
            .into_iter()
            .filter(|s| {
                s.state == SubscriptionState::Active
                    && !s.ordered
                    && s.rate_limit.is_none()
                    && s.max_concurrency.is_none()
            })
            .map(|s| (s.id, Arc::new(s)))
            .collect();
        let built = Arc::new(BuiltIndex {
            generation: Some(generation),
            index,
            claimable,
        });
        *self.current.write().unwrap_or_else(|p| p.into_inner()) = built.clone();
        Ok(built)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicI64;
    use std::time::Duration;

    use futures::FutureExt as _;
    use tokio::sync::Semaphore;

    use super::*;

    /// While one read is in flight, every request arriving meanwhile is
    /// served by one next read, which began after they arrived; none gets
    /// the value of the read that was already under way.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn requests_arriving_during_a_read_share_the_next_one() {
        let reads = Arc::new(GenerationReads::default());
        let count = Arc::new(AtomicI64::new(0));
        let gate = Arc::new(Semaphore::new(0));
        let read = || {
            let (reads, count, gate) = (reads.clone(), count.clone(), gate.clone());
            async move {
                reads
                    .read(|| async {
                        // A read's value is its number: 1, 2, …
                        let n = count.fetch_add(1, Ordering::SeqCst) + 1;
                        gate.acquire().await.unwrap().forget();
                        Ok::<i64, ()>(n)
                    })
                    .await
            }
            .boxed()
        };
        let first = tokio::spawn(read());
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while count.load(Ordering::SeqCst) < 1 {
            assert!(
                tokio::time::Instant::now() < deadline,
                "the first read began"
            );
            tokio::task::yield_now().await;
        }
        // Ten requests arrive while it is in flight: polled once, each notes
        // its arrival and waits for its turn.
        let mut later: Vec<_> = (0..10).map(|_| read()).collect();
        for r in &mut later {
            assert!(r.now_or_never().is_none(), "waits behind the first read");
        }
        gate.add_permits(100);
        assert_eq!(first.await.unwrap(), Ok(1));
        for r in later {
            assert_eq!(r.await, Ok(2), "served by the read after theirs began");
        }
        assert_eq!(
            count.load(Ordering::SeqCst),
            2,
            "two reads for eleven requests"
        );
    }
}
