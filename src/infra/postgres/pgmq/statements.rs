//! The pgmq layout's statements, written once when a queue opens: park, claim (skip-ahead
//! across the levels), renew, settle, release, rescue, dead letters (see the layout in
//! [`queue`](super::queue), and `infra::postgres::shared_queue` for what each statement is
//! given and answers).

use super::bounded::park_within_sql;
use super::dependencies::{
    ended_ctes, expire_held_sql, park_waiting_sql, waiting_parents_sql, Ending, HELD,
};
use super::layout::{Dependencies, PgmqLayout, DUE, ENTRIES, ENTRY, PARKED, TASK};
use super::parts::{at_ms, park_group, union_of};
use crate::core::{QueueOrder, Settlement};
use crate::infra::postgres::claim::{fits, not_behind_reserved, within_bound, RankSql, Units};
use crate::infra::postgres::named::NamedSql;
use crate::infra::postgres::shared_queue::{ParkWithin, Statements};
use crate::infra::postgres::{lease_ran_out_sql, retry_at_sql, Identifier, GIVEN_UP};

/// The messages of `table` a settle or release names that `$node` holds: each an entry under
/// one read count (its claim); a message read again since, by any node, has another count
/// and is left alone. Each claim is looked up on its own, on the entry index (the `LIMIT`
/// keeps the lookup per claim; a semi-join over the whole array lets the planner scan the
/// table instead, at a cost that grows with every parked message).
fn these_claims(table: &Identifier) -> String {
    format!(
        "msg_id IN (SELECT j.msg_id FROM unnest($entries::bigint[], $attempts::integer[]) \
                     AS c(entry, attempts) \
                   CROSS JOIN LATERAL (SELECT msg_id FROM pgmq.{table} \
                     WHERE {ENTRY} = c.entry AND read_ct = c.attempts \
                       AND message->>'node' = $node LIMIT 1) j)"
    )
}

/// A whole number `field` of a message, as a SQL `ty`; 0 when it holds none.
fn number_in_message(field: &str, ty: &str) -> String {
    format!(
        "(CASE WHEN jsonb_typeof(message->'{field}') = 'number' \
         THEN (message->>'{field}')::numeric ELSE 0 END)::{ty}"
    )
}

impl PgmqLayout {
    /// The layout's statements, keeping `dependencies` or not (see
    /// `infra::postgres::shared_queue` for what each is given and answers).
    pub(super) fn statements(&self, dependencies: Dependencies) -> Statements {
        let layout = self;
        let sql = |text: String| NamedSql::new(&text);
        let kept = dependencies == Dependencies::Kept;
        Statements {
            // One queue per priority level, each read in the layout's order.
            order: layout.order,
            park: sql(park_sql(layout, false, dependencies)),
            park_claimed: sql(park_sql(layout, true, dependencies)),
            claim: sql(claim_sql(layout)),
            renew: sql(renew_sql(layout)),
            settle_done: sql(settle_sql(layout, &Settlement::Done, dependencies)),
            settle_ended: sql(settle_sql(
                layout,
                &Settlement::Ended(crate::core::TaskStatus::Cancelled),
                dependencies,
            )),
            park_waiting: kept.then(|| sql(park_waiting_sql(layout))),
            park_within: Some(ParkWithin {
                table: None,
                park: sql(park_within_sql(layout)),
            }),
            waiting_parents: kept.then(|| sql(waiting_parents_sql(layout))),
            expire_held: kept.then(|| sql(expire_held_sql(layout))),
            settle_failed: sql(settle_sql(
                layout,
                &Settlement::Failed(String::new()),
                dependencies,
            )),
            release: sql(release_sql(layout)),
            retry: sql(retry_sql(layout)),
            remove: sql(remove_sql(
                layout,
                dependencies,
                &format!("{ENTRY} = $entry AND {PARKED} FOR UPDATE SKIP LOCKED"),
            )),
            remove_task: sql(remove_sql(
                layout,
                dependencies,
                &format!(
                    "{TASK} = $task_id AND {PARKED} AND message->>'tenant' = $tenant \
                     AND message->>'user' IS NOT DISTINCT FROM $user_id \
                     AND message->>'session' IS NOT DISTINCT FROM $session_id \
                     ORDER BY msg_id LIMIT 1 FOR UPDATE SKIP LOCKED"
                ),
            )),
            sleeping: sql(sleeping_sql(layout)),
            live_task: sql(live_task_sql()),
            rescue: sql(rescue_sql(layout, dependencies)),
            counts: sql(counts_sql(layout)),
            dead_letters: sql(dead_letters_sql(layout)),
            bury: sql(bury_sql(layout, dependencies)),
            // The pgmq layout claims in rank order: a fair share by use orders each
            // node's own lot only.
            fair: None,
            list_dead: sql(list_dead_sql(layout)),
            forget_done: sql(format!(
                "DELETE FROM {ENTRIES} WHERE queue_name = $queue AND done_until <= $now_ms"
            )),
            retry_dead: sql(retry_dead_sql(layout)),
            purge_dead: sql(purge_dead_sql(layout)),
        }
    }
}

