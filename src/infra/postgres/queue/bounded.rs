//! A bound on the units parked in a Postgres table queue, kept for every node
//! ([`QueuedUnits`](crate::core::QueuedUnits)): rule 21 of the scheduling core, shedding the
//! lowest priority first, over the rows the whole fleet parks.
//!
//! # How a park keeps it
//!
//! A queue bounded so parks through `<table>_park_within` instead of the plain `INSERT`.
//! For each kind its group parks, in kind order (so two groups never wait for each other in
//! a cycle), the function takes a transaction-level advisory lock on (table, queue, kind):
//! the parks of one kind queue behind each other for the moment a park takes, and claims,
//! settles and parks of other kinds do not wait at all. Under the lock it sums the units
//! parked of the kind (rows claimable now or once due: a scheduled start still asleep and a
//! child waiting for its parents are not in line yet) and, for each task of the group in
//! turn:
//!
//! - a task that fits under the bound parks;
//! - one that does not, where the parked tasks of its kind of a strictly lower priority hold
//!   at least the units it lacks, parks and sheds them, worst-ranked first, until it fits:
//!   each shed row ends `cancelled` with a status `Rejected` (the dead-letter reader of any
//!   node tells its submitter `QueueFull`), in the same statement, and `<table>_ended` ends
//!   the children waiting on it as it does for a cancel;
//! - any other is refused (`full`), and nothing is shed.
//!
//! No counter is kept beside the rows: the sum is read where the decision is made, under
//! the lock, so no statement that unparks a row (a claim, a cancel, a rescue, a retry, a
//! hand-back) has anything to keep in step, and none of them pays for the bound. The sum
//! walks `<table>_parked_units`, the parked rows of a queue and kind in shedding order,
//! units included: a read of the queue's parked rows of that kind, which the bound itself
//! keeps few (at most `max_queued_units` units of them). The rows being claimed while a
//! park looks are counted as parked (a claim does not take the lock) and skipped when
//! shedding (`SKIP LOCKED`): a park may refuse or shed a moment early, never park past the
//! bound by more than what was on its way out.

use crate::infra::postgres::codec::PARK_RECORD;
use crate::infra::postgres::Identifier;

/// The index [`bounded_ddl`] makes last, whose presence says the table is ready for a
/// bounded queue.
pub(crate) fn bounded_index(t: &Identifier) -> String {
    format!("{t}_parked_units")
}

