//! The scheduler of one pool: the pure parking-lot [`core`]; the sans-I/O shell around it
//! (`shell`), which keeps the pool's ledger and storage mode and answers events with effects;
//! the [`actor`] that hosts both, with the `driver` that carries out the effects; the
//! `inbox` that feeds it; the [`protocol`] callers speak, and its operator's part, the
//! [`control`] requests; the I/O side of a [`shared`]
//! queue; and the [`gpu_watch`] that samples a pool's GPU.

pub mod actor;
pub mod control;
pub mod core;
pub(crate) mod driver;
pub mod gpu_watch;
pub(crate) mod inbox;
pub mod protocol;
pub mod shared;
pub(crate) mod shell;
