//! What sleeping tasks cost a claim on the Postgres table queue: the time of one claim on a
//! queue where S tasks sleep (scheduled starts not yet due, all ranked ahead of the due ones)
//! beside the same claim on a queue where none sleeps, in one run, as a ratio.
//!
//! Both queues live in one fresh table and hold D due tasks of one CPU unit each; the
//! sleeping queue holds S scheduled starts more, parked with `enqueue_carrying` an hour
//! ahead. Each step claims one task (`claim_batch` of at most 1) on the sleeping queue, then
//! one on the other, timing each claim alone; the task is settled `Done` after, untimed. Last,
//! the sleepers' hour is passed (the claims are given a later `now`): the S tasks are due at
//! once, as a burst of scheduled starts all waking at one instant, and the same claims are
//! timed on them.
//!
//! `cargo bench -p prometheus_parking_lot_benches --features postgres --bench sleeping_claims`
//! runs S = 20,000, K = 500 claims on each queue (env `SLEEP_TASKS`, `SLEEP_CLAIMS`) and prints
//! the median and 90th percentile claim time of each and their ratio. Under `cargo test` it
//! runs S = 500, K = 20, checking what each claim took.

#[path = "support/mod.rs"]
mod support;

use std::time::{Duration, Instant};

use prometheus_parking_lot::core::{Capacity, Carried, FitQuery, Settlement, SharedQueue};
use prometheus_parking_lot::infra::postgres::PgDatabase;
use prometheus_parking_lot::infra::queue::postgres::PostgresQueue;
use prometheus_parking_lot::{ResourceCost, ResourceKind, ScheduledTask, TaskMetadata};
use sea_orm::ConnectionTrait;

const NODE: &str = "bench-node";
const LEASE: Duration = Duration::from_secs(60);
/// How far ahead the sleepers are scheduled.
const HOUR_MS: u64 = 3_600_000;

struct Scale {
    sleeping: u64,
    claims: u64,
}

impl Scale {
    fn from_args() -> Self {
        if support::measured() {
            Self {
                sleeping: support::env_u64("SLEEP_TASKS", 20_000),
                claims: support::env_u64("SLEEP_CLAIMS", 500),
            }
        } else {
            Self {
                sleeping: 500,
                claims: 20,
            }
        }
    }
}

/// Task `id` of one CPU unit, its payload its id.
fn task(id: u64) -> ScheduledTask<u64> {
    ScheduledTask::new(
        TaskMetadata::new(id, ResourceCost::new(ResourceKind::Cpu, 1)),
        id,
    )
}

/// Parks `count` due tasks from id `first`, ranked at `rank_ms`.
async fn park_due(queue: &PostgresQueue<u64>, first: u64, count: u64, rank_ms: u64) {
    let tasks = (first..first + count)
        .map(|id| (id, rank_ms + id, task(id), Carried::default()))
        .collect();
    let parked = queue.enqueue_many(tasks).await;
    assert!(parked.iter().all(Result::is_ok), "park the due tasks");
}

/// Claims one task at `now`, timed, then settles it; returns the time and the task's id.
async fn claim_one(queue: &PostgresQueue<u64>, now: u64) -> (Duration, u64) {
    let free = FitQuery::within(Capacity::uniform(1));
    let started = Instant::now();
    let mut leases = queue
        .claim_batch(NODE, &free, 1, LEASE, now)
        .await
        .expect("claim");
    let took = started.elapsed();
    let lease = leases.pop().expect("a due task to claim");
    queue
        .settle(NODE, lease.claim(), Settlement::Done)
        .await
        .expect("settle");
    (took, lease.task.payload)
}

fn main() {
    let scale = Scale::from_args();
    let database = PgDatabase::connect(&support::database_url()).expect("the bench database");
    let table = format!("pl_bench_sleep_{}", std::process::id());
    let asleep = PostgresQueue::<u64>::open(&database, &table, "asleep").expect("open");
    let awake = PostgresQueue::<u64>::open(&database, &table, "awake").expect("open");
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    let start_ms = support::now_ms();
    let wake_ms = start_ms + HOUR_MS;
    let (sleeping, claims) = (scale.sleeping, scale.claims);
    let wake = Carried {
        not_before_ms: Some(wake_ms),
        ..Carried::default()
    };
    let (with_sleepers, without, woken) = runtime.block_on(async {
        for id in 0..sleeping {
            asleep
                .enqueue_carrying(id, 1_000 + id, task(id), wake)
                .await
                .expect("park a sleeper");
        }
        park_due(&asleep, sleeping, claims, 1_000).await;
        park_due(&awake, sleeping, claims, 1_000).await;
        let (mut with_sleepers, mut without, mut woken) = (Vec::new(), Vec::new(), Vec::new());
        for step in 0..claims {
            let (took, id) = claim_one(&asleep, support::now_ms()).await;
            assert_eq!(id, sleeping + step, "the best-ranked due task, no sleeper");
            with_sleepers.push(took);
            let (took, id) = claim_one(&awake, support::now_ms()).await;
            assert_eq!(id, sleeping + step, "the best-ranked due task");
            without.push(took);
        }
        for step in 0..claims.min(sleeping) {
            let (took, id) = claim_one(&asleep, wake_ms + 1).await;
            assert_eq!(id, step, "the best-ranked woken task");
            woken.push(took);
        }
        database
            .connection()
            .execute_unprepared(&format!("DROP TABLE {table}"))
            .await
            .expect("drop the bench table");
        (with_sleepers, without, woken)
    });
    let (with_median, with_p90) = support::spread_ms(&with_sleepers);
    let (without_median, without_p90) = support::spread_ms(&without);
    let (woken_median, woken_p90) = support::spread_ms(&woken);
    println!("one claim on the Postgres table queue, {claims} claims each, medians (p90):");
    println!("  {sleeping} tasks sleeping:   {with_median:.3} ms ({with_p90:.3} ms)");
    println!("  none sleeping:         {without_median:.3} ms ({without_p90:.3} ms)");
    println!(
        "  ratio sleeping / none: {:.2}x",
        with_median / without_median
    );
    println!("  the {sleeping} all due at once: {woken_median:.3} ms ({woken_p90:.3} ms)");
}
