//! The development key file: `<database file>.key`, beside the database,
//! holding the base64 of a 32-byte key, readable by its owner only (0600).
//!
//! What seals subscription secrets when no key is configured: a SQLite
//! database then works out of the box, and its secrets are still not in the
//! database file (a copy of `hookd.db` alone reveals none). Production
//! deployments set `HOOKD_ENCRYPTION_KEY` instead and keep the key apart.

use std::fs;
use std::io::{self, Write as _};
use std::path::{Path, PathBuf};

use hookd_store::crypto::EncryptionKey;

/// A loaded (or just created) key file.
#[derive(Debug)]
pub struct KeyFile {
    /// Where it is.
    pub path: PathBuf,
    /// The key it holds.
    pub key: EncryptionKey,
    /// Whether this call created it (a new key: back it up with the database).
    pub created: bool,
}

/// Why the key file could not be used. Never shows the file's contents.
#[derive(Debug, thiserror::Error)]
pub enum KeyFileError {
    /// Reading or writing it failed.
    #[error("encryption key file {}: {source}", path.display())]
    Io {
        /// The key file.
        path: PathBuf,
        /// What failed.
        #[source]
        source: io::Error,
    },
    /// Group or others may read or write it.
    #[error(
        "encryption key file {} has mode {mode:04o}: it must be readable by its owner only \
         (chmod 600 {})",
        path.display(),
        path.display()
    )]
    TooOpen {
        /// The key file.
        path: PathBuf,
        /// Its permission bits.
        mode: u32,
    },
    /// It does not hold a key.
    #[error("encryption key file {} does not hold the base64 of a 32-byte key", path.display())]
    Invalid {
        /// The key file.
        path: PathBuf,
    },
}

/// The key file of the database file `database`: `<database>.key`.
pub fn path_for(database: &Path) -> PathBuf {
    let mut name = database.as_os_str().to_owned();
    name.push(".key");
    PathBuf::from(name)
}

/// Loads the key file at `path`, creating it (mode 0600, a fresh random
/// key) if it does not exist. Refuses a file that group or others may
/// access. Two processes creating it at once agree on one key: the file is
/// written aside and linked into place, which fails if it exists.
pub fn load_or_create(path: &Path) -> Result<KeyFile, KeyFileError> {
    let io_err = |source| KeyFileError::Io {
        path: path.to_owned(),
        source,
    };
    match fs::symlink_metadata(path) {
        Ok(_) => load(path),
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            let key = EncryptionKey::generate();
            let aside = {
                let mut name = path.as_os_str().to_owned();
                name.push(format!(".{}.tmp", std::process::id()));
                PathBuf::from(name)
            };
            let written = write_private(&aside, &format!("{}\n", key.to_base64()));
            let linked = written.and_then(|()| fs::hard_link(&aside, path));
            let _ = fs::remove_file(&aside);
            match linked {
                Ok(()) => Ok(KeyFile {
                    path: path.to_owned(),
                    key,
                    created: true,
                }),
                // Another process created it first: use theirs.
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => load(path),
                Err(e) => Err(io_err(e)),
            }
        }
        Err(e) => Err(io_err(e)),
    }
}

fn load(path: &Path) -> Result<KeyFile, KeyFileError> {
    let io_err = |source| KeyFileError::Io {
        path: path.to_owned(),
        source,
    };
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt as _;
        let mode = fs::metadata(path).map_err(io_err)?.permissions().mode() & 0o7777;
        if mode & 0o077 != 0 {
            return Err(KeyFileError::TooOpen {
                path: path.to_owned(),
                mode,
            });
        }
    }
    let text = fs::read_to_string(path).map_err(io_err)?;
    let key = EncryptionKey::from_base64(&text).map_err(|_| KeyFileError::Invalid {
        path: path.to_owned(),
    })?;
    Ok(KeyFile {
        path: path.to_owned(),
        key,
        created: false,
    })
}

/// Writes a new file readable by its owner only from the start (never
/// briefly world-readable), and syncs it.
fn write_private(path: &Path, contents: &str) -> io::Result<()> {
    let mut options = fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt as _;
        options.mode(0o600);
    }
    let mut file = options.open(path)?;
    file.write_all(contents.as_bytes())?;
    file.sync_all()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_key_file_sits_beside_the_database() {
        assert_eq!(
            path_for(Path::new("/var/lib/hookd/hookd.db")),
            Path::new("/var/lib/hookd/hookd.db.key")
        );
    }

    #[test]
    fn a_created_key_file_is_private_and_loads_the_same_key() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("hookd.db.key");
        let created = load_or_create(&path).unwrap();
        assert!(created.created);
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt as _;
            let mode = fs::metadata(&path).unwrap().permissions().mode() & 0o777;
            assert_eq!(mode, 0o600);
        }
        let loaded = load_or_create(&path).unwrap();
        assert!(!loaded.created);
        assert_eq!(loaded.key, created.key);
        // Nothing left beside it.
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 1);
    }

    #[cfg(unix)]
    #[test]
    fn a_key_file_others_may_read_is_refused() {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("hookd.db.key");
        let key = load_or_create(&path).unwrap().key;
        fs::set_permissions(&path, fs::Permissions::from_mode(0o644)).unwrap();
        let err = load_or_create(&path).unwrap_err();
        let text = err.to_string();
        assert!(
            text.contains("0644") && text.contains("chmod 600"),
            "{text}"
        );
        assert!(!text.contains(&key.to_base64()));
    }

    #[test]
    fn a_key_file_without_a_key_is_refused_without_showing_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("hookd.db.key");
        write_private(&path, "not-a-key-at-all").unwrap();
        let text = load_or_create(&path).unwrap_err().to_string();
        assert!(text.contains("32-byte key"), "{text}");
        assert!(!text.contains("not-a-key-at-all"), "{text}");
    }
}
