//! Writes that race: the store's own compare-and-set, under the engine.
//!
//! A store that checks a record and then writes it without a lock answers one writer at a time
//! correctly and lets many win at once: the S3 servers `s3s-fs` 0.14 (2 to 16 winners of 16 in
//! every round) and SeaweedFS before March 2026 did. Only writers released together find it.

use leasehold_core::{Error, Expiry};
use tokio::sync::Barrier;

use super::*;

/// How many writers race, each with its own client.
const WRITERS: usize = 16;

/// How many rounds.
const ROUNDS: usize = 10;

/// 16 writers, each with its own client, wait behind a barrier and then acquire at once, in 10
/// rounds of: a create (a lease nobody has written), a replace (the same lease, released by the
/// winner), and where expiry is observed by contenders a takeover (every writer names the
/// holder's record version). Exactly one writer wins each race, with a term above every earlier
/// one, and the store then names it as the holder.
///
/// A writer whose acquire failed (a transient error: its outcome is unknown) may be the one the
/// store granted; a race where nobody was answered `Granted` is accepted only when the holder
/// is such a writer.
///
/// # Panics
///
/// When a race has two winners or none, or the store names another holder than the winner.
pub async fn racing_writes_have_one_winner(backend: Arc<dyn Backend>) {
    let scene = Scene::new(backend, "racing_writes_have_one_winner").await;
    let mut stores = Vec::new();
    for _ in 0..WRITERS {
        stores.push(scene.connect().await);
    }
    let ids: Vec<CandidateId> = (0..WRITERS).map(|i| id(&format!("writer-{i:02}"))).collect();
    let takeovers = scene.caps.expiry == Expiry::ObservedByContenders;
    if !takeovers {
        scene.log(format_args!(
            "no takeover races: expiry is {:?}, not observed by contenders",
            scene.caps.expiry
        ));
    }
    for round in 1..=ROUNDS {
        let lease = LeaseName::new(scene.other_lease(&format!("r{round}"))).expect("scenario lease names are valid");
        let mut holder = race(&scene, &stores, &ids, &lease, None, round, "create").await;
        let mut terms = vec![holder.term];
        release(&scene, &stores, &ids, &holder).await;
        holder = race(&scene, &stores, &ids, &lease, None, round, "replace").await;
        terms.push(holder.term);
        if takeovers {
            let version = holder.token.clone();
            holder = race(&scene, &stores, &ids, &lease, Some(version), round, "takeover").await;
            terms.push(holder.term);
        }
        assert!(
            terms.windows(2).all(|w| w[1] > w[0]),
            "{}: round {round}: terms {terms:?} do not increase",
            scene.prefix
        );
        release(&scene, &stores, &ids, &holder).await;
        for (store, candidate) in stores.iter().zip(&ids) {
            if let Err(e) = store.withdraw(&lease, candidate).await {
                panic!("{}: round {round}: withdrawing {candidate}: {e}", scene.prefix);
            }
        }
    }
    scene.log(format_args!("{ROUNDS} rounds, one winner each race"));
    scene.finish().await;
}

/// One race: every writer acquires `lease` at once (naming `takeover` if given). The grant of
/// the one winner.
async fn race(
    scene: &Scene,
    stores: &[Arc<dyn LeaseStore>],
    ids: &[CandidateId],
    lease: &LeaseName,
    takeover: Option<String>,
    round: usize,
    what: &str,
) -> Grant {
    let p = &scene.prefix;
    let barrier = Arc::new(Barrier::new(stores.len()));
    let tasks: Vec<JoinHandle<Result<Acquired, Error>>> = stores
        .iter()
        .zip(ids)
        .map(|(store, candidate)| {
            let (store, barrier) = (store.clone(), barrier.clone());
            let request = AcquireRequest {
                takeover: takeover.clone(),
                ..request(lease, candidate, scene.ttl)
            };
            tokio::spawn(async move {
                barrier.wait().await;
                store.acquire(&request).await
            })
        })
        .collect();
    let mut winners = Vec::new();
    let mut unknown = Vec::new();
    for (task, candidate) in tasks.into_iter().zip(ids) {
        match task.await.expect("an acquire task panicked") {
            Ok(Acquired::Granted(grant)) => winners.push(grant),
            Ok(Acquired::Held(_)) => {}
            Err(e) if e.is_transient() => unknown.push((candidate.clone(), e)),
            Err(e) => panic!("{p}: round {round}, {what}: {candidate} failed: {e}"),
        }
    }
    let seen = scene
        .connect()
        .await
        .inspect(lease)
        .await
        .unwrap_or_else(|e| panic!("{p}: round {round}, {what}: inspect: {e}"));
    let holder = seen.holder.clone();
    let names: Vec<String> = winners
        .iter()
        .map(|g| format!("{} (term {})", g.holder, g.term))
        .collect();
    match winners.as_slice() {
        [winner] => {
            assert_eq!(
                holder.as_ref().map(|h| (&h.id, h.term)),
                Some((&winner.holder, winner.term)),
                "{p}: round {round}, {what}: {} won, but the store shows {seen:?}",
                winner.holder
            );
            winner.clone()
        }
        [] => {
            let Some(holder) = holder.filter(|h| unknown.iter().any(|(c, _)| *c == h.id)) else {
                panic!(
                    "{p}: round {round}, {what}: no winners of {} writers (failed: {unknown:?}); the store shows {seen:?}",
                    stores.len()
                );
            };
            scene.log(format_args!(
                "round {round}, {what}: {} won, its answer was an error",
                holder.id
            ));
            Grant {
                lease: lease.clone(),
                holder: holder.id.clone(),
                term: holder.term,
                ttl: scene.ttl,
                token: holder.version.clone(),
            }
        }
        _ => panic!(
            "{p}: round {round}, {what}: {} winners of {} writers racing: {}; the store shows {:?}",
            winners.len(),
            stores.len(),
            names.join(", "),
            holder.map(|h| (h.id, h.term))
        ),
    }
}

/// The winner releases, with its own client.
async fn release(scene: &Scene, stores: &[Arc<dyn LeaseStore>], ids: &[CandidateId], grant: &Grant) {
    let i = ids
        .iter()
        .position(|c| *c == grant.holder)
        .expect("the winner is one of the writers");
    if let Err(e) = stores[i].release(grant).await {
        panic!("{}: {} releasing: {e}", scene.prefix, grant.holder);
    }
}
