//! Scheduled starts as the shell carries them out: a task submitted with a future
//! `not_before_ms` is answered at once, sleeps (core rule 16, `WaitReason::Sleeping`) and
//! starts at its instant, not before, in every local storage mode; a durable queue is asked
//! to keep the instant; cancel ends it while it sleeps; and an instant too far ahead, or at
//! or after the task's deadline, is refused naming the field.

use std::time::Duration;

use tokio::sync::oneshot;

use super::{Mode, World};
use crate::domain::{Durability, MailboxKey, PoolError, ResourceCost, ScheduledTask, TaskMetadata};
use crate::queue::actor::QueueMsg;
use crate::scheduler::core::WaitReason;
use crate::scheduler::protocol::{Reply, SubmitOptions};
use crate::scheduler::shell::effects::Effect;

/// Submits task `id` (2 units, tenant `t0`) not to start before `not_before_ms`; returns
/// the submitter's answer.
fn submit_not_before(
    world: &mut World,
    id: u64,
    not_before_ms: u128,
    deadline_ms: Option<u128>,
) -> Result<MailboxKey, PoolError> {
    let mut meta = TaskMetadata::new(id, ResourceCost::gpu_vram(2));
    meta.mailbox = Some(MailboxKey::new("t0"));
    meta.deadline_ms = deadline_ms;
    let options = SubmitOptions {
        not_before_ms: Some(not_before_ms),
        ..SubmitOptions::default()
    };
    let (reply, mut answer) = oneshot::channel();
    let task = ScheduledTask { meta, payload: 7 };
    world
        .shell
        .submit(task, &options, Reply::Oneshot(reply), None, world.now);
    settle(world);
    let answer = answer
        .try_recv()
        .expect("the submitter is answered at once");
    if let Ok(key) = &answer {
        world.submissions.push((id, Some(key.clone())));
        *world.accepted.entry((key.clone(), id)).or_default() += 1;
    }
    answer
}

/// Carries out every effect, answering each local queue call (and noting the instant each
/// park asked the queue to keep).
fn settle(world: &mut World) -> Vec<Option<u64>> {
    let mut instants = Vec::new();
    loop {
        if world.shell.has_effects() {
            for effect in world.shell.take_effects(Vec::new()) {
                if let Effect::Queue(QueueMsg::Park { carried, .. }) = &effect {
                    instants.push(carried.not_before_ms);
                }
                world.effect(effect).expect("effect");
            }
            continue;
        }
        if world.queue_calls.is_empty() {
            return instants;
        }
        world.answer_queue(false);
    }
}

fn a_scheduled_task_sleeps_until_its_instant(mode: Mode) {
    let mut world = World::new(mode);
    let start = world.now;
    let at = start + 5_000;
    let key = submit_not_before(&mut world, 1, u128::from(at), None).expect("admitted");
    assert_eq!(key, MailboxKey::new("t0"), "{mode:?}");
    assert_eq!(
        world.shell.why_waiting(&key, 1),
        Ok(Some(WaitReason::Sleeping {
            until_ms: u128::from(at)
        })),
        "{mode:?}: it sleeps until its instant with room free"
    );
    assert!(world.running.is_empty(), "{mode:?}: nothing runs yet");
    world.now = at - 1;
    world.shell.tick(world.now);
    settle(&mut world);
    assert!(world.running.is_empty(), "{mode:?}: not started before");
    world.now = at;
    world.shell.tick(world.now);
    settle(&mut world);
    let ids: Vec<u64> = world.running.iter().map(|(.., id)| *id).collect();
    assert_eq!(ids, vec![1], "{mode:?}: started at its instant");
    world.wind_down().expect("winds down");
    world.verify().expect("verified");
}

#[test]
fn a_scheduled_task_sleeps_until_its_instant_in_memory() {
    a_scheduled_task_sleeps_until_its_instant(Mode::Memory);
}

#[test]
fn a_scheduled_task_sleeps_until_its_instant_on_a_durable_queue() {
    a_scheduled_task_sleeps_until_its_instant(Mode::Local(Durability::Accepted));
    let spin = Duration::from_millis(200);
    a_scheduled_task_sleeps_until_its_instant(Mode::Local(Durability::Parked { spin }));
}

#[test]
fn a_durable_queue_is_asked_to_keep_the_instant() {
    let mut world = World::new(Mode::Local(Durability::Accepted));
    let at = world.now + 60_000;
    let mut meta = TaskMetadata::new(1, ResourceCost::gpu_vram(2));
    meta.mailbox = Some(MailboxKey::new("t0"));
    let options =
        SubmitOptions::default().with_not_before(std::time::UNIX_EPOCH + Duration::from_millis(at));
    let (reply, _answer) = oneshot::channel();
    world.shell.submit(
        ScheduledTask { meta, payload: 7 },
        &options,
        Reply::Oneshot(reply),
        None,
        world.now,
    );
    assert_eq!(settle(&mut world), vec![Some(at)]);
}

