//! Budgets a fleet shares: the token buckets of a shared queue's nodes (rule 15 across
//! processes), one row per queue and kind in [`BUDGETS_TABLE`].
//!
//! A row holds a bucket exactly as the core keeps one (`core/budget.rs`): the level in units
//! times the period in ms, so a millisecond's refill is the whole number `units`, and the
//! level is capped at `burst * per_ms`; a start cap is a second bucket beside it. Every node
//! refills and spends a row in the transaction of its claim:
//!
//! 1. the claim's first statement brings the queue's rows to the database's clock (one clock
//!    for every node, whatever their own say) and locks them until the claim commits, so
//!    claims of a budgeted queue take turns;
//! 2. the claim takes only tasks whose units of a kind fit the row's whole units, and no more
//!    tasks than the start caps have starts (see [`FleetLevels::limit`]);
//! 3. the units and starts of the tasks it took are spent from the rows, and the transaction
//!    commits: the claim and its spending are one.
//!
//! So the fleet spends what one pool would: at most `burst + units * t / per_ms` in any span
//! of `t` ms. A node that crashes after its claim committed has spent its tasks' units (the
//! provider may well have seen the requests); their rerun elsewhere spends them again.

use std::sync::Arc;

use sea_orm::{ConnectionTrait, DatabaseTransaction, DbErr, QueryResult, Value};

use super::codec::{column, DATABASE_NOW_MS};
use super::PgDatabase;
use crate::core::{Budgets, FitQuery, TaskMetadata};
use crate::util::serde::ResourceKind;

/// The table every queue's shared budgets live in.
pub(crate) const BUDGETS_TABLE: &str = "pl_fleet_budgets";

/// The budgets table: one row per queue (`queue_key`, the queue's place and name) and kind.
pub(crate) fn budgets_table() -> String {
    format!(
        r#"
CREATE TABLE IF NOT EXISTS {BUDGETS_TABLE} (
    queue_key    TEXT     NOT NULL,
    kind         SMALLINT NOT NULL,
    units        BIGINT   NOT NULL,
    per_ms       BIGINT   NOT NULL,
    burst        BIGINT   NOT NULL,
    level        BIGINT   NOT NULL,
    start_count  BIGINT   NULL,
    start_per_ms BIGINT   NULL,
    start_level  BIGINT   NULL,
    at_ms        BIGINT   NOT NULL,
    PRIMARY KEY (queue_key, kind)
);
"#
    )
}

/// One queue's budgets as kept in the table: what a claim of the queue refills and spends.
#[derive(Debug)]
pub(crate) struct FleetBudgets {
    /// The queue's rows' key.
    key: String,
}

/// A budget row as the share statement takes it (one element of its `$rows` JSON array).
#[derive(serde::Serialize)]
struct ShareRow {
    kind: i16,
    units: i64,
    per_ms: i64,
    burst: i64,
    start_count: Option<i64>,
    start_per_ms: Option<i64>,
}

/// Writes `budgets` for the queue keyed `$1` (`$2`, [`ShareRow`]s): a new row starts full;
/// a row whose budget is the same keeps its level; one whose budget changed keeps its whole
/// units, at most the new burst.
fn share_sql() -> String {
    format!(
        "INSERT INTO {BUDGETS_TABLE} AS b (queue_key, kind, units, per_ms, burst, level, \
            start_count, start_per_ms, start_level, at_ms) \
         SELECT $1, s.kind, s.units, s.per_ms, s.burst, s.burst * s.per_ms, s.start_count, \
                s.start_per_ms, s.start_count * s.start_per_ms, {DATABASE_NOW_MS} \
           FROM jsonb_to_recordset($2::jsonb) AS s(kind SMALLINT, units BIGINT, \
                per_ms BIGINT, burst BIGINT, start_count BIGINT, start_per_ms BIGINT) \
         ON CONFLICT (queue_key, kind) DO UPDATE SET \
           level = CASE WHEN (b.units, b.per_ms, b.burst) \
                             = (EXCLUDED.units, EXCLUDED.per_ms, EXCLUDED.burst) THEN b.level \
                        ELSE LEAST(b.level / b.per_ms, EXCLUDED.burst) * EXCLUDED.per_ms END, \
           start_level = CASE WHEN (b.start_count, b.start_per_ms) IS NOT DISTINCT FROM \
                                   (EXCLUDED.start_count, EXCLUDED.start_per_ms) \
                              THEN b.start_level ELSE EXCLUDED.start_level END, \
           units = EXCLUDED.units, per_ms = EXCLUDED.per_ms, burst = EXCLUDED.burst, \
           start_count = EXCLUDED.start_count, start_per_ms = EXCLUDED.start_per_ms"
    )
}

