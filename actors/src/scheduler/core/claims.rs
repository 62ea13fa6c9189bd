//! Running claims: what a start takes (units, a worker slot, the tenant's share, the
//! budget) and what an end gives back exactly once (rule 8), learning the run time for the
//! estimates (rule 23).

use super::{Claim, ParkingLot, Request, UnknownTask, KINDS, NO_TIMEOUT, NO_WORKER, UNLIMITED};
use crate::domain::{ResourceCost, TaskId};

impl ParkingLot {
    /// Releases a running task's capacity (it finished, failed, panicked, timed out or was
    /// stopped) and starts what now fits, in rank order. Returns the started ids.
    pub fn complete(&mut self, id: TaskId, now: u64) -> Result<Vec<TaskId>, UnknownTask> {
        self.end_claim(id, false, now)
    }

    /// [`complete`](Self::complete) for a task whose worker thread is still busy with work
    /// the task left on it: its units are released now, its worker slot *rests* until
    /// [`worker_ready`](Self::worker_ready) (rule 9).
    pub fn complete_resting(&mut self, id: TaskId, now: u64) -> Result<Vec<TaskId>, UnknownTask> {
        self.end_claim(id, true, now)
    }

    /// Releases running ticket `id`'s claim; its slot goes idle, or rests (`rest`).
    fn end_claim(&mut self, id: TaskId, rest: bool, now: u64) -> Result<Vec<TaskId>, UnknownTask> {
        let claim = self.end_claim_quietly(id, rest, now)?;
        let timeout = (claim.timeout_ms != NO_TIMEOUT).then_some(u64::from(claim.timeout_ms));
        self.run_times.observe(
            claim.kind,
            claim.declared,
            claim.worker == NO_WORKER,
            now.saturating_sub(claim.started_ms),
            timeout,
        );
        let mut started = Vec::new();
        self.unpark(now, &mut started);
        Ok(started)
    }

    /// [`end_claim`](Self::end_claim), starting nothing; returns the claim it released.
    pub(super) fn end_claim_quietly(
        &mut self,
        id: TaskId,
        rest: bool,
        now: u64,
    ) -> Result<Claim, UnknownTask> {
        let claim = self
            .running
            .remove(&id)
            .ok_or(UnknownTask::NotRunning(id))?;
        let kind = claim.kind.index();
        debug_assert!(self.used[kind] >= claim.units);
        self.used[kind] = self.used[kind].saturating_sub(claim.units);
        self.stop_watching(id, &claim);
        if let Some(book) = &mut self.tenants {
            book.release(claim.tenant, claim.kind, claim.units);
            book.settle(id, now);
        }
        if let Some(budget) = self.budgets.as_mut().and_then(|b| b.of_mut(claim.kind)) {
            budget.end(id);
        }
        for cost in claim.also.costs() {
            match self.budgets.as_mut().and_then(|b| b.of_mut(cost.kind)) {
                Some(budget) => budget.end(id),
                None => self.used[cost.kind.index()] -= cost.units,
            }
        }
        self.free_worker_of(&claim, rest);
        Ok(claim)
    }

    /// Takes the request's cost and a worker slot (none for a permit) if both fit (and the
    /// tenant's share, under a fair share); returns whether it did.
    pub(super) fn claim(&mut self, request: &Request, now: u64) -> bool {
        let Request {
            id,
            cost,
            tenant,
            timeout_ms,
            ..
        } = *request;
        if !request.slotless && self.idle_workers.is_empty() {
            return false;
        }
        let kind = cost.kind.index();
        // A kind with a budget spends its units at the start and holds none (rule 15).
        let budgeted = self.budget(cost.kind).is_some();
        let held = if budgeted { 0 } else { cost.units };
        let Some(used) = self.used[kind].checked_add(held) else {
            return false;
        };
        if used > self.limits.capacity.get(cost.kind) || cost.units > self.headroom[kind] {
            return false;
        }
        if budgeted && cost.units > self.free(cost.kind) {
            return false;
        }
        if let Some(book) = &self.tenants {
            if cost.units > book.room(tenant, cost.kind) {
                return false;
            }
        }
        if !request.also.is_empty() && !self.fits_beside(request) {
            return false;
        }
        let worker = if request.slotless {
            self.running_permits += 1;
            NO_WORKER
        } else {
            let Some(worker) = self.idle_workers.pop() else {
                return false;
            };
            worker
        };
        self.used[kind] = used;
        if self.headroom[kind] != UNLIMITED {
            self.headroom[kind] -= cost.units;
        }
        if let Some(budget) = self.budgets.as_mut().and_then(|b| b.of_mut(cost.kind)) {
            budget.start(id, cost.units);
        }
        if !request.also.is_empty() {
            self.take_beside(request);
        }
        self.starts += 1;
        if let Some(book) = &mut self.tenants {
            book.start(tenant, cost.kind, held, self.starts);
            let timeout = (timeout_ms != NO_TIMEOUT).then_some(u64::from(timeout_ms));
            book.charge(id, tenant, cost.units, timeout, now);
        }
        let ends_by = (timeout_ms != NO_TIMEOUT && self.by_timeout.is_some())
            .then(|| now.saturating_add(u64::from(timeout_ms)));
        if let Some(at) = ends_by {
            self.by_end.insert((at, id));
        }
        self.running.insert(
            id,
            Claim {
                kind: cost.kind,
                units: held,
                worker,
                tenant,
                priority: request.priority,
                started: self.starts,
                overdue_at: None,
                ends_by,
                started_ms: now,
                timeout_ms,
                declared: cost.units,
                also: request.also,
            },
        );
        true
    }

    /// Drops a task that left the running set from the watchdog's and backfill's indexes.
    pub(super) fn stop_watching(&mut self, id: TaskId, claim: &Claim) {
        if let Some(at) = claim.overdue_at {
            self.by_overdue.remove(&(at, id));
        }
        if let Some(at) = claim.ends_by {
            self.by_end.remove(&(at, id));
        }
    }

    /// Whether every kind `request` needs beside its first cost fits now (rule 25): its
    /// units, the headroom, a budget's bucket.
    fn fits_beside(&self, request: &Request) -> bool {
        request
            .also
            .costs()
            .all(|cost| cost.units <= self.free(cost.kind))
    }

    /// What running claim `claim` holds of every kind, by kind index: a kind with a budget
    /// spends its units and holds none (rule 15).
    pub(super) fn held_by(&self, claim: &Claim) -> [u32; KINDS] {
        let mut held = claim
            .also
            .with_first(ResourceCost::new(claim.kind, claim.units));
        if let Some(budgets) = &self.budgets {
            for cost in claim.also.costs() {
                if budgets.of(cost.kind).is_some() {
                    held[cost.kind.index()] = 0;
                }
            }
        }
        held
    }

    /// Takes what `request` needs beside its first cost, which
    /// [`fits_beside`](Self::fits_beside) found to fit: the units of each kind, off its
    /// headroom too, and from each kind's budget.
    fn take_beside(&mut self, request: &Request) {
        for cost in request.also.costs() {
            let kind = cost.kind.index();
            match self.budgets.as_mut().and_then(|b| b.of_mut(cost.kind)) {
                Some(budget) => budget.start(request.id, cost.units),
                None => self.used[kind] += cost.units,
            }
            if self.headroom[kind] != UNLIMITED {
                self.headroom[kind] -= cost.units;
            }
        }
    }
}
