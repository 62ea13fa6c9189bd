//! Starting parked tickets (rules 4-6): skip-ahead in rank order until nothing more fits,
//! the choice of the next ticket to start (permits, rule 14; backfill, rule 13), the skips
//! counted against the head, and the starvation guard with the reservation it sets (under a
//! fair share, rule 12's).

use super::fair_share::TenantBook;
use super::{rank, CostIndex, MultiIndex, ParkingLot, RankKey, Request, KINDS};
use crate::domain::{ResourceCost, ResourceKind, TaskId};

impl ParkingLot {
    /// The task the pool is draining for: the best-ranked starving task (under a fair share,
    /// the best starving task whose tenant has room for it), if any.
    pub fn reservation(&self) -> Option<TaskId> {
        self.reserved().map(|rank| rank.id())
    }

    /// Starts parked tasks in rank order, skipping those that do not fit, until nothing more
    /// fits or the reservation blocks the rest.
    pub(super) fn unpark(&mut self, now: u64, started: &mut Vec<TaskId>) {
        self.clock = now;
        if !self.sleeping.is_empty() {
            self.wake_sleepers(now);
        }
        if let Some(budgets) = &mut self.budgets {
            budgets.refill(now);
        }
        self.promote_aged(now);
        while let Some(rank) = self.best_fit(now) {
            self.start_parked(rank, now);
            started.push(rank.id());
        }
    }

    /// The parked task to start next, if any: the best that fits the free capacity (and its
    /// tenant's room) and is not held back by the reservation; failing that, the best task
    /// the reservation holds back that may backfill.
    ///
    /// With every worker slot busy only permits (rule 14) may start: the best permit that
    /// fits, in rank order; under a fair share the fair-best task if it is a permit, and
    /// nothing if it needs a slot (a permit then waits behind it), unless the reservation
    /// ranks ahead of it: then a permit may backfill (rule 13).
    pub(super) fn best_fit(&self, now: u64) -> Option<RankKey> {
        if self.paused {
            return None;
        }
        let slot_idle = !self.idle_workers.is_empty();
        let free = ResourceKind::ALL.map(|kind| self.free(kind));
        let permit = self.best_within(&self.permits_by_cost, &free);
        let permit = several_within(&self.several_permits, &free, permit);
        if !slot_idle && permit.is_none() {
            return None;
        }
        // Without an idle slot a task's rank still bounds the fair order's ceiling.
        let task = (slot_idle || self.tenants.is_some())
            .then(|| self.best_within(&self.by_cost, &free))
            .flatten();
        let task = match slot_idle {
            true => several_within(&self.several, &free, task),
            false => task,
        };
        let best = permit.into_iter().chain(task).min()?;
        // Under a fair share, nothing fits if nothing fits the free units: the tenants need
        // not be asked (the common last decision of an unpark).
        let Some(book) = &self.tenants else {
            return match self.starving.first() {
                Some(reserved) if reserved.ranks_ahead_of(&best) => {
                    self.backfill_candidate(*reserved, best.priority(), now)
                }
                _ => Some(best),
            };
        };
        let ceiling = best.priority();
        let best = book.best_fit(&free, ceiling)?;
        match self.fair_reservation(book) {
            Some(reserved) if reserved < best => {
                self.backfill_candidate(reserved.rank(), ceiling, now)
            }
            _ if !slot_idle && !self.is_permit(best.rank()) => None,
            _ => Some(best.rank()),
        }
    }

    /// The best-ranked task of `indexes` that fits `free`.
    pub(super) fn best_within(
        &self,
        indexes: &[CostIndex; KINDS],
        free: &[u32; KINDS],
    ) -> Option<RankKey> {
        indexes
            .iter()
            .zip(free)
            .filter(|(index, _)| !index.is_empty())
            .filter_map(|(index, &free)| index.best_within(free))
            .min()
    }

    /// Whether parked task `rank` is a permit.
    fn is_permit(&self, rank: RankKey) -> bool {
        self.parked
            .get(&rank.id())
            .is_some_and(|parked| parked.slotless)
    }

    /// The reservation under a fair share (rule 12).
    pub(super) fn fair_reservation(&self, book: &TenantBook) -> Option<rank::FairKey> {
        book.reservation(|rank| {
            self.parked
                .get(&rank.id())
                .map(|parked| (parked.kind, parked.units))
        })
    }

    /// The task the pool drains for (rule 6, under a fair share rule 12).
    pub(super) fn reserved(&self) -> Option<RankKey> {
        match &self.tenants {
            None => self.starving.first().copied(),
            Some(book) => self.fair_reservation(book).map(|key| key.rank()),
        }
    }

    /// The best-ranked parked task of any kind, permits included.
    fn head(&self) -> Option<RankKey> {
        self.by_cost
            .iter()
            .chain(&self.permits_by_cost)
            .filter_map(CostIndex::best)
            .chain(self.several.best())
            .chain(self.several_permits.best())
            .min()
    }

    fn start_parked(&mut self, rank: RankKey, now: u64) {
        let Some((parked, tenant, also)) = self.remove_parked(rank.id()) else {
            return;
        };
        let request = Request {
            id: rank.id(),
            cost: ResourceCost::new(parked.kind, parked.units),
            tenant,
            timeout_ms: parked.timeout_ms,
            priority: parked.priority,
            slotless: parked.slotless,
            also,
        };
        let claimed = self.claim(&request, now);
        debug_assert!(claimed, "best_fit only returns tasks that fit");
        self.count_skip_of_head(&rank);
    }

    /// A task ranked `started` just started; if the head ranks ahead of it, the head was
    /// overtaken once more.
    pub(super) fn count_skip_of_head(&mut self, started: &RankKey) {
        let Some(max_skips) = self.limits.starvation.max_skips else {
            return;
        };
        let Some(head) = self.head() else {
            return;
        };
        if !head.ranks_ahead_of(started) {
            return;
        }
        let Some(parked) = self.parked.get_mut(&head.id()) else {
            return;
        };
        parked.skips = parked.skips.saturating_add(1);
        if parked.skips >= max_skips {
            let parked_at = parked.parked_at_ms;
            self.mark_starving(head, parked_at);
        }
    }

    /// Moves every task parked for at least `max_park_ms` into the starving set.
    pub(super) fn promote_aged(&mut self, now: u64) {
        let Some(max_park_ms) = self.limits.starvation.max_park_ms else {
            return;
        };
        while let Some(&(parked_at, id)) = self.by_park_time.first() {
            if parked_at.saturating_add(max_park_ms) > now {
                return;
            }
            self.by_park_time.pop_first();
            if let Some(parked) = self.parked.get(&id) {
                let rank = parked.rank(id);
                self.starving.insert(rank);
                if let Some(book) = &mut self.tenants {
                    book.mark_starving(rank);
                }
            }
        }
    }

    fn mark_starving(&mut self, rank: RankKey, parked_at: u64) {
        self.by_park_time.remove(&(parked_at, rank.id()));
        self.starving.insert(rank);
        if let Some(book) = &mut self.tenants {
            book.mark_starving(rank);
        }
    }
}

/// The better of `best` and the best ticket of several kinds (rule 25) in `index` that fits
/// `free`: the index is searched only when it holds a ticket.
fn several_within(
    index: &MultiIndex,
    free: &[u32; KINDS],
    best: Option<RankKey>,
) -> Option<RankKey> {
    if index.is_empty() {
        return best;
    }
    index.best_within(free, best)
}
