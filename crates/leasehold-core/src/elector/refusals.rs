//! The give-up policy for a store that refuses this candidate (a wrong password, missing
//! rights): [`ElectorBuilder::give_up_when_refused_for`].

use super::*;

/// Waits until the store has refused this candidate's requests ([`Error::Refused`]) for `after`
/// with nothing else in between (no answer without an error, no other kind of trouble, no
/// election or other leader seen), and returns the refusal, worded as a give-up.
pub(super) async fn refused_for(after: Duration, mut events: broadcast::Receiver<Event>, inner: &Inner) -> Error {
    // The streak: when it began, and its last refusal.
    let mut streak: Option<(tokio::time::Instant, Arc<Error>)> = None;
    loop {
        let deadline = streak.as_ref().map(|(since, _)| *since + after);
        let event = tokio::select! {
            event = events.recv() => event,
            () = async { tokio::time::sleep_until(deadline.expect("guarded")).await }, if deadline.is_some() => {
                let (since, error) = streak.take().expect("guarded");
                if inner.answered_at().is_some_and(|at| at >= since.into_std()) {
                    // The store answered meanwhile: the next refusal starts a new streak.
                    continue;
                }
                return given_up(&error, after);
            }
        };
        match event {
            Ok(Event::StoreTrouble { error }) if matches!(*error, Error::Refused { .. }) => {
                let answered = inner.answered_at();
                let since = match streak {
                    Some((since, _)) if answered.is_none_or(|at| at < since.into_std()) => since,
                    _ => tokio::time::Instant::now(),
                };
                streak = Some((since, error));
            }
            Ok(_) => streak = None,
            Err(broadcast::error::RecvError::Lagged(_)) => {}
            // The elector is gone: nothing more will come.
            Err(broadcast::error::RecvError::Closed) => std::future::pending::<()>().await,
        }
    }
}

fn given_up(error: &Error, after: Duration) -> Error {
    match error {
        Error::Refused {
            store,
            operation,
            reason,
            ..
        } => Error::Refused {
            store,
            operation,
            reason: format!("{reason} (refused for {} s; the campaign gave up)", after.as_secs_f64()),
            source: None,
        },
        other => Error::store("engine", other.to_string()),
    }
}
