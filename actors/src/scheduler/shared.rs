//! A pool's part in a shared queue: the [`SharedQueue`] mode of the scheduler.
//!
//! In this mode a pool is one *node* of several that park to and claim from one queue (a
//! database table that API servers and GPU nodes share). The pool's own core still decides
//! everything local: a new task that fits this node's free capacity starts here at once, as in
//! local mode. A task that would park goes to the shared queue instead, where any node may
//! claim it. Whenever this node has an idle worker, free capacity and nothing parked locally
//! (after every finish, and every `poll` for the work other nodes parked), it claims the
//! best-ranked shared task that fits its free units, under a lease it renews while the task
//! runs and settles when it ends. A node that dies stops renewing; any node's poll parks its
//! expired claims again (`rescue_expired`), so their tasks run again elsewhere: at-least-once.
//!
//! Rules that differ from local mode, each because no node sees the whole queue at once:
//! - A leased task that finds its capacity taken meanwhile (a local task started while the
//!   claim was in flight) parks in the node's local lot, still under its lease; the core's
//!   ordering then protects it like any parked task, and the node claims nothing more until it
//!   has started.
//! - A shared task's deadline is checked when a node claims it: past it, the task ends
//!   `Expired` there.
//! - Cancel reaches a shared task only while it is parked: the node that takes the cancel
//!   removes it by its key and id. Once claimed, it is the claiming node's to cancel.
//! - Task ids are unique per tenant among the tasks live on one node; the shared queue does
//!   not refuse an id another node parked.
//! - Results go to the pool's mailbox: nodes that should answer each other's callers share a
//!   mailbox (a database one) as they share the queue.
//!
//! Every queue call runs in a task of its own on the pool's runtime, so a slow database never
//! holds up the scheduler; answers come back as [`SharedReport`] messages.

use std::sync::Arc;
use std::time::Duration;

use ractor::{ActorRef, RpcReplyPort};

use super::protocol::{Internal, Reply, SchedulerMsg};
use crate::domain::{Durability, MailboxKey, PoolError, ResourceCost, ScheduledTask, TaskId};
use crate::queue::{DeadLetter, EntryId, FitQuery, Lease, QueueError, Settlement, SharedQueue};

/// Dead letters one poll reports at most (the next poll takes the rest).
const DEAD_LETTERS_PER_POLL: usize = 256;

/// How a pool takes part in a shared queue. See the module docs.
///
/// ```
/// use std::sync::Arc;
/// use std::time::Duration;
///
/// use prometheus_parking_lot_actors::queue::SharedQueue;
/// use prometheus_parking_lot_actors::scheduler::shared::SharedParking;
///
/// /// This node's part in a queue the deployment shares (a database table, say).
/// fn gpu_node(queue: Arc<dyn SharedQueue<String>>) -> SharedParking<String> {
///     SharedParking::new(queue, "gpu-node-1")
///         .with_lease(Duration::from_secs(60))
///         .with_poll(Duration::from_millis(500))
/// }
/// ```
pub struct SharedParking<P> {
    /// The queue every node shares.
    pub queue: Arc<dyn SharedQueue<P>>,
    /// This node's name in the queue's leases: unique among the nodes.
    pub node: String,
    /// How long a claim is this node's without renewal. Renewed every third of it.
    pub lease: Duration,
    /// How often the node looks for work other nodes parked and rescues expired leases.
    pub poll: Duration,
}

impl<P> SharedParking<P> {
    /// The default lease: long enough for a renewal to survive a slow database.
    pub const DEFAULT_LEASE: Duration = Duration::from_secs(30);
    /// The default poll interval.
    pub const DEFAULT_POLL: Duration = Duration::from_millis(200);

    /// Takes part in `queue` as `node`, with the default lease and poll interval.
    pub fn new(queue: Arc<dyn SharedQueue<P>>, node: impl Into<String>) -> Self {
        Self {
            queue,
            node: node.into(),
            lease: Self::DEFAULT_LEASE,
            poll: Self::DEFAULT_POLL,
        }
    }

    /// Sets the lease.
    pub fn with_lease(mut self, lease: Duration) -> Self {
        self.lease = lease;
        self
    }

    /// Sets the poll interval.
    pub fn with_poll(mut self, poll: Duration) -> Self {
        self.poll = poll;
        self
    }

    /// Refuses settings no node can work with.
    pub(crate) fn validate(&self) -> Result<(), PoolError> {
        if self.node.trim().is_empty() {
            return Err(PoolError::InvalidConfig(
                "shared queue node name is empty; give every node a unique name".into(),
            ));
        }
        if self.lease < Duration::from_millis(30) {
            return Err(PoolError::InvalidConfig(format!(
                "shared queue lease is {:?}; it must be at least 30ms, since it is renewed every third of it",
                self.lease
            )));
        }
        if self.poll.is_zero() || self.poll > self.lease / 3 {
            return Err(PoolError::InvalidConfig(format!(
                "shared queue poll is {:?}; it must be above 0 and at most a third of the lease ({:?})",
                self.poll,
                self.lease / 3
            )));
        }
        Ok(())
    }
}

