//! The fair share's bookkeeping (rule 12 of the core): what each tenant holds now and which
//! of its tasks are parked, so that a decision can ask every tenant for its best task within
//! its own room under the cap and order the answers by how much each tenant uses. Under a
//! fair share by use, the order is first by each tenant's weighted service counter, which
//! `service.rs` keeps.
//!
//! # Shape
//!
//! One [`Tenant`] per tenant that has a task parked or running (a tenant with neither is
//! dropped, so the map follows the tenants active now). Each holds, per kind, a
//! [`CostIndex`] of its parked tasks, the units and worker slots its running tasks hold,
//! when it last started a task (the pool's start counter), and its starving tasks. Per
//! kind, `heads` lists the tenants with parked tasks by the fair key of their best parked
//! task: no task of the tenant can rank better than that, so a decision visits tenants in
//! that order and stops at the first whose bound cannot beat the best task found.
//!
//! # Invariants
//!
//! - `used[kind] <= cap[kind]` for every tenant (the core checks the cap before a start).
//! - `parked[kind]` holds exactly the tenant's parked tasks of that kind, also indexed in
//!   the core's global indexes; `starving` holds exactly its parked tasks the core counts
//!   as starving.
//! - `heads[kind]` holds `(key, tenant)` exactly for the tenants with parked tasks of that
//!   kind, `key` being the fair key of the tenant's best one now (`Tenant::listed`).
//!
//! # Cost
//!
//! A decision visits the tenants in the order of their bound and walks each one's
//! [`CostIndex`] (32 steps) until the next bound cannot beat the best task found. The caller
//! passes the priority of the best task that fits the free units (its global index knows it):
//! nothing that fits is more urgent, so a tenant whose bound is more urgent counts at that
//! priority, and once one such tenant cannot win, the rest of its head-priority group (using
//! as much or more) is skipped. With T tenants holding parked tasks of a kind that is
//! O(32·T) at worst, typically a few tenants. Parking or removing a task, or a start or
//! an end, costs O(log n) as without a fair share, plus O(log T) to keep `heads` in order.
//! The reservation is the best of each starving tenant's best starving task: O(S) for the
//! S tenants with a starving task (`with_starving`), nothing when none starves.

use std::collections::BTreeSet;

use super::rank::{FairKey, RankKey};
use super::service::{ChargeSnapshot, ServiceBook};
use super::{CostIndex, FastMap, TenantKey, KINDS};
use crate::domain::{FairByUse, PoolLimits, Priority, ResourceKind, TaskId};

/// The book of a lot with `limits`, if it keeps one: a fair share caps each tenant at its
/// share; a fair share by use alone orders the tenants under each kind's whole capacity.
pub(super) fn book_for(limits: &PoolLimits) -> Option<TenantBook> {
    if limits.fair_share.is_none() && limits.fair_by_use.is_none() {
        return None;
    }
    let cap = ResourceKind::ALL.map(|kind| {
        let capacity = limits.capacity.get(kind);
        limits
            .fair_share
            .map_or(capacity, |share| share.cap(capacity))
    });
    let book = TenantBook::new(cap);
    Some(match limits.fair_by_use {
        Some(order) => book.by_use(order, 0),
        None => book,
    })
}

/// One tenant's share of the pool.
#[derive(Debug, Clone, Default)]
pub(super) struct Tenant {
    /// Units its running tasks hold, per kind.
    used: [u32; KINDS],
    /// Worker slots its running tasks hold.
    running: u32,
    /// The pool's start counter when it last started a task (0: never).
    last_start: u64,
    /// Its parked tasks, per kind.
    parked: [CostIndex; KINDS],
    /// Its parked tasks the core counts as starving.
    starving: BTreeSet<RankKey>,
    /// The key it is listed under in `heads`, per kind.
    listed: [Option<FairKey>; KINDS],
    /// Its service counter's key under a fair share by use (0 otherwise), as the
    /// [`ServiceBook`] has it.
    service: u64,
}

impl Tenant {
    fn is_idle(&self) -> bool {
        self.running == 0 && !self.has_parked()
    }

