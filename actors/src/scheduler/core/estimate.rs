//! Rule 20: when a parked ticket is expected to start, and its place in line.
//!
//! # What it uses
//!
//! - **Run times it has seen.** When a claim ends, the lot adds its run time (end less
//!   start, by the lot's clock) to a mean per *cost class*: the kind, whether it is a permit,
//!   and the power of two its units fall in (1, 2-3, 4-7, ...; 0 alone). The mean forgets:
//!   the first 16 runs of a class are averaged evenly, later ones with a weight of 1/16 (an
//!   exponentially weighted mean), so a class whose work changes is followed within a few
//!   dozen runs. A second mean per kind (and permit or not) covers every size.
//! - **A ticket's expected run time** ([`ParkingLot::expected_run_ms`]): its class's mean,
//!   else its kind's mean, at most its execution timeout in both cases; with no run of its
//!   kind seen yet, its timeout (an upper bound); with neither, unknown.
//! - **A running claim's expected end:** its start plus its expected run time. One that has
//!   run past that is expected to end now (it is late; the heavy tail of run times says it
//!   may run on, which is one way the estimate is wrong). A claim of unknown run time never
//!   ends as far as the estimate knows.
//!
//! # How
//!
//! A simulation of the lot from `now` on, with no arrival after `now`: the running claims
//! end at their expected ends, in that order; after each end the best-ranked parked ticket
//! that fits the free units (and a worker slot, but for a permit) starts, skipping larger
//! ones, until nothing more fits (rule 4), and runs for its expected run time. The
//! reservation holds back every ticket ranked below it (rule 6): the starving tickets now,
//! and those that age into starvation at `parked_at + max_park_ms` while the simulation
//! runs. Budgets refill by their own arithmetic (rule 15: the simulation copies the buckets
//! and steps to the instants a refill lets a parked ticket start), sleepers park at their
//! wake-up (rule 16), and the headroom of rule 11 stays what it is now less the starts (the
//! other process keeps what it holds).
//!
//! # What it leaves out (when it is wrong)
//!
//! - Arrivals after `now`: a ticket of higher priority that comes later starts first, so
//!   under a stream of urgent work a low-priority ticket starts later than estimated.
//! - Run times that differ from their class's mean (a heavy tail), and claims running past
//!   their mean.
//! - Backfill (rule 13): tickets held back by a reservation may start earlier, in its
//!   shadow, than the simulation (which drains for it) says; the reservation itself is not
//!   delayed by backfill, so its own estimate holds.
//! - The fair share's order (rule 12), skips counted in the future (rule 5), cancels,
//!   expiries, preemption, and a headroom that grows back.
//!
//! # Cost
//!
//! One simulation copies the cost indexes of the parked tickets (O(n)) and handles each
//! event (an end, an ageing, a wake-up, a refill step) with a heap or ordered-set step and
//! each start with a 32-step index walk and an O(log n) removal: O((n + r) log n) for n
//! parked tickets and r running claims. [`ParkingLot::estimate_all`] estimates every parked
//! ticket in one simulation; [`ParkingLot::estimate_start`] and
//! [`ParkingLot::estimate_admission`] stop it as soon as their ticket starts. A simulation
//! handles at most `4 (n + r) + 1,024` events; past that (budgets refilling slowly under a
//! long queue) it gives up and the estimate is unknown.

use std::cmp::Reverse;
use std::collections::{BTreeSet, BinaryHeap};

use serde::Serialize;

use crate::domain::{ResourceCost, ResourceKind, TaskId};

use super::{CostIndex, FastMap, ParkingLot, RankKey, Ticket, TokenBucket, KINDS, NO_WORKER};

/// Size classes: units 0, then one per power of two up to 2^31.
const SIZE_CLASSES: usize = 33;
/// Runs after which a class's mean weighs each new run by 1/`FORGET`.
const FORGET: u32 = 16;

/// A mean of run times that forgets (see the module docs).
#[derive(Debug, Clone, Copy, Default)]
struct Mean {
    ms: f64,
    runs: u32,
}

impl Mean {
    fn add(&mut self, ms: u64) {
        self.runs = self.runs.saturating_add(1);
        let weight = 1.0 / f64::from(self.runs.min(FORGET));
        self.ms += (ms as f64 - self.ms) * weight;
    }

    fn get(&self) -> Option<u64> {
        (self.runs > 0).then(|| self.ms.round() as u64)
    }
}

