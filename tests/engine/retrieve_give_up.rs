//! A retrieve that gives up returns the bare `PoolError::Timeout` code matches on, takes
//! nothing, and says (in a debug-level log line) which key and task it waited for, how long,
//! what the pool was doing then and what became of the task. A retrieve that the pool can
//! tell will never get anything (a key it never made, a result taken already) says so at
//! once with `NothingToRetrieve`, instead of waiting out its timeout.

use std::time::Duration;

use async_trait::async_trait;
use prometheus_parking_lot::core::{PoolError, TaskMetadata, WorkerExecutor, WorkerPool};
use prometheus_parking_lot::{MailboxKey, ResourceCost, WorkerPoolConfig};

#[path = "../support/captured_log.rs"]
mod captured_log;
use captured_log::Captured;

/// Sleeps for the payload's milliseconds, then returns them.
#[derive(Clone)]
struct Sleep;

#[async_trait]
impl WorkerExecutor<u64, u64> for Sleep {
    async fn execute(&self, ms: u64, _meta: TaskMetadata) -> u64 {
        tokio::time::sleep(Duration::from_millis(ms)).await;
        ms
    }
}

#[test]
fn a_retrieve_that_gives_up_names_its_key_task_and_the_pool_state() {
    let captured = Captured::default();
    let writer = captured.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::DEBUG)
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .finish();

    tracing::subscriber::with_default(subscriber, || {
        let config = WorkerPoolConfig::new()
            .with_name("give-up")
            .with_worker_count(1)
            .with_max_units(4);
        let pool = WorkerPool::new(config, Sleep).expect("pool starts");
        let inbox = MailboxKey::new("acme").with_user("ada");
        let meta = TaskMetadata::new(7, ResourceCost::cpu(4)).with_mailbox(inbox.clone());
        let key = pool.submit(500, meta).expect("submitted");
        let parked = TaskMetadata::new(8, ResourceCost::cpu(4)).with_mailbox(inbox.clone());
        pool.submit(1, parked).expect("submitted");

        let early = pool.retrieve(&key, Duration::from_millis(20));
        assert_eq!(early, Err(PoolError::Timeout));
        let log = captured.text();
        let line = log
            .lines()
            .find(|line| line.contains("a retrieve gave up"))
            .unwrap_or_else(|| panic!("no give-up line in {log:?}"));
        for field in [
            "then=\"the task carries on",
            "pool=\"give-up\"",
            "tenant=acme",
            "user=\"ada\"",
            "waited_ms=20",
            "running=1",
            "parked=1",
        ] {
            assert!(line.contains(field), "{field} missing from {line:?}");
        }

        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        let by_task = runtime.block_on(pool.retrieve_task(&inbox, 8, Duration::from_millis(1)));
        assert_eq!(by_task, Err(PoolError::Timeout));
        assert!(
            captured.text().contains("task=8"),
            "the task is named: {}",
            captured.text()
        );

        // Nothing was taken by the retrieves that gave up.
        assert_eq!(pool.retrieve(&key, Duration::from_secs(5)), Ok(500));
        let second = runtime.block_on(pool.retrieve_task(&inbox, 8, Duration::from_secs(5)));
        assert_eq!(second, Ok(1));
        let gave_up = captured.text().matches("a retrieve gave up").count();
        assert_eq!(gave_up, 2, "only the retrieves that gave up are logged");
    });
}

