//! How the engine's threads wait and share without locks: the waiting primitives the
//! callers, the scheduler and the workers are built on.
//!
//! - [`parker`]: the three-state parker a caller outside any async runtime sleeps on, and
//!   [`block_on_until`](parker::block_on_until), which waits for a future on a plain thread;
//! - `spin`: bounded spinning, how a waiting side re-checks for a few microseconds before
//!   it sleeps;
//! - [`slots`]: the lock-free nested-work slots that keep a pool's own workers from
//!   deadlocking it (not to be confused with a kind's token bucket,
//!   [`domain::Budget`](crate::domain::Budget)).
//!
//! None of them knows a pool: they depend on nothing else in the crate.

pub mod parker;
pub mod slots;
pub(crate) mod spin;