/// The run times the lot has seen, per cost class and per kind (see the module docs).
#[derive(Debug, Clone)]
pub(super) struct RunTimes {
    /// By `row(kind, slotless)`, then size class.
    classes: Box<[[Mean; SIZE_CLASSES]; KINDS * 2]>,
    /// By `row(kind, slotless)`, every size.
    kinds: [Mean; KINDS * 2],
}

impl Default for RunTimes {
    fn default() -> Self {
        Self {
            classes: Box::new([[Mean::default(); SIZE_CLASSES]; KINDS * 2]),
            kinds: [Mean::default(); KINDS * 2],
        }
    }
}

fn row(kind: ResourceKind, slotless: bool) -> usize {
    kind.index() * 2 + usize::from(slotless)
}

/// The size class of a cost of `units`: 0 for none, else 1 + the position of its top bit.
fn size_class(units: u32) -> usize {
    (u32::BITS - units.leading_zeros()) as usize
}

impl RunTimes {
    /// A claim of `units` of `kind` ran `ms`.
    pub(super) fn observe(&mut self, kind: ResourceKind, units: u32, slotless: bool, ms: u64) {
        let row = row(kind, slotless);
        self.classes[row][size_class(units)].add(ms);
        self.kinds[row].add(ms);
    }

    /// The run time expected of a ticket (see the module docs).
    fn expected(
        &self,
        kind: ResourceKind,
        units: u32,
        slotless: bool,
        timeout_ms: Option<u64>,
    ) -> Option<u64> {
        let row = row(kind, slotless);
        let seen = self.classes[row][size_class(units)]
            .get()
            .or_else(|| self.kinds[row].get());
        match (seen, timeout_ms) {
            (Some(seen), Some(timeout)) => Some(seen.min(timeout)),
            (seen, timeout) => seen.or(timeout),
        }
    }
}

/// Where a parked ticket stands: its place in line and when it is expected to start.
///
/// ```
/// use prometheus_parking_lot_actors::scheduler::core::StartEstimate;
///
/// let estimate = StartEstimate { position: 3, start_ms: Some(14_200) };
/// assert_eq!(estimate.in_words(10_000), "3rd in line, expected in ~4.2 s");
/// let unknown = StartEstimate { position: 1, start_ms: None };
/// assert_eq!(unknown.in_words(10_000), "1st in line, no estimate");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct StartEstimate {
    /// Its place among the parked tickets of its kind in rank order: 1 when none of its
    /// kind ranks ahead of it. (Tickets of other kinds compete only for worker slots.)
    pub position: usize,
    /// When it is expected to start, by the lot's clock (ms since the Unix epoch); `None`
    /// when the lot cannot say: it is paused, or what the ticket needs is held by a claim
    /// whose run time is unknown (no timeout, no run of its kind seen).
    pub start_ms: Option<u64>,
}

impl StartEstimate {
    /// "3rd in line, expected in ~4.2 s", as seen at `now_ms`.
    pub fn in_words(&self, now_ms: u64) -> String {
        let place = format!("{} in line", ordinal(self.position));
        match self.start_ms {
            Some(at) => format!(
                "{place}, expected in {}",
                in_seconds(at.saturating_sub(now_ms))
            ),
            None => format!("{place}, no estimate"),
        }
    }
}

/// `1st`, `2nd`, `3rd`, `4th`, `11th`, `21st`...
pub fn ordinal(n: usize) -> String {
    let suffix = match (n % 10, n % 100) {
        (_, 11..=13) => "th",
        (1, _) => "st",
        (2, _) => "nd",
        (3, _) => "rd",
        _ => "th",
    };
    format!("{n}{suffix}")
}

/// `~4.2 s`, `~35 s`, `~3 min`: a wait in words, rounded as its size deserves.
fn in_seconds(ms: u64) -> String {
    let seconds = ms as f64 / 1_000.0;
    if seconds < 10.0 {
        format!("~{seconds:.1} s")
    } else if seconds < 120.0 {
        format!("~{seconds:.0} s")
    } else {
        format!("~{:.0} min", seconds / 60.0)
    }
}

/// What the simulation needs of a waiting ticket.
#[derive(Debug, Clone, Copy)]
struct Waiting {
    kind: ResourceKind,
    units: u32,
    slotless: bool,
    run_ms: Option<u64>,
}

