//! Rule 15: kinds whose units refill with time (token buckets), in whole-number arithmetic.
//!
//! A bucket's level is kept in units times the refill period in ms, so that a millisecond
//! of refill (`units` of those) is a whole number and no fraction is ever rounded away:
//! after `t` ms the level has grown by exactly `units * t`, capped at `burst * per_ms`.
//! Products fit a `u128` with room to spare (`u32::MAX * MAX_PERIOD_MS` is below 2^59).

use crate::domain::{Budget, ResourceKind, TaskId};

use super::FastMap;

/// A token bucket: `units` every `per_ms`, at most `burst` at once, in whole-number
/// arithmetic (see the module docs). The core keeps one per budget; a shared queue that
/// keeps a fleet's budget (the in-memory one) uses the same.
///
/// ```
/// use prometheus_parking_lot_actors::scheduler::core::TokenBucket;
///
/// // 10 units a second, at most 10 at once; it starts full.
/// let mut bucket = TokenBucket::new(10, 1_000, 10);
/// bucket.spend(10);
/// assert_eq!(bucket.whole(), 0);
/// assert_eq!(bucket.holds_at(3), 300, "3 units are back after 300 ms");
/// bucket.refill(300);
/// assert_eq!(bucket.whole(), 3);
/// ```
#[derive(Debug, Clone)]
pub struct TokenBucket {
    units: u128,
    per_ms: u128,
    /// The level's cap, scaled: `burst * per_ms`.
    full: u128,
    /// The level, scaled by `per_ms`, as of `at_ms`.
    level: u128,
    at_ms: u64,
}

impl TokenBucket {
    /// A full bucket, as of time 0.
    pub fn new(units: u32, per_ms: u64, burst: u32) -> Self {
        let per_ms = u128::from(per_ms.max(1));
        let full = u128::from(burst) * per_ms;
        Self {
            units: u128::from(units.max(1)),
            per_ms,
            full,
            level: full,
            at_ms: 0,
        }
    }

    /// Adds the refill since the last call; time that goes backwards adds nothing.
    pub fn refill(&mut self, now: u64) {
        if now > self.at_ms {
            let grown = u128::from(now - self.at_ms) * self.units;
            self.level = self.level.saturating_add(grown).min(self.full);
            self.at_ms = now;
        }
    }

    /// Whole units in the bucket.
    pub fn whole(&self) -> u32 {
        u32::try_from(self.level / self.per_ms).unwrap_or(u32::MAX)
    }

    /// Takes `units` out, or what is left when it holds fewer (the caller checks
    /// [`whole`](Self::whole) first).
    pub fn spend(&mut self, units: u32) {
        self.level = self.level.saturating_sub(u128::from(units) * self.per_ms);
    }

    /// Puts `units` back, up to the burst.
    pub fn give_back(&mut self, units: u32) {
        self.level = (self.level + u128::from(units) * self.per_ms).min(self.full);
    }

    /// When the bucket will hold `units` whole units, counting from its last refill; the
    /// last refill's time if it holds them already.
    pub fn holds_at(&self, units: u32) -> u64 {
        let wanted = u128::from(units) * self.per_ms;
        let short = wanted.saturating_sub(self.level);
        let wait = short.div_ceil(self.units);
        self.at_ms
            .saturating_add(u64::try_from(wait).unwrap_or(u64::MAX))
    }
}

/// The budget of one kind: its units, and its starts when it caps them.
#[derive(Debug, Clone)]
pub(super) struct KindBudget {
    units: TokenBucket,
    starts: Option<TokenBucket>,
    /// Units each running task of the kind spent and may still give back.
    spent: FastMap<TaskId, u32>,
}

/// The budgets of a pool's kinds (rule 15).
#[derive(Debug, Clone, Default)]
pub(super) struct Budgets {
    by_kind: [Option<KindBudget>; ResourceKind::COUNT],
}

impl Budgets {
    /// Full buckets for every kind the limits give a budget; `None` when none has one.
    pub(super) fn new(budgets: &crate::domain::Budgets) -> Option<Box<Self>> {
        if budgets.is_empty() {
            return None;
        }
        let mut all = Self::default();
        for (kind, budget) in budgets.iter() {
            all.by_kind[kind.index()] = Some(KindBudget::new(budget));
        }
        Some(Box::new(all))
    }

    pub(super) fn of(&self, kind: ResourceKind) -> Option<&KindBudget> {
        self.by_kind[kind.index()].as_ref()
    }

    pub(super) fn of_mut(&mut self, kind: ResourceKind) -> Option<&mut KindBudget> {
        self.by_kind[kind.index()].as_mut()
    }

    /// Brings every bucket to `now`.
    pub(super) fn refill(&mut self, now: u64) {
        for budget in self.by_kind.iter_mut().flatten() {
            budget.units.refill(now);
            if let Some(starts) = &mut budget.starts {
                starts.refill(now);
            }
        }
    }

    /// Each kind with a budget.
    pub(super) fn kinds(&self) -> impl Iterator<Item = (ResourceKind, &KindBudget)> {
        ResourceKind::ALL
            .into_iter()
            .zip(&self.by_kind)
            .filter_map(|(kind, budget)| Some((kind, budget.as_ref()?)))
    }
}

