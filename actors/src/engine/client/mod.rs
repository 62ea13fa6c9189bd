//! [`PoolClient`]: the handle to one running pool, and every operation of it, written once.
//!
//! The operations that need the pool's payload or result type live here, one file per job:
//! [`submit`](PoolClient::submit) and its forms (`submit.rs`), [`retrieve`](PoolClient::retrieve)
//! and its forms (`retrieve.rs`), [`shutdown`](PoolClient::shutdown) (`shutdown.rs`). Those
//! that do not (stats, events, cancel, pause, drain, inspect, dead letters) are
//! [`PoolControl`]'s, which a client dereferences to; the facades `WorkerPool` and
//! `ResourcePool` dereference to their client in turn, so each operation has one name and
//! one body on every face.

mod retrieve;
mod schedules;
mod shutdown;
mod submit;

use std::collections::HashMap;
use std::ops::Deref;
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use ractor::{ActorRef, DerivedActorRef};
use tokio::sync::OnceCell;

pub use shutdown::ShutdownOnDrop;

use super::control::PoolControl;
use crate::domain::{OnDuplicate, PoolError};
use crate::mailbox::watch::ResultWatch;
use crate::mailbox::{Mailbox, Notifier};
use crate::observe::events::EventFeed;
use crate::observe::stats::PoolCounters;
use crate::observe::trace::TaskTracer;
use crate::permit::{Gate, PermitPort};
use crate::queue::SharedQueue;
use crate::scheduler::inbox::Inbox;
use crate::scheduler::protocol::{SchedulerMsg, SchedulerRequest, ShutdownReport};
use crate::scheduler::shell::Rerun;
use crate::supervisor::SupervisorMsg;
use crate::sync::slots::SlotBudget;
use crate::sync::spin::AdaptiveSpin;

/// A handle to one running pool: submit, retrieve, shutdown, and (through
/// [`PoolControl`], which it dereferences to) stats, events, cancel, pause, drain, inspect.
/// Cheap to clone.
pub struct PoolClient<P, R> {
    inner: Arc<ClientInner<P, R>>,
}

/// A pool's client held without keeping the pool alive (the periodic enqueuer holds one).
pub(crate) struct WeakPoolClient<P, R> {
    inner: Weak<ClientInner<P, R>>,
}

impl<P, R> WeakPoolClient<P, R> {
    /// The client, while anyone else still holds it.
    pub(crate) fn upgrade(&self) -> Option<PoolClient<P, R>> {
        self.inner.upgrade().map(|inner| PoolClient { inner })
    }
}

impl<P, R> Clone for PoolClient<P, R> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
        }
    }
}

impl<P, R> Deref for PoolClient<P, R> {
    type Target = PoolControl;

    fn deref(&self) -> &PoolControl {
        &self.inner.control
    }
}

impl<P, R> From<PoolClient<P, R>> for PoolControl {
    fn from(client: PoolClient<P, R>) -> Self {
        client.inner.control.clone()
    }
}

/// What a client is made of, as [`start_pool`](super::start_pool) wired it.
pub(crate) struct ClientParts<P, R> {
    pub name: Arc<str>,
    pub scheduler: ActorRef<SchedulerMsg<P>>,
    pub inbox: Arc<Inbox<P, R>>,
    pub mailbox: Arc<dyn Mailbox<R>>,
    /// The results on their way to the mailbox, when it awaits (see `mailbox/watch.rs`).
    pub results_watch: Option<Arc<ResultWatch>>,
    pub notifiers: Vec<Arc<dyn Notifier>>,
    pub counters: Arc<PoolCounters>,
    pub supervisor: ActorRef<SupervisorMsg>,
    /// Whether shutdown stops the supervisor too (a pool started with its own).
    pub owns_supervisor: bool,
    /// The nested slots that submissions from the pool's own workers must take.
    pub nested: Arc<SlotBudget>,
    /// How the scheduler copies payloads to rerun preempted tasks (see `preempt_tasks`).
    pub rerun: Rerun<P>,
    /// What a submission whose result waits already gets (see [`OnDuplicate`]).
    pub on_duplicate: OnDuplicate,
    /// The pool's events, for whoever listens.
    pub feed: Arc<EventFeed>,
    /// The shared queue the pool is a node of, if any (for its dead letters).
    pub shared_queue: Option<Arc<dyn SharedQueue<P>>>,
    /// Who makes each submission's span, if the pool traces.
    pub tracer: Option<Arc<dyn TaskTracer>>,
}

