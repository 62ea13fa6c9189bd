//! Core rule 21 as the shell carries it out: a parked task shed for a newcomer of higher
//! priority ends once, refused (`Rejected`, its submitter's outcome `QueueFull`), in every
//! local storage mode; a durable queue forgets it, and the counters add up.

use std::time::Duration;

use super::{Event, Mode, World};
use crate::domain::{Durability, MailboxKey, TaskId, TaskStatus};

fn submit(priority: u8, units: u32) -> Event {
    Event::Submit {
        priority,
        units,
        deadline: None,
        timeout: None,
        tenant: Some(0),
        duplicate: false,
    }
}

/// Applies `event`, then answers every local queue call it led to.
fn apply(world: &mut World, event: Event) {
    world.apply(event).expect("invariants");
    while !world.queue_calls.is_empty() {
        world
            .apply(Event::QueueAnswer { fail: false })
            .expect("invariants");
    }
}

/// The world's pool holds 6 units on 2 workers and parks at most 6 tasks or 12 units.
fn a_shed_task_ends_refused_once(mode: Mode) {
    let mut world = World::new(mode);
    // Tasks 1 and 2 take every unit and both workers; tasks 3 to 8 fill the queue.
    apply(&mut world, submit(0, 3));
    apply(&mut world, submit(0, 3));
    for _ in 3..=8 {
        apply(&mut world, submit(0, 2));
    }
    assert_eq!(world.shell.tasks.core.parked_len(), 6);
    // A High newcomer takes the place of the lowest-ranked Low task: the youngest, task 8.
    apply(&mut world, submit(2, 2));
    let shed: TaskId = 8;
    let key = (MailboxKey::new("t0"), shed);
    assert_eq!(world.shell.tasks.core.parked_len(), 6);
    assert_eq!(
        world.delivered.get(&key),
        Some(&1),
        "{mode:?}: outcome delivered once"
    );
    assert!(
        !world.stored.values().any(|task| task.meta.id == shed),
        "{mode:?}: the durable queue forgot the shed task"
    );
    let stats = world.shell.stats();
    assert_eq!(stats.submitted_tasks, 9, "{mode:?}");
    assert_eq!(
        stats.rejected_tasks, 1,
        "{mode:?}: one Ended(Rejected), no refusal"
    );
    let steps = world.steps.counts.lock().expect("steps")[&key];
    assert_eq!(steps, (1, 1), "{mode:?}: admitted once, ended once");
    // A Low newcomer sheds nothing: it is refused at once and never admitted.
    apply(&mut world, submit(0, 1));
    assert!(world.refused.contains(&10), "{mode:?}");
    assert_eq!(world.shell.stats().rejected_tasks, 2, "{mode:?}");
    world.wind_down().expect("winds down");
    world.verify().expect("verified");
}

#[test]
fn a_shed_task_ends_refused_once_in_memory() {
    a_shed_task_ends_refused_once(Mode::Memory);
}

#[test]
fn a_shed_task_ends_refused_once_and_leaves_a_durable_queue() {
    a_shed_task_ends_refused_once(Mode::Local(Durability::Accepted));
    let spin = Duration::ZERO;
    a_shed_task_ends_refused_once(Mode::Local(Durability::Parked { spin }));
}

#[test]
fn the_ended_status_of_a_shed_task_is_rejected_for_a_full_queue() {
    let status = crate::mailbox::status_of::<()>(&Err(crate::domain::TaskFailure::from(
        crate::domain::PoolError::QueueFull,
    )));
    assert!(
        matches!(&status, TaskStatus::Rejected(reason) if reason.contains("queue full")),
        "{status:?}"
    );
}
