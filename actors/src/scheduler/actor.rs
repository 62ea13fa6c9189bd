//! The scheduler actor of one pool: the only writer of its capacity.
//!
//! It hosts the [`Scheduler`] state (and through it the pure core) and does only what needs
//! an actor: it receives requests and the engine's events, drains the [inbox](super::inbox)
//! when rung, and keeps a timer armed for the core's next time-driven event.
//!
//! Wait strategy: after draining the inbox the actor (unless the queue actor owes it an
//! answer, which arrives as a message) keeps checking it for a short, bounded while, yielding the CPU (`sched_yield`) and its runtime between checks, because under
//! load the next finish or submission usually arrives within microseconds and catching it
//! awake spares every producer a thread wake-up. Then it marks the inbox idle and sleeps;
//! an idle pool burns no CPU.

use std::marker::PhantomData;
use std::time::Duration;

use ractor::{Actor, ActorProcessingErr, ActorRef};
use tracing::Instrument;

use super::protocol::{Extras, Internal, Reply, SchedulerMsg, SchedulerRequest};
use super::state::{Scheduler, SchedulerArgs};
use crate::clock::now_ms;
use crate::spin::{Spin, SPIN_TIME};

/// How many times the scheduler re-checks an empty inbox before it sleeps. A round is a
/// `sched_yield` (well under a microsecond when no other thread wants the core), and every
/// 16th also yields to the pool's runtime so its other actors and timers run. The spin is
/// also cut off after [`SPIN_TIME`] of wall time (see [`crate::spin`]).
const IDLE_SPIN_ROUNDS: u32 = 96;

/// How many drain-and-spin rounds one `Drain` message runs before the actor takes its other
/// messages (see [`drain`]).
const DRAIN_ROUNDS: u32 = 64;

/// The scheduler actor. See the module docs.
pub struct SchedulerActor<P, R>(PhantomData<fn() -> (P, R)>);

impl<P, R> Default for SchedulerActor<P, R> {
    fn default() -> Self {
        Self(PhantomData)
    }
}

/// The scheduler actor's state (opaque outside the engine).
pub struct SchedulerState<P, R>(Scheduler<P, R>);

/// What the scheduler actor starts with (opaque outside the engine).
pub struct SchedulerStart<P, R>(pub(crate) SchedulerArgs<P, R>);

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
        args: Self::Arguments,
    ) -> Result<Self::State, ActorProcessingErr> {
        let inbox = args.0.inbox.clone();
        // Before restoring: the claims of restored tasks are answered to this actor.
        let _ = args.0.scheduler_slot.set(myself.clone());
        let mut scheduler = Scheduler::new(args.0, now());
        scheduler.publish();
        arm_timer(&myself, &mut scheduler, now());
        if let Some(shared) = &mut scheduler.shared {
            shared.connect(myself.clone());
        }
        if let Some(gpu) = &mut scheduler.gpu {
            gpu.connect(myself.clone())?;
        }
        inbox.connect(myself);
        Ok(SchedulerState(scheduler))
    }

    async fn post_stop(
        &self,
        _myself: ActorRef<Self::Msg>,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        state.0.inbox.close();
        Ok(())
    }

    async fn handle(
        &self,
        myself: ActorRef<Self::Msg>,
        message: Self::Msg,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        let span = crate::spans::actor("scheduler", myself.get_id(), state.0.pool());
        async move {
            let scheduler = &mut state.0;
            let now = now();
            match message.0 {
                Internal::Drain => drain(&myself, scheduler).await,
                Internal::Request(request) => {
                    scheduler.drain_inbox(now);
                    request_received(&myself, scheduler, request, now);
                }
                Internal::Tick => {
                    scheduler.armed_tick = None;
                    scheduler.tick(now);
                }
                Internal::Escalated { reason } => scheduler.escalated(reason, now),
                Internal::WorkerLost { worker, reason } => {
                    scheduler.worker_lost(worker, reason, now)
                }
                Internal::DrainDeadline => {
                    scheduler.drain_inbox(now);
                    scheduler.drain_deadline(now);
                }
                Internal::Queue(report) => scheduler.queue_report(report, now),
                Internal::Shared(report) => {
                    scheduler.drain_inbox(now);
                    scheduler.shared_report(report, now);
                }
                Internal::Headroom(headroom) => scheduler.headroom(headroom, now),
            }
            scheduler.publish();
            arm_timer(&myself, scheduler, now);
            Ok(())
        }
        .instrument(span)
        .await
    }
}

