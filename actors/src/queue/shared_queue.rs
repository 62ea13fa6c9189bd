//! The shared queue contract: a parking lot that several nodes park to and claim from.
//!
//! A node asks for "the best-ranked parked task that fits my free capacity" and gets it under
//! a *lease*: the task is its own until the lease expires, and the node renews the lease
//! while the task runs. A node that dies stops renewing; [`QueueMaintenance::rescue_expired`]
//! parks its tasks again for another node (at-least-once). The rank and the starvation
//! guard's bound are plain fields, so a SQL backend answers with one indexed query:
//!
//! ```sql
//! SELECT ... FROM jobs
//!  WHERE state = 'parked' AND (kind, units) fits the free capacity
//!    AND (priority, rank_time_ms, entry) ranks at or ahead of the bound, if any
//!    AND it ranks at or ahead of the node's reserved task, if that does not fit now
//!  ORDER BY priority DESC, rank_time_ms, entry
//!  LIMIT 1 FOR UPDATE SKIP LOCKED
//! ```
//!
//! Rank: higher [`Priority`] first, then smaller `rank_time_ms` (admission time), then smaller
//! entry id. Entry ids must be unique within the queue across nodes; nodes draw them at
//! random.
//!
//! # Two faces
//!
//! [`SharedQueue`] is what a node does with its own work: park, claim, renew, settle, remove,
//! and watch for work other nodes park. [`QueueMaintenance`] is what keeps the queue healthy
//! for every node: rescue expired leases, take the dead letters, count. A node reaches the
//! second through the first ([`SharedQueue::maintenance`]), so one
//! `Arc<dyn SharedQueue<P>>` is all a pool is given; the duties in
//! [`duties`](super::duties) run the maintenance on their own intervals. The rest a queue
//! may do for the nodes that share it are its [capabilities](super::capabilities), each
//! reached through an accessor here (`dependencies`, `schedule_ticks`, `budgets`,
//! `fair_share`, `unique_callers`).

use crate::domain::{BackendFault, FaultKind};
use std::time::Duration;

use async_trait::async_trait;

use super::{
    Carried, EntryId, QueueCounts, QueueError, QueuedUnits, ScheduleTicks, Settlement,
    SharedBudgets, SharedDependencies, SharedFairShare, UniqueCallers,
};
use crate::domain::{
    Capacity, MailboxKey, Priority, QueueOrder, ResourceCost, ScheduledTask, TaskId, TaskStatus,
};
use crate::observe::trace::TraceParent;

/// The rank of the starvation guard's reserved task: a node claims only tasks ranked at or
/// ahead of it, so the pool drains for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RankBound {
    /// Its priority.
    pub priority: Priority,
    /// Its deadline, ms since the Unix epoch, which a queue claiming in the deadline order
    /// ([`SharedQueue::order`]) ranks by after the priority; `None`: none (it ranks after
    /// every deadline). A queue claiming in admission order ignores it.
    pub deadline_ms: Option<u64>,
    /// Its admission time, milliseconds since the Unix epoch.
    pub rank_time_ms: u64,
    /// Its entry id.
    pub entry: EntryId,
}

impl RankBound {
    /// Whether a task of this rank is at or ahead of the bound, in admission order within a
    /// priority.
    pub fn admits(&self, priority: Priority, rank_time_ms: u64, entry: EntryId) -> bool {
        self.admits_in(QueueOrder::Fifo, priority, None, rank_time_ms, entry)
    }

