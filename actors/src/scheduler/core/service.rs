//! The fair share by use (rule 22 of the core, when the limits set `fair_by_use`): each tenant's
//! counter of weighted service, so that within a priority the tenant served least goes
//! first (the Virtual Token Counter of Sheng et al., "Fairness in Serving LLMs").
//!
//! # Algorithm
//!
//! - **Charge ahead, settle at the end.** A start charges its tenant the most the task can
//!   cost, divided by the tenant's weight: its declared units (`reported`), or its units
//!   times its execution timeout (`held`). When the task ends the charge is settled to what
//!   it really cost (the units its executor reported, or units times the milliseconds
//!   held), which is never more: what it did not use is given back. A `held` task without a
//!   timeout has no bound to charge ahead; it is charged in full when it ends.
//! - **No banked credit.** The *floor* is the lowest counter among the *backlogged* tenants
//!   (those with a parked task); while none is, it is where the last of them was, raised to
//!   the counter of each tenant that starts a task meanwhile. A tenant that becomes
//!   backlogged, or arrives with a task while not backlogged, is lifted to the floor, so a
//!   tenant that idled cannot come back and take the pool for as long as it stayed away. A
//!   refund stops at the floor *kept* for such tenants (`floor`, the field), not at the
//!   lowest backlogged counter: a backlogged tenant whose task used less than its charge
//!   ahead is served by what it used, below one that used more, or weights would not hold
//!   (each end would land the ending tenant on the other's counter, and the tie-break would
//!   alternate them).
//! - **Decay.** With a half-life `h`, every counter is multiplied by `2^(-dt/h)` as time
//!   passes. All counters decay by the same factor, so their order never changes and no
//!   tenant needs to be listed again: a counter is stored as `raw`, its value at `now` being
//!   `raw * 2^(-(now - epoch)/h)`, and a charge `c` at `now` adds `c * 2^((now - epoch)/h)`
//!   to `raw`. When that factor passes 2^32 (32 half-lives after the epoch) every counter is
//!   divided by it and the epoch moves to `now` (O(T), once per 32 half-lives); idle
//!   tenants at or under the floor are forgotten then (lifted to the floor, they would come
//!   back where they are). The move is made at a start or an end only, where a decision
//!   follows: after a thousand half-lives without one, every counter falls to zero and the
//!   tenants tie, which can change their order.
//!
//! # Invariants
//!
//! - `backlogged` holds `(raw, tenant)` for exactly the tenants with a parked task, `raw`
//!   being the tenant's counter; every backlogged counter is at least the floor.
//! - Every running task of a tenant has exactly one [`RunCharge`], whose `advance` is in
//!   its tenant's counter until it ends.
//!
//! # The bound
//!
//! Let `U` be the largest weighted advance, `max(charge ahead / weight)` over the tasks, and
//! `S` the tasks that run at once (worker slots). When every backlogged tenant has a parked
//! task that fits whenever a task starts, the counters of any two backlogged tenants differ
//! by at most `S·U` at every step (`U` on one worker). With `m` the lowest backlogged
//! counter:
//!
//! - a start is of the tenant at `m`: its counter becomes at most `m + U`;
//! - a refund never takes a counter below where it was when the task started plus what the
//!   task used, which was the `m` of that moment; meanwhile `m` rose only by the advances of
//!   the tasks that started beside the tenant's (at most `S - 1` at once), so the tenant
//!   ends at most `(S - 1)·U` below the `m` of any later start, and that start's counter at
//!   most `U` above it. On one worker nothing starts while a task runs: within `U`;
//! - a tenant that becomes backlogged is lifted to at least `m`; one that leaves only
//!   removes a counter; decay multiplies every difference by the same factor below 1.
//!
//! So two tenants that stay backlogged are served within `2·S·U` of their weights' shares
//! over any span. The Virtual Token Counter's bound on one worker is `2U`: it charges output
//! tokens as they are made, after the tenant was chosen. Charging the bound ahead and
//! settling down makes one `U`. When the lowest tenant's task does not fit (units, its cap,
//! the reservation), a higher tenant's smaller task may start in its place (skip-ahead), and
//! the gap may grow past the bound until the starvation guard drains the pool for it; a
//! `held` task without a timeout (charged only at its end) may also add its whole cost at
//! once. `tests_vtc.rs` checks the bound and the weights' shares on random workloads.

