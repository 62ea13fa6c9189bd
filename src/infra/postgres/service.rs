//! The fair share by use across a fleet (core rule 22 across processes): the weighted service
//! counters of a shared queue's tenants, one row per queue and tenant in [`SERVICE_TABLE`],
//! read and charged in each claim's transaction, so that every node claims for the tenant the
//! whole fleet served least.
//!
//! A claim of a queue whose nodes order tenants by use takes its tasks one at a time, in one
//! transaction:
//!
//! 1. an advisory lock on the queue's key: the queue's claims take turns, so no two nodes
//!    pick from the same counters at once;
//! 2. the *pick*: among the tenants with a parked task that fits the node's free units, those
//!    whose best such task has the highest priority, and of them the one with the lowest
//!    counter (decayed with the half-life to the database's clock, lifted to the floor), the
//!    tenant name breaking ties;
//! 3. the layout's claim statement, restricted to that tenant, for one task;
//! 4. the charge ahead, as a node's core charges a start: the task's declared units
//!    (`reported`), or its units times the node's execution timeout (`held`; nothing ahead
//!    without one), divided by its tenant's weight, added to its counter (lifted to the
//!    floor first) at the database's clock, and to its `pending` charges ahead; the floor is
//!    kept as the lowest *settled* counter among the tenants the pick saw (each counter less
//!    the charges ahead of its runs not yet settled; a tenant without a row counts as the
//!    floor), never lower than it was.
//!
//! Then again, with the free units less what was taken, until `max` tasks or nothing fits.
//! The transaction commits: the claims and their charges are one.
//!
//! **Settling.** When a claimed task's run ends, the node that ran it settles the charge to
//! what the run used ([`FleetService::settle`], one `UPDATE` of the tenant's row): the units
//! its executor reported (`running::report_used`, at most the declared units) or the
//! unit-milliseconds it held (at most the charge ahead). What it did not use is given back
//! as the charge decayed since the run started, and the charge leaves `pending`. A refund
//! never takes the counter below the floor (nor raises it); a `held` task charged nothing
//! ahead is charged its cost now. The floor follows settled counters, not charged ones: a
//! settled counter only rises, so a waiting tenant's refund never falls below it, and a
//! tenant served by what it used stays below one that used more while both wait (following
//! the lowest *charged* counter instead, as before, lifted every refund onto another
//! tenant's counter and weights failed under `held` with a timeout). A node that dies
//! mid-run leaves its charge pending, so that tenant's settled counter stays low by it; the
//! floor, which never falls, is not pulled down by it. So the bound of `PARKING_LOT.md`
//! ("Fair share by use") holds for the fleet's counters as for one core's: while every
//! waiting tenant has a task that fits the claiming node, two waiting tenants' counters
//! differ by at most one largest weighted charge ahead per claim in flight.

use std::sync::Arc;

use sea_orm::{ConnectionTrait, DatabaseTransaction, DbErr, QueryResult, Value};

use super::claim::ClaimParams;
use super::codec::{column, DATABASE_NOW_MS};
use super::named::Params;
use crate::core::{FairByUse, FitQuery, RunUse, TaskMetadata, TenantWeights, UsageCharge};

/// The table every shared queue's tenant counters live in.
pub(crate) const SERVICE_TABLE: &str = "pl_fleet_service";

/// The table of each shared queue's floor (see the module docs).
pub(crate) const FLOORS_TABLE: &str = "pl_fleet_service_floors";

/// The counters table (one row per queue, `queue_key`, and tenant: the counter as it was at
/// `at_ms`) and the floors table (one row per queue).
pub(crate) fn service_tables() -> String {
    format!(
        r#"
CREATE TABLE IF NOT EXISTS {SERVICE_TABLE} (
    queue_key TEXT             NOT NULL,
    tenant    TEXT             NOT NULL,
    service   DOUBLE PRECISION NOT NULL,
    pending   DOUBLE PRECISION NOT NULL DEFAULT 0,
    at_ms     BIGINT           NOT NULL,
    PRIMARY KEY (queue_key, tenant)
);
ALTER TABLE {SERVICE_TABLE} ADD COLUMN IF NOT EXISTS pending DOUBLE PRECISION NOT NULL DEFAULT 0;
CREATE TABLE IF NOT EXISTS {FLOORS_TABLE} (
    queue_key TEXT             PRIMARY KEY,
    floor     DOUBLE PRECISION NOT NULL,
    at_ms     BIGINT           NOT NULL
);
"#
    )
}

