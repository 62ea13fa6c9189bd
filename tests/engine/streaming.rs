//! Streamed results, cooperative cancellation and nested work, through `WorkerPool` and the
//! actor protocol.
//!
//! The executor is a fake LLM: it emits `tokens` tokens, one every `pause`, either from
//! async code (awaiting between tokens) or from blocking code (sleeping its thread and
//! checking the cancellation flag between tokens, as a sync token loop would). It records
//! what it did in a shared log, so the tests can assert the order of starts, tokens and ends.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use futures_util::StreamExt;
use prometheus_parking_lot::actors::ractor::rpc::CallResult;
use prometheus_parking_lot::actors::SchedulerRequest;
use prometheus_parking_lot::config::WorkerPoolConfig;
use prometheus_parking_lot::core::SubmitOptions;
use prometheus_parking_lot::core::{PoolError, TaskMetadata, WorkerExecutor, WorkerPool};
use prometheus_parking_lot::stream::ResultStream;
use prometheus_parking_lot::util::serde::{MailboxKey, ResourceCost};
use prometheus_parking_lot::{running, ScheduledTask};

/// How long a test waits for something that should happen promptly before it fails.
const PATIENCE: Duration = Duration::from_secs(10);
/// The pool's capacity, in VRAM units.
const UNITS: u32 = 10;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Style {
    /// Awaits between tokens.
    Async,
    /// Blocks its thread between tokens and checks the cancellation flag.
    Blocking,
    /// Panics after this many tokens.
    PanicAfter(u32),
}

#[derive(Debug, Clone)]
struct Generate {
    id: u64,
    tokens: u32,
    pause: Duration,
    style: Style,
}

/// Runs `Generate` jobs, recording `start:id`, `token:id:n`, `saw-cancel:id` and `end:id`.
#[derive(Clone, Default)]
struct FakeLlm {
    log: Arc<Mutex<Vec<String>>>,
    /// Tokens produced after the task's cancellation flag was up.
    after_cancel: Arc<AtomicU32>,
}

impl FakeLlm {
    fn note(&self, line: String) {
        self.log.lock().unwrap().push(line);
    }

    fn position(&self, line: &str) -> Option<usize> {
        self.log
            .lock()
            .unwrap()
            .iter()
            .position(|seen| seen == line)
    }

    fn saw(&self, line: &str) -> bool {
        self.position(line).is_some()
    }
}

#[async_trait]
impl WorkerExecutor<Generate, String> for FakeLlm {
    async fn execute(&self, job: Generate, _meta: TaskMetadata) -> String {
        self.note(format!("start:{}", job.id));
        let partials = running::partials::<String>();
        let mut text = String::new();
        for n in 0..job.tokens {
            if job.style == Style::PanicAfter(n) {
                panic!("model crashed at token {n}");
            }
            match job.style {
                Style::Blocking => {
                    if running::is_cancelled() {
                        self.note(format!("saw-cancel:{}", job.id));
                        break;
                    }
                    std::thread::sleep(job.pause);
                }
                _ => tokio::time::sleep(job.pause).await,
            }
            if running::is_cancelled() {
                self.after_cancel.fetch_add(1, Ordering::SeqCst);
            }
            let token = format!("t{n}");
            self.note(format!("token:{}:{n}", job.id));
            if let Some(partials) = &partials {
                let sent = match job.style {
                    Style::Blocking => partials.send_blocking(token.clone()),
                    _ => partials.send(token.clone()).await,
                };
                if sent.is_err() {
                    self.note(format!("closed:{}", job.id));
                    break;
                }
            }
            text.push_str(&token);
        }
        self.note(format!("end:{}", job.id));
        text
    }
}

fn pool(workers: usize, llm: &FakeLlm) -> WorkerPool<Generate, String, FakeLlm> {
    let config = WorkerPoolConfig::new()
        .with_name("streaming")
        .with_worker_count(workers)
        .with_max_units(UNITS);
    WorkerPool::new(config, llm.clone()).expect("pool starts")
}

fn job(id: u64, tokens: u32, pause_ms: u64, style: Style) -> Generate {
    Generate {
        id,
        tokens,
        pause: Duration::from_millis(pause_ms),
        style,
    }
}

