//! Deliveries sharded by destination across PostgreSQL databases (issue 8;
//! design §4 "sharded by DESTINATION", §9, R5).
//!
//! [`ShardedStore`] implements [`Store`] over one **control** database and
//! M **shards**. Each is a complete hookd schema (the same migrations):
//!
//! - The control database holds what is not per destination: events (as
//!   accepted, with their idempotency keys), subscriptions, tokens, signals,
//!   nodes, the circuit gossip channel, and the **shard map** (versioned:
//!   every change is a new row, and every node reads the highest).
//! - A shard holds deliveries, attempts, replay jobs, fan-out jobs and the
//!   daily rollup of the destinations placed on it, plus what those rows
//!   refer to: a copy of each event it has deliveries of, and a mirror of
//!   every subscription (claims read a subscription's URL, secret and state
//!   on the shard, in the claim's own statement).
//! - A delivery is placed by a stable hash of its destination host
//!   ([`hookd_domain::placement`]), or, for a host that was split, of
//!   (host, subscription). The control database may double as a shard
//!   (its URL in the list).
//!
//! **Ingest across shards.** The control database commits the event with
//! an *outbox* row holding its planned deliveries (one transaction: this is
//! the durability point, after which the event is never lost). Then every
//! shard holding some of them writes its part in one transaction of its
//! own, recording the event in `shard_parts` so that writing it again
//! writes nothing; then the outbox row goes. A crash between leaves the
//! outbox row, and a sweeper (run by every worker node, from the fan-out
//! runner) writes the parts of any row older than [`SWEEP_AFTER`] again:
//! what a shard had committed is skipped, what it had not is written. So
//! per shard the outbox property holds exactly; across shards, an event's
//! deliveries appear on different shards at different moments, and after a
//! crash some of them up to a sweep later.
//!
//! **Claims** ask every shard for its due destinations and merge them, so a
//! host whose deliveries sit on two shards (after a split, or after a shard
//! was added) is still one destination to admission: its cap, rate and
//! circuit stay per host. Each claim goes to the shard that listed the
//! work; records, renewals and releases go to the shard the claim came
//! from. A shard that fails is left out of a pass (its work waits), never
//! the whole pass.
//!
//! **Subscriptions** are written to every shard first, then to the control
//! database (which decides whether one exists), so no event can match a
//! subscription a shard lacks. An update goes to the control database,
//! then to every shard.

pub mod outbox;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use futures::future::join_all;
use hookd_domain::placement::{PlacementKey, shard_of};
use hookd_domain::subscription::SubscriptionState;
use hookd_domain::{DeliveryId, EventId, JobId, SubscriptionId, Timestamp};
use hookd_store::{
    Accepted, AttemptRecord, Backlog, BatchOutcome, ClaimRequest, ClaimedDelivery, DailyStats,
    Delivery, DeliveryDetail, DeliveryQuery, DueDestination, DueSubscription, DueWork, Event,
    FanoutBacklog, FanoutStep, FoundToken, JobState, JobStep, Lease, NewDelivery, NewEvent,
    NewReplayJob, NewSubscription, NewToken, NodeHeartbeat, NodeInfo, Notice, RaisedSignal,
    RecordOutcome, ReplayJob, Result, RetentionPolicy, RetentionReport, SchemaStatus, SignalKind,
    Store, StoreError, Subscription, SubscriptionHealth, SubscriptionPatch, SubscriptionQuery,
    group_due_by_host,
};

use outbox::Part;
pub use outbox::ShardMap;

use crate::{PgOptions, PgStore};

/// An outbox row this old is taken to be a crash's leftover, and its parts
/// are written again by the sweeper (the usual path finishes in
/// milliseconds; writing a part twice is harmless, only wasted).
pub const SWEEP_AFTER: Duration = Duration::from_secs(10);

/// How often a node looks for a newer shard map.
const MAP_CHECK_EVERY: Duration = Duration::from_secs(2);

/// How often the sweeper looks at the outbox.
const SWEEP_EVERY: Duration = Duration::from_secs(2);

/// One shard: its store, and whether it is the control database itself.
#[derive(Debug, Clone)]
struct Shard {
    store: PgStore,
    is_control: bool,
}

/// The shard map as this node applies it.
#[derive(Debug)]
struct Topology {
    map: ShardMap,
    shards: Vec<Shard>,
    split: HashSet<String>,
}

impl Topology {
    /// The shard a new delivery of `sub` to `host` goes to.
    fn place(&self, host: &str, sub: &SubscriptionId) -> usize {
        let key = match self.split.contains(host) {
            true => PlacementKey::HostAndSubscription(host, sub),
            false => PlacementKey::Host(host),
        };
        shard_of(key, self.shards.len())
    }

    /// The shards that are not the control database.
    fn others(&self) -> impl Iterator<Item = &PgStore> {
        self.shards
            .iter()
            .filter(|s| !s.is_control)
            .map(|s| &s.store)
    }
}

/// Per host, per subscription with due work there: the shards that listed
/// it, oldest first.
type DueShards = HashMap<String, Vec<(SubscriptionId, Vec<usize>)>>;

/// [`Store`] over a control database and its shards. See the module docs.
#[derive(Debug)]
pub struct ShardedStore {
    /// The control database, writing deliveries to its outbox.
    control: PgStore,
    control_url: String,
    options: PgOptions,
    topo: RwLock<Arc<Topology>>,
    /// When the map was last checked (one checker at a time).
    checked: tokio::sync::Mutex<Instant>,
    /// Which shard each delivery this node holds a lease on came from.
    leases: Mutex<HashMap<DeliveryId, usize>>,
    /// From the last due listing: which shards have due work at each host,
    /// by subscription, oldest first.
    due: Mutex<DueShards>,
    next_fanout: AtomicUsize,
    swept: Mutex<Option<Instant>>,
    /// [`SWEEP_AFTER`], unless changed.
    sweep_after: Duration,
}

fn all_failed(what: &str, errors: Vec<StoreError>) -> StoreError {
    let n = errors.len();
    errors
        .into_iter()
        .next()
        .unwrap_or_else(|| StoreError::Backend(format!("{what}: no shard answered ({n})").into()))
}

