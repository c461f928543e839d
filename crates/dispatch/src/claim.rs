//! The claim loop: find destinations with due work, claim what admission
//! allows, and run each attempt as a tracked task.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use hookd_domain::isolation::{AttemptOutcome, CircuitTransition, OutcomeKind};
use hookd_domain::{Clock, Timestamp};
use hookd_store::{
    ClaimOrder, ClaimRequest, ClaimedDelivery, Lease, RecordOutcome, Store, StoreError,
};
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::admission::{Admission, AttemptPermit};
use crate::record::decide;
use crate::recorder::Recorder;
use crate::send::Sender;
use crate::{DispatchConfig, Observer, StoreObserver};

/// Most destinations looked at in one pass.
const DESTINATIONS_PER_PASS: u32 = 512;

/// Attempts waiting on their record, per global slot: an attempt gives its
/// global slot back once it holds one of these, so up to
/// `max_in_flight × RECORDS_PER_SLOT` answered attempts wait on the store
/// while `max_in_flight` more are at destinations. A waiting record holds
/// the attempt's outcome and the subscription, not the payload.
const RECORDS_PER_SLOT: usize = 4;

/// How many deliveries may wait in memory, claimed ahead of a free slot
/// (§9.1), per global slot (`max_in_flight`), across all destinations. They
/// hold their payloads, as attempts in flight do.
const WAITING_PER_SLOT: usize = 1;

/// The dispatcher. Cheap to clone; clones share state.
#[derive(Debug, Clone)]
pub struct Dispatcher {
    inner: Arc<Inner>,
}

#[derive(Debug)]
pub(crate) struct Inner {
    pub(crate) store: Arc<dyn Store>,
    sender: Sender,
    admission: Arc<Admission>,
    pub(crate) config: DispatchConfig,
    clock: Arc<dyn Clock>,
    /// Bounds attempts in flight in this process: claimed, at their
    /// destination, or answered and waiting for a record slot.
    pub(crate) global: Arc<Semaphore>,
    /// Bounds answered attempts waiting on their record, so a slow store
    /// holds the claim loop back instead of piling up records.
    recording: Semaphore,
    /// Nudged by ingest after a commit, so new work starts without waiting
    /// for the poll interval.
    wake: Arc<Notify>,
    /// Nudged whenever an attempt ends and frees capacity.
    slot_freed: Notify,
    /// Told about finished attempts and 410s; set once by the binary.
    observer: std::sync::OnceLock<Arc<dyn Observer>>,
    /// The run in progress, for deliveries claimed at ingest; empty while
    /// none runs (before `run`, after claiming stopped, `dispatch_once`).
    current: Mutex<Weak<Run>>,
}

impl Inner {
    fn observer(&self) -> Arc<dyn Observer> {
        self.observer
            .get_or_init(|| Arc::new(StoreObserver::new(self.store.clone())))
            .clone()
    }
}

/// Why the dispatcher could not be built.
#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    /// The configuration breaks an invariant.
    #[error("invalid dispatcher configuration: {0}")]
    Config(String),
    /// The HTTP client could not be built.
    #[error("could not build the HTTP client")]
    Http(#[source] crate::send::SenderError),
}

/// What the attempt tasks of one run share: where they are tracked, how they
/// are cut off, where the leases of cut-off ones go, the recorder, and the
/// deliveries claimed ahead that wait for their destination's next slot.
struct Run {
    tracker: TaskTracker,
    hard_stop: CancellationToken,
    /// Cancelled when claiming stops: nothing waiting starts after that.
    stopping: CancellationToken,
    unfinished: Mutex<Vec<Lease>>,
    recorder: Recorder,
    waiting: Mutex<Waiting>,
    /// Claim at most this many ahead in all (0: never; `dispatch_once`).
    max_waiting: usize,
    /// A delivery that waited this long goes back to the store unsent: it
    /// must start well within its lease (see [`max_wait`]).
    max_wait: Duration,
    /// The hosts the last pass found a backlog at: no delivery to them is
    /// claimed at ingest, so new work never passes a backlog (R4's floor is
    /// the claim loop's to give).
    listed: Mutex<Listed>,
    /// Whether the last pass found due work in the store: only then can a
    /// freed slot let the claim loop start more, so only then does a
    /// finishing attempt wake it. Work that arrives later wakes it through
    /// ingest's wake, or becomes due by time (the poll).
    due_work: std::sync::atomic::AtomicBool,
}

