//! Dependencies across real node processes on one Postgres queue (the table queue, and the
//! pgmq queue in builds with its feature) and mailbox: three
//! worker nodes (child processes of this test binary) run the tasks, and this process, a
//! producer-only node (`worker_threads: 0`), submits them. A parent runs on one node, its
//! child is submitted here, held in the queue, and released to whichever node claims it once
//! the parent succeeded; a failing parent cancels its children and theirs across nodes, and a
//! cleanup step runs anyway; a waiting child is cancelled from here.
//!
//! Each node records every start and end in a file of its own, with the time; a task that
//! waits does so for a file the test creates (its gate).

#[path = "support/processes.rs"]
mod processes;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use processes::{read_lines, NodeProcess};
use prometheus_parking_lot::core::scheduling::WaitReason;
use prometheus_parking_lot::core::{PoolError, ScheduledTask, SubmitOptions, TaskMetadata};
use prometheus_parking_lot::util::serde::{MailboxKey, ResourceCost, TaskId};
use prometheus_parking_lot::{
    build_pools_from_scheduler_config, BuiltPools, QueueBuilderContext, SchedulerConfig,
    TaskExecutor, TokioSpawner,
};
use serde::{Deserialize, Serialize};

/// The environment variable that carries a node's settings, as JSON.
const NODE_ENV: &str = "PL_DEPENDENCY_NODE";

/// The tenant every task is submitted under.
const TENANT: &str = "planner";

/// What a node is told.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct NodeSpec {
    /// The queue's `"type"`: `postgres` or `postgres_pgmq`.
    queue_type: String,
    queue: String,
    mailbox: String,
    /// Where it records its runs.
    runs: PathBuf,
}

/// What a task does: returns at once, or waits for its gate (a file) and then returns or
/// fails.
#[derive(Debug, Clone, Serialize, Deserialize)]
enum Step {
    Quick,
    WaitFor(PathBuf),
    FailAfter(PathBuf),
}

fn database_url() -> String {
    std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into())
}

/// One pool, `work`, with `workers` workers on the queue `queue` of `queue_type` (the table
/// queue or a pgmq queue, keeping dependencies), its results in the Postgres mailbox
/// `mailbox`.
fn config(queue_type: &str, queue: &str, mailbox: &str, workers: usize) -> SchedulerConfig {
    let queue = serde_json::json!({ "type": queue_type, "queue_name": queue, "lease_ms": 3_000,
                                    "dependencies": true });
    let config = serde_json::json!({
        "database_url": database_url(),
        "pools": { "work": {
            "worker_threads": workers,
            "max_units": 4,
            "queue": queue,
            "mailbox": { "storage": { "type": "postgres", "table": mailbox } }
        } }
    });
    SchedulerConfig::from_json_str(&config.to_string()).expect("the config is valid")
}

fn now_ms() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis()
}

/// Records each start and end, with the time, in the node's file.
#[derive(Clone)]
struct Recorder(Arc<Mutex<std::fs::File>>);

impl Recorder {
    fn line(&self, text: String) {
        let mut file = self.0.lock().unwrap();
        writeln!(file, "{text}").expect("record a line");
    }
}

