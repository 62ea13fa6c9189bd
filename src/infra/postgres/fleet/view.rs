//! [`FleetView`]: a shared queue's fleet as the database holds it, read by any node.
//!
//! Every read is one or a few plain `SELECT`s on the node table, the queue's parked rows or
//! messages (through their rank index: the table queue's, or each pgmq level's, see
//! `infra::postgres::pgmq::parked`) and the budgets' and counters' rows: no row is locked, so a
//! view polled while the nodes claim takes nothing from them (`benches/fleet_view.rs`
//! measures it).

use crate::core::QueueOrder;
use crate::infra::postgres::claim::due_of;
use std::collections::HashMap;

use sea_orm::{DbErr, QueryResult, Value};
use serde::Serialize;

use super::reasons::{reason_of, FleetState, ParkedReason, WaitingTask};
use super::registry::{read_nodes, request, NodeAction};
use super::FleetQueue;
use crate::core::PoolError;
use crate::infra::postgres::codec::{entry_from_sql, DATABASE_NOW_MS};
use crate::infra::postgres::PgDatabase;
use crate::util::serde::{MailboxKey, ResourceKind};

/// How a node of the fleet is, by its heartbeat.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum NodeHealth {
    /// It heartbeats.
    Live,
    /// It missed [`STALE_AFTER_BEATS`](super::STALE_AFTER_BEATS) heartbeats: it may have
    /// died, and its claims are at risk until their leases run out.
    Stale,
    /// It stopped cleanly.
    Gone,
}

/// A node of the fleet, as its row and the queue say.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct FleetNode {
    /// Its name in the queue's leases.
    pub node: String,
    /// The pool it serves the queue with.
    pub pool: String,
    /// The machine it runs on.
    pub host: String,
    /// Its process id there.
    pub pid: u32,
    /// When it registered, ms since the Unix epoch (the database's clock).
    pub started_ms: u128,
    /// Its last heartbeat, ms since the Unix epoch.
    pub heartbeat_ms: u128,
    /// How long ago that was, ms.
    pub heartbeat_age_ms: u64,
    /// Its heartbeat's interval, ms.
    pub heartbeat_every_ms: u64,
    /// Live, stale or gone.
    pub health: NodeHealth,
    /// Its worker threads.
    pub workers: u64,
    /// Its units per kind.
    pub capacity: HashMap<String, u64>,
    /// Tasks running there at its last heartbeat.
    pub running: u64,
    /// Whether it was paused at its last heartbeat.
    pub paused: bool,
    /// Whether it was draining at its last heartbeat.
    pub draining: bool,
    /// A request sent to it and not carried out yet.
    pub wanted: Option<&'static str>,
    /// Tasks of the queue it holds claimed: rows it locked, or PGMQ messages it holds.
    pub claims: u64,
    /// Of those, the ones at risk: all of them when it is stale.
    pub claims_at_risk: u64,
}

/// A budget of the fleet, as it stands.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct BudgetLevel {
    /// Its kind.
    pub kind: &'static str,
    /// Units it refills by every `per_ms`.
    pub units: u64,
    /// Its period, ms.
    pub per_ms: u64,
    /// The most whole units it holds.
    pub burst: u64,
    /// Whole units it holds now.
    pub level: u64,
    /// When it is full again, ms from now (0: full).
    pub full_in_ms: u64,
    /// Starts left now under its start cap, if it has one.
    pub starts_left: Option<u64>,
}

/// A parked task of the fleet, and why it waits.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct FleetParked {
    /// Its place in the queue's rank order (0: next).
    pub position: u64,
    /// Its entry in the queue, as a string (entries use all 64 bits).
    pub entry: String,
    /// The caller's id of it.
    pub task_id: u64,
    /// Where its result goes.
    pub key: MailboxKey,
    /// Its priority (`low`, `normal`, `high`, `critical`).
    pub priority: i16,
    /// Its kind.
    pub kind: &'static str,
    /// Its units.
    pub units: u64,
    /// How long it has waited since admission, ms.
    pub waited_ms: u64,
    /// Claims it had so far.
    pub attempts: u32,
    /// Why it waits.
    pub reason: ParkedReason,
    /// The reason in a sentence.
    pub reason_text: String,
}