use std::collections::BTreeSet;

use super::{FastMap, ParkingLot, TenantKey, UnknownTask};
use crate::domain::{FairByUse, PoolError, TaskId, UsageCharge, MAX_WEIGHT};
use crate::queue::RunUse;

/// Past this factor the frame of the raw counters is moved to the present (32 half-lives).
const REBASE_AT: f64 = 4_294_967_296.0;

/// A running task's charge and its tenant's counter at one moment, to put back exactly.
#[derive(Debug, Clone, Copy)]
pub(super) struct ChargeSnapshot {
    id: TaskId,
    tenant: TenantKey,
    raw: f64,
    run: RunCharge,
}

/// What one running task was charged ahead, and what its real cost is so far.
#[derive(Debug, Clone, Copy)]
struct RunCharge {
    tenant: TenantKey,
    /// Its tenant's weight when it started (a later change does not reweigh it).
    weight: u32,
    /// The charge ahead, not weighted.
    advance: f64,
    /// Whether the advance bounds the real cost (`reported`, or `held` with a timeout).
    bounded: bool,
    /// Its execution timeout, ms, for a growth's charge ahead under `held`.
    timeout_ms: Option<u64>,
    /// Units it holds now.
    units: u32,
    /// When it started: its charge ahead was made then.
    started: u64,
    /// Unit-milliseconds held up to `since`.
    held: f64,
    since: u64,
    /// Units its executor reported using, if it reported any.
    reported: Option<u64>,
}

/// Every tenant's counter, the backlogged tenants by counter, and the running tasks' charges.
#[derive(Debug, Clone)]
pub(super) struct ServiceBook {
    order: FairByUse,
    /// Weights other than the default.
    weights: FastMap<TenantKey, u32>,
    /// Raw counters (see the module docs), never negative.
    counters: FastMap<TenantKey, f64>,
    /// The backlogged tenants by raw counter (the bits of a non-negative `f64` order as it
    /// does).
    backlogged: BTreeSet<(u64, TenantKey)>,
    /// The floor when no tenant is backlogged (raw).
    floor: f64,
    /// The instant at which a raw counter is its value.
    epoch: u64,
    running: FastMap<TaskId, RunCharge>,
}

impl ServiceBook {
    pub(super) fn new(order: FairByUse, now: u64) -> Self {
        Self {
            order,
            weights: FastMap::default(),
            counters: FastMap::default(),
            backlogged: BTreeSet::new(),
            floor: 0.0,
            epoch: now,
            running: FastMap::default(),
        }
    }

    /// What a raw counter is multiplied by to read it at `now`, inverted.
    fn scale(&self, now: u64) -> f64 {
        match self.order.half_life_ms {
            None => 1.0,
            Some(half_life) => ((now as f64 - self.epoch as f64) / half_life as f64).exp2(),
        }
    }

    fn raw(&self, tenant: TenantKey) -> f64 {
        self.counters.get(&tenant).copied().unwrap_or(0.0)
    }

    /// The key of `tenant`'s counter in the fair order (its raw counter's bits).
    pub(super) fn bits(&self, tenant: TenantKey) -> u64 {
        self.raw(tenant).to_bits()
    }

    /// `tenant`'s weighted service as of `now`.
    pub(super) fn service(&self, tenant: TenantKey, now: u64) -> f64 {
        self.raw(tenant) / self.scale(now)
    }

