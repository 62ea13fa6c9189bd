//! The check of every invariant stated in the core's module docs, for the property tests and
//! for debugging: O(n), never on a decision's path.

use super::fair_share::TenantBook;
use super::{CostIndex, ParkingLot, KINDS, NO_WORKER};
use crate::domain::ResourceKind;

impl ParkingLot {
    /// Rule 15: a kind with a budget holds no units; only running tasks of the kind have
    /// units to give back.
    fn check_budgets(&self) -> Result<(), String> {
        let Some(budgets) = &self.budgets else {
            return Ok(());
        };
        for (kind, budget) in budgets.kinds() {
            if self.used(kind) != 0 {
                return Err(format!(
                    "{kind:?} has a budget but holds {}",
                    self.used(kind)
                ));
            }
            let spends = |claim: &super::Claim| claim.kind == kind || claim.also.get(kind) > 0;
            if let Some(id) = budget
                .spenders()
                .find(|id| self.running.get(id).is_none_or(|claim| !spends(claim)))
            {
                return Err(format!(
                    "task {id} may give {kind:?} units back but is not running"
                ));
            }
        }
        Ok(())
    }

    /// Checks every invariant of the module docs. O(n): for tests and debugging.
    pub fn check_invariants(&self) -> Result<(), String> {
        let mut held = [0u64; KINDS];
        for claim in self.running.values() {
            for (held, units) in held.iter_mut().zip(self.held_by(claim)) {
                *held += u64::from(units);
            }
        }
        for kind in ResourceKind::ALL {
            held[kind.index()] += u64::from(self.lent[kind.index()]);
        }
        for kind in ResourceKind::ALL {
            let (used, capacity) = (self.used(kind), self.limits.capacity.get(kind));
            if used > capacity || u64::from(used) != held[kind.index()] {
                return Err(format!(
                    "{kind:?}: used {used}, held by running tasks and lent {}, capacity {capacity}",
                    held[kind.index()]
                ));
            }
        }
        self.check_workers()?;
        if let Some(id) = self.parked.keys().find(|id| self.running.contains_key(id)) {
            return Err(format!("task {id} is both parked and running"));
        }
        self.check_several()?;
        let indexed: usize =
            self.by_cost.iter().map(CostIndex::len).sum::<usize>() + self.several.len();
        let permits: usize = self
            .permits_by_cost
            .iter()
            .map(CostIndex::len)
            .sum::<usize>()
            + self.several_permits.len();
        let parked_permits = self.parked.values().filter(|p| p.slotless).count();
        if indexed + permits != self.parked.len() || permits != parked_permits {
            return Err(format!(
                "{indexed} tasks and {permits} permits indexed vs {} parked ({parked_permits} permits)",
                self.parked.len()
            ));
        }
        self.check_queue_bounds()?;
        if self
            .starving
            .iter()
            .any(|rank| !self.parked.contains_key(&rank.id()))
        {
            return Err("a starving task is not parked".into());
        }
        if let Some(book) = &self.tenants {
            let running = self
                .running
                .iter()
                .map(|(&id, claim)| (id, claim.tenant, claim.kind, claim.units));
            book.check(running, self.parked.len())?;
            self.check_fair_best_fit(book)?;
        }
        if let Some(by_timeout) = &self.by_timeout {
            let with_timeout = self
                .parked
                .iter()
                .filter(|(id, p)| p.timeout().is_some() && !self.extras.contains_key(id))
                .count();
            if by_timeout.len() != with_timeout {
                return Err(format!(
                    "{} in the timeout index vs {with_timeout} parked with a timeout",
                    by_timeout.len()
                ));
            }
        }
        self.check_budgets()?;
        if self.sleeping.len() != self.sleepers.len()
            || self.sleeping.iter().any(|(until, id)| {
                self.sleepers.get(id).map(|&(at, _)| at) != Some(*until)
                    || self.parked.contains_key(id)
                    || self.running.contains_key(id)
            })
        {
            return Err(
                "a sleeper is not exactly once in the sleeping index, or is also parked or running"
                    .into(),
            );
        }
        self.dependencies.check(|id| {
            self.parked.contains_key(&id)
                || self.running.contains_key(&id)
                || self.sleepers.contains_key(&id)
        })?;
        if let Some(runnable) = self.best_fit(self.clock) {
            return Err(format!(
                "saturation broken: parked task {} fits and is not blocked",
                runnable.id()
            ));
        }
        Ok(())
    }