    /// Whether a task of this rank is at or ahead of the bound in `order`: under the
    /// deadline order, the earlier deadline ranks ahead within a priority (none after every
    /// deadline), then admission.
    ///
    /// ```
    /// use prometheus_parking_lot_actors::domain::{Priority, QueueOrder};
    /// use prometheus_parking_lot_actors::queue::RankBound;
    ///
    /// let bound = RankBound { priority: Priority::Normal, deadline_ms: Some(500), rank_time_ms: 10, entry: 1 };
    /// // Admitted later, due sooner: ahead under the deadline order only.
    /// assert!(bound.admits_in(QueueOrder::Deadline, Priority::Normal, Some(400), 20, 2));
    /// assert!(!bound.admits_in(QueueOrder::Fifo, Priority::Normal, Some(400), 20, 2));
    /// ```
    pub fn admits_in(
        &self,
        order: QueueOrder,
        priority: Priority,
        deadline_ms: Option<u64>,
        rank_time_ms: u64,
        entry: EntryId,
    ) -> bool {
        let due = |deadline: Option<u64>| match order {
            QueueOrder::Fifo => u64::MAX,
            QueueOrder::Deadline => deadline.unwrap_or(u64::MAX),
        };
        (
            std::cmp::Reverse(priority),
            due(deadline_ms),
            rank_time_ms,
            entry,
        ) <= (
            std::cmp::Reverse(self.priority),
            due(self.deadline_ms),
            self.rank_time_ms,
            self.entry,
        )
    }
}

/// What a claim may take: free units per kind, and optionally a rank bound and the node's
/// starvation rule.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FitQuery {
    /// Units free per resource kind on the claiming node.
    pub free: Capacity,
    /// Claim only tasks ranked at or ahead of this bound.
    pub bound: Option<RankBound>,
    /// The claiming node's starvation guard, if it has one.
    pub starvation: Option<StarvationRule>,
}

impl FitQuery {
    /// Tasks that fit `free`, with no bound and no starvation rule.
    pub fn within(free: Capacity) -> Self {
        Self {
            free,
            bound: None,
            starvation: None,
        }
    }
}

/// The starvation guard of a node, as a shared queue applies it to one claim.
///
/// The *reserved* task is the best-ranked parked task that was admitted at or before
/// `parked_before_ms` (it has waited the guard's age) and that the node could run on its whole
/// `capacity`. If the reserved task does not fit the free units now, the node claims only
/// tasks ranked at or ahead of it: it drains for it instead of letting smaller, later tasks
/// overtake it for ever. If it fits, it is claimed like any other task.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StarvationRule {
    /// The node's total units per kind.
    pub capacity: Capacity,
    /// Tasks admitted at or before this time (ms since the Unix epoch) have waited long enough.
    pub parked_before_ms: u64,
}

/// One claim of a shared entry: the entry and which claim of it this is. It is the *fencing
/// token* of the run the claim started: a settle, a release, or a result stored with its
/// settle, is carried out only while this very claim holds the entry. After the lease ran
/// out and the entry was claimed again (by any node, this one included), the old claim's
/// writes are refused with [`QueueError::NotClaimed`], so a node that stalled past its lease
/// cannot end, or publish for, a run another node took over.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Claim {
    /// The entry claimed.
    pub entry: EntryId,
    /// Which claim of the entry it is: its lease's [`attempt`](Lease::attempt).
    pub attempt: u32,
}

impl Claim {
    /// The claim of `entry` that is its `attempt`-th.
    pub fn new(entry: EntryId, attempt: u32) -> Self {
        Self { entry, attempt }
    }
}

/// A task claimed under a lease.
#[derive(Debug, Clone, PartialEq)]
pub struct Lease<P> {
    /// Its entry id.
    pub entry: EntryId,
    /// The task.
    pub task: ScheduledTask<P>,
    /// How many times it has been claimed, this claim included.
    pub attempt: u32,
    /// When the lease runs out unless renewed, milliseconds since the Unix epoch.
    pub expires_at_ms: u64,
    /// The trace the task was parked in ([`Carried::trace`]), if any: the claiming node's
    /// spans and events of it go on in that trace.
    pub trace: Option<TraceParent>,
}

/// A task a shared queue gave up on, to be reported to its submitter as failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeadLetter {
    /// Where its result goes.
    pub key: MailboxKey,
    /// The task.
    pub task_id: TaskId,
    /// What it cost (for the event stream).
    pub cost: ResourceCost,
    /// Why it was given up.
    pub reason: String,
    /// How it ended, as its submitter hears it.
    pub end: LetterEnd,
}

