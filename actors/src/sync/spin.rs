//! Bounded spinning: how the engine's threads wait a few microseconds for work that is
//! usually about to arrive before they sleep.
//!
//! A wake-up through the kernel costs tens of microseconds on a virtual machine; under load
//! the next job, submission, answer or result usually comes within a few, so each waiting
//! side first re-checks for a short while, yielding the CPU (`sched_yield`) between checks.
//! Every spin is bounded twice: by a number of rounds, and by wall time ([`Spin`]). The
//! second bound matters on an oversubscribed machine: there a yield hands the core to
//! another runnable thread for a whole time slice, so a spin counted in rounds alone could
//! last hundreds of milliseconds while the spinner's own messages wait. Once a spin's time
//! is up it stops, and the waiter sleeps until it is woken.
//!
//! [`AdaptiveSpin`] adds a learned budget for waits that are often long (a retrieve whose
//! task takes seconds, an admission answer that waits for a database to store the task), so
//! failing spins stop costing CPU.
//!
//! # Adaptive spinning
//!
//! A retrieve that finds no result yet can sleep at once or re-check for a few microseconds
//! first. Which pays depends on the load: when one client reads results about as fast as the
//! workers store them, the next result comes within the spin and spinning spares one
//! wake-up per result; when many clients wait on long tasks, every spin fails and only burns
//! a thread the runtime could give to another client.
//!
//! ## Algorithm
//!
//! A shared budget of spin rounds (at most [`MAX_ROUNDS`]) learns which case holds, like an
//! adaptive mutex: a spin that succeeds grows the budget back to the maximum; one that
//! fails halves it. At zero, waiters sleep at once, but every [`PROBE_EVERY`]th one probes
//! with [`PROBE_ROUNDS`] rounds, so the budget recovers when the load changes. The budget is
//! a heuristic shared without ordering constraints (`Relaxed`): a lost update only changes
//! how long the next waiter spins, never what it receives.

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

/// A spin bounded by rounds and by wall time. See the module docs.
pub(crate) struct Spin {
    rounds_left: u32,
    until: Instant,
}

impl Spin {
    /// A spin of at most `rounds` yields and at most `time` of wall time.
    pub(crate) fn new(rounds: u32, time: Duration) -> Self {
        let now = Instant::now();
        Self {
            rounds_left: rounds,
            until: now.checked_add(time).unwrap_or(now),
        }
    }

    /// Yields the CPU once; `false` (without yielding) once the rounds or the time are spent.
    pub(crate) fn round(&mut self) -> bool {
        if self.rounds_left == 0 || Instant::now() >= self.until {
            return false;
        }
        self.rounds_left -= 1;
        std::thread::yield_now();
        true
    }
}

/// The wall-time bound of the engine's spins: an idle machine yields in well under a
/// microsecond, so this allows every counted round there, and cuts a spin short where yields
/// hand the core away for whole time slices.
pub(crate) const SPIN_TIME: Duration = Duration::from_micros(50);

/// The most rounds (one `sched_yield` and one check each) a waiter spins.
pub(crate) const MAX_ROUNDS: u32 = 32;
/// Rounds of a probe spin while the budget is zero.
const PROBE_ROUNDS: u32 = 4;
/// While the budget is zero, one waiter in this many probes.
const PROBE_EVERY: u32 = 32;

/// See the module docs.
#[derive(Debug)]
pub(crate) struct AdaptiveSpin {
    /// The budget a success restores.
    max: u32,
    budget: AtomicU32,
    skipped: AtomicU32,
    /// The wall-time bound of each spin.
    time: Duration,
}

impl AdaptiveSpin {
    pub(crate) fn new() -> Self {
        Self::with_limits(MAX_ROUNDS, SPIN_TIME)
    }

    /// A spin whose budget is at most `rounds` (instead of [`MAX_ROUNDS`]).
    pub(crate) fn with_max(rounds: u32) -> Self {
        Self::with_limits(rounds, SPIN_TIME)
    }

