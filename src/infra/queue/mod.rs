//! Queue backends implementing [`TaskQueue`](crate::core::TaskQueue).

pub mod memory;
pub mod shared_memory;
#[cfg(feature = "yaque")]
pub mod yaque;
