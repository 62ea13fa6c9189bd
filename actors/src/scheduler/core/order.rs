//! Rule 20: the order of parked tickets within a priority.
//!
//! The rank is `(priority, due, created_at_ms, id)`. Under the fifo order `due` is one
//! constant for every ticket, so the rank orders exactly as `(priority, created_at_ms, id)`
//! did before the order existed; under the deadline order `due` is the ticket's deadline
//! (none ranks last). Nothing else changes: every index and every rule compares ranks, so
//! each follows whichever order the key encodes, and the starvation guard ages tickets by
//! the time they were parked, which no order touches. A ticket's order is fixed when it
//! parks (the limits do not change while the lot lives), so its key never moves in an index.

use super::{Parked, ParkingLot, RankKey, Ticket};
use crate::domain::{QueueOrder, TaskId};

impl ParkingLot {
    /// Whether parked tickets rank by deadline within a priority (rule 20).
    pub(super) fn orders_by_deadline(&self) -> bool {
        self.limits.order == QueueOrder::Deadline
    }

    /// The rank `ticket` has, or would have, in this lot.
    pub(super) fn rank_of(&self, ticket: &Ticket) -> RankKey {
        let due = ticket.deadline_ms.filter(|_| self.orders_by_deadline());
        RankKey::by_deadline(ticket.priority, due, ticket.created_at_ms, ticket.id)
    }

    /// The rank of parked ticket `id` (sleepers have none yet), for a view of the order.
    ///
    /// ```
    /// use prometheus_parking_lot_actors::domain::{PoolLimits, Priority, QueueOrder, ResourceCost};
    /// use prometheus_parking_lot_actors::scheduler::core::{Admit, ParkingLot, Ticket};
    ///
    /// let limits = PoolLimits::new(4, 1).with_order(QueueOrder::Deadline);
    /// let mut lot = ParkingLot::new(limits).unwrap();
    /// let ticket = |id, deadline_ms| Ticket {
    ///     id,
    ///     priority: Priority::Normal,
    ///     cost: ResourceCost::gpu_vram(4),
    ///     created_at_ms: id,
    ///     deadline_ms,
    ///     tenant: 0,
    ///     timeout_ms: None,
    ///     also: Default::default(),
    /// };
    /// assert_eq!(lot.admit(ticket(1, None), 0), Admit::Start);
    /// assert_eq!(lot.admit(ticket(2, None), 0), Admit::Park);
    /// assert_eq!(lot.admit(ticket(3, Some(900)), 0), Admit::Park);
    /// assert_eq!(lot.admit(ticket(4, Some(500)), 0), Admit::Park);
    /// assert!(lot.rank(4).unwrap().ranks_ahead_of(&lot.rank(3).unwrap()));
    /// // Task 1 ends: the earliest deadline starts, though it came last.
    /// assert_eq!(lot.complete(1, 10).unwrap(), vec![4]);
    /// assert_eq!(lot.complete(4, 20).unwrap(), vec![3]);
    /// assert_eq!(lot.complete(3, 30).unwrap(), vec![2]);
    /// ```
    pub fn rank(&self, id: TaskId) -> Option<RankKey> {
        self.parked.get(&id).map(|parked| parked.rank(id))
    }
}

impl Parked {
    /// The deadline this parked ticket ranks by: its own under the deadline order, none
    /// under fifo.
    pub(super) fn due(&self) -> Option<u64> {
        self.deadline_ms.filter(|_| self.by_deadline)
    }
}
