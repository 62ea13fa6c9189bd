//! A schedule carried by three real node processes on one Postgres queue: every node tries
//! every tick of a per-second cron expression, and each tick is enqueued once and run once in
//! the fleet (on the table queue, and with the `pgmq` feature on the PGMQ queues).
//!
//! Each node (a child process of this test binary, built from a config file as users build
//! one) records every run it starts, and when asked to stop, how many ticks it enqueued; the
//! test reads the files back and counts the ticks the database holds.

#[path = "support/processes.rs"]
mod processes;

use processes::{read_lines, NodeProcess};

use std::collections::BTreeMap;
use std::io::Write;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use prometheus_parking_lot::core::TaskMetadata;
use prometheus_parking_lot::util::serde::TaskId;
use prometheus_parking_lot::{
    build_pools_from_scheduler_config, QueueBuilderContext, SchedulerConfig, TaskExecutor,
    TokioSpawner,
};
use serde::{Deserialize, Serialize};

/// The environment variable that carries a node's settings, as JSON.
const NODE_ENV: &str = "PL_SCHEDULE_NODE";

/// What a node is told.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct NodeSpec {
    /// The queue's `type`: `postgres` or `postgres_pgmq`.
    backend: String,
    queue: String,
    runs: PathBuf,
}

fn database_url() -> String {
    std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into())
}

/// One pool, `work`, whose schedule `each-second` ticks every second.
fn node_config(spec: &NodeSpec) -> SchedulerConfig {
    let config = serde_json::json!({
        "database_url": database_url(),
        "pools": { "work": {
            "worker_threads": 2,
            "max_units": 4,
            "queue": { "type": spec.backend, "queue_name": spec.queue },
            "mailbox": { "storage": { "type": "in_memory" }, "retention_secs": 5 },
            "schedules": [{ "name": "each-second", "cron": "* * * * * *", "tz": "Europe/Paris",
                            "missed": "skip", "payload": "tick" }]
        } }
    });
    SchedulerConfig::from_json_str(&config.to_string()).expect("the node's config is valid")
}

/// Records the id of each task it runs (a tick's id is the same on every node).
#[derive(Clone)]
struct Recorder(Arc<Mutex<std::fs::File>>);

impl Recorder {
    fn line(&self, text: String) {
        let mut file = self.0.lock().unwrap();
        writeln!(file, "{text}").expect("record a line");
    }
}

#[async_trait::async_trait]
impl TaskExecutor<String, String> for Recorder {
    async fn execute(&self, payload: String, meta: TaskMetadata) -> String {
        self.line(format!("run {}", meta.id));
        payload
    }
}

/// The node's role: carries the schedule until its stdin closes.
fn schedule_node() {
    let spec: NodeSpec =
        serde_json::from_str(&std::env::var(NODE_ENV).expect("started by the test"))
            .expect("the node's spec");
    let recorder = Recorder(Arc::new(Mutex::new(
        std::fs::File::create(&spec.runs).expect("the runs file"),
    )));
    let built = build_pools_from_scheduler_config::<String, String, Recorder, TokioSpawner>(
        &node_config(&spec),
        &QueueBuilderContext::Embedded,
        None,
        |_| recorder.clone(),
        TokioSpawner,
    )
    .expect("the node starts");
    recorder.line("ready".into());
    processes::wait_for_stdin_to_close();
    let pool = &built.pools["work"];
    runtime()
        .block_on(pool.shutdown_with_drain(Duration::from_secs(5)))
        .expect("the node stops");
    let enqueued = pool.schedules()[0].enqueued;
    recorder.line(format!("enqueued {enqueued}"));
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime")
}

/// A node process and the file it records its runs in.
struct Node {
    process: NodeProcess,
    runs: PathBuf,
}

impl Node {
    fn start(spec: &NodeSpec) -> Self {
        let settings = serde_json::to_string(spec).unwrap();
        Self {
            process: NodeProcess::start("schedule_node", NODE_ENV, settings),
            runs: spec.runs.clone(),
        }
    }

