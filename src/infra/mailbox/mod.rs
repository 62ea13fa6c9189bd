//! Mailbox backends implementing [`Mailbox`](crate::core::Mailbox).

pub mod memory;
#[cfg(feature = "postgres")]
pub mod postgres;
