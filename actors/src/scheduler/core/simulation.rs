//! Rule 23's simulation: a copy of the lot driven from `now` on as a driver would drive it
//! if every claim ran for its expected time and nothing arrived, from the running claims'
//! expected ends (`estimate.rs` states the rules, `running_ends.rs` how those ends are
//! spread). The estimates read when each ticket starts in the copy.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use crate::domain::TaskId;

use super::running_ends::{expected_order, SPREAD_CLAIMS};
use super::{ParkingLot, Ticket, NO_WORKER};

/// A running claim's end in the simulation. Ends at one instant come in the order of their
/// ids, one at a time, as a driver completes them.
type End = Reverse<(u64, TaskId)>;

/// The lot from `now` on, as the module docs of `estimate.rs` describe: a copy of the lot,
/// driven as a driver would drive it if every claim ran for its expected time and nothing
/// arrived.
pub(super) struct Simulation<'a> {
    /// The lot as it is: what the run times are expected to be.
    lot: &'a ParkingLot,
    /// The copy that is driven.
    copy: ParkingLot,
    /// The copy's running claims by expected end (claims of unknown run time never end).
    ends: BinaryHeap<End>,
    pub(super) events_left: usize,
}

impl<'a> Simulation<'a> {
    pub(super) fn new(lot: &'a ParkingLot, now: u64) -> Self {
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
    pub(super) fn with_deadlines_of_others(mut self, id: TaskId) -> Self {
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
    pub(super) fn admit(&mut self, ticket: Ticket, slotless: bool, now: u64) -> Option<bool> {
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
    pub(super) fn run(
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
pub(super) enum Stop {
    /// Its caller was done, at this instant.
    Done(u64),
    /// Its next step would have passed the horizon: it was at this instant.
    Horizon(u64),
    /// Nothing was left to start, or its steps were spent.
    Exhausted,
}

impl ParkingLot {
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
}