    fn stop(&mut self) {
        self.process.stop(Duration::from_secs(30));
    }
}

/// The runs of every node: how often each task id ran.
fn runs_by_id(nodes: &[Node]) -> BTreeMap<TaskId, usize> {
    let mut runs = BTreeMap::new();
    for node in nodes {
        for line in read_lines(&node.runs) {
            if let Some(id) = line.strip_prefix("run ").and_then(|id| id.parse().ok()) {
                *runs.entry(id).or_insert(0) += 1;
            }
        }
    }
    runs
}

/// How many ticks of the schedule the database holds for `queue`.
fn ticks_stored(queue: &str) -> u64 {
    let queue = queue.to_owned();
    runtime().block_on(async move {
        use sea_orm::ConnectionTrait;
        let connection = sea_orm::Database::connect(database_url())
            .await
            .expect("connect");
        let row = connection
            .query_one_raw(sea_orm::Statement::from_string(
                sea_orm::DbBackend::Postgres,
                format!(
                    "SELECT count(*) AS ticks FROM pl_schedule_ticks \
                      WHERE place LIKE '% {queue}' AND schedule = 'each-second'"
                ),
            ))
            .await
            .expect("count the ticks")
            .expect("a row");
        let _ = connection.close().await;
        row.try_get::<i64>("", "ticks").expect("a count") as u64
    })
}

fn each_tick_runs_once_in_a_fleet_of_three(backend: &str) {
    let stamp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis();
    let queue = format!("sched_{}_{}", std::process::id(), stamp);
    let dir = std::env::temp_dir().join(&queue);
    std::fs::create_dir_all(&dir).unwrap();
    let mut nodes: Vec<Node> = (0..3)
        .map(|index| {
            Node::start(&NodeSpec {
                backend: backend.to_owned(),
                queue: queue.clone(),
                runs: dir.join(format!("node-{index}.runs")),
            })
        })
        .collect();
    let deadline = Instant::now() + Duration::from_secs(60);
    while runs_by_id(&nodes).len() < 5 {
        assert!(
            Instant::now() < deadline,
            "{backend}: five ticks did not run"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    for node in &mut nodes {
        node.stop();
    }
    let runs = runs_by_id(&nodes);
    let twice: Vec<_> = runs.iter().filter(|(_, count)| **count > 1).collect();
    assert!(
        twice.is_empty(),
        "{backend}: ticks that ran twice: {twice:?}"
    );
    let by_node: Vec<u64> = nodes
        .iter()
        .map(|node| {
            let lines = read_lines(&node.runs);
            let line = lines.iter().find_map(|line| line.strip_prefix("enqueued "));
            line.expect("the node wrote its count")
                .parse::<u64>()
                .unwrap()
        })
        .collect();
    let enqueued: u64 = by_node.iter().sum();
    let stored = ticks_stored(&queue);
    println!(
        "{backend}: {} ticks ran, {stored} stored, enqueued per node {by_node:?}",
        runs.len()
    );
    assert_eq!(
        enqueued, stored,
        "{backend}: the nodes together enqueued each stored tick once"
    );
    assert!(
        runs.len() as u64 <= stored,
        "{backend}: only stored ticks ran"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

fn main() {
    let tests: &[processes::Case] = &[
        (
            "each_cron_tick_runs_once_in_a_fleet_of_three_on_the_table_queue",
            || each_tick_runs_once_in_a_fleet_of_three("postgres"),
        ),
        #[cfg(feature = "pgmq")]
        (
            "each_cron_tick_runs_once_in_a_fleet_of_three_on_pgmq",
            || each_tick_runs_once_in_a_fleet_of_three("postgres_pgmq"),
        ),
    ];
    processes::main(tests, &[("schedule_node", schedule_node)]);
}
