//! The embedded durable queue (cargo feature `yaque`): [`queue`] holds it, `store.rs` its log
//! on disk (start, appends, compaction), `record.rs` a record's bytes, `driver` its settings'
//! rules and how it opens, `os` what it asks of the operating system.

pub(crate) mod driver;
#[cfg(feature = "yaque")]
mod os;
#[cfg(feature = "yaque")]
pub mod queue;
#[cfg(feature = "yaque")]
mod record;
#[cfg(feature = "yaque")]
mod store;

#[cfg(feature = "yaque")]
pub use queue::YaqueQueue;
#[cfg(feature = "yaque")]
pub use store::Quarantined;
