//! Errors keep their cause. A backend that fails under a pool is a typed error naming the
//! pool, the backend and the operation, whose fault says whether to retry and whose source
//! chain reaches the error underneath; how a task ended without a result is a type of its
//! own ([`TaskFailure`]), distinct from a caller's wait running out.

use std::error::Error;
use std::io;
use std::sync::Arc;
use std::time::{Duration, Instant};

use prometheus_parking_lot::core::{
    BackendFault, Durability, EntryId, FaultKind, Mailbox, PoolError, QueueCounts, QueueError,
    ScheduledTask, Settlement, StoredEntry, TaskFailure, TaskQueue, TaskStatus,
};
use prometheus_parking_lot::infra::mailbox::InMemoryMailbox;
use prometheus_parking_lot::infra::queue::InMemoryQueue;
use prometheus_parking_lot::{
    MailboxKey, ResourceCost, ResourcePool, TaskExecutor, TaskMetadata, TokioSpawner,
    WorkerPoolConfig,
};

/// A durable queue whose server is away: every park fails, as a database's would when
/// nothing listens at its port.
struct AwayQueue;

#[async_trait::async_trait]
impl TaskQueue<u64> for AwayQueue {
    fn backend(&self) -> &'static str {
        "remote"
    }
    fn is_durable(&self) -> bool {
        true
    }
    async fn park(&self, _entry: EntryId, _task: ScheduledTask<u64>) -> Result<(), QueueError> {
        let refused = io::Error::new(io::ErrorKind::ConnectionRefused, "connection refused");
        let fault = BackendFault::new(
            FaultKind::Unreachable,
            "the server refused the connection",
            refused,
        );
        Err(QueueError::Backend(fault))
    }
    async fn claim(&self, _entry: EntryId) -> Result<Option<ScheduledTask<u64>>, QueueError> {
        Ok(None)
    }
    async fn settle(&self, _entry: EntryId, _settlement: Settlement) -> Result<(), QueueError> {
        Ok(())
    }
    async fn remove(&self, _entry: EntryId) -> Result<Option<ScheduledTask<u64>>, QueueError> {
        Ok(None)
    }
    async fn load_parked(&self) -> Result<Vec<StoredEntry>, QueueError> {
        Ok(Vec::new())
    }
    async fn counts(&self) -> Result<QueueCounts, QueueError> {
        Ok(QueueCounts::default())
    }
}

/// Sleeps for the payload's milliseconds, returns it.
#[derive(Clone)]
struct Nap;

#[async_trait::async_trait]
impl TaskExecutor<u64, u64> for Nap {
    async fn execute(&self, ms: u64, _meta: TaskMetadata) -> u64 {
        tokio::time::sleep(Duration::from_millis(ms)).await;
        ms
    }
}

