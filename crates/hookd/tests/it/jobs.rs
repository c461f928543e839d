//! Bulk replay jobs end to end (design §3, R3): a job over a day's dead
//! deliveries re-sends each exactly once, with exact counts, never faster
//! than the destination's rate; overlapping jobs never send one delivery
//! twice; a customer sees only its own jobs; `hookd replay` shows a job
//! through to its end.

use std::collections::HashSet;
use std::time::Duration;

use hookd_domain::event_type::EventType;
use hookd_domain::isolation::CircuitState;
use hookd_domain::{DeliveryId, EventId, SubscriptionId};
use hookd_store::{
    Attempt, AttemptRecord, ClaimOrder, ClaimRequest, NewDelivery, NewEvent, NextState,
};
use serde_json::{Value, json};

use crate::helpers::*;

crate::on_both_backends!(
    a_replay_job_over_1000_dead_deliveries_completes_with_exact_counts_within_the_rate,
    overlapping_jobs_never_send_one_delivery_twice,
    a_cancelled_job_stops_requeueing,
    a_customer_gets_404_for_another_customers_job_replay_and_stats,
);

/// Adds `n` deliveries of `sub_id` that ran out of retries (`dead`, one
/// attempt answered 500), straight through the store, with no application
/// running: seeding a day of dead-lettered history without waiting through
/// the breaker and retry schedule that would produce it live.
async fn seed_dead(database: &str, sub_id: &str, host: &str, n: usize) -> Vec<DeliveryId> {
    let store = open_store(database).await;
    let sub_id: SubscriptionId = sub_id.parse().unwrap();
    let mut ids = Vec::with_capacity(n);
    for i in 0..n {
        let id = DeliveryId::new();
        ids.push(id);
        let event = NewEvent {
            id: EventId::new(),
            event_type: EventType::parse("order.created").unwrap(),
            payload: json!({ "n": i }).to_string(),
            idempotency_key: None,
            customer_id: None,
        };
        let delivery = NewDelivery {
            id,
            sub_id,
            destination_host: host.to_owned(),
        };
        store.accept_event(event, vec![delivery]).await.unwrap();
    }
    loop {
        let claimed = store
            .claim_due(&ClaimRequest {
                worker_id: "seed".into(),
                destination: host.to_owned(),
                subscription: Some(sub_id),
                order: ClaimOrder::OldestFirst,
                limit: 500,
                lease: Duration::from_secs(60),
            })
            .await
            .unwrap();
        if claimed.is_empty() {
            break;
        }
        for c in claimed {
            let record = AttemptRecord {
                lease: c.lease,
                attempt: Attempt {
                    number: 1,
                    started_at: chrono::Utc::now(),
                    duration: Duration::from_millis(5),
                    status: Some(500),
                    error_class: None,
                    response_snippet: None,
                },
                next: NextState::Dead,
                last_error: Some("HTTP 500".into()),
            };
            store.record_attempt(record).await.unwrap();
        }
    }
    ids
}

/// A running app with a subscription to `rx` holding `n` dead deliveries.
/// The subscription is created through the API, the app stopped, the dead
/// deliveries seeded, and the app started again on the same database.
async fn app_with_dead(
    backend: Backend,
    rx: &TestReceiver,
    n: usize,
    sub_body: Value,
) -> Option<(TestApp, String)> {
    let (database, guard) = fresh_database(backend).await?;
    let app = spawn_app_full(database.clone(), guard, |_| {}).await;
    let mut body = sub_body;
    body["url"] = rx.url().into();
    let sub = app.subscribe_with(body).await;
    let sub_id = sub["sub_id"].as_str().unwrap().to_owned();
    let guard = app.stop().await;
    seed_dead(&database, &sub_id, &rx.addr.ip().to_string(), n).await;
    let app = spawn_app_full(database, guard, |_| {}).await;
    Some((app, sub_id))
}

