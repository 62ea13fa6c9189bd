//! An inference server's request whose caller stopped waiting: nobody waits, nothing runs.
//!
//! The server's pool code (candle-vllm's, as `compat_inference_server.rs` compiles it) builds a
//! `WorkerPool` with the in-memory mailbox, submits a request without a mailbox key and waits
//! for its result, a receiver of tokens, with `retrieve_async(&key, timeout)`. When that wait
//! times out the client is gone. The pool abandons the request then (`OnGiveUp::Abandon`, the
//! default with an in-memory mailbox): parked, it never starts and its units are never
//! taken; running, its result is dropped, so the generator feeding the receiver stops at its
//! next send. The generator here takes one step per permit the test hands out, so the steps
//! after the timeout are counted exactly, with no clock involved.

// The server writes `meta.into()`; the test keeps its code.
#![allow(clippy::useless_conversion)]

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use prometheus_parking_lot::config::WorkerPoolConfig;
use prometheus_parking_lot::core::{
    OnGiveUp, PoolError, TaskMetadata, TaskStatus, TaskStep, WorkerExecutor, WorkerPool,
};
use prometheus_parking_lot::util::serde::{MailboxKey, ResourceCost, TaskId};
use serde::{Deserialize, Serialize};
use tokio::sync::{mpsc, Semaphore};

/// How many tokens a request asks for: as many forward passes as the reproduction saw.
const MAX_TOKENS: usize = 19;

#[derive(Debug, Clone, Serialize, Deserialize)]
enum Job {
    /// Holds its units until the test lets it go (another request, mid-generation).
    Hold,
    /// Returns a receiver at once, fed by a generator it spawns on the worker's runtime.
    Stream,
    /// Spawns the generator, then waits for the test before returning the receiver (a long
    /// prefill): the request is running when its caller gives up.
    SlowStream,
}

/// A streamed completion: a receiver of tokens, as the server's result type holds one.
struct Completion {
    tokens: mpsc::Receiver<String>,
}

/// What the test sees of the executor.
#[derive(Clone)]
struct Probe {
    /// The requests the executor was called for.
    started: Arc<Mutex<Vec<TaskId>>>,
    /// Forward passes: one per token the generator tried to send.
    steps: Arc<AtomicUsize>,
    /// Generators that stopped (their send failed, or they reached `MAX_TOKENS`).
    generators_done: Arc<AtomicUsize>,
    /// One permit per forward pass.
    step_permits: Arc<Semaphore>,
    /// Lets `Hold` and `SlowStream` go on.
    release: Arc<Semaphore>,
}

impl Default for Probe {
    fn default() -> Self {
        Self {
            started: Arc::default(),
            steps: Arc::default(),
            generators_done: Arc::default(),
            step_permits: Arc::new(Semaphore::new(0)),
            release: Arc::new(Semaphore::new(0)),
        }
    }
}

#[derive(Clone)]
struct Llm(Probe);

impl Llm {
    fn spawn_generator(&self) -> mpsc::Receiver<String> {
        let probe = self.0.clone();
        // Room for every token: only a dropped receiver makes a send fail.
        let (sender, tokens) = mpsc::channel(MAX_TOKENS);
        tokio::spawn(async move {
            for n in 0..MAX_TOKENS {
                let Ok(permit) = probe.step_permits.acquire().await else {
                    break;
                };
                permit.forget();
                probe.steps.fetch_add(1, Ordering::SeqCst);
                if sender.send(format!("t{n}")).await.is_err() {
                    break; // the client is gone
                }
            }
            probe.generators_done.fetch_add(1, Ordering::SeqCst);
        });
        tokens
    }
}

#[async_trait::async_trait]
impl WorkerExecutor<Job, Completion> for Llm {
    async fn execute(&self, job: Job, meta: TaskMetadata) -> Completion {
        self.0.started.lock().unwrap().push(meta.id);
        match job {
            Job::Hold => {
                self.0.release.acquire().await.unwrap().forget();
                let (_, tokens) = mpsc::channel(1);
                Completion { tokens }
            }
            Job::Stream => Completion {
                tokens: self.spawn_generator(),
            },
            Job::SlowStream => {
                let tokens = self.spawn_generator();
                self.0.release.acquire().await.unwrap().forget();
                Completion { tokens }
            }
        }
    }
}