/// How a [`DeadLetter`]'s task ended, as its submitter hears it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum LetterEnd {
    /// The queue gave up on it (every attempt lost its lease, it could not be read): its
    /// submitter hears `Failed` with the reason.
    #[default]
    GivenUp,
    /// A task it depended on did not succeed (see [`DependsOn`](super::DependsOn)): its
    /// submitter hears `Cancelled`, not a failure, and its events say which parent ended
    /// how (`TaskStep::ParentFailed`).
    Cancelled {
        /// The parent's task id and how it ended; `None` for a child a node of an earlier
        /// version cancelled, which kept the words of [`DeadLetter::reason`] only.
        parent: Option<(TaskId, TaskStatus)>,
    },
    /// Its deadline passed while it waited in the queue for the tasks it depends on: its
    /// submitter hears `Expired`.
    Expired,
    /// It was shed for a task of higher priority, the queue being at its bound on parked
    /// units (see [`QueuedUnits`]): its submitter hears `QueueFull`, as
    /// a task a node's core sheds does.
    Shed,
}

/// A dead letter as the queue keeps it (see [`QueueMaintenance::list_dead_letters`]).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct KeptLetter {
    /// Its entry in the queue: what a retry or a purge names.
    pub entry: EntryId,
    /// The caller's id of the task.
    pub task_id: TaskId,
    /// Where its result goes.
    pub key: MailboxKey,
    /// What it costs.
    pub cost: ResourceCost,
    /// Its priority.
    pub priority: Priority,
    /// How many times it was claimed.
    pub attempts: u32,
    /// Why it was given up (its last failure).
    pub reason: String,
}

impl<P> Lease<P> {
    /// The claim this lease stands for: its fencing token.
    pub fn claim(&self) -> Claim {
        Claim::new(self.entry, self.attempt)
    }

    /// When a lease of `lease` taken at `now_ms` runs out, milliseconds since the Unix epoch.
    pub fn expiry(now_ms: u64, lease: Duration) -> u64 {
        now_ms.saturating_add(u64::try_from(lease.as_millis()).unwrap_or(u64::MAX))
    }
}

