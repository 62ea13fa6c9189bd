//! Rule 17: why a parked ticket waits, the question an operator asks first ("why is my job
//! not running?"). Computed on demand from what the lot keeps anyway, in O(1) but for the
//! last case (see [`WaitReason::Behind`]).

use crate::domain::{ResourceCost, ResourceKind, TaskId};

use super::{ParkingLot, RankKey, TenantKey};

/// Why a parked ticket has not started: the first obstacle, in this order (the physical
/// ones first; a ticket that meets none of them waits for the order of the rules).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(tag = "reason", rename_all = "snake_case")]
pub enum WaitReason {
    /// It waits out a failed run's backoff until `until_ms` (rule 16).
    Sleeping {
        /// When it parks again.
        until_ms: u128,
    },
    /// It is held until `pending` more of the tasks it depends on end (rule 24).
    Dependencies {
        /// Its parents still live.
        pending: u32,
    },
    /// The pool is paused (rule 18): nothing starts until it resumes.
    Paused,
    /// Its kind has too few free units: `free` of the `needed` (capacity less what running
    /// tickets hold, at most the headroom of rule 11).
    Units {
        /// The kind it asks for.
        kind: ResourceKind,
        /// Its cost.
        needed: u32,
        /// The units free now.
        free: u32,
    },
    /// Its kind's budget holds `level` of the `needed` units, or has no start left (rule
    /// 15); the bucket holds them at `ready_at_ms` (tickets ahead of it may spend first).
    Budget {
        /// The kind it asks for.
        kind: ResourceKind,
        /// Its cost.
        needed: u32,
        /// Whole units in the bucket.
        level: u32,
        /// When the bucket will hold its cost (and a start).
        ready_at_ms: u128,
    },
    /// Its tenant may hold `room` more units of its kind under the fair share (rule 12).
    TenantShare {
        /// The kind it asks for.
        kind: ResourceKind,
        /// Its cost.
        needed: u32,
        /// What its tenant may still take.
        room: u32,
    },
    /// It needs a worker slot and none is idle: `busy` run tasks (others may rest, rule 9).
    Worker {
        /// Slots running a task.
        busy: usize,
    },
    /// It fits, but the reservation holds it back (rules 6, 12): the starving ticket
    /// `reserved` ranks ahead of it, and nothing ranked below that starts before it does
    /// (unless it may backfill, rule 13).
    Reserved {
        /// The reserved ticket.
        reserved: TaskId,
    },
    /// It fits and no reservation holds it back, yet it waits for the order the rules
    /// keep: under a fair share a ticket of a tenant using less goes first, and with every
    /// slot busy a permit waits behind a fair-better task that needs a slot. `ahead` tickets
    /// rank ahead of it (a count of the parked tickets, O(n): the one case that is not
    /// O(1)).
    Behind {
        /// Parked tickets ranked ahead of it.
        ahead: usize,
    },
}

impl WaitReason {
    /// Its name, as it serialises (`"units"`, `"budget"`, `"behind"`, ...).
    ///
    /// ```
    /// use prometheus_parking_lot_actors::scheduler::core::WaitReason;
    ///
    /// assert_eq!(WaitReason::Paused.name(), "paused");
    /// assert_eq!(WaitReason::Behind { ahead: 3 }.name(), "behind");
    /// ```
    pub fn name(&self) -> &'static str {
        match self {
            WaitReason::Sleeping { .. } => "sleeping",
            WaitReason::Dependencies { .. } => "dependencies",
            WaitReason::Paused => "paused",
            WaitReason::Units { .. } => "units",
            WaitReason::Budget { .. } => "budget",
            WaitReason::TenantShare { .. } => "tenant_share",
            WaitReason::Worker { .. } => "worker",
            WaitReason::Reserved { .. } => "reserved",
            WaitReason::Behind { .. } => "behind",
        }
    }
}

impl ParkingLot {
    /// Parked tickets `offset..offset + limit` in rank order (best first), then the
    /// sleepers (rule 16) and the held tickets (rule 24) in rank order, and how many there
    /// are in all: O(n) to find the page, O(limit log limit) to order it.
    pub fn parked_page(&self, offset: usize, limit: usize) -> (Vec<TaskId>, usize) {
        let mut ranks: Vec<(bool, RankKey)> = self
            .parked
            .iter()
            .map(|(&id, parked)| (false, parked.rank(id)))
            .chain(
                self.sleepers
                    .values()
                    .map(|(_, ticket)| (true, self.rank_of(ticket))),
            )
            .chain(
                self.dependencies
                    .tickets()
                    .map(|ticket| (true, self.rank_of(ticket))),
            )
            .collect();
        let total = ranks.len();
        let end = offset.saturating_add(limit).min(total);
        if offset >= end {
            return (Vec::new(), total);
        }
        if end < total {
            ranks.select_nth_unstable(end);
            ranks.truncate(end);
        }
        ranks.sort_unstable();
        let page = ranks[offset..].iter().map(|(_, rank)| rank.id()).collect();
        (page, total)
    }

    /// The cost and priority of live ticket `id` (parked, held or running).
    pub fn ticket_of(
        &self,
        id: TaskId,
    ) -> Option<(crate::domain::ResourceCost, crate::domain::Priority)> {
        if let Some(ticket) = self.dependencies.ticket(id) {
            return Some((ticket.cost, ticket.priority));
        }
        if let Some(parked) = self.parked.get(&id) {
            let cost = crate::domain::ResourceCost::new(parked.kind, parked.units);
            return Some((cost, parked.priority));
        }
        let claim = self.running.get(&id)?;
        Some((
            crate::domain::ResourceCost::new(claim.kind, claim.units),
            claim.priority,
        ))
    }

