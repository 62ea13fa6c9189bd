//! The actor that runs a pool's retention cleaner (a periodic purge of results older than
//! the retention period) and, for a mailbox backend that awaits (a database), stores results
//! and hands terminal events to notifiers, so the scheduler never awaits mailbox I/O. An
//! inline mailbox is stored into by the scheduler directly.
//!
//! Stores are written in groups: a delivery waits in the actor's buffer until the `Flush` the
//! first delivery of the group sent to the actor itself comes round, and every delivery that
//! arrived meanwhile (while the previous group was being written) is written with it, through
//! [`Mailbox::store_many`]: one statement and one commit for a database, however many results
//! a busy pool finishes. An idle pool writes each result at once (its group is itself).
//!
//! Invariants: a delivery is stored before any notifier hears of it; deliveries are stored
//! in the order the scheduler sent them; a delivery the actor accepted is written before it
//! stops (a drain's stop writes what the buffer still holds).

use crate::domain::{BackendFault, FaultKind};
use crate::mailbox::notify::RunOf;
use std::marker::PhantomData;
use std::sync::Arc;
use std::time::Duration;

use ractor::{Actor, ActorProcessingErr, ActorRef};
use tracing::Instrument;

use super::notify::Notifiers;
use super::{Delivery, FencedDelivery, Mailbox};
use crate::domain::{MailboxKey, TaskId};
use crate::queue::{Claim, Settlement};
use crate::util::clock::engine_now_ms;

/// How a store ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Stored {
    /// The result is stored (and its claim, if it had one, ended).
    Yes,
    /// Its run's shared claim was lost: nothing was stored.
    ClaimLost,
    /// The backend failed: nothing was stored.
    Failed,
}

/// What runs after a store, told how it ended.
pub(crate) type AfterStore = Box<dyn FnOnce(Stored) + Send>;

/// The shared claim a delivery's run held, for a mailbox that ends claims in the store's
/// transaction ([`Mailbox::fences_claims`]).
pub(crate) struct Fence {
    /// The node holding the claim.
    pub node: Arc<str>,
    pub claim: Claim,
    pub settlement: Settlement,
}

/// Messages the mailbox actor handles.
pub(crate) enum MailboxMsg<R> {
    /// Store a task's outcome and notify.
    Deliver {
        /// Where it goes.
        key: MailboxKey,
        /// The outcome.
        delivery: Delivery<R>,
        /// Which run of the task it was, and its trace (see
        /// [`TerminalEvent::attempt`](super::TerminalEvent::attempt)).
        run: RunOf,
        /// The claim the run held, stored under (see [`Mailbox::store_fenced`]); boxed, as
        /// most deliveries have none.
        fence: Option<Box<Fence>>,
        /// Runs once the store is done, told how it ended.
        then: Option<AfterStore>,
    },
    /// Write the buffered deliveries (sent by the actor to itself).
    Flush,
    /// Drop results older than the retention period (sent by the actor's own timer).
    PurgeExpired,
}

/// Deliveries one write takes at most (a database statement's size stays bounded).
const WRITE_AT_MOST: usize = 1_000;

/// A delivery waiting in the buffer, with what follows its store.
struct Waiting<R> {
    key: MailboxKey,
    delivery: Delivery<R>,
    event: Option<super::TerminalEvent>,
    fence: Option<Box<Fence>>,
    then: Option<AfterStore>,
}

/// The mailbox actor. See the module docs.
pub(crate) struct MailboxActor<R>(PhantomData<fn() -> R>);

impl<R> Default for MailboxActor<R> {
    fn default() -> Self {
        Self(PhantomData)
    }
}

/// What the mailbox actor starts with and holds.
pub(crate) struct MailboxState<R> {
    /// The pool's name, for events.
    pub pool: Arc<str>,
    /// The storage backend.
    pub mailbox: Arc<dyn Mailbox<R>>,
    /// Who hears of terminal events, and how results become JSON for them.
    pub notifiers: Notifiers<R>,
    /// How long results are kept; `None` keeps them until taken.
    pub retention: Option<Duration>,
    /// The pool's counters (`expired_results`).
    pub counters: Arc<crate::observe::stats::PoolCounters>,
}

/// What the mailbox actor holds: its starting state and the deliveries not yet written.
pub(crate) struct MailboxHeld<R> {
    state: MailboxState<R>,
    buffer: Vec<Waiting<R>>,
}

