//! Several real processes on one Postgres queue and mailbox, built from config files as users
//! build them: three worker nodes (child processes of this test binary, each with its own
//! capacity) and a producer-only node (this process, `worker_threads: 0`).
//!
//! Each node records every run it starts and ends in a file of its own, and checks its own
//! capacity as tasks start; the test reads the files back. Then one node is killed with
//! SIGKILL mid-run, and the others must finish its work.
//!
//! Every scenario runs on each shared queue backend: the Postgres table queue (`postgres`)
//! and, with the `pgmq` feature, the PGMQ queues (`postgres_pgmq`), which also check that two
//! processes installing PGMQ's SQL at once both succeed.

#[path = "support/processes.rs"]
mod processes;

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use prometheus_parking_lot::core::{PoolError, ScheduledTask, SubmitOptions, TaskMetadata};
use prometheus_parking_lot::util::serde::{MailboxKey, Priority, ResourceCost, TaskId};
use prometheus_parking_lot::{
    build_pools_from_scheduler_config, QueueBuilderContext, SchedulerConfig, TaskExecutor,
    TokioSpawner,
};
use serde::{Deserialize, Serialize};

/// The environment variable that makes this binary a worker node: the node's settings as JSON.
const NODE_ENV: &str = "PL_CLUSTER_NODE";

/// A job: how long it runs and how many units it takes.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Job {
    ms: u64,
    units: u32,
}

/// Which shared queue the nodes use.
#[cfg_attr(not(feature = "pgmq"), allow(dead_code))]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
enum Backend {
    /// `"type": "postgres"`, the table queue.
    Postgres,
    /// `"type": "postgres_pgmq"`.
    Pgmq,
}

impl Backend {
    /// The pool's `queue` settings for queue `queue`.
    fn queue_settings(self, queue: &str) -> serde_json::Value {
        match self {
            Backend::Postgres => {
                serde_json::json!({ "type": "postgres", "queue_name": queue, "lease_ms": 1_500 })
            }
            Backend::Pgmq => {
                serde_json::json!({ "type": "postgres_pgmq", "queue_name": queue, "lease_ms": 1_500 })
            }
        }
    }

    /// A prefix for this backend's queue names (pgmq names are at most 42 characters).
    fn prefix(self) -> &'static str {
        match self {
            Backend::Postgres => "cluster",
            Backend::Pgmq => "pgmq",
        }
    }
}

/// What a worker node is told.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct NodeSpec {
    backend: Backend,
    name: String,
    queue: String,
    mailbox: String,
    workers: usize,
    capacity: u32,
    runs: PathBuf,
    /// Jobs the node submits to itself once it is up (`(count, ms)`), as an API server
    /// colocated with a GPU would; each is recorded as `accepted ID` once its submit returns.
    #[serde(default)]
    own_jobs: Option<(u64, u64)>,
    /// Where the node POSTs terminal events (`mailbox.notifier`), if anywhere.
    #[serde(default)]
    webhook: Option<String>,
    /// The queue's `lease_ms` and `claim_ahead`, where not the defaults of [`config`].
    #[serde(default)]
    lease_ms: Option<u64>,
    #[serde(default)]
    claim_ahead: Option<u32>,
    /// How long the node drains when it gets SIGTERM.
    #[serde(default)]
    drain_ms: u64,
    /// The pool's `budgets` section, if it has one; the node then records the time and the
    /// units of each start (`spent ID UNITS MS`).
    #[serde(default)]
    budgets: Option<serde_json::Value>,
    /// The pool's `on_duplicate`, where not the default.
    #[serde(default)]
    on_duplicate: Option<String>,
    /// The pool's `fair_share`, if it has one; the node then records the time and the units
    /// of each start too.
    #[serde(default)]
    fair_share: Option<serde_json::Value>,
    /// The pool's `max_queued_units`, if it has one.
    #[serde(default)]
    max_queued_units: Option<u64>,
}

fn database_url() -> String {
    std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into())
}

fn config(
    backend: Backend,
    queue: &str,
    mailbox: &str,
    workers: usize,
    capacity: u32,
) -> SchedulerConfig {
    let results = serde_json::json!({ "storage": { "type": "postgres", "table": mailbox } });
    config_of(backend.queue_settings(queue), results, workers, capacity)
}

/// A node's config, as its spec asks.
fn node_config(spec: &NodeSpec) -> SchedulerConfig {
    let mut queue = spec.backend.queue_settings(&spec.queue);
    if let Some(lease_ms) = spec.lease_ms {
        queue["lease_ms"] = lease_ms.into();
    }
    if let Some(claim_ahead) = spec.claim_ahead {
        queue["claim_ahead"] = claim_ahead.into();
    }
    let mut results =
        serde_json::json!({ "storage": { "type": "postgres", "table": spec.mailbox } });
    if let Some(url) = &spec.webhook {
        results["notifier"] =
            serde_json::json!({ "type": "http", "base_url": url, "max_retries": 0 });
    }
    let mut config = config_json(queue, results, spec.workers, spec.capacity);
    if let Some(budgets) = &spec.budgets {
        config["pools"]["work"]["budgets"] = budgets.clone();
    }
    if let Some(on_duplicate) = &spec.on_duplicate {
        config["pools"]["work"]["on_duplicate"] = on_duplicate.as_str().into();
    }
    if let Some(fair_share) = &spec.fair_share {
        config["pools"]["work"]["fair_share"] = fair_share.clone();
    }
    if let Some(units) = spec.max_queued_units {
        config["pools"]["work"]["max_queued_units"] = units.into();
    }
    SchedulerConfig::from_json_str(&config.to_string()).expect("the cluster config is valid")
}

/// One pool, `work`, on `queue` with results in `results`.
fn config_of(
    queue: serde_json::Value,
    results: serde_json::Value,
    workers: usize,
    capacity: u32,
) -> SchedulerConfig {
    let text = config_json(queue, results, workers, capacity).to_string();
    SchedulerConfig::from_json_str(&text).expect("the cluster config is valid")
}

/// [`config_of`]'s text.
fn config_json(
    queue: serde_json::Value,
    results: serde_json::Value,
    workers: usize,
    capacity: u32,
) -> serde_json::Value {
    serde_json::json!({
        "database_url": database_url(),
        "pools": {
            "work": {
                "worker_threads": workers,
                "max_units": capacity,
                "max_queue_depth": 100_000,
                "queue": queue,
                "mailbox": results
            }
        }
    })
}

/// Records each start and end in the node's file, and any start past the node's capacity.
#[derive(Clone)]
struct Recorder {
    runs: Arc<Mutex<std::fs::File>>,
    in_flight: Arc<AtomicU32>,
    capacity: u32,
    /// Whether each start is recorded with its time and units.
    timed: bool,
}

impl Recorder {
    fn line(&self, text: String) {
        let mut file = self.runs.lock().unwrap();
        writeln!(file, "{text}").expect("record a run");
    }
}

#[async_trait::async_trait]
impl TaskExecutor<Job, u64> for Recorder {
    async fn execute(&self, job: Job, meta: TaskMetadata) -> u64 {
        let held = self.in_flight.fetch_add(job.units, Ordering::SeqCst) + job.units;
        if held > self.capacity {
            self.line(format!("over {} {held}", meta.id));
        }
        if self.timed {
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_millis();
            self.line(format!("spent {} {} {now}", meta.id, job.units));
        }
        self.line(format!("start {}", meta.id));
        tokio::time::sleep(Duration::from_millis(job.ms)).await;
        self.in_flight.fetch_sub(job.units, Ordering::SeqCst);
        self.line(format!("end {}", meta.id));
        meta.id * 2
    }
}

