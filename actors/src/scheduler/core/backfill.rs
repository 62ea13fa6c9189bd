//! Backfill (rule 13 of the core): which parked tasks may start while a reservation waits,
//! because their execution timeout ends before the reserved task can start.
//!
//! # The rule (EASY backfilling)
//!
//! A reserved task R waits until enough capacity frees. From the running tasks' end times
//! (start plus execution timeout) the core computes R's *shadow time*: the earliest time at
//! which, if every running task ended by its timeout, R's kind would have R's units free
//! and a worker slot would be idle. A task ranked below R may start now only if it has a
//! timeout, fits now, and either its timeout ends by then (it is gone before R could have
//! started) or it fits in what R leaves spare at the shadow time (units of R's kind beyond
//! R's cost, and a worker slot beyond R's), however long it runs. Either way R starts no
//! later than without it. When the running tasks R needs include one without a timeout (or
//! one already past its timeout), R's start cannot be bounded that way and nothing
//! backfills; tasks without a timeout never backfill.
//!
//! # Which one first
//!
//! Among the tasks that may backfill, the highest priority goes first; within a priority,
//! the task that uses the most of the free units (the largest cost that fits), the
//! best-ranked of those. Backfill fills a hole beside a reservation, so, as best-fit
//! packing does, it fills as much of it as it can: taking the oldest task that fits would
//! often start a small one and leave the rest of the hole idle, and leave the large tasks,
//! which fit only in large holes, for the end (where nothing small is left to pair with
//! them). The order between priorities stays strict.
//!
//! # Shape
//!
//! Parked tasks with a timeout are indexed a second time, by priority and timeout class:
//! classes split each power of two into four (1–3 ms are classes of their own), so a
//! class's timeouts differ by less than a quarter. Each class holds one [`CostIndex`] per
//! kind. A query for tasks of one priority ending within `limit` ms asks every class of that
//! priority up to `limit`'s own for its largest task that fits the free units (a walk down
//! the trie and at most one back down its rightmost path: 64 steps per class and kind). In
//! `limit`'s own class only part of the tasks may qualify, so its answer is checked against
//! the exact timeout; if it does not qualify that class offers nothing this time. Tasks for
//! the spare room are asked of every class, with R's kind bounded by the spare units. A
//! backfill can so miss a task that would have qualified (never start one that does not):
//! it errs on the side of the reservation. (In the packing study of `BENCHMARKS.md` an
//! exact scan of the parked tasks in place of the index starts the same tasks.)
//!
//! # Cost
//!
//! Per priority level, two queries of at most 4·32 = 128 classes, each a 64-step walk per
//! kind in use; the levels are asked from the reservation's down until one offers a task:
//! O(1) in the number of parked tasks (at most 4·2·128·64 steps per kind, far fewer in
//! practice: a pool's timeouts span a few dozen classes). Parking or removing a task with a
//! timeout costs one more O(log n) index update, and about 40 more bytes per such task
//! while it is parked.

use std::collections::BTreeMap;

use super::{CostIndex, Parked, ParkingLot, RankKey, Shadow, KINDS, UNLIMITED};
use crate::domain::{Priority, ResourceKind};

/// A timeout class: ms 0–3 are classes 0–3; a timeout `t >= 4` with leading bit `e` is in
/// class `4 (e - 1) + m`, where `m` is the two bits after the leading one.
fn class_of(timeout_ms: u32) -> u8 {
    if timeout_ms < 4 {
        return timeout_ms as u8;
    }
    let exponent = 31 - timeout_ms.leading_zeros();
    let mantissa = (timeout_ms >> (exponent - 2)) & 3;
    (4 * (exponent - 1) + mantissa) as u8
}

/// Parked tasks with a timeout, by priority, timeout class and kind.
#[derive(Debug, Clone, Default)]
pub(super) struct TimeoutIndex {
    classes: BTreeMap<(Priority, u8), [CostIndex; KINDS]>,
}

impl TimeoutIndex {
    pub(super) fn insert(
        &mut self,
        timeout_ms: u32,
        kind: ResourceKind,
        units: u32,
        rank: RankKey,
    ) {
        self.classes
            .entry((rank.priority(), class_of(timeout_ms)))
            .or_default()[kind.index()]
        .insert(units, rank);
    }

    pub(super) fn remove(
        &mut self,
        timeout_ms: u32,
        kind: ResourceKind,
        units: u32,
        rank: RankKey,
    ) {
        let class = (rank.priority(), class_of(timeout_ms));
        let Some(indexes) = self.classes.get_mut(&class) else {
            return;
        };
        indexes[kind.index()].remove(units, rank);
        if indexes.iter().all(CostIndex::is_empty) {
            self.classes.remove(&class);
        }
    }

