//! What the fleet view reads of a pgmq queue's parked tasks: the statements that list them in
//! rank order, find one with its place, and name the tenants waiting
//! (`infra::postgres::fleet::view` runs them, as it runs the table queue's).
//!
//! A parked task is a message no node holds (see [`queue`](super::queue)). Each statement
//! reads it into the columns the table queue's rows have, so one reader serves both layouts:
//! `priority` is its level's rank number, `rank_time_ms` and `entry` come from its body,
//! `attempts` is PGMQ's `read_ct` (the claims it had), `not_before_ms` is its `vt` (a
//! scheduled start, or a retry's or rescue's backoff: when a claim may take it; never, as on
//! the table, for a child waiting for its parents), `last_error` is the reason its last run
//! gave for a retry, and `pending_parents` how many parents a held child still waits for.
//!
//! Rank order across the levels is the levels, best first, each in `(rank, entry)` order: a
//! page from `$2` of `$3` tasks takes at most `$2 + $3` messages of each level, in the order
//! of the level's rank index, and orders those. The page's `total` counts every parked
//! message (index-only scans of the rank indexes): with 200,000 parked messages on two
//! levels, a page of 50 from offset 50 read 100 rows per level in 0.2 ms, and the count took
//! most of the statement's 65 ms (`EXPLAIN ANALYZE`, the shared 2-core test machine).

use super::dependencies::HELD;
use super::layout::{DUE, ENTRY, LEVELS, PARKED, RANK, TASK};
use super::queue::check_queue_name;
use crate::core::{PoolError, QueueOrder};
use crate::infra::postgres::codec::DATABASE_NOW_MS;
use crate::infra::postgres::Identifier;

/// The columns of a parked message, as the fleet view reads a table queue's row, with its
/// deadline as the deadline order ranks it (`due`).
fn columns(p: i16) -> String {
    format!(
        "{DUE} AS due, {ENTRY} AS entry, {TASK} AS task_id, coalesce(message->>'tenant', '') AS tenant, \
         message->>'user' AS user_id, message->>'session' AS session_id, \
         {p}::smallint AS priority, (message->>'kind')::smallint AS kind, \
         (message->>'units')::bigint AS units, {RANK} AS rank_time_ms, read_ct AS attempts, \
         CASE WHEN vt = {HELD} THEN {never} \
              ELSE (extract(epoch FROM vt) * 1000)::bigint END AS not_before_ms, \
         message->>'error' AS last_error, \
         COALESCE((message->>'pending')::int, 0) AS pending_parents",
        never = i64::MAX,
    )
}

/// The PGMQ tables of queue `name`'s levels, best first, with their rank numbers.
fn level_tables(name: &str) -> Result<Vec<(i16, Identifier)>, PoolError> {
    let name = check_queue_name(name)?;
    LEVELS
        .iter()
        .map(|(p, suffix)| Ok((*p, Identifier::new(&format!("q_{name}_{suffix}"))?)))
        .collect()
}

/// One part per level, joined by `separator`.
fn per_level(
    levels: &[(i16, Identifier)],
    separator: &str,
    part: impl Fn(i16, &Identifier) -> String,
) -> String {
    levels
        .iter()
        .map(|(p, table)| part(*p, table))
        .collect::<Vec<_>>()
        .join(separator)
}

/// How many messages of queue `name` are parked, as a `bigint` expression.
fn parked_count(levels: &[(i16, Identifier)]) -> String {
    let counts = per_level(levels, " + ", |_, table| {
        format!("(SELECT count(*) FROM pgmq.{table} WHERE {PARKED})")
    });
    format!("({counts})::bigint")
}

/// The rank within a level in `order`: of a message (`message`, or `a.message` for
/// `prefix` `a.`), and of the columns [`columns`] reads.
fn rank_in(order: QueueOrder, prefix: &str) -> (String, &'static str) {
    let of = |column: &str| column.replace("message", &format!("{prefix}message"));
    match order {
        QueueOrder::Fifo => (
            format!("{}, {}", of(RANK), of(ENTRY)),
            "rank_time_ms, entry",
        ),
        QueueOrder::Deadline => (
            format!("{}, {}, {}", of(DUE), of(RANK), of(ENTRY)),
            "due, rank_time_ms, entry",
        ),
    }
}

