//! Campaigning: first attempts, grants, turns, held leases, expiry observed by contenders,
//! notifications and announcements to a follower.

use super::*;

#[test]
fn first_attempt_is_made_at_creation_time() {
    let mut h = Harness::follower();
    assert_eq!(h.wake(), Some(0));
    assert_eq!(h.m.pending(), None);
    assert!(!h.believes(0));
    assert_eq!(h.tick(0), vec![Ev::Send(OpId(0), acquire(None))]);
    assert_eq!(h.m.pending(), Some(OpId(0)));
    // Nothing to do until the request times out.
    assert_eq!(h.wake(), Some(3_000));
    assert_eq!(h.tick(1_000), vec![]);
}

#[test]
fn granted_elects_until_send_time_plus_believed_ttl() {
    let mut h = Harness::follower();
    let op = h.send_at(0);
    // The reply arrives late, 2 s after the request was sent: the deadline still counts from the send.
    let out = h.reply(2_000, op, Reply::Acquire(Ok(Acquired::Granted(grant(1, "v1")))));
    assert_eq!(TTL.mul_f64(1.0 - 0.2), ms(8_000));
    assert_eq!(
        out,
        vec![
            Ev::LeaderChanged(Some((me(), Term(1)))),
            Ev::Elected {
                grant: grant(1, "v1"),
                valid_until: ms(8_000)
            },
        ]
    );
    assert!(h.believes(2_000));
    assert!(h.believes(7_999));
    assert!(!h.believes(8_000));
    assert_eq!(h.m.term(), Some(Term(1)));
    // The first renewal is due renew_every after the acquire was sent, not after its reply.
    assert_eq!(h.wake(), Some(3_000));
}

#[test]
fn elected_deadline_uses_default_drift_of_one_percent() {
    let t = Timing {
        jitter: PerMille(0),
        ..Timing::new(TTL)
    };
    let mut h = Harness::new(t, Expiry::ServerClock, Notifications::None);
    let op = h.send_at(0);
    let out = h.reply(1_000, op, Reply::Acquire(Ok(Acquired::Granted(grant(1, "v1")))));
    let expected = TTL.mul_f64(1.0 - 0.01);
    assert!(
        out.contains(&Ev::Elected {
            grant: grant(1, "v1"),
            valid_until: expected
        }),
        "{out:?}"
    );
    assert!(expected < TTL);
}

#[test]
fn grant_too_late_to_use_is_released_not_elected() {
    // Just in time: 6 999 + margin 1 000 < 8 000.
    let mut h = Harness::follower();
    let op = h.send_at(0);
    let out = h.reply(6_999, op, Reply::Acquire(Ok(Acquired::Granted(grant(1, "v1")))));
    assert!(
        out.contains(&Ev::Elected {
            grant: grant(1, "v1"),
            valid_until: ms(8_000)
        }),
        "{out:?}"
    );

    // Too late: now + step_down_margin >= valid_until.
    let mut h = Harness::follower();
    let op = h.send_at(0);
    let out = h.reply(7_000, op, Reply::Acquire(Ok(Acquired::Granted(grant(1, "v1")))));
    assert_eq!(
        out,
        vec![
            Ev::Trouble("engine"),
            Ev::Send(OpId(1), Request::Release(grant(1, "v1")))
        ]
    );
    assert!(!h.believes(7_000));
    assert_eq!(h.m.term(), None);
    // Once released, it campaigns again after the retry floor (retry_every / 4), not in a loop.
    assert_eq!(h.reply(7_100, OpId(1), Reply::Release(Ok(()))), vec![]);
    assert_eq!(h.wake(), Some(7_500));
    assert_eq!(h.tick(7_500), vec![Ev::Send(OpId(2), acquire(None))]);
}

/// A follower that was told the lease is held at 0 (its next poll due at 2 000 ms).
fn follower_told_held_at_0() -> Harness {
    let mut h = Harness::follower();
    let op = h.send_at(0);
    let _ = h.reply(
        0,
        op,
        Reply::Acquire(Ok(Acquired::Held(held(holder(other(), 1, "v1", None))))),
    );
    h
}

fn turn(h: &Harness, valid_from: u64) -> Input {
    Input::YourTurn(Turn {
        grant: grant(2, "v2"),
        valid_from: h.at(valid_from),
    })
}

