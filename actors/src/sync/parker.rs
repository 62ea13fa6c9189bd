//! A three-state thread parker, and [`block_on_until`], which waits for a future on a plain
//! thread.
//!
//! A [`Parker`] lets one thread sleep until another thread tells it to go on. It is what a
//! caller outside any async runtime (a blocking `submit` or `retrieve`) waits on: the engine's
//! futures wake it through an ordinary [`Waker`], and [`block_on_until`] polls the future again
//! each time it is woken.
//!
//! # The algorithm
//!
//! The parker is one atomic `state` plus a mutex and a condition variable that carry the
//! actual sleep (std offers no futex wait, so this is the portable way, as in std's own generic
//! parker). `state` is always one of:
//!
//! - `EMPTY`: no thread is parked and no wake-up is waiting.
//! - `PARKED`: the owning thread is inside `park`: it has announced that it is going to sleep
//!   and has not come back yet. It may still be on its way to the condition variable.
//! - `NOTIFIED`: an `unpark` happened that no `park` has consumed yet.
//!
//! `park` runs three steps:
//!
//! 1. Swap `NOTIFIED` for `EMPTY`. If that succeeds a wake-up was already waiting: return at
//!    once, without touching the mutex.
//! 2. Take the mutex, then swap `EMPTY` for `PARKED`. If the state was `NOTIFIED` instead, an
//!    `unpark` slipped in after step 1: set `EMPTY` and return.
//! 3. Wait on the condition variable. Each time the wait returns, try to swap `NOTIFIED` for
//!    `EMPTY`; if the state is still `PARKED` the wake-up was spurious, so wait again.
//!
//! A timed park runs the same steps with a timed wait. When the deadline passes it sets `EMPTY`
//! and reports whether the value it replaced was `NOTIFIED`: an `unpark` that races the deadline
//! still counts as a wake-up, never as a timeout.
//!
//! `unpark` sets `NOTIFIED` whatever the state was. If the old state was `EMPTY` or `NOTIFIED`
//! it is done: the next `park` will find the wake-up in step 1 or 2. If it was `PARKED`, it
//! takes the mutex, lets it go straight away, and signals the condition variable.
//!
//! # Why `NOTIFIED` prevents a lost wake-up
//!
//! The classic lost wake-up: a thread decides to sleep, another thread signals before the first
//! has started waiting, the signal reaches nobody, and the first thread then sleeps forever.
//! Here a wake-up is not the condition-variable signal but the `NOTIFIED` value left in
//! `state`, and it stays there until a `park` consumes it. `park` only goes to sleep after its
//! own swap from `EMPTY` to `PARKED` succeeded, that is, after checking in the same atomic step
//! that no wake-up was waiting. Every `unpark` that comes later sees `PARKED` and signals.
//!
//! One window is left: an `unpark` that sees `PARKED` while the parking thread has not reached
//! the condition variable yet; a signal sent then would be lost. The mutex closes it. The
//! parking thread holds the mutex from its swap to `PARKED` until the condition variable's wait
//! releases it atomically, and `unpark` takes the mutex before it signals. So when `unpark`
//! signals, the parking thread is either already waiting (and gets the signal) or already awake
//! (and finds `NOTIFIED` when it checks in step 3).
//!
//! # Memory orderings
//!
//! - `unpark` sets `NOTIFIED` with `Release`, and every swap in `park` that takes a `NOTIFIED`
//!   away uses `Acquire`. So whatever a thread wrote before calling `unpark` (a task pushed on a
//!   queue, a reply stored) is visible to the parked thread once `park` returns. This is the one
//!   happens-before edge the parker promises.
//! - The swap from `EMPTY` to `PARKED` is `Relaxed`: it publishes nothing, and its order
//!   against `unpark` comes from the mutex, which both sides take.
//! - Failed swaps read with `Relaxed`: the one place that acts on the value it read (step 2
//!   finding `NOTIFIED`) follows up with an `Acquire` swap.
//!
//! # Invariants
//!
//! 1. One thread at a time parks on a given parker (its owner); any number of threads may
//!    unpark it. A second thread that parks while the owner is parked finds `PARKED` in step 2
//!    and panics rather than sleeping where no one may wake it.
//! 2. The state is `PARKED` only while its owner is inside `park`, between step 2 and return.
//! 3. Only `unpark` sets `NOTIFIED`; only `park` sets `PARKED`, and only `park` takes a
//!    `NOTIFIED` away, always replacing it with `EMPTY`. `park` sets `EMPTY` as it returns;
//!    an `unpark` after that is kept for the next `park`.
//! 4. Wake-ups do not add up: any number of `unpark` calls before a `park` let exactly that
//!    one `park` return at once.
//! 5. `park` never returns without a wake-up; `park_until` returns without one only once its
//!    deadline has passed.
//!
//! # Model checking
//!
//! Built with `RUSTFLAGS="--cfg loom"`, the parker uses loom's atomics, mutex and condition
//! variable, and `tests/loom_parker.rs` checks it across every interleaving. Loom models no
//! time, so under loom a park with a deadline waits like an untimed park (and reports a
//! wake-up); the timed path is covered by the unit tests instead.

