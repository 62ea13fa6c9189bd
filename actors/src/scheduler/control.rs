//! Control requests: what an operator asks of a running pool besides work (cancel a task,
//! pause, drain, look at its work, ask why a task waits), the message for each, and how the
//! scheduler answers it.
//!
//! They are one enum, independent of the pool's payload type, so that whoever controls a
//! pool needs no generic handle: [`PoolControl`](crate::engine::PoolControl) sends them
//! through a `DerivedActorRef<ControlRequest>`, and the admin server holds one
//! `PoolControl` per pool whatever the pools run. A new control action is a variant here, its
//! arm in [`ControlRequest::carry_out`], the shell's or core's rule it applies, and its method
//! on `PoolControl`.

use ractor::RpcReplyPort;

use super::protocol::{Internal, SchedulerMsg, SchedulerRequest};
use super::shell::Shell;
use crate::domain::{MailboxKey, PoolError, TaskId};
use crate::inspect::PoolView;
use crate::scheduler::core::WaitReason;
use crate::stats::PoolStats;

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
    /// order with their reasons, tenants (see [`crate::inspect`]).
    Inspect {
        /// The page's first index in rank order.
        offset: usize,
        /// The page's length, at most [`MAX_PAGE`](crate::inspect::MAX_PAGE).
        limit: usize,
        /// The view.
        reply: RpcReplyPort<PoolView>,
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
                let _ = reply.send(shell.inspect(offset, limit));
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