/// When the parked message of task `$task_id` under exactly (`$tenant`, `$user_id`,
/// `$session_id`) becomes visible, if that is after `$now_ms` (its visibility time is its
/// not-before instant: a scheduled start, a retry's backoff).
fn sleeping_sql(layout: &PgmqLayout) -> String {
    let per_level = layout.per_level(" UNION ALL ", |level| {
        format!(
            "SELECT vt FROM pgmq.{table} WHERE {TASK} = $task_id AND {PARKED} \
                AND message->>'tenant' = $tenant \
                AND message->>'user' IS NOT DISTINCT FROM $user_id \
                AND message->>'session' IS NOT DISTINCT FROM $session_id \
                AND vt > {now} AND vt <> {HELD}",
            table = level.table,
            now = at_ms("$now_ms"),
        )
    });
    format!(
        "SELECT (floor(extract(epoch FROM min(vt)) * 1000))::bigint AS until_ms \
           FROM ({per_level}) AS sleeping HAVING count(*) > 0"
    )
}

/// The key of the live (or lately completed) task of caller (`$tenant`, `$task_id`), from
/// the registry, where only rows that keep their callers unique name their caller.
fn live_task_sql() -> String {
    format!(
        "SELECT tenant, user_id, session_id FROM {ENTRIES} \
          WHERE queue_name = $queue AND tenant = $tenant AND task_id = $task_id"
    )
}

/// Parks the rows `$rows`: the entries are registered first; a message is sent only for an
/// entry that was not registered yet, and for an entry named twice in the group only for its
/// first copy. `claimed`: held by `$node` until `$expires_ms`, as its first attempt.
fn park_sql(layout: &PgmqLayout, claimed: bool, dependencies: Dependencies) -> String {
    park_group(
        layout,
        claimed,
        dependencies,
        "$rows::jsonb",
        "$queue",
        |sent| sent.to_owned(),
    )
}

