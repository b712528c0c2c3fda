//! The secured section (see [`secured`](mod@crate::secured)): refusals that name what to check, and
//! a scan for secrets in everything the process shows.

use std::error::Error as _;

use leasehold_core::Error;

use super::*;
use crate::secured::{Secured, capture};

/// Each URL with one thing wrong (CA, host, expired client certificate, password, privilege)
/// fails at `connect` or at the first `acquire`, within 20 s (never retried on and on), with
/// [`Error::Refused`] whose one line names what to check and shows no secret.
///
/// # Panics
///
/// When a wrong setting is accepted, takes too long, or fails with another error or message.
pub async fn refusals_name_what_to_check(secured: Secured) {
    let scene = Scene::new(secured.backend.clone(), "refusals_name_what_to_check").await;
    let p = &scene.prefix;
    for refusal in &secured.refusals {
        let started = Instant::now();
        let outcome = scene
            .within(&format!("{} refused", refusal.what), Duration::from_secs(20), async {
                let store = scene.backend.connect_url(&refusal.url).await?;
                let request = AcquireRequest {
                    lease: scene.lease_name(),
                    candidate: CandidateId::new("refused").expect("a valid id"),
                    ttl: scene.ttl,
                    takeover: None,
                };
                store.acquire(&request).await.map(|_| ())
            })
            .await;
        let Err(error) = outcome else {
            panic!("{p}: {}: accepted", refusal.what);
        };
        let line = error.to_string();
        scene.log(format_args!(
            "{}: after {} ms: {line}",
            refusal.what,
            started.elapsed().as_millis()
        ));
        assert!(
            matches!(error, Error::Refused { .. }),
            "{p}: {}: not Refused but {error:?}",
            refusal.what
        );
        assert!(
            line.contains(refusal.says) && !line.contains('\n'),
            "{p}: {}: the line must name `{}`: {line}",
            refusal.what,
            refusal.says
        );
        for text in error_texts(&error) {
            for secret in &secured.secrets {
                assert!(
                    !text.contains(secret),
                    "{p}: {}: a secret shows in {text}",
                    refusal.what
                );
            }
        }
    }
    scene.finish().await;
}

/// Captures every log line (`tracing`, all levels, span fields too) and every metric key with
/// its labels while a leader is elected and resigns over TLS and while every refusal happens
/// (a store that connects but is refused later campaigns for a TTL, so that the engine logs and
/// counts its refusals; a store refused at `connect` leaves its error); then scans the logs, the metric labels, every error (`Display`,
/// `Debug`, sources) and every store's `Debug` for the password and the private key's body.
///
/// # Panics
///
/// When a secret shows, or when nothing was captured (the scan would prove nothing).
pub async fn no_secret_in_errors_logs_debug_or_metrics(secured: Secured) {
    let captured = capture::install();
    let scene = Scene::new(secured.backend.clone(), "no_secret_in_errors_logs_debug_or_metrics").await;
    let p = &scene.prefix;
    let mut texts = Vec::new();
    let store = scene.connect().await;
    texts.push(format!("{store:?}"));
    let a = scene.elector(store, "A");
    let leader = scene.campaign(&a, scene.ttl * 3).await;
    leader.resign().await;
    for refusal in &secured.refusals {
        match scene.backend.connect_url(&refusal.url).await {
            Err(e) => texts.extend(error_texts(&e)),
            Ok(store) => {
                texts.push(format!("{store:?}"));
                let refused = scene.watched(scene.builder(store, &scene.lease, "refused"));
                if let Ok(Err(e)) = tokio::time::timeout(scene.ttl, refused.campaign()).await {
                    texts.extend(error_texts(&e));
                }
            }
        }
    }
    let logs = captured.logs();
    let metrics = captured.metrics();
    assert!(
        logs.iter().any(|l| l.contains(&scene.lease)),
        "{p}: the election of {} was not logged: the capture sees nothing ({} lines)",
        scene.lease,
        logs.len()
    );
    assert!(!metrics.is_empty(), "{p}: no metric was registered");
    for (what, all) in [
        ("an error or Debug", &texts),
        ("a log line", &logs),
        ("a metric", &metrics),
    ] {
        for text in all.iter() {
            for secret in &secured.secrets {
                assert!(!text.contains(secret), "{p}: a secret shows in {what}: {text}");
            }
        }
    }
    scene.log(format_args!(
        "no secret in {} errors and Debug outputs, {} log lines, {} metric keys",
        texts.len(),
        logs.len(),
        metrics.len()
    ));
    scene.finish().await;
}

/// `Display` and `Debug` of an error and every source.
fn error_texts(error: &Error) -> Vec<String> {
    let mut texts = vec![error.to_string(), format!("{error:?}")];
    let mut source = error.source();
    while let Some(s) = source {
        texts.push(s.to_string());
        texts.push(format!("{s:?}"));
        source = s.source();
    }
    texts
}
