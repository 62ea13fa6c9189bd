//! The scheduler of one pool: the pure parking-lot [`core`]; the sans-I/O shell around it
//! (`shell`), which keeps the pool's ledger and storage mode and answers events with effects;
//! the [`actor`] that hosts both, with the `driver` that carries out the effects; the
//! `inbox` that feeds it; the [`protocol`] callers speak, with its operator's part (the
//! control requests, handled in `shell/control.rs`) and the views they get back
//! ([`inspect`]); a node's part in a shared queue ([`SharedParking`], with the rest of the
//! shared mode in `shell/storage/shared/`); and the [`gpu_watch`]
//! that samples a pool's GPU.

pub mod actor;
pub mod core;
pub(crate) mod driver;
pub mod gpu_watch;
pub(crate) mod inbox;
pub mod inspect;
pub mod protocol;
pub(crate) mod shell;

pub use shell::storage::shared::SharedParking;
