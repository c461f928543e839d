//! hookd under test: the release binary as a child process on a fresh
//! database, or a running server; and its CPU time and peak RSS from `/proc`.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use sqlx::Connection as _;

use crate::cli::{Backend, Common};

/// The admin token the child process is started with.
const ADMIN_TOKEN: &str = "hookd_bench_admin_token_0123456789";
/// The key sealing subscription secrets when `HOOKD_ENCRYPTION_KEY` is unset.
const BENCH_ENCRYPTION_KEY: &str = "gF5gsPpyzNUh9ampThvO4mKF8Jib+IKXxZl1yVVXS24=";

/// Where the API is, and the process behind it if the bench started it.
#[derive(Debug)]
pub struct Hookd {
    /// Base URL of the API, without a trailing slash.
    pub base_url: String,
    /// Bearer token for the API.
    pub token: String,
    child: Option<Child>,
    db: Db,
}

/// The fresh database, removed at the end.
#[derive(Debug)]
enum Db {
    Sqlite(#[allow(dead_code)] tempfile::TempDir),
    Postgres { url: String, schema: String },
    External,
}

/// CPU and memory of the hookd process.
#[derive(Debug, Clone, Copy, Default)]
pub struct Usage {
    /// User plus system CPU seconds.
    pub cpu_s: f64,
    /// Peak resident set (`VmHWM`), MiB.
    pub peak_rss_mib: f64,
    /// Resident set now (`VmRSS`), MiB.
    pub rss_mib: f64,
}

impl Hookd {
    /// Starts hookd as the flags say: `--target` names a running one;
    /// otherwise the binary is started on a fresh database with
    /// `--allow-private-destinations`, `defaults` (flag, value) unless
    /// `--hookd-arg` sets the same flag, then `--hookd-arg`s.
    pub async fn start(common: &Common, defaults: &[(&str, &str)]) -> anyhow::Result<Hookd> {
        if let Some(target) = &common.target {
            let hookd = Hookd {
                base_url: target.trim_end_matches('/').to_owned(),
                token: common.token.clone().unwrap_or_default(),
                child: None,
                db: Db::External,
            };
            hookd.wait_ready(None).await?;
            return Ok(hookd);
        }
        let binary = match &common.hookd {
            Some(p) => p.clone(),
            None => default_binary()?,
        };
        let (database, db) = match common.backend {
            Backend::Sqlite => {
                let dir = tempfile::tempdir().context("creating a temporary directory")?;
                let url = format!("sqlite:{}", dir.path().join("bench.db").display());
                (url, Db::Sqlite(dir))
            }
            Backend::Postgres => {
                let schema = format!("bench_{}_{}", std::process::id(), crate::receiver::now_ns());
                let mut conn = sqlx::PgConnection::connect(&common.pg_url)
                    .await
                    .with_context(|| format!("connecting to {}", common.pg_url))?;
                // The name is ours: `bench_` and digits.
                sqlx::raw_sql(sqlx::AssertSqlSafe(format!("CREATE SCHEMA {schema}")))
                    .execute(&mut conn)
                    .await
                    .context("creating the bench schema")?;
                let sep = if common.pg_url.contains('?') {
                    '&'
                } else {
                    '?'
                };
                let url = format!("{}{sep}options=-c%20search_path%3D{schema}", common.pg_url);
                (
                    url,
                    Db::Postgres {
                        url: common.pg_url.clone(),
                        schema,
                    },
                )
            }
        };
        let port = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        let mut args: Vec<String> = vec![
            "serve".into(),
            "--database".into(),
            database,
            "--listen".into(),
            format!("127.0.0.1:{port}"),
            "--allow-private-destinations".into(),
        ];
        for (flag, value) in defaults {
            if !common
                .hookd_args
                .iter()
                .any(|a| a.split('=').next() == Some(*flag))
            {
                args.extend([flag.to_string(), value.to_string()]);
            }
        }
        args.extend(common.hookd_args.iter().cloned());
        eprintln!("starting {} {}", binary.display(), args[1..].join(" "));
        let child = Command::new(&binary)
            .args(&args)
            .env("HOOKD_ADMIN_TOKEN", ADMIN_TOKEN)
            // hookd refuses PostgreSQL without an encryption key; a
            // benchmark's subscriptions are throwaway.
            .env(
                "HOOKD_ENCRYPTION_KEY",
                std::env::var("HOOKD_ENCRYPTION_KEY")
                    .unwrap_or_else(|_| BENCH_ENCRYPTION_KEY.into()),
            )
            .env("HOOKD_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .spawn()
            .with_context(|| format!("starting {}", binary.display()))?;
        let mut hookd = Hookd {
            base_url: format!("http://127.0.0.1:{port}"),
            token: ADMIN_TOKEN.into(),
            child: Some(child),
            db,
        };
        let ready = {
            let child = hookd.child.as_mut();
            Self::wait_ready_of(&hookd.base_url, &hookd.token, child).await
        };
        if let Err(e) = ready {
            hookd.stop().await;
            return Err(e);
        }
        Ok(hookd)
    }

    async fn wait_ready(&self, child: Option<&mut Child>) -> anyhow::Result<()> {
        Self::wait_ready_of(&self.base_url, &self.token, child).await
    }

    /// Polls `GET /subscriptions` until it answers 200 (30 s at most).
    async fn wait_ready_of(
        base_url: &str,
        token: &str,
        mut child: Option<&mut Child>,
    ) -> anyhow::Result<()> {
        let client = reqwest::Client::new();
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(c) = child.as_deref_mut()
                && let Some(status) = c.try_wait()?
            {
                bail!("hookd exited at start with {status}");
            }
            let res = client
                .get(format!("{base_url}/subscriptions?limit=1"))
                .bearer_auth(token)
                .send()
                .await;
            match res {
                Ok(r) if r.status().is_success() => return Ok(()),
                Ok(r) if r.status() == reqwest::StatusCode::UNAUTHORIZED => {
                    bail!("{base_url} refused the admin token")
                }
                _ if Instant::now() >= deadline => bail!("{base_url} was not ready within 30 s"),
                _ => tokio::time::sleep(Duration::from_millis(100)).await,
            }
        }
    }