/// A counter stored at `at_ms` (a column), decayed to the database's clock: `$half_life` ms
/// halve it (`NULL`: no decay).
fn decayed(value: &str, at_ms: &str) -> String {
    format!(
        "({value} * COALESCE(power(2::float8, -(GREATEST(0, {DATABASE_NOW_MS} - {at_ms}))::float8 \
           / $half_life::float8), 1))"
    )
}

/// The pick statement of a layout whose parked rows are `rows` (a `FROM` item with the
/// columns `tenant`, `priority` and `units`, filtered to what the claim may take): the
/// tenant to claim for and the floor.
pub(crate) fn pick_sql(rows: &str) -> String {
    let counter = decayed("s.service", "s.at_ms");
    let pending = decayed("s.pending", "s.at_ms");
    let floor = decayed("f.floor", "f.at_ms");
    format!(
        "WITH live AS (SELECT tenant, max(priority) AS priority FROM {rows} GROUP BY tenant), \
         counters AS ( \
           SELECT l.tenant, l.priority, COALESCE({counter}, 0) AS service, \
                  COALESCE({counter} - {pending}, 0) AS settled FROM live AS l \
             LEFT JOIN {SERVICE_TABLE} AS s ON s.queue_key = $key AND s.tenant = l.tenant), \
         floor AS ( \
           SELECT GREATEST( \
             COALESCE((SELECT {floor} FROM {FLOORS_TABLE} AS f WHERE f.queue_key = $key), 0), \
             COALESCE((SELECT min(settled) FROM counters), 0)) AS floor) \
         SELECT c.tenant, f.floor FROM counters AS c CROSS JOIN floor AS f \
          ORDER BY c.priority DESC, GREATEST(c.service, f.floor), c.tenant LIMIT 1"
    )
}

/// One queue's order by use, as its nodes share it.
#[derive(Debug)]
pub(crate) struct FleetService {
    /// The queue's rows' key.
    key: String,
    order: FairByUse,
    weights: TenantWeights,
    /// The node's execution timeout, ms: what a `held` charge ahead multiplies units by.
    timeout_ms: Option<u64>,
}

/// The tenant a pick chose, and the floor it saw.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Pick {
    pub tenant: String,
    pub floor: f64,
}

impl FleetService {
    /// The order by use of the queue keyed `key`.
    pub(crate) fn new(
        key: String,
        order: FairByUse,
        weights: TenantWeights,
        timeout_ms: Option<u64>,
    ) -> Arc<Self> {
        Arc::new(Self {
            key,
            order,
            weights,
            timeout_ms,
        })
    }

    /// What a claim charges ahead for a task declaring `units`, not weighted: the units
    /// (`reported`), or the units times the timeout (`held`; nothing without a timeout).
    fn advance(&self, units: u32) -> f64 {
        match (self.order.charge, self.timeout_ms) {
            (UsageCharge::Reported, _) => f64::from(units),
            (UsageCharge::Held, Some(timeout)) => f64::from(units) * timeout as f64,
            (UsageCharge::Held, None) => 0.0,
        }
    }

    /// What a run that used `used` costs, not weighted, against its charge ahead
    /// `advance`: the units reported (else its units) or the unit-milliseconds held, never
    /// above an advance that bounds it.
    fn cost(&self, used: &RunUse, advance: f64) -> f64 {
        match (self.order.charge, self.timeout_ms) {
            (UsageCharge::Reported, _) => used
                .reported
                .map_or(advance, |reported| (reported as f64).min(advance)),
            (UsageCharge::Held, Some(_)) => used.held_unit_ms.min(advance),
            (UsageCharge::Held, None) => used.held_unit_ms,
        }
    }

