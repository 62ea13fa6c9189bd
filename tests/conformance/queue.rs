//! The [`TaskQueue`] conformance suite: the local contract, every behaviour the scheduler
//! relies on, checked with exact values, orders, counts and error variants.
//!
//! A local queue only stores tasks by entry id and hands over the one it is told to; the
//! scheduler's core decides which one. So the suite checks storage (park, claim, settle,
//! remove, counts, load at start), not ranking. Task ids and entry ids differ throughout, so a
//! backend that addresses tasks by task id fails.
//!
//! Each case takes an empty queue and tests one behaviour; [`run_all`] runs every case, each
//! against a fresh queue from the backend's factory, through the async trait and, where the
//! backend has one, again through its inline face ([`TaskQueue::inline`]), which must behave
//! identically. Backends that retry failed tasks must be built with retries off for this
//! suite: it expects `Settlement::Failed` to end a claim for good.

use std::future::Future;

use prometheus_parking_lot::core::{
    Carried, EntryId, InlineQueue, QueueCounts, QueueError, ScheduledTask, Settlement, StoredEntry,
    TaskMetadata, TaskQueue, TraceParent,
};
use prometheus_parking_lot::util::serde::{
    ExtraCosts, MailboxKey, Priority, ResourceCost, ResourceKind, TaskId,
};

use super::{Job, EPOCH_MS};

use Priority::{Critical, High, Low, Normal};
use ResourceKind::{Cpu, GpuVram, Io, Mixed};

/// Runs every case of the suite, each against a fresh queue from `fresh`: through the async
/// trait, then (if the backend has an inline face) through the inline face. Prints the case's
/// name and face first so a failure names them.
pub async fn run_all<F, Fut>(fresh: F)
where
    F: Fn() -> Fut,
    Fut: Future<Output = Box<dyn TaskQueue<Job>>>,
{
    macro_rules! run {
        ($($case:ident),* $(,)?) => {$(
            for via in [Via::Async, Via::Inline] {
                let queue = fresh().await;
                if via == Via::Inline && queue.inline().is_none() {
                    continue;
                }
                eprintln!(
                    "queue conformance [{} {via:?}]: {}",
                    queue.backend(),
                    stringify!($case)
                );
                $case(Driven { queue: &*queue, via }).await;
            }
        )*};
    }
    run!(
        claim_returns_the_parked_task_unchanged,
        entries_not_task_ids_address_tasks,
        duplicate_entries_are_refused,
        claim_of_an_unknown_or_removed_entry_is_none,
        a_second_claim_is_none,
        settle_ends_a_claim_once,
        settle_of_an_unclaimed_entry_is_refused,
        a_released_claim_is_parked_again_with_its_task,
        remove_returns_a_parked_task_once,
        remove_leaves_a_claimed_entry_claimed,
        counts_follow_every_step,
        load_parked_returns_the_parked_entries_in_entry_order,
        load_parked_leaves_out_settled_and_removed_entries,
        a_scheduled_start_is_parked_and_a_durable_queue_keeps_its_instant,
        a_scheduled_start_is_removed_while_it_sleeps,
        a_parked_trace_comes_back_with_the_entry,
        the_costs_of_a_task_of_several_kinds_come_back_with_the_entry,
        backend_is_named,
    );
}

// ---------------------------------------------------------------------------------------------
// Building blocks
// ---------------------------------------------------------------------------------------------

/// A task with a [`Job`] payload. `created` and `deadline` are milliseconds after
/// [`EPOCH_MS`]. The task is addressed to a mailbox so the round trip covers every field.
pub fn task(
    id: TaskId,
    priority: Priority,
    created: u64,
    kind: ResourceKind,
    units: u32,
    deadline: Option<u64>,
) -> ScheduledTask<Job> {
    let mailbox = MailboxKey::new("acme")
        .with_user("ada")
        .with_session(format!("session-{id}"));
    let mut meta = TaskMetadata::new(id, ResourceCost::new(kind, units))
        .with_priority(priority)
        .with_mailbox(mailbox);
    meta.created_at_ms = u128::from(at(created));
    meta.deadline_ms = deadline.map(|deadline| u128::from(at(deadline)));
    ScheduledTask::new(meta, Job::for_task(id))
}

