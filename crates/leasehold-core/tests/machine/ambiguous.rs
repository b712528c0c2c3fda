//! Ambiguous acquires: read-backs after a lost reply, unknown acquires and the term floor,
//! stale replies.

use super::*;

#[test]
fn acquire_timeout_reads_back_and_adopts_our_grant_from_the_original_send_time() {
    let mut h = Harness::follower();
    // Seen held by another at term 1: the floor is 1.
    let op = h.send_at(0);
    let _ = h.reply(
        0,
        op,
        Reply::Acquire(Ok(Acquired::Held(held(holder(other(), 1, "v0", None))))),
    );
    assert_eq!(sends(&h.tick(2_000)), vec![&acquire(None)]);
    assert_eq!(
        h.tick(5_000),
        vec![Ev::Trouble("timeout"), Ev::Send(OpId(2), Request::Inspect)]
    );
    let ours = held(holder(me(), 2, "v1", Some(ms(7_000))));
    let out = h.reply(5_500, OpId(2), Reply::Inspect(Ok(ours)));
    // valid_until = acquire sent at 2 000 + 8 000, not the read-back's 5 000 or 5 500; and the
    // first renewal, due renew_every after that send, is overdue: it goes out at once.
    assert_eq!(
        out,
        vec![
            Ev::LeaderChanged(Some((me(), Term(2)))),
            Ev::Elected {
                grant: grant(2, "v1"),
                valid_until: ms(10_000)
            },
            Ev::Send(OpId(3), Request::Renew(grant(2, "v1"))),
        ]
    );
    assert!(h.believes(9_999));
    assert!(!h.believes(10_000));
}

/// A candidate that has seen nothing cannot tell a grant its acquire just made from an old one
/// of its own (a crashed earlier run with the same id, a campaign before a store outage): it
/// adopts neither, and its next acquire gets a new term.
#[test]
fn acquire_read_back_before_anything_was_seen_is_not_adopted() {
    let mut h = Harness::follower();
    let _ = h.send_at(0);
    assert_eq!(
        h.tick(3_000),
        vec![Ev::Trouble("timeout"), Ev::Send(OpId(1), Request::Inspect)]
    );
    let ours = held(holder(me(), 1, "v1", Some(ms(7_000))));
    let out = h.reply(3_500, OpId(1), Reply::Inspect(Ok(ours)));
    assert!(!out.iter().any(|e| matches!(e, Ev::Elected { .. })), "{out:?}");
    assert!(!h.believes(3_500));
    assert_eq!(sends(&h.tick(5_500)), vec![&acquire(None)]);
}

/// Two acquires with unknown outcomes: either may be the one applied, so a grant found by reading
/// back is believed from the older one's send time.
#[test]
fn acquire_read_back_counts_from_the_oldest_unknown_acquire() {
    let mut h = Harness::follower();
    let op = h.send_at(0);
    let _ = h.reply(
        0,
        op,
        Reply::Acquire(Ok(Acquired::Held(held(holder(other(), 1, "v0", None))))),
    );
    let _ = h.tick(2_000); // acquire sent at 2 000
    let _ = h.tick(5_000); // times out: read back
    let still_other = held(holder(other(), 1, "v0", None));
    let _ = h.reply(5_100, OpId(2), Reply::Inspect(Ok(still_other)));
    assert_eq!(sends(&h.tick(7_100)), vec![&acquire(None)]); // acquire sent at 7 100
    let _ = h.tick(10_100); // times out too
    let ours = held(holder(me(), 2, "v1", None));
    let out = h.reply(10_200, OpId(4), Reply::Inspect(Ok(ours)));
    // From 2 000 (the older unknown acquire): 2 000 + 8 000 = 10 000 has passed: not usable,
    // released at once.
    assert!(!out.iter().any(|e| matches!(e, Ev::Elected { .. })), "{out:?}");
    assert!(sends(&out).iter().any(|r| matches!(r, Request::Release(_))), "{out:?}");
}

