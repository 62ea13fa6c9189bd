//! The fleet view and fleet control with real processes: three worker nodes (child processes
//! of this test binary, each with its admin server) and a producer-only node (this process)
//! on one Postgres queue and mailbox, built from config files as users build them.
//!
//! The admin API of one node shows every node and the queue's parked tasks with their
//! reasons; it pauses another node (which then claims nothing), pauses the whole fleet (the
//! reason says so), cancels a task the producer submitted (the producer hears `Cancelled`);
//! a node killed with SIGKILL shows as stale, one stopped cleanly as gone.
//!
//! A binary of its own: it starts child processes and sends them real signals.

#[path = "support/admin_client.rs"]
mod admin_client;
#[path = "support/processes.rs"]
mod processes;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use admin_client::eventually;
use prometheus_parking_lot::core::{PoolError, ScheduledTask, TaskMetadata};
use prometheus_parking_lot::util::serde::{MailboxKey, ResourceCost};
use prometheus_parking_lot::{
    build_pools_from_scheduler_config, QueueBuilderContext, SchedulerConfig, TaskExecutor,
    TokioSpawner,
};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

/// The environment variable that makes this binary a worker node: the node's settings as JSON.
const NODE_ENV: &str = "PL_FLEET_NODE";
/// The admin token of every node.
const TOKEN: &str = "fleet-test-token";
/// The heartbeat of every node, ms: a node is stale after three missed ones.
const HEARTBEAT_MS: u64 = 200;

/// What a worker node is told.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct NodeSpec {
    queue: String,
    mailbox: String,
    capacity: u32,
    runs: PathBuf,
}

fn database_url() -> String {
    std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into())
}

/// One pool, `work`, on `queue` with results in `mailbox`, a 200 ms heartbeat and an admin
/// server on a free port.
fn config(queue: &str, mailbox: &str, workers: usize, capacity: u32) -> SchedulerConfig {
    let text = json!({
        "database_url": database_url(),
        "fleet": { "heartbeat_ms": HEARTBEAT_MS },
        "admin": { "bind": "127.0.0.1:0", "token": TOKEN },
        "pools": {
            "work": {
                "worker_threads": workers,
                "max_units": capacity,
                "queue": { "type": "postgres", "queue_name": queue, "lease_ms": 2_000 },
                "mailbox": { "storage": { "type": "postgres", "table": mailbox } }
            }
        }
    });
    SchedulerConfig::from_json_str(&text.to_string()).expect("the fleet config is valid")
}

/// Records each start and end of a run in the node's file; a run takes the payload's ms.
#[derive(Clone)]
struct Recorder {
    runs: Arc<Mutex<std::fs::File>>,
}

impl Recorder {
    fn line(&self, text: String) {
        let mut file = self.runs.lock().unwrap();
        writeln!(file, "{text}").expect("record a run");
    }
}

#[async_trait::async_trait]
impl TaskExecutor<u64, u64> for Recorder {
    async fn execute(&self, ms: u64, meta: TaskMetadata) -> u64 {
        self.line(format!("start {}", meta.id));
        tokio::time::sleep(Duration::from_millis(ms)).await;
        self.line(format!("end {}", meta.id));
        meta.id
    }
}

/// The worker node's role: serves its pool and its admin server until its stdin closes.
fn fleet_node() {
    let spec: NodeSpec =
        serde_json::from_str(&std::env::var(NODE_ENV).expect("started by a fleet test"))
            .expect("node spec");
    let recorder = Recorder {
        runs: Arc::new(Mutex::new(
            std::fs::File::create(&spec.runs).expect("the runs file"),
        )),
    };
    let config = config(&spec.queue, &spec.mailbox, 2, spec.capacity);
    let built = build_pools_from_scheduler_config::<u64, u64, Recorder, TokioSpawner>(
        &config,
        &QueueBuilderContext::Embedded,
        None,
        |_| recorder.clone(),
        TokioSpawner,
    )
    .expect("the node starts");
    let server = built
        .serve_admin(&config)
        .expect("the admin server starts")
        .expect("the config has an admin section");
    recorder.line(format!("admin {}", server.url()));
    recorder.line("ready".into());
    let _ = std::io::stdin().read_line(&mut String::new());
    drop(server);
    drop(built);
}