/// A page of the fleet's parked tasks, in rank order.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ParkedPage {
    /// The tasks of the page.
    pub parked: Vec<FleetParked>,
    /// Every parked task of the queue.
    pub parked_total: u64,
    /// Where the page starts.
    pub offset: usize,
    /// The database's clock when the page was read, ms since the Unix epoch.
    pub at_ms: u128,
}

/// A shared queue's fleet, as any node reads it from the database.
#[derive(Clone)]
pub struct FleetView {
    database: PgDatabase,
    queue: FleetQueue,
}

impl FleetView {
    /// The fleet of `queue`, read through `database`.
    pub fn new(database: PgDatabase, queue: FleetQueue) -> Self {
        Self { database, queue }
    }

    /// The queue it shows.
    pub fn queue(&self) -> &FleetQueue {
        &self.queue
    }

    /// Every node that registered, oldest first: live, stale or gone.
    pub async fn nodes(&self) -> Result<Vec<FleetNode>, PoolError> {
        // A build that cannot read the layout's tables (pgmq without its feature) still
        // lists the nodes, without their claims.
        let claims = self
            .layout_reads()
            .map_or_else(|_| "0::bigint".to_owned(), |reads| reads.claims);
        let rows = read_nodes(
            &self.database,
            self.queue.key(),
            &claims,
            Some(self.queue.queue_name()),
        )
        .await
        .map_err(|error| self.failed("read its nodes", &error))?;
        rows.iter()
            .map(node_of)
            .collect::<Result<_, _>>()
            .map_err(|error| self.failed("read a node's row", &error))
    }

    /// The fleet's budgets, as they stand now, by kind.
    pub async fn budgets(&self) -> Result<Vec<BudgetLevel>, PoolError> {
        let sql = format!(
            "SELECT kind, units, per_ms, burst, \
                    LEAST(burst * per_ms, level + GREATEST(0, {DATABASE_NOW_MS} - at_ms) * units) AS level, \
                    CASE WHEN start_count IS NULL THEN NULL ELSE \
                      LEAST(start_count * start_per_ms, start_level \
                            + GREATEST(0, {DATABASE_NOW_MS} - at_ms) * start_count) / start_per_ms END AS starts_left \
               FROM pl_fleet_budgets WHERE queue_key = $1 ORDER BY kind"
        );
        let rows = match self.database.rows(sql, vec![self.queue.key().into()]).await {
            Ok(rows) => rows,
            // No queue of this database shares budgets yet: none to show.
            Err(error) if missing_table(&error) => return Ok(Vec::new()),
            Err(error) => return Err(self.failed("read its budgets", &error)),
        };
        rows.iter()
            .filter_map(|row| budget_of(row).transpose())
            .collect::<Result<_, _>>()
            .map_err(|error| self.failed("read a budget's row", &error))
    }

    /// Asks node `node` (`None`: every node that has not left) to carry out `action` at its
    /// next heartbeat, and answers the nodes asked: none when no such node serves the queue
    /// (it never registered, or it left).
    pub async fn request(
        &self,
        node: Option<&str>,
        action: NodeAction,
    ) -> Result<Vec<String>, PoolError> {
        request(&self.database, self.queue.key(), node, action)
            .await
            .map_err(|error| self.failed("send a request to its nodes", &error))
    }

