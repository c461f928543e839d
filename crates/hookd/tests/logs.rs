//! No secret and no token in any log output, and no plaintext secret in the
//! database.
//!
//! A test binary of its own: it installs a *global* subscriber that keeps
//! every event and span at TRACE (and `log` records, through `tracing-log`)
//! in a buffer. Global, because the application runs on tokio tasks on
//! other threads, where a thread-local default would see nothing; a binary
//! of its own, so no other test's output mixes in.
//!
//! The scenario runs over real HTTP: make a customer token, create
//! subscriptions (one with a secret given in the request), deliver, rotate
//! the secret, deliver again, fail authentication until locked out.

#[path = "it/helpers.rs"]
#[allow(dead_code, unused_imports, unused_macros)]
mod helpers;

use std::io::Write;
use std::sync::{Arc, Mutex};

use base64::Engine as _;
use serde_json::{Value, json};

use helpers::{Backend, TestReceiver, spawn_app};

/// Everything logged, as text.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Captured {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }
}

/// The forms a secret could leak in: its text, its base64 part, and the
/// key bytes as hex.
fn forms_of_secret(secret: &str) -> Vec<String> {
    let b64 = secret.strip_prefix("whsec_").unwrap();
    let key = base64::engine::general_purpose::STANDARD
        .decode(b64)
        .unwrap();
    vec![secret.to_owned(), b64.to_owned(), hex::encode(&key)]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_secret_or_token_in_any_log_output_nor_in_the_database() {
    let captured = Captured::default();
    let writer = captured.clone();
    tracing_subscriber::fmt()
        .with_max_level(tracing::Level::TRACE)
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .with_span_events(tracing_subscriber::fmt::format::FmtSpan::FULL)
        .try_init()
        .expect("this binary's only subscriber");

    let app = spawn_app(Backend::Sqlite).await.unwrap();
    let admin_token = app.token.clone();
    let receiver = TestReceiver::start("127.0.0.93").await;

    // A customer token, made over the API.
    let r = app.post("/tokens", &json!({ "customer_id": "acme" })).await;
    assert_eq!(r.status(), 201);
    let customer_token = r.json::<Value>().await.unwrap()["token"]
        .as_str()
        .unwrap()
        .to_owned();
    let as_customer = |method: reqwest::Method, path: &str, body: Option<Value>| {
        let mut req = app
            .client
            .request(method, app.url(path))
            .bearer_auth(&customer_token);
        if let Some(b) = body {
            req = req.json(&b);
        }
        async move {
            let r = req.send().await.unwrap();
            let status = r.status().as_u16();
            (status, r.json::<Value>().await.unwrap_or(Value::Null))
        }
    };

    // Subscriptions: one with a generated secret, one with a given one.
    let (status, sub) = as_customer(
        reqwest::Method::POST,
        "/subscriptions",
        Some(json!({ "url": receiver.url(), "event_types": ["invoice.*"] })),
    )
    .await;
    assert_eq!(status, 201, "{sub}");
    let sub_id = sub["sub_id"].as_str().unwrap().to_owned();
    let first_secret = sub["secret"].as_str().unwrap().to_owned();
    let given_secret = "whsec_Tm90QVJlYWxTZWNyZXRCdXRMb25nRW5vdWdoMTIzNA==";
    let (status, other) = as_customer(
        reqwest::Method::POST,
        "/subscriptions",
        Some(json!({ "url": receiver.url(), "event_types": ["user.*"], "secret": given_secret })),
    )
    .await;
    assert_eq!(status, 201, "{other}");
    assert_eq!(other["secret"], given_secret);

    // Deliver.
    let (status, v) = as_customer(
        reqwest::Method::POST,
        "/events",
        Some(json!({ "type": "invoice.paid", "payload": { "n": 1 } })),
    )
    .await;
    assert_eq!(status, 202, "{v}");
    let (status, v) = as_customer(
        reqwest::Method::POST,
        "/events",
        Some(json!({ "type": "user.created", "payload": { "n": 2 } })),
    )
    .await;
    assert_eq!(status, 202, "{v}");
    let got = receiver.wait_for(2).await;
    assert!(got.iter().any(|r| r.signed_by(&first_secret)));
    assert!(got.iter().any(|r| r.signed_by(given_secret)));

    // Rotate, and deliver under both secrets.
    let (status, rotated) = as_customer(
        reqwest::Method::POST,
        &format!("/subscriptions/{sub_id}/secret/rotate"),
        None,
    )
    .await;
    assert_eq!(status, 200, "{rotated}");
    let new_secret = rotated["secret"].as_str().unwrap().to_owned();
    let (status, v) = as_customer(
        reqwest::Method::POST,
        "/events",
        Some(json!({ "type": "invoice.paid", "payload": { "n": 3 } })),
    )
    .await;
    assert_eq!(status, 202, "{v}");
    let got = receiver.wait_for(3).await;
    assert!(got[2].signed_by(&new_secret) && got[2].signed_by(&first_secret));

    // The metrics, as a scraper sees them, after the deliveries and the rotation
    // (read before the failed authentications lock this address out).
    let metrics = app
        .client
        .get(app.url("/metrics"))
        .bearer_auth(&admin_token)
        .send()
        .await
        .unwrap();
    assert_eq!(metrics.status(), 200);
    let metrics = metrics.text().await.unwrap();
    assert!(metrics.contains("hookd_"), "the metrics were read");

    // Fail authentication: near misses of the real tokens, then until the
    // address is locked out (which shows the peer address reaches the
    // limiter through the real server).
    let near_miss = |t: &str| format!("{}x", &t[..t.len() - 1]);
    let wrong_tokens = [
        near_miss(&customer_token),
        near_miss(&admin_token),
        "hookd_0000000000000000000000000000000000000000000000000000000000000000".to_owned(),
    ];
    let mut statuses = Vec::new();
    for i in 0..hookd_api::limits::AUTH_FAILURE_BURST + 1 {
        let r = app
            .client
            .get(app.url("/subscriptions"))
            .bearer_auth(&wrong_tokens[i as usize % wrong_tokens.len()])
            .send()
            .await
            .unwrap();
        statuses.push(r.status().as_u16());
    }
    assert_eq!(statuses.last(), Some(&429), "{statuses:?}");
    assert!(
        statuses[..statuses.len() - 1].iter().all(|s| *s == 401),
        "{statuses:?}"
    );

    let database = app.database.clone();
    let _keep = app.stop().await;

    let logs = captured.text();
    assert!(
        logs.contains("subscription created") && logs.contains("TRACE"),
        "the capture works: {} bytes",
        logs.len()
    );
    let mut needles: Vec<(String, String)> = Vec::new();
    for (name, secret) in [
        ("the first secret", first_secret.as_str()),
        ("the given secret", given_secret),
        ("the rotated secret", new_secret.as_str()),
    ] {
        for form in forms_of_secret(secret) {
            needles.push((name.to_owned(), form));
        }
    }
    needles.push(("the admin token".into(), admin_token.clone()));
    needles.push(("the customer token".into(), customer_token.clone()));
    // The token's hex part alone, too (a hash is fine; the token is not).
    needles.push((
        "the customer token's random part".into(),
        customer_token.trim_start_matches("hookd_").to_owned(),
    ));
    for (i, t) in wrong_tokens.iter().enumerate() {
        needles.push((format!("wrong token {i}"), t.clone()));
    }
    for (name, needle) in &needles {
        assert!(
            !logs.contains(needle.as_str()),
            "{name} appears in the log output"
        );
        assert!(
            !metrics.contains(needle.as_str()),
            "{name} appears in /metrics"
        );
    }

    // The database files hold no plaintext secret, in any form: read raw,
    // bytes and all (main file, WAL and shared memory).
    let db_path = database.strip_prefix("sqlite:").unwrap();
    let dir = std::path::Path::new(db_path).parent().unwrap();
    // SQLite deletes the WAL and shared-memory files when the last
    // connection closes, which may happen while they are being read: a file
    // that vanished mid-read means its pages went into the main file, so the
    // whole set is read again until one read sees a consistent set.
    let read_all = || -> std::io::Result<Vec<u8>> {
        let mut raw = Vec::new();
        for name in ["hookd.db", "hookd.db-wal", "hookd.db-shm"] {
            match std::fs::read(dir.join(name)) {
                Ok(bytes) => raw.extend(bytes),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound && name != "hookd.db" => {
                    // Absent from the start is fine; re-check below.
                }
                Err(e) => return Err(e),
            }
        }
        Ok(raw)
    };
    let mut raw = read_all().unwrap();
    for _ in 0..10 {
        let again = read_all().unwrap();
        if again == raw {
            break;
        }
        raw = again;
    }
    assert!(!raw.is_empty());
    let contains = |needle: &[u8]| raw.windows(needle.len()).any(|w| w == needle);
    for secret in [first_secret.as_str(), given_secret, new_secret.as_str()] {
        let key = base64::engine::general_purpose::STANDARD
            .decode(secret.strip_prefix("whsec_").unwrap())
            .unwrap();
        for form in forms_of_secret(secret) {
            assert!(
                !contains(form.as_bytes()),
                "the database holds a secret in clear"
            );
        }
        assert!(!contains(&key), "the database holds a secret's key bytes");
    }
    assert!(
        !contains(customer_token.as_bytes()),
        "the database holds a token in clear"
    );
}
