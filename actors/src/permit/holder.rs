//! The holder's side of permits: [`Gate`] asks, [`Permit`] holds.

use std::fmt;
use std::future::poll_fn;
use std::sync::Arc;
use std::task::Poll;
use std::time::{Duration, Instant};

use super::answer::{Answer, Withdrawal};
use super::{AcquireAnswer, Grant, GrowAnswer, Holding, PermitOp, PermitPort};
use crate::domain::{ExtraCosts, PoolError, ResourceCost, ResourceKind, TaskId, TaskMetadata};
use crate::observe::stats::{PoolCounters, PoolStats};
use crate::sync::parker::block_on_until;
use crate::sync::spin::AdaptiveSpin;

/// How many rounds an acquire spins for its answer at most (see `crate::sync::spin`).
const ANSWER_SPIN_ROUNDS: u32 = 64;

/// Hands out [`Permit`]s for a pool's capacity, ranked by the pool's scheduler with the
/// same rules as its tasks. Cheap to clone; `Send + Sync`.
///
/// Get one from a running pool with `PoolClient::gate` (or, at the crate root,
/// `CapacityGate::new` for a gate with no worker threads at all).
#[derive(Clone)]
pub struct Gate {
    port: Arc<dyn PermitPort>,
    counters: Arc<PoolCounters>,
    /// How long acquires spin for their answer before they sleep.
    spin: Arc<AdaptiveSpin>,
}

impl fmt::Debug for Gate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Gate").finish_non_exhaustive()
    }
}

/// Waits for an answer; dropped before it came (the future was dropped, a deadline passed),
/// it withdraws: the scheduler forgets the waiter, or what was granted meanwhile is given
/// back (see `answer.rs` for why nothing leaks either way).
async fn answer_of<T>(answer: &Answer<T>) -> T {
    poll_fn(|cx| answer.poll_take(cx)).await
}

/// The future of [`Gate::acquire`]: the request is made when `acquire` is called, and the
/// future waits for its answer.
///
/// Cancel-safe: dropped before it returned (polled or not), it withdraws: the scheduler
/// forgets the waiter, or a grant that came meanwhile is released at once (see `answer.rs`
/// for why nothing leaks either way). It holds one reference to its answer and nothing
/// else of the request, so a million waiters cost little beyond the scheduler's books.
#[must_use = "a permit is requested at once and withdrawn when this future is dropped"]
pub struct Acquire<'a> {
    gate: &'a Gate,
    /// A permit the fast path granted (its holding) before the future was made, or the
    /// scheduler's answer to wait for; `Done` once returned.
    state: AcquireState,
    id: TaskId,
    /// Whether the first poll still may spin for the answer: only for a caller that blocks
    /// its thread anyway. An async caller never spins: a spin would hold its runtime's
    /// worker thread, which the other tasks on it (other clients, often the holders about
    /// to release) need.
    spin: bool,
}

/// Where an [`Acquire`] stands.
enum AcquireState {
    /// Granted on the fast path: the permit's holding.
    Granted(Arc<Holding>),
    /// Asked of the scheduler: its answer.
    Waiting(Arc<AcquireAnswer>),
    /// Returned (or dropped).
    Done,
}

impl std::future::Future for Acquire<'_> {
    type Output = Result<Permit, PoolError>;

    fn poll(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Self::Output> {
        let this = self.get_mut();
        let answer = match &this.state {
            AcquireState::Granted(_) => {
                let AcquireState::Granted(holding) =
                    std::mem::replace(&mut this.state, AcquireState::Done)
                else {
                    unreachable!("matched just above");
                };
                return std::task::Poll::Ready(Ok(this.gate.permit(this.id, holding)));
            }
            AcquireState::Waiting(answer) => answer,
            AcquireState::Done => return std::task::Poll::Ready(Err(PoolError::Shutdown)),
        };
        let mut granted = None;
        if this.spin {
            // The scheduler usually answers within microseconds: a short spin spares a
            // sleep and a wake-up (see `crate::sync::spin`).
            this.spin = false;
            granted = this.gate.spin.spin(|| answer.try_take());
        }
        let granted = match granted {
            Some(granted) => granted,
            None => match answer.poll_take(cx) {
                std::task::Poll::Ready(granted) => granted,
                std::task::Poll::Pending => return std::task::Poll::Pending,
            },
        };
        this.state = AcquireState::Done;
        std::task::Poll::Ready(
            granted.map(|Grant { holding, .. }| this.gate.permit(this.id, holding)),
        )
    }
}

