//! Store calls under way: polled by the driver itself until the machine stops waiting for one,
//! then run to completion in a task of their own, each within its bound.

use super::*;

/// A store call, polled by the driver: answered at its first poll (a store that needs no
/// request, such as etcd granting a queued candidate on its predecessor's release), running
/// (its request sent, its reply awaited here), or handed to a task of its own once the machine
/// stopped waiting for it. Polled in the driver rather than in a task from the start: a spawn
/// (which may wake another worker thread) and a task hop back with the reply were on the way of
/// every request (a release before the successor's grant, a renewal before the leader's
/// extension).
pub(super) enum Call {
    Answered(Option<std::result::Result<Reply, String>>),
    Running(BoxFuture<'static, Reply>),
    Detached(JoinHandle<Reply>),
}

impl Call {
    /// Polls `call` once here.
    pub(super) fn start(call: impl Future<Output = Reply> + Send + 'static) -> Call {
        let mut call = Call::Running(Box::pin(call));
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        match std::pin::Pin::new(&mut call).poll(&mut cx) {
            std::task::Poll::Ready(reply) => Call::Answered(Some(reply)),
            // Polled again with the driver's waker when the driver next waits (after the yield
            // that follows a release): the store's waker for it is the no-op one until then.
            std::task::Poll::Pending => call,
        }
    }

    /// The call runs on in a task of its own: the driver no longer polls it.
    pub(super) fn detach(self) -> Call {
        match self {
            Call::Running(call) => Call::Detached(tokio::spawn(call)),
            other => other,
        }
    }
}

impl Future for Call {
    /// The reply, or why the call ended without one.
    type Output = std::result::Result<Reply, String>;

    fn poll(self: std::pin::Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> std::task::Poll<Self::Output> {
        let this = self.get_mut();
        match this {
            Call::Answered(reply) => std::task::Poll::Ready(reply.take().expect("a call's reply is taken once")),
            Call::Running(call) => {
                // A store that panics fails this call (the request may or may not have been
                // applied), as a panic in its own task would; the driver goes on.
                match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| call.as_mut().poll(cx))) {
                    Ok(std::task::Poll::Ready(reply)) => {
                        *this = Call::Answered(None);
                        std::task::Poll::Ready(Ok(reply))
                    }
                    Ok(std::task::Poll::Pending) => std::task::Poll::Pending,
                    Err(_) => {
                        *this = Call::Answered(None);
                        std::task::Poll::Ready(Err("it panicked".to_string()))
                    }
                }
            }
            Call::Detached(task) => std::pin::Pin::new(task).poll(cx).map(|r| r.map_err(|e| e.to_string())),
        }
    }
}

/// A call that panicked or was cancelled: the request may or may not have been applied, so the
/// error is a transient one (the machine reads back, and remembers an unknown acquire).
pub(super) fn ended(store: &'static str, why: String) -> Error {
    Error::unreachable(store, format!("the store call ended without a reply: {why}"))
}

/// How long a store call may run: past the lease's TTL its outcome can no longer change what
/// the engine believes (every grant it might carry has expired by the machine's own count), and
/// past `request_timeout` the machine stopped waiting for it.
pub(super) fn call_bound(timing: &Timing) -> Duration {
    timing.ttl.max(timing.request_timeout)
}
