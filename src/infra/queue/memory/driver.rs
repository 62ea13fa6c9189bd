//! The in-memory queue's driver: no settings, owned by its pool, nothing kept across a
//! restart.

use crate::infra::queue::driver::{QueueDriver, QueueRules};
use crate::settings::error::ConfigError;

/// The `"type"` of the in-memory queue.
pub(crate) const TYPE: &str = "in_memory";

/// The driver of `{"type": "in_memory"}`.
pub(crate) struct MemoryDriver;

impl QueueRules for MemoryDriver {
    fn type_name(&self) -> &'static str {
        TYPE
    }

    fn feature(&self) -> Option<&'static str> {
        None
    }

    fn validate(&self, _path: &str) -> Result<(), ConfigError> {
        Ok(())
    }

    fn describe(&self, _pool: &str) -> String {
        "in-memory queue".into()
    }

    fn storage_key(&self, _pool: &str) -> Option<(&'static str, String, String)> {
        None
    }

    fn is_durable(&self) -> bool {
        false
    }
}

impl<P: Send + 'static> QueueDriver<P> for MemoryDriver {}
