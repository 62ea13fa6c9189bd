//! A shared queue in memory: the reference implementation of [`SharedQueue`], shared between
//! the pools of one process.
//!
//! Several pools holding an `Arc` of one queue act as the "nodes" of the shared contract, each
//! under its own node name: they park to it, claim the best-ranked task that fits their free
//! capacity under a lease, renew, settle, and rescue each other's expired leases. Nothing
//! survives the process, and nothing is shared with another process: this backend is for the
//! engine's own tests and for multi-node tests in one process. A deployment across machines
//! needs a database backend.
//!
//! # Algorithm
//!
//! Parked entries are indexed per resource kind by the core's [`CostIndex`], keyed by their
//! rank (priority, then `rank_time_ms`, then entry id, as a [`RankKey`]) at their cost in
//! units. A claim asks each kind's index for its best-ranked entry costing at most that kind's
//! free units (32 trie levels, no scan), keeps the candidates the rank bound admits, and
//! takes the best of them: O(K log U) for K kinds and U possible costs, whatever the number
//! of parked entries. Rescue scans the claims (it runs rarely, on a timer).
//!
//! # Invariants
//!
//! - An entry is in exactly one of `parked` and `claimed`, or in neither (settled, removed,
//!   never enqueued).
//! - `parked` and the kind indexes hold the same entries, each at its own cost and rank.
//! - A rescued entry is parked again at the rank it was enqueued with; its claim count stays
//!   as it was until it is claimed again.
//! - An entry whose lease runs out on its last attempt ([`with_max_attempts`]; none by
//!   default) leaves the queue as a dead letter, reported once by
//!   [`take_dead_letters`](QueueMaintenance::take_dead_letters).
//!
//! [`with_max_attempts`]: InMemorySharedQueue::with_max_attempts
//!
//! # Payloads
//!
//! A claim hands the node a copy of the task and keeps the original, as a database keeps the
//! row: a lease that runs out must be able to park the task again. The queue itself needs no
//! bound on its payload; its [`SharedQueue`] implementation needs `P: Clone`. Wrap a payload
//! that cannot be cloned in an `Arc`.

use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use async_trait::async_trait;

mod capabilities;
mod dependencies;
mod maintenance;
mod shedding;

use crate::core::scheduling::{RankKey, TokenBucket};
use crate::core::TraceParent;
use crate::core::{
    Budget, Carried, Claim, DeadLetter, EntryId, FitQuery, KeptLetter, Lease, LetterEnd,
    QueueCounts, QueueError, QueueMaintenance, QueueOrder, QueuedUnits, RankBound, ScheduleTicks,
    ScheduledTask, Settlement, SharedBudgets, SharedDependencies, SharedQueue, TaskStatus,
    UniqueCallers,
};
use crate::util::serde::{MailboxKey, ResourceKind, TaskId, TenantId};
use prometheus_parking_lot_actors::scheduler::core::{CostIndex, FastMap};

/// A shared queue in memory, for the pools of one process. See the module docs.
///
/// ```
/// use std::sync::Arc;
/// use std::time::Duration;
///
/// use prometheus_parking_lot::core::{
///     Capacity, FitQuery, QueueError, QueueMaintenance, ScheduledTask, Settlement, SharedQueue,
///     TaskMetadata,
/// };
/// use prometheus_parking_lot::infra::queue::shared_memory::InMemorySharedQueue;
/// use prometheus_parking_lot::ResourceCost;
///
/// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
/// // Two pools of one process, as two nodes of one shared queue.
/// let queue = Arc::new(InMemorySharedQueue::new());
/// let (node_a, node_b) = (Arc::clone(&queue), Arc::clone(&queue));
///
/// let task = ScheduledTask::new(TaskMetadata::new(7, ResourceCost::gpu_vram(16)), "prompt");
/// node_a.enqueue(1, 1_000, task).await?;
///
/// // Node b has 24 free units of GPU memory: it claims the task under a 30 s lease.
/// let free = FitQuery::within(Capacity::uniform(24));
/// let lease = Duration::from_secs(30);
/// let claimed = node_b.claim_best_fit("b", &free, lease, 2_000).await?.expect("it fits");
/// assert_eq!((claimed.entry, claimed.attempt, claimed.expires_at_ms), (1, 1, 32_000));
///
/// // Only the holder settles it, under the claim it holds.
/// let claim = claimed.claim();
/// assert_eq!(node_a.settle("a", claim, Settlement::Done).await, Err(QueueError::NotClaimed(1)));
/// node_b.settle("b", claim, Settlement::Done).await?;
/// assert_eq!(queue.counts().await?.claimed, 0);
/// # Ok::<(), QueueError>(())
/// # }).unwrap();
/// ```
pub struct InMemorySharedQueue<P> {
    inner: Mutex<Lot<P>>,
    /// Claims an entry may have; a lease that runs out on the last one makes it a dead letter.
    max_attempts: u32,
}

