//! [`PoolControl`]: a running pool's operations that do not depend on what it runs (its name,
//! counters and events; cancel, pause, drain; its work now and why a task waits; a shared
//! queue's dead letters), written once for every face.
//!
//! A [`PoolClient`](super::PoolClient) dereferences to its `PoolControl`, and so do
//! `WorkerPool` and `ResourcePool` through their client: `pool.pause()` is this method on
//! every face. The admin server holds one `PoolControl` per pool, whatever the pools' payload
//! and result types, since nothing here is generic.

use std::sync::Arc;

use ractor::rpc::CallResult;
use ractor::{DerivedActorRef, RpcReplyPort};

use crate::domain::{BackendError, MailboxKey, PoolError, TaskId};
use crate::observe::events::{EventFeed, FeedEvent};
use crate::observe::stats::{PoolCounters, PoolStats};
use crate::queue::{EntryId, KeptLetter, QueueError, QueueMaintenance, SharedQueue};
use crate::schedule::{ScheduleBoard, ScheduleError, ScheduleView};
use crate::scheduler::core::WaitReason;
use crate::scheduler::inspect::{PoolSnapshot, PoolView, WaitView};
use crate::scheduler::protocol::ControlRequest;

/// The operations of one running pool that need no payload or result type. Cheap to clone.
#[derive(Clone)]
pub struct PoolControl {
    name: Arc<str>,
    requests: DerivedActorRef<ControlRequest>,
    counters: Arc<PoolCounters>,
    feed: Arc<EventFeed>,
    /// The shared queue the pool is a node of, if any: it keeps the dead letters and the
    /// tasks that sleep there.
    shared_queue: Option<Arc<dyn QueueDesk>>,
    /// The pool's schedules, which its periodic enqueuer ticks.
    schedules: Arc<ScheduleBoard>,
}

impl std::fmt::Debug for PoolControl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PoolControl")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

/// A shared queue as the control side uses it (its maintenance with the dead letters, its
/// name, its sleeping tasks), whatever its payload type.
#[async_trait::async_trait]
trait QueueDesk: Send + Sync {
    fn maintenance(&self) -> &dyn QueueMaintenance;
    fn backend(&self) -> &str;
    async fn sleeping_until(
        &self,
        key: &MailboxKey,
        id: TaskId,
        now_ms: u64,
    ) -> Result<Option<u64>, QueueError>;
    async fn waiting_parents(
        &self,
        key: &MailboxKey,
        id: TaskId,
    ) -> Result<Option<u32>, QueueError>;
}

/// A shared queue, seen from the control side.
struct Desk<P>(Arc<dyn SharedQueue<P>>);

#[async_trait::async_trait]
impl<P: Send + 'static> QueueDesk for Desk<P> {
    fn maintenance(&self) -> &dyn QueueMaintenance {
        self.0.maintenance()
    }

    fn backend(&self) -> &str {
        self.0.backend()
    }

    async fn sleeping_until(
        &self,
        key: &MailboxKey,
        id: TaskId,
        now_ms: u64,
    ) -> Result<Option<u64>, QueueError> {
        self.0.sleeping_until(key, id, now_ms).await
    }

    async fn waiting_parents(
        &self,
        key: &MailboxKey,
        id: TaskId,
    ) -> Result<Option<u32>, QueueError> {
        match self.0.dependencies() {
            Some(dependencies) => dependencies.waiting_parents(key, id).await,
            None => Ok(None),
        }
    }
}

