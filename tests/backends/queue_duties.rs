//! The maintenance duties of a shared queue's node (`actors/src/queue/duties.rs`), each run
//! on its own against the in-memory shared queue, with the time passed explicitly: no
//! scheduler, no pool, no sleep.

use std::time::Duration;

use prometheus_parking_lot::core::{
    Capacity, DeadLetterReader, EntryId, FitQuery, LeaseRenewer, LeaseRescuer, QueueCounts,
    QueueMaintenance, ScheduledTask, SharedQueue, TaskMetadata,
};
use prometheus_parking_lot::infra::queue::shared_memory::InMemorySharedQueue;
use prometheus_parking_lot::util::serde::{MailboxKey, ResourceCost};

/// Every lease of these tests: one second.
const LEASE: Duration = Duration::from_secs(1);

/// A one-unit CPU task `id` of tenant `acme`, session `id`.
fn task(id: u64) -> ScheduledTask<String> {
    let key = MailboxKey::new("acme").with_session(format!("s{id}"));
    let meta = TaskMetadata::new(id, ResourceCost::cpu(1)).with_mailbox(key);
    ScheduledTask::new(meta, format!("job {id}"))
}

/// A queue holding tasks 1..=`tasks` (entry = id), each parked at its id's time.
async fn parked(queue: InMemorySharedQueue<String>, tasks: u64) -> InMemorySharedQueue<String> {
    for id in 1..=tasks {
        queue.enqueue(id, id, task(id)).await.expect("parked");
    }
    queue
}

/// The entries `node` claims at `now_ms` with room for `room` one-unit tasks.
async fn claim(
    queue: &InMemorySharedQueue<String>,
    node: &str,
    room: u32,
    now_ms: u64,
) -> Vec<EntryId> {
    let free = FitQuery::within(Capacity::uniform(room));
    let leases = queue.claim_batch(node, &free, room as usize, LEASE, now_ms);
    let leases = leases.await.expect("claimed");
    leases.iter().map(|lease| lease.entry).collect()
}

#[tokio::test]
async fn the_renewer_keeps_the_leases_it_renews_and_returns_the_ones_it_lost() {
    let queue = parked(InMemorySharedQueue::new(), 2).await;
    assert_eq!(claim(&queue, "a", 2, 0).await, [1, 2]);
    let renewer = LeaseRenewer::new("a", LEASE);
    assert_eq!(renewer.interval(), LEASE / 3, "a third of the lease");

    // At 500 ms node a renews only entry 2: entry 1 runs out at 1 s and is rescued, entry 2
    // is not.
    assert!(renewer.run_once(&queue, &[2], 500).await.is_empty());
    let rescuer = LeaseRescuer::new(Duration::from_millis(200));
    assert_eq!(rescuer.run_once(&queue, 1_000).await, Ok(1));
    assert_eq!(claim(&queue, "b", 1, 1_000).await, [1], "node b takes it");

    // Node a still renews both: entry 1 is lost to it, entry 2 is renewed until 2.2 s.
    assert_eq!(renewer.run_once(&queue, &[1, 2], 1_200).await, [1]);
    assert_eq!(
        rescuer.run_once(&queue, 2_000).await,
        Ok(1),
        "b's claim only"
    );
    assert_eq!(
        rescuer.run_once(&queue, 2_200).await,
        Ok(1),
        "a's renewed claim"
    );
}

#[tokio::test]
async fn the_rescuer_parks_every_expired_claim_again_and_says_how_many() {
    let queue = parked(InMemorySharedQueue::new(), 3).await;
    assert_eq!(claim(&queue, "a", 2, 0).await, [1, 2]);
    assert_eq!(claim(&queue, "b", 1, 500).await, [3]);
    let rescuer = LeaseRescuer::new(Duration::from_millis(250));
    assert!(rescuer.is_due(0, 250) && !rescuer.is_due(1_000, 1_249));

    assert_eq!(
        rescuer.run_once(&queue, 999).await,
        Ok(0),
        "nothing ran out yet"
    );
    assert_eq!(rescuer.run_once(&queue, 1_000).await, Ok(2), "node a's two");
    let counts = queue.counts().await.expect("counts");
    assert_eq!(
        counts,
        QueueCounts {
            parked: 2,
            claimed: 1
        }
    );
    assert_eq!(claim(&queue, "c", 2, 1_000).await, [1, 2], "at their rank");
    assert_eq!(rescuer.run_once(&queue, 1_500).await, Ok(1), "node b's");
}

#[tokio::test]
async fn the_dead_letter_reader_takes_each_letter_once_a_batch_at_a_time() {
    let queue = parked(InMemorySharedQueue::new().with_max_attempts(2), 3).await;
    let rescuer = LeaseRescuer::new(LEASE);
    let reader = DeadLetterReader::new(LEASE).with_batch(2);
    // First attempt lost: parked again. Second attempt lost: given up.
    assert_eq!(claim(&queue, "a", 3, 0).await, [1, 2, 3]);
    assert_eq!(rescuer.run_once(&queue, 1_000).await, Ok(3));
    assert!(reader.run_once(&queue).await.expect("read").is_empty());
    assert_eq!(claim(&queue, "b", 3, 1_000).await, [1, 2, 3]);
    assert_eq!(rescuer.run_once(&queue, 2_000).await, Ok(3));
    assert_eq!(queue.counts().await, Ok(QueueCounts::default()));

    let first = reader.run_once(&queue).await.expect("read");
    let second = reader.run_once(&queue).await.expect("read");
    assert_eq!(
        (first.len(), second.len()),
        (2, 1),
        "a batch of two, then the rest"
    );
    let letters: Vec<_> = first.into_iter().chain(second).collect();
    let ids: Vec<u64> = letters.iter().map(|letter| letter.task_id).collect();
    assert_eq!(ids, [1, 2, 3]);
    for letter in &letters {
        let session = format!("s{}", letter.task_id);
        assert_eq!(letter.key, MailboxKey::new("acme").with_session(session));
        assert_eq!(letter.cost, ResourceCost::cpu(1));
        assert!(
            letter
                .reason
                .ends_with("the lease of node b ran out (attempt 2)"),
            "{}",
            letter.reason
        );
    }
    assert!(
        reader.run_once(&queue).await.expect("read").is_empty(),
        "once each"
    );
}

#[tokio::test]
async fn a_queue_that_never_gives_up_leaves_the_reader_nothing() {
    let queue = parked(InMemorySharedQueue::new(), 1).await;
    for attempt in 0..5 {
        let now = attempt * 1_000;
        assert_eq!(claim(&queue, "a", 1, now).await, [1]);
        let rescued = LeaseRescuer::new(LEASE).run_once(&queue, now + 1_000).await;
        assert_eq!(rescued, Ok(1));
    }
    let reader = DeadLetterReader::new(LEASE);
    assert_eq!(reader.batch(), DeadLetterReader::DEFAULT_BATCH);
    assert!(reader.run_once(&queue).await.expect("read").is_empty());
    assert_eq!(queue.counts().await.map(|counts| counts.parked), Ok(1));
}