    pub(super) fn clear(&mut self) {
        self.classes.clear();
    }

    /// Number of tasks indexed.
    pub(super) fn len(&self) -> usize {
        self.classes
            .values()
            .flat_map(|indexes| indexes.iter().map(CostIndex::len))
            .sum()
    }

    /// The task of `priority` whose timeout is at most `limit_ms` that uses the most of
    /// `free` (the largest cost that fits, the best-ranked at that cost), among those
    /// `accept` takes, with its units. Each class and kind offers its largest fitting task
    /// only.
    pub(super) fn largest_within(
        &self,
        priority: Priority,
        limit_ms: u64,
        free: &[u32; KINDS],
        accept: impl Fn(RankKey) -> bool,
    ) -> Option<(u32, RankKey)> {
        let last = class_of(u32::try_from(limit_ms).unwrap_or(u32::MAX));
        let mut best: Option<(u32, RankKey)> = None;
        let classes = self.classes.range((priority, 0)..=(priority, last));
        for indexes in classes.map(|(_, indexes)| indexes) {
            for (kind, index) in indexes.iter().enumerate() {
                let Some((units, candidate)) = index.largest_within(free[kind]) else {
                    continue;
                };
                let better = best
                    .is_none_or(|(most, key)| units > most || (units == most && candidate < key));
                if better && accept(candidate) {
                    best = Some((units, candidate));
                }
            }
        }
        best
    }
}

impl ParkingLot {
    /// The task held back by `reserved` to backfill (rule 13), if any may: it has a
    /// timeout, fits now, its tenant has room for it and no starving task of its own tenant
    /// ranks ahead of it; and either its timeout ends by the reservation's shadow time, or it
    /// fits in what the reservation leaves spare at that time. Among those, the highest
    /// priority first, then the one that uses the most of the free units, then rank.
    /// `ceiling` is the priority of the best-ranked parked task that fits the free units:
    /// no task of a higher priority fits, so those levels are not asked.
    pub(super) fn backfill_candidate(
        &self,
        reserved: RankKey,
        ceiling: Priority,
        now: u64,
    ) -> Option<RankKey> {
        let by_timeout = self.by_timeout.as_ref()?;
        let shadow = self.shadow(reserved, now)?;
        let limit = shadow.at.checked_sub(now)?;
        let free = ResourceKind::ALL.map(|kind| self.free(kind));
        let slot_idle = !self.idle_workers.is_empty();
        let within_share = |candidate: RankKey, parked: &Parked| {
            (slot_idle || parked.slotless)
                && self.tenants.as_ref().is_none_or(|book| {
                    let tenant = book.tenant_of(candidate.id());
                    parked.units <= book.room(tenant, parked.kind)
                        && !book.starving_ahead_of(tenant, &candidate)
                })
        };
        let ends_in_time = |candidate: RankKey| {
            self.parked.get(&candidate.id()).is_some_and(|parked| {
                parked.timeout().is_some_and(|timeout| timeout <= limit)
                    && within_share(candidate, parked)
            })
        };
        // In the spare room, a task needs a spare slot unless it is a permit.
        let permits_parked = !self.permits_by_cost.iter().all(CostIndex::is_empty);
        let any_timeout = |candidate: RankKey| {
            self.parked.get(&candidate.id()).is_some_and(|parked| {
                (shadow.spare_slots > 0 || parked.slotless) && within_share(candidate, parked)
            })
        };
        let mut spare = free;
        spare[shadow.kind.index()] = spare[shadow.kind.index()].min(shadow.spare_units);
        let all_spare = shadow.spare_slots > 0 && spare == free;
        // Level by level from the reservation's down: a task of a level ranks ahead of
        // every task of a lower one, whatever its size.
        let top = reserved.priority().min(ceiling);
        for priority in Priority::ALL.into_iter().rev().filter(|&p| p <= top) {
            // When the spare room is all the free room, every task that fits may backfill
            // whatever its timeout: the first query would only repeat part of the second.
            let in_time = (!all_spare)
                .then(|| by_timeout.largest_within(priority, limit, &free, ends_in_time))
                .flatten();
            let in_spare_room = (shadow.spare_slots > 0 || permits_parked)
                .then(|| by_timeout.largest_within(priority, u64::MAX, &spare, any_timeout))
                .flatten();
            let found = [in_time, in_spare_room]
                .into_iter()
                .flatten()
                .min_by_key(|&(units, rank)| (std::cmp::Reverse(units), rank));
            if let Some((_, rank)) = found {
                return Some(rank);
            }
        }
        None
    }

