//! What a shared queue may do beyond its contract: each a trait of its own, which a backend
//! implements where it can and hands out through [`SharedQueue`]'s accessor of the same name
//! (`None`: it cannot). The node asks for a capability once, where a feature needs it: a pool
//! with budgets asks for [`SharedBudgets`] as it starts and is refused without it, a task
//! with parents asks for [`SharedDependencies`] as it parks, and so on. A feature that is
//! not used asks for nothing and costs nothing.
//!
//! | capability | the node asks for it when | without it |
//! |---|---|---|
//! | [`SharedDependencies`] | a task names parents | the task is refused, naming the queues that keep them |
//! | [`ScheduleTicks`] | the pool has schedules | the schedule is refused |
//! | [`SharedBudgets`] | the pool has budgets | the pool is refused |
//! | [`SharedFairShare`] | the pool shares fairly by use | each node orders only the tasks it holds |
//! | [`UniqueCallers`] | the pool attaches repeated submissions | the pool is refused |
//! | [`QueuedUnits`] | the pool sets `max_queued_units` | the pool is refused |
//!
//! A new cross-node feature adds a trait here and an accessor to [`SharedQueue`]; the
//! backends that can do it implement the trait, and the others change nothing.

use async_trait::async_trait;

use super::{Carried, EntryId, QueueError, SharedQueue};
use crate::domain::{
    BackendFault, Budgets, DependencyError, FairByUse, FaultKind, MailboxKey, ResourceKind,
    ScheduledTask, TaskId, TaskStatus, TenantId, TenantWeights,
};

/// The queues that keep dependencies, as a refusal names them.
pub const DEPENDENCIES_SUPPORTED: &str =
    "memory (the in-memory queue), yaque (the embedded durable queue), postgres (the Postgres \
     table queue with \"dependencies\": true), postgres_pgmq (the pgmq queue with \"dependencies\": \
     true), in_memory_shared (the in-memory shared queue)";

/// The shared queues that bound the units parked for every node, as a refusal names them.
pub const QUEUED_UNITS_SUPPORTED: &str =
    "postgres (the Postgres table queue), postgres_pgmq (the pgmq queue), in_memory_shared \
     (the in-memory shared queue), or a local queue (in_memory, yaque)";

/// The reason a task shed from a shared queue for one of higher priority carries (its dead
/// letter's, and its row's on the Postgres table queue).
pub const SHED_FOR_HIGHER_PRIORITY: &str =
    "shed for a task of higher priority: the queue held its max_queued_units";

/// The reason a child that expired while it waited for its parents carries (its dead
/// letter's, and its row's on the Postgres table queue), on every queue that keeps
/// dependencies.
pub const HELD_PAST_DEADLINE: &str =
    "its deadline passed while it waited for the tasks it depends on";

/// How a parent that ended `status` without succeeding is named in the reason its waiting
/// children are cancelled with ("task 7 it depends on failed: out of memory"), the same on
/// every queue that keeps dependencies.
///
/// ```
/// use prometheus_parking_lot_actors::domain::TaskStatus;
/// use prometheus_parking_lot_actors::queue::parent_ended_words;
///
/// assert_eq!(parent_ended_words(&TaskStatus::Cancelled), "was cancelled");
/// assert_eq!(parent_ended_words(&TaskStatus::Failed("oom".into())), "failed: oom");
/// ```
pub fn parent_ended_words(status: &TaskStatus) -> String {
    match status {
        TaskStatus::Cancelled => "was cancelled".to_owned(),
        TaskStatus::Expired => "expired before it could start".to_owned(),
        TaskStatus::TimedOut => "timed out".to_owned(),
        TaskStatus::Failed(reason) => format!("failed: {reason}"),
        TaskStatus::Rejected(reason) => format!("was refused: {reason}"),
        other => format!("ended {other:?}"),
    }
}

/// The error of a node that asks `queue` for a capability it lacks: "the {backend} queue
/// cannot {what}".
pub fn lacking<P: Send + 'static>(queue: &dyn SharedQueue<P>, what: &str) -> QueueError {
    QueueError::Backend(BackendFault::plain(
        FaultKind::Other,
        format!("the {} queue cannot {what}", queue.backend()),
    ))
}