/// A claim's end in the simulation: when, and what it gives back. Ends at one instant come
/// in the order of their ids, one at a time, as a driver completes them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct End {
    at: u64,
    id: TaskId,
    kind: usize,
    units: u32,
    frees_slot: bool,
}

/// The lot from `now` on, as the module docs describe.
struct Simulation<'a> {
    lot: &'a ParkingLot,
    /// A newcomer being estimated, not in the lot.
    newcomer: Option<(RankKey, Waiting)>,
    /// Units free per kind, as capacity and headroom go (budgets apart).
    free: [u32; KINDS],
    idle_slots: usize,
    /// The units and starts buckets of the kinds with a budget.
    buckets: [Option<(TokenBucket, Option<TokenBucket>)>; KINDS],
    ends: BinaryHeap<Reverse<End>>,
    tasks: [CostIndex; KINDS],
    permits: [CostIndex; KINDS],
    starving: BTreeSet<RankKey>,
    /// Tickets not starving yet, by when they will be.
    ageing: BTreeSet<(u64, TaskId)>,
    /// Sleepers, by their wake-up.
    sleeping: BTreeSet<(u64, TaskId)>,
    /// Tickets started in the simulation: their ageing no longer matters.
    started: FastMap<TaskId, ()>,
    events_left: usize,
}

impl<'a> Simulation<'a> {
    fn new(lot: &'a ParkingLot, now: u64) -> Self {
        let free = ResourceKind::ALL.map(|kind| {
            (lot.limits.capacity.get(kind) - lot.used[kind.index()]).min(lot.headroom[kind.index()])
        });
        let buckets = ResourceKind::ALL.map(|kind| {
            lot.budget(kind).map(|budget| {
                let (units, starts) = budget.buckets();
                let mut units = units.clone();
                units.refill(now);
                let starts = starts.map(|starts| {
                    let mut starts = starts.clone();
                    starts.refill(now);
                    starts
                });
                (units, starts)
            })
        });
        let ends = lot
            .running
            .iter()
            .filter_map(|(&id, claim)| {
                let run = lot.run_times.expected(
                    claim.kind,
                    claim.declared,
                    claim.worker == NO_WORKER,
                    (claim.timeout_ms != super::NO_TIMEOUT).then_some(u64::from(claim.timeout_ms)),
                )?;
                Some(Reverse(End {
                    at: claim.started_ms.saturating_add(run).max(now),
                    id,
                    kind: claim.kind.index(),
                    units: claim.units,
                    frees_slot: lot.retired.get(claim.worker as usize) == Some(&false),
                }))
            })
            .collect();
        let max_park_ms = lot.limits.starvation.max_park_ms;
        let ageing = max_park_ms.map_or_else(BTreeSet::new, |max_park_ms| {
            lot.by_park_time
                .iter()
                .map(|&(parked_at, id)| (parked_at.saturating_add(max_park_ms), id))
                .collect()
        });
        let events_left = 4 * (lot.parked.len() + lot.sleepers.len() + lot.running.len()) + 1_024;
        Self {
            lot,
            newcomer: None,
            free,
            idle_slots: lot.idle_workers.len(),
            buckets,
            ends,
            tasks: lot.by_cost.clone(),
            permits: lot.permits_by_cost.clone(),
            starving: lot.starving.clone(),
            ageing,
            sleeping: lot.sleeping.clone(),
            started: FastMap::default(),
            events_left,
        }
    }

    /// Adds a newcomer ranked `rank`, parked at `now`.
    fn with_newcomer(mut self, rank: RankKey, waiting: Waiting, now: u64) -> Self {
        self.index_mut(waiting.kind, waiting.slotless)
            .insert(waiting.units, rank);
        if let Some(max_park_ms) = self.lot.limits.starvation.max_park_ms {
            self.ageing
                .insert((now.saturating_add(max_park_ms), rank.id()));
        }
        self.newcomer = Some((rank, waiting));
        self
    }

    fn index_mut(&mut self, kind: ResourceKind, slotless: bool) -> &mut CostIndex {
        if slotless {
            &mut self.permits[kind.index()]
        } else {
            &mut self.tasks[kind.index()]
        }
    }

