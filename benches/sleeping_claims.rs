//! What sleeping tasks cost a claim on the Postgres table queue: the time of one claim on a
//! queue where S tasks sleep (scheduled starts not yet due, all ranked ahead of the due ones)
//! beside the same claim on a queue where none sleeps, in one run, as a ratio.
//!
//! Both queues live in one fresh table and hold D due tasks of one CPU unit each; the
//! sleeping queue holds S scheduled starts more, parked with `enqueue_not_before` an hour
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

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use prometheus_parking_lot::core::{Capacity, FitQuery, Settlement, SharedQueue};
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

fn database_url() -> String {
    std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_owned())
}

fn now_ms() -> u64 {
    let since = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    u64::try_from(since.as_millis()).unwrap_or(u64::MAX)
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
        .map(|id| (id, rank_ms + id, task(id)))
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

/// The median and 90th percentile of `times`, in ms.
fn spread(times: &[Duration]) -> (f64, f64) {
    let mut ms: Vec<f64> = times.iter().map(|t| t.as_secs_f64() * 1e3).collect();
    ms.sort_by(f64::total_cmp);
    let p90 = ms[(ms.len() * 9 / 10).min(ms.len() - 1)];
    (support::median(&ms), p90)
}

fn main() {
    let scale = Scale::from_args();
    let database = PgDatabase::connect(&database_url()).expect("the bench database");
    let table = format!("pl_bench_sleep_{}", std::process::id());
    let asleep = PostgresQueue::<u64>::open(&database, &table, "asleep").expect("open");
    let awake = PostgresQueue::<u64>::open(&database, &table, "awake").expect("open");
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    let start_ms = now_ms();
    let wake_ms = start_ms + HOUR_MS;
    let (sleeping, claims) = (scale.sleeping, scale.claims);
    let (with_sleepers, without, woken) = runtime.block_on(async {
        for id in 0..sleeping {
            asleep
                .enqueue_not_before(id, 1_000 + id, task(id), wake_ms)
                .await
                .expect("park a sleeper");
        }
        park_due(&asleep, sleeping, claims, 1_000).await;
        park_due(&awake, sleeping, claims, 1_000).await;
        let (mut with_sleepers, mut without, mut woken) = (Vec::new(), Vec::new(), Vec::new());
        for step in 0..claims {
            let (took, id) = claim_one(&asleep, now_ms()).await;
            assert_eq!(id, sleeping + step, "the best-ranked due task, no sleeper");
            with_sleepers.push(took);
            let (took, id) = claim_one(&awake, now_ms()).await;
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
    let (with_median, with_p90) = spread(&with_sleepers);
    let (without_median, without_p90) = spread(&without);
    let (woken_median, woken_p90) = spread(&woken);
    println!("one claim on the Postgres table queue, {claims} claims each, medians (p90):");
    println!("  {sleeping} tasks sleeping:   {with_median:.3} ms ({with_p90:.3} ms)");
    println!("  none sleeping:         {without_median:.3} ms ({without_p90:.3} ms)");
    println!(
        "  ratio sleeping / none: {:.2}x",
        with_median / without_median
    );
    println!("  the {sleeping} all due at once: {woken_median:.3} ms ({woken_p90:.3} ms)");
}
