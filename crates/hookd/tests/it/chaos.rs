//! The chaos test of issue 8: a sharded PostgreSQL deployment of real
//! `hookd serve` processes, with worker nodes SIGKILLed again and again
//! while they deliver.
//!
//! Three databases on the local server (`HOOKD_TEST_DATABASE_URL`): one
//! control database (events, subscriptions, tokens, nodes, the shard map)
//! and two shard databases (deliveries, placed by a stable hash of the
//! destination host). One `api` node and three `worker` nodes, each its own
//! process; receivers on distinct loopback hosts (127.0.9.x, used by no
//! other test). Loopback only.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hookd_domain::delivery::DeliveryState;
use hookd_domain::placement::{PlacementKey, shard_of};
use hookd_store::{DeliveryQuery, Store as _};
use hookd_store_postgres::testing::{DATABASE_URL_VAR, TestDatabase, fresh_schema, server_url};
use hookd_store_postgres::{PgOptions, PgStore};
use rand::Rng as _;
use serde_json::json;

use crate::helpers::*;

/// Events posted.
const EVENTS: usize = 5_000;
/// Receivers, one subscription each, each on its own loopback host.
const RECEIVERS: usize = 24;
/// Subscriptions each event matches: receivers `i` and `i + TYPES` share
/// event type `chaos.t{i}`, so an event's deliveries may be on two shards.
const FANOUT: usize = 2;
/// Event types.
const TYPES: usize = RECEIVERS / FANOUT;
/// Deliveries: one per (event, subscription) pair.
const PAIRS: usize = EVENTS * FANOUT;
/// Worker nodes running at once.
const WORKERS: usize = 3;
/// SIGKILLs of a random worker node during the run.
const KILLS: usize = 6;
/// Posts in flight at once.
const POSTERS: usize = 32;
/// How long a killed worker node stays down before it is started again.
const DOWN_FOR: Duration = Duration::from_millis(500);
/// Receivers that stop answering just before each kill, so that the victim
/// dies with attempts under way (sent, unanswered, unrecorded).
const HELD: usize = 6;
/// The longest they stay silent (below the attempt timeout `ServeProcess`
/// sets, 2 s: a silent receiver must not fail attempts and open circuits).
const MAX_HOLD: Duration = Duration::from_secs(1);
/// The lease [`ServeProcess`] runs every node with: a killed node's claims
/// come back this long after it died.
const LEASE: Duration = Duration::from_secs(3);
/// Bounds each wait of the run (a hang), not a performance target.
const RUN_DEADLINE: Duration = Duration::from_secs(120);

/// Runs `psql` on `url` with one statement. `Err` when psql cannot be run
/// or the statement fails.
fn psql(url: &str, sql: &str) -> Result<(), String> {
    let out = std::process::Command::new("psql")
        .args([
            "-X",
            "-w",
            "-q",
            "-v",
            "ON_ERROR_STOP=1",
            "-d",
            url,
            "-c",
            sql,
        ])
        .env("PGCONNECT_TIMEOUT", "10")
        .stdin(std::process::Stdio::null())
        .output()
        .map_err(|e| format!("cannot run psql: {e}"))?;
    match out.status.success() {
        true => Ok(()),
        false => Err(String::from_utf8_lossy(&out.stderr).trim().to_owned()),
    }
}

/// The control database and the two shard databases, and what drops them.
///
/// Real databases (`CREATE DATABASE hookd_chaos_<pid>_<n>`, made and dropped
/// with `psql` on the server's URL: this crate has no SQL client of its own
/// besides the store). If that is impossible (no `psql`, no privilege),
/// three fresh schemas of the test database instead, which serve as three
/// databases just as well (each URL carries its schema).
struct ChaosDatabases {
    control: String,
    shards: [String; 2],
    /// What tells each one apart in `hookd shards list`: the database or
    /// schema name, in the order control, shard 0, shard 1.
    names: [String; 3],
    /// Real databases or schemas.
    kind: &'static str,
    /// The server's URL and the databases to drop there.
    created: Option<(String, Vec<String>)>,
    /// The schemas, when the fallback was taken (each dropped with its value).
    _schemas: Vec<TestDatabase>,
}