    pub(super) fn weight(&self, tenant: TenantKey) -> u32 {
        self.weights
            .get(&tenant)
            .copied()
            .unwrap_or(self.order.default_weight)
    }

    pub(super) fn set_weight(&mut self, tenant: TenantKey, weight: u32) {
        if weight == self.order.default_weight {
            self.weights.remove(&tenant);
        } else {
            self.weights.insert(tenant, weight);
        }
    }

    /// The lowest backlogged counter, or the last one while none is backlogged (raw).
    fn floor(&self) -> f64 {
        self.backlogged.first().map_or(self.floor, |&(bits, _)| {
            f64::from_bits(bits).max(self.floor)
        })
    }

    /// Sets `tenant`'s raw counter, keeping `backlogged` in order.
    fn set(&mut self, tenant: TenantKey, raw: f64) {
        // Never negative (nor -0.0, whose bits would order last).
        let raw = if raw > 0.0 { raw } else { 0.0 };
        let old = self.counters.insert(tenant, raw).unwrap_or(0.0);
        if self.backlogged.remove(&(old.to_bits(), tenant)) {
            self.backlogged.insert((raw.to_bits(), tenant));
        }
    }

    /// `tenant` has a parked task now and had none: it is lifted to the floor.
    pub(super) fn join(&mut self, tenant: TenantKey) {
        let lifted = self.raw(tenant).max(self.floor());
        self.counters.insert(tenant, lifted);
        self.backlogged.insert((lifted.to_bits(), tenant));
    }

    /// `tenant` has no parked task any more.
    pub(super) fn leave(&mut self, tenant: TenantKey) {
        self.floor = self.floor();
        self.backlogged
            .remove(&(self.raw(tenant).to_bits(), tenant));
    }

    /// No tenant has a parked task any more (shutdown).
    pub(super) fn leave_all(&mut self) {
        self.floor = self.floor();
        self.backlogged.clear();
    }

    /// `tenant` arrives with a task: unless it is backlogged already, it is lifted to the
    /// floor. Returns whether its counter changed.
    pub(super) fn arrive(&mut self, tenant: TenantKey) -> bool {
        let (raw, floor) = (self.raw(tenant), self.floor());
        if raw >= floor || self.backlogged.contains(&(raw.to_bits(), tenant)) {
            return false;
        }
        self.set(tenant, floor);
        true
    }

    /// Adds `amount` (weighted, as of `now`) to `tenant`'s counter.
    fn add(&mut self, tenant: TenantKey, amount: f64, now: u64) {
        let raw = self.raw(tenant) + amount * self.scale(now);
        self.set(tenant, raw);
    }

    /// Task `id` of `tenant`, declaring `units`, started at `now`: its charge ahead.
    pub(super) fn start(
        &mut self,
        id: TaskId,
        tenant: TenantKey,
        units: u32,
        timeout_ms: Option<u64>,
        now: u64,
    ) {
        let weight = self.weight(tenant);
        if self.backlogged.is_empty() {
            // Nobody waits: the floor follows the tenants served, so that one joining
            // later starts level with where they were chosen.
            self.floor = self.floor.max(self.raw(tenant));
        }
        let (advance, bounded) = match (self.order.charge, timeout_ms) {
            (UsageCharge::Reported, _) => (f64::from(units), true),
            (UsageCharge::Held, Some(timeout)) => (f64::from(units) * timeout as f64, true),
            (UsageCharge::Held, None) => (0.0, false),
        };
        self.running.insert(
            id,
            RunCharge {
                tenant,
                weight,
                advance,
                bounded,
                timeout_ms,
                units,
                started: now,
                held: 0.0,
                since: now,
                reported: None,
            },
        );
        self.add(tenant, advance / f64::from(weight), now);
    }

    /// Running task `id` reports using `units` more; returns whether it runs.
    pub(super) fn report(&mut self, id: TaskId, units: u64) -> bool {
        let Some(run) = self.running.get_mut(&id) else {
            return false;
        };
        run.reported = Some(run.reported.unwrap_or(0).saturating_add(units));
        true
    }

