//! Rule 24: tickets held until their parents end.

use std::collections::{BTreeMap, BTreeSet};

use proptest::prelude::*;

use super::tests::{lot, normal, ticket};
use super::*;

#[test]
fn a_held_ticket_is_live_but_starts_only_once_every_parent_succeeded() {
    let mut lot = lot();
    assert_eq!(lot.admit(normal(1, 2), 0), Admit::Start);
    assert_eq!(lot.admit(normal(2, 2), 0), Admit::Start);
    // Named twice, counted once.
    assert_eq!(
        lot.admit_after(normal(3, 2), &[1, 2, 1], false, 0),
        Admit::Park
    );
    assert_eq!(lot.state(3), Some(WakeState::Parked));
    assert_eq!(lot.parked_len(), 1);
    assert_eq!(
        lot.parked_page(0, 10),
        (vec![3], 1),
        "listed among the parked"
    );
    assert_eq!(
        lot.why_waiting(3),
        Some(WaitReason::Dependencies { pending: 2 })
    );
    assert!(matches!(
        lot.admit(normal(3, 1), 0),
        Admit::Reject(Rejection::DuplicateId(3))
    ));
    // Room is free, yet the held ticket takes no part in any decision.
    assert_eq!(lot.admit(normal(4, 1), 0), Admit::Start);
    lot.check_invariants().unwrap();
    assert_eq!(lot.complete(1, 5).unwrap(), Vec::<TaskId>::new());
    assert_eq!(lot.parent_ended(1, true, 5), Released::default());
    assert_eq!(
        lot.why_waiting(3),
        Some(WaitReason::Dependencies { pending: 1 })
    );
    lot.check_invariants().unwrap();
    lot.complete(2, 6).unwrap();
    let released = lot.parent_ended(2, true, 6);
    assert_eq!(released.started, vec![3]);
    assert!(released.cancelled.is_empty());
    assert_eq!(lot.state(3), Some(WakeState::Running));
    lot.check_invariants().unwrap();
}

#[test]
fn a_released_ticket_ranks_by_its_own_priority() {
    let mut lot = lot();
    assert_eq!(lot.admit(normal(9, 10), 0), Admit::Start);
    assert_eq!(lot.admit(normal(1, 0), 0), Admit::Start);
    assert_eq!(
        lot.admit_after(ticket(2, Priority::High, 5), &[1], false, 0),
        Admit::Park
    );
    assert_eq!(lot.admit(normal(3, 5), 1), Admit::Park);
    assert_eq!(lot.admit(normal(4, 5), 1), Admit::Park);
    lot.complete(1, 2).unwrap();
    assert!(
        lot.parent_ended(1, true, 2).started.is_empty(),
        "no room yet"
    );
    lot.check_invariants().unwrap();
    // Released, the high-priority ticket goes ahead of the normal ones parked before it.
    assert_eq!(lot.complete(9, 3).unwrap(), vec![2, 3]);
    lot.check_invariants().unwrap();
}

#[test]
fn a_failed_parent_hands_its_children_back_unless_they_run_anyway() {
    let mut lot = lot();
    assert_eq!(lot.admit(normal(1, 2), 0), Admit::Start);
    assert_eq!(lot.admit(normal(2, 2), 0), Admit::Start);
    assert_eq!(
        lot.admit_after(normal(3, 1), &[1, 2], false, 0),
        Admit::Park
    );
    assert_eq!(lot.admit_after(normal(4, 1), &[1, 2], true, 0), Admit::Park);
    lot.complete(1, 5).unwrap();
    let released = lot.parent_ended(1, false, 5);
    assert_eq!(released.cancelled, vec![3], "the cleanup step stays held");
    assert_eq!(lot.state(3), None, "it left the lot");
    assert_eq!(
        lot.why_waiting(4),
        Some(WaitReason::Dependencies { pending: 1 })
    );
    lot.check_invariants().unwrap();
    lot.complete(2, 6).unwrap();
    // Task 3 is still in task 2's list: skipped, not ended twice.
    let released = lot.parent_ended(2, true, 6);
    assert_eq!(released.started, vec![4]);
    assert!(released.cancelled.is_empty());
    lot.check_invariants().unwrap();
}

#[test]
fn unknown_parents_and_the_ticket_itself_are_refused() {
    let mut lot = lot();
    assert_eq!(lot.admit(normal(1, 2), 0), Admit::Start);
    assert_eq!(
        lot.admit_after(normal(2, 1), &[1, 9], false, 0),
        Admit::Reject(Rejection::UnknownParent(9))
    );
    assert_eq!(
        lot.admit_after(normal(2, 1), &[2], false, 0),
        Admit::Reject(Rejection::UnknownParent(2))
    );
    assert_eq!(lot.parked_len(), 0, "nothing held");
    // A held ticket may be a parent: chains hold.
    assert_eq!(lot.admit_after(normal(2, 1), &[1], false, 0), Admit::Park);
    assert_eq!(lot.admit_after(normal(3, 1), &[2], false, 0), Admit::Park);
    lot.check_invariants().unwrap();
}

