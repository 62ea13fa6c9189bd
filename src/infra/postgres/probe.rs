//! What the queues' plan tests share: the server, raw statements, and tasks to park.

use sea_orm::ConnectionTrait;

use super::claim::ClaimParams;
use super::{PgDatabase, PgQueue};
use crate::core::{Capacity, EntryId, FitQuery, ScheduledTask, SharedQueue, TaskMetadata};
use crate::util::serde::{Priority, ResourceCost, ResourceKind};

/// The server the tests use (`DATABASE_URL`, or the local one).
pub(crate) fn database() -> PgDatabase {
    let url = std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into());
    PgDatabase::connect(&url).expect("the Postgres server the tests use")
}

/// A runtime for a test's async steps (the database runs on its own).
pub(crate) fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime")
}

/// Runs `sql` outside any transaction (`VACUUM` refuses one).
pub(crate) async fn run_sql(database: &PgDatabase, sql: String) {
    database
        .run(move |db| async move { db.execute_unprepared(&sql).await.map(drop) })
        .await
        .unwrap_or_else(|error| panic!("{error}"));
}

/// 3,000 one-unit CPU tasks of every priority, ids and entries from `first`.
pub(crate) fn tasks(first: u64) -> Vec<(EntryId, u64, ScheduledTask<u64>)> {
    (first..first + 3_000)
        .map(|id| {
            let meta = TaskMetadata::new(id, ResourceCost::new(ResourceKind::Cpu, 1))
                .with_priority(Priority::ALL[(id % 4) as usize]);
            (id, 1_000 + id, ScheduledTask::new(meta, id))
        })
        .collect()
}

/// The plans of `queue`'s claim of up to 256 one-unit tasks under the statistics of nearly
/// empty tables, the state a queue's tables are usually in (statistics taken between two
/// bursts, in pages dead rows left behind): 3,000 tasks parked, all but one in 50 deleted
/// from each of `tables` (`task` is a row's task id there), statistics taken, then 3,000
/// tasks more that the statistics know nothing of. Returns the plan under the claim's
/// planner settings and the server's own plan. No autovacuum runs on `tables` afterwards.
pub(crate) async fn claim_plans_under_stale_statistics<L>(
    database: &PgDatabase,
    queue: &PgQueue<L, u64>,
    tables: &[String],
    task: &str,
) -> (String, String)
where
    L: Send + Sync + 'static,
{
    for table in tables {
        let no_autovacuum = format!("ALTER TABLE {table} SET (autovacuum_enabled = false)");
        run_sql(database, no_autovacuum).await;
    }
    let parked = queue.enqueue_many(tasks(0)).await;
    assert!(parked.iter().all(Result::is_ok), "{parked:?}");
    for table in tables {
        run_sql(
            database,
            format!("DELETE FROM {table} WHERE {task} % 50 <> 0"),
        )
        .await;
        run_sql(database, format!("VACUUM ANALYZE {table}")).await;
    }
    let parked = queue.enqueue_many(tasks(10_000)).await;
    assert!(parked.iter().all(Result::is_ok), "{parked:?}");
    let free = FitQuery::within(Capacity::uniform(256));
    let params = ClaimParams {
        queue: queue.name(),
        node: "node",
        query: &free,
        now_ms: 1_000_000,
        expires_at_ms: 2_000_000,
        max: 256,
    };
    let claim = &queue.statements().claim;
    let explain = |as_claimed| {
        let values = claim.bind(&params).expect("every parameter is bound");
        database.explain_claim(claim.text().to_owned(), values, as_claimed, false)
    };
    let plan = explain(true).await.expect("explain");
    let server_plan = explain(false).await.expect("explain");
    (plan, server_plan)
}
