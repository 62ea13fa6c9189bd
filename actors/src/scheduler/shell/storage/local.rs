//! The local durable mode: parked tasks are stored in a queue of this node's own (an embedded
//! file queue), through the queue actor, so the scheduler never awaits its I/O.
//!
//! The queue actor handles one entry's calls in the order they were asked (park, then claim
//! or remove, then settle) and answers every park and every claim, stored or failed. Until a
//! park's answer comes, its submitter waits (its reply sits in the task's record).
//!
//! Durability (see [`Durability`]):
//! - `Accepted`: a task that starts at once takes its capacity at once, and is parked and
//!   claimed through the queue (so it is stored as running); its submitter is answered and its
//!   job sent only once the queue handed it back. It is settled when it ends.
//! - `Parked { spin }` with a non-zero spin: a task that starts at once touches no file; a
//!   task that would park is answered at once and waits `spin` in the ledger, and is stored
//!   only if it is still parked then; one that starts, is cancelled or expires within the spin
//!   never touches the queue. A stop stores every spinning task.

use std::collections::VecDeque;
use std::time::Duration;

use crate::domain::{Durability, ScheduledTask};
use crate::queue::actor::QueueMsg;
use crate::queue::{EntryId, Settlement};
use crate::scheduler::shell::effects::{Effect, Effects};

/// The local durable mode's state. See the module docs.
pub(crate) struct LocalRoom {
    durability: Durability,
    /// When each spinning task is due to be stored, in that order. A task that left the
    /// spin meanwhile (started, cancelled, expired) is skipped when its time comes.
    spin_due: VecDeque<(u64, EntryId)>,
    /// Parks and claims asked of the queue actor and not yet answered.
    waits: usize,
}

impl LocalRoom {
    /// The mode with `durability`.
    pub fn new(durability: Durability) -> Self {
        Self {
            durability,
            spin_due: VecDeque::new(),
            waits: 0,
        }
    }

    /// Whether a task that starts at once is stored (as running) before it runs.
    pub fn stores_starts(&self) -> bool {
        self.durability.writes_started_tasks()
    }

    /// How long a task that would park waits in memory before it is stored, if it does.
    pub fn spin(&self) -> Option<Duration> {
        match self.durability {
            Durability::Parked { spin } if !spin.is_zero() => Some(spin),
            _ => None,
        }
    }

    /// Lets a task spin until `now + spin` before it is stored.
    pub fn spin_from(&mut self, entry: EntryId, spin: Duration, now: u64) {
        let spin_ms = u64::try_from(spin.as_millis()).unwrap_or(u64::MAX);
        self.spin_due
            .push_back((now.saturating_add(spin_ms), entry));
    }

    /// The next task whose spin is over at `now` (`all`: any spinning task, for a stop).
    pub fn next_spun(&mut self, now: u64, all: bool) -> Option<EntryId> {
        let &(due, entry) = self.spin_due.front()?;
        if !all && due > now {
            return None;
        }
        self.spin_due.pop_front();
        Some(entry)
    }

    /// When the next spinning task is due.
    pub fn next_due(&self) -> Option<u64> {
        self.spin_due.front().map(|&(due, _)| due)
    }

    /// Stores a parked task (answered with `QueueReport::Parked` or `ParkFailed`).
    pub fn park<P, R>(&mut self, entry: EntryId, task: ScheduledTask<P>, fx: &mut Effects<P, R>) {
        self.waits += 1;
        fx.push(Effect::Queue(QueueMsg::Park { entry, task }));
    }

    /// Takes a started task's payload back (answered with `Claimed` or `ClaimFailed`).
    pub fn claim<P, R>(&mut self, entry: EntryId, fx: &mut Effects<P, R>) {
        self.waits += 1;
        fx.push(Effect::Queue(QueueMsg::Claim { entry }));
    }

    /// Ends a claim.
    pub fn settle<P, R>(&self, entry: EntryId, settlement: Settlement, fx: &mut Effects<P, R>) {
        fx.push(Effect::Queue(QueueMsg::Settle { entry, settlement }));
    }

    /// Removes a parked task (cancelled, expired).
    pub fn remove<P, R>(&self, entry: EntryId, fx: &mut Effects<P, R>) {
        fx.push(Effect::Queue(QueueMsg::Remove { entry }));
    }

    /// The queue actor answered a park or a claim.
    pub fn answered(&mut self) {
        self.waits = self.waits.saturating_sub(1);
    }

    /// Whether the queue actor owes answers.
    pub fn awaiting(&self) -> bool {
        self.waits > 0
    }
}