impl FleetBudgets {
    /// Writes `budgets` for the queue keyed `key` (see [`share_sql`]) and returns its handle.
    pub(crate) async fn share(
        database: &PgDatabase,
        key: String,
        budgets: &Budgets,
    ) -> Result<Arc<Self>, DbErr> {
        let rows: Vec<ShareRow> = budgets
            .iter()
            .map(|(kind, budget)| ShareRow {
                kind: kind_to_sql(kind),
                units: i64::from(budget.units),
                per_ms: i64::try_from(budget.per_ms).unwrap_or(i64::MAX),
                burst: i64::from(budget.burst),
                start_count: budget.max_starts.map(|cap| i64::from(cap.count)),
                start_per_ms: budget
                    .max_starts
                    .map(|cap| i64::try_from(cap.per_ms).unwrap_or(i64::MAX)),
            })
            .collect();
        let rows = serde_json::to_string(&rows)
            .map_err(|error| DbErr::Custom(format!("budget rows: {error}")))?;
        let values: Vec<Value> = vec![key.clone().into(), rows.into()];
        database.rows(share_sql(), values).await?;
        Ok(Arc::new(Self { key }))
    }

    /// Brings the queue's rows to the database's clock and locks them for the rest of
    /// `transaction`; returns what they hold now.
    pub(crate) async fn refill(
        &self,
        transaction: &DatabaseTransaction,
    ) -> Result<FleetLevels, DbErr> {
        let sql = format!(
            "UPDATE {BUDGETS_TABLE} AS b SET \
               level = LEAST(b.burst * b.per_ms, \
                             b.level + GREATEST(0, clock.ms - b.at_ms) * b.units), \
               start_level = LEAST(b.start_count * b.start_per_ms, \
                             b.start_level + GREATEST(0, clock.ms - b.at_ms) * b.start_count), \
               at_ms = GREATEST(b.at_ms, clock.ms) \
             FROM (SELECT {DATABASE_NOW_MS} AS ms) AS clock \
             WHERE b.queue_key = $1 \
             RETURNING b.kind, b.level / b.per_ms AS whole, \
                       b.start_level / b.start_per_ms AS starts"
        );
        let rows = transaction
            .query_all_raw(PgDatabase::statement(sql, [self.key.clone().into()]))
            .await?;
        let mut levels = FleetLevels::default();
        for row in rows {
            let kind: i16 = row.try_get("", "kind")?;
            let Some(kind) = kind_from_sql(kind) else {
                continue;
            };
            let whole: i64 = row.try_get("", "whole")?;
            let starts: Option<i64> = row.try_get("", "starts")?;
            levels.units[kind.index()] = Some(u32::try_from(whole.max(0)).unwrap_or(u32::MAX));
            if let Some(starts) = starts {
                let starts = usize::try_from(starts.max(0)).unwrap_or(usize::MAX);
                levels.starts = Some(levels.starts.map_or(starts, |least| least.min(starts)));
            }
        }
        Ok(levels)
    }

