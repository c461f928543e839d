//! The API over real HTTP on 127.0.0.1:0, against a real SQLite store in a
//! temp dir: one fresh database per test.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use hookd_api::{ApiConfig, AppState, hash_token, router, serve};
use hookd_domain::CustomerId;
use hookd_domain::destination::DestinationPolicy;
use hookd_store::NewToken;
use hookd_store_sqlite::SqliteStore;
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

const ADMIN: &str = "admin-token-for-tests";
const ACME: &str = "acme-token";
const GLOBEX: &str = "globex-token";
/// Small limits so the 413 tests stay small.
const MAX_PAYLOAD: usize = 2 * 1024;
const MAX_BODY: usize = 8 * 1024;

struct TestApp {
    base: String,
    http: reqwest::Client,
    wake: Arc<Notify>,
    shutdown: CancellationToken,
    server: tokio::task::JoinHandle<std::io::Result<()>>,
    /// The database: a temp dir, or a PostgreSQL schema dropped with it.
    _dir: Box<dyn std::any::Any + Send + Sync>,
}

async fn spawn_app() -> TestApp {
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::connect(&dir.path().join("hookd.db"))
        .await
        .unwrap();
    spawn_app_over(Arc::new(store), Box::new(dir)).await
}

/// The API over a fresh PostgreSQL schema; `None` (a skip) only outside CI
/// without a server.
async fn spawn_app_postgres() -> Option<TestApp> {
    let db = hookd_store_postgres::testing::fresh_schema().await?;
    let store =
        hookd_store_postgres::PgStore::connect(&db.url, hookd_store_postgres::PgOptions::default())
            .await
            .unwrap();
    Some(spawn_app_over(Arc::new(store), Box::new(db)).await)
}

async fn spawn_app_over(
    store: Arc<dyn hookd_store::Store>,
    dir: Box<dyn std::any::Any + Send + Sync>,
) -> TestApp {
    store.migrate().await.unwrap();
    for (token, customer) in [(ACME, "acme"), (GLOBEX, "globex")] {
        store
            .create_token(NewToken {
                token_hash: hash_token(token).to_vec(),
                customer_id: Some(CustomerId::parse(customer).unwrap()),
                label: None,
                expires_at: None,
            })
            .await
            .unwrap();
    }
    serve_over(store, dir).await
}

/// The API over `store` with the tokens in place: another node on a
/// database a first app has set up (migrating again is a no-op, as at every
/// node's start).
async fn serve_over(
    store: Arc<dyn hookd_store::Store>,
    dir: Box<dyn std::any::Any + Send + Sync>,
) -> TestApp {
    store.migrate().await.unwrap();
    let config = ApiConfig {
        admin_token_hash: Some(hash_token(ADMIN)),
        max_payload_bytes: MAX_PAYLOAD,
        max_body_bytes: MAX_BODY,
        ..ApiConfig::new(DestinationPolicy::PublicOnly)
    };
    let wake = Arc::new(Notify::new());
    let state = AppState::new(store, config, wake.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let shutdown = CancellationToken::new();
    let server = tokio::spawn(serve(listener, router(state), shutdown.clone()));
    TestApp {
        base,
        http: reqwest::Client::new(),
        wake,
        shutdown,
        server,
        _dir: dir,
    }
}

impl TestApp {
    /// Sends a request with `token` (if any) and a JSON body (if any);
    /// returns the status and the body parsed as JSON (`Null` when empty).
    async fn call(
        &self,
        method: Method,
        path: &str,
        token: Option<&str>,
        body: Option<Value>,
    ) -> (StatusCode, Value) {
        let mut req = self.http.request(method, format!("{}{path}", self.base));
        if let Some(t) = token {
            req = req.bearer_auth(t);
        }
        if let Some(b) = body {
            req = req.json(&b);
        }
        let resp = req.send().await.unwrap();
        read(resp).await
    }

    async fn raw(
        &self,
        method: Method,
        path: &str,
        content_type: Option<&str>,
        body: impl Into<reqwest::Body>,
    ) -> (StatusCode, Value) {
        let mut req = self
            .http
            .request(method, format!("{}{path}", self.base))
            .bearer_auth(ADMIN)
            .body(body);
        if let Some(ct) = content_type {
            req = req.header("content-type", ct);
        }
        read(req.send().await.unwrap()).await
    }

    async fn get(&self, path: &str, token: &str) -> (StatusCode, Value) {
        self.call(Method::GET, path, Some(token), None).await
    }

    async fn post(&self, path: &str, token: &str, body: Value) -> (StatusCode, Value) {
        self.call(Method::POST, path, Some(token), Some(body)).await
    }

    async fn patch(&self, path: &str, token: &str, body: Value) -> (StatusCode, Value) {
        self.call(Method::PATCH, path, Some(token), Some(body))
            .await
    }

    /// Creates a subscription as `token` and returns its id.
    async fn subscribe(&self, token: &str, event_types: &[&str]) -> String {
        let (status, body) = self
            .post(
                "/subscriptions",
                token,
                json!({"url": "https://hooks.example.com/in", "event_types": event_types}),
            )
            .await;
        assert_eq!(status, StatusCode::CREATED, "{body}");
        body["sub_id"].as_str().unwrap().to_owned()
    }

    /// Posts an event as `token` and returns its id.
    async fn publish(&self, token: &str, body: Value) -> String {
        let (status, resp) = self.post("/events", token, body).await;
        assert_eq!(status, StatusCode::ACCEPTED, "{resp}");
        resp["event_id"].as_str().unwrap().to_owned()
    }

    /// The subscriptions an event was fanned out to.
    async fn fanned_out_to(&self, event_id: &str) -> BTreeSet<String> {
        let (status, event) = self.get(&format!("/events/{event_id}"), ADMIN).await;
        assert_eq!(status, StatusCode::OK, "{event}");
        event["deliveries"]
            .as_array()
            .unwrap()
            .iter()
            .map(|d| d["sub_id"].as_str().unwrap().to_owned())
            .collect()
    }

    async fn stop(self) {
        self.shutdown.cancel();
        self.server.await.unwrap().unwrap();
    }
}

async fn read(resp: reqwest::Response) -> (StatusCode, Value) {
    let status = resp.status();
    let text = resp.text().await.unwrap();
    let body = if text.is_empty() {
        Value::Null
    } else {
        serde_json::from_str(&text)
            .unwrap_or_else(|e| panic!("response is not JSON ({e}): {text:?}"))
    };
    (status, body)
}

/// Asserts an error response: its status, its code, and words its message
/// must contain.
#[track_caller]
fn assert_error(got: &(StatusCode, Value), status: StatusCode, code: &str, words: &[&str]) {
    let (s, body) = got;
    assert_eq!(*s, status, "{body}");
    assert_eq!(body["error"]["code"], code, "{body}");
    let message = body["error"]["message"]
        .as_str()
        .unwrap_or_else(|| panic!("no message: {body}"));
    for w in words {
        assert!(
            message.contains(w),
            "message {message:?} should mention {w:?}"
        );
    }
}

fn set(ids: &[&String]) -> BTreeSet<String> {
    ids.iter().map(|s| (*s).clone()).collect()
}

#[tokio::test]
async fn healthz_answers_without_a_token() {
    let app = spawn_app().await;
    let (status, body) = app.call(Method::GET, "/healthz", None, None).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body, json!({"status": "ok"}));
    app.stop().await;
}

