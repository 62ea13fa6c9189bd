//! Code written for the upstream crate (`prometheus-parking-lot-rs` 0.1.0) compiles and runs
//! against this one unchanged: API.md section F.
//!
//! The tests are written the way upstream's own tests and READMEs write them: names from
//! `util::{...}`, `infra::queue::InMemoryQueue`, `infra::mailbox::InMemoryMailbox`,
//! `runtime::TokioSpawner`, `PoolError::PoolShutdown` in match arms, a synchronous
//! `pool.shutdown()` at the end of `#[tokio::test]` bodies (a current-thread runtime) and from
//! plain threads, and `key.tenant == "t"`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use prometheus_parking_lot::config::{PoolConfig, WorkerPoolConfig};
use prometheus_parking_lot::core::{
    PoolError, ResourcePool, ScheduledTask, TaskExecutor, TaskMetadata, WorkerExecutor, WorkerPool,
};
use prometheus_parking_lot::infra::mailbox::InMemoryMailbox;
use prometheus_parking_lot::infra::queue::InMemoryQueue;
use prometheus_parking_lot::runtime::TokioSpawner;
use prometheus_parking_lot::util::{
    now_ms, MailboxKey, Priority, ResourceCost, ResourceKind, TaskId,
};

// ---------------------------------------------------------------------------------------
// helpers
// ---------------------------------------------------------------------------------------

fn make_meta(id: TaskId, units: u32, mailbox: Option<MailboxKey>) -> TaskMetadata {
    TaskMetadata {
        id,
        mailbox,
        priority: Priority::Normal,
        cost: ResourceCost {
            kind: ResourceKind::Cpu,
            units,
        },
        deadline_ms: None,
        created_at_ms: now_ms(),
    }
}

fn tenant_key(tenant: &str) -> MailboxKey {
    MailboxKey {
        tenant: tenant.into(),
        user_id: None,
        session_id: Some("session-1".to_string()),
    }
}

/// Sorts an error the way servers do. `PoolShutdown` is a constant: through a reference the
/// match needs the `*` (or a `&PoolShutdown` pattern), as API.md section F notes.
fn classify(error: &PoolError) -> &'static str {
    match *error {
        PoolError::PoolShutdown => "pool shut down",
        PoolError::QueueFull => "queue full",
        PoolError::Timeout => "timeout",
        _ => "other",
    }
}

/// Doubles its input after `delay_ms`, counting the calls that finished.
#[derive(Clone)]
struct Doubler {
    delay_ms: u64,
    finished: Arc<AtomicU64>,
}

impl Doubler {
    fn new(delay_ms: u64) -> Self {
        Self {
            delay_ms,
            finished: Arc::new(AtomicU64::new(0)),
        }
    }
}

#[async_trait]
impl WorkerExecutor<u64, u64> for Doubler {
    async fn execute(&self, payload: u64, _meta: TaskMetadata) -> u64 {
        tokio::time::sleep(Duration::from_millis(self.delay_ms)).await;
        self.finished.fetch_add(1, Ordering::SeqCst);
        payload * 2
    }
}

/// Counts the characters of a prompt (for the `ResourcePool` face).
#[derive(Clone)]
struct CharCount;

#[async_trait]
impl TaskExecutor<String, usize> for CharCount {
    async fn execute(&self, payload: String, _meta: TaskMetadata) -> usize {
        payload.chars().count()
    }
}

fn small_pool(delay_ms: u64) -> (WorkerPool<u64, u64, Doubler>, Doubler) {
    let executor = Doubler::new(delay_ms);
    let config = WorkerPoolConfig::new()
        .with_worker_count(1)
        .with_max_units(10)
        .with_max_queue_depth(10);
    let pool = WorkerPool::new(config, executor.clone()).expect("pool starts");
    (pool, executor)
}

async fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let give_up = Instant::now() + Duration::from_secs(10);
    while !done() {
        assert!(Instant::now() < give_up, "gave up waiting until {what}");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

// ---------------------------------------------------------------------------------------
// tests
// ---------------------------------------------------------------------------------------

#[test]
fn test_util_names_build_task_metadata() {
    let before = now_ms();
    let meta = make_meta(7, 3, None);
    assert_eq!(meta.id, 7);
    assert_eq!(meta.cost, ResourceCost::cpu(3));
    assert_eq!(meta.cost.kind, ResourceKind::Cpu);
    assert!(meta.created_at_ms >= before && meta.created_at_ms <= now_ms());
    assert!(Priority::Critical > Priority::High && Priority::Normal > Priority::Low);
    assert_eq!(
        make_meta(1, 1, None).priority,
        TaskMetadata::new(1, ResourceCost::cpu(1)).priority
    );
}

#[test]
fn test_tenant_compares_with_str_and_string() {
    let key = tenant_key("t");
    assert!(key.tenant == "t");
    let owner: String = "t".into();
    assert!(key.tenant == owner);
    assert!(owner == key.tenant);
    assert!("t" == key.tenant);
    assert!(key.tenant != "u");
    assert_eq!(key.session_id.as_deref(), Some("session-1"));
}

#[test]
fn test_pool_shutdown_matches_the_shutdown_error_under_both_names() {
    assert_eq!(classify(&PoolError::Shutdown), "pool shut down");
    assert_eq!(classify(&PoolError::PoolShutdown), "pool shut down");
    assert_eq!(classify(&PoolError::QueueFull), "queue full");
    assert_eq!(classify(&PoolError::Cancelled), "other");
    assert!(matches!(PoolError::PoolShutdown, PoolError::Shutdown));
    assert_eq!(
        PoolError::PoolShutdown.to_string(),
        PoolError::Shutdown.to_string()
    );
}

#[tokio::test]
async fn test_submit_retrieve_then_shutdown_at_the_end_of_an_async_test() {
    let (pool, executor) = small_pool(5);

    let key = pool
        .submit_async(21, make_meta(1, 2, Some(tenant_key("t"))))
        .await
        .expect("submitted");
    assert!(key.tenant == "t");
    let result = pool
        .retrieve_async(&key, Duration::from_secs(5))
        .await
        .expect("retrieved");
    assert_eq!(result, 42);
    assert_eq!(pool.stats().completed_tasks, 1);

    // The synchronous shutdown, on this test's current-thread runtime.
    let started = Instant::now();
    pool.shutdown();
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "an idle pool shuts down at once, took {:?}",
        started.elapsed()
    );

    let refused = pool.submit_async(1, make_meta(2, 2, None)).await;
    match refused {
        Err(PoolError::PoolShutdown) => {}
        other => panic!("expected PoolShutdown after shutdown, got {other:?}"),
    }
    let refused = pool.submit(1, make_meta(3, 2, None));
    assert!(
        matches!(refused, Err(PoolError::PoolShutdown)),
        "{refused:?}"
    );
    assert_eq!(executor.finished.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn test_shutdown_lets_the_running_task_finish_and_cancels_the_parked_one() {
    let (pool, executor) = small_pool(300);

    // One worker: the first task runs, the second waits for the worker.
    let running = pool.submit(1, make_meta(1, 2, None)).expect("submitted");
    let parked = pool.submit(2, make_meta(2, 2, None)).expect("submitted");
    wait_until("the first task runs", || pool.stats().active_tasks == 1).await;

    pool.shutdown();

    assert_eq!(executor.finished.load(Ordering::SeqCst), 1);
    let finished = pool.retrieve_async(&running, Duration::from_secs(5)).await;
    assert_eq!(finished, Ok(2));
    let cancelled = pool.retrieve_async(&parked, Duration::from_secs(5)).await;
    assert_eq!(cancelled, Err(PoolError::Cancelled));
}

#[test]
fn test_shutdown_from_a_plain_thread_twice() {
    let (pool, _executor) = small_pool(1);
    let pool = Arc::new(pool);
    let key = pool.submit(5, make_meta(1, 1, None)).expect("submitted");
    assert_eq!(pool.retrieve(&key, Duration::from_secs(5)), Ok(10));

    let closer = {
        let pool = Arc::clone(&pool);
        std::thread::spawn(move || {
            pool.shutdown();
            pool.shutdown();
        })
    };
    closer.join().expect("the shutdown thread ends");
    pool.shutdown();

    let refused = pool.submit(6, make_meta(2, 1, None));
    assert_eq!(classify(&refused.expect_err("refused")), "pool shut down");
}

#[tokio::test]
async fn test_async_drain_shutdown_keeps_a_name_of_its_own() {
    let (pool, _executor) = small_pool(1);
    let key = pool.submit_async(4, make_meta(1, 1, None)).await.unwrap();
    assert_eq!(
        pool.retrieve_async(&key, Duration::from_secs(5)).await,
        Ok(8)
    );

    let report = pool
        .shutdown_with_drain(Duration::from_secs(5))
        .await
        .expect("drained");
    assert_eq!(report.cancelled_parked + report.abandoned_running, 0);
    // The synchronous one after it does nothing more.
    pool.shutdown();
    assert!(matches!(
        pool.submit_async(5, make_meta(2, 1, None)).await,
        Err(PoolError::PoolShutdown)
    ));
}

#[tokio::test]
async fn test_resource_pool_built_from_the_upstream_paths() {
    let config = PoolConfig {
        worker_threads: 2,
        max_units: 8,
        ..PoolConfig::default()
    };
    let pool = ResourcePool::new(
        config,
        CharCount,
        Box::new(InMemoryQueue::new()),
        Box::new(InMemoryMailbox::new()),
        Box::new(TokioSpawner::new()),
    )
    .expect("pool starts");

    let meta = make_meta(9, 1, Some(tenant_key("acme")));
    let key = pool
        .submit(ScheduledTask {
            meta,
            payload: "parking".to_string(),
        })
        .await
        .expect("submitted");
    let tenant: String = format!("ac{}", "me");
    assert!(key.tenant == tenant);
    let count = pool.retrieve(&key, Duration::from_secs(5)).await;
    assert_eq!(count, Ok(7));
    pool.shutdown_with_drain(Duration::from_secs(5))
        .await
        .expect("stops");
}
