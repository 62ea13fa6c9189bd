//! What a `CapacityGate` permit costs beside `tokio::sync::Semaphore`, the primitive an engine
//! would otherwise count its blocks with. Every figure has the semaphore's beside it, measured
//! in the same run on the same runtime.
//!
//! - **Uncontended acquire + drop**: one client acquires 1 unit of 64 and drops it, N times
//!   for each subject, in 10 rounds that alternate gate and semaphore (after one warm-up
//!   round); p50 and p99 of each pair. The gate's metadata is built outside the timed part.
//! - **Closed loop**: C clients on a 2-thread runtime each loop: acquire 1 to 8 units of 64
//!   (at random), yield once while holding them, drop. Each round runs D ms; acquisitions per
//!   second, median of R rounds (gate and semaphore alternate). Target: the gate at least
//!   0.25x the semaphore.
//! - **Release → grant**: a holder holds all 64 units; one waiter asks for all 64 and waits
//!   (1 ms to park); the time from the holder's drop to the moment the waiter's acquire
//!   returns, S times. Target: p99 under 100 µs.
//! - **Memory per waiter**: a gate of 1 unit, held; W acquires of 1 unit, each a boxed future
//!   kept in a `Vec` allocated beforehand, asked for in batches of 10,000 (each parked before
//!   the next batch is asked, as waiters arrive at a server), then polled once. The live heap (a
//!   counting global allocator) and the resident set (`/proc/self/statm`) are read before
//!   and once the gate reports W waiting; the difference over W is the cost of one waiter,
//!   its future included. The same with W waiting `Semaphore::acquire_many` futures (heap
//!   only: it runs second, on pages the gate's waiters gave back, so its RSS would read low).
//!   For comparison, a parked pool task costs 368 B of RSS (`pool_memory`, BENCHMARKS.md).
//!
//! `cargo bench --bench permits` runs N = 100,000, C = 64, D = 2,000 ms, R = 3, S = 2,000,
//! W = 1,000,000 (override with `PERMITS_ITERATIONS`, `PERMITS_CLIENTS`, `PERMITS_LOOP_MS`,
//! `PERMITS_ROUNDS`, `PERMITS_REPS`, `PERMITS_WAITERS`). Under `cargo test` (no `--bench`
//! argument) it runs every part at a small scale as a smoke test: the tables print, their
//! figures mean nothing. `scripts/bench.sh permits` runs it and rewrites its block of
//! BENCHMARKS.md.

#[path = "support/mod.rs"]
mod support;

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::Poll;
use std::time::{Duration, Instant};

use prometheus_parking_lot::{CapacityGate, ResourceCost, TaskMetadata, WorkerPoolConfig};
use tokio::runtime::Runtime;
use tokio::sync::{oneshot, Semaphore};

#[global_allocator]
static ALLOCATOR: support::LiveBytes = support::LiveBytes;

/// Threads of the clients' tokio runtime (as in `end_to_end`).
const CLIENT_THREADS: usize = 2;
/// Units of the gate and permits of the semaphore, in every part but the memory one.
const UNITS: u32 = 64;
/// The most units one closed-loop client asks for at a time.
const MOST_UNITS_PER_ACQUIRE: u32 = 8;
/// Rounds of the uncontended part (one more runs first as a warm-up).
const UNCONTENDED_ROUNDS: usize = 10;
/// How long the release → grant waiter is given to park before the holder lets go.
const PARK_TIME: Duration = Duration::from_millis(1);
/// How long the memory part waits for the gate to report every waiter.
const PARK_GIVE_UP: Duration = Duration::from_secs(300);
/// RSS per parked pool task, from `pool_memory` (BENCHMARKS.md), for comparison.
const POOL_TASK_RSS_BYTES: f64 = 368.0;

/// The run's size: the real benchmark, or a smoke test under `cargo test`.
struct Scale {
    measured: bool,
    iterations: usize,
    clients: u64,
    loop_time: Duration,
    rounds: usize,
    reps: usize,
    waiters: usize,
}

