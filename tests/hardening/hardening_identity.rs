//! Reliability sweep (issue 7), identity: keys a pool makes up cannot be guessed or
//! pre-filled, two pools never share one, and the order of equal-priority tasks is the
//! scheduler's admission order, whatever `created_at_ms` a caller claims.
//!
//! Every case is bounded in time: a regression fails instead of hanging.

use crate::support;

use std::collections::HashSet;
use std::time::Duration;

use prometheus_parking_lot::core::{PoolError, TaskMetadata};
use prometheus_parking_lot::util::serde::Priority;
use prometheus_parking_lot::MailboxKey;
use support::{eventually, gpu, settings, Job, LabPool};

const WAIT: Duration = Duration::from_secs(10);

/// The keys a caller who knows the pool's name and the task's id might predict.
fn predicted_keys(pool: &str, id: u64) -> Vec<MailboxKey> {
    vec![
        MailboxKey::new("anonymous"),
        MailboxKey::new(format!("anonymous-{id}")),
        MailboxKey::new(format!("anonymous-{:032x}", 0)),
        MailboxKey::new(format!("anonymous-{id:032x}")),
        MailboxKey::new(pool),
        MailboxKey::new(format!("{pool}-{id}")),
        MailboxKey::new(format!("{pool}:{id}")),
        MailboxKey::new(""),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_made_key_cannot_be_predicted_or_pre_filled() {
    let lab = LabPool::new(settings("identity-guess", 1, 4));
    // A hostile caller stores results under every key it can predict, before the victim
    // submits.
    for (index, key) in predicted_keys("identity-guess", 1).into_iter().enumerate() {
        let meta = gpu(100 + index as u64, Priority::Normal, 1).with_mailbox(key);
        lab.pool.submit_async(Job::Quick, meta).await.unwrap();
    }
    eventually("the hostile results are stored", || {
        lab.pool.stats().completed_tasks == 8
    })
    .await;

    let victim = lab
        .pool
        .submit_async(
            Job::Quick,
            TaskMetadata::new(1, gpu(1, Priority::Normal, 1).cost),
        )
        .await
        .unwrap();
    let tenant = &victim.tenant.0;
    let random = tenant
        .strip_prefix("anonymous-")
        .expect("a made-up key is an anonymous tenant");
    assert_eq!(random.len(), 32, "128 random bits in hex: {tenant}");
    assert!(random.chars().all(|c| c.is_ascii_hexdigit()), "{tenant}");
    assert!(!predicted_keys("identity-guess", 1).contains(&victim));
    assert_eq!(
        (victim.user_id.as_deref(), victim.session_id.as_deref()),
        (None, None)
    );

    // The victim gets its own result, not one the hostile caller planted.
    assert_eq!(lab.pool.retrieve_async(&victim, WAIT).await, Ok(1));
    assert_eq!(
        lab.pool.client().try_retrieve(&victim).await,
        Err(PoolError::ResultNotFound),
        "exactly one result was stored under the victim's key"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_pools_with_the_same_name_never_share_a_key() {
    let first = LabPool::new(settings("twin", 1, 4));
    let second = LabPool::new(settings("twin", 1, 4));
    let mut keys = HashSet::new();
    for id in 0..200 {
        for lab in [&first, &second] {
            let key = lab
                .pool
                .submit_async(
                    Job::Quick,
                    TaskMetadata::new(id, gpu(id, Priority::Normal, 1).cost),
                )
                .await
                .unwrap();
            assert!(keys.insert(key), "a made-up key came up twice");
        }
    }
    assert_eq!(keys.len(), 400);
    eventually("both pools ran everything", || {
        first.pool.stats().completed_tasks == 200 && second.pool.stats().completed_tasks == 200
    })
    .await;
    // A key one pool made finds nothing in the other, and exactly one result in its own.
    let mut found = 0;
    for key in &keys {
        let in_first = first.pool.client().try_retrieve(key).await;
        let in_second = second.pool.client().try_retrieve(key).await;
        match (in_first, in_second) {
            (Ok(_), Err(PoolError::ResultNotFound)) | (Err(PoolError::ResultNotFound), Ok(_)) => {
                found += 1;
            }
            other => panic!("key {key:?} answered {other:?}"),
        }
    }
    assert_eq!(found, 400);
}

#[test]
fn anonymous_keys_do_not_repeat() {
    let keys: HashSet<MailboxKey> = (0..100_000).map(|_| MailboxKey::anonymous()).collect();
    assert_eq!(keys.len(), 100_000);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claimed_creation_time_does_not_jump_equal_priority_tasks() {
    let mut lab = LabPool::new(settings("identity-created-at", 1, 1));
    let gate = lab.gated(1);
    lab.pool
        .submit_async(gate, gpu(1, Priority::Normal, 1))
        .await
        .unwrap();
    assert_eq!(lab.next_start().await, 1);
    for id in 2..=4 {
        lab.pool
            .submit_async(Job::Quick, gpu(id, Priority::Normal, 1))
            .await
            .unwrap();
    }
    // Task 5 claims it was created at the epoch; task 6 claims the far future but has a
    // higher priority, which still counts.
    let early = TaskMetadata {
        created_at_ms: 0,
        ..gpu(5, Priority::Normal, 1)
    };
    lab.pool.submit_async(Job::Quick, early).await.unwrap();
    let late = TaskMetadata {
        created_at_ms: u128::MAX,
        ..gpu(6, Priority::High, 1)
    };
    lab.pool.submit_async(Job::Quick, late).await.unwrap();
    eventually("five parked", || lab.pool.stats().queued_tasks == 5).await;

    lab.open(1);
    let mut order = Vec::new();
    for _ in 0..5 {
        order.push(lab.next_start().await);
    }
    assert_eq!(
        order,
        [6, 2, 3, 4, 5],
        "priority first, then admission order"
    );
}
