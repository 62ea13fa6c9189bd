//! The I/O side of the shared mode (`SharedIo`): it makes the calls the shell asks for
//! ([`SharedCall`]) and reports their answers back to the scheduler ([`SharedReport`]).
//!
//! What the mode decides (what to park there, when to claim, which leases to renew) is the
//! room's and the shell's (`room.rs`, `mode.rs`); this file only talks to the queue. Every
//! call runs in a task of its own on the pool's runtime, so a slow database never holds up
//! the scheduler: parks and settles go in groups through a loop each (the settle loop is
//! `settle.rs`), claims and cancels one at a time.
//!
//! Two maintenance duties run beside the node on their own timers, whatever it is doing:
//! the lease rescuer parks again the claims whose lease ran out (any node's: a node that
//! died), and the dead-letter reader hands the tasks the queue gave up on to the scheduler,
//! which stores their failure for their submitters.

use std::sync::Arc;
use std::time::Duration;

use ractor::ActorRef;
use tokio::sync::mpsc;

use super::calls::{Enqueued, SharedCall, SharedReport};
use super::parking::SharedParking;
use super::settle::{settle_loop, SettleMsg, Settler, GROUP_AT_MOST};
use crate::domain::{BackendFault, FaultKind};
use crate::domain::{MailboxKey, PoolError, ScheduledTask};
use crate::queue::capabilities::no_dependencies;
use crate::queue::duties::{DeadLetterReader, LeaseRenewer, LeaseRescuer};
use crate::queue::{Carried, DependsOn, EntryId, QueueError, SharedQueue};
use crate::scheduler::protocol::{Internal, Reply, SchedulerMsg};
use crate::util::contain::drop_contained;

/// Dead letters one read reports at most (the next read takes the rest).
const DEAD_LETTERS_PER_POLL: usize = 256;

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
    carried: Carried,
    depends_on: Option<DependsOn>,
    task: ScheduledTask<P>,
    key: MailboxKey,
    reply: Reply,
}

/// The key of the live task a refused park of caller (`key`'s tenant, `id`) meets, in a
/// queue that keeps callers unique. When there is none (it ended between the park and this
/// look, its outcome stored under its key) or the look fails, the submission's own key:
/// a repeated submission names the key of the original, as a retried request does.
async fn original<P: Send + 'static>(
    queue: &dyn SharedQueue<P>,
    key: &MailboxKey,
    id: crate::domain::TaskId,
) -> MailboxKey {
    let Some(callers) = queue.unique_callers() else {
        return key.clone();
    };
    match callers.live_task_key(&key.tenant, id).await {
        Ok(Some(original)) => original,
        Ok(None) => key.clone(),
        Err(error) => {
            tracing::warn!(task_id = id, %error, "could not look up the task a repeated submission attaches to; answering with its own key");
            key.clone()
        }
    }
}

/// Parks tasks as the scheduler hands them over, in groups: every task handed over while the
/// previous group was being stored goes in the next [`SharedQueue::enqueue_many`]; each
/// group's answers go back to the scheduler in one [`SharedReport::Enqueued`].
/// With `attach`, a task whose caller is live in the queue gets that task's key instead.
async fn park_loop<P: Send + 'static>(
    queue: Arc<dyn SharedQueue<P>>,
    scheduler: ActorRef<SchedulerMsg<P>>,
    mut parks: mpsc::UnboundedReceiver<ToPark<P>>,
    attach: bool,
) {
    let mut group = Vec::new();
    while parks.recv_many(&mut group, GROUP_AT_MOST).await > 0 {
        gather(&mut parks, &mut group).await;
        let mut answers = Vec::with_capacity(group.len());
        let parked = enqueue_group(&*queue, &mut group, &mut answers).await;
        let mut parked = parked.into_iter();
        let mut answered = Vec::with_capacity(answers.len());
        for (task_id, key, cost, reply) in answers {
            let result = parked.next().unwrap_or_else(|| {
                Err(QueueError::Backend(BackendFault::plain(
                    FaultKind::Other,
                    "the queue answered fewer parks than it was given",
                )))
            });
            let attached = match (&result, attach) {
                (Err(QueueError::Duplicate(_)), true) => {
                    Some(original(&*queue, &key, task_id).await)
                }
                _ => None,
            };
            answered.push(Enqueued {
                task_id,
                key,
                cost,
                reply,
                result,
                attached,
            });
        }
        let report = SharedReport::Enqueued(answered);
        let _ = scheduler.send_message(SchedulerMsg(Internal::Shared(report)));
    }
}

