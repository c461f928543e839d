//! One hookd process per database file.
//!
//! SQLite is hookd's single-node store. Its claims would stay exclusive
//! across processes (a write transaction), but everything a node keeps in
//! memory would not be shared: per-destination admission caps, breakers and
//! the fan-out index. Two processes on one file would each apply their own
//! caps, sending a destination twice the load it agreed to take, and each
//! would believe it is the only writer. Running several nodes is what the
//! PostgreSQL store is for. So a store takes an exclusive advisory lock on a
//! sidecar file, `<database file>.lock`, for as long as it lives, and a
//! second process that tries to open the same file is refused at startup
//! with an error naming both files.
//!
//! Inside one process, several stores on one file are normal (each component
//! opens its own, and so do tests), so the lock is per process: a registry
//! keyed by the lock file's canonical path hands every store in the process
//! the same [`ProcessLock`], and the file is unlocked when the last of them
//! lets go of it. The lock is `flock(2)` on Unix (`LockFileEx` on Windows),
//! which the kernel drops when the process dies, so a crash never leaves a
//! stale lock behind. For the same reason the lock file is never deleted:
//! removing it could let one process lock the old file while another creates
//! and locks a new one.
//!
//! A hold can outlive its holder by a moment: the last store of this process
//! dropped on another thread at the instant a new one opens, a child process
//! spawned just then keeping a copy of the descriptor until it execs, or a
//! supervisor starting hookd while the old process is still exiting. So
//! opening waits up to [`PATIENCE`] for a held lock before refusing
//! ([`acquire_patiently`]); a process that really has the file is still
//! refused, a little later.

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use fs4::{FileExt, TryLockError};
use hookd_store::{Result, StoreError};

/// The locks this process holds, by canonical lock-file path. Weak, so that
/// dropping the last store releases the lock; dead entries are pruned on the
/// next acquire.
static HELD: Mutex<BTreeMap<PathBuf, Weak<ProcessLock>>> = Mutex::new(BTreeMap::new());

/// This process's exclusive hold on a database file. Shared by every store in
/// the process that opened that file; unlocked when the last one drops it.
#[derive(Debug)]
pub(crate) struct ProcessLock {
    /// The locked lock file: closing it is what releases the lock.
    _file: File,
    /// The file's subscription generation as last read, shared by every
    /// store of the file in this process, which is every writer of it.
    pub(crate) generation: Arc<GenerationCache>,
}

/// The subscription generation, cached: this process is the file's only
/// writer (the lock above), so its own subscription writes are the only
/// way the generation moves, and each one invalidates the cache once it
/// has committed. Ingest reads the generation on every event; served from
/// here it costs no connection-thread hop and no read transaction.
///
/// A value is cached with the epoch it was read in, and an invalidation
/// moves the epoch, so a read that raced a commit can cache only a value
/// that is already stale by its epoch, never one that looks current.
#[derive(Debug, Default)]
pub(crate) struct GenerationCache {
    epoch: AtomicU64,
    cached: Mutex<Option<(u64, i64)>>,
}

impl GenerationCache {
    /// The cached generation, if no subscription write has committed since
    /// it was read.
    pub(crate) fn get(&self) -> Option<i64> {
        let epoch = self.epoch.load(Ordering::SeqCst);
        match *self.cached.lock().unwrap_or_else(|p| p.into_inner()) {
            Some((at, generation)) if at == epoch => Some(generation),
            _ => None,
        }
    }

    /// The epoch to pass to [`put`](Self::put): take it before reading.
    pub(crate) fn epoch(&self) -> u64 {
        self.epoch.load(Ordering::SeqCst)
    }

    /// Caches `generation`, read after [`epoch`](Self::epoch) gave `epoch`.
    pub(crate) fn put(&self, epoch: u64, generation: i64) {
        let mut cached = self.cached.lock().unwrap_or_else(|p| p.into_inner());
        if self.epoch.load(Ordering::SeqCst) == epoch {
            *cached = Some((epoch, generation));
        }
    }

    /// Forgets the cached value: call after a transaction that bumped the
    /// generation has committed (or failed: a spare re-read costs nothing).
    pub(crate) fn invalidate(&self) {
        self.epoch.fetch_add(1, Ordering::SeqCst);
    }

