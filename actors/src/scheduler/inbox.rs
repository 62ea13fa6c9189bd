//! The scheduler's inbox: how submissions and finished tasks reach the scheduler without one
//! actor message (and one thread wake-up) each.
//!
//! # Algorithm
//!
//! Producers (clients submitting, worker threads reporting a finished task) push onto one
//! of two lock-free queues, then *ring*: if the inbox was idle, they mark it scheduled and
//! send the scheduler actor one `Drain` message. The scheduler drains both queues in
//! batches (finishes first: freeing capacity before admitting more means a newcomer never
//! takes a slot a parked task was owed), spins briefly while more arrives, then marks the
//! inbox idle and looks once more: anything pushed before the idle mark was seen by that
//! look, anything pushed after it rings again.
//!
//! # Invariants
//!
//! - At most one `Drain` is in flight or being handled: `scheduled` is set by exactly the
//!   producer that sent it and cleared only by the scheduler when it stops draining.
//! - No lost wake-up: a push followed by a ring that found `scheduled` set happened before
//!   the scheduler's final look (the scheduler clears `scheduled` and then looks; a producer
//!   pushes and then tests `scheduled`; both sides fence with `SeqCst` between the two, so at
//!   least one of them sees the other's write).

use std::sync::atomic::{fence, AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};

use crossbeam_queue::SegQueue;
use ractor::ActorRef;

use super::protocol::{Internal, SchedulerMsg, Submission};
use super::shell::waiters::RetrievalNote;
use crate::domain::PoolError;
use crate::permit::lane::Lanes;
use crate::permit::{PermitOp, PermitPort};
use crate::queue::EntryId;
use crate::worker::RunReports;

/// A worker thread's report that a task's run is over (see [`RunReports`]).
pub(crate) struct Finish<R> {
    /// The task's entry.
    pub entry: EntryId,
    /// What the executor produced, or how the run ended without a result.
    pub outcome: Result<R, PoolError>,
    /// Its worker's thread still has work the task left on it: the slot rests until the
    /// worker reports it ready.
    pub rests: bool,
}

/// See the module docs.
pub(crate) struct Inbox<P, R> {
    finishes: SegQueue<Finish<R>>,
    /// Workers whose resting slot can take a job again.
    readies: SegQueue<usize>,
    submissions: SegQueue<Submission<P>>,
    /// Requests about capacity permits (see `crate::permit`).
    permits: SegQueue<PermitOp>,
    /// Retrieves' questions: can a result still come, and a wait that gave up (see
    /// `shell/waiters.rs`).
    retrievals: SegQueue<RetrievalNote>,
    scheduled: AtomicBool,
    /// Set once the scheduler has stopped: nothing will drain the inbox any more, so whoever
    /// pushes refuses what it finds.
    closed: AtomicBool,
    scheduler: OnceLock<ActorRef<SchedulerMsg<P>>>,
    /// The permits' fast path, which the scheduler opens and closes.
    lanes: Arc<Lanes>,
}