/// A page of queue `name`'s parked tasks in rank order (`order` within a level): from
/// `$2`, at most `$3`, each with `now_ms` and `total` (every parked task). `$1` (the table
/// queue's name) is not read.
pub(crate) fn page_sql(name: &str, order: QueueOrder) -> Result<String, PoolError> {
    let levels = level_tables(name)?;
    let (rank, columns_rank) = rank_in(order, "");
    let heads = per_level(&levels, " UNION ALL ", |p, table| {
        format!(
            "(SELECT {columns} FROM pgmq.{table} WHERE {PARKED} \
               ORDER BY {rank} LIMIT $2 + $3)",
            columns = columns(p),
        )
    });
    Ok(format!(
        "SELECT *, {DATABASE_NOW_MS} AS now_ms, {total} AS total \
           FROM ({heads}) AS parked \
          ORDER BY priority DESC, {columns_rank} OFFSET $2 LIMIT $3",
        total = parked_count(&levels),
    ))
}

/// The parked task `$3` of tenant `$2`, user `$4`, session `$5` in queue `name`, with
/// `now_ms` and `ahead` (the parked tasks ranked before it); no row when none is parked.
pub(crate) fn one_sql(name: &str, order: QueueOrder) -> Result<String, PoolError> {
    let levels = level_tables(name)?;
    let (a_rank, t_rank) = (rank_in(order, "a.").0, rank_in(order, "").1);
    let t_rank = t_rank
        .split(", ")
        .map(|column| format!("t.{column}"))
        .collect::<Vec<_>>()
        .join(", ");
    let found = per_level(&levels, " UNION ALL ", |p, table| {
        format!(
            "(SELECT {columns} FROM pgmq.{table} WHERE {PARKED} AND {TASK} = $3 \
                AND message->>'tenant' = $2 AND message->>'user' IS NOT DISTINCT FROM $4 \
                AND message->>'session' IS NOT DISTINCT FROM $5)",
            columns = columns(p),
        )
    });
    let ahead = per_level(&levels, " + ", |p, table| {
        format!(
            "(SELECT count(*) FROM pgmq.{table} AS a WHERE {parked} \
                AND ({p} > t.priority OR ({p} = t.priority \
                     AND ({a_rank}) < ({t_rank}))))",
            parked = PARKED.replace("message", "a.message"),
        )
    });
    Ok(format!(
        "SELECT t.*, {DATABASE_NOW_MS} AS now_ms, ({ahead})::bigint AS ahead \
           FROM (SELECT * FROM ({found}) AS found \
                  ORDER BY priority DESC, {columns_rank} LIMIT 1) AS t",
        columns_rank = rank_in(order, "").1
    ))
}

/// The tenants with a task parked in queue `name`. `$1` is not read.
pub(crate) fn tenants_sql(name: &str) -> Result<String, PoolError> {
    let levels = level_tables(name)?;
    let tenants = per_level(&levels, " UNION ", |_, table| {
        format!(
            "SELECT coalesce(message->>'tenant', '') AS tenant FROM pgmq.{table} \
              WHERE {PARKED}"
        )
    });
    Ok(tenants)
}

/// How many messages of queue `name` node `n.node` holds: a `bigint` expression over the
/// node table's row `n`.
pub(crate) fn claims_sql(name: &str) -> Result<String, PoolError> {
    let levels = level_tables(name)?;
    let claims = per_level(&levels, " + ", |_, table| {
        // Held messages only: their partial index (`vt`) finds them without the parked ones.
        format!(
            "(SELECT count(*) FROM pgmq.{table} AS q \
               WHERE NOT {parked} AND q.message->>'node' = n.node)",
            parked = PARKED.replace("message", "q.message"),
        )
    });
    Ok(format!("({claims})::bigint"))
}
