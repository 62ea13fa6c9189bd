//! The local durable mode: parked tasks are stored in a queue of this node's own (an embedded
//! file queue), through the queue actor, so the scheduler never awaits its I/O.
//!
//! The queue actor handles one entry's calls in the order they were asked (park, then claim
//! or remove, then settle) and answers every park and every claim, stored or failed. Until a
//! park's answer comes, its submitter waits (its reply sits in the task's record).
//!
//! Durability (see [`Durability`]):
//! - `Accepted`: a task that starts at once takes its capacity at once, and is parked and
//!   claimed through the queue (so it is stored as running); its submitter is answered and its
//!   job sent only once the queue handed it back. It is settled when it ends.
//! - `Parked { spin }` with a non-zero spin: a task that starts at once touches no file; a
//!   task that would park is answered at once and waits `spin` in the ledger, and is stored
//!   only if it is still parked then; one that starts, is cancelled or expires within the spin
//!   never touches the queue. A stop stores every spinning task.

use std::collections::{HashSet, VecDeque};
use std::time::Duration;

use super::{park_in_ledger, start_now, Parking, Starting, StorageMode};
use crate::domain::{BackendFault, Durability, ScheduledTask, TaskStatus};
use crate::observe::events::{Refusal, TaskStep};
use crate::queue::actor::QueueMsg;
use crate::queue::{Carried, EntryId, HeldBy, Settlement};
use crate::scheduler::core::Cancel;
use crate::scheduler::shell::effects::{Effect, Effects};
use crate::scheduler::shell::ledger::Record;
use crate::scheduler::shell::tasks::Tasks;

/// The local durable mode's state. See the module docs.
pub(crate) struct LocalRoom {
    durability: Durability,
    /// When each spinning task is due to be stored, in that order. A task that left the
    /// spin meanwhile (started, cancelled, expired) is skipped when its time comes.
    spin_due: VecDeque<(u64, EntryId)>,
    /// Parks and claims asked of the queue actor and not yet answered.
    waits: usize,
    /// The entries whose park is asked and not yet answered: a stop keeps their records
    /// until the answer, so a park that fails still reaches its task.
    parking: HashSet<EntryId>,
    /// Whether the queue can hand a claim back (a failed run tried again).
    releases: bool,
    /// Whether the queue keeps dependencies (stores held tasks with their parents).
    dependencies: bool,
    /// Whether the queue stores the costs of a task of several kinds (core rule 25).
    several_kinds: bool,
}

impl LocalRoom {
    /// The mode with `durability`.
    pub fn new(durability: Durability) -> Self {
        Self {
            durability,
            spin_due: VecDeque::new(),
            waits: 0,
            parking: HashSet::new(),
            releases: false,
            dependencies: false,
            several_kinds: false,
        }
    }

    /// The mode on a queue that stores the costs of a task of several kinds
    /// (`TaskQueue::keeps_several_kinds`), or not.
    pub fn with_several_kinds(mut self, keeps: bool) -> Self {
        self.several_kinds = keeps;
        self
    }

    /// The mode on a queue that keeps dependencies (`TaskQueue::keeps_dependencies`), or not.
    pub fn with_dependencies(mut self, keeps: bool) -> Self {
        self.dependencies = keeps;
        self
    }

    /// Whether a task that starts at once is stored (as running) before it runs.
    pub fn stores_starts(&self) -> bool {
        self.durability.writes_started_tasks()
    }

    /// How long a task that would park waits in memory before it is stored, if it does.
    pub fn spin(&self) -> Option<Duration> {
        match self.durability {
            Durability::Parked { spin } if !spin.is_zero() => Some(spin),
            _ => None,
        }
    }

    /// Lets a task spin until `now + spin` before it is stored.
    pub fn spin_from(&mut self, entry: EntryId, spin: Duration, now: u64) {
        let spin_ms = u64::try_from(spin.as_millis()).unwrap_or(u64::MAX);
        self.spin_due
            .push_back((now.saturating_add(spin_ms), entry));
    }

