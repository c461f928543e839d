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
