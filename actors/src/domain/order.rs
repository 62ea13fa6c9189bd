//! How a pool orders its parked tasks within one priority, and the bound on what it parks
//! by units: the two settings of service-level-aware admission (core rules 20 and 21).

use serde::{Deserialize, Serialize};

use super::PoolError;

/// The order of parked tasks that share a priority.
///
/// Priority always comes first. Within a priority, `Fifo` (the default) ranks by admission,
/// oldest first. `Deadline` ranks the task whose deadline comes first ahead, the tasks without
/// a deadline after every task with one, and tasks with the same deadline (or none) by
/// admission: a serving engine's earliest-deadline-first, so that the request whose answer is
/// due soonest is the one the next free units go to. Skip-ahead, the starvation guard,
/// backfill and the fair share apply unchanged: they read this order wherever they read the
/// rank, and the starvation guard still measures age by the time parked.
///
/// ```
/// use prometheus_parking_lot_actors::domain::{PoolLimits, QueueOrder};
/// assert_eq!(PoolLimits::new(8, 2).order, QueueOrder::Fifo);
/// let limits = PoolLimits::new(8, 2).with_order(QueueOrder::Deadline);
/// assert_eq!(limits.order, QueueOrder::Deadline);
/// assert_eq!(QueueOrder::Deadline.name(), "deadline");
/// ```
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[serde(rename_all = "snake_case")]
pub enum QueueOrder {
    /// By admission, oldest first.
    #[default]
    Fifo,
    /// Earliest deadline first; tasks without a deadline last; by admission among equals.
    Deadline,
}

impl QueueOrder {
    /// The order's name in a configuration file.
    pub const fn name(self) -> &'static str {
        match self {
            QueueOrder::Fifo => "fifo",
            QueueOrder::Deadline => "deadline",
        }
    }
}

/// Checks a bound on the units a pool parks (`max_queued_units`).
pub(super) fn validate_max_queued_units(bound: Option<u64>) -> Result<(), PoolError> {
    if bound == Some(0) {
        return Err(PoolError::InvalidConfig(
            "max_queued_units is 0; use at least 1, or leave it out to bound the queue by \
             max_queue_depth alone"
                .into(),
        ));
    }
    Ok(())
}