/// The claim statement: from each level the best `$max` visible messages that fit one by one
/// are locked (`SKIP LOCKED`), and of those, in rank order across levels, the first `$max`
/// whose running cost per kind stays within the free units are claimed, best-ranked first.
///
/// Under the deadline order a level's messages rank by their deadline first (none after
/// every deadline), walked in the level's `_pl_due` index; the reserved task is still the
/// oldest aged one, as on the table queue.
fn claim_sql(layout: &PgmqLayout) -> String {
    let kind = "((c.message->>'kind')::int)";
    let units = "((c.message->>'units')::bigint)";
    let (rank, entry) = (
        "((c.message->>'rank')::bigint)",
        "((c.message->>'entry')::bigint)",
    );
    let by_deadline = layout.order == QueueOrder::Deadline;
    let due = DUE.replace("message", "c.message");
    let ranked = RankSql {
        due: by_deadline.then_some(due.as_str()),
        time: rank,
        entry,
    };
    // The deadline as a column of the statement's own rows, and the order they rank in.
    let (due_column, due_order, order) = if by_deadline {
        (
            format!(", {due} AS due"),
            format!("{due}, "),
            "p DESC, due, rank, entry",
        )
    } else {
        (String::new(), String::new(), "p DESC, rank, entry")
    };
    let parked = PARKED.replace("message", "c.message");
    let reserved = layout.per_level(" UNION ALL ", |level| {
        format!(
            "(SELECT {p} AS priority, {rank} AS rank, {entry} AS entry, {kind} AS kind, \
                     {units} AS units{due_column} FROM pgmq.{table} AS c \
               WHERE {parked} AND {rank} <= $aged_before AND c.vt <= {aged} \
                 AND {units} <= {whole} \
               ORDER BY {rank}, {entry} LIMIT 1)",
            p = level.p,
            table = level.table,
            aged = at_ms("$aged_before"),
            whole = fits(kind, Units::Whole),
        )
    });
    let candidates = layout.per_level(", ", |level| {
        let p = level.p.to_string();
        format!(
            "c_{p} AS (SELECT c.msg_id, {p} AS p, {rank} AS rank, {entry} AS entry, \
                              {kind} AS kind, {units} AS units{due_column} \
                         FROM pgmq.{table} AS c \
               WHERE {parked} AND c.vt <= {now} AND {units} <= {free} AND {bounded} \
                 AND {not_behind} \
               ORDER BY {due_order}{rank}, {entry} LIMIT $max FOR UPDATE SKIP LOCKED)",
            table = level.table,
            now = at_ms("$now_ms"),
            free = fits(kind, Units::Free),
            bounded = within_bound(&p, &ranked),
            not_behind = not_behind_reserved(&p, &ranked),
        )
    });
    let claims = layout.per_level(", ", |level| {
        format!(
            "u_{p} AS (UPDATE pgmq.{table} AS q SET vt = {expiry}, read_ct = q.read_ct + 1, \
                      message = q.message || jsonb_build_object('node', $node::text) \
                 FROM pick WHERE pick.p = {p} AND q.msg_id = pick.msg_id \
               RETURNING {p} AS p, q.msg_id, q.read_ct, q.message)",
            p = level.p,
            table = level.table,
            expiry = at_ms("$expires_ms"),
        )
    });
    format!(
        "WITH reserved AS MATERIALIZED ( \
           SELECT * FROM ({reserved}) AS levels ORDER BY priority DESC, rank, entry LIMIT 1), \
         {candidates}, \
         candidates AS ({all}), \
         running AS (SELECT msg_id, p, kind, sum(units) OVER ( \
             PARTITION BY kind ORDER BY {order}) AS held{due_of_row} FROM candidates), \
         pick AS (SELECT msg_id, p FROM running WHERE held <= {held_fits} \
                   ORDER BY {order} LIMIT $max), \
         {claims} \
         SELECT msg_id AS row_id, p::smallint AS level, read_ct AS attempt, \
                (message->>'rank')::bigint AS rank, (message->>'entry')::bigint AS entry, \
                (message->'meta')::text AS metadata, (message->'payload')::text AS payload, \
                message->>'trace' AS traceparent{due_of_message} \
           FROM ({claimed}) AS claimed ORDER BY {order}",
        all = union_of(
            "c",
            if by_deadline {
                "msg_id, p, rank, entry, kind, units, due"
            } else {
                "msg_id, p, rank, entry, kind, units"
            }
        ),
        due_of_row = if by_deadline {
            ", due, rank, entry"
        } else {
            ", rank, entry"
        },
        due_of_message = if by_deadline {
            format!(", {DUE} AS due")
        } else {
            String::new()
        },
        held_fits = fits("kind", Units::Free),
        claimed = union_of("u", "p, msg_id, read_ct, message"),
    )
}

