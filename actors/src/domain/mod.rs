//! The domain vocabulary: what a task is, what it costs, where its result goes and how it
//! ends. These types cross every boundary (actors, queues, mailboxes, configuration), so
//! they are plain data with serde support.

mod backend;
mod budget;
mod dependency;
mod durability;
mod error;
mod fair_by_use;
mod limits;
mod mailbox_key;
mod order;
mod resource;
mod status;
mod task;
mod waiters;

pub use backend::{BackendError, BackendFault, FaultKind};
pub use budget::{Budget, Budgets, StartCap, MAX_PERIOD_MS};
pub use dependency::{DependencyError, MAX_PARENTS};
pub use durability::Durability;
pub use error::{DeadlineMiss, PoolError, TaskFailure};
pub use fair_by_use::{FairByUse, TenantWeights, UsageCharge, MAX_WEIGHT};
pub use limits::{
    Admission, Capacity, FairShare, OnDuplicate, PoolLimits, Preemption, Retries, StarvationGuard,
};
pub use mailbox_key::{MailboxKey, TenantId};
pub use order::QueueOrder;
pub use resource::{ExtraCosts, ResourceCost, ResourceKind};
pub use status::{status_of, TaskStatus, WakeState};
pub use task::{Priority, ScheduledTask, TaskId, TaskMetadata};
pub use waiters::{OnGiveUp, DEFAULT_STREAM_IDLE_MS, MAX_STREAM_IDLE_MS};