    /// Running task `id` holds `units` more from `now` on (a permit grew): its declared
    /// cost grows, charged ahead like its start.
    pub(super) fn grow(&mut self, id: TaskId, units: u32, now: u64) {
        let Some(run) = self.running.get_mut(&id) else {
            return;
        };
        run.held += f64::from(run.units) * now.saturating_sub(run.since) as f64;
        run.since = now;
        run.units += units;
        let more = match (self.order.charge, run.timeout_ms) {
            (UsageCharge::Reported, _) => f64::from(units),
            (UsageCharge::Held, Some(timeout)) => f64::from(units) * timeout as f64,
            (UsageCharge::Held, None) => 0.0,
        };
        run.advance += more;
        let (tenant, weight) = (run.tenant, run.weight);
        self.add(tenant, more / f64::from(weight), now);
    }

    /// Running task `id` gives back `units` from `now` on: it holds fewer from then on.
    pub(super) fn shrink(&mut self, id: TaskId, units: u32, now: u64) {
        if let Some(run) = self.running.get_mut(&id) {
            run.held += f64::from(run.units) * now.saturating_sub(run.since) as f64;
            run.since = now;
            run.units = run.units.saturating_sub(units);
        }
    }

    /// What running task `id` used up to `now`: unit-milliseconds held, units reported, and
    /// when it started.
    pub(super) fn used(&self, id: TaskId, now: u64) -> Option<(f64, Option<u64>, u64)> {
        let run = self.running.get(&id)?;
        let held = run.held + f64::from(run.units) * now.saturating_sub(run.since) as f64;
        Some((held, run.reported, run.started))
    }

    /// Running task `id`'s charge and its tenant's counter as they are now.
    pub(super) fn snapshot(&self, id: TaskId) -> Option<ChargeSnapshot> {
        let run = *self.running.get(&id)?;
        Some(ChargeSnapshot {
            id,
            tenant: run.tenant,
            raw: self.raw(run.tenant),
            run,
        })
    }

    /// Puts a charge and its tenant's counter back as `snapshot` saw them (a growth that was
    /// undone); returns the tenant.
    pub(super) fn restore(&mut self, snapshot: ChargeSnapshot) -> TenantKey {
        self.running.insert(snapshot.id, snapshot.run);
        self.set(snapshot.tenant, snapshot.raw);
        snapshot.tenant
    }

    /// Running task `child` became part of running task `parent` at `now` (a permit
    /// absorbed it): its charge ahead and its time held so far go on as the parent's, to be
    /// settled with it. Nothing is charged or refunded now.
    pub(super) fn absorb(&mut self, child: TaskId, parent: TaskId, now: u64) {
        let Some(taken) = self.running.remove(&child) else {
            return;
        };
        let Some(run) = self.running.get_mut(&parent) else {
            return;
        };
        let child_held =
            taken.held + f64::from(taken.units) * now.saturating_sub(taken.since) as f64;
        run.held += f64::from(run.units) * now.saturating_sub(run.since) as f64 + child_held;
        run.since = now;
        run.units += taken.units;
        run.advance += taken.advance;
        run.bounded &= taken.bounded;
        if let Some(used) = taken.reported {
            run.reported = Some(run.reported.unwrap_or(0).saturating_add(used));
        }
    }