/// A task costing `units` CPU units, without deadline.
pub fn cpu(id: TaskId, priority: Priority, created: u64, units: u32) -> ScheduledTask<Job> {
    task(id, priority, created, Cpu, units, None)
}

/// The absolute time `offset` milliseconds after [`EPOCH_MS`].
pub fn at(offset: u64) -> u64 {
    EPOCH_MS + offset
}

/// Which face of the queue a pass drives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Via {
    /// The async [`TaskQueue`] methods.
    Async,
    /// The synchronous [`InlineQueue`] methods.
    Inline,
}

/// A queue under test and the face a pass drives it through. `counts` and `load_parked`
/// have no inline counterpart and always go through the async trait.
#[derive(Clone, Copy)]
pub struct Driven<'q> {
    /// The queue.
    pub queue: &'q dyn TaskQueue<Job>,
    /// The face `park`, `claim`, `settle` and `remove` go through.
    pub via: Via,
}

impl Driven<'_> {
    async fn park(&self, entry: EntryId, task: ScheduledTask<Job>) -> Result<(), QueueError> {
        match self.via {
            Via::Async => self.queue.park(entry, task).await,
            Via::Inline => self.inline().park_now(entry, task),
        }
    }

    async fn claim(&self, entry: EntryId) -> Result<Option<ScheduledTask<Job>>, QueueError> {
        match self.via {
            Via::Async => self.queue.claim(entry).await,
            Via::Inline => self.inline().claim_now(entry),
        }
    }

    async fn settle(&self, entry: EntryId, settlement: Settlement) -> Result<(), QueueError> {
        match self.via {
            Via::Async => self.queue.settle(entry, settlement).await,
            Via::Inline => self.inline().settle_now(entry, settlement),
        }
    }

    async fn remove(&self, entry: EntryId) -> Result<Option<ScheduledTask<Job>>, QueueError> {
        match self.via {
            Via::Async => self.queue.remove(entry).await,
            Via::Inline => self.inline().remove_now(entry),
        }
    }

    fn inline(&self) -> &dyn InlineQueue<Job> {
        self.queue
            .inline()
            .expect("the inline pass runs only with an inline face")
    }

    async fn load_parked(&self) -> Vec<StoredEntry> {
        self.queue.load_parked().await.expect("load_parked")
    }

    async fn assert_counts(&self, parked: usize, claimed: usize, step: &str) {
        let counts = self.queue.counts().await.expect("counts");
        assert_eq!(
            counts,
            QueueCounts { parked, claimed },
            "counts after {step}"
        );
    }
}

/// Parks every `(entry, task)`, failing the case if one is refused.
async fn park_all(queue: Driven<'_>, entries: &[(EntryId, &ScheduledTask<Job>)]) {
    for &(entry, task) in entries {
        if let Err(error) = queue.park(entry, task.clone()).await {
            panic!(
                "parking entry {entry} (task {}) failed: {error}",
                task.meta.id
            );
        }
    }
}

/// What `load_parked` returns for `task` parked under `entry`.
fn stored(entry: EntryId, task: &ScheduledTask<Job>) -> StoredEntry {
    StoredEntry {
        entry,
        meta: task.meta.clone(),
        carried: Carried::default(),
        held: None,
    }
}

/// A trace the suites park tasks in.
pub fn a_trace() -> TraceParent {
    "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
        .parse()
        .expect("a valid traceparent")
}

/// What a scheduled start carries: its instant.
fn not_before(instant: u64) -> Carried {
    Carried {
        not_before_ms: Some(instant),
        trace: None,
        also: Default::default(),
    }
}

// ---------------------------------------------------------------------------------------------
// Cases
// ---------------------------------------------------------------------------------------------