use std::fmt;
use std::future::Future;
use std::pin::pin;
use std::sync::{Arc, PoisonError};
use std::task::{Context, Poll, Wake, Waker};
use std::time::{Duration, Instant};

use sync::{AtomicUsize, Condvar, Mutex, MutexGuard, Ordering};

/// The synchronisation types the parker is built on: loom's models under `cfg(loom)`, std's
/// otherwise.
#[cfg(loom)]
mod sync {
    pub(super) use loom::sync::atomic::{AtomicUsize, Ordering};
    pub(super) use loom::sync::{Condvar, Mutex, MutexGuard};
}

#[cfg(not(loom))]
mod sync {
    pub(super) use std::sync::atomic::{AtomicUsize, Ordering};
    pub(super) use std::sync::{Condvar, Mutex, MutexGuard};
}

/// No thread is parked and no wake-up is waiting.
const EMPTY: usize = 0;
/// The owning thread is inside `park` and has not come back yet.
const PARKED: usize = 1;
/// An `unpark` happened that no `park` has consumed yet.
const NOTIFIED: usize = 2;

/// Lets one thread sleep until another one wakes it.
///
/// An `unpark` that comes before the `park` is kept, so the `park` returns at once; several
/// `unpark` calls before one `park` count as one. Only one thread may park on a parker at a
/// time; any thread may unpark it. The module documentation states the algorithm.
///
/// ```
/// use std::sync::Arc;
/// use std::thread;
/// use prometheus_parking_lot_actors::sync::parker::Parker;
///
/// let parker = Arc::new(Parker::new());
/// let waker = Arc::clone(&parker);
/// let worker = thread::spawn(move || waker.unpark());
/// parker.park();
/// worker.join().unwrap();
/// ```
pub struct Parker {
    /// `EMPTY`, `PARKED` or `NOTIFIED`.
    state: AtomicUsize,
    /// Held by the parking thread from its switch to `PARKED` until it waits, and taken by
    /// `unpark` before signalling, so no signal falls between the two.
    lock: Mutex<()>,
    /// Where the parked thread sleeps.
    condvar: Condvar,
}

impl Parker {
    /// A parker with no wake-up waiting.
    pub fn new() -> Self {
        Parker {
            state: AtomicUsize::new(EMPTY),
            lock: Mutex::new(()),
            condvar: Condvar::new(),
        }
    }

    /// Blocks the calling thread until [`unpark`](Self::unpark) is called, or returns at once
    /// if it was called since the last park.
    ///
    /// # Panics
    ///
    /// If another thread is parked on this parker at the same time.
    pub fn park(&self) {
        if self.take_wake_up() {
            return;
        }
        let mut guard = self.lock();
        if !self.announce_parked() {
            return;
        }
        loop {
            guard = self
                .condvar
                .wait(guard)
                .unwrap_or_else(PoisonError::into_inner);
            if self.take_wake_up() {
                return;
            }
        }
    }

    /// Like [`park`](Self::park), but gives up after `timeout`.
    ///
    /// Returns `true` if it was woken, `false` if the timeout elapsed first. A timeout too
    /// large to add to the current [`Instant`] (such as [`Duration::MAX`]) means no timeout.
    pub fn park_timeout(&self, timeout: Duration) -> bool {
        self.park_until(Instant::now().checked_add(timeout))
    }

    /// Like [`park`](Self::park), but gives up at `deadline`; `None` waits without one.
    ///
    /// Returns `true` if it was woken, `false` if the deadline passed first. Under `cfg(loom)`
    /// the deadline is ignored, since loom models no time.
    pub fn park_until(&self, deadline: Option<Instant>) -> bool {
        match deadline {
            Some(deadline) if !cfg!(loom) => self.park_before(deadline),
            _ => {
                self.park();
                true
            }
        }
    }

    /// Wakes the thread parked on this parker, or, if none is, makes its next park return at
    /// once.
    pub fn unpark(&self) {
        if self.state.swap(NOTIFIED, Ordering::Release) != PARKED {
            return;
        }
        // The parking thread holds the lock until it waits: once we get it, it is waiting or
        // already awake, so the signal cannot be lost.
        drop(self.lock());
        self.condvar.notify_one();
    }

    /// A [`Waker`] that unparks this parker.
    pub fn waker(self: &Arc<Self>) -> Waker {
        Waker::from(Arc::clone(self))
    }

