//! The customer portal (`/ui`) in a real browser: headless Chromium driven
//! through chromedriver (WebDriver), against the whole application on
//! SQLite and real receivers on loopback.
//!
//! Needs Debian's `chromium` and `chromium-driver` (`.ci/run` installs them).
//! Without them the tests fail under `CI=true` and are skipped, with a
//! message, elsewhere. Every wait polls with a deadline; none sleeps to
//! let something happen.
//!
//! The screenshots in `docs/screenshots/` are taken here.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU16, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use fantoccini::{Client, ClientBuilder, Locator};
use hookd::{App, AppConfig};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

const ADMIN_TOKEN: &str = "test-admin-token";
const TEST_ENCRYPTION_KEY: &str = "HwUBoQUkrCFALZ33ksQVMq5k5b9TuZL/6uLqXawljZg=";
/// Bounds each wait; not a performance assertion.
const DEADLINE: Duration = Duration::from_secs(45);
const XSS: &str = "<script>window.pwned=1</script>";

/// One browser at a time: the machine has two cores.
static BROWSER: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

// --- fixtures ----------------------------------------------------------------

fn find_program(names: &[&str]) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    for dir in std::env::split_paths(&path) {
        for name in names {
            let p = dir.join(name);
            if p.is_file() {
                return Some(p);
            }
        }
    }
    None
}

/// Chromium and chromedriver, or `None` (skip) outside CI. Under
/// `CI=true` a missing one fails the test.
fn browser_programs() -> Option<(PathBuf, PathBuf)> {
    let chromium = find_program(&["chromium", "chromium-browser"]);
    let driver = find_program(&["chromedriver"]);
    match (chromium, driver) {
        (Some(c), Some(d)) => Some((c, d)),
        (c, d) => {
            let msg = format!(
                "the portal's browser tests need chromium ({}) and chromedriver ({}): \
                 apt-get install chromium chromium-driver",
                if c.is_some() { "found" } else { "missing" },
                if d.is_some() { "found" } else { "missing" },
            );
            if std::env::var("CI").is_ok_and(|v| v == "true") {
                panic!("{msg}");
            }
            eprintln!("SKIPPED: {msg}");
            None
        }
    }
}

