//! Property tests of the shell: random event sequences against each storage mode (memory,
//! durable local with either durability, shared), with no runtime. A model world carries out
//! the effects the way the driver and the backends would: workers hold jobs until an event
//! finishes them, the local queue answers its calls in order (or fails them), the shared
//! queue answers each call when an event says so (or fails it).
//!
//! Checked after every event: the core's invariants; every job a worker holds is running
//! in the core on that worker; queue calls for one entry come in order (park, then claim
//! or remove, then settle); an outcome is delivered only after its capacity is released,
//! unless the watchdog or the drain deadline delivered it while the run goes on (then it
//! says `TimedOut` or `Cancelled`); every permit's holder sees the units the core holds for
//! it (acquires, grows, shrinks, withdrawals racing grants, preemption of permits and of
//! running tasks, which then park again and run again); no task steps `Ended` more often
//! than it stepped `Admitted` (a claim is no admission), and the counters never read more
//! outcomes than submissions. Checked at the end, once every run finished and every
//! call was answered: every accepted task reached exactly one terminal outcome, or was
//! abandoned (no outcome) when a retrieve of it gave up, or is still held by a durable or
//! shared queue; nothing refused was delivered; no capacity is held.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use proptest::prelude::*;
use tokio::sync::{oneshot, Notify};

mod backends;
mod checks;
mod effects;
mod permits;
mod shedding;
mod sleepers;

use super::effects::Effect;
use super::storage::shared::{SharedCall, SharedReport};
use super::storage::{LocalRoom, MemoryRoom, SharedRoom, Storage};
use super::waiters::GaveUp;
use super::{Shell, ShellArgs};
use crate::domain::{
    Durability, MailboxKey, OnGiveUp, PoolError, PoolLimits, Preemption, Priority, ResourceCost,
    ScheduledTask, TaskFailure, TaskId, TaskMetadata,
};
use crate::mailbox::{Delivery, Mailbox, MailboxError};
use crate::observe::events::{EventSubscriber, TaskEvent, TaskStep};
use crate::observe::stats::PoolCounters;
use crate::permit::lane::Lanes;
use crate::permit::{
    acquire_from_lane, grow_from_lane, shrink_holding, AcquireAnswer, GrowAnswer, Holding,
    PermitOp, PermitPort,
};
use crate::queue::actor::QueueMsg;
use crate::queue::{DeadLetter, EntryId};
use crate::scheduler::core::ParkingLot;
use crate::scheduler::protocol::{Reply, SubmitOptions};

/// The storage mode a run drives.
#[derive(Debug, Clone, Copy)]
enum Mode {
    Memory,
    Local(Durability),
    Shared {
        durability: Durability,
        claim_ahead: usize,
    },
}

/// One event of a run.
#[derive(Debug, Clone)]
enum Event {
    /// A submission: priority, units, a deadline `ms` ahead, a timeout, a tenant (`None`:
    /// anonymous), and whether it reuses the last id.
    Submit {
        priority: u8,
        units: u32,
        deadline: Option<u64>,
        timeout: Option<u64>,
        tenant: Option<u8>,
        duplicate: bool,
    },
    /// A submission of tenant `tenant` depending on earlier submissions (each the `n`th
    /// submitted, modulo their count), running anyway or not: held in memory mode (where a
    /// parent of another tenant, an anonymous one or itself is refused), refused elsewhere.
    SubmitAfter {
        units: u32,
        tenant: u8,
        parents: Vec<usize>,
        run_anyway: bool,
    },
    /// The `n`th busy worker's run ends: well, with an error, or `Failed`; with `rests`, its
    /// thread still has work the task left on it.
    Finish { n: usize, outcome: u8, rests: bool },
    /// The `n`th resting worker can take a job again.
    Ready { n: usize },
    /// Cancel the `n`th task submitted.
    Cancel { n: usize },
    /// A retrieve of the `n`th task submitted gave up: by its key alone, or with its id.
    GiveUp { n: usize, by_id: bool },
    /// Time passes.
    Tick { ms: u64 },
    /// The local queue answers its oldest call, or fails it.
    QueueAnswer { fail: bool },
    /// The shared queue answers its `n`th pending call, or fails it.
    SharedAnswer { n: usize, fail: bool },
    /// A poll of the shared queue; with `lose`, the renewal finds every held lease lost.
    Poll { lose: bool },
    /// The shared queue gives up on its `n`th parked task (a dead letter).
    Dead { n: usize },
    /// The supervisor gave up on the pool.
    Escalate,
    /// Shutdown asked; with `deadline`, the drain deadline passes at once.
    Shutdown { deadline: bool },
    /// A permit is asked for: ranked (`wait`) or only at once; with `fast`, through the
    /// fast path first, as a `Gate` does.
    Acquire {
        priority: u8,
        units: u32,
        wait: bool,
        fast: bool,
    },
    /// The scheduler takes in the fast path's registrations (a nudge).
    Nudge,
    /// The `n`th held permit grows: ranked (`wait`) or only at once.
    Grow { n: usize, extra: u32, wait: bool },
    /// The `n`th held permit gives units back.
    Shrink { n: usize, units: u32 },
    /// The `n`th held permit is dropped.
    Release { n: usize },
    /// The `n`th waiter (acquires first, then grows) gives up, as a dropped future does.
    Withdraw { n: usize },
}

