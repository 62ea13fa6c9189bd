//! The scheduler of one pool: the pure parking-lot [`core`]; the sans-I/O shell around it
//! (`shell`), which keeps the pool's ledger and storage mode and answers events with effects;
//! the [`actor`] that hosts both, with the `driver` that carries out the effects; the
//! `inbox` that feeds it; the [`protocol`] callers speak, with its operator's part (the
//! control requests, handled in `shell/control.rs`) and the views they get back
//! ([`inspect`]); the I/O side of a shared queue ([`shared_io`]); and the [`gpu_watch`]
//! that samples a pool's GPU.

pub mod actor;
pub mod core;
pub(crate) mod driver;
pub mod gpu_watch;
pub(crate) mod inbox;
pub mod inspect;
pub mod protocol;
pub mod shared_io;
pub(crate) mod shell;
