//! The results on their way to a mailbox that awaits (a database), for the refusal of a
//! reused task id (`ResultPending`).
//!
//! A new task must never be answered with an earlier task's result. While the earlier task
//! runs, the scheduler refuses the id (`DuplicateTask`); once its result is stored, the
//! client's question to the mailbox ([`Mailbox::holds`](super::Mailbox::holds)) refuses it.
//! A mailbox that awaits stores on its own time, so between the two there is a gap: the task
//! has left the scheduler and its result is not in the database yet. A submission of the
//! same id in that gap found neither, ran, and its caller could take the earlier result.
//!
//! The watch closes the gap in two steps:
//! - **Storing.** The scheduler marks a result *storing* in the same step that ends its task
//!   (the driver hands it to the mailbox actor with a [`Storing`] guard), and the scheduler
//!   refuses the id while it is marked.
//! - **Stored after the question.** A store that finishes unmarks its result and counts one
//!   more finished store. A submission reads that count (its *mark*, [`ResultWatch::mark`])
//!   before the client asks the database. When it reaches the scheduler, a result of its id
//!   whose store finished after the mark may have been missed by the question, so it is
//!   refused too. A result stored before the mark was in the database when asked.
//!
//! Finished stores are remembered for [`REMEMBERED`]: a submission that takes longer than
//! that from its question to the scheduler is not covered. A result stored by another node of
//! a shared queue is known here only through the database.
//!
//! - **Taken.** A result this pool's client took ([`ResultWatch::taken`]) waits nowhere any
//!   more: it no longer counts, whether its store had finished or was still marked (the
//!   database answered the take before the store's guard was dropped). Without this, a
//!   caller that took a result and at once submitted the same id again was refused, or,
//!   under `OnDuplicate::Attach`, attached to the result it had just taken, and waited out
//!   its retrieve.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use crate::domain::{MailboxKey, TaskId};

/// How long a finished store is remembered: far longer than a submission takes from the
/// client's question to the scheduler's answer, even behind a busy inbox.
pub(crate) const REMEMBERED: Duration = Duration::from_secs(10);

/// A result, by where it is stored and its task's id.
type Caller = (MailboxKey, TaskId);

/// See the module docs.
#[derive(Debug, Default)]
pub(crate) struct ResultWatch {
    book: Mutex<Book>,
}

#[derive(Debug, Default)]
struct Book {
    /// Stores finished so far; a finished store is numbered with the count it made.
    finished: u64,
    /// The results being stored, with how many of each (a caller may end twice).
    storing: HashMap<Caller, u32>,
    /// Of the results being stored, how many of each were taken already (their store
    /// reached the mailbox before its guard was dropped).
    taken: HashMap<Caller, u32>,
    /// The number of the latest finished store of each result remembered.
    stored: HashMap<Caller, u64>,
    /// When each remembered store finished, oldest first, with its number.
    order: VecDeque<(Instant, u64, Caller)>,
}

impl ResultWatch {
    /// A watch for a pool whose mailbox awaits.
    pub fn new() -> Arc<Self> {
        Arc::default()
    }

    fn book(&self) -> MutexGuard<'_, Book> {
        // Every change to the book is a few map operations that cannot panic half-way.
        self.book.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The count of finished stores: read before asking the mailbox whether a result
    /// waits, and carried with the submission to the scheduler.
    pub fn mark(&self) -> u64 {
        self.book().finished
    }

    /// The result of task `id` under `key` was taken from the mailbox by this pool's client:
    /// it waits nowhere now (see the module docs, "Taken").
    pub fn taken(&self, key: &MailboxKey, id: TaskId) {
        let mut book = self.book();
        let caller = (key.clone(), id);
        let storing = book.storing.get(&caller).copied().unwrap_or(0);
        let taken = book.taken.get(&caller).copied().unwrap_or(0);
        if storing > taken {
            *book.taken.entry(caller).or_insert(0) += 1;
        } else {
            book.stored.remove(&caller);
        }
    }

    /// Marks the result of task `id` under `key` as storing, until the guard is dropped
    /// (its store finished, failed, or was never carried out).
    pub fn storing(self: &Arc<Self>, key: &MailboxKey, id: TaskId) -> Storing {
        let caller = (key.clone(), id);
        *self.book().storing.entry(caller.clone()).or_insert(0) += 1;
        Storing {
            watch: self.clone(),
            caller: Some(caller),
        }
    }

    /// Whether a result of task `id` under `key` may wait where a submission would not see
    /// it: it is being stored, or its store finished after the submission's `mark` (`None`:
    /// the submission asked nothing, so only a store in progress counts).
    pub fn may_wait(&self, key: &MailboxKey, id: TaskId, mark: Option<u64>) -> bool {
        let mut book = self.book();
        book.forget_old(Instant::now());
        let caller = (key.clone(), id);
        let storing = book.storing.get(&caller).copied().unwrap_or(0);
        if storing > book.taken.get(&caller).copied().unwrap_or(0) {
            return true;
        }
        match (book.stored.get(&caller), mark) {
            (Some(&number), Some(mark)) => number > mark,
            _ => false,
        }
    }
}

