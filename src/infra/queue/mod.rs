//! Queue backends implementing [`TaskQueue`](crate::core::TaskQueue).
//!
//! [`InMemoryQueue`] is also here, beside its module, where code written for the upstream
//! crate imports it.

pub mod memory;
#[cfg(feature = "pgmq")]
pub mod pgmq;
#[cfg(feature = "postgres")]
pub mod postgres;
pub mod shared_memory;
#[cfg(feature = "yaque")]
pub mod yaque;

pub use memory::InMemoryQueue;
