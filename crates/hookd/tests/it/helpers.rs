//! `spawn_app()` and `TestReceiver`: the two fixtures every end-to-end test
//! stands on.

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU16, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Bytes;
use axum::http::{HeaderMap, StatusCode};
use hookd::{App, AppConfig};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

/// Which store a test runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Sqlite,
    Postgres,
}

/// Stamps out an async test body `fn(Backend)` once per backend.
#[macro_export]
macro_rules! on_both_backends {
    ($($name:ident),* $(,)?) => {
        $(
            mod $name {
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn sqlite() {
                    super::$name($crate::helpers::Backend::Sqlite).await
                }
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn postgres() {
                    super::$name($crate::helpers::Backend::Postgres).await
                }
            }
        )*
    };
}

/// How long any wait for work may take before the test fails. Generous:
/// it bounds a hang, it is not a performance assertion.
pub const DEADLINE: Duration = Duration::from_secs(30);

/// Polls `f` until it returns `Some`, failing after [`DEADLINE`].
pub async fn eventually<T, F, Fut>(what: &str, f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    eventually_within(what, DEADLINE, f).await
}

/// The key that seals subscription secrets in every test database: given to
/// in-process apps and stores ([`test_keyring`]) and to `hookd` child
/// processes (`HOOKD_ENCRYPTION_KEY`), so each reads what the others wrote.
pub const TEST_ENCRYPTION_KEY: &str = "HwUBoQUkrCFALZ33ksQVMq5k5b9TuZL/6uLqXawljZg=";

pub fn test_keyring() -> hookd_store::crypto::Keyring {
    hookd_store::crypto::Keyring::new(
        hookd_store::crypto::EncryptionKey::from_base64(TEST_ENCRYPTION_KEY).unwrap(),
    )
}

/// The store at `database`, as the test apps open it (with [`test_keyring`]).
pub async fn open_store(database: &str) -> std::sync::Arc<dyn hookd_store::Store> {
    hookd::open_store_with(database, test_keyring())
        .await
        .unwrap()
}

/// A database URL for a fresh, empty database of `backend`, and what keeps
/// it alive. `None` when PostgreSQL is not configured outside CI.
pub async fn fresh_database(backend: Backend) -> Option<(String, Box<dyn std::any::Any + Send>)> {
    match backend {
        Backend::Sqlite => {
            let dir = tempfile::tempdir().unwrap();
            let url = format!("sqlite:{}", dir.path().join("hookd.db").display());
            Some((url, Box::new(dir)))
        }
        Backend::Postgres => {
            let db = hookd_store_postgres::testing::fresh_schema().await?;
            Some((db.url.clone(), Box::new(db)))
        }
    }
}

/// The running application and a client that talks to it as admin.
pub struct TestApp {
    pub addr: SocketAddr,
    /// The dispatcher's per-destination isolation state.
    pub admission: Arc<hookd_dispatch::admission::Admission>,
    pub client: reqwest::Client,
    pub token: String,
    pub database: String,
    shutdown: CancellationToken,
    handle: Option<tokio::task::JoinHandle<anyhow::Result<()>>>,
    guard: Option<Box<dyn std::any::Any + Send>>,
}

pub fn test_dispatch_config(worker: &str) -> hookd_dispatch::DispatchConfig {
    let mut c = hookd_dispatch::DispatchConfig::standard(worker.to_owned());
    c.poll_interval = Duration::from_millis(50);
    c.attempt_timeout = Duration::from_secs(10);
    c.shutdown_grace = Duration::from_secs(2);
    // Receivers are on loopback (`hookd serve` sets the policy itself).
    c.egress.policy = hookd_domain::destination::DestinationPolicy::AllowPrivate;
    c
}

/// Builds and runs the whole application on port 0. `None` means the backend
/// is not configured here (PostgreSQL outside CI); the test then does nothing.
pub async fn spawn_app(backend: Backend) -> Option<TestApp> {
    spawn_app_with(backend, |_| {}).await
}

/// Like [`spawn_app`], with the dispatcher's settings adjusted by `tune`.
pub async fn spawn_app_with(
    backend: Backend,
    tune: impl FnOnce(&mut hookd_dispatch::DispatchConfig),
) -> Option<TestApp> {
    let (database, guard) = fresh_database(backend).await?;
    let mut dispatch = test_dispatch_config("test-worker");
    tune(&mut dispatch);
    Some(spawn_app_configured(database, guard, dispatch).await)
}

