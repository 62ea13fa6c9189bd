//! A producer and two GPU nodes sharing one PostgreSQL queue and mailbox, in one command.
//!
//! ```sh
//! DATABASE_URL=postgres://postgres@127.0.0.1:5432/test \
//!     cargo run --release --features postgres --example cluster
//! ```
//!
//! The command starts two worker nodes as child processes of its own (the same binary with
//! `--node NAME`), each with its own capacity, and then acts as the producer: an API server's
//! pool with `worker_threads: 0`, which submits requests and retrieves their results but runs
//! nothing. Each node claims the best-ranked parked request that fits its free units; a node
//! wakes on the queue's NOTIFY at once, not at its next poll. At the end the producer prints
//! which node served how many requests.
//!
//! With `--features postgres,admin` every process serves a dashboard (the producer on
//! 127.0.0.1:7480, each node on a free port) and the command prints their addresses and the
//! token their buttons need; at a terminal it keeps them up after the run until Enter.
//!
//! A node stops as a deployment stops it, on SIGTERM (`kill <pid>` of a `--node` process):
//! it takes no new work, lets what runs finish for up to 10 s, and hands everything else
//! back to the queue at once, so the other nodes run it without waiting for a lease to run
//! out.

use std::collections::BTreeMap;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use prometheus_parking_lot::core::{ScheduledTask, SubmitOptions, TaskMetadata};
use prometheus_parking_lot::util::serde::{MailboxKey, Priority, ResourceCost};
use prometheus_parking_lot::{
    build_pools_from_scheduler_config, QueueBuilderContext, SchedulerConfig, TaskExecutor,
    TokioSpawner,
};
use serde::{Deserialize, Serialize};

#[cfg(feature = "admin")]
#[path = "support/dashboard.rs"]
mod dashboard;

const REQUESTS: u64 = 400;

/// One generation request: how long it decodes and how much VRAM it holds.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Request {
    decode_ms: u64,
}

/// Which node served a request.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Served {
    node: String,
}

/// Pretends to decode on a GPU.
#[derive(Clone)]
struct FakeGpu {
    node: String,
}

#[async_trait::async_trait]
impl TaskExecutor<Request, Served> for FakeGpu {
    async fn execute(&self, request: Request, _meta: TaskMetadata) -> Served {
        tokio::time::sleep(Duration::from_millis(request.decode_ms)).await;
        Served {
            node: self.node.clone(),
        }
    }
}

/// One node's configuration: the shared queue and mailbox, its own threads and VRAM units.
fn config(run: &str, worker_threads: usize, vram: u32) -> SchedulerConfig {
    let text = serde_json::json!({
        "database_url": "${DATABASE_URL}",
        "pools": { "llm": {
            "worker_threads": worker_threads,
            "max_units": vram,
            "max_queue_depth": 100_000,
            "queue": { "type": "postgres", "queue_name": format!("cluster_{run}"), "lease_ms": 10_000 },
            "mailbox": { "storage": { "type": "postgres", "table": "pl_mailbox_messages" } }
        } }
    });
    SchedulerConfig::from_json_str(&text.to_string()).expect("the example's config is valid")
}

/// A worker node: serves until its producer closes its stdin.
fn node(run: &str, name: &str, worker_threads: usize, vram: u32) {
    let built = build_pools_from_scheduler_config::<Request, Served, FakeGpu, TokioSpawner>(
        &config(run, worker_threads, vram),
        &QueueBuilderContext::Embedded,
        None,
        |_| FakeGpu { node: name.into() },
        TokioSpawner,
    )
    .expect("the node starts");
    // With the `admin` feature each node serves its own dashboard on a free port, and says
    // where on its "ready" line.
    #[cfg(feature = "admin")]
    let dashboard = dashboard::serve(
        0,
        &dashboard::token(),
        built
            .pools
            .iter()
            .map(|(pool, built)| dashboard::pool(pool, built.client().clone()))
            .collect(),
    )
    .ok();
    #[cfg(feature = "admin")]
    println!(
        "ready {}",
        dashboard
            .as_ref()
            .map_or_else(String::new, |server| server.url())
    );
    #[cfg(not(feature = "admin"))]
    println!("ready");
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    runtime.block_on(async {
        use tokio::signal::unix::{signal, SignalKind};
        let mut terminate = signal(SignalKind::terminate()).expect("listen for SIGTERM");
        let (closed, stdin) = tokio::sync::oneshot::channel::<()>();
        // Its producer closes the node's stdin when it is done.
        std::thread::spawn(move || {
            let _ = std::io::stdin().read_line(&mut String::new());
            let _ = closed.send(());
        });
        tokio::select! {
            _ = terminate.recv() => eprintln!("{name}: SIGTERM, draining and handing work back"),
            _ = stdin => {}
        }
        for pool in built.pools.values() {
            let report = pool.shutdown_with_drain(Duration::from_secs(10)).await;
            eprintln!("{name}: stopped: {report:?}");
        }
    });
}