/// `claim(entry)` returns the task as it was parked: every metadata field and the payload.
pub async fn claim_returns_the_parked_task_unchanged(queue: Driven<'_>) {
    let parked = task(7, High, 10, GpuVram, 300, Some(60_000));
    park_all(queue, &[(1_001, &parked)]).await;
    queue.assert_counts(1, 0, "park").await;

    let claimed = queue.claim(1_001).await.expect("claim");
    assert_eq!(
        claimed,
        Some(parked),
        "payload and metadata survive parking"
    );
    queue.assert_counts(0, 1, "claim").await;
}

/// Two entries carrying the same task id (two tenants' tasks) are stored apart; each claim
/// returns the task of its own entry.
pub async fn entries_not_task_ids_address_tasks(queue: Driven<'_>) {
    let acme = task(5, Normal, 0, Cpu, 1, None);
    let mut globex = task(5, Critical, 3, Io, 2, Some(900));
    globex.meta.mailbox = Some(MailboxKey::new("globex").with_user("bob"));
    park_all(queue, &[(20, &acme), (21, &globex)]).await;
    queue.assert_counts(2, 0, "parking one task id twice").await;

    assert_eq!(queue.claim(5).await.expect("claim by task id"), None);
    assert_eq!(queue.claim(21).await.expect("claim"), Some(globex));
    assert_eq!(queue.claim(20).await.expect("claim"), Some(acme));
    queue.assert_counts(0, 2, "both claims").await;
}

/// Parking an entry id that is parked or claimed fails with `Duplicate(entry)` and changes
/// nothing, whatever task it carries.
pub async fn duplicate_entries_are_refused(queue: Driven<'_>) {
    let original = cpu(1, Normal, 0, 1);
    let impostor = task(2, Critical, 5, GpuVram, 9, Some(100));
    park_all(queue, &[(40, &original)]).await;

    for duplicate in [&original, &impostor] {
        let refused = queue.park(40, duplicate.clone()).await;
        assert_eq!(
            refused,
            Err(QueueError::Duplicate(40)),
            "parked entry parked again"
        );
    }
    queue.assert_counts(1, 0, "refused parks").await;
    assert_eq!(
        queue.claim(40).await.expect("claim"),
        Some(original.clone())
    );

    for duplicate in [&original, &impostor] {
        let refused = queue.park(40, duplicate.clone()).await;
        assert_eq!(
            refused,
            Err(QueueError::Duplicate(40)),
            "claimed entry parked again"
        );
    }
    queue
        .assert_counts(0, 1, "refused parks of a claimed entry")
        .await;
    assert_eq!(
        queue.claim(40).await.expect("claim again"),
        None,
        "a refused park must not park anything"
    );
}

/// `claim` of an entry never parked, or parked and removed, is `Ok(None)` and changes
/// nothing.
pub async fn claim_of_an_unknown_or_removed_entry_is_none(queue: Driven<'_>) {
    assert_eq!(queue.claim(404).await, Ok(None), "empty queue");

    let removed = cpu(1, High, 0, 1);
    let kept = cpu(2, Low, 1, 1);
    park_all(queue, &[(10, &removed), (11, &kept)]).await;
    assert_eq!(queue.remove(10).await, Ok(Some(removed)));

    assert_eq!(queue.claim(10).await, Ok(None), "removed entry");
    assert_eq!(queue.claim(404).await, Ok(None), "unknown entry");
    queue.assert_counts(1, 0, "claims that found nothing").await;
    assert_eq!(queue.claim(11).await, Ok(Some(kept)));
}

/// A claimed entry is claimed once: a second `claim` is `Ok(None)` and the claim stands.
pub async fn a_second_claim_is_none(queue: Driven<'_>) {
    let parked = cpu(3, Normal, 0, 2);
    park_all(queue, &[(30, &parked)]).await;

    assert_eq!(queue.claim(30).await, Ok(Some(parked)));
    assert_eq!(queue.claim(30).await, Ok(None), "claimed twice");
    queue.assert_counts(0, 1, "a second claim").await;
    assert_eq!(
        queue.settle(30, Settlement::Done).await,
        Ok(()),
        "still claimed"
    );
}