impl<P, R> Inbox<P, R>
where
    P: Send + 'static,
    R: Send + 'static,
{
    pub fn new(lanes: Arc<Lanes>) -> Self {
        Self {
            lanes,
            finishes: SegQueue::new(),
            readies: SegQueue::new(),
            submissions: SegQueue::new(),
            permits: SegQueue::new(),
            retrievals: SegQueue::new(),
            scheduled: AtomicBool::new(false),
            closed: AtomicBool::new(false),
            scheduler: OnceLock::new(),
        }
    }

    /// Connects the inbox to its scheduler, once it is started.
    pub fn connect(&self, scheduler: ActorRef<SchedulerMsg<P>>) {
        let _ = self.scheduler.set(scheduler);
        self.ring();
    }

    /// A worker finished a task.
    pub fn finished(&self, finish: Finish<R>) {
        self.finishes.push(finish);
        self.ring();
    }

    /// A client submits. Its reply comes from the scheduler, or is `Shutdown` once the
    /// scheduler has stopped.
    pub fn submit(&self, submission: Submission<P>) {
        self.submissions.push(submission);
        self.ring();
    }

    /// A retrieve asks a question. Once the scheduler has stopped it is dropped unanswered:
    /// the retrieve then goes on as if the pool could not tell.
    pub fn ask(&self, note: RetrievalNote) {
        self.retrievals.push(note);
        self.ring();
    }

    /// The scheduler has stopped: refuse everything that waits and everything pushed later.
    pub fn close(&self) {
        self.lanes.close_all();
        self.closed.store(true, Ordering::Release);
        fence(Ordering::SeqCst);
        self.refuse_all();
    }

    fn refuse_all(&self) {
        while let Some(submission) = self.submissions.pop() {
            submission.refuse(PoolError::Shutdown);
        }
        while let Some(finish) = self.finishes.pop() {
            crate::util::contain::drop_contained(finish.outcome);
        }
        while let Some(op) = self.permits.pop() {
            op.refuse(PoolError::Shutdown);
        }
        while let Some(note) = self.retrievals.pop() {
            drop(note);
        }
    }

    fn ring(&self) {
        fence(Ordering::SeqCst);
        if self.closed.load(Ordering::Acquire) {
            self.refuse_all();
            return;
        }
        if self.scheduled.load(Ordering::Relaxed) || self.scheduled.swap(true, Ordering::AcqRel) {
            return;
        }
        match self.scheduler.get() {
            Some(scheduler) => {
                if scheduler
                    .send_message(SchedulerMsg(Internal::Drain))
                    .is_err()
                {
                    self.scheduled.store(false, Ordering::Release);
                }
            }
            None => self.scheduled.store(false, Ordering::Release),
        }
    }

    /// The next worker whose slot is ready again, if any.
    pub fn next_ready(&self) -> Option<usize> {
        self.readies.pop()
    }

    /// The next finished task, if any.
    pub fn next_finish(&self) -> Option<Finish<R>> {
        self.finishes.pop()
    }

    /// The next submission, if any.
    pub fn next_submission(&self) -> Option<Submission<P>> {
        self.submissions.pop()
    }

    /// The next permit request, if any.
    pub fn next_permit_op(&self) -> Option<PermitOp> {
        self.permits.pop()
    }

    /// The next retrieve's question, if any.
    pub fn next_retrieval(&self) -> Option<RetrievalNote> {
        self.retrievals.pop()
    }

    /// Whether anything waits.
    pub fn is_empty(&self) -> bool {
        self.finishes.is_empty()
            && self.readies.is_empty()
            && self.submissions.is_empty()
            && self.permits.is_empty()
            && self.retrievals.is_empty()
    }

    /// The scheduler stops draining. Returns `true` if something arrived meanwhile and the
    /// scheduler took the inbox back (it must drain again), `false` if it is idle now.
    pub fn try_idle(&self) -> bool {
        self.scheduled.store(false, Ordering::Release);
        fence(Ordering::SeqCst);
        if self.is_empty() {
            return false;
        }
        !self.scheduled.swap(true, Ordering::AcqRel)
    }
}

impl<P, R> PermitPort for Inbox<P, R>
where
    P: Send + 'static,
    R: Send + 'static,
{
    fn send(&self, op: PermitOp) {
        self.permits.push(op);
        self.ring();
    }

    fn lanes(&self) -> &Lanes {
        &self.lanes
    }

    fn nudge(&self) {
        self.ring();
    }
}

impl<P, R> RunReports<R> for Inbox<P, R>
where
    P: Send + 'static,
    R: Send + 'static,
{
    fn finished(&self, entry: EntryId, outcome: Result<R, PoolError>, rests: bool) {
        Inbox::finished(
            self,
            Finish {
                entry,
                outcome,
                rests,
            },
        );
    }

    fn ready(&self, worker: usize) {
        self.readies.push(worker);
        self.ring();
    }
}