impl<R> Actor for MailboxActor<R>
where
    R: Send + 'static,
{
    type Msg = MailboxMsg<R>;
    type State = MailboxHeld<R>;
    type Arguments = MailboxState<R>;

    async fn pre_start(
        &self,
        myself: ActorRef<Self::Msg>,
        state: Self::Arguments,
    ) -> Result<Self::State, ActorProcessingErr> {
        if let Some(retention) = state.retention {
            let sweep = (retention / 10).clamp(Duration::from_secs(1), Duration::from_secs(60));
            myself.send_interval(sweep, || MailboxMsg::PurgeExpired);
        }
        Ok(MailboxHeld {
            state,
            buffer: Vec::new(),
        })
    }

    async fn handle(
        &self,
        myself: ActorRef<Self::Msg>,
        message: Self::Msg,
        held: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        let span = crate::observe::spans::actor("mailbox", myself.get_id(), &held.state.pool);
        async move {
            match message {
                MailboxMsg::Deliver {
                    key,
                    delivery,
                    run,
                    fence,
                    then,
                } => {
                    let state = &held.state;
                    let event = state.notifiers.event_for(&state.pool, &key, &delivery, run);
                    if held.buffer.is_empty() {
                        // This delivery opens a group: the flush comes after whatever is
                        // queued behind it now.
                        let _ = myself.send_message(MailboxMsg::Flush);
                    }
                    held.buffer.push(Waiting {
                        key,
                        delivery,
                        event,
                        fence,
                        then,
                    });
                }
                MailboxMsg::Flush => {
                    held.write_some().await;
                    if !held.buffer.is_empty() {
                        let _ = myself.send_message(MailboxMsg::Flush);
                    }
                }
                MailboxMsg::PurgeExpired => held.state.purge_expired().await,
            }
            Ok(())
        }
        .instrument(span)
        .await
    }

    async fn post_stop(
        &self,
        _myself: ActorRef<Self::Msg>,
        held: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        // A drain stops the actor before the flushes its last deliveries sent themselves.
        while !held.buffer.is_empty() {
            held.write_some().await;
        }
        Ok(())
    }
}

impl<R> MailboxHeld<R>
where
    R: Send + 'static,
{
    /// Writes the oldest buffered deliveries (at most [`WRITE_AT_MOST`]): the plain ones in
    /// one [`Mailbox::store_many`], those under a shared claim in one
    /// [`Mailbox::store_fenced`]; then notifies and runs what follows each stored one.
    async fn write_some(&mut self) {
        let count = self.buffer.len().min(WRITE_AT_MOST);
        let mut plain = Vec::with_capacity(count);
        let mut plain_after = Vec::with_capacity(count);
        let mut fenced = Vec::new();
        let mut fenced_after = Vec::new();
        let mut node: Option<Arc<str>> = None;
        for waiting in self.buffer.drain(..count) {
            let after = (waiting.delivery.task_id, waiting.event, waiting.then);
            match waiting.fence {
                Some(fence) => {
                    node.get_or_insert(fence.node);
                    fenced_after.push(after);
                    fenced.push(FencedDelivery {
                        key: waiting.key,
                        delivery: waiting.delivery,
                        claim: fence.claim,
                        settlement: fence.settlement,
                    });
                }
                None => {
                    plain_after.push(after);
                    plain.push((waiting.key, waiting.delivery));
                }
            }
        }
        let state = &self.state;
        if !plain.is_empty() {
            let stored = state.mailbox.store_many(plain).await.into_iter();
            state.answer(plain_after, stored.map(|stored| stored.map(|()| true)));
        }
        if let Some(node) = node {
            // One pool is one node: every fenced delivery of a group names the same.
            let stored = state.mailbox.store_fenced(&node, fenced).await.into_iter();
            state.answer(fenced_after, stored);
        }
    }
}

/// What follows one store: its task, its terminal event, and who hears how it ended.
type After = (TaskId, Option<super::TerminalEvent>, Option<AfterStore>);

impl<R> MailboxState<R>
where
    R: Send + 'static,
{
    /// Notifies for each delivery stored and tells each one's follower how its store ended
    /// (`Ok(false)`: its claim was lost).
    fn answer(
        &self,
        after: Vec<After>,
        mut stored: impl Iterator<Item = Result<bool, super::MailboxError>>,
    ) {
        for (task_id, event, then) in after {
            let outcome = stored.next().unwrap_or_else(|| {
                Err(super::MailboxError::Backend(BackendFault::plain(
                    FaultKind::Other,
                    "the backend answered fewer stores than it was given",
                )))
            });
            let ended = match outcome {
                Ok(true) => {
                    if let Some(event) = event {
                        self.notifiers.notify(&event);
                    }
                    Stored::Yes
                }
                Ok(false) => {
                    tracing::warn!(pool = %self.pool, task_id, "a result was not stored: its run's shared claim was lost");
                    Stored::ClaimLost
                }
                Err(error) => {
                    tracing::error!(pool = %self.pool, task_id, %error, "could not store a result");
                    Stored::Failed
                }
            };
            if let Some(then) = then {
                then(ended);
            }
        }
    }

    async fn purge_expired(&mut self) {
        let Some(retention) = self.retention else {
            return;
        };
        let retention_ms = u64::try_from(retention.as_millis()).unwrap_or(u64::MAX);
        let cutoff = engine_now_ms().saturating_sub(retention_ms);
        match self.mailbox.purge_stored_before(cutoff).await {
            Ok(0) => {}
            Ok(purged) => {
                self.counters.expired_results.fetch_add(
                    u64::try_from(purged).unwrap_or(u64::MAX),
                    std::sync::atomic::Ordering::Relaxed,
                );
                tracing::debug!(pool = %self.pool, purged, "retention purge");
            }
            Err(error) => tracing::warn!(pool = %self.pool, %error, "retention purge failed"),
        }
    }
}