    /// A spin of at most `rounds` rounds and `time` of wall time each.
    fn with_limits(rounds: u32, time: Duration) -> Self {
        Self {
            max: rounds,
            budget: AtomicU32::new(rounds),
            skipped: AtomicU32::new(0),
            time,
        }
    }

    /// Calls `check` up to the current budget of rounds, yielding the CPU before each;
    /// returns its first `Some`, or `None` if the spin failed (or was skipped).
    pub(crate) fn spin<T>(&self, mut check: impl FnMut() -> Option<T>) -> Option<T> {
        let budget = self.budget.load(Ordering::Relaxed);
        let rounds = if budget > 0 {
            budget
        } else if self.skipped.fetch_add(1, Ordering::Relaxed) % PROBE_EVERY == PROBE_EVERY - 1 {
            PROBE_ROUNDS
        } else {
            return None;
        };
        let mut spin = Spin::new(rounds, self.time);
        while spin.round() {
            if let Some(found) = check() {
                self.budget.store(self.max, Ordering::Relaxed);
                return Some(found);
            }
        }
        self.budget.store(budget / 2, Ordering::Relaxed);
        None
    }

    /// The current budget, in rounds.
    #[cfg(test)]
    fn budget(&self) -> u32 {
        self.budget.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A wall-time bound the tests never reach, so they count rounds only, however loaded
    /// the machine is.
    const NO_TIME_LIMIT: Duration = Duration::from_secs(3_600);

    #[test]
    fn a_spin_stops_at_its_rounds_or_its_time_whichever_comes_first() {
        let mut spin = Spin::new(3, NO_TIME_LIMIT);
        assert!(spin.round() && spin.round() && spin.round());
        assert!(!spin.round(), "three rounds spent");
        let mut spin = Spin::new(1_000, Duration::ZERO);
        assert!(!spin.round(), "no time at all");
    }

    #[test]
    fn a_failing_spin_halves_the_budget_and_a_success_restores_it() {
        let spin = AdaptiveSpin::with_limits(MAX_ROUNDS, NO_TIME_LIMIT);
        let mut checks = 0;
        assert_eq!(
            spin.spin(|| {
                checks += 1;
                None::<()>
            }),
            None
        );
        assert_eq!(checks, MAX_ROUNDS);
        assert_eq!(spin.budget(), MAX_ROUNDS / 2);

        let mut checks = 0;
        let found = spin.spin(|| {
            checks += 1;
            (checks == 3).then_some("result")
        });
        assert_eq!(found, Some("result"));
        assert_eq!(spin.budget(), MAX_ROUNDS);
    }

    #[test]
    fn a_success_restores_the_spins_own_maximum() {
        let spin = AdaptiveSpin::with_limits(64, NO_TIME_LIMIT);
        let mut checks = 0;
        spin.spin(|| {
            checks += 1;
            None::<()>
        });
        assert_eq!(checks, 64);
        assert_eq!(spin.budget(), 32);
        assert_eq!(spin.spin(|| Some(())), Some(()));
        assert_eq!(spin.budget(), 64);
    }

    #[test]
    fn at_zero_budget_only_every_probe_spins_and_a_probe_success_recovers() {
        let spin = AdaptiveSpin::with_limits(MAX_ROUNDS, NO_TIME_LIMIT);
        while spin.budget() > 0 {
            spin.spin(|| None::<()>);
        }
        let mut spun = 0;
        for _ in 0..PROBE_EVERY * 2 {
            let mut checks = 0;
            spin.spin(|| {
                checks += 1;
                None::<()>
            });
            if checks > 0 {
                assert_eq!(checks, PROBE_ROUNDS, "a probe spins the probe rounds");
                spun += 1;
            }
        }
        assert_eq!(spun, 2, "one waiter in PROBE_EVERY probes");
        assert_eq!(spin.budget(), 0);

        let mut found = None;
        for _ in 0..PROBE_EVERY {
            found = found.or_else(|| spin.spin(|| Some(7)));
        }
        assert_eq!(found, Some(7));
        assert_eq!(
            spin.budget(),
            MAX_ROUNDS,
            "a successful probe restores the budget"
        );
    }
}
