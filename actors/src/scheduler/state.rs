//! The scheduler's state, and how it carries out the core's decisions.
//!
//! The [`SchedulerActor`](super::actor::SchedulerActor) hands every event here; this file
//! feeds it to the pure core and turns the core's answers into effects: a started task's job
//! goes to the worker slot the core chose; a parked task's payload goes to the queue; every
//! terminal outcome goes to the mailbox, exactly once, after the task's capacity is released
//! (an in-memory mailbox is stored into here, and its notifiers told right after the store).
//!
//! Invariants:
//! - every admitted task is in `live` (and in `by_caller` under its tenant and id) until it
//!   has ended and its capacity is released;
//! - at most one outcome per task reaches the mailbox: once the watchdog or the drain
//!   deadline delivered one for a running task (`Running::ended`), the worker's late outcome
//!   only releases capacity and is dropped;
//! - capacity is released (core `complete`) exactly once, when the worker reports the run
//!   over or the job provably never reached a worker, because until then its memory may be in
//!   use; the gauges are published before the outcome becomes retrievable;
//! - queue calls for one entry are made in order: park, then claim or remove, then settle.
//!
//! Durability (a durable local queue driven through the queue actor, see [`Durability`]):
//! - `Accepted`: a task that starts at once takes its capacity in the core at once, is
//!   parked and claimed through the queue (so it is stored as running), and its submitter is
//!   answered and its job sent only once the queue confirmed the park and handed the task
//!   back; it is settled when it ends, like any task claimed from the queue;
//! - `Parked { spin }` with a non-zero spin: a task that starts at once touches no file; a task
//!   that would park is answered at once and waits `spin` in memory (`spinning`), and is sent
//!   to the queue only if still parked then; one that starts, is cancelled or expires within
//!   the spin never touches the queue. Shutdown and escalation store the spinning tasks.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::oneshot;

use super::core::{Admit, Cancel, FastMap, ParkingLot, TenantKey, Ticket};
use super::gpu_watch::{GpuLink, GpuWatch, Headroom};
use super::inbox::{Finish, Inbox};
use super::protocol::{Extras, QueueReport, Reply, ShutdownReport, Submission, SubmitOptions};
use super::shared::{Enqueued, SharedLink, SharedReport};
use crate::contain::drop_contained;
use crate::domain::{
    Capacity, Durability, MailboxKey, PoolError, Priority, ResourceCost, ResourceKind,
    ScheduledTask, TaskId, TaskStatus, TenantId,
};
use crate::events::{EventSubscriber, PoolReading, Refusal, TaskEvent, TaskStep};
use crate::mailbox::actor::{AfterStore, MailboxMsg};
use crate::mailbox::notify::Notifiers;
use crate::mailbox::{status_of, Delivery, Mailbox};
use crate::queue::actor::QueueMsg;
use crate::queue::{EntryId, FitQuery, Lease, Settlement, StarvationRule, StoredEntry, TaskQueue};
use crate::running::{Cancellation, RunContext};
use crate::stats::PoolCounters;
use crate::stream::{StreamAttachment, StreamShared};
use crate::worker::{Job, JobSenders};
use ractor::{ActorRef, RpcReplyPort};

/// How long after a task's execution timeout the watchdog declares it `TimedOut` itself,
/// for executors that block their thread and so cannot be interrupted.
const WATCHDOG_GRACE_MS: u64 = 10;

/// Entry ids are the admission time in milliseconds shifted left by this many bits, plus a
/// counter within the millisecond: increasing in admission order and across restarts.
const ENTRY_TIME_SHIFT: u32 = 16;

/// Where parked payloads go: driven directly, or through the queue actor.
pub(crate) enum Parking<P> {
    Inline(Box<dyn TaskQueue<P>>),
    Actor(ActorRef<QueueMsg<P>>),
}

/// Where outcomes go: stored directly, or through the mailbox actor.
pub(crate) enum Results<R> {
    Inline {
        mailbox: Arc<dyn Mailbox<R>>,
        notifiers: Notifiers<R>,
    },
    Actor(ActorRef<MailboxMsg<R>>),
}

/// An admitted task that has not ended.
struct Live {
    key: MailboxKey,
    task_id: TaskId,
    cost: ResourceCost,
    priority: Priority,
    /// When it was admitted (the event stream's wait times start here).
    admitted_ms: u64,
    /// Its `task` span, from admission to its end (disabled unless a subscriber wants it).
    span: tracing::Span,
    timeout: Option<Duration>,
    /// The shared queue's entry, for a task this node claimed from it under a lease.
    lease: Option<EntryId>,
    /// Which run of the task this is: 1, or the lease's claim count.
    attempt: u32,
    state: LiveState,
    /// Its stream (its outcome goes there, not to the mailbox) and its nested slot, for the
    /// few tasks that have either.
    extras: Option<Box<Extras>>,
}

impl Live {
    fn stream(&self) -> Option<&StreamAttachment> {
        self.extras.as_ref()?.stream.as_ref()
    }

    /// Gives back the task's nested slot, if it holds one: before its outcome is visible, so
    /// a parent that reads it and submits the next child finds the slot free.
    fn release_nested_slot(&mut self) {
        if let Some(extras) = &mut self.extras {
            extras.slot = None;
        }
    }
}

enum LiveState {
    /// In the parking lot. `reply` waits for the queue actor to confirm the park.
    Parked { reply: Option<Reply> },
    /// Started on the core's worker slot.
    Running(Running),
}

struct Running {
    /// When it started (the event stream's run times start here).
    started_ms: u64,
    /// Raised to stop the run; the job carries a clone (a streamed task's is its stream's).
    cancellation: Cancellation,
    /// The job was sent to its worker.
    sent: bool,
    /// An outcome was delivered already (watchdog or drain deadline).
    ended: bool,
    /// Its payload came from the queue, which must hear how it ended.
    from_queue: bool,
    /// Its submitter, waiting until the queue has stored the task (`Durability::Accepted`).
    stored_reply: Option<Reply>,
}

/// The pool's admission state.
enum Mode {
    Open,
    Escalated(String),
    Draining {
        waiters: Vec<RpcReplyPort<ShutdownReport>>,
        report: ShutdownReport,
    },
    Stopped(ShutdownReport),
}

/// Everything the scheduler starts with.
pub(crate) struct SchedulerArgs<P, R> {
    pub pool: Arc<str>,
    pub core: ParkingLot,
    pub default_timeout: Option<Duration>,
    pub jobs: JobSenders<P>,
    pub parking: Parking<P>,
    pub durable: bool,
    pub results: Results<R>,
    pub inbox: Arc<Inbox<P, R>>,
    pub counters: Arc<PoolCounters>,
    pub subscribers: Vec<Arc<dyn EventSubscriber>>,
    pub stored: Vec<StoredEntry>,
    pub shared: Option<SharedLink<P>>,
    pub gpu: Option<GpuWatch>,
    /// What the local queue stores, when it is durable and driven through the queue actor.
    pub durability: Option<Durability>,
    /// Where the queue actor (and escalation) find the scheduler: filled in before the
    /// scheduler restores stored tasks, whose claims the queue actor answers.
    pub scheduler_slot: Arc<std::sync::OnceLock<ActorRef<super::protocol::SchedulerMsg<P>>>>,
}

