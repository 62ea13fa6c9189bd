//! Resource kinds and what a task costs.

use serde::{Deserialize, Serialize};

/// A kind of scarce resource a pool hands out in units.
///
/// Each kind has its own budget in a pool (see [`Capacity`](super::Capacity)); a task draws
/// from the budget of its cost's kind only.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ResourceKind {
    /// CPU slots or cores.
    Cpu,
    /// GPU memory, in whatever unit the pool counts (MiB, KV-cache blocks).
    GpuVram,
    /// I/O bandwidth or connections.
    Io,
    /// A blended budget for tasks that need several resources at once.
    Mixed,
}

/// A kind as configuration files, the command line and every message write it: `cpu`,
/// `gpu_vram`, `io`, `mixed`.
///
/// ```
/// use prometheus_parking_lot_actors::domain::ResourceKind;
/// assert_eq!(ResourceKind::GpuVram.to_string(), "gpu_vram");
/// ```
impl std::fmt::Display for ResourceKind {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.write_str(self.name())
    }
}

impl ResourceKind {
    /// How many kinds there are.
    pub const COUNT: usize = 4;

    /// Every kind, in index order.
    pub const ALL: [ResourceKind; Self::COUNT] = [
        ResourceKind::Cpu,
        ResourceKind::GpuVram,
        ResourceKind::Io,
        ResourceKind::Mixed,
    ];

    /// The kind's name in configuration files and metrics: `cpu`, `gpu_vram`, `io`, `mixed`.
    ///
    /// ```
    /// use prometheus_parking_lot_actors::domain::ResourceKind;
    /// assert_eq!(ResourceKind::GpuVram.name(), "gpu_vram");
    /// assert_eq!(ResourceKind::from_name("io"), Some(ResourceKind::Io));
    /// ```
    pub const fn name(self) -> &'static str {
        match self {
            ResourceKind::Cpu => "cpu",
            ResourceKind::GpuVram => "gpu_vram",
            ResourceKind::Io => "io",
            ResourceKind::Mixed => "mixed",
        }
    }

    /// The kind [`name`](Self::name)d `name`, if any.
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|kind| kind.name() == name)
    }

    /// A dense index in `0..COUNT`, for per-kind arrays.
    pub const fn index(self) -> usize {
        match self {
            ResourceKind::Cpu => 0,
            ResourceKind::GpuVram => 1,
            ResourceKind::Io => 2,
            ResourceKind::Mixed => 3,
        }
    }
}

/// What a task holds while it runs: `units` of one resource kind (and, implicitly, one worker
/// slot of its pool).
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ResourceCost {
    /// Which budget the units come from.
    pub kind: ResourceKind,
    /// How many units.
    pub units: u32,
}

impl ResourceCost {
    /// A cost of `units` of `kind`.
    pub const fn new(kind: ResourceKind, units: u32) -> Self {
        Self { kind, units }
    }

    /// `units` of GPU memory.
    ///
    /// ```
    /// use prometheus_parking_lot_actors::domain::{ResourceCost, ResourceKind};
    /// assert_eq!(ResourceCost::gpu_vram(8).kind, ResourceKind::GpuVram);
    /// ```
    pub const fn gpu_vram(units: u32) -> Self {
        Self::new(ResourceKind::GpuVram, units)
    }

    /// `units` of CPU.
    pub const fn cpu(units: u32) -> Self {
        Self::new(ResourceKind::Cpu, units)
    }

    /// `units` of I/O.
    pub const fn io(units: u32) -> Self {
        Self::new(ResourceKind::Io, units)
    }

    /// `units` of the mixed budget.
    pub const fn mixed(units: u32) -> Self {
        Self::new(ResourceKind::Mixed, units)
    }
}
