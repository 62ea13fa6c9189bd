//! What a `CapacityGate` permit costs beside `tokio::sync::Semaphore`, the primitive an engine
//! would otherwise count its blocks with, and beside `priority_semaphore::PrioritySemaphore`,
//! a semaphore that ranks its waiters by priority as the gate does. Every figure has its
//! baselines beside it, measured in the same run on the same runtime.
//!
//! - **Uncontended acquire + drop**: one client acquires 1 unit of 64 and drops it, N times
//!   for each subject, in 10 rounds that alternate the subjects (after one warm-up round);
//!   p50 and p99 of each. Two paths: the waiting one (`CapacityGate::acquire`,
//!   `Semaphore::acquire_many(1)`, `PrioritySemaphore::acquire`) and the try one
//!   (`CapacityGate::try_acquire`, `Semaphore::try_acquire_many(1)`,
//!   `PrioritySemaphore::try_acquire`). The gate's metadata is built outside the timed part.
//!   Target: the gate within 3x the semaphore.
//! - **Closed loop**: C clients on a 2-thread runtime each loop: acquire 1 to 8 units of 64
//!   (at random), yield once while holding them, drop. Each round runs D ms; acquisitions per
//!   second, median of R rounds (gate and semaphore alternate). Target: the gate at least
//!   0.25x the semaphore.
//! - **Closed loop, random priority**: C clients on 8 units, 1 unit each, a random priority
//!   (low, normal, high, critical) drawn for each acquisition, one yield while held, drop;
//!   gate, semaphore (`acquire_many(1)`, which ignores the priority) and priority semaphore
//!   (`acquire(priority)`) alternate, D ms a round, median of R rounds. Target: the gate at
//!   least 1x the priority semaphore and at least 0.5x the semaphore.
//! - **Engine step**: a gate of 4,096 units with 256 permits of 1 unit held (acquired up
//!   front); one step is 16 of them, in rotation, each taking one unit more and giving one
//!   back (`Permit::try_grow(1)` then `Permit::shrink(1)`), as an engine's loop grows and
//!   trims its sequences' KV blocks. The same step on a semaphore of 4,096 permits with 256
//!   held: `merge(try_acquire_many(1))` then drop `split(1)`. T steps of each, alternating in
//!   10 rounds after a warm-up one; p50 and p99 per step. Target: the gate within 3x the
//!   semaphore.
//! - **Release → grant**: a holder holds all 64 units; one waiter asks for all 64 and waits
//!   (1 ms to park); the time from the holder's drop to the moment the waiter's acquire
//!   returns, S times; p50 and p99. Target: the gate's p99 at most 1.5x the semaphore's.
//! - **Memory per waiter**: a gate of 1 unit, held; W acquires of 1 unit, each a boxed future
//!   kept in a `Vec` allocated beforehand, asked for in batches of 10,000 (each parked before
//!   the next batch is asked, as waiters arrive at a server), then polled once. The live heap (a
//!   counting global allocator) and the resident set (`/proc/self/statm`) are read before
//!   and once the gate reports W waiting; the difference over W is the cost of one waiter,
//!   its future included. The same with W waiting `Semaphore::acquire_many` futures (heap
//!   only: it runs second, on pages the gate's waiters gave back, so its RSS would read low).
//!   For comparison, a parked pool task costs 368 B of RSS (`pool_memory`, BENCHMARKS.md).
//!
//! Nothing waits forever: a closed-loop client still waiting 5 s after its round ends is
//! given up on and the subject's figure reads "stalled"; any part that makes no progress for
//! a minute (plus the loop time) is named and the run exits non-zero.
//!
//! `cargo bench -p prometheus_parking_lot_benches --bench permits` runs N = 100,000, C = 64, D =
//! 2,000 ms, R = 3, T = 20,000, S = 2,000, W = 1,000,000 (override with `PERMITS_ITERATIONS`,
//! `PERMITS_CLIENTS`, `PERMITS_LOOP_MS`, `PERMITS_ROUNDS`, `PERMITS_STEPS`, `PERMITS_REPS`,
//! `PERMITS_WAITERS`). Under `cargo test` (no `--bench` argument) it runs every part at a small
//! scale as a smoke test: the tables print, their figures mean nothing. `scripts/bench.sh permits`
//! runs it and rewrites its block of BENCHMARKS.md.

