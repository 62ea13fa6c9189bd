//! Small shared pieces: the clock and the serializable domain types.

pub mod clock;
pub mod serde;
