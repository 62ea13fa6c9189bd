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
//! parked ticket its place.
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
//! - `by_rank[kind]` holds exactly the parked tickets of `kind` (permits included, sleepers
//!   not), under the rank they are indexed by everywhere else.
//! - `units[kind][priority]` and `count[priority]` are the sums over those tickets.
//! - At most `max_queue_depth + returned` tickets and `max_queued_units + returned_units`
//!   units of a kind are parked, where `returned` are the parked tickets that came back:
//!   an admission parks only within the bounds themselves, and only a return adds to both
//!   sides.
//!
//! # Cost
//!
//! A park or an unpark adds one `BTreeSet` insert or remove, O(log n). A newcomer at a bound
//! decides in O(1) whether room can be made, then sheds `k` tickets in O(k log n), walking
//! each kind's set from its lowest-ranked end.

use std::collections::BTreeSet;

use super::{Admit, ParkingLot, RankKey, Rejection, Ticket, KINDS};
use crate::domain::{Priority, ResourceKind};

const PRIORITIES: usize = Priority::ALL.len();

/// The parked tickets by kind and rank, with their sums, for the bounds of rule 21.
#[derive(Debug, Clone, Default)]
pub(super) struct QueueBook {
    /// Per kind, the parked tickets in rank order: the last is shed first.
    by_rank: [BTreeSet<RankKey>; KINDS],
    /// Per kind and priority, the parked units.
    units: [[u64; PRIORITIES]; KINDS],
    /// Per priority, the parked tickets of every kind.
    count: [usize; PRIORITIES],
    /// The parked tickets that came back rather than being admitted (usually none), which
    /// may hold the queue past its bounds.
    returned: BTreeSet<u64>,
    /// Per kind, the units of the `returned` tickets.
    returned_units: [u64; KINDS],
}

impl QueueBook {
    /// A ticket ranked `rank` parks, holding `units` of `kind` in the queue.
    pub(super) fn park(&mut self, kind: ResourceKind, units: u32, rank: RankKey) {
        let level = rank.priority() as usize;
        self.by_rank[kind.index()].insert(rank);
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
        if self.by_rank[kind.index()].remove(&rank) {
            self.units[kind.index()][level] -= u64::from(units);
            self.count[level] -= 1;
        }
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

    /// Parked tickets of `kind` below `priority`, lowest-ranked first.
    fn lowest_of(
        &self,
        kind: ResourceKind,
        priority: Priority,
    ) -> impl Iterator<Item = RankKey> + '_ {
        self.by_rank[kind.index()]
            .iter()
            .rev()
            .take_while(move |rank| rank.priority() < priority)
            .copied()
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
    pub(super) fn park_or_shed(
        &mut self,
        ticket: Ticket,
        slotless: bool,
        sheds: bool,
        now: u64,
    ) -> Admit {
        let shed = match self.to_shed(&ticket) {
            Ok(shed) if shed.is_empty() || sheds => shed,
            Ok(_) => return Admit::Reject(self.full_for(&ticket)),
            Err(rejection) => return Admit::Reject(rejection),
        };
        for rank in &shed {
            self.remove_parked(rank.id());
        }
        self.park(ticket, slotless, now);
        if shed.is_empty() {
            return Admit::Park;
        }
        // A shed ticket may have been the reservation, or held back a fair-order peer: what
        // its leaving unblocks starts now, so saturation holds. The newcomer is not among
        // them: every shed ticket ranks below it, so none held it back.
        let mut started = Vec::new();
        self.unpark(now, &mut started);
        debug_assert!(!started.contains(&ticket.id), "shedding freed no units");
        Admit::ParkShedding {
            shed: shed.iter().map(RankKey::id).collect(),
            started,
        }
    }

    /// The tickets to shed so that `ticket` parks within both bounds, lowest-ranked first
    /// (none when it fits), or the rejection when the lower priorities cannot make room.
    fn to_shed(&self, ticket: &Ticket) -> Result<Vec<RankKey>, Rejection> {
        let (kind, needed, priority) = (ticket.cost.kind, ticket.cost.units, ticket.priority);
        let max_queue_depth = self.limits.max_queue_depth;
        let units_full = |queued: u64, max_queued_units: u64| Rejection::QueueUnitsFull {
            kind,
            queued,
            needed,
            max_queued_units,
        };
        let queued = self.queue.units(kind);
        let units_over = match self.limits.max_queued_units {
            Some(bound) if u64::from(needed) > bound => return Err(units_full(queued, bound)),
            Some(bound) => (queued + u64::from(needed)).saturating_sub(bound),
            None => 0,
        };
        let depth_over = (self.parked.len() + 1).saturating_sub(max_queue_depth);
        if units_over == 0 && depth_over == 0 {
            return Ok(Vec::new());
        }
        if self.queue.units_below(kind, priority) < units_over {
            let bound = self.limits.max_queued_units.unwrap_or(u64::MAX);
            return Err(units_full(queued, bound));
        }
        if self.queue.count_below(priority) < depth_over || max_queue_depth == 0 {
            return Err(Rejection::QueueFull { max_queue_depth });
        }
        let mut shed = Vec::new();
        let mut freed = 0u64;
        for rank in self.queue.lowest_of(kind, priority) {
            if freed >= units_over {
                break;
            }
            freed += self
                .parked
                .get(&rank.id())
                .map_or(0, |p| u64::from(p.units));
            shed.push(rank);
        }
        let still_over = depth_over.saturating_sub(shed.len());
        if still_over > 0 {
            shed.extend(self.lowest_of_any_kind(priority, still_over, &shed));
        }
        Ok(shed)
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

    /// The `count` lowest-ranked parked tickets of any kind below `priority`, leaving out
    /// those in `taken`; lowest-ranked first.
    fn lowest_of_any_kind(
        &self,
        priority: Priority,
        count: usize,
        taken: &[RankKey],
    ) -> Vec<RankKey> {
        // The `count` lowest of each kind include the `count` lowest of all.
        let mut lowest: Vec<RankKey> = ResourceKind::ALL
            .into_iter()
            .flat_map(|kind| {
                self.queue
                    .lowest_of(kind, priority)
                    .filter(|rank| !taken.contains(rank))
                    .take(count)
            })
            .collect();
        lowest.sort_unstable_by(|a, b| b.cmp(a));
        lowest.truncate(count);
        lowest
    }

    /// Rule 21's bounds and the shedding index's books, for `check_invariants`.
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
        for (&id, parked) in &self.parked {
            let level = parked.priority as usize;
            units[parked.kind.index()][level] += u64::from(parked.units);
            count[level] += 1;
            if !self.queue.by_rank[parked.kind.index()].contains(&parked.rank(id)) {
                return Err(format!("parked task {id} is not in the shedding index"));
            }
        }
        let indexed: usize = self.queue.by_rank.iter().map(BTreeSet::len).sum();
        if units != self.queue.units || count != self.queue.count || indexed != self.parked.len() {
            return Err(format!(
                "shedding index: {indexed} tickets, units {:?}, counts {:?}; parked: {}, \
                 units {units:?}, counts {count:?}",
                self.queue.units,
                self.queue.count,
                self.parked.len()
            ));
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
