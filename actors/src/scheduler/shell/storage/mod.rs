//! Where a pool's parked tasks are kept: its storage mode, chosen once when the pool starts,
//! behind one trait ([`StorageMode`]) the shell calls without knowing which mode it has.
//!
//! - [`MemoryRoom`]: nothing outlives the process, so the ledger itself is the parking lot's
//!   store: a parked task's payload waits in its record, and starting it is taking it from
//!   there. No queue is called.
//! - [`LocalRoom`]: a durable queue of this node's own (a file), driven through the queue
//!   actor, with its durability mode (see [`local`]).
//! - [`SharedRoom`]: a queue several nodes park to and claim from (a database), where a task
//!   that would park here goes instead (see [`shared`]).
//!
//! Each mode owns the state only it needs, and answers at the few points where modes differ:
//! how a task that starts or parks is kept, how a stored task is taken back, settled or
//! forgotten, what a tick and a stop do, and what holds the pool's stop up. The answers a
//! mode gets from its own queue (the queue actor's reports, the shared queue's) reach it
//! through [`StorageMode::local`] and [`StorageMode::shared`], much as a congestion
//! controller in quinn is reached through `into_any` for what only it knows.

pub(crate) mod local;
mod memory;
pub(crate) mod shared;

use std::time::Duration;

pub(crate) use local::LocalRoom;
pub(crate) use memory::MemoryRoom;
pub(crate) use shared::SharedRoom;

use crate::domain::{MailboxKey, ScheduledTask, TaskStatus};
use crate::observe::events::TaskStep;
use crate::queue::{EntryId, HeldBy, Settlement};
use crate::scheduler::protocol::{Extras, Reply};
use crate::scheduler::shell::effects::Effects;
use crate::scheduler::shell::tasks::Tasks;

/// A pool's storage mode, as the shell holds it.
pub(crate) type Storage<P, R> = Box<dyn StorageMode<P, R>>;

/// A submission the core lets start at once, handed to the mode to begin.
pub(crate) struct Starting<P> {
    pub entry: EntryId,
    pub task: ScheduledTask<P>,
    pub key: MailboxKey,
    pub timeout: Option<Duration>,
    pub reply: Reply,
    pub extras: Option<Box<Extras>>,
}

/// A submission the core parked (or put to sleep until `not_before_ms`), handed to the mode
/// to keep.
pub(crate) struct Parking<P> {
    pub entry: EntryId,
    pub task: ScheduledTask<P>,
    pub key: MailboxKey,
    pub timeout: Option<Duration>,
    pub not_before_ms: Option<u64>,
    pub reply: Reply,
    pub extras: Option<Box<Extras>>,
    /// The parents it is held for, when it is held (a durable queue stores them).
    pub held: Option<Box<HeldBy>>,
}

