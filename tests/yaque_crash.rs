//! `kill -9` in the middle of a load: real child processes, a real `SIGKILL`.
//!
//! The parent test starts this test binary again as a child ([`crash_child`], selected by
//! name and run only when the parent's environment variables say which phase it plays). The
//! child runs a pool on a yaque queue (`"durability": "accepted"`, 4 workers) whose executor
//! appends `start ID` and `done ID` lines to a log file (one `write` each, `O_APPEND`, so
//! the lines of a killed process are whole). The **load** child submits `TASKS` tasks,
//! writing `accepted ID` after each submit returns. Once every task is accepted and some have
//! finished (so N are parked and M running), the parent `SIGKILL`s it and reaps it. The
//! **resume** child opens the same directory, submits nothing, waits until the pool has run
//! everything it restored, shuts down and checks that the queue is empty.
//!
//! The parent then asserts from the log: every accepted task finished (none lost); no task
//! ran more than twice; every task that ran twice had started before the kill, and at most
//! as many as were running (the pool has 4 workers, so M ≤ 4); every task cut off by the kill
//! ran again (at-least-once).
//!
//! Children are killed and reaped by a guard, and the directory removed, also when the test
//! fails.
//!
//! The same way, [`the_seed_tauri_config_works_as_written`] runs a child in a fresh working
//! directory that builds the seed's Tauri pool from its configuration exactly as written
//! (`"path": "./data/queues"`, relative to the working directory).
//!
//! Who owns a stream: an **owner** child opens a queue, parks a task and waits. Killed with
//! `SIGKILL` and left unreaped (a zombie, which still has its pid), it must not keep the
//! queue closed; alive, it must, and the error must name it and say what to do. A yaque lock
//! file naming a live process that is no queue (a pid reused after a reboot) is stale.

#[path = "support/processes.rs"]
mod processes;

use std::collections::{BTreeMap, BTreeSet};
use std::fs::OpenOptions;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Child;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use prometheus_parking_lot::config::WorkerPoolConfig;
use prometheus_parking_lot::core::SubmitOptions;
use prometheus_parking_lot::core::{
    Durability, ScheduledTask, StarvationGuard, TaskMetadata, TaskQueue,
};
use prometheus_parking_lot::infra::mailbox::memory::InMemoryMailbox;
use prometheus_parking_lot::infra::queue::yaque::YaqueQueue;
use prometheus_parking_lot::util::serde::{MailboxKey, ResourceCost};
use prometheus_parking_lot::{
    build_pools_from_scheduler_config, QueueBuilderContext, SchedulerConfig, TokioSpawner,
};
use prometheus_parking_lot::{ResourcePool, TaskExecutor};

/// The directory the child works in; set only for a child.
const DIR_ENV: &str = "PL_YAQUE_CRASH_DIR";
/// `load` or `resume`.
const PHASE_ENV: &str = "PL_YAQUE_CRASH_PHASE";
const TASKS: u64 = 60;
const WORKERS: usize = 4;
/// Task `id` runs `TASK_TIME + (id % 4) * 10 ms`, so starts and ends are staggered and a kill
/// finds tasks running.
const TASK_TIME: Duration = Duration::from_millis(40);
const STREAM: &str = "crash";

// ---------------------------------------------------------------------------------------------
// The child
// ---------------------------------------------------------------------------------------------

/// Appends whole lines to the run log.
#[derive(Clone)]
struct RunLog(Arc<Mutex<std::fs::File>>);

impl RunLog {
    fn open(dir: &Path) -> Self {
        let file = OpenOptions::new()
            .create(true)
            .append(true)
            .open(dir.join("runs.log"))
            .expect("run log");
        Self(Arc::new(Mutex::new(file)))
    }

    fn line(&self, line: String) {
        let mut file = self.0.lock().unwrap_or_else(|poison| poison.into_inner());
        file.write_all(format!("{line}\n").as_bytes())
            .expect("run log write");
    }
}

#[derive(Clone)]
struct Recorder(RunLog);

