//! Several nodes on one PostgreSQL database (issue 8): roles, heartbeats and
//! each worker's share of a destination's cap, and circuit gossip (R1):
//! an opening on one node is adopted by the others at once, a close never.
//!
//! Every node here is a whole application in this process, on one schema.

use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use hookd::{App, AppConfig};
use hookd_dispatch::egress::StaticResolver;
use hookd_domain::isolation::CircuitState;
use hookd_store::NodeRole;
use serde_json::json;

use crate::helpers::*;

/// A node on `database` (whose schema another node keeps alive).
async fn node(database: &str, tune: impl FnOnce(&mut AppConfig)) -> TestApp {
    spawn_app_full(database.to_owned(), Box::new(()), tune).await
}

/// `at` (the system clock) as an `Instant`.
fn instant_of(at: chrono::DateTime<chrono::Utc>) -> Instant {
    let now = (Instant::now(), chrono::Utc::now());
    match (at - now.1).to_std() {
        Ok(ahead) => now.0 + ahead,
        Err(_) => now.0 - (now.1 - at).to_std().unwrap_or_default(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_api_node_accepts_events_and_a_worker_node_delivers_them() {
    let Some((database, guard)) = fresh_database(Backend::Postgres).await else {
        return;
    };
    let api = spawn_app_full(database.clone(), guard, |c| {
        c.role = NodeRole::Api;
        c.dispatch.worker_id = "api-node".into();
    })
    .await;
    let rx = TestReceiver::start("127.0.0.60").await;
    api.subscribe(&rx.url(), &["order.*"]).await;
    for i in 0..3 {
        api.send_event("order.created", json!({ "i": i })).await;
    }
    // Nothing on this database delivers yet. (A wait for something that
    // must not happen: long enough for an `all` node to have delivered.)
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert_eq!(rx.count(), 0, "an api node delivers nothing");
    assert_eq!(
        open_store(&database).await.due_work().await.unwrap().due,
        3,
        "the events wait, due"
    );

    let worker = node(&database, |c| {
        c.role = NodeRole::Worker;
        c.dispatch.worker_id = "worker-node".into();
    })
    .await;
    rx.wait_for(3).await;

    // A worker node answers only the operational routes.
    assert_eq!(worker.get("/healthz").await.status(), 200);
    assert_eq!(worker.get("/readyz").await.status(), 200);
    let refused = worker
        .post(
            "/events",
            &json!({ "type": "order.created", "payload": {} }),
        )
        .await;
    assert_eq!(refused.status(), 404, "a worker node accepts no events");
    let body: serde_json::Value = refused.json().await.unwrap();
    assert!(
        body.to_string().contains("worker node"),
        "the refusal says why: {body}"
    );
    assert_eq!(worker.get("/subscriptions").await.status(), 404);

    // Both nodes heartbeat; only the worker delivers, so it alone takes
    // the whole cap.
    let nodes = eventually("both nodes to heartbeat", || async {
        let nodes = open_store(&database).await.nodes().await.unwrap();
        (nodes.len() == 2).then_some(nodes)
    })
    .await;
    let roles: Vec<_> = nodes.iter().map(|n| (n.node_id.as_str(), n.role)).collect();
    assert_eq!(
        roles,
        [
            ("api-node", NodeRole::Api),
            ("worker-node", NodeRole::Worker)
        ]
    );
    assert_eq!(worker.admission.live_nodes(), 1);

    worker.stop().await;
    api.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn roles_other_than_all_are_refused_on_sqlite() {
    for role in [NodeRole::Api, NodeRole::Worker] {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite:{}", dir.path().join("hookd.db").display());
        let mut config = AppConfig::new(url, test_dispatch_config("w"));
        config.keyring = Some(test_keyring());
        config.role = role;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let err = App::build(config, listener)
            .await
            .expect_err("refused")
            .to_string();
        assert!(err.contains("needs PostgreSQL"), "{err}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn worker_nodes_divide_a_hosts_cap_between_them() {
    const CAP: u32 = 8;
    let Some((database, guard)) = fresh_database(Backend::Postgres).await else {
        return;
    };
    let tune = |id: &'static str| {
        move |c: &mut AppConfig| {
            c.dispatch.worker_id = id.into();
            c.dispatch.admission.concurrency = CAP;
            c.dispatch.admission.rate_override = Some(10_000.0);
            c.nodes.heartbeat_every = Duration::from_millis(100);
            c.nodes.live_within = Duration::from_secs(1);
        }
    };
    let a = spawn_app_full(database.clone(), guard, tune("node-a")).await;
    let b = node(&database, tune("node-b")).await;
    for n in [&a, &b] {
        eventually("both worker nodes to count each other", || async {
            (n.admission.live_nodes() == 2).then_some(())
        })
        .await;
    }
    let rx = TestReceiver::start("127.0.0.61").await;
    rx.hold();
    a.subscribe(&rx.url(), &["*"]).await;
    for i in 0..3 * CAP {
        a.send_event("load.tick", json!({ "i": i })).await;
    }
    let host = rx.addr.ip().to_string();
    let in_flight = |n: &TestApp| n.admission.snapshot(&host).map_or(0, |s| s.in_flight);
    // Each node holds its share, and together exactly the cap.
    eventually("the two nodes to fill the host's cap", || async {
        (in_flight(&a) + in_flight(&b) == CAP).then_some(())
    })
    .await;
    for n in [&a, &b] {
        let s = n.admission.snapshot(&host).unwrap();
        assert_eq!(s.concurrency_limit, CAP / 2, "each node's share");
        assert_eq!(s.in_flight, CAP / 2);
    }
    rx.release();
    rx.wait_for(3 * CAP as usize).await;

    // A node that leaves gives its share back.
    b.stop().await;
    eventually("the remaining node to take the whole cap", || async {
        (a.admission.live_nodes() == 1).then_some(())
    })
    .await;
    a.send_event("load.tick", json!({})).await;
    eventually("the whole cap again", || async {
        let s = a.admission.snapshot(&host)?;
        (s.concurrency_limit == CAP).then_some(())
    })
    .await;
    a.stop().await;
}

/// Node A's circuit for a failing destination opens from A's own failures;
/// node B, which never sent there, opens its own circuit within a second
/// and sends nothing there while open; when the destination recovers, A's
/// probe closes A's circuit, and B's stays open until B's own probe.
///
/// The destination is one host name, `flaky.test`, that each node resolves
/// to a receiver of its own (same port, different loopback address), so
/// each receiver sees exactly one node's attempts.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_circuit_opening_on_one_node_opens_it_on_the_others_but_each_closes_its_own() {
    let Some((database, guard)) = fresh_database(Backend::Postgres).await else {
        return;
    };
    let rx_a = TestReceiver::start("127.0.0.50").await;
    let rx_b = TestReceiver::start_at("127.0.0.52", rx_a.addr.port()).await;
    rx_a.set_status(500);
    rx_b.set_status(500);
    let resolves_to = |ip: IpAddr| {
        Arc::new(StaticResolver::new([("flaky.test", vec![ip])]))
            as Arc<dyn hookd_dispatch::egress::HostResolver>
    };

    // B first. It takes one delivery to a destination that never answers
    // and, allowed one attempt at a time, has no room for anything else:
    // B sends nothing to flaky.test until that attempt is released.
    let rx_hold = TestReceiver::start("127.0.0.53").await;
    rx_hold.hold();
    let b_resolver = resolves_to(rx_b.addr.ip());
    let b = spawn_app_full(database.clone(), guard, |c| {
        c.dispatch.worker_id = "node-b".into();
        c.dispatch.max_in_flight = 1;
        c.dispatch.egress.resolver = b_resolver;
        c.dispatch.admission.rate_override = Some(10_000.0);
        // Far longer than A's: B's circuit outlasts A's first open period.
        c.dispatch.admission.breaker.base_backoff = Duration::from_secs(6);
        c.dispatch.admission.breaker.max_backoff = Duration::from_secs(12);
    })
    .await;
    b.subscribe(&rx_hold.url(), &["hold.*"]).await;
    b.send_event("hold.on", json!({})).await;
    let hold_host = rx_hold.addr.ip().to_string();
    eventually("B to hold its one attempt", || async {
        let s = b.admission.snapshot(&hold_host)?;
        (s.in_flight == 1).then_some(())
    })
    .await;

    let a_resolver = resolves_to(rx_a.addr.ip());
    let a = node(&database, |c| {
        c.dispatch.worker_id = "node-a".into();
        c.dispatch.egress.resolver = a_resolver;
        c.dispatch.admission.concurrency = 40;
        c.dispatch.admission.rate_override = Some(10_000.0);
        c.dispatch.admission.breaker.base_backoff = Duration::from_millis(1_500);
        c.dispatch.admission.breaker.max_backoff = Duration::from_secs(3);
    })
    .await;
    a.subscribe_with(json!({
        "url": format!("http://flaky.test:{}/hook", rx_a.addr.port()),
        "event_types": ["flaky.*"],
        "retry_policy": { "base_delay_secs": 1, "max_delay_secs": 1 },
    }))
    .await;
    for i in 0..25 {
        a.send_event("flaky.tick", json!({ "i": i })).await;
    }

    // A's circuit opens from its own failures.
    let host = "flaky.test";
    eventually("A's circuit to open", || async {
        let s = a.admission.snapshot(host)?;
        (s.circuit_state == CircuitState::Open).then_some(())
    })
    .await;
    let a_opened = Instant::now();
    assert!(rx_a.count() >= 20, "A opened from its own attempts");

    // B adopts it within a second, having never sent there.
    let adopted = eventually_within(
        "B's circuit to open within one second of A's",
        Duration::from_secs(1),
        || async {
            let s = b.admission.snapshot(host)?;
            (s.circuit_state == CircuitState::Open).then_some(s)
        },
    )
    .await;
    assert!(a_opened.elapsed() < Duration::from_secs(1) + Duration::from_millis(100));
    assert_eq!(rx_b.count(), 0, "B never sent to flaky.test");
    assert_eq!(adopted.window_attempts, 0, "B opened without failing there");
    let b_reopens = instant_of(adopted.reopens_at.expect("an open circuit reopens"));
    assert!(
        b_reopens > Instant::now() + Duration::from_secs(2),
        "B opened for its own (normal) open period"
    );

    // The destination recovers; B gets room to work.
    rx_a.set_status(200);
    rx_b.set_status(200);
    rx_hold.release();
    rx_hold.wait_for(1).await;

    // A's own probe closes A's circuit; B's stays open.
    eventually("A's probe to close A's circuit", || async {
        let s = a.admission.snapshot(host)?;
        (s.circuit_state == CircuitState::Closed).then_some(())
    })
    .await;
    let b_now = b.admission.snapshot(host).unwrap();
    assert_ne!(
        b_now.circuit_state,
        CircuitState::Closed,
        "a close is never adopted"
    );
    assert!(
        Instant::now() < b_reopens,
        "the test reached A's close before B's open period ended"
    );

    // A leaves, so the next work for flaky.test is B's: B sends nothing
    // there until its own open period ends, then probes, and closes.
    a.stop().await;
    for i in 0..5 {
        b.send_event("flaky.later", json!({ "i": i })).await;
    }
    eventually("B's own probe to close B's circuit", || async {
        let s = b.admission.snapshot(host)?;
        (s.circuit_state == CircuitState::Closed).then_some(())
    })
    .await;
    let first_b = rx_b.wait_for(1).await[0].at;
    assert!(
        first_b + Duration::from_millis(100) >= b_reopens,
        "B sent nothing to flaky.test while its adopted circuit was open \
         (first attempt {:?} before its open period ended)",
        b_reopens.saturating_duration_since(first_b)
    );

    let metrics = b.get("/metrics").await.text().await.unwrap();
    for counter in [
        "hookd_circuit_gossip_sent_total",
        "hookd_circuit_gossip_received_total",
        "hookd_live_worker_nodes",
    ] {
        assert!(metrics.contains(counter), "{counter} in /metrics");
    }
    b.stop().await;
}

/// `hookd_live_worker_nodes` as a `hookd serve` process reports it.
async fn live_worker_nodes(p: &ServeProcess) -> Option<f64> {
    let text = p.metrics_text().await?;
    text.lines()
        .find_map(|l| l.strip_prefix("hookd_live_worker_nodes "))
        .and_then(|v| v.trim().parse().ok())
}

/// Real processes: an `api` process and two `worker` processes. A worker
/// killed mid-attempt stops counting once its heartbeat is older than the
/// live window, and its delivery goes to the other worker when the lease
/// expires.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_worker_process_that_dies_stops_counting_and_another_takes_its_work() {
    let Some((database, _guard)) = fresh_database(Backend::Postgres).await else {
        return;
    };
    let args = |role: &'static str, id: &'static str| {
        [
            "--role",
            role,
            "--worker-id",
            id,
            "--heartbeat-every",
            "200ms",
            "--node-live-within",
            "1s",
        ]
    };
    let api = ServeProcess::start_with_args(&database, None, &args("api", "api")).await;
    let w1 = ServeProcess::start_with_args(&database, None, &args("worker", "w1")).await;
    let mut w1 = w1;
    let rx = TestReceiver::start("127.0.0.62").await;
    rx.hold();
    api.subscribe_with(json!({ "url": rx.url(), "event_types": ["*"] }))
        .await;
    let r = api
        .post(
            "/events",
            &json!({ "type": "order.created", "payload": {} }),
        )
        .await;
    assert_eq!(r.status(), 202);
    let event: serde_json::Value = r.json().await.unwrap();
    let path = format!("/events/{}", event["event_id"].as_str().unwrap());
    let state = |ev: serde_json::Value| ev["deliveries"][0]["state"].as_str().map(str::to_owned);
    eventually("w1 to claim the delivery", || async {
        (state(api.get_json(&path).await).as_deref() == Some("inflight")).then_some(())
    })
    .await;

    let w2 = ServeProcess::start_with_args(&database, None, &args("worker", "w2")).await;
    eventually("w2 to count two workers", || async {
        (live_worker_nodes(&w2).await == Some(2.0)).then_some(())
    })
    .await;
    assert!(
        w2.client
            .post(w2.url("/events"))
            .bearer_auth(PROCESS_TOKEN)
            .json(&json!({ "type": "order.created", "payload": {} }))
            .send()
            .await
            .unwrap()
            .status()
            == 404,
        "a worker process accepts no events"
    );

    w1.kill();
    rx.release();
    eventually("w2 to count only itself", || async {
        (live_worker_nodes(&w2).await == Some(1.0)).then_some(())
    })
    .await;
    eventually("w2 to deliver what w1 held", || async {
        (state(api.get_json(&path).await).as_deref() == Some("delivered")).then_some(())
    })
    .await;
    let nodes = open_store(&database).await.nodes().await.unwrap();
    let w1_row = nodes.iter().find(|n| n.node_id == "w1");
    assert!(
        w1_row.is_some_and(|n| n.role == NodeRole::Worker),
        "a killed node's row stays until it is long dead: {nodes:?}"
    );
    drop(w2);
    drop(api);
}