/// What a shared-queue call answered, back on the scheduler.
pub(crate) enum SharedReport<P> {
    /// The poll interval passed.
    Poll,
    /// The queue says a task may have been parked (a database notification).
    Wake,
    /// A task this node handed to the shared queue is stored (or not).
    Enqueued {
        task_id: TaskId,
        key: MailboxKey,
        cost: ResourceCost,
        reply: Reply,
        result: Result<(), QueueError>,
    },
    /// A claim's answer: the leases it took, best-ranked first.
    Claimed(Result<Vec<Lease<P>>, QueueError>),
    /// A cancel's removal from the shared queue.
    Removed {
        key: MailboxKey,
        id: TaskId,
        reply: RpcReplyPort<Result<(), PoolError>>,
        result: Result<Option<ScheduledTask<P>>, QueueError>,
    },
    /// A task started at once is stored as this node's claim (or not).
    Recorded {
        entry: EntryId,
        key: MailboxKey,
        reply: Reply,
        result: Result<Lease<P>, QueueError>,
    },
    /// Leases a renewal found lost (expired and rescued by another node).
    Lost(Vec<EntryId>),
    /// Tasks the queue gave up on: their submitters get a failure.
    Dead(Vec<DeadLetter>),
}

/// Ends a node's claims on the shared queue.
pub(crate) struct Settler<P> {
    queue: Arc<dyn SharedQueue<P>>,
    node: Arc<str>,
    lease: Duration,
}

impl<P: Send + 'static> Settler<P> {
    /// Ends the claim on `entry`, in a task of its own. A backend error (a database that is
    /// away) is retried for up to half the lease; after that the lease runs out and the task
    /// runs again elsewhere (at-least-once).
    pub fn settle(self, entry: EntryId, settlement: Settlement) {
        let Self { queue, node, lease } = self;
        let patience = lease / 2;
        tokio::spawn(async move {
            let give_up = tokio::time::Instant::now() + patience;
            let mut pause = Duration::from_millis(50);
            loop {
                match queue.settle(&node, entry, settlement.clone()).await {
                    Ok(()) => break,
                    Err(QueueError::Backend(error))
                        if tokio::time::Instant::now() + pause < give_up =>
                    {
                        tracing::warn!(node = %node, entry, %error, "shared queue settle failed; retrying");
                        tokio::time::sleep(pause).await;
                        pause = (pause * 2).min(Duration::from_secs(2));
                    }
                    Err(error) => {
                        tracing::warn!(node = %node, entry, %error, "shared queue settle failed; the lease will expire and the task may run again");
                        break;
                    }
                }
            }
        });
    }
}

/// The scheduler's handle on the shared queue.
pub(crate) struct SharedLink<P> {
    queue: Arc<dyn SharedQueue<P>>,
    node: Arc<str>,
    lease: Duration,
    poll: Duration,
    scheduler: Option<ActorRef<SchedulerMsg<P>>>,
    /// A claim is in flight: at most one at a time.
    claiming: bool,
    /// When leases were last renewed.
    renewed_at: u64,
    /// Whether tasks started at once are stored too (`Durability::Accepted`).
    records_starts: bool,
}

