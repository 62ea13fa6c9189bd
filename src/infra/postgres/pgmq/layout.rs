//! The pgmq layout ([`PgmqLayout`]): where a queue's tasks live (a PGMQ queue per priority
//! level, a dead-letter queue, the entry registry), the names of the functions made for it,
//! and the expressions that read a message's fields as its indexes have them. See
//! [`queue`](super::queue) for the layout in full.

use crate::core::{PoolError, QueueOrder};
use crate::infra::postgres::{Identifier, PgmqSource};

/// The priority levels, best first: their rank number and the suffix of their PGMQ queue.
pub(super) const LEVELS: [(i16, &str); 4] = [(3, "crit"), (2, "high"), (1, "norm"), (0, "low")];

/// The table that keeps entry ids unique across a queue's levels.
pub(super) const ENTRIES: &str = "pl_pgmq_entries";

/// The pgmq layout: a PGMQ queue per priority level, and a dead-letter queue.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PgmqLayout {
    /// The configured name, lower-cased (PGMQ folds queue names to lower case).
    pub(super) name: String,
    pub(super) source: PgmqSource,
    /// The levels' tables, best first.
    pub(super) levels: [Level; 4],
    /// The dead-letter queue's table and archive.
    pub(super) dead: (Identifier, Identifier),
    /// The order claims take a level's messages in.
    pub(super) order: QueueOrder,
    /// The function that releases or cancels the children of ended messages
    /// (`pl_pgmq_<name>_ended`, see `dependencies.rs`).
    pub(super) ended_function: Identifier,
    /// The function that parks a child waiting for its parents
    /// (`pl_pgmq_<name>_park_waiting`).
    pub(super) park_waiting_function: Identifier,
    /// The function a bounded queue parks through (`pl_pgmq_<name>_park_within`, see
    /// `bounded.rs`).
    pub(super) park_within_function: Identifier,
}

/// A priority level's PGMQ queue.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Level {
    /// Its rank number (a priority as stored).
    pub(super) p: i16,
    /// Its queue's table, `q_<name>_<suffix>` in schema `pgmq`.
    pub(super) table: Identifier,
    /// Its archive, `a_<name>_<suffix>`.
    pub(super) archive: Identifier,
}

impl PgmqLayout {
    /// The layout of queue `name` (checked), claimed in `order`, its PGMQ found `source`
    /// (set again once the queues are made).
    pub(super) fn new(
        name: String,
        source: PgmqSource,
        order: QueueOrder,
    ) -> Result<Self, PoolError> {
        let tables = |suffix: &str| -> Result<(Identifier, Identifier), PoolError> {
            Ok((
                Identifier::new(&format!("q_{name}_{suffix}"))?,
                Identifier::new(&format!("a_{name}_{suffix}"))?,
            ))
        };
        let level = |(p, suffix): (i16, &str)| -> Result<Level, PoolError> {
            let (table, archive) = tables(suffix)?;
            Ok(Level { p, table, archive })
        };
        let [crit, high, norm, low] = LEVELS;
        Ok(Self {
            levels: [level(crit)?, level(high)?, level(norm)?, level(low)?],
            dead: tables("dlq")?,
            ended_function: Identifier::new(&format!("pl_pgmq_{name}_ended"))?,
            park_waiting_function: Identifier::new(&format!("pl_pgmq_{name}_park_waiting"))?,
            park_within_function: Identifier::new(&format!("pl_pgmq_{name}_park_within"))?,
            name,
            source,
            order,
        })
    }

    /// One statement part per level, joined by `separator`.
    pub(super) fn per_level(&self, separator: &str, part: impl Fn(&Level) -> String) -> String {
        self.levels
            .iter()
            .map(part)
            .collect::<Vec<_>>()
            .join(separator)
    }
}

/// A message's rank time, entry and task id, as the indexes have them.
pub(super) const RANK: &str = "((message->>'rank')::bigint)";
/// A message's deadline as the deadline order ranks it (none after every deadline), as its
/// index has it.
pub(super) const DUE: &str = "(COALESCE((message->>'deadline')::bigint, 9223372036854775807))";
pub(super) const ENTRY: &str = "((message->>'entry')::bigint)";
pub(super) const TASK: &str = "((message->>'task')::bigint)";
/// No node holds the message.
pub(super) const PARKED: &str = "(message->>'node' IS NULL)";

/// Whether a pgmq queue keeps dependencies between its tasks (see
/// [`PgQueue::with_dependencies`](crate::infra::postgres::PgQueue)).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Dependencies {
    /// Children may name parents; every ended task's registry row stays a minute.
    Kept,
    /// No task names parents; a registry row goes when its task ends (a caller kept unique
    /// stays its minute).
    Off,
}
