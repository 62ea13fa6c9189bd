//! Running a queue's statements on the database's runtime: one that returns rows, and a claim,
//! which runs under planner settings of its own.

use std::sync::Arc;

use sea_orm::{ConnectionTrait, DbErr, QueryResult, TransactionTrait, Value};

use super::budgets::FleetBudgets;
use super::service::{FairParams, FleetService, OwnedClaim};
use super::shared_queue::FairClaim;
use super::PgDatabase;
use crate::core::FitQuery;
use crate::util::serde::ResourceKind;

/// The planner settings a claim runs under (see [`PgDatabase::claim_rows`]).
const CLAIM_PLANNER: &str = "SET LOCAL enable_seqscan = off; SET LOCAL enable_bitmapscan = off; \
                             SET LOCAL enable_sort = off; SET LOCAL enable_incremental_sort = off; \
                             SET LOCAL jit = off";

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

    /// Runs a claim: a statement that walks a queue's rank index and returns the rows it took.
    ///
    /// It runs in a transaction of its own under [`CLAIM_PLANNER`], because a queue table's
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
    pub(crate) async fn claim_rows(
        &self,
        sql: String,
        values: Vec<Value>,
    ) -> Result<Vec<QueryResult>, DbErr> {
        self.run(move |db| async move {
            let transaction = db.begin().await?;
            transaction.execute_unprepared(CLAIM_PLANNER).await?;
            let rows = transaction
                .query_all_raw(PgDatabase::statement(sql, values))
                .await?;
            transaction.commit().await?;
            Ok(rows)
        })
        .await
    }

    /// Runs a claim within a fleet's budgets (see [`budgets`](super::budgets)), in one
    /// transaction under [`CLAIM_PLANNER`]: the queue's buckets are refilled and locked, the
    /// claim statement (`sql`) is bound by `bind` with the query and the most tasks the
    /// buckets allow, and what it took is spent. A claim the buckets allow nothing runs no
    /// statement and takes nothing.
    pub(crate) async fn claim_rows_within<B>(
        &self,
        fleet: Arc<FleetBudgets>,
        sql: String,
        query: FitQuery,
        max: usize,
        bind: B,
    ) -> Result<Vec<QueryResult>, DbErr>
    where
        B: FnOnce(&FitQuery, usize) -> Result<Vec<Value>, String> + Send + 'static,
    {
        self.run(move |db| async move {
            let transaction = db.begin().await?;
            transaction.execute_unprepared(CLAIM_PLANNER).await?;
            let (query, max) = fleet.refill(&transaction).await?.limit(query, max);
            let mut rows = Vec::new();
            if max > 0 && !query.free.is_empty() {
                let values = bind(&query, max).map_err(DbErr::Custom)?;
                rows = transaction
                    .query_all_raw(PgDatabase::statement(sql, values))
                    .await?;
                fleet.spend(&transaction, &rows).await?;
            }
            transaction.commit().await?;
            Ok(rows)
        })
        .await
    }

    /// Runs a claim that follows the fleet's tenant counters (`service.rs`): in one
    /// transaction, the queue's turn, then one task at a time, the tenant the fleet served
    /// least that has a task fitting the free units, its claim, its charge, until `max`
    /// tasks or nothing fits; within the fleet's budgets where it has them (refilled once,
    /// spent per task).
    pub(crate) async fn claim_rows_fair(
        &self,
        service: Arc<FleetService>,
        budgets: Option<Arc<FleetBudgets>>,
        fair: FairClaim,
        claim: OwnedClaim,
        query: FitQuery,
        max: usize,
    ) -> Result<Vec<QueryResult>, DbErr> {
        self.run(move |db| async move {
            let transaction = db.begin().await?;
            service.lock(&transaction).await?;
            let (mut query, max) = match &budgets {
                Some(fleet) => fleet.refill(&transaction).await?.limit(query, max),
                None => (query, max),
            };
            transaction.execute_unprepared(CLAIM_PLANNER).await?;
            let mut rows = Vec::new();
            while rows.len() < max && !query.free.is_empty() {
                let params = |tenant| FairParams {
                    claim: &claim,
                    query: &query,
                    max: 1,
                    service: &service,
                    tenant,
                };
                let values = fair.pick.bind(&params(None)).map_err(DbErr::Custom)?;
                let pick_text = fair.pick.text().to_owned();
                let Some(pick) = service.pick(&transaction, pick_text, values).await? else {
                    break;
                };
                let values = fair
                    .claim
                    .bind(&params(Some(&pick.tenant)))
                    .map_err(DbErr::Custom)?;
                let claimed = transaction
                    .query_all_raw(PgDatabase::statement(fair.claim.text().to_owned(), values))
                    .await?;
                if claimed.is_empty() {
                    // Its tasks are held back (a reservation, a rank bound): claim no further
                    // past the tenant the fleet owes most.
                    break;
                }
                let taken = service.charge(&transaction, &pick, &claimed).await?;
                if let Some(fleet) = &budgets {
                    fleet.spend(&transaction, &claimed).await?;
                }
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
