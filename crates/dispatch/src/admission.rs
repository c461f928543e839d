//! Per-destination admission: how many attempts each destination — and each
//! subscription at it — may start now. The dispatcher asks before it claims,
//! so a saturated, rate-limited or open destination has no rows claimed or
//! rewritten on its behalf (design §6).
//!
//! The decisions are `hookd_domain::isolation`'s pure state machines
//! (concurrency cap, circuit breaker, adaptive token bucket, recovery ramp,
//! fair share, backlog floor). This module owns one of them per destination
//! host, in memory — zero store reads on the hot path (R1) — and ties each
//! started attempt to a permit whose drop always gives its slot back.
//!
//! Several worker nodes on one database (issue 8): each admits only its
//! share of a host's cap, `⌈cap / live worker nodes⌉`
//! ([`set_live_nodes`](Admission::set_live_nodes), fed by the heartbeats),
//! and a circuit that opens here is published through the installed
//! [`CircuitGossip`] for the other nodes to adopt
//! ([`force_open`](Admission::force_open)); see [`crate::gossip`].

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use hookd_domain::isolation::{
    AdmissionConfig, AttemptOutcome, BacklogInput, CircuitTransition, DestinationAdmission,
    DestinationSnapshot, SubscriptionLoad, Ticket, backlog_split, fair_share, node_share,
};
use hookd_domain::{Clock, SubscriptionId, Timestamp};
use hookd_store::{ClaimOrder, DueDestination};

use crate::gossip::CircuitGossip;

/// The admission state of every destination this process has seen.
#[derive(Debug)]
pub struct Admission {
    config: AdmissionConfig,
    /// A due delivery older than this is backlog (R4's floor applies to it).
    backlog_age: chrono::Duration,
    clock: Arc<dyn Clock>,
    hosts: Mutex<HashMap<Arc<str>, HostState>>,
    /// Live worker nodes sharing the database, this one included (from the
    /// heartbeats; 1 until told otherwise): each host's cap is divided by it.
    live_nodes: AtomicU32,
    /// Where circuit openings are published (R1); none: nobody to tell.
    gossip: OnceLock<Arc<dyn CircuitGossip>>,
}

#[derive(Debug)]
struct HostState {
    destination: DestinationAdmission,
    /// Attempts in flight per subscription, for the fair share (R2).
    subscriptions: HashMap<SubscriptionId, InFlight>,
    /// Rotates which subscription gets remainder slots first.
    turn: usize,
    /// The explicit rate last applied: the smallest `rate_limit` among the
    /// host's subscriptions with due work (`None`: adaptive).
    rate_limit: Option<u32>,
    /// The cap last applied: this node's share ([`node_share`]) of the
    /// smallest `max_concurrency` among them (or of the configured default
    /// when none sets one).
    concurrency: u32,
    /// The cap that share was taken of, kept so a change in the number of
    /// live nodes re-divides it even before the next plan.
    cap: u32,
}

#[derive(Debug, Default, Clone, Copy)]
struct InFlight {
    total: u32,
    /// Of those, claimed oldest-first: they count toward the backlog floor.
    oldest: u32,
}

/// One claim the dispatcher should make.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlannedClaim {
    /// Whose deliveries.
    pub sub_id: SubscriptionId,
    /// Oldest first (the backlog floor) or newest first (new work).
    pub order: ClaimOrder,
    /// How many at most.
    pub limit: u32,
}

/// What may be claimed for one destination now.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Plan {
    /// The claims to make.
    pub claims: Vec<PlannedClaim>,
    /// When asking again could admit more (next token, end of an open
    /// period); `None` when only a finishing attempt can free a slot.
    pub next_check: Option<Timestamp>,
}

/// One admitted attempt. Hand its result to [`AttemptPermit::finish`];
/// dropping it unfinished (shutdown, lost lease, a refused start) cancels it,
/// so a slot — or the half-open probe — is never leaked.
#[derive(Debug)]
pub struct AttemptPermit {
    admission: Arc<Admission>,
    host: Arc<str>,
    sub_id: SubscriptionId,
    oldest: bool,
    ticket: Option<Ticket>,
}