    /// Running task `id` ended at `now`: its charge is settled to its real cost (never
    /// above the charge ahead when that bounds it). Returns its tenant.
    pub(super) fn end(&mut self, id: TaskId, now: u64) -> Option<TenantKey> {
        let run = self.running.remove(&id)?;
        let cost = match self.order.charge {
            UsageCharge::Reported => run
                .reported
                .map_or(run.advance, |used| (used as f64).min(run.advance)),
            UsageCharge::Held => {
                let held = run.held + f64::from(run.units) * now.saturating_sub(run.since) as f64;
                if run.bounded {
                    held.min(run.advance)
                } else {
                    held
                }
            }
        };
        let change = (cost - run.advance) / f64::from(run.weight);
        if change >= 0.0 {
            self.add(run.tenant, change, now);
            return Some(run.tenant);
        }
        let raw = self.raw(run.tenant);
        // The refund takes back part of the charge made at the start, decayed as it has
        // decayed since.
        let refunded = raw + change * self.scale(run.started);
        // A refund stops at the floor kept for tenants that come back (`self.floor`), not at
        // the lowest waiting counter: a waiting tenant whose task used less than its charge
        // ahead is served by what it used, below a tenant that used more, or weights would
        // not hold (every end would land both on the same counter).
        self.set(run.tenant, refunded.max(raw.min(self.floor)));
        Some(run.tenant)
    }

    /// Whether the frame is to move at `now` (its factor passed [`REBASE_AT`]).
    pub(super) fn rebase_due(&self, now: u64) -> bool {
        self.scale(now) > REBASE_AT
    }

    /// Moves the frame to `now` when its factor passed [`REBASE_AT`]; returns whether it
    /// did (every tenant's key changed then). The move can reorder tenants: counters that
    /// decayed for about a thousand half-lives all fall to zero and tie, so a move happens
    /// only where a decision follows (a start, an end).
    pub(super) fn rebase_if_due(&mut self, now: u64) -> bool {
        if !self.rebase_due(now) {
            return false;
        }
        let scale = self.scale(now);
        let floor = self.floor() / scale;
        let charged: BTreeSet<TenantKey> = self.running.values().map(|run| run.tenant).collect();
        let backlogged: BTreeSet<TenantKey> =
            self.backlogged.iter().map(|&(_, tenant)| tenant).collect();
        self.counters.retain(|tenant, raw| {
            *raw /= scale;
            *raw > floor || charged.contains(tenant) || backlogged.contains(tenant)
        });
        self.floor = floor;
        self.epoch = now;
        self.backlogged = backlogged
            .into_iter()
            .map(|tenant| (self.raw(tenant).to_bits(), tenant))
            .collect();
        true
    }

    /// Checks the invariants against the tenants with a parked task and the running
    /// tasks' tenants.
    pub(super) fn check(
        &self,
        with_parked: &BTreeSet<TenantKey>,
        running: &FastMap<TaskId, TenantKey>,
    ) -> Result<(), String> {
        let listed: BTreeSet<TenantKey> =
            self.backlogged.iter().map(|&(_, tenant)| tenant).collect();
        if &listed != with_parked {
            return Err(format!(
                "backlogged {listed:?}, tenants with parked tasks {with_parked:?}"
            ));
        }
        let floor = self.floor();
        for &(bits, tenant) in &self.backlogged {
            if bits != self.bits(tenant) || f64::from_bits(bits) < floor {
                return Err(format!("tenant {tenant}'s counter is listed wrongly"));
            }
        }
        if self.running.len() != running.len()
            || running
                .iter()
                .any(|(id, tenant)| self.running.get(id).map(|run| run.tenant) != Some(*tenant))
        {
            return Err("the running tasks' charges do not match the running tasks".into());
        }
        Ok(())
    }
}

