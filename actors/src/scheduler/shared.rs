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
use tokio::sync::mpsc;

use super::protocol::{Internal, Reply, SchedulerMsg};
use crate::domain::{Durability, MailboxKey, PoolError, ResourceCost, ScheduledTask, TaskId};
use crate::queue::duties::{DeadLetterReader, LeaseRenewer, LeaseRescuer};
use crate::queue::{DeadLetter, EntryId, FitQuery, Lease, QueueError, Settlement, SharedQueue};

/// Dead letters one poll reports at most (the next poll takes the rest).
const DEAD_LETTERS_PER_POLL: usize = 256;

/// Parks or settles one group takes at most (a database statement's size stays bounded).
const GROUP_AT_MOST: usize = 1_000;

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
    /// How many claimed tasks the node may hold waiting for a worker, beyond what it can
    /// start now (see [`with_claim_ahead`](Self::with_claim_ahead)). Default 0.
    pub claim_ahead: usize,
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
            claim_ahead: 0,
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

    /// Lets the node claim up to `tasks` more than it can start now, while its workers are
    /// busy: tasks that fit its free capacity (less what the tasks already waiting need),
    /// best-ranked first, which wait here under their leases and start as workers free, so
    /// a worker that ends a short job finds the next one without a round trip to the queue,
    /// and one claim fetches many tasks. The price: a task waiting here is this node's until
    /// it runs or its lease runs out (a node that stops leaves its waiting tasks to their
    /// leases' expiry), even when another node is idle. 0 (the default) claims only what
    /// starts at once.
    pub fn with_claim_ahead(mut self, tasks: usize) -> Self {
        self.claim_ahead = tasks;
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
    /// A group of tasks this node handed to the shared queue is stored (or not, each).
    Enqueued(Vec<Enqueued>),
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

/// One task of a park group, and whether the queue stored it.
pub(crate) struct Enqueued {
    pub task_id: TaskId,
    pub key: MailboxKey,
    pub cost: ResourceCost,
    pub reply: Reply,
    pub result: Result<(), QueueError>,
}

/// Ends a node's claims on the shared queue: a handle on the node's settle loop (see
/// [`settle_loop`]). Cheap to clone.
#[derive(Clone)]
pub(crate) struct Settler {
    settles: mpsc::UnboundedSender<(EntryId, Settlement)>,
}

impl Settler {
    /// Ends the claim on `entry`, with the other claims that end meanwhile. A backend error
    /// (a database that is away) is retried for up to half the lease; after that the lease
    /// runs out and the task runs again elsewhere (at-least-once).
    pub fn settle(&self, entry: EntryId, settlement: Settlement) {
        // The loop ends only with the link, and then nothing is left to settle.
        let _ = self.settles.send((entry, settlement));
    }
}

/// Settles claims as they end, in groups: every claim that ended while the previous group
/// was being settled goes in the next [`SharedQueue::settle_many`].
async fn settle_loop<P: Send + 'static>(
    queue: Arc<dyn SharedQueue<P>>,
    node: Arc<str>,
    lease: Duration,
    mut settles: mpsc::UnboundedReceiver<(EntryId, Settlement)>,
) {
    let mut group = Vec::new();
    while settles.recv_many(&mut group, GROUP_AT_MOST).await > 0 {
        let mut pending = std::mem::take(&mut group);
        let give_up = tokio::time::Instant::now() + lease / 2;
        let mut pause = Duration::from_millis(50);
        while !pending.is_empty() {
            let settled = queue.settle_many(&node, pending.clone()).await;
            let mut again = Vec::new();
            for ((entry, settlement), result) in pending.into_iter().zip(settled) {
                match result {
                    Ok(()) => {}
                    Err(QueueError::Backend(error))
                        if tokio::time::Instant::now() + pause < give_up =>
                    {
                        tracing::warn!(node = %node, entry, %error, "shared queue settle failed; retrying");
                        again.push((entry, settlement));
                    }
                    Err(error) => {
                        tracing::warn!(node = %node, entry, %error, "shared queue settle failed; the lease will expire and the task may run again");
                    }
                }
            }
            if !again.is_empty() {
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_secs(2));
            }
            pending = again;
        }
    }
}

/// How many times [`gather`] yields at most.
const GATHER_ROUNDS: usize = 8;

