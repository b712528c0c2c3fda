//! Notifications during a request, and grants that come back late.

use super::*;

/// A release notified while an acquire is under way: the acquire's reply (Held, answered before
/// the release) must not put the follower to sleep until the old holder's store deadline.
#[test]
fn notification_during_a_request_is_not_lost() {
    let mut h = Harness::new(timing(), Expiry::ServerClock, Notifications::Release);
    let op = h.send_at(0);
    assert_eq!(h.step(5, Input::Notified), vec![]);
    let before_release = held(holder(other(), 1, "v1", Some(ms(9_000))));
    let out = h.reply(10, op, Reply::Acquire(Ok(Acquired::Held(before_release))));
    assert_eq!(sends(&out), vec![&acquire(None)], "retried at once: {out:?}");
}

/// A candidate backing off after stepping down is not woken early by a notification (its own
/// release, typically): a healthy candidate must get the chance to take over.
#[test]
fn notification_does_not_cut_the_back_off_after_stepping_down() {
    let mut h = Harness::new(timing(), Expiry::ServerClock, Notifications::Release);
    let op = h.send_at(0);
    let _ = h.reply(0, op, Reply::Acquire(Ok(Acquired::Granted(grant(1, "v1")))));
    let out = h.step(1_000, Input::Resign);
    let release = out.iter().find_map(|e| match e {
        Ev::Send(op, Request::Release(_)) => Some(*op),
        _ => None,
    });
    let _ = h.reply(1_000, release.expect("released"), Reply::Release(Ok(())));
    assert_eq!(h.step(1_001, Input::Notified), vec![]);
    assert_eq!(h.wake(), Some(1_000 + BACKOFF));
}

/// An acquire the machine stopped waiting for (timed out, read back as a free lease) is
/// answered late with a grant: the engine runs every call to completion, so the reply reaches
/// the machine. It is a reply to this machine's own request, so it is taken like a read-back
/// that shows the grant: believed from the send time of the oldest unknown acquire.
#[test]
fn a_grant_that_comes_back_late_is_believed_from_the_oldest_unknown_send() {
    let mut h = Harness::follower();
    let late_op = h.send_at(0);
    assert_eq!(
        h.tick(3_000),
        vec![Ev::Trouble("timeout"), Ev::Send(OpId(1), Request::Inspect)]
    );
    let _ = h.reply(3_100, OpId(1), Reply::Inspect(Ok(free(0, EndReason::Released))));
    let out = h.reply(3_200, late_op, Reply::Acquire(Ok(Acquired::Granted(grant(1, "v1")))));
    assert!(out.iter().any(|e| matches!(e, Ev::Elected { .. })), "{out:?}");
    // From 0 ms (the acquire's send time) for ttl x (1 - drift) = 8 s.
    assert!(h.believes(7_999));
    assert!(!h.believes(8_000));
}

/// The same late grant while the next acquire is under way (session 11 review): the machine
/// leads from the late grant and must renew; it stops waiting for the acquire under way (its
/// reply comes late like any abandoned call), or it would send no renewal and be deposed at its
/// step-down point.
#[test]
fn a_grant_that_comes_back_late_while_the_next_acquire_is_under_way_is_renewed() {
    let mut h = Harness::follower();
    let late_op = h.send_at(0);
    let _ = h.tick(3_000); // times out: read back
    let _ = h.reply(3_100, OpId(1), Reply::Inspect(Ok(free(0, EndReason::Released))));
    let next_acquire = h.send_at(5_100);
    assert!(next_acquire != late_op);
    let out = h.reply(5_200, late_op, Reply::Acquire(Ok(Acquired::Granted(grant(1, "v1")))));
    assert!(out.iter().any(|e| matches!(e, Ev::Elected { .. })), "{out:?}");
    // Renewals are due from 3 s (the grant counts from 0 ms): one goes out at once.
    assert!(
        out.iter()
            .any(|e| matches!(e, Ev::Send(_, Request::Renew(g)) if g.term == Term(1))),
        "no renewal while the abandoned acquire is out: {out:?}"
    );
}

/// The same late grant when too little of it is left: released, never believed.
#[test]
fn a_grant_that_comes_back_too_late_is_released_not_believed() {
    let mut h = Harness::follower();
    let late_op = h.send_at(0);
    let _ = h.tick(3_000); // times out: read back
    let _ = h.reply(3_100, OpId(1), Reply::Inspect(Ok(free(0, EndReason::Released))));
    let out = h.reply(7_500, late_op, Reply::Acquire(Ok(Acquired::Granted(grant(1, "v1")))));
    assert!(!out.iter().any(|e| matches!(e, Ev::Elected { .. })), "{out:?}");
    assert!(
        out.contains(&Ev::Send(OpId(2), Request::Release(grant(1, "v1")))),
        "{out:?}"
    );
    assert!(!h.believes(7_500));
}