    /// The queue's parked tasks from `offset`, at most `limit`, in rank order (priority, then
    /// deadline for a queue in the deadline order, then admission), each with why it waits: the table queue's rows, or the messages of the
    /// pgmq queue's levels that no node holds.
    pub async fn parked(&self, offset: usize, limit: usize) -> Result<ParkedPage, PoolError> {
        let reads = self.layout_reads()?;
        let nodes = self.nodes().await?;
        let queue_name = self.queue.queue_name().to_owned();
        let sql = reads.page;
        let values: Vec<Value> = vec![
            queue_name.into(),
            i64::try_from(offset).unwrap_or(i64::MAX).into(),
            i64::try_from(limit).unwrap_or(i64::MAX).into(),
        ];
        let rows = self
            .database
            .rows(sql, values)
            .await
            .map_err(|error| self.failed("read its parked tasks", &error))?;
        let budgets = self.budgets().await?;
        let counters = self.tenant_counters().await?;
        let waiting_tenants = self.waiting_tenants(reads.tenants, &counters).await?;
        let read = |row: &QueryResult| -> Result<(u64, u64), DbErr> {
            Ok((
                to_u64(row.try_get::<i64>("", "now_ms")?),
                to_u64(row.try_get::<i64>("", "total")?),
            ))
        };
        let (now_ms, parked_total) = match rows.first() {
            Some(row) => read(row).map_err(|error| self.failed("read its clock", &error))?,
            None => (crate::util::clock::now_ms() as u64, 0),
        };
        let fleet = fleet_state(now_ms, &nodes, &budgets, &counters, &waiting_tenants);
        let parked = rows
            .iter()
            .enumerate()
            .map(|(index, row)| {
                let position = u64::try_from(offset + index).unwrap_or(u64::MAX);
                parked_of(row, position, &fleet, &counters)
            })
            .collect::<Result<_, _>>()
            .map_err(|error| self.failed("read a parked task's row", &error))?;
        Ok(ParkedPage {
            parked,
            parked_total,
            offset,
            at_ms: u128::from(now_ms),
        })
    }

    /// Why the task `id` of exactly `key` waits, if it is parked in the queue (`None`: it
    /// runs, ended, or never was), with its place in the rank order: what
    /// [`PoolControl::why_waiting`](crate::core::PoolControl::why_waiting) answers for a
    /// node's own tasks, for every parked task of the queue, in either layout.
    pub async fn why_waiting(
        &self,
        key: &MailboxKey,
        id: u64,
    ) -> Result<Option<FleetParked>, PoolError> {
        let reads = self.layout_reads()?;
        let sql = reads.one;
        let values: Vec<Value> = vec![
            self.queue.queue_name().to_owned().into(),
            key.tenant.0.clone().into(),
            i64::try_from(id).unwrap_or(i64::MAX).into(),
            key.user_id.clone().into(),
            key.session_id.clone().into(),
        ];
        let rows = self
            .database
            .rows(sql, values)
            .await
            .map_err(|error| self.failed("read a parked task", &error))?;
        let Some(row) = rows.first() else {
            return Ok(None);
        };
        let nodes = self.nodes().await?;
        let budgets = self.budgets().await?;
        let counters = self.tenant_counters().await?;
        let waiting_tenants = self.waiting_tenants(reads.tenants, &counters).await?;
        let read = |row: &QueryResult| -> Result<(u64, u64), DbErr> {
            Ok((
                to_u64(row.try_get::<i64>("", "now_ms")?),
                to_u64(row.try_get::<i64>("", "ahead")?),
            ))
        };
        let (now_ms, ahead) = read(row).map_err(|error| self.failed("read its place", &error))?;
        let fleet = fleet_state(now_ms, &nodes, &budgets, &counters, &waiting_tenants);
        parked_of(row, ahead, &fleet, &counters)
            .map(Some)
            .map_err(|error| self.failed("read a parked task's row", &error))
    }

    /// The tenants with a task parked (`sql`, the layout's statement), where the fleet keeps
    /// tenant counters (the least served of them goes first); none otherwise.
    async fn waiting_tenants(
        &self,
        sql: String,
        counters: &HashMap<String, f64>,
    ) -> Result<Vec<String>, PoolError> {
        if counters.is_empty() {
            return Ok(Vec::new());
        }
        let rows = self
            .database
            .rows(sql, vec![self.queue.queue_name().to_owned().into()])
            .await
            .map_err(|error| self.failed("read its waiting tenants", &error))?;
        rows.iter()
            .map(|row| row.try_get::<String>("", "tenant"))
            .collect::<Result<_, _>>()
            .map_err(|error| self.failed("read a waiting tenant", &error))
    }

