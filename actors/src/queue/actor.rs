//! The actor that drives a queue backend which awaits (files, databases), so the scheduler
//! never awaits queue I/O. Backends with an inline face skip it: the scheduler calls them
//! directly.
//!
//! Invariants: messages from the scheduler are handled in the order sent, so an entry is
//! always parked before it is claimed or removed, and claimed before it is settled; every
//! park and every claim is answered to the scheduler (stored or failed, claimed or failed),
//! never neither.

use std::marker::PhantomData;
use std::sync::{Arc, OnceLock};

use ractor::{Actor, ActorProcessingErr, ActorRef};
use tracing::Instrument;

use super::{EntryId, Settlement, TaskQueue};
use crate::contain::drop_contained;
use crate::domain::ScheduledTask;
use crate::scheduler::protocol::{Internal, QueueReport, SchedulerMsg};

/// Messages the queue actor handles.
pub(crate) enum QueueMsg<P> {
    /// Store a parked entry.
    Park {
        entry: EntryId,
        task: ScheduledTask<P>,
    },
    /// Claim an entry the scheduler started and hand its task back.
    Claim { entry: EntryId },
    /// End a claim.
    Settle {
        entry: EntryId,
        settlement: Settlement,
    },
    /// Remove a parked entry (cancelled, expired).
    Remove { entry: EntryId },
}

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
    /// The scheduler, set once it is started.
    pub scheduler: Arc<OnceLock<ActorRef<SchedulerMsg<P>>>>,
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
        let span = crate::spans::actor("queue", myself.get_id(), state.queue.backend());
        async move {
            let backend = state.queue.backend();
            match message {
                QueueMsg::Park { entry, task } => {
                    let report = match state.queue.park(entry, task).await {
                        Ok(()) => QueueReport::Parked { entry },
                        Err(error) => QueueReport::ParkFailed {
                            entry,
                            reason: format!("{backend} queue: {error}"),
                        },
                    };
                    state.report(report);
                }
                QueueMsg::Claim { entry } => {
                    let report = match state.queue.claim(entry).await {
                        Ok(Some(task)) => QueueReport::Claimed { entry, task },
                        Ok(None) => QueueReport::ClaimFailed {
                            entry,
                            reason: "it was no longer parked".into(),
                        },
                        Err(error) => QueueReport::ClaimFailed {
                            entry,
                            reason: format!("{backend} queue: {error}"),
                        },
                    };
                    state.report(report);
                }
                QueueMsg::Settle { entry, settlement } => {
                    if let Err(error) = state.queue.settle(entry, settlement).await {
                        tracing::warn!(entry, %error, "queue settle failed");
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

impl<P: Send + 'static> QueueState<P> {
    fn report(&self, report: QueueReport<P>) {
        match self.scheduler.get() {
            Some(scheduler) => {
                let _ = scheduler.send_message(SchedulerMsg(Internal::Queue(report)));
            }
            None => tracing::error!("the queue actor has no scheduler to report to"),
        }
    }
}
