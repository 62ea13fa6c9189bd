//! The mailbox actor writes results in groups (`Mailbox::store_many`): every result that
//! finishes while the previous write is in flight goes in the next one. Checked with a
//! mailbox that awaits (as a database does) and records each write: a busy pool's results
//! share writes, none is lost or written twice, each key's results keep their order, and a
//! shutdown writes what was still waiting.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use prometheus_parking_lot::actors::{spawn_supervisor, start_pool, PoolSpec, WorkerSettings};
use prometheus_parking_lot::core::{
    Delivery, Mailbox, MailboxError, Notifier, PoolClient, PoolLimits, ScheduledTask,
    SubmitOptions, TaskMetadata, TerminalEvent,
};
use prometheus_parking_lot::infra::mailbox::memory::InMemoryMailbox;
use prometheus_parking_lot::infra::queue::memory::InMemoryQueue;
use prometheus_parking_lot::util::serde::{MailboxKey, ResourceCost, TaskId};
use prometheus_parking_lot::TaskExecutor;

use prometheus_parking_lot::core::RestartPolicy;
use tokio::sync::{Notify, Semaphore};

const WAIT: Duration = Duration::from_secs(10);

/// An in-memory mailbox behind a slow write (`delay` per `store_many`, and a permit of
/// `gate` when it has one), recording each write's task ids. With `stale_holds` set, its next
/// `holds` reads its answer, then opens the gate and waits for the write to land before
/// answering: the answer is stale, as a database read racing a commit can be.
pub(crate) struct SlowMailbox {
    pub inner: InMemoryMailbox<TaskId>,
    delay: Duration,
    writes: Mutex<Vec<Vec<TaskId>>>,
    pub gate: Option<Semaphore>,
    pub stale_holds: AtomicBool,
}

