//! The scheduler actor of one pool: the only writer of its capacity.
//!
//! It hosts the shell (`shell/`, and through it the pure core) with the driver
//! (`driver.rs`) that carries out the shell's effects, and does only what needs an actor: it
//! receives requests and the engine's events, drains the inbox (`inbox.rs`) when rung, and
//! keeps a timer armed for the shell's next time-driven event.
//!
//! Wait strategy: after draining the inbox the actor (unless the queue actor owes it an
//! answer, which arrives as a message) keeps checking it for a short, bounded while, yielding the CPU (`sched_yield`) and its runtime between checks, because under
//! load the next finish or submission usually arrives within microseconds and catching it
//! awake spares every producer a thread wake-up. Then it marks the inbox idle and sleeps;
//! an idle pool burns no CPU.

use std::marker::PhantomData;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use ractor::{Actor, ActorProcessingErr, ActorRef};
use tokio::sync::oneshot;
use tracing::Instrument;

use super::driver::Driver;
use super::gpu_watch::GpuWatch;
use super::inbox::{Finish, Inbox};
use super::protocol::{Extras, Internal, Reply, SchedulerMsg, SchedulerRequest, Submission};
use super::shell::{Shell, ShellArgs, Shutdown};
use crate::domain::{MailboxKey, PoolError};
use crate::observe::stats::PoolCounters;
use crate::queue::StoredEntry;
use crate::sync::spin::{Spin, SPIN_TIME};
use crate::util::clock::engine_now_ms;

/// How long a stopping scheduler waits for its shared queue's last hand-backs and settles.
const SHARED_FINISH_LIMIT: std::time::Duration = std::time::Duration::from_secs(5);
/// How many times the scheduler re-checks an empty inbox before it sleeps. A round is a
/// `sched_yield` (well under a microsecond when no other thread wants the core), and every
/// 16th also yields to the pool's runtime so its other actors and timers run. The spin is
/// also cut off after [`SPIN_TIME`] of wall time (see [`crate::sync::spin`]).
const IDLE_SPIN_ROUNDS: u32 = 96;

/// How many drain-and-spin rounds one `Drain` message runs before the actor takes its other
/// messages (see [`drain`]).
const DRAIN_ROUNDS: u32 = 64;

/// How many submissions one drain round admits before it looks for finishes again.
const SUBMISSIONS_PER_ROUND: usize = 64;

/// The scheduler actor. See the module docs.
pub struct SchedulerActor<P, R>(PhantomData<fn() -> (P, R)>);

impl<P, R> Default for SchedulerActor<P, R> {
    fn default() -> Self {
        Self(PhantomData)
    }
}

/// The scheduler actor's state (opaque outside the engine): the shell, the driver that
/// carries out its effects, and the inbox that feeds it.
#[doc(hidden)]
pub struct SchedulerState<P, R> {
    shell: Shell<P, R>,
    driver: Driver<P, R>,
    inbox: Arc<Inbox<P, R>>,
    /// When the armed `Tick` is due, if one is.
    armed_tick: Option<u64>,
}

/// What the scheduler actor starts with (opaque outside the engine).
#[doc(hidden)]
pub struct SchedulerStart<P, R> {
    pub(crate) shell: ShellArgs<P, R>,
    pub(crate) driver: Driver<P, R>,
    pub(crate) inbox: Arc<Inbox<P, R>>,
    /// Parked tasks a queue kept, with their payloads where the ledger keeps them.
    pub(crate) stored: Vec<(StoredEntry, Option<P>)>,
    /// The pool's GPU, if it is sized from one.
    pub(crate) gpu: Option<GpuWatch>,
    pub(crate) counters: Arc<PoolCounters>,
    /// Where the queue actor (and escalation) find the scheduler: filled in before the
    /// shell restores stored tasks, whose claims the queue actor answers.
    pub(crate) scheduler_slot: Arc<OnceLock<ActorRef<SchedulerMsg<P>>>>,
}