    /// Each tenant's service counter, where the fleet keeps them (a fair share by use).
    async fn tenant_counters(&self) -> Result<HashMap<String, f64>, PoolError> {
        let sql = "SELECT tenant, service FROM pl_fleet_service WHERE queue_key = $1".to_owned();
        let rows = match self.database.rows(sql, vec![self.queue.key().into()]).await {
            Ok(rows) => rows,
            Err(error) if missing_table(&error) => return Ok(HashMap::new()),
            Err(error) => return Err(self.failed("read its tenants' counters", &error)),
        };
        rows.iter()
            .map(|row| Ok((row.try_get("", "tenant")?, row.try_get("", "service")?)))
            .collect::<Result<_, DbErr>>()
            .map_err(|error| self.failed("read a tenant's counter", &error))
    }

    /// The statements that read the queue in its layout.
    fn layout_reads(&self) -> Result<LayoutReads, PoolError> {
        match &self.queue.table {
            Some(table) => Ok(LayoutReads::table(table.as_str(), self.queue.order())),
            None => LayoutReads::pgmq(self.queue.queue_name(), self.queue.order()),
        }
    }

    fn failed(&self, what: &str, error: &DbErr) -> PoolError {
        PoolError::Internal(format!(
            "fleet of {}: could not {what}: {}",
            self.queue.key(),
            crate::infra::postgres::describe(error)
        ))
    }
}

impl std::fmt::Debug for FleetView {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FleetView")
            .field("queue", &self.queue)
            .finish()
    }
}

/// The statements that read a queue's parked tasks and its nodes' claims, in its layout.
/// Each layout answers the same columns (those [`parked_of`] reads), so one reader serves
/// both.
struct LayoutReads {
    /// A page of the parked tasks in rank order, with `now_ms` and `total`: `$1` the queue's
    /// name, from `$2`, at most `$3`.
    page: String,
    /// One parked task, with `now_ms` and `ahead`: `$1` the queue's name, `$2` the tenant,
    /// `$3` the task id, `$4` the user, `$5` the session.
    one: String,
    /// The tenants with a task parked: `$1` the queue's name.
    tenants: String,
    /// How many tasks node `n.node` holds claimed: an expression over the node table's row
    /// `n`, `$2` the queue's name.
    claims: String,
}

impl LayoutReads {
    /// The table queue's: rows of `table` in state `parked`, through its rank index, in the
    /// order its claims take them.
    fn table(table: &str, order: QueueOrder) -> Self {
        let (rank, ahead) = match order {
            QueueOrder::Fifo => (
                "rank_time_ms, entry".to_owned(),
                "(a.rank_time_ms, a.entry) < (t.rank_time_ms, t.entry)".to_owned(),
            ),
            QueueOrder::Deadline => (
                format!("{}, rank_time_ms, entry", due_of("deadline_ms")),
                format!(
                    "({}, a.rank_time_ms, a.entry) < ({}, t.rank_time_ms, t.entry)",
                    due_of("a.deadline_ms"),
                    due_of("t.deadline_ms")
                ),
            ),
        };
        let columns = "entry, task_id, tenant, user_id, session_id, priority, kind, units, \
                       rank_time_ms, attempts, not_before_ms, last_error, pending_parents";
        Self {
            page: format!(
                "SELECT {columns}, {DATABASE_NOW_MS} AS now_ms, \
                        (SELECT count(*) FROM {table} WHERE queue_name = $1 AND state = 'parked') AS total \
                   FROM {table} WHERE queue_name = $1 AND state = 'parked' \
                  ORDER BY priority DESC, {rank} OFFSET $2 LIMIT $3"
            ),
            one: format!(
                "SELECT t.entry, t.task_id, t.tenant, t.user_id, t.session_id, t.priority, t.kind, \
                        t.units, t.rank_time_ms, t.attempts, t.not_before_ms, t.last_error, \
                        t.pending_parents, {DATABASE_NOW_MS} AS now_ms, \
                        (SELECT count(*) FROM {table} AS a WHERE a.queue_name = $1 \
                            AND a.state = 'parked' AND (a.priority > t.priority \
                             OR (a.priority = t.priority AND {ahead}))) AS ahead \
                   FROM {table} AS t WHERE t.queue_name = $1 AND t.state = 'parked' \
                    AND t.tenant = $2 AND t.task_id = $3 \
                    AND t.user_id IS NOT DISTINCT FROM $4 AND t.session_id IS NOT DISTINCT FROM $5"
            ),
            tenants: format!(
                "SELECT DISTINCT tenant FROM {table} WHERE queue_name = $1 AND state = 'parked'"
            ),
            claims: format!(
                "(SELECT count(*) FROM {table} AS q WHERE q.queue_name = $2 \
                   AND q.state = 'claimed' AND q.locked_by = n.node)"
            ),
        }
    }