/// The worker node's role: runs until killed, or until its parent goes away.
fn cluster_node() {
    let spec = std::env::var(NODE_ENV).expect("started by a cluster test");
    let spec: NodeSpec = serde_json::from_str(&spec).expect("node spec");
    let recorder = Recorder {
        runs: Arc::new(Mutex::new(
            std::fs::File::create(&spec.runs).expect("the runs file"),
        )),
        in_flight: Arc::new(AtomicU32::new(0)),
        capacity: spec.capacity,
        timed: spec.budgets.is_some() || spec.fair_share.is_some(),
    };
    let built = build_pools_from_scheduler_config::<Job, u64, Recorder, TokioSpawner>(
        &node_config(&spec),
        &QueueBuilderContext::Embedded,
        None,
        |_| recorder.clone(),
        TokioSpawner,
    )
    .expect("the node starts");
    recorder.line("ready".into());
    let pool = &built.pools["work"];
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    if let Some((count, ms)) = spec.own_jobs {
        runtime.block_on(async {
            for id in 1..=count {
                let meta =
                    TaskMetadata::new(id, ResourceCost::cpu(1)).with_mailbox(own_key(&spec.queue));
                pool.submit(ScheduledTask::new(meta, Job { ms, units: 1 }))
                    .await
                    .expect("the node accepts its own job");
                recorder.line(format!("accepted {id}"));
            }
        });
    }
    // Stop when the parent test closes our stdin (it ended, or failed), or at SIGTERM, as a
    // deployment stops a node: drain, handing back what will not finish.
    runtime.block_on(async {
        use tokio::signal::unix::{signal, SignalKind};
        let mut terminate = signal(SignalKind::terminate()).expect("listen for SIGTERM");
        let (closed, stdin) = tokio::sync::oneshot::channel::<()>();
        // A thread of its own: a blocked read must not hold the runtime up at exit.
        std::thread::spawn(move || {
            let _ = std::io::stdin().read_line(&mut String::new());
            let _ = closed.send(());
        });
        tokio::select! {
            _ = terminate.recv() => {
                recorder.line("sigterm".into());
                pool.shutdown_with_drain(Duration::from_millis(spec.drain_ms))
                    .await
                    .expect("the node drains");
            }
            _ = stdin => {}
        }
    });
    let stats = pool.stats();
    recorder.line(format!(
        "stats completed {} lost {}",
        stats.completed_tasks, stats.lost_leases
    ));
    drop(built);
}

/// The key a node's own jobs are submitted under.
fn own_key(queue: &str) -> MailboxKey {
    MailboxKey::new("cluster").with_session(format!("{queue}-own"))
}

/// A worker node process; killed when dropped, so a failing test leaves none behind.
struct Node {
    name: String,
    child: Child,
    runs: PathBuf,
}

impl Node {
    fn start(spec: &NodeSpec) -> Self {
        let child = processes::child("cluster_node")
            .env(NODE_ENV, serde_json::to_string(spec).unwrap())
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .spawn()
            .expect("start a node process");
        Self {
            name: spec.name.clone(),
            child,
            runs: spec.runs.clone(),
        }
    }

    fn wait_ready(&self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        while !read_lines(&self.runs).iter().any(|line| line == "ready") {
            assert!(
                Instant::now() < deadline,
                "node {} did not start",
                self.name
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Sends `signal` (`STOP`, `CONT`, `TERM`) to the node.
    fn signal(&self, signal: &str) {
        let sent = std::process::Command::new("kill")
            .arg(format!("-{signal}"))
            .arg(self.child.id().to_string())
            .status()
            .expect("run kill");
        assert!(sent.success(), "SIG{signal} to node {}", self.name);
    }

    /// Asks the node to stop (closes its stdin), waits for it, and returns the `stats` line
    /// it wrote last: (completed tasks, lost leases).
    fn stop(&mut self) -> (u64, u64) {
        drop(self.child.stdin.take());
        let deadline = Instant::now() + Duration::from_secs(30);
        while self.child.try_wait().expect("wait for a node").is_none() {
            assert!(Instant::now() < deadline, "node {} did not stop", self.name);
            std::thread::sleep(Duration::from_millis(20));
        }
        let lines = read_lines(&self.runs);
        let stats = lines
            .iter()
            .rev()
            .find_map(|line| line.strip_prefix("stats "))
            .unwrap_or_else(|| panic!("node {} wrote no stats: {lines:?}", self.name));
        let numbers: Vec<u64> = stats
            .split(' ')
            .filter_map(|word| word.parse().ok())
            .collect();
        (numbers[0], numbers[1])
    }

    /// SIGKILL, as a crash.
    fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        self.kill();
    }
}

fn read_lines(path: &Path) -> Vec<String> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(str::to_owned)
        .collect()
}

/// What the nodes' files say: starts and ends per task and node, and capacity breaches.
#[derive(Default)]
struct Runs {
    starts: BTreeMap<TaskId, Vec<String>>,
    ended: BTreeMap<String, BTreeSet<TaskId>>,
    over: Vec<String>,
}

fn collect(nodes: &[&Node]) -> Runs {
    let mut runs = Runs::default();
    for node in nodes {
        for line in read_lines(&node.runs) {
            let mut words = line.split(' ');
            match (words.next(), words.next().and_then(|id| id.parse().ok())) {
                (Some("start"), Some(id)) => {
                    runs.starts.entry(id).or_default().push(node.name.clone())
                }
                (Some("end"), Some(id)) => {
                    runs.ended.entry(node.name.clone()).or_default().insert(id);
                }
                (Some("over"), _) => runs.over.push(format!("{}: {line}", node.name)),
                _ => {}
            }
        }
    }
    runs
}

/// Drops a test's mailbox table and, on pgmq, its queues, so runs leave no tables behind.
async fn clean_up(backend: Backend, queue: &str, table: &str) {
    use sea_orm::ConnectionTrait;
    if let Ok(connection) = sea_orm::Database::connect(database_url()).await {
        let _ = connection
            .execute_unprepared(&format!("DROP TABLE IF EXISTS {table}"))
            .await;
        if backend == Backend::Pgmq {
            for level in ["crit", "high", "norm", "low", "dlq"] {
                let _ = connection
                    .execute_unprepared(&format!("SELECT pgmq.drop_queue('{queue}_{level}')"))
                    .await;
            }
            let _ = connection
                .execute_unprepared(&format!(
                    "DELETE FROM pl_pgmq_entries WHERE queue_name = '{queue}'"
                ))
                .await;
        }
        let _ = connection.close().await;
    }
}

/// Names unique to this run: the queue, the mailbox table and a scratch directory.
fn fresh(backend: Backend, prefix: &str) -> (String, String, PathBuf) {
    let stamp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis();
    let queue = format!(
        "{}_{prefix}_{}_{stamp}",
        backend.prefix(),
        std::process::id()
    );
    let dir = std::env::temp_dir().join(&queue);
    std::fs::create_dir_all(&dir).unwrap();
    (queue.clone(), format!("{queue}_results"), dir)
}

fn node_spec(
    backend: Backend,
    name: &str,
    queue: &str,
    mailbox: &str,
    dir: &Path,
    workers: usize,
    capacity: u32,
) -> NodeSpec {
    NodeSpec {
        backend,
        name: name.into(),
        queue: queue.into(),
        mailbox: mailbox.into(),
        workers,
        capacity,
        runs: dir.join(format!("{name}.runs")),
        own_jobs: None,
        webhook: None,
        lease_ms: None,
        claim_ahead: None,
        drain_ms: 0,
        budgets: None,
        on_duplicate: None,
        fair_share: None,
        max_queued_units: None,
    }
}

/// A webhook receiver on 127.0.0.1: counts the terminal events POSTed to it, by task id.
struct Hooks {
    url: String,
    received: Arc<Mutex<BTreeMap<TaskId, usize>>>,
}

impl Hooks {
    fn start() -> Self {
        use std::io::{BufRead, BufReader, Read};
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind a webhook port");
        let url = format!("http://{}/done", listener.local_addr().unwrap());
        let received = Arc::new(Mutex::new(BTreeMap::new()));
        let counts = received.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let mut reader = BufReader::new(stream);
                let mut length = 0;
                loop {
                    let mut header = String::new();
                    if reader.read_line(&mut header).unwrap_or(0) == 0 || header == "\r\n" {
                        break;
                    }
                    let lower = header.to_ascii_lowercase();
                    if let Some(value) = lower.strip_prefix("content-length:") {
                        length = value.trim().parse().unwrap_or(0);
                    }
                }
                let mut body = vec![0; length];
                if reader.read_exact(&mut body).is_ok() {
                    let event: serde_json::Value =
                        serde_json::from_slice(&body).unwrap_or_default();
                    if let Some(id) = event["task_id"].as_u64() {
                        *counts.lock().unwrap().entry(id).or_insert(0) += 1;
                    }
                }
                let _ = reader.get_mut().write_all(
                    b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\nconnection: close\r\n\r\n",
                );
            }
        });
        Self { url, received }
    }

    fn counts(&self) -> BTreeMap<TaskId, usize> {
        self.received.lock().unwrap().clone()
    }
}

