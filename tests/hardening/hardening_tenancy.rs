//! Reliability sweep (issue 7), tenancy: task ids are scoped by tenant. One tenant can neither
//! cancel another's task, nor learn which ids another uses, nor block an id another wants.
//!
//! Every case is bounded in time: a regression fails instead of hanging.

use crate::support;

use std::time::Duration;

use prometheus_parking_lot::core::{PoolError, TaskMetadata};
use prometheus_parking_lot::util::serde::Priority;
use prometheus_parking_lot::MailboxKey;
use support::{eventually, gpu, settings, Job, LabPool};

const WAIT: Duration = Duration::from_secs(10);

/// Metadata for a one-unit task of `tenant`.
fn owned(id: u64, key: &MailboxKey) -> TaskMetadata {
    gpu(id, Priority::Normal, 1).with_mailbox(key.clone())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_cannot_cancel_another_tenants_running_or_parked_task() {
    let mut lab = LabPool::new(settings("tenancy-cancel", 1, 1));
    let alice = MailboxKey::new("alice");
    let mallory = MailboxKey::new("mallory");
    let running = lab.gated(1);
    lab.pool
        .submit_async(running, owned(1, &alice))
        .await
        .unwrap();
    assert_eq!(lab.next_start().await, 1);
    lab.pool
        .submit_async(Job::Quick, owned(2, &alice))
        .await
        .unwrap();
    eventually("task 2 parks", || lab.pool.stats().queued_tasks == 1).await;

    // The other tenant, the right tenant with another user, and a near-miss tenant all fail
    // the same way a made-up id does: nothing says the id is live elsewhere.
    let near_misses = [
        mallory.clone(),
        MailboxKey::new("alice").with_user("someone"),
        MailboxKey::new("alice "),
        MailboxKey::new("Alice"),
    ];
    for key in &near_misses {
        for id in [1, 2] {
            assert_eq!(
                lab.pool.cancel(key, id).await,
                Err(PoolError::TaskNotFound(id)),
                "{key:?} cancelled alice's task {id}"
            );
        }
    }
    assert_eq!(
        lab.pool.cancel(&mallory, 99).await,
        Err(PoolError::TaskNotFound(99))
    );
    let stats = lab.pool.stats();
    assert_eq!((stats.active_tasks, stats.queued_tasks), (1, 1));

    // Alice's tasks run to their results.
    lab.open(1);
    assert_eq!(lab.next_start().await, 2);
    assert_eq!(lab.pool.retrieve_task(&alice, 1, WAIT).await, Ok(1));
    assert_eq!(lab.pool.retrieve_task(&alice, 2, WAIT).await, Ok(2));
    assert_eq!(lab.pool.stats().failed_tasks, 0);

    // The owner can cancel with the key it submitted under.
    let gate = lab.gated(3);
    lab.pool.submit_async(gate, owned(3, &alice)).await.unwrap();
    assert_eq!(lab.next_start().await, 3);
    assert_eq!(lab.pool.cancel(&alice, 3).await, Ok(()));
    assert_eq!(
        lab.pool.retrieve_async(&alice, WAIT).await,
        Err(PoolError::Cancelled)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ids_in_use_by_one_tenant_are_neither_revealed_to_nor_blocked_for_another() {
    let mut lab = LabPool::new(settings("tenancy-ids", 1, 1));
    let alice = MailboxKey::new("alice");
    let bob = MailboxKey::new("bob");
    let gate = lab.gated(7);
    lab.pool.submit_async(gate, owned(7, &alice)).await.unwrap();
    assert_eq!(lab.next_start().await, 7);

    // Bob may use id 7 while alice's task 7 runs: his is parked behind it, not refused.
    lab.pool
        .submit_async(Job::Quick, owned(7, &bob))
        .await
        .expect("another tenant's live id does not block this one");
    // Alice reusing her own live id is refused, naming only her id.
    assert_eq!(
        lab.pool.submit_async(Job::Quick, owned(7, &alice)).await,
        Err(PoolError::DuplicateTask(7))
    );
    // Bob reusing his own parked id is refused too: ids are unique per tenant.
    assert_eq!(
        lab.pool.submit_async(Job::Quick, owned(7, &bob)).await,
        Err(PoolError::DuplicateTask(7))
    );

    lab.open(7);
    assert_eq!(lab.next_start().await, 7, "bob's task 7 ran");
    assert_eq!(lab.pool.retrieve_async(&alice, WAIT).await, Ok(7));
    assert_eq!(lab.pool.retrieve_async(&bob, WAIT).await, Ok(7));
    assert_eq!(lab.pool.stats().completed_tasks, 2);

    // An id is free again once its task ended.
    lab.pool
        .submit_async(Job::Quick, owned(7, &alice))
        .await
        .expect("an ended task's id can be used again");
    assert_eq!(lab.pool.retrieve_async(&alice, WAIT).await, Ok(7));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_cannot_take_another_tenants_result() {
    let lab = LabPool::new(settings("tenancy-results", 1, 1));
    let alice = MailboxKey::new("alice").with_session("s1");
    lab.pool
        .submit_async(Job::Quick, owned(1, &alice))
        .await
        .unwrap();
    eventually("task 1 ends", || lab.pool.stats().completed_tasks == 1).await;
    for thief in [
        MailboxKey::new("alice"),
        MailboxKey::new("alice").with_session("s2"),
        MailboxKey::new("mallory").with_session("s1"),
    ] {
        assert_eq!(
            lab.pool.client().try_retrieve(&thief).await,
            Err(PoolError::ResultNotFound),
            "{thief:?} took alice's result"
        );
    }
    assert_eq!(lab.pool.retrieve_async(&alice, WAIT).await, Ok(1));
}
