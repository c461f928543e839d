//! Secret rotation and admin-made customer tokens, over real HTTP against a
//! real SQLite store in a temp dir: one fresh database per test. (Kept apart
//! from `api.rs` so the two can change independently.)

use std::sync::Arc;

use hookd_api::{ApiConfig, AppState, hash_token, router, serve};
use hookd_domain::CustomerId;
use hookd_domain::destination::DestinationPolicy;
use hookd_domain::signing::SigningSecret;
use hookd_domain::subscription::SigningKeys;
use hookd_store::{NewToken, Store};
use hookd_store_sqlite::SqliteStore;
use reqwest::StatusCode;
use serde_json::{Value, json};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

const ADMIN: &str = "admin-token-for-tests";
const ACME: &str = "acme-token";

struct TestApp {
    base: String,
    http: reqwest::Client,
    store: Arc<SqliteStore>,
    _shutdown: tokio_util::sync::DropGuard,
    _dir: tempfile::TempDir,
}

async fn spawn_app() -> TestApp {
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::connect(&dir.path().join("hookd.db"))
        .await
        .unwrap();
    store.migrate().await.unwrap();
    store
        .create_token(NewToken {
            token_hash: hash_token(ACME).to_vec(),
            customer_id: Some(CustomerId::parse("acme").unwrap()),
            label: None,
            expires_at: None,
        })
        .await
        .unwrap();
    let store = Arc::new(store);
    let config = ApiConfig {
        admin_token_hash: Some(hash_token(ADMIN)),
        ..ApiConfig::new(DestinationPolicy::PublicOnly)
    };
    let state = AppState::new(store.clone(), config, Arc::new(Notify::new()));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let shutdown = CancellationToken::new();
    tokio::spawn(serve(listener, router(state), shutdown.clone()));
    TestApp {
        base,
        http: reqwest::Client::new(),
        store,
        _shutdown: shutdown.drop_guard(),
        _dir: dir,
    }
}

impl TestApp {
    async fn send(&self, req: reqwest::RequestBuilder) -> (StatusCode, Value) {
        let resp = req.send().await.unwrap();
        let status = resp.status();
        let text = resp.text().await.unwrap();
        let body = if text.is_empty() {
            Value::Null
        } else {
            serde_json::from_str(&text).unwrap_or_else(|e| panic!("not JSON ({e}): {text:?}"))
        };
        (status, body)
    }

    async fn get(&self, path: &str, token: &str) -> (StatusCode, Value) {
        let req = self.http.get(format!("{}{path}", self.base));
        self.send(req.bearer_auth(token)).await
    }

    /// POSTs `body` as JSON, or nothing at all when `None`.
    async fn post(&self, path: &str, token: &str, body: Option<Value>) -> (StatusCode, Value) {
        let mut req = self
            .http
            .post(format!("{}{path}", self.base))
            .bearer_auth(token);
        if let Some(b) = body {
            req = req.json(&b);
        }
        self.send(req).await
    }

    /// Creates a subscription as `token`; returns its id and secret.
    async fn subscribe(&self, token: &str) -> (String, String) {
        let body = json!({"url": "https://hooks.example.com/in", "event_types": ["a.b"]});
        let (status, body) = self.post("/subscriptions", token, Some(body)).await;
        assert_eq!(status, StatusCode::CREATED, "{body}");
        (
            body["sub_id"].as_str().unwrap().to_owned(),
            body["secret"].as_str().unwrap().to_owned(),
        )
    }

    async fn keys(&self, sub_id: &str) -> SigningKeys {
        self.store
            .get_subscription(&sub_id.parse().unwrap())
            .await
            .unwrap()
            .keys
    }
}

#[track_caller]
fn assert_error(got: &(StatusCode, Value), status: StatusCode, code: &str, words: &[&str]) {
    let (s, body) = got;
    assert_eq!(*s, status, "{body}");
    assert_eq!(body["error"]["code"], code, "{body}");
    let message = body["error"]["message"].as_str().unwrap();
    for w in words {
        assert!(message.contains(w), "{message:?} should mention {w:?}");
    }
}