    /// The next task whose spin is over at `now` (`all`: any spinning task, for a stop).
    pub fn next_spun(&mut self, now: u64, all: bool) -> Option<EntryId> {
        let &(due, entry) = self.spin_due.front()?;
        if !all && due > now {
            return None;
        }
        self.spin_due.pop_front();
        Some(entry)
    }

    /// When the next spinning task is due.
    pub fn next_due(&self) -> Option<u64> {
        self.spin_due.front().map(|&(due, _)| due)
    }

    /// Stores a parked task with what it carries (a scheduled start's instant and its
    /// trace, kept across a restart) and the parents it is held for, if any; answered with
    /// `QueueReport::Parked` or `ParkFailed`.
    pub fn store<P, R>(
        &mut self,
        entry: EntryId,
        task: ScheduledTask<P>,
        (carried, held): (Carried, Option<Box<HeldBy>>),
        fx: &mut Effects<P, R>,
    ) {
        self.waits += 1;
        self.parking.insert(entry);
        fx.push(Effect::Queue(QueueMsg::Park {
            entry,
            task,
            carried,
            held,
        }));
    }

    /// Takes a started task's payload back (answered with `Claimed` or `ClaimFailed`).
    pub fn claim<P, R>(&mut self, entry: EntryId, fx: &mut Effects<P, R>) {
        self.waits += 1;
        fx.push(Effect::Queue(QueueMsg::Claim { entry }));
    }

    /// Ends a claim.
    pub fn settle<P, R>(&self, entry: EntryId, settlement: Settlement, fx: &mut Effects<P, R>) {
        fx.push(Effect::Queue(QueueMsg::Settle { entry, settlement }));
    }

    /// Removes a parked task (cancelled, expired).
    /// Whether the queue can hand a claim back ([`TaskQueue::releases_claims`]).
    ///
    /// [`TaskQueue::releases_claims`]: crate::queue::TaskQueue::releases_claims
    pub fn releases_claims(&self) -> bool {
        self.releases
    }

    /// Sets whether the queue can hand a claim back.
    pub fn with_releases(mut self, releases: bool) -> Self {
        self.releases = releases;
        self
    }

    pub fn release<P, R>(&self, entry: EntryId, fx: &mut Effects<P, R>) {
        fx.push(Effect::Queue(QueueMsg::Release { entry }));
    }

    pub fn remove<P, R>(&self, entry: EntryId, fx: &mut Effects<P, R>) {
        fx.push(Effect::Queue(QueueMsg::Remove { entry }));
    }

    /// A park is stored: its submitter, if it still waits, hears it was admitted.
    pub fn stored<P: Send + 'static, R: Send + 'static>(
        &mut self,
        tasks: &mut Tasks<P, R>,
        entry: EntryId,
        now: u64,
    ) {
        self.answered();
        self.parking.remove(&entry);
        if tasks
            .ledger
            .get(entry)
            .is_some_and(|record| kept_at_stop(tasks, record))
        {
            // Kept by the queue at a stop: the submitter hears it was admitted; the record
            // has done its work.
            if let Some(mut record) = tasks.ledger.remove(entry) {
                tasks.answer_pending_park(&mut record, now);
            }
            return;
        }
        let Some(record) = tasks.ledger.get_mut(entry) else {
            return;
        };
        let Some(reply) = record.take_reply() else {
            return;
        };
        let key = record.key.key().into_owned();
        if record.is_parked() {
            tasks.step(entry, TaskStep::Admitted, now);
            tasks.step(entry, TaskStep::Parked, now);
            if let Some(pending) = tasks.core.pending_parents(entry) {
                tasks.step(entry, TaskStep::WaitsForParents { pending }, now);
            }
            if let Some(until_ms) = tasks.core.budget_ready_at(entry) {
                tasks.step(
                    entry,
                    TaskStep::WaitsForBudget {
                        until_ms: u128::from(until_ms),
                    },
                    now,
                );
            }
        }
        tasks.fx.answer(reply, Ok(key));
    }

