//! Signing-secret rotation end to end, on both backends: during the grace
//! window every delivery carries two signatures and verifies with either
//! secret; after it, only the new secret signs.

use serde_json::json;

use crate::helpers::*;

crate::on_both_backends!(deliveries_verify_with_either_secret_during_the_grace_window_only);

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
    assert!(r.signed_by(&old));

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
    assert!(r.signed_by(&old), "the old secret still verifies");
    assert!(r.signed_by(&new), "the new secret already verifies");

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
    assert!(r.signed_by(&new), "the new secret verifies");
    assert!(!r.signed_by(&old), "the old secret no longer does");
    app.stop().await;
}

crate::on_both_backends!(two_concurrent_rotations_both_take_effect);

/// Two rotations at once take turns: the later one's `previous` is the
/// earlier one's new secret, so both callers' secrets verify during the
/// grace window — neither call answers 200 with a secret that never signs.
async fn two_concurrent_rotations_both_take_effect(backend: Backend) {
    let Some(app) = spawn_app(backend).await else {
        return;
    };
    let rx = TestReceiver::start("127.0.0.62").await;
    let sub = app.subscribe(&rx.url(), &["key.*"]).await;
    let sub_id = sub["sub_id"].as_str().unwrap();
    let path = format!("/subscriptions/{sub_id}/secret/rotate");
    let rotate = || async {
        let r = app.post(&path, &json!({ "grace_secs": 3600 })).await;
        assert_eq!(r.status(), 200);
        let v: serde_json::Value = r.json().await.unwrap();
        v["secret"].as_str().unwrap().to_owned()
    };
    let (a, b) = tokio::join!(rotate(), rotate());
    assert_ne!(a, b);
    let r = deliver_one(&app, &rx, 0).await;
    assert_eq!(
        signatures(&r).count(),
        2,
        "{}",
        r.header("webhook-signature")
    );
    assert!(r.signed_by(&a), "the first rotation's secret signs");
    assert!(r.signed_by(&b), "the second rotation's secret signs");
    app.stop().await;
}
