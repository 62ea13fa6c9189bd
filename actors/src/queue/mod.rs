//! The parking lot's storage: the two queue contracts, and the
//! queue actor (`actor.rs`) that keeps an awaiting backend's I/O off the scheduler.
//!
//! # Entries
//!
//! The scheduler gives every admitted task an [`EntryId`]: unique within the pool across
//! restarts, increasing in admission order. Queues store and address tasks by it, so two
//! tenants may use the same [`TaskId`](crate::domain::TaskId) without meeting.
//!
//! # The local contract: [`TaskQueue`]
//!
//! A backend whose tasks only this node parks (in memory, an embedded file). The scheduler's
//! own core indexes the parked tasks and decides which one starts; the queue stores them
//! and hands over the one it is told to ([`TaskQueue::claim`]). A durable backend returns its
//! parked tasks at start ([`TaskQueue::load_parked`]) so the core indexes them again.
//! Backends that need no I/O expose a synchronous face ([`TaskQueue::inline`]) which the
//! scheduler drives directly, without a hop through the queue actor or a boxed future.
//!
//! # The shared contract: [`SharedQueue`]
//!
//! A backend other nodes park to and claim from as well (a database table). No node's core
//! can know the best parked task, so the queue answers "the best-ranked task that fits this
//! free capacity" itself, under a lease the node renews while the task runs. Its maintenance
//! ([`QueueMaintenance`]: rescue, dead letters, counts) is a face of its own, run by the
//! [`duties`]. What a shared queue may do beyond the contract (keep dependencies, park a
//! schedule's ticks once, keep budgets, fair-share counters or unique callers for every
//! node) are [`capabilities`], each a trait the backend hands out where it has it.
//!
//! # What an entry carries
//!
//! Beside its rank and its task, a parked entry may carry a little more: the instant before
//! which it must not start (a scheduled start) and the trace it belongs to. Both travel
//! together as one [`Carried`], through one method of each contract
//! ([`TaskQueue::park_carrying`], [`SharedQueue::enqueue_carrying`]); a durable queue keeps
//! them with the entry and hands them back ([`StoredEntry::carried`] at start, a claim's
//! [`Lease::trace`]), so a task resumed after a restart or claimed by another node keeps
//! its trace.
//!
//! # Dependencies in a durable local queue
//!
//! A durable local queue that says so ([`TaskQueue::keeps_dependencies`]) stores a task
//! held for its parents with who they are ([`TaskQueue::park_held`]: each parent's entry
//! and caller's id, and whether it runs anyway), and how each parent that a stored child
//! names ended: a parent it stores ends with its `settle` or `remove`, and the scheduler
//! tells it of every other one ([`TaskQueue::parent_ended`]). At start it hands both back
//! ([`StoredEntry::held`]), so after a crash a child still waits for the parents that were
//! live, is released by those that succeeded, and ends `Cancelled` for one that did not.

pub mod actor;
pub mod capabilities;
pub mod duties;
pub mod shared_queue;

use crate::domain::FaultKind;
use async_trait::async_trait;
use thiserror::Error;

use crate::domain::{BackendFault, ExtraCosts, ScheduledTask, TaskMetadata};
use crate::observe::trace::TraceParent;

pub use capabilities::{
    parent_ended_words, DependsOn, QueuedUnits, RunUse, ScheduleTicks, SharedBudgets,
    SharedDependencies, SharedFairShare, UniqueCallers, DEPENDENCIES_SUPPORTED, HELD_PAST_DEADLINE,
    QUEUED_UNITS_SUPPORTED, SHED_FOR_HIGHER_PRIORITY,
};
pub use duties::{DeadLetterReader, LeaseRenewer, LeaseRescuer};
pub use shared_queue::{
    Claim, DeadLetter, FitQuery, KeptLetter, Lease, LetterEnd, QueueMaintenance, RankBound,
    SharedQueue, StarvationRule,
};

/// The pool's own id of an admitted task. See the module docs.
pub type EntryId = u64;

