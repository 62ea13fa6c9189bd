//! A continuous-batching engine on permits: the shape of a vLLM-style server, with the KV
//! cache's blocks handed out by a `CapacityGate`.
//!
//! One engine loop (a tokio task) steps the whole batch every 10 ms: each running sequence
//! generates one token. Request handlers `acquire` the blocks their prompt needs (16 tokens
//! a block), ranked by priority, and hand the sequence with its permit to the loop through a
//! channel. Each step the loop
//!
//! 1. takes in the sequences handed over since the last step;
//! 2. lets go of every sequence whose permit was asked to yield (`is_preempted()`): the gate
//!    asks when a waiter of higher priority could not fit otherwise;
//! 3. generates one token per sequence, best-ranked first, `try_grow`ing its permit by one
//!    block whenever its last block is full. When no block is free (`WouldWait`) the
//!    sequence waits: it starts a `grow(1)`, a claim parked at its permit's rank, and the
//!    loop preempts its own lowest-ranked sequence, as vLLM does, once per step until the
//!    claim is granted. If the gate refuses the claim (`WouldDeadlock`: every other holder
//!    waits to grow as well), the lowest-ranked sequence is preempted, whichever it is;
//! 4. drops the permits of the sequences that are done.
//!
//! A preempted sequence loses its permit and its progress: it goes back to a handler, which
//! acquires its prompt's blocks again, and it is generated from the start (recompute).
//!
//! Why a claim and not a second `try_grow` after the preemption: the blocks a preemption
//! frees go first to the best-ranked ticket waiting at the gate. A claim ranks with its
//! permit, ahead of requests that arrived later, so it gets them; without one they would go
//! to a newcomer, which joins the batch, is the next to be preempted, and the batch churns.
//!
//! The scenario: 64 blocks, preemption on (a request is asked to yield at most 3 times). A
//! burst of low-priority batch requests fills the blocks; once the batch has run for 30 steps,
//! critical chat requests arrive one every 8 steps. The summary gives, per class, the wait
//! for the first blocks (in engine steps and in ms), the preemptions, the tokens generated
//! twice, and the completions. The run fails (exit status 1) unless every chat got its first
//! blocks within 2 steps of asking and every request completed (see `CHAT_WAIT_BOUND_STEPS`
//! for why 2).
//!
//! ```text
//! cargo run --release --example batching_engine
//! cargo run --release --example batching_engine -- --requests 200 --chats 10
//! ```

use std::cmp::Reverse;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::FutureExt;
use prometheus_parking_lot::{
    CapacityGate, Permit, PoolError, Priority, ResourceCost, TaskMetadata, WorkerPoolConfig,
};
use tokio::sync::mpsc;

#[path = "support/flags.rs"]
mod flags;
use flags::Flags;

/// KV-cache blocks on the fake card: the gate's units.
const BLOCKS: u32 = 64;
/// Tokens one block holds.
const TOKENS_PER_BLOCK: u32 = 16;
/// One engine step, in which every running sequence generates one token.
const STEP: Duration = Duration::from_millis(10);
/// How many times the gate may ask one request to yield.
const MAX_YIELDS_PER_REQUEST: u32 = 3;
/// Steps the batch burst runs before the first chat arrives.
const CHATS_AFTER_STEPS: u32 = 30;
/// Steps between two chats.
const CHAT_GAP_STEPS: u32 = 8;
/// The most engine steps a chat may wait for its first blocks. A chat that does not fit
/// makes the gate ask batch permits to yield when it asks. The loop reads `is_preempted()`
/// at the start of every step, drops the permits asked, and their blocks go to the chat,
/// which ranks first. The step counter moves on once when that step starts, and once more
/// if the gate's request landed just after that step's check: so at most 2.
const CHAT_WAIT_BOUND_STEPS: u64 = 2;
/// The run fails if the requests have not all completed by then.
const GIVE_UP: Duration = Duration::from_secs(120);

const USAGE: &str = "\
usage: cargo run --release --example batching_engine -- [--requests N] [--chats N]

  --requests N   low-priority batch requests in the opening burst (default 64)
  --chats N      critical chat requests that arrive once the blocks are full (default 6)";

/// What ends the run early: a gate error, or a check that failed.
type Failure = Box<dyn std::error::Error + Send + Sync>;

