//! Property tests of the API's JSON input: whatever is posted to the routes
//! that take a body, the answer is never a 5xx (nor a panic), and every 4xx
//! carries the one error shape `{"error":{"code","message"}}`.
//!
//! The real router runs in-process (`tower::ServiceExt::oneshot`) over a
//! SQLite store in a temp dir and over PostgreSQL (a fresh schema), each with
//! a real subscription to patch and replay: a string one backend stores and
//! the other refuses (U+0000 in PostgreSQL's `text`) is a 5xx found here.
//! Case counts are small so this runs in seconds with the rest of
//! `cargo test`; `PROPTEST_CASES=5000` runs it longer.

use std::collections::BTreeMap;
use std::sync::{Arc, LazyLock};

use axum::body::Body;
use axum::http::{Method, Request, StatusCode, header};
use hookd_api::{ApiConfig, AppState, hash_token, router};
use hookd_domain::CustomerId;
use hookd_domain::destination::DestinationPolicy;
use hookd_store::NewToken;
use proptest::prelude::*;
use serde_json::{Value, json};
use tokio::sync::Notify;
use tower::ServiceExt as _;

const ADMIN: &str = "fuzz-admin-token";
const CUSTOMER: &str = "fuzz-customer-token";

/// The real router over one store, with a real subscription of the
/// customer's to patch and replay.
struct App {
    backend: &'static str,
    app: axum::Router,
    sub_id: String,
}

struct Fixture {
    rt: tokio::runtime::Runtime,
    /// SQLite, then PostgreSQL (when `HOOKD_TEST_DATABASE_URL` is set; under
    /// `CI=true` it must be): what one backend stores, the other must too.
    apps: Vec<App>,
    _dir: tempfile::TempDir,
    _db: Option<hookd_store_postgres::testing::TestDatabase>,
}

async fn app_over(backend: &'static str, store: Arc<dyn hookd_store::Store>) -> App {
    store.migrate().await.unwrap();
    store
        .create_token(NewToken {
            token_hash: hash_token(CUSTOMER).to_vec(),
            customer_id: Some(CustomerId::parse("acme").unwrap()),
            label: None,
            expires_at: None,
        })
        .await
        .unwrap();
    let config = ApiConfig {
        admin_token_hash: Some(hash_token(ADMIN)),
        ..ApiConfig::new(DestinationPolicy::PublicOnly)
    };
    let app = router(AppState::new(store, config, Arc::new(Notify::new())));
    let body = json!({"url": "https://hooks.example.com/in", "event_types": ["*"]});
    let (status, created) = send(
        &app,
        Method::POST,
        "/subscriptions",
        CUSTOMER,
        body.to_string().into_bytes(),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{backend}: {created}");
    App {
        backend,
        app,
        sub_id: created["sub_id"].as_str().unwrap().to_owned(),
    }
}

static FIXTURE: LazyLock<Fixture> = LazyLock::new(|| {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (apps, db) = rt.block_on(async {
        let sqlite = hookd_store_sqlite::SqliteStore::connect(&dir.path().join("hookd.db"))
            .await
            .unwrap();
        let mut apps = vec![app_over("sqlite", Arc::new(sqlite)).await];
        let db = hookd_store_postgres::testing::fresh_schema().await;
        if let Some(db) = &db {
            let pg = hookd_store_postgres::PgStore::connect(
                &db.url,
                hookd_store_postgres::PgOptions::default(),
            )
            .await
            .unwrap();
            apps.push(app_over("postgres", Arc::new(pg)).await);
        }
        (apps, db)
    });
    Fixture {
        rt,
        apps,
        _dir: dir,
        _db: db,
    }
});

async fn send(
    app: &axum::Router,
    method: Method,
    path: &str,
    token: &str,
    body: Vec<u8>,
) -> (StatusCode, Value) {
    let req = Request::builder()
        .method(method)
        .uri(path)
        .header(header::AUTHORIZATION, format!("Bearer {token}"))
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from(body))
        .unwrap();
    let resp = app.clone().oneshot(req).await.unwrap();
    let status = resp.status();
    let bytes = axum::body::to_bytes(resp.into_body(), usize::MAX)
        .await
        .unwrap();
    let value = if bytes.is_empty() {
        Value::Null
    } else {
        serde_json::from_slice(&bytes).unwrap_or_else(|e| {
            panic!(
                "{status}: not JSON ({e}): {}",
                String::from_utf8_lossy(&bytes)
            )
        })
    };
    (status, value)
}