#[test]
fn acquire_read_back_with_an_old_term_is_not_adopted() {
    // Term 5 was ours and ended (resigned): the floor is now 5.
    let mut h = Harness::follower();
    let op = h.send_at(0);
    let _ = h.reply(0, op, Reply::Acquire(Ok(Acquired::Granted(grant(5, "v5")))));
    let _ = h.step(1_000, Input::Resign);
    let _ = h.reply(1_000, OpId(1), Reply::Release(Ok(())));
    let t = 1_000 + BACKOFF;
    let _ = h.send_at(t);
    assert_eq!(
        h.tick(t + 3_000),
        vec![Ev::Trouble("timeout"), Ev::Send(OpId(3), Request::Inspect)]
    );
    // The read-back shows us, but at the old term 5: that is not the grant we asked for.
    let stale = held(holder(me(), 5, "v5", Some(ms(3_000))));
    let out = h.reply(t + 3_100, OpId(3), Reply::Inspect(Ok(stale)));
    assert!(!out.iter().any(|e| matches!(e, Ev::Elected { .. })), "{out:?}");
    assert!(!h.believes(t + 3_100));
    assert_eq!(h.m.term(), None);
    // It keeps campaigning, every retry_every.
    assert_eq!(h.wake(), Some(t + 5_100));
    assert_eq!(sends(&h.tick(t + 5_100)), vec![&acquire(None)]);
}

/// Finding 1 of the safety review, inside one machine: an acquire whose outcome was unknown in an
/// earlier follower phase (here: before this candidate led and resigned) may still be applied by
/// the store. A later read-back that finds it must believe it from that old send time, not from
/// the send time of the current phase's unknown acquire. Before the fix the step-down started a
/// new phase that forgot it, and the stale grant was believed for a fresh TTL.
#[test]
fn read_back_after_a_step_down_counts_from_an_unknown_acquire_of_the_earlier_phase() {
    let mut h = Harness::follower();
    let op = h.send_at(0); // R1: stuck in the network
    assert_eq!(
        h.tick(3_000),
        vec![Ev::Trouble("timeout"), Ev::Send(OpId(1), Request::Inspect)]
    );
    let _ = h.reply(3_000, OpId(1), Reply::Inspect(Ok(free(0, EndReason::Released))));
    assert_ne!(op, OpId(2));
    let op = h.send_at(5_000);
    let _ = h.reply(5_000, op, Reply::Acquire(Ok(Acquired::Granted(grant(1, "v1")))));
    let _ = h.step(6_000, Input::Resign);
    let _ = h.reply(6_000, OpId(3), Reply::Release(Ok(())));
    // Someone else leads term 2, then releases; R1 is applied: we hold term 3 in the store.
    let t = 6_000 + BACKOFF;
    let op = h.send_at(t);
    let _ = h.reply(
        t,
        op,
        Reply::Acquire(Ok(Acquired::Held(held(holder(other(), 2, "v2", None))))),
    );
    let op = h.send_at(t + 2_000);
    // This poll fails at once (connection refused, not applied); the read-back finds term 3.
    let out = h.reply(t + 2_000, op, Reply::Acquire(Err(unreachable())));
    assert_eq!(sends(&out), vec![&Request::Inspect]);
    let ours = held(holder(me(), 3, "v3", Some(ms(9_000))));
    let out = h.reply(t + 2_000, h.m.pending().unwrap(), Reply::Inspect(Ok(ours)));
    // Believed from R1's send time (0): long over. Not elected; the stale grant is released.
    assert!(!out.iter().any(|e| matches!(e, Ev::Elected { .. })), "{out:?}");
    assert!(!h.believes(t + 2_000));
    assert!(
        sends(&out)
            .iter()
            .any(|r| matches!(r, Request::Release(g) if g.term == Term(3))),
        "{out:?}"
    );
}

/// Finding 1, second variant: a renewal answered `Lost` shows this very candidate at a newer term
/// (an old acquire applied while it led). That term must become the floor: a later read-back
/// that finds it is not adopted. Before the fix the floor after the step-down was the old term.
#[test]
fn lost_renewal_showing_us_at_a_newer_term_raises_the_term_floor() {
    let mut h = Harness::leader();
    let op = h.send_at(3_000);
    let ours_newer = held(holder(me(), 2, "v2", Some(ms(9_000))));
    let out = h.reply(3_000, op, Reply::Renew(Ok(Renewed::Lost(ours_newer.clone()))));
    assert!(out.iter().any(|e| matches!(e, Ev::Deposed { .. })), "{out:?}");
    // Term 2 is released (see the next test), but say the release is lost and an old acquire
    // of ours makes it stand again: a read-back must still not adopt it.
    let out = h.step(3_000, Input::WorkStopped);
    let _ = h.reply(3_000, sent_op(&out), Reply::Release(Err(unreachable())));
    // The release is sent again after a retry delay (see `stopping.rs`) and answered.
    let resent = h.send_at(5_000);
    let _ = h.reply(5_000, resent, Reply::Release(Ok(())));
    let t = 3_000 + BACKOFF;
    let op = h.send_at(t);
    let out = h.reply(t, op, Reply::Acquire(Err(unreachable())));
    assert_eq!(sends(&out), vec![&Request::Inspect]);
    let out = h.reply(t, h.m.pending().unwrap(), Reply::Inspect(Ok(ours_newer)));
    assert!(!out.iter().any(|e| matches!(e, Ev::Elected { .. })), "{out:?}");
    assert!(!h.believes(t));
}

