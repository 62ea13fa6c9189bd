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
//! one of its pools (default: the first).
//!
//! ```text
//! cargo run --release --example quickstart
//! cargo run --release --example quickstart -- --config config/local.json --pool local_llm
//! ```

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressStyle};
use prometheus_parking_lot::core::{
    PoolError, ResourcePool, ScheduledTask, TaskExecutor, TaskMetadata,
};
use prometheus_parking_lot::util::clock::now_ms;
use prometheus_parking_lot::util::serde::{Priority, ResourceCost};
use prometheus_parking_lot::{
    build_pools_from_scheduler_config, QueueBuilderContext, SchedulerConfig, TokioSpawner,
};

const REQUESTS: u64 = 1_500;

/// One simulated inference request. Config-built pools may park payloads in a durable
/// queue, so payloads and results serialise.
#[derive(serde::Serialize, serde::Deserialize)]
struct Request {
    submitted_at_us: u64,
    decode: Duration,
    panics: bool,
}

/// What a served request reports back.
#[derive(serde::Serialize, serde::Deserialize)]
struct Served {
    waited: Duration,
}

/// Wall-clock microseconds, which (unlike an `Instant`) survive serialisation.
fn micros_since_epoch() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |since| since.as_micros() as u64)
}

/// Pretends to decode: sleeps for the request's decode time (as a GPU-bound call would keep
/// the worker busy), or panics like a buggy model might.
#[derive(Clone)]
struct FakeModel;

#[async_trait::async_trait]
impl TaskExecutor<Request, Served> for FakeModel {
    async fn execute(&self, request: Request, meta: TaskMetadata) -> Served {
        let waited =
            Duration::from_micros(micros_since_epoch().saturating_sub(request.submitted_at_us));
        if request.panics {
            panic!("model crashed on request {}", meta.id);
        }
        tokio::time::sleep(request.decode).await;
        Served { waited }
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

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

/// `--config FILE` and `--pool NAME`.
struct Args {
    config: String,
    pool: Option<String>,
}

fn parse_args() -> Result<Args, String> {
    let mut args = Args {
        config: concat!(env!("CARGO_MANIFEST_DIR"), "/config/local.json").to_owned(),
        pool: None,
    };
    let mut given = std::env::args().skip(1);
    while let Some(flag) = given.next() {
        let value = given
            .next()
            .ok_or_else(|| format!("{flag} needs a value"))?;
        match flag.as_str() {
            "--config" => args.config = value,
            "--pool" => args.pool = Some(value),
            other => {
                return Err(format!(
                    "unknown argument {other}; use --config FILE [--pool NAME]"
                ))
            }
        }
    }
    Ok(args)
}

/// Loads the configuration and builds the chosen pool.
fn build_pool(args: &Args) -> Result<ResourcePool<Request, Served, FakeModel>, PoolError> {
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
    built
        .pools
        .remove(&name)
        .ok_or_else(|| PoolError::InvalidConfig(format!("{}: no pool named {name}", args.config)))
}

#[tokio::main]
async fn main() {
    std::panic::set_hook(Box::new(|_| {}));
    let outcome = match parse_args() {
        Ok(args) => run(args).await,
        Err(usage) => Err(PoolError::InvalidConfig(usage)),
    };
    if let Err(error) = outcome {
        eprintln!("quickstart: {error}");
        std::process::exit(2);
    }
}

async fn run(args: Args) -> Result<(), PoolError> {
    let pool = Arc::new(build_pool(&args)?);
    let vram_units = pool.stats().total_units;
    let workers = pool.stats().worker_count;

    let progress = ProgressBar::new(REQUESTS);
    progress.set_style(
        ProgressStyle::with_template("{bar:40} {pos}/{len} requests  {msg}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );

    let sampler = {
        let pool = pool.clone();
        tokio::spawn(async move {
            let (mut samples, mut used) = (0u64, 0u64);
            loop {
                tokio::time::sleep(Duration::from_millis(5)).await;
                let stats = pool.stats();
                if stats.submitted_tasks > 0 && stats.active_tasks == 0 && stats.queued_tasks == 0 {
                    return used as f64 / (samples.max(1) * vram_units) as f64;
                }
                samples += 1;
                used += stats.used_units;
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
        let payload = Request {
            submitted_at_us: micros_since_epoch(),
            decode,
            panics,
        };
        match pool.submit(ScheduledTask { meta, payload }).await {
            Ok(key) => {
                let pool = pool.clone();
                waiting.spawn(async move {
                    (priority, pool.retrieve(&key, Duration::from_secs(60)).await)
                });
            }
            Err(error) => progress.println(format!("request {id} refused: {error}")),
        }
        tokio::time::sleep(Duration::from_millis(4)).await;
    }

    let mut waits: BTreeMap<Priority, Vec<Duration>> = BTreeMap::new();
    let mut outcomes: BTreeMap<&str, u64> = BTreeMap::new();
    while let Some(joined) = waiting.join_next().await {
        let (priority, outcome) = joined.map_err(|error| PoolError::Internal(error.to_string()))?;
        let label = match outcome {
            Ok(served) => {
                waits.entry(priority).or_default().push(served.waited);
                "completed"
            }
            Err(PoolError::Failed(_)) => "failed (panic)",
            Err(PoolError::Expired) => "expired (deadline)",
            Err(PoolError::TimedOut) => "timed out",
            Err(_) => "other",
        };
        *outcomes.entry(label).or_default() += 1;
        progress.inc(1);
        progress.set_message(format!(
            "{} running, {} parked",
            pool.stats().active_tasks,
            pool.stats().queued_tasks
        ));
    }
    let elapsed = started.elapsed();
    progress.finish_and_clear();
    let utilisation = sampler
        .await
        .map_err(|error| PoolError::Internal(error.to_string()))?;
    let stats = pool.stats();

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
    println!("{:<28}{:>12}", "panics survived", stats.worker_restarts);
    println!("{:<28}{:>12}", "units in use at the end", stats.used_units);
    println!();
    println!(
        "{:<12}{:>10}{:>12}{:>12}",
        "priority", "served", "wait p50", "wait p99"
    );
    for (priority, mut served) in waits.into_iter().rev() {
        served.sort_unstable();
        println!(
            "{:<12}{:>10}{:>12}{:>12}",
            format!("{priority:?}"),
            served.len(),
            format!("{:.1?}", percentile(&served, 0.5)),
            format!("{:.1?}", percentile(&served, 0.99)),
        );
    }
    println!();
    for (outcome, count) in outcomes {
        println!("{outcome:<28}{count:>12}");
    }
    pool.shutdown(Duration::from_secs(5)).await?;
    Ok(())
}
