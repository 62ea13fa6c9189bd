//! A retrieve that gives up returns the bare `PoolError::Timeout` code matches on, takes
//! nothing, and says (in a debug-level log line) which key and task it waited for, how long,
//! and what the pool was doing then.

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