/// The two kinds of request in the scenario.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Class {
    /// Offline work: long outputs, lowest priority.
    Batch,
    /// Interactive: short, and must start at once.
    Chat,
}

impl Class {
    fn priority(self) -> Priority {
        match self {
            Class::Batch => Priority::Low,
            Class::Chat => Priority::Critical,
        }
    }
}

/// How long one acquisition waited: engine steps begun meanwhile, and wall time.
#[derive(Debug, Clone, Copy)]
struct Wait {
    steps: u64,
    elapsed: Duration,
}

/// One request and how far its generation got.
struct Sequence {
    id: u64,
    class: Class,
    prompt_tokens: u32,
    output_tokens: u32,
    /// Tokens generated since the sequence last got its blocks (a preemption resets it).
    generated: u32,
    /// How long each acquisition of its prompt's blocks waited, the first one first.
    waits: Vec<Wait>,
    /// Times the gate asked its permit to yield to a request of higher priority.
    yielded: u32,
    /// Times the engine preempted it to find a block for a better-ranked sequence.
    evicted: u32,
    /// Tokens generated and then thrown away by preemptions.
    recomputed_tokens: u32,
}

impl Sequence {
    /// What its handler asks the gate for: the prompt's blocks, at the class's priority.
    fn metadata(&self) -> TaskMetadata {
        TaskMetadata::new(self.id, ResourceCost::gpu_vram(blocks(self.prompt_tokens)))
            .with_priority(self.class.priority())
    }

    /// Blocks it must hold to write its next token.
    fn blocks_for_next_token(&self) -> u32 {
        blocks(self.prompt_tokens + self.generated + 1)
    }

    fn done(&self) -> bool {
        self.generated >= self.output_tokens
    }
}

/// Blocks that hold `tokens` tokens.
fn blocks(tokens: u32) -> u32 {
    tokens.div_ceil(TOKENS_PER_BLOCK)
}

/// The engine's step counter; handlers read it to measure their waits in steps.
#[derive(Default)]
struct StepClock(AtomicU64);

impl StepClock {
    fn now(&self) -> u64 {
        self.0.load(Ordering::Acquire)
    }

    fn advance(&self) {
        self.0.fetch_add(1, Ordering::AcqRel);
    }
}

/// A sequence whose handler got an answer from the gate, on its way to the engine.
struct Admitted {
    sequence: Sequence,
    permit: Result<Permit, PoolError>,
}

/// What the request handlers share: the gate, the step clock, the channel to the engine.
#[derive(Clone)]
struct Handlers {
    gate: Arc<CapacityGate>,
    clock: Arc<StepClock>,
    engine: mpsc::UnboundedSender<Admitted>,
}

impl Handlers {
    /// Starts a handler for `sequence`: it waits for the prompt's blocks, then hands the
    /// sequence and its permit to the engine.
    fn submit(&self, mut sequence: Sequence) {
        let handlers = self.clone();
        tokio::spawn(async move {
            let (asked_at_step, asked_at) = (handlers.clock.now(), Instant::now());
            let permit = handlers.gate.acquire(sequence.metadata()).await;
            sequence.waits.push(Wait {
                steps: handlers.clock.now() - asked_at_step,
                elapsed: asked_at.elapsed(),
            });
            // The engine runs until every request has come back to it, so it is there.
            let _ = handlers.engine.send(Admitted { sequence, permit });
        });
    }
}

/// A sequence in the batch and the blocks it holds.
struct Running {
    sequence: Sequence,
    /// Shared with its claim while one waits.
    permit: Arc<Permit>,
    /// A `grow(1)` not yet granted, polled once a step.
    claim: Option<Claim>,
    /// When it joined the batch (a counter): the latest to join is preempted first.
    joined: u64,
}

/// A ranked wait for one more block: `grow(1)` on the sequence's permit.
type Claim = Pin<Box<dyn Future<Output = Result<(), PoolError>> + Send>>;

impl Running {
    fn claim_block(&mut self) {
        let permit = Arc::clone(&self.permit);
        self.claim = Some(Box::pin(async move { permit.grow(1).await.map(|_| ()) }));
    }