fn meta(id: u64, units: u32) -> TaskMetadata {
    TaskMetadata::new(id, ResourceCost::gpu_vram(units))
}

/// Polls `condition` every millisecond until it holds; fails after `PATIENCE`. Returns how
/// long it took.
async fn eventually(what: &str, condition: impl Fn() -> bool) -> Duration {
    let start = Instant::now();
    while !condition() {
        assert!(start.elapsed() < PATIENCE, "timed out waiting until {what}");
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    start.elapsed()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_yields_every_partial_then_the_final_value_then_ends() {
    let llm = FakeLlm::default();
    let pool = pool(2, &llm);
    let stream = pool
        .submit_streaming(job(1, 4, 1, Style::Async), meta(1, 4), 8)
        .await
        .expect("admitted");
    let items: Vec<_> = stream.collect().await;
    assert_eq!(
        items,
        vec![
            Ok("t0".to_owned()),
            Ok("t1".to_owned()),
            Ok("t2".to_owned()),
            Ok("t3".to_owned()),
            Ok("t0t1t2t3".to_owned()),
        ]
    );
    // The stream's last item goes out before the task's units are handed back.
    eventually("the task ends and its units come back", || {
        let stats = pool.stats();
        (stats.completed_tasks, stats.used_units) == (1, 0)
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_stream_holds_its_capacity_until_the_executor_returns() {
    let llm = FakeLlm::default();
    let pool = pool(2, &llm);
    let mut stream = pool
        .submit_streaming(job(1, 5, 20, Style::Async), meta(1, UNITS), 8)
        .await
        .expect("admitted");
    // The first token is out: the stream is generating, with all the units.
    assert_eq!(stream.next().await, Some(Ok("t0".to_owned())));
    let waiting = pool
        .submit_async(job(2, 1, 1, Style::Async), meta(2, UNITS))
        .await
        .expect("admitted");
    // The counters are published after the scheduler's batch, not with its answer.
    eventually("the second task parks behind the stream's units", || {
        let stats = pool.stats();
        (stats.queued_tasks, stats.used_units as usize) == (1, UNITS as usize)
    })
    .await;
    let mut rest = Vec::new();
    while let Some(item) = stream.next().await {
        rest.push(item.expect("no error"));
    }
    assert_eq!(rest.last().map(String::as_str), Some("t0t1t2t3t4"));
    let result = pool
        .retrieve_async(&waiting, PATIENCE)
        .await
        .expect("the second task runs once the stream is over");
    assert_eq!(result, "t0");
    let (stream_end, second_start) = (llm.position("end:1"), llm.position("start:2"));
    assert!(
        stream_end < second_start,
        "the second task started only after the stream's executor returned: {:?}",
        llm.log.lock().unwrap()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_an_async_stream_cancels_the_task_and_frees_its_capacity_at_once() {
    let llm = FakeLlm::default();
    let pool = pool(2, &llm);
    let mut stream = pool
        .submit_streaming(job(1, 1_000, 10, Style::Async), meta(1, UNITS), 4)
        .await
        .expect("admitted");
    assert_eq!(stream.next().await, Some(Ok("t0".to_owned())));
    assert_eq!(stream.next().await, Some(Ok("t1".to_owned())));
    eventually("the stream holds its units", || {
        pool.stats().used_units as usize == UNITS as usize
    })
    .await;
    drop(stream);
    // The generation had ~10 s left; its future is dropped at once.
    let freed = eventually("the units come back", || pool.stats().used_units == 0).await;
    assert!(freed < Duration::from_secs(2), "freed after {freed:?}");
    assert!(
        !llm.saw("end:1"),
        "the executor's future was dropped mid-generation"
    );
    // The whole pool is usable again at once.
    let key = pool
        .submit_async(job(2, 1, 1, Style::Async), meta(2, UNITS))
        .await
        .expect("admitted");
    assert_eq!(
        pool.retrieve_async(&key, PATIENCE).await,
        Ok("t0".to_owned())
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_blocking_executor_stops_within_one_token_when_its_stream_is_dropped() {
    let llm = FakeLlm::default();
    let pool = pool(2, &llm);
    let mut stream = pool
        .submit_streaming(job(1, 1_000, 20, Style::Blocking), meta(1, UNITS), 4)
        .await
        .expect("admitted");
    assert_eq!(stream.next().await, Some(Ok("t0".to_owned())));
    let dropped = Instant::now();
    drop(stream);
    eventually("the units come back", || pool.stats().used_units == 0).await;
    let freed = dropped.elapsed();
    // One token takes 20 ms; the remaining generation ~20 s.
    assert!(
        freed < Duration::from_millis(500),
        "freed {freed:?} after the drop"
    );
    assert!(
        llm.saw("saw-cancel:1") || llm.saw("closed:1"),
        "the executor noticed: {:?}",
        llm.log.lock().unwrap()
    );
    assert!(
        llm.after_cancel.load(Ordering::SeqCst) <= 1,
        "at most the token in progress is finished after the cancel"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_raises_the_flag_a_blocking_executor_reads_between_tokens() {
    let llm = FakeLlm::default();
    let pool = pool(2, &llm);
    let key = MailboxKey::new("tenant-a");
    let meta = meta(7, UNITS).with_mailbox(key.clone());
    pool.submit_async(job(7, 1_000, 20, Style::Blocking), meta)
        .await
        .expect("admitted");
    eventually("the task runs", || llm.saw("token:7:0")).await;
    let asked = Instant::now();
    pool.cancel(&key, 7).await.expect("a live task");
    eventually("the units come back", || pool.stats().used_units == 0).await;
    assert!(
        asked.elapsed() < Duration::from_millis(500),
        "{:?}",
        asked.elapsed()
    );
    assert!(llm.saw("saw-cancel:7"));
    assert_eq!(
        pool.retrieve_async(&key, PATIENCE).await,
        Err(PoolError::Cancelled)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_execution_timeout_raises_the_flag_of_a_blocking_executor() {
    let llm = FakeLlm::default();
    let pool = pool(2, &llm);
    let options = SubmitOptions {
        timeout: Some(Duration::from_millis(50)),
        ..SubmitOptions::default()
    };
    let key = pool
        .submit_with(job(3, 1_000, 10, Style::Blocking), meta(3, UNITS), options)
        .await
        .expect("admitted");
    assert_eq!(
        pool.retrieve_async(&key, PATIENCE).await,
        Err(PoolError::TimedOut)
    );
    eventually("the executor stops", || llm.saw("saw-cancel:3")).await;
    eventually("the units come back", || pool.stats().used_units == 0).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_shutdown_deadline_raises_the_flag_of_a_blocking_executor() {
    let llm = FakeLlm::default();
    let pool = pool(2, &llm);
    pool.submit_async(job(4, 1_000, 10, Style::Blocking), meta(4, UNITS))
        .await
        .expect("admitted");
    eventually("the task runs", || llm.saw("token:4:0")).await;
    let report = pool
        .shutdown_with_drain(Duration::from_millis(50))
        .await
        .expect("shuts down");
    assert_eq!(report.abandoned_running, 1);
    eventually("the executor stops", || llm.saw("saw-cancel:4")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panic_mid_stream_ends_the_stream_with_the_error() {
    let llm = FakeLlm::default();
    let pool = pool(2, &llm);
    let stream = pool
        .submit_streaming(job(5, 10, 1, Style::PanicAfter(2)), meta(5, 4), 8)
        .await
        .expect("admitted");
    let items: Vec<_> = stream.collect().await;
    assert_eq!(items.len(), 3, "two tokens, then the error: {items:?}");
    assert_eq!(items[0], Ok("t0".to_owned()));
    assert_eq!(items[1], Ok("t1".to_owned()));
    match &items[2] {
        Err(PoolError::Failed(reason)) => {
            assert!(reason.contains("model crashed at token 2"), "{reason}")
        }
        other => panic!("expected the panic's failure, got {other:?}"),
    }
    eventually("the units come back", || pool.stats().used_units == 0).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_reader_blocks_only_its_own_task() {
    let llm = FakeLlm::default();
    let pool = pool(2, &llm);
    // A buffer of one partial, and a reader that does not read yet.
    let mut slow = pool
        .submit_streaming(job(1, 20, 0, Style::Async), meta(1, 1), 1)
        .await
        .expect("admitted");
    eventually("the stream fills its buffer", || llm.saw("token:1:1")).await;
    // The other worker keeps running other work meanwhile.
    for id in 10..20 {
        let key = pool
            .submit_async(job(id, 2, 0, Style::Async), meta(id, 1))
            .await
            .expect("admitted");
        assert_eq!(
            pool.retrieve_async(&key, PATIENCE).await,
            Ok("t0t1".to_owned())
        );
    }
    assert!(
        !llm.saw("end:1"),
        "the stream's executor waits for its reader"
    );
    let mut tokens = Vec::new();
    while let Some(item) = slow.next().await {
        tokens.push(item.expect("no error"));
    }
    assert_eq!(tokens.len(), 21, "20 tokens and the final value, none lost");
    assert_eq!(tokens[19], "t19");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_nobody_reads_past_the_idle_bound_is_cancelled_and_frees_its_units() {
    for style in [Style::Async, Style::Blocking] {
        let llm = FakeLlm::default();
        let config = WorkerPoolConfig::new()
            .with_name("unread")
            .with_worker_count(1)
            .with_max_units(UNITS)
            .with_stream_idle(Duration::from_millis(50));
        let pool = WorkerPool::new(config, llm.clone()).expect("pool starts");
        // A buffer of one partial, and a reader that stays but never reads.
        let mut unread = pool
            .submit_streaming(job(1, 20, 0, style), meta(1, 4), 1)
            .await
            .expect("admitted");
        eventually("the task ends", || llm.saw("end:1")).await;
        assert!(llm.saw("closed:1"), "{style:?}: its second send failed");
        assert!(!llm.saw("token:1:2"), "{style:?}: it stopped there");
        eventually("its units come back", || pool.stats().used_units == 0).await;
        // The count of cancelled tasks is kept by the step after the one that frees the
        // units: a reading between the two saw 0 (CI, once).
        eventually("it counts as cancelled", || {
            pool.stats().cancelled_tasks >= 1
        })
        .await;
        assert_eq!(pool.stats().cancelled_tasks, 1);
        // A reader that comes back gets what waited, then how the task ended.
        assert_eq!(unread.next().await, Some(Ok("t0".to_owned())));
        assert_eq!(unread.next().await, Some(Err(PoolError::Cancelled)));
        assert_eq!(unread.next().await, None);
    }
}

#[test]
fn a_sync_caller_reads_a_stream_as_a_blocking_iterator() {
    let llm = FakeLlm::default();
    let pool = pool(2, &llm);
    let stream = pool
        .submit_streaming_blocking(job(6, 3, 1, Style::Blocking), meta(6, 2), 2)
        .expect("admitted");
    let items: Vec<_> = stream.into_blocking_iter().collect();
    assert_eq!(
        items,
        vec![
            Ok("t0".to_owned()),
            Ok("t1".to_owned()),
            Ok("t2".to_owned()),
            Ok("t0t1t2".to_owned())
        ]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_actor_protocol_takes_streamed_submissions() {
    let llm = FakeLlm::default();
    let pool = pool(2, &llm);
    let (attachment, stream) = ResultStream::<String>::channel(4).expect("valid buffer");
    let task = ScheduledTask::new(meta(8, 1), job(8, 2, 1, Style::Async));
    let answer = pool
        .client()
        .scheduler()
        .call(
            |reply| SchedulerRequest::SubmitStreaming {
                task,
                options: SubmitOptions::default(),
                stream: attachment,
                reply,
            },
            Some(PATIENCE),
        )
        .await
        .expect("the scheduler answers");
    assert!(matches!(answer, CallResult::Success(Ok(_))), "{answer:?}");
    let items: Vec<_> = stream.collect().await;
    assert_eq!(items.last(), Some(&Ok("t0t1".to_owned())));

    // A stream of another item type is refused, naming the mismatch.
    let (wrong, _stream) = ResultStream::<u64>::channel(4).expect("valid buffer");
    let task = ScheduledTask::new(meta(9, 1), job(9, 2, 1, Style::Async));
    let answer = pool
        .client()
        .scheduler()
        .call(
            |reply| SchedulerRequest::SubmitStreaming {
                task,
                options: SubmitOptions::default(),
                stream: wrong,
                reply,
            },
            Some(PATIENCE),
        )
        .await
        .expect("the scheduler answers");
    match answer {
        CallResult::Success(Err(PoolError::InvalidConfig(reason))) => {
            assert!(reason.contains("item type"), "{reason}")
        }
        other => panic!("expected a refusal, got {other:?}"),
    }
}

// ---------------------------------------------------------------------------------------
// Nested work
// ---------------------------------------------------------------------------------------

/// A parent submits `children` children to its own pool and waits for each; a child is a
/// leaf. The parent's result lists what each child gave.
#[derive(Debug, Clone)]
enum Work {
    Parent { id: u64, children: u64 },
    Leaf { id: u64 },
}

#[derive(Clone)]
struct Nesting {
    pool: Arc<std::sync::OnceLock<Arc<WorkerPool<Work, String, Nesting>>>>,
}

#[async_trait]
impl WorkerExecutor<Work, String> for Nesting {
    async fn execute(&self, work: Work, _meta: TaskMetadata) -> String {
        match work {
            Work::Leaf { id } => format!("leaf{id}"),
            Work::Parent { id, children } => {
                let pool = self.pool.get().expect("pool set").clone();
                let mut results = Vec::new();
                for child in 0..children {
                    let child_id = id * 100 + child;
                    let submitted = pool
                        .submit_async(Work::Leaf { id: child_id }, meta(child_id, 1))
                        .await;
                    let outcome = match submitted {
                        Ok(key) => pool
                            .retrieve_async(&key, PATIENCE)
                            .await
                            .unwrap_or_else(|error| format!("error: {error}")),
                        Err(error) => format!("refused: {error}"),
                    };
                    results.push(outcome);
                }
                results.join(" | ")
            }
        }
    }
}

fn nesting_pool(workers: usize) -> Arc<WorkerPool<Work, String, Nesting>> {
    let executor = Nesting {
        pool: Arc::new(std::sync::OnceLock::new()),
    };
    let config = WorkerPoolConfig::new()
        .with_name("nested")
        .with_worker_count(workers)
        .with_max_units(UNITS);
    let pool = Arc::new(WorkerPool::new(config, executor.clone()).expect("pool starts"));
    assert!(executor.pool.set(pool.clone()).is_ok());
    pool
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_parent_waiting_on_its_children_in_its_own_pool_completes() {
    let pool = nesting_pool(2);
    let key = pool
        .submit_async(Work::Parent { id: 1, children: 3 }, meta(1, 1))
        .await
        .expect("admitted");
    assert_eq!(
        pool.retrieve_async(&key, PATIENCE).await,
        Ok("leaf100 | leaf101 | leaf102".to_owned())
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn when_every_worker_could_end_up_waiting_a_child_fails_fast_instead_of_deadlocking() {
    // One worker: its only thread runs the parent, so a child could never get a worker.
    let pool = nesting_pool(1);
    let key = pool
        .submit_async(Work::Parent { id: 2, children: 1 }, meta(2, 1))
        .await
        .expect("admitted");
    let result = pool
        .retrieve_async(&key, PATIENCE)
        .await
        .expect("the parent returns at once");
    assert!(
        result.starts_with("refused: nested submission refused")
            && result.contains("0 nested slots"),
        "{result}"
    );

    // Two workers, two parents at once: at most one child may wait; no deadlock either way.
    let pool = nesting_pool(2);
    let keys = [
        pool.submit_async(Work::Parent { id: 3, children: 2 }, meta(3, 1))
            .await
            .expect("admitted"),
        pool.submit_async(Work::Parent { id: 4, children: 2 }, meta(4, 1))
            .await
            .expect("admitted"),
    ];
    let mut leaves = 0;
    for key in &keys {
        let result = pool
            .retrieve_async(key, PATIENCE)
            .await
            .expect("every parent returns");
        for part in result.split(" | ") {
            if part.starts_with("leaf") {
                leaves += 1;
            } else {
                assert!(
                    part.starts_with("refused: nested submission refused"),
                    "{part}"
                );
            }
        }
    }
    assert!(
        leaves >= 2,
        "children ran whenever a slot was free ({leaves})"
    );
    eventually("every unit comes back", || pool.stats().used_units == 0).await;
}
