//! The order in which parked tasks deserve to start.

use std::cmp::Reverse;

use crate::domain::{Priority, TaskId};

/// A parked task's place in line: higher priority first, then (under the deadline order,
/// rule 20) earlier deadline, then older, then smaller id.
///
/// Smaller compares better, so the best-ranked task of a set is its minimum. The id makes
/// every key unique, which lets ordered sets hold keys without a separate tiebreak.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct RankKey {
    urgency: Reverse<Priority>,
    /// The deadline under the deadline order, `NO_DUE` without one and under the fifo
    /// order: one constant compares equal everywhere, so fifo keys order exactly as
    /// (priority, created_at_ms, id).
    due: u64,
    created_at_ms: u64,
    id: TaskId,
}

/// The `due` of a key that ranks by admission only: after every deadline.
const NO_DUE: u64 = u64::MAX;

impl RankKey {
    /// The key of a task under the fifo order: priority, then `created_at_ms`, then id.
    pub fn new(priority: Priority, created_at_ms: u64, id: TaskId) -> Self {
        Self::by_deadline(priority, None, created_at_ms, id)
    }

    /// The key of a task under the deadline order (rule 20): priority, then its deadline
    /// (none ranks after every deadline), then `created_at_ms`, then id.
    ///
    /// ```
    /// use prometheus_parking_lot_actors::domain::Priority;
    /// use prometheus_parking_lot_actors::scheduler::core::RankKey;
    ///
    /// let due_soon = RankKey::by_deadline(Priority::Normal, Some(500), 20, 2);
    /// let due_later = RankKey::by_deadline(Priority::Normal, Some(900), 10, 1);
    /// let no_deadline = RankKey::by_deadline(Priority::Normal, None, 0, 3);
    /// let high = RankKey::by_deadline(Priority::High, None, 30, 4);
    /// assert!(due_soon.ranks_ahead_of(&due_later)); // though admitted later
    /// assert!(due_later.ranks_ahead_of(&no_deadline));
    /// assert!(high.ranks_ahead_of(&due_soon)); // priority first
    /// assert_eq!(due_soon.deadline_ms(), Some(500));
    /// ```
    pub fn by_deadline(
        priority: Priority,
        deadline_ms: Option<u64>,
        created_at_ms: u64,
        id: TaskId,
    ) -> Self {
        Self {
            urgency: Reverse(priority),
            due: deadline_ms.unwrap_or(NO_DUE),
            created_at_ms,
            id,
        }
    }

    /// The deadline the key ranks by: `None` under the fifo order and for a task without
    /// one.
    pub fn deadline_ms(&self) -> Option<u64> {
        (self.due != NO_DUE).then_some(self.due)
    }

    /// The task this key ranks.
    pub fn id(&self) -> TaskId {
        self.id
    }

    /// The task's priority.
    pub fn priority(&self) -> Priority {
        self.urgency.0
    }

    /// The time the task ranks by.
    pub fn created_at_ms(&self) -> u64 {
        self.created_at_ms
    }

    /// Whether `self` ranks ahead of (deserves to start before) `other`.
    pub fn ranks_ahead_of(&self, other: &RankKey) -> bool {
        self < other
    }
}

/// A parked task's place in line under a fair share: priority first, then its tenant's
/// weighted service counter (under a fair share by use, rule 22; 0 for every tenant
/// otherwise), then how much its tenant uses now (units of the task's kind, then running
/// tasks), then how long ago the tenant last started a task, then the task's own rank (its
/// deadline under rule 20, its age, its id).
///
/// Unlike a [`RankKey`] it changes while the task waits (its tenant's usage does), so it is
/// computed when a decision is made, never stored in an index.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(super) struct FairKey {
    pub(super) urgency: Reverse<Priority>,
    /// The bits of the tenant's raw counter (non-negative, so they order as the number).
    pub(super) tenant_service: u64,
    pub(super) tenant_units: u32,
    pub(super) tenant_running: u32,
    pub(super) tenant_last_start: u64,
    pub(super) due: u64,
    pub(super) created_at_ms: u64,
    pub(super) id: TaskId,
}

impl FairKey {
    /// The key of a task ranked `rank` whose tenant has counter `service` (bits), holds
    /// `units` of the task's kind and runs `running` tasks, the last started as the pool's
    /// `last_start`th start.
    pub(super) fn new(
        rank: RankKey,
        service: u64,
        units: u32,
        running: u32,
        last_start: u64,
    ) -> Self {
        Self {
            urgency: rank.urgency,
            tenant_service: service,
            tenant_units: units,
            tenant_running: running,
            tenant_last_start: last_start,
            due: rank.due,
            created_at_ms: rank.created_at_ms,
            id: rank.id,
        }
    }

    /// The least key a task of this key's tenant could have at priority `ceiling` or
    /// below: this key itself when its priority is at most `ceiling`, else `ceiling` with
    /// the same tenant usage and the earliest time and id.
    pub(super) fn at_most(&self, ceiling: Priority) -> Self {
        if self.urgency.0 <= ceiling {
            return *self;
        }
        Self {
            urgency: Reverse(ceiling),
            due: 0,
            created_at_ms: 0,
            id: 0,
            ..*self
        }
    }

    /// The least key of the next lower priority than this key's, if there is one.
    pub(super) fn next_priority_start(&self) -> Option<Self> {
        let lower = Priority::ALL
            .into_iter()
            .rev()
            .find(|priority| *priority < self.urgency.0)?;
        Some(Self {
            urgency: Reverse(lower),
            tenant_service: 0,
            tenant_units: 0,
            tenant_running: 0,
            tenant_last_start: 0,
            due: 0,
            created_at_ms: 0,
            id: 0,
        })
    }

    /// The task this key ranks.
    pub(super) fn rank(&self) -> RankKey {
        RankKey {
            urgency: self.urgency,
            due: self.due,
            created_at_ms: self.created_at_ms,
            id: self.id,
        }
    }
}