    /// The timed park: steps 1 to 3 of the algorithm with a timed wait.
    fn park_before(&self, deadline: Instant) -> bool {
        if self.take_wake_up() {
            return true;
        }
        let mut guard = self.lock();
        if !self.announce_parked() {
            return true;
        }
        loop {
            let now = Instant::now();
            if now >= deadline {
                return self.state.swap(EMPTY, Ordering::Acquire) == NOTIFIED;
            }
            guard = self
                .condvar
                .wait_timeout(guard, deadline - now)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
            if self.take_wake_up() {
                return true;
            }
        }
    }

    /// Consumes a waiting wake-up (`NOTIFIED` to `EMPTY`); `false` if there was none.
    fn take_wake_up(&self) -> bool {
        self.state
            .compare_exchange(NOTIFIED, EMPTY, Ordering::Acquire, Ordering::Relaxed)
            .is_ok()
    }

    /// Step 2, called with the lock held: moves `EMPTY` to `PARKED`. Returns `false` when a
    /// wake-up arrived first, after consuming it.
    fn announce_parked(&self) -> bool {
        match self
            .state
            .compare_exchange(EMPTY, PARKED, Ordering::Relaxed, Ordering::Relaxed)
        {
            Ok(_) => true,
            Err(NOTIFIED) => {
                self.state.swap(EMPTY, Ordering::Acquire);
                false
            }
            Err(_) => panic!("two threads parked on one Parker at once; a Parker has one owner"),
        }
    }

    /// The mutex guards no data, so a panic while it was held leaves nothing broken: poisoning
    /// is ignored.
    fn lock(&self) -> MutexGuard<'_, ()> {
        self.lock.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Default for Parker {
    fn default() -> Self {
        Parker::new()
    }
}

impl fmt::Debug for Parker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match self.state.load(Ordering::Relaxed) {
            EMPTY => "empty",
            PARKED => "parked",
            _ => "notified",
        };
        f.debug_struct("Parker").field("state", &state).finish()
    }
}

impl Wake for Parker {
    fn wake(self: Arc<Self>) {
        self.unpark();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.unpark();
    }
}

