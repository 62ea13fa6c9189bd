//! The order in which parked tasks deserve to start.

use std::cmp::Reverse;

use crate::domain::{Priority, TaskId};

/// A parked task's place in line: higher priority first, then older, then smaller id.
///
/// Smaller compares better, so the best-ranked task of a set is its minimum. The id makes
/// every key unique, which lets ordered sets hold keys without a separate tiebreak.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct RankKey {
    urgency: Reverse<Priority>,
    created_at_ms: u64,
    id: TaskId,
}

impl RankKey {
    /// The key of a task.
    pub fn new(priority: Priority, created_at_ms: u64, id: TaskId) -> Self {
        Self {
            urgency: Reverse(priority),
            created_at_ms,
            id,
        }
    }

    /// The task this key ranks.
    pub fn id(&self) -> TaskId {
        self.id
    }

    /// Whether `self` ranks ahead of (deserves to start before) `other`.
    pub fn ranks_ahead_of(&self, other: &RankKey) -> bool {
        self < other
    }
}