#[test]
fn held_tickets_count_against_the_queue_depth_and_expire_at_their_deadline() {
    let mut lot = super::tests::lot_with(
        PoolLimits::new(10, 8)
            .with_max_queue_depth(2)
            .with_starvation(crate::domain::StarvationGuard::disabled()),
    );
    assert_eq!(lot.admit(normal(1, 2), 0), Admit::Start);
    let mut due = normal(2, 1);
    due.deadline_ms = Some(50);
    assert_eq!(lot.admit_after(due, &[1], false, 0), Admit::Park);
    assert_eq!(lot.admit_after(normal(3, 1), &[1], false, 0), Admit::Park);
    assert_eq!(
        lot.admit_after(normal(4, 1), &[1], false, 0),
        Admit::Reject(Rejection::QueueFull { max_queue_depth: 2 })
    );
    assert_eq!(lot.next_wakeup(), Some(50));
    assert_eq!(lot.tick(50).expired, vec![2]);
    assert_eq!(lot.parked_len(), 1);
    lot.check_invariants().unwrap();
    lot.complete(1, 60).unwrap();
    assert_eq!(lot.parent_ended(1, true, 60).started, vec![3]);
    lot.check_invariants().unwrap();
}

#[test]
fn a_cancelled_held_ticket_leaves_and_shutdown_takes_the_held_ones() {
    let mut lot = lot();
    assert_eq!(lot.admit(normal(1, 2), 0), Admit::Start);
    assert_eq!(lot.admit_after(normal(2, 1), &[1], false, 0), Admit::Park);
    assert_eq!(lot.admit_after(normal(3, 1), &[1], false, 0), Admit::Park);
    assert_eq!(
        lot.cancel(2, 1),
        Ok(Cancel::Parked {
            started: Vec::new()
        })
    );
    lot.check_invariants().unwrap();
    assert_eq!(lot.take_parked(), vec![3]);
    assert!(!lot.has_children(1));
    lot.check_invariants().unwrap();
}

#[test]
fn a_fan_in_of_a_thousand_parents_releases_on_the_last() {
    let mut lot = super::tests::lot_with(PoolLimits::new(2_000, 1_001).with_max_queue_depth(10));
    let parents: Vec<TaskId> = (1..=1_000).collect();
    for &id in &parents {
        assert_eq!(lot.admit(normal(id, 1), 0), Admit::Start);
    }
    assert_eq!(
        lot.admit_after(normal(5_000, 1), &parents, false, 0),
        Admit::Park
    );
    for &id in &parents[..999] {
        lot.complete(id, 1).unwrap();
        assert_eq!(lot.parent_ended(id, true, 1), Released::default());
    }
    assert_eq!(
        lot.why_waiting(5_000),
        Some(WaitReason::Dependencies { pending: 1 })
    );
    lot.complete(1_000, 2).unwrap();
    assert_eq!(lot.parent_ended(1_000, true, 2).started, vec![5_000]);
    lot.check_invariants().unwrap();
}

/// An event of the property test below.
#[derive(Debug, Clone)]
enum Op {
    /// Admit ticket `units` held on up to three parents picked among the live ones.
    Admit {
        units: u32,
        parents: Vec<prop::sample::Index>,
        run_anyway: bool,
        /// Steps from now before which it must not start, if it is a scheduled start too.
        not_before: Option<u8>,
    },
    /// End a running ticket, succeeded or not.
    Complete {
        pick: prop::sample::Index,
        succeeded: bool,
    },
    /// Cancel a live ticket (parked or held).
    Cancel { pick: prop::sample::Index },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (
            0..6u32,
            prop::collection::vec(any::<prop::sample::Index>(), 0..4),
            any::<bool>(),
            prop::option::of(0..20u8),
        )
            .prop_map(|(units, parents, run_anyway, not_before)| Op::Admit {
                units,
                parents,
                run_anyway,
                not_before,
            }),
        3 => (any::<prop::sample::Index>(), any::<bool>())
            .prop_map(|(pick, succeeded)| Op::Complete { pick, succeeded }),
        1 => any::<prop::sample::Index>().prop_map(|pick| Op::Cancel { pick }),
    ]
}