/// Moves `$node`'s holds on the messages of `$entries` to `$expires_ms`, in one statement;
/// answers the `entry` of each message the node holds. Each is looked up on the entry index;
/// a message another transaction holds (a settle under way) is skipped, not waited for, and
/// renewed at the next pass if it is still the node's then.
fn renew_sql(layout: &PgmqLayout) -> String {
    let updates = layout.per_level(", ", |level| {
        format!(
            "m_{p} AS (SELECT j.msg_id, j.entry FROM unnest($entries::bigint[]) AS c(entry) \
                CROSS JOIN LATERAL (SELECT msg_id, {ENTRY} AS entry FROM pgmq.{table} \
                  WHERE {ENTRY} = c.entry AND message->>'node' = $node LIMIT 1) j), \
             u_{p} AS (UPDATE pgmq.{table} SET vt = {vt} WHERE msg_id = ANY (ARRAY( \
                SELECT f.msg_id FROM m_{p} CROSS JOIN LATERAL (SELECT msg_id \
                  FROM pgmq.{table} WHERE msg_id = m_{p}.msg_id AND message->>'node' = $node \
                  FOR NO KEY UPDATE SKIP LOCKED) f)) RETURNING 1)",
            p = level.p,
            table = level.table,
            vt = at_ms("$expires_ms")
        )
    });
    format!("WITH {updates} {}", union_of("m", "entry"))
}

/// Ends `$node`'s holds on the messages of `$entries`. Done (or ended otherwise, `$status`):
/// archived in the level's archive, as `pgmq.archive` does. Failed: kept, with the reason
/// `$reason`, in the dead-letter queue's archive (its submitter hears of it from the node,
/// so it is not a dead letter to report). Either way their children are released or
/// cancelled in the same statement (`dependencies.rs`).
fn settle_sql(layout: &PgmqLayout, settlement: &Settlement, dependencies: Dependencies) -> String {
    let taken = layout.per_level(", ", |level| {
        format!(
            "g_{p} AS (DELETE FROM pgmq.{table} WHERE {claims} \
               RETURNING {p} AS p, msg_id, read_ct, enqueued_at, vt, message)",
            p = level.p,
            table = level.table,
            claims = these_claims(&level.table),
        )
    });
    let gone = union_of("g", "p, msg_id, read_ct, enqueued_at, vt, message");
    let keep = match settlement {
        Settlement::Done | Settlement::Ended(_) => layout.per_level(", ", |level| {
            format!(
                "k_{p} AS (INSERT INTO pgmq.{archive} (msg_id, read_ct, enqueued_at, vt, message) \
                 SELECT msg_id, read_ct, enqueued_at, vt, message FROM g_{p} RETURNING 1)",
                p = level.p,
                archive = level.archive,
            )
        }),
        Settlement::Failed(_) => format!(
            "k AS (INSERT INTO pgmq.{archive} (msg_id, read_ct, enqueued_at, vt, message) \
             SELECT nextval(pg_get_serial_sequence('pgmq.q_' || $queue || '_dlq', 'msg_id')), \
                    read_ct, enqueued_at, vt, \
                    (message - 'node') || jsonb_build_object('reason', $reason::text) \
               FROM gone RETURNING 1)",
            archive = layout.dead.1,
        ),
    };
    // Every ended task's registry row stays a while, for the children named after its end
    // (and, when it ended well or was ended, for a resubmission of its caller).
    let ending = match settlement {
        Settlement::Done => Ending::DONE,
        Settlement::Ended(_) => Ending::ENDED,
        Settlement::Failed(_) => Ending::failed(
            "jsonb_build_object('Failed', $reason::text)::text",
            "'failed: ' || $reason::text",
        ),
    };
    format!(
        "WITH {taken}, gone AS ({gone}), {keep}, {ended} \
         SELECT {ENTRY} AS entry FROM gone CROSS JOIN ended",
        ended = ended_ctes(layout, "gone", ending, dependencies),
    )
}

