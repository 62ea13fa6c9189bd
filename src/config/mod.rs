//! Configuration.
//!
//! - [`WorkerPoolConfig`]: one pool's settings, built in code;
//! - [`PoolConfig`]: the same in the seed API's serializable shape;
//! - [`SchedulerConfig`]: every pool of a deployment, loaded from a JSON or YAML file and
//!   validated before it is returned; `build_pools_from_scheduler_config` turns it into
//!   running pools.

mod error;
mod file;
mod gpu;
mod load;
mod pool;
mod queue;
mod quote;
mod range;
mod secret;
mod strict_json;
mod validate;
mod wording;

pub use error::ConfigError;
pub use file::{
    DurabilityMode, FairShareSettings, MailboxSettings, MaxUnits, NotifierSettings, PoolSettings,
    SchedulerConfig, StarvationSettings, StorageSettings,
};
pub use gpu::GpuSettings;
pub use pool::{PoolConfig, WorkerPoolConfig, DEFAULT_DRAIN};
pub use queue::QueueSettings;
pub use secret::Secret;