impl PoolControl {
    /// The control side of a pool whose scheduler takes `requests`.
    pub(crate) fn new<P: Send + 'static>(
        name: Arc<str>,
        requests: DerivedActorRef<ControlRequest>,
        counters: Arc<PoolCounters>,
        feed: Arc<EventFeed>,
        shared_queue: Option<Arc<dyn SharedQueue<P>>>,
    ) -> Self {
        let shared_queue = shared_queue.map(|queue| Arc::new(Desk(queue)) as Arc<dyn QueueDesk>);
        Self {
            name,
            requests,
            counters,
            feed,
            shared_queue,
            schedules: Arc::default(),
        }
    }

    /// The pool's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The pool's name, shared (the supervisor keys the pool's actors by it).
    pub(crate) fn shared_name(&self) -> Arc<str> {
        self.name.clone()
    }

    /// A snapshot of the pool's counters, read without a message round trip.
    ///
    /// They count what this pool did since it started. Tasks it resumed from a durable
    /// queue, or claimed from a shared one, were submitted elsewhere (to an earlier run, or
    /// another node): they count in `completed_tasks` and the other outcomes, not in
    /// `submitted_tasks`. So after a restart `completed_tasks` may exceed `submitted_tasks`.
    /// Task counts follow the pool's events, so they may trail a result just retrieved by a
    /// moment.
    pub fn stats(&self) -> PoolStats {
        self.counters.snapshot()
    }

    /// Listens to the pool's events from now on (see [`EventFeed`]): every step of every
    /// task, as it happens, without payloads or results. A listener that falls more than
    /// [`EventFeed::CAPACITY`] events behind misses the oldest.
    pub fn events(&self) -> tokio::sync::broadcast::Receiver<FeedEvent> {
        self.feed.subscribe()
    }

    /// Cancels the live task `id` submitted under `key` (the key `submit` returned): a parked
    /// one ends at once; a running one has its future dropped (its capacity is released when
    /// its thread returns). Both end `Cancelled`. `TaskNotFound` unless such a task is live
    /// under exactly that key, so one tenant can never cancel, or probe, another's tasks.
    pub async fn cancel(&self, key: &MailboxKey, id: TaskId) -> Result<(), PoolError> {
        let key = key.clone();
        self.ask(|reply| ControlRequest::Cancel { key, id, reply })
            .await?
    }

    /// Pauses the pool: from now on it starts nothing (no parked task, no newcomer, no
    /// permit), while it keeps admitting (tasks park, up to `max_queue_depth`) and its
    /// running tasks run on and end as usual; on a shared queue the node claims nothing.
    /// Returns once paused. [`resume`](Self::resume) ends it.
    pub async fn pause(&self) -> Result<(), PoolError> {
        self.ask(|reply| ControlRequest::Pause {
            paused: true,
            reply,
        })
        .await
    }

    /// Ends a pause: what fits starts at once, in rank order.
    pub async fn resume(&self) -> Result<(), PoolError> {
        self.ask(|reply| ControlRequest::Pause {
            paused: false,
            reply,
        })
        .await
    }

    /// Drains the pool: new submissions are refused (`PoolError::Draining`), the tasks it
    /// has (parked and running) run to their end, and on a shared queue the node claims
    /// nothing more, so its share of the work goes to the other nodes. Returns once set;
    /// [`undrain`](Self::undrain) takes work again.
    pub async fn drain(&self) -> Result<(), PoolError> {
        self.ask(|reply| ControlRequest::Drain {
            drained: true,
            reply,
        })
        .await
    }

    /// Ends a drain, and a pause: the pool takes new work again and starts what fits.
    pub async fn undrain(&self) -> Result<(), PoolError> {
        self.ask(|reply| ControlRequest::Drain {
            drained: false,
            reply,
        })
        .await
    }

    /// The pool's work now: its running tasks (and held permits), parked tasks `offset..
    /// offset + limit` in rank order (at most [`MAX_PAGE`](crate::scheduler::inspect::MAX_PAGE)) each
    /// with the reason it waits, and its tenants. See [`crate::scheduler::inspect`]. On a shared queue
    /// it shows this node's tasks (the queue's parked tasks are the queue's).
    ///
    /// ```
    /// # use prometheus_parking_lot_actors::engine::PoolControl;
    /// # async fn show(pool: &PoolControl) -> Result<(), prometheus_parking_lot_actors::domain::PoolError> {
    /// let view = pool.inspect(0, 50).await?;
    /// for task in &view.parked {
    ///     println!("task {} of {} waits: {:?}", task.id, task.key.tenant.0, task.reason);
    /// }
    /// # Ok(())
    /// # }
    /// ```
    pub async fn inspect(&self, offset: usize, limit: usize) -> Result<PoolView, PoolError> {
        self.ask(|reply| ControlRequest::Inspect {
            offset,
            limit,
            reply,
        })
        .await
    }

    /// [`inspect`](Self::inspect) and [`stats`](Self::stats) read at the same instant (see
    /// [`PoolSnapshot`]): what a page that shows the counters, the capacity in use and the
    /// lists reads, so that they agree.
    ///
    /// ```
    /// # use prometheus_parking_lot_actors::engine::PoolControl;
    /// # async fn show(pool: &PoolControl) -> Result<(), prometheus_parking_lot_actors::domain::PoolError> {
    /// let snapshot = pool.snapshot(0, 50).await?;
    /// println!("{} running, {} listed", snapshot.stats.active_tasks, snapshot.view.running.len());
    /// # Ok(())
    /// # }
    /// ```
    pub async fn snapshot(&self, offset: usize, limit: usize) -> Result<PoolSnapshot, PoolError> {
        self.ask(|reply| ControlRequest::Snapshot {
            offset,
            limit,
            reply,
        })
        .await
    }

    /// Why the live task `id` submitted under exactly `key` has not started: the first
    /// obstacle (too few free units, its kind's budget, its tenant's share, no idle worker,
    /// the reservation, a retry's backoff, or the order of the rules; see [`WaitReason`]);
    /// `None` once it runs. A task that sleeps in the pool's shared queue (a scheduled start
    /// or a retry's backoff no node may claim yet) is `Sleeping` until its instant, asked on
    /// any node of the queue. `TaskNotFound` when neither this node nor its shared queue
    /// holds a waiting task `id` under `key` (it ended, or it is parked in the shared queue,
    /// due, for a node to claim).
    ///
    /// ```
    /// # use prometheus_parking_lot_actors::engine::PoolControl;
    /// # use prometheus_parking_lot_actors::domain::MailboxKey;
    /// # use prometheus_parking_lot_actors::scheduler::core::WaitReason;
    /// # async fn show(pool: &PoolControl) -> Result<(), prometheus_parking_lot_actors::domain::PoolError> {
    /// if let Some(WaitReason::Sleeping { until_ms }) = pool.why_waiting(&MailboxKey::new("acme"), 7).await? {
    ///     println!("task 7 starts no earlier than {until_ms} ms after the epoch");
    /// }
    /// # Ok(())
    /// # }
    /// ```
    pub async fn why_waiting(
        &self,
        key: &MailboxKey,
        id: TaskId,
    ) -> Result<Option<WaitReason>, PoolError> {
        let asked = key.clone();
        let here = self
            .ask(|reply| ControlRequest::WhyWaiting {
                key: asked,
                id,
                reply,
            })
            .await?;
        match (here, &self.shared_queue) {
            (Err(PoolError::TaskNotFound(_)), Some(desk)) => {
                self.waiting_in(desk.as_ref(), key, id).await
            }
            (here, _) => here,
        }
    }

    /// `Dependencies` for the task `id` under `key` that waits for its parents in the shared
    /// queue `desk`, `Sleeping` for one that sleeps there now; `TaskNotFound` when neither.
    async fn waiting_in(
        &self,
        desk: &dyn QueueDesk,
        key: &MailboxKey,
        id: TaskId,
    ) -> Result<Option<WaitReason>, PoolError> {
        match desk.waiting_parents(key, id).await {
            Ok(Some(pending)) => return Ok(Some(WaitReason::Dependencies { pending })),
            Ok(None) => {}
            Err(error) => return Err(self.queue_error(desk, "read a task's parents", error)),
        }
        let now = u64::try_from(crate::util::clock::now_ms()).unwrap_or(u64::MAX);
        match desk.sleeping_until(key, id, now).await {
            Ok(Some(until_ms)) => Ok(Some(WaitReason::Sleeping {
                until_ms: u128::from(until_ms),
            })),
            Ok(None) => Err(PoolError::TaskNotFound(id)),
            Err(error) => Err(self.queue_error(desk, "read a sleeping task", error)),
        }
    }

    /// [`why_waiting`](Self::why_waiting) with the task's place in line (among the parked
    /// tasks of its kind) and when it is expected to start: the pool simulates its rules
    /// from the running tasks' expected ends (the run times it has seen per cost class, at
    /// most their execution timeouts), the reservation and budgets' refills, with no task
    /// arriving later (`PARKING_LOT.md`, "When will it start", says when that is wrong).
    /// `None` once it runs. A task a shared queue holds (waiting for its parents, or
    /// sleeping until its instant) is in no node's line yet: its view has the reason,
    /// position 0 and no estimate.
    ///
    /// ```
    /// # use prometheus_parking_lot_actors::engine::PoolControl;
    /// # use prometheus_parking_lot_actors::domain::MailboxKey;
    /// # async fn show(pool: &PoolControl) -> Result<(), prometheus_parking_lot_actors::domain::PoolError> {
    /// if let Some(wait) = pool.waiting(&MailboxKey::new("acme"), 7).await? {
    ///     println!("{:?}: {}", wait.reason, wait.in_words()); // "3rd in line, expected in ~4.2 s"
    /// }
    /// # Ok(())
    /// # }
    /// ```
    pub async fn waiting(
        &self,
        key: &MailboxKey,
        id: TaskId,
    ) -> Result<Option<WaitView>, PoolError> {
        let asked = key.clone();
        let here = self
            .ask(|reply| ControlRequest::Waiting {
                key: asked,
                id,
                reply,
            })
            .await?;
        let (Err(PoolError::TaskNotFound(_)), Some(desk)) = (&here, &self.shared_queue) else {
            return here;
        };
        let reason = self.waiting_in(desk.as_ref(), key, id).await?;
        let at_ms = crate::util::clock::now_ms();
        Ok(reason.map(|reason| WaitView {
            reason,
            position: 0,
            expected_start_ms: None,
            from_timeouts: false,
            at_ms,
        }))
    }

    /// Whether the pool's queue keeps dead letters: only a shared queue does (see
    /// [`dead_letters`](Self::dead_letters)).
    pub fn keeps_dead_letters(&self) -> bool {
        self.shared_queue.is_some()
    }

    /// The dead letters the pool's shared queue keeps, oldest first, `offset..offset +
    /// limit`: tasks the queue gave up on and runs that ended `Failed`, each with its reason
    /// (see [`QueueMaintenance::list_dead_letters`]). `InvalidConfig` for a pool whose queue
    /// is its own: only a shared queue keeps them.
    pub async fn dead_letters(
        &self,
        offset: usize,
        limit: usize,
    ) -> Result<Vec<KeptLetter>, PoolError> {
        let desk = self.dead_letter_desk()?;
        let listed = desk.maintenance().list_dead_letters(offset, limit).await;
        listed.map_err(|error| self.queue_error(desk, "list dead letters", error))
    }

    /// Parks dead letter `entry` again for any node, its attempts afresh; `false` when the
    /// queue keeps no dead letter `entry`.
    pub async fn retry_dead_letter(&self, entry: EntryId) -> Result<bool, PoolError> {
        let desk = self.dead_letter_desk()?;
        let retried = desk.maintenance().retry_dead_letter(entry).await;
        retried.map_err(|error| self.queue_error(desk, "retry a dead letter", error))
    }

    /// Deletes dead letter `entry`, or all of them with `None`; returns how many.
    pub async fn purge_dead_letters(&self, entry: Option<EntryId>) -> Result<usize, PoolError> {
        let desk = self.dead_letter_desk()?;
        let purged = desk.maintenance().purge_dead_letters(entry).await;
        purged.map_err(|error| self.queue_error(desk, "purge dead letters", error))
    }

    /// The pool's schedules (see [`crate::schedule`]), in the order they were added: each
    /// with its expression, zone, next tick and whether it is paused on this node.
    pub fn schedules(&self) -> Vec<ScheduleView> {
        self.schedules.views()
    }

    /// Pauses schedule `name` on this node: it enqueues nothing until resumed. On a shared
    /// queue the other nodes that carry it go on enqueuing its ticks. `InvalidConfig` when
    /// the pool has no schedule of that name.
    pub fn pause_schedule(&self, name: &str) -> Result<(), PoolError> {
        self.set_schedule_paused(name, true)
    }

    /// Resumes schedule `name`: it enqueues again from its next tick (the ticks of the
    /// pause are skipped).
    pub fn resume_schedule(&self, name: &str) -> Result<(), PoolError> {
        self.set_schedule_paused(name, false)
    }

    fn set_schedule_paused(&self, name: &str, paused: bool) -> Result<(), PoolError> {
        let now = u64::try_from(crate::util::clock::now_ms()).unwrap_or(u64::MAX);
        let set = self.schedules.set_paused(name, paused, now);
        set.map_err(|error| self.schedule_error(error))
    }

    pub(crate) fn schedule_board(&self) -> &Arc<ScheduleBoard> {
        &self.schedules
    }

    /// A schedule's refusal as the pool's error, naming the pool.
    pub(crate) fn schedule_error(&self, error: ScheduleError) -> PoolError {
        PoolError::InvalidConfig(format!("pool {:?}: {error}", self.name))
    }

    /// Sends a request and waits for its answer; `Shutdown` when the scheduler has stopped.
    async fn ask<T: Send + 'static>(
        &self,
        request: impl FnOnce(RpcReplyPort<T>) -> ControlRequest,
    ) -> Result<T, PoolError> {
        match self.requests.call(request, None).await {
            Ok(CallResult::Success(answer)) => Ok(answer),
            _ => Err(PoolError::Shutdown),
        }
    }

    fn dead_letter_desk(&self) -> Result<&dyn QueueDesk, PoolError> {
        self.shared_queue.as_deref().ok_or_else(|| {
            PoolError::InvalidConfig(format!(
                "pool {:?} keeps no dead letters: its queue is its own; a shared queue \
                 (postgres, postgres_pgmq) keeps them",
                self.name
            ))
        })
    }

    /// The error of `operation` on the pool's shared queue.
    fn queue_error(&self, desk: &dyn QueueDesk, operation: &str, error: QueueError) -> PoolError {
        let queue = format!("{} queue", desk.backend());
        let fault = crate::queue::actor::fault_of(error);
        PoolError::from(BackendError::new(&*self.name, queue, operation, fault))
    }
}
