//! A queue in a PostgreSQL table that many nodes share: [`PostgresQueue`], a
//! [`SharedQueue`](crate::core::SharedQueue) through SeaORM, in the table layout
//! ([`TableLayout`]). This file writes the layout's statements; [`PgQueue`] runs them, the
//! same for the pgmq layout (see `infra::postgres::shared_queue`).
//!
//! # How nodes share it
//!
//! Every node (a process running pools, on any host) parks the tasks it cannot start to one
//! table, and claims from it whenever it has room: one statement picks the best-ranked parked
//! row whose cost fits the node's free units, locks it with `FOR UPDATE SKIP LOCKED` (so
//! concurrent claims never wait for or take the same row) and marks it claimed under the
//! node's lease:
//!
//! ```sql
//! WITH awake AS (
//!     SELECT id, .. FROM pl_queue_jobs
//!      WHERE queue_name = $queue AND state = 'parked' AND not_before_ms = 0
//!        AND units <= CASE kind WHEN 0 THEN $free_cpu WHEN 1 THEN $free_vram ... END
//!        AND <ranked at or ahead of the starvation bound, if any>
//!      ORDER BY priority DESC, rank_time_ms, entry
//!      LIMIT $max FOR UPDATE SKIP LOCKED),
//!   woken AS (<the same, for not_before_ms > 0 AND not_before_ms <= $now_ms>),
//!   pick AS (<the best $max of both, as far as their cost fits together>)
//! UPDATE pl_queue_jobs SET state = 'claimed', locked_by = $node, lease_expires_ms = ..,
//!        attempts = attempts + 1
//!   FROM pick WHERE pl_queue_jobs.id = pick.id RETURNING ..
//! ```
//!
//! Two partial indexes serve it: `_awake` on `(queue_name, priority DESC, rank_time_ms,
//! entry)` for the rows never delayed, walked in rank order (rows that do not fit are skipped
//! by the filter), and `_wakes` on `(queue_name, not_before_ms)` for the rows delayed once (a
//! scheduled start, a retry's backoff, a hand-back), read up to now and ranked by the
//! statement. A row that sleeps is in neither part a claim reads: 20,000 sleeping rows cost a
//! claim nothing, and a row whose instant comes is claimable as it is, without a write. The
//! rows of `_wakes` that are due are all read by each claim until they are claimed.
//!
//! A queue opened in the deadline order ([`PgQueue::open_in_order`]) ranks a priority's rows
//! by deadline first (none last): `ORDER BY priority DESC, COALESCE(deadline_ms, i64::MAX),
//! rank_time_ms, entry`, walked in `_awake_due`, an index of the same rows in that order
//! made when the first such queue of the table opens.
//!
//! # Leases, retries, dead letters
//!
//! The claiming node renews its lease while the task runs and ends the row when the task
//! ends ([`Settlement::Done`](crate::core::Settlement::Done), or
//! [`Ended`](crate::core::Settlement::Ended) for a run that did not succeed): it stays a
//! minute as `done`, so that a task naming it as a parent after its end finds how it ended
//! (`dependencies.rs`), then the rescue's `forget_done` deletes it. A node that dies stops
//! renewing; any node's [`rescue_expired`](crate::core::QueueMaintenance::rescue_expired) then
//! parks the row again, not before an exponential backoff (`retry_base * 2^(attempts - 1)`,
//! capped), with the reason in `last_error`. A row claimed `max_attempts` times whose lease runs out once more goes to the
//! `dead` state instead, and so does a row settled as failed and a row whose payload no longer
//! deserialises: dead rows stay in the table, with their last error, for an operator.
//!
//! # Wake-ups
//!
//! Each park (and each rescue) sends `NOTIFY` on the queue's channel; a listener connection
//! wakes the pools of this process ([`SharedQueue::watch`](crate::core::SharedQueue::watch)),
//! so an idle node claims new work at once and otherwise polls only slowly, as a safety net.

