//! The shared mode: this pool is one *node* of several that park to and claim from one queue
//! (a database table that API servers and GPU nodes share).
//!
//! The pool's own core still decides everything local: a new task that fits this node's free
//! capacity starts here at once. A task that would park goes to the shared queue instead,
//! where any node may claim it. Whenever this node has an idle worker, free capacity and
//! nothing parked here (after every finish, every poll, and every notice that work was
//! parked), it claims the best-ranked shared tasks that fit its free units, under leases it
//! renews while they run and settles when they end. A node that dies stops renewing; the
//! rescuer parks its expired claims again, so their tasks run again elsewhere: at-least-once.
//!
//! Rules that differ from the local modes, each because no node sees the whole queue:
//! - A claimed task that finds its capacity taken meanwhile (a local task started while the
//!   claim was in flight) parks in this node's ledger, still under its lease; the core's
//!   order then protects it like any parked task, and the node claims nothing more until it
//!   has started.
//! - A shared task's deadline is checked when a node claims it: past it, it ends `Expired`.
//! - Cancel reaches a shared task only while it is parked: the node that takes the cancel
//!   removes it by its key and id. Once claimed, it is the claiming node's to cancel.
//! - Task ids are unique per tenant among the tasks live on one node.
//! - Results go to the pool's mailbox: nodes that answer each other's callers share one.

use std::time::Duration;

use crate::domain::{Capacity, Durability, ResourceCost, ResourceKind};
use crate::queue::{EntryId, FitQuery, StarvationRule};
use crate::scheduler::core::ParkingLot;

/// The shared mode's state. See the module docs.
pub(crate) struct SharedRoom {
    /// The queue's backend name, for errors.
    backend: &'static str,
    /// Whether a task this node starts at once is stored as its claim before it runs
    /// (`Durability::Accepted`).
    records_starts: bool,
    /// How many claimed tasks may wait here beyond those that start at once.
    claim_ahead: usize,
    /// How long a claim is this node's without renewal, ms.
    lease_ms: u64,
    /// A claim is in flight: at most one at a time.
    claiming: bool,
    /// When this node's leases were last renewed.
    renewed_at: u64,
}

impl SharedRoom {
    /// The mode for a queue of `backend`, with the node's lease and claim-ahead.
    pub fn new(
        backend: &'static str,
        lease: Duration,
        claim_ahead: usize,
        durability: Durability,
    ) -> Self {
        Self {
            backend,
            records_starts: durability.writes_started_tasks(),
            claim_ahead,
            lease_ms: u64::try_from(lease.as_millis()).unwrap_or(u64::MAX),
            claiming: false,
            renewed_at: 0,
        }
    }

    /// The queue's backend name.
    pub fn backend(&self) -> &'static str {
        self.backend
    }

    /// Whether a task this node starts at once is stored before it runs.
    pub fn records_starts(&self) -> bool {
        self.records_starts
    }

    /// The shared queue's entry id of a task admitted here: unique across nodes and, within
    /// one node and millisecond, increasing in admission order: `sequence` (the admission's
    /// count within its millisecond) in the high 16 bits, 48 random bits below.
    pub fn entry_for(sequence: u16) -> EntryId {
        const RANDOM_BITS: u32 = 48;
        let random = (crate::random::random_u128() as u64) & ((1 << RANDOM_BITS) - 1);
        (u64::from(sequence) << RANDOM_BITS) | random
    }

    /// Whether the leases held are due for renewal (a third of the lease has passed since
    /// the last); if so, the renewal is counted as made now.
    pub fn renewal_due(&mut self, now: u64) -> bool {
        if now.saturating_sub(self.renewed_at) < self.lease_ms / 3 {
            return false;
        }
        self.renewed_at = now;
        true
    }

    /// A claim answered: the next may go.
    pub fn claim_answered(&mut self) {
        self.claiming = false;
    }

    /// What this node should claim now, if anything: `(query, at most)`; marks the claim in
    /// flight. `parked` are the costs of the claimed tasks waiting here.
    ///
    /// It claims when it could start a task now (an idle worker, free capacity, nothing
    /// claimed waiting here), or, with claim-ahead, when at most half the claimed tasks it may
    /// hold wait here: at most the idle workers plus the free claim-ahead room, within the
    /// free units less what the waiting tasks need. A node without workers (a producer) runs
    /// nothing, so it claims nothing. With claim-ahead, a busy node waits until half its
    /// waiting room is free and then fills it in one claim, rather than claiming a task or
    /// two after every finish.
    pub fn claim_wanted(
        &mut self,
        core: &ParkingLot,
        parked: impl Iterator<Item = ResourceCost>,
        now: u64,
    ) -> Option<(FitQuery, usize)> {
        let waiting = core.parked_len();
        let workers = core.live_workers();
        let idle = workers - core.busy_workers();
        let room = (idle + self.claim_ahead).saturating_sub(waiting);
        if self.claiming
            || workers == 0
            || room == 0
            || (waiting > 0 && self.claim_ahead == 0)
            || (idle == 0 && waiting > self.claim_ahead / 2)
        {
            return None;
        }
        let mut free = ResourceKind::ALL
            .into_iter()
            .fold(Capacity::uniform(0), |free, kind| {
                free.with(kind, core.free(kind))
            });
        if waiting > 0 {
            for cost in parked {
                free = free.with(cost.kind, free.get(cost.kind).saturating_sub(cost.units));
            }
        }
        if free.is_empty() {
            return None;
        }
        let limits = core.limits();
        let starvation = limits.starvation.max_park_ms.map(|age| StarvationRule {
            capacity: limits.capacity,
            parked_before_ms: now.saturating_sub(age),
        });
        self.claiming = true;
        Some((
            FitQuery {
                starvation,
                ..FitQuery::within(free)
            },
            room,
        ))
    }
}