    /// A park was refused by the queue. A parked task whose submitter waits was never
    /// admitted after all (one that was answered ends `Failed`); a started one is handled as
    /// the comment inside says. Returns the parked tasks the freed place in the core starts.
    pub fn park_failed<P: Send + 'static, R: Send + 'static>(
        &mut self,
        tasks: &mut Tasks<P, R>,
        entry: EntryId,
        (backend, fault): (&'static str, BackendFault),
        now: u64,
    ) -> Vec<EntryId> {
        self.answered();
        self.parking.remove(&entry);
        tasks.observers.queue_error();
        let Some(record) = tasks.ledger.get_mut(entry) else {
            return Vec::new();
        };
        if record.run().is_some() {
            // Started before its park was answered. If its submitter still waits, it is
            // refused (its claim fails next and releases its capacity, quietly); if it was
            // answered already (a spun task), the claim that follows fails and ends it
            // `Failed`, its one outcome.
            let Some(reply) = record.take_reply() else {
                return Vec::new();
            };
            if let Some(run) = record.run_mut() {
                run.ended = true;
                run.from_queue = false;
            }
            tasks.step(entry, TaskStep::Refused(Refusal::QueueError), now);
            let error = tasks.backend_error(backend, "store a task", fault);
            tasks.fx.answer(reply, Err(error));
            return Vec::new();
        }
        let Some(mut record) = tasks.ledger.remove(entry) else {
            return Vec::new();
        };
        record.release_nested_slot();
        let started = match tasks.core.cancel(entry, now) {
            Ok(Cancel::Parked { started }) => started,
            _ => Vec::new(),
        };
        let error = tasks.backend_error(backend, "park a task", fault);
        match record.take_reply() {
            Some(reply) => {
                tasks
                    .observers
                    .record_step(&record, &TaskStep::Refused(Refusal::QueueError), now);
                tasks.fx.answer(reply, Err(error));
            }
            // Its submitter was told it is admitted (a spun task): it ends with the failure,
            // so the submitter's wait for a result ends too.
            None => tasks.deliver(record, Err(error), None, now),
        }
        started
    }

    /// Stores the parked tasks whose spin is over (`all`: every spinning task).
    pub fn store_spun<P: Send + 'static, R: Send + 'static>(
        &mut self,
        tasks: &mut Tasks<P, R>,
        now: u64,
        all: bool,
    ) {
        while let Some(entry) = self.next_spun(now, all) {
            let Some(record) = tasks.ledger.get_mut(entry) else {
                continue;
            };
            if !record.is_parked() {
                continue;
            }
            let carried = Carried {
                not_before_ms: None,
                trace: record.trace().copied(),
                also: record.also(),
            };
            if let Some(task) = record.take_task() {
                self.store(entry, task, (carried, None), &mut tasks.fx);
            }
        }
    }

    /// Whether a park of `entry` is asked and not yet answered.
    pub fn is_parking(&self, entry: EntryId) -> bool {
        self.parking.contains(&entry)
    }

    /// The queue actor answered a park or a claim.
    pub fn answered(&mut self) {
        self.waits = self.waits.saturating_sub(1);
    }

    /// Whether the queue actor owes answers.
    pub fn awaiting(&self) -> bool {
        self.waits > 0
    }
}

impl<P: Send + 'static, R: Send + 'static> StorageMode<P, R> for LocalRoom {
    fn keeps_parked(&self) -> bool {
        true
    }

    fn refuses_several_kinds(&self) -> Option<String> {
        (!self.several_kinds).then(|| "a durable local queue that keeps no such costs".to_owned())
    }

    fn refuses_dependencies(&self) -> Option<String> {
        (!self.dependencies).then(|| "a durable local queue that keeps no dependencies".to_owned())
    }

