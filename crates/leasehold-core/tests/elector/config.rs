//! Configuration: every invariant of the builder and of `Timing` gives a typed error.

use super::*;

fn config_error(b: ElectorBuilder) -> (&'static str, String) {
    match b.build() {
        Err(e @ Error::InvalidConfig { field, .. }) => (field, e.to_string()),
        other => panic!("expected InvalidConfig, got {other:?}"),
    }
}

#[test]
fn every_builder_invariant_gives_a_config_error_naming_the_field() {
    let store = MemoryStore::new();
    let b = || builder(&store, "a");
    let s = Duration::from_secs;
    let cases: Vec<(&str, ElectorBuilder, &str)> = vec![
        ("renew_every = ttl", b().renew_every(TTL), "renew_every"),
        ("renew_every > ttl", b().renew_every(s(30)), "renew_every"),
        ("renew_every = 0", b().renew_every(Duration::ZERO), "renew_every"),
        ("drift 0.5", b().drift(0.5), "drift"),
        ("drift 0.7", b().drift(0.7), "drift"),
        ("negative drift", b().drift(-0.01), "drift"),
        ("NaN drift", b().drift(f64::NAN), "drift"),
        ("infinite drift", b().drift(f64::INFINITY), "drift"),
        ("negative jitter", b().jitter(-0.1), "jitter"),
        ("NaN jitter", b().jitter(f64::NAN), "jitter"),
        ("jitter above 1", b().jitter(1.5), "jitter"),
        (
            "margin = believed ttl",
            b().step_down_margin(believed()),
            "step_down_margin",
        ),
        ("margin > ttl", b().step_down_margin(s(11)), "step_down_margin"),
        // The margin fits alone but leaves no room for a renewal before it.
        (
            "margin + renew_every too big",
            b().step_down_margin(s(7)),
            "renew_every",
        ),
        ("retry_every = 0", b().retry_every(Duration::ZERO), "retry_every"),
        ("retry_every > ttl", b().retry_every(s(11)), "retry_every"),
        (
            "request_timeout = 0",
            b().request_timeout(Duration::ZERO),
            "request_timeout",
        ),
        ("request_timeout > ttl", b().request_timeout(s(11)), "request_timeout"),
        ("stall_timeout = 0", b().stall_timeout(Duration::ZERO), "stall_timeout"),
        ("lock_delay > 60 s", b().lock_delay(s(61)), "lock_delay"),
    ];
    for (case, builder, field) in cases {
        let (got, message) = config_error(builder);
        assert_eq!(got, field, "{case}: {message}");
        assert!(
            message.contains(field) && message.contains("allowed"),
            "{case}: {message}"
        );
    }
    let (_, message) = config_error(b().drift(f64::NAN));
    assert!(message.contains("NaN"), "{message}");
    let (_, message) = config_error(b().step_down_margin(s(7)));
    assert!(
        message.contains("step_down_margin"),
        "the message explains the margin's part: {message}"
    );

    // Boundaries that are allowed.
    b().drift(0.0).jitter(0.0).build().unwrap();
    b().drift(0.49)
        .step_down_margin(Duration::ZERO)
        .renew_every(s(4))
        .build()
        .unwrap();
    b().jitter(1.0)
        .retry_every(TTL)
        .request_timeout(TTL)
        .lock_delay(s(60))
        .build()
        .unwrap();
}

#[test]
fn invalid_names_and_ttls_give_their_typed_errors() {
    let store = Arc::new(MemoryStore::new());
    for name in ["", "a/b", ".hidden", "-x", "spaces are bad", &"x".repeat(129)] {
        match Elector::builder(store.clone(), name).ttl(TTL).build() {
            Err(Error::InvalidLeaseName { name: got, reason }) => {
                assert_eq!(got, name);
                assert!(!reason.is_empty());
            }
            other => panic!("{name:?}: expected InvalidLeaseName, got {other:?}"),
        }
    }
    for id in ["", "tab\there", &"x".repeat(257)] {
        match Elector::builder(store.clone(), "jobs").candidate_id(id).build() {
            Err(Error::InvalidCandidateId { id: got, .. }) => assert_eq!(got, id),
            other => panic!("{id:?}: expected InvalidCandidateId, got {other:?}"),
        }
    }
    // MemoryStore accepts 1 ms ..= 24 h.
    for ttl in [
        Duration::ZERO,
        Duration::from_micros(999),
        Duration::from_secs(24 * 3600 + 1),
    ] {
        match Elector::builder(store.clone(), "jobs").ttl(ttl).build() {
            Err(e @ Error::InvalidTtl { store: "memory", .. }) => {
                assert!(matches!(e, Error::InvalidTtl { ttl: got, .. } if got == ttl));
                assert!(e.to_string().contains("1ms..=86400s"), "{e}");
            }
            other => panic!("{ttl:?}: expected InvalidTtl, got {other:?}"),
        }
    }
    // A valid configuration, for contrast; the defaults derive from the TTL.
    let elector = Elector::builder(store, "jobs").ttl(TTL).build().unwrap();
    assert_eq!(elector.timing().renew_every, TTL / 3);
    assert_eq!(elector.lease().as_str(), "jobs");
}

/// Finding 5 of the safety review: `stall_timeout(Duration::MAX)` passed validation and then
/// overflowed `Instant` in the driver (a panic). Every duration now has an upper bound.
#[test]
fn huge_durations_are_config_errors_not_panics() {
    let store = MemoryStore::new();
    let err = builder(&store, "a").stall_timeout(Duration::MAX).build().unwrap_err();
    assert!(
        matches!(
            err,
            Error::InvalidConfig {
                field: "stall_timeout",
                ..
            }
        ),
        "{err}"
    );
    for b in [
        builder(&store, "a").ttl(Duration::MAX),
        builder(&store, "a").lock_delay(Duration::MAX),
        builder(&store, "a").renew_every(Duration::MAX),
        builder(&store, "a").retry_every(Duration::MAX),
        builder(&store, "a").request_timeout(Duration::MAX),
        builder(&store, "a").step_down_margin(Duration::MAX),
    ] {
        assert!(b.build().is_err());
    }
    let mut t = leasehold_core::Timing::new(Duration::from_secs(10));
    t.ttl = Duration::MAX;
    assert!(t.validate().is_err());
}
