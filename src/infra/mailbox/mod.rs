//! Mailbox backends implementing [`Mailbox`](crate::core::Mailbox).
//!
//! [`InMemoryMailbox`] is also here, beside its module, where code written for the upstream
//! crate imports it.

pub mod memory;
#[cfg(feature = "postgres")]
pub mod postgres;

pub use memory::InMemoryMailbox;