    /// Gives the blocks back: the claim is withdrawn, then the permit dropped.
    fn release(self) -> Sequence {
        let Running {
            sequence,
            permit,
            claim,
            ..
        } = self;
        drop(claim);
        drop(permit);
        sequence
    }
}

/// Where a sequence stands for its next token.
enum Room {
    /// It has the block: it generates.
    Ready,
    /// Its claim waits: it generates nothing this step.
    Waiting,
    /// It was preempted itself and left the batch.
    Preempted,
}

/// Why a running sequence lost its blocks.
enum Cause {
    /// The gate asked it to yield to a request of higher priority.
    AskedToYield,
    /// A better-ranked sequence of the batch needed a block and none was free.
    NoFreeBlock,
}

/// The engine loop and what it owns: the batch and the sequences that are done.
struct Engine {
    handlers: Handlers,
    admitted: mpsc::UnboundedReceiver<Admitted>,
    /// The batch, best-ranked first: highest priority, then longest in the batch.
    running: Vec<Running>,
    joined: u64,
    finished: Vec<Sequence>,
}

impl Engine {
    fn new(handlers: Handlers, admitted: mpsc::UnboundedReceiver<Admitted>) -> Self {
        Self {
            handlers,
            admitted,
            running: Vec::new(),
            joined: 0,
            finished: Vec::new(),
        }
    }

    /// Steps the batch every `STEP` until `total` requests are done.
    async fn run(mut self, total: usize) -> Result<Vec<Sequence>, Failure> {
        let give_up = Instant::now() + GIVE_UP;
        let mut ticker = tokio::time::interval(STEP);
        while self.finished.len() < total {
            ticker.tick().await;
            if Instant::now() > give_up {
                let done = self.finished.len();
                return Err(format!("{done} of {total} requests done after {GIVE_UP:?}").into());
            }
            self.handlers.clock.advance();
            self.take_admitted()?;
            self.yield_where_asked();
            self.decode()?;
            self.retire_done();
        }
        Ok(self.finished)
    }

    /// Adds the sequences handed over since the last step, keeping the batch in rank order.
    fn take_admitted(&mut self) -> Result<(), PoolError> {
        while let Ok(Admitted { sequence, permit }) = self.admitted.try_recv() {
            self.joined += 1;
            let permit = Arc::new(permit?);
            let joined = self.joined;
            self.running.push(Running {
                sequence,
                permit,
                claim: None,
                joined,
            });
        }
        self.running
            .sort_by_key(|running| (Reverse(running.sequence.class.priority()), running.joined));
        Ok(())
    }

    /// Preempts every sequence whose permit the gate asked to yield.
    fn yield_where_asked(&mut self) {
        let (asked, kept): (Vec<Running>, Vec<Running>) = std::mem::take(&mut self.running)
            .into_iter()
            .partition(|running| running.permit.is_preempted());
        self.running = kept;
        for running in asked {
            self.preempt(running, Cause::AskedToYield);
        }
    }

    /// Every sequence of the batch generates one token, best-ranked first, unless it waits
    /// for a block.
    fn decode(&mut self) -> Result<(), PoolError> {
        let mut index = 0;
        while index < self.running.len() {
            match self.make_room(index)? {
                Room::Ready => {
                    self.running[index].sequence.generated += 1;
                    index += 1;
                }
                Room::Waiting => index += 1,
                Room::Preempted => {}
            }
        }
        Ok(())
    }

    /// Whether the sequence at `index` has a block for its next token. When its last block
    /// is full it tries to grow at once; failing that it claims a block and, while the claim
    /// waits, preempts the lowest-ranked sequence of the batch (the last) once a step.
    fn make_room(&mut self, index: usize) -> Result<Room, PoolError> {
        let running = &mut self.running[index];
        // While a claim waits the sequence generates nothing, so the block it brings is the
        // one the next token needs.
        if running.claim.is_none() {
            if running.permit.units() >= running.sequence.blocks_for_next_token() {
                return Ok(Room::Ready);
            }
            match running.permit.try_grow(1) {
                Ok(_) => return Ok(Room::Ready),
                Err(PoolError::WouldWait) => running.claim_block(),
                Err(error) => return Err(error),
            }
        }
        let granted = running
            .claim
            .as_mut()
            .and_then(|claim| claim.as_mut().now_or_never());
        match granted {
            Some(Ok(())) => {
                running.claim = None;
                Ok(Room::Ready)
            }
            Some(Err(PoolError::WouldDeadlock { .. })) => {
                running.claim = None;
                Ok(self.preempt_last(index))
            }
            Some(Err(error)) => Err(error),
            None => {
                if index + 1 < self.running.len() {
                    self.preempt_last(index);
                }
                Ok(Room::Waiting)
            }
        }
    }

