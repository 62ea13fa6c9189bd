//! Rule 23: when a parked ticket is expected to start, and its place in line.
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

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use serde::Serialize;

use crate::domain::{ResourceCost, ResourceKind, TaskId};

use super::running_ends::{expected_order, EndChance, SPREAD_CLAIMS};
use super::{FastMap, ParkingLot, RankKey, Ticket, KINDS, NO_WORKER};

/// Size classes: units 0, then one per power of two up to 2^31.
const SIZE_CLASSES: usize = 33;
/// Runs after which a class's mean weighs each new run by 1/`FORGET`.
const FORGET: u32 = 16;

/// A mean that forgets (see the module docs).
#[derive(Debug, Clone, Copy, Default)]
struct Mean {
    value: f64,
    samples: u32,
}

impl Mean {
    fn add(&mut self, value: f64) {
        self.samples = self.samples.saturating_add(1);
        let weight = 1.0 / f64::from(self.samples.min(FORGET));
        self.value += (value - self.value) * weight;
    }

    fn get(&self) -> Option<f64> {
        (self.samples > 0).then_some(self.value)
    }
}

/// Buckets of a run's length over its expected run time: 0 to `RATIO_SPAN` in steps of
/// `RATIO_SPAN / BUCKETS`, the last holding every longer run.
const BUCKETS: usize = 32;
const RATIO_SPAN: f64 = 4.0;

/// How runs' lengths were spread about what the lot expected of them (a run's length over
/// its expected run time when it ended): a histogram that forgets as [`Mean`] does, each
/// bucket holding its weight and the mean ratio of its runs. It answers how long, against
/// its expected run time, a run that has gone on `ratio` times that will run in all.
#[derive(Debug, Clone, Copy, Default)]
struct Spread {
    weight: [f64; BUCKETS],
    /// Per bucket, the weighted sum of its ratios.
    sum: [f64; BUCKETS],
    samples: u32,
}

impl Spread {
    fn add(&mut self, ratio: f64) {
        self.samples = self.samples.saturating_add(1);
        let weight = 1.0 / f64::from(self.samples.min(FORGET));
        for (bucket, sum) in self.weight.iter_mut().zip(&mut self.sum) {
            *bucket *= 1.0 - weight;
            *sum *= 1.0 - weight;
        }
        let bucket = bucket_of(ratio);
        self.weight[bucket] += weight;
        self.sum[bucket] += weight * ratio;
    }

    /// The mean ratio of the runs that went at least `ratio` (a run counts with at least
    /// `ratio`); `None` when no run seen went that far.
    fn mean_beyond(&self, ratio: f64) -> Option<f64> {
        let (weight, sum) = self
            .beyond(ratio)
            .fold((0.0, 0.0), |(weight, sum), (r, w)| {
                (weight + w, sum + w * r)
            });
        (weight > f64::EPSILON).then(|| sum / weight)
    }

    /// The buckets of the runs that went at least `ratio`: each one's mean ratio (at least
    /// `ratio`) and weight.
    fn beyond(&self, ratio: f64) -> impl Iterator<Item = (f64, f64)> + '_ {
        (bucket_of(ratio)..BUCKETS)
            .filter(|&bucket| self.weight[bucket] > f64::EPSILON)
            .map(move |bucket| {
                let weight = self.weight[bucket];
                ((self.sum[bucket] / weight).max(ratio), weight)
            })
    }
}

/// The bucket of a ratio (a run past `RATIO_SPAN` times its expected run time counts in the
/// last).
fn bucket_of(ratio: f64) -> usize {
    ((ratio * (BUCKETS as f64 / RATIO_SPAN)) as usize).min(BUCKETS - 1)
}

/// What the lot learnt of one group of runs: how long they ran, and how much of their
/// execution timeout they used (runs with one).
#[derive(Debug, Clone, Copy, Default)]
struct Seen {
    run_ms: Mean,
    of_timeout: Mean,
}

impl Seen {
    fn add(&mut self, ms: u64, timeout_ms: Option<u64>) {
        self.run_ms.add(ms as f64);
        if let Some(timeout) = timeout_ms.filter(|&timeout| timeout > 0) {
            self.of_timeout.add(ms as f64 / timeout as f64);
        }
    }
}