    fn has_parked(&self) -> bool {
        !self.parked.iter().all(CostIndex::is_empty)
    }

    /// The key `rank`, a task of this tenant of `kind`, has under the fair order now.
    fn key(&self, kind: usize, rank: RankKey) -> FairKey {
        FairKey::new(
            rank,
            self.service,
            self.used[kind],
            self.running,
            self.last_start,
        )
    }

    /// Whether a starving task of this tenant ranks ahead of `rank` (its tenant drains for
    /// it, whatever the rest of the pool does).
    fn starving_ahead_of(&self, rank: &RankKey) -> bool {
        self.starving
            .first()
            .is_some_and(|starving| starving.ranks_ahead_of(rank))
    }
}

/// Every active tenant's share, and the cap per kind.
#[derive(Debug, Clone)]
pub(super) struct TenantBook {
    cap: [u32; KINDS],
    tenants: FastMap<TenantKey, Tenant>,
    /// Per kind, the tenants with parked tasks by the fair key of their best one.
    heads: [BTreeSet<(FairKey, TenantKey)>; KINDS],
    /// The tenants with a starving task.
    with_starving: BTreeSet<TenantKey>,
    /// The tenant of each parked task (kept here, not in the core's per-task data, so a
    /// pool without a fair share pays no memory for it).
    tenant_of: FastMap<TaskId, TenantKey>,
    /// The service counters, under a fair share by use.
    service: Option<Box<ServiceBook>>,
}

impl TenantBook {
    /// An empty book enforcing `cap` units per tenant and kind.
    pub(super) fn new(cap: [u32; KINDS]) -> Self {
        Self {
            cap,
            tenants: FastMap::default(),
            heads: Default::default(),
            with_starving: BTreeSet::new(),
            tenant_of: FastMap::default(),
            service: None,
        }
    }

    /// The same book ordering tenants by their weighted service (see `service.rs`), its
    /// counters' clock starting at `now`.
    pub(super) fn by_use(mut self, order: FairByUse, now: u64) -> Self {
        self.service = Some(Box::new(ServiceBook::new(order, now)));
        self
    }

    /// `tenant`'s entry, made with its counter's key if it has none.
    fn entry(&mut self, tenant: TenantKey) -> &mut Tenant {
        let service = self.service.as_ref().map_or(0, |book| book.bits(tenant));
        self.tenants.entry(tenant).or_insert_with(|| Tenant {
            service,
            ..Tenant::default()
        })
    }

    /// Lists `tenant` again after its counter changed.
    fn refresh(&mut self, tenant: TenantKey) {
        let Some(book) = &self.service else {
            return;
        };
        if let Some(t) = self.tenants.get_mut(&tenant) {
            t.service = book.bits(tenant);
        }
        self.relist(tenant);
    }

    /// Moves the counters' frame to `now` if it is due, listing every tenant again then.
    fn rebase_if_due(&mut self, now: u64) {
        if !self
            .service
            .as_mut()
            .is_some_and(|book| book.rebase_if_due(now))
        {
            return;
        }
        let tenants: Vec<TenantKey> = self.tenants.keys().copied().collect();
        for tenant in tenants {
            self.refresh(tenant);
        }
    }

    /// `tenant`'s weighted service as of `now`, under a fair share by use.
    pub(super) fn service(&self, tenant: TenantKey, now: u64) -> Option<f64> {
        self.service.as_ref().map(|book| book.service(tenant, now))
    }

    /// `tenant`'s weight under a fair share by use.
    pub(super) fn weight(&self, tenant: TenantKey) -> Option<u32> {
        self.service.as_ref().map(|book| book.weight(tenant))
    }

    /// Sets `tenant`'s weight for the tasks it starts from now on; returns whether the book
    /// orders by use.
    pub(super) fn set_weight(&mut self, tenant: TenantKey, weight: u32) -> bool {
        self.service
            .as_mut()
            .map(|book| book.set_weight(tenant, weight))
            .is_some()
    }