/// `settle` with `Done` or `Failed` ends a claim exactly once; a second settle of either
/// kind is `NotClaimed(entry)`, and the entry is gone for good.
pub async fn settle_ends_a_claim_once(queue: Driven<'_>) {
    park_all(
        queue,
        &[
            (1, &cpu(11, Normal, 0, 1)),
            (2, &cpu(12, Normal, 1, 1)),
            (3, &cpu(13, Normal, 2, 1)),
        ],
    )
    .await;
    for entry in [1, 2] {
        assert!(queue.claim(entry).await.expect("claim").is_some());
    }
    queue.assert_counts(1, 2, "two claims").await;

    assert_eq!(queue.settle(1, Settlement::Done).await, Ok(()));
    queue.assert_counts(1, 1, "settled Done").await;
    for again in [Settlement::Done, Settlement::Failed("late".into())] {
        assert_eq!(queue.settle(1, again).await, Err(QueueError::NotClaimed(1)));
    }

    let failed = Settlement::Failed("boom".into());
    assert_eq!(queue.settle(2, failed).await, Ok(()));
    queue.assert_counts(1, 0, "settled Failed").await;
    for again in [Settlement::Done, Settlement::Failed("boom".into())] {
        assert_eq!(queue.settle(2, again).await, Err(QueueError::NotClaimed(2)));
    }

    queue.assert_counts(1, 0, "refused settles").await;
    assert_eq!(queue.claim(1).await, Ok(None), "settled entries are gone");
    assert_eq!(queue.claim(2).await, Ok(None), "settled entries are gone");
    assert_eq!(queue.remove(2).await, Ok(None), "settled entries are gone");
    assert!(queue.claim(3).await.expect("claim").is_some());
}

/// `settle` of a parked-but-unclaimed entry, or an unknown one, is `NotClaimed(entry)` and
/// leaves the parked entry parked.
pub async fn settle_of_an_unclaimed_entry_is_refused(queue: Driven<'_>) {
    let parked = cpu(1, Normal, 0, 1);
    park_all(queue, &[(50, &parked)]).await;

    for settlement in [Settlement::Done, Settlement::Failed("parked".into())] {
        assert_eq!(
            queue.settle(50, settlement.clone()).await,
            Err(QueueError::NotClaimed(50)),
            "parked entry"
        );
        assert_eq!(
            queue.settle(404, settlement).await,
            Err(QueueError::NotClaimed(404)),
            "unknown entry"
        );
    }
    queue.assert_counts(1, 0, "refused settles").await;
    assert_eq!(queue.claim(50).await, Ok(Some(parked)), "still parked");
}

/// A backend that keeps claimed tasks hands a claim back: the entry is parked again, with its
/// task unchanged, listed by `load_parked`, and claimed again; only a claimed entry can be
/// released. A backend that cannot says so and refuses, changing nothing.
pub async fn a_released_claim_is_parked_again_with_its_task(queue: Driven<'_>) {
    let parked = task(3, High, 2, Io, 7, Some(90_000));
    park_all(queue, &[(60, &parked), (61, &cpu(4, Low, 3, 1))]).await;
    assert_eq!(queue.claim(60).await, Ok(Some(parked.clone())));
    let released = queue.queue.release(60).await;
    if !queue.queue.releases_claims() {
        assert!(
            matches!(released, Err(QueueError::Backend(_))),
            "{released:?}"
        );
        queue.assert_counts(1, 1, "a refused release").await;
        return;
    }
    assert_eq!(released, Ok(()));
    queue.assert_counts(2, 0, "released").await;
    let listed: Vec<EntryId> = queue.load_parked().await.iter().map(|e| e.entry).collect();
    assert_eq!(listed, vec![60, 61], "parked again, in entry order");
    assert_eq!(
        queue.queue.release(60).await,
        Err(QueueError::NotClaimed(60)),
        "parked"
    );
    assert_eq!(
        queue.queue.release(404).await,
        Err(QueueError::NotClaimed(404)),
        "unknown"
    );
    assert_eq!(
        queue.claim(60).await,
        Ok(Some(parked)),
        "claimed again, unchanged"
    );
    assert_eq!(queue.settle(60, Settlement::Done).await, Ok(()));
    queue
        .assert_counts(1, 0, "settled after the second claim")
        .await;
}

