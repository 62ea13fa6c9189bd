//! A queue many nodes share, on [PGMQ](https://github.com/pgmq/pgmq): [`PgmqQueue`], a
//! [`SharedQueue`](crate::core::SharedQueue) through SeaORM (cargo feature `pgmq`), in the pgmq layout
//! ([`PgmqLayout`]). This file opens the queue; `statements.rs` writes the layout's
//! statements, and [`PgQueue`] runs them, the same for the table layout (see
//! `infra::postgres::shared_queue`).
//!
//! # Layout
//!
//! Table names are built from the checked queue name as [`Identifier`]s; the name itself,
//! wherever a statement compares with it, is a parameter (`$queue`).
//!
//! A configured `queue_name` `jobs` becomes five PGMQ queues: one per priority level,
//! `jobs_crit`, `jobs_high`, `jobs_norm` and `jobs_low`, and the dead-letter queue
//! `jobs_dlq`. Each task is one PGMQ message (a row of `pgmq.q_jobs_<level>`) whose JSON body
//! holds its rank (`rank`, `entry`), cost (`kind`, `units`), mailbox key (`tenant`, `user`,
//! `session`, `task`), metadata (`meta`) and payload (`payload`), and, while a node holds it,
//! the node's name (`node`). A small table `pl_pgmq_entries` keeps entry ids unique across
//! the levels. PGMQ comes from the server's extension, or is installed as plain SQL when the
//! server lacks it (see [`PgDatabase::install_pgmq`]).
//!
//! # Leases are visibility timeouts
//!
//! A claim sets the message's `vt` (PGMQ's visibility timeout) to the lease's expiry, adds 1
//! to `read_ct` (so `read_ct` is the attempt) and writes the node's name into the body;
//! renewing moves `vt`; completing the task archives the message (`pgmq.a_jobs_<level>`).
//! Times are the nodes' clocks, as in the Postgres table queue: `vt` is the expiry the node
//! computed, and a claim takes only messages whose `vt` is at or before its own now. A parked
//! message is visible from the Unix epoch on.
//!
//! A node that dies stops renewing; once `vt` has passed, any node's
//! [`rescue_expired`](crate::core::QueueMaintenance::rescue_expired) takes the node's name off
//! the message, so it is visible again, after an exponential backoff (`vt` moved to now +
//! backoff). A message
//! whose `read_ct` has reached `max_attempts` when its lease runs out goes instead to the
//! dead-letter queue, with the reason in its body (`reason`); so does a message whose task
//! cannot be read back, and a task that failed ([`Settlement::Failed`](crate::core::Settlement::Failed)) is archived in the
//! dead-letter queue's archive with its reason.
//! [`take_dead_letters`](crate::core::QueueMaintenance::take_dead_letters) archives the
//! dead-letter queue's messages as it reports them, so each is reported once.
//!
//! # Skip-ahead
//!
//! PGMQ's own `read` takes the oldest visible messages, optionally those whose body contains
//! a JSON value; it cannot ask for `units <= free`. So a claim is one statement on the queue
//! tables instead of `pgmq.read`, that does what `read` does (lock with `SKIP LOCKED`, set
//! `vt`, add to `read_ct`) to the messages it picks: from each level, the best-ranked visible
//! messages that fit the free units (an expression index on `(rank, entry)` of the parked
//! messages serves it in rank order), then across the levels the best-ranked of those whose
//! running cost fits. The answer is the same as the Postgres table queue's: the best-ranked
//! parked task that fits, over all levels, with the same rank bound and starvation rule.
//!
//! # Wake-ups
//!
//! Each park (one for a group of parks,
//! [`SharedQueue::enqueue_many`](crate::core::SharedQueue::enqueue_many)) and each rescue
//! sends `NOTIFY` on the channel `pgmq.<queue_name>`; a listener connection wakes the pools
//! of this process ([`SharedQueue::watch`](crate::core::SharedQueue::watch)).
//!
//! # Groups
//!
//! A group of parks is one statement: the entries are registered in `pl_pgmq_entries`, and
//! each entry not registered before has its message, built from its row (the same JSON row
//! the table layout parks), sent to its level's queue. A group of settlements that ended well
//! is one statement too, archiving every message the node holds among them (failures, rare,
//! go one by one to the dead-letter archive).