pub async fn spawn_app_on(database: String, guard: Box<dyn std::any::Any + Send>) -> TestApp {
    spawn_app_configured(database, guard, test_dispatch_config("test-worker")).await
}

pub async fn spawn_app_configured(
    database: String,
    guard: Box<dyn std::any::Any + Send>,
    dispatch: hookd_dispatch::DispatchConfig,
) -> TestApp {
    spawn_app_full(database, guard, |c| c.dispatch = dispatch).await
}

/// Like [`spawn_app`], with the whole application configuration adjusted
/// by `tune` (monitor, retention, dispatcher).
pub async fn spawn_app_tuned(
    backend: Backend,
    tune: impl FnOnce(&mut AppConfig),
) -> Option<TestApp> {
    let (database, guard) = fresh_database(backend).await?;
    Some(spawn_app_full(database, guard, tune).await)
}

/// The application on `database` with the test settings, adjusted by
/// `tune`.
pub async fn spawn_app_full(
    database: String,
    guard: Box<dyn std::any::Any + Send>,
    tune: impl FnOnce(&mut AppConfig),
) -> TestApp {
    let token = "test-admin-token".to_owned();
    let mut config = AppConfig::new(database.clone(), test_dispatch_config("test-worker"));
    config.allow_private_destinations = true;
    config.admin_token = Some(token.clone());
    config.monitor.every = Duration::from_millis(100);
    config.dispatch.replay_every = Duration::from_millis(50);
    config.keyring = Some(test_keyring());
    tune(&mut config);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let app = App::build(config, listener).await.expect("the app builds");
    let addr = app.local_addr();
    let admission = app.dispatcher().admission().clone();
    let shutdown = app.shutdown_token();
    let handle = tokio::spawn(app.run());
    TestApp {
        addr,
        admission,
        client: reqwest::Client::new(),
        token,
        database,
        shutdown,
        handle: Some(handle),
        guard: Some(guard),
    }
}

/// Runs `cmd` to completion off the async runtime (the child blocks until
/// it exits), for tests that run the real `hookd` binary.
pub async fn run(mut cmd: std::process::Command) -> std::process::Output {
    tokio::task::spawn_blocking(move || cmd.output().unwrap())
        .await
        .unwrap()
}

impl TestApp {
    /// Runs the real `hookd` binary with `args`, talking to this app as its
    /// admin through `--server`.
    pub async fn cli(&self, args: &[&str]) -> std::process::Output {
        let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_hookd"));
        cmd.args(args)
            .args(["--server", &self.url("")])
            .env("HOOKD_TOKEN", &self.token)
            .env_remove("HOOKD_URL");
        run(cmd).await
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.addr, path)
    }

    pub async fn post(&self, path: &str, body: &Value) -> reqwest::Response {
        self.client
            .post(self.url(path))
            .bearer_auth(&self.token)
            .json(body)
            .send()
            .await
            .unwrap()
    }

    pub async fn get(&self, path: &str) -> reqwest::Response {
        self.client
            .get(self.url(path))
            .bearer_auth(&self.token)
            .send()
            .await
            .unwrap()
    }

    pub async fn get_json(&self, path: &str) -> Value {
        let r = self.get(path).await;
        assert_eq!(r.status(), 200, "GET {path}");
        r.json().await.unwrap()
    }

    /// Creates a subscription for `types` pointing at `url`; returns its JSON.
    pub async fn subscribe(&self, url: &str, types: &[&str]) -> Value {
        self.subscribe_with(json!({ "url": url, "event_types": types }))
            .await
    }

    pub async fn subscribe_with(&self, body: Value) -> Value {
        let r = self.post("/subscriptions", &body).await;
        let status = r.status();
        let v: Value = r.json().await.unwrap();
        assert_eq!(status, 201, "{v}");
        v
    }

    /// Posts an event; returns its id.
    pub async fn send_event(&self, ty: &str, payload: Value) -> String {
        let r = self
            .post("/events", &json!({ "type": ty, "payload": payload }))
            .await;
        let status = r.status();
        let v: Value = r.json().await.unwrap();
        assert_eq!(status, 202, "{v}");
        v["event_id"].as_str().unwrap().to_owned()
    }

    /// Stops the application gracefully and waits for it. Returns what keeps
    /// its database alive, for a test that inspects the database afterwards.
    pub async fn stop(mut self) -> Box<dyn std::any::Any + Send> {
        self.shutdown.cancel();
        if let Some(h) = self.handle.take() {
            h.await.unwrap().unwrap();
        }
        self.guard.take().expect("stop is called once")
    }
}