/// How many tasks of shared queue `queue` are claimed, by any node.
async fn claimed_in(backend: Backend, queue: &str) -> usize {
    use prometheus_parking_lot::core::SharedQueue;
    use prometheus_parking_lot::infra::postgres::PgDatabase;
    let queue = queue.to_owned();
    let shared: Box<dyn SharedQueue<Job>> = tokio::task::spawn_blocking(move || {
        let database = PgDatabase::connect(&database_url()).expect("connect");
        match backend {
            Backend::Postgres => Box::new(
                prometheus_parking_lot::infra::queue::postgres::PostgresQueue::<Job>::open(
                    &database,
                    "pl_queue_jobs",
                    &queue,
                )
                .expect("open the queue"),
            ) as Box<dyn SharedQueue<Job>>,
            #[cfg(feature = "pgmq")]
            Backend::Pgmq => Box::new(
                prometheus_parking_lot::infra::queue::pgmq::PgmqQueue::<Job>::open(
                    &database, &queue,
                )
                .expect("open the queue"),
            ),
            #[cfg(not(feature = "pgmq"))]
            Backend::Pgmq => unreachable!("pgmq scenarios need the pgmq feature"),
        }
    })
    .await
    .unwrap();
    shared.maintenance().counts().await.expect("counts").claimed
}

/// How many results the mailbox table `table` holds.
async fn stored_results(table: &str) -> i64 {
    use sea_orm::ConnectionTrait;
    let connection = sea_orm::Database::connect(database_url()).await.unwrap();
    let row = connection
        .query_one_raw(sea_orm::Statement::from_string(
            sea_orm::DbBackend::Postgres,
            format!("SELECT count(*) AS n FROM {table}"),
        ))
        .await
        .unwrap()
        .unwrap();
    let count = row.try_get::<i64>("", "n").unwrap();
    let _ = connection.close().await;
    count
}

/// Submits `jobs` through the producer-only node and retrieves every result.
async fn produce(
    backend: Backend,
    queue: &str,
    mailbox: &str,
    jobs: Vec<(TaskId, Job)>,
    mut progress: impl FnMut(usize),
) -> BTreeMap<TaskId, Result<u64, PoolError>> {
    let built = build_pools_from_scheduler_config::<Job, u64, Recorder, TokioSpawner>(
        &config(backend, queue, mailbox, 0, 1_000),
        &QueueBuilderContext::Embedded,
        None,
        |_| unreachable_executor(),
        TokioSpawner,
    )
    .expect("the producer starts");
    let pool = &built.pools["work"];
    assert_eq!(
        pool.stats().worker_count,
        0,
        "a producer-only node runs nothing"
    );
    let key = MailboxKey::new("cluster").with_session(queue);
    let ids: Vec<TaskId> = jobs.iter().map(|(id, _)| *id).collect();
    for chunk in jobs.chunks(500) {
        let tasks = chunk
            .iter()
            .map(|(id, job)| {
                let meta =
                    TaskMetadata::new(*id, ResourceCost::cpu(job.units)).with_mailbox(key.clone());
                ScheduledTask::new(meta, job.clone())
            })
            .collect();
        for answer in pool
            .client()
            .submit_batch(tasks, SubmitOptions::default())
            .await
        {
            assert_eq!(
                answer.as_ref().map(|_| ()),
                Ok(()),
                "submit through the producer"
            );
        }
    }
    let mut results = BTreeMap::new();
    for (done, id) in ids.into_iter().enumerate() {
        let result = pool.retrieve_task(&key, id, Duration::from_secs(60)).await;
        results.insert(id, result);
        progress(done + 1);
    }
    results
}

/// The producer's executor never runs: it has no workers.
fn unreachable_executor() -> Recorder {
    Recorder {
        runs: Arc::new(Mutex::new(tempfile_sink())),
        in_flight: Arc::new(AtomicU32::new(0)),
        capacity: 0,
        timed: false,
    }
}

fn tempfile_sink() -> std::fs::File {
    std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .open(std::env::temp_dir().join("pl_cluster_producer.runs"))
        .expect("a sink")
}

async fn three_nodes_run_every_job_exactly_once_within_their_capacity(backend: Backend) {
    let (queue, mailbox, dir) = fresh(backend, "all");
    let specs = [
        node_spec(backend, "a", &queue, &mailbox, &dir, 2, 4),
        node_spec(backend, "b", &queue, &mailbox, &dir, 3, 3),
        node_spec(backend, "c", &queue, &mailbox, &dir, 1, 8),
    ];
    let nodes: Vec<Node> = specs.iter().map(Node::start).collect();
    nodes.iter().for_each(Node::wait_ready);

    let jobs: Vec<(TaskId, Job)> = (1..=10_000)
        .map(|id| {
            (
                id,
                Job {
                    ms: 0,
                    units: 1 + (id % 3) as u32,
                },
            )
        })
        .collect();
    let results = produce(backend, &queue, &mailbox, jobs, |_| {}).await;

    for (id, result) in &results {
        assert_eq!(result, &Ok(id * 2), "the result of job {id}");
    }
    let runs = collect(&nodes.iter().collect::<Vec<_>>());
    assert_eq!(
        runs.over,
        Vec::<String>::new(),
        "a node went over its capacity"
    );
    assert_eq!(runs.starts.len(), 10_000, "every job ran");
    let twice: Vec<_> = runs
        .starts
        .iter()
        .filter(|(_, nodes)| nodes.len() > 1)
        .collect();
    assert!(twice.is_empty(), "jobs ran more than once: {twice:?}");
    for node in &nodes {
        let ran = runs.ended.get(&node.name).map_or(0, BTreeSet::len);
        eprintln!("node {} ran {ran} jobs", node.name);
        assert!(ran > 0, "node {} took part", node.name);
    }
    clean_up(backend, &queue, &mailbox).await;
    let _ = std::fs::remove_dir_all(&dir);
}