/// The hosts the last claim pass listed with a backlog.
#[derive(Default)]
struct Listed {
    backlogged: HashSet<String>,
    /// The listing was cut at its limit: any host may have a backlog.
    all: bool,
}

/// Deliveries claimed ahead of a free slot (§9.1), by destination host, each
/// queue in claim order.
#[derive(Default)]
struct Waiting {
    by_host: HashMap<String, VecDeque<Ready>>,
    total: usize,
    /// Room held for deliveries being claimed at ingest, by host, until
    /// their commit hands them over (or fails).
    reserved: HashMap<String, u32>,
    reserved_total: usize,
}

/// One delivery claimed ahead.
struct Ready {
    claimed: ClaimedDelivery,
    order: ClaimOrder,
    since: tokio::time::Instant,
}

/// How long a delivery claimed ahead may wait for a slot. It was claimed
/// with `lease`; once started it runs for up to `attempt_timeout` and first
/// renews after `renew_every`, so it must start within their difference.
/// Half of that leaves room for a slow store and clock drift; 15 s with the
/// design's values (lease 90 s, timeout 30 s, renewal every 30 s).
fn max_wait(cfg: &DispatchConfig) -> Duration {
    cfg.lease
        .saturating_sub(cfg.attempt_timeout)
        .saturating_sub(cfg.renew_every)
        / 2
}

impl Waiting {
    fn waiting_at(&self, host: &str) -> u32 {
        let queued = self.by_host.get(host).map_or(0, VecDeque::len);
        u32::try_from(queued)
            .unwrap_or(u32::MAX)
            .saturating_add(self.reserved.get(host).copied().unwrap_or(0))
    }

    fn room(&self, max_waiting: usize) -> u32 {
        let held = self.total + self.reserved_total;
        u32::try_from(max_waiting.saturating_sub(held)).unwrap_or(u32::MAX)
    }

    /// Lets go of `n` reserved for `host`.
    fn unreserve(&mut self, host: &str, n: u32) {
        if let Some(r) = self.reserved.get_mut(host) {
            let n = n.min(*r);
            *r -= n;
            self.reserved_total = self.reserved_total.saturating_sub(n as usize);
            if *r == 0 {
                self.reserved.remove(host);
            }
        }
    }
}

impl Run {
    fn new(
        inner: &Arc<Inner>,
        stopping: CancellationToken,
        ahead: bool,
    ) -> (Arc<Self>, tokio::task::JoinHandle<()>) {
        let hard_stop = CancellationToken::new();
        let (recorder, recording) = Recorder::start(inner.clone(), hard_stop.clone());
        let max_wait = max_wait(&inner.config);
        let max_waiting = if ahead && !max_wait.is_zero() {
            inner.config.max_in_flight.saturating_mul(WAITING_PER_SLOT)
        } else {
            0
        };
        let run = Arc::new(Self {
            tracker: TaskTracker::new(),
            hard_stop,
            stopping,
            unfinished: Mutex::new(Vec::new()),
            recorder,
            waiting: Mutex::new(Waiting::default()),
            max_waiting,
            max_wait,
            listed: Mutex::new(Listed::default()),
            due_work: std::sync::atomic::AtomicBool::new(true),
        });
        (run, recording)
    }

    /// Deliveries waiting for `host`, and room held for it at ingest.
    fn waiting_at(&self, host: &str) -> u32 {
        let w = self.waiting.lock().unwrap();
        w.waiting_at(host)
    }

    /// Room left to claim ahead, across all destinations.
    fn room(&self) -> u32 {
        let w = self.waiting.lock().unwrap();
        w.room(self.max_waiting)
    }

    /// Notes the hosts a pass found a backlog at (in `due`, cut at its
    /// limit when `cut`).
    fn set_listed(&self, inner: &Inner, due: &[hookd_store::DueDestination], cut: bool) {
        let mut l = self.listed.lock().unwrap();
        l.backlogged.clear();
        l.backlogged.extend(
            due.iter()
                .filter(|d| inner.admission.has_backlog(d))
                .map(|d| d.host.clone()),
        );
        l.all = cut;
    }

