//! [`ConfigError`]: why a configuration was refused.
//!
//! Its own file because every step of loading a configuration (parsing, `${NAME}`
//! replacement, validation) reports through it, and none of those steps should need another
//! to name its errors.

use thiserror::Error;

use crate::core::PoolError;
use crate::util::redact;

/// Why a configuration was refused.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum ConfigError {
    /// A field is wrong: `path` names it, `problem` says what is allowed.
    #[error("{path}: {problem}")]
    Invalid {
        /// The dotted path of the field, like `pools.llm.max_units`.
        path: String,
        /// What is wrong and what is allowed.
        problem: String,
    },
    /// The text is not valid JSON or YAML.
    #[error("not valid {format}: {reason}")]
    Syntax {
        /// `JSON` or `YAML`.
        format: &'static str,
        /// The parser's message, with its position.
        reason: String,
    },
    /// The file could not be read.
    #[error("cannot read {file}: {reason}")]
    Unreadable {
        /// The file.
        file: String,
        /// Why.
        reason: String,
    },
    /// The file's extension names no known format.
    #[error("{file}: unknown configuration format; use a .json, .yaml or .yml file")]
    UnknownFormat {
        /// The file.
        file: String,
    },
}

impl ConfigError {
    /// An error about one field. Credentials in the text (a URL's password, a `token=`
    /// value) are masked: the problem may quote what the user wrote.
    pub fn invalid(path: impl Into<String>, problem: impl Into<String>) -> Self {
        ConfigError::Invalid {
            path: redact::text(&path.into()),
            problem: redact::text(&problem.into()),
        }
    }

    /// The text is not valid `format`; the parser's `reason` may quote the document, so its
    /// credentials are masked.
    pub(crate) fn syntax(format: &'static str, reason: &str) -> Self {
        ConfigError::Syntax {
            format,
            reason: redact::text(reason),
        }
    }
}

impl From<ConfigError> for PoolError {
    fn from(error: ConfigError) -> Self {
        PoolError::InvalidConfig(error.to_string())
    }
}
