//! The scheduler: the pure parking-lot [`core`], the [`state`] that carries out its
//! decisions, the [`actor`] that hosts them, the [`inbox`] that feeds them, the
//! [`protocol`] callers speak, and the [`gpu_watch`] that samples a pool's GPU.

pub mod actor;
pub mod core;
pub mod gpu_watch;
pub(crate) mod inbox;
pub mod protocol;
pub mod shared;
pub(crate) mod state;
