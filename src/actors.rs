//! The actor tree, for callers that want to speak to it directly: spawn a supervisor with
//! [`spawn_supervisor`], start pools under it with [`start_pool`], and send a pool's
//! scheduler typed [`SchedulerRequest`]s such as `Submit` with a reply port, through the
//! actor ref [`PoolClient::scheduler`](crate::core::PoolClient::scheduler) gives.
//! [`WorkerPoolConfig::pool_spec`](crate::WorkerPoolConfig::pool_spec) builds the
//! [`PoolSpec`] from the same settings a pool takes.
//!
//! The scheduler's public protocol is requests only (submit, cancel, shutdown, stats); the
//! events that move capacity are private to the engine.
//!
//! See `examples/actor_submit.rs`.

/// The actor framework, re-exported so callers use the same version as the engine.
pub use ractor;

pub use prometheus_parking_lot_actors::engine::{spawn_supervisor, start_pool, PoolSpec};
pub use prometheus_parking_lot_actors::scheduler::actor::SchedulerActor;
pub use prometheus_parking_lot_actors::scheduler::gpu_watch::{FreeMemory, GpuWatch};
pub use prometheus_parking_lot_actors::scheduler::protocol::{SchedulerMsg, SchedulerRequest};
pub use prometheus_parking_lot_actors::supervisor::{SupervisorActor, SupervisorMsg};
pub use prometheus_parking_lot_actors::worker::WorkerSettings;
