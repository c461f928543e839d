//! Observability: `/metrics` after real deliveries (store latency, backlog
//! and lag, claims, attempts, per-destination state), and `/readyz`, which
//! follows the store.
//!
//! The Prometheus recorder is global to the test process and the tests run
//! in parallel, so counters are checked as lower bounds and gauges for
//! presence and sign, never for exact values.

use std::collections::HashMap;

use serde_json::{Value, json};

use crate::helpers::*;
use crate::private_pg::PrivatePostgres;

crate::on_both_backends!(metrics_show_store_latency_backlog_and_the_delivery_path);

/// Events sent by the metrics test.
const EVENTS: usize = 3;

/// The samples of a Prometheus text exposition: `name{labels}` → value.
fn samples(text: &str) -> HashMap<String, f64> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .filter_map(|l| {
            let (series, value) = l.rsplit_once(' ')?;
            Some((series.to_owned(), value.parse().ok()?))
        })
        .collect()
}

async fn scrape(app: &TestApp) -> HashMap<String, f64> {
    let r = app.get("/metrics").await;
    assert_eq!(r.status(), 200);
    samples(&r.text().await.unwrap())
}

async fn metrics_show_store_latency_backlog_and_the_delivery_path(backend: Backend) {
    let Some(app) = spawn_app(backend).await else {
        return;
    };
    // Ready, without a token.
    let r = app.client.get(app.url("/readyz")).send().await.unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(
        r.json::<Value>().await.unwrap(),
        json!({ "status": "ready" })
    );

    let ip = match backend {
        Backend::Sqlite => "127.0.0.110",
        Backend::Postgres => "127.0.0.111",
    };
    let rx = TestReceiver::start(ip).await;
    app.subscribe(&rx.url(), &["metric.*"]).await;
    let mut ids = Vec::new();
    for i in 0..EVENTS {
        ids.push(app.send_event("metric.seen", json!({ "i": i })).await);
    }
    for id in &ids {
        eventually("the delivery to be recorded as delivered", || async {
            let ev = app.get_json(&format!("/events/{id}")).await;
            (ev["deliveries"][0]["state"] == "delivered").then_some(())
        })
        .await;
    }
    // A store call that fails: counted by op and kind.
    let missing = hookd_domain::EventId::new();
    assert_eq!(app.get(&format!("/events/{missing}")).await.status(), 404);

    // The backlog gauges come from the monitor's rounds; wait for one.
    let m = eventually("the monitor's gauges to show", || async {
        let m = scrape(&app).await;
        m.contains_key("hookd_backlog_oldest_seconds").then_some(m)
    })
    .await;
    let get = |series: &str| -> f64 {
        *m.get(series)
            .unwrap_or_else(|| panic!("no {series} in {:#?}", m.keys().collect::<Vec<_>>()))
    };
    let n = EVENTS as f64;

    // Store latency, by operation.
    // Ingest goes through the group committer: one accept_events per batch,
    // every event in some batch.
    assert!(get(r#"hookd_store_seconds_count{op="accept_events"}"#) >= 1.0);
    assert!(get("hookd_ingest_batch_size_sum") >= n);
    assert!(get(r#"hookd_store_seconds_count{op="claim_many"}"#) >= 1.0);
    assert!(get(r#"hookd_store_seconds_count{op="due_destinations"}"#) >= 1.0);
    // One record per attempt, or batches of them.
    let single = m
        .get(r#"hookd_store_seconds_count{op="record_attempt"}"#)
        .copied()
        .unwrap_or(0.0);
    let batched = m
        .get(r#"hookd_store_seconds_count{op="record_attempts"}"#)
        .copied()
        .unwrap_or(0.0);
    assert!(
        single >= n || batched >= 1.0,
        "record_attempt {single}, record_attempts {batched}"
    );
    assert!(get(r#"hookd_store_seconds_sum{op="claim_many"}"#) >= 0.0);
    assert!(
        get(r#"hookd_store_seconds_bucket{op="claim_many",le="+Inf"}"#)
            >= get(r#"hookd_store_seconds_bucket{op="claim_many",le="0.001"}"#)
    );
    assert!(get(r#"hookd_store_errors_total{op="get_event",kind="not_found"}"#) >= 1.0);

    // Backlog and lag (gauges: any app's monitor may have set them last).
    assert!(get("hookd_deliveries_due") >= 0.0);
    assert!(get("hookd_backlog_oldest_seconds") >= 0.0);
    assert!(get("hookd_deliveries_unfinished") >= 0.0);

    // The rest of the delivery path.
    assert!(get("hookd_events_accepted_total") >= n);
    assert!(get("hookd_deliveries_created_total") >= n);
    assert!(get(r#"hookd_attempts_total{result="delivered",class="2xx"}"#) >= n);
    assert!(get("hookd_attempt_duration_seconds_count") >= n);
    assert!(get("hookd_claim_batch_size_count") >= 1.0);
    // Every delivery was claimed by the claim loop or at ingest.
    assert!(
        get("hookd_claim_batch_size_sum") + get("hookd_ingest_claimed_total") >= n,
        "claimed by the loop {}, at ingest {}",
        get("hookd_claim_batch_size_sum"),
        get("hookd_ingest_claimed_total")
    );
    let dest = format!(r#"{{destination="{ip}"}}"#);
    assert_eq!(get(&format!("hookd_destination_circuit_state{dest}")), 0.0);
    assert!(get(&format!("hookd_destination_in_flight{dest}")) >= 0.0);
    app.stop().await;
}

/// `GET /readyz` without a token: the status, and the body (a 503's checked
/// for the error shape and `Retry-After`).
async fn readyz(app: &TestApp) -> (u16, Value) {
    let r = app.client.get(app.url("/readyz")).send().await.unwrap();
    let status = r.status().as_u16();
    let retry_after = r.headers().get("retry-after").cloned();
    let body: Value = r.json().await.unwrap();
    if status == 503 {
        assert_eq!(body["error"]["code"], "unavailable", "{body}");
        assert_eq!(retry_after.unwrap(), "1");
    }
    (status, body)
}

/// `/readyz` follows the database: 503 while the server is down, ready again
/// once it is back, without a restart of hookd; and 503 when the schema is
/// not this build's (a restored backup from before a migration, or a newer
/// hookd's migration), naming which.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readyz_follows_the_database_and_its_schema() {
    let Some(pg) = PrivatePostgres::start().await else {
        return;
    };
    let app = spawn_app_on(pg.url.clone(), Box::new(())).await;
    assert_eq!(readyz(&app).await, (200, json!({ "status": "ready" })));

    pg.stop_immediate().await;
    let body = eventually("/readyz to answer 503", || async {
        let (status, body) = readyz(&app).await;
        (status == 503).then_some(body)
    })
    .await;
    // Refused at once, or given up on after the probe's timeout.
    let message = body["error"]["message"].as_str().unwrap();
    assert!(
        message.starts_with("not ready: the store does not answer"),
        "{message}"
    );
    pg.start_again().await;
    eventually("/readyz to be ready again", || async {
        (readyz(&app).await.0 == 200).then_some(())
    })
    .await;

    // The newest migration undone (as a restore from before it would).
    pg.psql(
        "UPDATE _sqlx_migrations SET success = false \
         WHERE version = (SELECT max(version) FROM _sqlx_migrations)",
    )
    .await
    .unwrap();
    let (status, body) = readyz(&app).await;
    assert_eq!(status, 503);
    let message = body["error"]["message"].as_str().unwrap();
    assert!(message.contains("behind this build's"), "{message}");
    pg.psql("UPDATE _sqlx_migrations SET success = true")
        .await
        .unwrap();
    assert_eq!(readyz(&app).await.0, 200);

    // A newer hookd migrated the database.
    pg.psql(
        "INSERT INTO _sqlx_migrations (version, description, success, checksum, execution_time) \
         VALUES (99990101000000, 'from a newer hookd', true, '\\x00', 0)",
    )
    .await
    .unwrap();
    let (status, body) = readyz(&app).await;
    assert_eq!(status, 503);
    let message = body["error"]["message"].as_str().unwrap();
    assert!(message.contains("newer than this build's"), "{message}");
    pg.psql("DELETE FROM _sqlx_migrations WHERE version = 99990101000000")
        .await
        .unwrap();
    assert_eq!(readyz(&app).await.0, 200);
    app.stop().await;
}