/// `remove` returns a parked task unchanged, then `None`; unknown entries give `None`.
pub async fn remove_returns_a_parked_task_once(queue: Driven<'_>) {
    let gone = task(1, Critical, 0, Mixed, 5, Some(1_000));
    let kept = cpu(2, Low, 0, 1);
    park_all(queue, &[(60, &gone), (61, &kept)]).await;

    assert_eq!(queue.remove(60).await, Ok(Some(gone)));
    queue.assert_counts(1, 0, "remove").await;
    assert_eq!(queue.remove(60).await, Ok(None), "removed twice");
    assert_eq!(queue.remove(404).await, Ok(None), "unknown entry");
    queue
        .assert_counts(1, 0, "removes that found nothing")
        .await;
    assert_eq!(queue.claim(61).await, Ok(Some(kept)));
}

/// `remove` of a claimed entry is `None` and leaves the claim standing.
pub async fn remove_leaves_a_claimed_entry_claimed(queue: Driven<'_>) {
    let running = cpu(1, Normal, 0, 1);
    park_all(queue, &[(70, &running)]).await;
    assert_eq!(queue.claim(70).await, Ok(Some(running)));

    assert_eq!(queue.remove(70).await, Ok(None));
    queue.assert_counts(0, 1, "remove of a claimed entry").await;
    assert_eq!(
        queue.settle(70, Settlement::Done).await,
        Ok(()),
        "still claimed"
    );
    queue.assert_counts(0, 0, "settle").await;
}

/// `counts` follows entries through every operation, refused ones included.
pub async fn counts_follow_every_step(queue: Driven<'_>) {
    queue.assert_counts(0, 0, "nothing").await;
    park_all(
        queue,
        &[
            (1, &cpu(11, Normal, 0, 1)),
            (2, &cpu(12, Normal, 1, 1)),
            (3, &cpu(13, Normal, 2, 1)),
            (4, &task(14, Normal, 3, Io, 1, Some(100))),
        ],
    )
    .await;
    queue.assert_counts(4, 0, "four parks").await;
    let refused = queue.park(4, cpu(15, Low, 4, 1)).await;
    assert_eq!(refused, Err(QueueError::Duplicate(4)));
    queue.assert_counts(4, 0, "a refused park").await;
    assert!(queue.claim(1).await.expect("claim").is_some());
    queue.assert_counts(3, 1, "claim").await;
    assert!(queue.claim(2).await.expect("claim").is_some());
    queue.assert_counts(2, 2, "second claim").await;
    assert_eq!(queue.claim(2).await, Ok(None));
    queue
        .assert_counts(2, 2, "a claim that found nothing")
        .await;
    queue.settle(2, Settlement::Done).await.expect("settle");
    queue.assert_counts(2, 1, "settled Done").await;
    let refused = queue.settle(3, Settlement::Done).await;
    assert_eq!(refused, Err(QueueError::NotClaimed(3)));
    queue.assert_counts(2, 1, "a refused settle").await;
    queue.remove(3).await.expect("remove").expect("parked");
    queue.assert_counts(1, 1, "remove").await;
    assert_eq!(queue.remove(1).await, Ok(None));
    queue
        .assert_counts(1, 1, "a remove that found nothing")
        .await;
    assert!(queue.claim(4).await.expect("claim").is_some());
    queue
        .assert_counts(0, 2, "claim of the last parked entry")
        .await;
    let failed = Settlement::Failed("boom".into());
    queue.settle(1, failed).await.expect("settle");
    queue.assert_counts(0, 1, "settled Failed").await;
    queue.settle(4, Settlement::Done).await.expect("settle");
    queue.assert_counts(0, 0, "everything settled").await;
}

