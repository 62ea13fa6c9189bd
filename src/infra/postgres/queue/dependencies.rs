//! Dependencies between the tasks of the Postgres table queue: a child parked with
//! [`SharedDependencies::enqueue_waiting`](crate::core::SharedDependencies::enqueue_waiting) waits in the
//! table until every parent (a task of its tenant in its queue, by task id) has succeeded,
//! wherever each ran.
//!
//! # Where they live
//!
//! - The child is an ordinary `parked` row whose `pending_parents` counts the parents not
//!   ended yet; while it is above 0 its `not_before_ms` is [`WAITING_FOR_PARENTS_MS`], so
//!   no claim takes it (a claim skips rows not due, as it skips a scheduled start), and a
//!   cancel removes it like any parked task. `after_parents_ms` keeps its own scheduled
//!   start (0: none), `runs_anyway` whether it runs when a parent does not succeed.
//! - One edge per (parent row, child row) in `<table>_parents`, keyed by the parent's row.
//!
//! # When a parent ends
//!
//! Every statement that ends a row (a settle, a dead letter, a rescue that gives up, a
//! cancel) passes the rows it ended to `<table>_ended` in the same statement, hence the same
//! transaction: a crash loses both or neither. For a parent that succeeded, the function
//! deletes its edges (one index range) and takes one from each child's count; a child whose
//! count reaches 0 gets its own `not_before_ms` back and a `NOTIFY` wakes the nodes: O(1)
//! work per parent and child, whatever the fan-in. For one that did not, its waiting
//! children end `cancelled` (with the reason in `last_error`, the parent's task id and how
//! it ended in `parent_task` and `parent_status`), and theirs in turn, round by
//! round until none is left, except those that run anyway, which count the parent as done.
//! A `cancelled` row is delivered once to its submitter's mailbox as `Cancelled` by the
//! dead-letter reader of any node (the `dead_letters` statement takes and deletes it).
//!
//! The function runs its queries on snapshots of their own (it is `VOLATILE`), taken after
//! the ending statement locked the parent rows: a child parked concurrently either locked
//! its parent first (`FOR SHARE`, so its edge is committed and seen) or found the parent
//! ended already.
//!
//! # Which parents are known
//!
//! A parent is found by (queue, tenant, task id) among the rows of the table: live
//! (`parked`, `claimed`), ended well within the last [`REMEMBER_ENDED_MS`] (every success
//! stays that long as a `done` row), ended otherwise within that minute (`done` with its
//! status), a dead letter (until an operator purges it) or a cancelled child not yet
//! delivered. A parent the table does not hold under the child's tenant is refused
//! (`UnknownParent`, or `OtherTenant` when another tenant has a task of that id), and so is
//! one that did not succeed unless the child runs anyway (`ParentEnded`).
//!
//! [`REMEMBER_ENDED_MS`]: crate::infra::postgres::codec::REMEMBER_ENDED_MS

use crate::infra::postgres::codec::PARK_RECORD;
use crate::infra::postgres::Identifier;

/// The `not_before_ms` of a child waiting for its parents: never due.
pub(crate) const WAITING_FOR_PARENTS_MS: i64 = i64::MAX;

/// The columns, the edge table and the functions dependencies need in queue table `t`
/// (`parked_columns`: the columns a park writes), after the table's own DDL; the index a
/// parent is found by comes with the first queue that keeps dependencies
/// ([`parents_index_ddl`]).
pub(crate) fn dependencies_ddl(t: &Identifier, parked_columns: &str) -> String {
    format!(
        r#"
ALTER TABLE {t} ADD COLUMN IF NOT EXISTS pending_parents INTEGER NOT NULL DEFAULT 0;
ALTER TABLE {t} ADD COLUMN IF NOT EXISTS runs_anyway BOOLEAN NOT NULL DEFAULT false;
ALTER TABLE {t} ADD COLUMN IF NOT EXISTS after_parents_ms BIGINT NOT NULL DEFAULT 0;
ALTER TABLE {t} ADD COLUMN IF NOT EXISTS ended_status TEXT NULL;
ALTER TABLE {t} ADD COLUMN IF NOT EXISTS parent_task BIGINT NULL;
ALTER TABLE {t} ADD COLUMN IF NOT EXISTS parent_status TEXT NULL;
CREATE TABLE IF NOT EXISTS {t}_parents (
    parent_id BIGINT NOT NULL,
    child_id  BIGINT NOT NULL,
    PRIMARY KEY (parent_id, child_id)
);
CREATE INDEX IF NOT EXISTS {t}_cancelled ON {t} (queue_name, id) WHERE state = 'cancelled';
{ended}
{park_waiting}
DROP INDEX IF EXISTS {t}_caller;
"#,
        ended = ended_function(t),
        park_waiting = park_waiting_function(t, parked_columns),
    )
}