    /// A guard that invalidates when dropped. Taken before a transaction
    /// that bumps the generation, it drops after that transaction has
    /// committed or rolled back, on every path out of the function.
    pub(crate) fn invalidate_on_drop(self: &Arc<Self>) -> InvalidateOnDrop {
        InvalidateOnDrop(self.clone())
    }
}

/// See [`GenerationCache::invalidate_on_drop`].
#[derive(Debug)]
pub(crate) struct InvalidateOnDrop(Arc<GenerationCache>);

impl Drop for InvalidateOnDrop {
    fn drop(&mut self) {
        self.0.invalidate();
    }
}

/// Another process holds the database file.
#[derive(Debug, thiserror::Error)]
#[error(
    "database file {} is already in use by another hookd process (lock file {}); \
     stop that process first, or use PostgreSQL to run several hookd nodes on one database",
    database.display(),
    lock_file.display()
)]
pub struct DatabaseInUse {
    /// The database file asked for.
    pub database: PathBuf,
    /// The lock file the other process holds.
    pub lock_file: PathBuf,
}

/// The lock file could not be created, opened or locked.
#[derive(Debug, thiserror::Error)]
#[error("could not lock database file {} (lock file {})", database.display(), lock_file.display())]
struct LockFailed {
    database: PathBuf,
    lock_file: PathBuf,
    #[source]
    source: std::io::Error,
}

/// `<database>.lock`, beside the database file.
fn lock_file_of(database: &Path) -> PathBuf {
    let mut name = database.as_os_str().to_owned();
    name.push(".lock");
    PathBuf::from(name)
}

/// How long opening a database file waits for another holder to let go of
/// it before refusing (see the module docs).
pub(crate) const PATIENCE: Duration = Duration::from_secs(2);

/// How often a waiting open tries the lock again.
const RETRY_EVERY: Duration = Duration::from_millis(20);

/// [`acquire`], waiting up to `patience` while another holder has the file.
pub(crate) async fn acquire_patiently(
    database: &Path,
    patience: Duration,
) -> Result<Arc<ProcessLock>> {
    let deadline = Instant::now() + patience;
    loop {
        match acquire(database) {
            Err(StoreError::Unavailable(source))
                if source.is::<DatabaseInUse>() && Instant::now() < deadline =>
            {
                tokio::time::sleep(RETRY_EVERY).await;
            }
            done => return done,
        }
    }
}

