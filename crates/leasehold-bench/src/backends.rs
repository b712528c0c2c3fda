//! Which backends exist here: URLs from `target/services/env`, and whether the facade can reach them.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use leasehold::{Capabilities, Error, LeaseName, LeaseStore, MemoryStore, Notifications};

/// The repository root (this crate lives in `crates/leasehold-bench`).
pub(crate) fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The servers [`start_services`] started: stopped again (`scripts/services down`) when this
/// is dropped, so that a benchmark leaves the machine's ports as it found them. Servers that
/// were running before are left running: other people's tests use them.
#[derive(Debug, Default)]
pub(crate) struct Started(Vec<&'static str>);

impl Drop for Started {
    fn drop(&mut self) {
        if self.0.is_empty() {
            return;
        }
        eprintln!(
            "stopping the servers this run started: scripts/services down {}",
            self.0.join(" ")
        );
        let _ = services(&["down"], &self.0, false);
    }
}

/// `scripts/services COMMAND SERVICE...`, its exit status.
fn services(command: &[&str], names: &[&str], quiet: bool) -> std::io::Result<std::process::ExitStatus> {
    let mut run = std::process::Command::new(repo_root().join("scripts/services"));
    run.args(command).args(names).stdout(std::process::Stdio::null());
    if quiet {
        run.stderr(std::process::Stdio::null());
    }
    run.status()
}

/// Runs `scripts/services up` for the servers the selected backends need, and returns those
/// that were not running before.
pub(crate) fn start_services(selected: &[&str]) -> Started {
    let wanted: Vec<&'static str> = selected
        .iter()
        .filter_map(|b| match *b {
            "postgres" => Some("postgres"),
            "mysql" => Some("mariadb"),
            "redis" => Some("redis"),
            "etcd" => Some("etcd"),
            "zookeeper" => Some("zookeeper"),
            "dynamodb" => Some("dynalite"),
            "azure" => Some("azurite"),
            "s3" => Some("moto"),
            _ => None,
        })
        .collect();
    if wanted.is_empty() {
        return Started::default();
    }
    let stopped: Vec<&'static str> = wanted
        .iter()
        .copied()
        .filter(|s| !services(&["status"], &[s], true).is_ok_and(|status| status.success()))
        .collect();
    eprintln!("starting local servers: scripts/services up {}", wanted.join(" "));
    match services(&["up"], &wanted, false) {
        Ok(s) if s.success() => {}
        Ok(s) => {
            eprintln!("scripts/services up exited with {s}; servers that did not start are reported as not available")
        }
        Err(e) => eprintln!("could not run scripts/services: {e}"),
    }
    Started(stopped)
}

/// `VAR=value` lines of `target/services/env`, overridden by the process environment.
#[derive(Debug, Default)]
pub(crate) struct ServiceEnv {
    vars: HashMap<String, String>,
}

impl ServiceEnv {
    pub(crate) fn load() -> ServiceEnv {
        let dir = std::env::var("LEASEHOLD_SERVICES_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|_| repo_root().join("target/services"));
        let mut vars = HashMap::new();
        if let Ok(text) = std::fs::read_to_string(dir.join("env")) {
            for line in text.lines() {
                if let Some((k, v)) = line.trim().trim_start_matches("export ").split_once('=') {
                    vars.insert(k.to_string(), v.trim_matches(|c| c == '"' || c == '\'').to_string());
                }
            }
        }
        ServiceEnv { vars }
    }

    pub(crate) fn get(&self, key: &str) -> Option<String> {
        std::env::var(key).ok().or_else(|| self.vars.get(key).cloned())
    }
}

/// One backend as the runner sees it.
#[derive(Debug)]
pub(crate) struct Backend {
    pub(crate) name: &'static str,
    /// `Err(why)` when it cannot be measured here.
    pub(crate) available: Result<Available, String>,
}

#[derive(Debug)]
pub(crate) struct Available {
    /// `None` for the in-memory store (every client is the same store).
    url: Option<String>,
    memory: Option<Arc<MemoryStore>>,
    pub(crate) caps: Capabilities,
    /// The TTL of the latency, handover, failover, transition and idle measures.
    pub(crate) ttl: Duration,
    /// The TTL of the scale measures.
    pub(crate) scale_ttl: Duration,
}

impl Available {
    /// A new, independent client (a new connection) of the store.
    pub(crate) async fn connect(&self) -> leasehold::Result<Arc<dyn LeaseStore>> {
        match (&self.memory, &self.url) {
            (Some(m), _) => Ok(m.clone()),
            (None, Some(url)) => leasehold::connect(url).await,
            (None, None) => unreachable!("a backend has a URL or is the memory store"),
        }
    }

    /// The URL for a child process (`None`: in-process only).
    pub(crate) fn url(&self) -> Option<&str> {
        self.url.as_deref()
    }

    /// Whether idle followers are woken by the store rather than polling.
    pub(crate) fn notifies(&self) -> bool {
        self.caps.notifications != Notifications::None
    }
}

impl Backend {
    pub(crate) async fn open(name: &'static str, env: &ServiceEnv, scratch: &Path, smoke: bool) -> Backend {
        let url = match name {
            "memory" => None,
            "sqlite" => Some(Ok(format!("sqlite://{}/bench.db", scratch.display()))),
            "postgres" => Some(env.get("LEASEHOLD_POSTGRES_URL").ok_or("postgres")),
            "mysql" => Some(env.get("LEASEHOLD_MYSQL_URL").ok_or("mariadb")),
            "redis" => Some(env.get("LEASEHOLD_REDIS_URL").ok_or("redis")),
            "etcd" => Some(env.get("LEASEHOLD_ETCD_URL").ok_or("etcd")),
            "zookeeper" => Some(env.get("LEASEHOLD_ZOOKEEPER_URL").ok_or("zookeeper")),
            "dynamodb" => Some(env.get("LEASEHOLD_DYNAMODB_URL").ok_or("dynalite").map(|endpoint| {
                format!(
                    "dynamodb://leasehold-bench?endpoint={}&access_key_id=local&secret_access_key=local&create_table=true",
                    encode(&endpoint)
                )
            })),
            "azure" => Some(azurite_url(env).ok_or("azurite")),
            "s3" => Some(env.get("LEASEHOLD_S3_URL").ok_or("moto").map(|endpoint| {
                format!(
                    "s3://leasehold-bench/bench?endpoint={}&access_key_id=local&secret_access_key=local&create_bucket=true",
                    encode(&endpoint)
                )
            })),
            _ => unreachable!("checked against ALL_BACKENDS"),
        };
        let available = match url {
            None => {
                let memory = Arc::new(MemoryStore::new());
                let caps = memory.capabilities();
                Ok(Available {
                    url: None,
                    memory: Some(memory),
                    ttl: bench_ttl(&caps, smoke),
                    scale_ttl: scale_ttl(&caps, smoke),
                    caps,
                })
            }
            Some(Err(server)) => Err(format!(
                "not available: {server} is not running (no URL in target/services/env)"
            )),
            Some(Ok(url)) => probe(&url, smoke).await,
        };
        if let Err(why) = &available {
            eprintln!("   {name}: {why}");
        }
        Backend { name, available }
    }
}

async fn probe(url: &str, smoke: bool) -> Result<Available, String> {
    let store = match tokio::time::timeout(Duration::from_secs(20), leasehold::connect(url)).await {
        Err(_) => return Err("not available: connecting took over 20 s".into()),
        Ok(Err(Error::UnsupportedScheme { scheme, hint })) => {
            return Err(format!(
                "not available: scheme `{scheme}` not supported by this build ({hint})"
            ));
        }
        Ok(Err(e)) => return Err(format!("not available: server down? {e}")),
        Ok(Ok(store)) => store,
    };
    let lease = LeaseName::new("bench-probe").expect("valid name");
    match tokio::time::timeout(Duration::from_secs(10), store.inspect(&lease)).await {
        Err(_) => return Err("not available: the server does not answer (10 s)".into()),
        Ok(Err(e)) => return Err(format!("not available: {e}")),
        Ok(Ok(_)) => {}
    }
    let caps = store.capabilities();
    Ok(Available {
        url: Some(url.to_string()),
        memory: None,
        ttl: bench_ttl(&caps, smoke),
        scale_ttl: scale_ttl(&caps, smoke),
        caps,
    })
}

/// Full run: max(backend minimum, 2 s); smoke: max(minimum, 1 s).
fn bench_ttl(caps: &Capabilities, smoke: bool) -> Duration {
    let want = if smoke {
        Duration::from_secs(1)
    } else {
        Duration::from_secs(2)
    };
    want.max(*caps.ttl.start())
}

/// Scale runs renew every ttl/3; 5 s keeps 10,000 leases at 6,000 renewals a second.
fn scale_ttl(caps: &Capabilities, smoke: bool) -> Duration {
    let want = if smoke {
        Duration::from_secs(1)
    } else {
        Duration::from_secs(5)
    };
    want.max(*caps.ttl.start())
}

fn encode(s: &str) -> String {
    url::form_urlencoded::byte_serialize(s.as_bytes()).collect()
}

/// `azblob://ACCOUNT/CONTAINER?endpoint=..&sas=..` for Azurite, with an account SAS signed by the
/// emulator's published development key (the 1.x SDK has no shared-key authentication).
fn azurite_url(env: &ServiceEnv) -> Option<String> {
    let endpoint = env.get("LEASEHOLD_AZURITE_URL")?;
    let account = env.get("LEASEHOLD_AZURITE_ACCOUNT")?;
    let key = env.get("LEASEHOLD_AZURITE_ACCOUNT_KEY")?;
    let sas = account_sas(&account, &key, Duration::from_secs(24 * 3600))?;
    Some(format!(
        "azblob://{account}/leasehold-bench?endpoint={}&sas={}",
        encode(&endpoint),
        encode(&sas)
    ))
}

/// An account SAS (blob service; racwdl on service, container and object), as in
/// crates/leasehold-azure/tests/common/mod.rs.
fn account_sas(account: &str, key_base64: &str, valid_for: Duration) -> Option<String> {
    let key = leasehold::config::Secret::new(key_base64);
    let sas = leasehold::azure::account_sas(account, &key, valid_for).ok()?;
    Some(sas.expose().to_string())
}

/// `2030-01-01T00:00:00Z` for a time, in UTC.
pub(crate) fn iso8601(at: SystemTime) -> String {
    let secs = at.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let (days, rem) = (secs / 86_400, secs % 86_400);
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}