    /// Holds room for up to `n` new deliveries to `host` being claimed at
    /// ingest, and returns how many: none while the host has a backlog in
    /// the store (or may have), while claiming stops, or beyond what
    /// admission lets it start now and the room to wait allows. Young due
    /// work at the host may be passed: among young deliveries the order is
    /// first come first served only loosely anyway (several claims per
    /// pass), and once it is older than the backlog age the host is
    /// listed with a backlog and nothing passes it.
    fn reserve(&self, inner: &Inner, host: &str, n: u32) -> u32 {
        if n == 0 || self.max_waiting == 0 || self.stopping.is_cancelled() {
            return 0;
        }
        {
            let l = self.listed.lock().unwrap();
            if l.all || l.backlogged.contains(host) {
                return 0;
            }
        }
        let admitted = inner.admission.ingest_room(host);
        let mut w = self.waiting.lock().unwrap();
        let here = admitted.saturating_sub(w.waiting_at(host));
        let granted = n.min(here).min(w.room(self.max_waiting));
        if granted > 0 {
            *w.reserved.entry(host.to_owned()).or_default() += granted;
            w.reserved_total += granted as usize;
        }
        granted
    }

    fn push_waiting(&self, host: &str, claimed: ClaimedDelivery, order: ClaimOrder) {
        let mut w = self.waiting.lock().unwrap();
        w.by_host
            .entry(host.to_owned())
            .or_default()
            .push_back(Ready {
                claimed,
                order,
                since: tokio::time::Instant::now(),
            });
        w.total += 1;
        metrics::gauge!("hookd_claimed_ahead").set(w.total as f64);
    }

    /// Hosts with deliveries waiting.
    fn waiting_hosts(&self) -> Vec<String> {
        self.waiting
            .lock()
            .unwrap()
            .by_host
            .keys()
            .cloned()
            .collect()
    }

    /// Every waiting delivery's lease, the queues emptied (at the end of a
    /// run: they go back to the store).
    fn take_waiting(&self) -> Vec<Lease> {
        let mut w = self.waiting.lock().unwrap();
        w.total = 0;
        metrics::gauge!("hookd_claimed_ahead").set(0.0);
        w.by_host
            .drain()
            .flat_map(|(_, q)| q.into_iter().map(|r| r.claimed.lease))
            .collect()
    }

    /// Starts what waits for `host` while admission and the global limit
    /// let it, oldest claim first. Returns the leases to give back: those
    /// that waited too long, and all of them once the destination is no
    /// longer [`healthy`](hookd_domain::isolation::DestinationAdmission::healthy).
    /// Takes no store round trip; the caller releases.
    fn pump(self: &Arc<Self>, inner: &Arc<Inner>, host: &str) -> Vec<Lease> {
        let mut back = Vec::new();
        let mut started = 0usize;
        let mut w = self.waiting.lock().unwrap();
        let Some(q) = w.by_host.get_mut(host) else {
            return back;
        };
        // A destination that just failed gets its next attempt at the claim
        // loop's pace, not the instant its slot frees. Asked once: starting
        // attempts records no failure.
        if !inner.admission.may_wait(host) {
            back.extend(q.drain(..).map(|r| r.claimed.lease));
        }
        while let Some(front) = q.front() {
            if front.since.elapsed() > self.max_wait {
                back.push(q.pop_front().expect("front exists").claimed.lease);
                continue;
            }
            if self.stopping.is_cancelled() {
                break;
            }
            let Some(permit) =
                inner
                    .admission
                    .start(host, front.claimed.delivery.sub_id, front.order)
            else {
                break;
            };
            // Dropping the permit unstarted gives its slot back.
            let Ok(global) = inner.global.clone().try_acquire_owned() else {
                break;
            };
            let ready = q.pop_front().expect("front exists");
            started += 1;
            self.spawn(
                inner,
                Job {
                    claimed: ready.claimed,
                    permit,
                    global,
                },
            );
        }
        let emptied = q.is_empty();
        if emptied {
            w.by_host.remove(host);
        }
        w.total = w.total.saturating_sub(started + back.len());
        metrics::gauge!("hookd_claimed_ahead").set(w.total as f64);
        back
    }

    fn spawn(self: &Arc<Self>, inner: &Arc<Inner>, job: Job) {
        // Boxed: the attempt's future is about 5 KiB, and tokio moves a task's
        // future by value as it spawns it, stores it and drops it (three
        // copies or more). A profile of `fanout` on PostgreSQL put those
        // copies at about 4 % of hookd's samples; boxed, each is a pointer.
        self.tracker
            .spawn(Box::pin(attempt(inner.clone(), job, self.clone())));
    }
}

