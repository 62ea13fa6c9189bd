//! The imports, struct literals and calls an existing inference server (candle-vllm) compiles
//! against, exactly as it writes them; and what it relies on at run time.

// The caller writes `meta.into()` and `stats.active_tasks as usize`; the test keeps its code.
#![allow(clippy::useless_conversion, clippy::unnecessary_cast)]

use std::sync::Arc;
use std::time::Duration;

use prometheus_parking_lot::config::WorkerPoolConfig;
use prometheus_parking_lot::core::{
    Mailbox, PoolError, PoolLimits, ScheduledTask, Spawn, TaskMetadata, TaskQueue, TaskStatus,
    WakeState, WorkerExecutor, WorkerPool,
};
use prometheus_parking_lot::infra::mailbox::memory::InMemoryMailbox;
use prometheus_parking_lot::infra::queue::memory::InMemoryQueue;
use prometheus_parking_lot::runtime::tokio_spawner::TokioSpawner;
use prometheus_parking_lot::util::clock::now_ms;
use prometheus_parking_lot::util::serde::{
    MailboxKey, Priority, ResourceCost, ResourceKind, TaskId,
};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Serialize, Deserialize)]
struct InferenceJob {
    prompt: String,
    max_tokens: usize,
}

/// A streamed completion: a receiver of tokens, neither `Clone` nor `Serialize`.
struct Completion {
    request_id: TaskId,
    tokens: tokio::sync::mpsc::Receiver<String>,
}

#[derive(Clone)]
struct LlmExecutor;

#[async_trait::async_trait]
impl WorkerExecutor<InferenceJob, Completion> for LlmExecutor {
    async fn execute(&self, payload: InferenceJob, meta: TaskMetadata) -> Completion {
        let (sender, tokens) = tokio::sync::mpsc::channel(16);
        tokio::spawn(async move {
            for word in payload.prompt.split_whitespace().take(payload.max_tokens) {
                if sender.send(word.to_owned()).await.is_err() {
                    break;
                }
            }
        });
        Completion {
            request_id: meta.id,
            tokens,
        }
    }
}

fn assert_shareable<T: Send + Sync + 'static>() {}

fn config() -> WorkerPoolConfig {
    WorkerPoolConfig::new()
        .with_worker_count(2)
        .with_max_units(16_384)
        .with_max_queue_depth(1_000)
        .with_timeout_ms(120_000)
        .with_thread_stack_size(2 * 1024 * 1024)
}

fn metadata(id: TaskId, priority: Priority) -> TaskMetadata {
    TaskMetadata {
        id,
        mailbox: None,
        priority,
        cost: ResourceCost {
            kind: ResourceKind::GpuVram,
            units: 512,
        },
        deadline_ms: None,
        created_at_ms: now_ms(),
    }
}

async fn collect(mut completion: Completion) -> Vec<String> {
    let mut words = Vec::new();
    while let Some(word) = completion.tokens.recv().await {
        words.push(word);
    }
    words
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_inference_server_compiles_and_runs_against_the_pool() {
    assert_shareable::<WorkerPool<InferenceJob, Completion, LlmExecutor>>();
    let pool: Arc<WorkerPool<InferenceJob, Completion, LlmExecutor>> = Arc::new(
        WorkerPool::<InferenceJob, Completion, LlmExecutor>::new(config(), LlmExecutor).unwrap(),
    );

    let meta = metadata(42, Priority::High);
    assert_eq!(meta.id, 42);
    let job = InferenceJob {
        prompt: "the quick brown fox".into(),
        max_tokens: 3,
    };
    let key: MailboxKey = pool.submit_async(job, meta.clone().into()).await.unwrap();
    let completion = pool
        .retrieve_async(&key, Duration::from_secs(10))
        .await
        .unwrap();
    assert_eq!(completion.request_id, 42);
    assert_eq!(collect(completion).await, ["the", "quick", "brown"]);

    // The synchronous pair, as called from spawn_blocking.
    let blocking_pool = pool.clone();
    let completion = tokio::task::spawn_blocking(move || {
        let meta = TaskMetadata::new(7, ResourceCost::gpu_vram(100));
        let key = blocking_pool
            .submit(
                InferenceJob {
                    prompt: "hello there".into(),
                    max_tokens: 8,
                },
                meta,
            )
            .unwrap();
        blocking_pool.retrieve(&key, Duration::from_secs(10))
    })
    .await
    .unwrap()
    .unwrap();
    assert_eq!(collect(completion).await, ["hello", "there"]);

    let stats = pool.stats();
    assert_eq!(stats.worker_count, 2);
    assert_eq!(stats.submitted_tasks, 2);
    assert_eq!(stats.completed_tasks, 2);
    assert_eq!(stats.failed_tasks, 0);
    assert_eq!(stats.active_tasks as usize, 0);
    assert_eq!(stats.queued_tasks as usize, 0);
    assert_eq!(stats.used_units as usize, 0);
    assert_eq!(stats.total_units as usize, 16_384);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn errors_match_the_variants_the_server_handles() {
    let pool =
        WorkerPool::<InferenceJob, Completion, LlmExecutor>::new(config(), LlmExecutor).unwrap();
    let too_big = TaskMetadata::new(1, ResourceCost::cpu(20_000));
    let job = InferenceJob {
        prompt: String::new(),
        max_tokens: 1,
    };
    match pool.submit_async(job, too_big).await {
        Err(PoolError::InsufficientResources {
            needed, available, ..
        }) => {
            assert_eq!((needed, available), (20_000, 16_384));
        }
        other => panic!(
            "expected InsufficientResources, got {:?}",
            other.map(|_| ())
        ),
    }
    let nobody = MailboxKey::from("nobody");
    match pool
        .retrieve_async(&nobody, Duration::from_millis(20))
        .await
    {
        Err(PoolError::Timeout) => {}
        other => panic!("expected Timeout, got {:?}", other.map(|_| ())),
    }
    let errors = [
        PoolError::QueueFull,
        PoolError::Timeout,
        PoolError::ResultNotFound,
        PoolError::Shutdown,
        PoolError::InvalidConfig("x".into()),
        PoolError::Internal("y".into()),
    ];
    for error in errors {
        let described: &dyn std::error::Error = &error;
        assert!(!described.to_string().is_empty());
    }
}

#[test]
fn the_remaining_imported_names_are_usable() {
    let _queue: Box<dyn TaskQueue<InferenceJob>> = Box::new(InMemoryQueue::new());
    let _mailbox: Box<dyn Mailbox<Completion>> = Box::new(InMemoryMailbox::new());
    let _spawner: Box<dyn Spawn> = Box::new(TokioSpawner::new());
    let limits = PoolLimits::new(16_384, 4);
    assert!(limits.validate().is_ok());
    assert!(TaskStatus::Completed.is_terminal());
    assert_ne!(WakeState::Parked, WakeState::Running);
    let task = ScheduledTask {
        meta: metadata(9, Priority::Low),
        payload: 1u8,
    };
    assert!(Priority::Low < Priority::Normal && Priority::High < Priority::Critical);
    assert_eq!(task.meta.cost, ResourceCost::gpu_vram(512));
    let bad = WorkerPool::<InferenceJob, Completion, LlmExecutor>::new(
        config().with_worker_count(0),
        LlmExecutor,
    );
    assert!(
        matches!(bad, Err(PoolError::InvalidConfig(message)) if message.contains("worker_threads"))
    );
}