impl ShardedStore {
    /// [`Store::accept_events_at`] (`generation`: `Some`) or
    /// [`Store::accept_events`] (`None`): the control database takes the
    /// events and the outbox, then the shards get their parts.
    async fn accept_parts(
        &self,
        batch: Vec<(NewEvent, Vec<NewDelivery>)>,
        generation: Option<i64>,
    ) -> Result<BatchOutcome> {
        self.refresh().await;
        let Some((results, _)) = self.control.accept_batch(&batch, generation, None).await? else {
            return Ok(BatchOutcome::GenerationMoved(batch));
        };
        let accepted: Vec<(NewEvent, Vec<NewDelivery>)> = batch
            .into_iter()
            .zip(&results)
            .filter(|((_, ds), r)| !ds.is_empty() && matches!(r, Ok(a) if !a.duplicate))
            .map(|(part, _)| part)
            .collect();
        if !accepted.is_empty() {
            let topo = self.topology();
            self.write_parts(&topo, &accepted).await;
        }
        Ok(BatchOutcome::Accepted(results))
    }

    /// Opens a sharded deployment: connects to the control database at
    /// `control_url` and migrates it, reconciles `shards` (the `--shard`
    /// URLs, possibly none) with the map stored there, connects to and
    /// migrates every shard, and, when the map was created or grew, mirrors
    /// every subscription onto the shards.
    ///
    /// The map: none stored and `shards` given → stored as version 1; one
    /// stored and `shards` empty or equal → used; `shards` extends it at the
    /// end → stored as the next version (shards are added, never removed or
    /// reordered: a shard's index is its identity for placement); anything
    /// else is refused (`Conflict`, naming both lists). `Conflict` also when
    /// neither exists.
    pub async fn open(control_url: &str, shards: &[String], options: PgOptions) -> Result<Self> {
        let base = PgStore::connect(control_url, options.clone()).await?;
        Self::open_with(base, control_url, shards, options).await
    }

    /// [`open`](Self::open) over a connection to the control database made
    /// already (with `options`).
    pub async fn open_with(
        base: PgStore,
        control_url: &str,
        shards: &[String],
        options: PgOptions,
    ) -> Result<Self> {
        base.migrate().await?;
        let (map, changed) = loop {
            let stored = outbox::load_map(&base).await?;
            let next = match (&stored, shards.is_empty()) {
                (None, true) => {
                    return Err(StoreError::Conflict(
                        "no shard map is stored in the control database and no --shard was given"
                            .into(),
                    ));
                }
                (Some(m), true) => break (m.clone(), false),
                (Some(m), false) if m.shards == shards => break (m.clone(), false),
                (Some(m), false) if shards.starts_with(&m.shards) => ShardMap {
                    version: m.version + 1,
                    shards: shards.to_vec(),
                    split_hosts: m.split_hosts.clone(),
                },
                (Some(m), false) => {
                    return Err(StoreError::Conflict(format!(
                        "the control database's shard map (version {}) lists {:?}, but --shard lists {:?}: \
                         shards can only be added at the end of the list",
                        m.version,
                        m.shards.iter().map(|u| redact(u)).collect::<Vec<_>>(),
                        shards.iter().map(|u| redact(u)).collect::<Vec<_>>(),
                    )));
                }
                (None, false) => ShardMap {
                    version: 1,
                    shards: shards.to_vec(),
                    split_hosts: Vec::new(),
                },
            };
            if outbox::save_map(&base, &next).await? {
                break (next, true);
            }
            // Another node stored that version first: decide again.
        };
        let topo = connect(control_url, &base, map, &options, &[]).await?;
        for store in topo.others() {
            store.migrate().await?;
        }
        let store = ShardedStore {
            control: base.as_control(true),
            control_url: control_url.to_owned(),
            options,
            topo: RwLock::new(Arc::new(topo)),
            checked: tokio::sync::Mutex::new(Instant::now()),
            leases: Mutex::new(HashMap::new()),
            due: Mutex::new(HashMap::new()),
            next_fanout: AtomicUsize::new(0),
            swept: Mutex::new(None),
            sweep_after: SWEEP_AFTER,
        };
        if changed {
            store.mirror_all().await?;
        }
        Ok(store)
    }

    /// Sweeps outbox rows older than `after` instead of [`SWEEP_AFTER`]
    /// (tests; an operator who knows ingest is slow may raise it).
    pub fn with_sweep_after(mut self, after: Duration) -> Self {
        self.sweep_after = after;
        self
    }

    /// The map this node applies.
    pub fn map(&self) -> ShardMap {
        self.topology().map.clone()
    }

    /// The control database (for what lives only there: the circuit
    /// gossip's channel, operators' commands).
    pub fn control(&self) -> &PgStore {
        &self.control
    }