async fn start_job(app: &TestApp, sub_id: &str, body: Value) -> Value {
    let r = app
        .post(&format!("/subscriptions/{sub_id}/replay"), &body)
        .await;
    let status = r.status();
    let v: Value = r.json().await.unwrap();
    assert_eq!(status, 202, "{v}");
    v
}

async fn job_ended(app: &TestApp, job_id: &str) -> Value {
    eventually_within(
        &format!("job {job_id} to end"),
        Duration::from_secs(120),
        || async {
            let j = app.get_json(&format!("/jobs/{job_id}")).await;
            (j["state"] != "running").then_some(j)
        },
    )
    .await
}

fn an_hour_ago() -> String {
    (chrono::Utc::now() - chrono::Duration::hours(1)).to_rfc3339()
}

async fn a_replay_job_over_1000_dead_deliveries_completes_with_exact_counts_within_the_rate(
    backend: Backend,
) {
    const N: usize = 1000;
    const RATE: u32 = 200;
    let rx = TestReceiver::start("127.0.0.70").await;
    let Some((app, sub_id)) = app_with_dead(
        backend,
        &rx,
        N,
        json!({ "event_types": ["order.*"], "rate_limit": RATE }),
    )
    .await
    else {
        return;
    };
    let h = app
        .get_json(&format!("/subscriptions/{sub_id}/health"))
        .await;
    assert_eq!(h["dead_count"], N as u64, "{h}");

    let job = start_job(&app, &sub_id, json!({ "since": an_hour_ago() })).await;
    assert_eq!(job["total"], N as u64, "{job}");
    assert_eq!(job["statuses"], json!(["failed", "dead"]));
    let job_id = job["job_id"].as_str().unwrap().to_owned();
    let end = job_ended(&app, &job_id).await;
    assert_eq!(end["state"], "completed", "{end}");
    assert_eq!(end["total"], N as u64);
    assert_eq!(end["done"], N as u64, "{end}");
    assert_eq!(end["failed"], 0);
    assert_eq!(end["skipped"], 0);
    assert_eq!(end["in_progress"], 0);

    // Each dead delivery was sent exactly once more.
    let got = rx.received();
    assert_eq!(got.len(), N);
    let ids: HashSet<&str> = got.iter().map(|r| r.header("webhook-id")).collect();
    assert_eq!(ids.len(), N, "no delivery was sent twice");

    // Never faster than the destination's rate. The subscription's explicit
    // rate R sets the host's token bucket, which holds B = `burst` seconds of
    // R (the test apps' admission settings): however the sends fall, any
    // stretch [t_i, t_j] between two arrivals at the receiver holds at most
    // B + R·(t_j − t_i) of them, plus one for rounding.
    let rate = f64::from(RATE);
    let burst = test_dispatch_config("test-worker")
        .admission
        .rate
        .capacity_for(rate);
    let mut at: Vec<_> = got.iter().map(|r| r.at).collect();
    at.sort();
    let mut worst: Option<(f64, usize, usize)> = None;
    for i in 0..at.len() {
        for j in i..at.len() {
            let arrivals = (j - i + 1) as f64;
            let allowed = burst + rate * at[j].duration_since(at[i]).as_secs_f64() + 1.0;
            let excess = arrivals - allowed;
            if worst.is_none_or(|(w, _, _)| excess > w) {
                worst = Some((excess, i, j));
            }
        }
    }
    let (excess, i, j) = worst.expect("N arrivals");
    assert!(
        excess <= 0.0,
        "{} arrivals within {:?} (arrivals #{i} to #{j}): more than the burst of {burst} \
         plus {RATE}/s over it, plus one",
        j - i + 1,
        at[j].duration_since(at[i]),
    );
    // The same rule over the whole run: after the burst, the other N − B
    // went out at no more than R per second (10 % tolerance).
    let run = at[N - 1].duration_since(at[0]).as_secs_f64();
    let least = (N as f64 - burst) / rate;
    assert!(
        run >= 0.9 * least,
        "{N} arrivals in {run:.3} s: at {RATE}/s with a burst of {burst} they take at least \
         {least:.3} s"
    );
    let h = app
        .get_json(&format!("/subscriptions/{sub_id}/health"))
        .await;
    assert_eq!(h["dead_count"], 0, "{h}");
    app.stop().await;
}