/// The pool as the server builds it (a smaller card: 1,024 units).
fn config() -> WorkerPoolConfig {
    WorkerPoolConfig::new()
        .with_worker_count(2)
        .with_max_units(1_024)
        .with_max_queue_depth(1_000)
        .with_timeout_ms(120_000)
}

fn request(id: TaskId, units: u32) -> TaskMetadata {
    TaskMetadata::new(id, ResourceCost::gpu_vram(units))
}

async fn eventually(what: &str, check: impl Fn() -> bool) {
    for _ in 0..1_000 {
        if check() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("not within 10 s: {what}");
}

/// Hands out every forward pass a generator could still take, and waits until every
/// generator that exists has stopped.
async fn let_generators_run(probe: &Probe, generators: usize) {
    probe.step_permits.add_permits(MAX_TOKENS * 4);
    eventually("the generators stop", || {
        probe.generators_done.load(Ordering::SeqCst) >= generators
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_whose_wait_timed_out_while_parked_never_starts() {
    let probe = Probe::default();
    let pool = WorkerPool::new(config(), Llm(probe.clone())).unwrap();
    let mut events = pool.events();

    // Another request holds the whole card; ours parks behind it.
    let holder = pool
        .submit_async(Job::Hold, request(1, 1_024).into())
        .await
        .unwrap();
    eventually("the holder runs", || pool.stats().active_tasks == 1).await;
    let key: MailboxKey = pool
        .submit_async(Job::Stream, request(2, 512).into())
        .await
        .unwrap();
    eventually("it parks", || pool.stats().queued_tasks == 1).await;

    // The server's wait times out: its client is gone.
    let waited = pool.retrieve_async(&key, Duration::from_millis(30)).await;
    assert!(
        matches!(waited, Err(PoolError::Timeout)),
        "{:?}",
        waited.err()
    );
    let steps_at_timeout = probe.steps.load(Ordering::SeqCst);

    // Capacity frees; a request admitted after ours runs and ends, so ours had its chance.
    probe.release.add_permits(1);
    assert!(pool
        .retrieve_async(&holder, Duration::from_secs(10))
        .await
        .is_ok());
    let later = pool
        .submit_async(Job::Stream, request(3, 512).into())
        .await
        .unwrap();
    let later = pool
        .retrieve_async(&later, Duration::from_secs(10))
        .await
        .unwrap();
    drop(later);
    let generators = probe.started.lock().unwrap().len() - 1; // all but the holder
    let_generators_run(&probe, generators).await;

    // The later request's generator takes one step: its receiver was dropped above.
    let steps_of_ours = probe.steps.load(Ordering::SeqCst) - steps_at_timeout - 1;
    assert!(
        steps_of_ours <= 1,
        "{steps_of_ours} forward passes for a request nobody waits for"
    );
    let started = probe.started.lock().unwrap().clone();
    assert_eq!(started, vec![1, 3], "the abandoned request never ran");
    // The later request's result is delivered before its units are handed back.
    eventually("every unit comes back", || {
        let stats = pool.stats();
        (stats.used_units, stats.active_tasks, stats.queued_tasks) == (0, 0, 0)
    })
    .await;
    assert_eq!(pool.stats().cancelled_tasks, 1, "it ended, cancelled");

    // Its steps: admitted and parked, then ended, never started.
    let mut steps_of_2 = Vec::new();
    while let Ok(event) = events.try_recv() {
        if event.task_id == 2 {
            steps_of_2.push(event.step);
        }
    }
    assert_eq!(
        steps_of_2,
        [
            TaskStep::Admitted,
            TaskStep::Parked,
            TaskStep::Ended(TaskStatus::Cancelled)
        ]
    );

    // Nothing waits under its key, and the pool says so at once.
    let again = pool.retrieve_async(&key, Duration::from_secs(60)).await;
    assert!(
        matches!(again, Err(PoolError::NothingToRetrieve { task: None })),
        "{:?}",
        again.err()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_running_request_whose_wait_timed_out_stops_within_one_step() {
    let probe = Probe::default();
    let pool = WorkerPool::new(config(), Llm(probe.clone())).unwrap();
    let key = pool
        .submit_async(Job::SlowStream, request(1, 512).into())
        .await
        .unwrap();
    eventually("it runs", || pool.stats().active_tasks == 1).await;

    let waited = pool.retrieve_async(&key, Duration::from_millis(30)).await;
    assert!(
        matches!(waited, Err(PoolError::Timeout)),
        "{:?}",
        waited.err()
    );
    let steps_at_timeout = probe.steps.load(Ordering::SeqCst);
    // Abandoned: its future is dropped (with the receiver it held) and its units freed,
    // without the prefill ever finishing.
    eventually("its units come back", || pool.stats().used_units == 0).await;

    let_generators_run(&probe, 1).await;
    let steps = probe.steps.load(Ordering::SeqCst) - steps_at_timeout;
    assert!(steps <= 1, "{steps} forward passes after the timeout");
    assert_eq!(pool.stats().cancelled_tasks, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_that_keeps_results_runs_the_request_for_a_later_retrieve() {
    let probe = Probe::default();
    let keep = config().with_on_give_up(Some(OnGiveUp::Keep));
    let pool = WorkerPool::new(keep, Llm(probe.clone())).unwrap();
    let holder = pool
        .submit_async(Job::Hold, request(1, 1_024).into())
        .await
        .unwrap();
    eventually("the holder runs", || pool.stats().active_tasks == 1).await;
    let key = pool
        .submit_async(Job::Stream, request(2, 512).into())
        .await
        .unwrap();
    let waited = pool.retrieve_async(&key, Duration::from_millis(30)).await;
    assert!(
        matches!(waited, Err(PoolError::Timeout)),
        "{:?}",
        waited.err()
    );

    probe.release.add_permits(1);
    assert!(pool
        .retrieve_async(&holder, Duration::from_secs(10))
        .await
        .is_ok());
    // The client comes back: the request ran, and every token is there.
    let mut completion = pool
        .retrieve_async(&key, Duration::from_secs(10))
        .await
        .unwrap();
    probe.step_permits.add_permits(MAX_TOKENS);
    let mut tokens = 0;
    while completion.tokens.recv().await.is_some() {
        tokens += 1;
    }
    assert_eq!(tokens, MAX_TOKENS);
    assert_eq!(*probe.started.lock().unwrap(), vec![1, 2]);
    assert_eq!(pool.stats().cancelled_tasks, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_the_caller_named_is_kept_even_where_the_pool_abandons() {
    let probe = Probe::default();
    let pool = WorkerPool::new(config(), Llm(probe.clone())).unwrap();
    let holder = pool
        .submit_async(Job::Hold, request(1, 1_024).into())
        .await
        .unwrap();
    eventually("the holder runs", || pool.stats().active_tasks == 1).await;
    let named = MailboxKey::new("acme").with_user("ada");
    let key = pool
        .submit_async(Job::Stream, request(2, 512).with_mailbox(named.clone()))
        .await
        .unwrap();
    assert_eq!(key, named);
    let waited = pool.retrieve_async(&key, Duration::from_millis(30)).await;
    assert!(
        matches!(waited, Err(PoolError::Timeout)),
        "{:?}",
        waited.err()
    );

    probe.release.add_permits(1);
    assert!(pool
        .retrieve_async(&holder, Duration::from_secs(10))
        .await
        .is_ok());
    assert!(pool
        .retrieve_async(&key, Duration::from_secs(10))
        .await
        .is_ok());
    assert_eq!(*probe.started.lock().unwrap(), vec![1, 2]);
}