/// A failure of a queue backend.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum QueueError {
    /// An entry with this id is stored already.
    #[error("entry {0} is stored already")]
    Duplicate(EntryId),
    /// The backend's own bound is reached.
    #[error("the queue holds its maximum of {0} tasks")]
    Full(usize),
    /// `settle` of an entry that is not claimed (by this node).
    #[error("entry {0} is not claimed by this node")]
    NotClaimed(EntryId),
    /// The backend itself failed (I/O, database, corrupt data): its fault says what kind of
    /// failure, in what words, and keeps the error underneath.
    #[error(transparent)]
    Backend(BackendFault),
    /// The queue's bound on parked units ([`QueuedUnits::bound_queued_units`]) is reached
    /// for the task's kind, and no task of a lower priority could be shed to make room.
    #[error(
        "the shared queue holds its max_queued_units of {max_queued_units} units of {} for \
         every node, and no task of a lower priority could make room for {needed} more",
        kind.name()
    )]
    UnitsFull {
        /// The kind whose units are full.
        kind: crate::domain::ResourceKind,
        /// What the refused task costs.
        needed: u32,
        /// The bound.
        max_queued_units: u64,
    },
    /// A task's dependencies were refused ([`SharedDependencies::enqueue_waiting`]): the refusal
    /// names the parent at fault.
    #[error(transparent)]
    Dependency(Box<crate::domain::DependencyError>),
}

/// How a claimed entry's run ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Settlement {
    /// It reached a terminal state (its outcome is in the mailbox): forget it.
    Done,
    /// It failed (its failure is in the mailbox): forget it, keeping the reason where the
    /// backend has a dead-letter record.
    Failed(String),
    /// It ended without succeeding and without failing (cancelled, timed out, expired, an
    /// error its mailbox holds): forget it as [`Done`](Self::Done) does. A backend that
    /// keeps dependencies ([`SharedDependencies::enqueue_waiting`]) ends the tasks waiting on it
    /// (see [`DependsOn`]) instead of releasing them; one that does not treats it as `Done`.
    Ended(crate::domain::TaskStatus),
}

impl Settlement {
    /// The settlement of a run that ended with `outcome`: `Done` when it succeeded,
    /// `Failed` when it failed (a reason to keep), `Ended` otherwise.
    pub fn of_outcome<R>(outcome: &Result<R, crate::domain::PoolError>) -> Self {
        match outcome {
            Ok(_) => Settlement::Done,
            Err(crate::domain::PoolError::Failed(reason)) => Settlement::Failed(reason.clone()),
            Err(error) => Settlement::Ended(crate::domain::status_of::<()>(&Err(
                crate::domain::TaskFailure::from(error.clone()),
            ))),
        }
    }

    /// Whether the run succeeded.
    pub fn succeeded(&self) -> bool {
        matches!(self, Settlement::Done)
    }
}

/// What a parked entry carries beyond its rank and its task (see the module docs). The
/// default carries nothing: a plain park.
///
/// ```
/// use prometheus_parking_lot_actors::queue::Carried;
///
/// let traced = Carried {
///     trace: Some("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01".parse().unwrap()),
///     ..Carried::default()
/// };
/// assert!(!traced.is_empty());
/// assert!(Carried::default().is_empty());
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Carried {
    /// The instant (ms since the Unix epoch) before which no one may start it: a scheduled
    /// start. `None`: it may start at once.
    pub not_before_ms: Option<u64>,
    /// The trace it belongs to (a W3C `traceparent`): whoever claims or resumes it goes on
    /// with its submitter's trace. `None`: it belongs to none.
    pub trace: Option<TraceParent>,
    /// What it needs beside its metadata's cost, for a task of several kinds (core rule 25):
    /// a queue that keeps such tasks ([`TaskQueue::keeps_several_kinds`]) stores them, so
    /// that after a restart it holds every kind again. Empty for a task of one kind.
    pub also: ExtraCosts,
}

impl Carried {
    /// Whether it carries nothing (a plain park).
    pub fn is_empty(&self) -> bool {
        *self == Self::default()
    }
}

/// The parents a held task waits for, as the scheduler stores it in a durable queue that
/// keeps dependencies ([`TaskQueue::park_held`]).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct HeldBy {
    /// Each parent's entry and its caller's task id (no repeats).
    pub parents: Vec<(EntryId, crate::domain::TaskId)>,
    /// Whether the task runs however its parents end (a cleanup step).
    pub run_anyway: bool,
}

