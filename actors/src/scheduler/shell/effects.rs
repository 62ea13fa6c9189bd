//! What the shell asks the world to do: its effects, as data.
//!
//! The shell never sends, stores or awaits anything itself. Each event it handles appends
//! effects here, in the order they must happen, and the scheduler actor's driver carries them
//! out (see `scheduler::driver`), as quinn-proto's connection hands its transmits to the
//! endpoint that owns the socket. A test carries them out against a model instead.
//!
//! Where carrying one out can fail (a worker's channel closed, the queue actor gone), the
//! driver tells the shell with the event that failure stands for, so every failure takes the
//! same path as the report a backend would have sent.

use ractor::RpcReplyPort;

use super::storage::shared::{EndedLater, SharedCall};
use crate::domain::{MailboxKey, PoolError};
use crate::mailbox::notify::RunOf;
use crate::mailbox::Delivery;
use crate::permit::{AcquireAnswer, Grant, GrowAnswer, Holding, PermitOp};
use crate::queue::actor::QueueMsg;
use crate::queue::{Claim, EntryId, Settlement};
use crate::running::stream::StreamAttachment;
use crate::scheduler::protocol::{Reply, ShutdownReport};
use crate::worker::Job;
use std::sync::Arc;

/// Where a cancel's answer goes.
pub(crate) type CancelReply = RpcReplyPort<Result<(), PoolError>>;

/// One thing the shell asks for. See the module docs.
pub(crate) enum Effect<P, R> {
    /// Answer a submitter: admitted under a key, or why not.
    Answer {
        reply: Reply,
        answer: Result<MailboxKey, PoolError>,
    },
    /// Answer a cancel.
    AnswerCancel {
        reply: CancelReply,
        answer: Result<(), PoolError>,
    },
    /// Answer a caller of `shutdown` with the drain's report.
    AnswerShutdown {
        reply: RpcReplyPort<ShutdownReport>,
        report: ShutdownReport,
    },
    /// Hand a started task's job to worker `worker`. If its channel is closed, the driver
    /// reports [`Shell::job_lost`](super::Shell::job_lost).
    Run { worker: usize, job: Job<P> },
    /// A call to the pool's durable local queue, made through the queue actor, which keeps
    /// one entry's calls in order and answers parks and claims with a `QueueReport`.
    Queue(QueueMsg<P>),
    /// A call to the shared queue; answers come back as `SharedReport`s.
    Shared(SharedCall<P>),
    /// Store an outcome in the mailbox and tell the notifiers.
    Deliver(Outcome<R>),
    /// End a streamed task's stream with its outcome (it goes there, not to the mailbox).
    EndStream {
        stream: StreamAttachment,
        outcome: Result<R, PoolError>,
    },
    /// Tell the GPU sampler that tasks wait for memory, so it samples at once.
    WakeGpu,
    /// Answer a permit's holder, or ask it to yield.
    Permit(PermitEffect),
}

/// What the driver does for permits.
pub(crate) enum PermitEffect {
    /// Hand a grant to its waiter; one that withdrew meanwhile is released.
    Grant {
        answer: Arc<AcquireAnswer>,
        grant: Grant,
    },
    /// Add `extra` units to a holder and tell its grow; one that withdrew gives them back.
    Grew {
        answer: Arc<GrowAnswer>,
        holding: Arc<Holding>,
        parent: EntryId,
        extra: u32,
    },
    RefuseAcquire {
        answer: Arc<AcquireAnswer>,
        error: PoolError,
    },
    RefuseGrow {
        answer: Arc<GrowAnswer>,
        error: PoolError,
    },
    /// Ask a holder to yield.
    Preempt(Arc<Holding>),
}

impl PermitEffect {
    /// Carries it out; returns the request that undoes a grant nobody took.
    pub fn carry_out(self) -> Option<PermitOp> {
        match self {
            PermitEffect::Grant { answer, grant } => match answer.give(Ok(grant)) {
                Ok(()) => None,
                Err(Ok(grant)) => Some(PermitOp::Release { entry: grant.entry }),
                Err(Err(_)) => None,
            },
            PermitEffect::Grew {
                answer,
                holding,
                parent,
                extra,
            } => {
                holding.add(extra);
                match answer.give(Ok(())) {
                    Ok(()) => None,
                    Err(_) => Some(PermitOp::Shrink {
                        entry: parent,
                        units: holding.take(extra),
                    }),
                }
            }
            PermitEffect::RefuseAcquire { answer, error } => {
                let _ = answer.give(Err(error));
                None
            }
            PermitEffect::RefuseGrow { answer, error } => {
                let _ = answer.give(Err(error));
                None
            }
            PermitEffect::Preempt(holding) => {
                holding.preempt();
                None
            }
        }
    }
}

/// A terminal outcome on its way to the mailbox.
pub(crate) struct Outcome<R> {
    /// Where it goes.
    pub key: MailboxKey,
    /// What is stored.
    pub delivery: Delivery<R>,
    /// Which run of the task produced it, and its trace.
    pub run: RunOf,
    /// The shared claim its run held, and how the claim ends: the outcome is published only
    /// while the claim holds, and the claim ends with it (see `driver.rs`, "publish").
    pub settle: Option<(Claim, Settlement)>,
    /// The task's `Ended` step, told only once the outcome is published under its claim.
    pub later: Option<EndedLater>,
}

/// The effects of the events handled so far, in order.
pub(crate) struct Effects<P, R> {
    queue: Vec<Effect<P, R>>,
}

impl<P, R> Default for Effects<P, R> {
    fn default() -> Self {
        Self { queue: Vec::new() }
    }
}

impl<P, R> Effects<P, R> {
    /// Asks for `effect` after those asked for before.
    pub fn push(&mut self, effect: Effect<P, R>) {
        self.queue.push(effect);
    }

    /// Asks to answer a submitter.
    pub fn answer(&mut self, reply: Reply, answer: Result<MailboxKey, PoolError>) {
        self.push(Effect::Answer { reply, answer });
    }

    /// Asks for a shared-queue call.
    pub fn shared(&mut self, call: SharedCall<P>) {
        self.push(Effect::Shared(call));
    }

    /// Whether nothing is asked.
    pub fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }

    /// Hands over everything asked so far, leaving the buffer empty; `spare` (an emptied
    /// batch handed back) becomes the new buffer, so carrying effects out allocates nothing.
    pub fn take(&mut self, spare: Vec<Effect<P, R>>) -> Vec<Effect<P, R>> {
        debug_assert!(spare.is_empty());
        std::mem::replace(&mut self.queue, spare)
    }
}
