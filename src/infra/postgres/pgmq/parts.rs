//! The SQL pieces the pgmq layout's statements (`statements.rs`) and its functions
//! (`dependencies.rs`, `bounded.rs`) share: a message's body, an instant as a visibility
//! time, one task's park inside a function, and the park of a group.

use super::layout::{Dependencies, PgmqLayout, ENTRIES, ENTRY, LEVELS};

/// The body of the message of a parked row `item` (a JSON row of `ParkRows`).
pub(super) const MESSAGE: &str =
    "jsonb_build_object('entry', item->'entry', 'rank', item->'rank_time_ms', \
     'kind', item->'kind', 'units', item->'units', 'tenant', item->'tenant', \
     'user', item->'user_id', 'session', item->'session_id', 'task', item->'task_id', \
     'meta', item->'metadata', 'payload', item->'payload', 'trace', item->'traceparent', \
     'deadline', item->'deadline_ms')";

/// Inside a function of the queue: registers the entry of the parked row in JSON variable
/// `rec` (its caller too, if it attaches), its entry into variable `into` (`NULL` when the
/// entry or caller is stored already).
pub(super) fn register_one(layout: &PgmqLayout, rec: &str, into: &str) -> String {
    let attach = format!("COALESCE(({rec}->>'attach')::boolean, false)");
    format!(
        "INSERT INTO {ENTRIES} AS registry (queue_name, entry, tenant, task_id, user_id, session_id, \
                                owner, owner_task) \
         SELECT '{name}', ({rec}->>'entry')::bigint, CASE WHEN {attach} THEN {rec}->>'tenant' END, \
                CASE WHEN {attach} THEN ({rec}->>'task_id')::bigint END, \
                CASE WHEN {attach} THEN {rec}->>'user_id' END, \
                CASE WHEN {attach} THEN {rec}->>'session_id' END, \
                {rec}->>'tenant', ({rec}->>'task_id')::bigint \
         ON CONFLICT DO NOTHING RETURNING registry.entry INTO {into};",
        name = layout.name,
    )
}

/// Inside a function of the queue: sends the message `body`, visible from `vt`, to the
/// level of priority `priority` (all three SQL expressions).
pub(super) fn send_one(layout: &PgmqLayout, priority: &str, vt: &str, body: &str) -> String {
    let levels = layout.per_level(" ELSIF ", |level| {
        format!(
            "{priority} = {p} THEN INSERT INTO pgmq.{table} (vt, message) VALUES ({vt}, {body});",
            p = level.p,
            table = level.table,
        )
    });
    format!("IF {levels} ELSE RAISE EXCEPTION 'priority % has no level', {priority}; END IF;")
}

/// The latest instant a message's visibility time holds, ms since the Unix epoch (in the
/// year 287,000; a `timestamptz` ends in 294,276): a later one, a start that never comes in
/// practice, is held there.
const LATEST_MS: i64 = 9_000_000_000_000_000;

/// A time in milliseconds (a `BIGINT` expression) as a `timestamptz`, at most [`LATEST_MS`].
pub(super) fn at_ms(ms: &str) -> String {
    format!("to_timestamp(LEAST(({ms})::bigint, {LATEST_MS}) / 1000.0)")
}

/// `UNION ALL` of `SELECT {columns} FROM {cte}_<p>` over the levels.
pub(super) fn union_of(cte: &str, columns: &str) -> String {
    LEVELS
        .iter()
        .map(|(p, _)| format!("SELECT {columns} FROM {cte}_{p}"))
        .collect::<Vec<_>>()
        .join(" UNION ALL ")
}

/// The park statement of the layout's `park` (`statements.rs`), parking the rows of `rows` (a JSON array expression) in queue
/// `queue` (a text expression), answered by `answer` of the query over the entries sent
/// (`entry`): the same text inside a function that parks a group (`bounded.rs`). Where
/// dependencies are kept, each registry row names its task's owner, for the children that
/// name it.
pub(super) fn park_group(
    layout: &PgmqLayout,
    claimed: bool,
    dependencies: Dependencies,
    rows: &str,
    queue: &str,
    answer: impl Fn(&str) -> String,
) -> String {
    let (vt, read_ct, message) = if claimed {
        (
            at_ms("$expires_ms"),
            1,
            "message || jsonb_build_object('node', $node::text)",
        )
    } else {
        // Visible from its not-before instant (a scheduled start), else at once.
        ("vt".to_owned(), 0, "message")
    };
    let sent = layout.per_level(", ", |level| {
        format!(
            "s_{p} AS (INSERT INTO pgmq.{table} (vt, read_ct, message) \
               SELECT {vt}, {read_ct}, {message} FROM chosen WHERE p = {p} \
               RETURNING {ENTRY} AS entry)",
            p = level.p,
            table = level.table,
        )
    });
    format!(
        "WITH input AS (SELECT (item->>'priority')::smallint AS p, \
                               (item->>'entry')::bigint AS entry, ord, {MESSAGE} AS message, \
                               COALESCE((item->>'attach')::boolean, false) AS attach, \
                               item->>'tenant' AS tenant, (item->>'task_id')::bigint AS task_id, \
                               item->>'user_id' AS user_id, item->>'session_id' AS session_id, \
                               {not_before} AS vt \
                          FROM jsonb_array_elements({rows}) WITH ORDINALITY AS i(item, ord)), \
         fresh AS (INSERT INTO {ENTRIES} (queue_name, entry, tenant, task_id, user_id, \
                                          session_id, owner, owner_task) \
                   SELECT {queue}, entry, CASE WHEN attach THEN tenant END, \
                          CASE WHEN attach THEN task_id END, CASE WHEN attach THEN user_id END, \
                          CASE WHEN attach THEN session_id END, {owner} FROM input \
                   ON CONFLICT DO NOTHING RETURNING entry), \
         chosen AS (SELECT DISTINCT ON (entry) p, message, vt FROM input \
                     WHERE entry IN (SELECT entry FROM fresh) ORDER BY entry, ord), \
         {sent} {}",
        answer(&union_of("s", "entry")),
        owner = match dependencies {
            Dependencies::Kept => "tenant, task_id",
            Dependencies::Off => "NULL, NULL",
        },
        not_before = at_ms("COALESCE((item->>'not_before_ms')::bigint, 0)"),
    )
}