fn event() -> impl Strategy<Value = Event> {
    prop_oneof![
        6 => (0u8..4, 1u32..5, prop::option::weighted(0.2, 1u64..50), prop::option::weighted(0.3, 1u64..80), prop::option::of(0u8..3), prop::bool::weighted(0.1))
            .prop_map(|(priority, units, deadline, timeout, tenant, duplicate)| Event::Submit { priority, units, deadline, timeout, tenant, duplicate }),
        2 => (1u32..5, 0u8..3, prop::collection::vec(0usize..40, 1..4), prop::bool::weighted(0.3))
            .prop_map(|(units, tenant, parents, run_anyway)| Event::SubmitAfter { units, tenant, parents, run_anyway }),
        5 => (0usize..4, 0u8..3, prop::bool::weighted(0.2)).prop_map(|(n, outcome, rests)| Event::Finish { n, outcome, rests }),
        1 => (0usize..4).prop_map(|n| Event::Ready { n }),
        1 => (0usize..40).prop_map(|n| Event::Cancel { n }),
        1 => (0usize..40, prop::bool::ANY).prop_map(|(n, by_id)| Event::GiveUp { n, by_id }),
        2 => (1u64..40).prop_map(|ms| Event::Tick { ms }),
        4 => prop::bool::weighted(0.15).prop_map(|fail| Event::QueueAnswer { fail }),
        4 => (0usize..6, prop::bool::weighted(0.15)).prop_map(|(n, fail)| Event::SharedAnswer { n, fail }),
        1 => prop::bool::weighted(0.2).prop_map(|lose| Event::Poll { lose }),
        1 => (0usize..6).prop_map(|n| Event::Dead { n }),
        1 => Just(Event::Escalate),
        1 => prop::bool::ANY.prop_map(|deadline| Event::Shutdown { deadline }),
        3 => (0u8..4, 1u32..5, prop::bool::weighted(0.8), prop::bool::ANY).prop_map(|(priority, units, wait, fast)| Event::Acquire { priority, units, wait, fast }),
        1 => Just(Event::Nudge),
        2 => (0usize..4, 1u32..4, prop::bool::ANY).prop_map(|(n, extra, wait)| Event::Grow { n, extra, wait }),
        1 => (0usize..4, 1u32..4).prop_map(|(n, units)| Event::Shrink { n, units }),
        3 => (0usize..4).prop_map(|n| Event::Release { n }),
        2 => (0usize..4).prop_map(|n| Event::Withdraw { n }),
    ]
}

const PRIORITIES: [Priority; 4] = [
    Priority::Low,
    Priority::Normal,
    Priority::High,
    Priority::Critical,
];

