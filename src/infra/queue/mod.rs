//! Queue backends implementing [`TaskQueue`](crate::core::TaskQueue).

pub mod memory;
