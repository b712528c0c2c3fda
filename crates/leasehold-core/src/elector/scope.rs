//! Leaderships scoped to another ([`Leader::scoped`]): a lease group's shard, owned through a
//! record that names the member lease's term, is believed exactly while that member lease is.

use super::*;

/// What the handles of a scoped leadership asked, in the order asked ([`Scope::next`]).
#[derive(Debug)]
pub(crate) enum Asked {
    /// [`Leader::resign`] on the last clone: give the scoped lease up, then answer.
    Resign(oneshot::Sender<()>),
    /// [`Leader::hand_over`]: a scoped lease is given up as on a resign (answer, if any, once
    /// done).
    HandOver(Option<oneshot::Sender<()>>),
    /// The handle ended the leadership itself ([`Leader::ensure_valid`] found too little time,
    /// or the step-down point passed): its work is cancelled.
    SteppedDown,
    /// Every clone of the handle is gone: the work has stopped.
    WorkStopped,
}

/// The owner's side of a scoped leadership: what its handles ask, and its revocation.
#[derive(Debug)]
pub(crate) struct Scope {
    shared: Arc<Shared>,
}

impl Scope {
    /// The next thing the handles asked. Cancel safe.
    pub(crate) async fn next(&self) -> Asked {
        loop {
            match self.shared.commands.recv().await {
                Command::Resign(ack) => return Asked::Resign(ack),
                Command::HandOver { ack, .. } => return Asked::HandOver(ack),
                Command::StepDown(_) => return Asked::SteppedDown,
                Command::WorkStopped => return Asked::WorkStopped,
                Command::Shutdown => {}
            }
        }
    }

    /// Ends the scoped leadership from the owner's side: its work is cancelled (the member
    /// lease it lives in is not touched).
    pub(crate) fn revoke(&self) {
        self.shared.token.cancel();
    }
}

impl Drop for Scope {
    fn drop(&mut self) {
        self.shared.token.cancel();
        self.shared.commands.close();
    }
}

impl Leader {
    /// A leadership of `lease` at `term` that lives inside this one: its `valid_until`,
    /// deposition and `ensure_valid` are this leadership's own (the same status, read at every
    /// call), and it is cancelled when this one is, or when its [`Scope`] revokes it. So a
    /// scoped lease is believed only while this leadership is, and that is checked in one
    /// place, the engine's status of this lease.
    pub(crate) fn scoped(&self, lease: LeaseName, term: Term) -> (Leader, Scope) {
        let parent = &self.shared;
        let shared = Arc::new(Shared {
            lease,
            holder: parent.holder.clone(),
            term,
            elected_at: now(),
            status: parent.status.clone(),
            token: parent.token.child_token(),
            heartbeat: AtomicU64::new(0),
            commands: Mailbox::default(),
            abort: Mutex::new(None),
            step_down_margin: parent.step_down_margin,
            believed_ttl: parent.believed_ttl,
            parent: Some(parent.clone()),
        });
        let leader = Leader {
            shared: shared.clone(),
            _alive: Arc::new(Alive(shared.clone())),
        };
        (leader, Scope { shared })
    }
}
