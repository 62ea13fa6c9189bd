//! Running a queue's statements on the database's runtime: one that returns rows, and a claim,
//! which runs under planner settings of its own.

use std::sync::Arc;

use sea_orm::{ConnectionTrait, DbErr, QueryResult, TransactionTrait, Value};

use super::budgets::FleetBudgets;
use super::named::NamedSql;
use super::service::{FairParams, FleetService, OwnedClaim};
use super::PgDatabase;
use crate::core::FitQuery;
use crate::util::serde::ResourceKind;

/// The planner settings a claim runs under (see [`PgDatabase::claim`]).
///
/// A claim runs in a transaction of its own under these settings, because a queue table's
/// statistics are wrong most of the time: it swings from empty to many thousand rows
/// between two `ANALYZE` runs, and one taken while it was nearly empty (with the pages
/// its dead rows left behind) makes the planner expect a few dozen parked rows. It then
/// reads them all and sorts them, on every claim: 28 ms instead of 1 ms for 256 of
/// 20,000 rows. With the full read, the bitmap read and the sort ruled out (an incremental
/// sort too: under the deadline order it would walk the `_awake` index, already in
/// priority order, and sort each priority's rows by deadline, rather than walk
/// `_awake_due`), the only plan left is the walk of the rank index in order, which stops
/// at the rows it takes; JIT
/// compilation is turned off because the cost those rules add to the other plans would
/// otherwise set it off (about 300 ms). The settings end with the transaction. Costs
/// three round trips more per claim, each claim taking up to hundreds of tasks.
const CLAIM_PLANNER: &str = "SET LOCAL enable_seqscan = off; SET LOCAL enable_bitmapscan = off; \
                             SET LOCAL enable_sort = off; SET LOCAL enable_incremental_sort = off; \
                             SET LOCAL jit = off";

/// One claim, as [`PgDatabase::claim`] runs it.
pub(crate) struct ClaimRun {
    /// The claim statement (under the fleet's counters, the one restricted to `$tenant`).
    pub sql: NamedSql,
    /// Who claims, when, and until when.
    pub claim: OwnedClaim,
    /// What the node may take.
    pub query: FitQuery,
    /// At most this many tasks.
    pub max: usize,
    /// The fleet's budgets, where the queue keeps them.
    pub budgets: Option<Arc<FleetBudgets>>,
    /// The fleet's tenant counters and the statement that picks the tenant to claim for,
    /// where the queue's nodes share fairly by use.
    pub fair: Option<(Arc<FleetService>, NamedSql)>,
}

impl PgDatabase {
    /// Runs a statement and returns its rows (none for a statement that returns none).
    pub(crate) async fn rows(
        &self,
        sql: String,
        values: Vec<Value>,
    ) -> Result<Vec<QueryResult>, DbErr> {
        self.run(
            move |db| async move { db.query_all_raw(PgDatabase::statement(sql, values)).await },
        )
        .await
    }

    /// Runs a claim: in one transaction under [`CLAIM_PLANNER`], the claim statement takes
    /// the rows the node may have, and the queue's capabilities do their part in the same
    /// transaction where the queue has them:
    ///
    /// - the fleet's budgets ([`budgets`](super::budgets)) are refilled and locked first, the
    ///   claim takes no more than their levels allow, and what it took is spent; a claim the
    ///   buckets allow nothing runs no statement;
    /// - under the fleet's tenant counters (`service.rs`), the claim takes one task at a time
    ///   for the tenant the fleet served least that has a task fitting the free units, and
    ///   charges it, until `max` tasks or nothing fits;
    /// - with neither, it is the one statement, taking every task that fits.
    pub(crate) async fn claim(&self, claim: ClaimRun) -> Result<Vec<QueryResult>, DbErr> {
        self.run(move |db| async move {
            let ClaimRun {
                sql,
                claim,
                query,
                max,
                budgets,
                fair,
            } = claim;
            let transaction = db.begin().await?;
            if let Some((service, _)) = &fair {
                service.lock(&transaction).await?;
            }
            let (mut query, max) = match &budgets {
                Some(fleet) => fleet.refill(&transaction).await?.limit(query, max),
                None => (query, max),
            };
            transaction.execute_unprepared(CLAIM_PLANNER).await?;
            // A claim within budgets or by the counters stops when nothing is left to take;
            // a plain claim always asks once.
            let bounded = budgets.is_some() || fair.is_some();
            let mut rows = Vec::new();
            while rows.len() < max && !(bounded && query.free.is_empty()) {
                let (pick, claimed) = match &fair {
                    None => {
                        let values = sql
                            .bind(&claim.params(&query, max))
                            .map_err(DbErr::Custom)?;
                        let claimed = transaction
                            .query_all_raw(PgDatabase::statement(sql.text().to_owned(), values))
                            .await?;
                        (None, claimed)
                    }
                    Some((service, pick_sql)) => {
                        let params = |tenant| FairParams {
                            claim: &claim,
                            query: &query,
                            max: 1,
                            service,
                            tenant,
                        };
                        let values = pick_sql.bind(&params(None)).map_err(DbErr::Custom)?;
                        let text = pick_sql.text().to_owned();
                        let Some(pick) = service.pick(&transaction, text, values).await? else {
                            break;
                        };
                        let values = sql
                            .bind(&params(Some(&pick.tenant)))
                            .map_err(DbErr::Custom)?;
                        let claimed = transaction
                            .query_all_raw(PgDatabase::statement(sql.text().to_owned(), values))
                            .await?;
                        (Some(pick), claimed)
                    }
                };
                if claimed.is_empty() {
                    // Nothing fits, or (by the counters) the tenant the fleet owes most has its
                    // tasks held back (a reservation, a rank bound): claim no further past it.
                    break;
                }
                if let Some(fleet) = &budgets {
                    fleet.spend(&transaction, &claimed).await?;
                }
                let (Some(pick), Some((service, _))) = (pick, &fair) else {
                    rows.extend(claimed);
                    break;
                };
                let taken = service.charge(&transaction, &pick, &claimed).await?;
                for kind in ResourceKind::ALL {
                    let left = query.free.get(kind).saturating_sub(taken[kind.index()]);
                    query.free = query.free.with(kind, left);
                }
                rows.extend(claimed);
            }
            transaction.commit().await?;
            Ok(rows)
        })
        .await
    }

    /// The plan the server would run a claim with (`EXPLAIN (COSTS OFF)`, one line a row),
    /// under the claim's planner settings when `as_claimed`, else under the server's; with
    /// `analyze`, the claim runs and the plan tells how many rows each step read. Changes
    /// nothing: the transaction is rolled back.
    #[cfg(test)]
    pub(crate) async fn explain_claim(
        &self,
        sql: String,
        values: Vec<Value>,
        as_claimed: bool,
        analyze: bool,
    ) -> Result<String, DbErr> {
        let options = if analyze {
            "ANALYZE, COSTS OFF, TIMING OFF"
        } else {
            "COSTS OFF"
        };
        self.run(move |db| async move {
            let transaction = db.begin().await?;
            if as_claimed {
                transaction.execute_unprepared(CLAIM_PLANNER).await?;
            }
            let rows = transaction
                .query_all_raw(PgDatabase::statement(
                    format!("EXPLAIN ({options}) {sql}"),
                    values,
                ))
                .await?;
            transaction.rollback().await?;
            let lines: Result<Vec<String>, _> = rows
                .iter()
                .map(|row| row.try_get::<String>("", "QUERY PLAN"))
                .collect();
            Ok(lines?.join("\n"))
        })
        .await
    }
}
