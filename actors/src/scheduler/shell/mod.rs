//! The scheduler's shell: the sans-I/O state machine around the pure core.
//!
//! The core decides which task runs, parks, expires or is refused. The shell holds everything
//! else a pool must remember between events, and turns the core's decisions into
//! [effects](effects): a job for a worker, a call to a queue, an outcome for the mailbox, an
//! answer for a caller. It takes events with the current time (a submission, a finished run,
//! a queue's report, a tick) and appends effects, in order; the scheduler actor's driver
//! carries them out. It reads no clock, sends nothing and awaits nothing, so the property
//! tests in `tests.rs` drive every storage mode with random events and no runtime.
//!
//! What it holds, each in a room of its own:
//! - the [`ParkingLot`] core;
//! - the [ledger](ledger) of live tasks, by entry and by caller;
//! - the [storage mode](storage), chosen once: memory, a local durable queue, or a queue
//!   shared with other nodes, each with only its own state;
//! - the [lifecycle](lifecycle): open, escalated, draining, stopped;
//! - the [observers](observe) that hear every step.
//!
//! It also answers the retrieves that wait on its tasks ([waiters](waiters)): whether a
//! result can still come, and what a retrieve that gave up does to its task.
//!
//! # Invariants
//!
//! - Every admitted task is in the ledger until it has ended and its capacity is released.
//! - Exactly one outcome per admitted task reaches its mailbox or stream: once the watchdog
//!   or the drain deadline delivered one for a running task (`Run::ended`), the worker's late
//!   outcome only releases capacity and is dropped.
//! - Capacity is released (core `complete`) exactly once, when the worker reports the run
//!   over or the job provably never reached a worker, because until then its memory may be
//!   in use. An outcome from a finish is asked for after its release (and after the gauges
//!   are published); only the watchdog's and the drain deadline's come before it.
//! - Queue calls for one entry are asked in order: park, then claim or remove, then settle.

mod admission;
mod arrival;
pub(crate) mod control;
mod dependencies;
pub(crate) mod effects;
mod lanes;
pub(crate) mod ledger;
pub(crate) mod lifecycle;
pub(crate) mod observe;
pub(crate) mod permits;
mod rerun;
mod retry;
pub(crate) mod storage;
pub(crate) mod tasks;
#[cfg(test)]
mod tests;
mod views;
pub(crate) mod waiters;

use std::sync::Arc;
use std::time::Duration;

use crate::domain::{
    BackendFault, ExtraCosts, MailboxKey, OnDuplicate, PoolError, ResourceKind, ScheduledTask,
    TenantWeights,
};
use crate::mailbox::watch::ResultWatch;
use crate::mailbox::Mailbox;
use crate::observe::events::TaskStep;
use crate::observe::stats::PoolStats;
use crate::queue::actor::QueueReport;
use crate::queue::{Claim, EntryId, Settlement, StoredEntry};
use crate::scheduler::core::ParkingLot;
use crate::scheduler::protocol::{Extras, Reply, SubmitOptions};
use crate::util::contain::drop_contained;

use admission::{mailbox_has_room, no_result_waits, streamable, Admission, Origin};
use effects::{Effect, Effects};
use ledger::Record;
use lifecycle::Lifecycle;
pub(crate) use lifecycle::Shutdown;
use observe::Observers;
use storage::shared::SharedCall;
use storage::Storage;
use tasks::{Prepared, Tasks, Unrunnable};

/// How a pool copies a payload, to run a preempted task again (set by
/// `PoolClient::preempt_tasks`, for payloads that are `Clone`).
pub(crate) type Rerun<P> = Arc<std::sync::OnceLock<fn(&P) -> P>>;