    /// `tenant` arrives with a task (rule 12, by use): not backlogged, it is lifted to the
    /// floor, so idling banks no credit.
    pub(super) fn arrive(&mut self, tenant: TenantKey) {
        if self
            .service
            .as_mut()
            .is_some_and(|book| book.arrive(tenant))
        {
            self.refresh(tenant);
        }
    }

    /// Task `id` of `tenant`, declaring `units` and running at most `timeout_ms`, started
    /// at `now`: it is charged ahead.
    pub(super) fn charge(
        &mut self,
        id: TaskId,
        tenant: TenantKey,
        units: u32,
        timeout_ms: Option<u64>,
        now: u64,
    ) {
        if self.service.is_none() {
            return;
        }
        self.rebase_if_due(now);
        if let Some(book) = &mut self.service {
            book.start(id, tenant, units, timeout_ms, now);
        }
        self.refresh(tenant);
    }

    /// Running task `id` reports using `units` more; returns whether the book charges it.
    /// What running task `id` used up to `now` (see [`ServiceBook::used`]), under a fair
    /// share by use.
    pub(super) fn run_used(&self, id: TaskId, now: u64) -> Option<(f64, Option<u64>, u64)> {
        self.service.as_ref()?.used(id, now)
    }

    pub(super) fn report(&mut self, id: TaskId, units: u64) -> bool {
        self.service
            .as_mut()
            .is_some_and(|book| book.report(id, units))
    }

    /// Running task `id` ended at `now`: its charge is settled.
    pub(super) fn settle(&mut self, id: TaskId, now: u64) {
        if self.service.is_none() {
            return;
        }
        self.rebase_if_due(now);
        if let Some(tenant) = self.service.as_mut().and_then(|book| book.end(id, now)) {
            self.refresh(tenant);
        }
    }

    /// Whether the counters' frame is to move at `now`: a move may reorder tenants, so an
    /// event that makes no decision after it (a growth at once) must not make it.
    pub(super) fn frame_due(&self, now: u64) -> bool {
        self.service
            .as_ref()
            .is_some_and(|book| book.rebase_due(now))
    }

    /// Running task `id`'s charge and its tenant's counter, to put back with
    /// [`restore_charge`](Self::restore_charge) within the same event, in which the frame
    /// does not move (see [`frame_due`](Self::frame_due)).
    pub(super) fn snapshot_charge(&self, id: TaskId) -> Option<ChargeSnapshot> {
        self.service.as_ref()?.snapshot(id)
    }

    /// Puts back what [`snapshot_charge`](Self::snapshot_charge) saw.
    pub(super) fn restore_charge(&mut self, snapshot: ChargeSnapshot) {
        if let Some(book) = &mut self.service {
            let tenant = book.restore(snapshot);
            self.refresh(tenant);
        }
    }

    /// Running task `child` became part of running task `parent` at `now`: its charge goes
    /// on as the parent's.
    pub(super) fn absorb_charge(&mut self, child: TaskId, parent: TaskId, now: u64) {
        if let Some(book) = &mut self.service {
            book.absorb(child, parent, now);
        }
    }

    /// Running task `id` of `tenant` holds `units` more from `now` on (a permit grew; the
    /// frame is not due, see [`frame_due`](Self::frame_due)).
    pub(super) fn charge_growth(&mut self, id: TaskId, tenant: TenantKey, units: u32, now: u64) {
        let Some(book) = &mut self.service else {
            return;
        };
        debug_assert!(!book.rebase_due(now), "a growth never moves the frame");
        book.grow(id, units, now);
        self.refresh(tenant);
    }

    /// Running task `id` holds `units` fewer from `now` on.
    pub(super) fn note_shrink(&mut self, id: TaskId, units: u32, now: u64) {
        if let Some(book) = &mut self.service {
            book.shrink(id, units, now);
        }
    }

    /// The most units of `kind` one tenant may hold.
    pub(super) fn cap(&self, kind: ResourceKind) -> u32 {
        self.cap[kind.index()]
    }