/// Hands `$node`'s holds on the messages of `$entries` (under `$attempts`) back: visible at
/// `$now_ms`, without the node's name, and with the read that claimed them taken back (a
/// release is no attempt of the task's).
fn release_sql(layout: &PgmqLayout) -> String {
    let released = layout.per_level(", ", |level| {
        format!(
            "r_{p} AS (UPDATE pgmq.{table} SET message = message - 'node', vt = {now}, \
                 read_ct = GREATEST(read_ct - 1, 0) \
               WHERE {claims} RETURNING {ENTRY} AS entry)",
            p = level.p,
            table = level.table,
            claims = these_claims(&level.table),
            now = at_ms("$now_ms"),
        )
    });
    format!(
        "WITH {released} SELECT entry FROM ({}) AS released",
        union_of("r", "entry")
    )
}

/// Parks `$node`'s hold on the message of `$entries` (under `$attempts`) again after a
/// failed run: visible from `$at_ms`, without the node's name, with the read that claimed it
/// counted (an attempt) and `$reason` kept in the message as its last error.
fn retry_sql(layout: &PgmqLayout) -> String {
    let retried = layout.per_level(", ", |level| {
        format!(
            "r_{p} AS (UPDATE pgmq.{table} SET \
                 message = (message - 'node') || jsonb_build_object('error', $reason::text), \
                 vt = {at} \
               WHERE {claims} RETURNING {ENTRY} AS entry)",
            p = level.p,
            table = level.table,
            at = at_ms("$at_ms"),
            claims = these_claims(&level.table),
        )
    });
    format!(
        "WITH {retried} SELECT entry FROM ({}) AS retried",
        union_of("r", "entry")
    )
}

/// Deletes the parked message `condition` picks (at most one over all levels, the best
/// level's), marks its entry cancelled, cancels its waiting children, and returns its task.
fn remove_sql(layout: &PgmqLayout, dependencies: Dependencies, condition: &str) -> String {
    let picked = layout.per_level(", ", |level| {
        format!(
            "c_{p} AS (SELECT {p} AS p, msg_id FROM pgmq.{table} WHERE {condition})",
            p = level.p,
            table = level.table,
        )
    });
    let deletes = layout.per_level(", ", |level| {
        format!(
            "g_{p} AS (DELETE FROM pgmq.{table} AS q USING pick \
               WHERE pick.p = {p} AND q.msg_id = pick.msg_id RETURNING q.message)",
            p = level.p,
            table = level.table,
        )
    });
    format!(
        "WITH {picked}, \
         pick AS (SELECT p, msg_id FROM ({all}) AS found ORDER BY p DESC LIMIT 1), \
         {deletes}, gone AS ({gone}), {ended} \
         SELECT (message->'meta')::text AS metadata, (message->'payload')::text AS payload \
           FROM gone CROSS JOIN ended",
        all = union_of("c", "p, msg_id"),
        gone = union_of("g", "message"),
        ended = ended_ctes(layout, "gone", Ending::CANCELLED, dependencies),
    )
}

/// Takes the node's name off each message whose hold ran out, visible again after the
/// backoff; a message on its last attempt goes to the dead-letter queue with the reason, and
/// its waiting children are cancelled.
fn rescue_sql(layout: &PgmqLayout, dependencies: Dependencies) -> String {
    let expired = layout.per_level(", ", |level| {
        format!(
            "e_{p} AS (SELECT msg_id, read_ct FROM pgmq.{table} \
               WHERE NOT {PARKED} AND vt <= {now} FOR UPDATE SKIP LOCKED), \
             b_{p} AS (UPDATE pgmq.{table} AS q SET message = q.message - 'node', \
                  vt = {backoff} \
                FROM e_{p} WHERE q.msg_id = e_{p}.msg_id AND e_{p}.read_ct < $max_attempts \
                RETURNING 1), \
             d_{p} AS (DELETE FROM pgmq.{table} AS q USING e_{p} \
                WHERE q.msg_id = e_{p}.msg_id AND e_{p}.read_ct >= $max_attempts \
                RETURNING q.read_ct, q.enqueued_at, q.message)",
            p = level.p,
            table = level.table,
            now = at_ms("$now_ms"),
            backoff = at_ms(&retry_at_sql(&format!("e_{}.read_ct", level.p))),
        )
    });
    format!(
        "WITH {expired}, dead AS ({dead}), \
         letters AS (INSERT INTO pgmq.{dlq} (vt, read_ct, enqueued_at, message) \
            SELECT to_timestamp(0), read_ct, enqueued_at, (message - 'node') || \
                   jsonb_build_object('reason', {reason}) \
              FROM dead RETURNING 1), {ended} \
         SELECT (SELECT count(*) FROM ({back}) AS back) AS parked, \
                (SELECT count(*) FROM letters) AS dead FROM ended",
        dead = union_of("d", "read_ct, enqueued_at, message"),
        back = union_of("b", "1"),
        dlq = layout.dead.0,
        reason = lease_ran_out_sql("message->>'node'", "read_ct"),
        ended = ended_ctes(
            layout,
            "dead",
            Ending::failed(GIVEN_UP.1, GIVEN_UP.0),
            dependencies,
        ),
    )
}

