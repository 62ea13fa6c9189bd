//! Permits in the shell: tickets of the core whose run happens outside the pool.
//!
//! A permit is admitted as a task is (same ticket, same rank), but through
//! [`ParkingLot::admit_permit`]: it takes units and no worker slot. Granted, it is *held*
//! here until its holder drops it; waiting, it is a *waiter* here and a parked ticket in the
//! core. A ranked grow is a second, child ticket for the extra units, ranked as its permit
//! was; once the core starts it, it is absorbed into the permit.
//!
//! # Rules
//!
//! - **Deadlock.** A grow that cannot be granted at once is refused (`WouldDeadlock`)
//!   instead of parked when every other holder of units of its kind is itself waiting to
//!   grow: none of them would ever release anything.
//! - **Preemption** (opt-in, [`Preemption`]). When a waiter parks, the core names the fewest
//!   held permits of strictly lower priority whose units, with the free units and those
//!   already asked to yield, would let it fit (rule 14 of the core). Each is asked once; a
//!   task id is asked at most `max_per_task` times (the count is forgotten once a permit of
//!   that id is dropped without having been asked). A running pool task is asked only where
//!   the pool can run it again (`rerun.rs`).
//!
//! # Invariants
//!
//! - Every waiter is parked in the core, and answered exactly once: granted, refused, or
//!   withdrawn by its holder (then never answered).
//! - `yielding[kind]` is the sum of the units of held permits asked to yield.

use std::sync::Arc;

use super::Shell;
use crate::domain::{
    ExtraCosts, MailboxKey, PoolError, Preemption, Priority, ResourceCost, ResourceKind, TaskId,
    TaskMetadata,
};
use crate::observe::events::TaskStep;
use crate::permit::{AcquireAnswer, Grant, GrowAnswer, Holding, PermitOp};
use crate::queue::EntryId;
use crate::scheduler::core::{AdmitParts, Cancel, FastMap, Newcomer, Ticket};
use crate::scheduler::shell::effects::{Effect, PermitEffect};
use crate::scheduler::shell::ledger::admitted_ms;
use crate::scheduler::shell::observe::Detail;

const KINDS: usize = ResourceKind::COUNT;

/// A granted permit. (What it holds, its priority and its tenant are the core's claim:
/// [`ParkingLot::claim_of`](crate::scheduler::core::ParkingLot::claim_of).)
struct Held {
    holding: Arc<Holding>,
    id: TaskId,
    /// Units it held when asked to yield; `None`: not asked.
    asked_units: Option<u32>,
    /// Its grows waiting in the core.
    growing: u32,
}

impl Held {
    /// The permit held through `holding`.
    fn new(holding: Arc<Holding>) -> Self {
        Self {
            id: holding.id,
            holding,
            asked_units: None,
            growing: 0,
        }
    }
}

/// A waiter: an acquire or a grow, parked in the core.
enum Waiter {
    Acquire {
        answer: Arc<AcquireAnswer>,
        id: TaskId,
        priority: Priority,
    },
    Grow {
        answer: Arc<GrowAnswer>,
        parent: EntryId,
        kind: ResourceKind,
    },
}

impl Waiter {
    /// Where its answer lives: who it is, for a withdrawal.
    fn answer(&self) -> *const () {
        match self {
            Waiter::Acquire { answer, .. } => Arc::as_ptr(answer).cast(),
            Waiter::Grow { answer, .. } => Arc::as_ptr(answer).cast(),
        }
    }
}

/// The shell's permits. See the module docs.
pub(crate) struct Permits {
    held: FastMap<EntryId, Held>,
    /// Waiters by entry (each answer is tagged with its waiter's entry, for withdrawals).
    waiting: FastMap<EntryId, Waiter>,
    /// Units of held permits asked to yield, per kind.
    yielding: [u32; KINDS],
    /// Held permits with a grow waiting, per kind (the deadlock rule).
    growing: [usize; KINDS],
    /// Times each task id was asked to yield.
    asked: FastMap<TaskId, u32>,
    preemption: Option<Preemption>,
    /// The key of permits acquired without a mailbox key (events name one).
    anonymous: MailboxKey,
    /// Waiters a releaser granted itself (a hand-off, see `lanes.rs`), by entry, until the
    /// core starts them.
    handed: FastMap<EntryId, Arc<Holding>>,
}

impl Permits {
    pub fn new(preemption: Option<Preemption>) -> Self {
        Self {
            held: FastMap::default(),
            waiting: FastMap::default(),
            yielding: [0; KINDS],
            growing: [0; KINDS],
            asked: FastMap::default(),
            preemption,
            anonymous: MailboxKey::anonymous(),
            handed: FastMap::default(),
        }
    }