/// Runs `future` to completion on the calling thread, or gives up at `deadline`.
///
/// Polls the future, and between polls parks the thread until the future's waker is called or
/// the deadline passes. Returns `None` if the deadline passed first (the future is dropped
/// unfinished); `None` as the deadline waits as long as it takes. It needs no async runtime, so
/// it can wait on anything that is woken from another thread, such as a
/// `tokio::sync::oneshot::Receiver` or `tokio::sync::Notify::notified()`; futures that need a
/// runtime's reactor or timer (`tokio::time::sleep`) must not be passed.
///
/// Each call parks on a parker of its own, so a future that itself calls `block_on_until`
/// cannot take the outer call's wake-ups.
///
/// ```
/// use std::thread;
/// use std::time::{Duration, Instant};
/// use prometheus_parking_lot_actors::sync::parker::block_on_until;
///
/// let (sender, receiver) = tokio::sync::oneshot::channel();
/// thread::spawn(move || sender.send(42));
/// let deadline = Instant::now() + Duration::from_secs(10);
/// assert_eq!(block_on_until(receiver, Some(deadline)), Some(Ok(42)));
///
/// let never = std::future::pending::<()>();
/// assert_eq!(block_on_until(never, Some(Instant::now())), None);
/// ```
pub fn block_on_until<F: Future>(future: F, deadline: Option<Instant>) -> Option<F::Output> {
    let parker = Arc::new(Parker::new());
    let waker = parker.waker();
    let mut context = Context::from_waker(&waker);
    let mut future = pin!(future);
    loop {
        if let Poll::Ready(output) = future.as_mut().poll(&mut context) {
            return Some(output);
        }
        if !parker.park_until(deadline) {
            return None;
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use std::sync::mpsc;
    use std::thread;

    use super::*;

    /// How long a test waits for something that should happen promptly before failing.
    const PATIENCE: Duration = Duration::from_secs(10);

    #[test]
    fn unpark_before_park_lets_park_return_at_once() {
        let parker = Parker::new();
        parker.unpark();
        let started = Instant::now();
        assert!(parker.park_timeout(PATIENCE));
        assert!(started.elapsed() < PATIENCE);
    }

    #[test]
    fn unpark_before_untimed_park_lets_it_return_at_once() {
        let parker = Parker::new();
        parker.unpark();
        parker.park();
        assert_eq!(parker.state.load(Ordering::Relaxed), EMPTY);
    }

    #[test]
    fn wake_ups_do_not_add_up() {
        let parker = Parker::new();
        parker.unpark();
        parker.unpark();
        assert!(parker.park_timeout(PATIENCE));
        assert!(!parker.park_timeout(Duration::from_millis(20)));
    }

    #[test]
    fn park_timeout_returns_false_when_the_timeout_elapses() {
        let parker = Parker::new();
        let timeout = Duration::from_millis(30);
        let started = Instant::now();
        assert!(!parker.park_timeout(timeout));
        assert!(started.elapsed() >= timeout);
        assert_eq!(parker.state.load(Ordering::Relaxed), EMPTY);
    }

    #[test]
    fn park_timeout_with_a_past_deadline_still_takes_a_waiting_wake_up() {
        let parker = Parker::new();
        assert!(!parker.park_timeout(Duration::ZERO));
        parker.unpark();
        assert!(parker.park_timeout(Duration::ZERO));
    }

    #[test]
    fn park_timeout_accepts_duration_max() {
        let parker = Parker::new();
        parker.unpark();
        assert!(parker.park_timeout(Duration::MAX));
    }

    #[test]
    fn unpark_from_another_thread_wakes_a_timed_park() {
        let parker = Arc::new(Parker::new());
        let unparker = Arc::clone(&parker);
        let waker = thread::spawn(move || {
            thread::sleep(Duration::from_millis(20));
            unparker.unpark();
        });
        assert!(parker.park_timeout(PATIENCE));
        waker.join().unwrap();
    }

    #[test]
    fn unpark_from_another_thread_wakes_an_untimed_park() {
        let parker = Arc::new(Parker::new());
        let sleeper_parker = Arc::clone(&parker);
        let (woke, woken) = mpsc::channel();
        let sleeper = thread::spawn(move || {
            sleeper_parker.park();
            woke.send(()).unwrap();
        });
        thread::sleep(Duration::from_millis(20));
        parker.unpark();
        woken
            .recv_timeout(PATIENCE)
            .expect("the parked thread never woke");
        sleeper.join().unwrap();
    }

    #[test]
    fn the_waker_unparks() {
        let parker = Arc::new(Parker::new());
        parker.waker().wake_by_ref();
        assert!(parker.park_timeout(PATIENCE));
        parker.waker().wake();
        assert!(parker.park_timeout(PATIENCE));
    }

    #[test]
    fn block_on_until_returns_a_ready_value() {
        let deadline = Instant::now() + PATIENCE;
        assert_eq!(block_on_until(async { 7 }, Some(deadline)), Some(7));
    }

    #[test]
    fn block_on_until_returns_none_once_the_deadline_passes() {
        let timeout = Duration::from_millis(30);
        let started = Instant::now();
        let outcome = block_on_until(std::future::pending::<()>(), Some(started + timeout));
        assert_eq!(outcome, None);
        assert!(started.elapsed() >= timeout);
    }

    #[test]
    fn block_on_until_completes_when_a_oneshot_is_sent_from_another_thread() {
        let (sender, receiver) = tokio::sync::oneshot::channel();
        let sending = thread::spawn(move || {
            thread::sleep(Duration::from_millis(20));
            sender.send("done").unwrap();
        });
        let outcome = block_on_until(receiver, Some(Instant::now() + PATIENCE));
        assert_eq!(outcome, Some(Ok("done")));
        sending.join().unwrap();
    }

    #[test]
    fn block_on_until_completes_when_notified_from_another_thread() {
        let notify = Arc::new(tokio::sync::Notify::new());
        let notifier = Arc::clone(&notify);
        let notifying = thread::spawn(move || {
            thread::sleep(Duration::from_millis(20));
            notifier.notify_one();
        });
        let outcome = block_on_until(notify.notified(), Some(Instant::now() + PATIENCE));
        assert_eq!(outcome, Some(()));
        notifying.join().unwrap();
    }

    #[test]
    fn block_on_until_treats_far_deadlines_like_none() {
        let huge = Duration::from_secs(u64::MAX / 4);
        for timeout in [Duration::MAX, huge] {
            let (sender, receiver) = tokio::sync::oneshot::channel();
            let (done, finished) = mpsc::channel();
            let waiting = thread::spawn(move || {
                let deadline = Instant::now().checked_add(timeout);
                done.send(block_on_until(receiver, deadline)).unwrap();
            });
            thread::sleep(Duration::from_millis(20));
            sender.send(timeout).unwrap();
            let outcome = finished
                .recv_timeout(PATIENCE)
                .expect("block_on_until never returned");
            assert_eq!(outcome, Some(Ok(timeout)));
            waiting.join().unwrap();
        }
    }

    #[test]
    fn block_on_until_with_no_deadline_completes_a_late_value() {
        let (sender, receiver) = tokio::sync::oneshot::channel();
        let (done, finished) = mpsc::channel();
        let waiting = thread::spawn(move || done.send(block_on_until(receiver, None)).unwrap());
        thread::sleep(Duration::from_millis(20));
        sender.send(3).unwrap();
        let outcome = finished
            .recv_timeout(PATIENCE)
            .expect("block_on_until never returned");
        assert_eq!(outcome, Some(Ok(3)));
        waiting.join().unwrap();
    }
}
