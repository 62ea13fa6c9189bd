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

    /// The kind `demand` needs the most units of (the first such kind on a tie): the key of
    /// the ticket's trie. A kind a ticket needs only a few units of (an engine slot, one
    /// request) can take only a few values, so the kinds left to check at a leaf are the
    /// ones that vary least.
    pub(super) fn key_kind(demand: &Demand) -> ResourceKind {
        ResourceKind::ALL
            .into_iter()
            .reduce(|most, kind| {
                if demand[kind.index()] > demand[most.index()] {
                    kind
                } else {
                    most
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