fn request_received<P, R>(
    myself: &ActorRef<SchedulerMsg<P>>,
    scheduler: &mut Scheduler<P, R>,
    request: SchedulerRequest<P>,
    now: u64,
) where
    P: Send + 'static,
    R: Send + 'static,
{
    match request {
        SchedulerRequest::Submit {
            task,
            options,
            reply,
        } => scheduler.submit(task, options, Reply::Port(reply), None, now),
        SchedulerRequest::SubmitStreaming {
            task,
            options,
            stream,
            reply,
        } => {
            let extras = Box::new(Extras {
                stream: Some(stream),
                slot: None,
            });
            scheduler.submit(task, options, Reply::Port(reply), Some(extras), now);
        }
        SchedulerRequest::Cancel { key, id, reply } => scheduler.cancel(key, id, reply, now),
        SchedulerRequest::Shutdown { drain, reply } => {
            if scheduler.shutdown(reply, now) {
                arm_drain_deadline(myself, drain);
            }
        }
        SchedulerRequest::Stats { reply } => {
            let _ = reply.send(scheduler.stats());
        }
    }
}

/// Drains the inbox until it stays empty through a short spin, then marks it idle. Under a
/// stream of submissions that never lets the inbox stay empty, it hands the actor back after
/// [`DRAIN_ROUNDS`] rounds, keeping the inbox marked as scheduled and sending itself the
/// next `Drain`: the requests waiting in the actor's mailbox (shutdown, cancel, stats, the
/// timer's tick) are handled in between, never starved by the inbox.
async fn drain<P, R>(myself: &ActorRef<SchedulerMsg<P>>, scheduler: &mut Scheduler<P, R>)
where
    P: Send + 'static,
    R: Send + 'static,
{
    for _ in 0..DRAIN_ROUNDS {
        scheduler.drain_inbox(now());
        scheduler.publish();
        // The queue actor's answers come as messages: let the actor take them rather than
        // spin on the inbox while they wait.
        if !scheduler.awaiting_queue() && spin_until_busy(scheduler).await {
            continue;
        }
        if !scheduler.inbox.try_idle() {
            return;
        }
    }
    // An error means the actor is stopping: `post_stop` closes the inbox and refuses the rest.
    let _ = myself.send_message(SchedulerMsg(Internal::Drain));
}

/// Spins (bounded) while the inbox is empty; returns whether something arrived.
async fn spin_until_busy<P, R>(scheduler: &Scheduler<P, R>) -> bool
where
    P: Send + 'static,
    R: Send + 'static,
{
    let mut spin = Spin::new(IDLE_SPIN_ROUNDS, SPIN_TIME);
    for round in 1.. {
        if !scheduler.inbox.is_empty() {
            return true;
        }
        if !spin.round() {
            break;
        }
        if round % 16 == 0 {
            tokio::task::yield_now().await;
        }
    }
    !scheduler.inbox.is_empty()
}

/// Makes sure a `Tick` arrives by the core's next time-driven event.
fn arm_timer<P, R>(myself: &ActorRef<SchedulerMsg<P>>, scheduler: &mut Scheduler<P, R>, now: u64)
where
    P: Send + 'static,
    R: Send + 'static,
{
    let Some(next) = scheduler.next_wakeup() else {
        return;
    };
    if scheduler.armed_tick.is_some_and(|armed| armed <= next) {
        return;
    }
    scheduler.armed_tick = Some(next);
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

fn now() -> u64 {
    super::core::clamp_ms(now_ms())
}
