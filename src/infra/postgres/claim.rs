//! A claim on a Postgres queue: what its statement is given ([`ClaimParams`], by name), the
//! parts of the statement both layouts share (what fits, the rank bound, the reserved task),
//! and what it answers ([`Claimed`]).
//!
//! A claim statement is written by its layout (`infra::postgres::queue`,
//! `infra::postgres::pgmq`) with these parameters, each bound from [`ClaimParams`] in
//! [`ClaimParams::value`] and nowhere else:
//!
//! | parameter | value |
//! |---|---|
//! | `$queue` | the queue's name |
//! | `$node` | the claiming node |
//! | `$now_ms` | now, ms since the Unix epoch |
//! | `$expires_ms` | the lease's expiry, ms |
//! | `$max` | at most this many tasks |
//! | `$free_cpu`, `$free_gpu_vram`, `$free_io`, `$free_mixed` | the node's free units per kind ([`fits`]) |
//! | `$unbounded`, `$bound_priority`, `$bound_due`, `$bound_time`, `$bound_entry` | the rank bound ([`within_bound`]; `$bound_due` under the deadline order only) |
//! | `$aged_before` | tasks ranked at or before this time have aged (-1: no starvation rule) |
//! | `$whole_cpu`, ... | the node's whole units per kind, for its reserved task |
//!
//! The statement returns the tasks it claimed, best-ranked first, with the columns
//! `row_id` and `level` (where the row lives, to dead-letter it if it cannot be read),
//! `entry`, `attempt`, `metadata` and `payload`.

use sea_orm::{QueryResult, Value};
use serde::de::DeserializeOwned;

use super::codec::{
    column, entry_from_sql, entry_to_sql, millis_u64, priority_to_sql, task_of, trace_of,
};
use super::named::Params;
use crate::core::{Capacity, FitQuery, Lease, QueueError};
use crate::util::serde::ResourceKind;

/// The resource kinds as parameter names use them, in the kinds' column order
/// ([`ResourceKind::index`]).
const KINDS: [(ResourceKind, &str); ResourceKind::COUNT] = [
    (ResourceKind::Cpu, "cpu"),
    (ResourceKind::GpuVram, "gpu_vram"),
    (ResourceKind::Io, "io"),
    (ResourceKind::Mixed, "mixed"),
];

/// Whose units a [`fits`] expression compares with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Units {
    /// The node's free units (`$free_<kind>`).
    Free,
    /// The node's whole units (`$whole_<kind>`), for its reserved task.
    Whole,
}

/// The units of kind `kind` (a SQL expression holding a kind's index) that `units` has: a
/// `CASE` over the kinds' parameters.
pub(crate) fn fits(kind: &str, units: Units) -> String {
    let prefix = match units {
        Units::Free => "free",
        Units::Whole => "whole",
    };
    let [named @ .., last] = &KINDS;
    let arms: String = named
        .iter()
        .map(|(kind, name)| format!("WHEN {} THEN ${prefix}_{name} ", kind.index()))
        .collect();
    format!("CASE {kind} {arms}ELSE ${prefix}_{} END", last.1)
}

/// A task's rank within its priority as SQL expressions: under the deadline order its
/// deadline first ([`due_of`] its row), then its admission time, then its entry.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RankSql<'a> {
    /// The deadline it ranks by, under the deadline order; `None` under admission order.
    pub due: Option<&'a str>,
    /// Its admission time.
    pub time: &'a str,
    /// Its entry id.
    pub entry: &'a str,
}

impl RankSql<'_> {
    /// The rank as a SQL row: `(due, time, entry)` or `(time, entry)`.
    fn row(&self) -> String {
        match self.due {
            Some(due) => format!("({due}, {}, {})", self.time, self.entry),
            None => format!("({}, {})", self.time, self.entry),
        }
    }

    /// The same columns of another row: `(r.due, r.rank, r.entry)` for `prefix` `r`, or its
    /// parameters for `prefix` `$bound`.
    fn row_of(&self, prefix: &str) -> String {
        let separator = if prefix.starts_with('$') { "_" } else { "." };
        let column = |name: &str| format!("{prefix}{separator}{name}");
        let (time, entry) = if prefix.starts_with('$') {
            (column("time"), column("entry"))
        } else {
            (column("rank"), column("entry"))
        };
        match self.due {
            Some(_) => format!("({}, {time}, {entry})", column("due")),
            None => format!("({time}, {entry})"),
        }
    }
}