#[path = "support/mod.rs"]
mod support;

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::Poll;
use std::time::{Duration, Instant};

use priority_semaphore::PrioritySemaphore;
use prometheus_parking_lot::{
    CapacityGate, Priority, ResourceCost, TaskMetadata, WorkerPoolConfig,
};
use tokio::runtime::Runtime;
use tokio::sync::{oneshot, Semaphore};

#[global_allocator]
static ALLOCATOR: support::LiveBytes = support::LiveBytes;

/// Threads of the clients' tokio runtime (as in `end_to_end`).
const CLIENT_THREADS: usize = 2;
/// Units of the gate and permits of the semaphores, in the uncontended, closed-loop and
/// release → grant parts.
const UNITS: u32 = 64;
/// The most units one closed-loop client asks for at a time.
const MOST_UNITS_PER_ACQUIRE: u32 = 8;
/// Units of the closed loop with a random priority per acquisition (1 unit each).
const PRIORITY_LOOP_UNITS: u32 = 8;
/// Rounds of the uncontended and engine-step parts (one more runs first as a warm-up).
const ALTERNATING_ROUNDS: usize = 10;
/// Units of the engine-step gate and semaphore.
const ENGINE_UNITS: u32 = 4_096;
/// Permits of 1 unit the engine holds through the engine-step part.
const ENGINE_HELD: usize = 256;
/// Permits that grow by one unit and shrink back in one engine step.
const ENGINE_STEP: usize = 16;
/// How long the release → grant waiter is given to park before the holder lets go.
const PARK_TIME: Duration = Duration::from_millis(1);
/// How long the memory part waits for the gate to report every waiter.
const PARK_GIVE_UP: Duration = Duration::from_secs(300);
/// How long closed-loop clients have to finish once a round ends before they count as
/// stalled.
const STALL_GRACE: Duration = Duration::from_secs(5);
/// How long a part may go without progress (beyond the loop time) before the run is ended.
const STALL_LIMIT: Duration = Duration::from_secs(60);
/// RSS per parked pool task, from `pool_memory` (BENCHMARKS.md), for comparison.
const POOL_TASK_RSS_BYTES: f64 = 368.0;

/// The run's size: the real benchmark, or a smoke test under `cargo test`.
struct Scale {
    measured: bool,
    iterations: usize,
    clients: u64,
    loop_time: Duration,
    rounds: usize,
    steps: usize,
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
            steps: pick("PERMITS_STEPS", 20_000, 200) as usize,
            reps: pick("PERMITS_REPS", 2_000, 50) as usize,
            waiters: pick("PERMITS_WAITERS", 1_000_000, 5_000) as usize,
        }
    }
}

/// The part under way, for the watchdog.
static PART: Mutex<&str> = Mutex::new("starting");
/// A count that moves while the part under way works.
static PROGRESS: AtomicU64 = AtomicU64::new(0);

/// Notes that `part` is under way and moving. Called outside every timed stretch.
fn progress(part: &'static str) {
    *PART.lock().unwrap_or_else(PoisonError::into_inner) = part;
    PROGRESS.fetch_add(1, Ordering::Relaxed);
}