impl Scale {
    fn from_env() -> Self {
        let measured = support::measured();
        let env = support::env_u64;
        let pick = |name: &str, bench: u64, smoke: u64| {
            env(name, if measured { bench } else { smoke }).max(1)
        };
        Self {
            measured,
            iterations: pick("PERMITS_ITERATIONS", 100_000, 2_000) as usize,
            clients: pick("PERMITS_CLIENTS", 64, 64),
            loop_time: Duration::from_millis(pick("PERMITS_LOOP_MS", 2_000, 100)),
            rounds: pick("PERMITS_ROUNDS", 3, 1) as usize,
            reps: pick("PERMITS_REPS", 2_000, 50) as usize,
            waiters: pick("PERMITS_WAITERS", 1_000_000, 5_000) as usize,
        }
    }
}

/// A gate of `units` units where `waiters` may wait at once.
fn new_gate(units: u32, waiters: usize) -> Arc<CapacityGate> {
    let config = WorkerPoolConfig::new()
        .with_max_units(units)
        .with_max_queue_depth(waiters.max(1));
    Arc::new(CapacityGate::new(config).expect("gate"))
}

fn metadata(id: u64, units: u32) -> TaskMetadata {
    TaskMetadata::new(id, ResourceCost::gpu_vram(units))
}

/// Latency samples, and their percentiles.
#[derive(Default)]
struct Samples(Vec<Duration>);

impl Samples {
    /// The `q`-quantile (0..=1), nearest rank.
    fn quantile(&mut self, q: f64) -> Duration {
        assert!(!self.0.is_empty(), "no samples");
        self.0.sort_unstable();
        let rank = ((self.0.len() as f64 * q).ceil() as usize).clamp(1, self.0.len());
        self.0[rank - 1]
    }
}

/// A ratio with two decimals, or three below 0.1.
fn ratio_text(ratio: f64) -> String {
    if ratio < 0.1 {
        format!("{ratio:.3}x")
    } else {
        format!("{ratio:.2}x")
    }
}

/// `1234567.8` → `"1,234,568"`.
fn thousands(value: f64) -> String {
    let digits = format!("{value:.0}");
    let mut grouped = String::new();
    for (i, digit) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            grouped.push(',');
        }
        grouped.push(digit);
    }
    grouped
}

/// One row of a gate-beside-semaphore table: the two figures and their ratio.
fn row(measure: &str, gate: f64, semaphore: f64, decimals: usize) -> String {
    format!(
        "| {measure} | {gate:.decimals$} | {semaphore:.decimals$} | {} |",
        ratio_text(gate / semaphore)
    )
}

/// Acquire + drop latencies, one client, alternating gate and semaphore: (gate, semaphore).
fn uncontended(runtime: &Runtime, scale: &Scale) -> (Samples, Samples) {
    let gate = new_gate(UNITS, 1);
    let semaphore = Semaphore::new(UNITS as usize);
    let per_round = scale.iterations.div_ceil(UNCONTENDED_ROUNDS);
    runtime.block_on(async {
        let (mut through_gate, mut through_semaphore) = (Samples::default(), Samples::default());
        through_gate.0.reserve(per_round * UNCONTENDED_ROUNDS);
        through_semaphore.0.reserve(per_round * UNCONTENDED_ROUNDS);
        let mut id = 0u64;
        for round in 0..=UNCONTENDED_ROUNDS {
            let warm_up = round == 0;
            for _ in 0..per_round {
                id += 1;
                let meta = metadata(id, 1);
                let began = Instant::now();
                let permit = gate.acquire(meta).await.expect("an idle gate grants");
                drop(permit);
                let took = began.elapsed();
                if !warm_up {
                    through_gate.0.push(took);
                }
            }
            for _ in 0..per_round {
                let began = Instant::now();
                let permit = semaphore.acquire_many(1).await.expect("semaphore open");
                drop(permit);
                let took = began.elapsed();
                if !warm_up {
                    through_semaphore.0.push(took);
                }
            }
        }
        (through_gate, through_semaphore)
    })
}

/// A client's source of unit counts, 1 to `MOST_UNITS_PER_ACQUIRE`, reproducible per client.
struct UnitMix(u64);

impl UnitMix {
    fn for_client(client: u64) -> Self {
        Self(0x9e37_79b9_7f4a_7c15 ^ (client + 1).wrapping_mul(0xbf58_476d_1ce4_e5b9))
    }

    fn next(&mut self) -> u32 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        1 + (self.0 % u64::from(MOST_UNITS_PER_ACQUIRE)) as u32
    }
}

