//! Loom models of the [`Parker`]: every interleaving of a few parks and unparks.
//!
//! Run with `RUSTFLAGS="--cfg loom" cargo test -p prometheus_parking_lot_actors --release
//! --test loom_parker` (`scripts/test.sh` does, in its own target directory). Loom reports a
//! deadlock when every thread is blocked, so a lost wake-up, which leaves the parked thread
//! sleeping forever, fails a model. The models are kept small so loom finishes in seconds.
#![cfg(loom)]

use loom::sync::atomic::{AtomicUsize, Ordering};
use loom::sync::Arc;
use loom::thread;
use prometheus_parking_lot_actors::sync::parker::Parker;

/// A park racing one unpark always returns: the wake-up is never lost, whether the unpark
/// lands before the park, while it is on its way to sleep, or while it sleeps.
#[test]
fn a_park_racing_an_unpark_always_wakes() {
    loom::model(|| {
        let parker = Arc::new(Parker::new());
        let unparker = Arc::clone(&parker);
        let unparking = thread::spawn(move || unparker.unpark());
        parker.park();
        unparking.join().unwrap();
    });
}

/// A park racing two unparks from two threads always returns.
#[test]
fn a_park_racing_two_unparks_always_wakes() {
    loom::model(|| {
        let parker = Arc::new(Parker::new());
        let unparkers: Vec<_> = (0..2)
            .map(|_| {
                let unparker = Arc::clone(&parker);
                thread::spawn(move || unparker.unpark())
            })
            .collect();
        parker.park();
        for unparking in unparkers {
            unparking.join().unwrap();
        }
    });
}

/// Two unparks, both finished before a park, wake that park and count as one: the next park
/// waits for a third unpark, which is sent only after `published` is set, so that park must
/// see it set. Were wake-ups counted, it could return at once and read 0.
#[test]
fn two_unparks_before_a_park_count_as_one() {
    loom::model(|| {
        let parker = Arc::new(Parker::new());
        let unparkers: Vec<_> = (0..2)
            .map(|_| {
                let unparker = Arc::clone(&parker);
                thread::spawn(move || unparker.unpark())
            })
            .collect();
        for unparking in unparkers {
            unparking.join().unwrap();
        }
        parker.park();

        let published = Arc::new(AtomicUsize::new(0));
        let unparker = Arc::clone(&parker);
        let publisher = Arc::clone(&published);
        let publishing = thread::spawn(move || {
            publisher.store(1, Ordering::Relaxed);
            unparker.unpark();
        });
        parker.park();
        assert_eq!(published.load(Ordering::Relaxed), 1);
        publishing.join().unwrap();
    });
}

/// Two threads take turns for two rounds, each parking on its own parker until the other
/// unparks it. Every value is written with `Relaxed` before the unpark and read with `Relaxed`
/// after the park, so the parked thread sees the round's value only through the parker's
/// release/acquire edge; loom would let it read a stale value if that edge were missing.
#[test]
fn a_woken_thread_sees_what_was_written_before_the_unpark() {
    const ROUNDS: usize = 2;
    loom::model(|| {
        let main_parker = Arc::new(Parker::new());
        let helper_parker = Arc::new(Parker::new());
        let request = Arc::new(AtomicUsize::new(0));
        let reply = Arc::new(AtomicUsize::new(0));

        let helper = {
            let main_parker = Arc::clone(&main_parker);
            let helper_parker = Arc::clone(&helper_parker);
            let request = Arc::clone(&request);
            let reply = Arc::clone(&reply);
            thread::spawn(move || {
                for round in 1..=ROUNDS {
                    helper_parker.park();
                    assert_eq!(request.load(Ordering::Relaxed), round);
                    reply.store(round, Ordering::Relaxed);
                    main_parker.unpark();
                }
            })
        };

        for round in 1..=ROUNDS {
            request.store(round, Ordering::Relaxed);
            helper_parker.unpark();
            main_parker.park();
            assert_eq!(reply.load(Ordering::Relaxed), round);
        }
        helper.join().unwrap();
    });
}
