//! The default mailbox: results in memory, tenant-scoped by exact key, bounded in size.
//!
//! Results may be anything `Send` (a channel receiver for a token stream, say): nothing is
//! cloned or serialized. Retention is enforced by the pool's mailbox actor, which calls
//! [`Mailbox::purge_stored_before`] periodically. The size bound evicts the oldest stored
//! result when a new one would exceed it, with a warning: a result nobody collected is the
//! one to give up, never a new one.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard, Weak};

use async_trait::async_trait;
use tokio::sync::Notify;

use crate::core::{Delivery, Mailbox, MailboxError};
use crate::util::serde::{MailboxKey, TaskId};

/// The default bound on stored results.
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
    watchers: Mutex<HashMap<MailboxKey, Weak<Notify>>>,
    max_messages: usize,
}

struct Stored<R> {
    by_key: HashMap<MailboxKey, VecDeque<(u64, Delivery<R>)>>,
    /// Store order: (sequence, key). Entries whose delivery was taken are skipped lazily and
    /// compacted away when they outnumber the live ones.
    arrivals: VecDeque<(u64, MailboxKey)>,
    next_seq: u64,
    len: usize,
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
                by_key: HashMap::new(),
                arrivals: VecDeque::new(),
                next_seq: 0,
                len: 0,
            }),
            watchers: Mutex::new(HashMap::new()),
            max_messages: DEFAULT_MAX_MESSAGES,
        }
    }

    /// The same mailbox with another bound (at least 1).
    pub fn with_max_messages(mut self, max_messages: usize) -> Self {
        self.max_messages = max_messages.max(1);
        self
    }

    fn lock(&self) -> Result<MutexGuard<'_, Stored<R>>, MailboxError> {
        self.stored
            .lock()
            .map_err(|_| MailboxError::Backend("in-memory mailbox lock poisoned".into()))
    }

    fn wake(&self, key: &MailboxKey) {
        let Ok(mut watchers) = self.watchers.lock() else {
            return;
        };
        match watchers.get(key).map(Weak::upgrade) {
            Some(Some(notify)) => notify.notify_waiters(),
            Some(None) => {
                watchers.remove(key);
            }
            None => {}
        }
    }
}

impl<R> Stored<R> {
    /// Removes the oldest stored delivery (in store order); returns whether there was one.
    fn evict_oldest(&mut self) -> bool {
        while let Some((seq, key)) = self.arrivals.pop_front() {
            let Some(deliveries) = self.by_key.get_mut(&key) else {
                continue;
            };
            if deliveries.front().is_some_and(|(front, _)| *front == seq) {
                deliveries.pop_front();
                if deliveries.is_empty() {
                    self.by_key.remove(&key);
                }
                self.len -= 1;
                return true;
            }
        }
        false
    }

    fn taken(&mut self, key: &MailboxKey) {
        if self.by_key.get(key).is_some_and(VecDeque::is_empty) {
            self.by_key.remove(key);
        }
        self.len -= 1;
        if self.arrivals.len() > 2 * self.len + 64 {
            self.compact();
        }
    }

    /// Rebuilds the arrival order from the live deliveries, dropping taken ones.
    fn compact(&mut self) {
        let mut live: Vec<(u64, MailboxKey)> = self
            .by_key
            .iter()
            .flat_map(|(key, deliveries)| deliveries.iter().map(|(seq, _)| (*seq, key.clone())))
            .collect();
        live.sort_unstable_by_key(|(seq, _)| *seq);
        self.arrivals = live.into();
    }

    /// Drops every delivery stored before `cutoff`. A full scan: timestamps need not follow
    /// store order (a wall clock can step back), and the retention cleaner runs at most once a
    /// second. Returns how many were dropped.
    fn purge_stored_before(&mut self, cutoff: u64) -> usize {
        let before = self.len;
        self.by_key.retain(|_, deliveries| {
            deliveries.retain(|(_, delivery)| delivery.stored_at_ms >= cutoff);
            !deliveries.is_empty()
        });
        self.len = self.by_key.values().map(VecDeque::len).sum();
        if self.len < before {
            self.compact();
        }
        before - self.len
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
        {
            let mut stored = self.lock()?;
            if stored.len >= self.max_messages && stored.evict_oldest() {
                tracing::warn!(
                    max_messages = self.max_messages,
                    "mailbox full: evicted the oldest uncollected result"
                );
            }
            let seq = stored.next_seq;
            stored.next_seq += 1;
            stored.arrivals.push_back((seq, key.clone()));
            stored
                .by_key
                .entry(key.clone())
                .or_default()
                .push_back((seq, delivery));
            stored.len += 1;
        }
        self.wake(key);
        Ok(())
    }

    async fn take(&self, key: &MailboxKey) -> Result<Option<Delivery<R>>, MailboxError> {
        let mut stored = self.lock()?;
        let delivery = stored
            .by_key
            .get_mut(key)
            .and_then(VecDeque::pop_front)
            .map(|(_, delivery)| delivery);
        if delivery.is_some() {
            stored.taken(key);
        }
        Ok(delivery)
    }

    async fn take_task(
        &self,
        key: &MailboxKey,
        task_id: TaskId,
    ) -> Result<Option<Delivery<R>>, MailboxError> {
        let mut stored = self.lock()?;
        let delivery = stored.by_key.get_mut(key).and_then(|deliveries| {
            let at = deliveries.iter().position(|(_, d)| d.task_id == task_id)?;
            deliveries.remove(at).map(|(_, delivery)| delivery)
        });
        if delivery.is_some() {
            stored.taken(key);
        }
        Ok(delivery)
    }

    async fn list(&self, key: &MailboxKey) -> Result<Vec<TaskId>, MailboxError> {
        let stored = self.lock()?;
        Ok(stored
            .by_key
            .get(key)
            .map(|deliveries| deliveries.iter().map(|(_, d)| d.task_id).collect())
            .unwrap_or_default())
    }

    async fn purge_stored_before(&self, cutoff_ms: u64) -> Result<usize, MailboxError> {
        let purged = self.lock()?.purge_stored_before(cutoff_ms);
        if let Ok(mut watchers) = self.watchers.lock() {
            watchers.retain(|_, notify| notify.strong_count() > 0);
        }
        Ok(purged)
    }

    async fn stored_count(&self) -> Result<usize, MailboxError> {
        Ok(self.lock()?.len)
    }

    fn subscribe(&self, key: &MailboxKey) -> Arc<Notify> {
        let Ok(mut watchers) = self.watchers.lock() else {
            return Arc::new(Notify::new());
        };
        if let Some(notify) = watchers.get(key).and_then(Weak::upgrade) {
            return notify;
        }
        let notify = Arc::new(Notify::new());
        watchers.insert(key.clone(), Arc::downgrade(&notify));
        notify
    }
}