/// A retrieve that cannot end well must not wait out its timeout to say so.
const LONG_WAIT: Duration = Duration::from_secs(60);
/// Far less than `LONG_WAIT`: a retrieve that answers within it answered at once.
const PROMPTLY: Duration = Duration::from_secs(5);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_the_pool_never_made_is_nothing_to_retrieve_at_once() {
    let pool = WorkerPool::new(WorkerPoolConfig::new().with_worker_count(1), Sleep).unwrap();
    let forged = MailboxKey::anonymous();
    let answer = tokio::time::timeout(PROMPTLY, pool.retrieve_async(&forged, LONG_WAIT))
        .await
        .expect("answered at once, not after the whole wait");
    assert_eq!(answer, Err(PoolError::NothingToRetrieve { task: None }));

    // From a plain thread too (which fails the test past 10 s, far less than the wait).
    let client = pool.client().clone();
    let blocking =
        crate::support::on_plain_thread(move || client.retrieve_blocking(&forged, None, LONG_WAIT))
            .await;
    assert_eq!(blocking, Err(PoolError::NothingToRetrieve { task: None }));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_result_taken_already_is_nothing_to_retrieve_by_key_and_by_task() {
    let pool = WorkerPool::new(WorkerPoolConfig::new().with_worker_count(1), Sleep).unwrap();
    let key = pool
        .submit_async(1, TaskMetadata::new(3, ResourceCost::cpu(1)))
        .await
        .unwrap();
    assert_eq!(pool.retrieve_async(&key, LONG_WAIT).await, Ok(1));
    let again = tokio::time::timeout(PROMPTLY, pool.retrieve_async(&key, LONG_WAIT))
        .await
        .expect("answered at once");
    assert_eq!(again, Err(PoolError::NothingToRetrieve { task: None }));

    let inbox = MailboxKey::new("acme");
    let meta = TaskMetadata::new(4, ResourceCost::cpu(1)).with_mailbox(inbox.clone());
    pool.submit_async(1, meta).await.unwrap();
    assert_eq!(pool.retrieve_task(&inbox, 4, LONG_WAIT).await, Ok(1));
    let by_task = tokio::time::timeout(PROMPTLY, pool.retrieve_task(&inbox, 4, LONG_WAIT))
        .await
        .expect("answered at once");
    assert_eq!(by_task, Err(PoolError::NothingToRetrieve { task: Some(4) }));
    let never = tokio::time::timeout(PROMPTLY, pool.retrieve_task(&inbox, 99, LONG_WAIT))
        .await
        .expect("answered at once");
    assert_eq!(never, Err(PoolError::NothingToRetrieve { task: Some(99) }));
    let message = never.unwrap_err().to_string();
    assert!(
        message.contains("task 99") && message.contains("never accepted"),
        "{message}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_live_task_is_still_waited_for_and_a_named_key_without_an_id_waits() {
    let pool = WorkerPool::new(WorkerPoolConfig::new().with_worker_count(1), Sleep).unwrap();
    // Running long: the retrieve waits for it, and gets it.
    let key = pool
        .submit_async(200, TaskMetadata::new(5, ResourceCost::cpu(1)))
        .await
        .unwrap();
    assert_eq!(pool.retrieve_async(&key, LONG_WAIT).await, Ok(200));
    // A key the caller named may still get tasks: the pool cannot tell, so it waits.
    let named = MailboxKey::new("nobody-yet");
    assert_eq!(
        pool.retrieve_async(&named, Duration::from_millis(20)).await,
        Err(PoolError::Timeout)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_retrieve_abandons_nothing_where_a_timeout_would() {
    // The in-memory mailbox abandons on a timeout; a retrieve future dropped mid-wait (a
    // select that took another branch) is no give-up: it stays cancel-safe.
    let pool = WorkerPool::new(WorkerPoolConfig::new().with_worker_count(1), Sleep).unwrap();
    let key = pool
        .submit_async(150, TaskMetadata::new(6, ResourceCost::cpu(1)))
        .await
        .unwrap();
    tokio::select! {
        _ = pool.retrieve_async(&key, LONG_WAIT) => panic!("it sleeps 150 ms"),
        _ = tokio::time::sleep(Duration::from_millis(20)) => {}
    }
    assert_eq!(pool.retrieve_async(&key, LONG_WAIT).await, Ok(150));
    assert_eq!(pool.stats().cancelled_tasks, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_abandoned_while_it_runs_is_nothing_to_retrieve_at_once() {
    // A key the pool made, a retrieve that gives up while the task runs: the task is
    // abandoned (it stores nothing), so a later retrieve is told so at once, though the
    // run goes on (this executor does not watch its flag).
    let pool = WorkerPool::new(WorkerPoolConfig::new().with_worker_count(1), Sleep).unwrap();
    let key = pool
        .submit_async(6_000, TaskMetadata::new(7, ResourceCost::cpu(1)))
        .await
        .unwrap();
    assert_eq!(
        pool.retrieve_async(&key, Duration::from_millis(50)).await,
        Err(PoolError::Timeout)
    );
    let again = tokio::time::timeout(PROMPTLY, pool.retrieve_async(&key, LONG_WAIT))
        .await
        .expect("answered at once, not after the whole wait");
    assert_eq!(again, Err(PoolError::NothingToRetrieve { task: None }));
    let by_task = tokio::time::timeout(PROMPTLY, pool.retrieve_task(&key, 7, LONG_WAIT))
        .await
        .expect("answered at once, by its id too");
    assert_eq!(by_task, Err(PoolError::NothingToRetrieve { task: Some(7) }));
    assert_eq!(pool.stats().cancelled_tasks, 1, "abandoned once");
}
