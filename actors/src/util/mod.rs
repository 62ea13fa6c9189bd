//! Small leaf services the rest of the crate calls and which depend on nothing in it: the
//! wall clock, unguessable random numbers, and dropping user values whose `Drop` may panic.

pub mod clock;
#[doc(hidden)]
pub mod contain;
#[doc(hidden)]
pub mod random;
