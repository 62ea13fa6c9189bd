//! Rule 24: dependencies. A ticket may wait for other live tickets (its *parents*) to end
//! before it takes part in any decision: it is *held*.
//!
//! A held ticket is live (its state is `Parked`, it can be cancelled, it counts among the
//! parked and [`ParkingLot::why_waiting`] says [`WaitReason::Dependencies`]) but is in no
//! index a decision reads, like a sleeper (rule 16). The driver tells the lot how each
//! parent ended ([`ParkingLot::parent_ended`]); when the last one succeeded, the ticket
//! parks at its own rank (as a restored ticket does: it was admitted once and is never
//! lost past a bound) and what fits starts. When one did not succeed, the ticket is handed
//! back to the driver to end `Cancelled`, unless it asked to run anyway (a cleanup step),
//! in which case that parent counts as done.
//!
//! # State and cost
//!
//! - `held`: per held ticket, its ticket, the number of parents still live (`pending`) and
//!   whether it runs anyway.
//! - `children`: per live parent, the held tickets waiting on it (a ticket naming a parent
//!   twice is counted once).
//!
//! A parent's end takes its list out of `children` and decrements each child's counter:
//! O(1) per edge, so a child of a thousand parents costs O(1) per parent end and nothing is
//! ever scanned. A child that left early (cancelled, or ended by another parent's failure)
//! stays in its other parents' lists until they end, where it is skipped: no list is
//! searched to remove it.
//!
//! # Invariants (checked by [`ParkingLot::check_invariants`])
//!
//! - A held ticket is neither parked, sleeping nor running, and its `pending` equals the
//!   number of lists in `children` that name it.
//! - Every parent in `children` is live in the lot.
//!
//! A cycle cannot form here: a ticket may only name parents that are live when it is held,
//! and nothing live can name a ticket that is not live yet. The driver refuses a ticket
//! that names itself before it asks.

use super::{Admit, FastMap, ParkingLot, Rejection, Ticket, WaitReason};
use crate::domain::TaskId;

/// The held tickets and who waits for whom. See the module docs.
#[derive(Debug, Clone, Default)]
pub(super) struct Dependencies {
    held: FastMap<TaskId, Held>,
    children: FastMap<TaskId, Vec<TaskId>>,
    /// Held tickets with a deadline, by deadline: `tick` expires them as parked ones.
    by_deadline: std::collections::BTreeSet<(u64, TaskId)>,
}

/// A held ticket.
#[derive(Debug, Clone, Copy)]
struct Held {
    ticket: Ticket,
    /// Parents still live.
    pending: u32,
    /// It runs once every parent ended, however they ended.
    run_anyway: bool,
    /// The instant before which it must not start (a scheduled start that waits for its
    /// parents as well): released before it, it sleeps until then (rule 16).
    not_before_ms: Option<u64>,
}

/// What a parent's end did to the tickets that waited on it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Released {
    /// Tickets that start now, in this order (the released ones, and what else fits).
    pub started: Vec<TaskId>,
    /// Held tickets the parent's failure ends: the driver ends each `Cancelled`. They left
    /// the lot.
    pub cancelled: Vec<TaskId>,
}

impl Dependencies {
    pub(super) fn len(&self) -> usize {
        self.held.len()
    }

    pub(super) fn holds(&self, id: TaskId) -> bool {
        !self.held.is_empty() && self.held.contains_key(&id)
    }

    pub(super) fn pending(&self, id: TaskId) -> Option<u32> {
        self.held.get(&id).map(|held| held.pending)
    }

    pub(super) fn tickets(&self) -> impl Iterator<Item = &Ticket> {
        self.held.values().map(|held| &held.ticket)
    }

    pub(super) fn ticket(&self, id: TaskId) -> Option<&Ticket> {
        self.held.get(&id).map(|held| &held.ticket)
    }