struct ClientInner<P, R> {
    /// The operations that need no payload or result type.
    control: PoolControl,
    scheduler: ActorRef<SchedulerMsg<P>>,
    inbox: Arc<Inbox<P, R>>,
    mailbox: Arc<dyn Mailbox<R>>,
    /// The results on their way to a mailbox that awaits (see `submit.rs`).
    results_watch: Option<Arc<ResultWatch>>,
    /// Flushed at shutdown, once the mailbox has handed them every event.
    notifiers: Vec<Arc<dyn Notifier>>,
    counters: Arc<PoolCounters>,
    supervisor: ActorRef<SupervisorMsg>,
    owns_supervisor: bool,
    /// The one shutdown every caller waits for.
    shutdown: OnceCell<Result<ShutdownReport, PoolError>>,
    /// How long async retrieves re-check an inline mailbox before they sleep.
    result_spin: AdaptiveSpin,
    /// How long submitters re-check for their admission answer before they sleep.
    answer_spin: AdaptiveSpin,
    nested: Arc<SlotBudget>,
    rerun: Rerun<P>,
    on_duplicate: OnDuplicate,
    /// Whether the pool can tell that no result will come under a key: its mailbox is in
    /// this process's memory and no other node runs its tasks, so every result under a key
    /// it knows is stored by its own scheduler (see `retrieve.rs`).
    knows_its_keys: bool,
    /// Who makes each submission's span, if the pool traces (see `submit.rs`).
    tracer: Option<Arc<dyn TaskTracer>>,
    /// The shared queue the pool is a node of, if any: its schedules' ticks are parked there.
    shared_queue: Option<Arc<dyn SharedQueue<P>>>,
    /// The payload function of each schedule, by name (see `schedules.rs`).
    payload_makers: Mutex<HashMap<String, schedules::PayloadFn<P>>>,
}

impl<P, R> Drop for ClientInner<P, R> {
    /// No client is left to submit a tick: the periodic enqueuer ends.
    fn drop(&mut self) {
        self.control.schedule_board().close();
    }
}

/// Where a deadline is: `None` when `timeout` is too long to represent (wait for ever).
fn deadline_after(timeout: Duration) -> Option<Instant> {
    Instant::now().checked_add(timeout)
}

impl<P, R> PoolClient<P, R>
where
    P: Send + 'static,
    R: Send + 'static,
{
    pub(crate) fn new(parts: ClientParts<P, R>) -> Self {
        let ClientParts {
            name,
            scheduler,
            inbox,
            mailbox,
            results_watch,
            notifiers,
            counters,
            supervisor,
            owns_supervisor,
            nested,
            rerun,
            on_duplicate,
            feed,
            shared_queue,
            tracer,
        } = parts;
        let knows_its_keys = mailbox.inline().is_some() && shared_queue.is_none();
        let control = PoolControl::new(
            name,
            scheduler.get_derived(),
            counters.clone(),
            feed,
            shared_queue.clone(),
        );
        Self {
            inner: Arc::new(ClientInner {
                control,
                scheduler,
                inbox,
                mailbox,
                results_watch,
                notifiers,
                counters,
                supervisor,
                owns_supervisor,
                shutdown: OnceCell::new(),
                result_spin: AdaptiveSpin::new(),
                answer_spin: AdaptiveSpin::with_max(submit::ANSWER_SPIN_ROUNDS),
                nested,
                rerun,
                on_duplicate,
                knows_its_keys,
                tracer,
                shared_queue,
                payload_makers: Mutex::new(HashMap::new()),
            }),
        }
    }

    /// This client, held without keeping the pool alive.
    pub(crate) fn downgrade(&self) -> WeakPoolClient<P, R> {
        WeakPoolClient {
            inner: Arc::downgrade(&self.inner),
        }
    }

    /// The operations that need no payload or result type, as a handle of their own (the
    /// admin server holds these). The client also dereferences to it.
    pub fn control(&self) -> &PoolControl {
        &self.inner.control
    }

    /// A gate over this pool's capacity: its [`Permit`](crate::permit::Permit)s and its
    /// tasks share one budget and one order.
    pub fn gate(&self) -> Gate {
        let port: Arc<dyn PermitPort> = self.inner.inbox.clone();
        Gate::new(port, self.inner.counters.clone())
    }

    /// Lets the pool preempt its running tasks too, not only permits, when its limits turn
    /// preemption on (`PoolLimits::preemption`) and its queue is in memory: a task asked to
    /// yield sees [`running::is_preempted`](crate::running::is_preempted) (and its
    /// cancellation flag) raised; when its executor returns, what it returned is discarded
    /// and the task parks again at its rank and runs again later, at most `max_per_task`
    /// times. The pool keeps a clone of each running task's payload for this, which is why
    /// the payload must be `Clone`. Calling it again does nothing.
    pub fn preempt_tasks(&self)
    where
        P: Clone,
    {
        self.keep_payload_copies();
    }

    /// Lets the pool run a failed task again in memory, when its limits retry failed runs
    /// (`PoolLimits::retry`): the pool keeps a clone of each running task's payload, to run
    /// it again after a backoff when the run panicked or asked for it
    /// ([`running::retry_later`](crate::running::retry_later)), hence `Clone`. A durable
    /// local queue (yaque) keeps the payload itself and needs no call. The same copy serves
    /// [`preempt_tasks`](Self::preempt_tasks); calling either again does nothing.
    pub fn retry_tasks(&self)
    where
        P: Clone,
    {
        self.keep_payload_copies();
    }

    /// Has the scheduler keep a clone of each running task's payload, for the reruns of
    /// `preempt_tasks` and `retry_tasks` (one copy serves both).
    fn keep_payload_copies(&self)
    where
        P: Clone,
    {
        let _ = self.inner.rerun.set(<P as Clone>::clone);
    }

    /// The scheduler actor, for callers that speak the actor protocol: it takes
    /// [`SchedulerRequest`]s only.
    pub fn scheduler(&self) -> DerivedActorRef<SchedulerRequest<P>> {
        self.inner.scheduler.get_derived()
    }

    /// The supervisor the pool runs under.
    pub fn supervisor(&self) -> &ActorRef<SupervisorMsg> {
        &self.inner.supervisor
    }
}
