//! Subscription secrets at rest: what the database file holds (read raw,
//! past the store), legacy plaintext rows, key rotation, and the key file.

use std::path::Path;

use chrono::{SubsecRound, Utc};
use hookd_domain::SubscriptionId;
use hookd_domain::signing::SigningSecret;
use hookd_store::conformance::new_sub;
use hookd_store::crypto::{EncryptionKey, Keyring};
use hookd_store::{Store, StoreError, Subscription, SubscriptionPatch};
use hookd_store_sqlite::{SqliteStore, key_file};
use sqlx::sqlite::SqliteConnectOptions;
use sqlx::{Connection, SqliteConnection};

async fn open(path: &Path, keyring: &Keyring) -> SqliteStore {
    let store = SqliteStore::connect_with_keyring(path, keyring.clone())
        .await
        .unwrap();
    store.migrate().await.unwrap();
    store
}

/// A connection past the store, for reading and planting raw values. Used
/// only while no store is open on the file, or read-only.
async fn raw(path: &Path) -> SqliteConnection {
    SqliteConnection::connect_with(&SqliteConnectOptions::new().filename(path))
        .await
        .unwrap()
}

/// `(secret, previous_secret)` as stored.
async fn stored(path: &Path, id: &SubscriptionId) -> (String, Option<String>) {
    let mut conn = raw(path).await;
    let row = sqlx::query_as("SELECT secret, previous_secret FROM subscriptions WHERE sub_id = ?")
        .bind(id.as_uuid())
        .fetch_one(&mut conn)
        .await
        .unwrap();
    conn.close().await.unwrap();
    row
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

/// A subscription with a previous secret too, so both columns are filled.
async fn create_rotating(store: &SqliteStore) -> Subscription {
    let mut new = new_sub("secrets.example", None);
    let until = (Utc::now() + chrono::Duration::days(1)).trunc_subsecs(0);
    new.keys.previous = Some((SigningSecret::generate(), until));
    store.create_subscription(new).await.unwrap()
}

#[tokio::test]
async fn secrets_are_sealed_at_rest_under_the_current_key() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("hookd.db");
    let key = EncryptionKey::generate();
    let store = open(&path, &Keyring::new(key.clone())).await;
    let sub = create_rotating(&store).await;
    let (secret, previous) = stored(&path, &sub.id).await;
    assert_sealed_under(&secret, &key, &sub.keys.current);
    assert_sealed_under(&previous.unwrap(), &key, &sub.keys.previous.unwrap().0);

    // An update that rotates the secret seals the new one as well.
    let fresh = SigningSecret::generate();
    let patch = SubscriptionPatch {
        keys: Some(hookd_domain::subscription::SigningKeys {
            current: fresh.clone(),
            previous: None,
        }),
        ..Default::default()
    };
    store.update_subscription(&sub.id, patch).await.unwrap();
    let (secret, previous) = stored(&path, &sub.id).await;
    assert_sealed_under(&secret, &key, &fresh);
    assert_eq!(previous, None);
    assert_eq!(
        store.get_subscription(&sub.id).await.unwrap().keys.current,
        fresh
    );
    store.close().await;
}

#[tokio::test]
async fn legacy_plaintext_secrets_are_read_and_sealed_by_reseal() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("hookd.db");
    let key = EncryptionKey::generate();
    let keyring = Keyring::new(key.clone());
    let store = open(&path, &keyring).await;
    let legacy = create_rotating(&store).await;
    let sealed = store
        .create_subscription(new_sub("already.example", None))
        .await
        .unwrap();
    store.close().await;
    // As a database written before secrets were sealed holds them.
    let mut conn = raw(&path).await;
    sqlx::query("UPDATE subscriptions SET secret = ?, previous_secret = ? WHERE sub_id = ?")
        .bind(legacy.keys.current.expose())
        .bind(legacy.keys.previous.as_ref().unwrap().0.expose())
        .bind(legacy.id.as_uuid())
        .execute(&mut conn)
        .await
        .unwrap();
    conn.close().await.unwrap();

    let store = open(&path, &keyring).await;
    assert_eq!(
        store.get_subscription(&legacy.id).await.unwrap().keys,
        legacy.keys
    );
    assert_eq!(
        store.reseal_secrets().await.unwrap(),
        1,
        "only the legacy row"
    );
    let (secret, previous) = stored(&path, &legacy.id).await;
    assert_sealed_under(&secret, &key, &legacy.keys.current);
    assert_sealed_under(
        &previous.unwrap(),
        &key,
        &legacy.keys.previous.as_ref().unwrap().0,
    );
    assert_eq!(store.reseal_secrets().await.unwrap(), 0, "idempotent");
    let after = store.get_subscription(&legacy.id).await.unwrap();
    assert_eq!(after.keys, legacy.keys);
    assert_eq!(
        after.updated_at, legacy.updated_at,
        "resealing is no update"
    );
    assert_eq!(
        store.get_subscription(&sealed.id).await.unwrap().keys,
        sealed.keys
    );
    store.close().await;
}

