//! Rule 25: tickets of several kinds. A ticket may need units of other kinds beside its
//! first cost ([`Ticket::also`](super::Ticket::also)): it starts only when every one fits,
//! holds them all while it runs and gives them all back when it ends.
//!
//! Parked, such a ticket is in a [`MultiIndex`](super::multi_index::MultiIndex) rather than
//! a cost index of its first kind, keyed by its *dominant* kind: the one of which it needs
//! the largest share of the pool's capacity. Its extra costs are kept beside it
//! (`ParkingLot::extras`), so that a parked ticket of one kind costs no byte more.

use super::multi_index::Demand;
use super::ParkingLot;
use crate::domain::{ExtraCosts, ResourceKind, TaskId};

impl ParkingLot {
    /// The free units of every kind, by kind index.
    pub(super) fn free_units(&self) -> Demand {
        ResourceKind::ALL.map(|kind| self.free(kind))
    }

    /// The kind of which `demand` takes the largest share of the pool's capacity (the first
    /// such kind on a tie): the key of the ticket's trie.
    pub(super) fn dominant_kind(&self, demand: &Demand) -> ResourceKind {
        let share = |kind: ResourceKind| {
            let capacity = u64::from(self.limits.capacity.get(kind).max(1));
            // Compared as fractions `units / capacity` by cross-multiplication: exact.
            (u64::from(demand[kind.index()]), capacity)
        };
        ResourceKind::ALL
            .into_iter()
            .reduce(|best, kind| {
                let (a_units, a_capacity) = share(best);
                let (b_units, b_capacity) = share(kind);
                if u128::from(b_units) * u128::from(a_capacity)
                    > u128::from(a_units) * u128::from(b_capacity)
                {
                    kind
                } else {
                    best
                }
            })
            .unwrap_or(ResourceKind::Cpu)
    }

    /// What live ticket `id` needs beside its first cost, running, parked, sleeping or held
    /// (rule 25): none for a ticket of one kind or one the lot does not hold.
    pub fn extra_costs(&self, id: TaskId) -> ExtraCosts {
        if let Some(claim) = self.running.get(&id) {
            return claim.also;
        }
        if let Some((_, ticket)) = self.sleepers.get(&id) {
            return ticket.also;
        }
        if let Some(ticket) = self.dependencies.ticket(id) {
            return ticket.also;
        }
        self.extras_of(id)
    }

    /// What parked ticket `id` needs beside its first cost (none for a ticket of one kind).
    pub(super) fn extras_of(&self, id: TaskId) -> ExtraCosts {
        if self.extras.is_empty() {
            return ExtraCosts::NONE;
        }
        self.extras.get(&id).copied().unwrap_or(ExtraCosts::NONE)
    }
}