/// The scheduler's state. See the module docs.
pub(crate) struct Scheduler<P, R> {
    pool: Arc<str>,
    core: ParkingLot,
    default_timeout: Option<Duration>,
    jobs: JobSenders<P>,
    parking: Parking<P>,
    durable: bool,
    results: Results<R>,
    pub(super) inbox: Arc<Inbox<P, R>>,
    counters: Arc<PoolCounters>,
    subscribers: Vec<Arc<dyn EventSubscriber>>,
    live: FastMap<EntryId, Live>,
    by_caller: FastMap<(TenantId, TaskId), EntryId>,
    last_entry: EntryId,
    mode: Mode,
    pub(super) armed_tick: Option<u64>,
    pub(super) shared: Option<SharedLink<P>>,
    pub(super) gpu: Option<GpuLink>,
    durability: Option<Durability>,
    /// Parked tasks waiting out their spin in memory (`Durability::Parked`), by entry. (The
    /// mutex, never contended, makes the scheduler `Sync` for any `Send` payload.)
    spinning: FastMap<EntryId, std::sync::Mutex<ScheduledTask<P>>>,
    /// When each spinning task is due to be written, in that order (entries that left
    /// `spinning` meanwhile are skipped).
    spin_due: VecDeque<(u64, EntryId)>,
    /// Turns a mailbox tenant into the core's tenant key (seeded per pool, so nobody can
    /// pick two tenant names that share a fair share on purpose).
    tenant_keys: foldhash::fast::RandomState,
    /// Parks and claims sent to the queue actor and not yet answered.
    queue_waits: usize,
}

