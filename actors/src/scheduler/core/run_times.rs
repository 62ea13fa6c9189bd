//! What rule 23's estimate learns as claims end: the run times seen per cost class and per
//! kind (means that forget), how runs' lengths were spread about what was expected of them,
//! and what those say of a running claim's end. `estimate.rs` states the rules.

use crate::domain::ResourceKind;

use super::running_ends::EndChance;
use super::{ParkingLot, KINDS, NO_WORKER};

/// Size classes: units 0, then one per power of two up to 2^31.
const SIZE_CLASSES: usize = 33;
/// Runs after which a class's mean weighs each new run by 1/`FORGET`.
const FORGET: u32 = 16;

/// A mean that forgets (see the module docs of `estimate.rs`).
#[derive(Debug, Clone, Copy, Default)]
struct Mean {
    value: f64,
    samples: u32,
}

impl Mean {
    fn add(&mut self, value: f64) {
        self.samples = self.samples.saturating_add(1);
        let weight = 1.0 / f64::from(self.samples.min(FORGET));
        self.value += (value - self.value) * weight;
    }

    fn get(&self) -> Option<f64> {
        (self.samples > 0).then_some(self.value)
    }
}

/// Buckets of a run's length over its expected run time: 0 to `RATIO_SPAN` in steps of
/// `RATIO_SPAN / BUCKETS`, the last holding every longer run.
const BUCKETS: usize = 32;
const RATIO_SPAN: f64 = 4.0;

/// How runs' lengths were spread about what the lot expected of them (a run's length over
/// its expected run time when it ended): a histogram that forgets as [`Mean`] does, each
/// bucket holding its weight and the mean ratio of its runs. It answers how long, against
/// its expected run time, a run that has gone on `ratio` times that will run in all.
#[derive(Debug, Clone, Copy, Default)]
struct Spread {
    weight: [f64; BUCKETS],
    /// Per bucket, the weighted sum of its ratios.
    sum: [f64; BUCKETS],
    samples: u32,
}

impl Spread {
    fn add(&mut self, ratio: f64) {
        self.samples = self.samples.saturating_add(1);
        let weight = 1.0 / f64::from(self.samples.min(FORGET));
        for (bucket, sum) in self.weight.iter_mut().zip(&mut self.sum) {
            *bucket *= 1.0 - weight;
            *sum *= 1.0 - weight;
        }
        let bucket = bucket_of(ratio);
        self.weight[bucket] += weight;
        self.sum[bucket] += weight * ratio;
    }

    /// The mean ratio of the runs that went at least `ratio` (a run counts with at least
    /// `ratio`); `None` when no run seen went that far.
    fn mean_beyond(&self, ratio: f64) -> Option<f64> {
        let (weight, sum) = self
            .beyond(ratio)
            .fold((0.0, 0.0), |(weight, sum), (r, w)| {
                (weight + w, sum + w * r)
            });
        (weight > f64::EPSILON).then(|| sum / weight)
    }

    /// The buckets of the runs that went at least `ratio`: each one's mean ratio (at least
    /// `ratio`) and weight.
    fn beyond(&self, ratio: f64) -> impl Iterator<Item = (f64, f64)> + '_ {
        (bucket_of(ratio)..BUCKETS)
            .filter(|&bucket| self.weight[bucket] > f64::EPSILON)
            .map(move |bucket| {
                let weight = self.weight[bucket];
                ((self.sum[bucket] / weight).max(ratio), weight)
            })
    }
}

/// The bucket of a ratio (a run past `RATIO_SPAN` times its expected run time counts in the
/// last).
fn bucket_of(ratio: f64) -> usize {
    ((ratio * (BUCKETS as f64 / RATIO_SPAN)) as usize).min(BUCKETS - 1)
}

/// What the lot learnt of one group of runs: how long they ran, and how much of their
/// execution timeout they used (runs with one).
#[derive(Debug, Clone, Copy, Default)]
struct Seen {
    run_ms: Mean,
    of_timeout: Mean,
}

impl Seen {
    fn add(&mut self, ms: u64, timeout_ms: Option<u64>) {
        self.run_ms.add(ms as f64);
        if let Some(timeout) = timeout_ms.filter(|&timeout| timeout > 0) {
            self.of_timeout.add(ms as f64 / timeout as f64);
        }
    }
}

/// The run times the lot has seen, per cost class and per kind (see the module docs of
/// `estimate.rs`).
#[derive(Debug, Clone)]
pub(super) struct RunTimes {
    /// By `row(kind, slotless)`, then size class.
    classes: Box<[[Seen; SIZE_CLASSES]; KINDS * 2]>,
    /// By `row(kind, slotless)`, every size.
    kinds: [Seen; KINDS * 2],
    /// By `row(kind, slotless)`, every size: how runs' lengths were spread about their
    /// expected run times.
    spread: Box<[Spread; KINDS * 2]>,
}

impl Default for RunTimes {
    fn default() -> Self {
        Self {
            classes: Box::new([[Seen::default(); SIZE_CLASSES]; KINDS * 2]),
            kinds: [Seen::default(); KINDS * 2],
            spread: Box::new([Spread::default(); KINDS * 2]),
        }
    }
}

fn row(kind: ResourceKind, slotless: bool) -> usize {
    kind.index() * 2 + usize::from(slotless)
}

/// The size class of a cost of `units`: 0 for none, else 1 + the position of its top bit.
fn size_class(units: u32) -> usize {
    (u32::BITS - units.leading_zeros()) as usize
}