    /// Under `accepted` durability a task that starts at once is stored as running first:
    /// parked and claimed through the queue, it runs (and its submitter hears) once the
    /// queue hands it back.
    fn start(
        &mut self,
        tasks: &mut Tasks<P, R>,
        starting: Starting<P>,
        now: u64,
    ) -> Option<ScheduledTask<P>> {
        if !self.stores_starts() {
            return Some(start_now(tasks, starting, now));
        }
        let Starting {
            entry,
            mut task,
            key,
            timeout,
            reply,
            extras,
        } = starting;
        tasks.track(entry, &task.meta, &key, timeout, extras);
        tasks.step(entry, TaskStep::Admitted, now);
        tasks.begin_run(entry, true, now);
        if let Some(record) = tasks.ledger.get_mut(entry) {
            record.rare_mut().reply = Some(reply);
        }
        task.meta.mailbox = Some(key);
        let carried = Carried {
            not_before_ms: None,
            trace: tasks.trace_of(entry),
            also: tasks.also_of(entry),
        };
        self.store(entry, task, (carried, None), &mut tasks.fx);
        self.claim(entry, &mut tasks.fx);
        None
    }

    /// A task spins in the ledger first, where the durability asks for a spin; otherwise
    /// (and a scheduled start or a held task always, with its instant or its parents, to
    /// outlive a restart) it is stored at once, and its submitter hears once the queue
    /// answers.
    fn park(&mut self, tasks: &mut Tasks<P, R>, parking: Parking<P>, now: u64) -> Vec<EntryId> {
        let plain = parking.not_before_ms.is_none() && parking.held.is_none();
        if let Some(spin) = self.spin().filter(|_| plain) {
            self.spin_from(parking.entry, spin, now);
            park_in_ledger(tasks, parking, now);
            return Vec::new();
        }
        let Parking {
            entry,
            mut task,
            key,
            timeout,
            not_before_ms,
            reply,
            extras,
            held,
        } = parking;
        tasks.track(entry, &task.meta, &key, timeout, extras);
        if let Some(record) = tasks.ledger.get_mut(entry) {
            record.rare_mut().reply = Some(reply);
        }
        task.meta.mailbox = Some(key);
        let carried = Carried {
            not_before_ms,
            trace: tasks.trace_of(entry),
            also: tasks.also_of(entry),
        };
        self.store(entry, task, (carried, held), &mut tasks.fx);
        Vec::new()
    }

    fn releases_stored(&self) -> bool {
        self.releases_claims()
    }

    fn take_stored(&mut self, entry: EntryId, fx: &mut Effects<P, R>) {
        self.claim(entry, fx);
    }

    fn settle_stored(&mut self, entry: EntryId, settlement: Settlement, fx: &mut Effects<P, R>) {
        self.settle(entry, settlement, fx);
    }

    fn release_stored(&mut self, entry: EntryId, fx: &mut Effects<P, R>) {
        self.release(entry, fx);
    }

    fn forget_stored(&mut self, entry: EntryId, fx: &mut Effects<P, R>) {
        self.remove(entry, fx);
    }

    fn parent_ended(&mut self, entry: EntryId, status: &TaskStatus, fx: &mut Effects<P, R>) {
        if self.dependencies {
            let status = status.clone();
            fx.push(Effect::Queue(QueueMsg::ParentEnded { entry, status }));
        }
    }

    fn tick(&mut self, tasks: &mut Tasks<P, R>, now: u64) -> bool {
        self.store_spun(tasks, now, false);
        false
    }

    fn store_all(&mut self, tasks: &mut Tasks<P, R>, now: u64) {
        self.store_spun(tasks, now, true);
    }

    fn holds_until_stored(&self, entry: EntryId) -> bool {
        self.is_parking(entry)
    }

    fn awaits_queue(&self) -> bool {
        self.awaiting()
    }

    fn next_due(&self) -> Option<u64> {
        LocalRoom::next_due(self)
    }

    fn local(&mut self) -> Option<&mut LocalRoom> {
        Some(self)
    }
}

/// Whether `record` is a parked task the pool let go of at a stop (the core holds it no
/// more), kept only until its park is answered.
fn kept_at_stop<P: Send + 'static, R: Send + 'static>(
    tasks: &Tasks<P, R>,
    record: &Record<P>,
) -> bool {
    record.is_parked() && tasks.core.state(record.entry).is_none()
}
