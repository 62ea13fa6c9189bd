//! Capacity permits: units a pool's scheduler grants to code that runs outside the pool.
//!
//! A batching engine steps every live sequence in one loop of its own and never hands a
//! request to a pool's worker. It still needs what the parking lot gives tasks: an order
//! among waiters (priority, skip-ahead, the starvation guard, fair share, deadlines, a queue
//! bound) and a budget that is never overdrawn. A *permit* is a ticket of the same core
//! whose run happens outside: the scheduler grants it units (no worker slot) by the same
//! rules that start tasks, and the units come back exactly once, when the permit is dropped.
//!
//! - [`Gate`] asks for permits: [`Gate::acquire`] waits in rank order (dropping the future
//!   withdraws the waiter), [`Gate::acquire_blocking`] waits on the calling thread,
//!   [`Gate::try_acquire`] grants only what the fast path would.
//! - [`Permit`] holds units: it grows at once ([`Permit::try_grow`]) or in rank order
//!   ([`Permit::grow`]), shrinks at once, and hears when a waiter of higher priority asks it
//!   to yield ([`Permit::preempted`]).
//!
//! How it reaches the scheduler: every request is a `PermitOp` pushed onto the pool's
//! inbox (the queue submissions take), and every answer comes back through an
//! `answer::Answer` cell, which keeps a waiter that gives up from leaking units.

#[doc(hidden)]
pub mod answer;
mod holder;

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;

use tokio::sync::Notify;

use crate::domain::{PoolError, TaskMetadata};
use crate::queue::EntryId;
use answer::Answer;

pub use holder::{Acquire, Gate, Permit};

/// What a granted permit shares between its holder and the scheduler.
#[derive(Debug, Default)]
pub(crate) struct Holding {
    /// Units held now, as the holder sees them.
    units: AtomicU32,
    /// Set once a waiter of higher priority asked the holder to yield.
    preempted: AtomicBool,
    /// Wakes those waiting in [`Permit::preempted`].
    yielding: Notify,
}

impl Holding {
    pub(crate) fn with_units(units: u32) -> Arc<Self> {
        Arc::new(Self {
            units: AtomicU32::new(units),
            ..Self::default()
        })
    }

    pub(crate) fn units(&self) -> u32 {
        self.units.load(Ordering::Acquire)
    }

    pub(crate) fn add(&self, units: u32) {
        self.units.fetch_add(units, Ordering::AcqRel);
    }

    /// Takes up to `units` off; returns how many were taken.
    pub(crate) fn take(&self, units: u32) -> u32 {
        let mut taken = 0;
        let _ = self
            .units
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |held| {
                taken = held.min(units);
                Some(held - taken)
            });
        taken
    }

    /// A waiter of higher priority asks the holder to yield.
    pub(crate) fn preempt(&self) {
        self.preempted.store(true, Ordering::Release);
        self.yielding.notify_waiters();
    }

    pub(crate) fn is_preempted(&self) -> bool {
        self.preempted.load(Ordering::Acquire)
    }
}

/// A granted permit as the scheduler hands it over.
pub(crate) struct Grant {
    pub entry: EntryId,
    pub holding: Arc<Holding>,
}

/// The answer to an acquire.
pub(crate) type AcquireAnswer = Answer<Result<Grant, PoolError>>;
/// The answer to a grow.
pub(crate) type GrowAnswer = Answer<Result<(), PoolError>>;

/// A request to the scheduler about permits.
pub(crate) enum PermitOp {
    /// Grant a permit for `meta`, or park it until it fits (`wait`), or refuse it.
    Acquire {
        meta: TaskMetadata,
        wait: bool,
        answer: Arc<AcquireAnswer>,
    },
    /// The acquire behind `answer` was given up.
    WithdrawAcquire(Arc<AcquireAnswer>),
    /// Add `extra` units to the permit `entry`: at once, or ranked (`wait`).
    Grow {
        entry: EntryId,
        extra: u32,
        wait: bool,
        answer: Arc<GrowAnswer>,
    },
    /// The grow behind `answer` was given up.
    WithdrawGrow(Arc<GrowAnswer>),
    /// The permit `entry` gives `units` back.
    Shrink { entry: EntryId, units: u32 },
    /// The permit `entry` was dropped.
    Release { entry: EntryId },
}

impl PermitOp {
    /// Answers a request that no scheduler will see (it stopped).
    pub(crate) fn refuse(self, error: PoolError) {
        match self {
            PermitOp::Acquire { answer, .. } => {
                let _ = answer.give(Err(error));
            }
            PermitOp::Grow { answer, .. } => {
                let _ = answer.give(Err(error));
            }
            PermitOp::WithdrawAcquire(_)
            | PermitOp::WithdrawGrow(_)
            | PermitOp::Shrink { .. }
            | PermitOp::Release { .. } => {}
        }
    }
}

/// Where permit requests go: the pool's inbox.
pub(crate) trait PermitPort: Send + Sync {
    /// Hands `op` to the scheduler; once it has stopped, answers it with `Shutdown`.
    fn send(&self, op: PermitOp);
}
