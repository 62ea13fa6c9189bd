//! Periodic tasks: the schedules a pool carries, and the service that enqueues their ticks.
//!
//! A [`Schedule`] names when it ticks ([`Timing`]: a cron expression in a time zone, or a
//! fixed period) and the metadata of the task each tick makes (priority, cost, mailbox key);
//! the payload comes from a function of the [`Tick`] given with it to
//! [`PoolClient::add_schedule`](crate::engine::PoolClient::add_schedule).
//!
//! One small service per pool, the *periodic enqueuer* (`enqueuer.rs`), sleeps until the
//! next tick of any schedule and submits it. Its rules:
//!
//! 1. A tick's identity is its schedule's name and its instant; every node names the same
//!    instants (`timing.rs`).
//! 2. On a queue of the pool's own (memory, yaque) a tick is submitted like any task. On a
//!    queue several nodes share, it is parked with its identity, and the queue stores a tick
//!    once ([`ScheduleTicks::enqueue_tick`](crate::queue::ScheduleTicks::enqueue_tick)): of the
//!    nodes that try the same tick, one parks it; the task then runs once in the fleet.
//! 3. When ticks fall due together (the node was busy or asleep), the latest of them is
//!    enqueued and the older ones are folded into it: a schedule never queues a backlog.
//! 4. Ticks that passed while no node of a shared queue ran the schedule follow its
//!    [`Missed`] policy when a node starts it again: skipped, or run once (the latest of
//!    them, enqueued at once). On a queue of the pool's own nothing is remembered across
//!    starts, so a schedule starts afresh there.
//! 5. A paused schedule enqueues nothing; when resumed, it waits for its next tick (what
//!    passed during the pause is skipped). A pause is the node's: on a shared queue, pause
//!    the schedule on each node that carries it.

mod board;
pub(crate) mod enqueuer;
mod timing;

use std::time::Duration;

use serde::Serialize;

use crate::domain::{MailboxKey, Priority, ResourceCost, TaskId};

pub(crate) use board::ScheduleBoard;
pub use timing::{CronTiming, Timing, MIN_PERIOD};

/// What a schedule does with ticks that passed while no node ran it (rule 4).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Missed {
    /// Drop them: the next task is the next tick's.
    #[default]
    Skip,
    /// Enqueue one task for all of them, at once, under the latest missed tick.
    RunOnce,
}

impl Missed {
    /// The name a config file writes.
    pub fn as_str(self) -> &'static str {
        match self {
            Missed::Skip => "skip",
            Missed::RunOnce => "run_once",
        }
    }
}

/// One periodic task of a pool: when it ticks and what each tick's task costs and ranks as.
///
/// ```
/// use std::time::Duration;
/// use prometheus_parking_lot_actors::domain::{Priority, ResourceCost};
/// use prometheus_parking_lot_actors::schedule::{Missed, Schedule, Timing};
///
/// let reindex = Schedule::new("reindex", Timing::cron("0 2 * * *", "Europe/Paris")?)?
///     .with_priority(Priority::Low)
///     .with_cost(ResourceCost::cpu(4))
///     .with_missed(Missed::RunOnce);
/// assert_eq!(reindex.name, "reindex");
/// # Ok::<(), prometheus_parking_lot_actors::schedule::ScheduleError>(())
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct Schedule {
    /// Its name, unique within the pool (and the queue, for a shared one): 1 to 64 letters,
    /// digits, `_`, `-` or `.`.
    pub name: String,
    /// When it ticks.
    pub timing: Timing,
    /// What it does with ticks missed while no node ran it.
    pub missed: Missed,
    /// Each task's priority.
    pub priority: Priority,
    /// Each task's cost.
    pub cost: ResourceCost,
    /// Where each task's result is stored (its tenant is the task's tenant).
    pub mailbox: MailboxKey,
}

impl Schedule {
    /// The longest name a schedule may have.
    pub const MAX_NAME_LEN: usize = 64;

    /// A schedule named `name` ticking at `timing`; its tasks are `Normal`, cost one CPU
    /// unit, go to the mailbox of tenant `schedules`, and missed ticks are skipped.
    pub fn new(name: impl Into<String>, timing: Timing) -> Result<Self, ScheduleError> {
        let name = name.into();
        check_name(&name)?;
        Ok(Self {
            name,
            timing,
            missed: Missed::Skip,
            priority: Priority::Normal,
            cost: ResourceCost::cpu(1),
            mailbox: MailboxKey::new("schedules"),
        })
    }

    /// Sets each task's priority.
    pub fn with_priority(mut self, priority: Priority) -> Self {
        self.priority = priority;
        self
    }

    /// Sets each task's cost.
    pub fn with_cost(mut self, cost: ResourceCost) -> Self {
        self.cost = cost;
        self
    }

    /// Sets where each task's result goes (and so its tenant).
    pub fn with_mailbox(mut self, mailbox: MailboxKey) -> Self {
        self.mailbox = mailbox;
        self
    }

    /// Sets the missed-tick policy.
    pub fn with_missed(mut self, missed: Missed) -> Self {
        self.missed = missed;
        self
    }
}

fn check_name(name: &str) -> Result<(), ScheduleError> {
    let allowed = |c: char| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.');
    if name.is_empty() || name.len() > Schedule::MAX_NAME_LEN || !name.chars().all(allowed) {
        return Err(ScheduleError::Name {
            name: name.to_owned(),
        });
    }
    Ok(())
}