    /// The child's usage now; `None` for a `--target`.
    pub fn usage(&self) -> Option<Usage> {
        let pid = self.child.as_ref()?.id();
        read_usage(pid).ok()
    }

    /// Stops the child (SIGTERM, then SIGKILL after 15 s) and drops the
    /// PostgreSQL schema.
    pub async fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = Command::new("kill")
                .args(["-TERM", &child.id().to_string()])
                .status();
            let deadline = Instant::now() + Duration::from_secs(15);
            while matches!(child.try_wait(), Ok(None)) && Instant::now() < deadline {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            if matches!(child.try_wait(), Ok(None)) {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
        if let Db::Postgres { url, schema } = &self.db {
            let dropped = async {
                let mut conn = sqlx::PgConnection::connect(url).await?;
                sqlx::raw_sql(sqlx::AssertSqlSafe(format!("DROP SCHEMA {schema} CASCADE")))
                    .execute(&mut conn)
                    .await?;
                anyhow::Ok(())
            };
            if let Err(e) = dropped.await {
                eprintln!("warning: could not drop schema {schema}: {e}");
            }
            self.db = Db::External;
        }
    }
}

/// `hookd` next to this binary (`target/release/`), built if missing.
fn default_binary() -> anyhow::Result<PathBuf> {
    let exe = std::env::current_exe()?;
    let beside = exe.with_file_name("hookd");
    if beside.exists() {
        return Ok(beside);
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let built = root.join("target/release/hookd");
    if !built.exists() {
        eprintln!("building hookd: cargo build --release -p hookd");
        let status = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
            .args(["build", "--release", "-p", "hookd"])
            .current_dir(&root)
            .status()
            .context("running cargo build --release -p hookd")?;
        if !status.success() {
            bail!("cargo build --release -p hookd failed: {status}");
        }
    }
    Ok(built)
}

/// CPU seconds of `pid` (utime + stime) and its memory, from `/proc`.
pub fn read_usage(pid: u32) -> anyhow::Result<Usage> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    Ok(Usage {
        cpu_s: cpu_seconds(&stat, clock_ticks()).context("parsing /proc/PID/stat")?,
        peak_rss_mib: status_kib(&status, "VmHWM:").unwrap_or(0) as f64 / 1024.0,
        rss_mib: status_kib(&status, "VmRSS:").unwrap_or(0) as f64 / 1024.0,
    })
}

/// This process's CPU seconds.
pub fn own_cpu_seconds() -> f64 {
    read_usage(std::process::id())
        .map(|u| u.cpu_s)
        .unwrap_or(0.0)
}

/// utime + stime (fields 14 and 15) of a `/proc/PID/stat` line, in seconds.
fn cpu_seconds(stat: &str, ticks_per_s: f64) -> Option<f64> {
    // The command name (field 2) may hold spaces: count from its `)`.
    let rest = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // `rest` starts at field 3, so field N is fields[N - 3].
    let utime: f64 = fields.get(11)?.parse().ok()?;
    let stime: f64 = fields.get(12)?.parse().ok()?;
    Some((utime + stime) / ticks_per_s)
}

fn status_kib(status: &str, key: &str) -> Option<u64> {
    let line = status.lines().find(|l| l.starts_with(key))?;
    line[key.len()..].split_whitespace().next()?.parse().ok()
}

fn clock_ticks() -> f64 {
    static TICKS: std::sync::OnceLock<f64> = std::sync::OnceLock::new();
    *TICKS.get_or_init(|| {
        Command::new("getconf")
            .arg("CLK_TCK")
            .output()
            .ok()
            .and_then(|o| String::from_utf8(o.stdout).ok())
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(100.0)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_time_is_read_after_the_command_name() {
        let stat = "4242 (hookd (x) y) S 1 4242 4242 0 -1 4194560 100 0 0 0 250 50 0 0 20 0 9 0";
        assert_eq!(cpu_seconds(stat, 100.0), Some(3.0));
    }

    #[test]
    fn memory_lines_are_read_in_kib() {
        let status = "Name:\thookd\nVmHWM:\t  20480 kB\nVmRSS:\t   1024 kB\n";
        assert_eq!(status_kib(status, "VmHWM:"), Some(20480));
        assert_eq!(status_kib(status, "VmRSS:"), Some(1024));
        assert_eq!(status_kib(status, "VmSwap:"), None);
    }
}