    /// What the simulation needs of waiting ticket `id`, and its rank.
    fn waiting(&self, id: TaskId) -> Option<(RankKey, Waiting)> {
        if let Some((rank, waiting)) = self.newcomer.filter(|(rank, _)| rank.id() == id) {
            return Some((rank, waiting));
        }
        let lot = self.lot;
        let (rank, kind, units, slotless, timeout) = match lot.parked.get(&id) {
            Some(parked) => (
                parked.rank(id),
                parked.kind,
                parked.units,
                parked.slotless,
                parked.timeout(),
            ),
            None => {
                let (_, ticket) = lot.sleepers.get(&id)?;
                let rank = RankKey::new(ticket.priority, ticket.created_at_ms, id);
                (
                    rank,
                    ticket.cost.kind,
                    ticket.cost.units,
                    false,
                    ticket.timeout_ms,
                )
            }
        };
        let run_ms = lot.run_times.expected(kind, units, slotless, timeout);
        Some((
            rank,
            Waiting {
                kind,
                units,
                slotless,
                run_ms,
            },
        ))
    }

    /// Units of `kind` a start may take now, budgets included.
    fn startable(&self, kind: usize) -> u32 {
        let free = self.free[kind];
        match &self.buckets[kind] {
            None => free,
            Some((_, Some(starts))) if starts.whole() == 0 => 0,
            Some((units, _)) => free.min(units.whole()),
        }
    }

    /// Brings the simulation to `t`: refills, wake-ups, ageing (ends come one by one, see
    /// [`run`](Self::run)).
    fn advance_to(&mut self, t: u64) {
        for (units, starts) in self.buckets.iter_mut().flatten() {
            units.refill(t);
            if let Some(starts) = starts {
                starts.refill(t);
            }
        }
        while let Some(&(at, id)) = self.sleeping.first() {
            if at > t {
                break;
            }
            self.sleeping.pop_first();
            if let Some((rank, waiting)) = self.waiting(id) {
                self.index_mut(waiting.kind, waiting.slotless)
                    .insert(waiting.units, rank);
                if let Some(max_park_ms) = self.lot.limits.starvation.max_park_ms {
                    self.ageing.insert((at.saturating_add(max_park_ms), id));
                }
            }
        }
        while let Some(&(at, id)) = self.ageing.first() {
            if at > t {
                break;
            }
            self.ageing.pop_first();
            if self.started.contains_key(&id) {
                continue;
            }
            if let Some((rank, _)) = self.waiting(id) {
                self.starving.insert(rank);
            }
        }
    }

    /// Takes the next end at or before `t` and gives back what it held; whether there was one.
    fn release_one(&mut self, t: u64) -> bool {
        let Some(&Reverse(end)) = self.ends.peek() else {
            return false;
        };
        if end.at > t {
            return false;
        }
        self.ends.pop();
        let capacity = self.lot.limits.capacity.get(ResourceKind::ALL[end.kind]);
        self.free[end.kind] = self.free[end.kind].saturating_add(end.units).min(capacity);
        self.idle_slots += usize::from(end.frees_slot);
        true
    }

    /// Starts at `t` what fits, in rank order; whether `target` started.
    fn start_all(
        &mut self,
        t: u64,
        target: Option<TaskId>,
        started: &mut impl FnMut(TaskId, u64),
    ) -> bool {
        while let Some(best) = self.best_fit() {
            self.start(best, t);
            started(best.id(), t);
            if target == Some(best.id()) {
                return true;
            }
        }
        false
    }

    /// The ticket that starts next at this instant, if any (rules 4, 6; see the module docs).
    fn best_fit(&self) -> Option<RankKey> {
        let free: [u32; KINDS] = std::array::from_fn(|kind| self.startable(kind));
        let best_of = |indexes: &[CostIndex; KINDS]| {
            indexes
                .iter()
                .zip(free)
                .filter(|(index, _)| !index.is_empty())
                .filter_map(|(index, free)| index.best_within(free))
                .min()
        };
        let permit = best_of(&self.permits);
        let task = (self.idle_slots > 0)
            .then(|| best_of(&self.tasks))
            .flatten();
        let best = permit.into_iter().chain(task).min()?;
        match self.starving.first() {
            Some(reserved) if reserved.ranks_ahead_of(&best) => None,
            _ => Some(best),
        }
    }

