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

/// The units of each kind a task needs *beside* its first cost ([`TaskMetadata::cost`]):
/// a provider call that spends requests and tokens at once, a decode sequence that holds
/// KV-cache blocks and an engine slot. A task starts only when its first cost and every
/// one of these fit, and holds them all until it ends. Zero for a kind it does not need.
///
/// [`TaskMetadata::cost`]: crate::domain::TaskMetadata::cost
///
/// ```
/// use prometheus_parking_lot_actors::domain::{ExtraCosts, ResourceCost, ResourceKind};
///
/// let first = ResourceCost::io(4_096); // tokens
/// let also = ExtraCosts::new(first, &[ResourceCost::cpu(1)]).unwrap(); // one request
/// assert_eq!(also.get(ResourceKind::Cpu), 1);
/// assert_eq!(also.costs().collect::<Vec<_>>(), vec![ResourceCost::cpu(1)]);
/// // A kind named twice is refused: its costs would be ambiguous.
/// assert!(ExtraCosts::new(first, &[ResourceCost::io(1)]).is_err());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct ExtraCosts([u32; ResourceKind::COUNT]);

impl ExtraCosts {
    /// No cost beside the first: a task of one kind.
    pub const NONE: ExtraCosts = ExtraCosts([0; ResourceKind::COUNT]);

    /// The costs `also` of a task whose first cost is `first`. A cost of 0 units is no cost.
    /// Refused, naming the kind, when a kind appears twice (in `also`, or as `first`'s):
    /// each kind is given once, with all the units the task needs of it.
    pub fn new(first: ResourceCost, also: &[ResourceCost]) -> Result<Self, String> {
        let mut costs = Self::NONE;
        for cost in also {
            if cost.kind == first.kind || costs.get(cost.kind) > 0 {
                return Err(format!(
                    "a task names the kind `{}` twice among its costs: give each kind once, \
                     with every unit it needs of it",
                    cost.kind
                ));
            }
            costs.0[cost.kind.index()] = cost.units;
        }
        Ok(costs)
    }

    /// The costs given as units of each kind, by [`ResourceKind::index`] (a stored form,
    /// read back: the kind of the task's first cost is 0 there).
    pub const fn from_units(units: [u32; ResourceKind::COUNT]) -> Self {
        Self(units)
    }

    /// The units of each kind, by [`ResourceKind::index`] (0: not needed).
    pub const fn units(&self) -> [u32; ResourceKind::COUNT] {
        self.0
    }

    /// The units of `kind` needed beside the first cost (0: none).
    pub const fn get(&self, kind: ResourceKind) -> u32 {
        self.0[kind.index()]
    }

    /// Whether the task needs nothing beside its first cost.
    pub fn is_empty(&self) -> bool {
        self.0 == [0; ResourceKind::COUNT]
    }

    /// The costs, one per kind needed, in kind order.
    pub fn costs(&self) -> impl Iterator<Item = ResourceCost> + '_ {
        ResourceKind::ALL
            .into_iter()
            .filter(|kind| self.get(*kind) > 0)
            .map(|kind| ResourceCost::new(kind, self.get(kind)))
    }

    /// Adds `other`'s units to these, kind by kind (saturating): what a claim holds once it
    /// absorbed another's.
    pub fn absorb(&mut self, other: &ExtraCosts) {
        for (units, more) in self.0.iter_mut().zip(other.0) {
            *units = units.saturating_add(more);
        }
    }

    /// Every unit the task needs, its first cost's included, by kind index.
    pub fn with_first(&self, first: ResourceCost) -> [u32; ResourceKind::COUNT] {
        let mut all = self.0;
        all[first.kind.index()] = first.units;
        all
    }
}