    pub(super) fn has_children(&self, parent: TaskId) -> bool {
        !self.children.is_empty() && self.children.contains_key(&parent)
    }

    pub(super) fn next_deadline(&self) -> Option<u64> {
        self.by_deadline.first().map(|&(at, _)| at)
    }

    /// Removes a held ticket (it stays in its parents' lists, where it is skipped).
    fn remove(&mut self, id: TaskId) -> Option<Held> {
        let held = self.held.remove(&id)?;
        if let Some(deadline) = held.ticket.deadline_ms {
            self.by_deadline.remove(&(deadline, id));
        }
        Some(held)
    }

    /// Takes every held ticket out (shutdown); returns their ids.
    pub(super) fn take_all(&mut self) -> Vec<TaskId> {
        let ids = self.held.keys().copied().collect();
        *self = Self::default();
        ids
    }

    /// Held tickets whose deadline is at or before `now`, removed.
    pub(super) fn expire(&mut self, now: u64) -> Vec<TaskId> {
        let mut expired = Vec::new();
        while let Some(&(deadline, id)) = self.by_deadline.first() {
            if deadline > now {
                break;
            }
            self.by_deadline.pop_first();
            self.held.remove(&id);
            expired.push(id);
        }
        expired
    }

    /// The invariants of the module docs; `live` says whether the lot holds a ticket
    /// parked, sleeping or running.
    pub(super) fn check(&self, live: impl Fn(TaskId) -> bool) -> Result<(), String> {
        let mut named: FastMap<TaskId, u32> = FastMap::default();
        for (parent, children) in &self.children {
            if !live(*parent) && !self.held.contains_key(parent) {
                return Err(format!("parent {parent} is not live but has children"));
            }
            for child in children
                .iter()
                .filter(|child| self.held.contains_key(child))
            {
                *named.entry(*child).or_default() += 1;
            }
        }
        for (id, held) in &self.held {
            if live(*id) {
                return Err(format!(
                    "held ticket {id} is also parked, sleeping or running"
                ));
            }
            let lists = named.get(id).copied().unwrap_or(0);
            if lists != held.pending {
                return Err(format!(
                    "held ticket {id} counts {} pending parents but {lists} lists name it",
                    held.pending
                ));
            }
        }
        Ok(())
    }
}

impl ParkingLot {
    /// Admits `ticket` held until its `parents` end (rule 24): each must be live in the lot
    /// (parked, sleeping, held or running); duplicates count once. With no parent it is
    /// [`admit`](Self::admit). A held ticket is refused or expired as `admit` would refuse
    /// or expire it, and refused `QueueFull` when `max_queue_depth` tickets are parked or
    /// held; a parent that is not live, or the ticket itself, is refused as
    /// [`Rejection::UnknownParent`]. Answers `Admit::Park` when it is held.
    ///
    /// ```
    /// use prometheus_parking_lot_actors::domain::{PoolLimits, Priority, ResourceCost};
    /// use prometheus_parking_lot_actors::scheduler::core::{Admit, ParkingLot, Ticket, WaitReason};
    ///
    /// let mut lot = ParkingLot::new(PoolLimits::new(10, 4)).unwrap();
    /// let ticket = |id| Ticket {
    ///     id,
    ///     priority: Priority::Normal,
    ///     cost: ResourceCost::gpu_vram(1),
    ///     created_at_ms: id,
    ///     deadline_ms: None,
    ///     tenant: 0,
    ///     timeout_ms: None,
    ///     also: Default::default(),
    /// };
    /// assert_eq!(lot.admit(ticket(1), 0), Admit::Start);
    /// assert_eq!(lot.admit(ticket(2), 0), Admit::Start);
    /// assert_eq!(lot.admit_after(ticket(3), &[1, 2], false, 0), Admit::Park);
    /// assert_eq!(lot.why_waiting(3), Some(WaitReason::Dependencies { pending: 2 }));
    /// lot.complete(1, 5).unwrap();
    /// assert!(lot.parent_ended(1, true, 5).started.is_empty());
    /// lot.complete(2, 6).unwrap();
    /// assert_eq!(lot.parent_ended(2, true, 6).started, vec![3]);
    /// ```
    pub fn admit_after(
        &mut self,
        ticket: Ticket,
        parents: &[TaskId],
        run_anyway: bool,
        now: u64,
    ) -> Admit {
        if parents.is_empty() {
            return self.admit(ticket, now);
        }
        if let Some(refused) = self.screen(&ticket, now) {
            return refused;
        }
        let id = ticket.id;
        if let Some(&unknown) = parents
            .iter()
            .find(|&&parent| parent == id || !(self.is_live(parent)))
        {
            return Admit::Reject(Rejection::UnknownParent(unknown));
        }
        if self.parked_len() >= self.limits.max_queue_depth {
            return Admit::Reject(Rejection::QueueFull {
                max_queue_depth: self.limits.max_queue_depth,
            });
        }
        self.hold(ticket, parents, run_anyway);
        Admit::Park
    }

