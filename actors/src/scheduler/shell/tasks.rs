//! The live tasks and their capacity: the core, the ledger, the observers and the effects
//! asked so far, with what every storage mode does to a task the same way: record it, start
//! it, hand its job over, release it, deliver its outcome, report its steps.
//!
//! The [shell](super) decides, per storage mode and lifecycle, which of these happen; the
//! storage rooms use them for their own reports. Nothing here knows the storage mode.

use std::sync::Arc;
use std::time::Duration;

use crate::domain::TaskStatus;
use crate::domain::{
    BackendError, BackendFault, ExtraCosts, MailboxKey, PoolError, ScheduledTask, TaskFailure,
    TaskId, TaskMetadata, TenantId, TenantWeights,
};
use crate::mailbox::notify::RunOf;
use crate::mailbox::{status_of, Delivery};
use crate::observe::events::{Refusal, TaskStep};
use crate::observe::trace::TraceParent;
use crate::queue::{Claim, EntryId, Settlement, StoredEntry, StoredHold};
use crate::running::stream::{StreamAttachment, StreamShared};
use crate::running::{Cancellation, Lineage, RunContext};
use crate::scheduler::core::{clamp_ms, ParkingLot, Rejection, TenantKey, Ticket};
use crate::scheduler::protocol::{Extras, Reply};
use crate::util::contain::drop_contained;
use crate::worker::Job;

use super::dependencies::DependencyBook;
use super::effects::{Effect, Effects, Outcome};
use super::ledger::{admitted_ms, Ledger, Phase, Record, Run, TaskKey};
use super::observe::{Detail, Observers};
use super::storage::shared::{EndedLater, SharedCall};

mod delivery;

/// How long after a task's execution timeout the watchdog declares it `TimedOut` itself,
/// for executors that block their thread and so cannot be interrupted.
const WATCHDOG_GRACE_MS: u64 = 10;

/// The reason a held task's parent counts as failed when its run was lost with a process
/// that stopped before it ended (restored from a durable queue that never heard its end).
pub(crate) const LOST_WITH_THE_PROCESS: &str =
    "its run was lost when the process stopped, before its end was stored";

/// A restored task that will not run, in the ledger and not in the core.
#[derive(Debug)]
pub(crate) struct Orphan {
    pub entry: EntryId,
    pub why: Unrunnable,
}

/// Why a restored task will not run.
#[derive(Debug)]
pub(crate) enum Unrunnable {
    /// A held task's parent `parent` ended `status` without succeeding (or was lost with
    /// the process that stopped).
    ParentEnded { parent: TaskId, status: TaskStatus },
    /// The pool refuses it as it is configured now (less capacity than it asks for, a rule
    /// that counts one kind per task): it ends with this error.
    Refused(PoolError),
}

impl Unrunnable {
    /// How the task ends, as its held children hear it: `Cancelled` with its parent, or the
    /// status of the refusal.
    fn status(&self) -> TaskStatus {
        match self {
            Self::ParentEnded { .. } => TaskStatus::Cancelled,
            Self::Refused(error) => status_of_run::<()>(&Err(error.clone())),
        }
    }
}

/// See the module docs.
pub(crate) struct Tasks<P, R> {
    /// The pool's name.
    pub pool: Arc<str>,
    /// The pure core: capacity, parked tasks, decisions.
    pub core: ParkingLot,
    /// The live tasks.
    pub ledger: Ledger<P>,
    /// Who hears every step.
    pub observers: Observers,
    /// The effects asked for so far.
    pub fx: Effects<P, R>,
    /// The execution timeout of tasks that set none.
    pub default_timeout: Option<Duration>,
    /// Shared entries whose outcomes are on their way out under their claims: the claims are
    /// still this node's (renewed) until the publication answers.
    pub publishing: std::collections::HashSet<EntryId>,
    /// Turns a mailbox tenant into the core's tenant key (seeded per pool, so nobody can
    /// pick two tenant names that share a fair share on purpose).
    tenant_keys: foldhash::fast::RandomState,
    /// Recent outcomes, for the parents a submission names, and the ends of parents whose
    /// held children have not heard yet (see `dependencies.rs`).
    pub dependencies: DependencyBook,
}