/// Takes an answer if it came, as a holder's future would when woken.
fn taken<T>(answer: &crate::permit::answer::Answer<T>) -> Option<T> {
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    match answer.poll_take(&mut cx) {
        std::task::Poll::Ready(value) => Some(value),
        std::task::Poll::Pending => None,
    }
}

/// A mailbox the shell only reads (for its bound): it has no inline face, so no bound.
struct NoMailbox;

/// The permits' port: what holders send waits here until the scheduler takes it.
#[derive(Default)]
struct Port {
    lanes: Arc<Lanes>,
    ops: std::sync::Mutex<Vec<PermitOp>>,
}

impl PermitPort for Port {
    fn send(&self, op: PermitOp) {
        self.ops.lock().expect("port").push(op);
    }

    fn lanes(&self) -> &Lanes {
        &self.lanes
    }

    fn nudge(&self) {}
}

#[async_trait]
impl Mailbox<u32> for NoMailbox {
    fn backend(&self) -> &'static str {
        "none"
    }
    async fn store(&self, _: &MailboxKey, _: Delivery<u32>) -> Result<(), MailboxError> {
        Ok(())
    }
    async fn take(&self, _: &MailboxKey) -> Result<Option<Delivery<u32>>, MailboxError> {
        Ok(None)
    }
    async fn take_task(
        &self,
        _: &MailboxKey,
        _: TaskId,
    ) -> Result<Option<Delivery<u32>>, MailboxError> {
        Ok(None)
    }
    async fn list(&self, _: &MailboxKey) -> Result<Vec<TaskId>, MailboxError> {
        Ok(Vec::new())
    }
    async fn purge_stored_before(&self, _: u64) -> Result<usize, MailboxError> {
        Ok(0)
    }
    async fn stored_count(&self) -> Result<usize, MailboxError> {
        Ok(0)
    }
    fn subscribe(&self, _: &MailboxKey) -> Arc<Notify> {
        Arc::new(Notify::new())
    }
}

/// Hears every step and notes, per task, its admissions and ends, and any end that came
/// without an admission before it.
#[derive(Default)]
struct Steps {
    /// Per (key, id): `Admitted` steps, `Ended` steps.
    counts: std::sync::Mutex<HashMap<(MailboxKey, TaskId), (u32, u32)>>,
    /// Ends that outnumbered their task's admissions.
    unadmitted_ends: std::sync::Mutex<Vec<String>>,
}

impl EventSubscriber for Steps {
    fn on_event(&self, event: &TaskEvent<'_>) {
        let mut counts = self.counts.lock().expect("steps");
        let task = (event.key.clone(), event.task_id);
        let (admitted, ended) = counts.entry(task).or_default();
        match event.step {
            TaskStep::Admitted => *admitted += 1,
            TaskStep::Ended(status) => {
                *ended += 1;
                if *ended > *admitted {
                    let end = format!("task {} ended {status:?} unadmitted", event.task_id);
                    self.unadmitted_ends.lock().expect("steps").push(end);
                }
            }
            _ => {}
        }
    }
}

/// Where a queue call for one entry stands (the order rule).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum QueueStep {
    Parked,
    Claimed,
    Over,
}

