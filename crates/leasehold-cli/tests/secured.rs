//! The operator surface against a secured store (`scripts/services up etcd-tls`): etcd over TLS
//! with client certificates and RBAC. A read-only role (`leasehold-ro`, read on the prefix) can
//! `status` and `watch`; `break` and `handover` need the write privilege and are refused with exit
//! 6 and one line naming what to check; no password shows in any output.

mod support;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use support::{Store, bin, fresh_lease, one_error_line, stdout, wait_for};

/// `VAR` from the environment or from `target/services/env` (what `scripts/services up` writes).
fn configured(var: &str) -> Option<String> {
    if let Some(value) = std::env::var(var).ok().filter(|v| !v.is_empty()) {
        return Some(value);
    }
    let file = concat!(env!("CARGO_MANIFEST_DIR"), "/../../target/services/env");
    let text = std::fs::read_to_string(file).ok()?;
    text.lines()
        .find_map(|line| line.strip_prefix(var)?.strip_prefix('=').map(str::to_string))
}

fn etcd_tls() -> Option<(String, String, String)> {
    let found = (
        configured("LEASEHOLD_ETCD_TLS_URL"),
        configured("LEASEHOLD_ETCD_TLS_READONLY_URL"),
        configured("LEASEHOLD_ETCD_TLS_PASSWORD"),
    );
    match found {
        (Some(rw), Some(ro), Some(password)) => Some((rw, ro, password)),
        _ if std::env::var("CI").is_ok_and(|v| v == "true" || v == "1") => {
            panic!("etcd-tls is not up under CI=true: `scripts/services up etcd-tls`")
        }
        _ => {
            eprintln!("SKIPPED: etcd-tls is not up (`eval \"$(scripts/services up etcd-tls)\"`)");
            None
        }
    }
}

#[test]
fn a_read_only_role_can_look_but_not_break_or_hand_over() {
    let Some((rw, ro, password)) = etcd_tls() else { return };
    let holder = Store::at(&rw);
    let lease = fresh_lease("secured");
    let path = holder.path("ledger");
    let script = format!("echo \"$LEASEHOLD_TERM $$\" >> '{}'; exec sleep 60", path.display());
    let _run = holder.spawn_run(
        "holder",
        &[
            "--lease", &lease, "--id", "holder", "--ttl", "2s", "--", "sh", "-c", &script,
        ],
    );
    wait_for(Duration::from_secs(15), || path.exists()).expect("the holder's command starts");

    let reader = Store::at(&ro);
    let output = reader.leasehold(&["status", &lease]);
    assert!(output.status.success(), "status with the read-only role: {output:?}");
    let table = stdout(&output);
    assert!(table.contains("held") && table.contains("holder"), "{table}");

    let mut watch = Command::new(bin())
        .args(["--store", &ro, "watch", &lease, "--interval", "100ms"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let (tx, lines) = mpsc::channel();
    let out = watch.stdout.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(out).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let first = lines
        .recv_timeout(Duration::from_secs(10))
        .expect("watch prints the leader");
    assert!(first.contains("holder"), "{first}");
    watch.kill().unwrap();
    watch.wait().unwrap();

    let output = reader.leasehold(&["break", &lease]);
    assert_eq!(
        output.status.code(),
        Some(6),
        "break with the read-only role: {output:?}"
    );
    let line = one_error_line(&output);
    assert!(line.contains("refused") && line.contains("role"), "{line}");

    // A planned handover to a campaigning successor needs the write privilege too (the request
    // is a lease of its own): refused with exit 6, the holder keeps the lease. (Exit 9 while the
    // successor has not joined the queue yet.)
    let _successor = holder.spawn_run(
        "successor",
        &[
            "--lease",
            &lease,
            "--id",
            "successor",
            "--ttl",
            "2s",
            "--",
            "sleep",
            "60",
        ],
    );
    let mut handover = None;
    wait_for(Duration::from_secs(15), || {
        let output = reader.leasehold(&["handover", &lease, "--to", "successor"]);
        let refused = output.status.code() == Some(6);
        handover = Some(output);
        refused
    })
    .unwrap_or_else(|| panic!("handover with the read-only role: {handover:?}"));
    let handover_line = one_error_line(handover.as_ref().expect("ran"));
    assert!(handover_line.contains("refused"), "{handover_line}");
    for text in [line, handover_line, table, first] {
        assert!(!text.contains(&password), "the password shows: {text}");
    }
    // The lease is untouched: still held by the holder.
    let output = holder.leasehold(&["status", &lease]);
    assert!(stdout(&output).contains("holder"), "{output:?}");
}

/// The binary has TLS for every backend that has it as a feature: `status` reaches etcd, Postgres
/// (`sslmode=verify-full`), Redis (`rediss://`) and MySQL with a private CA and a client
/// certificate, and Azure (Azurite over HTTPS) with a private CA; a wrong CA exits 6 with one
/// line naming `ca=`.
#[test]
fn tls_reaches_every_secured_store() {
    let mut tried = 0;
    for var in [
        "LEASEHOLD_ETCD_TLS_URL",
        "LEASEHOLD_POSTGRES_TLS_URL",
        "LEASEHOLD_REDIS_TLS_URL",
        "LEASEHOLD_MYSQL_TLS_URL",
        "LEASEHOLD_AZURE_TLS_URL",
    ] {
        let Some(url) = configured(var) else {
            eprintln!("SKIPPED: {var} is not set");
            continue;
        };
        let url = match var {
            "LEASEHOLD_AZURE_TLS_URL" => azblob(&url),
            _ => url,
        };
        tried += 1;
        let lease = fresh_lease("tls");
        let output = Store::at(&url).leasehold(&["status", &lease]);
        assert!(output.status.success(), "{var}: {output:?}");
        assert!(stdout(&output).contains("free"), "{var}: {output:?}");
        let wrong = url.replace("/ca.pem", "/other-ca.pem");
        let output = Store::at(&wrong).leasehold(&["status", &lease]);
        assert_eq!(output.status.code(), Some(6), "{var} with a wrong CA: {output:?}");
        let line = one_error_line(&output);
        assert!(line.contains("check ca="), "{var}: {line}");
    }
    if tried == 0 && std::env::var("CI").is_ok_and(|v| v == "true" || v == "1") {
        panic!("no secured store is up under CI=true");
    }
}

/// `https://HOST:PORT/ACCOUNT/CONTAINER?OPTIONS` (path style, as the emulator serves) as the
/// `azblob://ACCOUNT/CONTAINER?endpoint=...&OPTIONS` the CLI takes.
fn azblob(url: &str) -> String {
    let (base, options) = url.split_once('?').expect("a URL with options");
    let (endpoint, container) = base.rsplit_once('/').expect("a container");
    let account = endpoint.rsplit('/').next().expect("an account");
    let endpoint = endpoint.replace(':', "%3A").replace('/', "%2F");
    format!("azblob://{account}/{container}?endpoint={endpoint}&{options}")
}