/// Three nodes with one budget between them: 100 units a second, 20 at once. Every node
/// could spend it all on its own; the fleet together spends no more than the budget in any
/// window (checked over every pair of starts, with the time a claimed task takes to start
/// as slack), and most of it while work waits.
async fn three_nodes_share_one_budget_and_together_stay_within_it(backend: Backend) {
    const RATE_PER_SEC: u64 = 100;
    const BURST: u64 = 20;
    const SLACK_MS: u64 = 500;
    let (queue, mailbox, dir) = fresh(backend, "budget");
    let budgets =
        serde_json::json!({ "cpu": { "units": RATE_PER_SEC, "per_secs": 1, "burst": BURST } });
    let specs: Vec<NodeSpec> = ["a", "b", "c"]
        .into_iter()
        .map(|name| NodeSpec {
            budgets: Some(budgets.clone()),
            ..node_spec(backend, name, &queue, &mailbox, &dir, 2, BURST as u32)
        })
        .collect();
    let nodes: Vec<Node> = specs.iter().map(Node::start).collect();
    nodes.iter().for_each(Node::wait_ready);

    let jobs: Vec<(TaskId, Job)> = (1..=150)
        .map(|id| {
            (
                id,
                Job {
                    ms: 10,
                    units: 1 + (id % 4) as u32,
                },
            )
        })
        .collect();
    let offered: u64 = jobs.iter().map(|(_, job)| u64::from(job.units)).sum();
    let results = produce(backend, &queue, &mailbox, jobs, |_| {}).await;
    for (id, result) in &results {
        assert_eq!(result, &Ok(id * 2), "the result of job {id}");
    }

    // (time, units) of every start, across the nodes, in time order.
    let mut spent: Vec<(u64, u64)> = Vec::new();
    for node in &nodes {
        let mut ran = 0;
        for line in read_lines(&node.runs) {
            let words: Vec<&str> = line.split(' ').collect();
            if let ["spent", _, units, at] = words[..] {
                spent.push((at.parse().unwrap(), units.parse().unwrap()));
                ran += 1;
            }
        }
        eprintln!("node {} started {ran} jobs", node.name);
    }
    spent.sort_unstable();
    assert_eq!(spent.len(), 150, "every job started once");
    assert_eq!(spent.iter().map(|(_, units)| units).sum::<u64>(), offered);
    for i in 0..spent.len() {
        let mut sum = 0;
        for j in i..spent.len() {
            sum += spent[j].1;
            let window = spent[j].0 - spent[i].0;
            let bound = BURST + RATE_PER_SEC * (window + SLACK_MS) / 1_000;
            assert!(
                sum <= bound,
                "the fleet spent {sum} units in {window} ms (starts {i}..={j}); the budget allows {bound}"
            );
        }
    }
    let span_ms = spent.last().unwrap().0 - spent[0].0;
    let rate = (offered - BURST) * 1_000 / span_ms.max(1);
    eprintln!("the fleet spent {offered} units in {span_ms} ms: {rate} units/s after the burst, of {RATE_PER_SEC}");
    assert!(
        rate >= RATE_PER_SEC * 85 / 100,
        "the fleet spent {rate} units/s of a budget of {RATE_PER_SEC} while work waited"
    );
    clean_up(backend, &queue, &mailbox).await;
    let _ = std::fs::remove_dir_all(&dir);
}

/// Three nodes (one worker each) on the table queue, with a fair share by use that weighs
/// tenant acme 3 and every other tenant 1, claim the jobs of acme and globex, 60 each, all
/// waiting at once. Their claims follow the fleet's counters, kept in Postgres and charged
/// in each claim's transaction: each acme job charges 1/3, each globex job 1, and while both
/// wait the counters differ by at most one largest weighted cost (1). So in every prefix of
/// the starts while both tenants wait, acme's starts over 3 and globex's starts differ by at
/// most that bound, plus one for starts that different nodes record out of their claims'
/// order; and the table holds what the claims charged.
async fn three_nodes_share_one_fair_share_by_use() {
    let backend = Backend::Postgres;
    let (queue, mailbox, dir) = fresh(backend, "fair");
    let fair_share = serde_json::json!({
        "by_use": { "charge": "reported", "weights": { "acme": 3, "*": 1 } }
    });
    let specs: Vec<NodeSpec> = ["a", "b", "c"]
        .into_iter()
        .map(|name| NodeSpec {
            fair_share: Some(fair_share.clone()),
            ..node_spec(backend, name, &queue, &mailbox, &dir, 1, 1)
        })
        .collect();
    let nodes: Vec<Node> = specs.iter().map(Node::start).collect();
    nodes.iter().for_each(Node::wait_ready);

    let built = build_pools_from_scheduler_config::<Job, u64, Recorder, TokioSpawner>(
        &config(backend, &queue, &mailbox, 0, 1_000),
        &QueueBuilderContext::Embedded,
        None,
        |_| unreachable_executor(),
        TokioSpawner,
    )
    .expect("the producer starts");
    let pool = &built.pools["work"];
    let (acme, globex) = (MailboxKey::new("acme"), MailboxKey::new("globex"));
    let mut tasks = Vec::new();
    for n in 1..=60 {
        for (key, id) in [(&acme, n), (&globex, 1_000 + n)] {
            let meta = TaskMetadata::new(id, ResourceCost::cpu(1)).with_mailbox(key.clone());
            tasks.push(ScheduledTask::new(meta, Job { ms: 20, units: 1 }));
        }
    }
    for answer in pool
        .client()
        .submit_batch(tasks, SubmitOptions::default())
        .await
    {
        assert_eq!(answer.map(|_| ()), Ok(()), "submit through the producer");
    }
    for n in 1..=60 {
        for (key, id) in [(&acme, n), (&globex, 1_000 + n)] {
            let result = pool.retrieve_task(key, id, Duration::from_secs(60)).await;
            assert_eq!(result, Ok(id * 2), "the result of job {id}");
        }
    }

    // Every start across the fleet, in time order: whether it was acme's.
    let mut starts: Vec<(u64, bool)> = Vec::new();
    for node in &nodes {
        for line in read_lines(&node.runs) {
            let words: Vec<&str> = line.split(' ').collect();
            if let ["spent", id, _, at] = words[..] {
                let id: u64 = id.parse().unwrap();
                starts.push((at.parse().unwrap(), id < 1_000));
            }
        }
    }
    starts.sort_unstable();
    assert_eq!(starts.len(), 120, "every job started once");
    let (mut acme_started, mut globex_started) = (0u32, 0u32);
    for (_, is_acme) in &starts {
        if *is_acme {
            acme_started += 1;
        } else {
            globex_started += 1;
        }
        if acme_started == 60 || globex_started == 60 {
            break;
        }
        let gap = (f64::from(acme_started) / 3.0 - f64::from(globex_started)).abs();
        assert!(
            gap <= 2.0,
            "after {acme_started} acme and {globex_started} globex starts the weighted gap is {gap}"
        );
    }
    eprintln!("acme's 60 jobs started with {globex_started} of globex's");
    assert!(
        (18..=22).contains(&globex_started),
        "acme, weighing 3, ran its 60 jobs beside {globex_started} of globex's"
    );

    // The fleet's counters: 60 jobs of one unit each, at weights 3 and 1.
    use sea_orm::{ConnectionTrait, Statement};
    let connection = sea_orm::Database::connect(database_url()).await.unwrap();
    let rows = connection
        .query_all_raw(Statement::from_sql_and_values(
            sea_orm::DbBackend::Postgres,
            "SELECT tenant, service FROM pl_fleet_service WHERE queue_key LIKE $1 ORDER BY tenant",
            [format!("% {queue}").into()],
        ))
        .await
        .unwrap();
    let counters: Vec<(String, f64)> = rows
        .iter()
        .map(|row| {
            (
                row.try_get("", "tenant").unwrap(),
                row.try_get("", "service").unwrap(),
            )
        })
        .collect();
    assert_eq!(counters.len(), 2, "{counters:?}");
    assert_eq!(counters[0].0, "acme");
    assert!((counters[0].1 - 20.0).abs() < 1e-9, "{counters:?}");
    assert_eq!(counters[1].0, "globex");
    assert!((counters[1].1 - 60.0).abs() < 1e-9, "{counters:?}");
    for table in ["pl_fleet_service", "pl_fleet_service_floors"] {
        let _ = connection
            .execute_raw(Statement::from_sql_and_values(
                sea_orm::DbBackend::Postgres,
                format!("DELETE FROM {table} WHERE queue_key LIKE $1"),
                [format!("% {queue}").into()],
            ))
            .await;
    }
    let _ = connection.close().await;
    drop(built);
    clean_up(backend, &queue, &mailbox).await;
    let _ = std::fs::remove_dir_all(&dir);
}