/// A deadline as the deadline order ranks it: the column `deadline_ms` (a row's, or
/// `c.deadline_ms`), none after every deadline. The Postgres table queue's `_awake_due`
/// index is on `due_of("deadline_ms")`, which a claim names the same way to walk it.
pub(crate) fn due_of(deadline_ms: &str) -> String {
    format!("COALESCE({deadline_ms}, 9223372036854775807)")
}

/// Whether a task of rank `priority`, `rank` is ranked at or ahead of the claim's rank
/// bound (always, without one).
pub(crate) fn within_bound(priority: &str, rank: &RankSql<'_>) -> String {
    format!(
        "($unbounded OR {priority} > $bound_priority OR ({priority} = $bound_priority \
         AND {} <= {}))",
        rank.row(),
        rank.row_of("$bound")
    )
}

/// Whether a task of rank `priority`, `rank` is *not* ranked behind the node's reserved task
/// while that task does not fit the free units. The statement names its reserved task
/// (none, or one row) `reserved`, with columns `priority`, `rank` (its admission time),
/// `entry`, `kind` and `units`, and `due` under the deadline order.
pub(crate) fn not_behind_reserved(priority: &str, rank: &RankSql<'_>) -> String {
    format!(
        "NOT EXISTS (SELECT 1 FROM reserved AS r WHERE r.units > {free} \
           AND ({priority} < r.priority OR ({priority} = r.priority \
                AND {} > {})))",
        rank.row(),
        rank.row_of("r"),
        free = fits("r.kind", Units::Free)
    )
}

/// The values of a claim statement (see the module docs).
#[derive(Debug, Clone, Copy)]
pub(crate) struct ClaimParams<'a> {
    /// The queue's name.
    pub queue: &'a str,
    /// The claiming node.
    pub node: &'a str,
    /// What the node may take.
    pub query: &'a FitQuery,
    /// Now, ms since the Unix epoch.
    pub now_ms: u64,
    /// When the leases run out, ms since the Unix epoch.
    pub expires_at_ms: u64,
    /// At most this many tasks.
    pub max: usize,
}

impl Params for ClaimParams<'_> {
    fn value(&self, name: &str) -> Option<Value> {
        if let Some(kind) = name.strip_prefix("free_") {
            return units_of(self.query.free, kind);
        }
        if let Some(kind) = name.strip_prefix("whole_") {
            let whole = self
                .query
                .starvation
                .map_or(Capacity::uniform(0), |rule| rule.capacity);
            return units_of(whole, kind);
        }
        let bound = self.query.bound;
        Some(match name {
            "queue" => self.queue.to_owned().into(),
            "node" => self.node.to_owned().into(),
            "now_ms" => millis_u64(self.now_ms).into(),
            "expires_ms" => millis_u64(self.expires_at_ms).into(),
            "max" => i64::try_from(self.max).unwrap_or(i64::MAX).into(),
            "unbounded" => bound.is_none().into(),
            "bound_priority" => bound.map_or(0, |b| priority_to_sql(b.priority)).into(),
            "bound_time" => bound.map_or(0, |b| millis_u64(b.rank_time_ms)).into(),
            "bound_entry" => bound.map_or(0, |b| entry_to_sql(b.entry)).into(),
            "bound_due" => bound
                .and_then(|b| b.deadline_ms)
                .map_or(i64::MAX, millis_u64)
                .into(),
            // The node's reserved task (see `StarvationRule`): the best-ranked aged task its
            // whole capacity could run. When it does not fit now, only tasks ranked at or
            // ahead of it may be claimed.
            "aged_before" => self
                .query
                .starvation
                .map_or(-1, |rule| millis_u64(rule.parked_before_ms))
                .into(),
            _ => return None,
        })
    }
}

/// The units of the kind named `kind` in `units`, as a `BIGINT`.
fn units_of(units: Capacity, kind: &str) -> Option<Value> {
    KINDS
        .iter()
        .find(|(_, name)| *name == kind)
        .map(|(kind, _)| Value::from(i64::from(units.get(*kind))))
}

