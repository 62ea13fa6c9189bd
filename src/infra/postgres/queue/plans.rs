//! What the table queue's statements read, checked on the server: each plan test parks and
//! claims on a table of its own under the statistics a queue's table usually has, explains
//! a statement and says which index it must walk (and which it must not).

use super::table::PostgresQueue;
use crate::core::QueueOrder;
use crate::infra::postgres::probe::{self, run_sql};
use crate::infra::postgres::PgDatabase;

/// A queue table's statistics usually describe a table nearly empty (taken between two
/// bursts, in pages dead rows left behind), while it holds thousands of parked rows (see
/// `probe::claim_plans_under_stale_statistics`). Under such statistics the server's own choice for the claim is to read the whole table
/// and sort it (on PostgreSQL 15: a sequential scan under a sort, 28 ms instead of 1 ms
/// per claim at 20,000 rows). The claim's planner settings must leave only the walk of
/// the rank index.
#[test]
fn a_claim_walks_the_rank_index_under_statistics_of_a_nearly_empty_table() {
    let (table, plan, server_plan) = claim_plans(QueueOrder::Fifo);
    assert_walks(&plan, &format!("{table}_awake"), &table);
    // What the settings are for: left to itself, the server plans otherwise here.
    assert_ne!(
        plan, server_plan,
        "the server's own plan is the same:\n{server_plan}"
    );
}

/// The same under the deadline order: the claim walks `_awake_due`, the index in its
/// order, and reads no more of the table.
#[test]
fn a_deadline_ordered_claim_walks_its_own_index() {
    let (table, plan, _) = claim_plans(QueueOrder::Deadline);
    assert_walks(&plan, &format!("{table}_awake_due"), &table);
}

/// In `plan` the candidates (`c`) are read by a walk of `index`, and no more of `table`
/// is read or sorted.
fn assert_walks(plan: &str, index: &str, table: &str) {
    assert!(
        plan.contains(&format!("Index Scan using {index} on {table} c\n")),
        "the claim's candidates are not read by a walk of {index}:\n{plan}"
    );
    for whole_table in [
        format!("Seq Scan on {table}"),
        format!("Bitmap Heap Scan on {table}"),
        "Incremental Sort".to_owned(),
    ] {
        assert!(
            !plan.contains(&whole_table),
            "the claim reads (and sorts) the whole table:\n{plan}"
        );
    }
}

/// A fresh table's queue in `order`, its claim planned (with the claim's settings, and
/// as the server would) under statistics of a nearly empty table; the table is dropped.
fn claim_plans(order: QueueOrder) -> (String, String, String) {
    let database = probe::database();
    let table = format!("pl_plan_probe_{}_{}", order.name(), std::process::id());
    let queue =
        PostgresQueue::<u64>::open_in_order(&database, &table, "plan", order).expect("open");
    let (plan, server_plan) = probe::runtime().block_on(async {
        let tables = [table.clone()];
        let plans =
            probe::claim_plans_under_stale_statistics(&database, &queue, &tables, "task_id").await;
        run_sql(&database, format!("DROP TABLE {table}")).await;
        plans
    });
    (table, plan, server_plan)
}