/// The relation whose presence says queue table `t` has the dependencies' columns, edge
/// table and functions (every queue table has them: each settle calls `<t>_ended`): the edge
/// table, made in the same transaction as the rest, by every version that had any of them.
pub(crate) fn last_index(t: &Identifier) -> String {
    format!("{t}_parents")
}

/// The index the DDL drops: `_caller`, on `(queue_name, tenant, task_id)`, which tables made
/// before had for every queue. While it exists (an older node of the fleet made it again)
/// the table is not up to date, and the next node to open it drops it again.
///
/// Any full index whose columns include the queue's name was a way to the rows a settle or
/// a renewal names by `(queue_name, entry)`: under the statistics of a table where the
/// queue had no rows yet (a new queue of a shared table, one between bursts), the planner
/// walked it instead of the unique key, reading every row of the queue for each claim (3 ms
/// a claim, seconds a settle of 1,000). A table queue without dependencies has no such
/// index; one with them has [`parents_index_ddl`]'s, made when such a queue opens.
pub(crate) fn replaced_index(t: &Identifier) -> String {
    format!("{t}_caller")
}

/// The index a queue that keeps dependencies finds a parent by (its task id, then queue
/// and tenant), made when the first such queue of table `t` opens. It leads with the task
/// id, so that a settle's lookup by `(queue_name, entry)` can use it only as a full scan.
///
/// With it comes the index of the children waiting with a deadline, which each rescue
/// walks to expire those whose deadline passed (`expire_held`); it is made last, so a
/// table that has it is up to date.
///
/// That index names a held child by its `not_before_ms` ([`WAITING_FOR_PARENTS_MS`] while
/// it waits), not by `pending_parents`: a column in an index's predicate counts as indexed,
/// and an update that changes an indexed column cannot be a heap-only (HOT) update. Each
/// parent's settle takes one from its child's `pending_parents`: under an index that named
/// it, each of those updates wrote an entry into every index of the table (200 such
/// decrements of one row on PostgreSQL 15: none heap-only under a predicate on the counter,
/// 199 of 200 under one on `not_before_ms`). The first version's index (`_held_deadlines`,
/// whose predicate named the counter) is dropped.
pub(crate) fn parents_index_ddl(t: &Identifier) -> String {
    format!(
        "CREATE INDEX IF NOT EXISTS {t}_task_ids ON {t} (task_id, queue_name, tenant);
         DROP INDEX IF EXISTS {t}_held_deadlines;
         CREATE INDEX IF NOT EXISTS {t}_held_due ON {t} (queue_name, deadline_ms) \
           WHERE not_before_ms = {WAITING_FOR_PARENTS_MS} AND deadline_ms IS NOT NULL;"
    )
}

/// The name of the index [`parents_index_ddl`] makes last.
pub(crate) fn parents_index(t: &Identifier) -> String {
    format!("{t}_held_due")
}

/// The index [`parents_index_ddl`] drops, whose predicate named `pending_parents`.
pub(crate) fn replaced_parents_index(t: &Identifier) -> String {
    format!("{t}_held_deadlines")
}

