//! Lock delay: the wait after an unclean expiry, for followers and fresh candidates.

use super::*;

fn lock_delay_follower(expiry: Expiry) -> Harness {
    let t = Timing {
        lock_delay: Some(ms(5_000)),
        ..timing()
    };
    let mut h = Harness::new(t, expiry, Notifications::None);
    let op = h.send_at(0);
    let store_remaining = (expiry == Expiry::ServerClock).then_some(ms(1_000));
    let obs = held(holder(other(), 1, "v1", store_remaining));
    let _ = h.reply(0, op, Reply::Inspect(Ok(obs)));
    h
}

#[test]
fn lock_delay_with_a_holder_seen_the_next_attempt_is_an_inspect() {
    let mut h = lock_delay_follower(Expiry::ServerClock);
    assert_eq!(h.wake(), Some(2_000));
    assert_eq!(h.tick(2_000), vec![Ev::Send(OpId(1), Request::Inspect)]);
    // Still held: keep checking, never acquire.
    let obs = held(holder(other(), 1, "v2", Some(ms(9_000))));
    assert_eq!(h.reply(2_000, OpId(1), Reply::Inspect(Ok(obs))), vec![]);
    assert_eq!(h.tick(4_000), vec![Ev::Send(OpId(2), Request::Inspect)]);
}

#[test]
fn lock_delay_free_after_release_acquires_at_once() {
    let mut h = lock_delay_follower(Expiry::ServerClock);
    let _ = h.tick(2_000);
    let out = h.reply(2_100, OpId(1), Reply::Inspect(Ok(free(1, EndReason::Released))));
    assert_eq!(out, vec![Ev::LeaderChanged(None), Ev::Send(OpId(2), acquire(None))]);
}

#[test]
fn lock_delay_free_after_expiry_acquires_only_after_the_delay() {
    let mut h = lock_delay_follower(Expiry::ServerClock);
    let _ = h.tick(2_000);
    let out = h.reply(2_100, OpId(1), Reply::Inspect(Ok(free(1, EndReason::Expired))));
    assert_eq!(out, vec![Ev::LeaderChanged(None)]);
    assert_eq!(h.wake(), Some(7_100));
    assert_eq!(h.tick(7_099), vec![]);
    // After the wait it looks again: no term started in between, so it acquires.
    assert_eq!(h.tick(7_100), vec![Ev::Send(OpId(2), Request::Inspect)]);
    let out = h.reply(7_150, OpId(2), Reply::Inspect(Ok(free(1, EndReason::Expired))));
    assert_eq!(out, vec![Ev::Send(OpId(3), acquire(None))]);
}

/// Finding 4 of the safety review: with `lock_delay` longer than the TTL, a whole term can start
/// and expire inside the wait. The follower used to acquire right after the wait without
/// looking again, skipping the lock delay that term's expiry calls for.
#[test]
fn lock_delay_restarts_when_a_term_started_and_expired_inside_the_wait() {
    let mut h = lock_delay_follower(Expiry::ServerClock);
    let _ = h.tick(2_000);
    let _ = h.reply(2_000, OpId(1), Reply::Inspect(Ok(free(1, EndReason::Expired))));
    assert_eq!(h.wake(), Some(7_000));
    // Meanwhile term 2 was granted to someone else and expired: the look after the wait sees
    // last_term 2 and waits a full lock delay again.
    assert_eq!(h.tick(7_000), vec![Ev::Send(OpId(2), Request::Inspect)]);
    assert_eq!(
        h.reply(7_000, OpId(2), Reply::Inspect(Ok(free(2, EndReason::Expired)))),
        vec![]
    );
    assert_eq!(h.wake(), Some(12_000));
    assert_eq!(h.tick(12_000), vec![Ev::Send(OpId(3), Request::Inspect)]);
    let out = h.reply(12_000, OpId(3), Reply::Inspect(Ok(free(2, EndReason::Expired))));
    assert_eq!(out, vec![Ev::Send(OpId(4), acquire(None))]);
}

#[test]
fn lock_delay_applies_after_a_broken_lease_too() {
    let mut h = lock_delay_follower(Expiry::ServerClock);
    let _ = h.tick(2_000);
    let _ = h.reply(2_000, OpId(1), Reply::Inspect(Ok(free(1, EndReason::Broken))));
    assert_eq!(h.wake(), Some(7_000));
}

#[test]
fn lock_delay_observed_expiry_takes_over_after_ttl_plus_delay() {
    let mut h = lock_delay_follower(Expiry::ObservedByContenders);
    let unchanged = || Reply::Inspect(Ok(held(holder(other(), 1, "v1", None))));
    for t in (2_000..=14_000).step_by(2_000) {
        assert_eq!(h.wake(), Some(t));
        assert_eq!(sends(&h.tick(t)), vec![&Request::Inspect], "at {t}");
        let _ = h.reply(t, h.m.pending().unwrap(), unchanged());
    }
    // v1 first seen at 0: takeover at ttl + lock_delay = 15 000.
    assert_eq!(h.wake(), Some(15_000));
    assert_eq!(sends(&h.tick(15_000)), vec![&acquire(Some("v1"))]);
}

/// A change notification (the contract allows spurious ones; MemoryStore sends one when it
/// notices an expiry) makes a follower that is waiting out the lock delay acquire at once.
#[test]
fn lock_delay_is_not_cut_short_by_a_notification() {
    let t = Timing {
        lock_delay: Some(ms(5_000)),
        ..timing()
    };
    let mut h = Harness::new(t, Expiry::ServerClock, Notifications::Release);
    let op = h.send_at(0);
    let obs = held(holder(other(), 1, "v1", Some(ms(2_000))));
    let _ = h.reply(0, op, Reply::Inspect(Ok(obs)));
    assert_eq!(h.tick(2_000), vec![Ev::Send(OpId(1), Request::Inspect)]);
    let _ = h.reply(2_000, OpId(1), Reply::Inspect(Ok(free(1, EndReason::Expired))));
    assert_eq!(h.wake(), Some(7_000));
    // The store notifies the expiry it just noticed.
    let mut out = h.step(2_000, Input::Notified);
    for t in (2_000..7_000).step_by(100) {
        out.extend(h.tick(t));
        assert!(
            !sends(&out).iter().any(|r| matches!(r, Request::Acquire(_))),
            "acquired at {t} ms: {out:?}"
        );
        if let Some(op) = h.m.pending() {
            out = h.reply(t, op, Reply::Inspect(Ok(free(1, EndReason::Expired))));
        } else {
            out.clear();
        }
    }
    assert!(!sends(&out).iter().any(|r| matches!(r, Request::Acquire(_))), "{out:?}");
}

/// A candidate that starts (or re-campaigns after its own deposition: every campaign of an
/// `Elector` starts a fresh machine) after the holder expired never learns how the previous term
/// ended, and takes the lease at once.
#[test]
fn lock_delay_applies_to_a_fresh_candidate() {
    let t = Timing {
        lock_delay: Some(ms(5_000)),
        ..timing()
    };
    let mut h = Harness::new(t, Expiry::ServerClock, Notifications::None);
    let out = h.tick(0);
    assert_eq!(
        sends(&out),
        vec![&Request::Inspect],
        "the first attempt must check how the last term ended"
    );
    let _ = h.reply(0, OpId(0), Reply::Inspect(Ok(free(1, EndReason::Expired))));
    assert_eq!(h.wake(), Some(5_000));
}
