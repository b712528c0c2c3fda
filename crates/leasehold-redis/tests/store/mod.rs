//! Redis-specific behaviour against a real server (`scripts/services up redis`): expiry by the
//! server's clock, a silently cut-off leader, lost replies, corrupt keys of every kind, history,
//! notifications, terms that survive a lost counter, and secrets that never show.

use crate::common;
mod connection;
mod records;

use std::time::Duration;

use common::{RedisBackend, TTL, grant, raw_cmd, unguarded as backend};
use futures::StreamExt;
use leasehold_core::{Error, LeaseName, random_u64};
use leasehold_redis::{RedisConfig, RedisStore, RedisStoreError};

fn lease(tag: &str) -> LeaseName {
    LeaseName::new(format!("store-{tag}-{:x}", random_u64())).unwrap()
}

/// The next item of a changes stream, if it comes within 2 s.
async fn next(
    changes: &mut leasehold_core::Changes,
) -> Result<Option<leasehold_core::Change>, tokio::time::error::Elapsed> {
    tokio::time::timeout(Duration::from_secs(2), changes.next()).await
}

/// The raw contents of a lease's keys.
async fn dump(backend: &RedisBackend, keys: &leasehold_redis::LeaseKeys) -> Vec<redis::Value> {
    let mut out = Vec::new();
    for key in [&keys.lease, &keys.state, &keys.history] {
        out.push(raw_cmd(backend, &["DUMP", key]).await);
    }
    out
}

/// The password never shows: not in `Debug` or `Display` of the config or the store, not in the
/// errors of a refused connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn secrets_are_redacted() {
    let Some(backend) = backend() else { return };
    let user = format!("leasehold-test-{:x}", random_u64());
    let secret = format!("S3cret-{:x}", random_u64());
    let created = redis::cmd("ACL")
        .arg("SETUSER")
        .arg(&user)
        .arg("on")
        .arg(format!(">{secret}"))
        .arg("~*")
        .arg("&*")
        .arg("+@all")
        .query_async::<()>(&mut backend.raw().await)
        .await;
    if let Err(e) = created {
        eprintln!("SKIPPED secrets_are_redacted: cannot create an ACL user ({e})");
        return;
    }
    let mut config = backend.config.clone();
    config.username = Some(user.clone());
    config.password = Some(secret.clone().into());
    let store = RedisStore::from_config(config.clone())
        .await
        .expect("the ACL user connects");
    let lease = lease("secret");
    grant(&store, &lease, "a", TTL).await;
    let mut shown = vec![format!("{config:?}"), config.to_string(), format!("{store:?}")];

    let mut wrong = config.clone();
    wrong.password = Some(format!("{secret}-wrong").into());
    let err = RedisStore::from_config(wrong.clone()).await.unwrap_err();
    assert!(
        matches!(
            err,
            Error::Refused {
                store: "redis",
                operation: "connect",
                ..
            }
        ) && err.is_permanent(),
        "a wrong password is permanent: {err:?}"
    );
    shown.extend([
        err.to_string(),
        format!("{err:?}"),
        format!("{wrong:?}"),
        wrong.to_string(),
    ]);
    let url = format!(
        "redis://{user}:{secret}@{}:{}/{}?nonsense=1",
        config.host, config.port, config.db
    );
    let err = RedisStore::connect(&url).await.unwrap_err();
    shown.extend([err.to_string(), format!("{err:?}")]);
    let url = format!("redis://{user}:{secret}@127.0.0.1:1/0");
    let err = RedisStore::connect(&url).await.unwrap_err();
    shown.extend([err.to_string(), format!("{err:?}")]);

    let _ = redis::cmd("ACL")
        .arg("DELUSER")
        .arg(&user)
        .query_async::<()>(&mut backend.raw().await)
        .await;
    for text in &shown {
        assert!(!text.contains(&secret), "the password shows in: {text}");
    }
    println!("{}", shown.join("\n"));
}

/// The restart guard's error is typed and says what to do.
#[test]
fn the_restart_guard_error_explains_itself() {
    let err = Error::Store {
        store: "redis",
        source: Box::new(RedisStoreError::RecentRestart {
            uptime: Duration::from_secs(0),
            needed: Duration::from_secs(2),
        }),
    };
    assert!(err.to_string().contains("restart_guard"), "{err}");
    assert!(!err.is_transient());
    let config: RedisConfig = "redis://h?restart_guard=false".parse().unwrap();
    assert!(!config.restart_guard);
}