/// Creates the databases `names` on `base_url`, dropping any left by an
/// earlier run of the same name. On failure, what was made is dropped.
fn create_databases(base_url: &str, names: &[String]) -> Result<(), String> {
    let mut made: Vec<&String> = Vec::new();
    for name in names {
        let step = psql(
            base_url,
            &format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"),
        )
        .and_then(|()| psql(base_url, &format!("CREATE DATABASE {name}")));
        if let Err(e) = step {
            for name in made {
                let _ = psql(
                    base_url,
                    &format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"),
                );
            }
            return Err(e);
        }
        made.push(name);
    }
    Ok(())
}

impl ChaosDatabases {
    /// `None` outside CI without `HOOKD_TEST_DATABASE_URL` (the test then
    /// does nothing); under `CI=true` a missing variable or an unreachable
    /// server fails, as for every PostgreSQL test.
    async fn create() -> Option<Self> {
        let base_url = server_url()?;
        let names: Vec<String> = (0..3)
            .map(|n| format!("hookd_chaos_{}_{n}", std::process::id()))
            .collect();
        let (base, todo) = (base_url.clone(), names.clone());
        let made = tokio::task::spawn_blocking(move || create_databases(&base, &todo))
            .await
            .unwrap();
        if let Err(e) = made {
            // Fresh schemas instead; an unreachable server fails here.
            eprintln!("chaos: cannot create databases ({e}); using three fresh schemas");
            let mut schemas = Vec::new();
            for _ in 0..3 {
                schemas.push(fresh_schema().await.expect("the variable is set"));
            }
            return Some(Self {
                control: schemas[0].url.clone(),
                shards: [schemas[1].url.clone(), schemas[2].url.clone()],
                names: std::array::from_fn(|i| schemas[i].schema.clone()),
                kind: "schemas",
                created: None,
                _schemas: schemas,
            });
        }
        let url_of = |name: &str| {
            let mut url = reqwest::Url::parse(&base_url)
                .unwrap_or_else(|e| panic!("{DATABASE_URL_VAR} is not a URL: {e}"));
            url.set_path(&format!("/{name}"));
            url.to_string()
        };
        Some(Self {
            control: url_of(&names[0]),
            shards: [url_of(&names[1]), url_of(&names[2])],
            names: std::array::from_fn(|i| names[i].clone()),
            kind: "databases",
            created: Some((base_url, names)),
            _schemas: Vec::new(),
        })
    }
}

impl Drop for ChaosDatabases {
    fn drop(&mut self) {
        // Best effort; `WITH (FORCE)` ends any connection still open.
        if let Some((base_url, names)) = &self.created {
            for name in names {
                if let Err(e) = psql(
                    base_url,
                    &format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"),
                ) {
                    eprintln!("could not drop test database {name} (left behind): {e}");
                }
            }
        }
    }
}

/// One producer: takes the next event number, posts it (with an
/// idempotency key, retrying a failed post with the same key as a real
/// producer would) until a 202, and records the event id. Returns when all
/// are posted, with the time of its last 202.
async fn post_events(
    api: String,
    next: Arc<AtomicUsize>,
    accepted: Arc<AtomicUsize>,
    retries: Arc<AtomicUsize>,
    ids: Arc<Mutex<Vec<Option<String>>>>,
) -> Instant {
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(20))
        .build()
        .unwrap();
    let mut last = Instant::now();
    loop {
        let n = next.fetch_add(1, Ordering::SeqCst);
        if n >= EVENTS {
            return last;
        }
        let body = json!({
            "type": format!("chaos.t{}", n % TYPES),
            "payload": {"n": n},
            "idempotency_key": format!("chaos-{n}"),
        });
        let (event_id, failed) = post_until_accepted(&client, || api.clone(), &body).await;
        retries.fetch_add(failed, Ordering::SeqCst);
        last = Instant::now();
        ids.lock().unwrap()[n] = Some(event_id);
        accepted.fetch_add(1, Ordering::SeqCst);
    }
}

/// The common `serve` flags of every node: fast heartbeats, so a killed
/// node stops counting within a second and the survivors take its share of
/// each destination's cap; per-destination limits high enough that the run
/// is not throttled, and a modest number of attempts per node (each one
/// renews its lease every second); at most 6 connections per node to each
/// of the three databases (4 nodes × 3 × 6 = 72, under the server's 100,
/// which other tests share); a circuit that opens anyway
/// (a destination starved by the database) probes again after a second.
const NODE_FLAGS: [&str; 14] = [
    "--database-max-connections",
    "6",
    "--max-in-flight",
    "64",
    "--heartbeat-every",
    "200ms",
    "--node-live-within",
    "1s",
    "--host-concurrency",
    "16",
    "--destination-rate-initial",
    "2000",
    "--breaker-backoff",
    "1s",
];

