//! A reused task id meets the earlier task's result on its way to a mailbox that awaits (as a
//! database does): between the task's end and its result's store, neither the scheduler (the
//! task is gone) nor the mailbox (nothing stored yet) holds it. The new submission must still
//! be refused (`ResultPending`), or its caller could take the earlier result. Checked with a
//! mailbox whose writes wait at a gate the test opens (`mailbox_groups::gated_mailbox`).

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use prometheus_parking_lot::core::{
    Mailbox, OnDuplicate, PoolClient, PoolError, PoolLimits, ScheduledTask, SubmitOptions,
    TaskMetadata,
};
use prometheus_parking_lot::util::serde::{MailboxKey, ResourceCost, TaskId};

use crate::mailbox_groups::{gated_mailbox, pool_with, SlowMailbox};

const WAIT: Duration = Duration::from_secs(10);

fn key() -> MailboxKey {
    MailboxKey::new("acme").with_session("gap")
}

fn task(id: TaskId, payload: u64, key: &MailboxKey) -> ScheduledTask<u64> {
    ScheduledTask::new(
        TaskMetadata::new(id, ResourceCost::cpu(1)).with_mailbox(key.clone()),
        payload,
    )
}

/// A pool on a closed gate, with task 5 of [`key`] run and its result waiting at the gate.
async fn pool_with_a_result_at_the_gate() -> (Arc<SlowMailbox>, PoolClient<u64, TaskId>) {
    pool_on_duplicate(OnDuplicate::Refuse).await
}

/// [`pool_with_a_result_at_the_gate`], answering repeated submissions `on_duplicate`.
async fn pool_on_duplicate(
    on_duplicate: OnDuplicate,
) -> (Arc<SlowMailbox>, PoolClient<u64, TaskId>) {
    let mailbox = gated_mailbox();
    let limits = PoolLimits::new(4, 4).with_on_duplicate(on_duplicate);
    let client = pool_with(mailbox.clone(), Vec::new(), limits).await;
    client
        .submit(task(5, 1, &key()), SubmitOptions::default())
        .await
        .expect("admitted");
    let deadline = std::time::Instant::now() + WAIT;
    while client.stats().completed_tasks < 1 {
        assert!(std::time::Instant::now() < deadline, "task 5 ran");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(
        mailbox.inner.list(&key()).await,
        Ok(vec![]),
        "not stored yet"
    );
    (mailbox, client)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reused_id_is_refused_while_the_earlier_result_is_on_its_way() {
    let (mailbox, client) = pool_with_a_result_at_the_gate().await;
    let again = client
        .submit(task(5, 2, &key()), SubmitOptions::default())
        .await;
    assert_eq!(again, Err(PoolError::ResultPending(5)), "alone");
    let batch = client
        .submit_batch(
            vec![task(6, 3, &key()), task(5, 4, &key())],
            SubmitOptions::default(),
        )
        .await;
    assert_eq!(
        batch,
        vec![Ok(key()), Err(PoolError::ResultPending(5))],
        "in a batch, only the reused id"
    );
    let other = MailboxKey::new("acme").with_session("elsewhere");
    assert_eq!(
        client
            .submit(task(5, 5, &other), SubmitOptions::default())
            .await,
        Ok(other.clone()),
        "another key holds no earlier result"
    );

    mailbox.gate.as_ref().expect("gated").add_permits(100);
    assert_eq!(client.retrieve_task(&key(), 5, WAIT).await, Ok(5));
    assert_eq!(client.retrieve_task(&key(), 6, WAIT).await, Ok(6));
    assert_eq!(client.retrieve_task(&other, 5, WAIT).await, Ok(5));
    client
        .submit(task(5, 7, &key()), SubmitOptions::default())
        .await
        .expect("taken: the id is free again");
    assert_eq!(client.retrieve_task(&key(), 5, WAIT).await, Ok(5));
    assert_eq!(
        client.stats().completed_tasks,
        4,
        "tasks 5, 6, 5 elsewhere, 5 again"
    );
    client.shutdown(WAIT).await.expect("shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reused_id_is_refused_when_the_result_lands_while_the_mailbox_is_asked() {
    let (mailbox, client) = pool_with_a_result_at_the_gate().await;
    mailbox.stale_holds.store(true, Ordering::SeqCst);
    let again = client
        .submit(task(5, 2, &key()), SubmitOptions::default())
        .await;
    assert!(
        !mailbox.stale_holds.load(Ordering::SeqCst),
        "the mailbox was asked"
    );
    assert_eq!(
        again,
        Err(PoolError::ResultPending(5)),
        "the mailbox said no result waits, but one landed before the scheduler answered"
    );
    assert_eq!(mailbox.inner.list(&key()).await, Ok(vec![5]));
    mailbox.gate.as_ref().expect("gated").add_permits(100);
    assert_eq!(client.retrieve_task(&key(), 5, WAIT).await, Ok(5));
    assert_eq!(client.stats().completed_tasks, 1, "the reused id never ran");
    client.shutdown(WAIT).await.expect("shutdown");
}

/// With `Attach`, a repeat of a task whose result is on its way gets the key where that result
/// lands, and nothing runs again; once the caller took the result, the same id is a new task
/// that runs and answers (it is not attached to a result already gone).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_attach_a_repeat_meets_the_result_on_its_way_and_a_later_one_runs_again() {
    let (mailbox, client) = pool_on_duplicate(OnDuplicate::Attach).await;
    let again = client
        .submit(task(5, 2, &key()), SubmitOptions::default())
        .await;
    assert_eq!(again, Ok(key()), "attached to the result at the gate");
    mailbox.gate.as_ref().expect("gated").add_permits(100);
    assert_eq!(client.retrieve_task(&key(), 5, WAIT).await, Ok(5));
    assert_eq!(client.stats().completed_tasks, 1, "the repeat ran nothing");

    let later = client
        .submit(task(5, 3, &key()), SubmitOptions::default())
        .await;
    assert_eq!(later, Ok(key()));
    assert_eq!(
        client.retrieve_task(&key(), 5, WAIT).await,
        Ok(5),
        "a new task, run and answered"
    );
    assert_eq!(client.stats().completed_tasks, 2);
    client.shutdown(WAIT).await.expect("shutdown");
}