/// A weak handle on a [`Dispatcher`]'s queues, for ingest
/// ([`Dispatcher::ingest_queue`]). Once the dispatcher is gone it reserves
/// nothing, and what is handed over waits for its lease to expire.
#[derive(Debug, Clone)]
pub struct IngestQueue {
    inner: Weak<Inner>,
}

impl IngestQueue {
    /// [`Dispatcher::reserve_at_ingest`], or 0 once the dispatcher is gone.
    pub fn reserve(&self, host: &str, n: u32) -> u32 {
        self.inner
            .upgrade()
            .map_or(0, |inner| Dispatcher { inner }.reserve_at_ingest(host, n))
    }

    /// [`Dispatcher::hand_over`], if the dispatcher is still there.
    pub fn hand_over(&self, reserved: &[(String, u32)], claimed: Vec<ClaimedDelivery>) {
        if let Some(inner) = self.inner.upgrade() {
            Dispatcher { inner }.hand_over(reserved, claimed);
        }
    }
}

/// Gives leases back to the store, logging a failure (their leases expire
/// anyway; releasing only makes them claimable sooner).
async fn give_back(inner: &Inner, leases: &[Lease]) {
    if leases.is_empty() {
        return;
    }
    if let Err(e) = inner.store.release(leases).await {
        tracing::warn!(count = leases.len(), error = %error_chain(&e), "releasing deliveries claimed ahead failed");
    }
}

/// Work handed to one attempt task.
struct Job {
    claimed: ClaimedDelivery,
    permit: AttemptPermit,
    global: OwnedSemaphorePermit,
}

/// What one claim pass did.
#[derive(Debug, Clone, Copy, Default)]
struct Pass {
    /// Attempts started.
    started: usize,
    /// Deliveries claimed ahead, left waiting for a slot.
    queued: usize,
    /// The earliest time a destination that admitted nothing could admit
    /// more (a token, the end of an open period).
    next_check: Option<Timestamp>,
}

impl Dispatcher {
    /// Builds a dispatcher over `store`. `wake` is shared with ingest.
    pub fn new(
        store: Arc<dyn Store>,
        config: DispatchConfig,
        clock: Arc<dyn Clock>,
        wake: Arc<Notify>,
    ) -> Result<Self, BuildError> {
        config.validate().map_err(BuildError::Config)?;
        let sender = Sender::for_dispatch(&config).map_err(BuildError::Http)?;
        Ok(Self {
            inner: Arc::new(Inner {
                store,
                sender,
                admission: Admission::new(
                    config.admission.clone(),
                    config.backlog_age,
                    clock.clone(),
                ),
                global: Arc::new(Semaphore::new(config.max_in_flight)),
                recording: Semaphore::new(config.max_in_flight.saturating_mul(RECORDS_PER_SLOT)),
                config,
                clock,
                wake,
                slot_freed: Notify::new(),
                observer: std::sync::OnceLock::new(),
                current: Mutex::new(Weak::new()),
            }),
        })
    }

    /// Installs the [`Observer`] (before [`run`](Self::run); the first one
    /// set, or the plain [`StoreObserver`] if none is, stays).
    pub fn set_observer(&self, observer: Arc<dyn Observer>) {
        let _ = self.inner.observer.set(observer);
    }

    /// The store this dispatcher works on.
    pub fn store(&self) -> &Arc<dyn Store> {
        &self.inner.store
    }

    /// The notification that makes the dispatcher look for work at once.
    pub fn wake(&self) -> &Arc<Notify> {
        &self.inner.wake
    }

    /// The configuration it runs with.
    pub fn config(&self) -> &DispatchConfig {
        &self.inner.config
    }

    /// Per-destination admission state (for health and metrics).
    pub fn admission(&self) -> &Arc<Admission> {
        &self.inner.admission
    }

    /// A weak handle on this dispatcher's queues for ingest (see
    /// [`reserve_at_ingest`](Self::reserve_at_ingest)): holding it keeps
    /// nothing alive, so the API may hold it while the dispatcher holds the
    /// API's observer.
    pub fn ingest_queue(&self) -> IngestQueue {
        IngestQueue {
            inner: Arc::downgrade(&self.inner),
        }
    }