#[test]
fn a_turn_is_believed_from_its_valid_from_and_confirmed_by_a_renewal_at_once() {
    // The etcd successor's case: its predecessor was released, told at 1 800 ms on the strength
    // of a keepalive sent at 1 500 ms.
    let mut h = follower_told_held_at_0();
    let out = h.step(1_800, turn(&h, 1_500));
    assert_eq!(
        out,
        vec![
            Ev::LeaderChanged(Some((me(), Term(2)))),
            // 1 500 + 8 000, not 1 800 + 8 000.
            Ev::Elected {
                grant: grant(2, "v2"),
                valid_until: ms(9_500)
            },
            // The engine's own confirmation, at once.
            Ev::Send(OpId(1), Request::Renew(grant(2, "v2"))),
        ]
    );
    assert!(h.believes(9_499));
    assert!(!h.believes(9_500), "believed past valid_from + ttl * (1 - drift)");
    let out = h.reply(1_810, OpId(1), Reply::Renew(Ok(Renewed::Renewed(grant(2, "v2")))));
    assert_eq!(out, vec![Ev::Extended(ms(9_800))]);
}

#[test]
fn a_turn_valid_from_too_long_ago_is_released_not_elected() {
    // Valid from 7 100 ms before it came: 900 ms left, less than the 1 000 ms margin.
    let mut h = follower_told_held_at_0();
    let out = h.step(7_200, turn(&h, 100));
    assert_eq!(
        out,
        vec![
            Ev::Trouble("engine"),
            Ev::Send(OpId(1), Request::Release(grant(2, "v2")))
        ]
    );
    assert!(!h.believes(7_200));
}

#[test]
fn a_turn_while_a_request_is_under_way_is_a_notification() {
    let mut h = follower_told_held_at_0();
    let op = h.send_at(2_000);
    let out = h.step(2_010, turn(&h, 1_500));
    assert_eq!(out, vec![], "the acquire under way answers first");
    assert!(!h.believes(2_010));
    // Its reply predates the turn: asked again at once.
    let out = h.reply(
        2_020,
        op,
        Reply::Acquire(Ok(Acquired::Held(held(holder(other(), 1, "v1", None))))),
    );
    assert_eq!(sends(&out), vec![&acquire(None)]);
}

#[test]
fn a_stale_turn_is_not_believed() {
    let mut h = Harness::follower();
    let op = h.send_at(0);
    let _ = h.reply(
        0,
        op,
        Reply::Acquire(Ok(Acquired::Held(held(holder(other(), 3, "v3", None))))),
    );
    let out = h.step(100, turn(&h, 50));
    assert!(!out.iter().any(|e| matches!(e, Ev::Elected { .. })), "{out:?}");
    assert!(!h.believes(100));
}

#[test]
fn held_reports_the_leader_and_retries_after_retry_every() {
    let mut h = Harness::follower();
    let op = h.send_at(0);
    let seen = held(holder(other(), 5, "v1", Some(ms(9_000))));
    let out = h.reply(500, op, Reply::Acquire(Ok(Acquired::Held(seen.clone()))));
    assert_eq!(out, vec![Ev::LeaderChanged(Some((other(), Term(5))))]);
    assert!(!h.believes(500));
    assert_eq!(h.wake(), Some(2_500));
    assert_eq!(h.tick(2_499), vec![]);
    let out = h.tick(2_500);
    assert_eq!(out, vec![Ev::Send(OpId(1), acquire(None))]);
    // The same leader again: no new LeaderChanged.
    assert_eq!(
        h.reply(2_600, OpId(1), Reply::Acquire(Ok(Acquired::Held(seen)))),
        vec![]
    );
    assert_eq!(h.wake(), Some(4_600));
}

#[test]
fn observed_expiry_takes_over_after_a_full_ttl_counted_from_the_first_reply() {
    let mut h = Harness::new(timing(), Expiry::ObservedByContenders, Notifications::None);
    let seen = || Reply::Acquire(Ok(Acquired::Held(held(holder(other(), 3, "v1", None)))));
    // Every reply arrives 500 ms after its request. The first one that shows v1 arrives at 1 000,
    // so a takeover is allowed from 11 000 (not from 10 000, a TTL after the first request).
    let op = h.send_at(0);
    assert_eq!(
        h.reply(1_000, op, seen()),
        vec![Ev::LeaderChanged(Some((other(), Term(3))))]
    );
    for (send, expected_wake) in [(3_000, 5_500), (5_500, 8_000), (8_000, 10_500)] {
        assert_eq!(h.wake(), Some(send));
        let out = h.tick(send);
        assert_eq!(sends(&out), vec![&acquire(None)], "at {send}");
        assert_eq!(h.reply(send + 500, sent_op(&out), seen()), vec![]);
        assert_eq!(h.wake(), Some(expected_wake));
    }
    // At 10 500 a TTL has passed since the first *request*, but not since the first reply.
    let out = h.tick(10_500);
    assert_eq!(sends(&out), vec![&acquire(None)]);
    // The reply at 11 000 still shows v1: a full TTL has passed, take over at once, naming v1.
    let out = h.reply(11_000, sent_op(&out), seen());
    assert_eq!(sends(&out), vec![&acquire(Some("v1"))]);
    let out = h.reply(
        11_000,
        sent_op(&out),
        Reply::Acquire(Ok(Acquired::Granted(grant(4, "v9")))),
    );
    assert!(
        out.contains(&Ev::Elected {
            grant: grant(4, "v9"),
            valid_until: ms(19_000)
        }),
        "{out:?}"
    );
}

