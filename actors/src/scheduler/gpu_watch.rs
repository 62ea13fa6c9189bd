//! The GPU watch: a pool's view of the GPU its VRAM units live on, sampled off the
//! scheduler's thread.
//!
//! A pool sized from a GPU counts its `GpuVram` units in MiB of that device. While the pool
//! runs, a small service of its own (the *sampler*, one thread named
//! `parking-lot-gpu-{pool}`) reads the device's free memory every `interval` and publishes it
//! in the pool's stats. With the *live guard* on, it also sends the scheduler the headroom
//! the device leaves (free memory less the reserve) as a typed message; the scheduler hands
//! it to the core, which keeps a VRAM task parked while its cost exceeds that headroom and
//! starts it once a sample allows (rule 11 of [`core`](super::core)).
//!
//! Invariants:
//! - the scheduler stays the only writer of capacity: the sampler only reports samples;
//! - the first sample is taken before the pool admits anything, so no task starts unguarded;
//! - a failed sample lifts the guard (the pool's own budget still holds) and is logged once
//!   per run of failures, so a driver hiccup can slow nothing down for ever;
//! - the sampler ends when the scheduler does: the scheduler holds the only sender of the
//!   sampler's wake-up channel, and the channel closing ends the thread at once.
//!
//! After a task finishes while tasks are parked, the scheduler wakes the sampler for an
//! immediate sample, so memory the task gave back is seen without waiting a whole interval.

use std::panic::AssertUnwindSafe;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::mpsc::{self, RecvTimeoutError, SyncSender, TrySendError};
use std::sync::Arc;
use std::time::Duration;

use ractor::ActorRef;

use super::protocol::{Headroom, Internal, SchedulerMsg};
use crate::domain::{PoolError, ResourceKind};
use crate::observe::stats::{GpuStats, PoolCounters};

/// Reads a GPU's free memory. Implemented over NVML by the public crate, and by fakes in
/// tests.
pub trait FreeMemory: Send + Sync + 'static {
    /// The device's free memory now, in MiB, or why it could not be read.
    fn free_mib(&self) -> Result<u64, String>;
}

/// The GPU a pool's `GpuVram` units live on (one unit is one MiB of it), watched while the
/// pool runs. See the module docs.
///
/// ```
/// use std::sync::Arc;
/// use prometheus_parking_lot_actors::scheduler::gpu_watch::{FreeMemory, GpuWatch};
///
/// struct Card;
///
/// impl FreeMemory for Card {
///     fn free_mib(&self) -> Result<u64, String> {
///         Ok(60_000)
///     }
/// }
///
/// let watch = GpuWatch::new(0, "NVIDIA H100 80GB HBM3", 81_559, Arc::new(Card))
///     .with_reserve_mib(8_156)
///     .with_live_guard(true);
/// assert_eq!(watch.interval, GpuWatch::DEFAULT_INTERVAL);
/// ```
#[derive(Clone)]
pub struct GpuWatch {
    /// The device's index (as NVML numbers devices).
    pub index: u32,
    /// The device's name, for stats.
    pub name: String,
    /// The device's total memory, MiB.
    pub total_mib: u64,
    /// Memory the pool leaves free for the driver, other processes and fragmentation, MiB.
    /// The live guard keeps it free.
    pub reserve_mib: u64,
    /// Where free memory is read.
    pub free: Arc<dyn FreeMemory>,
    /// How often free memory is sampled.
    pub interval: Duration,
    /// Whether VRAM tasks wait while the device has less free memory than their cost plus
    /// the reserve.
    pub live_guard: bool,
}

impl std::fmt::Debug for GpuWatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GpuWatch")
            .field("index", &self.index)
            .field("name", &self.name)
            .field("total_mib", &self.total_mib)
            .field("reserve_mib", &self.reserve_mib)
            .field("interval", &self.interval)
            .field("live_guard", &self.live_guard)
            .finish_non_exhaustive()
    }
}

impl GpuWatch {
    /// The default sampling interval.
    pub const DEFAULT_INTERVAL: Duration = Duration::from_millis(100);
    /// The shortest sampling interval allowed.
    pub const MIN_INTERVAL: Duration = Duration::from_millis(1);

