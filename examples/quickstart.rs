//! The main job: a mixed LLM-like workload through a pool on the in-memory default,
//! with a progress bar and a closing summary.
//!
//! 1,500 requests arrive over about six seconds (about 75% of what the pool can serve): chats (small, high priority), long contexts
//! (large), batch jobs (low priority), health checks (critical). Some executors panic, some
//! requests carry tight deadlines, a few run away past the execution timeout.
//!
//! The pool comes from a configuration file, `config/local.json` by default (24 units of
//! "VRAM", 8 worker threads, a 1 s execution timeout), built by
//! `build_pools_from_scheduler_config`; `--config FILE` picks another file and `--pool NAME`
//! one of its pools (default: the first); `--help` says so.
//!
//! Its output: a progress bar while the requests run, then a summary: throughput, the VRAM
//! units in use on average (how well the pool packs the card), panics survived (workers
//! restarted), per priority how many requests started and their wait before starting (p50,
//! p99: the higher the priority, the shorter), and how many requests completed, failed (the
//! panics), expired (tight deadlines that passed while parked), timed out (the runaways) and
//! were refused.
//!
//! The progress bar and the summary read the pool's metrics, rendered by the same
//! `metrics-exporter-prometheus` recorder that would serve them to Prometheus (see
//! `examples/prometheus_metrics.rs`): wait percentiles come from its summary of
//! `parking_lot_task_wait_seconds`, in the scheduler's whole milliseconds.
//!
//! ```text
//! cargo run --release --example quickstart
//! cargo run --release --example quickstart -- --config config/local.json --pool local_llm
//! cargo run --release --features admin --example quickstart   # with a live dashboard
//! ```
//!
//! With the `admin` feature it serves the dashboard (`prometheus_parking_lot::admin`) on
//! 127.0.0.1:7480 while it runs, prints its address and a token for its buttons, and at a
//! terminal keeps it up after the summary until Enter is pressed.
//!
//! With `--timeline FILE` it also draws forty of the requests' lives as an SVG (each one's
//! parked spans, coloured by why it waited, and its run, coloured by how it ended:
//! `support/timeline.rs`); `docs/guide/timeline.svg`, shown in the guide, is one.

use std::sync::Arc;
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressStyle};
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use prometheus_parking_lot::core::{PoolControl, PoolError, ScheduledTask, TaskMetadata};
use prometheus_parking_lot::metrics::{names, priority_label};
use prometheus_parking_lot::util::clock::now_ms;
use prometheus_parking_lot::util::serde::{Priority, ResourceCost};
use prometheus_parking_lot::{
    build_pools_from_scheduler_config, QueueBuilderContext, SchedulerConfig, TokioSpawner,
};
use prometheus_parking_lot::{ResourcePool, TaskExecutor};

#[path = "support/flags.rs"]
mod flags;
use flags::Flags;

#[cfg(feature = "admin")]
#[path = "support/dashboard.rs"]
mod dashboard;

#[path = "support/timeline.rs"]
mod timeline;
use timeline::Timeline;

const REQUESTS: u64 = 1_500;

/// The requests `--timeline` draws: forty from the middle of the run, when the pool is full.
const TIMELINE_TASKS: std::ops::Range<u64> = 700..740;

/// One simulated inference request. Config-built pools may park payloads in a durable
/// queue, so payloads and results serialise.
#[derive(serde::Serialize, serde::Deserialize)]
struct Request {
    decode: Duration,
    panics: bool,
}

/// What a served request reports back.
#[derive(serde::Serialize, serde::Deserialize)]
struct Served;

/// Pretends to decode: sleeps for the request's decode time (as a GPU-bound call would keep
/// the worker busy), or panics like a buggy model might.
#[derive(Clone)]
struct FakeModel;

#[async_trait::async_trait]
impl TaskExecutor<Request, Served> for FakeModel {
    async fn execute(&self, request: Request, meta: TaskMetadata) -> Served {
        if request.panics {
            panic!("model crashed on request {}", meta.id);
        }
        tokio::time::sleep(request.decode).await;
        Served
    }
}

/// A reproducible request mix.
struct Mix(u64);

impl Mix {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    /// (priority, VRAM units, decode time, panics, deadline in ms); a few run away for 5 s.
    fn request(&mut self) -> (Priority, u32, Duration, bool, Option<u64>) {
        let roll = self.next() % 100;
        let (priority, units, decode_ms) = match roll {
            0..=54 => (
                Priority::High,
                1 + (self.next() % 3) as u32,
                2 + self.next() % 5,
            ),
            55..=84 => (
                Priority::Normal,
                4 + (self.next() % 6) as u32,
                5 + self.next() % 15,
            ),
            85..=96 => (
                Priority::Low,
                10 + (self.next() % 7) as u32,
                15 + self.next() % 25,
            ),
            _ => (Priority::Critical, 1, 1),
        };
        let panics = self.next() % 100 < 2;
        let deadline = (self.next() % 100 < 5).then(|| 20 + self.next() % 80);
        let runaway = self.next() % 1_000 < 3;
        let decode = Duration::from_millis(if runaway { 5_000 } else { decode_ms });
        (priority, units, decode, panics, deadline)
    }
}

