//! The permits' fast path in the shell: when the lanes open and close, and how a permit
//! granted on the fast path becomes a running permit of the core (see `crate::permit::lane`
//! for the lanes, and rule 19 of the core).
//!
//! # Rules
//!
//! - **Closed while the core decides.** The actor closes every open lane before it feeds
//!   the shell an event ([`Shell::close_lanes`]): what the lane did not hand out returns to
//!   the core, which then sees its true free units. It opens them again once the event's
//!   effects are carried out ([`Shell::open_lanes`]), with what the core allows.
//! - **Taken in, taken over.** Registrations of fast-path permits are taken in at every
//!   drain ([`Shell::take_in_registrations`]), and the ones dropped since are forgotten. A
//!   permit is *taken over* (given an entry and a running claim in the core, its borrowed
//!   units moved into it) when it asks to grow in rank, and every live one of a kind when a
//!   waiter of that kind may preempt, when the deadlock rule counts holders, and for an
//!   inspection.
//!
//! # Invariants
//!
//! - The core's lent units of a kind are what the lane holds plus what fast-path holders
//!   borrowed and have not given back (to the lane, or by `PermitOp::LaneReturn` on its way).
//! - A lane is open only while the shell admits work and the core's `lane_room` allowed
//!   it at the opening.

use std::sync::Arc;

use super::Shell;
use crate::domain::{ResourceCost, ResourceKind};
use crate::permit::lane::Lanes;
use crate::permit::Holding;
use crate::queue::EntryId;
use crate::scheduler::core::Ticket;
use crate::scheduler::shell::ledger::admitted_ms;

const KINDS: usize = ResourceKind::COUNT;

/// The shell's side of the lanes.
pub(crate) struct LaneBook {
    lanes: Arc<Lanes>,
    /// Which lanes this shell opened and has not closed since.
    open: [bool; KINDS],
    /// Fast-path permits taken in and not taken over (some may be dropped since).
    fast: Vec<Arc<Holding>>,
    /// An empty vector to swap the lanes' registrations into.
    spare: Vec<Arc<Holding>>,
}

impl LaneBook {
    pub fn new(lanes: Arc<Lanes>) -> Self {
        Self {
            lanes,
            open: [false; KINDS],
            fast: Vec::new(),
            spare: Vec::new(),
        }
    }
}

impl<P, R> Shell<P, R>
where
    P: Send + 'static,
    R: Send + 'static,
{
    /// Closes every open lane; the units nobody took return to the core.
    pub fn close_lanes(&mut self, now: u64) {
        for kind in ResourceKind::ALL {
            if !std::mem::take(&mut self.lanes.open[kind.index()]) {
                continue;
            }
            let units = self.lanes.lanes.close(kind);
            let started = self.tasks.core.reclaim(kind, units, now);
            self.lanes.lanes.note_lent(kind, self.tasks.core.lent(kind));
            self.start_parked(started, now);
        }
    }

    /// Opens the lanes the core allows, lending them its free units (see the module docs).
    pub fn open_lanes(&mut self) {
        if self.lifecycle.admits().is_err() || self.has_effects() {
            return;
        }
        for kind in ResourceKind::ALL {
            if self.lanes.open[kind.index()] {
                continue;
            }
            let room = self.tasks.core.lane_room(kind);
            if room == 0 {
                continue;
            }
            let lent = self.tasks.core.lend(kind, room);
            self.lanes.lanes.note_lent(kind, self.tasks.core.lent(kind));
            self.lanes.lanes.open(kind, lent);
            self.lanes.open[kind.index()] = true;
        }
    }

    /// Takes in the fast path's registrations and forgets the permits dropped since.
    pub fn take_in_registrations(&mut self) {
        let book = &mut self.lanes;
        book.lanes.take_registered(&mut book.spare);
        let taken = !book.spare.is_empty();
        book.fast.append(&mut book.spare);
        if taken || book.fast.len() > 64 {
            book.fast
                .retain(|holding| !holding.fast.is_gone() && holding.entry() == 0);
        }
    }

    /// A holder gives back units it borrowed from a lane that was closed.
    pub(super) fn lane_return(&mut self, kind: ResourceKind, units: u32, now: u64) {
        let started = self.tasks.core.reclaim(kind, units, now);
        self.lanes.lanes.note_lent(kind, self.tasks.core.lent(kind));
        self.start_parked(started, now);
    }

    /// Takes the permit held through `holding` over: gives it an entry and a running claim,
    /// or (taken over before) moves what it borrowed since into its claim. Returns its
    /// entry, or `None` once its holder dropped it.
    pub(super) fn take_over(&mut self, holding: &Arc<Holding>, now: u64) -> Option<EntryId> {
        let mut entry = holding.entry();
        let fresh = entry == 0;
        if fresh {
            entry = self.tasks.ledger.next_entry(now);
            holding.set_entry(entry);
        }
        let (borrowed, adopted) = holding.fast.take_over()?;
        if adopted {
            if borrowed > 0 && self.tasks.core.settle(entry, borrowed).is_err() {
                // Its claim is gone (released meanwhile): the units go back to the lane's
                // books, and from there to the pool.
                self.lane_return(holding.kind, borrowed, now);
            }
        } else {
            let ticket = Ticket {
                id: entry,
                priority: holding.priority,
                cost: ResourceCost::new(holding.kind, borrowed),
                created_at_ms: admitted_ms(entry),
                deadline_ms: None,
                tenant: 0,
                timeout_ms: None,
            };
            if let Err(error) = self.tasks.core.adopt(ticket, now) {
                tracing::error!(pool = %self.tasks.pool, %error, "bug: a fast-path permit could not be taken over");
                self.lane_return(holding.kind, borrowed, now);
                return None;
            }
            self.lanes.lanes.holder_left();
            self.permits.adopted(entry, holding.clone());
        }
        self.lanes
            .lanes
            .note_lent(holding.kind, self.tasks.core.lent(holding.kind));
        Some(entry)
    }

    /// Takes over every live fast-path permit of `kind` (or of every kind: `None`).
    pub fn take_over_all(&mut self, kind: Option<ResourceKind>, now: u64) {
        self.take_in_registrations();
        if self.lanes.fast.is_empty() {
            return;
        }
        let fast = std::mem::take(&mut self.lanes.fast);
        let mut kept = Vec::new();
        for holding in fast {
            if kind.is_some_and(|kind| kind != holding.kind) {
                kept.push(holding);
            } else if !holding.fast.is_gone() && holding.entry() == 0 {
                self.take_over(&holding, now);
            }
        }
        self.lanes.fast = kept;
    }
}