#[tokio::test]
async fn a_subscription_is_created_read_listed_changed_and_deleted() {
    let app = spawn_app().await;
    let (status, created) = app
        .post(
            "/subscriptions",
            ADMIN,
            json!({
                "url": "https://hooks.example.com/in",
                "event_types": ["invoice.paid", "user.*"],
                "ordered": true,
                "retry_policy": {"max_attempts": 5},
                "description": "billing",
                "customer_id": "acme",
            }),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{created}");
    let id = created["sub_id"].as_str().unwrap().to_owned();
    assert!(id.starts_with("sub_"));
    assert!(
        created["secret"].as_str().unwrap().starts_with("whsec_"),
        "a secret is generated when absent"
    );
    assert_eq!(created["url"], "https://hooks.example.com/in");
    assert_eq!(created["event_types"], json!(["invoice.paid", "user.*"]));
    assert_eq!(created["customer_id"], "acme");
    assert_eq!(created["ordered"], true);
    assert_eq!(created["retry_policy"], json!({"max_attempts": 5}));
    assert_eq!(created["state"], "active");
    assert_eq!(created["description"], "billing");
    assert_eq!(created["rate_limit"], Value::Null, "unset: adaptive");
    assert_eq!(
        created["max_concurrency"],
        Value::Null,
        "unset: the server-wide cap"
    );
    assert!(created["created_at"].is_string() && created["updated_at"].is_string());

    // The secret is shown at creation only.
    let (status, got) = app.get(&format!("/subscriptions/{id}"), ADMIN).await;
    assert_eq!(status, StatusCode::OK);
    assert!(got.get("secret").is_none(), "{got}");
    let mut without_secret = created.clone();
    without_secret.as_object_mut().unwrap().remove("secret");
    assert_eq!(got, without_secret);

    let (status, list) = app.get("/subscriptions", ADMIN).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(list["data"].as_array().unwrap().len(), 1);
    assert!(list["data"][0].get("secret").is_none());
    assert_eq!(list["next_cursor"], Value::Null);

    let (status, patched) = app
        .patch(
            &format!("/subscriptions/{id}"),
            ADMIN,
            json!({"state": "disabled", "description": null, "url": "https://other.example.com/x"}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{patched}");
    assert_eq!(patched["state"], "disabled");
    assert_eq!(patched["description"], Value::Null);
    assert_eq!(patched["url"], "https://other.example.com/x");
    assert_eq!(
        patched["event_types"],
        json!(["invoice.paid", "user.*"]),
        "fields not in the patch stay"
    );
    assert!(patched.get("secret").is_none());

    let (status, body) = app
        .call(
            Method::DELETE,
            &format!("/subscriptions/{id}"),
            Some(ADMIN),
            None,
        )
        .await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    assert_eq!(body, Value::Null);
    assert_error(
        &app.get(&format!("/subscriptions/{id}"), ADMIN).await,
        StatusCode::NOT_FOUND,
        "not_found",
        &["subscription"],
    );
    assert_error(
        &app.call(
            Method::DELETE,
            &format!("/subscriptions/{id}"),
            Some(ADMIN),
            None,
        )
        .await,
        StatusCode::NOT_FOUND,
        "not_found",
        &[],
    );
    app.stop().await;
}

#[tokio::test]
async fn a_given_secret_is_kept_and_returned_once() {
    let app = spawn_app().await;
    let secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
    let (status, created) = app
        .post(
            "/subscriptions",
            ADMIN,
            json!({"url": "https://hooks.example.com/", "event_types": ["*"], "secret": secret}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{created}");
    assert_eq!(created["secret"], secret);
    app.stop().await;
}

#[tokio::test]
async fn an_explicit_rate_limit_is_set_changed_and_cleared() {
    let app = spawn_app().await;
    let (status, created) = app
        .post(
            "/subscriptions",
            ADMIN,
            json!({"url": "https://hooks.example.com/in", "event_types": ["*"], "rate_limit": 25}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{created}");
    assert_eq!(created["rate_limit"], 25);
    let path = format!("/subscriptions/{}", created["sub_id"].as_str().unwrap());
    assert_eq!(app.get(&path, ADMIN).await.1["rate_limit"], 25);
    assert_eq!(
        app.get("/subscriptions", ADMIN).await.1["data"][0]["rate_limit"],
        25
    );

    let (status, changed) = app.patch(&path, ADMIN, json!({"rate_limit": 10_000})).await;
    assert_eq!(status, StatusCode::OK, "{changed}");
    assert_eq!(changed["rate_limit"], 10_000);
    let (_, other) = app.patch(&path, ADMIN, json!({"description": "x"})).await;
    assert_eq!(other["rate_limit"], 10_000, "a patch without it leaves it");

    let (status, cleared) = app.patch(&path, ADMIN, json!({"rate_limit": null})).await;
    assert_eq!(status, StatusCode::OK, "{cleared}");
    assert_eq!(cleared["rate_limit"], Value::Null, "null clears it");
    assert_eq!(cleared["description"], "x");
    assert_eq!(app.get(&path, ADMIN).await.1["rate_limit"], Value::Null);

    let (_, set) = app.patch(&path, ADMIN, json!({"rate_limit": 1})).await;
    assert_eq!(set["rate_limit"], 1, "the smallest allowed");
    app.stop().await;
}

#[tokio::test]
async fn an_explicit_max_concurrency_is_set_changed_and_cleared() {
    let app = spawn_app().await;
    let (status, created) = app
        .post(
            "/subscriptions",
            ADMIN,
            json!({"url": "https://hooks.example.com/in", "event_types": ["*"], "max_concurrency": 4}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{created}");
    assert_eq!(created["max_concurrency"], 4);
    assert_eq!(created["rate_limit"], Value::Null, "a separate field");
    let path = format!("/subscriptions/{}", created["sub_id"].as_str().unwrap());
    assert_eq!(app.get(&path, ADMIN).await.1["max_concurrency"], 4);
    assert_eq!(
        app.get("/subscriptions", ADMIN).await.1["data"][0]["max_concurrency"],
        4
    );

    let (status, changed) = app
        .patch(&path, ADMIN, json!({"max_concurrency": 1_000}))
        .await;
    assert_eq!(status, StatusCode::OK, "{changed}");
    assert_eq!(changed["max_concurrency"], 1_000);
    let (_, other) = app
        .patch(&path, ADMIN, json!({"description": "x", "rate_limit": 7}))
        .await;
    assert_eq!(
        other["max_concurrency"], 1_000,
        "a patch without it leaves it"
    );
    assert_eq!(other["rate_limit"], 7);

    let (status, cleared) = app
        .patch(&path, ADMIN, json!({"max_concurrency": null}))
        .await;
    assert_eq!(status, StatusCode::OK, "{cleared}");
    assert_eq!(cleared["max_concurrency"], Value::Null, "null clears it");
    assert_eq!(cleared["rate_limit"], 7, "and only it");
    assert_eq!(cleared["description"], "x");
    assert_eq!(
        app.get(&path, ADMIN).await.1["max_concurrency"],
        Value::Null
    );

    let (_, set) = app.patch(&path, ADMIN, json!({"max_concurrency": 1})).await;
    assert_eq!(set["max_concurrency"], 1, "the smallest allowed");
    app.stop().await;
}

#[tokio::test]
async fn subscriptions_are_listed_in_pages() {
    let app = spawn_app().await;
    let mut ids = Vec::new();
    for _ in 0..5 {
        ids.push(app.subscribe(ADMIN, &["*"]).await);
    }
    let (status, first) = app.get("/subscriptions?limit=2", ADMIN).await;
    assert_eq!(status, StatusCode::OK, "{first}");
    let page: Vec<&str> = first["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["sub_id"].as_str().unwrap())
        .collect();
    assert_eq!(page, [ids[0].as_str(), ids[1].as_str()]);
    assert_eq!(first["next_cursor"], ids[1].as_str());

    let (_, second) = app
        .get(&format!("/subscriptions?limit=2&cursor={}", ids[1]), ADMIN)
        .await;
    assert_eq!(second["data"].as_array().unwrap().len(), 2);
    let (_, last) = app
        .get(&format!("/subscriptions?limit=2&cursor={}", ids[3]), ADMIN)
        .await;
    assert_eq!(last["data"].as_array().unwrap().len(), 1);
    assert_eq!(last["next_cursor"], Value::Null);
    app.stop().await;
}

#[tokio::test]
async fn an_event_fans_out_to_exactly_the_matching_subscriptions() {
    let app = spawn_app().await;
    let exact = app.subscribe(ADMIN, &["invoice.paid"]).await;
    let prefix = app.subscribe(ADMIN, &["invoice.*"]).await;
    let all = app.subscribe(ADMIN, &["*"]).await;
    let _other = app.subscribe(ADMIN, &["user.created"]).await;
    let acme = app.subscribe(ACME, &["invoice.*"]).await;
    let globex = app.subscribe(GLOBEX, &["*"]).await;

    let evt = app
        .publish(
            ADMIN,
            json!({"type": "invoice.paid", "payload": {"amount": 10}}),
        )
        .await;
    assert!(evt.starts_with("evt_"));
    assert_eq!(
        app.fanned_out_to(&evt).await,
        set(&[&exact, &prefix, &all, &acme, &globex])
    );
    // The dispatcher was woken.
    tokio::time::timeout(Duration::from_secs(5), app.wake.notified())
        .await
        .expect("ingest notifies the dispatcher");

    let evt = app
        .publish(
            ADMIN,
            json!({"type": "invoice.refund.partial", "payload": null}),
        )
        .await;
    assert_eq!(
        app.fanned_out_to(&evt).await,
        set(&[&prefix, &all, &acme, &globex])
    );

    // An event for a customer reaches only that customer's subscriptions.
    let evt = app
        .publish(
            ADMIN,
            json!({"type": "invoice.paid", "payload": {}, "customer_id": "acme"}),
        )
        .await;
    assert_eq!(app.fanned_out_to(&evt).await, set(&[&acme]));

    // A customer's events are that customer's, whatever it matches.
    let evt = app
        .publish(GLOBEX, json!({"type": "invoice.paid", "payload": 1}))
        .await;
    assert_eq!(app.fanned_out_to(&evt).await, set(&[&globex]));
    let (_, event) = app.get(&format!("/events/{evt}"), GLOBEX).await;
    assert_eq!(event["customer_id"], "globex");

    // Only the wildcards match a type nobody names.
    let evt = app
        .publish(ADMIN, json!({"type": "order.shipped", "payload": [1, 2]}))
        .await;
    assert_eq!(app.fanned_out_to(&evt).await, set(&[&all, &globex]));
    // An event nobody listens to is still accepted.
    let evt = app
        .publish(ACME, json!({"type": "order.shipped", "payload": {}}))
        .await;
    assert!(app.fanned_out_to(&evt).await.is_empty());
    app.stop().await;
}

#[tokio::test]
async fn an_event_is_read_back_with_its_payload_byte_for_byte() {
    let app = spawn_app().await;
    let sub = app.subscribe(ADMIN, &["*"]).await;
    let payload_text = r#"{"b" : 1.50,  "a":[ true,null ], "u":"\u00e9"}"#;
    let body = format!(r#"{{"type":"a.b","payload":{payload_text},"idempotency_key":"k-1"}}"#);
    let (status, accepted) = app
        .raw(Method::POST, "/events", Some("application/json"), body)
        .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{accepted}");
    let evt = accepted["event_id"].as_str().unwrap();

    let resp = app
        .http
        .get(format!("{}/events/{evt}", app.base))
        .bearer_auth(ADMIN)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    let text = resp.text().await.unwrap();
    assert!(
        text.contains(payload_text),
        "payload must be returned as sent: {text}"
    );
    let event: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(event["event_id"], evt);
    assert_eq!(event["type"], "a.b");
    assert_eq!(event["idempotency_key"], "k-1");
    assert_eq!(event["customer_id"], Value::Null);
    assert!(
        event["payload"].is_object(),
        "payload is JSON, not a string"
    );
    let deliveries = event["deliveries"].as_array().unwrap();
    assert_eq!(deliveries.len(), 1);
    let d = &deliveries[0];
    assert_eq!(d["sub_id"], sub.as_str());
    assert_eq!(d["event_id"], evt);
    assert_eq!(d["event_type"], "a.b");
    assert_eq!(d["destination_host"], "hooks.example.com");
    assert_eq!(d["state"], "pending");
    assert_eq!(d["attempt"], 0);
    assert_eq!(d["attempts"], json!([]));
    for field in [
        "delivery_id",
        "next_attempt_at",
        "last_status",
        "last_error",
        "created_at",
        "updated_at",
    ] {
        assert!(d.get(field).is_some(), "delivery lacks {field}: {d}");
    }

    // The same delivery by id, and in its subscription's listing.
    let id = d["delivery_id"].as_str().unwrap();
    let (status, one) = app.get(&format!("/deliveries/{id}"), ADMIN).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(&one, d);
    let (status, page) = app
        .get(&format!("/subscriptions/{sub}/deliveries"), ADMIN)
        .await;
    assert_eq!(status, StatusCode::OK, "{page}");
    assert_eq!(page["data"], json!([d]));
    assert_eq!(page["next_cursor"], Value::Null);
    app.stop().await;
}

#[tokio::test]
async fn deliveries_are_filtered_and_paged() {
    let app = spawn_app().await;
    let sub = app.subscribe(ADMIN, &["*"]).await;
    for t in ["a.one", "a.two", "a.one"] {
        app.publish(ADMIN, json!({"type": t, "payload": {}})).await;
    }
    let path = format!("/subscriptions/{sub}/deliveries");
    let (_, all) = app.get(&path, ADMIN).await;
    assert_eq!(all["data"].as_array().unwrap().len(), 3);
    let (_, ones) = app
        .get(&format!("{path}?event_type=a.one&status=pending"), ADMIN)
        .await;
    assert_eq!(ones["data"].as_array().unwrap().len(), 2);
    let (_, none) = app.get(&format!("{path}?status=delivered"), ADMIN).await;
    assert_eq!(none["data"], json!([]));
    let (_, future) = app
        .get(&format!("{path}?since=2999-01-01T00:00:00Z"), ADMIN)
        .await;
    assert_eq!(future["data"], json!([]));
    let (_, past) = app
        .get(&format!("{path}?until=2000-01-01T00:00:00%2B01:00"), ADMIN)
        .await;
    assert_eq!(past["data"], json!([]));

    let (_, first) = app.get(&format!("{path}?limit=2"), ADMIN).await;
    assert_eq!(first["data"].as_array().unwrap().len(), 2);
    let cursor = first["next_cursor"].as_str().unwrap();
    assert_eq!(cursor, first["data"][1]["delivery_id"].as_str().unwrap());
    let (_, second) = app
        .get(&format!("{path}?limit=2&cursor={cursor}"), ADMIN)
        .await;
    assert_eq!(second["data"].as_array().unwrap().len(), 1);
    assert_eq!(second["next_cursor"], Value::Null);

    assert_error(
        &app.get(&format!("{path}?status=lost"), ADMIN).await,
        StatusCode::BAD_REQUEST,
        "bad_request",
        &["status"],
    );
    assert_error(
        &app.get(&format!("{path}?since=yesterday"), ADMIN).await,
        StatusCode::BAD_REQUEST,
        "bad_request",
        &["since"],
    );
    assert_error(
        &app.get(&format!("{path}?limit=0"), ADMIN).await,
        StatusCode::BAD_REQUEST,
        "bad_request",
        &["limit"],
    );
    assert_error(
        &app.get(&format!("{path}?cursor=evt_1"), ADMIN).await,
        StatusCode::BAD_REQUEST,
        "bad_request",
        &["cursor"],
    );
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_repeated_idempotency_key_returns_the_same_event_and_no_new_deliveries() {
    let app = spawn_app().await;
    let sub = app.subscribe(ADMIN, &["*"]).await;
    let body = json!({"type": "a.b", "payload": {"n": 1}, "idempotency_key": "once"});
    let first = app.publish(ADMIN, body.clone()).await;
    let again = app.publish(ADMIN, body).await;
    assert_eq!(first, again);

    // Twenty at once, with a fresh key: exactly one event, one delivery.
    let body = json!({"type": "a.b", "payload": {"n": 2}, "idempotency_key": "burst"});
    let posts = (0..20).map(|_| app.publish(ADMIN, body.clone()));
    let ids: BTreeSet<String> = futures::future::join_all(posts).await.into_iter().collect();
    assert_eq!(ids.len(), 1, "{ids:?}");

    let (_, page) = app
        .get(&format!("/subscriptions/{sub}/deliveries"), ADMIN)
        .await;
    let events: Vec<&str> = page["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["event_id"].as_str().unwrap())
        .collect();
    assert_eq!(events.len(), 2, "{page}");
    assert!(events.contains(&first.as_str()));
    assert!(events.contains(&ids.first().unwrap().as_str()));
    app.stop().await;
}

/// Concurrent posts are committed together (the group committer); each
/// still gets exactly its own answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_posts_are_each_accepted_once_with_repeated_keys_answered_by_the_original() {
    concurrent_posts_each_get_their_own_answer(spawn_app().await).await;
}

/// The same on PostgreSQL: its batched `unnest` inserts and key lookups
/// answer each post as SQLite's do.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_posts_on_postgres_are_each_accepted_once() {
    let Some(app) = spawn_app_postgres().await else {
        return;
    };
    concurrent_posts_each_get_their_own_answer(app).await;
}

async fn concurrent_posts_each_get_their_own_answer(app: TestApp) {
    let app = Arc::new(app);
    let subs = [
        app.subscribe(ADMIN, &["*"]).await,
        app.subscribe(ADMIN, &["order.*"]).await,
    ];
    // 200 at once: 100 over 25 keys (4 posts each), 50 with keys of their
    // own, 50 without a key. So 125 events, each fanned out to both.
    let key_of = |i: usize| match i {
        0..100 => Some(format!("shared-{}", i % 25)),
        100..150 => Some(format!("own-{i}")),
        _ => None,
    };
    let posts = (0..200).map(|i| {
        let app = app.clone();
        let key = key_of(i);
        tokio::spawn(async move {
            let mut body = json!({"type": "order.created", "payload": {"n": i}});
            if let Some(key) = &key {
                body["idempotency_key"] = json!(key);
            }
            (key, app.publish(ADMIN, body).await)
        })
    });
    let answers: Vec<(Option<String>, String)> = futures::future::join_all(posts)
        .await
        .into_iter()
        .map(Result::unwrap)
        .collect();

    // Every post of one key got one id, and that event holds the key.
    let mut by_key: std::collections::BTreeMap<String, BTreeSet<String>> = Default::default();
    for (key, id) in &answers {
        if let Some(key) = key {
            by_key.entry(key.clone()).or_default().insert(id.clone());
        }
    }
    assert_eq!(by_key.len(), 75);
    for (key, ids) in &by_key {
        assert_eq!(ids.len(), 1, "posts of {key} got {ids:?}");
        let (status, event) = app
            .get(&format!("/events/{}", ids.first().unwrap()), ADMIN)
            .await;
        assert_eq!(status, StatusCode::OK, "{event}");
        assert_eq!(event["idempotency_key"], key.as_str());
    }
    let events: BTreeSet<&String> = answers.iter().map(|(_, id)| id).collect();
    assert_eq!(events.len(), 125, "one event per key and per keyless post");
    for id in &events {
        assert_eq!(app.fanned_out_to(id).await, set(&[&subs[0], &subs[1]]));
    }
    // And nothing besides: each subscription has exactly those deliveries.
    for sub in &subs {
        let (status, page) = app
            .get(&format!("/subscriptions/{sub}/deliveries?limit=250"), ADMIN)
            .await;
        assert_eq!(status, StatusCode::OK, "{page}");
        assert_eq!(page["next_cursor"], Value::Null);
        let delivered_events: BTreeSet<&str> = page["data"]
            .as_array()
            .unwrap()
            .iter()
            .map(|d| d["event_id"].as_str().unwrap())
            .collect();
        assert_eq!(page["data"].as_array().unwrap().len(), 125, "{sub}");
        assert_eq!(
            delivered_events,
            events.iter().map(|id| id.as_str()).collect::<BTreeSet<_>>()
        );
    }
    Arc::into_inner(app).unwrap().stop().await;
}

#[tokio::test]
async fn changing_a_subscriptions_event_types_changes_fan_out_at_once() {
    let app = spawn_app().await;
    let sub = app.subscribe(ADMIN, &["invoice.paid"]).await;
    let evt = app
        .publish(ADMIN, json!({"type": "user.created", "payload": {}}))
        .await;
    assert!(app.fanned_out_to(&evt).await.is_empty());

    let (status, body) = app
        .patch(
            &format!("/subscriptions/{sub}"),
            ADMIN,
            json!({"event_types": ["user.*"]}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let evt = app
        .publish(ADMIN, json!({"type": "user.created", "payload": {}}))
        .await;
    assert_eq!(app.fanned_out_to(&evt).await, set(&[&sub]));
    let evt = app
        .publish(ADMIN, json!({"type": "invoice.paid", "payload": {}}))
        .await;
    assert!(app.fanned_out_to(&evt).await.is_empty());

    // A deleted subscription stops matching.
    app.call(
        Method::DELETE,
        &format!("/subscriptions/{sub}"),
        Some(ADMIN),
        None,
    )
    .await;
    let evt = app
        .publish(ADMIN, json!({"type": "user.created", "payload": {}}))
        .await;
    assert!(app.fanned_out_to(&evt).await.is_empty());
    app.stop().await;
}

/// A node matches an event against its cached fan-out index only if the
/// subscription generation, read after the event arrived, is the one the
/// index was built from. Here a subscription created through node A must
/// catch the next event posted through node B, whose index predates it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subscription_created_through_one_node_catches_the_next_event_on_another() {
    let Some(db) = hookd_store_postgres::testing::fresh_schema().await else {
        return;
    };
    let url = db.url.clone();
    // Both nodes open the secrets with one key, as a deployment's nodes do.
    let key = hookd_store::crypto::EncryptionKey::generate();
    let connect = || async {
        let options = hookd_store_postgres::PgOptions {
            keyring: hookd_store::crypto::Keyring::new(key.clone()),
            ..hookd_store_postgres::PgOptions::default()
        };
        let store: Arc<dyn hookd_store::Store> = Arc::new(
            hookd_store_postgres::PgStore::connect(&url, options)
                .await
                .unwrap(),
        );
        store
    };
    let a = spawn_app_over(connect().await, Box::new(db)).await;
    let b = serve_over(connect().await, Box::new(())).await;
    // B builds its index: no subscription yet.
    let before = b
        .publish(ADMIN, json!({"type": "user.created", "payload": {}}))
        .await;
    assert!(b.fanned_out_to(&before).await.is_empty());

    let sub = a.subscribe(ADMIN, &["user.*"]).await;
    let after = b
        .publish(ADMIN, json!({"type": "user.created", "payload": {}}))
        .await;
    assert_eq!(b.fanned_out_to(&after).await, set(&[&sub]));
    b.stop().await;
    a.stop().await;
}

#[tokio::test]
async fn a_customer_token_sees_only_its_own_records() {
    let app = spawn_app().await;
    let (status, mine) = app
        .post(
            "/subscriptions",
            ACME,
            json!({"url": "https://a.example.com/", "event_types": ["*"]}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED);
    assert_eq!(
        mine["customer_id"], "acme",
        "a customer's subscription is its own"
    );
    let mine = mine["sub_id"].as_str().unwrap().to_owned();
    let theirs = app.subscribe(GLOBEX, &["*"]).await;
    let admins = app.subscribe(ADMIN, &["*"]).await;

    assert_error(
        &app.post(
            "/subscriptions",
            ACME,
            json!({"url": "https://a.example.com/", "event_types": ["*"], "customer_id": "globex"}),
        )
        .await,
        StatusCode::UNPROCESSABLE_ENTITY,
        "validation_failed",
        &["customer_id"],
    );

    assert_eq!(
        app.get(&format!("/subscriptions/{mine}"), ACME).await.0,
        StatusCode::OK
    );
    for other in [&theirs, &admins] {
        let sub = format!("/subscriptions/{other}");
        assert_error(
            &app.get(&sub, ACME).await,
            StatusCode::NOT_FOUND,
            "not_found",
            &[],
        );
        assert_error(
            &app.patch(&sub, ACME, json!({"ordered": true})).await,
            StatusCode::NOT_FOUND,
            "not_found",
            &[],
        );
        assert_error(
            &app.call(Method::DELETE, &sub, Some(ACME), None).await,
            StatusCode::NOT_FOUND,
            "not_found",
            &[],
        );
        assert_error(
            &app.get(&format!("{sub}/deliveries"), ACME).await,
            StatusCode::NOT_FOUND,
            "not_found",
            &[],
        );
    }
    // Still there for their owners.
    assert_eq!(
        app.get(&format!("/subscriptions/{theirs}"), GLOBEX).await.0,
        StatusCode::OK
    );

    let (_, list) = app.get("/subscriptions", ACME).await;
    let listed: Vec<&str> = list["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["sub_id"].as_str().unwrap())
        .collect();
    assert_eq!(listed, [mine.as_str()]);
    let (_, list) = app.get("/subscriptions?customer_id=globex", ACME).await;
    assert_eq!(list["data"], json!([]));
    let (_, list) = app.get("/subscriptions", ADMIN).await;
    assert_eq!(list["data"].as_array().unwrap().len(), 3);

    // Events and deliveries of another customer are not found either.
    let evt = app
        .publish(GLOBEX, json!({"type": "a.b", "payload": {}}))
        .await;
    assert_error(
        &app.get(&format!("/events/{evt}"), ACME).await,
        StatusCode::NOT_FOUND,
        "not_found",
        &["event"],
    );
    let (_, event) = app.get(&format!("/events/{evt}"), GLOBEX).await;
    let delivery = event["deliveries"][0]["delivery_id"].as_str().unwrap();
    assert_error(
        &app.get(&format!("/deliveries/{delivery}"), ACME).await,
        StatusCode::NOT_FOUND,
        "not_found",
        &["delivery"],
    );
    assert_eq!(
        app.get(&format!("/deliveries/{delivery}"), GLOBEX).await.0,
        StatusCode::OK
    );
    assert_error(
        &app.post(
            "/events",
            ACME,
            json!({"type": "a.b", "payload": {}, "customer_id": "globex"}),
        )
        .await,
        StatusCode::UNPROCESSABLE_ENTITY,
        "validation_failed",
        &["customer_id"],
    );
    app.stop().await;
}

#[tokio::test]
async fn requests_without_a_known_token_are_unauthorized() {
    let app = spawn_app().await;
    for token in [None, Some("wrong")] {
        for (method, path) in [
            (Method::GET, "/subscriptions"),
            (Method::POST, "/events"),
            (Method::GET, "/deliveries/x"),
        ] {
            let got = app.call(method, path, token, None).await;
            assert_error(&got, StatusCode::UNAUTHORIZED, "unauthorized", &[]);
        }
    }
    let resp = app
        .http
        .get(format!("{}/subscriptions", app.base))
        .header("authorization", "Basic abc")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::UNAUTHORIZED);
    assert_eq!(resp.headers()["www-authenticate"], "Bearer");
    app.stop().await;
}

#[tokio::test]
async fn malformed_requests_are_400_naming_the_field() {
    let app = spawn_app().await;
    let cases = [
        (json!({"event_types": ["*"]}), "url"),
        (json!({"url": "https://x.example.com/"}), "event_types"),
        (json!({"url": 5, "event_types": ["*"]}), "url"),
        (
            json!({"url": "https://x.example.com/", "event_types": "*"}),
            "event_types",
        ),
        (
            json!({"url": "https://x.example.com/", "event_types": ["*"], "colour": "red"}),
            "colour",
        ),
        (
            json!({"url": "https://x.example.com/", "event_types": ["*"], "ordered": "yes"}),
            "ordered",
        ),
        (
            json!({"url": "https://x.example.com/", "event_types": ["*"], "retry_policy": {"max_attempts": -1}}),
            "retry_policy.max_attempts",
        ),
        (
            json!({"url": "https://x.example.com/", "event_types": ["*"], "retry_policy": {"tries": 3}}),
            "tries",
        ),
        // Not a number at all: a wrong JSON type, like any other field's.
        (
            json!({"url": "https://x.example.com/", "event_types": ["*"], "rate_limit": "10"}),
            "rate_limit",
        ),
        (
            json!({"url": "https://x.example.com/", "event_types": ["*"], "rate_limit": [10]}),
            "rate_limit",
        ),
        (
            json!({"url": "https://x.example.com/", "event_types": ["*"], "max_concurrency": "10"}),
            "max_concurrency",
        ),
        (
            json!({"url": "https://x.example.com/", "event_types": ["*"], "max_concurrency": {"n": 10}}),
            "max_concurrency",
        ),
    ];
    for (body, field) in cases {
        let got = app.post("/subscriptions", ADMIN, body.clone()).await;
        assert_error(&got, StatusCode::BAD_REQUEST, "bad_request", &[field]);
    }
    assert_error(
        &app.post("/events", ADMIN, json!({"type": "a.b"})).await,
        StatusCode::BAD_REQUEST,
        "bad_request",
        &["payload"],
    );
    assert_error(
        &app.post(
            "/events",
            ADMIN,
            json!({"type": "a.b", "payload": 1, "idempotency_key": 7}),
        )
        .await,
        StatusCode::BAD_REQUEST,
        "bad_request",
        &["idempotency_key"],
    );
    let sub = app.subscribe(ADMIN, &["*"]).await;
    assert_error(
        &app.patch(
            &format!("/subscriptions/{sub}"),
            ADMIN,
            json!({"secret": "whsec_x"}),
        )
        .await,
        StatusCode::BAD_REQUEST,
        "bad_request",
        &["secret"],
    );
    assert_error(
        &app.patch(
            &format!("/subscriptions/{sub}"),
            ADMIN,
            json!({"rate_limit": true}),
        )
        .await,
        StatusCode::BAD_REQUEST,
        "bad_request",
        &["rate_limit"],
    );
    assert_error(
        &app.patch(
            &format!("/subscriptions/{sub}"),
            ADMIN,
            json!({"max_concurrency": "3"}),
        )
        .await,
        StatusCode::BAD_REQUEST,
        "bad_request",
        &["max_concurrency"],
    );

    // Not JSON at all, trailing garbage, an empty body.
    for text in ["{\"url\": ", "{} {}", ""] {
        let got = app
            .raw(
                Method::POST,
                "/subscriptions",
                Some("application/json"),
                text,
            )
            .await;
        assert_error(&got, StatusCode::BAD_REQUEST, "bad_request", &["JSON"]);
    }

    // Query parameters.
    assert_error(
        &app.get("/subscriptions?limit=abc", ADMIN).await,
        StatusCode::BAD_REQUEST,
        "bad_request",
        &["limit"],
    );
    assert_error(
        &app.get("/subscriptions?limit=251", ADMIN).await,
        StatusCode::BAD_REQUEST,
        "bad_request",
        &["limit"],
    );
    assert_error(
        &app.get("/subscriptions?cursor=nope", ADMIN).await,
        StatusCode::BAD_REQUEST,
        "bad_request",
        &["cursor"],
    );
    assert_error(
        &app.get("/subscriptions?customer_id=a%20b", ADMIN).await,
        StatusCode::BAD_REQUEST,
        "bad_request",
        &["customer_id"],
    );
    assert_error(
        &app.get("/subscriptions?sort=asc", ADMIN).await,
        StatusCode::BAD_REQUEST,
        "bad_request",
        &["sort"],
    );
    assert_error(
        &app.get("/subscriptions?limit=1&limit=2", ADMIN).await,
        StatusCode::BAD_REQUEST,
        "bad_request",
        &["limit"],
    );
    app.stop().await;
}

#[tokio::test]
async fn a_body_that_is_not_json_is_415() {
    let app = spawn_app().await;
    let body = r#"{"url": "https://x.example.com/", "event_types": ["*"]}"#;
    for ct in [
        Some("text/plain"),
        None,
        Some("application/x-www-form-urlencoded"),
    ] {
        let got = app.raw(Method::POST, "/subscriptions", ct, body).await;
        assert_error(
            &got,
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "unsupported_media_type",
            &["JSON"],
        );
    }
    let got = app
        .raw(
            Method::POST,
            "/subscriptions",
            Some("application/json; charset=utf-8"),
            body,
        )
        .await;
    assert_eq!(got.0, StatusCode::CREATED, "{}", got.1);
    app.stop().await;
}

#[tokio::test]
async fn too_large_bodies_and_payloads_are_413() {
    let app = spawn_app().await;
    let big = "x".repeat(MAX_BODY);
    let got = app
        .post("/events", ADMIN, json!({"type": "a.b", "payload": big}))
        .await;
    assert_error(
        &got,
        StatusCode::PAYLOAD_TOO_LARGE,
        "payload_too_large",
        &[&MAX_BODY.to_string()],
    );

    // Without a Content-Length: the body is streamed and cut off at the limit.
    let chunks: Vec<Result<Vec<u8>, std::io::Error>> = vec![
        Ok(b"{\"type\":\"a.b\",\"payload\":\"".to_vec()),
        Ok(vec![b'y'; MAX_BODY]),
    ];
    let stream = reqwest::Body::wrap_stream(futures::stream::iter(chunks));
    let got = app
        .raw(Method::POST, "/events", Some("application/json"), stream)
        .await;
    assert_error(
        &got,
        StatusCode::PAYLOAD_TOO_LARGE,
        "payload_too_large",
        &[],
    );

    let payload = "p".repeat(MAX_PAYLOAD);
    let got = app
        .post("/events", ADMIN, json!({"type": "a.b", "payload": payload}))
        .await;
    assert_error(
        &got,
        StatusCode::PAYLOAD_TOO_LARGE,
        "payload_too_large",
        &["payload", &MAX_PAYLOAD.to_string()],
    );
    // Just under the limit is fine (the limit counts the JSON text, quotes included).
    let payload = "p".repeat(MAX_PAYLOAD - 2);
    assert_eq!(
        app.post("/events", ADMIN, json!({"type": "a.b", "payload": payload}))
            .await
            .0,
        StatusCode::ACCEPTED
    );
    app.stop().await;
}

#[tokio::test]
async fn well_formed_but_invalid_values_are_422_naming_the_field() {
    let app = spawn_app().await;
    let sub = |extra: Value| {
        let mut body = json!({"url": "https://x.example.com/", "event_types": ["*"]});
        body.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        body
    };
    let many: Vec<String> = (0..65).map(|i| format!("t{i}")).collect();
    let cases = [
        (sub(json!({"url": "ftp://x.example.com/"})), "url"),
        (sub(json!({"url": "not a url"})), "url"),
        (sub(json!({"url": "http://127.0.0.1:9/"})), "url"),
        (sub(json!({"url": "http://169.254.169.254/latest"})), "url"),
        (sub(json!({"event_types": []})), "event_types"),
        (sub(json!({"event_types": many})), "event_types"),
        (sub(json!({"event_types": ["ok", "a*b"]})), "event_types[1]"),
        (sub(json!({"customer_id": "has space"})), "customer_id"),
        (
            sub(json!({"retry_policy": {"max_attempts": 0}})),
            "retry_policy.max_attempts",
        ),
        (sub(json!({"secret": "hunter2"})), "secret"),
        (sub(json!({"description": "d".repeat(2000)})), "description"),
        // Each length limit of `limits.rs`, just past it, names its field.
        (
            sub(
                json!({"url": format!("https://x.example.com/{}", "p".repeat(hookd_api::limits::MAX_URL_LEN))}),
            ),
            "url",
        ),
        (
            sub(json!({"event_types": ["e".repeat(hookd_api::limits::MAX_EVENT_TYPE_LEN + 1)]})),
            "event_types[0]",
        ),
        (
            sub(json!({"customer_id": "c".repeat(hookd_api::limits::MAX_CUSTOMER_ID_LEN + 1)})),
            "customer_id",
        ),
        (sub(json!({"rate_limit": 0})), "rate_limit"),
        (sub(json!({"rate_limit": 10_001})), "rate_limit"),
        (sub(json!({"rate_limit": -5})), "rate_limit"),
        (sub(json!({"rate_limit": 2.5})), "rate_limit"),
        (sub(json!({"rate_limit": 5_000_000_000u64})), "rate_limit"),
        (sub(json!({"max_concurrency": 0})), "max_concurrency"),
        (sub(json!({"max_concurrency": 1_001})), "max_concurrency"),
        (sub(json!({"max_concurrency": -5})), "max_concurrency"),
        (sub(json!({"max_concurrency": 2.5})), "max_concurrency"),
        (
            sub(json!({"max_concurrency": 5_000_000_000u64})),
            "max_concurrency",
        ),
    ];
    for (body, field) in cases {
        let got = app.post("/subscriptions", ADMIN, body.clone()).await;
        assert_error(
            &got,
            StatusCode::UNPROCESSABLE_ENTITY,
            "validation_failed",
            &[field],
        );
    }

    let id = app.subscribe(ADMIN, &["*"]).await;
    let path = format!("/subscriptions/{id}");
    assert_error(
        &app.patch(&path, ADMIN, json!({"state": "paused"})).await,
        StatusCode::UNPROCESSABLE_ENTITY,
        "validation_failed",
        &["state"],
    );
    assert_error(
        &app.patch(&path, ADMIN, json!({"event_types": []})).await,
        StatusCode::UNPROCESSABLE_ENTITY,
        "validation_failed",
        &["event_types"],
    );
    assert_error(
        &app.patch(&path, ADMIN, json!({"url": "gopher://x/"})).await,
        StatusCode::UNPROCESSABLE_ENTITY,
        "validation_failed",
        &["url"],
    );
    for bad in [json!(0), json!(10_001), json!(-1), json!(0.5)] {
        assert_error(
            &app.patch(&path, ADMIN, json!({"rate_limit": bad})).await,
            StatusCode::UNPROCESSABLE_ENTITY,
            "validation_failed",
            &["rate_limit", "1", "10000"],
        );
    }
    assert_eq!(
        app.get(&path, ADMIN).await.1["rate_limit"],
        Value::Null,
        "a refused patch changes nothing"
    );
    for bad in [json!(0), json!(1_001), json!(-1), json!(0.5)] {
        assert_error(
            &app.patch(&path, ADMIN, json!({"max_concurrency": bad}))
                .await,
            StatusCode::UNPROCESSABLE_ENTITY,
            "validation_failed",
            &["max_concurrency", "1", "1000"],
        );
    }
    assert_eq!(
        app.get(&path, ADMIN).await.1["max_concurrency"],
        Value::Null,
        "a refused patch changes nothing"
    );

    let events = [
        (json!({"type": "bad type", "payload": {}}), "type"),
        (json!({"type": "a.*", "payload": {}}), "type"),
        (
            json!({"type": "e".repeat(hookd_api::limits::MAX_EVENT_TYPE_LEN + 1), "payload": {}}),
            "type",
        ),
        (
            json!({"type": "a.b", "payload": {}, "idempotency_key": ""}),
            "idempotency_key",
        ),
        (
            json!({"type": "a.b", "payload": {}, "idempotency_key": "k".repeat(256)}),
            "idempotency_key",
        ),
        (
            json!({"type": "a.b", "payload": {}, "customer_id": ""}),
            "customer_id",
        ),
    ];
    for (body, field) in events {
        let got = app.post("/events", ADMIN, body.clone()).await;
        assert_error(
            &got,
            StatusCode::UNPROCESSABLE_ENTITY,
            "validation_failed",
            &[field],
        );
    }
    // 255 characters (not bytes) is the most.
    let key = "é".repeat(255);
    assert_eq!(
        app.post(
            "/events",
            ADMIN,
            json!({"type": "a.b", "payload": {}, "idempotency_key": key})
        )
        .await
        .0,
        StatusCode::ACCEPTED
    );
    app.stop().await;
}

#[tokio::test]
async fn unknown_routes_ids_and_methods_answer_in_json() {
    let app = spawn_app().await;
    assert_error(
        &app.get("/nope", ADMIN).await,
        StatusCode::NOT_FOUND,
        "not_found",
        &[],
    );
    assert_error(
        &app.call(Method::GET, "/nope", None, None).await,
        StatusCode::NOT_FOUND,
        "not_found",
        &[],
    );
    let missing = hookd_domain::SubscriptionId::new();
    assert_error(
        &app.get(&format!("/subscriptions/{missing}"), ADMIN).await,
        StatusCode::NOT_FOUND,
        "not_found",
        &["subscription"],
    );
    assert_error(
        &app.get("/subscriptions/not-an-id", ADMIN).await,
        StatusCode::NOT_FOUND,
        "not_found",
        &["subscription"],
    );
    let evt = hookd_domain::EventId::new();
    assert_error(
        &app.get(&format!("/subscriptions/{evt}"), ADMIN).await,
        StatusCode::NOT_FOUND,
        "not_found",
        &[],
    );
    assert_error(
        &app.get(&format!("/events/{evt}"), ADMIN).await,
        StatusCode::NOT_FOUND,
        "not_found",
        &["event"],
    );
    let dlv = hookd_domain::DeliveryId::new();
    assert_error(
        &app.get(&format!("/deliveries/{dlv}"), ADMIN).await,
        StatusCode::NOT_FOUND,
        "not_found",
        &["delivery"],
    );
    assert_error(
        &app.get(&format!("/subscriptions/{missing}/deliveries"), ADMIN)
            .await,
        StatusCode::NOT_FOUND,
        "not_found",
        &[],
    );

    for (method, path) in [
        (Method::DELETE, "/events"),
        (Method::PUT, "/subscriptions"),
        (Method::POST, "/healthz"),
    ] {
        let got = app.call(method, path, Some(ADMIN), None).await;
        assert_error(
            &got,
            StatusCode::METHOD_NOT_ALLOWED,
            "method_not_allowed",
            &[],
        );
    }
    app.stop().await;
}