impl Admission {
    /// Admission for every destination, each with `config`.
    pub fn new(config: AdmissionConfig, backlog_age: Duration, clock: Arc<dyn Clock>) -> Arc<Self> {
        Arc::new(Self {
            config,
            backlog_age: chrono::Duration::from_std(backlog_age).unwrap_or(chrono::Duration::MAX),
            clock,
            hosts: Mutex::new(HashMap::new()),
            live_nodes: AtomicU32::new(1),
            gossip: OnceLock::new(),
        })
    }

    /// Installs where this node's circuit openings are published (before
    /// the dispatcher runs; the first one set stays).
    pub fn set_gossip(&self, gossip: Arc<dyn CircuitGossip>) {
        let _ = self.gossip.set(gossip);
    }

    /// The gossip installed with [`set_gossip`](Self::set_gossip), if any.
    pub fn gossip(&self) -> Option<Arc<dyn CircuitGossip>> {
        self.gossip.get().cloned()
    }

    /// How many live worker nodes share the database (this one included),
    /// from the latest heartbeat. Every host's cap is divided among them
    /// from the next plan on ([`node_share`]); 0 counts as 1.
    pub fn set_live_nodes(&self, nodes: u32) {
        self.live_nodes.store(nodes.max(1), Ordering::Relaxed);
    }

    /// The live worker nodes the cap is divided among.
    pub fn live_nodes(&self) -> u32 {
        self.live_nodes.load(Ordering::Relaxed)
    }

    /// Plans the claims for one destination with due work, given `free`
    /// slots left in this process. The destination's slots (cap, breaker,
    /// bucket, ramp) are shared fairly among its subscriptions with due
    /// work; each subscription's share is split between its oldest and
    /// newest due deliveries so a backlog keeps a guaranteed floor.
    pub fn plan(&self, due: &DueDestination, free: u32) -> Plan {
        self.plan_ahead(due, free, 0, 0)
    }

    /// [`plan`](Self::plan), and besides the free slots up to `budget` more
    /// deliveries to claim ahead (§9.1), so they wait in memory for this
    /// destination's next free slot; `waiting` are those already waiting
    /// here. How many it may be is the destination's
    /// [`lookahead`](DestinationAdmission::lookahead) less `waiting`.
    pub fn plan_ahead(&self, due: &DueDestination, free: u32, waiting: u32, budget: u32) -> Plan {
        let now = self.clock.now();
        let mut hosts = self.hosts.lock().unwrap();
        let h = self.host_state(&mut hosts, &due.host, now);
        // A subscription's explicit rate_limit replaces the adaptive rate;
        // several at one host: the strictest statement about that server wins.
        let limit = hookd_domain::subscription::strictest_limit(
            due.subscriptions.iter().map(|s| s.rate_limit),
        );
        if limit != h.rate_limit {
            h.rate_limit = limit;
            // Clearing it goes back to the configured rate (adaptive unless
            // the operator fixed one).
            h.destination
                .set_rate_override(now, limit.map(f64::from).or(self.config.rate_override));
        }
        let cap = hookd_domain::subscription::strictest_limit(
            due.subscriptions.iter().map(|s| s.max_concurrency),
        )
        .unwrap_or(self.config.concurrency);
        // Several worker nodes each take their share, so the host's cap
        // holds across them (issue 8).
        h.cap = cap;
        let share = node_share(cap, self.live_nodes());
        if share != h.concurrency {
            h.concurrency = share;
            h.destination.set_concurrency(share);
        }
        let admit = h.destination.available(now);
        let ahead = if budget == 0 {
            0
        } else {
            h.destination
                .lookahead(now)
                .saturating_sub(waiting)
                .min(budget)
        };
        let slots = admit.slots.min(free) + ahead;
        if slots == 0 || due.subscriptions.is_empty() {
            return Plan {
                claims: Vec::new(),
                next_check: admit.next_check,
            };
        }
        let n = due.subscriptions.len();
        h.turn = (h.turn + 1) % n;
        let order: Vec<_> = (0..n)
            .map(|i| &due.subscriptions[(i + h.turn) % n])
            .collect();
        let loads: Vec<SubscriptionLoad<SubscriptionId>> = order
            .iter()
            .map(|s| SubscriptionLoad {
                key: s.sub_id,
                in_flight: h.subscriptions.get(&s.sub_id).map_or(0, |f| f.total),
                has_due_work: true,
            })
            .collect();
        let shares = fair_share(slots, &loads);
        let cut = now - self.backlog_age;
        let mut claims = Vec::new();
        for (sub, share) in order.into_iter().zip(shares) {
            if share == 0 {
                continue;
            }
            let flying = h
                .subscriptions
                .get(&sub.sub_id)
                .copied()
                .unwrap_or_default();
            let has_backlog = sub.oldest_due_at < cut;
            let (oldest, newest) = if has_backlog {
                backlog_split(BacklogInput {
                    slots: share,
                    concurrency: share + flying.total,
                    oldest_in_flight: flying.oldest,
                    has_backlog,
                    has_new: sub.newest_due_at >= cut,
                })
            } else {
                // No backlog: plain first-in first-out. Newest-first exists
                // only to let new work pass a backlog (R4); among young
                // deliveries it would just make the older ones wait.
                (share, 0)
            };
            for (limit, order) in [
                (oldest, ClaimOrder::OldestFirst),
                (newest, ClaimOrder::NewestFirst),
            ] {
                if limit > 0 {
                    claims.push(PlannedClaim {
                        sub_id: sub.sub_id,
                        order,
                        limit,
                    });
                }
            }
        }
        Plan {
            claims,
            next_check: admit.next_check,
        }
    }

