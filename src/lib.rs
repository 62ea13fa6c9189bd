//! # prometheus_parking_lot
//!
//! Keeps AI workloads from over-subscribing scarce resources (GPU memory, KV-cache blocks,
//! worker threads). Every task declares a [`ResourceCost`]; a task that fits the pool's free
//! capacity starts at once on a worker thread, one that does not is *parked*, and whenever
//! capacity frees the best-ranked parked task that fits starts.
//!
//! ## Three ways in
//!
//! **A pool in code.** [`WorkerPool`] runs your [`WorkerExecutor`](core::WorkerExecutor) on dedicated threads:
//! submit a payload with its [`TaskMetadata`] (cost, priority, deadline), get a
//! [`MailboxKey`], retrieve the result under it.
//!
//! ```
//! use std::time::Duration;
//! use prometheus_parking_lot::core::WorkerExecutor;
//! use prometheus_parking_lot::{Priority, ResourceCost, TaskMetadata, WorkerPool, WorkerPoolConfig};
//!
//! #[derive(Clone)]
//! struct Model;
//!
//! #[async_trait::async_trait]
//! impl WorkerExecutor<String, String> for Model {
//!     async fn execute(&self, prompt: String, _meta: TaskMetadata) -> String {
//!         format!("echo: {prompt}")
//!     }
//! }
//!
//! let pool = WorkerPool::new(WorkerPoolConfig::new().with_worker_count(2).with_max_units(24), Model)?;
//! let meta = TaskMetadata::new(1, ResourceCost::gpu_vram(16)).with_priority(Priority::High);
//! let key = pool.submit("hello".to_string(), meta)?;
//! assert_eq!(pool.retrieve(&key, Duration::from_secs(5))?, "echo: hello");
//! # Ok::<(), prometheus_parking_lot::PoolError>(())
//! ```
//!
//! **Pools from a configuration file.** [`SchedulerConfig::from_path`] reads and validates a
//! JSON or YAML file (every error names the field); [`build_pools_from_scheduler_config`]
//! starts its pools as [`ResourcePool`]s, with the queue (in memory, an embedded file queue,
//! PostgreSQL, pgmq), mailbox and webhook each pool names. The [`config`] module lists every
//! field; `config/` in the repository has ready files.
//!
//! ```
//! use prometheus_parking_lot::{build_pools_from_scheduler_config, QueueBuilderContext, SchedulerConfig, TokioSpawner};
//! # use prometheus_parking_lot::{TaskExecutor, TaskMetadata};
//! # #[derive(Clone)]
//! # struct Model;
//! # #[async_trait::async_trait]
//! # impl TaskExecutor<String, String> for Model {
//! #     async fn execute(&self, prompt: String, _meta: TaskMetadata) -> String { prompt }
//! # }
//!
//! let config = SchedulerConfig::from_yaml_str("pools:\n  chat: { max_units: 24, worker_threads: 2 }\n")?;
//! let built = build_pools_from_scheduler_config::<String, String, Model, TokioSpawner>(
//!     &config, &QueueBuilderContext::Embedded, None, |_pool_name| Model, TokioSpawner)?;
//! assert_eq!(built.pools["chat"].stats().total_units, 24);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! **Permits, for an engine that runs its own loop.** A [`CapacityGate`] hands out
//! [`Permit`]s ranked by the same core as tasks: a permit holds units (KV-cache blocks, say)
//! and no worker slot until it is dropped, grows and shrinks as a sequence generates, and,
//! with preemption on, is asked to yield to a request of higher priority. The guide's
//! chapter `docs/guide/permits.md` shows it; `examples/batching_engine.rs` runs an engine
//! loop on it.
//!
//! ## Where the rest is
//!
//! - [`core`]: the pool and its executor, the backend traits ([`core::TaskQueue`],
//!   [`core::Mailbox`]), limits, statuses, errors, and what an operator reads of a pool;
//!   [`core::scheduling`]: the pure parking-lot core;
//! - [`config`]: the one settings type users build, [`WorkerPoolConfig`] (the seed's
//!   [`config::PoolConfig`] and a file's pool settings convert to it), and files
//!   ([`SchedulerConfig`]);
//! - [`infra`]: the queue and mailbox backends; [`runtime`]: where a pool's actors run;
//!   [`gpu`]: GPU probes (NVML with the cargo feature `gpu`, and a fake);
//! - [`actors`]: the actor tree itself, for callers that send it messages;
//! - [`stream`] and [`running`]: streamed results, and what a running task sees of its run
//!   (its cancellation, its partial-result sink); [`slots`]: the nested-work slots;
//! - [`util`]: the serializable domain types and [`util::now_ms`];
//! - `metrics` (cargo feature `metrics`, on by default): every pool's metrics through the
//!   `metrics` facade, named for Prometheus.
//!
//! The engine (domain types, the scheduling core, the actor tree) lives in the workspace
//! member `prometheus_parking_lot_actors`; every name users need is re-exported here.
//!
//! ## The machine underneath
//!
//! Every face drives one pure state machine, [`core::scheduling::ParkingLot`]: it takes
//! tickets and the time, and answers with decisions; `PARKING_LOT.md` explains its algorithm
//! and bounds.
//!
//! ## Waiting: one naming rule
//!
//! A method named `…_blocking` blocks the calling thread; every other method that waits is
//! `async`. The exceptions are the names code written for earlier versions calls on
//! [`WorkerPool`]: its `submit`, `retrieve` and `shutdown` block, and their awaiting forms
//! are `submit_async`, `retrieve_async` and `shutdown_with_drain`. Each of those also has
//! the `…_blocking` name, so code that follows the rule reads the same on every face:
//!
//! | waits by | [`WorkerPool`] | [`ResourcePool`] | [`PoolClient`](core::PoolClient) | [`CapacityGate`] |
//! |---|---|---|---|---|
//! | awaiting | `submit_async`, `retrieve_async` | `submit`, `retrieve` | `submit`, `retrieve` | `acquire` |
//! | blocking | `submit_blocking`, `retrieve_blocking` | `submit_blocking`, `retrieve_blocking` | `submit_blocking`, `retrieve_blocking` | `acquire_blocking` |
//! | never | `stats`, `gate`, `client` | `stats`, `gate`, `client` | `stats`, `events` | `try_acquire`, `stats` |

