//! The in-memory backends against the shared conformance suites, plus what only they do:
//! the queue's bound, the mailbox's size bound and eviction, results that are neither `Clone`
//! nor `Serialize`, and the mailbox's lazy-deletion bookkeeping under many takes.

mod conformance;

use std::collections::VecDeque;
use std::sync::Arc;

use conformance::queue::task;
use conformance::{mailbox, queue, Job};
use prometheus_parking_lot::core::{
    Delivery, Mailbox, QueueCounts, QueueError, ScheduledTask, TaskQueue,
};
use prometheus_parking_lot::infra::mailbox::memory::InMemoryMailbox;
use prometheus_parking_lot::infra::queue::memory::InMemoryQueue;
use prometheus_parking_lot::util::serde::{MailboxKey, Priority, ResourceKind, TaskId};
use tokio::sync::mpsc;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_memory_queue_conforms() {
    queue::run_all(|| async { Box::new(InMemoryQueue::new()) as Box<dyn TaskQueue<Job>> }).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bounded_in_memory_queue_conforms() {
    // A bound the suite never reaches must not change any behaviour.
    queue::run_all(|| async { Box::new(InMemoryQueue::bounded(64)) as Box<dyn TaskQueue<Job>> })
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_memory_mailbox_conforms() {
    mailbox::run_all(|| async { Arc::new(InMemoryMailbox::new()) as Arc<dyn Mailbox<String>> })
        .await;
}

fn job(id: TaskId) -> ScheduledTask<Job> {
    task(id, Priority::Normal, id, ResourceKind::Cpu, 1, None)
}

#[tokio::test]
async fn bounded_queue_refuses_parks_past_its_bound() {
    let queue = InMemoryQueue::bounded(2);
    queue.park(job(1)).await.expect("first park");
    queue.park(job(2)).await.expect("second park");
    assert_eq!(queue.park(job(3)).await, Err(QueueError::Full(2)));
    assert_eq!(
        queue.counts().await,
        Ok(QueueCounts {
            parked: 2,
            claimed: 0
        })
    );

    // The bound counts parked tasks only: a claim makes room.
    assert!(queue.claim(1).await.expect("claim").is_some());
    queue.park(job(3)).await.expect("park after a claim");
    assert_eq!(queue.park(job(4)).await, Err(QueueError::Full(2)));
    // A duplicate is a duplicate, full or not.
    assert_eq!(queue.park(job(3)).await, Err(QueueError::Duplicate(3)));
}

fn ok(task_id: TaskId, stored_at_ms: u64) -> Delivery<String> {
    Delivery {
        task_id,
        outcome: Ok(format!("result {task_id}")),
        stored_at_ms,
    }
}

#[tokio::test]
async fn full_mailbox_evicts_the_oldest_delivery_across_keys() {
    let mailbox = InMemoryMailbox::new().with_max_messages(3);
    let (a, b, c) = (
        MailboxKey::new("acme").with_user("ada"),
        MailboxKey::new("acme").with_user("bob"),
        MailboxKey::new("globex").with_user("ada"),
    );
    for (key, id) in [(&a, 1), (&b, 2), (&a, 3)] {
        mailbox.store(key, ok(id, id)).await.expect("store");
    }
    mailbox.store(&c, ok(4, 4)).await.expect("fourth store");
    assert_eq!(mailbox.stored_count().await, Ok(3));
    assert_eq!(mailbox.list(&a).await, Ok(vec![3]), "task 1 was the oldest");
    assert_eq!(mailbox.list(&b).await, Ok(vec![2]));
    assert_eq!(mailbox.list(&c).await, Ok(vec![4]));

    // Taken deliveries leave stale entries in the arrival order; eviction must skip them and
    // evict the oldest delivery still stored (task 3), not a stale one.
    let taken = mailbox.take_task(&b, 2).await.expect("take_task");
    assert_eq!(taken.map(|d| d.task_id), Some(2));
    mailbox.store(&b, ok(5, 5)).await.expect("store into room");
    mailbox
        .store(&b, ok(6, 6))
        .await
        .expect("store past the bound");
    assert_eq!(mailbox.stored_count().await, Ok(3));
    assert_eq!(mailbox.list(&a).await, Ok(vec![]));
    assert_eq!(mailbox.list(&b).await, Ok(vec![5, 6]));
    assert_eq!(mailbox.list(&c).await, Ok(vec![4]));
}

#[tokio::test]
async fn results_need_neither_clone_nor_serialize() {
    let mailbox: InMemoryMailbox<mpsc::Receiver<u32>> = InMemoryMailbox::new();
    let key = MailboxKey::new("acme").with_session("stream");
    let (sender, receiver) = mpsc::channel(4);
    let delivery = Delivery {
        task_id: 1,
        outcome: Ok(receiver),
        stored_at_ms: 10,
    };
    mailbox.store(&key, delivery).await.expect("store");

    let taken = mailbox.take(&key).await.expect("take").expect("stored");
    let mut receiver = taken.outcome.expect("a receiver");
    sender.send(7).await.expect("receiver alive");
    sender.send(8).await.expect("receiver alive");
    drop(sender);
    assert_eq!(receiver.recv().await, Some(7));
    assert_eq!(receiver.recv().await, Some(8));
    assert_eq!(receiver.recv().await, None);
}

/// A plain model of a bounded mailbox: live deliveries as (key, task id, stored at), in store
/// order.
struct Model {
    live: VecDeque<(usize, TaskId, u64)>,
    max: usize,
}

impl Model {
    fn store(&mut self, key: usize, id: TaskId, stored_at: u64) {
        if self.live.len() == self.max {
            self.live.pop_front();
        }
        self.live.push_back((key, id, stored_at));
    }

    fn take_where(&mut self, hit: impl Fn(&(usize, TaskId, u64)) -> bool) -> Option<TaskId> {
        let at = self.live.iter().position(hit)?;
        self.live.remove(at).map(|(_, id, _)| id)
    }

    fn list(&self, key: usize) -> Vec<TaskId> {
        let of_key = self.live.iter().filter(|(k, _, _)| *k == key);
        of_key.map(|(_, id, _)| *id).collect()
    }

    fn purge(&mut self, cutoff: u64) -> usize {
        let before = self.live.len();
        self.live.retain(|&(_, _, stored_at)| stored_at >= cutoff);
        before - self.live.len()
    }
}

/// Random stores, takes, targeted takes and purges against the model: exercises eviction,
/// the lazy deletion of taken entries and its compaction, and purges with timestamps both in
/// and out of store order.
#[tokio::test]
async fn many_takes_keep_the_bookkeeping_exact() {
    const STEPS: u64 = 10_000;
    const MAX: usize = 64;
    let mailbox: InMemoryMailbox<TaskId> = InMemoryMailbox::new().with_max_messages(MAX);
    let keys: Vec<MailboxKey> = ["ada", "bob", "eve"]
        .into_iter()
        .map(|user| MailboxKey::new("acme").with_user(user))
        .collect();
    let mut model = Model {
        live: VecDeque::new(),
        max: MAX,
    };
    let mut seed = 0x2545_f491_4f6c_dd1d_u64;
    let mut next = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };

    let (mut stores, mut takes, mut evictions, mut purged) = (0, 0, 0, 0);
    for id in 0..STEPS {
        let k = (next() % 3) as usize;
        let key = &keys[k];
        match next() % 100 {
            0..=59 => {
                // Now and then a timestamp from the past, as after a wall-clock step back.
                let stored_at = match next() % 50 {
                    0 => id.saturating_sub(300),
                    _ => id,
                };
                evictions += usize::from(model.live.len() == MAX);
                model.store(k, id, stored_at);
                let delivery = Delivery {
                    task_id: id,
                    outcome: Ok(id),
                    stored_at_ms: stored_at,
                };
                mailbox.store(key, delivery).await.expect("store");
                stores += 1;
            }
            60..=79 => {
                let expected = model.take_where(|(key, _, _)| *key == k);
                let taken = mailbox.take(key).await.expect("take");
                assert_eq!(taken.map(|d| d.task_id), expected, "take at step {id}");
                takes += usize::from(expected.is_some());
            }
            80..=98 => {
                let listed = model.list(k);
                let wanted = match listed.len() {
                    0 => id,
                    n => listed[(next() as usize) % n],
                };
                let expected = model.take_where(|&(key, task, _)| key == k && task == wanted);
                let taken = mailbox.take_task(key, wanted).await.expect("take_task");
                assert_eq!(taken.map(|d| d.task_id), expected, "take_task at step {id}");
                takes += usize::from(expected.is_some());
            }
            _ => {
                let cutoff = id.saturating_sub(150);
                let expected = model.purge(cutoff);
                let count = mailbox.purge_stored_before(cutoff).await;
                assert_eq!(count, Ok(expected), "purge at step {id}");
                purged += expected;
            }
        }
        let count = mailbox.stored_count().await.expect("stored_count");
        assert_eq!(count, model.live.len(), "stored_count at step {id}");
        if id % 500 == 0 {
            for (k, key) in keys.iter().enumerate() {
                assert_eq!(
                    mailbox.list(key).await,
                    Ok(model.list(k)),
                    "list at step {id}"
                );
            }
        }
    }
    let exercised = stores > 5_000 && takes > 2_500 && evictions > 0 && purged > 0;
    assert!(
        exercised,
        "{stores} stores, {takes} takes, {evictions} evictions, {purged} purged"
    );

    for (k, key) in keys.iter().enumerate() {
        for expected in model.list(k) {
            let taken = mailbox.take(key).await.expect("take").map(|d| d.task_id);
            assert_eq!(taken, Some(expected));
        }
        assert!(mailbox.take(key).await.expect("take").is_none());
    }
    assert_eq!(mailbox.stored_count().await, Ok(0));
}
