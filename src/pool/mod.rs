//! The two public faces of the engine: [`WorkerPool`](worker_pool::WorkerPool) (the
//! inference-server API) and [`ResourcePool`](resource_pool::ResourcePool) (explicit
//! backends). Both are a [`PoolClient`] over the same actor tree; neither schedules anything
//! itself.

pub mod resource_pool;
pub mod worker_pool;

use std::sync::Arc;

use prometheus_parking_lot_actors::engine::{start_pool_blocking, PoolClient, PoolSpec};

use crate::config::WorkerPoolConfig;
use crate::core::{Mailbox, PoolError, Spawn, TaskExecutor, TaskQueue};

/// Builds the engine spec from the public settings and starts the pool on `spawner`.
fn start<P, R, E>(
    config: &WorkerPoolConfig,
    executor: E,
    queue: Box<dyn TaskQueue<P>>,
    mailbox: Arc<dyn Mailbox<R>>,
    spawner: &dyn Spawn,
) -> Result<PoolClient<P, R>, PoolError>
where
    P: Send + 'static,
    R: Send + 'static,
    E: TaskExecutor<P, R> + 'static,
{
    let spec = PoolSpec {
        name: config.name.clone(),
        limits: config.limits(),
        workers: config.worker_settings(),
        default_timeout: config.timeout,
        restart: config.restart,
        executor,
        queue,
        mailbox,
        notifiers: Vec::new(),
        subscribers: Vec::new(),
        retention: config.retention,
        shared: None,
    };
    start_pool_blocking(spawner, spec)
}