/// The pool's metrics as the Prometheus exporter serves them: its text, read back.
struct Scrape {
    text: String,
    pool: String,
}

impl Scrape {
    fn take(handle: &PrometheusHandle, pool: &str) -> Self {
        Self {
            text: handle.render(),
            pool: pool.to_owned(),
        }
    }

    /// The sum of the samples named `name` of this pool whose labels include `labels`.
    fn value(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        let pool = format!("pool=\"{}\"", self.pool);
        self.text
            .lines()
            .filter(|line| !line.starts_with('#'))
            .filter_map(|line| {
                let (series, value) = line.rsplit_once(' ')?;
                let (series_name, series_labels) = series.split_once('{')?;
                let series_labels: Vec<&str> =
                    series_labels.trim_end_matches('}').split(',').collect();
                let wanted = series_name == name
                    && series_labels.contains(&pool.as_str())
                    && labels.iter().all(|(key, value)| {
                        series_labels.contains(&format!("{key}=\"{value}\"").as_str())
                    });
                wanted.then(|| value.parse::<f64>().ok()).flatten()
            })
            .sum()
    }

    /// Tasks that reached a terminal state.
    fn ended(&self) -> f64 {
        [
            names::TASKS_COMPLETED,
            names::TASKS_FAILED,
            names::TASKS_EXPIRED,
            names::TASKS_TIMED_OUT,
            names::TASKS_CANCELLED,
        ]
        .iter()
        .map(|name| self.value(name, &[]))
        .sum()
    }
}

const USAGE: &str = "\
usage: cargo run --release --example quickstart -- [--config FILE] [--pool NAME] [--timeline FILE]

  --config FILE     the configuration file, JSON or YAML (default config/local.json)
  --pool NAME       which of its pools to run the requests through (default: the first)
  --timeline FILE   also draw forty requests' lives through the pool, as an SVG";

/// `--config FILE`, `--pool NAME` and `--timeline FILE`.
struct Args {
    config: String,
    pool: Option<String>,
    timeline: Option<String>,
}

fn parse_args() -> Result<Args, String> {
    let flags = Flags::from_env(USAGE, &["--config", "--pool", "--timeline"])?;
    let default_config = concat!(env!("CARGO_MANIFEST_DIR"), "/config/local.json");
    Ok(Args {
        config: flags.text("--config").unwrap_or(default_config).to_owned(),
        pool: flags.text("--pool").map(str::to_owned),
        timeline: flags.text("--timeline").map(str::to_owned),
    })
}

/// Loads the configuration and builds the chosen pool.
fn build_pool(
    args: &Args,
) -> Result<(String, ResourcePool<Request, Served, FakeModel>), PoolError> {
    let config = SchedulerConfig::from_path(&args.config)?;
    let name = match &args.pool {
        Some(name) => name.clone(),
        None => config.pools.keys().next().cloned().unwrap_or_default(),
    };
    let mut built = build_pools_from_scheduler_config::<Request, Served, FakeModel, TokioSpawner>(
        &config,
        &QueueBuilderContext::Embedded,
        None,
        |_name| FakeModel,
        TokioSpawner,
    )?;
    let pool = built.pools.remove(&name).ok_or_else(|| {
        let known: Vec<&str> = config.pools.keys().map(String::as_str).collect();
        PoolError::InvalidConfig(format!(
            "{}: no pool named {name}; its pools are {}",
            args.config,
            known.join(", ")
        ))
    })?;
    Ok((name, pool))
}

#[tokio::main]
async fn main() {
    std::panic::set_hook(Box::new(|_| {}));
    let args = parse_args().unwrap_or_else(|usage| {
        eprintln!("quickstart: {usage}");
        std::process::exit(2);
    });
    if let Err(error) = run(args).await {
        eprintln!("quickstart: {error}");
        std::process::exit(2);
    }
}