/// A node's renewal of 1,000 of the 6,000 leases the queue's nodes hold, and its settle
/// of them, look each claim up by its key (`_queue_name_entry_key`) on a table whose queues
/// keep no dependencies (the only other full index with the queue's name in it, the
/// parents' `_task_ids`, exists only where one does), under the
/// statistics of another queue of the table, since emptied (a queue between bursts): their
/// cost follows the claims named. Planned on the partial lease index, or on an index
/// leading with the queue's name (the old `_caller`), each lookup read every claimed row
/// of the queue (a pass cost the square of the claims held, and outlasted the lease
/// under load; a settle of 1,000 took seconds).
#[test]
fn a_renewal_and_a_settle_look_up_each_claim_by_its_key() {
    use crate::core::{Capacity, Claim, FitQuery, Settlement, SharedQueue};
    use crate::infra::postgres::codec::entries_to_sql;
    use sea_orm::Value;
    use std::time::Duration;

    let database = probe::database();
    let table = format!("pl_renew_probe_{}", std::process::id());
    let queue = PostgresQueue::<u64>::open(&database, &table, "renew").expect("open");
    let (plans, settled) = probe::runtime().block_on(async {
        // The statistics describe another queue of the table, since emptied.
        let other = PostgresQueue::<u64>::open(&database, &table, "other").expect("open");
        assert!(other
            .enqueue_many(probe::tasks(0))
            .await
            .iter()
            .all(Result::is_ok));
        run_sql(&database, format!("ANALYZE {table}")).await;
        run_sql(&database, format!("DELETE FROM {table}")).await;
        run_sql(&database, format!("VACUUM {table}")).await;
        let mut parked = queue.enqueue_many(probe::tasks(0)).await;
        parked.extend(queue.enqueue_many(probe::tasks(10_000)).await);
        assert!(parked.iter().all(Result::is_ok));
        let all = FitQuery::within(Capacity::uniform(10_000));
        let lease = Duration::from_secs(60);
        let mut held = Vec::new();
        for node in ["a", "b"] {
            let leases = queue
                .claim_batch(node, &all, 3_000, lease, 1_000)
                .await
                .expect("claim");
            assert_eq!(leases.len(), 3_000);
            if node == "a" {
                held = leases.iter().take(1_000).map(|l| l.entry).collect();
            }
        }
        let claims: Vec<Claim> = held.iter().map(|&entry| Claim::new(entry, 1)).collect();
        let params: [(&str, Value); 5] = [
            ("queue", "renew".to_owned().into()),
            ("entries", entries_to_sql(&held).into()),
            (
                "attempts",
                format!("{{{}}}", vec!["1"; held.len()].join(",")).into(),
            ),
            ("node", "a".to_owned().into()),
            ("expires_ms", 90_000i64.into()),
        ];
        let mut plans = Vec::new();
        for statement in [&queue.statements().renew, &queue.statements().settle_done] {
            let values = statement.bind(&params).expect("every parameter is bound");
            let plan = database
                .explain_claim(statement.text().to_owned(), values, false, true)
                .await
                .expect("explain");
            plans.push(plan);
        }
        let lost = queue.renew_many("a", &held, lease, 2_000).await;
        assert_eq!(lost, Ok(Vec::new()), "every lease of a's is renewed");
        // A row another transaction holds (a settle under way, say) is skipped, not
        // waited for, and still answered as a's.
        let url = std::env::var("DATABASE_URL")
            .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into());
        let other = sea_orm::Database::connect(url).await.expect("connect");
        let holding = sea_orm::TransactionTrait::begin(&other)
            .await
            .expect("begin");
        let lock = format!(
            "SELECT 1 FROM {table} WHERE entry = {} FOR UPDATE",
            crate::infra::postgres::codec::entry_to_sql(held[0])
        );
        sea_orm::ConnectionTrait::execute_unprepared(&holding, &lock)
            .await
            .expect("lock a row");
        let renewing = queue.renew_many("a", &held, lease, 3_000);
        let lost = tokio::time::timeout(Duration::from_secs(5), renewing).await;
        drop(holding);
        assert_eq!(
            lost.expect("a renewal does not wait for a locked row"),
            Ok(Vec::new()),
            "a locked row is still a's"
        );
        let settled = queue
            .settle_many(
                "a",
                claims.into_iter().map(|c| (c, Settlement::Done)).collect(),
            )
            .await;
        run_sql(&database, format!("DROP TABLE {table}")).await;
        (plans, settled)
    });
    assert!(settled.iter().all(Result::is_ok), "a settles its claims");
    for plan in plans {
        let lookups = format!("Index Scan using {table}_queue_name_entry_key on {table}");
        assert!(
            plan.contains(&lookups),
            "the claims are not looked up by their key:\n{plan}"
        );
        for scan in [
            format!("{table}_lease"),
            format!("{table}_task_ids"),
            format!("Seq Scan on {table}"),
        ] {
            assert!(!plan.contains(&scan), "the statement reads {scan}:\n{plan}");
        }
    }
}

/// What a claim reads of a queue where 20,000 tasks sleep (a scheduled start that is not
/// due) beside 5 due ones ranked behind them all: the 5 (every step of its plan reads at
/// most a few rows; before the indexes of `schema.rs` split the parked rows, the walk of
/// the rank index read and dropped the 20,000). Once their instant has come, the
/// sleepers are claimed, best-ranked first, without a write in between.
#[test]
fn a_claim_reads_no_sleeping_row() {
    let database = probe::database();
    let table = format!("pl_sleep_probe_{}", std::process::id());
    let queue = PostgresQueue::<u64>::open(&database, &table, "sleep").expect("open");
    let (plan, claimed_due, claimed_woken) = probe::runtime().block_on(async {
        let (plan, due, woken) = sleeping_claims(&database, &queue, &table).await;
        run_sql(&database, format!("DROP TABLE {table}")).await;
        (plan, due, woken)
    });
    assert_eq!(
        claimed_due,
        vec![20_000, 20_001, 20_002, 20_003, 20_004],
        "{plan}"
    );
    assert_eq!(claimed_woken, (0..256).collect::<Vec<u64>>());
    for index in [format!("{table}_awake"), format!("{table}_wakes")] {
        assert!(
            plan.contains(&format!("Index Scan using {index}")),
            "the claim reads {index}:\n{plan}"
        );
    }
    let most_read = plan
        .lines()
        .filter_map(|line| {
            let (_, tail) = line.split_once("rows=")?;
            let count = tail.split(|c: char| !c.is_ascii_digit()).next()?;
            count.parse::<u64>().ok()
        })
        .chain(plan.lines().filter_map(|line| {
            let (_, count) = line.split_once("Rows Removed by Filter: ")?;
            count.trim().parse::<u64>().ok()
        }))
        .max();
    assert_eq!(most_read, Some(5), "a step reads sleeping rows:\n{plan}");
}