/// The world the shell's effects act on. See the module docs.
struct World {
    mode: Mode,
    shell: Shell<u32, u32>,
    now: u64,
    next_id: TaskId,
    /// Every submission's id, key (once known) and answer.
    submissions: Vec<(TaskId, Option<MailboxKey>)>,
    answers: Vec<(TaskId, oneshot::Receiver<Result<MailboxKey, PoolError>>)>,
    /// How many submissions of each (key, id) were accepted (an id may be reused once
    /// its first task ended).
    accepted: HashMap<(MailboxKey, TaskId), usize>,
    refused: HashSet<TaskId>,
    delivered: HashMap<(MailboxKey, TaskId), usize>,
    /// Tasks abandoned when a retrieve gave up: they end with no outcome delivered.
    abandoned: HashMap<(MailboxKey, TaskId), usize>,
    /// Jobs the workers hold: (worker, entry, key, id).
    running: Vec<(usize, EntryId, MailboxKey, TaskId)>,
    /// Which entry each started task ran under.
    entry_of: HashMap<(MailboxKey, TaskId), EntryId>,
    /// The local queue: calls in order, what it stores, where each entry stands.
    queue_calls: VecDeque<QueueMsg<u32>>,
    stored: HashMap<EntryId, ScheduledTask<u32>>,
    claimed: HashSet<EntryId>,
    order: HashMap<EntryId, QueueStep>,
    /// The shared queue: calls not yet answered, what is parked, what is claimed.
    shared_calls: Vec<SharedCall<u32>>,
    shared_parked: Vec<(EntryId, u64, ScheduledTask<u32>)>,
    shared_claimed: HashMap<EntryId, ScheduledTask<u32>>,
    shared_held: Vec<EntryId>,
    /// Shared entries whose claims a renewal found lost: nothing may be published or
    /// settled under them.
    shared_lost: HashSet<EntryId>,
    /// Tasks whose claims this node lost or handed back: another node (or the queue) may end
    /// them while this node's stopped run winds down.
    given_back: HashSet<(MailboxKey, TaskId)>,
    /// Workers whose slot rests (their thread still busy after a task).
    resting: Vec<usize>,
    /// Permits granted and taken by their holders (on the fast path or the scheduler's).
    permits: Vec<Arc<Holding>>,
    /// Acquires and grows not answered yet.
    acquires: Vec<Arc<AcquireAnswer>>,
    grows: Vec<(Arc<Holding>, u32, Arc<GrowAnswer>)>,
    /// Where holders' requests wait for the scheduler; its lanes are the shell's.
    port: Arc<Port>,
    /// Every task's admissions and ends, as the shell stepped them.
    steps: Arc<Steps>,
}

impl World {
    fn new(mode: Mode) -> Self {
        // Bounds a run reaches: tasks and permits of a higher priority shed parked ones
        // (core rule 21), which must end refused exactly once, whatever the storage.
        let limits = PoolLimits::new(6, 2)
            .with_max_queue_depth(6)
            .with_max_queued_units(Some(12))
            .with_preemption(Some(Preemption::new(2)))
            .with_on_give_up(Some(OnGiveUp::Abandon));
        let storage: Storage<u32, u32> = match mode {
            Mode::Memory => Box::new(MemoryRoom),
            Mode::Local(durability) => Box::new(LocalRoom::new(durability)),
            Mode::Shared {
                durability,
                claim_ahead,
            } => Box::new(SharedRoom::new(
                "model",
                Duration::from_millis(300),
                claim_ahead,
                durability,
            )),
        };
        let port = Arc::new(Port::default());
        let steps = Arc::new(Steps::default());
        let args = ShellArgs {
            pool: Arc::from("model"),
            core: ParkingLot::new(limits).expect("limits"),
            default_timeout: None,
            storage,
            counters: Arc::new(PoolCounters::default()),
            subscribers: vec![steps.clone()],
            mailbox: Arc::new(NoMailbox),
            results_watch: None,
            gpu_sampled: false,
            lanes: port.lanes.clone(),
            tenant_weights: Default::default(),
            rerun: {
                // Running tasks may be preempted and run again (memory mode only: the other
                // modes must ignore it).
                let rerun: super::Rerun<u32> = Arc::default();
                let _ = rerun.set(<u32 as Clone>::clone);
                rerun
            },
        };
        let now = 1_000_000;
        Self {
            mode,
            shell: Shell::new(args, Vec::new(), now),
            now,
            next_id: 1,
            submissions: Vec::new(),
            answers: Vec::new(),
            accepted: HashMap::new(),
            refused: HashSet::new(),
            delivered: HashMap::new(),
            abandoned: HashMap::new(),
            running: Vec::new(),
            entry_of: HashMap::new(),
            queue_calls: VecDeque::new(),
            stored: HashMap::new(),
            claimed: HashSet::new(),
            order: HashMap::new(),
            shared_calls: Vec::new(),
            shared_parked: Vec::new(),
            shared_claimed: HashMap::new(),
            shared_held: Vec::new(),
            shared_lost: HashSet::new(),
            given_back: HashSet::new(),
            resting: Vec::new(),
            permits: Vec::new(),
            acquires: Vec::new(),
            grows: Vec::new(),
            port,
            steps,
        }
    }

