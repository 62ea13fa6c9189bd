//! Dependencies between the tasks of a pgmq queue: a child parked with
//! [`SharedDependencies::enqueue_waiting`](crate::core::SharedDependencies::enqueue_waiting)
//! waits in its level's PGMQ queue until every parent (a task of its tenant in the same
//! queue, by task id) has succeeded, wherever each ran. Every pgmq queue keeps them: what
//! they cost a queue whose tasks name no parents is one registry row kept a minute after
//! each task ends, and one index probe per settle.
//!
//! # Where they live
//!
//! - The entry registry (`pl_pgmq_entries`) names every task's owner (`owner`, its tenant,
//!   and `owner_task`, its task id), and keeps the row for [`REMEMBER_ENDED_MS`] after the
//!   task ended (`done_until`), with how it ended when it did not succeed (`ended_status`,
//!   a `TaskStatus` in JSON). A parent is found there.
//! - A child waiting for its parents is an ordinary message of its level whose visibility
//!   time is `infinity` ([`HELD`]): no claim reads it, no rescue touches it (no node holds
//!   it), and a cancel removes it like any parked message. Its body counts the parents not
//!   ended yet (`pending`), and keeps its own scheduled start (`after`, ms; 0: none) and
//!   whether it runs when a parent does not succeed (`anyway`).
//! - One edge per (parent entry, child entry) in `pl_pgmq_edges`.
//!
//! # When a parent ends
//!
//! Every statement that ends a message (a settle, a rescue that gives up, a burial, a
//! cancel, an expiry) marks its registry row and passes the rows it marked to the queue's
//! `pl_pgmq_<queue>_ended` function in the same statement, hence the same transaction: a
//! crash loses both or neither. For a parent that succeeded, the function deletes its edges
//! and takes one from each child's `pending`; a child whose count reaches 0 gets its own
//! scheduled start as its visibility time, and a `NOTIFY` wakes the nodes. For one that did
//! not, its waiting children move to the dead-letter queue marked `cancelled` (with the
//! parent's task id and status), and theirs in turn, round by round, except those that run
//! anyway, which count the parent as done. Any node's dead-letter reader tells the
//! submitter of a cancelled child `Cancelled` (or `Expired`), and does not archive it: it
//! is no dead letter for an operator.
//!
//! The ending statement updates the parent's registry row before the function runs (the
//! function reads what that update returned), and a child being parked holds its parents'
//! rows `FOR SHARE`: either the child's edge is committed before the parent's end reads the
//! edges, or the child finds the parent ended.
//!
//! [`REMEMBER_ENDED_MS`]: crate::infra::postgres::codec::REMEMBER_ENDED_MS

use super::layout::{Dependencies, PgmqLayout, ENTRIES, ENTRY, PARKED, TASK};
use super::parts::{at_ms, register_one, send_one, MESSAGE};
use crate::core::HELD_PAST_DEADLINE;
use crate::infra::postgres::codec::{DATABASE_NOW_MS, REMEMBER_ENDED_MS};

/// The edges between parents and children, over every pgmq queue of the database.
pub(super) const EDGES: &str = "pl_pgmq_edges";

/// The visibility time of a child waiting for its parents: never.
pub(super) const HELD: &str = "'infinity'::timestamptz";

/// What a held child's body carries while it waits, taken off when it is released.
pub(super) const HELD_KEYS: &str = "- 'pending' - 'after' - 'anyway'";

/// How the messages a statement ends ended, for the registry and for their children.
#[derive(Debug, Clone, Copy)]
pub(super) struct Ending<'a> {
    /// Whether the children count them as done.
    succeeded: bool,
    /// Whether the registry keeps their callers (a resubmission attaches to a task that
    /// ended this way, as to one that succeeded).
    keeps_caller: bool,
    /// How, a `TaskStatus` in JSON (a SQL text expression; `NULL` for a success).
    status: &'a str,
    /// How, in words, for the reason their cancelled children carry (a SQL text expression).
    why: &'a str,
}

