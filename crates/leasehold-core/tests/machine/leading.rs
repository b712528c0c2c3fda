//! Leading: renewals, read-backs, depositions, lock delays on a leader, stalls and heartbeats.

use super::*;

#[test]
fn leader_renews_at_send_time_plus_renew_every() {
    let mut h = Harness::follower();
    let op = h.send_at(0);
    let _ = h.reply(2_000, op, Reply::Acquire(Ok(Acquired::Granted(grant(1, "v1")))));
    assert_eq!(h.wake(), Some(3_000));
    assert_eq!(h.tick(2_999), vec![]);
    assert_eq!(h.tick(3_000), vec![Ev::Send(OpId(1), Request::Renew(grant(1, "v1")))]);
    // While the renewal is out, the machine wakes for its timeout or the step-down, whichever first.
    assert_eq!(h.wake(), Some(6_000));
}

#[test]
fn renewed_extends_valid_until_from_the_renew_send_time() {
    let mut h = Harness::leader();
    let op = h.send_at(3_000);
    // Reply 1.5 s late: the new deadline is 3 000 + 8 000, not 4 500 + 8 000.
    let out = h.reply(4_500, op, Reply::Renew(Ok(Renewed::Renewed(grant(1, "v2")))));
    assert_eq!(out, vec![Ev::Extended(ms(11_000))]);
    assert!(h.believes(10_999));
    assert!(!h.believes(11_000));
    // Next renewal renew_every after the last one was sent, with the renewed grant's token.
    assert_eq!(h.wake(), Some(6_000));
    assert_eq!(h.tick(6_000), vec![Ev::Send(OpId(2), Request::Renew(grant(1, "v2")))]);
}

#[test]
fn lost_renewal_deposes_superseded_with_the_new_holder_and_no_release() {
    let mut h = Harness::leader();
    let op = h.send_at(3_000);
    let obs = held(holder(other(), 2, "w1", Some(ms(10_000))));
    let out = h.reply(3_200, op, Reply::Renew(Ok(Renewed::Lost(obs))));
    let deposed = Ev::Deposed {
        term: Term(1),
        reason: superseded(other(), 2),
        believed_until: ms(3_200),
    };
    assert_eq!(out.first(), Some(&deposed), "{out:?}");
    assert!(sends(&out).is_empty(), "no release after losing the lease: {out:?}");
    assert!(!h.believes(3_200));
    // Stepping down: the work gets until valid_until to stop.
    assert_eq!(h.m.term(), Some(Term(1)));
    assert_eq!(h.wake(), Some(8_000));
    let out = h.step(3_300, Input::WorkStopped);
    assert_eq!(
        out,
        vec![Ev::SteppedDown {
            term: Term(1),
            work_stopped_after: Some(ms(100)),
            aborted: false
        }]
    );
    // A follower again, backing off by retry_every.
    assert_eq!(h.m.term(), None);
    assert_eq!(h.wake(), Some(3_300 + BACKOFF));
    assert_eq!(sends(&h.tick(3_300 + BACKOFF)), vec![&acquire(None)]);
}

/// The store has just proved who leads now, yet observers are told that nobody does.
#[test]
fn superseded_leader_reports_the_new_holder() {
    let mut h = Harness::leader();
    let op = h.send_at(3_000);
    let obs = held(holder(other(), 2, "w1", Some(ms(10_000))));
    let out = h.reply(3_200, op, Reply::Renew(Ok(Renewed::Lost(obs))));
    let changes: Vec<_> = out.iter().filter(|e| matches!(e, Ev::LeaderChanged(_))).collect();
    assert_eq!(changes, vec![&Ev::LeaderChanged(Some((other(), Term(2))))], "{out:?}");
}

#[test]
fn transient_renew_error_reads_the_record_back() {
    let mut h = Harness::leader();
    let op = h.send_at(3_000);
    let out = h.reply(3_100, op, Reply::Renew(Err(unreachable())));
    assert_eq!(
        out,
        vec![Ev::Trouble("unreachable"), Ev::Send(OpId(2), Request::Inspect)]
    );
    assert!(h.believes(3_100), "an unknown outcome does not depose");
}

#[test]
fn renew_timeout_reads_the_record_back() {
    let mut h = Harness::leader();
    let _ = h.send_at(3_000);
    assert_eq!(h.wake(), Some(6_000));
    assert_eq!(h.tick(5_999), vec![]);
    assert_eq!(
        h.tick(6_000),
        vec![Ev::Trouble("timeout"), Ev::Send(OpId(2), Request::Inspect)]
    );
    assert!(h.believes(6_000));
}

