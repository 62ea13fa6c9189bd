//! The hand-off of one answer from the scheduler to one waiter that may give up at any
//! moment: an acquire's grant, a grow's extra units.
//!
//! # Algorithm
//!
//! One cell, under a lock, in one of four states: `Waiting` (with the waiter's waker, once
//! it has polled), `Given`, `Withdrawn`, `Taken`. The scheduler [gives](Answer::give) only
//! to a waiting cell; the waiter [takes](Answer::poll_take) only a given answer, and when it
//! gives up it [withdraws](Answer::withdraw), which either turns a waiting cell into a
//! withdrawn one or hands back the answer that arrived first.
//!
//! # Invariants (model-checked in `actors/tests/loom_grant.rs`)
//!
//! - Every answer has exactly one owner: the waiter takes it, the waiter's withdrawal hands
//!   it back (and the waiter undoes it: a grant is released), or `give` refuses it (and the
//!   scheduler undoes it). No unit is ever granted to nobody, and none is released twice.
//! - A waiter that polled before the answer came is woken: the waker is stored under the
//!   same lock `give` takes.

use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll, Waker};

use sync::Mutex;

#[cfg(loom)]
mod sync {
    pub(super) use loom::sync::Mutex;
}

#[cfg(not(loom))]
mod sync {
    pub(super) use std::sync::Mutex;
}

enum State<T> {
    Waiting(Option<Waker>),
    Given(T),
    Withdrawn,
    Taken,
}

/// See the module docs.
pub struct Answer<T> {
    state: Mutex<State<T>>,
    /// A number the scheduler files the waiter under (its entry), read back when the waiter
    /// withdraws; only the scheduler's thread reads or writes it.
    tag: AtomicU64,
}

/// What a withdrawal found.
#[derive(Debug, PartialEq, Eq)]
pub enum Withdrawal<T> {
    /// The waiter was still waiting: the scheduler must be told to forget it.
    WasWaiting,
    /// The answer had come: the waiter owns it and must undo it.
    Answered(T),
    /// Taken or withdrawn before: nothing to do.
    Settled,
}

impl<T> Default for Answer<T> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T> Answer<T> {
    /// A cell that waits.
    pub fn new() -> Self {
        Self {
            state: Mutex::new(State::Waiting(None)),
            tag: AtomicU64::new(0),
        }
    }

    /// Files the waiter under `tag` (see the field).
    pub fn set_tag(&self, tag: u64) {
        self.tag.store(tag, Ordering::Relaxed);
    }

    /// The tag the waiter was filed under.
    pub fn tag(&self) -> u64 {
        self.tag.load(Ordering::Relaxed)
    }

    fn lock(&self) -> impl std::ops::DerefMut<Target = State<T>> + '_ {
        // A panic while the lock is held cannot leave the state torn (each change is one
        // assignment), so a poisoned lock is used as it is.
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The scheduler's side: hands `value` to the waiter, or returns it when the waiter has
    /// withdrawn (the caller then undoes what it stands for).
    pub fn give(&self, value: T) -> Result<(), T> {
        let mut state = self.lock();
        match std::mem::replace(&mut *state, State::Taken) {
            State::Waiting(waker) => {
                *state = State::Given(value);
                drop(state);
                if let Some(waker) = waker {
                    waker.wake();
                }
                Ok(())
            }
            settled => {
                *state = settled;
                Err(value)
            }
        }
    }

    /// The waiter's side: the answer, once given; until then the waker is kept to be woken.
    pub fn poll_take(&self, cx: &mut Context<'_>) -> Poll<T> {
        let mut state = self.lock();
        match std::mem::replace(&mut *state, State::Taken) {
            State::Given(value) => Poll::Ready(value),
            State::Waiting(waker) => {
                let waker = match waker {
                    Some(waker) if waker.will_wake(cx.waker()) => waker,
                    _ => cx.waker().clone(),
                };
                *state = State::Waiting(Some(waker));
                Poll::Pending
            }
            settled => {
                *state = settled;
                Poll::Pending
            }
        }
    }

    /// The answer if it was given, without waiting (nor keeping a waker).
    pub fn try_take(&self) -> Option<T> {
        let mut state = self.lock();
        match std::mem::replace(&mut *state, State::Taken) {
            State::Given(value) => Some(value),
            other => {
                *state = other;
                None
            }
        }
    }

    /// The waiter gives up (its future was dropped, its deadline passed).
    pub fn withdraw(&self) -> Withdrawal<T> {
        let mut state = self.lock();
        match std::mem::replace(&mut *state, State::Taken) {
            State::Waiting(_) => {
                *state = State::Withdrawn;
                Withdrawal::WasWaiting
            }
            State::Given(value) => Withdrawal::Answered(value),
            settled => {
                *state = settled;
                Withdrawal::Settled
            }
        }
    }
}
