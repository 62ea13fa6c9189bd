//! The parked tickets' indexes: parking a ticket in each (by cost, deadline, park time,
//! tenant, timeout), removing it from each, cancelling a live ticket, and emptying the lot
//! at shutdown.

use super::shedding::QueueBook;
use super::{
    saturate_timeout, Cancel, CostIndex, Parked, ParkingLot, RankKey, TenantKey, Ticket,
    UnknownTask, NO_TIMEOUT,
};
use crate::domain::{ExtraCosts, ResourceCost, ResourceKind, TaskId};

impl ParkingLot {
    /// Cancels a live task. A parked one is removed (and tasks it blocked may start); a
    /// running one keeps its capacity until the driver stopped it and called `complete`.
    pub fn cancel(&mut self, id: TaskId, now: u64) -> Result<Cancel, UnknownTask> {
        if self.running.contains_key(&id) {
            return Ok(Cancel::Running);
        }
        if let Some((until, _)) = self.sleepers.remove(&id) {
            self.sleeping.remove(&(until, id));
            return Ok(Cancel::Parked {
                started: Vec::new(),
            });
        }
        if self.cancel_held(id) {
            return Ok(Cancel::Parked {
                started: Vec::new(),
            });
        }
        if self.remove_parked(id).is_none() {
            return Err(UnknownTask::NotLive(id));
        }
        let mut started = Vec::new();
        self.unpark(now, &mut started);
        Ok(Cancel::Parked { started })
    }

    /// Removes every parked task (for shutdown) and returns their ids, best-ranked first.
    pub fn take_parked(&mut self) -> Vec<TaskId> {
        let mut ranks: Vec<RankKey> = self
            .parked
            .iter()
            .map(|(&id, parked)| parked.rank(id))
            .collect();
        ranks.sort_unstable();
        let mut sleepers: Vec<TaskId> = self.sleeping.iter().map(|&(_, id)| id).collect();
        sleepers.extend(self.dependencies.take_all());
        self.sleeping.clear();
        self.sleepers.clear();
        self.parked.clear();
        self.by_cost = Default::default();
        self.permits_by_cost = Default::default();
        self.several = Default::default();
        self.several_permits = Default::default();
        self.extras.clear();
        self.by_deadline.clear();
        self.by_park_time.clear();
        self.starving.clear();
        self.queue = QueueBook::default();
        if let Some(book) = &mut self.tenants {
            book.clear_parked();
        }
        if let Some(by_timeout) = &mut self.by_timeout {
            by_timeout.clear();
        }
        ranks
            .into_iter()
            .map(|rank| rank.id())
            .chain(sleepers)
            .collect()
    }

    /// The index that holds a parked task or permit of `kind`.
    fn index_mut(&mut self, kind: ResourceKind, slotless: bool) -> &mut CostIndex {
        if slotless {
            &mut self.permits_by_cost[kind.index()]
        } else {
            &mut self.by_cost[kind.index()]
        }
    }

    pub(super) fn park(&mut self, ticket: Ticket, slotless: bool, now: u64) {
        let parked = Parked {
            created_at_ms: ticket.created_at_ms,
            deadline_ms: ticket.deadline_ms,
            parked_at_ms: now,
            units: ticket.cost.units,
            skips: 0,
            timeout_ms: ticket.timeout_ms.map_or(NO_TIMEOUT, saturate_timeout),
            priority: ticket.priority,
            kind: ticket.cost.kind,
            slotless,
            by_deadline: self.orders_by_deadline(),
        };
        let rank = parked.rank(ticket.id);
        self.queue.park(parked.kind, parked.units, rank);
        if !ticket.also.is_empty() {
            self.park_several(&ticket, rank, slotless);
        } else {
            self.index_mut(parked.kind, slotless)
                .insert(parked.units, rank);
        }
        if let Some(deadline) = parked.deadline_ms {
            self.by_deadline.insert((deadline, ticket.id));
        }
        if self.limits.starvation.max_park_ms.is_some() {
            self.by_park_time.insert((now, ticket.id));
        }
        if let Some(book) = &mut self.tenants {
            book.park(ticket.tenant, parked.kind, parked.units, rank);
        }
        // A ticket of several kinds never backfills (rule 25): it is left out of the index
        // of backfill candidates.
        if let (Some(by_timeout), Some(timeout)) = (&mut self.by_timeout, parked.timeout()) {
            if ticket.also.is_empty() {
                by_timeout.insert(timeout as u32, parked.kind, parked.units, rank);
            }
        }
        self.parked.insert(ticket.id, parked);
    }

    /// Parks ticket of several kinds `ticket`, ranked `rank`, in its multi-kind index.
    fn park_several(&mut self, ticket: &Ticket, rank: RankKey, slotless: bool) {
        let demand = ticket.also.with_first(ticket.cost);
        let by = Self::key_kind(&demand);
        let index = match slotless {
            true => &mut self.several_permits,
            false => &mut self.several,
        };
        index.insert(by, &demand, rank);
        self.extras.insert(ticket.id, ticket.also);
    }

    /// Removes a parked task from every index; returns its data, its tenant (0 without
    /// a fair share) and what it needs beside its first cost (rule 25).
    pub(super) fn remove_parked(&mut self, id: TaskId) -> Option<(Parked, TenantKey, ExtraCosts)> {
        let parked = self.parked.remove(&id)?;
        let rank = parked.rank(id);
        self.queue.unpark(parked.kind, parked.units, rank);
        let also = match self.extras.is_empty() {
            true => None,
            false => self.extras.remove(&id),
        };
        match also {
            Some(also) => {
                let demand = also.with_first(ResourceCost::new(parked.kind, parked.units));
                let by = Self::key_kind(&demand);
                let index = match parked.slotless {
                    true => &mut self.several_permits,
                    false => &mut self.several,
                };
                index.remove(by, &demand, rank);
            }
            None => {
                self.index_mut(parked.kind, parked.slotless)
                    .remove(parked.units, rank);
            }
        }
        if let Some(deadline) = parked.deadline_ms {
            self.by_deadline.remove(&(deadline, id));
        }
        self.by_park_time.remove(&(parked.parked_at_ms, id));
        self.starving.remove(&rank);
        let tenant = match &mut self.tenants {
            Some(book) => book.unpark(parked.kind, parked.units, rank),
            None => 0,
        };
        if let (Some(by_timeout), Some(timeout)) = (&mut self.by_timeout, parked.timeout()) {
            if also.is_none() {
                by_timeout.remove(timeout as u32, parked.kind, parked.units, rank);
            }
        }
        Some((parked, tenant, also.unwrap_or_default()))
    }
}