/// How many messages are parked and held, over the levels.
fn counts_sql(layout: &PgmqLayout) -> String {
    let per_level = layout.per_level(" UNION ALL ", |level| {
        format!(
            "SELECT count(*) FILTER (WHERE {PARKED}) AS parked, \
                    count(*) FILTER (WHERE NOT {PARKED}) AS claimed FROM pgmq.{table}",
            table = level.table,
        )
    });
    format!(
        "SELECT sum(parked)::bigint AS parked, sum(claimed)::bigint AS claimed \
           FROM ({per_level}) AS levels"
    )
}

/// Takes up to `$max` messages of the dead-letter queue, archiving them as a consumer of a
/// PGMQ queue archives what it read; a child cancelled for its parents (or expired while it
/// waited for them, `dependencies.rs`) is told and dropped, not archived: it is no dead
/// letter for an operator.
fn dead_letters_sql(layout: &PgmqLayout) -> String {
    let (dlq, archive) = &layout.dead;
    format!(
        "WITH picked AS (SELECT msg_id FROM pgmq.{dlq} ORDER BY msg_id LIMIT $max \
                          FOR UPDATE SKIP LOCKED), \
         gone AS (DELETE FROM pgmq.{dlq} AS q USING picked WHERE q.msg_id = picked.msg_id \
                  RETURNING q.msg_id, q.read_ct, q.enqueued_at, q.vt, q.message), \
         kept AS (INSERT INTO pgmq.{archive} (msg_id, read_ct, enqueued_at, vt, message) \
                  SELECT msg_id, read_ct, enqueued_at, vt, message FROM gone \
                   WHERE NOT {CANCELLED}) \
         SELECT coalesce(message->>'tenant', '') AS tenant, \
                message->>'user' AS user_id, message->>'session' AS session_id, \
                {task} AS task_id, {kind} AS kind, {units} AS units, \
                message->>'reason' AS reason, {CANCELLED} AS cancelled, \
                message->>'ended' AS ended, {parent} AS parent_task, \
                message->>'parent_status' AS parent_status \
           FROM gone ORDER BY msg_id",
        task = number_in_message("task", "bigint"),
        kind = number_in_message("kind", "smallint"),
        units = number_in_message("units", "bigint"),
        parent = number_in_message("parent_task", "bigint"),
    )
}

/// A dead-letter message that tells a child's submitter it was cancelled or expired.
const CANCELLED: &str = "(message ? 'cancelled')";

/// The dead letters kept: those not reported yet (the dead-letter queue) and those reported
/// (its archive), oldest first (one sequence numbers both).
fn list_dead_sql(layout: &PgmqLayout) -> String {
    let (dlq, archive) = &layout.dead;
    let columns = format!(
        "msg_id, {ENTRY} AS entry, read_ct AS attempts, (message->'meta')::text AS metadata, \
         coalesce(message->>'reason', '') AS reason"
    );
    format!(
        "SELECT entry, attempts, metadata, reason FROM ( \
           SELECT {columns} FROM pgmq.{dlq} WHERE NOT {CANCELLED} \
           UNION ALL SELECT {columns} FROM pgmq.{archive} \
         ) AS dead ORDER BY msg_id LIMIT $limit OFFSET $offset"
    )
}

