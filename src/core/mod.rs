//! The core vocabulary of a pool: limits, task metadata, statuses, errors, and the pure
//! parking-lot state machine ([`scheduling`]).

pub use prometheus_parking_lot_actors::domain::{
    Capacity, PoolError, PoolLimits, ScheduledTask, StarvationGuard, TaskMetadata, TaskStatus,
    WakeState,
};

/// The pure parking-lot core: admit, complete, cancel and tick with an explicit `now`, and
/// get decisions back. See `PARKING_LOT.md` for the algorithm.
pub mod scheduling {
    pub use prometheus_parking_lot_actors::scheduler::core::*;
}
