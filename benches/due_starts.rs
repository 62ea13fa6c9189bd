//! How late a scheduled start runs on a shared Postgres table queue: the time from a task's
//! instant (`SubmitOptions::with_not_before`) to its executor's start, with and without many
//! sleeping rows ahead of it, and when the node that runs it is not the one that scheduled it.
//!
//! Pools are built from a config, as users build them (a node polls every 200 ms). Each case
//! runs on a fresh queue:
//!
//! - *one node, none sleeping*: a node of 2 workers schedules K tasks, due 25 ms apart from
//!   0.6 s ahead, and runs them;
//! - *one node, S sleeping*: the same node first parks S tasks due an hour ahead;
//! - *two nodes*: a producer-only node (`worker_threads: 0`) schedules the K tasks and a
//!   worker node runs them: the worker knows no instant, so it finds each at a poll.
//!
//! Each executor returns how late it started (its start less its instant, ms).
//!
//! `cargo bench -p prometheus_parking_lot_benches --features postgres --bench due_starts`
//! runs K = 40 (`DUE_TASKS`), S = 20,000 (`DUE_SLEEPING`), R = 3 rounds (`DUE_ROUNDS`), and
//! prints each case's median, 90th percentile and largest lateness over the rounds. Under
//! `cargo test` it runs K = 4, S = 50, one round, checking every result.

#[path = "support/mod.rs"]
mod support;

use std::time::{Duration, UNIX_EPOCH};

use prometheus_parking_lot::core::{ScheduledTask, SubmitOptions, TaskMetadata};
use prometheus_parking_lot::infra::postgres::PgDatabase;
use prometheus_parking_lot::util::serde::{MailboxKey, ResourceCost};
use prometheus_parking_lot::{
    build_pools_from_scheduler_config, BuiltPools, QueueBuilderContext, SchedulerConfig,
    TaskExecutor, TokioSpawner,
};

/// How far ahead the sleepers are due.
const HOUR_MS: u64 = 3_600_000;

/// Returns how late it started: now less its payload, the instant it was due.
#[derive(Clone)]
struct Lateness;

#[async_trait::async_trait]
impl TaskExecutor<u64, u64> for Lateness {
    async fn execute(&self, due_ms: u64, _meta: TaskMetadata) -> u64 {
        support::now_ms().saturating_sub(due_ms)
    }
}

struct Scale {
    tasks: u64,
    sleeping: u64,
    rounds: u64,
}

fn unique(prefix: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_nanos();
    format!("{prefix}_{}_{nanos}", std::process::id())
}

/// A node of the queue `queue` with `workers` workers, from a config of its own.
fn node(database: &PgDatabase, queue: &str, workers: u64) -> BuiltPools<u64, u64, Lateness> {
    let config = serde_json::json!({ "pools": { "node": {
        "worker_threads": workers,
        "max_units": 4,
        "max_queue_depth": 10_000_000,
        "queue": { "type": "postgres", "queue_name": queue },
        "mailbox": { "storage": { "type": "postgres", "table": format!("{queue}_results") } }
    } } });
    let config = SchedulerConfig::from_json_str(&config.to_string()).expect("bench config");
    build_pools_from_scheduler_config::<u64, u64, Lateness, TokioSpawner>(
        &config,
        &QueueBuilderContext::Postgres(database.clone()),
        None,
        |_| Lateness,
        TokioSpawner,
    )
    .expect("bench pools")
}

/// Options that put a start at `at_ms`.
fn at(at_ms: u64) -> SubmitOptions {
    SubmitOptions::default().with_not_before(UNIX_EPOCH + Duration::from_millis(at_ms))
}

/// One case once: schedules `scale.tasks` tasks on the first node (after `sleeping`
/// sleepers), runs them on the last; returns each task's lateness, ms.
async fn round(database: &PgDatabase, scale: &Scale, sleeping: u64, two_nodes: bool) -> Vec<u64> {
    let queue = unique("due");
    let nodes = {
        let (database, queue) = (database.clone(), queue.clone());
        tokio::task::spawn_blocking(move || {
            let first = node(&database, &queue, if two_nodes { 0 } else { 2 });
            let worker = two_nodes.then(|| node(&database, &queue, 2));
            (first, worker)
        })
        .await
        .expect("the nodes start")
    };
    let scheduler = nodes.0.pools["node"].client().clone();
    let key = MailboxKey::new("bench").with_session(unique("s"));
    let task = |id: u64, due_ms: u64| {
        let meta = TaskMetadata::new(id, ResourceCost::cpu(1)).with_mailbox(key.clone());
        ScheduledTask::new(meta, due_ms)
    };
    let later = support::now_ms() + HOUR_MS;
    let sleepers: Vec<u64> = (1_000_000..1_000_000 + sleeping).collect();
    for chunk in sleepers.chunks(1_000) {
        let tasks = chunk.iter().map(|&id| task(id, later)).collect();
        let answers = scheduler.submit_batch(tasks, at(later)).await;
        assert!(answers.iter().all(Result::is_ok), "every sleeper is parked");
    }
    let first_ms = support::now_ms() + 600;
    for id in 1..=scale.tasks {
        let due_ms = first_ms + 25 * (id - 1);
        scheduler
            .submit(task(id, due_ms), at(due_ms))
            .await
            .expect("scheduled");
    }
    let mut lateness = Vec::new();
    for id in 1..=scale.tasks {
        let late = scheduler
            .retrieve_task(&key, id, Duration::from_secs(30))
            .await
            .expect("every scheduled task runs");
        lateness.push(late);
    }
    drop(nodes);
    lateness
}

/// The median, 90th percentile and largest of `values`.
fn spread(values: &mut [u64]) -> (u64, u64, u64) {
    values.sort_unstable();
    let at = |share: usize| values[(values.len() * share / 100).min(values.len() - 1)];
    (at(50), at(90), values[values.len() - 1])
}

fn main() {
    let scale = if support::measured() {
        Scale {
            tasks: support::env_u64("DUE_TASKS", 40),
            sleeping: support::env_u64("DUE_SLEEPING", 20_000),
            rounds: support::env_u64("DUE_ROUNDS", 3),
        }
    } else {
        Scale {
            tasks: 4,
            sleeping: 50,
            rounds: 1,
        }
    };
    let database = PgDatabase::connect(&support::database_url()).expect("the bench database");
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime");
    let cases = [
        ("one node, none sleeping", 0, false),
        ("one node, sleeping ahead", scale.sleeping, false),
        ("two nodes, none sleeping", 0, true),
    ];
    let mut results: Vec<Vec<u64>> = vec![Vec::new(); cases.len()];
    for _ in 0..scale.rounds {
        for (index, &(_, sleeping, two_nodes)) in cases.iter().enumerate() {
            let late = runtime.block_on(round(&database, &scale, sleeping, two_nodes));
            results[index].extend(late);
        }
    }
    println!(
        "due_starts: K = {} scheduled tasks 25 ms apart per case and round, S = {} sleeping an \
         hour ahead, {} rounds; lateness of each start after its instant, ms",
        scale.tasks, scale.sleeping, scale.rounds
    );
    println!("| case | starts | median | p90 | largest |");
    println!("|---|---:|---:|---:|---:|");
    for ((name, sleeping, _), late) in cases.iter().zip(results.iter_mut()) {
        let (median, p90, largest) = spread(late);
        let name = name.replace("sleeping ahead", &format!("{sleeping} sleeping ahead"));
        println!("| {name} | {} | {median} | {p90} | {largest} |", late.len());
    }
}
