//! Where a pool's parked tasks are kept: its storage mode, chosen once when the pool starts.
//!
//! - [`Storage::Memory`]: nothing outlives the process, so the ledger itself is the parking
//!   lot's store: a parked task's payload waits in its record, and starting it is taking it
//!   from there. No queue is called.
//! - [`Storage::Local`]: a durable queue of this node's own (a file), driven through the queue
//!   actor, with its durability mode (see [`local`]).
//! - [`Storage::Shared`]: a queue several nodes park to and claim from (a database), where a
//!   task that would park here goes instead (see [`shared`]).
//!
//! Each mode owns the state only it needs. The shell asks the mode at the few points where
//! they differ: where a task that starts or parks goes, how a parked task is taken back, and
//! what happens to parked tasks when the pool stops.

pub(crate) mod local;
pub(crate) mod shared;

pub(crate) use local::LocalRoom;
pub(crate) use shared::SharedRoom;

/// A pool's storage mode. See the module docs.
pub(crate) enum Storage {
    /// Parked tasks wait in the ledger.
    Memory,
    /// Parked tasks are stored in a durable queue of this node's own.
    Local(LocalRoom),
    /// Tasks that would park go to a queue shared with other nodes.
    Shared(SharedRoom),
}

impl Storage {
    /// Whether parked tasks outlive a stop (kept in a durable or shared queue) rather than
    /// ending `Cancelled`.
    pub fn keeps_parked(&self) -> bool {
        !matches!(self, Storage::Memory)
    }

    /// The local durable queue's room, in that mode.
    pub fn local(&mut self) -> Option<&mut LocalRoom> {
        match self {
            Storage::Local(room) => Some(room),
            _ => None,
        }
    }

    /// The shared queue's room, in that mode.
    pub fn shared(&mut self) -> Option<&mut SharedRoom> {
        match self {
            Storage::Shared(room) => Some(room),
            _ => None,
        }
    }

    /// Whether this is the shared mode.
    pub fn is_shared(&self) -> bool {
        matches!(self, Storage::Shared(_))
    }

    /// Whether a task that starts at once is stored as this node's claim first (shared mode,
    /// `accepted` durability).
    pub fn records_starts_shared(&self) -> bool {
        matches!(self, Storage::Shared(room) if room.records_starts())
    }

    /// Whether a task that starts at once is stored as running first (local mode,
    /// `accepted` durability).
    pub fn stores_starts_locally(&self) -> bool {
        matches!(self, Storage::Local(room) if room.stores_starts())
    }

    /// Whether a claim from the shared queue is in flight: what it takes is this node's
    /// until it answers, so a stopping node waits for it (and hands it back).
    pub fn awaits_claim(&self) -> bool {
        matches!(self, Storage::Shared(room) if room.is_claiming())
    }

    /// The shared queue's backend name, for errors.
    pub fn backend(&self) -> &'static str {
        match self {
            Storage::Shared(room) => room.backend(),
            Storage::Local(_) | Storage::Memory => "local",
        }
    }

    /// When the next spinning task is due to be written, in the local mode; when to claim
    /// again from a fleet's short bucket, in the shared mode.
    pub fn next_due(&self) -> Option<u64> {
        match self {
            Storage::Local(room) => room.next_due(),
            Storage::Shared(room) => room.reclaim_due(),
            Storage::Memory => None,
        }
    }
}