impl<P> SharedLink<P>
where
    P: Send + 'static,
{
    pub fn new(parking: SharedParking<P>, durability: Durability) -> Self {
        Self {
            records_starts: durability.writes_started_tasks(),
            queue: parking.queue,
            node: Arc::from(parking.node),
            lease: parking.lease,
            poll: parking.poll,
            scheduler: None,
            claiming: false,
            renewed_at: 0,
        }
    }

    /// Connects the link to its scheduler and starts the poll timer.
    pub fn connect(&mut self, scheduler: ActorRef<SchedulerMsg<P>>) {
        scheduler.send_interval(self.poll, || {
            SchedulerMsg(Internal::Shared(SharedReport::Poll))
        });
        if let Some(mut parked) = self.queue.watch() {
            let wake = scheduler.clone();
            tokio::spawn(async move {
                while parked.changed().await.is_ok() {
                    let report = SchedulerMsg(Internal::Shared(SharedReport::Wake));
                    if wake.send_message(report).is_err() {
                        break;
                    }
                }
            });
        }
        self.scheduler = Some(scheduler);
    }

    pub fn backend(&self) -> &'static str {
        self.queue.backend()
    }

    /// Whether a task this node starts at once is stored before it runs.
    pub fn records_starts(&self) -> bool {
        self.records_starts
    }

    /// The shared queue's entry id of a task admitted here: unique across nodes and, within
    /// one node and millisecond, increasing in admission order: `sequence` (the admission's
    /// count within its millisecond) in the high 16 bits, 48 random bits below.
    pub fn entry_for(sequence: u16) -> EntryId {
        const RANDOM_BITS: u32 = 48;
        let random = (crate::random::random_u128() as u64) & ((1 << RANDOM_BITS) - 1);
        (u64::from(sequence) << RANDOM_BITS) | random
    }

    /// Stores a task this node starts at once as its claim; the answer comes back as
    /// [`SharedReport::Recorded`] with the task to run.
    pub fn record_start(
        &self,
        (entry, shared_entry): (EntryId, EntryId),
        rank_time_ms: u64,
        task: ScheduledTask<P>,
        key: MailboxKey,
        reply: Reply,
        now: u64,
    ) {
        let lease = self.lease;
        self.spawn(move |queue, node| async move {
            let result = queue
                .enqueue_claimed(&node, shared_entry, rank_time_ms, task, lease, now)
                .await;
            Some(SharedReport::Recorded {
                entry,
                key,
                reply,
                result,
            })
        });
    }

    /// Runs `call` on the queue in a task of its own and reports its answer.
    fn spawn<F, Fut>(&self, call: F)
    where
        F: FnOnce(Arc<dyn SharedQueue<P>>, Arc<str>) -> Fut,
        Fut: std::future::Future<Output = Option<SharedReport<P>>> + Send + 'static,
    {
        let work = call(self.queue.clone(), self.node.clone());
        let scheduler = self.scheduler.clone();
        tokio::spawn(async move {
            if let (Some(report), Some(scheduler)) = (work.await, scheduler) {
                let _ = scheduler.send_message(SchedulerMsg(Internal::Shared(report)));
            }
        });
    }

    /// Hands a task to the shared queue; the answer goes to `reply` once it is stored. It
    /// ranks by its admission time `rank_time_ms`, then by its entry id (see
    /// [`entry_for`](Self::entry_for)).
    pub fn enqueue(
        &self,
        task: ScheduledTask<P>,
        key: MailboxKey,
        (rank_time_ms, sequence): (u64, u16),
        reply: Reply,
    ) {
        let entry = Self::entry_for(sequence);
        let (task_id, cost) = (task.meta.id, task.meta.cost);
        self.spawn(move |queue, _| async move {
            let result = queue.enqueue(entry, rank_time_ms, task).await;
            Some(SharedReport::Enqueued {
                task_id,
                key,
                cost,
                reply,
                result,
            })
        });
    }

    /// Claims the best shared tasks that fit `query` together, at most `max` (the node's idle
    /// workers: what it can start now), unless a claim is in flight.
    pub fn claim(&mut self, query: FitQuery, max: usize, now: u64) {
        if self.claiming || max == 0 {
            return;
        }
        self.claiming = true;
        let lease = self.lease;
        self.spawn(move |queue, node| async move {
            let claimed = queue.claim_batch(&node, &query, max, lease, now).await;
            Some(SharedReport::Claimed(claimed))
        });
    }

    /// A claim answered.
    pub fn claimed(&mut self) {
        self.claiming = false;
    }

    /// Ends this node's claim on `entry` (see [`Settler::settle`]).
    pub fn settle(&self, entry: EntryId, settlement: Settlement) {
        self.settler().settle(entry, settlement);
    }

    /// A handle that ends this node's claims from anywhere on the pool's runtime (the
    /// mailbox actor, once a result is stored).
    pub fn settler(&self) -> Settler<P> {
        Settler {
            queue: Arc::clone(&self.queue),
            node: Arc::clone(&self.node),
            lease: self.lease,
        }
    }

    /// Removes the parked task `id` of `key` for a cancel.
    pub fn remove_task(
        &self,
        key: MailboxKey,
        id: TaskId,
        reply: RpcReplyPort<Result<(), PoolError>>,
    ) {
        self.spawn(move |queue, _| async move {
            let result = queue.remove_task(&key, id).await;
            Some(SharedReport::Removed {
                key,
                id,
                reply,
                result,
            })
        });
    }

    /// Poll-time upkeep: renews `held` leases when a third of the lease has passed, and parks
    /// expired claims (any node's) again.
    pub fn upkeep(&mut self, held: Vec<EntryId>, now: u64) {
        let third = u64::try_from((self.lease / 3).as_millis()).unwrap_or(u64::MAX);
        let renew = now.saturating_sub(self.renewed_at) >= third;
        if renew {
            self.renewed_at = now;
        }
        let held = if renew { held } else { Vec::new() };
        let lease = self.lease;
        self.spawn(move |queue, node| async move {
            let mut lost = Vec::new();
            for entry in held {
                match queue.renew(&node, entry, lease, now).await {
                    Ok(()) => {}
                    Err(QueueError::NotClaimed(_)) => lost.push(entry),
                    Err(error) => {
                        tracing::warn!(node = %node, entry, %error, "shared queue lease renewal failed");
                    }
                }
            }
            match queue.rescue_expired(now).await {
                Ok(0) => {}
                Ok(rescued) => tracing::info!(node = %node, rescued, "parked expired shared leases again"),
                Err(error) => tracing::warn!(node = %node, %error, "shared queue rescue failed"),
            }
            if !lost.is_empty() {
                return Some(SharedReport::Lost(lost));
            }
            match queue.take_dead_letters(DEAD_LETTERS_PER_POLL).await {
                Ok(dead) if !dead.is_empty() => Some(SharedReport::Dead(dead)),
                Ok(_) => None,
                Err(error) => {
                    tracing::warn!(node = %node, %error, "shared queue dead letters unread");
                    None
                }
            }
        });
    }
}