/// Posts `body` to every route that takes one, as the admin and as the
/// customer, and checks each answer.
fn post_everywhere(body: &[u8]) -> Result<(), TestCaseError> {
    let f = &*FIXTURE;
    for a in &f.apps {
        let sub = &a.sub_id;
        let routes = [
            (Method::POST, "/subscriptions".to_owned()),
            (Method::POST, "/events".to_owned()),
            (Method::PATCH, format!("/subscriptions/{sub}")),
            (Method::POST, format!("/subscriptions/{sub}/replay")),
        ];
        for token in [ADMIN, CUSTOMER] {
            for (method, path) in &routes {
                let (status, got) =
                    f.rt.block_on(send(&a.app, method.clone(), path, token, body.to_vec()));
                let what = format!(
                    "{}: {method} {path} with {}",
                    a.backend,
                    String::from_utf8_lossy(&body[..body.len().min(300)])
                );
                prop_assert!(!status.is_server_error(), "{what}: {status} {got}");
                if status.is_client_error() {
                    let error = got.as_object().and_then(|o| o.get("error"));
                    let shape = error
                        .and_then(Value::as_object)
                        .filter(|e| e.len() == 2)
                        .filter(|e| e.get("code").is_some_and(Value::is_string))
                        .filter(|e| e.get("message").is_some_and(Value::is_string));
                    prop_assert!(
                        got.as_object().is_some_and(|o| o.len() == 1) && shape.is_some(),
                        "{what}: {status} without the error shape: {got}"
                    );
                }
            }
        }
    }
    Ok(())
}

/// Field names the routes know, so generated objects get past
/// `deny_unknown_fields` and reach the validation behind it.
const FIELDS: &[&str] = &[
    "url",
    "event_types",
    "secret",
    "customer_id",
    "ordered",
    "retry_policy",
    "rate_limit",
    "max_concurrency",
    "description",
    "state",
    "type",
    "payload",
    "idempotency_key",
    "since",
    "until",
    "types",
    "statuses",
    "base_delay_secs",
    "max_delay_secs",
    "max_age_secs",
    "max_attempts",
    "retryable_statuses",
];

/// Strings near the edges of what the routes accept.
fn interesting_string() -> impl Strategy<Value = String> {
    prop_oneof![
        any::<String>(),
        Just(String::new()),
        Just("*".to_owned()),
        Just("invoice.paid".to_owned()),
        Just("hookd.subscription.disabled".to_owned()),
        Just("https://hooks.example.com/x".to_owned()),
        Just("http://127.0.0.1/".to_owned()),
        Just("http://[::ffff:10.0.0.1]/".to_owned()),
        Just("https://u:p@example.com/".to_owned()),
        Just("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw".to_owned()),
        Just("acme".to_owned()),
        Just("globex".to_owned()),
        Just("2024-01-01T00:00:00Z".to_owned()),
        Just("9999-12-31T23:59:59Z".to_owned()),
        Just("active".to_owned()),
        Just("disabled".to_owned()),
        Just("dead".to_owned()),
        Just("a\u{0}b".to_owned()),
        (1usize..3000).prop_map(|n| "a".repeat(n)),
        "[a-z]{1,10}(\\.[a-z*]{1,10}){0,3}",
    ]
}

fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        any::<f64>().prop_map(Value::from),
        interesting_string().prop_map(Value::String),
    ];
    leaf.prop_recursive(4, 32, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            prop::collection::btree_map(
                prop_oneof![
                    prop::sample::select(FIELDS).prop_map(str::to_owned),
                    any::<String>()
                ],
                inner,
                0..6
            )
            .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

/// Objects made of the routes' own field names with arbitrary values.
fn field_shaped() -> impl Strategy<Value = Value> {
    prop::collection::btree_map(prop::sample::select(FIELDS), json_value(), 0..8).prop_map(
        |m: BTreeMap<&str, Value>| {
            Value::Object(m.into_iter().map(|(k, v)| (k.to_owned(), v)).collect())
        },
    )
}

/// `value` wrapped in `depth` arrays or objects.
fn nested(value: Value, depth: usize, objects: bool) -> Value {
    (0..depth).fold(value, |v, _| {
        if objects {
            json!({ "a": v })
        } else {
            json!([v])
        }
    })
}

fn config() -> ProptestConfig {
    ProptestConfig {
        cases: 256,
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn arbitrary_json_values_get_no_5xx_and_every_4xx_has_the_error_shape(v in json_value()) {
        post_everywhere(v.to_string().as_bytes())?;
    }

    #[test]
    fn objects_of_known_fields_get_no_5xx_and_every_4xx_has_the_error_shape(v in field_shaped()) {
        post_everywhere(v.to_string().as_bytes())?;
    }

    /// Events that pass most checks, with an arbitrary (sometimes deeply
    /// nested) payload.
    #[test]
    fn events_with_arbitrary_payloads_get_no_5xx(
        payload in json_value(),
        depth in prop_oneof![Just(0usize), 0usize..200],
        objects in any::<bool>(),
        event_type in interesting_string(),
    ) {
        let body = json!({ "type": event_type, "payload": nested(payload, depth, objects) });
        post_everywhere(body.to_string().as_bytes())?;
    }

    /// Bodies that are not JSON at all, or nearly JSON.
    #[test]
    fn arbitrary_bodies_get_no_5xx_and_every_4xx_has_the_error_shape(
        body in prop_oneof![
            any::<String>().prop_map(String::into_bytes),
            prop::collection::vec(any::<u8>(), 0..256),
            "[\\[\\]{}\":,0-9a-z\\\\ ]{0,64}".prop_map(String::into_bytes),
        ]
    ) {
        post_everywhere(&body)?;
    }
}

/// The nesting limit is a 4xx naming it, just past the limit and far past.
#[test]
fn deep_payloads_are_refused_naming_the_limit() {
    let f = &*FIXTURE;
    for a in &f.apps {
        deep_payloads_are_refused_on(f, a);
    }
}

fn deep_payloads_are_refused_on(f: &Fixture, a: &App) {
    use hookd_api::limits::{MAX_BODY_DEPTH, MAX_PAYLOAD_DEPTH};
    let post = |payload: Value| {
        let body = json!({ "type": "deep.test", "payload": payload }).to_string();
        f.rt.block_on(send(
            &a.app,
            Method::POST,
            "/events",
            ADMIN,
            body.into_bytes(),
        ))
    };
    let (status, _) = post(nested(json!(1), MAX_PAYLOAD_DEPTH, false));
    assert_eq!(status, StatusCode::ACCEPTED);
    let (status, body) = post(nested(json!(1), MAX_PAYLOAD_DEPTH + 1, true));
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    assert_eq!(body["error"]["code"], "validation_failed");
    let message = body["error"]["message"].as_str().unwrap();
    assert!(
        message.starts_with("payload") && message.contains(&MAX_PAYLOAD_DEPTH.to_string()),
        "{message}"
    );
    let depth = 10_000;
    let body = format!(
        r#"{{"type":"deep.test","payload":{}1{}}}"#,
        "[".repeat(depth),
        "]".repeat(depth)
    );
    let (status, body) = f.rt.block_on(send(
        &a.app,
        Method::POST,
        "/events",
        ADMIN,
        body.into_bytes(),
    ));
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    let message = body["error"]["message"].as_str().unwrap();
    assert!(message.contains(&MAX_BODY_DEPTH.to_string()), "{message}");
}
