//! A database file in use by one process cannot be opened by another, with
//! real processes: the test re-runs its own binary as the second process,
//! asking it (through an environment variable) to run only
//! [`probe_open_from_another_process`] against the file, and reads what the
//! probe printed.

use std::path::Path;
use std::process::Command;

use hookd_store::{Store, StoreError};
use hookd_store_sqlite::{DatabaseInUse, SqliteStore};

/// Set in the child process only: the database file the probe opens.
const PROBE_DB: &str = "HOOKD_TEST_PROBE_DB";

/// What the probe prints on the line it reports on.
const OPENED: &str = "probe: opened";
const REFUSED: &str = "probe: refused: ";

/// Runs the probe in a new process of this test binary and returns its
/// report line.
fn open_from_another_process(db: &Path) -> String {
    let out = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "probe_open_from_another_process",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(PROBE_DB, db)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "the probe process failed: {stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The test harness prints the test's name on the same line, before it.
    stdout
        .lines()
        .find_map(|l| l.find("probe: ").map(|at| l[at..].to_owned()))
        .unwrap_or_else(|| panic!("the probe reported nothing: {stdout}"))
}

/// The second process's side. Without [`PROBE_DB`] (a normal test run) it
/// has nothing to do.
#[tokio::test]
async fn probe_open_from_another_process() {
    let Some(db) = std::env::var_os(PROBE_DB) else {
        return;
    };
    match SqliteStore::connect(Path::new(&db)).await {
        Ok(store) => {
            store.ping().await.unwrap();
            println!("{OPENED}");
        }
        Err(e) => {
            let source = match &e {
                StoreError::Unavailable(s) => s,
                other => panic!("expected Unavailable, got {other:?}"),
            };
            assert!(
                source.downcast_ref::<DatabaseInUse>().is_some(),
                "the source says why: {source:?}"
            );
            println!("{REFUSED}{e}: {source}");
        }
    }
}

#[tokio::test]
async fn a_second_process_is_refused_while_a_store_has_the_file_open() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("hookd.db");
    let store = SqliteStore::connect(&db).await.unwrap();
    store.migrate().await.unwrap();

    let report = open_from_another_process(&db);
    let Some(message) = report.strip_prefix(REFUSED) else {
        panic!("the second process opened the file: {report}")
    };
    assert!(
        message.contains(&format!(
            "database file {} is already in use by another hookd process (lock file {}.lock)",
            db.display(),
            db.display()
        )),
        "{message}"
    );

    // Within this process, more stores on the same file are fine.
    let second = SqliteStore::connect(&db).await.unwrap();
    second.ping().await.unwrap();
    let via_url = SqliteStore::connect_url(&format!("sqlite:{}", db.display()))
        .await
        .unwrap();
    via_url.ping().await.unwrap();
    assert!(open_from_another_process(&db).starts_with(REFUSED));

    // The file is free once every store of this process has let go of it:
    // closed or dropped.
    store.close().await;
    drop(second);
    assert!(
        open_from_another_process(&db).starts_with(REFUSED),
        "one store still has it"
    );
    drop(via_url);
    assert_eq!(open_from_another_process(&db), OPENED);

    // And the other way round: reopened here after the probe has exited.
    let reopened = SqliteStore::connect(&db).await.unwrap();
    reopened.ping().await.unwrap();
}