impl<'a> Ending<'a> {
    /// Runs that succeeded.
    pub(super) const DONE: Ending<'static> = Ending {
        succeeded: true,
        keeps_caller: true,
        status: "NULL",
        why: "NULL",
    };

    /// Runs that ended neither well nor failed (`$status`, `$why`).
    pub(super) const ENDED: Ending<'static> = Ending {
        succeeded: false,
        keeps_caller: true,
        status: "$status",
        why: "$why",
    };

    /// Parked tasks cancelled.
    pub(super) const CANCELLED: Ending<'static> = Ending {
        succeeded: false,
        keeps_caller: false,
        status: "'\"Cancelled\"'",
        why: "'was cancelled'",
    };

    /// Held children whose deadline passed.
    pub(super) const EXPIRED: Ending<'static> = Ending {
        succeeded: false,
        keeps_caller: false,
        status: "'\"Expired\"'",
        why: "'expired before it could start'",
    };

    /// Tasks that failed `status` (JSON text) for `why` (words), both SQL text expressions.
    pub(super) fn failed(status: &'a str, why: &'a str) -> Self {
        Self {
            succeeded: false,
            keeps_caller: false,
            status,
            why,
        }
    }
}

/// The CTEs for a statement that ended the messages of CTE `gone` (a `message` column)
/// `ending`, ending in `ended`, one row, the call of the queue's `_ended` function over
/// them, which the statement must read (a CTE that only selects runs when read). Where
/// dependencies are kept, their registry rows are marked ended (`registered`), and the
/// function reads what that update returned; where they are not, the rows go (a caller
/// kept unique stays its minute after a run that ended well or was ended), and the function
/// still runs, for the children a node that keeps them may have parked.
pub(super) fn ended_ctes(
    layout: &PgmqLayout,
    gone: &str,
    ending: Ending<'_>,
    dependencies: Dependencies,
) -> String {
    let Ending {
        succeeded,
        keeps_caller,
        status,
        why,
    } = ending;
    let ended = &layout.ended_function;
    if dependencies == Dependencies::Off {
        let (forget, remember) = if keeps_caller {
            (
                " AND tenant IS NULL",
                format!(
                    "remembered AS (UPDATE {ENTRIES} \
                       SET done_until = {DATABASE_NOW_MS} + {REMEMBER_ENDED_MS} \
                     WHERE queue_name = $queue AND entry IN (SELECT {ENTRY} FROM {gone}) \
                       AND tenant IS NOT NULL), "
                ),
            )
        } else {
            ("", String::new())
        };
        return format!(
            "forgotten AS (DELETE FROM {ENTRIES} WHERE queue_name = $queue \
                AND entry IN (SELECT {ENTRY} FROM {gone}){forget}), {remember}\
             ended AS MATERIALIZED (SELECT {ended}(array_agg({ENTRY} ORDER BY {ENTRY}), \
                array_agg({TASK} ORDER BY {ENTRY}), {succeeded}, {why}, {status}) AS woken \
              FROM {gone})"
        );
    }
    let caller = if keeps_caller {
        ""
    } else {
        ", tenant = NULL, task_id = NULL, user_id = NULL, session_id = NULL"
    };
    format!(
        "registered AS (UPDATE {ENTRIES} SET done_until = {DATABASE_NOW_MS} + {REMEMBER_ENDED_MS}, \
            ended_status = {status}{caller} \
          WHERE queue_name = $queue AND entry IN (SELECT {ENTRY} FROM {gone}) \
          RETURNING entry, owner_task), \
         ended AS MATERIALIZED (SELECT {ended}(array_agg(entry ORDER BY entry), \
            array_agg(owner_task ORDER BY entry), {succeeded}, {why}, {status}) AS woken \
          FROM registered)"
    )
}