    /// The reservation's shadow: the earliest time at which, if every running task ends by
    /// its timeout, its kind has its units free and a worker slot is idle, and what would be
    /// spare then beyond the reservation's needs. `None` when the running tasks with a
    /// timeout (and not yet past it) do not free enough, or when a headroom caps its kind
    /// (another process decides when that memory returns).
    pub(super) fn shadow(&self, reserved: RankKey, now: u64) -> Option<Shadow> {
        let parked = self.parked.get(&reserved.id())?;
        // Nothing backfills past a reservation of several kinds (rule 25): the shadow
        // follows one kind.
        if !self.extras_of(reserved.id()).is_empty() {
            return None;
        }
        let kind = parked.kind;
        if self.headroom[kind.index()] != UNLIMITED || self.budget(kind).is_some() {
            return None;
        }
        let mut free = self.limits.capacity.get(kind) - self.used[kind.index()];
        let mut idle = self.idle_workers.len();
        let slots = usize::from(!parked.slotless);
        let shadow_at = |at: u64, free: u32, idle: usize| Shadow {
            at,
            kind,
            spare_units: free - parked.units,
            spare_slots: idle - slots,
        };
        if free >= parked.units && idle >= slots {
            return Some(shadow_at(now, free, idle));
        }
        for &(ends_by, id) in self.by_end.range((now, 0)..) {
            let Some(claim) = self.running.get(&id) else {
                continue;
            };
            free += self.held_by(claim)[kind.index()];
            if self.retired.get(claim.worker as usize) == Some(&false) {
                idle += 1;
            }
            if free >= parked.units && idle >= slots {
                return Some(shadow_at(ends_by, free, idle));
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes_grow_with_the_timeout_and_split_each_octave_in_four() {
        assert_eq!(class_of(0), 0);
        assert_eq!(class_of(3), 3);
        assert_eq!([4, 5, 6, 7].map(class_of), [4, 5, 6, 7]);
        assert_eq!([8, 9, 10, 12, 15].map(class_of), [8, 8, 9, 10, 11]);
        assert_eq!(class_of(1_000), class_of(1_023));
        assert!(class_of(u32::MAX) < 128);
        let mut previous = 0;
        for timeout in (0..100_000u32).step_by(7) {
            let class = class_of(timeout);
            assert!(class >= previous, "classes are monotone at {timeout}");
            previous = class;
        }
    }

    #[test]
    fn only_classes_up_to_the_limit_and_the_asked_priority_offer_tasks() {
        let rank = |priority, id| RankKey::new(priority, id, id);
        let normal = |id| rank(Priority::Normal, id);
        let mut index = TimeoutIndex::default();
        index.insert(100, ResourceKind::GpuVram, 2, normal(1));
        index.insert(5_000, ResourceKind::GpuVram, 3, normal(0));
        index.insert(10, ResourceKind::GpuVram, 1, rank(Priority::High, 7));
        let free = [10; KINDS];
        let largest = |index: &TimeoutIndex, limit, free: &[u32; KINDS]| {
            index.largest_within(Priority::Normal, limit, free, |_| true)
        };
        // 99 and 100 share a class: the class offers task 1 and `accept` has the last word.
        assert_eq!(largest(&index, 99, &free), Some((2, normal(1))));
        assert_eq!(largest(&index, 50, &free), None);
        assert_eq!(largest(&index, 1_000, &free), Some((2, normal(1))));
        // The larger task wins over the better-ranked one.
        assert_eq!(largest(&index, 6_000, &free), Some((3, normal(0))));
        assert_eq!(largest(&index, 6_000, &[2; KINDS]), Some((2, normal(1))));
        assert_eq!(largest(&index, 6_000, &[1; KINDS]), None);
        assert_eq!(
            index.largest_within(Priority::Normal, 6_000, &free, |r| r.id() == 1),
            Some((2, normal(1)))
        );
        // Other priorities are asked separately.
        assert_eq!(
            index.largest_within(Priority::High, 6_000, &free, |_| true),
            Some((1, rank(Priority::High, 7)))
        );
        assert_eq!(
            index.largest_within(Priority::Low, 6_000, &free, |_| true),
            None
        );
        index.remove(100, ResourceKind::GpuVram, 2, normal(1));
        assert_eq!(largest(&index, 1_000, &free), None);
        assert_eq!(index.len(), 2);
    }
}
