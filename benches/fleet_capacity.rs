//! How fast a node of finite capacity runs the work of a shared Postgres queue, beside a
//! node whose capacity never binds, in the same run.
//!
//! A producer-only node (`worker_threads: 0`) submits N one-unit jobs with `submit_batch`;
//! a worker node with W workers on the same table queue claims and runs them; the producer
//! retrieves every result from the Postgres mailbox, 32 retrieves at a time. Both nodes are built from a config, as
//! users build them. The worker node's `max_units` is what changes:
//!
//! - *unbounded, no-op*: `max_units` 1,000,000: the node claims as far as its claim-ahead.
//! - *16 units, no-op*: the node can hold 16 jobs at once, so it must claim again each time
//!   runs end. A node that claimed only at its poll would run 16 jobs a poll.
//! - *16 units, 100 ms tasks*: the ceiling is 16 / 0.1 s = 160 jobs/s.
//!
//! `cargo bench -p prometheus_parking_lot_benches --features postgres --bench fleet_capacity`
//! runs N = 3,000 no-op jobs (`FC_JOBS`), 640 jobs of 100 ms (`FC_SLOW_JOBS`), W = 16
//! (`FC_WORKERS`), claim-ahead 256, R = 3 rounds (`FC_ROUNDS`), and prints each case's
//! median jobs/s, the bounded node's ratio to the unbounded one and the slow case's ratio
//! to its ceiling. Under `cargo test` it runs a few jobs of each case once, checking every
//! result, as a smoke test.

#[path = "support/mod.rs"]
mod support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use prometheus_parking_lot::core::{ScheduledTask, SubmitOptions, TaskMetadata};
use prometheus_parking_lot::infra::postgres::PgDatabase;
use prometheus_parking_lot::util::serde::{MailboxKey, ResourceCost};
use prometheus_parking_lot::{
    build_pools_from_scheduler_config, BuiltPools, QueueBuilderContext, SchedulerConfig,
    TaskExecutor, TokioSpawner,
};
use sea_orm::ConnectionTrait;

/// How many tasks retrieve the results at once.
const TAKERS: u64 = 32;

/// Doubles its payload after `work`.
#[derive(Clone)]
struct Work {
    work: Duration,
}

#[async_trait::async_trait]
impl TaskExecutor<u64, u64> for Work {
    async fn execute(&self, payload: u64, _meta: TaskMetadata) -> u64 {
        if !self.work.is_zero() {
            tokio::time::sleep(self.work).await;
        }
        payload * 2
    }
}

/// One case: the worker node's units and each job's length.
#[derive(Clone, Copy)]
struct Case {
    name: &'static str,
    units: u32,
    work: Duration,
    jobs: u64,
}

fn unique(prefix: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_nanos();
    format!("{prefix}_{}_{nanos}", std::process::id())
}

/// A node of the queue `queue`, from a config of its own.
fn node(
    database: &PgDatabase,
    queue: &str,
    workers: u64,
    units: u32,
    work: Duration,
) -> BuiltPools<u64, u64, Work> {
    let config = serde_json::json!({ "pools": { "node": {
        "worker_threads": workers,
        "max_units": units,
        "max_queue_depth": 10_000_000,
        "queue": { "type": "postgres", "queue_name": queue, "claim_ahead": 256 },
        "mailbox": { "storage": { "type": "postgres", "table": format!("{queue}_results") } }
    } } });
    let config = SchedulerConfig::from_json_str(&config.to_string()).expect("bench config");
    build_pools_from_scheduler_config::<u64, u64, Work, TokioSpawner>(
        &config,
        &QueueBuilderContext::Postgres(database.clone()),
        None,
        move |_| Work { work },
        TokioSpawner,
    )
    .expect("bench pools")
}