/// One closed-loop client on the gate: acquisitions completed before `stop`. Its ids are
/// `first_id` and up (unique while live, which they must be).
async fn gate_client(
    gate: Arc<CapacityGate>,
    client: u64,
    first_id: u64,
    stop: Arc<AtomicBool>,
) -> u64 {
    let mut mix = UnitMix::for_client(client);
    let mut done = 0;
    while !stop.load(Ordering::Relaxed) {
        let meta = metadata(first_id + done, mix.next());
        let permit = gate.acquire(meta).await.expect("the gate grants");
        tokio::task::yield_now().await;
        drop(permit);
        done += 1;
    }
    done
}

/// One closed-loop client on the semaphore.
async fn semaphore_client(semaphore: Arc<Semaphore>, client: u64, stop: Arc<AtomicBool>) -> u64 {
    let mut mix = UnitMix::for_client(client);
    let mut done = 0;
    while !stop.load(Ordering::Relaxed) {
        let permit = semaphore
            .acquire_many(mix.next())
            .await
            .expect("semaphore open");
        tokio::task::yield_now().await;
        drop(permit);
        done += 1;
    }
    done
}

/// Runs `clients` clients for the loop time; acquisitions per second.
fn closed_loop<Fut>(
    runtime: &Runtime,
    scale: &Scale,
    client: impl Fn(u64, Arc<AtomicBool>) -> Fut,
) -> f64
where
    Fut: Future<Output = u64> + Send + 'static,
{
    let stop = Arc::new(AtomicBool::new(false));
    let began = Instant::now();
    let handles: Vec<_> = (0..scale.clients)
        .map(|n| runtime.spawn(client(n, stop.clone())))
        .collect();
    std::thread::sleep(scale.loop_time);
    stop.store(true, Ordering::Relaxed);
    let window = began.elapsed();
    let done: u64 = handles
        .into_iter()
        .map(|handle| runtime.block_on(handle).expect("client ran"))
        .sum();
    done as f64 / window.as_secs_f64()
}

/// Acquisitions per second, median of the rounds: (gate, semaphore).
fn closed_loops(runtime: &Runtime, scale: &Scale) -> (f64, f64) {
    let gate = new_gate(UNITS, scale.clients as usize);
    let semaphore = Arc::new(Semaphore::new(UNITS as usize));
    let (mut through_gate, mut through_semaphore) = (Vec::new(), Vec::new());
    for round in 0..scale.rounds as u64 {
        through_gate.push(closed_loop(runtime, scale, |client, stop| {
            let first_id = (round << 48) | (client << 32);
            gate_client(gate.clone(), client, first_id, stop)
        }));
        through_semaphore.push(closed_loop(runtime, scale, |client, stop| {
            semaphore_client(semaphore.clone(), client, stop)
        }));
    }
    (
        support::median(&through_gate),
        support::median(&through_semaphore),
    )
}

/// Release → grant through the gate: a holder of every unit drops, a waiter for every unit
/// is granted.
async fn gate_release_to_grant(gate: Arc<CapacityGate>, reps: usize) -> Samples {
    let mut samples = Samples::default();
    for rep in 0..reps as u64 {
        let holder = gate
            .acquire(metadata(2 * rep, UNITS))
            .await
            .expect("an idle gate grants");
        let (granted_tx, granted_rx) = oneshot::channel();
        let waiter_gate = gate.clone();
        tokio::spawn(async move {
            let permit = waiter_gate.acquire(metadata(2 * rep + 1, UNITS)).await;
            let granted = Instant::now();
            drop(permit.expect("the waiter is granted"));
            let _ = granted_tx.send(granted);
        });
        tokio::time::sleep(PARK_TIME).await;
        let released = Instant::now();
        drop(holder);
        let granted = granted_rx.await.expect("the waiter reports");
        samples.0.push(granted.saturating_duration_since(released));
    }
    samples
}

