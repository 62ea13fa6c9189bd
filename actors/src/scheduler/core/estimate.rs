//! Rule 23: when a parked ticket is expected to start, and its place in line. The questions
//! are answered here; what the lot learns of run times is in `run_times.rs`, and the copy of
//! the lot the answers drive in `simulation.rs`.
//!
//! # What it uses
//!
//! - **Run times it has seen.** When a claim ends, the lot adds its run time (end less
//!   start, by the lot's clock) to a mean per *cost class*: the kind, whether it is a permit,
//!   and the power of two its units fall in (1, 2-3, 4-7, ...; 0 alone); and, for a run with
//!   an execution timeout, the share of the timeout it used to a second mean of the class.
//!   The means forget: the first 16 runs of a class are averaged evenly, later ones with a
//!   weight of 1/16 (an exponentially weighted mean), so a class whose work changes is
//!   followed within a few dozen runs. The same means per kind (and permit or not) cover
//!   every size.
//! - **A ticket's expected run time** ([`ParkingLot::expected_run_ms`]). With a timeout:
//!   the timeout times the share of their timeouts its class's runs used (else its kind's),
//!   since a caller who gives a longer timeout usually expects a longer run (a larger
//!   `max_tokens`); failing that, its class's (else its kind's) mean run time; at most the
//!   timeout, and the timeout itself when nothing was seen. Without a timeout: its class's
//!   (else its kind's) mean run time, or unknown.
//! - **How run times were spread about what was expected of them**, per kind (and permit or
//!   not): each run's length over the run time its class led the lot to expect (once the
//!   class has been seen), in a histogram of 32 buckets from 0 to 4 times, the last holding
//!   every longer run, that forgets as the means do.
//! - **A running claim's expected end:** its start plus its expected run time, lengthened by
//!   what it has run so far. A claim that has run `r` times its expected run time is one of
//!   the runs that go at least that far: its expected run time is scaled by the mean ratio
//!   of the runs seen that went at least `r` over the mean ratio of all (1 at its start,
//!   more as it goes on: the mean residual life of the runs seen, so that a claim near the
//!   end of a long run is not expected to end at a mean it has passed), at most its timeout.
//!   One that has run longer than every run seen is late: it is expected to end halfway
//!   between now and its timeout, or, without a timeout, to run as long again as it has run
//!   so far (run times have heavy tails: the longer a run has gone on, the longer it tends
//!   to go on). A claim of unknown run time never ends as far as the estimate knows.
//!
//! # How
//!
//! A copy of the lot is driven from `now` on as a driver would drive it if every claim ran
//! for its expected time and nothing arrived: the running claims end, in the order of their
//! expected ends, at the expected instants of the first, second, ... end among them (the
//! order statistics of their ends, from the spread of run times seen: the first of several
//! uncertain ends comes earlier than the first of their expected ends; see
//! `running_ends.rs`), ends at one instant in the order of their ids; each started ticket
//! runs for its expected run time, and `tick` runs at each [`ParkingLot::next_wakeup`]. So the copy follows every
//! rule the lot follows, as the lot itself: skip-ahead, worker slots, the reservation and
//! the tickets that age into it, backfill, the fair share, budgets refilling, sleepers
//! waking, permits. The ticket's estimate is when it starts in the copy. The lot itself is
//! not changed, and learns nothing from the copy.
//!
//! # What it leaves out (when it is wrong)
//!
//! - Arrivals after `now`: a ticket of higher priority that comes later starts first, so
//!   under a stream of urgent work a low-priority ticket starts later than estimated.
//! - Run times that differ from their class's mean (a heavy tail), claims running longer
//!   than every run seen, and run times the lot has not seen yet (the timeout stands in for
//!   them). The ends of the running claims are taken as independent, and the spread of run
//!   times is read for them only, not for the tickets the copy starts (each runs its
//!   expected run time).
//! - Cancels, preemption, a headroom that changes with the next sample, a resting worker
//!   slot coming back: the copy cancels and stops nothing, and its headroom and slots stay
//!   as they are. The estimate of one ticket (`estimate_start`, `estimate_admission`,
//!   `misses_deadline`) lets the other tickets' deadlines expire them in the copy, as they
//!   will in the lot, but not its own; `estimate_all` and `estimate_many` expire nothing.
//!
//! # Cost
//!
//! One simulation copies the lot (O(n + r) for n parked tickets and r running claims),
//! spreads the running claims' ends (O(32 r³) up to 16 claims, O(32 r²) up to 64, O(r log r)
//! past them; see `running_ends.rs`) and replays one end, one wake-up or one tick per step, each a decision of the lot's own
//! cost (O(log n), see the module docs of `mod.rs`): O((n + r) log n) to the end of the
//! queue. [`ParkingLot::estimate_all`] estimates every parked ticket in one simulation;
//! [`ParkingLot::estimate_many`] stops once its tickets have started (a page of the
//! best-ranked ones: early), [`ParkingLot::estimate_start`] and
//! [`ParkingLot::estimate_admission`] once their ticket has, and
//! [`ParkingLot::misses_deadline`] a few steps past the deadline (a newcomer that would
//! start at once is answered in O(1) without a copy). A simulation takes at most
//! `4 (n + r) + 1,024` steps; past that (budgets refilling slowly under a long queue) it
//! gives up and the estimate is unknown. The copy itself, O(n), is what remains of a
//! question that stops early.

