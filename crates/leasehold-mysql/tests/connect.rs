//! Stores that connect at once (a fleet restarting, 100 candidates of a benchmark) all connect:
//! the checks `connect` makes never wait for each other or deadlock.

use leasehold_mysql::MysqlStore;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_stores_connect_at_once() {
    let Some(url) = leasehold_conformance::require_server("mysql", "LEASEHOLD_MYSQL_URL") else {
        return;
    };
    for round in 0..3 {
        let connecting = (0..32).map(|_| MysqlStore::connect(&url));
        for (i, store) in futures::future::join_all(connecting).await.into_iter().enumerate() {
            if let Err(e) = store {
                panic!("round {round}, store {i}: {e}");
            }
        }
    }
}