/// The shared queue contract. See the module docs; the conformance suite in
/// `tests/conformance/shared_queue.rs` checks every backend against it.
#[async_trait]
pub trait SharedQueue<P>: Send + Sync
where
    P: Send + 'static,
{
    /// A short name for logs and errors (`postgres`, `postgres_pgmq`).
    fn backend(&self) -> &'static str;

    /// The queue's maintenance face: rescue, dead letters, counts. A backend implements
    /// [`QueueMaintenance`] beside this trait and returns itself.
    fn maintenance(&self) -> &dyn QueueMaintenance;

    /// The order claims take the tasks of one priority in: by admission (the default), or
    /// earliest deadline first for a queue opened so. A pool ordered by deadline
    /// ([`PoolLimits::order`](crate::domain::PoolLimits::order)) needs a queue that claims in
    /// its order, and refuses to start on any other.
    fn order(&self) -> QueueOrder {
        QueueOrder::Fifo
    }

    /// Parks a task for any node. `rank_time_ms` is its admission time. A task that carries
    /// more (a scheduled start, a trace) is parked with
    /// [`enqueue_carrying`](Self::enqueue_carrying).
    async fn enqueue(
        &self,
        entry: EntryId,
        rank_time_ms: u64,
        task: ScheduledTask<P>,
    ) -> Result<(), QueueError>;

    /// Parks several tasks, each `(entry, rank_time_ms, task, carried)` as in
    /// [`enqueue_carrying`](Self::enqueue_carrying): the default parks them one after
    /// another. A node hands the queue every task it parked while its previous park was in
    /// flight, so a backend that can store them at once (a database: one statement, one
    /// commit) overrides this. One result per task, in order; a task whose entry is stored
    /// already gets `Duplicate` and does not stop the others.
    async fn enqueue_many(
        &self,
        tasks: Vec<(EntryId, u64, ScheduledTask<P>, Carried)>,
    ) -> Vec<Result<(), QueueError>> {
        let mut parked = Vec::with_capacity(tasks.len());
        for (entry, rank_time_ms, task, carried) in tasks {
            parked.push(
                self.enqueue_carrying(entry, rank_time_ms, task, carried)
                    .await,
            );
        }
        parked
    }

    /// Stores a task that `node` starts at once (it fitted the node's free capacity) as
    /// claimed by `node` under a lease of `lease` from `now_ms`, and hands it back to run: the
    /// `accepted` durability, where a task is stored before its submitter hears it was
    /// accepted. If the node dies, the lease runs out and the task is rescued like any claim,
    /// in its `trace` (see [`Carried::trace`]): the rescuer's claim hands it back.
    #[allow(clippy::too_many_arguments)]
    async fn enqueue_claimed(
        &self,
        node: &str,
        entry: EntryId,
        rank_time_ms: u64,
        task: ScheduledTask<P>,
        trace: Option<TraceParent>,
        lease: Duration,
        now_ms: u64,
    ) -> Result<Lease<P>, QueueError>;

    /// Parks a task for any node as [`enqueue`](Self::enqueue) does, with what it carries
    /// (see [`Carried`]): claimable by none before `carried.not_before_ms` (a scheduled start;
    /// from then on it ranks at `rank_time_ms` like any other), and handed to whoever claims
    /// it with its trace ([`Lease::trace`]), after every retry, hand-back and rescue. A task
    /// that carries nothing is a plain [`enqueue`](Self::enqueue). The default refuses a
    /// scheduled start, naming the backend, and parks a traced task without its trace (the
    /// claiming node then starts a trace of its own): a backend that keeps them with the
    /// task overrides this.
    async fn enqueue_carrying(
        &self,
        entry: EntryId,
        rank_time_ms: u64,
        task: ScheduledTask<P>,
        carried: Carried,
    ) -> Result<(), QueueError> {
        let Some(not_before_ms) = carried.not_before_ms else {
            return self.enqueue(entry, rank_time_ms, task).await;
        };
        crate::util::contain::drop_contained(task);
        Err(QueueError::Backend(BackendFault::plain(
            FaultKind::Refused,
            format!(
                "the {} queue cannot hold a task back until {not_before_ms} ms (a scheduled \
                 start); submit without not_before_ms, or use a queue that can (postgres, \
                 postgres_pgmq, in_memory_shared)",
                self.backend()
            ),
        )))
    }

    /// Claims the best-ranked parked task that fits `query` for `node`, leased for `lease`
    /// from `now_ms`.
    async fn claim_best_fit(
        &self,
        node: &str,
        query: &FitQuery,
        lease: Duration,
        now_ms: u64,
    ) -> Result<Option<Lease<P>>, QueueError>;

    /// Claims up to `max` tasks at once, best-ranked first, whose costs fit `query.free`
    /// together: as many calls of [`claim_best_fit`](Self::claim_best_fit), each within what
    /// the earlier claims left free, would take (a backend may take fewer, never more or
    /// worse-ranked ones). The default does exactly that; a database answers in one statement.
    async fn claim_batch(
        &self,
        node: &str,
        query: &FitQuery,
        max: usize,
        lease: Duration,
        now_ms: u64,
    ) -> Result<Vec<Lease<P>>, QueueError> {
        let mut query = *query;
        let mut leases = Vec::new();
        while leases.len() < max {
            let Some(leased) = self.claim_best_fit(node, &query, lease, now_ms).await? else {
                break;
            };
            let cost = leased.task.meta.cost;
            let left = query.free.get(cost.kind).saturating_sub(cost.units);
            query.free = query.free.with(cost.kind, left);
            leases.push(leased);
        }
        Ok(leases)
    }

    /// Extends `node`'s lease on `entry` to `now_ms + lease`; `NotClaimed` if the lease was
    /// lost (expired and rescued, or never held).
    async fn renew(
        &self,
        node: &str,
        entry: EntryId,
        lease: Duration,
        now_ms: u64,
    ) -> Result<(), QueueError>;

    /// Extends `node`'s leases on `entries`, as [`renew`](Self::renew) does each, and
    /// returns the entries whose lease it lost (expired and rescued, or never held), in the
    /// order given. The default renews one after another; a database renews them all in one
    /// statement, so a node's pass costs one round trip however many claims it holds.
    /// Another error (a database that is away) ends the call and loses no lease: the next
    /// pass tries again.
    async fn renew_many(
        &self,
        node: &str,
        entries: &[EntryId],
        lease: Duration,
        now_ms: u64,
    ) -> Result<Vec<EntryId>, QueueError> {
        let mut lost = Vec::new();
        for &entry in entries {
            match self.renew(node, entry, lease, now_ms).await {
                Ok(()) => {}
                Err(QueueError::NotClaimed(_)) => lost.push(entry),
                Err(error) => return Err(error),
            }
        }
        Ok(lost)
    }

    /// Ends `node`'s `claim`; `NotClaimed` unless `node` holds the entry under this very
    /// claim (see [`Claim`]: a claim that ran out and was taken again is refused).
    async fn settle(
        &self,
        node: &str,
        claim: Claim,
        settlement: Settlement,
    ) -> Result<(), QueueError>;

    /// Ends several of `node`'s claims, as [`settle`](Self::settle) does each (the
    /// default, one after another); a database ends them in one statement. One result per
    /// claim, in order.
    async fn settle_many(
        &self,
        node: &str,
        settlements: Vec<(Claim, Settlement)>,
    ) -> Vec<Result<(), QueueError>> {
        let mut settled = Vec::with_capacity(settlements.len());
        for (claim, settlement) in settlements {
            settled.push(self.settle(node, claim, settlement).await);
        }
        settled
    }

    /// Hands `node`'s claims back to the queue at once, as a node that stops does with the
    /// work it will not run: each entry is parked again, claimable by any node from `now_ms`
    /// at its old rank, and the claim does not count as an attempt (the task was not at
    /// fault). One result per claim, in order: `NotClaimed` unless `node` holds the entry
    /// under this very claim.
    async fn release_many(
        &self,
        node: &str,
        claims: Vec<Claim>,
        now_ms: u64,
    ) -> Vec<Result<(), QueueError>>;

    /// Parks `node`'s `claim` again for another run, claimable by any node from `at_ms` on
    /// at its old rank, after a run that failed in a way worth trying again (`reason`, kept
    /// as the entry's last error). Unlike [`release_many`](Self::release_many) the claim
    /// counts as an attempt. `NotClaimed` unless `node` holds the entry under this very
    /// claim, so a node that lost its lease retries nothing.
    async fn retry(
        &self,
        node: &str,
        claim: Claim,
        at_ms: u64,
        reason: String,
    ) -> Result<(), QueueError>;

    /// The instant the parked task `id` whose mailbox key is exactly `key` sleeps until, if
    /// it sleeps at `now_ms`: no node may claim it before then (a scheduled start, a retry's
    /// backoff). `None` when no such task is parked, or when it may be claimed now. It is
    /// what [`PoolControl::why_waiting`](crate::engine::PoolControl::why_waiting) answers
    /// for a task that sleeps in the queue rather than on a node. The default: none (a
    /// queue that keeps no sleeping task).
    async fn sleeping_until(
        &self,
        key: &MailboxKey,
        id: TaskId,
        now_ms: u64,
    ) -> Result<Option<u64>, QueueError> {
        let _ = (key, id, now_ms);
        Ok(None)
    }

    /// Removes a parked entry (cancelled, expired); `None` if it is not parked.
    async fn remove(&self, entry: EntryId) -> Result<Option<ScheduledTask<P>>, QueueError>;

    /// Removes the parked task `id` whose mailbox key is exactly `key`: a cancel that any
    /// node may take. `None` if no such task is parked (it was claimed, or never parked).
    async fn remove_task(
        &self,
        key: &MailboxKey,
        id: TaskId,
    ) -> Result<Option<ScheduledTask<P>>, QueueError>;

    /// Dependencies between the queue's tasks, if it keeps them (see
    /// [`SharedDependencies`]). The default: none, and a task with parents is refused.
    fn dependencies(&self) -> Option<&dyn SharedDependencies<P>> {
        None
    }

    /// A schedule's ticks parked once for every node, if the queue can (see
    /// [`ScheduleTicks`]). The default: none, and a pool with schedules is refused.
    fn schedule_ticks(&self) -> Option<&dyn ScheduleTicks<P>> {
        None
    }

    /// Budgets kept for every node, if the queue can keep them (see [`SharedBudgets`]).
    /// The default: none, and a pool with budgets is refused.
    fn budgets(&self) -> Option<&dyn SharedBudgets> {
        None
    }

    /// Tenant counters of a fair share by use kept for every node, if the queue claims by
    /// them (see [`SharedFairShare`]). The default: none, and each node orders only the
    /// tasks it holds.
    fn fair_share(&self) -> Option<&dyn SharedFairShare> {
        None
    }

    /// Callers kept unique across nodes, if the queue can (see [`UniqueCallers`]). The
    /// default: none, and a pool that attaches repeated submissions is refused.
    fn unique_callers(&self) -> Option<&dyn UniqueCallers> {
        None
    }

    /// A bound on the units parked for every node, if the queue can keep one (see
    /// [`QueuedUnits`]). The default: none, and a pool that sets `max_queued_units` is
    /// refused.
    fn queued_units(&self) -> Option<&dyn QueuedUnits> {
        None
    }

    /// A signal that changes whenever a task may have been parked by any node (a database's
    /// LISTEN/NOTIFY), so an idle node claims at once instead of at its next poll. `None`
    /// (the default): the node finds new work by polling.
    fn watch(&self) -> Option<tokio::sync::watch::Receiver<u64>> {
        None
    }
}

