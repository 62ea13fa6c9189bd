//! Lanes (rule 19): free units lent to the permits' fast path, which takes and returns them
//! on its callers' threads while nobody waits.
//!
//! The core stays the only book of who holds what: lent units count as used, so no decision
//! can hand them out twice. The driver lends what [`ParkingLot::lane_room`] allows, takes
//! back what the fast path did not hand out before it feeds the lot any other event
//! ([`ParkingLot::reclaim`]), and turns a fast-path holder into a running ticket of its own
//! when a decision needs to see it ([`ParkingLot::adopt`], [`ParkingLot::settle`]).
//!
//! # Why the lane is only open while nobody waits
//!
//! A fast-path acquire does not rank itself against anyone: it is right only when no
//! better-ranked ticket could want the same units. So a kind's lane may open only when
//! nothing is parked or sleeping at all, no reservation holds, the lot is not paused, and the
//! kind has no rule the fast path cannot check on its own (a fair share, a budget, a
//! headroom). Any event that could park a ticket reaches the lot only after the driver
//! closed the lanes, so the saturation invariant and rank order hold as before.

use super::{Claim, ParkingLot, Ticket, UnknownTask, NO_WORKER, UNLIMITED};
use crate::domain::{ExtraCosts, ResourceKind, TaskId};

impl ParkingLot {
    /// How many units of `kind` may be lent to the fast path now: the free units, or none
    /// while anything waits or a rule the fast path cannot check applies (see the module
    /// docs).
    pub fn lane_room(&self, kind: ResourceKind) -> u32 {
        let index = kind.index();
        let closed = self.paused
            || !self.parked.is_empty()
            || !self.sleepers.is_empty()
            || self.tenants.is_some()
            || self.budget(kind).is_some()
            || self.headroom[index] != UNLIMITED;
        if closed {
            0
        } else {
            self.free(kind)
        }
    }

    /// Units of `kind` lent to the fast path and not yet reclaimed or adopted.
    pub fn lent(&self, kind: ResourceKind) -> u32 {
        self.lent[kind.index()]
    }

    /// Lends `units` of `kind` to the fast path: they count as used until reclaimed or
    /// adopted. Lends at most [`lane_room`](Self::lane_room); returns what it lent.
    pub fn lend(&mut self, kind: ResourceKind, units: u32) -> u32 {
        let units = units.min(self.lane_room(kind));
        self.used[kind.index()] += units;
        self.lent[kind.index()] += units;
        units
    }

    /// The fast path gives back `units` of `kind` (at most what is lent): they are free
    /// again, and what now fits starts. Returns the started ids in the order they started.
    pub fn reclaim(&mut self, kind: ResourceKind, units: u32, now: u64) -> Vec<TaskId> {
        let index = kind.index();
        let units = units.min(self.lent[index]);
        self.lent[index] -= units;
        self.used[index] -= units;
        let mut started = Vec::new();
        if units > 0 && !self.parked.is_empty() {
            self.unpark(now, &mut started);
        }
        started
    }

    /// A fast-path holder becomes running ticket `ticket.id`, holding `ticket.cost.units`
    /// of the units lent for its kind (its cost may be 0: it holds what it borrowed later
    /// through [`settle`](Self::settle)). It takes no worker slot, as a permit (rule 14).
    /// Refused when the id is live already or the lane lent fewer units.
    pub fn adopt(&mut self, ticket: Ticket, now: u64) -> Result<(), UnknownTask> {
        let Ticket { id, cost, .. } = ticket;
        if self.is_live(id) {
            return Err(UnknownTask::AlreadyLive(id));
        }
        let index = cost.kind.index();
        if cost.units > self.lent[index] {
            return Err(UnknownTask::NotLent(id));
        }
        self.lent[index] -= cost.units;
        self.clock = now;
        self.starts += 1;
        self.running_permits += 1;
        self.running.insert(
            id,
            Claim {
                kind: cost.kind,
                units: cost.units,
                worker: NO_WORKER,
                tenant: ticket.tenant,
                priority: ticket.priority,
                started: self.starts,
                overdue_at: None,
                ends_by: None,
                started_ms: now,
                timeout_ms: super::NO_TIMEOUT,
                declared: cost.units,
                also: ExtraCosts::NONE,
            },
        );
        Ok(())
    }

    /// Running ticket `id` takes over `units` it borrowed from its kind's lane: they move
    /// from the lane's books to its claim.
    pub fn settle(&mut self, id: TaskId, units: u32) -> Result<(), UnknownTask> {
        let claim = self
            .running
            .get_mut(&id)
            .ok_or(UnknownTask::NotRunning(id))?;
        let index = claim.kind.index();
        if units > self.lent[index] {
            return Err(UnknownTask::NotLent(id));
        }
        self.lent[index] -= units;
        claim.units += units;
        Ok(())
    }

    /// The parked permit a releaser of units of `kind` may grant directly (the hand-off of
    /// rule 19), with the units it lacks: the best-ranked parked ticket of the kind, when it
    /// is a permit, no reservation ranks ahead of it, and no rule but rank decides what
    /// starts (no fair share, budget or headroom, not paused, nothing sleeping). Once
    /// `deficit` more units of the kind are free, it is what starts first.
    pub fn hand_off_candidate(&self, kind: ResourceKind) -> Option<(TaskId, u32)> {
        let index = kind.index();
        // A parked ticket of several kinds (rule 25) is in no index of one kind: rank alone
        // would pass it by, so nothing is handed off while one waits.
        if self.permits_by_cost[index].is_empty()
            || !self.extras.is_empty()
            || self.paused
            || self.tenants.is_some()
            || self.budget(kind).is_some()
            || self.headroom[index] != UNLIMITED
            || !self.sleepers.is_empty()
        {
            return None;
        }
        let head = self.by_cost[index]
            .best()
            .into_iter()
            .chain(self.permits_by_cost[index].best())
            .min()?;
        let parked = self.parked.get(&head.id())?;
        if !parked.slotless || self.reserved().is_some_and(|reserved| reserved != head) {
            return None;
        }
        let deficit = parked.units.checked_sub(self.free(kind))?;
        (deficit > 0).then_some((head.id(), deficit))
    }

    /// A releaser handed its units to the hand-off candidate: running ticket `claim` (if
    /// any) ends and `lane_units` lent units of `kind` come back, all before anything
    /// starts, so the candidate starts first. Returns the started ids in order.
    pub fn hand_back(
        &mut self,
        claim: Option<TaskId>,
        kind: ResourceKind,
        lane_units: u32,
        now: u64,
    ) -> Result<Vec<TaskId>, UnknownTask> {
        let index = kind.index();
        let lane_units = lane_units.min(self.lent[index]);
        self.lent[index] -= lane_units;
        self.used[index] -= lane_units;
        let ended = claim.map_or(Ok(None), |id| {
            self.end_claim_quietly(id, false, now).map(Some)
        });
        let mut started = Vec::new();
        self.unpark(now, &mut started);
        ended.map(|_| started)
    }
}
