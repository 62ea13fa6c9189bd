//! Sizing pools from GPUs: what `"max_units": "auto"` and a pool's `gpu` section become when
//! pools are built from a configuration.
//!
//! A pool that uses a GPU counts its `GpuVram` units in MiB of the device. Its capacity is
//! the device's total memory less the reserve (`"auto"`), or the number it gives, which must
//! fit in that. Every pool is probed before any starts, so a missing GPU leaves nothing
//! half-built.

use std::sync::{Arc, OnceLock};

use prometheus_parking_lot_actors::scheduler::gpu_watch::{FreeMemory, GpuWatch};

use super::{GpuDevice, GpuError, GpuProbe, MIB};
use crate::config::{GpuSettings, MaxUnits, PoolSettings};
use crate::core::PoolError;

/// One pool to start, as a configured pool and its GPU settings describe it.
pub(crate) struct PlannedPool {
    /// Its name: the configured one, or `<pool>.gpu<N>` for one of several devices.
    pub name: String,
    /// Units of every kind (MiB of the device for a GPU pool).
    pub units: u32,
    /// The GPU it watches, if it uses one.
    pub gpu: Option<GpuWatch>,
}

/// Where the builder gets its GPU probe.
pub(crate) enum GpuSource {
    /// The caller's.
    Given(Arc<dyn GpuProbe>),
    /// NVML, loaded when the first pool needs it (cargo feature `gpu`; without it, none).
    Nvml(OnceLock<Result<Arc<dyn GpuProbe>, GpuError>>),
}

impl GpuSource {
    /// NVML, loaded on first use.
    pub fn nvml() -> Self {
        GpuSource::Nvml(OnceLock::new())
    }

    /// Whether this build can size pools from a GPU: a probe was given, or NVML is built in.
    pub fn available(&self) -> bool {
        matches!(self, GpuSource::Given(_)) || cfg!(feature = "gpu")
    }

    fn probe(&self) -> Result<Arc<dyn GpuProbe>, GpuError> {
        match self {
            GpuSource::Given(probe) => Ok(probe.clone()),
            GpuSource::Nvml(loaded) => loaded.get_or_init(load_nvml).clone(),
        }
    }
}

#[cfg(feature = "gpu")]
fn load_nvml() -> Result<Arc<dyn GpuProbe>, GpuError> {
    super::NvmlProbe::new().map(|nvml| Arc::new(nvml) as Arc<dyn GpuProbe>)
}

#[cfg(not(feature = "gpu"))]
fn load_nvml() -> Result<Arc<dyn GpuProbe>, GpuError> {
    Err(GpuError::LibraryNotFound {
        detail: "this build of prometheus_parking_lot has no NVML support (cargo feature `gpu`)"
            .into(),
    })
}

/// The pools configured pool `name` becomes: itself, sized from its GPU if it uses one, or
/// one pool per device its `gpu.devices` lists.
pub(crate) fn plan(
    name: &str,
    pool: &PoolSettings,
    gpus: &GpuSource,
) -> Result<Vec<PlannedPool>, PoolError> {
    let Some(settings) = pool.gpu_settings() else {
        let MaxUnits::Units(units) = pool.max_units else {
            return Err(PoolError::Internal(format!(
                "pools.{name}: \"auto\" without GPU settings"
            )));
        };
        let units = u32::try_from(units).map_err(|_| {
            PoolError::InvalidConfig(format!(
                "pools.{name}.max_units: {units} exceeds {}",
                u32::MAX
            ))
        })?;
        return Ok(vec![PlannedPool {
            name: name.to_owned(),
            units,
            gpu: None,
        }]);
    };
    let sizing = Sizing {
        name,
        pool,
        settings: &settings,
    };
    let probe = gpus.probe();
    settings
        .device_indexes()
        .into_iter()
        .map(|index| {
            let probe = probe
                .clone()
                .map_err(|error| sizing.cannot_probe(index, error))?;
            let device = probe
                .device(index)
                .map_err(|error| sizing.cannot_probe(index, error))?;
            sizing.pool_on(device, probe)
        })
        .collect()
}

/// One configured GPU pool being sized.
struct Sizing<'a> {
    name: &'a str,
    pool: &'a PoolSettings,
    settings: &'a GpuSettings,
}

impl Sizing<'_> {
    /// The pool on `device`.
    fn pool_on(
        &self,
        device: GpuDevice,
        probe: Arc<dyn GpuProbe>,
    ) -> Result<PlannedPool, PoolError> {
        let total_mib = device.total_mib();
        let reserve_mib = (total_mib as f64 * self.settings.reserve()).ceil() as u64;
        let usable_mib = total_mib.saturating_sub(reserve_mib);
        let index = device.index;
        let units = match self.pool.max_units {
            MaxUnits::Auto => usable_mib,
            MaxUnits::Units(units) if units <= usable_mib => units,
            MaxUnits::Units(units) => {
                return Err(self.invalid(
                    "max_units",
                    format!(
                        "{units} MiB is more than GPU {index} ({}) leaves after its reserve: \
                         {usable_mib} of {total_mib} MiB; lower it, lower gpu.reserve_fraction, \
                         or use \"auto\"",
                        device.name
                    ),
                ))
            }
        };
        if units == 0 {
            return Err(self.invalid(
                "gpu.reserve_fraction",
                format!(
                    "GPU {index} ({}) has {total_mib} MiB and the reserve leaves none of it; \
                     lower gpu.reserve_fraction",
                    device.name
                ),
            ));
        }
        let units = u32::try_from(units).unwrap_or(u32::MAX);
        let free = Arc::new(ProbeFree { probe, index });
        let watch = GpuWatch::new(index, device.name, total_mib, free)
            .with_reserve_mib(reserve_mib)
            .with_interval(self.settings.sample_interval())
            .with_live_guard(self.settings.live_guard);
        let name = match self.settings.one_pool_per_device() {
            true => format!("{}.gpu{index}", self.name),
            false => self.name.to_owned(),
        };
        Ok(PlannedPool {
            name,
            units,
            gpu: Some(watch),
        })
    }

    /// The probe could not tell about device `index`: name the field to change, the cause,
    /// and what to configure instead.
    fn cannot_probe(&self, index: u32, error: GpuError) -> PoolError {
        let needs = match self.pool.max_units {
            MaxUnits::Auto => format!("\"auto\" sizes the pool from GPU {index}"),
            MaxUnits::Units(_) => format!("the pool's units are MiB of GPU {index}"),
        };
        if let GpuError::NoDevice { .. } = error {
            let field = match self.settings.one_pool_per_device() {
                true => "gpu.devices",
                false => "gpu.device",
            };
            return self.invalid(
                field,
                format!("{needs}, but {error}; name a device this machine has"),
            );
        }
        let field = match self.pool.max_units {
            MaxUnits::Auto => "max_units",
            MaxUnits::Units(_) => "gpu",
        };
        self.invalid(
            field,
            format!(
                "{needs}, but {error}; install or start the NVIDIA driver, or run without a GPU: \
                 set max_units to a number of units and remove the gpu section"
            ),
        )
    }

    fn invalid(&self, field: &str, problem: String) -> PoolError {
        PoolError::InvalidConfig(format!("pools.{}.{field}: {problem}", self.name))
    }
}

/// A pool's sampler reading its device's free memory through the probe.
struct ProbeFree {
    probe: Arc<dyn GpuProbe>,
    index: u32,
}

impl FreeMemory for ProbeFree {
    fn free_mib(&self) -> Result<u64, String> {
        self.probe
            .free_bytes(self.index)
            .map(|bytes| bytes / MIB)
            .map_err(|error| error.to_string())
    }
}
