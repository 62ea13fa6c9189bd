//! An operator's control actions: cancel a task, pause, drain, look at the pool's work, ask
//! why a task waits. Each is a [`ControlRequest`] (one enum, independent of the pool's
//! payload type, so that whoever controls a pool needs no generic handle: the engine's
//! `PoolControl` sends them through a `DerivedActorRef<ControlRequest>`, and the admin
//! server holds one `PoolControl` per pool whatever the pools run), answered here like any
//! other event: the shell asks the core, then appends the effects that carry it out.
//!
//! A new control action is a variant of [`ControlRequest`], its arm in
//! [`ControlRequest::carry_out`] and its handling below (or in `views.rs` for a read), the
//! core's rule it needs, and its method on `PoolControl`.

use ractor::RpcReplyPort;

use super::{Record, Shell};
use crate::domain::{MailboxKey, PoolError, TaskId};
use crate::observe::stats::PoolStats;
use crate::queue::EntryId;
use crate::scheduler::core::{Cancel, WaitReason};
use crate::scheduler::inspect::{PoolSnapshot, PoolView, WaitView};
use crate::scheduler::protocol::{Internal, SchedulerMsg, SchedulerRequest};
use crate::scheduler::shell::effects::{CancelReply, Effect};
use crate::scheduler::shell::storage::shared::SharedCall;

/// An operator's request to the scheduler, answered on its reply port.
pub enum ControlRequest {
    /// Cancel a live task of the tenant `key` names (parked: removed at once; running: its
    /// future is dropped). `TaskNotFound` unless a live task has this id under exactly `key`.
    Cancel {
        /// The mailbox key the task was submitted with (or the anonymous key it was given).
        key: MailboxKey,
        /// The task's id.
        id: TaskId,
        /// `Ok` once cancelled or signalled.
        reply: RpcReplyPort<Result<(), PoolError>>,
    },
    /// Why a live task of the tenant `key` names has not started: its reason (core rule
    /// 17), `None` once it runs, `TaskNotFound` unless a live task has this id under
    /// exactly `key` on this node (a task parked in a shared queue is the queue's).
    WhyWaiting {
        /// The mailbox key the task was submitted with.
        key: MailboxKey,
        /// The task's id.
        id: TaskId,
        /// The reason.
        reply: RpcReplyPort<Result<Option<WaitReason>, PoolError>>,
    },
    /// [`WhyWaiting`](Self::WhyWaiting) with the task's place in line and when it is
    /// expected to start (core rule 23).
    Waiting {
        /// The mailbox key the task was submitted with.
        key: MailboxKey,
        /// The task's id.
        id: TaskId,
        /// The reason, place and estimate.
        reply: RpcReplyPort<Result<Option<WaitView>, PoolError>>,
    },
    /// Stop starting tasks (`true`: pause) or start again (`false`: resume). While paused
    /// the pool keeps admitting (tasks park), running tasks run on, and on a shared queue
    /// the node claims nothing. The reply comes once the change is made.
    Pause {
        /// Pause (`true`) or resume (`false`).
        paused: bool,
        /// Answered once done.
        reply: RpcReplyPort<()>,
    },
    /// Refuse new work and run what is admitted (`true`: drain), or take new work again
    /// (`false`, which also ends a pause). On a shared queue a drained node claims nothing.
    Drain {
        /// Drain (`true`) or open again (`false`).
        drained: bool,
        /// Answered once done.
        reply: RpcReplyPort<()>,
    },
    /// The pool's work now: running tasks, parked tasks `offset..offset + limit` in rank
    /// order with their reasons, tenants (see [`crate::scheduler::inspect`]).
    Inspect {
        /// The page's first index in rank order.
        offset: usize,
        /// The page's length, at most [`MAX_PAGE`](crate::scheduler::inspect::MAX_PAGE).
        limit: usize,
        /// The view.
        reply: RpcReplyPort<PoolView>,
    },
    /// [`Inspect`](Self::Inspect) and the counters, read at the same instant.
    Snapshot {
        /// The page's first index in rank order.
        offset: usize,
        /// The page's length, at most [`MAX_PAGE`](crate::scheduler::inspect::MAX_PAGE).
        limit: usize,
        /// The view and counters.
        reply: RpcReplyPort<PoolSnapshot>,
    },
    /// A snapshot of the pool's counters.
    Stats {
        /// Where the snapshot goes.
        reply: RpcReplyPort<PoolStats>,
    },
}