    fn apply(&mut self, event: Event) -> Result<(), TestCaseError> {
        let holders_act = matches!(
            event,
            Event::Acquire { .. }
                | Event::Grow { .. }
                | Event::Shrink { .. }
                | Event::Release { .. }
                | Event::Withdraw { .. }
                | Event::Nudge
        );
        if !holders_act {
            // As the scheduler actor does before any event: the lanes close.
            self.shell.take_in_registrations();
            self.shell.close_lanes(self.now);
        }
        self.apply_event(event)?;
        self.schedule_port()?;
        self.shell.open_lanes();
        self.check()
    }

    /// The scheduler takes what holders sent, as its inbox's drain does: lanes closed first.
    fn schedule_port(&mut self) -> Result<(), TestCaseError> {
        let ops = std::mem::take(&mut *self.port.ops.lock().expect("port"));
        self.shell.take_in_registrations();
        if !ops.is_empty() || self.shell.hand_off_made() {
            self.shell.close_lanes(self.now);
        }
        for op in ops {
            self.shell.permit(op, self.now);
            self.carry_out()?;
        }
        self.carry_out()
    }

    fn apply_event(&mut self, event: Event) -> Result<(), TestCaseError> {
        match event {
            Event::Submit {
                priority,
                units,
                deadline,
                timeout,
                tenant,
                duplicate,
            } => self.submit(priority, units, deadline, timeout, tenant, duplicate),
            Event::SubmitAfter {
                units,
                tenant,
                parents,
                run_anyway,
            } => self.submit_after(units, tenant, &parents, run_anyway),
            Event::Finish { n, outcome, rests } => {
                if !self.running.is_empty() {
                    let (worker, entry, _, id) = self.running.remove(n % self.running.len());
                    let outcome = match outcome {
                        0 => Ok(u32::try_from(id).unwrap_or(0)),
                        1 => Err(PoolError::Failed("it broke".into())),
                        _ => Err(PoolError::Cancelled),
                    };
                    if rests {
                        self.resting.push(worker);
                    }
                    self.shell.finish_run(entry, outcome, rests, self.now);
                }
            }
            Event::Ready { n } => {
                if !self.resting.is_empty() {
                    let worker = self.resting.remove(n % self.resting.len());
                    self.shell.worker_ready(worker, self.now);
                }
            }
            Event::Cancel { n } => {
                if let Some((id, Some(key))) = self.submissions.get(n).cloned() {
                    let (reply, _answer) = oneshot::channel();
                    let reply = ractor::RpcReplyPort::from(reply);
                    self.shell.cancel(key, id, reply, self.now);
                }
            }
            Event::GiveUp { n, by_id } => {
                if let Some((id, Some(key))) = self.submissions.get(n).cloned() {
                    let task = by_id.then_some(id);
                    if self.shell.gave_up(&key, task, self.now) == GaveUp::Abandoned {
                        *self.abandoned.entry((key, id)).or_default() += 1;
                    }
                }
            }
            Event::Tick { ms } => {
                self.now += ms;
                self.shell.tick(self.now);
            }
            Event::QueueAnswer { fail } => self.answer_queue(fail),
            Event::SharedAnswer { n, fail } => self.answer_shared(n, fail),
            Event::Poll { lose } => {
                if lose && !self.shared_held.is_empty() {
                    let lost = std::mem::take(&mut self.shared_held);
                    self.shared_lost.extend(lost.iter().copied());
                    for entry in &lost {
                        self.give_back(*entry);
                    }
                    self.shell.shared_report(SharedReport::Lost(lost), self.now);
                }
                if matches!(self.mode, Mode::Shared { .. }) {
                    self.shell.shared_report(SharedReport::Poll, self.now);
                }
            }
            Event::Dead { n } => {
                if matches!(self.mode, Mode::Shared { .. }) && !self.shared_parked.is_empty() {
                    let (_, _, task) = self.shared_parked.remove(n % self.shared_parked.len());
                    let letter = DeadLetter {
                        key: task.meta.mailbox.clone().expect("stored with its key"),
                        task_id: task.meta.id,
                        cost: task.meta.cost,
                        reason: "gave up".into(),
                        end: crate::queue::LetterEnd::GivenUp,
                    };
                    self.shell
                        .shared_report(SharedReport::Dead(vec![letter]), self.now);
                }
            }
            Event::Escalate => self.shell.escalated("gave up".into(), self.now),
            Event::Acquire {
                priority,
                units,
                wait,
                fast,
            } => {
                let meta = TaskMetadata::new(self.next_id, ResourceCost::gpu_vram(units))
                    .with_priority(PRIORITIES[usize::from(priority)]);
                self.next_id += 1;
                match fast
                    .then(|| acquire_from_lane(&*self.port, &meta))
                    .flatten()
                {
                    Some(holding) => self.permits.push(holding),
                    None => {
                        let answer = Arc::new(AcquireAnswer::new());
                        self.acquires.push(answer.clone());
                        self.port.send(PermitOp::Acquire {
                            meta,
                            also: crate::domain::ExtraCosts::NONE,
                            wait,
                            answer,
                        });
                    }
                }
            }
            Event::Nudge => self.shell.take_in_registrations(),
            Event::Grow { n, extra, wait } => {
                if !self.permits.is_empty() {
                    let holding = self.permits[n % self.permits.len()].clone();
                    if !grow_from_lane(&*self.port, &holding, extra) {
                        let answer = Arc::new(GrowAnswer::new());
                        self.grows.push((holding.clone(), extra, answer.clone()));
                        self.port.send(PermitOp::Grow {
                            holding,
                            extra,
                            wait,
                            answer,
                        });
                    }
                }
            }
            Event::Shrink { n, units } => {
                if !self.permits.is_empty() {
                    let holding = &self.permits[n % self.permits.len()];
                    shrink_holding(&*self.port, holding, units);
                }
            }
            Event::Release { n } => self.release(n),
            Event::Withdraw { n } => self.withdraw(n),
            Event::Shutdown { deadline } => {
                let (reply, _report) = oneshot::channel();
                let _ = self
                    .shell
                    .shutdown(ractor::RpcReplyPort::from(reply), self.now);
                if deadline {
                    self.shell.drain_deadline(self.now);
                }
            }
        }
        Ok(())
    }