/// Everything the queue holds, behind one lock.
struct Lot<P> {
    /// Parked entries, by entry id.
    parked: FastMap<EntryId, Parked<P>>,
    /// The ranks of the parked entries per resource kind (by [`ResourceKind::index`]), at
    /// their cost in units.
    by_kind: [CostIndex; ResourceKind::COUNT],
    /// The units parked per resource kind: the sums of `by_kind`'s costs.
    queued_units: [u64; ResourceKind::COUNT],
    /// The bound on `queued_units` a park keeps, if any ([`QueuedUnits`]).
    max_queued_units: Option<u64>,
    /// Claimed entries, by entry id.
    claimed: FastMap<EntryId, Held<P>>,
    /// Entries given up on, oldest first, not reported yet.
    dead: std::collections::VecDeque<DeadLetter>,
    /// Entries parked again for another run, by entry, with the time they are claimable
    /// from; parked for real by the first claim at or after it.
    resting: FastMap<EntryId, (u64, Parked<P>)>,
    /// The budgets every node spends from (by [`ResourceKind::index`]), once shared.
    budgets: [Option<FleetBucket>; ResourceKind::COUNT],
    /// Whether a task whose caller has a live task here is refused
    /// ([`UniqueCallers::keep_callers_unique`]).
    unique_callers: bool,
    /// With callers kept unique, the callers whose task completed, remembered until the
    /// time beside them (ms) with their key, so a resubmission racing with the end meets
    /// them; forgotten by the first rescue after that time.
    ended: FastMap<(TenantId, TaskId), (u64, MailboxKey)>,
    /// The dead letters kept for an operator, oldest first, at most [`KEPT_AT_MOST`]: each
    /// entry with its task and why it was given up.
    kept: std::collections::VecDeque<(EntryId, Parked<P>, String)>,
    /// The latest tick each schedule parked (`ScheduleTicks::enqueue_tick`): a tick at or
    /// before it is parked already, by some node.
    latest_ticks: FastMap<String, u64>,
    /// The order claims take a priority's tasks in ([`SharedQueue::order`]).
    order: QueueOrder,
    /// The children waiting for their parents, and how recent tasks ended (see
    /// `dependencies.rs`).
    books: dependencies::Books<P>,
}

/// How long a caller whose task completed is remembered, past its lease's expiry, ms.
const REMEMBER_ENDED_MS: u64 = 60_000;

/// Dead letters the in-memory queue keeps at most; the oldest go first.
const KEPT_AT_MOST: usize = 10_000;

/// A kind's budget as the nodes share it: its units and, under a start cap, its starts.
struct FleetBucket {
    budget: Budget,
    units: TokenBucket,
    starts: Option<TokenBucket>,
}

impl FleetBucket {
    /// The bucket of `budget`, full, or at `level` (at most the burst) when it replaces one.
    fn new(budget: Budget, level: Option<u32>) -> Self {
        let mut units = TokenBucket::new(budget.units, budget.per_ms, budget.burst);
        if let Some(level) = level {
            units.spend(budget.burst.saturating_sub(level));
        }
        let starts = budget
            .max_starts
            .map(|cap| TokenBucket::new(cap.count, cap.per_ms, cap.count));
        Self {
            budget,
            units,
            starts,
        }
    }

    /// Units a claim of the kind may take now: none while no start is left.
    fn free(&mut self, now_ms: u64) -> u32 {
        self.units.refill(now_ms);
        match &mut self.starts {
            Some(starts) => {
                starts.refill(now_ms);
                if starts.whole() == 0 {
                    return 0;
                }
                self.units.whole()
            }
            None => self.units.whole(),
        }
    }

