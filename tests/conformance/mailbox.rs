//! The [`Mailbox`] conformance suite: storing, taking, listing, tenant isolation, retention
//! and wake-ups, checked with exact values and orders.
//!
//! Each case takes an empty mailbox of `String` results and tests one behaviour; [`run_all`]
//! runs every case, each against a fresh mailbox from the backend's factory. The factory
//! returns an `Arc` because the wake-up cases store from a separately spawned task.

use std::future::Future;
use std::pin::pin;
use std::sync::Arc;
use std::time::Duration;

use prometheus_parking_lot::core::{
    BackendError, BackendFault, Delivery, FaultKind, Mailbox, PoolError, TaskFailure, TaskStatus,
};
use prometheus_parking_lot::util::serde::{MailboxKey, TaskId};
use tokio::time::timeout;

use super::EPOCH_MS;

/// How long a woken waiter may take to notice.
const WAKE_TIMEOUT: Duration = Duration::from_secs(2);
/// How long a waiter that must not be woken is watched.
const QUIET_PERIOD: Duration = Duration::from_millis(50);

/// Runs every case of the suite, each against a fresh mailbox from `fresh`, printing the
/// case's name first so a failure names it.
pub async fn run_all<F, Fut>(fresh: F)
where
    F: Fn() -> Fut,
    Fut: Future<Output = Arc<dyn Mailbox<String>>>,
{
    macro_rules! run {
        ($($case:ident),* $(,)?) => {$(
            let mailbox = fresh().await;
            eprintln!("mailbox conformance [{}]: {}", mailbox.backend(), stringify!($case));
            $case(mailbox).await;
        )*};
    }
    run!(
        take_returns_deliveries_oldest_first,
        error_outcomes_round_trip,
        take_task_takes_exactly_that_task,
        list_is_oldest_first_and_not_consuming,
        tenants_are_isolated,
        users_and_sessions_are_separate_inboxes,
        purge_removes_exactly_the_deliveries_stored_before_the_cutoff,
        purge_goes_by_stored_at_not_by_store_order,
        subscribe_wakes_a_waiter_on_store,
        subscribe_is_not_woken_by_other_keys,
        a_group_store_keeps_its_order_and_wakes_every_key,
        concurrent_takes_each_get_their_own_task_once,
        concurrent_holds_questions_each_get_their_own_answers,
        a_take_whose_caller_leaves_loses_no_result,
        backend_is_named,
    );
}

// ---------------------------------------------------------------------------------------------
// Building blocks
// ---------------------------------------------------------------------------------------------

/// A fully narrowed key.
pub fn key(tenant: &str, user: &str, session: &str) -> MailboxKey {
    MailboxKey::new(tenant)
        .with_user(user)
        .with_session(session)
}

/// The delivery of task `task_id` with `outcome`, stored `stored` ms after [`EPOCH_MS`].
pub fn delivery(
    task_id: TaskId,
    outcome: Result<String, TaskFailure>,
    stored: u64,
) -> Delivery<String> {
    Delivery {
        task_id,
        outcome,
        stored_at_ms: u128::from(EPOCH_MS + stored),
    }
}

/// A successful delivery whose result names the task.
pub fn ok(task_id: TaskId, stored: u64) -> Delivery<String> {
    delivery(task_id, Ok(format!("result of {task_id} ✓")), stored)
}

/// A delivery as comparable data (`Delivery` itself is not `PartialEq`).
type Seen = (TaskId, Result<String, TaskFailure>, u128);

fn seen(delivery: &Delivery<String>) -> Seen {
    (
        delivery.task_id,
        delivery.outcome.clone(),
        delivery.stored_at_ms,
    )
}

async fn store(mailbox: &dyn Mailbox<String>, key: &MailboxKey, delivery: Delivery<String>) {
    let task_id = delivery.task_id;
    if let Err(error) = mailbox.store(key, delivery).await {
        panic!("storing task {task_id} failed: {error}");
    }
}

async fn take(mailbox: &dyn Mailbox<String>, key: &MailboxKey) -> Option<Seen> {
    mailbox.take(key).await.expect("take").as_ref().map(seen)
}