/// What dependencies add to the queue's objects, after its PGMQ queues and registry: the
/// registry's owner columns and index, the edge table, each level's index of held children
/// with a deadline, and the queue's two functions.
pub(super) fn dependencies_ddl(layout: &PgmqLayout) -> String {
    let mut sql = format!(
        "DO $$ BEGIN \
           IF NOT EXISTS (SELECT 1 FROM information_schema.columns \
                           WHERE table_name = '{ENTRIES}' AND column_name = 'owner_task') THEN \
             ALTER TABLE {ENTRIES} ADD COLUMN IF NOT EXISTS owner TEXT NULL, \
               ADD COLUMN IF NOT EXISTS owner_task BIGINT NULL, \
               ADD COLUMN IF NOT EXISTS ended_status TEXT NULL; \
           END IF; \
         END $$; \
         CREATE INDEX IF NOT EXISTS {ENTRIES}_owner ON {ENTRIES} (owner_task, queue_name, owner) \
           WHERE owner_task IS NOT NULL; \
         CREATE TABLE IF NOT EXISTS {EDGES} (queue_name TEXT NOT NULL, \
           parent_entry BIGINT NOT NULL, child_entry BIGINT NOT NULL, \
           PRIMARY KEY (queue_name, parent_entry, child_entry));"
    );
    for level in &layout.levels {
        sql.push_str(&format!(
            "CREATE INDEX IF NOT EXISTS {table}_pl_waits ON pgmq.{table} \
               (((message->>'deadline')::bigint)) WHERE vt = {HELD};",
            table = level.table,
        ));
    }
    sql.push_str(&ended_function(layout));
    sql.push_str(&park_waiting_function(layout));
    sql
}

/// `pl_pgmq_<queue>_ended(entries, task ids, succeeded, why, status)`: the messages (by
/// entry, with their callers' task ids in the same order) ended, well or not. Releases or
/// cancels their children (see the module docs); returns how many became claimable.
fn ended_function(layout: &PgmqLayout) -> String {
    let name = &layout.name;
    let child = ENTRY.replace("message", "c.message");
    let parked = PARKED.replace("message", "c.message");
    let pending = "(c.message->>'pending')::int";
    let anyway = "COALESCE((c.message->>'anyway')::boolean, false)";
    let after = at_ms("COALESCE((c.message->>'after')::bigint, 0)");
    // Each level's children that count the parent as done (`which`: succeeded, or those
    // that run anyway), one taken from their count, released at 0.
    let freed_ctes = |which: &str| {
        layout.per_level(", ", |level| {
            format!(
                "freed_{p} AS (UPDATE pgmq.{table} AS c SET \
                message = CASE WHEN {pending} <= n.edges THEN c.message {HELD_KEYS} \
                  ELSE jsonb_set(c.message, '{{pending}}', to_jsonb({pending} - n.edges)) END, \
                vt = CASE WHEN {pending} <= n.edges \
                  THEN {after} \
                  ELSE c.vt END \
                FROM per_child AS n \
               WHERE {which} AND {child} = n.child_entry AND c.vt = {HELD} AND {parked} \
              RETURNING c.vt <> {HELD} AS released)",
                p = level.p,
                table = level.table,
            )
        })
    };
    let doomed_ctes = layout.per_level(", ", |level| {
        format!(
            "doomed_{p} AS (DELETE FROM pgmq.{table} AS c USING per_child AS d \
                WHERE {child} = d.child_entry AND c.vt = {HELD} AND {parked} AND NOT {anyway} \
              RETURNING c.read_ct, c.enqueued_at, c.message, d.task_id)",
            p = level.p,
            table = level.table,
        )
    });
    let cut = format!(
        "cut AS (DELETE FROM {EDGES} AS e \
                  USING unnest(ending, ending_tasks) AS p(entry, task_id) \
                  WHERE e.queue_name = '{name}' AND e.parent_entry = p.entry \
                 RETURNING e.child_entry, p.task_id), \
         per_child AS (SELECT child_entry, count(*) AS edges, min(task_id) AS task_id \
                         FROM cut GROUP BY child_entry)"
    );
    let doomed = layout.per_level(" UNION ALL ", |level| {
        format!(
            "SELECT read_ct, enqueued_at, message, task_id FROM doomed_{}",
            level.p
        )
    });
    let freed = layout.per_level(" UNION ALL ", |level| {
        format!("SELECT released FROM freed_{}", level.p)
    });
    format!(
        r#"
CREATE OR REPLACE FUNCTION {function}(parents bigint[], parent_tasks bigint[],
                                      succeeded boolean, why text, status text)
RETURNS bigint LANGUAGE plpgsql VOLATILE AS $fn$
#variable_conflict use_column
DECLARE
    woken bigint := 0;
    freed_now bigint;
    ending bigint[] := parents;
    ending_tasks bigint[] := parent_tasks;
    doomed_entries bigint[];
    doomed_tasks bigint[];
    how text := why;
    how_status text := status;
BEGIN
    -- The common case, a queue with no child waiting: one probe, not the statement below
    -- (whose data-modifying parts run, over nothing, each time it runs).
    IF parents IS NULL OR cardinality(parents) = 0
       OR NOT EXISTS (SELECT 1 FROM {EDGES} WHERE queue_name = '{name}') THEN
        RETURN 0;
    END IF;
    -- Parents that succeeded cancel nothing: their statement has no part for doomed children.
    IF succeeded THEN
        WITH {cut}, {freed_all}
        SELECT count(*) INTO woken FROM ({freed}) AS freed WHERE released;
        ending := NULL;
    END IF;
    WHILE ending IS NOT NULL LOOP
        WITH {cut}, {freed_anyway}, {doomed_ctes},
             doomed AS ({doomed}),
             letters AS (INSERT INTO pgmq.{dlq} (vt, read_ct, enqueued_at, message)
                SELECT to_timestamp(0), read_ct, enqueued_at, (message {HELD_KEYS}) ||
                       jsonb_build_object('reason', format('task %s it depends on %s', task_id, how),
                                          'cancelled', true, 'parent_task', task_id,
                                          'parent_status', how_status)
                  FROM doomed),
             forgotten AS (UPDATE {ENTRIES} SET tenant = NULL, task_id = NULL, user_id = NULL,
                       session_id = NULL, done_until = {DATABASE_NOW_MS} + {REMEMBER_ENDED_MS},
                       ended_status = '"Cancelled"'
                 WHERE queue_name = '{name}'
                   AND entry IN (SELECT {ENTRY} FROM doomed))
        SELECT f.n, d.entries, d.tasks INTO freed_now, doomed_entries, doomed_tasks
          FROM (SELECT count(*) AS n FROM ({freed}) AS freed WHERE released) AS f,
               (SELECT array_agg({ENTRY} ORDER BY {ENTRY}) AS entries,
                       array_agg({TASK} ORDER BY {ENTRY}) AS tasks FROM doomed) AS d;
        woken := woken + freed_now;
        ending := doomed_entries;
        ending_tasks := doomed_tasks;
        how := 'was cancelled';
        how_status := '"Cancelled"';
    END LOOP;
    IF woken > 0 THEN
        PERFORM pg_notify('pgmq.{name}', '');
    END IF;
    RETURN woken;
END
$fn$;
"#,
        function = layout.ended_function,
        dlq = layout.dead.0,
        freed_all = freed_ctes("true"),
        freed_anyway = freed_ctes(anyway),
    )
}