    /// Holds room for `n` new deliveries to `host` that ingest is about to
    /// create already claimed ([`Store::accept_events_claiming`]), and
    /// returns for how many: while this dispatcher
    /// runs and claims ahead, for a healthy destination admission has seen,
    /// with no due work in the store, within what it may take now and the
    /// room to wait. Every reservation must be given back through
    /// [`hand_over`](Self::hand_over), with or without deliveries.
    pub fn reserve_at_ingest(&self, host: &str, n: u32) -> u32 {
        let run = self.inner.current.lock().unwrap().upgrade();
        run.map_or(0, |run| run.reserve(&self.inner, host, n))
    }

    /// Takes deliveries claimed at ingest and lets go of the `reserved`
    /// room (host, count) they were claimed under: each starts as soon as
    /// admission lets it (most at once) or waits in memory like a delivery
    /// claimed ahead. If claiming has stopped meanwhile they go back to the
    /// store (`release`); their leases would expire anyway.
    pub fn hand_over(&self, reserved: &[(String, u32)], claimed: Vec<ClaimedDelivery>) {
        let inner = &self.inner;
        let run = inner.current.lock().unwrap().upgrade();
        let Some(run) = run.filter(|r| !r.stopping.is_cancelled()) else {
            let leases: Vec<Lease> = claimed.iter().map(|c| c.lease).collect();
            if !leases.is_empty() {
                let inner = inner.clone();
                tokio::spawn(async move { give_back(&inner, &leases).await });
            }
            return;
        };
        let mut hosts: Vec<String> = Vec::with_capacity(reserved.len());
        {
            let mut w = run.waiting.lock().unwrap();
            for (host, n) in reserved {
                w.unreserve(host, *n);
            }
            let since = tokio::time::Instant::now();
            for c in claimed {
                let host = c.delivery.destination_host.clone();
                if !hosts.contains(&host) {
                    hosts.push(host.clone());
                }
                w.by_host.entry(host).or_default().push_back(Ready {
                    claimed: c,
                    order: ClaimOrder::OldestFirst,
                    since,
                });
                w.total += 1;
            }
            metrics::gauge!("hookd_claimed_ahead").set(w.total as f64);
        }
        let mut back = Vec::new();
        for host in &hosts {
            back.append(&mut run.pump(inner, host));
        }
        if !back.is_empty() {
            let inner = inner.clone();
            run.tracker
                .spawn(async move { give_back(&inner, &back).await });
        }
    }

    /// Runs until `shutdown` is cancelled: then stops claiming at once, lets
    /// in-flight attempts finish within the grace period, cuts off the rest
    /// and releases their deliveries (their leases would expire anyway; this
    /// only makes them claimable sooner).
    pub async fn run(self, shutdown: CancellationToken) -> Result<(), StoreError> {
        let (run, recording) = Run::new(&self.inner, shutdown.clone(), true);
        *self.inner.current.lock().unwrap() = Arc::downgrade(&run);
        let cfg = &self.inner.config;
        let mut next_reclaim = tokio::time::Instant::now();
        let mut backoff = Duration::ZERO;
        tracing::info!(worker_id = %cfg.worker_id, "dispatcher started");

        while !shutdown.is_cancelled() {
            if tokio::time::Instant::now() >= next_reclaim {
                match self.inner.store.reclaim_expired().await {
                    Ok(0) => {}
                    Ok(n) => tracing::info!(count = n, "reclaimed deliveries whose lease expired"),
                    Err(e) => {
                        tracing::warn!(error = %error_chain(&e), "reclaiming expired leases failed")
                    }
                }
                next_reclaim = tokio::time::Instant::now() + cfg.reclaim_every;
            }
            match self.claim_pass(&run).await {
                Ok(Pass {
                    started: 0,
                    queued: 0,
                    next_check,
                }) => {
                    backoff = Duration::ZERO;
                    // Nothing could start: wait for new work, a freed slot,
                    // the earliest destination that will admit more, or the
                    // poll interval (work that became due by time alone).
                    let until_check = next_check
                        .and_then(|t| (t - self.inner.clock.now()).to_std().ok())
                        .map_or(cfg.poll_interval, |d| {
                            d.clamp(Duration::from_millis(1), cfg.poll_interval)
                        });
                    tokio::select! {
                        _ = shutdown.cancelled() => {}
                        _ = self.inner.wake.notified() => {}
                        _ = self.inner.slot_freed.notified() => {}
                        _ = tokio::time::sleep(until_check) => {}
                    }
                }
                Ok(_) => backoff = Duration::ZERO,
                Err(e) => {
                    // The store is away: back off (with a ceiling) instead of
                    // spinning, and try again by ourselves.
                    backoff =
                        (backoff * 2).clamp(Duration::from_millis(100), Duration::from_secs(2));
                    tracing::warn!(error = %error_chain(&e), retry_in = ?backoff, "claiming failed");
                    tokio::select! {
                        _ = shutdown.cancelled() => {}
                        _ = tokio::time::sleep(backoff) => {}
                    }
                }
            }
        }

        *self.inner.current.lock().unwrap() = Weak::new();
        run.tracker.close();
        tracing::info!(
            in_flight = run.tracker.len(),
            "dispatcher stopping: no new claims"
        );
        if tokio::time::timeout(cfg.shutdown_grace, run.tracker.wait())
            .await
            .is_err()
        {
            tracing::warn!(
                in_flight = run.tracker.len(),
                "shutdown grace over: cutting off attempts"
            );
            run.hard_stop.cancel();
            run.tracker.wait().await;
        }
        // Every attempt has its record's outcome (or was cut off): flush
        // what the recorder still holds before giving leases back. The
        // tasks are done, so this is the last reference to the run.
        let mut leases = run.take_waiting();
        leases.append(&mut run.unfinished.lock().unwrap());
        drop(run);
        if let Err(e) = recording.await {
            tracing::error!(error = %e, "the attempt recorder failed");
        }
        if !leases.is_empty() {
            let n = self.inner.store.release(&leases).await?;
            tracing::info!(count = n, "released unfinished deliveries");
        }
        tracing::info!("dispatcher stopped");
        Ok(())
    }