/// A parent of a stored held task, as the queue found it at start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredParent {
    /// Its entry.
    pub entry: EntryId,
    /// Its caller's task id.
    pub task_id: crate::domain::TaskId,
    /// How it ended, if the queue heard of its end; `None` if it did not: it is parked
    /// again (another [`StoredEntry`]), or its run was lost with the process.
    pub ended: Option<crate::domain::TaskStatus>,
}

/// What a stored held task waits for ([`StoredEntry::held`]).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct StoredHold {
    /// Its parents, in the order they were named.
    pub parents: Vec<StoredParent>,
    /// Whether it runs however they end.
    pub run_anyway: bool,
}

/// A parked entry as a durable queue returns it at start.
#[derive(Debug, Clone, PartialEq)]
pub struct StoredEntry {
    /// Its entry id.
    pub entry: EntryId,
    /// Its metadata (the payload stays in the queue until claimed).
    pub meta: TaskMetadata,
    /// What it was parked with ([`TaskQueue::park_carrying`]): the instant before which it
    /// must not start, and its trace.
    pub carried: Carried,
    /// The parents it was held for, where it was parked held ([`TaskQueue::park_held`]);
    /// `None` for a plain park.
    pub held: Option<StoredHold>,
}

/// How many tasks a queue holds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct QueueCounts {
    /// Waiting to be claimed.
    pub parked: usize,
    /// Claimed and not yet settled.
    pub claimed: usize,
}

