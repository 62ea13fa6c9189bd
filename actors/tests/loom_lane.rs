//! Loom models of the permits' fast path ([`Lanes`] and [`FastState`]): the scheduler
//! closing a lane while holders take and give units, a release racing the close, a
//! holder's drop racing the scheduler's take-over, and releasers racing for the hand-off
//! baton while the scheduler takes it back and offers it again.
//!
//! Run with `RUSTFLAGS="--cfg loom" cargo test -p prometheus_parking_lot_actors --release
//! --test loom_lane` (`scripts/test.sh` does). The property in each: every unit lent is
//! accounted exactly once (in the lane, with a holder, in a claim, or sent back to the
//! scheduler), so none is handed out twice and none is lost.
#![cfg(loom)]

use loom::sync::atomic::{AtomicU32, Ordering};
use loom::sync::Arc;
use loom::thread;
use prometheus_parking_lot_actors::domain::ResourceKind;
use prometheus_parking_lot_actors::permit::lane::{Baton, FastState, Lanes, Left};

const KIND: ResourceKind = ResourceKind::GpuVram;

/// Two holders take a unit each from a lane of one while the scheduler closes it: at most
/// one take succeeds, and the close returns exactly what was not taken.
#[test]
fn open_and_close_racing_takes_hand_out_each_unit_once() {
    loom::model(|| {
        let lanes = Arc::new(Lanes::new());
        lanes.open(KIND, 1);
        let taken = Arc::new(AtomicU32::new(0));
        let holders: Vec<_> = (0..2)
            .map(|_| {
                let (lanes, taken) = (lanes.clone(), taken.clone());
                thread::spawn(move || {
                    if lanes.try_take(KIND, 1) {
                        taken.fetch_add(1, Ordering::SeqCst);
                    }
                })
            })
            .collect();
        let reclaimed = lanes.close(KIND);
        for holder in holders {
            holder.join().unwrap();
        }
        let taken = taken.load(Ordering::SeqCst);
        assert!(taken <= 1, "a unit was handed out twice");
        assert_eq!(taken + reclaimed, 1, "a unit was lost");
        // Closed: nothing more is handed out.
        assert!(!lanes.try_take(KIND, 1));
    });
}

/// A holder gives its units back while the scheduler closes the lane: they come back
/// exactly once, through the close or through the holder's message.
#[test]
fn a_release_racing_the_close_returns_its_units_once() {
    loom::model(|| {
        let lanes = Arc::new(Lanes::new());
        lanes.open(KIND, 4);
        assert!(lanes.try_take(KIND, 3));
        let holder = {
            let lanes = lanes.clone();
            thread::spawn(move || {
                // `false`: the lane was closed; the units go to the scheduler by message.
                if lanes.give(KIND, 3) {
                    0
                } else {
                    3
                }
            })
        };
        let reclaimed = lanes.close(KIND);
        let sent = holder.join().unwrap();
        let after = lanes.close(KIND);
        assert_eq!(reclaimed + sent + after, 4, "units lost or counted twice");
    });
}

/// The scheduler takes a fast-path permit over while its holder shrinks and then drops it:
/// each borrowed unit ends in exactly one place (the claim, the lane, or nowhere twice), and
/// the holder tells the scheduler of the drop exactly when it was taken over.
#[test]
fn a_drop_racing_the_take_over_settles_each_unit_once() {
    loom::model(|| {
        let lanes = Arc::new(Lanes::new());
        lanes.open(KIND, 5);
        assert!(lanes.try_take(KIND, 3));
        let state = Arc::new(FastState::borrowing(3));
        let holder = {
            let (lanes, state) = (lanes.clone(), state.clone());
            thread::spawn(move || {
                let unborrowed = state.unborrow(1);
                let mut sent = 0;
                if !lanes.give(KIND, unborrowed) {
                    sent += unborrowed;
                }
                let left: Left = state.leave();
                if !lanes.give(KIND, left.borrowed) {
                    sent += left.borrowed;
                }
                // The shrink's unit that was not borrowed any more was the claim's: it goes
                // to the scheduler with the drop.
                (sent, 1 - unborrowed, left.adopted)
            })
        };
        let claimed = match state.take_over() {
            Some((borrowed, adopted)) => {
                assert!(!adopted);
                Some(borrowed)
            }
            None => None,
        };
        let reclaimed = lanes.close(KIND);
        let (sent, shrunk_from_claim, told) = holder.join().unwrap();
        // Taken over exactly when the holder tells the scheduler of its drop.
        assert_eq!(claimed.is_some(), told);
        // Every unit lent: in the lane at the close, sent back by message, or moved into the
        // claim (from which the claim gives back what the holder shrank and then the rest at
        // the drop).
        let claim = claimed.unwrap_or(0);
        assert!(
            shrunk_from_claim <= claim,
            "shrank units the claim never had"
        );
        assert_eq!(reclaimed + sent + claim, 5, "units lost or counted twice");
    });
}

/// Two releasers race for a baton while the scheduler, without having booked anything,
/// offers the same waiter again (as it does between two drain rounds that changed nothing)
/// and then takes the batons back: the waiter is handed to at most one releaser, every
/// hand-off made reaches the scheduler's books exactly once, and a releaser whose units do
/// not cover the deficit never takes it.
#[test]
fn releasers_racing_for_the_baton_grant_its_waiter_at_most_once() {
    loom::model(|| {
        let lanes = Arc::new(Lanes::new());
        lanes.offer(KIND, Baton::for_waiter(7, KIND, 4, 2));
        let taken = Arc::new(AtomicU32::new(0));
        let releasers: Vec<_> = [3, 2]
            .into_iter()
            .map(|units| {
                let (lanes, taken) = (lanes.clone(), taken.clone());
                thread::spawn(move || {
                    if let Some(baton) = lanes.take_baton(KIND, units, None, 0) {
                        assert_eq!(baton.waiter(), 7);
                        taken.fetch_add(1, Ordering::SeqCst);
                    }
                })
            })
            .collect();
        // A drain round that changed nothing offers the head again, if it still may.
        if lanes.may_offer(KIND) {
            lanes.offer(KIND, Baton::for_waiter(7, KIND, 4, 2));
        }
        // A short releaser never covers the deficit.
        assert!(lanes.take_baton(KIND, 1, None, 0).is_none());
        for releaser in releasers {
            releaser.join().unwrap();
        }
        let booked = lanes.revoke();
        let taken = taken.load(Ordering::SeqCst);
        assert!(taken <= 1, "the waiter was granted {taken} times");
        assert_eq!(booked.len() as u32, taken, "a hand-off missed the books");
        assert!(lanes.revoke().is_empty(), "a hand-off was booked twice");
    });
}
