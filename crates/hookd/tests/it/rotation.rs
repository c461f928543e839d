//! Signing-secret rotation end to end, on both backends: during the grace
//! window every delivery carries two signatures and verifies with either
//! secret; after it, only the new secret signs.

use base64::Engine as _;
use hmac::{Hmac, Mac};
use serde_json::json;
use sha2::Sha256;

use crate::helpers::*;

crate::on_both_backends!(deliveries_verify_with_either_secret_during_the_grace_window_only);

/// Whether one of the `v1,` signatures on `r` is the Standard Webhooks
/// signature by `secret`, computed here without hookd's signer: HMAC-SHA256
/// keyed with the base64 after `whsec_`, over `{id}.{timestamp}.{body}`.
fn signed_by(secret: &str, r: &Received) -> bool {
    let key = base64::engine::general_purpose::STANDARD
        .decode(secret.strip_prefix("whsec_").unwrap())
        .unwrap();
    let mut mac = Hmac::<Sha256>::new_from_slice(&key).unwrap();
    mac.update(
        format!(
            "{}.{}.",
            r.header("webhook-id"),
            r.header("webhook-timestamp")
        )
        .as_bytes(),
    );
    mac.update(&r.body);
    let expected = format!(
        "v1,{}",
        base64::engine::general_purpose::STANDARD.encode(mac.finalize().into_bytes())
    );
    signatures(r).any(|s| s == expected)
}

fn signatures(r: &Received) -> impl Iterator<Item = &str> {
    r.header("webhook-signature").split(' ')
}

/// Sends one event and returns the request it caused at `rx`.
async fn deliver_one(app: &TestApp, rx: &TestReceiver, n: u64) -> Received {
    let before = rx.count();
    app.send_event("key.rotated", json!({ "n": n })).await;
    let got = rx.wait_for(before + 1).await;
    let r = got[before].clone();
    assert_eq!(r.json()["data"]["n"], n, "one event at a time");
    r
}

async fn deliveries_verify_with_either_secret_during_the_grace_window_only(backend: Backend) {
    let Some(app) = spawn_app(backend).await else {
        return;
    };
    let rx = TestReceiver::start("127.0.0.61").await;
    let sub = app.subscribe(&rx.url(), &["key.*"]).await;
    let sub_id = sub["sub_id"].as_str().unwrap();
    let old = sub["secret"].as_str().unwrap().to_owned();

    let r = deliver_one(&app, &rx, 0).await;
    assert_eq!(signatures(&r).count(), 1);
    assert!(signed_by(&old, &r));

    // A grace window long enough to deliver in, short enough to wait out.
    let resp = app
        .post(
            &format!("/subscriptions/{sub_id}/secret/rotate"),
            &json!({ "grace_secs": 3 }),
        )
        .await;
    assert_eq!(resp.status(), 200);
    let rotated: serde_json::Value = resp.json().await.unwrap();
    assert_eq!(rotated["sub_id"], sub_id);
    let new = rotated["secret"].as_str().unwrap().to_owned();
    assert_ne!(new, old);
    let expires: chrono::DateTime<chrono::Utc> =
        serde_json::from_value(rotated["previous_expires_at"].clone()).unwrap();

    let r = deliver_one(&app, &rx, 1).await;
    assert!(
        chrono::Utc::now() < expires,
        "one delivery took longer than the whole grace window"
    );
    assert_eq!(
        signatures(&r).count(),
        2,
        "{}",
        r.header("webhook-signature")
    );
    assert!(signed_by(&old, &r), "the old secret still verifies");
    assert!(signed_by(&new, &r), "the new secret already verifies");

    // Once the window has passed, a delivery carries the new signature only.
    let mut n = 1;
    let r = eventually("a delivery signed by one secret only", || {
        n += 1;
        let (app, rx) = (&app, &rx);
        async move {
            let r = deliver_one(app, rx, n).await;
            (signatures(&r).count() == 1).then_some(r)
        }
    })
    .await;
    assert!(
        chrono::Utc::now() >= expires,
        "the old secret was dropped only after its window"
    );
    assert!(signed_by(&new, &r), "the new secret verifies");
    assert!(!signed_by(&old, &r), "the old secret no longer does");
    app.stop().await;
}
