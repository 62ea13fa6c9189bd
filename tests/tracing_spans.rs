//! The spans an operator sees with a `tracing` subscriber at TRACE: one `task` span per task
//! (pool, id, tenant, priority, kind, units) carrying its steps, and one `actor` span per
//! message an actor handles (kind, id, what it serves). One test: it installs the process's
//! global subscriber.

use std::time::Duration;

use async_trait::async_trait;
use prometheus_parking_lot::config::WorkerPoolConfig;
use prometheus_parking_lot::core::{TaskMetadata, WorkerExecutor, WorkerPool};
use prometheus_parking_lot::util::serde::ResourceCost;
use tracing_subscriber::fmt::format::FmtSpan;

#[path = "support/captured_log.rs"]
mod captured_log;
use captured_log::Captured;

#[derive(Clone)]
struct Double;

#[async_trait]
impl WorkerExecutor<u64, u64> for Double {
    async fn execute(&self, n: u64, _meta: TaskMetadata) -> u64 {
        n * 2
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tasks_and_actors_run_in_spans_that_name_them() {
    let captured = Captured::default();
    let writer = captured.clone();
    tracing_subscriber::fmt()
        .with_max_level(tracing::Level::TRACE)
        .with_span_events(FmtSpan::CLOSE)
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .init();

    let config = WorkerPoolConfig::new()
        .with_name("traced")
        .with_worker_count(1)
        .with_max_units(4);
    let pool = WorkerPool::new(config, Double).expect("pool starts");
    for id in 1..=3 {
        let key = pool
            .submit_async(id, TaskMetadata::new(id, ResourceCost::gpu_vram(2)))
            .await
            .expect("admitted");
        assert_eq!(
            pool.retrieve_async(&key, Duration::from_secs(10)).await,
            Ok(id * 2)
        );
    }
    pool.shutdown_with_drain(Duration::from_secs(5))
        .await
        .expect("stops");

    let text = captured.text();
    for id in 1..=3 {
        let span = format!("task{{pool=\"traced\" task_id={id}");
        assert!(text.contains(&span), "no span {span} in:\n{text}");
    }
    for actor in ["actor{kind=\"scheduler\"", "actor{kind=\"supervisor\""] {
        assert!(text.contains(actor), "no span {actor} in:\n{text}");
    }
    assert!(
        text.contains("serves=\"traced\""),
        "the scheduler's span names its pool:\n{text}"
    );
}
