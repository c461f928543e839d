//! A sharded deployment through the binary (issue 8): an app on a control
//! database with two shards delivers, and `hookd shards split` refuses to
//! split a host while its circuit is open on a live node (R5: never split
//! during a failure), then splits a healthy one.

use std::time::Duration;

use hookd_domain::placement::{PlacementKey, shard_of};
use serde_json::json;

use crate::helpers::*;

/// `hookd shards …` against the control database, as an operator runs it.
async fn shards_cli(control: &str, args: &[&str]) -> std::process::Output {
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_hookd"));
    cmd.arg("shards")
        .args(args)
        .args(["--database", control])
        .env("HOOKD_ENCRYPTION_KEY", TEST_ENCRYPTION_KEY)
        .env_remove("HOOKD_ENCRYPTION_KEY_PREVIOUS")
        .env_remove("HOOKD_DATABASE_URL")
        .env("HOOKD_LOG", "warn");
    run(cmd).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_sharded_app_delivers_and_a_split_waits_for_a_healthy_circuit() {
    let Some((control, guard)) = fresh_database(Backend::Postgres).await else {
        return;
    };
    let (a, guard_a) = fresh_database(Backend::Postgres).await.unwrap();
    let (b, guard_b) = fresh_database(Backend::Postgres).await.unwrap();
    let shards = vec![a.clone(), b.clone()];
    let app = spawn_app_full(control.clone(), Box::new((guard, guard_a, guard_b)), |c| {
        c.shards = shards.clone();
        c.nodes.heartbeat_every = Duration::from_millis(100);
        c.nodes.live_within = Duration::from_secs(2);
    })
    .await;

    // Six hosts: both shards get some, and every event arrives once.
    let mut receivers = Vec::new();
    for i in 0..6 {
        let rx = TestReceiver::start(&format!("127.0.0.{}", 81 + i)).await;
        app.subscribe(&rx.url(), &["order.*"]).await;
        receivers.push(rx);
    }
    let placed: Vec<usize> = (0..6)
        .map(|i| shard_of(PlacementKey::Host(&format!("127.0.0.{}", 81 + i)), 2))
        .collect();
    assert!(placed.contains(&0) && placed.contains(&1), "{placed:?}");
    for i in 0..5 {
        app.send_event("order.created", json!({ "i": i })).await;
    }
    for rx in &receivers {
        rx.wait_for(5).await;
    }
    let listed = shards_cli(&control, &["list", "--json"]).await;
    assert!(listed.status.success(), "{listed:?}");
    let map: serde_json::Value = serde_json::from_slice(&listed.stdout).unwrap();
    assert_eq!(map["version"], 1);
    assert_eq!(map["shards"].as_array().unwrap().len(), 2);

    // The first host's circuit opens on this node; its heartbeat says so.
    let sick = "127.0.0.81";
    assert!(app.admission.force_open(sick));
    let store = open_store(&control).await;
    eventually("the heartbeat to report the open circuit", || {
        let store = store.clone();
        async move {
            let nodes = store.nodes().await.ok()?;
            nodes
                .iter()
                .any(|n| n.open_circuits.iter().any(|h| h == sick))
                .then_some(())
        }
    })
    .await;
    let refused = shards_cli(&control, &["split", "--host", sick]).await;
    assert!(
        !refused.status.success(),
        "a split during a failure is refused"
    );
    let why = String::from_utf8_lossy(&refused.stderr);
    assert!(why.contains("circuit") && why.contains(sick), "{why}");

    // A healthy host splits: the next map version names it.
    let healthy = "127.0.0.82";
    let split = shards_cli(&control, &["split", "--host", healthy]).await;
    assert!(split.status.success(), "{split:?}");
    let listed = shards_cli(&control, &["list", "--json"]).await;
    let map: serde_json::Value = serde_json::from_slice(&listed.stdout).unwrap();
    assert_eq!(map["version"], 2);
    assert_eq!(map["split_hosts"], json!([healthy]));
    let again = shards_cli(&control, &["split", "--host", healthy]).await;
    assert!(again.status.success());
    assert!(String::from_utf8_lossy(&again.stdout).contains("split already"));

    // Deliveries go on after the split, on both shards as placed.
    app.send_event("order.created", json!({ "i": 5 })).await;
    for rx in &receivers[1..] {
        rx.wait_for(6).await;
    }
    app.stop().await;
}