fn secret(s: &str) -> SigningSecret {
    SigningSecret::parse(s).unwrap()
}

#[tokio::test]
async fn a_rotation_retires_the_old_secret_for_the_grace_window() {
    let app = spawn_app().await;
    let (sub_id, first) = app.subscribe(ADMIN).await;
    let path = format!("/subscriptions/{sub_id}/secret/rotate");

    // No body: the default grace of 24 hours.
    // The answer is in whole milliseconds, as stored.
    let before = chrono::SubsecRound::trunc_subsecs(chrono::Utc::now(), 3);
    let (status, body) = app.post(&path, ADMIN, None).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["sub_id"], sub_id.as_str());
    let second = body["secret"].as_str().unwrap().to_owned();
    assert!(second.starts_with("whsec_") && second != first);
    let expires: chrono::DateTime<chrono::Utc> =
        serde_json::from_value(body["previous_expires_at"].clone()).unwrap();
    let grace = expires - before;
    assert!(
        grace >= chrono::Duration::hours(24)
            && grace < chrono::Duration::hours(24) + chrono::Duration::minutes(1),
        "{grace}"
    );
    let keys = app.keys(&sub_id).await;
    assert_eq!(keys.current, secret(&second));
    assert_eq!(keys.previous, Some((secret(&first), expires)));
    assert_eq!(keys.live(chrono::Utc::now()).count(), 2);

    // Rotating again inside the window drops `first`: at most two secrets.
    let (status, body) = app
        .post(&path, ADMIN, Some(json!({"grace_secs": 60})))
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let third = body["secret"].as_str().unwrap();
    let keys = app.keys(&sub_id).await;
    assert_eq!(keys.current, secret(third));
    assert_eq!(keys.previous.as_ref().map(|p| &p.0), Some(&secret(&second)));

    // A zero grace retires the old secret at once; the secret is never shown
    // by a read.
    let (status, _) = app.post(&path, ADMIN, Some(json!({"grace_secs": 0}))).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(app.keys(&sub_id).await.live(chrono::Utc::now()).count(), 1);
    let (_, view) = app.get(&format!("/subscriptions/{sub_id}"), ADMIN).await;
    assert!(view.get("secret").is_none(), "{view}");
}

