//! Rule 21: a full parking lot sheds its lowest priority first.
//!
//! # Algorithm
//!
//! The lot is bounded twice: at most `max_queue_depth` tickets parked, and (when set) at
//! most `max_queued_units` parked units of each kind, the analogue of a serving engine's
//! token-bounded waiting queue: a thousand short prompts and a thousand long ones are not
//! the same backlog. A newcomer that cannot start and would park past a bound looks at the
//! parked tickets of a *strictly lower priority* than its own:
//!
//! 1. while the units of its kind are past the bound, the lowest-ranked ticket of its kind
//!    is shed (a ticket of another kind frees none of the units that are short);
//! 2. then, while the depth is still reached, the lowest-ranked ticket of any kind is shed.
//!
//! Before anything is shed, the sums kept per kind and priority say whether the tickets of
//! lower priority can make room at all; if they cannot, nothing is shed and the newcomer is
//! refused. So a shed ticket is always replaced by a better one, and a refusal never costs a
//! parked ticket its place. Once room can be made, the lowest-ranked ticket of a kind is
//! the worst of its cost indexes (each node of a [`CostIndex`] keeps its subtree's worst
//! beside its best), and while tickets of a lower priority than the newcomer's remain, the
//! lowest-ranked ticket is one of them: a lower priority ranks behind a higher one.
//!
//! The newcomer parks before the tickets are shed, not after: shedding must leave it where
//! its admission judged it. A shed ticket may be the last its tenant has in the lot, and the
//! fair-share book forgets an idle tenant (rule 12's last start, rule 22's counter); the
//! newcomer of that tenant, parked afterwards, would come back as a tenant that never
//! started and overtake the reservation that had held it back.
//!
//! A ticket that comes back rather than being admitted (restored from a durable queue, or
//! awake after a retry's backoff, rule 16) parks whatever the bounds: it was admitted once
//! and must not be lost. It may take the queue past a bound; the next newcomer then has to
//! shed (or is refused) until the queue is back within it.
//!
//! Only a lower priority is shed, never an equal one, whatever the order (rule 20): within a
//! priority, the tickets parked first were promised their place, and an earlier deadline
//! orders the line without buying a way into it.
//!
//! # Invariants
//!
//! - `units[kind][priority]` and `count[priority]` are the sums over the parked tickets
//!   (permits included, sleepers not).
//! - At most `max_queue_depth + returned` tickets and `max_queued_units + returned_units`
//!   units of a kind are parked, where `returned` are the parked tickets that came back:
//!   an admission parks only within the bounds themselves, and only a return adds to both
//!   sides.
//!
//! # Cost
//!
//! Nothing is stored per ticket: a park or an unpark updates two sums, and the worsts ride
//! along the walk the cost index makes anyway. A newcomer at a bound decides in O(1) whether
//! room can be made, then sheds `k` tickets in O(k log n): each is the worst of at most
//! eight cost indexes' roots, removed as any parked ticket is.

use std::collections::BTreeSet;

use super::{Admit, CostIndex, ParkingLot, RankKey, Rejection, Ticket, KINDS};
use crate::domain::{Priority, ResourceKind, TaskId};

const PRIORITIES: usize = Priority::ALL.len();

/// The sums of the parked tickets by kind and priority, for the bounds of rule 21.
#[derive(Debug, Clone, Default)]
pub(super) struct QueueBook {
    /// Per kind and priority, the parked units.
    units: [[u64; PRIORITIES]; KINDS],
    /// Per priority, the parked tickets of every kind.
    count: [usize; PRIORITIES],
    /// The parked tickets that came back rather than being admitted (usually none), which
    /// may hold the queue past its bounds.
    returned: BTreeSet<TaskId>,
    /// Per kind, the units of the `returned` tickets.
    returned_units: [u64; KINDS],
}