use crate::core::PoolError;
use crate::core::{QueueOrder, HELD_PAST_DEADLINE};
use crate::infra::postgres::claim::due_of;
use crate::infra::postgres::claim::{fits, not_behind_reserved, within_bound, RankSql, Units};
use crate::infra::postgres::codec::{
    priority_to_sql, DATABASE_NOW_MS, PARK_RECORD, REMEMBER_ENDED_MS,
};
use crate::infra::postgres::named::NamedSql;
use crate::infra::postgres::queue::dependencies::{ended_rows, WAITING_FOR_PARENTS_MS};
use crate::infra::postgres::service::pick_sql;
use crate::infra::postgres::shared_queue::{FairClaim, ParkWithin, QueueLabel, Statements};
use crate::infra::postgres::{
    lease_ran_out_sql, open_failed, retry_at_sql, Identifier, PgDatabase, PgQueue, Table, GIVEN_UP,
};
use crate::util::serde::Priority;

/// A [`SharedQueue`](crate::core::SharedQueue) in a PostgreSQL table. See the module docs.
///
/// ```no_run
/// use std::sync::Arc;
/// use prometheus_parking_lot::infra::postgres::PgDatabase;
/// use prometheus_parking_lot::infra::queue::postgres::PostgresQueue;
///
/// # fn main() -> Result<(), prometheus_parking_lot::PoolError> {
/// let database = PgDatabase::connect("postgres://postgres@127.0.0.1:5432/test")?;
/// let queue: Arc<PostgresQueue<String>> =
///     Arc::new(PostgresQueue::open(&database, "pl_queue_jobs", "llm")?.with_pool("llm"));
/// # Ok(()) }
/// ```
pub type PostgresQueue<P> = PgQueue<TableLayout, P>;

/// The table layout: every queue's tasks are rows of one table, told apart by `queue_name`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TableLayout {
    table: Identifier,
}

impl<P> PgQueue<TableLayout, P> {
    /// Opens queue `queue` in `table` (creating the table if needed; safe when many
    /// processes start at once) and starts listening for its wake-ups. Blocks until done:
    /// call it at start, not on a pool's runtime.
    pub fn open(database: &PgDatabase, table: &str, queue: &str) -> Result<Self, PoolError> {
        Self::open_in_order(database, table, queue, QueueOrder::Fifo)
    }

    /// Opens queue `queue` in `table` as [`open`](Self::open) does, claiming the tasks of one
    /// priority in `order`: [`QueueOrder::Deadline`] takes the earliest deadline first, tasks
    /// without one last, by admission among equals (it adds the index `<table>_awake_due`
    /// the first time). Every node of the queue opens it in the same order: its pools'.
    ///
    /// ```no_run
    /// use prometheus_parking_lot::core::QueueOrder;
    /// use prometheus_parking_lot::infra::postgres::PgDatabase;
    /// use prometheus_parking_lot::infra::queue::postgres::PostgresQueue;
    /// use prometheus_parking_lot::core::SharedQueue;
    ///
    /// # fn main() -> Result<(), prometheus_parking_lot::PoolError> {
    /// let database = PgDatabase::connect("postgres://postgres@127.0.0.1:5432/test")?;
    /// let queue = PostgresQueue::<String>::open_in_order(
    ///     &database,
    ///     "pl_queue_jobs",
    ///     "chat",
    ///     QueueOrder::Deadline,
    /// )?;
    /// assert_eq!(queue.order(), QueueOrder::Deadline);
    /// # Ok(()) }
    /// ```
    pub fn open_in_order(
        database: &PgDatabase,
        table: &str,
        queue: &str,
        order: QueueOrder,
    ) -> Result<Self, PoolError> {
        let table = Identifier::new(table)?;
        let ensure = {
            let (database, table) = (database.clone(), table.clone());
            move |_| async move {
                database.ensure(Table::Queue(&table)).await?;
                if order == QueueOrder::Deadline {
                    database.ensure(Table::DeadlineOrder(&table)).await?;
                }
                Ok(())
            }
        };
        database.block_on(ensure).map_err(|error| {
            open_failed(
                "postgres queue",
                &format!("create its table {table}"),
                &error,
            )
        })?;
        let label = QueueLabel {
            backend: "postgres",
            queue: queue.to_owned(),
            place: format!("table {table}"),
            pool: None,
        };
        let channel = format!("{table}.{queue}");
        let statements = statements(&table, order, Dependencies::Off);
        Ok(PgQueue::new(
            database,
            TableLayout { table },
            statements,
            label,
            channel,
        ))
    }

