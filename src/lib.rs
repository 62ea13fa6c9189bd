//! # prometheus_parking_lot
//!
//! Keeps AI workloads from over-subscribing scarce resources (GPU memory, KV-cache blocks,
//! worker threads). A task declares a [`ResourceCost`]; the scheduler starts it at once when
//! it fits the pool's free capacity and otherwise *parks* it, then wakes the best-ranked
//! parked task that fits whenever capacity frees.
//!
//! This crate is the public face. The engine (domain types, the pure parking-lot core and
//! the actor tree) lives in the workspace member `prometheus_parking_lot_actors`; every name
//! users need is re-exported here, at the paths existing code imports:
//!
//! - [`core`]: pools ([`WorkerPool`], [`ResourcePool`]), executors, backend traits, limits,
//!   statuses, errors and the pure scheduling core;
//! - [`config`]: pool settings; [`infra`]: queue and mailbox backends; [`gpu`]: GPU probes
//!   (NVML with the cargo feature `gpu`, and a fake); [`runtime`]: where a pool's actors
//!   run; [`actors`]: the actor tree itself, for callers that send messages;
//! - [`util::serde`]: the serializable domain types; [`util::clock::now_ms`];
//! - [`stream`] and [`running`]: streamed results, and what a running task sees of its run
//!   (its cancellation flag, its partial-result sink); [`budget`]: the nested-work slots.
//! - `metrics` (cargo feature `metrics`, on by default): every pool's metrics through the
//!   `metrics` facade, named for Prometheus.
//!
//! ```
//! use prometheus_parking_lot::{ParkingLot, PoolLimits, Priority, ResourceCost, Ticket};
//! use prometheus_parking_lot::core::scheduling::Admit;
//!
//! let mut lot = ParkingLot::new(PoolLimits::new(24, 4))?;
//! let llm = |id, units| Ticket {
//!     id,
//!     priority: Priority::Normal,
//!     cost: ResourceCost::gpu_vram(units),
//!     created_at_ms: 0,
//!     deadline_ms: None,
//!     tenant: 0,
//!     timeout_ms: None,
//! };
//! assert_eq!(lot.admit(llm(1, 16), 0), Admit::Start);
//! assert_eq!(lot.admit(llm(2, 16), 0), Admit::Park);
//! assert_eq!(lot.complete(1, 10).unwrap(), vec![2]);
//! # Ok::<(), prometheus_parking_lot::PoolError>(())
//! ```

pub mod actors;
pub mod builders;
pub mod config;
pub mod core;
pub mod gpu;
pub mod infra;
#[cfg(feature = "metrics")]
pub mod metrics;
mod pool;
pub mod runtime;
pub mod util;

pub use crate::builders::{
    build_pools_from_scheduler_config, build_pools_with_gpu_probe, BuiltPools, QueueBuilderContext,
};
pub use crate::config::{ConfigError, PoolConfig, SchedulerConfig, WorkerPoolConfig};
pub use crate::core::scheduling::{ParkingLot, Ticket};
pub use crate::core::{
    Capacity, FairShare, Mailbox, PoolError, PoolLimits, PoolStats, ResourcePool, RestartPolicy,
    ScheduledTask, Spawn, StarvationGuard, TaskExecutor, TaskMetadata, TaskQueue, TaskStatus,
    WakeState, WorkerExecutor, WorkerPool,
};
pub use crate::runtime::tokio_spawner::TokioSpawner;
pub use crate::util::serde::{MailboxKey, Priority, ResourceCost, ResourceKind, TaskId, TenantId};
pub use prometheus_parking_lot_actors::stream::ResultStream;
pub use prometheus_parking_lot_actors::{budget, running, stream};

/// The README's examples, compiled and run as doc tests.
#[doc = include_str!("../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;
