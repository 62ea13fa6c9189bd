//! Admission of a newcomer (rules 1-3): the screen that refuses or expires it, the fast path
//! that starts it when it fits and no reservation holds it back (rules 6, 12, 13, 14), else
//! parking or shedding (rule 21); and restoring a ticket a durable queue kept.

use super::fair_share::TenantBook;
use super::{
    budget, rank, saturate_timeout, Admit, ParkingLot, RankKey, Rejection, Request, Ticket,
    NO_TIMEOUT,
};
use crate::domain::ResourceKind;

impl ParkingLot {
    /// Admits a task at time `now`: start it, park it, expire it or reject it.
    pub fn admit(&mut self, ticket: Ticket, now: u64) -> Admit {
        self.admit_ticket(ticket, false, true, now)
    }

    /// Under a start cap (rule 15) a start is never free: a ticket of no units of that kind
    /// costs one.
    pub(super) fn at_least_a_unit(&self, mut ticket: Ticket) -> Ticket {
        ticket.cost = self.least_cost(ticket.cost);
        ticket
    }

    /// [`at_least_a_unit`](Self::at_least_a_unit) for a cost alone.
    fn least_cost(&self, mut cost: crate::domain::ResourceCost) -> crate::domain::ResourceCost {
        let capped = self
            .budget(cost.kind)
            .is_some_and(budget::KindBudget::caps_starts);
        if capped && cost.units == 0 {
            cost.units = 1;
        }
        cost
    }

    /// What [`admit`](Self::admit) would answer `ticket` at `now` whatever the room: a
    /// rejection (a duplicate id, more units than the pool has, more than a tenant's share)
    /// or an expiry; `None` when it would start or park it. Changes nothing: for a task
    /// that is to wait elsewhere (a shared queue's, for a fleet's budget) but must be
    /// refused as this pool would refuse it.
    pub fn screen(&self, ticket: &Ticket, now: u64) -> Option<Admit> {
        // The ticket's parts, not a copy of it: it is read once, where it lies.
        let (id, cost) = (ticket.id, self.least_cost(ticket.cost));
        if self.is_live(id) {
            return Some(Admit::Reject(Rejection::DuplicateId(id)));
        }
        let capacity = self.limits.capacity.get(cost.kind);
        if cost.units > capacity {
            return Some(Admit::Reject(Rejection::InsufficientResources {
                kind: cost.kind,
                needed: cost.units,
                capacity,
            }));
        }
        if let Some(book) = &self.tenants {
            let max_per_tenant = book.cap(cost.kind);
            if cost.units > max_per_tenant {
                return Some(Admit::Reject(Rejection::AboveTenantShare {
                    kind: cost.kind,
                    needed: cost.units,
                    max_per_tenant,
                }));
            }
        }
        if !ticket.also.is_empty() {
            if let Some(refused) = self.screen_several(&ticket.also) {
                return Some(refused);
            }
        }
        if ticket.deadline_ms.is_some_and(|deadline| deadline <= now) {
            return Some(Admit::Expire);
        }
        None
    }

    /// The refusal of a ticket's costs beside its first (rule 25): a kind it needs more
    /// of than the pool has, or a pool whose rules take one kind per ticket.
    fn screen_several(&self, also: &crate::domain::ExtraCosts) -> Option<Admit> {
        for cost in also.costs() {
            let capacity = self.limits.capacity.get(cost.kind);
            if cost.units > capacity {
                return Some(Admit::Reject(Rejection::InsufficientResources {
                    kind: cost.kind,
                    needed: cost.units,
                    capacity,
                }));
            }
        }
        let one_kind_rule = if self.tenants.is_some() {
            Some("a fair share")
        } else if self.limits.max_queued_units.is_some() {
            Some("max_queued_units")
        } else {
            None
        };
        one_kind_rule.map(|rule| Admit::Reject(Rejection::SeveralKinds { rule }))
    }

