//! Configuration.
//!
//! - [`WorkerPoolConfig`]: one pool's settings, built in code;
//! - [`PoolConfig`]: the same in the seed API's serializable shape;
//! - [`SchedulerConfig`]: every pool of a deployment, loaded from a JSON or YAML file and
//!   validated before it is returned; `build_pools_from_scheduler_config` turns it into
//!   running pools.

mod file;
mod gpu;
mod pool;
mod quote;
mod secret;
mod strict_json;
mod validate;

pub use file::{
    DurabilityMode, FairShareSettings, MailboxSettings, MaxUnits, NotifierSettings, PoolSettings,
    QueueSettings, SchedulerConfig, StarvationSettings, StorageSettings,
};
pub use gpu::GpuSettings;
pub use pool::{PoolConfig, WorkerPoolConfig, DEFAULT_DRAIN};
pub use secret::Secret;
pub use validate::ConfigError;
