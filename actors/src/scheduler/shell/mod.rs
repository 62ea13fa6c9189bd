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

pub(crate) mod effects;
pub(crate) mod ledger;
pub(crate) mod lifecycle;
pub(crate) mod observe;
pub(crate) mod storage;

use std::sync::Arc;
use std::time::Duration;

use crate::contain::drop_contained;
use crate::domain::{
    MailboxKey, PoolError, ResourceKind, ScheduledTask, TaskId, TaskMetadata, TaskStatus,
};
use crate::events::{Refusal, TaskStep};
use crate::mailbox::{status_of, Delivery, Mailbox};
use crate::queue::actor::QueueReport;
use crate::queue::{EntryId, Lease, QueueError, Settlement, StoredEntry};
use crate::running::{Cancellation, RunContext};
use crate::scheduler::core::{clamp_ms, Cancel, Newcomer, ParkingLot, TenantKey, Ticket};
use crate::scheduler::protocol::{Enqueued, Extras, Reply, SharedReport, SubmitOptions};
use crate::stats::PoolStats;
use crate::stream::{StreamAttachment, StreamShared};
use crate::worker::Job;

use effects::{CancelReply, Effect, Effects, Outcome, SharedCall};
use ledger::{admitted_ms, sequence_of, Phase, Record, Run, TaskKey};
use lifecycle::Lifecycle;
pub(crate) use lifecycle::Shutdown;
use observe::{Detail, Observers};
use storage::{SharedRoom, Storage};

/// How long after a task's execution timeout the watchdog declares it `TimedOut` itself,
/// for executors that block their thread and so cannot be interrupted.
const WATCHDOG_GRACE_MS: u64 = 10;

/// Everything a shell starts with.
pub(crate) struct ShellArgs<R> {
    /// The pool's name.
    pub pool: Arc<str>,
    /// The core, with the pool's limits.
    pub core: ParkingLot,
    /// The execution timeout of tasks that set none.
    pub default_timeout: Option<Duration>,
    /// Where parked tasks are kept.
    pub storage: Storage,
    /// The pool's counters (the first observer).
    pub counters: Arc<crate::stats::PoolCounters>,
    /// Who else hears every event.
    pub subscribers: Vec<Arc<dyn crate::events::EventSubscriber>>,
    /// The mailbox, read (never written) to refuse work it has no room to answer.
    pub mailbox: Arc<dyn Mailbox<R>>,
    /// Whether a GPU sampler wants to hear that tasks wait for memory.
    pub gpu_sampled: bool,
}

/// A task being admitted, from a submitter or from a shared queue's claim.
struct Admission<P> {
    task: ScheduledTask<P>,
    key: MailboxKey,
    timeout: Option<Duration>,
    origin: Origin,
}

/// Where an admitted task comes from.
enum Origin {
    /// A submitter waits for the answer.
    Submitted {
        reply: Reply,
        extras: Option<Box<Extras>>,
    },
    /// This node claimed it from the shared queue under a lease.
    Leased { shared_entry: EntryId, attempt: u32 },
}

/// The shell. See the module docs.
pub(crate) struct Shell<P, R> {
    pool: Arc<str>,
    core: ParkingLot,
    ledger: ledger::Ledger<P>,
    storage: Storage,
    lifecycle: Lifecycle,
    observers: Observers,
    effects: Effects<P, R>,
    default_timeout: Option<Duration>,
    /// Turns a mailbox tenant into the core's tenant key (seeded per pool, so nobody can
    /// pick two tenant names that share a fair share on purpose).
    tenant_keys: foldhash::fast::RandomState,
    mailbox: Arc<dyn Mailbox<R>>,
    gpu_sampled: bool,
}