#[test]
fn observed_expiry_changed_version_restarts_the_count() {
    let mut h = Harness::new(timing(), Expiry::ObservedByContenders, Notifications::None);
    /// Ticks at `t`, answers the acquire at once with `version` held, returns the request.
    fn poll(h: &mut Harness, t: u64, version: &str) -> Request {
        let out = h.tick(t);
        let request = sends(&out)[0].clone();
        let obs = held(holder(other(), 3, version, None));
        let _ = h.reply(t, sent_op(&out), Reply::Acquire(Ok(Acquired::Held(obs))));
        request
    }
    // v1 first seen at 0; the holder renews (v2) at 8 000, just before v1 would have expired.
    for t in [0, 2_000, 4_000, 6_000] {
        assert_eq!(poll(&mut h, t, "v1"), acquire(None), "at {t}");
    }
    assert_eq!(poll(&mut h, 8_000, "v2"), acquire(None));
    // At 10 000, v1's TTL is over but v2 was seen only 2 s ago: no takeover.
    for t in [10_000, 12_000, 14_000, 16_000] {
        assert_eq!(poll(&mut h, t, "v2"), acquire(None), "at {t}");
    }
    assert_eq!(h.wake(), Some(18_000));
    // A full TTL after v2 was first seen: take over, carrying v2.
    assert_eq!(poll(&mut h, 18_000, "v2"), acquire(Some("v2")));
}

#[test]
fn an_orphaned_record_on_a_session_store_is_taken_over_a_ttl_after_its_version_was_first_seen() {
    // A session store (Postgres): a record whose holder's session ended stays until replaced,
    // and the store cannot end it. The version changes with every renewal, so the count starts
    // with the reply that first showed this version, orphaned or not.
    let mut h = Harness::new(timing(), Expiry::ServerSession, Notifications::Release);
    let seen = |version: &str, orphaned| {
        let mut info = holder(other(), 3, version, None);
        info.orphaned = orphaned;
        Reply::Acquire(Ok(Acquired::Held(held(info))))
    };
    // v1 held by a live session from 0 to 12 000: no takeover, however long it is seen.
    let op = h.send_at(0);
    let _ = h.reply(0, op, seen("v1", false));
    for t in [2_000, 4_000, 6_000, 8_000, 10_000, 12_000] {
        assert_eq!(h.wake(), Some(t));
        let out = h.tick(t);
        assert_eq!(sends(&out), vec![&acquire(None)], "at {t}");
        let _ = h.reply(t, sent_op(&out), seen(if t < 6_000 { "v1" } else { "v2" }, false));
    }
    // The reply at 14 500 shows v2 (first seen at 6 000) orphaned: taken over at 16 000, a TTL
    // after 6 000, before the next poll (16 500).
    let out = h.tick(14_000);
    let _ = h.reply(14_500, sent_op(&out), seen("v2", true));
    assert_eq!(h.wake(), Some(16_000));
    let out = h.tick(16_000);
    assert_eq!(sends(&out), vec![&acquire(Some("v2"))]);
}

#[test]
fn release_notifications_wait_for_the_store_deadline() {
    let mut h = Harness::new(timing(), Expiry::ServerClock, Notifications::Release);
    let op = h.send_at(0);
    let obs = held(holder(other(), 2, "v1", Some(ms(7_000))));
    assert_eq!(h.reply(1_000, op, Reply::Acquire(Ok(Acquired::Held(obs)))).len(), 1);
    // The store lets go 7 s after it answered: no polling before then.
    assert_eq!(h.wake(), Some(8_000));
    assert_eq!(h.tick(7_999), vec![]);
    let out = h.tick(8_000);
    assert_eq!(sends(&out), vec![&acquire(None)]);
    // A store deadline sooner than retry_every is not polled faster than retry_every.
    let obs = held(holder(other(), 2, "v2", Some(ms(500))));
    let _ = h.reply(8_000, sent_op(&out), Reply::Acquire(Ok(Acquired::Held(obs))));
    assert_eq!(h.wake(), Some(10_000));
}