async fn take_task(mailbox: &dyn Mailbox<String>, key: &MailboxKey, id: TaskId) -> Option<Seen> {
    let taken = mailbox.take_task(key, id).await.expect("take_task");
    taken.as_ref().map(seen)
}

async fn list(mailbox: &dyn Mailbox<String>, key: &MailboxKey) -> Vec<TaskId> {
    mailbox.list(key).await.expect("list")
}

async fn assert_stored(mailbox: &dyn Mailbox<String>, expected: usize, step: &str) {
    let count = mailbox.stored_count().await.expect("stored_count");
    assert_eq!(count, expected, "stored_count after {step}");
}

/// Stores `delivery` under `key` from a separately spawned task.
async fn store_elsewhere(
    mailbox: &Arc<dyn Mailbox<String>>,
    key: &MailboxKey,
    delivery: Delivery<String>,
) {
    let (mailbox, key) = (Arc::clone(mailbox), key.clone());
    let stored = tokio::spawn(async move { mailbox.store(&key, delivery).await });
    stored.await.expect("storing task panicked").expect("store");
}

// ---------------------------------------------------------------------------------------------
// Cases
// ---------------------------------------------------------------------------------------------

/// `take` returns each delivery whole, oldest first, and `None` once the key is empty.
pub async fn take_returns_deliveries_oldest_first(mailbox: Arc<dyn Mailbox<String>>) {
    let mailbox = &*mailbox;
    let inbox = key("acme", "ada", "s1");
    assert_eq!(take(mailbox, &inbox).await, None, "empty key");
    assert_stored(mailbox, 0, "nothing").await;

    for (id, stored) in [(3, 100), (1, 200), (2, 300)] {
        store(mailbox, &inbox, ok(id, stored)).await;
    }
    assert_stored(mailbox, 3, "three stores").await;
    for (left, (id, stored)) in [(2, (3, 100)), (1, (1, 200)), (0, (2, 300))] {
        assert_eq!(take(mailbox, &inbox).await, Some(seen(&ok(id, stored))));
        assert_stored(mailbox, left, "take").await;
    }
    assert_eq!(take(mailbox, &inbox).await, None, "emptied key");
}

/// Error outcomes come back as stored and map to their terminal statuses.
pub async fn error_outcomes_round_trip(mailbox: Arc<dyn Mailbox<String>>) {
    let mailbox = &*mailbox;
    let inbox = key("acme", "ada", "s1");
    let lost = |error| Err(TaskFailure::Lost(Box::new(error)));
    let database_away = PoolError::from(BackendError::new(
        "chat",
        "postgres queue",
        "store a started task",
        BackendFault::plain(FaultKind::Unreachable, "the server refused the connection"),
    ));
    let cases: [(Result<String, TaskFailure>, TaskStatus); 8] = [
        (Ok("fine".into()), TaskStatus::Completed),
        (Err(TaskFailure::TimedOut), TaskStatus::TimedOut),
        (
            Err(TaskFailure::Failed("boom".into())),
            TaskStatus::Failed("boom".into()),
        ),
        (Err(TaskFailure::Cancelled), TaskStatus::Cancelled),
        (Err(TaskFailure::Expired), TaskStatus::Expired),
        (lost(PoolError::Shutdown), TaskStatus::Cancelled),
        (
            lost(PoolError::QueueFull),
            TaskStatus::Rejected(PoolError::QueueFull.to_string()),
        ),
        (
            lost(database_away.clone()),
            TaskStatus::Failed(database_away.to_string()),
        ),
    ];
    for (id, (outcome, _)) in (1..).zip(&cases) {
        store(mailbox, &inbox, delivery(id, outcome.clone(), id)).await;
    }
    for (id, (outcome, status)) in (1..).zip(cases) {
        let taken = mailbox.take(&inbox).await.expect("take").expect("stored");
        assert_eq!(seen(&taken), (id, outcome, u128::from(EPOCH_MS + id)));
        assert_eq!(taken.status(), status, "status of task {id}");
    }
    assert_stored(mailbox, 0, "taking everything").await;
}