impl<P, R> Actor for SchedulerActor<P, R>
where
    P: Send + 'static,
    R: Send + 'static,
{
    type Msg = SchedulerMsg<P>;
    type State = SchedulerState<P, R>;
    type Arguments = SchedulerStart<P, R>;

    async fn pre_start(
        &self,
        myself: ActorRef<Self::Msg>,
        start: Self::Arguments,
    ) -> Result<Self::State, ActorProcessingErr> {
        let SchedulerStart {
            mut shell,
            mut driver,
            inbox,
            stored,
            gpu,
            counters,
            scheduler_slot,
        } = start;
        let _ = scheduler_slot.set(myself.clone());
        let now = engine_now_ms();
        if let Some(watch) = gpu {
            let mut link = super::gpu_watch::GpuLink::new(watch, shell.pool.clone(), counters);
            // Before restoring: the first sample caps what restored tasks may take.
            if let Some(first) = link.first_sample() {
                shell.core.set_headroom(first.kind, first.units, now);
            }
            shell.gpu_sampled = true;
            driver.gpu = Some(link);
        }
        let mut shell = Shell::new(shell, stored, now);
        shell.publish();
        if let Some(shared) = &mut driver.shared {
            shared.connect(myself.clone());
        }
        if let Some(gpu) = &mut driver.gpu {
            gpu.connect(myself.clone())?;
        }
        driver.carry_out(&mut shell, now);
        let mut state = SchedulerState {
            shell,
            driver,
            inbox: inbox.clone(),
            armed_tick: None,
        };
        arm_timer(&myself, &mut state, now);
        inbox.connect(myself);
        Ok(state)
    }

    async fn post_stop(
        &self,
        _myself: ActorRef<Self::Msg>,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        state.inbox.close();
        if let Some(shared) = &state.driver.shared {
            shared.finish(SHARED_FINISH_LIMIT).await;
        }
        Ok(())
    }

    async fn handle(
        &self,
        myself: ActorRef<Self::Msg>,
        message: Self::Msg,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        let span = crate::observe::spans::actor("scheduler", myself.get_id(), state.shell.pool());
        async move {
            let now = engine_now_ms();
            if !matches!(message.0, Internal::Drain) {
                // Every event below may change what the core decides: the lanes close first
                // (a drain closes them once it has work, see `drain_inbox`).
                state.shell.take_in_registrations();
                state.shell.close_lanes(now);
            }
            match message.0 {
                Internal::Drain => drain(&myself, state).await,
                Internal::Request(request) => {
                    drain_inbox(state, now);
                    request_received(&myself, state, request, now);
                }
                Internal::Tick => {
                    state.armed_tick = None;
                    state.shell.tick(now);
                }
                Internal::Escalated { reason } => state.shell.escalated(reason, now),
                Internal::WorkerLost { worker, reason } => {
                    state.shell.worker_lost(worker, reason, now)
                }
                Internal::DrainDeadline => {
                    drain_inbox(state, now);
                    state.shell.drain_deadline(now);
                }
                Internal::Queue(report) => state.shell.queue_report(report, now),
                Internal::Shared(report) => {
                    drain_inbox(state, now);
                    state.shell.shared_report(report, now);
                }
                Internal::Headroom(headroom) => {
                    state.shell.set_headroom(headroom.kind, headroom.units, now)
                }
            }
            state.driver.carry_out(&mut state.shell, now);
            state.shell.open_lanes();
            state.shell.publish();
            arm_timer(&myself, state, now);
            Ok(())
        }
        .instrument(span)
        .await
    }
}