pub use super::layout::PgmqLayout;
use super::layout::{Dependencies, DUE, ENTRIES, ENTRY, LEVELS, PARKED, RANK, TASK};
use crate::core::{PoolError, QueueOrder};
use crate::infra::postgres::shared_queue::QueueLabel;
use crate::infra::postgres::{open_failed, Identifier, PgDatabase, PgQueue, PgmqSource};
#[cfg(test)]
use crate::util::serde::Priority;

/// The longest `queue_name`: PGMQ allows 47 characters, and the levels add up to 5.
pub const MAX_QUEUE_NAME: usize = 42;

/// A [`SharedQueue`](crate::core::SharedQueue) on PGMQ queues, one per priority level. See the module docs.
///
/// ```no_run
/// use std::sync::Arc;
/// use prometheus_parking_lot::infra::postgres::PgDatabase;
/// use prometheus_parking_lot::infra::queue::pgmq::PgmqQueue;
///
/// # fn main() -> Result<(), prometheus_parking_lot::PoolError> {
/// let database = PgDatabase::connect("postgres://postgres@127.0.0.1:5432/test")?;
/// let queue: Arc<PgmqQueue<String>> = Arc::new(PgmqQueue::open(&database, "llm")?);
/// # Ok(()) }
/// ```
pub type PgmqQueue<P> = PgQueue<PgmqLayout, P>;

/// Checks a configured queue name: an identifier of at most [`MAX_QUEUE_NAME`] characters.
pub fn check_queue_name(name: &str) -> Result<String, PoolError> {
    let name = Identifier::new(name)?;
    if name.as_str().len() > MAX_QUEUE_NAME {
        return Err(PoolError::InvalidConfig(format!(
            "{:?} is too long for a pgmq queue name: at most {MAX_QUEUE_NAME} characters (PGMQ \
             allows 47, and the priority levels add a suffix of up to 5)",
            name.as_str()
        )));
    }
    Ok(name.as_str().to_ascii_lowercase())
}

/// The PGMQ queue names of queue `name`: the levels, best first, then the dead-letter queue.
fn pgmq_queue_names(name: &str) -> Vec<String> {
    let mut names: Vec<String> = LEVELS
        .iter()
        .map(|(_, suffix)| format!("{name}_{suffix}"))
        .collect();
    names.push(format!("{name}_dlq"));
    names
}

impl<P> PgQueue<PgmqLayout, P> {
    /// Opens the PGMQ queues of `name` (installing PGMQ as plain SQL when the server lacks
    /// the extension, and creating the queues if needed; safe when many processes start at
    /// once) and starts listening for its wake-ups. Blocks until done: call it at start, not
    /// on a pool's runtime.
    pub fn open(database: &PgDatabase, name: &str) -> Result<Self, PoolError> {
        Self::open_in_order(database, name, QueueOrder::Fifo)
    }

    /// Opens queue `name` as [`open`](Self::open) does, claiming the messages of one level
    /// (a priority) in `order`: [`QueueOrder::Deadline`] takes the earliest deadline first,
    /// messages without one last, by admission among equals (it adds an index of each
    /// level's parked messages in that order, `q_<name>_<level>_pl_due`, the first time).
    /// Every node of the queue opens it in the same order: its pools'.
    ///
    /// ```no_run
    /// use prometheus_parking_lot::core::{QueueOrder, SharedQueue};
    /// use prometheus_parking_lot::infra::postgres::PgDatabase;
    /// use prometheus_parking_lot::infra::queue::pgmq::PgmqQueue;
    ///
    /// # fn main() -> Result<(), prometheus_parking_lot::PoolError> {
    /// let database = PgDatabase::connect("postgres://postgres@127.0.0.1:5432/test")?;
    /// let queue = PgmqQueue::<String>::open_in_order(&database, "chat", QueueOrder::Deadline)?;
    /// assert_eq!(queue.order(), QueueOrder::Deadline);
    /// # Ok(()) }
    /// ```
    pub fn open_in_order(
        database: &PgDatabase,
        name: &str,
        order: QueueOrder,
    ) -> Result<Self, PoolError> {
        let name = check_queue_name(name)?;
        let queues = pgmq_queue_names(&name)
            .iter()
            .map(|queue| Identifier::new(queue))
            .collect::<Result<Vec<_>, _>>()?;
        // The layout names every object; where PGMQ comes from is known once it is set up.
        let layout = PgmqLayout::new(name.clone(), PgmqSource::Extension, order)?;
        let objects = own_objects(&layout)?;
        let setup = {
            let database = database.clone();
            move |_| async move {
                let source = database.install_pgmq().await?;
                database.create_pgmq_queues(queues, objects).await?;
                Ok(source)
            }
        };
        let source = database
            .block_on(setup)
            .map_err(|error| open_failed("pgmq queue", "create its queues", &error))?;
        let layout = PgmqLayout { source, ..layout };
        let label = QueueLabel {
            backend: "postgres_pgmq",
            queue: name.clone(),
            place: format!("pgmq queues {name}_crit .. {name}_low, {name}_dlq"),
            pool: None,
        };
        let statements = layout.statements(Dependencies::Off);
        Ok(PgQueue::new(
            database,
            layout,
            statements,
            label,
            format!("pgmq.{name}"),
        ))
    }

