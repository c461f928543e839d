//! `PrivatePostgres`: a throwaway PostgreSQL cluster of one test's own, which
//! the test may restart, freeze or turn read-only without disturbing the
//! shared server every other test uses.
//!
//! `initdb` into a temp dir, `pg_ctl start` on a free loopback port with the
//! socket in that dir, trust auth. PostgreSQL refuses to run as root, so when
//! the tests run as root every command runs as the `postgres` OS user
//! (`runuser -u postgres --`). Dropping the fixture stops the cluster with
//! `-m immediate` and removes the dir.
//!
//! Without the PostgreSQL binaries, local runs skip with a notice; under
//! `CI=true` that is a failure, never a skip.

use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// A running private cluster. Dropping it stops the server
/// (`-m immediate`) and removes its dir.
#[derive(Debug)]
pub struct PrivatePostgres {
    /// `postgres://postgres@127.0.0.1:PORT/postgres`.
    pub url: String,
    cluster: Cluster,
    /// Holds `data/`, the log and the Unix socket.
    _dir: tempfile::TempDir,
}

/// What commands against the cluster need; cheap to clone into a blocking
/// thread.
#[derive(Debug, Clone)]
struct Cluster {
    /// Where `initdb`, `pg_ctl` and `psql` live.
    bin: PathBuf,
    /// The temp dir: `data/`, `postgres.log`, the socket.
    dir: PathBuf,
    /// The TCP port (127.0.0.1 only), also the socket's name.
    port: u16,
    /// Whether commands must run as the `postgres` OS user.
    as_postgres: bool,
}

/// Finds the directory holding `initdb` and `pg_ctl`: `PATH` first, then
/// Debian's `/usr/lib/postgresql/<version>/bin` (newest version first).
fn find_bin_dir() -> Option<PathBuf> {
    let on_path = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .unwrap_or_default();
    let mut debian: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .map(|rd| rd.flatten().map(|e| e.path().join("bin")).collect())
        .unwrap_or_default();
    debian.sort();
    debian.reverse();
    on_path.into_iter().chain(debian).find_map(|dir| {
        let initdb = dir.join("initdb");
        if !initdb.is_file() || !dir.join("pg_ctl").is_file() {
            return None;
        }
        // A symlink on PATH (e.g. /usr/local/bin/initdb) points into the
        // real bin dir, where psql lives too.
        let real = std::fs::canonicalize(&initdb).ok()?;
        real.parent().map(Path::to_path_buf)
    })
}

/// A port nothing listens on right now (the OS's pick).
fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().port()
}

