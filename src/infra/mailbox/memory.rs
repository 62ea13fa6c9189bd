//! The default mailbox: results in memory, tenant-scoped by exact key, bounded in size.
//!
//! Results may be anything `Send` (a channel receiver for a token stream, say): nothing is
//! cloned or serialized. It needs no I/O, so the pool's scheduler stores into it directly and
//! clients take from it directly ([`InlineMailbox`]).
//!
//! The bound is never enforced by dropping a result: the pool refuses a submission when the
//! results waiting plus the tasks still live would pass it (`PoolError::MailboxFull`), so
//! every admitted task has room for its outcome. Retention (the pool's mailbox actor calls
//! [`Mailbox::purge_stored_before`] periodically) is the only way a result goes uncollected.
//!
//! No lock here can be poisoned into uselessness: results are dropped outside the locks,
//! and a lock a panicking thread held is taken over as it is (every update leaves the maps
//! consistent before anything that could panic runs).

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};

use async_trait::async_trait;
use tokio::sync::Notify;

use crate::core::{Delivery, InlineMailbox, Mailbox, MailboxError};
use crate::util::serde::{MailboxKey, TaskId};
use prometheus_parking_lot_actors::scheduler::core::FastMap;
use prometheus_parking_lot_actors::util::contain;

/// The default bound on stored results plus live tasks.
pub const DEFAULT_MAX_MESSAGES: usize = 100_000;

/// Results in memory. See the module docs.
///
/// ```
/// use prometheus_parking_lot::core::Mailbox;
/// use prometheus_parking_lot::infra::mailbox::memory::InMemoryMailbox;
///
/// let mailbox: Box<dyn Mailbox<String>> = Box::new(InMemoryMailbox::new().with_max_messages(10));
/// assert_eq!(mailbox.backend(), "in_memory");
/// ```
pub struct InMemoryMailbox<R> {
    stored: Mutex<Stored<R>>,
    watchers: Mutex<FastMap<MailboxKey, Weak<Notify>>>,
    /// How many keys have a watcher entry: a store skips the watcher lock when it is 0.
    watched: AtomicUsize,
    max_messages: usize,
}

/// The deliveries under one key, oldest first. Most keys hold one result, which needs no
/// second allocation.
enum Deliveries<R> {
    One(Delivery<R>),
    Many(VecDeque<Delivery<R>>),
}

impl<R> Deliveries<R> {
    fn push(&mut self, delivery: Delivery<R>) {
        match self {
            Deliveries::Many(many) => many.push_back(delivery),
            Deliveries::One(_) => {
                let Deliveries::One(first) =
                    std::mem::replace(self, Deliveries::Many(VecDeque::new()))
                else {
                    unreachable!("matched One above");
                };
                *self = Deliveries::Many(VecDeque::from([first, delivery]));
            }
        }
    }

    fn iter(&self) -> Box<dyn Iterator<Item = &Delivery<R>> + '_> {
        match self {
            Deliveries::One(one) => Box::new(std::iter::once(one)),
            Deliveries::Many(many) => Box::new(many.iter()),
        }
    }
}

struct Stored<R> {
    by_key: FastMap<MailboxKey, Deliveries<R>>,
    len: usize,
}

impl<R> Stored<R> {
    /// Takes the oldest delivery under `key` for which `wanted` holds.
    fn take_where(
        &mut self,
        key: &MailboxKey,
        wanted: impl Fn(&Delivery<R>) -> bool,
    ) -> Option<Delivery<R>> {
        let deliveries = self.by_key.get_mut(key)?;
        let taken = match deliveries {
            Deliveries::One(one) if wanted(one) => match self.by_key.remove(key) {
                Some(Deliveries::One(one)) => Some(one),
                _ => None,
            },
            Deliveries::One(_) => None,
            Deliveries::Many(many) => {
                let at = many.iter().position(&wanted)?;
                let taken = many.remove(at);
                if many.is_empty() {
                    self.by_key.remove(key);
                }
                taken
            }
        };
        if taken.is_some() {
            self.len -= 1;
        }
        taken
    }
}

impl<R> Default for InMemoryMailbox<R> {
    fn default() -> Self {
        Self::new()
    }
}