/// A late grant below what the machine has seen since (here: a read-back already showed this
/// candidate at that term without adopting it) is not believed either: released when idle.
#[test]
fn a_late_grant_not_above_the_floor_is_released() {
    let mut h = Harness::follower();
    let late_op = h.send_at(0);
    let _ = h.tick(3_000); // times out: read back
    // Nothing seen before: the read-back does not adopt term 1, and term 1 is now the floor.
    let ours = held(holder(me(), 1, "v1", None));
    let out = h.reply(3_100, OpId(1), Reply::Inspect(Ok(ours)));
    assert!(!out.iter().any(|e| matches!(e, Ev::Elected { .. })), "{out:?}");
    let out = h.reply(3_200, late_op, Reply::Acquire(Ok(Acquired::Granted(grant(1, "v1")))));
    assert_eq!(out, vec![Ev::Send(OpId(2), Request::Release(grant(1, "v1")))]);
    assert!(!h.believes(3_200));
}

/// The same late grant, but a read-back adopted its term first: it is the lease the machine
/// leads with, and is not released behind its back.
#[test]
fn a_late_grant_of_the_term_a_read_back_adopted_is_kept() {
    let mut h = Harness::follower();
    let op = h.send_at(0);
    let _ = h.reply(
        0,
        op,
        Reply::Acquire(Ok(Acquired::Held(held(holder(other(), 1, "v0", None))))),
    );
    let late_op = h.send_at(2_000);
    let _ = h.tick(5_000); // times out: read back
    let ours = held(holder(me(), 2, "v1", None));
    let out = h.reply(5_100, OpId(2), Reply::Inspect(Ok(ours)));
    assert!(out.iter().any(|e| matches!(e, Ev::Elected { .. })), "{out:?}");
    let out = h.reply(5_200, late_op, Reply::Acquire(Ok(Acquired::Granted(grant(2, "v1")))));
    assert_eq!(out, vec![]);
    assert!(h.believes(5_200));
    assert_eq!(h.m.term(), Some(Term(2)));
}

/// A shutdown while an acquire the machine had given up on is still running: the machine
/// withdraws and stops, and when that call comes back with a grant after all, the stopped
/// machine releases it (the driver keeps it until every such call has ended), so nothing of a
/// finished campaign keeps the lease.
#[test]
fn a_grant_that_comes_back_after_the_machine_stopped_is_released() {
    let mut h = Harness::follower();
    let late_op = h.send_at(0);
    assert_eq!(
        h.tick(3_000),
        vec![Ev::Trouble("timeout"), Ev::Send(OpId(1), Request::Inspect)]
    );
    let _ = h.reply(3_100, OpId(1), Reply::Inspect(Ok(free(0, EndReason::Released))));
    let out = h.step(3_200, Input::Shutdown);
    assert_eq!(out, vec![Ev::Send(OpId(2), Request::Withdraw)]);
    assert_eq!(h.reply(3_300, OpId(2), Reply::Withdraw(Ok(()))), vec![Ev::Stopped]);
    assert!(h.m.is_stopped());
    let out = h.reply(3_400, late_op, Reply::Acquire(Ok(Acquired::Granted(grant(1, "v1")))));
    assert_eq!(out, vec![Ev::Send(OpId(3), Request::Release(grant(1, "v1")))]);
    assert_eq!(h.reply(3_500, OpId(3), Reply::Release(Ok(()))), vec![]);
    assert!(h.m.is_stopped() && h.m.pending().is_none());
}

/// A lease handed over to us and not taken yet shows us as holder at the previous holder's term
/// (`reserved`). A read-back after an unknown acquire must not adopt it: that term was the
/// previous holder's, and believing it would fence our writes with its token. The next acquire
/// takes the reservation with a new term.
#[test]
fn acquire_read_back_of_a_reservation_for_us_is_not_adopted() {
    let mut h = Harness::follower();
    let op = h.send_at(0);
    let _ = h.reply(
        0,
        op,
        Reply::Acquire(Ok(Acquired::Held(held(holder(other(), 1, "v0", None))))),
    );
    let _ = h.tick(2_000); // acquire sent at 2 000
    assert_eq!(
        h.tick(5_000),
        vec![Ev::Trouble("timeout"), Ev::Send(OpId(2), Request::Inspect)]
    );
    // Meanwhile the other holder led term 2 and handed it over to us.
    let reservation = held(HolderInfo {
        reserved: true,
        ..holder(me(), 2, "v2", Some(ms(8_000)))
    });
    let out = h.reply(5_100, OpId(2), Reply::Inspect(Ok(reservation)));
    assert!(!out.iter().any(|e| matches!(e, Ev::Elected { .. })), "{out:?}");
    assert!(!h.believes(5_100));
    assert_eq!(h.m.term(), None);
}