    /// The pgmq queue's: the messages of its levels no node holds
    /// (`infra::postgres::pgmq::parked`).
    #[cfg(feature = "pgmq")]
    fn pgmq(queue_name: &str, order: QueueOrder) -> Result<Self, PoolError> {
        use crate::infra::postgres::pgmq::parked;
        Ok(Self {
            page: parked::page_sql(queue_name, order)?,
            one: parked::one_sql(queue_name, order)?,
            tenants: parked::tenants_sql(queue_name)?,
            claims: parked::claims_sql(queue_name)?,
        })
    }

    /// A pgmq queue in a build without the `pgmq` feature, which cannot read its tables.
    #[cfg(not(feature = "pgmq"))]
    fn pgmq(queue_name: &str, _order: QueueOrder) -> Result<Self, PoolError> {
        Err(PoolError::InvalidConfig(format!(
            "fleet: the pgmq queue {queue_name:?} is read with the cargo feature `pgmq`, \
             which this build lacks (enable it, or use a \"postgres\" table queue)"
        )))
    }
}

/// Whether `error` says a table does not exist (SQLSTATE 42P01).
fn missing_table(error: &DbErr) -> bool {
    crate::infra::postgres::describe(error).contains("42P01")
}

fn to_u64(value: i64) -> u64 {
    u64::try_from(value).unwrap_or(0)
}

fn kind_of(kind: i16) -> ResourceKind {
    ResourceKind::ALL
        .into_iter()
        .find(|known| i16::try_from(known.index()).ok() == Some(kind))
        .unwrap_or(ResourceKind::Cpu)
}

fn node_of(row: &QueryResult) -> Result<FleetNode, DbErr> {
    let now_ms = to_u64(row.try_get("", "now_ms")?);
    let heartbeat_ms = to_u64(row.try_get("", "heartbeat_ms")?);
    let heartbeat_every_ms = to_u64(row.try_get("", "heartbeat_every_ms")?);
    let left_ms: Option<i64> = row.try_get("", "left_ms")?;
    let heartbeat_age_ms = now_ms.saturating_sub(heartbeat_ms);
    let health = if left_ms.is_some() {
        NodeHealth::Gone
    } else if heartbeat_age_ms > heartbeat_every_ms.saturating_mul(super::STALE_AFTER_BEATS) {
        NodeHealth::Stale
    } else {
        NodeHealth::Live
    };
    let capacity: String = row.try_get("", "capacity")?;
    let capacity: HashMap<String, u64> = serde_json::from_str(&capacity).unwrap_or_default();
    let wanted: Option<String> = row.try_get("", "wanted")?;
    let claims = to_u64(row.try_get("", "claims")?);
    Ok(FleetNode {
        node: row.try_get("", "node")?,
        pool: row.try_get("", "pool")?,
        host: row.try_get("", "host")?,
        pid: u32::try_from(row.try_get::<i64>("", "pid")?).unwrap_or(0),
        started_ms: u128::from(to_u64(row.try_get("", "started_ms")?)),
        heartbeat_ms: u128::from(heartbeat_ms),
        heartbeat_age_ms,
        heartbeat_every_ms,
        health,
        workers: to_u64(row.try_get("", "workers")?),
        capacity,
        running: to_u64(row.try_get("", "running")?),
        paused: row.try_get("", "paused")?,
        draining: row.try_get("", "draining")?,
        wanted: wanted
            .as_deref()
            .and_then(NodeAction::from_name)
            .map(NodeAction::name),
        claims,
        claims_at_risk: if health == NodeHealth::Live {
            0
        } else {
            claims
        },
    })
}

