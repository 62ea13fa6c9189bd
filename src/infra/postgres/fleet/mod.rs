//! The fleet of a shared queue: which nodes serve it, how each is, and what waits in it, read
//! from the database by any node, and the operator's requests to one node or all of them.
//!
//! | file | what it holds |
//! |---|---|
//! | `registry.rs` | the node table ([`NODES_TABLE`]): a row per node, its heartbeat, its state and what an operator asked of it |
//! | `heartbeat.rs` | [`NodeHeartbeat`], the duty that keeps a node's row, and [`FleetMember`], the thread that runs it |
//! | `view.rs` | [`FleetView`]: the nodes and their health, the parked tasks in rank order, the budgets |
//! | `reasons.rs` | why a parked task waits, from what the database holds |
//! | `seats.rs` | the fleet places of pools built from a configuration |
//!
//! A node registers itself under the queue's key (the same key the fleet's budgets and
//! tenant counters use: backend, place and queue name) and its node name in the queue's
//! leases, so its claims can be told apart. Every [`heartbeat`](FleetSettings::heartbeat) it
//! writes its state; a node whose last heartbeat is older than
//! [`STALE_AFTER_BEATS`] heartbeats is *stale*: it may have died, and the tasks it claimed are
//! at risk until their leases run out and another node rescues them. A node that stops
//! cleanly marks itself gone.
//!
//! Control travels through the same row: a request (pause, resume, drain, undrain) is written
//! to the target's `wanted` column, and the target's next heartbeat takes it and carries it out
//! with its own pause or drain, so any node's admin server controls every node.

mod heartbeat;
mod reasons;
mod registry;
mod seats;
mod view;

use crate::core::QueueOrder;
use std::time::Duration;

pub use heartbeat::{FleetMember, NodeHeartbeat};
pub use reasons::ParkedReason;
pub use registry::{NodeAction, FORGET_AFTER_MS, NODES_TABLE};
pub(crate) use seats::{fleet_queue, Seats};
pub use view::{BudgetLevel, FleetNode, FleetParked, FleetView, NodeHealth, ParkedPage};

use super::Identifier;
use crate::core::PoolError;

/// How many heartbeats a node may miss before the fleet shows it as stale.
pub const STALE_AFTER_BEATS: u64 = 3;

/// Which shared queue a fleet serves: its backend and where its tasks live.
///
/// ```
/// use prometheus_parking_lot::infra::postgres::fleet::FleetQueue;
///
/// let queue = FleetQueue::table("pl_queue_jobs", "llm").unwrap();
/// assert_eq!(queue.key(), "postgres table pl_queue_jobs llm");
/// assert!(FleetQueue::table("jobs; DROP TABLE x", "llm").is_err());
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FleetQueue {
    /// The backend's name: `postgres` or `postgres_pgmq`.
    backend: &'static str,
    /// The queue table, for the table queue: where the fleet's parked tasks are read (none:
    /// the pgmq queues of `queue_name`).
    table: Option<Identifier>,
    /// The queue's name (its rows' `queue_name`, or PGMQ's prefix).
    queue_name: String,
    /// The queue's key: backend, place and queue name, as the budgets' rows are keyed.
    key: String,
    /// The order its claims take a priority's tasks in, which its listing follows.
    order: QueueOrder,
}

impl FleetQueue {
    /// The queue `queue_name` of the Postgres table `table` (`"type": "postgres"`).
    pub fn table(table: &str, queue_name: &str) -> Result<Self, PoolError> {
        let table = Identifier::new(table)?;
        Ok(Self {
            backend: "postgres",
            key: format!("postgres table {table} {queue_name}"),
            table: Some(table),
            queue_name: queue_name.to_owned(),
            order: QueueOrder::Fifo,
        })
    }

    /// The same queue, whose claims take a priority's tasks in `order` (a queue opened with
    /// `PostgresQueue::open_in_order` or `PgmqQueue::open_in_order`): its parked tasks are
    /// listed, and their places counted, in that order.
    pub fn in_order(mut self, order: QueueOrder) -> Self {
        self.order = order;
        self
    }

    /// The order its parked tasks are listed in.
    pub fn order(&self) -> QueueOrder {
        self.order
    }

    /// The PGMQ queues of `queue_name` (`"type": "postgres_pgmq"`): its parked tasks are the
    /// messages of its levels' queues that no node holds (read with the `pgmq` feature).
    pub fn pgmq(queue_name: &str) -> Self {
        Self {
            backend: "postgres_pgmq",
            table: None,
            queue_name: queue_name.to_owned(),
            order: QueueOrder::Fifo,
            key: format!(
                "postgres_pgmq pgmq queues {queue_name}_crit .. {queue_name}_low, {queue_name}_dlq {queue_name}"
            ),
        }
    }

    /// The queue's key in the fleet's tables.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// The queue's name.
    pub fn queue_name(&self) -> &str {
        &self.queue_name
    }

    /// The backend's name.
    pub fn backend(&self) -> &'static str {
        self.backend
    }
}

/// How a node takes part in its fleet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FleetSettings {
    /// How often the node writes its heartbeat and takes the operator's requests.
    pub heartbeat: Duration,
}

impl FleetSettings {
    /// The default heartbeat: every 5 s (a node is stale after 15 s without one).
    pub const DEFAULT_HEARTBEAT: Duration = Duration::from_secs(5);

    /// How long a node may go without a heartbeat before the fleet shows it as stale.
    pub fn stale_after(&self) -> Duration {
        self.heartbeat * STALE_AFTER_BEATS as u32
    }
}

impl Default for FleetSettings {
    fn default() -> Self {
        Self {
            heartbeat: Self::DEFAULT_HEARTBEAT,
        }
    }
}

/// Milliseconds as the tables hold them.
fn millis(duration: Duration) -> i64 {
    i64::try_from(duration.as_millis()).unwrap_or(i64::MAX)
}