/// A take whose caller stops waiting at any moment (before its statement, while it runs, as
/// its answer comes back) loses no result: whatever it would have taken is there for the
/// next take, in its place among the key's results. Both takes are tried with the caller
/// leaving after 0 to 3 ms, in steps of 100 µs, so a database's statement is caught at
/// every stage.
pub async fn a_take_whose_caller_leaves_loses_no_result(mailbox: Arc<dyn Mailbox<String>>) {
    let mailbox = mailbox.as_ref();
    let inbox = key("acme", "ada", "leaving");
    for step in 0..30u64 {
        let patience = Duration::from_micros(step * 100);
        let (first, second) = (2 * step, 2 * step + 1);
        store(mailbox, &inbox, ok(first, first)).await;
        store(mailbox, &inbox, ok(second, second)).await;
        let by_task = timeout(patience, mailbox.take_task(&inbox, first)).await;
        let by_key = timeout(patience, mailbox.take(&inbox)).await;
        // What each take answered before its caller left is the caller's; the rest stays.
        let mut expected: Vec<TaskId> = vec![first, second];
        for answered in [by_task, by_key].into_iter().flatten() {
            let taken = answered.expect("take").expect("stored");
            expected.retain(|&id| id != taken.task_id);
        }
        // A take still under way when its caller left may put its row back a moment later.
        for id in expected {
            let deadline = tokio::time::Instant::now() + WAKE_TIMEOUT;
            let mut taken = take_task(mailbox, &inbox, id).await;
            while taken.is_none() && tokio::time::Instant::now() < deadline {
                tokio::time::sleep(Duration::from_millis(5)).await;
                taken = take_task(mailbox, &inbox, id).await;
            }
            assert_eq!(
                taken,
                Some(seen(&ok(id, id))),
                "task {id}'s result after takes that left at {patience:?}"
            );
        }
        assert_eq!(list(mailbox, &inbox).await, Vec::<TaskId>::new());
    }
    assert_stored(mailbox, 0, "every result taken").await;
}

/// `take_task` takes exactly the named task and leaves the others in order.
pub async fn take_task_takes_exactly_that_task(mailbox: Arc<dyn Mailbox<String>>) {
    let mailbox = &*mailbox;
    let inbox = key("acme", "ada", "s1");
    for id in 1..=4 {
        store(mailbox, &inbox, ok(id, id * 10)).await;
    }
    assert_eq!(take_task(mailbox, &inbox, 3).await, Some(seen(&ok(3, 30))));
    assert_stored(mailbox, 3, "take_task").await;
    assert_eq!(take_task(mailbox, &inbox, 3).await, None, "taken twice");
    assert_eq!(take_task(mailbox, &inbox, 404).await, None, "unknown task");
    assert_eq!(list(mailbox, &inbox).await, [1, 2, 4]);
    for id in [1, 2, 4] {
        assert_eq!(take(mailbox, &inbox).await, Some(seen(&ok(id, id * 10))));
    }
    assert_eq!(take_task(mailbox, &key("acme", "ada", "s9"), 1).await, None);
    assert_stored(mailbox, 0, "taking everything").await;
}

/// `store_many` stores a group as `store` stores each, in order: `take` then returns each
/// key's deliveries in the group's order, and a waiter on every key in the group is woken.
pub async fn a_group_store_keeps_its_order_and_wakes_every_key(mailbox: Arc<dyn Mailbox<String>>) {
    let (ada, bob) = (key("acme", "ada", "s1"), key("acme", "bob", "s1"));
    let waiting = [mailbox.subscribe(&ada), mailbox.subscribe(&bob)];
    let woken: Vec<_> = waiting.iter().map(|notify| notify.notified()).collect();
    let mut woken: Vec<_> = woken.into_iter().map(Box::pin).collect();
    for notified in &mut woken {
        notified.as_mut().enable();
    }
    let group = vec![
        (ada.clone(), ok(3, 30)),
        (bob.clone(), ok(1, 10)),
        (ada.clone(), ok(1, 10)),
        (ada.clone(), delivery(2, Err(TaskFailure::TimedOut), 20)),
    ];
    let stored = mailbox.store_many(group).await;
    assert_eq!(stored, vec![Ok(()), Ok(()), Ok(()), Ok(())]);
    assert_eq!(mailbox.store_many(Vec::new()).await, Vec::new());
    for notified in woken {
        tokio::time::timeout(WAKE_TIMEOUT, notified)
            .await
            .expect("a group store wakes the waiters of every key in it");
    }
    let mailbox = &*mailbox;
    assert_stored(mailbox, 4, "a group store").await;
    assert_eq!(list(mailbox, &ada).await, [3, 1, 2]);
    assert_eq!(take(mailbox, &ada).await, Some(seen(&ok(3, 30))));
    assert_eq!(take(mailbox, &ada).await, Some(seen(&ok(1, 10))));
    let timed_out = delivery(2, Err(TaskFailure::TimedOut), 20);
    assert_eq!(take(mailbox, &ada).await, Some(seen(&timed_out)));
    assert_eq!(take(mailbox, &bob).await, Some(seen(&ok(1, 10))));
    assert_stored(mailbox, 0, "taking the group").await;
}

