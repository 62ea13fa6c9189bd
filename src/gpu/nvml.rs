//! [`NvmlProbe`]: the GPUs the NVIDIA driver reports, through NVML (cargo feature `gpu`).

use nvml_wrapper::error::NvmlError;
use nvml_wrapper::Nvml;

use super::{GpuDevice, GpuError, GpuProbe};

/// The NVIDIA driver's view of this machine's GPUs.
///
/// [`NvmlProbe::new`] loads `libnvidia-ml.so.1` (`nvml.dll` on Windows) and initialises it;
/// nothing is linked at build time, so a machine without a driver builds and runs the crate
/// and gets a clear [`GpuError`] here instead.
///
/// ```
/// use prometheus_parking_lot::gpu::{GpuError, GpuProbe, NvmlProbe};
///
/// match NvmlProbe::new() {
///     Ok(nvml) => {
///         for index in 0..nvml.device_count()? {
///             let gpu = nvml.device(index)?;
///             println!("GPU {index}: {} ({} of {} MiB free)", gpu.name, gpu.free_mib(), gpu.total_mib());
///         }
///     }
///     Err(error) => println!("no GPU to use here: {error}"),
/// }
/// # Ok::<(), GpuError>(())
/// ```
pub struct NvmlProbe {
    nvml: Nvml,
}

impl std::fmt::Debug for NvmlProbe {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NvmlProbe").finish_non_exhaustive()
    }
}

impl NvmlProbe {
    /// Loads and initialises NVML. Somewhat expensive (it loads a library and resolves its
    /// symbols): create one probe and share it.
    pub fn new() -> Result<Self, GpuError> {
        Nvml::init().map(|nvml| Self { nvml }).map_err(gpu_error)
    }

    /// Device `index`'s handle, or `NoDevice` naming how many there are.
    fn handle(&self, index: u32) -> Result<nvml_wrapper::Device<'_>, GpuError> {
        let count = self.device_count()?;
        if index >= count {
            return Err(GpuError::NoDevice { index, count });
        }
        self.nvml.device_by_index(index).map_err(gpu_error)
    }
}

impl GpuProbe for NvmlProbe {
    fn device_count(&self) -> Result<u32, GpuError> {
        self.nvml.device_count().map_err(gpu_error)
    }

    fn device(&self, index: u32) -> Result<GpuDevice, GpuError> {
        let device = self.handle(index)?;
        let memory = device.memory_info().map_err(gpu_error)?;
        Ok(GpuDevice {
            index,
            name: device.name().map_err(gpu_error)?,
            total_bytes: memory.total,
            free_bytes: memory.free,
        })
    }

    fn free_bytes(&self, index: u32) -> Result<u64, GpuError> {
        let device = self.handle(index)?;
        device
            .memory_info()
            .map(|memory| memory.free)
            .map_err(gpu_error)
    }
}

/// NVML's error as ours: the causes a user can act on get their own variants.
fn gpu_error(error: NvmlError) -> GpuError {
    match error {
        NvmlError::LibloadingError(error) => GpuError::LibraryNotFound {
            detail: error.to_string(),
        },
        NvmlError::LibraryNotFound => GpuError::LibraryNotFound {
            detail: "NVML reported it missing".into(),
        },
        NvmlError::DriverNotLoaded => GpuError::DriverNotLoaded,
        NvmlError::LibRmVersionMismatch => GpuError::DriverMismatch,
        NvmlError::NoPermission => GpuError::NoPermission,
        other => GpuError::Nvml {
            detail: other.to_string(),
        },
    }
}