#[test]
fn read_back_showing_us_keeps_the_deadline_and_retries_soon() {
    let mut h = Harness::leader();
    let op = h.send_at(3_000);
    let _ = h.reply(3_100, op, Reply::Renew(Err(unreachable())));
    let ours = held(holder(me(), 1, "v2", Some(ms(9_900))));
    // Still ours, but the renewal is not confirmed: no Extended, the deadline stays at 8 000.
    assert_eq!(h.reply(3_200, OpId(2), Reply::Inspect(Ok(ours))), vec![]);
    assert!(h.believes(7_999));
    assert!(!h.believes(8_000));
    // Renew again with the version read back: not after retry_every (5 200), which would be too
    // late for a renewal to be confirmed before the step-down at 7 000 (request_timeout 3 000),
    // but at 4 000, the last moment that still can.
    assert_eq!(h.wake(), Some(4_000));
    assert_eq!(h.tick(3_999), vec![]);
    assert_eq!(h.tick(4_000), vec![Ev::Send(OpId(3), Request::Renew(grant(1, "v2")))]);
    let out = h.reply(4_100, OpId(3), Reply::Renew(Ok(Renewed::Renewed(grant(1, "v3")))));
    assert_eq!(out, vec![Ev::Extended(ms(12_000))]);
}

#[test]
fn read_back_past_the_last_chance_renews_after_the_retry_floor() {
    let mut h = Harness::leader();
    let op = h.send_at(3_000);
    let _ = h.reply(4_400, op, Reply::Renew(Err(unreachable())));
    let ours = held(holder(me(), 1, "v2", Some(ms(9_900))));
    assert_eq!(h.reply(4_500, OpId(2), Reply::Inspect(Ok(ours))), vec![]);
    // Past the last chance (4 000): the next renewal goes out after the floor (retry_every / 4),
    // never at once, so a store that fails at once does not get a storm of retries.
    assert_eq!(h.wake(), Some(5_000));
    assert_eq!(h.tick(5_000), vec![Ev::Send(OpId(3), Request::Renew(grant(1, "v2")))]);
    assert!(h.believes(6_999), "the deadline is still the last confirmed renewal's");
}

/// Finding 7 of the safety review: past the last chance, a renewal that fails at once was
/// retried with no pause (thousands of requests in under two seconds). Every retry now waits at
/// least the floor: from the first failure to the step-down point the leader sends a bounded
/// number of requests.
#[test]
fn renewals_refused_at_once_are_bounded_until_the_step_down() {
    let mut h = Harness::leader();
    let mut requests = 0;
    let mut t = 3_000;
    while t < 8_000 {
        let mut out = h.tick(t);
        while let Some(op) = h.m.pending() {
            requests += 1;
            let reply = match sends(&out).last() {
                Some(Request::Renew(_)) => Reply::Renew(Err(unreachable())),
                _ => Reply::Inspect(Err(unreachable())),
            };
            out = h.reply(t, op, reply);
            assert!(requests <= 1_000, "a storm: {requests} requests at {t} ms");
        }
        if out.iter().any(|e| matches!(e, Ev::Deposed { .. })) {
            break;
        }
        t += 1;
    }
    assert!(!h.believes(7_000));
    // 3 000..7 000 with a floor of 500 ms: at most 9 renewals, each with one read-back.
    assert!(requests <= 18, "{requests} requests before stepping down");
    assert!(requests >= 4, "{requests}: the leader must keep trying");
}

#[test]
fn read_back_showing_another_holder_deposes_superseded() {
    let mut h = Harness::leader();
    let op = h.send_at(3_000);
    let _ = h.reply(3_100, op, Reply::Renew(Err(unreachable())));
    let theirs = held(holder(other(), 2, "w1", Some(ms(9_900))));
    let out = h.reply(3_200, OpId(2), Reply::Inspect(Ok(theirs)));
    let deposed = Ev::Deposed {
        term: Term(1),
        reason: superseded(other(), 2),
        believed_until: ms(3_200),
    };
    assert_eq!(out.first(), Some(&deposed), "{out:?}");
    assert!(sends(&out).is_empty());
    assert!(!h.believes(3_200));
}

