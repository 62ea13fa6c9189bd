//! The tables of the Postgres backends, created idempotently at start.
//!
//! `CREATE ... IF NOT EXISTS` alone is not safe when several processes start at once (two
//! concurrent creations of one table can both pass the check and one then fails on the
//! catalog's unique index), so the creation runs in one transaction holding a transaction-level
//! advisory lock: the processes take turns, and the later ones find everything in place.

use sea_orm::{DbErr, TransactionTrait};

use super::budgets::{budgets_table, BUDGETS_TABLE};
use super::claim::due_of;
use super::queue::bounded::{bounded_ddl, bounded_index};
use super::queue::dependencies::{
    dependencies_ddl, last_index, parents_index, parents_index_ddl, replaced_index,
    replaced_parents_index,
};
use super::queue::table::PARKED_COLUMNS;
use super::service::{service_tables, SERVICE_TABLE};
use super::shared_queue::{ticks_table, TICKS_TABLE};
use super::PgDatabase;
use crate::core::PoolError;

/// The advisory lock key every process of this crate takes while creating tables
/// (`hashtext('prometheus_parking_lot.schema')` would do as well; a constant is simpler to
/// find in `pg_locks`).
pub(crate) const SCHEMA_LOCK: i64 = 0x706c_5f73_6368_656d; // "pl_schem"

/// A table name checked to be a plain SQL identifier: a letter or `_`, then letters, digits
/// or `_`, at most 63 bytes. Only such names are spliced into statements.
///
/// ```
/// use prometheus_parking_lot::infra::postgres::Identifier;
///
/// assert_eq!(Identifier::new("pl_queue_jobs").unwrap().as_str(), "pl_queue_jobs");
/// assert!(Identifier::new("jobs; DROP TABLE users").is_err());
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Identifier(String);

impl Identifier {
    /// Checks `name`.
    pub fn new(name: &str) -> Result<Self, PoolError> {
        let mut chars = name.chars();
        let first_ok = chars
            .next()
            .is_some_and(|c| c.is_ascii_alphabetic() || c == '_');
        let rest_ok = chars.all(|c| c.is_ascii_alphanumeric() || c == '_');
        if first_ok && rest_ok && name.len() <= 63 {
            Ok(Self(name.to_owned()))
        } else {
            Err(PoolError::InvalidConfig(format!(
                "{name:?} is not a safe SQL identifier; use a letter or '_' followed by \
                 letters, digits or '_', at most 63 characters"
            )))
        }
    }