#[async_trait]
impl TaskExecutor<u64, u64> for Recorder {
    async fn execute(&self, payload: u64, meta: TaskMetadata) -> u64 {
        self.0.line(format!("start {}", meta.id));
        tokio::time::sleep(TASK_TIME + Duration::from_millis(10 * (meta.id % 4))).await;
        self.0.line(format!("done {}", meta.id));
        payload
    }
}

fn child_pool(dir: &Path, log: &RunLog) -> ResourcePool<u64, u64, Recorder> {
    let queue = YaqueQueue::<u64>::open(dir, STREAM).expect("the queue opens");
    let settings = WorkerPoolConfig::new()
        .with_name("crash")
        .with_worker_count(WORKERS)
        .with_max_units(WORKERS as u32)
        .with_max_queue_depth(10_000)
        .with_starvation(StarvationGuard::disabled())
        .with_durability(Durability::Accepted);
    ResourcePool::with_settings(
        settings,
        Recorder(log.clone()),
        Box::new(queue),
        Arc::new(InMemoryMailbox::new()),
        &TokioSpawner,
    )
    .expect("the pool starts")
}

/// Runs what `pool` restored until it has been idle for 200 ms, stops it, checks that the
/// queue in `dir` holds nothing, and logs `resumed`.
async fn resume_until_empty<E>(pool: ResourcePool<u64, u64, E>, dir: &Path, log: &RunLog)
where
    E: TaskExecutor<u64, u64> + 'static,
{
    let mut idle = 0;
    while idle < 10 {
        let stats = pool.stats();
        idle = if stats.active_tasks == 0 && stats.queued_tasks == 0 {
            idle + 1
        } else {
            0
        };
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    pool.shutdown_with_drain(Duration::from_secs(10))
        .await
        .expect("shutdown");
    drop(pool);
    let queue = YaqueQueue::<u64>::open(dir, STREAM).expect("reopens");
    let left = queue.load_parked().await.expect("load");
    assert!(left.is_empty(), "tasks left in the queue: {left:?}");
    log.line("resumed".into());
}

/// The child's role in the crash test.
fn crash_child() {
    let dir = PathBuf::from(std::env::var(DIR_ENV).expect("started by the crash test"));
    let phase = std::env::var(PHASE_ENV).expect("a phase");
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(async {
        let log = RunLog::open(&dir);
        let pool = child_pool(&dir, &log);
        match phase.as_str() {
            "load" => {
                for id in 0..TASKS {
                    let meta = TaskMetadata::new(id, ResourceCost::gpu_vram(1));
                    pool.submit(ScheduledTask::new(meta, id))
                        .await
                        .expect("accepted");
                    log.line(format!("accepted {id}"));
                }
                // Runs until the parent kills it.
                tokio::time::sleep(Duration::from_secs(120)).await;
                panic!("the parent never killed the load child");
            }
            "resume" => resume_until_empty(pool, &dir, &log).await,
            other => panic!("unknown phase {other}"),
        }
    });
}

// ---------------------------------------------------------------------------------------------
// The parent
// ---------------------------------------------------------------------------------------------

/// A directory removed when dropped.
struct TempDir(PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A child process killed and reaped when dropped, whatever happened.
struct ChildGuard(Child);

impl ChildGuard {
    fn spawn(dir: &Path, phase: &str) -> Self {
        Self::run("crash_child", dir, phase)
    }

    /// Runs this binary in a child playing `role`, working in `dir`.
    fn run(role: &str, dir: &Path, phase: &str) -> Self {
        let child = processes::child(role)
            .current_dir(dir)
            .env(DIR_ENV, dir)
            .env(PHASE_ENV, phase)
            .spawn()
            .expect("the child starts");
        Self(child)
    }

    fn sigkill(&mut self) {
        let pid = libc::pid_t::try_from(self.0.id()).expect("pid");
        // SAFETY: kill(2) with a pid this process spawned and has not reaped yet.
        let sent = unsafe { libc::kill(pid, libc::SIGKILL) };
        assert_eq!(sent, 0, "SIGKILL sent");
        let status = self.0.wait().expect("reaped");
        assert!(
            !status.success(),
            "the child died of the signal: {status:?}"
        );
    }

    fn wait_success(&mut self, limit: Duration) {
        let deadline = Instant::now() + limit;
        loop {
            if let Some(status) = self.0.try_wait().expect("try_wait") {
                assert!(status.success(), "the child failed: {status:?}");
                return;
            }
            assert!(
                Instant::now() < deadline,
                "the child did not finish in {limit:?}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for ChildGuard {
    fn drop(&mut self) {
        if matches!(self.0.try_wait(), Ok(None)) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

/// The run log, line by line: (event, task id).
fn read_log(dir: &Path) -> Vec<(String, u64)> {
    let text = std::fs::read_to_string(dir.join("runs.log")).unwrap_or_default();
    text.lines()
        .filter_map(|line| {
            let (event, id) = line.split_once(' ')?;
            Some((event.to_owned(), id.parse().ok()?))
        })
        .collect()
}

fn count(log: &[(String, u64)], event: &str) -> BTreeMap<u64, usize> {
    let mut counts = BTreeMap::new();
    for (seen, id) in log {
        if seen == event {
            *counts.entry(*id).or_default() += 1;
        }
    }
    counts
}

fn kill_9_mid_load_loses_no_accepted_task() {
    let dir = TempDir(std::env::temp_dir().join(format!("pl-yaque-crash-{}", std::process::id())));
    let _ = std::fs::remove_dir_all(&dir.0);
    std::fs::create_dir_all(&dir.0).expect("temp dir");

    let mut load = ChildGuard::spawn(&dir.0, "load");
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let log = read_log(&dir.0);
        let accepted = count(&log, "accepted").len() as u64;
        let done = count(&log, "done").len();
        let running = count(&log, "start").len() - done;
        if accepted == TASKS && done >= WORKERS && running >= 2 {
            break;
        }
        if let Some(status) = load.0.try_wait().expect("try_wait") {
            panic!("the load child exited early: {status:?}");
        }
        assert!(
            Instant::now() < deadline,
            "the load child did not get going: {log:?}"
        );
        std::thread::sleep(Duration::from_millis(2));
    }
    load.sigkill();

    let at_kill = read_log(&dir.0);
    let accepted: BTreeSet<u64> = count(&at_kill, "accepted").into_keys().collect();
    let started_before: BTreeSet<u64> = count(&at_kill, "start").into_keys().collect();
    let done_before: BTreeSet<u64> = count(&at_kill, "done").into_keys().collect();
    let running: BTreeSet<u64> = started_before.difference(&done_before).copied().collect();
    let parked = TASKS as usize - started_before.len();
    eprintln!(
        "killed with {parked} parked, {} running, {} done",
        running.len(),
        done_before.len()
    );
    assert_eq!(accepted.len() as u64, TASKS);
    assert!(parked > 0, "the kill came after every task had started");
    assert!(!running.is_empty(), "the kill found no task running");
    assert!(
        running.len() <= WORKERS,
        "more running than workers: {running:?}"
    );

    let mut resume = ChildGuard::spawn(&dir.0, "resume");
    resume.wait_success(Duration::from_secs(60));

    let log = read_log(&dir.0);
    assert!(
        std::fs::read_to_string(dir.0.join("runs.log"))
            .unwrap()
            .contains("resumed\n"),
        "the resume child finished its checks"
    );
    let done = count(&log, "done");
    let starts = count(&log, "start");
    let lost: Vec<u64> = accepted
        .iter()
        .filter(|id| !done.contains_key(id))
        .copied()
        .collect();
    assert!(lost.is_empty(), "accepted tasks never finished: {lost:?}");
    let twice: BTreeSet<u64> = starts
        .iter()
        .filter(|&(_, &runs)| runs > 1)
        .map(|(&id, _)| id)
        .collect();
    assert!(
        starts.values().all(|&runs| runs <= 2),
        "a task ran more than twice: {starts:?}"
    );
    assert!(
        twice.is_subset(&started_before),
        "a task that had not started before the kill ran twice: {twice:?}"
    );
    assert!(
        twice.len() <= WORKERS,
        "{} tasks ran twice, more than could run at once ({WORKERS}): {twice:?}",
        twice.len()
    );
    assert!(
        running.is_subset(&twice),
        "tasks cut off by the kill must run again: running {running:?}, ran twice {twice:?}"
    );
    eprintln!(
        "after the restart: {} tasks finished, {} ran twice ({twice:?})",
        done.len(),
        twice.len()
    );
}

// ---------------------------------------------------------------------------------------------
// Dependencies through a kill
// ---------------------------------------------------------------------------------------------

/// Chains of three tasks, each depending on the one before (`a → b → c`); the first task
/// of every third chain fails.
const CHAINS: u64 = 12;
/// A payload that makes the chain step fail (its executor panics).
const FAIL: u64 = 1;

/// The ids of chain `chain`'s three steps.
fn chain_ids(chain: u64) -> [u64; 3] {
    let first = 100 + 3 * chain;
    [first, first + 1, first + 2]
}

/// Logs `start`, then `done` or (for the payload `FAIL`) `fail` before it panics.
#[derive(Clone)]
struct ChainStep(RunLog);

#[async_trait]
impl TaskExecutor<u64, u64> for ChainStep {
    async fn execute(&self, payload: u64, meta: TaskMetadata) -> u64 {
        self.0.line(format!("start {}", meta.id));
        tokio::time::sleep(TASK_TIME + Duration::from_millis(10 * (meta.id % 4))).await;
        if payload == FAIL {
            self.0.line(format!("fail {}", meta.id));
            panic!("chain step {} fails", meta.id);
        }
        self.0.line(format!("done {}", meta.id));
        payload
    }
}

/// The child's role in the dependencies crash test: `load` submits the chains and waits to
/// be killed; `resume` runs what the queue kept until nothing is left.
fn chains_child() {
    let dir = PathBuf::from(std::env::var(DIR_ENV).expect("started by the crash test"));
    let phase = std::env::var(PHASE_ENV).expect("a phase");
    // A failing step's panic is the test's own: said in the log, not on stderr.
    let report = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let message = info.payload().downcast_ref::<String>();
        if !message.is_some_and(|message| message.starts_with("chain step")) {
            report(info);
        }
    }));
    processes::on_runtime(async {
        let log = RunLog::open(&dir);
        let queue = YaqueQueue::<u64>::open(&dir, STREAM).expect("the queue opens");
        let settings = WorkerPoolConfig::new()
            .with_name("chains")
            .with_worker_count(WORKERS)
            .with_max_units(WORKERS as u32)
            .with_durability(Durability::Accepted);
        let pool = ResourcePool::with_settings(
            settings,
            ChainStep(log.clone()),
            Box::new(queue),
            Arc::new(InMemoryMailbox::new()),
            &TokioSpawner,
        )
        .expect("the pool starts");
        let key = |id: u64| MailboxKey::new("chains").with_session(format!("step-{id}"));
        match phase.as_str() {
            "load" => {
                for chain in 0..CHAINS {
                    let mut before = None;
                    for (step, id) in chain_ids(chain).into_iter().enumerate() {
                        let fails = step == 0 && chain % 3 == 0;
                        let meta =
                            TaskMetadata::new(id, ResourceCost::gpu_vram(1)).with_mailbox(key(id));
                        let payload = if fails { FAIL } else { id };
                        let options = SubmitOptions::default().with_depends_on(before);
                        pool.submit_with(ScheduledTask::new(meta, payload), options)
                            .await
                            .expect("accepted");
                        log.line(format!("accepted {id}"));
                        before = Some(id);
                    }
                }
                tokio::time::sleep(Duration::from_secs(120)).await;
                panic!("the parent never killed the load child");
            }
            "resume" => resume_until_empty(pool, &dir, &log).await,
            other => panic!("unknown phase {other}"),
        }
    });
}

/// Chains of dependent tasks, killed with `SIGKILL` while some run and others wait: after
/// the restart every step of a chain whose first step succeeds runs, each only after the
/// step before it succeeded (a step may run twice, as any task cut off by a kill does), and
/// no step after a failed one ever starts.
fn kill_9_keeps_every_chain_of_dependencies() {
    let dir = TempDir(std::env::temp_dir().join(format!("pl-yaque-chains-{}", std::process::id())));
    let _ = std::fs::remove_dir_all(&dir.0);
    std::fs::create_dir_all(&dir.0).expect("temp dir");

    let mut load = ChildGuard::run("chains_child", &dir.0, "load");
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let log = read_log(&dir.0);
        let accepted = count(&log, "accepted").len() as u64;
        let ended = count(&log, "done").len() + count(&log, "fail").len();
        let running = count(&log, "start").len() - ended;
        if accepted == 3 * CHAINS && ended >= 2 * WORKERS && running >= 2 {
            break;
        }
        if let Some(status) = load.0.try_wait().expect("try_wait") {
            panic!("the load child exited early: {status:?}");
        }
        assert!(
            Instant::now() < deadline,
            "the load child did not get going: {log:?}"
        );
        std::thread::sleep(Duration::from_millis(2));
    }
    load.sigkill();
    let at_kill = read_log(&dir.0);
    let started = count(&at_kill, "start");
    let waiting = (0..CHAINS)
        .flat_map(chain_ids)
        .filter(|id| !started.contains_key(id))
        .count();
    assert!(waiting > 0, "the kill came after every step had started");
    eprintln!(
        "killed with {} started, {} ended, {waiting} accepted and not started",
        count(&at_kill, "start").len(),
        count(&at_kill, "done").len() + count(&at_kill, "fail").len()
    );

    let mut resume = ChildGuard::run("chains_child", &dir.0, "resume");
    resume.wait_success(Duration::from_secs(60));
    assert!(
        std::fs::read_to_string(dir.0.join("runs.log"))
            .unwrap()
            .contains("resumed\n"),
        "the resume child finished its checks"
    );
    let log = read_log(&dir.0);
    let position =
        |event: &str, id: u64| log.iter().position(|seen| seen.0 == event && seen.1 == id);
    for chain in 0..CHAINS {
        let [a, b, c] = chain_ids(chain);
        if chain % 3 == 0 {
            assert!(
                position("fail", a).is_some(),
                "chain {chain}: its first step ran and failed"
            );
            for later in [b, c] {
                assert_eq!(
                    position("start", later),
                    None,
                    "chain {chain}: a step after a failed one never starts"
                );
            }
            continue;
        }
        for (parent, child) in [(a, b), (b, c)] {
            let done = position("done", parent)
                .unwrap_or_else(|| panic!("chain {chain}: step {parent} finished"));
            let first_start = position("start", child)
                .unwrap_or_else(|| panic!("chain {chain}: step {child} ran"));
            assert!(
                first_start > done,
                "chain {chain}: step {child} started before step {parent} succeeded"
            );
        }
        assert!(
            position("done", c).is_some(),
            "chain {chain}: its last step finished"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// Who owns a stream
// ---------------------------------------------------------------------------------------------

const OWNED_STREAM: &str = "owned";

/// The child's role: open the queue, park task 7, say so, and wait to be killed.
fn owner_child() {
    let dir = PathBuf::from(std::env::var(DIR_ENV).expect("started by an owner test"));
    processes::on_runtime(async move {
        let queue = YaqueQueue::<u64>::open(&dir, OWNED_STREAM).expect("the owner opens");
        let meta = TaskMetadata::new(7, ResourceCost::gpu_vram(1));
        queue
            .park(1, ScheduledTask::new(meta, 7))
            .await
            .expect("parked");
        std::fs::write(dir.join("owner.ready"), std::process::id().to_string()).expect("ready");
        tokio::time::sleep(Duration::from_secs(120)).await;
        drop(queue);
        panic!("the parent never killed the owner");
    });
}

/// Starts an owner child in `dir` and waits until it holds the queue.
fn start_owner(dir: &Path) -> ChildGuard {
    let mut owner = ChildGuard::run("owner_child", dir, "own");
    let deadline = Instant::now() + Duration::from_secs(30);
    while !dir.join("owner.ready").exists() {
        if let Some(status) = owner.0.try_wait().expect("try_wait") {
            panic!("the owner exited early: {status:?}");
        }
        assert!(
            Instant::now() < deadline,
            "the owner did not open the queue"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    owner
}

/// The state letter of process `pid` in `/proc` (`Z` for a zombie).
fn process_state(pid: u32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit_once(')')?.1.trim_start().chars().next()
}

/// Runs one future to its end on a runtime of its own (the queue's calls do plain file I/O).
fn block_on<F: std::future::Future>(work: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("a runtime")
        .block_on(work)
}

fn open_owned(dir: &Path) -> Result<YaqueQueue<u64>, String> {
    YaqueQueue::open(dir, OWNED_STREAM).map_err(|error| error.to_string())
}

fn fresh_dir(label: &str) -> TempDir {
    let dir =
        TempDir(std::env::temp_dir().join(format!("pl-yaque-{label}-{}", std::process::id())));
    let _ = std::fs::remove_dir_all(&dir.0);
    std::fs::create_dir_all(&dir.0).expect("temp dir");
    dir
}

fn a_killed_owner_left_a_zombie_does_not_lock_the_queue() {
    let dir = fresh_dir("zombie");
    let mut owner = start_owner(&dir.0);
    let pid = owner.0.id();
    let target = libc::pid_t::try_from(pid).expect("pid");
    // SAFETY: kill(2) with a pid this process spawned and has not reaped.
    assert_eq!(
        unsafe { libc::kill(target, libc::SIGKILL) },
        0,
        "SIGKILL sent"
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    while process_state(pid) != Some('Z') {
        assert!(
            Instant::now() < deadline,
            "the killed owner never became a zombie: {:?}",
            process_state(pid)
        );
        std::thread::sleep(Duration::from_millis(2));
    }

    let queue = open_owned(&dir.0).expect("a zombie owner does not keep the queue closed");
    assert_eq!(process_state(pid), Some('Z'), "still unreaped while opened");
    let parked = block_on(queue.load_parked()).expect("load");
    assert_eq!(
        parked
            .iter()
            .map(|s| (s.entry, s.meta.id))
            .collect::<Vec<_>>(),
        vec![(1, 7)],
        "the owner's parked task is there"
    );
    drop(queue);
    let status = owner.0.wait().expect("reaped");
    assert!(!status.success());
}

fn a_live_owner_keeps_the_queue_and_the_error_says_what_to_do() {
    let dir = fresh_dir("live-owner");
    let mut owner = start_owner(&dir.0);
    let pid = owner.0.id();
    let Err(error) = open_owned(&dir.0) else {
        panic!("a second process opened a queue its live owner holds");
    };
    assert!(
        error.contains("in use")
            && error.contains(&format!("process {pid}"))
            && error.contains("stop that process"),
        "the error names the owner and what to do: {error}"
    );
    owner.sigkill();
    let queue = open_owned(&dir.0).expect("opens once the owner is gone");
    assert_eq!(block_on(queue.counts()).unwrap().parked, 1);
}

fn a_lock_file_naming_a_live_process_that_is_no_queue_is_stale() {
    let dir = fresh_dir("reused-pid");
    drop(open_owned(&dir.0).expect("opens"));
    // After a reboot, the pid in a left-over lock file may be any live process's.
    let mut unrelated = std::process::Command::new("sleep")
        .arg("30")
        .spawn()
        .expect("sleep starts");
    let stream = dir.0.join(OWNED_STREAM);
    let lock = format!("pid={}\ntoken=42\n", unrelated.id());
    std::fs::write(stream.join("send.lock"), &lock).unwrap();
    std::fs::create_dir_all(stream.join("version")).unwrap();
    std::fs::write(stream.join("version").join("lock"), &lock).unwrap();

    let opened = open_owned(&dir.0);
    let _ = unrelated.kill();
    let _ = unrelated.wait();
    let queue = opened.expect("a lock file of a process that is no queue is stale");
    let meta = TaskMetadata::new(3, ResourceCost::gpu_vram(1));
    block_on(queue.park(1, ScheduledTask::new(meta, 3))).expect("takes parks");
}

// ---------------------------------------------------------------------------------------------
// The seed's Tauri configuration, as written
// ---------------------------------------------------------------------------------------------

#[derive(Clone)]
struct Echo;

#[async_trait]
impl TaskExecutor<String, String> for Echo {
    async fn execute(&self, payload: String, _meta: TaskMetadata) -> String {
        payload.to_uppercase()
    }
}

/// The child's role: build the seed's Tauri pool in the working directory the parent chose,
/// run a task through it, and check where its queue lives.
fn seed_child() {
    let snippet = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/seed_tauri_snippet.json"),
    )
    .expect("fixture");
    let config =
        SchedulerConfig::from_json_str(&format!(r#"{{ "pools": {{ "tauri": {snippet} }} }}"#))
            .expect("the seed's configuration parses");
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(async {
        let built = build_pools_from_scheduler_config::<String, String, Echo, TokioSpawner>(
            &config,
            &QueueBuilderContext::Embedded,
            None,
            |_name| Echo,
            TokioSpawner,
        )
        .expect("the seed's Tauri pool builds as written");
        let pool = &built.pools["tauri"];
        let meta = TaskMetadata::new(1, ResourceCost::gpu_vram(1));
        let key = pool
            .submit(ScheduledTask::new(meta, "tauri".to_owned()))
            .await
            .expect("admitted");
        let answer = pool.retrieve(&key, Duration::from_secs(10)).await;
        assert_eq!(answer, Ok("TAURI".to_owned()));
    });
    assert!(
        Path::new("./data/queues/llm_tasks").is_dir(),
        "the queue lives where the configuration says"
    );
}

fn the_seed_tauri_config_works_as_written() {
    let dir = TempDir(std::env::temp_dir().join(format!("pl-yaque-seed-{}", std::process::id())));
    let _ = std::fs::remove_dir_all(&dir.0);
    std::fs::create_dir_all(&dir.0).expect("temp dir");
    let mut child = ChildGuard::run("seed_child", &dir.0, "seed");
    child.wait_success(Duration::from_secs(60));
    assert!(dir.0.join("data/queues/llm_tasks").is_dir());
}

fn main() {
    processes::main(
        &[
            (
                "kill_9_mid_load_loses_no_accepted_task",
                kill_9_mid_load_loses_no_accepted_task,
            ),
            (
                "kill_9_keeps_every_chain_of_dependencies",
                kill_9_keeps_every_chain_of_dependencies,
            ),
            (
                "the_seed_tauri_config_works_as_written",
                the_seed_tauri_config_works_as_written,
            ),
            (
                "a_killed_owner_left_a_zombie_does_not_lock_the_queue",
                a_killed_owner_left_a_zombie_does_not_lock_the_queue,
            ),
            (
                "a_live_owner_keeps_the_queue_and_the_error_says_what_to_do",
                a_live_owner_keeps_the_queue_and_the_error_says_what_to_do,
            ),
            (
                "a_lock_file_naming_a_live_process_that_is_no_queue_is_stale",
                a_lock_file_naming_a_live_process_that_is_no_queue_is_stale,
            ),
        ],
        &[
            ("crash_child", crash_child),
            ("chains_child", chains_child),
            ("seed_child", seed_child),
            ("owner_child", owner_child),
        ],
    );
}