impl Drop for TestApp {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

/// What a receiver got.
#[derive(Debug, Clone)]
pub struct Received {
    pub headers: HeaderMap,
    pub body: Bytes,
    /// When it arrived.
    pub at: std::time::Instant,
}

impl Received {
    pub fn header(&self, name: &str) -> &str {
        self.headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
    }

    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap()
    }

    /// Whether the request carries a valid Standard Webhooks signature by
    /// `secret`, checked the way the specification describes it and without
    /// hookd's signer: HMAC-SHA256 keyed with the base64 after `whsec_`, over
    /// `{id}.{timestamp}.{body}`, compared with each `v1,` entry.
    pub fn signed_by(&self, secret: &str) -> bool {
        use base64::Engine as _;
        use hmac::Mac as _;
        let b64 = base64::engine::general_purpose::STANDARD;
        let key = b64.decode(secret.strip_prefix("whsec_").unwrap()).unwrap();
        let mut mac = hmac::Hmac::<sha2::Sha256>::new_from_slice(&key).unwrap();
        mac.update(
            format!(
                "{}.{}.",
                self.header("webhook-id"),
                self.header("webhook-timestamp")
            )
            .as_bytes(),
        );
        mac.update(&self.body);
        let expected = format!("v1,{}", b64.encode(mac.finalize().into_bytes()));
        self.header("webhook-signature")
            .split(' ')
            .any(|s| s == expected)
    }
}

#[derive(Debug)]
struct ReceiverState {
    received: Mutex<Vec<Received>>,
    script: Mutex<VecDeque<u16>>,
    default_status: AtomicU16,
    /// While `true`, requests wait (unanswered) until it turns `false`.
    held: tokio::sync::watch::Sender<bool>,
}

/// A real HTTP receiver on a loopback address, whose answers can be set.
pub struct TestReceiver {
    pub addr: SocketAddr,
    state: Arc<ReceiverState>,
    shutdown: CancellationToken,
}

impl TestReceiver {
    /// A receiver on `ip` (e.g. "127.0.0.2": distinct addresses are distinct
    /// destination hosts), answering 200 until told otherwise.
    pub async fn start(ip: &str) -> Self {
        Self::start_at(ip, 0).await
    }

    /// Like [`start`](Self::start), on `port` (0: any free one): receivers
    /// on several addresses with one port can stand for one host name that
    /// resolves differently on different nodes.
    pub async fn start_at(ip: &str, port: u16) -> Self {
        let state = Arc::new(ReceiverState {
            received: Mutex::default(),
            script: Mutex::default(),
            default_status: AtomicU16::new(200),
            held: tokio::sync::watch::Sender::new(false),
        });
        let listener = tokio::net::TcpListener::bind((ip, port)).await.unwrap();
        let addr = listener.local_addr().unwrap();
        let st = state.clone();
        let app = axum::Router::new().fallback(move |headers: HeaderMap, body: Bytes| {
            let st = st.clone();
            async move {
                let mut held = st.held.subscribe();
                // Waits while held; a closed channel (never) would release.
                let _ = held.wait_for(|h| !*h).await;
                st.received.lock().unwrap().push(Received {
                    headers,
                    body,
                    at: std::time::Instant::now(),
                });
                let code = st
                    .script
                    .lock()
                    .unwrap()
                    .pop_front()
                    .unwrap_or_else(|| st.default_status.load(Ordering::SeqCst));
                StatusCode::from_u16(code).unwrap()
            }
        });
        let shutdown = CancellationToken::new();
        let s = shutdown.clone();
        tokio::spawn(async move {
            axum::serve(listener, app)
                .with_graceful_shutdown(s.cancelled_owned())
                .await
                .unwrap();
        });
        Self {
            addr,
            state,
            shutdown,
        }
    }

    pub fn url(&self) -> String {
        format!("http://{}/hook", self.addr)
    }

    /// Answers the next requests with `statuses`, in order, then the default.
    pub fn script(&self, statuses: &[u16]) {
        self.state.script.lock().unwrap().extend(statuses);
    }

    /// Answers every later request (after any script) with `status`.
    pub fn set_status(&self, status: u16) {
        self.state.default_status.store(status, Ordering::SeqCst);
    }

    /// Holds every request unanswered until [`release`](Self::release):
    /// a destination that accepts connections and never finishes.
    pub fn hold(&self) {
        self.state.held.send_replace(true);
    }