/// One tick of a schedule: what the payload function is given.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tick {
    /// The schedule's name.
    pub schedule: String,
    /// The tick's instant, milliseconds since the Unix epoch (not when it was enqueued).
    pub at_ms: u128,
}

impl Tick {
    /// The task id of this tick's task: the same on every node (FNV-1a of the schedule's
    /// name and the tick's instant), so logs of different nodes name one task.
    pub fn task_id(&self) -> TaskId {
        const OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
        const PRIME: u64 = 0x0000_0100_0000_01b3;
        // Hashed as the eight bytes earlier versions hashed, so every node names it alike.
        let at_ms = u64::try_from(self.at_ms).unwrap_or(u64::MAX);
        let bytes = self.schedule.bytes().chain(at_ms.to_le_bytes());
        bytes.fold(OFFSET, |hash, byte| {
            (hash ^ u64::from(byte)).wrapping_mul(PRIME)
        })
    }
}

/// A schedule as the admin API and the CLI show it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ScheduleView {
    /// Its name.
    pub name: String,
    /// Its cron expression, or `every <period>`.
    pub expression: String,
    /// The zone a cron expression is read in; `None` for a period.
    pub zone: Option<String>,
    /// Its missed-tick policy.
    pub missed: Missed,
    /// Whether it is paused on this node.
    pub paused: bool,
    /// Its next tick, milliseconds since the Unix epoch; `None` while paused, or when the
    /// expression names no later instant.
    pub next_tick_ms: Option<u128>,
    /// When this node started the schedule (on a shared queue, after reading the latest tick
    /// the fleet stored): a tick at or before it that the node enqueued was a missed one,
    /// run once. `None` until started.
    pub started_ms: Option<u128>,
    /// The latest tick this node enqueued, if any.
    pub last_enqueued_ms: Option<u128>,
    /// How many ticks this node enqueued since it started (on a shared queue, only those it
    /// won).
    pub enqueued: u64,
}

/// Why a schedule was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ScheduleError {
    /// The name is empty, too long, or has a character a name may not.
    #[error("{name:?} is not a schedule name; use 1 to 64 letters, digits, '_', '-' or '.'")]
    Name {
        /// The name given.
        name: String,
    },
    /// The cron expression cannot be read.
    #[error(
        "{expression:?} is not a cron expression ({reason}); write five fields (minute hour \
         day-of-month month day-of-week, e.g. \"0 2 * * *\") or six with seconds first"
    )]
    Cron {
        /// The expression given.
        expression: String,
        /// What the parser said.
        reason: String,
    },
    /// The zone is not in the time zone database.
    #[error(
        "{zone:?} is not a known time zone; use an IANA name such as \"Europe/Paris\" or \"UTC\""
    )]
    Zone {
        /// The zone given.
        zone: String,
    },
    /// The period is shorter than [`MIN_PERIOD`].
    #[error("a period of {period:?} is too short; use {MIN_PERIOD:?} or more")]
    Period {
        /// The period given.
        period: Duration,
    },
    /// The pool carries a schedule of this name already.
    #[error("the pool already has a schedule named {name:?}")]
    Duplicate {
        /// The name given.
        name: String,
    },
    /// The pool carries no schedule of this name.
    #[error("the pool has no schedule named {name:?}")]
    Unknown {
        /// The name given.
        name: String,
    },
}

/// A schedule's refusal as a pool's error (`InvalidConfig`, with the same text), so that
/// making a schedule and adding it to a pool are one `?` chain:
///
/// ```
/// use std::time::Duration;
/// use prometheus_parking_lot_actors::domain::PoolError;
/// use prometheus_parking_lot_actors::schedule::{Schedule, Timing};
///
/// fn nightly() -> Result<Schedule, PoolError> {
///     Ok(Schedule::new("nightly", Timing::cron("0 2 * * *", "UTC")?)?)
/// }
/// assert!(nightly().is_ok());
/// let too_short = || -> Result<Timing, PoolError> { Ok(Timing::every(Duration::ZERO)?) };
/// assert!(matches!(too_short(), Err(PoolError::InvalidConfig(text)) if text.contains("too short")));
/// ```
impl From<ScheduleError> for crate::domain::PoolError {
    fn from(error: ScheduleError) -> Self {
        crate::domain::PoolError::InvalidConfig(error.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_checked() {
        let timing = Timing::every(Duration::from_secs(1)).unwrap();
        assert!(Schedule::new("nightly-reindex.v2", timing.clone()).is_ok());
        for bad in ["", "two words", "é", &"x".repeat(65)] {
            assert!(matches!(
                Schedule::new(bad, timing.clone()),
                Err(ScheduleError::Name { .. })
            ));
        }
    }

    #[test]
    fn a_ticks_task_id_is_the_same_for_the_same_tick_only() {
        let tick = |schedule: &str, at_ms| Tick {
            schedule: schedule.to_owned(),
            at_ms,
        };
        assert_eq!(tick("a", 1_000).task_id(), tick("a", 1_000).task_id());
        assert_ne!(tick("a", 1_000).task_id(), tick("a", 2_000).task_id());
        assert_ne!(tick("a", 1_000).task_id(), tick("b", 1_000).task_id());
    }
}