    /// The table the queue lives in.
    pub fn table(&self) -> &Identifier {
        &self.layout().table
    }

    /// Keeps dependencies between the queue's tasks (`"dependencies": true` in a config):
    /// a task may name parents (`SubmitOptions::with_depends_on`) and waits in the table
    /// until they succeed, and every run that ends stays a minute as a `done` row, so that
    /// a child named after its parent's end finds how it ended (see `dependencies.rs`). The
    /// first such queue of a table adds the index a parent is found by. Without it, a
    /// settled row is deleted at once (a row that keeps its caller unique excepted) and a
    /// task that names parents is refused: the queue pays nothing for dependencies it does
    /// not use. Every node of a queue sets it alike. Blocks until the index exists: call it
    /// at start, not on a pool's runtime.
    ///
    /// ```no_run
    /// use prometheus_parking_lot::core::SharedQueue;
    /// use prometheus_parking_lot::infra::postgres::PgDatabase;
    /// use prometheus_parking_lot::infra::queue::postgres::PostgresQueue;
    ///
    /// # fn main() -> Result<(), prometheus_parking_lot::PoolError> {
    /// let database = PgDatabase::connect("postgres://postgres@127.0.0.1:5432/test")?;
    /// let queue = PostgresQueue::<String>::open(&database, "pl_queue_jobs", "plans")?
    ///     .with_dependencies()?;
    /// assert!(SharedQueue::<String>::dependencies(&queue).is_some());
    /// # Ok(()) }
    /// ```
    pub fn with_dependencies(mut self) -> Result<Self, PoolError> {
        let table = self.layout().table.clone();
        let ensure = {
            let (database, table) = (self.database().clone(), table.clone());
            move |_| async move { database.ensure(Table::Dependencies(&table)).await }
        };
        self.database().block_on(ensure).map_err(|error| {
            open_failed(
                "postgres queue",
                &format!("index its table {table} for dependencies"),
                &error,
            )
        })?;
        let order = self.claim_order();
        self.set_statements(statements(&table, order, Dependencies::Kept));
        Ok(self)
    }
}

/// Whether a table queue keeps dependencies between its tasks (see
/// [`PgQueue::with_dependencies`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Dependencies {
    /// Children may name parents; ended rows stay a minute.
    Kept,
    /// No task names parents; ended rows go at once.
    Off,
}

/// The columns a park writes, in the order of [`PARK_RECORD`].
pub(crate) const PARKED_COLUMNS: &str =
    "entry, task_id, tenant, user_id, session_id, priority, kind, \
     units, created_at_ms, rank_time_ms, deadline_ms, metadata, payload, attach, traceparent";

