//! What the deadline order costs the Postgres table queue: parking and claiming on a queue
//! opened in the deadline order (`PostgresQueue::open_in_order`, its `_awake_due` index)
//! beside the same work on a queue in admission order, in one run, as ratios.
//!
//! Each queue has a table of its own (the deadline order's index is made per table, and
//! every park into that table pays for it). Both park the same N tasks of one CPU unit, in
//! groups of 100 (`enqueue_many`), each with a deadline spread over 100 s in no relation to
//! its admission, then make K claims of one task each, alternating between the queues and
//! timing each claim alone (each task is settled `Done` after, untimed). The deadline queue
//! must hand its tasks out earliest deadline first, and the bench checks that it does.
//!
//! `cargo bench -p prometheus_parking_lot_benches --features postgres --bench deadline_claims`
//! runs N = 20,000, K = 500 (env `DEADLINE_TASKS`, `DEADLINE_CLAIMS`) and prints the park
//! time per task and the median and 90th percentile claim time of each queue, with their
//! ratios. Under `cargo test` it runs N = 500, K = 20.

#[path = "support/mod.rs"]
mod support;

use std::time::{Duration, Instant};

use prometheus_parking_lot::core::{
    Capacity, Carried, FitQuery, QueueOrder, Settlement, SharedQueue,
};
use prometheus_parking_lot::infra::postgres::PgDatabase;
use prometheus_parking_lot::infra::queue::postgres::PostgresQueue;
use prometheus_parking_lot::{ResourceCost, ResourceKind, ScheduledTask, TaskMetadata};
use sea_orm::ConnectionTrait;

const NODE: &str = "bench-node";
const LEASE: Duration = Duration::from_secs(60);
/// Tasks parked by one `enqueue_many`.
const GROUP: u64 = 100;

/// Task `id` of one CPU unit, due `deadline_ms`, its payload its deadline.
fn task(id: u64, deadline_ms: u64) -> ScheduledTask<u64> {
    let mut meta = TaskMetadata::new(id, ResourceCost::new(ResourceKind::Cpu, 1));
    meta.deadline_ms = Some(u128::from(deadline_ms));
    ScheduledTask::new(meta, deadline_ms)
}

/// The deadline of task `id`: spread over 100 s from `base`, in no order of the ids.
fn deadline_of(id: u64, base: u64) -> u64 {
    base + (id * 7_919) % 100_000
}

/// Parks tasks 0..`count` in groups; returns the time per task.
async fn park_all(queue: &PostgresQueue<u64>, count: u64, base: u64) -> Duration {
    let started = Instant::now();
    for first in (0..count).step_by(GROUP as usize) {
        let tasks = (first..(first + GROUP).min(count))
            .map(|id| {
                (
                    id,
                    1_000 + id,
                    task(id, deadline_of(id, base)),
                    Carried::default(),
                )
            })
            .collect();
        let parked = queue.enqueue_many(tasks).await;
        assert!(parked.iter().all(Result::is_ok), "park a group");
    }
    started.elapsed() / u32::try_from(count).unwrap_or(u32::MAX)
}

/// Claims one task, timed, then settles it; returns the time and the task's deadline.
async fn claim_one(queue: &PostgresQueue<u64>) -> (Duration, u64) {
    let free = FitQuery::within(Capacity::uniform(1));
    let started = Instant::now();
    let mut leases = queue
        .claim_batch(NODE, &free, 1, LEASE, support::now_ms())
        .await
        .expect("claim");
    let took = started.elapsed();
    let lease = leases.pop().expect("a task to claim");
    queue
        .settle(NODE, lease.claim(), Settlement::Done)
        .await
        .expect("settle");
    (took, lease.task.payload)
}

fn main() {
    let (tasks, claims) = if support::measured() {
        (
            support::env_u64("DEADLINE_TASKS", 20_000),
            support::env_u64("DEADLINE_CLAIMS", 500),
        )
    } else {
        (500, 20)
    };
    let database = PgDatabase::connect(&support::database_url()).expect("the bench database");
    let pid = std::process::id();
    let (fifo_table, deadline_table) = (
        format!("pl_bench_fifo_{pid}"),
        format!("pl_bench_deadline_{pid}"),
    );
    let fifo = PostgresQueue::<u64>::open(&database, &fifo_table, "q").expect("open");
    let by_deadline =
        PostgresQueue::<u64>::open_in_order(&database, &deadline_table, "q", QueueOrder::Deadline)
            .expect("open");
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    let base = support::now_ms() + 3_600_000;
    let (parks, fifo_claims, deadline_claims) = runtime.block_on(async {
        let parks = (
            park_all(&fifo, tasks, base).await,
            park_all(&by_deadline, tasks, base).await,
        );
        let (mut fifo_claims, mut deadline_claims) = (Vec::new(), Vec::new());
        let mut last_deadline = 0;
        for _ in 0..claims {
            let (took, _) = claim_one(&fifo).await;
            fifo_claims.push(took);
            let (took, deadline) = claim_one(&by_deadline).await;
            assert!(deadline >= last_deadline, "earliest deadline first");
            last_deadline = deadline;
            deadline_claims.push(took);
        }
        for table in [&fifo_table, &deadline_table] {
            database
                .connection()
                .execute_unprepared(&format!("DROP TABLE {table}"))
                .await
                .expect("drop a bench table");
        }
        (parks, fifo_claims, deadline_claims)
    });
    let (fifo_median, fifo_p90) = support::spread_ms(&fifo_claims);
    let (deadline_median, deadline_p90) = support::spread_ms(&deadline_claims);
    let per_task = |took: Duration| took.as_secs_f64() * 1e6;
    println!("the Postgres table queue, {tasks} tasks parked, {claims} claims each:");
    println!(
        "  park, per task:  admission order {:.1} µs, deadline order {:.1} µs ({:.2}x)",
        per_task(parks.0),
        per_task(parks.1),
        parks.1.as_secs_f64() / parks.0.as_secs_f64()
    );
    println!(
        "  claim, median (p90): admission order {fifo_median:.3} ms ({fifo_p90:.3} ms), \
         deadline order {deadline_median:.3} ms ({deadline_p90:.3} ms) ({:.2}x)",
        deadline_median / fifo_median
    );
}