    /// Watches device `index` (named `name`, `total_mib` MiB) through `free`; no reserve,
    /// no live guard, sampled every [`DEFAULT_INTERVAL`](Self::DEFAULT_INTERVAL).
    pub fn new(
        index: u32,
        name: impl Into<String>,
        total_mib: u64,
        free: Arc<dyn FreeMemory>,
    ) -> Self {
        Self {
            index,
            name: name.into(),
            total_mib,
            reserve_mib: 0,
            free,
            interval: Self::DEFAULT_INTERVAL,
            live_guard: false,
        }
    }

    /// Sets the reserve.
    pub fn with_reserve_mib(mut self, reserve_mib: u64) -> Self {
        self.reserve_mib = reserve_mib;
        self
    }

    /// Sets the sampling interval.
    pub fn with_interval(mut self, interval: Duration) -> Self {
        self.interval = interval;
        self
    }

    /// Turns the live guard on or off.
    pub fn with_live_guard(mut self, live_guard: bool) -> Self {
        self.live_guard = live_guard;
        self
    }

    /// Refuses settings the sampler cannot work with.
    pub(crate) fn validate(&self) -> Result<(), PoolError> {
        if self.interval < Self::MIN_INTERVAL {
            return Err(PoolError::InvalidConfig(format!(
                "GPU sampling interval is {:?}; use at least {:?}",
                self.interval,
                Self::MIN_INTERVAL
            )));
        }
        if self.reserve_mib >= self.total_mib {
            return Err(PoolError::InvalidConfig(format!(
                "GPU {} reserve is {} MiB of its {} MiB; leave the pool some memory",
                self.index, self.reserve_mib, self.total_mib
            )));
        }
        Ok(())
    }
}

/// Takes samples: reads free memory, publishes it, and turns it into a headroom.
struct Sampler {
    pool: Arc<str>,
    watch: GpuWatch,
    counters: Arc<PoolCounters>,
    /// The current run of failed samples has been logged.
    failing: bool,
}

impl Sampler {
    /// One sample: the VRAM headroom it leaves (`None` when the sample failed: no cap).
    /// A probe that panics counts as a failed sample, so the sampler never dies with the
    /// guard frozen at an old value.
    fn sample(&mut self) -> Option<u32> {
        let read = std::panic::catch_unwind(AssertUnwindSafe(|| self.watch.free.free_mib()))
            .unwrap_or_else(|_| Err("the GPU probe panicked".into()));
        match read {
            Ok(free_mib) => {
                if std::mem::take(&mut self.failing) {
                    tracing::info!(pool = %self.pool, gpu = self.watch.index, "GPU memory samples work again; the live guard is back");
                }
                self.counters.gpu_free_mib.store(free_mib, Relaxed);
                let headroom = free_mib.saturating_sub(self.watch.reserve_mib);
                Some(u32::try_from(headroom).unwrap_or(u32::MAX))
            }
            Err(error) => {
                if !std::mem::replace(&mut self.failing, true) {
                    tracing::warn!(pool = %self.pool, gpu = self.watch.index, %error, "could not read the GPU's free memory; the live guard is off until a sample works");
                }
                None
            }
        }
    }
}

/// The scheduler's handle on its GPU watch: starts the sampler, wakes it, and (by being
/// dropped with the scheduler) ends it.
pub(crate) struct GpuLink {
    /// Until the sampler starts.
    sampler: Option<Sampler>,
    /// Wakes the sampler for an immediate sample; dropping it ends the sampler.
    wake: Option<SyncSender<()>>,
    live_guard: bool,
}

impl GpuLink {
    pub fn new(watch: GpuWatch, pool: Arc<str>, counters: Arc<PoolCounters>) -> Self {
        let _ = counters.gpu.set(GpuStats {
            index: watch.index,
            name: watch.name.clone(),
            total_mib: watch.total_mib,
            free_mib: 0,
            reserve_mib: watch.reserve_mib,
            live_guard: watch.live_guard,
        });
        Self {
            live_guard: watch.live_guard,
            sampler: Some(Sampler {
                pool,
                watch,
                counters,
                failing: false,
            }),
            wake: None,
        }
    }

    /// Takes the first sample, on the caller's thread. Returns its headroom for the live
    /// guard (`None` without one): apply it before admitting or restoring anything.
    pub fn first_sample(&mut self) -> Option<Headroom> {
        let headroom = self.sampler.as_mut()?.sample();
        self.live_guard.then(|| vram(headroom))
    }

