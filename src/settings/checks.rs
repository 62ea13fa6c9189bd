//! The checks many fields share, each with the one message it gives: a number in a range, a
//! name, an SQL identifier.
//!
//! Its own file because the pool rules ([`validate`](super::validate)), the `"gpu"`
//! section's rules ([`gpu`](super::gpu)) and each queue backend's driver (its
//! `QueueRules`, beside the backend in `infra::queue`) use them.

use std::fmt::Display;

use super::error::ConfigError;
use super::quote;

/// `Ok` when `min <= value <= max`; otherwise an error naming `path.field`, the value and
/// the range allowed.
pub(crate) fn in_range<T: PartialOrd + Display>(
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

/// Names that end up in thread names and file names.
pub(crate) fn check_name(path: &str, what: &str, name: &str) -> Result<(), ConfigError> {
    let valid = (1..=64).contains(&name.len())
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
    if valid {
        return Ok(());
    }
    Err(ConfigError::invalid(
        path,
        format!(
            "{} is not allowed; {what} are 1 to 64 of the characters a-z A-Z 0-9 _ -",
            quote::value(name)
        ),
    ))
}

/// The longest SQL identifier PostgreSQL keeps whole.
pub(crate) const MAX_IDENTIFIER: usize = 63;

/// Table and queue names go into SQL: only plain identifiers, never quoted text.
pub(crate) fn check_identifier(path: &str, name: &str, max_len: usize) -> Result<(), ConfigError> {
    let mut chars = name.chars();
    let valid = chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
        && name.len() <= max_len;
    if valid {
        return Ok(());
    }
    Err(ConfigError::invalid(
        path,
        format!(
            "{} is not a safe SQL identifier; use a letter or '_' followed by letters, digits or '_', at most {max_len} characters",
            quote::value(name)
        ),
    ))
}