fn request_received<P, R>(
    myself: &ActorRef<SchedulerMsg<P>>,
    state: &mut SchedulerState<P, R>,
    request: SchedulerRequest<P>,
    now: u64,
) where
    P: Send + 'static,
    R: Send + 'static,
{
    let shell = &mut state.shell;
    match request {
        SchedulerRequest::Submit {
            task,
            options,
            reply,
        } => shell.submit(task, &options, Reply::Port(reply), None, now),
        SchedulerRequest::SubmitStreaming {
            task,
            options,
            stream,
            reply,
        } => {
            let extras = Box::new(Extras {
                stream: Some(stream),
                ..Extras::default()
            });
            shell.submit(task, &options, Reply::Port(reply), Some(extras), now);
        }
        SchedulerRequest::Shutdown { drain, reply } => {
            if let Shutdown::Begins = shell.shutdown(reply, now) {
                arm_drain_deadline(myself, drain);
            }
        }
        SchedulerRequest::Control(request) => request.carry_out(shell, now),
    }
}

/// Takes everything waiting in the inbox, finishes first (freeing capacity before admitting
/// more means a newcomer never takes a slot a parked task was owed), carrying out the
/// effects of each as it goes.
fn drain_inbox<P, R>(state: &mut SchedulerState<P, R>, now: u64)
where
    P: Send + 'static,
    R: Send + 'static,
{
    state.shell.take_in_registrations();
    loop {
        if state.inbox.is_empty() && !state.shell.hand_off_made() {
            return;
        }
        state.shell.close_lanes(now);
        let mut handled = 0;
        while let Some(Finish {
            entry,
            outcome,
            rests,
        }) = state.inbox.next_finish()
        {
            state.shell.finish_run(entry, outcome, rests, now);
            state.driver.carry_out(&mut state.shell, now);
            handled += 1;
        }
        while let Some(worker) = state.inbox.next_ready() {
            state.shell.worker_ready(worker, now);
            state.driver.carry_out(&mut state.shell, now);
            handled += 1;
        }
        // Permit requests next: a release frees capacity, as a finish does.
        while let Some(op) = state.inbox.next_permit_op() {
            state.shell.permit(op, now);
            state.driver.carry_out(&mut state.shell, now);
            handled += 1;
        }
        for _ in 0..SUBMISSIONS_PER_ROUND {
            let Some(submission) = state.inbox.next_submission() else {
                break;
            };
            submitted(state, submission, now);
            handled += 1;
        }
        // Retrieves' questions last: every finish drained above has stored its outcome, so
        // a task not live now left whatever it had in the mailbox.
        while let Some(note) = state.inbox.next_retrieval() {
            note.answer_with(&mut state.shell, now);
            state.driver.carry_out(&mut state.shell, now);
            handled += 1;
        }
        if handled == 0 {
            return;
        }
    }
}

/// Admits one submission from the inbox (a batch task by task) and carries out the effects.
fn submitted<P, R>(state: &mut SchedulerState<P, R>, submission: Submission<P>, now: u64)
where
    P: Send + 'static,
    R: Send + 'static,
{
    match submission {
        Submission::One {
            task,
            options,
            reply,
            extras,
        } => {
            state.shell.submit(task, &options, reply, extras, now);
            state.driver.carry_out(&mut state.shell, now);
        }
        Submission::Batch {
            tasks,
            options,
            reply,
            slots,
            results_mark,
        } => {
            let mut answers = Vec::with_capacity(tasks.len());
            let mut slots = slots.into_iter();
            for task in tasks {
                let (answer, wait) = oneshot::channel();
                let slot = slots.next();
                let extras = (slot.is_some() || results_mark.is_some()).then(|| {
                    Box::new(Extras {
                        slot,
                        results_mark,
                        ..Extras::default()
                    })
                });
                state
                    .shell
                    .submit(task, &options, Reply::Oneshot(answer), extras, now);
                answers.push(wait);
            }
            state.driver.carry_out(&mut state.shell, now);
            answer_batch(answers, reply);
        }
    }
}