impl<R> InMemoryMailbox<R> {
    /// An empty mailbox bounded at [`DEFAULT_MAX_MESSAGES`].
    pub fn new() -> Self {
        Self {
            stored: Mutex::new(Stored {
                by_key: FastMap::default(),
                len: 0,
            }),
            watchers: Mutex::new(FastMap::default()),
            watched: AtomicUsize::new(0),
            max_messages: DEFAULT_MAX_MESSAGES,
        }
    }

    /// The same mailbox with another bound (at least 1).
    pub fn with_max_messages(mut self, max_messages: usize) -> Self {
        self.max_messages = max_messages.max(1);
        self
    }

    /// How many keys have a waiter right now. A waiter's entry goes when its last waiter
    /// stops waiting, so this is 0 whenever nobody waits.
    pub fn watched_keys(&self) -> usize {
        self.lock_watchers().len()
    }

    fn lock(&self) -> MutexGuard<'_, Stored<R>> {
        self.stored.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn lock_watchers(&self) -> MutexGuard<'_, FastMap<MailboxKey, Weak<Notify>>> {
        self.watchers.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn wake(&self, key: &MailboxKey) {
        if self.watched.load(Ordering::Acquire) == 0 {
            return;
        }
        // The upgraded handle is dropped before the lock is released: a waiter leaving at the
        // same time must never count it as another waiter, or its entry would stay behind.
        let watchers = self.lock_watchers();
        if let Some(notify) = watchers.get(key).and_then(Weak::upgrade) {
            notify.notify_waiters();
            drop(notify);
        }
    }

    fn insert(&self, key: MailboxKey, delivery: Delivery<R>) {
        {
            let mut stored = self.lock();
            stored.len += 1;
            match stored.by_key.get_mut(&key) {
                Some(deliveries) => deliveries.push(delivery),
                None => {
                    stored.by_key.insert(key.clone(), Deliveries::One(delivery));
                }
            }
        }
        self.wake(&key);
    }
}

/// Drops results one by one, each where a panic in its `Drop` is contained and logged.
///
/// One at a time on purpose: a `Vec` whose elements panic while it drops them aborts the
/// process on the second panic.
fn drop_contained<R>(results: impl IntoIterator<Item = Delivery<R>>) {
    for result in results {
        contain::drop_contained(result);
    }
}

impl<R> Drop for InMemoryMailbox<R> {
    /// Results nobody collected are user values too: a panic in one's `Drop` must not escape
    /// the pool (or whatever owns the mailbox) being dropped.
    fn drop(&mut self) {
        let stored = self
            .stored
            .get_mut()
            .unwrap_or_else(PoisonError::into_inner);
        for (_, deliveries) in stored.by_key.drain() {
            match deliveries {
                Deliveries::One(delivery) => drop_contained([delivery]),
                Deliveries::Many(queue) => drop_contained(queue),
            }
        }
        stored.len = 0;
    }
}

impl<R> InlineMailbox<R> for InMemoryMailbox<R>
where
    R: Send + 'static,
{
    fn store_now(&self, key: &MailboxKey, delivery: Delivery<R>) -> Result<(), MailboxError> {
        self.insert(key.clone(), delivery);
        Ok(())
    }

    fn take_now(&self, key: &MailboxKey) -> Result<Option<Delivery<R>>, MailboxError> {
        Ok(self.lock().take_where(key, |_| true))
    }

    fn take_task_now(
        &self,
        key: &MailboxKey,
        task_id: TaskId,
    ) -> Result<Option<Delivery<R>>, MailboxError> {
        Ok(self
            .lock()
            .take_where(key, |delivery| delivery.task_id == task_id))
    }

    fn holds_now(&self, key: &MailboxKey, task_id: TaskId) -> bool {
        match self.lock().by_key.get(key) {
            Some(Deliveries::One(one)) => one.task_id == task_id,
            Some(Deliveries::Many(queue)) => queue.iter().any(|stored| stored.task_id == task_id),
            None => false,
        }
    }

    fn stored_now(&self) -> usize {
        self.lock().len
    }

    fn max_messages(&self) -> usize {
        self.max_messages
    }
}