/// Starts a node and waits for it to be ready; prints its dashboard's address, if it has one.
fn start_node(run: &str, name: &str, worker_threads: usize, vram: u32) -> Child {
    let mut child = Command::new(std::env::current_exe().expect("this binary"))
        .args([
            "--node",
            run,
            name,
            &worker_threads.to_string(),
            &vram.to_string(),
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("start a node");
    let mut ready = String::new();
    let stdout = child.stdout.as_mut().expect("the node's stdout");
    std::io::BufRead::read_line(&mut std::io::BufReader::new(stdout), &mut ready)
        .expect("the node says it is ready");
    if let Some(url) = ready.trim().strip_prefix("ready ") {
        println!("dashboard of node {name}: {url}");
    }
    child
}

fn main() {
    if std::env::var("DATABASE_URL").is_err() {
        std::env::set_var("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/test");
    }
    let args: Vec<String> = std::env::args().collect();
    if let [_, flag, run, name, threads, vram] = args.as_slice() {
        if flag == "--node" {
            node(run, name, threads.parse().unwrap(), vram.parse().unwrap());
            return;
        }
    }

    let run = format!("{}", std::process::id());
    #[cfg(feature = "admin")]
    {
        let token = dashboard::token();
        std::env::set_var("PL_EXAMPLE_TOKEN", &token);
        println!("token for the dashboards' buttons: {token}");
    }
    // Two GPU nodes of different sizes: a 24 GB card with 4 workers, a 16 GB card with 2.
    let mut nodes = [
        start_node(&run, "gpu-24g", 4, 24),
        start_node(&run, "gpu-16g", 2, 16),
    ];
    let producer = build_pools_from_scheduler_config::<Request, Served, FakeGpu, TokioSpawner>(
        &config(&run, 0, 24),
        &QueueBuilderContext::Embedded,
        None,
        |_| FakeGpu {
            node: "producer".into(),
        },
        TokioSpawner,
    )
    .expect("the producer starts");
    let pool = &producer.pools["llm"];
    #[cfg(feature = "admin")]
    let dashboard = dashboard::start(vec![dashboard::pool("llm", pool.client().clone())]);

    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    let started = Instant::now();
    let served = runtime.block_on(async {
        let key = MailboxKey::new("example").with_session(format!("cluster-{run}"));
        let tasks = (1..=REQUESTS)
            .map(|id| {
                let priority = if id % 10 == 0 {
                    Priority::High
                } else {
                    Priority::Normal
                };
                let vram = [2, 4, 8, 12][(id % 4) as usize];
                let meta = TaskMetadata::new(id, ResourceCost::gpu_vram(vram))
                    .with_priority(priority)
                    .with_mailbox(key.clone());
                ScheduledTask::new(
                    meta,
                    Request {
                        decode_ms: 5 + id % 20,
                    },
                )
            })
            .collect();
        for answer in pool
            .client()
            .submit_batch(tasks, SubmitOptions::default())
            .await
        {
            answer.expect("the producer parks every request in the shared queue");
        }
        let mut served: BTreeMap<String, u64> = BTreeMap::new();
        for id in 1..=REQUESTS {
            let result = pool
                .retrieve_task(&key, id, Duration::from_secs(60))
                .await
                .expect("every request is served");
            *served.entry(result.node).or_default() += 1;
        }
        served
    });
    let elapsed = started.elapsed();
    println!(
        "{REQUESTS} requests in {:.2} s through one shared queue:",
        elapsed.as_secs_f64()
    );
    for (node, count) in served {
        println!("  {node:<8} served {count}");
    }
    #[cfg(feature = "admin")]
    dashboard::keep_open(dashboard);
    for node in &mut nodes {
        drop(node.stdin.take());
        let _ = node.wait();
    }
}