/// `pl_pgmq_<queue>_park_waiting(tenant, parents, runs anyway, own start, rows)`: resolves
/// the parents (in the order given; the first refused ends the call) and parks the one task
/// of `rows` (a [`ParkRows`](crate::infra::postgres::codec::ParkRows) array) waiting for the
/// live ones. Answers one row, as the table queue's function of the same purpose does:
/// `outcome` is `parked` (then `parent` holds how many parents it waits for), `duplicate`,
/// `unknown`, `other_tenant` or `ended` (then `parent` names the parent and `status` says
/// how it ended).
fn park_waiting_function(layout: &PgmqLayout) -> String {
    let name = &layout.name;
    format!(
        r#"
CREATE OR REPLACE FUNCTION {function}(tenant_name text, parents bigint[], run_anyway boolean,
                                      after_ms bigint, rec jsonb)
RETURNS TABLE (outcome text, parent bigint, status text) LANGUAGE plpgsql VOLATILE AS $fn$
#variable_conflict use_column
DECLARE
    named bigint;
    hit record;
    live bigint[] := '{{}}';
    item jsonb := rec->0;
    stored bigint;
    body jsonb;
    due timestamptz;
BEGIN
    FOREACH named IN ARRAY parents LOOP
        SELECT entry, done_until, ended_status INTO hit FROM {ENTRIES}
         WHERE owner_task = named AND queue_name = '{name}' AND owner = tenant_name
         ORDER BY done_until IS NULL DESC, entry DESC LIMIT 1 FOR SHARE;
        IF NOT FOUND THEN
            IF EXISTS (SELECT 1 FROM {ENTRIES} WHERE owner_task = named
                          AND queue_name = '{name}' AND owner <> tenant_name) THEN
                RETURN QUERY SELECT 'other_tenant'::text, named, NULL::text;
            ELSE
                RETURN QUERY SELECT 'unknown'::text, named, NULL::text;
            END IF;
            RETURN;
        END IF;
        IF hit.done_until IS NULL THEN
            live := live || hit.entry;
        ELSIF hit.ended_status IS NULL THEN
            CONTINUE;
        ELSIF NOT run_anyway THEN
            RETURN QUERY SELECT 'ended'::text, named, hit.ended_status;
            RETURN;
        END IF;
    END LOOP;
    {register}
    IF stored IS NULL THEN
        RETURN QUERY SELECT 'duplicate'::text, NULL::bigint, NULL::text;
        RETURN;
    END IF;
    body := {message};
    IF cardinality(live) > 0 THEN
        body := body || jsonb_build_object('pending', cardinality(live), 'after', after_ms,
                                           'anyway', run_anyway);
        due := {HELD};
    ELSE
        due := {after};
    END IF;
    {send}
    INSERT INTO {EDGES} (queue_name, parent_entry, child_entry)
    SELECT DISTINCT '{name}', unnest(live), stored;
    IF cardinality(live) = 0 THEN
        PERFORM pg_notify('pgmq.{name}', '');
    END IF;
    RETURN QUERY SELECT 'parked'::text, cardinality(live)::bigint, NULL::text;
END
$fn$;
"#,
        function = layout.park_waiting_function,
        message = MESSAGE,
        register = register_one(layout, "item", "stored"),
        after = at_ms("after_ms"),
        send = send_one(layout, "(item->>'priority')::smallint", "due", "body"),
    )
}