/// Many callers taking at once (a backend may answer them together) each get exactly their
/// own task's delivery, and a delivery two callers race for goes to one of them only.
pub async fn concurrent_takes_each_get_their_own_task_once(mailbox: Arc<dyn Mailbox<String>>) {
    let sessions: Vec<MailboxKey> = (0..8)
        .map(|session| key("acme", "ada", &format!("s{session}")))
        .collect();
    for id in 1..=64u64 {
        let inbox = &sessions[(id % 8) as usize];
        store(&*mailbox, inbox, ok(id, id)).await;
    }
    // Everyone's task once, and task 5 of session 5 a second time: one of the two wins.
    let mut asked: Vec<(MailboxKey, TaskId)> = (1..=64u64)
        .map(|id| (sessions[(id % 8) as usize].clone(), id))
        .collect();
    asked.push((sessions[5].clone(), 5));
    // The same task id under the wrong session is nobody's.
    asked.push((sessions[0].clone(), 9));
    let takes = asked.iter().cloned().map(|(inbox, id)| {
        let mailbox = Arc::clone(&mailbox);
        tokio::spawn(async move { (id, mailbox.take_task(&inbox, id).await.expect("take")) })
    });
    let mut got_five = 0;
    for (n, take) in takes.enumerate() {
        let (id, taken) = take.await.expect("a taker");
        match (n, taken) {
            (65, taken) => assert!(taken.is_none(), "task 9 is not session 0's"),
            (_, Some(taken)) if id == 5 => {
                assert_eq!(seen(&taken), seen(&ok(5, 5)));
                got_five += 1;
            }
            (_, Some(taken)) => assert_eq!(seen(&taken), seen(&ok(id, id)), "task {id}"),
            (_, None) => assert_eq!(id, 5, "only the raced task may come back empty"),
        }
    }
    assert_eq!(got_five, 1, "the raced delivery goes to exactly one taker");
    assert_stored(&*mailbox, 0, "every take").await;
}

/// `holds` answers, for each (key, task) it is asked about, whether that task's delivery
/// waits under exactly that key; questions asked at once (a backend may answer them in one
/// statement) each get their own answers, in their own order, and nothing is taken.
pub async fn concurrent_holds_questions_each_get_their_own_answers(
    mailbox: Arc<dyn Mailbox<String>>,
) {
    let sessions: Vec<MailboxKey> = (0..4)
        .map(|session| key("acme", "ada", &format!("s{session}")))
        .collect();
    // Even tasks wait, each under session id % 4.
    for id in (2..=40u64).step_by(2) {
        store(&*mailbox, &sessions[(id % 4) as usize], ok(id, id)).await;
    }
    let expected = |inbox: usize, id: TaskId| id.is_multiple_of(2) && (id % 4) as usize == inbox;
    // 40 single questions, half of them about a task under the wrong session, and one
    // question about several tasks at once.
    let mut asked: Vec<Vec<(MailboxKey, TaskId)>> = (1..=40u64)
        .map(|id| vec![(sessions[((id + id / 20) % 4) as usize].clone(), id)])
        .collect();
    asked.push(
        (1..=8u64)
            .map(|id| (sessions[(id % 4) as usize].clone(), id))
            .collect(),
    );
    let questions = asked.iter().cloned().map(|wanted| {
        let mailbox = Arc::clone(&mailbox);
        tokio::spawn(async move { mailbox.holds(&wanted).await.expect("holds") })
    });
    for (question, answer) in asked.iter().zip(questions) {
        let answer = answer.await.expect("an asker");
        let wanted: Vec<bool> = question
            .iter()
            .map(|(inbox, id)| {
                let inbox = sessions.iter().position(|s| s == inbox).expect("a session");
                expected(inbox, *id)
            })
            .collect();
        assert_eq!(answer, wanted, "the answers to {question:?}");
    }
    assert_stored(&*mailbox, 20, "nothing taken").await;
}