// On docs.rs (`--cfg docsrs`, nightly) every item gated by a cargo feature shows a badge naming
// the feature; `[package.metadata.docs.rs]` in Cargo.toml turns every feature on there.
#![cfg_attr(docsrs, feature(doc_cfg))]

pub mod actors;
#[cfg(feature = "admin")]
pub mod admin;
mod builders;
pub mod config;
pub mod core;
pub mod gpu;
pub mod infra;
#[cfg(feature = "metrics")]
pub mod metrics;
#[cfg(feature = "otel")]
pub mod otel;
mod pool;
pub mod runtime;
mod settings;
pub mod util;

// The crate root holds the names a first program needs and nothing twice that has a home
// of its own: the pool faces and the permit gate, the task vocabulary, and the
// configuration-driven builders (whose only home is here). Each other public name lives in
// exactly one module; the few that also appear elsewhere are the paths `docs/API.md` lists for
// code written against earlier versions.
pub use crate::builders::{
    build_pools_from_scheduler_config, build_pools_with_gpu_probe, BuiltPools, QueueBuilderContext,
};
pub use crate::config::{SchedulerConfig, WorkerPoolConfig};
pub use crate::core::{PoolError, ScheduledTask, TaskMetadata, WorkerPool};
pub use crate::pool::gate::{Acquire, CapacityGate, PendingGrow, Permit};
pub use crate::pool::resource_pool::ResourcePool;
pub use crate::runtime::tokio_spawner::TokioSpawner;
pub use crate::util::serde::{
    ExtraCosts, MailboxKey, Priority, ResourceCost, ResourceKind, TenantId,
};
pub use prometheus_parking_lot_actors::running::{self, stream};
/// Periodic tasks: a pool's schedules (`pool.add_schedule(..)`, `"schedules"` in a config).
pub use prometheus_parking_lot_actors::schedule;
pub use prometheus_parking_lot_actors::sync::slots;
pub use prometheus_parking_lot_actors::worker::executor::TaskExecutor;
// The nested-work slots under the name earlier versions exported them by (it read as the
// token bucket, `core::Budget`, which it is not).
#[doc(hidden)]
pub use prometheus_parking_lot_actors::sync::slots as budget;

/// The README's examples, compiled and run as doc tests.
#[doc = include_str!("../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;

/// The guide's examples (`docs/guide/`), compiled and run as doc tests: one item per chapter,
/// so a failure names its chapter.
#[cfg(doctest)]
pub mod guide_doctests {
    #[doc = include_str!("../docs/guide/tasks.md")]
    pub struct Tasks;
    #[doc = include_str!("../docs/guide/permits.md")]
    pub struct Permits;
    #[doc = include_str!("../docs/guide/budgets.md")]
    pub struct Budgets;
    #[doc = include_str!("../docs/guide/slos.md")]
    pub struct Slos;
    #[doc = include_str!("../docs/guide/schedules.md")]
    pub struct Schedules;
    #[doc = include_str!("../docs/guide/configuration.md")]
    pub struct Configuration;
    #[doc = include_str!("../docs/guide/backends.md")]
    pub struct Backends;
    #[doc = include_str!("../docs/guide/fleet.md")]
    pub struct Fleet;
    #[doc = include_str!("../docs/guide/operating.md")]
    pub struct Operating;
    #[doc = include_str!("../docs/guide/troubleshooting.md")]
    pub struct Troubleshooting;
}