/// Parks one task waiting for its parents (`$queue`, `$tenant`, `$parents`, `$run_anyway`,
/// `$after_ms`, `$rows`): one call of the queue's `_park_waiting` function.
pub(super) fn park_waiting_sql(layout: &PgmqLayout) -> String {
    format!(
        "SELECT outcome, parent, status FROM {}($tenant, $parents::bigint[], $run_anyway, \
         $after_ms, $rows::jsonb)",
        layout.park_waiting_function
    )
}

/// How many parents the held message of task `$task_id` under exactly (`$tenant`,
/// `$user_id`, `$session_id`) still waits for.
pub(super) fn waiting_parents_sql(layout: &PgmqLayout) -> String {
    let per_level = layout.per_level(" UNION ALL ", |level| {
        format!(
            "SELECT message FROM pgmq.{table} WHERE {TASK} = $task_id AND {PARKED} \
                AND vt = {HELD} AND message->>'tenant' = $tenant \
                AND message->>'user' IS NOT DISTINCT FROM $user_id \
                AND message->>'session' IS NOT DISTINCT FROM $session_id",
            table = level.table,
        )
    });
    format!(
        "SELECT (message->>'pending')::int AS pending_parents FROM ({per_level}) AS held LIMIT 1"
    )
}

/// Moves the held children whose deadline passed by `$now_ms` to the dead-letter queue,
/// marked cancelled with the status `Expired`, and ends their own children; answers `n`,
/// how many.
pub(super) fn expire_held_sql(layout: &PgmqLayout) -> String {
    let expired = layout.per_level(", ", |level| {
        format!(
            "x_{p} AS (DELETE FROM pgmq.{table} WHERE vt = {HELD} AND {PARKED} \
                AND (message->>'deadline')::bigint <= $now_ms \
              RETURNING read_ct, enqueued_at, message)",
            p = level.p,
            table = level.table,
        )
    });
    let gone = layout.per_level(" UNION ALL ", |level| {
        format!("SELECT read_ct, enqueued_at, message FROM x_{}", level.p)
    });
    format!(
        "WITH {expired}, gone AS ({gone}), \
         letters AS (INSERT INTO pgmq.{dlq} (vt, read_ct, enqueued_at, message) \
            SELECT to_timestamp(0), read_ct, enqueued_at, (message {HELD_KEYS}) || \
                   jsonb_build_object('reason', '{HELD_PAST_DEADLINE}', 'cancelled', true, \
                                      'ended', '\"Expired\"') \
              FROM gone), {ended} \
         SELECT count(*) AS n FROM registered CROSS JOIN ended",
        dlq = layout.dead.0,
        ended = ended_ctes(layout, "gone", Ending::EXPIRED, Dependencies::Kept),
    )
}