impl<P, R> Shell<P, R>
where
    P: Send + 'static,
    R: Send + 'static,
{
    /// A shell for `args`, with the parked tasks a durable queue kept (indexed again, then
    /// started as they fit).
    pub fn new(args: ShellArgs<R>, stored: Vec<(StoredEntry, Option<P>)>, now: u64) -> Self {
        let limits = *args.core.limits();
        for (gauge, kind) in args.counters.total.iter().zip(ResourceKind::ALL) {
            gauge.store(
                u64::from(limits.capacity.get(kind)),
                std::sync::atomic::Ordering::Relaxed,
            );
        }
        args.counters
            .worker_count
            .store(limits.worker_slots, std::sync::atomic::Ordering::Relaxed);
        let mut shell = Self {
            pool: args.pool,
            core: args.core,
            ledger: ledger::Ledger::default(),
            storage: args.storage,
            lifecycle: Lifecycle::default(),
            observers: Observers::new(args.counters, args.subscribers),
            effects: Effects::default(),
            default_timeout: args.default_timeout,
            tenant_keys: foldhash::fast::RandomState::default(),
            mailbox: args.mailbox,
            gpu_sampled: args.gpu_sampled,
        };
        shell.restore(stored, now);
        shell
    }

    /// Indexes stored parked tasks (with their payloads where the ledger keeps them), then
    /// starts what fits.
    fn restore(&mut self, stored: Vec<(StoredEntry, Option<P>)>, now: u64) {
        for (StoredEntry { entry, meta }, payload) in stored {
            self.ledger.note_entry(entry);
            let key = meta.mailbox.clone().unwrap_or_else(MailboxKey::anonymous);
            let ticket = self.ticket(entry, &meta, &key, self.default_timeout);
            if self.core.restore(ticket, now).is_err() {
                tracing::error!(pool = %self.pool, entry, "a stored entry appears twice; kept once");
                continue;
            }
            let mut record = self.record(entry, &meta, &key, self.default_timeout);
            record.payload = payload;
            self.ledger.insert(record);
        }
        self.tick(now);
    }

    // -----------------------------------------------------------------------------------
    // Admission
    // -----------------------------------------------------------------------------------

    /// A submission: start, park or refuse it.
    pub fn submit(
        &mut self,
        mut task: ScheduledTask<P>,
        options: SubmitOptions,
        reply: Reply,
        extras: Option<Box<Extras>>,
        now: u64,
    ) {
        let admissible = self
            .lifecycle
            .admits()
            .and_then(|()| self.mailbox_has_room())
            .and_then(|()| self.streamable(extras.as_deref()));
        if let Err(refusal) = admissible {
            self.refuse(task, refusal, reply, now);
            return;
        }
        let key = task
            .meta
            .mailbox
            .take()
            .unwrap_or_else(MailboxKey::anonymous);
        if self.ledger.has_caller(&key.tenant, task.meta.id) {
            let duplicate = PoolError::DuplicateTask(task.meta.id);
            task.meta.mailbox = Some(key);
            self.refuse(task, duplicate, reply, now);
            return;
        }
        let timeout = options.timeout.or(self.default_timeout);
        let origin = Origin::Submitted { reply, extras };
        self.admit(
            Admission {
                task,
                key,
                timeout,
                origin,
            },
            now,
        );
    }

    /// Admits a task claimed from the shared queue, as its lease's holder.
    fn run_leased(&mut self, lease: Lease<P>, now: u64) {
        let Lease {
            entry: shared_entry,
            task,
            attempt,
            ..
        } = lease;
        if !self.lifecycle.is_open() {
            // Stopping: its lease runs out and another node runs it.
            drop_contained(task);
            return;
        }
        let key = task
            .meta
            .mailbox
            .clone()
            .unwrap_or_else(MailboxKey::anonymous);
        if self.ledger.has_caller(&key.tenant, task.meta.id) {
            let id = task.meta.id;
            let reason = format!("task id {id} is live on this node already");
            self.effects.shared(SharedCall::Settle {
                entry: shared_entry,
                settlement: Settlement::Failed(reason),
            });
            let outcome = Err(PoolError::DuplicateTask(id));
            self.deliver_report(key, id, task.meta.cost, attempt, outcome, now);
            drop_contained(task);
            return;
        }
        let timeout = self.default_timeout;
        let origin = Origin::Leased {
            shared_entry,
            attempt,
        };
        self.admit(
            Admission {
                task,
                key,
                timeout,
                origin,
            },
            now,
        );
    }

    /// Asks the core, then carries out its answer for the newcomer and for the parked tasks
    /// that start with it.
    fn admit(&mut self, admission: Admission<P>, now: u64) {
        let entry = self.ledger.next_entry(now);
        let ticket = self.ticket(
            entry,
            &admission.task.meta,
            &admission.key,
            admission.timeout,
        );
        let (newcomer, unblocked) = self.core.admit(ticket, now).newcomer();
        match newcomer {
            Newcomer::Start => self.start_admitted(entry, admission, now),
            Newcomer::Park => self.park_admitted(entry, admission, now),
            Newcomer::Expire => self.end_unadmitted(admission, PoolError::Expired, now),
            Newcomer::Reject(rejection) => self.end_unadmitted(admission, rejection.into(), now),
        }
        self.start_parked(unblocked, now);
    }

    /// A newcomer that starts at once.
    fn start_admitted(&mut self, entry: EntryId, admission: Admission<P>, now: u64) {
        let Admission {
            mut task,
            key,
            timeout,
            origin,
        } = admission;
        let rank_time_ms = admitted_ms(entry);
        match origin {
            Origin::Submitted { reply, .. } if self.records_starts_shared() => {
                // Stored as this node's claim first; it runs, and its submitter hears, once
                // the queue answers (`SharedReport::Recorded`).
                let shared_entry = SharedRoom::entry_for(sequence_of(entry));
                self.track(entry, &task.meta, &key, timeout, None);
                self.set_lease(entry, shared_entry, 1);
                self.step(entry, TaskStep::Admitted, now);
                self.begin_run(entry, false, now);
                task.meta.mailbox = Some(key.clone());
                self.effects.shared(SharedCall::RecordStart {
                    entry,
                    shared_entry,
                    rank_time_ms,
                    task,
                    key,
                    reply,
                    now,
                });
            }
            Origin::Submitted { reply, extras } if self.stores_starts_locally() => {
                // Stored as running first: parked and claimed through the queue; it runs,
                // and its submitter hears, once the queue hands it back.
                self.track(entry, &task.meta, &key, timeout, extras);
                self.step(entry, TaskStep::Admitted, now);
                self.begin_run(entry, true, now);
                if let Some(record) = self.ledger.get_mut(entry) {
                    record.rare_mut().reply = Some(reply);
                }
                task.meta.mailbox = Some(key);
                if let Some(room) = self.storage.local() {
                    room.park(entry, task, &mut self.effects);
                    room.claim(entry, &mut self.effects);
                }
            }
            Origin::Submitted { reply, extras } => {
                self.track(entry, &task.meta, &key, timeout, extras);
                self.step(entry, TaskStep::Admitted, now);
                self.begin_run(entry, false, now);
                task.meta.mailbox = Some(key.clone());
                self.effects.answer(reply, Ok(key));
                self.send_job(entry, task, now);
            }
            Origin::Leased {
                shared_entry,
                attempt,
            } => {
                self.track(entry, &task.meta, &key, timeout, None);
                self.set_lease(entry, shared_entry, attempt);
                self.step(entry, TaskStep::Admitted, now);
                self.begin_run(entry, false, now);
                task.meta.mailbox = Some(key);
                self.send_job(entry, task, now);
            }
        }
    }

    /// A newcomer that waits.
    fn park_admitted(&mut self, entry: EntryId, admission: Admission<P>, now: u64) {
        let Admission {
            mut task,
            key,
            timeout,
            origin,
        } = admission;
        let (reply, extras) = match origin {
            Origin::Submitted { reply, .. } if self.storage.is_shared() => {
                // It parks in the shared queue, where any node may claim it, not here.
                if let Ok(Cancel::Parked { started }) = self.core.cancel(entry, now) {
                    self.start_parked(started, now);
                }
                task.meta.mailbox = Some(key.clone());
                self.effects.shared(SharedCall::Enqueue {
                    entry: SharedRoom::entry_for(sequence_of(entry)),
                    rank_time_ms: admitted_ms(entry),
                    task,
                    key,
                    reply,
                });
                return;
            }
            Origin::Submitted { reply, extras } => (Some(reply), extras),
            Origin::Leased {
                shared_entry,
                attempt,
            } => {
                // Its capacity was taken while the claim was in flight: it parks here, under
                // its lease, where the core's order protects it.
                self.track(entry, &task.meta, &key, timeout, None);
                self.set_lease(entry, shared_entry, attempt);
                self.keep_parked(entry, task.payload, None, key, now);
                return;
            }
        };
        self.track(entry, &task.meta, &key, timeout, extras);
        let spin = self.storage.local().map(|room| room.spin());
        match spin {
            // In memory: the ledger is the store.
            None => self.keep_parked(entry, task.payload, reply, key, now),
            Some(Some(spin)) => {
                if let Some(room) = self.storage.local() {
                    room.spin_from(entry, spin, now);
                }
                self.keep_parked(entry, task.payload, reply, key, now);
            }
            Some(None) => {
                if let (Some(record), Some(reply)) = (self.ledger.get_mut(entry), reply) {
                    record.rare_mut().reply = Some(reply);
                }
                task.meta.mailbox = Some(key);
                if let Some(room) = self.storage.local() {
                    room.park(entry, task, &mut self.effects);
                }
            }
        }
    }

    /// Keeps a parked task's payload in its record, announces it and answers its submitter.
    fn keep_parked(
        &mut self,
        entry: EntryId,
        payload: P,
        reply: Option<Reply>,
        key: MailboxKey,
        now: u64,
    ) {
        if let Some(record) = self.ledger.get_mut(entry) {
            record.payload = Some(payload);
        }
        self.step(entry, TaskStep::Admitted, now);
        self.step(entry, TaskStep::Parked, now);
        if let Some(reply) = reply {
            self.effects.answer(reply, Ok(key));
        }
    }

    /// A newcomer the core expired or refused: its submitter hears why; a leased task's
    /// claim ends and its mailbox hears it.
    fn end_unadmitted(&mut self, admission: Admission<P>, error: PoolError, now: u64) {
        let Admission {
            mut task,
            key,
            origin,
            ..
        } = admission;
        match origin {
            Origin::Submitted { reply, .. } if error == PoolError::Expired => {
                let step = TaskStep::Ended(TaskStatus::Expired);
                self.step_unrecorded(&task.meta, &key, &step, now);
                self.effects.answer(reply, Err(error));
                drop_contained(task);
            }
            Origin::Submitted { reply, .. } => {
                task.meta.mailbox = Some(key);
                self.refuse(task, error, reply, now);
            }
            Origin::Leased {
                shared_entry,
                attempt,
            } => {
                let settlement = match &error {
                    PoolError::Expired => Settlement::Done,
                    other => Settlement::Failed(other.to_string()),
                };
                self.effects.shared(SharedCall::Settle {
                    entry: shared_entry,
                    settlement,
                });
                let (id, cost) = (task.meta.id, task.meta.cost);
                self.deliver_report(key, id, cost, attempt, Err(error), now);
                drop_contained(task);
            }
        }
    }

    /// Refuses a submission: its submitter hears why.
    fn refuse(&mut self, task: ScheduledTask<P>, error: PoolError, reply: Reply, now: u64) {
        let key = task
            .meta
            .mailbox
            .clone()
            .unwrap_or_else(|| MailboxKey::new(""));
        let step = TaskStep::Refused(Refusal::of(&error));
        self.step_unrecorded(&task.meta, &key, &step, now);
        self.effects.answer(reply, Err(error));
        drop_contained(task);
    }

    /// Why the mailbox cannot take another outcome, if it cannot.
    fn mailbox_has_room(&self) -> Result<(), PoolError> {
        let Some(inline) = self.mailbox.inline() else {
            return Ok(());
        };
        let (stored, live) = (inline.stored_now(), self.ledger.len());
        let max_messages = inline.max_messages();
        if stored.saturating_add(live) >= max_messages {
            return Err(PoolError::MailboxFull {
                stored,
                live,
                max_messages,
            });
        }
        Ok(())
    }

    /// Why a streamed submission cannot be taken here, if so.
    fn streamable(&self, extras: Option<&Extras>) -> Result<(), PoolError> {
        let Some(stream) = extras.and_then(|extras| extras.stream.as_ref()) else {
            return Ok(());
        };
        if self.storage.is_shared() {
            return Err(PoolError::InvalidConfig(format!(
                "pool {}: streamed submissions need a local queue; this pool's queue is shared \
                 with other nodes, which could not reach the stream (submit without streaming, \
                 or stream from a pool with an in_memory, yaque or local queue)",
                self.pool
            )));
        }
        if !stream.0.is::<StreamShared<R>>() {
            return Err(PoolError::InvalidConfig(format!(
                "pool {}: the stream's item type is not this pool's result type; make the \
                 stream with ResultStream::<R>::channel for the pool's R",
                self.pool
            )));
        }
        Ok(())
    }

    fn records_starts_shared(&mut self) -> bool {
        self.storage
            .shared()
            .is_some_and(|room| room.records_starts())
    }

    fn stores_starts_locally(&mut self) -> bool {
        self.storage
            .local()
            .is_some_and(|room| room.stores_starts())
    }

    /// Records an admitted task, not yet running.
    fn track(
        &mut self,
        entry: EntryId,
        meta: &TaskMetadata,
        key: &MailboxKey,
        timeout: Option<Duration>,
        extras: Option<Box<Extras>>,
    ) {
        let mut record = self.record(entry, meta, key, timeout);
        if let Some(extras) = extras {
            let rare = record.rare_mut();
            rare.stream = extras.stream;
            rare.slot = extras.slot;
        }
        self.ledger.insert(record);
    }

    /// A fresh record of a task, with its span when a subscriber wants one.
    fn record(
        &self,
        entry: EntryId,
        meta: &TaskMetadata,
        key: &MailboxKey,
        timeout: Option<Duration>,
    ) -> Record<P> {
        let mut record = Record::new(entry, meta, TaskKey::of(key.clone()), timeout);
        let span = task_span(&self.pool, meta, key);
        if !span.is_disabled() {
            record.rare_mut().span = Some(span);
        }
        record
    }

    fn set_lease(&mut self, entry: EntryId, shared_entry: EntryId, attempt: u32) {
        if let Some(record) = self.ledger.get_mut(entry) {
            record.rare_mut().lease = Some((shared_entry, attempt));
        }
    }

    // -----------------------------------------------------------------------------------
    // Running
    // -----------------------------------------------------------------------------------

    /// Marks a task running on the slot the core gave it and arms its watchdog.
    fn begin_run(&mut self, entry: EntryId, from_queue: bool, now: u64) {
        let Some(record) = self.ledger.get_mut(entry) else {
            return;
        };
        let cancellation = record
            .stream()
            .and_then(stream_of::<R>)
            .map_or_else(Cancellation::new, |stream| stream.cancellation().clone());
        // Started before the queue confirmed its park: its submitter keeps waiting for that
        // confirmation, now as a running task's, and it is announced as parked first.
        let announce = matches!(record.phase, Phase::Parked)
            && record.rare().is_some_and(|rare| rare.reply.is_some());
        record.key.expand();
        record.phase = Phase::Running(Run {
            started_ms: now,
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

    /// Hands a started task's job to its worker slot.
    fn send_job(&mut self, entry: EntryId, task: ScheduledTask<P>, now: u64) {
        let worker = self.core.worker_of(entry);
        let carried = self.ledger.get_mut(entry).and_then(|record| {
            let stream = record.stream().map(|stream| stream.0.clone());
            let timeout = record.timeout();
            let span = record.rare().and_then(|rare| rare.span.clone());
            let run = record.run_mut().filter(|run| !run.sent)?;
            run.sent = true;
            let context = RunContext {
                cancellation: run.cancellation.clone(),
                stream,
            };
            Some((context, timeout, span))
        });
        let (Some(worker), Some((context, timeout, span))) = (worker, carried) else {
            tracing::error!(pool = %self.pool, entry, "bug: a job for a task that is not running");
            drop_contained(task);
            return;
        };
        if context.cancellation.is_cancelled() {
            // A streamed task whose reader left while it was parked: it never runs.
            drop_contained(task);
            self.finish(entry, Err(PoolError::Cancelled), now);
            return;
        }
        let job = Job {
            entry,
            task,
            timeout,
            context,
            span: span.unwrap_or_else(tracing::Span::none),
        };
        self.effects.push(Effect::Run { worker, job });
    }

    /// Starts parked tasks the core chose, in order.
    fn start_parked(&mut self, started: Vec<EntryId>, now: u64) {
        for entry in started {
            let Some(record) = self.ledger.get_mut(entry) else {
                tracing::error!(pool = %self.pool, entry, "bug: the core started a task the ledger does not hold");
                continue;
            };
            match record.take_task() {
                // Kept in the ledger (memory, a spin, a claimed task parked here).
                Some(task) => {
                    self.begin_run(entry, false, now);
                    self.send_job(entry, task, now);
                }
                // Stored in the local durable queue: taken back through the queue actor.
                None => {
                    self.begin_run(entry, true, now);
                    if let Some(room) = self.storage.local() {
                        room.claim(entry, &mut self.effects);
                    }
                }
            }
        }
    }

    /// A run is over (the worker reported it, or the job never reached a worker): release
    /// the capacity, settle with the queue, deliver the outcome unless one was delivered,
    /// and start what the freed capacity fits.
    pub fn finish(&mut self, entry: EntryId, outcome: Result<R, PoolError>, now: u64) {
        let Some(mut record) = self.ledger.remove(entry) else {
            tracing::warn!(pool = %self.pool, entry, "a finish for a task the scheduler does not hold");
            drop_contained(outcome);
            return;
        };
        let started = self.core.complete(entry, now).unwrap_or_else(|error| {
            tracing::error!(pool = %self.pool, %error, "capacity release refused");
            Vec::new()
        });
        self.observers.publish(&self.core);
        record.release_nested_slot();
        let (ended, from_queue) = record
            .run()
            .map_or((false, false), |run| (run.ended, run.from_queue));
        let settlement = match &outcome {
            Err(PoolError::Failed(reason)) => Settlement::Failed(reason.clone()),
            _ => Settlement::Done,
        };
        if from_queue {
            if let Some(room) = self.storage.local() {
                room.settle(entry, settlement.clone(), &mut self.effects);
            }
        }
        let settle = record
            .lease()
            .map(|(shared_entry, _)| (shared_entry, settlement));
        if ended {
            drop_contained(outcome);
            if let Some((entry, settlement)) = settle {
                self.effects
                    .shared(SharedCall::Settle { entry, settlement });
            }
        } else {
            self.deliver(record, outcome, settle, now);
        }
        self.lifecycle.note_finished();
        self.start_parked(started, now);
        self.stop_if_drained();
        self.claim_if_room(now);
        if self.gpu_sampled && self.core.parked_len() > 0 {
            self.effects.push(Effect::WakeGpu);
        }
    }

    /// A job's worker channel was closed: it never reached a worker.
    pub fn job_lost(&mut self, entry: EntryId, now: u64) {
        self.finish(entry, Err(PoolError::Shutdown), now);
    }

    /// A new headroom from the GPU sampler (the live guard): start what it lets through.
    pub fn set_headroom(&mut self, kind: ResourceKind, units: Option<u32>, now: u64) {
        let started = self.core.set_headroom(kind, units, now);
        self.start_parked(started, now);
        self.claim_if_room(now);
    }

    // -----------------------------------------------------------------------------------
    // The local durable queue's reports
    // -----------------------------------------------------------------------------------

    /// What the queue actor reported.
    pub fn queue_report(&mut self, report: QueueReport<P>, now: u64) {
        if let Some(room) = self.storage.local() {
            room.answered();
        }
        match report {
            QueueReport::Parked { entry } => self.stored(entry, now),
            QueueReport::ParkFailed { entry, reason } => self.park_failed(entry, reason, now),
            QueueReport::Claimed { entry, task } => self.send_job(entry, task, now),
            QueueReport::ClaimFailed { entry, reason } => self.claim_failed(entry, reason, now),
        }
    }

    /// A park is stored: its submitter, if it still waits, hears it was admitted.
    fn stored(&mut self, entry: EntryId, now: u64) {
        let Some(record) = self.ledger.get_mut(entry) else {
            return;
        };
        let Some(reply) = record.take_reply() else {
            return;
        };
        let key = record.key.key().into_owned();
        if matches!(record.phase, Phase::Parked) {
            self.step(entry, TaskStep::Admitted, now);
            self.step(entry, TaskStep::Parked, now);
        }
        self.effects.answer(reply, Ok(key));
    }

    /// A park was refused by the queue. A parked task was never admitted after all; a task
    /// stored as it started is refused, and its claim (asked after the park) fails next and
    /// releases its capacity.
    fn park_failed(&mut self, entry: EntryId, reason: String, now: u64) {
        self.observers.queue_error();
        let Some(record) = self.ledger.get_mut(entry) else {
            return;
        };
        if let Some(run) = record.run_mut() {
            run.ended = true;
            run.from_queue = false;
            let reply = record.take_reply();
            self.step(entry, TaskStep::Refused(Refusal::QueueError), now);
            if let Some(reply) = reply {
                let error = PoolError::Internal(format!("could not store the task: {reason}"));
                self.effects.answer(reply, Err(error));
            }
            return;
        }
        let Some(mut record) = self.ledger.remove(entry) else {
            return;
        };
        record.release_nested_slot();
        let started = match self.core.cancel(entry, now) {
            Ok(Cancel::Parked { started }) => started,
            _ => Vec::new(),
        };
        let error = PoolError::Internal(format!("could not park the task: {reason}"));
        match record.take_reply() {
            Some(reply) => {
                self.observers
                    .record_step(&record, &TaskStep::Refused(Refusal::QueueError), now);
                self.effects.answer(reply, Err(error));
            }
            // Its submitter was told it is admitted (a spun task): it ends with the failure,
            // so the submitter's wait for a result ends too.
            None => self.deliver(record, Err(error), None, now),
        }
        self.start_parked(started, now);
    }

    /// A started task's payload could not be taken from the queue: it never reached a
    /// worker, so its capacity is released at once and it fails.
    fn claim_failed(&mut self, entry: EntryId, reason: String, now: u64) {
        self.observers.queue_error();
        if let Some(run) = self.ledger.get_mut(entry).and_then(Record::run_mut) {
            run.from_queue = false;
        }
        let reason = format!("could not take the task from the queue: {reason}");
        self.finish(entry, Err(PoolError::Failed(reason)), now);
    }

    // -----------------------------------------------------------------------------------
    // The shared queue's reports
    // -----------------------------------------------------------------------------------

    /// What a shared-queue call answered, or a poll.
    pub fn shared_report(&mut self, report: SharedReport<P>, now: u64) {
        match report {
            SharedReport::Poll => {
                if self
                    .storage
                    .shared()
                    .is_some_and(|room| room.renewal_due(now))
                {
                    let held = self
                        .ledger
                        .iter()
                        .filter_map(Record::lease)
                        .map(|(lease, _)| lease)
                        .collect();
                    self.effects.shared(SharedCall::Renew { held, now });
                }
                self.claim_if_room(now);
            }
            SharedReport::Wake => self.claim_if_room(now),
            SharedReport::Enqueued(group) => {
                for enqueued in group {
                    self.enqueued(enqueued, now);
                }
            }
            SharedReport::Claimed(claimed) => self.claimed(claimed, now),
            SharedReport::Removed {
                key,
                id,
                reply,
                result,
            } => self.removed(key, id, reply, result, now),
            SharedReport::Recorded {
                entry,
                key,
                reply,
                result,
            } => self.recorded(entry, key, reply, result, now),
            SharedReport::Dead(letters) => {
                for letter in letters {
                    tracing::warn!(pool = %self.pool, task_id = letter.task_id, reason = %letter.reason, "the shared queue gave up on a task");
                    let outcome = Err(PoolError::Failed(letter.reason));
                    // The attempt that gave up is not known here; the first is reported.
                    self.deliver_report(letter.key, letter.task_id, letter.cost, 1, outcome, now);
                }
            }
            SharedReport::Lost(entries) => {
                for lost in entries {
                    let held = self
                        .ledger
                        .iter()
                        .any(|record| record.lease().is_some_and(|(lease, _)| lease == lost));
                    if held {
                        tracing::warn!(pool = %self.pool, entry = lost, "a shared lease was lost while its task ran here; another node may run it too");
                    }
                }
            }
        }
    }

    /// A task handed to the shared queue is stored (its submitter hears it is accepted), or
    /// could not be (its submitter hears why).
    fn enqueued(&mut self, enqueued: Enqueued, now: u64) {
        let Enqueued {
            task_id,
            key,
            cost,
            reply,
            result,
        } = enqueued;
        match result {
            Ok(()) => {
                self.observers
                    .step(task_id, &key, cost, &TaskStep::Admitted, now, Detail::NONE);
                self.observers
                    .step(task_id, &key, cost, &TaskStep::Parked, now, Detail::NONE);
                self.effects.answer(reply, Ok(key));
            }
            Err(error) => {
                self.observers.queue_error();
                let refused = TaskStep::Refused(Refusal::QueueError);
                self.observers
                    .step(task_id, &key, cost, &refused, now, Detail::NONE);
                let backend = self.shared_backend();
                let text = format!("could not park the task: {backend} queue: {error}");
                self.effects.answer(reply, Err(PoolError::Internal(text)));
            }
        }
    }

    fn claimed(&mut self, claimed: Result<Vec<Lease<P>>, QueueError>, now: u64) {
        if let Some(room) = self.storage.shared() {
            room.claim_answered();
        }
        match claimed {
            Ok(leases) if leases.is_empty() => {}
            Ok(leases) => {
                for lease in leases {
                    self.run_leased(lease, now);
                }
                self.claim_if_room(now);
            }
            Err(error) => {
                self.observers.queue_error();
                tracing::warn!(pool = %self.pool, %error, "shared queue claim failed; retrying at the next poll");
            }
        }
    }

    fn removed(
        &mut self,
        key: MailboxKey,
        id: TaskId,
        reply: CancelReply,
        result: Result<Option<ScheduledTask<P>>, QueueError>,
        now: u64,
    ) {
        let answer = match result {
            Ok(Some(task)) => {
                let cost = task.meta.cost;
                drop_contained(task);
                self.deliver_report(key, id, cost, 1, Err(PoolError::Cancelled), now);
                Ok(())
            }
            Ok(None) => Err(PoolError::TaskNotFound(id)),
            Err(error) => {
                self.observers.queue_error();
                Err(PoolError::Internal(format!(
                    "could not cancel in the shared queue: {error}"
                )))
            }
        };
        self.effects.push(Effect::AnswerCancel { reply, answer });
    }

    /// A task started at once was stored as this node's claim, or could not be.
    fn recorded(
        &mut self,
        entry: EntryId,
        key: MailboxKey,
        reply: Reply,
        result: Result<Lease<P>, QueueError>,
        now: u64,
    ) {
        let lease = match result {
            Ok(lease) => lease,
            Err(error) => {
                self.observers.queue_error();
                let backend = self.shared_backend();
                let text = format!("could not store the task: {backend} queue: {error}");
                if let Some(record) = self.ledger.get_mut(entry) {
                    // Its submitter hears the error; nothing goes to the mailbox.
                    record.rare_mut().lease = None;
                    if let Some(run) = record.run_mut() {
                        run.ended = true;
                    }
                }
                self.finish(entry, Err(PoolError::Internal(text.clone())), now);
                self.effects.answer(reply, Err(PoolError::Internal(text)));
                return;
            }
        };
        self.effects.answer(reply, Ok(key));
        let ended = self
            .ledger
            .get(entry)
            .map(|record| record.run().is_none_or(|run| run.ended));
        match ended {
            Some(false) => self.send_job(entry, lease.task, now),
            // Cancelled (or timed out) while it was being stored: its outcome is delivered
            // and no worker will report it, so it ends here (which releases its capacity
            // and settles its claim).
            Some(true) => {
                drop_contained(lease.task);
                self.finish(entry, Err(PoolError::Cancelled), now);
            }
            None => {
                drop_contained(lease.task);
                self.effects.shared(SharedCall::Settle {
                    entry: lease.entry,
                    settlement: Settlement::Done,
                });
            }
        }
    }

    /// Claims from the shared queue if this node has room (see [`SharedRoom::claim_wanted`]).
    fn claim_if_room(&mut self, now: u64) {
        if !self.lifecycle.is_open() {
            return;
        }
        let Storage::Shared(room) = &mut self.storage else {
            return;
        };
        let parked = self
            .ledger
            .iter()
            .filter(|record| matches!(record.phase, Phase::Parked))
            .map(|record| record.cost);
        if let Some((query, max)) = room.claim_wanted(&self.core, parked, now) {
            self.effects.shared(SharedCall::Claim { query, max, now });
        }
    }

    fn shared_backend(&mut self) -> &'static str {
        self.storage
            .shared()
            .map_or("shared", |room| room.backend())
    }

    // -----------------------------------------------------------------------------------
    // Cancel, time, failures
    // -----------------------------------------------------------------------------------

    /// Cancels the live task `id` of exactly `key`, here or parked in the shared queue.
    pub fn cancel(&mut self, key: MailboxKey, id: TaskId, reply: CancelReply, now: u64) {
        let local = self
            .ledger
            .entry_of_caller(&key.tenant, id)
            .filter(|&entry| {
                self.ledger
                    .get(entry)
                    .is_some_and(|record| record.key.is(&key))
            });
        let answer = match local {
            Some(entry) => self.cancel_local(entry, id, now),
            None if self.storage.is_shared() => {
                self.effects
                    .shared(SharedCall::RemoveTask { key, id, reply });
                return;
            }
            None => Err(PoolError::TaskNotFound(id)),
        };
        self.effects.push(Effect::AnswerCancel { reply, answer });
    }

    fn cancel_local(&mut self, entry: EntryId, id: TaskId, now: u64) -> Result<(), PoolError> {
        match self.core.cancel(entry, now) {
            Ok(Cancel::Parked { started }) => {
                self.end_parked(entry, PoolError::Cancelled, now);
                self.start_parked(started, now);
                Ok(())
            }
            Ok(Cancel::Running) => {
                if let Some(run) = self.ledger.get_mut(entry).and_then(Record::run_mut) {
                    run.cancellation.cancel();
                }
                Ok(())
            }
            Err(_) => Err(PoolError::TaskNotFound(id)),
        }
    }

    /// Ends a task the core no longer holds as parked.
    fn end_parked(&mut self, entry: EntryId, outcome: PoolError, now: u64) {
        let Some(mut record) = self.ledger.remove(entry) else {
            return;
        };
        match record.payload.take() {
            Some(payload) => {
                drop_contained(payload);
            }
            None => {
                if let Some(room) = self.storage.local() {
                    room.remove(entry, &mut self.effects);
                }
            }
        }
        if let Some((lease, _)) = record.lease() {
            self.effects.shared(SharedCall::Settle {
                entry: lease,
                settlement: Settlement::Done,
            });
        }
        self.answer_pending_park(&mut record);
        record.release_nested_slot();
        self.deliver(record, Err(outcome), None, now);
    }

    /// Answers a submitter still waiting for its park to be stored: the task was admitted.
    fn answer_pending_park(&mut self, record: &mut Record<P>) {
        if let Some(reply) = record.take_reply() {
            self.effects
                .answer(reply, Ok(record.key.key().into_owned()));
        }
    }

    /// Time-driven work: spins that are over, deadlines, the watchdog, starvation aging.
    pub fn tick(&mut self, now: u64) {
        self.store_spun(now, false);
        let tick = self.core.tick(now);
        for entry in tick.expired {
            self.end_parked(entry, PoolError::Expired, now);
        }
        for entry in tick.overdue {
            self.end_running(entry, PoolError::TimedOut, now);
        }
        self.start_parked(tick.started, now);
    }

    /// Stores the parked tasks whose spin is over (`all`: every spinning task).
    fn store_spun(&mut self, now: u64, all: bool) {
        let Storage::Local(room) = &mut self.storage else {
            return;
        };
        while let Some(entry) = room.next_spun(now, all) {
            let Some(record) = self.ledger.get_mut(entry) else {
                continue;
            };
            if !matches!(record.phase, Phase::Parked) {
                continue;
            }
            if let Some(task) = record.take_task() {
                room.park(entry, task, &mut self.effects);
            }
        }
    }

    /// Delivers an outcome for a running task before its thread returns, and asks the thread
    /// to drop its future. Its capacity stays held until the thread reports back.
    fn end_running(&mut self, entry: EntryId, outcome: PoolError, now: u64) -> bool {
        let Some(record) = self.ledger.get_mut(entry) else {
            return false;
        };
        let Some(run) = record.run_mut().filter(|run| !run.ended) else {
            return false;
        };
        run.ended = true;
        run.cancellation.cancel();
        let outcome = Err(outcome);
        let step = TaskStep::Ended(status_of(&outcome));
        self.observers.record_step(record, &step, now);
        let key = record.key.key().into_owned();
        let (task_id, attempt) = (record.task_id, record.attempt());
        let stream = record.rare.as_mut().and_then(|rare| rare.stream.take());
        self.send_outcome(stream, key, task_id, attempt, outcome, None, now);
        true
    }

    /// A worker failed and will not be restarted: retire its slot; its task can never
    /// finish, so it fails and its capacity is released.
    pub fn worker_lost(&mut self, worker: usize, reason: String, now: u64) {
        if let Some(entry) = self.core.retire_worker(worker) {
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
        let parked = self.core.take_parked();
        let count = parked.len();
        if !self.storage.keeps_parked() {
            for entry in parked {
                self.end_parked(entry, outcome.clone(), now);
            }
            return (0, count);
        }
        self.store_spun(now, true);
        for entry in parked {
            if let Some(mut record) = self.ledger.remove(entry) {
                self.answer_pending_park(&mut record);
                if let Some(payload) = record.payload.take() {
                    // A claimed task parked here: its lease runs out and another node runs it.
                    drop_contained(payload);
                }
            }
        }
        (count, 0)
    }

    // -----------------------------------------------------------------------------------
    // Shutdown
    // -----------------------------------------------------------------------------------

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
            self.effects.push(effect);
        }
        self.stop_if_drained();
        shutdown
    }

    /// The drain deadline passed: running tasks end `Cancelled` now.
    pub fn drain_deadline(&mut self, now: u64) {
        if !self.lifecycle.is_draining() {
            return;
        }
        let abandoned = self
            .ledger
            .entries()
            .into_iter()
            .filter(|&entry| self.end_running(entry, PoolError::Cancelled, now))
            .count();
        self.lifecycle.note_abandoned(abandoned);
        self.lifecycle.stop(&mut self.effects);
    }

    fn stop_if_drained(&mut self) {
        if self.lifecycle.is_draining() && self.core.running_len() == 0 {
            self.lifecycle.stop(&mut self.effects);
        }
    }

    // -----------------------------------------------------------------------------------
    // Outcomes and events
    // -----------------------------------------------------------------------------------

    /// Delivers an ended task's outcome (to its stream, or to the mailbox), then settles
    /// `settle` once it is stored.
    fn deliver(
        &mut self,
        mut record: Record<P>,
        outcome: Result<R, PoolError>,
        settle: Option<(EntryId, Settlement)>,
        now: u64,
    ) {
        let step = TaskStep::Ended(status_of(&outcome));
        self.observers.record_step(&record, &step, now);
        let stream = record.rare.as_mut().and_then(|rare| rare.stream.take());
        let (task_id, attempt) = (record.task_id, record.attempt());
        let key = match record.key {
            TaskKey::Named(key) => *key,
            TaskKey::Anonymous(bits) => MailboxKey::anonymous_from_bits(bits),
        };
        self.send_outcome(stream, key, task_id, attempt, outcome, settle, now);
    }

    /// Delivers the outcome of a task the ledger does not hold (a shared queue's report).
    fn deliver_report(
        &mut self,
        key: MailboxKey,
        task_id: TaskId,
        cost: crate::domain::ResourceCost,
        attempt: u32,
        outcome: Result<R, PoolError>,
        now: u64,
    ) {
        let step = TaskStep::Ended(status_of(&outcome));
        self.observers
            .step(task_id, &key, cost, &step, now, Detail::NONE);
        self.send_outcome(None, key, task_id, attempt, outcome, None, now);
    }

    /// Asks for an outcome to go to `stream`, or to the mailbox under `key`.
    #[allow(clippy::too_many_arguments)]
    fn send_outcome(
        &mut self,
        stream: Option<StreamAttachment>,
        key: MailboxKey,
        task_id: TaskId,
        attempt: u32,
        outcome: Result<R, PoolError>,
        settle: Option<(EntryId, Settlement)>,
        now: u64,
    ) {
        if let Some(stream) = stream {
            // A streamed outcome goes to its stream, behind the partials (nobody could
            // retrieve it from the mailbox).
            self.effects.push(Effect::EndStream { stream, outcome });
            if let Some((entry, settlement)) = settle {
                self.effects
                    .shared(SharedCall::Settle { entry, settlement });
            }
            return;
        }
        let delivery = Delivery {
            task_id,
            outcome,
            stored_at_ms: now,
        };
        self.effects.push(Effect::Deliver(Outcome {
            key,
            delivery,
            attempt,
            settle,
        }));
    }

    fn step(&self, entry: EntryId, step: TaskStep, now: u64) {
        if let Some(record) = self.ledger.get(entry) {
            self.observers.record_step(record, &step, now);
        }
    }

    fn step_unrecorded(&self, meta: &TaskMetadata, key: &MailboxKey, step: &TaskStep, now: u64) {
        let detail = Detail {
            since_ms: None,
            priority: Some(meta.priority),
        };
        self.observers
            .step(meta.id, key, meta.cost, step, now, detail);
    }

    // -----------------------------------------------------------------------------------
    // For the driver
    // -----------------------------------------------------------------------------------

    /// Hands over the effects asked for so far; `spare` (the last batch, emptied) becomes
    /// the next buffer.
    pub fn take_effects(&mut self, spare: Vec<Effect<P, R>>) -> Vec<Effect<P, R>> {
        self.effects.take(spare)
    }

    /// Whether effects wait to be carried out.
    pub fn has_effects(&self) -> bool {
        !self.effects.is_empty()
    }

    /// Publishes the gauges to every observer.
    pub fn publish(&self) {
        self.observers.publish(&self.core);
    }

    /// The pool's name.
    pub fn pool(&self) -> &Arc<str> {
        &self.pool
    }

    /// Whether the queue actor owes answers: the scheduler then should not spin on its
    /// inbox, since those answers arrive as actor messages the spin would keep waiting.
    pub fn awaiting_queue(&self) -> bool {
        matches!(&self.storage, Storage::Local(room) if room.awaiting())
    }

    /// When the next tick has work to do.
    pub fn next_wakeup(&self) -> Option<u64> {
        match (self.core.next_wakeup(), self.storage.next_due()) {
            (Some(core), Some(spin)) => Some(core.min(spin)),
            (core, spin) => core.or(spin),
        }
    }

    /// A snapshot of the counters.
    pub fn stats(&self) -> PoolStats {
        self.observers.counters.snapshot()
    }

    /// The core's ticket for an entry: ranked by admission (the entry id), not by the
    /// caller's `created_at_ms`, which stays metadata; with the execution timeout it will run
    /// under, and its tenant's key when the pool has a fair share.
    fn ticket(
        &self,
        entry: EntryId,
        meta: &TaskMetadata,
        key: &MailboxKey,
        timeout: Option<Duration>,
    ) -> Ticket {
        let tenant = if self.core.limits().fair_share.is_some() {
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
    use std::hash::BuildHasher;
    if key.is_anonymous() {
        return 0;
    }
    keys.hash_one(&key.tenant).max(1)
}

/// The typed buffer behind a stream attachment (checked at admission, so always `Some`).
pub(crate) fn stream_of<R: Send + 'static>(stream: &StreamAttachment) -> Option<&StreamShared<R>> {
    stream.0.downcast_ref::<StreamShared<R>>()
}