/// Runs `case` once; returns its jobs per second.
async fn round(database: &PgDatabase, case: Case, workers: u64) -> f64 {
    let queue = unique("capacity");
    let nodes = {
        let (database, queue) = (database.clone(), queue.clone());
        tokio::task::spawn_blocking(move || {
            let producer = node(&database, &queue, 0, 1_000_000, case.work);
            let worker = node(&database, &queue, workers, case.units, case.work);
            (producer, worker)
        })
        .await
        .expect("the nodes start")
    };
    let producer = Arc::new(nodes.0.pools["node"].client().clone());
    let key = MailboxKey::new("bench").with_session(unique("s"));
    let started = Instant::now();
    let ids: Vec<u64> = (1..=case.jobs).collect();
    for chunk in ids.chunks(1_000) {
        let tasks = chunk
            .iter()
            .map(|&id| {
                let meta = TaskMetadata::new(id, ResourceCost::cpu(1)).with_mailbox(key.clone());
                ScheduledTask::new(meta, id)
            })
            .collect();
        let answers = producer.submit_batch(tasks, SubmitOptions::default()).await;
        assert!(
            answers.iter().all(Result::is_ok),
            "every submit is accepted"
        );
    }
    // Retrieved by 32 takers at once, so that the results' round trips do not bound the run.
    let mut takers = tokio::task::JoinSet::new();
    for taker in 0..TAKERS {
        let (producer, key) = (Arc::clone(&producer), key.clone());
        takers.spawn(async move {
            for id in (1..=case.jobs).filter(|id| id % TAKERS == taker) {
                let result = producer
                    .retrieve_task(&key, id, Duration::from_secs(120))
                    .await
                    .expect("every result is retrieved");
                assert_eq!(result, id * 2);
            }
        });
    }
    while let Some(done) = takers.join_next().await {
        done.expect("a taker");
    }
    let elapsed = started.elapsed();
    drop(producer);
    // Both nodes stop before the next round starts on the same table.
    let (producer_node, worker_node) = nodes;
    for pools in [worker_node, producer_node] {
        pools
            .shutdown(Duration::from_secs(10))
            .await
            .expect("the nodes stop");
    }
    let _ = database
        .connection()
        .execute_unprepared(&format!("DROP TABLE IF EXISTS {queue}_results"))
        .await;
    case.jobs as f64 / elapsed.as_secs_f64()
}

fn main() {
    let measured = support::measured();
    let var = support::env_u64;
    let (jobs, slow_jobs, workers, rounds) = if measured {
        (
            var("FC_JOBS", 3_000),
            var("FC_SLOW_JOBS", 640),
            var("FC_WORKERS", 16),
            var("FC_ROUNDS", 3) as usize,
        )
    } else {
        (64, 32, 4, 1)
    };
    let slow = Duration::from_millis(100);
    let cases = [
        Case {
            name: "unbounded, no-op",
            units: 1_000_000,
            work: Duration::ZERO,
            jobs,
        },
        Case {
            name: "16 units, no-op",
            units: 16,
            work: Duration::ZERO,
            jobs,
        },
        Case {
            name: "16 units, 100 ms tasks",
            units: 16,
            work: slow,
            jobs: slow_jobs,
        },
    ];
    let database = PgDatabase::connect(&support::database_url()).expect("the bench's database");
    let client = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let mut rates = vec![Vec::new(); cases.len()];
    for _ in 0..rounds {
        for (case, rates) in cases.iter().zip(&mut rates) {
            rates.push(client.block_on(round(&database, *case, workers)));
        }
    }
    let medians: Vec<f64> = rates.iter().map(|rates| support::median(rates)).collect();
    println!(
        "fleet_capacity: {jobs} no-op jobs, {slow_jobs} jobs of 100 ms, {workers} workers, \
         claim-ahead 256, {rounds} rounds (medians)"
    );
    for (case, median) in cases.iter().zip(&medians) {
        println!("  {:<24} median {median:>8.0} jobs/s", case.name);
    }
    let ceiling = 16.0 / slow.as_secs_f64();
    println!(
        "  16 units / unbounded on no-op tasks: {:.2}x; 100 ms tasks: {:.2}x the ceiling of {ceiling:.0} jobs/s",
        medians[1] / medians[0],
        medians[2] / ceiling
    );
}
