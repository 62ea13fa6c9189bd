//! When the running claims are expected to end, as a group (rule 23's estimate).
//!
//! Each running claim may end at one of a few instants, each with its chance (what the lot
//! saw of runs that went as far, see `estimate.rs`). A parked ticket waits for the first of
//! them to end, or the first few: and the first of several uncertain ends comes earlier than
//! the first of their expected ends (with ten claims each ending anywhere in the next ten
//! seconds, the first end is expected within one, not at five). So the estimate's copy of the
//! lot ends its running claims at the expected *order statistics* of their ends: the first
//! (in the order of their own expected ends) at the expected instant of the first end of
//! any, the second at that of the second, and so on.
//!
//! # Algorithm
//!
//! `E[T(k)] = now + integral of P(T(k) > t) dt`, and the `k`th end is after `t` exactly when
//! fewer than `k` claims have ended by `t`. With the claims' ends independent, the number
//! `N(t)` of claims ended by `t` is a sum of Bernoulli variables of chances `F_i(t)` (a
//! Poisson binomial law). The instants at which a claim may end are walked in time order;
//! between two, the expected `k`th end of every `k` gains the time passed times
//! `P(N(t) < k)`. For up to [`EXACT_CLAIMS`] claims that law is rebuilt exactly at each
//! instant, O(m²). Past them the normal law of the same mean (`sum F_i`) and variance
//! (`sum F_i (1 - F_i)`) stands in for it, with a continuity correction (`P(N <= k - 1/2)`),
//! updated in O(1) an instant: a sum of many Bernoulli variables is close to normal. (Updating
//! the exact law by dividing a claim's old chance out is numerically unstable past a few
//! dozen claims.) With no end uncertain (one instant per claim) either way gives exactly the
//! claims' instants in order.
//!
//! # Cost
//!
//! For p instants among m claims (at most 32 a claim): O(p log p + p m²) up to
//! [`EXACT_CLAIMS`] claims (at most 32 · 16³, about 131,000 steps), O(p log p + p m) past
//! them. The estimate spreads the ends of at most [`SPREAD_CLAIMS`] claims and ends those of
//! a larger lot at their own expected ends.

/// The most running claims for which the law of the number ended is computed exactly;
/// past this the normal law stands in for it.
const EXACT_CLAIMS: usize = 16;

/// The most running claims whose ends are spread (see the module docs); past this the
/// estimate ends each at its own expected end.
pub(super) const SPREAD_CLAIMS: usize = 64;

/// One instant at which a running claim may end: `(at, claim, chance)`, `claim` indexing
/// the claims from 0, the chances of one claim adding up to 1.
pub(super) type EndChance = (u64, usize, f64);

/// The expected instants of the first, second, ..., `claims`th end among `claims` running
/// claims, from `now`, given the instants at which each may end (see the module docs).
pub(super) fn expected_order(mut chances: Vec<EndChance>, claims: usize, now: u64) -> Vec<u64> {
    chances.sort_unstable_by(|a, b| a.0.cmp(&b.0).then(a.1.cmp(&b.1)));
    let mut ended = vec![0.0f64; claims];
    let (mut mean, mut variance) = (0.0f64, 0.0f64);
    // `waited[k]`: the expected wait for the (k + 1)th end, so far.
    let mut waited = vec![0.0f64; claims];
    let mut at = now;
    for (instant, claim, chance) in chances {
        let instant = instant.max(now);
        if instant > at {
            let passed = (instant - at) as f64;
            if claims <= EXACT_CLAIMS {
                let count = ended_count(&ended);
                let mut fewer = 0.0;
                for (k, wait) in waited.iter_mut().enumerate() {
                    fewer += count[k];
                    *wait += passed * fewer.min(1.0);
                }
            } else {
                let spread = variance.max(0.0).sqrt();
                for (k, wait) in waited.iter_mut().enumerate() {
                    *wait += passed * fewer_than(k + 1, mean, spread);
                }
            }
            at = instant;
        }
        let before = ended[claim];
        let after = (before + chance).min(1.0);
        mean += after - before;
        variance += after * (1.0 - after) - before * (1.0 - before);
        ended[claim] = after;
    }
    waited
        .into_iter()
        .map(|wait| now.saturating_add(wait.round() as u64))
        .collect()
}

/// The exact law of the number of claims ended, given each one's chance of having ended:
/// `count[j]` is the chance that exactly `j` have. O(m²).
fn ended_count(ended: &[f64]) -> Vec<f64> {
    let mut count = vec![0.0; ended.len() + 1];
    count[0] = 1.0;
    for (claims, &p) in ended.iter().enumerate().filter(|(_, &p)| p > 0.0) {
        for j in (1..=claims + 1).rev() {
            count[j] = (1.0 - p) * count[j] + p * count[j - 1];
        }
        count[0] *= 1.0 - p;
    }
    count
}

/// `P(N < k)` for a count `N` of this mean and standard deviation, by the normal law with
/// a continuity correction; a step at `k - 1/2` when nothing is uncertain.
fn fewer_than(k: usize, mean: f64, spread: f64) -> f64 {
    let edge = k as f64 - 0.5 - mean;
    if spread < 1e-9 {
        return if edge > 0.0 { 1.0 } else { 0.0 };
    }
    normal_below(edge / spread)
}

/// The standard normal law's `P(Z < x)` (Abramowitz and Stegun 7.1.26, within 1e-7).
fn normal_below(x: f64) -> f64 {
    let z = x.abs() / std::f64::consts::SQRT_2;
    let t = 1.0 / (1.0 + 0.327_591_1 * z);
    let poly = t
        * (0.254_829_592
            + t * (-0.284_496_736
                + t * (1.421_413_741 + t * (-1.453_152_027 + t * 1.061_405_429))));
    let erf = 1.0 - poly * (-z * z).exp();
    if x >= 0.0 {
        0.5 * (1.0 + erf)
    } else {
        0.5 * (1.0 - erf)
    }
}