/// Takes (or joins this process's existing) exclusive lock on `database`.
///
/// [`StoreError::Unavailable`] with a [`DatabaseInUse`] source if another
/// process holds it: that may pass once the other process stops, and
/// nothing was written. Also `Unavailable` if the lock file cannot be
/// created (a missing directory, no permission), as opening the database
/// itself would be.
pub(crate) fn acquire(database: &Path) -> Result<Arc<ProcessLock>> {
    let lock_file = lock_file_of(database);
    let failed = |source| {
        StoreError::Unavailable(Box::new(LockFailed {
            database: database.to_owned(),
            lock_file: lock_file.clone(),
            source,
        }))
    };
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&lock_file)
        .map_err(failed)?;
    // Canonical, so `./hookd.db`, `hookd.db` and an absolute path meet in
    // one registry entry. The file exists now, so this cannot fail for a
    // missing path.
    let key = lock_file.canonicalize().map_err(failed)?;

    // Held across the lookup and the lock, so two stores of this process
    // opening the same file at once cannot both try to lock it (flock locks
    // are per open file, so the second would be refused by the first).
    let mut held = HELD.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    held.retain(|_, lock| lock.strong_count() > 0);
    if let Some(lock) = held.get(&key).and_then(Weak::upgrade) {
        // Closing our second handle does not release the lock: flock belongs
        // to the handle that took it.
        return Ok(lock);
    }
    // Called through the trait: on Rust 1.89+ `File` has an inherent
    // `try_lock` of its own, which our MSRV cannot use.
    match FileExt::try_lock(&file) {
        Ok(()) => {}
        Err(TryLockError::WouldBlock) => {
            return Err(StoreError::Unavailable(Box::new(DatabaseInUse {
                database: database.to_owned(),
                lock_file,
            })));
        }
        Err(TryLockError::Error(e)) => return Err(failed(e)),
    }
    let lock = Arc::new(ProcessLock {
        _file: file,
        generation: Arc::default(),
    });
    held.insert(key, Arc::downgrade(&lock));
    Ok(lock)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_generation_cache_never_keeps_a_value_read_before_a_write_ended() {
        let cache = Arc::new(GenerationCache::default());
        assert_eq!(cache.get(), None, "nothing read yet");
        let epoch = cache.epoch();
        cache.put(epoch, 7);
        assert_eq!(cache.get(), Some(7));
        // A write ends: the value is forgotten.
        drop(cache.invalidate_on_drop());
        assert_eq!(cache.get(), None);
        // A read that began before a write ended cannot cache what it read.
        let before = cache.epoch();
        cache.invalidate();
        cache.put(before, 7);
        assert_eq!(cache.get(), None, "read in an older epoch");
        cache.put(cache.epoch(), 8);
        assert_eq!(cache.get(), Some(8));
    }

    /// The lock on `db` taken by a handle outside the registry, standing in
    /// for another process: flock refuses a second open file even within
    /// one process. Held until the handle is dropped.
    fn held_elsewhere(db: &Path) -> File {
        let other = File::create(lock_file_of(db)).unwrap();
        FileExt::try_lock(&other).unwrap();
        other
    }

    #[test]
    fn the_lock_file_sits_beside_the_database() {
        assert_eq!(
            lock_file_of(Path::new("/var/lib/hookd/hookd.db")),
            Path::new("/var/lib/hookd/hookd.db.lock")
        );
        assert_eq!(
            lock_file_of(Path::new("hookd.db")),
            Path::new("hookd.db.lock")
        );
    }

    #[test]
    fn stores_of_one_process_share_the_lock_until_the_last_lets_go() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("hookd.db");
        let first = acquire(&db).unwrap();
        // A different spelling of the same file joins the same lock.
        let second = acquire(&dir.path().join(".").join("hookd.db")).unwrap();
        assert!(Arc::ptr_eq(&first, &second));
        drop(first);
        drop(second);
        // Released: a fresh handle can lock the file itself.
        let probe = File::open(lock_file_of(&db)).unwrap();
        FileExt::try_lock(&probe).unwrap();
        FileExt::unlock(&probe).unwrap();
        drop(probe);
        // And the registry takes it again.
        let again = acquire(&db).unwrap();
        drop(again);
    }

    #[tokio::test]
    async fn opening_waits_for_a_holder_that_lets_go() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("hookd.db");
        // As a child process's inherited copy or an exiting process would
        // hold it, let go of while the open waits.
        let other = held_elsewhere(&db);
        let path = db.clone();
        let open =
            tokio::spawn(async move { acquire_patiently(&path, Duration::from_secs(30)).await });
        // On this test's one-thread runtime the open runs its first try
        // now, is refused, and waits for its retry.
        tokio::task::yield_now().await;
        assert!(!open.is_finished(), "refused at first, and waiting");
        drop(other);
        let lock = open.await.unwrap().expect("taken once the holder let go");
        drop(lock);
    }

    #[tokio::test]
    async fn a_holder_that_keeps_the_file_is_refused_after_the_wait() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("hookd.db");
        let other = held_elsewhere(&db);
        let err = acquire_patiently(&db, Duration::from_millis(100))
            .await
            .unwrap_err();
        drop(other);
        let StoreError::Unavailable(source) = &err else {
            panic!("{err:?}")
        };
        assert!(source.is::<DatabaseInUse>(), "{source:?}");
    }

    #[test]
    fn another_holder_of_the_lock_file_is_refused_with_both_paths() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("other.db");
        let other = held_elsewhere(&db);
        let err = acquire(&db).unwrap_err();
        drop(other);
        let StoreError::Unavailable(source) = &err else {
            panic!("{err:?}")
        };
        let message = source.to_string();
        assert!(
            message.contains("already in use by another hookd process"),
            "{message}"
        );
        assert!(message.contains(&db.display().to_string()), "{message}");
        assert!(message.contains("other.db.lock"), "{message}");
    }
}
