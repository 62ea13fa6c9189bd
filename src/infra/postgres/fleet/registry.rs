//! The node table: one row per node of a shared queue, kept by the node's heartbeat and read
//! by any node's fleet view.
//!
//! | column | holds |
//! |---|---|
//! | `queue_key`, `node` | the queue's key and the node's name in its leases (the key of the row) |
//! | `pool`, `host`, `pid` | the pool the node serves the queue with, and where it runs |
//! | `started_ms`, `heartbeat_ms` | when it registered and when it last wrote, on the database's clock |
//! | `heartbeat_every_ms` | its heartbeat's interval: it is stale after [`STALE_AFTER_BEATS`](super::STALE_AFTER_BEATS) of them |
//! | `workers`, `capacity` | its worker threads and its units per kind (`{"cpu": 8}`) |
//! | `running`, `paused`, `draining` | its state at its last heartbeat |
//! | `wanted` | what an operator asked of it and it has not done yet ([`NodeAction`]) |
//! | `left_ms` | when it stopped cleanly (`NULL` while it serves) |
//!
//! A row gone or silent for an hour ([`FORGET_AFTER_MS`]) is deleted by a later heartbeat
//! of any node.

use sea_orm::{DbErr, QueryResult, TransactionTrait, Value};

use super::super::codec::DATABASE_NOW_MS;
use super::super::schema::SCHEMA_LOCK;
use super::super::PgDatabase;

/// The table of every shared queue's nodes.
pub const NODES_TABLE: &str = "pl_fleet_nodes";

/// What an operator may ask of a node through the fleet: the node's own control actions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum NodeAction {
    /// Stop starting and claiming tasks.
    Pause,
    /// End a pause.
    Resume,
    /// Refuse new work and finish what the node has.
    Drain,
    /// End a drain (and a pause).
    Undrain,
}

impl NodeAction {
    /// Every action, in the order the API lists them.
    pub const ALL: [NodeAction; 4] = [Self::Pause, Self::Resume, Self::Drain, Self::Undrain];

    /// Its name in the API, the CLI and the table.
    pub fn name(self) -> &'static str {
        match self {
            Self::Pause => "pause",
            Self::Resume => "resume",
            Self::Drain => "drain",
            Self::Undrain => "undrain",
        }
    }

    /// The action named `name`, if any.
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|action| action.name() == name)
    }
}

/// What a heartbeat writes of its node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct NodeBeat {
    pub pool: String,
    pub host: String,
    pub pid: u32,
    pub heartbeat_every_ms: i64,
    pub workers: i64,
    /// Units per kind, as a JSON object.
    pub capacity: String,
    pub running: i64,
    pub paused: bool,
    pub draining: bool,
}

fn nodes_table() -> String {
    format!(
        r#"
CREATE TABLE IF NOT EXISTS {NODES_TABLE} (
    queue_key          TEXT    NOT NULL,
    node               TEXT    NOT NULL,
    pool               TEXT    NOT NULL,
    host               TEXT    NOT NULL,
    pid                BIGINT  NOT NULL,
    started_ms         BIGINT  NOT NULL,
    heartbeat_ms       BIGINT  NOT NULL,
    heartbeat_every_ms BIGINT  NOT NULL,
    workers            BIGINT  NOT NULL,
    capacity           JSONB   NOT NULL,
    running            BIGINT  NOT NULL,
    paused             BOOLEAN NOT NULL,
    draining           BOOLEAN NOT NULL,
    wanted             TEXT    NULL,
    left_ms            BIGINT  NULL,
    PRIMARY KEY (queue_key, node)
);
"#
    )
}

/// Creates the node table unless it exists, under the schema lock (see `schema.rs`).
pub(crate) async fn ensure_nodes_table(database: &PgDatabase) -> Result<(), DbErr> {
    database
        .run(|connection| async move {
            use sea_orm::ConnectionTrait;
            let transaction = connection.begin().await?;
            transaction
                .execute_unprepared(&format!("SELECT pg_advisory_xact_lock({SCHEMA_LOCK})"))
                .await?;
            transaction.execute_unprepared(&nodes_table()).await?;
            transaction.commit().await
        })
        .await
}

