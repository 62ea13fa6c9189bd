//! [`FakeGpu`]: a machine's GPUs in memory, for tests, demos and machines without a GPU.

use std::sync::Mutex;

use super::{GpuDevice, GpuError, GpuProbe, MIB};

/// GPUs that exist only in memory. Free memory starts at the total and changes only when
/// [`set_free_mib`](Self::set_free_mib) says so, which is how a test plays another process
/// taking memory and giving it back.
///
/// Share it behind an `Arc` to change it while pools probe it:
///
/// ```
/// use std::sync::Arc;
/// use prometheus_parking_lot::gpu::{FakeGpu, GpuError, GpuProbe};
///
/// let gpu = Arc::new(FakeGpu::new().with_device("NVIDIA A100-SXM4-40GB", 40_960));
/// let probe: Arc<dyn GpuProbe> = gpu.clone();
/// gpu.set_free_mib(0, 1_024); // another process took the rest
/// assert_eq!(probe.free_bytes(0)?, 1_024 * 1024 * 1024);
///
/// let no_driver = FakeGpu::failing(GpuError::DriverNotLoaded);
/// assert_eq!(no_driver.device_count(), Err(GpuError::DriverNotLoaded));
/// # Ok::<(), GpuError>(())
/// ```
#[derive(Debug, Default)]
pub struct FakeGpu {
    state: Mutex<FakeState>,
}

#[derive(Debug, Default)]
struct FakeState {
    devices: Vec<FakeDevice>,
    /// Every call fails with this, when set.
    failure: Option<GpuError>,
}

#[derive(Debug, Clone)]
struct FakeDevice {
    name: String,
    total_mib: u64,
    free_mib: u64,
}

impl FakeGpu {
    /// A machine with no GPU (yet).
    pub fn new() -> Self {
        Self::default()
    }

    /// A probe whose every call fails with `error`: a machine without a driver, say.
    pub fn failing(error: GpuError) -> Self {
        let fake = Self::new();
        fake.set_failure(Some(error));
        fake
    }

    /// Adds the next device (index 0 first), all of its memory free.
    pub fn with_device(self, name: impl Into<String>, total_mib: u64) -> Self {
        self.lock().devices.push(FakeDevice {
            name: name.into(),
            total_mib,
            free_mib: total_mib,
        });
        self
    }

    /// Sets device `index`'s free memory (capped at its total). Ignored for a device that
    /// does not exist.
    pub fn set_free_mib(&self, index: u32, free_mib: u64) {
        if let Some(device) = self.lock().devices.get_mut(index as usize) {
            device.free_mib = free_mib.min(device.total_mib);
        }
    }

    /// Makes every call fail with `error` from now on (`None`: answer again).
    pub fn set_failure(&self, error: Option<GpuError>) {
        self.lock().failure = error;
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, FakeState> {
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn with_device_at<T>(
        &self,
        index: u32,
        read: impl FnOnce(&FakeDevice) -> T,
    ) -> Result<T, GpuError> {
        let state = self.lock();
        if let Some(error) = &state.failure {
            return Err(error.clone());
        }
        let count = u32::try_from(state.devices.len()).unwrap_or(u32::MAX);
        state
            .devices
            .get(index as usize)
            .map(read)
            .ok_or(GpuError::NoDevice { index, count })
    }
}

impl GpuProbe for FakeGpu {
    fn device_count(&self) -> Result<u32, GpuError> {
        let state = self.lock();
        match &state.failure {
            Some(error) => Err(error.clone()),
            None => Ok(u32::try_from(state.devices.len()).unwrap_or(u32::MAX)),
        }
    }

    fn device(&self, index: u32) -> Result<GpuDevice, GpuError> {
        self.with_device_at(index, |device| GpuDevice {
            index,
            name: device.name.clone(),
            total_bytes: device.total_mib.saturating_mul(MIB),
            free_bytes: device.free_mib.saturating_mul(MIB),
        })
    }

    fn free_bytes(&self, index: u32) -> Result<u64, GpuError> {
        self.with_device_at(index, |device| device.free_mib.saturating_mul(MIB))
    }
}