    /// Units of `kind` that `tenant` may still take under the cap.
    pub(super) fn room(&self, tenant: TenantKey, kind: ResourceKind) -> u32 {
        let used = self
            .tenants
            .get(&tenant)
            .map_or(0, |t| t.used[kind.index()]);
        self.cap[kind.index()].saturating_sub(used)
    }

    /// Units of `kind` that `tenant`'s running tasks hold.
    pub(super) fn used(&self, tenant: TenantKey, kind: ResourceKind) -> u32 {
        self.tenants
            .get(&tenant)
            .map_or(0, |t| t.used[kind.index()])
    }

    /// The key of `rank`, a task of `tenant` of `kind`, under the fair order now.
    pub(super) fn key(&self, tenant: TenantKey, kind: ResourceKind, rank: RankKey) -> FairKey {
        match self.tenants.get(&tenant) {
            Some(t) => t.key(kind.index(), rank),
            None => {
                let service = self.service.as_ref().map_or(0, |book| book.bits(tenant));
                FairKey::new(rank, service, 0, 0, 0)
            }
        }
    }

    /// Whether a starving task of `tenant` ranks ahead of `rank`.
    pub(super) fn starving_ahead_of(&self, tenant: TenantKey, rank: &RankKey) -> bool {
        self.tenants
            .get(&tenant)
            .is_some_and(|t| t.starving_ahead_of(rank))
    }

    pub(super) fn park(
        &mut self,
        tenant: TenantKey,
        kind: ResourceKind,
        units: u32,
        rank: RankKey,
    ) {
        let t = self.entry(tenant);
        let joins = !t.has_parked();
        t.parked[kind.index()].insert(units, rank);
        self.tenant_of.insert(rank.id(), tenant);
        if let (true, Some(book)) = (joins, &mut self.service) {
            book.join(tenant);
            self.refresh(tenant);
            return;
        }
        self.relist(tenant);
    }

    /// The tenant of parked task `id` (0 for a task the book does not hold).
    pub(super) fn tenant_of(&self, id: TaskId) -> TenantKey {
        self.tenant_of.get(&id).copied().unwrap_or(0)
    }

    /// Lists `tenant` in `heads` under its current keys (after its usage or its parked
    /// tasks changed).
    fn relist(&mut self, tenant: TenantKey) {
        let Some(t) = self.tenants.get_mut(&tenant) else {
            return;
        };
        for kind in 0..KINDS {
            let key = t.parked[kind].best().map(|head| t.key(kind, head));
            if key == t.listed[kind] {
                continue;
            }
            if let Some(old) = t.listed[kind] {
                self.heads[kind].remove(&(old, tenant));
            }
            if let Some(new) = key {
                self.heads[kind].insert((new, tenant));
            }
            t.listed[kind] = key;
        }
    }

    /// Removes a parked task from its tenant's indexes; returns its tenant.
    pub(super) fn unpark(&mut self, kind: ResourceKind, units: u32, rank: RankKey) -> TenantKey {
        let tenant = self.tenant_of.remove(&rank.id()).unwrap_or(0);
        let Some(t) = self.tenants.get_mut(&tenant) else {
            return tenant;
        };
        t.parked[kind.index()].remove(units, rank);
        let leaves = !t.has_parked();
        if t.starving.remove(&rank) && t.starving.is_empty() {
            self.with_starving.remove(&tenant);
        }
        if let (true, Some(book)) = (leaves, &mut self.service) {
            book.leave(tenant);
        }
        self.relist(tenant);
        self.forget_if_idle(tenant);
        tenant
    }

    /// Parked task `rank` is starving.
    pub(super) fn mark_starving(&mut self, rank: RankKey) {
        let tenant = self.tenant_of(rank.id());
        if let Some(t) = self.tenants.get_mut(&tenant) {
            t.starving.insert(rank);
            self.with_starving.insert(tenant);
        }
    }

    /// `tenant` started a task holding `units` of `kind`, the pool's `start`th start.
    pub(super) fn start(&mut self, tenant: TenantKey, kind: ResourceKind, units: u32, start: u64) {
        let t = self.entry(tenant);
        t.used[kind.index()] += units;
        t.running += 1;
        t.last_start = start;
        self.relist(tenant);
    }