    /// The name.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Display for Identifier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// The queue table: the seed's columns plus what leases, retries and ranking need.
///
/// - `entry` is the engine's entry id (unique per queue), `rank_time_ms` its admission time;
///   with `priority` they are the rank (`ORDER BY priority DESC, rank_time_ms, entry`).
/// - `kind` and `units` are the task's cost, so a claim filters on what fits.
/// - `state` is `parked`, `claimed` or `dead`; a settled task's row is deleted. `reported`
///   says whether a dead task's submitter was told (a node stores a failure for it).
/// - Later versions add columns with `ALTER TABLE .. ADD COLUMN IF NOT EXISTS`, so a table
///   made by an earlier version is brought up to date in place.
/// - `attach` marks a row whose caller (`tenant`, `task_id`) is unique among the live rows
///   of its queue (`_live_caller`): a pool that attaches repeated submissions parks such
///   rows. Such a row that completes stays a minute as `done` (its lease column says until
///   when), so a resubmission racing with its end still meets it.
/// - `state` may then also be `done`: every run that ends leaves its row so for a minute
///   (its caller is known to children named after its end; `ended_status` says how it
///   ended when it did not succeed), or `cancelled`: a child whose parent did not succeed
///   (`parent_task` and `parent_status` say which and how), until a node delivers it (see
///   `queue/dependencies.rs`, which adds the dependencies' columns, edge table and
///   functions).
/// - `locked_by` / `lease_expires_ms` hold the lease; `attempts` counts claims;
///   `not_before_ms` delays a retried task (backoff) or a scheduled start (0: never
///   delayed); `last_error` says why it was retried or dead-lettered.
/// - A claim reads parked rows through two indexes, so that rows still asleep cost it
///   nothing: `_awake` holds the rows never delayed in rank order, and `_wakes` the delayed
///   ones by the instant they wake (a claim reads the part of it that is due, and ranks
///   those rows itself). A row that wakes becomes claimable without being written. Tables
///   made before lose their `_claim` index (all parked rows in rank order), which the two
///   replace.
/// - `traceparent` is the W3C trace context the task was parked in (`NULL`: none), handed to
///   whichever node claims it, so its spans go on in the submitter's trace.
fn queue_table(table: &Identifier) -> String {
    format!(
        r#"
CREATE TABLE IF NOT EXISTS {table} (
    id               BIGSERIAL PRIMARY KEY,
    queue_name       TEXT        NOT NULL,
    entry            BIGINT      NOT NULL,
    task_id          BIGINT      NOT NULL,
    tenant           TEXT        NOT NULL,
    user_id          TEXT        NULL,
    session_id       TEXT        NULL,
    priority         SMALLINT    NOT NULL,
    kind             SMALLINT    NOT NULL,
    units            BIGINT      NOT NULL,
    created_at       TIMESTAMPTZ NOT NULL DEFAULT NOW(),
    created_at_ms    BIGINT      NOT NULL,
    rank_time_ms     BIGINT      NOT NULL,
    deadline_ms      BIGINT      NULL,
    metadata         JSONB       NOT NULL,
    payload          JSONB       NOT NULL,
    state            TEXT        NOT NULL DEFAULT 'parked',
    locked_by        TEXT        NULL,
    locked_at        TIMESTAMPTZ NULL,
    lease_expires_ms BIGINT      NULL,
    attempts         INTEGER     NOT NULL DEFAULT 0,
    not_before_ms    BIGINT      NOT NULL DEFAULT 0,
    last_error       TEXT        NULL,
    UNIQUE (queue_name, entry)
);
CREATE INDEX IF NOT EXISTS {table}_lease
    ON {table} (queue_name, lease_expires_ms) WHERE state = 'claimed';
CREATE INDEX IF NOT EXISTS {table}_task
    ON {table} (queue_name, tenant, task_id) WHERE state = 'parked';
ALTER TABLE {table} ADD COLUMN IF NOT EXISTS reported BOOLEAN NOT NULL DEFAULT false;
CREATE INDEX IF NOT EXISTS {table}_dead
    ON {table} (queue_name, id) WHERE state = 'dead' AND NOT reported;
ALTER TABLE {table} ADD COLUMN IF NOT EXISTS attach BOOLEAN NOT NULL DEFAULT false;
CREATE UNIQUE INDEX IF NOT EXISTS {table}_live_caller
    ON {table} (queue_name, tenant, task_id) WHERE attach AND state IN ('parked', 'claimed', 'done');
CREATE INDEX IF NOT EXISTS {table}_done
    ON {table} (queue_name, lease_expires_ms) WHERE state = 'done';
CREATE INDEX IF NOT EXISTS {table}_awake
    ON {table} (queue_name, priority DESC, rank_time_ms, entry)
    WHERE state = 'parked' AND not_before_ms = 0;
CREATE INDEX IF NOT EXISTS {table}_wakes
    ON {table} (queue_name, not_before_ms) WHERE state = 'parked' AND not_before_ms > 0;
DROP INDEX IF EXISTS {table}_claim;
ALTER TABLE {table} ADD COLUMN IF NOT EXISTS traceparent TEXT NULL;
{dependencies}"#,
        dependencies = dependencies_ddl(table, PARKED_COLUMNS),
    )
}

/// The index of the queues of `table` that claim in the deadline order: the rows never
/// delayed, by priority, then deadline (none last), then admission, as `_awake` is by
/// priority then admission. Only a table with such a queue pays for it on every park.
fn deadline_index(table: &Identifier) -> String {
    format!(
        "CREATE INDEX IF NOT EXISTS {table}_awake_due \
            ON {table} (queue_name, priority DESC, ({due}), rank_time_ms, entry) \
            WHERE state = 'parked' AND not_before_ms = 0;",
        due = due_of("deadline_ms"),
    )
}

/// The mailbox table: the seed's columns plus the task's outcome and error text. `_lookup`
/// serves takes by key (oldest first), `_task` takes by task, `_stored` the retention purge.
fn mailbox_table(table: &Identifier) -> String {
    format!(
        r#"
CREATE TABLE IF NOT EXISTS {table} (
    id              BIGSERIAL PRIMARY KEY,
    tenant          TEXT        NOT NULL,
    user_id         TEXT        NULL,
    session_id      TEXT        NULL,
    task_id         BIGINT      NULL,
    created_at      TIMESTAMPTZ NOT NULL DEFAULT NOW(),
    created_at_ms   BIGINT      NOT NULL,
    status          TEXT        NOT NULL,
    error           JSONB       NULL,
    payload         JSONB       NULL
);
CREATE INDEX IF NOT EXISTS {table}_lookup
    ON {table} (tenant, user_id, session_id, created_at_ms);
CREATE INDEX IF NOT EXISTS {table}_stored
    ON {table} (created_at_ms);
CREATE INDEX IF NOT EXISTS {table}_task
    ON {table} (tenant, task_id);
"#
    )
}

/// Which tables to create.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Table<'a> {
    /// A queue table.
    Queue(&'a Identifier),
    /// The index a queue table's queues claimed in the deadline order walk (made after
    /// [`Table::Queue`]).
    DeadlineOrder(&'a Identifier),
    /// A mailbox table.
    Mailbox(&'a Identifier),
    /// The table of the budgets queues share ([`BUDGETS_TABLE`]).
    Budgets,
    /// The tables of the tenant counters queues share ([`SERVICE_TABLE`]).
    Service,
    /// The table of schedules' ticks queues share ([`TICKS_TABLE`]).
    Ticks,
    /// The index a queue table needs once one of its queues keeps dependencies.
    Dependencies(&'a Identifier),
    /// The index and function a queue table needs once one of its queues bounds its parked
    /// units (`queue/bounded.rs`).
    QueuedUnits(&'a Identifier),
}

impl PgDatabase {
    /// Creates `table` and its indexes unless they exist, under the schema lock. Safe to call
    /// from any number of processes at once, and again.
    ///
    /// A table that is up to date (its last index, created in the same transaction as the
    /// rest, exists) is left alone: its DDL would take the table's locks even when it changes
    /// nothing (`ADD COLUMN IF NOT EXISTS` takes an exclusive one), and a node starting
    /// while other nodes claim from the table could then deadlock with them.
    ///
    /// The DDL takes the table's exclusive locks, and may meet a node that writes to it in
    /// the other order (a table brought up to date while another node claims from it): the
    /// server then ends one of the two as a deadlock, and this runs again, a few times.
    pub(crate) async fn ensure(&self, table: Table<'_>) -> Result<(), DbErr> {
        const ATTEMPTS: u32 = 5;
        let mut attempt = 1;
        loop {
            match self.ensure_once(table).await {
                Err(error) if attempt < ATTEMPTS && super::database::is_deadlock(&error) => {
                    tracing::info!(
                        attempt,
                        "creating or updating a table met a deadlock; trying again"
                    );
                    tokio::time::sleep(std::time::Duration::from_millis(50 * u64::from(attempt)))
                        .await;
                    attempt += 1;
                }
                outcome => return outcome,
            }
        }
    }

    /// [`ensure`](Self::ensure), once.
    async fn ensure_once(&self, table: Table<'_>) -> Result<(), DbErr> {
        let (sql, last_made) = match table {
            Table::Queue(name) => (
                queue_table(name),
                LastMade::ColumnAndIndex {
                    table: name.as_str().to_owned(),
                    column: QUEUE_LAST_COLUMN,
                    index: last_index(name),
                    replaced: replaced_index(name),
                },
            ),
            Table::DeadlineOrder(name) => (
                deadline_index(name),
                LastMade::Relation(format!("{}_awake_due", name.as_str())),
            ),
            Table::Mailbox(name) => (
                mailbox_table(name),
                LastMade::Relation(format!("{}_task", name.as_str())),
            ),
            Table::Budgets => (
                budgets_table(),
                LastMade::Relation(BUDGETS_TABLE.to_owned()),
            ),
            Table::Service => (
                service_tables(),
                // The charges pending (`pending`) came last: a table without them is
                // brought up to date.
                LastMade::Column {
                    table: SERVICE_TABLE.to_owned(),
                    column: "pending",
                },
            ),
            Table::Ticks => (ticks_table(), LastMade::Relation(TICKS_TABLE.to_owned())),
            Table::QueuedUnits(name) => (
                bounded_ddl(name, PARKED_COLUMNS),
                LastMade::Relation(bounded_index(name)),
            ),
            Table::Dependencies(name) => (
                parents_index_ddl(name),
                LastMade::RelationInstead {
                    made: parents_index(name),
                    replaced: replaced_parents_index(name),
                },
            ),
        };
        self.run(move |connection| async move {
            use sea_orm::{ConnectionTrait, Statement};
            let transaction = connection.begin().await?;
            execute_batch_in(
                &transaction,
                &format!("SELECT pg_advisory_xact_lock({SCHEMA_LOCK})"),
            )
            .await?;
            let (question, values) = last_made.question();
            let up_to_date = transaction
                .query_one_raw(Statement::from_sql_and_values(
                    sea_orm::DatabaseBackend::Postgres,
                    question,
                    values,
                ))
                .await?
                .map(|row| row.try_get::<bool>("", "present"))
                .transpose()?
                .unwrap_or(false);
            if !up_to_date {
                execute_batch_in(&transaction, &sql).await?;
            }
            transaction.commit().await
        })
        .await
    }
}

/// The column of the queue table its DDL adds last (see [`queue_table`]; the dependencies'
/// DDL comes last).
pub(crate) const QUEUE_LAST_COLUMN: &str = "parent_status";

/// What a table's DDL makes last, in the transaction that makes the rest: once it exists,
/// the table is up to date and its DDL is not run again.
enum LastMade {
    /// An index or a table, by name.
    Relation(String),
    /// An index the DDL makes in place of one it drops: while the dropped one exists (an
    /// older node of the fleet made it again), the table is not up to date, and the next
    /// node to open it drops it again.
    RelationInstead { made: String, replaced: String },
    /// A column the DDL adds (by an `ALTER TABLE` for tables made before it).
    Column { table: String, column: &'static str },
    /// A column added by an `ALTER TABLE` and an index made by the same DDL, neither of
    /// which implies the other: a table made by a version that added only one of them is
    /// brought up to date. `replaced` is an index the DDL drops: while an older node of the
    /// fleet makes it again, the table is not up to date, and the next node to open it
    /// drops it again.
    ColumnAndIndex {
        table: String,
        column: &'static str,
        index: String,
        replaced: String,
    },
}

impl LastMade {
    /// The query whose `present` answers whether it exists, with its values.
    fn question(&self) -> (&'static str, Vec<sea_orm::Value>) {
        match self {
            Self::Relation(name) => (
                "SELECT to_regclass($1) IS NOT NULL AS present",
                vec![name.clone().into()],
            ),
            Self::RelationInstead { made, replaced } => (
                "SELECT to_regclass($1) IS NOT NULL AND to_regclass($2) IS NULL AS present",
                vec![made.clone().into(), replaced.clone().into()],
            ),
            Self::Column { table, column } => (
                "SELECT EXISTS (SELECT 1 FROM pg_attribute \
                   WHERE attrelid = to_regclass($1) AND attname = $2 AND NOT attisdropped) \
                   AS present",
                vec![table.clone().into(), (*column).into()],
            ),
            Self::ColumnAndIndex {
                table,
                column,
                index,
                replaced,
            } => (
                "SELECT to_regclass($3) IS NOT NULL AND to_regclass($4) IS NULL \
                   AND EXISTS (SELECT 1 FROM pg_attribute \
                   WHERE attrelid = to_regclass($1) AND attname = $2 AND NOT attisdropped) \
                   AS present",
                vec![
                    table.clone().into(),
                    (*column).into(),
                    index.clone().into(),
                    replaced.clone().into(),
                ],
            ),
        }
    }
}

async fn execute_batch_in(
    transaction: &sea_orm::DatabaseTransaction,
    sql: &str,
) -> Result<(), DbErr> {
    use sea_orm::ConnectionTrait;
    transaction.execute_unprepared(sql).await.map(drop)
}
