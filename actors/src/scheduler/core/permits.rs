//! Capacity permits (rule 14 of the core): tickets whose run happens outside the pool, such
//! as a batching LLM engine's requests holding KV-cache blocks.
//!
//! A permit is ranked, parked, reserved for and expired like any ticket, but started it holds
//! units only, no worker slot, so it may start while every slot is busy. Its units can change
//! while it runs: [`ParkingLot::grow_now`] takes more at once if they fit, a ranked growth
//! parks a child ticket and [`ParkingLot::absorb`]s it once it starts,
//! [`ParkingLot::shrink`] gives units back. When a waiter of a higher priority cannot fit,
//! [`ParkingLot::preemption_victims`] names the running tickets to ask to yield.

use super::{
    AbsorbRefusal, Admit, Claim, ParkingLot, TenantKey, Ticket, UnknownTask, KINDS, UNLIMITED,
};
use crate::domain::{Priority, ResourceCost, ResourceKind, TaskId};

impl ParkingLot {
    /// Admits a permit at time `now`, like [`admit`](Self::admit) but needing no worker slot:
    /// started, it holds units only; parked, it can start while every slot is busy. A lot
    /// [`without_workers`](Self::without_workers) grants permits as any other.
    ///
    /// ```
    /// use prometheus_parking_lot_actors::domain::{PoolLimits, Priority, ResourceCost};
    /// use prometheus_parking_lot_actors::scheduler::core::{Admit, ParkingLot, Ticket};
    ///
    /// let mut lot = ParkingLot::new(PoolLimits::new(10, 1)).unwrap();
    /// let ticket = |id, units| Ticket {
    ///     id,
    ///     priority: Priority::Normal,
    ///     cost: ResourceCost::gpu_vram(units),
    ///     created_at_ms: id,
    ///     deadline_ms: None,
    ///     tenant: 0,
    ///     timeout_ms: None,
    ///     also: Default::default(),
    /// };
    /// assert_eq!(lot.admit(ticket(1, 2), 0), Admit::Start); // the one slot is busy now
    /// assert_eq!(lot.admit_permit(ticket(2, 4), 0), Admit::Start); // a permit needs none
    /// assert_eq!(lot.worker_of(2), None);
    /// assert_eq!(lot.grow_now(2, 3), Ok(true)); // 2 + 7 of 10 held
    /// assert_eq!(lot.shrink(2, 5, 1), Ok(vec![]));
    /// assert_eq!(lot.units_of(2), Some(2));
    /// ```
    pub fn admit_permit(&mut self, ticket: Ticket, now: u64) -> Admit {
        self.admit_ticket(ticket, true, true, now)
    }

    /// Running ticket `id` takes `extra` more units of its kind at once, if they fit now (the
    /// free units, the headroom of rule 11, its tenant's room under a fair share) and no
    /// reservation (rules 6, 12) waits; returns whether it did. It never parks anything.
    ///
    /// Under a fair share a growth changes its tenant's place in the fair order, which could
    /// let a parked task start; such a growth is refused too (the caller then waits in rank
    /// with a child ticket, see [`absorb`](Self::absorb)), so the saturation invariant holds.
    /// So is one while a fair share by use is due to move its counters' frame, a move that
    /// can reorder tenants too.
    pub fn grow_now(&mut self, id: TaskId, extra: u32) -> Result<bool, UnknownTask> {
        let claim = *self.running.get(&id).ok_or(UnknownTask::NotRunning(id))?;
        if extra > self.free(claim.kind) || self.reserved().is_some() {
            return Ok(false);
        }
        if let Some(book) = &self.tenants {
            // Moving the counters' frame could reorder the tenants, and no decision follows
            // here: the growth waits in rank instead, and the next start or end moves it.
            if extra > book.room(claim.tenant, claim.kind) || book.frame_due(self.clock) {
                return Ok(false);
            }
        }
        let charged = self
            .tenants
            .as_ref()
            .and_then(|book| book.snapshot_charge(id));
        self.take_units(id, &claim, extra);
        if self.tenants.is_some() && self.best_fit(self.clock).is_some() {
            self.give_units(id, &claim, extra);
            let headroom = &mut self.headroom[claim.kind.index()];
            if *headroom != UNLIMITED {
                *headroom += extra;
            }
            // Under a fair share by use, the growth's charge is undone too.
            if let (Some(book), Some(charged)) = (&mut self.tenants, charged) {
                book.restore_charge(charged);
            }
            return Ok(false);
        }
        Ok(true)
    }