/// `list` names the waiting tasks oldest first and takes nothing.
pub async fn list_is_oldest_first_and_not_consuming(mailbox: Arc<dyn Mailbox<String>>) {
    let mailbox = &*mailbox;
    let inbox = key("acme", "ada", "s1");
    assert_eq!(list(mailbox, &inbox).await, Vec::<TaskId>::new());
    for id in [9, 4, 7] {
        store(mailbox, &inbox, ok(id, 100)).await;
    }
    assert_eq!(list(mailbox, &inbox).await, [9, 4, 7]);
    assert_eq!(list(mailbox, &inbox).await, [9, 4, 7], "listing again");
    assert_stored(mailbox, 3, "listing").await;
    assert_eq!(take(mailbox, &inbox).await, Some(seen(&ok(9, 100))));
    assert_eq!(list(mailbox, &inbox).await, [4, 7]);
}

/// Two tenants with the same user and session never see each other's deliveries, even for
/// the same task id.
pub async fn tenants_are_isolated(mailbox: Arc<dyn Mailbox<String>>) {
    let mailbox = &*mailbox;
    let acme = key("acme", "ada", "s1");
    let globex = key("globex", "ada", "s1");
    let acme_one = || delivery(1, Ok("acme's".into()), 10);
    let globex_one = || delivery(1, Ok("globex's".into()), 20);
    store(mailbox, &acme, ok(2, 5)).await;
    store(mailbox, &acme, acme_one()).await;
    store(mailbox, &globex, globex_one()).await;

    assert_eq!(list(mailbox, &acme).await, [2, 1]);
    assert_eq!(list(mailbox, &globex).await, [1]);
    assert_eq!(take_task(mailbox, &globex, 2).await, None, "acme's task 2");
    assert_eq!(
        take_task(mailbox, &globex, 1).await,
        Some(seen(&globex_one()))
    );
    assert_eq!(take(mailbox, &globex).await, None);
    assert_eq!(list(mailbox, &acme).await, [2, 1], "acme untouched");
    assert_eq!(take_task(mailbox, &acme, 1).await, Some(seen(&acme_one())));
    assert_eq!(take(mailbox, &acme).await, Some(seen(&ok(2, 5))));
    assert_stored(mailbox, 0, "taking everything").await;
}

/// Keys that differ only in user or session, or that leave them out, are different inboxes.
pub async fn users_and_sessions_are_separate_inboxes(mailbox: Arc<dyn Mailbox<String>>) {
    let mailbox = &*mailbox;
    let mine = key("acme", "ada", "s1");
    let others = [
        key("acme", "bob", "s1"),
        key("acme", "ada", "s2"),
        MailboxKey::new("acme").with_user("ada"),
        MailboxKey::new("acme"),
    ];
    store(mailbox, &mine, ok(1, 10)).await;
    for (id, other) in (2..).zip(&others) {
        assert_eq!(
            list(mailbox, other).await,
            Vec::<TaskId>::new(),
            "{other:?}"
        );
        assert_eq!(take_task(mailbox, other, 1).await, None, "{other:?}");
        assert_eq!(take(mailbox, other).await, None, "{other:?}");
        store(mailbox, other, ok(id, 10)).await;
    }
    assert_eq!(list(mailbox, &mine).await, [1]);
    for (id, other) in (2..).zip(&others) {
        assert_eq!(list(mailbox, other).await, [id], "{other:?}");
    }
    assert_stored(mailbox, 5, "five inboxes").await;
}

