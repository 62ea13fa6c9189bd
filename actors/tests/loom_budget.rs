//! Loom models of the [`SlotBudget`]: every interleaving of a few acquires and releases.
//!
//! Run with `RUSTFLAGS="--cfg loom" cargo test -p prometheus_parking_lot_actors --release
//! --test loom_budget` (`scripts/test.sh` does).
#![cfg(loom)]

use loom::sync::atomic::{AtomicUsize, Ordering};
use loom::sync::Arc;
use loom::thread;
use prometheus_parking_lot_actors::sync::slots::SlotBudget;

/// Two threads race for one slot while the main thread holds none: never more than one
/// holder at once, at least one acquire succeeds, and the slot comes back.
#[test]
fn racing_acquires_never_pass_the_capacity() {
    loom::model(|| {
        let budget = SlotBudget::new(1);
        let inside = Arc::new(AtomicUsize::new(0));
        let threads: Vec<_> = (0..2)
            .map(|_| {
                let (budget, inside) = (budget.clone(), inside.clone());
                thread::spawn(move || match budget.try_acquire() {
                    Some(slot) => {
                        assert_eq!(inside.fetch_add(1, Ordering::SeqCst), 0, "two holders");
                        inside.fetch_sub(1, Ordering::SeqCst);
                        drop(slot);
                        true
                    }
                    None => false,
                })
            })
            .collect();
        let acquired = threads
            .into_iter()
            .map(|thread| thread.join().unwrap())
            .filter(|&acquired| acquired)
            .count();
        assert!(acquired >= 1, "one slot, two tries: at least one succeeds");
        assert_eq!(budget.held(), 0);
        assert_eq!(budget.available(), 1);
    });
}

/// Two holders of a two-slot budget release while a third thread acquires: the count never
/// passes the capacity and ends exact.
#[test]
fn releases_racing_an_acquire_keep_the_count_within_the_capacity() {
    loom::model(|| {
        let budget = SlotBudget::new(2);
        let first = budget.try_acquire().expect("free");
        let second = budget.try_acquire().expect("free");
        let releaser = thread::spawn(move || drop(first));
        let acquirer = {
            let budget = budget.clone();
            thread::spawn(move || {
                let slot = budget.try_acquire();
                assert!(budget.held() <= 2);
                slot.is_some()
            })
        };
        drop(second);
        releaser.join().unwrap();
        acquirer.join().unwrap();
        assert_eq!(budget.held(), 0);
    });
}

/// A release racing an acquire on a full budget: the acquire either fails (it ran first) or
/// takes the freed slot; the count never goes below zero or above the capacity.
#[test]
fn a_release_racing_an_acquire_keeps_the_count_exact() {
    loom::model(|| {
        let budget = SlotBudget::new(1);
        let held = budget.try_acquire().expect("free");
        let racer = {
            let budget = budget.clone();
            thread::spawn(move || budget.try_acquire())
        };
        drop(held);
        let taken = racer.join().unwrap();
        match taken {
            Some(slot) => {
                assert_eq!(budget.held(), 1);
                drop(slot);
            }
            None => assert_eq!(budget.held(), 0),
        }
        assert_eq!(budget.held(), 0);
    });
}
