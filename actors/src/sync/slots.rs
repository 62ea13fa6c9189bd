//! A lock-free slot budget: how nested work submitted from a pool's own workers is kept from
//! deadlocking the pool.
//!
//! # The deadlock it prevents
//!
//! A pool has `W` worker threads. A task running on one of them submits a child task to the
//! same pool and waits for the child's result. If all `W` workers run such parents at once,
//! every child parks waiting for a worker, and every worker waits for a child: nothing can
//! ever finish. Waiting with a timeout only turns the deadlock into failures after the fact.
//!
//! # The rule
//!
//! Each pool has a budget of `W - 1` *nested slots*. A task submitted from one of the pool's
//! own worker threads (a child) must take a slot at submission, without waiting
//! ([`SlotBudget::try_acquire`]); the slot is held until the child ends. When none is free
//! the submission fails at once (`PoolError::NestedBudgetExhausted`) instead of parking.
//! A parent can only wait on its own outstanding children, so at most `W - 1` workers are
//! ever waiting on nested work and at least one worker is idle or runs a task that waits on
//! nothing: it finishes, and its worker takes the next task, children included. The bound is
//! the seed's `live waiting workers <= slots`, with `slots = W - 1`.
//!
//! # Algorithm
//!
//! One atomic counter of held slots. `try_acquire` is a compare-and-swap loop that never
//! lets the count pass the capacity (not an add-then-give-back, which would let a racing
//! acquirer fail while a slot is free). `release` is a compare-and-swap loop too and panics
//! when no slot is held: releasing what was never acquired is a caller bug, and a clamped
//! decrement could race with a valid acquire and erase its slot. Release happens through the
//! RAII [`SlotGuard`], so every path that ends a child (finish, panic, cancel, timeout,
//! shutdown, refusal) gives its slot back exactly once.
//!
//! ```
//! use prometheus_parking_lot_actors::sync::slots::SlotBudget;
//!
//! let budget = SlotBudget::new(1);
//! let slot = budget.try_acquire().expect("one slot is free");
//! assert!(budget.try_acquire().is_none(), "the only slot is held");
//! assert_eq!((budget.held(), budget.available()), (1, 0));
//! drop(slot);
//! assert_eq!(budget.available(), 1);
//! ```

use std::sync::Arc;

#[cfg(loom)]
use loom::sync::atomic::{AtomicUsize, Ordering};
#[cfg(not(loom))]
use std::sync::atomic::{AtomicUsize, Ordering};

/// A fixed number of slots, taken and given back without locks. See the module docs.
#[derive(Debug)]
pub struct SlotBudget {
    held: AtomicUsize,
    capacity: usize,
}

impl SlotBudget {
    /// A budget of `capacity` slots, all free.
    pub fn new(capacity: usize) -> Arc<Self> {
        Arc::new(Self {
            held: AtomicUsize::new(0),
            capacity,
        })
    }

    /// How many slots the budget has.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// How many slots are free now.
    pub fn available(&self) -> usize {
        self.capacity.saturating_sub(self.held())
    }

    /// How many slots are held now.
    pub fn held(&self) -> usize {
        self.held.load(Ordering::Acquire)
    }

    /// Takes one slot if one is free, without waiting; `None` if all are held. The slot is
    /// given back when the guard drops.
    pub fn try_acquire(self: &Arc<Self>) -> Option<SlotGuard> {
        let mut held = self.held.load(Ordering::Relaxed);
        loop {
            if held >= self.capacity {
                return None;
            }
            match self
                .held
                .compare_exchange(held, held + 1, Ordering::AcqRel, Ordering::Relaxed)
            {
                Ok(_) => {
                    return Some(SlotGuard {
                        budget: Arc::clone(self),
                    })
                }
                Err(now) => held = now,
            }
        }
    }

    /// Gives one slot back.
    ///
    /// # Panics
    ///
    /// When no slot is held: a release without an acquire is a bug, never clamped away.
    pub fn release(&self) {
        let mut held = self.held.load(Ordering::Relaxed);
        loop {
            assert!(held > 0, "SlotBudget::release without a held slot");
            match self
                .held
                .compare_exchange(held, held - 1, Ordering::AcqRel, Ordering::Relaxed)
            {
                Ok(_) => return,
                Err(now) => held = now,
            }
        }
    }
}

/// One held slot of a [`SlotBudget`]; dropping it gives the slot back.
#[derive(Debug)]
pub struct SlotGuard {
    budget: Arc<SlotBudget>,
}

impl SlotGuard {
    /// The budget this slot belongs to.
    pub fn budget(&self) -> &Arc<SlotBudget> {
        &self.budget
    }
}

impl Drop for SlotGuard {
    fn drop(&mut self) {
        self.budget.release();
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn slots_are_taken_up_to_the_capacity_and_given_back_by_their_guards() {
        let budget = SlotBudget::new(2);
        let first = budget.try_acquire().expect("free");
        let second = budget.try_acquire().expect("free");
        assert!(budget.try_acquire().is_none());
        assert_eq!((budget.held(), budget.available()), (2, 0));
        drop(first);
        assert_eq!((budget.held(), budget.available()), (1, 1));
        let third = budget.try_acquire().expect("the freed slot");
        drop((second, third));
        assert_eq!((budget.held(), budget.available()), (0, 2));
    }

    #[test]
    fn a_budget_of_zero_refuses_every_acquire() {
        let budget = SlotBudget::new(0);
        assert!(budget.try_acquire().is_none());
        assert_eq!(budget.available(), 0);
    }

    #[test]
    #[should_panic(expected = "release without a held slot")]
    fn a_release_without_a_held_slot_panics() {
        SlotBudget::new(3).release();
    }

    #[test]
    fn racing_threads_never_hold_more_than_the_capacity() {
        let budget = SlotBudget::new(3);
        let peak = Arc::new(AtomicUsize::new(0));
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let (budget, peak) = (budget.clone(), peak.clone());
                std::thread::spawn(move || {
                    for _ in 0..10_000 {
                        if let Some(slot) = budget.try_acquire() {
                            peak.fetch_max(budget.held(), Ordering::Relaxed);
                            drop(slot);
                        }
                    }
                })
            })
            .collect();
        for thread in threads {
            thread.join().expect("no panic");
        }
        assert!(peak.load(Ordering::Relaxed) <= 3);
        assert_eq!(budget.held(), 0);
    }
}