    /// Starts the sampler thread, which reports to `scheduler`.
    pub fn connect<P: Send + 'static>(
        &mut self,
        scheduler: ActorRef<SchedulerMsg<P>>,
    ) -> Result<(), String> {
        let Some(mut sampler) = self.sampler.take() else {
            return Ok(());
        };
        let live_guard = self.live_guard;
        let (wake, woken) = mpsc::sync_channel::<()>(1);
        let name = format!("parking-lot-gpu-{}", sampler.pool);
        std::thread::Builder::new()
            .name(name)
            .spawn(move || loop {
                if let Err(RecvTimeoutError::Disconnected) =
                    woken.recv_timeout(sampler.watch.interval)
                {
                    return;
                }
                let headroom = sampler.sample();
                if !live_guard {
                    continue;
                }
                let message = Internal::Headroom(vram(headroom));
                if scheduler.send_message(SchedulerMsg(message)).is_err() {
                    return;
                }
            })
            .map_err(|error| format!("could not start the GPU sampler thread: {error}"))?;
        self.wake = Some(wake);
        Ok(())
    }

    /// Asks for a sample now (a task finished while tasks wait for memory). Never blocks:
    /// a wake-up already pending covers this one.
    pub fn wake(&self) {
        if !self.live_guard {
            return;
        }
        if let Some(wake) = &self.wake {
            if let Err(TrySendError::Disconnected(())) = wake.try_send(()) {
                tracing::warn!("the GPU sampler thread is gone");
            }
        }
    }
}

/// A VRAM headroom sample for the core (`None`: no cap, the sample failed).
fn vram(units: Option<u32>) -> Headroom {
    Headroom {
        kind: ResourceKind::GpuVram,
        units,
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use super::*;

    /// Free memory from a script: each read takes the next value.
    struct Script(Mutex<Vec<Result<u64, String>>>);

    impl FreeMemory for Script {
        fn free_mib(&self) -> Result<u64, String> {
            self.0.lock().unwrap().remove(0)
        }
    }

    #[test]
    fn a_sample_is_free_memory_less_the_reserve_and_a_failed_one_lifts_the_cap() {
        let script = Script(Mutex::new(vec![
            Ok(10_000),
            Ok(500),
            Err("GPU is lost".into()),
            Ok(u64::MAX),
        ]));
        let watch = GpuWatch::new(1, "card", 16_000, Arc::new(script)).with_reserve_mib(1_000);
        let counters = Arc::new(PoolCounters::default());
        let mut sampler = Sampler {
            pool: Arc::from("p"),
            watch,
            counters: counters.clone(),
            failing: false,
        };
        assert_eq!(sampler.sample(), Some(9_000));
        assert_eq!(counters.gpu_free_mib.load(Relaxed), 10_000);
        assert_eq!(sampler.sample(), Some(0), "less free than the reserve");
        assert_eq!(sampler.sample(), None);
        assert!(sampler.failing);
        assert_eq!(
            counters.gpu_free_mib.load(Relaxed),
            500,
            "the last good sample"
        );
        assert_eq!(sampler.sample(), Some(u32::MAX));
        assert!(!sampler.failing);
    }

    #[test]
    fn a_probe_that_panics_is_a_failed_sample() {
        struct Broken;

        impl FreeMemory for Broken {
            fn free_mib(&self) -> Result<u64, String> {
                panic!("driver bug");
            }
        }

        let mut sampler = Sampler {
            pool: Arc::from("p"),
            watch: GpuWatch::new(0, "card", 100, Arc::new(Broken)),
            counters: Arc::new(PoolCounters::default()),
            failing: false,
        };
        assert_eq!(sampler.sample(), None);
        assert!(sampler.failing);
    }

    #[test]
    fn settings_without_room_or_with_a_zero_interval_are_refused() {
        let script = Arc::new(Script(Mutex::new(Vec::new())));
        let full = GpuWatch::new(0, "card", 100, script.clone()).with_reserve_mib(100);
        assert!(full.validate().unwrap_err().to_string().contains("reserve"));
        let busy = GpuWatch::new(0, "card", 100, script).with_interval(Duration::ZERO);
        assert!(busy
            .validate()
            .unwrap_err()
            .to_string()
            .contains("interval"));
    }
}