async fn eventually<T, F, Fut>(what: &str, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + DEADLINE;
    loop {
        if let Some(v) = f().await {
            return v;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for: {what}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// chromedriver as a child process on a free port, and a browser session.
struct Browser {
    client: Client,
    driver: Child,
}

impl Browser {
    async fn start(chromium: &Path, chromedriver: &Path) -> Self {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let driver = Command::new(chromedriver)
            .arg(format!("--port={port}"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("chromedriver starts");
        let mut caps = serde_json::Map::new();
        caps.insert(
            "goog:chromeOptions".into(),
            json!({
                "binary": chromium.to_string_lossy(),
                "args": [
                    "--headless=new",
                    "--no-sandbox",
                    "--disable-gpu",
                    "--disable-dev-shm-usage",
                    "--no-first-run",
                    "--window-size=1280,1000",
                ],
            }),
        );
        let url = format!("http://127.0.0.1:{port}");
        let mut driver = driver;
        let deadline = tokio::time::Instant::now() + DEADLINE;
        let client = loop {
            if let Some(status) = driver.try_wait().unwrap() {
                panic!("chromedriver exited: {status}");
            }
            match ClientBuilder::new(hyper_util::client::legacy::connect::HttpConnector::new())
                .capabilities(caps.clone())
                .connect(&url)
                .await
            {
                Ok(client) => break client,
                Err(e) => assert!(
                    tokio::time::Instant::now() < deadline,
                    "chromedriver gave no session: {e}"
                ),
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        Self { client, driver }
    }

    async fn close(mut self) {
        let _ = self.client.clone().close().await;
        let _ = self.driver.kill();
        let _ = self.driver.wait();
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        // After `close` this is a no-op; on a panic it ends the driver.
        let _ = self.driver.kill();
        let _ = self.driver.wait();
    }
}

/// Posts an `invoice.paid` event with the real `hookd events send`, as a
/// person at a terminal would.
async fn cli_send(app: &TestApp, token: &str, data: &str) {
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_hookd"));
    cmd.args(["events", "send", "--type", "invoice.paid", "--data", data])
        .args(["--server", &app.url("")])
        .env("HOOKD_TOKEN", token);
    let out = tokio::task::spawn_blocking(move || cmd.output().unwrap())
        .await
        .unwrap();
    assert!(
        out.status.success(),
        "hookd events send: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The whole application on a temporary SQLite database.
struct TestApp {
    addr: SocketAddr,
    client: reqwest::Client,
    shutdown: CancellationToken,
    _dir: tempfile::TempDir,
}

impl TestApp {
    async fn start() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let database = format!("sqlite:{}", dir.path().join("hookd.db").display());
        let mut dispatch = hookd_dispatch::DispatchConfig::standard("portal-test".to_owned());
        dispatch.poll_interval = Duration::from_millis(50);
        dispatch.attempt_timeout = Duration::from_secs(10);
        dispatch.shutdown_grace = Duration::from_secs(2);
        dispatch.egress.policy = hookd_domain::destination::DestinationPolicy::AllowPrivate;
        let mut config = AppConfig::new(database, dispatch);
        config.allow_private_destinations = true;
        config.admin_token = Some(ADMIN_TOKEN.to_owned());
        config.monitor.every = Duration::from_millis(100);
        config.dispatch.replay_every = Duration::from_millis(50);
        config.keyring = Some(hookd_store::crypto::Keyring::new(
            hookd_store::crypto::EncryptionKey::from_base64(TEST_ENCRYPTION_KEY).unwrap(),
        ));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let app = App::build(config, listener).await.expect("the app builds");
        let addr = app.local_addr();
        let shutdown = app.shutdown_token();
        tokio::spawn(app.run());
        Self {
            addr,
            client: reqwest::Client::new(),
            shutdown,
            _dir: dir,
        }
    }

    fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.addr, path)
    }

    async fn call(&self, token: &str, path: &str, body: &Value) -> (u16, Value) {
        let r = self
            .client
            .post(self.url(path))
            .bearer_auth(token)
            .json(body)
            .send()
            .await
            .unwrap();
        let status = r.status().as_u16();
        (status, r.json().await.unwrap_or(Value::Null))
    }

    /// `GET path` with `token`: the status and the JSON body (`Null` when
    /// there is none).
    async fn get(&self, token: &str, path: &str) -> (u16, Value) {
        let r = self
            .client
            .get(self.url(path))
            .bearer_auth(token)
            .send()
            .await
            .unwrap();
        let status = r.status().as_u16();
        (status, r.json().await.unwrap_or(Value::Null))
    }

    async fn customer_token(&self, customer: &str) -> String {
        let (status, v) = self
            .call(ADMIN_TOKEN, "/tokens", &json!({ "customer_id": customer }))
            .await;
        assert_eq!(status, 201, "{v}");
        v["token"].as_str().unwrap().to_owned()
    }
}

impl Drop for TestApp {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

/// A receiver on loopback whose status and body can be changed.
struct Receiver {
    addr: SocketAddr,
    status: Arc<AtomicU16>,
    body: Arc<Mutex<String>>,
    received: Arc<AtomicU16>,
    shutdown: CancellationToken,
}

impl Receiver {
    async fn start(ip: &str) -> Self {
        let status = Arc::new(AtomicU16::new(200));
        let body = Arc::new(Mutex::new("ok".to_owned()));
        let received = Arc::new(AtomicU16::new(0));
        let (s, b, n) = (status.clone(), body.clone(), received.clone());
        let app = axum::Router::new().fallback(move || {
            let (s, b, n) = (s.clone(), b.clone(), n.clone());
            async move {
                n.fetch_add(1, Ordering::SeqCst);
                let code = axum::http::StatusCode::from_u16(s.load(Ordering::SeqCst)).unwrap();
                let text = b.lock().unwrap().clone();
                (code, [("content-type", "text/html")], text)
            }
        });
        let listener = tokio::net::TcpListener::bind((ip, 0)).await.unwrap();
        let addr = listener.local_addr().unwrap();
        let shutdown = CancellationToken::new();
        let stop = shutdown.clone();
        tokio::spawn(async move {
            axum::serve(listener, app)
                .with_graceful_shutdown(stop.cancelled_owned())
                .await
                .unwrap();
        });
        Self {
            addr,
            status,
            body,
            received,
            shutdown,
        }
    }

    fn url(&self) -> String {
        format!("http://{}/hook", self.addr)
    }

    fn answer(&self, status: u16, body: &str) {
        *self.body.lock().unwrap() = body.to_owned();
        self.status.store(status, Ordering::SeqCst);
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

// --- browser helpers -----------------------------------------------------------

async fn js(c: &Client, script: &str) -> Value {
    c.execute(script, vec![]).await.unwrap()
}

/// Waits until `css` matches an element, and returns it.
async fn find(c: &Client, css: &str) -> fantoccini::elements::Element {
    eventually(&format!("an element matching {css}"), || async {
        c.find(Locator::Css(css)).await.ok()
    })
    .await
}

/// Waits until the text of `css` satisfies `ok`, and returns it.
async fn text_of(c: &Client, css: &str, what: &str, ok: impl Fn(&str) -> bool) -> String {
    eventually(what, || async {
        let e = c.find(Locator::Css(css)).await.ok()?;
        let t = e.text().await.ok()?;
        ok(&t).then_some(t)
    })
    .await
}

/// Waits until the element `css` has `attr` equal to `want`.
async fn attr_is(c: &Client, css: &str, attr: &str, want: &str) {
    eventually(&format!("{css} with {attr}={want}"), || async {
        let e = c.find(Locator::Css(css)).await.ok()?;
        (e.attr(attr).await.ok()?.as_deref() == Some(want)).then_some(())
    })
    .await
}

async fn fill(c: &Client, css: &str, text: &str) {
    eventually(&format!("typing into {css}"), || async {
        let e = c.find(Locator::Css(css)).await.ok()?;
        e.clear().await.ok()?;
        e.send_keys(text).await.ok()
    })
    .await
}

/// Clicks `css`, retrying while it is missing or being re-rendered.
async fn click(c: &Client, css: &str) {
    eventually(&format!("clicking {css}"), || async {
        c.find(Locator::Css(css)).await.ok()?.click().await.ok()
    })
    .await
}

/// Waits until the delivery log is not loading.
async fn log_settled(c: &Client) {
    find(c, "#deliveries:not([aria-busy])").await;
}

async fn sign_in(c: &Client, app: &TestApp, token: &str) {
    c.goto(&app.url("/ui")).await.unwrap();
    fill(c, "#token", token).await;
    click(c, "#signin-form button[type=submit]").await;
    text_of(c, "main h1", "the subscriptions list", |t| {
        t == "Subscriptions"
    })
    .await;
}

/// Opens a route of the page by its fragment and waits until it rendered.
async fn open(c: &Client, app: &TestApp, fragment: &str) {
    c.goto(&app.url(&format!("/ui{fragment}"))).await.unwrap();
    find(c, "main[data-ready]").await;
}

/// Clicks the log's Refresh until a delivery with `state` is listed.
async fn wait_for_delivery(c: &Client, state: &str) {
    let css = format!("details.delivery[data-state=\"{state}\"]");
    eventually(&format!("a {state} delivery in the log"), || async {
        c.find(Locator::Css("#log-refresh"))
            .await
            .ok()?
            .click()
            .await
            .ok()?;
        log_settled(c).await;
        c.find(Locator::Css(&css)).await.ok().map(|_| ())
    })
    .await
}

/// Clicks the log's Refresh until it lists exactly `n` deliveries, all
/// delivered.
async fn all_delivered(c: &Client, n: usize) {
    eventually(&format!("{n} deliveries, all delivered"), || async {
        c.find(Locator::Css("#log-refresh"))
            .await
            .ok()?
            .click()
            .await
            .ok()?;
        log_settled(c).await;
        let counts = js(
            c,
            "return [document.querySelectorAll('details.delivery').length, \
             document.querySelectorAll('details.delivery[data-state=\"delivered\"]').length]",
        )
        .await;
        (counts == json!([n, n])).then_some(())
    })
    .await
}

fn screenshot_path(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/screenshots");
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

async fn screenshot(c: &Client, name: &str, height: u32) {
    c.set_window_size(1280, height).await.unwrap();
    js(c, "window.scrollTo(0, 0); return 0").await;
    let png = c.screenshot().await.unwrap();
    assert!(png.starts_with(b"\x89PNG"), "a PNG");
    std::fs::write(screenshot_path(name), png).unwrap();
    c.set_window_size(1280, 1000).await.unwrap();
}

// --- the tests -------------------------------------------------------------------

/// Sign in with a customer token, create a subscription, watch a delivery
/// arrive, break the receiver (which answers with markup), see the badge
/// turn, fix it, bulk-replay and watch the job reach 100 %.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_customer_sees_and_fixes_a_failing_endpoint_in_the_portal() {
    let Some((chromium, chromedriver)) = browser_programs() else {
        return;
    };
    let _one = BROWSER.lock().await;
    let app = TestApp::start().await;
    let acme = app.customer_token("acme").await;
    let receiver = Receiver::start("127.0.0.1").await;
    let healthy = Receiver::start("127.0.0.1").await;
    let browser = Browser::start(&chromium, &chromedriver).await;
    let c = &browser.client;

    sign_in(c, &app, &acme).await;
    text_of(c, "#who", "the role", |t| t.contains("customer token")).await;

    // Create a subscription through the form.
    click(c, "a.button.primary[href=\"#/new\"]").await;
    fill(c, "#url", &receiver.url()).await;
    fill(c, "#event_types", "invoice.*").await;
    fill(c, "#description", "Billing <b>endpoint</b>").await;
    fill(c, "#max_attempts", "3").await;
    click(c, "#subscription-form button[type=submit]").await;
    let secret = text_of(c, "#secret", "the secret, shown once", |t| {
        t.starts_with("whsec_")
    })
    .await;
    assert!(secret.len() > 10);
    click(c, ".secret button").await;
    let sub_url = text_of(c, "#sub-url", "the subscription page", |t| !t.is_empty()).await;
    assert_eq!(sub_url, receiver.url());
    let fragment: String = js(c, "return location.hash").await.as_str().unwrap().into();
    let sub_id = fragment.trim_start_matches("#/s/").to_owned();
    assert!(sub_id.starts_with("sub_"), "{fragment}");

    // A second, healthy subscription so the list shows both kinds of badge.
    let (status, v) = app
        .call(
            &acme,
            "/subscriptions",
            &json!({ "url": healthy.url(), "event_types": ["invoice.*"], "description": "Audit log" }),
        )
        .await;
    assert_eq!(status, 201, "{v}");

    // An event, posted with the CLI, is delivered and shows up as delivered.
    cli_send(&app, &acme, r#"{"invoice": 1}"#).await;
    wait_for_delivery(c, "delivered").await;
    open(c, &app, "#/").await;
    attr_is(
        c,
        &format!("tr[data-sub-id=\"{sub_id}\"] .badge[data-health]"),
        "data-health",
        "ok",
    )
    .await;

    // The receiver fails, answering with a script: shown as text, never run.
    receiver.answer(400, XSS);
    cli_send(&app, &acme, r#"{"invoice": 2}"#).await;
    open(c, &app, &format!("#/s/{sub_id}")).await;
    wait_for_delivery(c, "failed").await;
    click(c, "details.delivery[data-state=\"failed\"] summary").await;
    text_of(
        c,
        "details.delivery[data-state=\"failed\"] pre.snippet",
        "the receiver's answer, as text",
        |t| t == XSS,
    )
    .await;
    assert_eq!(js(c, "return typeof window.pwned").await, "undefined");
    assert_eq!(
        js(c, "return document.querySelectorAll('main script').length").await,
        0
    );
    text_of(c, "#health .badge", "the page's badge turns", |t| {
        t == "failing"
    })
    .await;

    // The list's badge turns too; the description is text, not markup.
    open(c, &app, "#/").await;
    attr_is(
        c,
        &format!("tr[data-sub-id=\"{sub_id}\"] .badge[data-health]"),
        "data-health",
        "bad",
    )
    .await;
    text_of(
        c,
        &format!("tr[data-sub-id=\"{sub_id}\"] td.url"),
        "the description as text",
        |t| t.contains("Billing <b>endpoint</b>"),
    )
    .await;
    assert_eq!(
        js(c, "return document.querySelectorAll('main b').length").await,
        0
    );
    // Both rows' health has loaded before the picture.
    eventually("every badge loaded", || async {
        let n = js(
            c,
            "return document.querySelectorAll('#subscriptions .badge[data-health]').length",
        )
        .await;
        (n == 2).then_some(())
    })
    .await;
    screenshot(c, "portal-subscriptions.png", 700).await;

    // Fixed: bulk replay of the failed delivery reaches 100 %.
    receiver.answer(200, "thanks");
    let before = receiver.received.load(Ordering::SeqCst);
    open(c, &app, &format!("#/s/{sub_id}")).await;
    click(c, "#replay-start").await;
    attr_is(c, "#job-label", "data-state", "completed").await;
    attr_is(c, "#job-label", "data-percent", "100").await;
    assert_eq!(
        js(c, "return document.getElementById('job-progress').value").await,
        100
    );
    assert!(receiver.received.load(Ordering::SeqCst) > before);
    all_delivered(c, 2).await;

    // Replay one delivery from the log: it is sent again.
    let before = receiver.received.load(Ordering::SeqCst);
    log_settled(c).await;
    click(c, "details.delivery summary").await;
    click(c, "details.delivery[open] button.replay-one").await;
    eventually("the replayed delivery is sent again", || async {
        (receiver.received.load(Ordering::SeqCst) > before).then_some(())
    })
    .await;
    find(c, "#chart svg").await;
    // Open the failed-then-replayed delivery's attempts for the picture.
    all_delivered(c, 2).await;
    let _ = js(
        c,
        "document.querySelectorAll('details.delivery').forEach(function (d) { d.open = true; }); return 0",
    )
    .await;
    screenshot(c, "portal-subscription.png", 2600).await;
    assert_eq!(js(c, "return typeof window.pwned").await, "undefined");

    // Works at phone width: no horizontal scrolling of the page.
    c.set_window_size(390, 844).await.unwrap();
    let overflow = js(
        c,
        "return document.documentElement.scrollWidth - document.documentElement.clientWidth",
    )
    .await;
    assert!(
        overflow.as_i64().unwrap() <= 0,
        "horizontal overflow {overflow}"
    );
    browser.close().await;
}

/// A portal link signs in as its customer, and that customer sees nothing of
/// another's; the admin sees every customer's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_portal_link_shows_only_its_customers_subscriptions() {
    let Some((chromium, chromedriver)) = browser_programs() else {
        return;
    };
    let _one = BROWSER.lock().await;
    let app = TestApp::start().await;
    let globex = app.customer_token("globex").await;
    let receiver = Receiver::start("127.0.0.1").await;
    let (status, theirs) = app
        .call(
            &globex,
            "/subscriptions",
            &json!({ "url": format!("{}/globex-only", receiver.url()), "event_types": ["*"], "description": "globex private" }),
        )
        .await;
    assert_eq!(status, 201, "{theirs}");
    let their_sub = theirs["sub_id"].as_str().unwrap().to_owned();

    // Only an admin makes portal links.
    let (status, _) = app
        .call(&globex, "/customers/acme/portal-link", &json!({}))
        .await;
    assert_eq!(status, 404);
    let (status, link) = app
        .call(ADMIN_TOKEN, "/customers/acme/portal-link", &json!({}))
        .await;
    assert_eq!(status, 201, "{link}");
    let url = link["url"].as_str().unwrap();
    assert!(
        url.starts_with(&format!("{}#token=hookd_", app.url("/ui"))),
        "{url}"
    );
    // Short-lived: an hour from now (the store refuses it after that; the
    // conformance suite's `an_expired_token_is_not_found` proves it).
    let expires_at: chrono::DateTime<chrono::Utc> =
        serde_json::from_value(link["expires_at"].clone()).unwrap();
    let left = expires_at - chrono::Utc::now();
    assert!(
        left > chrono::Duration::minutes(55) && left <= chrono::Duration::hours(1),
        "{link}"
    );

    let browser = Browser::start(&chromium, &chromedriver).await;
    let c = &browser.client;
    c.goto(url).await.unwrap();
    text_of(c, "main h1", "the list, signed in by the link", |t| {
        t == "Subscriptions"
    })
    .await;
    // The token leaves the address bar at once.
    assert_eq!(js(c, "return location.hash").await, "#/");
    find(c, "#empty:not([hidden])").await;
    let source = c.source().await.unwrap();
    assert!(!source.contains("globex"), "globex leaks into acme's list");

    // Another customer's subscription, asked for by id: not found.
    open(c, &app, &format!("#/s/{their_sub}")).await;
    find(c, "#not-found").await;
    assert!(!c.source().await.unwrap().contains("globex"));

    // The admin sees it, with its customer.
    click(c, "#signout").await;
    sign_in(c, &app, ADMIN_TOKEN).await;
    let customer = text_of(
        c,
        &format!("tr[data-sub-id=\"{their_sub}\"] td[data-label=\"Customer\"]"),
        "the customer column",
        |t| !t.is_empty(),
    )
    .await;
    assert_eq!(customer, "globex");
    browser.close().await;
}

/// A `dt`/`dd` pair of the page's settings: the `dd`s whose `dt` is `label`.
async fn setting(c: &Client, label: &str) -> Value {
    c.execute(
        "var label = arguments[0];\
         return Array.from(document.querySelectorAll('dl.kv dt'))\
           .filter(function (d) { return d.textContent === label; })\
           .map(function (d) { return d.nextElementSibling.textContent; })",
        vec![json!(label)],
    )
    .await
    .unwrap()
}

/// Clicks `css`, which asks to confirm with `confirm()`, and accepts the
/// dialog; returns its text. Clicked once: a retry would find the dialog
/// open, and the driver would dismiss it.
async fn click_and_confirm(c: &Client, css: &str) -> String {
    find(c, css).await.click().await.unwrap();
    let text = eventually(&format!("the dialog {css} opens"), || async {
        c.get_alert_text().await.ok()
    })
    .await;
    c.accept_alert().await.unwrap();
    text
}

/// Posts an `invoice.paid` event through the API; returns its id.
async fn post_event(app: &TestApp, token: &str, n: usize) -> String {
    let (status, v) = app
        .call(
            token,
            "/events",
            &json!({ "type": "invoice.paid", "payload": { "invoice": n } }),
        )
        .await;
    assert_eq!(status, 202, "{v}");
    v["event_id"].as_str().unwrap().to_owned()
}

/// A subscription's `state` as the API reports it.
async fn api_state(app: &TestApp, token: &str, path: &str) -> String {
    let (status, v) = app.get(token, path).await;
    assert_eq!(status, 200, "{v}");
    v["state"].as_str().unwrap().to_owned()
}

/// The one delivery of the subscription at `path` in `state`, by the API:
/// its id and its event's.
async fn only_delivery(app: &TestApp, token: &str, path: &str, state: &str) -> (String, String) {
    let (status, v) = app
        .get(token, &format!("{path}/deliveries?status={state}"))
        .await;
    assert_eq!(status, 200, "{v}");
    let data = v["data"].as_array().unwrap();
    assert_eq!(data.len(), 1, "{v}");
    (
        data[0]["delivery_id"].as_str().unwrap().to_owned(),
        data[0]["event_id"].as_str().unwrap().to_owned(),
    )
}

/// Sets the log's status filter (`""`: any), applies it, and waits until
/// the log lists exactly `want` (delivery ids, in any order), every one in
/// `state`.
async fn filter_log(c: &Client, state: &str, want: &[String]) {
    find(c, "#f-status")
        .await
        .select_by_value(state)
        .await
        .unwrap();
    click(c, "#log-apply").await;
    let mut want = want.to_vec();
    want.sort();
    let want = json!(want);
    eventually(&format!("only {state:?} deliveries listed"), || async {
        log_settled(c).await;
        let listed = c
            .execute(
                "var state = arguments[0];\
                 var all = Array.from(document.querySelectorAll('#deliveries details.delivery'));\
                 if (state && !all.every(function (d) { return d.getAttribute('data-state') === state; })) return null;\
                 return all.map(function (d) { return d.getAttribute('data-delivery-id'); }).sort();",
                vec![json!(state)],
            )
            .await
            .ok()?;
        (listed == want).then_some(())
    })
    .await;
}

/// The subscription page's controls, each checked against the API: pause
/// and resume, rotate the secret (shown once), filter the delivery log by
/// status, see the likely configuration error named, and delete.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_customer_pauses_rotates_filters_and_deletes_from_the_subscription_page() {
    let Some((chromium, chromedriver)) = browser_programs() else {
        return;
    };
    let _one = BROWSER.lock().await;
    let app = TestApp::start().await;
    let acme = app.customer_token("acme").await;
    let receiver = Receiver::start("127.0.0.1").await;
    let (status, created) = app
        .call(
            &acme,
            "/subscriptions",
            &json!({ "url": receiver.url(), "event_types": ["invoice.*"], "description": "Managed" }),
        )
        .await;
    assert_eq!(status, 201, "{created}");
    let sub_id = created["sub_id"].as_str().unwrap().to_owned();
    let first_secret = created["secret"].as_str().unwrap().to_owned();
    assert!(first_secret.starts_with("whsec_"), "{created}");
    let path = format!("/subscriptions/{sub_id}");

    let browser = Browser::start(&chromium, &chromedriver).await;
    let c = &browser.client;
    sign_in(c, &app, &acme).await;
    open(c, &app, &format!("#/s/{sub_id}")).await;
    text_of(c, "#sub-url", "the subscription page", |t| {
        t == receiver.url()
    })
    .await;
    assert_eq!(setting(c, "State").await, json!(["active"]));

    // 1. Pause: the API's state is `disabled` (there is no `paused`), and
    // the page says so.
    text_of(c, "#toggle-state", "the Pause button", |t| t == "Pause").await;
    click(c, "#toggle-state").await;
    eventually("the API reports the subscription paused", || async {
        (api_state(&app, &acme, &path).await == "disabled").then_some(())
    })
    .await;
    text_of(c, "#toggle-state", "the Resume button", |t| t == "Resume").await;
    eventually("the settings show it disabled", || async {
        (setting(c, "State").await == json!(["disabled"])).then_some(())
    })
    .await;
    text_of(c, "#health .badge", "the disabled badge", |t| {
        t == "disabled"
    })
    .await;
    text_of(c, "#status", "the paused message", |t| {
        t.starts_with("Paused")
    })
    .await;

    // ... and resume.
    click(c, "#toggle-state").await;
    eventually("the API reports the subscription active", || async {
        (api_state(&app, &acme, &path).await == "active").then_some(())
    })
    .await;
    text_of(c, "#toggle-state", "the Pause button again", |t| {
        t == "Pause"
    })
    .await;
    eventually("the settings show it active", || async {
        (setting(c, "State").await == json!(["active"])).then_some(())
    })
    .await;
    text_of(c, "#status", "the resumed message", |t| t == "Resumed.").await;
    text_of(c, "#health .badge", "the health badge again", |t| {
        t == "healthy (no recent attempts)"
    })
    .await;

    // 2. Rotate the secret: a new one, shown once, gone once dismissed.
    let prompt = click_and_confirm(c, "#rotate").await;
    assert!(prompt.contains("signing secret"), "{prompt}");
    let new_secret = text_of(c, "#secret", "the new secret, shown once", |t| {
        t.starts_with("whsec_")
    })
    .await;
    assert_ne!(new_secret, first_secret);
    text_of(c, "#secret-title", "the rotation's title", |t| {
        t == "New signing secret"
    })
    .await;
    text_of(c, "#status", "the rotation message", |t| {
        t.starts_with("Secret rotated")
    })
    .await;
    let (_, shown) = app.get(&acme, &path).await;
    assert!(!shown.to_string().contains(&new_secret), "{shown}");
    click(c, ".secret button").await;
    eventually("the new secret leaves the page", || async {
        let html = js(c, "return document.documentElement.outerHTML").await;
        let html = html.as_str()?;
        (html.contains(&sub_id) && !html.contains(&new_secret)).then_some(())
    })
    .await;
    assert!(!c.source().await.unwrap().contains(&new_secret));

    // 3. The log's status filter: one delivered, one failed.
    let ok_event = post_event(&app, &acme, 1).await;
    wait_for_delivery(c, "delivered").await;
    receiver.answer(400, "bad request");
    let bad_event = post_event(&app, &acme, 2).await;
    wait_for_delivery(c, "failed").await;
    let (failed_id, event) = only_delivery(&app, &acme, &path, "failed").await;
    assert_eq!(event, bad_event);
    let (delivered_id, event) = only_delivery(&app, &acme, &path, "delivered").await;
    assert_eq!(event, ok_event);
    filter_log(c, "failed", std::slice::from_ref(&failed_id)).await;
    filter_log(c, "delivered", std::slice::from_ref(&delivered_id)).await;
    filter_log(c, "", &[delivered_id.clone(), failed_id.clone()]).await;

    // 4. Every attempt now gets a 401: enough of them (at least the rule's
    // minimum, and the share it needs next to the one 400 above) and the
    // health names the likely configuration error, as does the page.
    use hookd_domain::health::{MIN_FAILURES, MIN_SHARE_PERCENT};
    let others = 1; // the 400
    let needed = (others * MIN_SHARE_PERCENT)
        .div_ceil(100 - MIN_SHARE_PERCENT)
        .max(MIN_FAILURES);
    receiver.answer(401, "unauthorized");
    for n in 0..needed {
        post_event(&app, &acme, 100 + n as usize).await;
    }
    let health = eventually("the health reports a configuration error", || async {
        let (status, h) = app.get(&acme, &format!("{path}/health")).await;
        assert_eq!(status, 200, "{h}");
        (h["likely_configuration_error"]["status"] == 401).then_some(h)
    })
    .await;
    assert_eq!(health["last_status_counts"]["401"], needed, "{health}");
    text_of(c, "#health .badge", "the configuration error badge", |t| {
        t == "configuration error 401"
    })
    .await;
    attr_is(c, "#health .badge", "data-health", "bad").await;
    text_of(c, "#health", "the health's explanation", |t| {
        t.contains("your endpoint answers 401")
    })
    .await;
    open(c, &app, "#/").await;
    let row = format!("tr[data-sub-id=\"{sub_id}\"]");
    text_of(
        c,
        &format!("{row} .badge[data-health]"),
        "the list's configuration error badge",
        |t| t == "configuration error 401",
    )
    .await;
    text_of(
        c,
        &format!("{row} td.health"),
        "the list's health facts",
        |t| t.contains("likely configuration error: 401"),
    )
    .await;

    // 5. Delete from the page: gone from the API and from the list.
    open(c, &app, &format!("#/s/{sub_id}")).await;
    // Every text the status line takes from here on, for the last check.
    js(
        c,
        "var line = document.getElementById('status');\
         window.statusHistory = [];\
         new MutationObserver(function () { window.statusHistory.push(line.textContent); })\
           .observe(line, { childList: true, characterData: true, subtree: true });\
         return 0",
    )
    .await;
    let prompt = click_and_confirm(c, "#delete").await;
    assert!(prompt.starts_with("Delete this subscription?"), "{prompt}");
    eventually("the API no longer knows it", || async {
        (app.get(&acme, &path).await.0 == 404).then_some(())
    })
    .await;
    text_of(c, "main h1", "back on the list", |t| t == "Subscriptions").await;
    find(c, "main[data-ready] #empty:not([hidden])").await;
    assert!(c.find(Locator::Css(&row)).await.is_err());
    assert!(!c.source().await.unwrap().contains(&sub_id));
    // The page says what happened, and keeps saying it on the list it went
    // back to (as "Paused…", "Resumed." and "Secret rotated…" stay).
    let history = js(c, "return window.statusHistory").await;
    text_of(
        c,
        "#status",
        &format!("the deletion message shown on the list (the status line took {history})"),
        |t| t == "Subscription deleted.",
    )
    .await;
    browser.close().await;
}