    /// Whether a claim of the kind may take anything now (a start is left, where capped).
    fn may_start(&self) -> bool {
        self.starts.as_ref().is_none_or(|starts| starts.whole() > 0)
    }

    fn spend(&mut self, units: u32) {
        self.units.spend(units);
        if let Some(starts) = &mut self.starts {
            starts.spend(1);
        }
    }
}

/// A parked entry.
struct Parked<P> {
    task: ScheduledTask<P>,
    /// Its admission time, the second part of its rank.
    rank_time_ms: u64,
    /// How many times it has been claimed so far.
    claims: u32,
    /// When it last became claimable (ms since the Unix epoch): woken from a rest (a
    /// scheduled start, a retry's backoff) or handed back; 0 for a task claimable since it
    /// was parked. The starvation rule ages it from then, as a node's core ages a sleeper
    /// from its waking.
    claimable_from_ms: u64,
    /// The trace it was parked in, handed to every node that claims it.
    trace: Option<TraceParent>,
}

/// A claimed entry: the task (kept to park it again if the lease runs out) and the lease.
struct Held<P> {
    /// The entry as it was parked: its task, rank time and claim count.
    parked: Parked<P>,
    /// The node holding the lease.
    node: String,
    /// When the lease runs out unless renewed, milliseconds since the Unix epoch.
    expires_at_ms: u64,
}

impl<P> Parked<P> {
    /// Its rank in `order`.
    fn rank(&self, entry: EntryId, order: QueueOrder) -> RankKey {
        let meta = &self.task.meta;
        match order {
            QueueOrder::Fifo => RankKey::new(meta.priority, self.rank_time_ms, entry),
            QueueOrder::Deadline => RankKey::by_deadline(
                meta.priority,
                meta.deadline_ms
                    .map(|deadline| u64::try_from(deadline).unwrap_or(u64::MAX)),
                self.rank_time_ms,
                entry,
            ),
        }
    }
}

impl<P> Lot<P> {
    fn index_of(&mut self, task: &ScheduledTask<P>) -> &mut CostIndex {
        &mut self.by_kind[task.meta.cost.kind.index()]
    }

    /// Parks `parked` under `entry` and indexes it by kind, cost and rank.
    fn park(&mut self, entry: EntryId, parked: Parked<P>) {
        let (units, rank) = (parked.task.meta.cost.units, parked.rank(entry, self.order));
        self.index_of(&parked.task).insert(units, rank);
        self.queued_units[parked.task.meta.cost.kind.index()] += u64::from(units);
        self.parked.insert(entry, parked);
    }

    /// Takes `entry` out of `parked` and its kind's index.
    fn unpark(&mut self, entry: EntryId) -> Option<Parked<P>> {
        let parked = self.parked.remove(&entry)?;
        let (units, rank) = (parked.task.meta.cost.units, parked.rank(entry, self.order));
        self.index_of(&parked.task).remove(units, rank);
        self.queued_units[parked.task.meta.cost.kind.index()] -= u64::from(units);
        Some(parked)
    }

    /// `query` within the shared budgets at `now_ms`, and the kinds a claim may take at all
    /// (none of a kind whose start cap is used up, not even a task of no units).
    fn within_budgets(
        &mut self,
        query: &FitQuery,
        now_ms: u64,
    ) -> (FitQuery, [bool; ResourceKind::COUNT]) {
        let mut query = *query;
        let mut open = [true; ResourceKind::COUNT];
        for kind in ResourceKind::ALL {
            if let Some(bucket) = &mut self.budgets[kind.index()] {
                let free = query.free.get(kind).min(bucket.free(now_ms));
                query.free = query.free.with(kind, free);
                open[kind.index()] = bucket.may_start();
            }
        }
        (query, open)
    }

    /// The best-ranked parked entry that fits `query`, across the `open` kinds.
    fn best_fit(&self, query: &FitQuery, open: [bool; ResourceKind::COUNT]) -> Option<EntryId> {
        let reserved = self.reserved_bound(query);
        ResourceKind::ALL
            .into_iter()
            .filter(|kind| open[kind.index()])
            .filter_map(|kind| self.by_kind[kind.index()].best_within(query.free.get(kind)))
            .filter(|rank| {
                [query.bound, reserved]
                    .into_iter()
                    .flatten()
                    .all(|bound| self.admitted_by(bound, rank.id()))
            })
            .min()
            .map(|rank| rank.id())
    }