    /// Running ticket `id` gives back `min(units, held)` units at once (it may keep none and
    /// go on running), and what now fits starts. Returns the started ids in the order they
    /// started, like [`complete`](Self::complete).
    pub fn shrink(&mut self, id: TaskId, units: u32, now: u64) -> Result<Vec<TaskId>, UnknownTask> {
        let claim = *self.running.get(&id).ok_or(UnknownTask::NotRunning(id))?;
        self.give_units(id, &claim, units.min(claim.units));
        let mut started = Vec::new();
        self.unpark(now, &mut started);
        Ok(started)
    }

    /// Running ticket `child`'s units move into running ticket `parent`'s claim: `child`
    /// leaves the running set without releasing them (a worker slot it held is freed), so the
    /// pool's and its tenant's books stay exact. Both must hold the same kind and count
    /// against the same tenant. A freed slot, or the tenant's one running task fewer under a
    /// fair share, may let parked tasks start: returns them, in the order they started.
    ///
    /// This is a ranked growth: the driver parks a child ticket for the extra units and,
    /// once it starts, absorbs it into the permit.
    pub fn absorb(
        &mut self,
        child: TaskId,
        parent: TaskId,
        now: u64,
    ) -> Result<Vec<TaskId>, UnknownTask> {
        let of_child = *self
            .running
            .get(&child)
            .ok_or(UnknownTask::NotRunning(child))?;
        let of_parent = *self
            .running
            .get(&parent)
            .ok_or(UnknownTask::NotRunning(parent))?;
        let refuse = |reason| UnknownTask::CannotAbsorb {
            child,
            parent,
            reason,
        };
        if child == parent {
            return Err(refuse(AbsorbRefusal::SameTask));
        }
        if of_child.kind != of_parent.kind {
            return Err(refuse(AbsorbRefusal::OtherKind {
                child: of_child.kind,
                parent: of_parent.kind,
            }));
        }
        if of_child.tenant != of_parent.tenant {
            return Err(refuse(AbsorbRefusal::OtherTenant {
                child: of_child.tenant,
                parent: of_parent.tenant,
            }));
        }
        self.running.remove(&child);
        self.stop_watching(child, &of_child);
        if let Some(claim) = self.running.get_mut(&parent) {
            claim.units += of_child.units;
            claim.also.absorb(&of_child.also);
        }
        if let Some(book) = &mut self.tenants {
            book.merge(of_child.tenant);
            book.absorb_charge(child, parent, now);
        }
        self.free_worker_of(&of_child, false);
        let mut started = Vec::new();
        self.unpark(now, &mut started);
        Ok(started)
    }

