//! The scheduler: the pure parking-lot [`core`], the [`state`] that carries out its
//! decisions, the [`actor`] that hosts them, the [`inbox`] that feeds them, and the
//! [`protocol`] callers speak.

pub mod actor;
pub mod core;
pub(crate) mod inbox;
pub mod protocol;
pub mod shared;
pub(crate) mod state;