    /// Whether `bound` admits the parked `entry`. The best entry of a kind that fits is
    /// enough to ask: every other one that fits ranks behind it.
    fn admitted_by(&self, bound: RankBound, entry: EntryId) -> bool {
        self.parked.get(&entry).is_some_and(|parked| {
            let rank = parked.rank(entry, self.order);
            bound.admits_in(
                self.order,
                rank.priority(),
                rank.deadline_ms(),
                parked.rank_time_ms,
                entry,
            )
        })
    }

    /// The rank of the task the node's starvation rule reserves, when it does not fit the
    /// free units now (see [`StarvationRule`](crate::core::StarvationRule)). A scan of the parked entries: this queue
    /// serves tests and one process, where a linear pass is cheap next to a claim.
    fn reserved_bound(&self, query: &FitQuery) -> Option<RankBound> {
        let rule = query.starvation?;
        let (entry, parked) = self
            .parked
            .iter()
            .filter(|(_, parked)| {
                let cost = parked.task.meta.cost;
                parked.rank_time_ms <= rule.parked_before_ms
                    && parked.claimable_from_ms <= rule.parked_before_ms
                    && cost.units <= rule.capacity.get(cost.kind)
            })
            // The oldest aged task: under the deadline order too, the one that waited longest
            // (as the Postgres table queue reserves it).
            .min_by_key(|(entry, parked)| parked.rank(**entry, QueueOrder::Fifo))?;
        let cost = parked.task.meta.cost;
        (cost.units > query.free.get(cost.kind)).then_some(RankBound {
            priority: parked.task.meta.priority,
            deadline_ms: parked.rank(*entry, self.order).deadline_ms(),
            rank_time_ms: parked.rank_time_ms,
            entry: *entry,
        })
    }

    /// Parks the resting entries whose time has come.
    fn wake(&mut self, now_ms: u64) {
        let due: Vec<EntryId> = self
            .resting
            .iter()
            .filter(|(_, (at, _))| *at <= now_ms)
            .map(|(&entry, _)| entry)
            .collect();
        for entry in due {
            if let Some((at, mut parked)) = self.resting.remove(&entry) {
                parked.claimable_from_ms = at;
                self.park(entry, parked);
            }
        }
    }

    /// The live task (parked, claimed or resting) of caller (`tenant`, `id`), if any. A
    /// scan: this queue serves tests and one process.
    fn live_caller(&self, tenant: &TenantId, id: TaskId) -> Option<&ScheduledTask<P>> {
        let parked = self.parked.values();
        let claimed = self.claimed.values().map(|held| &held.parked);
        let resting = self.resting.values().map(|(_, parked)| parked);
        parked
            .chain(claimed)
            .chain(resting)
            .map(|parked| &parked.task)
            .chain(self.books.tasks().map(|(_, task)| task))
            .find(|task| {
                task.meta.id == id
                    && task
                        .meta
                        .mailbox
                        .as_ref()
                        .is_some_and(|key| key.tenant == *tenant)
            })
    }

    /// Whether `task` may not be stored as entry `entry`: the entry is held, or callers are
    /// kept unique and its caller has a live task.
    fn refuses(&self, entry: EntryId, task: &ScheduledTask<P>) -> bool {
        if self.holds(entry) {
            return true;
        }
        let caller = task.meta.mailbox.as_ref().map(|key| &key.tenant);
        self.unique_callers
            && caller.is_some_and(|tenant| {
                self.live_caller(tenant, task.meta.id).is_some()
                    || self.ended.contains_key(&(tenant.clone(), task.meta.id))
            })
    }

    /// Removes `entry` wherever it waits unclaimed (parked, resting, waiting for its
    /// parents), as a cancel does: the children waiting on it end `Cancelled`.
    fn remove_unclaimed(&mut self, entry: EntryId) -> Option<ScheduledTask<P>> {
        let task = match self.resting.remove(&entry) {
            Some((_, parked)) => Some(parked.task),
            None => self
                .unpark(entry)
                .map(|parked| parked.task)
                .or_else(|| self.books.take(entry)),
        }?;
        self.ended(entry, &task, Some(TaskStatus::Cancelled));
        Some(task)
    }