    /// Whether `entry` is a waiter (the core may start it).
    pub fn is_waiting(&self, entry: EntryId) -> bool {
        !self.waiting.is_empty() && self.waiting.contains_key(&entry)
    }

    /// The caller's id of waiting permit `entry` (a grow is its permit's).
    pub fn waiter_id(&self, entry: EntryId) -> Option<TaskId> {
        match self.waiting.get(&entry)? {
            Waiter::Acquire { id, .. } => Some(*id),
            Waiter::Grow { parent, .. } => self.held.get(parent).map(|held| held.id),
        }
    }

    /// The caller's id of held permit `entry`.
    pub fn held_id(&self, entry: EntryId) -> Option<TaskId> {
        self.held.get(&entry).map(|held| held.id)
    }

    /// Each held permit: its entry and the caller's id.
    pub fn held(&self) -> impl Iterator<Item = (EntryId, TaskId)> + '_ {
        self.held.iter().map(|(&entry, held)| (entry, held.id))
    }

    /// The key permits are granted under.
    pub fn key(&self) -> &MailboxKey {
        &self.anonymous
    }

    /// Permits held now.
    pub fn held_len(&self) -> usize {
        self.held.len()
    }

    /// The acquire waiting as `entry`, when it is one: its answer, caller id and priority.
    pub fn acquire_waiter(
        &self,
        entry: EntryId,
    ) -> Option<(&Arc<AcquireAnswer>, TaskId, Priority)> {
        match self.waiting.get(&entry)? {
            Waiter::Acquire {
                answer,
                id,
                priority,
            } => Some((answer, *id, *priority)),
            Waiter::Grow { .. } => None,
        }
    }

    /// The waiter `entry` was granted by a releaser, through `holding`: once the core
    /// starts it, it is held without a second answer.
    pub fn handed(&mut self, entry: EntryId, holding: Arc<Holding>) {
        self.handed.insert(entry, holding);
    }

    /// Whether the hand-off to `entry` is still to be started (it should not be).
    pub fn unstarted_hand_off(&mut self, entry: EntryId) -> Option<Arc<Holding>> {
        self.handed.remove(&entry)
    }

    /// The fast-path permit held through `holding` was taken over as `entry`.
    pub fn adopted(&mut self, entry: EntryId, holding: Arc<Holding>) {
        self.held.insert(entry, Held::new(holding));
    }

    /// Whether the held permit of `entry` may be asked to yield.
    fn may_yield(&self, entry: EntryId, max_per_task: u32) -> bool {
        self.held.get(&entry).is_some_and(|held| {
            held.asked_units.is_none()
                && self.asked.get(&held.id).copied().unwrap_or(0) < max_per_task
        })
    }

    /// Units asked to yield (of a pool task: `rerun.rs`) are on their way back.
    pub fn asked(&mut self, kind: ResourceKind, units: u32) {
        self.yielding[kind.index()] += units;
    }

    /// Units asked to yield came back, or will not.
    pub fn yielded(&mut self, kind: ResourceKind, units: u32) {
        self.yielding[kind.index()] = self.yielding[kind.index()].saturating_sub(units);
    }

    fn grow_ended(&mut self, parent: EntryId, kind: ResourceKind) {
        if let Some(held) = self.held.get_mut(&parent) {
            held.growing = held.growing.saturating_sub(1);
            if held.growing == 0 {
                self.growing[kind.index()] = self.growing[kind.index()].saturating_sub(1);
            }
        }
    }
}