    fn submit(
        &mut self,
        priority: u8,
        units: u32,
        deadline: Option<u64>,
        timeout: Option<u64>,
        tenant: Option<u8>,
        duplicate: bool,
    ) {
        let shared = matches!(self.mode, Mode::Shared { .. });
        let id = if duplicate && !shared && self.next_id > 1 {
            self.next_id - 1
        } else {
            self.next_id += 1;
            self.next_id - 1
        };
        let priority = [
            Priority::Low,
            Priority::Normal,
            Priority::High,
            Priority::Critical,
        ][usize::from(priority)];
        let mut meta = TaskMetadata::new(id, ResourceCost::gpu_vram(units)).with_priority(priority);
        meta.deadline_ms = deadline.map(|ms| u128::from(self.now + ms));
        meta.mailbox = tenant.map(|tenant| MailboxKey::new(format!("t{tenant}")));
        self.submissions.push((id, meta.mailbox.clone()));
        let options = SubmitOptions {
            timeout: timeout.map(Duration::from_millis),
            ..SubmitOptions::default()
        };
        let (reply, answer) = oneshot::channel();
        self.answers.push((id, answer));
        let task = ScheduledTask { meta, payload: 7 };
        self.shell
            .submit(task, &options, Reply::Oneshot(reply), None, self.now);
    }