/// The same through the semaphore.
async fn semaphore_release_to_grant(semaphore: Arc<Semaphore>, reps: usize) -> Samples {
    let mut samples = Samples::default();
    for _ in 0..reps {
        let holder = semaphore.acquire_many(UNITS).await.expect("semaphore open");
        let (granted_tx, granted_rx) = oneshot::channel();
        let waiter_semaphore = semaphore.clone();
        tokio::spawn(async move {
            let permit = waiter_semaphore.acquire_many(UNITS).await;
            let granted = Instant::now();
            drop(permit.expect("semaphore open"));
            let _ = granted_tx.send(granted);
        });
        tokio::time::sleep(PARK_TIME).await;
        let released = Instant::now();
        drop(holder);
        let granted = granted_rx.await.expect("the waiter reports");
        samples.0.push(granted.saturating_duration_since(released));
    }
    samples
}

/// Release → grant latencies: (gate, semaphore).
fn release_to_grant(runtime: &Runtime, scale: &Scale) -> (Samples, Samples) {
    let gate = new_gate(UNITS, 1);
    let semaphore = Arc::new(Semaphore::new(UNITS as usize));
    let through_gate = runtime.block_on(gate_release_to_grant(gate, scale.reps));
    let through_semaphore = runtime.block_on(semaphore_release_to_grant(semaphore, scale.reps));
    (through_gate, through_semaphore)
}

/// Resident set size in bytes (Linux), or 0 where `/proc` is missing.
fn rss_bytes() -> f64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    let pages: f64 = statm
        .split_whitespace()
        .nth(1)
        .and_then(|pages| pages.parse().ok())
        .unwrap_or(0.0);
    pages * 4096.0
}

fn live_bytes() -> f64 {
    support::LiveBytes::now() as f64
}

/// What one waiter costs: live heap bytes, RSS bytes where measured, and the size of its
/// future.
struct WaiterCost {
    heap: f64,
    rss: Option<f64>,
    future: usize,
}

/// Polls every future of `waiting` once; each must wait.
async fn poll_once<F: Future>(waiting: &mut [Pin<Box<F>>]) {
    std::future::poll_fn(|cx| {
        for future in waiting.iter_mut() {
            assert!(
                future.as_mut().poll(cx).is_pending(),
                "a waiter was granted a unit that is held"
            );
        }
        Poll::Ready(())
    })
    .await;
}

/// `waiters` acquires parked on a gate whose only unit is held.
fn gate_waiter_cost(runtime: &Runtime, waiters: usize) -> WaiterCost {
    let gate = new_gate(1, waiters);
    runtime.block_on(async {
        let holder = gate
            .acquire(metadata(u64::MAX, 1))
            .await
            .expect("an idle gate grants");
        let mut waiting = Vec::with_capacity(waiters);
        let (heap_before, rss_before) = (live_bytes(), rss_bytes());
        // In batches, each parked before the next is asked for, as waiters arrive at a
        // server: the figure is what a waiter costs while it waits, not a burst of a
        // million requests in flight to the scheduler at once.
        let give_up = Instant::now() + PARK_GIVE_UP;
        for id in 0..waiters as u64 {
            waiting.push(Box::pin(gate.acquire(metadata(id, 1))));
            let asked = waiting.len();
            if asked % 10_000 == 0 || asked == waiters {
                while gate.stats().queued_tasks < asked {
                    assert!(
                        Instant::now() < give_up,
                        "the gate did not report {asked} waiters in {PARK_GIVE_UP:?}"
                    );
                    tokio::task::yield_now().await;
                }
            }
        }
        poll_once(&mut waiting).await;
        let cost = WaiterCost {
            heap: (live_bytes() - heap_before) / waiters as f64,
            rss: Some((rss_bytes() - rss_before) / waiters as f64),
            future: std::mem::size_of_val(&*waiting[0]),
        };
        drop(waiting);
        drop(holder);
        cost
    })
}

/// `waiters` `acquire_many` futures waiting on a semaphore whose only permit is held (heap
/// only: see the module's docs).
fn semaphore_waiter_cost(runtime: &Runtime, waiters: usize) -> WaiterCost {
    let semaphore = Semaphore::new(1);
    runtime.block_on(async {
        let holder = semaphore.acquire_many(1).await.expect("semaphore open");
        let mut waiting = Vec::with_capacity(waiters);
        let heap_before = live_bytes();
        for _ in 0..waiters {
            waiting.push(Box::pin(semaphore.acquire_many(1)));
        }
        poll_once(&mut waiting).await;
        let cost = WaiterCost {
            heap: (live_bytes() - heap_before) / waiters as f64,
            rss: None,
            future: std::mem::size_of_val(&*waiting[0]),
        };
        drop(waiting);
        drop(holder);
        cost
    })
}