#[test]
fn unconfirmed_renewal_deposes_at_the_margin_then_aborts_at_valid_until() {
    let mut h = Harness::leader();
    let renew = h.send_at(3_000);
    // The renewal times out at 6 000; the read-back goes unanswered too.
    let out = h.tick(6_000);
    assert_eq!(out, vec![Ev::Trouble("timeout"), Ev::Send(OpId(2), Request::Inspect)]);
    assert_eq!(h.wake(), Some(7_000));
    assert_eq!(h.tick(6_999), vec![]);
    let out = h.tick(7_000);
    match out.as_slice() {
        [
            Ev::Deposed {
                term: Term(1),
                reason: DeposedReason::RenewFailed { last_error: Some(e) },
                believed_until,
            },
            Ev::LeaderChanged(None),
        ] => {
            assert!(e.contains("did not answer"), "{e}");
            assert_eq!(*believed_until, ms(7_000));
        }
        other => panic!("expected RenewFailed, got {other:?}"),
    }
    assert!(!h.believes(7_000));
    assert_eq!(h.m.pending(), None, "the read-back is abandoned");
    // Late replies to abandoned requests change nothing.
    assert_eq!(
        h.reply(7_100, renew, Reply::Renew(Ok(Renewed::Renewed(grant(1, "v2"))))),
        vec![]
    );
    assert_eq!(h.reply(7_100, OpId(2), Reply::Inspect(Err(unreachable()))), vec![]);
    // The work did not stop by valid_until: abort it.
    assert_eq!(h.wake(), Some(8_000));
    assert_eq!(h.tick(7_999), vec![]);
    assert_eq!(
        h.tick(8_000),
        vec![
            Ev::AbortWork,
            Ev::SteppedDown {
                term: Term(1),
                work_stopped_after: None,
                aborted: true
            }
        ]
    );
    assert_eq!(h.wake(), Some(8_000 + BACKOFF));
    // A WorkStopped after the abort is ignored.
    assert_eq!(h.step(8_100, Input::WorkStopped), vec![]);
}

/// No renewal confirmed by the step-down point does not prove the lease lost: the renewal may
/// have been applied (only its reply is missing), and the grant itself stays in the store until it
/// expires (on stores without a clock, a TTL after a contender first saw its last version). Once
/// the work has stopped, the lease is released, conditionally on its term: harmless if the store
/// has moved on, and the next candidate takes over at once instead of a TTL later.
#[test]
fn work_stopped_before_valid_until_releases_then_steps_down_with_its_duration() {
    let mut h = Harness::leader();
    let _ = h.send_at(3_000);
    let _ = h.tick(6_000);
    assert_eq!(h.tick(7_000).len(), 2);
    let out = h.step(7_400, Input::WorkStopped);
    assert_eq!(out, vec![Ev::Send(OpId(3), Request::Release(grant(1, "v1")))]);
    assert_eq!(
        h.reply(7_450, OpId(3), Reply::Release(Ok(()))),
        vec![Ev::SteppedDown {
            term: Term(1),
            work_stopped_after: Some(ms(400)),
            aborted: false
        }]
    );
    assert_eq!(h.wake(), Some(7_450 + BACKOFF));
}

/// With a `lock_delay`, a leader deposed because no renewal was confirmed sends no release: the
/// store would record a clean end and the next candidate would skip the delay, which exists for
/// exactly this holder (cut off from the store, its side effects may still be in flight).
#[test]
fn with_a_lock_delay_an_unconfirmed_renewal_leaves_the_lease_to_expire() {
    let mut h = lock_delay_leader_renewing();
    let _ = h.tick(6_000);
    assert_eq!(h.tick(7_000).len(), 2);
    assert_left_to_expire(&mut h);
}

/// A leader (term 1, elected at 0 ms) with a 5 s lock delay whose renewal, sent at 3 000 ms, is
/// never answered.
fn lock_delay_leader_renewing() -> Harness {
    let t = Timing {
        lock_delay: Some(ms(5_000)),
        ..timing()
    };
    let mut h = Harness::new(t, Expiry::ServerClock, Notifications::None);
    let op = h.send_at(0);
    let out = h.reply(0, op, Reply::Inspect(Ok(free(0, EndReason::Released))));
    assert_eq!(out, vec![Ev::Send(OpId(1), acquire(None))]);
    let out = h.reply(0, OpId(1), Reply::Acquire(Ok(Acquired::Granted(grant(1, "v1")))));
    assert!(out.iter().any(|e| matches!(e, Ev::Elected { .. })), "{out:?}");
    let _ = h.send_at(3_000);
    h
}