    /// Settles the charge a claim of `tenant`'s task made to what its run used (`used`),
    /// as a node's core settles its own counters: a cost above the charge ahead (a `held`
    /// task charged nothing ahead) is added; a refund takes back the charge as it decayed
    /// since the run started, and stops at the floor (the lowest waiting counter, kept by
    /// the claims) or the counter itself, whichever is lower.
    pub(crate) async fn settle(
        &self,
        database: &super::PgDatabase,
        tenant: &str,
        used: &RunUse,
    ) -> Result<(), DbErr> {
        let advance = self.advance(used.units);
        let weight = f64::from(self.weight(tenant));
        let change = (self.cost(used, advance) - advance) / weight;
        if change == 0.0 && advance == 0.0 {
            return Ok(());
        }
        let counter = decayed("s.service", "s.at_ms");
        let pending = decayed("s.pending", "s.at_ms");
        let floor = decayed("f.floor", "f.at_ms");
        // A counter is soft state: the statement's commit does not wait for the WAL flush
        // (`synchronous_commit` off for its own transaction, set in the statement so that it
        // stays one round trip). A settlement lost to a crash leaves the charge ahead, as a
        // node that dies mid-run does.
        // The refund's share of the counter decayed as the charge did since the start.
        let since_start = decayed("1::float8", "$4");
        let sql = format!(
            "UPDATE {SERVICE_TABLE} AS s SET \
               service = CASE WHEN $3::float8 >= 0 THEN {counter} + $3::float8 \
                 ELSE GREATEST({counter} + $3::float8 * {since_start}, \
                   LEAST({counter}, COALESCE((SELECT {floor} FROM {FLOORS_TABLE} AS f \
                     WHERE f.queue_key = $1), 0))) END, \
               pending = GREATEST(0, {pending} - $6::float8 * {since_start}), \
               at_ms = {DATABASE_NOW_MS} \
             FROM (SELECT set_config('synchronous_commit', 'off', true)) AS relaxed \
             WHERE s.queue_key = $1 AND s.tenant = $2"
        )
        .replace("$half_life", "$5");
        let values: Vec<Value> = vec![
            self.key.clone().into(),
            tenant.to_owned().into(),
            change.into(),
            i64::try_from(used.started_ms).unwrap_or(i64::MAX).into(),
            self.order.half_life_ms.map(|ms| ms as f64).into(),
            (advance / weight).into(),
        ];
        database.rows(sql, values).await.map(drop)
    }

    /// The value of a parameter of the pick and charge statements: `$key`, `$half_life`.
    pub(crate) fn value(&self, name: &str) -> Option<Value> {
        match name {
            "key" => Some(self.key.clone().into()),
            "half_life" => Some(self.order.half_life_ms.map(|ms| ms as f64).into()),
            _ => None,
        }
    }

    /// Takes the queue's turn to claim, for the rest of `transaction`.
    pub(crate) async fn lock(&self, transaction: &DatabaseTransaction) -> Result<(), DbErr> {
        let sql = "SELECT pg_advisory_xact_lock(hashtextextended($1, 0))".to_owned();
        transaction
            .query_all_raw(super::PgDatabase::statement(
                sql,
                vec![self.key.clone().into()],
            ))
            .await
            .map(drop)
    }

    /// Runs the pick statement (its text and values) in `transaction`.
    pub(crate) async fn pick(
        &self,
        transaction: &DatabaseTransaction,
        sql: String,
        values: Vec<Value>,
    ) -> Result<Option<Pick>, DbErr> {
        let row = transaction
            .query_one_raw(super::PgDatabase::statement(sql, values))
            .await?;
        let Some(row) = row else {
            return Ok(None);
        };
        Ok(Some(Pick {
            tenant: row.try_get("", "tenant")?,
            floor: row.try_get("", "floor")?,
        }))
    }