/// `purge_stored_before(cutoff)` drops exactly the deliveries stored before `cutoff`, across
/// keys, and counts them.
pub async fn purge_removes_exactly_the_deliveries_stored_before_the_cutoff(
    mailbox: Arc<dyn Mailbox<String>>,
) {
    let mailbox = &*mailbox;
    let (a, b) = (key("acme", "ada", "s1"), key("globex", "bob", "s2"));
    for (inbox, id, stored) in [(&a, 1, 100), (&b, 2, 200), (&a, 3, 300), (&b, 4, 400)] {
        store(mailbox, inbox, ok(id, stored)).await;
    }
    let purge = |cutoff| mailbox.purge_stored_before(EPOCH_MS + cutoff);

    assert_eq!(purge(100).await, Ok(0), "stored at the cutoff stays");
    assert_eq!(purge(201).await, Ok(2));
    assert_stored(mailbox, 2, "purge").await;
    assert_eq!(list(mailbox, &a).await, [3]);
    assert_eq!(list(mailbox, &b).await, [4]);
    assert_eq!(purge(201).await, Ok(0), "purged once");
    assert_eq!(purge(400).await, Ok(1));
    assert_eq!(take(mailbox, &b).await, Some(seen(&ok(4, 400))));
    assert_eq!(take(mailbox, &a).await, None);
    assert_stored(mailbox, 0, "emptied").await;
}

/// Retention goes by `stored_at_ms`, even when deliveries were not stored in that order (a
/// wall clock stepped back, or a caller storing older results late).
pub async fn purge_goes_by_stored_at_not_by_store_order(mailbox: Arc<dyn Mailbox<String>>) {
    let mailbox = &*mailbox;
    let inbox = key("acme", "ada", "s1");
    for (id, stored) in [(1, 500), (2, 100), (3, 300), (4, 50)] {
        store(mailbox, &inbox, ok(id, stored)).await;
    }
    assert_eq!(mailbox.purge_stored_before(EPOCH_MS + 300).await, Ok(2));
    assert_eq!(list(mailbox, &inbox).await, [1, 3]);
    assert_stored(mailbox, 2, "purge").await;
    store(mailbox, &inbox, ok(5, 200)).await;
    assert_eq!(mailbox.purge_stored_before(EPOCH_MS + 400).await, Ok(2));
    assert_eq!(list(mailbox, &inbox).await, [1]);
    assert_stored(mailbox, 1, "second purge").await;
}

/// A waiter that enabled `notified()` before a store under its key, from another task, is
/// woken, and the delivery is there to take.
pub async fn subscribe_wakes_a_waiter_on_store(mailbox: Arc<dyn Mailbox<String>>) {
    let inbox = key("acme", "ada", "s1");
    let notify = mailbox.subscribe(&inbox);
    let mut notified = pin!(notify.notified());
    notified.as_mut().enable();

    store_elsewhere(&mailbox, &inbox, ok(1, 10)).await;
    let woken = timeout(WAKE_TIMEOUT, notified).await;
    assert!(woken.is_ok(), "a store under the key must wake its waiter");
    assert_eq!(take(&*mailbox, &inbox).await, Some(seen(&ok(1, 10))));
}

/// Stores under other keys, including the same user and session of another tenant, do not
/// wake a waiter; a store under its own key then does.
pub async fn subscribe_is_not_woken_by_other_keys(mailbox: Arc<dyn Mailbox<String>>) {
    let inbox = key("acme", "ada", "s1");
    let notify = mailbox.subscribe(&inbox);
    let mut notified = pin!(notify.notified());
    notified.as_mut().enable();

    let others = [
        key("globex", "ada", "s1"),
        key("acme", "bob", "s1"),
        key("acme", "ada", "s2"),
    ];
    for (id, other) in (1..).zip(&others) {
        store_elsewhere(&mailbox, other, ok(id, 10)).await;
    }
    let woken = timeout(QUIET_PERIOD, notified.as_mut()).await;
    assert!(woken.is_err(), "stores under other keys woke the waiter");

    store_elsewhere(&mailbox, &inbox, ok(9, 20)).await;
    let woken = timeout(WAKE_TIMEOUT, notified).await;
    assert!(woken.is_ok(), "a store under the key must wake its waiter");
}

/// `backend` names the backend for logs.
pub async fn backend_is_named(mailbox: Arc<dyn Mailbox<String>>) {
    let name = mailbox.backend();
    assert!(!name.trim().is_empty(), "backend name {name:?}");
}