/// `load_parked` returns exactly the parked entries with their metadata, ordered by entry
/// id whatever the order they were parked in.
pub async fn load_parked_returns_the_parked_entries_in_entry_order(queue: Driven<'_>) {
    assert_eq!(queue.load_parked().await, vec![], "empty queue");

    let gpu = task(1, Critical, 0, GpuVram, 16_000, Some(30_000));
    let io = task(2, Low, 7, Io, 3, None);
    let cpu_task = cpu(3, High, 3, 2);
    let mut mixed = task(4, Normal, 5, Mixed, 1, None);
    mixed.meta.mailbox = None;
    park_all(
        queue,
        &[(300, &gpu), (7, &io), (45, &cpu_task), (8, &mixed)],
    )
    .await;

    let expected = vec![
        stored(7, &io),
        stored(8, &mixed),
        stored(45, &cpu_task),
        stored(300, &gpu),
    ];
    assert_eq!(queue.load_parked().await, expected);
    assert_eq!(
        queue.load_parked().await,
        expected,
        "loading does not consume"
    );
    queue.assert_counts(4, 0, "load_parked").await;
    assert_eq!(
        queue.claim(300).await,
        Ok(Some(gpu)),
        "the payload stays in the queue"
    );
}

/// Settled and removed entries are gone from what `load_parked` returns.
pub async fn load_parked_leaves_out_settled_and_removed_entries(queue: Driven<'_>) {
    let tasks = [
        cpu(11, Normal, 0, 1),
        cpu(12, High, 1, 1),
        cpu(13, Low, 2, 1),
        cpu(14, Critical, 3, 1),
        cpu(15, Normal, 4, 1),
    ];
    let entries: Vec<(EntryId, &ScheduledTask<Job>)> = (1..).zip(&tasks).collect();
    park_all(queue, &entries).await;

    assert!(queue.claim(2).await.expect("claim").is_some());
    queue.settle(2, Settlement::Done).await.expect("settle");
    assert!(queue.claim(5).await.expect("claim").is_some());
    let failed = Settlement::Failed("boom".into());
    queue.settle(5, failed).await.expect("settle");
    queue.remove(3).await.expect("remove").expect("parked");

    let expected = vec![stored(1, &tasks[0]), stored(4, &tasks[3])];
    assert_eq!(queue.load_parked().await, expected);
}

/// `backend` names the backend for logs.
pub async fn backend_is_named(queue: Driven<'_>) {
    let name = queue.queue.backend();
    assert!(!name.trim().is_empty(), "backend name {name:?}");
}

/// A scheduled start ([`TaskQueue::park_carrying`] with an instant) is parked like any task:
/// claimed unchanged, counted, and returned by `load_parked` with its instant, also after
/// its claim was handed back. The scheduler, not the queue, holds it back until then, so the
/// queue hands it over when asked.
pub async fn a_scheduled_start_is_parked_and_a_durable_queue_keeps_its_instant(queue: Driven<'_>) {
    let (later, now) = (cpu(7, Normal, 0, 2), cpu(8, High, 1, 1));
    let instant = at(60_000);
    queue
        .queue
        .park_carrying(11, later.clone(), not_before(instant))
        .await
        .expect("park_carrying");
    park_all(queue, &[(12, &now)]).await;
    queue.assert_counts(2, 0, "two parks").await;
    let mut scheduled = stored(11, &later);
    scheduled.carried = not_before(instant);
    assert_eq!(
        queue.load_parked().await,
        vec![scheduled.clone(), stored(12, &now)],
        "the scheduled start keeps its instant where the queue is durable"
    );
    assert_eq!(queue.claim(11).await, Ok(Some(later)));
    queue.assert_counts(1, 1, "its claim").await;
    if queue.queue.releases_claims() {
        queue.queue.release(11).await.expect("release");
        assert_eq!(
            queue.load_parked().await,
            vec![scheduled, stored(12, &now)],
            "handed back, it keeps its instant"
        );
    }
}

/// A sleeping scheduled start can be removed (cancelled) at once, and is gone for good.
pub async fn a_scheduled_start_is_removed_while_it_sleeps(queue: Driven<'_>) {
    let later = cpu(7, Normal, 0, 2);
    queue
        .queue
        .park_carrying(11, later.clone(), not_before(at(60_000)))
        .await
        .expect("park_carrying");
    assert_eq!(queue.remove(11).await, Ok(Some(later)));
    assert_eq!(queue.claim(11).await, Ok(None));
    assert_eq!(queue.load_parked().await, Vec::new());
    queue.assert_counts(0, 0, "removed").await;
}

