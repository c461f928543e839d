//! The key that seals subscription secrets at rest, and `hookd keys …`.
//!
//! Where the key comes from, in order:
//! 1. `HOOKD_ENCRYPTION_KEY`: base64 of 32 bytes (`hookd keys generate`),
//!    with `HOOKD_ENCRYPTION_KEY_PREVIOUS` (comma-separated, optional): older
//!    keys that still open what they sealed, while a rotation is under way.
//! 2. SQLite without it: the key file `<database>.key` beside the database,
//!    created (mode 0600) on first use; one that group or others may read
//!    is refused.
//! 3. PostgreSQL without it: hookd refuses to start — a key generated on one
//!    node would be unknown to every other.
//!
//! Rotation (`hookd keys rotate`): run every node with the new key as
//! `HOOKD_ENCRYPTION_KEY` and the old one in `HOOKD_ENCRYPTION_KEY_PREVIOUS`,
//! run `hookd keys rotate` (it seals every secret under the new key), then
//! drop the previous key.

use anyhow::Context as _;
use clap::Subcommand;
use hookd_store::crypto::{EncryptionKey, Keyring};

use crate::cli::DatabaseArgs;

/// The current key.
pub const KEY_VAR: &str = "HOOKD_ENCRYPTION_KEY";
/// Older keys, comma-separated, that still open.
pub const PREVIOUS_VAR: &str = "HOOKD_ENCRYPTION_KEY_PREVIOUS";

/// `hookd keys …`.
#[derive(Debug, Subcommand)]
pub enum KeysCommand {
    /// Print a new random encryption key (base64 of 32 bytes) for
    /// HOOKD_ENCRYPTION_KEY.
    Generate,
    /// Seal every subscription secret under the current key
    /// (HOOKD_ENCRYPTION_KEY, or the SQLite key file), opening them with it
    /// or with HOOKD_ENCRYPTION_KEY_PREVIOUS; print how many subscriptions
    /// changed. Also seals secrets stored before hookd encrypted them.
    Rotate(DatabaseArgs),
}

/// Runs `hookd keys …`.
pub async fn run(command: KeysCommand) -> anyhow::Result<()> {
    match command {
        KeysCommand::Generate => {
            println!("{}", EncryptionKey::generate().to_base64());
            Ok(())
        }
        KeysCommand::Rotate(args) => {
            let keyring = keyring_for(&args.database)?;
            let current = keyring.current().id().to_owned();
            let store = crate::serve::open_store_with(&args.database, keyring).await?;
            let changed = store
                .reseal_secrets()
                .await
                .context("re-sealing subscription secrets")?;
            println!("re-sealed the secrets of {changed} subscriptions under key {current}");
            Ok(())
        }
    }
}

/// The keyring for `database_url`: from the environment, else (SQLite) the
/// key file beside the database; an error for PostgreSQL without a key.
pub fn keyring_for(database_url: &str) -> anyhow::Result<Keyring> {
    let var = |name| std::env::var(name).ok().filter(|v| !v.trim().is_empty());
    let previous = match var(PREVIOUS_VAR) {
        Some(list) => parse_previous(&list)?,
        None => Vec::new(),
    };
    let current = match var(KEY_VAR) {
        Some(text) => {
            let key = EncryptionKey::from_base64(&text).with_context(|| {
                format!("{KEY_VAR} is malformed (make one with `hookd keys generate`)")
            })?;
            tracing::info!(
                key_id = key.id(),
                previous = previous.len(),
                "subscription secrets are sealed with {KEY_VAR}"
            );
            key
        }
        None if is_sqlite(database_url) => {
            let db = hookd_store_sqlite::SqliteStore::database_file(database_url)
                .context("finding the SQLite database file")?;
            let file = hookd_store_sqlite::key_file::load_or_create(
                &hookd_store_sqlite::key_file::path_for(&db),
            )
            .with_context(|| {
                format!("{KEY_VAR} is not set, so hookd uses the key file beside the database")
            })?;
            if file.created {
                tracing::warn!(
                    path = %file.path.display(), key_id = file.key.id(),
                    "{KEY_VAR} is not set: generated an encryption key for subscription secrets in this file; \
                     keep it with the database (without it the secrets cannot be read) and set {KEY_VAR} in production"
                );
            } else {
                tracing::info!(
                    path = %file.path.display(), key_id = file.key.id(),
                    "subscription secrets are sealed with the key file"
                );
            }
            file.key
        }
        None => anyhow::bail!(
            "{KEY_VAR} is not set: with PostgreSQL, hookd needs an encryption key for subscription \
             secrets, the same on every node (make one with `hookd keys generate`)"
        ),
    };
    Ok(Keyring::new(current).with_previous(previous))
}

fn parse_previous(list: &str) -> anyhow::Result<Vec<EncryptionKey>> {
    list.split(',')
        .map(str::trim)
        .filter(|k| !k.is_empty())
        .enumerate()
        .map(|(i, k)| {
            EncryptionKey::from_base64(k).with_context(|| {
                format!(
                    "{PREVIOUS_VAR}: key {} of the list is malformed (each must be the base64 of 32 bytes)",
                    i + 1
                )
            })
        })
        .collect()
}

fn is_sqlite(url: &str) -> bool {
    url.starts_with("sqlite:")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn previous_keys_parse_as_a_comma_separated_list() {
        let (a, b) = (EncryptionKey::generate(), EncryptionKey::generate());
        let list = format!(" {}, {} ,", a.to_base64(), b.to_base64());
        assert_eq!(parse_previous(&list).unwrap(), vec![a, b]);
        let err = parse_previous("AAAA").unwrap_err();
        let text = format!("{err:#}");
        assert!(
            text.contains("key 1") && text.contains("32 bytes"),
            "{text}"
        );
        assert!(!text.contains("AAAA"), "{text}");
    }
}