    /// Lets held requests (and later ones) through.
    pub fn release(&self) {
        self.state.held.send_replace(false);
    }

    pub fn received(&self) -> Vec<Received> {
        self.state.received.lock().unwrap().clone()
    }

    /// The `webhook-id` of every request received, by the event it carried.
    pub fn webhook_ids_by_event(&self) -> HashMap<String, Vec<String>> {
        let mut per_event: HashMap<String, Vec<String>> = HashMap::new();
        for r in self.received() {
            let event_id = r.json()["event_id"].as_str().unwrap().to_owned();
            per_event
                .entry(event_id)
                .or_default()
                .push(r.header("webhook-id").to_owned());
        }
        per_event
    }

    /// Waits until at least `n` requests arrived.
    pub async fn wait_for(&self, n: usize) -> Vec<Received> {
        eventually(&format!("{n} requests at {}", self.addr), || async {
            let got = self.received();
            (got.len() >= n).then_some(got)
        })
        .await
    }
}

impl Drop for TestReceiver {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

/// Like [`eventually`], with its own deadline, for waits that bound a long
/// run (thousands of deliveries, process restarts) rather than one step.
pub async fn eventually_within<T, F, Fut>(what: &str, deadline: Duration, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + deadline;
    loop {
        if let Some(v) = f().await {
            return v;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for: {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

impl TestReceiver {
    /// How many requests arrived (cheaper than `received().len()`).
    pub fn count(&self) -> usize {
        self.state.received.lock().unwrap().len()
    }
}

/// The admin token [`ServeProcess`] runs with.
pub const PROCESS_TOKEN: &str = "test-admin-token";

/// The `webhook-id` every attempt of the delivery of `event_id` to `sub_id`
/// carries: `sha256(event_id|sub_id)`, hex.
pub fn expected_webhook_id(event_id: &str, sub_id: &str) -> String {
    use sha2::Digest as _;
    hex::encode(sha2::Sha256::digest(
        format!("{event_id}|{sub_id}").as_bytes(),
    ))
}

/// Posts `body` to `POST /events` of the node at `base()` until a 202, as a
/// real producer would: the same body (so the same idempotency key) again
/// after a 5xx, a 429 or a failed connection, paced at 25 ms, asking `base`
/// before each try so a restarted node's new address is used. Any other
/// answer fails the test. Returns the event id and how many tries failed.
pub async fn post_until_accepted(
    client: &reqwest::Client,
    base: impl Fn() -> String,
    body: &Value,
) -> (String, usize) {
    let mut retries = 0;
    loop {
        let sent = client
            .post(format!("{}/events", base()))
            .bearer_auth(PROCESS_TOKEN)
            .json(body)
            .send()
            .await;
        match sent {
            Ok(r) if r.status() == 202 => {
                // An error here: the node died while answering.
                if let Ok(v) = r.json::<Value>().await {
                    return (v["event_id"].as_str().unwrap().to_owned(), retries);
                }
            }
            Ok(r) if r.status().is_server_error() || r.status() == 429 => {
                eprintln!("POST /events answered {}; retrying", r.status());
            }
            Ok(r) => panic!(
                "POST /events answered {}: {}",
                r.status(),
                r.text().await.unwrap_or_default()
            ),
            // Refused or reset: the node is down.
            Err(e) => eprintln!("POST /events failed ({e}); retrying"),
        }
        retries += 1;
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

/// The real `hookd serve` binary (the one `cargo test` builds, with
/// failpoints) on `database`, as an operator runs it, with a short lease so
/// that a crashed process's claims come back quickly. Dropping it kills it.
pub struct ServeProcess {
    pub addr: SocketAddr,
    pub client: reqwest::Client,
    child: std::process::Child,
    log: tempfile::NamedTempFile,
}

impl ServeProcess {
    /// Starts `hookd serve` on a free port with `failpoints` armed
    /// (`HOOKD_FAILPOINTS`, e.g. `"dispatch.after_claim=exit"`), and waits
    /// until its API answers.
    pub async fn start(database: &str, failpoints: Option<&str>) -> Self {
        Self::start_with_args(database, failpoints, &[]).await
    }

    /// Like [`start`](Self::start), with more `serve` flags (`--role`, …).
    pub async fn start_with_args(database: &str, failpoints: Option<&str>, args: &[&str]) -> Self {
        // The port is found free and then bound by the child: another process
        // may take it in between, so a start that fails is tried again.
        for _ in 0..5 {
            let port = std::net::TcpListener::bind("127.0.0.1:0")
                .unwrap()
                .local_addr()
                .unwrap()
                .port();
            let addr: SocketAddr = ([127, 0, 0, 1], port).into();
            let log = tempfile::NamedTempFile::new().unwrap();
            let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_hookd"));
            cmd.args(["serve", "--allow-private-destinations"])
                .args(["--database", database, "--listen", &addr.to_string()])
                .args(["--lease", "3s", "--attempt-timeout", "2s"])
                .args(["--lease-renewal", "1s", "--shutdown-grace", "1s"])
                .args(args)
                .env("HOOKD_ADMIN_TOKEN", PROCESS_TOKEN)
                .env("HOOKD_ENCRYPTION_KEY", TEST_ENCRYPTION_KEY)
                .env_remove("HOOKD_ENCRYPTION_KEY_PREVIOUS")
                .env("HOOKD_LOG", "warn")
                .env_remove("HOOKD_DATABASE_URL")
                .env_remove("HOOKD_LISTEN")
                .stdin(std::process::Stdio::null())
                .stdout(std::process::Stdio::null())
                .stderr(log.reopen().unwrap());
            match failpoints {
                Some(spec) => cmd.env("HOOKD_FAILPOINTS", spec),
                None => cmd.env_remove("HOOKD_FAILPOINTS"),
            };
            let mut p = Self {
                addr,
                client: reqwest::Client::new(),
                child: cmd.spawn().expect("the hookd binary starts"),
                log,
            };
            if p.ready().await {
                return p;
            }
            eprintln!(
                "hookd serve exited while starting; trying another port:\n{}",
                p.log_text()
            );
        }
        panic!("hookd serve did not start");
    }

    /// Waits until the API answers (`true`) or the process exits (`false`).
    async fn ready(&mut self) -> bool {
        // Every role serves it (a worker node has no /subscriptions).
        let url = self.url("/readyz");
        eventually("hookd serve to answer", || {
            let exited = self.child.try_wait().unwrap();
            let req = self.client.get(&url).bearer_auth(PROCESS_TOKEN).send();
            async move {
                if exited.is_some() {
                    return Some(false);
                }
                match req.await {
                    Ok(r) if r.status() == 200 => Some(true),
                    _ => None,
                }
            }
        })
        .await
    }

    /// Its `/metrics` text; `None` if it does not answer.
    pub async fn metrics_text(&self) -> Option<String> {
        self.client
            .get(self.url("/metrics"))
            .bearer_auth(PROCESS_TOKEN)
            .send()
            .await
            .ok()?
            .text()
            .await
            .ok()
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.addr, path)
    }

    pub async fn post(&self, path: &str, body: &Value) -> reqwest::Response {
        self.client
            .post(self.url(path))
            .bearer_auth(PROCESS_TOKEN)
            .json(body)
            .send()
            .await
            .unwrap()
    }

    pub async fn get_json(&self, path: &str) -> Value {
        let r = self
            .client
            .get(self.url(path))
            .bearer_auth(PROCESS_TOKEN)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200, "GET {path}");
        r.json().await.unwrap()
    }

    /// Creates a subscription; returns its id.
    pub async fn subscribe_with(&self, body: Value) -> String {
        let r = self.post("/subscriptions", &body).await;
        let status = r.status();
        let v: Value = r.json().await.unwrap();
        assert_eq!(status, 201, "{v}");
        v["sub_id"].as_str().unwrap().to_owned()
    }

    /// Waits for the process to exit by itself (a failpoint) and returns its
    /// exit code (`None`: killed by a signal).
    pub async fn wait_for_exit(&mut self) -> Option<i32> {
        let child = &mut self.child;
        let status = eventually("hookd serve to exit", || {
            let exited = child.try_wait().unwrap();
            async move { exited }
        })
        .await;
        status.code()
    }

    /// SIGKILL: no shutdown, no release of claims, like a power cut.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        self.child.wait().unwrap();
    }

    /// What the process logged to stderr.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(self.log.path()).unwrap_or_default()
    }
}

impl Drop for ServeProcess {
    fn drop(&mut self) {
        self.kill();
        if std::thread::panicking() {
            let log = self.log_text();
            let tail: Vec<&str> = log.lines().rev().take(40).collect();
            eprintln!("--- hookd serve on {} logged (last lines):", self.addr);
            for line in tail.into_iter().rev() {
                eprintln!("{line}");
            }
        }
    }
}