#[async_trait]
impl<R> Mailbox<R> for InMemoryMailbox<R>
where
    R: Send + 'static,
{
    fn backend(&self) -> &'static str {
        "in_memory"
    }

    async fn store(&self, key: &MailboxKey, delivery: Delivery<R>) -> Result<(), MailboxError> {
        self.store_now(key, delivery)
    }

    async fn take(&self, key: &MailboxKey) -> Result<Option<Delivery<R>>, MailboxError> {
        self.take_now(key)
    }

    async fn take_task(
        &self,
        key: &MailboxKey,
        task_id: TaskId,
    ) -> Result<Option<Delivery<R>>, MailboxError> {
        self.take_task_now(key, task_id)
    }

    async fn list(&self, key: &MailboxKey) -> Result<Vec<TaskId>, MailboxError> {
        let stored = self.lock();
        Ok(stored
            .by_key
            .get(key)
            .map(|deliveries| deliveries.iter().map(|d| d.task_id).collect())
            .unwrap_or_default())
    }

    /// A full scan: timestamps need not follow store order (a wall clock can step back),
    /// and the retention cleaner runs at most once a second.
    async fn purge_stored_before(&self, cutoff_ms: u64) -> Result<usize, MailboxError> {
        let cutoff_ms = u128::from(cutoff_ms);
        let mut purged = Vec::new();
        {
            let mut stored = self.lock();
            let old: Vec<MailboxKey> = stored
                .by_key
                .iter()
                .filter(|(_, deliveries)| deliveries.iter().any(|d| d.stored_at_ms < cutoff_ms))
                .map(|(key, _)| key.clone())
                .collect();
            for key in old {
                while let Some(delivery) = stored.take_where(&key, |d| d.stored_at_ms < cutoff_ms) {
                    purged.push(delivery);
                }
            }
        }
        let count = purged.len();
        drop_contained(purged);
        Ok(count)
    }

    async fn stored_count(&self) -> Result<usize, MailboxError> {
        Ok(self.stored_now())
    }

    fn subscribe(&self, key: &MailboxKey) -> Arc<Notify> {
        let mut watchers = self.lock_watchers();
        if let Some(notify) = watchers.get(key).and_then(Weak::upgrade) {
            return notify;
        }
        let notify = Arc::new(Notify::new());
        if watchers
            .insert(key.clone(), Arc::downgrade(&notify))
            .is_none()
        {
            self.watched.fetch_add(1, Ordering::Release);
        }
        notify
    }

    fn unsubscribe(&self, key: &MailboxKey) {
        let mut watchers = self.lock_watchers();
        if watchers
            .get(key)
            .is_some_and(|notify| notify.strong_count() == 0)
        {
            watchers.remove(key);
            self.watched.fetch_sub(1, Ordering::Release);
        }
    }

    fn inline(&self) -> Option<&dyn InlineMailbox<R>> {
        Some(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn delivery(task_id: TaskId, stored_at_ms: u64) -> Delivery<String> {
        Delivery {
            task_id,
            outcome: Ok(format!("result {task_id}")),
            stored_at_ms: u128::from(stored_at_ms),
        }
    }

    #[test]
    fn a_full_mailbox_keeps_every_stored_result() {
        let mailbox = InMemoryMailbox::new().with_max_messages(2);
        let key = MailboxKey::new("t");
        for id in 0..5 {
            mailbox.store_now(&key, delivery(id, 0)).unwrap();
        }
        assert_eq!(mailbox.stored_now(), 5);
        let taken: Vec<TaskId> = std::iter::from_fn(|| mailbox.take_now(&key).unwrap())
            .map(|d| d.task_id)
            .collect();
        assert_eq!(taken, vec![0, 1, 2, 3, 4]);
    }

    #[test]
    fn a_watcher_entry_goes_with_its_last_waiter() {
        let mailbox = InMemoryMailbox::<String>::new();
        let key = MailboxKey::new("t");
        let first = mailbox.subscribe(&key);
        let second = mailbox.subscribe(&key);
        drop(first);
        mailbox.unsubscribe(&key);
        assert_eq!(
            mailbox.lock_watchers().len(),
            1,
            "one waiter still holds it"
        );
        drop(second);
        mailbox.unsubscribe(&key);
        assert_eq!(mailbox.lock_watchers().len(), 0);
        assert_eq!(mailbox.watched.load(Ordering::Acquire), 0);
    }
}