    /// Rule 25: the parked tickets of several kinds are exactly those the multi-kind indexes
    /// hold, each with what it needs, and an index's pruned search finds what a scan of
    /// its tickets finds.
    fn check_several(&self) -> Result<(), String> {
        let free = self.free_units();
        for (index, slotless) in [(&self.several, false), (&self.several_permits, true)] {
            for (rank, demand) in index.tickets() {
                let id = rank.id();
                let parked = self
                    .parked
                    .get(&id)
                    .filter(|parked| parked.slotless == slotless)
                    .ok_or(format!(
                        "ticket {id} of several kinds is indexed but not parked"
                    ))?;
                let first = super::ResourceCost::new(parked.kind, parked.units);
                if *demand != self.extras_of(id).with_first(first) {
                    return Err(format!("ticket {id} is indexed with {demand:?}"));
                }
            }
            let scanned = index
                .tickets()
                .filter(|(_, demand)| super::multi_index::fits(demand, &free))
                .map(|(rank, _)| rank)
                .min();
            let searched = index.best_within(&free, None);
            if searched != scanned {
                return Err(format!(
                    "several kinds' best fit {searched:?}, a scan finds {scanned:?}"
                ));
            }
        }
        let indexed = self.several.len() + self.several_permits.len();
        if self.extras.len() != indexed || self.extras.values().any(|also| also.is_empty()) {
            return Err(format!(
                "{} tickets' extra costs kept vs {indexed} of several kinds indexed",
                self.extras.len()
            ));
        }
        Ok(())
    }

    /// The fair share's pruned search finds what a scan of every parked task finds.
    fn check_fair_best_fit(&self, book: &TenantBook) -> Result<(), String> {
        let free = ResourceKind::ALL.map(|kind| self.free(kind));
        let scanned = self
            .parked
            .iter()
            .filter_map(|(&id, parked)| {
                let (rank, tenant) = (parked.rank(id), book.tenant_of(id));
                let fits = parked.units <= free[parked.kind.index()]
                    && parked.units <= book.room(tenant, parked.kind)
                    && !book.starving_ahead_of(tenant, &rank);
                fits.then(|| book.key(tenant, parked.kind, rank))
            })
            .min();
        let ceiling = self
            .best_within(&self.by_cost, &free)
            .into_iter()
            .chain(self.best_within(&self.permits_by_cost, &free))
            .min()
            .map(|best| best.priority());
        let searched = ceiling.and_then(|ceiling| book.best_fit(&free, ceiling));
        if searched != scanned {
            return Err(format!(
                "fair best fit {searched:?}, a scan finds {scanned:?}"
            ));
        }
        Ok(())
    }

    /// Every slot is idle, held by exactly one running task, or retired (and idle never).
    fn check_workers(&self) -> Result<(), String> {
        let mut holders = vec![0u32; self.worker_slots as usize];
        let mut permits = 0;
        for claim in self.running.values() {
            match holders.get_mut(claim.worker as usize) {
                Some(count) => *count += 1,
                None if claim.worker == NO_WORKER => permits += 1,
                None => return Err(format!("worker {} does not exist", claim.worker)),
            }
        }
        if permits != self.running_permits {
            return Err(format!(
                "{permits} permits running vs {} counted",
                self.running_permits
            ));
        }
        for &idle in &self.idle_workers {
            holders[idle as usize] += 1;
            if self.retired[idle as usize] {
                return Err(format!("retired worker {idle} is idle"));
            }
        }
        for (worker, _) in self.resting.iter().enumerate().filter(|(_, rests)| **rests) {
            holders[worker] += 1;
            if self.retired[worker] {
                return Err(format!("retired worker {worker} rests"));
            }
        }
        for (worker, &count) in holders.iter().enumerate() {
            let expected = u32::from(!self.retired[worker]);
            if count > 1 || (count == 0 && expected == 1) {
                return Err(format!(
                    "worker {worker} is held {count} times (retired: {})",
                    self.retired[worker]
                ));
            }
        }
        Ok(())
    }
}
