//! Reliability sweep (issue 7), pool lifecycle: shutdown is idempotent and race-free,
//! `Duration::MAX` means "wait for ever" everywhere it is accepted, a dropped pool drains as
//! configured, and settings a thread builder cannot honour are refused, not panicked on.
//!
//! Every case is bounded in time: a regression fails instead of hanging.

use crate::support;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use prometheus_parking_lot::config::WorkerPoolConfig;
use prometheus_parking_lot::core::ShutdownReport;
use prometheus_parking_lot::core::{PoolError, TaskMetadata, WorkerExecutor, WorkerPool};
use prometheus_parking_lot::util::serde::{Priority, ResourceCost};
use support::{eventually, gpu, settings, Job, LabPool};

const WAIT: Duration = Duration::from_secs(10);

/// Runs blocking `work` on a plain thread and waits for it at most [`WAIT`]: a blocking call
/// that never returns fails the test instead of hanging it (or the runtime's shutdown).
async fn on_plain_thread<T: Send + 'static>(work: impl FnOnce() -> T + Send + 'static) -> T {
    let (done, result) = tokio::sync::oneshot::channel();
    std::thread::spawn(move || {
        let _ = done.send(work());
    });
    tokio::time::timeout(WAIT, result)
        .await
        .expect("the blocking call returns within 10 s")
        .expect("the blocking call did not panic")
}

/// Awaits `future` for at most [`WAIT`].
async fn bounded<T>(what: &str, future: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(WAIT, future)
        .await
        .unwrap_or_else(|_| panic!("{what}: not within 10 s"))
}

/// One worker runs a 300 ms task (id 1); tasks 2..=6 park behind it.
async fn busy_pool(name: &str) -> (LabPool, Vec<prometheus_parking_lot::MailboxKey>) {
    let mut lab = LabPool::new(settings(name, 1, 4));
    let mut keys = Vec::new();
    keys.push(
        lab.pool
            .submit_async(
                Job::Sleep(Duration::from_millis(300)),
                gpu(1, Priority::Normal, 1),
            )
            .await
            .unwrap(),
    );
    assert_eq!(lab.next_start().await, 1);
    for id in 2..=6 {
        keys.push(
            lab.pool
                .submit_async(Job::Quick, gpu(id, Priority::Normal, 1))
                .await
                .unwrap(),
        );
    }
    eventually("five parked", || lab.pool.stats().queued_tasks == 5).await;
    (lab, keys)
}

