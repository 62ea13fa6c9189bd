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
//! How it reaches the scheduler: while nobody waits for a kind, an acquire, grow, shrink or
//! release that fits never does: it takes or gives units of the kind's *lane* with one
//! atomic operation on the caller's thread (see `lane.rs`). Otherwise every request is a
//! `PermitOp` pushed onto the pool's inbox (the queue submissions take), and every answer
//! comes back through an `answer::Answer` cell, which keeps a waiter that gives up from
//! leaking units.

#[doc(hidden)]
pub mod answer;
mod holder;
#[doc(hidden)]
pub mod lane;

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;

use tokio::sync::Notify;

use crate::domain::{
    ExtraCosts, PoolError, Priority, ResourceCost, ResourceKind, TaskId, TaskMetadata,
};
use crate::queue::EntryId;
use answer::Answer;
use lane::{FastState, Lanes};

#[cfg(test)]
pub(crate) use holder::{acquire_from_lane, grow_from_lane, release_holding, shrink_holding};
pub use holder::{Acquire, Gate, PendingGrow, Permit};

/// What a granted permit shares between its holder and the scheduler.
#[derive(Debug)]
pub(crate) struct Holding {
    /// Units held now, as the holder sees them: its core claim's and those it borrowed
    /// from its lane.
    units: AtomicU32,
    /// Set once a waiter of higher priority asked the holder to yield.
    preempted: AtomicBool,
    /// Wakes those waiting in [`Permit::preempted`].
    yielding: Notify,
    /// The caller's id of the permit.
    pub id: TaskId,
    /// The permit's rank, for when the scheduler takes it over.
    pub priority: Priority,
    /// The kind of its units.
    pub kind: ResourceKind,
    /// Its entry in the scheduler; 0 until the scheduler has one (a permit of the fast
    /// path, not yet taken over).
    entry: AtomicU64,
    /// What it borrowed from its lane, and whether it was taken over.
    pub fast: FastState,
}

impl Holding {
    /// A permit the scheduler granted as `entry` to caller `id`, holding `cost` in its claim.
    pub(crate) fn granted(
        entry: EntryId,
        id: TaskId,
        priority: Priority,
        cost: ResourceCost,
    ) -> Arc<Self> {
        Arc::new(Self {
            units: AtomicU32::new(cost.units),
            preempted: AtomicBool::new(false),
            yielding: Notify::new(),
            id,
            priority,
            kind: cost.kind,
            entry: AtomicU64::new(entry),
            fast: FastState::adopted(),
        })
    }

    /// A permit granted on the fast path, holding `meta.cost.units` borrowed from its lane.
    pub(crate) fn borrowing(meta: &TaskMetadata) -> Arc<Self> {
        Arc::new(Self {
            units: AtomicU32::new(meta.cost.units),
            preempted: AtomicBool::new(false),
            yielding: Notify::new(),
            id: meta.id,
            priority: meta.priority,
            kind: meta.cost.kind,
            entry: AtomicU64::new(0),
            fast: FastState::borrowing(meta.cost.units),
        })
    }

    /// Its entry in the scheduler, or 0 before it has one.
    pub(crate) fn entry(&self) -> EntryId {
        self.entry.load(Ordering::Acquire)
    }

    /// The scheduler files it under `entry` (before it takes it over, so that a holder
    /// that sees the take-over sees the entry too).
    pub(crate) fn set_entry(&self, entry: EntryId) {
        self.entry.store(entry, Ordering::Release);
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
    /// A holder gives back `units` of `kind` it borrowed from a lane that was closed.
    LaneReturn { kind: ResourceKind, units: u32 },
    /// Grant a permit for `meta` (and `also`, core rule 25), or park it until it fits
    /// (`wait`), or refuse it.
    Acquire {
        meta: TaskMetadata,
        also: ExtraCosts,
        wait: bool,
        answer: Arc<AcquireAnswer>,
    },
    /// The acquire behind `answer` was given up.
    WithdrawAcquire(Arc<AcquireAnswer>),
    /// Add `extra` units to the permit held through `holding`: at once, or ranked (`wait`).
    /// (A permit of the fast path has no entry yet: the scheduler takes it over first.)
    Grow {
        holding: Arc<Holding>,
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
            | PermitOp::LaneReturn { .. }
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

    /// The pool's lanes (the fast path).
    fn lanes(&self) -> &Lanes;

    /// Wakes the scheduler to take in the fast path's registrations.
    fn nudge(&self);
}