impl<P, R> Shell<P, R>
where
    P: Send + 'static,
    R: Send + 'static,
{
    /// A request about permits.
    pub fn permit(&mut self, op: PermitOp, now: u64) {
        match op {
            PermitOp::Acquire {
                meta,
                also,
                wait,
                answer,
            } => self.acquire(meta, also, wait, answer, now),
            PermitOp::WithdrawAcquire(answer) => {
                self.withdraw(answer.tag(), Arc::as_ptr(&answer).cast(), now)
            }
            PermitOp::Grow {
                holding,
                extra,
                wait,
                answer,
            } => match self.take_over(&holding, now) {
                Some(entry) => self.grow(entry, extra, wait, answer, now),
                None => self.fx_permit(PermitEffect::RefuseGrow {
                    answer,
                    error: PoolError::Shutdown,
                }),
            },
            PermitOp::LaneReturn { kind, units } => self.lane_return(kind, units, now),
            PermitOp::WithdrawGrow(answer) => {
                self.withdraw(answer.tag(), Arc::as_ptr(&answer).cast(), now)
            }
            PermitOp::Shrink { entry, units } => {
                if let Ok(started) = self.tasks.core.shrink(entry, units, now) {
                    self.start_parked(started, now);
                }
            }
            PermitOp::Release { entry } => self.release(entry, now),
        }
    }

    fn fx_permit(&mut self, effect: PermitEffect) {
        self.tasks.fx.push(Effect::Permit(effect));
    }

    fn acquire(
        &mut self,
        meta: TaskMetadata,
        also: ExtraCosts,
        wait: bool,
        answer: Arc<AcquireAnswer>,
        now: u64,
    ) {
        if let Err(error) = self.lifecycle.admits() {
            self.fx_permit(PermitEffect::RefuseAcquire { answer, error });
            return;
        }
        let entry = self.tasks.ledger.next_entry(now);
        let key = meta.mailbox.as_ref().unwrap_or(&self.permits.anonymous);
        let mut ticket = self.tasks.ticket(entry, &meta, key, None);
        ticket.also = also;
        // A caller that will not wait leaves at once if it would park: it sheds nothing.
        let admitted = match wait {
            true => self.tasks.core.admit_permit(ticket, now),
            false => self.tasks.core.admit_without_shedding(ticket, true, now),
        };
        let AdmitParts {
            newcomer,
            started: unblocked,
            shed,
        } = admitted.newcomer();
        self.end_shed(shed, now);
        match newcomer {
            Newcomer::Start => {
                let holding = Holding::granted(entry, meta.id, meta.priority, ticket.cost);
                self.grant(entry, answer, Held::new(holding));
            }
            Newcomer::Park if wait => {
                answer.set_tag(entry);
                let waiter = Waiter::Acquire {
                    answer,
                    id: meta.id,
                    priority: meta.priority,
                };
                self.permits.waiting.insert(entry, waiter);
                self.preempt_for(entry, meta.cost.kind, now);
            }
            Newcomer::Park => {
                if let Ok(Cancel::Parked { started }) = self.tasks.core.cancel(entry, now) {
                    self.start_parked(started, now);
                }
                let error = PoolError::WouldWait;
                self.fx_permit(PermitEffect::RefuseAcquire { answer, error });
            }
            Newcomer::Expire => {
                let error = PoolError::Expired;
                self.fx_permit(PermitEffect::RefuseAcquire { answer, error });
            }
            Newcomer::Reject(rejection) => {
                let error = rejection.into();
                self.fx_permit(PermitEffect::RefuseAcquire { answer, error });
            }
        }
        self.start_parked(unblocked, now);
    }

    /// Grants the permit `entry`.
    fn grant(&mut self, entry: EntryId, answer: Arc<AcquireAnswer>, held: Held) {
        let holding = held.holding.clone();
        self.permits.held.insert(entry, held);
        let grant = Grant { entry, holding };
        self.fx_permit(PermitEffect::Grant { answer, grant });
    }

    /// The core started the waiter `entry` (see `Shell::start_parked`).
    pub(super) fn permit_started(&mut self, entry: EntryId, now: u64) {
        let Some(waiter) = self.permits.waiting.remove(&entry) else {
            return;
        };
        match waiter {
            Waiter::Acquire {
                answer,
                id,
                priority,
            } => {
                if let Some(holding) = self.permits.handed.remove(&entry) {
                    // A releaser granted it already (a hand-off): it is held from now on.
                    self.permits.held.insert(entry, Held::new(holding));
                    return;
                }
                let Some((cost, _, _)) = self.tasks.core.claim_of(entry) else {
                    return;
                };
                let holding = Holding::granted(entry, id, priority, cost);
                self.grant(entry, answer, Held::new(holding));
            }
            Waiter::Grow {
                answer,
                parent,
                kind,
            } => {
                self.permits.grow_ended(parent, kind);
                let extra = self.tasks.core.units_of(entry).unwrap_or(0);
                let holding = self
                    .permits
                    .held
                    .get(&parent)
                    .map(|held| held.holding.clone());
                match (holding, self.tasks.core.absorb(entry, parent, now)) {
                    (Some(holding), Ok(started)) => {
                        self.fx_permit(PermitEffect::Grew {
                            answer,
                            holding,
                            parent,
                            extra,
                        });
                        self.start_parked(started, now);
                    }
                    _ => {
                        // Its permit is gone: the child ends, and its units with it.
                        if let Ok(started) = self.tasks.core.complete(entry, now) {
                            self.start_parked(started, now);
                        }
                        let error = PoolError::Shutdown;
                        self.fx_permit(PermitEffect::RefuseGrow { answer, error });
                    }
                }
            }
        }
    }
}

