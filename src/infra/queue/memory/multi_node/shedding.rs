//! A bound on the units parked in the in-memory shared queue, for every pool that shares it
//! ([`QueuedUnits`]): rule 21 of the scheduling core over the queue's parked tasks.
//!
//! The queue keeps the units parked of each kind as a sum that [`Lot::park`] and
//! [`Lot::unpark`] update, so a newcomer learns in O(1) whether it fits. One that does not
//! sheds the worst-ranked parked tasks of its kind (each kind's cost index keeps its
//! worst), while they are of a strictly lower priority; it first checks, in one pass over
//! the parked tasks, that those could make the room at all, so a refusal sheds nothing.

use async_trait::async_trait;

use super::dependencies::letter_of;
use super::{InMemorySharedQueue, Lot, Parked};
use crate::core::{
    EntryId, LetterEnd, QueueError, QueuedUnits, TaskStatus, SHED_FOR_HIGHER_PRIORITY,
};

#[async_trait]
impl<P: Send + 'static> QueuedUnits for InMemorySharedQueue<P> {
    async fn bound_queued_units(&self, max_queued_units: u64) -> Result<(), QueueError> {
        self.lock().max_queued_units = Some(max_queued_units);
        Ok(())
    }
}

impl<P> Lot<P> {
    /// Parks `parked` under `entry` within the bound, shedding lower priorities as rule 21
    /// does; refuses it, shedding nothing, where they could not make the room.
    pub(super) fn park_within(
        &mut self,
        entry: EntryId,
        parked: Parked<P>,
        bound: u64,
    ) -> Result<(), QueueError> {
        let cost = parked.task.meta.cost;
        let priority = parked.task.meta.priority;
        let queued = self.queued_units[cost.kind.index()];
        let over = (queued + u64::from(cost.units)).saturating_sub(bound);
        let refused = QueueError::UnitsFull {
            kind: cost.kind,
            needed: cost.units,
            max_queued_units: bound,
        };
        if u64::from(cost.units) > bound {
            return Err(refused);
        }
        if over > 0 {
            let below: u64 = self
                .parked
                .values()
                .map(|parked| &parked.task.meta)
                .filter(|meta| meta.cost.kind == cost.kind && meta.priority < priority)
                .map(|meta| u64::from(meta.cost.units))
                .sum();
            if below < over {
                return Err(refused);
            }
        }
        self.park(entry, parked);
        let mut freed = 0;
        while freed < over {
            let Some(worst) = self.by_kind[cost.kind.index()].worst() else {
                break;
            };
            if worst.priority() >= priority {
                break;
            }
            let Some(shed) = self.unpark(worst.id()) else {
                break;
            };
            freed += u64::from(shed.task.meta.cost.units);
            let letter = letter_of(&shed.task, SHED_FOR_HIGHER_PRIORITY.into(), LetterEnd::Shed);
            self.dead.push_back(letter);
            let status = TaskStatus::Rejected(SHED_FOR_HIGHER_PRIORITY.into());
            self.ended(worst.id(), &shed.task, Some(status));
        }
        Ok(())
    }
}