fn task(id: u64, ms: u64, key: &MailboxKey) -> ScheduledTask<u64> {
    let meta = TaskMetadata::new(id, ResourceCost::cpu(4)).with_mailbox(key.clone());
    ScheduledTask::new(meta, ms)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queue_that_is_away_is_a_typed_retryable_error_that_keeps_its_cause() {
    let settings = WorkerPoolConfig::new()
        .with_name("chat")
        .with_worker_count(1)
        .with_max_units(4)
        .with_durability(Durability::Parked {
            spin: Duration::ZERO,
        });
    let pool = ResourcePool::with_settings(
        settings,
        Nap,
        Box::new(AwayQueue),
        Arc::new(InMemoryMailbox::new()),
        &TokioSpawner,
    )
    .expect("the pool starts");
    let key = MailboxKey::new("acme");
    // Task 1 holds every unit without touching the queue; task 2 must park, and cannot.
    pool.submit(task(1, 300, &key))
        .await
        .expect("task 1 starts");
    let refused = pool
        .submit(task(2, 0, &key))
        .await
        .expect_err("a park the queue cannot take is refused");

    let PoolError::Backend(backend) = &refused else {
        panic!("a queue that is away is a backend error, not {refused:?}");
    };
    assert_eq!(backend.pool, "chat");
    assert_eq!(backend.backend, "remote queue");
    assert_eq!(backend.operation, "park a task");
    assert_eq!(backend.fault.kind, FaultKind::Unreachable);
    assert!(
        refused.is_retryable(),
        "a server that is away is worth retrying"
    );
    assert_eq!(
        refused.to_string(),
        "pool chat: the remote queue could not park a task: unreachable: the server refused \
         the connection"
    );
    // The chain: the pool's error, the backend's fault, the I/O error the backend met.
    let fault = refused.source().expect("the backend's fault");
    let underneath = fault.source().expect("the error underneath");
    let io = underneath
        .downcast_ref::<io::Error>()
        .expect("the very error the queue met, not its text");
    assert_eq!(io.kind(), io::ErrorKind::ConnectionRefused);

    // The refusal cost the pool nothing: task 1 ends with its result.
    assert_eq!(
        pool.retrieve_task(&key, 1, Duration::from_secs(5)).await,
        Ok(300)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_that_runs_too_long_is_an_outcome_and_a_wait_that_runs_out_is_not() {
    let mailbox = Arc::new(InMemoryMailbox::<u64>::new());
    let pool = ResourcePool::with_settings(
        WorkerPoolConfig::new()
            .with_name("slow")
            .with_worker_count(2)
            .with_max_units(8)
            .with_timeout_ms(200),
        Nap,
        Box::new(InMemoryQueue::new()),
        mailbox.clone(),
        &TokioSpawner,
    )
    .expect("the pool starts");
    let (watched, fetched) = (MailboxKey::new("acme"), MailboxKey::new("globex"));
    pool.submit(task(1, 10_000, &watched)).await.unwrap();
    pool.submit(task(2, 10_000, &fetched)).await.unwrap();

    // The caller's wait runs out first: `Timeout`, and nothing is taken.
    let early = pool.retrieve(&fetched, Duration::from_millis(20)).await;
    assert_eq!(early, Err(PoolError::Timeout));
    assert!(
        early.unwrap_err().is_retryable(),
        "a wait that ran out may be tried again"
    );

    // The task itself runs past its 200 ms: the mailbox keeps that outcome as a
    // `TaskFailure`, the type of how a task ended, not an operation's error.
    let stored = stored_outcome(mailbox.as_ref(), &watched).await;
    assert_eq!(stored.outcome, Err(TaskFailure::TimedOut));
    assert_eq!(stored.status(), TaskStatus::TimedOut);

    // A retrieve hands the same outcome back as the variant code has always matched.
    assert_eq!(
        pool.retrieve(&fetched, Duration::from_secs(5)).await,
        Err(PoolError::TimedOut)
    );
    assert!(
        !PoolError::TimedOut.is_retryable(),
        "a task that ran too long will never have a result"
    );
}

/// Takes the first outcome stored under `key`, waiting up to 5 s for it.
async fn stored_outcome(
    mailbox: &dyn Mailbox<u64>,
    key: &MailboxKey,
) -> prometheus_parking_lot::core::Delivery<u64> {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        if let Some(delivery) = mailbox.take(key).await.expect("the mailbox answers") {
            return delivery;
        }
        assert!(Instant::now() < deadline, "no outcome was stored");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// A database that cannot be reached when pools are built fails the build as it would fail
/// a running pool: a backend error of kind `Unreachable`, worth retrying, whose chain keeps
/// the cause. Nothing listens on port 1, so no server is needed.
#[cfg(feature = "postgres")]
mod database_at_start {
    use super::*;
    use prometheus_parking_lot::{
        build_pools_from_scheduler_config, QueueBuilderContext, SchedulerConfig,
    };

    fn build(database_url: &str) -> PoolError {
        let config = SchedulerConfig::from_json_str(&format!(
            r#"{{ "database_url": "{database_url}",
                 "pools": {{ "chat": {{ "queue": {{ "type": "postgres" }} }} }} }}"#
        ))
        .expect("a valid configuration");
        match build_pools_from_scheduler_config::<u64, u64, Nap, TokioSpawner>(
            &config,
            &QueueBuilderContext::Embedded,
            None,
            |_| Nap,
            TokioSpawner,
        ) {
            Ok(_) => panic!("pools built on {database_url}"),
            Err(error) => error,
        }
    }

    /// Fails if one part of `text` (parts end at `": "`) says again what the part before it
    /// said: a message wrapped twice in the same prefix.
    fn assert_no_repeated_prefix(text: &str) {
        let parts: Vec<&str> = text.split(": ").collect();
        assert!(
            parts.windows(2).all(|pair| pair[0] != pair[1]),
            "a prefix is repeated: {text}"
        );
    }

    #[test]
    fn a_database_that_does_not_answer_is_a_retryable_backend_error_that_keeps_its_cause() {
        let refused = build("postgres://app@127.0.0.1:1/test");

        let PoolError::Backend(backend) = &refused else {
            panic!("a database that cannot be reached is a backend error, not {refused:?}");
        };
        assert_eq!(backend.pool, "chat");
        assert_eq!(backend.fault.kind, FaultKind::Unreachable);
        assert!(refused.is_retryable(), "{refused}");
        let fault = refused.source().expect("the backend's fault");
        assert!(fault.source().is_some(), "the fault keeps what was met");
        let text = refused.to_string();
        assert!(text.contains("database_url"), "names the setting: {text}");
        assert!(text.contains("refused"), "says what happened: {text}");
        assert_no_repeated_prefix(&text);
    }

    #[test]
    fn a_url_the_driver_cannot_read_is_a_configuration_error_said_once() {
        for url in [
            "postgres://app@127.0.0.1:5432/test?sslmode=bogus",
            "postgres://app@127.0.0.1:99999/test",
        ] {
            let refused = build(url);
            let PoolError::InvalidConfig(problem) = &refused else {
                panic!(
                    "{url}: a URL that cannot be read is a configuration error, not {refused:?}"
                );
            };
            assert!(problem.starts_with("database_url: "), "{problem}");
            assert!(!refused.is_retryable());
            assert_no_repeated_prefix(&refused.to_string());
            assert!(
                !problem.contains("error with configuration"),
                "the driver's wrappers are not ours to repeat: {problem}"
            );
        }
    }
}