/// `<t>_ended(queue, rows, task ids, succeeded, why, status)`: the rows (with their callers'
/// task ids, in the same order) ended, well or not (`why`: how, for the children's reason;
/// `status`: how, as a `TaskStatus` in JSON, for their events). Releases or cancels their
/// children (see the module docs); returns how many children became claimable.
///
/// A child it cancels keeps the parent's task id and status (`parent_task`,
/// `parent_status`) for the node that tells its submitter. The function of five arguments
/// that versions before called (without `status`) is made too, calling this one without a
/// status, so that a node of an earlier version settles on a table a later one made (its
/// cancelled children then name no parent status, and their events no `ParentFailed`).
fn ended_function(t: &Identifier) -> String {
    format!(
        r#"
CREATE OR REPLACE FUNCTION {t}_ended(queue text, parents bigint[], parent_tasks bigint[],
                                     succeeded boolean, why text, status text)
RETURNS bigint LANGUAGE plpgsql VOLATILE AS $fn$
#variable_conflict use_column
DECLARE
    woken bigint := 0;
    freed_now bigint;
    ending bigint[] := parents;
    ending_tasks bigint[] := parent_tasks;
    doomed_rows bigint[];
    doomed_tasks bigint[];
    how text := why;
    how_status text := status;
BEGIN
    IF parents IS NULL OR cardinality(parents) = 0 THEN
        RETURN 0;
    END IF;
    LOOP
        WITH cut AS (
                DELETE FROM {t}_parents AS e
                 USING unnest(ending, ending_tasks) AS p(id, task_id)
                 WHERE e.parent_id = p.id
                RETURNING e.child_id, p.task_id),
             doomed AS (
                UPDATE {t} AS c SET state = 'cancelled', pending_parents = 0,
                       locked_by = NULL, lease_expires_ms = NULL,
                       last_error = format('task %s it depends on %s', d.task_id, how),
                       parent_task = d.task_id, parent_status = how_status
                  FROM (SELECT DISTINCT ON (child_id) child_id, task_id FROM cut
                         ORDER BY child_id, task_id) AS d
                 WHERE NOT succeeded AND c.id = d.child_id AND c.state = 'parked'
                   AND c.pending_parents > 0 AND NOT c.runs_anyway
                RETURNING c.id, c.task_id),
             freed AS (
                UPDATE {t} AS c SET pending_parents = c.pending_parents - n.edges,
                       not_before_ms = CASE WHEN c.pending_parents = n.edges
                                            THEN c.after_parents_ms ELSE c.not_before_ms END
                  FROM (SELECT child_id, count(*) AS edges FROM cut GROUP BY child_id) AS n
                 WHERE (succeeded OR c.runs_anyway) AND c.id = n.child_id
                   AND c.state = 'parked' AND c.pending_parents > 0
                RETURNING c.pending_parents)
        SELECT f.n, d.ids, d.tasks INTO freed_now, doomed_rows, doomed_tasks
          FROM (SELECT count(*) AS n FROM freed WHERE pending_parents = 0) AS f,
               (SELECT array_agg(id ORDER BY id) AS ids, array_agg(task_id ORDER BY id) AS tasks
                  FROM doomed) AS d;
        woken := woken + freed_now;
        EXIT WHEN doomed_rows IS NULL;
        ending := doomed_rows;
        ending_tasks := doomed_tasks;
        how := 'was cancelled';
        how_status := '"Cancelled"';
    END LOOP;
    IF woken > 0 THEN
        PERFORM pg_notify('{t}.' || queue, '');
    END IF;
    RETURN woken;
END
$fn$;
CREATE OR REPLACE FUNCTION {t}_ended(queue text, parents bigint[], parent_tasks bigint[],
                                     succeeded boolean, why text)
RETURNS bigint LANGUAGE sql VOLATILE AS $fn$
    SELECT {t}_ended(queue, parents, parent_tasks, succeeded, why, NULL::text)
$fn$;
"#
    )
}