    /// The weight of `tenant`.
    fn weight(&self, tenant: &str) -> u32 {
        self.weights
            .get(tenant)
            .unwrap_or(self.order.default_weight)
    }

    /// Charges `pick`'s tenant for the tasks a claim for it took (`claimed`, the claim's
    /// rows), lifted to the pick's floor, and keeps the floor; in `transaction`. Returns the
    /// units the tasks declared, per kind index.
    pub(crate) async fn charge(
        &self,
        transaction: &DatabaseTransaction,
        pick: &Pick,
        claimed: &[QueryResult],
    ) -> Result<[u32; crate::util::serde::ResourceKind::COUNT], DbErr> {
        let mut taken = [0u32; crate::util::serde::ResourceKind::COUNT];
        let mut advance = 0f64;
        for row in claimed {
            // A task that cannot be read is dead-lettered, not run: it costs nothing.
            let Ok(metadata) = column::<String>("fair share", row, "metadata") else {
                continue;
            };
            let Ok(meta) = serde_json::from_str::<TaskMetadata>(&metadata) else {
                continue;
            };
            taken[meta.cost.kind.index()] += meta.cost.units;
            advance += self.advance(meta.cost.units);
        }
        let charge = advance / f64::from(self.weight(&pick.tenant));
        let counter = decayed("s.service", "s.at_ms");
        let pending = decayed("s.pending", "s.at_ms");
        let sql = format!(
            "WITH charged AS ( \
               INSERT INTO {SERVICE_TABLE} AS s (queue_key, tenant, service, pending, at_ms) \
               VALUES ($1, $2, $3::float8 + $4::float8, $4::float8, {DATABASE_NOW_MS}) \
               ON CONFLICT (queue_key, tenant) DO UPDATE SET \
                 service = GREATEST({counter}, $3::float8) + $4::float8, \
                 pending = {pending} + $4::float8, \
                 at_ms = {DATABASE_NOW_MS} \
               RETURNING 1) \
             INSERT INTO {FLOORS_TABLE} AS f (queue_key, floor, at_ms) \
             SELECT $1, $3::float8, {DATABASE_NOW_MS} FROM (SELECT count(*) FROM charged) AS c \
             ON CONFLICT (queue_key) DO UPDATE SET floor = EXCLUDED.floor, at_ms = EXCLUDED.at_ms"
        )
        .replace("$half_life", "$5");
        let values: Vec<Value> = vec![
            self.key.clone().into(),
            pick.tenant.clone().into(),
            pick.floor.into(),
            charge.into(),
            self.order.half_life_ms.map(|ms| ms as f64).into(),
        ];
        transaction
            .execute_raw(super::PgDatabase::statement(sql, values))
            .await?;
        Ok(taken)
    }
}

/// What a claim is given, owned, to run on the database's runtime.
#[derive(Debug, Clone)]
pub(crate) struct OwnedClaim {
    pub queue: String,
    pub node: String,
    pub now_ms: u64,
    pub expires_at_ms: u64,
}

impl OwnedClaim {
    /// The values of the claim statement for `query`, taking at most `max` tasks.
    pub(crate) fn params<'a>(&'a self, query: &'a FitQuery, max: usize) -> ClaimParams<'a> {
        ClaimParams {
            queue: &self.queue,
            node: &self.node,
            query,
            now_ms: self.now_ms,
            expires_at_ms: self.expires_at_ms,
            max,
        }
    }
}

/// The values of the pick and of the claim for one tenant: the claim's, with `$key`,
/// `$half_life` and `$tenant`.
pub(crate) struct FairParams<'a> {
    pub claim: &'a OwnedClaim,
    pub query: &'a FitQuery,
    pub max: usize,
    pub service: &'a FleetService,
    pub tenant: Option<&'a str>,
}

impl Params for FairParams<'_> {
    fn value(&self, name: &str) -> Option<Value> {
        if name == "tenant" {
            return self.tenant.map(|tenant| tenant.to_owned().into());
        }
        if let Some(value) = self.service.value(name) {
            return Some(value);
        }
        self.claim.params(self.query, self.max).value(name)
    }
}