/// The layout's statements on `t` (see `infra::postgres::shared_queue` for what each is given
/// and answers).
fn statements(t: &Identifier, order: QueueOrder, dependencies: Dependencies) -> Statements {
    let sql = |text: String| NamedSql::new(&text);
    // The claims a settle or release names, each an entry under one claim count: a claim
    // taken again since (by any node) has another count and is left alone.
    // Each claim is looked up by its (queue, entry) key, one row at a time (the `LIMIT`
    // keeps the lookup per claim; `IS TRUE` keeps the planner off the partial lease index,
    // which it would otherwise walk, dead entries and all, for every settle between two
    // vacuums).
    let these_claims = format!(
        "id IN (SELECT j.id FROM unnest($entries::bigint[], $attempts::integer[]) \
                 AS c(entry, attempts) \
               CROSS JOIN LATERAL (SELECT id FROM {t} WHERE queue_name = $queue \
                 AND entry = c.entry AND attempts = c.attempts \
                 AND (state = 'claimed') IS TRUE AND locked_by = $node LIMIT 1) j)"
    );
    // A cancel's removal ends the task's waiting children in the same statement.
    let removed_parked = |which: &str| {
        format!(
            "WITH gone AS (DELETE FROM {t} WHERE {which} \
                RETURNING id, task_id, metadata, payload), {ended} \
             SELECT g.metadata::text AS metadata, g.payload::text AS payload \
               FROM gone AS g CROSS JOIN ended",
            ended = ended_rows(t, "gone", false, "'was cancelled'", "'\"Cancelled\"'"),
        )
    };
    // A run that ends leaves its row a while as `done` (see `schema.rs`) where something may
    // still ask for it: its caller, for resubmissions (`attach`), and, on a queue that keeps
    // dependencies, children named after its end (`dependencies.rs`). Any other row goes at
    // once. `$status` says how it ended when it did not succeed. The parents' function runs
    // either way: a node of the queue that keeps dependencies may have parked children.
    let kept_rows = match dependencies {
        Dependencies::Kept => "true",
        Dependencies::Off => "attach",
    };
    let settle_as_done = |status: &str, succeeded: bool, why: &str| {
        format!(
            "WITH kept AS (UPDATE {t} SET state = 'done', locked_by = NULL, \
                 lease_expires_ms = {DATABASE_NOW_MS} + {REMEMBER_ENDED_MS}, \
                 ended_status = {status} \
               WHERE {these_claims} AND {kept_rows} RETURNING id, task_id, entry), \
             gone AS (DELETE FROM {t} WHERE {these_claims} AND NOT {kept_rows} \
               RETURNING id, task_id, entry), \
             done AS (SELECT * FROM kept UNION ALL SELECT * FROM gone), {ended} \
             SELECT d.entry FROM done AS d CROSS JOIN ended",
            ended = ended_rows(t, "done", succeeded, why, status),
        )
    };
    let kept = dependencies == Dependencies::Kept;
    Statements {
        order,
        park: sql(format!(
            "INSERT INTO {t} (queue_name, {PARKED_COLUMNS}, not_before_ms) \
             SELECT $queue, {PARKED_COLUMNS}, COALESCE(not_before_ms, 0) \
               FROM jsonb_to_recordset($rows::jsonb) AS r({PARK_RECORD}) \
             ON CONFLICT DO NOTHING RETURNING entry"
        )),
        park_claimed: sql(format!(
            "INSERT INTO {t} (queue_name, {PARKED_COLUMNS}, state, locked_by, locked_at, \
                 lease_expires_ms, attempts) \
             SELECT $queue, {PARKED_COLUMNS}, 'claimed', $node, NOW(), $expires_ms, 1 \
               FROM jsonb_to_recordset($rows::jsonb) AS r({PARK_RECORD}) \
             ON CONFLICT DO NOTHING RETURNING entry"
        )),
        claim: sql(claim_sql(t, false, order)),
        // One statement for all of a node's leases, each looked up by its key as a settle
        // looks up its claims (walking the partial lease index instead read every claimed
        // row of the queue for each entry: a pass cost the square of the claims held). A
        // row another transaction holds (a settle or a rescue under way) is skipped, not
        // waited for: a renewal that waited held the rows it had renewed meanwhile, and the
        // settles queued behind it. It is answered as held, and renewed at the next pass if
        // it is still this node's then.
        renew: sql(format!(
            "WITH mine AS (SELECT j.id, j.entry FROM unnest($entries::bigint[]) AS c(entry) \
               CROSS JOIN LATERAL (SELECT id, entry FROM {t} WHERE queue_name = $queue \
                 AND entry = c.entry AND (state = 'claimed') IS TRUE AND locked_by = $node \
                 LIMIT 1) j), \
             free AS (SELECT f.id FROM mine CROSS JOIN LATERAL (SELECT id FROM {t} \
                 WHERE id = mine.id AND (state = 'claimed') IS TRUE AND locked_by = $node \
                 FOR NO KEY UPDATE SKIP LOCKED) f), \
             renewed AS (UPDATE {t} SET lease_expires_ms = $expires_ms \
                 WHERE id = ANY (ARRAY(SELECT id FROM free)) RETURNING 1) \
             SELECT entry FROM mine"
        )),
        settle_done: sql(settle_as_done("NULL", true, "NULL")),
        settle_ended: sql(settle_as_done("$status", false, "$why")),
        settle_failed: sql(format!(
            "WITH dead AS (UPDATE {t} SET state = 'dead', locked_by = NULL, \
                 lease_expires_ms = NULL, last_error = $reason, reported = true \
               WHERE {these_claims} RETURNING id, task_id, entry), {ended} \
             SELECT d.entry FROM dead AS d CROSS JOIN ended",
            ended = ended_rows(
                t,
                "dead",
                false,
                "'failed: ' || $reason",
                "jsonb_build_object('Failed', $reason)::text",
            ),
        )),
        release: sql(format!(
            "UPDATE {t} SET state = 'parked', locked_by = NULL, lease_expires_ms = NULL, \
                attempts = GREATEST(attempts - 1, 0), not_before_ms = $now_ms \
              WHERE {these_claims} RETURNING entry"
        )),
        retry: sql(format!(
            "UPDATE {t} SET state = 'parked', locked_by = NULL, lease_expires_ms = NULL, \
                not_before_ms = $at_ms, last_error = $reason \
              WHERE {these_claims} RETURNING entry"
        )),
        remove: sql(removed_parked(
            "queue_name = $queue AND entry = $entry AND state = 'parked'",
        )),
        // On the `_task` index, as a cancel.
        sleeping: sql(format!(
            "SELECT min(not_before_ms) AS until_ms FROM {t} \
              WHERE queue_name = $queue AND tenant = $tenant AND task_id = $task_id \
                AND state = 'parked' AND user_id IS NOT DISTINCT FROM $user_id \
                AND session_id IS NOT DISTINCT FROM $session_id AND not_before_ms > $now_ms \
             HAVING count(*) > 0"
        )),
        live_task: sql(format!(
            "SELECT tenant, user_id, session_id FROM {t} \
              WHERE queue_name = $queue AND tenant = $tenant AND task_id = $task_id \
                AND attach AND state IN ('parked', 'claimed', 'done') LIMIT 1"
        )),
        remove_task: sql(removed_parked(&format!(
            "id = (SELECT id FROM {t} \
                 WHERE queue_name = $queue AND tenant = $tenant AND task_id = $task_id \
                   AND state = 'parked' AND user_id IS NOT DISTINCT FROM $user_id \
                   AND session_id IS NOT DISTINCT FROM $session_id \
                 ORDER BY id LIMIT 1 FOR UPDATE SKIP LOCKED)"
        ))),
        waiting_parents: kept.then(|| {
            sql(format!(
                "SELECT pending_parents FROM {t} \
              WHERE queue_name = $queue AND tenant = $tenant AND task_id = $task_id \
                AND state = 'parked' AND pending_parents > 0 \
                AND user_id IS NOT DISTINCT FROM $user_id \
                AND session_id IS NOT DISTINCT FROM $session_id LIMIT 1"
            ))
        }),
        // A child whose deadline passed while it waited ends as a cancelled row whose status
        // says `Expired` (the dead-letter reader tells its submitter so), in the statement
        // that ends its own children (see `dependencies.rs`).
        expire_held: kept.then(|| {
            sql(format!(
                "WITH expired AS (UPDATE {t} SET state = 'cancelled', pending_parents = 0, \
                     ended_status = '\"Expired\"', last_error = '{HELD_PAST_DEADLINE}' \
                   WHERE queue_name = $queue AND state = 'parked' AND pending_parents > 0 \
                     AND not_before_ms = {WAITING_FOR_PARENTS_MS} \
                     AND deadline_ms IS NOT NULL AND deadline_ms <= $now_ms \
                   RETURNING id, task_id), {ended} \
                 SELECT count(*) AS n FROM expired CROSS JOIN ended",
                ended = ended_rows(
                    t,
                    "expired",
                    false,
                    "'expired before it could start'",
                    "'\"Expired\"'",
                ),
            ))
        }),
        park_within: Some(ParkWithin {
            table: Some(t.clone()),
            park: sql(format!(
                "SELECT entry, outcome FROM {t}_park_within($queue, $rows::jsonb, $max_units, \
                 $now_ms, $by_deadline, $status, $why)"
            )),
        }),
        park_waiting: kept.then(|| {
            sql(format!(
                "SELECT outcome, parent, status FROM {t}_park_waiting($queue, $tenant, \
                 $parents::bigint[], $run_anyway, $after_ms, $rows::jsonb)"
            ))
        }),
        rescue: sql(format!(
            "WITH rescued AS ( \
               UPDATE {t} SET \
                   state = CASE WHEN attempts >= $max_attempts THEN 'dead' ELSE 'parked' END, \
                   last_error = {reason}, not_before_ms = {retry_at}, \
                   locked_by = NULL, lease_expires_ms = NULL \
                WHERE queue_name = $queue AND state = 'claimed' AND lease_expires_ms <= $now_ms \
                RETURNING id, task_id, state), \
             given_up AS (SELECT id, task_id FROM rescued WHERE state = 'dead'), {ended} \
             SELECT count(*) FILTER (WHERE state = 'parked') AS parked, \
                    count(*) FILTER (WHERE state = 'dead') AS dead \
               FROM rescued CROSS JOIN ended \
             HAVING count(*) > 0",
            ended = ended_rows(t, "given_up", false, GIVEN_UP.0, GIVEN_UP.1,),
            reason = lease_ran_out_sql("locked_by", "attempts"),
            retry_at = retry_at_sql("attempts"),
        )),
        counts: sql(format!(
            "SELECT count(*) FILTER (WHERE state = 'parked') AS parked, \
                    count(*) FILTER (WHERE state = 'claimed') AS claimed \
               FROM {t} WHERE queue_name = $queue"
        )),
        // The dead letters not reported yet, and the children their parents cancelled (see
        // `dependencies.rs`), whose rows go once taken: at most `$max` of each.
        dead_letters: sql(format!(
            "WITH dead AS (UPDATE {t} SET reported = true WHERE id IN ( \
                SELECT id FROM {t} WHERE queue_name = $queue AND state = 'dead' AND NOT reported \
                 ORDER BY id LIMIT $max FOR UPDATE SKIP LOCKED) \
               RETURNING tenant, user_id, session_id, task_id, kind, units, \
                         last_error AS reason, false AS cancelled, NULL::text AS ended, \
                         NULL::bigint AS parent_task, NULL::text AS parent_status), \
             cancelled AS (DELETE FROM {t} WHERE id IN ( \
                SELECT id FROM {t} WHERE queue_name = $queue AND state = 'cancelled' \
                 ORDER BY id LIMIT $max FOR UPDATE SKIP LOCKED) \
               RETURNING tenant, user_id, session_id, task_id, kind, units, \
                         last_error AS reason, true AS cancelled, ended_status AS ended, \
                         parent_task, parent_status) \
             SELECT * FROM dead UNION ALL SELECT * FROM cancelled"
        )),
        bury: sql(format!(
            "WITH dead AS (UPDATE {t} SET state = 'dead', locked_by = NULL, \
                 lease_expires_ms = NULL, last_error = $reason WHERE id = $row_id \
               RETURNING id, task_id), {ended} \
             SELECT d.id FROM dead AS d CROSS JOIN ended",
            ended = ended_rows(
                t,
                "dead",
                false,
                "'could not be read'",
                "jsonb_build_object('Failed', $reason)::text",
            ),
        )),
        forget_done: sql(format!(
            "DELETE FROM {t} WHERE queue_name = $queue AND state = 'done' \
                AND lease_expires_ms <= $now_ms"
        )),
        list_dead: sql(format!(
            "SELECT entry, attempts, metadata::text AS metadata, \
                    coalesce(last_error, '') AS reason FROM {t} \
              WHERE queue_name = $queue AND state = 'dead' \
              ORDER BY id LIMIT $limit OFFSET $offset"
        )),
        retry_dead: sql(format!(
            "UPDATE {t} SET state = 'parked', attempts = 0, not_before_ms = 0, \
                locked_by = NULL, lease_expires_ms = NULL, last_error = NULL, reported = false \
              WHERE queue_name = $queue AND entry = $entry AND state = 'dead' RETURNING entry"
        )),
        purge_dead: sql(format!(
            "WITH gone AS (DELETE FROM {t} WHERE queue_name = $queue AND state = 'dead' \
                AND ($entry::bigint IS NULL OR entry = $entry) RETURNING 1) \
             SELECT count(*) AS n FROM gone"
        )),
        fair: Some(fair_claim(t, order)),
    }
}