    /// The running tickets to ask to yield so that parked `waiter` fits (rule 14), lowest
    /// priority first, or `None` when the waiter is not parked or even every candidate
    /// cannot make room. `pending` counts units already asked to yield and not yet released.
    ///
    /// The waiter needs `units - free - pending` (saturating) more units of its kind, and of
    /// a ticket of several kinds (rule 25) `units - free` of each other kind; none needed
    /// gives `Some(vec![])`. Candidates are running tickets holding units of a kind it
    /// needs, of a priority strictly below its own, that `may_yield`; they are taken lowest
    /// priority first and, within a priority, the most recently started first, until they
    /// cover the need of every kind; then, from the last taken back, any whose units are not
    /// needed to cover it is dropped.
    pub fn preemption_victims(
        &self,
        waiter: TaskId,
        pending: u32,
        may_yield: impl Fn(TaskId) -> bool,
    ) -> Option<Vec<TaskId>> {
        let parked = self.parked.get(&waiter)?;
        let demand = self
            .extras_of(waiter)
            .with_first(ResourceCost::new(parked.kind, parked.units));
        let free = self.free_units();
        let mut need: [u64; KINDS] =
            std::array::from_fn(|kind| u64::from(demand[kind].saturating_sub(free[kind])));
        let first = parked.kind.index();
        need[first] = need[first].saturating_sub(u64::from(pending));
        if need == [0; KINDS] {
            return Some(Vec::new());
        }
        let relieves =
            |held: &[u32; KINDS]| (0..KINDS).any(|kind| need[kind] > 0 && held[kind] > 0);
        let mut candidates: Vec<(TaskId, &Claim, [u32; KINDS])> = self
            .running
            .iter()
            .filter(|(_, claim)| claim.priority < parked.priority)
            .map(|(&id, claim)| (id, claim, self.held_by(claim)))
            .filter(|(_, _, held)| relieves(held))
            .filter(|(id, ..)| may_yield(*id))
            .collect();
        candidates.sort_unstable_by_key(|(_, claim, _)| {
            (claim.priority, std::cmp::Reverse(claim.started))
        });
        let covers = |covered: &[u64; KINDS]| (0..KINDS).all(|kind| covered[kind] >= need[kind]);
        let mut chosen: Vec<(TaskId, [u32; KINDS])> = Vec::new();
        let mut covered = [0u64; KINDS];
        for (id, _, held) in candidates {
            if covers(&covered) {
                break;
            }
            for kind in 0..KINDS {
                covered[kind] += u64::from(held[kind]);
            }
            chosen.push((id, held));
        }
        if !covers(&covered) {
            return None;
        }
        for at in (0..chosen.len()).rev() {
            let held = chosen[at].1;
            let without: [u64; KINDS] =
                std::array::from_fn(|kind| covered[kind] - u64::from(held[kind]));
            if covers(&without) {
                covered = without;
                chosen.remove(at);
            }
        }
        Some(chosen.into_iter().map(|(id, _)| id).collect())
    }

    /// Running tickets of `kind` holding at least one unit. O(running).
    pub fn holders(&self, kind: ResourceKind) -> usize {
        self.running
            .values()
            .filter(|claim| claim.kind == kind && claim.units > 0)
            .count()
    }

    /// What running ticket `id` holds, its priority and its tenant, or `None` when it is not
    /// running.
    pub fn claim_of(&self, id: TaskId) -> Option<(ResourceCost, Priority, TenantKey)> {
        self.running.get(&id).map(|claim| {
            let cost = ResourceCost::new(claim.kind, claim.units);
            (cost, claim.priority, claim.tenant)
        })
    }

    /// The units running ticket `id` holds, or `None` when it is not running.
    pub fn units_of(&self, id: TaskId) -> Option<u32> {
        self.running.get(&id).map(|claim| claim.units)
    }

    /// Running ticket `id`, whose claim was `claim`, takes `units` more, which the caller
    /// checked fit: the pool's, the headroom's and the tenant's books follow.
    fn take_units(&mut self, id: TaskId, claim: &Claim, units: u32) {
        let kind = claim.kind.index();
        if let Some(budget) = self.budgets.as_mut().and_then(|b| b.of_mut(claim.kind)) {
            // Spent, not held (rule 15).
            budget.grow(id, units);
            if self.headroom[kind] != UNLIMITED {
                self.headroom[kind] -= units;
            }
            return;
        }
        if let Some(held) = self.running.get_mut(&id) {
            held.units += units;
        }
        self.used[kind] += units;
        if self.headroom[kind] != UNLIMITED {
            self.headroom[kind] -= units;
        }
        if let Some(book) = &mut self.tenants {
            book.grow(claim.tenant, claim.kind, units);
            book.charge_growth(id, claim.tenant, units, self.clock);
        }
    }

    /// Running ticket `id`, whose claim was `claim`, gives back `units` it holds. They do
    /// not return to the headroom, as at `complete`: the next sample will show them. Of a
    /// kind with a budget it holds none, and the units go back to the bucket (rule 15).
    fn give_units(&mut self, id: TaskId, claim: &Claim, units: u32) {
        if let Some(budget) = self.budgets.as_mut().and_then(|b| b.of_mut(claim.kind)) {
            budget.give_back(id, units);
            return;
        }
        if let Some(held) = self.running.get_mut(&id) {
            held.units -= units;
        }
        self.used[claim.kind.index()] -= units;
        if let Some(book) = &mut self.tenants {
            book.shrink(claim.tenant, claim.kind, units);
            book.note_shrink(id, units, self.clock);
        }
    }
}