impl Drop for Acquire<'_> {
    fn drop(&mut self) {
        let answer = match std::mem::replace(&mut self.state, AcquireState::Done) {
            AcquireState::Waiting(answer) => answer,
            // Granted on the fast path and never polled: dropping the permit releases it.
            AcquireState::Granted(holding) => {
                drop(self.gate.permit(self.id, holding));
                return;
            }
            AcquireState::Done => return,
        };
        match answer.withdraw() {
            Withdrawal::WasWaiting => self.gate.port.send(PermitOp::WithdrawAcquire(answer)),
            Withdrawal::Answered(Ok(grant)) => self
                .gate
                .port
                .send(PermitOp::Release { entry: grant.entry }),
            Withdrawal::Answered(Err(_)) | Withdrawal::Settled => {}
        }
    }
}

/// A grow in flight (see [`answer_of`]).
struct GrowGuard<'a> {
    permit: &'a Permit,
    answer: Arc<GrowAnswer>,
    extra: u32,
    /// Set once the answer was taken: nothing to withdraw.
    settled: bool,
}

impl Drop for GrowGuard<'_> {
    fn drop(&mut self) {
        if self.settled {
            return;
        }
        let permit = self.permit;
        withdraw_grow(&*permit.port, &permit.holding, &self.answer, self.extra);
    }
}

/// A grow of `extra` units of the permit held through `holding` is given up: the scheduler
/// forgets it, or the units granted meanwhile go back.
fn withdraw_grow(port: &dyn PermitPort, holding: &Holding, answer: &Arc<GrowAnswer>, extra: u32) {
    match answer.withdraw() {
        Withdrawal::WasWaiting => port.send(PermitOp::WithdrawGrow(answer.clone())),
        Withdrawal::Answered(Ok(())) => {
            let units = holding.take(extra);
            port.send(PermitOp::Shrink {
                entry: holding.entry(),
                units,
            });
        }
        Withdrawal::Answered(Err(_)) | Withdrawal::Settled => {}
    }
}

/// Takes `units` of `kind` from its lane when it is open and has them (the fast path).
fn take_from_lane(port: &dyn PermitPort, kind: ResourceKind, units: u32) -> bool {
    port.lanes().try_take(kind, units)
}

/// Gives `units` of `kind` borrowed from its lane back: to the lane while it is open, else
/// to the scheduler, which hands them to the waiters in rank order.
fn give_to_lane(port: &dyn PermitPort, kind: ResourceKind, units: u32) {
    if units > 0 && !port.lanes().give(kind, units) {
        port.send(PermitOp::LaneReturn { kind, units });
    }
}

impl Gate {
    pub(crate) fn new(port: Arc<dyn PermitPort>, counters: Arc<PoolCounters>) -> Self {
        Self {
            port,
            counters,
            spin: Arc::new(AdaptiveSpin::with_max(ANSWER_SPIN_ROUNDS)),
        }
    }

