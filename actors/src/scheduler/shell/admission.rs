//! Admission: what a task being admitted carries, why a submission is refused before the
//! core is asked, and how a newcomer the core expired or refused ends.

use crate::domain::{DeadlineMiss, MailboxKey, PoolError, ScheduledTask, TaskStatus};
use crate::mailbox::watch::ResultWatch;
use crate::mailbox::Mailbox;
use crate::observe::events::TaskStep;
use crate::observe::trace::TraceParent;
use crate::queue::{Claim, EntryId, Settlement};
use crate::running::stream::StreamShared;
use crate::scheduler::core::{ParkingLot, Ticket};
use crate::scheduler::protocol::{Extras, Reply};
use crate::util::contain::drop_contained;

use super::dependencies::Parents;
use super::tasks::Tasks;
use std::time::Duration;

/// A task being admitted, from a submitter or from a shared queue's claim.
pub(super) struct Admission<P> {
    pub task: ScheduledTask<P>,
    pub key: MailboxKey,
    pub timeout: Option<Duration>,
    /// Not to start before this instant (a scheduled start), if set: it sleeps until then.
    pub not_before_ms: Option<u64>,
    pub origin: Origin,
    /// The pool made its key (it came without one): see `Record::minted_key`.
    pub minted: bool,
    /// The live tasks it waits for (none for most: see `dependencies.rs`).
    pub parents: Parents,
}

/// Where an admitted task comes from.
pub(super) enum Origin {
    /// A submitter waits for the answer.
    Submitted {
        reply: Reply,
        extras: Option<Box<Extras>>,
    },
    /// This node claimed it from the shared queue under a lease.
    Leased {
        shared_entry: EntryId,
        attempt: u32,
        /// The trace it was parked in, if any (see [`Lease::trace`](crate::queue::Lease)).
        trace: Option<TraceParent>,
    },
}

/// Why the mailbox cannot take another outcome, if it cannot.
pub(super) fn mailbox_has_room<R: Send + 'static>(
    mailbox: &dyn Mailbox<R>,
    live: usize,
) -> Result<(), PoolError> {
    let Some(inline) = mailbox.inline() else {
        return Ok(());
    };
    let stored = inline.stored_now();
    let max_messages = inline.max_messages();
    if stored.saturating_add(live) >= max_messages {
        return Err(PoolError::MailboxFull {
            stored,
            live,
            max_messages,
        });
    }
    Ok(())
}

/// `ResultPending` when an earlier task's result waits under the task's key and id, where
/// the new task would be answered with it: in an inline mailbox, or on its way to one that
/// awaits (`watch`, see `mailbox/watch.rs`; the client asked the database before the
/// submission came here). A streamed task's outcome goes to its stream, and an anonymous key
/// is new, so neither can meet an old result.
pub(super) fn no_result_waits<P, R: Send + 'static>(
    mailbox: &dyn Mailbox<R>,
    watch: Option<&ResultWatch>,
    task: &ScheduledTask<P>,
    extras: Option<&Extras>,
) -> Result<(), PoolError> {
    let Some(key) = task.meta.mailbox.as_ref() else {
        return Ok(());
    };
    if extras.is_some_and(|extras| extras.stream.is_some()) || key.is_anonymous() {
        return Ok(());
    }
    let id = task.meta.id;
    let waits = match (mailbox.inline(), watch) {
        (Some(inline), _) => inline.holds_now(key, id),
        (None, Some(watch)) => {
            let mark = extras.and_then(|extras| extras.results_mark);
            watch.may_wait(key, id, mark)
        }
        (None, None) => false,
    };
    match waits {
        true => Err(PoolError::ResultPending(id)),
        false => Ok(()),
    }
}

/// `WouldMissDeadline` when the pool refuses late submissions (`refuse_if_late`) and
/// `ticket`'s estimated start (core rule 23) is after its deadline. A deadline already past
/// is left to the core (the task expires), and a start the core cannot estimate refuses
/// nothing.
pub(super) fn starts_in_time(
    core: &ParkingLot,
    ticket: &Ticket,
    now: u64,
) -> Result<(), PoolError> {
    if !core.limits().admission.refuse_if_late {
        return Ok(());
    }
    let Some(deadline_ms) = ticket.deadline_ms.filter(|&deadline| deadline > now) else {
        return Ok(());
    };
    match core.misses_deadline(ticket, deadline_ms, now) {
        Some(estimated_start_ms) => Err(PoolError::WouldMissDeadline(Box::new(DeadlineMiss {
            estimated_start_ms: u128::from(estimated_start_ms),
            deadline_ms: u128::from(deadline_ms),
        }))),
        None => Ok(()),
    }
}

/// Why a streamed submission cannot be taken here, if so (`fleet`: what waits, waits in a
/// queue other nodes claim from, which could not reach the stream).
pub(super) fn streamable<R: Send + 'static>(
    pool: &str,
    fleet: bool,
    extras: Option<&Extras>,
) -> Result<(), PoolError> {
    let Some(stream) = extras.and_then(|extras| extras.stream.as_ref()) else {
        return Ok(());
    };
    if fleet {
        return Err(PoolError::InvalidConfig(format!(
            "pool {}: streamed submissions need a local queue; this pool's queue is shared \
             with other nodes, which could not reach the stream (submit without streaming, \
             or stream from a pool with an in_memory, yaque or local queue)",
            pool
        )));
    }
    if !stream.0.is::<StreamShared<R>>() {
        return Err(PoolError::InvalidConfig(format!(
            "pool {}: the stream's item type is not this pool's result type; make the \
             stream with ResultStream::<R>::channel for the pool's R",
            pool
        )));
    }
    Ok(())
}

/// A newcomer the core expired or refused: its submitter hears why; a leased task's
/// claim ends and its mailbox hears it.
pub(super) fn end_unadmitted<P: Send + 'static, R: Send + 'static>(
    tasks: &mut Tasks<P, R>,
    admission: Admission<P>,
    error: PoolError,
    now: u64,
) {
    let Admission {
        mut task,
        key,
        origin,
        ..
    } = admission;
    match origin {
        Origin::Submitted { reply, .. } if error == PoolError::Expired => {
            let step = TaskStep::Ended(TaskStatus::Expired);
            tasks.step_unrecorded(&task.meta, &key, &step, now);
            tasks.fx.answer(reply, Err(error));
            drop_contained(task);
        }
        Origin::Submitted { reply, .. } => {
            task.meta.mailbox = Some(key);
            tasks.refuse(task, error, reply, now);
        }
        Origin::Leased {
            shared_entry,
            attempt,
            ..
        } => {
            let settlement = match &error {
                PoolError::Expired => Settlement::Ended(TaskStatus::Expired),
                other => Settlement::Failed(other.to_string()),
            };
            let (id, cost) = (task.meta.id, task.meta.cost);
            let settle = Some((Claim::new(shared_entry, attempt), settlement));
            tasks.deliver_report(key, id, cost, attempt, Err(error), settle, now);
            drop_contained(task);
        }
    }
}