async fn overlapping_jobs_never_send_one_delivery_twice(backend: Backend) {
    const N: usize = 60;
    let rx = TestReceiver::start("127.0.0.71").await;
    let Some((app, sub_id)) =
        app_with_dead(backend, &rx, N, json!({ "event_types": ["order.*"] })).await
    else {
        return;
    };
    // Both jobs are created while neither can re-queue anything: with the
    // destination's circuit open a step's window is 0 (it only settles), so
    // each job's items are every dead delivery. (Otherwise the first job's
    // first step may re-queue a window before the second job is created,
    // and the second covers only what is still dead: the overlap shrinks,
    // and with it what this test proves.)
    let host = rx.addr.ip().to_string();
    assert!(app.admission.force_open(&host));
    let body = json!({ "since": an_hour_ago(), "statuses": ["dead"] });
    let first = start_job(&app, &sub_id, body.clone()).await;
    let second = start_job(&app, &sub_id, body).await;
    assert_eq!(first["total"], N as u64);
    assert_eq!(second["total"], N as u64, "both cover every dead delivery");
    let circuit = app.admission.snapshot(&host).unwrap().circuit_state;
    assert_eq!(
        circuit,
        CircuitState::Open,
        "the circuit stayed open while the jobs were created"
    );
    for job in [&first, &second] {
        let j = app
            .get_json(&format!("/jobs/{}", job["job_id"].as_str().unwrap()))
            .await;
        assert_eq!(j["state"], "running", "{j}");
        assert_eq!(j["in_progress"], 0, "nothing re-queued yet: {j}");
    }
    // Then the app restarts on the same database: its isolation state is
    // new (the circuit closed), and both jobs run at once over the same
    // 60 deliveries.
    let database = app.database.clone();
    let guard = app.stop().await;
    assert_eq!(rx.count(), 0);
    let app = spawn_app_full(database, guard, |_| {}).await;
    let a = job_ended(&app, first["job_id"].as_str().unwrap()).await;
    let b = job_ended(&app, second["job_id"].as_str().unwrap()).await;
    assert_eq!(
        (a["state"].as_str(), b["state"].as_str()),
        (Some("completed"), Some("completed"))
    );
    for j in [&a, &b] {
        let settled = ["done", "failed", "skipped"]
            .iter()
            .map(|k| j[k].as_u64().unwrap())
            .sum::<u64>();
        assert_eq!(settled, N as u64, "every item settles once: {j}");
        assert_eq!(j["failed"], 0, "{j}");
    }
    // Whatever the interleaving, each delivery went out once: a job that
    // found it queued by the other waited for it, and one that found it
    // delivered skipped it.
    let got = rx.received();
    let ids: HashSet<&str> = got.iter().map(|r| r.header("webhook-id")).collect();
    assert_eq!(ids.len(), N);
    assert_eq!(got.len(), N, "no delivery was sent twice");
    app.stop().await;
}