/// The fair share by use, as the driver and a bench see it.
impl ParkingLot {
    /// `tenant`'s weighted service: what its tasks were charged, each divided by its
    /// tenant's weight, decayed to the lot's clock (the time of the latest event). A running
    /// task counts with its charge ahead until it ends. `None` when the lot does not order
    /// tenants by use.
    ///
    /// ```
    /// use prometheus_parking_lot_actors::domain::{FairByUse, PoolLimits, Priority, ResourceCost, UsageCharge};
    /// use prometheus_parking_lot_actors::scheduler::core::{ParkingLot, Ticket};
    ///
    /// let order = FairByUse::new(UsageCharge::Reported).with_half_life_ms(1_000);
    /// let mut lot = ParkingLot::new(PoolLimits::new(10, 2).with_fair_by_use(Some(order))).unwrap();
    /// lot.set_tenant_weight(7, 2).unwrap();
    /// let ticket = Ticket {
    ///     id: 1,
    ///     priority: Priority::Normal,
    ///     cost: ResourceCost::gpu_vram(8),
    ///     created_at_ms: 0,
    ///     deadline_ms: None,
    ///     tenant: 7,
    ///     timeout_ms: None,
    ///     also: Default::default(),
    /// };
    /// lot.admit(ticket, 0);
    /// assert_eq!(lot.tenant_service(7), Some(4.0)); // 8 units at weight 2
    /// lot.report_used(1, 6).unwrap(); // its reply used 6 of the 8
    /// lot.complete(1, 1_000).unwrap(); // one half-life later
    /// assert_eq!(lot.tenant_service(7), Some(1.5)); // 6 / 2, halved
    /// ```
    pub fn tenant_service(&self, tenant: TenantKey) -> Option<f64> {
        self.tenants.as_ref()?.service(tenant, self.clock)
    }

    /// `tenant`'s weight, or `None` when the lot does not order tenants by use.
    pub fn tenant_weight(&self, tenant: TenantKey) -> Option<u32> {
        self.tenants.as_ref()?.weight(tenant)
    }

    /// Gives `tenant` weight `weight` (1 to [`MAX_WEIGHT`]) for the tasks it starts from
    /// now on: while it waits beside others, it is served `weight` times what a tenant of
    /// weight 1 is. The driver names the weights of the tenants its settings name; the
    /// others have the order's `default_weight`. `InvalidConfig` for a weight out of range
    /// or a lot that does not order tenants by use.
    pub fn set_tenant_weight(&mut self, tenant: TenantKey, weight: u32) -> Result<(), PoolError> {
        if !(1..=MAX_WEIGHT).contains(&weight) {
            return Err(PoolError::InvalidConfig(format!(
                "the weight of tenant {tenant} is {weight}; use a whole number from 1 to \
                 {MAX_WEIGHT}"
            )));
        }
        let set = self
            .tenants
            .as_mut()
            .is_some_and(|book| book.set_weight(tenant, weight));
        if !set {
            return Err(PoolError::InvalidConfig(
                "tenant weights need a fair share by use (fair_share.by_use)".into(),
            ));
        }
        Ok(())
    }

    /// What running task `id` has used up to `now` under the fair share by use: its declared
    /// units, the unit-milliseconds it held, the units it reported, when it started. `None`
    /// for a task that does not run or a lot that does not order tenants by use. A node
    /// hands it to its shared queue as the run ends, to settle the fleet's counters
    /// ([`SharedFairShare::settle_use`](crate::queue::SharedFairShare::settle_use)).
    pub fn run_use(&self, id: TaskId, now: u64) -> Option<RunUse> {
        let units = self.running.get(&id)?.units;
        let (held_unit_ms, reported, started_ms) = self.tenants.as_ref()?.run_used(id, now)?;
        Some(RunUse {
            units,
            held_unit_ms,
            reported,
            started_ms,
        })
    }

    /// Running task `id` reports using `units` more of its cost (the tokens its reply
    /// really made); reports add up. Under a fair share by use that charges what is
    /// reported, its tenant is charged the sum, at most its declared cost, when it ends
    /// (until then, its declared cost). Otherwise nothing changes. `NotRunning` for a task
    /// that does not run.
    pub fn report_used(&mut self, id: TaskId, units: u64) -> Result<(), UnknownTask> {
        if !self.running.contains_key(&id) {
            return Err(UnknownTask::NotRunning(id));
        }
        if let Some(book) = &mut self.tenants {
            book.report(id, units);
        }
        Ok(())
    }
}