fn main() {
    let scale = Scale::from_env();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(CLIENT_THREADS)
        .enable_all()
        .build()
        .expect("client runtime");
    println!(
        "permits: N = {}, C = {} clients on a {CLIENT_THREADS}-thread runtime, D = {} ms, R = {}, \
         S = {}, W = {}, {} CPUs{}",
        thousands(scale.iterations as f64),
        scale.clients,
        scale.loop_time.as_millis(),
        scale.rounds,
        thousands(scale.reps as f64),
        thousands(scale.waiters as f64),
        std::thread::available_parallelism().map_or(0, usize::from),
        if scale.measured {
            ""
        } else {
            " (smoke test: the figures mean nothing)"
        }
    );

    // Memory first, on a heap no other part has used yet.
    let gate_waiter = gate_waiter_cost(&runtime, scale.waiters);
    let semaphore_waiter = semaphore_waiter_cost(&runtime, scale.waiters);
    let (mut gate_uncontended, mut semaphore_uncontended) = uncontended(&runtime, &scale);
    let (gate_loop, semaphore_loop) = closed_loops(&runtime, &scale);
    let (mut gate_grant, mut semaphore_grant) = release_to_grant(&runtime, &scale);

    let ns = |samples: &mut Samples, q| samples.quantile(q).as_nanos() as f64;
    let us = |samples: &mut Samples, q| samples.quantile(q).as_secs_f64() * 1e6;
    println!();
    println!(
        "Uncontended acquire + drop of 1 unit of {UNITS}, one client, {} of each:",
        thousands(scale.iterations as f64)
    );
    println!("| measure | CapacityGate | tokio Semaphore | ratio (gate / semaphore) |");
    println!("|---|---:|---:|---:|");
    for (label, q) in [("p50, ns", 0.50), ("p99, ns", 0.99)] {
        let gate = ns(&mut gate_uncontended, q);
        let semaphore = ns(&mut semaphore_uncontended, q);
        println!("{}", row(label, gate, semaphore, 0));
    }
    println!();
    println!(
        "Closed loop, {} clients, 1 to {MOST_UNITS_PER_ACQUIRE} units of {UNITS} each, one yield while held, {} ms, median of {} rounds:",
        scale.clients,
        scale.loop_time.as_millis(),
        scale.rounds
    );
    println!("| measure | CapacityGate | tokio Semaphore | ratio (gate / semaphore) | target |");
    println!("|---|---:|---:|---:|---:|");
    println!(
        "| acquisitions per s | {} | {} | {} | ≥ 0.25x |",
        thousands(gate_loop),
        thousands(semaphore_loop),
        ratio_text(gate_loop / semaphore_loop)
    );
    println!();
    println!(
        "Release → grant: the holder of all {UNITS} units drops, the waiter for {UNITS} returns, {} times:",
        thousands(scale.reps as f64)
    );
    println!("| measure | CapacityGate | tokio Semaphore | ratio (gate / semaphore) |");
    println!("|---|---:|---:|---:|");
    for (label, q) in [("p50, µs", 0.50), ("p99, µs (target < 100)", 0.99)] {
        let gate = us(&mut gate_grant, q);
        let semaphore = us(&mut semaphore_grant, q);
        println!("{}", row(label, gate, semaphore, 1));
    }
    println!();
    println!(
        "Memory per waiting acquire, {} waiting, each a boxed future polled once (a parked pool task: {POOL_TASK_RSS_BYTES:.0} B RSS):",
        thousands(scale.waiters as f64)
    );
    println!("| measure | CapacityGate | tokio Semaphore | ratio (gate / semaphore) |");
    println!("|---|---:|---:|---:|");
    println!(
        "{}",
        row(
            "live heap, B per waiter",
            gate_waiter.heap,
            semaphore_waiter.heap,
            0
        )
    );
    if let Some(rss) = gate_waiter.rss {
        println!(
            "| RSS, B per waiter | {rss:.0} | – | {} of a parked pool task's |",
            ratio_text(rss / POOL_TASK_RSS_BYTES)
        );
    }
    println!(
        "{}",
        row(
            "the acquire future itself, B",
            gate_waiter.future as f64,
            semaphore_waiter.future as f64,
            0
        )
    );
}
