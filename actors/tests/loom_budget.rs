//! Loom models of the [`SlotBudget`]: every interleaving of a few acquires and releases.
//!
//! Run with `RUSTFLAGS="--cfg loom" cargo test -p prometheus_parking_lot_actors --release
//! --test loom_budget` (`scripts/test.sh` does).
#![cfg(loom)]

use loom::sync::atomic::{AtomicUsize, Ordering};
use loom::sync::Arc;
use loom::thread;
use prometheus_parking_lot_actors::budget::SlotBudget;

/// Three threads race for two slots: never more than two are held at once, at most two
/// acquires succeed while all are held, and every slot comes back.
#[test]
fn racing_acquires_never_pass_the_capacity() {
    loom::model(|| {
        let budget = SlotBudget::new(2);
        let inside = Arc::new(AtomicUsize::new(0));
        let threads: Vec<_> = (0..3)
            .map(|_| {
                let (budget, inside) = (budget.clone(), inside.clone());
                thread::spawn(move || {
                    if let Some(slot) = budget.try_acquire() {
                        let now = inside.fetch_add(1, Ordering::SeqCst) + 1;
                        assert!(now <= 2, "{now} holders of 2 slots");
                        assert!(budget.held() <= 2);
                        inside.fetch_sub(1, Ordering::SeqCst);
                        drop(slot);
                        true
                    } else {
                        false
                    }
                })
            })
            .collect();
        let acquired = threads
            .into_iter()
            .map(|thread| thread.join().unwrap())
            .filter(|&acquired| acquired)
            .count();
        assert!(
            acquired >= 2,
            "two slots, three tries: at least two succeed"
        );
        assert_eq!(budget.held(), 0);
        assert_eq!(budget.available(), 2);
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