async fn a_cancelled_job_stops_requeueing(backend: Backend) {
    const N: usize = 100;
    let rx = TestReceiver::start("127.0.0.72").await;
    // One at a time, and held: the job cannot finish before it is cancelled.
    let Some((app, sub_id)) = app_with_dead(
        backend,
        &rx,
        N,
        json!({ "event_types": ["order.*"], "max_concurrency": 1 }),
    )
    .await
    else {
        return;
    };
    rx.hold();
    let job = start_job(&app, &sub_id, json!({ "since": an_hour_ago() })).await;
    let job_id = job["job_id"].as_str().unwrap().to_owned();
    eventually("the job to re-queue its first window", || async {
        let j = app.get_json(&format!("/jobs/{job_id}")).await;
        (j["in_progress"].as_u64().unwrap() > 0).then_some(())
    })
    .await;
    let r = app
        .client
        .delete(app.url(&format!("/jobs/{job_id}")))
        .bearer_auth(&app.token)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let cancelled: Value = r.json().await.unwrap();
    assert_eq!(cancelled["state"], "cancelled", "{cancelled}");
    assert!(cancelled["finished_at"].is_string());
    let requeued = cancelled["in_progress"].as_u64().unwrap()
        + cancelled["done"].as_u64().unwrap()
        + cancelled["failed"].as_u64().unwrap();
    assert!(requeued < N as u64, "{cancelled}");

    // What was re-queued before the cancel is sent; nothing after it is.
    rx.release();
    eventually("the re-queued deliveries to be sent", || async {
        let h = app
            .get_json(&format!("/subscriptions/{sub_id}/health"))
            .await;
        (h["pending_count"] == 0).then_some(())
    })
    .await;
    assert_eq!(rx.count() as u64, requeued);
    let h = app
        .get_json(&format!("/subscriptions/{sub_id}/health"))
        .await;
    assert_eq!(h["dead_count"], N as u64 - requeued, "{h}");
    // Cancelling again changes nothing.
    let again = app
        .client
        .delete(app.url(&format!("/jobs/{job_id}")))
        .bearer_auth(&app.token)
        .send()
        .await
        .unwrap();
    assert_eq!(again.status(), 200);
    let again: Value = again.json().await.unwrap();
    assert_eq!(again["state"], "cancelled");
    assert_eq!(again["finished_at"], cancelled["finished_at"]);
    app.stop().await;
}

async fn a_customer_gets_404_for_another_customers_job_replay_and_stats(backend: Backend) {
    let Some(app) = spawn_app(backend).await else {
        return;
    };
    let token_for = |customer: &'static str| {
        let app = &app;
        async move {
            let r = app
                .post("/tokens", &json!({ "customer_id": customer }))
                .await;
            assert_eq!(r.status(), 201);
            let v: Value = r.json().await.unwrap();
            v["token"].as_str().unwrap().to_owned()
        }
    };
    let acme = token_for("acme").await;
    let globex = token_for("globex").await;
    let theirs = app
        .subscribe_with(json!({
            "url": "http://127.0.0.73:9/in",
            "event_types": ["a.b"],
            "customer_id": "globex",
        }))
        .await;
    let sub_id = theirs["sub_id"].as_str().unwrap();
    let job = start_job(&app, sub_id, json!({ "since": an_hour_ago() })).await;
    let job_id = job["job_id"].as_str().unwrap();

    let call = |method: reqwest::Method, path: String, token: String| {
        let app = &app;
        async move {
            let r = app
                .client
                .request(method, app.url(&path))
                .bearer_auth(token)
                .json(&json!({ "since": an_hour_ago() }))
                .send()
                .await
                .unwrap();
            let status = r.status().as_u16();
            let v: Value = r.json().await.unwrap();
            (status, v)
        }
    };
    use reqwest::Method;
    for (method, path) in [
        (Method::GET, format!("/jobs/{job_id}")),
        (Method::DELETE, format!("/jobs/{job_id}")),
        (Method::POST, format!("/subscriptions/{sub_id}/replay")),
        (Method::GET, format!("/subscriptions/{sub_id}/stats")),
        (Method::GET, format!("/subscriptions/{sub_id}/health")),
    ] {
        let (status, v) = call(method.clone(), path.clone(), acme.clone()).await;
        assert_eq!(status, 404, "{method} {path} as another customer: {v}");
        assert_eq!(v["error"]["code"], "not_found");
    }
    // The owner sees its job; the job was not cancelled by the refused call.
    let (status, v) = call(Method::GET, format!("/jobs/{job_id}"), globex.clone()).await;
    assert_eq!(status, 200, "{v}");
    assert_ne!(v["state"], "cancelled");
    let (status, _) = call(
        Method::GET,
        format!("/subscriptions/{sub_id}/stats"),
        globex,
    )
    .await;
    assert_eq!(status, 200);
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_replay_requests_are_refused_naming_the_field() {
    let app = spawn_app(Backend::Sqlite).await.unwrap();
    let sub = app.subscribe("http://127.0.0.74:9/in", &["a.b"]).await;
    let sub_id = sub["sub_id"].as_str().unwrap();
    let now = chrono::Utc::now().to_rfc3339();
    for (body, field) in [
        (json!({ "since": now, "until": an_hour_ago() }), "since"),
        (
            json!({ "since": an_hour_ago(), "statuses": ["pending"] }),
            "statuses",
        ),
        (
            json!({ "since": an_hour_ago(), "statuses": [] }),
            "statuses",
        ),
        (
            json!({ "since": an_hour_ago(), "types": ["not a type"] }),
            "types",
        ),
        (json!({ "since": "yesterday" }), "since"),
        (json!({ "until": now }), "since"),
    ] {
        let r = app
            .post(&format!("/subscriptions/{sub_id}/replay"), &body)
            .await;
        let status = r.status().as_u16();
        let v: Value = r.json().await.unwrap();
        assert!(matches!(status, 400 | 422), "{body}: {status} {v}");
        assert!(
            v["error"]["message"].as_str().unwrap().contains(field),
            "{body}: {v}"
        );
    }
    let missing = app.get("/jobs/job_00000000000000000000000000000000").await;
    assert_eq!(missing.status(), 404);
    app.stop().await;
}