#[tokio::test]
async fn rotation_reseals_under_the_new_key_so_the_old_one_can_go() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("hookd.db");
    let (a, b) = (EncryptionKey::generate(), EncryptionKey::generate());

    let store = open(&path, &Keyring::new(a.clone())).await;
    let sub = create_rotating(&store).await;
    let deleted = store
        .create_subscription(new_sub("gone.example", None))
        .await
        .unwrap();
    store.delete_subscription(&deleted.id).await.unwrap();
    store.close().await;

    // The new key alone cannot read what the old one sealed, and says which
    // key it needs without showing anything secret.
    let store = open(&path, &Keyring::new(b.clone())).await;
    let err = store.get_subscription(&sub.id).await.unwrap_err();
    let text = err.to_string();
    assert!(matches!(err, StoreError::Corrupt(_)), "{err:?}");
    assert!(text.contains(a.id()), "{text}");
    assert!(!text.contains(&a.to_base64()) && !text.contains(&b.to_base64()));
    store.close().await;

    // Rotating: the new key seals, the old one still opens.
    let rotating = Keyring::new(b.clone()).with_previous([a.clone()]);
    let store = open(&path, &rotating).await;
    assert_eq!(
        store.get_subscription(&sub.id).await.unwrap().keys,
        sub.keys
    );
    assert_eq!(store.reseal_secrets().await.unwrap(), 2, "deleted rows too");
    assert_eq!(store.reseal_secrets().await.unwrap(), 0);
    store.close().await;
    let (secret, previous) = stored(&path, &sub.id).await;
    assert_sealed_under(&secret, &b, &sub.keys.current);
    assert_sealed_under(
        &previous.unwrap(),
        &b,
        &sub.keys.previous.as_ref().unwrap().0,
    );
    let (gone, _) = stored(&path, &deleted.id).await;
    assert_sealed_under(&gone, &b, &deleted.keys.current);

    // The old key is no longer needed.
    let store = open(&path, &Keyring::new(b.clone())).await;
    assert_eq!(
        store.get_subscription(&sub.id).await.unwrap().keys,
        sub.keys
    );
    store.close().await;
}

#[tokio::test]
async fn a_sealed_secret_moved_to_another_row_does_not_open() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("hookd.db");
    let keyring = Keyring::ephemeral();
    let store = open(&path, &keyring).await;
    let victim = store
        .create_subscription(new_sub("victim.example", None))
        .await
        .unwrap();
    let attacker = store
        .create_subscription(new_sub("attacker.example", None))
        .await
        .unwrap();
    store.close().await;
    let (victims, _) = stored(&path, &victim.id).await;
    let mut conn = raw(&path).await;
    sqlx::query("UPDATE subscriptions SET secret = ? WHERE sub_id = ?")
        .bind(&victims)
        .bind(attacker.id.as_uuid())
        .execute(&mut conn)
        .await
        .unwrap();
    conn.close().await.unwrap();

    let store = open(&path, &keyring).await;
    let err = store.get_subscription(&attacker.id).await.unwrap_err();
    assert!(matches!(err, StoreError::Corrupt(_)), "{err:?}");
    assert!(!err.to_string().contains(&victims));
    store.close().await;
}

#[tokio::test]
async fn without_a_keyring_the_key_file_beside_the_database_seals() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("hookd.db");
    let store = SqliteStore::connect(&path).await.unwrap();
    store.migrate().await.unwrap();
    let sub = store
        .create_subscription(new_sub("dev.example", None))
        .await
        .unwrap();
    store.close().await;

    let file = key_file::load_or_create(&key_file::path_for(&path)).unwrap();
    assert!(!file.created, "connect created it");
    let (secret, _) = stored(&path, &sub.id).await;
    assert_sealed_under(&secret, &file.key, &sub.keys.current);
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt as _;
        let mode = std::fs::metadata(&file.path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
    }

    // A reopen (by URL too) finds the same key.
    let store = SqliteStore::connect_url(&format!("sqlite:{}", path.display()))
        .await
        .unwrap();
    assert_eq!(
        store.get_subscription(&sub.id).await.unwrap().keys,
        sub.keys
    );
    store.close().await;
}