/// The flags of the API node, or of worker node `i`. Worker 2 passes no
/// `--shard`: it reads the map the first node stored in the control database.
fn node_args(worker: Option<usize>, shards: &[String; 2]) -> Vec<String> {
    let mut args: Vec<String> = NODE_FLAGS.iter().map(|s| s.to_string()).collect();
    let (role, id) = match worker {
        Some(i) => ("worker", format!("chaos-w{i}")),
        None => ("api", "chaos-api".to_owned()),
    };
    args.extend(["--role".into(), role.into(), "--worker-id".into(), id]);
    if worker != Some(2) {
        for shard in shards {
            args.extend(["--shard".to_owned(), shard.clone()]);
        }
    }
    args
}

async fn start_node(control: &str, args: &[String]) -> ServeProcess {
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    ServeProcess::start_with_args(control, None, &args).await
}

/// A worker node's slot: running, or started again after a kill.
enum Worker {
    Up(ServeProcess),
    Starting(tokio::task::JoinHandle<ServeProcess>),
}

impl Worker {
    /// The running node, once it has (re)started.
    async fn up(&mut self) -> &mut ServeProcess {
        if let Worker::Starting(start) = self {
            let node = start.await.expect("the worker node restarts");
            *self = Worker::Up(node);
        }
        match self {
            Worker::Up(node) => node,
            Worker::Starting(_) => unreachable!(),
        }
    }
}

/// How many distinct (event, subscription) pairs arrived: distinct
/// `webhook-id`s (the raw count includes duplicates).
fn pairs_arrived(receivers: &[TestReceiver]) -> usize {
    receivers
        .iter()
        .flat_map(|rx| rx.received())
        .map(|r| r.header("webhook-id").to_owned())
        .collect::<HashSet<_>>()
        .len()
}

/// How many lines of `logs` contain `what`.
fn lines_with(logs: &[String], what: &str) -> usize {
    logs.iter()
        .map(|l| l.lines().filter(|l| l.contains(what)).count())
        .sum()
}

/// The attempts `node` has under way to `hosts` (`hookd_destination_in_flight`
/// in its `/metrics`); `None` if it does not answer.
async fn in_flight_to(node: &ServeProcess, hosts: &[String]) -> Option<f64> {
    let text = node.metrics_text().await?;
    let series: Vec<String> = hosts
        .iter()
        .map(|h| format!("hookd_destination_in_flight{{destination=\"{h}\"}}"))
        .collect();
    Some(
        text.lines()
            .filter_map(|l| l.split_once(' '))
            .filter(|(name, _)| series.iter().any(|s| s == name))
            .filter_map(|(_, v)| v.trim().parse::<f64>().ok())
            .sum(),
    )
}

/// Every delivery row in the database at `url` itself (a plain store on
/// that one database: never routed to shards). `None`, said on stderr, if
/// the server refuses (the nodes may hold every connection it allows).
async fn deliveries_in(url: &str) -> Option<Vec<hookd_store::Delivery>> {
    let options = PgOptions {
        keyring: test_keyring(),
        max_connections: 1,
        ..PgOptions::default()
    };
    let store = PgStore::connect(url, options)
        .await
        .inspect_err(|e| eprintln!("chaos: cannot read the deliveries yet: {e}"))
        .ok()?;
    let query = DeliveryQuery {
        limit: 1_000_000,
        ..Default::default()
    };
    let got = store.list_deliveries(&query).await;
    store.close().await;
    let got = got
        .inspect_err(|e| eprintln!("chaos: cannot read the deliveries yet: {e}"))
        .ok()?;
    Some(got.into_iter().map(|d| d.delivery).collect())
}