/// Lets submissions already under way join `group` before it is written: yields to the
/// runtime (so the scheduler hands over what its inbox holds) as long as each yield brings
/// more, at most [`GATHER_ROUNDS`] times. A lone submission costs one yield; a stream of
/// them from many callers goes in groups instead of a statement or two each.
async fn gather<T>(inbox: &mut mpsc::UnboundedReceiver<T>, group: &mut Vec<T>) {
    for _ in 0..GATHER_ROUNDS {
        if group.len() >= GROUP_AT_MOST {
            return;
        }
        tokio::task::yield_now().await;
        let before = group.len();
        while group.len() < GROUP_AT_MOST {
            match inbox.try_recv() {
                Ok(item) => group.push(item),
                Err(_) => break,
            }
        }
        if group.len() == before {
            return;
        }
    }
}

/// A task handed to the shared queue, waiting for the park loop.
struct ToPark<P> {
    entry: EntryId,
    rank_time_ms: u64,
    task: ScheduledTask<P>,
    key: MailboxKey,
    reply: Reply,
}

/// Parks tasks as the scheduler hands them over, in groups: every task handed over while the
/// previous group was being stored goes in the next [`SharedQueue::enqueue_many`]; each
/// group's answers go back to the scheduler in one [`SharedReport::Enqueued`].
async fn park_loop<P: Send + 'static>(
    queue: Arc<dyn SharedQueue<P>>,
    scheduler: ActorRef<SchedulerMsg<P>>,
    mut parks: mpsc::UnboundedReceiver<ToPark<P>>,
) {
    let mut group = Vec::new();
    while parks.recv_many(&mut group, GROUP_AT_MOST).await > 0 {
        gather(&mut parks, &mut group).await;
        let mut answers = Vec::with_capacity(group.len());
        let mut tasks = Vec::with_capacity(group.len());
        for park in group.drain(..) {
            let (task_id, cost) = (park.task.meta.id, park.task.meta.cost);
            answers.push((task_id, park.key, cost, park.reply));
            tasks.push((park.entry, park.rank_time_ms, park.task));
        }
        let parked = queue.enqueue_many(tasks).await;
        let mut parked = parked.into_iter();
        let answered = answers
            .into_iter()
            .map(|(task_id, key, cost, reply)| Enqueued {
                task_id,
                key,
                cost,
                reply,
                result: parked.next().unwrap_or_else(|| {
                    Err(QueueError::Backend(
                        "the queue answered fewer parks than it was given".into(),
                    ))
                }),
            })
            .collect();
        let report = SharedReport::Enqueued(answered);
        let _ = scheduler.send_message(SchedulerMsg(Internal::Shared(report)));
    }
}

/// The scheduler's handle on the shared queue.
pub(crate) struct SharedLink<P> {
    queue: Arc<dyn SharedQueue<P>>,
    node: Arc<str>,
    lease: Duration,
    poll: Duration,
    scheduler: Option<ActorRef<SchedulerMsg<P>>>,
    /// The park loop's inbox, and its receiver until `connect` starts the loop.
    parks: mpsc::UnboundedSender<ToPark<P>>,
    parks_waiting: Option<mpsc::UnboundedReceiver<ToPark<P>>>,
    /// The settle loop's handle, and its receiver until `connect` starts the loop.
    settler: Settler,
    settles_waiting: Option<mpsc::UnboundedReceiver<(EntryId, Settlement)>>,
    /// A claim is in flight: at most one at a time.
    claiming: bool,
    /// When leases were last renewed.
    renewed_at: u64,
    /// Whether tasks started at once are stored too (`Durability::Accepted`).
    records_starts: bool,
    /// See [`SharedParking::with_claim_ahead`].
    claim_ahead: usize,
}