/// The refusal of a task with parents on `queue`, which keeps no dependencies.
pub fn no_dependencies<P: Send + 'static>(queue: &dyn SharedQueue<P>) -> QueueError {
    QueueError::Dependency(Box::new(DependencyError::Unsupported {
        queue: format!("the shared queue {}", queue.backend()),
        supported: DEPENDENCIES_SUPPORTED.into(),
    }))
}

/// The tasks a task waits for in a shared queue ([`SharedDependencies::enqueue_waiting`]):
/// callers of the task's own tenant, by task id, wherever they run.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct DependsOn {
    /// The parents' task ids (no repeats, not the task itself).
    pub parents: Vec<TaskId>,
    /// Whether the task runs even when a parent does not succeed (a cleanup step).
    pub run_anyway: bool,
}

/// Dependencies between the tasks of a shared queue: a task parked waiting for its parents,
/// wherever they run.
#[async_trait]
pub trait SharedDependencies<P>: Send + Sync
where
    P: Send + 'static,
{
    /// Parks `task` for any node as [`SharedQueue::enqueue`] does, held until every one of
    /// `depends_on`'s parents (tasks of its mailbox key's tenant in this queue) has
    /// succeeded, and not before `carried`'s instant if it has one (in its trace, if it has
    /// one); from then on it ranks at `rank_time_ms` like any other. A parent that does not
    /// succeed ends it `Cancelled` (a [`DeadLetter`](super::DeadLetter) with `cancelled`),
    /// unless it runs anyway. A parent unknown to the queue, of another tenant, the task
    /// itself, or one that ended without succeeding (unless it runs anyway) refuses it with
    /// [`QueueError::Dependency`]. Answers how many parents it waits for (0: every one had
    /// succeeded already, and it is parked, or sleeps until its instant).
    async fn enqueue_waiting(
        &self,
        entry: EntryId,
        rank_time_ms: u64,
        task: ScheduledTask<P>,
        carried: Carried,
        depends_on: &DependsOn,
    ) -> Result<u32, QueueError>;

    /// How many parents the parked task `id` of exactly `key` still waits for, if it is
    /// parked in the queue waiting for any.
    async fn waiting_parents(
        &self,
        key: &MailboxKey,
        id: TaskId,
    ) -> Result<Option<u32>, QueueError>;
}

/// A schedule's ticks, parked once for all the nodes that share the queue.
#[async_trait]
pub trait ScheduleTicks<P>: Send + Sync
where
    P: Send + 'static,
{
    /// Parks `task` as tick `tick_ms` of schedule `schedule`, unless the queue holds that
    /// tick already: of all the calls for one (schedule, tick) on one queue, from any node,
    /// at any time, exactly one parks its task (the queue keeps the tick's key and the task
    /// in one transaction, so a crash between them keeps neither). Returns whether this
    /// call parked it. See [`crate::schedule`].
    async fn enqueue_tick(
        &self,
        schedule: &str,
        tick_ms: u64,
        entry: EntryId,
        task: ScheduledTask<P>,
    ) -> Result<bool, QueueError>;

    /// The latest tick of schedule `schedule` the queue holds (see
    /// [`enqueue_tick`](Self::enqueue_tick)), milliseconds since the Unix epoch; `None`
    /// when no node enqueued one.
    async fn latest_tick(&self, schedule: &str) -> Result<Option<u64>, QueueError>;
}

/// Budgets (renewable capacity, see [`Budget`](crate::domain::Budget)) kept by the queue
/// for every node.
#[async_trait]
pub trait SharedBudgets: Send + Sync {
    /// Keeps `budgets` for every node of this queue: a claim then spends from each kind's
    /// bucket in the same step that takes the tasks, so that the nodes together spend at
    /// most what one pool with these budgets would (no task of such a kind is claimed past
    /// its bucket's level, nor past its start cap). The buckets live with the queue (a
    /// database row), start full, and refill by one clock (the database's). A node calls it
    /// as it starts; every node of one queue is to be given the same budgets: the latest
    /// call sets them, and a bucket keeps its level (at most its new burst).
    async fn share_budgets(&self, budgets: &Budgets) -> Result<(), QueueError>;

    /// Puts `units` back into the shared bucket of `kind` (at most its burst): a task
    /// claimed under it used fewer than it spent. Nothing for a kind without a shared
    /// budget.
    async fn give_back_budget(&self, kind: ResourceKind, units: u32) -> Result<(), QueueError>;
}

