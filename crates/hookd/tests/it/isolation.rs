//! Per-destination isolation, end to end: a hanging destination holds no
//! more than its cap, never slows the others, and once its circuit opens it
//! gets only probes.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hookd_domain::isolation::CircuitState;
use serde_json::json;

use crate::helpers::*;

crate::on_both_backends!(a_hanging_destination_is_contained_and_then_only_probed);

/// A destination that reads each request and never answers. It records,
/// for every request, when it arrived and how many were hanging then.
struct Hanging {
    addr: std::net::SocketAddr,
    arrivals: Arc<Mutex<Vec<(tokio::time::Instant, u32)>>>,
}

struct Leave(Arc<AtomicU32>);
impl Drop for Leave {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

async fn hanging(ip: &str) -> Hanging {
    let listener = tokio::net::TcpListener::bind((ip, 0)).await.unwrap();
    let addr = listener.local_addr().unwrap();
    let hanging = Arc::new(AtomicU32::new(0));
    let arrivals = Arc::new(Mutex::new(Vec::new()));
    let (h, a) = (hanging.clone(), arrivals.clone());
    let app = axum::Router::new().fallback(move || {
        let (h, a) = (h.clone(), a.clone());
        async move {
            let now_hanging = h.fetch_add(1, Ordering::SeqCst) + 1;
            a.lock()
                .unwrap()
                .push((tokio::time::Instant::now(), now_hanging));
            // Dropped when hookd gives up on the request and closes it.
            let _leave = Leave(h);
            std::future::pending::<()>().await;
        }
    });
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    Hanging { addr, arrivals }
}

async fn a_hanging_destination_is_contained_and_then_only_probed(backend: Backend) {
    const CAP: u32 = 5;
    let attempt_timeout = Duration::from_millis(700);
    let Some(app) = spawn_app_with(backend, |c| {
        c.attempt_timeout = attempt_timeout;
        c.admission.concurrency = CAP;
        // Short open periods so the test sees probes; the design's 30 s is
        // the default everywhere else.
        c.admission.breaker.base_backoff = Duration::from_millis(500);
        c.admission.breaker.max_backoff = Duration::from_secs(2);
        c.admission.rate_override = Some(10_000.0);
    })
    .await
    else {
        return;
    };
    let stuck = hanging("127.0.0.40").await;
    let healthy = [
        TestReceiver::start("127.0.0.41").await,
        TestReceiver::start("127.0.0.42").await,
        TestReceiver::start("127.0.0.43").await,
    ];
    // The hanging subscription retries quickly, so without a breaker it would
    // keep its cap full for the whole test.
    app.subscribe_with(json!({ "url": format!("http://{}/hook", stuck.addr), "event_types": ["*"], "retry_policy": { "base_delay_secs": 1, "max_delay_secs": 1 } }))
        .await;
    for r in &healthy {
        app.subscribe(&r.url(), &["*"]).await;
    }
    let events = 60;
    for i in 0..events {
        app.send_event("load.tick", json!({ "i": i })).await;
    }
    // The healthy destinations get everything while the hanging one hangs.
    for r in &healthy {
        r.wait_for(events).await;
    }
    let host = stuck.addr.ip().to_string();
    eventually("the hanging destination's circuit to open", || async {
        let s = app.admission.snapshot(&host)?;
        (s.circuit_state != CircuitState::Closed).then_some(())
    })
    .await;
    let opened_at = tokio::time::Instant::now();
    // Once open, it receives only probes: one request at a time. Wait for a
    // probe that started after the last pre-open attempt timed out.
    let settled = opened_at + attempt_timeout * 2;
    eventually("a probe after the circuit opened", || async {
        stuck
            .arrivals
            .lock()
            .unwrap()
            .iter()
            .any(|(at, _)| *at > settled)
            .then_some(())
    })
    .await;
    let arrivals = stuck.arrivals.lock().unwrap().clone();
    let max_hanging = arrivals.iter().map(|(_, n)| *n).max().unwrap();
    assert!(
        max_hanging <= CAP,
        "the hanging destination held {max_hanging} attempts, over its cap of {CAP}"
    );
    for (at, n) in arrivals.iter().filter(|(at, _)| *at > settled) {
        assert_eq!(
            *n,
            1,
            "after the circuit opened, only single probes arrive (one arrived {:?} after settling with {n} hanging)",
            *at - settled
        );
    }
    let total = arrivals.len();
    assert!(
        total < events,
        "the breaker stopped the retries: {total} attempts for {events} deliveries"
    );
    app.stop().await;
}