/// The parked rows a claim may read, as two arms each served by its own index (see
/// `schema.rs`): `awake`, the rows never delayed (`_awake`, in rank order), and `woken`, the
/// delayed rows whose instant has come (`_wakes`, read from its start up to `$now_ms`). A
/// row still asleep is in neither, so a claim reads none of them however many wait.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Arm {
    Awake,
    Woken,
}

impl Arm {
    /// The condition on `not_before_ms` that selects the arm's rows due by `due` (a
    /// parameter).
    fn due(self, due: &str) -> String {
        match self {
            Self::Awake => "not_before_ms = 0".to_owned(),
            Self::Woken => format!("not_before_ms > 0 AND not_before_ms <= {due}"),
        }
    }
}

/// The claim statement: in each [`Arm`], the best `$max` parked rows that fit one by one are
/// locked (`SKIP LOCKED`); of the best `$max` of both, the rank-order prefix whose running
/// cost per kind stays within the free units is claimed, best-ranked first. Under the
/// deadline order a priority's rows rank by their deadline first ([`due_of`]), read in the
/// `_awake_due` index.
fn claim_sql(t: &Identifier, one_tenant: bool, order: QueueOrder) -> String {
    // `reserved` probes each priority level's oldest aged task on its own: one descent of
    // `_awake` per level. Asked in one scan ordered by priority, the time bound is no index
    // condition, and a queue with nothing aged would be read to its end on every claim. Rows
    // delayed once are read by their instant, up to the aging bound, and ranked here. Under
    // the deadline order too the reserved task is the oldest aged one (the one that waited
    // longest), found the same way; what may be claimed ahead of it is ranked by deadline.
    // (The aged task due first would need a walk of `_awake_due` past every row due before
    // it, aged or not: the whole queue when none has aged.)
    let levels = Priority::ALL
        .map(|priority| format!("({}::smallint)", priority_to_sql(priority)))
        .join(", ");
    let by_deadline = order == QueueOrder::Deadline;
    // The rank within a priority: of a row of the table, and of the statement's own rows
    // (which carry the deadline as `due`).
    let (due, c_due) = (due_of("deadline_ms"), due_of("c.deadline_ms"));
    let (row_rank, rank) = if by_deadline {
        (
            format!("{due}, rank_time_ms, entry"),
            "priority DESC, due, rank_time_ms, entry",
        )
    } else {
        (
            "rank_time_ms, entry".to_owned(),
            "priority DESC, rank_time_ms, entry",
        )
    };
    let due_column = |deadline_ms: &str| {
        if by_deadline {
            format!(", {} AS due", due_of(deadline_ms))
        } else {
            String::new()
        }
    };
    // A candidate `c`'s rank (unqualified outside the `reserved` subquery).
    let (row, c_row) = (
        RankSql {
            due: by_deadline.then_some(due.as_str()),
            time: "rank_time_ms",
            entry: "entry",
        },
        RankSql {
            due: by_deadline.then_some(c_due.as_str()),
            time: "c.rank_time_ms",
            entry: "c.entry",
        },
    );
    let candidates = |arm: Arm| {
        format!(
            "SELECT id, kind, units, priority, rank_time_ms, entry{due} FROM {t} AS c \
              WHERE queue_name = $queue AND state = 'parked' AND {due_now} \
                AND units <= {free} AND {bounded} AND {not_behind}{tenant} \
              ORDER BY priority DESC, {row_rank} LIMIT $max FOR UPDATE SKIP LOCKED",
            due = due_column("deadline_ms"),
            due_now = arm.due("$now_ms"),
            free = fits("kind", Units::Free),
            bounded = within_bound("priority", &row),
            not_behind = not_behind_reserved("c.priority", &c_row),
            tenant = if one_tenant {
                " AND c.tenant = $tenant"
            } else {
                ""
            },
        )
    };
    format!(
        "WITH reserved AS MATERIALIZED ( \
           SELECT * FROM ( \
             SELECT r.* FROM (VALUES {levels}) AS level(priority) \
             CROSS JOIN LATERAL ( \
               SELECT priority, rank_time_ms AS rank, entry, kind, units{due} FROM {t} \
                WHERE queue_name = $queue AND state = 'parked' AND {awake} \
                  AND priority = level.priority AND rank_time_ms <= $aged_before \
                  AND units <= {whole} \
                ORDER BY rank_time_ms, entry LIMIT 1) AS r \
             UNION ALL \
             (SELECT priority, rank_time_ms AS rank, entry, kind, units{due} FROM {t} \
               WHERE queue_name = $queue AND state = 'parked' AND {woken} \
                 AND rank_time_ms <= $aged_before AND units <= {whole} \
               ORDER BY priority DESC, rank_time_ms, entry LIMIT 1)) AS aged \
           ORDER BY priority DESC, rank, entry LIMIT 1), \
         awake AS ({awake_rows}), \
         woken AS ({woken_rows}), \
         candidates AS ( \
           SELECT * FROM awake UNION ALL SELECT * FROM woken ORDER BY {rank} LIMIT $max), \
         running AS ( \
           SELECT id, kind, sum(units) OVER (PARTITION BY kind ORDER BY {rank}) AS held \
           FROM candidates), \
         pick AS (SELECT id FROM running WHERE held <= {free}), \
         claimed AS ( \
           UPDATE {t} AS job SET state = 'claimed', locked_by = $node, locked_at = NOW(), \
                  lease_expires_ms = $expires_ms, attempts = job.attempts + 1 \
             FROM pick WHERE job.id = pick.id \
           RETURNING job.id, job.entry, job.attempts, job.priority, job.rank_time_ms, \
                     job.metadata, job.payload, job.traceparent{job_due}) \
         SELECT id AS row_id, 0::smallint AS level, entry, attempts AS attempt, \
                metadata::text AS metadata, payload::text AS payload, traceparent \
           FROM claimed ORDER BY {rank}",
        due = due_column("deadline_ms"),
        job_due = due_column("job.deadline_ms"),
        awake = Arm::Awake.due("$aged_before"),
        woken = Arm::Woken.due("$aged_before"),
        awake_rows = candidates(Arm::Awake),
        woken_rows = candidates(Arm::Woken),
        whole = fits("kind", Units::Whole),
        free = fits("kind", Units::Free),
    )
}

/// The claim under a fair share by use across the fleet: the pick over the parked rows the
/// node could take (due, in either [`Arm`]), and the claim restricted to the tenant picked.
fn fair_claim(t: &Identifier, order: QueueOrder) -> FairClaim {
    let arm = |arm: Arm| {
        format!(
            "SELECT tenant, priority, units FROM {t} \
              WHERE queue_name = $queue AND state = 'parked' AND {due} AND units <= {free}",
            due = arm.due("$now_ms"),
            free = fits("kind", Units::Free),
        )
    };
    let rows = format!(
        "({} UNION ALL {}) AS parked",
        arm(Arm::Awake),
        arm(Arm::Woken)
    );
    FairClaim {
        pick: NamedSql::new(&pick_sql(&rows)),
        claim: NamedSql::new(&claim_sql(t, true, order)),
    }
}
