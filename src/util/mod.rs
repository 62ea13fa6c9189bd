//! Small shared pieces: the clock and the serializable domain types.

pub mod clock;
pub(crate) mod redact;
pub mod serde;