    /// Holds a ticket that a durable queue kept from an earlier run held for `parents`
    /// (each live in the lot: restored before it), past `max_queue_depth` if need be (it is
    /// stored already and must not be lost); with no parent left it is
    /// [`restore`](Self::restore)d. It is refused where `restore` refuses a ticket, and a
    /// parent that is not live, or the ticket itself, refuses it as
    /// [`Rejection::UnknownParent`].
    ///
    /// ```
    /// use prometheus_parking_lot_actors::domain::{PoolLimits, Priority, ResourceCost};
    /// use prometheus_parking_lot_actors::scheduler::core::{ParkingLot, Ticket};
    ///
    /// let mut lot = ParkingLot::new(PoolLimits::new(10, 4)).unwrap();
    /// let ticket = |id| Ticket {
    ///     id,
    ///     priority: Priority::Normal,
    ///     cost: ResourceCost::gpu_vram(1),
    ///     created_at_ms: id,
    ///     deadline_ms: None,
    ///     tenant: 0,
    ///     timeout_ms: None,
    ///     also: Default::default(),
    /// };
    /// lot.restore(ticket(1), 0).unwrap();
    /// lot.restore_after(ticket(2), &[1], false, 0).unwrap();
    /// assert_eq!(lot.pending_parents(2), Some(1));
    /// ```
    pub fn restore_after(
        &mut self,
        ticket: Ticket,
        parents: &[TaskId],
        run_anyway: bool,
        now: u64,
    ) -> Result<(), Rejection> {
        if parents.is_empty() {
            return self.restore(ticket, now);
        }
        self.screen_stored(&ticket, now)?;
        let id = ticket.id;
        if let Some(&unknown) = parents
            .iter()
            .find(|&&parent| parent == id || !(self.is_live(parent)))
        {
            return Err(Rejection::UnknownParent(unknown));
        }
        self.hold(ticket, parents, run_anyway);
        Ok(())
    }

    /// Holds `ticket` for its live `parents` (checked by the caller).
    fn hold(&mut self, ticket: Ticket, parents: &[TaskId], run_anyway: bool) {
        let id = ticket.id;
        let mut distinct: Vec<TaskId> = parents.to_vec();
        distinct.sort_unstable();
        distinct.dedup();
        let deps = &mut self.dependencies;
        for &parent in &distinct {
            deps.children.entry(parent).or_default().push(id);
        }
        if let Some(deadline) = ticket.deadline_ms {
            deps.by_deadline.insert((deadline, id));
        }
        let ticket = self.at_least_a_unit(ticket);
        self.dependencies.held.insert(
            id,
            Held {
                ticket,
                pending: distinct.len() as u32,
                run_anyway,
                not_before_ms: None,
            },
        );
    }