    /// Spends from the queue's rows the units and starts of the tasks a claim took (`rows`,
    /// the claim's answer), in `transaction`.
    pub(crate) async fn spend(
        &self,
        transaction: &DatabaseTransaction,
        claimed: &[QueryResult],
    ) -> Result<(), DbErr> {
        let mut spent = [(0_i64, 0_i64); ResourceKind::COUNT];
        for row in claimed {
            // A task that cannot be read is dead-lettered, not run: it spends nothing.
            let Ok(metadata) = column::<String>("budget", row, "metadata") else {
                continue;
            };
            let Ok(meta) = serde_json::from_str::<TaskMetadata>(&metadata) else {
                continue;
            };
            let (units, starts) = &mut spent[meta.cost.kind.index()];
            *units += i64::from(meta.cost.units);
            *starts += 1;
        }
        let rows: Vec<serde_json::Value> = ResourceKind::ALL
            .into_iter()
            .zip(spent)
            .filter(|(_, (_, starts))| *starts > 0)
            .map(|(kind, (units, starts))| {
                serde_json::json!({ "kind": kind_to_sql(kind), "units": units, "starts": starts })
            })
            .collect();
        if rows.is_empty() {
            return Ok(());
        }
        let sql = format!(
            "UPDATE {BUDGETS_TABLE} AS b SET \
               level = GREATEST(0, b.level - s.units * b.per_ms), \
               start_level = GREATEST(0, b.start_level - s.starts * b.start_per_ms) \
             FROM jsonb_to_recordset($2::jsonb) AS s(kind SMALLINT, units BIGINT, starts BIGINT) \
             WHERE b.queue_key = $1 AND b.kind = s.kind"
        );
        let values: Vec<Value> = vec![
            self.key.clone().into(),
            serde_json::Value::Array(rows).to_string().into(),
        ];
        transaction
            .execute_raw(PgDatabase::statement(sql, values))
            .await
            .map(drop)
    }

    /// Puts `units` back into the queue's bucket of `kind`, at most its burst.
    pub(crate) async fn give_back(
        &self,
        database: &PgDatabase,
        kind: ResourceKind,
        units: u32,
    ) -> Result<(), DbErr> {
        let sql = format!(
            "UPDATE {BUDGETS_TABLE} SET level = LEAST(burst * per_ms, level + $3 * per_ms) \
             WHERE queue_key = $1 AND kind = $2"
        );
        let values: Vec<Value> = vec![
            self.key.clone().into(),
            kind_to_sql(kind).into(),
            i64::from(units).into(),
        ];
        database.rows(sql, values).await.map(drop)
    }
}

/// What a queue's buckets hold as a claim begins.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct FleetLevels {
    /// Whole units per kind with a budget.
    units: [Option<u32>; ResourceKind::COUNT],
    /// The fewest whole starts left among the kinds whose starts are capped, if any is.
    starts: Option<usize>,
}

impl FleetLevels {
    /// `query` and `max` within these levels: no kind's free units above its bucket's, and
    /// no more tasks than the fewest starts left. (A claim statement counts tasks, not tasks
    /// per kind, so under a start cap it takes no more tasks of any kind than that cap
    /// allows: more cautious than needed for a pool that mixes kinds, never less.)
    pub(crate) fn limit(&self, mut query: FitQuery, max: usize) -> (FitQuery, usize) {
        for kind in ResourceKind::ALL {
            if let Some(level) = self.units[kind.index()] {
                query.free = query.free.with(kind, query.free.get(kind).min(level));
            }
        }
        (query, self.starts.map_or(max, |starts| max.min(starts)))
    }
}

fn kind_to_sql(kind: ResourceKind) -> i16 {
    i16::try_from(kind.index()).unwrap_or(i16::MAX)
}

fn kind_from_sql(kind: i16) -> Option<ResourceKind> {
    let index = usize::try_from(kind).ok()?;
    ResourceKind::ALL.into_iter().find(|k| k.index() == index)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::Capacity;

    #[test]
    fn a_claim_is_limited_to_the_buckets_whole_units_and_the_fewest_starts() {
        let mut levels = FleetLevels::default();
        levels.units[ResourceKind::Io.index()] = Some(30);
        levels.starts = Some(2);
        let query = FitQuery::within(Capacity::uniform(100));
        let (limited, max) = levels.limit(query, 16);
        assert_eq!(limited.free.get(ResourceKind::Io), 30);
        assert_eq!(
            limited.free.get(ResourceKind::Cpu),
            100,
            "no budget, no limit"
        );
        assert_eq!(max, 2);
        let (_, max) = FleetLevels::default().limit(query, 16);
        assert_eq!(max, 16);
    }

    #[test]
    fn kinds_go_to_sql_as_their_index_and_back() {
        for kind in ResourceKind::ALL {
            assert_eq!(kind_from_sql(kind_to_sql(kind)), Some(kind));
        }
        assert_eq!(kind_from_sql(-1), None);
        assert_eq!(kind_from_sql(99), None);
    }
}
