//! Loading a [`SchedulerConfig`]: read the file, parse it, replace its `${NAME}` references,
//! validate it.
//!
//! Both formats are read into one JSON value first (a key given twice in one mapping is an
//! error in both), then deserialized with the path of every field tracked, then their
//! `${NAME}` references are replaced, once, then validated (see
//! [`validate`](super::validate)). So a YAML file and a JSON file with the same content
//! behave the same, and every error names the field it is about, like
//! `pools.llm_inference.queue.queue_name`, in the configuration's words (see
//! [`wording`](super::wording)).

use std::path::Path;

use super::file::SchedulerConfig;
use super::mailbox::NotifierSettings;
use super::{strict_json, upstream_forms, wording};
use crate::infra::queue::QueueSettings;
use crate::settings::error::ConfigError;
use crate::settings::quote;
use crate::settings::secret::{expand_field, expand_secret};

impl SchedulerConfig {
    /// Reads a configuration file; `.json` is JSON, `.yaml` / `.yml` YAML.
    pub fn from_path(path: impl AsRef<Path>) -> Result<Self, ConfigError> {
        let path = path.as_ref();
        let shown = path.display().to_string();
        let extension = path
            .extension()
            .and_then(|e| e.to_str())
            .unwrap_or_default();
        let read = |path: &Path| {
            std::fs::read_to_string(path).map_err(|error| ConfigError::Unreadable {
                file: shown.clone(),
                reason: error.to_string(),
            })
        };
        match extension.to_ascii_lowercase().as_str() {
            "json" => Self::from_json_str(&read(path)?),
            "yaml" | "yml" => Self::from_yaml_str(&read(path)?),
            _ => Err(ConfigError::UnknownFormat { file: shown }),
        }
    }

    /// Parses and validates JSON.
    pub fn from_json_str(text: &str) -> Result<Self, ConfigError> {
        Self::from_value(strict_json::parse(text)?)
    }

    /// Parses and validates YAML.
    pub fn from_yaml_str(text: &str) -> Result<Self, ConfigError> {
        let value = serde_saphyr::from_str(text)
            .map_err(|error| ConfigError::syntax("YAML", &error.to_string()))?;
        Self::from_value(value)
    }

    /// Deserializes an already parsed document, replaces its `${NAME}` references and
    /// validates it. A pool's `runtime`, which upstream's files write, is checked (`native`
    /// or `tokio`) and set aside first: there is one runtime.
    ///
    /// This is the one place references are replaced: the returned configuration holds the
    /// values, and nothing (building pools included) looks for references in them again, so
    /// a secret that contains `${` is kept as it is. A configuration deserialized some other
    /// way gets no replacement; read it into a `serde_json::Value` and call this instead.
    pub fn from_value(mut value: serde_json::Value) -> Result<Self, ConfigError> {
        upstream_forms::set_runtimes_aside(&mut value)?;
        let written: Self = serde_path_to_error::deserialize(value).map_err(|error| {
            ConfigError::invalid(
                quote::path(error.path()),
                quote::problem(&wording::problem(&error.inner().to_string())),
            )
        })?;
        let config = written.clone().with_environment()?;
        config.validate_quoting(&written)?;
        Ok(config)
    }

    /// The same configuration with every `${NAME}` reference replaced. Fields that may hold
    /// references: `database_url`, `admin.bind` and `admin.token`, a yaque queue's `path`, a
    /// notifier's `base_url`, `auth_header` and `hmac_secret`.
    fn with_environment(mut self) -> Result<Self, ConfigError> {
        if let Some(url) = &mut self.database_url {
            expand_secret("database_url", url)?;
        }
        if let Some(admin) = &mut self.admin {
            if let Some(bind) = &mut admin.bind {
                expand_field("admin.bind", bind)?;
            }
            if let Some(token) = &mut admin.token {
                expand_secret("admin.token", token)?;
            }
        }
        for (name, pool) in &mut self.pools {
            let name = quote::name(name);
            if let QueueSettings::Yaque { path, .. } = &mut pool.queue {
                expand_field(&format!("pools.{name}.queue.path"), path)?;
            }
            if let Some(NotifierSettings::Http {
                base_url,
                auth_header,
                hmac_secret,
                ..
            }) = &mut pool.mailbox.notifier
            {
                let at = format!("pools.{name}.mailbox.notifier");
                expand_field(&format!("{at}.base_url"), base_url)?;
                if let Some(header) = auth_header {
                    expand_secret(&format!("{at}.auth_header"), header)?;
                }
                if let Some(secret) = hmac_secret {
                    expand_secret(&format!("{at}.hmac_secret"), secret)?;
                }
            }
        }
        Ok(self)
    }
}
