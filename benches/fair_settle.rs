//! What settling the fleet's fair share costs a claimed task on the Postgres table queue:
//! claim, settle and (with the settlement) `settle_use` per task, beside the same claims and
//! settles without it, in one run, as a ratio.
//!
//! A fresh queue shares its tenants' counters (`reported`, two tenants of weights 3 and 1);
//! each round parks N tasks of one unit (in groups of 100, untimed), then claims them one at
//! a time as a node does, settling each `Done`; the settled rounds also settle the fleet's
//! counter to the unit the run reported. Rounds alternate between the two, medians of the
//! time per task.
//!
//! `cargo bench -p prometheus_parking_lot_benches --features postgres --bench fair_settle`
//! runs N = 2,000, 5 rounds each (env `FAIR_TASKS`, `FAIR_ROUNDS`). Under `cargo test` it
//! runs N = 50, one round each.

#[path = "support/mod.rs"]
mod support;

use std::time::{Duration, Instant};

use prometheus_parking_lot::core::{
    Capacity, Carried, FairByUse, FitQuery, RunUse, Settlement, SharedFairShare, SharedQueue,
    TenantWeights, UsageCharge,
};
use prometheus_parking_lot::infra::postgres::PgDatabase;
use prometheus_parking_lot::infra::queue::postgres::PostgresQueue;
use prometheus_parking_lot::{MailboxKey, ResourceCost, ResourceKind, ScheduledTask, TaskMetadata};
use sea_orm::ConnectionTrait;

const NODE: &str = "bench-node";
const LEASE: Duration = Duration::from_secs(60);
const TENANTS: [&str; 2] = ["acme", "globex"];

/// Task `id` of one CPU unit, of the tenant `id` picks.
fn task(id: u64) -> ScheduledTask<u64> {
    let tenant = TENANTS[(id % 2) as usize];
    let meta = TaskMetadata::new(id, ResourceCost::new(ResourceKind::Cpu, 1))
        .with_mailbox(MailboxKey::new(tenant));
    ScheduledTask::new(meta, id)
}

/// Parks tasks `first..first + count`, untimed.
async fn park(queue: &PostgresQueue<u64>, first: u64, count: u64) {
    for group in (first..first + count).step_by(100) {
        let tasks = (group..(group + 100).min(first + count))
            .map(|id| (id, 1_000 + id, task(id), Carried::default()))
            .collect();
        let parked = queue.enqueue_many(tasks).await;
        assert!(parked.iter().all(Result::is_ok), "park a group");
    }
}

/// Claims and settles `count` tasks one at a time, settling the fleet's counter too when
/// `settle_use`; returns the time per task.
async fn claim_all(queue: &PostgresQueue<u64>, count: u64, settle_use: bool) -> Duration {
    let free = FitQuery::within(Capacity::uniform(1));
    let started = Instant::now();
    for _ in 0..count {
        let mut leases = queue
            .claim_batch(NODE, &free, 1, LEASE, support::now_ms())
            .await
            .expect("claim");
        let lease = leases.pop().expect("a task to claim");
        queue
            .settle(NODE, lease.claim(), Settlement::Done)
            .await
            .expect("settle");
        if settle_use {
            let tenant = lease.task.meta.mailbox.expect("a tenant").tenant;
            let used = RunUse {
                units: 1,
                held_unit_ms: 1.0,
                reported: Some(0),
                started_ms: support::now_ms(),
            };
            queue.settle_use(&tenant, used).await.expect("settle use");
        }
    }
    started.elapsed() / u32::try_from(count).unwrap_or(u32::MAX)
}

fn main() {
    let (tasks, rounds) = if support::measured() {
        (
            support::env_u64("FAIR_TASKS", 2_000),
            support::env_u64("FAIR_ROUNDS", 5),
        )
    } else {
        (50, 1)
    };
    let database = PgDatabase::connect(&support::database_url()).expect("the bench database");
    let table = format!("pl_bench_fair_{}", std::process::id());
    let queue = PostgresQueue::<u64>::open(&database, &table, "q").expect("open");
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    let (plain, settled) = runtime.block_on(async {
        let weights = TenantWeights::default().with("acme", 3);
        let order = FairByUse::new(UsageCharge::Reported);
        assert!(
            SharedQueue::<u64>::fair_share(&queue).is_some(),
            "the table queue claims by the fleet's counters"
        );
        queue
            .share_fair_by_use(order, &weights, None)
            .await
            .expect("share the counters");
        let (mut plain, mut settled) = (Vec::new(), Vec::new());
        let mut first = 0;
        for _ in 0..rounds {
            for settle_use in [false, true] {
                park(&queue, first, tasks).await;
                let took = claim_all(&queue, tasks, settle_use).await;
                first += tasks;
                if settle_use {
                    settled.push(took.as_secs_f64() * 1e6);
                } else {
                    plain.push(took.as_secs_f64() * 1e6);
                }
            }
        }
        for statement in [
            format!("DROP TABLE {table}"),
            format!("DELETE FROM pl_fleet_service WHERE queue_key LIKE '% {table} q'"),
            format!("DELETE FROM pl_fleet_service_floors WHERE queue_key LIKE '% {table} q'"),
        ] {
            database
                .connection()
                .execute_unprepared(&statement)
                .await
                .expect("clean up");
        }
        (support::median(&plain), support::median(&settled))
    });
    println!("the Postgres table queue, fair share by use shared by the fleet, {tasks} tasks a round, {rounds} rounds each, medians:");
    println!("  claim + settle:              {plain:.0} µs a task");
    println!(
        "  claim + settle + settle_use: {settled:.0} µs a task ({:.2}x)",
        settled / plain
    );
}
