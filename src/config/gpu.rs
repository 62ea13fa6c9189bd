//! A pool's `"gpu"` section: which GPU its VRAM units live on, the reserve, the live guard.
//!
//! ```json
//! "llm": {
//!   "max_units": "auto",
//!   "gpu": { "devices": [0, 1], "reserve_fraction": 0.1, "live_guard": true }
//! }
//! ```
//!
//! With a `gpu` section (or `"max_units": "auto"`, which implies `"gpu": {}`), the pool's
//! `GpuVram` units are MiB of the device. `"auto"` sizes the pool at the device's total
//! memory less the reserve; a number keeps that many MiB. `device` puts the pool on one GPU
//! (default 0); `devices` makes one pool per listed GPU, named `<pool>.gpu<N>`.

use std::time::Duration;

use serde::Deserialize;

use crate::infra::queue::QueueSettings;
use crate::settings::checks::in_range;
use crate::settings::error::ConfigError;

/// The `"gpu"` section of a pool. Every field has a default.
#[derive(Debug, Clone, PartialEq, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GpuSettings {
    /// The one GPU this pool uses (its NVML index). Default 0.
    #[serde(default)]
    pub device: Option<u32>,
    /// One pool per GPU listed, each named `<pool>.gpu<N>` (instead of `device`).
    #[serde(default)]
    pub devices: Option<Vec<u32>>,
    /// The part of the device's memory the pool leaves free (driver, other processes,
    /// fragmentation), 0 to 0.9. Default 0.1.
    #[serde(default)]
    pub reserve_fraction: Option<f64>,
    /// Keep VRAM tasks parked while the device has less free memory than their cost plus
    /// the reserve (another process is using the card). Default off.
    #[serde(default)]
    pub live_guard: bool,
    /// How often free memory is sampled, ms. Default 100.
    #[serde(default)]
    pub sample_ms: Option<u64>,
}

/// The highest device index a configuration may name.
const MAX_DEVICE: u32 = 255;
const MAX_RESERVE_FRACTION: f64 = 0.9;
const MAX_SAMPLE_MS: u64 = 60_000;

impl GpuSettings {
    /// The default reserve: a tenth of the device.
    pub const DEFAULT_RESERVE_FRACTION: f64 = 0.1;
    /// The default sampling interval.
    pub const DEFAULT_SAMPLE: Duration = Duration::from_millis(100);

    /// The devices this section puts pools on, in the order given.
    pub fn device_indexes(&self) -> Vec<u32> {
        match (&self.devices, self.device) {
            (Some(devices), _) => devices.clone(),
            (None, device) => vec![device.unwrap_or(0)],
        }
    }

    /// Whether the section makes one pool per device (`devices`), named `<pool>.gpu<N>`.
    pub fn one_pool_per_device(&self) -> bool {
        self.devices.is_some()
    }

    /// The reserve fraction, or its default.
    pub fn reserve(&self) -> f64 {
        self.reserve_fraction
            .unwrap_or(Self::DEFAULT_RESERVE_FRACTION)
    }

    /// The sampling interval, or its default.
    pub fn sample_interval(&self) -> Duration {
        self.sample_ms
            .map_or(Self::DEFAULT_SAMPLE, Duration::from_millis)
    }

    /// The number of pools this section makes of one configured pool.
    pub(super) fn pool_count(&self) -> usize {
        self.devices.as_ref().map_or(1, Vec::len)
    }

    /// Checks the section of the pool at `path` (`pools.<name>`), whose queue is `queue`.
    pub(super) fn validate(&self, path: &str, queue: &QueueSettings) -> Result<(), ConfigError> {
        let at = format!("{path}.gpu");
        if let Some(device) = self.device {
            in_range(&at, "device", device, 0, MAX_DEVICE)?;
        }
        if let Some(devices) = &self.devices {
            self.validate_devices(&at, devices, queue)?;
        }
        if let Some(fraction) = self.reserve_fraction {
            in_range(&at, "reserve_fraction", fraction, 0.0, MAX_RESERVE_FRACTION)?;
        }
        if let Some(sample_ms) = self.sample_ms {
            in_range(&at, "sample_ms", sample_ms, 1, MAX_SAMPLE_MS)?;
        }
        Ok(())
    }

    fn validate_devices(
        &self,
        at: &str,
        devices: &[u32],
        queue: &QueueSettings,
    ) -> Result<(), ConfigError> {
        let field = format!("{at}.devices");
        if self.device.is_some() {
            return Err(ConfigError::invalid(
                field,
                "gpu.device is set too; set one of the two (device: this pool on one GPU; \
                 devices: one pool per GPU)",
            ));
        }
        if devices.is_empty() {
            return Err(ConfigError::invalid(
                field,
                "is empty; list at least one device index",
            ));
        }
        for (position, &device) in devices.iter().enumerate() {
            if device > MAX_DEVICE {
                return Err(ConfigError::invalid(
                    format!("{field}[{position}]"),
                    format!("{device} is out of range; use 0 to {MAX_DEVICE}"),
                ));
            }
            if devices[..position].contains(&device) {
                return Err(ConfigError::invalid(
                    field,
                    format!("device {device} is listed twice; list each device once"),
                ));
            }
        }
        if *queue != QueueSettings::InMemory {
            return Err(ConfigError::invalid(
                field,
                "one pool per device needs the in_memory queue: each pool owns its queue, and \
                 this one names a single durable queue; define one pool per device instead, \
                 each with \"gpu\": {\"device\": N} and its own queue",
            ));
        }
        Ok(())
    }
}