/// Answers a batch: at once when every task's answer is in, else (a task whose park awaits a
/// queue) once the last one arrives.
fn answer_batch(
    answers: Vec<oneshot::Receiver<Result<MailboxKey, PoolError>>>,
    reply: oneshot::Sender<Vec<Result<MailboxKey, PoolError>>>,
) {
    let mut ready = Vec::with_capacity(answers.len());
    let mut waiting = Vec::new();
    for (index, mut answer) in answers.into_iter().enumerate() {
        match answer.try_recv() {
            Ok(answer) => ready.push(answer),
            Err(oneshot::error::TryRecvError::Empty) => {
                ready.push(Err(PoolError::Shutdown));
                waiting.push((index, answer));
            }
            Err(oneshot::error::TryRecvError::Closed) => ready.push(Err(PoolError::Shutdown)),
        }
    }
    if waiting.is_empty() {
        let _ = reply.send(ready);
        return;
    }
    tokio::spawn(async move {
        for (index, answer) in waiting {
            ready[index] = answer.await.unwrap_or(Err(PoolError::Shutdown));
        }
        let _ = reply.send(ready);
    });
}

/// Drains the inbox until it stays empty through a short spin, then marks it idle. Under a
/// stream of submissions that never lets the inbox stay empty, it hands the actor back after
/// [`DRAIN_ROUNDS`] rounds, keeping the inbox marked as scheduled and sending itself the
/// next `Drain`: the requests waiting in the actor's mailbox (shutdown, cancel, stats, the
/// timer's tick) are handled in between, never starved by the inbox.
async fn drain<P, R>(myself: &ActorRef<SchedulerMsg<P>>, state: &mut SchedulerState<P, R>)
where
    P: Send + 'static,
    R: Send + 'static,
{
    for _ in 0..DRAIN_ROUNDS {
        drain_inbox(state, engine_now_ms());
        state.shell.open_lanes();
        state.shell.publish();
        // The queue actor's answers come as messages: let the actor take them rather than
        // spin on the inbox while they wait.
        if !state.shell.awaiting_queue() && spin_until_busy(&state.inbox).await {
            continue;
        }
        if !state.inbox.try_idle() {
            return;
        }
    }
    // An error means the actor is stopping: `post_stop` closes the inbox and refuses the rest.
    let _ = myself.send_message(SchedulerMsg(Internal::Drain));
}

/// Spins (bounded) while the inbox is empty; returns whether something arrived.
async fn spin_until_busy<P, R>(inbox: &Inbox<P, R>) -> bool
where
    P: Send + 'static,
    R: Send + 'static,
{
    let mut spin = Spin::new(IDLE_SPIN_ROUNDS, SPIN_TIME);
    for round in 1.. {
        if !inbox.is_empty() {
            return true;
        }
        if !spin.round() {
            break;
        }
        if round % 16 == 0 {
            tokio::task::yield_now().await;
        }
    }
    !inbox.is_empty()
}

/// Makes sure a `Tick` arrives by the core's next time-driven event.
fn arm_timer<P, R>(myself: &ActorRef<SchedulerMsg<P>>, state: &mut SchedulerState<P, R>, now: u64)
where
    P: Send + 'static,
    R: Send + 'static,
{
    let Some(next) = state.shell.next_wakeup() else {
        return;
    };
    if state.armed_tick.is_some_and(|armed| armed <= next) {
        return;
    }
    state.armed_tick = Some(next);
    let delay = Duration::from_millis(next.saturating_sub(now));
    myself.send_after(delay, || SchedulerMsg(Internal::Tick));
}

/// Arms the drain deadline, unless `drain` is too long for a timer (`Duration::MAX`: wait
/// for ever).
fn arm_drain_deadline<P: Send + 'static>(myself: &ActorRef<SchedulerMsg<P>>, drain: Duration) {
    if tokio::time::Instant::now().checked_add(drain).is_none() {
        return;
    }
    myself.send_after(drain, || SchedulerMsg(Internal::DrainDeadline));
}