fn describe(out: &Output) -> String {
    format!(
        "{}\nstdout: {}\nstderr: {}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

impl Cluster {
    fn data_dir(&self) -> PathBuf {
        self.dir.join("data")
    }

    /// `bin/program args…`, as the postgres user when we are root.
    fn command(&self, program: &str, args: &[&str]) -> Command {
        let path = self.bin.join(program);
        let mut cmd = if self.as_postgres {
            let mut c = Command::new("runuser");
            c.args(["-u", "postgres", "--"]).arg(path);
            c
        } else {
            Command::new(path)
        };
        // The caller's cwd may be unreadable to the postgres user.
        cmd.args(args).current_dir(&self.dir);
        cmd
    }

    /// `pg_ctl -D data -l log [-o server options] args…`.
    fn pg_ctl(&self, args: &[&str]) -> Output {
        let data = self.data_dir();
        let log = self.dir.join("postgres.log");
        // fsync=off: a throwaway cluster; an immediate shutdown loses
        // nothing a commit acknowledged (the WAL is in the OS's cache), and
        // crash recovery skips syncing the data dir.
        let opts = format!(
            "-p {} -k {} -c listen_addresses=127.0.0.1 -c fsync=off",
            self.port,
            self.dir.display()
        );
        let mut all = vec![
            "-D",
            data.to_str().unwrap(),
            "-l",
            log.to_str().unwrap(),
            "-o",
            &opts,
        ];
        all.extend(args);
        self.command("pg_ctl", &all).output().unwrap()
    }

    fn pg_ctl_ok(&self, args: &[&str]) {
        let out = self.pg_ctl(args);
        assert!(out.status.success(), "pg_ctl {args:?}: {}", describe(&out));
    }

    /// The postmaster and every process it forked (backends, checkpointer,
    /// walwriter, …), postmaster first.
    fn pids(&self) -> Vec<u32> {
        self.try_pids()
            .expect("no postmaster.pid: is the server running?")
    }

    fn try_pids(&self) -> Option<Vec<u32>> {
        let pidfile = std::fs::read_to_string(self.data_dir().join("postmaster.pid")).ok()?;
        let postmaster: u32 = pidfile.lines().next()?.trim().parse().ok()?;
        let mut pids = vec![postmaster];
        for entry in std::fs::read_dir("/proc").unwrap().flatten() {
            let Some(pid) = entry
                .file_name()
                .to_str()
                .and_then(|s| s.parse::<u32>().ok())
            else {
                continue;
            };
            let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
                continue;
            };
            // `pid (comm) state ppid …`; comm may hold spaces, so split after ')'.
            let ppid = stat
                .rsplit_once(')')
                .and_then(|(_, rest)| rest.split_whitespace().nth(1))
                .and_then(|p| p.parse::<u32>().ok());
            if ppid == Some(postmaster) {
                pids.push(pid);
            }
        }
        Some(pids)
    }

    fn psql(&self, sql: &str) -> Result<String, String> {
        let port = self.port.to_string();
        let sock = self.dir.to_str().unwrap();
        let args = [
            "-X",
            "-At",
            "-v",
            "ON_ERROR_STOP=1",
            "-h",
            sock,
            "-p",
            &port,
            "-U",
            "postgres",
            "-d",
            "postgres",
            "-c",
            sql,
        ];
        let out = self.command("psql", &args).output().unwrap();
        if out.status.success() {
            Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
        } else {
            Err(String::from_utf8_lossy(&out.stderr).trim().to_owned())
        }
    }
}

/// Sends `sig` to `pid`; `false` if the process is gone.
fn signal(pid: u32, sig: &str) -> bool {
    Command::new("kill")
        .arg(sig)
        .arg(pid.to_string())
        .output()
        .unwrap()
        .status
        .success()
}

impl PrivatePostgres {
    /// `initdb` and start a fresh cluster. `None` (with a notice) when the
    /// PostgreSQL binaries are missing outside CI; panics under `CI=true`.
    pub async fn start() -> Option<PrivatePostgres> {
        let Some(bin) = find_bin_dir() else {
            if std::env::var("CI").is_ok_and(|v| v == "true") {
                panic!(
                    "CI=true but initdb/pg_ctl are not installed: the database fault tests must run in CI"
                );
            }
            eprintln!("skipping database fault test: initdb/pg_ctl not found");
            return None;
        };
        Some(
            tokio::task::spawn_blocking(move || Self::start_blocking(bin))
                .await
                .unwrap(),
        )
    }

    fn start_blocking(bin: PathBuf) -> PrivatePostgres {
        let dir = tempfile::Builder::new()
            .prefix("hookd-pg-")
            .tempdir()
            .unwrap();
        // Root? (/proc/self belongs to the effective uid.)
        let as_postgres = std::fs::metadata("/proc/self").is_ok_and(|m| m.uid() == 0);
        if as_postgres {
            let out = Command::new("chown")
                .arg("postgres:postgres")
                .arg(dir.path())
                .output()
                .unwrap();
            assert!(out.status.success(), "chown: {}", describe(&out));
        }
        let mut cluster = Cluster {
            bin,
            dir: dir.path().to_path_buf(),
            port: 0,
            as_postgres,
        };
        let data = cluster.data_dir();
        let args = [
            "-D",
            data.to_str().unwrap(),
            "-A",
            "trust",
            "-U",
            "postgres",
            "-E",
            "UTF8",
            "--no-sync",
        ];
        let out = cluster.command("initdb", &args).output().unwrap();
        assert!(out.status.success(), "initdb: {}", describe(&out));
        // The port was free when picked, but something may take it before
        // the server binds it: try a few.
        for attempt in 0.. {
            cluster.port = free_port();
            let out = cluster.pg_ctl(&["start", "-w", "-t", "30"]);
            if out.status.success() {
                break;
            }
            assert!(attempt < 3, "pg_ctl start: {}", describe(&out));
        }
        PrivatePostgres {
            url: format!("postgres://postgres@127.0.0.1:{}/postgres", cluster.port),
            cluster,
            _dir: dir,
        }
    }

    /// Runs `f` on a blocking thread: pg_ctl waits for seconds, and the
    /// application under test shares this runtime.
    async fn blocking<T: Send + 'static>(
        &self,
        f: impl FnOnce(&Cluster) -> T + Send + 'static,
    ) -> T {
        let cluster = self.cluster.clone();
        tokio::task::spawn_blocking(move || f(&cluster))
            .await
            .unwrap()
    }

    /// The TCP port the cluster listens on.
    pub fn port(&self) -> u16 {
        self.cluster.port
    }

    /// `pg_ctl restart -m immediate`: every backend dies at once (as in a
    /// crash), the server runs crash recovery and comes back on the same
    /// port. Returns once it accepts connections again.
    pub async fn restart_immediate(&self) {
        self.blocking(|c| c.pg_ctl_ok(&["restart", "-m", "immediate", "-w", "-t", "60"]))
            .await
    }

    /// `pg_ctl stop -m immediate`: the server is gone, connections are
    /// refused, until [`start_again`](Self::start_again).
    pub async fn stop_immediate(&self) {
        self.blocking(|c| c.pg_ctl_ok(&["stop", "-m", "immediate", "-w", "-t", "60"]))
            .await
    }

    /// Starts the server again after [`stop_immediate`](Self::stop_immediate).
    pub async fn start_again(&self) {
        self.blocking(|c| c.pg_ctl_ok(&["start", "-w", "-t", "60"]))
            .await
    }

    /// SIGSTOP to the postmaster (first, so it forks nothing new) and all
    /// its children. The sockets stay open (the kernel still completes
    /// connects into the backlog and acknowledges sent bytes) but nothing
    /// answers: what a hung host or a stalled disk looks like from outside.
    pub fn freeze(&self) {
        let pids = self.cluster.pids();
        assert!(signal(pids[0], "-STOP"), "SIGSTOP to the postmaster");
        // Listed again now that the postmaster can fork no more; a child
        // that exited meanwhile needs no signal.
        for pid in self.cluster.pids().into_iter().skip(1) {
            signal(pid, "-STOP");
        }
    }

    /// SIGCONT to the children, then the postmaster.
    pub fn thaw(&self) {
        let pids = self.cluster.pids();
        for &pid in pids.iter().skip(1) {
            signal(pid, "-CONT");
        }
        assert!(signal(pids[0], "-CONT"), "SIGCONT to the postmaster");
    }

    /// Runs `sql` as superuser over the Unix socket; psql's output, or its
    /// error message.
    pub async fn psql(&self, sql: &str) -> Result<String, String> {
        let sql = sql.to_owned();
        self.blocking(move |c| c.psql(&sql)).await
    }

    /// Turns the whole cluster read-only (`default_transaction_read_only`,
    /// reloaded, and every other client session terminated so none keeps
    /// running with the old setting), or back. Proves that a write now
    /// fails (or works) from a fresh session.
    pub async fn set_read_only(&self, on: bool) {
        let value = if on { "on" } else { "off" };
        self.psql(&format!(
            "ALTER SYSTEM SET default_transaction_read_only = {value}"
        ))
        .await
        .expect("ALTER SYSTEM");
        self.psql("SELECT pg_reload_conf()").await.unwrap();
        self.psql(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity \
             WHERE pid <> pg_backend_pid() AND backend_type = 'client backend'",
        )
        .await
        .unwrap();
        let probe = self.psql("CREATE TEMP TABLE read_only_probe (x int)").await;
        if on {
            let err = probe.expect_err("a write succeeded on the read-only cluster");
            assert!(
                err.contains("read-only transaction"),
                "unexpected error from a write on the read-only cluster: {err}"
            );
        } else {
            probe.expect("a write failed after turning read-only off");
        }
    }
}