/// Ends the run, naming the part, once it has made no progress for `limit`: a subject that
/// stalls is reported rather than waited on forever.
fn start_watchdog(limit: Duration) {
    std::thread::Builder::new()
        .name("permits-watchdog".into())
        .spawn(move || {
            let (mut seen, mut since) = (PROGRESS.load(Ordering::Relaxed), Instant::now());
            loop {
                std::thread::sleep(Duration::from_millis(250));
                let now = PROGRESS.load(Ordering::Relaxed);
                if now != seen {
                    (seen, since) = (now, Instant::now());
                } else if since.elapsed() >= limit {
                    let part = *PART.lock().unwrap_or_else(PoisonError::into_inner);
                    println!();
                    println!("permits: STALLED: {part} made no progress for {limit:?}");
                    eprintln!("permits: STALLED: {part} made no progress for {limit:?}");
                    std::process::exit(2);
                }
            }
        })
        .expect("watchdog thread");
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
    /// Keeps `took` unless this is a warm-up.
    fn record(&mut self, warm_up: bool, took: Duration) {
        if !warm_up {
            self.0.push(took);
        }
    }

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

/// [`row`] with a target column.
fn target_row(measure: &str, gate: f64, semaphore: f64, decimals: usize, target: &str) -> String {
    format!("{} {target} |", row(measure, gate, semaphore, decimals))
}

/// Acquire + drop latencies of one client on idle subjects, through the waiting path and the
/// try path.
#[derive(Default)]
struct Uncontended {
    gate: Samples,
    semaphore: Samples,
    priority: Samples,
    gate_try: Samples,
    semaphore_try: Samples,
    priority_try: Samples,
}

/// Acquire + drop latencies, one client, the subjects alternating round by round.
fn uncontended(runtime: &Runtime, scale: &Scale) -> Uncontended {
    let gate = new_gate(UNITS, 1);
    let semaphore = Semaphore::new(UNITS as usize);
    let priority = Arc::new(PrioritySemaphore::new(UNITS as usize));
    let per_round = scale.iterations.div_ceil(ALTERNATING_ROUNDS);
    runtime.block_on(async {
        let mut out = Uncontended::default();
        for samples in [
            &mut out.gate,
            &mut out.semaphore,
            &mut out.priority,
            &mut out.gate_try,
            &mut out.semaphore_try,
            &mut out.priority_try,
        ] {
            samples.0.reserve(per_round * ALTERNATING_ROUNDS);
        }
        let mut id = 0u64;
        for round in 0..=ALTERNATING_ROUNDS {
            let warm_up = round == 0;
            progress("uncontended, CapacityGate::acquire");
            for _ in 0..per_round {
                id += 1;
                let meta = metadata(id, 1);
                let began = Instant::now();
                let permit = gate.acquire(meta).await.expect("an idle gate grants");
                drop(permit);
                out.gate.record(warm_up, began.elapsed());
            }
            progress("uncontended, Semaphore::acquire_many");
            for _ in 0..per_round {
                let began = Instant::now();
                let permit = semaphore.acquire_many(1).await.expect("semaphore open");
                drop(permit);
                out.semaphore.record(warm_up, began.elapsed());
            }
            progress("uncontended, PrioritySemaphore::acquire");
            for _ in 0..per_round {
                let began = Instant::now();
                let permit = priority.acquire(0).await.expect("semaphore open");
                drop(permit);
                out.priority.record(warm_up, began.elapsed());
            }
            // The try paths wait for nothing but, for the gate, one trip to its scheduler
            // (on threads of its own) and back: fine on this thread.
            progress("uncontended, CapacityGate::try_acquire");
            for _ in 0..per_round {
                id += 1;
                let meta = metadata(id, 1);
                let began = Instant::now();
                let permit = gate.try_acquire(meta).expect("an idle gate grants at once");
                drop(permit);
                out.gate_try.record(warm_up, began.elapsed());
            }
            progress("uncontended, Semaphore::try_acquire_many");
            for _ in 0..per_round {
                let began = Instant::now();
                let permit = semaphore.try_acquire_many(1).expect("a permit is free");
                drop(permit);
                out.semaphore_try.record(warm_up, began.elapsed());
            }
            progress("uncontended, PrioritySemaphore::try_acquire");
            for _ in 0..per_round {
                let began = Instant::now();
                let permit = priority.try_acquire(0).expect("a permit is free");
                drop(permit);
                out.priority_try.record(warm_up, began.elapsed());
            }
        }
        out
    })
}

/// A client's source of unit counts and priorities, reproducible per client.
struct Mix(u64);

impl Mix {
    fn for_client(client: u64) -> Self {
        Self(0x9e37_79b9_7f4a_7c15 ^ (client + 1).wrapping_mul(0xbf58_476d_1ce4_e5b9))
    }

    fn step(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    /// 1 to `MOST_UNITS_PER_ACQUIRE` units.
    fn units(&mut self) -> u32 {
        1 + (self.step() % u64::from(MOST_UNITS_PER_ACQUIRE)) as u32
    }

    /// An index into `Priority::ALL` (lowest first), so also the rank a priority semaphore is
    /// given.
    fn priority(&mut self) -> usize {
        (self.step() % Priority::ALL.len() as u64) as usize
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
    let mut mix = Mix::for_client(client);
    let mut done = 0;
    while !stop.load(Ordering::Relaxed) {
        let meta = metadata(first_id + done, mix.units());
        let permit = gate.acquire(meta).await.expect("the gate grants");
        tokio::task::yield_now().await;
        drop(permit);
        done += 1;
    }
    done
}

/// One closed-loop client on the semaphore.
async fn semaphore_client(semaphore: Arc<Semaphore>, client: u64, stop: Arc<AtomicBool>) -> u64 {
    let mut mix = Mix::for_client(client);
    let mut done = 0;
    while !stop.load(Ordering::Relaxed) {
        let permit = semaphore
            .acquire_many(mix.units())
            .await
            .expect("semaphore open");
        tokio::task::yield_now().await;
        drop(permit);
        done += 1;
    }
    done
}

/// One client of the random-priority loop on the gate: 1 unit, a random priority each time.
async fn gate_priority_client(
    gate: Arc<CapacityGate>,
    client: u64,
    first_id: u64,
    stop: Arc<AtomicBool>,
) -> u64 {
    let mut mix = Mix::for_client(client);
    let mut done = 0;
    while !stop.load(Ordering::Relaxed) {
        let meta = metadata(first_id + done, 1).with_priority(Priority::ALL[mix.priority()]);
        let permit = gate.acquire(meta).await.expect("the gate grants");
        tokio::task::yield_now().await;
        drop(permit);
        done += 1;
    }
    done
}

/// The same on the semaphore, which has no priorities (drawn all the same, for the same work).
async fn semaphore_one_client(
    semaphore: Arc<Semaphore>,
    client: u64,
    stop: Arc<AtomicBool>,
) -> u64 {
    let mut mix = Mix::for_client(client);
    let mut done = 0;
    while !stop.load(Ordering::Relaxed) {
        std::hint::black_box(mix.priority());
        let permit = semaphore.acquire_many(1).await.expect("semaphore open");
        tokio::task::yield_now().await;
        drop(permit);
        done += 1;
    }
    done
}

/// The same on the priority semaphore, at the drawn priority (one permit each).
async fn priority_semaphore_client(
    semaphore: Arc<PrioritySemaphore>,
    client: u64,
    stop: Arc<AtomicBool>,
) -> u64 {
    let mut mix = Mix::for_client(client);
    let mut done = 0;
    while !stop.load(Ordering::Relaxed) {
        let permit = semaphore
            .acquire(mix.priority() as i32)
            .await
            .expect("semaphore open");
        tokio::task::yield_now().await;
        drop(permit);
        done += 1;
    }
    done
}

/// One closed-loop round: acquisitions per second, or what stalled or failed.
type Round = Result<f64, String>;

/// Runs `clients` clients for the loop time; acquisitions per second. Clients still waiting
/// `STALL_GRACE` after the stop are aborted and the round reads as stalled.
fn closed_loop<Fut>(
    runtime: &Runtime,
    scale: &Scale,
    part: &'static str,
    client: impl Fn(u64, Arc<AtomicBool>) -> Fut,
) -> Round
where
    Fut: Future<Output = u64> + Send + 'static,
{
    progress(part);
    let stop = Arc::new(AtomicBool::new(false));
    let began = Instant::now();
    let mut handles: Vec<_> = (0..scale.clients)
        .map(|n| runtime.spawn(client(n, stop.clone())))
        .collect();
    std::thread::sleep(scale.loop_time);
    stop.store(true, Ordering::Relaxed);
    let window = began.elapsed();
    progress(part);
    let (done, stalled, failed) = runtime.block_on(async {
        let give_up = tokio::time::Instant::now() + STALL_GRACE;
        let (mut done, mut stalled, mut failed) = (0u64, 0usize, 0usize);
        for handle in &mut handles {
            match tokio::time::timeout_at(give_up, &mut *handle).await {
                Ok(Ok(count)) => done += count,
                Ok(Err(_)) => failed += 1,
                Err(_) => {
                    handle.abort();
                    stalled += 1;
                }
            }
        }
        (done, stalled, failed)
    });
    if stalled > 0 {
        return Err(format!(
            "stalled ({stalled} of {} clients still waiting {STALL_GRACE:?} after the round)",
            scale.clients
        ));
    }
    if failed > 0 {
        return Err(format!(
            "failed ({failed} of {} clients panicked)",
            scale.clients
        ));
    }
    Ok(done as f64 / window.as_secs_f64())
}

/// The median of the rounds, or the first failure among them.
fn median_round(rounds: &[Round]) -> Round {
    let mut per_s = Vec::with_capacity(rounds.len());
    for round in rounds {
        per_s.push(round.clone()?);
    }
    Ok(support::median(&per_s))
}

/// A round's figure for a table: acquisitions per second, or why there is none.
fn round_text(round: &Round) -> String {
    match round {
        Ok(per_s) => thousands(*per_s),
        Err(why) => why.clone(),
    }
}

/// The ratio of two rounds, or "–" where either has no figure.
fn round_ratio(over: &Round, under: &Round) -> String {
    match (over, under) {
        (Ok(over), Ok(under)) => ratio_text(over / under),
        _ => "–".to_owned(),
    }
}

/// Acquisitions per second, median of the rounds: (gate, semaphore).
fn closed_loops(runtime: &Runtime, scale: &Scale) -> (Round, Round) {
    let gate = new_gate(UNITS, scale.clients as usize);
    let semaphore = Arc::new(Semaphore::new(UNITS as usize));
    let (mut through_gate, mut through_semaphore) = (Vec::new(), Vec::new());
    for round in 0..scale.rounds as u64 {
        through_gate.push(closed_loop(
            runtime,
            scale,
            "closed loop, CapacityGate",
            |client, stop| {
                let first_id = (round << 48) | (client << 32);
                gate_client(gate.clone(), client, first_id, stop)
            },
        ));
        through_semaphore.push(closed_loop(
            runtime,
            scale,
            "closed loop, tokio Semaphore",
            |client, stop| semaphore_client(semaphore.clone(), client, stop),
        ));
    }
    (
        median_round(&through_gate),
        median_round(&through_semaphore),
    )
}

/// The random-priority loop, acquisitions per second, median of the rounds: (gate,
/// semaphore, priority semaphore).
fn priority_loops(runtime: &Runtime, scale: &Scale) -> (Round, Round, Round) {
    let gate = new_gate(PRIORITY_LOOP_UNITS, scale.clients as usize);
    let semaphore = Arc::new(Semaphore::new(PRIORITY_LOOP_UNITS as usize));
    let priority = Arc::new(PrioritySemaphore::new(PRIORITY_LOOP_UNITS as usize));
    let (mut through_gate, mut through_semaphore, mut through_priority) =
        (Vec::new(), Vec::new(), Vec::new());
    for round in 0..scale.rounds as u64 {
        through_gate.push(closed_loop(
            runtime,
            scale,
            "closed loop with random priorities, CapacityGate",
            |client, stop| {
                let first_id = (round << 48) | (client << 32);
                gate_priority_client(gate.clone(), client, first_id, stop)
            },
        ));
        through_semaphore.push(closed_loop(
            runtime,
            scale,
            "closed loop with random priorities, tokio Semaphore",
            |client, stop| semaphore_one_client(semaphore.clone(), client, stop),
        ));
        through_priority.push(closed_loop(
            runtime,
            scale,
            "closed loop with random priorities, PrioritySemaphore",
            |client, stop| priority_semaphore_client(priority.clone(), client, stop),
        ));
    }
    (
        median_round(&through_gate),
        median_round(&through_semaphore),
        median_round(&through_priority),
    )
}

/// Engine-step latencies: (gate, semaphore). Runs on this thread, outside the runtime, as an
/// engine's loop would.
fn engine_steps(scale: &Scale) -> (Samples, Samples) {
    let gate = new_gate(ENGINE_UNITS, 1);
    let gate_held: Vec<_> = (0..ENGINE_HELD as u64)
        .map(|id| {
            gate.try_acquire(metadata(id, 1))
                .expect("an idle gate grants at once")
        })
        .collect();
    let semaphore = Semaphore::new(ENGINE_UNITS as usize);
    let mut semaphore_held: Vec<_> = (0..ENGINE_HELD)
        .map(|_| semaphore.try_acquire_many(1).expect("a permit is free"))
        .collect();
    let per_round = scale.steps.div_ceil(ALTERNATING_ROUNDS);
    let (mut through_gate, mut through_semaphore) = (Samples::default(), Samples::default());
    through_gate.0.reserve(per_round * ALTERNATING_ROUNDS);
    through_semaphore.0.reserve(per_round * ALTERNATING_ROUNDS);
    let (mut gate_next, mut semaphore_next) = (0, 0);
    for round in 0..=ALTERNATING_ROUNDS {
        let warm_up = round == 0;
        progress("engine step, CapacityGate");
        for _ in 0..per_round {
            let began = Instant::now();
            for _ in 0..ENGINE_STEP {
                let permit = &gate_held[gate_next];
                permit.try_grow(1).expect("a free unit is granted at once");
                permit.shrink(1);
                gate_next = (gate_next + 1) % ENGINE_HELD;
            }
            through_gate.record(warm_up, began.elapsed());
        }
        progress("engine step, tokio Semaphore");
        for _ in 0..per_round {
            let began = Instant::now();
            for _ in 0..ENGINE_STEP {
                let permit = &mut semaphore_held[semaphore_next];
                permit.merge(semaphore.try_acquire_many(1).expect("a permit is free"));
                drop(permit.split(1).expect("two permits held"));
                semaphore_next = (semaphore_next + 1) % ENGINE_HELD;
            }
            through_semaphore.record(warm_up, began.elapsed());
        }
    }
    drop(gate_held);
    drop(semaphore_held);
    (through_gate, through_semaphore)
}

/// Release → grant through the gate: a holder of every unit drops, a waiter for every unit
/// is granted.
async fn gate_release_to_grant(gate: Arc<CapacityGate>, reps: usize) -> Samples {
    let mut samples = Samples::default();
    for rep in 0..reps as u64 {
        progress("release → grant, CapacityGate");
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
        progress("release → grant, tokio Semaphore");
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
                progress("memory per waiter, CapacityGate");
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
    progress("memory per waiter, tokio Semaphore");
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
    start_watchdog(STALL_LIMIT + scale.loop_time);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(CLIENT_THREADS)
        .enable_all()
        .build()
        .expect("client runtime");
    println!(
        "permits: N = {}, C = {} clients on a {CLIENT_THREADS}-thread runtime, D = {} ms, R = {}, \
         T = {}, S = {}, W = {}, {} CPUs{}",
        thousands(scale.iterations as f64),
        scale.clients,
        scale.loop_time.as_millis(),
        scale.rounds,
        thousands(scale.steps as f64),
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
    let mut alone = uncontended(&runtime, &scale);
    let (gate_loop, semaphore_loop) = closed_loops(&runtime, &scale);
    let (gate_ranked, semaphore_ranked, priority_ranked) = priority_loops(&runtime, &scale);
    let (mut gate_step, mut semaphore_step) = engine_steps(&scale);
    let (mut gate_grant, mut semaphore_grant) = release_to_grant(&runtime, &scale);
    progress("printing");

    let ns = |samples: &mut Samples, q| samples.quantile(q).as_nanos() as f64;
    let us = |samples: &mut Samples, q| samples.quantile(q).as_secs_f64() * 1e6;
    println!();
    println!(
        "Uncontended acquire + drop of 1 unit of {UNITS}, one client, {} of each (waiting: \
         gate acquire, tokio acquire_many(1), priority-semaphore acquire; try: gate \
         try_acquire, tokio try_acquire_many(1), priority-semaphore try_acquire):",
        thousands(scale.iterations as f64)
    );
    println!(
        "| path, measure | CapacityGate | tokio Semaphore | PrioritySemaphore | gate / tokio | \
         priority-semaphore / tokio | target (gate / tokio) |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|");
    for (path, gate, semaphore, priority) in [
        (
            "acquire + drop",
            &mut alone.gate,
            &mut alone.semaphore,
            &mut alone.priority,
        ),
        (
            "try_acquire + drop",
            &mut alone.gate_try,
            &mut alone.semaphore_try,
            &mut alone.priority_try,
        ),
    ] {
        for (label, q) in [("p50, ns", 0.50), ("p99, ns", 0.99)] {
            let (gate, semaphore, priority) = (
                ns(&mut *gate, q),
                ns(&mut *semaphore, q),
                ns(&mut *priority, q),
            );
            println!(
                "| {path}, {label} | {gate:.0} | {semaphore:.0} | {priority:.0} | {} | {} | ≤ 3x |",
                ratio_text(gate / semaphore),
                ratio_text(priority / semaphore)
            );
        }
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
        round_text(&gate_loop),
        round_text(&semaphore_loop),
        round_ratio(&gate_loop, &semaphore_loop)
    );
    println!();
    println!(
        "Closed loop, {} clients, 1 unit of {PRIORITY_LOOP_UNITS} each at a random priority per \
         acquisition (tokio: acquire_many(1), no priority; priority-semaphore: acquire(priority)), \
         one yield while held, {} ms, median of {} rounds:",
        scale.clients,
        scale.loop_time.as_millis(),
        scale.rounds
    );
    println!(
        "| measure | CapacityGate | tokio Semaphore | PrioritySemaphore | gate / tokio | \
         gate / priority-semaphore | target |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|");
    println!(
        "| acquisitions per s | {} | {} | {} | {} | {} | ≥ 0.5x tokio, ≥ 1x priority-semaphore |",
        round_text(&gate_ranked),
        round_text(&semaphore_ranked),
        round_text(&priority_ranked),
        round_ratio(&gate_ranked, &semaphore_ranked),
        round_ratio(&gate_ranked, &priority_ranked)
    );
    println!();
    println!(
        "Engine step: {ENGINE_HELD} permits of 1 unit held of {ENGINE_UNITS}; one step = \
         {ENGINE_STEP} of them in rotation take one unit more and give it back (gate: \
         try_grow(1) + shrink(1); tokio: merge(try_acquire_many(1)) + drop(split(1))), {} steps \
         of each:",
        thousands(scale.steps as f64)
    );
    println!("| measure | CapacityGate | tokio Semaphore | ratio (gate / semaphore) | target |");
    println!("|---|---:|---:|---:|---:|");
    for (label, q) in [("p50, ns per step", 0.50), ("p99, ns per step", 0.99)] {
        let gate = ns(&mut gate_step, q);
        let semaphore = ns(&mut semaphore_step, q);
        println!("{}", target_row(label, gate, semaphore, 0, "≤ 3x"));
    }
    println!();
    println!(
        "Release → grant: the holder of all {UNITS} units drops, the waiter for {UNITS} returns, {} times:",
        thousands(scale.reps as f64)
    );
    println!("| measure | CapacityGate | tokio Semaphore | ratio (gate / semaphore) | target |");
    println!("|---|---:|---:|---:|---:|");
    for (label, q, target) in [("p50, µs", 0.50, "–"), ("p99, µs", 0.99, "≤ 1.5x")] {
        let gate = us(&mut gate_grant, q);
        let semaphore = us(&mut semaphore_grant, q);
        println!("{}", target_row(label, gate, semaphore, 1, target));
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
