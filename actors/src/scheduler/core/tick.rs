//! Time-driven events: what [`ParkingLot::tick`] does at `now` (deadlines, rule 7; the
//! watchdog asked for by [`ParkingLot::watch`], rule 10; sleepers parked until a later time,
//! rule 16) and [`ParkingLot::next_wakeup`], the next instant it has work to do.

use super::{ParkingLot, Rejection, Tick, Ticket};
use crate::domain::TaskId;

impl ParkingLot {
    /// Asks the watchdog to report running task `id` overdue from `at` on (see rule 10).
    /// Ignored for a task that is not running.
    pub fn watch(&mut self, id: TaskId, at: u64) {
        let Some(claim) = self.running.get_mut(&id) else {
            return;
        };
        if let Some(previous) = claim.overdue_at.replace(at) {
            self.by_overdue.remove(&(previous, id));
        }
        self.by_overdue.insert((at, id));
    }

    /// The earliest time at which [`tick`](Self::tick) has something to do (a deadline to
    /// expire or a task to age into starvation).
    pub fn next_wakeup(&self) -> Option<u64> {
        let deadline = self.by_deadline.first().map(|&(at, _)| at);
        let aging = self.limits.starvation.max_park_ms.and_then(|max_park_ms| {
            self.by_park_time
                .first()
                .map(|&(parked_at, _)| parked_at.saturating_add(max_park_ms))
        });
        let overdue = self.by_overdue.first().map(|&(at, _)| at);
        let sleeper = self.sleeping.first().map(|&(at, _)| at);
        let held = self.dependencies.next_deadline();
        [
            deadline,
            aging,
            overdue,
            self.budget_wakeup(),
            sleeper,
            held,
        ]
        .into_iter()
        .flatten()
        .min()
    }

    /// Advances time: expires parked tasks whose deadline is at or before `now`, reports
    /// running tasks that became overdue, ages parked tasks into starvation, and starts what
    /// an expired reservation unblocked.
    pub fn tick(&mut self, now: u64) -> Tick {
        let mut tick = Tick::default();
        while let Some(&(at, id)) = self.by_overdue.first() {
            if at > now {
                break;
            }
            self.by_overdue.pop_first();
            if let Some(claim) = self.running.get_mut(&id) {
                claim.overdue_at = None;
                tick.overdue.push(id);
            }
        }
        if !self.sleeping.is_empty() {
            // A sleeper whose deadline passed too wakes first, so that it expires here.
            self.wake_sleepers(now);
        }
        while let Some(&(deadline, id)) = self.by_deadline.first() {
            if deadline > now {
                break;
            }
            self.remove_parked(id);
            tick.expired.push(id);
        }
        if self
            .dependencies
            .next_deadline()
            .is_some_and(|at| at <= now)
        {
            tick.expired.extend(self.dependencies.expire(now));
        }
        self.unpark(now, &mut tick.started);
        tick
    }

    /// Parks a task from `until_ms` on (rule 16): a failed run's task waiting out its
    /// backoff. Until then it is live (its state is `Parked`, it can be cancelled) but takes
    /// no part in any decision; from then on it is parked as by [`restore`](Self::restore),
    /// at its rank. It is refused where `restore` refuses a ticket. Call [`tick`](Self::tick) at [`next_wakeup`](Self::next_wakeup).
    ///
    /// ```
    /// use prometheus_parking_lot_actors::domain::{PoolLimits, Priority, ResourceCost};
    /// use prometheus_parking_lot_actors::scheduler::core::{ParkingLot, Ticket};
    ///
    /// let mut lot = ParkingLot::new(PoolLimits::new(10, 2)).unwrap();
    /// let ticket = Ticket {
    ///     id: 1,
    ///     priority: Priority::Normal,
    ///     cost: ResourceCost::gpu_vram(4),
    ///     created_at_ms: 0,
    ///     deadline_ms: None,
    ///     tenant: 0,
    ///     timeout_ms: None,
    ///     also: Default::default(),
    /// };
    /// lot.park_until(ticket, 500, 100).unwrap();
    /// assert_eq!(lot.next_wakeup(), Some(500));
    /// assert!(lot.tick(499).started.is_empty());
    /// assert_eq!(lot.tick(500).started, vec![1]);
    /// ```
    pub fn park_until(&mut self, ticket: Ticket, until_ms: u64, now: u64) -> Result<(), Rejection> {
        if until_ms <= now {
            return self.restore(ticket, now);
        }
        self.screen_stored(&ticket, now)?;
        let id = ticket.id;
        self.sleeping.insert((until_ms, id));
        self.sleepers
            .insert(id, (until_ms, self.at_least_a_unit(ticket)));
        Ok(())
    }

    /// Parks the sleepers whose time has come (rule 16).
    pub(super) fn wake_sleepers(&mut self, now: u64) {
        while let Some(&(until, id)) = self.sleeping.first() {
            if until > now {
                break;
            }
            self.sleeping.pop_first();
            if let Some((_, ticket)) = self.sleepers.remove(&id) {
                self.park_returned(ticket, now);
            }
        }
    }
}