/// A session holding a table lock (see
/// [`PrivatePostgres::lock_table_exclusive`]); released by
/// [`PrivatePostgres::release`].
#[derive(Debug)]
pub struct TableLock {
    child: std::process::Child,
}

/// How the lock holder's session is named, to terminate it by name.
const LOCKER_APP: &str = "hookd_test_locker";

impl PrivatePostgres {
    /// Opens a session that takes `LOCK TABLE table IN EXCLUSIVE MODE` and
    /// keeps it (for at most a minute): reads go on, writes to `table` wait.
    /// Returns once the lock is granted.
    pub async fn lock_table_exclusive(&self, table: &str) -> TableLock {
        let sql = format!("BEGIN; LOCK TABLE {table} IN EXCLUSIVE MODE; SELECT pg_sleep(60)");
        let child = self
            .blocking(move |c| {
                let port = c.port.to_string();
                let conn = format!(
                    "host={} port={port} user=postgres dbname=postgres application_name={LOCKER_APP}",
                    c.dir.display()
                );
                c.command("psql", &["-X", "-q", "-d", &conn, "-c", &sql])
                    .stdout(std::process::Stdio::null())
                    .stderr(std::process::Stdio::null())
                    .spawn()
                    .unwrap()
            })
            .await;
        let granted = format!(
            "SELECT count(*) FROM pg_locks l JOIN pg_class c ON c.oid = l.relation \
             WHERE c.relname = '{table}' AND l.mode = 'ExclusiveLock' AND l.granted"
        );
        crate::helpers::eventually(&format!("{table} locked"), || async {
            (self.psql(&granted).await.ok()? == "1").then_some(())
        })
        .await;
        TableLock { child }
    }

    /// How many sessions are waiting for a lock right now.
    pub async fn sessions_waiting_for_locks(&self) -> usize {
        self.psql("SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'")
            .await
            .unwrap()
            .parse()
            .unwrap()
    }

    /// Ends the lock holder's session (its transaction rolls back).
    pub async fn release(&self, mut lock: TableLock) {
        self.psql(&format!(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity \
             WHERE application_name = '{LOCKER_APP}'"
        ))
        .await
        .unwrap();
        tokio::task::spawn_blocking(move || lock.child.wait())
            .await
            .unwrap()
            .unwrap();
    }
}

impl Drop for PrivatePostgres {
    fn drop(&mut self) {
        // A frozen server ignores everything but SIGKILL/SIGCONT: thaw first.
        for pid in self.cluster.try_pids().unwrap_or_default() {
            signal(pid, "-CONT");
        }
        let out = self
            .cluster
            .pg_ctl(&["stop", "-m", "immediate", "-w", "-t", "30"]);
        if !out.status.success() && self.cluster.data_dir().join("postmaster.pid").exists() {
            eprintln!("could not stop the private cluster: {}", describe(&out));
        }
    }
}
