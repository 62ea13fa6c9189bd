//! The driver: where the shell's effects meet the world. It holds every channel and actor
//! the scheduler talks to (the workers' job channels, the queue actor, the shared queue's
//! I/O, the mailbox, the GPU sampler) and carries out the effects the shell asks for, in
//! order. When carrying one out fails (a closed job channel, a queue actor that is gone), it
//! tells the shell with the event that failure stands for.

use std::sync::Arc;

use ractor::ActorRef;

use super::gpu_watch::GpuLink;
use super::shared::SharedIo;
use super::shell::effects::{Effect, Outcome};
use super::shell::tasks::stream_of;
use super::shell::Shell;
use crate::contain::drop_contained;
use crate::mailbox::actor::{AfterStore, MailboxMsg};
use crate::mailbox::notify::Notifiers;
use crate::mailbox::{Mailbox, MailboxError};
use crate::queue::actor::{QueueMsg, QueueReport};
use crate::worker::{Job, JobSenders};

/// Where outcomes are stored: directly, for a mailbox with an inline face, or through the
/// mailbox actor, for one that awaits.
pub(crate) enum Results<R> {
    Inline {
        mailbox: Arc<dyn Mailbox<R>>,
        notifiers: Notifiers<R>,
    },
    Actor(ActorRef<MailboxMsg<R>>),
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
            QueueMsg::Settle { entry, .. } | QueueMsg::Remove { entry } => (*entry, None),
        };
        let Err(error) = queue.send_message(message) else {
            return;
        };
        drop_contained(error);
        let reason = "the queue actor is gone".to_owned();
        let report = match answered {
            Some(true) => QueueReport::ParkFailed { entry, reason },
            Some(false) => QueueReport::ClaimFailed { entry, reason },
            None => {
                tracing::warn!(pool = %self.pool, entry, "the queue actor is gone; a settle or remove was lost");
                return;
            }
        };
        shell.queue_report(report, now);
    }

    /// Stores an outcome and tells the notifiers; then ends its shared claim, once stored.
    fn deliver(&self, outcome: Outcome<R>) {
        let Outcome {
            key,
            delivery,
            attempt,
            settle,
        } = outcome;
        let settle: Option<AfterStore> = settle.and_then(|(entry, settlement)| {
            let settler = self.shared.as_ref()?.settler();
            let after: AfterStore = Box::new(move |stored: bool| {
                if stored {
                    settler.settle(entry, settlement);
                }
            });
            Some(after)
        });
        match &self.results {
            Results::Inline { mailbox, notifiers } => {
                let task_id = delivery.task_id;
                let event = notifiers.event_for(&self.pool, &key, &delivery, attempt);
                let stored = match mailbox.inline() {
                    Some(inline) => inline.store_now(&key, delivery),
                    None => Err(MailboxError::Backend(
                        "the mailbox lost its inline face".into(),
                    )),
                };
                match (&stored, event) {
                    (Err(error), _) => {
                        tracing::error!(pool = %self.pool, task_id, %error, "could not store a result");
                    }
                    (Ok(()), Some(event)) => notifiers.notify(&event),
                    (Ok(()), None) => {}
                }
                if let Some(settle) = settle {
                    settle(stored.is_ok());
                }
            }
            Results::Actor(mailbox) => {
                let task_id = delivery.task_id;
                let message = MailboxMsg::Deliver {
                    key,
                    delivery,
                    attempt,
                    then: settle,
                };
                if let Err(error) = mailbox.send_message(message) {
                    tracing::error!(pool = %self.pool, task_id, %error, "the mailbox actor is gone; outcome dropped");
                }
            }
        }
    }
}