impl RunTimes {
    /// A claim of `units` of `kind` with this execution timeout ran `ms`.
    pub(super) fn observe(
        &mut self,
        kind: ResourceKind,
        units: u32,
        slotless: bool,
        ms: u64,
        timeout_ms: Option<u64>,
    ) {
        let row = row(kind, slotless);
        // Measured against what the lot expected of it before it learns from it, once its
        // class has been seen (a first run measures how far apart classes are, not runs).
        let class_seen = self.classes[row][size_class(units)].run_ms.samples > 0;
        let expected = self.expected(kind, units, slotless, timeout_ms);
        if let Some(expected) = expected.filter(|&ms| class_seen && ms > 0) {
            self.spread[row].add(ms as f64 / expected as f64);
        }
        self.classes[row][size_class(units)].add(ms, timeout_ms);
        self.kinds[row].add(ms, timeout_ms);
    }

    /// How much longer than its expected run time a run of this kind is expected to take,
    /// given that it has run `ratio` times that: the mean ratio of the runs seen that went
    /// at least that far over the mean ratio of all; `None` when none went that far (or
    /// none was seen).
    fn survival_factor(&self, kind: ResourceKind, slotless: bool, ratio: f64) -> Option<f64> {
        let spread = &self.spread[row(kind, slotless)];
        let all = spread.mean_beyond(0.0)?;
        let beyond = spread.mean_beyond(ratio)?;
        Some((beyond / all).max(1.0))
    }

    /// Whether a run of `kind` (task or permit) was seen: until one is, a timeout stands in
    /// for every run time of the kind.
    pub(super) fn seen(&self, kind: ResourceKind) -> bool {
        [false, true]
            .into_iter()
            .any(|slotless| self.kinds[row(kind, slotless)].run_ms.samples > 0)
    }

    /// The run time expected of a ticket (see the module docs of `estimate.rs`).
    pub(super) fn expected(
        &self,
        kind: ResourceKind,
        units: u32,
        slotless: bool,
        timeout_ms: Option<u64>,
    ) -> Option<u64> {
        let row = row(kind, slotless);
        let (class, kind) = (&self.classes[row][size_class(units)], &self.kinds[row]);
        let Some(timeout) = timeout_ms else {
            return class
                .run_ms
                .get()
                .or(kind.run_ms.get())
                .map(|ms| ms.round() as u64);
        };
        let share = class.of_timeout.get().or(kind.of_timeout.get());
        let seen = share
            .map(|share| share * timeout as f64)
            .or(class.run_ms.get())
            .or(kind.run_ms.get());
        Some(seen.map_or(timeout, |ms| (ms.round() as u64).min(timeout)))
    }
}

impl ParkingLot {
    /// When running `claim` is expected to end, as of `now` (see the module docs of
    /// `estimate.rs`): `None` when its run time is unknown.
    pub(super) fn expected_end(&self, claim: &super::Claim, now: u64) -> Option<u64> {
        let timeout =
            (claim.timeout_ms != super::NO_TIMEOUT).then_some(u64::from(claim.timeout_ms));
        let run_ms = self.run_times.expected(
            claim.kind,
            claim.declared,
            claim.worker == NO_WORKER,
            timeout,
        )?;
        let expected = claim.started_ms.saturating_add(run_ms);
        let ran = now.saturating_sub(claim.started_ms);
        // A run that has gone on this long is among the longer ones: it is expected to run
        // as long, against its expected run time, as the runs seen that went as far did.
        let ratio = ran as f64 / run_ms.max(1) as f64;
        let slotless = claim.worker == NO_WORKER;
        if let Some(factor) = self.run_times.survival_factor(claim.kind, slotless, ratio) {
            let longer = (run_ms as f64 * factor).round() as u64;
            let longer = timeout.map_or(longer, |timeout| longer.min(timeout));
            return Some(claim.started_ms.saturating_add(longer).max(now));
        }
        if expected > now {
            return Some(expected);
        }
        // Late: a run that outlived its expected time is expected to end halfway between
        // now and its timeout; without a timeout, to run as long again as it has run (run
        // times have heavy tails: the longer a run has gone on, the longer it tends to go on).
        let Some(timeout) = timeout else {
            return Some(now.saturating_add(ran.max(run_ms)));
        };
        let timed_out = claim.started_ms.saturating_add(timeout);
        Some(now.max(now / 2 + timed_out / 2))
    }

    /// The instants at which running `claim` (the `index`th, expected to end at `end`) may
    /// end, as of `now`, each with its chance: one for each bucket of the runs seen that
    /// went as far as it has (see the module docs of `estimate.rs`), or its expected end
    /// alone.
    pub(super) fn end_chances(
        &self,
        claim: &super::Claim,
        end: u64,
        now: u64,
        index: usize,
        chances: &mut Vec<EndChance>,
    ) {
        let timeout =
            (claim.timeout_ms != super::NO_TIMEOUT).then_some(u64::from(claim.timeout_ms));
        let slotless = claim.worker == NO_WORKER;
        let run_ms = self
            .run_times
            .expected(claim.kind, claim.declared, slotless, timeout)
            .unwrap_or(0)
            .max(1);
        let ratio = now.saturating_sub(claim.started_ms) as f64 / run_ms as f64;
        let spread = &self.run_times.spread[row(claim.kind, slotless)];
        let weight: f64 = spread.beyond(ratio).map(|(_, weight)| weight).sum();
        let Some(all) = spread.mean_beyond(0.0).filter(|_| weight > f64::EPSILON) else {
            chances.push((end, index, 1.0));
            return;
        };
        for (r, w) in spread.beyond(ratio) {
            let length = (run_ms as f64 * r / all).round() as u64;
            let length = timeout.map_or(length, |timeout| length.min(timeout));
            let at = claim.started_ms.saturating_add(length).max(now);
            chances.push((at, index, w / weight));
        }
    }
}