/// Parks 20,000 sleeping tasks (ids 0..20,000, ranked first, due at 10,000,000) and 5
/// due ones (ids 20,000..20,005); returns the claim's plan and ids claimed at 5,000,000,
/// then the ids claimed at 10,000,000.
async fn sleeping_claims(
    database: &PgDatabase,
    queue: &PostgresQueue<u64>,
    table: &str,
) -> (String, Vec<u64>, Vec<u64>) {
    use crate::core::{Capacity, Carried, FitQuery, ScheduledTask, SharedQueue, TaskMetadata};
    use crate::infra::postgres::claim::ClaimParams;
    use crate::util::serde::{ResourceCost, ResourceKind};
    let tasks = (0..20_005)
        .map(|id| {
            let meta = TaskMetadata::new(id, ResourceCost::new(ResourceKind::Cpu, 1));
            (
                id,
                1_000 + id,
                ScheduledTask::new(meta, id),
                Carried::default(),
            )
        })
        .collect();
    let parked = queue.enqueue_many(tasks).await;
    assert!(parked.iter().all(Result::is_ok));
    // As `enqueue_carrying` parks them with an instant, in one statement.
    let asleep = format!("UPDATE {table} SET not_before_ms = 10000000 WHERE task_id < 20000");
    run_sql(database, asleep).await;
    run_sql(database, format!("VACUUM ANALYZE {table}")).await;
    let free = FitQuery::within(Capacity::uniform(256));
    let params = |now_ms| ClaimParams {
        queue: queue.name(),
        node: "node",
        query: &free,
        now_ms,
        expires_at_ms: now_ms + 60_000,
        max: 256,
    };
    let claim = &queue.statements().claim;
    let values = claim
        .bind(&params(5_000_000))
        .expect("every parameter is bound");
    let plan = database
        .explain_claim(claim.text().to_owned(), values, true, true)
        .await
        .expect("explain");
    let ids = |leases: Vec<crate::core::Lease<u64>>| {
        leases.into_iter().map(|lease| lease.task.payload).collect()
    };
    let due = queue
        .claim_batch(
            "node",
            &free,
            256,
            std::time::Duration::from_secs(60),
            5_000_000,
        )
        .await
        .expect("claim the due tasks");
    let woken = queue
        .claim_batch(
            "node",
            &free,
            256,
            std::time::Duration::from_secs(60),
            10_000_000,
        )
        .await
        .expect("claim the woken tasks");
    (plan, ids(due), ids(woken))
}

/// A queue table made before tasks carried their trace (no `traceparent` column, nor any
/// column added after it, the last of which marks a table up to date) gains the column when
/// a queue opens it, and its tasks then keep their trace from park to claim; its rows parked
/// before keep theirs, with no trace.
#[test]
fn a_table_made_before_traces_gains_the_column_when_opened() {
    use crate::core::{Capacity, Carried, FitQuery, ScheduledTask, SharedQueue, TaskMetadata};
    use crate::util::serde::{ResourceCost, ResourceKind};
    use std::time::Duration;

    let database = probe::database();
    let table = format!("pl_trace_migration_{}", std::process::id());
    let task = |id| {
        ScheduledTask::new(
            TaskMetadata::new(id, ResourceCost::new(ResourceKind::Cpu, 1)),
            id,
        )
    };
    let trace = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
        .parse()
        .expect("traceparent");
    let older = PostgresQueue::<u64>::open(&database, &table, "old").expect("open");
    let claimed = probe::runtime().block_on(async {
        older.enqueue(1, 1_000, task(1)).await.expect("park before");
        let last = crate::infra::postgres::schema::QUEUE_LAST_COLUMN;
        run_sql(
            &database,
            format!("ALTER TABLE {table} DROP COLUMN traceparent, DROP COLUMN {last}"),
        )
        .await;
        let reopened = PostgresQueue::<u64>::open(&database, &table, "old").expect("reopen");
        let carried = Carried {
            trace: Some(trace),
            ..Carried::default()
        };
        reopened
            .enqueue_carrying(2, 2_000, task(2), carried)
            .await
            .expect("park in a trace");
        let free = FitQuery::within(Capacity::uniform(4));
        let leases = reopened
            .claim_batch("node", &free, 4, Duration::from_secs(30), 10_000)
            .await
            .expect("claim");
        run_sql(&database, format!("DROP TABLE {table}")).await;
        leases
    });
    let seen: Vec<_> = claimed
        .iter()
        .map(|lease| (lease.entry, lease.trace))
        .collect();
    assert_eq!(seen, vec![(1, None), (2, Some(trace))]);
}
