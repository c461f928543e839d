//! The crash test: thousands of events to five receivers while the
//! `hookd serve` process is SIGKILLed again and again and restarted on the
//! same database. Every (event, subscription) pair must arrive at least
//! once, and every duplicate must carry the pair's one `webhook-id`.
//!
//! The producer behaves like a real one: every event has an idempotency
//! key, and a POST that fails (the process died under it) is retried with
//! the same key until it gets its 202.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rand::Rng as _;
use serde_json::json;

use crate::helpers::*;

crate::on_both_backends!(every_pair_arrives_with_a_stable_webhook_id_across_sigkills);

const EVENTS: usize = 2_000;
const RECEIVER_IPS: [&str; 5] = [
    "127.0.0.2",
    "127.0.0.3",
    "127.0.0.4",
    "127.0.0.5",
    "127.0.0.6",
];
/// Producers posting at once.
const POSTERS: usize = 8;
/// Kill after about this many accepted posts, and again after each multiple.
const KILL_EVERY: usize = 500;
/// Bounds the whole run (a hang), not a performance target.
const RUN_DEADLINE: Duration = Duration::from_secs(180);

/// Where the producers should post: the current process's address.
type Target = Arc<Mutex<String>>;

/// One producer: takes the next event number, posts it until a 202, records
/// the event id, and goes on until all are posted.
async fn post_events(
    target: Target,
    next: Arc<AtomicUsize>,
    accepted: Arc<AtomicUsize>,
    ids: Arc<Mutex<Vec<Option<String>>>>,
) {
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(20))
        .build()
        .unwrap();
    loop {
        let n = next.fetch_add(1, Ordering::SeqCst);
        if n >= EVENTS {
            return;
        }
        let body = json!({
            "type": "crash.test",
            "payload": {"n": n},
            "idempotency_key": format!("crash-{n}"),
        });
        let (event_id, _) =
            post_until_accepted(&client, || target.lock().unwrap().clone(), &body).await;
        ids.lock().unwrap()[n] = Some(event_id);
        accepted.fetch_add(1, Ordering::SeqCst);
    }
}

/// How many deliveries each subscription has in each state, via the API.
async fn delivery_states(p: &ServeProcess, sub_id: &str) -> HashMap<String, usize> {
    let mut states = HashMap::new();
    let mut cursor: Option<String> = None;
    loop {
        let mut path = format!("/subscriptions/{sub_id}/deliveries?limit=250");
        if let Some(c) = &cursor {
            path.push_str(&format!("&cursor={c}"));
        }
        let page = p.get_json(&path).await;
        for d in page["data"].as_array().unwrap() {
            *states
                .entry(d["state"].as_str().unwrap().to_owned())
                .or_default() += 1;
        }
        match page["next_cursor"].as_str() {
            Some(c) => cursor = Some(c.to_owned()),
            None => return states,
        }
    }
}

async fn every_pair_arrives_with_a_stable_webhook_id_across_sigkills(backend: Backend) {
    let Some((database, _db)) = fresh_database(backend).await else {
        return;
    };
    let started = std::time::Instant::now();
    let mut receivers = Vec::new();
    for ip in RECEIVER_IPS {
        receivers.push(TestReceiver::start(ip).await);
    }
    let mut hookd = ServeProcess::start(&database, None).await;
    let mut subs = Vec::new();
    for rx in &receivers {
        let sub_id = hookd
            .subscribe_with(json!({"url": rx.url(), "event_types": ["*"]}))
            .await;
        subs.push(sub_id);
    }
    let pairs = EVENTS * subs.len();
    let received = |rs: &[TestReceiver]| rs.iter().map(TestReceiver::count).sum::<usize>();

    let target: Target = Arc::new(Mutex::new(hookd.url("")));
    let next = Arc::new(AtomicUsize::new(0));
    let accepted = Arc::new(AtomicUsize::new(0));
    let ids = Arc::new(Mutex::new(vec![None; EVENTS]));
    let posters: Vec<_> = (0..POSTERS)
        .map(|_| {
            tokio::spawn(post_events(
                target.clone(),
                next.clone(),
                accepted.clone(),
                ids.clone(),
            ))
        })
        .collect();

    // Kill while posting (and delivering), at about every KILL_EVERY posts.
    let mut kills = 0;
    let mut restart = |hookd: &mut ServeProcess| {
        hookd.kill();
        kills += 1;
        let database = database.clone();
        async move { ServeProcess::start(&database, None).await }
    };
    for k in 1..EVENTS / KILL_EVERY {
        let at = k * KILL_EVERY + rand::rng().random_range(0..KILL_EVERY / 5) - KILL_EVERY / 10;
        eventually_within(&format!("{at} accepted posts"), RUN_DEADLINE, || async {
            (accepted.load(Ordering::SeqCst) >= at).then_some(())
        })
        .await;
        hookd = restart(&mut hookd).await;
        *target.lock().unwrap() = hookd.url("");
    }
    for p in posters {
        p.await.unwrap();
    }
    let posting_done = received(&receivers);
    // Once more mid-delivery, if delivery has not caught up with posting.
    if posting_done < pairs {
        let at = posting_done + (pairs - posting_done) / 3;
        eventually_within(&format!("{at} webhooks received"), RUN_DEADLINE, || async {
            (received(&receivers) >= at).then_some(())
        })
        .await;
        hookd = restart(&mut hookd).await;
    }
    let kills = kills;
    assert!(kills >= 3, "the process was killed {kills} times");

    let ids: Vec<String> = ids
        .lock()
        .unwrap()
        .iter()
        .map(|i| i.clone().unwrap())
        .collect();
    let distinct: HashSet<&String> = ids.iter().collect();
    assert_eq!(distinct.len(), EVENTS, "one event per idempotency key");

    // Every pair arrives at least once.
    eventually_within(
        "every (event, subscription) pair to arrive",
        RUN_DEADLINE,
        || async {
            if received(&receivers) < pairs {
                return None;
            }
            receivers
                .iter()
                .all(|rx| {
                    let got: HashSet<String> = rx
                        .received()
                        .iter()
                        .map(|r| r.json()["event_id"].as_str().unwrap().to_owned())
                        .collect();
                    ids.iter().all(|id| got.contains(id))
                })
                .then_some(())
        },
    )
    .await;
    // And the store agrees: every delivery ends delivered, none elsewhere.
    for sub_id in &subs {
        eventually_within(
            &format!("{sub_id}'s deliveries all delivered"),
            RUN_DEADLINE,
            || async {
                let states = delivery_states(&hookd, sub_id).await;
                (states.get("delivered") == Some(&EVENTS) && states.len() == 1).then_some(())
            },
        )
        .await;
    }

    // Every copy of a pair carries the pair's one webhook-id.
    let mut duplicates = 0;
    for (rx, sub_id) in receivers.iter().zip(&subs) {
        let per_event = rx.webhook_ids_by_event();
        assert_eq!(per_event.len(), EVENTS, "no webhook for an unknown event");
        for (event_id, webhook_ids) in per_event {
            let expected = expected_webhook_id(&event_id, sub_id);
            assert!(
                webhook_ids.iter().all(|w| *w == expected),
                "{event_id} → {sub_id}: webhook-ids {webhook_ids:?}, expected {expected}"
            );
            duplicates += webhook_ids.len() - 1;
        }
    }
    let name = match backend {
        Backend::Sqlite => "sqlite",
        Backend::Postgres => "postgres",
    };
    eprintln!(
        "crash test ({name}): {pairs} pairs, {kills} kills, {duplicates} duplicates, {:.1}s",
        started.elapsed().as_secs_f64()
    );
}