/// Once its work stops (at 7 400 ms) the stepped-down leader sends nothing: no release.
fn assert_left_to_expire(h: &mut Harness) {
    let out = h.step(7_400, Input::WorkStopped);
    assert!(sends(&out).is_empty(), "no release: {out:?}");
    assert!(
        out.iter().any(|e| matches!(
            e,
            Ev::SteppedDown {
                term: Term(1),
                aborted: false,
                ..
            }
        )),
        "{out:?}"
    );
}

/// The same step-down noticed first by the work's handle (`is_cancelled()` past the step-down
/// point sends `Input::StepDown(RenewFailed)` before the driver's timer fires): with a lock delay
/// it too leaves the lease to expire (session 11 review; the simulation's `delay-skipped`).
#[test]
fn with_a_lock_delay_a_step_down_noticed_by_the_handle_leaves_the_lease_to_expire() {
    let mut h = lock_delay_leader_renewing();
    let out = h.step(7_000, Input::StepDown(DeposedReason::RenewFailed { last_error: None }));
    assert!(sends(&out).is_empty(), "{out:?}");
    assert_left_to_expire(&mut h);
}

/// The SQLite observation (100-candidate transitions, release build): a new leader stepped down
/// 45 ms after a renewal, sent no release, and the lease stayed held until it expired. Its
/// acquire had failed ambiguously and a read-back showed the grant, so the grant is believed
/// from the send time of the *oldest* acquire whose outcome was unknown (an earlier one): little
/// of the belief is left at the election. The first renewal goes out at once, is not answered by
/// the step-down point, and the leader is deposed. It resigns; the lease, still its own in the
/// store, must be released then, not left to expire.
#[test]
fn a_read_back_grant_whose_first_renewal_is_not_confirmed_in_time_is_released_on_resign() {
    let mut h = Harness::follower();
    let op = h.send_at(0);
    let _ = h.reply(
        0,
        op,
        Reply::Acquire(Ok(Acquired::Held(held(holder(other(), 1, "v0", None))))),
    );
    // An acquire sent at 2 000 times out; its read-back still shows the other holder.
    assert_eq!(sends(&h.tick(2_000)), vec![&acquire(None)]);
    assert_eq!(
        h.tick(5_000),
        vec![Ev::Trouble("timeout"), Ev::Send(OpId(2), Request::Inspect)]
    );
    let _ = h.reply(5_000, OpId(2), Reply::Inspect(Ok(held(holder(other(), 1, "v0", None)))));
    // The next one fails ambiguously at 7 000; the read-back shows us at term 2.
    assert_eq!(sends(&h.tick(7_000)), vec![&acquire(None)]);
    let out = h.reply(7_000, OpId(3), Reply::Acquire(Err(unreachable())));
    assert_eq!(
        out,
        vec![Ev::Trouble("unreachable"), Ev::Send(OpId(4), Request::Inspect)]
    );
    let ours = held(holder(me(), 2, "v1", None));
    let out = h.reply(7_000, OpId(4), Reply::Inspect(Ok(ours)));
    // Believed from 2 000 (either acquire may be the one applied): until 10 000, step-down at
    // 9 000. The first renewal is overdue and goes out at once.
    assert_eq!(
        out,
        vec![
            Ev::LeaderChanged(Some((me(), Term(2)))),
            Ev::Elected {
                grant: grant(2, "v1"),
                valid_until: ms(10_000)
            },
            Ev::Send(OpId(5), Request::Renew(grant(2, "v1"))),
        ]
    );
    // The store is slow: no answer by the step-down point.
    assert_eq!(h.wake(), Some(9_000));
    let out = h.tick(9_000);
    assert!(
        matches!(
            out.first(),
            Some(Ev::Deposed {
                term: Term(2),
                reason: DeposedReason::RenewFailed { .. },
                ..
            })
        ),
        "{out:?}"
    );
    assert!(
        sends(&out).is_empty(),
        "nothing is released while the work may run: {out:?}"
    );
    // The work stops (resigns) 45 ms later: the lease is released.
    assert_eq!(
        h.step(9_045, Input::Resign),
        vec![Ev::Send(OpId(6), Request::Release(grant(2, "v1")))]
    );
    assert_eq!(
        h.reply(9_060, OpId(6), Reply::Release(Ok(()))),
        vec![Ev::SteppedDown {
            term: Term(2),
            work_stopped_after: Some(ms(45)),
            aborted: false
        }]
    );
}

