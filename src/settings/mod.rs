//! What the configuration and the backends both speak: a refused setting's error
//! ([`error::ConfigError`]), how an error quotes what the user wrote ([`quote`]), the checks
//! many fields share ([`checks`]), and secrets with `${NAME}` references ([`secret`]).
//!
//! It lies below both: the file format and its validation (`crate::config`) and each
//! backend's rules for its own settings (the drivers in `crate::infra`) use it, and it uses
//! neither. Its public names are re-exported from `crate::config`, where users import them.

pub(crate) mod checks;
pub(crate) mod error;
pub(crate) mod quote;
pub(crate) mod secret;
