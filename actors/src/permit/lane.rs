//! The permits' fast path: units a pool's scheduler lends out while nobody waits, taken and
//! given back on the callers' threads with one atomic operation each.
//!
//! # Algorithm
//!
//! Each resource kind has a *lane*: one word, an `OPEN` bit and a count of available units.
//! Only the scheduler opens a lane, and only when its core allows it (rule 19 of the core:
//! nothing parked, no reservation, not paused, no fair share, budget or headroom on the kind);
//! it lends the kind's free units and stores `OPEN | units`. A caller then
//!
//! - [takes](Lanes::try_take) units with a compare-and-swap when the lane is open and has
//!   enough: the permit is granted without a message;
//! - [gives](Lanes::give) units back with a compare-and-swap when the lane is open; when it
//!   is closed, the caller sends them to the scheduler instead (`PermitOp::LaneReturn`),
//!   which is how a release reaches the waiters, in rank order, while anyone waits.
//!
//! Before the scheduler feeds its core any event (a task, a permit request, a release, a
//! timer) it [closes](Lanes::close) every open lane with one swap, which hands back the
//! units nobody took; it reopens them once the event is handled, if the core still allows it.
//! A caller that finds a lane closed takes the slow path: it asks the scheduler, which ranks
//! it among the waiters. So a newcomer never overtakes a waiter: a waiter exists only after
//! the scheduler closed the lane, and the lane stays closed while it waits.
//!
//! Each permit granted on the fast path is also registered with the lanes: the
//! scheduler learns of it at its next drain without being woken for each one (when
//! [`NUDGE_EVERY`] registrations wait, it is nudged once), and takes it over (makes it a running
//! permit of its core) when a decision needs to see it: to ask it to yield, for the deadlock
//! rule, for an inspection, or when it asks to grow in rank.
//!
//! # Invariants (model-checked in `actors/tests/loom_lane.rs`)
//!
//! - A unit is handed out at most once: the units taken and not given back never exceed
//!   those lent, and after a close no take succeeds until the scheduler opens the lane again.
//! - A unit given back is counted once: either the open lane takes it (and the next close
//!   returns it to the scheduler), or the caller sends it to the scheduler; never both,
//!   never neither.

use std::sync::{Arc, PoisonError};

use sync::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Mutex, MutexGuard, Ordering};

use super::{AcquireAnswer, Grant, Holding};
use crate::domain::ResourceKind;
use crate::queue::EntryId;

#[cfg(loom)]
mod sync {
    pub(super) use loom::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
    pub(super) use loom::sync::{Mutex, MutexGuard};
}

#[cfg(not(loom))]
mod sync {
    pub(super) use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
    pub(super) use std::sync::{Mutex, MutexGuard};
}

const KINDS: usize = ResourceKind::COUNT;

/// The lane is open: its units may be taken.
const OPEN: u64 = 1 << 63;
/// The units available in a lane's word.
const UNITS: u64 = u32::MAX as u64;

/// How many registrations pass before the scheduler is nudged to take them in.
pub const NUDGE_EVERY: usize = 1024;

/// The lanes of one pool, one per kind. See the module docs.
pub struct Lanes {
    words: [AtomicU64; KINDS],
    /// Units lent per kind, as the scheduler last wrote them (for statistics).
    lent: [AtomicU32; KINDS],
    /// Permits granted on the fast path and not yet taken over or dropped.
    holders: AtomicUsize,
    /// Permits granted on the fast path since the scheduler last took them in. A vector
    /// the scheduler swaps with one it emptied, so a registration allocates nothing once
    /// the two have grown (a lock-free queue allocates a block every few dozen pushes,
    /// which showed as the fast path's 99th percentile).
    registered: Mutex<Vec<Arc<Holding>>>,
    /// Per kind: whether a baton waits for a releaser (a hint read without the lock).
    baton_ready: [AtomicBool; KINDS],
    /// Set while a hand-off waits to be booked.
    handed_any: AtomicBool,
    batons: Mutex<Batons>,
}

/// The hand-off: what a releaser may grant directly while someone waits (see the module
/// docs).
#[derive(Default)]
struct Batons {
    ready: [Option<Baton>; KINDS],
    /// Hand-offs made that the scheduler has not booked yet.
    handed: Vec<Handed>,
}