impl ControlRequest {
    /// Answers the request against the pool's state at `now`.
    pub(crate) fn carry_out<P, R>(self, shell: &mut Shell<P, R>, now: u64)
    where
        P: Send + 'static,
        R: Send + 'static,
    {
        match self {
            ControlRequest::Cancel { key, id, reply } => shell.cancel(key, id, reply, now),
            ControlRequest::Stats { reply } => {
                let _ = reply.send(shell.stats());
            }
            ControlRequest::Pause { paused, reply } => {
                shell.pause(paused, now);
                let _ = reply.send(());
            }
            ControlRequest::WhyWaiting { key, id, reply } => {
                let _ = reply.send(shell.why_waiting(&key, id));
            }
            ControlRequest::Waiting { key, id, reply } => {
                let _ = reply.send(shell.waiting(&key, id, now));
            }
            ControlRequest::Drain { drained, reply } => {
                shell.drain(drained, now);
                let _ = reply.send(());
            }
            ControlRequest::Inspect {
                offset,
                limit,
                reply,
            } => {
                // Permits of the fast path are shown as the others: taken over first.
                shell.take_over_all(None, now);
                let _ = reply.send(shell.inspect(offset, limit, now));
            }
            ControlRequest::Snapshot {
                offset,
                limit,
                reply,
            } => {
                shell.take_over_all(None, now);
                // The gauges as the core holds them now, so the counters count what the
                // view lists (they are otherwise published after the batch).
                shell.publish();
                let stats = shell.stats();
                let view = shell.inspect(offset, limit, now);
                let _ = reply.send(PoolSnapshot { stats, view });
            }
        }
    }
}

impl<P> From<ControlRequest> for SchedulerMsg<P> {
    fn from(request: ControlRequest) -> Self {
        SchedulerMsg(Internal::Request(SchedulerRequest::Control(request)))
    }
}

impl<P> TryFrom<SchedulerMsg<P>> for ControlRequest {
    type Error = ();

    fn try_from(message: SchedulerMsg<P>) -> Result<Self, ()> {
        match message.0 {
            Internal::Request(SchedulerRequest::Control(request)) => Ok(request),
            _ => Err(()),
        }
    }
}

impl<P, R> Shell<P, R>
where
    P: Send + 'static,
    R: Send + 'static,
{
    /// Cancels the live task `id` of exactly `key`, here or parked in the shared queue.
    pub fn cancel(&mut self, key: MailboxKey, id: TaskId, reply: CancelReply, now: u64) {
        let answer = match self.tasks.entry_of(&key, id) {
            Some(entry) => self.cancel_local(entry, id, now),
            None if self.storage.waits_in_fleet() => {
                self.tasks
                    .fx
                    .shared(SharedCall::RemoveTask { key, id, reply });
                return;
            }
            None => Err(PoolError::TaskNotFound(id)),
        };
        self.tasks.fx.push(Effect::AnswerCancel { reply, answer });
    }

    /// Cancels live task `entry` of this node: a parked one ends `Cancelled` at once, a
    /// running one is asked to stop through its flag.
    fn cancel_local(&mut self, entry: EntryId, id: TaskId, now: u64) -> Result<(), PoolError> {
        match self.tasks.core.cancel(entry, now) {
            Ok(Cancel::Parked { started }) => {
                self.end_parked(entry, PoolError::Cancelled, now);
                self.start_parked(started, now);
                Ok(())
            }
            Ok(Cancel::Running) => {
                if let Some(run) = self.tasks.ledger.get_mut(entry).and_then(Record::run_mut) {
                    run.cancellation.cancel();
                }
                Ok(())
            }
            Err(_) => Err(PoolError::TaskNotFound(id)),
        }
    }

    /// Pauses the pool (`true`: nothing starts, admissions park) or resumes it, starting
    /// what fits (core rule 18).
    pub fn pause(&mut self, paused: bool, now: u64) {
        self.tasks.observers.counters.set_paused(paused);
        if paused {
            self.tasks.core.pause();
            return;
        }
        let started = self.tasks.core.resume(now);
        self.start_parked(started, now);
        // A drained node stays drained: resuming ends the pause only.
        self.claim_if_open(now);
    }

    /// An operator drains the pool (`drained`: new work is refused, admitted work runs) or
    /// opens it again, which also ends a pause.
    pub fn drain(&mut self, drained: bool, now: u64) {
        self.lifecycle.close(drained);
        self.tasks
            .observers
            .counters
            .set_draining(self.lifecycle.is_closed());
        if !drained {
            self.pause(false, now);
        }
    }
}