async fn wait_for_file(path: &Path) {
    while !path.exists() {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[async_trait::async_trait]
impl TaskExecutor<Step, String> for Recorder {
    async fn execute(&self, step: Step, meta: TaskMetadata) -> String {
        self.line(format!("start {} {}", meta.id, now_ms()));
        match &step {
            Step::Quick => {}
            Step::WaitFor(gate) => wait_for_file(gate).await,
            Step::FailAfter(gate) => {
                wait_for_file(gate).await;
                self.line(format!("end {} {}", meta.id, now_ms()));
                panic!("step {} failed", meta.id);
            }
        }
        self.line(format!("end {} {}", meta.id, now_ms()));
        format!("done {}", meta.id)
    }
}

/// The node's role: runs what it claims until its stdin closes.
fn dependency_node() {
    let spec: NodeSpec =
        serde_json::from_str(&std::env::var(NODE_ENV).expect("started by the test"))
            .expect("the node's spec");
    let recorder = Recorder(Arc::new(Mutex::new(
        std::fs::File::create(&spec.runs).expect("the runs file"),
    )));
    let built = build_pools_from_scheduler_config::<Step, String, Recorder, TokioSpawner>(
        &config(&spec.queue_type, &spec.queue, &spec.mailbox, 2),
        &QueueBuilderContext::Embedded,
        None,
        |_| recorder.clone(),
        TokioSpawner,
    )
    .expect("the node starts");
    recorder.line("ready".into());
    processes::wait_for_stdin_to_close();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    let _ = runtime.block_on(built.pools["work"].shutdown_with_drain(Duration::from_secs(5)));
}

/// A worker node process and its runs file.
struct Node {
    process: NodeProcess,
    runs: PathBuf,
}

impl Node {
    fn lines(&self) -> Vec<String> {
        read_lines(&self.runs)
    }

    /// When this node recorded `what` (`start`, `end`) of task `id`, if it did.
    fn when(&self, what: &str, id: TaskId) -> Option<u128> {
        let prefix = format!("{what} {id} ");
        self.lines()
            .iter()
            .find_map(|line| line.strip_prefix(&prefix)?.parse().ok())
    }
}

/// The fleet: three worker nodes and the producer pool of this process.
struct Fleet {
    nodes: Vec<Node>,
    producer: BuiltPools<Step, String, Recorder>,
    dir: PathBuf,
}

impl Fleet {
    fn start(queue_type: &str) -> Self {
        let stamp = now_ms();
        let queue = format!("deps_{}_{stamp}", std::process::id());
        // A mailbox of the fleet's own: each case's tasks reuse the same ids.
        let mailbox = format!("pl_{queue}_results");
        let dir = std::env::temp_dir().join(&queue);
        std::fs::create_dir_all(&dir).unwrap();
        let nodes: Vec<Node> = (0..3)
            .map(|index| {
                let runs = dir.join(format!("node-{index}.runs"));
                let spec = NodeSpec {
                    queue_type: queue_type.to_owned(),
                    queue: queue.clone(),
                    mailbox: mailbox.clone(),
                    runs: runs.clone(),
                };
                let settings = serde_json::to_string(&spec).unwrap();
                Node {
                    process: NodeProcess::start("dependency_node", NODE_ENV, settings),
                    runs,
                }
            })
            .collect();
        let unused = Recorder(Arc::new(Mutex::new(
            std::fs::File::create(dir.join("producer.runs")).unwrap(),
        )));
        let producer = build_pools_from_scheduler_config::<Step, String, Recorder, TokioSpawner>(
            &config(queue_type, &queue, &mailbox, 0),
            &QueueBuilderContext::Embedded,
            None,
            |_| unused.clone(),
            TokioSpawner,
        )
        .expect("the producer starts");
        let deadline = Instant::now() + Duration::from_secs(60);
        while !nodes
            .iter()
            .all(|node| node.lines().contains(&"ready".into()))
        {
            assert!(Instant::now() < deadline, "the nodes did not start");
            std::thread::sleep(Duration::from_millis(20));
        }
        Self {
            nodes,
            producer,
            dir,
        }
    }

    fn gate(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    fn open(&self, gate: &Path) {
        std::fs::write(gate, b"open").expect("open a gate");
    }

    async fn submit(&self, id: TaskId, step: Step, options: SubmitOptions) -> MailboxKey {
        let key = MailboxKey::new(TENANT).with_session(format!("step-{id}"));
        let meta = TaskMetadata::new(id, ResourceCost::cpu(1)).with_mailbox(key);
        self.producer.pools["work"]
            .submit_with(ScheduledTask::new(meta, step), options)
            .await
            .unwrap_or_else(|error| panic!("task {id} admitted: {error}"))
    }

    async fn outcome(&self, key: &MailboxKey) -> Result<String, PoolError> {
        self.producer.pools["work"]
            .client()
            .retrieve(key, Duration::from_secs(30))
            .await
    }

    /// The node that started task `id`, waiting up to 30 s.
    async fn started_on(&self, id: TaskId) -> usize {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(index) = self.starts_of(id).first() {
                return *index;
            }
            assert!(Instant::now() < deadline, "task {id} did not start");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// The nodes that started task `id`.
    fn starts_of(&self, id: TaskId) -> Vec<usize> {
        (0..self.nodes.len())
            .filter(|&index| self.nodes[index].when("start", id).is_some())
            .collect()
    }
}

fn after(parents: &[TaskId]) -> SubmitOptions {
    SubmitOptions::default().with_depends_on(parents.iter().copied())
}

async fn a_child_waits_for_its_parent_on_another_node(fleet: &Fleet) {
    let gate = fleet.gate("parent-1");
    fleet
        .submit(1, Step::WaitFor(gate.clone()), SubmitOptions::default())
        .await;
    let parent_node = fleet.started_on(1).await;
    let child = fleet.submit(2, Step::Quick, after(&[1])).await;
    let why = fleet.producer.pools["work"].why_waiting(&child, 2).await;
    assert_eq!(why, Ok(Some(WaitReason::Dependencies { pending: 1 })));
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        fleet.starts_of(2).is_empty(),
        "the child started before its parent ended"
    );
    fleet.open(&gate);
    assert_eq!(fleet.outcome(&child).await, Ok("done 2".into()));
    let child_node = fleet.started_on(2).await;
    let parent_end = fleet.nodes[parent_node]
        .when("end", 1)
        .expect("the parent ended");
    let child_start = fleet.nodes[child_node]
        .when("start", 2)
        .expect("the child started");
    assert!(
        child_start >= parent_end,
        "the child started at {child_start}, before its parent ended at {parent_end}"
    );
    println!("parent 1 ran on node {parent_node}, child 2 (submitted here) on node {child_node}");
}

async fn a_failed_parent_cancels_its_descendants_on_every_node(fleet: &Fleet) {
    let gate = fleet.gate("parent-3");
    let parent = fleet
        .submit(3, Step::FailAfter(gate.clone()), SubmitOptions::default())
        .await;
    fleet.started_on(3).await;
    let child = fleet.submit(4, Step::Quick, after(&[3])).await;
    let grandchild = fleet.submit(5, Step::Quick, after(&[4])).await;
    let cleanup = fleet
        .submit(6, Step::Quick, after(&[3]).run_if_parents_fail())
        .await;
    fleet.open(&gate);
    assert!(matches!(
        fleet.outcome(&parent).await,
        Err(PoolError::Failed(_))
    ));
    assert_eq!(fleet.outcome(&child).await, Err(PoolError::Cancelled));
    assert_eq!(fleet.outcome(&grandchild).await, Err(PoolError::Cancelled));
    assert_eq!(fleet.outcome(&cleanup).await, Ok("done 6".into()));
    assert!(fleet.starts_of(4).is_empty(), "the child ran");
    assert!(fleet.starts_of(5).is_empty(), "the grandchild ran");
}

async fn a_waiting_child_is_cancelled_from_another_node(fleet: &Fleet) {
    let gate = fleet.gate("parent-7");
    let parent = fleet
        .submit(7, Step::WaitFor(gate.clone()), SubmitOptions::default())
        .await;
    fleet.started_on(7).await;
    let child = fleet.submit(8, Step::Quick, after(&[7])).await;
    fleet.producer.pools["work"]
        .cancel(&child, 8)
        .await
        .expect("the waiting child is cancelled");
    assert_eq!(fleet.outcome(&child).await, Err(PoolError::Cancelled));
    fleet.open(&gate);
    assert_eq!(fleet.outcome(&parent).await, Ok("done 7".into()));
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(fleet.starts_of(8).is_empty(), "the cancelled child ran");
}

/// The three cases on a fleet of `queue_type`.
fn dependencies_across_three_nodes(queue_type: &str) {
    let mut fleet = Fleet::start(queue_type);
    processes::on_runtime(async {
        a_child_waits_for_its_parent_on_another_node(&fleet).await;
        a_failed_parent_cancels_its_descendants_on_every_node(&fleet).await;
        a_waiting_child_is_cancelled_from_another_node(&fleet).await;
    });
    for node in &mut fleet.nodes {
        node.process.stop(Duration::from_secs(30));
    }
    let _ = std::fs::remove_dir_all(&fleet.dir);
}

fn on_the_table_queue() {
    dependencies_across_three_nodes("postgres");
}

#[cfg(feature = "pgmq")]
fn on_pgmq() {
    dependencies_across_three_nodes("postgres_pgmq");
}

fn main() {
    let tests: &[processes::Case] = &[
        (
            "dependencies_are_kept_across_three_nodes_on_the_table_queue",
            on_the_table_queue,
        ),
        #[cfg(feature = "pgmq")]
        ("dependencies_are_kept_across_three_nodes_on_pgmq", on_pgmq),
    ];
    processes::main(tests, &[("dependency_node", dependency_node)]);
}