use serde::Serialize;

use crate::domain::{ResourceCost, ResourceKind, TaskId};

use super::simulation::{Simulation, Stop};
use super::{FastMap, ParkingLot, RankKey, Ticket, KINDS};

/// Where a parked ticket stands: its place in line and when it is expected to start.
///
/// ```
/// use prometheus_parking_lot_actors::scheduler::core::StartEstimate;
///
/// let estimate = StartEstimate { position: 3, start_ms: Some(14_200), from_timeouts: false };
/// assert_eq!(estimate.in_words(10_000), "3rd in line, expected in ~4.2 s");
/// let unknown = StartEstimate { position: 1, start_ms: None, from_timeouts: false };
/// assert_eq!(unknown.in_words(10_000), "1st in line, no estimate");
/// let unlearnt = StartEstimate { position: 2, start_ms: Some(130_000), from_timeouts: true };
/// assert_eq!(
///     unlearnt.in_words(10_000),
///     "2nd in line, within ~2 min (no run seen yet: each counted at its timeout)"
/// );
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct StartEstimate {
    /// Its place among the parked tickets of its kind in rank order: 1 when none of its
    /// kind ranks ahead of it. (Tickets of other kinds compete only for worker slots.) 0,
    /// "not in line yet", for a task a shared queue holds out of every node's line.
    pub position: usize,
    /// When it is expected to start, by the lot's clock (ms since the Unix epoch); `None`
    /// when the lot cannot say: it is paused, or what the ticket needs is held by a claim
    /// whose run time is unknown (no timeout, no run of its kind seen).
    pub start_ms: Option<u64>,
    /// `true` when the lot has seen no run of the ticket's kind yet: every run it waits
    /// for is counted at its execution timeout, so `start_ms` is a latest start, not an
    /// expectation (a task that runs in milliseconds under a 60 s timeout would otherwise
    /// read "expected in ~2 min"). It turns `false` with the kind's first run.
    pub from_timeouts: bool,
}

impl StartEstimate {
    /// "3rd in line, expected in ~4.2 s", as seen at `now_ms`; "within ~2 min (no run seen
    /// yet: each counted at its timeout)" when the estimate rests on timeouts alone.
    pub fn in_words(&self, now_ms: u64) -> String {
        let place = match self.position {
            0 => "not in line yet".to_owned(),
            position => format!("{} in line", ordinal(position)),
        };
        match self.start_ms {
            Some(at) if self.from_timeouts => format!(
                "{place}, within {} (no run seen yet: each counted at its timeout)",
                in_seconds(at.saturating_sub(now_ms))
            ),
            Some(at) => format!(
                "{place}, expected in {}",
                in_seconds(at.saturating_sub(now_ms))
            ),
            None => format!("{place}, no estimate"),
        }
    }
}

/// A place in line in words: `1st`, `2nd`, `3rd`, `4th`, `11th`, `21st`...
///
/// ```
/// use prometheus_parking_lot_actors::scheduler::core::ordinal;
///
/// let places: Vec<String> = [1, 2, 3, 4, 11, 12, 13, 21, 102].into_iter().map(ordinal).collect();
/// assert_eq!(places, ["1st", "2nd", "3rd", "4th", "11th", "12th", "13th", "21st", "102nd"]);
/// ```
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

