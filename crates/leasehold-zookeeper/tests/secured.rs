//! The secured section of the suite against zookeeper-auth (`scripts/services up
//! zookeeper-auth`): digest authentication, znodes with `creator_all` ACLs; and another
//! identity cannot delete the store's znodes.

use std::sync::Arc;
use std::time::Duration;

use leasehold_core::LeaseStore;
use leasehold_zookeeper::ZookeeperStore;
use zookeeper_client as zk;

use leasehold_conformance::require_server;
use leasehold_conformance::secured::{Refusal, Secured, password_secrets, secured_backend};

/// The zookeeper-auth server (`LEASEHOLD_ZOOKEEPER_AUTH_URL`): digest user `leasehold`, owner of
/// the chroot `/leasehold-tests`.
fn zookeeper_auth() -> Option<Secured> {
    let url = require_server("zookeeper-auth", "LEASEHOLD_ZOOKEEPER_AUTH_URL")?;
    let secrets = password_secrets("LEASEHOLD_ZOOKEEPER_AUTH_PASSWORD")?;
    // A digest credential is never refused by itself: a wrong password is another identity,
    // which the ACLs keep out at the first request.
    let refusals = vec![Refusal {
        what: "wrong password (another digest identity)",
        url: url.replacen(&secrets[1], "wrong-password", 1),
        says: "check the digest credentials",
    }];
    let backend = secured_backend("zookeeper", &url, |url| {
        Box::pin(async move { Ok(Arc::new(ZookeeperStore::connect(&url).await?) as Arc<dyn LeaseStore>) })
    })?;
    Some(Secured {
        backend,
        secrets,
        refusals,
    })
}

leasehold_conformance::secured!(zookeeper_auth, zookeeper_auth());

fn env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.is_empty())
}

async fn raw(host: &str, user: &str, password: &str) -> zk::Client {
    zk::Client::connector()
        .with_session_timeout(Duration::from_secs(10))
        .with_auth("digest", format!("{user}:{password}").as_bytes())
        .connect(host)
        .await
        .expect("a raw ZooKeeper client")
}

/// The leader's candidate znode: the store's identity can list and delete it, another digest
/// identity (user `intruder`) gets NoAuth for both, and the leader keeps its lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_identity_cannot_delete_our_znodes() {
    let (Some(url), Some(password), Some(intruder_url)) = (
        leasehold_conformance::require_server("zookeeper-auth", "LEASEHOLD_ZOOKEEPER_AUTH_URL"),
        env("LEASEHOLD_ZOOKEEPER_AUTH_PASSWORD"),
        env("LEASEHOLD_ZOOKEEPER_AUTH_INTRUDER_URL"),
    ) else {
        eprintln!("SKIPPED: zookeeper-auth is not up");
        return;
    };
    let host = url
        .trim_start_matches("zk://")
        .split('/')
        .next()
        .expect("a host")
        .to_string();
    let intruder_password = intruder_url.rsplit_once("intruder:").expect("intruder's credential").1;
    let intruder_password = intruder_password.replace("%40", "@").replace("%2F", "/");
    let store = ZookeeperStore::connect(&url).await.expect("connects");
    let lease = format!("acl-{:x}", leasehold_core::random_u64());
    let grant = leasehold_conformance::must_grant(&store, &lease, "owner", Duration::from_secs(5)).await;

    let ours = raw(&host, "leasehold", &password).await;
    let candidates = format!("/leasehold-tests/{lease}/candidates");
    let children = ours
        .list_children(&candidates)
        .await
        .expect("the store's identity lists");
    assert_eq!(children.len(), 1, "{children:?}");
    let znode = format!("{candidates}/{}", children[0]);

    let intruder = raw(&host, "intruder", &intruder_password).await;
    let deleted = intruder.delete(&znode, None).await;
    assert!(
        matches!(deleted, Err(zk::Error::NoAuth)),
        "intruder deleted {znode}: {deleted:?}"
    );
    let listed = intruder.list_children(&candidates).await;
    assert!(matches!(listed, Err(zk::Error::NoAuth)), "intruder listed: {listed:?}");
    let intruding = ZookeeperStore::connect(&intruder_url)
        .await
        .expect("digest is never refused at connect");
    let broken = intruding.break_lease(&lease.parse().expect("a lease name")).await;
    assert!(
        matches!(broken, Err(leasehold_core::Error::Refused { .. })),
        "intruder broke the lease: {broken:?}"
    );
    match store.renew(&grant).await.expect("the owner renews") {
        leasehold_core::Renewed::Renewed(grant) => store.release(&grant).await.expect("released"),
        lost => panic!("the owner lost the lease: {lost:?}"),
    }
}
