//! Queue backends implementing [`TaskQueue`](crate::core::TaskQueue).

pub mod memory;
#[cfg(feature = "pgmq")]
pub mod pgmq;
#[cfg(feature = "postgres")]
pub mod postgres;
pub mod shared_memory;
#[cfg(feature = "yaque")]
pub mod yaque;
