//! The range check most numeric fields share, and the one message it gives.
//!
//! Its own file because the pool rules ([`validate`](super::validate)) and the `"gpu"`
//! section's rules ([`gpu`](super::gpu)) both use it.

use std::fmt::Display;

use super::error::ConfigError;

/// `Ok` when `min <= value <= max`; otherwise an error naming `path.field`, the value and
/// the range allowed.
pub(super) fn in_range<T: PartialOrd + Display>(
    path: &str,
    field: &str,
    value: T,
    min: T,
    max: T,
) -> Result<(), ConfigError> {
    if value < min || value > max {
        return Err(ConfigError::invalid(
            format!("{path}.{field}"),
            format!("{value} is out of range; use {min} to {max}"),
        ));
    }
    Ok(())
}
