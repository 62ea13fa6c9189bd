//! The driver: where the shell's effects meet the world. It holds every channel and actor
//! the scheduler talks to (the workers' job channels, the queue actor, the shared queue's
//! I/O, the mailbox, the GPU sampler) and carries out the effects the shell asks for, in
//! order. When carrying one out fails (a closed job channel, a queue actor that is gone), it
//! tells the shell with the event that failure stands for.

use crate::domain::{BackendFault, FaultKind};
use crate::mailbox::notify::RunOf;
use std::sync::Arc;

use ractor::ActorRef;

use super::gpu_watch::GpuLink;
use super::shell::effects::{Effect, Outcome};
use super::shell::storage::shared::{AfterSettle, SharedIo, SharedReport};
use super::shell::tasks::stream_of;
use super::shell::Shell;
use crate::domain::MailboxKey;
use crate::mailbox::actor::{AfterStore, Fence, MailboxMsg, Stored};
use crate::mailbox::notify::Notifiers;
use crate::mailbox::watch::ResultWatch;
use crate::mailbox::{Delivery, Mailbox, MailboxError};
use crate::queue::actor::{QueueMsg, QueueReport};
use crate::queue::QueueError;
use crate::util::contain::drop_contained;
use crate::worker::{Job, JobSenders};

/// Where outcomes are stored: directly, for a mailbox with an inline face, or through the
/// mailbox actor, for one that awaits.
pub(crate) enum Results<R> {
    Inline {
        mailbox: Arc<dyn Mailbox<R>>,
        notifiers: Notifiers<R>,
    },
    Actor {
        actor: ActorRef<MailboxMsg<R>>,
        /// The mailbox ends shared claims in the store's transaction.
        fences: bool,
        /// The results on their way to the mailbox (see `mailbox/watch.rs`).
        watch: Arc<ResultWatch>,
    },
}

/// See the module docs.
pub(crate) struct Driver<P, R> {
    pub pool: Arc<str>,
    pub jobs: JobSenders<P>,
    /// The queue actor of a durable local queue.
    pub queue: Option<ActorRef<QueueMsg<P>>>,
    /// The shared queue's I/O, in the shared mode.
    pub shared: Option<SharedIo<P>>,
    pub results: Results<R>,
    /// The GPU sampler, for a pool sized from a GPU.
    pub gpu: Option<GpuLink>,
    /// The last batch of effects, emptied, for the next one.
    pub spare: Vec<Effect<P, R>>,
}