const BUSY_REPORT: ShutdownReport = ShutdownReport {
    cancelled_parked: 5,
    kept_parked: 0,
    finished_running: 1,
    abandoned_running: 0,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_shutdowns_wait_for_the_same_drain_and_get_the_same_report() {
    let (lab, keys) = busy_pool("twice").await;
    let pool = Arc::new(lab.pool);
    let first = tokio::spawn({
        let pool = pool.clone();
        async move { pool.shutdown_with_drain(Duration::from_secs(2)).await }
    });
    tokio::time::sleep(Duration::from_millis(20)).await;
    let second = tokio::spawn({
        let pool = pool.clone();
        async move { pool.shutdown_with_drain(Duration::from_secs(2)).await }
    });
    let first = bounded("first shutdown", first).await.unwrap();
    let second = bounded("second shutdown", second).await.unwrap();
    assert_eq!(first, Ok(BUSY_REPORT));
    assert_eq!(second, first, "every caller gets the same report");
    let later = bounded(
        "a later shutdown",
        pool.shutdown_with_drain(Duration::from_secs(2)),
    )
    .await;
    assert_eq!(later, first, "a shutdown after the drain reports it again");

    assert_eq!(
        pool.retrieve_async(&keys[0], WAIT).await,
        Ok(1),
        "the running task finished and its result is stored"
    );
    for (key, id) in keys[1..].iter().zip(2..) {
        assert_eq!(
            pool.retrieve_async(key, WAIT).await,
            Err(PoolError::Cancelled),
            "parked task {id}"
        );
    }
    let stats = pool.stats();
    assert_eq!((stats.active_tasks, stats.queued_tasks), (0, 0));
    assert_eq!(stats.used_units, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_shutdown_raced_by_dropping_the_pool_drains_once() {
    let (lab, keys) = busy_pool("client-drop").await;
    let client = lab.pool.client().clone();
    let first = tokio::spawn({
        let client = client.clone();
        async move { client.shutdown(Duration::from_secs(2)).await }
    });
    tokio::time::sleep(Duration::from_millis(20)).await;
    // Dropping the pool starts its own background shutdown while the first one drains.
    drop(lab.pool);
    let second = tokio::spawn({
        let client = client.clone();
        async move { client.shutdown(Duration::from_secs(2)).await }
    });
    let first = bounded("client shutdown", first).await.unwrap();
    let second = bounded("second client shutdown", second).await.unwrap();
    assert_eq!(first, Ok(BUSY_REPORT));
    assert_eq!(second, first);

    assert_eq!(client.retrieve(&keys[0], WAIT).await, Ok(1));
    for key in &keys[1..] {
        assert_eq!(client.retrieve(key, WAIT).await, Err(PoolError::Cancelled));
    }
    assert_eq!(client.stats().active_tasks, 0);
    eventually("worker threads gone", || {
        client.stats().live_worker_threads == 0
    })
    .await;
}

/// How the submits of the race ended.
#[derive(Default)]
struct RaceTally {
    accepted: Vec<prometheus_parking_lot::MailboxKey>,
    refused: usize,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_submit_accepted_while_shutdown_races_gets_exactly_one_outcome() {
    const SUBMITTERS: u64 = 8;
    const SUBMITS: u64 = 400;
    let config = settings("race", 2, 64)
        .with_max_queue_depth(10_000)
        .with_max_messages(100_000);
    let pool = Arc::new(LabPool::new(config).pool);
    let accepted_so_far = Arc::new(AtomicUsize::new(0));
    let mut submitters = tokio::task::JoinSet::new();
    for submitter in 0..SUBMITTERS {
        let pool = pool.clone();
        let accepted_so_far = accepted_so_far.clone();
        submitters.spawn(async move {
            let mut tally = RaceTally::default();
            for n in 0..SUBMITS {
                let id = submitter * SUBMITS + n;
                let job = if n % 2 == 0 {
                    Job::Quick
                } else {
                    Job::Sleep(Duration::from_millis(2))
                };
                match pool.submit_async(job, gpu(id, Priority::Normal, 1)).await {
                    Ok(key) => {
                        tally.accepted.push(key);
                        accepted_so_far.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(PoolError::Shutdown) => tally.refused += 1,
                    Err(other) => panic!("task {id}: unexpected refusal {other:?}"),
                }
                // Paced, so the shutdown lands in the middle of the stream.
                if n % 4 == 3 {
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
            }
            tally
        });
    }
    // Shut down mid-stream, the moment a good share of the submits got in.
    let shutdown = async {
        while accepted_so_far.load(Ordering::Relaxed) < 600 {
            tokio::task::yield_now().await;
        }
        pool.shutdown_with_drain(Duration::from_secs(2)).await
    };
    let report = bounded("shutdown", shutdown).await.unwrap();

    let mut accepted = Vec::new();
    let mut refused = 0;
    while let Some(tally) = bounded("submitters", submitters.join_next()).await {
        let tally = tally.unwrap();
        accepted.extend(tally.accepted);
        refused += tally.refused;
    }
    assert_eq!(accepted.len() + refused, (SUBMITTERS * SUBMITS) as usize);
    assert!(accepted.len() >= 600);
    assert!(refused > 0, "the shutdown landed before the last submit");

    let (mut completed, mut cancelled) = (0, 0);
    for key in &accepted {
        match pool.retrieve_async(key, Duration::from_secs(5)).await {
            Ok(_) => completed += 1,
            Err(PoolError::Cancelled) => cancelled += 1,
            other => panic!("an accepted task has no terminal outcome: {other:?}"),
        }
        assert_eq!(
            pool.client().try_retrieve(key).await,
            Err(PoolError::ResultNotFound),
            "exactly one outcome per task"
        );
    }
    assert_eq!(completed + cancelled, accepted.len());
    assert_eq!(
        cancelled,
        report.cancelled_parked + report.abandoned_running,
        "the report counts the cancelled tasks"
    );
    let stats = pool.stats();
    assert_eq!(stats.submitted_tasks as usize, accepted.len());
    assert_eq!(stats.completed_tasks as usize, completed);
    assert_eq!(stats.cancelled_tasks as usize, cancelled);
    assert_eq!((stats.active_tasks, stats.used_units), (0, 0));
    eprintln!(
        "race: {} accepted ({completed} completed, {cancelled} cancelled), {refused} refused",
        accepted.len()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_steady_stream_of_submits_does_not_hold_off_a_shutdown() {
    let config = settings("stream-stop", 2, 64)
        .with_max_queue_depth(1_000_000)
        .with_max_messages(1_000_000);
    let pool = Arc::new(LabPool::new(config).pool);
    let stop_at = Instant::now() + Duration::from_secs(4);
    let mut clients = tokio::task::JoinSet::new();
    for client in 0..8u64 {
        let pool = pool.clone();
        clients.spawn(async move {
            // A client loop: submit, and collect every other result, until the pool refuses
            // (or 4 s pass).
            for n in 0.. {
                if Instant::now() >= stop_at {
                    return None;
                }
                let meta = gpu(client * 1_000_000 + n, Priority::Normal, 1);
                let job = if n % 2 == 0 {
                    Job::Quick
                } else {
                    Job::Sleep(Duration::from_millis(2))
                };
                match pool.submit_async(job, meta).await {
                    Ok(_) => tokio::task::yield_now().await,
                    Err(PoolError::Shutdown) => return Some(Instant::now()),
                    Err(other) => panic!("unexpected refusal {other:?}"),
                }
            }
            None
        });
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let asked = Instant::now();
    let report = bounded("shutdown", pool.shutdown_with_drain(Duration::from_secs(1))).await;
    let took = asked.elapsed();
    assert!(report.is_ok(), "{report:?}");
    while let Some(refused_at) = bounded("clients", clients.join_next()).await {
        let refused_at = refused_at.unwrap();
        assert!(
            refused_at.is_some(),
            "a client was never refused: the shutdown came after the stream ended"
        );
    }
    assert!(
        took < Duration::from_secs(3),
        "shutdown(1 s) took {took:?} while clients kept submitting"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn duration_max_waits_for_ever_in_retrieve_and_shutdown() {
    let pool = Arc::new(LabPool::new(settings("forever", 1, 4)).pool);

    let key = pool
        .submit_async(
            Job::Sleep(Duration::from_millis(100)),
            gpu(1, Priority::Normal, 1),
        )
        .await
        .unwrap();
    assert_eq!(
        bounded(
            "retrieve_async(MAX)",
            pool.retrieve_async(&key, Duration::MAX)
        )
        .await,
        Ok(1)
    );

    let key = pool
        .submit_async(
            Job::Sleep(Duration::from_millis(100)),
            gpu(2, Priority::Normal, 1),
        )
        .await
        .unwrap();
    let blocking = pool.clone();
    assert_eq!(
        on_plain_thread(move || blocking.retrieve(&key, Duration::MAX)).await,
        Ok(2)
    );

    let running = pool
        .submit_async(
            Job::Sleep(Duration::from_millis(200)),
            gpu(3, Priority::Normal, 1),
        )
        .await
        .unwrap();
    let began = Instant::now();
    let report = bounded("shutdown(MAX)", pool.shutdown_with_drain(Duration::MAX))
        .await
        .unwrap();
    assert_eq!(report.finished_running, 1);
    assert_eq!(report.abandoned_running, 0);
    assert!(began.elapsed() >= Duration::from_millis(100), "it waited");

    // After shutdown, a blocking retrieve still finds the stored result.
    let blocking = pool.clone();
    assert_eq!(
        on_plain_thread(move || blocking.retrieve(&running, Duration::from_secs(1))).await,
        Ok(3)
    );
    let blocking = pool.clone();
    let never = prometheus_parking_lot::MailboxKey::new("nobody");
    assert_eq!(
        on_plain_thread(move || blocking.retrieve(&never, Duration::from_millis(50))).await,
        Err(PoolError::Timeout),
        "a blocking retrieve after shutdown still honours its timeout"
    );
}

/// When a worker thread ran a task and when it exited, by thread.
#[derive(Default)]
struct ThreadLog {
    finished: Mutex<Vec<(String, Instant)>>,
    exited: Mutex<Vec<(String, Instant)>>,
}

/// Records its thread's exit when dropped (thread-local destructor).
struct ExitWitness(Arc<ThreadLog>);

impl Drop for ExitWitness {
    fn drop(&mut self) {
        let thread = std::thread::current().name().unwrap_or_default().to_owned();
        if let Ok(mut exited) = self.0.exited.lock() {
            exited.push((thread, Instant::now()));
        }
    }
}

thread_local! {
    static EXIT_WITNESS: std::cell::RefCell<Option<ExitWitness>> = const { std::cell::RefCell::new(None) };
}

/// Sleeps for the payload's milliseconds, logging the task's end and its thread's exit.
#[derive(Clone)]
struct Witnessed(Arc<ThreadLog>);

#[async_trait::async_trait]
impl WorkerExecutor<u64, u64> for Witnessed {
    async fn execute(&self, ms: u64, _meta: TaskMetadata) -> u64 {
        EXIT_WITNESS.with(|witness| {
            witness
                .borrow_mut()
                .get_or_insert_with(|| ExitWitness(self.0.clone()));
        });
        tokio::time::sleep(Duration::from_millis(ms)).await;
        let thread = std::thread::current().name().unwrap_or_default().to_owned();
        self.0
            .finished
            .lock()
            .unwrap()
            .push((thread, Instant::now()));
        ms
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_dropped_with_drain_on_drop_max_finishes_its_task_then_its_threads_exit() {
    let log = Arc::new(ThreadLog::default());
    let mut config = settings("drop-forever", 1, 4);
    config.drain_on_drop = Duration::MAX;
    let pool = WorkerPool::new(config, Witnessed(log.clone())).unwrap();
    let client = pool.client().clone();
    let key = pool
        .submit_async(200, TaskMetadata::new(1, ResourceCost::cpu(1)))
        .await
        .unwrap();
    eventually("the task runs", || pool.stats().active_tasks == 1).await;
    drop(pool);

    eventually("the worker thread exited", || {
        !log.exited.lock().unwrap().is_empty()
    })
    .await;
    assert_eq!(
        client.retrieve(&key, WAIT).await,
        Ok(200),
        "drained for ever: the task finished, not abandoned"
    );
    let finished = log.finished.lock().unwrap().clone();
    let exited = log.exited.lock().unwrap().clone();
    assert_eq!(finished.len(), 1);
    assert_eq!(exited.len(), 1);
    assert!(
        exited[0].0.starts_with("parking-lot-worker-drop-forever-"),
        "{exited:?}"
    );
    assert!(exited[0].1 >= finished[0].1, "the thread outlived its task");
    eventually("no live worker threads", || {
        client.stats().live_worker_threads == 0
    })
    .await;
}

#[test]
fn settings_no_thread_can_have_are_refused_with_invalid_config() {
    let nul_name = WorkerPool::new(
        WorkerPoolConfig::new()
            .with_worker_count(1)
            .with_name("a\0b"),
        Witnessed(Arc::default()),
    );
    assert!(
        matches!(nul_name, Err(PoolError::InvalidConfig(_))),
        "{:?}",
        nul_name.err()
    );
    let huge_stack = WorkerPool::new(
        WorkerPoolConfig::new()
            .with_worker_count(1)
            .with_thread_stack_size(1 << 40),
        Witnessed(Arc::default()),
    );
    assert!(
        matches!(huge_stack, Err(PoolError::InvalidConfig(_))),
        "{:?}",
        huge_stack.err()
    );
}