    /// Why parked (or sleeping) ticket `id` has not started, or `None` when the lot does not
    /// hold it parked (rule 17). Read-only: asking changes nothing.
    ///
    /// ```
    /// use prometheus_parking_lot_actors::domain::{PoolLimits, Priority, ResourceCost, ResourceKind};
    /// use prometheus_parking_lot_actors::scheduler::core::{Admit, ParkingLot, Ticket, WaitReason};
    ///
    /// let mut lot = ParkingLot::new(PoolLimits::new(10, 4)).unwrap();
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
    /// assert_eq!(lot.admit(ticket(1, 8), 0), Admit::Start);
    /// assert_eq!(lot.admit(ticket(2, 6), 0), Admit::Park);
    /// assert_eq!(
    ///     lot.why_waiting(2),
    ///     Some(WaitReason::Units { kind: ResourceKind::GpuVram, needed: 6, free: 2 })
    /// );
    /// assert_eq!(lot.why_waiting(1), None, "running");
    /// ```
    pub fn why_waiting(&self, id: TaskId) -> Option<WaitReason> {
        self.first_obstacle(id, true)
    }

    /// The name of [`why_waiting`](Self::why_waiting)'s answer (see [`WaitReason::name`]),
    /// in O(1): what a trace's wait span says, for every task that parks.
    pub fn why_waiting_name(&self, id: TaskId) -> Option<&'static str> {
        self.first_obstacle(id, false).map(|reason| reason.name())
    }

    /// The first obstacle of parked ticket `id`; `Behind`'s count only if `count_ahead`
    /// (else 0: the one O(n) case).
    fn first_obstacle(&self, id: TaskId, count_ahead: bool) -> Option<WaitReason> {
        if let Some(held) = self.why_held(id) {
            return Some(held);
        }
        if let Some(&(until_ms, _)) = self.sleepers.get(&id) {
            return Some(WaitReason::Sleeping {
                until_ms: u128::from(until_ms),
            });
        }
        let parked = self.parked.get(&id)?;
        if self.paused {
            return Some(WaitReason::Paused);
        }
        // A ticket of several kinds (rule 25) names the first kind that blocks it.
        let first = ResourceCost::new(parked.kind, parked.units);
        let also = self.extras_of(id);
        let costs = || std::iter::once(first).chain(also.costs());
        for ResourceCost {
            kind,
            units: needed,
        } in costs()
        {
            let index = kind.index();
            let free =
                (self.limits.capacity.get(kind) - self.used[index]).min(self.headroom[index]);
            if needed > free {
                return Some(WaitReason::Units { kind, needed, free });
            }
        }
        for ResourceCost {
            kind,
            units: needed,
        } in costs()
        {
            if let Some(budget) = self.budget(kind) {
                if needed > budget.free() {
                    return Some(WaitReason::Budget {
                        kind,
                        needed,
                        level: budget.level(),
                        ready_at_ms: u128::from(budget.ready_at(needed)),
                    });
                }
            }
        }
        let (kind, needed) = (parked.kind, parked.units);
        if let Some(book) = &self.tenants {
            let tenant: TenantKey = book.tenant_of(id);
            let room = book.room(tenant, kind);
            if needed > room {
                return Some(WaitReason::TenantShare { kind, needed, room });
            }
        }
        if !parked.slotless && self.idle_workers.is_empty() {
            return Some(WaitReason::Worker {
                busy: self.busy_workers(),
            });
        }
        let rank = parked.rank(id);
        if let Some(reserved) = self.holding_back(id, rank) {
            return Some(WaitReason::Reserved { reserved });
        }
        if !count_ahead {
            return Some(WaitReason::Behind { ahead: 0 });
        }
        let ahead = self
            .parked
            .iter()
            .filter(|(&other, parked)| parked.rank(other).ranks_ahead_of(&rank))
            .count();
        Some(WaitReason::Behind { ahead })
    }

    /// The reserved ticket that holds back parked ticket `id` ranked `rank`, if one does:
    /// the reservation when it ranks ahead (rule 6); under a fair share, the reservation
    /// when it comes first in the fair order, or a starving ticket of its own tenant ranked
    /// ahead of it (rule 12).
    pub(super) fn holding_back(&self, id: TaskId, rank: super::RankKey) -> Option<TaskId> {
        let Some(book) = &self.tenants else {
            let reserved = self.starving.first()?;
            return (reserved.id() != id && reserved.ranks_ahead_of(&rank)).then(|| reserved.id());
        };
        let parked = self.parked.get(&id)?;
        let tenant = book.tenant_of(id);
        if book.starving_ahead_of(tenant, &rank) {
            return self
                .starving
                .iter()
                .find(|starving| {
                    starving.ranks_ahead_of(&rank) && book.tenant_of(starving.id()) == tenant
                })
                .map(|starving| starving.id());
        }
        let reserved = self.fair_reservation(book)?;
        let key = book.key(tenant, parked.kind, rank);
        (reserved.rank() != rank && reserved < key).then(|| reserved.rank().id())
    }
}