/// A worker node process; killed when dropped, so a failing test leaves none behind.
struct Node {
    child: Child,
    runs: PathBuf,
}

impl Node {
    fn start(spec: &NodeSpec) -> Self {
        let child = processes::child("fleet_node")
            .env(NODE_ENV, serde_json::to_string(spec).unwrap())
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .spawn()
            .expect("start a node process");
        Self {
            child,
            runs: spec.runs.clone(),
        }
    }

    /// Waits until the node is up; answers its admin server's URL.
    fn wait_ready(&self) -> String {
        eventually("the node to start", || {
            let lines = read_lines(&self.runs);
            let url = lines.iter().find_map(|line| line.strip_prefix("admin "))?;
            lines
                .iter()
                .any(|line| line == "ready")
                .then(|| url.trim_end_matches('/').to_owned())
        })
    }

    fn pid(&self) -> u64 {
        u64::from(self.child.id())
    }

    fn starts(&self) -> usize {
        read_lines(&self.runs)
            .iter()
            .filter(|line| line.starts_with("start "))
            .count()
    }

    fn ends(&self) -> usize {
        read_lines(&self.runs)
            .iter()
            .filter(|line| line.starts_with("end "))
            .count()
    }

    /// Closes its stdin and waits for it to stop: a clean stop.
    fn stop(&mut self) {
        drop(self.child.stdin.take());
        let deadline = Instant::now() + Duration::from_secs(30);
        while self.child.try_wait().expect("wait for a node").is_none() {
            assert!(Instant::now() < deadline, "the node did not stop");
            std::thread::sleep(Duration::from_millis(20));
        }
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

/// An admin server's answer, with the test's token: its status and JSON.
fn call(method: reqwest::Method, url: &str, body: Option<Value>) -> (u16, Value) {
    admin_client::call_with(TOKEN, method, url, body)
}

fn get(admin: &str, path: &str) -> Value {
    let (status, body) = call(reqwest::Method::GET, &format!("{admin}{path}"), None);
    assert_eq!(status, 200, "GET {path}: {body}");
    body
}

fn post(admin: &str, path: &str, body: Value) -> (u16, Value) {
    call(reqwest::Method::POST, &format!("{admin}{path}"), Some(body))
}

/// Runs the `parking-lot` command line against `admin`: what it printed.
fn cli(admin: &str, args: &[&str]) -> String {
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_parking-lot"))
        .args(["--url", admin, "--token", TOKEN])
        .args(args)
        .output()
        .expect("run parking-lot");
    let printed = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(
        output.status.success(),
        "parking-lot {args:?}: {printed}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    printed
}

/// The fleet's node of process `pid`, as `admin` shows it.
fn node_of(admin: &str, pid: u64) -> Option<Value> {
    let fleet = get(admin, "/api/fleet/work");
    fleet["nodes"]
        .as_array()?
        .iter()
        .find(|node| node["pid"].as_u64() == Some(pid))
        .cloned()
}

/// Names unique to this run: the queue, the mailbox table and a scratch directory.
fn fresh(prefix: &str) -> (String, String, PathBuf) {
    let stamp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis();
    let queue = format!("fleet_{prefix}_{}_{stamp}", std::process::id());
    let dir = std::env::temp_dir().join(&queue);
    std::fs::create_dir_all(&dir).unwrap();
    (queue.clone(), format!("{queue}_results"), dir)
}

/// Drops the test's mailbox table and forgets its queue's rows and nodes.
async fn clean_up(queue: &str, table: &str) {
    use sea_orm::ConnectionTrait;
    if let Ok(connection) = sea_orm::Database::connect(database_url()).await {
        for sql in [
            format!("DROP TABLE IF EXISTS {table}"),
            format!("DELETE FROM pl_queue_jobs WHERE queue_name = '{queue}'"),
            format!("DELETE FROM pl_fleet_nodes WHERE queue_key = 'postgres table pl_queue_jobs {queue}'"),
        ] {
            let _ = connection.execute_unprepared(&sql).await;
        }
        let _ = connection.close().await;
    }
}

/// The producer's executor never runs: it has no workers.
fn idle_executor(dir: &Path) -> Recorder {
    Recorder {
        runs: Arc::new(Mutex::new(
            std::fs::File::create(dir.join("producer.runs")).expect("a sink"),
        )),
    }
}

fn one_admin_shows_and_controls_a_fleet_of_three_nodes() {
    let (queue, mailbox, dir) = fresh("view");
    let spec = |name: &str| NodeSpec {
        queue: queue.clone(),
        mailbox: mailbox.clone(),
        capacity: 4,
        runs: dir.join(format!("{name}.runs")),
    };
    let mut nodes: Vec<Node> = ["a", "b", "c"]
        .iter()
        .map(|name| Node::start(&spec(name)))
        .collect();
    let admins: Vec<String> = nodes.iter().map(Node::wait_ready).collect();
    let admin = admins[0].clone();

    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let built = build_pools_from_scheduler_config::<u64, u64, Recorder, TokioSpawner>(
        &config(&queue, &mailbox, 0, 64),
        &QueueBuilderContext::Embedded,
        None,
        |_| idle_executor(&dir),
        TokioSpawner,
    )
    .expect("the producer starts");
    let producer = &built.pools["work"];
    let key = MailboxKey::new("fleet").with_session(queue.clone());
    let submit = |id: u64, units: u32, ms: u64| {
        let meta = TaskMetadata::new(id, ResourceCost::cpu(units)).with_mailbox(key.clone());
        runtime
            .block_on(producer.submit(ScheduledTask::new(meta, ms)))
            .expect("the producer submits");
    };

    // Every node, seen from a's admin: the three workers live, with their capacity.
    for node in &nodes {
        let shown = eventually("every node in a's fleet view", || {
            node_of(&admin, node.pid()).filter(|shown| shown["health"] == "live")
        });
        assert_eq!(shown["workers"], 2, "{shown}");
        assert_eq!(shown["capacity"]["cpu"], 4, "{shown}");
    }
    let fleet = get(&admin, "/api/fleet/work");
    assert_eq!(fleet["stale_after_beats"], 3);
    let producers = fleet["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|node| node["workers"] == 0 && node["health"] == "live")
        .count();
    assert_eq!(
        producers, 1,
        "the producer is a node of the fleet too: {fleet}"
    );

    // A task larger than any node parks for ever, and the view says why.
    submit(100, 16, 10);
    let parked = eventually("the large task in the fleet's parked tasks", || {
        let page = get(&admin, "/api/fleet/work/parked");
        (page["parked_total"] == 1).then_some(page)
    });
    let task = &parked["parked"][0];
    assert_eq!(task["task_id"], 100, "{parked}");
    assert_eq!(task["units"], 16);
    assert_eq!(task["reason"]["code"], "larger_than_any_node", "{task}");
    assert_eq!(task["reason"]["largest"], 4, "{task}");
    assert!(
        task["reason_text"]
            .as_str()
            .unwrap()
            .contains("needs 16 cpu units"),
        "{task}"
    );

    // And so does the question about that one task, asked of a node that did not park it.
    let why = get(
        &admin,
        &format!("/api/fleet/work/why?tenant=fleet&session_id={queue}&id=100"),
    );
    assert_eq!(why["task"]["position"], 0, "{why}");
    assert_eq!(
        why["task"]["reason"]["code"], "larger_than_any_node",
        "{why}"
    );
    let why_text = cli(
        &admin,
        &[
            "fleet",
            "why",
            "--pool",
            "work",
            "--tenant",
            "fleet",
            "--session",
            &queue,
            "100",
        ],
    );
    assert!(
        why_text.starts_with("task 100 of fleet: #1 in the queue; needs 16 cpu units"),
        "{why_text}"
    );
    let (status, answer) = call(
        reqwest::Method::GET,
        &format!("{admin}/api/fleet/work/why?tenant=fleet&id=100"),
        None,
    );
    assert_eq!(status, 404, "another key is another task: {answer}");

    // Pausing b from a's admin: b claims nothing, a and c run every task.
    let b = node_of(&admin, nodes[1].pid()).unwrap();
    let (status, answer) = post(
        &admin,
        "/api/fleet/work/pause",
        json!({ "node": b["node"] }),
    );
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["asked"], json!([b["node"]]));
    eventually("b paused", || {
        node_of(&admin, nodes[1].pid()).filter(|shown| shown["paused"] == true)
    });
    for id in 1..=8 {
        submit(id, 1, 150);
    }
    eventually("a and c to run the 8 tasks", || {
        (nodes[0].ends() + nodes[2].ends() == 8).then_some(())
    });
    assert_eq!(nodes[1].starts(), 0, "a paused node claims nothing");
    assert!(nodes[0].starts() > 0 && nodes[2].starts() > 0);

    // The command line shows the same fleet: every node, the parked task and its reason.
    let nodes_text = cli(&admin, &["fleet", "nodes", "--pool", "work"]);
    assert_eq!(nodes_text.matches(" live ").count(), 4, "{nodes_text}");
    let parked_text = cli(&admin, &["fleet", "parked", "--pool", "work"]);
    assert!(parked_text.contains("needs 16 cpu units"), "{parked_text}");
    assert!(parked_text.contains("1-1 of 1 parked"), "{parked_text}");

    // Pausing every node (from the command line): the reason becomes the paused fleet.
    let paused_text = cli(&admin, &["fleet", "pause", "--pool", "work", "--all"]);
    assert!(paused_text.starts_with("pause asked of "), "{paused_text}");
    eventually("the reason to say the fleet is paused", || {
        let page = get(&admin, "/api/fleet/work/parked");
        (page["parked"][0]["reason"]["code"] == "paused_fleet").then_some(())
    });
    let (status, _) = post(&admin, "/api/fleet/work/resume", json!({ "all": true }));
    assert_eq!(status, 200);
    eventually("every node resumed", || {
        let fleet = get(&admin, "/api/fleet/work");
        fleet["nodes"]
            .as_array()
            .unwrap()
            .iter()
            .all(|node| node["paused"] == false)
            .then_some(())
    });

    // Bad requests are refused, naming what is allowed.
    let (status, answer) = post(&admin, "/api/fleet/work/pause", json!({}));
    assert_eq!(status, 400, "{answer}");
    let (status, answer) = post(&admin, "/api/fleet/work/pause", json!({ "node": "nobody" }));
    assert_eq!(status, 404, "{answer}");
    assert!(answer["error"].as_str().unwrap().contains("its nodes are"));
    let (status, _) = post(&admin, "/api/fleet/work/reboot", json!({ "all": true }));
    assert_eq!(status, 404);
    // A body in the wrong shape (serde would read an array as the fields in order) is a
    // 400 that pauses or cancels nothing.
    let (status, answer) = post(&admin, "/api/fleet/work/pause", json!([b["node"]]));
    assert_eq!(status, 400, "{answer}");
    assert!(
        answer["error"]
            .as_str()
            .unwrap()
            .ends_with("the body is an array, not a JSON object"),
        "{answer}"
    );
    let (status, answer) = post(
        &admin,
        "/api/fleet/work/cancel",
        json!(["fleet", null, queue, 100]),
    );
    assert_eq!(status, 400, "{answer}");

    // Cancelling, from a's admin, the task the producer submitted: the producer hears it.
    let (status, answer) = post(
        &admin,
        "/api/fleet/work/cancel",
        json!({ "tenant": "fleet", "session_id": queue, "id": 100 }),
    );
    assert_eq!(status, 200, "{answer}");
    let outcome = runtime.block_on(producer.retrieve_task(&key, 100, Duration::from_secs(30)));
    assert_eq!(outcome, Err(PoolError::Cancelled));
    let page = get(&admin, "/api/fleet/work/parked");
    assert_eq!(page["parked_total"], 0, "{page}");

    // c killed: stale within three heartbeats; b stopped cleanly: gone.
    let c_pid = nodes[2].pid();
    nodes[2].kill();
    eventually("c to show as stale", || {
        node_of(&admin, c_pid).filter(|shown| shown["health"] == "stale")
    });
    let b_pid = nodes[1].pid();
    nodes[1].stop();
    eventually("b to show as gone", || {
        node_of(&admin, b_pid).filter(|shown| shown["health"] == "gone")
    });
    let a = node_of(&admin, nodes[0].pid()).unwrap();
    assert_eq!(a["health"], "live", "{a}");

    drop(nodes);
    drop(built);
    runtime.block_on(clean_up(&queue, &mailbox));
    let _ = std::fs::remove_dir_all(&dir);
}

fn main() {
    processes::main(
        &[(
            "one_admin_shows_and_controls_a_fleet_of_three_nodes",
            one_admin_shows_and_controls_a_fleet_of_three_nodes,
        )],
        &[("fleet_node", fleet_node)],
    );
}
