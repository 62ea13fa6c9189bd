//! How a node takes part in a shared queue: its settings, as a pool is given them.

use std::sync::Arc;
use std::time::Duration;

use crate::domain::PoolError;
use crate::queue::SharedQueue;

/// How a pool takes part in a shared queue: the queue, this node's name in it, how long a
/// claim's lease runs, how often the node polls, and how far it claims ahead.
///
/// ```
/// use std::sync::Arc;
/// use std::time::Duration;
///
/// use prometheus_parking_lot_actors::queue::SharedQueue;
/// use prometheus_parking_lot_actors::scheduler::SharedParking;
///
/// /// This node's part in a queue the deployment shares (a database table, say).
/// fn gpu_node(queue: Arc<dyn SharedQueue<String>>) -> SharedParking<String> {
///     SharedParking::new(queue, "gpu-node-1")
///         .with_lease(Duration::from_secs(60))
///         .with_poll(Duration::from_millis(500))
/// }
/// ```
pub struct SharedParking<P> {
    /// The queue every node shares.
    pub queue: Arc<dyn SharedQueue<P>>,
    /// This node's name in the queue's leases: unique among the nodes.
    pub node: String,
    /// How long a claim is this node's without renewal. Renewed every third of it.
    pub lease: Duration,
    /// How often the node looks for work other nodes parked and rescues expired leases.
    pub poll: Duration,
    /// How many claimed tasks the node may hold waiting for a worker, beyond what it can
    /// start now (see [`with_claim_ahead`](Self::with_claim_ahead)). Default 0.
    pub claim_ahead: usize,
}

impl<P> SharedParking<P> {
    /// The default lease: long enough for a renewal to survive a slow database.
    pub const DEFAULT_LEASE: Duration = Duration::from_secs(30);
    /// The default poll interval.
    pub const DEFAULT_POLL: Duration = Duration::from_millis(200);

    /// Takes part in `queue` as `node`, with the default lease and poll interval.
    pub fn new(queue: Arc<dyn SharedQueue<P>>, node: impl Into<String>) -> Self {
        Self {
            queue,
            node: node.into(),
            lease: Self::DEFAULT_LEASE,
            poll: Self::DEFAULT_POLL,
            claim_ahead: 0,
        }
    }

    /// Sets the lease.
    pub fn with_lease(mut self, lease: Duration) -> Self {
        self.lease = lease;
        self
    }

    /// Sets the poll interval.
    pub fn with_poll(mut self, poll: Duration) -> Self {
        self.poll = poll;
        self
    }

    /// Lets the node claim up to `tasks` more than it can start now, while its workers or
    /// its units are busy: tasks that fit its free units plus up to one whole capacity more
    /// (never more than the capacity in one claim, less what the tasks already waiting
    /// need), best-ranked first, which wait here under their leases and start as workers
    /// and units free, so a run that ends a short job finds the next one without a round
    /// trip to the queue, and one claim fetches many tasks. The price: a task waiting here is this node's until
    /// it runs or its lease runs out (a node that stops leaves its waiting tasks to their
    /// leases' expiry), even when another node is idle. 0 (the default) claims only what
    /// starts at once.
    pub fn with_claim_ahead(mut self, tasks: usize) -> Self {
        self.claim_ahead = tasks;
        self
    }

    /// Refuses settings no node can work with.
    pub(crate) fn validate(&self) -> Result<(), PoolError> {
        if self.node.trim().is_empty() {
            return Err(PoolError::InvalidConfig(
                "shared queue node name is empty; give every node a unique name".into(),
            ));
        }
        if self.lease < Duration::from_millis(30) {
            return Err(PoolError::InvalidConfig(format!(
                "shared queue lease is {:?}; it must be at least 30ms, since it is renewed every third of it",
                self.lease
            )));
        }
        if self.poll.is_zero() || self.poll > self.lease / 3 {
            return Err(PoolError::InvalidConfig(format!(
                "shared queue poll is {:?}; it must be above 0 and at most a third of the lease ({:?})",
                self.poll,
                self.lease / 3
            )));
        }
        Ok(())
    }
}