/// Runs the real `hookd replay` against `app`, through `--url` (the
/// command's older name for `--server`, kept working).
async fn hookd_replay(app: &TestApp, args: &[&str]) -> std::process::Output {
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_hookd"));
    cmd.arg("replay")
        .args(args)
        .args(["--url", &app.url("")])
        .env("HOOKD_TOKEN", &app.token);
    run(cmd).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hookd_replay_shows_a_job_through_to_its_end() {
    let rx = TestReceiver::start("127.0.0.75").await;
    let (app, sub_id) = app_with_dead(
        Backend::Sqlite,
        &rx,
        25,
        json!({ "event_types": ["order.*"] }),
    )
    .await
    .unwrap();
    let out = hookd_replay(
        &app,
        &[
            "--subscription",
            &sub_id,
            "--since",
            &an_hour_ago(),
            "--status",
            "dead",
            "--every",
            "50ms",
        ],
    )
    .await;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "stdout: {stdout}\nstderr: {stderr}");
    assert!(
        stdout.contains("completed: 25 delivered, 0 failed, 0 skipped of 25"),
        "{stdout}"
    );
    assert!(stderr.contains("25 deliveries"), "{stderr}");
    assert_eq!(rx.count(), 25);

    // `--json`: no bar, and the ended job as the API gives it, for scripts.
    let out = hookd_replay(
        &app,
        &[
            "--subscription",
            &sub_id,
            "--since",
            &an_hour_ago(),
            "--status",
            "delivered",
            "--every",
            "50ms",
            "--json",
        ],
    )
    .await;
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}");
    let job: Value = serde_json::from_str(&stdout).expect("stdout is the job's JSON");
    assert_eq!(job["state"], "completed", "{job}");
    assert_eq!(job["total"], 25, "{job}");
    assert_eq!(job["done"], 25, "{job}");
    assert_eq!(rx.count(), 50);

    // An unknown subscription is a clear error and a failing exit.
    let out = hookd_replay(
        &app,
        &[
            "--subscription",
            "sub_00000000000000000000000000000000",
            "--since",
            &an_hour_ago(),
        ],
    )
    .await;
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("not found"), "{stderr}");
    app.stop().await;
}
