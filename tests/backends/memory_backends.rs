//! The in-memory backends against the conformance suites, plus what only they do: the
//! local queue's bound and what it loads at start, the shared queue's nodes racing for one
//! lot, the mailbox keeping every result past its bound, results that are neither `Clone`
//! nor `Serialize`, and the mailbox's bookkeeping under many takes.

use crate::conformance;

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use conformance::queue::{cpu, task};
use conformance::{mailbox, queue, shared_queue, Job};
use prometheus_parking_lot::core::{
    Capacity, Delivery, EntryId, FitQuery, Mailbox, QueueCounts, QueueError, QueueMaintenance,
    QueueOrder, ScheduledTask, Settlement, SharedQueue, StoredEntry, TaskQueue,
};
use prometheus_parking_lot::infra::mailbox::memory::InMemoryMailbox;
use prometheus_parking_lot::infra::queue::memory::InMemoryQueue;
use prometheus_parking_lot::infra::queue::shared_memory::InMemorySharedQueue;
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
async fn in_memory_shared_queue_in_the_deadline_order_conforms() {
    shared_queue::run_deadline_order(|| async {
        Box::new(InMemorySharedQueue::new().with_order(QueueOrder::Deadline))
            as Box<dyn SharedQueue<Job>>
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_memory_shared_queue_conforms() {
    shared_queue::run_all(|| async {
        Box::new(InMemorySharedQueue::new()) as Box<dyn SharedQueue<Job>>
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_memory_queue_keeps_the_dependencies_contract() {
    conformance::dependencies::run_all(|steps| async move {
        let settings = prometheus_parking_lot::config::WorkerPoolConfig::new()
            .with_name("dependencies")
            .with_worker_count(4)
            .with_max_units(4);
        prometheus_parking_lot::ResourcePool::with_settings(
            settings,
            steps,
            Box::new(InMemoryQueue::new()),
            Arc::new(InMemoryMailbox::new()),
            &prometheus_parking_lot::TokioSpawner,
        )
        .expect("pool starts")
    })
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
    queue.park(11, job(1)).await.expect("first park");
    queue.park(12, job(2)).await.expect("second park");
    assert_eq!(queue.park(13, job(3)).await, Err(QueueError::Full(2)));
    assert_eq!(
        queue.counts().await,
        Ok(QueueCounts {
            parked: 2,
            claimed: 0
        })
    );

    // The bound counts parked tasks only: a claim makes room, and so does a remove.
    assert!(queue.claim(11).await.expect("claim").is_some());
    queue.park(13, job(3)).await.expect("park after a claim");
    assert_eq!(queue.park(14, job(4)).await, Err(QueueError::Full(2)));
    assert!(queue.remove(12).await.expect("remove").is_some());
    queue.park(14, job(4)).await.expect("park after a remove");
    // A duplicate is a duplicate, full or not, parked or claimed.
    assert_eq!(queue.park(13, job(5)).await, Err(QueueError::Duplicate(13)));
    assert_eq!(queue.park(11, job(5)).await, Err(QueueError::Duplicate(11)));
    assert_eq!(
        queue.counts().await,
        Ok(QueueCounts {
            parked: 2,
            claimed: 1
        })
    );
}

/// Claims do not outlive an in-memory queue's process, so there is nothing to park again:
/// `load_parked` is what is parked now, claims left out.
#[tokio::test]
async fn in_memory_load_parked_is_what_is_parked_now() {
    let queue = InMemoryQueue::new();
    for entry in [3, 1, 2] {
        queue.park(entry, job(entry)).await.expect("park");
    }
    assert!(queue.claim(2).await.expect("claim").is_some());

    let stored = |entry: EntryId| StoredEntry {
        entry,
        meta: job(entry).meta,
        carried: Default::default(),
        held: None,
    };
    assert_eq!(queue.load_parked().await, Ok(vec![stored(1), stored(3)]));
    assert!(!queue.is_durable());
}

/// Two pools of one process as two nodes of one shared queue, claiming concurrently: every
/// entry is claimed by exactly one of them, and none is lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_nodes_claim_every_shared_entry_exactly_once() {
    const ENTRIES: u64 = 400;
    let lot = Arc::new(InMemorySharedQueue::new());
    for entry in 0..ENTRIES {
        let parked = cpu(entry, Priority::ALL[entry as usize % 4], entry, 1);
        lot.enqueue(entry, entry, parked).await.expect("enqueue");
    }

    let node = |name: &'static str| {
        let lot = Arc::clone(&lot);
        tokio::spawn(async move {
            let free = FitQuery::within(Capacity::uniform(1));
            let lease = Duration::from_secs(30);
            let mut claimed = Vec::new();
            while let Some(leased) = lot.claim_best_fit(name, &free, lease, 0).await.unwrap() {
                assert_eq!(leased.attempt, 1, "claimed once");
                lot.settle(name, leased.claim(), Settlement::Done)
                    .await
                    .expect("the holder settles");
                claimed.push(leased.entry);
                tokio::task::yield_now().await;
            }
            claimed
        })
    };
    let (a, b) = (node("node-a"), node("node-b"));
    let mut claimed = a.await.expect("node a");
    claimed.extend(b.await.expect("node b"));
    claimed.sort_unstable();
    assert_eq!(claimed, (0..ENTRIES).collect::<Vec<_>>());
    assert_eq!(lot.counts().await, Ok(QueueCounts::default()));
}

fn ok(task_id: TaskId, stored_at_ms: u64) -> Delivery<String> {
    Delivery {
        task_id,
        outcome: Ok(format!("result {task_id}")),
        stored_at_ms: u128::from(stored_at_ms),
    }
}

/// The bound is enforced at admission (`PoolError::MailboxFull`), never by dropping a result:
/// a mailbox past its bound keeps every delivery, under every key.
#[tokio::test]
async fn full_mailbox_keeps_every_delivery_across_keys() {
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
    assert_eq!(mailbox.stored_count().await, Ok(4));
    assert_eq!(mailbox.list(&a).await, Ok(vec![1, 3]));
    assert_eq!(mailbox.list(&b).await, Ok(vec![2]));
    assert_eq!(mailbox.list(&c).await, Ok(vec![4]));

    let taken = mailbox.take_task(&b, 2).await.expect("take_task");
    assert_eq!(taken.map(|d| d.task_id), Some(2));
    mailbox.store(&b, ok(5, 5)).await.expect("store");
    mailbox.store(&b, ok(6, 6)).await.expect("store");
    assert_eq!(mailbox.stored_count().await, Ok(5));
    assert_eq!(mailbox.list(&a).await, Ok(vec![1, 3]));
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

/// A plain model of a mailbox: live deliveries as (key, task id, stored at), in store order.
struct Model {
    live: VecDeque<(usize, TaskId, u64)>,
}

impl Model {
    fn store(&mut self, key: usize, id: TaskId, stored_at: u64) {
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

/// Random stores, takes, targeted takes and purges against the model: exercises stores past
/// the bound (which keep everything), takes from the middle of a key's deliveries, and purges
/// with timestamps both in and out of store order.
#[tokio::test]
async fn many_takes_keep_the_bookkeeping_exact() {
    const STEPS: u64 = 10_000;
    const MAX: usize = 16;
    let mailbox: InMemoryMailbox<TaskId> = InMemoryMailbox::new().with_max_messages(MAX);
    let keys: Vec<MailboxKey> = ["ada", "bob", "eve"]
        .into_iter()
        .map(|user| MailboxKey::new("acme").with_user(user))
        .collect();
    let mut model = Model {
        live: VecDeque::new(),
    };
    let mut seed = 0x2545_f491_4f6c_dd1d_u64;
    let mut next = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };

    let (mut stores, mut takes, mut past_bound, mut purged) = (0, 0, 0, 0);
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
                past_bound += usize::from(model.live.len() >= MAX);
                model.store(k, id, stored_at);
                let delivery = Delivery {
                    task_id: id,
                    outcome: Ok(id),
                    stored_at_ms: u128::from(stored_at),
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
    let exercised = stores > 5_000 && takes > 2_500 && past_bound > 0 && purged > 0;
    assert!(
        exercised,
        "{stores} stores, {takes} takes, {past_bound} stores past the bound, {purged} purged"
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