    /// Held ticket `id`, once its parents release it, sleeps until `until_ms` if that is
    /// still ahead then (rule 16), instead of parking at once: a scheduled start that waits
    /// for its parents as well. Whether `id` is held.
    ///
    /// ```
    /// use prometheus_parking_lot_actors::domain::{PoolLimits, Priority, ResourceCost};
    /// use prometheus_parking_lot_actors::scheduler::core::{Admit, ParkingLot, Ticket};
    ///
    /// let mut lot = ParkingLot::new(PoolLimits::new(10, 4)).unwrap();
    /// let ticket = |id| Ticket {
    ///     id,
    ///     priority: Priority::Normal,
    ///     cost: ResourceCost::gpu_vram(1),
    ///     created_at_ms: id,
    ///     deadline_ms: None,
    ///     tenant: 0,
    ///     timeout_ms: None,
    ///     also: Default::default(),
    /// };
    /// assert_eq!(lot.admit(ticket(1), 0), Admit::Start);
    /// assert_eq!(lot.admit_after(ticket(2), &[1], false, 0), Admit::Park);
    /// assert!(lot.hold_until(2, 500));
    /// lot.complete(1, 100).unwrap();
    /// assert!(lot.parent_ended(1, true, 100).started.is_empty(), "it sleeps until 500");
    /// assert_eq!(lot.tick(500).started, vec![2]);
    /// ```
    pub fn hold_until(&mut self, id: TaskId, until_ms: u64) -> bool {
        match self.dependencies.held.get_mut(&id) {
            Some(held) => {
                held.not_before_ms = Some(until_ms);
                true
            }
            None => false,
        }
    }

    /// How many parents held ticket `id` still waits for, if it is held (O(1)).
    pub fn pending_parents(&self, id: TaskId) -> Option<u32> {
        self.dependencies.pending(id)
    }

    /// Whether held tickets wait on `parent` (O(1)): the driver calls
    /// [`parent_ended`](Self::parent_ended) only then.
    pub fn has_children(&self, parent: TaskId) -> bool {
        self.dependencies.has_children(parent)
    }

    /// Parent `parent` left the lot (`succeeded`: it ran and succeeded; otherwise it failed,
    /// was cancelled, expired or was refused): its held children learn it (rule 24). A
    /// child whose last parent ended parks at its rank and what fits starts; a child of a
    /// parent that did not succeed is handed back to end `Cancelled`, unless it runs anyway.
    /// O(1) per child.
    pub fn parent_ended(&mut self, parent: TaskId, succeeded: bool, now: u64) -> Released {
        let mut released = Released::default();
        let Some(children) = self.dependencies.children.remove(&parent) else {
            return released;
        };
        let mut parked = false;
        for child in children {
            let Some(held) = self.dependencies.held.get_mut(&child) else {
                continue;
            };
            held.pending -= 1;
            if !succeeded && !held.run_anyway {
                self.dependencies.remove(child);
                released.cancelled.push(child);
                continue;
            }
            if held.pending > 0 {
                continue;
            }
            let Some(held) = self.dependencies.remove(child) else {
                continue;
            };
            match held.not_before_ms.filter(|&until_ms| until_ms > now) {
                Some(until_ms) => {
                    self.sleeping.insert((until_ms, child));
                    self.sleepers.insert(child, (until_ms, held.ticket));
                }
                None => {
                    self.park_returned(held.ticket, now);
                    parked = true;
                }
            }
        }
        if parked {
            self.unpark(now, &mut released.started);
        }
        released
    }

    /// Removes held ticket `id` (a cancel); whether it was held.
    pub(super) fn cancel_held(&mut self, id: TaskId) -> bool {
        self.dependencies.remove(id).is_some()
    }

    /// Why held ticket `id` waits, if it is held.
    pub(super) fn why_held(&self, id: TaskId) -> Option<WaitReason> {
        let pending = self.dependencies.pending(id)?;
        Some(WaitReason::Dependencies { pending })
    }
}