/// Drives the lot as the shell does: every ticket that leaves it is reported to
/// `parent_ended`, and the children a failure hands back are ended in turn.
struct Driver {
    lot: ParkingLot,
    /// Each admitted ticket's parents, for the checks.
    parents: BTreeMap<TaskId, (Vec<TaskId>, bool)>,
    /// Tickets ended, and whether they succeeded.
    ended: BTreeMap<TaskId, bool>,
    /// Tickets that started.
    started: BTreeSet<TaskId>,
    /// Each held scheduled start's instant.
    not_before: BTreeMap<TaskId, u64>,
}

impl Driver {
    fn left(&mut self, id: TaskId, succeeded: bool, now: u64) {
        let mut queue = vec![(id, succeeded)];
        while let Some((parent, succeeded)) = queue.pop() {
            assert!(
                self.ended.insert(parent, succeeded).is_none(),
                "ended twice"
            );
            let released = self.lot.parent_ended(parent, succeeded, now);
            self.started.extend(released.started);
            queue.extend(released.cancelled.into_iter().map(|child| (child, false)));
        }
    }
}

proptest! {
    /// Random held admissions over live parents, ends (succeeded or failed) and cancels: the
    /// invariants hold after every event, a ticket starts only once each of its parents
    /// ended (succeeded, unless it runs anyway), and not before its instant where it is a
    /// scheduled start too; a child of a failed parent that does not run anyway never
    /// starts, and every ticket ends at most once.
    #[test]
    fn dependencies_keep_the_invariants_and_the_order(ops in prop::collection::vec(op(), 1..150)) {
        let mut driver = Driver {
            lot: super::tests::lot_with(PoolLimits::new(10, 3).with_max_queue_depth(40)),
            parents: BTreeMap::new(),
            ended: BTreeMap::new(),
            started: BTreeSet::new(),
            not_before: BTreeMap::new(),
        };
        for (step, op) in ops.into_iter().enumerate() {
            let now = step as u64;
            let id = step as TaskId + 1;
            let woken = driver.lot.tick(now).started;
            for &started in &woken {
                let at = driver.not_before.get(&started).copied().unwrap_or(0);
                prop_assert!(at <= now, "{} started at {} before its instant {}", started, now, at);
            }
            driver.started.extend(woken);
            let live: Vec<TaskId> = driver.parents.keys().copied()
                .filter(|id| driver.lot.state(*id).is_some())
                .collect();
            match op {
                Op::Admit { units, parents, run_anyway, not_before } => {
                    let named: Vec<TaskId> = if live.is_empty() {
                        Vec::new()
                    } else {
                        parents.iter().map(|pick| *pick.get(&live)).collect()
                    };
                    match driver.lot.admit_after(normal(id, units), &named, run_anyway, now) {
                        Admit::Start | Admit::StartWith(_) => {
                            driver.started.insert(id);
                        }
                        Admit::Park | Admit::ParkShedding { .. } => {
                            if let Some(delay) = not_before.filter(|_| !named.is_empty()) {
                                let at = now + u64::from(delay);
                                prop_assert!(driver.lot.hold_until(id, at));
                                driver.not_before.insert(id, at);
                            }
                        }
                        Admit::Reject(_) | Admit::Expire => continue,
                    }
                    driver.parents.insert(id, (named, run_anyway));
                }
                Op::Complete { pick, succeeded } => {
                    let running: Vec<TaskId> = live.iter().copied()
                        .filter(|id| driver.lot.state(*id) == Some(WakeState::Running))
                        .collect();
                    if running.is_empty() {
                        continue;
                    }
                    let done = *pick.get(&running);
                    let started = driver.lot.complete(done, now).unwrap();
                    driver.started.extend(started);
                    driver.left(done, succeeded, now);
                }
                Op::Cancel { pick } => {
                    let waiting: Vec<TaskId> = live.iter().copied()
                        .filter(|id| driver.lot.state(*id) != Some(WakeState::Running))
                        .collect();
                    if waiting.is_empty() {
                        continue;
                    }
                    let cancelled = *pick.get(&waiting);
                    if let Ok(Cancel::Parked { started }) = driver.lot.cancel(cancelled, now) {
                        driver.started.extend(started);
                    }
                    driver.left(cancelled, false, now);
                }
            }
            prop_assert_eq!(driver.lot.check_invariants(), Ok(()));
            for &child in &driver.started {
                let (parents, run_anyway) = &driver.parents[&child];
                for parent in parents {
                    let ended = driver.ended.get(parent);
                    prop_assert!(ended.is_some(), "{} started before parent {} ended", child, parent);
                    prop_assert!(
                        *run_anyway || ended == Some(&true),
                        "{} started though parent {} failed", child, parent
                    );
                }
            }
        }
    }
}
