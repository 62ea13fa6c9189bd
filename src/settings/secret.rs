//! `${VAR}` references and secrets.
//!
//! Text fields that may hold credentials or deployment-specific values (URLs, paths, auth
//! headers) may reference environment variables as `${NAME}`; the loaders replace the
//! references after parsing, exactly once: a variable's value is taken as it is, even when it
//! holds `${` itself. A missing variable is an error naming the field and the variable.
//! Secrets keep their value out of `Debug` output, logs and error messages.

use std::fmt;

use serde::{Deserialize, Deserializer};

use super::error::ConfigError;
use super::quote;

/// A credential from the configuration (an auth header, a database URL).
///
/// `Debug` prints `Secret(***)`; only [`expose`](Secret::expose) gives the value.
///
/// ```
/// use prometheus_parking_lot::config::Secret;
/// let secret = Secret::new("Bearer hunter2");
/// assert_eq!(format!("{secret:?}"), "Secret(***)");
/// assert_eq!(secret.expose(), "Bearer hunter2");
/// ```
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    /// Wraps a value.
    pub fn new(value: impl Into<String>) -> Self {
        Self(value.into())
    }

    /// The value, for the one place that must send it.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(***)")
    }
}

impl<'de> Deserialize<'de> for Secret {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        String::deserialize(deserializer).map(Secret)
    }
}

/// Replaces the `${NAME}` references in the field at `path` with environment variables.
pub(crate) fn expand_field(path: &str, text: &mut String) -> Result<(), ConfigError> {
    *text = expand_env(text, |name| std::env::var(name).ok())
        .map_err(|problem| ConfigError::invalid(path, problem))?;
    Ok(())
}

/// Replaces the `${NAME}` references in a secret.
pub(crate) fn expand_secret(path: &str, secret: &mut Secret) -> Result<(), ConfigError> {
    expand_field(path, &mut secret.0)
}

/// Replaces every `${NAME}` in `text` with `lookup(NAME)`. The replacement is not searched
/// for references again.
fn expand_env(text: &str, lookup: impl Fn(&str) -> Option<String>) -> Result<String, String> {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(start) = rest.find("${") {
        out.push_str(&rest[..start]);
        let after = &rest[start + 2..];
        let end = after
            .find('}')
            .ok_or_else(|| "unterminated `${` reference; write `${NAME}`".to_owned())?;
        let name = &after[..end];
        let valid = name
            .chars()
            .next()
            .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
            && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
        if !valid {
            return Err(format!(
                "`${{{}}}` is not a valid environment variable reference; names are letters, digits and '_'",
                quote::name(name)
            ));
        }
        let value = lookup(name)
            .ok_or_else(|| format!("environment variable {} is not set", quote::name(name)))?;
        out.push_str(&value);
        rest = &after[end + 1..];
    }
    out.push_str(rest);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::expand_env;

    fn env(name: &str) -> Option<String> {
        (name == "TOKEN").then(|| "abc".to_owned())
    }

    #[test]
    fn references_are_replaced_and_missing_ones_named() {
        assert_eq!(expand_env("Bearer ${TOKEN}!", env).unwrap(), "Bearer abc!");
        assert_eq!(expand_env("no refs", env).unwrap(), "no refs");
        let nested = |name: &str| (name == "OUTER").then(|| "p${TOKEN}".to_owned());
        assert_eq!(expand_env("${OUTER}", nested).unwrap(), "p${TOKEN}");
        assert_eq!(
            expand_env("${MISSING}", env).unwrap_err(),
            "environment variable MISSING is not set"
        );
        assert!(expand_env("${TOKEN", env)
            .unwrap_err()
            .contains("unterminated"));
        assert!(expand_env("${1X}", env)
            .unwrap_err()
            .contains("not a valid"));
    }
}