/// What differs between the storage modes. The defaults are those of a mode that stores
/// nothing outside the ledger.
pub(crate) trait StorageMode<P: Send + 'static, R: Send + 'static>: Send {
    /// The name of the queue that keeps parked tasks, for errors (`local` for this node's
    /// own).
    fn backend(&self) -> &'static str {
        "local"
    }

    /// Whether parked tasks outlive a stop (kept by a durable or shared queue) rather than
    /// ending `Cancelled`.
    fn keeps_parked(&self) -> bool;

    /// Whether what waits (parked, sleeping until its instant, held for its parents) waits
    /// in a queue the fleet shares and claims from, not in this node's core: nothing is
    /// shed for a newcomer (it would end for every node), a task this node does not hold may
    /// be live in the queue, and a stream cannot follow a task to another node.
    fn waits_in_fleet(&self) -> bool {
        false
    }

    /// Whether a task's payload lives in this process only, so a copy of it can be kept to
    /// run it again (a preempted run, a failed one under a retry policy).
    fn keeps_payloads_here(&self) -> bool {
        false
    }

    /// Why a task with parents is refused here (the queue that cannot hold them), if it is.
    fn refuses_dependencies(&self) -> Option<String> {
        None
    }

    /// Why a task of several kinds (core rule 25) is refused here (the queue that cannot
    /// store its costs beside its metadata), if it is.
    fn refuses_several_kinds(&self) -> Option<String> {
        None
    }

    /// Begins a submission that starts at once: hands its task back to be sent to a worker
    /// now, or stores it first (`None`: it is sent once the queue answers).
    fn start(
        &mut self,
        tasks: &mut Tasks<P, R>,
        starting: Starting<P>,
        now: u64,
    ) -> Option<ScheduledTask<P>> {
        Some(start_now(tasks, starting, now))
    }

    /// Keeps a submission the core parked. Returns the parked tasks to start, if keeping it
    /// freed a place in the core.
    fn park(&mut self, tasks: &mut Tasks<P, R>, parking: Parking<P>, now: u64) -> Vec<EntryId>;

    /// Whether a started task the mode stored can be handed back to it to run again.
    fn releases_stored(&self) -> bool {
        false
    }

    /// Takes a stored task's payload back, to run it (the core started it).
    fn take_stored(&mut self, _entry: EntryId, _fx: &mut Effects<P, R>) {}

    /// Ends the run of a task taken from the mode's store.
    fn settle_stored(&mut self, _entry: EntryId, _settlement: Settlement, _fx: &mut Effects<P, R>) {
    }

    /// Hands a stored task's claim back, to run it again.
    fn release_stored(&mut self, _entry: EntryId, _fx: &mut Effects<P, R>) {}

    /// Forgets a stored task that ended while parked.
    fn forget_stored(&mut self, _entry: EntryId, _fx: &mut Effects<P, R>) {}

    /// Parent `entry`, which held tasks wait for, ended `status`: a mode that stores held
    /// tasks keeps how it ended for them.
    fn parent_ended(&mut self, _entry: EntryId, _status: &TaskStatus, _fx: &mut Effects<P, R>) {}

    /// Time-driven work of the mode's own. Returns whether to claim from the fleet now.
    fn tick(&mut self, _tasks: &mut Tasks<P, R>, _now: u64) -> bool {
        false
    }

    /// Before a stop lets go of the parked tasks: stores every task that waits to be stored.
    fn store_all(&mut self, _tasks: &mut Tasks<P, R>, _now: u64) {}

    /// Whether parked task `entry`'s record must be kept at a stop, until its store answers.
    fn holds_until_stored(&self, _entry: EntryId) -> bool {
        false
    }

    /// Whether a call in flight holds a drained pool's stop up (what it brings back is this
    /// node's until it answers).
    fn holds_stop(&self) -> bool {
        false
    }

    /// Whether the queue actor owes answers (the scheduler should not spin on its inbox).
    fn awaits_queue(&self) -> bool {
        false
    }

    /// When the mode's next time-driven work is due.
    fn next_due(&self) -> Option<u64> {
        None
    }

    /// The local durable mode's state, in that mode (for the queue actor's reports).
    fn local(&mut self) -> Option<&mut LocalRoom> {
        None
    }

    /// The shared mode's state, in that mode (for the shared queue's reports).
    fn shared(&mut self) -> Option<&mut SharedRoom> {
        None
    }
}

/// Begins a submission that runs at once, stored nowhere: its submitter hears its key now.
pub(crate) fn start_now<P: Send + 'static, R: Send + 'static>(
    tasks: &mut Tasks<P, R>,
    starting: Starting<P>,
    now: u64,
) -> ScheduledTask<P> {
    let Starting {
        entry,
        mut task,
        key,
        timeout,
        reply,
        extras,
    } = starting;
    tasks.track(entry, &task.meta, &key, timeout, extras);
    tasks.step(entry, TaskStep::Admitted, now);
    tasks.begin_run(entry, false, now);
    task.meta.mailbox = Some(key.clone());
    tasks.fx.answer(reply, Ok(key));
    task
}

/// Keeps a parked submission's payload in its ledger record.
pub(crate) fn park_in_ledger<P: Send + 'static, R: Send + 'static>(
    tasks: &mut Tasks<P, R>,
    parking: Parking<P>,
    now: u64,
) {
    let Parking {
        entry,
        task,
        key,
        timeout,
        reply,
        extras,
        ..
    } = parking;
    tasks.track(entry, &task.meta, &key, timeout, extras);
    let arrived = (Some(reply), TaskStep::Admitted);
    tasks.keep_parked(entry, task.payload, arrived, key, now);
}