    /// Starts `rank` at `t`.
    fn start(&mut self, rank: RankKey, t: u64) {
        let Some((_, waiting)) = self.waiting(rank.id()) else {
            return;
        };
        let kind = waiting.kind.index();
        self.index_mut(waiting.kind, waiting.slotless)
            .remove(waiting.units, rank);
        self.starving.remove(&rank);
        self.started.insert(rank.id(), ());
        let held = match &mut self.buckets[kind] {
            Some((units, starts)) => {
                units.spend(waiting.units);
                if let Some(starts) = starts {
                    starts.spend(1);
                }
                0
            }
            None => waiting.units,
        };
        self.free[kind] -= held;
        let frees_slot = !waiting.slotless;
        if frees_slot {
            self.idle_slots -= 1;
        }
        if let Some(run_ms) = waiting.run_ms {
            self.ends.push(Reverse(End {
                at: t.saturating_add(run_ms),
                id: rank.id(),
                kind,
                units: held,
                frees_slot,
            }));
        }
    }

    /// The next instant after `t` at which something may change.
    fn next_event(&self, t: u64) -> Option<u64> {
        let end = self.ends.peek().map(|Reverse(end)| end.at);
        let wake = self.sleeping.first().map(|&(at, _)| at);
        let ages = self.ageing.first().map(|&(at, _)| at);
        let refill = ResourceKind::ALL
            .into_iter()
            .filter_map(|kind| self.refill_event(kind))
            .filter(|&at| at > t)
            .min();
        [end, wake, ages, refill].into_iter().flatten().min()
    }

    /// When a refill of `kind`'s budget lets a parked ticket start that cannot now.
    fn refill_event(&self, kind: ResourceKind) -> Option<u64> {
        let (units, starts) = self.buckets[kind.index()].as_ref()?;
        if let Some(starts) = starts {
            if starts.whole() == 0 {
                return Some(starts.holds_at(1));
            }
        }
        let level = units.whole();
        let above = [&self.tasks[kind.index()], &self.permits[kind.index()]]
            .into_iter()
            .filter_map(|index| index.smallest_above(level))
            .min()?;
        Some(units.holds_at(above))
    }

    /// Runs from `now` until `target` starts (or, without one, until nothing is left to
    /// start), telling `started` each start. Returns the target's start.
    fn run(
        mut self,
        now: u64,
        target: Option<TaskId>,
        mut started: impl FnMut(TaskId, u64),
    ) -> Option<u64> {
        if self.lot.paused {
            return None;
        }
        let mut t = now;
        loop {
            self.advance_to(t);
            if self.start_all(t, target, &mut started) {
                return Some(t);
            }
            // One end at a time, each followed by the starts it allows, as the lot does
            // when a driver completes claims one after another.
            while self.release_one(t) {
                if self.start_all(t, target, &mut started) {
                    return Some(t);
                }
            }
            self.events_left = self.events_left.checked_sub(1)?;
            t = self.next_event(t)?.max(t);
        }
    }
}

impl ParkingLot {
    /// The run time the lot expects of a ticket costing `cost` with this execution timeout
    /// (a permit when `permit`): the mean run time of its cost class, else of its kind, at
    /// most its timeout; its timeout when no run of its kind was seen; `None` with neither.
    /// See the estimate's rules in `PARKING_LOT.md` ("When will it start").
    ///
    /// ```
    /// use prometheus_parking_lot_actors::domain::{PoolLimits, Priority, ResourceCost};
    /// use prometheus_parking_lot_actors::scheduler::core::{ParkingLot, Ticket};
    ///
    /// let mut lot = ParkingLot::new(PoolLimits::new(10, 2)).unwrap();
    /// let cost = ResourceCost::gpu_vram(4);
    /// assert_eq!(lot.expected_run_ms(cost, Some(9_000), false), Some(9_000), "nothing seen: the timeout");
    /// assert_eq!(lot.expected_run_ms(cost, None, false), None);
    /// let ticket = Ticket {
    ///     id: 1,
    ///     priority: Priority::Normal,
    ///     cost,
    ///     created_at_ms: 0,
    ///     deadline_ms: None,
    ///     tenant: 0,
    ///     timeout_ms: None,
    /// };
    /// lot.admit(ticket, 1_000);
    /// lot.complete(1, 3_000).unwrap(); // it ran 2 s
    /// assert_eq!(lot.expected_run_ms(cost, None, false), Some(2_000));
    /// assert_eq!(lot.expected_run_ms(cost, Some(1_500), false), Some(1_500), "at most the timeout");
    /// ```
    pub fn expected_run_ms(
        &self,
        cost: ResourceCost,
        timeout_ms: Option<u64>,
        permit: bool,
    ) -> Option<u64> {
        self.run_times
            .expected(cost.kind, cost.units, permit, timeout_ms)
    }