    /// A permit for `meta.cost`, ranked among waiters as a task with this metadata would be
    /// (priority, skip-ahead, the starvation guard, fair share by the mailbox key's tenant,
    /// the deadline). Waits until it is granted.
    ///
    /// Cancel-safe: dropping the future withdraws the waiter; a grant that raced the drop is
    /// released at once. Refused like a task: `InsufficientResources` (more than the pool
    /// has of that kind), `QueueFull`, `Expired` (its deadline passed while it waited),
    /// `DuplicateTask`, `Shutdown`.
    pub fn acquire(&self, meta: TaskMetadata) -> Acquire<'_> {
        self.request(meta, ExtraCosts::NONE, true, false)
    }

    /// [`acquire`](Self::acquire) for a permit that holds `also` beside `meta.cost`, one
    /// cost per other kind (core rule 25): a decode sequence's engine slot beside its
    /// KV-cache blocks. Granted only when every kind fits, all of it at once; the permit
    /// grows and shrinks `meta.cost`'s kind and gives every kind back when dropped. A kind
    /// named twice is refused (`InvalidConfig`, naming it). It never takes the fast path.
    pub fn acquire_with(&self, meta: TaskMetadata, also: &[ResourceCost]) -> Acquire<'_> {
        match ExtraCosts::new(meta.cost, also) {
            Ok(also) => self.request(meta, also, true, false),
            Err(message) => self.refused(meta.id, PoolError::InvalidConfig(message)),
        }
    }

    /// [`acquire_with`](Self::acquire_with) on the calling thread, at most `timeout` (then
    /// `Timeout`), as [`acquire_blocking`](Self::acquire_blocking) waits.
    pub fn acquire_blocking_with(
        &self,
        meta: TaskMetadata,
        also: &[ResourceCost],
        timeout: Duration,
    ) -> Result<Permit, PoolError> {
        let also = ExtraCosts::new(meta.cost, also).map_err(PoolError::InvalidConfig)?;
        let deadline = Instant::now().checked_add(timeout);
        block_on_until(self.request(meta, also, true, true), deadline)
            .unwrap_or(Err(PoolError::Timeout))
    }

    /// An acquire answered at once with `error`.
    fn refused(&self, id: TaskId, error: PoolError) -> Acquire<'_> {
        let answer = Arc::new(AcquireAnswer::new());
        let _ = answer.give(Err(error));
        Acquire {
            gate: self,
            state: AcquireState::Waiting(answer),
            id,
            spin: false,
        }
    }

    /// [`acquire`](Self::acquire) for plain threads: waits on the calling thread (no
    /// runtime involved) at most `timeout`, then withdraws and returns `Timeout`.
    pub fn acquire_blocking(
        &self,
        meta: TaskMetadata,
        timeout: Duration,
    ) -> Result<Permit, PoolError> {
        if let Some(permit) = self.fast_path(&meta) {
            return Ok(permit);
        }
        let deadline = Instant::now().checked_add(timeout);
        block_on_until(self.request(meta, ExtraCosts::NONE, true, true), deadline)
            .unwrap_or(Err(PoolError::Timeout))
    }

    /// A permit only if it is granted at once, as a task that starts at once would be;
    /// `WouldWait` otherwise. While nobody waits for its kind it is one atomic operation on
    /// the calling thread (the fast path). Otherwise it never waits in the queue, but it
    /// does wait one trip to the scheduler and back on the calling thread (microseconds):
    /// do not call it from a task
    /// of the runtime the pool's own actors run on (a `ResourcePool` started with a spawner
    /// of yours on a single-threaded runtime); `acquire` is right there.
    pub fn try_acquire(&self, meta: TaskMetadata) -> Result<Permit, PoolError> {
        if let Some(permit) = self.fast_path(&meta) {
            return Ok(permit);
        }
        block_on_until(self.request(meta, ExtraCosts::NONE, false, true), None)
            .unwrap_or(Err(PoolError::Shutdown))
    }

    fn request(&self, meta: TaskMetadata, also: ExtraCosts, wait: bool, spin: bool) -> Acquire<'_> {
        let id = meta.id;
        let lane = also
            .is_empty()
            .then(|| acquire_from_lane(&*self.port, &meta));
        if let Some(holding) = lane.flatten() {
            return Acquire {
                gate: self,
                state: AcquireState::Granted(holding),
                id,
                spin: false,
            };
        }
        let answer = Arc::new(AcquireAnswer::new());
        self.port.send(PermitOp::Acquire {
            meta,
            also,
            wait,
            answer: answer.clone(),
        });
        Acquire {
            gate: self,
            state: AcquireState::Waiting(answer),
            id,
            spin,
        }
    }

    /// A permit from the kind's lane, when it is open and has the units (nobody waits).
    fn fast_path(&self, meta: &TaskMetadata) -> Option<Permit> {
        let holding = acquire_from_lane(&*self.port, meta)?;
        Some(self.permit(meta.id, holding))
    }

    /// The permit of caller `id` held through `holding`.
    fn permit(&self, id: TaskId, holding: Arc<Holding>) -> Permit {
        Permit {
            id,
            holding,
            port: self.port.clone(),
        }
    }

    /// The pool's counters: permits held count as active tasks, waiting ones as queued.
    pub fn stats(&self) -> PoolStats {
        self.counters.snapshot()
    }
}

/// Units granted by a [`Gate`], held until the permit is dropped (released exactly once).
/// `Send + Sync`: the code that generates with it may share it by reference.
pub struct Permit {
    id: TaskId,
    holding: Arc<Holding>,
    port: Arc<dyn PermitPort>,
}

impl fmt::Debug for Permit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Permit")
            .field("id", &self.id)
            .field("units", &self.units())
            .field("preempted", &self.is_preempted())
            .finish()
    }
}

impl Permit {
    /// The id of the metadata it was acquired with.
    pub fn id(&self) -> TaskId {
        self.id
    }

    /// Units held now.
    pub fn units(&self) -> u32 {
        self.holding.units()
    }

