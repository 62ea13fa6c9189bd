//! GPU probing: which devices a machine has, their names, and their total and free memory.
//!
//! A [`GpuProbe`] answers those questions. Two come with the crate:
//!
//! - `NvmlProbe` (cargo feature `gpu`) asks the NVIDIA driver through NVML. It loads
//!   `libnvidia-ml` when it is created, so the crate builds and runs on machines without a
//!   driver; there, creating it fails with a [`GpuError`] that says what is missing.
//! - [`FakeGpu`] is a machine in memory whose free memory a test (or a demo) sets, for
//!   example to play another process that frees memory later.
//!
//! Configuration files use a probe through `"max_units": "auto"` and a pool's `"gpu"`
//! section: the pool's `GpuVram` units become MiB of the device, its capacity the device's
//! total memory less a reserve, and, with `"live_guard": true`, VRAM tasks wait while the
//! device has less free memory than their cost plus the reserve (another process is using
//! the card). `build_pools_from_scheduler_config` probes with NVML;
//! [`build_pools_with_gpu_probe`](crate::build_pools_with_gpu_probe) takes any
//! probe.
//!
//! ```
//! use prometheus_parking_lot::gpu::{FakeGpu, GpuProbe};
//!
//! let gpu = FakeGpu::new().with_device("NVIDIA L4", 23_034);
//! gpu.set_free_mib(0, 20_000);
//! let device = gpu.device(0)?;
//! assert_eq!((device.name.as_str(), device.total_mib(), device.free_mib()), ("NVIDIA L4", 23_034, 20_000));
//! assert_eq!(gpu.device(1).unwrap_err().to_string(), "there is no GPU 1; this machine has 1 (indexes 0 to 0)");
//! # Ok::<(), prometheus_parking_lot::gpu::GpuError>(())
//! ```

mod fake;
#[cfg(feature = "gpu")]
mod nvml;
pub(crate) mod plan;

pub use fake::FakeGpu;
#[cfg(feature = "gpu")]
pub use nvml::NvmlProbe;
pub use prometheus_parking_lot_actors::observe::stats::GpuStats;

use thiserror::Error;

/// Bytes in a MiB, the unit of a GPU pool's `GpuVram`.
pub const MIB: u64 = 1024 * 1024;

/// One GPU as a probe sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuDevice {
    /// The device's index (NVML's numbering, which `CUDA_VISIBLE_DEVICES` does not change).
    pub index: u32,
    /// Its name, like `NVIDIA H100 80GB HBM3`.
    pub name: String,
    /// Its total memory, bytes.
    pub total_bytes: u64,
    /// Its free memory when probed, bytes (every process's use counted).
    pub free_bytes: u64,
}

impl GpuDevice {
    /// Total memory in whole MiB.
    pub fn total_mib(&self) -> u64 {
        self.total_bytes / MIB
    }

    /// Free memory in whole MiB.
    pub fn free_mib(&self) -> u64 {
        self.free_bytes / MIB
    }
}

/// Why a probe could not answer.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum GpuError {
    /// The NVIDIA management library is not on this machine (no driver installed, or a
    /// container started without the GPU runtime).
    #[error("the NVIDIA management library (libnvidia-ml.so.1) was not found or could not be loaded: {detail}")]
    LibraryNotFound {
        /// What the loader said.
        detail: String,
    },
    /// The library is there but the NVIDIA kernel driver is not running.
    #[error("the NVIDIA driver is not loaded")]
    DriverNotLoaded,
    /// The library and the kernel driver are of different versions (often: a driver update
    /// without a reboot).
    #[error("the NVIDIA driver and its management library are of different versions; reboot or reinstall the driver")]
    DriverMismatch,
    /// This process may not talk to the driver.
    #[error("no permission to talk to the NVIDIA driver")]
    NoPermission,
    /// The machine has no device with this index.
    #[error("{}", no_device(*.index, *.count))]
    NoDevice {
        /// The index asked for.
        index: u32,
        /// How many devices there are.
        count: u32,
    },
    /// Anything else the driver reported.
    #[error("NVML: {detail}")]
    Nvml {
        /// The driver's error.
        detail: String,
    },
}

fn no_device(index: u32, count: u32) -> String {
    match count {
        0 => format!("there is no GPU {index}; this machine has none"),
        _ => format!(
            "there is no GPU {index}; this machine has {count} (indexes 0 to {})",
            count - 1
        ),
    }
}

/// Answers which GPUs a machine has and how much memory they have free.
///
/// Implementations are called from the threads that build pools and from each GPU pool's
/// sampler thread, so they are `Send + Sync`; a call may block briefly (NVML takes well
/// under a millisecond).
pub trait GpuProbe: Send + Sync + 'static {
    /// How many devices there are.
    fn device_count(&self) -> Result<u32, GpuError>;

    /// Device `index`: name, total and free memory.
    fn device(&self, index: u32) -> Result<GpuDevice, GpuError>;

    /// Device `index`'s free memory now, bytes: what the live guard samples.
    fn free_bytes(&self, index: u32) -> Result<u64, GpuError>;
}
