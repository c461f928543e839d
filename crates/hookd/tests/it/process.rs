//! The real `hookd` binary, as a user runs it.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::json;

use crate::helpers::{ServeProcess, eventually};

/// Polls `url` with `token` until the server answers; returns the status.
async fn answer_with(
    client: &reqwest::Client,
    url: &str,
    token: &str,
    what: &str,
) -> reqwest::StatusCode {
    eventually(what, || async {
        client
            .get(url)
            .bearer_auth(token)
            .send()
            .await
            .ok()
            .map(|r| r.status())
    })
    .await
}

/// Waits until `hookd serve` on `listen` answers `/healthz`.
async fn wait_until_serving(listen: &str) {
    let client = reqwest::Client::new();
    eventually("serve to answer /healthz", || async {
        client
            .get(format!("http://{listen}/healthz"))
            .send()
            .await
            .ok()
            .map(|_| ())
    })
    .await;
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn hookd(dir: &std::path::Path) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_hookd"));
    c.current_dir(dir)
        .env_remove("HOOKD_ADMIN_TOKEN")
        .env_remove("HOOKD_DATABASE_URL")
        .env("HOOKD_LOG", "warn");
    c
}

/// Sends SIGTERM and waits for the exit, failing (not hanging) if the
/// process does not stop within a generous bound.
fn terminate(child: &mut Child) -> std::process::ExitStatus {
    let pid = child.id().to_string();
    Command::new("kill").args(["-TERM", &pid]).status().unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            panic!("hookd did not stop within 30 s of SIGTERM");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Reads stdout lines until one looks like a generated token.
fn read_token(child: &mut Child) -> Option<String> {
    let out = child.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(out).lines().map_while(Result::ok) {
            if let Some(tok) = line.split_whitespace().find(|w| w.starts_with("hookd_")) {
                let _ = tx.send(tok.to_owned());
            }
        }
    });
    rx.recv_timeout(Duration::from_secs(30)).ok()
}

#[tokio::test]
async fn serve_with_no_configuration_creates_hookd_db_prints_a_token_once_and_stops_on_sigterm() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    let mut child = hookd(dir.path())
        .args(["serve", "--listen", &listen])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let token = read_token(&mut child).expect("the first start prints an admin token");

    let client = reqwest::Client::new();
    let url = format!("http://{listen}/subscriptions");
    let status = answer_with(&client, &url, &token, "the API to answer").await;
    assert_eq!(status, 200, "the printed token is an admin token");
    let wrong = client.get(&url).bearer_auth("nope").send().await.unwrap();
    assert_eq!(wrong.status(), 401);
    assert!(
        dir.path().join("hookd.db").exists(),
        "hookd.db is created in the working directory"
    );
    assert!(
        dir.path().join("hookd.db-wal").exists(),
        "the database runs in WAL mode"
    );
    assert!(
        terminate(&mut child).success(),
        "SIGTERM is a clean shutdown"
    );

    // The second start keeps the stored token and prints none.
    let mut again = hookd(dir.path())
        .args(["serve", "--listen", &listen])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let ok = answer_with(&client, &url, &token, "the API to answer again").await;
    assert_eq!(ok, 200, "the token from the first start still works");
    assert!(terminate(&mut again).success());
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut again.stdout.take().unwrap(), &mut rest).unwrap();
    assert!(
        !rest.contains("hookd_"),
        "no token printed on the second start: {rest}"
    );
}