    /// Preempts the lowest-ranked sequence of the batch for the one at `index`, which may be
    /// that sequence itself.
    fn preempt_last(&mut self, index: usize) -> Room {
        let Some(victim) = self.running.pop() else {
            return Room::Waiting;
        };
        self.preempt(victim, Cause::NoFreeBlock);
        if index == self.running.len() {
            Room::Preempted
        } else {
            Room::Waiting
        }
    }

    /// Frees the sequence's blocks and sends it back to a handler: it will acquire its
    /// prompt's blocks again and be generated from the start.
    fn preempt(&self, running: Running, cause: Cause) {
        let mut sequence = running.release();
        match cause {
            Cause::AskedToYield => sequence.yielded += 1,
            Cause::NoFreeBlock => sequence.evicted += 1,
        }
        sequence.recomputed_tokens += sequence.generated;
        sequence.generated = 0;
        self.handlers.submit(sequence);
    }

    /// Drops the permits of the sequences that are done, which frees their blocks.
    fn retire_done(&mut self) {
        let (done, running): (Vec<Running>, Vec<Running>) = std::mem::take(&mut self.running)
            .into_iter()
            .partition(|running| running.sequence.done());
        self.running = running;
        self.finished.extend(done.into_iter().map(Running::release));
    }
}

/// A reproducible source of request sizes.
struct Mix(u64);

impl Mix {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    /// A number from `low` to `high`, both included.
    fn between(&mut self, low: u32, high: u32) -> u32 {
        low + (self.next() % u64::from(high - low + 1)) as u32
    }

    /// A request of `class`: batch prompts of 1 to 3 blocks and outputs of 32 to 128
    /// tokens; chat prompts of 1 or 2 blocks and outputs of 16 to 48 tokens.
    fn sequence(&mut self, id: u64, class: Class) -> Sequence {
        let (prompt_tokens, output_tokens) = match class {
            Class::Batch => (self.between(16, 48), self.between(32, 128)),
            Class::Chat => (self.between(8, 32), self.between(16, 48)),
        };
        Sequence {
            id,
            class,
            prompt_tokens,
            output_tokens,
            generated: 0,
            waits: Vec::new(),
            yielded: 0,
            evicted: 0,
            recomputed_tokens: 0,
        }
    }
}

/// The requests arrive: the batch burst at once, then the chats one by one.
async fn arrive(handlers: Handlers, batch: Vec<Sequence>, chats: Vec<Sequence>) {
    for sequence in batch {
        handlers.submit(sequence);
    }
    tokio::time::sleep(STEP * CHATS_AFTER_STEPS).await;
    let stats = handlers.gate.stats();
    println!(
        "first chat arrives: {} of {} blocks held",
        stats.used_units, stats.total_units
    );
    for sequence in chats {
        handlers.submit(sequence);
        tokio::time::sleep(STEP * CHAT_GAP_STEPS).await;
    }
}

/// `12 steps, 118 ms`.
fn wait_text(wait: Wait) -> String {
    format!(
        "{} steps, {:.0} ms",
        wait.steps,
        wait.elapsed.as_secs_f64() * 1_000.0
    )
}

/// One line of the summary: a class's first waits, preemptions and completions.
fn report(class: Class, finished: &[Sequence]) {
    let of_class: Vec<&Sequence> = finished.iter().filter(|s| s.class == class).collect();
    let mut first_waits: Vec<Wait> = of_class
        .iter()
        .filter_map(|s| s.waits.first().copied())
        .collect();
    first_waits.sort_by_key(|wait| wait.elapsed);
    let (Some(median), Some(worst)) = (
        first_waits.get(first_waits.len() / 2).copied(),
        first_waits.last().copied(),
    ) else {
        return;
    };
    println!(
        "{:<7}{:<10}{:>9}{:>20}{:>20}{:>9}{:>9}{:>12}",
        format!("{class:?}").to_lowercase(),
        format!("{:?}", class.priority()),
        of_class.len(),
        wait_text(median),
        wait_text(worst),
        of_class.iter().map(|s| s.yielded).sum::<u32>(),
        of_class.iter().map(|s| s.evicted).sum::<u32>(),
        of_class.iter().map(|s| s.recomputed_tokens).sum::<u32>(),
    );
}

