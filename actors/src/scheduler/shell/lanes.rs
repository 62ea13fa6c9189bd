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
use crate::permit::lane::{Baton, Handed, Lanes};
use crate::permit::{Grant, Holding};
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
    /// Closes every open lane; the units nobody took return to the core. Takes back the
    /// batons nobody took and books the hand-offs made.
    pub fn close_lanes(&mut self, now: u64) {
        for handed in self.lanes.lanes.revoke() {
            self.book_hand_off(handed, now);
        }
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

    /// Whether a hand-off waits to be booked: the lanes must close (and book it) before the
    /// next event.
    pub fn hand_off_made(&self) -> bool {
        self.lanes.lanes.has_handed()
    }

    /// Opens the lanes the core allows, lending them its free units (see the module docs);
    /// where someone waits, offers the releasers the waiter the core would grant first.
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
                self.offer_baton(kind);
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

    /// Offers the releasers of `kind` the waiter the core would grant first once enough
    /// units come back, when it is a permit's acquire (rule 19's hand-off).
    fn offer_baton(&mut self, kind: ResourceKind) {
        let Some((entry, deficit)) = self.tasks.core.hand_off_candidate(kind) else {
            return;
        };
        if !self.lanes.lanes.may_offer(kind) {
            return;
        }
        let (Some((answer, id, priority)), Some((cost, _))) = (
            self.permits.acquire_waiter(entry),
            self.tasks.core.ticket_of(entry),
        ) else {
            return;
        };
        let grant = Grant {
            entry,
            holding: Holding::granted(entry, id, priority, cost),
        };
        let answer = answer.clone();
        self.lanes.lanes.offer(
            kind,
            Baton {
                deficit,
                answer,
                grant,
            },
        );
    }

    /// A releaser granted the waiter `handed.to` itself: its units come back (all before
    /// anything starts, so that waiter, the first the core would grant, starts first) and
    /// the waiter is held.
    fn book_hand_off(&mut self, handed: Handed, now: u64) {
        let Handed {
            to,
            holding,
            kind,
            from,
            lane_units,
        } = handed;
        self.permits.handed(to, holding);
        let claim = from.filter(|&entry| self.forget_held(entry, now));
        match self.tasks.core.hand_back(claim, kind, lane_units, now) {
            Ok(started) => self.start_parked(started, now),
            Err(error) => {
                tracing::error!(pool = %self.tasks.pool, %error, "bug: a hand-off's releaser is not running")
            }
        }
        self.lanes.lanes.note_lent(kind, self.tasks.core.lent(kind));
        if self.permits.unstarted_hand_off(to).is_some() {
            tracing::error!(pool = %self.tasks.pool, entry = to, "bug: a waiter granted by a hand-off did not start");
        }
        self.stop_if_drained();
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
                also: Default::default(),
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