    /// Takes `extra` more units now, if the fast path would grant them (they are free, and
    /// no waiter is reserved against starvation); `WouldWait` if not, or
    /// `InsufficientResources` if the pool could never hold that many for one holder.
    /// While nobody waits for its kind this is one atomic operation; otherwise it waits
    /// one trip to the scheduler, as [`Gate::try_acquire`] does.
    pub fn try_grow(&self, extra: u32) -> Result<(), PoolError> {
        if extra == 0 || self.grow_from_lane(extra) {
            return Ok(());
        }
        block_on_until(self.grow_with(extra, false), None).unwrap_or(Err(PoolError::Shutdown))
    }

    /// Borrows `extra` units from the lane, if it is open and has them.
    fn grow_from_lane(&self, extra: u32) -> bool {
        grow_from_lane(&*self.port, &self.holding, extra)
    }

    /// Asks for `extra` more units, ranked as [`grow`](Self::grow) is, and returns at once
    /// with a [`PendingGrow`] to [`check`](PendingGrow::check) later: for an engine that
    /// polls each request once per step rather than awaiting a future. The request is made
    /// once, so it keeps its place among the waiters from step to step (a loop that calls
    /// [`try_grow`](Self::try_grow) each step never gets one). Dropping it withdraws it.
    pub fn grow_pending(&self, extra: u32) -> PendingGrow {
        let pending = |answer, outcome| PendingGrow {
            holding: self.holding.clone(),
            port: self.port.clone(),
            answer,
            extra,
            outcome,
        };
        if extra == 0 || self.grow_from_lane(extra) {
            return pending(None, Some(Ok(())));
        }
        let answer = Arc::new(GrowAnswer::new());
        self.port.send(PermitOp::Grow {
            holding: self.holding.clone(),
            extra,
            wait: true,
            answer: answer.clone(),
        });
        pending(Some(answer), None)
    }

    /// Waits, ranked as the permit itself was, for `extra` more units, keeping what it holds.
    /// Cancel-safe as [`Gate::acquire`] is.
    ///
    /// Refused with `WouldDeadlock` when every other holder of units of this kind is waiting
    /// to grow as well: nobody would ever release anything, so this wait is refused rather
    /// than joined (shrink or drop a permit, then grow again). `InsufficientResources` when
    /// the pool could never hold that many for one holder.
    pub async fn grow(&self, extra: u32) -> Result<(), PoolError> {
        if extra == 0 || self.grow_from_lane(extra) {
            return Ok(());
        }
        self.grow_with(extra, true).await
    }

    async fn grow_with(&self, extra: u32, wait: bool) -> Result<(), PoolError> {
        let answer = Arc::new(GrowAnswer::new());
        self.port.send(PermitOp::Grow {
            holding: self.holding.clone(),
            extra,
            wait,
            answer: answer.clone(),
        });
        let mut guard = GrowGuard {
            permit: self,
            answer,
            extra,
            settled: false,
        };
        let grown = answer_of(&guard.answer).await;
        guard.settled = true;
        grown
    }

    /// Gives `units` back at once (at most what it holds); waiters that now fit are granted.
    /// Units it borrowed from the fast path go back first, with one atomic operation while
    /// nobody waits.
    pub fn shrink(&self, units: u32) {
        shrink_holding(&*self.port, &self.holding, units);
    }

    /// Whether a waiter of higher priority asked this permit to yield. Nothing is taken
    /// away: the holder decides when to drop it (and, for an engine, to recompute later).
    pub fn is_preempted(&self) -> bool {
        self.holding.is_preempted()
    }

    /// Resolves once a waiter of higher priority asks this permit to yield (at once if one
    /// did already).
    pub async fn preempted(&self) {
        loop {
            let notified = self.holding.yielding.notified();
            let mut notified = std::pin::pin!(notified);
            notified.as_mut().enable();
            if self.is_preempted() {
                return;
            }
            notified.await;
        }
    }
}

/// Gives back up to `units` that `holding` holds: those borrowed from the lane to the lane,
/// the rest to the scheduler.
pub(crate) fn shrink_holding(port: &dyn PermitPort, holding: &Holding, units: u32) {
    let units = holding.take(units);
    if units == 0 {
        return;
    }
    let borrowed = holding.fast.unborrow(units);
    give_to_lane(port, holding.kind, borrowed);
    if units > borrowed {
        port.send(PermitOp::Shrink {
            entry: holding.entry(),
            units: units - borrowed,
        });
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        release_holding(&*self.port, &self.holding);
    }
}