/// Two nodes that attach repeated submissions (`"on_duplicate": "attach"`) are each sent
/// the same 40 jobs (same key, same ids) by callers of their own, at once: both accept
/// every job, and each job runs once in the whole fleet, with one result.
async fn a_job_submitted_to_two_nodes_runs_once(backend: Backend) {
    const JOBS: usize = 40;
    let (queue, mailbox, dir) = fresh(backend, "twice");
    let specs: Vec<NodeSpec> = ["a", "b"]
        .into_iter()
        .map(|name| NodeSpec {
            own_jobs: Some((JOBS as u64, 30)),
            on_duplicate: Some("attach".into()),
            ..node_spec(backend, name, &queue, &mailbox, &dir, 2, 2)
        })
        .collect();
    let nodes: Vec<Node> = specs.iter().map(Node::start).collect();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let runs = collect(&nodes.iter().collect::<Vec<_>>());
        let ended: BTreeSet<TaskId> = runs.ended.values().flatten().copied().collect();
        let accepted = nodes
            .iter()
            .map(|node| {
                read_lines(&node.runs)
                    .iter()
                    .filter(|line| line.starts_with("accepted"))
                    .count()
            })
            .collect::<Vec<_>>();
        if ended.len() == JOBS && accepted == [JOBS, JOBS] {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the jobs did not all end: {} ended, accepted {accepted:?}",
            ended.len()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    // A second run would start within a claim or two.
    std::thread::sleep(Duration::from_millis(500));
    let runs = collect(&nodes.iter().collect::<Vec<_>>());
    assert_eq!(runs.starts.len(), JOBS, "every job ran");
    let twice: Vec<_> = runs
        .starts
        .iter()
        .filter(|(_, nodes)| nodes.len() > 1)
        .collect();
    assert!(twice.is_empty(), "jobs ran more than once: {twice:?}");
    assert_eq!(
        stored_results(&mailbox).await,
        JOBS as i64,
        "one result per job"
    );
    clean_up(backend, &queue, &mailbox).await;
    let _ = std::fs::remove_dir_all(&dir);
}

async fn a_killed_nodes_jobs_are_rescued_and_finished_by_the_others(backend: Backend) {
    let (queue, mailbox, dir) = fresh(backend, "kill");
    let specs = [
        node_spec(backend, "a", &queue, &mailbox, &dir, 2, 4),
        node_spec(backend, "b", &queue, &mailbox, &dir, 2, 4),
        node_spec(backend, "c", &queue, &mailbox, &dir, 2, 4),
    ];
    let mut nodes: Vec<Node> = specs.iter().map(Node::start).collect();
    nodes.iter().for_each(Node::wait_ready);

    let jobs: Vec<(TaskId, Job)> = (1..=600).map(|id| (id, Job { ms: 20, units: 1 })).collect();
    let victim_runs = nodes[1].runs.clone();
    let mut victim = Some(nodes.remove(1));
    let results = produce(backend, &queue, &mailbox, jobs, |_| {
        // Kill node b once it is well into its share of the work.
        let started = read_lines(&victim_runs)
            .iter()
            .filter(|l| l.starts_with("start"))
            .count();
        if started >= 20 {
            if let Some(mut node) = victim.take() {
                node.kill();
                nodes.push(node);
            }
        }
    })
    .await;
    assert!(victim.is_none(), "node b was killed mid-run");

    for (id, result) in &results {
        assert_eq!(result, &Ok(id * 2), "the result of job {id}");
    }
    let runs = collect(&nodes.iter().collect::<Vec<_>>());
    assert_eq!(runs.over, Vec::<String>::new());
    assert_eq!(runs.starts.len(), 600, "every job ran");
    let twice: BTreeSet<TaskId> = runs
        .starts
        .iter()
        .filter(|(_, nodes)| nodes.len() > 1)
        .map(|(id, _)| *id)
        .collect();
    let on_b: BTreeSet<TaskId> = runs
        .starts
        .iter()
        .filter(|(_, nodes)| nodes.iter().any(|node| node == "b"))
        .map(|(id, _)| *id)
        .collect();
    let unfinished_on_b: BTreeSet<TaskId> = on_b
        .iter()
        .filter(|id| !runs.ended.get("b").is_some_and(|ended| ended.contains(id)))
        .copied()
        .collect();
    eprintln!(
        "node b started {} jobs, left {} unfinished; {} jobs ran twice",
        on_b.len(),
        unfinished_on_b.len(),
        twice.len()
    );
    assert!(
        twice.is_subset(&on_b),
        "only jobs node b had ran twice: {twice:?}"
    );
    // Node b had at most its 2 workers' jobs running, plus jobs whose run ended but whose
    // outcome was not yet published (its store and settle, one transaction, in flight):
    // those run again too. They are among the last jobs b ended, never older work: b's
    // two workers end about 100 jobs a second, so its last 16 ends cover the last 160 ms
    // of publications, more than a store group takes on a busy machine.
    let b_ended_in_order: Vec<TaskId> =
        read_lines(&nodes.iter().find(|n| n.name == "b").expect("b").runs)
            .iter()
            .filter_map(|line| line.strip_prefix("end "))
            .filter_map(|id| id.split(' ').next()?.parse().ok())
            .collect();
    let recent: BTreeSet<TaskId> = b_ended_in_order.iter().rev().take(16).copied().collect();
    let rerun_after_ending: BTreeSet<TaskId> =
        twice.difference(&unfinished_on_b).copied().collect();
    assert!(
        rerun_after_ending.is_subset(&recent),
        "only b's last publications in flight ran again: {rerun_after_ending:?} (b's last ends: {recent:?})"
    );
    assert!(
        unfinished_on_b.is_subset(&twice),
        "every job b left unfinished ran again elsewhere"
    );
    clean_up(backend, &queue, &mailbox).await;
    let _ = std::fs::remove_dir_all(&dir);
}

async fn tasks_a_killed_node_started_at_once_are_stored_and_run_elsewhere(backend: Backend) {
    let (queue, mailbox, dir) = fresh(backend, "acc");
    // The node accepts 6 jobs of its own: 2 start at once on its 2 workers (stored as its
    // claims: the default durability, accepted), 4 park in the shared queue.
    let mut spec = node_spec(backend, "a", &queue, &mailbox, &dir, 2, 2);
    spec.own_jobs = Some((6, 60_000));
    let mut node = Node::start(&spec);
    node.wait_ready();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let lines = read_lines(&node.runs);
        let accepted = lines.iter().filter(|l| l.starts_with("accepted")).count();
        let started = lines.iter().filter(|l| l.starts_with("start")).count();
        if accepted == 6 && started == 2 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "node a did not accept its jobs: {lines:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    node.kill();

    // A second node, in this process, finds every accepted job: the 4 parked ones, and the
    // 2 that were running on node a once their leases run out.
    let recorder = Recorder {
        runs: Arc::new(Mutex::new(
            std::fs::File::create(dir.join("b.runs")).unwrap(),
        )),
        in_flight: Arc::new(AtomicU32::new(0)),
        capacity: 8,
        timed: false,
    };
    let built = {
        let (queue, mailbox, recorder) = (queue.clone(), mailbox.clone(), recorder.clone());
        tokio::task::spawn_blocking(move || {
            build_pools_from_scheduler_config::<Job, u64, Recorder, TokioSpawner>(
                &config(backend, &queue, &mailbox, 8, 8),
                &QueueBuilderContext::Embedded,
                None,
                |_| recorder.clone(),
                TokioSpawner,
            )
            .expect("node b starts")
        })
        .await
        .unwrap()
    };
    let pool = &built.pools["work"];
    let runs_b = || read_lines(&dir.join("b.runs"));
    let deadline = Instant::now() + Duration::from_secs(30);
    while runs_b().iter().filter(|l| l.starts_with("start")).count() < 6 {
        assert!(
            Instant::now() < deadline,
            "node b did not start every accepted job: {:?}",
            runs_b()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let started: BTreeSet<TaskId> = runs_b()
        .iter()
        .filter_map(|l| l.strip_prefix("start ").and_then(|id| id.parse().ok()))
        .collect();
    assert_eq!(
        started,
        (1..=6).collect(),
        "every accepted job runs on node b"
    );
    let on_a: BTreeSet<TaskId> = read_lines(&node.runs)
        .iter()
        .filter_map(|l| l.strip_prefix("start ").and_then(|id| id.parse().ok()))
        .collect();
    assert_eq!(on_a.len(), 2, "node a ran 2 at once before it died");
    assert_eq!(pool.stats().active_tasks, 6);
    pool.shutdown_with_drain(Duration::from_millis(10))
        .await
        .expect("node b stops");
    clean_up(backend, &queue, &mailbox).await;
    let _ = std::fs::remove_dir_all(&dir);
}

/// `max_queued_units` across processes: node a (a child process, one worker) runs one job
/// of its own and parks two more (Normal), which fill the fleet's bound of 2 units. A High
/// job this process submits sheds a's worst-ranked one (its last), whose result, read back
/// from the shared mailbox, is `QueueFull`; a Normal job then finds nothing lower to shed
/// and is refused `QueueFull` at its submit. The High job runs before a's other parked one,
/// and the shed job never starts.
async fn a_bound_on_queued_units_sheds_another_processs_task_for_a_higher_priority(
    backend: Backend,
) {
    let (queue, mailbox, dir) = fresh(backend, "bound");
    let mut spec = node_spec(backend, "a", &queue, &mailbox, &dir, 1, 1);
    spec.own_jobs = Some((3, 4_000));
    spec.max_queued_units = Some(2);
    let node = Node::start(&spec);
    node.wait_ready();
    let deadline = Instant::now() + Duration::from_secs(30);
    while read_lines(&node.runs)
        .iter()
        .filter(|line| line.starts_with("accepted"))
        .count()
        < 3
    {
        assert!(Instant::now() < deadline, "node a did not accept its jobs");
        std::thread::sleep(Duration::from_millis(20));
    }
    let mut producer = config_json(
        backend.queue_settings(&queue),
        serde_json::json!({ "storage": { "type": "postgres", "table": mailbox } }),
        0,
        1,
    );
    producer["pools"]["work"]["max_queued_units"] = 2.into();
    let producer = SchedulerConfig::from_json_str(&producer.to_string()).expect("valid");
    let built = tokio::task::spawn_blocking(move || {
        build_pools_from_scheduler_config::<Job, u64, Recorder, TokioSpawner>(
            &producer,
            &QueueBuilderContext::Embedded,
            None,
            |_| unreachable_executor(),
            TokioSpawner,
        )
        .expect("the producer starts")
    })
    .await
    .unwrap();
    let pool = &built.pools["work"];
    let key = MailboxKey::new("cluster").with_session(format!("{queue}-producer"));
    let job = |id: TaskId, priority: Priority| {
        let meta = TaskMetadata::new(id, ResourceCost::cpu(1))
            .with_priority(priority)
            .with_mailbox(key.clone());
        ScheduledTask::new(meta, Job { ms: 0, units: 1 })
    };
    pool.submit(job(100, Priority::High))
        .await
        .expect("sheds a's last parked job");
    assert_eq!(
        pool.submit(job(101, Priority::Normal)).await,
        Err(PoolError::QueueFull),
        "nothing below Normal is left to shed"
    );
    let wait = Duration::from_secs(30);
    assert_eq!(
        pool.retrieve_task(&own_key(&queue), 3, wait).await,
        Err(PoolError::QueueFull),
        "a's shed job: its caller hears it through the shared mailbox"
    );
    assert_eq!(pool.retrieve_task(&key, 100, wait).await, Ok(200));
    assert_eq!(pool.retrieve_task(&own_key(&queue), 2, wait).await, Ok(4));
    let started: Vec<String> = read_lines(&node.runs)
        .into_iter()
        .filter_map(|line| line.strip_prefix("start ").map(str::to_owned))
        .collect();
    assert_eq!(
        started,
        ["1", "100", "2"],
        "the High job first; job 3 never"
    );
    drop(built);
    drop(node);
    clean_up(backend, &queue, &mailbox).await;
    let _ = std::fs::remove_dir_all(&dir);
}

/// Node a claims two jobs and is stopped (SIGSTOP) past its lease; node b rescues and
/// finishes them, and the producer gets b's results. When a resumes, its runs are stopped or
/// their results refused by the claim's fence: nothing of a's is stored or POSTed, each job
/// has exactly one terminal record and one webhook call, and a counts two lost leases and no
/// completion.
async fn a_stalled_node_publishes_nothing_for_work_another_node_took_over(backend: Backend) {
    let (queue, mailbox, dir) = fresh(backend, "stall");
    let hooks = Hooks::start();
    let webhook = cfg!(feature = "webhook").then(|| hooks.url.clone());
    let mut spec_a = node_spec(backend, "a", &queue, &mailbox, &dir, 2, 2);
    spec_a.webhook = webhook.clone();
    let mut spec_b = node_spec(backend, "b", &queue, &mailbox, &dir, 2, 2);
    spec_b.webhook = webhook.clone();
    let mut a = Node::start(&spec_a);
    a.wait_ready();

    let built = build_pools_from_scheduler_config::<Job, u64, Recorder, TokioSpawner>(
        &config(backend, &queue, &mailbox, 0, 1_000),
        &QueueBuilderContext::Embedded,
        None,
        |_| unreachable_executor(),
        TokioSpawner,
    )
    .expect("the producer starts");
    let producer = &built.pools["work"];
    let key = MailboxKey::new("cluster").with_session(&queue);
    for id in [1, 2] {
        let meta = TaskMetadata::new(id, ResourceCost::cpu(1)).with_mailbox(key.clone());
        let job = Job {
            ms: 2_500,
            units: 1,
        };
        producer
            .submit(ScheduledTask::new(meta, job))
            .await
            .expect("submit");
    }
    let started_on = |node: &Node| {
        read_lines(&node.runs)
            .iter()
            .filter(|line| line.starts_with("start"))
            .count()
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    while started_on(&a) < 2 {
        assert!(Instant::now() < deadline, "node a did not start both jobs");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    a.signal("STOP");
    let stopped_at = Instant::now();

    let mut b = Node::start(&spec_b);
    b.wait_ready();
    for id in [1, 2] {
        let result = producer
            .retrieve_task(&key, id, Duration::from_secs(30))
            .await;
        assert_eq!(result, Ok(id * 2), "job {id}, finished by node b");
    }
    assert_eq!(started_on(&b), 2, "node b ran both jobs");
    let stalled = stopped_at.elapsed();
    assert!(
        stalled > Duration::from_millis(1_500),
        "a stall past the lease"
    );
    a.signal("CONT");
    // Node a's runs wake to find their claims gone: a renewal (within a third of the
    // lease) stops them, or their results reach the fence first.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let (completed_a, lost_a) = a.stop();
    let (completed_b, lost_b) = b.stop();
    eprintln!(
        "node a stalled {stalled:?}: completed {completed_a}, lost {lost_a}; node b: completed {completed_b}, lost {lost_b}"
    );

    assert_eq!(stored_results(&mailbox).await, 0, "no stale second result");
    let again = producer
        .retrieve_task(&key, 1, Duration::from_millis(500))
        .await;
    assert_eq!(
        again,
        Err(PoolError::Timeout),
        "a second retrieve finds nothing"
    );
    assert_eq!((completed_a, lost_a), (0, 2), "node a lost both claims");
    assert_eq!((completed_b, lost_b), (2, 0), "node b completed both");
    if webhook.is_some() {
        let deadline = Instant::now() + Duration::from_secs(10);
        while hooks.counts().len() < 2 && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let once: BTreeMap<TaskId, usize> = [(1, 1), (2, 1)].into();
        assert_eq!(
            hooks.counts(),
            once,
            "one webhook call per job, from node b"
        );
    }
    drop(built);
    clean_up(backend, &queue, &mailbox).await;
    let _ = std::fs::remove_dir_all(&dir);
}

/// Node a holds six jobs (two running, four claimed ahead and waiting for its workers) under
/// 30 s leases when it gets SIGTERM with a 300 ms drain. It hands the four waiting claims back
/// at once and, at the deadline, stops its two runs and hands them back too; node b finishes
/// all six within seconds, not after the leases, and every job ends once.
async fn a_stopping_node_hands_its_work_back_at_once(backend: Backend) {
    let (queue, mailbox, dir) = fresh(backend, "term");
    // Two workers and room for eight units: two jobs run, four more wait claimed ahead.
    let mut spec_a = node_spec(backend, "a", &queue, &mailbox, &dir, 2, 8);
    spec_a.lease_ms = Some(30_000);
    spec_a.claim_ahead = Some(4);
    spec_a.drain_ms = 300;
    let mut spec_b = node_spec(backend, "b", &queue, &mailbox, &dir, 2, 2);
    spec_b.lease_ms = Some(30_000);
    let built = build_pools_from_scheduler_config::<Job, u64, Recorder, TokioSpawner>(
        &config(backend, &queue, &mailbox, 0, 1_000),
        &QueueBuilderContext::Embedded,
        None,
        |_| unreachable_executor(),
        TokioSpawner,
    )
    .expect("the producer starts");
    let producer = &built.pools["work"];
    let key = MailboxKey::new("cluster").with_session(&queue);
    for id in 1..=6 {
        let meta = TaskMetadata::new(id, ResourceCost::cpu(1)).with_mailbox(key.clone());
        let job = Job {
            ms: 3_000,
            units: 1,
        };
        producer
            .submit(ScheduledTask::new(meta, job))
            .await
            .expect("submit");
    }
    let started_on = |node: &Node| {
        read_lines(&node.runs)
            .iter()
            .filter(|line| line.starts_with("start"))
            .count()
    };
    // Node a starts with six jobs waiting: its first claim takes them all.
    let mut a = Node::start(&spec_a);
    a.wait_ready();
    let deadline = Instant::now() + Duration::from_secs(20);
    while started_on(&a) < 2 || claimed_in(backend, &queue).await < 6 {
        assert!(Instant::now() < deadline, "node a did not claim every job");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let mut b = Node::start(&spec_b);
    b.wait_ready();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(started_on(&b), 0, "node a held every job");

    a.signal("TERM");
    let stopped_at = Instant::now();
    let deadline = stopped_at + Duration::from_secs(10);
    while started_on(&b) == 0 {
        assert!(Instant::now() < deadline, "node b got nothing from node a");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let first_handed = stopped_at.elapsed();
    for id in 1..=6 {
        let result = producer
            .retrieve_task(&key, id, Duration::from_secs(20))
            .await;
        assert_eq!(result, Ok(id * 2), "job {id}");
    }
    let all_done = stopped_at.elapsed();
    let (completed_a, lost_a) = a.stop();
    let (completed_b, _) = b.stop();
    eprintln!(
        "SIGTERM to node a: node b started its first handed-back job after {first_handed:?},          all six results after {all_done:?}; node a completed {completed_a}, lost {lost_a};          node b completed {completed_b}"
    );
    assert!(
        first_handed < Duration::from_secs(1),
        "a handed-back job waits for no lease: {first_handed:?}"
    );
    assert!(
        all_done < Duration::from_secs(15),
        "every job finished long before a 30 s lease could run out: {all_done:?}"
    );
    let runs = collect(&[&a, &b]);
    let ended: Vec<TaskId> = runs.ended.values().flatten().copied().collect();
    assert_eq!(ended.len(), 6, "each job ended once: {:?}", runs.ended);
    assert_eq!(completed_a + completed_b, 6, "six completions in all");
    assert_eq!(completed_b, 6, "node a stopped before its runs ended");
    assert_eq!(stored_results(&mailbox).await, 0, "no second result");
    drop(built);
    clean_up(backend, &queue, &mailbox).await;
    let _ = std::fs::remove_dir_all(&dir);
}

/// The scenarios, once per backend: `<scenario>` on the table queue, `pgmq_<scenario>` on
/// PGMQ.
macro_rules! on_each_backend {
    ($($scenario:ident),* $(,)?) => {
        mod postgres {
            $(pub fn $scenario() {
                super::processes::on_runtime(super::$scenario(super::Backend::Postgres));
            })*
        }
        #[cfg(feature = "pgmq")]
        mod pgmq {
            $(pub fn $scenario() {
                super::processes::on_runtime(super::$scenario(super::Backend::Pgmq));
            })*
        }
        fn tests() -> Vec<processes::Case> {
            let postgres = [$((stringify!($scenario), postgres::$scenario as fn())),*];
            #[cfg(feature = "pgmq")]
            let pgmq = [$((concat!("pgmq_", stringify!($scenario)), pgmq::$scenario as fn())),*];
            #[cfg(not(feature = "pgmq"))]
            let pgmq: [processes::Case; 0] = [];
            postgres.into_iter().chain(pgmq).collect()
        }
    };
}

on_each_backend!(
    three_nodes_run_every_job_exactly_once_within_their_capacity,
    a_killed_nodes_jobs_are_rescued_and_finished_by_the_others,
    tasks_a_killed_node_started_at_once_are_stored_and_run_elsewhere,
    a_stalled_node_publishes_nothing_for_work_another_node_took_over,
    a_stopping_node_hands_its_work_back_at_once,
    three_nodes_share_one_budget_and_together_stay_within_it,
    a_job_submitted_to_two_nodes_runs_once,
    a_bound_on_queued_units_sheds_another_processs_task_for_a_higher_priority,
);

fn main() {
    #[cfg(feature = "pgmq")]
    let only_pgmq: &[processes::Case] = &[(
        "pgmq_two_processes_installing_at_once_both_succeed_and_install_once",
        pgmq_install::two_processes_installing_at_once_both_succeed_and_install_once,
    )];
    #[cfg(not(feature = "pgmq"))]
    let only_pgmq: &[processes::Case] = &[];
    // Only the table layout claims by the fleet's tenant counters.
    let only_table: &[processes::Case] = &[("three_nodes_share_one_fair_share_by_use", || {
        processes::on_runtime(three_nodes_share_one_fair_share_by_use())
    })];
    let tests: Vec<processes::Case> = tests()
        .into_iter()
        .chain(only_pgmq.iter().copied())
        .chain(only_table.iter().copied())
        .collect();
    processes::main(
        &tests,
        &[
            ("cluster_node", cluster_node),
            #[cfg(feature = "pgmq")]
            ("pgmq_installer", pgmq_install::installer),
        ],
    );
}

/// PGMQ's SQL installed by several processes at once (the server lacks the extension).
#[cfg(feature = "pgmq")]
mod pgmq_install {
    use std::process::Stdio;

    use prometheus_parking_lot::infra::postgres::{PgDatabase, PgmqSource};
    use sea_orm::{ConnectionTrait, Database, DatabaseConnection, Statement};

    use super::{database_url, processes};

    /// The child role: installs PGMQ and prints what it found.
    pub fn installer() {
        let database = PgDatabase::connect(&database_url()).expect("connect");
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let source = runtime
            .block_on(database.install_pgmq())
            .expect("installing pgmq succeeds");
        println!("{source:?}");
    }

    async fn value(connection: &DatabaseConnection, sql: &str) -> String {
        let row = connection
            .query_one_raw(Statement::from_string(
                sea_orm::DbBackend::Postgres,
                sql.to_owned(),
            ))
            .await
            .expect(sql)
            .expect("a row");
        row.try_get_by_index::<String>(0).expect(sql)
    }

    pub fn two_processes_installing_at_once_both_succeed_and_install_once() {
        processes::on_runtime(async {
            let connection = Database::connect(database_url()).await.expect("connect");
            let extension = value(
                &connection,
                "SELECT EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'pgmq')::text",
            )
            .await;
            if extension == "false" {
                // From nothing: the plain SQL objects of an earlier run go first. The queues
                // that runs left behind go a hundred tables at a time: one `DROP SCHEMA` of
                // them all takes a lock per table and index in one transaction, past the
                // server's lock table (`max_locks_per_transaction`) once a thousand or so
                // queues have piled up.
                loop {
                    let batch = value(
                        &connection,
                        "SELECT coalesce(string_agg(format('pgmq.%I', tablename), ', '), '') \
                           FROM (SELECT tablename FROM pg_tables WHERE schemaname = 'pgmq' \
                                  LIMIT 100) AS batch",
                    )
                    .await;
                    if batch.is_empty() {
                        break;
                    }
                    connection
                        .execute_unprepared(&format!("DROP TABLE IF EXISTS {batch} CASCADE"))
                        .await
                        .expect("drop the queues left behind");
                }
                connection
                    .execute_unprepared("DROP SCHEMA IF EXISTS pgmq CASCADE")
                    .await
                    .expect("drop the pgmq schema");
            }
            let children: Vec<_> = (0..2)
                .map(|_| {
                    processes::child("pgmq_installer")
                        .stdout(Stdio::piped())
                        .spawn()
                        .expect("start an installer")
                })
                .collect();
            let mut found: Vec<String> = children
                .into_iter()
                .map(|child| {
                    let output = child.wait_with_output().expect("an installer ends");
                    assert!(output.status.success(), "an installer failed");
                    String::from_utf8_lossy(&output.stdout).trim().to_owned()
                })
                .collect();
            found.sort();
            let database = tokio::task::spawn_blocking(|| {
                PgDatabase::connect(&database_url()).expect("connect")
            })
            .await
            .unwrap();
            let again = database.install_pgmq().await.expect("installing again");
            if extension == "true" {
                assert_eq!(found, ["Extension", "Extension"]);
                assert_eq!(again, PgmqSource::Extension);
            } else {
                assert_eq!(found, ["AlreadyInstalled", "Installed"], "installed once");
                assert_eq!(again, PgmqSource::AlreadyInstalled, "again: a no-op");
            }

            // The installed API behaves as PGMQ documents it.
            let queue = format!("pl_api_{}", std::process::id());
            let checks = [
                format!("SELECT pgmq.create('{queue}')::text"),
                format!("SELECT pgmq.create('{queue}')::text"),
                format!("SELECT string_agg(id::text, ',') FROM pgmq.send_batch('{queue}', ARRAY['{{\"n\": 1}}', '{{\"n\": 2}}', '{{\"n\": 3}}']::jsonb[]) AS id"),
                format!("SELECT pgmq.send('{queue}', '{{\"n\": 4}}', 3600)::text"),
                format!("SELECT string_agg(msg_id || ':' || read_ct, ',') FROM pgmq.read('{queue}', 30, 10, '{{\"n\": 2}}')"),
                format!("SELECT string_agg(msg_id || ':' || read_ct, ',') FROM pgmq.read('{queue}', 30, 10)"),
                format!("SELECT count(*)::text FROM pgmq.read('{queue}', 30, 10)"),
                format!("SELECT pgmq.archive('{queue}', 1::bigint)::text"),
                format!("SELECT pgmq.delete('{queue}', 3::bigint)::text"),
                format!("SELECT pgmq.delete('{queue}', 3::bigint)::text"),
                format!("SELECT (SELECT count(*) FROM pgmq.set_vt('{queue}', 2, 0))::text"),
                format!("SELECT string_agg(msg_id || ':' || read_ct, ',') FROM pgmq.read('{queue}', 30, 10)"),
                format!("SELECT (m.queue_length || '/' || m.total_messages) FROM pgmq.metrics('{queue}') AS m"),
                format!("SELECT count(*)::text FROM pgmq.a_{queue}"),
                format!("SELECT pgmq.drop_queue('{queue}')::text"),
                format!("SELECT pgmq.drop_queue('{queue}')::text"),
            ];
            let expected = [
                "", "", "1,2,3", "4", "2:1", "1:1,3:1", "0", "true", "true", "false", "1", "2:2",
                "2/4", "1", "true", "false",
            ];
            for (sql, expected) in checks.iter().zip(expected) {
                assert_eq!(value(&connection, sql).await, expected, "{sql}");
            }
            let _ = connection.close().await;
        });
    }
}
