//! [`CapacityGate`]: ranked capacity permits for engines that run their own loop.

use std::time::Duration;

use prometheus_parking_lot_actors::engine::{PoolClient, ShutdownOnDrop};
use prometheus_parking_lot_actors::permit::Gate;
pub use prometheus_parking_lot_actors::permit::{Acquire, PendingGrow, Permit};

use crate::config::WorkerPoolConfig;
use prometheus_parking_lot_actors::domain::{PoolError, ResourceCost, TaskMetadata};
use prometheus_parking_lot_actors::observe::stats::PoolStats;

/// Hands out ranked [`Permit`]s for a budget of units. `Send + Sync`; share it in an `Arc`.
///
/// [`CapacityGate::new`] makes a gate of its own (a scheduler with no worker threads);
/// `WorkerPool::gate` and `ResourcePool::gate` make one over a pool's capacity, so permits
/// and the pool's tasks share one budget and one order.
///
/// A batching inference engine steps every live sequence in one loop and never hands a
/// request to a pool, yet its KV-cache blocks are as scarce as any pool's units. A gate
/// hands out [`Permit`]s for them, ranked by the same scheduler core as a pool's tasks:
/// priority, skip-ahead, the starvation guard and backfill, fair share by tenant, deadlines
/// and the queue bound all apply. A permit holds units (no worker thread) until it is
/// dropped, grows at once or in rank order, shrinks at once, and, with preemption on, hears
/// when a waiter of higher priority asks it to yield.
///
/// ```
/// use std::time::Duration;
/// use prometheus_parking_lot::{CapacityGate, PoolError, Priority, ResourceCost, TaskMetadata, WorkerPoolConfig};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), PoolError> {
/// let gate = CapacityGate::new(WorkerPoolConfig::new().with_max_units(64).with_preemption(3))?;
/// let permit = gate.acquire(TaskMetadata::new(1, ResourceCost::gpu_vram(16))).await?;
/// permit.try_grow(4)?; // 20 held now
/// permit.shrink(10); // 10 held now
/// assert_eq!(permit.units(), 10);
///
/// // A critical waiter that does not fit asks lower-priority holders to yield.
/// let hog = gate.try_acquire(TaskMetadata::new(2, ResourceCost::gpu_vram(54)))?;
/// let urgent = TaskMetadata::new(3, ResourceCost::gpu_vram(40)).with_priority(Priority::Critical);
/// let waiter = gate.acquire(urgent);
/// tokio::pin!(waiter);
/// tokio::select! {
///     _ = &mut waiter => unreachable!("54 + 10 of 64 units are held"),
///     () = hog.preempted() => {}
/// }
/// drop(hog); // the holder decides when to yield
/// let critical = waiter.await?;
/// assert_eq!(critical.units(), 40);
/// # let _ = Duration::ZERO;
/// # Ok(())
/// # }
/// ```
pub struct CapacityGate {
    gate: Gate,
    /// A gate of its own stops its scheduler when dropped (waiters are refused `Shutdown`;
    /// permits still held release into nothing).
    _own: Option<(PoolClient<(), ()>, ShutdownOnDrop)>,
}

impl std::fmt::Debug for CapacityGate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CapacityGate")
            .field("own", &self._own.is_some())
            .finish_non_exhaustive()
    }
}

impl CapacityGate {
    /// A gate over `config`'s capacity, queue depth, starvation guard, fair share and
    /// preemption. It runs nothing itself: `worker_count`, `timeout` and the worker thread
    /// settings are ignored.
    pub fn new(config: WorkerPoolConfig) -> Result<Self, PoolError> {
        let client = super::start_gate(&config)?;
        let stop = client.shutdown_on_drop(Duration::ZERO);
        Ok(Self {
            gate: client.gate(),
            _own: Some((client, stop)),
        })
    }

    /// A gate over a running pool's capacity.
    pub(crate) fn of_pool<P, R>(client: &PoolClient<P, R>) -> Self
    where
        P: Send + 'static,
        R: Send + 'static,
    {
        Self {
            gate: client.gate(),
            _own: None,
        }
    }

    /// Asks for a permit for `meta.cost` and returns the future that waits for it, in rank
    /// order: ranked as a task with this metadata would be, refused like a task
    /// (`InsufficientResources`, `QueueFull`, `Expired` once its deadline passes while it
    /// waits, `Shutdown`). The request is made at once; dropping the future, polled or not,
    /// withdraws it, and a grant that raced the drop is released (cancel-safe).
    pub fn acquire(&self, meta: TaskMetadata) -> Acquire<'_> {
        self.gate.acquire(meta)
    }

    /// [`acquire`](Self::acquire) for a permit that holds `also` beside `meta.cost`, one cost
    /// per other kind: a decode sequence's engine slot beside its KV-cache blocks. Granted
    /// when every kind fits, all at once; the permit grows and shrinks `meta.cost`'s kind
    /// and gives every kind back when dropped.
    ///
    /// ```
    /// use prometheus_parking_lot::core::Capacity;
    /// use prometheus_parking_lot::{CapacityGate, ResourceCost, ResourceKind, TaskMetadata, WorkerPoolConfig};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), prometheus_parking_lot::PoolError> {
    /// // 64 KV blocks and 2 sequence slots.
    /// let engine = Capacity::uniform(64).with(ResourceKind::Cpu, 2);
    /// let gate = CapacityGate::new(WorkerPoolConfig::new().with_capacity(engine))?;
    /// let slot = [ResourceCost::cpu(1)];
    /// let first = gate.acquire_with(TaskMetadata::new(1, ResourceCost::gpu_vram(4)), &slot).await?;
    /// let second = gate.acquire_with(TaskMetadata::new(2, ResourceCost::gpu_vram(4)), &slot).await?;
    /// // Blocks are plenty; both slots are held: a third waits.
    /// let third = gate.try_acquire(TaskMetadata::new(3, ResourceCost::cpu(1)));
    /// assert!(third.is_err());
    /// first.try_grow(8)?; // blocks, while it keeps its slot
    /// assert_eq!(first.units(), 12);
    /// drop((first, second));
    /// # Ok(())
    /// # }
    /// ```
    pub fn acquire_with(&self, meta: TaskMetadata, also: &[ResourceCost]) -> Acquire<'_> {
        self.gate.acquire_with(meta, also)
    }

    /// [`acquire_with`](Self::acquire_with) on the calling thread, at most `timeout` (then
    /// `Timeout`).
    pub fn acquire_blocking_with(
        &self,
        meta: TaskMetadata,
        also: &[ResourceCost],
        timeout: Duration,
    ) -> Result<Permit, PoolError> {
        self.gate.acquire_blocking_with(meta, also, timeout)
    }

    /// [`acquire`](Self::acquire) on the calling thread, at most `timeout` (then `Timeout`).
    pub fn acquire_blocking(
        &self,
        meta: TaskMetadata,
        timeout: Duration,
    ) -> Result<Permit, PoolError> {
        self.gate.acquire_blocking(meta, timeout)
    }

    /// A permit only when the fast path grants it at once; `WouldWait` otherwise.
    pub fn try_acquire(&self, meta: TaskMetadata) -> Result<Permit, PoolError> {
        self.gate.try_acquire(meta)
    }

    /// The counters: permits held are `active_tasks`, waiters `queued_tasks`, and the
    /// preemption counts.
    pub fn stats(&self) -> PoolStats {
        self.gate.stats()
    }
}