/// Writes `beat` as node `node` of queue `key`'s state now (registering it, the first time).
pub(crate) async fn write_beat(
    database: &PgDatabase,
    key: &str,
    node: &str,
    beat: &NodeBeat,
) -> Result<(), DbErr> {
    let sql = format!(
        "INSERT INTO {NODES_TABLE} AS n (queue_key, node, pool, host, pid, started_ms, \
            heartbeat_ms, heartbeat_every_ms, workers, capacity, running, paused, draining) \
         VALUES ($1, $2, $3, $4, $5, {DATABASE_NOW_MS}, {DATABASE_NOW_MS}, $6, $7, $8::jsonb, \
            $9, $10, $11) \
         ON CONFLICT (queue_key, node) DO UPDATE SET heartbeat_ms = {DATABASE_NOW_MS}, \
            heartbeat_every_ms = $6, workers = $7, capacity = $8::jsonb, running = $9, \
            paused = $10, draining = $11, left_ms = NULL"
    );
    let values: Vec<Value> = vec![
        key.into(),
        node.into(),
        beat.pool.clone().into(),
        beat.host.clone().into(),
        i64::from(beat.pid).into(),
        beat.heartbeat_every_ms.into(),
        beat.workers.into(),
        beat.capacity.clone().into(),
        beat.running.into(),
        beat.paused.into(),
        beat.draining.into(),
    ];
    database.rows(sql, values).await.map(drop)
}

/// How long the table keeps the row of a node gone or silent, ms: then any node's heartbeat
/// deletes it, so restarts (each a new node name) do not pile up rows.
pub const FORGET_AFTER_MS: i64 = 60 * 60 * 1_000;

/// Deletes the rows of every queue's nodes gone or silent for [`FORGET_AFTER_MS`].
pub(crate) async fn forget_old_nodes(database: &PgDatabase) -> Result<(), DbErr> {
    let sql = format!(
        "DELETE FROM {NODES_TABLE} \
         WHERE COALESCE(left_ms, heartbeat_ms) < {DATABASE_NOW_MS} - {FORGET_AFTER_MS}"
    );
    database.rows(sql, Vec::new()).await.map(drop)
}

/// Takes the request waiting for node `node`, if any: it is cleared as it is read, so each
/// is carried out once.
pub(crate) async fn take_wanted(
    database: &PgDatabase,
    key: &str,
    node: &str,
) -> Result<Option<NodeAction>, DbErr> {
    let sql = format!(
        "WITH asked AS (SELECT wanted FROM {NODES_TABLE} \
             WHERE queue_key = $1 AND node = $2 AND wanted IS NOT NULL FOR UPDATE) \
         UPDATE {NODES_TABLE} AS n SET wanted = NULL FROM asked \
          WHERE n.queue_key = $1 AND n.node = $2 RETURNING asked.wanted"
    );
    let rows = database.rows(sql, vec![key.into(), node.into()]).await?;
    let wanted = match rows.first() {
        Some(row) => row.try_get::<String>("", "wanted")?,
        None => return Ok(None),
    };
    Ok(NodeAction::from_name(&wanted))
}

/// Marks node `node` gone: it stopped cleanly.
pub(crate) async fn leave(database: &PgDatabase, key: &str, node: &str) -> Result<(), DbErr> {
    let sql = format!(
        "UPDATE {NODES_TABLE} SET left_ms = {DATABASE_NOW_MS}, running = 0, wanted = NULL \
         WHERE queue_key = $1 AND node = $2"
    );
    database
        .rows(sql, vec![key.into(), node.into()])
        .await
        .map(drop)
}

/// Asks node `node` (or, `None`, every node that has not left) of queue `key` to carry out
/// `action` at its next heartbeat; answers the nodes asked.
pub(crate) async fn request(
    database: &PgDatabase,
    key: &str,
    node: Option<&str>,
    action: NodeAction,
) -> Result<Vec<String>, DbErr> {
    let sql = format!(
        "UPDATE {NODES_TABLE} SET wanted = $3 \
         WHERE queue_key = $1 AND ($2::text IS NULL OR node = $2) AND left_ms IS NULL \
         RETURNING node"
    );
    let values: Vec<Value> = vec![
        key.into(),
        node.map(str::to_owned).into(),
        action.name().into(),
    ];
    let rows = database.rows(sql, values).await?;
    rows.iter()
        .map(|row| row.try_get::<String>("", "node"))
        .collect()
}

/// Every node row of queue `key`, oldest first, with the database's clock (`now_ms`) and how
/// many tasks each holds claimed (`claims`: the layout's expression over the row `n`, given
/// `$2`, the queue's name).
pub(crate) async fn read_nodes(
    database: &PgDatabase,
    key: &str,
    claims: &str,
    queue_name: Option<&str>,
) -> Result<Vec<QueryResult>, DbErr> {
    let sql = format!(
        "SELECT n.node, n.pool, n.host, n.pid, n.started_ms, n.heartbeat_ms, \
                n.heartbeat_every_ms, n.workers, n.capacity::text AS capacity, n.running, \
                n.paused, n.draining, n.wanted, n.left_ms, {claims} AS claims, \
                {DATABASE_NOW_MS} AS now_ms \
           FROM {NODES_TABLE} AS n WHERE n.queue_key = $1 \
          ORDER BY n.started_ms, n.node"
    );
    let values: Vec<Value> = vec![key.into(), queue_name.map(str::to_owned).into()];
    database.rows(sql, values).await
}