/// Stores a group of parks: each task waiting for parents with
/// [`SharedDependencies::enqueue_waiting`], the rest in one [`SharedQueue::enqueue_many`], each
/// with what it carries (a scheduled start's instant, its trace). Empties `group` into
/// `answers` (who hears of each task) and returns the queue's result of each task in the
/// group's order.
async fn enqueue_group<P: Send + 'static>(
    queue: &dyn SharedQueue<P>,
    group: &mut Vec<ToPark<P>>,
    answers: &mut Vec<(
        crate::domain::TaskId,
        MailboxKey,
        crate::domain::ResourceCost,
        Reply,
    )>,
) -> Vec<Result<Option<u32>, QueueError>> {
    let mut results: Vec<Option<Result<Option<u32>, QueueError>>> = Vec::with_capacity(group.len());
    let (mut tasks, mut places) = (Vec::new(), Vec::new());
    for park in group.drain(..) {
        let (task_id, cost) = (park.task.meta.id, park.task.meta.cost);
        answers.push((task_id, park.key, cost, park.reply));
        if let Some(depends_on) = &park.depends_on {
            let parked = match queue.dependencies() {
                Some(dependencies) => {
                    let (entry, rank_time_ms) = (park.entry, park.rank_time_ms);
                    dependencies
                        .enqueue_waiting(entry, rank_time_ms, park.task, park.carried, depends_on)
                        .await
                        .map(Some)
                }
                None => {
                    drop_contained(park.task);
                    Err(no_dependencies(queue))
                }
            };
            results.push(Some(parked));
            continue;
        }
        places.push(results.len());
        results.push(None);
        tasks.push((park.entry, park.rank_time_ms, park.task, park.carried));
    }
    if !tasks.is_empty() {
        let parked = queue.enqueue_many(tasks).await;
        for (place, result) in places.into_iter().zip(parked) {
            results[place] = Some(result.map(|()| None));
        }
    }
    results
        .into_iter()
        .map(|result| {
            result.unwrap_or_else(|| {
                Err(QueueError::Backend(BackendFault::plain(
                    FaultKind::Other,
                    "the queue answered fewer parks than it was given",
                )))
            })
        })
        .collect()
}

/// The I/O side of the shared mode. See the module docs.
pub(crate) struct SharedIo<P> {
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
    settles_waiting: Option<mpsc::UnboundedReceiver<SettleMsg>>,
    /// Hand-backs under way (a stopping node's), which the scheduler waits for as it stops.
    releases: std::sync::Mutex<Vec<tokio::task::JoinHandle<()>>>,
    /// Whether a park refused for its caller attaches to the live task (see
    /// [`UniqueCallers::keep_callers_unique`]).
    attach: bool,
}

