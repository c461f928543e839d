//! Subscription secrets at rest on PostgreSQL: what the table holds (read
//! raw, past the store), legacy plaintext rows, and key rotation.

use chrono::{SubsecRound, Utc};
use hookd_domain::SubscriptionId;
use hookd_domain::signing::SigningSecret;
use hookd_store::conformance::new_sub;
use hookd_store::crypto::{EncryptionKey, Keyring};
use hookd_store::{Store, StoreError, Subscription};
use hookd_store_postgres::{PgOptions, PgStore, testing};
use sqlx::{Connection, PgConnection};

async fn open(url: &str, keyring: &Keyring) -> PgStore {
    let opts = PgOptions {
        keyring: keyring.clone(),
        ..PgOptions::default()
    };
    let store = PgStore::connect(url, opts).await.expect("connect");
    store.migrate().await.expect("migrate");
    store
}

/// `(secret, previous_secret)` as stored.
async fn stored(conn: &mut PgConnection, id: &SubscriptionId) -> (String, Option<String>) {
    sqlx::query_as("SELECT secret, previous_secret FROM subscriptions WHERE sub_id = $1")
        .bind(id.as_uuid())
        .fetch_one(conn)
        .await
        .unwrap()
}

fn assert_sealed_under(text: &str, key: &EncryptionKey, plaintext: &SigningSecret) {
    let exposed = plaintext.expose();
    let body = exposed.strip_prefix("whsec_").unwrap();
    assert!(
        text.starts_with(&format!("enc:v1:{}:", key.id())),
        "sealed under {}: {text}",
        key.id()
    );
    assert!(!text.contains(body), "the plaintext is not in the column");
}

async fn create_rotating(store: &PgStore) -> Subscription {
    let mut new = new_sub("secrets.example", None);
    let until = (Utc::now() + chrono::Duration::days(1)).trunc_subsecs(0);
    new.keys.previous = Some((SigningSecret::generate(), until));
    store.create_subscription(new).await.unwrap()
}

#[tokio::test]
async fn secrets_are_sealed_at_rest_and_legacy_plaintext_is_resealed() {
    let Some(db) = testing::fresh_schema().await else {
        return;
    };
    let key = EncryptionKey::generate();
    let keyring = Keyring::new(key.clone());
    let store = open(&db.url, &keyring).await;
    let mut conn = PgConnection::connect(&db.url).await.unwrap();
    let sub = create_rotating(&store).await;
    let (secret, previous) = stored(&mut conn, &sub.id).await;
    assert_sealed_under(&secret, &key, &sub.keys.current);
    assert_sealed_under(
        &previous.unwrap(),
        &key,
        &sub.keys.previous.as_ref().unwrap().0,
    );

    // As a database written before secrets were sealed holds them.
    let legacy = create_rotating(&store).await;
    sqlx::query("UPDATE subscriptions SET secret = $1, previous_secret = $2 WHERE sub_id = $3")
        .bind(legacy.keys.current.expose())
        .bind(legacy.keys.previous.as_ref().unwrap().0.expose())
        .bind(legacy.id.as_uuid())
        .execute(&mut conn)
        .await
        .unwrap();
    assert_eq!(
        store.get_subscription(&legacy.id).await.unwrap().keys,
        legacy.keys
    );
    assert_eq!(
        store.reseal_secrets().await.unwrap(),
        1,
        "only the legacy row"
    );
    assert_eq!(store.reseal_secrets().await.unwrap(), 0, "idempotent");
    let (secret, previous) = stored(&mut conn, &legacy.id).await;
    assert_sealed_under(&secret, &key, &legacy.keys.current);
    assert_sealed_under(
        &previous.unwrap(),
        &key,
        &legacy.keys.previous.as_ref().unwrap().0,
    );
    let after = store.get_subscription(&legacy.id).await.unwrap();
    assert_eq!(after.keys, legacy.keys);
    assert_eq!(
        after.updated_at, legacy.updated_at,
        "resealing is no update"
    );

    conn.close().await.unwrap();
    store.close().await;
    db.cleanup().await.unwrap();
}

#[tokio::test]
async fn rotation_reseals_under_the_new_key_so_the_old_one_can_go() {
    let Some(db) = testing::fresh_schema().await else {
        return;
    };
    let (a, b) = (EncryptionKey::generate(), EncryptionKey::generate());
    let mut conn = PgConnection::connect(&db.url).await.unwrap();

    let old = open(&db.url, &Keyring::new(a.clone())).await;
    let sub = create_rotating(&old).await;
    let deleted = old
        .create_subscription(new_sub("gone.example", None))
        .await
        .unwrap();
    old.delete_subscription(&deleted.id).await.unwrap();
    old.close().await;

    let only_b = open(&db.url, &Keyring::new(b.clone())).await;
    let err = only_b.get_subscription(&sub.id).await.unwrap_err();
    assert!(matches!(err, StoreError::Corrupt(_)), "{err:?}");
    assert!(err.to_string().contains(a.id()), "{err}");

    let rotating = open(&db.url, &Keyring::new(b.clone()).with_previous([a.clone()])).await;
    assert_eq!(
        rotating.get_subscription(&sub.id).await.unwrap().keys,
        sub.keys
    );
    assert_eq!(
        rotating.reseal_secrets().await.unwrap(),
        2,
        "deleted rows too"
    );
    assert_eq!(rotating.reseal_secrets().await.unwrap(), 0);
    rotating.close().await;

    let (secret, previous) = stored(&mut conn, &sub.id).await;
    assert_sealed_under(&secret, &b, &sub.keys.current);
    assert_sealed_under(
        &previous.unwrap(),
        &b,
        &sub.keys.previous.as_ref().unwrap().0,
    );
    let (gone, _) = stored(&mut conn, &deleted.id).await;
    assert_sealed_under(&gone, &b, &deleted.keys.current);
    assert_eq!(
        only_b.get_subscription(&sub.id).await.unwrap().keys,
        sub.keys
    );

    conn.close().await.unwrap();
    only_b.close().await;
    db.cleanup().await.unwrap();
}

#[tokio::test]
async fn a_sealed_secret_moved_to_another_row_does_not_open() {
    let Some(db) = testing::fresh_schema().await else {
        return;
    };
    let store = open(&db.url, &Keyring::ephemeral()).await;
    let mut conn = PgConnection::connect(&db.url).await.unwrap();
    let victim = store
        .create_subscription(new_sub("victim.example", None))
        .await
        .unwrap();
    let attacker = store
        .create_subscription(new_sub("attacker.example", None))
        .await
        .unwrap();
    sqlx::query(
        "UPDATE subscriptions SET secret = (SELECT secret FROM subscriptions WHERE sub_id = $1) \
         WHERE sub_id = $2",
    )
    .bind(victim.id.as_uuid())
    .bind(attacker.id.as_uuid())
    .execute(&mut conn)
    .await
    .unwrap();
    let err = store.get_subscription(&attacker.id).await.unwrap_err();
    assert!(matches!(err, StoreError::Corrupt(_)), "{err:?}");
    conn.close().await.unwrap();
    store.close().await;
    db.cleanup().await.unwrap();
}
