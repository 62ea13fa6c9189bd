//! The default queue: parked tasks in memory, indexed for the fit query.
//!
//! Parked tasks are indexed exactly like the scheduling core indexes them (per resource kind,
//! a [`CostIndex`] over costs holding ranks), so [`TaskQueue::claim_best_fit`] is
//! O(log n) too. Nothing survives the process: shutdown ends parked tasks `Cancelled`.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::{Mutex, MutexGuard};

use async_trait::async_trait;

use crate::core::scheduling::{clamp_ms, CostIndex, RankKey};
use crate::core::{FitQuery, QueueCounts, QueueError, ScheduledTask, TaskQueue};
use crate::util::serde::{ResourceKind, TaskId};

/// Parked tasks in memory. See the module docs.
///
/// ```
/// use prometheus_parking_lot::core::TaskQueue;
/// use prometheus_parking_lot::infra::queue::memory::InMemoryQueue;
///
/// let queue: Box<dyn TaskQueue<String>> = Box::new(InMemoryQueue::new());
/// assert_eq!(queue.backend(), "in_memory");
/// ```
pub struct InMemoryQueue<P> {
    inner: Mutex<Parked<P>>,
    max_parked: Option<usize>,
}

struct Parked<P> {
    tasks: HashMap<TaskId, ScheduledTask<P>>,
    by_cost: [CostIndex; ResourceKind::COUNT],
    by_deadline: BTreeSet<(u64, TaskId)>,
    claimed: HashSet<TaskId>,
}

impl<P> Default for InMemoryQueue<P> {
    fn default() -> Self {
        Self::new()
    }
}

impl<P> InMemoryQueue<P> {
    /// An unbounded queue (the pool's `max_queue_depth` still bounds what it parks).
    pub fn new() -> Self {
        Self {
            inner: Mutex::new(Parked {
                tasks: HashMap::new(),
                by_cost: Default::default(),
                by_deadline: BTreeSet::new(),
                claimed: HashSet::new(),
            }),
            max_parked: None,
        }
    }

    /// A queue that refuses to park more than `max_parked` tasks (`QueueError::Full`).
    pub fn bounded(max_parked: usize) -> Self {
        Self {
            max_parked: Some(max_parked),
            ..Self::new()
        }
    }

    fn lock(&self) -> Result<MutexGuard<'_, Parked<P>>, QueueError> {
        self.inner
            .lock()
            .map_err(|_| QueueError::Backend("in-memory queue lock poisoned".into()))
    }
}

fn rank<P>(task: &ScheduledTask<P>) -> RankKey {
    RankKey::new(
        task.meta.priority,
        clamp_ms(task.meta.created_at_ms),
        task.meta.id,
    )
}

impl<P> Parked<P> {
    fn insert(&mut self, task: ScheduledTask<P>) {
        let meta = &task.meta;
        self.by_cost[meta.cost.kind.index()].insert(meta.cost.units, rank(&task));
        if let Some(deadline) = meta.deadline_ms {
            self.by_deadline.insert((clamp_ms(deadline), meta.id));
        }
        self.tasks.insert(meta.id, task);
    }

    fn remove(&mut self, id: TaskId) -> Option<ScheduledTask<P>> {
        let task = self.tasks.remove(&id)?;
        let meta = &task.meta;
        self.by_cost[meta.cost.kind.index()].remove(meta.cost.units, rank(&task));
        if let Some(deadline) = meta.deadline_ms {
            self.by_deadline.remove(&(clamp_ms(deadline), id));
        }
        Some(task)
    }

    fn claim(&mut self, id: TaskId) -> Option<ScheduledTask<P>> {
        let task = self.remove(id)?;
        self.claimed.insert(id);
        Some(task)
    }
}

#[async_trait]
impl<P> TaskQueue<P> for InMemoryQueue<P>
where
    P: Send + 'static,
{
    fn backend(&self) -> &'static str {
        "in_memory"
    }

    fn is_durable(&self) -> bool {
        false
    }

    async fn park(&self, task: ScheduledTask<P>) -> Result<(), QueueError> {
        let mut parked = self.lock()?;
        let id = task.meta.id;
        if parked.tasks.contains_key(&id) || parked.claimed.contains(&id) {
            return Err(QueueError::Duplicate(id));
        }
        if let Some(max) = self.max_parked.filter(|&max| parked.tasks.len() >= max) {
            return Err(QueueError::Full(max));
        }
        parked.insert(task);
        Ok(())
    }

    async fn claim(&self, id: TaskId) -> Result<Option<ScheduledTask<P>>, QueueError> {
        Ok(self.lock()?.claim(id))
    }

    async fn claim_best_fit(
        &self,
        query: &FitQuery,
    ) -> Result<Option<ScheduledTask<P>>, QueueError> {
        let mut parked = self.lock()?;
        let best = ResourceKind::ALL
            .iter()
            .filter_map(|&kind| parked.by_cost[kind.index()].best_within(query.free.get(kind)))
            .min();
        let allowed = best.filter(|best| {
            query
                .ranked_at_or_ahead_of
                .is_none_or(|bound| *best <= bound)
        });
        Ok(allowed.and_then(|best| parked.claim(best.id())))
    }

    async fn complete(&self, id: TaskId) -> Result<(), QueueError> {
        match self.lock()?.claimed.remove(&id) {
            true => Ok(()),
            false => Err(QueueError::NotClaimed(id)),
        }
    }

    async fn fail(&self, id: TaskId, _reason: &str) -> Result<(), QueueError> {
        self.complete(id).await
    }

    async fn release(&self, task: ScheduledTask<P>) -> Result<(), QueueError> {
        let mut parked = self.lock()?;
        if !parked.claimed.remove(&task.meta.id) {
            return Err(QueueError::NotClaimed(task.meta.id));
        }
        parked.insert(task);
        Ok(())
    }

    async fn remove(&self, id: TaskId) -> Result<Option<ScheduledTask<P>>, QueueError> {
        Ok(self.lock()?.remove(id))
    }

    async fn expire(&self, now_ms: u64) -> Result<Vec<TaskId>, QueueError> {
        let mut parked = self.lock()?;
        let mut expired = Vec::new();
        while let Some(&(deadline, id)) = parked.by_deadline.first() {
            if deadline > now_ms {
                break;
            }
            parked.remove(id);
            expired.push(id);
        }
        Ok(expired)
    }

    async fn counts(&self) -> Result<QueueCounts, QueueError> {
        let parked = self.lock()?;
        Ok(QueueCounts {
            parked: parked.tasks.len(),
            claimed: parked.claimed.len(),
        })
    }
}