/// Everything a shell starts with.
pub(crate) struct ShellArgs<P, R> {
    /// The pool's name.
    pub pool: Arc<str>,
    /// The core, with the pool's limits.
    pub core: ParkingLot,
    /// The execution timeout of tasks that set none.
    pub default_timeout: Option<Duration>,
    /// Where parked tasks are kept.
    pub storage: Storage<P, R>,
    /// The pool's counters (the first observer).
    pub counters: Arc<crate::observe::stats::PoolCounters>,
    /// Who else hears every event.
    pub subscribers: Vec<Arc<dyn crate::observe::events::EventSubscriber>>,
    /// The mailbox, read (never written) to refuse work it has no room to answer.
    pub mailbox: Arc<dyn Mailbox<R>>,
    /// The results on their way to a mailbox that awaits (`None` for an inline one).
    pub results_watch: Option<Arc<ResultWatch>>,
    /// Whether a GPU sampler wants to hear that tasks wait for memory.
    pub gpu_sampled: bool,
    /// How to copy a payload, once the pool preempts its tasks.
    pub rerun: Rerun<P>,
    /// The permits' fast path (see `lanes.rs`).
    pub lanes: Arc<crate::permit::lane::Lanes>,
    /// The weights of named tenants, under a fair share by use.
    pub tenant_weights: TenantWeights,
}

/// The shell. See the module docs.
pub(crate) struct Shell<P, R> {
    /// The live tasks, their capacity and the effects asked so far.
    tasks: Tasks<P, R>,
    /// Where parked tasks are kept.
    storage: Storage<P, R>,
    /// Open, escalated, draining or stopped.
    lifecycle: Lifecycle,
    /// The mailbox, read (never written) to refuse work it has no room to answer.
    mailbox: Arc<dyn Mailbox<R>>,
    /// The results on their way to a mailbox that awaits (`admission.rs`).
    results_watch: Option<Arc<ResultWatch>>,
    /// Whether a GPU sampler wants to hear that tasks wait for memory.
    gpu_sampled: bool,
    /// Capacity permits, held and waiting.
    permits: permits::Permits,
    /// How to copy a payload, once the pool preempts its tasks (see `rerun.rs`).
    rerun: Rerun<P>,
    /// The permits' fast path: which lanes are open, the permits granted on it.
    lanes: lanes::LaneBook,
}

