//! A bound on the units parked in a pgmq queue, kept for every node
//! ([`QueuedUnits`](crate::core::QueuedUnits)): the table queue's rule (see
//! `infra/postgres/queue/bounded.rs`) over the messages of the queue's four levels.
//!
//! A bounded queue parks through `pl_pgmq_<queue>_park_within`, made with the queue's other
//! objects. For each kind its group parks, in kind order, it takes a transaction-level
//! advisory lock on (queue, kind) and sums the units of the kind's parked messages that a
//! claim could take now (no node holds them and their visibility time has come: a scheduled
//! start still asleep, a retry backing off and a child waiting for its parents are not in
//! line). A group that fits whole is one statement, the plain park's. Otherwise each task in
//! turn is registered first (a duplicate is one whatever the bound), then:
//!
//! - a task that fits under the bound is sent to its level;
//! - one that does not, where the kind's parked messages of a strictly lower priority hold
//!   the units it lacks, is sent and sheds them, worst-ranked first: each goes to the
//!   dead-letter queue marked cancelled with the status `Rejected` (any node's dead-letter
//!   reader tells its submitter `QueueFull`), its registry row ends, and the queue's
//!   `_ended` function cancels the children waiting on it;
//! - any other is refused (`full`), its registry row taken back, and nothing is shed.
//!
//! No counter is kept: the sum is read under the lock, from the level tables (which the
//! bound keeps to `max_queued_units` units of the kind, and whose rank indexes hold only
//! parked messages). A message a claim is taking while a park looks is counted as parked and
//! skipped when shedding (`SKIP LOCKED`), as on the table.

use super::dependencies::HELD_KEYS;
use super::layout::{Dependencies, PgmqLayout, DUE, ENTRIES, ENTRY, PARKED, RANK};
use super::parts::{at_ms, park_group, register_one, send_one, MESSAGE};
use crate::infra::postgres::codec::{DATABASE_NOW_MS, PARK_RECORD, REMEMBER_ENDED_MS};

/// The statement a bounded queue parks through (`$rows`, `$max_units`, `$now_ms`,
/// `$by_deadline`, `$status`, `$why`): one `entry` and `outcome` per task, as the table
/// queue's.
pub(super) fn park_within_sql(layout: &PgmqLayout) -> String {
    format!(
        "SELECT entry, outcome FROM {}($rows::jsonb, $max_units, $now_ms, $by_deadline, \
         $status, $why)",
        layout.park_within_function
    )
}

