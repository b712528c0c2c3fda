//! Hand-over, announced renewals, and how a deposition reads.

use super::*;

/// A leader asked to hand over steps down (its work is cancelled), and once the work has stopped
/// hands the lease to the named successor instead of releasing it.
#[test]
fn hand_over_steps_down_and_hands_the_lease_over_once_the_work_stopped() {
    let mut h = Harness::leader();
    let out = h.step(
        1_000,
        Input::HandOver {
            to: other(),
            work_stopped: false,
        },
    );
    assert!(
        out.iter().any(|e| matches!(
            e,
            Ev::Deposed { reason: DeposedReason::HandedOver { to }, .. } if *to == other()
        )),
        "{out:?}"
    );
    assert!(
        sends(&out).is_empty(),
        "nothing is handed over while the work runs: {out:?}"
    );
    let out = h.step(1_200, Input::WorkStopped);
    assert_eq!(
        sends(&out),
        vec![&Request::HandOver(grant(1, "v1"), other())],
        "{out:?}"
    );
}

#[test]
fn announced_renewals_are_sightings_and_replace_polls() {
    let mut h = Harness::new(timing(), Expiry::ObservedByContenders, Notifications::Release);
    let op = sent_op(&h.step(0, Input::RenewalsAnnounced(true)));
    let _ = h.reply(
        0,
        op,
        Reply::Acquire(Ok(Acquired::Held(held(holder(other(), 2, "v1", None))))),
    );
    // No polls for new versions: the next attempt is when v1 is a TTL old.
    assert_eq!(h.wake(), Some(10_000));
    // Each announced renewal is a sighting, as a read at that moment would be.
    assert_eq!(
        h.step(3_000, Input::Announced(held(holder(other(), 2, "v2", None)))),
        vec![]
    );
    assert_eq!(h.wake(), Some(13_000));
    // The same version again changes nothing; an older term is not a sighting.
    assert_eq!(
        h.step(4_000, Input::Announced(held(holder(other(), 2, "v2", None)))),
        vec![]
    );
    assert_eq!(
        h.step(4_500, Input::Announced(held(holder(other(), 1, "v0", None)))),
        vec![]
    );
    assert_eq!(h.wake(), Some(13_000));
    assert_eq!(h.tick(12_999), vec![]);
    let out = h.tick(13_000);
    assert_eq!(sends(&out), vec![&acquire(Some("v2"))]);
}

#[test]
fn announcements_that_start_after_the_first_answer_replace_its_poll() {
    // The stream comes up beside the campaign, often after the first acquire's answer: the poll
    // that answer armed would be a second acquire of every follower, for nothing.
    let mut h = Harness::new(timing(), Expiry::ObservedByContenders, Notifications::Release);
    let op = sent_op(&h.step(0, Input::Tick));
    let _ = h.reply(
        0,
        op,
        Reply::Acquire(Ok(Acquired::Held(held(holder(other(), 2, "v1", None))))),
    );
    assert_eq!(h.wake(), Some(2_000));
    assert_eq!(h.step(500, Input::RenewalsAnnounced(true)), vec![]);
    // v1 was first seen at 0: the next attempt is when it is a TTL old, not the poll.
    assert_eq!(h.wake(), Some(10_000));
    assert_eq!(h.tick(2_000), vec![]);
}

#[test]
fn a_follower_polls_again_when_announcements_stop() {
    let mut h = Harness::new(timing(), Expiry::ObservedByContenders, Notifications::Release);
    let op = sent_op(&h.step(0, Input::RenewalsAnnounced(true)));
    let _ = h.reply(
        0,
        op,
        Reply::Acquire(Ok(Acquired::Held(held(holder(other(), 2, "v1", None))))),
    );
    assert_eq!(h.wake(), Some(10_000));
    assert_eq!(h.step(1_000, Input::RenewalsAnnounced(false)), vec![]);
    assert_eq!(h.wake(), Some(3_000));
    // Announcements no longer count as sightings.
    assert_eq!(
        h.step(1_500, Input::Announced(held(holder(other(), 2, "v2", None)))),
        vec![]
    );
    assert_eq!(h.wake(), Some(3_000));
}

#[test]
fn an_announcement_during_a_request_is_not_a_sighting() {
    let mut h = Harness::new(timing(), Expiry::ObservedByContenders, Notifications::Release);
    let _ = sent_op(&h.step(0, Input::RenewalsAnnounced(true)));
    let third = CandidateId::new("third").unwrap();
    // The reply will show what the store holds; the announcement only names the new leader.
    assert_eq!(
        h.step(100, Input::Announced(held(holder(third.clone(), 3, "v3", None)))),
        vec![Ev::LeaderChanged(Some((third, Term(3))))]
    );
}

#[test]
fn a_session_store_follower_with_announced_renewals_waits_a_ttl_not_a_poll() {
    let mut h = Harness::new(timing(), Expiry::ServerSession, Notifications::Release);
    let op = sent_op(&h.step(0, Input::RenewalsAnnounced(true)));
    let _ = h.reply(
        0,
        op,
        Reply::Acquire(Ok(Acquired::Held(held(holder(other(), 2, "v1", None))))),
    );
    assert_eq!(h.wake(), Some(10_000));
    let _ = h.step(3_000, Input::Announced(held(holder(other(), 2, "v2", None))));
    assert_eq!(h.wake(), Some(13_000));
    // The session's end is notified: at once.
    assert_eq!(sends(&h.step(5_000, Input::Notified)), vec![&acquire(None)]);
}

#[test]
fn too_little_time_reads_rounded_durations() {
    let reason = DeposedReason::TooLittleTime {
        remaining: Duration::from_micros(667_920),
        required: ms(1_000),
    };
    assert_eq!(
        reason.to_string(),
        "only 668ms of the lease was left and the work needed 1s (renewals were late)"
    );
}