    /// Starts one attempt to `host` for `sub_id`, or `None` if the
    /// destination may not take it now (another attempt opened the circuit,
    /// the probe is out, the bucket ran dry): then do not send it.
    pub fn start(
        self: &Arc<Self>,
        host: &str,
        sub_id: SubscriptionId,
        order: ClaimOrder,
    ) -> Option<AttemptPermit> {
        let now = self.clock.now();
        let mut hosts = self.hosts.lock().unwrap();
        let h = self.host_state(&mut hosts, host, now);
        let ticket = h.destination.on_start(now)?;
        let oldest = order == ClaimOrder::OldestFirst;
        let f = h.subscriptions.entry(sub_id).or_default();
        f.total += 1;
        f.oldest += u32::from(oldest);
        let host = hosts
            .get_key_value(host)
            .map(|(k, _)| k.clone())
            .expect("inserted above");
        Some(AttemptPermit {
            admission: self.clone(),
            host,
            sub_id,
            oldest,
            ticket: Some(ticket),
        })
    }

    /// Whether deliveries claimed ahead may keep waiting for `host`
    /// ([`healthy`](DestinationAdmission::healthy)): once it fails they go
    /// back to the store.
    pub fn may_wait(&self, host: &str) -> bool {
        let now = self.clock.now();
        let mut hosts = self.hosts.lock().unwrap();
        self.host_state(&mut hosts, host, now)
            .destination
            .healthy(now)
    }

    /// Whether `due` holds a backlog (R4): a subscription whose oldest due
    /// delivery is older than the backlog age. New work must not pass such
    /// a host's backlog at ingest: the claim loop gives the backlog its
    /// floor there.
    pub fn has_backlog(&self, due: &DueDestination) -> bool {
        let cut = self.clock.now() - self.backlog_age;
        due.subscriptions.iter().any(|s| s.oldest_due_at < cut)
    }

    /// How many new deliveries to `host` may be claimed at ingest now
    /// ([`ingest_room`](DestinationAdmission::ingest_room)). 0 for a
    /// destination no plan has seen yet: its cap and rate come from the
    /// subscriptions with due work there, so its first deliveries go through
    /// the claim loop.
    pub fn ingest_room(&self, host: &str) -> u32 {
        let now = self.clock.now();
        let live = self.live_nodes();
        let mut hosts = self.hosts.lock().unwrap();
        let Some(h) = hosts.get_mut(host) else {
            return 0;
        };
        // The cap as last planned, divided among the nodes live now: a node
        // that joined since must not find this one over its share.
        let share = node_share(h.cap, live);
        if share != h.concurrency {
            h.concurrency = share;
            h.destination.set_concurrency(share);
        }
        h.destination.ingest_room(now)
    }

    /// Adopts another node's "this destination's circuit opened" (R1).
    /// Returns whether it changed anything.
    pub fn force_open(&self, host: &str) -> bool {
        let now = self.clock.now();
        let mut hosts = self.hosts.lock().unwrap();
        self.host_state(&mut hosts, host, now)
            .destination
            .force_open(now, rand::random())
    }

    /// One destination's isolation state, if this process has seen it.
    pub fn snapshot(&self, host: &str) -> Option<DestinationSnapshot> {
        let now = self.clock.now();
        self.hosts
            .lock()
            .unwrap()
            .get(host)
            .map(|h| h.destination.snapshot(now))
    }