/// Steps a refusal's simulation takes past the deadline to find the start it reports.
const STEPS_PAST_DEADLINE: usize = 64;

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
    ///     also: Default::default(),
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
    /// parked tickets of its kind and when it is expected to start (rule 23; the module
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
    ///     also: Default::default(),
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
        let (rank, kind) = self.waiting_rank(id)?;
        let position = self.position_of(rank, kind);
        let mut simulation = Simulation::new(self, now).with_deadlines_of_others(id);
        let start_ms = match simulation.run(now, None, |started, _| started == id) {
            Stop::Done(at) => Some(at),
            Stop::Horizon(_) | Stop::Exhausted => None,
        };
        let from_timeouts = !self.run_times.seen(kind);
        Some(StartEstimate {
            position,
            start_ms,
            from_timeouts,
        })
    }

    /// The rank and kind of parked (or sleeping) ticket `id`.
    fn waiting_rank(&self, id: TaskId) -> Option<(RankKey, ResourceKind)> {
        if let Some(parked) = self.parked.get(&id) {
            return Some((parked.rank(id), parked.kind));
        }
        let (_, ticket) = self.sleepers.get(&id)?;
        Some((self.rank_of(ticket), ticket.cost.kind))
    }

    /// Where a newcomer would stand if it were admitted at `now` (rule 23): its place in
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
    ///     also: Default::default(),
    /// };
    /// lot.admit(ticket(1, 8), 0);
    /// assert_eq!(lot.estimate_admission(&ticket(2, 2), 0).start_ms, Some(0), "fits now");
    /// assert_eq!(lot.estimate_admission(&ticket(2, 6), 0).start_ms, Some(5_000));
    /// ```
    pub fn estimate_admission(&self, ticket: &Ticket, now: u64) -> StartEstimate {
        let ticket = self.at_least_a_unit(*ticket);
        let rank = self.rank_of(&ticket);
        StartEstimate {
            position: self.position_of(rank, ticket.cost.kind),
            start_ms: self.newcomer_start(&ticket, false, now),
            from_timeouts: !self.run_times.seen(ticket.cost.kind),
        }
    }

    /// When `ticket`, if admitted at `now`, is expected to start, if that is after
    /// `deadline_ms`; `None` when it is expected to start by then, or cannot be estimated.
    /// What `"admission": {"refuse_if_late": true}` asks of each submission with a deadline.
    ///
    /// The simulation of [`estimate_admission`](Self::estimate_admission) stops at the
    /// deadline, then takes at most 64 steps more to find the start; past those it answers
    /// the first instant after the deadline it reached, before which the ticket does not
    /// start. So its cost is bounded by what happens before the deadline, however long the
    /// queue is behind it.
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
    ///     timeout_ms: Some(5_000),
    ///     also: Default::default(),
    /// };
    /// lot.admit(ticket(1, 8), 0); // runs up to 5 s
    /// assert_eq!(lot.misses_deadline(&ticket(2, 6), 3_000, 0), Some(5_000));
    /// assert_eq!(lot.misses_deadline(&ticket(2, 6), 6_000, 0), None);
    /// ```
    pub fn misses_deadline(&self, ticket: &Ticket, deadline_ms: u64, now: u64) -> Option<u64> {
        let ticket = self.at_least_a_unit(*ticket);
        if self.starts_at_once(&ticket, false) {
            return None;
        }
        let mut simulation = Simulation::new(self, now).with_deadlines_of_others(ticket.id);
        if simulation.admit(ticket, false, now) != Some(false) {
            return None;
        }
        let id = ticket.id;
        let Stop::Horizon(past) =
            simulation.run(now, Some(deadline_ms), |started, _| started == id)
        else {
            return None;
        };
        simulation.events_left = simulation.events_left.min(STEPS_PAST_DEADLINE);
        match simulation.run(past, None, |started, _| started == id) {
            Stop::Done(at) => Some(at),
            Stop::Horizon(_) | Stop::Exhausted => Some(past),
        }
    }

    /// Whether `ticket`, a newcomer, would start at once, as far as an O(1) look tells
    /// (without a fair share, whose order needs the tenants' books).
    fn starts_at_once(&self, ticket: &Ticket, slotless: bool) -> bool {
        let rank = self.rank_of(ticket);
        let reserved_ahead = self
            .starving
            .first()
            .is_some_and(|reserved| reserved.ranks_ahead_of(&rank));
        let fits = ticket.cost.units <= self.free(ticket.cost.kind)
            && (slotless || !self.idle_workers.is_empty());
        !self.paused && self.tenants.is_none() && fits && !reserved_ahead
    }

    /// When newcomer `ticket` would start (see
    /// [`estimate_admission`](Self::estimate_admission)): `now` in O(1) when it would start
    /// at once, else by simulation.
    fn newcomer_start(&self, ticket: &Ticket, slotless: bool, now: u64) -> Option<u64> {
        if self.starts_at_once(ticket, slotless) {
            return Some(now);
        }
        let mut simulation = Simulation::new(self, now).with_deadlines_of_others(ticket.id);
        match simulation.admit(*ticket, slotless, now) {
            Some(true) => return Some(now),
            Some(false) => {}
            None => return None,
        }
        let id = ticket.id;
        match simulation.run(now, None, |started, _| started == id) {
            Stop::Done(at) => Some(at),
            Stop::Horizon(_) | Stop::Exhausted => None,
        }
    }

    /// Every parked (and sleeping) ticket's place in line and expected start at `now`, in
    /// one simulation (rule 23): O((n + r) log n). In rank order, sleepers after the
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
    ///     also: Default::default(),
    /// };
    /// lot.admit(ticket(1, 10), 0);
    /// lot.admit(ticket(2, 10), 0);
    /// lot.admit(ticket(3, 10), 0);
    /// let all = lot.estimate_all(0); // no run seen: each counted at its 1 s timeout
    /// assert_eq!(all, vec![
    ///     (2, StartEstimate { position: 1, start_ms: Some(1_000), from_timeouts: true }),
    ///     (3, StartEstimate { position: 2, start_ms: Some(2_000), from_timeouts: true }),
    /// ]);
    /// ```
    pub fn estimate_all(&self, now: u64) -> Vec<(TaskId, StartEstimate)> {
        let mut ids: Vec<(RankKey, bool)> = self
            .parked
            .iter()
            .map(|(&id, parked)| (parked.rank(id), false))
            .chain(
                self.sleepers
                    .values()
                    .map(|(_, ticket)| (self.rank_of(ticket), true)),
            )
            .collect();
        // Parked tickets first, then sleepers, each in rank order.
        ids.sort_unstable_by_key(|&(rank, sleeping)| (sleeping, rank));
        let ids: Vec<TaskId> = ids.into_iter().map(|(rank, _)| rank.id()).collect();
        self.estimate_many(&ids, now)
    }

    /// The estimates (rule 23) of the parked (or sleeping) tickets among `ids`, in their
    /// order, at `now`: one simulation, which stops once they have all started (an
    /// operator's page of the best-ranked tickets is done long before the queue is). Ids
    /// the lot does not hold parked are left out. O((n + r) log n) at most.
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
    ///     timeout_ms: Some(1_000),
    ///     also: Default::default(),
    /// };
    /// for id in 1..=4 {
    ///     lot.admit(ticket(id, 10), 0);
    /// }
    /// let page = lot.estimate_many(&[3, 1, 99], 0);
    /// assert_eq!(page.len(), 1, "1 runs, 99 is unknown");
    /// assert_eq!((page[0].0, page[0].1.position, page[0].1.start_ms), (3, 2, Some(2_000)));
    /// ```
    pub fn estimate_many(&self, ids: &[TaskId], now: u64) -> Vec<(TaskId, StartEstimate)> {
        let wanted: Vec<(TaskId, RankKey, ResourceKind)> = ids
            .iter()
            .filter_map(|&id| self.waiting_rank(id).map(|(rank, kind)| (id, rank, kind)))
            .collect();
        if wanted.is_empty() {
            return Vec::new();
        }
        let positions = self.positions(&wanted);
        let mut starts: FastMap<TaskId, u64> = wanted.iter().map(|&(id, ..)| (id, 0)).collect();
        let mut left = starts.len();
        let mut started_at: FastMap<TaskId, u64> = FastMap::default();
        Simulation::new(self, now).run(now, None, |id, at| {
            if starts.remove(&id).is_some() {
                started_at.insert(id, at);
                left -= 1;
            }
            left == 0
        });
        wanted
            .iter()
            .zip(positions)
            .map(|(&(id, _, kind), position)| {
                let estimate = StartEstimate {
                    position,
                    start_ms: started_at.get(&id).copied(),
                    from_timeouts: !self.run_times.seen(kind),
                };
                (id, estimate)
            })
            .collect()
    }

    /// The places in line of `wanted` (id, rank, kind): one walk of the parked tickets in
    /// rank order beside the wanted ones in rank order, counting each kind, O(n log n).
    fn positions(&self, wanted: &[(TaskId, RankKey, ResourceKind)]) -> Vec<usize> {
        let mut ranked: Vec<(RankKey, ResourceKind)> = self
            .parked
            .iter()
            .map(|(&id, parked)| (parked.rank(id), parked.kind))
            .collect();
        ranked.sort_unstable();
        let mut order: Vec<usize> = (0..wanted.len()).collect();
        order.sort_unstable_by_key(|&index| wanted[index].1);
        let mut positions = vec![0; wanted.len()];
        let mut ahead = [0usize; KINDS];
        let mut next = 0;
        for index in order {
            let (_, rank, kind) = wanted[index];
            while let Some(&(other, other_kind)) = ranked.get(next) {
                if !other.ranks_ahead_of(&rank) {
                    break;
                }
                ahead[other_kind.index()] += 1;
                next += 1;
            }
            positions[index] = ahead[kind.index()] + 1;
        }
        positions
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