/// `<t>_park_waiting(queue, tenant, parents, runs anyway, own start, rows)`: resolves the
/// parents (in the order given; the first refused ends the call) and parks the one task of
/// `rows` (a [`ParkRows`](crate::infra::postgres::codec::ParkRows) array) waiting for the
/// live ones. Answers one row: `outcome` is `parked` (then `parent` holds how many parents
/// it waits for), `duplicate` (its entry or caller is stored already), `unknown`,
/// `other_tenant` or `ended` (then `parent` names the parent, and `status` says how it
/// ended, a `TaskStatus` in JSON).
fn park_waiting_function(t: &Identifier, parked_columns: &str) -> String {
    format!(
        r#"
CREATE OR REPLACE FUNCTION {t}_park_waiting(queue text, tenant_name text, parents bigint[],
                                            run_anyway boolean, after_ms bigint, rec jsonb)
RETURNS TABLE (outcome text, parent bigint, status text) LANGUAGE plpgsql VOLATILE AS $fn$
#variable_conflict use_column
DECLARE
    named bigint;
    hit record;
    live bigint[] := '{{}}';
    child bigint;
BEGIN
    FOREACH named IN ARRAY parents LOOP
        SELECT id, state, ended_status, last_error INTO hit FROM {t}
         WHERE queue_name = queue AND tenant = tenant_name AND task_id = named
           AND state IN ('parked', 'claimed', 'done', 'dead', 'cancelled')
         ORDER BY id DESC LIMIT 1 FOR SHARE;
        IF NOT FOUND THEN
            IF EXISTS (SELECT 1 FROM {t} WHERE queue_name = queue AND task_id = named
                          AND tenant <> tenant_name) THEN
                RETURN QUERY SELECT 'other_tenant'::text, named, NULL::text;
            ELSE
                RETURN QUERY SELECT 'unknown'::text, named, NULL::text;
            END IF;
            RETURN;
        END IF;
        IF hit.state IN ('parked', 'claimed') THEN
            live := live || hit.id;
        ELSIF hit.state = 'done' AND hit.ended_status IS NULL THEN
            CONTINUE;
        ELSIF NOT run_anyway THEN
            RETURN QUERY SELECT 'ended'::text, named, CASE hit.state
                WHEN 'dead' THEN jsonb_build_object('Failed', coalesce(hit.last_error, ''))::text
                WHEN 'cancelled' THEN '"Cancelled"'
                ELSE hit.ended_status END;
            RETURN;
        END IF;
    END LOOP;
    INSERT INTO {t} (queue_name, {parked_columns}, not_before_ms, pending_parents,
                     runs_anyway, after_parents_ms)
    SELECT queue, {parked_columns},
           CASE WHEN cardinality(live) > 0 THEN {WAITING_FOR_PARENTS_MS} ELSE after_ms END,
           cardinality(live), run_anyway, after_ms
      FROM jsonb_to_recordset(rec) AS r({PARK_RECORD})
    ON CONFLICT DO NOTHING RETURNING id INTO child;
    IF child IS NULL THEN
        RETURN QUERY SELECT 'duplicate'::text, NULL::bigint, NULL::text;
        RETURN;
    END IF;
    INSERT INTO {t}_parents (parent_id, child_id) SELECT DISTINCT unnest(live), child;
    IF cardinality(live) = 0 THEN
        PERFORM pg_notify('{t}.' || queue, '');
    END IF;
    RETURN QUERY SELECT 'parked'::text, cardinality(live)::bigint, NULL::text;
END
$fn$;
"#
    )
}

/// The call of `t`'s `_ended` function over the rows of CTE `rows` (columns `id` and
/// `task_id`), for a statement that ended them (`why`, in words; `status`, a `TaskStatus` in
/// JSON, both SQL text expressions): a CTE named `ended` of one row, for the statement's
/// `WITH` list, to join.
///
/// A CTE, not a subquery in the `FROM` list: a subquery joined there is run again for each
/// row of the other side of the join, which called the function (and aggregated every row
/// ended) once per row ended, a cost square in the rows one statement ends (a settle of
/// 1,000 claims took 300 ms instead of 13). A CTE that calls a volatile function runs once.
pub(crate) fn ended_rows(
    t: &Identifier,
    rows: &str,
    succeeded: bool,
    why: &str,
    status: &str,
) -> String {
    format!(
        "ended AS MATERIALIZED (SELECT {t}_ended($queue, array_agg(id ORDER BY id), \
             array_agg(task_id ORDER BY id), {succeeded}, {why}, {status}) AS woken FROM {rows})"
    )
}