/// What [`Tasks::prepare_job`] made of a started task. (Returned once per start and moved
/// straight into an effect: boxing the common, large variant would cost an allocation.)
#[allow(clippy::large_enum_variant)]
pub(crate) enum Prepared<P> {
    /// Its job, for worker `worker`.
    Job { worker: usize, job: Job<P> },
    /// A streamed task whose reader left while it was parked: it never runs, and ends
    /// `Cancelled` (its capacity is released).
    Abandoned,
    /// It is not running here (a bug, logged).
    NotRunning,
}

impl<P, R> Tasks<P, R>
where
    P: Send + 'static,
    R: Send + 'static,
{
    /// The error of `operation` on the queue of `backend` that failed with `fault`, naming
    /// this pool.
    pub fn backend_error(&self, backend: &str, operation: &str, fault: BackendFault) -> PoolError {
        let queue = format!("{backend} queue");
        PoolError::from(BackendError::new(&*self.pool, queue, operation, fault))
    }

    /// The live tasks of a pool with `core`, none yet.
    pub fn new(
        pool: Arc<str>,
        core: ParkingLot,
        observers: Observers,
        default_timeout: Option<Duration>,
    ) -> Self {
        Self {
            pool,
            core,
            ledger: Ledger::default(),
            observers,
            fx: Effects::default(),
            default_timeout,
            publishing: std::collections::HashSet::new(),
            tenant_keys: foldhash::fast::RandomState::default(),
            dependencies: DependencyBook::default(),
        }
    }

    /// The job of a task that started on its worker slot, marked sent.
    pub fn prepare_job(&mut self, entry: EntryId, task: ScheduledTask<P>) -> Prepared<P> {
        let worker = self.core.worker_of(entry);
        let carried = self.ledger.get_mut(entry).and_then(|record| {
            let stream = record.stream().map(|stream| stream.0.clone());
            let timeout = record.timeout();
            let span = record.rare().and_then(|rare| rare.span.clone());
            let lineage = Lineage {
                priority: record.priority,
                tenant: record.key.named_tenant().cloned(),
                trace: record.trace().copied(),
            };
            let run = record.run_mut().filter(|run| !run.sent)?;
            run.sent = true;
            let context = RunContext {
                cancellation: run.cancellation.clone(),
                stream,
                lineage,
            };
            Some((context, timeout, span))
        });
        let (Some(worker), Some((context, timeout, span))) = (worker, carried) else {
            tracing::error!(pool = %self.pool, entry, "bug: a job for a task that is not running");
            drop_contained(task);
            return Prepared::NotRunning;
        };
        if context.cancellation.is_cancelled() {
            drop_contained(task);
            return Prepared::Abandoned;
        }
        let job = Job {
            entry,
            task,
            timeout,
            context,
            span: span.unwrap_or_else(tracing::Span::none),
        };
        Prepared::Job { worker, job }
    }

    /// Indexes stored parked tasks again (with their payloads where the ledger keeps them).
    /// A held task waits again for its parents that are restored too; those that ended
    /// succeeded count as done. Returns the held tasks a parent that did not succeed ends
    /// (see [`Orphan`]), each in the ledger and not in the core, for the shell to end.
    pub fn restore(&mut self, stored: Vec<(StoredEntry, Option<P>)>, now: u64) -> Vec<Orphan> {
        let mut orphans = Vec::new();
        for (stored, payload) in stored {
            let StoredEntry {
                entry,
                meta,
                carried,
                held,
            } = stored;
            self.ledger.note_entry(entry);
            let key = meta.mailbox.clone().unwrap_or_else(MailboxKey::anonymous);
            let mut ticket = self.ticket(entry, &meta, &key, self.default_timeout);
            ticket.also = carried.also;
            let run_anyway = held.as_ref().is_some_and(|held| held.run_anyway);
            let waits_for = match held.map(|held| self.parents_left(held, &orphans)) {
                Some(Err((parent, status))) => {
                    let why = Unrunnable::ParentEnded { parent, status };
                    orphans.push(Orphan { entry, why });
                    Vec::new()
                }
                Some(Ok(pending)) => pending,
                None => Vec::new(),
            };
            let orphaned = orphans.last().is_some_and(|orphan| orphan.entry == entry);
            // A scheduled start sleeps on until its instant (parked now if it has passed).
            let restored = match (orphaned, carried.not_before_ms) {
                (true, _) => Ok(()),
                (false, until_ms) if !waits_for.is_empty() => {
                    let held = self.core.restore_after(ticket, &waits_for, run_anyway, now);
                    if let Some(until_ms) = until_ms {
                        self.core.hold_until(entry, until_ms);
                    }
                    held
                }
                (false, Some(until_ms)) => self.core.park_until(ticket, until_ms, now),
                (false, None) => self.core.restore(ticket, now),
            };
            match restored {
                Ok(()) => {}
                Err(Rejection::DuplicateId(_)) => {
                    tracing::error!(pool = %self.pool, entry, "a stored entry appears twice; kept once");
                    continue;
                }
                Err(refused) => {
                    let why = Unrunnable::Refused(refused.into());
                    orphans.push(Orphan { entry, why });
                }
            }
            let mut record = self.record(entry, &meta, &key, self.default_timeout);
            if let Some(payload) = payload {
                record.keep_payload(payload);
            }
            if let Some(trace) = carried.trace {
                // Resumed after a restart: it goes on in the trace it was parked in.
                record.rare_mut().trace = Some(trace);
            }
            if !carried.also.is_empty() {
                record.rare_mut().also = carried.also;
            }
            self.ledger.insert(record);
        }
        orphans
    }

    /// The entries of `held`'s parents it still waits for (restored, and not ended), or why
    /// it will not run: the task id of a parent that ended without succeeding, or whose run
    /// was lost with the process that stopped, and how it ended (unless it runs anyway, when
    /// both count as done).
    /// `orphans`: the held tasks restored so far that will not run (a child of one of them
    /// is cancelled with it).
    fn parents_left(
        &self,
        held: StoredHold,
        orphans: &[Orphan],
    ) -> Result<Vec<EntryId>, (TaskId, TaskStatus)> {
        let mut pending = Vec::new();
        for parent in held.parents {
            let status = match parent.ended {
                Some(TaskStatus::Completed) => continue,
                None if self.core.is_live(parent.entry) => {
                    pending.push(parent.entry);
                    continue;
                }
                Some(status) => status,
                None => match orphans.iter().find(|orphan| orphan.entry == parent.entry) {
                    Some(orphan) => orphan.why.status(),
                    None => TaskStatus::Failed(LOST_WITH_THE_PROCESS.to_owned()),
                },
            };
            if !held.run_anyway {
                return Err((parent.task_id, status));
            }
        }
        Ok(pending)
    }

    /// The entry of the live task `id` whose key is exactly `key`, if any.
    pub fn entry_of(&self, key: &MailboxKey, id: TaskId) -> Option<EntryId> {
        let entry = self.ledger.entry_of_caller(&key.tenant, id)?;
        let exact = self.ledger.get(entry)?.key.is(key);
        exact.then_some(entry)
    }

    /// Ends a task the core no longer holds as parked: drops its payload (or, where it is
    /// not in the ledger, returns `true`: a durable queue holds it and must remove it),
    /// ends its shared claim, answers a submitter still waiting for its park and delivers
    /// `outcome`.
    pub fn end_parked(&mut self, entry: EntryId, outcome: PoolError, now: u64) -> bool {
        let Some((mut record, stored_elsewhere)) = self.remove_parked(entry) else {
            return false;
        };
        let ended = Settlement::of_outcome::<()>(&Err(outcome.clone()));
        let settle = record.lease().map(|claim| (claim, ended));
        self.answer_pending_park(&mut record, now);
        record.release_nested_slot();
        self.deliver(record, Err(outcome), settle, now);
        stored_elsewhere
    }

    /// Removes parked task `entry`'s record and drops its payload; `None` for a task the
    /// ledger does not hold. The flag is `true` where the payload is stored elsewhere (a
    /// durable queue, which must forget it too).
    fn remove_parked(&mut self, entry: EntryId) -> Option<(Record<P>, bool)> {
        let mut record = self.ledger.remove(entry)?;
        let payload = record.take_payload();
        let stored_elsewhere = payload.is_none();
        drop_contained(payload);
        Some((record, stored_elsewhere))
    }

    /// Ends a parked task the core no longer holds whose only waiter gave up (see
    /// `waiters.rs`): like [`end_parked`](Self::end_parked), but nothing is delivered, as
    /// nobody will collect it; its end is told as `Cancelled`. Returns `true` where a
    /// durable queue holds it and must remove it.
    pub fn end_abandoned(&mut self, entry: EntryId, now: u64) -> bool {
        let Some((mut record, stored_elsewhere)) = self.remove_parked(entry) else {
            return false;
        };
        record.release_nested_slot();
        let step = TaskStep::Ended(TaskStatus::Cancelled);
        self.observers.record_step(&record, &step, now);
        let key = record.key.key().into_owned();
        self.note_end((entry, record.task_id), &key, &TaskStatus::Cancelled, now);
        tracing::debug!(pool = %self.pool, task_id = record.task_id, "abandoned a parked task: the retrieve waiting for it gave up");
        stored_elsewhere
    }

    /// Releases a finished run's capacity: removes its record, frees what it held in the
    /// core and publishes the gauges. Returns the record and the parked tasks that the freed
    /// capacity starts, or `None` for a task the ledger does not hold.
    pub fn release(
        &mut self,
        entry: EntryId,
        rests: bool,
        now: u64,
    ) -> Option<(Record<P>, Vec<EntryId>)> {
        self.ledger.get(entry)?;
        let started = self.release_run(entry, rests, now);
        let mut record = self.ledger.remove(entry)?;
        record.release_nested_slot();
        Some((record, started))
    }

    /// Frees what the run of `entry` held, first giving back to its kind's budget what the
    /// run said it did not use, and publishes the gauges; the record stays. Returns the
    /// parked tasks the freed capacity starts.
    pub fn release_run(&mut self, entry: EntryId, rests: bool, now: u64) -> Vec<EntryId> {
        let unused = self
            .ledger
            .get(entry)
            .and_then(|record| record.run())
            .map_or(0, |run| run.cancellation.unused_units());
        let used = self
            .ledger
            .get(entry)
            .and_then(|record| record.run())
            .and_then(|run| run.cancellation.used_units());
        if let Some(used) = used {
            // Settled with the release below, under a fair share by use.
            let _ = self.core.report_used(entry, used);
        }
        let fleet_use = self
            .ledger
            .get(entry)
            .filter(|record| record.claimed_from_queue())
            .and_then(|record| {
                let used = self.core.run_use(entry, now)?;
                Some((record.key.key().tenant.clone(), used))
            });
        if let Some((tenant, used)) = fleet_use {
            // A claim charged the fleet's counters ahead: they settle too.
            self.fx.shared(SharedCall::SettleUse { tenant, used });
        }
        let mut started = Vec::new();
        if unused > 0 {
            let given = unused.min(self.core.spent_by(entry));
            // Back to the budget first: the release below starts what fits both.
            started = self.core.give_back(entry, unused, now).unwrap_or_default();
            let claimed = self.ledger.get(entry).and_then(Record::lease).is_some();
            if given > 0 && claimed {
                // The fleet's budget, which a claim spent from, gets them back too.
                let kind = self
                    .ledger
                    .get(entry)
                    .map(Record::cost)
                    .map(|cost| cost.kind);
                if let Some(kind) = kind {
                    self.fx
                        .shared(SharedCall::GiveBackBudget { kind, units: given });
                }
            }
        }
        started.extend(self.release_capacity(entry, rests, now));
        self.observers.publish(&self.core);
        started
    }

    /// Frees what the run of `entry` held in the core (its worker slot rests, with `rests`);
    /// returns the parked tasks the freed capacity starts.
    pub fn release_capacity(&mut self, entry: EntryId, rests: bool, now: u64) -> Vec<EntryId> {
        let released = if rests {
            self.core.complete_resting(entry, now)
        } else {
            self.core.complete(entry, now)
        };
        released.unwrap_or_else(|error| {
            tracing::error!(pool = %self.pool, %error, "capacity release refused");
            Vec::new()
        })
    }

    /// Keeps a parked task's payload in its record, announces it (`arrived`: `Admitted` for
    /// a submission, `Claimed` for a task claimed from a shared queue, then `Parked`) and
    /// answers its submitter.
    pub fn keep_parked(
        &mut self,
        entry: EntryId,
        payload: P,
        (reply, arrived): (Option<Reply>, TaskStep),
        key: MailboxKey,
        now: u64,
    ) {
        let parked_reason = self.wait_reason(entry, &TaskStep::Parked);
        if let Some(record) = self.ledger.get_mut(entry) {
            record.keep_payload(payload);
            // Reported with the key in hand: the record keeps an anonymous key compact.
            self.observers.record_step_as(record, &key, &arrived, now);
            self.observers
                .record_step_why(record, &key, &TaskStep::Parked, now, parked_reason);
            if let Some(until_ms) = self.core.budget_ready_at(entry) {
                let step = TaskStep::WaitsForBudget {
                    until_ms: u128::from(until_ms),
                };
                self.observers.record_step_as(record, &key, &step, now);
            }
        }
        if let Some(reply) = reply {
            self.fx.answer(reply, Ok(key));
        }
    }

    /// Refuses a submission: its submitter hears why.
    pub fn refuse(&mut self, task: ScheduledTask<P>, error: PoolError, reply: Reply, now: u64) {
        let key = task
            .meta
            .mailbox
            .clone()
            .unwrap_or_else(|| MailboxKey::new(""));
        let step = TaskStep::Refused(Refusal::of(&error));
        self.step_unrecorded(&task.meta, &key, &step, now);
        self.fx.answer(reply, Err(error));
        drop_contained(task);
    }

    /// Records an admitted task, not yet running.
    pub fn track(
        &mut self,
        entry: EntryId,
        meta: &TaskMetadata,
        key: &MailboxKey,
        timeout: Option<Duration>,
        extras: Option<Box<Extras>>,
    ) {
        let mut record = self.record(entry, meta, key, timeout);
        if self.core.state(entry) == Some(crate::domain::WakeState::Running) {
            // It starts now: its key is kept in full at once (it is reported several
            // times), rather than built from its bits for its admission and again at start.
            record.key.expand();
        }
        if let Some(extras) = extras {
            let rare = record.rare_mut();
            rare.stream = extras.stream;
            rare.slot = extras.slot;
            rare.trace = extras.trace;
            rare.also = extras.also;
        }
        self.ledger.insert(record);
    }

    /// A fresh record of a task, with its span when a subscriber wants one.
    pub fn record(
        &self,
        entry: EntryId,
        meta: &TaskMetadata,
        key: &MailboxKey,
        timeout: Option<Duration>,
    ) -> Record<P> {
        let mut record = Record::new(entry, meta, TaskKey::of(key), timeout);
        let span = task_span(&self.pool, meta, key);
        if !span.is_disabled() {
            record.rare_mut().span = Some(span);
        }
        record
    }

    /// What live task `entry` needs beside its cost (core rule 25): none for one kind.
    pub fn also_of(&self, entry: EntryId) -> ExtraCosts {
        self.ledger
            .get(entry)
            .map_or(ExtraCosts::NONE, Record::also)
    }

    /// The trace live task `entry` belongs to, if any.
    pub fn trace_of(&self, entry: EntryId) -> Option<TraceParent> {
        self.ledger.get(entry)?.trace().copied()
    }

    pub fn set_lease(&mut self, entry: EntryId, shared_entry: EntryId, attempt: u32) {
        if let Some(record) = self.ledger.get_mut(entry) {
            record.rare_mut().lease = Some(Claim::new(shared_entry, attempt));
        }
    }

    /// Gives task `entry` the claim this node took of `shared_entry` from the shared queue,
    /// as its `attempt`-th (see [`Rare::claimed`](super::ledger::Rare::claimed)).
    pub fn set_claim(&mut self, entry: EntryId, shared_entry: EntryId, attempt: u32) {
        self.set_lease(entry, shared_entry, attempt);
        if let Some(record) = self.ledger.get_mut(entry) {
            record.rare_mut().claimed = true;
        }
    }

    /// Marks a task running on the slot the core gave it and arms its watchdog.
    pub fn begin_run(&mut self, entry: EntryId, from_queue: bool, now: u64) {
        let Some(record) = self.ledger.get_mut(entry) else {
            return;
        };
        let stream = record.stream().and_then(stream_of::<R>);
        if let Some(stream) = stream {
            // Its sends may wait on an unread buffer only so long (see `running::stream`).
            stream.set_idle_limit(self.core.limits().stream_idle_ms);
        }
        let cancellation =
            stream.map_or_else(Cancellation::new, |stream| stream.cancellation().clone());
        // Started before the queue confirmed its park: its submitter keeps waiting for that
        // confirmation, now as a running task's, and it is announced as parked first.
        let announce = record.is_parked() && record.rare().is_some_and(|rare| rare.reply.is_some());
        record.key.expand();
        let waited_ms = now.saturating_sub(record.admitted_ms());
        record.phase = Phase::Running(Run {
            waited_ms: u32::try_from(waited_ms).unwrap_or(u32::MAX),
            cancellation,
            sent: false,
            ended: false,
            from_queue,
        });
        if let Some(limit) = record.timeout() {
            let limit = u64::try_from(limit.as_millis()).unwrap_or(u64::MAX);
            let at = now.saturating_add(limit).saturating_add(WATCHDOG_GRACE_MS);
            if at < u64::MAX {
                self.core.watch(entry, at);
            }
        }
        if announce {
            self.step(entry, TaskStep::Admitted, now);
            self.step(entry, TaskStep::Parked, now);
        }
        self.step(entry, TaskStep::Started, now);
    }

    /// Answers a submitter still waiting for its park to be stored: the task was admitted.
    /// A parked task is announced only once its submitter is answered (a running one was
    /// as it started), so it is announced here, before any step that ends it.
    pub fn answer_pending_park(&mut self, record: &mut Record<P>, now: u64) {
        let Some(reply) = record.take_reply() else {
            return;
        };
        if record.is_parked() {
            for step in [TaskStep::Admitted, TaskStep::Parked] {
                self.observers.record_step(record, &step, now);
            }
        }
        self.fx.answer(reply, Ok(record.key.key().into_owned()));
    }

    /// Ends a running task whose submitter still waits for the queue to store it: the
    /// submitter hears `outcome` instead of being admitted, and nothing goes to the mailbox
    /// (the run's late report only releases its capacity). It was announced as it started,
    /// so its `Ended` is told here, its one.
    pub fn end_unstored(&mut self, entry: EntryId, reply: Reply, outcome: PoolError, now: u64) {
        let status = status_of_run::<()>(&Err(outcome.clone()));
        let step = TaskStep::Ended(status.clone());
        if let Some(record) = self.ledger.get_mut(entry) {
            if let Some(run) = record.run_mut() {
                run.ended = true;
            }
            self.observers.record_step(record, &step, now);
        }
        let ended = self.ledger.get(entry).map(|record| {
            let caller = (entry, record.task_id);
            (caller, record.key.key().into_owned())
        });
        if let Some((caller, key)) = ended {
            self.note_end(caller, &key, &status, now);
        }
        self.fx.answer(reply, Err(outcome));
    }

    /// Delivers an outcome for a running task before its thread returns, and asks the thread
    /// to drop its future. Its capacity stays held until the thread reports back.
    pub fn end_running(&mut self, entry: EntryId, outcome: PoolError, now: u64) -> bool {
        let Some(record) = self.ledger.get_mut(entry) else {
            return false;
        };
        let Some(run) = record.run_mut().filter(|run| !run.ended) else {
            return false;
        };
        run.ended = true;
        run.cancellation.cancel();
        if let Some(reply) = record.take_reply() {
            self.end_unstored(entry, reply, outcome, now);
            return true;
        }
        let outcome = Err(outcome);
        let status = status_of_run(&outcome);
        let step = TaskStep::Ended(status.clone());
        let key = record.key.key().into_owned();
        let (task_id, run) = (record.task_id, run_of(record));
        let stream = record.rare.as_mut().and_then(|rare| rare.stream.take());
        // A claimed task's outcome goes out now, under its claim, which ends with it: the
        // run's late report only releases its capacity.
        let settle = record
            .rare
            .as_mut()
            .and_then(|rare| rare.lease.take())
            .map(|claim| (claim, Settlement::Ended(status.clone())));
        let held_back = settle.is_some() && stream.is_none();
        let later = ended_step(&self.observers, record, &key, &step, held_back, now);
        self.note_end((entry, task_id), &key, &status, now);
        self.send_outcome(stream, key, task_id, run, outcome, settle, later, now);
        true
    }

    /// Stops the run of `entry` if it runs under a shared claim, and takes the claim off it:
    /// nothing of the run will be published, and its late report only releases its
    /// capacity. Returns the claim, for the caller to hand back to the queue.
    pub fn stop_claimed_run(&mut self, entry: EntryId) -> Option<Claim> {
        let record = self.ledger.get_mut(entry)?;
        let run = record.run().filter(|run| !run.ended)?;
        let cancellation = run.cancellation.clone();
        let claim = record.rare.as_mut()?.lease.take()?;
        if let Some(run) = record.run_mut() {
            run.ended = true;
        }
        cancellation.cancel();
        Some(claim)
    }

    pub fn step(&self, entry: EntryId, step: TaskStep, now: u64) {
        if let Some(record) = self.ledger.get(entry) {
            let key = record.key.key();
            let reason = self.wait_reason(entry, &step);
            self.observers
                .record_step_why(record, &key, &step, now, reason);
        }
    }

    /// Why task `entry` waits, by name, on a `Parked` step, if a subscriber asked.
    fn wait_reason(&self, entry: EntryId, step: &TaskStep) -> Option<&'static str> {
        let wanted = matches!(step, TaskStep::Parked) && self.observers.wants_wait_reasons();
        wanted.then(|| self.core.why_waiting_name(entry)).flatten()
    }

    pub fn step_unrecorded(
        &self,
        meta: &TaskMetadata,
        key: &MailboxKey,
        step: &TaskStep,
        now: u64,
    ) {
        let detail = Detail {
            priority: Some(meta.priority),
            ..Detail::NONE
        };
        self.observers
            .step(meta.id, key, meta.cost, step, now, detail);
    }

    /// Gives the core the weights of the tenants `weights` names, under a fair share by use
    /// (the others have its default weight).
    pub fn weigh_tenants(&mut self, weights: &TenantWeights) {
        if self.core.limits().fair_by_use.is_none() {
            return;
        }
        for (tenant, weight) in weights.iter() {
            let key = named_tenant_key(&self.tenant_keys, &TenantId(tenant.to_owned()));
            if let Err(error) = self.core.set_tenant_weight(key, weight) {
                tracing::error!(pool = %self.pool, %error, "tenant weight refused");
            }
        }
    }

    /// The core's key of the tenant of `key`.
    pub fn tenant_key_of(&self, key: &MailboxKey) -> TenantKey {
        tenant_key(&self.tenant_keys, key)
    }

    /// The core's ticket for an entry: ranked by admission (the entry id), not by the
    /// caller's `created_at_ms`, which stays metadata; with the execution timeout it will run
    /// under, and its tenant's key when the pool has a fair share.
    pub fn ticket(
        &self,
        entry: EntryId,
        meta: &TaskMetadata,
        key: &MailboxKey,
        timeout: Option<Duration>,
    ) -> Ticket {
        let limits = self.core.limits();
        let tenant = if limits.fair_share.is_some() || limits.fair_by_use.is_some() {
            tenant_key(&self.tenant_keys, key)
        } else {
            0
        };
        Ticket {
            id: entry,
            priority: meta.priority,
            cost: meta.cost,
            created_at_ms: admitted_ms(entry),
            deadline_ms: meta.deadline_ms.map(clamp_ms),
            tenant,
            timeout_ms: timeout.map(|limit| u64::try_from(limit.as_millis()).unwrap_or(u64::MAX)),
            also: Default::default(),
        }
    }
}

