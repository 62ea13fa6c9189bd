//! Queue backends implementing [`TaskQueue`](crate::core::TaskQueue), one folder each with
//! its driver (`driver`: how a configuration's `"queue"` reaches it). The Postgres queues
//! live with the rest of the Postgres code, in [`infra::postgres`](crate::infra::postgres).
//!
//! [`QueueSettings`] is here too: a pool's `"queue"` section, one variant a backend (the
//! configuration re-exports it as `config::QueueSettings`); `registry.rs` maps a variant to
//! its backend's driver. [`InMemoryQueue`] is also here, beside its module, where code written
//! for the upstream crate imports it.

pub(crate) mod driver;
pub mod memory;
pub(crate) mod registry;
pub mod yaque;

pub use memory::InMemoryQueue;

use serde::Deserialize;

/// Where a pool's parked tasks wait: the `"queue"` of a pool in a configuration file,
/// chosen by its `"type"`.
///
/// ```
/// use prometheus_parking_lot::config::{QueueSettings, SchedulerConfig};
///
/// let config = SchedulerConfig::from_json_str(
///     r#"{ "pools": { "desktop": { "queue": { "type": "yaque", "path": "./data/queues", "stream": "llm" } } } }"#,
/// )?;
/// assert_eq!(
///     config.pools["desktop"].queue,
///     QueueSettings::Yaque { path: "./data/queues".into(), stream: "llm".into() }
/// );
/// # Ok::<(), prometheus_parking_lot::config::ConfigError>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum QueueSettings {
    /// In memory (the default): nothing survives the process.
    #[default]
    InMemory,
    /// An embedded file queue (desktop apps).
    Yaque {
        /// The queue directory.
        path: String,
        /// The stream within it.
        stream: String,
    },
    /// A Postgres table through SeaORM.
    Postgres {
        /// The table. Default `pl_queue_jobs`.
        #[serde(default = "default_queue_table")]
        table: String,
        /// The queue within the table. Default: the pool's name.
        #[serde(default)]
        queue_name: Option<String>,
        /// How long a node's claim on a task lasts without renewal, ms. Default 30,000.
        #[serde(default)]
        lease_ms: Option<u64>,
        /// Claims a task may have before a lost run dead-letters it. Default 3.
        #[serde(default)]
        max_attempts: Option<u32>,
        /// Claimed tasks a node may hold waiting for a worker, beyond those it starts at
        /// once: claims then fetch many tasks per round trip (throughput for short jobs), at
        /// the price of tasks held by a busy node while another may be idle. Default 0.
        #[serde(default)]
        claim_ahead: Option<u32>,
        /// Whether tasks may name parents they wait for (`SubmitOptions::with_depends_on`):
        /// the queue then keeps every ended task a minute, so that a child named after its
        /// parent's end finds how it ended. Without it, ended tasks are deleted at once and
        /// a task that names parents is refused. Every node of a queue sets it alike.
        /// Default false.
        #[serde(default)]
        dependencies: bool,
    },
    /// PGMQ queues (one per priority level) that many nodes share (cargo feature `pgmq`).
    PostgresPgmq {
        /// The queue name prefix: the levels are `<queue_name>_crit`, `_high`, `_norm` and
        /// `_low`, the dead letters `<queue_name>_dlq`.
        queue_name: String,
        /// How long a node's claim on a task (the message's visibility timeout) lasts without
        /// renewal, ms. Default 30,000.
        #[serde(default)]
        lease_ms: Option<u64>,
        /// The `read_ct` at which a lost run dead-letters the message. Default 3.
        #[serde(default)]
        max_attempts: Option<u32>,
        /// Claimed tasks a node may hold waiting for a worker, beyond those it starts at
        /// once: claims then fetch many tasks per round trip (throughput for short jobs), at
        /// the price of tasks held by a busy node while another may be idle. Default 0.
        #[serde(default)]
        claim_ahead: Option<u32>,
        /// Whether tasks may name parents they wait for (`SubmitOptions::with_depends_on`):
        /// the queue then remembers every ended task a minute, so that a child named after
        /// its parent's end finds how it ended. Without it, a task that names parents is
        /// refused. Every node of a queue sets it alike. Default false.
        #[serde(default)]
        dependencies: bool,
    },
}

fn default_queue_table() -> String {
    "pl_queue_jobs".into()
}

/// The queue in a Postgres table; its code lives in [`crate::infra::postgres::queue`].
#[cfg(feature = "postgres")]
pub mod postgres {
    pub use crate::infra::postgres::queue::*;
}

/// The queue on PGMQ; its code lives in [`crate::infra::postgres::pgmq`].
#[cfg(feature = "pgmq")]
pub mod pgmq {
    pub use crate::infra::postgres::pgmq::*;
}

/// The in-memory queue many pools share; its code lives in
/// [`crate::infra::queue::memory::multi_node`].
pub mod shared_memory {
    pub use crate::infra::queue::memory::multi_node::*;
}