/// Fails unless every chat got its first blocks within the bound and every request
/// generated its whole output.
fn check(finished: &[Sequence], total: usize) -> Result<(), Failure> {
    if finished.len() != total {
        return Err(format!("{} of {total} requests completed", finished.len()).into());
    }
    if let Some(unfinished) = finished.iter().find(|s| !s.done()) {
        return Err(format!(
            "request {} retired before its output was done",
            unfinished.id
        )
        .into());
    }
    for chat in finished.iter().filter(|s| s.class == Class::Chat) {
        let Some(wait) = chat.waits.first() else {
            return Err(format!("chat {} never waited for its blocks", chat.id).into());
        };
        if wait.steps > CHAT_WAIT_BOUND_STEPS {
            return Err(format!(
                "chat {} waited {} for its first blocks; the bound is {CHAT_WAIT_BOUND_STEPS} steps",
                chat.id,
                wait_text(*wait)
            )
            .into());
        }
    }
    Ok(())
}

/// `--requests N` and `--chats N`.
struct Args {
    requests: usize,
    chats: usize,
}

fn parse_args() -> Result<Args, String> {
    let flags = Flags::from_env(USAGE, &["--requests", "--chats"])?;
    Ok(Args {
        requests: flags.number("--requests", "a whole number")?.unwrap_or(64),
        chats: flags.number("--chats", "a whole number")?.unwrap_or(6),
    })
}

#[tokio::main]
async fn main() {
    let args = parse_args().unwrap_or_else(|usage| {
        eprintln!("batching_engine: {usage}");
        std::process::exit(2);
    });
    if let Err(error) = run(args).await {
        eprintln!("batching_engine: {error}");
        std::process::exit(1);
    }
}

async fn run(args: Args) -> Result<(), Failure> {
    let total = args.requests + args.chats;
    let config = WorkerPoolConfig::new()
        .with_max_units(BLOCKS)
        .with_max_queue_depth(total.max(1))
        .with_preemption(MAX_YIELDS_PER_REQUEST);
    let gate = Arc::new(CapacityGate::new(config)?);
    let (to_engine, admitted) = mpsc::unbounded_channel();
    let handlers = Handlers {
        gate,
        clock: Arc::new(StepClock::default()),
        engine: to_engine,
    };
    let mut mix = Mix(0x5eed_b10c_4a11_0c8e);
    let batch = (0..args.requests as u64)
        .map(|id| mix.sequence(id, Class::Batch))
        .collect();
    let chats = (0..args.chats as u64)
        .map(|n| mix.sequence(args.requests as u64 + n, Class::Chat))
        .collect();
    println!(
        "{} batch requests (Low) and {} chats (Critical) on {BLOCKS} KV blocks of \
         {TOKENS_PER_BLOCK} tokens; one engine step every {} ms; a request yields at most \
         {MAX_YIELDS_PER_REQUEST} times",
        args.requests,
        args.chats,
        STEP.as_millis()
    );

    let started = Instant::now();
    let engine = tokio::spawn(Engine::new(handlers.clone(), admitted).run(total));
    tokio::spawn(arrive(handlers.clone(), batch, chats));
    let finished = engine.await??;
    println!(
        "all {total} requests done in {} steps ({:.2} s)\n",
        handlers.clock.now(),
        started.elapsed().as_secs_f64()
    );
    println!(
        "{:<7}{:<10}{:>9}{:>20}{:>20}{:>9}{:>9}{:>12}",
        "class",
        "priority",
        "done",
        "first blocks p50",
        "first blocks max",
        "yielded",
        "evicted",
        "recomputed"
    );
    report(Class::Batch, &finished);
    report(Class::Chat, &finished);
    println!(
        "\n(yielded: asked by the gate for a chat; evicted: preempted by the engine for a block; \
         recomputed: tokens generated again after a preemption)"
    );
    check(&finished, total)
}
