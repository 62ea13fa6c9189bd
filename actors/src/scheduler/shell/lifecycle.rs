//! Whether a pool admits work: open, escalated (the supervisor gave up), draining for a
//! shutdown, or stopped; and the report every caller of `shutdown` gets.

use ractor::RpcReplyPort;

use crate::domain::PoolError;
use crate::scheduler::protocol::ShutdownReport;

use super::effects::{Effect, Effects};

/// The pool's admission state.
enum Mode {
    Open,
    /// An operator drains the pool: new work is refused (`Draining`), admitted work runs
    /// (on a shared queue the node claims nothing more); `resume` opens it again.
    Closed,
    /// The supervisor gave up; new work is refused with the reason.
    Escalated(String),
    /// Stopping: running tasks finish (up to the drain deadline); every caller of
    /// `shutdown` waits for the same report.
    Draining {
        waiters: Vec<RpcReplyPort<ShutdownReport>>,
        report: ShutdownReport,
    },
    Stopped(ShutdownReport),
}

/// See the module docs.
pub(crate) struct Lifecycle {
    mode: Mode,
}

/// What a call of `shutdown` finds.
pub(crate) enum Shutdown {
    /// The first call: the drain begins (the caller arms its deadline).
    Begins,
    /// A drain is under way or over; the caller was added to its waiters or answered.
    Joined,
}

impl Default for Lifecycle {
    fn default() -> Self {
        Self { mode: Mode::Open }
    }
}

impl Lifecycle {
    /// Why no task may be admitted now, if so.
    pub fn admits(&self) -> Result<(), PoolError> {
        match &self.mode {
            Mode::Open => Ok(()),
            Mode::Closed => Err(PoolError::Draining),
            Mode::Escalated(reason) => Err(PoolError::Internal(reason.clone())),
            Mode::Draining { .. } | Mode::Stopped(_) => Err(PoolError::Shutdown),
        }
    }

    /// Whether the pool runs its admitted work on (open, or drained by an operator): a
    /// claim that arrives is run, a failed run may be retried.
    pub fn is_open(&self) -> bool {
        matches!(self.mode, Mode::Open | Mode::Closed)
    }

    /// Whether the pool takes new work: admissions, and claims from a shared queue.
    pub fn takes_work(&self) -> bool {
        matches!(self.mode, Mode::Open)
    }

    /// Whether a drain is under way.
    pub fn is_draining(&self) -> bool {
        matches!(self.mode, Mode::Draining { .. })
    }

    /// An operator drains an open pool (`true`), or opens a drained one again (`false`).
    pub fn close(&mut self, closed: bool) {
        match (&self.mode, closed) {
            (Mode::Open, true) => self.mode = Mode::Closed,
            (Mode::Closed, false) => self.mode = Mode::Open,
            _ => {}
        }
    }

    /// Whether an operator drains the pool.
    pub fn is_closed(&self) -> bool {
        matches!(self.mode, Mode::Closed)
    }

    /// The supervisor gave up: refuse new work with `reason` (a drain goes on).
    pub fn escalate(&mut self, reason: String) {
        if matches!(self.mode, Mode::Open | Mode::Closed) {
            self.mode = Mode::Escalated(reason);
        }
    }

    /// A caller asks for shutdown. A drain already under way or over takes it as a waiter
    /// or answers it; else `start` runs (it ends or keeps the parked tasks and returns how
    /// many it kept and ended) and the drain begins.
    pub fn shutdown<P, R>(
        &mut self,
        reply: RpcReplyPort<ShutdownReport>,
        fx: &mut Effects<P, R>,
        start: impl FnOnce() -> (usize, usize),
    ) -> Shutdown {
        match &mut self.mode {
            Mode::Draining { waiters, .. } => {
                waiters.push(reply);
                return Shutdown::Joined;
            }
            Mode::Stopped(report) => {
                fx.push(Effect::AnswerShutdown {
                    reply,
                    report: *report,
                });
                return Shutdown::Joined;
            }
            Mode::Open | Mode::Closed | Mode::Escalated(_) => {}
        }
        let (kept, cancelled) = start();
        self.mode = Mode::Draining {
            waiters: vec![reply],
            report: ShutdownReport {
                cancelled_parked: cancelled,
                kept_parked: kept,
                ..ShutdownReport::default()
            },
        };
        Shutdown::Begins
    }

    /// A running task finished during the drain.
    pub fn note_finished(&mut self) {
        if let Mode::Draining { report, .. } = &mut self.mode {
            report.finished_running += 1;
        }
    }

    /// Running tasks abandoned at the drain deadline.
    pub fn note_abandoned(&mut self, abandoned: usize) {
        if let Mode::Draining { report, .. } = &mut self.mode {
            report.abandoned_running += abandoned;
        }
    }

    /// Ends the drain: every waiter gets the report.
    pub fn stop<P, R>(&mut self, fx: &mut Effects<P, R>) {
        let Mode::Draining { waiters, report } = &mut self.mode else {
            return;
        };
        let report = *report;
        for reply in waiters.drain(..) {
            fx.push(Effect::AnswerShutdown { reply, report });
        }
        self.mode = Mode::Stopped(report);
    }
}
