//! Depositions and takeovers: a broken lease, a stalled leader, and the lock delay.

use super::*;

#[tokio::test(start_paused = true)]
async fn break_lease_deposes_the_leader_superseded_and_cancels_it() {
    for (kind, store) in stores() {
        let a = builder(&store, "a").build().unwrap();
        let b = builder(&store, "b").build().unwrap();
        let mut a_events = a.events();
        let la = a.campaign().await.unwrap();
        let elected_at = tokio_instant(la.elected_at());
        let token = la.cancellation_token();
        let follower = tokio::spawn(async move { b.campaign().await });
        sleep(ms(1_000)).await;

        assert_eq!(store.break_lease(&lease()).await.unwrap(), Some(Term(1)), "{kind}");
        // b is notified and takes the free lease at once.
        let lb = timeout(PATIENCE, follower).await.unwrap().unwrap().unwrap();
        assert_eq!(
            (lb.term(), tokio_instant(lb.elected_at())),
            (Term(2), elected_at + ms(1_000)),
            "{kind}"
        );
        // a finds out at its next renewal and is cancelled then.
        assert!(!la.is_cancelled());
        timeout(PATIENCE, la.cancelled()).await.unwrap();
        assert_eq!(now(), elected_at + renew_every(), "{kind}");
        assert!(token.is_cancelled());

        // Once a's work stops (its handles dropped), the Deposed event names the new holder.
        sleep(ms(250)).await;
        drop(la);
        let (d, _) = deposed(&mut a_events).await;
        assert_eq!(
            d,
            Deposed {
                term: Term(1),
                reason: DeposedReason::Superseded {
                    by: Some(CandidateId::new("b").unwrap()),
                    term: Some(Term(2))
                },
                believed_until: elected_at + renew_every(),
                work_stopped_after: Some(ms(250)),
                aborted: false,
            },
            "{kind}"
        );
        // Losing the lease releases nothing: b still leads.
        let obs = store.inspect(&lease()).await.unwrap();
        assert_eq!(
            obs.holder.map(|h| (h.id.as_str().to_string(), h.term)),
            Some(("b".to_string(), Term(2)))
        );
        lb.resign().await;
    }
}

#[tokio::test(start_paused = true)]
async fn stall_timeout_deposes_a_stalled_leader_and_a_heartbeating_one_keeps_leading() {
    for (kind, store) in stores() {
        let stall = ms(2_000);
        let a = builder(&store, "a").stall_timeout(stall).build().unwrap();
        let b = builder(&store, "b").stall_timeout(stall).build().unwrap();
        let (mut a_events, mut b_events) = (a.events(), b.events());

        // a's work heartbeats for 2 s, then hangs (but honours cancellation).
        let a_runner = tokio::spawn(async move {
            a.run(|leader: Leader| async move {
                for _ in 0..4 {
                    sleep(ms(500)).await;
                    leader.heartbeat();
                }
                leader.cancelled().await;
                Ok::<(), String>(())
            })
            .await
        });
        let (term, a_elected, _) = elected(&mut a_events).await;
        assert_eq!(term, Term(1));

        // b's work heartbeats every 500 ms for as long as it leads.
        let b_runner = tokio::spawn(async move {
            b.run(|leader: Leader| async move {
                while !leader.is_cancelled() {
                    leader.heartbeat();
                    sleep(ms(500)).await;
                }
                Ok::<(), String>(())
            })
            .await
        });

        // Last heartbeat at 2 s: a is deposed at 4 s, stops at once and releases; b takes over.
        let (d, _) = deposed(&mut a_events).await;
        assert_eq!(
            d,
            Deposed {
                term: Term(1),
                reason: DeposedReason::Stalled,
                believed_until: a_elected + ms(4_000),
                work_stopped_after: Some(Duration::ZERO),
                aborted: false,
            },
            "{kind}"
        );
        let (term, b_elected, _) = elected(&mut b_events).await;
        assert_eq!((term, b_elected), (Term(2), a_elected + ms(4_000)), "{kind}");

        // b's work keeps heartbeating: it leads for 10 TTLs without a transition, renewing.
        sleep(TTL * 10).await;
        let b_deposed = drain(&mut b_events, |e| matches!(e, Event::Deposed { .. }).then_some(()));
        let a_elected_again = drain(&mut a_events, |e| matches!(e, Event::Elected { .. }).then_some(()));
        assert!(b_deposed.is_empty() && a_elected_again.is_empty(), "{kind}");
        let obs = store.inspect(&lease()).await.unwrap();
        assert_eq!(
            obs.holder.map(|h| (h.id.as_str().to_string(), h.term)),
            Some(("b".to_string(), Term(2)))
        );
        assert_eq!(obs.last_term, Term(2), "{kind}");
        assert!(!a_runner.is_finished() && !b_runner.is_finished());
        a_runner.abort();
        b_runner.abort();
    }
}

/// Time from a holder's end to a lock-delayed candidate's election: after expiry and after release.
async fn lock_delay_takeover(store: &MemoryStore, release: bool) -> Duration {
    let lock_delay = ms(3_000);
    let start = now();
    let grant = crashed_holder(store).await;
    let b = builder(store, "b").lock_delay(lock_delay).build().unwrap();
    let follower = tokio::spawn(async move { b.campaign().await });
    let ended = if release {
        sleep(ms(4_000)).await;
        store.release(&grant).await.unwrap();
        now()
    } else {
        start + TTL // the crashed holder's grant runs out
    };
    let lb = timeout(PATIENCE, follower).await.unwrap().unwrap().unwrap();
    assert_eq!(lb.term(), Term(grant.term.0 + 1));
    let elected = tokio_instant(lb.elected_at());
    lb.resign().await;
    elected - ended
}

#[tokio::test(start_paused = true)]
async fn lock_delay_delays_takeover_after_release_not_at_all() {
    for (kind, store) in stores() {
        assert_eq!(lock_delay_takeover(&store, true).await, Duration::ZERO, "{kind}");
    }
}

#[tokio::test(start_paused = true)]
async fn lock_delay_delays_takeover_after_expiry_observed_by_contenders() {
    let store = MemoryStore::observed_expiry();
    assert_eq!(lock_delay_takeover(&store, false).await, ms(3_000));
}

/// On the server-clock store the follower learns of the expiry from an Inspect (which makes
/// MemoryStore end the lease and notify); the notification then makes it acquire at once.
#[tokio::test(start_paused = true)]
async fn lock_delay_delays_takeover_after_expiry_on_a_server_clock() {
    let store = MemoryStore::new();
    assert_eq!(lock_delay_takeover(&store, false).await, ms(3_000));
}

#[tokio::test(start_paused = true)]
async fn without_lock_delay_takeover_follows_expiry_at_once() {
    for (kind, store) in stores() {
        let start = now();
        let grant = crashed_holder(&store).await;
        let b = builder(&store, "b").build().unwrap();
        let lb = timeout(PATIENCE, b.campaign()).await.unwrap().unwrap();
        assert_eq!(lb.term(), Term(grant.term.0 + 1));
        // Server clock: at the store's deadline. Observed expiry: a TTL after b first saw the
        // record (at the start), at b's next poll.
        assert_eq!(tokio_instant(lb.elected_at()) - start, TTL, "{kind}");
        lb.resign().await;
    }
}
