//! The key that seals subscription secrets, through the real binary:
//! `hookd keys generate`, `hookd keys rotate`, the SQLite key file, and the
//! errors an operator sees.

use std::process::Command;

use base64::Engine as _;
use hookd_store::StoreError;
use hookd_store::crypto::{EncryptionKey, Keyring};
use serde_json::json;

use crate::helpers::*;

/// `hookd` in `dir` with no key, token or database in its environment.
fn hookd(dir: &std::path::Path) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_hookd"));
    c.current_dir(dir)
        .env_remove("HOOKD_ENCRYPTION_KEY")
        .env_remove("HOOKD_ENCRYPTION_KEY_PREVIOUS")
        .env_remove("HOOKD_ADMIN_TOKEN")
        .env_remove("HOOKD_DATABASE_URL")
        .env("HOOKD_LOG", "warn");
    c
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[test]
fn keys_generate_prints_a_new_32_byte_key_each_time() {
    let dir = tempfile::tempdir().unwrap();
    let keys: Vec<String> = (0..2)
        .map(|_| {
            let out = hookd(dir.path())
                .args(["keys", "generate"])
                .output()
                .unwrap();
            assert!(out.status.success(), "{}", text(&out.stderr));
            text(&out.stdout).trim().to_owned()
        })
        .collect();
    for key in &keys {
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(key)
            .unwrap();
        assert_eq!(bytes.len(), 32, "{key}");
        EncryptionKey::from_base64(key).unwrap();
    }
    assert_ne!(keys[0], keys[1]);
}

#[test]
fn without_a_key_sqlite_gets_a_private_key_file_and_postgresql_refuses() {
    let dir = tempfile::tempdir().unwrap();
    let out = hookd(dir.path())
        .args(["migrate", "--database", "sqlite:hookd.db"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    let key_file = dir.path().join("hookd.db.key");
    let key = std::fs::read_to_string(&key_file).unwrap();
    EncryptionKey::from_base64(&key).unwrap();
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt as _;
        let mode = std::fs::metadata(&key_file).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600, "readable by its owner only");

        // A key file others may read is refused, and the error says what to do.
        std::fs::set_permissions(&key_file, std::fs::Permissions::from_mode(0o644)).unwrap();
        let out = hookd(dir.path())
            .args(["migrate", "--database", "sqlite:hookd.db"])
            .output()
            .unwrap();
        assert!(!out.status.success());
        let err = text(&out.stderr);
        assert!(err.contains("chmod 600"), "{err}");
        assert!(!err.contains(key.trim()), "the key is never shown: {err}");
    }

    // PostgreSQL without a key: refused before connecting (port 1 answers
    // nothing, so a connection attempt would be a different error).
    let out = hookd(dir.path())
        .args(["migrate", "--database", "postgres://postgres@127.0.0.1:1/x"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = text(&out.stderr);
    assert!(
        err.contains("HOOKD_ENCRYPTION_KEY is not set") && err.contains("hookd keys generate"),
        "{err}"
    );

    // A malformed key says so, without echoing it.
    let out = hookd(dir.path())
        .args(["migrate", "--database", "sqlite:other.db"])
        .env("HOOKD_ENCRYPTION_KEY", "not-a-real-key")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = text(&out.stderr);
    assert!(
        err.contains("HOOKD_ENCRYPTION_KEY is malformed") && err.contains("32 bytes"),
        "{err}"
    );
    assert!(!err.contains("not-a-real-key"), "{err}");
}

async fn keys_rotate_reseals_every_secret_under_the_new_key(backend: Backend) {
    let Some((database, _guard)) = fresh_database(backend).await else {
        return;
    };
    // `hookd serve` seals with the test key (HOOKD_ENCRYPTION_KEY).
    let mut serve = ServeProcess::start(&database, None).await;
    let mut created = Vec::new();
    for i in 0..3 {
        let r = serve
            .post(
                "/subscriptions",
                &json!({"url": format!("http://127.0.0.1:9/in{i}"), "event_types": ["a.b"]}),
            )
            .await;
        assert_eq!(r.status(), 201);
        let v: serde_json::Value = r.json().await.unwrap();
        created.push((
            v["sub_id"].as_str().unwrap().to_owned(),
            v["secret"].as_str().unwrap().to_owned(),
        ));
    }
    serve.kill();

    let new = EncryptionKey::generate();
    let dir = tempfile::tempdir().unwrap();
    let rotate = || {
        let mut cmd = hookd(dir.path());
        cmd.args(["keys", "rotate", "--database", &database])
            .env("HOOKD_ENCRYPTION_KEY", new.to_base64())
            .env("HOOKD_ENCRYPTION_KEY_PREVIOUS", TEST_ENCRYPTION_KEY);
        cmd
    };
    let out = run(rotate()).await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    assert!(
        stdout.contains("re-sealed the secrets of 3 subscriptions") && stdout.contains(new.id()),
        "{stdout}"
    );
    let again = run(rotate()).await;
    assert!(again.status.success(), "{}", text(&again.stderr));
    assert!(
        text(&again.stdout).contains("of 0 subscriptions"),
        "idempotent: {}",
        text(&again.stdout)
    );
    let logs = format!("{}{}", text(&out.stderr), text(&again.stderr));
    for (_, secret) in &created {
        assert!(!stdout.contains(secret) && !logs.contains(secret));
    }

    // The new key alone now reads every secret; the old key alone reads none.
    {
        let store = hookd::open_store_with(&database, Keyring::new(new.clone()))
            .await
            .unwrap();
        for (id, secret) in &created {
            let sub = store.get_subscription(&id.parse().unwrap()).await.unwrap();
            assert_eq!(&sub.keys.current.expose(), secret);
        }
    }
    let store = open_store(&database).await;
    let err = store
        .get_subscription(&created[0].0.parse().unwrap())
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::Corrupt(_)), "{err:?}");
    assert!(err.to_string().contains(new.id()), "{err}");
}

crate::on_both_backends!(keys_rotate_reseals_every_secret_under_the_new_key);