impl<P, R> Shell<P, R>
where
    P: Send + 'static,
    R: Send + 'static,
{
    fn grow(&mut self, entry: EntryId, extra: u32, wait: bool, answer: Arc<GrowAnswer>, now: u64) {
        let refuse = |shell: &mut Self, answer, error| {
            shell.fx_permit(PermitEffect::RefuseGrow { answer, error });
        };
        let holding = self
            .permits
            .held
            .get(&entry)
            .map(|held| held.holding.clone());
        let (Some(holding), Some((cost, priority, tenant))) =
            (holding, self.tasks.core.claim_of(entry))
        else {
            return refuse(self, answer, PoolError::Shutdown);
        };
        let (kind, units) = (cost.kind, cost.units);
        let available = self.tasks.core.tenant_cap(kind);
        let needed = units.saturating_add(extra);
        if needed > available {
            let error = PoolError::InsufficientResources {
                kind,
                needed: needed as usize,
                available: available as usize,
            };
            return refuse(self, answer, error);
        }
        if self.tasks.core.grow_now(entry, extra) == Ok(true) {
            let grew = PermitEffect::Grew {
                answer,
                holding,
                parent: entry,
                extra,
            };
            return self.fx_permit(grew);
        }
        if !wait {
            return refuse(self, answer, PoolError::WouldWait);
        }
        if let Err(error) = self.lifecycle.admits() {
            return refuse(self, answer, error);
        }
        // Holders of the fast path count for the deadlock rule as the others do.
        self.take_over_all(Some(kind), now);
        if self.would_deadlock(entry, kind, units) {
            return refuse(self, answer, PoolError::WouldDeadlock { kind });
        }
        let child = self.tasks.ledger.next_entry(now);
        let ticket = Ticket {
            id: child,
            priority,
            cost: ResourceCost::new(kind, extra),
            created_at_ms: admitted_ms(entry),
            deadline_ms: None,
            tenant,
            timeout_ms: None,
            also: Default::default(),
        };
        let AdmitParts {
            newcomer,
            started: unblocked,
            shed,
        } = self.tasks.core.admit_permit(ticket, now).newcomer();
        self.end_shed(shed, now);
        match newcomer {
            Newcomer::Start => match self.tasks.core.absorb(child, entry, now) {
                Ok(started) => {
                    self.fx_permit(PermitEffect::Grew {
                        answer,
                        holding,
                        parent: entry,
                        extra,
                    });
                    self.start_parked(started, now);
                }
                Err(_) => {
                    if let Ok(started) = self.tasks.core.complete(child, now) {
                        self.start_parked(started, now);
                    }
                    refuse(self, answer, PoolError::Shutdown);
                }
            },
            Newcomer::Park => {
                answer.set_tag(child);
                let waiter = Waiter::Grow {
                    answer,
                    parent: entry,
                    kind,
                };
                self.permits.waiting.insert(child, waiter);
                if let Some(held) = self.permits.held.get_mut(&entry) {
                    held.growing += 1;
                    if held.growing == 1 {
                        self.permits.growing[kind.index()] += 1;
                    }
                }
                self.preempt_for(child, kind, now);
            }
            Newcomer::Expire => refuse(self, answer, PoolError::Expired),
            Newcomer::Reject(rejection) => refuse(self, answer, rejection.into()),
        }
        self.start_parked(unblocked, now);
    }

    /// Whether every other holder of `kind` units waits to grow (the deadlock rule), for
    /// the permit `entry` holding `units`.
    fn would_deadlock(&self, entry: EntryId, kind: ResourceKind, units: u32) -> bool {
        let others_holding = self.tasks.core.holders(kind) - usize::from(units > 0);
        let already_growing = self
            .permits
            .held
            .get(&entry)
            .is_some_and(|held| held.growing > 0 && units > 0);
        let others_growing = self.permits.growing[kind.index()] - usize::from(already_growing);
        others_holding <= others_growing
    }

    /// The waiter filed under `entry` with the answer at `answer` gave up (a waiter answered
    /// meanwhile is not filed any more, and its entry may be another's by now).
    fn withdraw(&mut self, entry: EntryId, answer: *const (), now: u64) {
        let filed = self.permits.waiting.get(&entry);
        if filed.is_none_or(|waiter| waiter.answer() != answer) {
            return;
        }
        if let Some(Waiter::Grow { parent, kind, .. }) = self.permits.waiting.remove(&entry) {
            self.permits.grow_ended(parent, kind);
        }
        if let Ok(Cancel::Parked { started }) = self.tasks.core.cancel(entry, now) {
            self.start_parked(started, now);
        }
    }

    /// A permit was dropped: its units return and waiters that now fit are granted.
    fn release(&mut self, entry: EntryId, now: u64) {
        if !self.forget_held(entry, now) {
            return;
        }
        if let Ok(started) = self.tasks.core.complete(entry, now) {
            self.start_parked(started, now);
        }
        self.stop_if_drained();
    }

    /// The permit books of a dropped permit (what it was asked to yield, its grows); the
    /// core's claim is left to the caller. Returns whether `entry` was held.
    pub(super) fn forget_held(&mut self, entry: EntryId, now: u64) -> bool {
        let (Some(held), Some((cost, _, _))) = (
            self.permits.held.remove(&entry),
            self.tasks.core.claim_of(entry),
        ) else {
            return false;
        };
        if let Some(asked_units) = held.asked_units {
            self.permits.yielded(cost.kind, asked_units);
            let step = TaskStep::Yielded { units: cost.units };
            let key = &self.permits.anonymous;
            self.tasks
                .observers
                .step(held.id, key, cost, &step, now, Detail::NONE);
        } else if !self.permits.asked.is_empty() {
            // It ran to its end: its id starts afresh.
            self.permits.asked.remove(&held.id);
        }
        if held.growing > 0 {
            let kind = cost.kind.index();
            self.permits.growing[kind] = self.permits.growing[kind].saturating_sub(1);
        }
        true
    }

    /// Asks held permits of lower priority to yield for the waiter `entry` of `kind`, when
    /// preemption is on and they would let it fit (see the module docs).
    pub(super) fn preempt_for(&mut self, entry: EntryId, kind: ResourceKind, now: u64) {
        let Some(preemption) = self.permits.preemption else {
            return;
        };
        // Holders of the fast path may be asked to yield as the others are.
        self.take_over_all(Some(kind), now);
        let tasks_may_yield = self.rerun.get().is_some();
        if self.permits.held.is_empty() && !tasks_may_yield {
            return;
        }
        let pending = self.permits.yielding[kind.index()];
        let (permits, ledger) = (&self.permits, &self.tasks.ledger);
        let victims = self
            .tasks
            .core
            .preemption_victims(entry, pending, |victim| {
                permits.may_yield(victim, preemption.max_per_task)
                    || (tasks_may_yield && super::rerun::task_may_yield(ledger, victim))
            });
        for victim in victims.unwrap_or_default() {
            let Some((cost, _, _)) = self.tasks.core.claim_of(victim) else {
                continue;
            };
            let Some(held) = self.permits.held.get_mut(&victim) else {
                if self.ask_task(victim, cost.units, now) {
                    self.permits.asked(kind, cost.units);
                }
                continue;
            };
            held.asked_units = Some(cost.units);
            let (id, holding) = (held.id, held.holding.clone());
            self.permits.asked(kind, cost.units);
            *self.permits.asked.entry(id).or_default() += 1;
            let key = &self.permits.anonymous;
            self.tasks
                .observers
                .step(id, key, cost, &TaskStep::YieldAsked, now, Detail::NONE);
            self.fx_permit(PermitEffect::Preempt(holding));
        }
    }

    /// Ends waiters the core no longer holds (expired, or emptied at a stop) with `error`;
    /// returns the entries that were not waiters.
    pub(super) fn end_waiters(&mut self, entries: Vec<EntryId>, error: &PoolError) -> Vec<EntryId> {
        if self.permits.waiting.is_empty() {
            return entries;
        }
        let mut tasks = Vec::with_capacity(entries.len());
        for entry in entries {
            let Some(waiter) = self.permits.waiting.remove(&entry) else {
                tasks.push(entry);
                continue;
            };
            let error = error.clone();
            match waiter {
                Waiter::Acquire { answer, .. } => {
                    self.fx_permit(PermitEffect::RefuseAcquire { answer, error });
                }
                Waiter::Grow {
                    answer,
                    parent,
                    kind,
                } => {
                    self.permits.grow_ended(parent, kind);
                    self.fx_permit(PermitEffect::RefuseGrow { answer, error });
                }
            }
        }
        tasks
    }
}