    /// Admits a task, or a permit (`slotless`, rule 14); one that must park past a bound
    /// sheds tickets of lower priority if `sheds` (rule 21), else it is refused.
    pub(super) fn admit_ticket(
        &mut self,
        ticket: Ticket,
        slotless: bool,
        sheds: bool,
        now: u64,
    ) -> Admit {
        if let Some(refused) = self.screen(&ticket, now) {
            return refused;
        }
        let ticket = self.at_least_a_unit(ticket);
        let Ticket { id, cost, .. } = ticket;
        self.clock = now;
        if let Some(book) = &mut self.tenants {
            book.arrive(ticket.tenant);
        }
        if let Some(budgets) = &mut self.budgets {
            budgets.refill(now);
        }
        self.promote_aged(now);
        let rank = self.rank_of(&ticket);
        let request = Request {
            id,
            cost,
            tenant: ticket.tenant,
            timeout_ms: ticket.timeout_ms.map_or(NO_TIMEOUT, saturate_timeout),
            priority: ticket.priority,
            slotless,
            also: ticket.also,
        };
        if !self.paused && self.may_start(&rank, &request, now) && self.claim(&request, now) {
            self.count_skip_of_head(&rank);
            // A start can let others start too. Under a fair share it changes its tenant's
            // keys: that can move the reservation, or (for a permit started while every
            // slot is busy) let a permit overtake a task that waits for a slot. With a
            // reservation, a newcomer that ranks ahead of it (a higher priority, or an
            // earlier deadline under the deadline order) delays the reserved ticket's start,
            // and tickets that end before the new time may backfill (rule 13).
            let fair_moves = self.tenants.is_some() && (!self.starving.is_empty() || slotless);
            let backfill_opens = !self.starving.is_empty() && self.limits.backfill;
            if !fair_moves && !backfill_opens {
                return Admit::Start;
            }
            let mut started = Vec::new();
            self.unpark(now, &mut started);
            return if started.is_empty() {
                Admit::Start
            } else {
                Admit::StartWith(started)
            };
        }
        self.park_or_shed(ticket, slotless, sheds, now)
    }

    /// Parks a task that a durable queue kept from an earlier run (`load_parked`), without
    /// the fast path and past `max_queue_depth` if need be: it is stored already and must not
    /// be lost. Call [`tick`](Self::tick) after the last one to start what fits.
    ///
    /// A stored ticket this pool would refuse now (its configuration changed since: less
    /// capacity, a smaller share, a rule that counts one kind per ticket) is refused as
    /// [`admit`](Self::admit) would refuse it, rather than parked where it cannot start.
    pub fn restore(&mut self, ticket: Ticket, now: u64) -> Result<(), Rejection> {
        self.screen_stored(&ticket, now)?;
        self.park_returned(self.at_least_a_unit(ticket), now);
        Ok(())
    }

    /// The refusal [`screen`](Self::screen) gives a stored ticket. One past its deadline is
    /// not refused: it parks and the next tick expires it, as it would any parked task.
    pub(super) fn screen_stored(&self, ticket: &Ticket, now: u64) -> Result<(), Rejection> {
        match self.screen(ticket, now) {
            Some(Admit::Reject(rejection)) => Err(rejection),
            _ => Ok(()),
        }
    }

    /// Whether a newcomer ranked `rank` asking for `request` may start now as far as the
    /// reservations go (rules 6, 12, 13).
    fn may_start(&self, rank: &RankKey, request: &Request, now: u64) -> bool {
        let Request {
            cost,
            tenant,
            timeout_ms,
            ..
        } = *request;
        let reserved = match &self.tenants {
            None => self
                .starving
                .first()
                .filter(|reserved| reserved.ranks_ahead_of(rank))
                .copied(),
            Some(book) => {
                if book.starving_ahead_of(tenant, rank) {
                    return false;
                }
                let key = book.key(tenant, cost.kind, *rank);
                if request.slotless && self.fair_best_waits_for_a_slot(book, key) {
                    return false;
                }
                self.fair_reservation(book)
                    .filter(|reserved| *reserved < key)
                    .map(|reserved| reserved.rank())
            }
        };
        let Some(reserved) = reserved else {
            return true;
        };
        // A ticket of several kinds never backfills (rule 25): the shadow knows one kind.
        if timeout_ms == NO_TIMEOUT || !request.also.is_empty() {
            return false;
        }
        let Some(shadow) = self.shadow(reserved, now) else {
            return false;
        };
        now.saturating_add(u64::from(timeout_ms)) <= shadow.at
            || shadow.spares(cost, request.slotless)
    }

    /// Whether, with every worker slot busy, a parked task that fits ranks ahead of a
    /// newcomer permit keyed `key` under the fair order: the newcomer then waits in line
    /// behind it, as a parked permit would (rule 14). Not when the reservation ranks ahead
    /// of that task: the newcomer is then a backfill candidate (rule 13), judged as
    /// [`best_fit`](Self::best_fit) judges a parked permit.
    fn fair_best_waits_for_a_slot(&self, book: &TenantBook, key: rank::FairKey) -> bool {
        if !self.idle_workers.is_empty() {
            return false;
        }
        let free = ResourceKind::ALL.map(|kind| self.free(kind));
        let ceiling = self
            .best_within(&self.by_cost, &free)
            .into_iter()
            .chain(self.best_within(&self.permits_by_cost, &free))
            .min();
        let Some(best) = ceiling.and_then(|best| book.best_fit(&free, best.priority())) else {
            return false;
        };
        best < key
            && self
                .fair_reservation(book)
                .is_none_or(|reserved| reserved >= best)
    }
}