    /// Keeps dead letter `entry` for an operator.
    fn keep_dead(&mut self, entry: EntryId, parked: Parked<P>, reason: String) {
        if self.kept.len() == KEPT_AT_MOST {
            self.kept.pop_front();
        }
        self.kept.push_back((entry, parked, reason));
    }

    /// Whether `entry` is held in any state.
    fn holds(&self, entry: EntryId) -> bool {
        self.parked.contains_key(&entry)
            || self.claimed.contains_key(&entry)
            || self.resting.contains_key(&entry)
            || self.books.holds(entry)
    }

    /// What `node` holds of `entry`, if it holds it.
    fn held_by(&mut self, node: &str, entry: EntryId) -> Result<&mut Held<P>, QueueError> {
        match self.claimed.get_mut(&entry) {
            Some(held) if held.node == node => Ok(held),
            _ => Err(QueueError::NotClaimed(entry)),
        }
    }

    /// Takes `claim` out of the claimed entries, if `node` holds the entry under this very
    /// claim.
    fn end_claim(&mut self, node: &str, claim: Claim) -> Result<Held<P>, QueueError> {
        let held = self.held_by(node, claim.entry)?;
        if held.parked.claims != claim.attempt {
            return Err(QueueError::NotClaimed(claim.entry));
        }
        self.claimed
            .remove(&claim.entry)
            .ok_or(QueueError::NotClaimed(claim.entry))
    }
}

impl<P> Default for InMemorySharedQueue<P> {
    fn default() -> Self {
        Self::new()
    }
}

impl<P> InMemorySharedQueue<P> {
    /// An empty queue that never gives up on a task: a lease that runs out parks it again,
    /// however often.
    pub fn new() -> Self {
        Self {
            inner: Mutex::new(Lot {
                parked: FastMap::default(),
                by_kind: std::array::from_fn(|_| CostIndex::new()),
                queued_units: [0; ResourceKind::COUNT],
                max_queued_units: None,
                claimed: FastMap::default(),
                dead: std::collections::VecDeque::new(),
                resting: FastMap::default(),
                budgets: std::array::from_fn(|_| None),
                unique_callers: false,
                kept: std::collections::VecDeque::new(),
                ended: FastMap::default(),
                latest_ticks: FastMap::default(),
                order: QueueOrder::Fifo,
                books: dependencies::Books::default(),
            }),
            max_attempts: u32::MAX,
        }
    }

    /// Gives up on a task whose lease runs out on its `max_attempts`-th claim: it becomes a
    /// dead letter instead of being parked again, as a database backend's retry policy does.
    pub fn with_max_attempts(mut self, max_attempts: u32) -> Self {
        self.max_attempts = max_attempts;
        self
    }

    /// Claims the tasks of one priority in `order` (admission by default): the deadline
    /// order takes the earliest deadline first, tasks without one last. Set it before the
    /// first park: the parked tasks' ranks are kept in it.
    pub fn with_order(mut self, order: QueueOrder) -> Self {
        self.inner
            .get_mut()
            .unwrap_or_else(PoisonError::into_inner)
            .order = order;
        self
    }

    /// Every update leaves the maps and indexes consistent before anything could panic, so a
    /// poisoned lock is taken over as it is.
    fn lock(&self) -> MutexGuard<'_, Lot<P>> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[async_trait]
impl<P> SharedQueue<P> for InMemorySharedQueue<P>
where
    P: Clone + Send + 'static,
{
    fn backend(&self) -> &'static str {
        "in_memory_shared"
    }

    fn order(&self) -> QueueOrder {
        self.lock().order
    }

    fn maintenance(&self) -> &dyn QueueMaintenance {
        self
    }

    fn schedule_ticks(&self) -> Option<&dyn ScheduleTicks<P>> {
        Some(self)
    }

    fn budgets(&self) -> Option<&dyn SharedBudgets> {
        Some(self)
    }

    fn unique_callers(&self) -> Option<&dyn UniqueCallers> {
        Some(self)
    }

