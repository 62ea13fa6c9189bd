//! Small shared pieces: the clock and the serializable domain types.
//!
//! Both are also re-exported here, so `util::{Priority, ResourceCost, TaskId, now_ms}` works
//! as well as `util::serde::Priority` and `util::clock::now_ms` (code written for the
//! upstream crate uses either).
//!
//! ```
//! use prometheus_parking_lot::util::{now_ms, Priority, ResourceCost, ResourceKind};
//!
//! let cost = ResourceCost { kind: ResourceKind::GpuVram, units: 16 };
//! assert_eq!(cost, ResourceCost::gpu_vram(16));
//! assert!(Priority::High > Priority::Normal);
//! assert!(now_ms() > 0);
//! ```

pub mod clock;
pub(crate) mod redact;
pub mod serde;

pub use self::clock::*;
pub use self::serde::*;