/// The waiter a releaser of at least `deficit` units of its kind may grant at once: the one
/// the scheduler would grant first once those units came back.
pub struct Baton {
    pub(crate) deficit: u32,
    pub(crate) answer: Arc<AcquireAnswer>,
    pub(crate) grant: Grant,
}

impl Baton {
    /// A baton for the waiter filed as `entry` (a permit of `units` units of `kind`), which
    /// lacks `deficit` units: for the loom models.
    pub fn for_waiter(entry: EntryId, kind: ResourceKind, units: u32, deficit: u32) -> Self {
        let cost = crate::domain::ResourceCost::new(kind, units);
        Self {
            deficit,
            answer: Arc::new(AcquireAnswer::new()),
            grant: Grant {
                entry,
                holding: Holding::granted(entry, entry, crate::domain::Priority::Normal, cost),
            },
        }
    }

    /// The waiter's entry.
    pub fn waiter(&self) -> EntryId {
        self.grant.entry
    }
}

/// A hand-off made: the waiter `to` was granted by a releaser whose units (its claim
/// `from`, and `lane_units` it had borrowed) the scheduler has yet to book.
pub struct Handed {
    pub(crate) to: EntryId,
    pub(crate) holding: Arc<Holding>,
    pub(crate) kind: ResourceKind,
    pub(crate) from: Option<EntryId>,
    pub(crate) lane_units: u32,
}

impl Handed {
    /// The waiter that was granted.
    pub fn waiter(&self) -> EntryId {
        self.to
    }
}

impl crate::observe::stats::Unread for Lanes {
    fn borrowed(&self, kind: ResourceKind) -> u32 {
        Lanes::borrowed(self, kind)
    }

    fn holders(&self) -> usize {
        Lanes::holders(self)
    }
}

impl Default for Lanes {
    fn default() -> Self {
        Self::new()
    }
}

impl std::fmt::Debug for Lanes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let open: Vec<_> = ResourceKind::ALL
            .iter()
            .filter(|kind| self.is_open(**kind))
            .map(|kind| (*kind, self.available(*kind)))
            .collect();
        f.debug_struct("Lanes").field("open", &open).finish()
    }
}

impl Lanes {
    /// Every lane closed.
    pub fn new() -> Self {
        Self {
            words: std::array::from_fn(|_| AtomicU64::new(0)),
            lent: std::array::from_fn(|_| AtomicU32::new(0)),
            holders: AtomicUsize::new(0),
            registered: Mutex::new(Vec::new()),
            baton_ready: std::array::from_fn(|_| AtomicBool::new(false)),
            handed_any: AtomicBool::new(false),
            batons: Mutex::new(Batons::default()),
        }
    }

    fn word(&self, kind: ResourceKind) -> &AtomicU64 {
        &self.words[kind.index()]
    }

    /// Takes `units` of `kind` if its lane is open and has them; returns whether it did.
    pub fn try_take(&self, kind: ResourceKind, units: u32) -> bool {
        let word = self.word(kind);
        let mut seen = word.load(Ordering::Acquire);
        loop {
            if seen & OPEN == 0 || seen & UNITS < u64::from(units) {
                return false;
            }
            match word.compare_exchange_weak(
                seen,
                seen - u64::from(units),
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => return true,
                Err(now) => seen = now,
            }
        }
    }

    /// Gives `units` of `kind` back to its lane if it is open; returns whether it took
    /// them. When it did not, the caller must send them to the scheduler.
    pub fn give(&self, kind: ResourceKind, units: u32) -> bool {
        if units == 0 {
            return true;
        }
        let word = self.word(kind);
        let mut seen = word.load(Ordering::Acquire);
        loop {
            if seen & OPEN == 0 {
                return false;
            }
            match word.compare_exchange_weak(
                seen,
                seen + u64::from(units),
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => return true,
                Err(now) => seen = now,
            }
        }
    }

    /// The scheduler closes the lane of `kind`; returns the units nobody took.
    pub fn close(&self, kind: ResourceKind) -> u32 {
        (self.word(kind).swap(0, Ordering::AcqRel) & UNITS) as u32
    }

    /// The scheduler opens the closed lane of `kind` with `units` available.
    pub fn open(&self, kind: ResourceKind, units: u32) {
        self.word(kind)
            .store(OPEN | u64::from(units), Ordering::Release);
    }

