//! The actor tree, for callers that want to speak to it directly: spawn a
//! [`SupervisorActor`], start pools under it with [`start_pool`], and send the scheduler
//! typed messages such as [`SchedulerMsg::Submit`] with a reply port.
//!
//! See `examples/actor_submit.rs`.

/// The actor framework, re-exported so callers use the same version as the engine.
pub use ractor;

pub use prometheus_parking_lot_actors::engine::{
    spawn_supervisor, start_pool, PoolClient, PoolSpec,
};
pub use prometheus_parking_lot_actors::mailbox::actor::{MailboxActor, MailboxMsg};
pub use prometheus_parking_lot_actors::queue::actor::{QueueActor, QueueMsg};
pub use prometheus_parking_lot_actors::scheduler::actor::{
    SchedulerActor, SchedulerMsg, ShutdownReport, SubmitOptions,
};
pub use prometheus_parking_lot_actors::supervisor::{
    RestartPolicy, SupervisorActor, SupervisorMsg,
};
pub use prometheus_parking_lot_actors::worker::actor::{WorkerActor, WorkerMsg};
pub use prometheus_parking_lot_actors::worker::WorkerSettings;
