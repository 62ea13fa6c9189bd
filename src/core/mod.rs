//! The core of the public API: the pool and its executor, the backend traits, limits,
//! statuses, errors, what an operator reads of a pool, and the pure parking-lot state machine
//! ([`scheduling`]).
//!
//! Every name here has this module as its one home. [`WorkerPool`], [`TaskMetadata`],
//! [`ScheduledTask`] and [`PoolError`] are also at the crate root, where most code imports
//! them; [`ResourcePool`] and [`TaskExecutor`] live at the crate root and appear here too
//! only because code written for the upstream crate imports them from here.

pub use crate::pool::resource_pool::ResourcePool;
pub use crate::pool::worker_pool::{WorkerExecutor, WorkerPool};
pub use prometheus_parking_lot_actors::domain::{
    Admission, BackendError, BackendFault, Budget, Budgets, Capacity, DependencyError, Durability,
    FairByUse, FairShare, FaultKind, OnDuplicate, OnGiveUp, PoolError, PoolLimits, Preemption,
    QueueOrder, Retries, ScheduledTask, StartCap, StarvationGuard, TaskFailure, TaskMetadata,
    TaskStatus, TenantWeights, UsageCharge, WakeState, DEFAULT_STREAM_IDLE_MS, MAX_PARENTS,
};
pub use prometheus_parking_lot_actors::engine::{PoolClient, PoolControl};
pub use prometheus_parking_lot_actors::mailbox::{
    json_result, Delivery, FencedDelivery, InlineMailbox, Mailbox, MailboxError, Notifier,
    ResultEncoder, TerminalEvent,
};
pub use prometheus_parking_lot_actors::observe::events::{
    BudgetReading, EventFeed, EventSubscriber, FeedEvent, PoolReading, Refusal, TaskEvent, TaskStep,
};
pub use prometheus_parking_lot_actors::observe::stats::{BudgetStats, PoolStats};
pub use prometheus_parking_lot_actors::observe::trace::{BadTraceParent, TraceParent};
pub use prometheus_parking_lot_actors::queue::{
    parent_ended_words, Carried, Claim, DeadLetter, DeadLetterReader, DependsOn, EntryId, FitQuery,
    HeldBy, InlineQueue, KeptLetter, Lease, LeaseRenewer, LeaseRescuer, LetterEnd, QueueCounts,
    QueueError, QueueMaintenance, QueuedUnits, RankBound, RunUse, ScheduleTicks, Settlement,
    SharedBudgets, SharedDependencies, SharedFairShare, SharedQueue, StarvationRule, StoredEntry,
    StoredHold, StoredParent, TaskQueue, UniqueCallers, DEPENDENCIES_SUPPORTED, HELD_PAST_DEADLINE,
    QUEUED_UNITS_SUPPORTED, SHED_FOR_HIGHER_PRIORITY,
};
pub use prometheus_parking_lot_actors::scheduler::inspect::{
    PoolSnapshot, PoolView, TaskView, TenantView, WaitView,
};
pub use prometheus_parking_lot_actors::scheduler::protocol::{ShutdownReport, SubmitOptions};
pub use prometheus_parking_lot_actors::scheduler::SharedParking;
pub use prometheus_parking_lot_actors::supervisor::spawn::{BoxTask, Spawn};
pub use prometheus_parking_lot_actors::supervisor::RestartPolicy;
pub use prometheus_parking_lot_actors::worker::executor::TaskExecutor;

/// The pure parking-lot core: admit, complete, cancel and tick with an explicit `now`, and
/// get decisions back. See `PARKING_LOT.md` for the algorithm.
///
/// ```
/// use prometheus_parking_lot::core::scheduling::{Admit, ParkingLot, Ticket};
/// use prometheus_parking_lot::core::PoolLimits;
/// use prometheus_parking_lot::{Priority, ResourceCost};
///
/// let mut lot = ParkingLot::new(PoolLimits::new(24, 4))?;
/// let llm = |id, units| Ticket {
///     id,
///     priority: Priority::Normal,
///     cost: ResourceCost::gpu_vram(units),
///     created_at_ms: 0,
///     deadline_ms: None,
///     tenant: 0,
///     timeout_ms: None,
///     also: Default::default(),
/// };
/// assert_eq!(lot.admit(llm(1, 16), 0), Admit::Start);
/// assert_eq!(lot.admit(llm(2, 16), 0), Admit::Park);
/// // Task 1 ends at t = 10 ms: task 2 fits now and starts.
/// assert_eq!(lot.complete(1, 10).unwrap(), vec![2]);
/// # Ok::<(), prometheus_parking_lot::PoolError>(())
/// ```
pub mod scheduling {
    pub use prometheus_parking_lot_actors::scheduler::core::{
        AbsorbRefusal, Admit, AdmitParts, Cancel, Newcomer, ParkingLot, RankKey, Rejection,
        Released, StartEstimate, TenantKey, Tick, Ticket, TokenBucket, UnknownTask, WaitReason,
    };
}