/// What one claim statement took.
pub(crate) struct Claimed<P> {
    /// The leases on the tasks that could be read, best-ranked first.
    pub leases: Vec<Lease<P>>,
    /// The claimed rows whose task could not be read: each is to be dead-lettered.
    pub unreadable: Vec<Unreadable>,
}

/// A claimed row whose task cannot be read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Unreadable {
    /// The row's id in its table.
    pub row_id: i64,
    /// The row's priority level (the table of a queue with one table per level).
    pub level: i16,
    /// Why it cannot be read.
    pub reason: String,
}

/// Reads the rows of `backend`'s claim statement, leased until `expires_at_ms`.
pub(crate) fn claimed_rows<P: DeserializeOwned>(
    backend: &str,
    rows: &[QueryResult],
    expires_at_ms: u64,
) -> Result<Claimed<P>, QueueError> {
    let mut claimed = Claimed {
        leases: Vec::with_capacity(rows.len()),
        unreadable: Vec::new(),
    };
    for row in rows {
        match task_of::<P>(row) {
            Ok(task) => {
                let entry: i64 = column(backend, row, "entry")?;
                let attempt: i32 = column(backend, row, "attempt")?;
                claimed.leases.push(Lease {
                    entry: entry_from_sql(entry),
                    task,
                    attempt: u32::try_from(attempt).unwrap_or(0),
                    expires_at_ms,
                    trace: trace_of(backend, row),
                });
            }
            Err(reason) => claimed.unreadable.push(Unreadable {
                row_id: column(backend, row, "row_id")?,
                level: column(backend, row, "level")?,
                reason,
            }),
        }
    }
    Ok(claimed)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::{RankBound, StarvationRule};
    use crate::infra::postgres::named::NamedSql;
    use crate::util::serde::Priority;

    #[test]
    fn what_fits_is_a_case_over_the_kinds_in_their_column_order() {
        assert_eq!(
            fits("kind", Units::Free),
            "CASE kind WHEN 0 THEN $free_cpu WHEN 1 THEN $free_gpu_vram WHEN 2 THEN $free_io \
             ELSE $free_mixed END"
        );
        assert!(fits("r.kind", Units::Whole).contains("WHEN 1 THEN $whole_gpu_vram"));
    }

    #[test]
    fn every_parameter_of_a_claim_is_bound_by_name() {
        let query = FitQuery {
            free: Capacity::uniform(0)
                .with(ResourceKind::GpuVram, 24)
                .with(ResourceKind::Mixed, 2),
            bound: Some(RankBound {
                priority: Priority::High,
                deadline_ms: Some(7),
                rank_time_ms: 5,
                entry: 9,
            }),
            starvation: Some(StarvationRule {
                capacity: Capacity::uniform(80),
                parked_before_ms: 3,
            }),
        };
        let params = ClaimParams {
            queue: "llm",
            node: "gpu-1",
            query: &query,
            now_ms: 1_000,
            expires_at_ms: 31_000,
            max: 16,
        };
        let sql = NamedSql::new(&format!(
            "SELECT $queue, $node, $now_ms, $expires_ms, $max, $aged_before, {}, {}, {}",
            fits("k", Units::Free),
            fits("k", Units::Whole),
            within_bound(
                "p",
                &RankSql {
                    due: Some("d"),
                    time: "t",
                    entry: "e"
                }
            ),
        ));
        let values = sql.bind(&params).expect("every name is bound");
        let expected: Vec<Value> = vec![
            "llm".into(),
            "gpu-1".into(),
            1_000_i64.into(),
            31_000_i64.into(),
            16_i64.into(),
            3_i64.into(),
            0_i64.into(),
            24_i64.into(),
            0_i64.into(),
            2_i64.into(),
            80_i64.into(),
            80_i64.into(),
            80_i64.into(),
            80_i64.into(),
            false.into(),
            2_i16.into(),
            7_i64.into(),
            5_i64.into(),
            entry_to_sql(9).into(),
        ];
        assert_eq!(values, expected);
        assert_eq!(params.value("free_gold"), None, "no such kind");
    }
}