/// The fast path of an acquire: a permit for `meta` from its kind's lane, when it is open
/// and has the units; the scheduler hears of it at its next drain.
pub(crate) fn acquire_from_lane(
    port: &dyn PermitPort,
    meta: &TaskMetadata,
) -> Option<Arc<Holding>> {
    if meta
        .deadline_ms
        .is_some_and(|deadline| deadline <= crate::util::clock::now_ms())
    {
        return None;
    }
    if !take_from_lane(port, meta.cost.kind, meta.cost.units) {
        return None;
    }
    let holding = Holding::borrowing(meta);
    if port.lanes().register(holding.clone()) {
        port.nudge();
    }
    Some(holding)
}

/// The fast path of a grow: `holding` borrows `extra` units from its lane, if it is open and
/// has them; returns whether it did.
pub(crate) fn grow_from_lane(port: &dyn PermitPort, holding: &Holding, extra: u32) -> bool {
    if !take_from_lane(port, holding.kind, extra) {
        return false;
    }
    holding.fast.borrow(extra);
    holding.add(extra);
    true
}

/// What dropping the permit held through `holding` does: what it borrowed goes back to its
/// lane (or the scheduler), and the scheduler hears of the drop if it took the permit over.
///
/// While someone waits (the lane is closed) and the scheduler offered a baton its units
/// cover, the holder grants that waiter itself: one wake-up (the waiter's) instead of two
/// (the scheduler's, then the waiter's); the scheduler books it at its next drain.
pub(crate) fn release_holding(port: &dyn PermitPort, holding: &Holding) {
    let left = holding.fast.leave();
    let lanes = port.lanes();
    if !left.adopted {
        lanes.holder_left();
    }
    let claim = left.adopted.then(|| holding.entry());
    let mut lane_units = left.borrowed;
    if lane_units > 0 && lanes.give(holding.kind, lane_units) {
        lane_units = 0;
    } else if holding.is_preempted() {
        // Asked to yield: the scheduler books the yield (and counts it) before it grants the
        // units to the waiter that asked, so whoever it wakes sees the yield counted.
    } else if let Some(baton) = lanes.take_baton(holding.kind, holding.units(), claim, lane_units) {
        if let Err(Ok(grant)) = baton.answer.give(Ok(baton.grant)) {
            // The waiter gave up meanwhile: the scheduler releases what it would have held.
            port.send(PermitOp::Release { entry: grant.entry });
        }
        port.nudge();
        return;
    }
    if lane_units > 0 {
        port.send(PermitOp::LaneReturn {
            kind: holding.kind,
            units: lane_units,
        });
    }
    if let Some(entry) = claim {
        port.send(PermitOp::Release { entry });
    }
}

/// A ranked grow made by [`Permit::grow_pending`], checked without a future. Dropped before
/// it was granted, it withdraws; a grant that came meanwhile is given back.
#[must_use = "the grow is withdrawn when this is dropped"]
pub struct PendingGrow {
    holding: Arc<Holding>,
    port: Arc<dyn PermitPort>,
    /// The request in flight; `None` once settled.
    answer: Option<Arc<GrowAnswer>>,
    extra: u32,
    /// The answer, once it came.
    outcome: Option<Result<(), PoolError>>,
}

impl fmt::Debug for PendingGrow {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PendingGrow")
            .field("extra", &self.extra)
            .field("outcome", &self.outcome)
            .finish()
    }
}

impl PendingGrow {
    /// `Pending` while it waits; then, every time, `Ready(Ok(()))` once the units were
    /// added to the permit, or `Ready(Err(_))` as [`Permit::grow`] is refused (for
    /// example `WouldDeadlock`: every other holder waits to grow too, so the engine must
    /// give some units back, by preempting a sequence, before anyone can grow).
    pub fn check(&mut self) -> Poll<Result<(), PoolError>> {
        if let Some(outcome) = &self.outcome {
            return Poll::Ready(outcome.clone());
        }
        let Some(answer) = &self.answer else {
            return Poll::Ready(Err(PoolError::Shutdown));
        };
        match answer.try_take() {
            Some(outcome) => {
                self.answer = None;
                self.outcome = Some(outcome.clone());
                Poll::Ready(outcome)
            }
            None => Poll::Pending,
        }
    }

    /// Units asked for.
    pub fn extra(&self) -> u32 {
        self.extra
    }
}

impl Drop for PendingGrow {
    fn drop(&mut self) {
        if let Some(answer) = self.answer.take() {
            withdraw_grow(&*self.port, &self.holding, &answer, self.extra);
        }
    }
}