    /// Whether the lane of `kind` is open.
    pub fn is_open(&self, kind: ResourceKind) -> bool {
        self.word(kind).load(Ordering::Acquire) & OPEN != 0
    }

    /// Units available in the lane of `kind` (none when closed).
    pub fn available(&self, kind: ResourceKind) -> u32 {
        (self.word(kind).load(Ordering::Acquire) & UNITS) as u32
    }

    /// Units of `kind` held through the fast path now: lent less available (a reading for
    /// statistics, not exact while callers race).
    pub fn borrowed(&self, kind: ResourceKind) -> u32 {
        self.lent[kind.index()]
            .load(Ordering::Relaxed)
            .saturating_sub(self.available(kind))
    }

    /// The scheduler notes how many units of `kind` its core has lent.
    pub fn note_lent(&self, kind: ResourceKind, units: u32) {
        self.lent[kind.index()].store(units, Ordering::Relaxed);
    }

    /// Permits granted on the fast path that the scheduler has not taken over yet.
    pub fn holders(&self) -> usize {
        self.holders.load(Ordering::Relaxed)
    }

    /// A permit granted on the fast path. Returns whether the scheduler should be nudged to
    /// take in what was registered.
    pub(crate) fn register(&self, holding: Arc<Holding>) -> bool {
        self.holders.fetch_add(1, Ordering::Relaxed);
        let mut registered = self
            .registered
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        registered.push(holding);
        registered.len() == NUDGE_EVERY
    }

    /// A fast-path holder left the fast path's count: dropped before it was taken over,
    /// or taken over.
    pub(crate) fn holder_left(&self) {
        self.holders.fetch_sub(1, Ordering::Relaxed);
    }

    /// The scheduler takes in the registrations: they are swapped into `spare`, an empty
    /// vector whose room the lanes keep for the next ones.
    pub(crate) fn take_registered(&self, spare: &mut Vec<Arc<Holding>>) {
        debug_assert!(spare.is_empty());
        let mut registered = self
            .registered
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        std::mem::swap(&mut *registered, spare);
    }

    /// Closes every lane for good (the scheduler stopped): nothing is handed out any more.
    pub fn close_all(&self) {
        for kind in ResourceKind::ALL {
            self.close(kind);
        }
        drop(self.revoke());
    }

    fn batons(&self) -> MutexGuard<'_, Batons> {
        self.batons.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Whether the scheduler may offer a baton for `kind`: none is offered, and no hand-off
    /// waits to be booked (until it is, the core has not seen it, and a second baton could
    /// name the same waiter).
    pub fn may_offer(&self, kind: ResourceKind) -> bool {
        let batons = self.batons();
        batons.ready[kind.index()].is_none() && batons.handed.is_empty()
    }

    /// The scheduler offers `baton` to the releasers of units of `kind`, if it still may.
    pub fn offer(&self, kind: ResourceKind, baton: Baton) {
        let mut batons = self.batons();
        if batons.ready[kind.index()].is_some() || !batons.handed.is_empty() {
            return;
        }
        batons.ready[kind.index()] = Some(baton);
        self.baton_ready[kind.index()].store(true, Ordering::Release);
    }

    /// The scheduler takes back every baton nobody took, and the hand-offs made since it
    /// last looked, to book them.
    pub fn revoke(&self) -> Vec<Handed> {
        // Only the scheduler offers: with no baton offered and no hand-off made, there is
        // nothing to take back (and no releaser can be taking one).
        let offered = self
            .baton_ready
            .iter()
            .any(|ready| ready.load(Ordering::Acquire));
        if !offered && !self.handed_any.load(Ordering::Acquire) {
            return Vec::new();
        }
        let mut batons = self.batons();
        for (ready, hint) in batons.ready.iter_mut().zip(&self.baton_ready) {
            hint.store(false, Ordering::Relaxed);
            *ready = None;
        }
        self.handed_any.store(false, Ordering::Relaxed);
        std::mem::take(&mut batons.handed)
    }

    /// Whether a hand-off waits to be booked.
    pub fn has_handed(&self) -> bool {
        self.handed_any.load(Ordering::Acquire)
    }