impl QueueBook {
    /// A ticket ranked `rank` parks, holding `units` of `kind` in the queue.
    pub(super) fn park(&mut self, kind: ResourceKind, units: u32, rank: RankKey) {
        let level = rank.priority() as usize;
        self.units[kind.index()][level] += u64::from(units);
        self.count[level] += 1;
    }

    /// The ticket ranked `rank`, parked just now, came back rather than being admitted.
    fn returned(&mut self, kind: ResourceKind, units: u32, rank: RankKey) {
        if self.returned.insert(rank.id()) {
            self.returned_units[kind.index()] += u64::from(units);
        }
    }

    /// A parked ticket leaves the queue (it starts, expires, is cancelled or shed).
    pub(super) fn unpark(&mut self, kind: ResourceKind, units: u32, rank: RankKey) {
        let level = rank.priority() as usize;
        self.units[kind.index()][level] -= u64::from(units);
        self.count[level] -= 1;
        if !self.returned.is_empty() && self.returned.remove(&rank.id()) {
            self.returned_units[kind.index()] -= u64::from(units);
        }
    }

    /// Parked units of `kind`.
    pub(super) fn units(&self, kind: ResourceKind) -> u64 {
        self.units[kind.index()].iter().sum()
    }

    /// Parked units of `kind` of a priority below `priority`.
    fn units_below(&self, kind: ResourceKind, priority: Priority) -> u64 {
        self.units[kind.index()][..priority as usize].iter().sum()
    }

    /// Parked tickets of a priority below `priority`.
    fn count_below(&self, priority: Priority) -> usize {
        self.count[..priority as usize].iter().sum()
    }
}

impl ParkingLot {
    /// Admits a ticket (a permit when `permit`) as [`admit`](Self::admit) and
    /// [`admit_permit`](Self::admit_permit) do, except that at a bound it sheds nothing and
    /// is refused: for a ticket that parks here only to be taken out again at once (a
    /// permit whose caller will not wait, a submission that waits in a shared queue), which
    /// must not cost a parked ticket its place, and for a node of a shared queue, whose
    /// parked tickets belong to the fleet's queue.
    ///
    /// ```
    /// use prometheus_parking_lot_actors::domain::{PoolLimits, Priority, ResourceCost};
    /// use prometheus_parking_lot_actors::scheduler::core::{Admit, ParkingLot, Rejection, Ticket};
    ///
    /// let mut lot = ParkingLot::new(PoolLimits::new(4, 1).with_max_queue_depth(1)).unwrap();
    /// let ticket = |id, priority| Ticket {
    ///     id,
    ///     priority,
    ///     cost: ResourceCost::gpu_vram(4),
    ///     created_at_ms: id,
    ///     deadline_ms: None,
    ///     tenant: 0,
    ///     timeout_ms: None,
    ///     also: Default::default(),
    /// };
    /// assert_eq!(lot.admit(ticket(1, Priority::Low), 0), Admit::Start);
    /// assert_eq!(lot.admit(ticket(2, Priority::Low), 0), Admit::Park);
    /// let full = Admit::Reject(Rejection::QueueFull { max_queue_depth: 1 });
    /// assert_eq!(lot.admit_without_shedding(ticket(3, Priority::High), false, 0), full);
    /// // Admitted as usual, it takes the place of the task of lower priority.
    /// assert_eq!(
    ///     lot.admit(ticket(3, Priority::High), 0),
    ///     Admit::ParkShedding { shed: vec![2], started: vec![] }
    /// );
    /// ```
    pub fn admit_without_shedding(&mut self, ticket: Ticket, permit: bool, now: u64) -> Admit {
        self.admit_ticket(ticket, permit, false, now)
    }