/// Takes dead letter `$entry` out of the dead-letter queue or its archive and sends it again
/// to its priority's level, its read count afresh, registering its entry again (live again,
/// if the registry still remembers how it ended).
fn retry_dead_sql(layout: &PgmqLayout) -> String {
    let (dlq, archive) = &layout.dead;
    let level_of = "CASE message->'meta'->>'priority' WHEN 'Critical' THEN 3 \
                    WHEN 'High' THEN 2 WHEN 'Low' THEN 0 ELSE 1 END";
    let sent = layout.per_level(", ", |level| {
        format!(
            "s_{p} AS (INSERT INTO pgmq.{table} (vt, read_ct, message) \
               SELECT to_timestamp(0), 0, message FROM one \
                WHERE {level_of} = {p} AND {ENTRY} IN (SELECT entry FROM fresh) \
               RETURNING {ENTRY} AS entry)",
            p = level.p,
            table = level.table,
        )
    });
    format!(
        "WITH d AS (DELETE FROM pgmq.{dlq} WHERE {ENTRY} = $entry AND NOT {CANCELLED} \
                    RETURNING message), \
         a AS (DELETE FROM pgmq.{archive} WHERE {ENTRY} = $entry RETURNING message), \
         one AS (SELECT message - 'reason' AS message FROM (SELECT message FROM d \
                 UNION ALL SELECT message FROM a) AS found LIMIT 1), \
         fresh AS (INSERT INTO {ENTRIES} (queue_name, entry, owner, owner_task) \
                   SELECT $queue, {ENTRY}, message->>'tenant', {TASK} FROM one \
                   ON CONFLICT (queue_name, entry) DO UPDATE SET done_until = NULL, \
                      ended_status = NULL WHERE {ENTRIES}.done_until IS NOT NULL \
                   RETURNING entry), \
         {sent} {}",
        union_of("s", "entry")
    )
}

/// Deletes dead letter `$entry`, or every one of the queue when it is `NULL`, from the
/// dead-letter queue and its archive.
fn purge_dead_sql(layout: &PgmqLayout) -> String {
    let (dlq, archive) = &layout.dead;
    let chosen = format!("($entry::bigint IS NULL OR {ENTRY} = $entry)");
    format!(
        "WITH d AS (DELETE FROM pgmq.{dlq} WHERE {chosen} AND NOT {CANCELLED} RETURNING 1), \
         a AS (DELETE FROM pgmq.{archive} WHERE {chosen} RETURNING 1) \
         SELECT (SELECT count(*) FROM d) + (SELECT count(*) FROM a) AS n"
    )
}

/// Moves message `$row_id` of level `$level`, which cannot be used, to the dead-letter queue
/// with the reason `$reason`, and cancels its waiting children.
fn bury_sql(layout: &PgmqLayout, dependencies: Dependencies) -> String {
    let deletes = layout.per_level(", ", |level| {
        format!(
            "g_{p} AS (DELETE FROM pgmq.{table} WHERE {p} = $level AND msg_id = $row_id \
                       RETURNING read_ct, enqueued_at, message)",
            p = level.p,
            table = level.table,
        )
    });
    format!(
        "WITH {deletes}, gone AS ({gone}), \
         letter AS (INSERT INTO pgmq.{dlq} (vt, read_ct, enqueued_at, message) \
            SELECT to_timestamp(0), read_ct, enqueued_at, \
                   (message - 'node') || jsonb_build_object('reason', $reason::text) FROM gone), \
         {ended} SELECT woken FROM ended",
        gone = union_of("g", "read_ct, enqueued_at, message"),
        dlq = layout.dead.0,
        ended = ended_ctes(
            layout,
            "gone",
            Ending::failed(
                "jsonb_build_object('Failed', $reason::text)::text",
                "'could not be read'",
            ),
            dependencies,
        ),
    )
}