    fn submit_after(&mut self, units: u32, tenant: u8, parents: &[usize], run_anyway: bool) {
        let id = self.next_id;
        self.next_id += 1;
        let mut options = SubmitOptions::default();
        if !self.submissions.is_empty() {
            let count = self.submissions.len();
            options =
                options.with_depends_on(parents.iter().map(|n| self.submissions[n % count].0));
        }
        if run_anyway {
            options = options.run_if_parents_fail();
        }
        let mut meta = TaskMetadata::new(id, ResourceCost::gpu_vram(units));
        meta.mailbox = Some(MailboxKey::new(format!("t{tenant}")));
        self.submissions.push((id, meta.mailbox.clone()));
        let (reply, answer) = oneshot::channel();
        self.answers.push((id, answer));
        let task = ScheduledTask { meta, payload: 7 };
        self.shell
            .submit(task, &options, Reply::Oneshot(reply), None, self.now);
    }

    /// Carries out every effect, as the driver and the backends would.
    fn carry_out(&mut self) -> Result<(), TestCaseError> {
        while self.shell.has_effects() {
            for effect in self.shell.take_effects(Vec::new()) {
                self.effect(effect)?;
            }
        }
        self.read_answers();
        self.take_permit_answers();
        Ok(())
    }

    fn read_answers(&mut self) {
        let mut waiting = Vec::new();
        for (id, mut answer) in self.answers.drain(..) {
            match answer.try_recv() {
                Ok(Ok(key)) => {
                    for submission in &mut self.submissions {
                        if submission.0 == id && submission.1.is_none() {
                            submission.1 = Some(key.clone());
                        }
                    }
                    *self.accepted.entry((key, id)).or_default() += 1;
                }
                Ok(Err(_)) => {
                    self.refused.insert(id);
                }
                Err(oneshot::error::TryRecvError::Empty) => waiting.push((id, answer)),
                Err(oneshot::error::TryRecvError::Closed) => {}
            }
        }
        self.answers = waiting;
    }
}

fn run(mode: Mode, events: Vec<Event>) -> Result<(), TestCaseError> {
    let mut world = World::new(mode);
    for event in events {
        world.apply(event)?;
    }
    world.wind_down()?;
    world.verify()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn memory_mode_holds_its_invariants(events in prop::collection::vec(event(), 1..120)) {
        run(Mode::Memory, events)?;
    }

    #[test]
    fn durable_local_mode_accepted_holds_its_invariants(events in prop::collection::vec(event(), 1..120)) {
        run(Mode::Local(Durability::Accepted), events)?;
    }

    #[test]
    fn durable_local_mode_parked_with_a_spin_holds_its_invariants(events in prop::collection::vec(event(), 1..120)) {
        let durability = Durability::Parked { spin: Duration::from_millis(15) };
        run(Mode::Local(durability), events)?;
    }

    #[test]
    fn shared_mode_holds_its_invariants(
        events in prop::collection::vec(event(), 1..120),
        accepted in prop::bool::ANY,
        claim_ahead in 0usize..3,
    ) {
        let durability = if accepted {
            Durability::Accepted
        } else {
            Durability::Parked { spin: Duration::ZERO }
        };
        run(Mode::Shared { durability, claim_ahead }, events)?;
    }
}

#[test]
fn a_refused_submission_is_answered_and_never_delivered() {
    let mut world = World::new(Mode::Memory);
    let too_big = Event::Submit {
        priority: 1,
        units: 99,
        deadline: None,
        timeout: None,
        tenant: Some(0),
        duplicate: false,
    };
    world.apply(too_big).expect("invariants");
    assert_eq!(world.refused.len(), 1, "a task above capacity is refused");
    assert!(world.delivered.is_empty());
}

#[test]
fn a_duplicate_live_id_is_refused_and_the_first_runs_once() {
    let mut world = World::new(Mode::Memory);
    let submit = |duplicate| Event::Submit {
        priority: 1,
        units: 1,
        deadline: None,
        timeout: None,
        tenant: Some(1),
        duplicate,
    };
    world.apply(submit(false)).expect("invariants");
    world.apply(submit(true)).expect("invariants");
    assert_eq!(
        world.refused.len(),
        1,
        "the second submission is a duplicate"
    );
    assert_eq!(world.running.len(), 1);
    world.wind_down().expect("winds down");
    world.verify().expect("verified");
    assert_eq!(world.delivered.len(), 1);
}