    /// A releaser gives back `units` of `kind` (its claim `from`, and `lane_units` it had
    /// borrowed): if a baton waits for no more than that, it takes it (the hand-off is
    /// booked for the scheduler) and must grant the waiter. Only while the lane is closed.
    pub fn take_baton(
        &self,
        kind: ResourceKind,
        units: u32,
        from: Option<EntryId>,
        lane_units: u32,
    ) -> Option<Baton> {
        if !self.baton_ready[kind.index()].load(Ordering::Acquire) {
            return None;
        }
        let mut batons = self.batons();
        let ready = &mut batons.ready[kind.index()];
        if ready.as_ref().is_none_or(|baton| baton.deficit > units) {
            return None;
        }
        let baton = ready.take()?;
        self.baton_ready[kind.index()].store(false, Ordering::Relaxed);
        self.handed_any.store(true, Ordering::Release);
        batons.handed.push(Handed {
            to: baton.grant.entry,
            holding: baton.grant.holding.clone(),
            kind,
            from,
            lane_units,
        });
        Some(baton)
    }
}

/// Set once the scheduler took the permit over: its units outside `borrowed` are its core
/// claim's, and its drop must tell the scheduler.
const ADOPTED: u64 = 1 << 32;
/// Set once the permit was dropped: nothing may take it over any more.
const GONE: u64 = 1 << 33;

/// A permit's side of the fast path: the units it borrowed from its kind's lane (which its
/// core claim does not count), and whether the scheduler took it over.
///
/// The holder [borrows](Self::borrow) and [unborrows](Self::unborrow); the scheduler
/// [takes it over](Self::take_over), moving what it borrowed into its claim; the holder's
/// drop [leaves](Self::leave). Take-over and leave race on one word, so exactly one of them
/// decides what the borrowed units become (a claim's, or the lane's again).
#[derive(Debug)]
pub struct FastState(AtomicU64);

/// What [`FastState::leave`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Left {
    /// Units still borrowed: the holder gives them back to the lane (or the scheduler).
    pub borrowed: u32,
    /// Whether the scheduler had taken the permit over: it must be told of the drop.
    pub adopted: bool,
}

impl FastState {
    /// A permit granted on the fast path, holding `units` borrowed from the lane.
    pub fn borrowing(units: u32) -> Self {
        Self(AtomicU64::new(u64::from(units)))
    }

    /// A permit the scheduler granted: everything it holds is its claim's.
    pub fn adopted() -> Self {
        Self(AtomicU64::new(ADOPTED))
    }

    /// The holder borrowed `units` more from the lane.
    pub fn borrow(&self, units: u32) {
        self.0.fetch_add(u64::from(units), Ordering::AcqRel);
    }

    /// The holder gives back up to `units` of what it borrowed; returns how many (the rest,
    /// if any, is its claim's).
    pub fn unborrow(&self, units: u32) -> u32 {
        let mut seen = self.0.load(Ordering::Acquire);
        loop {
            let taken = ((seen & UNITS) as u32).min(units);
            if taken == 0 {
                return 0;
            }
            match self.0.compare_exchange_weak(
                seen,
                seen - u64::from(taken),
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => return taken,
                Err(now) => seen = now,
            }
        }
    }

    /// The scheduler takes the permit over: returns what it had borrowed (now the claim's)
    /// and whether it was taken over before, or `None` once the holder dropped it.
    pub fn take_over(&self) -> Option<(u32, bool)> {
        let mut seen = self.0.load(Ordering::Acquire);
        loop {
            if seen & GONE != 0 {
                return None;
            }
            match self
                .0
                .compare_exchange_weak(seen, ADOPTED, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => return Some(((seen & UNITS) as u32, seen & ADOPTED != 0)),
                Err(now) => seen = now,
            }
        }
    }

    /// The holder drops the permit.
    pub fn leave(&self) -> Left {
        let seen = self.0.swap(GONE, Ordering::AcqRel);
        Left {
            borrowed: (seen & UNITS) as u32,
            adopted: seen & ADOPTED != 0,
        }
    }

    /// Whether the holder dropped the permit.
    pub fn is_gone(&self) -> bool {
        self.0.load(Ordering::Acquire) & GONE != 0
    }

    /// Units borrowed now.
    pub fn borrowed(&self) -> u32 {
        (self.0.load(Ordering::Acquire) & UNITS) as u32
    }
}
