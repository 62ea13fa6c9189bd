//! Serves a busy pool's metrics to Prometheus.
//!
//! Installs `metrics-exporter-prometheus` with its HTTP listener on 127.0.0.1, then builds a
//! pool (which registers its metrics with that recorder) and keeps it busy: a mix of small
//! and large VRAM tasks, some panicking, some refused for being too large. Scrape it while
//! it runs:
//!
//! ```text
//! cargo run --example prometheus_metrics -- --port 9898 --seconds 60
//! curl -s http://127.0.0.1:9898/metrics | grep parking_lot_
//! ```
//!
//! `--seconds 0` runs until interrupted; `--help` lists the flags. The metrics table of
//! `docs/guide/operating.md` says what each series means.
//!
//! Its output: the address it serves on, then, when the time is up, how many tasks the pool
//! admitted, completed, lost to a panic (`failed`) and refused (the ones larger than the
//! pool). The figures themselves are in the scrape.

use std::net::{Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};

use metrics_exporter_prometheus::PrometheusBuilder;
use prometheus_parking_lot::config::WorkerPoolConfig;
use prometheus_parking_lot::core::{PoolError, TaskMetadata, WorkerExecutor, WorkerPool};
use prometheus_parking_lot::util::serde::{Priority, ResourceCost};

#[path = "support/flags.rs"]
mod flags;
use flags::Flags;

/// Sleeps for the payload's milliseconds, or panics on a payload of 0.
#[derive(Clone)]
struct FakeModel;

#[async_trait::async_trait]
impl WorkerExecutor<u64, u64> for FakeModel {
    async fn execute(&self, millis: u64, meta: TaskMetadata) -> u64 {
        assert!(millis > 0, "model crashed on request {}", meta.id);
        tokio::time::sleep(Duration::from_millis(millis)).await;
        millis
    }
}

const USAGE: &str = "\
usage: cargo run --example prometheus_metrics -- [--port PORT] [--seconds N]

  --port PORT    where the metrics are served, on 127.0.0.1 (default 9898)
  --seconds N    how long the pool is kept busy (default 60; 0: until interrupted)";

/// `--port` and `--seconds`, or their defaults.
fn parse_args() -> Result<(u16, u64), String> {
    let flags = Flags::from_env(USAGE, &["--port", "--seconds"])?;
    let port = flags
        .number("--port", "a port from 1 to 65535")?
        .unwrap_or(9898);
    let seconds = flags
        .number("--seconds", "a whole number of seconds")?
        .unwrap_or(60);
    Ok((port, seconds))
}

#[tokio::main]
async fn main() {
    std::panic::set_hook(Box::new(|_| {}));
    if let Err(error) = run().await {
        eprintln!("prometheus_metrics: {error}");
        std::process::exit(2);
    }
}

async fn run() -> Result<(), String> {
    let (port, seconds) = parse_args()?;
    let address = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    // The recorder first: pools register their metrics with the recorder installed when
    // they are built.
    PrometheusBuilder::new()
        .with_http_listener(address)
        .install()
        .map_err(|error| format!("could not serve metrics on {address}: {error}"))?;
    println!("serving metrics on http://{address}/metrics");

    let pool = WorkerPool::new(
        WorkerPoolConfig::new()
            .with_name("llm")
            .with_worker_count(4)
            .with_max_units(24)
            .with_timeout_ms(2_000),
        FakeModel,
    )
    .map_err(|error| error.to_string())?;

    let started = Instant::now();
    let mut submitted = 0u64;
    while seconds == 0 || started.elapsed() < Duration::from_secs(seconds) {
        let wave: Vec<_> = (0..32u64)
            .map(|n| {
                submitted += 1;
                let (units, millis, priority) = match n % 8 {
                    0 => (16, 40, Priority::Low),
                    1 => (30, 10, Priority::Normal), // more than the pool has: refused
                    2 => (2, 0, Priority::High),     // panics
                    _ => (1 + (n % 4) as u32, 5 + n % 10, Priority::High),
                };
                let meta = TaskMetadata::new(submitted, ResourceCost::gpu_vram(units))
                    .with_priority(priority);
                (meta, millis)
            })
            .collect();
        let mut keys = Vec::new();
        for (meta, millis) in wave {
            match pool.submit_async(millis, meta).await {
                Ok(key) => keys.push(key),
                Err(PoolError::InsufficientResources { .. }) => {}
                Err(error) => return Err(error.to_string()),
            }
        }
        for key in keys {
            // Panicked tasks end `Failed`; the wave only waits for every task to end.
            let _ = pool.retrieve_async(&key, Duration::from_secs(10)).await;
        }
    }
    let stats = pool.stats();
    println!(
        "done: {} admitted, {} completed, {} failed, {} refused",
        stats.submitted_tasks, stats.completed_tasks, stats.failed_tasks, stats.rejected_tasks
    );
    Ok(())
}
