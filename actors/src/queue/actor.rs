//! The actor that drives a queue backend which awaits (files, databases), so the scheduler
//! never awaits queue I/O. Backends with an inline face skip it: the scheduler calls them
//! directly.
//!
//! Invariants: messages from the scheduler are handled in the order sent, so an entry is
//! always parked before it is claimed or removed, and claimed before it is settled; every
//! park and every claim is answered to the scheduler (stored or failed, claimed or failed),
//! never neither.

use std::marker::PhantomData;
use std::sync::Arc;

use ractor::{Actor, ActorProcessingErr, ActorRef};
use tracing::Instrument;

use super::{Carried, EntryId, HeldBy, QueueError, Settlement, TaskQueue};
use crate::domain::{BackendFault, FaultKind, ScheduledTask, TaskStatus};
use crate::util::contain::drop_contained;

/// Messages the queue actor handles.
pub(crate) enum QueueMsg<P> {
    /// Store a parked entry with what it carries (a scheduled start's instant, its trace),
    /// and the parents it is held for, if any.
    Park {
        entry: EntryId,
        task: ScheduledTask<P>,
        carried: Carried,
        held: Option<Box<HeldBy>>,
    },
    /// A parent that a stored held task names ended `status`.
    ParentEnded { entry: EntryId, status: TaskStatus },
    /// Claim an entry the scheduler started and hand its task back.
    Claim { entry: EntryId },
    /// End a claim.
    Settle {
        entry: EntryId,
        settlement: Settlement,
    },
    /// Remove a parked entry (cancelled, expired).
    Remove { entry: EntryId },
    /// Hand a claimed entry back, parked again (a failed run tried again later).
    Release { entry: EntryId },
}

/// What the queue actor reports back, for every park and every claim.
pub(crate) enum QueueReport<P> {
    /// A parked entry is stored: answer its submitter.
    Parked { entry: EntryId },
    /// A parked entry could not be stored by the queue `backend`.
    ParkFailed {
        entry: EntryId,
        backend: &'static str,
        fault: BackendFault,
    },
    /// A claimed entry could not be handed to its worker.
    ClaimFailed { entry: EntryId, fault: BackendFault },
    /// A claimed entry's task, for the scheduler to send to its worker.
    Claimed {
        entry: EntryId,
        task: ScheduledTask<P>,
    },
}

/// Where the queue actor's reports go (the scheduler, which the engine connects).
pub(crate) type QueueReports<P> = Arc<dyn Fn(QueueReport<P>) + Send + Sync>;

/// The queue actor. See the module docs.
pub(crate) struct QueueActor<P>(PhantomData<fn() -> P>);

impl<P> Default for QueueActor<P> {
    fn default() -> Self {
        Self(PhantomData)
    }
}

/// What the queue actor holds.
pub(crate) struct QueueState<P> {
    /// The backend.
    pub queue: Box<dyn TaskQueue<P>>,
    /// Where reports go.
    pub reports: QueueReports<P>,
}

impl<P> Actor for QueueActor<P>
where
    P: Send + 'static,
{
    type Msg = QueueMsg<P>;
    type State = QueueState<P>;
    type Arguments = QueueState<P>;

    async fn pre_start(
        &self,
        _myself: ActorRef<Self::Msg>,
        state: Self::Arguments,
    ) -> Result<Self::State, ActorProcessingErr> {
        Ok(state)
    }

    async fn handle(
        &self,
        myself: ActorRef<Self::Msg>,
        message: Self::Msg,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        let span = crate::observe::spans::actor("queue", myself.get_id(), state.queue.backend());
        async move {
            let backend = state.queue.backend();
            match message {
                QueueMsg::Park {
                    entry,
                    task,
                    carried,
                    held,
                } => {
                    let parked = match (held, carried.is_empty()) {
                        (Some(held), _) => state.queue.park_held(entry, task, carried, &held).await,
                        (None, true) => state.queue.park(entry, task).await,
                        (None, false) => state.queue.park_carrying(entry, task, carried).await,
                    };
                    let report = match parked {
                        Ok(()) => QueueReport::Parked { entry },
                        Err(error) => QueueReport::ParkFailed {
                            entry,
                            backend,
                            fault: fault_of(error),
                        },
                    };
                    (state.reports)(report);
                }
                QueueMsg::Claim { entry } => {
                    let report = match state.queue.claim(entry).await {
                        Ok(Some(task)) => QueueReport::Claimed { entry, task },
                        Ok(None) => QueueReport::ClaimFailed {
                            entry,
                            fault: BackendFault::plain(FaultKind::Other, "it was no longer parked"),
                        },
                        Err(error) => QueueReport::ClaimFailed {
                            entry,
                            fault: fault_of(error),
                        },
                    };
                    (state.reports)(report);
                }
                QueueMsg::Settle { entry, settlement } => {
                    if let Err(error) = state.queue.settle(entry, settlement).await {
                        tracing::warn!(entry, %error, "queue settle failed");
                    }
                }
                QueueMsg::Release { entry } => {
                    if let Err(error) = state.queue.release(entry).await {
                        tracing::warn!(entry, %error, "queue release failed");
                    }
                }
                QueueMsg::ParentEnded { entry, status } => {
                    if let Err(error) = state.queue.parent_ended(entry, &status).await {
                        tracing::warn!(entry, %error, "could not store how a parent ended");
                    }
                }
                QueueMsg::Remove { entry } => match state.queue.remove(entry).await {
                    Ok(task) => {
                        drop_contained(task);
                    }
                    Err(error) => tracing::warn!(entry, %error, "queue remove failed"),
                },
            }
            Ok(())
        }
        .instrument(span)
        .await
    }
}

/// The fault a queue error stands for: a backend's own, or the queue's refusal in words.
pub(crate) fn fault_of(error: QueueError) -> BackendFault {
    match error {
        QueueError::Backend(fault) => fault,
        refused => BackendFault::plain(FaultKind::Refused, refused.to_string()),
    }
}