fn budget_of(row: &QueryResult) -> Result<Option<BudgetLevel>, DbErr> {
    let units = to_u64(row.try_get("", "units")?);
    let per_ms = to_u64(row.try_get("", "per_ms")?);
    if per_ms == 0 || units == 0 {
        return Ok(None);
    }
    let burst = to_u64(row.try_get("", "burst")?);
    let level = to_u64(row.try_get("", "level")?);
    let missing = burst.saturating_mul(per_ms).saturating_sub(level);
    let starts_left: Option<i64> = row.try_get("", "starts_left")?;
    Ok(Some(BudgetLevel {
        kind: kind_of(row.try_get("", "kind")?).name(),
        units,
        per_ms,
        burst,
        level: level / per_ms,
        full_in_ms: missing.div_ceil(units),
        starts_left: starts_left.map(to_u64),
    }))
}

/// What the reasons need of the fleet: its live nodes, budgets and least-served tenant.
fn fleet_state(
    now_ms: u64,
    nodes: &[FleetNode],
    budgets: &[BudgetLevel],
    counters: &HashMap<String, f64>,
    waiting_tenants: &[String],
) -> FleetState {
    let mut fleet = FleetState {
        now_ms,
        ..FleetState::default()
    };
    // A producer-only node (no workers) claims nothing: it is no help to a parked task.
    let claimers = nodes
        .iter()
        .filter(|node| node.health == NodeHealth::Live && node.workers > 0);
    for node in claimers {
        fleet.live_nodes += 1;
        if !node.paused && !node.draining {
            fleet.claiming_nodes += 1;
        }
        for kind in ResourceKind::ALL {
            let units = node.capacity.get(kind.name()).copied().unwrap_or(0);
            let largest = &mut fleet.largest[kind.index()];
            *largest = (*largest).max(units);
        }
    }
    for budget in budgets {
        if let Some(kind) = ResourceKind::ALL
            .into_iter()
            .find(|kind| kind.name() == budget.kind)
        {
            fleet.budgets[kind.index()] = Some((budget.level, budget.units, budget.per_ms));
        }
    }
    if !counters.is_empty() {
        fleet.least_served = waiting_tenants
            .iter()
            .map(|tenant| {
                let service = counters.get(tenant).copied().unwrap_or(0.0);
                (tenant.clone(), service)
            })
            .min_by(|a, b| a.1.total_cmp(&b.1));
    }
    fleet
}

fn parked_of(
    row: &QueryResult,
    position: u64,
    fleet: &FleetState,
    counters: &HashMap<String, f64>,
) -> Result<FleetParked, DbErr> {
    let tenant: String = row.try_get("", "tenant")?;
    let mut key = MailboxKey::new(tenant.clone());
    key.user_id = row.try_get("", "user_id")?;
    key.session_id = row.try_get("", "session_id")?;
    let kind = kind_of(row.try_get("", "kind")?);
    let units = to_u64(row.try_get("", "units")?);
    let attempts = u32::try_from(row.try_get::<i32>("", "attempts")?).unwrap_or(0);
    let last_error: Option<String> = row.try_get("", "last_error")?;
    let waiting = WaitingTask {
        kind,
        units,
        tenant: &tenant,
        service: counters.get(&tenant).copied(),
        not_before_ms: to_u64(row.try_get("", "not_before_ms")?),
        attempts,
        last_error: last_error.as_deref(),
        ahead: position,
        // A table queue without dependencies has no such column.
        pending_parents: to_u64(i64::from(
            row.try_get::<i32>("", "pending_parents").unwrap_or(0),
        )),
    };
    let reason = reason_of(&waiting, fleet);
    Ok(FleetParked {
        position,
        entry: entry_from_sql(row.try_get("", "entry")?).to_string(),
        task_id: to_u64(row.try_get("", "task_id")?),
        key,
        priority: row.try_get("", "priority")?,
        kind: kind.name(),
        units,
        waited_ms: fleet
            .now_ms
            .saturating_sub(to_u64(row.try_get("", "rank_time_ms")?)),
        attempts,
        reason_text: reason.text(),
        reason,
    })
}