    /// A task of `tenant` holding `units` of `kind` released them.
    pub(super) fn release(&mut self, tenant: TenantKey, kind: ResourceKind, units: u32) {
        let Some(t) = self.tenants.get_mut(&tenant) else {
            return;
        };
        t.used[kind.index()] = t.used[kind.index()].saturating_sub(units);
        t.running = t.running.saturating_sub(1);
        self.relist(tenant);
        self.forget_if_idle(tenant);
    }

    /// A running task of `tenant` took `units` more of `kind` (a permit grew, rule 14 of
    /// the core).
    pub(super) fn grow(&mut self, tenant: TenantKey, kind: ResourceKind, units: u32) {
        let t = self.entry(tenant);
        t.used[kind.index()] += units;
        self.relist(tenant);
    }

    /// A running task of `tenant` gave back `units` of `kind` and goes on running.
    pub(super) fn shrink(&mut self, tenant: TenantKey, kind: ResourceKind, units: u32) {
        let Some(t) = self.tenants.get_mut(&tenant) else {
            return;
        };
        t.used[kind.index()] = t.used[kind.index()].saturating_sub(units);
        self.relist(tenant);
    }

    /// Two running tasks of `tenant` became one (a permit absorbed a child): its units are
    /// unchanged, it runs one task fewer.
    pub(super) fn merge(&mut self, tenant: TenantKey) {
        let Some(t) = self.tenants.get_mut(&tenant) else {
            return;
        };
        t.running = t.running.saturating_sub(1);
        self.relist(tenant);
    }

    fn forget_if_idle(&mut self, tenant: TenantKey) {
        if self.tenants.get(&tenant).is_some_and(Tenant::is_idle) {
            self.tenants.remove(&tenant);
        }
    }

    /// Forgets every parked task (shutdown), keeping what running tasks hold.
    pub(super) fn clear_parked(&mut self) {
        for t in self.tenants.values_mut() {
            t.parked = Default::default();
            t.starving.clear();
            t.listed = [None; KINDS];
        }
        self.heads = Default::default();
        self.with_starving.clear();
        self.tenant_of.clear();
        self.tenants.retain(|_, t| !t.is_idle());
        if let Some(book) = &mut self.service {
            book.leave_all();
        }
    }

    /// The best task under the fair order that fits `free` and its tenant's room, skipping
    /// tasks ranked below a starving task of their own tenant. No task that fits `free` has
    /// a priority above `ceiling` (the caller knows from its global index), so a tenant whose
    /// best parked task is more urgent than that can offer at most `ceiling`.
    pub(super) fn best_fit(&self, free: &[u32; KINDS], ceiling: Priority) -> Option<FairKey> {
        let mut best: Option<FairKey> = None;
        for (kind, heads) in self.heads.iter().enumerate() {
            let mut listed = heads.range(..);
            while let Some(&(bound, tenant)) = listed.next() {
                // No task of this tenant (or of any tenant after it) can rank better.
                if best.is_some_and(|best| best <= bound) {
                    break;
                }
                if best.is_some_and(|best| best <= bound.at_most(ceiling)) {
                    // The tenants after it with the same head priority use as much or more:
                    // none of them can beat `best` either. Go on with the next priority.
                    let Some(next) = bound.next_priority_start() else {
                        break;
                    };
                    listed = heads.range((next, 0)..);
                    continue;
                }
                let Some(t) = self.tenants.get(&tenant) else {
                    continue;
                };
                let index = &t.parked[kind];
                let within = free[kind].min(self.cap[kind].saturating_sub(t.used[kind]));
                let Some(candidate) = index.best_within(within) else {
                    continue;
                };
                if t.starving_ahead_of(&candidate) {
                    continue;
                }
                let key = t.key(kind, candidate);
                if best.is_none_or(|best| key < best) {
                    best = Some(key);
                }
            }
        }
        best
    }