#[async_trait]
impl Mailbox<TaskId> for SlowMailbox {
    fn backend(&self) -> &'static str {
        "slow"
    }

    async fn store(
        &self,
        key: &MailboxKey,
        delivery: Delivery<TaskId>,
    ) -> Result<(), MailboxError> {
        let mut stored = self.store_many(vec![(key.clone(), delivery)]).await;
        stored.pop().expect("one answer")
    }

    async fn store_many(
        &self,
        deliveries: Vec<(MailboxKey, Delivery<TaskId>)>,
    ) -> Vec<Result<(), MailboxError>> {
        tokio::time::sleep(self.delay).await;
        if let Some(gate) = &self.gate {
            gate.acquire().await.expect("open").forget();
        }
        let ids = deliveries
            .iter()
            .map(|(_, delivery)| delivery.task_id)
            .collect();
        self.writes.lock().unwrap().push(ids);
        let mut stored = Vec::new();
        for (key, delivery) in deliveries {
            stored.push(self.inner.store(&key, delivery).await);
        }
        stored
    }

    async fn holds(&self, wanted: &[(MailboxKey, TaskId)]) -> Result<Vec<bool>, MailboxError> {
        let mut held = Vec::new();
        for (key, id) in wanted {
            held.push(self.inner.list(key).await?.contains(id));
        }
        if let (Some(gate), true) = (&self.gate, self.stale_holds.swap(false, Ordering::SeqCst)) {
            gate.add_permits(1);
            let (key, id) = &wanted[0];
            while !self.inner.list(key).await?.contains(id) {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            // The mailbox actor tells the pool the write landed right after it returns.
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Ok(held)
    }

    async fn take(&self, key: &MailboxKey) -> Result<Option<Delivery<TaskId>>, MailboxError> {
        self.inner.take(key).await
    }

    async fn take_task(
        &self,
        key: &MailboxKey,
        task_id: TaskId,
    ) -> Result<Option<Delivery<TaskId>>, MailboxError> {
        self.inner.take_task(key, task_id).await
    }

    async fn list(&self, key: &MailboxKey) -> Result<Vec<TaskId>, MailboxError> {
        self.inner.list(key).await
    }

    async fn purge_stored_before(&self, cutoff_ms: u64) -> Result<usize, MailboxError> {
        self.inner.purge_stored_before(cutoff_ms).await
    }

    async fn stored_count(&self) -> Result<usize, MailboxError> {
        self.inner.stored_count().await
    }

    fn subscribe(&self, key: &MailboxKey) -> Arc<Notify> {
        self.inner.subscribe(key)
    }
}

#[derive(Clone)]
struct Echo;

#[async_trait]
impl TaskExecutor<u64, TaskId> for Echo {
    async fn execute(&self, _payload: u64, meta: TaskMetadata) -> TaskId {
        meta.id
    }
}

async fn pool(mailbox: Arc<SlowMailbox>) -> PoolClient<u64, TaskId> {
    pool_telling(mailbox, Vec::new()).await
}

async fn pool_telling(
    mailbox: Arc<SlowMailbox>,
    notifiers: Vec<Arc<dyn Notifier>>,
) -> PoolClient<u64, TaskId> {
    pool_with(mailbox, notifiers, PoolLimits::new(4, 4)).await
}

/// A pool of four workers whose tasks answer their own id, under `limits`, storing results
/// in `mailbox` and telling `notifiers`.
pub(crate) async fn pool_with(
    mailbox: Arc<dyn Mailbox<TaskId>>,
    notifiers: Vec<Arc<dyn Notifier>>,
    limits: PoolLimits,
) -> PoolClient<u64, TaskId> {
    let supervisor = spawn_supervisor().await.unwrap();
    let spec = PoolSpec {
        tenant_weights: Default::default(),
        name: "grouped".into(),
        limits,
        workers: WorkerSettings {
            count: 4,
            stack_size: None,
            pin_to_cpus: false,
        },
        default_timeout: None,
        restart: RestartPolicy::default(),
        executor: Echo,
        queue: Box::new(InMemoryQueue::new()),
        mailbox,
        notifiers,
        result_encoder: None,
        subscribers: Vec::new(),
        retention: None,
        shared: None,
        durability: Default::default(),
        gpu: None,
        tracer: None,
    };
    start_pool(&supervisor, spec).await.unwrap()
}

fn slow_mailbox(delay_ms: u64) -> Arc<SlowMailbox> {
    Arc::new(SlowMailbox {
        inner: InMemoryMailbox::new(),
        delay: Duration::from_millis(delay_ms),
        writes: Mutex::default(),
        gate: None,
        stale_holds: AtomicBool::new(false),
    })
}

/// A mailbox whose writes each wait for a permit of a gate that starts closed.
pub(crate) fn gated_mailbox() -> Arc<SlowMailbox> {
    Arc::new(SlowMailbox {
        inner: InMemoryMailbox::new(),
        delay: Duration::ZERO,
        writes: Mutex::default(),
        gate: Some(Semaphore::new(0)),
        stale_holds: AtomicBool::new(false),
    })
}

/// One key for every task: its results must come out in the order they were written.
fn key() -> MailboxKey {
    MailboxKey::new("acme").with_session("one")
}

fn tasks(ids: std::ops::RangeInclusive<TaskId>) -> Vec<ScheduledTask<u64>> {
    ids.map(|id| {
        ScheduledTask::new(
            TaskMetadata::new(id, ResourceCost::cpu(1)).with_mailbox(key()),
            id,
        )
    })
    .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_pools_results_share_writes_and_none_is_lost() {
    let mailbox = slow_mailbox(5);
    let client = pool(mailbox.clone()).await;
    let answers = client
        .submit_batch(tasks(1..=200), SubmitOptions::default())
        .await;
    assert!(answers.iter().all(Result::is_ok));
    let mut taken = Vec::new();
    while taken.len() < 200 {
        let id = client.retrieve(&key(), WAIT).await.expect("a result");
        taken.push(id);
    }
    let writes = mailbox.writes.lock().unwrap().clone();
    let written: Vec<TaskId> = writes.iter().flatten().copied().collect();
    assert_eq!(
        taken, written,
        "results come out in the order they were written"
    );
    let mut ids = written.clone();
    ids.sort_unstable();
    assert_eq!(
        ids,
        (1..=200).collect::<Vec<_>>(),
        "each result written once"
    );
    assert!(
        writes.len() < 100,
        "200 results in {} writes: they were not grouped",
        writes.len()
    );
    client.shutdown(WAIT).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shutdown_writes_the_results_still_waiting() {
    // Task 1's result opens a write that takes 100 ms; tasks 2 to 50 end meanwhile, and the
    // shutdown's drain reaches the mailbox actor behind their results, before the write
    // that would take them.
    let mailbox = slow_mailbox(100);
    let client = pool(mailbox.clone()).await;
    let first = client
        .submit_batch(tasks(1..=1), SubmitOptions::default())
        .await;
    assert!(first.iter().all(Result::is_ok));
    tokio::time::sleep(Duration::from_millis(30)).await;
    let rest = client
        .submit_batch(tasks(2..=50), SubmitOptions::default())
        .await;
    assert!(rest.iter().all(Result::is_ok));
    let report = client.shutdown(WAIT).await.unwrap();
    assert_eq!(report.abandoned_running, 0, "{report:?}");
    assert_eq!(
        mailbox.inner.stored_count().await.unwrap(),
        50,
        "every task's outcome is stored by the time shutdown returns"
    );
    let writes = mailbox.writes.lock().unwrap().clone();
    assert_eq!(writes.first(), Some(&vec![1]), "{writes:?}");
}

/// Panics on the events of odd tasks.
struct Grumpy;

impl Notifier for Grumpy {
    fn notify(&self, event: &TerminalEvent) {
        assert!(
            event.task_id.is_multiple_of(2),
            "odd task {}",
            event.task_id
        );
    }
}

/// Counts the events it hears.
#[derive(Default)]
struct Counter(Mutex<Vec<TaskId>>);

impl Notifier for Counter {
    fn notify(&self, event: &TerminalEvent) {
        self.0.lock().unwrap().push(event.task_id);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panicking_notifier_loses_no_result_and_no_other_notifiers_event() {
    let mailbox = slow_mailbox(5);
    let counter = Arc::new(Counter::default());
    let notifiers: Vec<Arc<dyn Notifier>> = vec![Arc::new(Grumpy), counter.clone()];
    let client = pool_telling(mailbox.clone(), notifiers).await;
    let answers = client
        .submit_batch(tasks(1..=60), SubmitOptions::default())
        .await;
    assert!(answers.iter().all(Result::is_ok));
    let mut taken = Vec::new();
    while taken.len() < 60 {
        taken.push(client.retrieve(&key(), WAIT).await.expect("a result"));
    }
    taken.sort_unstable();
    assert_eq!(taken, (1..=60).collect::<Vec<_>>());
    // Events follow their stores: wait for the last ones (a panic's report takes a while).
    for _ in 0..1_000 {
        if counter.0.lock().unwrap().len() >= 60 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let mut heard = counter.0.lock().unwrap().clone();
    heard.sort_unstable();
    assert_eq!(
        heard,
        (1..=60).collect::<Vec<_>>(),
        "the second notifier heard everything"
    );
    client.shutdown(WAIT).await.unwrap();
}
