//! The yaque queue's driver: its settings' rules, and how it opens (cargo feature `yaque`).

use crate::core::{PoolError, TaskQueue};
use crate::infra::queue::driver::{QueueDriver, QueueRules};
use crate::settings::checks::check_name;
use crate::settings::error::ConfigError;
use crate::settings::quote;

/// The `"type"` of the yaque queue.
pub(crate) const TYPE: &str = "yaque";

/// The driver of `{"type": "yaque", "path": ..., "stream": ...}`.
pub(crate) struct YaqueDriver<'a> {
    /// The queue directory.
    pub(crate) path: &'a str,
    /// The stream within it.
    pub(crate) stream: &'a str,
}

impl QueueRules for YaqueDriver<'_> {
    fn type_name(&self) -> &'static str {
        TYPE
    }

    fn feature(&self) -> Option<&'static str> {
        Some("yaque")
    }

    fn validate(&self, path: &str) -> Result<(), ConfigError> {
        if self.path.trim().is_empty() {
            return Err(ConfigError::invalid(
                format!("{path}.path"),
                "is empty; give the directory of the queue files",
            ));
        }
        check_name(&format!("{path}.stream"), "stream names", self.stream)
    }

    fn describe(&self, _pool: &str) -> String {
        format!(
            "yaque stream {} in {}",
            quote::name(self.stream),
            quote::name(self.path)
        )
    }

    fn storage_key(&self, _pool: &str) -> Option<(&'static str, String, String)> {
        Some((TYPE, self.path.to_owned(), self.stream.to_owned()))
    }
}

impl<P> QueueDriver<P> for YaqueDriver<'_>
where
    P: serde::Serialize + serde::de::DeserializeOwned + Send + 'static,
{
    #[cfg(feature = "yaque")]
    fn open_local(&self, pool: &str) -> Result<Box<dyn TaskQueue<P>>, PoolError> {
        let queue = super::YaqueQueue::open(self.path, self.stream).map_err(|error| {
            let reason = match error {
                crate::core::QueueError::Backend(fault) => fault.detail,
                other => other.to_string(),
            };
            PoolError::InvalidConfig(format!(
                "pools.{pool}.queue.path: {reason}; give a directory this process can \
                 create and write, in which no other running process has this stream open"
            ))
        })?;
        Ok(Box::new(queue))
    }

    /// Reached only in builds without the feature, after the builder refused the pool.
    #[cfg(not(feature = "yaque"))]
    fn open_local(&self, pool: &str) -> Result<Box<dyn TaskQueue<P>>, PoolError> {
        Err(PoolError::Internal(format!(
            "pools.{pool}.queue: this build has no such queue"
        )))
    }
}
