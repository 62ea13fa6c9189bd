//! Loom models of the permit hand-off ([`Answer`]): a grant racing a waiter that gives up,
//! and a grant racing a waiter going to sleep.
//!
//! Run with `RUSTFLAGS="--cfg loom" cargo test -p prometheus_parking_lot_actors --release
//! --test loom_grant` (`scripts/test.sh` does). The property: every grant has exactly one
//! owner. Either the waiter takes it, or the waiter's withdrawal hands it back (and the
//! waiter releases it), or `give` refuses it (and the scheduler releases it); never two of
//! these, never none.
#![cfg(loom)]

use std::task::{Context, Poll};

use loom::sync::atomic::{AtomicUsize, Ordering};
use loom::sync::Arc;
use loom::thread;
use prometheus_parking_lot_actors::permit::answer::{Answer, Withdrawal};
use prometheus_parking_lot_actors::sync::parker::Parker;

/// A grant racing a withdrawal: the units are released exactly once, by one side.
#[test]
fn a_grant_racing_a_withdrawal_is_released_exactly_once() {
    loom::model(|| {
        let answer = Arc::new(Answer::<u32>::new());
        let released = Arc::new(AtomicUsize::new(0));
        let scheduler = {
            let (answer, released) = (answer.clone(), released.clone());
            thread::spawn(move || {
                if answer.give(7).is_err() {
                    // The waiter is gone: the scheduler releases the grant itself.
                    released.fetch_add(1, Ordering::SeqCst);
                }
            })
        };
        match answer.withdraw() {
            Withdrawal::Answered(7) => {
                released.fetch_add(1, Ordering::SeqCst);
            }
            Withdrawal::WasWaiting => {}
            other => panic!("unexpected withdrawal {other:?}"),
        }
        scheduler.join().unwrap();
        assert_eq!(released.load(Ordering::SeqCst), 1);
        // Once settled, nothing more comes out of it.
        assert_eq!(answer.withdraw(), Withdrawal::Settled);
    });
}

/// A waiter that polls while the grant is on its way is woken and takes it: the wake-up is
/// never lost (loom reports a deadlock if the waiter sleeps for ever).
#[test]
fn a_waiter_racing_a_grant_is_woken_and_takes_it() {
    loom::model(|| {
        let answer = Arc::new(Answer::<u32>::new());
        let scheduler = {
            let answer = answer.clone();
            thread::spawn(move || answer.give(7).is_ok())
        };
        // The waiter polls, and parks between polls until its waker unparks it (as
        // `block_on_until` does; the parker is itself model-checked in loom_parker.rs).
        let parker = std::sync::Arc::new(Parker::new());
        let waker = parker.waker();
        let mut cx = Context::from_waker(&waker);
        let taken = loop {
            match answer.poll_take(&mut cx) {
                Poll::Ready(value) => break value,
                Poll::Pending => parker.park(),
            }
        };
        assert_eq!(taken, 7);
        assert!(scheduler.join().unwrap());
        assert_eq!(answer.withdraw(), Withdrawal::Settled);
    });
}

/// Two grants for one cell (a bug elsewhere) never both land: the second is refused.
#[test]
fn a_cell_takes_one_grant() {
    loom::model(|| {
        let answer = Arc::new(Answer::<u32>::new());
        let other = {
            let answer = answer.clone();
            thread::spawn(move || answer.give(1).is_ok())
        };
        let mine = answer.give(2).is_ok();
        let theirs = other.join().unwrap();
        assert!(mine ^ theirs);
    });
}