/// The maintenance of a shared queue: what keeps it healthy for every node, whichever node
/// runs it. See the module docs; the conformance suite in `tests/conformance/shared_queue.rs`
/// checks every backend against it, and [`duties`](super::duties) runs it.
#[async_trait]
pub trait QueueMaintenance: Send + Sync {
    /// Ends every claim whose lease ran out at or before `now_ms`: its task is parked again
    /// for any node, or, where the backend limits attempts and this was the last, becomes a
    /// dead letter. Returns how many claims it ended.
    async fn rescue_expired(&self, now_ms: u64) -> Result<usize, QueueError>;

    /// Takes up to `max` dead letters no node has reported yet: tasks the queue gave up on by
    /// itself (every attempt lost its lease, or the stored task could not be read), so the
    /// node stores a failure for each in its mailbox and their submitters learn how they
    /// ended. Each dead letter is returned once. The default: none (a queue that never gives
    /// up on a task).
    async fn take_dead_letters(&self, max: usize) -> Result<Vec<DeadLetter>, QueueError> {
        let _ = max;
        Ok(Vec::new())
    }

    /// The dead letters the queue keeps, oldest first, `offset..offset + limit`: tasks it
    /// gave up on (reported to their submitters or not) and runs that ended `Failed`, each
    /// with its reason, for an operator to look at, retry or purge. The default: none (a
    /// queue that keeps no dead letters).
    async fn list_dead_letters(
        &self,
        offset: usize,
        limit: usize,
    ) -> Result<Vec<KeptLetter>, QueueError> {
        let _ = (offset, limit);
        Ok(Vec::new())
    }

    /// Parks dead letter `entry` again for any node, at its old rank and with its attempts
    /// counted afresh (its first run since was its last failure). `false` when the queue
    /// keeps no dead letter `entry`. The task's submitter was told it failed; a retried
    /// task stores a second outcome under the same key when it ends.
    async fn retry_dead_letter(&self, entry: EntryId) -> Result<bool, QueueError> {
        let _ = entry;
        Ok(false)
    }

    /// Deletes dead letter `entry`, or with `None` every dead letter of the queue; returns
    /// how many it deleted.
    async fn purge_dead_letters(&self, entry: Option<EntryId>) -> Result<usize, QueueError> {
        let _ = entry;
        Ok(0)
    }

    /// How many entries are parked and claimed (by any node).
    async fn counts(&self) -> Result<QueueCounts, QueueError>;
}