impl KindBudget {
    fn new(budget: &Budget) -> Self {
        Self {
            units: TokenBucket::new(budget.units, budget.per_ms, budget.burst),
            starts: budget
                .max_starts
                .map(|cap| TokenBucket::new(cap.count, cap.per_ms, cap.count)),
            spent: FastMap::default(),
        }
    }

    /// Units a task may start with now: the whole units in the bucket, or none while the
    /// starts bucket has no whole start left.
    pub(super) fn free(&self) -> u32 {
        match &self.starts {
            Some(starts) if starts.whole() == 0 => 0,
            _ => self.units.whole(),
        }
    }

    /// Whether the budget caps starts.
    pub(super) fn caps_starts(&self) -> bool {
        self.starts.is_some()
    }

    /// Whole units in the bucket (starts aside).
    pub(super) fn level(&self) -> u32 {
        self.units.whole()
    }

    /// Task `id` starts with `units`, which the caller checked are [`free`](Self::free).
    pub(super) fn start(&mut self, id: TaskId, units: u32) {
        self.units.spend(units);
        if let Some(starts) = &mut self.starts {
            starts.spend(1);
        }
        if units > 0 {
            self.spent.insert(id, units);
        }
    }

    /// Running task `id` spends `units` more (a permit's growth).
    pub(super) fn grow(&mut self, id: TaskId, units: u32) {
        self.units.spend(units);
        *self.spent.entry(id).or_default() += units;
    }

    /// Running task `id` gives back up to `units` of what it spent; returns how many.
    pub(super) fn give_back(&mut self, id: TaskId, units: u32) -> u32 {
        let Some(spent) = self.spent.get_mut(&id) else {
            return 0;
        };
        let back = units.min(*spent);
        *spent -= back;
        if *spent == 0 {
            self.spent.remove(&id);
        }
        self.units.give_back(back);
        back
    }

    /// Task `id` ended: what it spent stays spent.
    pub(super) fn end(&mut self, id: TaskId) {
        self.spent.remove(&id);
    }

    /// The tasks that spent units and may still give some back.
    pub(super) fn spenders(&self) -> impl Iterator<Item = &TaskId> {
        self.spent.keys()
    }

    /// Units task `id` spent and may still give back.
    pub(super) fn spent_by(&self, id: TaskId) -> u32 {
        self.spent.get(&id).copied().unwrap_or(0)
    }

    /// When a task of `units` could start as far as this budget goes (more units, and a
    /// start, in the buckets), counting from the last refill: the time of the last refill
    /// if it could start then.
    pub(super) fn ready_at(&self, units: u32) -> u64 {
        let for_units = self.units.holds_at(units);
        match &self.starts {
            Some(starts) => for_units.max(starts.holds_at(1)),
            None => for_units,
        }
    }

    /// When a start becomes possible that is not possible now: the refill that brings a
    /// start back (when none is left), or the one that brings the level to `next_cost`
    /// (the smallest parked cost above it). `None` when refills change nothing a parked
    /// task waits for.
    pub(super) fn next_change(&self, next_cost: Option<u32>) -> Option<u64> {
        if let Some(starts) = &self.starts {
            if starts.whole() == 0 {
                return Some(starts.holds_at(1));
            }
        }
        next_cost.map(|units| self.units.holds_at(units))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bucket_refills_evenly_and_stops_at_its_burst() {
        // 10 units a second, burst 10.
        let mut bucket = TokenBucket::new(10, 1_000, 10);
        assert_eq!(bucket.whole(), 10, "it starts full");
        bucket.spend(10);
        bucket.refill(99);
        assert_eq!(bucket.whole(), 0, "one unit takes 100 ms");
        bucket.refill(100);
        assert_eq!(bucket.whole(), 1);
        assert_eq!(bucket.holds_at(4), 400, "three more units, 300 ms later");
        bucket.refill(50);
        assert_eq!(bucket.whole(), 1, "time going back adds nothing");
        bucket.refill(60_000);
        assert_eq!(bucket.whole(), 10, "never past the burst");
        assert_eq!(bucket.holds_at(10), 60_000, "full now");
    }

    #[test]
    fn fractions_of_a_unit_are_kept_between_refills() {
        // 3 units every 1,000 ms: one every 333.3 ms.
        let mut bucket = TokenBucket::new(3, 1_000, 3);
        bucket.spend(3);
        for now in (1..=1_000).step_by(7) {
            bucket.refill(now);
        }
        bucket.refill(1_000);
        assert_eq!(
            bucket.whole(),
            3,
            "three units after a period, however it was sliced"
        );
    }

    #[test]
    fn a_start_cap_blocks_until_a_start_comes_back() {
        let budget = Budget::new(100, std::time::Duration::from_secs(1))
            .with_max_starts(2, std::time::Duration::from_secs(1));
        let mut kind = KindBudget::new(&budget);
        kind.start(1, 10);
        kind.start(2, 10);
        assert_eq!(kind.free(), 0, "two starts a second");
        assert_eq!(kind.level(), 80);
        assert_eq!(kind.next_change(None), Some(500), "a start every 500 ms");
        assert_eq!(kind.give_back(1, 25), 10, "only what it spent");
        assert_eq!(kind.level(), 90);
        assert_eq!(kind.give_back(1, 5), 0, "given back already");
    }
}