impl<P, R> Scheduler<P, R>
where
    P: Send + 'static,
    R: Send + 'static,
{
    pub fn new(args: SchedulerArgs<P, R>, now: u64) -> Self {
        let limits = *args.core.limits();
        let total = ResourceKind::ALL.map(|kind| u64::from(limits.capacity.get(kind)));
        for (gauge, units) in args.counters.total.iter().zip(total) {
            gauge.store(units, std::sync::atomic::Ordering::Relaxed);
        }
        args.counters
            .worker_count
            .store(limits.worker_slots, std::sync::atomic::Ordering::Relaxed);
        let mut gpu = args
            .gpu
            .map(|watch| GpuLink::new(watch, args.pool.clone(), args.counters.clone()));
        let mut core = args.core;
        if let Some(first) = gpu.as_mut().and_then(GpuLink::first_sample) {
            core.set_headroom(first.kind, first.units, now);
        }
        let mut scheduler = Self {
            pool: args.pool,
            core,
            default_timeout: args.default_timeout,
            tenant_keys: foldhash::fast::RandomState::default(),
            jobs: args.jobs,
            parking: args.parking,
            durable: args.durable,
            results: args.results,
            inbox: args.inbox,
            counters: args.counters,
            subscribers: args.subscribers,
            live: FastMap::default(),
            by_caller: FastMap::default(),
            last_entry: 0,
            mode: Mode::Open,
            armed_tick: None,
            shared: args.shared,
            gpu,
            durability: args.durability,
            spinning: FastMap::default(),
            spin_due: VecDeque::new(),
            queue_waits: 0,
        };
        scheduler.restore(args.stored, now);
        scheduler
    }

    /// Indexes the parked tasks a durable queue kept, then starts what fits.
    fn restore(&mut self, stored: Vec<StoredEntry>, now: u64) {
        for StoredEntry { entry, meta } in stored {
            self.last_entry = self.last_entry.max(entry);
            let key = meta.mailbox.clone().unwrap_or_else(MailboxKey::anonymous);
            let ticket = self.ticket(entry, &meta, self.default_timeout);
            if self.core.restore(ticket, now).is_err() {
                tracing::error!(pool = %self.pool, entry, "a stored entry appears twice; kept once");
                continue;
            }
            self.by_caller.insert((key.tenant.clone(), meta.id), entry);
            let span = task_span(&self.pool, &meta, &key);
            self.live.insert(
                entry,
                Live {
                    key,
                    task_id: meta.id,
                    cost: meta.cost,
                    priority: meta.priority,
                    admitted_ms: entry >> ENTRY_TIME_SHIFT,
                    span,
                    timeout: self.default_timeout,
                    lease: None,
                    attempt: 1,
                    state: LiveState::Parked { reply: None },
                    extras: None,
                },
            );
        }
        self.tick(now);
    }

    // -----------------------------------------------------------------------------------
    // Admission
    // -----------------------------------------------------------------------------------

    /// Takes everything waiting in the inbox, finishes first.
    pub fn drain_inbox(&mut self, now: u64) {
        loop {
            let mut handled = 0;
            while let Some(Finish { entry, outcome }) = self.inbox.next_finish() {
                self.finish(entry, outcome, now);
                handled += 1;
            }
            for _ in 0..64 {
                let Some(submission) = self.inbox.next_submission() else {
                    break;
                };
                self.submission(submission, now);
                handled += 1;
            }
            if handled == 0 {
                return;
            }
        }
    }

    fn submission(&mut self, submission: Submission<P>, now: u64) {
        match submission {
            Submission::One {
                task,
                options,
                reply,
                extras,
            } => self.submit(task, options, reply, extras, now),
            Submission::Batch {
                tasks,
                options,
                reply,
                slots,
            } => {
                let mut answers = Vec::with_capacity(tasks.len());
                let mut slots = slots.into_iter();
                for task in tasks {
                    let (answer, wait) = oneshot::channel();
                    let extras = slots.next().map(|slot| {
                        Box::new(Extras {
                            stream: None,
                            slot: Some(slot),
                        })
                    });
                    self.submit(task, options, Reply::Oneshot(answer), extras, now);
                    answers.push(wait);
                }
                answer_batch(answers, reply);
            }
        }
    }

    /// Admits a task: start, park, or refuse it.
    pub fn submit(
        &mut self,
        task: ScheduledTask<P>,
        options: SubmitOptions,
        reply: Reply,
        extras: Option<Box<Extras>>,
        now: u64,
    ) {
        if let Err(refusal) = self
            .admissible(&task)
            .and_then(|()| self.streamable(extras.as_deref()))
        {
            self.refuse(&task, refusal, reply, now);
            return;
        }
        let key = task
            .meta
            .mailbox
            .clone()
            .unwrap_or_else(MailboxKey::anonymous);
        let caller = (key.tenant.clone(), task.meta.id);
        if self.by_caller.contains_key(&caller) {
            let id = task.meta.id;
            self.refuse(&task, PoolError::DuplicateTask(id), reply, now);
            return;
        }
        let entry = self.next_entry(now);
        let ticket = self.ticket(entry, &task.meta, options.timeout.or(self.default_timeout));
        let (admit, unblocked) = self.core.admit(ticket, now).split_started();
        match admit {
            Admit::Start if self.shared.as_ref().is_some_and(SharedLink::records_starts) => {
                self.start_recorded(
                    caller,
                    entry,
                    with_mailbox(task, &key),
                    key,
                    options,
                    reply,
                    now,
                );
            }
            Admit::Start if self.durability == Some(Durability::Accepted) => {
                let task = with_mailbox(task, &key);
                self.track(caller, entry, &task, key, options, None, extras);
                self.emit(entry, TaskStep::Admitted, now);
                self.begin_run(entry, true, now);
                self.store_started(entry, task, reply, now);
            }
            Admit::Start => {
                self.track(caller, entry, &task, key.clone(), options, None, extras);
                self.emit(entry, TaskStep::Admitted, now);
                self.begin_run(entry, false, now);
                reply.send(Ok(key.clone()));
                self.send_job(entry, with_mailbox(task, &key), now);
            }
            Admit::Park if self.shared.is_some() => {
                self.park_shared(entry, with_mailbox(task, &key), key, reply, now);
            }
            Admit::Park => {
                let task = with_mailbox(task, &key);
                self.track(caller, entry, &task, key.clone(), options, None, extras);
                match self.durability {
                    Some(Durability::Parked { spin }) if !spin.is_zero() => {
                        self.spin(entry, task, spin, now);
                        self.emit(entry, TaskStep::Admitted, now);
                        self.emit(entry, TaskStep::Parked, now);
                        reply.send(Ok(key));
                    }
                    _ => self.park(entry, task, key, reply, now),
                }
            }
            Admit::Expire => {
                self.emit_for(&task, &key, &TaskStep::Ended(TaskStatus::Expired), now);
                reply.send(Err(PoolError::Expired));
                drop_contained(task);
            }
            Admit::Reject(rejection) => self.refuse(&task, rejection.into(), reply, now),
            Admit::StartWith(_) => unreachable!("split_started leaves no StartWith"),
        }
        if !unblocked.is_empty() {
            self.start_parked(unblocked, now);
        }
    }

    /// Why no task may be admitted now, if so.
    fn admissible(&self, _task: &ScheduledTask<P>) -> Result<(), PoolError> {
        match &self.mode {
            Mode::Open => {}
            Mode::Escalated(reason) => return Err(PoolError::Internal(reason.clone())),
            Mode::Draining { .. } | Mode::Stopped(_) => return Err(PoolError::Shutdown),
        }
        if let Results::Inline { mailbox, .. } = &self.results {
            if let Some(inline) = mailbox.inline() {
                let (stored, live) = (inline.stored_now(), self.live.len());
                let max_messages = inline.max_messages();
                if stored.saturating_add(live) >= max_messages {
                    return Err(PoolError::MailboxFull {
                        stored,
                        live,
                        max_messages,
                    });
                }
            }
        }
        Ok(())
    }

    /// Why a streamed submission cannot be taken here, if so.
    fn streamable(&self, extras: Option<&Extras>) -> Result<(), PoolError> {
        let Some(stream) = extras.and_then(|extras| extras.stream.as_ref()) else {
            return Ok(());
        };
        if self.shared.is_some() {
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

    fn refuse(&mut self, task: &ScheduledTask<P>, error: PoolError, reply: Reply, now: u64) {
        let key = task
            .meta
            .mailbox
            .clone()
            .unwrap_or_else(|| MailboxKey::new(""));
        self.emit_for(task, &key, &TaskStep::Refused(Refusal::of(&error)), now);
        reply.send(Err(error));
    }

    fn next_entry(&mut self, now: u64) -> EntryId {
        let stamp = now.saturating_mul(1 << ENTRY_TIME_SHIFT);
        self.last_entry = stamp.max(self.last_entry.saturating_add(1));
        self.last_entry
    }

    /// Records an admitted task as live under its caller's (tenant, id), not yet running.
    /// `lease` is the shared queue's entry and claim count of a task claimed from it.
    #[allow(clippy::too_many_arguments)]
    fn track(
        &mut self,
        caller: (TenantId, TaskId),
        entry: EntryId,
        task: &ScheduledTask<P>,
        key: MailboxKey,
        options: SubmitOptions,
        lease: Option<(EntryId, u32)>,
        extras: Option<Box<Extras>>,
    ) {
        self.by_caller.insert(caller, entry);
        let span = task_span(&self.pool, &task.meta, &key);
        self.live.insert(
            entry,
            Live {
                key,
                task_id: task.meta.id,
                cost: task.meta.cost,
                priority: task.meta.priority,
                admitted_ms: entry >> ENTRY_TIME_SHIFT,
                span,
                timeout: options.timeout.or(self.default_timeout),
                lease: lease.map(|(shared_entry, _)| shared_entry),
                attempt: lease.map_or(1, |(_, attempt)| attempt),
                state: LiveState::Parked { reply: None },
                extras,
            },
        );
    }

    fn park(
        &mut self,
        entry: EntryId,
        task: ScheduledTask<P>,
        key: MailboxKey,
        reply: Reply,
        now: u64,
    ) {
        match &self.parking {
            Parking::Inline(queue) => {
                let parked = match queue.inline() {
                    Some(inline) => inline.park_now(entry, task),
                    None => Err(crate::queue::QueueError::Backend(
                        "inline queue lost its inline face".into(),
                    )),
                };
                match parked {
                    Ok(()) => {
                        self.emit(entry, TaskStep::Admitted, now);
                        self.emit(entry, TaskStep::Parked, now);
                        reply.send(Ok(key));
                    }
                    Err(error) => {
                        let backend = queue.backend();
                        self.park_failed(
                            entry,
                            format!("{backend} queue: {error}"),
                            Some(reply),
                            now,
                        );
                    }
                }
            }
            Parking::Actor(queue) => {
                if let Some(live) = self.live.get_mut(&entry) {
                    live.state = LiveState::Parked { reply: Some(reply) };
                }
                if queue.send_message(QueueMsg::Park { entry, task }).is_ok() {
                    self.queue_waits += 1;
                } else {
                    self.park_failed(entry, "the queue actor is gone".into(), None, now);
                }
            }
        }
    }

    /// Stores a task that started at once as running (`Durability::Accepted`): parked, then
    /// claimed, through the queue actor. Its submitter is answered once the park is stored;
    /// its job is sent once the claim hands the task back.
    fn store_started(&mut self, entry: EntryId, task: ScheduledTask<P>, reply: Reply, now: u64) {
        if let Some(LiveState::Running(running)) =
            self.live.get_mut(&entry).map(|live| &mut live.state)
        {
            running.stored_reply = Some(reply);
        }
        let Parking::Actor(queue) = &self.parking else {
            tracing::error!(pool = %self.pool, entry, "bug: a stored start without a queue actor");
            drop_contained(task);
            self.claim_failed(entry, "the queue has no actor".into(), now);
            return;
        };
        let sent = queue.send_message(QueueMsg::Park { entry, task }).is_ok()
            && queue.send_message(QueueMsg::Claim { entry }).is_ok();
        if sent {
            self.queue_waits += 2;
        } else {
            if let Some(LiveState::Running(running)) =
                self.live.get_mut(&entry).map(|live| &mut live.state)
            {
                running.ended = true;
                if let Some(reply) = running.stored_reply.take() {
                    reply.send(Err(PoolError::Internal(
                        "could not store the task: the queue actor is gone".into(),
                    )));
                }
            }
            self.claim_failed(entry, "the queue actor is gone".into(), now);
        }
    }

    /// Keeps a parked task in memory for `spin` before it is written (`Durability::Parked`).
    fn spin(&mut self, entry: EntryId, task: ScheduledTask<P>, spin: Duration, now: u64) {
        let spin_ms = u64::try_from(spin.as_millis()).unwrap_or(u64::MAX);
        self.spinning.insert(entry, std::sync::Mutex::new(task));
        self.spin_due
            .push_back((now.saturating_add(spin_ms), entry));
    }

    fn take_spinning(&mut self, entry: EntryId) -> Option<ScheduledTask<P>> {
        let task = self.spinning.remove(&entry)?;
        if self.spinning.is_empty() {
            // Every due time left belongs to a task that left the spin: none is needed.
            self.spin_due.clear();
        }
        Some(
            task.into_inner()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        )
    }

    /// Sends the parked tasks whose spin is over (`all`: every spinning task) to the queue.
    fn write_spun(&mut self, now: u64, all: bool) {
        while let Some(&(due, entry)) = self.spin_due.front() {
            if !all && due > now {
                return;
            }
            self.spin_due.pop_front();
            let Some(task) = self.take_spinning(entry) else {
                continue;
            };
            let sent = match &self.parking {
                Parking::Actor(queue) => queue.send_message(QueueMsg::Park { entry, task }).is_ok(),
                Parking::Inline(_) => {
                    drop_contained(task);
                    false
                }
            };
            if sent {
                self.queue_waits += 1;
            } else {
                self.park_failed(entry, "the queue actor is gone".into(), None, now);
            }
        }
    }

    /// A park was refused by the queue: the task was never admitted after all.
    fn park_failed(&mut self, entry: EntryId, reason: String, reply: Option<Reply>, now: u64) {
        PoolCounters::bump(&self.counters.queue_errors);
        let Some(live) = self.live.remove(&entry) else {
            return;
        };
        self.by_caller
            .remove(&(live.key.tenant.clone(), live.task_id));
        let mut live = live;
        live.release_nested_slot();
        let reply = reply.or(match &mut live.state {
            LiveState::Parked { reply } => reply.take(),
            LiveState::Running(_) => None,
        });
        let started = match self.core.cancel(entry, now) {
            Ok(Cancel::Parked { started }) => started,
            _ => Vec::new(),
        };
        let error = PoolError::Internal(format!("could not park the task: {reason}"));
        match reply {
            Some(reply) => {
                self.emit_live(&live, &TaskStep::Refused(Refusal::QueueError), now);
                reply.send(Err(error));
            }
            // Its submitter was told it is admitted (a spun task, or one kept at shutdown):
            // it ends with the failure, so the submitter's wait for a result ends too.
            None => self.deliver(&live, Err(error), now),
        }
        self.start_parked(started, now);
    }

    // -----------------------------------------------------------------------------------
    // Running
    // -----------------------------------------------------------------------------------

    /// Marks a live task running on the slot the core gave it and arms its watchdog.
    fn begin_run(&mut self, entry: EntryId, from_queue: bool, now: u64) {
        let Some(live) = self.live.get_mut(&entry) else {
            return;
        };
        let cancellation = match live.stream() {
            Some(stream) => stream_of::<R>(stream)
                .map_or_else(Cancellation::new, |stream| stream.cancellation().clone()),
            None => Cancellation::new(),
        };
        // Started before the queue actor confirmed its park: its submitter keeps waiting for
        // that confirmation (the claim follows the park), now as a running task's.
        let pending = match &mut live.state {
            LiveState::Parked { reply } => reply.take(),
            LiveState::Running(_) => None,
        };
        let announce = pending.is_some();
        live.state = LiveState::Running(Running {
            started_ms: now,
            cancellation,
            sent: false,
            ended: false,
            from_queue,
            stored_reply: pending,
        });
        if let Some(limit) = live.timeout {
            let limit = u64::try_from(limit.as_millis()).unwrap_or(u64::MAX);
            let at = now.saturating_add(limit).saturating_add(WATCHDOG_GRACE_MS);
            if at < u64::MAX {
                self.core.watch(entry, at);
            }
        }
        if announce {
            self.emit(entry, TaskStep::Admitted, now);
            self.emit(entry, TaskStep::Parked, now);
        }
        self.emit(entry, TaskStep::Started, now);
    }

    /// Sends a started task's job to its worker slot's channel.
    fn send_job(&mut self, entry: EntryId, task: ScheduledTask<P>, now: u64) {
        let worker = self.core.worker_of(entry);
        // One lookup gathers what the job carries; it marks the job sent.
        let carried = self.live.get_mut(&entry).and_then(|live| {
            let stream = live.stream().map(|stream| stream.0.clone());
            let (timeout, span) = (live.timeout, live.span.clone());
            match &mut live.state {
                LiveState::Running(running) if !running.sent => {
                    running.sent = true;
                    let cancellation = running.cancellation.clone();
                    Some((
                        RunContext {
                            cancellation,
                            stream,
                        },
                        timeout,
                        span,
                    ))
                }
                _ => None,
            }
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
            span,
        };
        let Some(jobs) = self.jobs.get(worker) else {
            drop_contained(job);
            self.finish(entry, Err(PoolError::Shutdown), now);
            return;
        };
        if let Err(returned) = jobs.send(job) {
            drop_contained(returned.0);
            self.finish(entry, Err(PoolError::Shutdown), now);
        }
    }

    /// Starts parked tasks the core chose, in order.
    fn start_parked(&mut self, started: Vec<EntryId>, now: u64) {
        for entry in started {
            if let Some(task) = self.take_spinning(entry) {
                // Started within its spin: it never touched the queue.
                self.begin_run(entry, false, now);
                self.send_job(entry, task, now);
                continue;
            }
            self.begin_run(entry, true, now);
            match &self.parking {
                Parking::Inline(queue) => {
                    let claimed = queue.inline().map(|inline| inline.claim_now(entry));
                    match claimed {
                        Some(Ok(Some(task))) => self.send_job(entry, task, now),
                        Some(Ok(None)) => {
                            self.claim_failed(entry, "it was no longer parked".into(), now)
                        }
                        Some(Err(error)) => self.claim_failed(entry, error.to_string(), now),
                        None => {
                            self.claim_failed(entry, "the queue lost its inline face".into(), now)
                        }
                    }
                }
                Parking::Actor(queue) => {
                    if queue.send_message(QueueMsg::Claim { entry }).is_ok() {
                        self.queue_waits += 1;
                    } else {
                        self.claim_failed(entry, "the queue actor is gone".into(), now);
                    }
                }
            }
        }
    }

    /// A started task's payload could not be claimed: it never reached a worker, so its
    /// capacity is released at once and it fails.
    fn claim_failed(&mut self, entry: EntryId, reason: String, now: u64) {
        PoolCounters::bump(&self.counters.queue_errors);
        if let Some(LiveState::Running(running)) =
            self.live.get_mut(&entry).map(|live| &mut live.state)
        {
            running.from_queue = false;
        }
        let reason = format!("could not take the task from the queue: {reason}");
        self.finish(entry, Err(PoolError::Failed(reason)), now);
    }

    /// What the queue actor reported.
    pub fn queue_report(&mut self, report: QueueReport<P>, now: u64) {
        self.queue_waits = self.queue_waits.saturating_sub(1);
        match report {
            QueueReport::Parked { entry } => {
                let Some(live) = self.live.get_mut(&entry) else {
                    return;
                };
                let key = live.key.clone();
                match &mut live.state {
                    // Answered and announced already when it was admitted (a spun task).
                    LiveState::Parked { reply: None } => {}
                    LiveState::Parked { reply } => {
                        let reply = reply.take();
                        self.emit(entry, TaskStep::Admitted, now);
                        self.emit(entry, TaskStep::Parked, now);
                        if let Some(reply) = reply {
                            reply.send(Ok(key));
                        }
                    }
                    // A started task stored as running (`Durability::Accepted`).
                    LiveState::Running(running) => {
                        if let Some(reply) = running.stored_reply.take() {
                            reply.send(Ok(key));
                        }
                    }
                }
            }
            QueueReport::ParkFailed { entry, reason } => {
                let running = self
                    .live
                    .get_mut(&entry)
                    .and_then(|live| match &mut live.state {
                        LiveState::Running(running) => Some(running),
                        LiveState::Parked { .. } => None,
                    });
                match running {
                    Some(running) => {
                        // A started task that could not be stored: refused. Its claim (sent
                        // after the park) fails next and releases its capacity.
                        running.ended = true;
                        running.from_queue = false;
                        let reply = running.stored_reply.take();
                        PoolCounters::bump(&self.counters.queue_errors);
                        self.emit(entry, TaskStep::Refused(Refusal::QueueError), now);
                        if let Some(reply) = reply {
                            reply.send(Err(PoolError::Internal(format!(
                                "could not store the task: {reason}"
                            ))));
                        }
                    }
                    None => self.park_failed(entry, reason, None, now),
                }
            }
            QueueReport::Claimed { entry, task } => self.send_job(entry, task, now),
            QueueReport::ClaimFailed { entry, reason } => self.claim_failed(entry, reason, now),
        }
    }

    /// A run is over (the worker reported it, or the job never reached a worker): release
    /// the capacity, settle with the queue, deliver the outcome unless one was delivered,
    /// and start what the freed capacity fits.
    pub fn finish(&mut self, entry: EntryId, outcome: Result<R, PoolError>, now: u64) {
        let Some(mut live) = self.live.remove(&entry) else {
            tracing::warn!(pool = %self.pool, entry, "a finish for a task the scheduler does not hold");
            drop_contained(outcome);
            return;
        };
        self.by_caller
            .remove(&(live.key.tenant.clone(), live.task_id));
        let started = match self.core.complete(entry, now) {
            Ok(started) => started,
            Err(error) => {
                tracing::error!(pool = %self.pool, %error, "capacity release refused");
                Vec::new()
            }
        };
        self.publish();
        live.release_nested_slot();
        let (ended, from_queue) = match &live.state {
            LiveState::Running(running) => (running.ended, running.from_queue),
            LiveState::Parked { .. } => (false, false),
        };
        let settlement = match &outcome {
            Err(PoolError::Failed(reason)) => Settlement::Failed(reason.clone()),
            _ => Settlement::Done,
        };
        if from_queue {
            self.settle(entry, settlement.clone());
        }
        // A shared claim ends only once its result is stored: a node that dies in between
        // leaves the claim to run out, and the task runs again elsewhere rather than being
        // lost with its result.
        let settle_lease = live.lease.and_then(|lease| {
            let settler = self.shared.as_ref()?.settler();
            Some(Box::new(move |stored: bool| {
                if stored {
                    settler.settle(lease, settlement);
                }
            }) as AfterStore)
        });
        if ended {
            drop_contained(outcome);
            if let Some(settle) = settle_lease {
                settle(true);
            }
        } else {
            self.deliver_then(&live, outcome, now, settle_lease);
        }
        if let Mode::Draining { report, .. } = &mut self.mode {
            report.finished_running += 1;
        }
        self.start_parked(started, now);
        self.finish_drain_if_idle();
        self.maybe_claim(now);
        if self.core.parked_len() > 0 {
            if let Some(gpu) = &self.gpu {
                gpu.wake();
            }
        }
    }

    /// A new headroom from the GPU sampler (the live guard): start what it lets through.
    pub fn headroom(&mut self, headroom: Headroom, now: u64) {
        let started = self.core.set_headroom(headroom.kind, headroom.units, now);
        self.start_parked(started, now);
        self.maybe_claim(now);
    }

    fn settle(&self, entry: EntryId, settlement: Settlement) {
        match &self.parking {
            Parking::Inline(queue) => {
                let settled = queue
                    .inline()
                    .map(|inline| inline.settle_now(entry, settlement));
                if let Some(Err(error)) = settled {
                    PoolCounters::bump(&self.counters.queue_errors);
                    tracing::warn!(pool = %self.pool, entry, %error, "queue settle failed");
                }
            }
            Parking::Actor(queue) => {
                let _ = queue.send_message(QueueMsg::Settle { entry, settlement });
            }
        }
    }

    fn remove_from_queue(&mut self, entry: EntryId) {
        if let Some(task) = self.take_spinning(entry) {
            drop_contained(task);
            return;
        }
        match &self.parking {
            Parking::Inline(queue) => {
                if let Some(Ok(Some(task))) = queue.inline().map(|inline| inline.remove_now(entry))
                {
                    drop_contained(task);
                }
            }
            Parking::Actor(queue) => {
                let _ = queue.send_message(QueueMsg::Remove { entry });
            }
        }
    }

    // -----------------------------------------------------------------------------------
    // Shared queue mode (see `super::shared`)
    // -----------------------------------------------------------------------------------

    /// Hands a task the core would park to the shared queue instead; its submitter is
    /// answered once the queue has stored it.
    fn park_shared(
        &mut self,
        entry: EntryId,
        task: ScheduledTask<P>,
        key: MailboxKey,
        reply: Reply,
        now: u64,
    ) {
        if let Ok(Cancel::Parked { started }) = self.core.cancel(entry, now) {
            self.start_parked(started, now);
        }
        match &self.shared {
            Some(shared) => {
                let rank_time_ms = entry >> ENTRY_TIME_SHIFT;
                let sequence = (entry & ((1 << ENTRY_TIME_SHIFT) - 1)) as u16;
                shared.enqueue(task, key, (rank_time_ms, sequence), reply);
            }
            None => {
                drop_contained(task);
                reply.send(Err(PoolError::Internal("no shared queue".into())));
            }
        }
    }

    /// Starts a task on the fast path with `accepted` durability on a shared queue: its
    /// capacity is taken now, and it runs, and its submitter hears, once the queue has stored
    /// it as this node's claim (see [`SharedReport::Recorded`]).
    #[allow(clippy::too_many_arguments)]
    fn start_recorded(
        &mut self,
        caller: (TenantId, TaskId),
        entry: EntryId,
        task: ScheduledTask<P>,
        key: MailboxKey,
        options: SubmitOptions,
        reply: Reply,
        now: u64,
    ) {
        let rank_time_ms = entry >> ENTRY_TIME_SHIFT;
        let sequence = (entry & ((1 << ENTRY_TIME_SHIFT) - 1)) as u16;
        let shared_entry = SharedLink::<P>::entry_for(sequence);
        self.track(
            caller,
            entry,
            &task,
            key.clone(),
            options,
            Some((shared_entry, 1)),
            None,
        );
        self.emit(entry, TaskStep::Admitted, now);
        self.begin_run(entry, false, now);
        if let Some(shared) = &self.shared {
            shared.record_start((entry, shared_entry), rank_time_ms, task, key, reply, now);
        }
    }

    /// A task started at once was stored as this node's claim, or could not be.
    fn recorded(
        &mut self,
        entry: EntryId,
        key: MailboxKey,
        reply: Reply,
        result: Result<Lease<P>, crate::queue::QueueError>,
        now: u64,
    ) {
        match result {
            Ok(lease) => {
                reply.send(Ok(key));
                let ended = self.live.get(&entry).map(|live| match &live.state {
                    LiveState::Running(running) => running.ended,
                    LiveState::Parked { .. } => true,
                });
                match ended {
                    Some(false) => self.send_job(entry, lease.task, now),
                    // Cancelled (or timed out) while it was being stored: its outcome is
                    // delivered, and no worker will report it, so it ends here (which
                    // releases its capacity and settles its claim).
                    Some(true) => {
                        drop_contained(lease.task);
                        self.finish(entry, Err(PoolError::Cancelled), now);
                    }
                    None => {
                        drop_contained(lease.task);
                        self.settle_lease(lease.entry, Settlement::Done);
                    }
                }
            }
            Err(error) => {
                PoolCounters::bump(&self.counters.queue_errors);
                let backend = self.shared.as_ref().map_or("shared", |s| s.backend());
                let text = format!("could not store the task: {backend} queue: {error}");
                if let Some(live) = self.live.get_mut(&entry) {
                    // Its submitter hears the error; nothing goes to the mailbox.
                    live.lease = None;
                    if let LiveState::Running(running) = &mut live.state {
                        running.ended = true;
                    }
                }
                self.finish(entry, Err(PoolError::Internal(text.clone())), now);
                reply.send(Err(PoolError::Internal(text)));
            }
        }
    }

    /// What a shared-queue call answered.
    pub fn shared_report(&mut self, report: SharedReport<P>, now: u64) {
        match report {
            SharedReport::Poll => {
                let held = self.live.values().filter_map(|live| live.lease).collect();
                if let Some(shared) = &mut self.shared {
                    shared.upkeep(held, now);
                }
                self.maybe_claim(now);
            }
            SharedReport::Wake => self.maybe_claim(now),
            SharedReport::Enqueued(group) => {
                for enqueued in group {
                    self.enqueued(enqueued, now);
                }
            }
            SharedReport::Claimed(claimed) => {
                if let Some(shared) = &mut self.shared {
                    shared.claimed();
                }
                match claimed {
                    Ok(leases) if leases.is_empty() => {}
                    Ok(leases) => {
                        for lease in leases {
                            self.run_leased(lease, now);
                        }
                        self.maybe_claim(now);
                    }
                    Err(error) => {
                        PoolCounters::bump(&self.counters.queue_errors);
                        tracing::warn!(pool = %self.pool, %error, "shared queue claim failed; retrying at the next poll");
                    }
                }
            }
            SharedReport::Removed {
                key,
                id,
                reply,
                result,
            } => {
                let answer = match result {
                    Ok(Some(task)) => {
                        let cost = task.meta.cost;
                        drop_contained(task);
                        self.deliver_parts(&key, id, cost, 1, Err(PoolError::Cancelled), now);
                        Ok(())
                    }
                    Ok(None) => Err(PoolError::TaskNotFound(id)),
                    Err(error) => {
                        PoolCounters::bump(&self.counters.queue_errors);
                        Err(PoolError::Internal(format!(
                            "could not cancel in the shared queue: {error}"
                        )))
                    }
                };
                let _ = reply.send(answer);
            }
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
                    self.deliver_parts(&letter.key, letter.task_id, letter.cost, 1, outcome, now);
                }
            }
            SharedReport::Lost(entries) => {
                let held: Vec<EntryId> = self.live.values().filter_map(|live| live.lease).collect();
                for entry in entries.into_iter().filter(|entry| held.contains(entry)) {
                    tracing::warn!(pool = %self.pool, entry, "a shared lease was lost while its task ran here; another node may run it too");
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
                self.emit_parts(task_id, &key, cost, &TaskStep::Admitted, now, Detail::NONE);
                self.emit_parts(task_id, &key, cost, &TaskStep::Parked, now, Detail::NONE);
                reply.send(Ok(key));
            }
            Err(error) => {
                PoolCounters::bump(&self.counters.queue_errors);
                let backend = self.shared.as_ref().map_or("shared", |s| s.backend());
                let refused = TaskStep::Refused(Refusal::QueueError);
                self.emit_parts(task_id, &key, cost, &refused, now, Detail::NONE);
                reply.send(Err(PoolError::Internal(format!(
                    "could not park the task: {backend} queue: {error}"
                ))));
            }
        }
    }

    /// Claims from the shared queue when this node could start a task now (open, an idle
    /// worker, some free capacity, nothing claimed waiting here), or, with claim-ahead, when
    /// at most half the claimed tasks it may hold wait here: at most the idle workers plus
    /// the free claim-ahead room, within the free units less what the waiting tasks need.
    fn maybe_claim(&mut self, now: u64) {
        let Some(claim_ahead) = self.shared.as_ref().map(SharedLink::claim_ahead) else {
            return;
        };
        let waiting = self.core.parked_len();
        let workers = self.core.live_workers();
        let idle = workers - self.core.busy_workers();
        let room = (idle + claim_ahead).saturating_sub(waiting);
        // A node without workers (a producer) runs nothing, so it claims nothing either. With
        // claim-ahead, a busy node waits until half its waiting room is free and then fills
        // it in one claim, rather than claiming a task or two after every finish.
        if !matches!(self.mode, Mode::Open)
            || workers == 0
            || room == 0
            || (waiting > 0 && claim_ahead == 0)
            || (idle == 0 && waiting > claim_ahead / 2)
        {
            return;
        }
        let mut free = ResourceKind::ALL
            .into_iter()
            .fold(Capacity::uniform(0), |free, kind| {
                free.with(kind, self.core.free(kind))
            });
        if waiting > 0 {
            for live in self.live.values() {
                if matches!(live.state, LiveState::Parked { .. }) {
                    let kind = live.cost.kind;
                    free = free.with(kind, free.get(kind).saturating_sub(live.cost.units));
                }
            }
        }
        if free.is_empty() {
            return;
        }
        let limits = self.core.limits();
        let starvation = limits.starvation.max_park_ms.map(|age| StarvationRule {
            capacity: limits.capacity,
            parked_before_ms: now.saturating_sub(age),
        });
        let query = FitQuery {
            starvation,
            ..FitQuery::within(free)
        };
        if let Some(shared) = &mut self.shared {
            shared.claim(query, room, now);
        }
    }

    /// Admits a task claimed from the shared queue, as its lease's holder.
    fn run_leased(&mut self, lease: Lease<P>, now: u64) {
        let Lease {
            entry: shared_entry,
            task,
            attempt,
            ..
        } = lease;
        if self.shared.is_none() {
            return;
        }
        let key = task
            .meta
            .mailbox
            .clone()
            .unwrap_or_else(MailboxKey::anonymous);
        if !matches!(self.mode, Mode::Open) {
            // Stopping: leave it to the lease's expiry, which parks it for another node.
            drop_contained(task);
            return;
        }
        let caller = (key.tenant.clone(), task.meta.id);
        if self.by_caller.contains_key(&caller) {
            let id = task.meta.id;
            self.settle_lease(
                shared_entry,
                Settlement::Failed(format!("task id {id} is live on this node already")),
            );
            self.deliver_parts(
                &key,
                id,
                task.meta.cost,
                attempt,
                Err(PoolError::DuplicateTask(id)),
                now,
            );
            drop_contained(task);
            return;
        }
        let entry = self.next_entry(now);
        let ticket = self.ticket(entry, &task.meta, self.default_timeout);
        let (admit, unblocked) = self.core.admit(ticket, now).split_started();
        if matches!(admit, Admit::Start | Admit::Park) {
            let lease = Some((shared_entry, attempt));
            let options = SubmitOptions::default();
            self.track(caller, entry, &task, key.clone(), options, lease, None);
        }
        match admit {
            Admit::Start => {
                self.emit(entry, TaskStep::Admitted, now);
                self.begin_run(entry, false, now);
                self.send_job(entry, task, now);
            }
            Admit::Park => {
                // Its capacity was taken while the claim was in flight: park it here, under
                // its lease, where the core's ordering protects it.
                let (ignored, _) = oneshot::channel();
                self.park(entry, task, key, Reply::Oneshot(ignored), now);
            }
            Admit::Expire => {
                self.settle_lease(shared_entry, Settlement::Done);
                self.deliver_parts(
                    &key,
                    task.meta.id,
                    task.meta.cost,
                    attempt,
                    Err(PoolError::Expired),
                    now,
                );
                drop_contained(task);
            }
            Admit::Reject(rejection) => {
                let error = PoolError::from(rejection);
                self.settle_lease(shared_entry, Settlement::Failed(error.to_string()));
                self.deliver_parts(&key, task.meta.id, task.meta.cost, attempt, Err(error), now);
                drop_contained(task);
            }
            Admit::StartWith(_) => unreachable!("split_started leaves no StartWith"),
        }
        if !unblocked.is_empty() {
            self.start_parked(unblocked, now);
        }
    }

    fn settle_lease(&self, shared_entry: EntryId, settlement: Settlement) {
        if let Some(shared) = &self.shared {
            shared.settle(shared_entry, settlement);
        }
    }

    // -----------------------------------------------------------------------------------
    // Cancel, time, failures
    // -----------------------------------------------------------------------------------

    /// Cancels the live task `id` of exactly `key`, here or parked in the shared queue.
    pub fn cancel(
        &mut self,
        key: MailboxKey,
        id: TaskId,
        reply: RpcReplyPort<Result<(), PoolError>>,
        now: u64,
    ) {
        let local = self
            .by_caller
            .get(&(key.tenant.clone(), id))
            .copied()
            .filter(|entry| self.live.get(entry).is_some_and(|live| live.key == key));
        match (local, &self.shared) {
            (Some(entry), _) => {
                let _ = reply.send(self.cancel_local(entry, id, now));
            }
            (None, Some(shared)) => shared.remove_task(key, id, reply),
            (None, None) => {
                let _ = reply.send(Err(PoolError::TaskNotFound(id)));
            }
        }
    }

    fn cancel_local(&mut self, entry: EntryId, id: TaskId, now: u64) -> Result<(), PoolError> {
        match self.core.cancel(entry, now) {
            Ok(Cancel::Parked { started }) => {
                self.end_parked(entry, PoolError::Cancelled, now);
                self.start_parked(started, now);
                Ok(())
            }
            Ok(Cancel::Running) => {
                self.signal_cancel(entry);
                Ok(())
            }
            Err(_) => Err(PoolError::TaskNotFound(id)),
        }
    }

    /// Ends a task the core no longer holds as parked.
    fn end_parked(&mut self, entry: EntryId, outcome: PoolError, now: u64) {
        let Some(live) = self.live.remove(&entry) else {
            return;
        };
        self.by_caller
            .remove(&(live.key.tenant.clone(), live.task_id));
        self.remove_from_queue(entry);
        if let Some(lease) = live.lease {
            self.settle_lease(lease, Settlement::Done);
        }
        let mut live = answer_pending_park(live);
        live.release_nested_slot();
        self.deliver(&live, Err(outcome), now);
    }

    fn signal_cancel(&mut self, entry: EntryId) {
        if let Some(LiveState::Running(running)) =
            self.live.get_mut(&entry).map(|live| &mut live.state)
        {
            running.cancellation.cancel();
        }
    }

    /// Time-driven work: deadlines, the watchdog, starvation aging.
    pub fn tick(&mut self, now: u64) {
        self.write_spun(now, false);
        let tick = self.core.tick(now);
        for entry in tick.expired {
            self.end_parked(entry, PoolError::Expired, now);
        }
        for entry in tick.overdue {
            self.end_running(entry, PoolError::TimedOut, now);
        }
        self.start_parked(tick.started, now);
    }

    /// Delivers an outcome for a running task before its thread returns, and asks the thread
    /// to drop its future. Its capacity stays held until the thread reports back.
    fn end_running(&mut self, entry: EntryId, outcome: PoolError, now: u64) -> bool {
        let Some(live) = self.live.get_mut(&entry) else {
            return false;
        };
        let LiveState::Running(running) = &mut live.state else {
            return false;
        };
        if running.ended {
            return false;
        }
        running.ended = true;
        running.cancellation.cancel();
        if let Some(live) = self.live.remove(&entry) {
            self.deliver(&live, Err(outcome), now);
            self.live.insert(entry, live);
        }
        true
    }

    /// A worker failed and will not be restarted: retire its slot; its task can never
    /// finish, so it fails and its capacity is released.
    pub fn worker_lost(&mut self, worker: usize, reason: String, now: u64) {
        if let Some(entry) = self.core.retire_worker(worker) {
            let outcome = Err(PoolError::Failed(format!("its worker is gone: {reason}")));
            self.finish(entry, outcome, now);
        }
        self.finish_drain_if_idle();
    }

    /// The supervisor gave up: refuse new work; parked tasks of a durable queue are kept,
    /// an in-memory queue's fail with the reason.
    pub fn escalated(&mut self, reason: String, now: u64) {
        if matches!(self.mode, Mode::Open) {
            self.mode = Mode::Escalated(reason.clone());
        }
        let (_, _) = self.take_parked(PoolError::Failed(reason), now);
    }

    /// Empties the parking lot: kept in a durable queue, or ended with `outcome`. Returns
    /// (kept, ended).
    fn take_parked(&mut self, outcome: PoolError, now: u64) -> (usize, usize) {
        let parked = self.core.take_parked();
        let count = parked.len();
        if self.durable {
            self.write_spun(now, true);
            for entry in parked {
                if let Some(live) = self.live.remove(&entry) {
                    self.by_caller
                        .remove(&(live.key.tenant.clone(), live.task_id));
                    drop(answer_pending_park(live));
                }
            }
            return (count, 0);
        }
        for entry in parked {
            self.end_parked(entry, outcome.clone(), now);
        }
        (0, count)
    }

    // -----------------------------------------------------------------------------------
    // Shutdown
    // -----------------------------------------------------------------------------------

    /// Stops admitting and drains. Every caller waits for the same drain and gets the same
    /// report. Returns whether the caller should arm the drain deadline (the first caller).
    pub fn shutdown(&mut self, reply: RpcReplyPort<ShutdownReport>, now: u64) -> bool {
        match &mut self.mode {
            Mode::Draining { waiters, .. } => {
                waiters.push(reply);
                return false;
            }
            Mode::Stopped(report) => {
                let _ = reply.send(*report);
                return false;
            }
            Mode::Open | Mode::Escalated(_) => {}
        }
        let (kept, cancelled) = self.take_parked(PoolError::Cancelled, now);
        self.mode = Mode::Draining {
            waiters: vec![reply],
            report: ShutdownReport {
                cancelled_parked: cancelled,
                kept_parked: kept,
                ..ShutdownReport::default()
            },
        };
        self.finish_drain_if_idle();
        true
    }

    /// The drain deadline passed: running tasks end `Cancelled` now.
    pub fn drain_deadline(&mut self, now: u64) {
        if !matches!(self.mode, Mode::Draining { .. }) {
            return;
        }
        let running: Vec<EntryId> = self.live.keys().copied().collect();
        let abandoned = running
            .into_iter()
            .filter(|&entry| self.end_running(entry, PoolError::Cancelled, now))
            .count();
        if let Mode::Draining { report, .. } = &mut self.mode {
            report.abandoned_running += abandoned;
        }
        self.stop_draining();
    }

    fn finish_drain_if_idle(&mut self) {
        if matches!(self.mode, Mode::Draining { .. }) && self.core.running_len() == 0 {
            self.stop_draining();
        }
    }

    fn stop_draining(&mut self) {
        let Mode::Draining { waiters, report } = &mut self.mode else {
            return;
        };
        let report = *report;
        for waiter in waiters.drain(..) {
            let _ = waiter.send(report);
        }
        self.mode = Mode::Stopped(report);
    }

    // -----------------------------------------------------------------------------------
    // Outcomes, events, gauges
    // -----------------------------------------------------------------------------------

    fn deliver(&mut self, live: &Live, outcome: Result<R, PoolError>, now: u64) {
        self.deliver_then(live, outcome, now, None);
    }

    fn deliver_parts(
        &mut self,
        key: &MailboxKey,
        task_id: TaskId,
        cost: ResourceCost,
        attempt: u32,
        outcome: Result<R, PoolError>,
        now: u64,
    ) {
        self.deliver_parts_then(
            key,
            task_id,
            cost,
            attempt,
            outcome,
            now,
            None,
            Detail::NONE,
        );
    }

    /// Delivers a live task's outcome, then runs `then` with whether it was stored.
    fn deliver_then(
        &mut self,
        live: &Live,
        outcome: Result<R, PoolError>,
        now: u64,
        then: Option<AfterStore>,
    ) {
        let (key, task_id, cost, attempt) = (&live.key, live.task_id, live.cost, live.attempt);
        let detail = Detail::ended(live);
        match live.stream().and_then(stream_of::<R>) {
            Some(stream) => {
                // A streamed outcome goes to its stream, behind the partials, not to the
                // mailbox (nobody could retrieve it there).
                let step = TaskStep::Ended(status_of(&outcome));
                self.emit_parts(task_id, key, cost, &step, now, detail);
                stream.finish(outcome);
                if let Some(then) = then {
                    then(true);
                }
            }
            None => {
                self.deliver_parts_then(key, task_id, cost, attempt, outcome, now, then, detail)
            }
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn deliver_parts_then(
        &mut self,
        key: &MailboxKey,
        task_id: TaskId,
        cost: ResourceCost,
        attempt: u32,
        outcome: Result<R, PoolError>,
        now: u64,
        then: Option<AfterStore>,
        detail: Detail,
    ) {
        let step = TaskStep::Ended(status_of(&outcome));
        self.emit_parts(task_id, key, cost, &step, now, detail);
        let delivery = Delivery {
            task_id,
            outcome,
            stored_at_ms: now,
        };
        match &self.results {
            Results::Inline { mailbox, notifiers } => {
                let event = notifiers.event_for(&self.pool, key, &delivery, attempt);
                let stored = match mailbox.inline() {
                    Some(inline) => inline.store_now(key, delivery),
                    None => Err(crate::mailbox::MailboxError::Backend(
                        "no inline face".into(),
                    )),
                };
                if let Err(error) = &stored {
                    tracing::error!(pool = %self.pool, task_id, %error, "could not store a result");
                } else if let Some(event) = event {
                    notifiers.notify(&event);
                }
                if let Some(then) = then {
                    then(stored.is_ok());
                }
            }
            Results::Actor(mailbox) => {
                let message = MailboxMsg::Deliver {
                    key: key.clone(),
                    delivery,
                    attempt,
                    then,
                };
                if let Err(error) = mailbox.send_message(message) {
                    tracing::error!(pool = %self.pool, task_id, %error, "the mailbox actor is gone; outcome dropped");
                }
            }
        }
    }

    fn emit(&self, entry: EntryId, step: TaskStep, now: u64) {
        if let Some(live) = self.live.get(&entry) {
            self.emit_live(live, &step, now);
        }
    }

    fn emit_live(&self, live: &Live, step: &TaskStep, now: u64) {
        let detail = match step {
            TaskStep::Started => Detail {
                since_ms: Some(live.admitted_ms),
                priority: Some(live.priority),
            },
            TaskStep::Ended(_) => Detail::ended(live),
            _ => Detail {
                since_ms: None,
                priority: Some(live.priority),
            },
        };
        tracing::trace!(parent: &live.span, ?step, at_ms = now, "task step");
        self.emit_parts(live.task_id, &live.key, live.cost, step, now, detail);
    }

    fn emit_for(&self, task: &ScheduledTask<P>, key: &MailboxKey, step: &TaskStep, now: u64) {
        let detail = Detail {
            since_ms: None,
            priority: Some(task.meta.priority),
        };
        self.emit_parts(task.meta.id, key, task.meta.cost, step, now, detail);
    }

    fn emit_parts(
        &self,
        task_id: TaskId,
        key: &MailboxKey,
        cost: ResourceCost,
        step: &TaskStep,
        now: u64,
        detail: Detail,
    ) {
        let event = TaskEvent {
            task_id,
            key,
            cost,
            step,
            at_ms: now,
            since_ms: detail.since_ms,
            priority: detail.priority,
        };
        for subscriber in &self.subscribers {
            subscriber.on_event(&event);
        }
    }

    /// The pool's name.
    pub fn pool(&self) -> &str {
        &self.pool
    }

    /// Publishes the reading (running, parked, units held, failure counts) to every
    /// subscriber, the pool's counters first.
    pub fn publish(&self) {
        use std::sync::atomic::Ordering::Relaxed;
        let reading = PoolReading {
            running: self.core.running_len(),
            parked: self.core.parked_len(),
            used_by_kind: ResourceKind::ALL.map(|kind| u64::from(self.core.used(kind))),
            worker_restarts: self.counters.worker_restarts.load(Relaxed),
            queue_errors: self.counters.queue_errors.load(Relaxed),
        };
        for subscriber in &self.subscribers {
            subscriber.on_reading(&reading);
        }
    }

    /// Whether the queue actor owes answers: the scheduler then should not spin on its
    /// inbox, since those answers arrive as actor messages the spin would keep waiting.
    pub fn awaiting_queue(&self) -> bool {
        self.queue_waits > 0
    }

    /// When the next tick has work to do.
    pub fn next_wakeup(&self) -> Option<u64> {
        let spin = self.spin_due.front().map(|&(due, _)| due);
        match (self.core.next_wakeup(), spin) {
            (Some(core), Some(spin)) => Some(core.min(spin)),
            (core, spin) => core.or(spin),
        }
    }

    /// A snapshot of the counters.
    pub fn stats(&self) -> crate::stats::PoolStats {
        self.counters.snapshot()
    }
}

/// A task's span: pool, task id, tenant, priority and cost, as fields. The macro evaluates
/// none of them (and allocates nothing) unless a subscriber enables `task` spans at DEBUG.
fn task_span(pool: &str, meta: &crate::domain::TaskMetadata, key: &MailboxKey) -> tracing::Span {
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

/// What an event adds to a task's identity: the interval it closes and the priority.
#[derive(Clone, Copy)]
struct Detail {
    since_ms: Option<u64>,
    priority: Option<Priority>,
}

impl Detail {
    /// For a task reported from outside the scheduler's own records.
    const NONE: Detail = Detail {
        since_ms: None,
        priority: None,
    };

    /// For a live task's end: its run time starts when it started, if it did.
    fn ended(live: &Live) -> Detail {
        let since_ms = match &live.state {
            LiveState::Running(running) => Some(running.started_ms),
            LiveState::Parked { .. } => None,
        };
        Detail {
            since_ms,
            priority: Some(live.priority),
        }
    }
}

/// The typed buffer behind a stream attachment (checked at admission, so always `Some`).
fn stream_of<R: Send + 'static>(stream: &StreamAttachment) -> Option<&StreamShared<R>> {
    stream.0.downcast_ref::<StreamShared<R>>()
}

/// Answers a submitter still waiting for its park to be confirmed (the queue actor had not
/// answered yet): the task was admitted, so it gets its key.
fn answer_pending_park(mut live: Live) -> Live {
    if let LiveState::Parked { reply } = &mut live.state {
        if let Some(reply) = reply.take() {
            reply.send(Ok(live.key.clone()));
        }
    }
    live
}

impl<P, R> Scheduler<P, R> {
    /// The core's ticket for an entry: ranked by admission (the entry id), not by the
    /// caller's `created_at_ms`, which stays metadata; with the execution timeout it will run
    /// under, and its tenant's key when the pool has a fair share.
    fn ticket(
        &self,
        entry: EntryId,
        meta: &crate::domain::TaskMetadata,
        timeout: Option<Duration>,
    ) -> Ticket {
        let tenant = if self.core.limits().fair_share.is_some() {
            tenant_key(&self.tenant_keys, meta.mailbox.as_ref())
        } else {
            0
        };
        Ticket {
            id: entry,
            priority: meta.priority,
            cost: meta.cost,
            created_at_ms: entry >> ENTRY_TIME_SHIFT,
            deadline_ms: meta.deadline_ms.map(super::core::clamp_ms),
            tenant,
            timeout_ms: timeout.map(|limit| u64::try_from(limit.as_millis()).unwrap_or(u64::MAX)),
        }
    }
}

/// The fair share's key of a mailbox tenant. Every task submitted without a mailbox gets a
/// fresh anonymous tenant of its own ([`MailboxKey::anonymous`]); counted one by one they
/// would escape any cap, so all of them share key 0, as one tenant. Named tenants hash to a
/// key other than 0 (a 64-bit keyed hash: two names sharing one is a 2^-64 chance).
fn tenant_key(keys: &foldhash::fast::RandomState, mailbox: Option<&MailboxKey>) -> TenantKey {
    use std::hash::BuildHasher;
    match mailbox {
        Some(key) if !key.is_anonymous() => keys.hash_one(&key.tenant).max(1),
        _ => 0,
    }
}

/// The task with its mailbox key filled in, as the executor and the queue see it.
fn with_mailbox<P>(mut task: ScheduledTask<P>, key: &MailboxKey) -> ScheduledTask<P> {
    if task.meta.mailbox.is_none() {
        task.meta.mailbox = Some(key.clone());
    }
    task
}

/// Answers a batch: at once when every task's answer is in, else (a task whose park awaits a
/// queue) once the last one arrives.
fn answer_batch(
    answers: Vec<oneshot::Receiver<Result<MailboxKey, PoolError>>>,
    reply: oneshot::Sender<Vec<Result<MailboxKey, PoolError>>>,
) {
    let mut ready = Vec::with_capacity(answers.len());
    let mut waiting = Vec::new();
    for (index, mut answer) in answers.into_iter().enumerate() {
        match answer.try_recv() {
            Ok(answer) => ready.push(answer),
            Err(oneshot::error::TryRecvError::Empty) => {
                ready.push(Err(PoolError::Shutdown));
                waiting.push((index, answer));
            }
            Err(oneshot::error::TryRecvError::Closed) => ready.push(Err(PoolError::Shutdown)),
        }
    }
    if waiting.is_empty() {
        let _ = reply.send(ready);
        return;
    }
    tokio::spawn(async move {
        for (index, answer) in waiting {
            ready[index] = answer.await.unwrap_or(Err(PoolError::Shutdown));
        }
        let _ = reply.send(ready);
    });
}