    /// The reservation under a fair share: the best, under the fair order, of each tenant's
    /// best starving task whose tenant has room for it under the cap. A tenant without room
    /// drains its own tasks first (see [`starving_ahead_of`](Self::starving_ahead_of)), so it
    /// reserves nothing for the rest of the pool yet. `cost_of` names a parked task's kind and
    /// units.
    pub(super) fn reservation(
        &self,
        cost_of: impl Fn(RankKey) -> Option<(ResourceKind, u32)>,
    ) -> Option<FairKey> {
        self.with_starving
            .iter()
            .filter_map(|tenant| {
                let t = self.tenants.get(tenant)?;
                let starving = *t.starving.first()?;
                let (kind, units) = cost_of(starving)?;
                let room = self.cap[kind.index()].saturating_sub(t.used[kind.index()]);
                (units <= room).then(|| t.key(kind.index(), starving))
            })
            .min()
    }

    /// Checks the book against the running tasks the core holds: `(tenant, kind, units)`.
    pub(super) fn check(
        &self,
        running: impl Iterator<Item = (TaskId, TenantKey, ResourceKind, u32)>,
        parked_len: usize,
    ) -> Result<(), String> {
        let mut held: FastMap<TenantKey, ([u64; KINDS], u32)> = FastMap::default();
        let mut charged: FastMap<TaskId, TenantKey> = FastMap::default();
        for (id, tenant, kind, units) in running {
            charged.insert(id, tenant);
            let entry = held.entry(tenant).or_default();
            entry.0[kind.index()] += u64::from(units);
            entry.1 += 1;
        }
        let mut indexed = 0;
        for (tenant, t) in &self.tenants {
            let (units, running) = held.remove(tenant).unwrap_or_default();
            for kind in ResourceKind::ALL {
                let used = t.used[kind.index()];
                if u64::from(used) != units[kind.index()] || used > self.cap[kind.index()] {
                    return Err(format!(
                        "tenant {tenant}: {kind:?} used {used}, held {}, cap {}",
                        units[kind.index()],
                        self.cap[kind.index()]
                    ));
                }
            }
            if t.running != running {
                return Err(format!(
                    "tenant {tenant}: {} running vs {running}",
                    t.running
                ));
            }
            if t.is_idle() {
                return Err(format!("idle tenant {tenant} is kept"));
            }
            let service = self.service.as_ref().map_or(0, |book| book.bits(*tenant));
            if t.service != service {
                return Err(format!("tenant {tenant} keeps a stale service counter"));
            }
            indexed += t.parked.iter().map(CostIndex::len).sum::<usize>();
            for kind in 0..KINDS {
                let key = t.parked[kind].best().map(|head| t.key(kind, head));
                let listed = key.is_some_and(|key| self.heads[kind].contains(&(key, *tenant)));
                if key != t.listed[kind] || (key.is_some() && !listed) {
                    return Err(format!("tenant {tenant} is listed under a stale key"));
                }
            }
        }
        let listed: usize = self.heads.iter().map(BTreeSet::len).sum();
        let with_parked: usize = self
            .tenants
            .values()
            .map(|t| t.listed.iter().flatten().count())
            .sum();
        if listed != with_parked {
            return Err(format!(
                "{listed} tenant heads listed vs {with_parked} expected"
            ));
        }
        let starving: BTreeSet<TenantKey> = self
            .tenants
            .iter()
            .filter(|(_, t)| !t.starving.is_empty())
            .map(|(&tenant, _)| tenant)
            .collect();
        if starving != self.with_starving {
            return Err("the tenants with starving tasks are listed wrongly".into());
        }
        if let Some(tenant) = held.keys().next() {
            return Err(format!("tenant {tenant} runs tasks the book does not know"));
        }
        if let Some(book) = &self.service {
            let with_parked = self
                .tenants
                .iter()
                .filter(|(_, t)| t.has_parked())
                .map(|(&tenant, _)| tenant)
                .collect();
            book.check(&with_parked, &charged)?;
        }
        if indexed != parked_len || self.tenant_of.len() != parked_len {
            return Err(format!(
                "{indexed} tasks in tenant indexes vs {parked_len} parked"
            ));
        }
        Ok(())
    }
}