/// The run times the lot has seen, per cost class and per kind (see the module docs).
#[derive(Debug, Clone)]
pub(super) struct RunTimes {
    /// By `row(kind, slotless)`, then size class.
    classes: Box<[[Seen; SIZE_CLASSES]; KINDS * 2]>,
    /// By `row(kind, slotless)`, every size.
    kinds: [Seen; KINDS * 2],
    /// By `row(kind, slotless)`, every size: how runs' lengths were spread about their
    /// expected run times.
    spread: Box<[Spread; KINDS * 2]>,
}

impl Default for RunTimes {
    fn default() -> Self {
        Self {
            classes: Box::new([[Seen::default(); SIZE_CLASSES]; KINDS * 2]),
            kinds: [Seen::default(); KINDS * 2],
            spread: Box::new([Spread::default(); KINDS * 2]),
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
    /// A claim of `units` of `kind` with this execution timeout ran `ms`.
    pub(super) fn observe(
        &mut self,
        kind: ResourceKind,
        units: u32,
        slotless: bool,
        ms: u64,
        timeout_ms: Option<u64>,
    ) {
        let row = row(kind, slotless);
        // Measured against what the lot expected of it before it learns from it, once its
        // class has been seen (a first run measures how far apart classes are, not runs).
        let class_seen = self.classes[row][size_class(units)].run_ms.samples > 0;
        let expected = self.expected(kind, units, slotless, timeout_ms);
        if let Some(expected) = expected.filter(|&ms| class_seen && ms > 0) {
            self.spread[row].add(ms as f64 / expected as f64);
        }
        self.classes[row][size_class(units)].add(ms, timeout_ms);
        self.kinds[row].add(ms, timeout_ms);
    }

    /// How much longer than its expected run time a run of this kind is expected to take,
    /// given that it has run `ratio` times that: the mean ratio of the runs seen that went
    /// at least that far over the mean ratio of all; `None` when none went that far (or
    /// none was seen).
    fn survival_factor(&self, kind: ResourceKind, slotless: bool, ratio: f64) -> Option<f64> {
        let spread = &self.spread[row(kind, slotless)];
        let all = spread.mean_beyond(0.0)?;
        let beyond = spread.mean_beyond(ratio)?;
        Some((beyond / all).max(1.0))
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
        let (class, kind) = (&self.classes[row][size_class(units)], &self.kinds[row]);
        let Some(timeout) = timeout_ms else {
            return class
                .run_ms
                .get()
                .or(kind.run_ms.get())
                .map(|ms| ms.round() as u64);
        };
        let share = class.of_timeout.get().or(kind.of_timeout.get());
        let seen = share
            .map(|share| share * timeout as f64)
            .or(class.run_ms.get())
            .or(kind.run_ms.get());
        Some(seen.map_or(timeout, |ms| (ms.round() as u64).min(timeout)))
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

/// A running claim's end in the simulation. Ends at one instant come in the order of their
/// ids, one at a time, as a driver completes them.
type End = Reverse<(u64, TaskId)>;

/// The lot from `now` on, as the module docs describe: a copy of the lot, driven as a
/// driver would drive it if every claim ran for its expected time and nothing arrived.
struct Simulation<'a> {
    /// The lot as it is: what the run times are expected to be.
    lot: &'a ParkingLot,
    /// The copy that is driven.
    copy: ParkingLot,
    /// The copy's running claims by expected end (claims of unknown run time never end).
    ends: BinaryHeap<End>,
    events_left: usize,
}

impl<'a> Simulation<'a> {
    fn new(lot: &'a ParkingLot, now: u64) -> Self {
        let mut copy = lot.clone();
        // Deadlines and the watchdog are left out: a ticket is estimated as if it waited for
        // its start however long that takes, and no claim is stopped.
        copy.by_deadline.clear();
        copy.by_overdue.clear();
        for claim in copy.running.values_mut() {
            claim.overdue_at = None;
        }
        let ends = lot.expected_ends(now);
        let events_left = 4 * (lot.parked.len() + lot.sleepers.len() + lot.running.len()) + 1_024;
        Self {
            lot,
            copy,
            ends,
            events_left,
        }
    }

    /// Lets the other parked tickets' deadlines expire them in the copy, as they will in the
    /// lot: a ticket ahead that will expire before it starts makes way for `id` (whose own
    /// deadline still expires nothing, so that it has a start to estimate).
    fn with_deadlines_of_others(mut self, id: TaskId) -> Self {
        self.copy.by_deadline = self
            .lot
            .by_deadline
            .iter()
            .filter(|&&(_, other)| other != id)
            .copied()
            .collect();
        self
    }

    /// Admits a newcomer to the copy (its deadline expires nothing there): whether it started at once, or
    /// `None` when the lot would refuse it (a duplicate id, too large, the queue full): it
    /// has no start to estimate, and admission answers for it.
    fn admit(&mut self, ticket: Ticket, slotless: bool, now: u64) -> Option<bool> {
        // As `admit` does: a newcomer at a bound of the queue sheds tasks below it (rule 21).
        let admitted = self.copy.admit_ticket(ticket, slotless, true, now);
        // Its deadline ranks it (under the deadline order) but does not expire it here.
        if let Some(deadline) = ticket.deadline_ms {
            self.copy.by_deadline.remove(&(deadline, ticket.id));
        }
        let super::AdmitParts {
            newcomer, started, ..
        } = admitted.newcomer();
        self.started_at(&started, now);
        match newcomer {
            super::Newcomer::Start => Some(true),
            super::Newcomer::Park => Some(false),
            super::Newcomer::Expire | super::Newcomer::Reject(_) => None,
        }
    }

    /// Tickets that started in the copy at `t` end at `t` plus their expected run time.
    fn started_at(&mut self, started: &[TaskId], t: u64) {
        for &id in started {
            let Some(claim) = self.copy.running.get(&id) else {
                continue;
            };
            let timeout =
                (claim.timeout_ms != super::NO_TIMEOUT).then_some(u64::from(claim.timeout_ms));
            let expected = self.lot.run_times.expected(
                claim.kind,
                claim.declared,
                claim.worker == NO_WORKER,
                timeout,
            );
            if let Some(run_ms) = expected {
                self.ends.push(Reverse((t.saturating_add(run_ms), id)));
            }
        }
    }

    /// Drives the copy from `now` on, telling `started` each start (at its instant); stops
    /// when `started` says it is done, or before the first step past `until`, or when
    /// nothing is left to start or its steps are spent.
    fn run(
        &mut self,
        now: u64,
        until: Option<u64>,
        mut started: impl FnMut(TaskId, u64) -> bool,
    ) -> Stop {
        let mut t = now;
        loop {
            let mut starts = Vec::new();
            while let Some(&Reverse((at, id))) = self.ends.peek() {
                if at > t {
                    break;
                }
                self.ends.pop();
                if let Ok(more) = self.copy.complete(id, t) {
                    starts.extend(more);
                }
            }
            // Ageing, wake-ups and refills: each completion above ran the rest already.
            if self.copy.next_wakeup().is_some_and(|at| at <= t) {
                starts.extend(self.copy.tick(t).started);
            }
            self.started_at(&starts, t);
            let mut done = false;
            for &id in &starts {
                done |= started(id, t);
            }
            if done {
                return Stop::Done(t);
            }
            if self.copy.parked_len() == 0 {
                return Stop::Exhausted;
            }
            let Some(steps) = self.events_left.checked_sub(1) else {
                return Stop::Exhausted;
            };
            self.events_left = steps;
            let end = self.ends.peek().map(|&Reverse((at, _))| at);
            let Some(next) = [end, self.copy.next_wakeup()].into_iter().flatten().min() else {
                return Stop::Exhausted;
            };
            let next = next.max(t);
            if until.is_some_and(|until| next > until) {
                return Stop::Horizon(next);
            }
            t = next;
        }
    }
}

/// How a simulation's run ended.
enum Stop {
    /// Its caller was done, at this instant.
    Done(u64),
    /// Its next step would have passed the horizon: it was at this instant.
    Horizon(u64),
    /// Nothing was left to start, or its steps were spent.
    Exhausted,
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
        Some(StartEstimate { position, start_ms })
    }

    /// The rank and kind of parked (or sleeping) ticket `id`.
    fn waiting_rank(&self, id: TaskId) -> Option<(RankKey, ResourceKind)> {
        if let Some(parked) = self.parked.get(&id) {
            return Some((parked.rank(id), parked.kind));
        }
        let (_, ticket) = self.sleepers.get(&id)?;
        Some((self.rank_of(ticket), ticket.cost.kind))
    }

    /// When running `claim` is expected to end, as of `now` (see the module docs): `None`
    /// when its run time is unknown.
    fn expected_end(&self, claim: &super::Claim, now: u64) -> Option<u64> {
        let timeout =
            (claim.timeout_ms != super::NO_TIMEOUT).then_some(u64::from(claim.timeout_ms));
        let run_ms = self.run_times.expected(
            claim.kind,
            claim.declared,
            claim.worker == NO_WORKER,
            timeout,
        )?;
        let expected = claim.started_ms.saturating_add(run_ms);
        let ran = now.saturating_sub(claim.started_ms);
        // A run that has gone on this long is among the longer ones: it is expected to run
        // as long, against its expected run time, as the runs seen that went as far did.
        let ratio = ran as f64 / run_ms.max(1) as f64;
        let slotless = claim.worker == NO_WORKER;
        if let Some(factor) = self.run_times.survival_factor(claim.kind, slotless, ratio) {
            let longer = (run_ms as f64 * factor).round() as u64;
            let longer = timeout.map_or(longer, |timeout| longer.min(timeout));
            return Some(claim.started_ms.saturating_add(longer).max(now));
        }
        if expected > now {
            return Some(expected);
        }
        // Late: a run that outlived its expected time is expected to end halfway between
        // now and its timeout; without a timeout, to run as long again as it has run (run
        // times have heavy tails: the longer a run has gone on, the longer it tends to go on).
        let Some(timeout) = timeout else {
            return Some(now.saturating_add(ran.max(run_ms)));
        };
        let timed_out = claim.started_ms.saturating_add(timeout);
        Some(now.max(now / 2 + timed_out / 2))
    }

    /// When the running claims are expected to end, as of `now`: at the expected order
    /// statistics of their ends (see `running_ends.rs`), the claims in the order of their
    /// own expected ends; past [`SPREAD_CLAIMS`] claims, each at its own expected end.
    /// Claims of unknown run time never end.
    fn expected_ends(&self, now: u64) -> BinaryHeap<End> {
        let mut claims: Vec<(u64, TaskId)> = self
            .running
            .iter()
            .filter_map(|(&id, claim)| Some((self.expected_end(claim, now)?, id)))
            .collect();
        if claims.len() > SPREAD_CLAIMS {
            return claims.into_iter().map(Reverse).collect();
        }
        claims.sort_unstable();
        let mut chances = Vec::new();
        for (index, &(end, id)) in claims.iter().enumerate() {
            self.end_chances(&self.running[&id], end, now, index, &mut chances);
        }
        let order = expected_order(chances, claims.len(), now);
        claims
            .iter()
            .zip(order)
            .map(|(&(_, id), at)| Reverse((at, id)))
            .collect()
    }

    /// The instants at which running `claim` (the `index`th, expected to end at `end`) may
    /// end, as of `now`, each with its chance: one for each bucket of the runs seen that
    /// went as far as it has (see the module docs), or its expected end alone.
    fn end_chances(
        &self,
        claim: &super::Claim,
        end: u64,
        now: u64,
        index: usize,
        chances: &mut Vec<EndChance>,
    ) {
        let timeout =
            (claim.timeout_ms != super::NO_TIMEOUT).then_some(u64::from(claim.timeout_ms));
        let slotless = claim.worker == NO_WORKER;
        let run_ms = self
            .run_times
            .expected(claim.kind, claim.declared, slotless, timeout)
            .unwrap_or(0)
            .max(1);
        let ratio = now.saturating_sub(claim.started_ms) as f64 / run_ms as f64;
        let spread = &self.run_times.spread[row(claim.kind, slotless)];
        let weight: f64 = spread.beyond(ratio).map(|(_, weight)| weight).sum();
        let Some(all) = spread.mean_beyond(0.0).filter(|_| weight > f64::EPSILON) else {
            chances.push((end, index, 1.0));
            return;
        };
        for (r, w) in spread.beyond(ratio) {
            let length = (run_ms as f64 * r / all).round() as u64;
            let length = timeout.map_or(length, |timeout| length.min(timeout));
            let at = claim.started_ms.saturating_add(length).max(now);
            chances.push((at, index, w / weight));
        }
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
            .map(|(&(id, ..), position)| {
                let start_ms = started_at.get(&id).copied();
                (id, StartEstimate { position, start_ms })
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