impl<P> SharedIo<P>
where
    P: Send + 'static,
{
    /// The I/O side of the node `parking` describes.
    pub fn new(parking: &SharedParking<P>) -> Self {
        let (parks, parks_waiting) = mpsc::unbounded_channel();
        let (settles, settles_waiting) = mpsc::unbounded_channel();
        Self {
            queue: parking.queue.clone(),
            node: Arc::from(parking.node.as_str()),
            lease: parking.lease,
            poll: parking.poll,
            scheduler: None,
            parks,
            parks_waiting: Some(parks_waiting),
            settler: Settler { settles },
            settles_waiting: Some(settles_waiting),
            releases: std::sync::Mutex::new(Vec::new()),
            attach: false,
        }
    }

    /// Parks refused for their caller attach to the live task (a pool that attaches
    /// repeated submissions, on a queue that keeps callers unique).
    pub fn attaching(mut self, attach: bool) -> Self {
        self.attach = attach;
        self
    }

    /// Connects to the scheduler: starts the poll timer, the park and settle loops, the
    /// maintenance duties, and the queue's wake-ups.
    pub fn connect(&mut self, scheduler: ActorRef<SchedulerMsg<P>>) {
        if let Some(parks) = self.parks_waiting.take() {
            tokio::spawn(park_loop(
                self.queue.clone(),
                scheduler.clone(),
                parks,
                self.attach,
            ));
        }
        if let Some(settles) = self.settles_waiting.take() {
            let (queue, node) = (self.queue.clone(), self.node.clone());
            tokio::spawn(settle_loop(queue, node, self.lease, settles));
        }
        scheduler.send_interval(self.poll, || {
            SchedulerMsg(Internal::Shared(SharedReport::Poll))
        });
        // A node that starts claims what waits at once, not at its first poll.
        let _ = scheduler.send_message(SchedulerMsg(Internal::Shared(SharedReport::Wake)));
        tokio::spawn(rescue_leases(
            self.queue.clone(),
            self.node.clone(),
            LeaseRescuer::new(self.poll),
            scheduler.clone(),
        ));
        let reader = DeadLetterReader::new(self.poll).with_batch(DEAD_LETTERS_PER_POLL);
        tokio::spawn(read_dead_letters(
            self.queue.clone(),
            self.node.clone(),
            reader,
            scheduler.clone(),
        ));
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

    /// A handle that ends this node's claims from anywhere on the pool's runtime.
    pub fn settler(&self) -> Settler {
        self.settler.clone()
    }

    /// This node's name in the queue's claims.
    pub fn node(&self) -> Arc<str> {
        self.node.clone()
    }

    /// Sends `report` to the scheduler from anywhere (once connected).
    pub fn reporter(&self) -> impl Fn(SharedReport<P>) + Send + Clone + 'static {
        let scheduler = self.scheduler.clone();
        move |report| {
            if let Some(scheduler) = &scheduler {
                let _ = scheduler.send_message(SchedulerMsg(Internal::Shared(report)));
            }
        }
    }

    /// Makes the call the shell asked for.
    pub fn call(&self, call: SharedCall<P>) {
        match call {
            SharedCall::Enqueue {
                entry,
                rank_time_ms,
                carried,
                depends_on,
                task,
                key,
                reply,
            } => {
                let park = ToPark {
                    entry,
                    rank_time_ms,
                    carried,
                    depends_on,
                    task,
                    key,
                    reply,
                };
                if let Err(mpsc::error::SendError(park)) = self.parks.send(park) {
                    // Not connected any more: the pool is stopping.
                    park.reply.send(Err(PoolError::Shutdown));
                }
            }
            SharedCall::RecordStart {
                entry,
                shared_entry,
                rank_time_ms,
                task,
                trace,
                now,
            } => {
                let lease = self.lease;
                self.spawn(move |queue, node| async move {
                    let result = queue
                        .enqueue_claimed(&node, shared_entry, rank_time_ms, task, trace, lease, now)
                        .await;
                    Some(SharedReport::Recorded { entry, result })
                });
            }
            SharedCall::Claim { query, max, now } => {
                let lease = self.lease;
                self.spawn(move |queue, node| async move {
                    let claimed = queue.claim_batch(&node, &query, max, lease, now).await;
                    Some(SharedReport::Claimed(claimed))
                });
            }
            SharedCall::Settle { claim, settlement } => self.settler.settle(claim, settlement),
            SharedCall::Release { claims, now } => {
                let (queue, node) = (self.queue.clone(), self.node.clone());
                let release = tokio::spawn(async move {
                    let count = claims.len();
                    let released = queue.release_many(&node, claims, now).await;
                    let handed = released.iter().filter(|result| result.is_ok()).count();
                    match released.into_iter().find_map(Result::err) {
                        Some(error) => {
                            tracing::warn!(node = %node, handed, count, %error, "some claims could not be handed back; their leases will run out")
                        }
                        None => {
                            tracing::info!(node = %node, handed, "handed claims back to the shared queue")
                        }
                    }
                });
                self.releases
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .push(release);
            }
            SharedCall::Retry {
                claim,
                at_ms,
                reason,
            } => {
                let (queue, node) = (self.queue.clone(), self.node.clone());
                let retry = tokio::spawn(async move {
                    if let Err(error) = queue.retry(&node, claim, at_ms, reason).await {
                        tracing::warn!(node = %node, entry = claim.entry, %error, "a failed run's task could not be parked again; its lease will run out and another node runs it");
                    }
                });
                self.releases
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .push(retry);
            }
            SharedCall::GiveBackBudget { kind, units } => {
                let (queue, node) = (self.queue.clone(), self.node.clone());
                tokio::spawn(async move {
                    let Some(budgets) = queue.budgets() else {
                        return;
                    };
                    if let Err(error) = budgets.give_back_budget(kind, units).await {
                        tracing::warn!(node = %node, kind = kind.name(), units, %error, "units a task did not use could not go back to the fleet's budget");
                    }
                });
            }
            SharedCall::SettleUse { tenant, used } => {
                let (queue, node) = (self.queue.clone(), self.node.clone());
                tokio::spawn(async move {
                    let Some(fair_share) = queue.fair_share() else {
                        return;
                    };
                    if let Err(error) = fair_share.settle_use(&tenant, used).await {
                        tracing::warn!(node = %node, tenant = %tenant, %error, "a run's fair-share charge could not be settled in the fleet's counters; it stays charged ahead");
                    }
                });
            }
            SharedCall::RemoveTask { key, id, reply } => {
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
            SharedCall::Renew { held, now } => {
                let renewer = LeaseRenewer::new(self.node.clone(), self.lease);
                self.spawn(move |queue, _| async move {
                    let lost = renewer.run_once(&*queue, &held, now).await;
                    (!lost.is_empty()).then_some(SharedReport::Lost(lost))
                });
            }
        }
    }

    /// Waits, up to `limit`, for the hand-backs and settles asked for so far: a stopping
    /// node leaves no claim it gave up to its lease, nor a result's settle half done.
    pub async fn finish(&self, limit: Duration) {
        let releases = std::mem::take(
            &mut *self
                .releases
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        );
        let settler = self.settler.clone();
        let finished = async move {
            for release in releases {
                let _ = release.await;
            }
            settler.flush().await;
        };
        if tokio::time::timeout(limit, finished).await.is_err() {
            tracing::warn!(node = %self.node, "the shared queue's last hand-backs and settles did not finish in time; their leases will run out");
        }
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
}

/// The rescuer duty on its own timer: every `interval`, ends the claims whose lease ran out
/// (any node's), until the scheduler stops.
async fn rescue_leases<P: Send + 'static>(
    queue: Arc<dyn SharedQueue<P>>,
    node: Arc<str>,
    rescuer: LeaseRescuer,
    scheduler: ActorRef<SchedulerMsg<P>>,
) {
    let mut every = Every::new(rescuer.interval(), scheduler);
    while every.next().await {
        let now = crate::util::clock::engine_now_ms();
        match rescuer.run_once(queue.maintenance(), now).await {
            Ok(0) => {}
            Ok(rescued) => {
                tracing::info!(node = %node, rescued, "parked expired shared leases again")
            }
            Err(error) => tracing::warn!(node = %node, %error, "shared queue rescue failed"),
        }
    }
}

/// The dead-letter duty on its own timer: every `interval`, hands the tasks the queue gave
/// up on to the scheduler, which stores their failure for their submitters.
async fn read_dead_letters<P: Send + 'static>(
    queue: Arc<dyn SharedQueue<P>>,
    node: Arc<str>,
    reader: DeadLetterReader,
    scheduler: ActorRef<SchedulerMsg<P>>,
) {
    let mut every = Every::new(reader.interval(), scheduler.clone());
    while every.next().await {
        match reader.run_once(queue.maintenance()).await {
            Ok(dead) if dead.is_empty() => {}
            Ok(dead) => {
                let report = SchedulerMsg(Internal::Shared(SharedReport::Dead(dead)));
                if scheduler.send_message(report).is_err() {
                    return;
                }
            }
            Err(error) => tracing::warn!(node = %node, %error, "shared queue dead letters unread"),
        }
    }
}

/// A duty's timer: ticks every interval (a late tick delays the next rather than bunching
/// them) for as long as the scheduler lives.
struct Every<P> {
    ticks: tokio::time::Interval,
    scheduler: ActorRef<SchedulerMsg<P>>,
}

impl<P> Every<P> {
    fn new(interval: Duration, scheduler: ActorRef<SchedulerMsg<P>>) -> Self {
        let mut ticks = tokio::time::interval(interval);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        Self { ticks, scheduler }
    }

    /// Waits for the next tick; `false` once the scheduler is gone or going.
    async fn next(&mut self) -> bool {
        self.ticks.tick().await;
        !stopped(&self.scheduler)
    }
}

/// Whether the scheduler is gone or going: the duties end with it.
fn stopped<P>(scheduler: &ActorRef<SchedulerMsg<P>>) -> bool {
    matches!(
        scheduler.get_status(),
        ractor::ActorStatus::Stopping | ractor::ActorStatus::Stopped
    )
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