    /// Parks a newcomer that could not start, shedding tickets of lower priority if a bound
    /// is reached, `sheds` allows it and they can make room; refuses it otherwise (rule 21).
    ///
    /// The newcomer parks before anything is shed, so that shedding leaves its standing as
    /// the admission judged it. Shed first, the last ticket its tenant has in the lot would
    /// take the tenant's record with it (the fair-share book forgets an idle tenant, its
    /// last start and, under a fair share by use, its place above the floor): parked after
    /// that, the newcomer would come back as a tenant that never started, rank ahead of the
    /// reservation that held it back, and start at once, a ticket shed for a place it did
    /// not need.
    pub(super) fn park_or_shed(
        &mut self,
        ticket: Ticket,
        slotless: bool,
        sheds: bool,
        now: u64,
    ) -> Admit {
        let (units_over, depth_over) = match self.room_to_make(&ticket) {
            Ok(over) => over,
            Err(rejection) => return Admit::Reject(rejection),
        };
        if (units_over, depth_over) == (0, 0) {
            self.park(ticket, slotless, now);
            return Admit::Park;
        }
        if !sheds {
            return Admit::Reject(self.full_for(&ticket));
        }
        self.park(ticket, slotless, now);
        let shed = self.shed(&ticket, units_over, depth_over);
        // A shed ticket may have been the reservation, or held back a fair-order peer: what
        // its leaving unblocks starts now, so saturation holds. The newcomer is not among
        // them: every shed ticket ranks below it, so none held it back, and its tenant's
        // record is the one the admission read (the property tests check it).
        let mut started = Vec::new();
        self.unpark(now, &mut started);
        Admit::ParkShedding { shed, started }
    }

    /// How far `ticket` would take the parked units of its kind past `max_queued_units`,
    /// and the parked tickets past `max_queue_depth`: (0, 0) when it fits both; the
    /// rejection when the tickets of a lower priority could not make that much room.
    fn room_to_make(&self, ticket: &Ticket) -> Result<(u64, usize), Rejection> {
        let (kind, needed, priority) = (ticket.cost.kind, ticket.cost.units, ticket.priority);
        let queued = self.queue.units(kind);
        let with_it = queued + u64::from(needed);
        let units_over = match self.limits.max_queued_units {
            // Even an empty queue could not hold it; else the lower priorities must make
            // the room it lacks.
            Some(bound)
                if u64::from(needed) > bound
                    || with_it.saturating_sub(bound) > self.queue.units_below(kind, priority) =>
            {
                return Err(Rejection::QueueUnitsFull {
                    kind,
                    queued,
                    needed,
                    max_queued_units: bound,
                });
            }
            Some(bound) => with_it.saturating_sub(bound),
            None => 0,
        };
        let max_queue_depth = self.limits.max_queue_depth;
        let depth_over = (self.parked.len() + 1).saturating_sub(max_queue_depth);
        if max_queue_depth == 0 || depth_over > self.queue.count_below(priority) {
            return Err(Rejection::QueueFull { max_queue_depth });
        }
        Ok((units_over, depth_over))
    }

    /// Sheds the lowest-ranked parked tickets of `ticket`'s kind until `units_over` units
    /// are gone, then the lowest-ranked of any kind until `depth_over` tickets are; returns
    /// their ids, in the order shed. [`room_to_make`](Self::room_to_make) has checked that
    /// the tickets of a lower priority suffice, so every one shed is of a lower priority
    /// (the newcomer, parked already, ranks above them all and is never its own victim).
    fn shed(&mut self, ticket: &Ticket, units_over: u64, depth_over: usize) -> Vec<TaskId> {
        let mut shed = Vec::new();
        let mut freed = 0u64;
        while freed < units_over {
            let Some(worst) = self.worst_of(ticket.cost.kind) else {
                break;
            };
            freed += self.shed_one(worst, ticket.priority);
            shed.push(worst.id());
        }
        while shed.len() < depth_over {
            let worst = ResourceKind::ALL
                .into_iter()
                .filter_map(|kind| self.worst_of(kind))
                .chain(self.several.worst())
                .chain(self.several_permits.worst())
                .max();
            let Some(worst) = worst else {
                break;
            };
            self.shed_one(worst, ticket.priority);
            shed.push(worst.id());
        }
        shed
    }