/// `<t>_park_within(queue, rows, max_units, now_ms, by_deadline, status, why)`: parks the
/// tasks of `rows` (a [`ParkRows`](crate::infra::postgres::codec::ParkRows) array) in order,
/// each within `max_units` units parked of its kind (see the module docs). A group that fits
/// whole is stored by one `INSERT`, answering the entry of each task it stored (`parked`);
/// any other is decided task by task, answering each task's entry with `parked`, `duplicate`
/// (its entry or caller is stored already) or `full`. An entry not answered is a duplicate.
/// `status` is how a shed task ended, a `TaskStatus` in JSON; `why` its reason.
pub(crate) fn bounded_ddl(t: &Identifier, parked_columns: &str) -> String {
    let index = bounded_index(t);
    format!(
        r#"
CREATE INDEX IF NOT EXISTS {index} ON {t}
    (queue_name, kind, priority, rank_time_ms DESC, entry DESC) INCLUDE (units, not_before_ms)
    WHERE state = 'parked';
DROP FUNCTION IF EXISTS {t}_park_within(text, jsonb, bigint, bigint, boolean, text, text);
CREATE FUNCTION {t}_park_within(queue text, recs jsonb, max_units bigint,
                                           now_ms bigint, by_deadline boolean,
                                           status text, why text)
RETURNS TABLE (entry bigint, outcome text) LANGUAGE plpgsql VOLATILE AS $fn$
#variable_conflict use_column
DECLARE
    rec jsonb;
    r record;
    each_kind smallint;
    queued bigint[] := array_fill(0::bigint, ARRAY[16]);
    over bigint;
    below bigint;
    freed bigint;
    victim record;
    victims bigint[];
    shed_ids bigint[];
    shed_tasks bigint[];
    stored bigint;
BEGIN
    FOR each_kind IN SELECT DISTINCT x.kind FROM jsonb_to_recordset(recs) AS x(kind smallint)
                      ORDER BY x.kind LOOP
        PERFORM pg_advisory_xact_lock(hashtextextended('{t}.' || queue || '.' || each_kind, 0));
        SELECT COALESCE(sum(units), 0) INTO over FROM {t}
         WHERE queue_name = queue AND state = 'parked' AND kind = each_kind
           AND not_before_ms <= now_ms;
        queued[each_kind + 1] := over;
    END LOOP;
    -- The common case: the whole group fits under the bound. One INSERT, as a plain park.
    IF NOT EXISTS (
        SELECT 1 FROM jsonb_to_recordset(recs) AS x(kind smallint, units bigint,
                                                     not_before_ms bigint)
         WHERE COALESCE(x.not_before_ms, 0) <= now_ms
         GROUP BY x.kind HAVING queued[x.kind + 1] + sum(x.units) > max_units) THEN
        RETURN QUERY
        INSERT INTO {t} AS j (queue_name, {parked_columns}, not_before_ms)
        SELECT queue, {parked_columns}, COALESCE(not_before_ms, 0)
          FROM jsonb_to_recordset(recs) AS x({PARK_RECORD})
        ON CONFLICT DO NOTHING RETURNING j.entry, 'parked'::text;
        RETURN;
    END IF;
    FOR rec IN SELECT value FROM jsonb_array_elements(recs) LOOP
        SELECT * INTO r FROM jsonb_to_record(rec) AS x({PARK_RECORD});
        -- Stored first, so that a duplicate is one whatever the bound; taken back if refused.
        stored := NULL;
        INSERT INTO {t} (queue_name, {parked_columns}, not_before_ms)
        SELECT queue, {parked_columns}, COALESCE(not_before_ms, 0)
          FROM jsonb_to_recordset(jsonb_build_array(rec)) AS x({PARK_RECORD})
        ON CONFLICT DO NOTHING RETURNING id INTO stored;
        IF stored IS NULL THEN
            RETURN QUERY SELECT r.entry, 'duplicate'::text;
            CONTINUE;
        END IF;
        IF COALESCE(r.not_before_ms, 0) > now_ms THEN
            RETURN QUERY SELECT r.entry, 'parked'::text;
            CONTINUE;
        END IF;
        over := queued[r.kind + 1] + r.units - max_units;
        IF over > 0 THEN
            below := 0;
            IF r.units <= max_units THEN
                SELECT COALESCE(sum(units), 0) INTO below FROM {t}
                 WHERE queue_name = queue AND state = 'parked' AND kind = r.kind
                   AND priority < r.priority AND not_before_ms <= now_ms;
            END IF;
            IF below < over THEN
                DELETE FROM {t} WHERE id = stored;
                RETURN QUERY SELECT r.entry, 'full'::text;
                CONTINUE;
            END IF;
        END IF;
        freed := 0;
        victims := '{{}}';
        IF over > 0 THEN
            FOR victim IN SELECT id, units FROM {t}
                 WHERE queue_name = queue AND state = 'parked' AND kind = r.kind
                   AND priority < r.priority AND not_before_ms <= now_ms
                 ORDER BY priority,
                          CASE WHEN by_deadline THEN COALESCE(deadline_ms, 9223372036854775807)
                               ELSE 0 END DESC,
                          rank_time_ms DESC, entry DESC
                 FOR UPDATE SKIP LOCKED LOOP
                victims := victims || victim.id;
                freed := freed + victim.units;
                EXIT WHEN freed >= over;
            END LOOP;
            WITH shed AS (
                UPDATE {t} SET state = 'cancelled', pending_parents = 0, ended_status = status,
                       last_error = why
                 WHERE id = ANY (victims) RETURNING id, task_id)
            SELECT array_agg(id ORDER BY id), array_agg(task_id ORDER BY id)
              INTO shed_ids, shed_tasks FROM shed;
            PERFORM {t}_ended(queue, shed_ids, shed_tasks, false, 'was refused: ' || why, status);
        END IF;
        queued[r.kind + 1] := queued[r.kind + 1] + r.units - freed;
        RETURN QUERY SELECT r.entry, 'parked'::text;
    END LOOP;
END
$fn$;
"#
    )
}