impl<P, R> Driver<P, R>
where
    P: Send + 'static,
    R: Send + 'static,
{
    /// Carries out every effect the shell asked for, and those that follows ask for.
    pub fn carry_out(&mut self, shell: &mut Shell<P, R>, now: u64) {
        while shell.has_effects() {
            let mut batch = shell.take_effects(std::mem::take(&mut self.spare));
            for effect in batch.drain(..) {
                self.apply(effect, shell, now);
            }
            self.spare = batch;
        }
    }

    fn apply(&mut self, effect: Effect<P, R>, shell: &mut Shell<P, R>, now: u64) {
        match effect {
            Effect::Answer { reply, answer } => reply.send(answer),
            Effect::AnswerCancel { reply, answer } => {
                let _ = reply.send(answer);
            }
            Effect::AnswerShutdown { reply, report } => {
                let _ = reply.send(report);
            }
            Effect::Run { worker, job } => self.run(worker, job, shell, now),
            Effect::Queue(message) => self.queue(message, shell, now),
            Effect::Shared(call) => match &self.shared {
                Some(shared) => shared.call(call),
                None => {
                    tracing::error!(pool = %self.pool, "bug: a shared-queue call in a pool without one")
                }
            },
            Effect::Deliver(outcome) => self.deliver(outcome),
            Effect::EndStream { stream, outcome } => match stream_of::<R>(&stream) {
                Some(stream) => stream.finish(outcome),
                None => {
                    drop_contained(outcome);
                }
            },
            Effect::Permit(effect) => {
                if let Some(undo) = effect.carry_out() {
                    shell.permit(undo, now);
                }
            }
            Effect::WakeGpu => {
                if let Some(gpu) = &self.gpu {
                    gpu.wake();
                }
            }
        }
    }

    /// Hands a job to its worker's channel; a closed channel means the job never ran.
    fn run(&self, worker: usize, job: Job<P>, shell: &mut Shell<P, R>, now: u64) {
        let entry = job.entry;
        let returned = match self.jobs.get(worker) {
            Some(jobs) => jobs.send(job).err().map(|returned| returned.0),
            None => Some(job),
        };
        if let Some(job) = returned {
            drop_contained(job);
            shell.job_lost(entry, now);
        }
    }

    /// Sends a call to the queue actor; if it is gone, a park or a claim fails as the actor
    /// would have reported it.
    fn queue(&self, message: QueueMsg<P>, shell: &mut Shell<P, R>, now: u64) {
        let Some(queue) = &self.queue else {
            tracing::error!(pool = %self.pool, "bug: a queue call in a pool without a queue actor");
            return;
        };
        let (entry, answered) = match &message {
            QueueMsg::Park { entry, .. } => (*entry, Some(true)),
            QueueMsg::Claim { entry } => (*entry, Some(false)),
            QueueMsg::Settle { entry, .. }
            | QueueMsg::ParentEnded { entry, .. }
            | QueueMsg::Remove { entry }
            | QueueMsg::Release { entry } => (*entry, None),
        };
        let Err(error) = queue.send_message(message) else {
            return;
        };
        drop_contained(error);
        let fault = BackendFault::plain(FaultKind::Other, "the queue actor is gone");
        let report = match answered {
            Some(true) => QueueReport::ParkFailed {
                entry,
                backend: "pool's",
                fault,
            },
            Some(false) => QueueReport::ClaimFailed { entry, fault },
            None => {
                tracing::warn!(pool = %self.pool, entry, "the queue actor is gone; a settle or remove was lost");
                return;
            }
        };
        shell.queue_report(report, now);
    }

    /// Stores an outcome and tells the notifiers. An outcome whose run held a shared claim
    /// is [published](Self::publish) under it instead.
    fn deliver(&self, outcome: Outcome<R>) {
        let Outcome {
            key,
            delivery,
            run,
            settle,
            later,
        } = outcome;
        // Marked from the task's end (this step) until its result is in the mailbox.
        let storing = match &self.results {
            Results::Actor { watch, .. } if !key.is_anonymous() => {
                Some(watch.storing(&key, delivery.task_id))
            }
            _ => None,
        };
        if let (Some((claim, settlement)), Some(later), Some(shared)) =
            (settle, later, self.shared.as_ref())
        {
            let fence = Fence {
                node: shared.node(),
                claim,
                settlement,
            };
            let report = shared.reporter();
            let told = key.clone();
            let then: AfterStore = Box::new(move |stored| {
                report(SharedReport::Published {
                    key: told,
                    claim,
                    later,
                    stored,
                });
                drop(storing);
            });
            self.publish(key, delivery, run, fence, then, shared);
            return;
        }
        match &self.results {
            Results::Inline { mailbox, notifiers } => {
                store_inline(&self.pool, &**mailbox, notifiers, key, delivery, run, None)
            }
            Results::Actor { actor, .. } => {
                let then =
                    storing.map(|storing| -> AfterStore { Box::new(move |_| drop(storing)) });
                store_through(&self.pool, actor, key, delivery, run, then)
            }
        }
    }

    /// Publishes the outcome of a run that held a shared claim, only while the claim holds,
    /// and ends the claim with it (the fencing rule, `PARKING_LOT.md`, "Fencing"): a node
    /// whose lease ran out while it ran, and whose task another node claimed since, stores
    /// nothing and notifies no one.
    ///
    /// A mailbox that ends claims in its own transaction does both at once. With any other
    /// mailbox the claim is ended first and the outcome stored once that succeeded, so a
    /// node that dies in between loses that one result (its task ended, its submitter waits
    /// in vain): keep results in the queue's database to close that window.
    fn publish(
        &self,
        key: MailboxKey,
        delivery: Delivery<R>,
        run: RunOf,
        fence: Fence,
        then: AfterStore,
        shared: &SharedIo<P>,
    ) {
        if let Results::Actor {
            fences: true,
            actor,
            ..
        } = &self.results
        {
            let task_id = delivery.task_id;
            let message = MailboxMsg::Deliver {
                key,
                delivery,
                run,
                fence: Some(Box::new(fence)),
                then: Some(then),
            };
            if let Err(error) = actor.send_message(message) {
                tracing::error!(pool = %self.pool, task_id, %error, "the mailbox actor is gone; outcome dropped");
            }
            return;
        }
        let results = self.results.handle();
        let pool = self.pool.clone();
        let after: AfterSettle = Box::new(move |settled| match settled {
            Ok(()) => results.store(&pool, key, delivery, run, Some(then)),
            Err(QueueError::NotClaimed(_)) => then(Stored::ClaimLost),
            Err(_) => then(Stored::Failed),
        });
        shared
            .settler()
            .settle_then(fence.claim, fence.settlement, Some(after));
    }
}