/// A task parked in a trace ([`TaskQueue::park_carrying`]) comes back with it from
/// `load_parked` (what a restart resumes it from), alone or beside an instant, also after
/// its claim was handed back; its pop (`claim`) hands the task over unchanged; a plain park
/// beside it carries nothing.
pub async fn a_parked_trace_comes_back_with_the_entry(queue: Driven<'_>) {
    let (traced, both, plain) = (cpu(1, High, 0, 1), cpu(2, Normal, 1, 1), cpu(3, Low, 2, 1));
    let in_trace = Carried {
        not_before_ms: None,
        trace: Some(a_trace()),
        also: Default::default(),
    };
    let with_instant = Carried {
        not_before_ms: Some(at(60_000)),
        ..in_trace
    };
    queue
        .queue
        .park_carrying(21, traced.clone(), in_trace)
        .await
        .expect("park_carrying a trace");
    queue
        .queue
        .park_carrying(22, both.clone(), with_instant)
        .await
        .expect("park_carrying a trace and an instant");
    park_all(queue, &[(23, &plain)]).await;
    let carrying = |entry, task: &ScheduledTask<Job>, carried| StoredEntry {
        carried,
        ..stored(entry, task)
    };
    let expected = vec![
        carrying(21, &traced, in_trace),
        carrying(22, &both, with_instant),
        stored(23, &plain),
    ];
    assert_eq!(queue.load_parked().await, expected, "parked");
    assert_eq!(queue.claim(21).await, Ok(Some(traced)), "popped unchanged");
    if queue.queue.releases_claims() {
        queue.queue.release(21).await.expect("release");
        assert_eq!(queue.load_parked().await, expected, "handed back");
    }
}

/// A queue that keeps tasks of several kinds ([`TaskQueue::keeps_several_kinds`]) returns
/// their costs with the entry from `load_parked`: alone, beside a trace, beside an instant and
/// a trace, and after the claim was handed back; a plain park beside them carries none. A
/// queue that keeps none is not asked (the scheduler refuses such tasks on it).
pub async fn the_costs_of_a_task_of_several_kinds_come_back_with_the_entry(queue: Driven<'_>) {
    if !queue.queue.keeps_several_kinds() {
        return;
    }
    let (alone, traced, scheduled, plain) = (
        cpu(1, High, 0, 2),
        cpu(2, Normal, 1, 2),
        cpu(3, Normal, 2, 2),
        cpu(4, Low, 3, 1),
    );
    let slot_and_blocks = ExtraCosts::new(
        ResourceCost::cpu(2),
        &[ResourceCost::gpu_vram(300), ResourceCost::mixed(1)],
    )
    .expect("other kinds");
    let costs = Carried {
        also: slot_and_blocks,
        ..Carried::default()
    };
    let with_trace = Carried {
        trace: Some(a_trace()),
        ..costs
    };
    let with_instant = Carried {
        not_before_ms: Some(at(60_000)),
        ..with_trace
    };
    for (entry, task, carried) in [
        (31, &alone, costs),
        (32, &traced, with_trace),
        (33, &scheduled, with_instant),
    ] {
        queue
            .queue
            .park_carrying(entry, task.clone(), carried)
            .await
            .expect("park_carrying costs of several kinds");
    }
    park_all(queue, &[(34, &plain)]).await;
    let carrying = |entry, task: &ScheduledTask<Job>, carried| StoredEntry {
        carried,
        ..stored(entry, task)
    };
    let expected = vec![
        carrying(31, &alone, costs),
        carrying(32, &traced, with_trace),
        carrying(33, &scheduled, with_instant),
        stored(34, &plain),
    ];
    assert_eq!(queue.load_parked().await, expected, "parked");
    assert_eq!(queue.claim(31).await, Ok(Some(alone)), "popped unchanged");
    if queue.queue.releases_claims() {
        queue.queue.release(31).await.expect("release");
        assert_eq!(queue.load_parked().await, expected, "handed back");
    }
}