/// What a run of a claimed task used, for the fleet's fair share by use to settle the charge
/// its claim made ([`SharedFairShare::settle_use`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RunUse {
    /// The units the task declared (the claim charged ahead from them).
    pub units: u32,
    /// Units times the milliseconds it held them (`held`).
    pub held_unit_ms: f64,
    /// The units its executor reported using (`reported`), if it reported any.
    pub reported: Option<u64>,
    /// When the run started, ms since the Unix epoch: a refund gives back the charge as it
    /// has decayed since.
    pub started_ms: u64,
}

/// Claims ordered by tenant counters the whole fleet shares: a fair share by use across
/// nodes.
#[async_trait]
pub trait SharedFairShare: Send + Sync {
    /// Orders the claims of this queue's nodes by the shared counters (a fair share by use,
    /// `order`, with the named tenants' `weights`): a claim takes each task for the tenant
    /// the fleet served least among those with a task that fits (within the best priority
    /// that does), and charges the task ahead in the same step, divided by its tenant's
    /// weight: its declared units (`reported`), or its units times `timeout_ms`, the node's
    /// execution timeout (`held`; nothing ahead without one). When the run ends the node
    /// settles the charge to what it used ([`settle_use`](Self::settle_use)). A node calls
    /// it as it starts; every node of one queue is to be given the same order and timeout.
    async fn share_fair_by_use(
        &self,
        order: FairByUse,
        weights: &TenantWeights,
        timeout_ms: Option<u64>,
    ) -> Result<(), QueueError>;

    /// Settles the fleet's charge for a run of `tenant`'s task that this node claimed and
    /// that ended, to what it used (`used`): what it did not use is given back, never
    /// taking the counter below the lowest counter of the tenants waiting; a `held` task
    /// charged nothing ahead (no timeout) is charged in full now. Nothing before
    /// [`share_fair_by_use`](Self::share_fair_by_use).
    async fn settle_use(&self, tenant: &TenantId, used: RunUse) -> Result<(), QueueError>;
}

/// Callers kept unique across the nodes of a queue, so that a repeated submission attaches
/// to the original wherever it runs.
#[async_trait]
pub trait UniqueCallers: Send + Sync {
    /// Keeps callers unique from now on, for every node: a task whose caller (its mailbox
    /// key's tenant and its task id) has a task parked or claimed in the queue under this
    /// rule, or one that completed in the last minute, is not stored (`enqueue` answers
    /// `Duplicate`), checked in the statement that stores it (a database's unique index),
    /// never by a look before it. The minute closes the race between a resubmission and the
    /// original's end: a node's look for a stored result before it parks may come just
    /// before the original ends, its park just after. A node of a pool that attaches
    /// repeated submissions (`OnDuplicate::Attach`) calls it as it starts.
    async fn keep_callers_unique(&self) -> Result<(), QueueError>;

    /// The mailbox key of the task of caller (`tenant`, `id`) parked or claimed in the queue
    /// under [`keep_callers_unique`](Self::keep_callers_unique) (or completed within the
    /// minute, where the backend still knows its key), if there is one: the original a
    /// repeated submission attaches to.
    async fn live_task_key(
        &self,
        tenant: &TenantId,
        id: TaskId,
    ) -> Result<Option<MailboxKey>, QueueError>;
}

/// A bound on the units parked in a shared queue, kept for every node: core rule 21 of the
/// scheduling core (`max_queued_units`, shedding the lowest priority first) over what the
/// whole fleet parks, not what one node holds.
#[async_trait]
pub trait QueuedUnits: Send + Sync {
    /// From now on, every park through this handle keeps the units parked of each kind
    /// (tasks claimable now or once due; not a scheduled start still asleep, nor a child
    /// waiting for its parents) within `max_queued_units`, in the statement that parks.
    /// A newcomer that would pass it sheds the lowest-ranked parked tasks of its kind of a
    /// strictly lower priority, as many as make room: each becomes a
    /// [`DeadLetter`](super::DeadLetter) whose end is [`LetterEnd::Shed`](super::LetterEnd),
    /// so its submitter hears `QueueFull` through whichever node reads it. Where they could
    /// not make room, nothing is shed and the newcomer is refused with
    /// [`QueueError::UnitsFull`]. A task that comes back (a retry, a rescue, a hand-back)
    /// parks whatever the bound, as it does in a node's core. A node of a pool that sets
    /// `max_queued_units` calls it as it starts; every node of a queue sets the same bound.
    async fn bound_queued_units(&self, max_queued_units: u64) -> Result<(), QueueError>;
}
