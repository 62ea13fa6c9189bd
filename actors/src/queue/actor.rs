//! The actor that owns a pool's queue backend, so the scheduler never awaits queue I/O.
//!
//! Invariants: messages from the scheduler are handled in the order sent, so a task is always
//! parked before it is claimed or removed; a task chosen to start either reaches the job
//! channel of the worker the scheduler chose for it or the scheduler hears `ClaimFailed`
//! (which makes that worker idle again), never neither.

use std::marker::PhantomData;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};
use tokio::sync::oneshot;

use super::TaskQueue;
use crate::domain::{MailboxKey, PoolError, ScheduledTask, TaskId};
use crate::scheduler::actor::SchedulerMsg;
use crate::worker::{Job, JobSenders};

/// Messages the queue actor handles.
pub enum QueueMsg<P> {
    /// Park a task; answer the submitter once it is stored.
    Park {
        /// The task (boxed: it is by far the largest message).
        task: Box<ScheduledTask<P>>,
        /// Its mailbox key, the submitter's answer.
        key: MailboxKey,
        /// The submitter.
        reply: RpcReplyPort<Result<MailboxKey, PoolError>>,
    },
    /// Claim a parked task the scheduler started and hand it to the worker it chose.
    ClaimAndRun {
        /// The task.
        id: TaskId,
        /// The worker that runs it (idle, reserved for this task by the scheduler).
        worker: usize,
        /// Its execution timeout.
        timeout: Option<Duration>,
        /// Its cancel signal.
        cancel: oneshot::Receiver<()>,
    },
    /// A claimed task completed.
    Complete {
        /// The task.
        id: TaskId,
    },
    /// A claimed task failed.
    Fail {
        /// The task.
        id: TaskId,
        /// Why.
        reason: String,
    },
    /// A parked task was cancelled or expired.
    Remove {
        /// The task.
        id: TaskId,
    },
}

/// The queue actor. See the module docs.
pub struct QueueActor<P, R>(PhantomData<fn() -> (P, R)>);

impl<P, R> Default for QueueActor<P, R> {
    fn default() -> Self {
        Self(PhantomData)
    }
}

/// What the queue actor starts with and holds.
pub struct QueueState<P, R> {
    /// The backend.
    pub queue: Box<dyn TaskQueue<P>>,
    /// Every worker's job channel.
    pub jobs: JobSenders<P>,
    /// The scheduler, told about failed parks and claims (set once it is started).
    pub scheduler: Arc<OnceLock<ActorRef<SchedulerMsg<P, R>>>>,
}

impl<P, R> Actor for QueueActor<P, R>
where
    P: Send + 'static,
    R: Send + 'static,
{
    type Msg = QueueMsg<P>;
    type State = QueueState<P, R>;
    type Arguments = QueueState<P, R>;

    async fn pre_start(
        &self,
        _myself: ActorRef<Self::Msg>,
        state: Self::Arguments,
    ) -> Result<Self::State, ActorProcessingErr> {
        Ok(state)
    }

    async fn handle(
        &self,
        _myself: ActorRef<Self::Msg>,
        message: Self::Msg,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        match message {
            QueueMsg::Park { task, key, reply } => state.park(*task, key, reply).await,
            QueueMsg::ClaimAndRun {
                id,
                worker,
                timeout,
                cancel,
            } => state.claim_and_run(id, worker, timeout, cancel).await,
            QueueMsg::Complete { id } => {
                if let Err(error) = state.queue.complete(id).await {
                    tracing::warn!(id, %error, "queue complete failed");
                }
            }
            QueueMsg::Fail { id, reason } => {
                if let Err(error) = state.queue.fail(id, &reason).await {
                    tracing::warn!(id, %error, "queue fail failed");
                }
            }
            QueueMsg::Remove { id } => {
                if let Err(error) = state.queue.remove(id).await {
                    tracing::warn!(id, %error, "queue remove failed");
                }
            }
        }
        Ok(())
    }
}

impl<P, R> QueueState<P, R>
where
    P: Send + 'static,
    R: Send + 'static,
{
    async fn park(
        &mut self,
        task: ScheduledTask<P>,
        key: MailboxKey,
        reply: RpcReplyPort<Result<MailboxKey, PoolError>>,
    ) {
        let id = task.meta.id;
        match self.queue.park(task).await {
            Ok(()) => {
                let _ = reply.send(Ok(key));
            }
            Err(error) => {
                let backend = self.queue.backend();
                let _ = reply.send(Err(PoolError::Internal(format!(
                    "{backend} queue could not park task {id}: {error}"
                ))));
                self.tell_scheduler(SchedulerMsg::ParkFailed { id });
            }
        }
    }

    async fn claim_and_run(
        &mut self,
        id: TaskId,
        worker: usize,
        timeout: Option<Duration>,
        cancel: oneshot::Receiver<()>,
    ) {
        let Some(jobs) = self.jobs.get(worker) else {
            let reason = format!("task {id} was given worker {worker}, which does not exist");
            self.tell_scheduler(SchedulerMsg::ClaimFailed { id, reason });
            return;
        };
        let reason = match self.queue.claim(id).await {
            Ok(Some(task)) => {
                let job = Job {
                    task,
                    timeout,
                    cancel,
                };
                match jobs.send(job) {
                    Ok(()) => return,
                    Err(_) => format!("worker {worker} is gone"),
                }
            }
            Ok(None) => format!("task {id} was no longer parked in the queue"),
            Err(error) => format!("could not claim task {id}: {error}"),
        };
        self.tell_scheduler(SchedulerMsg::ClaimFailed { id, reason });
    }

    fn tell_scheduler(&self, message: SchedulerMsg<P, R>) {
        match self.scheduler.get() {
            Some(scheduler) => {
                let _ = scheduler.send_message(message);
            }
            None => tracing::error!("queue actor has no scheduler to report to"),
        }
    }
}