    /// Every destination's isolation state, by host.
    pub fn snapshots(&self) -> Vec<(String, DestinationSnapshot)> {
        let now = self.clock.now();
        let hosts = self.hosts.lock().unwrap();
        let mut all: Vec<_> = hosts
            .iter()
            .map(|(k, h)| (k.to_string(), h.destination.snapshot(now)))
            .collect();
        all.sort_by(|a, b| a.0.cmp(&b.0));
        all
    }

    fn host_state<'m>(
        &self,
        hosts: &'m mut HashMap<Arc<str>, HostState>,
        host: &str,
        now: Timestamp,
    ) -> &'m mut HostState {
        if !hosts.contains_key(host) {
            let state = HostState {
                destination: DestinationAdmission::new(self.config.clone(), now),
                subscriptions: HashMap::new(),
                turn: 0,
                rate_limit: None,
                concurrency: self.config.concurrency,
                cap: self.config.concurrency,
            };
            hosts.insert(Arc::from(host), state);
        }
        hosts.get_mut(host).expect("inserted above")
    }
}

impl AttemptPermit {
    /// The destination host.
    pub fn host(&self) -> &str {
        &self.host
    }

    /// Records the attempt's result. Returns the circuit's transition, if
    /// this result caused one; an opening is published to the other nodes
    /// (R1), a close never is.
    pub fn finish(mut self, outcome: AttemptOutcome) -> Option<CircuitTransition> {
        let ticket = self.ticket.take()?;
        let now = self.admission.clock.now();
        let transition = {
            let mut hosts = self.admission.hosts.lock().unwrap();
            let h = hosts.get_mut(&*self.host)?;
            h.destination
                .on_finish(now, ticket, outcome, rand::random())
        };
        if transition == Some(CircuitTransition::Opened)
            && let Some(gossip) = self.admission.gossip.get()
        {
            gossip.publish_open(&self.host);
        }
        transition
    }
}

