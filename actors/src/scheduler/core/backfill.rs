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
//! # Shape
//!
//! Parked tasks with a timeout are indexed a second time, by timeout class: classes split
//! each power of two into four (1–3 ms are classes of their own), so a class's timeouts
//! differ by less than a quarter. Each class holds one [`CostIndex`] per kind. A query for
//! tasks ending within `limit` ms asks every class up to `limit`'s own for its best task that
//! fits the free units: 32 steps per class and kind. In `limit`'s own class only part of the
//! tasks may qualify, so its answer is checked against the exact timeout; if it does not
//! qualify that class offers nothing this time. Tasks for the spare room are asked of every
//! class, with R's kind bounded by the spare units. A backfill can so miss a task that would
//! have qualified (never start one that does not): it errs on the side of the reservation.
//!
//! # Cost
//!
//! At most 4·32 = 128 classes, each a 32-step walk per kind in use: O(1) in the number of
//! parked tasks. Parking or removing a task with a timeout costs one more O(log n) index
//! update, and about 40 more bytes per such task while it is parked.

use std::collections::BTreeMap;

use super::{CostIndex, RankKey, KINDS};
use crate::domain::ResourceKind;

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

/// Parked tasks with a timeout, by timeout class and kind.
#[derive(Debug, Clone, Default)]
pub(super) struct TimeoutIndex {
    classes: BTreeMap<u8, [CostIndex; KINDS]>,
}

impl TimeoutIndex {
    pub(super) fn insert(
        &mut self,
        timeout_ms: u32,
        kind: ResourceKind,
        units: u32,
        rank: RankKey,
    ) {
        self.classes.entry(class_of(timeout_ms)).or_default()[kind.index()].insert(units, rank);
    }

    pub(super) fn remove(
        &mut self,
        timeout_ms: u32,
        kind: ResourceKind,
        units: u32,
        rank: RankKey,
    ) {
        let class = class_of(timeout_ms);
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

    /// The best-ranked task whose timeout is at most `limit_ms` and that fits `free`, among
    /// those `accept` takes (`accept` checks the exact timeout and anything else the caller
    /// requires). Each class and kind offers its best fitting task only.
    pub(super) fn best_within(
        &self,
        limit_ms: u64,
        free: &[u32; KINDS],
        accept: impl Fn(RankKey) -> bool,
    ) -> Option<RankKey> {
        let last = class_of(u32::try_from(limit_ms).unwrap_or(u32::MAX));
        let mut best: Option<RankKey> = None;
        for indexes in self.classes.range(..=last).map(|(_, indexes)| indexes) {
            for (kind, index) in indexes.iter().enumerate() {
                let Some(candidate) = index.best_within(free[kind]) else {
                    continue;
                };
                if best.is_some_and(|best| best <= candidate) || !accept(candidate) {
                    continue;
                }
                best = Some(candidate);
            }
        }
        best
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
    fn only_classes_up_to_the_limit_offer_tasks() {
        use crate::domain::Priority;
        let rank = |id| RankKey::new(Priority::Normal, id, id);
        let mut index = TimeoutIndex::default();
        index.insert(100, ResourceKind::GpuVram, 2, rank(1));
        index.insert(5_000, ResourceKind::GpuVram, 2, rank(0));
        let free = [10; KINDS];
        // 99 and 100 share a class: the class offers task 1 and `accept` has the last word.
        assert_eq!(index.best_within(99, &free, |_| true), Some(rank(1)));
        assert_eq!(index.best_within(50, &free, |_| true), None);
        assert_eq!(index.best_within(1_000, &free, |_| true), Some(rank(1)));
        assert_eq!(index.best_within(6_000, &free, |_| true), Some(rank(0)));
        assert_eq!(index.best_within(6_000, &[1; KINDS], |_| true), None);
        assert_eq!(
            index.best_within(6_000, &free, |r| r.id() == 1),
            Some(rank(1))
        );
        index.remove(100, ResourceKind::GpuVram, 2, rank(1));
        assert_eq!(index.best_within(1_000, &free, |_| true), None);
        assert_eq!(index.len(), 1);
    }
}
