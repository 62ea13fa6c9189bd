//! The default queue: parked tasks in memory.
//!
//! The scheduler's core indexes parked tasks and decides which one starts; this queue only
//! holds their payloads (and what each was parked with) by entry id, so it is a hash map and
//! nothing more. It needs no I/O,
//! so the scheduler drives it directly ([`InlineQueue`]). Nothing survives the process:
//! shutdown ends parked tasks `Cancelled`.
//!
//! [`multi_node`] holds the in-memory queue many pools of one process share.

pub(crate) mod driver;
pub mod multi_node;

use std::sync::{Mutex, MutexGuard, PoisonError};

use async_trait::async_trait;

use crate::core::{
    Carried, EntryId, InlineQueue, QueueCounts, QueueError, ScheduledTask, Settlement, StoredEntry,
    TaskQueue,
};
use prometheus_parking_lot_actors::scheduler::core::FastMap;

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
    inner: Mutex<Entries<P>>,
    max_parked: Option<usize>,
}

struct Entries<P> {
    /// Parked tasks, each with what it was parked with ([`TaskQueue::park_carrying`]).
    parked: FastMap<EntryId, (ScheduledTask<P>, Carried)>,
    claimed: FastMap<EntryId, ()>,
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
            inner: Mutex::new(Entries {
                parked: FastMap::default(),
                claimed: FastMap::default(),
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

    /// Every update leaves the maps consistent before anything could panic, so a poisoned
    /// lock is taken over as it is.
    fn lock(&self) -> MutexGuard<'_, Entries<P>> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Parks `task` as `entry` with what it carries, unless the entry is held or the queue
    /// is full.
    fn park_with(
        &self,
        entry: EntryId,
        task: ScheduledTask<P>,
        carried: Carried,
    ) -> Result<(), QueueError> {
        let mut entries = self.lock();
        if entries.parked.contains_key(&entry) || entries.claimed.contains_key(&entry) {
            return Err(QueueError::Duplicate(entry));
        }
        if let Some(max) = self.max_parked {
            if entries.parked.len() >= max {
                return Err(QueueError::Full(max));
            }
        }
        entries.parked.insert(entry, (task, carried));
        Ok(())
    }
}

impl<P: Send + 'static> InlineQueue<P> for InMemoryQueue<P> {
    fn park_now(&self, entry: EntryId, task: ScheduledTask<P>) -> Result<(), QueueError> {
        self.park_with(entry, task, Carried::default())
    }

    fn claim_now(&self, entry: EntryId) -> Result<Option<ScheduledTask<P>>, QueueError> {
        let mut entries = self.lock();
        let task = entries.parked.remove(&entry).map(|(task, _)| task);
        if task.is_some() {
            entries.claimed.insert(entry, ());
        }
        Ok(task)
    }

    fn settle_now(&self, entry: EntryId, _settlement: Settlement) -> Result<(), QueueError> {
        match self.lock().claimed.remove(&entry) {
            Some(()) => Ok(()),
            None => Err(QueueError::NotClaimed(entry)),
        }
    }

    fn remove_now(&self, entry: EntryId) -> Result<Option<ScheduledTask<P>>, QueueError> {
        Ok(self.lock().parked.remove(&entry).map(|(task, _)| task))
    }
}

#[async_trait]
impl<P: Send + 'static> TaskQueue<P> for InMemoryQueue<P> {
    fn backend(&self) -> &'static str {
        "in_memory"
    }

    fn is_durable(&self) -> bool {
        false
    }

    fn inline(&self) -> Option<&dyn InlineQueue<P>> {
        Some(self)
    }

    async fn park(&self, entry: EntryId, task: ScheduledTask<P>) -> Result<(), QueueError> {
        self.park_now(entry, task)
    }

    /// Kept beside the task and returned by [`load_parked`](TaskQueue::load_parked), as a
    /// durable queue returns it after a restart.
    async fn park_carrying(
        &self,
        entry: EntryId,
        task: ScheduledTask<P>,
        carried: Carried,
    ) -> Result<(), QueueError> {
        self.park_with(entry, task, carried)
    }

    async fn claim(&self, entry: EntryId) -> Result<Option<ScheduledTask<P>>, QueueError> {
        self.claim_now(entry)
    }

    async fn settle(&self, entry: EntryId, settlement: Settlement) -> Result<(), QueueError> {
        self.settle_now(entry, settlement)
    }

    async fn remove(&self, entry: EntryId) -> Result<Option<ScheduledTask<P>>, QueueError> {
        self.remove_now(entry)
    }

    /// What is parked now: a fresh in-memory queue holds nothing, and claims do not outlive
    /// the process, so there is nothing to park again.
    async fn load_parked(&self) -> Result<Vec<StoredEntry>, QueueError> {
        let entries = self.lock();
        let mut stored: Vec<StoredEntry> = entries
            .parked
            .iter()
            .map(|(&entry, (task, carried))| StoredEntry {
                entry,
                meta: task.meta.clone(),
                carried: *carried,
                held: None,
            })
            .collect();
        stored.sort_unstable_by_key(|stored| stored.entry);
        Ok(stored)
    }

    async fn counts(&self) -> Result<QueueCounts, QueueError> {
        let entries = self.lock();
        Ok(QueueCounts {
            parked: entries.parked.len(),
            claimed: entries.claimed.len(),
        })
    }
}
