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

use crate::domain::{MailboxKey, PoolError, ResourceKind, ScheduledTask, TaskId, TenantId};
use crate::mailbox::notify::RunOf;
use crate::mailbox::Delivery;
use crate::observe::trace::TraceParent;
use crate::permit::{AcquireAnswer, Grant, GrowAnswer, Holding, PermitOp};
use crate::queue::actor::QueueMsg;
use crate::queue::{Carried, Claim, DependsOn, EntryId, FitQuery, RunUse, Settlement};
use crate::running::stream::StreamAttachment;
use crate::scheduler::protocol::{EndedLater, Reply, ShutdownReport};
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

/// A call to the shared queue (see `scheduler::shared_io`, which makes each one in a task of
/// its own so a slow database never holds up the scheduler).
pub(crate) enum SharedCall<P> {
    /// Park a task for any node; `reply` hears once it is stored (`SharedReport::Enqueued`).
    Enqueue {
        /// Its shared entry id.
        entry: EntryId,
        /// Its admission time: its rank among equal priorities.
        rank_time_ms: u64,
        /// What it carries: claimable by no node before its instant (a scheduled start),
        /// claimed in its trace.
        carried: Carried,
        /// Held until these parents succeed, if set (a queue that keeps dependencies).
        depends_on: Option<DependsOn>,
        task: ScheduledTask<P>,
        key: MailboxKey,
        reply: Reply,
    },
    /// Store a task this node starts at once as its own claim (`SharedReport::Recorded`).
    RecordStart {
        /// The task's local entry.
        entry: EntryId,
        /// Its shared entry id.
        shared_entry: EntryId,
        rank_time_ms: u64,
        task: ScheduledTask<P>,
        /// The trace it runs in, stored with it for a node that may rescue it.
        trace: Option<TraceParent>,
        now: u64,
    },
    /// Claim up to `max` of the best tasks that fit `query` together (`SharedReport::Claimed`).
    Claim {
        query: FitQuery,
        max: usize,
        now: u64,
    },
    /// End this node's claim on a shared entry.
    Settle {
        claim: Claim,
        settlement: Settlement,
    },
    /// Hand this node's claims back to the queue at once, for any node to claim (a stopping
    /// node's work it will not run).
    Release { claims: Vec<Claim>, now: u64 },
    /// Park this node's claim again after a failed run, for any node to claim from `at_ms`
    /// (the run counted as an attempt).
    Retry {
        claim: Claim,
        at_ms: u64,
        reason: String,
    },
    /// Put `units` back into the fleet's budget of `kind`: a claimed task used fewer.
    GiveBackBudget { kind: ResourceKind, units: u32 },
    /// Settle the fleet's fair-share charge of `tenant`'s claimed task to what its run
    /// used (`SharedQueue::settle_use`).
    SettleUse { tenant: TenantId, used: RunUse },
    /// Remove the parked task `id` of exactly `key`, for a cancel (`SharedReport::Removed`).
    RemoveTask {
        key: MailboxKey,
        id: TaskId,
        reply: CancelReply,
    },
    /// Renew the leases this node holds (`SharedReport::Lost` names those it lost).
    Renew { held: Vec<EntryId>, now: u64 },
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