impl<R: Send + 'static> Results<R> {
    /// A handle that stores outcomes from anywhere (a settle's answer, on the runtime).
    fn handle(&self) -> ResultsHandle<R> {
        match self {
            Results::Inline { mailbox, notifiers } => ResultsHandle::Inline {
                mailbox: mailbox.clone(),
                notifiers: notifiers.clone(),
            },
            Results::Actor { actor, .. } => ResultsHandle::Actor(actor.clone()),
        }
    }
}

/// Where outcomes are stored, owned: see [`Results`].
enum ResultsHandle<R> {
    Inline {
        mailbox: Arc<dyn Mailbox<R>>,
        notifiers: Notifiers<R>,
    },
    Actor(ActorRef<MailboxMsg<R>>),
}

impl<R: Send + 'static> ResultsHandle<R> {
    /// Stores `delivery` under `key` and tells the notifiers; then `then`.
    fn store(
        &self,
        pool: &Arc<str>,
        key: MailboxKey,
        delivery: Delivery<R>,
        run: RunOf,
        then: Option<AfterStore>,
    ) {
        match self {
            ResultsHandle::Inline { mailbox, notifiers } => {
                store_inline(pool, &**mailbox, notifiers, key, delivery, run, then)
            }
            ResultsHandle::Actor(actor) => store_through(pool, actor, key, delivery, run, then),
        }
    }
}

/// Stores `delivery` under `key` in an inline mailbox and tells the notifiers; then `then`,
/// told how the store ended.
fn store_inline<R: Send + 'static>(
    pool: &Arc<str>,
    mailbox: &dyn Mailbox<R>,
    notifiers: &Notifiers<R>,
    key: MailboxKey,
    delivery: Delivery<R>,
    run: RunOf,
    then: Option<AfterStore>,
) {
    let task_id = delivery.task_id;
    let event = notifiers.event_for(pool, &key, &delivery, run);
    let stored = match mailbox.inline() {
        Some(inline) => inline.store_now(&key, delivery),
        None => Err(MailboxError::Backend(BackendFault::plain(
            FaultKind::Other,
            "the mailbox lost its inline face",
        ))),
    };
    let ended = match (stored, event) {
        (Err(error), _) => {
            tracing::error!(pool = %pool, task_id, %error, "could not store a result");
            Stored::Failed
        }
        (Ok(()), Some(event)) => {
            notifiers.notify(&event);
            Stored::Yes
        }
        (Ok(()), None) => Stored::Yes,
    };
    if let Some(then) = then {
        then(ended);
    }
}

/// Hands `delivery` to the mailbox actor, which stores it, tells the notifiers and then
/// `then`.
fn store_through<R: Send + 'static>(
    pool: &Arc<str>,
    actor: &ActorRef<MailboxMsg<R>>,
    key: MailboxKey,
    delivery: Delivery<R>,
    run: RunOf,
    then: Option<AfterStore>,
) {
    let task_id = delivery.task_id;
    let message = MailboxMsg::Deliver {
        key,
        delivery,
        run,
        fence: None,
        then,
    };
    if let Err(error) = actor.send_message(message) {
        tracing::error!(pool = %pool, task_id, %error, "the mailbox actor is gone; outcome dropped");
    }
}