    /// Where parked (or sleeping) ticket `id` stands at `now`: its place in line among the
    /// parked tickets of its kind and when it is expected to start (rule 20; the module
    /// docs of `estimate.rs` and `PARKING_LOT.md` say how, and when it is wrong). `None`
    /// when the lot does not hold it parked. O((n + r) log n), stopping at its start.
    ///
    /// ```
    /// use prometheus_parking_lot_actors::domain::{PoolLimits, Priority, ResourceCost};
    /// use prometheus_parking_lot_actors::scheduler::core::{ParkingLot, Ticket};
    ///
    /// let mut lot = ParkingLot::new(PoolLimits::new(10, 4)).unwrap();
    /// let ticket = |id, units| Ticket {
    ///     id,
    ///     priority: Priority::Normal,
    ///     cost: ResourceCost::gpu_vram(units),
    ///     created_at_ms: id,
    ///     deadline_ms: None,
    ///     tenant: 0,
    ///     timeout_ms: Some(60_000),
    /// };
    /// lot.admit(ticket(1, 8), 0);
    /// lot.complete(1, 4_000).unwrap(); // 8 units run about 4 s
    /// lot.admit(ticket(2, 8), 10_000); // runs, expected to end at 14,000
    /// lot.admit(ticket(3, 6), 10_000); // waits for it
    /// lot.admit(ticket(4, 6), 10_000); // and then for task 3
    /// let estimate = lot.estimate_start(4, 10_000).unwrap();
    /// assert_eq!(estimate.position, 2);
    /// assert_eq!(estimate.start_ms, Some(18_000));
    /// assert_eq!(estimate.in_words(10_000), "2nd in line, expected in ~8.0 s");
    /// ```
    pub fn estimate_start(&self, id: TaskId, now: u64) -> Option<StartEstimate> {
        let simulation = Simulation::new(self, now);
        let (rank, waiting) = simulation.waiting(id)?;
        let position = self.position_of(rank, waiting.kind);
        let start_ms = simulation.run(now, Some(id), |_, _| ());
        Some(StartEstimate { position, start_ms })
    }

    /// Where a newcomer would stand if it were admitted at `now` (rule 20): its place in
    /// line and when it would start (`now` when it would start at once). The lot is not
    /// changed. Admission's refusal of a ticket that would miss its deadline reads this
    /// (`"admission": {"refuse_if_late": true}`).
    ///
    /// ```
    /// use prometheus_parking_lot_actors::domain::{PoolLimits, Priority, ResourceCost};
    /// use prometheus_parking_lot_actors::scheduler::core::{ParkingLot, Ticket};
    ///
    /// let mut lot = ParkingLot::new(PoolLimits::new(10, 4)).unwrap();
    /// let ticket = |id, units| Ticket {
    ///     id,
    ///     priority: Priority::Normal,
    ///     cost: ResourceCost::gpu_vram(units),
    ///     created_at_ms: id,
    ///     deadline_ms: None,
    ///     tenant: 0,
    ///     timeout_ms: Some(5_000), // nothing seen yet: each runs up to 5 s
    /// };
    /// lot.admit(ticket(1, 8), 0);
    /// assert_eq!(lot.estimate_admission(&ticket(2, 2), 0).start_ms, Some(0), "fits now");
    /// assert_eq!(lot.estimate_admission(&ticket(2, 6), 0).start_ms, Some(5_000));
    /// ```
    pub fn estimate_admission(&self, ticket: &Ticket, now: u64) -> StartEstimate {
        let ticket = self.at_least_a_unit(*ticket);
        let rank = RankKey::new(ticket.priority, ticket.created_at_ms, ticket.id);
        StartEstimate {
            position: self.position_of(rank, ticket.cost.kind),
            start_ms: self.newcomer_start(&ticket, rank, false, now),
        }
    }

    /// When `ticket` would start if admitted at `now`, without its place in line (see
    /// [`estimate_admission`](Self::estimate_admission)).
    pub(crate) fn admission_start_ms(&self, ticket: &Ticket, now: u64) -> Option<u64> {
        let ticket = self.at_least_a_unit(*ticket);
        let rank = RankKey::new(ticket.priority, ticket.created_at_ms, ticket.id);
        self.newcomer_start(&ticket, rank, false, now)
    }