    /// One pass, run to completion: claims what is due and admitted, makes
    /// every attempt, records them, and returns how many attempts were made.
    /// For tests, which drive passes themselves instead of sleeping.
    pub async fn dispatch_once(&self) -> Result<usize, StoreError> {
        // No claiming ahead: a test's pass makes exactly what admission
        // allows now.
        let (run, recording) = Run::new(&self.inner, CancellationToken::new(), false);
        let pass = self.claim_pass(&run).await;
        run.tracker.close();
        run.tracker.wait().await;
        drop(run);
        let _ = recording.await;
        Ok(pass?.started)
    }

    /// Claims what admission allows and spawns one task per claimed
    /// delivery: for each destination with due work, admission plans how
    /// many deliveries of which subscription to claim, oldest or newest
    /// first; a destination that admits nothing is not claimed from at all.
    ///
    /// Besides the free slots, a busy destination gets deliveries claimed
    /// ahead (§9.1): they wait in memory and start the moment one of its
    /// attempts finishes, so its slots do not sit idle through a claim's
    /// round trip. Each pass first starts what waits, where it now may.
    async fn claim_pass(&self, run: &Arc<Run>) -> Result<Pass, StoreError> {
        let inner = &self.inner;
        let mut pass = Pass::default();
        let mut back = Vec::new();
        for host in run.waiting_hosts() {
            back.append(&mut run.pump(inner, &host));
        }
        give_back(inner, &back).await;
        back.clear();
        let mut room = run.room();
        if inner.global.available_permits() == 0 && room == 0 {
            return Ok(pass);
        }
        let due = inner.store.due_destinations(DESTINATIONS_PER_PASS).await?;
        run.set_listed(inner, &due, due.len() >= DESTINATIONS_PER_PASS as usize);
        run.due_work
            .store(!due.is_empty(), std::sync::atomic::Ordering::Relaxed);
        // Plan every destination first (in memory), then claim for all of
        // them at once: one store call per pass, not one per destination.
        // Each plan sees the global slots (and the room to wait) the plans
        // before it left.
        let mut free = inner.global.available_permits() as u32;
        let mut reqs = Vec::new();
        for destination in &due {
            if free == 0 && room == 0 {
                break;
            }
            let here = run.waiting_at(&destination.host);
            let plan = inner.admission.plan_ahead(destination, free, here, room);
            if let Some(t) = plan.next_check {
                pass.next_check = Some(pass.next_check.map_or(t, |p| p.min(t)));
            }
            for claim in plan.claims {
                let now = claim.limit.min(free);
                free -= now;
                room = room.saturating_sub(claim.limit - now);
                reqs.push(ClaimRequest {
                    worker_id: inner.config.worker_id.clone(),
                    destination: destination.host.clone(),
                    subscription: Some(claim.sub_id),
                    order: claim.order,
                    limit: claim.limit,
                    lease: inner.config.lease,
                });
            }
        }
        if reqs.is_empty() {
            return Ok(pass);
        }
        let claimed = inner.store.claim_many(&reqs).await?;
        for (req, claimed) in reqs.iter().zip(claimed) {
            metrics::histogram!("hookd_claim_batch_size").record(claimed.len() as f64);
            for c in claimed {
                // What cannot start now waits for a slot if this
                // destination may claim ahead; otherwise admission changed
                // since the plan (an attempt that just failed opened the
                // circuit): then the row goes back untouched.
                let permit = inner
                    .admission
                    .start(&req.destination, c.delivery.sub_id, req.order);
                let global = inner.global.clone().try_acquire_owned().ok();
                match permit.zip(global) {
                    Some((permit, global)) => {
                        run.spawn(
                            inner,
                            Job {
                                claimed: c,
                                permit,
                                global,
                            },
                        );
                        pass.started += 1;
                    }
                    None if run.max_waiting > 0 && inner.admission.may_wait(&req.destination) => {
                        run.push_waiting(&req.destination, c, req.order);
                        pass.queued += 1;
                    }
                    None => back.push(c.lease),
                }
            }
        }
        give_back(inner, &back).await;
        Ok(pass)
    }
}