    fn queued_units(&self) -> Option<&dyn QueuedUnits> {
        Some(self)
    }

    fn dependencies(&self) -> Option<&dyn SharedDependencies<P>> {
        Some(self)
    }

    async fn enqueue(
        &self,
        entry: EntryId,
        rank_time_ms: u64,
        task: ScheduledTask<P>,
    ) -> Result<(), QueueError> {
        self.enqueue_carrying(entry, rank_time_ms, task, Carried::default())
            .await
    }

    async fn enqueue_claimed(
        &self,
        node: &str,
        entry: EntryId,
        rank_time_ms: u64,
        task: ScheduledTask<P>,
        trace: Option<TraceParent>,
        lease: Duration,
        now_ms: u64,
    ) -> Result<Lease<P>, QueueError> {
        let mut lot = self.lock();
        if lot.refuses(entry, &task) {
            return Err(QueueError::Duplicate(entry));
        }
        let leased = Lease {
            entry,
            task: task.clone(),
            attempt: 1,
            expires_at_ms: Lease::<P>::expiry(now_ms, lease),
            trace,
        };
        let held = Held {
            parked: Parked {
                task,
                rank_time_ms,
                claims: 1,
                claimable_from_ms: 0,
                trace,
            },
            node: node.to_owned(),
            expires_at_ms: leased.expires_at_ms,
        };
        lot.claimed.insert(entry, held);
        Ok(leased)
    }

    /// The trace is kept with the task and handed to each claim; a scheduled start is kept
    /// resting until its instant, as a retried claim rests out its backoff.
    async fn enqueue_carrying(
        &self,
        entry: EntryId,
        rank_time_ms: u64,
        task: ScheduledTask<P>,
        carried: Carried,
    ) -> Result<(), QueueError> {
        let mut lot = self.lock();
        if lot.refuses(entry, &task) {
            return Err(QueueError::Duplicate(entry));
        }
        let parked = Parked {
            task,
            rank_time_ms,
            claims: 0,
            claimable_from_ms: 0,
            trace: carried.trace,
        };
        match (carried.not_before_ms, lot.max_queued_units) {
            (Some(not_before_ms), _) => {
                lot.resting.insert(entry, (not_before_ms, parked));
            }
            (None, Some(bound)) => lot.park_within(entry, parked, bound)?,
            (None, None) => lot.park(entry, parked),
        }
        Ok(())
    }

    async fn claim_best_fit(
        &self,
        node: &str,
        query: &FitQuery,
        lease: Duration,
        now_ms: u64,
    ) -> Result<Option<Lease<P>>, QueueError> {
        let mut lot = self.lock();
        lot.wake(now_ms);
        let (query, open) = lot.within_budgets(query, now_ms);
        let Some(entry) = lot.best_fit(&query, open) else {
            return Ok(None);
        };
        let Some(mut parked) = lot.unpark(entry) else {
            return Ok(None);
        };
        let cost = parked.task.meta.cost;
        if let Some(bucket) = &mut lot.budgets[cost.kind.index()] {
            bucket.spend(cost.units);
        }
        parked.claims = parked.claims.saturating_add(1);
        let leased = Lease {
            entry,
            task: parked.task.clone(),
            attempt: parked.claims,
            expires_at_ms: Lease::<P>::expiry(now_ms, lease),
            trace: parked.trace,
        };
        let held = Held {
            parked,
            node: node.to_owned(),
            expires_at_ms: leased.expires_at_ms,
        };
        lot.claimed.insert(entry, held);
        Ok(Some(leased))
    }

    /// A lease that ran out but was not rescued yet is still the node's: it renews.
    async fn renew(
        &self,
        node: &str,
        entry: EntryId,
        lease: Duration,
        now_ms: u64,
    ) -> Result<(), QueueError> {
        let mut lot = self.lock();
        lot.held_by(node, entry)?.expires_at_ms = Lease::<P>::expiry(now_ms, lease);
        Ok(())
    }