/// The chaos test (issue 8's acceptance criterion). 1 `api` node and 3
/// `worker` nodes on a control database and 2 shard databases; 24
/// receivers on distinct loopback hosts, one subscription each; 5,000
/// events posted through the API node, 32 at a time, each matching two
/// subscriptions (10,000 deliveries; an event's two may be on different
/// shards). While they are posted and delivered, a random worker node is
/// SIGKILLed 6 times, after about every seventh of the events is accepted:
/// each time, 6 random receivers stop answering until the victim has
/// attempts to them under way (at most a second), so it dies mid-attempt
/// holding leased claims; then they answer again, and the victim, down for
/// half a second, is started again with the same flags while the run goes
/// on. Worker 2 is started without `--shard` (it reads the stored map).
///
/// What the assertions mean:
/// - **0 lost**: every (event, subscription) pair reaches its receiver at
///   least once, and nothing else arrives (no unknown event, no event at
///   the wrong receiver), every copy carrying the pair's one `webhook-id`.
/// - **duplicates are counted, not forbidden** (at-least-once: an attempt
///   the victim sent and never recorded is sent again once its lease ends);
///   they are printed with the run's numbers.
/// - **all delivered after the last kill**: the outstanding deliveries
///   arrive within a generous deadline; the time from the last kill to the
///   last arrival is printed (the bound is the lease, 3 s, plus draining
///   what remained), not asserted.
/// - **sharded**: both shard databases hold deliveries, all `delivered`,
///   each subscription's on the one shard its host hashes to, one row per
///   pair; the control database holds none; `hookd shards list` shows the
///   map with both shards in order.
/// - no node panicked.
///
/// Subscriptions retry after 1 s (not the default schedule), so an attempt
/// that times out at a held receiver costs a second, not minutes.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sharded_workers_sigkilled_mid_run_lose_nothing() {
    let Some(dbs) = ChaosDatabases::create().await else {
        return;
    };
    let started = Instant::now();
    let mut receivers = Vec::new();
    for i in 1..=RECEIVERS {
        receivers.push(TestReceiver::start(&format!("127.0.9.{i}")).await);
    }
    let hosts: Vec<String> = receivers.iter().map(|r| r.addr.ip().to_string()).collect();

    // The API node first: it records the shard map.
    let api = start_node(&dbs.control, &node_args(None, &dbs.shards)).await;
    let mut workers = Vec::new();
    for i in 0..WORKERS {
        let node = start_node(&dbs.control, &node_args(Some(i), &dbs.shards)).await;
        workers.push(Worker::Up(node));
    }
    let mut subs = Vec::new();
    for (i, rx) in receivers.iter().enumerate() {
        let sub_id = api
            .subscribe_with(json!({
                "url": rx.url(),
                "event_types": [format!("chaos.t{}", i % TYPES)],
                "retry_policy": {"base_delay_secs": 1, "max_delay_secs": 1},
            }))
            .await;
        subs.push(sub_id);
    }
    let received = |rs: &[TestReceiver]| rs.iter().map(TestReceiver::count).sum::<usize>();

    let next = Arc::new(AtomicUsize::new(0));
    let accepted = Arc::new(AtomicUsize::new(0));
    let retries = Arc::new(AtomicUsize::new(0));
    let ids = Arc::new(Mutex::new(vec![None; EVENTS]));
    let posters: Vec<_> = (0..POSTERS)
        .map(|_| {
            tokio::spawn(post_events(
                api.url(""),
                next.clone(),
                accepted.clone(),
                retries.clone(),
                ids.clone(),
            ))
        })
        .collect();

    // The kills, while events are posted and delivered: after about every
    // (KILLS + 1)th event is accepted, a random worker node, mid-attempt.
    let plan: Vec<(usize, Vec<usize>, usize)> = {
        let mut rng = rand::rng();
        let step = EVENTS / (KILLS + 1);
        (1..=KILLS)
            .map(|k| {
                let pick = rng.random_range(0..WORKERS * 2);
                let held = rand::seq::index::sample(&mut rng, RECEIVERS, HELD).into_vec();
                let at = k * step + rng.random_range(0..step / 5) - step / 10;
                (pick, held, at)
            })
            .collect()
    };
    let mut killed = Vec::new(); // the dead processes, whose logs stay readable
    let mut held_at_kill = Vec::new();
    let mut last_kill = Instant::now();
    for (k, (pick, held, at)) in plan.into_iter().enumerate() {
        eventually_within(&format!("{at} events accepted"), RUN_DEADLINE, || async {
            (accepted.load(Ordering::SeqCst) >= at).then_some(())
        })
        .await;
        // A random one of the workers that are up (all may be restarting).
        let up: Vec<usize> = (0..WORKERS)
            .filter(|&i| matches!(workers[i], Worker::Up(_)))
            .collect();
        let victim = match up.len() {
            0 => pick % WORKERS,
            n => up[pick % n],
        };
        for &i in &held {
            receivers[i].hold();
        }
        let held_hosts: Vec<String> = held.iter().map(|&i| hosts[i].clone()).collect();
        let victim_node = workers[victim].up().await;
        // Until the victim has attempts to them under way, for at most a
        // second (well inside the attempt timeout, so no attempt fails).
        let hold_until = Instant::now() + MAX_HOLD;
        let under_way = loop {
            let n = in_flight_to(victim_node, &held_hosts).await.unwrap_or(0.0);
            if n >= 1.0 || Instant::now() >= hold_until {
                break n;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        victim_node.kill();
        last_kill = Instant::now();
        let at_kill = pairs_arrived(&receivers);
        assert!(
            at_kill < PAIRS,
            "kill {} landed after every delivery had arrived ({at_kill})",
            k + 1
        );
        for &i in &held {
            receivers[i].release();
        }
        held_at_kill.push(under_way as usize);
        eprintln!(
            "chaos: kill {} of chaos-w{victim} with {under_way} attempts under way, \
             {at_kill} pairs arrived, {:.1}s in",
            k + 1,
            started.elapsed().as_secs_f64()
        );
        // It stays down a moment and starts again, while the run goes on.
        let (control, args) = (dbs.control.clone(), node_args(Some(victim), &dbs.shards));
        let restart = tokio::spawn(async move {
            tokio::time::sleep(DOWN_FOR).await;
            start_node(&control, &args).await
        });
        match std::mem::replace(&mut workers[victim], Worker::Starting(restart)) {
            Worker::Up(dead) => killed.push(dead),
            Worker::Starting(_) => unreachable!("the victim was up"),
        }
    }
    let kills = killed.len();
    let mut running = Vec::new();
    for mut w in workers {
        w.up().await;
        if let Worker::Up(p) = w {
            running.push(p);
        }
    }
    let workers = running;
    let mut posted = started;
    for p in posters {
        posted = posted.max(p.await.unwrap());
    }
    let ids: Vec<String> = ids
        .lock()
        .unwrap()
        .iter()
        .map(|i| i.clone().expect("every event was accepted"))
        .collect();
    assert_eq!(
        ids.iter().collect::<HashSet<_>>().len(),
        EVENTS,
        "one event per idempotency key"
    );

    // Every pair arrives: as many distinct webhook-ids as pairs (checked
    // exactly below).
    eventually_within(
        "every (event, subscription) pair to arrive",
        RUN_DEADLINE,
        || async {
            (received(&receivers) >= PAIRS && pairs_arrived(&receivers) >= PAIRS).then_some(())
        },
    )
    .await;
    let all_arrived = last_kill.elapsed();
    let last_arrival = receivers
        .iter()
        .flat_map(|rx| rx.received())
        .map(|r| r.at)
        .max()
        .unwrap();
    let after_last_kill = last_arrival.saturating_duration_since(last_kill);

    // 0 lost, nothing unexpected, one webhook-id per pair; duplicates counted.
    let mut duplicates = 0;
    let mut lost = Vec::new();
    for (i, (rx, sub_id)) in receivers.iter().zip(&subs).enumerate() {
        let per_event = rx.webhook_ids_by_event();
        let expected: HashSet<&String> = ids.iter().skip(i % TYPES).step_by(TYPES).collect();
        for event_id in &expected {
            if !per_event.contains_key(*event_id) {
                lost.push(format!("{event_id} → {sub_id} ({})", rx.addr));
            }
        }
        for (event_id, webhook_ids) in &per_event {
            assert!(
                expected.contains(event_id),
                "{} received {event_id}, which is not one of its events",
                rx.addr
            );
            let id = expected_webhook_id(event_id, sub_id);
            assert!(
                webhook_ids.iter().all(|w| *w == id),
                "{event_id} → {sub_id}: webhook-ids {webhook_ids:?}, expected {id}"
            );
            duplicates += webhook_ids.len() - 1;
        }
    }
    assert!(lost.is_empty(), "{} lost: {lost:?}", lost.len());

    let nodes: Vec<&ServeProcess> = std::iter::once(&api)
        .chain(&workers)
        .chain(&killed)
        .collect();
    for p in &nodes {
        let log = p.log_text();
        assert!(
            !log.contains("panicked"),
            "a node on {} panicked:\n{log}",
            p.addr
        );
    }
    let logs: Vec<String> = nodes.iter().map(|p| p.log_text()).collect();
    // The API node's work is done: its connections go back to the server
    // before the checks below open their own.
    drop(nodes);
    drop(api);

    // Sharded: the deliveries are on the shards, each subscription's on the
    // one shard its host hashes to, all delivered; none in control.
    let sub_index: HashMap<&str, usize> = subs
        .iter()
        .enumerate()
        .map(|(i, s)| (s.as_str(), i))
        .collect();
    let mut on_shard = [0; 2];
    let mut pairs_seen = HashSet::new();
    for (shard, url) in dbs.shards.iter().enumerate() {
        let rows = eventually_within(
            &format!("shard {shard}'s deliveries all delivered"),
            RUN_DEADLINE,
            || async {
                let rows = deliveries_in(url).await?;
                rows.iter()
                    .all(|d| d.state == DeliveryState::Delivered)
                    .then_some(rows)
            },
        )
        .await;
        on_shard[shard] = rows.len();
        for d in rows {
            let sub = d.sub_id.to_string();
            let i = *sub_index
                .get(sub.as_str())
                .unwrap_or_else(|| panic!("a delivery for unknown {sub} on shard {shard}"));
            let host = &hosts[i];
            assert_eq!(&d.destination_host, host);
            assert_eq!(
                shard_of(PlacementKey::Host(host), 2),
                shard,
                "{host}'s deliveries are on the shard its host hashes to"
            );
            assert!(
                pairs_seen.insert((d.event_id, d.sub_id)),
                "one delivery per pair: {} → {sub} twice",
                d.event_id
            );
        }
    }
    assert_eq!(pairs_seen.len(), PAIRS, "every pair has its delivery row");
    assert!(
        on_shard.iter().all(|&n| n > 0),
        "both shards hold deliveries: {on_shard:?}"
    );
    let split_types = (0..TYPES)
        .filter(|&t| {
            shard_of(PlacementKey::Host(&hosts[t]), 2)
                != shard_of(PlacementKey::Host(&hosts[t + TYPES]), 2)
        })
        .count();
    assert!(
        split_types > 0,
        "some events have deliveries on both shards"
    );
    // The workers' work is done too.
    drop(workers);
    drop(killed);
    let in_control = eventually_within("the control database's deliveries", RUN_DEADLINE, || {
        deliveries_in(&dbs.control)
    })
    .await
    .len();
    assert_eq!(in_control, 0, "the control database holds no deliveries");

    // The stored map names both shards, in order.
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_hookd"));
    cmd.args(["shards", "list", "--json", "--database", &dbs.control])
        .env_remove("HOOKD_DATABASE_URL")
        .env("HOOKD_ENCRYPTION_KEY", TEST_ENCRYPTION_KEY);
    let out = run(cmd).await;
    let map = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "hookd shards list: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let (s0, s1) = (map.find(&dbs.names[1]), map.find(&dbs.names[2]));
    assert!(
        matches!((s0, s1), (Some(a), Some(b)) if a < b),
        "the map lists both shards, in order: {map}"
    );

    eprintln!(
        "chaos test ({RECEIVERS} receivers, 3 {}): {EVENTS} events, {PAIRS} deliveries \
         (shards {on_shard:?}, {split_types} of {TYPES} event types on both), {kills} kills \
         (attempts under way at each: {held_at_kill:?}), {duplicates} duplicates, \
         {} post retries; posted in {:.1}s; the nodes logged {} lost leases and {} \
         store errors; last arrival {:.2}s after the last kill \
         (lease {}s), all arrived {:.2}s after it; {:.1}s in all",
        dbs.kind,
        retries.load(Ordering::SeqCst),
        posted.duration_since(started).as_secs_f64(),
        lines_with(&logs, "lease lost"),
        lines_with(&logs, "store unavailable"),
        after_last_kill.as_secs_f64(),
        LEASE.as_secs(),
        all_arrived.as_secs_f64(),
        started.elapsed().as_secs_f64(),
    );
    assert!(kills >= 5, "a worker node was killed {kills} times");
}
