//! The CLI for people (`hookd subscriptions|events|deliveries|health`): the
//! real binary against a real application, as someone at a terminal would
//! use it — human output by default, the API's JSON with `--json`, and the
//! API's message with a failing exit on an error.

use serde_json::Value;

use crate::helpers::*;

/// Runs `hookd args…`, requires success, and returns its standard output.
async fn ok(app: &TestApp, args: &[&str]) -> String {
    let out = app.cli(args).await;
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "hookd {args:?} failed\nstdout: {stdout}\nstderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// Runs `hookd args… --json` and parses what it printed.
async fn json(app: &TestApp, args: &[&str]) -> Value {
    let mut args = args.to_vec();
    args.push("--json");
    let stdout = ok(app, &args).await;
    serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("{args:?}: {e}: {stdout}"))
}

/// The first whitespace-separated word of `text` that starts with `prefix`.
fn word<'a>(text: &'a str, prefix: &str) -> &'a str {
    text.split_whitespace()
        .find(|w| w.starts_with(prefix))
        .unwrap_or_else(|| panic!("no {prefix}… in: {text}"))
}

/// The line of `text` that mentions `needle`.
fn line<'a>(text: &'a str, needle: &str) -> &'a str {
    text.lines()
        .find(|l| l.contains(needle))
        .unwrap_or_else(|| panic!("no line with {needle} in: {text}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cli_walkthrough_create_send_inspect_replay_update_delete() {
    let rx = TestReceiver::start("127.0.0.96").await;
    let app = spawn_app(Backend::Sqlite).await.unwrap();

    // Create: the secret is printed, with the warning that it is shown once.
    let out = ok(
        &app,
        &[
            "subscriptions",
            "create",
            "--url",
            &rx.url(),
            "--event-type",
            "order.*",
            "--event-type",
            "invoice.paid",
            "--description",
            "walkthrough",
            "--max-attempts",
            "5",
        ],
    )
    .await;
    let sub = word(&out, "sub_").to_owned();
    assert!(out.contains("created subscription"), "{out}");
    assert!(out.contains("order.*, invoice.paid"), "{out}");
    assert!(out.contains("max_attempts=5"), "{out}");
    assert!(word(&out, "whsec_").len() > 10, "{out}");
    assert!(out.contains("shown only this once"), "{out}");

    // List: a table whose row for it has its state and URL.
    let out = ok(&app, &["subscriptions", "list"]).await;
    assert!(out.starts_with("ID "), "{out}");
    let row = line(&out, &sub);
    assert!(row.contains("active") && row.contains(&rx.url()), "{out}");
    let out = ok(&app, &["subscriptions", "show", &sub]).await;
    assert!(
        out.contains("walkthrough") && !out.contains("whsec_"),
        "{out}"
    );

    // Send an event; its delivery shows up delivered.
    let out = ok(
        &app,
        &[
            "events",
            "send",
            "--type",
            "order.created",
            "--data",
            r#"{"order": 42}"#,
        ],
    )
    .await;
    assert!(out.starts_with("accepted event evt_"), "{out}");
    let listing = eventually("the delivery listed as delivered", || async {
        let out = ok(&app, &["deliveries", "list", "--subscription", &sub]).await;
        out.lines()
            .any(|l| l.contains("dlv_") && l.contains("delivered"))
            .then_some(out)
    })
    .await;
    let dlv = word(&listing, "dlv_").to_owned();
    let row = line(&listing, &dlv);
    assert!(
        row.contains("order.created") && row.contains("200"),
        "{listing}"
    );
    assert_eq!(rx.count(), 1);
    assert_eq!(rx.received()[0].json()["data"]["order"], 42);

    // Show: its attempts, as a table.
    let out = ok(&app, &["deliveries", "show", &dlv]).await;
    assert!(line(&out, "state").contains("delivered"), "{out}");
    assert!(out.contains(&sub), "{out}");
    assert!(line(&out, "STARTED").contains("STATUS"), "{out}");

    // Replay: the receiver gets it again, with the same webhook-id.
    let out = ok(&app, &["deliveries", "replay", &dlv]).await;
    assert!(
        out.contains(&dlv) && out.contains("same webhook-id"),
        "{out}"
    );
    let got = rx.wait_for(2).await;
    assert_eq!(got[0].header("webhook-id"), got[1].header("webhook-id"));

    // Health: every attempt in the last hour succeeded.
    let out = eventually("health counting both attempts", || async {
        let out = ok(&app, &["health", &sub]).await;
        out.contains("200: 2").then_some(out)
    })
    .await;
    assert!(line(&out, "success rate").contains("100%"), "{out}");
    assert!(line(&out, "circuit").contains("closed"), "{out}");
    assert!(line(&out, "shedding").contains("no"), "{out}");
    assert!(line(&out, "signals").contains("none"), "{out}");

    // Update, then delete.
    let out = ok(
        &app,
        &[
            "subscriptions",
            "update",
            &sub,
            "--state",
            "disabled",
            "--rate-limit",
            "7",
        ],
    )
    .await;
    assert!(line(&out, "state").contains("disabled"), "{out}");
    assert!(line(&out, "rate limit").contains('7'), "{out}");
    assert!(
        line(&out, "retry policy").contains("max_attempts=5"),
        "{out}"
    );
    let out = ok(&app, &["subscriptions", "delete", &sub]).await;
    assert!(out.contains("deleted subscription"), "{out}");

    // It is gone: the API's message, and a failing exit.
    let out = app.cli(&["subscriptions", "show", &sub]).await;
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("subscription not found"), "{stderr}");
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cli_json_is_the_apis_json_and_errors_exit_nonzero_with_its_message() {
    let rx = TestReceiver::start("127.0.0.97").await;
    let app = spawn_app(Backend::Sqlite).await.unwrap();

    let created = json(
        &app,
        &[
            "subscriptions",
            "create",
            "--url",
            &rx.url(),
            "--event-type",
            "user.created",
            "--ordered",
        ],
    )
    .await;
    let sub = created["sub_id"].as_str().unwrap().to_owned();
    assert!(created["secret"].as_str().unwrap().starts_with("whsec_"));
    assert_eq!(created["ordered"], true);
    let api = app.get_json(&format!("/subscriptions/{sub}")).await;
    let shown = json(&app, &["subscriptions", "show", &sub]).await;
    assert_eq!(shown, api);
    let listed = json(&app, &["subscriptions", "list", "--limit", "10"]).await;
    assert_eq!(listed["data"][0], api);
    assert!(listed["next_cursor"].is_null());

    // `--data @file`, sent byte for byte.
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("payload.json");
    std::fs::write(&file, r#"{"z": 1, "a": [true]}"#).unwrap();
    let data = format!("@{}", file.display());
    let sent = json(
        &app,
        &[
            "events",
            "send",
            "--type",
            "user.created",
            "--data",
            &data,
            "--idempotency-key",
            "k-1",
        ],
    )
    .await;
    let event_id = sent["event_id"].as_str().unwrap().to_owned();
    let got = rx.wait_for(1).await;
    assert!(
        String::from_utf8_lossy(&got[0].body).contains(r#""data":{"z": 1, "a": [true]}"#),
        "{:?}",
        got[0].body
    );
    let page = eventually("the delivery delivered", || async {
        let page = json(&app, &["deliveries", "list", "--subscription", &sub]).await;
        (page["data"][0]["state"] == "delivered").then_some(page)
    })
    .await;
    assert_eq!(page["data"][0]["event_id"], event_id.as_str());
    let dlv = page["data"][0]["delivery_id"].as_str().unwrap().to_owned();
    let one = json(&app, &["deliveries", "show", &dlv]).await;
    assert_eq!(one["attempts"][0]["status"], 200);
    let filtered = json(
        &app,
        &[
            "deliveries",
            "list",
            "--subscription",
            &sub,
            "--status",
            "dead",
        ],
    )
    .await;
    assert_eq!(filtered["data"], Value::Array(vec![]));
    let health = json(&app, &["health", &sub]).await;
    assert_eq!(health["sub_id"], sub.as_str());
    assert_eq!(health["success_rate"], 1.0);

    // Errors: the API's message on stderr, a failing exit, nothing on stdout.
    let unknown = "sub_00000000000000000000000000000000";
    for args in [
        vec!["health", unknown],
        vec!["health", unknown, "--json"],
        vec!["deliveries", "list", "--subscription", unknown],
        vec!["subscriptions", "delete", unknown],
    ] {
        let out = app.cli(&args).await;
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?}");
        assert!(
            stderr.contains("404 Not Found: subscription not found"),
            "{args:?}: {stderr}"
        );
        assert!(out.stdout.is_empty(), "{args:?}");
    }
    let out = app
        .cli(&[
            "subscriptions",
            "create",
            "--url",
            "ftp://x",
            "--event-type",
            "a.b",
        ])
        .await;
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("url"), "{stderr}");
    assert!(stderr.contains("validation_failed"), "{stderr}");
    let out = app
        .cli(&["events", "send", "--type", "a.b", "--data", "{nope"])
        .await;
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--data is not valid JSON"));

    // Without a token, it says how to give one.
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_hookd"));
    cmd.args(["subscriptions", "list", "--server", &app.url("")])
        .env_remove("HOOKD_TOKEN");
    let out = run(cmd).await;
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("HOOKD_TOKEN"));
    app.stop().await;
}
