//! The settle loop: a node's claims end in groups, every claim that ended while the
//! previous group was being settled going into the next [`SharedQueue::settle_many`], with
//! a backend error retried for up to half the lease.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};

use crate::domain::{BackendFault, FaultKind};
use crate::queue::{Claim, QueueError, Settlement, SharedQueue};

/// Parks or settles one group takes at most (a database statement's size stays bounded).
pub(super) const GROUP_AT_MOST: usize = 1_000;

/// What runs once a settle is done, told how it ended.
pub(crate) type AfterSettle = Box<dyn FnOnce(Result<(), QueueError>) + Send>;

/// A claim to end, waiting for the settle loop.
pub(super) struct ToSettle {
    claim: Claim,
    settlement: Settlement,
    then: Option<AfterSettle>,
}

/// What the settle loop is handed.
pub(super) enum SettleMsg {
    Settle(ToSettle),
    /// Answered once every settle handed over before it is done.
    Flush(oneshot::Sender<()>),
}

/// Ends a node's claims on the shared queue: a handle on the node's settle loop (see
/// [`settle_loop`]). Cheap to clone.
#[derive(Clone)]
pub(crate) struct Settler {
    pub(super) settles: mpsc::UnboundedSender<SettleMsg>,
}

impl Settler {
    /// Ends `claim`, with the other claims that end meanwhile. A backend error (a database
    /// that is away) is retried for up to half the lease; after that the lease runs out and
    /// the task runs again elsewhere (at-least-once).
    pub fn settle(&self, claim: Claim, settlement: Settlement) {
        self.settle_then(claim, settlement, None);
    }

    /// [`settle`](Self::settle), then `then`, told how the settle ended (`NotClaimed`: the
    /// claim was lost).
    pub fn settle_then(&self, claim: Claim, settlement: Settlement, then: Option<AfterSettle>) {
        let settle = ToSettle {
            claim,
            settlement,
            then,
        };
        if let Err(mpsc::error::SendError(SettleMsg::Settle(settle))) =
            self.settles.send(SettleMsg::Settle(settle))
        {
            // The loop ends only with the link: the pool is gone, and nothing was settled.
            if let Some(then) = settle.then {
                then(Err(QueueError::Backend(BackendFault::plain(
                    FaultKind::Other,
                    "the pool's shared queue link is gone",
                ))));
            }
        }
    }

    /// Completes once every settle handed over so far is done (or given up).
    pub(super) async fn flush(&self) {
        let (done, flushed) = oneshot::channel();
        if self.settles.send(SettleMsg::Flush(done)).is_ok() {
            let _ = flushed.await;
        }
    }
}

/// Settles claims as they end, in groups: every claim that ended while the previous group
/// was being settled goes in the next [`SharedQueue::settle_many`].
pub(super) async fn settle_loop<P: Send + 'static>(
    queue: Arc<dyn SharedQueue<P>>,
    node: Arc<str>,
    lease: Duration,
    mut settles: mpsc::UnboundedReceiver<SettleMsg>,
) {
    let mut group = Vec::new();
    while settles.recv_many(&mut group, GROUP_AT_MOST).await > 0 {
        let mut pending = Vec::with_capacity(group.len());
        let mut flushes = Vec::new();
        for message in group.drain(..) {
            match message {
                SettleMsg::Settle(settle) => pending.push(settle),
                SettleMsg::Flush(done) => flushes.push(done),
            }
        }
        let give_up = tokio::time::Instant::now() + lease / 2;
        let mut pause = Duration::from_millis(50);
        while !pending.is_empty() {
            let claims = pending
                .iter()
                .map(|settle: &ToSettle| (settle.claim, settle.settlement.clone()))
                .collect();
            let settled = queue.settle_many(&node, claims).await;
            let mut again = Vec::new();
            for (settle, result) in pending.into_iter().zip(settled) {
                let entry = settle.claim.entry;
                let result = match result {
                    Err(QueueError::Backend(error))
                        if tokio::time::Instant::now() + pause < give_up =>
                    {
                        tracing::warn!(node = %node, entry, %error, "shared queue settle failed; retrying");
                        again.push(settle);
                        continue;
                    }
                    Err(error @ QueueError::NotClaimed(_)) => {
                        tracing::warn!(node = %node, entry, "a shared claim ended elsewhere: its lease ran out and the task was claimed again");
                        Err(error)
                    }
                    Err(error) => {
                        tracing::warn!(node = %node, entry, %error, "shared queue settle failed; the lease will expire and the task may run again");
                        Err(error)
                    }
                    Ok(()) => Ok(()),
                };
                if let Some(then) = settle.then {
                    then(result);
                }
            }
            if !again.is_empty() {
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_secs(2));
            }
            pending = again;
        }
        for done in flushes {
            let _ = done.send(());
        }
    }
}