/// A task's span: pool, task id, tenant, priority and cost, as fields. The macro evaluates
/// none of them (and allocates nothing) unless a subscriber enables `task` spans at DEBUG.
fn task_span(pool: &str, meta: &TaskMetadata, key: &MailboxKey) -> tracing::Span {
    tracing::debug_span!(
        "task",
        pool,
        task_id = meta.id,
        tenant = %key.tenant,
        priority = ?meta.priority,
        kind = ?meta.cost.kind,
        units = meta.cost.units,
    )
}

/// The fair share's key of a mailbox tenant. Every task submitted without a mailbox gets a
/// fresh anonymous tenant of its own ([`MailboxKey::anonymous`]); counted one by one they
/// would escape any cap, so all of them share key 0, as one tenant. Named tenants hash to a
/// key other than 0 (a 64-bit keyed hash: two names sharing one is a 2^-64 chance).
fn tenant_key(keys: &foldhash::fast::RandomState, key: &MailboxKey) -> TenantKey {
    if key.is_anonymous() {
        return 0;
    }
    named_tenant_key(keys, &key.tenant)
}

/// The fair share's key of a named tenant.
fn named_tenant_key(keys: &foldhash::fast::RandomState, tenant: &TenantId) -> TenantKey {
    use std::hash::BuildHasher;
    keys.hash_one(tenant).max(1)
}