impl<P, R> Shell<P, R>
where
    P: Send + 'static,
    R: Send + 'static,
{
    /// A shell for `args`, with the parked tasks a durable queue kept (indexed again, then
    /// started as they fit).
    pub fn new(args: ShellArgs<P, R>, stored: Vec<(StoredEntry, Option<P>)>, now: u64) -> Self {
        let observers = Observers::new(args.counters, args.subscribers, args.core.limits());
        let permits = permits::Permits::new(args.core.limits().preemption);
        let mut tasks = Tasks::new(args.pool, args.core, observers, args.default_timeout);
        tasks.weigh_tenants(&args.tenant_weights);
        let orphans = tasks.restore(stored, now);
        let mut shell = Self {
            tasks,
            storage: args.storage,
            lifecycle: Lifecycle::default(),
            mailbox: args.mailbox,
            results_watch: args.results_watch,
            gpu_sampled: args.gpu_sampled,
            permits,
            rerun: args.rerun,
            lanes: lanes::LaneBook::new(args.lanes),
        };
        for orphan in orphans {
            let outcome = match orphan.why {
                Unrunnable::ParentEnded { parent, status } => {
                    // A parent ended without succeeding before the restart; its child heard
                    // it only now.
                    let step = TaskStep::ParentFailed { parent, status };
                    shell.tasks.step(orphan.entry, step, now);
                    PoolError::Cancelled
                }
                Unrunnable::Refused(error) => {
                    tracing::warn!(
                        pool = %shell.tasks.pool,
                        entry = orphan.entry,
                        %error,
                        "a stored task is refused by the pool's configuration now"
                    );
                    error
                }
            };
            shell.end_parked(orphan.entry, outcome, now);
        }
        shell.tick(now);
        shell
    }

    /// A submission: start, park or refuse it.
    pub fn submit(
        &mut self,
        mut task: ScheduledTask<P>,
        options: &SubmitOptions,
        reply: Reply,
        extras: Option<Box<Extras>>,
        now: u64,
    ) {
        let admissible = self
            .lifecycle
            .admits()
            .and_then(|()| mailbox_has_room(&*self.mailbox, self.tasks.ledger.len()))
            .and_then(|()| {
                let fleet = self.storage.waits_in_fleet();
                streamable::<R>(&self.tasks.pool, fleet, extras.as_deref())
            })
            .and_then(|()| {
                let watch = self.results_watch.as_deref();
                no_result_waits(&*self.mailbox, watch, &task, extras.as_deref())
            });
        if let (Err(PoolError::ResultPending(_)), OnDuplicate::Attach) =
            (&admissible, self.tasks.core.limits().on_duplicate)
        {
            // Its result waits under this very key: the caller retrieves it there.
            let key = task
                .meta
                .mailbox
                .take()
                .unwrap_or_else(MailboxKey::anonymous);
            self.tasks.fx.answer(reply, Ok(key));
            drop_contained(task);
            return;
        }
        let not_before_ms = admissible.and_then(|()| {
            let deadline_ms = task.meta.deadline_ms;
            options.sleeps_until(deadline_ms, now)
        });
        let not_before_ms = match not_before_ms {
            Ok(not_before_ms) => not_before_ms,
            Err(refusal) => {
                self.tasks.refuse(task, refusal, reply, now);
                return;
            }
        };
        let minted = task.meta.mailbox.is_none();
        let key = task
            .meta
            .mailbox
            .take()
            .unwrap_or_else(MailboxKey::anonymous);
        let timeout = options.timeout.or(self.tasks.default_timeout);
        let also = match self.several_kinds(&task, options) {
            Ok(also) => also,
            Err(refusal) => {
                task.meta.mailbox = (!minted).then_some(key);
                self.tasks.refuse(task, refusal, reply, now);
                return;
            }
        };
        let extras = Extras::with_trace_and_costs(extras, options.trace, also);
        let parents = match self.resolve_parents(task.meta.id, &key, options) {
            Ok(parents) => parents,
            Err(refusal) => {
                task.meta.mailbox = (!minted).then_some(key);
                self.tasks.refuse(task, refusal, reply, now);
                return;
            }
        };
        let origin = Origin::Submitted { reply, extras };
        self.admit(
            Admission {
                task,
                key,
                timeout,
                not_before_ms,
                origin,
                minted,
                parents,
            },
            now,
        );
    }

    /// What a submission needs beside its metadata's cost (core rule 25), or why it is
    /// refused: a kind named twice, or a queue that cannot store such costs.
    fn several_kinds(
        &self,
        task: &ScheduledTask<P>,
        options: &SubmitOptions,
    ) -> Result<ExtraCosts, PoolError> {
        if options.also.is_empty() {
            return Ok(ExtraCosts::NONE);
        }
        let also =
            ExtraCosts::new(task.meta.cost, &options.also).map_err(PoolError::InvalidConfig)?;
        if let Some(queue) = self
            .storage
            .refuses_several_kinds()
            .filter(|_| !also.is_empty())
        {
            return Err(PoolError::InvalidConfig(format!(
                "a task of several kinds of resource (SubmitOptions::also) waits only in the \
                 in_memory and yaque queues so far; this pool parks in {queue}: give the task \
                 one cost"
            )));
        }
        Ok(also)
    }

    /// Hands a started task's job to its worker slot.
    fn send_job(&mut self, entry: EntryId, task: ScheduledTask<P>, now: u64) {
        self.keep_spare(entry, &task);
        match self.tasks.prepare_job(entry, task) {
            Prepared::Job { worker, job } => self.tasks.fx.push(Effect::Run { worker, job }),
            Prepared::Abandoned => self.finish(entry, Err(PoolError::Cancelled), now),
            Prepared::NotRunning => {}
        }
    }

    /// Starts parked tasks the core chose, in order.
    fn start_parked(&mut self, started: Vec<EntryId>, now: u64) {
        for entry in started {
            if self.permits.is_waiting(entry) {
                self.permit_started(entry, now);
                continue;
            }
            let Some(record) = self.tasks.ledger.get_mut(entry) else {
                tracing::error!(pool = %self.tasks.pool, entry, "bug: the core started a task the ledger does not hold");
                continue;
            };
            match record.take_task() {
                // Kept in the ledger (memory, a spin, a claimed task parked here).
                Some(task) => {
                    self.tasks.begin_run(entry, false, now);
                    self.send_job(entry, task, now);
                }
                // Stored by the mode (a local durable queue): taken back from there.
                None => {
                    self.tasks.begin_run(entry, true, now);
                    self.storage.take_stored(entry, &mut self.tasks.fx);
                }
            }
        }
    }

    /// A run is over (the worker reported it, or the job never reached a worker): release
    /// the capacity, settle with the queue, deliver the outcome unless one was delivered,
    /// and start what the freed capacity fits.
    pub fn finish(&mut self, entry: EntryId, outcome: Result<R, PoolError>, now: u64) {
        self.finish_run(entry, outcome, false, now);
    }

    /// [`finish`](Self::finish) as a worker reports it: `rests` when its thread still has
    /// work the task left on it, so its slot takes no job until [`worker_ready`](Self::worker_ready).
    pub fn finish_run(
        &mut self,
        entry: EntryId,
        outcome: Result<R, PoolError>,
        rests: bool,
        now: u64,
    ) {
        let Some(outcome) = self.rerun_if_yielded(entry, outcome, rests, now) else {
            return;
        };
        let Some(outcome) = self.retry_if_failed(entry, outcome, rests, now) else {
            return;
        };
        let Some((record, started)) = self.tasks.release(entry, rests, now) else {
            tracing::warn!(pool = %self.tasks.pool, entry, "a finish for a task the scheduler does not hold");
            drop_contained(outcome);
            return;
        };
        let (ended, from_queue) = record
            .run()
            .map_or((false, false), |run| (run.ended, run.from_queue));
        let settlement = Settlement::of_outcome(&outcome);
        if from_queue {
            let fx = &mut self.tasks.fx;
            self.storage.settle_stored(entry, settlement.clone(), fx);
        }
        let settle = record.lease().map(|claim| (claim, settlement));
        if ended {
            drop_contained(outcome);
            if let Some((claim, settlement)) = settle {
                self.tasks
                    .fx
                    .shared(SharedCall::Settle { claim, settlement });
            }
        } else {
            self.tasks.deliver(record, outcome, settle, now);
        }
        self.lifecycle.note_finished();
        self.start_parked(started, now);
        self.stop_if_drained();
        self.claim_if_open(now);
        if self.gpu_sampled && self.tasks.core.parked_len() > 0 {
            self.tasks.fx.push(Effect::WakeGpu);
        }
    }

    /// A worker whose slot rested can take a job again: start what it fits.
    pub fn worker_ready(&mut self, worker: usize, now: u64) {
        let started = self.tasks.core.worker_ready(worker, now);
        self.start_parked(started, now);
        self.claim_if_open(now);
    }

    /// A job's worker channel was closed: it never reached a worker.
    pub fn job_lost(&mut self, entry: EntryId, now: u64) {
        self.finish(entry, Err(PoolError::Shutdown), now);
    }

    /// A new headroom from the GPU sampler (the live guard): start what it lets through.
    pub fn set_headroom(&mut self, kind: ResourceKind, units: Option<u32>, now: u64) {
        let started = self.tasks.core.set_headroom(kind, units, now);
        self.start_parked(started, now);
        self.claim_if_open(now);
    }

    /// What the queue actor reported.
    pub fn queue_report(&mut self, report: QueueReport<P>, now: u64) {
        let Some(room) = self.storage.local() else {
            return;
        };
        match report {
            QueueReport::Parked { entry } => room.stored(&mut self.tasks, entry, now),
            QueueReport::ParkFailed {
                entry,
                backend,
                fault,
            } => {
                let failure = (backend, fault);
                let started = room.park_failed(&mut self.tasks, entry, failure, now);
                self.start_parked(started, now);
            }
            QueueReport::Claimed { entry, task } => {
                room.answered();
                self.send_job(entry, task, now);
            }
            QueueReport::ClaimFailed { entry, fault } => {
                room.answered();
                self.claim_failed(entry, fault, now);
            }
        }
    }

    /// A started task's payload could not be taken from the queue: it never reached a
    /// worker, so its capacity is released at once and it fails.
    fn claim_failed(&mut self, entry: EntryId, fault: BackendFault, now: u64) {
        self.tasks.observers.queue_error();
        if let Some(run) = self.tasks.ledger.get_mut(entry).and_then(Record::run_mut) {
            run.from_queue = false;
        }
        let reason = format!("could not take the task from the queue: {fault}");
        self.finish(entry, Err(PoolError::Failed(reason)), now);
    }

    /// Ends the parked tasks the core shed to make room for a newcomer of higher priority
    /// (core rule 21): each is refused (`QueueFull`) as if it had met the full queue at its
    /// own admission, but having been admitted it ends `Rejected`, its waiter or mailbox
    /// hears it and a durable queue forgets it.
    fn end_shed(&mut self, shed: Vec<EntryId>, now: u64) {
        for entry in self.end_waiters(shed, &PoolError::QueueFull) {
            self.end_parked(entry, PoolError::QueueFull, now);
        }
    }

    /// Ends a task the core no longer holds as parked (removing it from the local durable
    /// queue, where it is stored there).
    fn end_parked(&mut self, entry: EntryId, outcome: PoolError, now: u64) {
        let stored_in_queue = self.tasks.end_parked(entry, outcome, now);
        self.forget_stored(entry, stored_in_queue);
    }

    /// Has the mode's store forget ended task `entry`, when it holds it.
    fn forget_stored(&mut self, entry: EntryId, stored_in_queue: bool) {
        if stored_in_queue {
            self.storage.forget_stored(entry, &mut self.tasks.fx);
        }
    }

    /// Time-driven work: spins that are over, deadlines, the watchdog, starvation aging.
    pub fn tick(&mut self, now: u64) {
        if self.storage.tick(&mut self.tasks, now) {
            self.claim_if_open(now);
        }
        let tick = self.tasks.core.tick(now);
        for entry in self.end_waiters(tick.expired, &PoolError::Expired) {
            self.end_parked(entry, PoolError::Expired, now);
        }
        for entry in tick.overdue {
            self.tasks.end_running(entry, PoolError::TimedOut, now);
        }
        self.start_parked(tick.started, now);
    }

    /// A worker failed and will not be restarted: retire its slot; its task can never
    /// finish, so it fails and its capacity is released.
    pub fn worker_lost(&mut self, worker: usize, reason: String, now: u64) {
        if let Some(entry) = self.tasks.core.retire_worker(worker) {
            let outcome = Err(PoolError::Failed(format!("its worker is gone: {reason}")));
            self.finish(entry, outcome, now);
        }
        self.stop_if_drained();
    }

    /// The supervisor gave up: refuse new work; parked tasks of a durable queue are kept,
    /// the others fail with the reason.
    pub fn escalated(&mut self, reason: String, now: u64) {
        self.lifecycle.escalate(reason.clone());
        self.take_parked(PoolError::Failed(reason), now);
    }

    /// Empties the parking lot: kept by a durable or shared queue, or ended with `outcome`.
    /// Returns (kept, ended).
    fn take_parked(&mut self, outcome: PoolError, now: u64) -> (usize, usize) {
        let parked = self.tasks.core.take_parked();
        let parked = self.end_waiters(parked, &PoolError::Shutdown);
        let count = parked.len();
        if !self.storage.keeps_parked() {
            for entry in parked {
                self.end_parked(entry, outcome.clone(), now);
            }
            return (0, count);
        }
        self.storage.store_all(&mut self.tasks, now);
        let mut handed_back = Vec::new();
        for entry in parked {
            if self.storage.holds_until_stored(entry) {
                // Kept until the queue answers its park (see `LocalRoom::stored`).
                continue;
            }
            if let Some(mut record) = self.tasks.ledger.remove(entry) {
                self.tasks.answer_pending_park(&mut record, now);
                // A claimed task waiting here goes back to the shared queue at once, for
                // another node, rather than waiting there for its lease to run out.
                handed_back.extend(record.lease());
                drop_contained(record.take_payload());
            }
        }
        self.hand_back(handed_back, now);
        (count, 0)
    }

    /// Hands `claims` back to the shared queue at once (a stopping node's work).
    fn hand_back(&mut self, claims: Vec<Claim>, now: u64) {
        if !claims.is_empty() {
            tracing::info!(pool = %self.tasks.pool, claims = claims.len(), "handing claimed tasks back to the shared queue");
            self.tasks.fx.shared(SharedCall::Release { claims, now });
        }
    }

    /// Stops admitting and drains. Every caller waits for the same drain and gets the same
    /// report. `Begins` for the first caller, which arms the drain deadline.
    pub fn shutdown(
        &mut self,
        reply: ractor::RpcReplyPort<crate::scheduler::protocol::ShutdownReport>,
        now: u64,
    ) -> Shutdown {
        let mut lifecycle = std::mem::take(&mut self.lifecycle);
        let mut effects = Effects::default();
        let shutdown = lifecycle.shutdown(reply, &mut effects, || {
            self.take_parked(PoolError::Cancelled, now)
        });
        self.lifecycle = lifecycle;
        for effect in effects.take(Vec::new()) {
            self.tasks.fx.push(effect);
        }
        self.stop_if_drained();
        shutdown
    }

    /// The drain deadline passed: running tasks end `Cancelled` now, except those claimed
    /// from a shared queue, which are stopped and handed back for another node to run.
    pub fn drain_deadline(&mut self, now: u64) {
        if !self.lifecycle.is_draining() {
            return;
        }
        let mut handed_back = Vec::new();
        let mut abandoned = 0;
        for entry in self.tasks.ledger.entries() {
            if let Some(claim) = self.tasks.stop_claimed_run(entry) {
                handed_back.push(claim);
                abandoned += 1;
            } else if self.tasks.end_running(entry, PoolError::Cancelled, now) {
                abandoned += 1;
            }
        }
        self.hand_back(handed_back, now);
        self.lifecycle.note_abandoned(abandoned);
        self.lifecycle.stop(&mut self.tasks.fx);
    }

    fn stop_if_drained(&mut self) {
        // Held permits do not hold a drain up: they run outside the pool. A claim in flight
        // does: its answer is handed back before the node stops (the drain deadline stops
        // it all the same).
        if self.lifecycle.is_draining()
            && self.tasks.core.running_len() <= self.permits.held_len()
            && !self.storage.holds_stop()
        {
            self.lifecycle.stop(&mut self.tasks.fx);
        }
    }

    /// Hands over the effects asked for so far; `spare` (the last batch, emptied) becomes
    /// the next buffer.
    /// Parents that ended are settled first (see `dependencies.rs`): their children start
    /// or end in the same turn.
    pub fn take_effects(&mut self, spare: Vec<Effect<P, R>>) -> Vec<Effect<P, R>> {
        self.settle_dependencies();
        self.tasks.fx.take(spare)
    }

    /// Whether effects wait to be carried out (or parents' ends to be settled, which make
    /// some).
    pub fn has_effects(&self) -> bool {
        !self.tasks.fx.is_empty() || self.tasks.dependencies.is_unsettled()
    }

    /// Publishes the gauges to every observer.
    pub fn publish(&self) {
        self.tasks.observers.publish(&self.tasks.core);
    }

    /// The pool's name.
    pub fn pool(&self) -> &Arc<str> {
        &self.tasks.pool
    }

    /// Whether the queue actor owes answers: the scheduler then should not spin on its
    /// inbox, since those answers arrive as actor messages the spin would keep waiting.
    pub fn awaiting_queue(&self) -> bool {
        self.storage.awaits_queue()
    }

    /// When the next tick has work to do.
    pub fn next_wakeup(&self) -> Option<u64> {
        match (self.tasks.core.next_wakeup(), self.storage.next_due()) {
            (Some(core), Some(spin)) => Some(core.min(spin)),
            (core, spin) => core.or(spin),
        }
    }

    /// A snapshot of the counters.
    pub fn stats(&self) -> PoolStats {
        self.tasks.observers.counters.snapshot()
    }
}