impl<P> SharedLink<P>
where
    P: Send + 'static,
{
    pub fn new(parking: SharedParking<P>, durability: Durability) -> Self {
        let (parks, parks_waiting) = mpsc::unbounded_channel();
        let (settles, settles_waiting) = mpsc::unbounded_channel();
        Self {
            parks,
            parks_waiting: Some(parks_waiting),
            settler: Settler { settles },
            settles_waiting: Some(settles_waiting),
            records_starts: durability.writes_started_tasks(),
            queue: parking.queue,
            node: Arc::from(parking.node),
            lease: parking.lease,
            poll: parking.poll,
            scheduler: None,
            claiming: false,
            renewed_at: 0,
            claim_ahead: parking.claim_ahead,
        }
    }

    /// Connects the link to its scheduler and starts the poll timer and the park and settle
    /// loops.
    pub fn connect(&mut self, scheduler: ActorRef<SchedulerMsg<P>>) {
        if let Some(parks) = self.parks_waiting.take() {
            tokio::spawn(park_loop(self.queue.clone(), scheduler.clone(), parks));
        }
        if let Some(settles) = self.settles_waiting.take() {
            let (queue, node) = (self.queue.clone(), self.node.clone());
            tokio::spawn(settle_loop(queue, node, self.lease, settles));
        }
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

    /// How many claimed tasks may wait here beyond those that start at once.
    pub fn claim_ahead(&self) -> usize {
        self.claim_ahead
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

    /// Hands a task to the shared queue; the answer goes to `reply` once it is stored (by
    /// the park loop, with the tasks handed over meanwhile). It ranks by its admission time
    /// `rank_time_ms`, then by its entry id (see [`entry_for`](Self::entry_for)).
    pub fn enqueue(
        &self,
        task: ScheduledTask<P>,
        key: MailboxKey,
        (rank_time_ms, sequence): (u64, u16),
        reply: Reply,
    ) {
        let park = ToPark {
            entry: Self::entry_for(sequence),
            rank_time_ms,
            task,
            key,
            reply,
        };
        if let Err(mpsc::error::SendError(park)) = self.parks.send(park) {
            // Not connected any more: the pool is stopping.
            park.reply.send(Err(PoolError::Shutdown));
        }
    }

    /// Claims the best shared tasks that fit `query` together, at most `max` (the node's idle
    /// workers, plus its claim-ahead room), unless a claim is in flight.
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
        self.settler.settle(entry, settlement);
    }

    /// A handle that ends this node's claims from anywhere on the pool's runtime (the
    /// mailbox actor, once a result is stored).
    pub fn settler(&self) -> Settler {
        self.settler.clone()
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

    /// Poll-time upkeep: the node's three duties. The [`LeaseRenewer`] renews `held` leases
    /// when a third of the lease has passed, the [`LeaseRescuer`] ends expired claims (any
    /// node's), and the [`DeadLetterReader`] takes the tasks the queue gave up on.
    pub fn upkeep(&mut self, held: Vec<EntryId>, now: u64) {
        let renewer = LeaseRenewer::new(self.node.clone(), self.lease);
        let held = if renewer.is_due(self.renewed_at, now) {
            self.renewed_at = now;
            held
        } else {
            Vec::new()
        };
        let rescuer = LeaseRescuer::new(self.poll);
        let reader = DeadLetterReader::new(self.poll).with_batch(DEAD_LETTERS_PER_POLL);
        self.spawn(move |queue, node| async move {
            let lost = renewer.run_once(&*queue, &held, now).await;
            match rescuer.run_once(queue.maintenance(), now).await {
                Ok(0) => {}
                Ok(rescued) => {
                    tracing::info!(node = %node, rescued, "parked expired shared leases again")
                }
                Err(error) => tracing::warn!(node = %node, %error, "shared queue rescue failed"),
            }
            if !lost.is_empty() {
                return Some(SharedReport::Lost(lost));
            }
            match reader.run_once(queue.maintenance()).await {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(flavor = "current_thread")]
    async fn a_group_takes_what_arrives_while_it_yields_and_stops_when_a_yield_brings_nothing() {
        let (parks, mut inbox) = mpsc::unbounded_channel();
        parks.send(0).unwrap();
        let more = parks.clone();
        tokio::spawn(async move {
            for park in 1..=3 {
                more.send(park).unwrap();
                tokio::task::yield_now().await;
            }
        });
        let mut group = Vec::new();
        inbox.recv_many(&mut group, GROUP_AT_MOST).await;
        assert_eq!(group, [0]);
        gather(&mut inbox, &mut group).await;
        assert_eq!(group, [0, 1, 2, 3]);
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_full_group_takes_no_more() {
        let (parks, mut inbox) = mpsc::unbounded_channel();
        for park in 0..=GROUP_AT_MOST {
            parks.send(park).unwrap();
        }
        let mut group = Vec::new();
        inbox.recv_many(&mut group, GROUP_AT_MOST).await;
        gather(&mut inbox, &mut group).await;
        assert_eq!(group.len(), GROUP_AT_MOST);
        assert_eq!(
            inbox.try_recv(),
            Ok(GROUP_AT_MOST),
            "the next group's first park"
        );
    }
}