    /// A failed run's task is kept as a dead letter, with the reason (see
    /// [`QueueMaintenance::list_dead_letters`]).
    async fn settle(
        &self,
        node: &str,
        claim: Claim,
        settlement: Settlement,
    ) -> Result<(), QueueError> {
        let mut lot = self.lock();
        let held = lot.end_claim(node, claim)?;
        let outcome = match &settlement {
            Settlement::Done => None,
            Settlement::Failed(reason) => Some(TaskStatus::Failed(reason.clone())),
            Settlement::Ended(status) => Some(status.clone()),
        };
        lot.ended(claim.entry, &held.parked.task, outcome);
        match settlement {
            Settlement::Failed(reason) => lot.keep_dead(claim.entry, held.parked, reason),
            Settlement::Done | Settlement::Ended(_) if lot.unique_callers => {
                if let Some(key) = held.parked.task.meta.mailbox {
                    let until = held.expires_at_ms.saturating_add(REMEMBER_ENDED_MS);
                    let caller = (key.tenant.clone(), held.parked.task.meta.id);
                    lot.ended.insert(caller, (until, key));
                }
            }
            Settlement::Done | Settlement::Ended(_) => {}
        }
        Ok(())
    }

    /// A released entry's claim count goes back one, so the release costs no attempt.
    async fn release_many(
        &self,
        node: &str,
        claims: Vec<Claim>,
        now_ms: u64,
    ) -> Vec<Result<(), QueueError>> {
        let mut lot = self.lock();
        claims
            .into_iter()
            .map(|claim| {
                let mut held = lot.end_claim(node, claim)?;
                held.parked.claims = held.parked.claims.saturating_sub(1);
                held.parked.claimable_from_ms = now_ms;
                lot.park(claim.entry, held.parked);
                Ok(())
            })
            .collect()
    }

    /// The claim count stays: the failed run was an attempt.
    async fn retry(
        &self,
        node: &str,
        claim: Claim,
        at_ms: u64,
        _reason: String,
    ) -> Result<(), QueueError> {
        let mut lot = self.lock();
        let held = lot.end_claim(node, claim)?;
        lot.resting.insert(claim.entry, (at_ms, held.parked));
        Ok(())
    }

    /// Scans the resting entries, as [`remove_task`](Self::remove_task) scans.
    async fn sleeping_until(
        &self,
        key: &MailboxKey,
        id: TaskId,
        now_ms: u64,
    ) -> Result<Option<u64>, QueueError> {
        let lot = self.lock();
        Ok(lot
            .resting
            .values()
            .filter(|(at, parked)| {
                *at > now_ms
                    && parked.task.meta.id == id
                    && parked.task.meta.mailbox.as_ref() == Some(key)
            })
            .map(|(at, _)| *at)
            .min())
    }

    /// A removed task ends the children waiting on it `Cancelled`.
    async fn remove(&self, entry: EntryId) -> Result<Option<ScheduledTask<P>>, QueueError> {
        Ok(self.lock().remove_unclaimed(entry))
    }

    /// Scans the parked entries: cancels are rare, and a database backend answers the same
    /// question from an index on (tenant, task id).
    async fn remove_task(
        &self,
        key: &MailboxKey,
        id: TaskId,
    ) -> Result<Option<ScheduledTask<P>>, QueueError> {
        let wanted =
            |task: &ScheduledTask<P>| task.meta.id == id && task.meta.mailbox.as_ref() == Some(key);
        let mut lot = self.lock();
        let resting = lot
            .resting
            .iter()
            .map(|(&entry, (_, parked))| (entry, &parked.task));
        let parked = lot
            .parked
            .iter()
            .map(|(&entry, parked)| (entry, &parked.task));
        let found = resting
            .chain(parked)
            .chain(lot.books.tasks())
            .filter(|(_, task)| wanted(task))
            .map(|(entry, _)| entry)
            .min();
        Ok(found.and_then(|entry| lot.remove_unclaimed(entry)))
    }
}

/// The dead letter of a claim whose lease ran out on its last attempt, worded as the database
/// backends word it.
fn dead_letter<P>(claim: &Held<P>) -> DeadLetter {
    let meta = &claim.parked.task.meta;
    DeadLetter {
        key: meta.mailbox.clone().unwrap_or_else(|| MailboxKey::new("")),
        task_id: meta.id,
        cost: meta.cost,
        reason: format!(
            "the shared queue gave up on the task: the lease of node {} ran out (attempt {})",
            claim.node, claim.parked.claims
        ),
        end: LetterEnd::GivenUp,
    }
}
