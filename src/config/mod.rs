//! Configuration: one pool's settings in code, or every pool of a deployment from a file.
//!
//! - [`WorkerPoolConfig`]: one pool's settings, built in code (`with_*` calls);
//! - [`PoolConfig`]: the same in the seed API's serializable shape;
//! - [`SchedulerConfig`]: every pool of a deployment, loaded from a JSON or YAML file and
//!   validated before it is returned; `build_pools_from_scheduler_config` turns it into
//!   running pools. A pool's fields are those of [`PoolSettings`] (each documented with its
//!   default), its `"queue"` a [`QueueSettings`], its `"mailbox"` a [`MailboxSettings`], its
//!   `"gpu"` a [`GpuSettings`]. The upstream crate's short forms load too: a backend without
//!   settings named by a string (`"queue": "in_memory"`, `"mailbox": "postgres"`) and
//!   a pool's `"runtime": "native"`, checked and set aside (there is one runtime).
//!
//! Errors are [`ConfigError`]s that name the field (`pools.chat.max_units`), what was found
//! and what is allowed, in the configuration's words: a misspelt field suggests the likely
//! one, and a wrong type says "a whole number" rather than a Rust type. Text fields that may
//! hold credentials or deployment values may reference environment variables as `${NAME}`.

mod file;
mod fleet;
mod gpu;
mod load;
mod mailbox;
mod pool;
mod schedules;
mod strict_json;
mod upstream_forms;
mod validate;
mod wording;

pub use crate::infra::queue::QueueSettings;
pub use crate::settings::error::ConfigError;
pub use crate::settings::quote::escape_controls;
pub use crate::settings::secret::Secret;
pub use file::{
    ByUseSettings, DurabilityMode, FairShareSettings, MaxUnits, PoolSettings, SchedulerConfig,
    StarvationSettings,
};
pub use fleet::FleetSection;
pub use gpu::GpuSettings;
pub use mailbox::{MailboxSettings, NotifierSettings, StorageSettings};
pub use pool::{PoolConfig, WorkerPoolConfig, DEFAULT_DRAIN};
pub use schedules::{CostSettings, PriorityName, ScheduleSettings};
#[cfg(feature = "admin")]
pub(crate) use validate::host_problem;