#[test]
fn cancel_ends_a_sleeping_task_and_it_never_runs() {
    for mode in [Mode::Memory, Mode::Local(Durability::Accepted)] {
        let mut world = World::new(mode);
        let at = world.now + 5_000;
        let key = submit_not_before(&mut world, 1, u128::from(at), None).expect("admitted");
        let (reply, _cancelled) = oneshot::channel();
        world
            .shell
            .cancel(key.clone(), 1, ractor::RpcReplyPort::from(reply), world.now);
        settle(&mut world);
        assert_eq!(
            world.delivered.get(&(key.clone(), 1)),
            Some(&1),
            "{mode:?}: its one outcome (cancelled) is delivered"
        );
        assert_eq!(
            world.shell.why_waiting(&key, 1),
            Err(PoolError::TaskNotFound(1)),
            "{mode:?}"
        );
        world.now = at + 1;
        world.shell.tick(world.now);
        settle(&mut world);
        assert!(
            world.running.is_empty(),
            "{mode:?}: a cancelled sleeper never starts"
        );
        assert_eq!(world.shell.tasks.core.parked_len(), 0, "{mode:?}");
    }
}

#[test]
fn an_instant_past_is_an_ordinary_submission() {
    let mut world = World::new(Mode::Memory);
    let past = u128::from(world.now - 1);
    let key = submit_not_before(&mut world, 1, past, None).expect("admitted");
    assert_eq!(
        world.shell.why_waiting(&key, 1),
        Ok(None),
        "it runs at once"
    );
    assert_eq!(world.running.len(), 1);
}

#[test]
fn an_absurd_instant_or_one_after_the_deadline_is_refused_naming_the_field() {
    let mut world = World::new(Mode::Memory);
    let now = u128::from(world.now);
    let too_far = now + SubmitOptions::MAX_NOT_BEFORE_AHEAD.as_millis() + 1;
    let refused = submit_not_before(&mut world, 1, too_far, None);
    assert!(
        matches!(&refused, Err(PoolError::InvalidConfig(text)) if text.contains("not_before_ms") && text.contains("366 days")),
        "{refused:?}"
    );
    let late = submit_not_before(&mut world, 2, now + 5_000, Some(now + 1_000));
    assert!(
        matches!(&late, Err(PoolError::InvalidConfig(text)) if text.contains("not_before_ms") && text.contains("deadline_ms")),
        "{late:?}"
    );
    assert_eq!(world.shell.tasks.core.parked_len(), 0);
    assert!(world.running.is_empty());
}

#[test]
fn a_sleeper_wakes_to_rank_among_the_parked() {
    // Three tasks of 3 units fill the 6-unit pool and park one; a High task scheduled for
    // later wakes behind it in time but ahead of it in rank, and starts first.
    let mut world = World::new(Mode::Memory);
    for id in 10..13 {
        let mut meta = TaskMetadata::new(id, ResourceCost::gpu_vram(3));
        meta.mailbox = Some(MailboxKey::new("t0"));
        let (reply, _answer) = oneshot::channel();
        world.shell.submit(
            ScheduledTask { meta, payload: 7 },
            &SubmitOptions::default(),
            Reply::Oneshot(reply),
            None,
            world.now,
        );
        settle(&mut world);
    }
    let at = world.now + 1_000;
    let mut meta = TaskMetadata::new(1, ResourceCost::gpu_vram(3))
        .with_priority(crate::domain::Priority::High);
    meta.mailbox = Some(MailboxKey::new("t0"));
    let options = SubmitOptions {
        not_before_ms: Some(u128::from(at)),
        ..SubmitOptions::default()
    };
    let (reply, _answer) = oneshot::channel();
    world.shell.submit(
        ScheduledTask { meta, payload: 7 },
        &options,
        Reply::Oneshot(reply),
        None,
        world.now,
    );
    settle(&mut world);
    world.now = at;
    world.shell.tick(world.now);
    settle(&mut world);
    // Free one running task's units: the woken High task goes before task 12.
    let (_, entry, _, _) = world.running.remove(0);
    world.shell.finish(entry, Ok(0), world.now);
    settle(&mut world);
    let started: Vec<u64> = world.running.iter().map(|(.., id)| *id).collect();
    assert_eq!(started, vec![11, 1]);
}
