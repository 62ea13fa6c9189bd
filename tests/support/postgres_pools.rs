//! What the tests of pools on the Postgres backends share: the server's URL, names no other
//! test uses, a job that doubles its number after a while, and pools built from a config.

#![allow(dead_code)]

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use prometheus_parking_lot::core::{PoolError, ScheduledTask, TaskMetadata};
use prometheus_parking_lot::util::serde::{MailboxKey, ResourceCost, TaskId};
use prometheus_parking_lot::TaskExecutor;
use prometheus_parking_lot::{
    build_pools_from_scheduler_config, BuiltPools, QueueBuilderContext, SchedulerConfig,
    TokioSpawner,
};
use serde::{Deserialize, Serialize};

/// The server the tests use: `DATABASE_URL`, or the local one.
pub fn server_url() -> String {
    std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into())
}

/// A name no other test (or earlier run) uses.
pub fn fresh_name(prefix: &str) -> String {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |since| since.as_nanos());
    format!(
        "{prefix}_{}_{nanos}_{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

/// Doubles the job's number after `ms` milliseconds.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Work {
    pub n: u64,
    pub ms: u64,
}

/// Runs [`Work`].
#[derive(Clone)]
pub struct Doubler;

#[async_trait::async_trait]
impl TaskExecutor<Work, u64> for Doubler {
    async fn execute(&self, work: Work, _meta: TaskMetadata) -> u64 {
        tokio::time::sleep(Duration::from_millis(work.ms)).await;
        work.n * 2
    }
}

/// Task `id` of one GPU unit under `key`: doubles `n` after `ms` milliseconds.
pub fn work(id: TaskId, n: u64, ms: u64, key: &MailboxKey) -> ScheduledTask<Work> {
    ScheduledTask::new(
        TaskMetadata::new(id, ResourceCost::gpu_vram(1)).with_mailbox(key.clone()),
        Work { n, ms },
    )
}

/// Builds `config`'s pools as users build them (the backends connect themselves), off the
/// test's runtime.
pub async fn build_embedded(config: SchedulerConfig) -> BuiltPools<Work, u64, Doubler> {
    tokio::task::spawn_blocking(move || {
        build_pools_from_scheduler_config::<Work, u64, Doubler, TokioSpawner>(
            &config,
            &QueueBuilderContext::Embedded,
            None,
            |_| Doubler,
            TokioSpawner,
        )
        .expect("the pool starts")
    })
    .await
    .expect("building does not panic")
}

/// Submits tasks `ids` (no-op [`work`] under `key`) to pool `gpu` of `built` at once, each
/// from a task of its own; each handle answers with its id and what the submit answered.
pub fn submit_at_once(
    built: &Arc<BuiltPools<Work, u64, Doubler>>,
    ids: std::ops::RangeInclusive<TaskId>,
    key: &MailboxKey,
) -> Vec<tokio::task::JoinHandle<(TaskId, Result<MailboxKey, PoolError>)>> {
    ids.map(|id| {
        let (built, key) = (Arc::clone(built), key.clone());
        tokio::spawn(async move { (id, built.pools["gpu"].submit(work(id, id, 0, &key)).await) })
    })
    .collect()
}