#[tokio::test]
async fn rotation_refuses_bad_grace_and_other_customers_subscriptions() {
    let app = spawn_app().await;
    let (admin_sub, admin_secret) = app.subscribe(ADMIN).await;
    let (acme_sub, _) = app.subscribe(ACME).await;
    let path = |id: &str| format!("/subscriptions/{id}/secret/rotate");

    for bad in [json!(-1), json!(1.5), json!(7 * 86_400 + 1)] {
        let got = app
            .post(&path(&acme_sub), ACME, Some(json!({ "grace_secs": bad })))
            .await;
        assert_error(
            &got,
            StatusCode::UNPROCESSABLE_ENTITY,
            "validation_failed",
            &["grace_secs"],
        );
    }
    let got = app
        .post(&path(&acme_sub), ACME, Some(json!({ "grace_secs": "1" })))
        .await;
    assert_error(
        &got,
        StatusCode::BAD_REQUEST,
        "bad_request",
        &["grace_secs"],
    );
    let got = app
        .post(&path(&acme_sub), ACME, Some(json!({ "grace": 1 })))
        .await;
    assert_error(&got, StatusCode::BAD_REQUEST, "bad_request", &["grace"]);
    let raw = app
        .send(
            app.http
                .post(format!("{}{}", app.base, path(&acme_sub)))
                .bearer_auth(ACME)
                .body("grace_secs=1"),
        )
        .await;
    assert_error(
        &raw,
        StatusCode::UNSUPPORTED_MEDIA_TYPE,
        "unsupported_media_type",
        &[],
    );

    // Another customer's (here: the admin's) subscription does not exist for
    // acme, and is left untouched; an unknown id is 404 as well.
    let got = app.post(&path(&admin_sub), ACME, None).await;
    assert_error(&got, StatusCode::NOT_FOUND, "not_found", &["subscription"]);
    assert_eq!(app.keys(&admin_sub).await.current, secret(&admin_secret));
    assert_eq!(app.keys(&admin_sub).await.previous, None);
    let got = app
        .post(&path("sub_0190a0a0a0a07000800000000000000"), ADMIN, None)
        .await;
    assert_eq!(got.0, StatusCode::NOT_FOUND, "{}", got.1);
    let got = app.post(&path(&admin_sub), "nope", None).await;
    assert_eq!(got.0, StatusCode::UNAUTHORIZED);

    // Its own subscription acme may rotate.
    let (status, body) = app
        .post(
            &path(&acme_sub),
            ACME,
            Some(json!({"grace_secs": 7 * 86_400})),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
}

#[tokio::test]
async fn an_admin_creates_a_customer_token_that_sees_only_that_customer() {
    let app = spawn_app().await;
    let (acme_sub, _) = app.subscribe(ACME).await;
    let (admin_sub, _) = app.subscribe(ADMIN).await;

    let (status, body) = app
        .post(
            "/tokens",
            ADMIN,
            Some(json!({"customer_id": "globex", "label": "globex billing"})),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    assert_eq!(body["customer_id"], "globex");
    let token = body["token"].as_str().unwrap().to_owned();
    assert!(token.starts_with("hookd_"), "{token}");

    // The new token works, as globex: it sees none of the others' records,
    // and what it creates is globex's.
    let (status, list) = app.get("/subscriptions", &token).await;
    assert_eq!(status, StatusCode::OK, "{list}");
    assert_eq!(list["data"], json!([]));
    for other in [&acme_sub, &admin_sub] {
        let (status, _) = app.get(&format!("/subscriptions/{other}"), &token).await;
        assert_eq!(status, StatusCode::NOT_FOUND);
    }
    let (own, _) = app.subscribe(&token).await;
    let (_, list) = app.get("/subscriptions", &token).await;
    assert_eq!(list["data"].as_array().unwrap().len(), 1, "{list}");
    assert_eq!(list["data"][0]["sub_id"], own.as_str());
    assert_eq!(list["data"][0]["customer_id"], "globex");

    // Without a label too; each token is new.
    let (status, again) = app
        .post("/tokens", ADMIN, Some(json!({"customer_id": "globex"})))
        .await;
    assert_eq!(status, StatusCode::CREATED, "{again}");
    assert_ne!(again["token"], token.as_str());
}

#[tokio::test]
async fn only_an_admin_may_create_tokens_and_bad_input_is_refused() {
    let app = spawn_app().await;
    for token in [ACME] {
        let got = app
            .post("/tokens", token, Some(json!({"customer_id": "acme"})))
            .await;
        assert_error(&got, StatusCode::NOT_FOUND, "not_found", &[]);
    }
    let got = app
        .post("/tokens", "nope", Some(json!({"customer_id": "acme"})))
        .await;
    assert_eq!(got.0, StatusCode::UNAUTHORIZED);
    let got = app.post("/tokens", ADMIN, Some(json!({}))).await;
    assert_error(
        &got,
        StatusCode::BAD_REQUEST,
        "bad_request",
        &["customer_id"],
    );
    let got = app
        .post("/tokens", ADMIN, Some(json!({"customer_id": ""})))
        .await;
    assert_error(
        &got,
        StatusCode::UNPROCESSABLE_ENTITY,
        "validation_failed",
        &["customer_id"],
    );
    let got = app
        .post(
            "/tokens",
            ADMIN,
            Some(json!({"customer_id": "acme", "label": "x".repeat(201)})),
        )
        .await;
    assert_error(
        &got,
        StatusCode::UNPROCESSABLE_ENTITY,
        "validation_failed",
        &["label"],
    );
}