#[test]
fn announcements_tell_a_follower_of_newer_holders_and_decide_nothing() {
    let mut h = Harness::new(timing(), Expiry::ServerClock, Notifications::ReleaseAndExpiry);
    let op = h.send_at(0);
    let obs = held(holder(other(), 2, "v1", Some(ms(9_000))));
    let out = h.reply(0, op, Reply::Acquire(Ok(Acquired::Held(obs))));
    assert!(out.contains(&Ev::LeaderChanged(Some((other(), Term(2))))), "{out:?}");
    let wake = h.wake();
    let third = CandidateId::new("third").unwrap();
    // A newer holder: reported, and nothing is sent or rescheduled.
    let announced = held(holder(third.clone(), 3, "v2", Some(ms(10_000))));
    assert_eq!(
        h.step(1_000, Input::Announced(announced)),
        vec![Ev::LeaderChanged(Some((third.clone(), Term(3))))]
    );
    assert_eq!(h.wake(), wake);
    // An older or the same term, or this candidate itself: nothing.
    let older = held(holder(other(), 2, "v1", Some(ms(9_000))));
    assert_eq!(h.step(1_100, Input::Announced(older)), vec![]);
    let same = held(holder(third, 3, "v2", Some(ms(10_000))));
    assert_eq!(h.step(1_200, Input::Announced(same)), vec![]);
    let us = held(holder(me(), 4, "v3", Some(ms(10_000))));
    assert_eq!(h.step(1_300, Input::Announced(us)), vec![]);
    assert_eq!(h.wake(), wake);
}

#[test]
fn announcements_do_not_change_what_a_leader_reports() {
    let mut h = Harness::new(timing(), Expiry::ServerClock, Notifications::ReleaseAndExpiry);
    let op = h.send_at(0);
    let out = h.reply(0, op, Reply::Acquire(Ok(Acquired::Granted(grant(3, "v3")))));
    assert!(out.iter().any(|e| matches!(e, Ev::Elected { .. })), "{out:?}");
    let announced = held(holder(other(), 4, "v4", Some(ms(10_000))));
    assert_eq!(h.step(1_000, Input::Announced(announced)), vec![]);
}

#[test]
fn notified_follower_attempts_at_once() {
    let mut h = Harness::new(timing(), Expiry::ServerClock, Notifications::Release);
    let op = h.send_at(0);
    let obs = held(holder(other(), 2, "v1", Some(ms(9_000))));
    let _ = h.reply(0, op, Reply::Acquire(Ok(Acquired::Held(obs))));
    assert_eq!(h.wake(), Some(9_000));
    assert_eq!(h.step(2_000, Input::Notified), vec![Ev::Send(OpId(1), acquire(None))]);
    let out = h.reply(2_000, OpId(1), Reply::Acquire(Ok(Acquired::Granted(grant(3, "v3")))));
    assert!(
        out.contains(&Ev::Elected {
            grant: grant(3, "v3"),
            valid_until: ms(10_000)
        }),
        "{out:?}"
    );
}

#[test]
fn expiry_notifications_poll_rarely_until_notifications_are_lost() {
    let mut h = Harness::new(timing(), Expiry::ServerClock, Notifications::ReleaseAndExpiry);
    let op = h.send_at(0);
    let obs = || Reply::Acquire(Ok(Acquired::Held(held(holder(other(), 2, "v1", Some(ms(9_000)))))));
    let _ = h.reply(0, op, obs());
    // The store notifies expiry too: only a safety poll, 10 TTLs later.
    assert_eq!(h.wake(), Some(100_000));
    // The notification stream ended: attempt at once, then poll every retry_every.
    let out = h.step(3_000, Input::NotificationsLost);
    assert_eq!(sends(&out), vec![&acquire(None)]);
    let _ = h.reply(3_000, sent_op(&out), obs());
    assert_eq!(h.wake(), Some(5_000));
}

#[test]
fn definite_acquire_error_retries_after_retry_every() {
    let mut h = Harness::follower();
    let op = h.send_at(0);
    let out = h.reply(
        100,
        op,
        Reply::Acquire(Err(Error::corrupt("memory", "jobs", "garbage"))),
    );
    assert_eq!(out, vec![Ev::Trouble("corrupt")]);
    assert_eq!(h.m.pending(), None);
    assert_eq!(h.wake(), Some(2_100));
    assert_eq!(sends(&h.tick(2_100)), vec![&acquire(None)]);
}