impl Book {
    /// The store of `caller` finished at `now`. A store whose result was taken already
    /// leaves nothing to wait for.
    fn finished(&mut self, caller: Caller, now: Instant) {
        self.forget_old(now);
        if let Some(count) = self.storing.get_mut(&caller) {
            *count -= 1;
            if *count == 0 {
                self.storing.remove(&caller);
            }
        }
        self.finished += 1;
        if let Some(taken) = self.taken.get_mut(&caller) {
            *taken -= 1;
            if *taken == 0 {
                self.taken.remove(&caller);
            }
            return;
        }
        self.stored.insert(caller.clone(), self.finished);
        self.order.push_back((now, self.finished, caller));
    }

    /// Forgets the stores that finished more than [`REMEMBERED`] before `now`.
    fn forget_old(&mut self, now: Instant) {
        while let Some((at, number, _)) = self.order.front() {
            if now.saturating_duration_since(*at) < REMEMBERED {
                return;
            }
            let number = *number;
            let Some((_, _, caller)) = self.order.pop_front() else {
                return;
            };
            if self.stored.get(&caller) == Some(&number) {
                self.stored.remove(&caller);
            }
        }
    }
}

/// A result marked as storing (see [`ResultWatch::storing`]); dropping it says the store
/// finished, however it ended.
#[derive(Debug)]
pub(crate) struct Storing {
    watch: Arc<ResultWatch>,
    caller: Option<Caller>,
}

impl Drop for Storing {
    fn drop(&mut self) {
        if let Some(caller) = self.caller.take() {
            self.watch.book().finished(caller, Instant::now());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key() -> MailboxKey {
        MailboxKey::new("acme").with_session("s")
    }

    #[test]
    fn a_result_taken_waits_nowhere_whether_its_store_had_finished_or_not() {
        let watch = ResultWatch::new();
        // Taken while its guard is still held (the mailbox answered the take first).
        let before = watch.mark();
        let storing = watch.storing(&key(), 5);
        watch.taken(&key(), 5);
        assert!(
            !watch.may_wait(&key(), 5, Some(before)),
            "taken while marked"
        );
        drop(storing);
        assert!(
            !watch.may_wait(&key(), 5, Some(before)),
            "and once finished"
        );
        assert!(!watch.may_wait(&key(), 5, None));

        // Taken after its store finished.
        let before = watch.mark();
        drop(watch.storing(&key(), 6));
        assert!(
            watch.may_wait(&key(), 6, Some(before)),
            "stored after the mark"
        );
        watch.taken(&key(), 6);
        assert!(!watch.may_wait(&key(), 6, Some(before)), "taken since");

        // Two results of one caller on their way, one taken: the other still waits.
        let first = watch.storing(&key(), 7);
        let second = watch.storing(&key(), 7);
        watch.taken(&key(), 7);
        assert!(
            watch.may_wait(&key(), 7, None),
            "one of two is still stored"
        );
        drop(first);
        assert!(
            watch.may_wait(&key(), 7, None),
            "the other is still storing"
        );
        let before = watch.mark();
        drop(second);
        assert!(
            watch.may_wait(&key(), 7, Some(before)),
            "the other, not taken"
        );
    }

    #[test]
    fn a_result_may_wait_while_it_is_stored_and_after_a_mark_taken_before_its_store() {
        let watch = ResultWatch::new();
        assert!(
            !watch.may_wait(&key(), 5, Some(watch.mark())),
            "nothing stored"
        );

        let before = watch.mark();
        let storing = watch.storing(&key(), 5);
        assert!(watch.may_wait(&key(), 5, None), "storing");
        assert!(watch.may_wait(&key(), 5, Some(before)), "storing");
        assert!(!watch.may_wait(&key(), 6, Some(before)), "another id");
        let other = MailboxKey::new("acme").with_session("t");
        assert!(!watch.may_wait(&other, 5, Some(before)), "another key");

        drop(storing);
        let after = watch.mark();
        assert_eq!(after, before + 1, "one store finished");
        assert!(
            watch.may_wait(&key(), 5, Some(before)),
            "stored after the mark: the question may have missed it"
        );
        assert!(
            !watch.may_wait(&key(), 5, Some(after)),
            "stored before the mark: the question saw it"
        );
        assert!(
            !watch.may_wait(&key(), 5, None),
            "no question, nothing storing"
        );
    }

    #[test]
    fn a_result_stored_twice_at_once_is_storing_until_both_finished() {
        let watch = ResultWatch::new();
        let first = watch.storing(&key(), 5);
        let second = watch.storing(&key(), 5);
        drop(first);
        assert!(watch.may_wait(&key(), 5, None), "one store still runs");
        drop(second);
        assert!(!watch.may_wait(&key(), 5, None));
        assert_eq!(watch.mark(), 2);
    }

    #[test]
    fn finished_stores_are_forgotten_after_the_window() {
        let watch = ResultWatch::new();
        let start = Instant::now();
        let mut book = watch.book();
        *book.storing.entry((key(), 5)).or_insert(0) += 1;
        book.finished((key(), 5), start);
        book.forget_old(start + REMEMBERED - Duration::from_millis(1));
        assert_eq!(book.stored.get(&(key(), 5)), Some(&1), "still remembered");
        book.forget_old(start + REMEMBERED);
        assert!(book.stored.is_empty(), "forgotten");
        assert!(book.order.is_empty());
        assert!(book.storing.is_empty());
    }
}
