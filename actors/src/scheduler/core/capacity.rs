//! What a kind has free (the "Capacity" section of the core's docs): the units running
//! tickets hold, the headroom the world outside the pool leaves (rule 11), and the budgets
//! whose units refill with time (rule 15), with the instant a refill lets a parked ticket
//! start.

use super::{budget, CostIndex, ParkingLot, UnknownTask, UNLIMITED};
use crate::domain::{ResourceCost, ResourceKind, TaskId};

impl ParkingLot {
    /// Units of `kind` held by running tasks.
    pub fn used(&self, kind: ResourceKind) -> u32 {
        self.used[kind.index()]
    }

    /// Units of `kind` a task may start with: those not held by anyone, at most the
    /// kind's headroom (rule 11), and for a kind with a budget, at most what its bucket
    /// holds (none while its starts are used up, rule 15).
    pub fn free(&self, kind: ResourceKind) -> u32 {
        let free = (self.limits.capacity.get(kind) - self.used[kind.index()])
            .min(self.headroom[kind.index()]);
        match self.budget(kind) {
            Some(budget) => free.min(budget.free()),
            None => free,
        }
    }

    /// The bucket of `kind`, when it has a budget (rule 15).
    pub(super) fn budget(&self, kind: ResourceKind) -> Option<&budget::KindBudget> {
        self.budgets.as_ref()?.of(kind)
    }

    /// Whole units in the bucket of `kind` as of the latest event, or `None` for a kind
    /// without a budget (rule 15).
    pub fn budget_level(&self, kind: ResourceKind) -> Option<u32> {
        self.budget(kind).map(budget::KindBudget::level)
    }

    /// For parked task `id` of a kind with a budget: when its bucket will hold its units
    /// (and a start, under a start cap), if it does not now; `None` otherwise. Tasks ranked
    /// ahead of it may spend first, so this is the earliest it could start.
    pub fn budget_ready_at(&self, id: TaskId) -> Option<u64> {
        self.budgets.as_ref()?;
        let parked = self.parked.get(&id)?;
        // A ticket of several kinds (rule 25) is ready when the last of its buckets is.
        let first = ResourceCost::new(parked.kind, parked.units);
        let at = std::iter::once(first)
            .chain(self.extras_of(id).costs())
            .filter_map(|cost| Some(self.budget(cost.kind)?.ready_at(cost.units)))
            .max()?;
        (at > self.clock).then_some(at)
    }

    /// When the best-ranked parked ticket of `kind` could start as far as the kind's budget
    /// goes, if the budget is what it waits for (rule 15).
    pub fn budget_waits_until(&self, kind: ResourceKind) -> Option<u64> {
        let best = [
            &self.by_cost[kind.index()],
            &self.permits_by_cost[kind.index()],
        ]
        .into_iter()
        .filter_map(CostIndex::best)
        .min()?;
        self.budget_ready_at(best.id())
    }

    /// Units running task `id` spent from its kind's budget and may still give back.
    pub fn spent_by(&self, id: TaskId) -> u32 {
        self.running
            .get(&id)
            .and_then(|claim| self.budget(claim.kind))
            .map_or(0, |budget| budget.spent_by(id))
    }

    /// Running task `id` gives back up to `units` of what it spent from its kind's budget
    /// (it used fewer than it declared: the tokens of a shorter reply), and what now fits
    /// starts (rule 15). Returns the started ids, in order; nothing for a kind without a
    /// budget.
    pub fn give_back(
        &mut self,
        id: TaskId,
        units: u32,
        now: u64,
    ) -> Result<Vec<TaskId>, UnknownTask> {
        let kind = self
            .running
            .get(&id)
            .ok_or(UnknownTask::NotRunning(id))?
            .kind;
        let mut started = Vec::new();
        let given = self
            .budgets
            .as_mut()
            .and_then(|budgets| budgets.of_mut(kind))
            .map_or(0, |budget| budget.give_back(id, units));
        if given > 0 {
            self.unpark(now, &mut started);
        }
        Ok(started)
    }

    /// The headroom of `kind` left after the starts since it was set, or `None` when it has
    /// none (rule 11).
    pub fn headroom(&self, kind: ResourceKind) -> Option<u32> {
        let headroom = self.headroom[kind.index()];
        (headroom != UNLIMITED).then_some(headroom)
    }

    /// Caps the free units of `kind` at `headroom` until the next call (rule 11); `None`
    /// lifts the cap. A larger headroom may let parked tasks start: returns their ids, in
    /// the order they started.
    ///
    /// ```
    /// use prometheus_parking_lot_actors::domain::{PoolLimits, Priority, ResourceCost, ResourceKind};
    /// use prometheus_parking_lot_actors::scheduler::core::{Admit, ParkingLot, Ticket};
    ///
    /// let mut lot = ParkingLot::new(PoolLimits::new(80, 4)).unwrap();
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
    /// // Another process holds most of the card: 20 units are free outside the pool.
    /// assert!(lot.set_headroom(ResourceKind::GpuVram, Some(20), 0).is_empty());
    /// assert_eq!(lot.admit(ticket(1, 30), 0), Admit::Park); // fits 80, not 20
    /// // The other process exits: the next sample lets it start.
    /// assert_eq!(lot.set_headroom(ResourceKind::GpuVram, Some(70), 5), vec![1]);
    /// assert_eq!(lot.headroom(ResourceKind::GpuVram), Some(40)); // 70 less its 30
    /// ```
    pub fn set_headroom(
        &mut self,
        kind: ResourceKind,
        headroom: Option<u32>,
        now: u64,
    ) -> Vec<TaskId> {
        self.headroom[kind.index()] = headroom.map_or(UNLIMITED, |units| units.min(UNLIMITED - 1));
        let mut started = Vec::new();
        self.unpark(now, &mut started);
        started
    }

    /// Units held by running tasks, summed over kinds.
    pub fn used_total(&self) -> u64 {
        self.used.iter().map(|&units| u64::from(units)).sum()
    }

    /// When a refill lets a parked task of a kind with a budget start that cannot now (rule
    /// 15): a start coming back, or the level reaching the smallest parked cost above it.
    /// A task that fits the level but waits anyway waits for something else (a slot, the
    /// reservation, its tenant's room), whose own event wakes it.
    pub(super) fn budget_wakeup(&self) -> Option<u64> {
        let budgets = self.budgets.as_ref()?;
        budgets
            .kinds()
            .filter_map(|(kind, budget)| {
                let (tasks, permits) = (
                    &self.by_cost[kind.index()],
                    &self.permits_by_cost[kind.index()],
                );
                let several = [&self.several, &self.several_permits];
                if tasks.is_empty() && permits.is_empty() && self.extras.is_empty() {
                    return None;
                }
                let level = budget.level();
                let above = [tasks, permits]
                    .into_iter()
                    .filter_map(|index| index.smallest_above(level))
                    .chain(
                        several
                            .into_iter()
                            .filter_map(|index| index.smallest_above(kind, level)),
                    )
                    .min();
                budget.next_change(above)
            })
            .min()
    }
}