/// One attempt of one delivery, from send to record.
async fn attempt(inner: Arc<Inner>, job: Job, run: Arc<Run>) {
    let lease = job.claimed.lease;
    tokio::select! {
        () = run_attempt(&inner, job, &run) => {}
        // Dropping the permit unfinished cancels it in admission.
        _ = run.hard_stop.cancelled() => run.unfinished.lock().unwrap().push(lease),
    }
}

/// Makes the attempt, tells admission how it went as soon as the
/// destination has answered, and records it.
///
/// The destination's slot (its concurrency cap, the fair share, the
/// breaker's ticket) is given back when the answer is in, not when the
/// record is: the cap bounds requests the destination is serving, and the
/// record is hookd's own bookkeeping. Holding the slot through the record
/// made a host's throughput its cap over the record's latency (20 slots over
/// a ~150 ms batched commit: ~130/s per host, whatever the destination could
/// take). The global slot is given back then too, once the attempt holds a
/// record slot: holding it through the record made the whole process's
/// throughput `max_in_flight` over the record's latency (1,024 over a 200 ms
/// SQLite commit behind ingest: the 5,120/s plateau of `fanout`'s first
/// seconds), and kept every payload alive until its record was in. The
/// record slots are what keeps answered attempts waiting on a slow store
/// bounded. An ordered subscription cannot get ahead of itself: the store
/// refuses its next delivery while this one is still in flight there.
async fn run_attempt(inner: &Arc<Inner>, job: Job, run: &Arc<Run>) {
    let Job {
        claimed,
        permit,
        global,
    } = job;
    let cfg = &inner.config;
    let number = claimed.delivery.attempt + 1;
    fail::fail_point!("dispatch.after_claim");
    let sent = tokio::select! {
        sent = inner.sender.send(&claimed, number, inner.clock.as_ref()) => sent,
        never = renew_while_running(inner, claimed.lease) => match never {},
    };
    let now = inner.clock.now();
    let latency = sent.attempt.duration;
    let decision = decide(
        &claimed,
        claimed.lease,
        sent,
        &cfg.retry,
        now,
        rand::random::<f64>(),
    );
    record_attempt_metrics(&decision);
    let outcome = AttemptOutcome {
        kind: OutcomeKind::from_verdict(decision.verdict),
        latency,
    };
    let transition = permit.finish(outcome);
    if let Some(t) = transition {
        let to = match t {
            CircuitTransition::Opened => "open",
            CircuitTransition::Closed => "closed",
        };
        metrics::counter!("hookd_circuit_transitions_total", "to" => to).increment(1);
    }
    if transition == Some(CircuitTransition::Opened) {
        tracing::warn!(
            destination = %claimed.delivery.destination_host,
            "circuit opened: attempts to this destination pause until a probe succeeds"
        );
    }
    tracing::debug!(
        delivery_id = %claimed.delivery.id,
        destination = %claimed.delivery.destination_host,
        attempt = number,
        status = ?decision.record.attempt.status,
        error_class = ?decision.record.attempt.error_class,
        next = ?decision.record.next,
        "attempt finished"
    );
    // What the rest needs; the event (its payload) goes now.
    let ClaimedDelivery {
        delivery,
        subscription,
        ..
    } = claimed;
    // The semaphore is never closed, so this cannot fail; if it could, the
    // attempt would only keep its global slot until its record is in.
    let recording = inner.recording.acquire().await.ok();
    drop(global);
    // The slot this attempt held goes to what waits for its destination,
    // at once; the claim loop is told too when the store has due work, for
    // every other destination.
    let back = run.pump(inner, &delivery.destination_host);
    if run.due_work.load(std::sync::atomic::Ordering::Relaxed) {
        inner.slot_freed.notify_one();
    }
    give_back(inner, &back).await;
    crash_points_before_record(&decision.record.next);
    let disable = decision.disable_subscription;
    let delivered = matches!(decision.record.next, hookd_store::NextState::Delivered);
    // Recorded with the next batch; this task waits for its own outcome.
    match run.recorder.record(decision.record).await {
        Some(RecordOutcome::Recorded) => {}
        Some(RecordOutcome::LeaseLost) => tracing::warn!(
            delivery_id = %delivery.id,
            "lease lost before the attempt was recorded; the newer claim owns the delivery"
        ),
        None => {}
    }
    drop(recording);
    let observer = inner.observer();
    observer.attempt_finished(&subscription.id, delivered);
    if disable {
        match observer.destination_gone(&subscription).await {
            Ok(()) => {
                tracing::warn!(sub_id = %subscription.id, "destination answered 410 Gone: subscription disabled")
            }
            Err(e) => {
                tracing::error!(sub_id = %subscription.id, error = %error_chain(&e), "could not disable subscription after 410")
            }
        }
    }
}