/// The same case from the lease's side: the renewal answered `Lost` shows this candidate itself
/// holding a newer term (an acquire of ours applied late; SQLite and the memory store give a
/// candidate's acquire a new term over its own record). Nobody believes that term, and nobody
/// else may take the lease while it stands: it is released (conditionally on its term) before
/// the step-down completes, not left to expire.
#[test]
fn lost_renewal_showing_us_at_a_newer_term_releases_that_term() {
    let mut h = Harness::leader();
    let op = h.send_at(3_000);
    let ours_newer = held(holder(me(), 2, "v2", Some(ms(9_000))));
    let out = h.reply(3_000, op, Reply::Renew(Ok(Renewed::Lost(ours_newer))));
    assert_eq!(
        out,
        vec![
            Ev::Deposed {
                term: Term(1),
                reason: superseded(me(), 2),
                believed_until: ms(3_000)
            },
            Ev::LeaderChanged(Some((me(), Term(2)))),
        ]
    );
    assert_eq!(
        h.step(3_100, Input::WorkStopped),
        vec![Ev::Send(OpId(2), Request::Release(grant(2, "v2")))]
    );
    assert_eq!(
        h.reply(3_150, OpId(2), Reply::Release(Ok(()))),
        vec![Ev::SteppedDown {
            term: Term(1),
            work_stopped_after: Some(ms(100)),
            aborted: false
        }]
    );
    assert!(!h.believes(3_150));
    assert_eq!(h.wake(), Some(3_150 + BACKOFF));
}

/// Finding 1 across campaigns: every campaign of an `Elector` runs a new machine. It continues
/// from the earlier one ([`Machine::continue_from`]), so an acquire of the earlier campaign whose
/// outcome is unknown still bounds what a read-back may believe.
#[test]
fn a_new_campaign_continues_from_the_unknown_acquires_of_the_earlier_one() {
    let mut first = Harness::follower();
    let op = first.send_at(0);
    let _ = first.reply(0, op, Reply::Acquire(Err(unreachable()))); // R1: outcome unknown
    let mut h = Harness::follower();
    h.base = first.base;
    h.m = Machine::new(
        timing(),
        Expiry::ServerClock,
        Notifications::None,
        lease(),
        me(),
        h.at(6_000),
        7,
    )
    .unwrap();
    h.m.continue_from(&first.m);
    let op = h.send_at(6_000);
    let _ = h.reply(
        6_000,
        op,
        Reply::Acquire(Ok(Acquired::Held(held(holder(other(), 2, "v2", None))))),
    );
    let op = h.send_at(8_000);
    let _ = h.reply(8_000, op, Reply::Acquire(Err(unreachable())));
    let ours = held(holder(me(), 3, "v3", Some(ms(9_000))));
    let out = h.reply(8_000, h.m.pending().unwrap(), Reply::Inspect(Ok(ours)));
    assert!(!out.iter().any(|e| matches!(e, Ev::Elected { .. })), "{out:?}");
    assert!(!h.believes(8_000));
}

/// Late replies other than a grant (see `a_grant_that_comes_back_late_...`) change nothing.
#[test]
fn stale_reply_is_ignored() {
    let mut h = Harness::follower();
    let acquire_op = h.send_at(0);
    assert_eq!(
        h.tick(3_000),
        vec![Ev::Trouble("timeout"), Ev::Send(OpId(1), Request::Inspect)]
    );
    // The abandoned acquire's answer arrives after all: it is not the pending request.
    let held_by_other = held(holder(other(), 1, "v1", None));
    let out = h.reply(3_100, acquire_op, Reply::Acquire(Ok(Acquired::Held(held_by_other))));
    assert_eq!(out, vec![]);
    assert_eq!(h.m.pending(), Some(OpId(1)));
    assert!(!h.believes(3_100));
    // A reply to an id never sent is ignored too.
    assert_eq!(h.reply(3_200, OpId(99), Reply::Inspect(Err(unreachable()))), vec![]);
    assert_eq!(h.m.pending(), Some(OpId(1)));
}