/// A resign (the work has stopped) that the machine sees only after `valid_until`, the driver not
/// having been scheduled at the step-down point: it still releases. The release names the term,
/// so it cannot free a successor's grant; without it the lease stays held until it expires.
#[test]
fn a_resign_seen_after_valid_until_still_releases() {
    let mut h = Harness::leader();
    let out = h.step(8_100, Input::Resign);
    assert_eq!(
        out,
        vec![
            Ev::Deposed {
                term: Term(1),
                reason: DeposedReason::Resigned,
                believed_until: ms(8_000)
            },
            Ev::LeaderChanged(None),
            Ev::Send(OpId(1), Request::Release(grant(1, "v1"))),
        ]
    );
    assert!(!h.believes(8_100));
    assert_eq!(
        h.reply(8_150, OpId(1), Reply::Release(Ok(()))),
        vec![Ev::SteppedDown {
            term: Term(1),
            work_stopped_after: Some(Duration::ZERO),
            aborted: false
        }]
    );
}

#[test]
fn definite_renew_error_deposes_with_store_error() {
    let mut h = Harness::leader();
    let op = h.send_at(3_000);
    let out = h.reply(
        3_100,
        op,
        Reply::Renew(Err(Error::corrupt("memory", "jobs", "garbage"))),
    );
    match out.as_slice() {
        [
            Ev::Trouble("corrupt"),
            Ev::Deposed {
                term: Term(1),
                reason: DeposedReason::StoreError { error },
                believed_until,
            },
            Ev::LeaderChanged(None),
        ] => {
            assert!(error.contains("garbage"), "{error}");
            assert_eq!(*believed_until, ms(3_100));
        }
        other => panic!("expected StoreError, got {other:?}"),
    }
    assert!(!h.believes(3_100));
    // No release: the record cannot be read, so nothing is written to it.
    assert_eq!(h.step(3_200, Input::WorkStopped).len(), 1);
}

#[test]
fn stalled_work_is_deposed_and_the_lease_released_once_it_stops() {
    let t = Timing {
        stall_timeout: Some(ms(4_000)),
        ..timing()
    };
    let mut h = Harness::leader_with(t);
    assert_eq!(h.wake(), Some(3_000));
    let op = h.send_at(3_000);
    assert_eq!(
        h.reply(3_000, op, Reply::Renew(Ok(Renewed::Renewed(grant(1, "v2"))))),
        vec![Ev::Extended(ms(11_000))]
    );
    // No heartbeat since the election at 0: stalled at 4 000, before the next renewal at 6 000.
    assert_eq!(h.wake(), Some(4_000));
    assert_eq!(h.tick(3_999), vec![]);
    let out = h.tick(4_000);
    assert_eq!(
        out,
        vec![
            Ev::Deposed {
                term: Term(1),
                reason: DeposedReason::Stalled,
                believed_until: ms(4_000)
            },
            Ev::LeaderChanged(None),
        ]
    );
    assert!(!h.believes(4_000));
    // The lease is released only once the work has stopped.
    assert_eq!(h.wake(), Some(11_000));
    assert_eq!(
        h.step(4_500, Input::WorkStopped),
        vec![Ev::Send(OpId(2), Request::Release(grant(1, "v2")))]
    );
    assert_eq!(
        h.reply(4_600, OpId(2), Reply::Release(Ok(()))),
        vec![Ev::SteppedDown {
            term: Term(1),
            work_stopped_after: Some(ms(500)),
            aborted: false
        }]
    );
    assert_eq!(h.wake(), Some(4_600 + BACKOFF));
}

#[test]
fn heartbeat_postpones_the_stall() {
    let t = Timing {
        stall_timeout: Some(ms(4_000)),
        ..timing()
    };
    let mut h = Harness::leader_with(t);
    assert_eq!(
        h.step(3_000, Input::Heartbeat(h.at(3_000))),
        vec![Ev::Send(OpId(1), Request::Renew(grant(1, "v1")))]
    );
    let _ = h.reply(3_000, OpId(1), Reply::Renew(Ok(Renewed::Renewed(grant(1, "v2")))));
    // An older heartbeat does not move the stall deadline back.
    assert_eq!(h.step(3_500, Input::Heartbeat(h.at(1_000))), vec![]);
    assert_eq!(h.tick(4_000), vec![], "not stalled: heartbeat at 3 000");
    let op = h.send_at(6_000);
    let _ = h.reply(6_000, op, Reply::Renew(Ok(Renewed::Renewed(grant(1, "v3")))));
    assert_eq!(h.wake(), Some(7_000));
    let out = h.tick(7_000);
    assert!(
        out.contains(&Ev::Deposed {
            term: Term(1),
            reason: DeposedReason::Stalled,
            believed_until: ms(7_000)
        }),
        "{out:?}"
    );
}