async fn run(args: Args) -> Result<(), PoolError> {
    // The recorder first: the pool registers its metrics with it when it is built. The
    // progress bar and the summary below read nothing but what it would serve to Prometheus.
    let metrics = PrometheusBuilder::new()
        .install_recorder()
        .map_err(|error| PoolError::Internal(format!("metrics recorder: {error}")))?;
    let (name, pool) = build_pool(&args)?;
    // With the `admin` feature the run is watched live in the browser.
    #[cfg(feature = "admin")]
    let dashboard = dashboard::start(vec![dashboard::pool(&name, pool.client().clone())]);
    #[cfg(not(feature = "admin"))]
    println!("(add --features admin to watch this run on a live dashboard)");
    let timeline = args
        .timeline
        .as_ref()
        .map(|_| Timeline::listen(PoolControl::clone(pool.client()), TIMELINE_TASKS));
    let pool = Arc::new(pool);
    let workers = pool.stats().worker_count;
    let vram = [("kind", "gpu_vram")];
    let vram_units = Scrape::take(&metrics, &name).value(names::UNITS_TOTAL, &vram);

    let progress = ProgressBar::new(REQUESTS);
    progress.set_style(
        ProgressStyle::with_template("{bar:40} {pos}/{len} requests  {msg}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    let watcher = {
        let (metrics, name, progress) = (metrics.clone(), name.clone(), progress.clone());
        tokio::spawn(async move {
            let (mut samples, mut used) = (0u64, 0.0);
            loop {
                tokio::time::sleep(Duration::from_millis(10)).await;
                let scrape = Scrape::take(&metrics, &name);
                let ended = scrape.ended();
                let rejected = scrape.value(names::TASKS_REJECTED, &[]);
                progress.set_position((ended + rejected) as u64);
                progress.set_message(format!(
                    "{} running, {} parked",
                    scrape.value(names::TASKS_RUNNING, &[]),
                    scrape.value(names::QUEUE_DEPTH, &[])
                ));
                if ended + rejected >= REQUESTS as f64 {
                    return used / (samples.max(1) as f64 * vram_units);
                }
                samples += 1;
                used += scrape.value(names::UNITS_USED, &vram);
            }
        })
    };

    let started = Instant::now();
    let mut mix = Mix(0x5eed_1234_abcd_9876);
    let mut waiting = tokio::task::JoinSet::new();
    for id in 0..REQUESTS {
        let (priority, units, decode, panics, deadline) = mix.request();
        let mut meta = TaskMetadata::new(id, ResourceCost::gpu_vram(units)).with_priority(priority);
        if let Some(in_ms) = deadline {
            meta = meta.with_deadline_ms(now_ms() + u128::from(in_ms));
        }
        let payload = Request { decode, panics };
        match pool.submit(ScheduledTask { meta, payload }).await {
            Ok(key) => {
                let pool = pool.clone();
                waiting.spawn(async move {
                    // Every outcome is counted in the metrics; the result itself is not needed.
                    let _ = pool.retrieve(&key, Duration::from_secs(60)).await;
                });
            }
            Err(error) => progress.println(format!("request {id} refused: {error}")),
        }
        tokio::time::sleep(Duration::from_millis(4)).await;
    }
    while let Some(joined) = waiting.join_next().await {
        joined.map_err(|error| PoolError::Internal(error.to_string()))?;
    }
    let elapsed = started.elapsed();
    let utilisation = watcher
        .await
        .map_err(|error| PoolError::Internal(error.to_string()))?;
    progress.finish_and_clear();
    let end = Scrape::take(&metrics, &name);

    println!("{REQUESTS} requests on {vram_units} VRAM units and {workers} worker threads\n");
    println!(
        "{:<28}{:>12}",
        "throughput (requests/s)",
        format!("{:.0}", REQUESTS as f64 / elapsed.as_secs_f64())
    );
    println!(
        "{:<28}{:>12}",
        "VRAM utilisation",
        format!("{:.1}%", utilisation * 100.0)
    );
    let restarts = end.value(names::WORKER_RESTARTS, &[]);
    println!("{:<28}{:>12}", "panics survived", restarts);
    let in_use = end.value(names::UNITS_USED, &vram);
    println!("{:<28}{:>12}", "units in use at the end", in_use);
    println!();
    println!(
        "{:<12}{:>10}{:>12}{:>12}",
        "priority", "started", "wait p50", "wait p99"
    );
    for priority in Priority::ALL.into_iter().rev() {
        let label = [("priority", priority_label(priority))];
        let wait_name = names::TASK_WAIT;
        let count_name = format!("{wait_name}_count");
        let quantile = |q: &str| {
            let labels = [label[0], ("quantile", q)];
            format!("{:.0} ms", end.value(wait_name, &labels) * 1_000.0)
        };
        println!(
            "{:<12}{:>10}{:>12}{:>12}",
            format!("{priority:?}"),
            end.value(&count_name, &label),
            quantile("0.5"),
            quantile("0.99"),
        );
    }
    println!();
    for (outcome, name) in [
        ("completed", names::TASKS_COMPLETED),
        ("failed (panic)", names::TASKS_FAILED),
        ("expired (deadline)", names::TASKS_EXPIRED),
        ("timed out", names::TASKS_TIMED_OUT),
        ("refused", names::TASKS_REJECTED),
    ] {
        println!("{outcome:<28}{:>12}", end.value(name, &[]));
    }
    println!("\n(every figure above is read from the pool's Prometheus metrics)");
    if let (Some(timeline), Some(path)) = (timeline, &args.timeline) {
        timeline
            .write_svg(path)
            .map_err(|error| PoolError::Internal(format!("{path}: {error}")))?;
        println!(
            "requests {} to {} through the pool, drawn: {path}",
            TIMELINE_TASKS.start,
            TIMELINE_TASKS.end - 1
        );
    }
    #[cfg(feature = "admin")]
    tokio::task::spawn_blocking(move || dashboard::keep_open(dashboard))
        .await
        .map_err(|error| PoolError::Internal(error.to_string()))?;
    pool.shutdown_with_drain(Duration::from_secs(5)).await?;
    Ok(())
}
