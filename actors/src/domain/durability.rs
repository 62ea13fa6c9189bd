//! How much of a pool's work a durable queue keeps across a crash.

use std::time::Duration;

/// What a durable queue writes, and so what a crash costs. An in-memory queue keeps nothing
/// whatever this says.
///
/// ```
/// use std::time::Duration;
/// use prometheus_parking_lot_actors::domain::Durability;
///
/// assert_eq!(Durability::default(), Durability::Accepted);
/// let burst_friendly = Durability::Parked { spin: Duration::from_millis(5) };
/// assert!(!burst_friendly.writes_started_tasks());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Durability {
    /// Every accepted task is stored before its submit returns, the ones that start at once
    /// included (stored as running). After a crash every accepted task reaches a terminal
    /// state; the ones that were running run again (at-least-once).
    #[default]
    Accepted,
    /// Only parked tasks are stored, and only once they have waited `spin` in memory: a task
    /// that starts at once, or within `spin`, never touches the store. A crash loses the tasks
    /// that were running or still spinning.
    Parked {
        /// How long a task waits in memory before it is written (zero: written at once).
        spin: Duration,
    },
}

impl Durability {
    /// Whether tasks that start at once are stored too.
    pub fn writes_started_tasks(&self) -> bool {
        matches!(self, Durability::Accepted)
    }
}