/// The local queue contract. See the module docs; the conformance suite in
/// `tests/conformance/queue.rs` checks every backend against it.
#[async_trait]
pub trait TaskQueue<P>: Send + Sync
where
    P: Send + 'static,
{
    /// A short name for logs and errors (`in_memory`, `yaque`).
    fn backend(&self) -> &'static str;

    /// Whether parked tasks survive the process. Shutdown and escalation keep a durable
    /// queue's parked tasks and cancel an in-memory queue's.
    fn is_durable(&self) -> bool;

    /// The synchronous face of a backend that needs no I/O, which the scheduler then drives
    /// directly. `None` (the default) sends every call through the queue actor.
    fn inline(&self) -> Option<&dyn InlineQueue<P>> {
        None
    }

    /// Stores a parked entry. Once this returns `Ok`, it is stored (durably, for a durable
    /// backend).
    async fn park(&self, entry: EntryId, task: ScheduledTask<P>) -> Result<(), QueueError>;

    /// Stores a parked entry with what it carries (see [`Carried`]): a durable backend keeps
    /// both with the entry and returns them from [`load_parked`](Self::load_parked)
    /// ([`StoredEntry::carried`]), so that after a restart a scheduled start still sleeps
    /// until its instant and the task goes on in its trace. The default parks the entry
    /// plainly where the queue is not durable (the scheduler keeps what it carries, and
    /// nothing outlives the process). Where it is durable, the default refuses a scheduled
    /// start, so that no restart starts the task early, and parks a traced task without its
    /// trace (after a restart it runs in a trace of its own).
    async fn park_carrying(
        &self,
        entry: EntryId,
        task: ScheduledTask<P>,
        carried: Carried,
    ) -> Result<(), QueueError> {
        let Some(not_before_ms) = carried.not_before_ms.filter(|_| self.is_durable()) else {
            return self.park(entry, task).await;
        };
        crate::util::contain::drop_contained(task);
        Err(QueueError::Backend(BackendFault::plain(
            FaultKind::Refused,
            format!(
                "the {} queue cannot keep a scheduled start (not before {not_before_ms} ms) \
                 across a restart; submit without not_before_ms, or use a queue that keeps it \
                 (in_memory, yaque, postgres, postgres_pgmq)",
                self.backend()
            ),
        )))
    }

    /// Whether the queue keeps dependencies ([`park_held`](Self::park_held),
    /// [`parent_ended`](Self::parent_ended)); `false` (the default) has the scheduler refuse
    /// a task with parents on it, naming the queues that keep them.
    fn keeps_dependencies(&self) -> bool {
        false
    }

    /// Whether the queue stores the costs of a task of several kinds
    /// ([`Carried::also`]) with its entry and returns them from
    /// [`load_parked`](Self::load_parked); `false` (the default) has the scheduler refuse
    /// such a task on a durable queue, which would otherwise restart it with its first cost
    /// only.
    fn keeps_several_kinds(&self) -> bool {
        false
    }

    /// Stores a parked entry held for its parents (see the module docs): as
    /// [`park_carrying`](Self::park_carrying), and with `held`, which
    /// [`load_parked`](Self::load_parked) returns with how each parent ended. The default,
    /// for a queue that does not keep dependencies, refuses.
    async fn park_held(
        &self,
        entry: EntryId,
        task: ScheduledTask<P>,
        carried: Carried,
        held: &HeldBy,
    ) -> Result<(), QueueError> {
        let _ = (carried, held);
        crate::util::contain::drop_contained(task);
        Err(QueueError::Backend(BackendFault::plain(
            FaultKind::Refused,
            format!(
                "entry {entry}: the {} queue does not keep dependencies",
                self.backend()
            ),
        )))
    }

    /// Parent `entry`, which a stored held task names, ended `status`. A parent the queue
    /// stores tells it with its `settle` or `remove` already (this call then may refine a
    /// removal's status); this is for the others: a task that started without being stored,
    /// or one whose store was skipped. The default ignores it.
    async fn parent_ended(
        &self,
        entry: EntryId,
        status: &crate::domain::TaskStatus,
    ) -> Result<(), QueueError> {
        let _ = (entry, status);
        Ok(())
    }

    /// Claims a parked entry; `None` if it is not parked (removed, or claimed already).
    async fn claim(&self, entry: EntryId) -> Result<Option<ScheduledTask<P>>, QueueError>;

    /// Ends a claim. See [`Settlement`].
    async fn settle(&self, entry: EntryId, settlement: Settlement) -> Result<(), QueueError>;

    /// Removes a parked entry (cancelled, expired); `None` if it is not parked.
    async fn remove(&self, entry: EntryId) -> Result<Option<ScheduledTask<P>>, QueueError>;

    /// Hands a claimed entry back: parked again with its task as stored, so a later
    /// [`claim`](Self::claim) returns it (a failed run that is tried again). `NotClaimed`
    /// for an entry that is not claimed. A backend that does not keep a claimed entry's task
    /// cannot, says so with [`releases_claims`](Self::releases_claims) (`false`, the
    /// default) and answers with an error that says why; the scheduler then keeps a failed
    /// run's failure final.
    async fn release(&self, entry: EntryId) -> Result<(), QueueError> {
        let _ = entry;
        Err(QueueError::Backend(BackendFault::plain(
            FaultKind::Other,
            format!(
                "the {} queue does not keep a claimed task, so it cannot hand the claim back",
                self.backend()
            ),
        )))
    }

    /// Whether [`release`](Self::release) is supported.
    fn releases_claims(&self) -> bool {
        false
    }

    /// Every parked entry, for the core to index at start, and claims left over by a process
    /// that died, parked again (their runs were lost: at-least-once).
    async fn load_parked(&self) -> Result<Vec<StoredEntry>, QueueError>;

    /// How many entries are parked and claimed.
    async fn counts(&self) -> Result<QueueCounts, QueueError>;
}

/// The synchronous face of a [`TaskQueue`] that needs no I/O. Same meaning, method by method.
pub trait InlineQueue<P>: Send + Sync {
    /// See [`TaskQueue::park`].
    fn park_now(&self, entry: EntryId, task: ScheduledTask<P>) -> Result<(), QueueError>;
    /// See [`TaskQueue::claim`].
    fn claim_now(&self, entry: EntryId) -> Result<Option<ScheduledTask<P>>, QueueError>;
    /// See [`TaskQueue::settle`].
    fn settle_now(&self, entry: EntryId, settlement: Settlement) -> Result<(), QueueError>;
    /// See [`TaskQueue::remove`].
    fn remove_now(&self, entry: EntryId) -> Result<Option<ScheduledTask<P>>, QueueError>;
}