impl Drop for AttemptPermit {
    fn drop(&mut self) {
        let now = self.admission.clock.now();
        let mut hosts = self.admission.hosts.lock().unwrap();
        let Some(h) = hosts.get_mut(&*self.host) else {
            return;
        };
        if let Some(ticket) = self.ticket.take() {
            h.destination.on_cancel(now, ticket);
        }
        if let Some(f) = h.subscriptions.get_mut(&self.sub_id) {
            f.total = f.total.saturating_sub(1);
            f.oldest = f.oldest.saturating_sub(u32::from(self.oldest));
            if f.total == 0 {
                h.subscriptions.remove(&self.sub_id);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use hookd_domain::FakeClock;
    use hookd_domain::isolation::{CircuitState, OutcomeKind};
    use hookd_store::DueSubscription;

    use super::*;

    fn t0() -> Timestamp {
        chrono::DateTime::from_timestamp(1_700_000_000, 0).unwrap()
    }

    fn setup(concurrency: u32) -> (Arc<Admission>, Arc<FakeClock>) {
        let clock = Arc::new(FakeClock::new(t0()));
        let mut config = AdmissionConfig {
            concurrency,
            ..Default::default()
        };
        config.rate_override = Some(1_000.0);
        (
            Admission::new(config, Duration::from_secs(30), clock.clone()),
            clock,
        )
    }

    fn due(host: &str, subs: &[(SubscriptionId, i64, i64)], now: Timestamp) -> DueDestination {
        DueDestination {
            host: host.into(),
            subscriptions: subs
                .iter()
                .map(|&(sub_id, oldest_age, newest_age)| DueSubscription {
                    sub_id,
                    oldest_due_at: now - chrono::Duration::seconds(oldest_age),
                    newest_due_at: now - chrono::Duration::seconds(newest_age),
                    rate_limit: None,
                    max_concurrency: None,
                })
                .collect(),
        }
    }

    fn total(plan: &Plan) -> u32 {
        plan.claims.iter().map(|c| c.limit).sum()
    }

    #[test]
    fn a_host_takes_at_most_its_cap_and_permits_return_on_drop() {
        let (a, clock) = setup(4);
        let s = SubscriptionId::new();
        let d = due("x", &[(s, 0, 0)], clock.now());
        assert_eq!(total(&a.plan(&d, 100)), 4);
        let permits: Vec<_> = (0..4)
            .map(|_| a.start("x", s, ClaimOrder::OldestFirst).unwrap())
            .collect();
        assert!(
            a.start("x", s, ClaimOrder::OldestFirst).is_none(),
            "the cap holds at start too"
        );
        assert_eq!(total(&a.plan(&d, 100)), 0);
        assert_eq!(
            total(&a.plan(&due("y", &[(s, 0, 0)], clock.now()), 100)),
            4,
            "hosts are independent"
        );
        drop(permits);
        assert_eq!(total(&a.plan(&d, 100)), 4);
        assert_eq!(a.snapshot("x").unwrap().in_flight, 0);
    }

    #[test]
    fn the_process_wide_limit_bounds_a_plan() {
        let (a, clock) = setup(20);
        let d = due("x", &[(SubscriptionId::new(), 0, 0)], clock.now());
        assert_eq!(total(&a.plan(&d, 3)), 3);
    }

    #[test]
    fn subscriptions_with_due_work_share_a_host_fairly() {
        let (a, clock) = setup(20);
        let (hog, other) = (SubscriptionId::new(), SubscriptionId::new());
        // The hog already holds 15 slots.
        let held: Vec<_> = (0..15)
            .map(|_| a.start("x", hog, ClaimOrder::OldestFirst).unwrap())
            .collect();
        let plan = a.plan(&due("x", &[(hog, 0, 0), (other, 0, 0)], clock.now()), 100);
        let for_other: u32 = plan
            .claims
            .iter()
            .filter(|c| c.sub_id == other)
            .map(|c| c.limit)
            .sum();
        let for_hog: u32 = plan
            .claims
            .iter()
            .filter(|c| c.sub_id == hog)
            .map(|c| c.limit)
            .sum();
        assert_eq!(
            (for_hog, for_other),
            (0, 5),
            "the free slots go to the one below its share"
        );
        drop(held);
    }

    #[test]
    fn a_backlog_keeps_its_floor_beside_new_work() {
        let (a, clock) = setup(20);
        let s = SubscriptionId::new();
        // Oldest due an hour ago, newest just now: both kinds wait.
        let plan = a.plan(&due("x", &[(s, 3600, 0)], clock.now()), 100);
        let oldest: u32 = plan
            .claims
            .iter()
            .filter(|c| c.order == ClaimOrder::OldestFirst)
            .map(|c| c.limit)
            .sum();
        let newest: u32 = plan
            .claims
            .iter()
            .filter(|c| c.order == ClaimOrder::NewestFirst)
            .map(|c| c.limit)
            .sum();
        assert_eq!((oldest, newest), (4, 16), "20 % of 20 to the backlog");
        // Only fresh work: first in, first out.
        let plan = a.plan(&due("y", &[(s, 1, 0)], clock.now()), 100);
        assert_eq!(
            plan.claims,
            [PlannedClaim {
                sub_id: s,
                order: ClaimOrder::OldestFirst,
                limit: 20
            }]
        );
    }

    #[test]
    fn an_open_circuit_admits_nothing_until_its_probe() {
        let (a, clock) = setup(20);
        let s = SubscriptionId::new();
        let d = due("x", &[(s, 0, 0)], clock.now());
        let fail = AttemptOutcome {
            kind: OutcomeKind::RetryableFailure,
            latency: Duration::from_millis(5),
        };
        let mut opened = false;
        for _ in 0..20 {
            let p = a.start("x", s, ClaimOrder::OldestFirst).unwrap();
            opened |= p.finish(fail) == Some(CircuitTransition::Opened);
        }
        assert!(opened);
        assert_eq!(a.snapshot("x").unwrap().circuit_state, CircuitState::Open);
        let plan = a.plan(&d, 100);
        assert!(plan.claims.is_empty());
        assert!(
            plan.next_check.unwrap() > clock.now(),
            "told when to ask again"
        );
        clock.advance(Duration::from_secs(31 * 60));
        let plan = a.plan(&due("x", &[(s, 0, 0)], clock.now()), 100);
        assert_eq!(total(&plan), 1, "exactly one probe");
        let probe = a.start("x", s, ClaimOrder::OldestFirst).unwrap();
        assert!(a.start("x", s, ClaimOrder::OldestFirst).is_none());
        drop(probe); // cancelled: the probe slot comes back
        assert_eq!(total(&a.plan(&due("x", &[(s, 0, 0)], clock.now()), 100)), 1);
    }

    #[test]
    fn a_subscription_rate_limit_sets_its_hosts_rate_and_the_strictest_wins() {
        let (a, clock) = setup(20);
        let (s1, s2) = (SubscriptionId::new(), SubscriptionId::new());
        let mut d = due("x", &[(s1, 0, 0), (s2, 0, 0)], clock.now());
        d.subscriptions[0].rate_limit = Some(5);
        d.subscriptions[1].rate_limit = Some(3);
        let plan = a.plan(&d, 100);
        assert!(
            total(&plan) <= 3,
            "a bucket of 3/s admits at most 3 now: {plan:?}"
        );
        assert_eq!(a.snapshot("x").unwrap().rate_per_sec, 3.0);
        // Cleared: back to the configured rate.
        d.subscriptions[0].rate_limit = None;
        d.subscriptions[1].rate_limit = None;
        a.plan(&d, 100);
        assert_eq!(a.snapshot("x").unwrap().rate_per_sec, 1_000.0);
    }

    #[test]
    fn a_subscription_max_concurrency_caps_its_host() {
        let (a, clock) = setup(20);
        let s = SubscriptionId::new();
        let mut d = due("x", &[(s, 0, 0)], clock.now());
        d.subscriptions[0].max_concurrency = Some(3);
        assert_eq!(total(&a.plan(&d, 100)), 3);
        let held: Vec<_> = (0..3)
            .map(|_| a.start("x", s, ClaimOrder::OldestFirst).unwrap())
            .collect();
        assert!(
            a.start("x", s, ClaimOrder::OldestFirst).is_none(),
            "the lowered cap holds"
        );
        drop(held);
        d.subscriptions[0].max_concurrency = None;
        assert_eq!(
            total(&a.plan(&d, 100)),
            20,
            "cleared: the configured cap again"
        );
    }

    #[test]
    fn each_live_node_takes_its_share_of_a_hosts_cap() {
        let (a, clock) = setup(20);
        let s = SubscriptionId::new();
        let mut d = due("x", &[(s, 0, 0)], clock.now());
        a.set_live_nodes(3);
        assert_eq!(total(&a.plan(&d, 100)), 7, "⌈20 / 3⌉");
        assert_eq!(a.snapshot("x").unwrap().concurrency_limit, 7);
        d.subscriptions[0].max_concurrency = Some(4);
        assert_eq!(
            total(&a.plan(&d, 100)),
            2,
            "a subscription's cap is divided too"
        );
        a.set_live_nodes(8);
        assert_eq!(total(&a.plan(&d, 100)), 1, "never below one");
        a.set_live_nodes(0);
        assert_eq!(a.live_nodes(), 1, "no heartbeat yet: this node alone");
        assert_eq!(total(&a.plan(&d, 100)), 4);
    }

    #[derive(Debug, Default)]
    struct Recorded(Mutex<Vec<String>>);

    impl CircuitGossip for Recorded {
        fn publish_open(&self, host: &str) {
            self.0.lock().unwrap().push(host.to_owned());
        }
        fn subscribe(&self) -> tokio::sync::broadcast::Receiver<String> {
            tokio::sync::broadcast::channel(1).1
        }
    }

    #[test]
    fn an_opening_is_published_and_an_adopted_one_is_not() {
        let (a, _clock) = setup(20);
        let gossip = Arc::new(Recorded::default());
        a.set_gossip(gossip.clone());
        let s = SubscriptionId::new();
        let fail = AttemptOutcome {
            kind: OutcomeKind::RetryableFailure,
            latency: Duration::from_millis(5),
        };
        for _ in 0..20 {
            let p = a.start("x", s, ClaimOrder::OldestFirst).unwrap();
            p.finish(fail);
        }
        assert_eq!(a.snapshot("x").unwrap().circuit_state, CircuitState::Open);
        assert_eq!(*gossip.0.lock().unwrap(), ["x"], "published once");
        assert!(a.force_open("y"));
        assert_eq!(
            *gossip.0.lock().unwrap(),
            ["x"],
            "an adopted opening is not published again"
        );
    }

    #[test]
    fn gossip_opens_a_circuit() {
        let (a, _clock) = setup(20);
        assert!(a.force_open("x"));
        assert_eq!(a.snapshot("x").unwrap().circuit_state, CircuitState::Open);
        assert_eq!(a.snapshots().len(), 1);
    }
}
