//! A desktop app's pool resuming its queued work after a restart.
//!
//! The pool comes from `config/desktop.yaml`: one local model, tasks kept in an embedded
//! yaque queue (`"durability": "accepted"`). The first run queues five prompts, one model
//! call at a time, and is closed after the first answer (a shutdown: the prompt running then
//! may finish, the waiting ones stay in the queue's files). The second run builds the pool
//! from the same file, submits nothing, and collects the remaining answers by task id in the
//! user's inbox: the pool picked up where it stopped.
//!
//! ```text
//! cargo run --features yaque --example desktop_resume
//! ```
//!
//! The queue files go to a temporary directory (the shipped file says `./data/queues`),
//! removed at the end.
//!
//! Its output: the first run's answer to task 1 (and any prompt that finished while the app
//! closed), the tasks left queued on disk; then the second run resuming them and each
//! answer as it comes, and that run's counters: nothing submitted, yet tasks completed,
//! since the resumed prompts were submitted to the first run.

use std::path::Path;
use std::time::Duration;

use prometheus_parking_lot::config::QueueSettings;
use prometheus_parking_lot::core::{ScheduledTask, TaskMetadata};
use prometheus_parking_lot::util::serde::{MailboxKey, ResourceCost};
use prometheus_parking_lot::{
    build_pools_from_scheduler_config, QueueBuilderContext, SchedulerConfig, TokioSpawner,
};
use prometheus_parking_lot::{ResourcePool, TaskExecutor};

const POOL: &str = "desktop_llm";

/// A stand-in for a local model: takes a while, answers in capitals.
#[derive(Clone)]
struct LocalModel;

#[async_trait::async_trait]
impl TaskExecutor<String, String> for LocalModel {
    async fn execute(&self, prompt: String, meta: TaskMetadata) -> String {
        tokio::time::sleep(Duration::from_millis(150)).await;
        println!("  model answered task {}", meta.id);
        prompt.to_uppercase()
    }
}

/// The app's pool, as `config/desktop.yaml` describes it, with its queue files in `dir`.
fn start_pool(
    dir: &Path,
) -> Result<ResourcePool<String, String, LocalModel>, Box<dyn std::error::Error>> {
    let file = Path::new(env!("CARGO_MANIFEST_DIR")).join("config/desktop.yaml");
    let mut config = SchedulerConfig::from_path(file)?;
    for pool in config.pools.values_mut() {
        if let QueueSettings::Yaque { path, .. } = &mut pool.queue {
            *path = dir.to_string_lossy().into_owned();
        }
    }
    let mut built = build_pools_from_scheduler_config::<String, String, LocalModel, TokioSpawner>(
        &config,
        &QueueBuilderContext::Embedded,
        None,
        |_name| LocalModel,
        TokioSpawner,
    )?;
    Ok(built
        .pools
        .remove(POOL)
        .ok_or("config/desktop.yaml has no desktop_llm pool")?)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = std::env::temp_dir().join(format!("pl-desktop-resume-{}", std::process::id()));
    let result = run(&dir).await;
    let _ = std::fs::remove_dir_all(&dir);
    result
}

async fn run(dir: &Path) -> Result<(), Box<dyn std::error::Error>> {
    // The user's inbox: results are filed under it, so the app finds them after a restart.
    let inbox = MailboxKey::new("desktop").with_user("me");
    let prompts = [
        "hello",
        "summarise my notes",
        "translate this",
        "draft a reply",
        "plan my week",
    ];

    println!("first run: queueing {} prompts", prompts.len());
    let pool = start_pool(dir)?;
    for (id, prompt) in (1..).zip(prompts) {
        // Each prompt needs all 8 units of the model: one runs, the others wait their turn.
        let meta = TaskMetadata::new(id, ResourceCost::gpu_vram(8)).with_mailbox(inbox.clone());
        pool.submit(ScheduledTask::new(meta, prompt.to_owned()))
            .await?;
    }
    let first = pool
        .retrieve_task(&inbox, 1, Duration::from_secs(10))
        .await?;
    println!("  got task 1: {first}");
    println!("the app is closed (the prompt running now may finish first)");
    let report = pool.shutdown_with_drain(Duration::from_secs(10)).await?;
    let mut waiting = Vec::new();
    for id in 2..=prompts.len() as u64 {
        match pool.retrieve_task(&inbox, id, Duration::ZERO).await {
            Ok(answer) => println!("  got task {id} while closing: {answer}"),
            Err(_) => waiting.push(id),
        }
    }
    println!(
        "  {} prompts stay queued on disk: tasks {waiting:?}",
        report.kept_parked
    );
    drop(pool);

    println!("second run: nothing is submitted again");
    let pool = start_pool(dir)?;
    let stats = pool.stats();
    println!(
        "  {} prompts resumed from the queue",
        stats.queued_tasks + stats.active_tasks
    );
    for id in waiting {
        let answer = pool
            .retrieve_task(&inbox, id, Duration::from_secs(10))
            .await?;
        println!("  got task {id}: {answer}");
    }
    let stats = pool.stats();
    println!(
        "  this run's counters: {} submitted, {} completed (the resumed prompts were submitted \
         to the first run; a pool counts the submissions it took, and the ends of every task \
         it ran)",
        stats.submitted_tasks, stats.completed_tasks
    );
    pool.shutdown_with_drain(Duration::from_secs(10)).await?;
    Ok(())
}