/// `pl_pgmq_<queue>_park_within(rows, max_units, now_ms, by_deadline, status, why)`: parks
/// the tasks of `rows` (a [`ParkRows`](crate::infra::postgres::codec::ParkRows) array) in
/// order, each within `max_units` units parked of its kind (see the module docs); `status`
/// is how a shed task ended (a `TaskStatus` in JSON), `why` its reason.
pub(super) fn park_within_function(layout: &PgmqLayout) -> String {
    let name = &layout.name;
    // The kind's messages a claim could take now, across the levels.
    let in_line = |kind: &str| {
        layout.per_level(" UNION ALL ", |level| {
            format!(
                "SELECT {p}::smallint AS priority, msg_id, (message->>'units')::bigint AS units, \
                        {DUE} AS due, {RANK} AS rank, {ENTRY} AS entry \
                   FROM pgmq.{table} \
                  WHERE {PARKED} AND vt <= now_at AND (message->>'kind')::smallint = {kind}",
                p = level.p,
                table = level.table,
            )
        })
    };
    // Sheds message `victim.msg_id` of level `victim.priority` if no one else holds it: to
    // the dead-letter queue, marked cancelled with `status`.
    let shed = layout.per_level(" ELSIF ", |level| {
        format!(
            "victim.priority = {p} THEN \
               DELETE FROM pgmq.{table} WHERE msg_id = (SELECT msg_id FROM pgmq.{table} \
                 WHERE msg_id = victim.msg_id AND {PARKED} FOR UPDATE SKIP LOCKED) \
               RETURNING read_ct, enqueued_at, message INTO gone;",
            p = level.p,
            table = level.table,
        )
    });
    // The owner of each task is named in either case: a bounded park cannot tell whether
    // the queue's nodes keep dependencies, and a name is all it costs.
    let fast = park_group(
        layout,
        false,
        Dependencies::Kept,
        "recs",
        &format!("'{name}'"),
        |sent| format!("SELECT s.entry, 'parked'::text FROM ({sent}) AS s"),
    );
    format!(
        r#"
CREATE OR REPLACE FUNCTION {function}(recs jsonb, max_units bigint, now_ms bigint,
                                      by_deadline boolean, status text, why text)
RETURNS TABLE (entry bigint, outcome text) LANGUAGE plpgsql VOLATILE AS $fn$
#variable_conflict use_column
DECLARE
    now_at timestamptz := {now_at};
    rec jsonb;
    r record;
    each_kind smallint;
    queued bigint[] := array_fill(0::bigint, ARRAY[16]);
    over bigint;
    below bigint;
    freed bigint;
    victim record;
    gone record;
    shed_entries bigint[];
    shed_tasks bigint[];
    stored bigint;
BEGIN
    FOR each_kind IN SELECT DISTINCT x.kind FROM jsonb_to_recordset(recs) AS x(kind smallint)
                      ORDER BY x.kind LOOP
        PERFORM pg_advisory_xact_lock(hashtextextended('pgmq.{name}.' || each_kind, 0));
        SELECT COALESCE(sum(q.units), 0) INTO over FROM ({in_kind}) AS q;
        queued[each_kind + 1] := over;
    END LOOP;
    -- The common case: the whole group fits under the bound. The plain park's statement.
    IF NOT EXISTS (
        SELECT 1 FROM jsonb_to_recordset(recs) AS x(kind smallint, units bigint,
                                                     not_before_ms bigint)
         WHERE COALESCE(x.not_before_ms, 0) <= now_ms
         GROUP BY x.kind HAVING queued[x.kind + 1] + sum(x.units) > max_units) THEN
        RETURN QUERY {fast};
        RETURN;
    END IF;
    FOR rec IN SELECT value FROM jsonb_array_elements(recs) LOOP
        SELECT * INTO r FROM jsonb_to_record(rec) AS x({PARK_RECORD});
        stored := NULL;
        {register}
        IF stored IS NULL THEN
            RETURN QUERY SELECT r.entry, 'duplicate'::text;
            CONTINUE;
        END IF;
        over := queued[r.kind + 1] + r.units - max_units;
        IF COALESCE(r.not_before_ms, 0) <= now_ms AND over > 0 THEN
            below := 0;
            IF r.units <= max_units THEN
                SELECT COALESCE(sum(q.units), 0) INTO below FROM ({in_r_kind}) AS q
                 WHERE q.priority < r.priority;
            END IF;
            IF below < over THEN
                DELETE FROM {ENTRIES} WHERE queue_name = '{name}' AND {ENTRIES}.entry = stored;
                RETURN QUERY SELECT r.entry, 'full'::text;
                CONTINUE;
            END IF;
        END IF;
        {send}
        IF COALESCE(r.not_before_ms, 0) > now_ms THEN
            RETURN QUERY SELECT r.entry, 'parked'::text;
            CONTINUE;
        END IF;
        freed := 0;
        IF over > 0 THEN
            shed_entries := '{{}}';
            shed_tasks := '{{}}';
            FOR victim IN SELECT q.priority, q.msg_id, q.units FROM ({in_r_kind}) AS q
                 WHERE q.priority < r.priority
                 ORDER BY q.priority, CASE WHEN by_deadline THEN q.due ELSE 0 END DESC,
                          q.rank DESC, q.entry DESC LOOP
                IF {shed} END IF;
                CONTINUE WHEN NOT FOUND;
                INSERT INTO pgmq.{dlq} (vt, read_ct, enqueued_at, message)
                VALUES (to_timestamp(0), gone.read_ct, gone.enqueued_at,
                        (gone.message {HELD_KEYS}) || jsonb_build_object('reason', why,
                            'cancelled', true, 'ended', status));
                shed_entries := shed_entries || ((gone.message->>'entry')::bigint);
                shed_tasks := shed_tasks || ((gone.message->>'task')::bigint);
                freed := freed + victim.units;
                EXIT WHEN freed >= over;
            END LOOP;
            UPDATE {ENTRIES} SET tenant = NULL, task_id = NULL, user_id = NULL,
                   session_id = NULL, done_until = {DATABASE_NOW_MS} + {REMEMBER_ENDED_MS},
                   ended_status = status
             WHERE queue_name = '{name}' AND {ENTRIES}.entry = ANY (shed_entries);
            PERFORM {ended}(shed_entries, shed_tasks, false, 'was refused: ' || why, status);
        END IF;
        queued[r.kind + 1] := queued[r.kind + 1] + r.units - freed;
        RETURN QUERY SELECT r.entry, 'parked'::text;
    END LOOP;
END
$fn$;
"#,
        function = layout.park_within_function,
        now_at = at_ms("now_ms"),
        in_kind = in_line("each_kind"),
        in_r_kind = in_line("r.kind"),
        register = register_one(layout, "rec", "stored"),
        send = send_one(
            layout,
            "r.priority",
            &at_ms("COALESCE(r.not_before_ms, 0)"),
            &MESSAGE.replace("item", "rec"),
        ),
        dlq = layout.dead.0,
        ended = layout.ended_function,
    )
}