    /// Keeps dependencies between the queue's tasks
    /// ([`SharedDependencies`](crate::core::SharedDependencies)): a task may name parents,
    /// and waits in its level until they succeeded; the entry registry keeps every ended
    /// task's row a minute, so that a child named after its parent's end finds how it ended
    /// (see `dependencies.rs`). Without it, a registry row goes when its task ends and a task
    /// that names parents is refused: the queue pays nothing for dependencies it does not
    /// use. Every node of a queue sets it alike.
    ///
    /// ```no_run
    /// use prometheus_parking_lot::core::SharedQueue;
    /// use prometheus_parking_lot::infra::postgres::PgDatabase;
    /// use prometheus_parking_lot::infra::queue::pgmq::PgmqQueue;
    ///
    /// # fn main() -> Result<(), prometheus_parking_lot::PoolError> {
    /// let database = PgDatabase::connect("postgres://postgres@127.0.0.1:5432/test")?;
    /// let queue = PgmqQueue::<String>::open(&database, "plans")?.with_dependencies();
    /// assert!(SharedQueue::<String>::dependencies(&queue).is_some());
    /// # Ok(()) }
    /// ```
    pub fn with_dependencies(mut self) -> Self {
        let statements = self.layout().statements(Dependencies::Kept);
        self.set_statements(statements);
        self
    }

    /// Whether PGMQ is the server's extension or the plain SQL objects.
    pub fn source(&self) -> PgmqSource {
        self.layout().source
    }

    /// The PGMQ queue names this queue uses: the levels, best first, then the dead-letter
    /// queue.
    pub fn pgmq_queues(&self) -> Vec<String> {
        pgmq_queue_names(&self.layout().name)
    }
}

/// The indexes, tables and functions this crate adds to a queue's PGMQ tables: the rank
/// order of parked messages, lookups by entry and by task, held messages by `vt` (rescues),
/// the entry registry, what dependencies need (`dependencies.rs`), and the park that keeps
/// a bound on the units parked (`bounded.rs`).
fn own_objects(layout: &PgmqLayout) -> Result<String, PoolError> {
    let (name, order) = (&layout.name, layout.order);
    // A registry made by an earlier version gains the caller columns once (a guarded
    // `ALTER`: an unguarded one would lock the busy table at every start).
    // A registry row of a caller kept unique names the caller (and the rest of its key);
    // once its task completed it
    // stays until `done_until` (ms), so a resubmission racing with the end still meets it.
    let mut sql = format!(
        "CREATE TABLE IF NOT EXISTS {ENTRIES} (queue_name TEXT NOT NULL, entry BIGINT NOT NULL, \
         tenant TEXT NULL, task_id BIGINT NULL, user_id TEXT NULL, session_id TEXT NULL, \
         done_until BIGINT NULL, PRIMARY KEY (queue_name, entry)); \
         DO $$ BEGIN \
           IF NOT EXISTS (SELECT 1 FROM information_schema.columns \
                           WHERE table_name = '{ENTRIES}' AND column_name = 'done_until') THEN \
             ALTER TABLE {ENTRIES} ADD COLUMN IF NOT EXISTS tenant TEXT NULL, \
               ADD COLUMN IF NOT EXISTS task_id BIGINT NULL, \
               ADD COLUMN IF NOT EXISTS user_id TEXT NULL, \
               ADD COLUMN IF NOT EXISTS session_id TEXT NULL, \
               ADD COLUMN IF NOT EXISTS done_until BIGINT NULL; \
           END IF; \
         END $$; \
         CREATE UNIQUE INDEX IF NOT EXISTS {ENTRIES}_caller ON {ENTRIES} \
           (queue_name, tenant, task_id) WHERE tenant IS NOT NULL;"
    );
    for (_, suffix) in LEVELS {
        let queue = format!("{name}_{suffix}");
        let table = Identifier::new(&format!("q_{queue}"))?;
        let index = |purpose: &str| Identifier::new(&format!("q_{queue}_pl_{purpose}"));
        let (rank, entry, task, held) = (
            index("rank")?,
            index("entry")?,
            index("task")?,
            index("held")?,
        );
        sql.push_str(&format!(
            "CREATE INDEX IF NOT EXISTS {rank} ON pgmq.{table} ({RANK}, {ENTRY}) WHERE {PARKED}; \
             CREATE INDEX IF NOT EXISTS {entry} ON pgmq.{table} ({ENTRY}); \
             CREATE INDEX IF NOT EXISTS {task} ON pgmq.{table} ({TASK}) WHERE {PARKED}; \
             CREATE INDEX IF NOT EXISTS {held} ON pgmq.{table} (vt) WHERE NOT {PARKED};"
        ));
        if order == QueueOrder::Deadline {
            let due = index("due")?;
            sql.push_str(&format!(
                "CREATE INDEX IF NOT EXISTS {due} ON pgmq.{table} ({DUE}, {RANK}, {ENTRY}) \
                 WHERE {PARKED};"
            ));
        }
    }
    sql.push_str(&super::dependencies::dependencies_ddl(layout));
    sql.push_str(&super::bounded::park_within_function(layout));
    Ok(sql)
}