    /// When newcomer `ticket` ranked `rank` would start (see
    /// [`estimate_admission`](Self::estimate_admission)): `now` in O(1) when it would start
    /// at once, else by simulation.
    fn newcomer_start(
        &self,
        ticket: &Ticket,
        rank: RankKey,
        slotless: bool,
        now: u64,
    ) -> Option<u64> {
        let reserved_ahead = self
            .starving
            .first()
            .is_some_and(|reserved| reserved.ranks_ahead_of(&rank));
        let fits = ticket.cost.units <= self.free(ticket.cost.kind)
            && (slotless || !self.idle_workers.is_empty());
        if !self.paused && fits && !reserved_ahead {
            return Some(now);
        }
        let waiting = Waiting {
            kind: ticket.cost.kind,
            units: ticket.cost.units,
            slotless,
            run_ms: self.run_times.expected(
                ticket.cost.kind,
                ticket.cost.units,
                slotless,
                ticket.timeout_ms,
            ),
        };
        Simulation::new(self, now)
            .with_newcomer(rank, waiting, now)
            .run(now, Some(rank.id()), |_, _| ())
    }

    /// Every parked (and sleeping) ticket's place in line and expected start at `now`, in
    /// one simulation (rule 20): O((n + r) log n). In rank order, sleepers after the
    /// parked tickets.
    ///
    /// ```
    /// use prometheus_parking_lot_actors::domain::{PoolLimits, Priority, ResourceCost};
    /// use prometheus_parking_lot_actors::scheduler::core::{ParkingLot, StartEstimate, Ticket};
    ///
    /// let mut lot = ParkingLot::new(PoolLimits::new(10, 4)).unwrap();
    /// let ticket = |id, units| Ticket {
    ///     id,
    ///     priority: Priority::Normal,
    ///     cost: ResourceCost::gpu_vram(units),
    ///     created_at_ms: id,
    ///     deadline_ms: None,
    ///     tenant: 0,
    ///     timeout_ms: Some(1_000),
    /// };
    /// lot.admit(ticket(1, 10), 0);
    /// lot.admit(ticket(2, 10), 0);
    /// lot.admit(ticket(3, 10), 0);
    /// let all = lot.estimate_all(0);
    /// assert_eq!(all, vec![
    ///     (2, StartEstimate { position: 1, start_ms: Some(1_000) }),
    ///     (3, StartEstimate { position: 2, start_ms: Some(2_000) }),
    /// ]);
    /// ```
    pub fn estimate_all(&self, now: u64) -> Vec<(TaskId, StartEstimate)> {
        let simulation = Simulation::new(self, now);
        let mut ranked: Vec<(RankKey, ResourceKind)> = self
            .parked
            .iter()
            .map(|(&id, parked)| (parked.rank(id), parked.kind))
            .collect();
        ranked.sort_unstable();
        let mut sleepers: Vec<(RankKey, ResourceKind)> = self
            .sleepers
            .iter()
            .map(|(&id, (_, ticket))| {
                let rank = RankKey::new(ticket.priority, ticket.created_at_ms, id);
                (rank, ticket.cost.kind)
            })
            .collect();
        sleepers.sort_unstable();
        let mut starts: FastMap<TaskId, u64> = FastMap::default();
        simulation.run(now, None, |id, at| {
            starts.insert(id, at);
        });
        let mut ahead = [0usize; KINDS];
        let mut estimates: Vec<(TaskId, StartEstimate)> = ranked
            .iter()
            .map(|&(rank, kind)| {
                ahead[kind.index()] += 1;
                let estimate = StartEstimate {
                    position: ahead[kind.index()],
                    start_ms: starts.get(&rank.id()).copied(),
                };
                (rank.id(), estimate)
            })
            .collect();
        estimates.extend(sleepers.into_iter().map(|(rank, kind)| {
            let estimate = StartEstimate {
                position: self.position_of(rank, kind),
                start_ms: starts.get(&rank.id()).copied(),
            };
            (rank.id(), estimate)
        }));
        estimates
    }

    /// 1 + the parked tickets of `kind` ranked ahead of `rank`: O(n).
    fn position_of(&self, rank: RankKey, kind: ResourceKind) -> usize {
        1 + self
            .parked
            .iter()
            .filter(|(&id, parked)| {
                id != rank.id() && parked.kind == kind && parked.rank(id).ranks_ahead_of(&rank)
            })
            .count()
    }
}