/// The typed buffer behind a stream attachment (checked at admission, so always `Some`).
pub(crate) fn stream_of<R: Send + 'static>(stream: &StreamAttachment) -> Option<&StreamShared<R>> {
    stream.0.downcast_ref::<StreamShared<R>>()
}

/// Tells the observers that `record` ended with `step`, now, or, for an outcome that goes
/// out under a shared claim (`held_back`), returns the step to tell once it is published.
fn ended_step<P>(
    observers: &Observers,
    record: &Record<P>,
    key: &MailboxKey,
    step: &TaskStep,
    held_back: bool,
    now: u64,
) -> Option<EndedLater> {
    if !held_back {
        observers.record_step_as(record, key, step, now);
        return None;
    }
    let TaskStep::Ended(status) = step else {
        return None;
    };
    let detail = Detail::of(record, step);
    Some(EndedLater {
        task_id: record.task_id,
        cost: record.cost(),
        status: status.clone(),
        since_ms: detail.since_ms,
        priority: detail.priority,
        trace: detail.trace,
        attempt: detail.attempt,
    })
}

/// Which run of its task `record` is, and its trace: what its terminal event says.
fn run_of<P>(record: &Record<P>) -> RunOf {
    RunOf {
        attempt: record.attempt(),
        trace: record.trace().copied().map(Box::new),
    }
}

/// The terminal status of a run that ended with `outcome`.
fn status_of_run<R>(outcome: &Result<R, PoolError>) -> TaskStatus {
    match outcome {
        Ok(_) => TaskStatus::Completed,
        Err(error) => status_of::<()>(&Err(TaskFailure::from(error.clone()))),
    }
}
