//! Queue backends implementing [`TaskQueue`](crate::core::TaskQueue), one folder each with
//! its driver (`driver`: how a configuration's `"queue"` reaches it).
//!
//! [`InMemoryQueue`] is also here, beside its module, where code written for the upstream
//! crate imports it.

pub(crate) mod driver;
pub mod memory;
pub mod pgmq;
pub mod postgres;
pub mod shared_memory;
pub mod yaque;

pub use memory::InMemoryQueue;