#[cfg(test)]
fn level_of(priority: Priority) -> &'static str {
    let p = crate::infra::postgres::codec::priority_to_sql(priority);
    LEVELS
        .iter()
        .find(|(level, _)| *level == p)
        .map_or("low", |(_, suffix)| suffix)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::infra::postgres::probe::{self, run_sql};

    /// The pgmq claim under statistics of nearly empty level tables, as the table queue's
    /// test (`infra::postgres::queue`) has it: every level's rank index walked, no level
    /// table read whole, where the server's own plan reads them.
    #[test]
    fn a_claim_walks_each_levels_rank_index_under_statistics_of_nearly_empty_tables() {
        let database = probe::database();
        let name = format!("plan_probe_{}", std::process::id());
        let queue = PgmqQueue::<u64>::open(&database, &name).expect("open");
        let (plan, server_plan) = probe::runtime().block_on(async {
            let tables: Vec<String> = queue
                .layout()
                .levels
                .iter()
                .map(|level| format!("pgmq.{}", level.table))
                .collect();
            let plans =
                probe::claim_plans_under_stale_statistics(&database, &queue, &tables, TASK).await;
            for queue_name in queue.pgmq_queues() {
                run_sql(&database, format!("SELECT pgmq.drop_queue('{queue_name}')")).await;
            }
            let forget = format!("DELETE FROM {ENTRIES} WHERE queue_name = '{name}'");
            run_sql(&database, forget).await;
            plans
        });
        for (_, level) in LEVELS {
            let index = format!("Index Scan using q_{name}_{level}_pl_rank");
            assert!(
                plan.contains(&index),
                "level {level} walks its rank index:\n{plan}"
            );
            for whole_table in ["Seq Scan on", "Bitmap Heap Scan on"] {
                let read = format!("{whole_table} q_{name}_{level}");
                assert!(
                    !plan.contains(&read),
                    "level {level} is read whole:\n{plan}"
                );
            }
        }
        assert_ne!(
            plan, server_plan,
            "the server's own plan is the same:\n{server_plan}"
        );
    }

    #[test]
    fn queue_names_are_identifiers_of_at_most_42_characters_folded_to_lower_case() {
        assert_eq!(check_queue_name("LLM_jobs").unwrap(), "llm_jobs");
        assert_eq!(check_queue_name(&"q".repeat(42)).unwrap(), "q".repeat(42));
        let long = check_queue_name(&"q".repeat(43)).unwrap_err().to_string();
        assert!(
            long.contains("too long for a pgmq queue name: at most 42 characters"),
            "{long}"
        );
        let unsafe_name = check_queue_name("jobs; DROP TABLE x")
            .unwrap_err()
            .to_string();
        assert!(
            unsafe_name.contains("is not a safe SQL identifier"),
            "{unsafe_name}"
        );
    }

    #[test]
    fn every_priority_has_its_own_level() {
        let levels: Vec<&str> = [
            Priority::Critical,
            Priority::High,
            Priority::Normal,
            Priority::Low,
        ]
        .into_iter()
        .map(level_of)
        .collect();
        assert_eq!(levels, ["crit", "high", "norm", "low"]);
    }
}