#[test]
fn migrate_applies_the_schema_and_is_idempotent() {
    let dir = tempfile::tempdir().unwrap();
    for _ in 0..2 {
        let out = hookd(dir.path())
            .args(["migrate", "--database", "sqlite:other.db"])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    assert!(dir.path().join("other.db").exists());
}

#[test]
fn a_bad_database_url_is_a_clear_error_not_a_panic() {
    let dir = tempfile::tempdir().unwrap();
    let out = hookd(dir.path())
        .args(["migrate", "--database", "mysql://x"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("unsupported database URL"), "{err}");
    assert!(!err.contains("panicked"), "{err}");
}

#[tokio::test]
async fn a_second_serve_on_the_same_sqlite_file_refuses_to_start() {
    let dir = tempfile::tempdir().unwrap();
    let listen = format!("127.0.0.1:{}", free_port());
    let mut first = hookd(dir.path())
        .args(["serve", "--listen", &listen])
        .env("HOOKD_ADMIN_TOKEN", "t")
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    wait_until_serving(&listen).await;
    let other = format!("127.0.0.1:{}", free_port());
    let out = hookd(dir.path())
        .args(["serve", "--listen", &other])
        .env("HOOKD_ADMIN_TOKEN", "t")
        .output()
        .unwrap();
    assert!(
        !out.status.success(),
        "a second process must not run on the same file"
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("already in use by another hookd process"),
        "{err}"
    );
    assert!(terminate(&mut first).success());
}

#[tokio::test]
async fn listen_prints_webhooks_and_says_whether_the_signature_verifies() {
    use hookd_domain::signing::SigningSecret;
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let secret = SigningSecret::generate();
    let mut child = hookd(dir.path())
        .args([
            "listen",
            "--port",
            &port.to_string(),
            "--secret",
            &secret.expose(),
        ])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let out = child.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(out).lines().map_while(Result::ok) {
            if line.starts_with("signature:") {
                let _ = tx.send(line);
            }
        }
    });
    let client = reqwest::Client::new();
    let body = r#"{"id":"abc","type":"t.x","data":{}}"#;
    let ts = chrono::Utc::now().timestamp();
    let post = |sig: String| {
        client
            .post(format!("http://127.0.0.1:{port}/hook"))
            .header("webhook-id", "abc")
            .header("webhook-timestamp", ts.to_string())
            .header("webhook-signature", sig)
            .body(body)
            .send()
    };
    let good = secret.sign("abc", ts, body.as_bytes());
    let status = eventually("the receiver to answer", || async {
        post(good.clone()).await.ok().map(|r| r.status())
    })
    .await;
    assert_eq!(status, 200);
    let line = rx.recv_timeout(Duration::from_secs(30)).unwrap();
    assert!(line.contains("valid ✓"), "{line}");
    post(SigningSecret::generate().sign("abc", ts, body.as_bytes()))
        .await
        .unwrap();
    let line = rx.recv_timeout(Duration::from_secs(30)).unwrap();
    assert!(line.contains("INVALID"), "{line}");
    child.kill().unwrap();
    child.wait().unwrap();
}

#[tokio::test]
async fn sigterm_stops_serve_even_when_its_stderr_is_closed() {
    let dir = tempfile::tempdir().unwrap();
    let listen = format!("127.0.0.1:{}", free_port());
    let mut child = hookd(dir.path())
        .args(["serve", "--listen", &listen])
        .env("HOOKD_ADMIN_TOKEN", "t")
        .env("HOOKD_LOG", "info")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_until_serving(&listen).await;
    // Close the reading end, as `hookd serve 2>&1 | head -1` does.
    drop(child.stderr.take());
    let status = terminate(&mut child);
    assert!(status.success(), "{status:?}");
}

#[tokio::test]
async fn token_create_prints_a_customer_token_that_serve_then_honours() {
    let dir = tempfile::tempdir().unwrap();
    let db = format!("sqlite:{}", dir.path().join("tokens.db").display());
    // Before any `serve`: the command creates and migrates the database.
    let out = hookd(dir.path())
        .args(["token", "create", "--customer", "acme", "--label", "ci"])
        .args(["--database", &db])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let stdout = String::from_utf8(out.stdout).unwrap();
    let token = stdout.trim().to_owned();
    assert!(
        token.starts_with("hookd_") && !token.contains(char::is_whitespace),
        "stdout is the token alone: {stdout:?}"
    );
    let bad = hookd(dir.path())
        .args(["token", "create", "--customer", "", "--database", &db])
        .output()
        .unwrap();
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("--customer"));

    let serve = ServeProcess::start(&db, None).await;
    let acme = serve
        .subscribe_with(
            json!({"url": "http://127.0.0.1:9/in", "event_types": ["a.b"], "customer_id": "acme"}),
        )
        .await;
    let globex = serve
        .subscribe_with(json!({"url": "http://127.0.0.1:9/in", "event_types": ["a.b"], "customer_id": "globex"}))
        .await;
    let get = |path: String| {
        serve
            .client
            .get(serve.url(&path))
            .bearer_auth(&token)
            .send()
    };
    let list: serde_json::Value = get("/subscriptions".into())
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let ids: Vec<_> = list["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["sub_id"].clone())
        .collect();
    assert_eq!(
        ids,
        [json!(acme)],
        "the token sees acme's subscriptions only"
    );
    let other = get(format!("/subscriptions/{globex}")).await.unwrap();
    assert_eq!(other.status(), 404);
    // It is a customer token, not an admin one.
    let mint = serve
        .client
        .post(serve.url("/tokens"))
        .bearer_auth(&token)
        .json(&json!({"customer_id": "acme"}))
        .send()
        .await
        .unwrap();
    assert_eq!(mint.status(), 404);
}
