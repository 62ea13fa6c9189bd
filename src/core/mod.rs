//! The core of the public API: pools, executors, backend traits, limits, statuses, errors,
//! and the pure parking-lot state machine ([`scheduling`]).

pub use crate::pool::resource_pool::ResourcePool;
pub use crate::pool::worker_pool::{WorkerExecutor, WorkerPool};
pub use prometheus_parking_lot_actors::domain::{
    Budget, Budgets, Capacity, Durability, FairShare, OnDuplicate, PoolError, PoolLimits,
    Preemption, Retries, ScheduledTask, StartCap, StarvationGuard, TaskMetadata, TaskStatus,
    WakeState,
};
pub use prometheus_parking_lot_actors::engine::PoolClient;
pub use prometheus_parking_lot_actors::events::{EventSubscriber, TaskEvent, TaskStep};
pub use prometheus_parking_lot_actors::executor::TaskExecutor;
pub use prometheus_parking_lot_actors::mailbox::{
    json_result, Delivery, FencedDelivery, InlineMailbox, Mailbox, MailboxError, Notifier,
    ResultEncoder, TerminalEvent,
};
pub use prometheus_parking_lot_actors::queue::{
    Claim, DeadLetter, DeadLetterReader, EntryId, FitQuery, InlineQueue, KeptLetter, Lease,
    LeaseRenewer, LeaseRescuer, QueueCounts, QueueError, QueueMaintenance, RankBound, Settlement,
    SharedQueue, StarvationRule, StoredEntry, TaskQueue,
};
pub use prometheus_parking_lot_actors::scheduler::protocol::{
    SchedulerRequest, ShutdownReport, SubmitOptions,
};
pub use prometheus_parking_lot_actors::scheduler::shared::SharedParking;
pub use prometheus_parking_lot_actors::spawn::{BoxTask, Spawn};
pub use prometheus_parking_lot_actors::stats::{BudgetStats, PoolStats};
pub use prometheus_parking_lot_actors::supervisor::RestartPolicy;

/// The pure parking-lot core: admit, complete, cancel and tick with an explicit `now`, and
/// get decisions back. See `PARKING_LOT.md` for the algorithm.
pub mod scheduling {
    pub use prometheus_parking_lot_actors::scheduler::core::*;
}
