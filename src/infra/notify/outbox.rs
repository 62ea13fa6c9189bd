//! The notifier's bounded outbox: notifications wait here, oldest first, until a delivery
//! slot is free. When it is full the oldest waiting notification makes room for the new
//! one: a receiver that was down learns of the latest results first, and memory stays
//! bounded. Only the notification is dropped; the result it announced stays stored.

use std::collections::VecDeque;

/// A notification dropped to make room.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Overflow<T> {
    /// The notification that was dropped.
    pub dropped: T,
    /// Whether it is the first drop since the outbox last had room (worth a warning; the
    /// rest of an overflow are only counted).
    pub first: bool,
}

/// See the module docs.
#[derive(Debug)]
pub(crate) struct Outbox<T> {
    waiting: VecDeque<T>,
    capacity: usize,
    /// A notification was dropped and the outbox has not had room since.
    overflowing: bool,
}

impl<T> Outbox<T> {
    /// An outbox holding at most `capacity` notifications (at least 1).
    pub fn new(capacity: usize) -> Self {
        let capacity = capacity.max(1);
        Self {
            waiting: VecDeque::with_capacity(capacity.min(1024)),
            capacity,
            overflowing: false,
        }
    }

    /// Adds a notification, dropping the oldest waiting one when full.
    pub fn push(&mut self, item: T) -> Option<Overflow<T>> {
        let overflow = if self.waiting.len() >= self.capacity {
            let first = !self.overflowing;
            self.overflowing = true;
            self.waiting
                .pop_front()
                .map(|dropped| Overflow { dropped, first })
        } else {
            None
        };
        self.waiting.push_back(item);
        overflow
    }

    /// Takes the oldest waiting notification.
    pub fn pop(&mut self) -> Option<T> {
        let item = self.waiting.pop_front();
        if self.waiting.len() < self.capacity {
            self.overflowing = false;
        }
        item
    }

    /// How many notifications wait.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.waiting.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn notifications_leave_oldest_first() {
        let mut outbox = Outbox::new(3);
        for n in 1..=3 {
            assert_eq!(outbox.push(n), None);
        }
        assert_eq!(outbox.len(), 3);
        assert_eq!(
            [outbox.pop(), outbox.pop(), outbox.pop()],
            [Some(1), Some(2), Some(3)]
        );
        assert_eq!(outbox.pop(), None);
    }

    #[test]
    fn a_full_outbox_drops_its_oldest_and_flags_the_first_drop_of_each_overflow() {
        let mut outbox = Outbox::new(2);
        outbox.push(1);
        outbox.push(2);
        assert_eq!(
            outbox.push(3),
            Some(Overflow {
                dropped: 1,
                first: true
            })
        );
        assert_eq!(
            outbox.push(4),
            Some(Overflow {
                dropped: 2,
                first: false
            })
        );
        assert_eq!(outbox.len(), 2);
        assert_eq!(outbox.pop(), Some(3));
        outbox.push(5);
        assert_eq!(
            outbox.push(6),
            Some(Overflow {
                dropped: 4,
                first: true
            })
        );
        assert_eq!([outbox.pop(), outbox.pop()], [Some(5), Some(6)]);
    }

    #[test]
    fn a_zero_capacity_still_holds_one() {
        let mut outbox = Outbox::new(0);
        assert_eq!(outbox.push('a'), None);
        assert_eq!(outbox.push('b').map(|overflow| overflow.dropped), Some('a'));
        assert_eq!(outbox.pop(), Some('b'));
    }
}