/// Counts the attempt by its result and error class, and times it.
fn record_attempt_metrics(decision: &crate::record::Decision) {
    let result = match decision.record.next {
        hookd_store::NextState::Delivered => "delivered",
        hookd_store::NextState::Retry { .. } => "retry",
        hookd_store::NextState::Failed => "failed",
        hookd_store::NextState::Dead => "dead",
    };
    let attempt = &decision.record.attempt;
    let class = match (attempt.status, attempt.error_class) {
        (Some(s), _) => match s {
            200..=299 => "2xx",
            300..=399 => "3xx",
            400..=499 => "4xx",
            _ => "5xx",
        },
        (None, Some(c)) => c.as_str(),
        (None, None) => "other",
    };
    metrics::counter!("hookd_attempts_total", "result" => result, "class" => class).increment(1);
    metrics::histogram!("hookd_attempt_duration_seconds").record(attempt.duration.as_secs_f64());
}

/// Renews the lease every `renew_every` for as long as it is polled.
async fn renew_while_running(inner: &Inner, lease: Lease) -> std::convert::Infallible {
    let cfg = &inner.config;
    let mut lost = false;
    loop {
        tokio::time::sleep(cfg.renew_every).await;
        if lost {
            continue;
        }
        match inner.store.renew_lease(&lease, cfg.lease).await {
            Ok(true) => {}
            Ok(false) => {
                lost = true;
                tracing::warn!(delivery_id = %lease.delivery_id, "lease lost while the attempt was running");
            }
            Err(e) => {
                tracing::warn!(delivery_id = %lease.delivery_id, error = %error_chain(&e), "lease renewal failed")
            }
        }
    }
}

/// An error and all its causes, for logs.
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut src = e.source();
    while let Some(cause) = src {
        s.push_str(": ");
        s.push_str(&cause.to_string());
        src = cause.source();
    }
    s
}

/// The crash points between an attempt's result and its record, one per
/// next state (feature `failpoints`; without it this does nothing).
fn crash_points_before_record(next: &hookd_store::NextState) {
    match next {
        hookd_store::NextState::Delivered => fail::fail_point!("dispatch.after_response"),
        hookd_store::NextState::Retry { .. } => fail::fail_point!("dispatch.before_record_retry"),
        hookd_store::NextState::Dead => fail::fail_point!("dispatch.before_record_dead"),
        _ => {}
    }
}