    fn topology(&self) -> Arc<Topology> {
        self.topo.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Applies a newer stored map, at most every [`MAP_CHECK_EVERY`]; a
    /// failed check keeps the current map (and says so).
    async fn refresh(&self) {
        let Ok(mut checked) = self.checked.try_lock() else {
            return;
        };
        if checked.elapsed() < MAP_CHECK_EVERY {
            return;
        }
        *checked = Instant::now();
        let current = self.topology();
        match outbox::map_version(&self.control).await {
            Ok(Some(v)) if v > current.map.version => {}
            Ok(_) => return,
            Err(e) => {
                tracing::warn!(error = %e, "could not check the shard map; keeping version {}", current.map.version);
                return;
            }
        }
        let next = async {
            let map = outbox::load_map(&self.control)
                .await?
                .ok_or_else(|| StoreError::Corrupt("the shard map vanished".into()))?;
            connect(
                &self.control_url,
                &self.control,
                map,
                &self.options,
                &current.shards,
            )
            .await
        };
        match next.await {
            Ok(topo) => {
                tracing::info!(
                    version = topo.map.version,
                    shards = topo.shards.len(),
                    "shard map changed"
                );
                *self.topo.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(topo);
            }
            Err(e) => tracing::warn!(error = %e, "could not apply the newer shard map"),
        }
    }

    /// Places `host`'s subscriptions by (host, subscription) from now on
    /// (R5: a hot host spread over the shards). Its deliveries already
    /// written stay where they are and are claimed from there; admission,
    /// circuit and cap stay per host, because claims merge every shard's
    /// due work by host. Stores the next map version; every node applies
    /// it within seconds. Whether the host was split already is the
    /// `bool` (nothing stored then). The caller checks it is safe
    /// ([`hookd_domain::isolation`]'s split rule).
    pub async fn split_host(&self, host: &str) -> Result<(ShardMap, bool)> {
        loop {
            let map = outbox::load_map(&self.control)
                .await?
                .ok_or_else(|| StoreError::Corrupt("no shard map".into()))?;
            if map.split_hosts.iter().any(|h| h == host) {
                return Ok((map, false));
            }
            let mut next = map.clone();
            next.version += 1;
            next.split_hosts.push(host.to_owned());
            next.split_hosts.sort();
            if outbox::save_map(&self.control, &next).await? {
                return Ok((next, true));
            }
        }
    }

    /// `host`'s attempts that started at or after `since`, on every shard:
    /// how many, and how many got no 2xx.
    pub async fn host_attempts(&self, host: &str, since: Timestamp) -> Result<(u64, u64)> {
        let topo = self.topology();
        let mut total = (0, 0);
        for shard in &topo.shards {
            let (n, failed) = outbox::host_attempts(&shard.store, host, since).await?;
            total = (total.0 + n, total.1 + failed);
        }
        Ok(total)
    }

    /// Writes every subscription (deleted ones left out) onto every shard
    /// that is not the control database: created where missing, brought up
    /// to date where present. Done when the map is created or grows.
    pub async fn mirror_all(&self) -> Result<u64> {
        let subs = self.control.all_subscriptions().await?;
        for sub in &subs {
            self.mirror(sub).await?;
        }
        Ok(subs.len() as u64)
    }

    /// Brings `sub` up to date on every shard but the control database.
    async fn mirror(&self, sub: &Subscription) -> Result<()> {
        let topo = self.topology();
        for shard in topo.others() {
            match shard.update_subscription(&sub.id, full_patch(sub)).await {
                Ok(_) => {}
                Err(StoreError::NotFound) => {
                    let created = shard.create_subscription(new_subscription(sub)).await;
                    match created {
                        Ok(_) | Err(StoreError::Conflict(_)) => {}
                        Err(e) => return Err(e),
                    }
                    shard.update_subscription(&sub.id, full_patch(sub)).await?;
                }
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// Writes each shard's parts, then removes from the outbox the events
    /// whose every part is written. A shard that fails leaves its events in
    /// the outbox, for the sweeper.
    async fn write_parts(&self, topo: &Topology, batch: &[(NewEvent, Vec<NewDelivery>)]) {
        let mut parts: Vec<Vec<Part>> = vec![Vec::new(); topo.shards.len()];
        let mut touched: Vec<(EventId, Vec<usize>)> = Vec::new();
        for (event, deliveries) in batch {
            let mut by_shard: BTreeMap<usize, Vec<NewDelivery>> = BTreeMap::new();
            for d in deliveries {
                let s = topo.place(&d.destination_host, &d.sub_id);
                by_shard.entry(s).or_default().push(d.clone());
            }
            touched.push((event.id, by_shard.keys().copied().collect()));
            for (s, ds) in by_shard {
                parts[s].push((event.clone(), ds));
            }
        }
        let results = join_all(
            topo.shards
                .iter()
                .zip(&parts)
                .map(|(shard, parts)| outbox::write_parts(&shard.store, parts)),
        )
        .await;
        let failed: HashSet<usize> = results
            .iter()
            .enumerate()
            .filter_map(|(i, r)| match r {
                Ok(_) => None,
                Err(e) => {
                    tracing::warn!(shard = i, error = %e, "a shard did not take its part of accepted events; the outbox keeps them for the sweeper");
                    Some(i)
                }
            })
            .collect();
        let done: Vec<EventId> = touched
            .into_iter()
            .filter(|(_, shards)| shards.iter().all(|s| !failed.contains(s)))
            .map(|(id, _)| id)
            .collect();
        if let Err(e) = outbox::finish(&self.control, &done).await {
            tracing::warn!(error = %e, "could not clear finished outbox rows; the sweeper will");
        }
    }

    /// Writes the parts of outbox rows: of `ids`, or those older than
    /// [`SWEEP_AFTER`] (a crash's leftovers). Returns how many rows it took.
    async fn drain(&self, ids: Option<&[EventId]>) -> Result<usize> {
        let older_than = match ids {
            Some(_) => Duration::ZERO,
            None => self.sweep_after,
        };
        let rows = outbox::pending(&self.control, ids, older_than, 256).await?;
        if !rows.is_empty() {
            let topo = self.topology();
            self.write_parts(&topo, &rows).await;
        }
        Ok(rows.len())
    }

    /// The sweeper, at most every [`SWEEP_EVERY`].
    async fn sweep(&self) {
        {
            let mut swept = self.swept.lock().unwrap_or_else(|p| p.into_inner());
            if swept.is_some_and(|at| at.elapsed() < SWEEP_EVERY.min(self.sweep_after)) {
                return;
            }
            *swept = Some(Instant::now());
        }
        match self.drain(None).await {
            Ok(0) => {}
            Ok(n) => tracing::info!(
                events = n,
                "finished the fan-out of events a crash left in the outbox"
            ),
            Err(e) => tracing::warn!(error = %e, "could not sweep the shard outbox"),
        }
    }

    /// Every database once: the control database, and each shard that is
    /// not it. For reads that add up what each holds.
    fn databases(topo: &Topology, control: &PgStore) -> Vec<PgStore> {
        std::iter::once(control.clone())
            .chain(topo.others().cloned())
            .collect()
    }

    /// Runs `f` on every database once and returns each answer.
    async fn on_databases<T, F, Fut>(&self, f: F) -> Vec<Result<T>>
    where
        F: Fn(PgStore) -> Fut,
        Fut: Future<Output = Result<T>>,
    {
        let dbs = Self::databases(&self.topology(), &self.control);
        join_all(dbs.into_iter().map(f)).await
    }

    /// Runs `f` on every shard and returns each answer, by shard index.
    async fn on_shards<T, F, Fut>(&self, f: F) -> Vec<Result<T>>
    where
        F: Fn(PgStore) -> Fut,
        Fut: Future<Output = Result<T>>,
    {
        let topo = self.topology();
        join_all(topo.shards.iter().map(|s| f(s.store.clone()))).await
    }

    /// Which shard holds each of `ids`: the one this node claimed it from
    /// (one look at the lease map for all of them), else, for the few this
    /// node did not claim, the shard that has it (`NotFound` if none).
    async fn shards_of(&self, ids: &[DeliveryId]) -> Result<Vec<usize>> {
        let known: Vec<Option<usize>> = {
            let leases = self.leases_lock();
            ids.iter().map(|id| leases.get(id).copied()).collect()
        };
        let mut out = Vec::with_capacity(ids.len());
        for (id, known) in ids.iter().zip(known) {
            out.push(match known {
                Some(s) => s,
                None => self.find_delivery(id).await?,
            });
        }
        Ok(out)
    }

    /// The shard that has delivery `id`, asking every shard.
    async fn find_delivery(&self, id: &DeliveryId) -> Result<usize> {
        let found = self
            .on_shards(|s| async move { s.get_delivery(id).await })
            .await;
        let mut err = None;
        for (i, r) in found.into_iter().enumerate() {
            match r {
                Ok(_) => return Ok(i),
                Err(StoreError::NotFound) => {}
                Err(e) => err = Some(e),
            }
        }
        Err(err.unwrap_or(StoreError::NotFound))
    }

    /// [`shards_of`](Self::shards_of) for one delivery.
    async fn shard_of_delivery(&self, id: &DeliveryId) -> Result<usize> {
        Ok(self.shards_of(std::slice::from_ref(id)).await?[0])
    }

    fn leases_lock(&self) -> std::sync::MutexGuard<'_, HashMap<DeliveryId, usize>> {
        self.leases.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn shard(&self, i: usize) -> Result<PgStore> {
        self.topology()
            .shards
            .get(i)
            .map(|s| s.store.clone())
            .ok_or_else(|| StoreError::Corrupt(format!("no shard {i}")))
    }
}

impl PgStore {
    /// The shard map stored in this database, if it is a sharded
    /// deployment's control database (one not migrated yet has none).
    pub async fn stored_shard_map(&self) -> Result<Option<ShardMap>> {
        match outbox::load_map(self).await {
            Ok(map) => Ok(map),
            // 42P01: the table does not exist (never migrated).
            Err(StoreError::Backend(e))
                if e.downcast_ref::<sqlx::Error>().is_some_and(|e| {
                    matches!(e, sqlx::Error::Database(db) if db.code().as_deref() == Some("42P01"))
                }) =>
            {
                Ok(None)
            }
            Err(e) => Err(e),
        }
    }
}

/// Builds the topology of `map`, reusing the connections of `known` (the
/// current topology's shards, by index: the list only grows).
async fn connect(
    control_url: &str,
    control: &PgStore,
    map: ShardMap,
    options: &PgOptions,
    known: &[Shard],
) -> Result<Topology> {
    let mut shards = Vec::with_capacity(map.shards.len());
    for (i, url) in map.shards.iter().enumerate() {
        let shard = match known.get(i) {
            Some(shard) => shard.clone(),
            None if url == control_url => Shard {
                store: control.as_control(false),
                is_control: true,
            },
            None => {
                let store = PgStore::connect(url, options.clone()).await?;
                Shard {
                    store,
                    is_control: false,
                }
            }
        };
        shards.push(shard);
    }
    Ok(Topology {
        split: map.split_hosts.iter().cloned().collect(),
        map,
        shards,
    })
}

/// A URL with its password hidden, for messages.
fn redact(url: &str) -> String {
    match url::Url::parse(url) {
        Ok(mut u) if u.password().is_some() => {
            let _ = u.set_password(Some("***"));
            u.to_string()
        }
        _ => url.to_owned(),
    }
}

fn full_patch(sub: &Subscription) -> SubscriptionPatch {
    SubscriptionPatch {
        url: Some(sub.url.clone()),
        event_types: Some(sub.event_types.clone()),
        keys: Some(sub.keys.clone()),
        ordered: Some(sub.ordered),
        retry_policy: Some(sub.retry_policy.clone()),
        state: Some(sub.state),
        rate_limit: Some(sub.rate_limit),
        max_concurrency: Some(sub.max_concurrency),
        description: Some(sub.description.clone()),
    }
}

fn new_subscription(sub: &Subscription) -> NewSubscription {
    NewSubscription {
        id: sub.id,
        customer_id: sub.customer_id.clone(),
        url: sub.url.clone(),
        event_types: sub.event_types.clone(),
        keys: sub.keys.clone(),
        ordered: sub.ordered,
        retry_policy: sub.retry_policy.clone(),
        rate_limit: sub.rate_limit,
        max_concurrency: sub.max_concurrency,
        description: sub.description.clone(),
    }
}

/// Adds up one subscription's health as each database holds it.
fn add_health(sum: &mut SubscriptionHealth, part: SubscriptionHealth) {
    sum.pending_count += part.pending_count;
    sum.dead_count += part.dead_count;
    sum.oldest_pending_created_at = min_opt(
        sum.oldest_pending_created_at,
        part.oldest_pending_created_at,
    );
    sum.oldest_dead_at = min_opt(sum.oldest_dead_at, part.oldest_dead_at);
    for count in part.attempts {
        match sum
            .attempts
            .iter_mut()
            .find(|c| c.status == count.status && c.error_class == count.error_class)
        {
            Some(c) => c.count += count.count,
            None => sum.attempts.push(count),
        }
    }
    sum.attempts.sort_by(|a, b| {
        (
            a.status.is_none(),
            a.status,
            a.error_class.map(|c| c.as_str()),
        )
            .cmp(&(
                b.status.is_none(),
                b.status,
                b.error_class.map(|c| c.as_str()),
            ))
    });
    for signal in part.signals {
        if !sum.signals.iter().any(|s| s.kind == signal.kind) {
            sum.signals.push(signal);
        }
    }
    sum.signals.sort_by_key(|s| s.kind);
}

fn min_opt(a: Option<Timestamp>, b: Option<Timestamp>) -> Option<Timestamp> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// One job as its parts on the shards make it: counts added up; running
/// while any part runs, else cancelled if any was, else completed.
fn merge_jobs(parts: Vec<ReplayJob>) -> Option<ReplayJob> {
    let mut parts = parts.into_iter();
    let mut job = parts.next()?;
    for p in parts {
        job.total += p.total;
        job.done += p.done;
        job.failed += p.failed;
        job.skipped += p.skipped;
        job.requeued += p.requeued;
        job.created_at = job.created_at.min(p.created_at);
        job.state = match (job.state, p.state) {
            (JobState::Running, _) | (_, JobState::Running) => JobState::Running,
            (JobState::Cancelled, _) | (_, JobState::Cancelled) => JobState::Cancelled,
            _ => JobState::Completed,
        };
        job.finished_at = match (job.finished_at, p.finished_at) {
            (Some(a), Some(b)) => Some(a.max(b)),
            (a, b) => a.or(b),
        };
    }
    if job.state == JobState::Running {
        job.finished_at = None;
    }
    Some(job)
}

/// The answers that succeeded, or the first error when none did.
fn answered<T>(what: &str, results: Vec<Result<T>>) -> Result<Vec<T>> {
    let (mut ok, mut errors) = (Vec::new(), Vec::new());
    for r in results {
        match r {
            Ok(v) => ok.push(v),
            Err(e) => errors.push(e),
        }
    }
    if !errors.is_empty() {
        if ok.is_empty() {
            return Err(all_failed(what, errors));
        }
        for e in &errors {
            tracing::warn!(error = %e, "{what}: a shard failed; going on without it");
        }
    }
    Ok(ok)
}

/// The answers of the shards that have it (`NotFound` from the others is
/// no error), or the first other error.
fn found<T>(results: Vec<Result<T>>) -> Result<Vec<T>> {
    let mut out = Vec::new();
    for r in results {
        match r {
            Ok(v) => out.push(v),
            Err(StoreError::NotFound) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(out)
}

/// Every answer, or the first error.
fn all<T>(results: Vec<Result<T>>) -> Result<Vec<T>> {
    results.into_iter().collect()
}

#[async_trait]
impl Store for ShardedStore {
    async fn migrate(&self) -> Result<()> {
        all(self
            .on_databases(|s| async move { s.migrate().await })
            .await)?;
        Ok(())
    }

    async fn ping(&self) -> Result<()> {
        all(self.on_databases(|s| async move { s.ping().await }).await)?;
        Ok(())
    }

    async fn schema_status(&self) -> Result<SchemaStatus> {
        let all = all(self
            .on_databases(|s| async move { s.schema_status().await })
            .await)?;
        Ok(all
            .into_iter()
            .find(|s| *s != SchemaStatus::Current)
            .unwrap_or(SchemaStatus::Current))
    }

    async fn due_work(&self) -> Result<DueWork> {
        let parts = answered(
            "due work",
            self.on_databases(|s| async move { s.due_work().await })
                .await,
        )?;
        Ok(parts.into_iter().fold(DueWork::default(), |a, b| DueWork {
            due: a.due + b.due,
            oldest_overdue: a.oldest_overdue.max(b.oldest_overdue),
        }))
    }

    // --- subscriptions ------------------------------------------------------

    async fn create_subscription(&self, new: NewSubscription) -> Result<Subscription> {
        let topo = self.topology();
        for shard in topo.others() {
            match shard.create_subscription(new.clone()).await {
                Ok(_) | Err(StoreError::Conflict(_)) => {}
                Err(e) => return Err(e),
            }
        }
        self.control.create_subscription(new).await
    }

    async fn get_subscription(&self, id: &SubscriptionId) -> Result<Subscription> {
        self.control.get_subscription(id).await
    }

    async fn list_subscriptions(&self, query: &SubscriptionQuery) -> Result<Vec<Subscription>> {
        self.control.list_subscriptions(query).await
    }

    async fn all_subscriptions(&self) -> Result<Vec<Subscription>> {
        self.control.all_subscriptions().await
    }

    async fn update_subscription(
        &self,
        id: &SubscriptionId,
        patch: SubscriptionPatch,
    ) -> Result<Subscription> {
        let sub = self.control.update_subscription(id, patch).await?;
        self.mirror(&sub).await?;
        Ok(sub)
    }

    async fn delete_subscription(&self, id: &SubscriptionId) -> Result<()> {
        self.control.get_subscription(id).await?;
        let topo = self.topology();
        for shard in topo.others() {
            match shard.delete_subscription(id).await {
                Ok(()) | Err(StoreError::NotFound) => {}
                Err(e) => return Err(e),
            }
        }
        self.control.delete_subscription(id).await
    }

    async fn subscription_generation(&self) -> Result<i64> {
        self.control.subscription_generation().await
    }

    async fn reseal_secrets(&self) -> Result<u64> {
        let all = all(self
            .on_databases(|s| async move { s.reseal_secrets().await })
            .await)?;
        Ok(all.into_iter().sum())
    }

    // --- ingest -------------------------------------------------------------

    async fn accept_event(
        &self,
        event: NewEvent,
        deliveries: Vec<NewDelivery>,
    ) -> Result<Accepted> {
        self.accept_events(vec![(event, deliveries)])
            .await?
            .pop()
            .unwrap_or_else(|| Err(StoreError::Corrupt("no result for the event".into())))
    }

    async fn accept_events(
        &self,
        batch: Vec<(NewEvent, Vec<NewDelivery>)>,
    ) -> Result<Vec<Result<Accepted>>> {
        match self.accept_parts(batch, None).await? {
            BatchOutcome::Accepted(results) => Ok(results),
            BatchOutcome::GenerationMoved(_) => {
                Err(StoreError::Corrupt("no generation was asked for".into()))
            }
        }
    }

    async fn accept_events_at(
        &self,
        generation: i64,
        batch: Vec<(NewEvent, Vec<NewDelivery>)>,
    ) -> Result<BatchOutcome> {
        self.accept_parts(batch, Some(generation)).await
    }

    async fn get_event(&self, id: &EventId) -> Result<Event> {
        self.control.get_event(id).await
    }

    async fn materialize_fanout(&self) -> Result<Option<FanoutStep>> {
        self.sweep().await;
        let topo = self.topology();
        let n = topo.shards.len();
        let start = self.next_fanout.fetch_add(1, Ordering::Relaxed);
        for k in 0..n {
            let shard = &topo.shards[(start + k) % n].store;
            if let Some(step) = shard.materialize_fanout().await? {
                return Ok(Some(step));
            }
        }
        Ok(None)
    }

    async fn fanout_backlog(&self) -> Result<FanoutBacklog> {
        let all = all(self
            .on_databases(|s| async move { s.fanout_backlog().await })
            .await)?;
        Ok(all
            .into_iter()
            .fold(FanoutBacklog::default(), |a, b| FanoutBacklog {
                jobs: a.jobs + b.jobs,
                deliveries: a.deliveries + b.deliveries,
            }))
    }

    // --- dispatch -----------------------------------------------------------

    async fn due_destinations(&self, limit: u32) -> Result<Vec<DueDestination>> {
        self.refresh().await;
        let lists = self
            .on_shards(|s| async move { s.due_destinations(limit).await })
            .await;
        let mut rows: Vec<(String, DueSubscription, usize)> = Vec::new();
        let mut errors = Vec::new();
        let shards = lists.len();
        for (i, list) in lists.into_iter().enumerate() {
            match list {
                Ok(list) => {
                    for dest in list {
                        for sub in dest.subscriptions {
                            rows.push((dest.host.clone(), sub, i));
                        }
                    }
                }
                Err(e) => {
                    tracing::warn!(shard = i, error = %e, "a shard did not list its due work; its destinations wait");
                    errors.push(e);
                }
            }
        }
        if errors.len() == shards {
            return Err(all_failed("due destinations", errors));
        }
        rows.sort_by_key(|(_, sub, _)| sub.oldest_due_at);
        let mut from: DueShards = HashMap::new();
        let mut merged: Vec<(String, DueSubscription)> = Vec::new();
        let mut at: HashMap<(String, SubscriptionId), usize> = HashMap::new();
        for (host, sub, i) in rows {
            let subs = from.entry(host.clone()).or_default();
            match subs.iter_mut().find(|(id, _)| *id == sub.sub_id) {
                Some((_, shards)) => shards.push(i),
                None => subs.push((sub.sub_id, vec![i])),
            }
            let key = (host, sub.sub_id);
            match at.get(&key) {
                Some(&j) => {
                    let first = &mut merged[j].1;
                    first.newest_due_at = first.newest_due_at.max(sub.newest_due_at);
                }
                None => {
                    at.insert(key.clone(), merged.len());
                    merged.push((key.0, sub));
                }
            }
        }
        *self.due.lock().unwrap_or_else(|p| p.into_inner()) = from;
        Ok(group_due_by_host(merged, limit))
    }

    async fn claim_due(&self, req: &ClaimRequest) -> Result<Vec<ClaimedDelivery>> {
        Ok(self
            .claim_many(std::slice::from_ref(req))
            .await?
            .pop()
            .unwrap_or_default())
    }

    async fn claim_many(&self, reqs: &[ClaimRequest]) -> Result<Vec<Vec<ClaimedDelivery>>> {
        let topo = self.topology();
        let route: Vec<usize> = {
            let due = self.due.lock().unwrap_or_else(|p| p.into_inner());
            reqs.iter()
                .map(|r| {
                    let subs = due.get(&r.destination);
                    let listed = match &r.subscription {
                        Some(sub) => subs
                            .and_then(|v| v.iter().find(|(id, _)| id == sub))
                            .and_then(|(_, shards)| shards.first()),
                        None => subs
                            .and_then(|v| v.first())
                            .and_then(|(_, shards)| shards.first()),
                    };
                    match (listed, &r.subscription) {
                        (Some(&s), _) if s < topo.shards.len() => s,
                        (_, Some(sub)) => topo.place(&r.destination, sub),
                        (_, None) => {
                            shard_of(PlacementKey::Host(&r.destination), topo.shards.len())
                        }
                    }
                })
                .collect()
        };
        let mut per_shard: Vec<(Vec<usize>, Vec<ClaimRequest>)> =
            vec![(Vec::new(), Vec::new()); topo.shards.len()];
        for (i, (req, &s)) in reqs.iter().zip(&route).enumerate() {
            per_shard[s].0.push(i);
            per_shard[s].1.push(req.clone());
        }
        let claimed = join_all(topo.shards.iter().zip(&per_shard).map(
            |(shard, (_, reqs))| async move {
                match reqs.is_empty() {
                    true => Ok(Vec::new()),
                    false => shard.store.claim_many(reqs).await,
                }
            },
        ))
        .await;
        let mut out: Vec<Vec<ClaimedDelivery>> = vec![Vec::new(); reqs.len()];
        let mut errors = Vec::new();
        let mut asked = 0;
        let mut leases = Vec::new();
        for (s, (result, (indices, reqs))) in claimed.into_iter().zip(per_shard).enumerate() {
            if reqs.is_empty() {
                continue;
            }
            asked += 1;
            match result {
                Ok(lists) => {
                    for (i, list) in indices.into_iter().zip(lists) {
                        leases.extend(list.iter().map(|c| (c.lease.delivery_id, s)));
                        out[i] = list;
                    }
                }
                Err(e) => {
                    tracing::warn!(shard = s, error = %e, "a shard's claims failed; its destinations wait for the next pass");
                    errors.push(e);
                }
            }
        }
        if asked > 0 && errors.len() == asked {
            return Err(all_failed("claims", errors));
        }
        self.leases_lock().extend(leases);
        Ok(out)
    }

    async fn record_attempt(&self, record: AttemptRecord) -> Result<RecordOutcome> {
        self.record_attempts(vec![record])
            .await?
            .pop()
            .ok_or_else(|| StoreError::Corrupt("no outcome for the record".into()))
    }

    async fn record_attempts(&self, records: Vec<AttemptRecord>) -> Result<Vec<RecordOutcome>> {
        let ids: Vec<DeliveryId> = records.iter().map(|r| r.lease.delivery_id).collect();
        let routes = self.shards_of(&ids).await?;
        let mut per_shard: BTreeMap<usize, (Vec<usize>, Vec<AttemptRecord>)> = BTreeMap::new();
        for (i, (record, s)) in records.iter().zip(routes).enumerate() {
            let entry = per_shard.entry(s).or_default();
            entry.0.push(i);
            entry.1.push(record.clone());
        }
        let mut out = vec![RecordOutcome::LeaseLost; records.len()];
        let results = join_all(
            per_shard
                .into_iter()
                .map(|(s, (indices, records))| async move {
                    let shard = self.shard(s)?;
                    Ok::<_, StoreError>((indices, shard.record_attempts(records).await?))
                }),
        )
        .await;
        for result in results {
            let (indices, outcomes) = result?;
            for (i, outcome) in indices.into_iter().zip(outcomes) {
                out[i] = outcome;
            }
        }
        let mut leases = self.leases_lock();
        for record in &records {
            leases.remove(&record.lease.delivery_id);
        }
        Ok(out)
    }

    async fn renew_lease(&self, lease: &Lease, lease_for: Duration) -> Result<bool> {
        let s = self.shard_of_delivery(&lease.delivery_id).await?;
        self.shard(s)?.renew_lease(lease, lease_for).await
    }

    async fn release(&self, leases: &[Lease]) -> Result<u64> {
        let mut per_shard: BTreeMap<usize, Vec<Lease>> = BTreeMap::new();
        let known: Vec<Option<usize>> = {
            let held = self.leases_lock();
            leases
                .iter()
                .map(|l| held.get(&l.delivery_id).copied())
                .collect()
        };
        for (lease, known) in leases.iter().zip(known) {
            let shard = match known {
                Some(s) => s,
                None => match self.find_delivery(&lease.delivery_id).await {
                    Ok(s) => s,
                    // Gone: nothing to give back.
                    Err(StoreError::NotFound) => continue,
                    Err(e) => return Err(e),
                },
            };
            per_shard.entry(shard).or_default().push(*lease);
        }
        let mut released = 0;
        for (s, leases) in per_shard {
            released += self.shard(s)?.release(&leases).await?;
        }
        let mut held = self.leases_lock();
        for lease in leases {
            held.remove(&lease.delivery_id);
        }
        Ok(released)
    }

    async fn reclaim_expired(&self) -> Result<u64> {
        let all = answered(
            "reclaim",
            self.on_shards(|s| async move { s.reclaim_expired().await })
                .await,
        )?;
        Ok(all.into_iter().sum())
    }

    async fn replay_delivery(&self, id: &DeliveryId) -> Result<Delivery> {
        let s = self.shard_of_delivery(id).await?;
        self.shard(s)?.replay_delivery(id).await
    }

    // --- reading ------------------------------------------------------------

    async fn get_delivery(&self, id: &DeliveryId) -> Result<DeliveryDetail> {
        let s = self.shard_of_delivery(id).await?;
        self.shard(s)?.get_delivery(id).await
    }

    async fn list_deliveries(&self, query: &DeliveryQuery) -> Result<Vec<DeliveryDetail>> {
        let lists = all(self
            .on_shards(|s| async move { s.list_deliveries(query).await })
            .await)?;
        let mut merged: Vec<DeliveryDetail> = lists.into_iter().flatten().collect();
        merged.sort_by(|a, b| b.delivery.id.as_uuid().cmp(a.delivery.id.as_uuid()));
        merged.truncate(query.limit as usize);
        Ok(merged)
    }

    async fn subscription_health(
        &self,
        sub_id: &SubscriptionId,
        since: Timestamp,
    ) -> Result<SubscriptionHealth> {
        let mut health = self.control.subscription_health(sub_id, since).await?;
        let topo = self.topology();
        let parts = join_all(topo.others().map(|s| s.subscription_health(sub_id, since))).await;
        for part in parts {
            add_health(&mut health, part?);
        }
        Ok(health)
    }

    // --- bulk replay jobs ---------------------------------------------------

    async fn create_replay_job(&self, new: NewReplayJob) -> Result<ReplayJob> {
        self.control.get_subscription(&new.sub_id).await?;
        let parts = all(self
            .on_shards(|s| {
                let new = new.clone();
                async move { s.create_replay_job(new).await }
            })
            .await)?;
        merge_jobs(parts).ok_or(StoreError::NotFound)
    }

    async fn get_replay_job(&self, id: &JobId) -> Result<ReplayJob> {
        let parts = self
            .on_shards(|s| async move { s.get_replay_job(id).await })
            .await;
        merge_jobs(found(parts)?).ok_or(StoreError::NotFound)
    }

    async fn cancel_replay_job(&self, id: &JobId) -> Result<ReplayJob> {
        let parts = self
            .on_shards(|s| async move { s.cancel_replay_job(id).await })
            .await;
        merge_jobs(found(parts)?).ok_or(StoreError::NotFound)
    }

    async fn running_replay_jobs(&self, limit: u32) -> Result<Vec<ReplayJob>> {
        let lists = answered(
            "running jobs",
            self.on_shards(|s| async move { s.running_replay_jobs(limit).await })
                .await,
        )?;
        let mut ids: Vec<(Timestamp, JobId)> = Vec::new();
        for job in lists.into_iter().flatten() {
            if !ids.iter().any(|(_, id)| *id == job.id) {
                ids.push((job.created_at, job.id));
            }
        }
        ids.sort();
        ids.truncate(limit as usize);
        let mut jobs = Vec::with_capacity(ids.len());
        for (_, id) in ids {
            jobs.push(self.get_replay_job(&id).await?);
        }
        Ok(jobs)
    }

    async fn step_replay_job(&self, id: &JobId, window: u32) -> Result<JobStep> {
        // The window is the job's across every shard: first settle every
        // part, then hand what is left of the window to the parts in turn
        // (a shard's own window counts its own re-queued items).
        let topo = self.topology();
        let mut parts: Vec<Option<ReplayJob>> = Vec::with_capacity(topo.shards.len());
        for shard in &topo.shards {
            parts.push(match shard.store.step_replay_job(id, 0).await {
                Ok(step) => Some(step.job),
                Err(StoreError::NotFound) => None,
                Err(e) => return Err(e),
            });
        }
        let in_window: u64 = parts.iter().flatten().map(|j| j.requeued).sum();
        let mut left = u64::from(window).saturating_sub(in_window);
        let mut requeued = 0;
        for (shard, part) in topo.shards.iter().zip(parts.iter_mut()) {
            let Some(job) = part else { continue };
            if left == 0 || job.state != JobState::Running {
                continue;
            }
            let own = u32::try_from(job.requeued + left).unwrap_or(u32::MAX);
            let step = shard.store.step_replay_job(id, own).await?;
            left = left.saturating_sub(u64::from(step.requeued));
            requeued += step.requeued;
            *part = Some(step.job);
        }
        let job = merge_jobs(parts.into_iter().flatten().collect()).ok_or(StoreError::NotFound)?;
        Ok(JobStep { job, requeued })
    }

    // --- signals ------------------------------------------------------------

    async fn raise_signal(
        &self,
        sub_id: &SubscriptionId,
        kind: SignalKind,
        detail: &str,
        notice: Option<Notice>,
    ) -> Result<bool> {
        let event = notice.as_ref().map(|n| n.event.id);
        let raised = self
            .control
            .raise_signal(sub_id, kind, detail, notice)
            .await?;
        if raised {
            if let Some(id) = event {
                // Its deliveries now, not at the next sweep.
                if let Err(e) = self.drain(Some(&[id])).await {
                    tracing::warn!(error = %e, "the notice's deliveries wait for the sweeper");
                }
            }
            if kind == SignalKind::Disabled {
                let sub = self.control.get_subscription(sub_id).await?;
                if sub.state == SubscriptionState::Disabled {
                    self.mirror(&sub).await?;
                }
            }
        }
        Ok(raised)
    }

    async fn lower_signal(&self, sub_id: &SubscriptionId, kind: SignalKind) -> Result<bool> {
        self.control.lower_signal(sub_id, kind).await
    }

    async fn raised_signals(&self, kind: Option<SignalKind>) -> Result<Vec<RaisedSignal>> {
        self.control.raised_signals(kind).await
    }

    async fn backlogs(&self) -> Result<Vec<Backlog>> {
        let lists = all(self
            .on_databases(|s| async move { s.backlogs().await })
            .await)?;
        let mut sum: BTreeMap<SubscriptionId, u64> = BTreeMap::new();
        for b in lists.into_iter().flatten() {
            *sum.entry(b.sub_id).or_default() += b.unfinished;
        }
        Ok(sum
            .into_iter()
            .map(|(sub_id, unfinished)| Backlog { sub_id, unfinished })
            .collect())
    }

    async fn failing_subscriptions(
        &self,
        started_at_or_before: Timestamp,
    ) -> Result<Vec<SubscriptionId>> {
        let lists = all(self
            .on_databases(|s| async move { s.failing_subscriptions(started_at_or_before).await })
            .await)?;
        let mut subs: Vec<SubscriptionId> = lists.into_iter().flatten().collect();
        subs.sort_by_key(|s| *s.as_uuid());
        subs.dedup();
        Ok(subs)
    }

    // --- retention and the rollup -------------------------------------------

    async fn enforce_retention(&self, policy: &RetentionPolicy) -> Result<RetentionReport> {
        let topo = self.topology();
        // Each database's deliveries, attempts and partitions; a shard's
        // event copies go with its last delivery (not counted: the events
        // are the control database's). The control database's events go
        // after, once no shard holds a copy.
        let control = self.control.clone();
        let parts = join_all(
            std::iter::once((control, true))
                .chain(topo.others().map(|s| (s.clone(), false)))
                .map(|(db, is_control)| async move {
                    let mut report =
                        crate::retention::enforce_with(&db, policy, !is_control).await?;
                    if !is_control {
                        report.events = 0;
                    }
                    outbox::forget_parts(&db, policy.events_before).await?;
                    Ok::<_, StoreError>(report)
                }),
        )
        .await;
        let mut report = all(parts)?
            .into_iter()
            .fold(RetentionReport::default(), |a, b| RetentionReport {
                deliveries: a.deliveries + b.deliveries,
                attempts: a.attempts + b.attempts,
                events: a.events + b.events,
                partitions_dropped: a.partitions_dropped + b.partitions_dropped,
                more: a.more || b.more,
            });
        let batch = i64::from(policy.batch.max(1));
        let candidates =
            crate::retention::unneeded_events(&self.control, policy.events_before, batch).await?;
        if !candidates.is_empty() {
            let mut held = HashSet::new();
            for shard in topo.others() {
                held.extend(crate::retention::events_held(shard, &candidates).await?);
            }
            let gone: Vec<uuid::Uuid> = candidates
                .iter()
                .filter(|id| !held.contains(id))
                .copied()
                .collect();
            if !gone.is_empty() {
                report.events += crate::retention::delete_events_in(&self.control, &gone).await?;
            }
            if candidates.len() as i64 >= batch {
                report.more = true;
            }
        }
        Ok(report)
    }

    async fn daily_stats(
        &self,
        sub_id: &SubscriptionId,
        since_day: chrono::NaiveDate,
    ) -> Result<Vec<DailyStats>> {
        let lists = all(self
            .on_databases(|s| async move { s.daily_stats(sub_id, since_day).await })
            .await)?;
        let mut days: BTreeMap<chrono::NaiveDate, DailyStats> = BTreeMap::new();
        for stats in lists.into_iter().flatten() {
            match days.get_mut(&stats.day) {
                None => {
                    days.insert(stats.day, stats);
                }
                Some(sum) => {
                    sum.attempts += stats.attempts;
                    sum.delivered += stats.delivered;
                    sum.failed += stats.failed;
                    sum.dead += stats.dead;
                    let mut latency: BTreeMap<u64, u64> = sum.latency_ms.iter().copied().collect();
                    for (ms, n) in stats.latency_ms {
                        *latency.entry(ms).or_default() += n;
                    }
                    sum.latency_ms = latency.into_iter().collect();
                }
            }
        }
        Ok(days.into_values().collect())
    }

    // --- tokens and nodes: the control database -----------------------------

    async fn create_token(&self, token: NewToken) -> Result<()> {
        self.control.create_token(token).await
    }

    async fn find_token(&self, token_hash: &[u8]) -> Result<Option<FoundToken>> {
        self.control.find_token(token_hash).await
    }

    async fn has_admin_token(&self) -> Result<bool> {
        self.control.has_admin_token().await
    }

    async fn heartbeat(&self, node: &NodeHeartbeat, live_within: Duration) -> Result<u32> {
        self.control.heartbeat(node, live_within).await
    }

    async fn forget_node(&self, node_id: &str) -> Result<bool> {
        self.control.forget_node(node_id).await
    }

    async fn nodes(&self) -> Result<Vec<NodeInfo>> {
        self.control.nodes().await
    }
}