    /// The lowest-ranked parked ticket of one kind, `kind`, task or permit (a ticket of
    /// several kinds is in none of these indexes: a lot that bounds the queued units of a
    /// kind takes no such ticket, rule 25).
    fn worst_of(&self, kind: ResourceKind) -> Option<RankKey> {
        [
            &self.by_cost[kind.index()],
            &self.permits_by_cost[kind.index()],
        ]
        .into_iter()
        .filter_map(CostIndex::worst)
        .max()
    }

    /// Removes parked ticket `rank`, shed for a newcomer of `priority`; returns its units.
    fn shed_one(&mut self, rank: RankKey, priority: Priority) -> u64 {
        debug_assert!(rank.priority() < priority, "only a lower priority is shed");
        self.remove_parked(rank.id())
            .map_or(0, |(parked, ..)| u64::from(parked.units))
    }

    /// Parks a ticket that comes back (restored, or awake after its sleep), whatever the
    /// bounds.
    pub(super) fn park_returned(&mut self, ticket: Ticket, now: u64) {
        self.park(ticket, false, now);
        if let Some(parked) = self.parked.get(&ticket.id) {
            let rank = parked.rank(ticket.id);
            self.queue.returned(parked.kind, parked.units, rank);
        }
    }

    /// Why a ticket that would have to shed, but may not, is refused: the bound it meets.
    fn full_for(&self, ticket: &Ticket) -> Rejection {
        let (kind, needed) = (ticket.cost.kind, ticket.cost.units);
        let queued = self.queue.units(kind);
        match self.limits.max_queued_units {
            Some(bound) if queued + u64::from(needed) > bound => Rejection::QueueUnitsFull {
                kind,
                queued,
                needed,
                max_queued_units: bound,
            },
            _ => Rejection::QueueFull {
                max_queue_depth: self.limits.max_queue_depth,
            },
        }
    }

    /// Rule 21's bounds, its sums and the cost indexes' worsts, for `check_invariants`.
    pub(super) fn check_queue_bounds(&self) -> Result<(), String> {
        let returned = self.queue.returned.len();
        if self.parked.len() > self.limits.max_queue_depth + returned {
            return Err(format!(
                "{} parked past the queue depth ({returned} of them came back)",
                self.parked.len()
            ));
        }
        if let Some(id) = self
            .queue
            .returned
            .iter()
            .find(|id| !self.parked.contains_key(id))
        {
            return Err(format!("task {id} counts as come back but is not parked"));
        }
        let mut units = [[0u64; PRIORITIES]; KINDS];
        let mut count = [0usize; PRIORITIES];
        for parked in self.parked.values() {
            let level = parked.priority as usize;
            units[parked.kind.index()][level] += u64::from(parked.units);
            count[level] += 1;
        }
        if units != self.queue.units || count != self.queue.count {
            return Err(format!(
                "shedding sums: units {:?}, counts {:?}; parked: units {units:?}, counts \
                 {count:?}",
                self.queue.units, self.queue.count
            ));
        }
        for kind in ResourceKind::ALL {
            let scanned = self
                .parked
                .iter()
                .filter(|(id, parked)| parked.kind == kind && !self.extras.contains_key(id))
                .map(|(&id, parked)| parked.rank(id))
                .max();
            if self.worst_of(kind) != scanned {
                return Err(format!(
                    "the worst parked {kind:?} ticket is {scanned:?}, the indexes say {:?}",
                    self.worst_of(kind)
                ));
            }
        }
        if let Some(bound) = self.limits.max_queued_units {
            let allowed = |kind: ResourceKind| bound + self.queue.returned_units[kind.index()];
            if let Some(kind) = ResourceKind::ALL
                .into_iter()
                .find(|&kind| self.queue.units(kind) > allowed(kind))
            {
                return Err(format!(
                    "{} units of {kind:?} parked past max_queued_units {bound} (and {} units \
                     that came back)",
                    self.queue.units(kind),
                    self.queue.returned_units[kind.index()]
                ));
            }
        }
        Ok(())
    }
}
